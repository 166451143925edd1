// safetensors reading: every malformed header is one Error naming the file (and the tensor and
// the reason), never a crash or a half-built file; well-formed files, including ones with
// unaligned data, read back exactly. Malformed files are built byte by byte here so each case
// breaks exactly one rule.
#include "runtime/model/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/core/dtype.h"
#include "runtime/base/check.h"
#include "tests/test_support.h"

namespace specrun {
namespace {

using testing::expect_error;
using testing::TempDir;
using testing::write_file;

std::string le64(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return bytes;
}

// A file whose length field is whatever the case needs, followed by arbitrary bytes.
std::string raw_file(uint64_t length_field, const std::string& rest) {
  return le64(length_field) + rest;
}

// A file with a truthful length field: header JSON, then the data section.
std::string safetensors_bytes(const std::string& header, const std::string& data = "") {
  return raw_file(header.size(), header + data);
}

std::string float_bytes(std::initializer_list<float> values) {
  std::string bytes(values.size() * sizeof(float), '\0');
  size_t offset = 0;
  for (const float value : values) {
    std::memcpy(bytes.data() + offset, &value, sizeof(value));
    offset += sizeof(value);
  }
  return bytes;
}

// A small test fixture: writes `bytes` to a file and opens it, expecting an Error naming the file
// and every part.
class SafetensorsErrorTest : public ::testing::Test {
 protected:
  void expect_rejected(const std::string& bytes, std::initializer_list<std::string> parts) {
    const std::filesystem::path path = dir_ / "model.safetensors";
    write_file(path, bytes);
    expect_error([&] { SafetensorsFile file(path); }, {path.string()});
    expect_error([&] { SafetensorsFile file(path); }, parts);
    // The store wrapper reports the same error, untouched.
    expect_error([&] { TensorStore::open_file(path); }, {path.string()});
  }

  // One F32 tensor "w" of 2 elements with `entry` replacing its JSON description.
  void expect_entry_rejected(const std::string& entry, std::initializer_list<std::string> parts) {
    expect_rejected(safetensors_bytes("{\"w\":" + entry + "}", float_bytes({1.0f, 2.0f})), parts);
  }

