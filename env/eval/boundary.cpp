// The trust boundary's part of a verdict (env/eval/boundary.hpp; docs/evaluator.md, Trust
// boundary): the reference runs in one sandboxed worker and the candidate in another that never
// sees the task. The reference's worker draws every input; this part hands the candidate's worker
// its inputs, keeps it stopped outside its own calls, reads the clock around each timed sample,
// reads both workers' outputs out of their memory while they are stopped, and compares them.
// Nothing the verdict depends on is in the candidate's process. The CUDA half (mapped device
// memory, trial inputs on the device, the device clock's sample) is env/eval/boundary_device.cpp's;
// the phases before the rounds and the judging are the evaluation's (env/eval/evaluation.hpp).
#include "env/eval/boundary_outputs.hpp"
#include "env/eval/timing.hpp"
#include "env/eval/boundary.hpp"
#include "env/eval/worker_messages.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <map>
#include <mutex>
#include <utility>

namespace crucible::env {

using clock_type = std::chrono::steady_clock;

namespace {

constexpr const char* input_dists[] = {"the task's inputs", "inputs scaled by U(0.5, 2)",
                                       "inputs scaled by U(0.5, 2) with random signs",
                                       "inputs scaled by U(0.5, 2) with random signs, times 32",
                                        "inputs scaled by U(0.5, 2), one run of each scaled by 16 more",
                                        "inputs scaled by U(0.5, 2), a sparse few negated and a sparser few times 32"};

// Input bytes of one sample at most, over all its calls: more calls would only make the sample
// longer than evaluator.sample_ms asks while holding that much memory twice (both workers).
constexpr std::uint64_t max_sample_input_bytes = 256ull << 20;
// The most a sample of the slower side may last (ms) where the faster side's sets the calls: a
// candidate 45x faster than its reference makes the reference's samples 45 times sample_ms.
constexpr double slower_sample_ms(double sample_ms) { return 50.0 * sample_ms; }

// Reference samples timed alone (check_clean_reference) when no figure is cached.
constexpr std::int64_t alone_samples = 10;

// Half the fastest of five fills of `bytes` in this process's memory (ms): the physics floor of a
// call that writes that many output bytes.
double fill_floor_ms(std::uint64_t bytes) {
  if (bytes == 0)
    return 0;
  std::vector<unsigned char> buf(bytes, 1); // touched: page faults stay out of the fills
  double best = 1e300;
  for (int k = 0; k < 5; ++k) {
    const auto t0 = clock_type::now();
    std::memset(buf.data(), k + 2, buf.size());
    const auto t1 = clock_type::now();
    best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  volatile unsigned char sink = buf[bytes / 2]; // the fills are used
  (void) sink;
  return best / 2;
}

std::string describe_dist(int d) {
  return "distribution " + std::to_string(d) + (d >= 0 && d <= 5 ? std::string{": "} + input_dists[d] : std::string{});
}

} // namespace

boundary::boundary(walk& wk, bool on_device) : wk_(wk), ctx_(wk.ctx_) {
  dev_.on = on_device;
}

boundary::~boundary() {
  drop_outputs();
}

void boundary::drop_outputs() noexcept {
  ref_side_.sets.clear();
  cand_side_.sets.clear();
  dev_.staged.clear();
  dev_.last_ref_snaps.clear();
  dev_.clock.reset(); // its queued work waited for before the words it waits on go
  dev_.words.clear();
  dev_.mapped.clear();
}

bool boundary::pass_trial_input(worker& cw, std::size_t t) {
  const auto& in = facts_.trial_inputs.at(t);
  return in.on_device ? pass_trial_inputs_on_device(cw, t, t > 0) : send(cw, in.msg.json, &in.msg.frames);
}

bool boundary::pass_later_trial_input(worker& cw, std::int64_t t) {
  if (later_.empty() || t < 0 || static_cast<std::size_t>(t) != later_.front()) {
    set(verdict_status::runtime_error, "the candidate's worker broke the protocol: it asked for trial " + std::to_string(t)
                                         + "'s inputs, " + (later_.empty() ? std::string{"where none of its trials' inputs were left to ask for"}
                                                                           : "where trial " + std::to_string(later_.front())
                                                                               + "'s were next"));
    return false;
  }
  later_.pop_front();
  return pass_trial_inputs_on_device(cw, static_cast<std::size_t>(t), false);
}

bool boundary::make_both_buffers(std::int64_t calls) {
  // Both workers at once: no clock runs, and each makes its own (the reference's draws nothing the
  // candidate's could see). One after the other, the two took most of a round's host time beside
  // its samples (8.2 ms a round of level1/1's 3 calls on an H200, docs/PERFORMANCE.md).
  return ask_buffers(ref_side_, calls) && ask_buffers(cand_side_, calls) && take_buffers(ref_side_, calls)
         && take_buffers(cand_side_, calls);
}

bool boundary::ask_buffers(side& s, std::int64_t calls) {
  worker& w = *s.proc;
  return thaw(w) && send(w, worker_msg::buffers(calls));
}

bool boundary::take_buffers(side& s, std::int64_t calls) {
  worker& w = *s.proc;
  wire::node n;
  worker_message msg;
  if (!receive(w, ctx_.opt.run_timeout_s, "allocating the timing's input buffers", n, msg))
    return false;
  auto broke = [&](const std::string& what) {
    set(verdict_status::runtime_error, std::string{who(w)} + " broke the protocol: " + what);
    return false;
  };
  if (n["type"].as<std::string>() != "buffers" || !n["sets"].is_list()
      || n["sets"].size() != static_cast<std::size_t>(calls))
    return broke("expected buffers for " + std::to_string(calls) + " calls");
  s.sets.clear();
  for (const auto& set_node : n["sets"]) {
    std::vector<side::buffer> one;
    for (const auto& b : set_node) {
      side::buffer buf;
      if (b["value"].defined())
        buf.value = true;
      else {
        buf.addr = b["addr"].as<std::uint64_t>(0);
        buf.bytes = b["bytes"].as<std::uint64_t>(0);
        if (dev_.on && buf.bytes > 0) {
          // On a CUDA device: the buffer's allocation, mapped here, and the buffer inside it.
          if (!b["ipc"].defined())
            return broke("an input buffer on the device without its handle");
          auto whole = map_handle(w, b["ipc"].as<std::string>(""));
          if (!whole)
            return broke("its input buffer cannot be mapped: " + whole.error().message);
          auto sp = subspan(*whole, b["offset"].as<std::uint64_t>(0), buf.bytes, 1);
          if (!sp)
            return broke("its input buffer: " + sp.error().message);
          buf.span = std::move(*sp);
        }
      }
      one.push_back(buf);
    }
    s.sets.push_back(std::move(one));
  }
  return freeze(w);
}

bool boundary::request_draw(std::int64_t calls, int dist, std::optional<std::uint64_t> seed, const char* phase,
                              const char* what, wire::node& n, worker_message& msg) {
  worker& rw = *wk_.w_.proc;
  if (!thaw(rw) || !send(rw, worker_msg::draw(calls, dist, dev_.on, seed))
      || !receive(rw, ctx_.opt.run_timeout_s, phase, n, msg) || !freeze(rw))
    return false;
  if (n["type"].as<std::string>() != "drawn" || !n["sets"].is_list()
      || n["sets"].size() != static_cast<std::size_t>(calls)) {
    set(verdict_status::runtime_error, std::string{"the reference's worker sent no inputs for "} + what);
    return false;
  }
  return true;
}

bool boundary::draw(int dist, sample_inputs& in) {
  worker& rw = *wk_.w_.proc;
  wire::node n;
  worker_message msg;
  const auto calls = static_cast<std::int64_t>(ref_side_.sets.size());
  if (!request_draw(calls, dist, std::nullopt, "drawing a timing round's inputs", "a timing round", n, msg))
    return false;
  in.clear();
  if (dev_.on)
    return draw_on_device(rw, n, in);
  for (const auto& set_node : n["sets"]) {
    std::vector<std::vector<std::byte>> one;
    for (const auto& d : set_node) {
      if (!d["frame"].defined()) {
        one.emplace_back();
        continue;
      }
      const auto f = d["frame"].as<std::size_t>(0);
      if (f == 0 || f > msg.frames.size()) {
        set(verdict_status::runtime_error, "the reference's worker sent an input without its bytes");
        return false;
      }
      one.push_back(std::move(msg.frames[f - 1]));
    }
    in.push_back(std::move(one));
  }
  return true;
}

bool boundary::refuse_unlike_trials(std::size_t k, const tensor_blob& b) {
  // What the candidate's worker says is data: an output of another dtype or shape than the
  // reference's in the trials is not read at all (nor a size it made up to exhaust memory).
  if (k < wk_.reference_.front().size() && wk_.reference_.front()[k].type == b.type && wk_.reference_.front()[k].shape == b.shape)
    return false;
  wk_.v_.checks_failed.push_back("runtime:timing_outputs");
  set(verdict_status::rejected, "timing round " + std::to_string(split_.round_no) + ": the candidate's output "
                                  + std::to_string(k) + " has another dtype or shape than in the trials");
  return true;
}

bool boundary::refuse_aliased(std::size_t k) {
  wk_.v_.checks_failed.push_back("runtime:aliased_output");
  set(verdict_status::rejected, "timing round " + std::to_string(split_.round_no) + ": output " + std::to_string(k)
                                  + " shares memory with an input, where the reference's output does not; "
                                    "returning an input or a view of one is not a computation");
  return false;
}

bool boundary::refuse_input_mutation() {
  wk_.v_.checks_failed.push_back("runtime:input_mutation");
  set(verdict_status::rejected, "the candidate changed its inputs (timing round " + std::to_string(split_.round_no) + ")");
  return false;
}

bool boundary::refuse_layout(std::size_t k) {
  wk_.v_.checks_failed.push_back("runtime:output_layout");
  set(verdict_status::rejected, "timing round " + std::to_string(split_.round_no) + ": output " + std::to_string(k)
                                  + " was handed back in another layout than row-major (strided, transposed or "
                                    "broadcast), which the harness makes dense inside the clock; reading it by its "
                                    "strides would be the evaluator doing the task's work");
  return false;
}

bool boundary::write_inputs(const side& s, const sample_inputs& in, bool complement) {
  worker& w = *s.proc;
  std::vector<std::byte> bytes;
  for (std::size_t c = 0; c < in.size(); ++c)
    for (std::size_t i = 0; i < in[c].size(); ++i) {
      const auto& b = s.sets[c][i];
      if (b.value || b.bytes == 0)
        continue;
      const std::byte* data = in[c][i].data();
      if (complement) {
        bytes.resize(b.bytes);
        for (std::size_t j = 0; j < b.bytes; ++j)
          bytes[j] = ~data[j];
        data = bytes.data();
      }
      if (auto r = w.write_memory(b.addr, data, b.bytes); !r) {
        if (&w != wk_.cand_.proc.get())
          wk_.end_.evaluator_failed = true; // the reference's worker: not the candidate's doing
        set(verdict_status::runtime_error, std::string{"cannot write the inputs of "} + who(w) + ": " + r.error().message);
        return false;
      }
    }
  return true;
}

bool boundary::prime(worker& w) {
  wire::node n;
  worker_message msg;
  // Its untimed call on the last sample's inputs; then it is stopped.
  if (!thaw(w) || !send(w, worker_msg::command("prime")) || !receive(w, ctx_.opt.run_timeout_s, "timing", n, msg))
    return false;
  if (n["type"].as<std::string>() != "primed") {
    set(verdict_status::runtime_error, std::string{who(w)} + " broke the protocol: expected primed, got "
                                         + n["type"].as<std::string>());
    return false;
  }
  return freeze(w);
}

double boundary::cpu_charge_ms(std::uint64_t before_ns, std::uint64_t after_ns) const {
  // The CPU time all the worker's processes and threads ran in it, over the cores a worker is
  // given (evaluator.cpu_threads). Not the wall time: on a machine with other work, runnable
  // threads get the cores in proportion to their number, so a candidate of several threads would
  // get more of them than the reference's one (hack_extra_cores.py), and the wall time carries
  // every other program's load besides. Work handed to threads or processes of its own is paid
  // for as if it ran on the worker's cores.
  return static_cast<double>(after_ns - std::min(after_ns, before_ns)) / 1e6
         / static_cast<double>(std::max<std::int64_t>(1, ctx_.opt.cpu_threads));
}

bool boundary::time_sample(side& s, const sample_inputs& in, std::vector<std::vector<tensor_blob>>& outs, double& ms) {
  const auto& opt = ctx_.opt;
  worker& w = *s.proc;
  const bool candidate = &w == wk_.cand_.proc.get();
  wire::node n;
  worker_message msg;
  auto broke = [&](const std::string& what) {
    set(verdict_status::runtime_error, std::string{who(w)} + " broke the protocol: " + what);
    return false;
  };
  if (dev_.on)
    return time_sample_device(s, in, outs, ms);
  auto& parts = split_.cpu_parts[candidate ? 1 : 0];
  if (lap_into lap{parts[0]}; !prime(w))
    return false;
  // The sample's inputs, written while no process of the worker runs: it cannot see them before
  // its clock starts.
  if (in.size() != s.sets.size())
    return broke("input buffers for " + std::to_string(s.sets.size()) + " calls, the sample has " + std::to_string(in.size()));
  for (std::size_t c = 0; c < in.size(); ++c) {
    if (in[c].size() != s.sets[c].size())
      return broke("input buffers for " + std::to_string(s.sets[c].size()) + " inputs, the task has " + std::to_string(in[c].size()));
    for (std::size_t i = 0; i < in[c].size(); ++i)
      if (const auto& b = s.sets[c][i]; !b.value && b.bytes != in[c][i].size())
        return broke("an input buffer of " + std::to_string(b.bytes) + " bytes for an input of " + std::to_string(in[c][i].size()));
  }
  if (lap_into lap{parts[1]}; !write_inputs(s, in, false))
    return false;
  // The cache flush, here: the last-level cache is the machine's, and the worker's own flush would
  // be the candidate's to skip (its weights kept warm while the reference's are evicted).
  {
    lap_into lap{parts[2]};
    ctx_.flush.run();
  }
  // The clock: from the worker's continuation until it is stopped again after it said `sampled`.
  // Work it left running when it said so (a thread finishing the outputs) is inside the clock up to
  // the stop. It is continued right before the clock starts, not after: waking a stopped process
  // (and ZeroMQ's threads in it) took milliseconds on a loaded machine, which no call should carry;
  // between the two it is waiting for `go`, and what a thread of its could do meanwhile is the
  // one clock reading's worth of time.
  //
  // What the sample is charged is not quite that time: cpu_charge_ms, with the two readings of
  // what the worker ran, taken while it is stopped.
  const auto cpu0 = w.cpu_ns();
  if (!cpu0) {
    ended(w, "before a timed sample");
    return false;
  }
  if (!thaw(w))
    return false;
  const auto t0 = clock_type::now();
  wk_.clock_running_ = true;
  const bool answered = send(w, worker_msg::command("go")) && receive(w, opt.run_timeout_s, "timing", n, msg);
  wk_.clock_running_ = false;
  if (!answered)
    return false;
  clock_type::time_point t1;
  if (n["type"].as<std::string>() != "sampled") {
    (void) freeze(w);
    return broke("expected sampled, got " + n["type"].as<std::string>());
  }
  if (!freeze(w, &t1))
    return false;
  const auto cpu1 = w.cpu_ns();
  if (!cpu1) {
    ended(w, "during the timing");
    return false;
  }
  const double charged = cpu_charge_ms(*cpu0, *cpu1);
  ++s.samples;
  s.wall_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
  const auto t_read = clock_type::now();
  s.charged_ms += charged;
  ms = charged / static_cast<double>(in.size());
  // Its outputs, read out of its memory while it is stopped.
  const auto& list = n["outputs"];
  if (!list.is_list() || list.size() != in.size())
    return broke("outputs for a different number of calls");
  outs.assign(in.size(), {});
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges; // [addr, end) of each call's outputs, in call order
  std::vector<std::size_t> range_call;
  struct watched_output {
    std::size_t call, k;
    std::uint64_t addr, span;
  };
  std::vector<watched_output> watched; // the candidate's outputs that may not alias an input (contiguous: span == bytes)
  for (std::size_t c = 0; c < in.size(); ++c) {
    for (const auto& d : list[c]) {
      tensor_blob b;
      if (d["kind"].defined()) {
        b.kind = d["kind"].as<std::string>();
        outs[c].push_back(std::move(b));
        continue;
      }
      output_desc o;
      if (auto wrong = parse_output(d, o); !wrong.empty())
        return broke(wrong);
      b = o.blob; // o keeps its shape for gather() below
      const auto addr = d["addr"].as<std::uint64_t>(0);
      const auto span = o.span;
      const auto k = outs[c].size();
      if (candidate && refuse_unlike_trials(k, b))
        return false;
      if (candidate && !o.contiguous)
        return refuse_layout(k);
      if (candidate && may_not_alias(k) && span > 0)
        watched.push_back({c, k, addr, span});
      if (candidate && may_not_alias(k))
        for (const auto& ib : s.sets[c])
          if (!ib.value && span > 0 && addr < ib.addr + ib.bytes && ib.addr < addr + span)
            return refuse_aliased(k);
      if (span > 0) {
        ranges.emplace_back(addr, addr + span);
        range_call.push_back(c);
      }
      std::vector<std::byte> raw(span);
      if (span > 0)
        if (auto r = w.read_memory(addr, span, raw.data()); !r) {
          if (!candidate)
            wk_.end_.evaluator_failed = true;
          set(verdict_status::runtime_error, std::string{"cannot read the outputs of "} + who(w) + ": " + r.error().message);
          return false;
        }
      if (o.contiguous)
        b.bytes = std::move(raw);
      else
        b.bytes = gather(o, raw.data());
      outs[c].push_back(std::move(b));
    }
  }
  // Two calls of the sample that handed back the same memory (a buffer the module keeps and
  // writes each call, out= style): what is read is the last call's, and whether the others
  // computed anything cannot be told from it. Such a verdict goes on with one call per sample.
  for (std::size_t i = 0; i < ranges.size() && !split_.outputs_reused; ++i)
    for (std::size_t j = i + 1; j < ranges.size(); ++j)
      if (range_call[i] != range_call[j] && ranges[i].first < ranges[j].second && ranges[j].first < ranges[i].second) {
        split_.outputs_reused = true;
        break;
      }
  parts[3] += ms_since(t_read);
  if (candidate) {
    lap_into checks_lap{parts[4]};
    // Its inputs, read back: a candidate that writes into them (its output in an input's memory)
    // is refused, as in the trials (runtime:input_mutation).
    std::vector<std::byte> now;
    for (std::size_t c = 0; c < in.size(); ++c)
      for (std::size_t i = 0; i < in[c].size(); ++i) {
        const auto& b = s.sets[c][i];
        if (b.value || b.bytes == 0)
          continue;
        now.resize(b.bytes);
        if (auto r = w.read_memory(b.addr, b.bytes, now.data()); !r)
          return broke("its input buffer cannot be read back: " + r.error().message);
        if (std::memcmp(now.data(), in[c][i].data(), b.bytes) != 0)
          return refuse_input_mutation();
      }
    // Aliasing by what memory an output is, not by the address it claims: a second mapping of an
    // input's pages lies at an address no range check matches. First by physical frame (the
    // worker's pagemap): an output byte on a frame where an input byte lies at the same offset is
    // that input. Where frames cannot be seen (no CAP_SYS_ADMIN, a page not present), by content:
    // every input byte rewritten (its complement) and every output read again, then the inputs
    // written back as drawn (the next untimed call runs on them).
    if (!watched.empty()) {
      const watched_output* changed = nullptr;
      bool seen = true;
      {
        static const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
        std::unordered_map<std::uint64_t, std::vector<std::pair<std::uint64_t, std::uint64_t>>> held; // frame: input bytes on it
        auto frames_of = [&](std::uint64_t addr, std::uint64_t bytes, const auto& each) {
          auto f = w.page_frames(addr, bytes);
          if (!f)
            return false;
          for (std::size_t p = 0; p < f->size(); ++p) {
            if ((*f)[p] == 0)
              return false;
            const std::uint64_t base = (addr / page + p) * page;
            each((*f)[p], std::max(addr, base) - base, std::min(addr + bytes, base + page) - base);
          }
          return true;
        };
        for (std::size_t c = 0; c < in.size() && seen; ++c)
          for (std::size_t i = 0; i < in[c].size() && seen; ++i) {
            const auto& b = s.sets[c][i];
            if (!b.value && b.bytes > 0)
              seen = frames_of(b.addr, b.bytes, [&](std::uint64_t frame, std::uint64_t lo, std::uint64_t hi) {
                held[frame].emplace_back(lo, hi);
              });
          }
        for (const auto& o : watched) {
          if (!seen || changed)
            break;
          seen = frames_of(o.addr, o.span, [&](std::uint64_t frame, std::uint64_t lo, std::uint64_t hi) {
            if (auto it = held.find(frame); it != held.end())
              for (const auto& [a, z] : it->second)
                if (lo < z && a < hi)
                  changed = &o;
          });
        }
      }
      if (!seen) {
        changed = nullptr;
        if (!write_inputs(s, in, true))
          return false;
        std::vector<std::byte> again;
        for (const auto& o : watched) {
          again.resize(o.span);
          if (auto r = w.read_memory(o.addr, o.span, again.data()); !r)
            return broke("its output memory cannot be read again: " + r.error().message);
          if (std::memcmp(again.data(), outs[o.call][o.k].bytes.data(), o.span) != 0) {
            changed = &o;
            break;
          }
        }
        if (!write_inputs(s, in, false))
          return false;
      }
      if (changed)
        return refuse_aliased(changed->k);
    }
    // Its outputs, read, are overwritten with 0xFF bytes (NaN for floats) where they lie: an output
    // handed back again without being computed again (a stored result) fails the next comparison,
    // and keeping a copy elsewhere costs copying it, which the floor below bounds.
    std::vector<std::byte> poison;
    for (std::size_t r = 0; r < ranges.size(); ++r) {
      poison.assign(ranges[r].second - ranges[r].first, std::byte{0xFF});
      if (auto p = w.write_memory(ranges[r].first, poison.data(), poison.size()); !p)
        return broke("its output memory cannot be written: " + p.error().message);
    }
  }
  return true;
}

bool boundary::measure_null() {
  worker& rw = *wk_.w_.proc;
  wire::node n;
  worker_message msg;
  double best = 0, worst = 0, best_host = 0;
  for (int k = 0; k < 5; ++k) {
    double ms = 0;
    if (dev_.on) {
      // Every step of a timed sample (its untimed call and the cache's flush included), with no
      // calls: the worker's stream writes `done` as soon as it sees `go`. A tiny kernel in their
      // place would be taken off every sample too, and a call of one short kernel is mostly its
      // launch.
      std::vector<std::vector<tensor_blob>> none;
      if (!time_sample_device(ref_side_, {}, none, ms, true))
        return false;
      best_host = k == 0 ? dev_.last_host_ms : std::min(best_host, dev_.last_host_ms);
    } else {
      const auto cpu0 = rw.cpu_ns();
      if (!cpu0) {
        ended(rw, "before an empty sample");
        return false;
      }
      if (!thaw(rw))
        return false;
      if (!send(rw, worker_msg::command("null")) || !receive(rw, ctx_.opt.run_timeout_s, "timing", n, msg)
          || !freeze(rw))
        return false;
      const auto cpu1 = rw.cpu_ns();
      if (!cpu1) {
        ended(rw, "during an empty sample");
        return false;
      }
      ms = cpu_charge_ms(*cpu0, *cpu1); // as a timed sample is charged (time_sample)
    }
    best = k == 0 ? ms : std::min(best, ms);
    worst = k == 0 ? ms : std::max(worst, ms);
  }
  split_.null_ms = best;
  if (ctx_.log.enabled(log_level::debug)) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "empty samples of %lld calls' copies: fastest %.4f ms, slowest %.4f ms (host %.4f ms)",
                  static_cast<long long>(split_.sample_calls), best, worst, best_host);
    ctx_.log.debug("evaluator", ctx_.device, " ", wk_.req_.target.name, ": ", buf);
  }
  return true;
}

