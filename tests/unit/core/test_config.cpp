#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "core/config.hpp"

using namespace crucible;

namespace {

std::string problems_of(std::string_view yaml, const std::vector<std::string>& sets = {}) {
  auto cfg = parse_config(yaml, "configs/x.yaml", sets);
  REQUIRE_FALSE(cfg.ok());
  CHECK(cfg.error().code == errc::config);
  return cfg.error().message;
}

} // namespace

TEST_CASE("an empty document gives the documented defaults") {
  auto cfg = parse_config("", "empty.yaml");
  REQUIRE(cfg.ok());
  CHECK(cfg->run.name == "quickstart");
  CHECK(cfg->run.dir == "runs");
  CHECK(cfg->run.seed == 0);
  CHECK(cfg->log.level == log_level::info);
  CHECK(cfg->actors.threads == 0);
}

TEST_CASE("values are decoded into typed fields") {
  auto cfg = parse_config("run:\n  name: exp-1\n  seed: 42\nlog:\n  level: debug\nactors:\n  threads: 3\n",
                          "a.yaml");
  REQUIRE(cfg.ok());
  CHECK(cfg->run.name == "exp-1");
  CHECK(cfg->run.seed == 42);
  CHECK(cfg->log.level == log_level::debug);
  CHECK(cfg->actors.threads == 3);
}

TEST_CASE("an unknown key is refused with file, line and key path, and a suggestion") {
  auto msg = problems_of("run:\n  name: a\n  sede: 4\n");
  CHECK(msg == "configs/x.yaml:3: run.sede: unknown key (did you mean run.seed?)");
}

TEST_CASE("an unknown section is refused and the known ones are listed") {
  auto msg = problems_of("run:\n  seed: 1\nzzz_section:\n  a: 1\n");
  CHECK(msg.find("configs/x.yaml:3: zzz_section: unknown key (expected one of: ") == 0);
  CHECK(msg.find("run") != std::string::npos);
}

TEST_CASE("a mistyped value names what was expected and what was given") {
  CHECK(problems_of("run:\n  seed: fast\n")
        == "configs/x.yaml:2: run.seed: expected a non-negative integer, got \"fast\"");
  CHECK(problems_of("run:\n  seed: -3\n")
        == "configs/x.yaml:2: run.seed: expected a non-negative integer, got -3");
  CHECK(problems_of("log:\n  level: loud\n")
        == "configs/x.yaml:2: log.level: expected one of trace, debug, info, warn, error, off, got \"loud\"");
  CHECK(problems_of("actors:\n  threads: [1, 2]\n")
        == "configs/x.yaml:2: actors.threads: expected a non-negative integer, got a list");
  CHECK(problems_of("run: 5\n") == "configs/x.yaml:1: run: expected a map of settings, got 5");
  CHECK(problems_of("stages:\n  rl:\n    admission: eager\n")
        == "configs/x.yaml:3: stages.rl.admission: expected \"staleness\" or \"open\", got \"eager\"");
  CHECK(problems_of("run:\n  name: ../escape\n")
        == "configs/x.yaml:2: run.name: expected a name of letters, digits, '.', '-' and '_', got \"../escape\"");
}

TEST_CASE("every problem is reported, not only the first") {
  auto msg = problems_of("run:\n  seed: x\n  nam: y\nactors:\n  threads: -1\n");
  std::istringstream lines(msg);
  std::vector<std::string> all;
  for (std::string l; std::getline(lines, l);)
    all.push_back(l);
  REQUIRE(all.size() == 3);
  CHECK(all[0].find("configs/x.yaml:2: run.seed:") == 0);
  CHECK(all[1].find("configs/x.yaml:3: run.nam: unknown key (did you mean run.name?)") == 0);
  CHECK(all[2].find("configs/x.yaml:5: actors.threads:") == 0);
}

TEST_CASE("duplicate keys are refused") {
  CHECK(problems_of("run:\n  seed: 1\n  seed: 2\n") == "configs/x.yaml:3: run.seed: duplicate key");
}

