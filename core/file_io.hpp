// core/file_io.hpp: whole-file reads, and whole-file replacement that a crash cannot leave
// half-written. Used by storage (run directories, checkpoints) and policy (tokenizer files).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "core/error.hpp"

namespace crucible {

/// Replaces `path` with `content`: writes a temporary file in the same directory, fsyncs it,
/// renames it over `path`, then fsyncs the directory. Readers see the old or the new content,
/// never a mix. The parent directory must exist. Thread-safe for distinct paths.
result<void> write_file_atomic(const std::filesystem::path& path, std::string_view content);

/// Reads a whole file. errc::not_found if it does not exist, errc::io on other failures.
result<std::string> read_file(const std::filesystem::path& path);

/// Reads a source file (a task, a candidate): like read_file, and refuses with errc::invalid_arg
/// what is not a regular file (a directory, a device) or not text (a NUL byte, bytes that are not
/// UTF-8), naming the path and the offset of the first offending byte.
result<std::string> read_source_file(const std::filesystem::path& path);

/// The directory of the running executable (/proc/self/exe), or an empty path where unknown.
/// Files shipped with the checkout (env/eval/harness, configs/prompts) are found by walking up from it.
std::filesystem::path executable_dir();

/// A path a configuration or flag names, for files shipped with the checkout (env/tasks/cpu): as
/// given where it is absolute or exists from the working directory; else the first directory
/// above the executable's where it exists (a build inside the checkout run from anywhere); else
/// as given, for the caller's error to name.
std::string shipped_path(const std::string& configured);

/// fsyncs a directory so that renames and creations inside it are durable.
result<void> fsync_directory(const std::filesystem::path& dir);

/// Bytes of the regular files under `dir`, at any depth (for the rates of checkpoint writes and
/// reads); what cannot be listed counts 0.
std::uint64_t directory_bytes(const std::filesystem::path& dir);

} // namespace crucible
