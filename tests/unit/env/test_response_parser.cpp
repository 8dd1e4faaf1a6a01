// tests/unit/env/test_response_parser.cpp: the response parser on the answers models write and on
// malformed and adversarial ones (nested and tilde fences, decoys in comments and strings, CRLF,
// Unicode, huge input in linear time), and the format_error verdict it yields.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <string>

#include "core/config.hpp"
#include "env/prompt/response_parser.hpp"
#include "env/verdict.hpp"

using namespace crucible;
using namespace crucible::env;

namespace {

const std::string model_new = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                              "        return torch.relu(x)\n";

std::string answer(const std::string& code, const std::string& style = "###") {
  return style + " Performance Analysis\nThe reference launches one kernel per op.\n\n" + style +
         " Algorithm Design\nFuse everything into one kernel.\n\n" + style + " Code Implementation\n```python\n" + code +
         "```\n";
}

response_parse parse(const std::string& text, response_parse_options opt = {}) { return parse_response(text, opt); }

void expect_problem(const std::string& text, format_problem p, response_parse_options opt = {}) {
  auto r = parse(text, opt);
  INFO("text: " << text.substr(0, 400));
  REQUIRE_FALSE(r.ok);
  CHECK(r.problem == p);
  CHECK(r.message().find(to_string(p)) == 0);
}

} // namespace

TEST_CASE("a well-formed answer yields its three sections and its code") {
  auto r = parse(answer(model_new));
  REQUIRE(r.ok);
  CHECK(r.response.code == model_new);
  CHECK(r.response.language == "python");
  REQUIRE(r.response.sections.size() == 3);
  CHECK(r.response.sections[0] == std::pair<std::string, std::string>{"Performance Analysis", "The reference launches one kernel per op."});
  CHECK(r.response.sections[1].second == "Fuse everything into one kernel.");
  CHECK(r.response.sections[2].second == "```python\n" + model_new + "```");
}

TEST_CASE("headings in the forms models write are recognised, case-insensitively") {
  for (const char* style : {"###", "#", "##"}) {
    CAPTURE(style);
    CHECK(parse(answer(model_new, style)).ok);
  }
  const std::string forms[] = {
    "**Performance Analysis**\nslow\n**Algorithm Design**\nfuse\n**Code Implementation**\n",
    "1. Performance Analysis\nslow\n2. Algorithm Design\nfuse\n3. Code Implementation\n",
    "## 1. Performance Analysis:\nslow\n## 2) Algorithm Design\nfuse\n## 3. Code Implementation ##\n",
    "**1. Performance Analysis:** slow because of launches\n**2. Algorithm Design:** fuse\n**3. Code Implementation:**\n",
    "### PERFORMANCE ANALYSIS\nslow\n### algorithm design\nfuse\n- Code implementation:\n",
    "__Performance Analysis__\nslow\n* Algorithm Design\nfuse\n### Code Implementation\n",
  };
  for (const auto& f : forms) {
    CAPTURE(f);
    auto r = parse(f + std::string{"```python\n"} + model_new + "```\n");
    REQUIRE(r.ok);
    CHECK(r.response.sections.size() == 3);
  }
  auto inline_text = parse(forms[3] + std::string{"```python\n"} + model_new + "```\n");
  REQUIRE(inline_text.ok);
  CHECK(inline_text.response.sections[0].second == "slow because of launches");
  // Prose that merely starts with a section name is not a heading.
  expect_problem("Performance Analysis shows nothing.\n### Algorithm Design\nx\n### Code Implementation\n```python\n" +
                     model_new + "```\n",
                 format_problem::missing_section);
}

TEST_CASE("malformed responses become format problems with a reason") {
  expect_problem("", format_problem::empty);
  expect_problem(" \n\t\r\n ", format_problem::empty);
  expect_problem("### Performance Analysis\nI would fuse the kernels.", format_problem::no_code_block);
  expect_problem("```cuda\n__global__ void k() {}\n```\n", format_problem::no_code_block);
  expect_problem(answer(model_new).substr(0, answer(model_new).size() - 4), format_problem::unterminated_fence);
  expect_problem(answer("import torch\nclass Model(torch.nn.Module):\n    pass\n"), format_problem::no_model_new);
  auto r = parse("```python\n" + model_new + "```\n");
  REQUIRE_FALSE(r.ok);
  CHECK(r.problem == format_problem::missing_section);
  CHECK(r.detail == "the response lacks the section(s) \"Performance Analysis\", \"Algorithm Design\", \"Code Implementation\"");
  response_parse_options lax;
  lax.require_sections = false;
  CHECK(parse("```python\n" + model_new + "```\n", lax).ok);
  response_parse_options small;
  small.max_chars = 100;
  auto big = parse(answer(model_new), small);
  REQUIRE_FALSE(big.ok);
  CHECK(big.problem == format_problem::too_long);
  CHECK(big.detail.find("more than prompt.max_response_chars = 100") != std::string::npos);
}

