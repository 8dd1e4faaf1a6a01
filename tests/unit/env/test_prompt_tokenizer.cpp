// tests/unit/env/test_prompt_tokenizer.cpp: the prompt budget with a real count function: a
// byte-level BPE tokenizer trained here on the task suite (text/'s tokenizer, no torch), its
// ChatML chat template, and budgets from "reference only" to "everything fits".
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "env/prompt/prompt.hpp"
#include "text/bpe_trainer.hpp"
#include "text/tokenizer.hpp"

namespace fs = std::filesystem;
using namespace crucible;
using namespace crucible::env;

TEST_CASE("prompts stay within budget as the policy tokenizer counts them") {
  const fs::path src{CRUCIBLE_SOURCE_DIR};
  policy::bpe_train_options opts;
  opts.vocab_size = 1200;
  policy::bpe_trainer trainer{opts};
  REQUIRE(trainer.validate().ok());
  std::vector<std::string> tasks;
  for (const auto& e : fs::directory_iterator(src / "env/tasks/cpu"))
    if (e.path().extension() == ".py")
      tasks.push_back(e.path().string());
  std::sort(tasks.begin(), tasks.end());
  REQUIRE(tasks.size() >= 4);
  for (const auto& t : tasks)
    REQUIRE(trainer.feed_file(t).ok());
  REQUIRE(trainer.feed_file(src / "configs/prompts/contrastive.yaml").ok());
  auto model = trainer.train();
  auto tok = policy::tokenizer::from_json(policy::tokenizer_json(model, opts), policy::tokenizer_config_json(model, opts));
  REQUIRE_MESSAGE(tok.ok(), (tok.ok() ? "" : tok.error().message));
  REQUIRE_FALSE(tok->chat_template().empty());
  const policy::tokenizer& t = *tok;
  token_counter count = [&t](std::string_view s) { return t.encode(s, true).size(); };

  auto templ = load_prompt_template(src / "configs/prompts/contrastive.yaml");
  REQUIRE(templ.ok());
  auto read = [](const std::string& p) {
    std::ifstream in(p);
    return std::string{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  };
  prompt_request req;
  req.task_name = "cpu/08_attention";
  req.reference_code = read(tasks[0]);
  req.hardware = "cpu";
  // Other tasks' sources stand in for exemplar code of realistic length and token density.
  for (std::size_t i = 1; i < 4; ++i)
    req.exemplars.push_back({read(tasks[i]), 1.0 + 0.5 * static_cast<double>(i), "cpu"});
  CHECK(tok->special_tokens_map() ==
        std::map<std::string, std::string>{{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}});
  chat_format chat{tok->chat_template(), tok->special_tokens_map()};

  auto make = [&](std::int64_t budget) {
    prompt_config cfg;
    cfg.max_tokens = budget;
    cfg.min_exemplar_chars = 120;
    auto b = prompt_builder::create(*templ, cfg, chat, count);
    REQUIRE(b.ok());
    return std::move(*b);
  };
  auto full = make(1 << 20).build(req);
  REQUIRE(full.ok());
  CHECK(full->text.rfind("<|im_start|>system\n", 0) == 0);
  CHECK(full->tokens == count(full->text));
  auto bare_req = req;
  bare_req.exemplars.clear();
  auto bare = make(1 << 20).build(bare_req);
  REQUIRE(bare.ok());
  REQUIRE(full->tokens > bare->tokens + 100);
  MESSAGE("reference only: " << bare->tokens << " tokens; with 3 exemplars: " << full->tokens << " tokens");
  std::size_t steps = 0;
  for (std::size_t budget = bare->tokens; budget <= full->tokens; budget += (full->tokens - bare->tokens) / 23 + 1) {
    auto p = make(static_cast<std::int64_t>(budget)).build(req);
    REQUIRE(p.ok());
    CHECK(p->tokens <= budget);
    CHECK(p->tokens == count(p->text));
    ++steps;
  }
  CHECK(steps >= 20);
  auto too_small = make(static_cast<std::int64_t>(bare->tokens) - 1).build(req);
  REQUIRE_FALSE(too_small.ok());
  CHECK(too_small.error().message.find("over the budget prompt.max_tokens = " + std::to_string(bare->tokens - 1)) !=
        std::string::npos);
}
