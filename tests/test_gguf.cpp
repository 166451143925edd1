// GGUF checkpoints: the reader's checks (each malformed file is one Error naming the file and the
// key or tensor, never a crash or a huge allocation), the llama architecture's config and tensor
// binding, the dequantisers against hand-computed blocks and against gguf-py, the tokenizer built
// from metadata, and a GGUF model computing the same logits as the safetensors checkpoint it was
// written from.
#include "runtime/engine/checkpoint_tokenizer.h"
#include "runtime/model/gguf.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/model/checkpoint.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"
#include "specrun/error.hpp"
#include "tests/gguf_writer.h"
#include "tests/test_support.h"
#include "tools/fixtures/checkpoint_generator.h"

namespace specrun {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;
using testing::GgufWriter;
using testing::TempDir;

std::string f32s(std::initializer_list<float> values) {
  std::string bytes;
  for (const float value : values) bytes += GgufWriter::le(value);
  return bytes;
}

// A small valid file: a few keys and two f32 tensors.
GgufWriter small_file() {
  GgufWriter writer;
  writer.kv_string("general.architecture", "llama");
  writer.kv_u32("llama.block_count", 1);
  writer.kv_strings("tokenizer.ggml.tokens", {"a", "b"});
  writer.tensor("a.weight", kGgmlF32, {4}, f32s({1, 2, 3, 4}));
  writer.tensor("b.weight", kGgmlF32, {2, 2}, f32s({5, 6, 7, 8}));
  return writer;
}

class GgufTest : public ::testing::Test {
 protected:
  fs::path write(const GgufWriter& writer, const std::string& name = "model.gguf") {
    writer.write(dir_ / name);
    return dir_ / name;
  }
  void expect_file_error(const GgufWriter& writer, std::initializer_list<std::string> fragments) {
    const fs::path path = write(writer);
    std::vector<std::string> all(fragments);
    all.push_back(path.string());
    expect_error([&] { GgufFile file(path); }, {});
    try {
      GgufFile file(path);
    } catch (const Error& error) {
      for (const std::string& fragment : all) {
        EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos)
            << "message lacks '" << fragment << "': " << error.what();
      }
    }
  }

  TempDir dir_;
};

// ---- the reader -------------------------------------------------------------------------------

TEST_F(GgufTest, ReadsEveryMetadataTypeAndTheTensors) {
  GgufWriter writer;
  writer.kv_raw("u8", GgufType::kUint8, GgufWriter::le<uint8_t>(200));
  writer.kv_raw("i8", GgufType::kInt8, GgufWriter::le<int8_t>(-100));
  writer.kv_raw("u16", GgufType::kUint16, GgufWriter::le<uint16_t>(60000));
  writer.kv_raw("i16", GgufType::kInt16, GgufWriter::le<int16_t>(-30000));
  writer.kv_u32("u32", 4000000000u);
  writer.kv_i32("i32", -2000000000);
  writer.kv_f32("f32", 0.25f);
  writer.kv_bool("bool", true);
  writer.kv_string("string", "h\xc3\xa9llo");
  writer.kv_u64("u64", uint64_t{1} << 40);
  writer.kv_u64("big", UINT64_MAX);
  writer.kv_raw("i64", GgufType::kInt64, GgufWriter::le<int64_t>(-(int64_t{1} << 40)));
  writer.kv_raw("f64", GgufType::kFloat64, GgufWriter::le<double>(-1.5));
  writer.kv_strings("strings", {"x", "", "yz"});
  writer.kv_f32s("floats", {1.5f, -2.0f});
  // An array of two arrays of int32.
  std::string nested = GgufWriter::le<uint32_t>(9) + GgufWriter::le<uint64_t>(2);
  for (int i = 0; i < 2; ++i) {
    nested +=
        GgufWriter::le<uint32_t>(5) + GgufWriter::le<uint64_t>(1) + GgufWriter::le<int32_t>(i);
  }
  writer.kv_raw("nested", GgufType::kArray, nested);
  writer.kv_u32("general.alignment", 64);
  writer.alignment = 64;
  writer.tensor("t", kGgmlF32, {2, 3}, f32s({1, 2, 3, 4, 5, 6}));
  writer.tensor("q", kGgmlQ8_0, {32}, std::string(34, '\0'));

  const GgufFile file(write(writer));
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.alignment(), 64u);
  EXPECT_EQ(file.get_int("u8"), 200);
  EXPECT_EQ(file.get_int("i8"), -100);
  EXPECT_EQ(file.get_int("u16"), 60000);
  EXPECT_EQ(file.get_int("i16"), -30000);
  EXPECT_EQ(file.get_int("u32"), 4000000000LL);
  EXPECT_EQ(file.get_int("i32"), -2000000000);
  EXPECT_EQ(file.get_number("f32"), 0.25);
  EXPECT_EQ(file.get_bool("bool"), true);
  EXPECT_EQ(file.get_string("string"), "h\xc3\xa9llo");
  EXPECT_EQ(file.get_int("u64"), int64_t{1} << 40);
  EXPECT_EQ(file.get_int("i64"), -(int64_t{1} << 40));
  EXPECT_EQ(file.get_number("f64"), -1.5);
  const GgufValue* strings = file.get_array("strings", GgufType::kString);
  ASSERT_NE(strings, nullptr);
  ASSERT_EQ(strings->array.size(), 3u);
  EXPECT_EQ(strings->array[2].string, "yz");
  const GgufValue* floats = file.get_array("floats", GgufType::kFloat32);
  ASSERT_NE(floats, nullptr);
  EXPECT_EQ(floats->array[1].number, -2.0);
  const GgufValue* array = file.find("nested");
  ASSERT_NE(array, nullptr);
  ASSERT_EQ(array->array.size(), 2u);
  EXPECT_EQ(array->array[1].array[0].bits, 1u);
  EXPECT_EQ(file.get_int("absent"), std::nullopt);

  const GgufTensorInfo* t = file.find_tensor("t");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(t->size_bytes, 24u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % 64, 0u);
  EXPECT_EQ(static_cast<const float*>(static_cast<const void*>(t->data))[5], 6.0f);
  EXPECT_EQ(file.find_tensor("q")->size_bytes, 34u);

  expect_error([&] { file.get_string("u32"); }, {"key 'u32'", "must be a string, got uint32"});
  expect_error([&] { file.get_int("string"); }, {"key 'string'", "must be an integer"});
  expect_error([&] { file.get_bool("u8"); }, {"key 'u8'", "must be a bool"});
  expect_error([&] { file.get_array("floats", GgufType::kString); },
               {"key 'floats'", "must be an array of strings, got an array of float32"});
  expect_error([&] { file.require_int("absent"); }, {"key 'absent'", "is required"});
  expect_error([&] { file.get_int("big"); },
               {"key 'big' holds 18446744073709551615, out of range"});
}

TEST_F(GgufTest, TruncatedAnywhereIsOneErrorNamingTheFile) {
  const std::string bytes = small_file().bytes();
  const fs::path path = dir_ / "cut.gguf";
  for (size_t length = 0; length < bytes.size(); ++length) {
    testing::write_file(path, bytes.substr(0, length));
    SCOPED_TRACE("length " + std::to_string(length));
    expect_error([&] { GgufFile file(path); }, {path.string()});
  }
  testing::write_file(path, bytes);
  EXPECT_NO_THROW(GgufFile file(path));
  // Version 2 has version 3's layout (3 only added big-endian files, refused below).
  GgufWriter v2 = small_file();
  v2.version = 2;
  EXPECT_EQ(GgufFile(write(v2, "v2.gguf")).version(), 2u);
}

// Random damage to a valid file (bytes overwritten in the header, then the header and the data):
// each damaged file either reads or is one Error, never a crash, a hang or a huge allocation.
TEST_F(GgufTest, RandomlyDamagedFilesReadOrFailCleanly) {
  GgufWriter writer = small_file();
  writer.kv_f32s("scores", {1.0f, 2.0f, 3.0f});
  writer.tensor("q.weight", kGgmlQ8_0, {32, 2}, std::string(68, '\x01'));
  const std::string good = writer.bytes();
  const fs::path path = dir_ / "damaged.gguf";
  std::mt19937 random(11);
  int64_t refused = 0;
  uint64_t checksum = 0;
  for (int trial = 0; trial < 1000; ++trial) {
    std::string bytes = good;
    const int damage = 1 + static_cast<int>(random() % 4);
    for (int i = 0; i < damage; ++i) {
      bytes[random() % bytes.size()] = static_cast<char>(random());
    }
    testing::write_file(path, bytes);
    try {
      const GgufFile file(path);
      // What was accepted lies inside the file: touch its first and last bytes (a sanitizer
      // build would catch a read outside the mapping).
      for (const GgufTensorInfo& t : file.tensors()) {
        ASSERT_LE(t.offset + t.size_bytes, bytes.size());
        if (t.size_bytes > 0)
          checksum +=
              static_cast<uint8_t>(t.data[0]) + static_cast<uint8_t>(t.data[t.size_bytes - 1]);
      }
    } catch (const Error& error) {
      ++refused;
      ASSERT_NE(std::string(error.what()).find(path.string()), std::string::npos) << error.what();
    }
  }
  EXPECT_GT(refused, 200) << "of 1000";
  EXPECT_GT(checksum, 0u);
}