double boundary::net_ms(double ms) const {
  // On a device a sample's window holds, besides its calls, what the empty sample's holds: the
  // copy of every call's inputs in, the go and done words, the copy out taking hold of the device.
  // Both sides' samples have them alike; they are taken off each sample, the fastest of the empty
  // samples, which no sample's own overhead undercuts by more than the empty samples' spread (so
  // a speedup above 1 comes out a little low, never high). The CPU's samples are charged the
  // group's CPU time, which holds no such copies.
  if (!dev_.on || split_.sample_calls <= 0)
    return ms;
  return std::max(0.0, ms - split_.null_ms / static_cast<double>(split_.sample_calls));
}

double boundary::ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

// A round as a message names it: a measured round by its number, a warm-up round (k < 0) as such.
static std::string round_name(std::int64_t k) { return k < 0 ? std::string{"a warm-up round"} : "timing round " + std::to_string(k); }

bool boundary::split_round(std::int64_t k, double& ref_ms, double& cand_ms, bool& counted) {
  const int dist = facts_.dists[static_cast<std::size_t>(split_.round_no) % facts_.dists.size()];
  ++split_.round_no;
  sample_inputs in;
  {
    lap_into lap{split_.host_draw_ms};
    if (!draw(dist, in))
      return false;
  }
  std::vector<std::vector<tensor_blob>> ref_outs, cand_outs;
  bool cand_first;
  {
    lap_into lap{split_.host_samples_ms};
    // Both samples of a round, each right after its own untimed call, in an order balanced over
    // each two rounds: a random one for the first, the other for the second. A second sample that
    // is faster or slower for coming second (caches, the clock's state) then weighs on both sides
    // alike; drawn per round, ten rounds could give seven of one order. The pairs are counted in
    // the measured rounds (k, from 0; a round played again, not counted, keeps its k); a warm-up
    // round draws its own.
    if (k < 0)
      cand_first = split_.rng() & 1;
    else if (k % 2 == 0)
      cand_first = split_.pair_cand_first = split_.rng() & 1;
    else
      cand_first = !split_.pair_cand_first;
    if (cand_first) {
      if (!time_sample(cand_side_, in, cand_outs, cand_ms) || !time_sample(ref_side_, in, ref_outs, ref_ms))
        return false;
    } else {
      if (!time_sample(ref_side_, in, ref_outs, ref_ms) || !time_sample(cand_side_, in, cand_outs, cand_ms))
        return false;
    }
  }
  lap_into compare_lap{split_.host_compare_ms};
  if (split_.outputs_reused && split_.sample_calls > 1) {
    // Its earlier calls' outputs were overwritten by later ones: from now on one call per sample,
    // and this round is not counted.
    split_.sample_calls = wk_.reported_.calls = 1;
    counted = false;
    // On a device the empty sample's round trip holds the copies of every call's inputs and
    // outputs: measured again for one call, or the floor would take a round trip of many calls
    // off a sample of one (a candidate that reuses its output, computing as the reference does,
    // was refused below the floor so: its median call -194 us on 01_relu_scale, an H200).
    return make_both_buffers(1) && (!dev_.on || measure_null());
  }
  counted = true;
  if (k >= 0) {
    ++split_.measured_rounds;
    split_.measured_cand_first += cand_first ? 1 : 0;
  }
  // Every timed call is held to the correctness tolerance, here, against the reference's outputs
  // on the same inputs (runtime:timing_outputs), with the rounding slack the trials measured on
  // inputs of the same distribution: a loosest-trial slack would hide a precision dropped only
  // in timed calls.
  const auto& slack = facts_.slack[dist];
  for (std::size_t c = 0; c < ref_outs.size(); ++c) {
    for (std::size_t i = 0; i < ref_outs[c].size() && i < slack.size(); ++i)
      ref_outs[c][i].slack = slack[i];
    const auto cmp = compare_outputs(ref_outs[c], cand_outs[c], wk_.tol_);
    if (!cmp.ok && cmp.evaluator_error) {
      wk_.end_.evaluator_failed = true;
      set(verdict_status::runtime_error, round_name(k) + ": " + cmp.message);
      return false;
    }
    if (!cmp.ok) {
      wk_.v_.checks_failed.push_back("runtime:timing_outputs");
      set(verdict_status::rejected, round_name(k) + " (" + describe_dist(dist) + "), call "
                                      + std::to_string(c) + ": the candidate's output differs from the reference's on the "
                                        "same inputs (" + cmp.message + "); every timed call is checked like a correctness trial");
      return false;
    }
  }
  return true;
}

