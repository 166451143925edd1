// ChatTemplate, the Jinja subset that renders chat templates as Hugging Face transformers does:
// every construct against the text transformers' Jinja environment renders (the expected strings
// were produced by it), each refusal at compile time, each run-time error, and each resource bound.
// tests/test_chat_template_conformance.cpp compares whole conversations on the real templates.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/chat/chat_template.h"
#include "runtime/chat/jinja_eval.h"
#include "runtime/chat/jinja_parser.h"
#include "specrun/error.hpp"
#include "tests/test_support.h"

namespace specrun::chat {
namespace {

using json = nlohmann::ordered_json;

// The variables every case renders with; objects keep their members in this order, as Python
// dicts do.
const char* const kContext = R"json({
  "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "  Hi there \n"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"}
  ],
  "add_generation_prompt": true,
  "bos_token": "<s>",
  "eos_token": "</s>",
  "name": "World",
  "numbers": [3, 1, 2],
  "text": "  padded  ",
  "flag": true,
  "nothing": null,
  "count": 42,
  "ratio": 0.5,
  "user": {"age": 36, "name": "Ada", "tags": ["x", "y"]},
  "unicode": "h\u00e9llo \u4e16\u754c \ud83d\ude00"
})json";

struct Case {
  const char* source;
  const char* expected;
};

std::string render(const std::string& source, const json& context = json::parse(kContext)) {
  return ChatTemplate::compile(source, "test.json").render(context);
}

template <size_t N>
void expect_renders(const Case (&cases)[N]) {
  const json context = json::parse(kContext);
  for (const Case& c : cases) {
    try {
      EXPECT_EQ(render(c.source, context), c.expected) << c.source;
    } catch (const Error& error) {
      ADD_FAILURE() << c.source << "\n  threw: " << error.what();
    }
  }
}

// The start of a source, to name it in a failure (some are megabytes long).
std::string shown(const std::string& source) {
  return source.size() <= 160 ? source : source.substr(0, 160) + "...";
}

void expect_compile_error(const std::string& source, std::initializer_list<std::string> fragments) {
  SCOPED_TRACE(shown(source));
  testing::expect_error([&] { ChatTemplate::compile(source, "tokenizer_config.json"); }, fragments);
}

void expect_render_error(const std::string& source, std::initializer_list<std::string> fragments,
                         const json& context = json::parse(kContext)) {
  SCOPED_TRACE(shown(source));
  const ChatTemplate compiled = ChatTemplate::compile(source, "tokenizer_config.json");
  testing::expect_error([&] { (void)compiled.render(context); }, fragments);
}

constexpr Case kOutput[] = {
    {"Hello {{ name }}!", "Hello World!"},
    {"{{ 'a' }}{{ \"b\" }}{{ 'c' 'd' }}", "abcd"},
    {"{{ 1 }} {{ -2 }} {{ 1.5 }} {{ 1.0 }} {{ 1e16 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 1_000 }} {{ "
     "0x1F }} {{ 0o17 }} {{ 0b101 }}",
     "1 -2 1.5 1.0 1e+16 1e-05 0.30000000000000004 1000 31 15 5"},
    {"{{ 1e15 }} {{ 0.0001 }} {{ 123456789012345678.0 }} {{ -0.0 }} {{ 1/3 }} {{ 2.5e-300 }} "
     "{{ 1e400 }} {{ -1e400 }}",
     "1000000000000000.0 0.0001 1.2345678901234568e+17 -0.0 0.3333333333333333 2.5e-300 inf -inf"},
    {"{{ true }} {{ false }} {{ none }} {{ True }} {{ None }}", "True False None True None"},
    {"{{ [1, 'two', none, true, 2.5] }} {{ ('a',) }} {{ () }} {{ (1, 2) }}",
     "[1, 'two', None, True, 2.5] ('a',) () (1, 2)"},
    {"{{ {'k': 'v', 'n': [1, {'x': none}]} }}", "{'k': 'v', 'n': [1, {'x': None}]}"},
    {"{{ \"it's\" }} {{ [\"it's\", 'say \"hi\"', 'both \\' \"'] }}",
     "it's [\"it's\", 'say \"hi\"', 'both \\' \"']"},
    {"{{ ['tab\\t', 'nl\\n', 'cr\\r', 'bs\\\\', 'bell\\x07', 'del\\x7f', '\\u00e9', '\\u200f', "
     "'\\xa0', '\\U0001F600'] }}",
     "['tab\\t', 'nl\\n', 'cr\\r', 'bs\\\\', 'bell\\x07', 'del\\x7f', 'é', '\\u200f', '\\xa0', "
     "'😀']"},
    {"{{ '\\x41\\u00e9\\101\\q' }}", "AéA\\q"},
    {"{{ nothing }}|{{ missing }}|{{ [missing] }}", "None||[Undefined]"},
    {"{{ user }}", "{'age': 36, 'name': 'Ada', 'tags': ['x', 'y']}"},
    {"{{ 'a', 'b' }}", "('a', 'b')"},
    {"{{ unicode }} {{ [unicode] }}", "héllo 世界 😀 ['héllo 世界 😀']"},
};

constexpr Case kWhitespace[] = {
    {"  {% if true %}\n  yes\n  {% endif %}\nend", "  yes\nend"},
    {"\t{% for n in numbers %}\n\t{{ n }}\n\t{% endfor %}\nend", "\t3\n\t1\n\t2\nend"},
    {"a {%+ if true %}b{% endif +%}\nc", "a b\nc"},
    {"line\n    {%- if true -%}\n   x   \n  {%- endif -%}\n  after", "linexafter"},
    {"  {#- comment -#}  \n  z", "z"},
    {"a\n  {# comment #}\nb", "a\nb"},
    {"{{ name }}  {% if true %}\ny{% endif %}", "World  y"},
    {"x {{- ' y ' -}} z", "x y z"},
    {"{{ 'a' }}\n{{ 'b' }}\n", "a\nb"},
    {"{% raw -%}   {{ name }}   {%- endraw %}!", "{{ name }}!"},
    {"  {% raw %}\n  {{ x }} {% if %}\n  {% endraw %}\nz", "\n  {{ x }} {% if %}\nz"},
    {"{% if true %}\r\nwindows\r\n{% endif %}\r\nend\r\n", "windows\nend"},
    {"one trailing newline is dropped\n", "one trailing newline is dropped"},
    {"two trailing newlines keep one\n\n", "two trailing newlines keep one\n"},
    {"{% for m in messages %}\n  {{- m.role }}: {{ m.content|trim }}\n{% endfor %}",
     "system: Be brief.\nuser: Hi there\nassistant: Hello!\nuser: 2+2?\n"},
};

