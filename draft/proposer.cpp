#include "draft/proposer.h"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "runtime/base/check.h"

namespace specrun {

ModelProposer::ModelProposer(Model& draft, const SamplingParams& sampling, float draft_p_min)
    : draft_(draft), sampling_(sampling), draft_p_min_(draft_p_min) {
  validate_sampling(sampling);
  if (!(draft_p_min >= 0.0f && draft_p_min <= 1.0f)) {
    throw Error("draft_p_min must be in [0, 1], got " + std::to_string(draft_p_min));
  }
  const std::vector<int32_t>& head_tokens = draft.config().output_token_ids;
  if (!head_tokens.empty()) {
    const size_t bytes = head_tokens.size() * sizeof(int32_t);
    head_tokens_device_ = DeviceBuffer(draft.backend(), bytes, "the draft's output token ids");
    SPECRUN_CHECK_OK(
        draft.backend().copy_to_device(head_tokens_device_.data(), head_tokens.data(), bytes),
        "uploading the draft's output token ids");
  }
}

ModelProposer::~ModelProposer() {
  for (const DraftSequence& entry : sequences_) draft_.kv_cache().remove_sequence(entry.kv);
}

void ModelProposer::add_sequence(int64_t sequence) {
  sequences_.push_back({sequence, draft_.kv_cache().add_sequence(), 0});
}

void ModelProposer::remove_sequence(int64_t sequence) {
  const auto it = std::find_if(sequences_.begin(), sequences_.end(),
                               [&](const DraftSequence& entry) { return entry.id == sequence; });
  if (it == sequences_.end()) return;
  draft_.kv_cache().remove_sequence(it->kv);
  sequences_.erase(it);
}

const ModelProposer::DraftSequence& ModelProposer::state(int64_t sequence) const {
  for (const DraftSequence& entry : sequences_) {
    if (entry.id == sequence) return entry;
  }
  throw Error("draft: no sequence " + std::to_string(sequence));
}

ModelProposer::DraftSequence& ModelProposer::state(int64_t sequence) {
  return const_cast<DraftSequence&>(std::as_const(*this).state(sequence));
}

int64_t ModelProposer::cached_length(int64_t sequence) const {
  const DraftSequence& entry = state(sequence);
  return entry.offset + draft_.kv_cache().length(entry.kv);
}

int64_t ModelProposer::skipped(int64_t sequence) const {
  return state(sequence).offset;
}

void ModelProposer::rollback(int64_t sequence, int64_t committed_prefix) {
  rollback_keeping(sequence, committed_prefix, 0);
}

void ModelProposer::rollback_keeping(int64_t sequence, int64_t committed_prefix, int64_t drafts,
                                     std::span<const int32_t> text) {
  SPECRUN_CHECK(drafts >= 0);
  DraftSequence& entry = state(sequence);
  KvCache& cache = draft_.kv_cache();
  const int64_t keep = committed_prefix - entry.offset;
  if (keep < 0) {
    // Back before where a bounded catch-up started: nothing cached is still wanted.
    cache.truncate(entry.kv, 0);
    entry.offset = committed_prefix;
    entry.read_target_features = 0;
    entry.stand_ins_from = -1;
    return;
  }
  // A feature-reading draft keeps only the positions it computed from the target's features: at
  // the others it read its own, and a committed token there is read again.
  const int64_t length = reads_features()
                             ? std::min(cache.length(entry.kv), entry.read_target_features)
                             : cache.length(entry.kv);
  cache.truncate(entry.kv, std::min(length, keep + drafts));
  const int64_t kept = cache.length(entry.kv);
  if (entry.stand_ins_from >= 0) {
    // Drafts fed from the backend's memory: those the prefix keeps are committed text now.
    const int64_t known_end = std::min(kept, keep);
    if (entry.stand_ins_from < known_end) {
      SPECRUN_CHECK(static_cast<int64_t>(text.size()) >= entry.offset + known_end)
          << "the draft's cache holds drafts it never read up to position " << known_end
          << ", and the rollback brings " << text.size() << " tokens of text";
      cache.rewrite_tokens(entry.kv, entry.stand_ins_from,
                           text.subspan(static_cast<size_t>(entry.offset + entry.stand_ins_from),
                                        static_cast<size_t>(known_end - entry.stand_ins_from)));
    }
    entry.stand_ins_from = std::max(entry.stand_ins_from, known_end);
    if (entry.stand_ins_from >= kept) entry.stand_ins_from = -1;
  }
  // What the cache holds up to the committed prefix is committed text: its full blocks become
  // reusable. Drafts past it are not final, so they stay unsealed.
  cache.seal(entry.kv, std::min(length, keep));
  entry.read_target_features = std::min(entry.read_target_features, cache.length(entry.kv));
}

void ModelProposer::observe_features(int64_t sequence, int64_t first_position,
                                     std::span<const float> rows) {
  DraftSequence& entry = state(sequence);
  const auto width = static_cast<size_t>(draft_.config().feature_width);
  SPECRUN_CHECK(width > 0 && rows.size() % width == 0 && first_position >= 0);
  const auto first = static_cast<size_t>(first_position);
  const size_t known = entry.features.size() / width;
  if (known == 0) {
    // The first features of the sequence: the positions before were served from the target's
    // prefix cache.
    entry.features_from = first_position;
  }
  SPECRUN_CHECK(first <= known || known == 0)
      << "the target's features at positions " << known << " to " << first - 1 << " were skipped";
  entry.features.resize(std::max(known, first + rows.size() / width) * width);
  std::copy(rows.begin(), rows.end(),
            entry.features.begin() + static_cast<ptrdiff_t>(first * width));
}

std::span<const float> ModelProposer::target_feature(int64_t sequence, int64_t position) const {
  const DraftSequence& entry = state(sequence);
  const auto width = static_cast<size_t>(draft_.config().feature_width);
  if (width == 0 || position < entry.features_from ||
      static_cast<size_t>(position) >= entry.features.size() / width) {
    return {};
  }
  return std::span<const float>(entry.features)
      .subspan(static_cast<size_t>(position) * width, width);
}

int64_t ModelProposer::reuse_prefix(int64_t sequence, std::span<const int32_t> prompt) {
  DraftSequence& entry = state(sequence);
  KvCache& cache = draft_.kv_cache();
  SPECRUN_CHECK(cache.length(entry.kv) == 0 && entry.offset == 0);
  if (prompt.size() < 2) return 0;
  const int64_t reused = cache.reuse_prefix(entry.kv, prompt.first(prompt.size() - 1));
  entry.read_target_features = reused;
  return reused;
}

// One propose() call: its requests, the proposals it builds, and what its rounds share.
struct ModelProposer::Call {
  std::span<const DraftRequest> requests;
  Proposals proposals;
  bool keep = false;  // q kept for the proposals (any request keeps distributions)
  // Whether each round is read back and decided before the next is fed (else all at the end,
  // one wait for the call): where a decision changes what the next round reads (prompt lookup
  // may propose in the model's place, a feature-reading draft reads its own output), or where
  // stopping a row early saves work the host would do itself (a confidence floor on a backend in
  // host memory).
  bool settle_each_round = false;
  int64_t row_width = 0;  // entries of a row of logits: the vocabulary, or a reduced head's
  // [rounds] the rows each round fed, in feeding order: rows of larger gamma first, so that a
  // round's rows, where the call settles at the end, are the start of the round's before.
  std::vector<std::vector<int64_t>> round_rows;
  std::vector<double> reach;   // [batch] the draft's chance its drafts so far are accepted
  std::vector<char> stopped;   // [batch] settled: the row drafts no more
  std::vector<int64_t> first;  // [batch] the cache position of the row's first draft
  std::vector<std::vector<int32_t>> inputs;  // [batch] each row's tokens this round
  // [batch] each looking-up row's text so far: its committed tokens, then this call's drafts.
  std::vector<std::vector<int32_t>> texts;
  // A feature-reading draft's: each row's features for this round's tokens, and its own output.
  std::vector<std::vector<float>> feature_inputs;
  Features own_features;
  std::vector<SequenceInput> forward_batch;
  // [rounds fed + 1] where each round's results block starts: [rows] SampledRow, then where the
  // call keeps q for the host, [rows, row_width] floats, 8-byte aligned.
  std::vector<size_t> blocks{0};
  // The drafts stay where they were drawn (ModelProposer::leave_on_device), and q, where kept,
  // in the rounds' rows of q_device_.
  bool on_device = false;