TEST_F(GgufTest, BadMagicOrVersionIsRefused) {
  GgufWriter writer = small_file();
  writer.magic = 0x4c4c4747;  // "GGLL"
  expect_file_error(writer, {"not a GGUF file", "'GGLL'"});
  writer = small_file();
  writer.version = 1;
  expect_file_error(writer, {"GGUF version 1 is not supported"});
  writer.version = 0x03000000;  // a big-endian file
  expect_file_error(writer, {"GGUF version 50331648 is not supported"});
}

TEST_F(GgufTest, HugeCountsAndLengthsAreRefusedBeforeAllocating) {
  GgufWriter writer = small_file();
  writer.kv_count = uint64_t{1} << 60;
  expect_file_error(writer, {"metadata count 1152921504606846976 cannot fit"});
  writer = small_file();
  writer.tensor_count = uint64_t{1} << 60;
  expect_file_error(writer, {"tensor count 1152921504606846976 cannot fit"});

  // A first entry that is itself impossible is the error named, not the count it was part of.
  for (const bool tensor : {false, true}) {
    const fs::path path = dir_ / "length.gguf";
    testing::write_file(path, "GGUF" + GgufWriter::le<uint32_t>(3) +
                                  GgufWriter::le<uint64_t>(tensor ? 1 : 0) +
                                  GgufWriter::le<uint64_t>(tensor ? 0 : 1) +
                                  GgufWriter::le<uint64_t>(uint64_t{1} << 62) + "ab");
    expect_error([&] { GgufFile file(path); },
                 {path.string(), tensor ? "tensor 0 name" : "metadata key 0",
                  "string length 4611686018427387904 exceeds the limit"});
  }
  writer = GgufWriter();
  writer.kv_raw("k", GgufType::kString, GgufWriter::le<uint64_t>(uint64_t{1} << 50));
  expect_file_error(writer, {"key 'k' value", "exceeds the limit"});
  writer = GgufWriter();
  writer.kv_raw("k", GgufType::kString, GgufWriter::le<uint64_t>(1000) + "short");
  expect_file_error(writer, {"truncated", "key 'k' value needs 1000 bytes"});
  writer = GgufWriter();
  writer.kv_raw("k", GgufType::kArray,
                GgufWriter::le<uint32_t>(8) + GgufWriter::le<uint64_t>(uint64_t{1} << 40));
  expect_file_error(writer, {"key 'k'", "array of 1099511627776 string values cannot fit"});
  // Arrays of arrays of ...: bounded nesting, not unbounded recursion.
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += GgufWriter::le<uint32_t>(9) + GgufWriter::le<uint64_t>(1);
  writer = GgufWriter();
  writer.kv_raw("deep", GgufType::kArray, deep);
  expect_file_error(writer, {"key 'deep'", "arrays nested deeper than"});
  writer = GgufWriter();
  writer.kv_raw("k", static_cast<GgufType>(13), "");
  expect_file_error(writer, {"key 'k'", "unknown value type 13"});
  writer = GgufWriter();
  writer.kv_raw("k", GgufType::kArray, GgufWriter::le<uint32_t>(77) + GgufWriter::le<uint64_t>(0));
  expect_file_error(writer, {"key 'k'", "unknown array element type 77"});
  writer = GgufWriter();
  writer.kv_raw("flag", GgufType::kBool, std::string(1, '\2'));
  expect_file_error(writer, {"key 'flag'", "bool value 2"});
}

TEST_F(GgufTest, DuplicateKeysAndTensorsAreRefused) {
  GgufWriter writer = small_file();
  writer.kv_u32("llama.block_count", 2);
  expect_file_error(writer, {"key 'llama.block_count' appears twice"});
  writer = small_file();
  writer.tensor("a.weight", kGgmlF32, {1}, f32s({9}));
  expect_file_error(writer, {"tensor 'a.weight' appears twice"});
}

TEST_F(GgufTest, TensorInfosAreChecked) {
  GgufWriter writer;
  writer.tensor("t", kGgmlF32, {}, "");
  expect_file_error(writer, {"tensor 't'", "0 dimensions"});
  writer = GgufWriter();
  writer.tensor("t", kGgmlF32, {1, 1, 1, 1, 1}, f32s({1}));
  expect_file_error(writer, {"tensor 't'", "5 dimensions"});
  writer = GgufWriter();
  writer.tensor("t", kGgmlF32, {uint64_t{1} << 32, uint64_t{1} << 32}, "");
  expect_file_error(writer, {"tensor 't'", "ne [4294967296, 4294967296] overflows"});
  writer = GgufWriter();
  // Empty, but its first two extents alone overflow the element count.
  writer.tensor("t", kGgmlF32, {65472, 273778395316224, 0}, "");
  expect_file_error(writer, {"tensor 't'", "ne [65472, 273778395316224, 0] overflows"});
  writer = GgufWriter();
  writer.tensor("t", kGgmlF32, {uint64_t{1} << 62}, "");
  expect_file_error(writer, {"tensor 't'", "of F32 overflows"});
  writer = GgufWriter();
  writer.tensor("t", 99, {4}, f32s({1, 2, 3, 4}));
  expect_file_error(writer, {"tensor 't'", "unknown ggml type 99"});
  writer = GgufWriter();
  writer.tensor("t", 4, {4}, f32s({1, 2, 3, 4}));  // Q4_2, retired
  expect_file_error(writer, {"tensor 't'", "unknown ggml type 4"});
  writer = GgufWriter();
  writer.tensor("t", kGgmlQ8_0, {33, 2}, std::string(68, '\0'));
  expect_file_error(writer, {"tensor 't'", "Q8_0 stores blocks of 32 elements",
                             "ne [33, 2] is not a whole number of blocks"});
  writer = small_file();
  writer.tensor("c", kGgmlF32, {1}, f32s({1}), 16);
  expect_file_error(writer, {"tensor 'c'", "offset 16 is not a multiple of the alignment 32"});
  writer = small_file();
  writer.tensor("c", kGgmlF32, {4}, f32s({1, 2, 3, 4}), 0);
  expect_file_error(writer, {"overlap tensor"});
  writer = small_file();
  writer.tensor("c", kGgmlF32, {1000}, f32s({1}));
  expect_file_error(writer, {"tensor 'c'", "run past its end"});
  writer = small_file();
  writer.tensor("c", kGgmlF32, {1}, "", uint64_t{1} << 63);
  expect_file_error(writer, {"tensor 'c'", "run past its end"});

  writer = small_file();
  writer.kv_u32("general.alignment", 0);
  expect_file_error(writer, {"key 'general.alignment'", "power of two, got 0"});
  writer = small_file();
  writer.kv_u32("general.alignment", 48);
  expect_file_error(writer, {"key 'general.alignment'", "power of two, got 48"});
  writer = small_file();
  writer.kv_u64("general.alignment", 32);
  expect_file_error(writer, {"key 'general.alignment'", "must be a uint32, got uint64"});
}

// ---- dequantisation ---------------------------------------------------------------------------

std::string f16_bytes(float value) {
  return GgufWriter::le<uint16_t>(f32_to_f16(value));
}

std::vector<float> dequantized(uint32_t type, const std::string& blocks, int64_t count) {
  std::vector<float> out(static_cast<size_t>(count));
  dequantize(type, blocks.data(), count, out.data());
  return out;
}

