// `crucible eval --set-dir/--pairs`: the set's pairs not yet in --out -> client threads -> the
// evaluator pool (one evaluator per device, each behind a tap that notes the device) -> one
// record per pair appended to --out, a progress line on stderr -> the summary on stdout.
#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "actors/actor_config.hpp"
#include "actors/evaluator.hpp"
#include "core/config.hpp"
#include "core/log.hpp"
#include "core/progress.hpp"
#include "env/eval/evaluator.hpp"
#include "tools/crucible/commands.hpp"
#include "tools/crucible/eval_set.hpp"

namespace crucible::cli::eval_set {

namespace {

namespace fs = std::filesystem;
using steady = std::chrono::steady_clock;

// -- options ----------------------------------------------------------------------------------

struct set_options {
  set_form form = set_form::dir;
  fs::path source;                  ///< --set-dir or --pairs
  std::vector<std::string> devices; ///< distinct, checked
  fs::path out;                     ///< "" : no records file
  bool json = false;
  bool use_cache = true;
  bool verbose = false;
};

// Every --device value, each a device or a comma-separated list of them; the configuration's
// evaluator.devices when none is given.
result<std::vector<std::string>> devices_of(const parsed_args& args, const config& cfg) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  auto given = args.all("--device");
  if (given.empty())
    given = cfg.evaluator.devices;
  for (const auto& value : given) {
    for (std::size_t start = 0;;) {
      auto comma = value.find(',', start);
      auto item = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      auto device = parse_device("--device", item);
      if (!device)
        return device.error();
      if (!seen.insert(*device).second)
        return fail(errc::invalid_arg, "--device ", *device, ": given twice (an evaluator owns its device)");
      out.push_back(*device);
      if (comma == std::string::npos)
        break;
      start = comma + 1;
    }
  }
  return out;
}

result<set_options> options_of(const parsed_args& args, const config& cfg) {
  set_options o;
  if (args.has("--set-dir") == args.has("--pairs"))
    return fail(errc::invalid_arg, "give one of --set-dir DIR and --pairs FILE");
  for (const char* single : {"--task", "--candidate", "--repeat", "--seed"})
    if (args.has(single))
      return fail(errc::invalid_arg, single, " is for one pair; it does not go with ",
                  args.has("--set-dir") ? "--set-dir" : "--pairs");
  if (args.has("--set-dir")) {
    if (args.has("--format"))
      return fail(errc::invalid_arg, "--format is for --pairs; --set-dir reads a folder");
    o.source = args.get("--set-dir");
  } else {
    o.source = args.get("--pairs");
    auto format = args.get("--format");
    if (format.empty()) {
      auto ext = o.source.extension().string();
      std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
      if (ext == ".tsv" || ext == ".txt")
        format = "tsv";
      else if (ext == ".jsonl" || ext == ".json")
        format = "jsonl";
      else
        return fail(errc::invalid_arg, "--pairs ", o.source.string(),
                    ": cannot tell the format from the extension (.tsv or .txt: TSV; .jsonl or .json: JSONL); "
                    "say --format tsv or --format jsonl");
    }
    if (format == "tsv")
      o.form = set_form::tsv;
    else if (format == "jsonl")
      o.form = set_form::jsonl;
    else
      return fail(errc::invalid_arg, "--format ", format, ": expected tsv or jsonl");
  }
  auto devices = devices_of(args, cfg);
  if (!devices)
    return devices.error();
  o.devices = std::move(*devices);
  o.out = args.get("--out");
  if (!o.out.empty()) {
    std::error_code ec;
    if (fs::equivalent(o.out, o.source, ec))
      return fail(errc::invalid_arg, "--out ", o.out.string(), " is the set itself; name another file");
  }
  o.json = args.has("--json");
  o.use_cache = !args.has("--no-cache");
  o.verbose = args.has("--verbose");
  return o;
}

// -- records file -----------------------------------------------------------------------------

/// The --out file, held under an exclusive flock for the whole run (two runs appending to one
/// file would interleave). Whole records are written with one write(2) each. Thread-safe.
class record_file final {
public:
  record_file() = default;
  ~record_file() {
    if (fd_ >= 0)
      ::close(fd_);
  }
  record_file(const record_file&) = delete;
  record_file& operator=(const record_file&) = delete;

