// tools/bench/mps_probe.cu: whether a clock process's pending stream wait slows another MPS client's
// short kernels (docs/PERFORMANCE.md, "The device agent under MPS (issue 85, third measurement)":
// under MPS one of a verdict's two workers gains 2-16 µs a call on short kernels, alternating by
// verdict). tools/bench/mps_probe.sh runs it. One JSON object a line on stdout, a human line on
// stderr a run.
//
//   mps_probe run [--mode wait|host|event|spin|copy] [--calls 100] [--elems 65536] [--samples 40]
//                 [--warmup 3] [--pairs 8] [--clock-streams-per-sample] [--worker-connections N]
//                 [--worker-skip-streams 0] [--start-order ab|ba] [--timeout 5] [--device 0]
//                 [--per-call | --copy-out] [--label TEXT]
//
// The driver (`run`, no CUDA of its own) starts one clock process, kept for the whole run like the
// evaluator's device agent, and for each pair two fresh workers A and B, like a verdict's reference
// and candidate workers: this program again (fork + exec), one line at a time over a socket pair.
// A sample, as crucible's device clock takes it (env/eval/device/device_clock.cu, cuda_clock): the
// clock queues a one-block hold kernel spinning on a host-mapped flag, a start kernel
// (%globaltimer), cuStreamWriteValue32(go, seq) on the worker's go word (its device memory, opened
// by cudaIpcOpenMemHandle); the worker, while the clock is held, queues cuStreamWaitValue32(go >=
// seq), a stamp kernel, --calls launches of an elementwise kernel over --elems floats, a stamp
// kernel, then writes seq to its done word and to a shared host word (a /dev/shm page,
// cudaHostRegister'ed) and records an interprocess event; the clock queues its close (--mode) and
// a stop kernel, and only then releases the hold. Close modes: wait = cuStreamWaitValue32(done >=
// seq) (crucible's: an acquire pending in the server all through the worker's calls); host =
// nothing pending: the clock's host spins on the shared word, then launches the stop kernel; event
// = cudaStreamWaitEvent on the worker's event; spin = a one-block kernel spinning on the done word;
// copy = nothing pending: the clock's host reads the done word with 4-byte copies on a second stream
// (crucible's evaluator.cuda_clock_poll), then launches the stop kernel.
// --per-call: each call its own handshake, as a candidate that hands back one output buffer call
// after call needs (each call's output copied out before the next call may overwrite it): the
// worker's stream waits for go to reach the call's number before each call and writes done (and the
// host word) after it; the clock, after seeing done reach a call's number (by the mode's means),
// copies the worker's buffer (--elems floats, opened by IPC) into its own memory and only then
// writes go for the next call: the next call's start depends on the clock's copy, as the next call's
// inputs copied in after the last call's outputs were out would make it. --copy-out: one handshake
// a sample as without flags, then the same --calls copies of that buffer after done (the bytes the
// per-call copies move, the batch's way): the two side by side say what the handshakes cost a call.
// The window (stop - start) over --calls is the clock's time a call; the worker's stamps give its
// own view. Samples alternate A, B, A, B. --clock-streams-per-sample: a fresh clock stream each
// sample; --worker-skip-streams N: each worker makes N streams before its own (both: hypothesis B,
// the hardware queue a stream lands on); --worker-connections N: CUDA_DEVICE_MAX_CONNECTIONS for
// the workers; --start-order ba: B started first (is the slower one the one started first?).
//
// Output: a line a pair (medians a call: "a_us_per_call", "b_us_per_call", "ratio_b_over_a",
// "a_worker_view_us", "b_worker_view_us", "view_ratio_b_over_a"; pids; every sample's window and
// view in µs), then a {"summary":true,...} line. A failure names the CUDA call or the silent peer,
// kills every child (each also dies with the driver: PR_SET_PDEATHSIG) and exits 1; the hold
// kernel gives up by itself after --timeout seconds.
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

const char* role_name = "driver"; // this process's role, for messages; set once in main

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "mps_probe %s (pid %d): %s\n", role_name, static_cast<int>(getpid()), what.c_str());
  std::exit(1);
}

#define CRUCIBLE_CHECK_CUDA(call) check_cuda((call), #call, __FILE__, __LINE__)
void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess)
    die(std::string(what) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ") at " + file + ":"
        + std::to_string(line));
}
// A call that only one mode needs: its failure is reported, and that mode alone cannot run.
#define CRUCIBLE_TRY_CUDA(call) try_cuda((call), #call)
bool try_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess)
    return true;
  (void) cudaGetLastError();
  std::fprintf(stderr, "mps_probe %s (pid %d): %s failed: %s; the mode that needs it cannot run\n", role_name,
               static_cast<int>(getpid()), what, cudaGetErrorName(e));
  return false;
}
#define CRUCIBLE_CHECK_CU(call) check_cu((call), #call, __FILE__, __LINE__)
void check_cu(CUresult r, const char* what, const char* file, int line) {
  if (r != CUDA_SUCCESS)
    die(std::string(what) + " failed: CUresult " + std::to_string(static_cast<int>(r)) + " at " + file + ":"
        + std::to_string(line));
}

