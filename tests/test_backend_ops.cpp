// Every op of kernels::Backend, over its dtypes and a few shapes, on every backend against the CPU
// backend's reference (the spirit of llama.cpp's test-backend-ops): one table of cases, one
// parameterised test. Built twice: test_backend_ops runs the cases on the CPU backend and on the
// deferred test backend, where they must agree bit for bit (the same code, queued); with CUDA,
// test_cuda_backend_ops (label gpu, SPECRUN_TEST_CUDA) runs them on the device within each case's
// tolerance, and skips without one. A second table gives each op a bad shape, which every backend
// refuses as kInvalidArgument before it runs anything (Backend checks shapes once, for all).
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels/backend.h"
#include "kernels/core/dtype.h"
#include "runtime/base/device_buffer.h"
#include "tests/deferred_backend.h"
#include "tests/test_support.h"
#if SPECRUN_TEST_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device.h"
#endif

namespace specrun {
namespace {

using kernels::Backend;
using testing::random_floats;

// ---- moving tensors -----------------------------------------------------------------------------

template <typename T>
DeviceBuffer upload(Backend& backend, const std::vector<T>& host) {
  DeviceBuffer buffer(backend, std::max<size_t>(1, host.size() * sizeof(T)), "op input");
  if (!host.empty()) {
    EXPECT_TRUE(
        backend.copy_to_device(buffer.data(), host.data(), host.size() * sizeof(T)).is_ok());
  }
  return buffer;
}

DeviceBuffer upload_bytes(Backend& backend, const void* bytes, size_t count) {
  DeviceBuffer buffer(backend, std::max<size_t>(1, count), "op input");
  EXPECT_TRUE(backend.copy_to_device(buffer.data(), bytes, count).is_ok());
  return buffer;
}

// An output, filled with a pattern no op writes (NaN floats, -7 ints), so that an element an op
// leaves unwritten shows.
template <typename T>
DeviceBuffer output(Backend& backend, size_t count) {
  std::vector<T> poison(count);
  if constexpr (std::is_floating_point_v<T>) {
    std::fill(poison.begin(), poison.end(), std::numeric_limits<T>::quiet_NaN());
  } else {
    std::fill(poison.begin(), poison.end(), static_cast<T>(-7));
  }
  return upload(backend, poison);
}

template <typename T>
std::vector<T> download(Backend& backend, const DeviceBuffer& buffer, size_t count) {
  std::vector<T> host(count);
  if (count > 0) {
    EXPECT_TRUE(backend.copy_to_host(host.data(), buffer.data(), count * sizeof(T)).is_ok());
  }
  return host;
}

// What an op wrote: its float outputs and its integer outputs, each flattened.
struct Outputs {
  std::vector<std::vector<double>> floats;
  std::vector<std::vector<int64_t>> integers;
};

template <typename T>
std::vector<double> as_doubles(const std::vector<T>& values) {
  return {values.begin(), values.end()};
}

template <typename T>
std::vector<int64_t> as_integers(const std::vector<T>& values) {
  return {values.begin(), values.end()};
}

// How far a device's float output may lie from the CPU reference: |got - want| <= absolute +
// relative * |want|. Integer outputs are always exact. The CPU's own backends are held to bitwise.
struct Tolerance {
  double absolute = 0.0;
  double relative = 0.0;
};

struct OpCase {
  std::string name;  // "op/dtype/shape"
  Tolerance device;  // on a device, against the CPU
  std::function<Outputs(Backend&)> run;
};

void expect_ok(const Status& status) {
  EXPECT_TRUE(status.is_ok()) << status.to_string();
}

// A stored tensor's bytes: F32, F16, BF16 from test_support's store(); FP8 and INT8 as codes of
// values in [-1, 1) scaled to the code range, with one scale per output row (1 / the code range).
struct Weight {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;  // quantized: [rows]
};

Weight weight_of(DType dtype, int64_t rows, int64_t columns, uint64_t seed) {
  const std::vector<float> values = random_floats(static_cast<size_t>(rows * columns), seed);
  Weight weight;
  if (is_quantized(dtype)) {
    const float code_max = dtype == DType::kI8 ? 127.0f : kF8E4M3Max;
    for (const float value : values) {
      weight.bytes.push_back(dtype == DType::kI8 ? static_cast<uint8_t>(static_cast<int8_t>(
                                                       std::nearbyint(value * code_max)))
                                                 : f32_to_f8e4m3(value * code_max));
    }
    weight.scales.assign(static_cast<size_t>(rows), 1.0f / code_max);
    return weight;
  }
  const testing::StoredTensor stored = testing::store(values, dtype);
  const auto* first = static_cast<const uint8_t*>(stored.data(dtype));
  weight.bytes.assign(first, first + stored.bytes(dtype));
  return weight;
}

// ---- the cases
// ------------------------------------------------------------------------------------

std::vector<OpCase> op_cases() {
  std::vector<OpCase> cases;
  const Tolerance exact{};
  const Tolerance close{1e-5, 1e-5};  // one rounding or a different summation order

  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const std::array<int64_t, 3> shape : {std::array<int64_t, 3>{1, 16, 8}, {5, 32, 64}}) {
      const int64_t tokens = shape[0], vocab = shape[1], dim = shape[2];
      cases.push_back(
          {"embedding/" + std::string(dtype_name(dtype)) + "/" + std::to_string(tokens) + "x" +
               std::to_string(dim),
           exact, [=](Backend& backend) {
             const Weight table = weight_of(dtype, vocab, dim, 11 + dim);
             std::vector<int32_t> ids;
             for (int64_t t = 0; t < tokens; ++t)
               ids.push_back(static_cast<int32_t>((t * 7 + 3) % vocab));
             const DeviceBuffer ids_d = upload(backend, ids);
             const DeviceBuffer table_d = upload(backend, table.bytes);
             const DeviceBuffer out = output<float>(backend, tokens * dim);
             expect_ok(backend.embedding({tokens, vocab, dim, dtype}, ids_d.as<int32_t>(),
                                         table_d.data(), out.as<float>()));
             return Outputs{{as_doubles(download<float>(backend, out, tokens * dim))}, {}};
           }});
    }
  }
  // Gemma's scaled rows: one rounding of each element times the scale, on every backend.
  cases.push_back({"embedding/bf16/scaled/5x64", exact, [](Backend& backend) {
                     const Weight table = weight_of(DType::kBF16, 32, 64, 75);
                     const std::vector<int32_t> ids = {3, 0, 31, 3, 17};
                     const DeviceBuffer ids_d = upload(backend, ids);
                     const DeviceBuffer table_d = upload(backend, table.bytes);
                     const DeviceBuffer out = output<float>(backend, 5 * 64);
                     expect_ok(backend.embedding(
                         {5, 32, 64, DType::kBF16, kernels::WeightLayout::kRows, std::sqrt(64.5f)},
                         ids_d.as<int32_t>(), table_d.data(), out.as<float>()));
                     return Outputs{{as_doubles(download<float>(backend, out, 5 * 64))}, {}};
                   }});

  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const std::array<int64_t, 2> size : {std::array<int64_t, 2>{1, 16}, {3, 96}}) {
      const int64_t rows = size[0], dim = size[1];
      const std::string shape = std::to_string(rows) + "x" + std::to_string(dim);
      cases.push_back(
          {"rmsnorm/" + std::string(dtype_name(dtype)) + "/" + shape, close, [=](Backend& backend) {
             const Weight weight = weight_of(dtype, 1, dim, 21);
             const DeviceBuffer x = upload(backend, random_floats(rows * dim, 22, 3.0f));
             const DeviceBuffer w = upload(backend, weight.bytes);
             const DeviceBuffer out = output<float>(backend, rows * dim);
             expect_ok(backend.rmsnorm({rows, dim, 1e-6f, dtype}, x.as<float>(), w.data(),
                                       out.as<float>()));
             return Outputs{{as_doubles(download<float>(backend, out, rows * dim))}, {}};
           }});
      cases.push_back(
          {"add_rmsnorm/" + std::string(dtype_name(dtype)) + "/" + shape, close,
           [=](Backend& backend) {
             const Weight weight = weight_of(dtype, 1, dim, 23);
             const DeviceBuffer addend = upload(backend, random_floats(rows * dim, 24));
             const DeviceBuffer accumulator = upload(backend, random_floats(rows * dim, 25));
             const DeviceBuffer w = upload(backend, weight.bytes);
             const DeviceBuffer out = output<float>(backend, rows * dim);
             expect_ok(backend.add_rmsnorm({rows, dim, 1e-6f, dtype}, addend.as<float>(),
                                           accumulator.as<float>(), w.data(), out.as<float>()));
             return Outputs{{as_doubles(download<float>(backend, out, rows * dim)),
                             as_doubles(download<float>(backend, accumulator, rows * dim))},
                            {}};
           }});
    }
  }

  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kI8}) {
    for (const int64_t rows : {1, 5, 17}) {
      for (const std::array<int64_t, 2> size : {std::array<int64_t, 2>{32, 21}, {64, 48}}) {
        const int64_t in = size[0], out_features = size[1];
        for (const bool with_bias : {false, true}) {
          // A device's GEMM (rows past 16) rounds x to the weight's half dtype first.
          const bool half = dtype == DType::kBF16 || dtype == DType::kF16;
          const Tolerance tolerance =
              rows > 16 && half ? Tolerance{2e-2, 1e-2} : Tolerance{1e-4, 1e-4};
          cases.push_back(
              {"matmul/" + std::string(dtype_name(dtype)) + "/" + std::to_string(rows) + "x" +
                   std::to_string(in) + "x" + std::to_string(out_features) +
                   (with_bias ? "+bias" : ""),
               tolerance, [=](Backend& backend) {
                 const Weight weight = weight_of(dtype, out_features, in, 31 + in);
                 kernels::MatmulParams params{rows, in, out_features, dtype, DType::kF32};
                 if (is_quantized(dtype)) {
                   params.scale_block_rows = 1;
                   params.scale_block_cols = in;
                 }
                 const DeviceBuffer x = upload(backend, random_floats(rows * in, 32 + rows));
                 const DeviceBuffer w = upload(backend, weight.bytes);
                 const DeviceBuffer scales = upload(backend, weight.scales);
                 const DeviceBuffer bias = upload(backend, random_floats(out_features, 33));
                 const DeviceBuffer out = output<float>(backend, rows * out_features);
                 expect_ok(backend.matmul(params, x.as<float>(), w.data(),
                                          is_quantized(dtype) ? scales.as<float>() : nullptr,
                                          with_bias ? bias.data() : nullptr, out.as<float>()));
                 return Outputs{{as_doubles(download<float>(backend, out, rows * out_features))},
                                {}};
               }});
        }
      }
    }
  }

  cases.push_back({"matmul_group/f32/3x40x(8,16,24)", Tolerance{1e-4, 1e-4}, [](Backend& backend) {
                     constexpr int64_t rows = 3, in = 40;
                     const DeviceBuffer x = upload(backend, random_floats(rows * in, 41));
                     std::vector<DeviceBuffer> weights, outs;
                     kernels::MatmulTarget targets[3];
                     for (int64_t t = 0; t < 3; ++t) {
                       const int64_t out_features = 8 * (t + 1);
                       weights.push_back(upload(backend, random_floats(out_features * in, 42 + t)));
                       outs.push_back(output<float>(backend, rows * out_features));
                       targets[t] = {{rows, in, out_features, DType::kF32, DType::kF32},
                                     weights.back().data(),
                                     nullptr,
                                     nullptr,
                                     outs.back().as<float>()};
                     }
                     expect_ok(backend.matmul_group(x.as<float>(), targets, 3));
                     Outputs outputs;
                     for (int64_t t = 0; t < 3; ++t) {
                       outputs.floats.push_back(
                           as_doubles(download<float>(backend, outs[t], rows * 8 * (t + 1))));
                     }
                     return outputs;
                   }});

  constexpr int64_t kHeads = 4, kKvHeads = 2, kHeadDim = 16;
  for (const kernels::RopeStyle style :
       {kernels::RopeStyle::kRotateHalf, kernels::RopeStyle::kInterleaved}) {
    for (const int64_t tokens : {1, 4}) {
      const std::string name =
          std::string(style == kernels::RopeStyle::kRotateHalf ? "rotate_half" : "interleaved") +
          "/" + std::to_string(tokens) + "x" + std::to_string(kHeadDim);
      cases.push_back(
          {"rope/" + name, close, [=](Backend& backend) {
             std::vector<int32_t> positions;
             for (int64_t t = 0; t < tokens; ++t)
               positions.push_back(static_cast<int32_t>(3 + 5 * t));
             std::vector<float> inv_freq;
             for (int64_t i = 0; i < kHeadDim / 2; ++i)
               inv_freq.push_back(std::pow(10000.0f, -2.0f * i / kHeadDim));
             const DeviceBuffer p = upload(backend, positions);
             const DeviceBuffer f = upload(backend, inv_freq);
             const DeviceBuffer q = upload(backend, random_floats(tokens * kHeads * kHeadDim, 51));
             const DeviceBuffer k =
                 upload(backend, random_floats(tokens * kKvHeads * kHeadDim, 52));
             expect_ok(backend.rope({tokens, kHeads, kKvHeads, kHeadDim, style}, p.as<int32_t>(),
                                    f.as<float>(), q.as<float>(), k.as<float>()));
             return Outputs{{as_doubles(download<float>(backend, q, tokens * kHeads * kHeadDim)),
                             as_doubles(download<float>(backend, k, tokens * kKvHeads * kHeadDim))},
                            {}};
           }});
    }
  }

  for (const DType cache_dtype : {DType::kF32, DType::kBF16}) {
    constexpr int64_t kSlots = 16, tokens = 3;
    const size_t cache_bytes = kSlots * kKvHeads * kHeadDim * dtype_size(cache_dtype);
    cases.push_back(
        {"kv_write/" + std::string(dtype_name(cache_dtype)) + "/3", exact, [=](Backend& backend) {
           const std::vector<int32_t> slots = {9, 2, 14};
           const DeviceBuffer s = upload(backend, slots);
           const DeviceBuffer k = upload(backend, random_floats(tokens * kKvHeads * kHeadDim, 61));
           const DeviceBuffer v = upload(backend, random_floats(tokens * kKvHeads * kHeadDim, 62));
           const DeviceBuffer k_cache = upload(backend, std::vector<uint8_t>(cache_bytes, 0));
           const DeviceBuffer v_cache = upload(backend, std::vector<uint8_t>(cache_bytes, 0));
           expect_ok(backend.kv_write({tokens, kKvHeads, kHeadDim, kSlots, cache_dtype},
                                      k.as<float>(), v.as<float>(), s.as<int32_t>(), k_cache.data(),
                                      v_cache.data()));
           return Outputs{{},
                          {as_integers(download<uint8_t>(backend, k_cache, cache_bytes)),
                           as_integers(download<uint8_t>(backend, v_cache, cache_bytes))}};
         }});
    cases.push_back(
        {"rope_kv_write/" + std::string(dtype_name(cache_dtype)) + "/3", close,
         [=](Backend& backend) {
           const std::vector<int32_t> slots = {4, 5, 6};
           const std::vector<int32_t> positions = {4, 5, 6};
           std::vector<float> inv_freq;
           for (int64_t i = 0; i < kHeadDim / 2; ++i)
             inv_freq.push_back(std::pow(10000.0f, -2.0f * i / kHeadDim));
           const DeviceBuffer s = upload(backend, slots);
           const DeviceBuffer p = upload(backend, positions);
           const DeviceBuffer f = upload(backend, inv_freq);
           const DeviceBuffer q = upload(backend, random_floats(tokens * kHeads * kHeadDim, 63));
           const DeviceBuffer k = upload(backend, random_floats(tokens * kKvHeads * kHeadDim, 64));
           const DeviceBuffer v = upload(backend, random_floats(tokens * kKvHeads * kHeadDim, 65));
           const DeviceBuffer k_cache = upload(backend, std::vector<uint8_t>(cache_bytes, 0));
           const DeviceBuffer v_cache = upload(backend, std::vector<uint8_t>(cache_bytes, 0));
           expect_ok(backend.rope_kv_write(
               {tokens, kHeads, kKvHeads, kHeadDim, kernels::RopeStyle::kRotateHalf},
               {tokens, kKvHeads, kHeadDim, kSlots, cache_dtype}, p.as<int32_t>(), f.as<float>(),
               s.as<int32_t>(), q.as<float>(), k.as<float>(), v.as<float>(), k_cache.data(),
               v_cache.data()));
           return Outputs{{as_doubles(download<float>(backend, q, tokens * kHeads * kHeadDim)),
                           as_doubles(download<float>(backend, k, tokens * kKvHeads * kHeadDim))},
                          {as_integers(download<uint8_t>(backend, v_cache, cache_bytes))}};
         }});
  }

  for (const DType cache_dtype : {DType::kF32, DType::kBF16}) {
    for (const int64_t window : {0, 3}) {
      cases.push_back(
          {"attention/" + std::string(dtype_name(cache_dtype)) + "/2 sequences/window " +
               std::to_string(window),
           Tolerance{1e-5, 1e-4}, [=](Backend& backend) {
             // Two sequences: 1 new token over 5 positions, 3 over 9; blocks of 4.
             constexpr int64_t kBlock = 4, kMaxBlocks = 3, kBlocks = 6, tokens = 4;
             const int64_t slots = kBlocks * kBlock;
             const std::vector<int32_t> query_start = {0, 1, 4};
             const std::vector<int32_t> lengths = {5, 9};
             const std::vector<int32_t> tables = {5, 0, 2, 1, 4, 3};
             const testing::StoredTensor keys =
                 testing::store(random_floats(slots * kKvHeads * kHeadDim, 71), cache_dtype);
             const testing::StoredTensor values =
                 testing::store(random_floats(slots * kKvHeads * kHeadDim, 72), cache_dtype);
             const DeviceBuffer k =
                 upload_bytes(backend, keys.data(cache_dtype), keys.bytes(cache_dtype));
             const DeviceBuffer v =
                 upload_bytes(backend, values.data(cache_dtype), values.bytes(cache_dtype));
             const DeviceBuffer q = upload(backend, random_floats(tokens * kHeads * kHeadDim, 73));
             const DeviceBuffer starts = upload(backend, query_start);
             const DeviceBuffer context = upload(backend, lengths);
             const DeviceBuffer block_tables = upload(backend, tables);
             const DeviceBuffer out = output<float>(backend, tokens * kHeads * kHeadDim);
             const kernels::AttentionParams params{2,        tokens,     kHeads,     kKvHeads,
                                                   kHeadDim, kBlock,     kMaxBlocks, 0.25f,
                                                   window,   cache_dtype};
             expect_ok(backend.attention(params, q.as<float>(), k.data(), v.data(),
                                         starts.as<int32_t>(), context.as<int32_t>(),
                                         block_tables.as<int32_t>(), nullptr, out.as<float>()));
             return Outputs{{as_doubles(download<float>(backend, out, tokens * kHeads * kHeadDim))},
                            {}};
           }});
    }
  }

  for (const auto& [name, activation] :
       {std::pair{"silu", kernels::GateActivation::kSilu},
        std::pair{"gelu_tanh", kernels::GateActivation::kGeluTanh}}) {
    // 3 x 41: the vector path's tail too. The device's exp and tanh are within 2 ulp of libm's.
    cases.push_back({std::string("gated_activation/") + name + "/f32/3x41", close,
                     [activation = activation](Backend& backend) {
                       const DeviceBuffer gate = upload(backend, random_floats(123, 81, 4.0f));
                       const DeviceBuffer up = upload(backend, random_floats(123, 82));
                       const DeviceBuffer out = output<float>(backend, 123);
                       expect_ok(backend.gated_activation({3, 41, activation}, gate.as<float>(),
                                                          up.as<float>(), out.as<float>()));
                       return Outputs{{as_doubles(download<float>(backend, out, 123))}, {}};
                     }});
  }
  cases.push_back({"add/f32/77", exact, [](Backend& backend) {
                     const DeviceBuffer addend = upload(backend, random_floats(77, 83));
                     const DeviceBuffer accumulator = upload(backend, random_floats(77, 84));
                     expect_ok(backend.add(77, addend.as<float>(), accumulator.as<float>()));
                     return Outputs{{as_doubles(download<float>(backend, accumulator, 77))}, {}};
                   }});
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kI8}) {
    cases.push_back(
        {"fill_uniform/" + std::string(dtype_name(dtype)) + "/1000", exact, [=](Backend& backend) {
           const size_t bytes = 1000 * dtype_size(dtype);
           const DeviceBuffer out = output<uint8_t>(backend, bytes);
           expect_ok(backend.fill_uniform({1000, dtype, 91, -0.5f, 0.75f}, out.data()));
           return Outputs{{}, {as_integers(download<uint8_t>(backend, out, bytes))}};
         }});
  }

  // Rows of logits with every setting: greedy, plain, top-k, top-p, min-p, all at once.
  const std::vector<kernels::LogitsSettings> settings = {
      {0.0f, 0, 1.0f, 0.0f}, {1.0f, 0, 1.0f, 0.0f}, {0.7f, 5, 1.0f, 0.0f},
      {1.3f, 0, 0.8f, 0.0f}, {1.0f, 0, 1.0f, 0.2f}, {0.9f, 7, 0.9f, 0.05f}};
  constexpr int64_t kVocab = 50;
  const auto rows = static_cast<int64_t>(settings.size());
  cases.push_back({"process_logits/f32/6x50", close, [=](Backend& backend) {
                     const DeviceBuffer logits =
                         upload(backend, random_floats(rows * kVocab, 101, 4.0f));
                     const DeviceBuffer s = upload(backend, settings);
                     const DeviceBuffer probs = output<float>(backend, rows * kVocab);
                     const DeviceBuffer status = output<int32_t>(backend, rows);
                     expect_ok(backend.process_logits({rows, kVocab}, logits.as<float>(),
                                                      s.as<kernels::LogitsSettings>(),
                                                      probs.as<float>(), status.as<int32_t>()));
                     return Outputs{{as_doubles(download<float>(backend, probs, rows * kVocab))},
                                    {as_integers(download<int32_t>(backend, status, rows))}};
                   }});
  cases.push_back({"argmax/f32/6x50", exact, [=](Backend& backend) {
                     std::vector<float> values = random_floats(rows * kVocab, 102);
                     values[7] = values[9] = 5.0f;  // a tie: the lower index
                     const DeviceBuffer v = upload(backend, values);
                     const DeviceBuffer out = output<int32_t>(backend, rows);
                     expect_ok(backend.argmax({rows, kVocab}, v.as<float>(), out.as<int32_t>()));
                     return Outputs{{}, {as_integers(download<int32_t>(backend, out, rows))}};
                   }});
  // Penalties and bias as edits (a repetition penalty on positive and negative logits, a token
  // outside the row, rows without edits), with and without a grammar's masks.
  for (const bool masked : {false, true}) {
    cases.push_back(
        {std::string("edit_logits/f32/6x50/") + (masked ? "masked" : "unmasked"), exact,
         [=](Backend& backend) {
           std::vector<float> values = random_floats(rows * kVocab, 104, 3.0f);
           values[3] = 2.5f;
           values[4] = -2.5f;
           const std::vector<int64_t> begin = {0, 4, 4, 7, 7, 8, 10};
           const std::vector<kernels::LogitEdit> edits = {
               {3, 1.3f, 0.0f},  {4, 1.3f, -0.4f}, {9, 1.0f, 5.0f},  {60, 2.0f, 1.0f},
               {0, 1.1f, -0.2f}, {49, 0.8f, 0.1f}, {-1, 2.0f, 1.0f}, {17, 1.0f, -100.0f},
               {5, 1.5f, 0.25f}, {6, 1.0f, 100.0f}};
           std::vector<uint32_t> masks;
           for (int64_t r = 0; r < rows; ++r) {
             masks.push_back(r == 2 ? 0xffffffffu : 0xa5f00ff3u ^ static_cast<uint32_t>(r));
             masks.push_back(r == 2 ? 0x3ffffu : 0x2a0f1u + static_cast<uint32_t>(r));
           }
           const DeviceBuffer logits = upload(backend, values);
           const DeviceBuffer b = upload(backend, begin);
           const DeviceBuffer e = upload(backend, edits);
           const DeviceBuffer m = upload(backend, masks);
           expect_ok(backend.edit_logits({rows, kVocab, masked ? 2 : 0}, b.as<int64_t>(),
                                         e.as<kernels::LogitEdit>(),
                                         masked ? m.as<uint32_t>() : nullptr, logits.as<float>()));
           return Outputs{{as_doubles(download<float>(backend, logits, rows * kVocab))}, {}};
         }});
  }
  // Each row's log-softmax at a chosen token (read through a slot: none, out of the row, a token)
  // and its top tokens, with ties (the lower id first) and banned tokens; top 0 too.
  for (const int64_t top : {int64_t{0}, int64_t{5}}) {
    cases.push_back(
        {"token_logprobs/f32/6x50/top" + std::to_string(top), close, [=](Backend& backend) {
           std::vector<float> values = random_floats(rows * kVocab, 105, 4.0f);
           values[7] = values[9] = 6.0f;
           for (int64_t t = 0; t < kVocab; t += 2) values[kVocab + t] = -INFINITY;
           const std::vector<int32_t> slots = {0, -1, 1, 2, 3, 4};
           const std::vector<int32_t> tokens = {9, 1, 49, 50, 0};
           const DeviceBuffer logits = upload(backend, values);
           const DeviceBuffer s = upload(backend, slots);
           const DeviceBuffer t = upload(backend, tokens);
           const DeviceBuffer chosen = output<float>(backend, rows);
           const DeviceBuffer top_tokens = output<int32_t>(backend, rows * top);
           const DeviceBuffer top_logprobs = output<float>(backend, rows * top);
           expect_ok(backend.token_logprobs({rows, kVocab, top}, logits.as<float>(),
                                            s.as<int32_t>(), t.as<int32_t>(), chosen.as<float>(),
                                            top_tokens.as<int32_t>(), top_logprobs.as<float>()));
           return Outputs{{as_doubles(download<float>(backend, chosen, rows)),
                           as_doubles(download<float>(backend, top_logprobs, rows * top))},
                          {as_integers(download<int32_t>(backend, top_tokens, rows * top))}};
         }});
  }
  cases.push_back(
      {"sample/argmax/6x50", close, [=](Backend& backend) {
         std::vector<kernels::SampleRow> sample_rows(static_cast<size_t>(rows));
         for (int64_t r = 0; r < rows; ++r) {
           kernels::SampleRow& row = sample_rows[static_cast<size_t>(r)];
           row.settings = {0.0f, 0, 1.0f, 0.0f};
           row.seed = 5;
           row.position = r;
           row.rule = kernels::SampleRule::kArgmax;
           row.draw = kernels::Draw::kDraft;
           row.ranked = 4;
           row.probe = static_cast<int32_t>(r);
           row.weigh = 1;
         }
         const DeviceBuffer s = upload(backend, sample_rows);
         const DeviceBuffer logits = upload(backend, random_floats(rows * kVocab, 103, 3.0f));
         const DeviceBuffer q = output<float>(backend, rows * kVocab);
         const DeviceBuffer out = output<uint8_t>(backend, rows * sizeof(kernels::SampledRow));
         const DeviceBuffer drawn = output<int32_t>(backend, rows);
         expect_ok(backend.sample({rows, kVocab, kVocab}, s.as<kernels::SampleRow>(),
                                  logits.as<float>(), nullptr, q.as<float>(),
                                  out.as<kernels::SampledRow>(), drawn.as<int32_t>()));
         std::vector<kernels::SampledRow> sampled(static_cast<size_t>(rows));
         expect_ok(backend.copy_to_host(sampled.data(), out.data(),
                                        sampled.size() * sizeof(kernels::SampledRow)));
         Outputs outputs;
         outputs.floats.push_back(as_doubles(download<float>(backend, q, rows * kVocab)));
         std::vector<double> weights;
         std::vector<int64_t> tokens = as_integers(download<int32_t>(backend, drawn, rows));
         for (const kernels::SampledRow& row : sampled) {
           weights.push_back(row.top_probability);
           weights.push_back(row.token_weight);
           weights.push_back(row.probe_weight);
           tokens.push_back(row.token);
           tokens.push_back(row.status);
           tokens.insert(tokens.end(), row.ranked, row.ranked + 4);
         }
         outputs.floats.push_back(weights);
         outputs.integers.push_back(tokens);
         return outputs;
       }});
  cases.push_back({"verify/greedy/3x4", exact, [](Backend& backend) {
                     // Three rows of 4 drafts; p rows are one-hot-ish so the argmax is clear.
                     constexpr int64_t batch = 3, gamma = 4, vocab = 12;
                     const int64_t p_rows = batch * (gamma + 1);
                     std::vector<float> p(static_cast<size_t>(p_rows * vocab), 0.01f);
                     std::vector<int32_t> argmax;
                     for (int64_t r = 0; r < p_rows; ++r) {
                       argmax.push_back(static_cast<int32_t>((r * 5 + 1) % vocab));
                       p[static_cast<size_t>(r * vocab + argmax.back())] = 0.9f;
                     }
                     std::vector<int32_t> drafts;
                     std::vector<kernels::VerifyRow> verify_rows;
                     for (int64_t b = 0; b < batch; ++b) {
                       // Row b agrees with the target for its first b drafts.
                       for (int64_t i = 0; i < gamma; ++i) {
                         const int32_t target = argmax[static_cast<size_t>(b * (gamma + 1) + i)];
                         drafts.push_back(i < b ? target : (target + 1) % vocab);
                       }
                       verify_rows.push_back({7, 0, b * (gamma + 1), static_cast<int32_t>(gamma),
                                              kernels::VerifyRule::kGreedy});
                     }
                     const DeviceBuffer r = upload(backend, verify_rows);
                     const DeviceBuffer p_d = upload(backend, p);
                     const DeviceBuffer d = upload(backend, drafts);
                     const DeviceBuffer tokens = output<int32_t>(backend, batch * (gamma + 1));
                     const DeviceBuffer accepted = output<int32_t>(backend, batch);
                     const DeviceBuffer taken = output<int32_t>(backend, batch);
                     expect_ok(backend.verify(
                         {batch, gamma, p_rows, vocab, 0, 0}, r.as<kernels::VerifyRow>(),
                         p_d.as<float>(), nullptr, nullptr, d.as<int32_t>(), nullptr, nullptr,
                         tokens.as<int32_t>(), accepted.as<int32_t>(), taken.as<int32_t>()));
                     return Outputs{
                         {},
                         {as_integers(download<int32_t>(backend, tokens, batch * (gamma + 1))),
                          as_integers(download<int32_t>(backend, accepted, batch)),
                          as_integers(download<int32_t>(backend, taken, batch))}};
                   }});
  return cases;
}