TEST_CASE("invalid YAML names the line") {
  auto msg = problems_of("run:\n  seed: [1, 2\n");
  CHECK(msg.find("configs/x.yaml:") == 0);
  CHECK(msg.find("not valid YAML") != std::string::npos);
}

TEST_CASE("a top level that is not a map is refused") {
  CHECK(problems_of("- a\n- b\n").find("expected a map of sections at the top level") != std::string::npos);
}

TEST_CASE("--set overrides any key, including ones absent from the file") {
  auto cfg = parse_config("run:\n  seed: 1\n", "a.yaml", {"run.seed=9", "log.level=warn", "actors.threads=2"});
  REQUIRE(cfg.ok());
  CHECK(cfg->run.seed == 9);
  CHECK(cfg->log.level == log_level::warn);
  CHECK(cfg->actors.threads == 2);
}

TEST_CASE("a bad --set names the override") {
  CHECK(problems_of("", {"run.seed=fast"})
        == "--set run.seed=fast: run.seed: expected a non-negative integer, got \"fast\"");
  CHECK(problems_of("", {"run.sed=1"}) == "--set run.sed=1: run.sed: unknown key (did you mean run.seed?)");
  CHECK(problems_of("", {"noequals"}) == "--set noequals: expected key.path=value");
  CHECK(problems_of("run:\n  seed: 1\n", {"run.seed.x=1"})
        == "--set run.seed.x=1: run.seed is not a map of settings");
  CHECK(problems_of("", {"run..seed=1"}).find("empty component") != std::string::npos);
}

TEST_CASE("the resolved YAML decodes back to the same configuration") {
  auto cfg = parse_config("run:\n  name: r1\n  seed: 77\n  dir: \"/tmp/x y\"\nlog:\n  file_level: trace\n", "a.yaml");
  REQUIRE(cfg.ok());
  auto text = to_yaml(*cfg);
  auto again = parse_config(text, "resolved.yaml");
  REQUIRE(again.ok());
  CHECK(again->run.name == "r1");
  CHECK(again->run.seed == 77);
  CHECK(again->run.dir == "/tmp/x y");
  CHECK(again->log.file_level == log_level::trace);
  CHECK(to_yaml(*again) == text);
}

TEST_CASE("a string that looks like a number survives the resolved YAML as a string") {
  auto cfg = parse_config("run:\n  name: \"007\"\n", "a.yaml");
  REQUIRE(cfg.ok());
  auto again = parse_config(to_yaml(*cfg), "resolved.yaml");
  REQUIRE(again.ok());
  CHECK(again->run.name == "007");
}

TEST_CASE("load_config names a missing file") {
  auto cfg = load_config("/nonexistent/dir/c.yaml");
  REQUIRE_FALSE(cfg.ok());
  CHECK(cfg.error().code == errc::not_found);
  CHECK(cfg.error().message.find("/nonexistent/dir/c.yaml") != std::string::npos);
}

TEST_CASE("docs/configuration.md is the generated reference") {
  std::ifstream in(std::string{CRUCIBLE_SOURCE_DIR} + "/docs/configuration.md");
  REQUIRE(in.good());
  std::ostringstream ss;
  ss << in.rdbuf();
  // Regenerate with: crucible config docs > docs/configuration.md
  CHECK(ss.str() == config_reference_markdown());
}

TEST_CASE("every shipped config file is valid") {
  for (const auto& entry : std::filesystem::directory_iterator(std::string{CRUCIBLE_SOURCE_DIR} + "/configs")) {
    if (entry.path().extension() != ".yaml")
      continue;
    CAPTURE(entry.path().string());
    auto cfg = load_config(entry.path());
    CHECK_MESSAGE(cfg.ok(), (cfg.ok() ? std::string{} : cfg.error().message));
  }
}

