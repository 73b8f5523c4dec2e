// The Jinja interpreter, construct by construct, on small templates. Every expected string
// was rendered by Python Jinja2 3.1 (Debian python3-jinja2) in transformers' environment
// (sandboxed, trim_blocks, lstrip_blocks, loopcontrols, json.dumps tojson) with kVars.
#include <gtest/gtest.h>

#include "chat/jinja.h"
#include "core/error.h"

namespace mere::jinja {
namespace {

const char* kVars = R"~({"d": {"b": 1, "a": [1, 2.5, null, true], "s": "x"}, "s": "héllo wörld", "n": null, "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "x": 1}, {"role": "user", "content": "bye"}], "tools": [{"type": "function", "function": {"name": "f", "d": 0.5}}, {"type": "other", "function": {"name": "g"}}], "big": 1e+20, "small": 1e-07, "f": 2.0})~";

RenderOptions fixed_clock() {
  RenderOptions o;
  o.now = [] {
    std::tm tm{};
    tm.tm_year = 2026 - 1900;
    tm.tm_mon = 10;
    tm.tm_mday = 29;
    tm.tm_hour = 14;
    tm.tm_min = 5;
    tm.tm_sec = 9;
    tm.tm_wday = 0;
    tm.tm_yday = 332;
    return tm;
  };
  return o;
}

std::string render(const std::string& source) {
  Value vars = Value::from_json(nlohmann::ordered_json::parse(kVars));
  return Template(source, "test.jinja").render(vars.as_dict(), fixed_clock());
}