TEST(GgufDequantize, PlainTypes) {
  const std::string f16 = f16_bytes(1.5f) + f16_bytes(-0.25f);
  EXPECT_EQ(dequantized(kGgmlF16, f16, 2), (std::vector<float>{1.5f, -0.25f}));
  const std::string bf16 =
      GgufWriter::le<uint16_t>(f32_to_bf16(3.0f)) + GgufWriter::le<uint16_t>(f32_to_bf16(-8.0f));
  EXPECT_EQ(dequantized(kGgmlBF16, bf16, 2), (std::vector<float>{3.0f, -8.0f}));
  EXPECT_EQ(dequantized(kGgmlF32, f32s({7.0f}), 1), (std::vector<float>{7.0f}));
}

TEST(GgufDequantize, Q8_0) {
  std::string block = f16_bytes(0.5f);
  for (int j = 0; j < 32; ++j) block += static_cast<char>(static_cast<int8_t>(j * 8 - 128));
  const std::vector<float> x = dequantized(kGgmlQ8_0, block, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(x[j], (j * 8 - 128) * 0.5f) << j;
}

TEST(GgufDequantize, Q4_0AndQ4_1) {
  std::string qs;
  for (int j = 0; j < 16; ++j) qs += static_cast<char>(j | ((15 - j) << 4));
  const std::vector<float> q4_0 = dequantized(kGgmlQ4_0, f16_bytes(2.0f) + qs, 32);
  const std::vector<float> q4_1 =
      dequantized(kGgmlQ4_1, f16_bytes(0.5f) + f16_bytes(-1.0f) + qs, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(q4_0[j], (j - 8) * 2.0f) << j;
    EXPECT_EQ(q4_0[j + 16], (7 - j) * 2.0f) << j;
    EXPECT_EQ(q4_1[j], j * 0.5f - 1.0f) << j;
    EXPECT_EQ(q4_1[j + 16], (15 - j) * 0.5f - 1.0f) << j;
  }
}

TEST(GgufDequantize, Q5_0AndQ5_1) {
  // Element j (of 32) holds the 5-bit value (5j + 3) mod 32: its low four bits in qs (elements
  // 0-15 low nibbles, 16-31 high), its fifth as bit j of the little-endian qh.
  std::string qs(16, '\0');
  uint32_t high = 0;
  for (int j = 0; j < 32; ++j) {
    const int q = (5 * j + 3) % 32;
    qs[j % 16] = static_cast<char>(qs[j % 16] | ((q & 15) << (j < 16 ? 0 : 4)));
    high |= static_cast<uint32_t>(q >> 4) << j;
  }
  std::string qh(4, '\0');
  for (int b = 0; b < 4; ++b) qh[b] = static_cast<char>((high >> (8 * b)) & 0xff);
  const std::vector<float> q5_0 = dequantized(kGgmlQ5_0, f16_bytes(2.0f) + qh + qs, 32);
  const std::vector<float> q5_1 =
      dequantized(kGgmlQ5_1, f16_bytes(0.5f) + f16_bytes(-3.0f) + qh + qs, 32);
  for (int j = 0; j < 32; ++j) {
    const int q = (5 * j + 3) % 32;
    EXPECT_EQ(q5_0[j], (q - 16) * 2.0f) << j;
    EXPECT_EQ(q5_1[j], q * 0.5f - 3.0f) << j;
  }
}

TEST(GgufDequantize, Q5_K) {
  // Q4_K's scales and nibbles, and a fifth bit: element 64g + l (low nibble) reads bit 2g of
  // qh[l], element 64g + 32 + l (high nibble) bit 2g + 1. Here the fifth bit is set where l + g
  // is odd.
  const int sc[8] = {1, 2, 3, 4, 17, 18, 19, 20};
  const int mn[8] = {0, 1, 2, 3, 33, 34, 35, 36};
  std::string scales(12, '\0');
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<char>(sc[j] | ((sc[j + 4] >> 4) << 6));
    scales[j + 4] = static_cast<char>(mn[j] | ((mn[j + 4] >> 4) << 6));
    scales[j + 8] = static_cast<char>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  std::string qh(32, '\0');
  std::string qs;
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      qs += static_cast<char>((l % 16) | (((l + g) % 16) << 4));
      if ((l + g) % 2 == 1) qh[l] = static_cast<char>(qh[l] | (3 << (2 * g)));
    }
  }
  const float d = 1.0f;
  const float dmin = 0.5f;
  const std::vector<float> x =
      dequantized(kGgmlQ5_K, f16_bytes(d) + f16_bytes(dmin) + scales + qh + qs, 256);
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      const int fifth = (l + g) % 2 == 1 ? 16 : 0;
      EXPECT_EQ(x[64 * g + l], d * sc[2 * g] * (l % 16 + fifth) - dmin * mn[2 * g])
          << g << " " << l;
      EXPECT_EQ(x[64 * g + 32 + l],
                d * sc[2 * g + 1] * ((l + g) % 16 + fifth) - dmin * mn[2 * g + 1])
          << g << " " << l;
    }
  }
}

TEST(GgufDequantize, Q4_K) {
  // Eight sub-blocks of 32 with 6-bit scales and mins; the upper four need their top two bits
  // from the first eight bytes.
  const int sc[8] = {1, 2, 3, 4, 17, 18, 19, 20};
  const int mn[8] = {0, 1, 2, 3, 33, 34, 35, 36};
  std::string scales(12, '\0');
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<char>(sc[j] | ((sc[j + 4] >> 4) << 6));
    scales[j + 4] = static_cast<char>(mn[j] | ((mn[j + 4] >> 4) << 6));
    scales[j + 8] = static_cast<char>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  std::string qs;
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) qs += static_cast<char>((l % 16) | (((l + g) % 16) << 4));
  }
  const float d = 1.0f;
  const float dmin = 0.5f;
  const std::vector<float> x =
      dequantized(kGgmlQ4_K, f16_bytes(d) + f16_bytes(dmin) + scales + qs, 256);
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      EXPECT_EQ(x[64 * g + l], d * sc[2 * g] * (l % 16) - dmin * mn[2 * g]) << g << " " << l;
      EXPECT_EQ(x[64 * g + 32 + l], d * sc[2 * g + 1] * ((l + g) % 16) - dmin * mn[2 * g + 1])
          << g << " " << l;
    }
  }
}

TEST(GgufDequantize, Q6_K) {
  // Element e holds the 6-bit value (7e mod 64) - 32 with scale (e / 16) - 8.
  std::string ql(128, '\0');
  std::string qh(64, '\0');
  for (int e = 0; e < 256; ++e) {
    const int q = (e * 7) % 64;
    const int half = e / 128;
    const int quarter = (e % 128) / 32;
    const int l = e % 32;
    const int low_index = 64 * half + l + (quarter & 1 ? 32 : 0);
    ql[low_index] = static_cast<char>(ql[low_index] | ((q & 15) << (quarter >= 2 ? 4 : 0)));
    qh[32 * half + l] = static_cast<char>(qh[32 * half + l] | ((q >> 4) << (2 * quarter)));
  }
  std::string scales;
  for (int s = 0; s < 16; ++s) scales += static_cast<char>(static_cast<int8_t>(s - 8));
  const float d = 0.25f;
  const std::vector<float> x = dequantized(kGgmlQ6_K, ql + qh + scales + f16_bytes(d), 256);
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(x[e], d * static_cast<float>(e / 16 - 8) * static_cast<float>((e * 7) % 64 - 32))
        << e;
  }
}

TEST(GgufDequantize, UnsupportedTypesAndPartialBlocksAreErrors) {
  expect_error([] { dequantize(11, nullptr, 256, nullptr); }, {"Q3_K is not supported"});
  expect_error([] { dequantize(77, nullptr, 1, nullptr); }, {"ggml type 77 is not supported"});
  expect_error([] { dequantize(kGgmlQ8_0, nullptr, 31, nullptr); },
               {"31 elements of Q8_0 are not a whole number of 32-element blocks"});
}

