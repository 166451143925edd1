// JSON Schema's `pattern`, a regular expression subset, written as a GBNF expression over the
// characters of a JSON string's body (so that a `"` or `\` the pattern matches is written as its
// JSON escape). Supported: literal characters, escapes (\d \w \s and, outside classes, \D \W \S,
// \t \n \r \f \v, \xHH, \uHHHH, escaped punctuation), classes [a-z] and negated [^...], `.`,
// groups ( ) and (?: ), alternation |, quantifiers ? * + {m} {m,} {m,n} (lazy forms too: the
// language is the same), and ^ $ at the very start and end. \d \w \s match ASCII only (a subset of
// what Python's re matches, so a generated string still matches). Unanchored ends may be followed
// or preceded by any characters, as a pattern is searched for, not matched whole.
#pragma once

#include <string>

namespace specrun::grammar {

// The GBNF expression (no rule definitions; it references `string_char`, the rule of one JSON
// string character with escapes, for the unanchored ends) for the string bodies `pattern`
// matches. Throws specrun::Error naming `where` (the JSON path of the pattern) and what is not
// supported (a backreference, a lookaround, a word boundary, an anchor elsewhere than the ends)
// or malformed, with its offset in the pattern.
std::string regex_to_gbnf(const std::string& pattern, const std::string& where,
                          const std::string& string_char);

}  // namespace specrun::grammar
