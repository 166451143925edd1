#include "runtime/model/gguf.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>

#include "runtime/model/tensor_checks.h"
#include "specrun/error.hpp"

namespace specrun {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read little-endian
constexpr uint64_t kDefaultAlignment = 32;

// Every type ggml numbers, with its block geometry (gguf-py's GGML_QUANT_SIZES). Numbers ggml has
// retired (4, 5, 31-33, 36-38) are absent on purpose.
constexpr GgmlTypeInfo kGgmlTypes[] = {
    {0, "F32", 1, 4, true},          {1, "F16", 1, 2, true},
    {2, "Q4_0", 32, 18, true},       {3, "Q4_1", 32, 20, true},
    {6, "Q5_0", 32, 22, true},       {7, "Q5_1", 32, 24, true},
    {8, "Q8_0", 32, 34, true},       {9, "Q8_1", 32, 40, false},
    {10, "Q2_K", 256, 84, false},    {11, "Q3_K", 256, 110, false},
    {12, "Q4_K", 256, 144, true},    {13, "Q5_K", 256, 176, true},
    {14, "Q6_K", 256, 210, true},    {15, "Q8_K", 256, 292, false},
    {16, "IQ2_XXS", 256, 66, false}, {17, "IQ2_XS", 256, 74, false},
    {18, "IQ3_XXS", 256, 98, false}, {19, "IQ1_S", 256, 50, false},
    {20, "IQ4_NL", 32, 18, false},   {21, "IQ3_S", 256, 110, false},
    {22, "IQ2_S", 256, 82, false},   {23, "IQ4_XS", 256, 136, false},
    {24, "I8", 1, 1, false},         {25, "I16", 1, 2, false},
    {26, "I32", 1, 4, false},        {27, "I64", 1, 8, false},
    {28, "F64", 1, 8, false},        {29, "IQ1_M", 256, 56, false},
    {30, "BF16", 1, 2, true},        {34, "TQ1_0", 256, 54, false},
    {35, "TQ2_0", 256, 66, false},   {39, "MXFP4", 32, 17, false},
};

// Reads the header region of the mapping with a cursor, every read bounded by the file size, and
// every failure naming the file, what was being read and the byte offset.
class Cursor {
 public:
  Cursor(const MappedFile& file) : file_(file) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(file_.path().string() + ": " + what);
  }

  uint64_t offset() const { return offset_; }
  uint64_t left() const { return file_.size() - offset_; }

  void need(uint64_t bytes, const std::string& what) const {
    if (bytes > left()) {
      fail("truncated: " + what + " needs " + std::to_string(bytes) + " bytes at offset " +
           std::to_string(offset_) + ", the file has " + std::to_string(left()) + " left");
    }
  }

  template <typename T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, file_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }

  std::string read_string(const std::string& what) {
    const uint64_t length = read<uint64_t>(what + " length");
    if (length > kMaxGgufStringBytes) {
      fail(what + ": string length " + std::to_string(length) + " exceeds the limit of " +
           std::to_string(kMaxGgufStringBytes) + " bytes");
    }
    need(length, what);
    std::string text(reinterpret_cast<const char*>(file_.data() + offset_),
                     static_cast<size_t>(length));
    offset_ += length;
    return text;
  }

 private:
  const MappedFile& file_;
  uint64_t offset_ = 0;
};

// The fewest bytes one value of `type` takes in the file: bounds array counts by the bytes left.
uint64_t min_value_bytes(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kString:
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    case GgufType::kArray:
      return 12;  // element type and count
  }
  return 1;
}

bool is_known_type(uint32_t type) {
  return type <= static_cast<uint32_t>(GgufType::kFloat64);
}

