#include "actors/run_roles.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <thread>

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>

#include "actors/endpoint_engine.hpp"
#include "actors/engine.hpp"
#include "actors/evaluator.hpp"
#include "actors/learner.hpp"
#include "actors/learner_group.hpp"
#include "actors/rollout.hpp"
#include "core/file_io.hpp"
#include "core/json.hpp"
#include "core/json_parse.hpp"
#include "core/sha256.hpp"
#include "core/progress.hpp"
#include "env/eval/evaluator.hpp"
#include "env/task.hpp"
#include "env/eval/verdict_cache.hpp"
#include "text/bpe_trainer.hpp"
#include "policy/training/checkpoint.hpp"
#include "policy/distributed/collective.hpp"
#include "policy/model/engine.hpp"
#include "policy/training/learner.hpp"
#include "policy/memory_plan.hpp"
#include "policy/model/model.hpp"
#include "policy/model/model_config.hpp"
#include "policy/runtime.hpp"
#include "policy/model/safetensors.hpp"
#include "text/tokenizer.hpp"
#include "policy/distributed/weight_handoff.hpp"

namespace fs = std::filesystem;

namespace crucible {

namespace {

constexpr std::string_view component = "run";

// Files below a corpus path: the file itself, or the regular files of a directory tree (hidden
// entries skipped), sorted.
result<std::vector<fs::path>> corpus_files(const fs::path& root) {
  std::error_code ec;
  std::vector<fs::path> out;
  if (fs::is_regular_file(root, ec))
    return std::vector<fs::path>{root};
  if (!fs::is_directory(root, ec))
    return fail(errc::config, "model.tokenizer_corpus: ", root.string(), " is neither a file nor a directory");
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory())
        it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file())
      out.push_back(it->path());
  }
  if (ec)
    return fail(errc::io, root.string(), ": ", ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

fs::path seeds_dir_of(const config& cfg) {
  return cfg.tasks.seeds.empty() ? fs::path{cfg.tasks.suite} / "variants" : fs::path{cfg.tasks.seeds};
}

void exit_all(const std::vector<caf::actor>& actors) {
  for (const auto& a : actors)
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

std::string join_devices(const std::vector<std::string>& devices) {
  std::string out;
  for (const auto& d : devices)
    out += (out.empty() ? "" : ", ") + d;
  return out;
}

// The data-parallel group of a run's learner ranks (learner.devices), formed.
struct learner_ranks {
  std::string backend;                          // "inproc" or "nccl"
  std::shared_ptr<policy::inproc_group> inproc; // inproc: the ranks' group
  std::string nccl_id_hex;                      // nccl: the id the ranks' communicators were made from
  policy::checkpoint_info restored;             // rank 0's, when a checkpoint was restored
};

// Makes every rank's communicator (threads on the CPU, one NCCL rank per GPU from an id made here),
// joins each learner to the group and, given `checkpoint` (a learner directory), restores it on
// every rank. Each step is collective, so each rank runs them on a thread of its own, on its device.
// The error names the rank and device at fault.
result<learner_ranks> form_learner_group(const config& cfg, const std::vector<std::shared_ptr<policy::learner>>& ranks,
                                         const fs::path& checkpoint, logger& log) {
  const int world = static_cast<int>(ranks.size());
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(cfg.learner.collective_timeout_s * 1e3));
  const bool cuda = cfg.learner.devices.front() != "cpu";
  learner_ranks out;
  out.backend = cuda ? "nccl" : "inproc";
  policy::nccl_id id;
  std::shared_ptr<policy::launch_rendezvous> together; // the ranks are threads of this process
  if (cuda) {
    together = policy::launch_rendezvous::create(world, timeout);
    auto made = policy::nccl_id::generate();
    if (!made.ok())
      return fail(made.error().code, "learner.devices: making the NCCL id: ", made.error().message);
    id = *made;
    out.nccl_id_hex = id.to_hex();
  } else {
    out.inproc = policy::inproc_group::create(world, timeout);
  }
  std::vector<result<policy::checkpoint_info>> done(static_cast<std::size_t>(world),
                                                    crucible::error{errc::cancelled, "not run"});
  progress_meter meter{log, "checkpoint", progress_unit::bytes};
  auto form_rank = [&](int r) {
    auto& outcome = done[static_cast<std::size_t>(r)];
    const torch::Device device(cfg.learner.devices[static_cast<std::size_t>(r)]);
    const policy::device_scope on_device(cfg.learner.devices[static_cast<std::size_t>(r)]);
    // Each phase is logged as it ends: a rank that stops early, or a group that hangs in a
    // collective, shows in the log before the timeout names it.
    auto since = std::chrono::steady_clock::now();
    auto phase = [&](const char* what, const crucible::error* e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
      since = std::chrono::steady_clock::now();
      if (e != nullptr)
        log.warn("learner", "rank ", r, " of ", world, " on ", device.str(), ": ", what, " failed after ", s, " s: ",
                 e->message);
      else
        log.debug("learner", "rank ", r, " of ", world, " on ", device.str(), ": ", what, " in ", s, " s");
    };
    auto comm = cuda ? policy::make_nccl_communicator(id, r, world, device.index(), timeout, together) : out.inproc->join(r);
    if (!comm.ok()) {
      outcome = comm.error();
      phase("making the communicator", &comm.error());
      return;
    }
    phase("communicator made", nullptr);
    if (auto j = ranks[static_cast<std::size_t>(r)]->join_data_parallel(*comm); !j.ok()) {
      outcome = j.error();
      phase("joining the data-parallel group", &j.error());
      return;
    }
    phase("joined the data-parallel group (parameters agreed and broadcast, buckets planned)", nullptr);
    // Rank 0's progress is the terminal's (each rank checks and reads the same files).
    policy::checkpoint_progress progress;
    if (r == 0)
      progress = [&](std::string_view what, std::uint64_t done, std::uint64_t total) { meter.update(what, done, total); };
    outcome = checkpoint.empty()
                ? result<policy::checkpoint_info>(policy::checkpoint_info{})
                : policy::load_checkpoint(*ranks[static_cast<std::size_t>(r)], checkpoint, progress);
    if (!checkpoint.empty())
      phase("restoring the checkpoint", outcome.ok() ? nullptr : &outcome.error());
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      // A throw (LibTorch out of memory in the buckets) must not end the process from a thread.
      try {
        form_rank(r);
      } catch (const std::exception& e) {
        // LibTorch's errors without the C++ backtrace they carry.
        const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
        const std::string text = torch_error ? torch_error->what_without_backtrace() : e.what();
        done[static_cast<std::size_t>(r)] = fail(errc::device, text);
        log.warn("learner", "rank ", r, " of ", world, ": ", text);
      }
    });
  for (auto& t : threads)
    t.join();
  // A rank that failed on its own (a checkpoint it cannot read, a device error) leaves the others
  // waiting until they time out, or failing at once when it left the group's launches: its error
  // is the cause, so a timeout or a cancellation is reported only when no rank failed otherwise.
  auto knock_on = [](const crucible::error& e) { return e.code == errc::timeout || e.code == errc::cancelled; };
  int failed = -1;
  for (int r = 0; r < world; ++r)
    if (const auto& d = done[static_cast<std::size_t>(r)]; !d.ok())
      if (failed < 0 || (knock_on(done[static_cast<std::size_t>(failed)].error()) && !knock_on(d.error())))
        failed = r;
  if (failed >= 0) {
    const auto& e = done[static_cast<std::size_t>(failed)].error();
    return fail(e.code, "learner rank ", std::to_string(failed), " of ", std::to_string(world), " on ",
                cfg.learner.devices[static_cast<std::size_t>(failed)], ": ",
                checkpoint.empty() ? "forming the data-parallel group: " : "forming the group and restoring the checkpoint: ",
                e.message);
  }
  out.restored = *done.front();
  return out;
}

} // namespace