constexpr Case kIf[] = {
    {"{% if flag %}yes{% endif %}", "yes"},
    {"{% if nothing %}a{% elif count > 40 %}b{% else %}c{% endif %}", "b"},
    {"{% if missing %}a{% elif false %}b{% else %}c{% endif %}", "c"},
    {"{% if true %}{% set inside = 1 %}{% endif %}{{ inside }}", "1"},
    {"{% if messages[0]['role'] == 'system' %}{% set rest = messages[1:] %}{% else %}{% set rest = "
     "messages %}{% endif %}{{ rest|length }}",
     "3"},
};

constexpr Case kFor[] = {
    {"{% for n in numbers %}{{ n }},{% endfor %}", "3,1,2,"},
    {"{% for n in numbers %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 "
     "}}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
     "1032TrueFalse3|2121FalseFalse3|3210FalseTrue3|"},
    {"{% for n in numbers %}{{ loop.previtem }}<{{ n }}>{{ loop.nextitem }}{{ loop.cycle('a', 'b') "
     "}} {% endfor %}",
     "<3>1a 3<1>2b 1<2>a "},
    {"{% for n in numbers if n > 1 %}{{ loop.index }}/{{ loop.length }}:{{ n }} {% endfor %}",
     "1/2:3 2/2:2 "},
    {"{% for n in [] %}x{% else %}empty{% endfor %}", "empty"},
    {"{% for n in numbers if n > 5 %}x{% else %}none passed{% endfor %}", "none passed"},
    {"{% for k, v in user.items() %}{{ k }}={{ v }};{% endfor %}",
     "age=36;name=Ada;tags=['x', 'y'];"},
    {"{% for k, v in user|dictsort %}{{ k }}={{ v }};{% endfor %}",
     "age=36;name=Ada;tags=['x', 'y'];"},
    {"{% for a, b in [[1, 2], (3, 4), 'xy'] %}{{ a }}{{ b }} {% endfor %}", "12 34 xy "},
    {"{% for c in unicode %}[{{ c }}]{% endfor %}", "[h][é][l][l][o][ ][世][界][ ][😀]"},
    {"{% for k in user %}{{ k }} {% endfor %}", "age name tags "},
    {"{% for n in missing %}x{% else %}undefined is empty{% endfor %}", "undefined is empty"},
    {"{% for m in messages[::-1] %}{{ m.role }} {% endfor %}", "user assistant user system "},
    {"{% for a in [1, 2] %}{% for b in [3, 4] %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}{{ "
     "loop.index }}|{% endfor %}",
     "131 142 1|231 242 2|"},
    {"{% for n in range(10) %}{% if n is odd %}{% continue %}{% endif %}{% if n > 6 %}{% break "
     "%}{% endif %}{{ n }}{% endfor %}",
     "0246"},
    {"{% set x = 1 %}{% for n in [1, 2] %}{{ x }}{% set x = x + 10 %}{{ x }} {% endfor %}{{ x }}",
     "111 111 1"},
    {"{% for n in [1, 2] %}{% if n == 2 %}{{ seen }}{% endif %}{% set seen = n %}{% endfor %}[{{ "
     "seen }}]",
     "[]"},
    {"{% for n in [1, 2, 3] %}{{ loop.changed(n > 1) }} {% endfor %}", "True True False "},
    {"{% for m in messages %}{% if loop.first and m.role == 'system' %}S{% elif loop.last %}L{% "
     "else %}-{% endif %}{% endfor %}",
     "S--L"},
};

constexpr Case kSet[] = {
    {"{% set a = 'x' %}{% set b = a ~ 'y' %}{{ a }}{{ b }}", "xxy"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 3, 4 %}{{ c }}", "12(3, 4)"},
    {"{% set block %}\n  inside {{ name }}\n{% endset %}[{{ block }}]", "[  inside World\n]"},
    {"{% set shout | upper | trim %}  quiet  {% endset %}[{{ shout }}]", "[QUIET]"},
    {"{% set ns = namespace(count=0, names=[]) %}{% for m in messages %}{% set ns.count = ns.count "
     "+ 1 %}{% set ns.names = ns.names + [m.role] %}{% endfor %}{{ ns.count }} {{ ns.names }} {{ "
     "ns }}",
     "4 ['system', 'user', 'assistant', 'user'] <Namespace {'count': 4, 'names': ['system', "
     "'user', 'assistant', 'user']}>"},
    {"{% set ns = namespace(user) %}{{ ns.name }} {{ ns.age }}", "Ada 36"},
    {"{% set ns = namespace(found=false) %}{% for m in messages %}{% if m.role == 'assistant' %}{% "
     "set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }}",
     "True"},
    {"{% set block %}{% set leaked = 1 %}{% endset %}[{{ leaked }}]", "[]"},
};

constexpr Case kMacro[] = {
    {"{% macro greet(who, punct='!') %}Hello {{ who }}{{ punct }}{% endmacro %}{{ greet('you') }} "
     "{{ greet('all', '?') }} {{ greet(punct='.', who='kw') }}",
     "Hello you! Hello all? Hello kw."},
    {"{% macro show(a) %}{{ a }}|{{ b }}{% endmacro %}{{ show() }}", "|"},
    {"{% macro count_down(n) %}{{ n }}{% if n > 0 %}{{ count_down(n - 1) }}{% endif %}{% endmacro "
     "%}{{ count_down(3) }}",
     "3210"},
    {"{% macro m() %}{{ later }}{% endmacro %}{% set later = 'seen at call time' %}{{ m() }}",
     "seen at call time"},
    {"{% macro m() %}{% set local = 1 %}{% endmacro %}{{ m() }}[{{ local }}]", "[]"},
    {"{% macro m(x) %}<{{ x }}>{% endmacro %}{{ m }}", "<Macro 'm'>"},
};

