// tests/unit/env/test_prompt.cpp: the prompt-template file (the shipped one and broken ones) and
// the prompt builder: placeholders, exemplar order, the token budget (shortening, then dropping the
// lowest speedup, then an error naming budget and size) and the chat template.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/config.hpp"
#include "env/prompt/prompt.hpp"
#include "tests/test_util/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace crucible;
using namespace crucible::env;

namespace {

const fs::path source_dir{CRUCIBLE_SOURCE_DIR};

prompt_template shipped() {
  auto t = load_prompt_template(source_dir / "configs/prompts/contrastive.yaml");
  REQUIRE_MESSAGE(t.ok(), (t.ok() ? "" : t.error().message));
  return *t;
}

// A deterministic stand-in for a tokenizer: one token per started 4 bytes.
std::size_t four_bytes(std::string_view s) { return (s.size() + 3) / 4; }

std::string code_of(const std::string& tag, std::size_t lines) {
  std::string c = "import torch\n\nclass ModelNew(torch.nn.Module):  # " + tag + "\n    def forward(self, x):\n";
  for (std::size_t i = 0; i < lines; ++i)
    c += "        x = x * 1.0 + 0.0  # step " + std::to_string(i) + " of " + tag + "\n";
  return c + "        return x\n";
}

prompt_request request_with(std::vector<exemplar_code> ex) {
  prompt_request r;
  r.task_name = "level1/19_ReLU";
  r.reference_code = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
                     "def get_inputs():\n    return [torch.randn(16, 16)]\ndef get_init_inputs():\n    return []\n";
  r.hardware = "NVIDIA H100 80GB HBM3";
  r.exemplars = std::move(ex);
  return r;
}

prompt_builder builder(std::int64_t max_tokens, chat_format chat = {}, std::int64_t min_chars = 200,
                       std::int64_t max_chars = 0) {
  prompt_config cfg;
  cfg.max_tokens = max_tokens;
  cfg.min_exemplar_chars = min_chars;
  cfg.max_exemplar_chars = max_chars;
  auto b = prompt_builder::create(shipped(), cfg, chat, four_bytes);
  REQUIRE_MESSAGE(b.ok(), (b.ok() ? "" : b.error().message));
  return std::move(*b);
}

std::string problems(const std::string& yaml) {
  auto t = parse_prompt_template(yaml, "bad.yaml");
  REQUIRE_FALSE(t.ok());
  CHECK(t.error().code == errc::config);
  return t.error().message;
}

// The shipped file with one line replaced, for the refusal tests.
std::string shipped_text() {
  std::ifstream in(source_dir / "configs/prompts/contrastive.yaml");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string replace_once(std::string s, const std::string& from, const std::string& to) {
  auto at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}

} // namespace

TEST_CASE("the shipped template loads and resolve_prompt_template finds it") {
  auto t = shipped();
  CHECK(t.sections == std::vector<std::string>{"Performance Analysis", "Algorithm Design", "Code Implementation"});
  auto p = resolve_prompt_template("");
  REQUIRE(p.ok());
  CHECK(fs::equivalent(*p, source_dir / "configs/prompts/contrastive.yaml"));
  auto missing = resolve_prompt_template("/nonexistent/prompts.yaml");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().code == errc::not_found);
  CHECK(missing.error().message.find("/nonexistent/prompts.yaml") != std::string::npos);
  CHECK(missing.error().message.find("prompt.template") != std::string::npos);
}

