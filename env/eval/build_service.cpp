// The build service (env/eval/build_service.hpp).
#include "env/eval/build_service.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <regex>


#include "core/json.hpp"
#include "core/json_parse.hpp"
#include "core/sha256.hpp"
#include "env/eval/wire.hpp"
#include "env/eval/worker_messages.hpp"
#include "env/eval/worker_pool.hpp"

namespace crucible::env {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {
// A file and a directory of the extension cache: workers (nobody, where we are root) read them, we
// alone write.
constexpr auto readable_file = fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read;
constexpr auto readable_dir = fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec
                              | fs::perms::others_read | fs::perms::others_exec;

// A failed build's record in the cache, in the key's directory, where the library would be.
constexpr const char* failure_record = "build_failed.log";
constexpr std::size_t max_failure_record = 64 * 1024;

// Runs `argv` (our own commands only: the interpreter's answer below, the compiler on torch's
// header) in a process group of its own, stdin from /dev/null, stdout into `out` where given and
// stderr dropped; its exit status, -1 where it could not start or was killed, or -2 where it passed
// `deadline` (the group is killed then).
int run_own_command(const std::vector<std::string>& argv, clock_type::time_point deadline, std::string* out,
                    const std::atomic<bool>* cancel = nullptr) {
  int fds[2] = {-1, -1};
  if (::pipe2(fds, O_CLOEXEC) != 0)
    return -1;
  std::vector<char*> args;
  for (const auto& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return -1;
  }
  if (pid == 0) { // async-signal-safe calls only until exec
    ::setpgid(0, 0);
    const int null = ::open("/dev/null", O_RDWR);
    ::dup2(null, 0);
    ::dup2(out != nullptr ? fds[1] : null, 1);
    ::dup2(null, 2);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid); // as the child does: no window in which a kill of the group misses it
  ::close(fds[1]);
  bool late = false;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()).count();
    if (left <= 0 || (cancel != nullptr && cancel->load())) {
      late = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (r < 0 && errno != EINTR)
      break;
    if (r <= 0)
      continue;
    const auto n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0)
      break; // the end of its output: it exits now
    if (out != nullptr && out->size() < (1u << 20))
      out->append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  if (late)
    ::kill(-pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (late)
    return -2;
  if (!WIFEXITED(status))
    return -1;
  return WEXITSTATUS(status);
}

} // namespace

std::string normalised_source(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  const std::size_t n = src.size();
  bool space = false;     // a run of spaces and tabs (or a comment) is pending: one space, none at a line's end
  bool has_token = false; // the line (with the lines it continues) has a token
  bool directive = false; // ... and its first is '#'
  auto put = [&](char c) {
    if (space)
      out += ' ';
    space = false;
    if (!has_token) {
      has_token = true;
      directive = c == '#';
    }
    out += c;
  };
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; };
  // The identifier characters right before position i (a literal's prefix, or a number's digits).
  auto before = [&](std::size_t i) {
    std::size_t k = i;
    while (k > 0 && ident(src[k - 1]))
      --k;
    return src.substr(k, i - k);
  };
  for (std::size_t i = 0; i < n;) {
    const char c = src[i];
    if (c == ' ' || c == '\t') {
      space = true;
      ++i;
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && (i + 1 >= n || src[i + 1] != '\n'))
        return std::string{src}; // a lone carriage return: left as it is
      if (c == '\r') {
        ++i;
        continue;
      }
      space = false;
      if (out.empty() || out.back() != '\\') // a spliced line goes on with the same directive
        has_token = directive = false;
      out += '\n';
      ++i;
    } else if (c == '/' && i + 1 < n && src[i + 1] == '/') {
      const auto end = std::min(src.find('\n', i), n);
      if (src.substr(i, end - i).find('\\') != std::string_view::npos)
        return std::string{src}; // a comment that may go on past its line: left as it is
      space = true;
      i = end;
    } else if (c == '/' && i + 1 < n && src[i + 1] == '*') {
      const auto end = src.find("*/", i + 2);
      if (end == std::string_view::npos)
        return std::string{src};
      const auto lines = std::count(src.begin() + static_cast<long>(i), src.begin() + static_cast<long>(end), '\n');
      // A comment is one space; one across lines keeps its newlines (every line keeps its number),
      // which would end a directive it is part of: such a source is left as it is.
      if (lines > 0 && directive)
        return std::string{src};
      for (long k = 0; k < lines; ++k) {
        out += '\n';
        has_token = directive = false;
      }
      space = true;
      i = end + 2;
    } else if (c == '"' || c == '\'') {
      const auto prefix = before(i);
      if (c == '\'' && !prefix.empty() && prefix != "L" && prefix != "u" && prefix != "U" && prefix != "u8") {
        put(c); // a digit separator (1'000)
        ++i;
        continue;
      }
      const bool raw = c == '"' && (prefix == "R" || prefix == "LR" || prefix == "uR" || prefix == "UR" || prefix == "u8R");
      std::size_t j = i + 1;
      if (raw) {
        const auto open = src.find('(', j);
        if (open == std::string_view::npos || open - j > 16)
          return std::string{src};
        const std::string close = ")" + std::string{src.substr(j, open - j)} + "\"";
        const auto end = src.find(close, open + 1);
        if (end == std::string_view::npos)
          return std::string{src};
        j = end + close.size();
      } else {
        while (j < n && src[j] != c && src[j] != '\n')
          j += src[j] == '\\' ? 2 : 1;
        if (j >= n || src[j] != c)
          return std::string{src}; // an unterminated literal: left as it is
        ++j;
      }
      put(c);
      out.append(src.substr(i + 1, j - i - 1)); // as written
      i = j;
    } else if (c == '<' && directive) {
      // A header name (#include <a//b.h>) is copied as written, like a literal.
      std::string line = out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
      line.erase(std::remove(line.begin(), line.end(), ' '), line.end());
      if (line != "#include" && line != "#include_next" && line != "#import") {
        put(c);
        ++i;
        continue;
      }
      const auto end = src.find_first_of(">\n", i);
      if (end == std::string_view::npos || src[end] != '>')
        return std::string{src};
      put(c);
      out.append(src.substr(i + 1, end - i));
      i = end + 1;
    } else {
      put(c);
      ++i;
    }
  }
  return out;
}

