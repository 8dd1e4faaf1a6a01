// env/eval/device/device_agent_wire.hpp: the frames between the evaluator and its device agent
// (env/eval/device/device_agent.hpp): each request and reply one length-prefixed frame on a stream socket,
// its fields written in order in this machine's byte order (both ends are the same build).
// Internal to env/.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

namespace crucible::env::agent_wire {

/// What a request asks of the agent. A request's frame: op, the ids of objects the evaluator has
/// let go since its last request (freed first), then op's arguments.
enum class op : std::uint32_t {
  map_exported = 1,
  map_allocation,
  subspan,
  allocate_owned,
  upload,
  copy_all,
  fill_all,
  fastest_fill_ms,
  flush_cache,
  clock_make,
  clock_arm,
  clock_close,
  clock_let_go,
  clock_finish,
  copy_to_owned,
  copy_all_to_owned,
  download,
  compare,
  scale,
  compare_all,
  keep_freed,
  release_freed,
  device_name,
  times,
  free_only,
  probe,
};

/// Whether a request of `what` starts with a list of objects (its count, then their ids).
inline bool takes_list(op what) noexcept {
  return what == op::copy_all || what == op::fill_all || what == op::copy_all_to_owned || what == op::compare_all
         || what == op::scale;
}

/// Fields already written (another frame's), to be appended as they are.
struct raw {
  const std::string& fields;
};

/// A frame being written.
class out {
public:
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    buf_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void text(std::string_view s) {
    put<std::uint64_t>(s.size());
    buf_.append(s.data(), s.size());
  }
  void bytes(const void* p, std::uint64_t n) {
    put<std::uint64_t>(n);
    buf_.append(static_cast<const char*>(p), n);
  }
  /// Another frame's fields, appended as they are.
  void append(const std::string& fields) { buf_.append(fields); }
  const std::string& data() const noexcept { return buf_; }

private:
  std::string buf_;
};

/// A frame being read: a read past its end leaves zeros and marks it broken.
class in {
public:
  explicit in(std::string frame) : buf_(std::move(frame)) {}
  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v{};
    if (pos_ + sizeof v > buf_.size()) {
      broken_ = true;
      pos_ = buf_.size();
      return v;
    }
    std::memcpy(&v, buf_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::string text() {
    const auto n = get<std::uint64_t>();
    if (broken_ || n > buf_.size() - pos_) {
      broken_ = true;
      return {};
    }
    std::string s = buf_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  bool broken() const noexcept { return broken_; }
  bool done() const noexcept { return pos_ == buf_.size(); }

  /// On the evaluator's side, which start of the agent sent this reply (its objects belong to it).
  std::uint64_t generation = 0;

private:
  std::string buf_;
  std::size_t pos_ = 0;
  bool broken_ = false;
};

inline bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const auto w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

inline bool read_all(int fd, char* p, std::size_t n) {
  while (n > 0) {
    const auto r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

/// Frames larger than this are refused by the reader (an upload or download of a task's output is
/// far smaller; a length past it is a broken stream).
inline constexpr std::uint64_t max_frame = 16ull << 30;

inline bool send_frame(int fd, const out& f) {
  const std::uint64_t n = f.data().size();
  return write_all(fd, reinterpret_cast<const char*>(&n), sizeof n) && write_all(fd, f.data().data(), n);
}

/// The next frame, or false at the end of the stream or a broken one.
inline bool recv_frame(int fd, std::string& frame) {
  std::uint64_t n = 0;
  if (!read_all(fd, reinterpret_cast<char*>(&n), sizeof n) || n > max_frame)
    return false;
  frame.resize(n);
  return read_all(fd, frame.data(), n);
}

// One byte and room for one descriptor: the message send_fd and recv_fd exchange.
struct fd_message {
  char byte = 'c';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))]{};
  msghdr msg{};
  fd_message() {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  fd_message(const fd_message&) = delete;
  fd_message& operator=(const fd_message&) = delete;
};

/// Sends `fd` over the Unix socket `sock` (SCM_RIGHTS): a new connection for the agent to serve.
inline bool send_fd(int sock, int fd) {
  fd_message m;
  cmsghdr* c = CMSG_FIRSTHDR(&m.msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  for (;;) {
    const auto r = ::sendmsg(sock, &m.msg, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR)
      continue;
    return r == 1;
  }
}

/// The descriptor sent by send_fd, -1 at the end of the stream.
inline int recv_fd(int sock) {
  fd_message m;
  for (;;) {
    const auto r = ::recvmsg(sock, &m.msg, MSG_CMSG_CLOEXEC);
    if (r < 0 && errno == EINTR)
      continue;
    if (r != 1)
      return -1;
    break;
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&m.msg); c != nullptr; c = CMSG_NXTHDR(&m.msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
      return fd;
    }
  return -1;
}

} // namespace crucible::env::agent_wire
