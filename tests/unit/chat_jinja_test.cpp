// chat/jinja.h feature by feature: every expected output is what Python jinja2 renders in transformers'
// environment (tests/chat/jinja_reference.py; see jinja.h), and the error cases check that a bad or hostile
// template gives a located error instead of a crash or a hang.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "chat/jinja.h"

namespace magnetar::chat {
namespace {

using J = nlohmann::ordered_json;

// The rendered text, or "ERROR: <message>".
std::string render(std::string_view source, const J& context = J::object()) {
  Result<JinjaTemplate> t = JinjaTemplate::parse(source);
  if (!t.ok()) return "ERROR: " + t.status().message();
  Result<std::string> out = t->render(context);
  if (!out.ok()) return "ERROR: " + out.status().message();
  return *out;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
std::string repeat(const std::string& piece, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += piece;
  return out;
}

TEST(ChatJinja, TextAndWhitespaceControl) {
  EXPECT_EQ(render("hello\n"), "hello");  // one trailing newline dropped
  EXPECT_EQ(render("hello\n\n"), "hello\n");
  EXPECT_EQ(render("{% if true %}\nyes\n{% endif %}\n"), "yes\n");  // trim_blocks
  EXPECT_EQ(render("a\n    {% if true %}b{% endif %}"), "a\nb");    // lstrip_blocks
  EXPECT_EQ(render("a  {{- 'x' -}}  b"), "axb");
  EXPECT_EQ(render("a \n {%- if true -%} \n b {%- endif %}"), "ab");
  EXPECT_EQ(render("a {#- comment -#} b"), "ab");
  EXPECT_EQ(render("a {# comment #} b"), "a  b");
  EXPECT_EQ(render("{{ 'x' }}\n{{ 'y' }}"), "x\ny");  // no trimming after }}
  EXPECT_EQ(render("{% raw %}{{ not }} {% evaluated %}{% endraw %}"), "{{ not }} {% evaluated %}");
  EXPECT_EQ(render("A {%- generation -%} B {% endgeneration %} C"), "AB  C");
}

TEST(ChatJinja, PrintsValuesAsTheReference) {
  EXPECT_EQ(render("{{ 1 }}|{{ 1.0 }}|{{ 2.5 }}|{{ -3 }}|{{ 0.1 }}"), "1|1.0|2.5|-3|0.1");
  EXPECT_EQ(render("{{ true }}|{{ false }}|{{ none }}|{{ nothing }}|"), "True|False|None||");
  EXPECT_EQ(render("{{ [1, 'a', none, 2.0] }}"), "[1, 'a', None, 2.0]");
  EXPECT_EQ(render("{{ {'b': 1, 'a': [true]} }}"), "{'b': 1, 'a': [True]}");
  EXPECT_EQ(render("{{ x }}", J{{"x", 3.0}}), "3.0");  // json.loads keeps 3.0 a float
  EXPECT_EQ(render("{{ 'a' 'b' \"c\" }}"), "abc");
  EXPECT_EQ(render("{{ 'tab\\tnew\\nq\\'\\u00e9\\x41' }}"), "tab\tnew\nq'éA");
}

TEST(ChatJinja, ToJson) {
  const J ctx = {{"d", {{"z", 1}, {"a", {1, 2.5, "é\"\n"}}, {"n", nullptr}}}};
  EXPECT_EQ(render("{{ d | tojson }}", ctx), "{\"z\": 1, \"a\": [1, 2.5, \"é\\\"\\n\"], \"n\": null}");
  EXPECT_EQ(render("{{ d | tojson(indent=2) }}", ctx),
            "{\n  \"z\": 1,\n  \"a\": [\n    1,\n    2.5,\n    \"é\\\"\\n\"\n  ],\n  \"n\": null\n}");
  EXPECT_EQ(render("{{ 'é😀' | tojson(ensure_ascii=true) }}"), "\"\\u00e9\\ud83d\\ude00\"");
  EXPECT_EQ(render("{{ d | tojson(separators=(',', ':')) }}", ctx), "{\"z\":1,\"a\":[1,2.5,\"é\\\"\\n\"],\"n\":null}");
  EXPECT_EQ(render("{{ {'b': 1, 'A': 2, 'a': 3} | tojson(sort_keys=true) }}"), "{\"A\": 2, \"a\": 3, \"b\": 1}");
  EXPECT_EQ(render("{{ [] | tojson(indent=4) }}|{{ {} | tojson }}"), "[]|{}");
}

TEST(ChatJinja, Arithmetic) {
  EXPECT_EQ(render("{{ 7 // 2 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 * 1.5 }}"),
            "3 3.5 2.0 1 2 1024 3.0");
  EXPECT_EQ(render("{{ 1 + 2 * 3 - 4 }} {{ (1 + 2) * 3 }} {{ 10 - -2 }} {{ -(3) }}"), "3 9 12 -3");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ 1.0 ~ true }}"), "a11.0True");
  EXPECT_EQ(render("{{ 'n=' ~ 2 }} {{ [1] + [2, 3] }}"), "n=2 [1, 2, 3]");
  EXPECT_TRUE(has(render("{{ 'n=' + 2 }}"), "can only concatenate str (not \"int\") to str"));
  EXPECT_EQ(render("{{ x - 1 }}", J{{"x", 5}}), "4");
}

TEST(ChatJinja, ComparisonsAndMembership) {
  EXPECT_EQ(render("{{ 1 == 1.0 }} {{ '1' == 1 }} {{ none == nothing }} {{ 'a' != 'b' }} {{ 2 > 1 }} {{ 2 <= 1 }}"),
            "True False False True True False");
  EXPECT_EQ(
      render("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'x' not in [] }} {{ 'x' in nothing }}"),
      "True True True True False");
  EXPECT_EQ(render("{{ 1 and 'x' }} {{ 0 or 'y' }} {{ [] or 'z' }} {{ not [] }} {{ not 'a' == 'b' }}"),
            "x y z True True");
  EXPECT_EQ(render("{{ 'yes' if 1 < 2 else 'no' }}{{ 'hidden' if false }}"), "yes");
}

TEST(ChatJinja, StringMethodsAndIndexing) {
  EXPECT_EQ(render("[{{ '  hi \\n'.strip() }}][{{ '  hi '.lstrip() }}][{{ '  hi '.rstrip() }}]"), "[hi][hi ][  hi]");
  EXPECT_EQ(render("{{ '\\n\\nx  '.lstrip('\\n') }}|"), "x  |");  // the reference ignores strip's argument
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }} {{ ' a  b c '.split() }} {{ 'a-b-c'.split('-', 1) }}"),
            "['a', 'b', '', 'c'] ['a', 'b', 'c'] ['a', 'b-c']");
  EXPECT_EQ(render("{{ 'hello wORLD'.title() }} {{ 'aBC'.capitalize() }} {{ 'MiXé'.lower() }} {{ 'straße'.upper() }}"),
            "Hello World Abc mixé STRASSE");
  EXPECT_EQ(render("{{ 'aaa'.replace('a', 'b') }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'ab' | replace('', '-') }}"),
            "bbb bba -a-b-");
  EXPECT_EQ(render("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'abc'.startswith('b') }}"),
            "True True False");
  EXPECT_EQ(render("{{ 'héllo' | length }} {{ '😀' | length }} {{ 'abc'.length }}"),
            "5 1 ");  // code points; strings have no .length
  EXPECT_EQ(render("{{ 'abcdef'[1:4] }} {{ 'abcdef'[::-1] }} {{ 'abcdef'[-2:] }} {{ 'abc'[-1] }} {{ 'abc'[0] }}"),
            "bcd fedcba ef c a");
  EXPECT_EQ(render("{{ 'a😀b'[::-1] }}"), "b😀a");  // slices count code points
  // Invalid UTF-8 reads as one U+FFFD per byte (not per maximal subpart: chat/jinja_text.cpp), and case
  // mapping keeps those bytes as they are.
  EXPECT_EQ(render("{{ 'a\xE2\x82' | length }} {{ '\xF1\x80\x80' | length }}"), "3 3");
  EXPECT_EQ(render("{{ '\xF1\x80\x80x\xE2\x82'.upper() }}"), "\xF1\x80\x80X\xE2\x82");
}

