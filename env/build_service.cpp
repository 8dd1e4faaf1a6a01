// The build service (env/build_service.hpp).
#include "env/build_service.hpp"

#include <unistd.h>

#include <cctype>
#include <fstream>

#include "core/sha256.hpp"
#include "env/wire.hpp"
#include "env/worker_messages.hpp"
#include "env/worker_pool.hpp"

namespace crucible::env {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {
// A directory of the extension cache: workers (nobody, where we are root) read it, we alone write.
constexpr auto readable_dir = fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec
                              | fs::perms::others_read | fs::perms::others_exec;
} // namespace

build_service::build_service(worker_pool& pool, std::string python, fs::path extensions_dir)
  : pool_(pool), python_(std::move(python)), extensions_dir_(std::move(extensions_dir)) {
  // Workers read the cache (a worker started as root reads it as nobody); only we write it.
  std::error_code ec;
  fs::create_directories(extensions_dir_, ec);
  fs::permissions(extensions_dir_, readable_dir, ec);
}

std::string build_service::build(const std::string& request, clock_type::time_point deadline) {
  auto failed = [](const std::string& log) { return worker_msg::build_failed(log); };
  std::string name;
  std::string fn;
  try {
    const auto n = wire::parse(request);
    name = n["args"]["name"].as<std::string>();
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
  // interpreter (torch's version and headers) and the device model.
  const auto key = sha256_hex(request + "\n" + python_ + "\n" + pool_.hardware()).substr(0, 32);
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
  auto b = pool_.start_builder(deadline);
  if (!b)
    return failed("the build service could not start a builder: " + b.error().message);
  ++builds_;
  std::unique_ptr<worker> builder = std::move(*b);
  if (auto sent = builder->send(request); !sent) {
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
        reply = failed(n["log"].as<std::string>(""));
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
          fs::permissions(tmp, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read, ec);
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
