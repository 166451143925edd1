#include "runtime/text/bpe.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <queue>

#include <nlohmann/json.hpp>

#include "runtime/base/check.h"
#include "runtime/base/json.h"
#include "runtime/text/unicode.h"

namespace specrun::text {
namespace {

using nlohmann::json;

constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();
// Words at most this long are merged with the quadratic scan, which beats a heap on short input.
constexpr size_t kSmallWord = 48;
// The reference caches words shorter than 256 bytes, up to 10,000 of them; a larger bound costs
// nothing in exactness and helps on long inputs.
constexpr size_t kCacheMaxWordBytes = 256;
constexpr size_t kCacheCapacity = 1 << 17;

uint64_t mix(uint64_t x) {
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return x;
}

uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t word = 0;
    std::memcpy(&word, s.data() + i, 8);
    h = mix(h ^ word) * 0x9E3779B97F4A7C15ull;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  return mix(h ^ tail);
}

uint64_t pack(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw Error(source + ": model (BPE): " + what);
}

std::string optional_string(const json& model, const char* key, const std::string& source) {
  const auto it = model.find(key);
  if (it == model.end() || it->is_null()) return "";
  if (!it->is_string()) fail(source, std::string("'") + key + "' must be a string or null");
  return it->get<std::string>();
}

bool optional_bool(const json& model, const char* key, const std::string& source) {
  const auto it = model.find(key);
  if (it == model.end() || it->is_null()) return false;
  if (!it->is_boolean()) fail(source, std::string("'") + key + "' must be true or false");
  return it->get<bool>();
}

}  // namespace

// ---- StringIdMap -----------------------------------------------------------------------------

void StringIdMap::reserve(size_t count) {
  size_t capacity = 16;
  while (capacity < count * 2) capacity *= 2;
  if (capacity <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{});
  const size_t mask = capacity - 1;
  for (const Slot& slot : old) {
    if (slot.id < 0) continue;
    size_t index = slot.hash & mask;
    while (slots_[index].id >= 0) index = (index + 1) & mask;
    slots_[index] = slot;
  }
}

void StringIdMap::grow() {
  reserve(std::max<size_t>(16, (size_ + 1) * 2));
}

bool StringIdMap::insert(std::string_view key, int32_t id) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const uint64_t hash = hash_bytes(key);
  const size_t mask = slots_.size() - 1;
  size_t index = hash & mask;
  while (slots_[index].id >= 0) {
    const Slot& slot = slots_[index];
    if (slot.hash == hash && std::string_view(arena_).substr(slot.offset, slot.length) == key) {
      return false;
    }
    index = (index + 1) & mask;
  }
  SPECRUN_CHECK(arena_.size() + key.size() < std::numeric_limits<uint32_t>::max());
  slots_[index] =
      Slot{hash, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size()), id};
  arena_.append(key);
  ++size_;
  return true;
}

std::optional<int32_t> StringIdMap::find(std::string_view key) const {
  if (slots_.empty()) return std::nullopt;
  const uint64_t hash = hash_bytes(key);
  const size_t mask = slots_.size() - 1;
  size_t index = hash & mask;
  while (slots_[index].id >= 0) {
    const Slot& slot = slots_[index];
    if (slot.hash == hash && slot.length == key.size() &&
        std::memcmp(arena_.data() + slot.offset, key.data(), key.size()) == 0) {
      return slot.id;
    }
    index = (index + 1) & mask;
  }
  return std::nullopt;
}

// ---- PairMap ---------------------------------------------------------------------------------

void Bpe::PairMap::build(const std::vector<std::pair<uint64_t, Merge>>& entries) {
  size_t capacity = 16;
  while (capacity < entries.size() * 2) capacity *= 2;
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  for (const auto& [key, merge] : entries) {
    size_t index = mix(key) & mask_;
    while (slots_[index].key != ~uint64_t{0} && slots_[index].key != key) {
      index = (index + 1) & mask_;
    }
    // A pair listed twice keeps its last rank, as the reference's map does.
    slots_[index].key = key;
    slots_[index].merge = merge;
  }
}

const Bpe::Merge* Bpe::PairMap::find(int32_t left, int32_t right) const {
  const uint64_t key = pack(left, right);
  size_t index = mix(key) & mask_;
  while (true) {
    const Slot& slot = slots_[index];
    if (slot.key == key) return &slot.merge;
    if (slot.key == ~uint64_t{0}) return nullptr;
    index = (index + 1) & mask_;
  }
}

// ---- Bpe -------------------------------------------------------------------------------------