bool boundary::measure(std::int64_t rounds, std::vector<double>& ref, std::vector<double>& cand, bool continuation) {
  const auto& opt = ctx_.opt;
  ref_side_.proc = wk_.w_.proc.get();
  cand_side_.proc = wk_.cand_.proc.get();
  if (split_.sample_calls == 0) {
    split_.sample_calls = 1;
    if (!make_both_buffers(1))
      return false;
  }
  if (dev_.on && (!setup_clock(ref_side_) || !setup_clock(cand_side_)))
    return false;
  double r = 0, c = 0;
  // A warm-up that may have company (starting workers, other evaluations' untimed work): its
  // measured rounds begin at the gate below, and on a device the empty samples whose round trip
  // comes off every measured sample are taken there, alone as the rounds are, once.
  const bool warmup_company = !wk_.gate_.measuring && ctx_.gate.warmup_shared();
  if (!wk_.gate_.measured && !continuation) {
    // Warm-up: at least 3 rounds and warmup_ms, then as many calls per sample as make a sample
    // last evaluator.sample_ms (each call on its own inputs), and one more round at that count.
    std::vector<double> wr, wc;
    const auto until = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                               std::chrono::duration<double, std::milli>(opt.warmup_ms));
    bool counted = true;
    while (wr.size() < 3 || clock_type::now() < until) {
      if (!split_round(-1, r, c, counted))
        return false;
      wr.push_back(r);
      wc.push_back(c);
    }
    // The samples' round trip is measured now and taken off the warm-up's times, so that the calls
    // a sample takes follow the calls' own time: on a device it is a millisecond, on the CPU the
    // CPU time an empty sample is charged (a 45x kernel's call on the CPU is about as long).
    const double trip = measure_null() ? split_.null_ms : -1.0;
    if (trip < 0)
      return false;
    // As many calls as make the faster side's sample last sample_ms (evaluator.sample_ms): taken
    // from the slower side, a 45x kernel's sample was one call of 0.06 ms beside a 0.057 ms round
    // trip (CUDA-L1's level1/12 across, 42.7x against 47.6x in one process). The slower side's
    // sample is kept within slower_sample_ms of its own.
    const double mr = median(wr), mc = median(wc);
    const double fast_ms = std::min(mr, mc) - trip, slow_ms = std::max(mr, mc) - trip;
    std::int64_t calls = 1;
    // The graph baselines take one call a sample: cuda-graph replays a graph captured on each
    // sample's input buffers, compile-reduce-overhead's graphs overwrite their outputs at the
    // next step (executor.py, executor_call).
    const bool graphs = opt.baseline == timing_baseline::cuda_graph || opt.baseline == timing_baseline::compile_reduce_overhead;
    if (opt.sample_ms > 0 && !graphs) {
      calls = fast_ms > 0 ? static_cast<std::int64_t>(std::ceil(opt.sample_ms / fast_ms)) : opt.max_calls;
      if (slow_ms > 0)
        calls = std::min<std::int64_t>(calls, static_cast<std::int64_t>(slower_sample_ms(opt.sample_ms) / slow_ms));
      calls = std::clamp<std::int64_t>(calls, 1, opt.max_calls);
    }
    if (wk_.reported_.input_bytes > 0)
      calls = std::min<std::int64_t>(calls, std::max<std::int64_t>(1, static_cast<std::int64_t>(max_sample_input_bytes / wk_.reported_.input_bytes)));
    if (calls != split_.sample_calls) {
      split_.sample_calls = wk_.reported_.calls = calls;
      if (!make_both_buffers(calls) || !split_round(-1, r, c, counted))
        return false;
    }
    // On a device the empty sample's round trip (its copies in and out included) is measured
    // again for the sample's final count of calls: here where the warm-up had the device alone,
    // else below.
    if (dev_.on && calls > 1 && !warmup_company && !measure_null())
      return false;
  }
  wk_.gate_.measured = true;
  if (warmup_company) {
    // The measured rounds wait until the warm-up's company is gone (device_gate).
    wk_.begin_measured_rounds();
    // Then the empty samples: taken beside another verdict's work (a kernel that never ended,
    // time-sliced with this verdict's processes), their round trip was longer than any measured
    // sample's overhead, and an honest kernel beside it came out 0.00 us a call, refused below
    // the floor (H200, 2026-11-30).
    if (dev_.on && !measure_null())
      return false;
  }
  for (std::int64_t k = 0; k < rounds;) {
    bool counted = true;
    // New input buffers every round, at random places in both workers (make_both_buffers,
    // placement_jitter_bytes): where buffers lie can move a kernel's speed, and one placement for a
    // whole verdict would fix that for its every round.
    if (lap_into lap{split_.host_buffers_ms}; opt.placement_jitter_bytes >= 512
                                               && !make_both_buffers(split_.sample_calls))
      return false;
    {
      // Another evaluation in flight (its candidate compiling, say) shares the host's cores with
      // these rounds, and not with the reference timed alone afterwards (check_clean_reference).
      if (ctx_.pool.in_flight() > 1)
        split_.host_shared = true;
    }
    if (!split_round(static_cast<std::int64_t>(ref.size()), r, c, counted))
      return false;
    if (!counted)
      continue;
    ++k;
    ref.push_back(net_ms(r));
    cand.push_back(net_ms(c));
    ctx_.counters.timed_calls_ns += static_cast<std::uint64_t>((r + c) * 1e6 * static_cast<double>(split_.sample_calls));
  }
  // The physics floor: no call produces its outputs faster than this machine writes their bytes.
  // A stored output handed back (a task whose inputs never change, in one call per sample where
  // it hands back the same buffer) takes the round trip alone.
  // The round trip every sample pays besides its calls (continue, `go`, `sampled`, stop) is taken
  // off first: the fastest of five empty samples of the reference's worker.
  if (split_.floor_ms < 0) {
    for (const auto& b : wk_.reference_.front())
      if (b.kind.empty())
        split_.floor_bytes += static_cast<std::uint64_t>(b.numel()) * element_size(b.type);
    if (dev_.on) {
      // The device's write rate, from a fill large enough that one launch's latency is not most
      // of it: a sample's calls are queued before its window opens, so what bounds them is the
      // rate, not a launch. One fill of a small output's bytes took 5.4 us on an H200 (16 KB),
      // and its half refused a legitimate call of 1.5 us beside the round trip.
      const std::uint64_t big = std::max<std::uint64_t>(split_.floor_bytes, 256ull << 20);
      auto fill = fastest_fill_ms(wk_.cuda_device_, big);
      if (!fill) {
        wk_.end_.evaluator_failed = true;
        set(verdict_status::runtime_error, "cannot measure the device's fill time: " + fill.error().message);
        return false;
      }
      split_.floor_ms = *fill * static_cast<double>(split_.floor_bytes) / static_cast<double>(big) / 2;
    } else {
      split_.floor_ms = fill_floor_ms(split_.floor_bytes);
      if (!measure_null())
        return false;
    }
  }
  // A side's median call: a device's samples are already net of it (net_ms).
  const auto per_call = [&](const std::vector<double>& side) {
    return dev_.on ? median(side) : median(side) - split_.null_ms / static_cast<double>(split_.sample_calls);
  };
  const double m = per_call(cand);
  if (ctx_.log.enabled(log_level::debug)) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "floor %.4f ms, round trip %.4f ms, calls %lld, candidate's median call %.4f ms besides it",
                  split_.floor_ms, split_.null_ms, static_cast<long long>(split_.sample_calls), m);
    ctx_.log.debug("evaluator", ctx_.device, " ", wk_.req_.target.name, ": ", buf);
    std::snprintf(buf, sizeof buf, "rounds' host time (ms, %lld rounds): inputs drawn %.1f, buffers made %.1f, samples %.1f, "
                  "outputs compared %.1f", static_cast<long long>(split_.round_no), split_.host_draw_ms, split_.host_buffers_ms,
                  split_.host_samples_ms, split_.host_compare_ms);
    ctx_.log.debug("evaluator", ctx_.device, " ", wk_.req_.target.name, ": ", buf);
    if (!dev_.on) {
      std::snprintf(buf, sizeof buf, "samples' CPU time against their wall time (ms): reference %.3f of %.3f, candidate %.3f of %.3f",
                    ref_side_.charged_ms, ref_side_.wall_ms, cand_side_.charged_ms, cand_side_.wall_ms);
      ctx_.log.debug("evaluator", ctx_.device, " ", wk_.req_.target.name, ": ", buf);
      const auto& c = split_.cpu_parts;
      char parts[400];
      std::snprintf(parts, sizeof parts, "samples' host time besides their wall time, in parts (ms): reference untimed call %.1f, "
                    "inputs written %.1f, flush %.1f, outputs read %.1f; candidate untimed call %.1f, inputs written %.1f, "
                    "flush %.1f, outputs read %.1f, checks %.1f",
                    c[0][0], c[0][1], c[0][2], c[0][3], c[1][0], c[1][1], c[1][2], c[1][3], c[1][4]);
      ctx_.log.debug("evaluator", ctx_.device, " ", wk_.req_.target.name, ": ", parts);
    }
    if (dev_.on) {
      // Per side: the median host time from `launch` to `launched`, the median device window,
      // and the share of samples let go before `launched` (a call that waited for the device).
      auto share = [](const std::vector<double>& v) {
        double n = 0;
        for (const auto x : v)
          n += x;
        return v.empty() ? 0.0 : n / static_cast<double>(v.size());
      };
      auto said = [](const std::vector<double>& v) { return v.empty() ? -1.0 : median(v); }; // -1: not said
      char laps[480];
      std::snprintf(laps, sizeof laps, "sample laps (ms): reference launch %.4f (queuing the calls %.4f) device %.4f let go early %.2f flush %.3f "
                    "close %.3f checks %.3f; candidate launch %.4f (queuing the calls %.4f) device %.4f let go early %.2f flush %.3f "
                    "close %.3f checks %.3f",
                    median(dev_.laps[0][0]), said(dev_.laps[0][6]), median(dev_.laps[0][1]), share(dev_.laps[0][2]),
                    median(dev_.laps[0][3]), median(dev_.laps[0][4]), median(dev_.laps[0][5]), median(dev_.laps[1][0]),
                    said(dev_.laps[1][6]), median(dev_.laps[1][1]), share(dev_.laps[1][2]), median(dev_.laps[1][3]),
                    median(dev_.laps[1][4]), median(dev_.laps[1][5]));
      ctx_.log.debug("evaluator", ctx_.device, " ", wk_.req_.target.name, ": ", laps);
    }
  }
  if (m < split_.floor_ms) {
    wk_.refuse_below_floor(m, split_.floor_ms, " besides the clock's round trip", split_.floor_bytes);
    return false;
  }
  if (const double b = wk_.bound_floor_ms(per_call(ref)); m < b) {
    wk_.refuse_below_bound(m, b, " besides the clock's round trip");
    return false;
  }
  return true;
}