  TempDir dir_;
};

// --- The length field and the header as a whole ---

TEST_F(SafetensorsErrorTest, EmptyFile) {
  expect_rejected("", {"0 bytes", "too short"});
}

TEST_F(SafetensorsErrorTest, ShorterThanLengthField) {
  expect_rejected(std::string("\x05\x00\x00", 3), {"3 bytes", "too short"});
  expect_rejected(std::string(7, '\0'), {"7 bytes", "too short"});
}

TEST_F(SafetensorsErrorTest, HeaderLengthOverLimit) {
  expect_rejected(raw_file(kMaxSafetensorsHeaderBytes + 1, "{}"),
                  {"header length 100000001", "exceeds the limit"});
  // The largest possible field must not wrap any arithmetic.
  expect_rejected(raw_file(UINT64_MAX, "{}"), {"exceeds the limit"});
}

TEST_F(SafetensorsErrorTest, HeaderLengthPastEndOfFile) {
  expect_rejected(raw_file(100, "{}"),
                  {"header length 100", "past the end of the file (10 bytes)"});
  expect_rejected(raw_file(1, ""), {"past the end of the file"});
}

TEST_F(SafetensorsErrorTest, ZeroLengthHeader) {
  expect_rejected(raw_file(0, ""), {"not valid JSON"});
}

TEST_F(SafetensorsErrorTest, HeaderNotJson) {
  expect_rejected(safetensors_bytes("{\"w\": {\"dtype\": "), {"not valid JSON"});
  expect_rejected(safetensors_bytes("not json at all"), {"not valid JSON"});
  // Binary garbage, including bytes that are not UTF-8.
  expect_rejected(safetensors_bytes(std::string("\xff\xfe\x00\x01\n\r", 6)), {"not valid JSON"});
}

TEST_F(SafetensorsErrorTest, HeaderNotObject) {
  expect_rejected(safetensors_bytes("[1, 2, 3]"), {"not a JSON object"});
  expect_rejected(safetensors_bytes("\"a string\""), {"not a JSON object"});
  expect_rejected(safetensors_bytes("null"), {"not a JSON object"});
}

TEST_F(SafetensorsErrorTest, DuplicateTensorName) {
  const std::string entry = R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  expect_rejected(
      safetensors_bytes("{\"twice\":" + entry + ",\"twice\":" + entry + "}", float_bytes({1.0f})),
      {"tensor 'twice'", "appears twice"});
}

TEST_F(SafetensorsErrorTest, DeeplyNestedHeader) {
  // 100k levels in a 200 KB header: refused while parsing, before anything walks the value.
  const std::string deep = testing::nested_json_arrays(100'000);
  expect_rejected(safetensors_bytes("{\"w\":" + deep + "}"), {"nests deeper than 64 levels"});
  expect_rejected(safetensors_bytes("{\"__metadata__\":" + deep + "}"),
                  {"nests deeper than 64 levels"});
  // Just inside the limit it parses, and the entry is refused on its merits.
  expect_rejected(safetensors_bytes("{\"w\":" + testing::nested_json_arrays(63) + "}"),
                  {"tensor 'w'", "entry is not an object"});
}

TEST_F(SafetensorsErrorTest, ErrorsQuoteShortExcerpts) {
  // A huge shape array in an error message is cut to an excerpt.
  std::string shape = "[1";
  for (int i = 0; i < 100'000; ++i) shape += ",1";
  shape += ",-1]";
  try {
    write_file(dir_ / "model.safetensors",
               safetensors_bytes("{\"w\":{\"dtype\":\"F32\",\"shape\":" + shape +
                                 ",\"data_offsets\":[0,0]}}"));
    SafetensorsFile file(dir_ / "model.safetensors");
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_LT(std::string(error.what()).size(), 400u) << error.what();
  }
  // Offsets far too long to quote in full.
  std::string offsets = "[8";
  for (int i = 0; i < 100'000; ++i) offsets += ",0";
  offsets += "]";
  try {
    write_file(dir_ / "model.safetensors",
               safetensors_bytes(
                   "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":" + offsets + "}}"));
    SafetensorsFile file(dir_ / "model.safetensors");
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_LT(std::string(error.what()).size(), 400u) << error.what();
  }
}

TEST_F(SafetensorsErrorTest, MoreTensorsThanTheLimit) {
  // Refused as the keys are read: the entries need not even be valid.
  std::string header = "{\"__metadata__\":{}";
  for (size_t i = 0; i <= kMaxSafetensorsTensors; ++i) header += ",\"" + std::to_string(i) + "\":0";
  header += "}";
  expect_rejected(safetensors_bytes(header), {"more than 1000000 tensors", "the limit"});
}

TEST_F(SafetensorsErrorTest, MetadataNotObject) {
  expect_rejected(safetensors_bytes(R"({"__metadata__": "pt"})"),
                  {"__metadata__", "not an object"});
  expect_rejected(safetensors_bytes(R"({"__metadata__": ["format", "pt"]})"),
                  {"__metadata__", "not an object"});
}

TEST_F(SafetensorsErrorTest, MetadataValueNotString) {
  expect_rejected(safetensors_bytes(R"({"__metadata__": {"format": "pt", "step": 1000}})"),
                  {"__metadata__", "'step'", "not a string"});
  expect_rejected(safetensors_bytes(R"({"__metadata__": {"nested": {"a": "b"}}})"),
                  {"__metadata__", "'nested'", "not a string"});
}

// --- One tensor entry ---

TEST_F(SafetensorsErrorTest, EntryNotObject) {
  expect_entry_rejected("[\"F32\", [2], [0, 8]]", {"tensor 'w'", "not an object"});
  expect_entry_rejected("42", {"tensor 'w'", "not an object"});
}

TEST_F(SafetensorsErrorTest, MissingDtype) {
  expect_entry_rejected(R"({"shape":[2],"data_offsets":[0,8]})", {"tensor 'w'", "'dtype'"});
  expect_entry_rejected(R"({"dtype":7,"shape":[2],"data_offsets":[0,8]})",
                        {"tensor 'w'", "'dtype'"});
}

TEST_F(SafetensorsErrorTest, UnknownDtype) {
  expect_entry_rejected(R"({"dtype":"X9","shape":[2],"data_offsets":[0,8]})",
                        {"tensor 'w'", "unknown dtype 'X9'"});
}

TEST_F(SafetensorsErrorTest, KnownButUnsupportedDtype) {
  expect_entry_rejected(R"({"dtype":"I64","shape":[1],"data_offsets":[0,8]})",
                        {"tensor 'w'", "dtype 'I64' is not supported"});
  expect_entry_rejected(R"({"dtype":"F64","shape":[1],"data_offsets":[0,8]})",
                        {"tensor 'w'", "dtype 'F64' is not supported"});
}

TEST_F(SafetensorsErrorTest, ShapeMissingOrNotArray) {
  expect_entry_rejected(R"({"dtype":"F32","data_offsets":[0,8]})", {"tensor 'w'", "'shape'"});
  expect_entry_rejected(R"({"dtype":"F32","shape":2,"data_offsets":[0,8]})",
                        {"tensor 'w'", "'shape'"});
  expect_entry_rejected(R"({"dtype":"F32","shape":"[2]","data_offsets":[0,8]})",
                        {"tensor 'w'", "'shape'"});
}

TEST_F(SafetensorsErrorTest, ShapeEntryNotNonNegativeInteger) {
  expect_entry_rejected(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})",
                        {"tensor 'w'", "shape", "-2"});
  expect_entry_rejected(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})",
                        {"tensor 'w'", "shape", "2.0"});
  expect_entry_rejected(R"({"dtype":"F32","shape":["2"],"data_offsets":[0,8]})",
                        {"tensor 'w'", "shape"});
  expect_entry_rejected(R"({"dtype":"F32","shape":[null],"data_offsets":[0,8]})",
                        {"tensor 'w'", "shape"});
}

TEST_F(SafetensorsErrorTest, ShapeOverflow) {
  // 2^32 * 2^32 elements wrap a 64-bit count to zero, which would match empty offsets.
  expect_entry_rejected(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]})",
                        {"tensor 'w'", "overflows"});
  // Fits in the element count but not once multiplied by the dtype size.
  expect_entry_rejected(R"({"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]})",
                        {"tensor 'w'", "overflows"});
  // A single extent beyond int64.
  expect_entry_rejected(R"({"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,0]})",
                        {"tensor 'w'", "overflows"});
  // Empty, but the extents before its zero overflow the element count on the way.
  expect_entry_rejected(R"({"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]})",
                        {"tensor 'w'", "overflows"});
}