  const DraftRequest& request(int64_t b) const { return requests[static_cast<size_t>(b)]; }
  // Whether the results blocks carry q back to the host.
  bool q_in_blocks() const { return keep && !on_device; }
  size_t block_bytes(size_t rows) const {
    const size_t q_bytes = q_in_blocks() ? static_cast<size_t>(row_width) * sizeof(float) : 0;
    return (rows * (sizeof(kernels::SampledRow) + q_bytes) + 7) / 8 * 8;
  }
  // Round r's results block, on the backend or as read back.
  template <typename Byte>
  Byte* block(Byte* results, int64_t round) const {
    return results + blocks[static_cast<size_t>(round)];
  }
  // Where in a round's block its rows' q begin.
  size_t q_offset(int64_t round) const {
    return round_rows[static_cast<size_t>(round)].size() * sizeof(kernels::SampledRow);
  }
};

void ModelProposer::catch_up(Call& call, int64_t b) {
  const DraftRequest& request = call.request(b);
  DraftSequence& entry = state(request.sequence);
  const SequenceId kv = entry.kv;
  KvCache& cache = draft_.kv_cache();
  const int64_t committed = static_cast<int64_t>(request.committed.size());
  int64_t seen = entry.offset + cache.length(kv);
  SPECRUN_CHECK(entry.stand_ins_from < 0)
      << "the draft's drafts left on the backend were never rolled back to the committed text";
  SPECRUN_CHECK(seen < committed)
      << "the draft has seen every committed token, so it has no logits to draft from";
  if (request.max_catch_up > 0 && committed - seen > request.max_catch_up) {
    // The draft's context restarts at the latest max_catch_up tokens.
    cache.truncate(kv, 0);
    entry.offset = std::max(committed - request.max_catch_up, earliest_context(entry));
    seen = entry.offset;
  } else if (request.max_catch_up == 0 && entry.offset > earliest_context(entry)) {
    // Drafting for real again: the whole context, as the draft was meant to see it.
    cache.truncate(kv, 0);
    entry.offset = earliest_context(entry);
    seen = entry.offset;
  }
  if (cache.length(kv) == 0) {
    // A fresh context starts from the cached blocks of the same text, as far as they reach
    // (never the last token: its logits are what the first draft is drawn from).
    seen += cache.reuse_prefix(
        kv, request.committed.subspan(static_cast<size_t>(seen),
                                      static_cast<size_t>(committed - seen - 1)));
  }
  call.inputs[static_cast<size_t>(b)].assign(request.committed.begin() + seen,
                                             request.committed.end());
  call.first[static_cast<size_t>(b)] = committed - entry.offset;
  if (request.lookup_min_ngram > 0) {
    call.texts[static_cast<size_t>(b)].assign(request.committed.begin(), request.committed.end());
  }
  if (reads_features()) {
    // Token p reads the target's feature at p - 1 (zeros at the text's start).
    const auto width = static_cast<size_t>(draft_.config().feature_width);
    std::vector<float>& features = call.feature_inputs[static_cast<size_t>(b)];
    features.assign(static_cast<size_t>(committed - seen) * width, 0.0f);
    const int64_t known = static_cast<int64_t>(entry.features.size() / width);
    for (int64_t p = std::max<int64_t>(seen, 1); p < committed; ++p) {
      SPECRUN_CHECK(p - 1 >= entry.features_from && p - 1 < known)
          << "the draft reads the target's feature at position " << p - 1
          << ", which the engine has not handed over (known: " << entry.features_from << " to "
          << known - 1 << ")";
      std::copy_n(entry.features.begin() + static_cast<ptrdiff_t>((p - 1) * width), width,
                  features.begin() + static_cast<ptrdiff_t>((p - seen) * width));
    }
  }
}

void ModelProposer::feed(Call& call, int64_t round) {
  const std::vector<int64_t>& rows = call.round_rows[static_cast<size_t>(round)];
  const bool with_features = reads_features();
  const int32_t* previous_draws =
      round > 0 ? drawn_device_.as<int32_t>() + (round - 1) * round_rows_ : nullptr;
  call.forward_batch.clear();
  for (size_t row = 0; row < rows.size(); ++row) {
    const int64_t b = rows[row];
    std::vector<int32_t>& input = call.inputs[static_cast<size_t>(b)];
    const int32_t* device_tokens = nullptr;
    if (round == 0) {
      catch_up(call, b);
    } else if (call.settle_each_round) {
      input.assign(
          1, call.proposals.tokens[static_cast<size_t>(b * call.proposals.gamma + round - 1)]);
      // A feature-reading draft reads its own output feature at the position before (kept by
      // the previous round).
    } else {
      // The previous round's draw, where the backend left it: the row's place in that round is
      // its place in this one (the rounds' rows shrink from the end).
      SPECRUN_CHECK(call.round_rows[static_cast<size_t>(round - 1)][row] == b);
      input.assign(1, 0);  // a stand-in the KV cache records until trim_after_settling
      device_tokens = previous_draws + row;
    }
    call.forward_batch.push_back(
        {state(call.request(b).sequence).kv,
         input,
         false,
         with_features ? std::span<const float>(call.feature_inputs[static_cast<size_t>(b)])
                       : std::span<const float>(),
         {},
         device_tokens});
  }
  Logits logits;
  logits.keep_on_device = true;  // the rows are sampled where they are
  logits.compact_head = true;
  draft_.forward(call.forward_batch, &logits, with_features ? &call.own_features : nullptr);
  if (with_features) {
    const auto width = static_cast<size_t>(draft_.config().feature_width);
    for (size_t row = 0; row < rows.size(); ++row) {
      const int64_t b = rows[row];
      if (round == 0) {
        DraftSequence& entry = state(call.request(b).sequence);
        entry.read_target_features = draft_.kv_cache().length(entry.kv);
      }
      // The row's last output feature: what its next draft reads.
      const std::span<const float> features = call.own_features.of(static_cast<int64_t>(row));
      call.feature_inputs[static_cast<size_t>(b)].assign(
          features.end() - static_cast<ptrdiff_t>(width), features.end());
    }
  }
  enqueue_sample(call, round, logits);
}

void ModelProposer::enqueue_sample(Call& call, int64_t round, const Logits& logits) {
  kernels::Backend& backend = draft_.backend();
  const int64_t vocab = draft_.config().vocab_size;
  const std::vector<int64_t>& rows = call.round_rows[static_cast<size_t>(round)];
  const size_t first = static_cast<size_t>(round * round_rows_);
  for (size_t row = 0; row < rows.size(); ++row) {
    const DraftRequest& request = call.request(rows[row]);
    int32_t candidate = -1;
    if (request.lookup_min_ngram > 0) {
      const std::vector<int32_t>& text = call.texts[static_cast<size_t>(rows[row])];
      const int64_t follow =
          lookup_continuation(text, request.lookup_min_ngram, request.lookup_max_ngram);
      if (follow >= 0 && text[static_cast<size_t>(follow)] < vocab) {
        candidate = text[static_cast<size_t>(follow)];
      }
    }
    const SamplingParams& sampling = request.sampling ? *request.sampling : sampling_;
    const float p_min = request.draft_p_min >= 0.0f ? request.draft_p_min : draft_p_min_;
    kernels::SampleRow& entry = sample_rows_[first + row];
    entry.settings = logits_settings(sampling);
    entry.seed = request.stream.seed();
    entry.position = request.position + round;
    entry.rule = sampling.temperature == 0.0f ? kernels::SampleRule::kArgmax
                 : sampling.shared_noise      ? kernels::SampleRule::kSharedNoise
                                              : kernels::SampleRule::kInverseCdf;
    entry.draw = Draw::kDraft;
    // One more than the alternates wanted, as the proposal is among the ranking, and one for
    // the contest's other offer.
    entry.ranked = request.alternates > 0 ? static_cast<int32_t>(request.alternates + 2) : 0;
    entry.probe = candidate;
    // The confidence is read by lookup's test, the confidence floor and the alternates' floor.
    entry.weigh = (candidate >= 0 && request.lookup_below < 1.0f) || p_min > 0.0f ||
                  (request.alternates > 0 && request.alternate_floor > 0.0f);
  }
  enqueue_processing(call, round, logits);
  auto* rows_device = sample_rows_device_.as<kernels::SampleRow>() + first;
  SPECRUN_CHECK_OK(backend.copy_to_device(rows_device, sample_rows_.data() + first,
                                          rows.size() * sizeof(kernels::SampleRow)),
                   "uploading the draft's sampling rows");
  std::byte* block = call.block(results_device_.as<std::byte>(), round);
  // [rows, row width]: in the results block where the host reads q, in its rounds' rows where the
  // target will gather it, else scratch each round overwrites.
  float* q = call.q_in_blocks() ? reinterpret_cast<float*>(block + call.q_offset(round))
             : call.keep ? q_device_.as<float>() + first * static_cast<size_t>(call.row_width)
                         : q_device_.as<float>();
  SPECRUN_CHECK_OK(backend.sample({static_cast<int64_t>(rows.size()), logits.device_width, vocab},
                                  rows_device, logits.device, head_tokens_device_.as<int32_t>(), q,
                                  reinterpret_cast<kernels::SampledRow*>(block),
                                  drawn_device_.as<int32_t>() + first),
                   "sampling the draft's rows");
}

void ModelProposer::enqueue_processing(Call& call, int64_t round, const Logits& logits) {
  const std::vector<int64_t>& rows = call.round_rows[static_cast<size_t>(round)];
  const bool any = std::any_of(rows.begin(), rows.end(),
                               [&](int64_t b) { return call.request(b).processor != nullptr; });
  if (!any) return;
  const std::vector<int32_t>& head = draft_.config().output_token_ids;
  const int64_t width = logits.device_width;
  const auto words = static_cast<size_t>((width + 31) / 32);
  const auto vocab_words = static_cast<size_t>((draft_.config().vocab_size + 31) / 32);
  const bool any_masks = std::any_of(rows.begin(), rows.end(), [&](int64_t b) {
    return call.request(b).processor != nullptr && call.request(b).processor->masks();
  });
  edits_.clear(any_masks ? words : 0);
  std::vector<kernels::LogitEdit>& edits = edits_.edits();
  std::vector<int32_t> text;  // what the row's processor has not committed: then its drafts
  for (const int64_t b : rows) {
    const DraftRequest& request = call.request(b);
    if (request.processor == nullptr) {
      edits_.add_untouched(1);
      continue;
    }
    text.assign(request.committed.end() - request.uncommitted, request.committed.end());
    const int32_t* drafts = call.proposals.tokens.data() + b * call.proposals.gamma;
    text.insert(text.end(), drafts, drafts + round);
    const size_t before = edits.size();
    request.processor->edits(text, text.size() + 1, edits, edits_.row_ends(), text.size());
    if (!head.empty()) {
      // Columns of the reduced head: an edit of a token it does not score is dropped.
      size_t kept = before;
      for (size_t e = before; e < edits.size(); ++e) {
        const auto at = std::lower_bound(head.begin(), head.end(), edits[e].token);
        if (at == head.end() || *at != edits[e].token) continue;
        edits[kept] = edits[e];
        edits[kept++].token = static_cast<int32_t>(at - head.begin());
      }
      edits.resize(kept);
      edits_.row_ends().back() = static_cast<int64_t>(kept);
    }
    if (!any_masks) continue;
    std::vector<uint32_t>& masks = edits_.masks();
    const size_t first_mask = masks.size();
    masks.resize(first_mask + words, ~0u);
    if (!request.processor->masks()) continue;
    token_mask_.clear();
    // Over the grammar's vocabulary (the target's tokenizer) or the draft's, the wider: a token
    // past the draft's rows is never one it scores.
    request.processor->masks(text, text.size() + 1,
                             std::max(request.processor->mask_words(), vocab_words), token_mask_,
                             text.size());
    uint32_t* mask = masks.data() + first_mask;
    if (head.empty()) {
      std::copy_n(token_mask_.begin(), words, mask);
      continue;
    }
    std::fill(mask, mask + words, 0u);
    bool allows_any = false;
    for (size_t c = 0; c < head.size(); ++c) {
      const auto token = static_cast<size_t>(head[c]);
      if ((token_mask_[token / 32] >> (token % 32)) & 1u) {
        mask[c / 32] |= 1u << (c % 32);
        allows_any = true;
      }
    }
    // Where the grammar allows only tokens the head does not score, the row goes unmasked: its
    // draft is refused by the target, which is exact whatever the draft proposes.
    if (!allows_any) std::fill(mask, mask + words, ~0u);
  }
  // The forward's rows are this call's until the draft's next forward: edited where they lie.
  edits_.apply(draft_.backend(), width, const_cast<float*>(logits.device),
               "applying the requests' penalties, logit bias and grammars to the draft's rows");
}

void ModelProposer::read_back(const Call& call, int64_t first, int64_t count) {
  const size_t offset = call.blocks[static_cast<size_t>(first)];
  const size_t bytes = call.blocks[static_cast<size_t>(first + count)] - offset;
  SPECRUN_CHECK_OK(
      draft_.backend().copy_to_host(reinterpret_cast<std::byte*>(results_host_.data()) + offset,
                                    results_device_.as<std::byte>() + offset, bytes),
      "reading the draft's draws");
}

bool ModelProposer::settle(Call& call, int64_t round, size_t row) {
  Proposals& proposals = call.proposals;
  const int64_t vocab = draft_.config().vocab_size;
  const int64_t b = call.round_rows[static_cast<size_t>(round)][row];
  const DraftRequest& request = call.request(b);
  const std::byte* block =
      call.block(reinterpret_cast<const std::byte*>(results_host_.data()), round);
  const kernels::SampledRow& draw = reinterpret_cast<const kernels::SampledRow*>(block)[row];
  const kernels::SampleRow& asked = sample_rows_[static_cast<size_t>(round * round_rows_) + row];
  if (draw.status != static_cast<int32_t>(kernels::RowStatus::kOk)) {
    throw_row_status(static_cast<kernels::RowStatus>(draw.status),
                     "the draft's row for sequence " + std::to_string(request.sequence));
  }
  // The draft model's own confidence, its unprocessed top probability (when the row asked).
  const double confidence = draw.top_probability;
  // Prompt lookup offers a token where the text so far repeats itself and the model is not
  // sure of its own (the sampled row's probe is lookup's candidate).
  const int32_t candidate = asked.probe;
  const int32_t looked_up =
      candidate >= 0 && (request.lookup_below >= 1.0f || confidence < request.lookup_below)
          ? candidate
          : -1;
  const float p_min = request.draft_p_min >= 0.0f ? request.draft_p_min : draft_p_min_;
  if (looked_up < 0 && p_min > 0.0f && confidence < p_min) {
    return false;  // stop this row without drafting
  }
  const auto slot = static_cast<size_t>(b * proposals.gamma + round);
  float* kept_q = call.keep ? proposals.probs.data() + static_cast<int64_t>(slot) * vocab : nullptr;
  if (call.keep) {
    // [row width]: the row's q as the backend processed it, widened for a reduced head.
    const float* q = reinterpret_cast<const float*>(block + call.q_offset(round)) +
                     row * static_cast<size_t>(call.row_width);
    const std::span<const int32_t> head_tokens = draft_.config().output_token_ids;
    if (!head_tokens.empty()) {
      for (size_t i = 0; i < head_tokens.size(); ++i) kept_q[head_tokens[i]] = q[i];
    } else {
      std::copy_n(q, vocab, kept_q);
    }
  }
  int32_t token = draw.token;
  if (looked_up >= 0 && looked_up != token) {
    // A contest: the engine learns from the verdict which of the two to prefer.
    proposals.model_offers[slot] = token;
    proposals.lookup_offers[slot] = looked_up;
  }
  const int32_t proposed = looked_up >= 0 && request.prefer_lookup ? looked_up : token;
  // Alternates: none where even the likeliest other token could not reach the floor (the
  // draft's top token when it is not the one proposed, else the rest of its mass), so that a
  // sure draft pays for no ranking.
  double& row_reach = call.reach[static_cast<size_t>(b)];
  const bool gated = request.alternate_floor > 0.0f;
  // A token's weight, exp(logit - max logit): every token asked about is the drawn one,
  // lookup's candidate or one of the ranking.
  const auto weight_of = [&](int32_t id) -> float {
    if (id == draw.token) return draw.token_weight;
    if (id == candidate) return draw.probe_weight;
    for (int32_t k = 0; k < asked.ranked; ++k) {
      if (draw.ranked[k] == id) return draw.ranked_weight[k];
    }
    SPECRUN_CHECK(false) << "token " << id << " was not weighed with the draft's row";
    return 0.0f;
  };
  // The draft's probability of a token.
  const auto model_probability = [&](int32_t id) {
    return static_cast<double>(weight_of(id)) * confidence;
  };
  bool offer = request.alternates > 0;
  if (offer && gated) {
    const bool proposed_is_top = weight_of(proposed) == 1.0f;
    offer =
        row_reach * (proposed_is_top ? 1.0 - confidence : confidence) >= request.alternate_floor;
  }
  if (call.keep && looked_up >= 0 && request.prefer_lookup) {
    // Lookup's token whatever the model drew: its q is a point mass, which verification
    // handles exactly.
    std::fill(kept_q, kept_q + vocab, 0.0f);
    kept_q[looked_up] = 1.0f;
  }
  token = proposed;
  proposals.tokens[slot] = token;
  if (offer) {
    // The contest's other offer first, then the model's ranking (one more than wanted, as
    // the proposal is among it), never the proposal twice.
    int32_t* alternates =
        proposals.alternates.data() + static_cast<int64_t>(slot) * proposals.alternates_width;
    int64_t taken = 0;
    const auto take = [&](int32_t offered) {
      if (taken == request.alternates || offered < 0 || offered == token ||
          std::find(alternates, alternates + taken, offered) != alternates + taken) {
        return;
      }
      if (gated && row_reach * model_probability(offered) < request.alternate_floor) return;
      alternates[taken++] = offered;
    };
    if (proposals.has_contests() && proposals.model_offers[slot] >= 0) {
      take(token == looked_up ? proposals.model_offers[slot] : looked_up);
    }
    for (int32_t k = 0; k < asked.ranked; ++k) take(draw.ranked[k]);
  }
  // Once the row's reach is below the floor no later alternate can pass: the draft's
  // probabilities are no longer needed.
  if (gated && request.alternates > 0 && row_reach >= request.alternate_floor) {
    row_reach *= model_probability(token);
  }
  if (request.lookup_min_ngram > 0) call.texts[static_cast<size_t>(b)].push_back(token);
  proposals.counts[static_cast<size_t>(b)] = static_cast<int32_t>(round + 1);
  // The last draft is never fed: its logits would only serve a draft beyond gamma.
  return round + 1 < request.gamma;
}

void ModelProposer::leave_on_device(Call& call) {
  kernels::Backend& backend = draft_.backend();
  Proposals& proposals = call.proposals;
  const std::vector<int64_t>& rows = call.round_rows.front();
  DraftsOnDevice& on_device = proposals.on_device;
  const auto entries = static_cast<size_t>(proposals.batch * proposals.gamma);
  on_device.draws = drawn_device_.as<int32_t>();
  on_device.draw_count = static_cast<int64_t>(call.round_rows.size()) * round_rows_;
  on_device.statuses = results_device_.as<int32_t>();
  on_device.status_words = static_cast<int64_t>(call.blocks.back() / sizeof(int32_t));
  on_device.draw_index.assign(entries, -1);
  on_device.status_index.assign(entries, -1);
  if (call.keep) {
    on_device.q = q_device_.as<float>();
    on_device.q_width = call.row_width;
    on_device.q_columns = head_tokens_device_.as<int32_t>();  // null without a reduced head
  }
  // Round r's draws are entries [r * round_rows_, ...) in the order of its rows, which are the
  // first rows of round 0's; its SampledRows open its results block.
  static_assert(offsetof(kernels::SampledRow, status) % sizeof(int32_t) == 0 &&
                sizeof(kernels::SampledRow) % sizeof(int32_t) == 0);
  for (size_t row = 0; row < rows.size(); ++row) {
    const int64_t b = rows[row];
    const int64_t gamma = call.request(b).gamma;
    for (int64_t i = 0; i < gamma; ++i) {
      const auto slot = static_cast<size_t>(b * proposals.gamma + i);
      on_device.draw_index[slot] =
          static_cast<int32_t>(i * round_rows_ + static_cast<int64_t>(row));
      const size_t status_byte = call.blocks[static_cast<size_t>(i)] +
                                 row * sizeof(kernels::SampledRow) +
                                 offsetof(kernels::SampledRow, status);
      on_device.status_index[slot] = static_cast<int32_t>(status_byte / sizeof(int32_t));
    }
    proposals.counts[static_cast<size_t>(b)] = static_cast<int32_t>(gamma);
    // Rounds 1.. fed d_1..d_{gamma-1} from the backend: the cache recorded stand-ins for them.
    if (gamma > 1)
      state(call.request(b).sequence).stand_ins_from = call.first[static_cast<size_t>(b)];
  }
  if (drawn_event_ == nullptr) {
    drawn_event_ = backend.create_event();
    SPECRUN_CHECK(drawn_event_ != nullptr) << "the draft's backend made no event";
  }
  SPECRUN_CHECK_OK(backend.record(*drawn_event_), "marking the draft's last draw");
  on_device.drawn = drawn_event_.get();
}

void ModelProposer::trim_after_settling(Call& call) {
  KvCache& cache = draft_.kv_cache();
  for (const int64_t b : call.round_rows.front()) {
    const DraftRequest& request = call.request(b);
    const SequenceId kv = state(request.sequence).kv;
    // What settling each round would have left: the drafts fed, which are all but the last
    // where the row drafted its gamma, and every one where the floor stopped it sooner.
    const int64_t count = call.proposals.counts[static_cast<size_t>(b)];
    const int64_t kept = std::min(count, request.gamma - 1);
    const int64_t first = call.first[static_cast<size_t>(b)];
    cache.truncate(kv, first + kept);
    cache.rewrite_tokens(kv, first, call.proposals.row_tokens(b).first(static_cast<size_t>(kept)));
  }
}

Proposals ModelProposer::propose(std::span<const DraftRequest> requests) {
  const int64_t batch = static_cast<int64_t>(requests.size());
  const int64_t vocab = draft_.config().vocab_size;
  Call call;
  call.requests = requests;
  Proposals& proposals = call.proposals;
  proposals.batch = batch;
  proposals.vocab = vocab;
  for (const DraftRequest& request : requests) {
    proposals.gamma = std::max(proposals.gamma, request.gamma);
  }
  proposals.tokens.assign(static_cast<size_t>(batch * proposals.gamma), -1);
  proposals.counts.assign(static_cast<size_t>(batch), 0);
  const auto any = [&](auto&& predicate) {
    return std::any_of(requests.begin(), requests.end(), predicate);
  };
  call.keep = any([](const DraftRequest& request) { return request.keep_distributions; });
  const bool looks_up =
      any([](const DraftRequest& request) { return request.lookup_min_ngram > 0; });
  const bool has_floor = any([this](const DraftRequest& request) {
    return (request.draft_p_min >= 0.0f ? request.draft_p_min : draft_p_min_) > 0.0f;
  });
  const bool processes =
      any([](const DraftRequest& request) { return request.processor != nullptr; });
  call.settle_each_round = looks_up || reads_features() || processes ||
                           (has_floor && draft_.backend().uses_host_memory());
  const bool host_reads =
      any([](const DraftRequest& request) { return request.host_reads_drafts; });
  const bool offers_alternates =
      any([](const DraftRequest& request) { return request.alternates > 0; });
  // Nothing the host decides depends on the draws: they stay where they were drawn.
  call.on_device = !call.settle_each_round && !has_floor && !offers_alternates && !host_reads;
  // A reduced head (ModelConfig::output_token_ids) scores part of the vocabulary, every other
  // token's logit -infinity: its rows are sampled as it scores them, entry i standing for token
  // head_tokens[i] (the softmax, filters and draws of 8,192 entries rather than 49,152 for the
  // demo's draft), and q widened to the vocabulary only where the proposals keep it.
  const std::vector<int32_t>& head_tokens = draft_.config().output_token_ids;
  call.row_width = head_tokens.empty() ? vocab : static_cast<int64_t>(head_tokens.size());
  if (call.q_in_blocks()) {
    proposals.probs.assign(static_cast<size_t>(batch * proposals.gamma * vocab), 0.0f);
  }
  if (looks_up) {
    proposals.model_offers.assign(static_cast<size_t>(batch * proposals.gamma), -1);
    proposals.lookup_offers.assign(static_cast<size_t>(batch * proposals.gamma), -1);
  }
  for (const DraftRequest& request : requests) {
    proposals.alternates_width = std::max(proposals.alternates_width, request.alternates);
  }
  if (proposals.alternates_width > 0) {
    proposals.alternates.assign(
        static_cast<size_t>(batch * proposals.gamma * proposals.alternates_width), -1);
  }
  const auto rows_of_batch = static_cast<size_t>(batch);
  call.reach.assign(rows_of_batch, 1.0);
  call.stopped.assign(rows_of_batch, 0);
  call.first.assign(rows_of_batch, 0);
  call.inputs.resize(rows_of_batch);
  call.texts.resize(rows_of_batch);
  call.feature_inputs.resize(reads_features() ? rows_of_batch : 0);

  // Each round feeds every row still drafting: first its unseen committed tokens, then its
  // previous draft. Rows drafting the same round share one batched forward.
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < batch; ++b) {
    if (requests[static_cast<size_t>(b)].gamma > 0) rows.push_back(b);
  }
  std::stable_sort(rows.begin(), rows.end(), [&](int64_t a, int64_t b) {
    return call.request(a).gamma > call.request(b).gamma;
  });
  if (rows.empty()) return std::move(call.proposals);
  const int64_t rounds = proposals.gamma;
  kernels::Backend& backend = draft_.backend();
  round_rows_ = static_cast<int64_t>(rows.size());
  const auto round_entries = static_cast<size_t>(rounds * round_rows_);
  // q's rows on the backend: every round's where the target gathers them, else one round's.
  const size_t q_bytes = static_cast<size_t>((call.on_device && call.keep ? rounds : 1) *
                                             round_rows_ * call.row_width) *
                         sizeof(float);
  // At most every row in every round.
  const size_t results_bytes =
      static_cast<size_t>(rounds) * call.block_bytes(static_cast<size_t>(round_rows_));
  sample_rows_.resize(round_entries);
  results_host_.resize(results_bytes / 8);
  sample_rows_device_.reserve(backend, round_entries * sizeof(kernels::SampleRow),
                              "the draft's sampling rows");
  results_device_.reserve(backend, results_bytes, "the draft's draws");
  drawn_device_.reserve(backend, round_entries * sizeof(int32_t), "the draft's drawn tokens");
  if (!call.q_in_blocks()) q_device_.reserve(backend, q_bytes, "the draft's distributions");