constexpr Case kBlocks[] = {
    {"{% with a = 1, b = name %}{{ a }}{{ b }}{% endwith %}[{{ a }}]", "1World[]"},
    {"{% filter upper %}shout {{ name }}{% endfilter %}", "SHOUT WORLD"},
    {"{% filter trim | title %}   two words   {% endfilter %}!", "Two Words!"},
    {"{% generation %}assistant text {{ name }}{% endgeneration %}", "assistant text World"},
    {"{% print name, count %}", "World42"},
    {"{# a comment {{ not rendered }} #}after", "after"},
};

constexpr Case kOperators[] = {
    {"{{ 7 + 2 }} {{ 7 - 2 }} {{ 7 * 2 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ 7 % 2 }} {{ 7 ** 2 }}",
     "9 5 14 3.5 3 1 49"},
    {"{{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** -1 }} {{ 2 ** "
     "0.5 }} {{ 6 / 2 }}",
     "-4 2 -2 3.0 0.5 0.5 1.4142135623730951 3.0"},
    {"{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ - count }} {{ +count }}",
     "7 9 64 4 -42 42"},
    {"{{ 'a' + 'b' }} {{ [1] + [2] }} {{ (1,) + (2,) }} {{ 'ab' * 3 }} {{ 2 * [0] }} {{ 'x' * 0 }} "
     "{{ true + true }}",
     "ab [1, 2] (1, 2) ababab [0, 0]  2"},
    {"{{ 'a' ~ 1 ~ none ~ missing ~ [2] ~ 1.5 }}", "a1None[2]1.5"},
    {"{{ 1 == 1.0 }} {{ 'a' == 'a' }} {{ [1, 2] == [1, 2] }} {{ (1, 2) == [1, 2] }} {{ {'a': 1} == "
     "{'a': 1} }} {{ none == none }} {{ missing == other_missing }} {{ true == 1 }}",
     "True True True False True True True True"},
    {"{{ 1 != 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 2 >= 2.0 }} {{ 'abc' < 'abd' }} {{ [1, 2] < "
     "[1, 3] }} {{ [1] <= [1] }}",
     "True True False True True True True"},
    {"{{ 1 in numbers }} {{ 5 in numbers }} {{ 'ell' in 'hello' }} {{ 'name' in user }} {{ 'b' not "
     "in 'abc' }} {{ 'x' in missing }}",
     "True False True True False False"},
    {"{{ not flag }} {{ flag and count }} {{ nothing or 'fallback' }} {{ 0 or [] }} {{ 1 and 0 }} "
     "{{ not missing }}",
     "False 42 fallback [] 0 True"},
    {"{{ 'yes' if flag else 'no' }} {{ 'yes' if nothing else 'no' }} {{ 'a' if false else 'b' if "
     "true else 'c' }}[{{ 'x' if false }}]",
     "yes no b[]"},
    {"{{ count > 40 and count < 50 }} {{ not count == 42 }} {{ numbers|length > 2 and numbers[0] "
     "== 3 }}",
     "True False True"},
};

constexpr Case kAccess[] = {
    {"{{ user.name }} {{ user['name'] }} {{ user.tags[1] }} {{ user['tags'][-1] }} {{ "
     "messages[0].role }} {{ messages.0.role }}",
     "Ada Ada y y system system"},
    {"{{ user.missing }}|{{ user['missing'] }}|{{ numbers[10] }}|{{ nothing.attribute }}", "|||"},
    {"{{ user.missing is defined }} {{ user.name is defined }} {{ missing is undefined }}",
     "False True True"},
    {"{{ numbers[1:] }} {{ numbers[:-1] }} {{ numbers[::-1] }} {{ numbers[::2] }} {{ numbers[5:] "
     "}} {{ numbers[-2:] }}",
     "[1, 2] [3, 1] [2, 1, 3] [3, 2] [] [1, 2]"},
    {"{{ 'hello'[1] }} {{ 'hello'[-1] }} {{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ unicode[1] }} "
     "{{ unicode[-1] }} {{ unicode[::-1] }}",
     "e o el olleh é 😀 😀 界世 olléh"},
};

constexpr Case kStringMethods[] = {
    {"[{{ text.strip() }}] [{{ text.lstrip() }}] [{{ text.rstrip() }}] [{{ 'xxhixx'.strip('x') }}] "
     "[{{ '\\n\\nhi\\n'.strip('\\n') }}] [{{ '\\u3000\\xa0wide\\u2028'.strip() }}]",
     "[padded] [padded  ] [  padded] [hi] [hi] [wide]"},
    {"{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith('lo') }} {{ 'Hello'.startswith(('x', "
     "'H')) }} {{ 'Hello'.endswith('x') }}",
     "True True True False"},
    {"{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ ' a  b c '.split(none, 1) }} {{ 'a b "
     "c'.split(' ', 1) }} {{ 'a b c'.rsplit(' ', 1) }} {{ ''.split() }} {{ ''.split(',') }}",
     "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c '] ['a', 'b c'] ['a b', 'c'] [] ['']"},
    {"{{ 'one\\ntwo\\r\\nthree'.splitlines() }} {{ 'x</think>y</think>z'.split('</think>')[-1] }}",
     "['one', 'two', 'three'] z"},
    {"{{ 'hello'.replace('l', 'L') }} {{ 'hello'.replace('l', 'L', 1) }} {{ 'ab'.replace('', '-') "
     "}}",
     "heLLo heLlo -a-b-"},
    {"{{ 'MiXed'.upper() }} {{ 'MiXed'.lower() }} {{ 'hello wORLD'.title() }} {{ "
     "'hELLO'.capitalize() }} {{ 'MiXed'.swapcase() }}",
     "MIXED mixed Hello World Hello mIxED"},
    {"{{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ "
     "'héllo'.find('l') }} {{ 'hello'.index('e') }} {{ 'hello'.count('l') }}",
     "2 3 -1 2 1 2"},
    {"{{ '-'.join(['a', 'b', 'c']) }} {{ ', '.join(numbers|map('string')) }}", "a-b-c 3, 1, 2"},
    {"{{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ 'a1'.isalnum() }} {{ ' '.isspace() }} {{ "
     "'ab'.islower() }} {{ 'AB'.isupper() }}",
     "True True True True True True"},
    {"{{ 'prefix-x'.removeprefix('prefix-') }} {{ 'x.txt'.removesuffix('.txt') }} {{ "
     "'k=v=w'.partition('=') }} {{ 'k=v=w'.rpartition('=') }}",
     "x x ('k', '=', 'v=w') ('k=v', '=', 'w')"},
    {"[{{ 'ab'.center(6, '*') }}] [{{ 'ab'.ljust(4) }}] [{{ 'ab'.rjust(4, '.') }}] [{{ "
     "'-7'.zfill(4) }}]",
     "[**ab**] [ab  ] [..ab] [-007]"},
};