// Random blocks of every quantized type against gguf-py's dequantize (llama.cpp's own Python
// reader), when the project's virtual environment has it (tools/setup-python.sh gguf).
TEST(GgufDequantize, MatchesGgufPyOnRandomBlocks) {
  const fs::path python = testing::venv_python_with("gguf");
  if (python.empty()) {
    GTEST_SKIP() << "no gguf-py in .venv (tools/setup-python.sh gguf)";
  }
  TempDir dir;
  std::mt19937 random(7);
  for (const uint32_t type : {kGgmlQ8_0, kGgmlQ4_0, kGgmlQ4_1, kGgmlQ5_0, kGgmlQ5_1, kGgmlQ4_K,
                              kGgmlQ5_K, kGgmlQ6_K, kGgmlF16, kGgmlBF16}) {
    const GgmlTypeInfo& info = *ggml_type_info(type);
    SCOPED_TRACE(std::string(info.name));
    const int64_t blocks = 64;
    std::string bytes(static_cast<size_t>(blocks * info.block_bytes), '\0');
    for (char& byte : bytes) byte = static_cast<char>(random());
    // Scales are f16: keep them finite and moderate, as real files have them.
    std::uniform_real_distribution<float> scale(-0.1f, 0.1f);
    for (int64_t b = 0; b < blocks; ++b) {
      char* block = bytes.data() + b * info.block_bytes;
      auto put = [&](int64_t at) {
        const std::string half = f16_bytes(scale(random));
        std::memcpy(block + at, half.data(), 2);
      };
      if (type == kGgmlQ8_0 || type == kGgmlQ4_0 || type == kGgmlQ4_1 || type == kGgmlQ5_0 ||
          type == kGgmlQ5_1 || type == kGgmlQ4_K || type == kGgmlQ5_K) {
        put(0);
      }
      if (type == kGgmlQ4_1 || type == kGgmlQ5_1 || type == kGgmlQ4_K || type == kGgmlQ5_K) put(2);
      if (type == kGgmlQ6_K) put(208);
      if (type == kGgmlF16) put(0);
      if (type == kGgmlBF16) {
        const uint16_t value = f32_to_bf16(scale(random));
        std::memcpy(block, &value, 2);
      }
    }
    const int64_t count = blocks * info.block_elements;
    testing::write_file(dir / "in.bin", bytes);
    const auto result =
        testing::run_command("'" + python.string() + "' '" +
                             testing::source_path("tools/python/gguf_dequantize.py").string() +
                             "' " + std::string(info.name) + " '" + (dir / "in.bin").string() +
                             "' '" + (dir / "out.bin").string() + "'");
    ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
    const std::string reference = testing::read_file(dir / "out.bin");
    ASSERT_EQ(reference.size(), static_cast<size_t>(count) * sizeof(float));
    const std::vector<float> ours = dequantized(type, bytes, count);
    int64_t mismatches = 0;
    for (int64_t i = 0; i < count; ++i) {
      float expected;
      std::memcpy(&expected, reference.data() + i * 4, 4);
      // Both compute in f32; the order of the two products may differ by an ulp.
      if (!(std::abs(ours[i] - expected) <= 1e-6f * std::abs(expected) + 1e-12f)) {
        if (++mismatches < 5) ADD_FAILURE() << i << ": " << ours[i] << " vs " << expected;
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
}

// ---- the llama architecture ------------------------------------------------------------------

class GgufModelTest : public GgufTest {
 protected:
  void SetUp() override {
    fixtures::GeneratorOptions options;
    options.dtype = DType::kF32;
    options.vocab_size = 256;
    options.num_layers = 2;
    options.rope_theta = 5000.0;
    fixtures::write_random_checkpoint(options, dir_ / "hf");
  }

  // The GGUF file of the generated checkpoint, then `edit` applied to its tensors and keys by
  // rewriting: tests damage one thing each.
  fs::path convert(const testing::GgufModelOptions& options = {}, const std::string& name = "m") {
    const fs::path path = dir_ / (name + ".gguf");
    testing::write_gguf_from_checkpoint(dir_ / "hf", path, options);
    return path;
  }

  std::unique_ptr<kernels::cpu::CpuBackend> backend_ = testing::make_cpu_backend(2);
};

TEST_F(GgufModelTest, ConfigComesFromTheMetadata) {
  const Checkpoint checkpoint = open_checkpoint(convert());
  const ModelConfig& c = checkpoint.config;
  const Checkpoint hf = open_checkpoint(dir_ / "hf");
  EXPECT_EQ(checkpoint.paths.format, CheckpointFormat::kGguf);
  EXPECT_EQ(c.vocab_size, 256);
  EXPECT_EQ(c.hidden_size, hf.config.hidden_size);
  EXPECT_EQ(c.intermediate_size, hf.config.intermediate_size);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.num_heads, hf.config.num_heads);
  EXPECT_EQ(c.num_kv_heads, hf.config.num_kv_heads);
  EXPECT_EQ(c.head_dim, hf.config.head_dim);
  EXPECT_EQ(c.rope_theta, 5000.0);
  EXPECT_FLOAT_EQ(static_cast<float>(c.rms_norm_eps), static_cast<float>(hf.config.rms_norm_eps));
  EXPECT_EQ(c.rope_style, kernels::RopeStyle::kInterleaved);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_ids, std::vector<int32_t>{1});
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{2});
  EXPECT_EQ(checkpoint.paths.tokenizer, dir_ / "m.gguf");
  EXPECT_EQ(checkpoint.tensors.find("model.layers.1.mlp.down_proj.weight")->shape,
            (std::vector<int64_t>{hf.config.hidden_size, hf.config.intermediate_size}));

  testing::GgufModelOptions tied;
  tied.tied = true;
  tied.tokenizer = false;
  const Checkpoint tied_checkpoint = open_checkpoint(convert(tied, "tied"));
  EXPECT_TRUE(tied_checkpoint.config.tie_word_embeddings);
  EXPECT_FALSE(tied_checkpoint.paths.tokenizer.has_value());
}

// The same weights in both formats compute the same logits: the GGUF file's permuted q/k rows
// under interleaved RoPE equal the Hugging Face rows under rotate-half RoPE (up to the order of
// the sums over a head's channels).
TEST_F(GgufModelTest, LogitsEqualTheSafetensorsCheckpoint) {
  auto hf = Model::load(dir_ / "hf", *backend_);
  const std::vector<int32_t> tokens = {1, 17, 200, 3, 99, 45, 45, 7};
  auto run = [&](Model& model) {
    const SequenceInput input{model.kv_cache().add_sequence(), tokens, /*all_logits=*/true};
    Logits logits;
    model.forward(std::span<const SequenceInput>(&input, 1), &logits);
    return logits.values;
  };
  const std::vector<float> expected = run(*hf);
  for (const uint32_t type : {kGgmlF32, kGgmlF16, kGgmlBF16, kGgmlQ8_0}) {
    SCOPED_TRACE(std::string(ggml_type_info(type)->name));
    testing::GgufModelOptions options;
    options.type = type;
    auto gguf = Model::load(convert(options, "typed"), *backend_);
    const std::vector<float> got = run(*gguf);
    ASSERT_EQ(got.size(), expected.size());
    // F32 only reorders sums (measured 7e-7); the others round the weights: measured F16 1.2e-3,
    // BF16 1.0e-2, Q8_0 3.3e-2 on logits of order one.
    const double tolerance = type == kGgmlF32    ? 1e-5
                             : type == kGgmlF16  ? 5e-3
                             : type == kGgmlBF16 ? 4e-2
                                                 : 0.1;
    double max_error = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      max_error = std::max(max_error, static_cast<double>(std::abs(got[i] - expected[i])));
    }
    std::cout << "[ gguf ] " << ggml_type_info(type)->name << ": max |logit difference| "
              << max_error << "\n";
    EXPECT_LE(max_error, tolerance);
  }
}