TEST_CASE("a bad template file is refused naming the file, line and key") {
  const auto good = shipped_text();
  auto msg = problems(replace_once(good, "  ### Implementation {index}: speedup {speedup}x on {hardware}",
                                   "  ### Implementation {index}: speedup {speedup}x on {gpu}"));
  CHECK(msg.find("bad.yaml:") == 0);
  CHECK(msg.find(": exemplar: unknown placeholder {gpu} (allowed here: {index}, {speedup}, {hardware}, {code}, {fence})")
        != std::string::npos);
  msg = problems(replace_once(good, "no_exemplars: |-", "nothing_here: |-"));
  CHECK(msg.find("nothing_here: unknown key") != std::string::npos);
  CHECK(msg.find("bad.yaml: no_exemplars: missing") != std::string::npos);
  msg = problems(replace_once(good, "  {code}\n", "  the code\n"));
  CHECK(msg.find("exemplar: must contain the placeholder {code}") != std::string::npos);
  msg = problems(replace_once(good, "Task: {task_name}.", "Task: {task_name."));
  CHECK(msg.find("task: a '{' that does not start a placeholder") != std::string::npos);
  msg = problems(replace_once(good, "  ### Algorithm Design\n", "  ### Design\n"));
  CHECK(msg.find("instructions: does not mention the section \"Algorithm Design\"") != std::string::npos);
  msg = problems(replace_once(good, "version: 1", "version: 2"));
  CHECK(msg.find("bad.yaml:5: version: expected 1") != std::string::npos);
  msg = problems(replace_once(good, "system: |-", "system: [1, 2]\nunused: |-"));
  CHECK(msg.find("system: expected a non-empty string") != std::string::npos);
  msg = problems("just: [unclosed");
  CHECK(msg.find("bad.yaml:") == 0);
  auto absent = load_prompt_template("/nonexistent/x.yaml");
  REQUIRE_FALSE(absent.ok());
  CHECK(absent.error().code == errc::not_found);
}

TEST_CASE("the prompt holds the task, the exemplars by increasing speedup, and the sections") {
  auto b = builder(100000);
  auto req = request_with({{code_of("fast", 2), 2.5, "NVIDIA H100 80GB HBM3"},
                           {code_of("slow {braces} {code}", 2), 1.1, "NVIDIA L40S"},
                           {code_of("mid", 2), 1.7, "NVIDIA H100 80GB HBM3"}});
  auto p = b.build(req);
  REQUIRE(p.ok());
  CHECK(p->text == p->system + "\n\n" + p->user); // no chat template: plain text
  CHECK(p->tokens == four_bytes(p->text));
  const auto& u = p->user;
  CHECK(u.find("Task: level1/19_ReLU. Target hardware: NVIDIA H100 80GB HBM3.") != std::string::npos);
  CHECK(u.find(req.reference_code) != std::string::npos);
  auto slow = u.find("### Implementation 1: speedup 1.10x on NVIDIA L40S");
  auto mid = u.find("### Implementation 2: speedup 1.70x on NVIDIA H100 80GB HBM3");
  auto fast = u.find("### Implementation 3: speedup 2.50x on NVIDIA H100 80GB HBM3");
  REQUIRE(slow != std::string::npos);
  REQUIRE(mid != std::string::npos);
  REQUIRE(fast != std::string::npos);
  CHECK(slow < mid);
  CHECK(mid < fast);
  CHECK(u.find("# slow {braces} {code}") != std::string::npos); // code is never re-scanned for placeholders
  CHECK(u.find("Below are 3 earlier implementations") != std::string::npos);
  for (const char* s : {"### Performance Analysis", "### Algorithm Design", "### Code Implementation", "ModelNew",
                        "Do not cache or reuse results"})
    CHECK(u.find(s) != std::string::npos);
  for (const auto& e : p->exemplars) {
    CHECK(e.kept);
    CHECK_FALSE(e.shortened);
  }
  auto none = b.build(request_with({}));
  REQUIRE(none.ok());
  CHECK(none->user.find("No earlier implementation of this task has been measured yet") != std::string::npos);
  CHECK(none->exemplars.empty());
}

TEST_CASE("code holding a fence is shown inside a longer fence") {
  auto b = builder(100000);
  std::string tricky = code_of("x", 1) + "DOC = '''\n```python\nnot the end\n```\n'''\n";
  auto p = b.build(request_with({{tricky, 1.5, "h"}}));
  REQUIRE(p.ok());
  CHECK(p->user.find("````python\n" + tricky + "\n````") != std::string::npos);
}

