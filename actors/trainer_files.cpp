// actors/trainer_files.cpp: the trainer's files, apart from the actor: seed variants and their
// SFT responses, the checkpoint documents (trainer.json, samplers.json) and the `latest` pointer.
#include "actors/trainer.hpp"

#include <algorithm>
#include <fnmatch.h>
#include <string>
#include <utility>
#include <vector>

#include "core/file_io.hpp"
#include "core/json.hpp"
#include "core/json_parse.hpp"
#include "env/prompt/task_sampler.hpp"

namespace fs = std::filesystem;

namespace crucible {

namespace {

constexpr std::string_view component = "trainer";

// The first line of a module docstring, or "".
std::string docstring_summary(const std::string& code) {
  auto pos = code.find_first_not_of(" \t\r\n");
  if (pos == std::string::npos)
    return {};
  for (const char* q : {"\"\"\"", "'''"}) {
    if (code.compare(pos, 3, q) == 0) {
      auto end = code.find(q, pos + 3);
      if (end == std::string::npos)
        return {};
      auto body = code.substr(pos + 3, end - pos - 3);
      auto nl = body.find('\n');
      auto line = body.substr(0, nl);
      auto b = line.find_first_not_of(" \t");
      auto e = line.find_last_not_of(" \t\r");
      return b == std::string::npos ? std::string{} : line.substr(b, e - b + 1);
    }
  }
  return {};
}

} // namespace

const char* stage_name(int stage) noexcept {
  switch (stage) {
    case stage_warm:
      return "warm_start";
    case stage_sft:
      return "sft";
    case stage_self:
      return "self_supervised";
    case stage_rl:
      return "rl";
    case stage_search:
      return "search";
    default:
      return "";
  }
}

result<std::vector<seed_variant>> load_seed_variants(const fs::path& dir, const task_catalog& tasks,
                                                     const std::vector<std::string>& exclude) {
  for (const auto& pattern : exclude)
    if (pattern.empty() || pattern.find('/') != std::string::npos)
      return fail(errc::config, "tasks.seed_exclude: '", pattern, "' is not a file-name pattern (empty, or holds a '/')");
  const auto excluded = [&](const fs::path& f) {
    const auto name = f.filename().string();
    return std::any_of(exclude.begin(), exclude.end(),
                       [&](const std::string& pattern) { return fnmatch(pattern.c_str(), name.c_str(), 0) == 0; });
  };
  std::vector<seed_variant> out;
  for (const auto& [id, task] : tasks) {
    const auto folder = dir / id.value;
    std::error_code ec;
    if (!fs::is_directory(folder, ec))
      continue;
    std::vector<fs::path> files;
    for (auto it = fs::directory_iterator(folder, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
      if (it->is_regular_file() && it->path().extension() == ".py" && !excluded(it->path()))
        files.push_back(it->path());
    if (ec)
      return fail(errc::io, folder.string(), ": cannot list: ", ec.message());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      auto text = read_file(f);
      if (!text.ok())
        return text.error();
      seed_variant v;
      v.task = id;
      v.name = f.stem().string();
      v.code = std::move(*text);
      v.wrong = v.name.rfind("wrong_", 0) == 0;
      v.summary = docstring_summary(v.code);
      out.push_back(std::move(v));
    }
  }
  return out;
}

std::string seed_response(const std::vector<std::string>& sections, const seed_variant& v) {
  std::string out;
  const std::string summary = v.summary.empty() ? "A faster implementation of " + v.task.value + "." : v.summary;
  for (std::size_t i = 0; i < sections.size(); ++i) {
    out += "### " + sections[i] + "\n";
    if (i + 1 < sections.size())
      out += summary + "\n\n";
  }
  std::string code = v.code;
  while (!code.empty() && (code.back() == '\n' || code.back() == ' '))
    code.pop_back();
  out += "```python\n" + code + "\n```\n";
  return out;
}

std::string trainer_progress::to_json() const {
  json_writer w;
  w.begin_object()
    .field("format", "crucible-trainer-1")
    .field("stage", static_cast<std::int64_t>(stage))
    .field("stage_name", stage_name(stage))
    .field("stage_step", stage_step)
    .field("stage_seconds", stage_seconds)
    .field("step", step)
    .field("version", version)
    .field("variants", variants)
    .field("correct", correct)
    .field("best_speedup", best_speedup)
    .field("speedup_sum", speedup_sum)
    .field("dropped_stale", dropped_stale)
    .field("discarded", discarded)
    .field("unfinished", unfinished)
    .field("fates", fates)
    .field("rng", rng)
    .field("rollouts_spawned", generation)
    .end_object();
  return std::move(w).take() + "\n";
}

namespace {

// A checkpoint file's JSON object, its "format" key equal to `format`.
result<json_value> checkpoint_document(std::string_view text, const std::string& origin, std::string_view format) {
  auto doc = parse_json(text, origin);
  if (!doc.ok())
    return fail(errc::corrupt, doc.error().message);
  if (!doc->is_object())
    return fail(errc::corrupt, origin, ": expected a JSON object");
  const auto* fmt = doc->find("format");
  if (fmt == nullptr || !fmt->is_string() || fmt->as_string() != format)
    return fail(errc::corrupt, origin, ": key 'format': expected \"", format, "\"");
  return doc;
}

} // namespace

result<trainer_progress> trainer_progress::from_json(std::string_view text, const std::string& origin) {
  auto doc = checkpoint_document(text, origin, "crucible-trainer-1");
  if (!doc.ok())
    return doc.error();
  trainer_progress p;
  auto u64 = [&](const char* key, std::uint64_t& out) -> result<void> {
    const auto* v = doc->find(key);
    if (v == nullptr || !v->is_int() || v->as_int() < 0)
      return fail(errc::corrupt, origin, ": key '", key, "': expected a non-negative integer");
    out = static_cast<std::uint64_t>(v->as_int());
    return {};
  };
  auto num = [&](const char* key, double& out, bool nullable) -> result<void> {
    const auto* v = doc->find(key);
    if (v != nullptr && v->is_null() && nullable) {
      out = std::numeric_limits<double>::quiet_NaN();
      return {};
    }
    if (v == nullptr || !v->is_number())
      return fail(errc::corrupt, origin, ": key '", key, "': expected a number");
    out = v->as_double();
    return {};
  };
  std::uint64_t stage = 0;
  for (auto r : {u64("stage", stage), u64("stage_step", p.stage_step), u64("step", p.step), u64("version", p.version),
                 u64("variants", p.variants), u64("correct", p.correct), u64("dropped_stale", p.dropped_stale),
                 u64("rng", p.rng), u64("rollouts_spawned", p.generation), num("stage_seconds", p.stage_seconds, false),
                 num("best_speedup", p.best_speedup, true), num("speedup_sum", p.speedup_sum, false)})
    if (!r.ok())
      return r.error();
  // Absent from checkpoints written before these counters.
  for (auto [key, out] : {std::pair{"discarded", &p.discarded}, std::pair{"unfinished", &p.unfinished},
                          std::pair{"fates", &p.fates}})
    if (doc->find(key) != nullptr)
      if (auto r = u64(key, *out); !r.ok())
        return r.error();
  if (stage > static_cast<std::uint64_t>(stage_done))
    return fail(errc::corrupt, origin, ": key 'stage': ", std::to_string(stage), " is not a stage (0-5)");
  p.stage = static_cast<int>(stage);
  return p;
}

namespace {

constexpr std::string_view samplers_format = "crucible-samplers-1";
constexpr std::uint64_t max_places = std::uint64_t{1} << 23; // rollout_actor_options::index bound

// "a, b, c" of at most a few names.
std::string name_list(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < 5; ++i)
    out += (i ? ", " : "") + names[i];
  if (names.size() > 5)
    out += " and " + std::to_string(names.size() - 5) + " more";
  return out;
}

} // namespace

std::string sampler_checkpoint::to_json() const {
  json_writer w;
  w.begin_object().field("format", samplers_format).key("samplers").begin_array();
  for (std::size_t k = 0; k < states.size(); ++k)
    if (!states[k].empty())
      w.begin_object().field("place", static_cast<std::uint64_t>(k)).field("state", states[k]).end_object();
  w.end_array().end_object();
  return std::move(w).take() + "\n";
}

result<sampler_checkpoint> sampler_checkpoint::from_json(std::string_view text, const std::string& origin) {
  auto doc = checkpoint_document(text, origin, samplers_format);
  if (!doc.ok())
    return doc.error();
  const auto* list = doc->find("samplers");
  if (list == nullptr || !list->is_array())
    return fail(errc::corrupt, origin, ": key 'samplers': expected an array");
  sampler_checkpoint out;
  for (std::size_t i = 0; i < list->as_array().size(); ++i) {
    const auto& e = list->as_array()[i];
    const auto at = origin + ": samplers[" + std::to_string(i) + "]";
    const auto* place = e.is_object() ? e.find("place") : nullptr;
    const auto* state = e.is_object() ? e.find("state") : nullptr;
    if (place == nullptr || !place->is_int() || place->as_int() < 0
        || static_cast<std::uint64_t>(place->as_int()) >= max_places)
      return fail(errc::corrupt, at, ": key 'place': expected an integer in [0, 2^23)");
    if (state == nullptr || !state->is_string() || state->as_string().empty())
      return fail(errc::corrupt, at, ": key 'state': expected a non-empty string");
    const auto k = static_cast<std::size_t>(place->as_int());
    if (out.states.size() <= k)
      out.states.resize(k + 1);
    if (!out.states[k].empty())
      return fail(errc::corrupt, at, ": place ", std::to_string(k), " is given twice");
    out.states[k] = state->as_string();
  }
  return out;
}

result<std::vector<std::string>> load_sampler_states(const fs::path& dir, const task_catalog& tasks, logger& log) {
  const auto file = dir / "samplers.json";
  std::error_code ec;
  if (!fs::exists(file, ec)) {
    log.warn(component, dir.string(), " has no samplers.json (a checkpoint from before task samplers were saved): "
             "the task samplers start fresh");
    return std::vector<std::string>{};
  }
  auto text = read_file(file);
  if (!text.ok())
    return text.error();
  auto saved = sampler_checkpoint::from_json(*text, file.string());
  if (!saved.ok())
    return saved.error();
  const auto pool = sampler_pool(tasks);
  std::size_t restored = 0;
  for (std::size_t k = 0; k < saved->states.size(); ++k) {
    const auto& state = saved->states[k];
    if (state.empty())
      continue;
    const auto where = file.string() + ": the task sampler of rollout place " + std::to_string(k);
    auto names = env::task_sampler::saved_tasks(state);
    if (!names.ok())
      return fail(errc::corrupt, where, ": ", names.error().message);
    if (*names != pool) {
      std::vector<std::string> gone, added;
      const std::set<std::string> was(names->begin(), names->end()), now(pool.begin(), pool.end());
      std::set_difference(was.begin(), was.end(), now.begin(), now.end(), std::back_inserter(gone));
      std::set_difference(now.begin(), now.end(), was.begin(), was.end(), std::back_inserter(added));
      std::string diff;
      if (!gone.empty())
        diff += "; no longer in the pool: " + name_list(gone);
      if (!added.empty())
        diff += "; new in the pool: " + name_list(added);
      return fail(errc::config, where, " was saved over ", std::to_string(names->size()), " tasks and the run's pool now has ",
                  std::to_string(pool.size()), diff.empty() ? std::string{" (in another order)"} : diff,
                  ". The tasks (tasks.suite, tasks.include) changed since this checkpoint: restore them, or delete ",
                  file.string(), " to resume with fresh task samplers");
    }
    auto check = env::task_sampler::create(pool, task_sampling::uniform, 0.0, 0);
    if (!check.ok())
      return check.error();
    if (auto r = check->restore(state); !r.ok())
      return fail(errc::corrupt, where, ": ", r.error().message);
    ++restored;
  }
  log.info(component, "task samplers of ", restored, " rollout place", restored == 1 ? "" : "s", " restored from ",
           file.string());
  return std::move(saved->states);
}

result<fs::path> latest_checkpoint(const fs::path& run_dir) {
  const auto pointer = run_dir / "checkpoints" / "latest";
  std::error_code ec;
  if (!fs::exists(pointer, ec))
    return fail(errc::not_found, run_dir.string(), ": no checkpoint (", pointer.string(), " is missing)");
  auto text = read_file(pointer);
  if (!text.ok())
    return text.error();
  auto name = *text;
  while (!name.empty() && (name.back() == '\n' || name.back() == ' '))
    name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    return fail(errc::corrupt, pointer.string(), ": expected a checkpoint directory name, got '", name, "'");
  auto dir = run_dir / "checkpoints" / name;
  if (!fs::is_directory(dir, ec))
    return fail(errc::corrupt, pointer.string(), ": names ", dir.string(), ", which does not exist");
  return dir;
}

} // namespace crucible