// Runs of ASCII are walked eight bytes at a time: a multi-byte character or an invalid byte at every offset of the
// word and past its end still counts as one code point, indexes as one and prints whole.
TEST(ChatJinja, LongStringsCountCodePointsAtEveryOffset) {
  for (const std::string odd : {std::string("\xC3\xA9"), std::string("\xF0\x9F\x98\x80"), std::string("\xFF")}) {
    for (int k = 0; k < 20; ++k) {
      const J ctx = {{"s", std::string(size_t(k), 'a') + odd + std::string(17, 'b') + odd + "c"}, {"k", k}};
      EXPECT_EQ(render("{{ s | length }} {{ s[k] == s[k + 18] }} {{ s[k + 1] }} {{ s[k + 19] }} {{ s[k - 1] }}", ctx),
                std::to_string(k + 20) + " True b c " + (k == 0 ? "c" : "a"))
          << k;
      EXPECT_EQ(render("{{ [s[k]] }}", ctx), "['" + odd + "']") << k;  // an invalid byte prints as itself
    }
  }
}

TEST(ChatJinja, ListsAndSlices) {
  EXPECT_EQ(render("{{ [1, 2, 3, 4][::-2] }} {{ [1, 2, 3][1:] }} {{ [1, 2, 3][-1] }} {{ [1, 2, 3][5] }}|"),
            "[4, 2] [2, 3] 3 |");
  EXPECT_EQ(render("{{ xs[::-1] }} {{ xs.length }} {{ xs | length }}", J{{"xs", {1, 2, 3}}}), "[3, 2, 1]  3");
  EXPECT_EQ(render("{{ (1, 2)[0] }} {% set a, b = 1, 2 %}{{ b }}{{ a }}"), "1 21");
}

