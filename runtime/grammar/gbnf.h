// GBNF, llama.cpp's grammar format, parsed into a Grammar:
//
//   root   ::= object                      # a rule: name ::= alternatives
//   object ::= "{" ws (pair ("," ws pair)*)? "}"
//   pair   ::= string ":" ws [0-9]+ ("." [0-9]{1,3})?
//   string ::= "\"" [^"\\\x00-\x1f]* "\""
//   ws     ::= [ \t\n]{0,20}
//
// Terminals are Unicode code points: string literals ("...": escapes \n \r \t \\ \" \[ \] and
// \xHH, \uHHHH, \UHHHHHHHH), character classes ([a-z0-9_], negated [^"\\], the same escapes), `.`
// (any code point). Sequences, alternation `|`, grouping `( )`, repetition `*` `+` `?` `{m}` `{m,}`
// `{m,n}` (applied to the item before it: a rule name, literal, class or group), comments from `#`
// to the end of the line. Rule names are letters, digits, `-` and `_`; a rule may be referenced
// before it is defined and its body may span lines (a rule ends where the next `name ::=` begins).
// The grammar's sentences are those of rule `root`.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/grammar/grammar.h"

namespace specrun::grammar {

// Repetition bounds above this are refused (each repetition is a rule: {0,100000} would be a
// grammar of 100000 rules).
inline constexpr int kMaxRepetition = 10000;

// Parses `text`; `source` names it in errors ("grammar", a file's path). Throws specrun::Error
// naming the source, line and column and what was expected there, for: a syntax error, empty
// input, a rule defined twice, a reference to a rule never defined, no `root_rule`, a
// left-recursive rule, a repetition bound above kMaxRepetition or with m > n.
std::shared_ptr<const Grammar> parse_gbnf(std::string_view text,
                                          const std::string& source = "grammar",
                                          const std::string& root_rule = "root");

// Writing GBNF (the JSON Schema compiler does): `utf8` as a string literal, with escapes for `"`,
// `\` and control characters.
std::string gbnf_literal(std::string_view utf8);
// Code point ranges as a character class ([a-z], negated [^...]), escaping what must be.
std::string gbnf_class(const std::vector<CodePointRange>& ranges, bool negated = false);

}  // namespace specrun::grammar