// ---- bad shapes
// -----------------------------------------------------------------------------------

struct BadShape {
  std::string name;
  std::function<Status(Backend&)> call;  // the op with a bad shape; pointers are never read
};

std::vector<BadShape> bad_shapes() {
  // Every pointer is null: a backend that read one before checking the shape would crash.
  return {
      {"embedding: dim 0",
       [](Backend& b) {
         return b.embedding({1, 4, 0, DType::kF32}, nullptr, nullptr, nullptr);
       }},
      {"embedding: a scale that is not finite",
       [](Backend& b) {
         return b.embedding({1, 4, 4, DType::kF32, kernels::WeightLayout::kRows,
                             std::numeric_limits<float>::infinity()},
                            nullptr, nullptr, nullptr);
       }},
      {"rmsnorm: negative eps",
       [](Backend& b) {
         return b.rmsnorm({1, 4, -1.0f, DType::kF32}, nullptr, nullptr, nullptr);
       }},
      {"add_rmsnorm: negative rows",
       [](Backend& b) {
         return b.add_rmsnorm({-1, 4, 1e-6f, DType::kF32}, nullptr, nullptr, nullptr, nullptr);
       }},
      {"matmul: in_features 0",
       [](Backend& b) {
         return b.matmul({1, 0, 4, DType::kF32, DType::kF32}, nullptr, nullptr, nullptr, nullptr,
                         nullptr);
       }},
      {"matmul: a quantized weight without scales",
       [](Backend& b) {
         return b.matmul({1, 16, 4, DType::kI8, DType::kF32, 1, 16}, nullptr, nullptr, nullptr,
                         nullptr, nullptr);
       }},
      {"matmul_group: no targets", [](Backend& b) { return b.matmul_group(nullptr, nullptr, 0); }},
      {"rope: odd head_dim",
       [](Backend& b) {
         return b.rope({1, 1, 1, 3, kernels::RopeStyle::kRotateHalf}, nullptr, nullptr, nullptr,
                       nullptr);
       }},
      {"kv_write: an i8 cache",
       [](Backend& b) {
         return b.kv_write({1, 1, 4, 4, DType::kI8}, nullptr, nullptr, nullptr, nullptr, nullptr);
       }},
      {"rope_kv_write: different tokens",
       [](Backend& b) {
         return b.rope_kv_write({2, 1, 1, 4, kernels::RopeStyle::kRotateHalf},
                                {1, 1, 4, 4, DType::kF32}, nullptr, nullptr, nullptr, nullptr,
                                nullptr, nullptr, nullptr, nullptr);
       }},
      {"attention: heads not a multiple of the kv heads",
       [](Backend& b) {
         return b.attention({1, 1, 3, 2, 4, 4, 1, 0.5f, 0, DType::kF32}, nullptr, nullptr, nullptr,
                            nullptr, nullptr, nullptr, nullptr, nullptr);
       }},
      {"gated_activation: dim 0",
       [](Backend& b) {
         return b.gated_activation({1, 0}, nullptr, nullptr, nullptr);
       }},
      {"gated_activation: an activation out of the enum",
       [](Backend& b) {
         return b.gated_activation({1, 4, static_cast<kernels::GateActivation>(7)}, nullptr,
                                   nullptr, nullptr);
       }},
      {"add: negative count", [](Backend& b) { return b.add(-1, nullptr, nullptr); }},
      {"fill_uniform: low above high",
       [](Backend& b) {
         return b.fill_uniform({4, DType::kF32, 1, 1.0f, 0.0f}, nullptr);
       }},
      {"process_logits: vocab 0",
       [](Backend& b) {
         return b.process_logits({1, 0}, nullptr, nullptr, nullptr, nullptr);
       }},
      {"edit_logits: masks without their width",
       [](Backend& b) {
         static const uint32_t mask = 0;
         return b.edit_logits({1, 40, 0}, nullptr, nullptr, &mask, nullptr);
       }},
      {"edit_logits: a mask width not the vocabulary's",
       [](Backend& b) {
         static const uint32_t mask = 0;
         return b.edit_logits({1, 40, 1}, nullptr, nullptr, &mask, nullptr);
       }},
      {"token_logprobs: more than 20 top tokens",
       [](Backend& b) {
         return b.token_logprobs({1, 40, 21}, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
       }},
      {"argmax: negative rows",
       [](Backend& b) {
         return b.argmax({-1, 4}, nullptr, nullptr);
       }},
      {"sample: vocab below width",
       [](Backend& b) {
         return b.sample({1, 8, 4}, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
       }},
      {"verify: q without its width",
       [](Backend& b) {
         static const float q = 0.0f;
         return b.verify({1, 1, 2, 4, 0, 0}, nullptr, nullptr, nullptr, &q, nullptr, nullptr,
                         nullptr, nullptr, nullptr, nullptr);
       }},
  };
}

// ---- the backends
// -----------------------------------------------------------------------------------

#if SPECRUN_TEST_CUDA
const char* const kBackends[] = {"cuda"};
#else
const char* const kBackends[] = {"cpu", "deferred"};
#endif

// The backend named, or null with a reason to skip.
std::unique_ptr<Backend> make_backend(const std::string& name, std::string* skip) {
  if (name == "cpu") return testing::make_cpu_backend(2);
  if (name == "deferred") {
    return std::make_unique<testing::DeferredBackend>(testing::make_cpu_backend(2), 17);
  }
#if SPECRUN_TEST_CUDA
  std::vector<kernels::cuda::DeviceInfo> devices;
  const Status listed = kernels::cuda::list_devices(&devices);
  if (!listed.is_ok() || devices.empty()) {
    *skip = "no CUDA device" + (listed.is_ok() ? std::string() : ": " + listed.to_string());
    return nullptr;
  }
  std::unique_ptr<kernels::cuda::CudaBackend> cuda;
  const Status created = kernels::cuda::CudaBackend::create(0, &cuda);
  if (!created.is_ok()) {
    ADD_FAILURE() << created.to_string();
    return nullptr;
  }
  return cuda;
#else
  *skip = "unknown backend " + name;
  return nullptr;
#endif
}

// `got` against `want`: float outputs within `tolerance` (bit for bit where it is zero), integer
// outputs exactly. Names the first few elements off.
void expect_matches(const Outputs& got, const Outputs& want, const Tolerance& tolerance) {
  const bool bitwise = tolerance.absolute == 0.0 && tolerance.relative == 0.0;
  ASSERT_EQ(got.floats.size(), want.floats.size());
  for (size_t o = 0; o < want.floats.size(); ++o) {
    ASSERT_EQ(got.floats[o].size(), want.floats[o].size());
    int64_t off = 0;
    std::string first_off;  // the first few, named
    for (size_t i = 0; i < want.floats[o].size(); ++i) {
      const double g = got.floats[o][i], w = want.floats[o][i];
      const bool same =
          bitwise ? std::memcmp(&g, &w, sizeof(double)) == 0 || (std::isnan(g) && std::isnan(w))
                  : std::fabs(g - w) <= tolerance.absolute + tolerance.relative * std::fabs(w);
      if (!same && off++ < 3) {
        std::ostringstream text;
        text.precision(17);
        text << " [" << i << "] " << g << " vs " << w;
        first_off += text.str();
      }
    }
    if (off > 0) {
      ADD_FAILURE() << "float output " << o << ": " << off
                    << " elements off the CPU's:" << first_off;
    }
  }
  EXPECT_EQ(got.integers, want.integers) << "integer outputs differ";
}

class BackendOps : public ::testing::TestWithParam<std::tuple<const char*, size_t>> {};

TEST_P(BackendOps, MatchTheCpuReference) {
  const auto [backend_name, index] = GetParam();
  static const std::vector<OpCase> cases = op_cases();
  const OpCase& op = cases[index];
  SCOPED_TRACE(op.name);
  std::string skip;
  const std::unique_ptr<Backend> backend = make_backend(backend_name, &skip);
  if (backend == nullptr) GTEST_SKIP() << skip;
  const std::unique_ptr<Backend> reference = testing::make_cpu_backend(2);
  const Outputs want = op.run(*reference);
  const Outputs got = op.run(*backend);
  // The reference wrote every float it was asked for (no poison left), and the op did something.
  ASSERT_FALSE(want.floats.empty() && want.integers.empty());
  for (const std::vector<double>& values : want.floats) {
    EXPECT_TRUE(std::none_of(values.begin(), values.end(), [](double v) { return std::isnan(v); }));
  }
  // The CPU's own backends run the reference's code: bit for bit.
  const bool bitwise = std::string(backend_name) != "cuda";
  expect_matches(got, want, bitwise ? Tolerance{} : op.device);
}

std::string case_name(const ::testing::TestParamInfo<BackendOps::ParamType>& info) {
  static const std::vector<OpCase> cases = op_cases();
  std::string name =
      std::string(std::get<0>(info.param)) + "_" + cases[std::get<1>(info.param)].name;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Cases, BackendOps,
                         ::testing::Combine(::testing::ValuesIn(kBackends),
                                            ::testing::Range<size_t>(0, op_cases().size())),
                         case_name);

// The comparison fails an op one element off, one ulp off where it holds bitwise, and one
// integer off.
TEST(BackendOpsHarness, CatchesAnOutputThatIsOff) {
  const std::unique_ptr<Backend> cpu = testing::make_cpu_backend(1);
  for (const OpCase& op : op_cases()) {
    if (op.name.rfind("add_rmsnorm/", 0) == 0) {
      const Outputs want = op.run(*cpu);
      Outputs got = want;
      got.floats[0][3] = std::nextafter(got.floats[0][3], 1e9);
      EXPECT_NONFATAL_FAILURE(expect_matches(got, want, Tolerance{}),
                              "float output 0: 1 elements off");
      got.floats[0][3] += 1.0;
      EXPECT_NONFATAL_FAILURE(expect_matches(got, want, Tolerance{1e-5, 1e-5}), "float output");
    }
    if (op.name.rfind("argmax/", 0) == 0) {
      const Outputs want = op.run(*cpu);
      Outputs got = want;
      got.integers[0][1] += 1;
      EXPECT_NONFATAL_FAILURE(expect_matches(got, want, Tolerance{}), "integer outputs differ");
    }
  }
}

class BackendBadShapes : public ::testing::TestWithParam<const char*> {};

TEST_P(BackendBadShapes, AreRefusedBeforeAnyBackendRunsAnything) {
  std::string skip;
  const std::unique_ptr<Backend> backend = make_backend(GetParam(), &skip);
  if (backend == nullptr) GTEST_SKIP() << skip;
  for (const BadShape& bad : bad_shapes()) {
    const Status status = bad.call(*backend);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument)
        << bad.name << ": " << status.to_string();
  }
  // Nothing was queued: the stream has no failure to report.
  EXPECT_TRUE(backend->synchronize().is_ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendBadShapes, ::testing::ValuesIn(kBackends));

}  // namespace
}  // namespace specrun
