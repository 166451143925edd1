#include "tests/gguf_writer.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "runtime/model/checkpoint.h"
#include "specrun/error.hpp"

namespace specrun::testing {

void GgufWriter::kv_raw(const std::string& key, GgufType type, const std::string& value_bytes) {
  kvs_ += str(key) + le<uint32_t>(static_cast<uint32_t>(type)) + value_bytes;
  ++kv_written_;
}
void GgufWriter::kv_u32(const std::string& key, uint32_t value) {
  kv_raw(key, GgufType::kUint32, le(value));
}
void GgufWriter::kv_i32(const std::string& key, int32_t value) {
  kv_raw(key, GgufType::kInt32, le(value));
}
void GgufWriter::kv_u64(const std::string& key, uint64_t value) {
  kv_raw(key, GgufType::kUint64, le(value));
}
void GgufWriter::kv_f32(const std::string& key, float value) {
  kv_raw(key, GgufType::kFloat32, le(value));
}
void GgufWriter::kv_bool(const std::string& key, bool value) {
  kv_raw(key, GgufType::kBool, std::string(1, value ? '\1' : '\0'));
}
void GgufWriter::kv_string(const std::string& key, const std::string& value) {
  kv_raw(key, GgufType::kString, str(value));
}
void GgufWriter::kv_strings(const std::string& key, const std::vector<std::string>& values) {
  std::string bytes =
      le<uint32_t>(static_cast<uint32_t>(GgufType::kString)) + le<uint64_t>(values.size());
  for (const std::string& value : values) bytes += str(value);
  kv_raw(key, GgufType::kArray, bytes);
}
void GgufWriter::kv_f32s(const std::string& key, const std::vector<float>& values) {
  std::string bytes =
      le<uint32_t>(static_cast<uint32_t>(GgufType::kFloat32)) + le<uint64_t>(values.size());
  for (const float value : values) bytes += le(value);
  kv_raw(key, GgufType::kArray, bytes);
}
void GgufWriter::kv_i32s(const std::string& key, const std::vector<int32_t>& values) {
  std::string bytes =
      le<uint32_t>(static_cast<uint32_t>(GgufType::kInt32)) + le<uint64_t>(values.size());
  for (const int32_t value : values) bytes += le(value);
  kv_raw(key, GgufType::kArray, bytes);
}

void GgufWriter::tensor(const std::string& name, uint32_t type, std::vector<uint64_t> ne,
                        std::string data, std::optional<uint64_t> offset) {
  tensors_.push_back({name, type, std::move(ne), std::move(data), offset});
}

std::string GgufWriter::bytes() const {
  std::string out = le(magic) + le(version) + le<uint64_t>(tensor_count.value_or(tensors_.size())) +
                    le<uint64_t>(kv_count.value_or(kv_written_)) + kvs_;
  // Place the data: each tensor at the next aligned offset unless told otherwise.
  std::string data;
  std::vector<uint64_t> offsets;
  for (const Tensor& t : tensors_) {
    uint64_t offset = (data.size() + alignment - 1) / alignment * alignment;
    if (t.offset) offset = *t.offset;
    offsets.push_back(offset);
    if (t.data.empty()) continue;  // a tensor whose bytes a test leaves out on purpose
    if (data.size() < offset + t.data.size()) data.resize(offset + t.data.size(), '\0');
    std::copy(t.data.begin(), t.data.end(), data.begin() + static_cast<std::ptrdiff_t>(offset));
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    out += str(t.name) + le<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (const uint64_t extent : t.ne) out += le(extent);
    out += le(t.type) + le(offsets[i]);
  }
  out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
  return out + data;
}

void GgufWriter::write(const std::filesystem::path& path) const {
  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  const std::string all = bytes();
  stream.write(all.data(), static_cast<std::streamsize>(all.size()));
  if (!stream) throw Error(path.string() + ": write failed");
}

std::string quantize_q8_0(std::span<const float> values) {
  std::string out;
  for (size_t block = 0; block < values.size() / 32; ++block) {
    const float* x = values.data() + block * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::abs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out += GgufWriter::le<uint16_t>(f32_to_f16(d));
    for (int j = 0; j < 32; ++j) {
      out += static_cast<char>(static_cast<int8_t>(std::lround(x[j] * id)));
    }
  }
  return out;
}

std::string quantize_q4_0(std::span<const float> values) {
  std::string out;
  for (size_t block = 0; block < values.size() / 32; ++block) {
    const float* x = values.data() + block * 32;
    // The value of largest magnitude maps to code 0 (-8): its sign sets d's.
    float amax = 0.0f, extreme = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (std::abs(x[j]) > amax) {
        amax = std::abs(x[j]);
        extreme = x[j];
      }
    }
    const float d = extreme / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out += GgufWriter::le<uint16_t>(f32_to_f16(d));
    for (int j = 0; j < 16; ++j) {
      const int low = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int high = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
      out += static_cast<char>(low | high << 4);
    }
  }
  return out;
}