TEST(ChatJinja, ForLoops) {
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}"
                   "{{ loop.last }}{{ loop.length }}|{% endfor %}"),
            "103TrueFalse3|212FalseFalse3|321FalseTrue3|");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.index }} {% endfor %}"), "21 42 ");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  EXPECT_EQ(render("{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}"), "ab");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }},{% endfor %}"), "-2,1-3,2-,");
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}"
                   "{% endif %}{{ x }}{% endfor %}"),
            "13");
  // The reference drops what an iteration printed before {% break %}.
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ x }}{% if x == 2 %}{% break %}{% endif %}{% endfor %}"), "12");
  EXPECT_EQ(render("{% set x = 'outer' %}{% for i in [1] %}{% set x = 'inner' %}{% endfor %}{{ x }}"), "outer");
  EXPECT_EQ(render("{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}{% endfor %}"),
            "1x1 1y2 2x1 2y2 ");
}

TEST(ChatJinja, SetNamespaceAndBlocks) {
  EXPECT_EQ(render("{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}"
                   "{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}"),
            "6 0123");
  EXPECT_EQ(render("{% set x %}a{{ 1 + 1 }}b{% endset %}[{{ x }}]"), "[a2b]");
  EXPECT_EQ(render("{% filter upper %}abc{{ 'd' }}{% endfilter %}"), "ABCD");
  EXPECT_EQ(render("{{ range(3) }} {{ range(1, 7, 2) }} {{ range(3, 0, -1) }}"), "[0, 1, 2] [1, 3, 5] [3, 2, 1]");
  EXPECT_EQ(render("{{ dict(a=1, b='x') | tojson }}"), "{\"a\": 1, \"b\": \"x\"}");
}

TEST(ChatJinja, Macros) {
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                   "{{ greet('Ann') }} {{ greet('Bob', '?') }} {{ greet(punct='.', name='Cy') }}"),
            "Hi Ann! Hi Bob? Hi Cy.");
  EXPECT_EQ(render("{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}"
                   "{% call wrap('b') %}bold{% endcall %}"),
            "<b>bold</b>");
  EXPECT_EQ(render("{% macro f(a, b=a * 2) %}{{ a }},{{ b }}{% endmacro %}{{ f(3) }}"), "3,6");
  EXPECT_EQ(render("{% macro f() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ f(1, 2, k=3) }}"), "(1, 2){'k': 3}");
  EXPECT_TRUE(has(render("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}"), "takes not more than 1 argument"));
}

TEST(ChatJinja, Filters) {
  const J ctx = {{"users",
                  {{{"name", "b"}, {"age", 30}, {"admin", true}},
                   {{"name", "A"}, {"age", 20}},
                   {{"name", "c"}, {"age", 25}, {"admin", false}}}}};
  EXPECT_EQ(render("{{ users | map(attribute='name') | join(', ') }}", ctx), "b, A, c");
  EXPECT_EQ(render("{{ users | selectattr('admin') | map(attribute='name') | list }}", ctx), "['b']");
  EXPECT_EQ(render("{{ users | rejectattr('admin') | map(attribute='name') | join }}", ctx), "Ac");
  EXPECT_EQ(render("{{ users | selectattr('name', 'equalto', 'c') | map(attribute='age') | first }}", ctx), "25");
  EXPECT_EQ(render("{{ users | sort(attribute='age') | map(attribute='name') | join }}", ctx), "Acb");
  EXPECT_EQ(render("{{ ['b', 'A', 'c'] | sort }} {{ [3, 1, 2] | sort(reverse=true) }}"), "['A', 'b', 'c'] [3, 2, 1]");
  EXPECT_EQ(render("{{ [1, 2, 1, '1'] | unique | list }} {{ [1, 2, 3] | reverse | list }} {{ [1, 2] | last }}"),
            "[1, 2, '1'] [3, 2, 1] 2");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2} | dictsort }} {{ {'b': 1, 'a': 2} | items | list }}"),
            "[('a', 2), ('b', 1)] [('b', 1), ('a', 2)]");
  EXPECT_EQ(render("{{ nothing | default('d') }} {{ '' | default('e', true) }} {{ 0 | default(5) }}"), "d e 0");
  EXPECT_EQ(render("{{ '42abc' | int }} {{ 'x' | int }} {{ -1.5 | int }} {{ '2.5' | float }} {{ 3 | float }}"),
            "0 0 -1 2.5 3.0");
  EXPECT_EQ(render("[{{ '  x  ' | trim }}] {{ 'a\\nb\\n\\nc' | indent(2) }}"), "[x] a\n  b\n\n  c");
  EXPECT_EQ(render("{{ 'ab' | join('-') }} {{ [1, none, 'x'] | join(',') }} {{ -3 | abs }} {{ 'hi' | upper }}"),
            "a-b 1,None,x 3 HI");
  EXPECT_EQ(render("{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3] | reject('odd') | list }}"), "[1, 3] [2]");
  EXPECT_EQ(render("{{ 2.567 | round(2) }} {{ 'abc' | list }} {{ [1, 2] | count }}"), "2.57 ['a', 'b', 'c'] 2");
}