TEST_CASE("a fake ModelNew in a comment, a string or a docstring does not count") {
  expect_problem(answer("import torch\n# class ModelNew(torch.nn.Module):\nclass Model(torch.nn.Module):\n    pass\n"),
                 format_problem::no_model_new);
  expect_problem(answer("s = 'class ModelNew(nn.Module):'\nt = \"\"\"\nclass ModelNew(nn.Module):\n\"\"\"\n"),
                 format_problem::no_model_new);
  expect_problem(answer("'''doc with an escaped \\''' quote\nclass ModelNew(x):\n'''\n"), format_problem::no_model_new);
  expect_problem(answer("if True:\n    class ModelNew(torch.nn.Module):\n        pass\n"), format_problem::no_model_new);
  expect_problem(answer("class ModelNewer(torch.nn.Module):\n    pass\n"), format_problem::no_model_new);
  // After a docstring closes, a real definition counts.
  CHECK(parse(answer("\"\"\"class ModelNew: not this\"\"\"\n" + model_new)).ok);
  CHECK(parse(answer("x = '#'  # a comment with 'quotes\nclass ModelNew:\n    pass\n")).ok);
}

TEST_CASE("multiple blocks: the last Python block defining ModelNew wins") {
  std::string first = "import torch\nclass ModelNew(torch.nn.Module):\n    version = 1\n";
  std::string second = "import torch\nclass ModelNew(torch.nn.Module):\n    version = 2\n";
  std::string text = "### Performance Analysis\n```python\n" + first + "```\n### Algorithm Design\nplan\n"
                     "```cuda\n__global__ void k() {}\n```\n### Code Implementation\n```python\n" + second +
                     "```\nUsage:\n```python\nm = ModelNew()\nprint(m)\n```\n```bash\npython run.py\n```\n";
  auto r = parse(text);
  REQUIRE(r.ok);
  CHECK(r.response.code == second);
  // A code block inside the analysis does not hide the headings after it.
  CHECK(r.response.sections.size() == 3);
  CHECK(r.response.sections[1].second.find("plan") == 0);
}

TEST_CASE("backtick-laden, nested and tilde fences") {
  // A four-backtick fence holds ``` lines; the inner fence is code, not a block.
  std::string nested = model_new + "DOC = '''\n```python\nclass ModelNew: fake\n```\n'''\n";
  auto r = parse("### Performance Analysis\na\n### Algorithm Design\nb\n### Code Implementation\n````python\n" + nested + "````\n");
  REQUIRE(r.ok);
  CHECK(r.response.code == nested);
  // Tildes.
  r = parse("### Performance Analysis\na\n### Algorithm Design\nb\n### Code Implementation\n~~~python\n" + model_new + "~~~\n");
  REQUIRE(r.ok);
  CHECK(r.response.code == model_new);
  // A tilde fence is not closed by backticks, nor a long fence by a shorter one.
  expect_problem("~~~python\n" + model_new + "```\n", format_problem::unterminated_fence);
  expect_problem("`````python\n" + model_new + "```\n", format_problem::unterminated_fence);
  // Inline triple backticks in prose are not fences.
  r = parse("### Performance Analysis\nuse ```torch.compile``` here\n### Algorithm Design\nb\n### Code Implementation\n```python\n" +
            model_new + "```\n");
  REQUIRE(r.ok);
  // An indented fence (inside a list item) keeps the code's own indentation.
  r = parse("### Performance Analysis\na\n### Algorithm Design\nb\n3. Code Implementation\n   ```python\n   import torch\n"
            "   class ModelNew(torch.nn.Module):\n       pass\n   ```\n");
  REQUIRE(r.ok);
  CHECK(r.response.code == "import torch\nclass ModelNew(torch.nn.Module):\n    pass\n");
  // A fence without language counts; ```py too.
  r = parse("### Performance Analysis\na\n### Algorithm Design\nb\n### Code Implementation\n```\n" + model_new + "```\n");
  REQUIRE(r.ok);
  CHECK(r.response.language.empty());
  r = parse("### Performance Analysis\na\n### Algorithm Design\nb\n### Code Implementation\n``` py\n" + model_new + "```\n");
  REQUIRE(r.ok);
  CHECK(r.response.language == "py");
  // Headings inside a code block are code.
  expect_problem("```python\n### Performance Analysis\n### Algorithm Design\n### Code Implementation\n" + model_new + "```\n",
                 format_problem::missing_section);
}