TEST_F(SafetensorsErrorTest, DataOffsetsMalformed) {
  for (const std::string offsets :
       {"", R"(,"data_offsets":8)", R"(,"data_offsets":[8])", R"(,"data_offsets":[0,4,8])",
        R"(,"data_offsets":[-8,0])", R"(,"data_offsets":[0,-8])", R"(,"data_offsets":[0,8.0])",
        R"(,"data_offsets":["0","8"])", R"(,"data_offsets":{"begin":0,"end":8})"}) {
    SCOPED_TRACE(offsets);
    expect_entry_rejected(R"({"dtype":"F32","shape":[2])" + offsets + "}",
                          {"tensor 'w'", "'data_offsets' must be two non-negative integers"});
  }
}

TEST_F(SafetensorsErrorTest, DataOffsetsReversed) {
  expect_entry_rejected(R"({"dtype":"F32","shape":[2],"data_offsets":[8,0]})",
                        {"tensor 'w'", "[8,0]", "end before they begin"});
}

TEST_F(SafetensorsErrorTest, DataOffsetsPastDataSection) {
  expect_entry_rejected(R"({"dtype":"F32","shape":[2],"data_offsets":[4,12]})",
                        {"tensor 'w'", "past the data section (8 bytes)"});
  // A far-away begin whose end would wrap if added carelessly.
  expect_entry_rejected(
      R"({"dtype":"F32","shape":[0],"data_offsets":[18446744073709551615,18446744073709551615]})",
      {"tensor 'w'", "past the data section"});
}