fs::path model_dir_of(const config& cfg, const fs::path& run_dir) {
  return cfg.model.dir.empty() ? run_dir / "model" : fs::path{cfg.model.dir};
}

result<void> prepare_model(const config& cfg, const fs::path& run_dir, logger& log) {
  if (!cfg.model.dir.empty()) {
    std::error_code ec;
    if (!fs::exists(fs::path{cfg.model.dir} / "config.json", ec))
      return fail(errc::config, "model.dir: ", cfg.model.dir, " has no config.json (not a Hugging Face model directory)");
    return {};
  }
  const auto dir = run_dir / "model";
  std::error_code ec;
  if (fs::exists(dir / "config.json", ec) && fs::exists(dir / "tokenizer.json", ec))
    return {}; // made by an earlier process of this run
  // The tokenizer, trained on the corpus.
  policy::bpe_train_options topt;
  topt.vocab_size = static_cast<std::size_t>(cfg.model.tokenizer_vocab);
  policy::bpe_trainer trainer{topt};
  if (auto r = trainer.validate(); !r)
    return fail(errc::config, "model.tokenizer_vocab: ", r.error().message);
  std::vector<std::string> roots = cfg.model.tokenizer_corpus;
  if (roots.empty())
    roots = {cfg.tasks.suite, seeds_dir_of(cfg).string()};
  std::size_t files = 0;
  for (const auto& root : roots) {
    std::error_code e2;
    if (!fs::exists(root, e2)) {
      if (cfg.model.tokenizer_corpus.empty())
        continue; // the default seeds folder may not exist
      return fail(errc::config, "model.tokenizer_corpus: ", root, " does not exist");
    }
    auto list = corpus_files(root);
    if (!list.ok())
      return list.error();
    for (const auto& f : *list) {
      if (f.extension() != ".py" && f.extension() != ".md" && f.extension() != ".txt" && f.extension() != ".yaml")
        continue;
      auto r = trainer.feed_file(f);
      if (!r.ok()) {
        if (r.error().code == errc::corrupt)
          continue; // not UTF-8 text
        return r.error();
      }
      ++files;
    }
  }
  if (trainer.bytes_fed() == 0)
    return fail(errc::config, "model.tokenizer_corpus: no text found to train the tokenizer on");
  const auto tmp = run_dir / ".model.tmp";
  fs::remove_all(tmp, ec);
  auto bpe = trainer.train();
  if (auto r = policy::write_tokenizer_dir(bpe, topt, tmp); !r)
    return r.error();
  auto tok = policy::tokenizer::load(tmp);
  if (!tok.ok())
    return tok.error();
  auto family = policy::parse_model_family(cfg.model.family);
  if (!family.ok())
    return fail(errc::config, "model.family: ", family.error().message);
  policy::init_model_options mo;
  mo.dir = tmp;
  mo.preset = cfg.model.init;
  mo.family = *family;
  mo.vocab_size = static_cast<std::int64_t>(tok->vocab_size());
  mo.seed = cfg.run.seed;
  // A published shape is stored as its checkpoints are (bfloat16); the small presets in float32.
  mo.dtype = policy::find_published_model(cfg.model.init) != nullptr ? "bfloat16" : "float32";
  mo.bos_token_id = tok->bos_id();
  if (auto eos = tok->eos_id())
    mo.eos_token_ids = {*eos};
  mo.pad_token_id = tok->pad_id();
  auto mc = policy::init_model(mo);
  if (!mc.ok())
    return mc.error();
  fs::rename(tmp, dir, ec);
  if (ec)
    return fail(errc::io, "cannot rename ", tmp.string(), " to ", dir.string(), ": ", ec.message());
  log.info(component, "fresh model in ", dir.string(), ": tokenizer of ", tok->vocab_size(), " tokens trained on ", files,
           " files, ", cfg.model.family, " preset ", cfg.model.init, " (", mc->parameter_count(), " parameters)");
  return {};
}