constexpr Case kDictMethods[] = {
    {"{{ user.get('name') }} {{ user.get('missing') }} {{ user.get('missing', 'default') }}",
     "Ada None default"},
    {"{{ user.keys() }} {{ user.values() }} {{ user.items() }}",
     "dict_keys(['age', 'name', 'tags']) dict_values([36, 'Ada', ['x', 'y']]) dict_items([('age', "
     "36), ('name', 'Ada'), ('tags', ['x', 'y'])])"},
    {"{{ user.keys()|list }} {{ user.items()|length }} {{ 'age' in user.keys() }}",
     "['age', 'name', 'tags'] 3 True"},
    {"{{ numbers.index(1) }} {{ numbers.count(3) }}", "1 1"},
};

constexpr Case kFilters[] = {
    {"[{{ text|trim }}] [{{ 'xxhixx'|trim('x') }}] [{{ missing|trim }}] [{{ "
     "messages[1].content|trim }}]",
     "[padded] [hi] [] [Hi there]"},
    {"{{ numbers|length }} {{ 'héllo'|length }} {{ user|count }} {{ missing|length }}", "3 5 3 0"},
    {"{{ name|upper }} {{ name|lower }} {{ 'hELLO wORLD'|capitalize }} {{ 'hello "
     "wORLD-foo(bar'|title }}",
     "WORLD world Hello world Hello World-Foo(Bar"},
    {"{{ missing|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} {{ "
     "nothing|d('n') }} {{ name|default('x') }}",
     "d  d None World"},
    {"{{ numbers|first }} {{ numbers|last }} {{ 'abc'|first }} {{ 'abc'|last }} {{ user|first }} "
     "{{ []|first }}",
     "3 2 a c age "},
    {"{{ numbers|join }} {{ numbers|join(', ') }} {{ messages|join('|', attribute='role') }}",
     "312 3, 1, 2 system|user|assistant|user"},
    {"{{ 'a.b.c'|replace('.', '/') }} {{ 'aaa'|replace('a', 'b', 2) }}", "a/b/c bba"},
    {"{{ 'abc'|list }} {{ user|list }} {{ missing|list }} {{ numbers|list }}",
     "['a', 'b', 'c'] ['age', 'name', 'tags'] [] [3, 1, 2]"},
    {"{% for k, v in user|items %}{{ k }}:{{ v }} {% endfor %}",
     "age:36 name:Ada tags:['x', 'y'] "},
    {"{{ 42|string }} {{ [1]|string }} {{ none|string }} {{ missing|string }}", "42 [1] None "},
    {"{{ '42'|int }} {{ ' 7 '|int }} {{ '3.9'|int }} {{ 'x'|int }} {{ 'x'|int(-1) }} {{ 3.9|int }} "
     "{{ '1_000'|int }} {{ 'ff'|int(base=16) }} {{ true|int }}",
     "42 7 3 0 -1 3 1000 255 1"},
    {"{{ '1.5'|float }} {{ 'x'|float }} {{ 'x'|float(2.5) }} {{ 3|float }} {{ ' 1e3 '|float }}",
     "1.5 0.0 2.5 3.0 1000.0"},
    {"{{ -3|abs }} {{ (-2.5)|abs }} {{ count|abs }}", "3 2.5 42"},
    {"{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 7|round }} {{ 2.1|round(0, 'ceil') "
     "}} {{ 2.9|round(0, 'floor') }}",
     "2.0 4.0 2.67 7 3.0 2.0"},
    {"{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }}",
     "['  Hi there \\n', '2+2?']"},
    {"{{ messages|rejectattr('role', 'eq', 'user')|map(attribute='role')|list }}",
     "['system', 'assistant']"},
    {"{{ [0, 1, '', 'a', none]|select|list }} {{ numbers|select('odd')|list }} {{ "
     "numbers|reject('odd')|list }} {{ numbers|select('gt', 1)|list }}",
     "[1, 'a'] [3, 1] [2] [3, 2]"},
    {"{{ [{'a': 1}, {}]|map(attribute='a')|list }} {{ [{'a': 1}, {}]|map(attribute='a', "
     "default=0)|list }} {{ ['a', 'b']|map('upper')|join }}",
     "[1, Undefined] [1, 0] AB"},
    {"{{ messages|selectattr('role', 'in', ['system', 'assistant'])|list|length }}", "2"},
    {"{{ numbers|sort }} {{ numbers|sort(reverse=true) }} {{ ['b', 'A', 'a']|sort }} {{ ['b', 'A', "
     "'a']|sort(case_sensitive=true) }} {{ "
     "messages|sort(attribute='role')|map(attribute='role')|join(',') }}",
     "[1, 2, 3] [3, 2, 1] ['A', 'a', 'b'] ['A', 'a', 'b'] assistant,system,user,user"},
    {"{{ ['b', 'A', 'a', 'b']|unique|list }} {{ ['a', 'A']|unique(case_sensitive=true)|list }}",
     "['b', 'A'] ['a', 'A']"},
    {"{{ user|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value') }} {{ {'b': 1, 'a': "
     "2}|dictsort(reverse=true) }}",
     "[('age', 36), ('name', 'Ada'), ('tags', ['x', 'y'])] [('b', 1), ('a', 2)] [('b', 1), ('a', "
     "2)]"},
    {"{{ numbers|reverse|list }} {{ 'abc'|reverse }} {{ unicode|reverse }}",
     "[2, 1, 3] cba 😀 界世 olléh"},
    {"{{ numbers|sum }} {{ [{'v': 1}, {'v': 2}]|sum(attribute='v') }} {{ numbers|sum(start=10) }}",
     "6 3 16"},
    {"{{ numbers|max }} {{ numbers|min }} {{ ['b', 'A']|max }} {{ []|max }}", "3 1 b "},
    {"{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(width='> ', "
     "blank=true) }}",
     "a\n    b\n\n    c|  a\n  b|a\n> \n> b"},
    {"{{ user|tojson }}", "{\"age\": 36, \"name\": \"Ada\", \"tags\": [\"x\", \"y\"]}"},
    {"{{ messages[0]|tojson(indent=2) }}",
     "{\n  \"role\": \"system\",\n  \"content\": \"Be brief.\"\n}"},
    {"{{ {'b': 1, 'a': [1.5, none, true, 'é\\n\"\\\\']}|tojson(sort_keys=true) }}",
     "{\"a\": [1.5, null, true, \"é\\n\\\"\\\\\"], \"b\": 1}"},
    {"{{ 'é😀\\x01'|tojson }} {{ 'é😀\\x01'|tojson(ensure_ascii=true) }} {{ [[], "
     "{}]|tojson(indent=2) }} {{ [1, 2]|tojson(separators=[',', ':']) }}",
     "\"é😀\\u0001\" \"\\u00e9\\ud83d\\ude00\\u0001\" [\n  [],\n  {}\n] [1,2]"},
};