TEST_CASE("evaluator and reward keys decode, including lists and enums") {
  auto cfg = parse_config("evaluator:\n  devices: [cuda:0, cuda:1]\n  baseline: compile-reduce-overhead\n"
                          "  rounds: 40\n  init_hold: context\nreward:\n  shape: log_speedup\n", "a.yaml");
  REQUIRE(cfg.ok());
  CHECK(cfg->evaluator.init_hold == device_init_hold::context);
  CHECK(parse_config("", "a.yaml")->evaluator.init_hold == device_init_hold::all);
  auto bad = parse_config("evaluator:\n  init_hold: always\n", "a.yaml");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("evaluator.init_hold") != std::string::npos);
  CHECK(bad.error().message.find("one of context, all, none") != std::string::npos);
  CHECK(cfg->evaluator.devices == std::vector<std::string>{"cuda:0", "cuda:1"});
  CHECK(cfg->evaluator.baseline == timing_baseline::compile_reduce_overhead);
  CHECK(cfg->evaluator.rounds == 40);
  CHECK(cfg->reward.shape == reward_shape::log_speedup);
  auto again = parse_config(to_yaml(*cfg), "resolved.yaml");
  REQUIRE(again.ok());
  CHECK(again->evaluator.devices == cfg->evaluator.devices);
  auto set = parse_config("", "a.yaml", {"evaluator.devices=[cpu]"});
  REQUIRE(set.ok());
  CHECK(set->evaluator.devices == std::vector<std::string>{"cpu"});
}

TEST_CASE("evaluator values are validated, alone and against each other") {
  CHECK(problems_of("evaluator:\n  devices: [gpu0]\n")
        == "configs/x.yaml:2: evaluator.devices: expected a non-empty list of devices, each \"cpu\" or \"cuda:N\", got a list");
  CHECK(problems_of("evaluator:\n  devices: cpu\n")
        == "configs/x.yaml:2: evaluator.devices: expected a non-empty list of devices, each \"cpu\" or \"cuda:N\", got \"cpu\"");
  CHECK(problems_of("evaluator:\n  max_spread: 0\n")
        == "configs/x.yaml:2: evaluator.max_spread: expected a positive number, got 0");
  CHECK(problems_of("evaluator:\n  rounds: 50\n  max_rounds: 40\n")
        == "configs/x.yaml: evaluator.max_rounds: must be at least evaluator.rounds (50)");
  CHECK(problems_of("evaluator:\n  slow_stop_rounds: 3\n")
        == "configs/x.yaml: evaluator.slow_stop_rounds: must be 0 or at least evaluator.buckets (5)");
  CHECK(crucible::parse_config("evaluator:\n  slow_stop_rounds: 0\n", "x.yaml").ok());
  CHECK(problems_of("evaluator:\n  slow_stop_below: 1.5\n")
        == "configs/x.yaml:2: evaluator.slow_stop_below: expected a number between 0.01 and 1, got 1.5");
  CHECK(problems_of("evaluator:\n  cuda_max_connections: 33\n")
        == "configs/x.yaml:2: evaluator.cuda_max_connections: expected an integer between 0 and 32, got 33");
  CHECK(problems_of("reward:\n  shape: cubic\n")
        == "configs/x.yaml:2: reward.shape: expected one of speedup, log_speedup, clipped, got \"cubic\"");
}

