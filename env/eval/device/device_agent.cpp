// env/eval/device/device_agent.cpp: the evaluator's side of the device agent (env/eval/device/device_agent.hpp): starting
// it, a connection a thread, and the objects that live in it.
#include "env/eval/device/device_agent.hpp"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "env/eval/device/device_agent_wire.hpp"

namespace crucible::env {

namespace fs = std::filesystem;
namespace w = agent_wire;

namespace agent {

namespace {
std::string device_label(int device) { return "cuda:" + std::to_string(device); }
} // namespace

/// One device's agent: its process, the control socket new connections travel over, and the ids
/// of its objects let go since they were last sent.
class link {
public:
  link(int device, device_agent_spec spec) : device_(device), spec_(std::move(spec)) {}

  int device() const noexcept { return device_; }

  /// Started (again, where it ended) and ready; its generation.
  result<std::uint64_t> ensure() {
    std::lock_guard lock{m_};
    if (control_ >= 0)
      return generation_.load();
    if (generation_.load() > 0)
      if (auto hook = restart_hook())
        hook(device_); // what the ended agent leaves (its device's other clients) cleared first
    if (auto r = start_locked(); !r)
      return r.error();
    return generation_.load();
  }

  static std::function<void(int)> restart_hook() {
    std::lock_guard lock{hook_m()};
    return hook_fn();
  }
  static void set_restart_hook(std::function<void(int)> f) {
    std::lock_guard lock{hook_m()};
    hook_fn() = std::move(f);
  }

  pid_t pid() {
    std::lock_guard lock{m_};
    return control_ >= 0 ? pid_ : 0;
  }

  /// A request and its reply's fields (after its status), on this thread's connection.
  result<w::in> call(w::op what, const std::function<void(w::out&)>& args);

  /// An object of generation `gen` let go: freed with the next request.
  void let_go(std::uint64_t id, std::uint64_t gen) noexcept {
    try {
      std::lock_guard lock{free_m_};
      if (gen == generation_.load())
        to_free_.push_back(id);
    } catch (...) {
    }
  }

  std::uint64_t generation() const noexcept { return generation_.load(); }

  /// Ends the agent (started again on the next call).
  void end(const std::string& why) {
    std::lock_guard lock{m_};
    ended_locked(why);
  }

private:
  static std::mutex& hook_m() {
    static std::mutex m;
    return m;
  }
  static std::function<void(int)>& hook_fn() {
    static auto* f = new std::function<void(int)>;
    return *f;
  }
  result<void> start_locked();
  void ended_locked(const std::string& why);
  result<int> connection(std::uint64_t gen);