  result<void> open(const fs::path& path) {
    path_ = path;
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0)
      return fail(errc::io, "--out ", path.string(), ": cannot open: ", std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0)
      return fail(errc::busy, "--out ", path.string(), ": another crucible eval is writing it");
    return {};
  }
  /// Cuts the file to `bytes` (a dropped last line), then ends an unterminated last line.
  result<void> repair(std::uint64_t bytes, bool newline) {
    if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0)
      return fail(errc::io, "--out ", path_.string(), ": cannot cut the incomplete last line: ", std::strerror(errno));
    return newline ? write("") : result<void>{};
  }
  /// Appends `line` and its '\n'.
  result<void> write(const std::string& line) {
    std::lock_guard guard{mtx_};
    const std::string text = line + "\n";
    for (std::size_t done = 0; done < text.size();) {
      auto n = ::write(fd_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        return fail(errc::io, "--out ", path_.string(), ": cannot write: ", std::strerror(errno));
      done += static_cast<std::size_t>(n);
    }
    return {};
  }
  bool is_open() const noexcept { return fd_ >= 0; }

private:
  std::mutex mtx_;
  fs::path path_;
  int fd_ = -1;
};

// -- progress ---------------------------------------------------------------------------------

/// The progress line on stderr: rewritten in place on a terminal, one line per pair otherwise.
/// Also the outcomes of the set so far (the summary's input). Thread-safe.
class progress final {
public:
  progress(std::size_t total, std::vector<outcome> resumed, std::size_t to_evaluate, double win_threshold)
      : total_(total), outcomes_(std::move(resumed)), resumed_(outcomes_.size()), to_evaluate_(to_evaluate),
        win_threshold_(win_threshold), tty_(::isatty(STDERR_FILENO) == 1) {
    for (const auto& o : outcomes_)
      count(o);
  }

  ~progress() { stop_ticker(); }
  progress(const progress&) = delete;
  progress& operator=(const progress&) = delete;

  /// Marks the start of the evaluations (the ETA's clock). On a terminal the line is redrawn
  /// every second from now on, so that the elapsed time moves while a long evaluation runs.
  void start() {
    std::lock_guard guard{mtx_};
    t0_ = steady::now();
    if (tty_ && !ticker_.joinable())
      ticker_ = std::thread([this] {
        std::unique_lock lock{mtx_};
        while (!ticker_stop_) {
          tick_cv_.wait_for(lock, std::chrono::seconds{1}, [this] { return ticker_stop_; });
          if (!ticker_stop_)
            draw(last_.empty() ? std::string{"waiting for the first verdict"} : last_);
        }
      });
  }

  /// A record was written for `p`; `evaluated`: it took an evaluation (not an error record).
  void done(const set_pair& p, const outcome& o, bool evaluated) {
    std::lock_guard guard{mtx_};
    outcomes_.push_back(o);
    count(o);
    evaluated_ += evaluated ? 1 : 0;
    last_ = label(p) + ": " + describe(o);
    draw(last_);
  }

  /// A message that must not be overwritten by the progress line.
  void note(const std::string& text) {
    std::lock_guard guard{mtx_};
    if (tty_ && drawn_)
      std::fputs("\r\033[K", stderr);
    std::fprintf(stderr, "%s\n", text.c_str());
    drawn_ = false;
    std::fflush(stderr);
  }

  /// Ends the line kept open on a terminal.
  void finish() {
    stop_ticker();
    std::lock_guard guard{mtx_};
    if (tty_ && drawn_)
      std::fputs("\n", stderr);
    drawn_ = false;
    std::fflush(stderr);
  }

  std::vector<outcome> outcomes() const {
    std::lock_guard guard{mtx_};
    return outcomes_;
  }
  std::size_t resumed() const noexcept { return resumed_; }

private:
  void stop_ticker() {
    {
      std::lock_guard guard{mtx_};
      ticker_stop_ = true;
    }
    tick_cv_.notify_all();
    if (ticker_.joinable())
      ticker_.join();
  }

  static std::string label(const set_pair& p) {
    if (p.form == set_form::jsonl)
      return p.task_label + " (line " + std::to_string(p.line) + ")";
    return (p.task.name.empty() ? fs::path(p.task_label).stem().string() : p.task.name) + ": "
           + fs::path(p.candidate_label).filename().string();
  }

