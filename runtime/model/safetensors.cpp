#include "runtime/model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/base/check.h"
#include "runtime/base/json.h"
#include "runtime/model/tensor_checks.h"

namespace specrun {
namespace {

using nlohmann::json;

// Dtypes a valid safetensors file may carry but specrun does not compute in.
constexpr std::string_view kKnownUnsupportedDtypes[] = {"F64", "I64", "I32", "I16",  "U64",
                                                        "U32", "U16", "U8",  "BOOL", "F8_E5M2"};

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what) {
  throw Error(path.string() + ": " + what);
}

[[noreturn]] void fail_tensor(const std::filesystem::path& path, const std::string& tensor,
                              const std::string& what) {
  throw Error(path.string() + ": tensor '" + tensor + "': " + what);
}

uint64_t read_le64(const std::byte* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(bytes[i]);
  return value;
}

// Parses the header JSON, rejecting duplicate tensor names (a JSON parser would silently keep one)
// and more tensors than the limit as their keys are read.
json parse_header(const std::filesystem::path& path, const char* text, size_t length) {
  size_t tensors = 0;
  const json header =
      parse_json(std::string_view(text, length), path.string() + ": header",
                 [&](const std::string& key, const json& object) {
                   if (object.contains(key)) fail_tensor(path, key, "appears twice in the header");
                   if (key != "__metadata__" && ++tensors > kMaxSafetensorsTensors) {
                     fail(path, "header lists more than " + std::to_string(kMaxSafetensorsTensors) +
                                    " tensors, the limit");
                   }
                 });
  if (!header.is_object()) fail(path, "header is not a JSON object");
  return header;
}

std::map<std::string, std::string> parse_metadata(const std::filesystem::path& path,
                                                  const json& value) {
  if (!value.is_object()) fail(path, "__metadata__ is not an object of strings");
  std::map<std::string, std::string> metadata;
  for (const auto& [key, entry] : value.items()) {
    if (!entry.is_string()) fail(path, "__metadata__ key '" + key + "' is not a string");
    metadata[key] = entry.get<std::string>();
  }
  return metadata;
}

TensorInfo parse_entry(const std::filesystem::path& path, const std::string& name,
                       const json& entry, uint64_t data_size) {
  if (!entry.is_object()) fail_tensor(path, name, "entry is not an object");
  const auto dtype_field = entry.find("dtype");
  if (dtype_field == entry.end() || !dtype_field->is_string()) {
    fail_tensor(path, name, "missing or non-string 'dtype'");
  }
  const std::string dtype_text = dtype_field->get<std::string>();
  const std::optional<DType> dtype = parse_dtype(dtype_text);
  if (!dtype) {
    const bool known =
        std::find(std::begin(kKnownUnsupportedDtypes), std::end(kKnownUnsupportedDtypes),
                  dtype_text) != std::end(kKnownUnsupportedDtypes);
    fail_tensor(path, name,
                known ? "dtype '" + dtype_text +
                            "' is not supported (F32, F16, BF16; F8_E4M3 and I8 for quantized "
                            "linear weights)"
                      : "unknown dtype '" + dtype_text + "'");
  }

  const auto shape_field = entry.find("shape");
  if (shape_field == entry.end() || !shape_field->is_array()) {
    fail_tensor(path, name, "missing or non-array 'shape'");
  }
  TensorInfo info{name, *dtype, {}, 0, 0, nullptr, path};
  std::vector<uint64_t> extents;
  for (const json& dimension : *shape_field) {
    if (!dimension.is_number_unsigned()) {
      fail_tensor(
          path, name,
          "shape has an entry that is not a non-negative integer: " + json_excerpt(dimension));
    }
    extents.push_back(dimension.get<uint64_t>());
    info.shape.push_back(static_cast<int64_t>(extents.back()));
  }
  const std::optional<uint64_t> byte_count = checked_byte_count(extents, dtype_size(*dtype));
  if (!byte_count) fail_tensor(path, name, "shape " + json_excerpt(*shape_field) + " overflows");
  const uint64_t expected_bytes = *byte_count;

  const auto offsets_field = entry.find("data_offsets");
  if (offsets_field == entry.end() || !offsets_field->is_array() || offsets_field->size() != 2 ||
      !(*offsets_field)[0].is_number_unsigned() || !(*offsets_field)[1].is_number_unsigned()) {
    fail_tensor(path, name, "'data_offsets' must be two non-negative integers");
  }
  info.begin = (*offsets_field)[0].get<uint64_t>();
  info.end = (*offsets_field)[1].get<uint64_t>();
  if (info.begin > info.end) {
    fail_tensor(path, name,
                "data_offsets " + json_excerpt(*offsets_field) + " end before they begin");
  }
  if (info.end > data_size) {
    fail_tensor(path, name,
                "data_offsets " + json_excerpt(*offsets_field) + " run past the data section (" +
                    std::to_string(data_size) + " bytes)");
  }
  if (info.end - info.begin != expected_bytes) {
    fail_tensor(path, name,
                "shape " + shape_to_string(info.shape) + " of " + dtype_text + " needs " +
                    std::to_string(expected_bytes) + " bytes but data_offsets cover " +
                    std::to_string(info.end - info.begin));
  }
  return info;
}

}  // namespace

