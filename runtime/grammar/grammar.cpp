#include "runtime/grammar/grammar.h"

#include <algorithm>
#include <cstdio>
#include <functional>

#include "runtime/base/check.h"
#include "runtime/text/unicode.h"

namespace specrun::grammar {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kSurrogateFirst = 0xD800;
constexpr uint32_t kSurrogateLast = 0xDFFF;

// Sorted, merged, surrogate-free ranges; negated: the complement within [0, kMaxCodePoint].
std::vector<CodePointRange> normalize(std::vector<CodePointRange> ranges, bool negated) {
  std::sort(ranges.begin(), ranges.end(),
            [](const CodePointRange& a, const CodePointRange& b) { return a.first < b.first; });
  std::vector<CodePointRange> merged;
  for (const CodePointRange& range : ranges) {
    if (range.first > range.last) continue;
    if (!merged.empty() && range.first <= merged.back().last + 1) {
      merged.back().last = std::max(merged.back().last, range.last);
    } else {
      merged.push_back(range);
    }
  }
  if (negated) {
    std::vector<CodePointRange> complement;
    uint32_t next = 0;
    for (const CodePointRange& range : merged) {
      if (range.first > next) complement.push_back({next, range.first - 1});
      next = range.last + 1;
    }
    if (next <= kMaxCodePoint) complement.push_back({next, kMaxCodePoint});
    merged = std::move(complement);
  }
  std::vector<CodePointRange> out;
  for (const CodePointRange& range : merged) {
    const uint32_t last = std::min(range.last, kMaxCodePoint);
    if (range.first > last) continue;
    if (range.first < kSurrogateFirst && last >= kSurrogateFirst) {
      out.push_back({range.first, kSurrogateFirst - 1});
      if (last > kSurrogateLast) out.push_back({kSurrogateLast + 1, last});
    } else if (range.first >= kSurrogateFirst && range.first <= kSurrogateLast) {
      if (last > kSurrogateLast) out.push_back({kSurrogateLast + 1, last});
    } else {
      out.push_back({range.first, last});
    }
  }
  return out;
}

// The UTF-8 encodings of [first, last] (no surrogates inside) as sequences of byte ranges, each
// byte position one range: the split of Rust regex-syntax's utf8 module. A range is cut where
// the encoded length changes, then wherever its ends differ above a continuation byte's 6 bits
// without covering them whole.
void utf8_sequences(uint32_t first, uint32_t last,
                    std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  static constexpr uint32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF};
  for (const uint32_t end : kLengthEnds) {
    if (first <= end && last > end) {
      utf8_sequences(first, end, out);
      utf8_sequences(end + 1, last, out);
      return;
    }
  }
  if (last < 0x80) {
    out.push_back({{static_cast<uint8_t>(first), static_cast<uint8_t>(last)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t mask = (uint32_t{1} << (6 * i)) - 1;
    if ((first & ~mask) != (last & ~mask)) {
      if ((first & mask) != 0) {
        utf8_sequences(first, first | mask, out);
        utf8_sequences((first | mask) + 1, last, out);
        return;
      }
      if ((last & mask) != mask) {
        utf8_sequences(first, (last & ~mask) - 1, out);
        utf8_sequences(last & ~mask, last, out);
        return;
      }
    }
  }
  std::string low, high;  // the same length: the range does not cross one
  text::append_utf8(low, first);
  text::append_utf8(high, last);
  std::vector<std::pair<uint8_t, uint8_t>> sequence;
  for (size_t k = 0; k < low.size(); ++k) {
    sequence.emplace_back(static_cast<uint8_t>(low[k]), static_cast<uint8_t>(high[k]));
  }
  out.push_back(std::move(sequence));
}

std::string byte_text(uint8_t byte) {
  if (byte >= 0x21 && byte < 0x7F && byte != '\\' && byte != ']' && byte != '-' && byte != '^') {
    return std::string(1, static_cast<char>(byte));
  }
  char buffer[8];
  std::snprintf(buffer, sizeof(buffer), "\\x%02X", byte);
  return buffer;
}

}  // namespace

void ByteSet::add_range(uint8_t first, uint8_t last) {
  for (uint32_t byte = first; byte <= last; ++byte) add(static_cast<uint8_t>(byte));
}

std::string Grammar::to_string() const {
  std::string out;
  for (const Rule& rule : rules_) {
    out += rule.name + " ::=";
    for (size_t a = 0; a < rule.alternatives.size(); ++a) {
      if (a > 0) out += " |";
      for (uint32_t position = rule.alternatives[a];
           elements_[position].kind != Element::Kind::kEnd; ++position) {
        const Element& element = elements_[position];
        if (element.kind == Element::Kind::kRule) {
          out += " " + rules_[element.value].name;
          continue;
        }
        const ByteSet& set = byte_sets_[element.value];
        out += " [";
        for (uint32_t byte = 0; byte < 256; ++byte) {
          if (!set.contains(static_cast<uint8_t>(byte))) continue;
          uint32_t end = byte;
          while (end + 1 < 256 && set.contains(static_cast<uint8_t>(end + 1))) ++end;
          out += byte_text(static_cast<uint8_t>(byte));
          if (end > byte) out += "-" + byte_text(static_cast<uint8_t>(end));
          byte = end;
        }
        out += "]";
      }
    }
    out += "\n";
  }
  return out;
}

uint32_t GrammarBuilder::rule(const std::string& name) {
  const auto found = ids_.find(name);
  if (found != ids_.end()) return found->second;
  const auto id = static_cast<uint32_t>(rules_.size());
  PendingRule pending;
  pending.name = name;
  rules_.push_back(std::move(pending));
  ids_.emplace(name, id);
  return id;
}

uint32_t GrammarBuilder::fresh_rule(const std::string& base, const std::string& where) {
  while (true) {
    const std::string name = base + "-" + std::to_string(++fresh_counter_);
    if (ids_.count(name) == 0) {
      const uint32_t id = rule(name);
      define(id, where);
      return id;
    }
  }
}

void GrammarBuilder::define(uint32_t rule, const std::string& where) {
  SPECRUN_CHECK(rule < rules_.size());
  rules_[rule].defined = true;
  rules_[rule].defined_at = where;
}

bool GrammarBuilder::is_defined(uint32_t rule) const {
  return rules_.at(rule).defined;
}

const std::string& GrammarBuilder::name(uint32_t rule) const {
  return rules_.at(rule).name;
}

void GrammarBuilder::note_reference(uint32_t rule, const std::string& where) {
  if (rules_.at(rule).referenced_at.empty()) rules_[rule].referenced_at = where;
}

void GrammarBuilder::add_alternative(uint32_t rule, std::vector<Symbol> symbols) {
  SPECRUN_CHECK(rule < rules_.size() && rules_[rule].defined);
  rules_[rule].alternatives.push_back(std::move(symbols));
}

void GrammarBuilder::append_literal(const std::string& utf8, std::vector<Symbol>& out) {
  for (const char c : utf8) {
    Symbol symbol;
    symbol.bytes.add(static_cast<uint8_t>(c));
    out.push_back(symbol);
  }
}

void GrammarBuilder::append_class(std::vector<CodePointRange> ranges, bool negated,
                                  std::vector<Symbol>& out) {
  const std::vector<CodePointRange> normalized = normalize(std::move(ranges), negated);
  if (!normalized.empty() && normalized.back().last < 0x80) {
    Symbol symbol;
    for (const CodePointRange& range : normalized) {
      symbol.bytes.add_range(static_cast<uint8_t>(range.first), static_cast<uint8_t>(range.last));
    }
    out.push_back(symbol);
    return;
  }
  std::vector<uint32_t> key;
  for (const CodePointRange& range : normalized) {
    key.push_back(range.first);
    key.push_back(range.last);
  }
  Symbol reference = Symbol::of_rule(0);
  if (const auto found = class_rules_.find(key); found != class_rules_.end()) {
    reference.rule = found->second;
    out.push_back(reference);
    return;
  }
  reference.rule = fresh_rule("char");
  class_rules_.emplace(key, reference.rule);
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> sequences;
  for (const CodePointRange& range : normalized) utf8_sequences(range.first, range.last, sequences);
  // One-byte sequences share one alternative; an empty class keeps no alternative, matching
  // nothing.
  Symbol ascii;
  bool any_ascii = false;
  for (const auto& sequence : sequences) {
    if (sequence.size() == 1) {
      ascii.bytes.add_range(sequence[0].first, sequence[0].second);
      any_ascii = true;
      continue;
    }
    std::vector<Symbol> symbols;
    for (const auto& [low, high] : sequence) {
      Symbol symbol;
      symbol.bytes.add_range(low, high);
      symbols.push_back(symbol);
    }
    add_alternative(reference.rule, std::move(symbols));
  }
  if (any_ascii) add_alternative(reference.rule, {ascii});
  out.push_back(reference);
}

std::shared_ptr<const Grammar> GrammarBuilder::build(const std::string& root_name,
                                                     const std::string& source) {
  const auto root = ids_.find(root_name);
  if (root == ids_.end() || !rules_[root->second].defined) {
    throw Error(source + ": no rule '" + root_name + "' (the grammar's start)");
  }
  for (const PendingRule& rule : rules_) {
    if (!rule.defined) {
      throw Error(source + ": " + (rule.referenced_at.empty() ? "" : rule.referenced_at + ": ") +
                  "rule '" + rule.name + "' is referenced but never defined");
    }
  }

  // Left recursion: the rules each rule can begin with, through symbols that can be empty.
  const size_t count = rules_.size();
  std::vector<bool> nullable(count, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < count; ++r) {
      if (nullable[r]) continue;
      for (const auto& alternative : rules_[r].alternatives) {
        const bool empty = std::all_of(
            alternative.begin(), alternative.end(),
            [&](const Symbol& s) { return s.kind == Symbol::Kind::kRule && nullable[s.rule]; });
        if (empty) {
          nullable[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  std::vector<uint8_t> color(count, 0);  // 0 unvisited, 1 on the path, 2 done
  std::vector<uint32_t> path;
  std::function<void(uint32_t)> visit = [&](uint32_t r) {
    color[r] = 1;
    path.push_back(r);
    for (const auto& alternative : rules_[r].alternatives) {
      for (const Symbol& symbol : alternative) {
        if (symbol.kind != Symbol::Kind::kRule) break;
        if (color[symbol.rule] == 1) {
          // Name the cycle from the first rule the user wrote, as written.
          std::string cycle;
          const auto start = std::find(path.begin(), path.end(), symbol.rule);
          for (auto it = start; it != path.end(); ++it) cycle += rules_[*it].name + " -> ";
          cycle += rules_[symbol.rule].name;
          const PendingRule& named = rules_[*start];
          throw Error(source + ": " + (named.defined_at.empty() ? "" : named.defined_at + ": ") +
                      "rule '" + named.name + "' is left-recursive (" + cycle +
                      " without consuming input; a repetition of something that can be empty "
                      "loops the same way), which is not supported");
        }
        if (color[symbol.rule] == 0) visit(symbol.rule);
        if (!nullable[symbol.rule]) break;
      }
    }
    path.pop_back();
    color[r] = 2;
  };
  for (uint32_t r = 0; r < count; ++r) {
    if (color[r] == 0) visit(r);
  }

  auto grammar = std::make_shared<Grammar>();
  grammar->root_ = root->second;
  grammar->rules_.resize(count);
  for (uint32_t r = 0; r < count; ++r) {
    Rule& rule = grammar->rules_[r];
    rule.name = rules_[r].name;
    for (const auto& alternative : rules_[r].alternatives) {
      rule.alternatives.push_back(static_cast<uint32_t>(grammar->elements_.size()));
      for (const Symbol& symbol : alternative) {
        if (symbol.kind == Symbol::Kind::kRule) {
          grammar->elements_.push_back({Element::Kind::kRule, symbol.rule});
          continue;
        }
        auto& sets = grammar->byte_sets_;
        auto found = std::find(sets.begin(), sets.end(), symbol.bytes);
        if (found == sets.end()) found = sets.insert(sets.end(), symbol.bytes);
        grammar->elements_.push_back(
            {Element::Kind::kBytes, static_cast<uint32_t>(found - sets.begin())});
      }
      grammar->elements_.push_back({Element::Kind::kEnd, r});
    }
  }

  // Byte classes: bytes with the same membership in every set.
  std::vector<std::vector<bool>> signature(256);
  for (uint32_t byte = 0; byte < 256; ++byte) {
    for (const ByteSet& set : grammar->byte_sets_) {
      signature[byte].push_back(set.contains(static_cast<uint8_t>(byte)));
    }
  }
  std::vector<uint32_t> first_of_class;
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t c = 0;
    while (c < first_of_class.size() && signature[first_of_class[c]] != signature[byte]) ++c;
    if (c == first_of_class.size()) first_of_class.push_back(byte);
    grammar->class_of_[byte] = static_cast<uint8_t>(c);
  }
  grammar->class_count_ = static_cast<uint32_t>(first_of_class.size());
  for (const uint32_t byte : first_of_class) {
    grammar->representatives_.push_back(static_cast<uint8_t>(byte));
  }
  return grammar;
}

}  // namespace specrun::grammar