TEST(ChatJinja, Tests) {
  EXPECT_EQ(render("{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ none is none }} {{ 'a' is string }}",
                   J{{"x", 1}}),
            "True False True True True");
  EXPECT_EQ(
      render("{{ 1 is number }} {{ 1 is integer }} {{ 1.5 is float }} {{ {} is mapping }} {{ {} is iterable }}"
             " {{ [] is iterable }} {{ 'a' is iterable }} {{ 3 is odd }} {{ true is boolean }} {{ false is false }}"),
      "True True True True True True True True True True");
  EXPECT_EQ(render("{{ x is not none }} {{ range is callable }}", J{{"x", nullptr}}), "False True");
}

TEST(ChatJinja, ContextKeyOrderIsKept) {
  J tool = J::object();
  tool["type"] = "function";
  tool["function"] = {{"name", "f"}, {"description", "d"}};
  EXPECT_EQ(render("{{ t | tojson }}", J{{"t", tool}}),
            "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\"}}");
}

TEST(ChatJinja, RaiseException) {
  const std::string out = render("ok\n{{ raise_exception('Roles must alternate') }}");
  EXPECT_EQ(out, "ERROR: chat template 2:4: raise_exception: Roles must alternate");
}

TEST(ChatJinja, ParseErrorsNameTheirPlace) {
  EXPECT_EQ(render("{% if true %}x"),
            "ERROR: chat template 1:15: unexpected end of template: {% if %} at 1:1 is not closed by {% endif %}");
  EXPECT_EQ(render("a\n{% frobnicate %}"), "ERROR: chat template 2:4: unknown statement 'frobnicate'");
  EXPECT_EQ(render("{{ 'abc }}"), "ERROR: chat template 1:4: unterminated string literal");
  EXPECT_EQ(render("{{ 1 ! 2 }}"), "ERROR: chat template 1:6: unexpected character '!'");
  EXPECT_EQ(render("{{ x + }}"), "ERROR: chat template 1:8: expected an expression, got '}}'");
  EXPECT_EQ(render("{% for x in xs %}{% endif %}"), "ERROR: chat template 1:18: unexpected {% endif %}");
  EXPECT_TRUE(has(render("{# open comment"), "comment {# without #}"));
}

TEST(ChatJinja, RuntimeErrorsNameTheirPlace) {
  EXPECT_EQ(render("line\n  {{ x | frobnicate }}", J{{"x", 1}}),
            "ERROR: chat template 2:10: no filter named 'frobnicate'");
  EXPECT_EQ(render("{{ 'a' + none }}"), "ERROR: chat template 1:8: can only concatenate str (not \"NoneType\") to str");
  EXPECT_EQ(render("{{ x is frob }}"), "ERROR: chat template 1:6: unknown test 'frob'");
  EXPECT_TRUE(has(render("{{ nothing() }}"), "cannot call a undefined"));
  EXPECT_TRUE(has(render("{% set x = 1 %}{% set x.a = 2 %}"), "only on a namespace"));
  EXPECT_TRUE(has(render("{% break %}"), "outside a loop"));
}