constexpr Case kTests[] = {
    {"{{ missing is defined }} {{ name is defined }} {{ missing is undefined }} {{ nothing is none "
     "}} {{ name is not none }}",
     "False True True True True"},
    {"{{ name is string }} {{ count is string }} {{ count is number }} {{ ratio is number }} {{ "
     "flag is number }} {{ count is integer }} {{ ratio is float }} {{ flag is boolean }}",
     "True False True True True True True True"},
    {"{{ flag is true }} {{ flag is false }} {{ 1 is true }} {{ user is mapping }} {{ numbers is "
     "mapping }}",
     "True False False True False"},
    {"{{ numbers is iterable }} {{ name is iterable }} {{ count is iterable }} {{ numbers is "
     "sequence }} {{ user is sequence }} {{ count is sequence }}",
     "True True False True True False"},
    {"{{ count is even }} {{ count is odd }} {{ count is divisibleby 7 }} {{ count is "
     "divisibleby(5) }}",
     "True False True False"},
    {"{{ 1 is eq 1 }} {{ 1 is equalto 2 }} {{ 1 is ne 2 }} {{ 1 is lt 2 }} {{ 1 is le 1 }} {{ 2 is "
     "gt 1 }} {{ 2 is ge 3 }} {{ 1 is in numbers }}",
     "True False True True True True False True"},
    {"{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'aBc' is lower }} {{ none is sameas none }} {{ "
     "flag is sameas true }}",
     "True True False True True"},
    {"{{ range is callable }} {{ name is callable }}", "True False"},
};

constexpr Case kGlobals[] = {
    {"{{ range(4)|list }} {{ range(1, 4)|list }} {{ range(10, 0, -3)|list }} {{ range(3) }} {{ "
     "range(3)|length }}",
     "[0, 1, 2, 3] [1, 2, 3] [10, 7, 4, 1] range(0, 3) 3"},
    {"{{ dict(a=1, b='x') }} {{ dict([('k', 'v')]) }} {{ dict(user, age=1) }}",
     "{'a': 1, 'b': 'x'} {'k': 'v'} {'age': 1, 'name': 'Ada', 'tags': ['x', 'y']}"},
    {"{{ namespace(a=1) }}", "<Namespace {'a': 1}>"},
};

TEST(ChatTemplate, Output) {
  expect_renders(kOutput);
}
TEST(ChatTemplate, Whitespace) {
  expect_renders(kWhitespace);
}
TEST(ChatTemplate, If) {
  expect_renders(kIf);
}
TEST(ChatTemplate, For) {
  expect_renders(kFor);
}
TEST(ChatTemplate, Set) {
  expect_renders(kSet);
}
TEST(ChatTemplate, Macro) {
  expect_renders(kMacro);
}
TEST(ChatTemplate, Blocks) {
  expect_renders(kBlocks);
}
TEST(ChatTemplate, Operators) {
  expect_renders(kOperators);
}
TEST(ChatTemplate, Access) {
  expect_renders(kAccess);
}
TEST(ChatTemplate, StringMethods) {
  expect_renders(kStringMethods);
}
TEST(ChatTemplate, DictMethods) {
  expect_renders(kDictMethods);
}
TEST(ChatTemplate, Filters) {
  expect_renders(kFilters);
}
TEST(ChatTemplate, Tests) {
  expect_renders(kTests);
}
TEST(ChatTemplate, Globals) {
  expect_renders(kGlobals);
}

