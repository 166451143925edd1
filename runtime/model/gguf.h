// GGUF (llama.cpp's checkpoint format, versions 2 and 3): reading through mmap with every header
// field validated before use, the ggml tensor types and their dequantisation, and the `llama`
// architecture's hyperparameters, tensor names and tokenizer.
//
// File layout (little-endian):
//   "GGUF", uint32 version, uint64 tensor_count, uint64 kv_count,
//   kv_count x {string key, uint32 value type, value},
//   tensor_count x {string name, uint32 n_dims, uint64 ne[n_dims], uint32 ggml type, uint64
//   offset}, padding to general.alignment (default 32), then the data section; tensor offsets are
//   relative to its start and multiples of the alignment.
// A string is a uint64 byte length and that many bytes (no terminator); an array is a uint32
// element type, a uint64 count and the elements. ne[0] is the innermost (contiguous) dimension,
// so a GGUF [ne0, ne1] matrix is the row-major [ne1, ne0] of Hugging Face checkpoints.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kernels/core/dtype.h"
#include "runtime/base/mapped_file.h"
#include "runtime/model/config.h"

namespace specrun {

// Metadata value types, as numbered in the file.
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint32", "string", "array"...; "type N" for a number that names none.
std::string gguf_type_name(GgufType type);

// One metadata value. Scalars keep their stored type; integers read back through as_int, which
// refuses values a signed 64-bit integer cannot hold.
struct GgufValue {
  GgufType type = GgufType::kUint8;          // stored type
  GgufType element_type = GgufType::kUint8;  // arrays: the elements' type
  uint64_t bits = 0;                         // integers and bool (sign-extended for signed types)
  double number = 0.0;                       // float32 and float64
  std::string string;                        // strings
  std::vector<GgufValue> array;              // arrays

  bool is_integer() const;
};

// The ggml tensor types. Every type llama.cpp has numbered is known (so that a file holding one
// specrun cannot compute with is refused by name); dequantize supports F32, F16, BF16, Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K.
struct GgmlTypeInfo {
  uint32_t id;             // the number in the file
  std::string_view name;   // "Q4_K"
  int64_t block_elements;  // elements per block (1 for plain types)
  int64_t block_bytes;     // bytes per block
  bool supported;          // dequantize handles it
};
// nullptr for a number ggml does not define (or no longer does).
const GgmlTypeInfo* ggml_type_info(uint32_t id);
// The supported types' names, comma-separated, for errors.
std::string supported_type_names();

inline constexpr uint32_t kGgmlF32 = 0;
inline constexpr uint32_t kGgmlF16 = 1;
inline constexpr uint32_t kGgmlQ4_0 = 2;
inline constexpr uint32_t kGgmlQ4_1 = 3;
inline constexpr uint32_t kGgmlQ5_0 = 6;
inline constexpr uint32_t kGgmlQ5_1 = 7;
inline constexpr uint32_t kGgmlQ8_0 = 8;
inline constexpr uint32_t kGgmlQ4_K = 12;
inline constexpr uint32_t kGgmlQ5_K = 13;
inline constexpr uint32_t kGgmlQ6_K = 14;
inline constexpr uint32_t kGgmlBF16 = 30;

// Dequantises `count` elements of type `type` (a whole number of blocks) from `blocks` to f32.
// Throws Error for an unsupported type or a count that is not a whole number of blocks.
void dequantize(uint32_t type, const void* blocks, int64_t count, float* out);
// The same, rounded to bf16 (nearest even), through a small f32 buffer: never a whole f32 copy.
void dequantize_to_bf16(uint32_t type, const void* blocks, int64_t count, uint16_t* out);

struct GgufTensorInfo {
  std::string name;                 // "blk.0.attn_q.weight"
  uint32_t type = 0;                // ggml type id (ggml_type_info)
  std::vector<int64_t> ne;          // dimensions, innermost first
  uint64_t offset = 0;              // first byte, relative to the data section
  uint64_t size_bytes = 0;          // bytes the type and dimensions take
  const std::byte* data = nullptr;  // the bytes in the mapping

  int64_t num_elements() const;
  // Row-major dimensions (ne reversed): [ne1, ne0] for a matrix.
  std::vector<int64_t> shape() const;
};

// The largest counts and lengths accepted; beyond them a file is taken as corrupt or hostile
// rather than allocated. Each is also bounded by the bytes left in the file.
inline constexpr uint64_t kMaxGgufStringBytes = uint64_t{1} << 30;
inline constexpr uint32_t kMaxGgufDimensions = 4;
inline constexpr int kMaxGgufArrayNesting = 4;

class GgufFile {
 public:
  // Maps and validates the file: header, every key/value, every tensor info (type known, element
  // count and byte size without overflow, whole blocks, range inside the data section, aligned,
  // not overlapping another). Throws Error naming the file and the key or tensor on any violation.
  explicit GgufFile(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }  // in file order
  const GgufTensorInfo* find_tensor(std::string_view name) const;

  // Typed reads of metadata, naming the file and key in every error. An absent key gives nullopt
  // (or throws "is required" from the require_ forms); a value of the wrong type always throws.
  const GgufValue* find(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;    // any integer type
  std::optional<double> get_number(std::string_view key) const;  // any integer or float type
  std::optional<bool> get_bool(std::string_view key) const;
  // An array of `element` (strings, or numbers when element is kFloat32/kInt32: any numeric type).
  const GgufValue* get_array(std::string_view key, GgufType element) const;
  std::string require_string(std::string_view key) const;
  int64_t require_int(std::string_view key) const;

  [[noreturn]] void fail_key(std::string_view key, const std::string& what) const;

 private:
  MappedFile file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// The Hugging Face name of a GGUF tensor of `architecture` (general.architecture; Gemma's norms
// are named their own way): "blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight";
// nullopt for a name outside the architecture.
std::optional<std::string> gguf_to_hf_tensor_name(std::string_view gguf_name,
                                                  std::string_view architecture = "llama");
// The inverse, for messages about a GGUF checkpoint; a name without a GGUF form is returned as is.
std::string hf_to_gguf_tensor_name(std::string_view hf_name,
                                   std::string_view architecture = "llama");

// The model config a `llama` GGUF file describes (general.architecture, llama.* keys, the
// tokenizer's special ids), with interleaved RoPE: llama.cpp's converter permutes q and k into
// Meta's pairing, so the loader selects the matching RoPE rather than permuting the weights back.
// Throws Error naming the file and key for another architecture, a missing or ill-typed key, or
// an unsupported option.
ModelConfig gguf_model_config(const GgufFile& file);
// The metadata key of ModelConfig::output_token_ids in a GGUF file (an array of int32): the token
// each row of output.weight scores, for a draft with a reduced head.
inline constexpr std::string_view kOutputTokenIdsKey = "specrun.output_token_ids";
// A draft that reads its target's features (ModelConfig::feature_width): their width.
inline constexpr std::string_view kFeatureWidthKey = "specrun.feature_width";

// The tokenizer.json document equivalent to the file's tokenizer.* metadata (`llama`:
// SentencePiece as byte-fallback BPE with merges derived from the scores, as Hugging Face's
// converter derives them; `gpt2`: byte-level BPE with the pre-tokenizer tokenizer.ggml.pre
// names), for text::Tokenizer::from_json. nullopt when the file has no tokenizer.ggml.model.
// Throws Error naming the file and key for an unknown model or pre-tokenizer or malformed arrays.
std::optional<nlohmann::json> gguf_tokenizer_json(const GgufFile& file);

}  // namespace specrun