result<std::shared_ptr<const task_catalog>> load_task_catalog(const config& cfg) {
  std::error_code ec;
  if (!fs::is_directory(cfg.tasks.suite, ec))
    return fail(errc::config, "tasks.suite: ", cfg.tasks.suite, " is not a directory");
  auto tasks = env::index_tasks(cfg.tasks.suite);
  if (!tasks.ok())
    return tasks.error();
  auto out = std::make_shared<task_catalog>();
  const std::set<std::string> include(cfg.tasks.include.begin(), cfg.tasks.include.end());
  for (auto& t : *tasks)
    if (include.empty() || include.count(t.name) != 0)
      out->emplace(task_id{t.name}, std::move(t));
  for (const auto& name : include)
    if (out->count(task_id{name}) == 0)
      return fail(errc::config, "tasks.include: '", name, "' is not a task of ", cfg.tasks.suite);
  if (out->empty())
    return fail(errc::config, "tasks.suite: ", cfg.tasks.suite, " holds no KernelBench-format task");
  return std::shared_ptr<const task_catalog>(std::move(out));
}

// The task sources a run uses, kept in RUN/tasks/ by content (SHA256.py) with a manifest of
// names (tasks.json). A task is kept the first time the run uses it; from then on (on resume)
// the run goes on with the kept source, whatever the file under tasks.suite holds now: a
// candidate that rewrote a task file (or anyone else) cannot change the rewards of a resumed
// run. A file that changed on disk is reported by name, as is a kept source that no longer
// matches its hash. Which tasks are in the pool is still the configuration's (tasks.include).
result<std::shared_ptr<const task_catalog>> keep_task_sources(const fs::path& run_dir, std::shared_ptr<const task_catalog> suite,
                                                            logger& log) {
  const auto dir = run_dir / "tasks";
  const auto manifest = dir / "tasks.json";
  std::error_code ec;
  std::map<std::string, std::pair<std::string, std::string>> kept; // name -> (sha256, path)
  if (fs::exists(manifest, ec)) {
    auto text = read_file(manifest);
    if (!text)
      return text.error();
    auto doc = parse_json(*text, manifest.string());
    if (!doc)
      return doc.error();
    if (!doc->is_object())
      return fail(errc::corrupt, manifest.string(), ": not a JSON object of task names");
    for (const auto& [name, entry] : doc->as_object()) {
      const auto* sha = entry.find("sha256");
      const auto* path = entry.find("path");
      if (sha == nullptr || !sha->is_string() || path == nullptr || !path->is_string())
        return fail(errc::corrupt, manifest.string(), ": task '", name, "' lacks sha256 or path");
      kept[name] = {sha->as_string(), path->as_string()};
    }
  }
  fs::create_directories(dir, ec);
  if (ec)
    return fail(errc::io, "cannot create ", dir.string(), ": ", ec.message());
  auto out = std::make_shared<task_catalog>();
  bool added = false;
  for (const auto& [id, t] : *suite) {
    auto it = kept.find(id.value);
    if (it == kept.end()) { // first use: keep it
      const auto file = dir / (t.sha256 + ".py");
      if (!fs::exists(file, ec))
        if (auto r = write_file_atomic(file, t.source); !r)
          return r.error();
      kept[id.value] = {t.sha256, t.path.string()};
      added = true;
      out->emplace(id, t);
      continue;
    }
    const auto& [sha, path] = it->second;
    const auto file = dir / (sha + ".py");
    auto source = read_file(file);
    if (!source)
      return fail(errc::corrupt, "the run's kept source of task '", id.value, "' (", file.string(), "): ", source.error().message);
    if (sha256_hex(*source) != sha)
      return fail(errc::corrupt, "the run's kept source of task '", id.value, "' (", file.string(),
                  ") does not match its SHA-256: it was changed after the run kept it");
    if (t.sha256 != sha)
      log.warn(component, "task file ", t.path.string(), " changed since the run first used it; the run goes on with "
               "the source it kept (", file.string(), "), not the file as it is now");
    env::task k = t;
    k.source = std::move(*source);
    k.sha256 = sha;
    out->emplace(id, std::move(k));
  }
  if (added) {
    json_writer w;
    w.begin_object();
    for (const auto& [name, entry] : kept)
      w.key(name).begin_object().field("sha256", entry.first).field("path", entry.second).end_object();
    w.end_object();
    if (auto r = write_file_atomic(manifest, w.str() + "\n"); !r)
      return r.error();
  }
  return std::shared_ptr<const task_catalog>(std::move(out));
}