// Qwen2, Qwen3 and Gemma 3 files as llama.cpp writes them: keys under the architecture's name,
// q/k rows as Hugging Face holds them (rotate-half RoPE), Qwen2's q/k/v biases, Qwen3's and
// Gemma's per-head q/k norms (attn_q_norm, attn_k_norm), heads wider than hidden / heads
// (attention.key_length); Gemma's norms named its own way and stored as 1 + w, its window, its
// every-sixth-layer global and the rest left to the loader's constants.
TEST_F(GgufModelTest, QwenAndGemmaFilesReadAsTheirSafetensorsCheckpoints) {
  for (const std::string architecture :
       {"Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM"}) {
    SCOPED_TRACE(architecture);
    const bool qwen3 = architecture == "Qwen3ForCausalLM";
    const bool gemma3 = architecture == "Gemma3ForCausalLM";
    fixtures::GeneratorOptions options;
    options.architecture = architecture;
    options.dtype = DType::kF32;
    options.vocab_size = 256;
    options.num_layers = gemma3 ? 6 : 2;  // Gemma's sixth layer is its first global one
    options.hidden_size = 64;
    options.num_heads = 4;
    options.num_kv_heads = 2;
    options.head_dim = qwen3 || gemma3 ? 32 : 0;  // 4 x 32 = 128 query channels, 64 wide
    options.global_every = 6;
    options.sliding_window = 3;  // shorter than the tokens below
    const fs::path hf_dir = dir_ / architecture;
    fixtures::write_random_checkpoint(options, hf_dir);
    const fs::path path = dir_ / (architecture + ".gguf");
    testing::write_gguf_from_checkpoint(hf_dir, path, {});

    const Checkpoint checkpoint = open_checkpoint(path);
    const ModelConfig& c = checkpoint.config;
    const Checkpoint hf_checkpoint = open_checkpoint(hf_dir);
    EXPECT_EQ(c.architecture, hf_checkpoint.config.architecture);
    EXPECT_EQ(c.architecture_name, gemma3 ? "gemma3" : qwen3 ? "qwen3" : "qwen2");
    EXPECT_EQ(c.rope_style, kernels::RopeStyle::kRotateHalf);
    EXPECT_EQ(c.head_dim, qwen3 || gemma3 ? 32 : 16);
    EXPECT_EQ(c.qk_norm, qwen3 || gemma3);
    EXPECT_EQ(c.qkv_bias, !qwen3 && !gemma3);
    EXPECT_FALSE(c.o_bias);
    // Gemma's gains arrive as 1 + w: nothing to add.
    EXPECT_FALSE(c.norm_gain_offset);
    EXPECT_EQ(c.output_norms, gemma3);
    EXPECT_EQ(c.sliding_layers, hf_checkpoint.config.sliding_layers);
    EXPECT_EQ(c.query_scale, hf_checkpoint.config.query_scale);
    EXPECT_EQ(c.embedding_scale, hf_checkpoint.config.embedding_scale);
    if (gemma3) {
      EXPECT_EQ(c.sliding_window, 3);
      EXPECT_EQ(c.local_rope_theta, 10000.0);
      ASSERT_NE(checkpoint.tensors.find("model.layers.5.pre_feedforward_layernorm.weight"),
                nullptr);
      ASSERT_NE(checkpoint.tensors.find("model.layers.5.post_feedforward_layernorm.weight"),
                nullptr);
    } else if (qwen3) {
      ASSERT_NE(checkpoint.tensors.find("model.layers.1.self_attn.k_norm.weight"), nullptr);
    } else {
      ASSERT_NE(checkpoint.tensors.find("model.layers.1.self_attn.v_proj.bias"), nullptr);
    }

    auto hf = Model::load(hf_dir, *backend_);
    auto gguf = Model::load(path, *backend_);
    const std::vector<int32_t> tokens = {1, 17, 200, 3, 99, 45, 45, 7};
    auto run = [&](Model& model) {
      const SequenceInput input{model.kv_cache().add_sequence(), tokens, /*all_logits=*/true};
      Logits logits;
      model.forward(std::span<const SequenceInput>(&input, 1), &logits);
      return logits.values;
    };
    // The same f32 weights in the same layout: the same sums in the same order.
    EXPECT_EQ(run(*gguf), run(*hf));
  }
}

// Rewrites a converted model's file with one change to its keys or tensors.
struct Edit {
  Edit(std::string drop_key_, std::function<void(GgufWriter&)> add_ = {},
       std::string drop_tensor_ = {}, std::string reshape_tensor_ = {})
      : drop_key(std::move(drop_key_)),
        add(std::move(add_)),
        drop_tensor(std::move(drop_tensor_)),
        reshape_tensor(std::move(reshape_tensor_)) {}
  std::string drop_key;                  // a key left out
  std::function<void(GgufWriter&)> add;  // keys and tensors added
  std::string drop_tensor;               // a tensor left out
  std::string reshape_tensor;            // a tensor written with ne reversed
  // Each tensor's type and bytes changed, where set (name, type, bytes).
  std::function<void(const std::string&, uint32_t&, std::string&)> retype;
};

fs::path rewrite(const fs::path& source, const fs::path& out, const Edit& edit) {
  const GgufFile file(source);
  GgufWriter writer;
  for (const auto& [key, value] : file.metadata()) {
    if (key == edit.drop_key) continue;
    // Only the types the converter writes.
    switch (value.type) {
      case GgufType::kUint32:
        writer.kv_u32(key, static_cast<uint32_t>(value.bits));
        break;
      case GgufType::kFloat32:
        writer.kv_f32(key, static_cast<float>(value.number));
        break;
      case GgufType::kBool:
        writer.kv_bool(key, value.bits != 0);
        break;
      case GgufType::kString:
        writer.kv_string(key, value.string);
        break;
      case GgufType::kArray: {
        if (value.element_type == GgufType::kString) {
          std::vector<std::string> strings;
          for (const GgufValue& v : value.array) strings.push_back(v.string);
          writer.kv_strings(key, strings);
        } else {
          std::vector<int32_t> ints;
          for (const GgufValue& v : value.array) ints.push_back(static_cast<int32_t>(v.bits));
          writer.kv_i32s(key, ints);
        }
        break;
      }
      default:
        throw Error("rewrite: unexpected type for " + key);
    }
  }
  if (edit.add) edit.add(writer);
  for (const GgufTensorInfo& t : file.tensors()) {
    if (t.name == edit.drop_tensor) continue;
    std::vector<uint64_t> ne(t.ne.begin(), t.ne.end());
    if (t.name == edit.reshape_tensor) std::reverse(ne.begin(), ne.end());
    uint32_t type = t.type;
    std::string bytes(reinterpret_cast<const char*>(t.data), t.size_bytes);
    if (edit.retype) edit.retype(t.name, type, bytes);
    writer.tensor(t.name, type, ne, bytes);
  }
  writer.write(out);
  return out;
}

// `source` rewritten with each tensor's type and bytes as `retype` gives them (name, type, bytes).
fs::path retyped(const fs::path& source, const fs::path& out,
                 std::function<void(const std::string&, uint32_t&, std::string&)> retype) {
  Edit edit("");
  edit.retype = std::move(retype);
  return rewrite(source, out, edit);
}