std::string error_of(const std::string& source) {
  try {
    render(source);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

struct Case {
  const char* name;
  const char* source;
  const char* expected;
};

const Case kCases[] = {
    {"text_and_whitespace_control",
     R"~(a  {{- ' b ' -}}  c
  {%- if true %} d {% endif -%}
 e)~",
     R"~(a b c d e)~"},
    {"trim_blocks",
     R"~({% if true %}
x
{% endif %}
y
)~",
     R"~(x
y)~"},
    {"lstrip_blocks",
     R"~(  {% if true %}
    x
  {% endif %}
  {{ 'v' }}
	{# comment #}
z)~",
     R"~(    x
  v
z)~"},
    {"lstrip_plus_keeps",
     R"~(  {%+ if true %}x{% endif %}|)~",
     R"~(  x|)~"},
    {"comments",
     R"~(a{# c #}b
{#- strip -#}
  c  {# keep #}
d)~",
     R"~(abc  d)~"},
    {"if_elif_else",
     R"~({% for i in [1, 2, 3] %}{% if i == 1 %}one{% elif i == 2 %}two{% else %}many{% endif %},{% endfor %})~",
     R"~(one,two,many,)~"},
    {"for_loop_vars",
     R"~({% for m in msgs %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.previtem.role if loop.previtem is defined else '-' }}{{ loop.nextitem.role if loop.nextitem is defined else '-' }};{% endfor %})~",
     R"~(01TrueFalse33-assistant;12FalseFalse32useruser;23FalseTrue31assistant-;)~"},
    {"for_else",
     R"~({% for x in [] %}x{% else %}empty{% endfor %}{% for x in n|default([], true) %}{% else %}!{% endfor %})~",
     R"~(empty!)~"},
    {"for_filter",
     R"~({% for m in msgs if m.role == 'user' %}{{ loop.index }}:{{ m.content }} {% endfor %})~",
     R"~(1:hi 2:bye )~"},
    {"for_dict_items",
     R"~({% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d|items %}{{ k }};{% endfor %}{% for k in d %}{{ k }}{% endfor %})~",
     R"~(b=1;a=[1, 2.5, None, True];s=x;b;a;s;bas)~"},
    {"loop_controls",
     R"~({% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %})~",
     R"~(0134)~"},
    {"set_scoping",
     R"~({% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }} {% endfor %}{{ x }}{% if true %}{% set x = 7 %}{% endif %}{{ x }})~",
     R"~(110 120 17)~"},
    {"namespace",
     R"~({% set ns = namespace(count=0, last='') %}{% for m in msgs %}{% set ns.count = ns.count + 1 %}{% set ns.last = m.role %}{% endfor %}{{ ns.count }} {{ ns.last }})~",
     R"~(3 user)~"},
    {"set_block_and_tuple",
     R"~({% set a, b = 1, 'two' %}{% set blk %}[{{ a }}|{{ b }}]{% endset %}{{ blk }}{{ blk|length }})~",
     R"~([1|two]7)~"},
    {"macro",
     R"~({% macro tag(name, body='none', close=true) %}<{{ name }}>{{ body }}{% if close %}</{{ name }}>{% endif %}{% endmacro %}{{ tag('a') }}{{ tag('b', 'x') }}{{ tag('c', close=false, body=3) }})~",
     R"~(<a>none</a><b>x</b><c>3)~"},
    {"operators",
     R"~({{ 7 // 2 }} {{ -7 // 2 }} {{ 7 / 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1 + 2.5 }} {{ 'a' * 3 }} {{ [1] + [2] }} {{ 3 - 5 }} {{ 10 / 4 * 2 }})~",
     R"~(3 -4 3.5 2 1024 3.5 aaa [1, 2] -2 5.0)~"},
    {"tilde_concat",
     R"~({{ 'a' ~ 1 ~ 2.0 ~ none ~ true ~ undefined_var ~ [1, 'x'] ~ d.b }})~",
     R"~(a12.0NoneTrue[1, 'x']1)~"},
    {"comparisons_and_logic",
     R"~({{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ 'b' >= 'a' }} {{ none == none }} {{ 1 and 'x' }} {{ 0 or 'y' }} {{ not [] }} {{ true == 1 }})~",
     R"~(True True True True True x y True True)~"},
    {"in_operator",
     R"~({{ 'ell' in s }} {{ 3 in [1, 2] }} {{ 'a' in d }} {{ 'z' not in d }} {{ 'x' in missing }} {{ 2.5 in d.a }})~",
     R"~(False False True True False True)~"},
    {"slicing",
     R"~({{ s[::-1] }}|{{ s[1:4] }}|{{ s[-3:] }}|{{ d.a[1:] }}|{{ d.a[::-1] }}|{{ d.a[::2] }}|{{ s[:0] }}|{{ msgs[-1].content }}|{{ s[1] }})~",
     R"~(dlröw olléh|éll|rld|[2.5, None, True]|[True, None, 2.5, 1]|[1, None]||bye|é)~"},
    {"literals",
     R"~({{ [1, 'a', none, true, 1.5] }} {{ {'k': 'v', 'n': [1]} }} {{ ('t', 1) | list }} {{ "q'uote" }} {{ 'd"q' }} {{ 'both\'"' }})~",
     R"~([1, 'a', None, True, 1.5] {'k': 'v', 'n': [1]} ['t', 1] q'uote d"q both'")~"},
    {"attribute_and_item_access",
     R"~({{ msgs[0].role }} {{ msgs[1]['content'] }} {{ d['a'][0] }} {{ msgs[5] }}|{{ msgs[0].nope }}|{{ d.get('b') }} {{ d.get('zz', 'dflt') }} {{ d.get('zz') }})~",
     R"~(user yo 1 ||1 dflt None)~"},
    {"string_methods",
     R"~({{ s.startswith('hé') }} {{ s.endswith(('x', 'ld')) }} {{ 'a,b,,c'.split(',') }} {{ '  a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ ' x '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'xxaxx'.rstrip('x') }}|{{ 'aXa'.replace('a', 'b') }} {{ s.upper() }} {{ 'MiXed'.lower() }} {{ "they're bill's o'neil".title() }} {{ 'hello world'.capitalize() }})~",
     R"~(True True ['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] x|axx|xxa|bXb HÉLLO WÖRLD mixed They'Re Bill'S O'Neil Hello world)~"},
    {"dict_methods",
     R"~({{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }})~",
     R"~(['b', 'a', 's'] [1, [1, 2.5, None, True], 'x'] [('b', 1), ('a', [1, 2.5, None, True]), ('s', 'x')])~"},
    {"filter_tojson",
     R"~({{ d|tojson }}
{{ tools|tojson(indent=2) }}
{{ s|tojson }} {{ 'é"\n'|tojson(ensure_ascii=true) }} {{ [big, small, f, 0.1, -0.0, 123456789012]|tojson }} {{ d|tojson(sort_keys=true) }} {{ d|tojson(separators=(',', ':')) }})~",
     R"~({"b": 1, "a": [1, 2.5, null, true], "s": "x"}
[
  {
    "type": "function",
    "function": {
      "name": "f",
      "d": 0.5
    }
  },
  {
    "type": "other",
    "function": {
      "name": "g"
    }
  }
]
"héllo wörld" "\u00e9\"\n" [1e+20, 1e-07, 2.0, 0.1, -0.0, 123456789012] {"a": [1, 2.5, null, true], "b": 1, "s": "x"} {"b":1,"a":[1,2.5,null,true],"s":"x"})~"},
    {"filter_string_basics",
     R"~({{ '  pad  '|trim }}|{{ 'xxpadxx'|trim('x') }}|{{ s|length }} {{ msgs|length }} {{ d|count }} {{ s|upper }} {{ 'ABC'|lower }} {{ 'hello big-world (x)'|title }} {{ 'hELLO'|capitalize }} {{ 3|string }} {{ none|string }})~",
     R"~(pad|pad|11 3 3 HÉLLO WÖRLD abc Hello Big-World (X) Hello 3 None)~"},
    {"filter_join_default",
     R"~({{ [1, 'a', none]|join(', ') }}|{{ msgs|join('/', attribute='role') }}|{{ missing|default('dflt') }}|{{ ''|default('empty', true) }}|{{ ''|default('kept') }}|{{ n|default('none-kept') }})~",
     R"~(1, a, None|user/assistant/user|dflt|empty||None)~"},
    {"filter_first_last_map_select",
     R"~({{ msgs|first }} {{ (msgs|last).content }} {{ 'abc'|first }}{{ 'abc'|last }} {{ msgs|map(attribute='role')|join(',') }} {{ ['a', 'b']|map('upper')|list }} {{ tools|selectattr('type', 'equalto', 'function')|map(attribute='function.name')|list }} {{ tools|rejectattr('type', 'eq', 'function')|list|length }} {{ [1, 2, 3, 4]|select('even')|list }} {{ [0, 1, '', 'x']|select|list }} {{ msgs|selectattr('x')|list|length }})~",
     R"~({'role': 'user', 'content': 'hi'} bye ac user,assistant,user ['A', 'B'] ['f'] 1 [2, 4] [1, 'x'] 1)~"},
    {"filter_misc",
     R"~({{ '42'|int + 1 }} {{ '3.7'|int }} {{ 'x'|int }} {{ '2.5'|float }} {{ 'abc'|reverse }} {{ [1, 2]|reverse|list }} {{ -3|abs }} {{ 'a-b'|replace('-', '+') }} {{ d|list }})~",
     R"~(43 3 0 2.5 cba [2, 1] 3 a+b ['b', 'a', 's'])~"},
    {"tests",
     R"~({{ x is defined }} {{ d is defined }} {{ n is none }} {{ n is not none }} {{ s is string }} {{ 1 is string }} {{ d is mapping }} {{ msgs is mapping }} {{ msgs is sequence }} {{ s is sequence }} {{ 1 is sequence }} {{ 3 is odd }} {{ 4 is even }} {{ 1 is number }} {{ true is boolean }} {{ false is false }} {{ 1 is true }} {{ 'a' is in 'abc' }} {{ 6 is divisibleby 3 }} {{ 1.0 is float }} {{ 1 is integer }})~",
     R"~(False True True False True False True False True True False True True True True True False True True True True)~"},
    {"undefined_semantics",
     R"~([{{ missing }}]{{ missing|length }}{% if not missing %}falsy{% endif %}{% for x in missing %}never{% endfor %}{{ d.nope is defined }}{{ missing is undefined }})~",
     R"~([]0falsyFalseTrue)~"},
    {"strftime_now",
     R"~({{ strftime_now('%d %b %Y') }} {{ strftime_now('%Y-%m-%d %H:%M:%S') }})~",
     R"~(29 Nov 2026 2026-11-29 14:05:09)~"},
    {"python_repr_in_output",
     R"~({{ d }} {{ msgs[1] }} {{ ['it\'s', 'a"b', 'tab\there'] }} {{ big }} {{ small }} {{ f }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 123456789.0 }})~",
     R"~({'b': 1, 'a': [1, 2.5, None, True], 's': 'x'} {'role': 'assistant', 'content': 'yo', 'x': 1} ["it's", 'a"b', 'tab\there'] 1e+20 1e-07 2.0 0.30000000000000004 1e+16 123456789.0)~"},
    {"cond_expr",
     R"~({{ 'yes' if 1 else 'no' }} {{ 'yes' if 0 else 'no' }} [{{ 'only' if false }}] {{ 1 if false else 2 if true else 3 }})~",
     R"~(yes no [] 2)~"},
    {"unicode",
     R"~({{ '日本語😀'|length }} {{ '日本語😀'[::-1] }} {{ '日本語😀'[1:3] }} {{ 'ÀÉÎ'|lower }} {{ 'straße'|upper }} {{ 'ünïcödé wörds'.title() }} {{ ' x　'|trim }}|)~",
     R"~(4 😀語本日 本語 àéî STRASSE Ünïcödé Wörds x|)~"},
    {"integers_at_64_bits",
     R"~({{ (-2) ** 63 }} {{ (-1) ** 100000000000001 }} {{ (-9223372036854775807 - 1) % -1 }} {{ "nan"|float|int }} {{ "inf"|int }} {{ "4.7"|int }} {{ range(0, 9223372036854775807, 4611686018427387904)|list }} {{ range(9223372036854775806, 9223372036854775807, 1000)|list }} {{ range(5, -5, -4)|list }} {{ 0 ** 0 }} {{ 7 // -2 }} {{ -7 % 3 }})~",
     R"~(-9223372036854775808 -1 0 0 0 4 [0, 4611686018427387904] [9223372036854775806] [5, 1, -3] 1 -4 2)~"},
    {"namespace_holding_itself",
     R"~({% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns }})~",
     R"~(<Namespace {'a': 1, 'me': <Namespace {...}>}>)~"},
};

TEST(Jinja, ConstructsMatchPythonJinja2) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    std::string got;
    try {
      got = render(c.source);
    } catch (const Error& e) {
      ADD_FAILURE() << c.name << ": " << e.what();
      continue;
    }
    EXPECT_EQ(got, c.expected) << c.name;
  }
}

