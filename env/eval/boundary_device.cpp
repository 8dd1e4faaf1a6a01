// The trust boundary's CUDA half (docs/evaluator.md, Trust boundary): the workers' device memory
// mapped into this process (each allocation held by the worker that exported it), a trial's inputs
// copied from the reference's worker into the candidate's on the device, a timing round's drawn
// inputs kept, and a timed sample closed by the device clock (env/eval/device/device_clock.cu).
// Methods of evaluation (env/eval/evaluation.hpp), beside env/eval/boundary.cpp's.
#include "env/eval/boundary_outputs.hpp"
#include "env/eval/boundary.hpp"
#include "env/eval/worker_messages.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

namespace crucible::env {

using clock_type = std::chrono::steady_clock;

namespace {

// The workers' allocations this process has mapped, by their mapping's address, with the worker
// whose they are: two workers' handles that open the same allocation (the driver maps an
// allocation once per process) mean one named the other's memory. Process-wide: the evaluations
// of one evaluator share its CUDA context.
struct mapping_owners {
  std::mutex mtx;
  std::map<const void*, std::pair<pid_t, int>> owners; // owner, mappings held
};
mapping_owners& owners() {
  static mapping_owners m;
  return m;
}

// What keeps a mapping registered in owners() while it lives. The mapping is handed out through
// an aliasing pointer, so it keeps its own type (a device agent's memory stays the agent's:
// env/eval/device/device_agent.hpp routes by it).
class mapping_registration final {
public:
  explicit mapping_registration(std::shared_ptr<device_bytes> m) : m_{std::move(m)} {}
  ~mapping_registration() {
    auto& o = owners();
    std::lock_guard guard{o.mtx};
    if (auto it = o.owners.find(m_->data()); it != o.owners.end() && --it->second.second <= 0)
      o.owners.erase(it);
  }
  mapping_registration(const mapping_registration&) = delete;
  mapping_registration& operator=(const mapping_registration&) = delete;
  const std::shared_ptr<device_bytes>& mapping() const noexcept { return m_; }

private:
  std::shared_ptr<device_bytes> m_;
};

} // namespace

bool boundary::pass_trial_inputs_on_device(worker& cw, std::size_t trial, bool may_defer) {
  // The reference's worker draws the trial's inputs again, from the seed and distribution the
  // reference got them from, into its draw allocation; it stays stopped while they are copied
  // from there into the room the candidate's worker makes for them. No byte crosses a socket (a
  // task's inputs may be gigabytes; the phases that carried three trials of 6.4 GB as host bytes
  // took 68 of a 143 s verdict).
  worker& rw = *wk_.w_.proc;
  const auto& t = facts_.trial_inputs.at(trial);
  auto broke = [&](worker& w, const std::string& what) {
    if (&w == &rw)
      wk_.end_.evaluator_failed = true; // the reference's worker: not the candidate's doing
    set(verdict_status::runtime_error, std::string{who(w)} + " broke the protocol: " + what);
    return false;
  };
  // The candidate's worker first: the trial's description (as the reference's worker sent it),
  // then its room for the inputs, or (`may_defer`, a trial after the first) `later`: it asks for
  // them when that trial runs (pass_later_trial_input), and none are drawn now.
  wire::node room;
  worker_message room_msg;
  if (!send(cw, t.msg.json) || !receive(cw, ctx_.opt.load_timeout_s, "making room for a trial's inputs", room, room_msg))
    return false;
  if (may_defer && room["type"].as<std::string>() == "later") {
    later_.push_back(trial);
    return true;
  }
  wire::node n;
  worker_message msg;
  if (!request_draw(1, t.dist, t.seed, "drawing a trial's inputs again", "a trial, drawn again", n, msg))
    return false;
  const auto& drawn = n["sets"][0];
  if (const auto again = n["digest"].as<std::string>(""); again != t.digest) {
    // Not the candidate's doing, nor the evaluator's: a task whose inputs depend on more than the
    // seed cannot be judged across the boundary.
    set(verdict_status::runtime_error, "the task's get_inputs() gave other inputs from the same seed when drawn again for the "
                                       "candidate (digest " + again + " against " + t.digest
                                       + "): its inputs depend on more than the seed");
    return false;
  }
  if (room["type"].as<std::string>() != "staging" || !room["inputs"].is_list()
      || room["inputs"].size() != drawn.size())
    return broke(cw, "expected room for a trial's " + std::to_string(drawn.size()) + " inputs");
  std::shared_ptr<device_bytes> from, to;
  std::vector<std::shared_ptr<device_bytes>> spans; // kept alive until the copies are done
  std::vector<device_copy> copies;
  for (std::size_t i = 0; i < drawn.size(); ++i) {
    const auto& src = drawn[i];
    const auto& dst = room["inputs"][i];
    if (src["value"].defined() || src["bytes"].as<std::uint64_t>(0) == 0)
      continue;
    const auto bytes = src["bytes"].as<std::uint64_t>(0);
    if (dst["bytes"].as<std::uint64_t>(0) != bytes)
      return broke(cw, "room of " + std::to_string(dst["bytes"].as<std::uint64_t>(0)) + " bytes for input "
                         + std::to_string(i) + " of " + std::to_string(bytes));
    if (!from) {
      auto mapped = map_handle(rw, n["ipc"].as<std::string>(""));
      if (!mapped)
        return broke(rw, "its drawn inputs cannot be mapped: " + mapped.error().message);
      from = std::move(*mapped);
      mapped = map_handle(cw, room["ipc"].as<std::string>(""));
      if (!mapped)
        return broke(cw, "its room for a trial's inputs cannot be mapped: " + mapped.error().message);
      to = std::move(*mapped);
    }
    auto a = subspan(from, src["offset"].as<std::uint64_t>(0), bytes, 1);
    if (!a)
      return broke(rw, "a drawn input: " + a.error().message);
    auto b = subspan(to, dst["offset"].as<std::uint64_t>(0), bytes, 1);
    if (!b)
      return broke(cw, "its room for input " + std::to_string(i) + ": " + b.error().message);
    copies.push_back({b->get(), a->get()});
    spans.push_back(std::move(*a));
    spans.push_back(std::move(*b));
  }
  if (auto r = copy_all(copies); !r) {
    wk_.end_.evaluator_failed = true;
    set(verdict_status::runtime_error, "cannot copy a trial's inputs: " + r.error().message);
    return false;
  }
  return send(cw, worker_msg::command("copied"));
}

bool boundary::draw_on_device(worker& rw, const wire::node& n, sample_inputs& in) {
  // On a CUDA device the reference's worker leaves the round's tensors in one allocation of its
  // own and names them: this process maps it (dev_.staged holds the inputs' spans there) and
  // copies from it into each worker's buffers inside its clock (time_sample_device). No copy of
  // its own: the reference's worker writes there only at its next draw, and a copy of a task's
  // inputs in this process too ran KernelBench's 45_Average_Pooling_2D (17.2 GB) out of an
  // H200's memory. `in` keeps one empty entry per input (the bytes are on the device).
  auto broke = [&](const std::string& what) {
    set(verdict_status::runtime_error, "the reference's worker broke the protocol: " + what);
    return false;
  };
  std::shared_ptr<device_bytes> whole;
  if (n["ipc"].defined()) {
    auto m = map_handle(rw, n["ipc"].as<std::string>(""));
    if (!m)
      return broke("its drawn inputs cannot be mapped: " + m.error().message);
    whole = std::move(*m);
  }
  dev_.staged.resize(n["sets"].size());
  std::size_t c = 0;
  for (const auto& set_node : n["sets"]) {
    auto& staged = dev_.staged[c++];
    staged.resize(set_node.size());
    in.emplace_back(set_node.size());
    std::size_t i = 0;
    for (const auto& d : set_node) {
      auto& st = staged[i++];
      if (d["value"].defined()) {
        st.reset();
        continue;
      }
      const auto bytes = d["bytes"].as<std::uint64_t>(0);
      if (bytes == 0) {
        st.reset();
        continue;
      }
      if (!whole)
        return broke("a drawn input without the allocation that holds it");
      auto sp = subspan(whole, d["offset"].as<std::uint64_t>(0), bytes, 1);
      if (!sp)
        return broke("a drawn input: " + sp.error().message);
      st = std::move(*sp);
    }
  }
  return true;
}

std::string boundary::mapping_key(const worker& w, const std::string& handle) {
  return std::to_string(w.pid()) + ":" + handle;
}

result<std::shared_ptr<device_bytes>> boundary::map_handle(worker& w, const std::string& handle) {
  const auto key = mapping_key(w, handle);
  if (auto it = dev_.mapped.find(key); it != dev_.mapped.end())
    return it->second;
  auto m = map_allocation(wk_.cuda_device_, handle);
  if (!m)
    return m.error();
  {
    auto& o = owners();
    std::lock_guard guard{o.mtx};
    auto [it, fresh] = o.owners.try_emplace((*m)->data(), w.pid(), 0);
    if (!fresh && it->second.first != w.pid())
      return fail(errc::protocol, "names an allocation of another worker's");
    ++it->second.second;
  }
  auto registration = std::make_shared<mapping_registration>(std::move(*m));
  auto kept = std::shared_ptr<device_bytes>{registration, registration->mapping().get()};
  dev_.mapped.emplace(key, kept);
  return kept;
}

std::vector<device_copy> boundary::input_copies(const side& s) const {
  std::vector<device_copy> copies;
  for (std::size_t c = 0; c < s.sets.size() && c < dev_.staged.size(); ++c)
    for (std::size_t i = 0; i < s.sets[c].size() && i < dev_.staged[c].size(); ++i)
      if (s.sets[c][i].span && dev_.staged[c][i])
        copies.push_back({s.sets[c][i].span.get(), dev_.staged[c][i].get()});
  return copies;
}

bool boundary::time_sample_device(side& s, const sample_inputs& in, std::vector<std::vector<tensor_blob>>& outs,
                                    double& ms, bool null) {
  const auto& opt = ctx_.opt;
  worker& w = *s.proc;
  const bool candidate = &w == wk_.cand_.proc.get();
  wire::node n;
  worker_message msg;
  auto broke = [&](const std::string& what) {
    set(verdict_status::runtime_error, std::string{who(w)} + " broke the protocol: " + what);
    return false;
  };
  auto device_failed = [&](const std::string& what, const error& e) {
    wk_.end_.evaluator_failed = true;
    set(verdict_status::runtime_error, what + ": " + e.message);
    return false;
  };
  if (!prime(w))
    return false;
  // The empty sample (null) has no inputs of its own: every step as below, one tiny kernel for the
  // calls, the copies of the reference's last outputs for the outputs' copies.
  if (!null && (in.size() != s.sets.size() || dev_.staged.size() != in.size()))
    return broke("input buffers for " + std::to_string(s.sets.size()) + " calls, the sample has " + std::to_string(in.size()));
  for (std::size_t c = 0; c < in.size() && !null; ++c) {
    if (in[c].size() != s.sets[c].size() || dev_.staged[c].size() != in[c].size())
      return broke("input buffers for " + std::to_string(s.sets[c].size()) + " inputs, the task has " + std::to_string(in[c].size()));
    for (std::size_t i = 0; i < in[c].size(); ++i) {
      const auto& b = s.sets[c][i];
      const std::uint64_t bytes = dev_.staged[c][i] ? dev_.staged[c][i]->size() : 0; // draw_on_device's
      if (!b.value && (b.bytes != bytes || (b.bytes > 0 && !b.span)))
        return broke("an input buffer of " + std::to_string(b.bytes) + " bytes for an input of " + std::to_string(bytes));
    }
  }
  const auto copies = input_copies(s);
  const auto t_flush = clock_type::now();
  // The device's cache is flushed by this process (the worker's own flush would be the
  // candidate's to skip), before the clock starts.
  if (auto r = flush_device_cache(wk_.cuda_device_, flush_bytes_of(opt.flush_bytes, kind_of(ctx_.device))); !r)
    return device_failed("cannot flush the device's cache", r.error());
  // The clock (device_clock): queued here and held, the start event, this process's copies of the
  // sample's inputs into the worker's buffers and the write of the go word its stream waits for
  // before its calls (nothing of the worker's, a kernel left running on the device included, can
  // see the inputs before the clock starts); after the worker has queued its calls, a wait for
  // its done word, this process's copies of its outputs and the stop event. Let go, the device runs it all
  // back to back: an output still being written when the copies run is copied as it is then, and
  // fails the comparison; work that does not write the outputs gains nothing here, and what it
  // does to the other side's samples is the reference-alone check's to see. The host's round
  // trips are outside the clock; a call that waits for the device inside (the queue full, a
  // value read back) is let go after 20 ms, and then its launches from there on are inside.
  const double flush_ms = ms_since(t_flush);
  const auto words = dev_.words.find(w.pid());
  if (words == dev_.words.end())
    return broke("it has no clock words");
  const auto seq = ++words->second.seq;
  if (auto r = dev_.clock->arm(copies, *words->second.go, seq); !r)
    return device_failed("cannot start the device clock", r.error());
  // A sample that ends early: its work let go and waited for (c cleared once finished below).
  struct finishing {
    device_clock* c;
    ~finishing() {
      if (c != nullptr)
        (void) c->finish(5.0);
    }
  } held{dev_.clock.get()};
  bool released = false;
  if (!thaw(w))
    return false;
  const auto t_in = clock_type::now();
  const std::function<void()> nudge = [&] {
    released = true;
    dev_.clock->let_go();
  };
  wk_.clock_running_ = true;
  const bool answered = send(w, worker_msg::launch(seq, null)) && receive(w, opt.run_timeout_s, "timing", n, msg, 0.02, nudge);
  wk_.clock_running_ = false;
  if (!answered)
    return false;
  const auto t_call = clock_type::now();
  // The host's time of the sample, this process's own reading up to `launched` (which holds the
  // outputs' descriptions): a worker that says it early is stopped before the rest is queued.
  dev_.last_host_ms = std::chrono::duration<double, std::milli>(t_call - t_in).count();
  if (n["type"].as<std::string>() != "launched") {
    (void) freeze(w);
    return broke("expected launched, got " + n["type"].as<std::string>());
  }
  if (null) {
    if (!freeze(w))
      return false;
    // As many of the last reference sample's outputs as a sample of this count of calls has: that
    // sample may have held more calls (a verdict that goes on with one call per sample measures
    // its empty sample again before a reference sample of one call exists).
    std::vector<const device_bytes*> srcs;
    const auto per_call = dev_.last_ref_calls == 0 ? 0 : dev_.last_ref_snaps.size() / dev_.last_ref_calls;
    for (std::size_t i = 0; i < dev_.last_ref_snaps.size() && i < per_call * s.sets.size(); ++i)
      srcs.push_back(dev_.last_ref_snaps[i].get());
    auto snaps = dev_.clock->close(*words->second.done, seq, srcs);
    held.c = nullptr;
    auto device_ms = dev_.clock->finish(opt.run_timeout_s);
    if (!snaps || !device_ms)
      return device_failed("cannot time an empty sample", snaps ? device_ms.error() : snaps.error());
    ms = *device_ms; // the whole sample's
    return true;
  }
  const auto& list = n["outputs"];
  if (!list.is_list() || list.size() != in.size()) {
    (void) freeze(w);
    return broke("outputs for a different number of calls");
  }
  outs.assign(in.size(), {});
  std::vector<output_desc> descs;
  std::vector<std::size_t> desc_call, desc_index;
  std::vector<std::shared_ptr<device_bytes>> spans;
  for (std::size_t c = 0; c < in.size(); ++c) {
    for (const auto& d : list[c]) {
      tensor_blob b;
      if (d["kind"].defined()) {
        b.kind = d["kind"].as<std::string>();
        outs[c].push_back(std::move(b));
        continue;
      }
      output_desc o;
      if (auto wrong = parse_output(d, o); !wrong.empty()) {
        (void) freeze(w);
        return broke(wrong);
      }
      const auto k = outs[c].size();
      if (candidate && refuse_unlike_trials(k, o.blob)) {
        (void) freeze(w);
        return false;
      }
      if (candidate && !o.contiguous) {
        (void) freeze(w);
        return refuse_layout(k);
      }
      if (o.span > 0) {
        if (!d["ipc"].defined()) {
          (void) freeze(w);
          return broke("a device output without its handle");
        }
        const auto handle = d["ipc"].as<std::string>("");
        // A first mapping of an allocation may wait for this process's device work, the held
        // clock's too: let go first (that sample's host latencies are then inside its window).
        if (dev_.mapped.count(mapping_key(w, handle)) == 0 && !released)
          nudge();
        auto whole = map_handle(w, handle);
        if (!whole) {
          (void) freeze(w);
          if (candidate && whole.error().code == errc::protocol) {
            wk_.v_.checks_failed.push_back("runtime:foreign_memory");
            set(verdict_status::rejected, "timing round " + std::to_string(split_.round_no) + ": the candidate's output "
                                            + std::to_string(k) + " " + whole.error().message
                                            + ": its outputs must be memory of its own");
            return false;
          }
          return broke("its output " + std::to_string(k) + " cannot be mapped: " + whole.error().message);
        }
        auto sp = subspan(*whole, d["offset"].as<std::uint64_t>(0), o.span, element_size(o.blob.type));
        if (!sp) {
          (void) freeze(w);
          return broke("its output " + std::to_string(k) + ": " + sp.error().message);
        }
        spans.push_back(std::move(*sp));
        desc_call.push_back(c);
        desc_index.push_back(k);
      }
      outs[c].push_back(o.blob);
      if (o.span > 0) // one description per span, in the same order
        descs.push_back(std::move(o));
    }
  }
  // Stopped before the clock is let go: no thread of the worker's queues more work meanwhile.
  if (!freeze(w))
    return false;
  std::vector<const device_bytes*> srcs;
  for (const auto& sp : spans)
    srcs.push_back(sp.get());
  const auto t_close = clock_type::now();
  auto snaps = dev_.clock->close(*words->second.done, seq, srcs);
  if (!snaps)
    return device_failed(std::string{"cannot copy the outputs of "} + who(w), snaps.error());
  held.c = nullptr; // finished below, not twice
  auto device_ms = dev_.clock->finish(opt.run_timeout_s);
  if (!device_ms && device_ms.error().code == errc::timeout) {
    set(verdict_status::timeout, std::string{who(w)} + ": " + device_ms.error().message + " (timing)");
    return false;
  }
  if (!device_ms)
    return device_failed("cannot read the device clock", device_ms.error());
  auto& l = dev_.laps[candidate ? 1 : 0];
  l[0].push_back(dev_.last_host_ms);
  l[1].push_back(*device_ms);
  l[2].push_back(released ? 1.0 : 0.0);
  l[3].push_back(flush_ms);
  l[4].push_back(ms_since(t_close));
  if (const auto q = n["queued_us"].as<double>(-1); q >= 0 && std::isfinite(q))
    l[6].push_back(q / 1e3);
  l[5].push_back(0);
  lap_into checks_lap{l[5].back()}; // the checks below, however they end
  // The device's time alone: the calls are queued before the window opens. Counting the host's
  // `launch` to `launched` where it was longer (less an empty sample's) widened the bands of
  // CUDA-L1's level 2 pairs about tenfold on an H200 and was withdrawn (docs/PERFORMANCE.md,
  // eleventh measurement).
  ms = *device_ms / static_cast<double>(in.size());
  // Where the outputs lie, in this process's mappings: one allocation is mapped once, so two
  // spans that overlap here are the same memory.
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
  for (const auto& sp : spans) {
    const auto a = reinterpret_cast<std::uintptr_t>(sp->data());
    ranges.emplace_back(a, a + sp->size());
  }
  for (std::size_t r = 0; r < spans.size(); ++r) {
    const auto c = desc_call[r];
    const auto k = desc_index[r];
    if (candidate && may_not_alias(k))
      for (const auto& ib : s.sets[c])
        if (!ib.value && ib.span) {
          const auto a = reinterpret_cast<std::uintptr_t>(ib.span->data());
          if (ranges[r].first < a + ib.span->size() && a < ranges[r].second)
            return refuse_aliased(k);
        }
    auto& b = outs[c][k];
    const auto& o = descs[r];
    if (o.contiguous) {
      b.device = (*snaps)[r];
    } else {
      auto raw = download(*(*snaps)[r]);
      if (!raw)
        return device_failed("cannot copy an output to the host", raw.error());
      b.bytes = gather(o, raw->data());
    }
  }
  for (std::size_t i = 0; i < ranges.size() && !split_.outputs_reused; ++i)
    for (std::size_t j = i + 1; j < ranges.size(); ++j)
      if (desc_call[i] != desc_call[j] && ranges[i].first < ranges[j].second && ranges[j].first < ranges[i].second) {
        split_.outputs_reused = true;
        break;
      }
  if (!candidate) {
    dev_.last_ref_snaps = std::move(*snaps);
    dev_.last_ref_calls = in.size();
    return true;
  }
  // Its inputs, compared with what this process wrote there (runtime:input_mutation).
  std::vector<device_comparison> same;
  for (const auto& cp : copies)
    same.push_back({cp.src, cp.dst, dtype::u8, cp.src->size(), tolerance{0, 0}, 0});
  if (!same.empty()) {
    auto diffs = device_compare_all(same);
    if (!diffs)
      return device_failed("cannot read the candidate's inputs back", diffs.error());
    for (const auto& d : *diffs)
      if (d.mismatches != 0)
        return refuse_input_mutation();
  }
  // Its outputs, copied, are overwritten with 0xFF bytes (NaN for floats) where they lie: an
  // output handed back again without being computed again fails the next comparison.
  if (auto r = fill_all(srcs, 0xFF); !r)
    return device_failed("cannot overwrite the candidate's outputs", r.error());
  return true;
}

bool boundary::setup_clock(side& s) {
  worker& w = *s.proc;
  if (dev_.words.count(w.pid()) != 0)
    return true;
  if (!dev_.clock) {
    auto c = make_device_clock(wk_.cuda_device_, ctx_.opt.cuda_clock_poll ? clock_close::poll : clock_close::wait);
    if (!c) {
      wk_.end_.evaluator_failed = true;
      set(verdict_status::runtime_error, "cannot make the device clock: " + c.error().message);
      return false;
    }
    dev_.clock = std::move(*c);
  }
  wire::node n;
  worker_message msg;
  if (!thaw(w) || !send(w, worker_msg::command("clock")) || !receive(w, ctx_.opt.run_timeout_s, "setting up the clock", n, msg)
      || !freeze(w))
    return false;
  auto broke = [&](const std::string& what) {
    set(verdict_status::runtime_error, std::string{who(w)} + " broke the protocol: " + what);
    return false;
  };
  if (n["type"].as<std::string>() != "clock" || !n["ipc"].is_scalar() || !n["offset"].is_scalar())
    return broke("expected its clock words");
  // Its two words, 128 bytes apart in its own memory: go at the offset, done after it.
  auto whole = map_handle(w, n["ipc"].as<std::string>(""));
  if (!whole)
    return broke("its clock words cannot be mapped: " + whole.error().message);
  const auto offset = n["offset"].as<std::uint64_t>(0);
  auto go = subspan(*whole, offset, 4, 4);
  auto done = subspan(*whole, offset + 128, 4, 4);
  if (!go || !done)
    return broke("its clock words lie outside their allocation");
  dev_.words[w.pid()] = clock_words{std::move(*go), std::move(*done), 0};
  return true;
}

} // namespace crucible::env