  int device_;
  device_agent_spec spec_;
  std::mutex m_;
  pid_t pid_ = 0;
  int control_ = -1;
  std::atomic<std::uint64_t> generation_{0};
  std::string last_end_; // why the last agent ended
  std::mutex free_m_;
  std::vector<std::uint64_t> to_free_;
};

namespace {

// How long a reply may take: a clock's finish waits up to the verdict's run timeout plus the
// sealed copies' deadlines; nothing else takes more than seconds.
constexpr int reply_deadline_ms = 15 * 60 * 1000;

// This thread's connections, by agent, and the generation each was made for.
struct thread_connections {
  struct conn {
    int fd = -1;
    std::uint64_t gen = 0;
  };
  std::map<const link*, conn> by_link;
  ~thread_connections() {
    for (auto& [l, c] : by_link)
      if (c.fd >= 0)
        ::close(c.fd);
  }
};
thread_local thread_connections t_conns;

struct registry {
  std::mutex m;
  std::map<int, link*> links; // never freed: objects of an agent may outlive everything else
};
registry& reg() {
  static auto* r = new registry;
  return *r;
}

class remote_bytes final : public device_bytes {
public:
  remote_bytes(link* l, std::uint64_t id, std::uint64_t gen, std::uint64_t addr, std::uint64_t size, int device)
    : l_(l), id_(id), gen_(gen), addr_(addr), size_(size), device_(device) {}
  ~remote_bytes() override { l_->let_go(id_, gen_); }
  const void* data() const noexcept override { return reinterpret_cast<const void*>(static_cast<std::uintptr_t>(addr_)); }
  std::uint64_t size() const noexcept override { return size_; }
  int device() const noexcept override { return device_; }
  link* owner() const noexcept { return l_; }
  std::uint64_t id() const noexcept { return id_; }
  std::uint64_t gen() const noexcept { return gen_; }

private:
  link* l_;
  std::uint64_t id_, gen_, addr_, size_;
  int device_;
};

// An object of the agent's as the evaluator names it in a request: its id, or an error where it is
// not the agent's (this process's memory) or of an agent that has ended since.
result<std::uint64_t> id_of(const link& l, const device_bytes* b) {
  const auto* r = dynamic_cast<const remote_bytes*>(b);
  if (r == nullptr || r->owner() != &l)
    return fail(errc::invalid_arg, "device memory of another process than ", device_label(l.device()), "'s device agent");
  if (r->gen() != l.generation())
    return fail(errc::device, "device memory of ", device_label(l.device()), "'s device agent before it ended and was started again");
  return r->id();
}

result<std::shared_ptr<device_bytes>> read_bytes(link& l, w::in& f) {
  const auto id = f.get<std::uint64_t>();
  const auto addr = f.get<std::uint64_t>();
  const auto size = f.get<std::uint64_t>();
  const auto device = f.get<std::int32_t>();
  if (f.broken())
    return fail(errc::protocol, device_label(l.device()), "'s device agent sent a short reply");
  return std::shared_ptr<device_bytes>{std::make_shared<remote_bytes>(&l, id, f.generation, addr, size, device)};
}

result<std::vector<std::shared_ptr<device_bytes>>> read_list(link& l, w::in& f) {
  const auto n = f.get<std::uint64_t>();
  std::vector<std::shared_ptr<device_bytes>> out;
  for (std::uint64_t i = 0; i < n && !f.broken(); ++i) {
    auto b = read_bytes(l, f);
    if (!b)
      return b.error();
    out.push_back(std::move(*b));
  }
  return out;
}

// The ids of a list of objects, checked before anything is sent; an error where one is not the
// agent's.
result<std::vector<std::uint64_t>> ids_of(const link& l, const std::vector<const device_bytes*>& list) {
  std::vector<std::uint64_t> ids;
  for (const auto* b : list) {
    auto id = id_of(l, b);
    if (!id)
      return id.error();
    ids.push_back(*id);
  }
  return ids;
}

// A list of ids as a request carries it: its count, then the ids.
void put_ids(w::out& f, const std::vector<std::uint64_t>& ids) {
  f.put<std::uint64_t>(ids.size());
  for (auto id : ids)
    f.put(id);
}

// The spans of copies as one list: each copy's destination, then its source.
std::vector<const device_bytes*> flat(const std::vector<device_copy>& copies) {
  std::vector<const device_bytes*> list;
  for (const auto& c : copies) {
    list.push_back(c.dst);
    list.push_back(c.src);
  }
  return list;
}

class remote_clock final : public device_clock {
public:
  remote_clock(link* l, std::uint64_t id, std::uint64_t gen) : l_(l), id_(id), gen_(gen) {}
  ~remote_clock() override { l_->let_go(id_, gen_); }

  result<void> arm(const std::vector<device_copy>& copies_in, const device_bytes& go, std::uint32_t seq) override {
    auto list = flat(copies_in);
    list.push_back(&go);
    auto r = with_ids(w::op::clock_arm, list, [&](w::out& f) { f.put(seq); });
    if (!r)
      return r.error();
    return {};
  }

  result<std::vector<std::shared_ptr<device_bytes>>> close(const device_bytes& done, std::uint32_t seq,
                                                           const std::vector<const device_bytes*>& outs) override {
    std::vector<const device_bytes*> list{&done};
    list.insert(list.end(), outs.begin(), outs.end());
    auto r = with_ids(w::op::clock_close, list, [&](w::out& f) { f.put(seq); });
    if (!r)
      return r.error();
    return read_list(*l_, *r);
  }

  void let_go() noexcept override {
    try {
      (void) with_ids(w::op::clock_let_go, {}, {});
    } catch (...) {
    }
  }

  result<double> finish(double timeout_s) override {
    auto r = with_ids(w::op::clock_finish, {}, [&](w::out& f) { f.put(timeout_s); });
    if (!r)
      return r.error();
    return r->get<double>();
  }

private:
  // A request on this clock: its id, then `list`'s ids (count first), then `more`.
  result<w::in> with_ids(w::op what, const std::vector<const device_bytes*>& list, const std::function<void(w::out&)>& more) {
    if (gen_ != l_->generation())
      return fail(errc::device, "the device clock of ", device_label(l_->device()), "'s device agent before it ended and was started again");
    auto ids = ids_of(*l_, list);
    if (!ids)
      return ids.error();
    return l_->call(what, [&](w::out& f) {
      f.put(id_);
      put_ids(f, *ids);
      if (more)
        more(f);
    });
  }