  for (int64_t round = 0; !rows.empty(); ++round) {
    call.round_rows.push_back(rows);
    call.blocks.push_back(call.blocks.back() + call.block_bytes(rows.size()));
    feed(call, round);
    if (call.settle_each_round) {
      read_back(call, round, 1);
      std::vector<int64_t> drafting_on;
      for (size_t row = 0; row < rows.size(); ++row) {
        if (settle(call, round, row)) drafting_on.push_back(rows[row]);
      }
      rows.swap(drafting_on);
    } else {
      // Every row drafts to its gamma; the host decides once every round is read back.
      std::erase_if(rows, [&](int64_t b) { return call.request(b).gamma <= round + 1; });
    }
  }
  if (call.on_device) {
    leave_on_device(call);
  } else if (!call.settle_each_round) {
    const auto fed = static_cast<int64_t>(call.round_rows.size());
    read_back(call, 0, fed);
    for (int64_t round = 0; round < fed; ++round) {
      const std::vector<int64_t>& round_rows = call.round_rows[static_cast<size_t>(round)];
      for (size_t row = 0; row < round_rows.size(); ++row) {
        char& stopped = call.stopped[static_cast<size_t>(round_rows[row])];
        if (!stopped && !settle(call, round, row)) stopped = 1;
      }
    }
    trim_after_settling(call);
  }
  return std::move(call.proposals);
}