GgufValue read_value(Cursor& cursor, GgufType type, const std::string& key, int depth) {
  GgufValue value;
  value.type = type;
  switch (type) {
    case GgufType::kUint8:
      value.bits = cursor.read<uint8_t>(key);
      break;
    case GgufType::kInt8:
      value.bits = static_cast<uint64_t>(static_cast<int64_t>(cursor.read<int8_t>(key)));
      break;
    case GgufType::kUint16:
      value.bits = cursor.read<uint16_t>(key);
      break;
    case GgufType::kInt16:
      value.bits = static_cast<uint64_t>(static_cast<int64_t>(cursor.read<int16_t>(key)));
      break;
    case GgufType::kUint32:
      value.bits = cursor.read<uint32_t>(key);
      break;
    case GgufType::kInt32:
      value.bits = static_cast<uint64_t>(static_cast<int64_t>(cursor.read<int32_t>(key)));
      break;
    case GgufType::kUint64:
      value.bits = cursor.read<uint64_t>(key);
      break;
    case GgufType::kInt64:
      value.bits = cursor.read<uint64_t>(key);
      break;
    case GgufType::kFloat32:
      value.number = cursor.read<float>(key);
      break;
    case GgufType::kFloat64:
      value.number = cursor.read<double>(key);
      break;
    case GgufType::kBool: {
      const uint8_t byte = cursor.read<uint8_t>(key);
      if (byte > 1) cursor.fail("key '" + key + "': bool value " + std::to_string(byte));
      value.bits = byte;
      break;
    }
    case GgufType::kString:
      value.string = cursor.read_string("key '" + key + "' value");
      break;
    case GgufType::kArray: {
      const uint32_t element = cursor.read<uint32_t>("key '" + key + "' array type");
      if (!is_known_type(element)) {
        cursor.fail("key '" + key + "': unknown array element type " + std::to_string(element));
      }
      value.element_type = static_cast<GgufType>(element);
      if (value.element_type == GgufType::kArray && depth + 1 >= kMaxGgufArrayNesting) {
        cursor.fail("key '" + key + "': arrays nested deeper than " +
                    std::to_string(kMaxGgufArrayNesting));
      }
      const uint64_t count = cursor.read<uint64_t>("key '" + key + "' array length");
      if (count > cursor.left() / min_value_bytes(value.element_type)) {
        cursor.fail("key '" + key + "': array of " + std::to_string(count) + " " +
                    gguf_type_name(value.element_type) + " values cannot fit in the " +
                    std::to_string(cursor.left()) + " bytes left");
      }
      value.array.reserve(static_cast<size_t>(count));
      for (uint64_t i = 0; i < count; ++i) {
        value.array.push_back(read_value(cursor, value.element_type, key, depth + 1));
      }
      break;
    }
  }
  return value;
}

}  // namespace

std::string supported_type_names() {
  std::string names;
  for (const GgmlTypeInfo& info : kGgmlTypes) {
    if (!info.supported) continue;
    names += (names.empty() ? "" : ", ") + std::string(info.name);
  }
  return names;
}

std::string gguf_type_name(GgufType type) {
  static constexpr std::array<std::string_view, 13> kNames = {
      "uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
      "bool",  "string", "array",  "uint64", "int64",  "float64"};
  const auto index = static_cast<uint32_t>(type);
  return index < kNames.size() ? std::string(kNames[index]) : "type " + std::to_string(index);
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kUint16:
    case GgufType::kInt16:
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kUint64:
    case GgufType::kInt64:
      return true;
    default:
      return false;
  }
}

const GgmlTypeInfo* ggml_type_info(uint32_t id) {
  for (const GgmlTypeInfo& info : kGgmlTypes) {
    if (info.id == id) return &info;
  }
  return nullptr;
}

int64_t GgufTensorInfo::num_elements() const {
  int64_t count = 1;
  for (const int64_t extent : ne) count *= extent;
  return count;
}

std::vector<int64_t> GgufTensorInfo::shape() const {
  return {ne.rbegin(), ne.rend()};
}