TEST_CASE("the budget shortens exemplars first, then drops the lowest speedup, and never exceeds") {
  auto req = request_with({{code_of("a", 60), 1.2, "h"}, {code_of("b", 60), 3.0, "h"}, {code_of("c", 60), 2.0, "h"}});
  auto all = builder(1000000).build(req);
  REQUIRE(all.ok());
  const std::size_t full = all->tokens;
  auto none = builder(1000000).build(request_with({}));
  REQUIRE(none.ok());
  const std::size_t base = none->tokens;

  SUBCASE("a little short: all three kept, shortened, within budget") {
    auto p = builder(static_cast<std::int64_t>(full - 200)).build(req);
    REQUIRE(p.ok());
    CHECK(p->tokens <= full - 200);
    CHECK(p->tokens == four_bytes(p->text));
    for (const auto& e : p->exemplars) {
      CHECK(e.kept);
      CHECK(e.shortened);
      CHECK(e.shown_bytes >= 200);
    }
    CHECK(p->user.find("more lines not shown]") != std::string::npos);
    // The longest common cut that fits: one more token of room would not fit a longer one... the
    // result uses the budget closely (within one exemplar line per exemplar).
    CHECK(p->tokens + 3 * 20 >= full - 200);
  }
  SUBCASE("room for about two: the lowest speedup goes first") {
    // Shortening may not go below 2500 bytes here, so three do not fit and one is dropped.
    const std::size_t per = (full - base) / 3;
    auto p = builder(static_cast<std::int64_t>(base + 2 * per + 10), {}, 2500).build(req);
    REQUIRE(p.ok());
    CHECK(p->tokens <= base + 2 * per + 10);
    CHECK_FALSE(p->exemplars[0].kept); // speedup 1.2
    CHECK(p->exemplars[1].kept);       // 3.0
    CHECK(p->exemplars[2].kept);       // 2.0
    CHECK(p->user.find("# a\n") == std::string::npos);
    CHECK(p->user.find("Below are 2 earlier implementations") != std::string::npos);
  }
  SUBCASE("room for one shortened exemplar only: the best one stays") {
    auto p = builder(static_cast<std::int64_t>(base + 150), {}, 200).build(req);
    REQUIRE(p.ok());
    CHECK(p->tokens <= base + 150);
    CHECK_FALSE(p->exemplars[0].kept);
    CHECK(p->exemplars[1].kept);
    CHECK(p->exemplars[1].shortened);
    CHECK_FALSE(p->exemplars[2].kept);
  }
  SUBCASE("no room for any exemplar: the reference only") {
    auto p = builder(static_cast<std::int64_t>(base + 5)).build(req);
    REQUIRE(p.ok());
    CHECK(p->tokens <= base + 5);
    for (const auto& e : p->exemplars)
      CHECK_FALSE(e.kept);
    CHECK(p->user.find("No earlier implementation") != std::string::npos);
  }
  SUBCASE("not even the reference fits: an error naming the budget and the size") {
    auto p = builder(static_cast<std::int64_t>(base - 1)).build(req);
    REQUIRE_FALSE(p.ok());
    CHECK(p.error().code == errc::invalid_arg);
    CHECK(p.error().message == "prompt for level1/19_ReLU: even without exemplars it is " + std::to_string(base) +
                                   " tokens, over the budget prompt.max_tokens = " + std::to_string(base - 1));
  }
  SUBCASE("max_exemplar_chars cuts every exemplar up front") {
    auto p = builder(1000000, {}, 200, 400).build(req);
    REQUIRE(p.ok());
    for (const auto& e : p->exemplars) {
      CHECK(e.kept);
      CHECK(e.shortened);
      CHECK(e.shown_bytes <= 400);
      CHECK(e.shown_bytes >= 200);
    }
  }
}

TEST_CASE("the budget holds for every budget between nothing and everything") {
  auto req = request_with({{code_of("a", 30), 1.2, "h"}, {code_of("b", 45), 3.0, "h"}, {code_of("c", 20), 2.0, "h"}});
  auto full = builder(1000000).build(req);
  auto base = builder(1000000).build(request_with({}));
  REQUIRE(full.ok());
  REQUIRE(base.ok());
  std::size_t kept_before = 0;
  for (std::size_t budget = base->tokens; budget <= full->tokens; budget += 7) {
    auto p = builder(static_cast<std::int64_t>(budget), {}, 100).build(req);
    REQUIRE(p.ok());
    CHECK(p->tokens <= budget);
    std::size_t kept = 0;
    for (const auto& e : p->exemplars)
      kept += e.kept ? 1 : 0;
    CHECK(kept >= kept_before); // more room never shows fewer exemplars
    kept_before = kept;
    // Whatever is kept is the best by speedup.
    if (kept >= 1)
      CHECK(p->exemplars[1].kept);
    if (kept >= 2)
      CHECK(p->exemplars[2].kept);
  }
  CHECK(kept_before == 3);
}