TEST_F(SafetensorsErrorTest, ByteCountDoesNotMatchShape) {
  expect_entry_rejected(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})",
                        {"tensor 'w'", "shape [3] of F32 needs 12 bytes", "cover 8"});
  expect_entry_rejected(R"({"dtype":"BF16","shape":[2],"data_offsets":[0,8]})",
                        {"tensor 'w'", "needs 4 bytes", "cover 8"});
  expect_entry_rejected(R"({"dtype":"F32","shape":[0],"data_offsets":[0,8]})",
                        {"tensor 'w'", "needs 0 bytes"});
}

TEST_F(SafetensorsErrorTest, OverlappingTensors) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  expect_rejected(safetensors_bytes(header, std::string(12, '\0')),
                  {"tensor 'b'", "overlap tensor 'a'", "[4, 12)", "[0, 8)"});
}

TEST_F(SafetensorsErrorTest, OverlapAcrossAnEmptyTensor) {
  // Sorted by offset, the empty tensor sits between the two that overlap: a check of adjacent
  // pairs alone would compare each with the empty one and miss the overlap.
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[6,14]}})";
  expect_rejected(safetensors_bytes(header, std::string(14, '\0')),
                  {"tensor 'b'", "overlap tensor 'a'"});
}

TEST_F(SafetensorsErrorTest, OverlapWithAnEnclosingTensor) {
  // b and c are disjoint neighbours, but both lie inside a.
  const std::string header = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                             R"("c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  expect_rejected(safetensors_bytes(header, std::string(16, '\0')), {"overlap tensor 'a'"});
}

TEST_F(SafetensorsErrorTest, SameRangeTwice) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  expect_rejected(safetensors_bytes(header, std::string(8, '\0')), {"overlap tensor"});
}

TEST(SafetensorsTest, NonexistentFile) {
  TempDir dir;
  const std::filesystem::path path = dir / "absent.safetensors";
  expect_error([&] { SafetensorsFile file(path); }, {path.string(), "cannot open"});
}

TEST(SafetensorsTest, DirectoryIsNotAFile) {
  TempDir dir;
  expect_error([&] { SafetensorsFile file(dir.path()); }, {dir.path().string()});
}

// --- Well-formed files ---

template <typename T>
std::span<const std::byte> as_bytes(const std::vector<T>& values) {
  return std::as_bytes(std::span<const T>(values));
}