TEST(ChatTemplate, RendersALlamaStyleTemplate) {
  const std::string source =
      "{% set loop_messages = messages %}{% for message in loop_messages %}"
      "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + "
      "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
      "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
      "{% endif %}";
  const json context = {
      {"messages", {{{"role", "user"}, {"content", " Hi \n"}}}},
      {"bos_token", "<|begin_of_text|>"},
      {"add_generation_prompt", true},
  };
  EXPECT_EQ(render(source, context),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, CompiledTemplateRendersManyContextsIndependently) {
  const ChatTemplate compiled = ChatTemplate::compile(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}"
      "{{ ns.n }}",
      "test.json");
  const ChatTemplate copy = compiled;
  EXPECT_EQ(compiled.render({{"messages", json::array({1, 2, 3})}}), "3");
  EXPECT_EQ(copy.render({{"messages", json::array({1})}}), "1");
  EXPECT_EQ(compiled.render({{"messages", json::array()}}), "0");
}

// Python dicts keep insertion order; the context keeps it too.
TEST(ChatTemplate, ContextKeepsKeyOrder) {
  const auto program = jinja::parse_template("{{ m }} {{ m|tojson }} {{ m.keys()|list }}");
  const nlohmann::ordered_json context =
      nlohmann::ordered_json::parse(R"({"m": {"role": "user", "content": "hi", "name": "x"}})");
  EXPECT_EQ(jinja::render_template(program, context),
            "{'role': 'user', 'content': 'hi', 'name': 'x'} "
            "{\"role\": \"user\", \"content\": \"hi\", \"name\": \"x\"} "
            "['role', 'content', 'name']");
}

// ---- refused when compiled ---------------------------------------------------------------------

TEST(ChatTemplateErrors, UnsupportedConstructsNameThemselvesAndTheirLine) {
  expect_compile_error("line one\nline two\n{{ text|wordwrap }}",
                       {"tokenizer_config.json: chat_template line 3: unsupported filter "
                        "'wordwrap'"});
  expect_compile_error("{{ text|safe }}", {"line 1", "unsupported filter 'safe'"});
  expect_compile_error("{{ items|map('center')|list }}", {"unsupported filter 'center'"});
  expect_compile_error("{% if x is escaped %}{% endif %}", {"unsupported test 'escaped'"});
  expect_compile_error("{{ items|select('filter')|list }}", {"unsupported test 'filter'"});
  expect_compile_error("\n{% include 'other.jinja' %}", {"line 2", "unsupported tag 'include'"});
  expect_compile_error("{% extends 'base' %}", {"unsupported tag 'extends'"});
  expect_compile_error("{% block body %}{% endblock %}", {"unsupported tag 'block'"});
  expect_compile_error("{% import 'm' as m %}", {"unsupported tag 'import'"});
  expect_compile_error("{% call m() %}x{% endcall %}", {"unsupported tag 'call'"});
  expect_compile_error("{% frobnicate %}", {"unknown tag 'frobnicate'"});
  expect_compile_error("{% do x.append(1) %}", {"unknown tag 'do'"});
  expect_compile_error("{{ 'x{}'.format(1) }}", {"unsupported method 'format'"});
  expect_compile_error("{{ items.append(1) }}", {"unsupported method 'append'"});
  expect_compile_error("{{ d.update({'a': 1}) }}", {"unsupported method 'update'"});
  expect_compile_error("{{ cycler('a', 'b') }}", {"unsupported function 'cycler'"});
  expect_compile_error("{{ joiner() }}", {"unsupported function 'joiner'"});
  expect_compile_error("{% for x in y recursive %}{% endfor %}", {"recursive loops"});
  expect_compile_error("{{ f(*args) }}", {"*args and **kwargs"});
  expect_compile_error("{{ f(**kwargs) }}", {"*args and **kwargs"});
  expect_compile_error("{% for m in messages %}{% macro f() %}{% endmacro %}{% endfor %}",
                       {"macros may only be defined at the top level"});
  expect_compile_error("{% break %}", {"'break' outside a loop"});
  expect_compile_error("{% for x in y %}{% set b %}{% continue %}{% endset %}{% endfor %}",
                       {"'continue' outside a loop"});
  expect_compile_error("{{ '\\N{BULLET}' }}", {"named Unicode escapes"});
}

TEST(ChatTemplateErrors, SyntaxErrorsNameTheLine) {
  expect_compile_error("{{ 1 + }}", {"line 1", "unexpected '}}'"});
  expect_compile_error("a\n{% if flag %}\nb",
                       {"line 2", "'if' on line 2 is never closed", "{% endif %}"});
  expect_compile_error("{% for x in y %}{% endif %}", {"unexpected '{% endif %}'"});
  expect_compile_error("{% endfor %}", {"unexpected '{% endfor %}'"});
  expect_compile_error("{% if x %}{% else %}{% elif y %}{% endif %}", {"unexpected '{% elif %}'"});
  expect_compile_error("text {{ name", {"line 1", "missing '}}'"});
  expect_compile_error("{% if x", {"missing '%}'"});
  expect_compile_error("\n\n{# never closed", {"line 3", "missing end of comment"});
  expect_compile_error("{% raw %} open", {"missing end of raw block"});
  expect_compile_error("{{ 'unterminated }}", {"unterminated string"});
  expect_compile_error("{{ (1 }}", {"unexpected '}', expected ')'"});
  expect_compile_error("{{ ] }}", {"unexpected ']'"});
  expect_compile_error("{{ a ! b }}", {"unexpected character '!'"});
  expect_compile_error("{{ 99999999999999999999 }}", {"exceeds 64 bits"});
  expect_compile_error("{{ '\\x4' }}", {"truncated \\xXX escape"});
  expect_compile_error("{% set 1 = x %}", {"cannot assign to '1'"});
  expect_compile_error("{% macro m(a=1, b) %}{% endmacro %}", {"non-default argument"});
  expect_compile_error("{{ f(a=1, 2) }}", {"positional argument follows keyword argument"});
  expect_compile_error("{{ x is }}", {"expected a test name"});
  expect_compile_error("{{ }}", {"expected an expression"});
  expect_compile_error("{% %}", {"expected a tag name"});
}

// ---- raised while rendering --------------------------------------------------------------------