  static std::string describe(const outcome& o) {
    std::string out = o.status;
    if (o.status == "ok")
      out += " " + speedup_text(o.speedup);
    if (!o.checks_failed.empty())
      out += " " + o.checks_failed.front();
    if (!o.device.empty())
      out += " on " + o.device;
    return out;
  }

  void count(const outcome& o) {
    if (o.status == "ok" && o.speedup > win_threshold_)
      ++credited_;
    else if (o.status == "rejected")
      ++refused_;
    else if (o.status != "ok")
      ++failed_;
  }

  void draw(const std::string& last) {
    const double elapsed = std::chrono::duration<double>(steady::now() - t0_).count();
    std::string eta = "-";
    if (evaluated_ > 0 && evaluated_ < to_evaluate_)
      eta = duration_text(elapsed / static_cast<double>(evaluated_) * static_cast<double>(to_evaluate_ - evaluated_));
    else if (evaluated_ >= to_evaluate_)
      eta = "0s";
    char head[256];
    std::snprintf(head, sizeof head, "[%zu/%zu] credited %zu, refused %zu, failed %zu | %s elapsed, ETA %s | ",
                  outcomes_.size(), total_, credited_, refused_, failed_, duration_text(elapsed).c_str(), eta.c_str());
    std::string line = head + last;
    if (tty_) {
      winsize ws{};
      if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 && line.size() >= ws.ws_col)
        line.resize(ws.ws_col - 1); // a wrapped line could not be rewritten in place
      std::fprintf(stderr, "\r\033[K%s", line.c_str());
      drawn_ = true;
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
  }

  mutable std::mutex mtx_;
  std::size_t total_;
  std::vector<outcome> outcomes_;
  std::size_t resumed_;
  std::size_t to_evaluate_;
  std::size_t evaluated_ = 0;
  std::size_t credited_ = 0, refused_ = 0, failed_ = 0;
  double win_threshold_;
  bool tty_;
  bool drawn_ = false;
  std::string last_;                  // what the line says of the last pair recorded
  steady::time_point t0_ = steady::now();
  std::condition_variable tick_cv_;   // the ticker is told to stop
  bool ticker_stop_ = false;
  std::thread ticker_;                // terminal only: redraws the line every second
};

// -- devices ----------------------------------------------------------------------------------

/// Which devices measured each candidate, in the order their verdicts arrived: the pool's
/// verdict does not say, and a large speedup is measured on a second device of the same kind.
/// Filled by the taps, read once per pair. Thread-safe.
class device_ledger final {
public:
  void add(variant_id v, const std::string& device) {
    std::lock_guard guard{mtx_};
    seen_[v.value].push_back(device);
  }
  std::vector<std::string> take(variant_id v) {
    std::lock_guard guard{mtx_};
    auto it = seen_.find(v.value);
    if (it == seen_.end())
      return {};
    auto out = std::move(it->second);
    seen_.erase(it);
    return out;
  }

private:
  std::mutex mtx_;
  std::map<std::uint64_t, std::vector<std::string>> seen_;
};