GgufFile::GgufFile(const std::filesystem::path& path) : file_(path) {
  Cursor cursor(file_);
  const uint32_t magic = cursor.read<uint32_t>("the magic number");
  if (magic != kGgufMagic) {
    char text[4];
    std::memcpy(text, &magic, 4);
    std::string shown;
    for (const char c : text) shown += (c >= 32 && c < 127) ? c : '?';
    cursor.fail("not a GGUF file (magic '" + shown + "', expected 'GGUF')");
  }
  version_ = cursor.read<uint32_t>("the version");
  // Version 1 counted with uint32; 2 and 3 share one layout (3 only allows big-endian files,
  // which announce themselves by a byte-swapped version and are refused here).
  if (version_ != 2 && version_ != 3) {
    cursor.fail("GGUF version " + std::to_string(version_) + " is not supported (2 or 3)");
  }
  const uint64_t tensor_count = cursor.read<uint64_t>("the tensor count");
  const uint64_t kv_count = cursor.read<uint64_t>("the metadata count");
  // A key/value takes at least 8 + 4 + 1 bytes, a tensor info 8 + 4 + 4 + 8. A count is checked
  // against the bytes left once its first entry has been read, so that a first entry that is
  // itself impossible (a key length of 2^62) is the error named.
  const auto check_count = [&](uint64_t count, uint64_t read, uint64_t entry_bytes,
                               const char* what) {
    if (count - read > cursor.left() / entry_bytes) {
      cursor.fail(std::string(what) + " count " + std::to_string(count) +
                  " cannot fit in the file");
    }
  };
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key = cursor.read_string("metadata key " + std::to_string(i));
    const uint32_t type = cursor.read<uint32_t>("key '" + key + "' type");
    if (!is_known_type(type)) {
      cursor.fail("key '" + key + "': unknown value type " + std::to_string(type));
    }
    GgufValue value = read_value(cursor, static_cast<GgufType>(type), key, 0);
    if (metadata_.count(key) != 0) cursor.fail("key '" + key + "' appears twice");
    metadata_.emplace(std::move(key), std::move(value));
    if (i == 0) check_count(kv_count, 1, 13, "metadata");
  }
  if (const GgufValue* alignment = find("general.alignment")) {
    if (alignment->type != GgufType::kUint32) {
      fail_key("general.alignment", "must be a uint32, got " + gguf_type_name(alignment->type));
    }
    if (alignment->bits == 0 || !std::has_single_bit(alignment->bits)) {
      fail_key("general.alignment",
               "must be a power of two, got " + std::to_string(alignment->bits));
    }
    alignment_ = alignment->bits;
  } else {
    alignment_ = kDefaultAlignment;
  }

  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo info;
    info.name = cursor.read_string("tensor " + std::to_string(i) + " name");
    if (i == 0) {
      check_count(tensor_count, 0, 24, "tensor");
      tensors_.reserve(static_cast<size_t>(tensor_count));
    }
    const std::string what = "tensor '" + info.name + "'";
    const uint32_t dims = cursor.read<uint32_t>(what + " dimension count");
    if (dims == 0 || dims > kMaxGgufDimensions) {
      cursor.fail(what + ": " + std::to_string(dims) + " dimensions (1 to " +
                  std::to_string(kMaxGgufDimensions) + " allowed)");
    }
    std::vector<uint64_t> extents;
    for (uint32_t d = 0; d < dims; ++d) {
      extents.push_back(cursor.read<uint64_t>(what + " dimensions"));
      info.ne.push_back(static_cast<int64_t>(extents.back()));
    }
    std::string ne_text = "ne [";
    for (size_t d = 0; d < extents.size(); ++d) {
      ne_text += (d ? ", " : "") + std::to_string(extents[d]);
    }
    ne_text += "]";
    const std::optional<uint64_t> count = checked_byte_count(extents);
    if (!count) cursor.fail(what + ": " + ne_text + " overflows");
    const uint64_t elements = *count;
    info.type = cursor.read<uint32_t>(what + " type");
    const GgmlTypeInfo* type = ggml_type_info(info.type);
    if (type == nullptr) cursor.fail(what + ": unknown ggml type " + std::to_string(info.type));
    if (info.ne[0] % type->block_elements != 0) {
      cursor.fail(what + ": " + std::string(type->name) + " stores blocks of " +
                  std::to_string(type->block_elements) + " elements along ne[0], but " + ne_text +
                  " is not a whole number of blocks");
    }
    if (__builtin_mul_overflow(elements / static_cast<uint64_t>(type->block_elements),
                               static_cast<uint64_t>(type->block_bytes), &info.size_bytes)) {
      cursor.fail(what + ": " + ne_text + " of " + std::string(type->name) + " overflows");
    }
    info.offset = cursor.read<uint64_t>(what + " offset");
    if (info.offset % alignment_ != 0) {
      cursor.fail(what + ": offset " + std::to_string(info.offset) +
                  " is not a multiple of the alignment " + std::to_string(alignment_));
    }
    if (tensor_index_.count(info.name) != 0) cursor.fail(what + " appears twice");
    tensor_index_[info.name] = tensors_.size();
    tensors_.push_back(std::move(info));
  }

  // The data section starts at the next multiple of the alignment (the end, for a file without
  // tensors).
  const uint64_t header_end = cursor.offset();
  const uint64_t data_start = (header_end + alignment_ - 1) / alignment_ * alignment_;
  const uint64_t file_size = file_.size();
  if (!tensors_.empty() && data_start > file_size) {
    cursor.fail("truncated: the data section would start at " + std::to_string(data_start) +
                ", past the end of the file (" + std::to_string(file_size) + " bytes)");
  }
  const uint64_t data_size = data_start <= file_size ? file_size - data_start : 0;
  for (GgufTensorInfo& info : tensors_) {
    if (info.offset > data_size || info.size_bytes > data_size - info.offset) {
      cursor.fail("tensor '" + info.name + "': bytes " +
                  byte_range_to_string(info.offset, info.offset + info.size_bytes) +
                  " of the data section run past its end (" + std::to_string(data_size) +
                  " bytes; the file may be truncated)");
    }
    info.data = file_.data() + data_start + info.offset;
  }
  std::vector<TensorByteRange> ranges;
  for (const GgufTensorInfo& info : tensors_) {
    ranges.push_back({&info.name, info.offset, info.offset + info.size_bytes});
  }
  if (const auto overlap = find_overlap(std::move(ranges))) {
    const auto& [current, earlier] = *overlap;
    cursor.fail("tensor '" + *current.name + "': bytes " +
                byte_range_to_string(current.begin, current.end) + " overlap tensor '" +
                *earlier.name + "' " + byte_range_to_string(earlier.begin, earlier.end));
  }
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void GgufFile::fail_key(std::string_view key, const std::string& what) const {
  throw Error(path().string() + ": key '" + std::string(key) + "' " + what);
}

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return std::nullopt;
  if (value->type != GgufType::kString) {
    fail_key(key, "must be a string, got " + gguf_type_name(value->type));
  }
  return value->string;
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_integer()) fail_key(key, "must be an integer, got " + gguf_type_name(value->type));
  if (value->type == GgufType::kUint64 && value->bits > static_cast<uint64_t>(INT64_MAX)) {
    fail_key(key, "holds " + std::to_string(value->bits) + ", out of range");
  }
  return static_cast<int64_t>(value->bits);
}

