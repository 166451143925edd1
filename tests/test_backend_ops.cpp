// Every op of kernels::Backend, over its dtypes and the shapes its kernels take different paths
// for, on every backend against the CPU backend's reference (the spirit of llama.cpp's
// test-backend-ops): one table of cases, one parameterised test. Built twice: test_backend_ops runs
// the cases on the CPU backend and on the deferred test backend, where they must agree bit for bit
// (the same code, queued); with CUDA, test_cuda_backend_ops (label gpu, SPECRUN_TEST_CUDA) runs
// them on the device within each case's tolerance, and skips without one. A second table gives the
// ops bad shapes, which every backend refuses as kInvalidArgument before it runs anything (Backend
// checks shapes once, for all); a third gives them bad index data (token ids, cache slots,
// attention metadata), which every backend reports with the CPU's StatusCode: from the op where it
// reads the data as it runs (the CPU; CUDA with eager checks), else from the next synchronize().
//
// Device tolerances, per element: |device - cpu| <= absolute + relative * scale, where the scale is
// |cpu|, or for a dot product the sum of its terms' magnitudes; u = 2^-24, f32's unit roundoff.
// Both backends accumulate in f32 in different orders, so each bound is twice the classical bound
// of one implementation against the exact value:
// - embedding, kv_write, add, fill, argmax and every token: exact (no arithmetic, or one rounding
//   the same on both).
// - rmsnorm: the mean square is a length-dim sum: 2 (dim + 8) u.
// - rope: cos and sin may differ by an ulp between libm and CUDA's double sincos before rounding
//   to f32; with |x| <= 1 that is within 1e-6 absolute.
// - matmul: 2 (in + 2) u of sum_k |x_k w_k| + |bias|, and 2^-25 a term for f16 subnormals of x.
//   The GEMM (rows > 16) rounds x to the weight's half dtype first: 2^-9 (bf16) or 2^-11 (f16)
//   more; with 8-bit weights it rounds x and the dequantized weight to bf16 (2^-8), and the skinny
//   kernel rounds once more where the scale multiplies (2u).
// - attention: scores carry head_dim roundings into exp and the weighted sum the context length
//   (values in [-1, 1]): 8 (head_dim + context + 16) u.
// - gated_activation, SiLU: exp within 2 ulp (CUDA) and 1 ulp (libm), then a quotient and a
//   product: 16 u.
// - processed distributions (process_logits, sample's q and weights): 3 ulps, 3 * 2^-23 relative
//   and 3 * 2^-149 absolute among subnormals. Both sides compute every weight in double; the
//   device's exp is within 1 ulp of the host's and its sums run in another order, which moves the
//   double results by about vocab * 2^-53 relative, far below f32 resolution. What reaches the
//   output is the rounding to f32: on the filtered path one rounding of the quotient, on the
//   unfiltered path the CPU's f32 weight times the f32 reciprocal of the total, where each of the
//   two roundings and the product can land one ulp apart. Which tokens are kept is exact: ties
//   rank by id on both sides, and the device redoes the top-p cut in the CPU's order whenever its
//   parallel sums are within rounding of it. sample's top probability, a double: 1e-12 relative.
// - drawn tokens: a device accumulates a CDF in another order than the CPU and takes its own log
//   of the shared noise, so its token is the CPU's unless the draw lies within about
//   vocab * 2^-52 of a boundary of the CDF, or the two best noisy scores within the last bit of the
//   log. The cases' inputs keep every draw further than kNearBoundary from either (each case
//   checks its own, on every backend), so tokens are compared exactly.
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
#include <numeric>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels/backend.h"
#include "kernels/core/dtype.h"
#include "kernels/core/random_stream.h"
#include "kernels/cpu/sampling.h"
#include "runtime/base/device_buffer.h"
#include "runtime/sampling/rng.h"
#include "tests/deferred_backend.h"
#include "tests/test_support.h"
#include "tests/verify_testing.h"
#if SPECRUN_TEST_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device.h"
#endif

namespace specrun {
namespace {

using kernels::Backend;
using kernels::Draw;
using kernels::PhiloxWords;
using kernels::RandomStream;
using testing::random_floats;
using testing::VerifyBatch;

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
  // Per float output, or none: what each element's rounding is relative to where that is not the
  // element itself (a dot product's sum of |terms|, which cancellation leaves far above the sum).
  std::vector<std::vector<double>> magnitudes = {};
};

template <typename T>
std::vector<double> as_doubles(const std::vector<T>& values) {
  return {values.begin(), values.end()};
}

template <typename T>
std::vector<int64_t> as_integers(const std::vector<T>& values) {
  return {values.begin(), values.end()};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// How far a device's float output may lie from the CPU reference: |got - want| <= absolute +
// relative * scale, the scale |want| or the output's magnitude. Integer outputs are always exact.
// The CPU's own backends are held to bitwise.
struct Tolerance {
  double absolute = 0.0;
  double relative = 0.0;
};

constexpr double kUnitRoundoff = 0x1.0p-24;
constexpr Tolerance kExact{};
constexpr Tolerance kClose{1e-5, 1e-5};  // one rounding or a different summation order
constexpr Tolerance kProbability{3 * 0x1.0p-149, 3 * 0x1.0p-23};
// The least distance, relative to the total, a draw keeps from a boundary of its CDF, and the
// least relative gap between the two best noisy scores, for a device's token to be the CPU's.
constexpr double kNearBoundary = 1e-9;

struct OpCase {
  std::string name;  // "op/dtype/shape"
  Tolerance device;  // on a device, against the CPU
  std::function<Outputs(Backend&)> run;
  // Per float output, where they differ (sample's q, its top probability, its weights); empty:
  // `device` for every one.
  std::vector<Tolerance> device_by_output = {};
};

void expect_ok(const Status& status) {
  EXPECT_TRUE(status.is_ok()) << status.to_string();
}

// ---- generated inputs ---------------------------------------------------------------------------

// `count` random values in [-1, 1) as stored in `dtype` (F32, F16, BF16): the bytes a kernel
// reads, and the values they hold, which a bound computes with.
struct Stored {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

Stored stored(DType dtype, int64_t count, uint64_t seed) {
  const testing::StoredTensor tensor =
      testing::store(random_floats(static_cast<size_t>(count), seed), dtype);
  return {tensor.raw(dtype), tensor.floats};
}

// An 8-bit weight: codes of values in [-1, 1) spread over the code range, their scale grid, and
// the weights they stand for (code * scale, rounded to f32 once).
struct QuantizedWeight {
  std::vector<uint8_t> codes;      // [out, in]
  std::vector<float> scales;       // [grid rows, grid columns]
  std::vector<float> dequantized;  // [out, in]
};

QuantizedWeight quantized_weight(DType dtype, int64_t out_features, int64_t in, int64_t block_rows,
                                 int64_t block_cols, uint64_t seed) {
  QuantizedWeight w;
  const std::vector<float> values = random_floats(static_cast<size_t>(out_features * in), seed);
  const float code_max = dtype == DType::kI8 ? 127.0f : kF8E4M3Max;
  for (const float value : values) {
    w.codes.push_back(dtype == DType::kI8 ? static_cast<uint8_t>(static_cast<int8_t>(
                                                std::nearbyint(value * code_max)))
                                          : f32_to_f8e4m3(value * code_max));
  }
  const int64_t grid_rows = (out_features + block_rows - 1) / block_rows;
  const int64_t grid_cols = (in + block_cols - 1) / block_cols;
  for (const float draw : random_floats(static_cast<size_t>(grid_rows * grid_cols), seed + 1)) {
    w.scales.push_back(0.01f + 0.005f * draw);  // in (0.005, 0.015)
  }
  for (int64_t o = 0; o < out_features; ++o) {
    for (int64_t i = 0; i < in; ++i) {
      const auto at = static_cast<size_t>(o * in + i);
      w.dequantized.push_back(
          load_as_f32(w.codes.data(), dtype, at) *
          w.scales[static_cast<size_t>((o / block_rows) * grid_cols + i / block_cols)]);
    }
  }
  return w;
}

// sum_k |x[r, k] w[o, k]| for each output element [rows, out_features], what the rounding of a
// dot product is relative to (with_bias adds |bias[o]|): the CPU's f32 matmul of the absolute
// values, whose own rounding (in u of the bound) is immaterial to a bound.
std::vector<double> dot_magnitudes(const std::vector<float>& x, const std::vector<float>& weight,
                                   int64_t rows, int64_t in, int64_t out_features) {
  static const std::unique_ptr<kernels::cpu::CpuBackend> host = testing::make_cpu_backend(2);
  std::vector<float> abs_x(x.size()), abs_w(weight.size());
  std::transform(x.begin(), x.end(), abs_x.begin(), [](float v) { return std::fabs(v); });
  std::transform(weight.begin(), weight.end(), abs_w.begin(), [](float v) { return std::fabs(v); });
  std::vector<float> magnitudes(static_cast<size_t>(rows * out_features));
  expect_ok(host->matmul({rows, in, out_features, DType::kF32, DType::kF32}, abs_x.data(),
                         abs_w.data(), nullptr, nullptr, magnitudes.data()));
  return as_doubles(magnitudes);
}

std::vector<double> with_bias(std::vector<double> magnitudes, const std::vector<float>& bias) {
  for (size_t i = 0; i < magnitudes.size(); ++i) magnitudes[i] += std::fabs(bias[i % bias.size()]);
  return magnitudes;
}

std::vector<float> inverse_frequencies(int64_t head_dim, double base) {
  std::vector<float> inv_freq;
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    inv_freq.push_back(static_cast<float>(
        1.0 / std::pow(base, 2.0 * static_cast<double>(i) / static_cast<double>(head_dim))));
  }
  return inv_freq;
}

// Temperature 0 (greedy), below and above 1; top-k off, 1, small, large; top-p off, mild, strong;
// min-p off and on: every combination, 72 settings.
std::vector<kernels::LogitsSettings> settings_grid() {
  std::vector<kernels::LogitsSettings> grid;
  for (const float temperature : {0.0f, 0.7f, 1.3f}) {
    for (const int32_t top_k : {0, 1, 5, 50}) {
      for (const float top_p : {1.0f, 0.9f, 0.5f}) {
        for (const float min_p : {0.0f, 0.05f}) grid.push_back({temperature, top_k, top_p, min_p});
      }
    }
  }
  return grid;
}

constexpr kernels::LogitsSettings kPlainSampling{1.0f, 0, 1.0f, 0.0f};

enum class LogitKind {
  kSpread,  // distinct values in [-8, 8)
  kTies,    // multiples of 1/2 in [-3, 3], both signs of zero, 10% -infinity
  kWide,    // values in [-2000, 2000): most weights underflow to 0; 5% -infinity
};

std::vector<float> make_logits(LogitKind kind, int64_t vocab, Rng& rng) {
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float& logit : logits) {
    const double u = rng.uniform();
    switch (kind) {
      case LogitKind::kSpread:
        logit = static_cast<float>((u - 0.5) * 16.0);
        break;
      case LogitKind::kTies: {
        const double v = rng.uniform();
        if (v < 0.1) {
          logit = -INFINITY;
        } else {
          logit = static_cast<float>(std::floor(u * 13.0) - 6.0) * 0.5f;
          if (logit == 0.0f && v < 0.55) logit = -0.0f;
        }
        break;
      }
      case LogitKind::kWide:
        logit = rng.uniform() < 0.05 ? -INFINITY : static_cast<float>((u - 0.5) * 4000.0);
        break;
    }
  }
  // At least one token stays allowed.
  logits[static_cast<size_t>(vocab / 2)] = kind == LogitKind::kTies ? 3.0f : 1.0f;
  return logits;
}

// The CPU's CDF at its own rounding: the distance of uniform * total from the nearest partial sum,
// relative to the total.
double cdf_margin(std::span<const float> probs, double uniform) {
  double total = 0.0;
  for (const float p : probs) total += p;
  const double target = uniform * total;
  double cumulative = 0.0;
  double margin = std::numeric_limits<double>::infinity();
  for (const float p : probs) {
    if (p <= 0.0f) continue;
    cumulative += p;
    margin = std::min(margin, std::fabs(target - cumulative));
  }
  return margin / total;
}

// The relative gap between the two best scores p / -log(u) of the shared noise at `position`
// (kernels/cpu/sampling.h's sample_with_noise over a whole row).
double noise_gap(std::span<const float> probs, const RandomStream& stream, int64_t position) {
  double best = 0.0, second = 0.0;
  for (size_t first = 0; first < probs.size(); first += 4) {
    const PhiloxWords noise =
        stream.block(position, Draw::kNoise, static_cast<uint32_t>(first / 4));
    for (size_t x = first; x < std::min(probs.size(), first + 4); ++x) {
      if (!(probs[x] > 0.0f)) continue;
      const double u = (static_cast<double>(noise.v[x - first]) + 0.5) * 0x1.0p-32;
      const double score = probs[x] / -std::log(u);
      second = std::max(second, std::min(best, score));
      best = std::max(best, score);
    }
  }
  return best > 0.0 ? (best - second) / best : std::numeric_limits<double>::infinity();
}

// ---- the cases: the forward's ops ---------------------------------------------------------------

void add_embedding_cases(std::vector<OpCase>& cases) {
  // dim 19: the scalar path; 8 and 128: 16-byte loads. The first and last rows of the table.
  struct Shape {
    int64_t vocab, dim;
    std::vector<int32_t> ids;
  };
  const std::vector<Shape> shapes = {{16, 8, {3}},
                                     {301, 19, {0, 300, 5, 5, 17, 299, 1, 42}},
                                     {301, 128, {0, 300, 5, 5, 17, 299, 1, 42}}};
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Shape& shape : shapes) {
      const auto tokens = static_cast<int64_t>(shape.ids.size());
      cases.push_back(
          {"embedding/" + std::string(dtype_name(dtype)) + "/" + std::to_string(tokens) + "x" +
               std::to_string(shape.dim),
           kExact, [=](Backend& backend) {
             const Stored table = stored(dtype, shape.vocab * shape.dim, 11 + shape.dim);
             const DeviceBuffer ids = upload(backend, shape.ids);
             const DeviceBuffer table_d = upload(backend, table.bytes);
             const DeviceBuffer out = output<float>(backend, tokens * shape.dim);
             expect_ok(backend.embedding({tokens, shape.vocab, shape.dim, dtype}, ids.as<int32_t>(),
                                         table_d.data(), out.as<float>()));
             return Outputs{{as_doubles(download<float>(backend, out, tokens * shape.dim))}, {}};
           }});
    }
  }
  // Gemma's scaled rows: one rounding of each element times the scale, on every backend.
  cases.push_back({"embedding/bf16/scaled/5x64", kExact, [](Backend& backend) {
                     const Stored table = stored(DType::kBF16, 32 * 64, 75);
                     const std::vector<int32_t> ids = {3, 0, 31, 3, 17};
                     const DeviceBuffer ids_d = upload(backend, ids);
                     const DeviceBuffer table_d = upload(backend, table.bytes);
                     const DeviceBuffer out = output<float>(backend, 5 * 64);
                     expect_ok(backend.embedding(
                         {5, 32, 64, DType::kBF16, kernels::WeightLayout::kRows, std::sqrt(64.5f)},
                         ids_d.as<int32_t>(), table_d.data(), out.as<float>()));
                     return Outputs{{as_doubles(download<float>(backend, out, 5 * 64))}, {}};
                   }});
}