result<void> check_memory_plan(const config& cfg, std::span<const policy::cuda_device> devices) {
  const auto learners = learner_devices(cfg);
  if (!cfg.learner.memory_check || policy::cuda_index(learners.front()) < 0)
    return {};
  auto o = policy::memory_plan_options_of(cfg);
  if (!o)
    return {};
  // The smallest learner GPU: every rank holds its share of the state (and rank 0 the engine).
  std::string device;
  const policy::cuda_device* smallest = nullptr;
  for (const auto& name : learners) {
    const int index = policy::cuda_index(name); // "cuda" is device 0
    for (const auto& d : devices)
      if (d.index == index && (smallest == nullptr || d.memory_bytes < smallest->memory_bytes))
        smallest = &d, device = name;
  }
  if (smallest == nullptr || smallest->memory_bytes == 0)
    return {}; // a device that is not there is named when the learner loads
  o->gpu_gb = static_cast<double>(smallest->memory_bytes) / 1e9;
  auto plan = policy::plan_memory(*o);
  if (!plan)
    return {};
  auto gb = [](double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
    return std::string{buf};
  };
  // An engine's own GPU holds its weights, staging, KV cache and working set.
  for (const auto& engine : engine_devices_apart(cfg))
    for (const auto& d : devices)
      if (d.index == policy::cuda_index(engine) && d.memory_bytes > 0 &&
          plan->engine_gpu > static_cast<double>(d.memory_bytes))
        return fail(errc::config, "learner.memory_check: the engine's memory plan needs ", gb(plan->engine_gpu),
                    " on ", engine, " of engine.devices (", d.name, "), which has ",
                    gb(static_cast<double>(d.memory_bytes)),
                    " (`crucible memory-plan --config FILE` itemises it). To fit: fewer engine.max_batch_samples, or "
                    "shorter prompt.max_tokens or rollout.max_new_tokens; learner.memory_check: false starts anyway");
  if (plan->fits)
    return {};
  return fail(errc::config, "learner.memory_check: this configuration's memory plan needs ", gb(plan->total),
              " on each learner GPU (learner ", gb(plan->learner_state + plan->learner_peak), ", engine ",
              gb(plan->engine), ", runtime ", gb(plan->runtime),
              plan->evaluator > 0 ? ", the evaluator's workers on " + cfg.model.device + " " + gb(plan->evaluator) : "",
              " for ", o->label, " over ", std::to_string(o->gpus),
              o->gpus == 1 ? " GPU" : " GPUs", o->zero1 ? " with ZeRO-1" : "",
              "; `crucible memory-plan --config FILE` itemises it), but ", device, " (", smallest->name, ") has ",
              gb(static_cast<double>(smallest->memory_bytes)),
              ". To fit: more GPUs in learner.devices with learner.zero1, learner.activation_checkpointing, "
              "learner.lora, or shorter prompt.max_tokens, rollout.max_new_tokens or learner.micro_batch_tokens",
              plan->evaluator > 0 ? ", or fewer evaluator.concurrency and evaluator.warm_workers, or the policy's GPU "
                                    "out of evaluator.devices"
                                  : "",
              "; "
              "learner.memory_check: false starts anyway");
}

namespace {
// check_memory_plan against this machine's GPUs (probed only for a CUDA run).
result<void> check_memory_here(const config& cfg) {
  if (!cfg.learner.memory_check || policy::cuda_index(cfg.model.device) < 0)
    return {};
  return check_memory_plan(cfg, policy::probe_runtime().devices);
}
} // namespace

result<void> check_run_inputs(const config& cfg) {
  if (auto r = check_memory_here(cfg); !r)
    return r;
  auto tasks = load_task_catalog(cfg);
  if (!tasks.ok())
    return tasks.error();
  if (auto seeds = load_seed_variants(seeds_dir_of(cfg), **tasks, cfg.tasks.seed_exclude); !seeds.ok())
    return seeds.error();
  if (cfg.policy.backend == "openai") {
    // The endpoint answers and serves the model, before anything starts.
    auto opt = endpoint_options::from(cfg);
    if (!opt.ok())
      return opt.error();
    if (auto r = check_endpoint(*opt); !r)
      return fail(errc::config, r.error().message);
    if (!cfg.policy.tokenizer.empty())
      if (auto tok = policy::tokenizer::load(cfg.policy.tokenizer); !tok.ok())
        return fail(errc::config, "policy.tokenizer: ", tok.error().message);
    return {};
  }
  if (cfg.model.dir.empty())
    return {};
  const fs::path dir{cfg.model.dir};
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return fail(errc::config, "model.dir: ", cfg.model.dir, " is not a directory");
  if (!fs::exists(dir / "config.json", ec))
    return fail(errc::config, "model.dir: ", cfg.model.dir, " has no config.json (not a Hugging Face model directory)");
  if (auto mc = policy::read_model_config(dir); !mc.ok())
    return fail(errc::config, "model.dir: ", mc.error().message);
  if (auto tok = policy::tokenizer::load(dir); !tok.ok())
    return fail(errc::config, "model.dir: ", tok.error().message);
  if (auto weights = policy::safetensors_checkpoint::open(dir); !weights.ok())
    return fail(errc::config, "model.dir: ", weights.error().message);
  return {};
}