// The driver's stream memory operations, found through the runtime as
// env/eval/device/device_clock.cu does (no -lcuda).
using stream_value_fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
struct stream_value_ops {
  stream_value_fn write = nullptr;
  stream_value_fn wait = nullptr;
};
stream_value_ops load_stream_value_ops() {
  auto entry = [](const char* name) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CRUCIBLE_CHECK_CUDA(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || fn == nullptr)
      die(std::string("the CUDA driver has no ") + name);
    return reinterpret_cast<stream_value_fn>(fn);
  };
  return {entry("cuStreamWriteValue32"), entry("cuStreamWaitValue32")};
}
CUdeviceptr dev_addr(const void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)); }

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Spins until *word >= value, or deadline_ns after it started: a lost release never holds the GPU.
__global__ void spin_kernel(const volatile unsigned* word, unsigned value, unsigned long long deadline_ns) {
  const unsigned long long t0 = global_ns();
  while (*word < value && global_ns() - t0 < deadline_ns)
    __nanosleep(256);
}
__global__ void stamp_kernel(volatile unsigned long long* at) { *at = global_ns(); }
__global__ void task_kernel(float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    x[i] = x[i] * 0.5f + 1.0f;
}

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// Waits for a stream with a deadline (a stuck semaphore would otherwise block for ever).
void sync_within(cudaStream_t s, double timeout_s, const char* what) {
  const auto t0 = clock_type::now();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess)
      return;
    if (e != cudaErrorNotReady)
      check_cuda(e, what, __FILE__, __LINE__);
    if (seconds_since(t0) > timeout_s)
      die(std::string(what) + ": not finished within " + std::to_string(static_cast<int>(timeout_s)) + " s");
    usleep(20);
  }
}

// One page of /dev/shm (tmpfs, so cudaHostRegister can pin it), mapped shared.
constexpr size_t page = 4096;
unsigned* map_shm(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR);
  if (fd < 0)
    die("open " + path + ": " + std::strerror(errno));
  void* p = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED)
    die("mmap " + path + ": " + std::strerror(errno));
  return static_cast<unsigned*>(p);
}

std::string to_hex(const void* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    const auto b = static_cast<const unsigned char*>(p)[i];
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}
void from_hex(const std::string& s, void* p, size_t n) {
  if (s.size() != 2 * n)
    die("a handle of " + std::to_string(s.size()) + " hex digits, not " + std::to_string(2 * n));
  for (size_t i = 0; i < n; ++i)
    static_cast<unsigned char*>(p)[i] = static_cast<unsigned char>(std::stoul(s.substr(2 * i, 2), nullptr, 16));
}
std::vector<std::string> words_of(const std::string& line) {
  std::vector<std::string> w;
  size_t i = 0;
  while ((i = line.find_first_not_of(' ', i)) != std::string::npos) {
    const size_t j = std::min(line.find(' ', i), line.size());
    w.push_back(line.substr(i, j - i));
    i = j;
  }
  return w;
}

// One line at a time over a socket; the peer's end of stream or a deadline ends a receive.
class line_channel final {
public:
  explicit line_channel(int fd = -1) : fd_{fd} {}
  void send(const std::string& line) const {
    const std::string s = line + "\n";
    for (size_t off = 0; off < s.size();) {
      const ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0)
        die(std::string("cannot send to a peer: ") + std::strerror(errno));
      off += static_cast<size_t>(n);
    }
  }
  enum class got { line, timeout, closed };
  // The next line, or the peer's end, or nothing within timeout_s (< 0: no deadline).
  got receive(std::string& line, double timeout_s) {
    const auto t0 = clock_type::now();
    for (;;) {
      if (const size_t nl = buf_.find('\n'); nl != std::string::npos) {
        line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return got::line;
      }
      int wait_ms = -1;
      if (timeout_s >= 0) {
        wait_ms = static_cast<int>((timeout_s - seconds_since(t0)) * 1000.0);
        if (wait_ms <= 0)
          return got::timeout;
      }
      pollfd p{fd_, POLLIN, 0};
      const int r = poll(&p, 1, wait_ms);
      if (r < 0 && errno == EINTR)
        continue;
      if (r == 0)
        return got::timeout;
      if (r < 0)
        die(std::string("poll: ") + std::strerror(errno));
      char b[4096];
      const ssize_t n = read(fd_, b, sizeof b);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        return got::closed;
      buf_.append(b, static_cast<size_t>(n));
    }
  }

  void close_fd() { ::close(fd_); }

private:
  int fd_;
  std::string buf_;
};

// `--key value` options and bare flags, checked where read (errors name the key).
struct options {
  std::map<std::string, std::string> values;
  long integer(const char* key, long def, long lo, long hi) const {
    const auto it = values.find(key);
    if (it == values.end())
      return def;
    char* end = nullptr;
    const long v = std::strtol(it->second.c_str(), &end, 10);
    if (it->second.empty() || *end != '\0' || v < lo || v > hi)
      die(std::string("--") + key + " " + it->second + ": not an integer in [" + std::to_string(lo) + ", "
          + std::to_string(hi) + "]");
    return v;
  }
  std::string text(const char* key, const std::string& def) const {
    const auto it = values.find(key);
    return it == values.end() ? def : it->second;
  }
  bool flag(const char* key) const { return values.count(key) != 0; }
};
options parse_options(int argc, char** argv) {
  const std::string bare = " clock-streams-per-sample fresh-stream per-call copy-out ";
  const std::string valued = " mode calls elems samples warmup pairs worker-connections worker-skip-streams start-order"
                             " timeout device label fd shm ";
  options o;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i], k = arg.substr(std::min<size_t>(2, arg.size()));
    const bool is_bare = bare.find(" " + k + " ") != std::string::npos;
    if (arg.rfind("--", 0) != 0 || (!is_bare && valued.find(" " + k + " ") == std::string::npos))
      die("unknown argument " + arg + " (--help)");
    if (is_bare)
      o.values[k] = "1";
    else if (i + 1 < argc)
      o.values[k] = argv[++i];
    else
      die("--" + k + " needs a value");
  }
  return o;
}