TEST(ChatTemplateErrors, RaiseExceptionCarriesTheMessage) {
  expect_render_error(
      "{% for m in messages %}\n{% if m.role == 'assistant' %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
      "{% endif %}{% endfor %}",
      {"tokenizer_config.json: chat_template line 2: ",
       "Conversation roles must alternate user/assistant/user/assistant/..."});
  // A message over several lines stays one line.
  expect_render_error("{{ raise_exception('first\\nsecond') }}", {"first\\nsecond"});
  expect_render_error("{{ raise_exception() }}", {"raise_exception() takes exactly 1"});
}

TEST(ChatTemplateErrors, UndefinedValuesRaiseWhenUsed) {
  expect_render_error("{{ missing.attribute }}", {"'missing' is undefined"});
  expect_render_error("{{ missing['key'] }}", {"'missing' is undefined"});
  expect_render_error("{{ user.missing.deeper }}", {"'dict object' has no attribute 'missing'"});
  expect_render_error("{{ numbers[9].x }}", {"list object has no element 9"});
  expect_render_error("{{ nothing.a.b }}", {"'None' has no attribute 'a'"});
  expect_render_error("{{ missing() }}", {"'missing' is undefined"});
  expect_render_error("{{ 'text' + missing }}", {"'missing' is undefined"});
  expect_render_error("{{ missing - 1 }}", {"'missing' is undefined"});
  expect_render_error("{{ missing < 1 }}", {"'missing' is undefined"});
  expect_render_error("{{ missing|tojson }}",
                      {"Object of type Undefined is not JSON serializable"});
  expect_render_error("{{ (1 if false).x }}",
                      {"the inline if-expression on line 1 evaluated to false"});
  expect_render_error("{% set ns = namespace() %}{{ ns.nope.x }}",
                      {"'transformers.utils.chat_template_utils.TemplateNamespace object' has no "
                       "attribute 'nope'"});
  expect_render_error("{% macro m(a) %}{{ a.x }}{% endmacro %}{{ m() }}",
                      {"parameter 'a' was not provided"});
  expect_render_error("{{ user.update.x }}",
                      {"access to attribute 'update' of 'dict' object is unsafe."});
}

TEST(ChatTemplateErrors, TypeErrorsReadAsPython) {
  expect_render_error("{{ 'a' + 1 }}", {"can only concatenate str (not \"int\") to str"});
  expect_render_error("{{ 1 + 'a' }}", {"unsupported operand type(s) for +: 'int' and 'str'"});
  expect_render_error("{{ numbers + 'a' }}", {"can only concatenate list (not \"str\") to list"});
  expect_render_error("{{ 1 < 'a' }}", {"'<' not supported between instances of 'int' and 'str'"});
  expect_render_error("{{ 1 > 'a' }}", {"'>' not supported between instances of 'int' and 'str'"});
  expect_render_error("{{ 1 / 0 }}", {"division by zero"});
  expect_render_error("{{ 1 // 0 }}", {"integer division or modulo by zero"});
  expect_render_error("{{ 1.5 % 0 }}", {"float modulo"});
  expect_render_error("{{ 'a' * 1.5 }}", {"can't multiply sequence by non-int of type 'float'"});
  expect_render_error("{{ -'a' }}", {"bad operand type for unary -: 'str'"});
  expect_render_error("{{ 1 in 2 }}", {"argument of type 'int' is not iterable"});
  expect_render_error("{{ 1 in 'abc' }}", {"'in <string>' requires string as left operand"});
  expect_render_error("{{ [1] in user }}", {"unhashable type: 'list'"});
  expect_render_error("{{ count|length }}", {"object of type 'int' has no len()"});
  expect_render_error("{{ numbers|select('odd')|length }}",
                      {"object of type 'generator' has no len()"});
  expect_render_error("{% for x in count %}{% endfor %}", {"'int' object is not iterable"});
  expect_render_error("{{ name() }}", {"'str' object is not callable"});
  expect_render_error("{{ 'abc'.index('z') }}", {"substring not found"});
  expect_render_error("{{ ''.split('') }}", {"empty separator"});
  expect_render_error("{{ '%s' % name }}", {"string formatting", "not supported"});
  expect_render_error("{{ 9223372036854775807 + 1 }}", {"integer overflow"});
  expect_render_error("{{ [1, 2]|sum(start='') }}", {"sum() can't sum strings"});
  expect_render_error("{{ 'x'|abs }}", {"bad operand type for abs(): 'str'"});
  expect_render_error("{{ 'x'|round }}", {"type str doesn't define __round__ method"});
  expect_render_error("{{ user|items|list|items }}", {"Can only get item pairs from a mapping."});
  expect_render_error("{{ name|trim(1) }}", {"strip arg must be None or str"});
  expect_render_error("{{ name|upper(1) }}", {"the filter 'upper' takes no arguments"});
  expect_render_error("{{ name|join(', ', attribute='x', extra=1) }}",
                      {"join() got an unexpected keyword argument 'extra'"});
  expect_render_error("{{ 4 is divisibleby }}", {"the test 'divisibleby' takes one argument"});
  expect_render_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}",
                      {"macro 'm' takes not more than 1 argument(s)"});
  expect_render_error("{% macro m(a) %}{% endmacro %}{{ m(b=1) }}",
                      {"macro 'm' takes no keyword argument 'b'"});
}

TEST(ChatTemplateErrors, AssignmentsReadAsPython) {
  expect_render_error("{% for a, b in [[1]] %}{% endfor %}",
                      {"not enough values to unpack (expected 2, got 1)"});
  expect_render_error("{% set a, b = [1, 2, 3] %}", {"too many values to unpack (expected 2)"});
  expect_render_error("{% set a, b = 1 %}", {"cannot unpack non-iterable int object"});
  expect_render_error("{% set x = 1 %}{% set x.y = 2 %}",
                      {"cannot assign attribute on non-namespace object"});
  expect_render_error("{% set ns = namespace() %}{% set ns._secret = 1 %}",
                      {"underscore-prefixed attributes", "'_secret'"});
  expect_render_error("{{ namespace(_x=1) }}", {"underscore-prefixed attributes"});
  expect_render_error("{% set ns = namespace() %}{% set ns.inner = namespace() %}",
                      {"a namespace attribute may hold only data"});
  expect_render_error(
      "{% set ns = namespace() %}{% for m in messages %}{% set ns.l = [loop] %}"
      "{% endfor %}",
      {"a namespace attribute may hold only data"});
}