namespace {

// spawn_run_roles without its exception guard: `out` is the caller's, so that roles spawned
// before a throw are told to exit.
// Where a run starts from: a fresh run's model made (prepare_model), or the latest checkpoint's
// progress, task samplers and model on resume.
struct start_point {
  trainer_progress progress;
  std::vector<std::string> samplers; // the task samplers' states (resume)
  fs::path checkpoint;               // "" for a fresh run
  fs::path model_source;             // where the engine loads from when it does not share the learner's weights
};

result<start_point> find_start(const config& cfg, const fs::path& run_dir, bool resume, const task_catalog& tasks,
                               logger& log) {
  start_point at;
  at.model_source = model_dir_of(cfg, run_dir);
  const bool endpoint = cfg.policy.backend == "openai";
  if (!resume) {
    if (!endpoint)
      if (auto r = prepare_model(cfg, run_dir, log); !r)
        return r.error();
    return at;
  }
  auto ck = latest_checkpoint(run_dir);
  if (!ck.ok())
    return ck.error();
  auto text = read_file(*ck / "trainer.json");
  if (!text.ok())
    return text.error();
  auto p = trainer_progress::from_json(*text, (*ck / "trainer.json").string());
  if (!p.ok())
    return p.error();
  at.progress = *p;
  // Before anything is spawned: a task pool that changed since the pause is named here.
  auto states = load_sampler_states(*ck, tasks, log);
  if (!states.ok())
    return states.error();
  at.samplers = std::move(*states);
  // A resumed run may meet a smaller machine, or a --set that no longer fits.
  if (auto r = check_memory_here(cfg); !r)
    return r.error();
  at.checkpoint = *ck;
  if (!endpoint)
    at.model_source = *ck / "learner" / "model";
  log.info(component, "resuming from ", ck->string(), " (", stage_name(at.progress.stage), " step ",
           at.progress.stage_step, ", run step ", at.progress.step, ")");
  return at;
}

// One evaluator actor per evaluator.devices entry (each added to `actors`).
result<std::vector<evaluator_actor>> spawn_evaluators(caf::actor_system& sys, const config& cfg,
                                                      std::shared_ptr<const task_catalog> tasks, logger& log,
                                                      std::vector<caf::actor>& actors) {
  auto made = env::make_device_evaluators(cfg.evaluator, cfg.reward, cfg.evaluator.devices, log,
                                          env::verdict_cache_use::configured);
  if (!made.ok())
    return made.error();
  std::vector<evaluator_actor> evaluators;
  for (std::size_t i = 0; i < cfg.evaluator.devices.size(); ++i) {
    std::shared_ptr<env::device_evaluator> shared(std::move((*made)[i]));
    auto info = device_info_of(*shared, static_cast<std::uint32_t>(i));
    auto ev = spawn_evaluator(sys, evaluator_deps{shared, tasks, info, cfg.evaluator.concurrency});
    actors.push_back(caf::actor_cast<caf::actor>(ev));
    evaluators.push_back(ev);
  }
  return evaluators;
}

// The run's learners: one, or one per learner.devices entry formed into a data-parallel group;
// restored from the checkpoint on resume (`version` is then the restored policy version).
struct learner_set {
  std::unique_ptr<policy::learner> single;             // one learner (learner.devices has one entry)
  std::vector<std::shared_ptr<policy::learner>> ranks; // data parallel: every rank, 0 first
  learner_ranks group;                                 // data parallel: the formed group
  policy::learner& first() { return ranks.empty() ? *single : *ranks.front(); }
};

result<learner_set> make_learners(const config& cfg, const fs::path& model_dir, const fs::path& checkpoint,
                                  std::uint64_t& version, logger& log) {
  policy::load_options lopt;
  try {
    lopt.device = torch::Device(cfg.model.device);
  } catch (const std::exception&) {
    return fail(errc::config, "model.device: '", cfg.model.device, "' is not a device (cpu, cuda:N)");
  }
  if (lopt.device.is_cuda() && !torch::cuda::is_available())
    return fail(errc::config, "model.device: ", cfg.model.device, ": no CUDA device is available");
  // The policy loads in the dtype it trains in (no float32 copy of a 7B model on the way); the
  // KL reference stays float32.
  auto learner_dtype = policy::parse_torch_dtype(cfg.learner.dtype);
  if (!learner_dtype.ok())
    return fail(errc::config, "learner.dtype: ", learner_dtype.error().message);
  lopt.dtype = *learner_dtype;
  // One learner on `opt.device` (each data-parallel rank loads its own copy onto its device).
  auto make_learner = [&](const policy::load_options& opt) -> result<std::unique_ptr<policy::learner>> {
    auto model = policy::load_model(model_dir, opt);
    if (!model.ok())
      return fail(model.error().code, "learner model: ", model.error().message);
    policy::CausalLM reference{nullptr};
    if (cfg.learner.kl_coef > 0) {
      auto ropt = opt;
      ropt.dtype = torch::kFloat;
      auto ref = policy::load_model(model_dir, ropt);
      if (!ref.ok())
        return ref.error();
      reference = *ref;
    }
    return policy::learner::create(*model, reference, cfg.learner, cfg.run.seed, 0);
  };
  auto learner = make_learner(lopt);
  if (!learner.ok())
    return learner.error();
  const bool resume = !checkpoint.empty();
  learner_set out;
  // Data parallel (learner.devices): ranks 1.. on their devices, the group formed and a resumed
  // checkpoint restored on every rank before the engine is built from rank 0's weights.
  auto restore_began = std::chrono::steady_clock::now(); // the restore's time, logged on resume
  if (cfg.learner.devices.size() > 1) {
    out.ranks.push_back(std::shared_ptr<policy::learner>(std::move(*learner)));
    for (std::size_t r = 1; r < cfg.learner.devices.size(); ++r) {
      const auto& device = cfg.learner.devices[r];
      auto ropt = lopt;
      ropt.device = torch::Device(device);
      if (ropt.device.is_cuda() && ropt.device.index() >= static_cast<int>(torch::cuda::device_count()))
        return fail(errc::config, "learner.devices[", std::to_string(r), "]: ", device, ": no such CUDA device (",
                    std::to_string(torch::cuda::device_count()), " visible)");
      auto l = make_learner(ropt);
      if (!l.ok())
        return fail(l.error().code, "learner.devices[", std::to_string(r), "] ", device, ": ", l.error().message);
      out.ranks.push_back(std::shared_ptr<policy::learner>(std::move(*l)));
    }
    restore_began = std::chrono::steady_clock::now(); // forming the group and restoring every rank
    auto formed = form_learner_group(cfg, out.ranks, resume ? checkpoint / "learner" : fs::path{}, log);
    if (!formed.ok())
      return formed.error();
    out.group = std::move(*formed);
    if (resume)
      version = out.group.restored.version;
    log.info(component, "learner: ", out.ranks.size(), " data-parallel ranks (", out.group.backend, ") on ",
             join_devices(cfg.learner.devices), cfg.learner.zero1 ? ", ZeRO-1" : "");
  } else {
    out.single = std::move(*learner);
    if (resume) {
      progress_meter meter{log, "checkpoint", progress_unit::bytes};
      auto info = policy::load_checkpoint(
        *out.single, checkpoint / "learner",
        [&](std::string_view what, std::uint64_t done, std::uint64_t total) { meter.update(what, done, total); });
      meter.finish();
      if (!info.ok())
        return info.error();
      version = info->version;
    }
  }
  if (resume)
    log.info(component, "learner restored from ", (checkpoint / "learner").string(),
             out.ranks.empty() ? "" : " on " + std::to_string(out.ranks.size()) + " ranks", ": ",
             static_cast<double>(directory_bytes(checkpoint / "learner")) / 1e9, " GB in ",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - restore_began).count(), " s");
  return out;
}