// ---- the worker: a verdict's reference or candidate process ----
int worker_main(const options& o) {
  line_channel peer(static_cast<int>(o.integer("fd", -1, 0, 1 << 20)));
  const int calls = static_cast<int>(o.integer("calls", 100, 1, 1 << 20));
  const int elems = static_cast<int>(o.integer("elems", 1 << 16, 1, 1 << 30));
  const double timeout_s = static_cast<double>(o.integer("timeout", 5, 1, 600));
  const int device = static_cast<int>(o.integer("device", 0, 0, 63));
  CRUCIBLE_CHECK_CUDA(cudaSetDevice(device));
  const auto ops = load_stream_value_ops();
  // go at byte 0, done at byte 128 of one exported allocation.
  char* words = nullptr;
  CRUCIBLE_CHECK_CUDA(cudaMalloc(&words, page));
  CRUCIBLE_CHECK_CUDA(cudaMemset(words, 0, page));
  cudaIpcMemHandle_t mem_handle;
  CRUCIBLE_CHECK_CUDA(cudaIpcGetMemHandle(&mem_handle, words));
  float* x = nullptr;
  CRUCIBLE_CHECK_CUDA(cudaMalloc(&x, sizeof(float) * static_cast<size_t>(elems)));
  CRUCIBLE_CHECK_CUDA(cudaMemset(x, 0, sizeof(float) * static_cast<size_t>(elems)));
  cudaIpcMemHandle_t x_handle; // the buffer the calls write, which the clock copies out (--per-call, --copy-out)
  CRUCIBLE_CHECK_CUDA(cudaIpcGetMemHandle(&x_handle, x));
  const bool per_call = o.flag("per-call");
  // The interprocess event (--mode event) and the registered host word (--mode host).
  cudaEvent_t event = nullptr;
  cudaIpcEventHandle_t event_handle{};
  const bool has_event =
    CRUCIBLE_TRY_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventInterprocess))
    && CRUCIBLE_TRY_CUDA(cudaIpcGetEventHandle(&event_handle, event));
  unsigned* host_word = map_shm(o.text("shm", ""));
  void* host_word_dev = nullptr;
  const bool has_host_word = CRUCIBLE_TRY_CUDA(cudaHostRegister(host_word, page, cudaHostRegisterMapped))
                             && CRUCIBLE_TRY_CUDA(cudaHostGetDevicePointer(&host_word_dev, host_word, 0));
  unsigned long long* stamps_dev = nullptr; // in device memory, as crucible's clock keeps its times
  CRUCIBLE_CHECK_CUDA(cudaMalloc(&stamps_dev, 2 * sizeof(unsigned long long)));
  std::vector<cudaStream_t> skipped(static_cast<size_t>(o.integer("worker-skip-streams", 0, 0, 256)));
  for (auto& s : skipped)
    CRUCIBLE_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaStream_t stream = nullptr;
  CRUCIBLE_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int blocks = (elems + 255) / 256;
  // The modules loaded and the kernels run once outside the samples.
  task_kernel<<<blocks, 256, 0, stream>>>(x, elems);
  stamp_kernel<<<1, 1, 0, stream>>>(stamps_dev);
  CRUCIBLE_CHECK_CUDA(cudaGetLastError());
  CRUCIBLE_CHECK_CUDA(cudaStreamSynchronize(stream));
  peer.send("ready " + to_hex(&mem_handle, sizeof mem_handle) + " "
            + (has_event ? to_hex(&event_handle, sizeof event_handle) : "none") + (has_host_word ? " host" : " none") + " "
            + to_hex(&x_handle, sizeof x_handle));
  std::string line;
  while (peer.receive(line, -1) == line_channel::got::line) {
    const auto w = words_of(line);
    if (w.size() == 1 && w[0] == "quit")
      break;
    if (w.size() != 2)
      die("unknown command '" + line + "'");
    const auto seq = static_cast<cuuint32_t>(std::stoul(w[1]));
    if (w[0] == "queue" && per_call) {
      // Call i (1-based) of sample seq is number (seq - 1) * calls + i on both words.
      const auto base = static_cast<cuuint32_t>((seq - 1) * static_cast<cuuint32_t>(calls));
      for (int i = 1; i <= calls; ++i) {
        CRUCIBLE_CHECK_CU(ops.wait(reinterpret_cast<CUstream>(stream), dev_addr(words), base + i, CU_STREAM_WAIT_VALUE_GEQ));
        if (i == 1)
          stamp_kernel<<<1, 1, 0, stream>>>(stamps_dev);
        task_kernel<<<blocks, 256, 0, stream>>>(x, elems);
        CRUCIBLE_CHECK_CU(ops.write(reinterpret_cast<CUstream>(stream), dev_addr(words + 128), base + i, 0));
        if (has_host_word)
          CRUCIBLE_CHECK_CU(ops.write(reinterpret_cast<CUstream>(stream), dev_addr(host_word_dev), base + i, 0));
      }
      stamp_kernel<<<1, 1, 0, stream>>>(stamps_dev + 1);
      CRUCIBLE_CHECK_CUDA(cudaGetLastError());
      peer.send("queued");
    } else if (w[0] == "queue") {
      CRUCIBLE_CHECK_CU(ops.wait(reinterpret_cast<CUstream>(stream), dev_addr(words), seq, CU_STREAM_WAIT_VALUE_GEQ));
      stamp_kernel<<<1, 1, 0, stream>>>(stamps_dev);
      for (int i = 0; i < calls; ++i)
        task_kernel<<<blocks, 256, 0, stream>>>(x, elems);
      stamp_kernel<<<1, 1, 0, stream>>>(stamps_dev + 1);
      CRUCIBLE_CHECK_CUDA(cudaGetLastError());
      // The same three signals in every mode: the worker's stream does not depend on the mode.
      CRUCIBLE_CHECK_CU(ops.write(reinterpret_cast<CUstream>(stream), dev_addr(words + 128), seq, 0));
      if (has_host_word)
        CRUCIBLE_CHECK_CU(ops.write(reinterpret_cast<CUstream>(stream), dev_addr(host_word_dev), seq, 0));
      if (has_event)
        CRUCIBLE_CHECK_CUDA(cudaEventRecord(event, stream));
      peer.send("queued");
    } else if (w[0] == "result") {
      sync_within(stream, timeout_s, "the worker's stream");
      unsigned long long st[2];
      CRUCIBLE_CHECK_CUDA(cudaMemcpy(st, stamps_dev, sizeof st, cudaMemcpyDeviceToHost));
      peer.send("view " + std::to_string(st[1] - st[0]));
    } else {
      die("unknown command '" + line + "'");
    }
  }
  CRUCIBLE_CHECK_CUDA(cudaStreamSynchronize(stream));
  if (has_host_word)
    CRUCIBLE_CHECK_CUDA(cudaHostUnregister(host_word));
  return 0;
}