/// An evaluator as the pool sees it, in front of one device's evaluator actor (linked to it):
/// passes each candidate on, and notes the device in the ledger as its verdict comes back.
evaluator_actor::behavior_type device_tap(evaluator_actor::pointer self, evaluator_actor inner, device_info info,
                                          std::string device, std::shared_ptr<device_ledger> ledger) {
  self->link_to(inner);
  return {
    [=](candidate& c) -> caf::result<verdict> {
      auto rp = self->make_response_promise<verdict>();
      const auto id = c.variant;
      self->request(inner, caf::infinite, std::move(c))
        .then(
          [=](verdict& v) mutable {
            ledger->add(id, device);
            rp.deliver(std::move(v));
          },
          [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
      return rp;
    },
    [=](caf::get_atom) -> device_info { return info; },
  };
}

// The catalogue key of a pair's task: distinct for distinct sources of one name.
task_id catalog_key(const set_pair& p) {
  return task_id{p.task.name + "@" + p.task.sha256};
}

// -- evaluation -------------------------------------------------------------------------------

/// Evaluates `todo` (pairs of `set` without a record and without a problem) through the pool;
/// records each verdict. Returns the number of pairs that got no verdict, or an error when no
/// evaluator could be started (exit 1).
result<std::size_t> evaluate(const config& cfg, const set_options& o, const std::vector<const set_pair*>& todo,
                             record_file& out, progress& prog) {
  system_clock clk;
  logger log{clk, o.verbose ? log_level::debug : log_level::warn};
  auto tasks = std::make_shared<task_catalog>();
  for (const auto* p : todo)
    tasks->emplace(catalog_key(*p), p->task);

  actor_config acfg;
  acfg.set("logger.file-verbosity", caf::atom("quiet"));
  if (cfg.actors.threads > 0)
    acfg.set("scheduler.max-threads", static_cast<std::size_t>(cfg.actors.threads));
  caf::actor_system sys{acfg};
  std::vector<caf::actor> actors; // for shutdown
  auto ledger = std::make_shared<device_ledger>();
  std::vector<evaluator_actor> taps;
  std::string names;
  // The devices' warm pools start together; each pool starts its zygote on a thread of its own
  // that lives as long as the pool (PR_SET_PDEATHSIG is per thread).
  auto evaluators = env::make_device_evaluators(cfg.evaluator, cfg.reward, o.devices, log,
                                                o.use_cache ? env::verdict_cache_use::configured
                                                            : env::verdict_cache_use::none);
  if (!evaluators)
    return evaluators.error();
  auto& made = *evaluators;
  for (std::size_t i = 0; i < o.devices.size(); ++i) {
    const auto& device = o.devices[i];
    auto info = device_info_of(*made[i], device_index(device));
    names += (names.empty() ? "" : ", ") + device + " (" + info.name + ")";
    std::shared_ptr<env::device_evaluator> shared{std::move(made[i])};
    auto ev = spawn_evaluator(sys, evaluator_deps{shared, tasks, info, cfg.evaluator.concurrency});
    auto tap = sys.spawn(device_tap, ev, info, device, ledger);
    actors.push_back(caf::actor_cast<caf::actor>(ev));
    actors.push_back(caf::actor_cast<caf::actor>(tap));
    taps.push_back(tap);
  }
  // The pool balances by queue length and re-measures a large speedup on a second device of
  // the same kind, as it does for training. Each client thread has one pair in flight; the
  // evaluators get one more than they run at once, so a runner never waits for the next.
  auto popt = evaluator_pool_options::from(cfg);
  popt.slots_per_evaluator = std::max<std::int64_t>(2, cfg.evaluator.concurrency + 1);
  const auto clients = std::min<std::size_t>(todo.size(), taps.size() * static_cast<std::size_t>(popt.slots_per_evaluator));
  popt.max_pending = static_cast<std::int64_t>(2 * clients + 16);
  auto pool = spawn_evaluator_pool(sys, taps, popt);
  actors.push_back(caf::actor_cast<caf::actor>(pool));
  auto stop_all = [&] {
    for (auto& a : actors)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  };
  prog.note("crucible eval: " + std::to_string(todo.size()) + " pair" + (todo.size() == 1 ? "" : "s") + " to evaluate on "
            + names);
  prog.start();

  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> recorded{0};
  std::atomic<bool> stop{false};
  auto client = [&] {
    caf::scoped_actor self{sys};
    while (!stop) {
      const auto i = next.fetch_add(1);
      if (i >= todo.size())
        return;
      const auto& p = *todo[i];
      candidate c{variant_id{p.index}, catalog_key(p), p.candidate, "", false};
      self->request(pool, caf::infinite, std::move(c))
        .receive(
          [&](verdict& v) {
            auto line = record_json(p, v, ledger->take(variant_id{p.index}));
            auto rec = parse_record(line);
            if (auto w = out.is_open() ? out.write(line) : result<void>{}; !w) {
              prog.note("crucible eval: " + w.error().message + "; stopping");
              stop = true;
              return;
            }
            ++recorded;
            prog.done(p, rec->second, true);
          },
          [&](caf::error& e) {
            prog.note("crucible eval: pair " + std::to_string(p.index) + " (" + p.candidate_label
                      + ") got no verdict: " + to_error(e).to_string());
          });
    }
  };
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < clients; ++i)
    threads.emplace_back(client);
  for (auto& t : threads)
    t.join();
  stop_all();
  // Pairs without a verdict, and pairs never sent once a failed write stopped the run.
  return todo.size() - recorded.load();
}

} // namespace