// The engine on `device` (one of engine.devices): with model.handoff `memory` built from the
// first learner's weights (policy/distributed/weight_handoff.hpp), else loaded from
// `model_source`. It serves policy `version`.
struct engine_parts {
  std::unique_ptr<policy::engine> engine;
  std::shared_ptr<policy::weight_handoff> handoff; // model.handoff `memory`
  policy::engine_options options;
};

result<engine_parts> make_engine(const config& cfg, const std::string& device, policy::learner& first,
                                 const fs::path& model_source, std::uint64_t version, logger& log) {
  engine_parts out;
  // The name was checked with the configuration; whether the device is here, only now.
  if (const auto index = policy::cuda_index(device);
      device != cfg.model.device && index >= static_cast<int>(torch::cuda::device_count()))
    return fail(errc::config, "engine.devices: ", device, ": this machine has ",
                std::to_string(torch::cuda::device_count()), " CUDA devices");
  out.options.device = device;
  out.options.dtype = cfg.model.engine_dtype;
  if (cfg.model.handoff == "memory") {
    auto h = policy::weight_handoff::create(first.model(), cfg.model.engine_dtype, version, device);
    if (!h.ok())
      return fail(h.error().code, "engine: ", h.error().message);
    out.handoff = std::move(*h);
    out.engine = std::make_unique<policy::engine>(out.handoff->engine_model(), out.options);
    const auto& hs = out.handoff->stats();
    log.info(component, "engine on ", device, ": ", hs.tensors_shared, " tensors (",
             static_cast<double>(hs.shared_bytes) / 1e9, " GB) shared with the learner, ", hs.tensors_own, " its own (",
             static_cast<double>(hs.own_bytes) / 1e9, " GB), ", static_cast<double>(hs.staged_bytes) / 1e9,
             " GB handed over per version");
  } else {
    auto loaded = policy::engine::load(model_source, out.options);
    if (!loaded.ok())
      return fail(loaded.error().code, "engine: ", loaded.error().message);
    out.engine = std::move(*loaded);
  }
  // On resume the engine serves the checkpoint's weights: it says so, or the rollouts would stamp
  // their samples version 0 and the trainer would drop them all as stale.
  out.engine->set_policy_version(version);
  return out;
}