bool boundary::check_clean_reference(const std::vector<double>& ref) {
  const auto& opt = ctx_.opt;
  // Every round is played now: their order, for the debug log.
  if (ctx_.log.enabled(log_level::debug))
    ctx_.log.debug("evaluator", ctx_.device, " ", wk_.req_.target.name, ": the candidate's sample first in ",
                   split_.measured_cand_first, " of ", split_.measured_rounds, " measured rounds");
  if (ref.empty())
    return true;
  // The candidate's worker ends first: with it go its processes and anything it left running.
  wk_.cand_.proc->kill();
  if (split_.host_shared) {
    // Other evaluations were in flight during the rounds: a neighbour's compile on the same cores
    // would make the reference slower during the verdict than alone, whatever the candidate did.
    // The candidate's own processes were stopped while the reference ran (freeze) all the same.
    ctx_.log.debug("evaluator", ctx_.device, " ", wk_.req_.target.name,
                   ": the reference is not timed alone: other evaluations shared the host during the rounds");
    return true;
  }
  const double during = median(ref);
  const double during_q25 = quantile(ref, 0.25);
  // Slower beyond the band, and not by noise: the fastest quarter of this verdict's reference
  // samples is slower, by the band, than the slowest quarter of the samples alone. A machine whose
  // load moves between the two windows (CI's two cores running other tests: 20% between the
  // medians, with spreads as wide) moves both quarters together; work of the candidate's that
  // slows every reference sample (a GPU context left busy: twice the time) does not.
  auto slower = [&](const std::vector<double>& alone) {
    return during > median(alone) * (1 + opt.reference_band)
           && during_q25 > quantile(alone, 0.75) * (1 + opt.reference_band);
  };
  const auto key = wk_.req_.target.sha256 + ";" + ctx_.protocol_key + ";calls=" + std::to_string(split_.sample_calls);
  std::vector<double> alone = ctx_.baselines.find(key).value_or(std::vector<double>{});
  if (!alone.empty() && !slower(alone))
    return true;
  // No figure yet, or this verdict's reference was slower than it: the reference timed alone now,
  // in its own worker, which never loaded candidate code (twice as many samples before a refusal).
  wk_.phase("reference alone");
  auto time_alone = [&](std::vector<double>& into) {
    sample_inputs in;
    std::vector<std::vector<tensor_blob>> outs;
    for (std::int64_t k = 0; k < alone_samples; ++k) {
      double ms = 0;
      if (!draw(facts_.dists[static_cast<std::size_t>(k) % facts_.dists.size()], in) || !time_sample(ref_side_, in, outs, ms))
        return false;
      into.push_back(net_ms(ms));
    }
    return true;
  };
  alone.clear();
  if (!time_alone(alone) || (slower(alone) && !time_alone(alone)))
    return false;
  ctx_.baselines.keep(key, alone);
  if (!slower(alone))
    return true;
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "the reference ran %.1f%% slower during this verdict than alone (median %.4f ms against %.4f ms, "
                "beyond the band of %.0f%%): something of the candidate's slowed it, and its speedup cannot be "
                "believed",
                100 * (during / median(alone) - 1), during, median(alone), 100 * opt.reference_band);
  wk_.v_.checks_failed.push_back("runtime:slow_reference");
  set(verdict_status::rejected, buf);
  wk_.v_.correct = true;
  return false;
}

} // namespace crucible::env