TEST(SafetensorsTest, RoundTripEveryDtypeWithMetadata) {
  TempDir dir;
  const std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, -0.125f, 1e-3f};
  std::vector<uint16_t> f16;
  std::vector<uint16_t> bf16;
  for (const float value : {0.5f, -1.0f, 2.0f, 65504.0f}) f16.push_back(f32_to_f16(value));
  for (const float value : {0.5f, -1.0f, 3.0f}) bf16.push_back(f32_to_bf16(value));
  const std::vector<TensorToWrite> tensors = {
      {"model.layers.0.mlp.up_proj.weight", DType::kF32, {2, 3}, as_bytes(f32)},
      {"model.norm.weight", DType::kF16, {4}, as_bytes(f16)},
      {"lm_head.weight", DType::kBF16, {3, 1}, as_bytes(bf16)},
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "a b\"c"}};
  const std::filesystem::path path = dir / "model.safetensors";
  write_safetensors(path, tensors, metadata);

  // The header is padded to 8 bytes, so every tensor is mapped in place.
  const std::string bytes = testing::read_file(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  EXPECT_EQ(header_length % 8, 0u);

  const SafetensorsFile file(path);
  EXPECT_EQ(file.path(), path);
  EXPECT_EQ(file.metadata(), metadata);
  ASSERT_EQ(file.tensors().size(), 3u);
  // Sorted by name.
  EXPECT_EQ(file.tensors()[0].name, "lm_head.weight");
  EXPECT_EQ(file.tensors()[1].name, "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(file.tensors()[2].name, "model.norm.weight");
  for (const TensorToWrite& written : tensors) {
    SCOPED_TRACE(written.name);
    const TensorInfo* info = file.find(written.name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->dtype, written.dtype);
    EXPECT_EQ(info->shape, written.shape);
    EXPECT_EQ(info->file, path);
    ASSERT_EQ(info->size_bytes(), written.bytes.size());
    EXPECT_EQ(std::memcmp(info->data, written.bytes.data(), written.bytes.size()), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(info->data) % dtype_size(info->dtype), 0u);
  }
  EXPECT_EQ(file.find("missing"), nullptr);
  EXPECT_EQ(file.find("lm_head"), nullptr);
  EXPECT_FLOAT_EQ(load_as_f32(file.find("model.norm.weight")->data, DType::kF16, 3), 65504.0f);
  EXPECT_FLOAT_EQ(load_as_f32(file.find("lm_head.weight")->data, DType::kBF16, 2), 3.0f);
  EXPECT_EQ(file.find("model.layers.0.mlp.up_proj.weight")->num_elements(), 6);

  const TensorStore store = TensorStore::open_file(path);
  EXPECT_EQ(store.all().size(), 3u);
  ASSERT_NE(store.find("model.norm.weight"), nullptr);
  EXPECT_EQ(store.find("model.norm.weight")->shape, std::vector<int64_t>{4});
}

TEST(SafetensorsTest, WriteRejectsByteCountNotMatchingShape) {
  TempDir dir;
  const std::vector<float> values = {1.0f, 2.0f};
  const std::vector<TensorToWrite> tensors = {{"w", DType::kF32, {3}, as_bytes(values)}};
  const std::filesystem::path path = dir / "bad.safetensors";
  expect_error([&] { write_safetensors(path, tensors); }, {path.string(), "tensor 'w'", "[3]"});
}

TEST(SafetensorsTest, NoTensorsAtAll) {
  TempDir dir;
  const std::filesystem::path path = dir / "empty.safetensors";
  write_file(path, safetensors_bytes("{}"));
  const SafetensorsFile file(path);
  EXPECT_TRUE(file.tensors().empty());
  EXPECT_TRUE(file.metadata().empty());
}

TEST(SafetensorsTest, HundredThousandEmptyTensorsParseInLinearTime) {
  // Parsing used to cost O(n^2) in the tensors (82 s for these 100k); now a fraction of a second.
  // The bound is generous for slow and sanitized CI machines; the time is printed.
  TempDir dir;
  const std::filesystem::path path = dir / "many.safetensors";
  constexpr int kTensors = 100'000;
  std::string header = "{";
  for (int i = 0; i < kTensors; ++i) {
    if (i != 0) header += ",";
    header +=
        "\"t" + std::to_string(i) + "\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}";
  }
  header += "}";
  write_file(path, safetensors_bytes(header));
  const auto start = std::chrono::steady_clock::now();
  const SafetensorsFile file(path);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%d empty tensors: %.3f s\n", kTensors, seconds);
  EXPECT_EQ(file.tensors().size(), static_cast<size_t>(kTensors));
  EXPECT_NE(file.find("t99999"), nullptr);
  EXPECT_LT(seconds, 10.0);
}

TEST(SafetensorsTest, ZeroElementTensor) {
  TempDir dir;
  const std::filesystem::path path = dir / "model.safetensors";
  // An empty tensor may sit at the very end of the data section, or even inside another's range.
  write_file(path,
             safetensors_bytes(R"({"empty":{"dtype":"BF16","shape":[0,16],"data_offsets":[4,4]},)"
                               R"("inner":{"dtype":"F32","shape":[3,0],"data_offsets":[2,2]},)"
                               R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                               float_bytes({7.0f})));
  const SafetensorsFile file(path);
  ASSERT_EQ(file.tensors().size(), 3u);
  const TensorInfo* empty = file.find("empty");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->num_elements(), 0);
  EXPECT_EQ(empty->size_bytes(), 0u);
  EXPECT_EQ(empty->shape, (std::vector<int64_t>{0, 16}));
  EXPECT_EQ(file.find("inner")->num_elements(), 0);
  EXPECT_FLOAT_EQ(load_as_f32(file.find("w")->data, DType::kF32, 0), 7.0f);
}