void add_norm_cases(std::vector<OpCase>& cases) {
  // dim 67: the scalar path; 4096: a long row over many warps.
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const std::array<int64_t, 2> size :
         {std::array<int64_t, 2>{1, 16}, {3, 96}, {17, 67}, {2, 4096}}) {
      const int64_t rows = size[0], dim = size[1];
      const std::string shape = std::to_string(rows) + "x" + std::to_string(dim);
      const Tolerance tolerance{1e-30, 2.0 * static_cast<double>(dim + 8) * kUnitRoundoff};
      cases.push_back(
          {"rmsnorm/" + std::string(dtype_name(dtype)) + "/" + shape, tolerance,
           [=](Backend& backend) {
             const std::vector<float> x = random_floats(rows * dim, 3 + rows + dim, 3.0f);
             const Stored weight = stored(dtype, dim, 4 + dim);
             const DeviceBuffer x_d = upload(backend, x);
             const DeviceBuffer w = upload(backend, weight.bytes);
             const DeviceBuffer out = output<float>(backend, rows * dim);
             const kernels::RmsNormParams params{rows, dim, 1e-5f, dtype};
             expect_ok(backend.rmsnorm(params, x_d.as<float>(), w.data(), out.as<float>()));
             const std::vector<float> normed = download<float>(backend, out, rows * dim);
             // In place (out aliases x): the bits of out of place.
             expect_ok(backend.rmsnorm(params, x_d.as<float>(), w.data(), x_d.as<float>()));
             EXPECT_TRUE(same_bits(download<float>(backend, x_d, rows * dim), normed))
                 << "rmsnorm in place";
             return Outputs{{as_doubles(normed)}, {}};
           }});
      cases.push_back(
          {"add_rmsnorm/" + std::string(dtype_name(dtype)) + "/" + shape, tolerance,
           [=](Backend& backend) {
             const Stored weight = stored(dtype, dim, 23);
             const DeviceBuffer addend = upload(backend, random_floats(rows * dim, 24, 2.0f));
             const DeviceBuffer accumulator = upload(backend, random_floats(rows * dim, 25, 3.0f));
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
}

void add_matmul_cases(std::vector<OpCase>& cases) {
  // in_features 37 takes the skinny kernel's element-wise loads, 128 and 1024 its 16-byte ones;
  // row counts on both sides of its 16 (above: the GEMM), each with and without bias. One case per
  // dtype, size and path; each row count, bias and scale layout an output of it.
  struct Path {
    const char* name;
    std::vector<int64_t> rows;
    bool gemm;
  };
  const std::vector<Path> paths = {{"skinny", {1, 2, 5, 16}, false}, {"gemm", {17, 64}, true}};
  const std::array<int64_t, 2> sizes[] = {{37, 21}, {128, 96}, {1024, 300}};
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const std::array<int64_t, 2>& size : sizes) {
      for (const Path& path : paths) {
        const int64_t in = size[0], out_features = size[1];
        double x_rounding = 0.0;  // the GEMM's rounding of x to the weight's half dtype
        if (path.gemm && dtype == DType::kBF16) x_rounding = 0x1.0p-9;
        if (path.gemm && dtype == DType::kF16) x_rounding = 0x1.0p-11;
        const Tolerance tolerance{0x1.0p-25 * static_cast<double>(in),
                                  x_rounding + 2.0 * static_cast<double>(in + 2) * kUnitRoundoff};
        cases.push_back(
            {"matmul/" + std::string(dtype_name(dtype)) + "/" + std::to_string(in) + "x" +
                 std::to_string(out_features) + "/" + path.name,
             tolerance, [=](Backend& backend) {
               const Stored weight = stored(dtype, out_features * in, 6 + in);
               const Stored bias = stored(dtype, out_features, 7 + out_features);
               const DeviceBuffer w = upload(backend, weight.bytes);
               const DeviceBuffer b = upload(backend, bias.bytes);
               Outputs outputs;
               for (const int64_t rows : path.rows) {
                 const std::vector<float> x = random_floats(rows * in, 5 + rows * 7 + in);
                 const DeviceBuffer x_d = upload(backend, x);
                 const std::vector<double> magnitudes =
                     dot_magnitudes(x, weight.values, rows, in, out_features);
                 for (const bool biased : {false, true}) {
                   const DeviceBuffer out = output<float>(backend, rows * out_features);
                   expect_ok(backend.matmul({rows, in, out_features, dtype, dtype}, x_d.as<float>(),
                                            w.data(), nullptr, biased ? b.data() : nullptr,
                                            out.as<float>()));
                   outputs.floats.push_back(
                       as_doubles(download<float>(backend, out, rows * out_features)));
                   outputs.magnitudes.push_back(biased ? with_bias(magnitudes, bias.values)
                                                       : magnitudes);
                 }
               }
               return outputs;
             }});
      }
    }
  }
  // 8-bit weights in each scale layout: per output channel, per tensor, 128 x 128 blocks, and
  // 32 x 16 blocks (a scale per chunk of a 16-byte load).
  for (const DType dtype : {DType::kF8E4M3, DType::kI8}) {
    for (const std::array<int64_t, 2>& size : sizes) {
      for (const Path& path : paths) {
        const int64_t in = size[0], out_features = size[1];
        const double rounding = path.gemm ? 0x1.0p-8 : 2.0 * kUnitRoundoff;
        const Tolerance tolerance{0x1.0p-25 * static_cast<double>(in),
                                  rounding + 2.0 * static_cast<double>(in + 2) * kUnitRoundoff};
        cases.push_back(
            {"matmul/" + std::string(dtype_name(dtype)) + "/" + std::to_string(in) + "x" +
                 std::to_string(out_features) + "/" + path.name + "/every scale layout",
             tolerance, [=](Backend& backend) {
               const std::vector<float> bias = random_floats(out_features, 61);
               const DeviceBuffer b = upload(backend, bias);
               const std::array<int64_t, 2> layouts[] = {
                   {1, in}, {out_features, in}, {128, 128}, {32, 16}};
               Outputs outputs;
               for (const std::array<int64_t, 2>& layout : layouts) {
                 const QuantizedWeight w = quantized_weight(dtype, out_features, in, layout[0],
                                                            layout[1], 60 + in + layout[1]);
                 const DeviceBuffer codes = upload(backend, w.codes);
                 const DeviceBuffer scales = upload(backend, w.scales);
                 for (const int64_t rows : path.rows) {
                   const std::vector<float> x = random_floats(rows * in, 62 + rows);
                   const DeviceBuffer x_d = upload(backend, x);
                   const std::vector<double> magnitudes =
                       dot_magnitudes(x, w.dequantized, rows, in, out_features);
                   for (const bool biased : {false, true}) {
                     kernels::MatmulParams params{rows, in, out_features, dtype, DType::kF32};
                     params.scale_block_rows = layout[0];
                     params.scale_block_cols = layout[1];
                     const DeviceBuffer out = output<float>(backend, rows * out_features);
                     expect_ok(backend.matmul(params, x_d.as<float>(), codes.data(),
                                              scales.as<float>(), biased ? b.data() : nullptr,
                                              out.as<float>()));
                     outputs.floats.push_back(
                         as_doubles(download<float>(backend, out, rows * out_features)));
                     outputs.magnitudes.push_back(biased ? with_bias(magnitudes, bias)
                                                         : magnitudes);
                   }
                 }
               }
               return outputs;
             }});
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
}

void add_rope_and_cache_cases(std::vector<OpCase>& cases) {
  constexpr Tolerance kRope{1e-6, 0.0};
  // Head dim 16 at small positions; and model shapes (1 and 4 query heads a KV head, GQA 4; head
  // dims 64 and 128) at positions up to 131,072 on Llama 3's base, one token (at 100,000), 5 and
  // 17, each an output of the case.
  struct Shape {
    int64_t heads, kv_heads, head_dim;
    std::vector<int64_t> tokens;
    double base;
    bool far;  // positions t * 7919 % 131072 (100,000 for one token), else 3 + 5t
  };
  std::vector<Shape> shapes = {{4, 2, 16, {1}, 10000.0, false}, {4, 2, 16, {4}, 10000.0, false}};
  for (const int64_t head_dim : {64, 128}) {
    for (const std::array<int64_t, 2> heads : {std::array<int64_t, 2>{4, 1}, {8, 8}, {8, 2}}) {
      shapes.push_back({heads[0], heads[1], head_dim, {1, 5, 17}, 500000.0, true});
    }
  }
  for (const kernels::RopeStyle style :
       {kernels::RopeStyle::kRotateHalf, kernels::RopeStyle::kInterleaved}) {
    for (const Shape& s : shapes) {
      std::string tokens;
      for (const int64_t count : s.tokens)
        tokens += (tokens.empty() ? "" : ",") + std::to_string(count);
      cases.push_back(
          {"rope/" +
               std::string(style == kernels::RopeStyle::kRotateHalf ? "rotate_half"
                                                                    : "interleaved") +
               "/" + tokens + " tokens/" + std::to_string(s.heads) + "/" +
               std::to_string(s.kv_heads) + " heads of " + std::to_string(s.head_dim),
           kRope, [=](Backend& backend) {
             const DeviceBuffer f = upload(backend, inverse_frequencies(s.head_dim, s.base));
             Outputs outputs;
             for (const int64_t count : s.tokens) {
               std::vector<int32_t> positions;
               for (int64_t t = 0; t < count; ++t) {
                 positions.push_back(static_cast<int32_t>(s.far ? t * 7919 % 131072 : 3 + 5 * t));
               }
               if (s.far && count == 1) positions[0] = 100000;
               const int64_t q_count = count * s.heads * s.head_dim;
               const int64_t k_count = count * s.kv_heads * s.head_dim;
               const DeviceBuffer p = upload(backend, positions);
               const DeviceBuffer q = upload(backend, random_floats(q_count, 11 + count));
               const DeviceBuffer k = upload(backend, random_floats(k_count, 12 + count));
               expect_ok(backend.rope({count, s.heads, s.kv_heads, s.head_dim, style},
                                      p.as<int32_t>(), f.as<float>(), q.as<float>(),
                                      k.as<float>()));
               outputs.floats.push_back(as_doubles(download<float>(backend, q, q_count)));
               outputs.floats.push_back(as_doubles(download<float>(backend, k, k_count)));
             }
             return outputs;
           }});
    }
  }

  // The cache's bytes, in f32 (a copy) and in bf16 (each value rounded to nearest even, NaN and
  // infinities included), over earlier contents; head_dim 6: rows not a multiple of 4 elements.
  for (const DType cache_dtype : {DType::kF32, DType::kBF16}) {
    for (const int64_t head_dim : {6, 64}) {
      cases.push_back(
          {"kv_write/" + std::string(dtype_name(cache_dtype)) + "/5x2x" + std::to_string(head_dim),
           kExact, [=](Backend& backend) {
             constexpr int64_t kv_heads = 2, tokens = 5, slots_in_cache = 40;
             const int64_t row = kv_heads * head_dim;
             std::vector<float> k = random_floats(tokens * row, 13);
             k[0] = bit_cast_f32(0x3f808000u);  // halfway: to even, down
             k[1] = bit_cast_f32(0x3f818000u);  // halfway: to even, up
             k[2] = std::numeric_limits<float>::max();
             k[3] = -std::numeric_limits<float>::infinity();
             k[4] = std::numeric_limits<float>::quiet_NaN();
             k[5] = 1e-40f;  // subnormal
             const std::vector<int32_t> slots = {39, 0, 17, 5, 18};
             const size_t cache_size =
                 static_cast<size_t>(slots_in_cache * row) * dtype_size(cache_dtype);
             const DeviceBuffer k_d = upload(backend, k);
             const DeviceBuffer v_d = upload(backend, random_floats(tokens * row, 14));
             const DeviceBuffer s = upload(backend, slots);
             const DeviceBuffer k_cache =
                 upload(backend, stored(cache_dtype, slots_in_cache * row, 15).bytes);
             const DeviceBuffer v_cache =
                 upload(backend, stored(cache_dtype, slots_in_cache * row, 16).bytes);
             expect_ok(backend.kv_write({tokens, kv_heads, head_dim, slots_in_cache, cache_dtype},
                                        k_d.as<float>(), v_d.as<float>(), s.as<int32_t>(),
                                        k_cache.data(), v_cache.data()));
             return Outputs{{},
                            {as_integers(download<uint8_t>(backend, k_cache, cache_size)),
                             as_integers(download<uint8_t>(backend, v_cache, cache_size))}};
           }});
    }
  }

  constexpr int64_t kHeads = 4, kKvHeads = 2, kHeadDim = 16;
  for (const DType cache_dtype : {DType::kF32, DType::kBF16}) {
    constexpr int64_t kSlots = 16, tokens = 3;
    const size_t cache_size = kSlots * kKvHeads * kHeadDim * dtype_size(cache_dtype);
    cases.push_back(
        {"rope_kv_write/" + std::string(dtype_name(cache_dtype)) + "/3", kClose,
         [=](Backend& backend) {
           const std::vector<int32_t> slots = {4, 5, 6};
           const std::vector<int32_t> positions = {4, 5, 6};
           const DeviceBuffer s = upload(backend, slots);
           const DeviceBuffer p = upload(backend, positions);
           const DeviceBuffer f = upload(backend, inverse_frequencies(kHeadDim, 10000.0));
           const DeviceBuffer q = upload(backend, random_floats(tokens * kHeads * kHeadDim, 63));
           const DeviceBuffer k = upload(backend, random_floats(tokens * kKvHeads * kHeadDim, 64));
           const DeviceBuffer v = upload(backend, random_floats(tokens * kKvHeads * kHeadDim, 65));
           const DeviceBuffer k_cache = upload(backend, std::vector<uint8_t>(cache_size, 0));
           const DeviceBuffer v_cache = upload(backend, std::vector<uint8_t>(cache_size, 0));
           expect_ok(backend.rope_kv_write(
               {tokens, kHeads, kKvHeads, kHeadDim, kernels::RopeStyle::kRotateHalf},
               {tokens, kKvHeads, kHeadDim, kSlots, cache_dtype}, p.as<int32_t>(), f.as<float>(),
               s.as<int32_t>(), q.as<float>(), k.as<float>(), v.as<float>(), k_cache.data(),
               v_cache.data()));
           return Outputs{{as_doubles(download<float>(backend, q, tokens * kHeads * kHeadDim)),
                           as_doubles(download<float>(backend, k, tokens * kKvHeads * kHeadDim))},
                          {as_integers(download<uint8_t>(backend, v_cache, cache_size))}};
         }});
  }
}

// A batch of sequences over a paged cache with scattered blocks (and 3 nobody owns), each with its
// new tokens and its context (the new tokens included).
struct PagedAttention {
  int64_t heads, kv_heads, head_dim, block_size;
  std::vector<int64_t> new_tokens;  // per sequence
  std::vector<int64_t> context;     // per sequence
  int64_t window = 0;

  std::string name() const {
    std::string text = std::to_string(heads) + "x" + std::to_string(kv_heads) + "x" +
                       std::to_string(head_dim) + "/block " + std::to_string(block_size) + "/new";
    for (const int64_t n : new_tokens) text += " " + std::to_string(n);
    text += "/context";
    for (const int64_t n : context) text += " " + std::to_string(n);
    return text + "/window " + std::to_string(window);
  }
};

Outputs run_paged_attention(Backend& backend, const PagedAttention& c, DType cache_dtype,
                            uint64_t seed) {
  const auto seqs = static_cast<int64_t>(c.context.size());
  int64_t max_blocks = 0, total_blocks = 3;
  for (const int64_t length : c.context) {
    max_blocks = std::max(max_blocks, (length + c.block_size - 1) / c.block_size);
    total_blocks += (length + c.block_size - 1) / c.block_size;
  }
  std::vector<int32_t> free_blocks(static_cast<size_t>(total_blocks));
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  Rng rng(seed);
  for (size_t i = free_blocks.size() - 1; i > 0; --i) {
    std::swap(free_blocks[i], free_blocks[rng.next() % (i + 1)]);
  }
  std::vector<int32_t> tables(static_cast<size_t>(std::max<int64_t>(seqs * max_blocks, 1)), 0);
  std::vector<int32_t> query_start = {0}, lengths;
  size_t next_free = 0;
  for (int64_t s = 0; s < seqs; ++s) {
    const auto length = c.context[static_cast<size_t>(s)];
    for (int64_t b = 0; b < (length + c.block_size - 1) / c.block_size; ++b) {
      tables[static_cast<size_t>(s * max_blocks + b)] = free_blocks[next_free++];
    }
    query_start.push_back(query_start.back() +
                          static_cast<int32_t>(c.new_tokens[static_cast<size_t>(s)]));
    lengths.push_back(static_cast<int32_t>(length));
  }
  const int64_t tokens = query_start.back();
  const int64_t cache_elements = total_blocks * c.block_size * c.kv_heads * c.head_dim;
  const int64_t count = tokens * c.heads * c.head_dim;
  const DeviceBuffer k = upload(backend, stored(cache_dtype, cache_elements, seed + 1).bytes);
  const DeviceBuffer v = upload(backend, stored(cache_dtype, cache_elements, seed + 2).bytes);
  const DeviceBuffer q = upload(backend, random_floats(count, seed + 3));
  const DeviceBuffer starts = upload(backend, query_start);
  const DeviceBuffer context = upload(backend, lengths);
  const DeviceBuffer block_tables = upload(backend, tables);
  const DeviceBuffer out = output<float>(backend, count);
  const kernels::AttentionParams params{
      seqs,       tokens,       c.heads,    c.kv_heads,
      c.head_dim, c.block_size, max_blocks, 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
      c.window,   cache_dtype};
  expect_ok(backend.attention(params, q.as<float>(), k.data(), v.data(), starts.as<int32_t>(),
                              context.as<int32_t>(), block_tables.as<int32_t>(), nullptr,
                              out.as<float>()));
  return Outputs{{as_doubles(download<float>(backend, out, count))}, {}};
}

void add_attention_cases(std::vector<OpCase>& cases) {
  const std::vector<PagedAttention> shapes = {
      // Two short sequences (1 new token over 5 positions, 3 over 9) in blocks of 4.
      {4, 2, 16, 4, {1, 3}, {5, 9}},
      {4, 2, 16, 4, {1, 3}, {5, 9}, 3},
      // GQA 1, head_dim 64; a long context: few blocks, so the per-split schedule.
      {4, 4, 64, 16, {1, 5, 3}, {9, 1100, 300}},
      // GQA 4, head_dim 128.
      {8, 2, 128, 16, {1, 4, 6}, {1100, 20, 600}},
      // Sliding windows, inside one split and across split boundaries.
      {8, 2, 128, 16, {1, 4, 6}, {1100, 20, 600}, 100},
      {8, 2, 64, 16, {2, 7}, {900, 530}, 300},
      // An odd block size, and a sequence without new tokens.
      {4, 4, 64, 7, {2, 1, 0}, {700, 13, 50}},
      // Prefill-shaped: many rows of one sequence, causal among themselves.
      {8, 2, 128, 16, {40}, {40}},
      {8, 2, 128, 16, {70, 3}, {600, 3}, 64},
      // head_dim 10, not a multiple of 4 (scalar gathers); 40 (two channels per lane); 256 (the
      // largest, beyond 48 KiB of shared memory).
      {3, 1, 10, 4, {3, 1}, {9, 600}},
      {4, 2, 40, 16, {2, 1}, {33, 400}},
      {4, 2, 256, 16, {2, 1}, {70, 800}},
  };
  // bf16 keys and values widen exactly on both backends: the f32 cache's tolerance.
  for (const DType cache_dtype : {DType::kF32, DType::kBF16}) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const PagedAttention& shape = shapes[i];
      const int64_t max_context = *std::max_element(shape.context.begin(), shape.context.end());
      const Tolerance tolerance{
          8.0 * static_cast<double>(shape.head_dim + max_context + 16) * kUnitRoundoff, 0.0};
      cases.push_back({"attention/" + std::string(dtype_name(cache_dtype)) + "/" + shape.name(),
                       tolerance, [=](Backend& backend) {
                         return run_paged_attention(backend, shape, cache_dtype, 100 + 10 * i);
                       }});
    }
  }
}

void add_elementwise_cases(std::vector<OpCase>& cases) {
  // Widths 7 (shorter than a vector), 41 (the vector path's tail too) and 256, each at 1, 5 and 17
  // rows (outputs of the case). SiLU's bound is 16 u; GELU's tanh may differ from libm's by 2 ulp,
  // which its cancellation near -3 magnifies.
  const Tolerance kSilu{1e-30, 16.0 * kUnitRoundoff};
  for (const auto& [name, activation] :
       {std::pair{"silu", kernels::GateActivation::kSilu},
        std::pair{"gelu_tanh", kernels::GateActivation::kGeluTanh}}) {
    for (const int64_t dim : {7, 41, 256}) {
      cases.push_back(
          {std::string("gated_activation/") + name + "/f32/1,5,17 rows of " + std::to_string(dim),
           activation == kernels::GateActivation::kSilu ? kSilu : kClose,
           [activation = activation, dim](Backend& backend) {
             Outputs outputs;
             for (const int64_t rows : {1, 5, 17}) {
               const int64_t count = rows * dim;
               const DeviceBuffer gate = upload(backend, random_floats(count, 21 + rows, 6.0f));
               const DeviceBuffer up = upload(backend, random_floats(count, 22 + dim, 2.0f));
               const DeviceBuffer out = output<float>(backend, count);
               expect_ok(backend.gated_activation({rows, dim, activation}, gate.as<float>(),
                                                  up.as<float>(), out.as<float>()));
               const std::vector<float> activated = download<float>(backend, out, count);
               // out aliasing gate: the same bits.
               expect_ok(backend.gated_activation({rows, dim, activation}, gate.as<float>(),
                                                  up.as<float>(), gate.as<float>()));
               EXPECT_TRUE(same_bits(download<float>(backend, gate, count), activated))
                   << "gated_activation in place, " << rows << " rows";
               outputs.floats.push_back(as_doubles(activated));
             }
             return outputs;
           }});
    }
  }
  for (const int64_t count : {7, 77, 17 * 256}) {
    cases.push_back(
        {"add/f32/" + std::to_string(count), kExact, [=](Backend& backend) {
           const DeviceBuffer addend = upload(backend, random_floats(count, 83));
           const DeviceBuffer accumulator = upload(backend, random_floats(count, 84));
           expect_ok(backend.add(count, addend.as<float>(), accumulator.as<float>()));
           return Outputs{{as_doubles(download<float>(backend, accumulator, count))}, {}};
         }});
  }
  // A million values and a ragged tail; 8-bit codes over their whole range and past it
  // (saturating).
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kI8}) {
    constexpr int64_t count = 1000003;
    const float range = dtype == DType::kF8E4M3 ? 500.0f : dtype == DType::kI8 ? 130.0f : 0.75f;
    cases.push_back(
        {"fill_uniform/" + std::string(dtype_name(dtype)) + "/" + std::to_string(count), kExact,
         [=](Backend& backend) {
           const DeviceBuffer out = output<uint8_t>(backend, count * dtype_size(dtype));
           expect_ok(backend.fill_uniform({count, dtype, 1234, -range, 0.5f * range}, out.data()));
           // The elements as words of their width.
           if (dtype_size(dtype) == 4) {
             return Outputs{{}, {as_integers(download<uint32_t>(backend, out, count))}};
           }
           if (dtype_size(dtype) == 2) {
             return Outputs{{}, {as_integers(download<uint16_t>(backend, out, count))}};
           }
           return Outputs{{}, {as_integers(download<uint8_t>(backend, out, count))}};
         }});
  }
}