// The f32 values of a GGUF tensor's bytes.
std::string as_f32_bytes(uint32_t type, const std::string& bytes, int64_t count) {
  std::vector<float> values(static_cast<size_t>(count));
  dequantize(type, bytes.data(), count, values.data());
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

TEST_F(GgufModelTest, Q4AndQ8MatricesAreKeptAsStoredInTheMapping) {
  for (const uint32_t type : {kGgmlQ4_0, kGgmlQ4_1, kGgmlQ8_0}) {
    SCOPED_TRACE(std::string(ggml_type_info(type)->name));
    testing::GgufModelOptions options;
    options.type = type;
    const fs::path path = convert(options, "kept");
    const Checkpoint checkpoint = open_checkpoint(path);
    const GgufFile file(path);
    const GgufTensorInfo& stored = *file.find_tensor("blk.0.ffn_up.weight");
    const TensorInfo& loaded = *checkpoint.tensors.find("model.layers.0.mlp.up_proj.weight");
    EXPECT_EQ(dtype_name(loaded.dtype), ggml_type_info(type)->name);
    EXPECT_EQ(loaded.size_bytes(), stored.size_bytes);
    ASSERT_EQ(std::memcmp(loaded.data, stored.data, stored.size_bytes), 0);
    EXPECT_EQ(checkpoint.tensors.find("model.norm.weight")->dtype, DType::kF32);
    EXPECT_EQ(checkpoint.tensors.find("model.embed_tokens.weight")->dtype, loaded.dtype);
    // The plan counts the stored bytes, by type; the loaded model holds as many.
    const auto layout_of = [&](DType dtype) { return backend_->matmul_weight_layout(dtype); };
    const MemoryNeeds needs = Model::plan_memory(checkpoint, {}, true, layout_of, 1);
    EXPECT_EQ(needs.weight_bytes_by_type.size(), 2u);  // the blocks and the F32 norms
    const uint64_t blocks = needs.weight_bytes_by_type.at(std::string(dtype_name(loaded.dtype)));
    EXPECT_EQ(blocks + needs.weight_bytes_by_type.at("F32"), needs.weight_bytes);
    EXPECT_GE(blocks, stored.size_bytes * 2);  // every layer's matrices at least
    EXPECT_EQ(Model::load(path, *backend_)->weight_bytes(), needs.weight_bytes);
    // A device holds them widened to bf16.
    EXPECT_EQ(Model::plan_memory(checkpoint, {}, false, layout_of, 1)
                  .weight_bytes_by_type.count(std::string(dtype_name(loaded.dtype))),
              0u);
  }
}

// Vectors (norms) in blocks, and the types not multiplied as stored, are dequantised to bf16 at
// load; those bytes are specrun's, freed once the backend holds its own copy.
TEST_F(GgufModelTest, BlockVectorsAreDequantisedToBf16AtLoadAndFreedLater) {
  testing::GgufModelOptions options;
  options.type = kGgmlQ8_0;
  const fs::path path = retyped(convert(options), dir_ / "norm_q8.gguf",
                                [](const std::string& name, uint32_t& type, std::string& bytes) {
                                  if (name != "output_norm.weight") return;
                                  const auto* values = reinterpret_cast<const float*>(bytes.data());
                                  bytes = testing::quantize_q8_0(
                                      std::span<const float>(values, bytes.size() / sizeof(float)));
                                  type = kGgmlQ8_0;
                                });
  Checkpoint checkpoint = open_checkpoint(path);
  const GgufFile file(path);
  const GgufTensorInfo& stored = *file.find_tensor("output_norm.weight");
  const TensorInfo& norm = *checkpoint.tensors.find("model.norm.weight");
  ASSERT_EQ(norm.dtype, DType::kBF16);
  std::vector<uint16_t> expected(static_cast<size_t>(stored.num_elements()));
  dequantize_to_bf16(stored.type, stored.data, stored.num_elements(), expected.data());
  EXPECT_EQ(std::memcmp(norm.data, expected.data(), expected.size() * 2), 0);
  const TensorInfo& up = *checkpoint.tensors.find("model.layers.0.mlp.up_proj.weight");
  EXPECT_FALSE(checkpoint.tensors.release_converted(up.data));  // in the mapping: not ours
  ASSERT_TRUE(checkpoint.tensors.release_converted(norm.data));
  EXPECT_EQ(norm.data, nullptr);
}

TEST_F(GgufModelTest, ABlockWhoseScaleIsNotFiniteIsRefusedByName) {
  for (const uint16_t bad : {uint16_t{0x7e00}, uint16_t{0x7c00}}) {  // NaN, +infinity
    testing::GgufModelOptions options;
    options.type = kGgmlQ4_1;
    const fs::path path = retyped(convert(options), dir_ / "bad_scale.gguf",
                                  [&](const std::string& name, uint32_t&, std::string& bytes) {
                                    if (name != "blk.1.attn_v.weight") return;
                                    // Block 3's offset m (bytes 2-3 of the block).
                                    bytes[3 * 20 + 2] = static_cast<char>(bad & 0xff);
                                    bytes[3 * 20 + 3] = static_cast<char>(bad >> 8);
                                  });
    try {
      (void)open_checkpoint(path);
      FAIL() << "a NaN scale was read";
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(path.string()), std::string::npos) << message;
      EXPECT_NE(message.find("'blk.1.attn_v.weight' (Q4_1)"), std::string::npos) << message;
      EXPECT_NE(message.find("block 3 of"), std::string::npos) << message;
    }
  }
}

// A file of blocks decodes on the CPU with f32 activations bitwise as the same model whose
// matrices are the blocks' f32 values (tied head and untied); with activations quantized per block
// its logits stay near those.
TEST_F(GgufModelTest, BlocksDecodeAsTheirDequantisedValues) {
  const std::vector<int32_t> tokens = {1, 17, 200, 3, 99, 45, 45, 7, 130, 64};
  auto run = [&](Model& model) {
    const SequenceInput input{model.kv_cache().add_sequence(), tokens, /*all_logits=*/true};
    Logits logits;
    model.forward(std::span<const SequenceInput>(&input, 1), &logits);
    return logits.values;
  };
  auto pool = std::make_shared<kernels::cpu::ThreadPool>(2);
  kernels::cpu::CpuBackend exact(pool, kernels::cpu::Activations::kF32);
  kernels::cpu::CpuBackend int8_blocks(pool, kernels::cpu::Activations::kF32Int8Blocks);
  for (const bool tied : {false, true}) {
    for (const uint32_t type : {kGgmlQ4_0, kGgmlQ4_1, kGgmlQ8_0}) {
      SCOPED_TRACE(std::string(ggml_type_info(type)->name) + (tied ? " tied" : ""));
      testing::GgufModelOptions options;
      options.type = type;
      options.tied = tied;
      const fs::path blocks_path = convert(options, "blocks");
      const fs::path f32_path =
          retyped(blocks_path, dir_ / "widened.gguf",
                  [](const std::string&, uint32_t& tensor_type, std::string& bytes) {
                    const GgmlTypeInfo& info = *ggml_type_info(tensor_type);
                    if (info.block_elements == 1) return;
                    const int64_t count =
                        static_cast<int64_t>(bytes.size()) / info.block_bytes * info.block_elements;
                    bytes = as_f32_bytes(tensor_type, bytes, count);
                    tensor_type = kGgmlF32;
                  });
      std::vector<float> widened, stored, quantized;
      {
        auto model = Model::load(f32_path, exact);
        widened = run(*model);
      }
      {
        auto model = Model::load(blocks_path, exact);
        stored = run(*model);
      }
      {
        auto model = Model::load(blocks_path, int8_blocks);
        quantized = run(*model);
      }
      ASSERT_EQ(stored.size(), widened.size());
      EXPECT_EQ(0, std::memcmp(stored.data(), widened.data(), stored.size() * sizeof(float)));
      double max_error = 0.0, largest = 0.0;
      for (size_t i = 0; i < stored.size(); ++i) {
        max_error = std::max(max_error, static_cast<double>(std::abs(quantized[i] - stored[i])));
        largest = std::max(largest, static_cast<double>(std::abs(stored[i])));
      }
      std::cout << "[ gguf ] " << ggml_type_info(type)->name << (tied ? " tied" : "")
                << ": int8 blocks, max |logit difference| " << max_error << " of logits up to "
                << largest << "\n";
      // Each activation within 1/254 of its block's largest, through two layers and the head:
      // measured up to 0.7% of the largest logit.
      EXPECT_LE(max_error, 0.02 * largest);
    }
  }
}

TEST_F(GgufModelTest, ArchitectureAndKeysAreChecked) {
  const fs::path good = convert();
  auto load_edited = [&](const Edit& edit) {
    const fs::path path = rewrite(good, dir_ / "edited.gguf", edit);
    auto model = Model::load(path, *backend_);
  };
  expect_error(
      [&] {
        load_edited({"general.architecture",
                     [](GgufWriter& w) { w.kv_string("general.architecture", "gpt2"); }});
      },
      {"edited.gguf",
       "key 'general.architecture' is 'gpt2', which is not supported (llama, qwen2, qwen3, "
       "gemma3)"});
  expect_error([&] { load_edited({"general.architecture"}); },
               {"edited.gguf", "key 'general.architecture' is required"});
  expect_error([&] { load_edited({"llama.block_count"}); },
               {"key 'llama.block_count' is required"});
  expect_error(
      [&] {
        load_edited(
            {"llama.block_count", [](GgufWriter& w) { w.kv_string("llama.block_count", "two"); }});
      },
      {"key 'llama.block_count' must be an integer, got string"});
  expect_error(
      [&] {
        load_edited({"llama.rope.dimension_count",
                     [](GgufWriter& w) { w.kv_u32("llama.rope.dimension_count", 8); }});
      },
      {"key 'llama.rope.dimension_count' is 8", "RoPE over part of a head"});
  expect_error(
      [&] {
        load_edited({"", [](GgufWriter& w) { w.kv_string("llama.rope.scaling.type", "yarn"); }});
      },
      {"key 'llama.rope.scaling.type' is 'yarn'"});
  expect_error(
      [&] {
        load_edited({"llama.attention.head_count_kv",
                     [](GgufWriter& w) { w.kv_u32("llama.attention.head_count_kv", 3); }});
      },
      {"key 'llama.attention.head_count_kv' (3) must divide"});
  // A head wider than any model's is refused before a table is sized by it.
  expect_error(
      [&] {
        load_edited({"llama.attention.key_length",
                     [](GgufWriter& w) { w.kv_u32("llama.attention.key_length", 1888888888); }});
      },
      {"edited.gguf", "key 'llama.attention.key_length' gives 1888888888 channels per head",
       "limit of 1024"});
  expect_error(
      [&] {
        load_edited({"tokenizer.ggml.eos_token_id",
                     [](GgufWriter& w) { w.kv_u32("tokenizer.ggml.eos_token_id", 256); }});
      },
      {"key 'tokenizer.ggml.eos_token_id' holds 256, outside the vocabulary of 256"});
}