TEST(Jinja, RaiseExceptionGivesTheTemplatesMessage) {
  std::string err = error_of(
      "{% macro check(m) %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role: ' + m.role) }}"
      "{% endif %}ok{% endmacro %}{{ check(msgs[0]) }}\n{{ check({'role': 'tool'}) }}");
  EXPECT_NE(err.find("bad role: tool"), std::string::npos) << err;
  EXPECT_NE(err.find("test.jinja line 1"), std::string::npos) << err;
}

TEST(Jinja, UnsupportedConstructsNameTheConstructAndLine) {
  std::string err = error_of("line one\n{% if true %}\n{{ s|wordcount }}\n{% endif %}");
  EXPECT_NE(err.find("test.jinja line 3"), std::string::npos) << err;
  EXPECT_NE(err.find("filter 'wordcount'"), std::string::npos) << err;
  err = error_of("a\n\n{% include 'other.jinja' %}");
  EXPECT_NE(err.find("line 3"), std::string::npos) << err;
  EXPECT_NE(err.find("include"), std::string::npos) << err;
  err = error_of("{{ s is wordy }}");
  EXPECT_NE(err.find("test 'wordy'"), std::string::npos) << err;
  err = error_of("{% for x in d %}\n{% if x %}\n{% endfor %}");
  EXPECT_NE(err.find("line 2"), std::string::npos) << err;
  EXPECT_NE(err.find("never closed"), std::string::npos) << err;
}

