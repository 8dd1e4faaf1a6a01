// tests/unit/jinja/parity_cases.hpp: the chat-template parity cases, one list for every engine:
// test_jinja.cpp renders them with jinja/ and with transformers and compares the bytes;
// tools/bench/compare_jinja renders them with other engines (docs/libraries.md). The six real chat
// templates over four conversations, and the small templates on the Jinja semantics they lean on.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "jinja/jinja.hpp"

namespace crucible::jinja::parity {

/// One case: a plain template with its variables (context_json), or a chat.
struct parity_case {
  std::string label;
  std::string templ;
  std::string context_json;             // plain template: its variables
  std::vector<chat_message> messages;   // chat case when context_json is empty
  std::map<std::string, std::string> special;
  bool add_generation_prompt = true;
  std::int64_t now = 1721995200;        // 2024-07-26 12:00 UTC
};

/// The file's bytes; std::runtime_error naming it when it cannot be read.
inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in.good())
    throw std::runtime_error("cannot read " + p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline parity_case plain(std::string templ, std::string ctx = "{}") {
  parity_case c;
  c.label = "t";
  c.templ = std::move(templ);
  c.context_json = std::move(ctx);
  return c;
}

/// The real chat templates (tests/unit/jinja/chat_templates under `source_dir`) over several
/// conversations, with and without the generation prompt, and on another day.
inline std::vector<parity_case> real_template_cases(const std::filesystem::path& source_dir) {
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
    // ByteDance-Seed/Seed-OSS-36B-Instruct's (as in llama.cpp's models/templates at 1eeb523): macros,
    // a dict with integer keys and dictsort; it sets its own special tokens.
    {"seed-oss.jinja", {{"bos_token", "<seed:bos>"}, {"eos_token", "<seed:eos>"}, {"pad_token", "<seed:pad>"}}},
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
  return cases;
}

/// Small templates on whitespace control, scoping, values, filters and tests, and errors both
/// engines must raise.
inline std::vector<parity_case> semantics_cases() {
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
  // Macros.
  add("{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}"
      "{{ greet('a') }}|{{ greet('b', 'Hi') }}|{{ greet(greeting='Yo', name='c') }}|{{ greet('d')|upper }}");
  add("{% set x = 5 %}{% macro m() %}{{ x }}{{ n }}{% endmacro %}{{ m() }}{% set x = 6 %}{{ m() }}");
  add("{% macro m() %}[{{ y }}]{% endmacro %}{% set y = 7 %}{{ m() }}");
  add("{% set z = 1 %}{% macro m() %}{% set z = 2 %}{{ z }}{% endmacro %}{{ m() }}{{ z }}");
  add("{% macro m(a, b) %}[{{ a }}|{{ b }}|{{ b is defined }}]{% endmacro %}{{ m(1) }}{{ m() }}");
  add("{% macro m(a, b=a * 2, c=b ~ '!') %}{{ a }} {{ b }} {{ c }}{% endmacro %}{{ m(3) }}|{{ m(3, c='x') }}");
  add("{% macro item(i) %}<{{ i }}:{{ loop is defined }}>{% endmacro %}{% for i in [1, 2] %}{{ item(i) }}{% endfor %}");
  add("{% for i in [1, 2] %}{% macro m() %}{{ i }}{% endmacro %}{{ m() }}{% endfor %}");
  add("{% macro m() -%}\n  x\n{%- endmacro %}[{{ m() }}]\n{% macro t() %}\n  y\n{% endmacro %}[{{ t() }}]");
  add("{% macro render(m) %}{{ m.role }}: {{ m.content|trim }}{% endmacro %}"
      "{% for m in messages %}{{ render(m) }};{% endfor %}{{ render is callable }}");
  add("{% macro outer(v) %}({{ inner(v) }}){% endmacro %}{% macro inner(v) %}{{ v * 2 }}{% endmacro %}{{ outer(4) }}");
  add("{% set ns = namespace(f=none) %}{% macro outer() %}{% macro inner(v) %}<{{ v }}>{% endmacro %}"
      "{% set ns.f = inner %}{% endmacro %}{{ outer() }}{{ ns.f(1) }}{{ ns.f(2) }}");
  // varargs, kwargs, call blocks and caller.
  add("{% macro m(a) %}{{ a }}|{{ varargs }}|{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}|{{ m(1) }}|{{ m(a=5, y='z') }}");
  add("{% macro ul(items) %}<ul>{% for i in items %}<li>{{ caller(i) }}</li>{% endfor %}</ul>{% endmacro %}"
      "{% call(x) ul([1, 2]) %}[{{ x * 10 }}]{% endcall %}|{% call(x, y='d') ul(['a']) %}{{ x }}{{ y }}{% endcall %}");
  add("{% macro wrap(tag='b') %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% set v = 'in' %}"
      "{% for m in messages %}{% call wrap('i') %}{{ m.role }}:{{ v }}{% endcall %}{% endfor %}{% call wrap() %}{% endcall %}");
  add("{% macro outer() %}{% macro inner() %}{{ kwargs }}{% endmacro %}{{ inner(a=1) }}{% endmacro %}{{ outer(b=2) }}");
  add("{% macro m() %}{{ caller is defined }}{% endmacro %}{{ m() }}|{% call m() %}x{% endcall %}");
  add("{% macro m() %}{{ caller() }}{% endmacro %}{{ m() }}");
  add("{% macro m() %}x{% endmacro %}{% call m() %}y{% endcall %}");
  add("{% call undefined_m() %}y{% endcall %}");
  add("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}");
  add("{% macro m(a) %}{% endmacro %}{{ m(b=1) }}");
  add("{% macro m(a) %}{% endmacro %}{{ m(1, a=2) }}");
  // Dict keys other than strings (Seed-OSS's reflection-interval table), and dictsort.
  add("{% set m = {0: 'z', 512: 'a', 1024: 'b', 'k': 1, true: 't', 1.0: 'one'} %}{{ m[512] }}|{{ m[0] }}|{{ m[1] }}|{{ m['k'] }}|"
      "{{ m|length }}|{{ 512 in m }}|{{ 3 in m }}|{{ '512' in m }}|{{ m.get(1024) }}|{{ m.get(7, 'no') }}|{{ m }}|{{ m.keys()|list }}");
  add("{% for k, v in {16384: 1, 0: 2, 512: 3}|dictsort %}{{ k }}={{ v }};{% endfor %}|{{ {'b': 1, 'A': 2, 'a': 3}|dictsort }}|"
      "{{ {'b': 1, 'A': 2}|dictsort(true) }}|{{ {'x': 2, 'y': 1}|dictsort(by='value') }}|{{ {1: 'a', 2: 'b'}|dictsort(reverse=true) }}|"
      "{{ d|dictsort|first }}");
  add("{{ {1: 'a', 'b': none, 2.5: true, none: 1, false: 0}|tojson }}|{{ {2: 'a', 1: 'b'}|tojson(sort_keys=true) }}|"
      "{{ {(1, 2): 'x'}[(1, 2)] }}|{{ {1: 2} == {1.0: 2} }}|{{ {1: 2} == {'1': 2} }}|{{ {1: 'x'}|items|list }}");
  add("{% set table = {0: 0, 512: 128, 1024: 256, 2048: 512} %}{% set ns = namespace(interval=none) %}"
      "{% for k, v in table|dictsort %}{% if ns.interval is none and 600 <= k %}{% set ns.interval = v %}{% endif %}{% endfor %}"
      "{{ ns.interval }}|{{ table[2048] }}");
  // Errors both raise (the C++ side must fail too, never render something).
  add("{{ {[1]: 2} }}");
  add("{{ {1: 'a', 'b': 2}|dictsort }}");
  add("{{ {'a': 1, 2: 3}|tojson(sort_keys=true) }}");
  add("{{ {(1, 2): 'x'}|tojson }}");
  add("{{ {'a': 1}|dictsort(by='size') }}");
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
  return cases;
}

} // namespace crucible::jinja::parity