int64_t lookup_continuation(std::span<const int32_t> text, int64_t min_ngram, int64_t max_ngram) {
  const int64_t length = static_cast<int64_t>(text.size());
  const int64_t longest = std::min(max_ngram, length - 1);
  if (min_ngram < 1 || longest < min_ngram) return -1;
  // One backward pass over the occurrences' last tokens, text[end] with text[end + 1] after it:
  // the first (latest) to match the most suffix tokens wins, and one matching `longest` ends it.
  int64_t best = 0;
  int64_t follow = -1;
  const auto at = [&](int64_t i) { return text[static_cast<size_t>(i)]; };
  for (int64_t end = length - 2; end >= 0; --end) {
    int64_t matched = 0;
    while (matched < longest && matched <= end && at(end - matched) == at(length - 1 - matched)) {
      ++matched;
    }
    if (matched > best) {
      best = matched;
      follow = end + 1;
      if (matched == longest) break;
    }
  }
  return best >= min_ngram ? follow : -1;
}

PromptLookupProposer::PromptLookupProposer(int64_t min_ngram, int64_t max_ngram, bool pad_to_gamma)
    : min_ngram_(min_ngram), max_ngram_(max_ngram), pad_to_gamma_(pad_to_gamma) {
  if (min_ngram < 1 || max_ngram < min_ngram) {
    throw Error("prompt lookup n-gram sizes must satisfy 1 <= min <= max, got " +
                std::to_string(min_ngram) + " and " + std::to_string(max_ngram));
  }
}