TEST(SafetensorsTest, ScalarTensor) {
  TempDir dir;
  const std::filesystem::path path = dir / "model.safetensors";
  write_file(path, safetensors_bytes(R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})",
                                     float_bytes({-4.5f})));
  const SafetensorsFile file(path);
  ASSERT_NE(file.find("s"), nullptr);
  EXPECT_EQ(file.find("s")->num_elements(), 1);
  EXPECT_FLOAT_EQ(load_as_f32(file.find("s")->data, DType::kF32, 0), -4.5f);
}

TEST(SafetensorsTest, UnalignedDataReadsBackCorrectly) {
  TempDir dir;
  const std::filesystem::path path = dir / "model.safetensors";
  std::string header = R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                       R"("h":{"dtype":"F16","shape":[2],"data_offsets":[12,16]}})";
  // The data section starts at 8 + header length into a page-aligned mapping; an odd length
  // leaves both tensors misaligned for their dtypes.
  while (header.size() % 4 != 1) header += ' ';
  const uint16_t halves[2] = {f32_to_f16(0.25f), f32_to_f16(-3.0f)};
  std::string data = float_bytes({1.0f, -2.5f, 1e30f});
  data.append(reinterpret_cast<const char*>(halves), sizeof(halves));
  write_file(path, safetensors_bytes(header, data));

  const SafetensorsFile file(path);
  const TensorInfo* x = file.find("x");
  const TensorInfo* h = file.find("h");
  ASSERT_NE(x, nullptr);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x->data) % alignof(float), 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(h->data) % alignof(uint16_t), 0u);
  const float* floats = static_cast<const float*>(x->data);
  EXPECT_EQ(floats[0], 1.0f);
  EXPECT_EQ(floats[1], -2.5f);
  EXPECT_EQ(floats[2], 1e30f);
  EXPECT_EQ(static_cast<const uint16_t*>(h->data)[0], halves[0]);
  EXPECT_FLOAT_EQ(load_as_f32(h->data, DType::kF16, 1), -3.0f);
}

TEST(SafetensorsTest, ShapeToString) {
  EXPECT_EQ(shape_to_string(std::vector<int64_t>{4096, 11008}), "[4096, 11008]");
  EXPECT_EQ(shape_to_string(std::vector<int64_t>{}), "[]");
}

// --- Sharded checkpoints ---

class SafetensorsShardedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = {1.0f, 2.0f, 3.0f, 4.0f};
    b_ = {5.0f, 6.0f};
    c_ = {7.0f};
  }

  void write_shard(const std::string& name, const std::vector<std::string>& tensor_names) {
    std::vector<TensorToWrite> tensors;
    for (const std::string& tensor : tensor_names) {
      const std::vector<float>& values = tensor == "a" ? a_ : tensor == "b" ? b_ : c_;
      tensors.push_back(
          {tensor, DType::kF32, {static_cast<int64_t>(values.size())}, as_bytes(values)});
    }
    write_safetensors(dir_ / name, tensors, {{"format", "pt"}});
  }

  std::filesystem::path write_index(const std::string& text) {
    const std::filesystem::path path = dir_ / "model.safetensors.index.json";
    write_file(path, text);
    return path;
  }

  // Two shards: a and b in the first, c in the second.
  std::filesystem::path write_good_checkpoint() {
    write_shard("model-00001-of-00002.safetensors", {"a", "b"});
    write_shard("model-00002-of-00002.safetensors", {"c"});
    return write_index(R"({"metadata": {"total_size": 28}, "weight_map": {
        "a": "model-00001-of-00002.safetensors",
        "b": "model-00001-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors"}})");
  }

  TempDir dir_;
  std::vector<float> a_, b_, c_;
};