std::string build_key_material(const std::string& request) {
  const auto parsed = parse_json(request, "a build request");
  const json_value* args = parsed ? parsed->find("args") : nullptr;
  if (args == nullptr || !args->is_object())
    return request;
  // C++ and CUDA sources only: Triton's requests (Python, IR) are keyed as they are.
  const auto fn = json_string(parsed->find("fn")).value_or("");
  if (fn != "load_inline" && fn != "load")
    return request;
  auto normalised = [](const json_value& v) {
    if (v.is_string())
      return json_value{normalised_source(v.as_string())};
    if (!v.is_array())
      return v;
    json_array out;
    for (const auto& x : v.as_array()) {
      if (x.is_string()) {
        out.emplace_back(normalised_source(x.as_string()));
      } else if (const auto* text = x.find("text"); x.is_object() && text != nullptr && text->is_string()) {
        json_object file; // `load`'s files: their text normalised, the rest as it was
        for (const auto& m : x.as_object())
          file.push_back({m.key, m.key == "text" ? json_value{normalised_source(m.value.as_string())} : m.value});
        out.emplace_back(std::move(file));
      } else {
        out.push_back(x);
      }
    }
    return json_value{std::move(out)};
  };
  json_object a;
  for (const auto& m : args->as_object()) {
    const bool source = m.key == "cpp_sources" || m.key == "cuda_sources" || m.key == "sources";
    a.push_back({m.key, source ? normalised(m.value) : m.value});
  }
  json_object top;
  for (const auto& m : parsed->as_object())
    top.push_back({m.key, m.key == "args" && &m.value == args ? json_value{std::move(a)} : m.value});
  return to_json_text(json_value{std::move(top)});
}

bool precompilable_flag(const std::string& f) {
  static const std::regex plain{"-O[0-3s]|-Ofast|-march=native|-mtune=native|-ffast-math|-funroll-loops|"
                                "-fopenmp|-DNDEBUG|-std=c\\+\\+(14|17|20)|-w|-Wall|-Wextra|-Wno-[a-z-]+|-g0"};
  return f.size() <= 40 && std::regex_match(f, plain);
}

