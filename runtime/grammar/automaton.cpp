#include "runtime/grammar/automaton.h"

#include <algorithm>

#include "runtime/base/check.h"

namespace specrun::grammar {

size_t Automaton::VectorHash::operator()(const std::vector<uint32_t>& ids) const {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (const uint32_t id : ids) hash = (hash ^ id) * 0x100000001b3ull;
  return static_cast<size_t>(hash);
}

Automaton::Automaton(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)),
      elements_(grammar_->elements().data()),
      class_of_(grammar_->class_of()),
      class_count_(grammar_->class_count()) {
  nodes_.push_back({});  // the empty stack
  std::vector<uint32_t> stacks;
  for (const uint32_t start : grammar_->rules()[grammar_->root()].alternatives) {
    expand(start, kEmptyStack, stacks);
  }
  if (intern_state(stacks) == kDead) {
    // No sentence at all (the root needs a character no class holds): a state with no stack.
    states_.push_back({});
    transitions_.resize(class_count_, kUnknown);
  }
}

size_t Automaton::memory_bytes() const {
  return nodes_.size() * (sizeof(StackNode) + 2 * sizeof(uint64_t)) +
         states_.size() * (sizeof(State) + 4 * sizeof(uint64_t)) +
         stack_pool_.size() * 2 * sizeof(uint32_t) + transitions_.size() * sizeof(int32_t);
}

uint32_t Automaton::intern_node(uint32_t position, uint32_t parent) {
  const uint64_t key = (uint64_t{position} << 32) | parent;
  const auto [it, inserted] = node_ids_.try_emplace(key, static_cast<uint32_t>(nodes_.size()));
  if (inserted) nodes_.push_back({position, parent});
  return it->second;
}

void Automaton::expand(uint32_t position, uint32_t parent, std::vector<uint32_t>& out) {
  const Element& element = elements_[position];
  switch (element.kind) {
    case Element::Kind::kEnd:
      // The alternative is done: return to the rule below.
      if (parent == kEmptyStack) {
        out.push_back(kEmptyStack);
      } else {
        const StackNode below = nodes_[parent];
        expand(below.position, below.parent, out);
      }
      return;
    case Element::Kind::kBytes:
      out.push_back(intern_node(position, parent));
      return;
    case Element::Kind::kRule: {
      // A call. Its return position goes on the stack unless it ends its alternative (a tail
      // call: returning there would only return again).
      const uint32_t resume = elements_[position + 1].kind == Element::Kind::kEnd
                                  ? parent
                                  : intern_node(position + 1, parent);
      for (const uint32_t start : grammar_->rules()[element.value].alternatives) {
        expand(start, resume, out);
      }
      return;
    }
  }
}

int32_t Automaton::intern_state(std::vector<uint32_t>& stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.empty()) return kDead;
  const auto found = state_ids_.find(stacks);
  if (found != state_ids_.end()) return found->second;
  if (states_.size() >= kMaxStates) {
    throw Error("grammar: matching needs more than " + std::to_string(kMaxStates) +
                " parse states (the grammar is too ambiguous)");
  }
  const auto id = static_cast<int32_t>(states_.size());
  State state;
  state.stacks_begin = static_cast<uint32_t>(stack_pool_.size());
  stack_pool_.insert(stack_pool_.end(), stacks.begin(), stacks.end());
  state.stacks_end = static_cast<uint32_t>(stack_pool_.size());
  state.accepting = stacks.front() == kEmptyStack;
  state.continues = stacks.back() != kEmptyStack;
  states_.push_back(state);
  transitions_.resize(transitions_.size() + class_count_, kUnknown);
  state_ids_.emplace(stacks, id);
  return id;
}

int32_t Automaton::compute(int32_t state, uint8_t byte) {
  SPECRUN_DCHECK(state >= 0 && static_cast<size_t>(state) < states_.size());
  const State& from = states_[static_cast<size_t>(state)];
  const std::vector<ByteSet>& sets = grammar_->byte_sets();
  scratch_.clear();
  for (uint32_t k = from.stacks_begin; k < from.stacks_end; ++k) {
    const uint32_t stack = stack_pool_[k];
    if (stack == kEmptyStack) continue;
    const StackNode node = nodes_[stack];
    if (!sets[elements_[node.position].value].contains(byte)) continue;
    expand(node.position + 1, node.parent, scratch_);
  }
  // intern_state may grow states_; `from` is not used after this.
  std::vector<uint32_t> stacks = std::move(scratch_);
  const int32_t next = intern_state(stacks);
  scratch_ = std::move(stacks);
  return next;
}

}  // namespace specrun::grammar
