// tests/unit/jinja/test_jinja.cpp: jinja/ against transformers' own chat-template rendering
// (jinja_parity.py, run with the build's Python): the real chat templates of Qwen2, Qwen2.5(-Coder),
// Llama 3, 3.1 and 3.2 and SmolLM2 over several conversations, and a few hundred small templates
// on the semantics those templates lean on (whitespace control, scoping, filters, Python values),
// byte for byte; then errors that name line and column.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/json.hpp"
#include "core/json_parse.hpp"
#include "jinja/jinja.hpp"
#include "tests/integration/process.hpp"
#include "tests/unit/jinja/parity_cases.hpp"
#include "tests/test_util/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace crucible;
using namespace crucible::jinja;
using parity::parity_case;
using parity::read_text;

namespace {

const fs::path source_dir{CRUCIBLE_SOURCE_DIR};

struct python_result {
  bool ok = false;
  std::string text;
};

std::vector<python_result> run_python(const std::vector<parity_case>& cases) {
  testing::temp_dir dir{"crucible-jinja"};
  json_writer w;
  w.begin_array();
  for (const auto& c : cases) {
    w.begin_object().key("template").value(c.templ).key("now").value(c.now);
    if (!c.context_json.empty()) {
      w.key("context_json").value(c.context_json);
    } else {
      w.key("chat").begin_object().key("messages").begin_array();
      for (const auto& m : c.messages)
        w.begin_object().key("role").value(m.role).key("content").value(m.content).end_object();
      w.end_array().key("special").begin_object();
      for (const auto& [k, v] : c.special)
        w.key(k).value(v);
      w.end_object().key("add_generation_prompt").value(c.add_generation_prompt).end_object();
    }
    w.end_object();
  }
  w.end_array();
  auto in = dir.path() / "cases.json";
  auto out = dir.path() / "out.json";
  std::ofstream(in, std::ios::binary) << w.str();
  auto r = testing::run_process({CRUCIBLE_PYTHON, (source_dir / "tests/unit/jinja/jinja_parity.py").string(),
                                 in.string(), out.string()});
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  auto parsed = parse_json(read_text(out), "jinja_parity.py output");
  REQUIRE(parsed.ok());
  std::vector<python_result> results;
  for (const auto& item : parsed->as_array()) {
    python_result p;
    p.ok = item.find("ok")->as_bool();
    if (p.ok)
      p.text = item.find("text")->as_string();
    results.push_back(p);
  }
  REQUIRE(results.size() == cases.size());
  return results;
}

result<std::string> render_cpp(const parity_case& c) {
  auto prog = program::parse(c.templ, c.label);
  if (!prog.ok())
    return prog.error();
  render_options opt;
  opt.now = std::chrono::system_clock::from_time_t(static_cast<std::time_t>(c.now));
  if (!c.context_json.empty()) {
    auto ctx = parse_json(c.context_json, "context");
    REQUIRE_MESSAGE(ctx.ok(), c.label);
    return prog->render(value::from_json(*ctx), opt);
  }
  return render_chat(*prog, c.messages, c.special, c.add_generation_prompt, opt);
}

// Both must succeed with the same bytes, or both must fail; the C++ side must never answer
// "unsupported" for these cases.
void check_parity(const std::vector<parity_case>& cases) {
  auto py = run_python(cases);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    auto cpp = render_cpp(c);
    INFO("case " << i << " (" << c.label << "): " << c.templ);
    if (!cpp.ok()) {
      INFO("C++ error: " << cpp.error().message);
      CHECK(cpp.error().code != errc::unsupported);
      CHECK_FALSE(py[i].ok);
      continue;
    }
    INFO("python " << (py[i].ok ? "rendered" : "failed"));
    REQUIRE(py[i].ok);
    CHECK(*cpp == py[i].text);
  }
}

} // namespace

TEST_CASE("real chat templates render byte for byte as transformers renders them") {
  const auto cases = parity::real_template_cases(source_dir);
  check_parity(cases);
  for (const auto& c : cases) // parity alone would also accept two failures
    CHECK(render_cpp(c).ok());
}