TEST(Jinja, RuntimeErrorsNameTheConstructAndLine) {
  std::string err = error_of("ok\n{{ s.zfill(3) }}");
  EXPECT_NE(err.find("line 2"), std::string::npos) << err;
  EXPECT_NE(err.find("zfill"), std::string::npos) << err;
  err = error_of("\n\n{{ 'a' + missing }}");  // Python: UndefinedError 'missing' is undefined
  EXPECT_NE(err.find("line 3"), std::string::npos) << err;
  EXPECT_NE(err.find("'missing' is undefined"), std::string::npos) << err;
  err = error_of("{{ 'a' in n }}");  // Python: TypeError argument of type 'NoneType' is not iterable
  EXPECT_NE(err.find("argument of type 'NoneType' is not iterable"), std::string::npos) << err;
  err = error_of("{{ 'a' + msgs }}");  // Python: TypeError can only concatenate str (not "list") to str
  EXPECT_NE(err.find("can only concatenate str (not \"list\") to str"), std::string::npos) << err;
  err = error_of("{{ msgs[0].nope.deeper }}");  // Python: 'dict object' has no attribute 'nope'
  EXPECT_NE(err.find("'dict object' has no attribute 'nope'"), std::string::npos) << err;
}

// A chat template comes with the checkpoint, so it is input like any other: what would
// exhaust the stack, memory or time is an error naming the template and line. Each of
// these crashed (stack overflow) or ran without end before the bounds.
TEST(Jinja, HostileTemplatesAreErrorsNotCrashes) {
  auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  const int n = 100000;
  const std::pair<std::string, const char*> cases[] = {
      {"{{ " + repeat("(", n) + "1" + repeat(")", n) + " }}", "nested more than 256 deep"},
      {repeat("{% if true %}", n) + "x" + repeat("{% endif %}", n), "nested more than 256 deep"},
      {"{{ " + repeat("not ", n) + "true }}", "nested more than 256 deep"},
      {"{{ " + repeat("-", n) + "1 }}", "nested more than 256 deep"},
      {"{{ 1" + repeat(" + 1", n) + " }}", "an expression of more than 2000 parts"},
      {"{% macro f(n) %}{{ f(n) }}{% endmacro %}\n{{ f(1) }}", "more than 1000 levels deep"},
      {"{% for i in range(100000) %}{% for j in range(100000) if false %}{% endfor %}{% endfor %}",
       "more than 10000000 loop iterations"},
      {"{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
       "the text grew past 64 MiB"},
      {"{{ 'x' * 100000000000 }}", "str repeated 100000000000 times"},
      {"{{ [1] * 100000000000 }}", "list repeated 100000000000 times"},
      {"{% set ns = namespace(l=[1]) %}{% for i in range(30) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
       "a list of 2097152 items"},
      {"{% set big = 'x' * 60000000 %}{% for i in range(3) %}{{ big }}{% endfor %}", "the text grew past 64 MiB"},
      {"{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}",
       "nested more than 128 deep"},
      {"{% set ns = namespace(n=none) %}{% for i in range(1000) %}{% set m = namespace(inner=ns.n) %}"
       "{% set ns.n = m %}{% endfor %}",
       "nested more than 128 deep"},
  };
  for (const auto& [source, message] : cases) {
    SCOPED_TRACE(source.substr(0, 80));
    const std::string err = error_of(source);
    EXPECT_NE(err.find("test.jinja line"), std::string::npos) << err;
    EXPECT_NE(err.find(message), std::string::npos) << err;
  }
  // Integers past 64 bits, which Python holds as big integers: errors, never a wrapped value,
  // a trap (INT64_MIN // -1 was SIGFPE) or a loop without end (2 ** 10**14, a range whose
  // bounds wrapped).
  const std::pair<std::string, const char*> integers[] = {
      {"{{ (-9223372036854775807 - 1) // -1 }}", "integer overflow"},
      {"{{ 9223372036854775807 + 1 }}", "integer overflow: 9223372036854775807 + 1 is past 64 bits"},
      {"{{ (-9223372036854775807 - 1) * -1 }}", "integer overflow"},
      {"{{ -(-9223372036854775807 - 1) }}", "integer overflow"},
      {"{{ 2 ** 100000000000000 }}", "integer overflow: 2 ** 100000000000000"},
      {"{{ (-9223372036854775807 - 1) | abs }}", "integer overflow"},
      {"{{ '99999999999999999999' | int }}", "integer overflow"},
      {"{{ range(-9223372036854775807 - 1, 9223372036854775807) | length }}", "range() is too long"},
  };
  for (const auto& [source, message] : integers) {
    SCOPED_TRACE(source);
    const std::string err = error_of(source);
    EXPECT_NE(err.find("test.jinja line"), std::string::npos) << err;
    EXPECT_NE(err.find(message), std::string::npos) << err;
  }
  // Input nested past the bound is refused before it is walked.
  const std::string deep = repeat("[", n) + repeat("]", n);
  EXPECT_THROW(Value::from_json(nlohmann::ordered_json::parse(deep)), Error);
}