TEST_CASE("exemplar and prompt keys decode and survive the resolved YAML") {
  auto cfg = parse_config("exemplar:\n  method: random\n  n: 4\n  tau: 0.5\n  bucket_width: 0.25\n  islands: 3\n"
                          "  straggler_timeout_s: 30\n  straggler_policy: fill\n  seeds_only: true\n"
                          "prompt:\n  template: my/prompts.yaml\n  max_tokens: 8192\n  max_exemplar_chars: 5000\n"
                          "  min_exemplar_chars: 200\n  chat_template: none\n  max_response_chars: 1000\n"
                          "  require_sections: false\n", "a.yaml");
  REQUIRE(cfg.ok());
  const auto& x = cfg->exemplar;
  CHECK(x.method == exemplar_method::random);
  CHECK(x.n == 4);
  CHECK(x.tau == 0.5);
  CHECK(x.bucket_width == 0.25);
  CHECK(x.islands == 3);
  CHECK(x.straggler_timeout_s == 30);
  CHECK(x.straggler == straggler_policy::fill);
  CHECK(x.seeds_only);
  CHECK_FALSE(config{}.exemplar.seeds_only);
  const auto& p = cfg->prompt;
  CHECK(p.template_file == "my/prompts.yaml");
  CHECK(p.max_tokens == 8192);
  CHECK(p.max_exemplar_chars == 5000);
  CHECK(p.min_exemplar_chars == 200);
  CHECK(p.chat_template == chat_template_mode::none);
  CHECK(p.max_response_chars == 1000);
  CHECK_FALSE(p.require_sections);
  auto again = parse_config(to_yaml(*cfg), "resolved.yaml");
  REQUIRE(again.ok());
  CHECK(again->exemplar.straggler == straggler_policy::fill);
  CHECK(again->exemplar.method == exemplar_method::random);
  CHECK(again->exemplar.seeds_only);
  CHECK(again->prompt.template_file == "my/prompts.yaml");
  CHECK(again->prompt.chat_template == chat_template_mode::none);
  CHECK(again->prompt.max_tokens == 8192);
  CHECK(std::string{to_string(chat_template_mode::automatic)} == "auto");
  CHECK(std::string{to_string(straggler_policy::drop)} == "drop");
  CHECK(std::string{to_string(exemplar_method::island)} == "island");
  // Defaults.
  config d;
  CHECK(d.exemplar.straggler_timeout_s == 600);
  CHECK(d.exemplar.straggler == straggler_policy::drop);
  CHECK(d.prompt.template_file.empty());
  CHECK(d.prompt.max_tokens == 4096);
  CHECK(d.prompt.chat_template == chat_template_mode::automatic);
}

TEST_CASE("exemplar and prompt values are validated with the key named") {
  CHECK(problems_of("exemplar:\n  method: greedy\n")
        == "configs/x.yaml:2: exemplar.method: expected one of contrastive, random, island, got \"greedy\"");
  CHECK(problems_of("exemplar:\n  n: 0\n") == "configs/x.yaml:2: exemplar.n: expected a positive integer, got 0");
  CHECK(problems_of("exemplar:\n  tau: -1\n") == "configs/x.yaml:2: exemplar.tau: expected a positive number, got -1");
  CHECK(problems_of("exemplar:\n  bucket_width: 0\n")
        == "configs/x.yaml:2: exemplar.bucket_width: expected a positive number, got 0");
  CHECK(problems_of("exemplar:\n  islands: 0\n") == "configs/x.yaml:2: exemplar.islands: expected a positive integer, got 0");
  CHECK(problems_of("exemplar:\n  straggler_timeout_s: 0\n")
        == "configs/x.yaml:2: exemplar.straggler_timeout_s: expected a positive number, got 0");
  CHECK(problems_of("exemplar:\n  straggler_policy: wait\n")
        == "configs/x.yaml:2: exemplar.straggler_policy: expected one of drop, fill, got \"wait\"");
  CHECK(problems_of("prompt:\n  max_tokens: 0\n") == "configs/x.yaml:2: prompt.max_tokens: expected a positive integer, got 0");
  CHECK(problems_of("prompt:\n  chat_template: jinja\n")
        == "configs/x.yaml:2: prompt.chat_template: expected one of auto, none, got \"jinja\"");
  CHECK(problems_of("prompt:\n  max_exemplar_chars: -3\n")
        == "configs/x.yaml:2: prompt.max_exemplar_chars: expected an integer ≥ 0, got -3");
  CHECK(problems_of("prompt:\n  max_exemplar_chars: 100\n  min_exemplar_chars: 200\n")
        == "configs/x.yaml: prompt.max_exemplar_chars: must be 0 or at least prompt.min_exemplar_chars (200)");
  CHECK(problems_of("prompt:\n  templte: x.yaml\n").find("prompt.templte: unknown key (did you mean prompt.template?)")
        != std::string::npos);
  CHECK(problems_of("", {"prompt.require_sections=maybe"})
        == "--set prompt.require_sections=maybe: prompt.require_sections: expected true or false, got \"maybe\"");
}