TEST_CASE("the chat template wraps the two messages, and the budget counts its tokens") {
  chat_format chat;
  chat.chat_template = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                       "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  auto b = builder(100000, chat);
  auto p = b.build(request_with({{code_of("a", 2), 1.5, "h"}}));
  REQUIRE(p.ok());
  CHECK(p->text == "<|im_start|>system\n" + p->system + "<|im_end|>\n<|im_start|>user\n" + p->user +
                       "<|im_end|>\n<|im_start|>assistant\n");
  CHECK(p->tokens == four_bytes(p->text));
  prompt_config none_cfg;
  none_cfg.chat_template = chat_template_mode::none;
  auto plain = prompt_builder::create(shipped(), none_cfg, chat, four_bytes);
  REQUIRE(plain.ok());
  auto q = plain->build(request_with({}));
  REQUIRE(q.ok());
  CHECK(q->text == q->system + "\n\n" + q->user);
  chat.chat_template = "{% filter upper %}{% endfilter %}";
  auto bad = prompt_builder::create(shipped(), prompt_config{}, chat, four_bytes);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code == errc::unsupported);
  CHECK(bad.error().message.find("chat_template:1:4:") == 0);
  chat.chat_template = "{{ raise_exception('no system role') }}";
  auto raising = prompt_builder::create(shipped(), prompt_config{}, chat, four_bytes);
  REQUIRE(raising.ok());
  auto r = raising->build(request_with({}));
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("chat template: chat_template:1:4: the template raised an exception: no system role") == 0);
}

TEST_CASE("a multi-turn episode's next prompt: earlier answers and feedback as messages, older turns shortened first") {
  chat_format chat;
  chat.chat_template = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                       "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  auto roomy = builder(100000, chat);
  auto first = roomy.build(request_with({}));
  REQUIRE(first.ok());
  const std::string a1 = "### Code Implementation\n```python\n" + code_of("turn one", 40) + "```",
                    a2 = "### Code Implementation\n```python\n" + code_of("turn two", 40) + "```";
  const std::vector<episode_turn> turns{{a1, "Turn 1: incorrect. trial 0: 12 of 4096 elements outside atol"},
                                        {a2, "Turn 2: correct, 1.20x faster than the reference"}};
  auto whole = roomy.continue_episode(*first, turns);
  REQUIRE(whole.ok());
  auto msg = [](const std::string& role, const std::string& content) {
    return "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
  };
  CHECK(whole->text == msg("system", first->system) + msg("user", first->user) + msg("assistant", a1) +
                         msg("user", turns[0].feedback) + msg("assistant", a2) + msg("user", turns[1].feedback) +
                         "<|im_start|>assistant\n");
  CHECK(whole->tokens == four_bytes(whole->text));

  // A budget that holds all but the first answer: that one (the oldest) is left out, the latest kept.
  auto tight = builder(static_cast<std::int64_t>(whole->tokens - a1.size() / 4 + 40), chat);
  auto shorter = tight.continue_episode(*first, turns);
  REQUIRE_MESSAGE(shorter.ok(), (shorter.ok() ? "" : shorter.error().message));
  CHECK(shorter->text.find(a1) == std::string::npos);
  CHECK(shorter->text.find("[the answer of turn 1 is left out: " + std::to_string(a1.size()) + " characters]") !=
        std::string::npos);
  CHECK(shorter->text.find(a2) != std::string::npos);
  CHECK(shorter->text.find(turns[0].feedback) != std::string::npos);
  CHECK(shorter->tokens <= static_cast<std::size_t>(whole->tokens - a1.size() / 4 + 40));

  // Not even the first prompt and the latest turn fit: refused, naming the budget.
  auto tiny = builder(static_cast<std::int64_t>(first->tokens + 10), chat);
  auto refused = tiny.continue_episode(*first, turns);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message.find("prompt for turn 3:") == 0);
  CHECK(refused.error().message.find("prompt.max_tokens") != std::string::npos);

  // Without a chat template: the messages one after the other.
  prompt_config none_cfg;
  none_cfg.chat_template = chat_template_mode::none;
  auto plain = prompt_builder::create(shipped(), none_cfg, chat, four_bytes);
  REQUIRE(plain.ok());
  auto q = plain->continue_episode(*first, std::span<const episode_turn>(turns).first(1));
  REQUIRE(q.ok());
  CHECK(q->text == first->system + "\n\n" + first->user + "\n\n" + a1 + "\n\n" + turns[0].feedback);
}