TEST_CASE("CRLF and Unicode") {
  std::string crlf;
  for (char c : answer(model_new)) {
    if (c == '\n')
      crlf += "\r\n";
    else
      crlf += c;
  }
  auto r = parse(crlf);
  REQUIRE(r.ok);
  CHECK(r.response.code == model_new);
  CHECK(r.response.sections[0].second == "The reference launches one kernel per op.");
  std::string uni = "import torch\n# 速い — ünïcode ✓ 🚀\nclass ModelNew(torch.nn.Module):\n    name = 'ModelNew ✓'\n";
  r = parse("### Performance Analysis\nПроизводительность 🚀\n### Algorithm Design\n设计\n### Code Implementation\n```python\n" + uni +
            "```\n");
  REQUIRE(r.ok);
  CHECK(r.response.code == uni);
  CHECK(r.response.sections[0].second == "Производительность 🚀");
}

TEST_CASE("huge adversarial input is parsed in linear time") {
  // Many unclosed-looking fence lines, backtick runs and heading decoys: work per byte is constant.
  auto build = [](std::size_t n) {
    std::string s = "### Performance Analysis\na\n### Algorithm Design\nb\n### Code Implementation\n";
    while (s.size() < n)
      s += "``x``` ```` `` ~~ **Performance** 1. Algorithm ### ####\n'''\"\"\"#\n";
    return s + "```python\n" + model_new + "```\n";
  };
  response_parse_options opt;
  opt.max_chars = 64u << 20;
  auto time_of = [&](std::size_t n) {
    auto text = build(n);
    auto t0 = std::chrono::steady_clock::now();
    auto r = parse(text, opt);
    auto dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(r.ok);
    return dt;
  };
  time_of(1u << 20); // warm up
  double small = time_of(4u << 20);
  double large = time_of(32u << 20);
  MESSAGE("4 MiB: " << small << " s, 32 MiB: " << large << " s");
  CHECK(large < 3.0);
  CHECK(large < 8 * small * 3 + 0.1); // 8x the input: a quadratic parser would take 64x
  // A huge code block with a huge Python string inside stays linear too.
  std::string code = "import torch\nX = \"\"\"\n" + std::string(8u << 20, 'a') + "\n\"\"\"\n" + model_new.substr(13);
  auto t0 = std::chrono::steady_clock::now();
  auto r = parse(answer(code), opt);
  CHECK(r.ok);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 2.0);
}

TEST_CASE("a format problem becomes a format_error verdict with the configured reward") {
  reward_options reward;
  reward.format_error = -0.25;
  reward.failed = -1.0;
  auto r = parse("no code here");
  REQUIRE_FALSE(r.ok);
  auto v = format_error_verdict(r, reward, "NVIDIA H100 80GB HBM3");
  CHECK(v.status == verdict_status::format_error);
  CHECK_FALSE(v.correct);
  CHECK(v.reward == -0.25);
  CHECK(std::isnan(v.speedup));
  CHECK(v.checks_failed == std::vector<std::string>{"format:no_code_block"});
  CHECK(v.message == "no_code_block: the response has no fenced Python code block");
  CHECK(v.hardware == "NVIDIA H100 80GB HBM3");
  auto json = to_json(v);
  CHECK(json.find("\"status\":\"format_error\"") != std::string::npos);
  auto back = verdict_from_json(json);
  REQUIRE(back.has_value());
  CHECK(*back == v);
  // The parser's options come from the config and the template's headings.
  prompt_config cfg;
  cfg.require_sections = false;
  cfg.max_response_chars = 1234;
  auto opt = parse_options_from(cfg, {"Analysis"});
  CHECK(opt.sections == std::vector<std::string>{"Analysis"});
  CHECK_FALSE(opt.require_sections);
  CHECK(opt.max_chars == 1234);
}
