// A compiled grammar: context-free rules over bytes, the form every front end (GBNF text, JSON
// Schema) compiles to and the matcher runs. Rules are written over Unicode code points (as
// llama.cpp's GBNF is); GrammarBuilder turns each character class into the UTF-8 byte sequences
// it stands for, so that the matcher walks bytes: a token that ends inside a character is judged
// by the bytes it has, and the vocabulary's trie is walked one byte at a time.
//
// Layout, as llama.cpp's: every alternative of every rule is one run of `elements()` ending in a
// kEnd element; a position is an index into that array. The grammar is immutable once built and
// shared (std::shared_ptr<const Grammar>) by every matcher that runs it, from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace specrun::grammar {

// A set of byte values: bit b of words[b / 64].
struct ByteSet {
  std::array<uint64_t, 4> words{};  // 256 bits

  bool contains(uint8_t byte) const { return (words[byte >> 6] >> (byte & 63)) & 1; }
  void add(uint8_t byte) { words[byte >> 6] |= uint64_t{1} << (byte & 63); }
  void add_range(uint8_t first, uint8_t last);  // inclusive
  bool operator==(const ByteSet& other) const = default;
};

// An inclusive range of Unicode code points, the unit character classes are written in.
struct CodePointRange {
  uint32_t first = 0;  // inclusive
  uint32_t last = 0;   // inclusive
};

struct Element {
  enum class Kind : uint8_t {
    kBytes,  // one byte from byte_sets()[value]
    kRule,   // the rule rules()[value]
    kEnd,    // the end of an alternative of rule `value`
  };
  Kind kind = Kind::kEnd;  // what the element matches
  uint32_t value = 0;      // the byte set or rule it names (see Kind)
};

struct Rule {
  std::string name;                    // as written, or generated ("item-3") for groups
  std::vector<uint32_t> alternatives;  // the position of each alternative's first element
};

class Grammar {
 public:
  const std::vector<Element>& elements() const { return elements_; }
  const std::vector<Rule>& rules() const { return rules_; }
  const std::vector<ByteSet>& byte_sets() const { return byte_sets_; }
  uint32_t root() const { return root_; }
  // The bytes no byte set tells apart share a class (a JSON grammar has a few dozen): the
  // matcher keeps one transition per class rather than per byte. class_of()[b] < class_count().
  const std::array<uint8_t, 256>& class_of() const { return class_of_; }
  uint32_t class_count() const { return class_count_; }
  // A byte of each class, to step with.
  const std::vector<uint8_t>& class_representatives() const { return representatives_; }

  // The grammar in GBNF over bytes (classes as \xNN ranges), one rule a line: for errors and
  // debugging, not for parsing back.
  std::string to_string() const;

 private:
  friend class GrammarBuilder;
  std::vector<Element> elements_;         // every alternative, each ending in kEnd
  std::vector<Rule> rules_;               // indexed by rule id
  std::vector<ByteSet> byte_sets_;        // distinct sets, indexed by kBytes elements
  uint32_t root_ = 0;                     // the rule a sentence is
  std::array<uint8_t, 256> class_of_{};   // byte -> class
  uint32_t class_count_ = 0;              // number of classes
  std::vector<uint8_t> representatives_;  // class -> one of its bytes
};

// One symbol of an alternative being built.
struct Symbol {
  enum class Kind : uint8_t { kBytes, kRule };
  Kind kind = Kind::kBytes;  // a byte from `bytes`, or the rule `rule`
  ByteSet bytes;             // kBytes: the byte matched
  uint32_t rule = 0;         // kRule: the rule id

  static Symbol of_rule(uint32_t id) {
    Symbol symbol;
    symbol.kind = Kind::kRule;
    symbol.rule = id;
    return symbol;
  }
};

// Builds a Grammar: rules are declared by name (a reference may come before the definition),
// alternatives are sequences of symbols, and character classes over code points become rules of
// byte sequences. build() checks that every referenced rule is defined and that no rule is left
// recursive, naming the rule and where it was written.
class GrammarBuilder {
 public:
  // The id of rule `name`, declaring it on first use.
  uint32_t rule(const std::string& name);
  // A fresh rule named `base`-N for a group or repetition, defined; `where` names the text it
  // stands for in errors.
  uint32_t fresh_rule(const std::string& base, const std::string& where = "");
  // Marks `rule` defined; `where` ("line 3, column 1") names it in errors. Each alternative
  // added later belongs to it.
  void define(uint32_t rule, const std::string& where);
  bool is_defined(uint32_t rule) const;
  const std::string& name(uint32_t rule) const;
  void add_alternative(uint32_t rule, std::vector<Symbol> symbols);

  // The symbols matching one code point of `ranges` (negated: any code point outside them):
  // appended to `out`, one byte-set symbol for an ASCII-only class, else a reference to a rule of
  // its UTF-8 byte sequences (surrogates excluded, as UTF-8 has none).
  void append_class(std::vector<CodePointRange> ranges, bool negated, std::vector<Symbol>& out);
  // The bytes of a literal UTF-8 string, one symbol a byte.
  static void append_literal(const std::string& utf8, std::vector<Symbol>& out);

  // The grammar with `root_name` as its root. Throws specrun::Error naming `source` and the rule
  // for: no rule `root_name`, a rule referenced and never defined (with where it was first
  // referenced, from `references`), a left-recursive rule (also a repetition of something that
  // can be empty, which loops the same way).
  std::shared_ptr<const Grammar> build(const std::string& root_name, const std::string& source);

  // Where a reference to an undefined rule was first written, for build()'s error.
  void note_reference(uint32_t rule, const std::string& where);

 private:
  struct PendingRule {
    std::string name;                               // as declared
    bool defined = false;                           // define() was called
    std::string defined_at;                         // define()'s `where`
    std::string referenced_at;                      // first note_reference()'s `where`
    std::vector<std::vector<Symbol>> alternatives;  // each a sequence
  };
  std::vector<PendingRule> rules_;       // indexed by rule id
  std::map<std::string, uint32_t> ids_;  // name -> id
  // A class's rule, keyed by its normalized ranges (first, last, first, last...), so that a
  // class written many times (a JSON string's character) is one rule.
  std::map<std::vector<uint32_t>, uint32_t> class_rules_;
  uint32_t fresh_counter_ = 0;  // suffix of the next fresh rule
};

}  // namespace specrun::grammar