// ---- the clock: the evaluator's device agent ----
struct clock_slot {
  char* words = nullptr;  // the worker's go (byte 0) and done (byte 128) words, opened by IPC
  cudaEvent_t event = nullptr;
  const unsigned* host_word = nullptr;
  float* x = nullptr; // the worker's buffer, opened by IPC
};

int clock_main(const options& o) {
  line_channel peer(static_cast<int>(o.integer("fd", -1, 0, 1 << 20)));
  const std::string mode = o.text("mode", "wait");
  if (mode != "wait" && mode != "host" && mode != "event" && mode != "spin" && mode != "copy")
    die("--mode " + mode + ": not wait, host, event, spin or copy");
  const bool fresh = o.flag("fresh-stream");
  const bool per_call = o.flag("per-call"), copy_out = o.flag("copy-out");
  const int calls = static_cast<int>(o.integer("calls", 100, 1, 1 << 20));
  const size_t x_bytes = sizeof(float) * static_cast<size_t>(o.integer("elems", 1 << 16, 1, 1 << 30));
  if (per_call && mode == "event")
    die("--per-call with --mode event: an event a call is not written");
  const double timeout_s = static_cast<double>(o.integer("timeout", 5, 1, 600));
  const auto deadline_ns = static_cast<unsigned long long>(timeout_s * 1e9);
  const int device = static_cast<int>(o.integer("device", 0, 0, 63));
  CRUCIBLE_CHECK_CUDA(cudaSetDevice(device));
  const auto ops = load_stream_value_ops();
  unsigned* flag = nullptr; // the hold's flag: pinned host memory the hold kernel reads
  CRUCIBLE_CHECK_CUDA(cudaHostAlloc(&flag, sizeof(unsigned), cudaHostAllocMapped));
  *flag = 0;
  unsigned* flag_dev = nullptr;
  CRUCIBLE_CHECK_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&flag_dev), flag, 0));
  unsigned long long* stamps_dev = nullptr;
  CRUCIBLE_CHECK_CUDA(cudaMalloc(&stamps_dev, 2 * sizeof(unsigned long long)));
  cudaStream_t stream = nullptr;
  if (!fresh)
    CRUCIBLE_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // --mode copy: the done word read by 4-byte copies on a stream of their own (crucible's
  // evaluator.cuda_clock_poll), into pinned memory.
  cudaStream_t side = nullptr;
  unsigned* seen = nullptr;
  CRUCIBLE_CHECK_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  CRUCIBLE_CHECK_CUDA(cudaHostAlloc(&seen, sizeof(unsigned), cudaHostAllocDefault));
  float* kept = nullptr; // this process's copy of the worker's buffer (--per-call, --copy-out)
  if (per_call || copy_out)
    CRUCIBLE_CHECK_CUDA(cudaMalloc(&kept, x_bytes));
  stamp_kernel<<<1, 1>>>(stamps_dev);
  spin_kernel<<<1, 1>>>(flag_dev, 0, 0);
  CRUCIBLE_CHECK_CUDA(cudaGetLastError());
  CRUCIBLE_CHECK_CUDA(cudaDeviceSynchronize());
  peer.send("ready");
  std::array<clock_slot, 2> slots{};
  unsigned generation = 0;
  // A sample's end: its stream waited for, the window (stop - start) sent to the driver.
  auto report_window = [&] {
    sync_within(stream, timeout_s, "the clock's stream");
    unsigned long long st[2];
    CRUCIBLE_CHECK_CUDA(cudaMemcpy(st, stamps_dev, sizeof st, cudaMemcpyDeviceToHost));
    peer.send("window " + std::to_string(st[1] - st[0]));
    if (fresh)
      CRUCIBLE_CHECK_CUDA(cudaStreamDestroy(stream));
  };
  std::string line;
  while (peer.receive(line, -1) == line_channel::got::line) {
    const auto w = words_of(line);
    if (w.size() == 1 && w[0] == "quit")
      break;
    if (w.size() < 2 || (w[1] != "0" && w[1] != "1"))
      die("unknown command '" + line + "'");
    clock_slot& slot = slots[w[1] == "1" ? 1 : 0];
    if (w[0] == "open" && w.size() == 7) { // open K MEM_HANDLE EVENT_HANDLE|none host|none X_HANDLE SHM_PATH
      cudaIpcMemHandle_t mh;
      from_hex(w[2], &mh, sizeof mh);
      CRUCIBLE_CHECK_CUDA(
        cudaIpcOpenMemHandle(reinterpret_cast<void**>(&slot.words), mh, cudaIpcMemLazyEnablePeerAccess));
      if ((mode == "event" && w[3] == "none") || (mode == "host" && w[4] != "host"))
        die("--mode " + mode + " cannot run: the worker could not make what it needs (its message above)");
      if (mode == "event") {
        cudaIpcEventHandle_t eh;
        from_hex(w[3], &eh, sizeof eh);
        CRUCIBLE_CHECK_CUDA(cudaIpcOpenEventHandle(&slot.event, eh));
      }
      if (per_call || copy_out) {
        cudaIpcMemHandle_t xh;
        from_hex(w[5], &xh, sizeof xh);
        CRUCIBLE_CHECK_CUDA(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&slot.x), xh, cudaIpcMemLazyEnablePeerAccess));
      }
      slot.host_word = map_shm(w[6]);
      peer.send("ok");
    } else if (w[0] == "close" && w.size() == 2) {
      CRUCIBLE_CHECK_CUDA(cudaIpcCloseMemHandle(slot.words));
      if (slot.x != nullptr)
        CRUCIBLE_CHECK_CUDA(cudaIpcCloseMemHandle(slot.x));
      if (slot.event != nullptr)
        CRUCIBLE_CHECK_CUDA(cudaEventDestroy(slot.event));
      munmap(const_cast<unsigned*>(slot.host_word), page);
      slot = clock_slot{};
      peer.send("ok");
    } else if (w[0] == "arm" && w.size() == 3) {
      const auto number = static_cast<cuuint32_t>(std::stoul(w[2]));
      // --per-call: go opens the sample's first call, number (seq - 1) * calls + 1.
      const auto seq = per_call ? (number - 1) * static_cast<cuuint32_t>(calls) + 1 : number;
      if (fresh)
        CRUCIBLE_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      ++generation;
      spin_kernel<<<1, 1, 0, stream>>>(flag_dev, generation, deadline_ns);
      stamp_kernel<<<1, 1, 0, stream>>>(stamps_dev);
      CRUCIBLE_CHECK_CUDA(cudaGetLastError());
      CRUCIBLE_CHECK_CU(ops.write(reinterpret_cast<CUstream>(stream), dev_addr(slot.words), seq, 0));
      peer.send("armed");
    } else if (w[0] == "release" && w.size() == 3 && per_call) {
      const auto base = (static_cast<cuuint32_t>(std::stoul(w[2])) - 1) * static_cast<cuuint32_t>(calls);
      const auto stream_u = reinterpret_cast<CUstream>(stream);
      // After call i is seen done: its buffer copied out, then go for call i + 1.
      auto after = [&](int i) {
        CRUCIBLE_CHECK_CUDA(cudaMemcpyAsync(kept, slot.x, x_bytes, cudaMemcpyDeviceToDevice, stream));
        if (i < calls)
          CRUCIBLE_CHECK_CU(ops.write(stream_u, dev_addr(slot.words), base + i + 1, 0));
      };
      const bool on_device = mode == "wait" || mode == "spin";
      if (on_device) // every call's close queued before the release, as the batch's wait is
        for (int i = 1; i <= calls; ++i) {
          if (mode == "wait")
            CRUCIBLE_CHECK_CU(ops.wait(stream_u, dev_addr(slot.words + 128), base + i, CU_STREAM_WAIT_VALUE_GEQ));
          else
            spin_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<const unsigned*>(slot.words + 128), base + i, deadline_ns);
          after(i);
        }
      const cudaError_t queued = cudaGetLastError();
      __atomic_store_n(flag, generation, __ATOMIC_SEQ_CST);
      CRUCIBLE_CHECK_CUDA(queued);
      const auto t0 = clock_type::now();
      for (int i = 1; i <= calls && !on_device; ++i) { // host and copy: the host sees each call done
        const auto want = base + i;
        for (;;) {
          unsigned now = 0;
          if (mode == "host") {
            now = __atomic_load_n(slot.host_word, __ATOMIC_ACQUIRE);
          } else {
            CRUCIBLE_CHECK_CUDA(cudaMemcpyAsync(seen, slot.words + 128, sizeof(unsigned), cudaMemcpyDeviceToHost, side));
            CRUCIBLE_CHECK_CUDA(cudaStreamSynchronize(side));
            now = *seen;
          }
          if (static_cast<int>(now - want) >= 0)
            break;
          if (seconds_since(t0) > timeout_s)
            die("the worker's call " + std::to_string(i) + " of sample " + w[2] + " was not seen done within "
                + std::to_string(static_cast<int>(timeout_s)) + " s");
        }
        after(i);
      }
      stamp_kernel<<<1, 1, 0, stream>>>(stamps_dev + 1);
      CRUCIBLE_CHECK_CUDA(cudaGetLastError());
      report_window();
    } else if (w[0] == "release" && w.size() == 3) {
      const auto seq = static_cast<cuuint32_t>(std::stoul(w[2]));
      // --copy-out: the calls' copies after the close, as many bytes as --per-call moves.
      auto copies = [&] {
        for (int i = 0; i < calls && copy_out; ++i)
          CRUCIBLE_CHECK_CUDA(cudaMemcpyAsync(kept, slot.x, x_bytes, cudaMemcpyDeviceToDevice, stream));
      };
      // The close is queued before the release, as crucible's close() precedes let_go().
      if (mode == "wait")
        CRUCIBLE_CHECK_CU(
          ops.wait(reinterpret_cast<CUstream>(stream), dev_addr(slot.words + 128), seq, CU_STREAM_WAIT_VALUE_GEQ));
      else if (mode == "event")
        CRUCIBLE_CHECK_CUDA(cudaStreamWaitEvent(stream, slot.event, 0));
      else if (mode == "spin")
        spin_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<const unsigned*>(slot.words + 128), seq, deadline_ns);
      if (mode != "host" && mode != "copy") {
        copies();
        stamp_kernel<<<1, 1, 0, stream>>>(stamps_dev + 1);
      }
      const cudaError_t queued = cudaGetLastError();
      __atomic_store_n(flag, generation, __ATOMIC_SEQ_CST); // released before any check can exit
      CRUCIBLE_CHECK_CUDA(queued);
      if (mode == "host") {
        const auto t0 = clock_type::now();
        while (__atomic_load_n(slot.host_word, __ATOMIC_ACQUIRE) < seq)
          if (seconds_since(t0) > timeout_s)
            die("the worker's host word did not reach " + w[2] + " within "
                + std::to_string(static_cast<int>(timeout_s)) + " s");
        copies();
        stamp_kernel<<<1, 1, 0, stream>>>(stamps_dev + 1);
        CRUCIBLE_CHECK_CUDA(cudaGetLastError());
      }
      if (mode == "copy") {
        const auto t0 = clock_type::now();
        for (;;) {
          CRUCIBLE_CHECK_CUDA(cudaMemcpyAsync(seen, slot.words + 128, sizeof(unsigned), cudaMemcpyDeviceToHost, side));
          CRUCIBLE_CHECK_CUDA(cudaStreamSynchronize(side));
          if (static_cast<int>(*seen - seq) >= 0)
            break;
          if (seconds_since(t0) > timeout_s)
            die("the worker's done word did not reach " + w[2] + " within " + std::to_string(static_cast<int>(timeout_s)) + " s");
        }
        copies();
        stamp_kernel<<<1, 1, 0, stream>>>(stamps_dev + 1);
        CRUCIBLE_CHECK_CUDA(cudaGetLastError());
      }
      report_window();
    } else {
      die("unknown command '" + line + "'");
    }
  }
  return 0;
}