int run(const parsed_args& args, const config& cfg) {
  const auto t0 = steady::now();
  auto opts = options_of(args, cfg);
  if (!opts) {
    std::fprintf(stderr, "crucible eval: %s\n", opts.error().message.c_str());
    return exit_usage;
  }
  const auto& o = *opts;
  auto set = o.form == set_form::dir     ? load_set_dir(o.source)
             : o.form == set_form::tsv   ? load_pairs_tsv(o.source)
                                         : load_pairs_jsonl(o.source);
  if (!set) {
    std::fprintf(stderr, "crucible eval: %s\n", set.error().message.c_str());
    return exit_usage;
  }
  for (const auto& w : set->warnings)
    std::fprintf(stderr, "crucible eval: warning: %s\n", w.c_str());

  // Records of an earlier run of this set: those pairs are skipped.
  record_file out;
  out_file earlier;
  if (!o.out.empty()) {
    if (auto opened = out.open(o.out); !opened) {
      std::fprintf(stderr, "crucible eval: %s\n", opened.error().message.c_str());
      return exit_usage;
    }
    auto read = read_out_file(o.out);
    if (!read) {
      std::fprintf(stderr, "crucible eval: --out %s\n", read.error().message.c_str());
      return exit_usage;
    }
    earlier = std::move(*read);
    for (const auto& w : earlier.warnings)
      std::fprintf(stderr, "crucible eval: warning: %s\n", w.c_str());
    if (auto repaired = out.repair(earlier.keep_bytes, earlier.needs_newline); !repaired) {
      std::fprintf(stderr, "crucible eval: %s\n", repaired.error().message.c_str());
      return exit_failure;
    }
  }
  std::vector<outcome> resumed;
  std::vector<const set_pair*> fresh;
  for (const auto& p : set->pairs) {
    auto it = earlier.records.find(p.identity());
    if (it != earlier.records.end())
      resumed.push_back(it->second);
    else
      fresh.push_back(&p);
  }
  if (!earlier.records.empty() && resumed.empty()) {
    std::fprintf(stderr,
                 "crucible eval: --out %s holds %zu records, none of them a pair of this set; name another file "
                 "(or remove it to start over)\n",
                 o.out.c_str(), earlier.records.size());
    return exit_usage;
  }
  if (earlier.records.size() > resumed.size())
    std::fprintf(stderr, "crucible eval: warning: --out %s: %zu records are not pairs of this set (left as they are)\n",
                 o.out.c_str(), earlier.records.size() - resumed.size());
  if (!resumed.empty())
    std::fprintf(stderr, "crucible eval: %zu of %zu pairs already recorded in %s: skipped\n", resumed.size(),
                 set->pairs.size(), o.out.c_str());

  std::vector<const set_pair*> todo;
  for (const auto* p : fresh)
    if (p->problem.empty())
      todo.push_back(p);
  progress prog{set->pairs.size(), std::move(resumed), todo.size(), cfg.evaluator.win_threshold};
  // Pairs whose files are bad get their error records first; they need no evaluator.
  for (const auto* p : fresh) {
    if (p->problem.empty())
      continue;
    prog.note("crucible eval: warning: " + p->origin + ": " + p->problem + " (recorded as an error)");
    auto line = error_record_json(*p);
    if (out.is_open())
      if (auto w = out.write(line); !w) {
        prog.note("crucible eval: " + w.error().message);
        return exit_failure;
      }
    prog.done(*p, parse_record(line)->second, false);
  }
  std::size_t lost = 0;
  int rc = exit_ok;
  if (!todo.empty()) {
    auto evaluated = evaluate(cfg, o, todo, out, prog);
    if (!evaluated) {
      prog.note("crucible eval: " + evaluated.error().message);
      return exit_failure;
    }
    lost = *evaluated;
  }
  prog.finish();
  auto outcomes = prog.outcomes();
  auto s = summarize(outcomes, set->pairs.size(), cfg.evaluator.win_threshold);
  s.resumed = prog.resumed();
  s.evaluated = outcomes.size() - s.resumed;
  s.wall_s = std::chrono::duration<double>(steady::now() - t0).count();
  if (o.json)
    std::printf("%s\n", summary_json(s, o.out.string()).c_str());
  else
    std::fputs(summary_table(s, o.out.string()).c_str(), stdout);
  std::fflush(stdout);
  if (lost > 0) {
    std::fprintf(stderr, "crucible eval: %zu pair%s got no verdict; run the same command again to evaluate %s\n", lost,
                 lost == 1 ? "" : "s", lost == 1 ? "it" : "them");
    rc = exit_failure;
  }
  return rc;
}

} // namespace crucible::cli::eval_set