namespace {

// torch's compiler, torch/extension.h and the include directories load_inline compiles with
// (torch's and the interpreter's), as the workers' interpreter reports them; empty on failure.
std::vector<std::string> ask_toolchain(const std::string& python, clock_type::time_point deadline) {
  static constexpr const char* script =
    "import json, os, sysconfig\n"
    "import torch.utils.cpp_extension as ce\n"
    "print(json.dumps([ce.get_cxx_compiler(), os.path.join(ce._TORCH_PATH, 'include', 'torch', 'extension.h')]"
    " + ce.include_paths('cpu') + [sysconfig.get_path('include', scheme='posix_prefix')]))\n";
  std::string out;
  if (run_own_command({python, "-I", "-B", "-c", script}, deadline, &out) != 0)
    return {};
  const auto line = out.substr(0, out.find_last_not_of("\n") + 1);
  auto parsed = parse_json(line.substr(line.rfind('\n') == std::string::npos ? 0 : line.rfind('\n') + 1));
  std::vector<std::string> paths;
  if (!parsed || !parsed->is_array())
    return {};
  for (const auto& v : parsed->as_array()) {
    if (!v.is_string() || v.as_string().empty())
      return {};
    paths.push_back(v.as_string());
  }
  return paths.size() >= 3 ? paths : std::vector<std::string>{};
}
// Where GCC finds a .gch it cannot use (torch/extension.h included a second time, or other
// options or macros), it looks for the header in that same directory and no further: the header
// written here beside it (DIR/torch/extension.h) continues the search to torch's own (whose
// #pragma once keeps it to one copy). True once it is there.
bool header_stub(const fs::path& dir) {
  std::error_code ec;
  const auto stub = dir / "torch" / "extension.h";
  if (fs::exists(stub, ec))
    return true;
  fs::create_directories(stub.parent_path(), ec);
  const auto tmp = stub.parent_path() / ("extension.h.tmp" + std::to_string(::getpid()));
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "// Made by crucible's build service beside extension.h.gch: where GCC cannot use that\n"
           "// precompiled header, it reads this, which reads torch's own header.\n"
           "#include_next <torch/extension.h>\n";
    if (!out)
      return false;
  }
  fs::permissions(tmp, readable_file, ec);
  fs::rename(tmp, stub, ec);
  return !ec;
}
} // namespace

build_service::build_service(worker_pool& pool, std::string python, fs::path extensions_dir)
  : pool_(pool), python_(std::move(python)), extensions_dir_(std::move(extensions_dir)) {
  // Workers read the cache (a worker started as root reads it as nobody); only we write it.
  std::error_code ec;
  fs::create_directories(extensions_dir_, ec);
  fs::permissions(extensions_dir_, readable_dir, ec);
}

build_service::~build_service() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock{pch_mtx_};
    stopping_ = true;
    threads.swap(header_threads_);
  }
  stop_headers_ = true; // a header still being made is killed within a second
  for (auto& t : threads)
    t.join();
}

std::string build_service::precompiled_header(const std::string& fn, const wire::node& args,
                                              clock_type::time_point deadline) {
  std::vector<std::string> flags;
  bool background = false; // a CUDA build: the header is made beside it, not before
  try {
    if (fn != "load_inline" || args["no_implicit_headers"].as<bool>(false))
      return {};
    if (const auto cuda = args["cuda_sources"]; cuda.defined() && !cuda.is_null())
      background = cuda.is_list() ? cuda.size() > 0 : !cuda.as<std::string>("").empty();
    const auto extra = args["extra_cflags"];
    if (extra.defined() && !extra.is_null() && !extra.is_list())
      return {};
    for (const auto f : extra) {
      if (!f.is_scalar())
        return {};
      flags.push_back(f.as<std::string>(""));
      if (!precompilable_flag(flags.back()))
        return {};
    }
  } catch (const wire::error&) {
    return {};
  }
  std::vector<std::string> argv;
  std::string sig;
  {
    std::lock_guard lock{pch_mtx_};
    if (!toolchain_asked_) {
      toolchain_asked_ = true;
      toolchain_ = ask_toolchain(python_, std::min(deadline, clock_type::now() + std::chrono::seconds(120)));
    }
    if (toolchain_.empty())
      return {};
    // As torch's load_inline compiles its C++ file (cpp_extension.py, the ninja file's cflags),
    // less the extension's name, which torch/extension.h never reads.
    argv = {toolchain_[0], "-x", "c++-header", toolchain_[1], "-DTORCH_API_INCLUDE_EXTENSION_H"};
    for (std::size_t i = 2; i < toolchain_.size(); ++i) {
      argv.push_back("-isystem");
      argv.push_back(toolchain_[i]);
    }
    argv.push_back("-fPIC");
    argv.push_back("-std=c++17");
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::string joined;
    for (const auto& a : argv)
      joined += a + '\n';
    sig = sha256_hex(joined + pool_.hardware()).substr(0, 24);
  }
  const auto dir = extensions_dir_ / "pch" / sig;
  const auto gch = dir / "torch" / "extension.h.gch";
  std::error_code ec;
  {
    std::lock_guard lock{pch_mtx_};
    if (fs::exists(gch, ec) && header_stub(dir))
      return dir.string();
    // Another build is making it (the request builds without rather than wait that long), or
    // its compiler failed: the build reads torch/extension.h itself, as without this service.
    if (pch_building_.count(sig) != 0 || pch_failed_.count(sig) != 0 || stopping_)
      return {};
    pch_building_.insert(sig);
    if (background) {
      // nvcc's file is a CUDA build's longer part and does not read the header: this build goes
      // on without it, and the header is made beside it for the builds after.
      header_threads_.emplace_back([this, argv = std::move(argv), sig, dir] {
        make_header(argv, sig, dir, clock_type::now() + std::chrono::seconds(600));
      });
      return {};
    }
  }
  // A third of the time the build has left at most: the candidate's own build keeps the rest. A
  // header not made in that time (a loaded machine) is tried again by a later build.
  const auto now = clock_type::now();
  const auto budget = deadline > now ? (deadline - now) / 3 : clock_type::duration::zero();
  return make_header(std::move(argv), sig, dir, now + budget) ? dir.string() : std::string{};
}

