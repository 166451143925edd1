// Constrained generation: a Matcher follows the text generated so far through a grammar and says,
// for the next position, which tokens of the vocabulary keep the text a prefix of a sentence.
//
//   auto grammar = grammar::parse_gbnf(text);            // or json_schema_grammar(schema)
//   auto vocabulary = grammar::TokenVocabulary::from_tokenizer(tokenizer, eos_ids);  // once
//   grammar::Matcher matcher(grammar, vocabulary);
//   std::vector<uint32_t> mask(vocabulary->mask_words());
//   matcher.fill_mask(mask);                // bit i of mask[i / 32]: token i allowed
//   ... sample a token whose bit is set ...
//   matcher.accept_token(token);            // false, and nothing changes, for a banned token
//
// Speculation: check a draft by accepting its tokens one at a time (the first refused token ends
// the drafts the grammar allows), computing the mask before each; then rollback() to the accepted
// prefix. Or copy the matcher: a copy is the grammar state (an int per accepted token), two
// shared_ptrs and no parse stacks.
//
// The state is a node of a lazily built automaton over the grammar's parse stacks (automaton.h),
// which the matcher and its copies share through a mutex-guarded cache, with the masks of states
// already seen. So a Matcher and each of its copies may be used from different threads at once; a
// single Matcher object is not for concurrent use (as a std::vector is not).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "runtime/grammar/grammar.h"
#include "runtime/grammar/vocabulary.h"

namespace specrun::grammar {

class Matcher {
 public:
  // `cache_masks`: keep the mask of each state seen and hand it back when the state recurs (a
  // JSON string's body, whitespace); off only to measure the walk itself.
  Matcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocabulary,
          bool cache_masks = true);

  // Accepts token `id` when the mask allows it: its bytes keep the text a prefix of a sentence,
  // or it is an end-of-sequence id and the text is a sentence (then the matcher is terminated and
  // accepts nothing more). Returns false and changes nothing otherwise (a special token, an id
  // out of range, any token once terminated).
  bool accept_token(int32_t id);
  // Accepts text that did not come from a token (a forced prefix) as one step for rollback();
  // all or nothing, as accept_token.
  bool accept_bytes(std::string_view bytes);

  // Writes the mask of the next position into `bits`, which must hold at least
  // vocabulary->mask_words() words (words past them, for a model whose logits are padded, are
  // zeroed): bit i % 32 of bits[i / 32] set when token i is allowed. End-of-sequence ids are
  // allowed exactly when can_end(); when the grammar can only end, they are the only ones.
  // Nothing once terminated. Returns the number of tokens allowed (0 only where the vocabulary
  // cannot spell any continuation, or once terminated). Thread-safe across copies (see above).
  size_t fill_mask(std::span<uint32_t> bits) const;

  // The text so far is a sentence of the grammar: an end-of-sequence token is allowed.
  bool can_end() const;
  // The text is a sentence and no byte can extend it (the engine may stop without sampling), or
  // the matcher has accepted an end-of-sequence token.
  bool is_complete() const;
  // An end-of-sequence token has been accepted.
  bool is_terminated() const { return states_.back() == kTerminated; }

  // Undoes the last `tokens` accepted steps (accept_token or accept_bytes calls that returned
  // true), an end-of-sequence token included. Throws specrun::Error for more than were accepted.
  void rollback(size_t tokens);
  // Accepted steps since construction or reset(): how far rollback() can go.
  size_t accepted_steps() const { return states_.size() - 1; }
  // Back to the empty text.
  void reset() { states_.resize(1); }

  const Grammar& grammar() const;
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }

 private:
  static constexpr int32_t kTerminated = -3;  // a state after an end-of-sequence token
  struct Shared;

  // The state after `bytes` from `state` (Automaton::kDead when refused).
  int32_t walk(int32_t state, std::string_view bytes) const;

  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::shared_ptr<Shared> shared_;  // the automaton and the mask cache, shared by copies
  std::vector<int32_t> states_;     // the automaton state before each step and after the last
};

}  // namespace specrun::grammar
