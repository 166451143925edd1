// The grammar's pushdown automaton, made deterministic lazily: a state is a set of parse stacks
// (llama.cpp's representation: each stack a list of grammar positions, the top one a byte set
// still to match), interned so that the same set is the same state, and each (state, byte class)
// transition is computed once and then looked up. Walking the vocabulary's trie is then one table
// lookup per trie node; a JSON string's body, whose stacks come back to the same set after every
// character, costs a handful of transitions however long it gets.
//
// Stacks are persistent linked lists hash-consed into nodes (position, parent), so two stacks
// with a common tail share it, equal stacks have equal ids, and a state is a sorted list of ids.
// A repetition is right-recursive (x-star ::= x x-star | ...) and a call whose return position
// ends its alternative pushes nothing (a tail call), so `x*` does not deepen the stack.
//
// Not thread-safe: Matcher guards its Automaton with a mutex. Memory grows with the states
// visited (each state's stack ids and one int32 per byte class); kMaxStates bounds it.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "runtime/grammar/grammar.h"

namespace specrun::grammar {

class Automaton {
 public:
  static constexpr int32_t kDead = -1;  // no stack accepts the byte
  // A grammar whose matching visits more states than this is refused (specrun::Error from
  // next()): an ambiguous grammar can make exponentially many stack sets.
  static constexpr size_t kMaxStates = size_t{1} << 21;

  explicit Automaton(std::shared_ptr<const Grammar> grammar);

  int32_t initial() const { return 0; }
  // The state after `byte` from `state` (not kDead).
  int32_t next(int32_t state, uint8_t byte) {
    const size_t slot = static_cast<size_t>(state) * class_count_ + class_of_[byte];
    const int32_t known = transitions_[slot];
    if (known != kUnknown) return known;
    const int32_t computed = compute(state, byte);
    transitions_[slot] = computed;
    return computed;
  }
  // The text so far is a sentence (some stack is empty).
  bool accepting(int32_t state) const { return states_[static_cast<size_t>(state)].accepting; }
  // Some stack still expects a byte: the text can go on.
  bool continues(int32_t state) const { return states_[static_cast<size_t>(state)].continues; }

  size_t state_count() const { return states_.size(); }
  // Bytes held by the states, transitions and stacks (for the cache's accounting).
  size_t memory_bytes() const;
  const Grammar& grammar() const { return *grammar_; }

 private:
  static constexpr int32_t kUnknown = -2;  // a transition not computed yet
  static constexpr uint32_t kEmptyStack = 0;

  struct StackNode {
    uint32_t position = 0;  // the element to match next (never a kEnd, but for alternatives
                            // that are empty, which are popped before a node is made)
    uint32_t parent = 0;    // the stack below: where to go when this rule's alternative ends
  };
  struct State {
    uint32_t stacks_begin = 0;  // its stacks: stack_pool_[stacks_begin, stacks_end)
    uint32_t stacks_end = 0;
    bool accepting = false;  // holds the empty stack
    bool continues = false;  // holds a non-empty stack
  };
  struct VectorHash {
    size_t operator()(const std::vector<uint32_t>& ids) const;
  };

  int32_t compute(int32_t state, uint8_t byte);
  // The stacks with a byte set on top (or empty) that continuing at `position` over `parent`
  // leads to, appended to `out`.
  void expand(uint32_t position, uint32_t parent, std::vector<uint32_t>& out);
  uint32_t intern_node(uint32_t position, uint32_t parent);
  int32_t intern_state(std::vector<uint32_t>& stacks);  // sorts and dedups `stacks`

  std::shared_ptr<const Grammar> grammar_;
  const Element* elements_;                          // grammar_->elements().data()
  std::array<uint8_t, 256> class_of_{};              // grammar_->class_of()
  uint32_t class_count_ = 0;                         // grammar_->class_count()
  std::vector<StackNode> nodes_;                     // interned stacks; [0] is the empty stack
  std::unordered_map<uint64_t, uint32_t> node_ids_;  // (position << 32 | parent) -> node
  std::vector<State> states_;
  std::vector<uint32_t> stack_pool_;  // every state's sorted stack ids
  std::unordered_map<std::vector<uint32_t>, int32_t, VectorHash> state_ids_;
  std::vector<int32_t> transitions_;  // [state][class]: next state, kDead or kUnknown
  std::vector<uint32_t> scratch_;     // compute()'s stacks
};

}  // namespace specrun::grammar