int64_t TensorInfo::num_elements() const {
  int64_t count = 1;
  for (const int64_t extent : shape) count *= extent;
  return count;
}

std::string shape_to_string(std::span<const int64_t> shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i != 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : file_(path) {
  const size_t file_size = file_.size();
  if (file_size < 8) {
    fail(path, "file is " + std::to_string(file_size) +
                   " bytes, too short for a safetensors header length");
  }
  const uint64_t header_length = read_le64(file_.data());
  if (header_length > kMaxSafetensorsHeaderBytes) {
    fail(path, "header length " + std::to_string(header_length) + " exceeds the limit of " +
                   std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  }
  if (header_length > file_size - 8) {
    fail(path, "header length " + std::to_string(header_length) +
                   " runs past the end of the file (" + std::to_string(file_size) + " bytes)");
  }
  const json header = parse_header(path, reinterpret_cast<const char*>(file_.data() + 8),
                                   static_cast<size_t>(header_length));

  const std::byte* data_section = file_.data() + 8 + header_length;
  const uint64_t data_size = file_size - 8 - header_length;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      metadata_ = parse_metadata(path, entry);
      continue;
    }
    tensors_.push_back(parse_entry(path, name, entry, data_size));
  }

  std::vector<TensorByteRange> ranges;
  for (const TensorInfo& info : tensors_) ranges.push_back({&info.name, info.begin, info.end});
  if (const auto overlap = find_overlap(std::move(ranges))) {
    const auto& [current, earlier] = *overlap;
    fail_tensor(path, *current.name,
                "bytes " + byte_range_to_string(current.begin, current.end) + " overlap tensor '" +
                    *earlier.name + "' " + byte_range_to_string(earlier.begin, earlier.end));
  }

  std::sort(tensors_.begin(), tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  for (TensorInfo& info : tensors_) {
    const std::byte* bytes = data_section + info.begin;
    const size_t alignment = dtype_size(info.dtype);
    if (reinterpret_cast<uintptr_t>(bytes) % alignment == 0) {
      info.data = bytes;
    } else {
      // Writers pad the header to 8 bytes, but the format does not require it.
      auto copy = std::make_unique<std::byte[]>(info.size_bytes());
      std::memcpy(copy.get(), bytes, info.size_bytes());
      info.data = copy.get();
      aligned_copies_.push_back(std::move(copy));
    }
  }
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = std::lower_bound(
      tensors_.begin(), tensors_.end(), name,
      [](const TensorInfo& info, std::string_view key) { return info.name < key; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

TensorStore TensorStore::open_file(const std::filesystem::path& path) {
  TensorStore store;
  store.files_.push_back(std::make_unique<SafetensorsFile>(path));
  for (const TensorInfo& info : store.files_.back()->tensors()) store.by_name_[info.name] = &info;
  return store;
}

TensorStore TensorStore::open_index(const std::filesystem::path& index_path) {
  json index;
  {
    const MappedFile file(index_path);
    index = parse_json(file.text(), index_path.string());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    fail(index_path, "no 'weight_map' object");
  }
  // tensor name -> shard file name, and each shard's tensors.
  std::map<std::string, std::string> shard_of;
  std::map<std::string, std::vector<std::string>> tensors_of_shard;
  for (const auto& [tensor, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) fail(index_path, "weight_map entry '" + tensor + "' is not a string");
    const std::string file = shard.get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      fail(index_path, "weight_map entry '" + tensor + "' names '" + file +
                           "', which is not a file name beside the index");
    }
    shard_of[tensor] = file;
    tensors_of_shard[file].push_back(tensor);
  }
  if (shard_of.empty()) fail(index_path, "weight_map is empty");

  TensorStore store;
  const std::filesystem::path directory = index_path.parent_path();
  for (const auto& [file, tensors] : tensors_of_shard) {
    store.files_.push_back(std::make_unique<SafetensorsFile>(directory / file));
    const SafetensorsFile& shard = *store.files_.back();
    for (const std::string& tensor : tensors) {
      const TensorInfo* info = shard.find(tensor);
      if (info == nullptr) {
        fail(index_path, "lists tensor '" + tensor + "' in " + file + ", which does not hold it");
      }
      store.by_name_[tensor] = info;
    }
    for (const TensorInfo& info : shard.tensors()) {
      const auto listed = shard_of.find(info.name);
      if (listed == shard_of.end() || listed->second != file) {
        fail_tensor(shard.path(), info.name,
                    "is not listed for this shard in " + index_path.filename().string());
      }
    }
  }
  return store;
}

bool TensorStore::release_converted(const void* data) {
  const auto held = std::find_if(converted_.begin(), converted_.end(),
                                 [&](const std::unique_ptr<std::byte[]>& bytes) {
                                   return static_cast<const void*>(bytes.get()) == data;
                                 });
  if (held == converted_.end()) return false;
  for (TensorInfo& info : gguf_tensors_) {
    if (info.data == data) info.data = nullptr;
  }
  converted_.erase(held);
  return true;
}

std::optional<std::string> multimodal_text_name(std::string_view name) {
  static constexpr std::pair<std::string_view, std::string_view> kRenamed[] = {
      {"language_model.model.", "model."},
      {"model.language_model.", "model."},
      {"language_model.lm_head", "lm_head"},
  };
  for (const auto& [prefix, text] : kRenamed) {
    if (name.substr(0, prefix.size()) != prefix) continue;
    const std::string_view rest = name.substr(prefix.size());
    if (prefix.back() != '.' && !rest.empty() && rest.front() != '.') continue;
    return std::string(text) + std::string(rest);
  }
  return std::nullopt;
}

int64_t TensorStore::keep_text_model() {
  static constexpr std::string_view kDropped[] = {"vision_tower.", "multi_modal_projector.",
                                                  "model.vision_tower.",
                                                  "model.multi_modal_projector."};
  std::map<std::string, const TensorInfo*, std::less<>> kept;
  std::map<std::string, std::string> kept_from;  // each kept name's name in the file
  int64_t dropped = 0;
  for (const auto& tensor : by_name_) {
    const std::string& name = tensor.first;  // named, not bound: lambdas below capture it
    const TensorInfo* info = tensor.second;
    if (std::any_of(std::begin(kDropped), std::end(kDropped), [&](std::string_view prefix) {
          return std::string_view(name).substr(0, prefix.size()) == prefix;
        })) {
      ++dropped;
      continue;
    }
    // A name outside the language model stays the file's own: the binder refuses what it does not
    // know.
    const TensorInfo* entry = info;
    if (std::optional<std::string> text_name = multimodal_text_name(name)) {
      TensorInfo& renamed = renamed_.emplace_back(*info);
      renamed.name = std::move(*text_name);
      entry = &renamed;
    }
    if (!kept.emplace(entry->name, entry).second) {
      fail(info->file, "tensors '" + kept_from[entry->name] + "' and '" + name +
                           "' are both the text model's '" + entry->name + "'");
    }
    kept_from[entry->name] = name;
  }
  by_name_ = std::move(kept);
  return dropped;
}

const TensorInfo* TensorStore::find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<const TensorInfo*> TensorStore::all() const {
  std::vector<const TensorInfo*> result;
  result.reserve(by_name_.size());
  for (const auto& [name, info] : by_name_) result.push_back(info);
  return result;
}

void write_safetensors(const std::filesystem::path& path, std::span<const TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite& tensor : tensors) {
    uint64_t elements = 1;
    for (const int64_t extent : tensor.shape) elements *= static_cast<uint64_t>(extent);
    if (elements * dtype_size(tensor.dtype) != tensor.bytes.size()) {
      throw Error(path.string() + ": tensor '" + tensor.name +
                  "': " + std::to_string(tensor.bytes.size()) + " bytes do not match shape " +
                  shape_to_string(tensor.shape));
    }
    header[tensor.name] = {{"dtype", std::string(dtype_name(tensor.dtype))},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + tensor.bytes.size()}}};
    offset += tensor.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  if (!stream) throw Error(path.string() + ": cannot create");
  const uint64_t length = text.size();
  char length_bytes[8];
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  stream.write(length_bytes, 8);
  stream.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const TensorToWrite& tensor : tensors) {
    stream.write(reinterpret_cast<const char*>(tensor.bytes.data()),
                 static_cast<std::streamsize>(tensor.bytes.size()));
  }
  stream.flush();
  if (!stream) throw Error(path.string() + ": write failed");
}

}  // namespace specrun