  link* l_;
  std::uint64_t id_, gen_;
};

// Runs `job` on a thread of its own that lives as long as this process, and waits for it.
void launch_on_lasting_thread(const std::function<void()>& job) {
  struct launcher {
    std::mutex m;
    std::condition_variable cv;
    const std::function<void()>* job = nullptr;
    bool done = false;
  };
  static auto* l = [] {
    auto* made = new launcher;
    std::thread{[made] {
      std::unique_lock lock{made->m};
      for (;;) {
        made->cv.wait(lock, [&] { return made->job != nullptr; });
        (*made->job)();
        made->job = nullptr;
        made->done = true;
        made->cv.notify_all();
      }
    }}.detach();
    return made;
  }();
  static std::mutex one_at_a_time;
  std::lock_guard turn{one_at_a_time};
  std::unique_lock lock{l->m};
  l->done = false;
  l->job = &job;
  l->cv.notify_all();
  l->cv.wait(lock, [&] { return l->done; });
}

} // namespace

result<void> link::start_locked() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return fail(errc::io, "device agent of ", device_label(device_), ": socketpair: ", std::strerror(errno));
  // Everything the child needs, made before the fork: between fork and exec only async-signal-safe calls.
  const std::string dev = std::to_string(device_);
  std::vector<std::string> args{spec_.program, "--device", dev, "--fd", "3"};
  std::vector<char*> argv, envp;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> envs = spec_.environment;
  for (auto& e : envs)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  const uid_t uid = spec_.uid;
  const gid_t gid = spec_.gid;
  const pid_t parent = ::getpid();
  // Forked on a thread that lives as long as this process: the parent-death signal is the forking
  // thread's, and an agent started from an evaluation's thread would die with that thread.
  pid_t pid = -1;
  int fork_errno = 0;
  launch_on_lasting_thread([&] {
    pid = ::fork();
    fork_errno = errno;
    if (pid != 0)
      return;
    if (sv[1] == 3 ? ::fcntl(3, F_SETFD, 0) != 0 : ::dup2(sv[1], 3) < 0) // dup2 onto itself keeps close-on-exec
      ::_exit(127);
    if (gid != static_cast<gid_t>(-1)
        && (::syscall(SYS_setgroups, 0, nullptr) != 0 || ::syscall(SYS_setresgid, gid, gid, gid) != 0))
      ::_exit(126);
    if (uid != static_cast<uid_t>(-1) && ::syscall(SYS_setresuid, uid, uid, uid) != 0)
      ::_exit(126);
    // After the change of user, which clears the parent-death signal: it dies with the evaluator.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent)
      ::_exit(127);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  });
  if (pid < 0) {
    ::close(sv[0]);
    ::close(sv[1]);
    return fail(errc::io, "device agent of ", device_label(device_), ": fork: ", std::strerror(fork_errno));
  }
  ::close(sv[1]);
  // Ready: one frame, its status and, on failure, the agent's message. CUDA's start may take a while.
  pollfd p{sv[0], POLLIN, 0};
  int ready = 0;
  do
    ready = ::poll(&p, 1, 120000);
  while (ready < 0 && errno == EINTR);
  std::string frame;
  if (ready <= 0 || !w::recv_frame(sv[0], frame)) {
    ::close(sv[0]);
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    std::string why = ready == 0 ? std::string{"did not open the device within 120 s"}
                      : WIFEXITED(status) && WEXITSTATUS(status) == 127
                        ? "could not be run (" + spec_.program + ")"
                      : WIFEXITED(status) && WEXITSTATUS(status) == 126 ? std::string{"could not take the workers' user"}
                      : WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                          : "was killed by signal " + std::to_string(WTERMSIG(status));
    return fail(errc::device, "the device agent of ", device_label(device_), " ", why);
  }
  w::in f{std::move(frame)};
  if (f.get<std::uint8_t>() != 1) {
    const auto code = f.get<std::uint8_t>();
    auto message = f.text();
    ::close(sv[0]);
    int status = 0;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return fail(static_cast<errc>(code), "the device agent of ", device_label(device_), ": ", message);
  }
  pid_ = pid;
  control_ = sv[0];
  {
    std::lock_guard lock{free_m_};
    to_free_.clear();
    generation_.fetch_add(1);
  }
  return {};
}

void link::ended_locked(const std::string& why) {
  if (control_ < 0)
    return;
  ::close(control_);
  control_ = -1;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  last_end_ = why;
  pid_ = 0;
  std::lock_guard lock{free_m_};
  to_free_.clear();
  generation_.fetch_add(1); // its objects are gone: refused by id_of from here on
}

result<int> link::connection(std::uint64_t gen) {
  auto& c = t_conns.by_link[this];
  if (c.fd >= 0 && c.gen == gen)
    return c.fd;
  if (c.fd >= 0) {
    ::close(c.fd);
    c.fd = -1;
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return fail(errc::io, "device agent of ", device_label(device_), ": socketpair: ", std::strerror(errno));
  std::lock_guard lock{m_};
  if (control_ < 0 || generation_.load() != gen) {
    ::close(sv[0]);
    ::close(sv[1]);
    return fail(errc::device, "the device agent of ", device_label(device_), " ended", last_end_.empty() ? "" : ": ", last_end_);
  }
  const bool sent = w::send_fd(control_, sv[1]);
  ::close(sv[1]);
  if (!sent) {
    ::close(sv[0]);
    ended_locked("its control socket closed");
    return fail(errc::device, "the device agent of ", device_label(device_), " ended (its control socket closed)");
  }
  c.fd = sv[0];
  c.gen = gen;
  return c.fd;
}

result<w::in> link::call(w::op what, const std::function<void(w::out&)>& args) {
  auto gen = ensure();
  if (!gen)
    return gen.error();
  auto fd = connection(*gen);
  if (!fd)
    return fd.error();
  w::out f;
  f.put(what);
  {
    // Only ids of this agent's: those of an agent that ended went with it.
    std::lock_guard lock{free_m_};
    const bool current = generation_.load() == *gen;
    f.put<std::uint64_t>(current ? to_free_.size() : 0);
    if (current)
      for (auto id : to_free_)
        f.put(id);
    to_free_.clear();
  }
  if (args)
    args(f);
  std::string reply;
  // A reply waited for with a deadline: an agent stuck in the device (behind a kernel that never
  // ends, past every deadline of its own) is ended, not waited for for ever.
  auto replied = [&] {
    pollfd p{*fd, POLLIN, 0};
    int n = 0;
    do
      n = ::poll(&p, 1, reply_deadline_ms);
    while (n < 0 && errno == EINTR);
    return n > 0 && w::recv_frame(*fd, reply);
  };
  if (!w::send_frame(*fd, f) || !replied()) {
    // The agent ended (a device fault ends its context, and it exits), or is stuck: its objects with it.
    std::lock_guard lock{m_};
    if (generation_.load() == *gen)
      ended_locked("it ended or stopped answering during a request");
    return fail(errc::device, "the device agent of ", device_label(device_), " ended or stopped answering during a request");
  }
  w::in r{std::move(reply)};
  r.generation = *gen;
  if (r.get<std::uint8_t>() != 1) {
    const auto code = r.get<std::uint8_t>();
    auto message = r.text();
    if (r.broken())
      return fail(errc::protocol, device_label(device_), "'s device agent sent a short reply");
    return fail(static_cast<errc>(code), message);
  }
  return r;
}

link* route(int device) noexcept {
  auto& r = reg();
  std::lock_guard lock{r.m};
  auto it = r.links.find(device);
  return it == r.links.end() ? nullptr : it->second;
}

link* route(const device_bytes& b) noexcept {
  const auto* r = dynamic_cast<const remote_bytes*>(&b);
  return r == nullptr ? nullptr : r->owner();
}

namespace {

void put_one(w::out& f, std::string_view s) { f.text(s); }
void put_one(w::out& f, const w::raw& r) { f.append(r.fields); }
template <class T>
void put_one(w::out& f, const T& v) {
  f.put(v);
}

// A request: the ids of `objects` where its op takes a list (count first; each the agent's, or an
// error before anything is sent), then `args` in order.
template <class... A>
result<w::in> ask(link& l, w::op what, const std::vector<const device_bytes*>& objects, const A&... args) {
  auto ids = ids_of(l, objects);
  if (!ids)
    return ids.error();
  return l.call(what, [&](w::out& f) {
    if (w::takes_list(what))
      put_ids(f, *ids);
    (put_one(f, args), ...);
  });
}

template <class... A>
result<std::shared_ptr<device_bytes>> ask_object(link& l, w::op what, const std::vector<const device_bytes*>& objects,
                                                 const A&... args) {
  auto r = ask(l, what, objects, args...);
  if (!r)
    return r.error();
  return read_bytes(l, *r);
}

template <class... A>
result<void> ask_done(link& l, w::op what, const std::vector<const device_bytes*>& objects, const A&... args) {
  auto r = ask(l, what, objects, args...);
  if (!r)
    return r.error();
  return {};
}

} // namespace

result<std::shared_ptr<device_bytes>> map_exported(link& l, int device, std::string_view handle_hex, std::uint64_t offset,
                                                   std::uint64_t bytes, std::uint64_t align) {
  return ask_object(l, w::op::map_exported, {}, std::int32_t{device}, handle_hex, offset, bytes, align);
}

result<std::shared_ptr<device_bytes>> map_allocation(link& l, int device, std::string_view handle_hex) {
  return ask_object(l, w::op::map_allocation, {}, std::int32_t{device}, handle_hex);
}

result<std::shared_ptr<device_bytes>> subspan(link& l, const device_bytes& parent, std::uint64_t offset, std::uint64_t bytes,
                                              std::uint64_t align) {
  auto id = id_of(l, &parent);
  if (!id)
    return id.error();
  return ask_object(l, w::op::subspan, {}, *id, offset, bytes, align);
}

result<std::shared_ptr<device_bytes>> allocate_owned(link& l, int device, std::uint64_t bytes) {
  return ask_object(l, w::op::allocate_owned, {}, std::int32_t{device}, bytes);
}

result<void> upload(link& l, const device_bytes& dst, const std::byte* src, std::uint64_t bytes) {
  auto id = id_of(l, &dst);
  if (!id)
    return id.error();
  return ask_done(l, w::op::upload, {}, *id, std::string_view{reinterpret_cast<const char*>(src), bytes});
}

result<void> copy_all(link& l, const std::vector<device_copy>& copies) { return ask_done(l, w::op::copy_all, flat(copies)); }

result<void> fill_all(link& l, const std::vector<const device_bytes*>& spans, unsigned char value) {
  return ask_done(l, w::op::fill_all, spans, value);
}

result<double> fastest_fill_ms(link& l, int device, std::uint64_t bytes) {
  auto r = ask(l, w::op::fastest_fill_ms, {}, std::int32_t{device}, bytes);
  if (!r)
    return r.error();
  return r->get<double>();
}

result<void> flush_device_cache(link& l, int device, std::uint64_t bytes) {
  return ask_done(l, w::op::flush_cache, {}, std::int32_t{device}, bytes);
}

result<std::unique_ptr<device_clock>> make_device_clock(link& l, int device, clock_close close) {
  auto r = ask(l, w::op::clock_make, {}, std::int32_t{device}, static_cast<std::int32_t>(close));
  if (!r)
    return r.error();
  const auto id = r->get<std::uint64_t>();
  return std::unique_ptr<device_clock>{std::make_unique<remote_clock>(&l, id, r->generation)};
}

result<std::shared_ptr<device_bytes>> copy_to_owned(link& l, const device_bytes& src) {
  auto id = id_of(l, &src);
  if (!id)
    return id.error();
  return ask_object(l, w::op::copy_to_owned, {}, *id);
}

result<std::vector<std::shared_ptr<device_bytes>>> copy_all_to_owned(link& l, const std::vector<const device_bytes*>& srcs) {
  auto r = ask(l, w::op::copy_all_to_owned, srcs);
  if (!r)
    return r.error();
  return read_list(l, *r);
}

result<std::vector<std::byte>> download(link& l, const device_bytes& src) {
  auto id = id_of(l, &src);
  if (!id)
    return id.error();
  auto r = ask(l, w::op::download, {}, *id);
  if (!r)
    return r.error();
  const auto s = r->text();
  if (r->broken())
    return fail(errc::protocol, device_label(l.device()), "'s device agent sent a short reply");
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

result<std::vector<device_difference>> compare_all(link& l, const std::vector<device_comparison>& pairs, bool compare) {
  std::vector<const device_bytes*> list;
  for (const auto& p : pairs) {
    list.push_back(p.want);
    if (compare)
      list.push_back(p.got);
  }
  w::out fields;
  for (const auto& p : pairs) {
    fields.put(p.type);
    fields.put(p.n);
    fields.put(p.tol);
    fields.put(p.slack);
  }
  auto r = ask(l, compare ? w::op::compare_all : w::op::scale, list, w::raw{fields.data()});
  if (!r)
    return r.error();
  std::vector<device_difference> out(pairs.size());
  for (auto& d : out)
    d = r->get<device_difference>();
  if (r->broken())
    return fail(errc::protocol, device_label(l.device()), "'s device agent sent a short reply");
  return out;
}

result<void> keep_freed_memory(link& l, int device, std::uint64_t bytes) {
  return ask_done(l, w::op::keep_freed, {}, std::int32_t{device}, bytes);
}

result<void> release_freed_memory(link& l, int device) { return ask_done(l, w::op::release_freed, {}, std::int32_t{device}); }

result<std::string> device_name(link& l, int device) {
  auto r = ask(l, w::op::device_name, {}, std::int32_t{device});
  if (!r)
    return r.error();
  return r->text();
}

void add_times(device_bytes_times& into) noexcept {
  std::vector<link*> links;
  {
    auto& r = reg();
    std::lock_guard lock{r.m};
    for (auto& [d, l] : r.links)
      links.push_back(l);
  }
  for (auto* l : links) {
    try {
      if (l->pid() == 0)
        continue;
      auto r = l->call(w::op::times, {});
      if (!r)
        continue;
      const auto t = r->get<device_bytes_times>();
      into.open_ns += t.open_ns;
      into.opens += t.opens;
      into.close_ns += t.close_ns;
      into.closes += t.closes;
      into.alloc_ns += t.alloc_ns;
      into.allocs += t.allocs;
      into.copy_ns += t.copy_ns;
      into.copies += t.copies;
      into.compare_ns += t.compare_ns;
      into.compares += t.compares;
    } catch (...) {
    }
  }
}

} // namespace agent

result<std::string> find_device_agent() {
  std::vector<fs::path> tried;
  std::error_code ec;
  const auto self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec)
    tried.push_back(self.parent_path() / "crucible-device");
#ifdef CRUCIBLE_DEVICE_AGENT
  tried.emplace_back(CRUCIBLE_DEVICE_AGENT);
#endif
  if (const char* env = std::getenv("CRUCIBLE_DEVICE_AGENT"); env != nullptr && *env != '\0')
    tried.insert(tried.begin(), fs::path{env});
  std::string list;
  for (const auto& p : tried) {
    if (::access(p.c_str(), X_OK) == 0)
      return p.string();
    list += (list.empty() ? "" : ", ") + p.string();
  }
  return fail(errc::not_found, "the device agent (crucible-device) was not found: tried ", list.empty() ? "nothing" : list);
}

result<void> start_device_agent(int device, const device_agent_spec& spec) {
  agent::link* l = nullptr;
  {
    auto& r = agent::reg();
    std::lock_guard lock{r.m};
    auto& slot = r.links[device];
    if (slot == nullptr)
      slot = new agent::link(device, spec);
    l = slot;
  }
  auto started = l->ensure();
  if (!started) {
    auto& r = agent::reg();
    std::lock_guard lock{r.m};
    // The device's functions stay in this process. The link is not freed: a thread that routed to
    // it meanwhile may still be in it.
    r.links.erase(device);
    return started.error();
  }
  return {};
}

bool device_agent_running(int device) { return agent::route(device) != nullptr; }

pid_t device_agent_pid(int device) {
  auto* l = agent::route(device);
  return l == nullptr ? 0 : l->pid();
}

bool device_agent_alive(int device) {
  auto* l = agent::route(device);
  if (l == nullptr)
    return true;
  if (l->pid() == 0)
    return false;
  return l->call(agent_wire::op::probe, {}).ok();
}

std::uint64_t device_agent_generation(int device) {
  auto* l = agent::route(device);
  return l == nullptr ? 0 : l->generation();
}

void set_device_agent_restart_hook(std::function<void(int device)> hook) { agent::link::set_restart_hook(std::move(hook)); }

result<void> restart_device_agent(int device) {
  auto* l = agent::route(device);
  if (l == nullptr || device_agent_alive(device))
    return {};
  auto started = l->ensure();
  if (!started)
    return started.error();
  return {};
}

void end_device_agents() {
  std::vector<agent::link*> links;
  {
    auto& r = agent::reg();
    std::lock_guard lock{r.m};
    for (auto& [d, l] : r.links)
      links.push_back(l);
  }
  for (auto* l : links)
    l->end("this process ended it");
}

void run_on_lasting_thread(const std::function<void()>& job) { agent::launch_on_lasting_thread(job); }

} // namespace crucible::env