TEST_CASE("the rendered Qwen2.5 and Llama 3.1 prompts have the expected shape") {
  // An anchor independent of Python: the documented formats of the two families.
  auto qwen = program::parse(read_text(source_dir / "tests/unit/jinja/chat_templates/qwen2.5.jinja"), "qwen2.5");
  REQUIRE(qwen.ok());
  std::vector<chat_message> msgs = {{"system", "S"}, {"user", "U"}};
  auto q = render_chat(*qwen, msgs, {});
  REQUIRE(q.ok());
  CHECK(*q == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
  auto llama = program::parse(read_text(source_dir / "tests/unit/jinja/chat_templates/llama3.1.jinja"), "llama3.1");
  REQUIRE(llama.ok());
  auto l = render_chat(*llama, msgs, {{"bos_token", "<|begin_of_text|>"}});
  REQUIRE(l.ok());
  CHECK(*l == "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
              "Today Date: 26 Jul 2024\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST_CASE("template semantics match jinja2: whitespace control, scoping, values, filters, tests") {
  const auto cases = parity::semantics_cases();
  check_parity(cases);
}

TEST_CASE("syntax errors and unsupported constructs name the template, line and column") {
  auto err = [](const std::string& t) {
    auto p = program::parse(t, "tmpl.jinja");
    if (p.ok()) {
      auto r = p->render(value{value_dict{}});
      REQUIRE_FALSE(r.ok());
      return r.error();
    }
    return p.error();
  };
  auto e = err("line one\n  {% filter upper %}x{% endfilter %}");
  CHECK(e.code == errc::unsupported);
  CHECK(e.message == "tmpl.jinja:2:6: the 'filter' statement is not supported");
  e = err("{{ {undefined_k: 1} }}"); // jinja2 renders it: not supported here, never rendered differently
  CHECK(e.code == errc::unsupported);
  CHECK(e.message == "tmpl.jinja:1:5: an undefined value as a dict key is not supported");
  e = err("{% call 1 %}{% endcall %}");
  CHECK(e.code == errc::invalid_arg);
  CHECK(e.message == "tmpl.jinja:1:9: expected a call after 'call'");
  e = err("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  CHECK(e.code == errc::invalid_arg);
  CHECK(e.message.find("macro 'f': calls nested deeper than 100") != std::string::npos);
  auto deep = program::parse("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{{ n }}{% endmacro %}{{ f(60) }}", "t");
  REQUIRE(deep.ok());
  auto counted = deep->render(value{value_dict{}});
  REQUIRE(counted.ok()); // recursion within the limit renders
  CHECK(counted->starts_with("0123"));
  e = err("{% macro f(a=1, b) %}{% endmacro %}");
  CHECK(e.code == errc::invalid_arg);
  CHECK(e.message == "tmpl.jinja:1:17: non-default argument follows default argument");
  e = err("{{ x|nosuchfilter }}");
  CHECK(e.code == errc::invalid_arg);
  CHECK(e.message == "tmpl.jinja:1:6: no filter named 'nosuchfilter'");
  e = err("ok\n{{ 'x'|wordwrap(3) }}");
  CHECK(e.code == errc::unsupported);
  CHECK(e.message == "tmpl.jinja:2:7: the filter 'wordwrap' is not supported");
  e = err("{% if true %}no end");
  CHECK(e.code == errc::invalid_arg);
  CHECK(e.message.find("tmpl.jinja:1:20: unexpected end of template, expected 'elif' or 'else' or 'endif'") == 0);
  e = err("{{ 1 + }}");
  CHECK(e.code == errc::invalid_arg);
  CHECK(e.message == "tmpl.jinja:1:8: unexpected end of print statement");
  e = err("{% for x in y recursive %}{% endfor %}");
  CHECK(e.code == errc::unsupported);
  e = err("{{ 9223372036854775807 + 1 }}");
  CHECK(e.code == errc::unsupported);
  CHECK(e.message.find("tmpl.jinja:1:24: integer overflow") == 0);
  e = err("{{ 'a'.title() }}");
  CHECK(e.code == errc::unsupported);
  e = err("{{ x.__class__ }}");
  CHECK(e.code == errc::unsupported);
  e = err("{{ 'é'|upper }}");
  CHECK(e.code == errc::unsupported);
  e = err("{% break %}");
  CHECK(e.message == "tmpl.jinja:1:4: 'break' outside of a loop");
  e = err("x {# never closed");
  CHECK(e.message == "tmpl.jinja:1:3: missing end of comment tag");
  e = err("{{ raise_exception('bad role') }}");
  CHECK(e.code == errc::invalid_arg);
  CHECK(e.message == "tmpl.jinja:1:4: the template raised an exception: bad role");
  // An unsupported construct in a branch that is not taken does not stop the rendering.
  auto p = program::parse("{% if false %}{{ x|wordwrap(3) }}{% else %}fine{% endif %}", "t");
  REQUIRE(p.ok());
  auto r = p->render(value{value_dict{}});
  REQUIRE(r.ok());
  CHECK(*r == "fine");
}

TEST_CASE("python_float_repr follows Python's repr") {
  CHECK(python_float_repr(1.0) == "1.0");
  CHECK(python_float_repr(0.1) == "0.1");
  CHECK(python_float_repr(1e16) == "1e+16");
  CHECK(python_float_repr(1e15) == "1000000000000000.0");
  CHECK(python_float_repr(1.5e-5) == "1.5e-05");
  CHECK(python_float_repr(0.0001) == "0.0001");
  CHECK(python_float_repr(-2.5) == "-2.5");
  CHECK(python_float_repr(-0.0) == "-0.0");
  CHECK(python_float_repr(123456789012345678.0) == "1.2345678901234568e+17");
}