TEST_F(SafetensorsShardedTest, TwoShards) {
  const TensorStore store = TensorStore::open_index(write_good_checkpoint());
  EXPECT_EQ(store.files().size(), 2u);
  const std::vector<const TensorInfo*> all = store.all();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0]->name, "a");
  EXPECT_EQ(all[1]->name, "b");
  EXPECT_EQ(all[2]->name, "c");
  EXPECT_EQ(all[0]->file, dir_ / "model-00001-of-00002.safetensors");
  EXPECT_EQ(all[2]->file, dir_ / "model-00002-of-00002.safetensors");
  EXPECT_EQ(static_cast<const float*>(store.find("a")->data)[3], 4.0f);
  EXPECT_EQ(static_cast<const float*>(store.find("b")->data)[1], 6.0f);
  EXPECT_EQ(static_cast<const float*>(store.find("c")->data)[0], 7.0f);
  EXPECT_EQ(store.find("d"), nullptr);
}

TEST_F(SafetensorsShardedTest, IndexNotJson) {
  write_good_checkpoint();
  const std::filesystem::path index = write_index("{\"weight_map\": {\"a\": ");
  expect_error([&] { TensorStore::open_index(index); }, {index.string(), "not valid JSON"});
}

TEST_F(SafetensorsShardedTest, IndexDeeplyNested) {
  const std::filesystem::path index =
      write_index("{\"weight_map\":" + testing::nested_json_arrays(100'000) + "}");
  expect_error([&] { TensorStore::open_index(index); },
               {index.string(), "nests deeper than 64 levels"});
}

TEST_F(SafetensorsShardedTest, IndexMissing) {
  const std::filesystem::path index = dir_ / "model.safetensors.index.json";
  expect_error([&] { TensorStore::open_index(index); }, {index.string(), "cannot open"});
}

TEST_F(SafetensorsShardedTest, IndexWithoutWeightMap) {
  write_good_checkpoint();
  for (const std::string text :
       {R"({"metadata": {}})", R"([])", R"({"weight_map": ["a"]})", R"({"weight_map": null})"}) {
    SCOPED_TRACE(text);
    const std::filesystem::path index = write_index(text);
    expect_error([&] { TensorStore::open_index(index); }, {index.string(), "'weight_map'"});
  }
}

TEST_F(SafetensorsShardedTest, EmptyWeightMap) {
  const std::filesystem::path index = write_index(R"({"weight_map": {}})");
  expect_error([&] { TensorStore::open_index(index); }, {index.string(), "weight_map is empty"});
}

TEST_F(SafetensorsShardedTest, WeightMapValueNotString) {
  write_good_checkpoint();
  const std::filesystem::path index = write_index(R"({"weight_map": {"a": 1}})");
  expect_error([&] { TensorStore::open_index(index); },
               {index.string(), "weight_map entry 'a'", "not a string"});
}

TEST_F(SafetensorsShardedTest, WeightMapPathOutsideDirectory) {
  write_good_checkpoint();
  for (const std::string shard :
       {"../x.safetensors", "/etc/passwd", "sub/model.safetensors", "..", ".", ""}) {
    SCOPED_TRACE(shard);
    const std::filesystem::path index = write_index(R"({"weight_map": {"a": ")" + shard + R"("}})");
    expect_error([&] { TensorStore::open_index(index); },
                 {index.string(), "weight_map entry 'a'", "not a file name beside the index"});
  }
}

TEST_F(SafetensorsShardedTest, IndexListsTensorShardLacks) {
  write_good_checkpoint();
  const std::filesystem::path index = write_index(R"({"weight_map": {
      "a": "model-00001-of-00002.safetensors",
      "b": "model-00001-of-00002.safetensors",
      "c": "model-00002-of-00002.safetensors",
      "d": "model-00002-of-00002.safetensors"}})");
  expect_error([&] { TensorStore::open_index(index); },
               {index.string(), "'d'", "model-00002-of-00002.safetensors", "does not hold it"});
}

TEST_F(SafetensorsShardedTest, ShardHoldsUnlistedTensor) {
  write_good_checkpoint();
  const std::filesystem::path index = write_index(R"({"weight_map": {
      "a": "model-00001-of-00002.safetensors",
      "c": "model-00002-of-00002.safetensors"}})");
  expect_error([&] { TensorStore::open_index(index); },
               {(dir_ / "model-00001-of-00002.safetensors").string(), "tensor 'b'",
                "not listed for this shard", "model.safetensors.index.json"});
}