// The learner's actors: one, or one per rank (rank 0 publishes to the engine) behind a group
// actor, the trainer's one handle. Each is added to `actors`.
result<learner_actor> spawn_learners(caf::actor_system& sys, const config& cfg, learner_set& learners,
                                     const std::vector<engine_actor>& engines, const learner_actor_spec& spec,
                                     std::function<result<void>(std::uint64_t)> stage, std::vector<caf::actor>& actors,
                                     logger& log) {
  if (learners.ranks.empty()) {
    learner_actor_deps deps{std::shared_ptr<policy::learner>(std::move(learners.single)), engines, std::move(stage),
                            &log};
    auto one = spec;
    one.device_name = cfg.model.device;
    auto a = spawn_learner_actor(sys, std::move(deps), std::move(one));
    if (!a.ok())
      return a.error();
    actors.push_back(caf::actor_cast<caf::actor>(*a));
    return *a;
  }
  std::vector<learner_actor> rank_actors;
  for (std::size_t r = 0; r < learners.ranks.size(); ++r) {
    auto rspec = spec;
    rspec.rank = static_cast<int>(r);
    rspec.world_size = static_cast<int>(learners.ranks.size());
    rspec.backend = learners.group.backend;
    rspec.group = learners.group.inproc;
    rspec.nccl_id_hex = learners.group.nccl_id_hex;
    rspec.timeout_s = cfg.learner.collective_timeout_s;
    const auto device = torch::Device(cfg.learner.devices[r]);
    rspec.device = device.is_cuda() ? device.index() : 0;
    rspec.device_name = cfg.learner.devices[r];
    learner_actor_deps deps{learners.ranks[r], {}, {}};
    if (r == 0) {
      deps.engines = engines;
      deps.stage_weights = stage;
      deps.log = &log; // rank 0 writes the model and manifest: its progress is the save's
    } else {
      rspec.publish_dir.clear();
    }
    auto a = spawn_learner_actor(sys, std::move(deps), std::move(rspec));
    if (!a.ok())
      return fail(a.error().code, "learner rank ", std::to_string(r), ": ", a.error().message);
    actors.push_back(caf::actor_cast<caf::actor>(*a));
    rank_actors.push_back(*a);
  }
  auto group = spawn_learner_group(sys, std::move(rank_actors));
  if (!group.ok())
    return group.error();
  actors.push_back(caf::actor_cast<caf::actor>(*group));
  return *group;
}

// The status a run starts from: its progress so far (zero for a fresh run).
run_status initial_status(const trainer_progress& progress) {
  run_status s;
  s.stage = stage_name(progress.stage);
  s.step = progress.step;
  s.policy_version = policy_version{progress.version};
  s.variants = progress.variants;
  s.best_speedup = progress.best_speedup;
  s.mean_speedup = progress.correct ? progress.speedup_sum / progress.correct : std::numeric_limits<double>::quiet_NaN();
  s.dropped_stale = progress.dropped_stale;
  s.discarded = progress.discarded;
  s.unfinished = progress.unfinished;
  return s;
}

// The local policy's engines (one per engine.devices entry) and learner actors (each added to
// out.actors).
result<std::pair<std::vector<engine_actor>, learner_actor>>
spawn_local_policy(caf::actor_system& sys, const config& cfg, const fs::path& run_dir, const fs::path& model_dir,
                   start_point& start, std::shared_ptr<const policy::tokenizer> tokenizer, run_roles& out,
                   logger& log) {
  trainer_progress& progress = start.progress; // make_learners sets the restored version
  // The learners first (restored on resume): with model.handoff `memory` each engine's model is
  // built from their weights (policy/distributed/weight_handoff.hpp).
  auto learners = make_learners(cfg, model_dir, out.checkpoint, progress.version, log);
  if (!learners.ok())
    return learners.error();
  std::vector<engine_actor> engines;
  std::vector<std::shared_ptr<policy::weight_handoff>> handoffs;
  for (const auto& device : engine_devices(cfg)) {
    auto parts = make_engine(cfg, device, learners->first(), start.model_source, progress.version, log);
    if (!parts.ok())
      return parts.error();
    auto handoff = parts->handoff;
    auto engine_opts = engine_actor_options::from(cfg);
    engine_opts.load = parts->options;
    weight_receiver receive;
    if (handoff) {
      // Rank 0 stages a version for every engine before it announces it, so an install older
      // than the announcement means this engine's copy was left out: refused, not served under
      // the announced version's number.
      receive = [handoff, device](policy::engine& e, const weights_published& w) -> result<void> {
        auto v = handoff->install();
        if (!v.ok())
          return v.error();
        if (*v < w.policy_version.value)
          return fail(errc::protocol, "the engine on ", device, " installed version ", std::to_string(*v),
                      " but version ", std::to_string(w.policy_version.value), " was announced: it was not staged "
                      "for this engine");
        e.set_policy_version(*v);
        return {};
      };
      handoffs.push_back(handoff);
    }
    auto engine = spawn_engine_actor(
      sys, engine_deps{std::shared_ptr<policy::engine>(std::move(parts->engine)), tokenizer, receive}, engine_opts);
    if (!engine.ok())
      return engine.error();
    out.actors.push_back(caf::actor_cast<caf::actor>(*engine));
    engines.push_back(*engine);
  }
  // With model.handoff `memory` the learner's rank 0 stages each version for every engine, right
  // after its update; each engine installs its own between its calls.
  std::function<result<void>(std::uint64_t)> stage;
  if (!handoffs.empty())
    stage = [handoffs](std::uint64_t version) -> result<void> {
      for (const auto& h : handoffs)
        if (auto r = h->stage(version); !r)
          return r;
      return {};
    };

  learner_actor_spec spec;
  if (handoffs.empty())
    spec.publish_dir = run_dir / "policy";
  // What goes beside every checkpoint's and published version's weights: the model's tokenizer
  // files and how this run writes its prompts (policy::prompt_format_file), from RUN/tokenizer/.
  {
    const auto side = run_dir / "tokenizer";
    std::error_code ec;
    fs::create_directories(side, ec);
    if (ec)
      return fail(errc::io, "cannot create ", side.string(), ": ", ec.message());
    if (auto r = policy::copy_model_side_files(model_dir, side); !r)
      return r.error();
    const std::string format = std::string{"{\"chat_template\": \""} + to_string(cfg.prompt.chat_template) + "\"}\n";
    if (auto r = write_file_atomic(side / policy::prompt_format_file, format); !r)
      return r.error();
    spec.tokenizer_dir = side;
  }
  spec.keep_published = 4;
  spec.temperature = cfg.rollout.temperature;
  auto learner = spawn_learners(sys, cfg, *learners, engines, spec, std::move(stage), out.actors, log);
  if (!learner.ok())
    return learner.error();

  return std::pair{std::move(engines), *learner};
}