TEST(ChatJinja, HostileTemplatesStopCleanly) {
  // Unbounded recursion.
  EXPECT_TRUE(has(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), "runaway recursion"));
  // Quadratic loops past the step budget.
  EXPECT_TRUE(
      has(render("{% set xs = range(5000) %}{% for i in xs %}{% for j in xs %}{% endfor %}{% endfor %}"), "steps"));
  // Exponential growth of a string.
  EXPECT_TRUE(has(render("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                         "{% endfor %}{{ ns.s | length }}"),
                  "MiB"));
  // Long chains and elif ladders nest the tree as deep (before: parsed by loops, then a crash freeing the tree).
  EXPECT_TRUE(has(render("{{ 1" + repeat("+1", 300000) + " }}"), "nested deeper"));
  EXPECT_TRUE(has(render("{% if false %}" + repeat("{% elif false %}", 300000) + "{% endif %}"), "nested deeper"));
  EXPECT_TRUE(has(render("{{ x" + repeat(".a", 300000) + " }}"), "nested deeper"));
  // Deep nesting in the source and in values.
  EXPECT_TRUE(has(render("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"), "nested deeper"));
  EXPECT_TRUE(has(render("{% set ns = namespace(x=[]) %}{% for i in range(5000) %}{% set ns.x = [ns.x] %}{% endfor %}"),
                  "nested deeper"));
  // A namespace that contains itself.
  EXPECT_TRUE(has(render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns | tojson }}"), "nested deeper"));
  EXPECT_TRUE(has(render("{{ range(1000000000000) | length }}"), "MiB"));
  // A list that repeats itself: 40 steps build 2^40 leaves to print (before: printed until memory ran out).
  const std::string doubled =
      "{% set ns = namespace(a=[1]) %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}"
      "{% endfor %}";
  for (const char* print : {"{{ ns.a }}", "{{ ns.a | join(',') }}"}) {  // (tojson and ~ print as these do)
    EXPECT_TRUE(has(render(doubled + print), "a printed value exceeds 64 MiB")) << print;
  }
  // Steps that overflow int64 (before: the index wrapped negative and read far outside the array, or range's count
  // came out 0 and its loop ran without bound).
  EXPECT_EQ(render("{{ [1, 2, 3][1::9223372036854775807] }}"), "[2]");
  EXPECT_EQ(render("{{ [1, 2, 3][1::-9223372036854775807] }}"), "[2]");
  EXPECT_EQ(render("{{ range(9223372036854775806, 9223372036854775807, 2) }}"), "[9223372036854775806]");
  EXPECT_EQ(render("{{ range(-9223372036854775807, -9223372036854775807 - 1 + 3, 5) | length }}"), "1");
  EXPECT_EQ(render("{{ range(9223372036854775807, 9223372036854775800, -9223372036854775807) }}"),
            "[9223372036854775807]");
}

// Python's arithmetic where int64 traps or is undefined: INT64_MIN % -1 and INT64_MIN // -1 (SIGFPE before),
// INT64_MIN's negation, round() to -INT64_MIN digits.
TEST(ChatJinja, Int64EdgesComputeAsPython) {
  const std::string min = "{% set m = -9223372036854775807 - 1 %}";
  EXPECT_EQ(render(min + "{{ m is divisibleby(-1) }}"), "True");
  EXPECT_EQ(render(min + "{{ [{'a': m}] | selectattr('a', 'divisibleby', -1) | list | length }}"), "1");
  EXPECT_EQ(render(min + "{{ m % -1 }} {{ m // -1 }}"), "0 9223372036854775808");
  EXPECT_EQ(render(min + "{{ -m }} {{ m | abs }} {{ -(-m) }}"),
            "9223372036854775808 9223372036854775808 -9.223372036854776e+18");
  EXPECT_EQ(render(min + "{{ 7 // -1 }} {{ -7 % 3 }} {{ 7 is divisibleby(-1) }}"), "-7 2 True");
  EXPECT_EQ(render(min + "{{ 1.5 | round(m) }} {{ -1.5 | round(m) }} {{ 1234.5 | round(-2) }}"), "0.0 -0.0 1200.0");
}

