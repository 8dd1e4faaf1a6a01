// env/eval/build_service.hpp: the evaluator's build service. A worker's `build` request (the
// load_inline or load call its candidate's module made, or a Triton kernel's compile, as JSON) is
// built in a sandboxed builder process of its own; the result is kept in the extension cache under
// the hash of the whole request, the interpreter and the device model. Only this process writes
// the cache; concurrent requests of one key build once. A load_inline build whose C++ flags are
// plain optimisation flags gets torch/extension.h precompiled for those flags (kept in the cache,
// under pch/, built once by this process): its C++ file compiles in a fraction of the time, into
// the same library (GCC uses a precompiled header only where it was made with the same options and
// macros and is the file's first include, and otherwise reads the torch/extension.h beside it, one
// #include_next of torch's own). Internal to env/.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace crucible::env {

class worker_pool;
namespace wire {
class node;
}

/// A C++ or CUDA source as the extension cache's key reads it: comments taken out (a block
/// comment's newlines kept), each run of spaces and tabs one space, none at a line's end, string
/// and character literals (raw strings too) and #include <...> header names untouched, so every
/// line keeps its number and its tokens. Two sources with the same normalised text compile to the
/// same library. A source this cannot read with certainty (an unterminated literal or comment, a
/// line comment continued by a backslash, a comment across lines inside a directive, a lone
/// carriage return) is returned as it is.
std::string normalised_source(std::string_view source);

/// The text the extension cache's key hashes for a build request: the request with each source
/// of its args (cpp_sources, cuda_sources, `load`'s files) normalised, keys in sorted order; the
/// request itself where it is not a JSON object with args, or not a load_inline or load (Triton's
/// builds: Python and IR, keyed as they are).
std::string build_key_material(const std::string& request);

/// Whether a load_inline build whose extra_cflags hold only such flags gets a precompiled
/// torch/extension.h: plain optimisation and language flags (-O0..-O3, -Os, -Ofast, -march=native,
/// -ffast-math, -std=c++17, warnings...), never one that names a file, a program or a plugin,
/// since the header is made by the evaluator's own process, outside the sandbox.
bool precompilable_flag(const std::string& flag);

/// Whether a builder's failure log is the compiler's verdict on the sources, the same for every
/// build of the same request, and so kept in the extension cache beside where the library would
/// be: it holds a compiler's or linker's error, and nothing that says the build was cut short
/// (a killed or signalled compiler, no memory, no disk space, an internal compiler error, a
/// timeout). Any other failure is kept in memory only, for the evaluator's life.
bool lasting_build_failure(std::string_view log);

class build_service final {
public:
  /// Builders come from `pool` (started like workers, retired through it); `python` is the
  /// workers' interpreter (part of every key).
  build_service(worker_pool& pool, std::string python, std::filesystem::path extensions_dir);
  /// Stops a header being made in the background (killed within a second) and waits for it.
  ~build_service();
  build_service(const build_service&) = delete;
  build_service& operator=(const build_service&) = delete;

  /// The reply for the worker: `built` with the cache directory, or `build_failed` with the log.
  /// A request whose compiler failed gets the same `build_failed` again without a build: for the
  /// evaluator's life, and in later processes that share the cache where lasting_build_failure()
  /// holds for its log (a deadline or a dead builder is not kept).
  std::string build(const std::string& request, std::chrono::steady_clock::time_point deadline);
  /// Builds made so far (not answered from the cache).
  std::uint64_t builds() const noexcept { return builds_; }
  /// Precompiled headers made so far (torch/extension.h, one per set of C++ flags).
  std::uint64_t header_builds() const noexcept { return header_builds_; }

private:
  /// The directory to put first on a build's include path, holding torch/extension.h.gch made
  /// with the request's C++ flags; empty where the request cannot use one (flags other than plain
  /// optimisation flags, no implicit torch/extension.h, a `load` of files), where it is being made
  /// now, or where its compiler failed once. A missing header is made now for a C++ build (within
  /// a third of the time the build has left; one not done in time is tried again by a later
  /// build), and beside the build, in a thread of its own, for a CUDA build (cuda_sources), whose
  /// nvcc file does not read it and takes longer than the C++ file.
  std::string precompiled_header(const std::string& fn, const wire::node& args,
                                 std::chrono::steady_clock::time_point deadline);
  /// Compiles the header `argv` describes into DIR/torch/extension.h.gch (and the stub beside
  /// it) before `deadline`; true when it is there. Takes `sig` out of pch_building_.
  bool make_header(std::vector<std::string> argv, const std::string& sig, const std::filesystem::path& dir,
                   std::chrono::steady_clock::time_point deadline);

  /// Keeps `log` as key's compiler failure in failed_builds_ (emptied when full); mtx_ held.
  void remember_failure(const std::string& key, std::string log);

  worker_pool& pool_;
  std::string python_;
  std::filesystem::path extensions_dir_;
  std::mutex mtx_;                    // guards building_
  std::condition_variable cv_;        // a build ended
  std::set<std::string> building_;    // cache keys being built now
  std::map<std::string, std::string> failed_builds_; // cache keys whose compiler failed: the log
  static constexpr std::size_t max_failed_builds = 4096; // emptied when full
  std::atomic<std::uint64_t> builds_{0};
  std::atomic<std::uint64_t> header_builds_{0};
  std::mutex pch_mtx_;                 // guards the members below
  bool toolchain_asked_ = false;       // the interpreter was asked for torch's compiler and paths
  std::vector<std::string> toolchain_; // compiler, torch/extension.h, include directories; empty: none
  std::set<std::string> pch_building_; // signatures being made now
  std::set<std::string> pch_failed_;   // signatures whose compiler failed (not tried again)
  std::vector<std::thread> header_threads_; // headers made beside CUDA builds, joined at the end
  bool stopping_ = false;              // the destructor runs: no header is begun
  std::atomic<bool> stop_headers_{false}; // kills the headers being made
};

} // namespace crucible::env