// ---- the driver ----
// The driver's children and shared pages, for the exit and signal handlers (which take no
// arguments: the one piece of global state of the driver).
std::vector<pid_t> live_children;
std::vector<std::string> live_pages;
void kill_all() {
  for (const pid_t pid : live_children)
    kill(pid, SIGKILL);
  for (const auto& p : live_pages)
    unlink(p.c_str());
}
void on_signal(int sig) {
  kill_all();
  signal(sig, SIG_DFL);
  raise(sig);
}
void forget(pid_t pid) {
  live_children.erase(std::remove(live_children.begin(), live_children.end(), pid), live_children.end());
}

struct child {
  std::string name;
  pid_t pid = -1;
  line_channel peer;
};

// Starts this program as `role` (clock or worker), called `name` in messages.
child spawn(const std::string& role, const std::string& name, std::vector<std::string> args, int connections) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    die(std::string("socketpair: ") + std::strerror(errno));
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0)
    die(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(1);
    const int fd = dup(sv[1]); // without FD_CLOEXEC: the one descriptor the child keeps
    dup2(2, 1);                // stdout is the driver's JSON: children write to stderr alone
    if (connections > 0)
      setenv("CUDA_DEVICE_MAX_CONNECTIONS", std::to_string(connections).c_str(), 1);
    args.insert(args.begin(), {"mps_probe", role, "--fd", std::to_string(fd)});
    std::vector<char*> argv;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    std::fprintf(stderr, "mps_probe: execv /proc/self/exe: %s\n", std::strerror(errno));
    _exit(127);
  }
  close(sv[1]);
  live_children.push_back(pid);
  return child{name, pid, line_channel(sv[0])};
}

