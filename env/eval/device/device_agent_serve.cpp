// env/eval/device/device_agent_serve.cpp: the device agent's side (env/eval/device/device_agent.hpp): each request run
// with env/eval/device/device_bytes.hpp's functions in this process, its objects kept by id until the
// evaluator lets them go. One thread a connection; the process ends when the evaluator closes
// the control connection, or after a request whose failure left the device's context unusable
// (a fault of any client under MPS ends every client's), so that the evaluator starts it anew.
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "env/eval/device/device_agent.hpp"
#include "env/eval/device/device_agent_wire.hpp"

namespace crucible::env {

namespace w = agent_wire;

namespace {

class table {
public:
  std::uint64_t keep(std::shared_ptr<device_bytes> b) {
    std::lock_guard lock{m_};
    const auto id = ++next_;
    bytes_[id] = std::move(b);
    return id;
  }
  std::uint64_t keep(std::shared_ptr<device_clock> c) {
    std::lock_guard lock{m_};
    const auto id = ++next_;
    clocks_[id] = std::move(c);
    return id;
  }
  std::shared_ptr<device_bytes> bytes(std::uint64_t id) {
    std::lock_guard lock{m_};
    auto it = bytes_.find(id);
    return it == bytes_.end() ? nullptr : it->second;
  }
  std::shared_ptr<device_clock> clock(std::uint64_t id) {
    std::lock_guard lock{m_};
    auto it = clocks_.find(id);
    return it == clocks_.end() ? nullptr : it->second;
  }
  void drop(std::uint64_t id) {
    std::shared_ptr<device_bytes> b; // released outside the lock (an unmapping waits for the device)
    std::shared_ptr<device_clock> c;
    {
      std::lock_guard lock{m_};
      if (auto it = bytes_.find(id); it != bytes_.end()) {
        b = std::move(it->second);
        bytes_.erase(it);
      }
      if (auto it = clocks_.find(id); it != clocks_.end()) {
        c = std::move(it->second);
        clocks_.erase(it);
      }
    }
  }

private:
  std::mutex m_;
  std::uint64_t next_ = 0;
  std::map<std::uint64_t, std::shared_ptr<device_bytes>> bytes_;
  std::map<std::uint64_t, std::shared_ptr<device_clock>> clocks_;
};

struct agent_state {
  int device = 0;
  table objects;
};

void put_bytes(w::out& f, std::uint64_t id, const device_bytes& b) {
  f.put(id);
  f.put<std::uint64_t>(reinterpret_cast<std::uintptr_t>(b.data()));
  f.put<std::uint64_t>(b.size());
  f.put<std::int32_t>(b.device());
}

// A request's reply: its status, then its fields (or the error's code and message).
struct reply {
  w::out f;
  bool failed = false;
  errc code = errc::none;
  std::string message;
};

// The objects a request names; empty with `bad` set where one is unknown.
std::vector<std::shared_ptr<device_bytes>> objects_of(agent_state& s, w::in& f, std::string& bad) {
  const auto n = f.get<std::uint64_t>();
  std::vector<std::shared_ptr<device_bytes>> out;
  for (std::uint64_t i = 0; i < n && !f.broken(); ++i) {
    const auto id = f.get<std::uint64_t>();
    auto b = s.objects.bytes(id);
    if (!b) {
      bad = "no device memory of id " + std::to_string(id);
      return {};
    }
    out.push_back(std::move(b));
  }
  return out;
}

template <class T>
bool failed(reply& r, const result<T>& x) {
  if (x)
    return false;
  r.failed = true;
  r.code = x.error().code;
  r.message = x.error().message;
  return true;
}

void refuse(reply& r, std::string message) {
  r.failed = true;
  r.code = errc::protocol;
  r.message = "device agent: " + std::move(message);
}

// Whether the device still takes work after a failed request: a fault leaves the context unusable
// (every later call fails), and the agent then ends.
bool device_usable(int device) {
  auto probe = allocate_owned(device, 256);
  if (!probe)
    return false;
  return fill_all({probe->get()}, 0).ok();
}

void run(agent_state& s, w::op what, w::in& f, reply& r) {
  std::string bad;
  auto one = [&](std::uint64_t id) {
    auto b = s.objects.bytes(id);
    if (!b)
      bad = "no device memory of id " + std::to_string(id);
    return b;
  };
  auto keep_one = [&](const result<std::shared_ptr<device_bytes>>& x) {
    if (!failed(r, x))
      put_bytes(r.f, s.objects.keep(*x), **x);
  };
  auto keep_list = [&](const result<std::vector<std::shared_ptr<device_bytes>>>& x) {
    if (failed(r, x))
      return;
    r.f.put<std::uint64_t>(x->size());
    for (const auto& b : *x)
      put_bytes(r.f, s.objects.keep(b), *b);
  };
  auto raw = [](const std::vector<std::shared_ptr<device_bytes>>& v) {
    std::vector<const device_bytes*> out;
    for (const auto& b : v)
      out.push_back(b.get());
    return out;
  };
  auto pairs = [](const std::vector<std::shared_ptr<device_bytes>>& v) {
    std::vector<device_copy> out;
    for (std::size_t i = 0; i + 1 < v.size(); i += 2)
      out.push_back(device_copy{v[i].get(), v[i + 1].get()});
    return out;
  };
  switch (what) {
    case w::op::map_exported: {
      const auto device = f.get<std::int32_t>();
      const auto handle = f.text();
      const auto offset = f.get<std::uint64_t>();
      const auto bytes = f.get<std::uint64_t>();
      const auto align = f.get<std::uint64_t>();
      if (!f.broken())
        keep_one(map_exported(device, handle, offset, bytes, align));
      break;
    }
    case w::op::map_allocation: {
      const auto device = f.get<std::int32_t>();
      const auto handle = f.text();
      if (!f.broken())
        keep_one(map_allocation(device, handle));
      break;
    }
    case w::op::subspan: {
      auto parent = one(f.get<std::uint64_t>());
      const auto offset = f.get<std::uint64_t>();
      const auto bytes = f.get<std::uint64_t>();
      const auto align = f.get<std::uint64_t>();
      if (parent && !f.broken())
        keep_one(subspan(parent, offset, bytes, align));
      break;
    }
    case w::op::allocate_owned: {
      const auto device = f.get<std::int32_t>();
      const auto bytes = f.get<std::uint64_t>();
      if (!f.broken())
        keep_one(allocate_owned(device, bytes));
      break;
    }
    case w::op::upload: {
      auto dst = one(f.get<std::uint64_t>());
      const auto data = f.text();
      if (dst && !f.broken())
        (void) failed(r, upload(*dst, reinterpret_cast<const std::byte*>(data.data()), data.size()));
      break;
    }
    case w::op::copy_all: {
      auto list = objects_of(s, f, bad);
      if (bad.empty() && !f.broken())
        (void) failed(r, copy_all(pairs(list)));
      break;
    }
    case w::op::fill_all: {
      auto list = objects_of(s, f, bad);
      const auto value = f.get<unsigned char>();
      if (bad.empty() && !f.broken())
        (void) failed(r, fill_all(raw(list), value));
      break;
    }
    case w::op::fastest_fill_ms: {
      const auto device = f.get<std::int32_t>();
      const auto bytes = f.get<std::uint64_t>();
      if (f.broken())
        break;
      auto ms = fastest_fill_ms(device, bytes);
      if (!failed(r, ms))
        r.f.put(*ms);
      break;
    }
    case w::op::flush_cache: {
      const auto device = f.get<std::int32_t>();
      const auto bytes = f.get<std::uint64_t>();
      if (!f.broken())
        (void) failed(r, flush_device_cache(device, bytes));
      break;
    }
    case w::op::clock_make: {
      const auto device = f.get<std::int32_t>();
      const auto close = f.get<std::int32_t>();
      if (f.broken())
        break;
      if (close != static_cast<std::int32_t>(clock_close::wait) && close != static_cast<std::int32_t>(clock_close::poll)) {
        bad = "a clock's close of kind " + std::to_string(close);
        break;
      }
      auto c = make_device_clock(device, static_cast<clock_close>(close));
      if (!failed(r, c))
        r.f.put(s.objects.keep(std::shared_ptr<device_clock>{std::move(*c)}));
      break;
    }
    case w::op::clock_arm:
    case w::op::clock_close:
    case w::op::clock_let_go:
    case w::op::clock_finish: {
      const auto id = f.get<std::uint64_t>();
      auto c = s.objects.clock(id);
      if (!c) {
        bad = "no device clock of id " + std::to_string(id);
        break;
      }
      auto list = objects_of(s, f, bad);
      if (!bad.empty() || f.broken())
        break;
      if (what == w::op::clock_arm) {
        const auto seq = f.get<std::uint32_t>();
        if (list.empty() || f.broken()) {
          bad = "a clock's arm without its go word";
          break;
        }
        const auto go = list.back();
        list.pop_back();
        (void) failed(r, c->arm(pairs(list), *go, seq));
      } else if (what == w::op::clock_close) {
        const auto seq = f.get<std::uint32_t>();
        if (list.empty() || f.broken()) {
          bad = "a clock's close without its done word";
          break;
        }
        const auto done = list.front();
        list.erase(list.begin());
        keep_list(c->close(*done, seq, raw(list)));
      } else if (what == w::op::clock_let_go) {
        c->let_go();
      } else {
        const auto timeout = f.get<double>();
        if (f.broken())
          break;
        auto ms = c->finish(timeout);
        if (!failed(r, ms))
          r.f.put(*ms);
      }
      break;
    }
    case w::op::copy_to_owned: {
      auto src = one(f.get<std::uint64_t>());
      if (src && !f.broken())
        keep_one(copy_to_owned(*src));
      break;
    }
    case w::op::copy_all_to_owned: {
      auto list = objects_of(s, f, bad);
      if (bad.empty() && !f.broken())
        keep_list(copy_all_to_owned(raw(list)));
      break;
    }
    case w::op::download: {
      auto src = one(f.get<std::uint64_t>());
      if (!src || f.broken())
        break;
      auto bytes = download(*src);
      if (!failed(r, bytes))
        r.f.bytes(bytes->data(), bytes->size());
      break;
    }
    case w::op::compare_all:
    case w::op::scale: {
      const bool compare = what == w::op::compare_all;
      auto list = objects_of(s, f, bad);
      if (!bad.empty() || f.broken())
        break;
      const std::size_t per = compare ? 2 : 1;
      std::vector<device_comparison> pairs_of;
      for (std::size_t i = 0; i + per - 1 < list.size(); i += per) {
        device_comparison c{};
        c.want = list[i].get();
        c.got = compare ? list[i + 1].get() : nullptr;
        c.type = f.get<dtype>();
        c.n = f.get<std::uint64_t>();
        c.tol = f.get<tolerance>();
        c.slack = f.get<double>();
        pairs_of.push_back(c);
      }
      if (f.broken())
        break;
      result<std::vector<device_difference>> d = std::vector<device_difference>{};
      if (compare) {
        d = device_compare_all(pairs_of);
      } else {
        for (const auto& c : pairs_of) {
          auto one_scale = device_scale(*c.want, c.type, c.n, c.tol.atol);
          if (!one_scale) {
            d = one_scale.error();
            break;
          }
          d->push_back(*one_scale);
        }
      }
      if (!failed(r, d))
        for (const auto& x : *d)
          r.f.put(x);
      break;
    }
    case w::op::keep_freed: {
      const auto device = f.get<std::int32_t>();
      const auto bytes = f.get<std::uint64_t>();
      if (!f.broken())
        (void) failed(r, keep_freed_memory(device, bytes));
      break;
    }
    case w::op::release_freed: {
      const auto device = f.get<std::int32_t>();
      if (!f.broken())
        (void) failed(r, release_freed_memory(device));
      break;
    }
    case w::op::device_name: {
      const auto device = f.get<std::int32_t>();
      if (f.broken())
        break;
      auto name = device_name(device);
      if (!failed(r, name))
        r.f.text(*name);
      break;
    }
    case w::op::times:
      r.f.put(device_bytes_time());
      break;
    case w::op::free_only:
      break;
    case w::op::probe:
      if (!device_usable(s.device)) {
        r.failed = true;
        r.code = errc::device;
        r.message = "CUDA device " + std::to_string(s.device) + " no longer takes work in its device agent";
      }
      break;
    default:
      refuse(r, "unknown request " + std::to_string(static_cast<std::uint32_t>(what)));
      return;
  }
  if (!bad.empty())
    refuse(r, bad);
  else if (f.broken())
    refuse(r, "a request shorter than its fields");
}

void serve_connection(agent_state& s, int fd) {
  std::string frame;
  while (w::recv_frame(fd, frame)) {
    w::in f{std::move(frame)};
    const auto what = f.get<w::op>();
    const auto frees = f.get<std::uint64_t>();
    for (std::uint64_t i = 0; i < frees && !f.broken(); ++i)
      s.objects.drop(f.get<std::uint64_t>());
    reply r;
    if (f.broken())
      refuse(r, "a request shorter than its header");
    else
      run(s, what, f, r);
    w::out out;
    if (r.failed) {
      out.put<std::uint8_t>(0);
      out.put(r.code);
      out.text(r.message);
    } else {
      out.put<std::uint8_t>(1);
      out.append(r.f.data());
    }
    const bool sent = w::send_frame(fd, out);
    if (r.failed && r.code == errc::device && !device_usable(s.device))
      ::_exit(3); // the evaluator sees the agent end and starts it anew
    if (!sent)
      break;
  }
  ::close(fd);
}

} // namespace

int serve_device_agent(int control, int device) {
  auto* s = new agent_state; // lives as long as the process: connection threads use it until _exit
  s->device = device;
  // Ready: the device opened (its context made) and named, before the evaluator sends anything.
  {
    w::out ready;
    auto name = device_name(device);
    auto probe = name ? allocate_owned(device, 256) : result<std::shared_ptr<device_bytes>>{name.error()};
    if (!probe) {
      ready.put<std::uint8_t>(0);
      ready.put(probe.error().code);
      ready.text("cannot open CUDA device " + std::to_string(device) + ": " + probe.error().message);
      (void) w::send_frame(control, ready);
      return 2;
    }
    ready.put<std::uint8_t>(1);
    ready.text(*name);
    if (!w::send_frame(control, ready))
      return 2;
  }
  for (;;) {
    const int fd = w::recv_fd(control);
    if (fd < 0)
      break; // the evaluator closed the control connection (or ended)
    std::thread{[s, fd] { serve_connection(*s, fd); }}.detach();
  }
  ::_exit(0); // without tearing CUDA down under threads that may still be in a call
}

} // namespace crucible::env