bool build_service::make_header(std::vector<std::string> argv, const std::string& sig, const fs::path& dir,
                                clock_type::time_point deadline) {
  const auto gch = dir / "torch" / "extension.h.gch";
  std::error_code ec;
  fs::create_directories(gch.parent_path(), ec);
  fs::permissions(dir, readable_dir, ec);
  fs::permissions(gch.parent_path(), readable_dir, ec);
  const auto tmp = gch.parent_path() / ("extension.h.gch.tmp" + std::to_string(::getpid()));
  argv.push_back("-o");
  argv.push_back(tmp.string());
  const int rc = run_own_command(argv, deadline, nullptr, &stop_headers_);
  const bool made = rc == 0 && fs::exists(tmp, ec) && header_stub(dir);
  if (made) {
    fs::permissions(tmp, readable_file, ec);
    fs::rename(tmp, gch, ec);
  }
  const bool kept = made && !ec;
  if (!kept)
    fs::remove(tmp, ec);
  std::lock_guard lock{pch_mtx_};
  pch_building_.erase(sig);
  if (kept)
    ++header_builds_;
  else if (rc != -2 && !stop_headers_.load())
    pch_failed_.insert(sig);
  return kept;
}

void build_service::remember_failure(const std::string& key, std::string log) {
  if (failed_builds_.size() >= max_failed_builds)
    failed_builds_.clear();
  failed_builds_.emplace(key, std::move(log));
}

bool lasting_build_failure(std::string_view log) {
  static const std::regex diagnostic{R"((^|[\s:(])(fatal )?error( [A-Z]*[0-9]+)?:)", std::regex::multiline};
  static const std::regex cut_short{
    R"(Killed|killed|[Ss]ignal|No space left|Cannot allocate memory|out of memory|MemoryError|internal compiler error|)"
    R"(Resource temporarily unavailable|[Tt]imed? ?out|Interrupted|Segmentation fault|core dumped)"};
  const std::string text{log};
  return std::regex_search(text, diagnostic) && !std::regex_search(text, cut_short);
}