// Python prints these with a memory address, which no renderer can reproduce.
TEST(ChatTemplateErrors, ValuesPythonPrintsWithAnAddressAreRefused) {
  expect_render_error("{{ numbers|select('odd') }}", {"cannot print a generator"});
  expect_render_error("{{ numbers|reverse }}", {"cannot print a list_reverseiterator"});
  expect_render_error("{{ user.items }}", {"cannot print a function"});
  expect_render_error("{{ range }}", {"cannot print a function"});
}

TEST(ChatTemplateErrors, ContextMustBeAnObjectOfBoundedDepth) {
  expect_render_error(
      "{{ x }}", {"tokenizer_config.json: chat_template: ", "the context must be a JSON object"},
      json::array({1, 2}));
  json deep = 1;
  for (int i = 0; i < 100; ++i) deep = json::array({deep});
  expect_render_error("{{ x }}", {"the context nests deeper than 64"}, json{{"x", deep}});
  expect_render_error("{{ x }}", {"the context holds the integer 18446744073709551615"},
                      json{{"x", UINT64_MAX}});
}

// ---- resource bounds ---------------------------------------------------------------------------

std::string repeated(const std::string& text, int times) {
  std::string out;
  for (int i = 0; i < times; ++i) out += text;
  return out;
}

TEST(ChatTemplateLimits, BlockNesting) {
  EXPECT_EQ(render(repeated("{% if true %}", 60) + "deep" + repeated("{% endif %}", 60)), "deep");
  expect_compile_error(repeated("{% if true %}", 65) + repeated("{% endif %}", 65),
                       {"blocks nest deeper than 64"});
  expect_compile_error(repeated("{% for x in y %}", 50000), {"blocks nest deeper than 64"});
}

TEST(ChatTemplateLimits, ExpressionDepth) {
  EXPECT_EQ(render("{{ " + repeated("(", 100) + "7" + repeated(")", 100) + " }}"), "7");
  EXPECT_EQ(render("{{ 0" + repeated(" + 1", 100) + " }}"), "100");
  expect_compile_error("{{ " + repeated("(", 200) + "7" + repeated(")", 200) + " }}",
                       {"expression nests deeper than 128"});
  expect_compile_error("{{ " + repeated("(", 300000) + "7" + repeated(")", 300000) + " }}",
                       {"expression nests deeper than 128"});
  expect_compile_error("{{ 0" + repeated(" + 1", 200) + " }}",
                       {"expression nests deeper than 128"});
  expect_compile_error("{{ " + repeated("not ", 500) + "x }}",
                       {"expression nests deeper than 128"});
  expect_compile_error("{{ " + repeated("[", 300) + repeated("]", 300) + " }}",
                       {"expression nests deeper than 128"});
  expect_compile_error("{{ " + repeated("[", 3000) + repeated("]", 3000) + " }}",
                       {"expression nests deeper than 128"});
  expect_compile_error("{{ " + repeated("{'k': ", 3000) + "1" + repeated("}", 3000) + " }}",
                       {"expression nests deeper than 128"});
  expect_compile_error("{% set x = " + repeated("[", 3000) + repeated("]", 3000) + " %}",
                       {"expression nests deeper than 128"});
  expect_compile_error("{{ x" + repeated("|trim", 300) + " }}",
                       {"expression nests deeper than 128"});
}

TEST(ChatTemplateLimits, OutputAndStringSize) {
  expect_render_error("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
                      {"exceeds the limit of 16777216 bytes"});
  expect_render_error("{{ 'x' * 20000000 }}",
                      {"a string of 20000000 bytes exceeds the limit of 16777216 bytes"});
  expect_render_error(
      "{% set ns = namespace(s='xx') %}{% for i in range(64) %}"
      "{% set ns.s = ns.s + ns.s %}{% endfor %}",
      {"exceeds the limit of 16777216 bytes"});
  expect_render_error("{{ 'ab'.center(100000000) }}", {"exceeds the limit of 16777216 bytes"});
}

TEST(ChatTemplateLimits, EvaluationSteps) {
  expect_render_error("{% for i in range(100000) %}{{ range(100000)|length }}{% endfor %}",
                      {"rendering exceeded the limit of 5000000 evaluation steps"});
  expect_render_error(
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
      "{% endfor %}",
      {"evaluation steps"});
  expect_render_error("{{ range(1000000)|length }}",
                      {"Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000)."});
  expect_render_error("{{ [0] * 100000000 }}", {"evaluation steps"});
}

TEST(ChatTemplateLimits, MacroRecursionAndEvaluationDepth) {
  expect_render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
                      {"macro calls nest deeper than 32"});
  EXPECT_EQ(render("{% macro f(n) %}{% if n < 30 %}{{ f(n + 1) }}{% else %}{{ n }}{% endif %}"
                   "{% endmacro %}{{ f(0) }}"),
            "30");
  expect_render_error("{% macro f(n) %}{{ " + repeated("[", 100) + "f(n + 1)" + repeated("]", 100) +
                          " }}{% endmacro %}{{ f(0) }}",
                      {"evaluation nests deeper than 512"});
}

TEST(ChatTemplateLimits, ValueDepthAndTemplateSize) {
  expect_render_error(
      "{% set ns = namespace(v=[]) %}{% for i in range(100) %}"
      "{% set ns.v = [ns.v] %}{% endfor %}",
      {"a value would nest deeper than 64"});
  expect_compile_error(std::string(2 << 20, 'x'), {"over the limit of 1048576"});
}

}  // namespace
}  // namespace specrun::chat
