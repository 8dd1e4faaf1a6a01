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
#include "tests/test_util/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace crucible;
using namespace crucible::jinja;

namespace {

const fs::path source_dir{CRUCIBLE_SOURCE_DIR};

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << p);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One case for both interpreters.
struct parity_case {
  std::string label;
  std::string templ;
  std::string context_json;             // plain template: its variables
  std::vector<chat_message> messages;   // chat case when context_json is empty
  std::map<std::string, std::string> special;
  bool add_generation_prompt = true;
  std::int64_t now = 1721995200;        // 2024-07-26 12:00 UTC
};

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

parity_case plain(std::string templ, std::string ctx = "{}") {
  parity_case c;
  c.label = "t";
  c.templ = std::move(templ);
  c.context_json = std::move(ctx);
  return c;
}

} // namespace

TEST_CASE("real chat templates render byte for byte as transformers renders them") {
  struct model {
    const char* file;
    std::map<std::string, std::string> special;
  };
  const std::vector<model> models = {
    {"qwen2.jinja", {{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}}},
    {"qwen2.5.jinja", {{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}}},
    {"llama3.jinja", {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}}},
    {"llama3.1.jinja", {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}}},
    {"llama3.2.jinja", {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}}},
    {"smollm2.jinja", {{"bos_token", "<|im_start|>"}, {"eos_token", "<|im_end|>"}, {"pad_token", "<|im_end|>"}}},
  };
  const std::string code = "```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                           "        return {'a': x}['a']  # {{ not jinja }} {% raw %}\n```\n";
  const std::vector<std::vector<chat_message>> conversations = {
    {{"system", "You are a GPU kernel expert."}, {"user", "Write a faster ReLU.\n\n" + code}},
    {{"user", "  Only a user message, with spaces around.  \n"}},
    {{"system", "  padded system  \n\n"},
     {"user", "first"},
     {"assistant", "an answer\n"},
     {"user", "second: Ünïcødé ✓ 速い 🚀 and \"quotes\" and 'single' \\ backslash"}},
    {{"system", ""}, {"user", "\r\nCRLF\r\nlines\r\n\ttab"}},
  };
  std::vector<parity_case> cases;
  for (const auto& m : models) {
    auto templ = read_text(source_dir / "tests/unit/jinja/chat_templates" / m.file);
    for (const auto& conv : conversations)
      for (bool gen : {true, false}) {
        parity_case c;
        c.label = m.file;
        c.templ = templ;
        c.messages = conv;
        c.special = m.special;
        c.add_generation_prompt = gen;
        cases.push_back(c);
      }
    // Another day for the templates that print today's date.
    parity_case later;
    later.label = m.file;
    later.templ = templ;
    later.messages = conversations[0];
    later.special = m.special;
    later.now = 1767225600 + 86400 * 40;
    cases.push_back(later);
  }
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
  const std::string msgs = R"({"messages": [{"role": "system", "content": " sys "}, {"role": "user", "content": "hi"}],
    "d": {"b": 2, "a": [1, 2.5, null, true, "x\"y\n\u00e9"], "items": 7, "k": {}}, "n": 3, "f": 2.5, "s": "  Hello World  ",
    "e": [], "z": 0, "u8": "h\u00e9llo \u901f\u3044 \ud83d\ude80", "none": null,
    "ws": "\u3000\u00a0 a\u2003b \u2003\n\u0085"})";
  std::vector<parity_case> cases;
  auto add = [&](std::string t, std::string ctx = "") { cases.push_back(plain(std::move(t), ctx.empty() ? msgs : ctx)); };
  // Whitespace control, trim_blocks and lstrip_blocks.
  add("a\n  {% if true %}\n  b\n  {% endif %}\nc\n");
  add("a\n  {%- if true -%}\n  b\n  {%- endif %}\n  c");
  add("a  {%+ if true %}b{% endif +%}\nc");
  add("  {# comment #}\nx\n  {#- c2 -#}  y");
  add("{{ 'a' }}\n{{ 'b' -}}\n  c {{- 'd' }}\n");
  add("x {% raw %}{{ not rendered }} {% if %}{% endraw %} y");
  add("  {% raw %}\n  {{ x }}\n  {% endraw %}\nz");
  add("\n\n  {% for m in messages %}\n    {{ m.role }}\n  {% endfor %}\n\n");
  add("line1\r\nline2\r\n{% if true %}\r\nx\r\n{% endif %}\r\n");
  add("a\n\n");
  add("{% if true %}  \t {% endif %}|");
  add("\t{% if true %}x{% endif %}");
  add("x\t{% if true %}y{% endif %}");
  add("{{ '{{' }} {{ '}}' }} {{ '{%' }}");
  add("{% set x = {'a': {'b': 1}} %}{{ x['a']['b'] }}{{ x.a.b }}");
  // Scoping.
  add("{% set x = 1 %}{% for i in [1,2] %}{{ x }}{% set x = i*10 %}{{ x }},{% endfor %}{{ x }}");
  add("{% for i in [1,2] %}{% if i == 1 %}{% set y = 5 %}{% endif %}{{ y }},{% endfor %}");
  add("{% if true %}{% set z = 3 %}{% endif %}{{ z }}");
  add("{% set ns = namespace(found=false, n=0) %}{% for m in messages %}{% if m.role == 'user' %}"
      "{% set ns.found = true %}{% set ns.n = ns.n + 1 %}{% endif %}{% endfor %}{{ ns.found }} {{ ns.n }}");
  add("{% set messages = messages[1:] %}{{ messages|length }}{{ messages[0].role }}");
  add("{% set a, b = [1, 'two'] %}{{ b }}{{ a }}");
  add("{% set t %}block {{ n }}{% endset %}[{{ t }}]");
  add("{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}");
  add("{% for k, v in d.items() %}{{ k }}:{% endfor %}{% for k in d %}{{ k }},{% endfor %}");
  // Loops.
  add("{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
      "{{ loop.revindex }}{{ loop.revindex0 }}|{% endfor %}");
  add("{% for i in range(5) if i is odd %}{{ i }}{{ loop.last }}{% endfor %}");
  add("{% for i in e %}x{% else %}empty{% endfor %}");
  add("{% for i in range(10) %}{% if i == 3 %}{% continue %}{% endif %}{% if i == 6 %}{% break %}{% endif %}{{ i }}{% endfor %}");
  add("{% for i in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }}/{{ loop.cycle('a','b') }} {% endfor %}");
  add("{% for c in u8 %}{{ c }}.{% endfor %}");
  add("{% for m in messages[::-1] %}{{ m.role }}{% endfor %}");
  add("{% for x in undefined_thing %}x{% endfor %}ok");
  // Values and operators.
  add("{{ 1 ~ none ~ true ~ 1.5 ~ [1,'a'] ~ {'k': none} ~ (1,) ~ (1, 'b') }}");
  add("{{ 1/2 }} {{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2**10 }} {{ 2**-1 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} "
      "{{ 0.00001 }} {{ 1.5e300*1e10 }} {{ 0.1 + 0.2 }} {{ -7.5 // 2 }} {{ 7.5 % -2 }} {{ 1_000 }} {{ 0x1F }} {{ 3 * 1.0 }}");
  add("{{ 'ab' * 3 }}{{ 2 * 'x' }}{{ [1] * 2 }}{{ [1,2] + [3] }}{{ -n }}{{ +f }}{{ -f }}");
  add("{{ 1 == 1.0 }}{{ true == 1 }}{{ [1] == [1.0] }}{{ undefined_a == undefined_b }}{{ none == none }}{{ 'a' != 'b' }}"
      "{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'a' < 'b' }}{{ [1,2] < [1,3] }}{{ d == {'b': 2} }}");
  add("{{ 'a' in 'cat' }}{{ 'b' in d }}{{ 2 in [1,2] }}{{ 'x' not in e }}{{ 'a' in undefined_c }}{{ 1 in d }}");
  add("{{ n and 'y' }}|{{ z and 'y' }}|{{ z or 'fallback' }}|{{ not e }}|{{ 'a' if z else 'b' }}|{{ 'a' if z }}|");
  add("{{ 'adj' 'acent' }} {{ \"dq\\n\" }} {{ 'esc \\t\\x41\\u00e9\\\\ \\q' }}");
  add("{{ s[2] }}{{ s[-3] }}{{ s[1:4] }}{{ s[::2] }}{{ s[100] }}|{{ u8[1] }}{{ u8[-1] }}{{ u8[2:5] }}");
  add("{{ e[0] }}|{{ d.missing }}|{{ d['missing'] }}|{{ none.x }}|{{ d.a[4] }}|{{ d._private }}|{{ e.x }}");
  add("{{ d['items'] }} {{ d.get('b') }} {{ d.get('q', 'dflt') }} {{ d.get('q') }} {{ d.keys()|list }} {{ d.values()|length }}");
  add("{{ (1, 2)[1] }}{{ [1, 2][-1] }}{{ [[1, 2], [3]][0][1] }}{{ {'a': 1}['a'] }}{{ true + 1 }}");
  // Filters.
  add("[{{ ws|trim }}|{{ ws.strip() }}|{{ ws.lstrip() }}|{{ ws.rstrip() }}|{{ ws.split() }}|{{ ws|length }}]");
  add("{{ s|trim }}|{{ s|length }}|{{ u8|length }}|{{ d|length }}|{{ e|count }}|{{ s|upper }}|{{ s|lower }}|{{ 'aB cD'|capitalize }}");
  add("{{ d|tojson }}|{{ d.a|tojson(indent=2) }}|{{ d|tojson(indent=4, sort_keys=true) }}|{{ u8|tojson }}|{{ f|tojson }}");
  add("{{ d|tojson(separators=(',', ':')) }}|{{ d.k|tojson }}|{{ e|tojson(indent=2) }}|{{ u8|tojson(ensure_ascii=true) }}");
  add("{{ undefined_x|default('dflt') }}|{{ ''|default('dflt') }}|{{ ''|default('dflt', true) }}|{{ none|d('x') }}");
  add("{{ [1, 'a', none]|join(', ') }}|{{ messages|map(attribute='role')|join('/') }}|{{ messages|join(',', attribute='role') }}");
  add("{{ [3, 1, 2]|first }}{{ [3, 1, 2]|last }}{{ e|first }}{{ 'xyz'|first }}{{ 'xyz'|list }}{{ 'abc'|reverse }}{{ [1,2]|reverse|list }}");
  add("{{ ['a', 'code_interpreter', 'b']|reject('equalto', 'code_interpreter')|join(', ') }}|"
      "{{ [1, 2, 3, 4]|select('odd')|list }}|{{ [0, 1, '', 'x']|select|list }}|{{ [1,2,3]|reject('gt', 1)|list }}");
  add("{{ messages|selectattr('role', 'equalto', 'user')|list|length }}|{{ messages|rejectattr('role', 'eq', 'user')|map(attribute='content')|first }}");
  add("{{ none|selectattr('role', 'equalto', 'user')|list }}|{{ none|select|list }}|{{ none|rejectattr('x')|list|length }}");
  add("{{ 'a-b-c'|replace('-', '+') }}|{{ 'a-b-c'|replace('-', '', 1) }}|{{ 42|string }}|{{ '42'|int + 1 }}|{{ '4.7'|int }}|"
      "{{ 'x'|int(7) }}|{{ '2.5'|float }}|{{ 3|float }}|{{ -3|abs }}|{{ [1, 2]|map('string')|join }}");
  add("{{ ' a b '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ ' a '.lstrip() }}|{{ ' a '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|"
      "{{ ' a  b '.split() }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x', 'bc')) }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}|"
      "{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'a b c'.split(' ', 1) }}");
  // Tests.
  add("{{ x is defined }}{{ n is defined }}{{ none is none }}{{ n is number }}{{ f is float }}{{ n is integer }}{{ true is integer }}"
      "{{ true is boolean }}{{ s is string }}{{ d is mapping }}{{ e is iterable }}{{ s is sequence }}{{ n is iterable }}"
      "{{ undefined_y is iterable }}{{ d is sequence }}{{ n is odd }}{{ n is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}");
  add("{{ n is not none }}{{ not n is defined }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ 2 is gt 1 }}{{ 2 is le(1) }}{{ 'a' is in 'cat' }}"
      "{{ raise_exception is callable }}{{ strftime_now is defined }}{{ true is true }}{{ 1 is true }}{{ false is false }}");
  add("{{ strftime_now('%d %b %Y') }} {{ strftime_now('%Y-%m-%d %H %A %j') }}");
  add("{{ dict(a=1, b='x')|tojson }} {{ namespace(a=1).a }} {{ range(2, 10, 3)|list }} {{ range(3)|list }}");
  // Errors both raise (the C++ side must fail too, never render something).
  add("{{ undefined_a + 'x' }}");
  add("{{ undefined_a.b }}");
  add("{{ 'a' + 1 }}");
  add("{{ raise_exception('refused: ' ~ n) }}");
  add("{{ 1 < 'a' }}");
  add("{{ none|length }}");
  add("{{ d|tojson(foo=1) }}");
  add("{% set x = 1 %}{% set x.y = 2 %}");
  add("{{ 1 / 0 }}");
  add("{% for a, b in [1, 2] %}{% endfor %}");
  add("{{ undefined_f() }}");
  add("{{ n() }}");
  add("{{ undefined_q|tojson }}");
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
  auto e = err("line one\n  {% macro f() %}{% endmacro %}");
  CHECK(e.code == errc::unsupported);
  CHECK(e.message == "tmpl.jinja:2:6: the 'macro' statement is not supported");
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