TEST_CASE("learner: defaults, typed values and errors that name the key") {
  auto defaults = parse_config("", "a.yaml");
  REQUIRE(defaults.ok());
  CHECK(defaults->learner.aggregation == loss_aggregation::token_mean);
  CHECK(defaults->learner.old_log_probs == old_log_probs_source::recompute);
  CHECK(defaults->learner.dtype == "float32");
  CHECK_FALSE(defaults->learner.lora);
  CHECK_FALSE(defaults->learner.activation_checkpointing);

  auto cfg = parse_config("learner:\n  lr: 2.0e-5\n  aggregation: constant\n  constant_tokens: 4096\n"
                          "  kl_estimator: k1\n  reward_transform: normalize_clip\n  old_logprobs: auto\n"
                          "  schedule: cosine\n  warmup_steps: 10\n  total_steps: 100\n  dtype: bfloat16\n"
                          "  lora: true\n  lora_targets: [q_proj, down_proj]\n  std_normalize: false\n"
                          "  activation_checkpointing: true\n",
                          "a.yaml");
  REQUIRE(cfg.ok());
  const auto& l = cfg->learner;
  CHECK(l.lr == 2.0e-5);
  CHECK(l.aggregation == loss_aggregation::constant);
  CHECK(l.constant_tokens == 4096);
  CHECK(l.kl == kl_estimator::k1);
  CHECK(l.rewards == reward_transform::normalize_clip);
  CHECK(l.old_log_probs == old_log_probs_source::automatic);
  CHECK(l.schedule == lr_schedule::cosine);
  CHECK(l.dtype == "bfloat16");
  CHECK(l.lora);
  CHECK(l.lora_targets == std::vector<std::string>{"q_proj", "down_proj"});
  CHECK_FALSE(l.std_normalize);
  CHECK(l.activation_checkpointing);
  auto again = parse_config(to_yaml(*cfg), "resolved.yaml");
  REQUIRE(again.ok());
  CHECK(to_yaml(*again) == to_yaml(*cfg));
  CHECK(again->learner.old_log_probs == old_log_probs_source::automatic);
  CHECK(again->learner.activation_checkpointing);

  CHECK(problems_of("learner:\n  aggregation: mean\n")
        == "configs/x.yaml:2: learner.aggregation: expected one of token_mean, sequence_mean, constant, got \"mean\"");
  CHECK(problems_of("learner:\n  clip_low: 1.5\n")
        == "configs/x.yaml:2: learner.clip_low: expected a number in [0, 1), got 1.5");
  CHECK(problems_of("learner:\n  dtype: float16\n")
        == "configs/x.yaml:2: learner.dtype: expected one of float32, bfloat16, got \"float16\"");
  CHECK(problems_of("learner:\n  lora_targets: [q_proj, qk_proj]\n").find("learner.lora_targets: expected") !=
        std::string::npos);
  CHECK(problems_of("learner:\n  micro_batch_tokens: 0\n").find("learner.micro_batch_tokens") != std::string::npos);
  CHECK(problems_of("learner:\n  schedule: cosine\n  warmup_steps: 10\n")
        == "configs/x.yaml: learner.total_steps: must exceed learner.warmup_steps (10) with the cosine schedule");
  CHECK(problems_of("log:\n  wandb: true\n  tensorboard: false\n")
        == "configs/x.yaml: log.wandb: needs log.tensorboard (one writer, tools/metrics_tensorboard.py, makes both)");
  CHECK(parse_config("log:\n  wandb: true\n", "configs/x.yaml").ok());
  CHECK(problems_of("learner:\n  kl_cof: 0.1\n") == "configs/x.yaml:2: learner.kl_cof: unknown key (did you mean learner.kl_coef?)");
  // LoRA and a KL term: refused only when RL follows an SFT stage (the reference would be taken from the policy).
  const std::string lora_kl = "learner:\n  lora: true\n  kl_coef: 0.1\nstages:\n  rl: {steps: 5}\n";
  CHECK(problems_of(lora_kl + "  sft: {steps: 5}\n").find("configs/x.yaml: learner.kl_coef: with learner.lora") == 0);
  CHECK(problems_of(lora_kl + "  self_supervised: {steps: 5}\n").find("learner.kl_coef") != std::string::npos);
  CHECK(parse_config(lora_kl, "configs/x.yaml").ok());
}