// Python's `%` formatting of integers: every digit of a large float, errors for NaN and infinity (casts out of
// range before), a sign and the magnitude for negative hex and octal.
TEST(ChatJinja, PercentFormatIntegers) {
  EXPECT_EQ(render("{{ '%d' % 1e20 }}"), "100000000000000000000");
  EXPECT_EQ(render("{{ '%d' % -1e300 }}").size(), 302u);
  EXPECT_TRUE(has(render("{{ '%d' % (1e308 * 10) }}"), "cannot convert float infinity to integer"));
  EXPECT_TRUE(has(render("{{ '%d' % (1e308 * 10 - 1e308 * 10) }}"), "cannot convert float NaN to integer"));
  EXPECT_EQ(render("{{ '%x' % -255 }} {{ '%X' % 255 }} {{ '%#x' % 255 }} {{ '%#o' % 8 }} {{ '%o' % -8 }}"),
            "-ff FF 0xff 0o10 -10");
  EXPECT_EQ(render("{{ '%05d|%-5d|%+d|% d|%.3d|%5.3d' % (-42, 42, 42, 42, 7, -7) }}"), "-0042|42   |+42| 42|007| -007");
  EXPECT_EQ(render("{{ '%d %i' % (-9223372036854775807 - 1, 2.9) }}"), "-9223372036854775808 2");
  EXPECT_EQ(render("{{ '%d' % u }}", J{{"u", 18446744073709551615u}}), "18446744073709551615");
  // strchr matches the terminator: a NUL after '%' was a flag or the conversion %d.
  EXPECT_TRUE(has(render("{{ f % 5 }}", J{{"f", std::string("%\0", 2)}}), "unsupported format character"));
  EXPECT_TRUE(has(render("{{ f % 5 }}", J{{"f", std::string("%\0d", 3)}}), "unsupported format character"));
}

// A long agentic conversation through a template shaped like the real ones (reverse scan, tools as JSON,
// tool calls) renders well inside the step and byte budgets that stop hostile templates.
// Results whose size is known before they are built are charged first: each of these would build gigabytes
// (or run for hours) and must stop with the budget's error instead.
TEST(ChatJinja, LargeResultsAreChargedBeforeTheyAreBuilt) {
  const J mb = {{"s", std::string(1 << 20, 'a')}};
  const std::string budget = "MiB of text and lists (runaway growth?)";
  EXPECT_TRUE(has(render("{{ range(100000) | join(s) }}", mb), budget));
  EXPECT_TRUE(has(render("{{ s.replace('a', s) }}", mb), budget));
  EXPECT_TRUE(has(render("{{ s | replace('a', s) }}", mb), budget));
  EXPECT_TRUE(has(render("{{ (s ~ '\n') * 600 }}", mb), budget));
  EXPECT_TRUE(has(render("{% set t = ('\n' * 1000000) %}{{ t | indent(1000) }}"), budget));
  const J big = {{"s", std::string(size_t(64) << 20, 'a')}};
  EXPECT_TRUE(has(render("{% for c in s %}{% endfor %}", big), budget));
  EXPECT_TRUE(has(render("{{ s | list | length }}", big), budget));
  EXPECT_TRUE(has(render("{{ s | reverse | length }}", big), budget));
  // size * times wrapped to a small charge (before: appended until memory ran out).
  EXPECT_TRUE(has(render("{{ (('a' * 16777216) * 1099511627776) | length }}"), budget));
  EXPECT_TRUE(has(render("{{ (([1] * 16777216) * 1099511627776) | length }}"), budget));
  EXPECT_TRUE(has(render("{{ ('a' * 9223372036854775807) | length }}"), budget));
  EXPECT_EQ(render("{{ ('' * 9223372036854775807) | length }} {{ ([] * 9223372036854775807) | length }}"), "0 0");
  // A macro or a call block in a loop keeps each iteration's scope (loop object included) for its closure: what
  // is kept is charged (before: 2.8 GB uncharged).
  EXPECT_TRUE(has(render("{% for i in range(1990000) %}{% macro m() %}{% endmacro %}{% endfor %}"), budget));
  EXPECT_TRUE(has(render("{% macro f() %}{{ caller() }}{% endmacro %}{% for i in range(1990000) %}"
                         "{% call f() %}{% endcall %}{% endfor %}"),
                  budget));
  EXPECT_EQ(render("{% for i in range(3) %}{% macro m() %}{{ i }}{% endmacro %}{{ m() }}{% endfor %}"), "012");
  // A format with many long conversions is charged as it grows (before: built whole, then charged).
  EXPECT_TRUE(has(render("{% set s = 'a' * 67108864 %}{{ ('%s' * 24) % ((s,) * 24) }}"), budget));
  EXPECT_TRUE(has(render("{% set s = 'a' * 67108864 %}{{ ('%r' * 24) % ((s,) * 24) }}"), budget));
}