TEST_F(GgufModelTest, MissingMisshapedUnexpectedAndUnsupportedTensorsAreErrors) {
  const fs::path good = convert();
  auto load_edited = [&](const Edit& edit) {
    const fs::path path = rewrite(good, dir_ / "edited.gguf", edit);
    auto model = Model::load(path, *backend_);
  };
  expect_error([&] { load_edited(Edit("", {}, "blk.1.ffn_up.weight")); },
               {"edited.gguf", "missing tensor 'blk.1.ffn_up.weight'"});
  expect_error([&] { load_edited(Edit("", {}, "", "blk.0.attn_k.weight")); },
               {"edited.gguf", "tensor 'blk.0.attn_k.weight' has shape"});
  expect_error(
      [&] {
        load_edited(Edit("", [](GgufWriter& w) {
          w.tensor("blk.0.attn_q_norm.weight", kGgmlF32, {1}, f32s({1}));
        }));
      },
      {"edited.gguf", "unexpected tensor 'blk.0.attn_q_norm.weight'"});
  expect_error(
      [&] {
        load_edited(Edit(
            "", [](GgufWriter& w) { w.tensor("blk.2.attn_q.weight", kGgmlF32, {1}, f32s({1})); }));
      },
      {"unexpected tensor 'blk.2.attn_q.weight'"});
  expect_error(
      [&] {
        load_edited(Edit("", [](GgufWriter& w) {
          w.tensor("extra.weight", 11, {256}, std::string(110, '\0'));
        }));
      },
      {"edited.gguf", "tensor 'extra.weight' has ggml type Q3_K",
       "which specrun cannot read (F32, F16"});
  // Nothing was left half-loaded: the good file still loads.
  EXPECT_NO_THROW(Model::load(good, *backend_));
}

TEST_F(GgufModelTest, AReducedHeadScoresItsTokensAndItsListIsChecked) {
  const fs::path good = convert();
  const GgufFile file(good);
  const GgufTensorInfo& head = *file.find_tensor("output.weight");  // F32, ne [hidden, 256]
  const auto hidden = static_cast<size_t>(head.ne[0]);
  const std::vector<int32_t> kept = {0, 1, 2, 7, 40, 41, 200, 255};
  std::string rows;
  for (const int32_t id : kept) {
    rows.append(reinterpret_cast<const char*>(head.data) + id * hidden * sizeof(float),
                hidden * sizeof(float));
  }
  auto reduced = [&](const std::vector<int32_t>& ids, bool with_head = true) {
    return Edit(
        "",
        [=](GgufWriter& w) {
          w.kv_i32s(std::string(kOutputTokenIdsKey), ids);
          if (with_head) w.tensor("output.weight", kGgmlF32, {hidden, kept.size()}, rows);
        },
        "output.weight");
  };
  const fs::path path = rewrite(good, dir_ / "reduced.gguf", reduced(kept));
  auto model = Model::load(path, *backend_);
  EXPECT_EQ(model->config().output_token_ids, kept);
  auto full = Model::load(good, *backend_);
  const std::vector<int32_t> tokens = {1, 17, 200, 3, 99};
  auto run = [&](Model& m) {
    const SequenceInput input{m.kv_cache().add_sequence(), tokens, /*all_logits=*/true};
    Logits logits;
    m.forward(std::span<const SequenceInput>(&input, 1), &logits);
    return logits.values;
  };
  const std::vector<float> expected = run(*full), got = run(*model);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const bool scored =
        std::find(kept.begin(), kept.end(), static_cast<int32_t>(i % 256)) != kept.end();
    ASSERT_EQ(got[i], scored ? expected[i] : -std::numeric_limits<float>::infinity()) << i;
  }

  auto load_edited = [&](const Edit& edit) {
    auto m = Model::load(rewrite(good, dir_ / "edited.gguf", edit), *backend_);
  };
  expect_error(
      [&] {
        load_edited(reduced({0, 1, 2, 7, 40, 41, 255, 200}));
      },
      {"edited.gguf", "key 'specrun.output_token_ids' must be strictly increasing",
       "entry 7 (200) follows 255"});
  expect_error(
      [&] {
        load_edited(reduced({0, 1, 2, 7, 40, 41, 200, 256}));
      },
      {"edited.gguf", "holds 256 (entry 7), outside the vocabulary of 256"});
  expect_error(
      [&] {
        load_edited(reduced({0, 1, 2, 7, 40, 41, 200}));
      },
      {"edited.gguf", "tensor 'output.weight' has shape", "one row per output_token_ids entry"});
  expect_error([&] { load_edited(reduced(kept, /*with_head=*/false)); },
               {"edited.gguf", "key 'specrun.output_token_ids' needs an output.weight tensor"});
  expect_error(
      [&] {
        load_edited(Edit("", [](GgufWriter& w) {
          w.kv_strings(std::string(kOutputTokenIdsKey), {"a", "b"});
        }));
      },
      {"edited.gguf", "specrun.output_token_ids"});
  expect_error(
      [&] {
        load_edited(Edit("", [](GgufWriter& w) {
          w.kv_f32s(std::string(kOutputTokenIdsKey), {0.0f, 1.5f});
        }));
      },
      {"edited.gguf", "key 'specrun.output_token_ids' must hold token ids (integers)"});
}

TEST_F(GgufModelTest, AFeatureReadingDraftDeclaresItsWidthAndBringsItsProjections) {
  const fs::path good = convert();
  const GgufFile file(good);
  const auto hidden = static_cast<uint64_t>(file.find_tensor("output.weight")->ne[0]);
  constexpr uint64_t kEmbedding = 16;
  auto floats = [](uint64_t count, uint64_t seed) {
    const std::vector<float> values = testing::random_floats(count, seed, 0.1f);
    return std::string(reinterpret_cast<const char*>(values.data()), count * sizeof(float));
  };
  // The token table 16 wide, the two projections, the width key; `except` leaves one out.
  auto feature_draft = [&](uint32_t width, const std::string& except = {}) {
    return Edit(
        "",
        [=](GgufWriter& w) {
          if (except != "key") w.kv_u32(std::string(kFeatureWidthKey), width);
          w.tensor("token_embd.weight", kGgmlF32, {kEmbedding, 256}, floats(kEmbedding * 256, 1));
          w.tensor("token_proj.weight", kGgmlF32, {kEmbedding, hidden},
                   floats(kEmbedding * hidden, 2));
          if (except != "feature_proj.weight") {
            w.tensor("feature_proj.weight", kGgmlF32, {hidden, hidden}, floats(hidden * hidden, 3));
          }
        },
        "token_embd.weight");
  };
  auto model = Model::load(
      rewrite(good, dir_ / "reads.gguf", feature_draft(static_cast<uint32_t>(hidden))), *backend_);
  EXPECT_EQ(model->config().feature_width, static_cast<int64_t>(hidden));
  EXPECT_EQ(model->config().embedding_width, static_cast<int64_t>(kEmbedding));
  const std::vector<int32_t> tokens = {1, 17, 200};
  const std::vector<float> features(3 * hidden, 0.5f);
  const SequenceInput input{model->kv_cache().add_sequence(), tokens, false, features};
  Logits logits;
  model->forward(std::span<const SequenceInput>(&input, 1), &logits);
  EXPECT_EQ(logits.rows(), 1);

  auto load_edited = [&](const Edit& edit) {
    auto m = Model::load(rewrite(good, dir_ / "edited.gguf", edit), *backend_);
  };
  expect_error([&] { load_edited(feature_draft(static_cast<uint32_t>(hidden) + 8)); },
               {"edited.gguf", "key 'specrun.feature_width' is", "not llama.embedding_length"});
  expect_error(
      [&] { load_edited(feature_draft(static_cast<uint32_t>(hidden), "feature_proj.weight")); },
      {"edited.gguf", "feature_proj.weight"});
  // Without the key, the projections are tensors an ordinary model does not use.
  expect_error([&] { load_edited(feature_draft(static_cast<uint32_t>(hidden), "key")); },
               {"edited.gguf", "token_embd.weight"});
}

TEST_F(GgufModelTest, ResolvesAFileOrAFolderHoldingOne) {
  const fs::path path = convert();
  fs::create_directories(dir_ / "folder");
  fs::copy_file(path, dir_ / "folder" / "model.gguf");
  const CheckpointPaths paths = resolve_checkpoint(dir_ / "folder");
  EXPECT_EQ(paths.format, CheckpointFormat::kGguf);
  EXPECT_EQ(paths.weights, dir_ / "folder" / "model.gguf");
  EXPECT_NO_THROW(Model::load(dir_ / "folder", *backend_));
}