std::string quantize_q4_1(std::span<const float> values) {
  std::string out;
  for (size_t block = 0; block < values.size() / 32; ++block) {
    const float* x = values.data() + block * 32;
    float low = x[0], high = x[0];
    for (int j = 1; j < 32; ++j) {
      low = std::min(low, x[j]);
      high = std::max(high, x[j]);
    }
    const float d = (high - low) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out += GgufWriter::le<uint16_t>(f32_to_f16(d));
    out += GgufWriter::le<uint16_t>(f32_to_f16(low));
    for (int j = 0; j < 16; ++j) {
      const int first =
          std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - low) * id + 0.5f)));
      const int second =
          std::min(15, static_cast<int>(static_cast<int8_t>((x[j + 16] - low) * id + 0.5f)));
      out += static_cast<char>(first | second << 4);
    }
  }
  return out;
}

namespace {

// GPT-2's byte-to-character table: printable bytes stand for themselves, the others for 256 + n.
std::vector<std::string> byte_level_alphabet() {
  std::vector<std::string> alphabet(256);
  int next = 0;
  for (int byte = 0; byte < 256; ++byte) {
    const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xa1 && byte <= 0xac) ||
                           (byte >= 0xae && byte <= 0xff);
    const int code = printable ? byte : 256 + next++;
    std::string utf8;
    if (code < 0x80) {
      utf8 += static_cast<char>(code);
    } else {
      utf8 += static_cast<char>(0xc0 | (code >> 6));
      utf8 += static_cast<char>(0x80 | (code & 0x3f));
    }
    alphabet[static_cast<size_t>(byte)] = utf8;
  }
  return alphabet;
}

std::string encode_as(uint32_t type, const float* values, size_t count) {
  std::string out;
  if (type == kGgmlF32) {
    out.assign(reinterpret_cast<const char*>(values), count * sizeof(float));
  } else if (type == kGgmlF16 || type == kGgmlBF16) {
    for (size_t i = 0; i < count; ++i) {
      out += GgufWriter::le<uint16_t>(type == kGgmlF16 ? f32_to_f16(values[i])
                                                       : f32_to_bf16(values[i]));
    }
  } else if (type == kGgmlQ8_0) {
    out = quantize_q8_0(std::span<const float>(values, count));
  } else if (type == kGgmlQ4_0) {
    out = quantize_q4_0(std::span<const float>(values, count));
  } else if (type == kGgmlQ4_1) {
    out = quantize_q4_1(std::span<const float>(values, count));
  } else {
    throw Error("write_gguf_from_checkpoint: type " + std::to_string(type) + " not written");
  }
  return out;
}

}  // namespace