std::string build_service::build(const std::string& request, clock_type::time_point deadline) {
  auto failed = [](const std::string& log) { return worker_msg::build_failed(log); };
  std::string name;
  std::string fn;
  wire::node args;
  try {
    const auto n = wire::parse(request);
    args = n["args"];
    name = args["name"].as<std::string>();
    fn = n["fn"].as<std::string>("");
  } catch (const wire::error& e) {
    return failed(std::string{"the build request is malformed: "} + e.what());
  }
  const bool identifier = !name.empty() && name.size() <= 200 && std::isdigit(static_cast<unsigned char>(name[0])) == 0
                          && name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
                               == std::string::npos;
  if (!identifier)
    return failed("the extension's name '" + name.substr(0, 200) + "' is not a Python identifier");
  // The key covers the whole request (sources, functions, flags, name, build environment), the
  // interpreter (torch's version and headers) and the device model; the sources as
  // normalised_source() writes them, so that equivalent sources share one build.
  const auto key = sha256_hex(build_key_material(request) + "\n" + python_ + "\n" + pool_.hardware()).substr(0, 32);
  const auto dir = extensions_dir_ / key;
  // A Triton kernel's build is its stages' files in one JSON document; every other build is a
  // library.
  const auto lib = dir / (name + (fn == "triton_kernel" ? ".json" : ".so"));
  auto built = [&] { return worker_msg::built(dir.string()); };
  std::error_code ec;
  {
    std::unique_lock lock{mtx_};
    cv_.wait(lock, [&] { return building_.count(key) == 0; });
    if (fs::exists(lib, ec))
      return built();
    // The compiler failed on this request before: the same reply, without compiling it again
    // (a candidate that falls back when its build fails would otherwise pay the whole build in
    // every verdict, and requests of one key wait for each other).
    if (const auto f = failed_builds_.find(key); f != failed_builds_.end())
      return failed(f->second);
    // ... or in an earlier process that kept the compiler's log in the cache.
    if (std::ifstream in{dir / failure_record, std::ios::binary}) {
      std::string log(max_failure_record, '\0');
      in.read(log.data(), static_cast<std::streamsize>(log.size()));
      log.resize(static_cast<std::size_t>(in.gcount()));
      remember_failure(key, log);
      return failed(log);
    }
    building_.insert(key);
  }
  struct done_building {
    build_service& s;
    const std::string& key;
    ~done_building() {
      {
        std::lock_guard lock{s.mtx_};
        s.building_.erase(key);
      }
      s.cv_.notify_all();
    }
  } guard{*this, key};
  // The precompiled header's directory ("" for none) goes with the request as its last field, so
  // that a `pch` of the worker's own, earlier in the object, always loses to it; outside the key:
  // the library is the same either way.
  std::string job = request;
  if (const auto end = job.find_last_of('}'); end != std::string::npos) {
    std::string field = ", \"pch\": ";
    append_json_string(field, precompiled_header(fn, args, deadline));
    job.insert(end, field);
  }
  auto b = pool_.start_builder(deadline);
  if (!b)
    return failed("the build service could not start a builder: " + b.error().message);
  ++builds_;
  std::unique_ptr<worker> builder = std::move(*b);
  if (auto sent = builder->send(job); !sent) {
    pool_.retire(std::move(builder));
    return failed("the builder stopped listening: " + sent.error().message);
  }
  worker_message msg;
  const auto got = builder->receive(deadline, msg);
  std::string reply;
  if (got == receive_outcome::deadline) {
    reply = failed("the build did not finish within evaluator.load_timeout_s");
  } else if (got == receive_outcome::died) {
    reply = failed("the builder " + builder->exit_description());
  } else {
    try {
      auto n = wire::parse(msg.json);
      const auto type = n["type"].as<std::string>();
      if (type == "build_failed") {
        // The build's own failure (the compiler's log), not a deadline or a dead builder: kept,
        // in memory, for the evaluator's life, and in the cache where it is the compiler's
        // verdict on the sources (written beside, then renamed).
        auto log = n["log"].as<std::string>("");
        reply = failed(log);
        if (lasting_build_failure(log) && log.size() <= max_failure_record) {
          fs::create_directories(dir, ec);
          fs::permissions(dir, readable_dir, ec);
          const auto tmp = dir / (std::string{failure_record} + ".tmp" + std::to_string(::getpid()));
          {
            std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
            out << log;
            if (!out)
              ec = std::make_error_code(std::errc::io_error);
          }
          if (!ec)
            fs::rename(tmp, dir / failure_record, ec);
          if (ec)
            fs::remove(tmp, ec);
        }
        std::lock_guard lock{mtx_};
        remember_failure(key, std::move(log));
      } else if (type != "built" || msg.frames.size() != 1 || msg.frames[0].empty()) {
        reply = failed("the builder broke the protocol: " + msg.json.substr(0, 200));
      } else {
        // Written beside, then renamed: a reader sees the whole library or none.
        fs::create_directories(dir, ec);
        fs::permissions(dir, readable_dir, ec);
        const auto tmp = dir / (lib.filename().string() + ".tmp" + std::to_string(::getpid()));
        {
          std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
          out.write(reinterpret_cast<const char*>(msg.frames[0].data()), static_cast<std::streamsize>(msg.frames[0].size()));
          if (!out)
            ec = std::make_error_code(std::errc::io_error);
        }
        if (!ec)
          fs::permissions(tmp, readable_file, ec);
        if (!ec)
          fs::rename(tmp, lib, ec);
        reply = ec ? failed("cannot keep the built library in " + dir.string() + ": " + ec.message()) : built();
        if (ec)
          fs::remove(tmp, ec);
      }
    } catch (const wire::error& e) {
      reply = failed(std::string{"the builder's reply is malformed: "} + e.what());
    }
  }
  pool_.retire(std::move(builder));
  return reply;
}

} // namespace crucible::env
