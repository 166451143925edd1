// A GGUF writer for the tests: well-formed files by default, and every field reachable so that a
// test can write exactly the malformed file it needs.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/model/gguf.h"

namespace specrun::testing {

class GgufWriter {
 public:
  // Scalars: `bytes` is the little-endian value (use the typed helpers below).
  void kv_raw(const std::string& key, GgufType type, const std::string& value_bytes);
  void kv_u32(const std::string& key, uint32_t value);
  void kv_i32(const std::string& key, int32_t value);
  void kv_u64(const std::string& key, uint64_t value);
  void kv_f32(const std::string& key, float value);
  void kv_bool(const std::string& key, bool value);
  void kv_string(const std::string& key, const std::string& value);
  void kv_strings(const std::string& key, const std::vector<std::string>& values);
  void kv_f32s(const std::string& key, const std::vector<float>& values);
  void kv_i32s(const std::string& key, const std::vector<int32_t>& values);

  // A tensor: `ne` innermost first, `data` its bytes. Offsets are assigned in order, aligned,
  // unless `offset` is given.
  void tensor(const std::string& name, uint32_t type, std::vector<uint64_t> ne, std::string data,
              std::optional<uint64_t> offset = std::nullopt);

  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  uint64_t alignment = 32;               // for placing the data (general.alignment not set)
  std::optional<uint64_t> tensor_count;  // overrides the true count
  std::optional<uint64_t> kv_count;      // overrides the true count

  std::string bytes() const;
  void write(const std::filesystem::path& path) const;

  // Little-endian encodings, for kv_raw and hand-built values.
  template <typename T>
  static std::string le(T value) {
    std::string bytes(sizeof(T), '\0');
    std::memcpy(bytes.data(), &value, sizeof(T));
    return bytes;
  }
  static std::string str(const std::string& text) { return le<uint64_t>(text.size()) + text; }

 private:
  struct Tensor {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> ne;
    std::string data;
    std::optional<uint64_t> offset;
  };
  std::string kvs_;
  uint64_t kv_written_ = 0;
  std::vector<Tensor> tensors_;
};

// A small random `llama` model as a GGUF file (f32 unless `type` says otherwise; norms are
// always f32), written from a Hugging Face checkpoint's tensors: q/k rows permuted into Meta's
// pairing as llama.cpp's converter does, names and dimension order GGUF's. The metadata has a
// byte-level gpt2 tokenizer when `tokenizer` is true.
struct GgufModelOptions {
  uint32_t type = kGgmlF32;   // ggml type of the matrices: F32, F16, BF16, Q8_0, Q4_0 or Q4_1
  bool tokenizer = true;      // write tokenizer.* metadata
  bool tied = false;          // no output.weight
  std::string chat_template;  // tokenizer.chat_template, when not empty
};
void write_gguf_from_checkpoint(const std::filesystem::path& checkpoint_dir,
                                const std::filesystem::path& out, const GgufModelOptions& options);

// Q8_0 blocks of `values` (a multiple of 32), as ggml quantises them (round to nearest).
std::string quantize_q8_0(std::span<const float> values);
// Q4_0 and Q4_1 blocks of `values` (a multiple of 32), as ggml's reference quantisers write them.
std::string quantize_q4_0(std::span<const float> values);
std::string quantize_q4_1(std::span<const float> values);

}  // namespace specrun::testing