std::optional<double> GgufFile::get_number(std::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return std::nullopt;
  if (value->type == GgufType::kFloat32 || value->type == GgufType::kFloat64) return value->number;
  return static_cast<double>(*get_int(key));
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return std::nullopt;
  if (value->type != GgufType::kBool) {
    fail_key(key, "must be a bool, got " + gguf_type_name(value->type));
  }
  return value->bits != 0;
}

const GgufValue* GgufFile::get_array(std::string_view key, GgufType element) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return nullptr;
  const bool numeric_wanted = element != GgufType::kString;
  GgufValue probe;
  probe.type = value->element_type;
  const bool numeric = probe.is_integer() || value->element_type == GgufType::kFloat32 ||
                       value->element_type == GgufType::kFloat64;
  if (value->type != GgufType::kArray ||
      (numeric_wanted ? !numeric : value->element_type != GgufType::kString)) {
    fail_key(
        key,
        "must be an array of " + std::string(numeric_wanted ? "numbers" : "strings") + ", got " +
            (value->type == GgufType::kArray ? "an array of " + gguf_type_name(value->element_type)
                                             : gguf_type_name(value->type)));
  }
  return value;
}

std::string GgufFile::require_string(std::string_view key) const {
  const std::optional<std::string> value = get_string(key);
  if (!value) fail_key(key, "is required");
  return *value;
}