// One step that walks a whole string (indexing by code point, length, compares) is charged by its length.
TEST(ChatJinja, StepsOverLongStringsAreCharged) {
  const J big = {{"s", std::string(size_t(64) << 20, 'a')}};
  const std::string steps = "steps (runaway loop or recursion?)";
  EXPECT_TRUE(has(render("{% for i in range(400000) %}{% if s[i] == 'b' %}x{% endif %}{% endfor %}", big), steps));
  EXPECT_TRUE(has(render("{% for i in range(400000) %}{{ s[-1] }}{% endfor %}", big), steps));
  EXPECT_TRUE(has(render("{% for i in range(400000) %}{{ s | length }}{% endfor %}", big), steps));
  EXPECT_TRUE(has(render("{% for i in range(400000) %}{{ s < s }}{% endfor %}", big), steps));
  EXPECT_TRUE(has(render("{% for i in range(400000) %}{{ 'b' in s }}{% endfor %}", big), steps));
  // strip with chars looked each code point up in chars (O(len(s) * len(chars))) and walked s uncharged.
  EXPECT_TRUE(has(render("{% for i in range(100) %}{{ s.rstrip('a') }}{% endfor %}", big), steps));
  EXPECT_TRUE(has(render("{% for i in range(100) %}{{ s | trim('a') }}{% endfor %}", big), steps));
  EXPECT_EQ(render("{{ ('a' * 262144).rstrip('b' * 65536) | length }}"), "262144");
  EXPECT_EQ(render("{{ 'x€éa€bé'.rstrip('é€b') }}|{{ 'é€bxa'.lstrip('bé€') }}|{{ 'ab😀ba😀'.strip('a😀b') }}|"
                   "{{ '  x \t'.rstrip() }}|{{ 'aaa'.rstrip('a') }}|"),
            "x€éa|xa||  x||");
  EXPECT_TRUE(has(render("{{ ([s] * 4000) | sort | length }}", big), steps));
  // Strings nested in lists and dicts, compared by ==, in, sort, unique and the tests (before: charged nothing, one
  // `==` compared 128 GB).
  const std::string l = "{% set l = [s] * 2000 %}";
  EXPECT_TRUE(has(render(l + "{{ l == l }}", big), steps));
  EXPECT_TRUE(has(render(l + "{{ l != l }}", big), steps));
  EXPECT_TRUE(has(render(l + "{{ [l] == [l] }}", big), steps));
  EXPECT_TRUE(has(render(l + "{{ {'a': l} == {'a': l} }}", big), steps));
  EXPECT_TRUE(has(render(l + "{{ l <= l }}", big), steps));
  const J pair = {{"s", std::string(size_t(64) << 20, 'a')}, {"t", std::string((size_t(64) << 20) - 1, 'a') + "b"}};
  EXPECT_TRUE(has(render("{{ t in [s] * 2000 }}", pair), steps));
  EXPECT_TRUE(has(render("{{ ([[s]] * 4000) | sort | length }}", big), steps));
  EXPECT_TRUE(has(render("{{ ([[s]] * 4000) | unique | list | length }}", big), steps));
  EXPECT_TRUE(has(render(l + "{{ l is eq(l) }} {{ l is lt(l) }}", big), steps));
  const J many = {{"s", std::string(1 << 17, 'a')}};  // short strings, many compares: they add up
  EXPECT_TRUE(has(render("{% set l = [s] * 8000 %}{% for i in range(40) %}{{ l == l }}{% endfor %}", many), steps));
  EXPECT_EQ(render("{{ [1, 'a', [2]] == [1, 'a', [2]] }} {{ ['b'] > ['a', 'z'] }} {{ 'a' in ['b', 'a'] }}"),
            "True True True");
  EXPECT_TRUE(has(render("{{ ([s] * 4000) | unique | list | length }}", big), steps));
}

TEST(ChatJinja, RealTemplateStaysFarBelowTheLimits) {
  const std::string source =
      "{%- set ns = namespace(last_user=0) %}"
      "{%- for m in messages[::-1] %}{% if m.role == 'user' and ns.last_user == 0 %}"
      "{% set ns.last_user = messages | length - loop.index0 %}{% endif %}{% endfor %}"
      "{%- if tools %}<|system|>{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}"
      "{%- for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}"
      "{%- if m.tool_calls %}{% for c in m.tool_calls %}<call>{{ c.function | tojson }}</call>{% endfor %}{% endif %}"
      "\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";
  J ctx = {{"add_generation_prompt", true}};
  ctx["tools"] = J::array();
  for (int k = 0; k < 20; ++k) {
    ctx["tools"].push_back({{"type", "function"}, {"function", {{"name", "f" + std::to_string(k)}}}});
  }
  ctx["messages"] = J::array();
  const std::string text(1000, 'x');
  for (int k = 0; k < 2500; ++k) {
    ctx["messages"].push_back({{"role", "user"}, {"content", text}});
    J reply = {{"role", "assistant"}, {"content", text}};
    reply["tool_calls"] = J::array({{{"function", {{"name", "f1"}, {"arguments", {{"a", k}}}}}}});
    ctx["messages"].push_back(reply);
  }
  const std::string out = render(source, ctx);
  ASSERT_EQ(out.rfind("ERROR", 0), std::string::npos) << out.substr(0, 300);
  size_t users = 0, calls = 0;
  for (size_t at = out.find("<|user|>"); at != std::string::npos; at = out.find("<|user|>", at + 1)) ++users;
  for (size_t at = out.find("<call>{\"name\": \"f1\", \"arguments\": {\"a\": "); at != std::string::npos;
       at = out.find("<call>{\"name\": \"f1\"", at + 1)) {
    ++calls;
  }
  EXPECT_EQ(users, 2500u);
  EXPECT_EQ(calls, 2500u);
  EXPECT_EQ(out.substr(out.size() - 13), "<|assistant|>");
}