TEST_F(GgufModelTest, ALayerSkipDraftIsNotCutFromAGgufFile) {
  const fs::path path = convert();
  expect_error([&] { fixtures::write_truncated_checkpoint(path, 1, dir_ / "draft"); },
               {path.string(), "is a GGUF file"});
}

// ---- the tokenizer ---------------------------------------------------------------------------

std::unique_ptr<text::Tokenizer> tokenizer_of(const fs::path& path) {
  CheckpointPaths paths;
  paths.format = CheckpointFormat::kGguf;
  paths.tokenizer = path;
  return load_tokenizer(paths);
}

TEST_F(GgufTest, SentencePieceTokenizerFromScores) {
  // Merges are ranked by the merged piece's score: "▁ab" (0.5, through "▁" + "ab" or "▁a" + "b",
  // by the halves' ids), then "ab" (-1), then "▁a" (-2). Control, unknown and byte pieces make no
  // merges.
  const std::string s = "\u2581";
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>",  "<0x41>", s,       "a",
                                     "b",     "ab",  s + "a", s + "ab", "<0x0A>"};
  GgufWriter writer;
  writer.kv_string("tokenizer.ggml.model", "llama");
  writer.kv_strings("tokenizer.ggml.tokens", tokens);
  writer.kv_f32s("tokenizer.ggml.scores", {0, 0, 0, 0, -5, -6, -7, -1, -2, 0.5, 0});
  writer.kv_i32s("tokenizer.ggml.token_type", {2, 3, 3, 6, 1, 1, 1, 1, 1, 1, 6});
  writer.kv_u32("tokenizer.ggml.bos_token_id", 1);
  writer.kv_u32("tokenizer.ggml.eos_token_id", 2);
  writer.kv_u32("tokenizer.ggml.unknown_token_id", 0);
  const fs::path path = write(writer);
  const GgufFile file(path);
  const nlohmann::json document = *gguf_tokenizer_json(file);
  EXPECT_EQ(document["model"]["merges"],
            nlohmann::json::parse(R"([[")" + s + R"(","ab"],[")" + s + R"(a","b"],["a","b"],[")" +
                                  s + R"(","a"]])"));
  const auto tokenizer = tokenizer_of(path);
  EXPECT_EQ(tokenizer->encode("ab ab", true), (std::vector<int32_t>{1, 9, 9}));
  EXPECT_EQ(tokenizer->encode("ab A\n", false), (std::vector<int32_t>{9, 4, 3, 10}));
  EXPECT_EQ(tokenizer->encode("</s>a", false), (std::vector<int32_t>{2, 8}));
  EXPECT_EQ(tokenizer->decode(std::vector<int32_t>{1, 9, 9, 4, 3, 10}, true), "ab ab A\n");
  EXPECT_EQ(tokenizer->decode(std::vector<int32_t>{1, 9, 2}, false), "<s> ab</s>");
}

TEST_F(GgufTest, ByteLevelTokenizerWithItsPreTokenizer) {
  // Byte-level pieces: "Ġ" is the space, merges as "left right" strings.
  std::vector<std::string> tokens = {
      "<|endoftext|>", "<|im_start|>", "h", "i", "\xc4\xa0", "1", "2", "hi", "\xc4\xa0hi"};
  GgufWriter writer;
  writer.kv_string("tokenizer.ggml.model", "gpt2");
  writer.kv_string("tokenizer.ggml.pre", "smollm");
  writer.kv_strings("tokenizer.ggml.tokens", tokens);
  writer.kv_i32s("tokenizer.ggml.token_type", {3, 3, 1, 1, 1, 1, 1, 1, 1});
  writer.kv_strings("tokenizer.ggml.merges", {"h i", "\xc4\xa0 hi"});
  writer.kv_u32("tokenizer.ggml.bos_token_id", 1);
  writer.kv_u32("tokenizer.ggml.eos_token_id", 0);
  writer.kv_bool("tokenizer.ggml.add_bos_token", false);
  const fs::path path = write(writer);
  const auto tokenizer = tokenizer_of(path);
  // Digits one by one (smollm), the special token matched in text, no BOS added.
  EXPECT_EQ(tokenizer->encode("<|im_start|>hi hi12", true), (std::vector<int32_t>{1, 7, 8, 5, 6}));
  EXPECT_EQ(tokenizer->decode(std::vector<int32_t>{1, 7, 8, 5, 6, 0}, true), "hi hi12");
  EXPECT_TRUE(tokenizer->is_special(0));

  GgufWriter with_bos;
  with_bos.kv_string("tokenizer.ggml.model", "gpt2");
  with_bos.kv_string("tokenizer.ggml.pre", "llama-bpe");
  with_bos.kv_strings("tokenizer.ggml.tokens", tokens);
  with_bos.kv_strings("tokenizer.ggml.merges", {"h i"});
  with_bos.kv_u32("tokenizer.ggml.bos_token_id", 1);
  with_bos.kv_bool("tokenizer.ggml.add_bos_token", true);
  const auto bos_tokenizer = tokenizer_of(write(with_bos, "bos.gguf"));
  EXPECT_EQ(bos_tokenizer->encode("hi", true), (std::vector<int32_t>{1, 7}));
}

TEST_F(GgufTest, UnsupportedOrMalformedTokenizersAreErrors) {
  auto base = [] {
    GgufWriter writer;
    writer.kv_strings("tokenizer.ggml.tokens", {"a", "b"});
    return writer;
  };
  auto expect_tokenizer_error = [&](GgufWriter writer,
                                    std::initializer_list<std::string> fragments) {
    const fs::path path = write(writer, "tok.gguf");
    std::vector<std::string> all(fragments);
    expect_error([&] { tokenizer_of(path); }, {path.string()});
    try {
      tokenizer_of(path);
    } catch (const Error& error) {
      for (const std::string& fragment : all) {
        EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
      }
    }
  };
  GgufWriter writer = base();
  writer.kv_string("tokenizer.ggml.model", "bert");
  expect_tokenizer_error(writer, {"key 'tokenizer.ggml.model' is 'bert'", "(llama, gpt2)"});
  writer = base();
  writer.kv_string("tokenizer.ggml.model", "gpt2");
  writer.kv_string("tokenizer.ggml.pre", "deepseek-coder");
  writer.kv_strings("tokenizer.ggml.merges", {});
  expect_tokenizer_error(writer, {"key 'tokenizer.ggml.pre' is 'deepseek-coder'", "not supported"});
  writer = base();
  writer.kv_string("tokenizer.ggml.model", "gpt2");
  expect_tokenizer_error(writer, {"key 'tokenizer.ggml.merges' is required"});
  writer = base();
  writer.kv_string("tokenizer.ggml.model", "gpt2");
  writer.kv_strings("tokenizer.ggml.merges", {"ab"});
  expect_tokenizer_error(writer, {"key 'tokenizer.ggml.merges' entry 0 is not two tokens"});
  writer = base();
  writer.kv_string("tokenizer.ggml.model", "llama");
  writer.kv_u32("tokenizer.ggml.bos_token_id", 0);
  expect_tokenizer_error(writer, {"key 'tokenizer.ggml.scores' is required"});
  writer = base();
  writer.kv_string("tokenizer.ggml.model", "llama");
  writer.kv_u32("tokenizer.ggml.bos_token_id", 0);
  writer.kv_f32s("tokenizer.ggml.scores", {0});
  expect_tokenizer_error(writer, {"key 'tokenizer.ggml.scores' has 1 entries for 2 tokens"});
  writer = GgufWriter();
  writer.kv_string("tokenizer.ggml.model", "llama");
  writer.kv_strings("tokenizer.ggml.tokens", {"a", "\xff"});
  expect_tokenizer_error(writer, {"key 'tokenizer.ggml.tokens' entry 1 is not valid UTF-8"});
  writer = base();
  writer.kv_string("tokenizer.ggml.model", "llama");
  writer.kv_f32s("tokenizer.ggml.scores", {0, 0});
  writer.kv_u32("tokenizer.ggml.bos_token_id", 5);
  expect_tokenizer_error(writer, {"key 'tokenizer.ggml.bos_token_id' holds 5"});
  writer = base();
  writer.kv_string("tokenizer.ggml.model", "llama");
  writer.kv_f32s("tokenizer.ggml.scores", {0, 0});
  expect_tokenizer_error(writer, {"key 'tokenizer.ggml.bos_token_id' is required when"});
}

}  // namespace
}  // namespace specrun