int64_t GgufFile::require_int(std::string_view key) const {
  const std::optional<int64_t> value = get_int(key);
  if (!value) fail_key(key, "is required");
  return *value;
}

// ---- dequantisation --------------------------------------------------------------------------
// Block layouts as ggml defines them (ggml-common.h); d and m are f16.

namespace {

uint16_t load_u16(const uint8_t* bytes) {
  return static_cast<uint16_t>(bytes[0] | bytes[1] << 8);
}

// Q4_0, Q4_1 and Q8_0 are specrun's own block dtypes too (kernels/core/dtype.h, which defines
// their bits once).
void dequantize_q4_0(const uint8_t* block, float* out) {
  dequantize_block(block, DType::kQ4_0, out);
}
void dequantize_q4_1(const uint8_t* block, float* out) {
  dequantize_block(block, DType::kQ4_1, out);
}

// A little-endian 32-bit word (Q5_0 and Q5_1's fifth bits).
uint32_t load_u32(const uint8_t* bytes) {
  return static_cast<uint32_t>(bytes[0]) | static_cast<uint32_t>(bytes[1]) << 8 |
         static_cast<uint32_t>(bytes[2]) << 16 | static_cast<uint32_t>(bytes[3]) << 24;
}

// Q5_0 and Q5_1's 5-bit values: the low four bits in qs as Q4_0 lays them (elements 0-15 in the
// low nibbles, 16-31 in the high), the fifth as bit j of the little-endian qh.
void five_bit_values(const uint8_t* qh_bytes, const uint8_t* qs, int* values) {
  const uint32_t qh = load_u32(qh_bytes);
  for (int j = 0; j < 16; ++j) {
    values[j] = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) << 4) & 0x10);
    values[j + 16] = (qs[j] >> 4) | static_cast<int>((qh >> (j + 12)) & 0x10);
  }
}

// Q5_0: {d, qh[4], qs[16]}: x = (q - 16) * d.
void dequantize_q5_0(const uint8_t* block, float* out) {
  const float d = block_f16(block, 0);
  int q[32];
  five_bit_values(block + 2, block + 6, q);
  for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(q[j] - 16) * d;
}

// Q5_1: {d, m, qh[4], qs[16]}: x = q * d + m.
void dequantize_q5_1(const uint8_t* block, float* out) {
  const float d = block_f16(block, 0);
  const float m = block_f16(block, 2);
  int q[32];
  five_bit_values(block + 4, block + 8, q);
  for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(q[j]) * d + m;
}

void dequantize_q8_0(const uint8_t* block, float* out) {
  dequantize_block(block, DType::kQ8_0, out);
}