// A GGUF's template is untrusted input: random edits of a realistic template (cut tags, stray quotes and
// braces, swapped operators) must give a rendered text or an error, never a crash (run under ASan in CI).
TEST(ChatJinja, MutatedTemplatesNeverCrash) {
  const std::string base =
      "{%- set ns = namespace(n=0, last=-1) %}{% macro m(x, y='d') %}[{{ x ~ y }}]{% endmacro %}"
      "{%- for msg in messages[::-1] if msg.role %}{% set ns.n = ns.n + 1 %}{% endfor %}"
      "{%- if tools %}{% for t in tools %}{{ t | tojson(indent=2) }}{% endfor %}{% endif %}"
      "{%- for msg in messages %}{% if msg.role == 'user' %}<u>{{ msg.content | trim }}{% elif msg.tool_calls %}"
      "{% for c in msg.tool_calls %}{{ m(c.function.name, c.function.arguments | tojson) }}{% endfor %}"
      "{% else %}{{ msg.content.split('</think>')[-1].lstrip() }}{% endif %}{{ loop.index0 % 2 }}{% endfor %}"
      "{%- if add_generation_prompt %}{{ 'x' * 2 if false else raise_exception('end') }}{% endif %}";
  const J ctx = {{"messages",
                  {{{"role", "user"}, {"content", " hi "}},
                   {{"role", "assistant"},
                    {"content", "<think>r</think>a"},
                    {"tool_calls", {{{"function", {{"name", "f"}, {"arguments", {{"a", 1}}}}}}}}}}},
                 {"tools", {{{"type", "function"}}}},
                 {"add_generation_prompt", false}};
  const char kPieces[] = "{}%#()[]'\".|,:=+-*/~!<> \nifnotandorinisforsetendmacro0123";
  uint64_t state = 12345;
  const auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  size_t rendered = 0, failed = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s = base;
    const int edits = 1 + int(next() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = next() % (s.size() + 1);
      switch (next() % 3) {
        case 0: s.erase(at, 1 + next() % 3); break;
        case 1: s.insert(at, 1, kPieces[next() % (sizeof(kPieces) - 1)]); break;
        default:
          if (at < s.size()) s[at] = kPieces[next() % (sizeof(kPieces) - 1)];
      }
    }
    const std::string out = render(s, ctx);
    (out.rfind("ERROR: ", 0) == 0 ? failed : rendered) += 1;
  }
  EXPECT_EQ(rendered + failed, 3000u);
  EXPECT_GT(rendered, 100u);  // the edits leave many templates valid: both paths are exercised
  EXPECT_GT(failed, 100u);
}

TEST(ChatJinja, PlainJsonContextIteratesInSortedKeyOrder) {
  Result<JinjaTemplate> t = JinjaTemplate::parse("{{ x | tojson }}");
  ASSERT_TRUE(t.ok());
  Result<std::string> out = t->render(nlohmann::json{{"x", {{"b", 1}, {"a", 2}}}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(*out, "{\"a\": 2, \"b\": 1}");
}

TEST(ChatJinja, RendersConcurrently) {
  Result<JinjaTemplate> t = JinjaTemplate::parse(
      "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}{% endfor %}{{ messages | length }}");
  ASSERT_TRUE(t.ok()) << t.status().message();
  std::vector<std::string> outs(8);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < outs.size(); ++k) {
    threads.emplace_back([&, k] {
      J ctx = {{"messages", J::array()}};
      for (size_t i = 0; i <= k; ++i)
        ctx["messages"].push_back({{"role", "user"}, {"content", " m" + std::to_string(i)}});
      for (int rep = 0; rep < 50; ++rep) {
        Result<std::string> r = t->render(ctx);
        outs[k] = r.ok() ? *r : r.status().message();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(outs[0], "<user>m01");
  EXPECT_EQ(outs[2], "<user>m0<user>m1<user>m23");
}

}  // namespace
}  // namespace magnetar::chat