void write_gguf_from_checkpoint(const std::filesystem::path& checkpoint_dir,
                                const std::filesystem::path& out, const GgufModelOptions& options) {
  const Checkpoint checkpoint = open_checkpoint(checkpoint_dir);
  const ModelConfig& c = checkpoint.config;
  // As llama.cpp's converter writes each: a Llama's q/k rows permuted to Meta's interleaved
  // pairing, Qwen's kept as Hugging Face holds them.
  const std::string architecture = c.architecture == Architecture::kQwen2    ? "qwen2"
                                   : c.architecture == Architecture::kQwen3  ? "qwen3"
                                   : c.architecture == Architecture::kGemma3 ? "gemma3"
                                                                             : "llama";
  const bool permute = architecture == "llama";
  const std::string prefix = architecture + ".";
  GgufWriter writer;
  writer.kv_string("general.architecture", architecture);
  writer.kv_u32(prefix + "context_length", static_cast<uint32_t>(c.max_position_embeddings));
  writer.kv_u32(prefix + "embedding_length", static_cast<uint32_t>(c.hidden_size));
  writer.kv_u32(prefix + "block_count", static_cast<uint32_t>(c.num_layers));
  writer.kv_u32(prefix + "feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  writer.kv_u32(prefix + "attention.head_count", static_cast<uint32_t>(c.num_heads));
  writer.kv_u32(prefix + "attention.head_count_kv", static_cast<uint32_t>(c.num_kv_heads));
  writer.kv_f32(prefix + "rope.freq_base", static_cast<float>(c.rope_theta));
  writer.kv_f32(prefix + "attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  writer.kv_u32(prefix + "rope.dimension_count", static_cast<uint32_t>(c.head_dim));
  if (c.architecture == Architecture::kGemma3) {
    writer.kv_u32(prefix + "attention.sliding_window", static_cast<uint32_t>(c.sliding_window));
  }
  if (c.head_dim * c.num_heads != c.hidden_size) {
    writer.kv_u32(prefix + "attention.key_length", static_cast<uint32_t>(c.head_dim));
    writer.kv_u32(prefix + "attention.value_length", static_cast<uint32_t>(c.head_dim));
  }
  if (options.tokenizer) {
    std::vector<std::string> tokens = byte_level_alphabet();
    tokens.resize(static_cast<size_t>(c.vocab_size), "");
    for (int64_t id = 256; id < c.vocab_size; ++id) {
      tokens[static_cast<size_t>(id)] = "<extra_" + std::to_string(id) + ">";
    }
    tokens[0] = "<|endoftext|>";
    std::vector<int32_t> types(tokens.size(), 1);
    types[0] = 3;
    writer.kv_string("tokenizer.ggml.model", "gpt2");
    writer.kv_string("tokenizer.ggml.pre", "smollm");
    writer.kv_strings("tokenizer.ggml.tokens", tokens);
    writer.kv_i32s("tokenizer.ggml.token_type", types);
    writer.kv_strings("tokenizer.ggml.merges", {});
    writer.kv_u32("tokenizer.ggml.bos_token_id", 1);
    writer.kv_u32("tokenizer.ggml.eos_token_id", 2);
    writer.kv_bool("tokenizer.ggml.add_bos_token", false);
    if (!options.chat_template.empty()) {
      writer.kv_string("tokenizer.chat_template", options.chat_template);
    }
  } else {
    writer.kv_u32(prefix + "vocab_size", static_cast<uint32_t>(c.vocab_size));
    writer.kv_u32("tokenizer.ggml.bos_token_id", 1);
    writer.kv_u32("tokenizer.ggml.eos_token_id", 2);
  }
  for (const TensorInfo* info : checkpoint.tensors.all()) {
    if (info->dtype != DType::kF32) {
      throw Error("write_gguf_from_checkpoint: " + info->name + " must be F32 to convert");
    }
    if (options.tied && info->name == "lm_head.weight") continue;
    std::vector<float> values(static_cast<const float*>(info->data),
                              static_cast<const float*>(info->data) + info->num_elements());
    // llama.cpp's converter stores Gemma's norm gains as the model multiplies by them: 1 + w.
    if (c.norm_gain_offset && info->name.ends_with("norm.weight")) {
      for (float& value : values) value += 1.0f;
    }
    const bool q = info->name.ends_with("q_proj.weight");
    const bool k = info->name.ends_with("k_proj.weight");
    if (permute && (q || k)) {
      // Rotate-half rows (head h, half j, pair i) to Meta's interleaved (head h, pair i, member j).
      const int64_t heads = q ? c.num_heads : c.num_kv_heads;
      const int64_t head_dim = c.head_dim;
      const int64_t cols = info->shape[1];
      std::vector<float> permuted(values.size());
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t j = 0; j < 2; ++j) {
          for (int64_t i = 0; i < head_dim / 2; ++i) {
            const int64_t from = h * head_dim + j * head_dim / 2 + i;
            const int64_t to = h * head_dim + 2 * i + j;
            std::copy_n(values.begin() + from * cols, cols, permuted.begin() + to * cols);
          }
        }
      }
      values = std::move(permuted);
    }
    const bool matrix = info->shape.size() == 2;
    const uint32_t type = matrix ? options.type : kGgmlF32;
    std::vector<uint64_t> ne(info->shape.rbegin(), info->shape.rend());
    writer.tensor(hf_to_gguf_tensor_name(info->name, architecture), type, ne,
                  encode_as(type, values.data(), values.size()));
  }
  writer.write(out);
}

}  // namespace specrun::testing