// The rest of the child's next line after `word`; any other answer, silence past timeout_s or the
// child's end is fatal.
std::string expect(child& c, const std::string& word, double timeout_s) {
  std::string line;
  if (const auto r = c.peer.receive(line, timeout_s); r != line_channel::got::line) {
    std::string why = "no answer within " + std::to_string(static_cast<int>(timeout_s)) + " s";
    int status = 0;
    const auto t0 = clock_type::now(); // a closed socket: its process ends in a moment
    while (r == line_channel::got::closed && seconds_since(t0) < 2.0)
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
        forget(c.pid);
        why = WIFEXITED(status) ? "it exited with status " + std::to_string(WEXITSTATUS(status))
                                : "it was killed by signal " + std::to_string(WTERMSIG(status));
        break;
      } else {
        usleep(1000);
      }
    die(c.name + " (pid " + std::to_string(c.pid) + ") did not answer '" + word + "': " + why);
  }
  if (line.rfind(word, 0) != 0)
    die(c.name + " answered '" + line + "', not '" + word + "'");
  return line.size() > word.size() ? line.substr(word.size() + 1) : "";
}

void finish(child& c, double timeout_s) {
  c.peer.send("quit");
  const auto t0 = clock_type::now();
  while (waitpid(c.pid, nullptr, WNOHANG) != c.pid) {
    if (seconds_since(t0) > timeout_s) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, nullptr, 0);
      break;
    }
    usleep(1000);
  }
  forget(c.pid);
  c.peer.close_fd();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : (v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
}
std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4f", v);
  return b;
}
std::string list(const std::vector<double>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i)
    s += (i ? "," : "") + num(v[i]);
  return s + "]";
}