// The composition root: each part made by the functions above, then wired. A failure after the
// first actor is spawned stops every actor spawned so far.
result<run_roles> spawn_run_roles_into(run_roles& out, caf::actor_system& sys, const config& cfg,
                                       const fs::path& run_dir, bool resume, const clock& clk, logger& log) {
  auto guard = [&](crucible::error e) -> result<run_roles> {
    exit_all(out.actors);
    return e;
  };
  // The task suite first: a wrong tasks.suite is named before anything is made. The run then
  // goes on with the sources it started with.
  auto suite = load_task_catalog(cfg);
  if (!suite.ok())
    return suite.error();
  auto tasks = keep_task_sources(run_dir, std::move(*suite), log);
  if (!tasks.ok())
    return tasks.error();
  auto start = find_start(cfg, run_dir, resume, **tasks, log);
  if (!start.ok())
    return start.error();
  out.checkpoint = start->checkpoint;
  trainer_progress& progress = start->progress;
  const bool endpoint = cfg.policy.backend == "openai";
  const auto model_dir = model_dir_of(cfg, run_dir);
  // The tokenizer: the model's; behind an endpoint, policy.tokenizer's or none (the prompt budget
  // is then estimated).
  std::shared_ptr<const policy::tokenizer> tokenizer;
  if (!endpoint || !cfg.policy.tokenizer.empty()) {
    auto tok = policy::tokenizer::load(endpoint ? fs::path{cfg.policy.tokenizer} : model_dir);
    if (!tok.ok())
      return fail(tok.error().code, endpoint ? "policy.tokenizer: " : "model tokenizer: ", tok.error().message);
    tokenizer = std::make_shared<const policy::tokenizer>(std::move(*tok));
  }
  auto seeds = load_seed_variants(seeds_dir_of(cfg), **tasks, cfg.tasks.seed_exclude);
  if (!seeds.ok())
    return seeds.error();
  out.tasks = (*tasks)->size();
  out.seeds = seeds->size();
  out.catalog = *tasks;

  auto evaluators = spawn_evaluators(sys, cfg, *tasks, log, out.actors);
  if (!evaluators.ok())
    return guard(evaluators.error());
  out.pool = spawn_evaluator_pool(sys, *evaluators, evaluator_pool_options::from(cfg));
  out.actors.push_back(caf::actor_cast<caf::actor>(out.pool));

  // Behind an endpoint: its engine actor, no learner (the config allows only the search stage).
  std::vector<engine_actor> engines;
  learner_actor learner;
  if (endpoint) {
    auto eopt = endpoint_options::from(cfg);
    if (!eopt.ok())
      return guard(eopt.error());
    auto e = spawn_endpoint_engine(sys, *eopt, log);
    if (!e.ok())
      return guard(e.error());
    engines = {*e};
    out.actors.push_back(caf::actor_cast<caf::actor>(*e));
    log.info(component, "policy: ", cfg.policy.model, " at ", cfg.policy.base_url, " (", cfg.policy.concurrency,
             " requests at a time; no learner)");
  } else {
    auto spawned = spawn_local_policy(sys, cfg, run_dir, model_dir, *start, tokenizer, out, log);
    if (!spawned.ok())
      return guard(spawned.error());
    engines = std::move(spawned->first);
    learner = spawned->second;
  }

  // The prompts and the trainer.
  auto setup = make_prompt_setup(cfg, tokenizer);
  if (!setup.ok())
    return guard(setup.error());
  trainer_deps td;
  td.cfg = cfg;
  td.run_dir = run_dir;
  td.learner = learner;
  td.engines = std::move(engines);
  td.evaluators = out.pool;
  td.tasks = *tasks;
  td.seeds = std::move(*seeds);
  td.prompts = *setup;
  td.tokenizer = tokenizer;
  td.clk = &clk;
  td.log = &log;
  td.progress = progress;
  td.samplers = std::move(start->samplers);
  auto trainer = spawn_trainer(sys, std::move(td));
  if (!trainer.ok())
    return guard(trainer.error());
  out.trainer = *trainer;
  out.actors.push_back(caf::actor_cast<caf::actor>(*trainer));
  out.initial = initial_status(progress);
  return std::move(out);
}

} // namespace

result<run_roles> spawn_run_roles(caf::actor_system& sys, const config& cfg, const fs::path& run_dir, bool resume,
                                  const clock& clk, logger& log) {
  run_roles out;
  // LibTorch reports a device out of memory (and other failures of its own) by throwing: loading
  // the learners, the handoff and the engine become an error naming it, not a terminated process.
  try {
    return spawn_run_roles_into(out, sys, cfg, run_dir, resume, clk, log);
  } catch (const c10::Error& e) {
    exit_all(out.actors);
    return fail(errc::device, "building the run's learner and engine on ", cfg.model.device, ": ",
                e.what_without_backtrace(),
                cfg.learner.memory_check ? "" : " (learner.memory_check is off: `crucible memory-plan --config` estimates the need)");
  } catch (const std::exception& e) {
    exit_all(out.actors);
    return fail(errc::device, "building the run's roles: ", e.what());
  }
}

} // namespace crucible