Proposals PromptLookupProposer::propose(std::span<const DraftRequest> requests) {
  Proposals proposals;
  proposals.batch = static_cast<int64_t>(requests.size());
  for (const DraftRequest& request : requests) {
    proposals.gamma = std::max(proposals.gamma, request.gamma);
  }
  proposals.tokens.assign(static_cast<size_t>(proposals.batch * proposals.gamma), -1);
  proposals.counts.assign(static_cast<size_t>(proposals.batch), 0);
  for (int64_t b = 0; b < proposals.batch; ++b) {
    const DraftRequest& request = requests[static_cast<size_t>(b)];
    const std::span<const int32_t> text = request.committed;
    const int64_t length = static_cast<int64_t>(text.size());
    if (request.gamma == 0) continue;
    const int64_t follow = lookup_continuation(text, min_ngram_, max_ngram_);
    if (follow >= 0) {
      const int64_t count = std::min(request.gamma, length - follow);
      for (int64_t i = 0; i < count; ++i) {
        proposals.tokens[static_cast<size_t>(b * proposals.gamma + i)] =
            text[static_cast<size_t>(follow + i)];
      }
      proposals.counts[static_cast<size_t>(b)] = static_cast<int32_t>(count);
    }
    if (pad_to_gamma_ && length > 0) {
      int32_t* row = proposals.tokens.data() + b * proposals.gamma;
      int32_t& count = proposals.counts[static_cast<size_t>(b)];
      const int32_t filler = count > 0 ? row[count - 1] : text.back();
      std::fill(row + count, row + request.gamma, filler);
      count = static_cast<int32_t>(request.gamma);
    }
  }
  return proposals;
}

}  // namespace specrun