int run_main(const options& o) {
  const std::string mode = o.text("mode", "wait");
  if (mode != "wait" && mode != "host" && mode != "event" && mode != "spin" && mode != "copy")
    die("--mode " + mode + ": not wait, host, event, spin or copy");
  const long calls = o.integer("calls", 100, 1, 1 << 20), elems = o.integer("elems", 1 << 16, 1, 1 << 30);
  const long samples = o.integer("samples", 40, 1, 100000), warmup = o.integer("warmup", 3, 0, 100000);
  const long pairs = o.integer("pairs", 8, 1, 10000), timeout = o.integer("timeout", 5, 1, 600);
  const long connections = o.integer("worker-connections", 0, 0, 32);
  const long skip = o.integer("worker-skip-streams", 0, 0, 256);
  const long device = o.integer("device", 0, 0, 63);
  const bool fresh = o.flag("clock-streams-per-sample");
  const bool per_call = o.flag("per-call"), copy_out = o.flag("copy-out");
  if (per_call && copy_out)
    die("--per-call and --copy-out: one or the other (--per-call copies out after every call)");
  const std::string order = o.text("start-order", "ab"), label = o.text("label", "");
  if (order != "ab" && order != "ba")
    die("--start-order " + order + ": not ab or ba");
  std::atexit([] {
    kill_all();
    for (const pid_t pid : live_children)
      waitpid(pid, nullptr, 0);
  });
  for (const int sig : {SIGINT, SIGTERM, SIGHUP})
    signal(sig, on_signal);
  const double startup_s = 90.0; // a first MPS client also starts the server
  const std::string common = "{\"label\":\"" + label + "\",\"mode\":\"" + mode + "\",\"fresh_clock_stream\":"
                             + (fresh ? "true" : "false") + ",\"worker_connections\":" + std::to_string(connections)
                             + ",\"worker_skip_streams\":" + std::to_string(skip) + ",\"per_call\":"
                             + (per_call ? "true" : "false") + ",\"copy_out\":" + (copy_out ? "true" : "false") + ",\"start_order\":\"" + order
                             + "\",\"calls\":" + std::to_string(calls) + ",\"elems\":" + std::to_string(elems)
                             + ",\"samples\":" + std::to_string(samples);
  const std::vector<std::string> shared{"--device", std::to_string(device), "--timeout", std::to_string(timeout)};
  std::vector<std::string> clock_args{"--mode", mode, "--calls", std::to_string(calls), "--elems", std::to_string(elems)};
  if (fresh)
    clock_args.push_back("--fresh-stream");
  if (per_call)
    clock_args.push_back("--per-call");
  if (copy_out)
    clock_args.push_back("--copy-out");
  clock_args.insert(clock_args.end(), shared.begin(), shared.end());
  child clock = spawn("clock", "clock", clock_args, 0);
  expect(clock, "ready", startup_s);
  std::vector<double> ratios, view_ratios;
  for (long pair = 0; pair < pairs; ++pair) {
    std::array<child, 2> worker;
    std::array<std::string, 2> page_path, handles;
    for (int n = 0; n < 2; ++n) {
      const int k = order == "ab" ? n : 1 - n;
      page_path[k] = "/dev/shm/mps_probe." + std::to_string(getpid()) + "." + std::to_string(pair) + "."
                     + std::to_string(k);
      const int fd = open(page_path[k].c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
      if (fd < 0 || ftruncate(fd, page) != 0)
        die("cannot make " + page_path[k] + ": " + std::strerror(errno));
      close(fd);
      live_pages.push_back(page_path[k]);
      std::vector<std::string> args{"--shm", page_path[k], "--calls", std::to_string(calls), "--elems",
                                    std::to_string(elems), "--worker-skip-streams", std::to_string(skip)};
      args.insert(args.end(), shared.begin(), shared.end());
      if (per_call)
        args.push_back("--per-call");
      worker[k] = spawn("worker", k == 0 ? "worker A" : "worker B", args, static_cast<int>(connections));
      handles[k] = expect(worker[k], "ready", startup_s); // started one after the other, not together
    }
    for (int k = 0; k < 2; ++k) {
      clock.peer.send("open " + std::to_string(k) + " " + handles[k] + " " + page_path[k]);
      expect(clock, "ok", timeout);
    }
    std::array<std::vector<double>, 2> window_us, view_us;
    std::array<unsigned, 2> seq{0, 0};
    for (long i = 0; i < warmup + samples; ++i)
      for (int k = 0; k < 2; ++k) {
        const std::string s = std::to_string(++seq[k]), kk = std::to_string(k);
        clock.peer.send("arm " + kk + " " + s);
        expect(clock, "armed", timeout);
        worker[k].peer.send("queue " + s);
        expect(worker[k], "queued", timeout);
        clock.peer.send("release " + kk + " " + s);
        const double window_ns = std::stod(expect(clock, "window", 2.0 * timeout));
        worker[k].peer.send("result " + s);
        const double view_ns = std::stod(expect(worker[k], "view", 2.0 * timeout));
        if (i >= warmup) {
          window_us[k].push_back(window_ns / 1e3);
          view_us[k].push_back(view_ns / 1e3);
        }
      }
    for (int k = 0; k < 2; ++k) {
      clock.peer.send("close " + std::to_string(k));
      expect(clock, "ok", timeout);
    }
    const std::array<pid_t, 2> pids{worker[0].pid, worker[1].pid};
    for (auto& w : worker)
      finish(w, timeout);
    for (const auto& p : page_path) {
      unlink(p.c_str());
      live_pages.erase(std::find(live_pages.begin(), live_pages.end(), p));
    }
    const double a = median(window_us[0]) / calls, b = median(window_us[1]) / calls;
    const double va = median(view_us[0]) / calls, vb = median(view_us[1]) / calls;
    ratios.push_back(b / a);
    view_ratios.push_back(vb / va);
    std::printf("%s,\"pair\":%ld,\"a_us_per_call\":%s,\"b_us_per_call\":%s,\"ratio_b_over_a\":%s,"
                "\"a_worker_view_us\":%s,\"b_worker_view_us\":%s,\"view_ratio_b_over_a\":%s,\"a_pid\":%d,\"b_pid\":%d,"
                "\"a_windows_us\":%s,"
                "\"b_windows_us\":%s,\"a_views_us\":%s,\"b_views_us\":%s}\n",
                common.c_str(), pair, num(a).c_str(), num(b).c_str(), num(b / a).c_str(), num(va).c_str(),
                num(vb).c_str(), num(vb / va).c_str(), static_cast<int>(pids[0]), static_cast<int>(pids[1]),
                list(window_us[0]).c_str(), list(window_us[1]).c_str(), list(view_us[0]).c_str(),
                list(view_us[1]).c_str());
    std::fflush(stdout);
  }
  finish(clock, timeout);
  // Pairs whose two workers differ by more than 5%, and how often the slower side changes pair to pair.
  int off = 0, changes = 0;
  for (size_t i = 0; i < ratios.size(); ++i) {
    off += std::fabs(std::log(ratios[i])) > std::log(1.05);
    changes += i > 0 && (ratios[i] > 1.0) != (ratios[i - 1] > 1.0);
  }
  std::printf("%s,\"summary\":true,\"pairs\":%ld,\"ratios\":%s,\"view_ratios\":%s,\"pairs_off_5pct\":%d,"
              "\"side_changes\":%d}\n",
              common.c_str(), pairs, list(ratios).c_str(), list(view_ratios).c_str(), off, changes);
  std::string human = "# " + label + " " + mode + (fresh ? " fresh-clock-stream" : "") + (per_call ? " per-call" : "")
                      + (copy_out ? " copy-out" : "")
                      + (skip ? " skip-streams=" + std::to_string(skip) : "") + (order == "ba" ? " start-order=ba" : "")
                      + (connections ? " connections=" + std::to_string(connections) : "") + " calls="
                      + std::to_string(calls) + " elems=" + std::to_string(elems) + ": b/a by pair (clock)";
  for (const double r : ratios)
    human += " " + num(r).substr(0, 5);
  human += "; (worker view)";
  for (const double r : view_ratios)
    human += " " + num(r).substr(0, 5);
  human += "; " + std::to_string(off) + "/" + std::to_string(pairs) + " pairs off by >5%";
  std::fprintf(stderr, "%s\n", human.c_str());
  return 0;
}

const char* usage =
  "usage: mps_probe run [--mode wait|host|event|spin|copy] [--calls 100] [--elems 65536] [--samples 40]\n"
  "                     [--warmup 3] [--pairs 8] [--clock-streams-per-sample] [--worker-connections N]\n"
  "                     [--worker-skip-streams 0] [--start-order ab|ba] [--timeout 5] [--device 0]\n"
  "                     [--per-call | --copy-out] [--label TEXT]\n"
  "One clock process, two fresh workers (A, B) a pair, samples A,B,A,B; a JSON line a pair and a summary\n"
  "line on stdout. Modes, how the clock's window closes: wait = cuStreamWaitValue32 on the done word\n"
  "(crucible's), host = its host polls a shared word, event = an interprocess event, spin = a one-block\n"
  "kernel on the done word, copy = its host reads the done word by 4-byte copies (evaluator.cuda_clock_poll).\n"
  "--per-call: a handshake a call, the worker's buffer copied out by the clock before the next call's go;\n"
  "--copy-out: one handshake, then the same copies after done.\n"
  "The head of tools/bench/mps_probe.cu says more.\n";

} // namespace

int main(int argc, char** argv) {
  const std::string role = argc > 1 ? argv[1] : "";
  if (role.empty() || role == "-h" || role == "--help" || role == "help") {
    std::fputs(usage, role.empty() ? stderr : stdout);
    return role.empty() ? 2 : 0;
  }
  for (int i = 2; i < argc; ++i)
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(usage, stdout);
      return 0;
    }
  const options o = parse_options(argc, argv);
  if (role == "run")
    return run_main(o);
  role_name = role == "clock" ? "clock" : "worker";
  if (role == "clock")
    return clock_main(o);
  if (role == "worker")
    return worker_main(o);
  die("unknown role " + role + " (--help)");
}
