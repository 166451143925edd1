// safetensors: reading through mmap with every header field validated before use, sharded
// checkpoints through model.safetensors.index.json, and writing (for the checkpoint generator and
// the tests).
//
// File layout: an 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the data section; offsets are relative to its start.
#pragma once

#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/core/dtype.h"
#include "runtime/base/mapped_file.h"

namespace specrun {

class GgufFile;

// The largest header accepted, as in the reference implementation: a header beyond this is taken
// as a corrupt or hostile file rather than allocated.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// The most tensors one safetensors file may list. The largest published checkpoints hold a few
// thousand tensors per file; a million is far beyond them and still bounds what a hostile header
// can make the loader allocate per entry.
inline constexpr size_t kMaxSafetensorsTensors = 1'000'000;

struct TensorInfo {
  std::string name;            // "model.layers.0.self_attn.q_proj.weight"
  DType dtype;                 // stored dtype
  std::vector<int64_t> shape;  // row-major dimensions
  uint64_t begin;              // first byte in the data section
  uint64_t end;                // one past the last byte
  const void* data;            // the bytes, aligned for dtype
  std::filesystem::path file;  // the file holding it

  int64_t num_elements() const;
  // Bytes at `data`: end - begin, but for a GGUF tensor dequantised to bf16 at load, whose begin
  // and end still delimit its quantized bytes in the file.
  uint64_t size_bytes() const { return dtype_bytes(dtype, static_cast<uint64_t>(num_elements())); }
};

// "[4096, 4096]"
std::string shape_to_string(std::span<const int64_t> shape);

class SafetensorsFile {
 public:
  // Maps and validates the file; throws Error naming the file (and tensor) on any violation.
  explicit SafetensorsFile(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return file_.path(); }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by name
  const TensorInfo* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  MappedFile file_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  // Copies of tensors whose bytes in the file are not aligned for their dtype.
  std::vector<std::unique_ptr<std::byte[]>> aligned_copies_;
};

// Every tensor of a checkpoint: one safetensors file, the shards named by an index, or one GGUF
// file.
class TensorStore {
 public:
  // A single .safetensors file.
  static TensorStore open_file(const std::filesystem::path& path);
  // model.safetensors.index.json: every shard it names is opened, every tensor it lists must be in
  // its shard and every tensor of a shard must be listed.
  static TensorStore open_index(const std::filesystem::path& index_path);
  // A GGUF file (runtime/model/gguf.h), every header check passed: tensors under their Hugging
  // Face names (gguf_to_hf_tensor_name; a name outside the architecture is kept, for the binder to
  // refuse), with row-major shapes. F32, F16 and BF16 tensors stay in the mapping; quantized ones
  // are dequantised to bf16, one tensor at a time. A type that cannot be dequantised is an Error
  // naming the tensor.
  static TensorStore open_gguf(const std::filesystem::path& path);

  // A multimodal checkpoint's text model (Gemma3ForConditionalGeneration): the language model's
  // tensors under the names of the text-only architecture ("language_model.model.X", as the Hub's
  // files and transformers write it, or "model.language_model.X", as transformers 4.5x wrote it,
  // become "model.X"; "language_model.lm_head.weight" becomes "lm_head.weight"), and the vision
  // tower's and the projector's tensors dropped, never read. Returns how many were dropped.
  int64_t keep_text_model();

  const TensorInfo* find(std::string_view name) const;
  // Every tensor, sorted by name.
  std::vector<const TensorInfo*> all() const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  // The GGUF file behind the store; nullptr for safetensors.
  const GgufFile* gguf() const { return gguf_.get(); }
  // Frees the bytes dequantised or realigned at load that start at `data`, once their user has its
  // own copy (a backend's laid-out weights); the tensor's data becomes null. False, and nothing
  // freed, when `data` is not such bytes (a mapping's are the page cache's to drop).
  bool release_converted(const void* data);

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::shared_ptr<const GgufFile> gguf_;
  std::vector<TensorInfo> gguf_tensors_;                 // a GGUF file's tensors, sized once
  std::vector<std::unique_ptr<std::byte[]>> converted_;  // dequantised or realigned bytes
  std::map<std::string, const TensorInfo*, std::less<>> by_name_;
  std::deque<TensorInfo> renamed_;  // keep_text_model's tensors under their new names
};

// A multimodal checkpoint's tensor or module name as its text model names it:
// "language_model.model.X" (the Hub's files, transformers 5) and "model.language_model.X"
// (transformers 4.5x) are "model.X", "language_model.lm_head" and what follows it "lm_head" and
// the same; nullopt for a name outside the language model.
std::optional<std::string> multimodal_text_name(std::string_view name);

struct TensorToWrite {
  std::string name;                  // tensor name
  DType dtype;                       // stored dtype
  std::vector<int64_t> shape;        // dimensions
  std::span<const std::byte> bytes;  // num_elements * dtype_size bytes
};

// Writes a well-formed file: header padded with spaces to 8 bytes, tensors packed in the given
// order. Throws Error on I/O failure or a byte count that does not match the shape.
void write_safetensors(const std::filesystem::path& path, std::span<const TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace specrun