// ---- the cases: logits, sampling and verification -----------------------------------------------

// process_logits over rows of `logits` ([rows, vocab]), its distributions and row statuses.
Outputs run_process_logits(Backend& backend, const std::vector<float>& logits,
                           const std::vector<kernels::LogitsSettings>& settings, int64_t vocab) {
  const auto rows = static_cast<int64_t>(settings.size());
  const DeviceBuffer logits_d = upload(backend, logits);
  const DeviceBuffer settings_d = upload(backend, settings);
  const DeviceBuffer probs = output<float>(backend, rows * vocab);
  const DeviceBuffer status = output<int32_t>(backend, rows);
  expect_ok(backend.process_logits({rows, vocab}, logits_d.as<float>(),
                                   settings_d.as<kernels::LogitsSettings>(), probs.as<float>(),
                                   status.as<int32_t>()));
  return Outputs{{as_doubles(download<float>(backend, probs, rows * vocab))},
                 {as_integers(download<int32_t>(backend, status, rows))}};
}

void add_logits_cases(std::vector<OpCase>& cases) {
  // Rows of logits with every setting: greedy, plain, top-k, top-p, min-p, all at once.
  const std::vector<kernels::LogitsSettings> settings = {
      {0.0f, 0, 1.0f, 0.0f}, {1.0f, 0, 1.0f, 0.0f}, {0.7f, 5, 1.0f, 0.0f},
      {1.3f, 0, 0.8f, 0.0f}, {1.0f, 0, 1.0f, 0.2f}, {0.9f, 7, 0.9f, 0.05f}};
  constexpr int64_t kVocab = 50;
  const auto rows = static_cast<int64_t>(settings.size());
  cases.push_back({"process_logits/f32/6x50", kProbability, [=](Backend& backend) {
                     return run_process_logits(backend, random_floats(rows * kVocab, 101, 4.0f),
                                               settings, kVocab);
                   }});
  // Each kind of logits under every setting of the grid, from a vocabulary one block handles to
  // Llama 3's; the largest two (many blocks a row) with one kind a setting, in turn.
  uint64_t seed = 0;
  for (const int64_t vocab : {17, 1000, 32000, 128256}) {
    const bool large = vocab > 1000;
    const std::vector<kernels::LogitsSettings> grid = settings_grid();
    ++seed;
    const auto count = static_cast<int64_t>(large ? grid.size() : grid.size() * 3);
    cases.push_back(
        {"process_logits/f32/every setting/" + std::to_string(count) + "x" + std::to_string(vocab),
         kProbability, [=](Backend& backend) {
           Rng rng(seed);
           std::vector<float> logits;
           std::vector<kernels::LogitsSettings> row_settings;
           for (const LogitKind kind : {LogitKind::kSpread, LogitKind::kTies, LogitKind::kWide}) {
             for (size_t s = 0; s < grid.size(); ++s) {
               if (large && s % 3 != static_cast<size_t>(kind)) continue;
               row_settings.push_back(grid[s]);
               const std::vector<float> row = make_logits(kind, vocab, rng);
               logits.insert(logits.end(), row.begin(), row.end());
             }
           }
           Outputs outputs = run_process_logits(backend, logits, row_settings, vocab);
           EXPECT_EQ(outputs.integers[0], std::vector<int64_t>(row_settings.size(), 0))
               << "every row is processed";
           return outputs;
         }});
  }
  cases.push_back({"process_logits/f32/top-p at ties/4x4096", kProbability, [](Backend& backend) {
                     // Four tokens tied at the top and the rest far below: top_p 0.5 reaches the
                     // target exactly after two of them, where summation order decides.
                     constexpr int64_t vocab = 4096;
                     std::vector<float> row(vocab, -INFINITY);
                     for (const size_t token : {7, 100, 2000, 4095}) row[token] = 2.0f;
                     const std::vector<kernels::LogitsSettings> ties = {{1.0f, 0, 0.5f, 0.0f},
                                                                        {0.7f, 0, 0.5f, 0.0f},
                                                                        {1.0f, 3, 0.75f, 0.0f},
                                                                        {1.0f, 0, 0.25f, 0.0f}};
                     std::vector<float> logits;
                     for (size_t r = 0; r < ties.size(); ++r) {
                       logits.insert(logits.end(), row.begin(), row.end());
                     }
                     return run_process_logits(backend, logits, ties, vocab);
                   }});
  cases.push_back(
      {"process_logits/f32/rows it cannot process/8x300", kExact, [](Backend& backend) {
         // Corrupt logits, every token banned, each setting out of range: all zeros and the
         // row's status; a valid row among them (one allowed token) is unaffected.
         constexpr int64_t vocab = 300;
         Rng rng(5);
         const std::vector<float> good = make_logits(LogitKind::kSpread, vocab, rng);
         const auto with = [&](size_t index, float value) {
           std::vector<float> row = good;
           row[index] = value;
           return row;
         };
         std::vector<float> one_allowed(vocab, -INFINITY);
         one_allowed[42] = -3.0f;
         struct Row {
           std::vector<float> logits;
           kernels::LogitsSettings settings;
         };
         const Row table[] = {{with(0, NAN), kPlainSampling},
                              {with(123, INFINITY), kPlainSampling},
                              {std::vector<float>(vocab, -INFINITY), kPlainSampling},
                              {good, {-1.0f, 0, 1.0f, 0.0f}},
                              {good, {1.0f, 0, 0.0f, 0.0f}},
                              {good, {1.0f, 0, 1.0f, 2.0f}},
                              {good, {1.0f, -1, 1.0f, 0.0f}},
                              {one_allowed, {1.0f, 5, 0.9f, 0.0f}}};
         std::vector<float> logits;
         std::vector<kernels::LogitsSettings> row_settings;
         for (const Row& row : table) {
           logits.insert(logits.end(), row.logits.begin(), row.logits.end());
           row_settings.push_back(row.settings);
         }
         Outputs outputs = run_process_logits(backend, logits, row_settings, vocab);
         using kernels::RowStatus;
         const auto code = [](RowStatus status) { return static_cast<int64_t>(status); };
         EXPECT_EQ(
             outputs.integers[0],
             (std::vector<int64_t>{code(RowStatus::kCorruptLogits), code(RowStatus::kCorruptLogits),
                                   code(RowStatus::kAllBanned), code(RowStatus::kBadSettings),
                                   code(RowStatus::kBadSettings), code(RowStatus::kBadSettings),
                                   code(RowStatus::kBadSettings), code(RowStatus::kOk)}));
         return outputs;
       }});

  cases.push_back({"argmax/f32/6x50", kExact, [=](Backend& backend) {
                     std::vector<float> values = random_floats(rows * kVocab, 102);
                     values[7] = values[9] = 5.0f;  // a tie: the lower index
                     const DeviceBuffer v = upload(backend, values);
                     const DeviceBuffer out = output<int32_t>(backend, rows);
                     expect_ok(backend.argmax({rows, kVocab}, v.as<float>(), out.as<int32_t>()));
                     return Outputs{{}, {as_integers(download<int32_t>(backend, out, rows))}};
                   }});
  // Ties, spread rows, every token banned, -0 tied with +0, NaN first (never replaced) and last
  // (never picked), from one token to many blocks a row.
  for (const int64_t vocab : {1, 17, 1000, 128256}) {
    cases.push_back({"argmax/f32/16x" + std::to_string(vocab), kExact, [=](Backend& backend) {
                       Rng rng(static_cast<uint64_t>(vocab));
                       std::vector<std::vector<float>> table;
                       for (int i = 0; i < 8; ++i)
                         table.push_back(make_logits(LogitKind::kTies, vocab, rng));
                       for (int i = 0; i < 4; ++i) {
                         table.push_back(make_logits(LogitKind::kSpread, vocab, rng));
                       }
                       table.emplace_back(vocab, -INFINITY);
                       table.emplace_back(vocab, 0.0f);
                       table.back().front() = -0.0f;
                       table.push_back(make_logits(LogitKind::kSpread, vocab, rng));
                       table.back().front() = NAN;
                       table.push_back(make_logits(LogitKind::kSpread, vocab, rng));
                       table.back().back() = NAN;
                       std::vector<float> values;
                       for (const std::vector<float>& row : table) {
                         values.insert(values.end(), row.begin(), row.end());
                       }
                       const auto count = static_cast<int64_t>(table.size());
                       const DeviceBuffer v = upload(backend, values);
                       const DeviceBuffer out = output<int32_t>(backend, count);
                       expect_ok(backend.argmax({count, vocab}, v.as<float>(), out.as<int32_t>()));
                       return Outputs{{}, {as_integers(download<int32_t>(backend, out, count))}};
                     }});
  }

  // A draft's draws moved where the target reads them: kept entries (-1), repeats, the source's
  // ends, one entry to many blocks' worth; checked against the definition on the host too.
  for (const int64_t count : {1, 37, 3000}) {
    cases.push_back({"gather/i32/" + std::to_string(count), kExact, [=](Backend& backend) {
                       const int64_t source_count = 2 * count + 1;
                       std::vector<int32_t> source(static_cast<size_t>(source_count));
                       for (int64_t i = 0; i < source_count; ++i) {
                         source[static_cast<size_t>(i)] = static_cast<int32_t>(1000 + 7 * i);
                       }
                       std::vector<int32_t> index(static_cast<size_t>(count));
                       std::vector<int32_t> before(static_cast<size_t>(count));
                       std::vector<int32_t> expected(static_cast<size_t>(count));
                       for (int64_t i = 0; i < count; ++i) {
                         const auto e = static_cast<size_t>(i);
                         index[e] = i % 5 == 2   ? -1
                                    : i % 7 == 0 ? static_cast<int32_t>(source_count - 1)
                                                 : static_cast<int32_t>((i * 13) % source_count);
                         before[e] = static_cast<int32_t>(-5 - i);
                         expected[e] =
                             index[e] < 0 ? before[e] : source[static_cast<size_t>(index[e])];
                       }
                       const DeviceBuffer s = upload(backend, source);
                       const DeviceBuffer x = upload(backend, index);
                       const DeviceBuffer out = upload(backend, before);
                       expect_ok(backend.gather({count, source_count}, s.as<int32_t>(),
                                                x.as<int32_t>(), out.as<int32_t>()));
                       const std::vector<int32_t> got = download<int32_t>(backend, out, count);
                       EXPECT_EQ(got, expected);
                       return Outputs{{}, {as_integers(got)}};
                     }});
  }

  // A draft's q rows laid out as verify reads them: rows left zero (-1), repeats, a reduced head's
  // columns spread over a wider row and the identity, from one row to many blocks' width; checked
  // against the definition on the host too.
  for (const bool mapped : {false, true}) {
    for (const int64_t width : {int64_t{5}, int64_t{1000}}) {
      cases.push_back(
          {"gather_rows/f32/" + std::string(mapped ? "mapped/" : "") + std::to_string(width),
           kExact, [=](Backend& backend) {
             const int64_t count = 7, source_rows = 4;
             const int64_t out_width = mapped ? 3 * width + 2 : width;
             const std::vector<float> source = random_floats(source_rows * width, 411);
             const std::vector<int32_t> index = {2, -1, 0, 3, 3, -1, 1};
             std::vector<int32_t> columns;
             for (int64_t c = 0; c < width; ++c) columns.push_back(static_cast<int32_t>(3 * c + 1));
             std::vector<float> expected(static_cast<size_t>(count * out_width), 0.0f);
             for (int64_t r = 0; r < count; ++r) {
               if (index[static_cast<size_t>(r)] < 0) continue;
               for (int64_t c = 0; c < width; ++c) {
                 const int64_t column = mapped ? columns[static_cast<size_t>(c)] : c;
                 expected[static_cast<size_t>(r * out_width + column)] =
                     source[static_cast<size_t>(index[static_cast<size_t>(r)] * width + c)];
               }
             }
             const DeviceBuffer s = upload(backend, source);
             const DeviceBuffer x = upload(backend, index);
             const DeviceBuffer m = upload(backend, columns);
             // Whatever out held before is overwritten.
             const DeviceBuffer out =
                 upload(backend, std::vector<float>(static_cast<size_t>(count * out_width), 7.0f));
             expect_ok(backend.gather_rows({count, width, source_rows, out_width}, s.as<float>(),
                                           x.as<int32_t>(), mapped ? m.as<int32_t>() : nullptr,
                                           out.as<float>()));
             const std::vector<float> got = download<float>(backend, out, count * out_width);
             EXPECT_EQ(got, expected);
             return Outputs{{as_doubles(got)}, {}};
           }});
    }
  }

  // Penalties and bias as edits (a repetition penalty on positive and negative logits, a token
  // outside the row, rows without edits), with and without a grammar's masks.
  for (const bool masked : {false, true}) {
    cases.push_back(
        {std::string("edit_logits/f32/6x50/") + (masked ? "masked" : "unmasked"), kExact,
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
        {"token_logprobs/f32/6x50/top" + std::to_string(top), kClose, [=](Backend& backend) {
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
}

// sample over `rows` of `logits` ([rows, width], entries standing for `map`'s tokens where it is
// given): q, then each row's top probability, then its weights (drawn token, probe, ranking) as
// float outputs; the drawn tokens, then each row's token, status and ranking as integer outputs.
// A row that failed reports its token and status alone.
Outputs run_sample(Backend& backend, const std::vector<kernels::SampleRow>& rows,
                   const std::vector<float>& logits, const std::vector<int32_t>& map,
                   int64_t vocab) {
  const auto count = static_cast<int64_t>(rows.size());
  const int64_t width = map.empty() ? vocab : static_cast<int64_t>(map.size());
  const DeviceBuffer rows_d = upload(backend, rows);
  const DeviceBuffer logits_d = upload(backend, logits);
  const DeviceBuffer map_d = upload(backend, map);
  const DeviceBuffer q = output<float>(backend, count * width);
  const DeviceBuffer out = output<uint8_t>(backend, count * sizeof(kernels::SampledRow));
  const DeviceBuffer drawn = output<int32_t>(backend, count);
  expect_ok(backend.sample({count, width, vocab}, rows_d.as<kernels::SampleRow>(),
                           logits_d.as<float>(), map.empty() ? nullptr : map_d.as<int32_t>(),
                           q.as<float>(), out.as<kernels::SampledRow>(), drawn.as<int32_t>()));
  std::vector<kernels::SampledRow> sampled(rows.size());
  expect_ok(backend.copy_to_host(sampled.data(), out.data(),
                                 sampled.size() * sizeof(kernels::SampledRow)));
  const std::vector<float> q_host = download<float>(backend, q, count * width);
  Outputs outputs{{as_doubles(q_host), {}, {}},
                  {as_integers(download<int32_t>(backend, drawn, count)), {}}};
  for (size_t r = 0; r < rows.size(); ++r) {
    const kernels::SampledRow& row = sampled[r];
    outputs.integers[1].push_back(row.token);
    outputs.integers[1].push_back(row.status);
    if (row.status != static_cast<int32_t>(kernels::RowStatus::kOk)) continue;
    outputs.floats[1].push_back(row.top_probability);
    outputs.floats[2].push_back(row.token_weight);
    outputs.floats[2].push_back(row.probe_weight);
    outputs.floats[2].insert(outputs.floats[2].end(), row.ranked_weight,
                             row.ranked_weight + kernels::kMaxRanked);
    outputs.integers[1].insert(outputs.integers[1].end(), row.ranked,
                               row.ranked + kernels::kMaxRanked);
    if (rows[r].rule == kernels::SampleRule::kInverseCdf) {
      const std::span<const float> row_q(q_host.data() + r * static_cast<size_t>(width),
                                         static_cast<size_t>(width));
      EXPECT_GE(
          cdf_margin(row_q, RandomStream(rows[r].seed).uniform(rows[r].position, rows[r].draw)),
          kNearBoundary)
          << "row " << r << "'s draw lies within rounding of its CDF's boundary";
    }
  }
  return outputs;
}

void add_sample_cases(std::vector<OpCase>& cases) {
  cases.push_back({"sample/argmax/6x50", kClose, [](Backend& backend) {
                     constexpr int64_t rows = 6, vocab = 50;
                     std::vector<kernels::SampleRow> sample_rows(static_cast<size_t>(rows));
                     for (int64_t r = 0; r < rows; ++r) {
                       kernels::SampleRow& row = sample_rows[static_cast<size_t>(r)];
                       row.settings = {0.0f, 0, 1.0f, 0.0f};
                       row.seed = 5;
                       row.position = r;
                       row.rule = kernels::SampleRule::kArgmax;
                       row.draw = Draw::kDraft;
                       row.ranked = 4;
                       row.probe = static_cast<int32_t>(r);
                       row.weigh = 1;
                     }
                     return run_sample(backend, sample_rows, random_floats(rows * vocab, 103, 3.0f),
                                       {}, vocab);
                   }});
  // Every rule over the settings grid, rankings of 4 and 10, weighed or not, a probe; rows that
  // fail (corrupt logits, every token banned, an unknown rule, too many ranked); with and without
  // a token map (a reduced head scoring every third token and the last). The largest vocabulary
  // under one setting of each three, the rules in turn.
  const std::vector<Tolerance> tolerances = {kProbability, Tolerance{0.0, 1e-12}, kProbability};
  for (const int64_t vocab : {17, 1000, 128256}) {
    for (const bool mapped : {false, true}) {
      std::vector<int32_t> map;
      if (mapped) {
        for (int64_t t = 0; t < vocab; t += 3) map.push_back(static_cast<int32_t>(t));
        if (map.back() != vocab - 1) map.push_back(static_cast<int32_t>(vocab - 1));
      }
      const int64_t width = mapped ? static_cast<int64_t>(map.size()) : vocab;
      const bool large = vocab > 1000;
      const std::vector<kernels::LogitsSettings> grid = settings_grid();
      const auto count = static_cast<int64_t>(grid.size()) / (large ? 3 : 1) + 4;
      cases.push_back(
          {"sample/every rule/" + std::to_string(count) + "x" + std::to_string(width) +
               (mapped ? "/map to " + std::to_string(vocab) : ""),
           kProbability,
           [=](Backend& backend) {
             Rng rng(static_cast<uint64_t>(vocab) * 2 + (mapped ? 1 : 0));
             std::vector<kernels::SampleRow> rows;
             std::vector<float> logits;
             const kernels::SampleRule rules[] = {kernels::SampleRule::kArgmax,
                                                  kernels::SampleRule::kInverseCdf,
                                                  kernels::SampleRule::kSharedNoise};
             for (size_t index = 0; index < grid.size(); ++index) {
               if (large && index % 3 != index / 3 % 3) continue;
               const kernels::LogitsSettings& settings = grid[index];
               const std::vector<float> row =
                   make_logits(index % 4 == 3 ? LogitKind::kTies : LogitKind::kSpread, width, rng);
               logits.insert(logits.end(), row.begin(), row.end());
               kernels::SampleRow entry{};
               entry.settings = settings;
               entry.seed = 7000 + index;
               entry.position = static_cast<int64_t>(index % 5);
               entry.rule =
                   settings.temperature == 0.0f ? kernels::SampleRule::kArgmax : rules[index % 3];
               entry.draw = Draw::kDraft;
               entry.ranked = index % 2 == 0 ? 4 : 10;
               entry.probe = static_cast<int32_t>(rng.uniform() * static_cast<double>(vocab));
               entry.weigh = index % 3 != 0 ? 1 : 0;
               rows.push_back(entry);
             }
             for (int fault = 0; fault < 4; ++fault) {
               std::vector<float> row = make_logits(LogitKind::kSpread, width, rng);
               if (fault == 0) row[static_cast<size_t>(width / 3)] = NAN;
               if (fault == 1) std::fill(row.begin(), row.end(), -INFINITY);
               logits.insert(logits.end(), row.begin(), row.end());
               kernels::SampleRow entry{};
               entry.settings = kPlainSampling;
               entry.rule = fault == 2 ? static_cast<kernels::SampleRule>(7)
                                       : kernels::SampleRule::kInverseCdf;
               entry.draw = Draw::kDraft;
               entry.ranked = fault == 3 ? static_cast<int32_t>(kernels::kMaxRanked + 1) : 2;
               entry.probe = -1;
               entry.weigh = 1;
               rows.push_back(entry);
             }
             return run_sample(backend, rows, logits, map, vocab);
           },
           tolerances});
    }
  }
}

struct BatchOptions {
  int64_t batch = 16;
  int64_t gamma = 4;
  int64_t vocab_p = 1000;
  int64_t vocab_q = 1000;
  bool point_masses = false;
  float noise = 1.0f;  // how far the target's logits stray from the draft's
  bool same = false;   // p_i = q_{i+1} exactly: every draft is accepted
  uint64_t seed = 1;
};

// Distributions processed as the engine would (some with top-k/top-p zeros), a target that agrees
// with the draft more or less, drafts drawn from q (or, for point masses, mostly from p and
// sometimes anything, out of range included), counts from 0 to gamma.
VerifyBatch make_batch(const BatchOptions& options) {
  VerifyBatch c;
  c.batch = options.batch;
  c.gamma = options.gamma;
  c.vocab_p = options.vocab_p;
  c.vocab_q = options.vocab_q;
  c.point_masses = options.point_masses;
  Rng rng(options.seed);
  const int64_t wide = std::max(c.vocab_p, c.vocab_q);
  const kernels::LogitsSettings flavours[] = {
      kPlainSampling, {0.8f, 40, 1.0f, 0.0f}, {1.2f, 0, 0.9f, 0.0f}, {1.0f, 0, 1.0f, 0.05f}};
  std::vector<float> p_row(static_cast<size_t>(c.vocab_p));
  std::vector<float> q_row(static_cast<size_t>(c.vocab_q));
  for (int64_t b = 0; b < c.batch; ++b) {
    const auto count = static_cast<int32_t>(b % (c.gamma + 1));
    c.counts.push_back(count);
    const kernels::LogitsSettings& flavour = flavours[b % 4];
    for (int64_t i = 0; i <= c.gamma; ++i) {
      std::vector<float> logits(static_cast<size_t>(wide));
      for (float& logit : logits) logit = static_cast<float>((rng.uniform() - 0.5) * 8.0);
      std::vector<float> target_logits(logits.begin(), logits.begin() + c.vocab_p);
      if (!options.same) {
        for (float& logit : target_logits) {
          logit += static_cast<float>((rng.uniform() - 0.5) * options.noise);
        }
      }
      kernels::cpu::process_logits(flavour, target_logits, p_row);
      c.p.insert(c.p.end(), p_row.begin(), p_row.end());
      if (i == c.gamma) break;
      if (!c.point_masses) {
        kernels::cpu::process_logits(flavour, std::span<const float>(logits.data(), q_row.size()),
                                     q_row);
        if (options.same) q_row = p_row;
        c.q.insert(c.q.end(), q_row.begin(), q_row.end());
      }
      int32_t draft = -1;
      if (i < count) {
        if (!c.point_masses) {
          draft = kernels::cpu::sample_from(q_row, rng.uniform());
        } else if (rng.uniform() < 0.8) {
          draft = kernels::cpu::sample_from(p_row, rng.uniform());
        } else {
          draft = static_cast<int32_t>(rng.uniform() * static_cast<double>(c.vocab_p + 3));
        }
      }
      c.drafts.push_back(draft);
    }
  }
  return c;
}

// Row b's random numbers: the stream of seed * 100003 + b, from output position 7 * b.
kernels::VerifyRow verify_row(uint64_t seed, int64_t b, const VerifyBatch& c,
                              kernels::VerifyRule rule) {
  return {seed * 100003 + static_cast<uint64_t>(b), 7 * b, b * (c.gamma + 1),
          c.counts[static_cast<size_t>(b)], rule};
}

// verify over the batch, every row by `rule` with its stream of `seed`: tokens, accepted counts and
// taken alternates. A rejection's drawn token, and a shared-noise row's tokens, are checked to lie
// clear of a boundary, where a device's token could differ from the CPU's.
Outputs run_verify(Backend& backend, const VerifyBatch& c, kernels::VerifyRule rule,
                   uint64_t seed) {
  std::vector<kernels::VerifyRow> rows;
  for (int64_t b = 0; b < c.batch; ++b) rows.push_back(verify_row(seed, b, c, rule));
  const int64_t width = c.gamma + 1;
  const DeviceBuffer rows_d = upload(backend, rows);
  const DeviceBuffer p = upload(backend, c.p);
  const DeviceBuffer q = upload(backend, c.q);
  const DeviceBuffer drafts = upload(backend, c.drafts);
  const DeviceBuffer tokens = output<int32_t>(backend, c.batch * width);
  const DeviceBuffer accepted = output<int32_t>(backend, c.batch);
  const DeviceBuffer taken = output<int32_t>(backend, c.batch);
  expect_ok(backend.verify(
      {c.batch, c.gamma, c.batch * width, c.vocab_p, c.point_masses ? 0 : c.vocab_q, 0},
      rows_d.as<kernels::VerifyRow>(), p.as<float>(), nullptr,
      c.point_masses ? nullptr : q.as<float>(), c.gamma > 0 ? drafts.as<int32_t>() : nullptr,
      nullptr, nullptr, tokens.as<int32_t>(), accepted.as<int32_t>(), taken.as<int32_t>()));
  Outputs outputs{{},
                  {as_integers(download<int32_t>(backend, tokens, c.batch * width)),
                   as_integers(download<int32_t>(backend, accepted, c.batch)),
                   as_integers(download<int32_t>(backend, taken, c.batch))}};
  for (int64_t b = 0; b < c.batch; ++b) {
    const auto k = static_cast<int32_t>(outputs.integers[1][static_cast<size_t>(b)]);
    const RandomStream stream(rows[static_cast<size_t>(b)].seed);
    const int64_t position = rows[static_cast<size_t>(b)].position;
    if (rule == kernels::VerifyRule::kRejection && k >= 0) {
      EXPECT_GE(cdf_margin(c.final_distribution(b, k), stream.uniform(position + k, Draw::kToken)),
                kNearBoundary)
          << "row " << b << "'s new token lies within rounding of its CDF's boundary";
    }
    if (rule == kernels::VerifyRule::kSharedNoise) {
      for (int64_t i = 0; i <= std::max(k, 0); ++i) {
        EXPECT_GE(noise_gap(c.p_row(b, i), stream, position + i), kNearBoundary)
            << "row " << b << " position " << i << ": two noisy scores within rounding";
      }
    }
  }
  return outputs;
}

void add_verify_cases(std::vector<OpCase>& cases) {
  using kernels::VerifyRule;
  cases.push_back({"verify/greedy/3x4", kExact, [](Backend& backend) {
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
                                              VerifyRule::kGreedy});
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

  // Rejection sampling: draft distributions (mostly accepted, and with noise 4 mostly rejected),
  // point masses, gamma 0, q and p the same (everything accepted), a first draft the target
  // forbids (always rejected), q wider than p (drafts p gives no mass) and narrower (q zero past
  // its width), and a large vocabulary.
  struct Rejection {
    std::string name;
    BatchOptions options;
    uint64_t seed;  // the rows' streams
  };
  const auto options = [](int64_t batch, uint64_t seed) {
    BatchOptions o;
    o.batch = batch;
    o.seed = seed;
    return o;
  };
  std::vector<Rejection> rejections = {{"draft distributions", options(40, 11), 1},
                                       {"mostly rejected", options(40, 12), 2},
                                       {"point masses", options(40, 13), 3},
                                       {"gamma 0", options(12, 14), 4},
                                       {"the distributions agree", options(20, 15), 5},
                                       {"a first draft the target forbids", options(20, 16), 6},
                                       {"q wider than p", options(30, 17), 7},
                                       {"q narrower than p", options(30, 18), 8},
                                       {"a large vocabulary", options(6, 19), 9}};
  rejections[1].options.noise = 4.0f;
  rejections[2].options.point_masses = true;
  rejections[3].options.gamma = 0;
  rejections[4].options.same = true;
  rejections[6].options.vocab_q = 1040;
  rejections[7].options.vocab_q = 960;
  rejections[8].options.gamma = 5;
  rejections[8].options.vocab_p = rejections[8].options.vocab_q = 32000;
  for (const Rejection& r : rejections) {
    const BatchOptions& o = r.options;
    cases.push_back({"verify/rejection/" + r.name + "/" + std::to_string(o.batch) + "x" +
                         std::to_string(o.gamma) + "x" + std::to_string(o.vocab_p) +
                         (o.vocab_q != o.vocab_p ? "+" + std::to_string(o.vocab_q) : ""),
                     kExact, [=](Backend& backend) {
                       VerifyBatch c = make_batch(o);
                       const bool forbid = r.name == "a first draft the target forbids";
                       for (int64_t b = 0; forbid && b < c.batch; ++b) {
                         if (c.counts[static_cast<size_t>(b)] == 0) continue;
                         const int32_t draft = c.drafts[static_cast<size_t>(b * c.gamma)];
                         c.p[static_cast<size_t>(b * (c.gamma + 1) * c.vocab_p + draft)] =
                             0.0f;  // p_0(d_1)
                       }
                       Outputs outputs = run_verify(backend, c, VerifyRule::kRejection, r.seed);
                       if (o.same) {
                         EXPECT_EQ(outputs.integers[1], as_integers(c.counts)) << "all accepted";
                       }
                       if (forbid) {
                         EXPECT_EQ(outputs.integers[1], std::vector<int64_t>(c.counts.size(), 0))
                             << "every first draft rejected";
                       }
                       return outputs;
                     }});
  }

  // Greedy: tied logits give tied probabilities, where the lowest id must win; drafts mostly the
  // target's argmax; gamma 0 accepts nothing.
  for (const int64_t vocab : {1000, 128256}) {
    for (const int64_t gamma : {0, 5}) {
      const int64_t batch = vocab > 1000 ? 4 : 24;
      cases.push_back(
          {"verify/greedy/ties/" + std::to_string(batch) + "x" + std::to_string(gamma) + "x" +
               std::to_string(vocab),
           kExact, [=](Backend& backend) {
             Rng rng(static_cast<uint64_t>(vocab + gamma));
             VerifyBatch c;
             c.batch = batch;
             c.gamma = gamma;
             c.vocab_p = c.vocab_q = vocab;
             c.point_masses = true;
             std::vector<float> p_row(static_cast<size_t>(vocab));
             for (int64_t b = 0; b < batch; ++b) {
               const auto count = static_cast<int32_t>(b % (gamma + 1));
               c.counts.push_back(count);
               for (int64_t i = 0; i <= gamma; ++i) {
                 kernels::cpu::process_logits(kPlainSampling,
                                              make_logits(LogitKind::kTies, vocab, rng), p_row);
                 c.p.insert(c.p.end(), p_row.begin(), p_row.end());
                 if (i == gamma) break;
                 int32_t draft = -1;
                 if (i < count) {
                   draft = rng.uniform() < 0.75
                               ? kernels::cpu::argmax(p_row)
                               : static_cast<int32_t>(rng.uniform() * static_cast<double>(vocab));
                 }
                 c.drafts.push_back(draft);
               }
             }
             Outputs outputs = run_verify(backend, c, VerifyRule::kGreedy, 0);
             if (gamma == 0) {
               EXPECT_EQ(outputs.integers[1], std::vector<int64_t>(static_cast<size_t>(batch), 0));
             }
             return outputs;
           }});
    }
  }

  // Shared noise: the target's own Gumbel-max tokens under each row's noise.
  for (const int64_t vocab : {1000, 32000}) {
    BatchOptions o;
    o.batch = vocab > 1000 ? 8 : 40;
    o.vocab_p = o.vocab_q = vocab;
    o.point_masses = true;
    o.seed = static_cast<uint64_t>(vocab);
    cases.push_back(
        {"verify/shared_noise/" + std::to_string(o.batch) + "x4x" + std::to_string(vocab), kExact,
         [=](Backend& backend) {
           return run_verify(backend, make_batch(o), VerifyRule::kSharedNoise, 3);
         }});
  }

  // A count past gamma, under every rule: that row is marked undecided (-1), the others decided.
  cases.push_back({"verify/every rule/a count outside gamma/3x2x50", kExact, [](Backend& backend) {
                     BatchOptions o;
                     o.batch = 3;
                     o.gamma = 2;
                     o.vocab_p = o.vocab_q = 50;
                     o.seed = 20;
                     VerifyBatch c = make_batch(o);
                     c.counts[1] = 3;
                     Outputs outputs;
                     for (const VerifyRule rule :
                          {VerifyRule::kRejection, VerifyRule::kGreedy, VerifyRule::kSharedNoise}) {
                       Outputs verdict = run_verify(backend, c, rule, 1);
                       const std::vector<int64_t>& accepted = verdict.integers[1];
                       EXPECT_EQ(accepted[1], -1);
                       EXPECT_GE(accepted[0], 0);
                       EXPECT_GE(accepted[2], 0);
                       EXPECT_EQ(std::vector<int64_t>(verdict.integers[0].begin() + 3,
                                                      verdict.integers[0].begin() + 6),
                                 std::vector<int64_t>(3, -1));
                       for (std::vector<int64_t>& integers : verdict.integers) {
                         outputs.integers.push_back(std::move(integers));
                       }
                     }
                     return outputs;
                   }});
}

std::vector<OpCase> op_cases() {
  std::vector<OpCase> cases;
  add_embedding_cases(cases);
  add_norm_cases(cases);
  add_matmul_cases(cases);
  add_rope_and_cache_cases(cases);
  add_attention_cases(cases);
  add_elementwise_cases(cases);
  add_logits_cases(cases);
  add_sample_cases(cases);
  add_verify_cases(cases);
  return cases;
}

// ---- bad shapes ---------------------------------------------------------------------------------

struct BadShape {
  std::string name;
  std::function<Status(Backend&)> call;  // the op with a bad shape; pointers are never read
};

std::vector<BadShape> bad_shapes() {
  using kernels::AttentionParams;
  using kernels::KvWriteParams;
  using kernels::RopeParams;
  using kernels::RopeStyle;
  // Every pointer is null (but where a pointer's presence is what is checked): a backend that
  // read one before checking the shape would crash.
  static const float some_float = 0.0f;
  static const uint32_t some_mask = 0;
  std::vector<BadShape> bad = {
      {"embedding: dim 0",
       [](Backend& b) {
         return b.embedding({1, 4, 0, DType::kF32}, nullptr, nullptr, nullptr);
       }},
      {"embedding: negative tokens",
       [](Backend& b) {
         return b.embedding({-1, 4, 4, DType::kF32}, nullptr, nullptr, nullptr);
       }},
      {"embedding: vocabulary 0",
       [](Backend& b) {
         return b.embedding({1, 0, 4, DType::kBF16}, nullptr, nullptr, nullptr);
       }},
      {"embedding: a scale that is not finite",
       [](Backend& b) {
         return b.embedding({1, 4, 4, DType::kF32, kernels::WeightLayout::kRows,
                             std::numeric_limits<float>::infinity()},
                            nullptr, nullptr, nullptr);
       }},
      {"matmul: in_features 0",
       [](Backend& b) {
         return b.matmul({1, 0, 4, DType::kF32, DType::kF32}, nullptr, nullptr, nullptr, nullptr,
                         nullptr);
       }},
      {"matmul: negative rows",
       [](Backend& b) {
         return b.matmul({-1, 4, 4, DType::kF32, DType::kF32}, nullptr, nullptr, nullptr, nullptr,
                         nullptr);
       }},
      {"matmul: bf16, in_features 0",
       [](Backend& b) {
         return b.matmul({1, 0, 4, DType::kBF16, DType::kF32}, nullptr, nullptr, nullptr, nullptr,
                         nullptr);
       }},
      {"matmul: f16 GEMM rows, out_features 0",
       [](Backend& b) {
         return b.matmul({20, 4, 0, DType::kF16, DType::kF32}, nullptr, nullptr, nullptr, nullptr,
                         nullptr);
       }},
      {"matmul: a quantized weight without scales",
       [](Backend& b) {
         return b.matmul({1, 16, 4, DType::kI8, DType::kF32, 1, 16}, nullptr, nullptr, nullptr,
                         nullptr, nullptr);
       }},
      {"matmul: scale blocks of 24 columns, not whole 16-column groups",
       [](Backend& b) {
         return b.matmul({1, 64, 4, DType::kI8, DType::kF32, 1, 24}, nullptr, nullptr, &some_float,
                         nullptr, nullptr);
       }},
      {"matmul_group: no targets", [](Backend& b) { return b.matmul_group(nullptr, nullptr, 0); }},
      {"matmul_group: targets of different rows",
       [](Backend& b) {
         static const kernels::MatmulTarget targets[2] = {
             {{2, 64, 64, DType::kBF16, DType::kF32}, nullptr, nullptr, nullptr, nullptr},
             {{1, 64, 64, DType::kBF16, DType::kF32}, nullptr, nullptr, nullptr, nullptr}};
         return b.matmul_group(nullptr, targets, 2);
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
      {"gated_activation: negative rows",
       [](Backend& b) {
         return b.gated_activation({-1, 4}, nullptr, nullptr, nullptr);
       }},
      {"gated_activation: an activation out of the enum",
       [](Backend& b) {
         return b.gated_activation({1, 4, static_cast<kernels::GateActivation>(7)}, nullptr,
                                   nullptr, nullptr);
       }},
      {"add: negative count", [](Backend& b) { return b.add(-1, nullptr, nullptr); }},
      {"gather: negative count",
       [](Backend& b) {
         return b.gather({-1, 4}, nullptr, nullptr, nullptr);
       }},
      {"gather: negative source count",
       [](Backend& b) {
         return b.gather({1, -4}, nullptr, nullptr, nullptr);
       }},
      {"gather_rows: negative rows",
       [](Backend& b) {
         return b.gather_rows({-1, 4, 4, 4}, nullptr, nullptr, nullptr, nullptr);
       }},
      {"gather_rows: out rows narrower than the source's",
       [](Backend& b) {
         return b.gather_rows({1, 4, 4, 3}, nullptr, nullptr, nullptr, nullptr);
       }},
      {"fill_uniform: low above high",
       [](Backend& b) {
         return b.fill_uniform({4, DType::kF32, 1, 1.0f, 0.0f}, nullptr);
       }},
      {"process_logits: vocab 0",
       [](Backend& b) {
         return b.process_logits({1, 0}, nullptr, nullptr, nullptr, nullptr);
       }},
      {"process_logits: negative rows",
       [](Backend& b) {
         return b.process_logits({-1, 10}, nullptr, nullptr, nullptr, nullptr);
       }},
      {"edit_logits: masks without their width",
       [](Backend& b) {
         return b.edit_logits({1, 40, 0}, nullptr, nullptr, &some_mask, nullptr);
       }},
      {"edit_logits: a mask width not the vocabulary's",
       [](Backend& b) {
         return b.edit_logits({1, 40, 1}, nullptr, nullptr, &some_mask, nullptr);
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
      {"sample: vocab past width without a token map",
       [](Backend& b) {
         return b.sample({1, 8, 9}, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
       }},
      {"verify: q without its width",
       [](Backend& b) {
         return b.verify({1, 1, 2, 4, 0, 0}, nullptr, nullptr, nullptr, &some_float, nullptr,
                         nullptr, nullptr, nullptr, nullptr, nullptr);
       }},
  };
  const auto add = [&](std::string name, std::function<Status(Backend&)> call) {
    bad.push_back({std::move(name), std::move(call)});
  };
  for (const kernels::RmsNormParams& p :
       {kernels::RmsNormParams{-1, 4, 1e-5f, DType::kF32},
        {1, 0, 1e-5f, DType::kF32},
        {1, 4, -1.0f, DType::kF16},
        {1, 4, std::numeric_limits<float>::quiet_NaN(), DType::kF32},
        {1, 0, 1e-5f, DType::kBF16}}) {
    const std::string shape = std::to_string(p.rows) + "x" + std::to_string(p.dim) + " eps " +
                              std::to_string(p.eps) + " " + std::string(dtype_name(p.weight_dtype));
    add("rmsnorm: " + shape, [p](Backend& b) { return b.rmsnorm(p, nullptr, nullptr, nullptr); });
    add("add_rmsnorm: " + shape,
        [p](Backend& b) { return b.add_rmsnorm(p, nullptr, nullptr, nullptr, nullptr); });
  }
  // Each bad rotation alone and with its cache write; then a good rotation with a cache write of
  // another dtype, tokens, heads or head_dim.
  for (const RopeParams& p : {RopeParams{1, 1, 1, 3, RopeStyle::kRotateHalf},
                              {-1, 1, 1, 4, RopeStyle::kRotateHalf},
                              {1, 0, 1, 4, RopeStyle::kInterleaved},
                              {1, 1, 0, 4, RopeStyle::kInterleaved},
                              {1, 1, 1, 0, RopeStyle::kRotateHalf}}) {
    const std::string shape = std::to_string(p.num_tokens) + " tokens, " +
                              std::to_string(p.num_heads) + "/" + std::to_string(p.num_kv_heads) +
                              " heads of " + std::to_string(p.head_dim);
    const KvWriteParams cache{p.num_tokens, p.num_kv_heads, p.head_dim, 8, DType::kF32};
    add("rope: " + shape,
        [p](Backend& b) { return b.rope(p, nullptr, nullptr, nullptr, nullptr); });
    add("rope_kv_write: " + shape, [p, cache](Backend& b) {
      return b.rope_kv_write(p, cache, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                             nullptr, nullptr);
    });
  }
  const RopeParams one_head{1, 1, 1, 4, RopeStyle::kRotateHalf};
  for (const KvWriteParams& cache : {KvWriteParams{1, 1, 4, 8, DType::kF16},
                                     {2, 1, 4, 8, DType::kF32},
                                     {1, 2, 4, 8, DType::kF32},
                                     {1, 1, 8, 8, DType::kBF16}}) {
    add("rope_kv_write: a cache write of " + std::to_string(cache.num_tokens) + " tokens, " +
            std::to_string(cache.num_kv_heads) + " heads of " + std::to_string(cache.head_dim) +
            " " + std::string(dtype_name(cache.cache_dtype)),
        [one_head, cache](Backend& b) {
          return b.rope_kv_write(one_head, cache, nullptr, nullptr, nullptr, nullptr, nullptr,
                                 nullptr, nullptr, nullptr);
        });
  }
  for (const KvWriteParams& p : {KvWriteParams{-1, 1, 4, 8, DType::kF32},
                                 {1, 0, 4, 8, DType::kF32},
                                 {1, 1, 0, 8, DType::kBF16},
                                 {1, 1, 4, 8, DType::kF16},
                                 {1, 1, 4, 4, DType::kI8}}) {
    add("kv_write: " + std::to_string(p.num_tokens) + " tokens, " + std::to_string(p.num_kv_heads) +
            " heads of " + std::to_string(p.head_dim) + " " +
            std::string(dtype_name(p.cache_dtype)),
        [p](Backend& b) { return b.kv_write(p, nullptr, nullptr, nullptr, nullptr, nullptr); });
  }
  for (const AttentionParams& p : {AttentionParams{-1, 1, 1, 1, 4, 4, 1, 0.5f, 0, DType::kF32},
                                   {1, -1, 1, 1, 4, 4, 1, 0.5f, 0, DType::kF32},
                                   {1, 1, 1, 1, 0, 4, 1, 0.5f, 0, DType::kF32},
                                   {1, 1, 2, 0, 4, 4, 1, 0.5f, 0, DType::kBF16},
                                   {1, 1, 1, 1, 4, 0, 1, 0.5f, 0, DType::kBF16},
                                   {1, 1, 1, 1, 4, 4, 1, 0.5f, -1, DType::kF32},
                                   {1, 1, 1, 1, 4, 4, 1, 0.5f, 0, DType::kI8}}) {
    add("attention: " + std::to_string(p.num_seqs) + " sequences, " + std::to_string(p.num_tokens) +
            " tokens, " + std::to_string(p.num_heads) + "/" + std::to_string(p.num_kv_heads) +
            " heads of " + std::to_string(p.head_dim) + ", blocks of " +
            std::to_string(p.block_size) + ", window " + std::to_string(p.sliding_window) + ", " +
            std::string(dtype_name(p.cache_dtype)),
        [p](Backend& b) {
          return b.attention(p, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                             nullptr);
        });
  }
  return bad;
}

// ---- bad index data -----------------------------------------------------------------------------

// What an op on bad data returned, and the synchronize() after it: a backend that reads the data
// as it runs the op fails the op; a device's queued kernels fail the synchronize.
struct Reported {
  Status op;
  Status next_synchronize;
};

Reported reported(Backend& backend, Status op) {
  Status next = backend.synchronize();
  return {std::move(op), std::move(next)};
}

struct BadData {
  std::string name;
  StatusCode code;                         // the CPU's
  std::function<Reported(Backend&)> call;  // the op on its data, while the data lives
};

std::vector<BadData> bad_data() {
  std::vector<BadData> bad;
  // Embedding: an id past the vocabulary, and a negative one.
  for (const int32_t id : {4, -1}) {
    bad.push_back({"embedding: id " + std::to_string(id) + " of 4", StatusCode::kOutOfRange,
                   [id](Backend& backend) {
                     const DeviceBuffer table = upload(backend, std::vector<float>(4 * 3, 1.0f));
                     const DeviceBuffer ids = upload(backend, std::vector<int32_t>{id});
                     const DeviceBuffer out = output<float>(backend, 3);
                     return reported(backend,
                                     backend.embedding({1, 4, 3, DType::kF32}, ids.as<int32_t>(),
                                                       table.data(), out.as<float>()));
                   }});
  }
  // Gather: an index past the source, and one below -1 (-1 keeps the entry).
  for (const int32_t index : {4, -2}) {
    bad.push_back(
        {"gather: index " + std::to_string(index) + " of 4", StatusCode::kOutOfRange,
         [index](Backend& backend) {
           const DeviceBuffer source = upload(backend, std::vector<int32_t>{1, 2, 3, 4});
           const DeviceBuffer indices = upload(backend, std::vector<int32_t>{0, index, -1});
           const DeviceBuffer out = upload(backend, std::vector<int32_t>{9, 9, 9});
           return reported(backend, backend.gather({3, 4}, source.as<int32_t>(),
                                                   indices.as<int32_t>(), out.as<int32_t>()));
         }});
  }
  // Gather_rows: a row index past the source, and a column past the out row.
  for (const bool bad_column : {false, true}) {
    bad.push_back({std::string("gather_rows: ") + (bad_column ? "column 6 of 6" : "index 2 of 2"),
                   StatusCode::kOutOfRange, [bad_column](Backend& backend) {
                     const DeviceBuffer source = upload(backend, std::vector<float>(2 * 3, 1.0f));
                     const DeviceBuffer indices =
                         upload(backend, std::vector<int32_t>{1, bad_column ? 0 : 2});
                     const DeviceBuffer columns =
                         upload(backend, std::vector<int32_t>{0, 2, bad_column ? 6 : 4});
                     const DeviceBuffer out = output<float>(backend, 2 * 6);
                     return reported(
                         backend, backend.gather_rows({2, 3, 2, 6}, source.as<float>(),
                                                      indices.as<int32_t>(), columns.as<int32_t>(),
                                                      out.as<float>()));
                   }});
  }
  // A cache slot outside the cache, written alone and after a rotation.
  for (const bool rotated : {false, true}) {
    bad.push_back({std::string(rotated ? "rope_kv_write" : "kv_write") + ": slot 8 of 8",
                   StatusCode::kOutOfRange, [rotated](Backend& backend) {
                     const DeviceBuffer rows = upload(backend, std::vector<float>(2 * 4, 1.0f));
                     const DeviceBuffer q = upload(backend, std::vector<float>(2 * 4, 1.0f));
                     const DeviceBuffer k = upload(backend, std::vector<float>(2 * 4, 1.0f));
                     const DeviceBuffer cache = upload(backend, std::vector<float>(8 * 4, 0.0f));
                     const DeviceBuffer slots = upload(backend, std::vector<int32_t>{3, 8});
                     const DeviceBuffer positions = upload(backend, std::vector<int32_t>{0, 1});
                     const DeviceBuffer inv_freq = upload(backend, std::vector<float>{1.0f, 0.5f});
                     const kernels::KvWriteParams params{2, 1, 4, 8, DType::kF32};
                     return reported(
                         backend,
                         rotated
                             ? backend.rope_kv_write({2, 1, 1, 4, kernels::RopeStyle::kRotateHalf},
                                                     params, positions.as<int32_t>(),
                                                     inv_freq.as<float>(), slots.as<int32_t>(),
                                                     q.as<float>(), k.as<float>(), rows.as<float>(),
                                                     cache.data(), cache.data())
                             : backend.kv_write(params, rows.as<float>(), rows.as<float>(),
                                                slots.as<int32_t>(), cache.data(), cache.data()));
                   }});
  }
  // Attention's metadata: query_start not covering the tokens or not from 0, fewer cached
  // positions than new tokens, a context longer than the block table (of 8 positions).
  struct Metadata {
    std::vector<int32_t> query_start;
    std::vector<int32_t> lengths;
    const char* what;
  };
  const Metadata metadata[] = {
      {{0, 1, 3}, {4, 4}, "query_start past num_tokens"},
      {{1, 2, 2}, {4, 4}, "query_start[0] != 0"},
      {{0, 2, 2}, {1, 4}, "a context shorter than its new tokens"},
      {{0, 1, 2}, {4, 9}, "a context longer than the block table"},
  };
  for (const Metadata& m : metadata) {
    bad.push_back(
        {std::string("attention: ") + m.what, StatusCode::kInvalidArgument, [m](Backend& backend) {
           const DeviceBuffer q = upload(backend, std::vector<float>(2 * 2 * 4, 0.25f));
           const DeviceBuffer cache = upload(backend, std::vector<float>(4 * 4 * 4, 0.5f));
           const DeviceBuffer starts = upload(backend, m.query_start);
           const DeviceBuffer lengths = upload(backend, m.lengths);
           const DeviceBuffer tables = upload(backend, std::vector<int32_t>{0, 1, 2, 3});
           const DeviceBuffer out = output<float>(backend, 2 * 2 * 4);
           return reported(backend,
                           backend.attention({2, 2, 2, 1, 4, 4, 2, 0.5f, 0, DType::kF32},
                                             q.as<float>(), cache.data(), cache.data(),
                                             starts.as<int32_t>(), lengths.as<int32_t>(),
                                             tables.as<int32_t>(), nullptr, out.as<float>()));
         }});
  }
  return bad;
}

// ---- the backends -------------------------------------------------------------------------------

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

// `got` against `want`: float output o within by_output[o] (the last for the outputs past them;
// bit for bit where it is zero), integer outputs exactly. Names the first few elements off.
void expect_matches(const Outputs& got, const Outputs& want,
                    const std::vector<Tolerance>& by_output) {
  ASSERT_EQ(got.floats.size(), want.floats.size());
  for (size_t o = 0; o < want.floats.size(); ++o) {
    const Tolerance& tolerance = by_output[std::min(o, by_output.size() - 1)];
    const bool bitwise = tolerance.absolute == 0.0 && tolerance.relative == 0.0;
    const std::vector<double>* magnitudes =
        o < want.magnitudes.size() && !want.magnitudes[o].empty() ? &want.magnitudes[o] : nullptr;
    ASSERT_EQ(got.floats[o].size(), want.floats[o].size());
    int64_t off = 0;
    std::string first_off;  // the first few, named
    for (size_t i = 0; i < want.floats[o].size(); ++i) {
      const double g = got.floats[o][i], w = want.floats[o][i];
      const double scale = magnitudes != nullptr ? (*magnitudes)[i] : std::fabs(w);
      const bool same =
          bitwise ? std::memcmp(&g, &w, sizeof(double)) == 0 || (std::isnan(g) && std::isnan(w))
                  : std::fabs(g - w) <= tolerance.absolute + tolerance.relative * scale;
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

const std::vector<OpCase>& all_cases() {
  static const std::vector<OpCase> cases = op_cases();
  return cases;
}

class BackendOps : public ::testing::TestWithParam<std::tuple<const char*, size_t>> {};

TEST_P(BackendOps, MatchTheCpuReference) {
  const auto [backend_name, index] = GetParam();
  const OpCase& op = all_cases()[index];
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
  if (std::string(backend_name) != "cuda") {
    expect_matches(got, want, {kExact});
  } else {
    expect_matches(
        got, want,
        op.device_by_output.empty() ? std::vector<Tolerance>{op.device} : op.device_by_output);
  }
}

std::string case_name(const ::testing::TestParamInfo<BackendOps::ParamType>& info) {
  std::string name =
      std::string(std::get<0>(info.param)) + "_" + all_cases()[std::get<1>(info.param)].name;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Cases, BackendOps,
                         ::testing::Combine(::testing::ValuesIn(kBackends),
                                            ::testing::Range<size_t>(0, all_cases().size())),
                         case_name);

// The comparison fails an op one element off, one ulp off where it holds bitwise, and one
// integer off; a dot product's element is held to its terms' magnitudes, not to itself.
TEST(BackendOpsHarness, CatchesAnOutputThatIsOff) {
  const std::unique_ptr<Backend> cpu = testing::make_cpu_backend(1);
  for (const OpCase& op : all_cases()) {
    if (op.name.rfind("add_rmsnorm/", 0) == 0) {
      const Outputs want = op.run(*cpu);
      Outputs got = want;
      got.floats[0][3] = std::nextafter(got.floats[0][3], 1e9);
      EXPECT_NONFATAL_FAILURE(expect_matches(got, want, {kExact}),
                              "float output 0: 1 elements off");
      got.floats[0][3] += 1.0;
      EXPECT_NONFATAL_FAILURE(expect_matches(got, want, {kClose}), "float output");
      // A tolerance for each output: the second's alone.
      got = want;
      got.floats[1][0] += 1e-3;
      EXPECT_NONFATAL_FAILURE(expect_matches(got, want, {kExact, kClose}), "float output 1");
      expect_matches(got, want, {kExact, Tolerance{2e-3, 0.0}});
    }
    if (op.name.rfind("argmax/", 0) == 0) {
      const Outputs want = op.run(*cpu);
      Outputs got = want;
      got.integers[0][1] += 1;
      EXPECT_NONFATAL_FAILURE(expect_matches(got, want, {kExact}), "integer outputs differ");
    }
  }
  Outputs want{{{1.0}}, {}, {{100.0}}};
  Outputs got{{{1.5}}, {}};
  expect_matches(got, want, {Tolerance{0.0, 0.01}});
  want.magnitudes.clear();
  EXPECT_NONFATAL_FAILURE(expect_matches(got, want, {Tolerance{0.0, 0.01}}), "float output 0");
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

class BackendBadData : public ::testing::TestWithParam<const char*> {};

// The CPU's StatusCode, reported once: from the op, or from the next synchronize(); the one after
// is ok. CUDA reports from the op only with eager checks, and is checked in both modes.
TEST_P(BackendBadData, IsReportedWithTheCpuStatusCode) {
  std::string skip;
  const std::unique_ptr<Backend> backend = make_backend(GetParam(), &skip);
  if (backend == nullptr) GTEST_SKIP() << skip;
  const std::unique_ptr<Backend> reference = testing::make_cpu_backend(2);
  std::vector<bool> eager_modes = {false};
#if SPECRUN_TEST_CUDA
  auto* cuda = static_cast<kernels::cuda::CudaBackend*>(backend.get());
  eager_modes = {false, true};
#endif
  for (const bool eager : eager_modes) {
#if SPECRUN_TEST_CUDA
    cuda->set_eager_checks(eager);
#endif
    for (const BadData& bad : bad_data()) {
      SCOPED_TRACE(bad.name + (eager ? ", eager checks" : ""));
      EXPECT_EQ(bad.call(*reference).op.code(), bad.code) << "on the CPU";
      const Reported got = bad.call(*backend);
      const Status& failure = got.op.is_ok() ? got.next_synchronize : got.op;
      EXPECT_EQ(failure.code(), bad.code) << failure.to_string();
      EXPECT_TRUE(got.op.is_ok() || got.next_synchronize.is_ok()) << "reported twice";
#if SPECRUN_TEST_CUDA
      EXPECT_EQ(got.op.is_ok(), !eager) << "reported by the op only with eager checks";
#endif
      EXPECT_TRUE(backend->synchronize().is_ok());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendBadData, ::testing::ValuesIn(kBackends));

}  // namespace
}  // namespace specrun