TEST_CASE("learner.devices: one rank per device, checked against itself and model.device") {
  auto defaults = parse_config("", "a.yaml");
  REQUIRE(defaults.ok());
  CHECK(defaults->learner.devices.empty()); // one learner on model.device

  auto cpu = parse_config("learner:\n  devices: [cpu, cpu]\nstages:\n  sft: {steps: 2, batch: 2}\n", "a.yaml");
  REQUIRE_MESSAGE(cpu.ok(), (cpu.ok() ? "" : cpu.error().message));
  CHECK(cpu->learner.devices == std::vector<std::string>{"cpu", "cpu"});
  auto again = parse_config(to_yaml(*cpu), "resolved.yaml");
  REQUIRE(again.ok());
  CHECK(again->learner.devices == cpu->learner.devices);
  auto gpus = parse_config("", "a.yaml", {"model.device=cuda:0", "learner.devices=[cuda:0, cuda:1, cuda:2, cuda:3]",
                                          "stages.rl.groups=4", "stages.sft.batch=4", "stages.self_supervised.groups=4"});
  REQUIRE_MESSAGE(gpus.ok(), (gpus.ok() ? "" : gpus.error().message));
  CHECK(gpus->learner.devices.size() == 4);

  CHECK(problems_of("learner:\n  devices: [cpu, gpu]\n")
        == "configs/x.yaml:2: learner.devices: expected a list of devices, each \"cpu\" or \"cuda:N\" (empty: "
           "model.device), got a list");
  CHECK(problems_of("model:\n  device: cuda:0\nlearner:\n  devices: [cuda:0, cuda:1, cuda:1]\n")
        == "configs/x.yaml: learner.devices: names cuda:1 twice: one learner rank per GPU (only `cpu` may repeat, as "
           "threads)");
  CHECK(problems_of("learner:\n  devices: [cpu, cuda:0]\n")
        == "configs/x.yaml: learner.devices: mixes cpu and cuda devices: the ranks are all threads on the CPU "
           "(inproc) or all GPUs (NCCL)");
  CHECK(problems_of("model:\n  device: cuda:0\nlearner:\n  devices: [cuda:1, cuda:0]\n")
        == "configs/x.yaml: learner.devices: the first entry (cuda:1) must be model.device (cuda:0): rank 0 trains "
           "beside the engine and hands it each version");
  CHECK(problems_of("learner:\n  devices: [cuda:0]\n").find("learner.devices: the first entry (cuda:0) must be "
                                                            "model.device (cpu)") != std::string::npos);
  // Each rank needs a share of every batch of a stage that runs.
  CHECK(problems_of("learner:\n  devices: [cpu, cpu, cpu]\nstages:\n  sft: {steps: 1, batch: 2}\n  rl: {steps: 1, groups: 3}\n")
        == "configs/x.yaml: stages.sft.batch: must be at least the number of learner ranks (3, learner.devices): each "
           "rank trains on its own share of the batch");
  CHECK(problems_of("learner:\n  devices: [cpu, cpu]\nstages:\n  rl: {steps: 1, groups: 1}\n").find("stages.rl.groups")
        != std::string::npos);
  CHECK(parse_config("learner:\n  devices: [cpu, cpu]\nstages:\n  sft: {steps: 0, batch: 1}\n  rl: {steps: 1, groups: 2}\n"
                     "  self_supervised: {steps: 0, groups: 1}\n", "a.yaml").ok());
}