std::unique_ptr<Bpe> Bpe::from_json(const json& model, const std::string& source) {
  auto bpe = std::unique_ptr<Bpe>(new Bpe);
  if (const auto dropout = model.find("dropout"); dropout != model.end() && !dropout->is_null()) {
    if (!dropout->is_number() || dropout->get<double>() != 0.0) {
      fail(source, "'dropout' is set; BPE dropout (random merges) is for training, not inference");
    }
  }
  const std::string unk_token = optional_string(model, "unk_token", source);
  bpe->continuing_subword_prefix_ = optional_string(model, "continuing_subword_prefix", source);
  bpe->end_of_word_suffix_ = optional_string(model, "end_of_word_suffix", source);
  bpe->fuse_unk_ = optional_bool(model, "fuse_unk", source);
  bpe->byte_fallback_ = optional_bool(model, "byte_fallback", source);
  bpe->ignore_merges_ = optional_bool(model, "ignore_merges", source);

  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) {
    fail(source, "'vocab' is missing or not an object of token -> id");
  }
  bpe->vocab_.reserve(vocab->size());
  // The tables below are indexed by id, so they cost memory in proportion to the largest id, not
  // to the entries. Ids may leave gaps (a vocabulary padded or pruned), but a hostile file could
  // name id 2^31 with one entry; the bound ties the tables to the file's real content: every
  // entry takes at least six bytes of JSON and a table slot about forty, so 16 slots per entry,
  // plus a fixed allowance of 2^20 slots (about 40 MB) for small files with sparse ids.
  const int64_t id_bound = 16 * static_cast<int64_t>(vocab->size()) + (int64_t{1} << 20);
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= std::numeric_limits<int32_t>::max()) {
      fail(source, "vocab entry '" + token + "' has no valid id");
    }
    if (id.get<int64_t>() >= id_bound) {
      fail(source, "vocab entry '" + excerpt(token) + "' has id " +
                       std::to_string(id.get<int64_t>()) + ", far beyond the " +
                       std::to_string(vocab->size()) + " entries (ids must stay below " +
                       std::to_string(id_bound) + ")");
    }
    if (!is_valid_utf8(token)) fail(source, "vocab entry is not valid UTF-8");
    max_id = std::max<int64_t>(max_id, id.get<int64_t>());
  }
  bpe->id_to_token_.resize(static_cast<size_t>(max_id + 1));
  bpe->has_id_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id_json] : vocab->items()) {
    const auto id = static_cast<int32_t>(id_json.get<int64_t>());
    bpe->vocab_.insert(token, id);
    if (!bpe->has_id_[static_cast<size_t>(id)]) {
      bpe->has_id_[static_cast<size_t>(id)] = true;
      bpe->id_to_token_[static_cast<size_t>(id)] = token;
    }
  }
  if (!unk_token.empty()) {
    // Like the reference, a missing unknown token is an error only once a character needs it.
    bpe->unk_id_ = bpe->vocab_.find(unk_token);
    if (!bpe->unk_id_) bpe->missing_unk_token_ = source + ": unk_token '" + unk_token + "'";
  }
  for (int c = 0; c < 128; ++c) {
    bpe->ascii_ids_[c] = bpe->vocab_.find(std::string(1, static_cast<char>(c))).value_or(-1);
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    bpe->byte_fallback_ids_[b] = bpe->vocab_.find(name).value_or(-1);
  }

  const auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) {
    fail(source, "'merges' is missing or not a list");
  }
  std::vector<std::pair<uint64_t, Merge>> entries;
  entries.reserve(merges->size());
  const size_t prefix_length = bpe->continuing_subword_prefix_.size();
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const json& merge = (*merges)[rank];
    std::string left;
    std::string right;
    const std::string where = "merges[" + std::to_string(rank) + "]";
    if (merge.is_string()) {
      const std::string& text = merge.get_ref<const std::string&>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        fail(source, where + " '" + text + "' is not two tokens separated by one space");
      }
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      fail(source, where + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const auto left_id = bpe->vocab_.find(left);
    const auto right_id = bpe->vocab_.find(right);
    if (!left_id)
      fail(source, where + " names token '" + left + "', which is not in the vocabulary");
    if (!right_id) {
      fail(source, where + " names token '" + right + "', which is not in the vocabulary");
    }
    const std::string merged =
        left + (right.size() >= prefix_length ? right.substr(prefix_length) : std::string());
    const auto new_id = bpe->vocab_.find(merged);
    if (!new_id) {
      fail(source, where + " makes '" + merged + "', which is not in the vocabulary");
    }
    entries.emplace_back(pack(*left_id, *right_id), Merge{static_cast<uint32_t>(rank), *new_id});
  }
  bpe->merges_.build(entries);
  return bpe;
}

const std::string* Bpe::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() ||
      !has_id_[static_cast<size_t>(id)]) {
    return nullptr;
  }
  return &id_to_token_[static_cast<size_t>(id)];
}