TEST_F(SafetensorsShardedTest, ShardHoldsTensorListedUnderAnotherShard) {
  // b is in both shards; the index assigns it to the second, so the first holds it unlisted.
  write_shard("model-00001-of-00002.safetensors", {"a", "b"});
  write_shard("model-00002-of-00002.safetensors", {"b", "c"});
  const std::filesystem::path index = write_index(R"({"weight_map": {
      "a": "model-00001-of-00002.safetensors",
      "b": "model-00002-of-00002.safetensors",
      "c": "model-00002-of-00002.safetensors"}})");
  expect_error([&] { TensorStore::open_index(index); },
               {(dir_ / "model-00001-of-00002.safetensors").string(), "tensor 'b'",
                "not listed for this shard"});
}

TEST_F(SafetensorsShardedTest, MissingShardFile) {
  write_good_checkpoint();
  std::filesystem::remove(dir_ / "model-00002-of-00002.safetensors");
  const std::filesystem::path index = dir_ / "model.safetensors.index.json";
  expect_error([&] { TensorStore::open_index(index); },
               {(dir_ / "model-00002-of-00002.safetensors").string(), "cannot open"});
}

TEST_F(SafetensorsShardedTest, ShardNotARegularFile) {
  // A FIFO would block the open until a writer comes.
  write_good_checkpoint();
  const std::filesystem::path shard = dir_ / "model-00002-of-00002.safetensors";
  std::filesystem::remove(shard);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
  const std::filesystem::path index = dir_ / "model.safetensors.index.json";
  expect_error([&] { TensorStore::open_index(index); }, {shard.string(), "not a regular file"});
  std::filesystem::remove(index);
  ASSERT_EQ(::mkfifo(index.c_str(), 0600), 0);
  expect_error([&] { TensorStore::open_index(index); }, {index.string(), "not a regular file"});
}

TEST_F(SafetensorsShardedTest, SingleFileNotARegularFile) {
  // Opened directly, without an index in front: the mapping itself refuses it.
  const std::filesystem::path fifo = dir_ / "model.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error([&] { SafetensorsFile file(fifo); }, {fifo.string(), "not a regular file"});
  expect_error([&] { TensorStore::open_file(fifo); }, {fifo.string(), "not a regular file"});
  expect_error([&] { SafetensorsFile file(dir_.path()); },
               {dir_.path().string(), "not a regular file"});
}

TEST_F(SafetensorsShardedTest, MalformedShard) {
  write_good_checkpoint();
  const std::filesystem::path shard = dir_ / "model-00002-of-00002.safetensors";
  const std::string good = testing::read_file(shard);
  write_file(shard, good.substr(0, 20));
  expect_error([&] { TensorStore::open_index(dir_ / "model.safetensors.index.json"); },
               {shard.string(), "past the end of the file"});
}

// A multimodal checkpoint's names as its text model's: both layouts, the output projection with
// what follows it, and nothing outside the language model (nor a name that only begins alike).
TEST(MultimodalTextName, MapsTheLanguageModelsNamesAndNothingElse) {
  EXPECT_EQ(multimodal_text_name("language_model.model.layers.3.mlp.up_proj.weight"),
            "model.layers.3.mlp.up_proj.weight");
  EXPECT_EQ(multimodal_text_name("model.language_model.norm.weight"), "model.norm.weight");
  EXPECT_EQ(multimodal_text_name("language_model.lm_head.weight"), "lm_head.weight");
  EXPECT_EQ(multimodal_text_name("language_model.lm_head"), "lm_head");
  EXPECT_EQ(multimodal_text_name("language_model.lm_heads.weight"), std::nullopt);
  EXPECT_EQ(multimodal_text_name("vision_tower.embeddings.patch_embedding.weight"), std::nullopt);
  EXPECT_EQ(multimodal_text_name("model.layers.0.mlp.up_proj.weight"), std::nullopt);
}

}  // namespace
}  // namespace specrun