TEST_CASE("engine.devices: engines on GPUs of their own, of model.device's kind, each with a rollout actor") {
  auto defaults = parse_config("", "a.yaml");
  REQUIRE(defaults.ok());
  CHECK(defaults->engine.devices.empty());
  CHECK(engine_devices(*defaults) == std::vector<std::string>{"cpu"}); // model.device
  auto split = parse_config("model:\n  device: cuda:1\nengine:\n  devices: [cuda:0]\n", "a.yaml");
  REQUIRE_MESSAGE(split.ok(), (split.ok() ? "" : split.error().message));
  CHECK(engine_devices(*split) == std::vector<std::string>{"cuda:0"});
  auto again = parse_config(to_yaml(*split), "resolved.yaml");
  REQUIRE(again.ok());
  CHECK(again->engine.devices == std::vector<std::string>{"cuda:0"});
  // Two engines, one beside rank 0 and one apart; on the CPU as threads.
  auto beside_and_apart =
    parse_config("model:\n  device: cuda:0\nengine:\n  devices: [cuda:0, cuda:2]\nrollout:\n  actors: 2\n", "a.yaml");
  REQUIRE(beside_and_apart.ok());
  CHECK(engine_devices_apart(*beside_and_apart) == std::vector<std::string>{"cuda:2"});
  CHECK(engine_devices_apart(*split) == std::vector<std::string>{"cuda:0"});
  CHECK(engine_devices_apart(*defaults).empty());
  CHECK(parse_config("engine:\n  devices: [cpu, cpu]\nrollout:\n  actors: 3\n", "a.yaml").ok());
  CHECK(problems_of("model:\n  device: cuda:0\nengine:\n  devices: [cpu]\n")
        == "configs/x.yaml: engine.devices: cpu is not of model.device's kind (cuda:0): the engines and the learner "
           "are all on the CPU or all on GPUs");
  CHECK(problems_of("engine:\n  devices: [cuda:2]\n").find("engine.devices: cuda:2 is not of model.device's kind (cpu)")
        != std::string::npos);
  CHECK(problems_of("model:\n  device: cuda:0\nengine:\n  devices: [cuda:1, cuda:1]\nrollout:\n  actors: 2\n")
        == "configs/x.yaml: engine.devices: names cuda:1 twice: one engine per GPU (only `cpu` may repeat, as threads)");
  CHECK(problems_of("model:\n  device: cuda:0\nlearner:\n  devices: [cuda:0, cuda:1]\nengine:\n  devices: [cuda:1]\n")
        == "configs/x.yaml: engine.devices: cuda:1 is a learner rank's GPU (learner.devices): give each engine a GPU "
           "without a rank, or model.device (rank 0's)");
  CHECK(parse_config("model:\n  device: cuda:0\nlearner:\n  devices: [cuda:0, cuda:1]\nengine:\n  devices: [cuda:2]\n",
                     "a.yaml")
          .ok());
  CHECK(problems_of("model:\n  device: cuda:0\nengine:\n  devices: [cuda:1, cuda:2]\nrollout:\n  actors: 1\n")
        == "configs/x.yaml: rollout.actors: is 1, fewer than the 2 engines of engine.devices: each engine samples for "
           "its own rollout actors (actor i uses engine i mod 2)");
  CHECK(problems_of("engine:\n  devices: [gpu0]\n").find("configs/x.yaml:2: engine.devices: expected a list of devices") !=
        std::string::npos);
  // The key of one engine's device is gone; its name points to the list.
  CHECK(problems_of("engine:\n  device: cuda:0\n").find("engine.device: unknown key (did you mean engine.devices?)") !=
        std::string::npos);
}

TEST_CASE("membership keys decode and are validated with the key named") {
  auto cfg = parse_config("membership:\n  listen: \"0.0.0.0:7460\"\n  token_file: /etc/crucible/token\n"
                          "  heartbeat_s: 0.5\n  timeout_s: 3\n",
                          "configs/x.yaml");
  REQUIRE(cfg.ok());
  CHECK(cfg->membership.listen == "0.0.0.0:7460");
  CHECK(cfg->membership.token_file == "/etc/crucible/token");
  CHECK(cfg->membership.heartbeat_s == 0.5);
  CHECK(cfg->membership.timeout_s == 3);
  CHECK(parse_config("membership:\n  listen: \"\"\n", "configs/x.yaml").ok()); // no membership
  CHECK(problems_of("membership:\n  listen: localhost\n")
        == "configs/x.yaml:2: membership.listen: expected empty or HOST:PORT with a port from 0 to 65535, got \"localhost\"");
  CHECK(problems_of("membership:\n  listen: \"h:70000\"\n")
        == "configs/x.yaml:2: membership.listen: expected empty or HOST:PORT with a port from 0 to 65535, got \"h:70000\"");
  CHECK(problems_of("membership:\n  heartbeat_s: 5\n  timeout_s: 5\n")
        == "configs/x.yaml: membership.timeout_s: must exceed membership.heartbeat_s (5.0)");
}