void Bpe::initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const {
  const bool affixes = !continuing_subword_prefix_.empty() || !end_of_word_suffix_.empty();
  // A pending run of unknown characters: the reference emits it before the next known one.
  bool pending_unk = false;
  std::string piece;
  size_t i = 0;
  while (i < word.size()) {
    const size_t start = i;
    const auto lead = static_cast<unsigned char>(word[i]);
    i += std::min(utf8_length(lead), word.size() - i);
    std::string_view s = word.substr(start, i - start);
    std::optional<int32_t> id;
    if (affixes) {
      piece.clear();
      if (start > 0) piece += continuing_subword_prefix_;
      piece += s;
      if (i == word.size()) piece += end_of_word_suffix_;
      s = piece;
      id = vocab_.find(s);
    } else if (lead < 0x80) {
      if (ascii_ids_[lead] >= 0) id = ascii_ids_[lead];
    } else {
      id = vocab_.find(s);
    }
    if (id) {
      if (pending_unk) {
        symbols.push_back(*unk_id_);
        pending_unk = false;
      }
      symbols.push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (const char byte : s) all = all && byte_fallback_ids_[static_cast<uint8_t>(byte)] >= 0;
      if (all) {
        // Like the reference, a byte-fallback run does not flush a pending unknown token.
        for (const char byte : s) symbols.push_back(byte_fallback_ids_[static_cast<uint8_t>(byte)]);
        continue;
      }
    }
    if (!missing_unk_token_.empty()) {
      throw Error(missing_unk_token_ +
                  " is needed for a character outside the vocabulary but is "
                  "not in it");
    }
    if (unk_id_) {
      if (pending_unk && !fuse_unk_) symbols.push_back(*unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) symbols.push_back(*unk_id_);
}

void Bpe::merge_small(std::vector<int32_t>& symbols) const {
  size_t n = symbols.size();
  uint32_t ranks[kSmallWord];
  int32_t new_ids[kSmallWord];
  for (size_t i = 0; i + 1 < n; ++i) {
    const Merge* m = merges_.find(symbols[i], symbols[i + 1]);
    ranks[i] = m ? m->rank : kNoRank;
    new_ids[i] = m ? m->new_id : -1;
  }
  while (n > 1) {
    size_t best = 0;
    uint32_t best_rank = kNoRank;
    for (size_t i = 0; i + 1 < n; ++i) {
      if (ranks[i] < best_rank) {
        best_rank = ranks[i];
        best = i;
      }
    }
    if (best_rank == kNoRank) break;
    symbols[best] = new_ids[best];
    // Remove symbol best+1 and pair best (now recomputed), shifting the tails left.
    for (size_t i = best + 1; i + 1 < n; ++i) symbols[i] = symbols[i + 1];
    for (size_t i = best; i + 2 < n; ++i) {
      ranks[i] = ranks[i + 1];
      new_ids[i] = new_ids[i + 1];
    }
    --n;
    if (best > 0) {
      const Merge* m = merges_.find(symbols[best - 1], symbols[best]);
      ranks[best - 1] = m ? m->rank : kNoRank;
      new_ids[best - 1] = m ? m->new_id : -1;
    }
    if (best + 1 < n) {
      const Merge* m = merges_.find(symbols[best], symbols[best + 1]);
      ranks[best] = m ? m->rank : kNoRank;
      new_ids[best] = m ? m->new_id : -1;
    }
  }
  symbols.resize(n);
}

void Bpe::merge_large(std::vector<int32_t>& symbols) const {
  // The reference's algorithm: a min-heap of candidate merges keyed by (rank, position) over a
  // linked list of symbols; entries made stale by an earlier merge are skipped when popped.
  const size_t n = symbols.size();
  std::vector<int64_t> prev(n);
  std::vector<int64_t> next(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int64_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int64_t>(i + 1) : -1;
  }
  struct Candidate {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  std::vector<Candidate> storage;
  storage.reserve(n);
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue(std::greater<>{},
                                                                               std::move(storage));
  for (size_t i = 0; i + 1 < n; ++i) {
    if (const Merge* m = merges_.find(symbols[i], symbols[i + 1])) {
      queue.push({m->rank, static_cast<uint32_t>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const size_t pos = top.pos;
    if (!alive[pos] || next[pos] < 0) continue;
    const auto right = static_cast<size_t>(next[pos]);
    const Merge* current = merges_.find(symbols[pos], symbols[right]);
    if (current == nullptr || current->new_id != top.new_id) continue;
    symbols[pos] = top.new_id;
    alive[right] = false;
    next[pos] = next[right];
    if (next[right] >= 0) prev[static_cast<size_t>(next[right])] = static_cast<int64_t>(pos);
    if (prev[pos] >= 0) {
      const auto left = static_cast<size_t>(prev[pos]);
      if (const Merge* m = merges_.find(symbols[left], symbols[pos])) {
        queue.push({m->rank, static_cast<uint32_t>(left), m->new_id});
      }
    }
    if (next[pos] >= 0) {
      if (const Merge* m = merges_.find(symbols[pos], symbols[static_cast<size_t>(next[pos])])) {
        queue.push({m->rank, static_cast<uint32_t>(pos), m->new_id});
      }
    }
  }
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    if (alive[i]) symbols[kept++] = symbols[i];
  }
  symbols.resize(kept);
}

void Bpe::merge(std::vector<int32_t>& symbols) const {
  if (symbols.size() < 2) return;
  if (symbols.size() <= kSmallWord) {
    merge_small(symbols);
  } else {
    merge_large(symbols);
  }
}

void Bpe::PairSet::insert(uint64_t key) {
  if ((size_ + 1) * 2 > slots_.size()) {
    std::vector<uint64_t> old = std::move(slots_);
    slots_.assign(old.size() * 2, ~uint64_t{0});
    size_ = 0;
    for (const uint64_t k : old) {
      if (k != ~uint64_t{0}) insert(k);
    }
  }
  const size_t mask = slots_.size() - 1;
  size_t index = mix(key) & mask;
  while (slots_[index] != ~uint64_t{0}) {
    if (slots_[index] == key) return;
    index = (index + 1) & mask;
  }
  slots_[index] = key;
  ++size_;
}

bool Bpe::PairSet::contains(uint64_t key) const {
  const size_t mask = slots_.size() - 1;
  size_t index = mix(key) & mask;
  while (slots_[index] != ~uint64_t{0}) {
    if (slots_[index] == key) return true;
    index = (index + 1) & mask;
  }
  return false;
}

const Bpe::PairSet& Bpe::inner_pairs() const {
  std::call_once(inner_pairs_once_, [this] {
    for (size_t id = 0; id < id_to_token_.size(); ++id) {
      if (!has_id_[id]) continue;
      const std::string& token = id_to_token_[id];
      size_t i = 0;
      char32_t previous = 0;
      bool first = true;
      while (i < token.size()) {
        const char32_t c = next_code_point(token, i);
        if (!first) inner_pairs_.insert((static_cast<uint64_t>(previous) << 32) | c);
        previous = c;
        first = false;
      }
    }
  });
  return inner_pairs_;
}

bool Bpe::is_single_char_token(std::string_view character) const {
  const auto lead = static_cast<unsigned char>(character[0]);
  return lead < 0x80 ? ascii_ids_[lead] >= 0 : vocab_.find(character).has_value();
}

void Bpe::merge_in_parts(std::string_view word, std::vector<int32_t>& out) const {
  // A merged symbol always spells a vocabulary token, so no merge ever crosses a boundary
  // between two characters that are tokens themselves and never stand side by side inside any
  // token. The parts between such boundaries merge independently, exactly as the whole word
  // would, and each is short enough for the cache and the quadratic merge. This is what keeps a
  // long SentencePiece-style input (no pre-tokenizer: the whole text is one word) fast.
  const PairSet& pairs = inner_pairs();
  size_t part_start = 0;
  size_t i = 0;
  char32_t previous = 0;
  bool previous_known = false;
  while (i < word.size()) {
    const size_t start = i;
    const char32_t c = next_code_point(word, i);
    const bool known = is_single_char_token(word.substr(start, i - start));
    if (start > part_start && previous_known && known &&
        !pairs.contains((static_cast<uint64_t>(previous) << 32) | c)) {
      merge_cached(word.substr(part_start, start - part_start), out);
      part_start = start;
    }
    previous = c;
    previous_known = known;
  }
  merge_cached(word.substr(part_start), out);
}

void Bpe::merge_cached(std::string_view word, std::vector<int32_t>& out) const {
  const bool cacheable = word.size() < kCacheMaxWordBytes;
  if (cacheable) {
    const std::lock_guard<std::mutex> lock(cache_mutex_);
    if (const auto hit = cache_.find(word); hit != cache_.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  thread_local std::vector<int32_t> symbols;
  symbols.clear();
  initial_symbols(word, symbols);
  merge(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
  if (cacheable) {
    const std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), symbols);
  }
}

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto id = vocab_.find(word)) {
      out.push_back(*id);
      return;
    }
  }
  if (word.size() > kSmallWord && continuing_subword_prefix_.empty() &&
      end_of_word_suffix_.empty()) {
    merge_in_parts(word, out);
  } else {
    merge_cached(word, out);
  }
}

}  // namespace specrun::text