// The bounds leave room: nesting and recursion that Python Jinja2 3.1 itself still renders
// (it fails at 80 parentheses, 100 nested blocks, 500 terms and 300 macro calls deep), far
// past any real chat template's.
TEST(Jinja, BoundsLeaveRoomForRealTemplates) {
  auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  EXPECT_EQ(render("{{ " + repeat("(", 60) + "1" + repeat(")", 60) + " }}"), "1");
  EXPECT_EQ(render(repeat("{% if true %}", 90) + "x" + repeat("{% endif %}", 90)), "x");
  EXPECT_EQ(render("{{ 0" + repeat(" + 1", 300) + " }}"), "300");
  EXPECT_EQ(render("{% macro f(k) %}{% if k > 0 %}{{ f(k - 1) }}{% else %}done{% endif %}{% endmacro %}{{ f(150) }}"),
            "done");
  EXPECT_EQ(render("{% set ns = namespace(l=[]) %}{% for i in range(100) %}{% set ns.l = [ns.l] %}{% endfor %}"
                   "{{ ns.l|tojson|length }}"),
            "202");
  EXPECT_EQ(render("{{ ('x' * 1000000)|length }}"), "1000000");
  const std::string nested = repeat("[", 120) + repeat("]", 120);
  EXPECT_EQ(py_json_dumps(Value::from_json(nlohmann::ordered_json::parse(nested)), {}), nested);
}

TEST(Jinja, TrailingNewlineAndCrLfAreNormalised) {
  EXPECT_EQ(render("a\r\nb\n"), "a\nb");       // jinja2 drops one trailing newline
  EXPECT_EQ(render("a\n\n"), "a\n");
  EXPECT_EQ(render("{% if true %}\r\nx{% endif %}"), "x");  // trim_blocks after \r\n
}

}  // namespace
}  // namespace mere::jinja