// Q4_K's 6-bit scale and min of sub-block j (of 8), packed in 12 bytes.
void scale_min_k4(int j, const uint8_t* q, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_K: {d, dmin, scales[12], qs[128]}: 256 elements in 8 sub-blocks of 32, each with its own
// 6-bit scale and min; x = d * scale * nibble - dmin * min. Q5_K: {d, dmin, scales[12], qh[32],
// qs[128]}, the same with a fifth bit per element in qh (bit 2i of qh[l] for the low nibbles of
// pass i, bit 2i + 1 for the high ones); `qh` is null for Q4_K.
void dequantize_k4_or_k5(const uint8_t* block, const uint8_t* qh, const uint8_t* q, float* out) {
  const float d = block_f16(block, 0);
  const float dmin = block_f16(block, 2);
  const uint8_t* scales = block + 4;
  int is = 0;
  for (int pass = 0; pass < 4; ++pass) {
    uint8_t sc = 0;
    uint8_t m = 0;
    scale_min_k4(is, scales, &sc, &m);
    const float d1 = d * sc;
    const float m1 = dmin * m;
    scale_min_k4(is + 1, scales, &sc, &m);
    const float d2 = d * sc;
    const float m2 = dmin * m;
    const auto fifth = [&](int l, int bit) {
      return qh != nullptr && (qh[l] >> (2 * pass + bit)) & 1 ? 16 : 0;
    };
    for (int l = 0; l < 32; ++l) {
      *out++ = d1 * static_cast<float>((q[l] & 0x0f) + fifth(l, 0)) - m1;
    }
    for (int l = 0; l < 32; ++l) *out++ = d2 * static_cast<float>((q[l] >> 4) + fifth(l, 1)) - m2;
    q += 32;
    is += 2;
  }
}

void dequantize_q4_k(const uint8_t* block, float* out) {
  dequantize_k4_or_k5(block, nullptr, block + 16, out);
}
void dequantize_q5_k(const uint8_t* block, float* out) {
  dequantize_k4_or_k5(block, block + 16, block + 48, out);
}

// Q6_K: {ql[128], qh[64], int8 scales[16], d}: 6-bit values (low 4 bits in ql, high 2 in qh)
// minus 32, in 16 sub-blocks of 16 with an 8-bit scale each.
void dequantize_q6_k(const uint8_t* block, float* out) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(block + 192);
  const float d = block_f16(block, 208);
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      out[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      out[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      out[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      out[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
    out += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

void dequantize_f32(const uint8_t* block, float* out) {
  std::memcpy(out, block, 4);
}
void dequantize_f16(const uint8_t* block, float* out) {
  *out = block_f16(block, 0);
}
void dequantize_bf16(const uint8_t* block, float* out) {
  *out = bf16_to_f32(load_u16(block));
}

using BlockDequantizer = void (*)(const uint8_t* block, float* out);

// One block of `type` to f32; nullptr for a type not supported (kGgmlTypes' `supported`).
BlockDequantizer block_dequantizer(uint32_t type) {
  switch (type) {
    case kGgmlF32:
      return dequantize_f32;
    case kGgmlF16:
      return dequantize_f16;
    case kGgmlBF16:
      return dequantize_bf16;
    case kGgmlQ4_0:
      return dequantize_q4_0;
    case kGgmlQ4_1:
      return dequantize_q4_1;
    case kGgmlQ5_0:
      return dequantize_q5_0;
    case kGgmlQ5_1:
      return dequantize_q5_1;
    case kGgmlQ5_K:
      return dequantize_q5_k;
    case kGgmlQ8_0:
      return dequantize_q8_0;
    case kGgmlQ4_K:
      return dequantize_q4_k;
    case kGgmlQ6_K:
      return dequantize_q6_k;
    default:
      return nullptr;
  }
}

}  // namespace

void dequantize(uint32_t type, const void* blocks, int64_t count, float* out) {
  const GgmlTypeInfo* info = ggml_type_info(type);
  const BlockDequantizer widen_block = block_dequantizer(type);
  if (info == nullptr || widen_block == nullptr) {
    throw Error("dequantize: ggml type " + (info ? std::string(info->name) : std::to_string(type)) +
                " is not supported (" + supported_type_names() + ")");
  }
  if (count < 0 || count % info->block_elements != 0) {
    throw Error("dequantize: " + std::to_string(count) + " elements of " + std::string(info->name) +
                " are not a whole number of " + std::to_string(info->block_elements) +
                "-element blocks");
  }
  const auto* bytes = static_cast<const uint8_t*>(blocks);
  const int64_t num_blocks = count / info->block_elements;
  for (int64_t b = 0; b < num_blocks; ++b) {
    widen_block(bytes + b * info->block_bytes, out + b * info->block_elements);
  }
}

void dequantize_to_bf16(uint32_t type, const void* blocks, int64_t count, uint16_t* out) {
  const GgmlTypeInfo* info = ggml_type_info(type);
  if (info == nullptr) throw Error("dequantize: unknown ggml type " + std::to_string(type));
  // A few thousand elements at a time: whole blocks of every type, small enough to stay in cache.
  constexpr int64_t kChunk = 4096;
  float buffer[kChunk];
  const auto* bytes = static_cast<const std::byte*>(blocks);
  for (int64_t first = 0; first < count; first += kChunk) {
    const int64_t n = std::min(kChunk, count - first);
    dequantize(type, bytes + first / info->block_elements * info->block_bytes, n, buffer);
    for (int64_t i = 0; i < n; ++i) out[first + i] = f32_to_bf16(buffer[i]);
  }
}

}  // namespace specrun
