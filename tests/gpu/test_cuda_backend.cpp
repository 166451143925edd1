// The CUDA backend beyond what each op computes, which test_cuda_backend_ops holds against the CPU
// reference (tests/test_backend_ops.cpp: every op, dtype and shape, bad shapes and bad index
// data): the memory plan, copies, streams, events, timing and staged uploads; fused ops bitwise the
// ops they fuse; batch invariance; and whole models against the CPU. Every test that needs a device
// skips without one.
//
// Tolerances against the CPU, per element, with u = 2^-24 (f32 unit roundoff), derived as
// test_backend_ops derives each op's:
// - attention: scores carry head_dim roundings into exp and the weighted sum carries the context
//   length (values in [-1, 1]): 8 (head_dim + context + 16) u, as in the CPU suite, doubled.
// - whole model: from the per-op bounds through two layers; 1e-3 of the largest logit with f32
//   activations everywhere (batch-invariant mode), 3e-2 when prefill GEMMs round activations to
//   bf16/f16. The argmax must agree wherever the CPU's top-2 margin exceeds twice the tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/sampling.h"
#include "runtime/base/device_buffer.h"
#include "runtime/model/model.h"
#include "runtime/model/synthetic.h"
#include "runtime/sampling/rng.h"
#include "tests/test_support.h"

namespace specrun {
// Test names and failure messages print a dtype by its safetensors name.
static void PrintTo(DType dtype, std::ostream* out) {
  *out << dtype_name(dtype);
}
}  // namespace specrun

namespace specrun::kernels::cuda {
namespace {

constexpr double kUnitRoundoff = 0x1.0p-24;
constexpr DType kAllDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};

using testing::random_floats;
using testing::store;
using testing::StoredTensor;

// Device copies of host data, and back.
DeviceBuffer upload_bytes(Backend& backend, const void* data, size_t bytes) {
  DeviceBuffer buffer(backend, std::max<size_t>(bytes, 1), "test buffer");
  const Status status = backend.copy_to_device(buffer.data(), data, bytes);
  EXPECT_TRUE(status.is_ok()) << status.to_string();
  return buffer;
}

template <typename T>
DeviceBuffer upload(Backend& backend, const std::vector<T>& values) {
  return upload_bytes(backend, values.data(), values.size() * sizeof(T));
}

// An output buffer filled with NaN, so that an element the kernel never writes cannot pass.
DeviceBuffer poisoned(Backend& backend, size_t count) {
  return upload(backend, std::vector<float>(count, std::numeric_limits<float>::quiet_NaN()));
}

template <typename T = float>
std::vector<T> download(Backend& backend, const DeviceBuffer& buffer, size_t count) {
  std::vector<T> values(count);
  const Status status = backend.copy_to_host(values.data(), buffer.data(), count * sizeof(T));
  EXPECT_TRUE(status.is_ok()) << status.to_string();
  return values;
}

// |gpu[i] - ref[i]| <= bound[i] for every i; NaN never passes. Reports the worst element.
::testing::AssertionResult within(std::span<const float> gpu, std::span<const float> ref,
                                  const std::vector<double>& bound) {
  if (gpu.size() != ref.size() || bound.size() != ref.size()) {
    return ::testing::AssertionFailure() << "size mismatch: " << gpu.size() << " vs " << ref.size();
  }
  size_t failures = 0;
  size_t worst = 0;
  double worst_excess = -1.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double difference = std::abs(static_cast<double>(gpu[i]) - ref[i]);
    const bool ok = difference <= bound[i];  // false for NaN
    if (!ok) {
      ++failures;
      const double excess = std::isnan(difference) ? INFINITY : difference - bound[i];
      if (excess > worst_excess) {
        worst_excess = excess;
        worst = i;
      }
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << failures << " of " << ref.size() << " elements out of tolerance; worst at " << worst
         << ": gpu " << gpu[worst] << " ref " << ref[worst] << " bound " << bound[worst];
}

::testing::AssertionResult all_close(std::span<const float> gpu, std::span<const float> ref,
                                     double atol, double rtol) {
  std::vector<double> bound(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) bound[i] = atol + rtol * std::abs(ref[i]);
  return within(gpu, ref, bound);
}

bool bitwise_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The memory plan's count of what the backend's ops take for themselves: arithmetic on shapes,
// no device needed.
TEST(CudaScratchPlan, IsTheLargestSingleNeedInWholeGranulesPlusCublasWorkspace) {
  constexpr uint64_t kGranule = uint64_t{2} << 20;
  ForwardShape shape;
  // A bf16 GEMM of 4,096 rows over 14,336 columns rounds its activations to bf16: 112 MiB.
  shape.matmuls.push_back({4096, 14336, 4096, DType::kBF16, DType::kF32});
  shape.attention = {1, 0, 32, 8, 128, 16, 8192 / 16, 0.088f, 0, DType::kBF16};  // no tokens
  EXPECT_EQ(planned_scratch_bytes({shape}, 132, false),
            (uint64_t{112} << 20) + kCublasWorkspaceBytes);
  // Batch-invariant: the skinny kernel at every row count, which takes no scratch.
  EXPECT_EQ(planned_scratch_bytes({shape}, 132, true), kCublasWorkspaceBytes);
  // FP8 codes add the dequantized bf16 tile (whole 128-row multiples of at most 2^24 weights)
  // after the rounded rows.
  ForwardShape fp8 = shape;
  fp8.matmuls[0].weight_dtype = DType::kF8E4M3;
  const uint64_t tile_rows = (uint64_t{1} << 24) / 14336 / 128 * 128;
  const uint64_t fp8_bytes = uint64_t{4096} * 14336 * 2 + tile_rows * 14336 * 2;
  EXPECT_EQ(planned_scratch_bytes({fp8}, 132, false),
            (fp8_bytes + kGranule - 1) / kGranule * kGranule + kCublasWorkspaceBytes);
  // Two models share the one buffer: the larger need, not the sum.
  EXPECT_EQ(planned_scratch_bytes({shape, fp8}, 132, false),
            planned_scratch_bytes({fp8}, 132, false));
}

TEST(CudaScratchPlan, CoversProcessingTheLogitsWhereThatNeedsMost) {
  // Processing a verification's rows of logits sorts them: 16 bytes a logit in the scratch
  // buffer, at 64 sequences verifying 9 tokens of a 128,256-token vocabulary 1.1 GiB, far past
  // the matmuls' needs. The plan takes it when it is the largest.
  ForwardShape shape;
  // A prefill's GEMM: 112 MiB of activations rounded to bf16.
  shape.matmuls.push_back({4096, 14336, 4096, DType::kBF16, DType::kF32});
  shape.attention = {1, 0, 32, 8, 128, 16, 8192 / 16, 0.088f, 0, DType::kBF16};  // no tokens
  const uint64_t without = planned_scratch_bytes({shape}, 132, false);
  const uint64_t logits = uint64_t{64} * 9 * 128256 * 16;
  const uint64_t with = planned_scratch_bytes({shape}, 132, false, logits);
  EXPECT_GE(with, logits + kCublasWorkspaceBytes);
  EXPECT_LT(with, logits + kCublasWorkspaceBytes + (uint64_t{2} << 20));
  EXPECT_EQ(without, (uint64_t{112} << 20) + kCublasWorkspaceBytes);
  // A need below the GEMM's changes nothing.
  EXPECT_EQ(planned_scratch_bytes({shape}, 132, false, uint64_t{100} << 20), without);
}

TEST(CudaScratchPlan, CoversAttentionsPerSplitStatesAtTheTokenCountThatNeedsMost) {
  // Attention keeps per-split states (splits x tokens x heads x (head_dim + 2) floats) while its
  // grid is small: one sequence, 8 KV heads and 4 query heads each fill 8 x ceil(tokens / 4)
  // blocks, under 4 x 132 on 132 multiprocessors up to 260 tokens; and while the states fit 256
  // MiB.
  ForwardShape shape;
  shape.attention = {1, 300, 32, 8, 128, 16, 1024 / 16, 0.088f, 0, DType::kBF16};
  // 1,024 positions: 16 splits, 266,240 bytes a token; the most at 260 tokens (not at the 300 a
  // forward can feed, which run without): 69,222,400 bytes, 34 granules of 2 MiB.
  EXPECT_EQ(planned_scratch_bytes({shape}, 132, false),
            uint64_t{34} * (uint64_t{2} << 20) + kCublasWorkspaceBytes);
  // 8,192 positions: 128 splits, 2,129,920 bytes a token; the 256 MiB bound stops at 126 tokens
  // (268,369,920 bytes), 128 granules.
  shape.attention.max_blocks_per_seq = 8192 / 16;
  EXPECT_EQ(planned_scratch_bytes({shape}, 132, false),
            (uint64_t{256} << 20) + kCublasWorkspaceBytes);
  // Counts past 16 x 4 x 132 tokens keep no per-split states, so a cache of 2^31 tokens plans as
  // fast, and the same.
  ForwardShape huge = shape;
  huge.attention.num_tokens = INT32_MAX;
  EXPECT_EQ(planned_scratch_bytes({huge}, 132, false), planned_scratch_bytes({shape}, 132, false));
  // The states are the attention's own: a batch-invariant backend keeps them too.
  EXPECT_EQ(planned_scratch_bytes({shape}, 132, true),
            (uint64_t{256} << 20) + kCublasWorkspaceBytes);
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<DeviceInfo> devices;
    const Status listed = list_devices(&devices);
    if (!listed.is_ok() || devices.empty()) {
      GTEST_SKIP() << "no CUDA device" << (listed.is_ok() ? "" : ": " + listed.to_string());
    }
    const Status created = CudaBackend::create(0, &gpu_);
    ASSERT_TRUE(created.is_ok()) << created.to_string();
    cpu_ = testing::make_cpu_backend(2);
  }

  std::unique_ptr<CudaBackend> gpu_;
  std::unique_ptr<cpu::CpuBackend> cpu_;
};

// ---- Backend basics ----------------------------------------------------------------------------

TEST_F(CudaBackendTest, NameMemoryAndCopies) {
  EXPECT_EQ(gpu_->name(), "cuda:0");
  EXPECT_FALSE(gpu_->uses_host_memory());
  EXPECT_NE(gpu_->stream(), nullptr);
  void* empty = gpu_->allocate(0);
  EXPECT_NE(empty, nullptr);
  gpu_->deallocate(empty);

  // Round trip, and memmove semantics for overlapping device copies (as on the CPU).
  const std::vector<float> values = random_floats(1000, 1);
  DeviceBuffer buffer = upload(*gpu_, values);
  EXPECT_EQ(download(*gpu_, buffer, values.size()), values);
  auto* base = buffer.as<float>();
  ASSERT_TRUE(gpu_->copy_on_device(base + 10, base, 500 * sizeof(float)).is_ok());
  std::vector<float> expected = values;
  std::memmove(expected.data() + 10, expected.data(), 500 * sizeof(float));
  EXPECT_EQ(download(*gpu_, buffer, values.size()), expected);
  ASSERT_TRUE(gpu_->copy_on_device(base, base + 7, 300 * sizeof(float)).is_ok());
  std::memmove(expected.data(), expected.data() + 7, 300 * sizeof(float));
  EXPECT_EQ(download(*gpu_, buffer, values.size()), expected);
  EXPECT_TRUE(gpu_->synchronize().is_ok());
}

TEST_F(CudaBackendTest, TheScratchPlanCoversSamplingTheLogitsRows) {
  // What scratch_bytes_bound plans for a shape's rows of logits is what sample() takes.
  ForwardShape shape;
  shape.attention = {1, 0, 32, 8, 128, 16, 8192 / 16, 0.088f, 0, DType::kBF16};  // no tokens
  shape.logits = {64 * 9, 128256};
  size_t sample_bytes = 0;
  ASSERT_TRUE(sample_workspace_bytes({64 * 9, 128256, 128256}, &sample_bytes).is_ok());
  EXPECT_GE(gpu_->scratch_bytes_bound({shape}), sample_bytes + kCublasWorkspaceBytes);
}

TEST_F(CudaBackendTest, AStreamRunsBesideItsBackendAndAnEventOrdersThem) {
  // The draft's stream: another stream of the device, sharing its memory. A long chain of adds on
  // the producer, an event, and the consumer's copy of the result after waiting for it: the copy
  // sees the whole chain, however the device interleaves the two streams.
  const std::unique_ptr<Backend> consumer = gpu_->create_stream();
  ASSERT_NE(consumer, nullptr);
  EXPECT_TRUE(consumer->runs_models_concurrently());
  EXPECT_EQ(consumer->name(), "cuda:0");
  constexpr int64_t kCount = 1 << 20;
  constexpr int kAdds = 64;
  DeviceBuffer sum(*gpu_, kCount * sizeof(float), "sum");
  DeviceBuffer one(*gpu_, kCount * sizeof(float), "one");
  DeviceBuffer copy(*gpu_, kCount * sizeof(float), "copy");
  ASSERT_TRUE(gpu_->fill_uniform({kCount, DType::kF32, 1, 0.0f, 0.0f}, sum.data()).is_ok());
  ASSERT_TRUE(gpu_->fill_uniform({kCount, DType::kF32, 1, 1.0f, 1.0f}, one.data()).is_ok());
  ASSERT_TRUE(gpu_->synchronize().is_ok());
  const std::unique_ptr<Event> done = gpu_->create_event();
  ASSERT_NE(done, nullptr);
  for (int i = 0; i < kAdds; ++i) {
    ASSERT_TRUE(gpu_->add(kCount, one.as<float>(), sum.as<float>()).is_ok());
  }
  ASSERT_TRUE(gpu_->record(*done).is_ok());
  ASSERT_TRUE(consumer->wait(*done).is_ok());
  ASSERT_TRUE(consumer->copy_on_device(copy.data(), sum.data(), kCount * sizeof(float)).is_ok());
  std::vector<float> host(kCount);
  ASSERT_TRUE(consumer->copy_to_host(host.data(), copy.data(), kCount * sizeof(float)).is_ok());
  EXPECT_EQ(std::count(host.begin(), host.end(), static_cast<float>(kAdds)), kCount);
  // Events belong to their backend's device.
  const std::unique_ptr<Event> foreign = cpu_->create_event();
  EXPECT_EQ(gpu_->record(*foreign).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->wait(*foreign).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(gpu_->synchronize().is_ok());
}

TEST_F(CudaBackendTest, TimesWorkByTheDeviceClockAndPassesItsErrorOn) {
  DeviceBuffer source(*gpu_, size_t{64} << 20, "test");
  DeviceBuffer destination(*gpu_, size_t{64} << 20, "test");
  double ms = -1;
  const Status timed = gpu_->time_ms(
      [&] { return gpu_->copy_on_device(destination.data(), source.data(), size_t{64} << 20); },
      &ms);
  ASSERT_TRUE(timed.is_ok()) << timed.to_string();
  EXPECT_GT(ms, 0.0);  // 128 MiB of traffic takes some microseconds on any device
  EXPECT_TRUE(std::isfinite(ms));
  const Status failed = gpu_->time_ms([] { return Status::invalid_argument("planted"); }, &ms);
  EXPECT_EQ(failed.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(gpu_->synchronize().is_ok());
}

TEST_F(CudaBackendTest, LargeUploadsThroughTheStagingBuffersArriveWhole) {
  // 100 MiB and a ragged tail: several staging chunks, both buffers reused; the source is
  // overwritten as soon as each upload returns, which must not reach the device.
  const size_t count = (size_t{100} << 20) / sizeof(uint32_t) + 12345;
  std::vector<uint32_t> source(count);
  for (size_t i = 0; i < count; ++i) source[i] = static_cast<uint32_t>(i * 2654435761u);
  const std::vector<uint32_t> expected = source;
  DeviceBuffer first(*gpu_, count * sizeof(uint32_t), "test");
  DeviceBuffer second(*gpu_, count * sizeof(uint32_t), "test");
  ASSERT_TRUE(gpu_->copy_to_device(first.data(), source.data(), count * sizeof(uint32_t)).is_ok());
  std::fill(source.begin(), source.end(), 0u);
  ASSERT_TRUE(gpu_->copy_to_device(second.data(), source.data(), count * sizeof(uint32_t)).is_ok());
  std::vector<uint32_t> back(count);
  ASSERT_TRUE(gpu_->copy_to_host(back.data(), first.data(), count * sizeof(uint32_t)).is_ok());
  EXPECT_TRUE(back == expected);
  ASSERT_TRUE(gpu_->copy_to_host(back.data(), second.data(), count * sizeof(uint32_t)).is_ok());
  EXPECT_TRUE(std::all_of(back.begin(), back.end(), [](uint32_t v) { return v == 0; }));
}

TEST_F(CudaBackendTest, CreateRejectsADeviceThatDoesNotExist) {
  std::unique_ptr<CudaBackend> backend;
  EXPECT_EQ(CudaBackend::create(-1, &backend).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaBackend::create(1 << 20, &backend).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(backend == nullptr);
}

// ---- RMSNorm
// -------------------------------------------------------------------------------------

// The residual add fused with the norm after it: the sums and the normalised rows bitwise those of
// add() then rmsnorm(), on the 16-byte path, the scalar one (dim 67), and with an addend that is
// not 16-byte aligned while the rest is (the two kernels run then).
TEST_F(CudaBackendTest, FusedAddRmsNormEqualsTheTwoOpsBitwise) {
  const float eps = 1e-5f;
  for (const int64_t rows : {1, 5, 17}) {
    for (const int64_t dim : {67, 128, 4096}) {
      const std::vector<float> x = random_floats(rows * dim, 5 + rows + dim, 3.0f);
      const std::vector<float> addend = random_floats(rows * dim + 1, 6 + rows + dim, 2.0f);
      for (const DType dtype : kAllDtypes) {
        for (const size_t offset : {size_t{0}, size_t{1}}) {
          const StoredTensor weight = store(random_floats(dim, 7 + dim), dtype);
          const RmsNormParams params{rows, dim, eps, dtype};
          DeviceBuffer device_weight = upload_bytes(*gpu_, weight.data(dtype), weight.bytes(dtype));
          DeviceBuffer device_addend = upload(*gpu_, addend);
          const float* addend_d = device_addend.as<float>() + offset;
          DeviceBuffer x1 = upload(*gpu_, x), out1 = poisoned(*gpu_, x.size());
          ASSERT_TRUE(gpu_->add(rows * dim, addend_d, x1.as<float>()).is_ok());
          ASSERT_TRUE(gpu_->rmsnorm(params, x1.as<float>(), device_weight.data(), out1.as<float>())
                          .is_ok());
          DeviceBuffer x2 = upload(*gpu_, x), out2 = poisoned(*gpu_, x.size());
          ASSERT_TRUE(gpu_->add_rmsnorm(params, addend_d, x2.as<float>(), device_weight.data(),
                                        out2.as<float>())
                          .is_ok());
          const std::string what = std::to_string(rows) + "x" + std::to_string(dim) + " " +
                                   std::string(dtype_name(dtype)) + " offset " +
                                   std::to_string(offset);
          EXPECT_TRUE(bitwise_equal(download(*gpu_, x1, x.size()), download(*gpu_, x2, x.size())))
              << "sums, " << what;
          EXPECT_TRUE(
              bitwise_equal(download(*gpu_, out1, x.size()), download(*gpu_, out2, x.size())))
              << "norms, " << what;
        }
      }
    }
  }
}

// ---- Matmul
// --------------------------------------------------------------------------------------

// A quantized weight: codes and their scale grid.
struct QuantizedWeight {
  std::vector<uint8_t> codes;  // [out, in]
  std::vector<float> scales;   // [grid rows, grid columns]
};

QuantizedWeight quantized_weight(DType dtype, int64_t out_features, int64_t in, int64_t block_rows,
                                 int64_t block_cols, uint64_t seed) {
  QuantizedWeight w;
  const std::vector<float> values = random_floats(static_cast<size_t>(out_features * in), seed);
  const float code_max = dtype == DType::kI8 ? 127.0f : kF8E4M3Max;
  w.codes.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    w.codes[i] =
        dtype == DType::kI8
            ? static_cast<uint8_t>(static_cast<int8_t>(std::nearbyint(values[i] * code_max)))
            : f32_to_f8e4m3(values[i] * code_max);
  }
  const int64_t grid_rows = (out_features + block_rows - 1) / block_rows;
  const int64_t grid_cols = (in + block_cols - 1) / block_cols;
  const std::vector<float> draws =
      random_floats(static_cast<size_t>(grid_rows * grid_cols), seed + 1);
  for (const float draw : draws) w.scales.push_back(0.01f + 0.005f * draw);  // in (0.005, 0.015)
  return w;
}

TEST_F(CudaBackendTest, AMatmulGroupIsEachTargetsMatmulBitwise) {
  // q, k and v shapes (one launch when they share dtype, scale layout and loads), in every dtype,
  // a block-scaled FP8 group, and a mixed group (one launch each), at decode, verification and
  // prefill row counts, and in batch-invariant mode: each out as its target's matmul alone.
  const int64_t in = 256;
  const int64_t widths[] = {256, 64, 64};
  struct Case {
    DType dtypes[3];
    int64_t block_cols;  // quantized: scale columns per block (in: one per row)
  };
  const Case cases[] = {{{DType::kBF16, DType::kBF16, DType::kBF16}, 0},
                        {{DType::kF32, DType::kF32, DType::kF32}, 0},
                        {{DType::kF8E4M3, DType::kF8E4M3, DType::kF8E4M3}, in},
                        {{DType::kI8, DType::kI8, DType::kI8}, in},
                        {{DType::kF8E4M3, DType::kF8E4M3, DType::kF8E4M3}, 128},
                        {{DType::kBF16, DType::kF8E4M3, DType::kI8}, in}};
  for (const Case& c : cases) {
    std::vector<DeviceBuffer> weights, scales, biases;
    for (int t = 0; t < 3; ++t) {
      const int64_t out_features = widths[t];
      if (is_quantized(c.dtypes[t])) {
        const QuantizedWeight w =
            quantized_weight(c.dtypes[t], out_features, in, 1, c.block_cols, 70 + t);
        weights.push_back(upload(*gpu_, w.codes));
        scales.push_back(upload(*gpu_, w.scales));
      } else {
        const StoredTensor w = store(random_floats(out_features * in, 70 + t), c.dtypes[t]);
        weights.push_back(upload_bytes(*gpu_, w.data(c.dtypes[t]), w.bytes(c.dtypes[t])));
        scales.emplace_back();
      }
      biases.push_back(upload(*gpu_, random_floats(out_features, 80 + t)));
    }
    for (const bool batch_invariant : {false, true}) {
      gpu_->set_batch_invariant(batch_invariant);
      for (const int64_t rows : {1, 5, 16, 40}) {
        DeviceBuffer x = upload(*gpu_, random_floats(rows * in, 90 + rows));
        std::vector<DeviceBuffer> group_out, alone_out;
        MatmulTarget targets[3];
        for (int t = 0; t < 3; ++t) {
          group_out.push_back(poisoned(*gpu_, rows * widths[t]));
          alone_out.push_back(poisoned(*gpu_, rows * widths[t]));
          MatmulParams params{rows, in, widths[t], c.dtypes[t], DType::kF32};
          if (is_quantized(c.dtypes[t])) {
            params.scale_block_rows = 1;
            params.scale_block_cols = c.block_cols;
          }
          targets[t] = {params, weights[t].data(),
                        is_quantized(c.dtypes[t]) ? scales[t].as<float>() : nullptr,
                        t == 1 ? biases[t].data() : nullptr, group_out[t].as<float>()};
        }
        ASSERT_TRUE(gpu_->matmul_group(x.as<float>(), targets, 3).is_ok());
        for (int t = 0; t < 3; ++t) {
          ASSERT_TRUE(gpu_->matmul(targets[t].params, x.as<float>(), targets[t].weight,
                                   targets[t].weight_scales, targets[t].bias,
                                   alone_out[t].as<float>())
                          .is_ok());
          const size_t n = static_cast<size_t>(rows * widths[t]);
          EXPECT_TRUE(
              bitwise_equal(download(*gpu_, group_out[t], n), download(*gpu_, alone_out[t], n)))
              << dtype_name(c.dtypes[t]) << " target " << t << " rows " << rows
              << (batch_invariant ? " batch invariant" : "") << " blocks " << c.block_cols;
        }
      }
    }
    gpu_->set_batch_invariant(false);
  }
  // The group's rules are the CPU backend's.
  DeviceBuffer x = upload(*gpu_, random_floats(2 * in, 1));
  DeviceBuffer out = poisoned(*gpu_, 2 * 64);
  MatmulTarget bad[2] = {
      {{2, in, 64, DType::kBF16, DType::kF32}, nullptr, nullptr, nullptr, out.as<float>()},
      {{1, in, 64, DType::kBF16, DType::kF32}, nullptr, nullptr, nullptr, out.as<float>()}};
  EXPECT_EQ(gpu_->matmul_group(x.as<float>(), bad, 2).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->matmul_group(x.as<float>(), bad, 0).code(), StatusCode::kInvalidArgument);
}

TEST_F(CudaBackendTest, TheSkinnyKernelsElementWisePathIsNotedOnce) {
  std::vector<std::string> notices;
  gpu_->set_notice_handler([&](std::string_view message) { notices.emplace_back(message); });
  const auto run = [&](int64_t in) {
    const MatmulParams params{1, in, 8, DType::kBF16, DType::kBF16};
    DeviceBuffer x = upload(*gpu_, random_floats(in, 3));
    DeviceBuffer weight(*gpu_, static_cast<size_t>(8 * in) * 2, "test");
    DeviceBuffer out(*gpu_, 8 * sizeof(float), "test");
    ASSERT_TRUE(
        gpu_->matmul(params, x.as<float>(), weight.data(), nullptr, nullptr, out.as<float>())
            .is_ok());
  };
  run(1024);  // 16-byte loads: nothing to note
  EXPECT_TRUE(notices.empty());
  run(37);
  run(37);
  run(45);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("in_features 37 is not a multiple of 8"), std::string::npos)
      << notices[0];
}

TEST_F(CudaBackendTest, SkinnyMatmulIsBatchInvariantBitwise) {
  // Row r alone, in a batch of 16, and in every other batch size up to 16 (and, in batch-invariant
  // mode, in a batch of 40): the same bits.
  for (const int64_t in : {37, 1024}) {
    for (const DType dtype : kAllDtypes) {
      const int64_t rows = 16, out_features = 75;
      const std::vector<float> x = random_floats(40 * in, 8 + in);
      const StoredTensor weight = store(random_floats(out_features * in, 9), dtype);
      const StoredTensor bias = store(random_floats(out_features, 10), dtype);
      DeviceBuffer device_weight = upload_bytes(*gpu_, weight.data(dtype), weight.bytes(dtype));
      DeviceBuffer device_bias = upload_bytes(*gpu_, bias.data(dtype), bias.bytes(dtype));
      auto run = [&](int64_t first, int64_t count) {
        // A fresh, separately allocated x for the slice: alignment as in a real call.
        const std::vector<float> slice(x.begin() + first * in, x.begin() + (first + count) * in);
        DeviceBuffer device_x = upload(*gpu_, slice);
        DeviceBuffer out = poisoned(*gpu_, count * out_features);
        const Status status =
            gpu_->matmul({count, in, out_features, dtype, dtype}, device_x.as<float>(),
                         device_weight.data(), nullptr, device_bias.data(), out.as<float>());
        EXPECT_TRUE(status.is_ok()) << status.to_string();
        return download(*gpu_, out, count * out_features);
      };
      const std::vector<float> all = run(0, rows);
      for (int64_t batch = 1; batch <= rows; ++batch) {
        for (int64_t first = 0; first + batch <= rows; first += batch) {
          const std::vector<float> part = run(first, batch);
          ASSERT_TRUE(bitwise_equal(part, std::span<const float>(all).subspan(
                                              first * out_features, batch * out_features)))
              << "rows " << first << ".." << first + batch << " in " << in << " "
              << dtype_name(dtype);
        }
      }
      gpu_->set_batch_invariant(true);
      const std::vector<float> forty = run(0, 40);
      gpu_->set_batch_invariant(false);
      ASSERT_TRUE(bitwise_equal(std::span<const float>(forty).subspan(0, rows * out_features), all))
          << "batch-invariant mode, in " << in << " " << dtype_name(dtype);
      for (int64_t r = 16; r < 40; r += 7) {
        ASSERT_TRUE(bitwise_equal(
            run(r, 1), std::span<const float>(forty).subspan(r * out_features, out_features)))
            << "batch-invariant mode row " << r;
      }
    }
  }
}

// An 8-bit weight through the skinny kernel, in each scale layout and load path: each row alone
// gives the bits it gets among 16.
TEST_F(CudaBackendTest, QuantizedSkinnyMatmulIsBatchInvariantBitwise) {
  const int64_t sizes[][2] = {{37, 21}, {128, 96}, {1024, 300}};
  for (const DType dtype : {DType::kF8E4M3, DType::kI8}) {
    for (const auto& size : sizes) {
      const int64_t in = size[0], out_features = size[1];
      const int64_t layouts[][2] = {{1, in}, {out_features, in}, {128, 128}, {32, 16}};
      for (const auto& layout : layouts) {
        const QuantizedWeight w =
            quantized_weight(dtype, out_features, in, layout[0], layout[1], 60 + in + layout[1]);
        DeviceBuffer device_codes = upload(*gpu_, w.codes);
        DeviceBuffer device_scales = upload(*gpu_, w.scales);
        const std::vector<float> x = random_floats(16 * in, 63);
        auto run = [&](int64_t first, int64_t count) {
          const std::vector<float> slice(x.begin() + first * in, x.begin() + (first + count) * in);
          DeviceBuffer device_x = upload(*gpu_, slice);
          DeviceBuffer out = poisoned(*gpu_, count * out_features);
          MatmulParams params{count, in, out_features, dtype, DType::kF32};
          params.scale_block_rows = layout[0];
          params.scale_block_cols = layout[1];
          EXPECT_TRUE(gpu_->matmul(params, device_x.as<float>(), device_codes.data(),
                                   device_scales.as<float>(), nullptr, out.as<float>())
                          .is_ok());
          return download(*gpu_, out, count * out_features);
        };
        const std::vector<float> all = run(0, 16);
        for (const int64_t r : {0, 5, 15}) {
          EXPECT_TRUE(bitwise_equal(
              run(r, 1), std::span<const float>(all).subspan(r * out_features, out_features)))
              << dtype_name(dtype) << " row " << r << " in " << in << " blocks " << layout[0] << "x"
              << layout[1];
        }
      }
    }
  }
}

// ---- RoPE and the KV-cache write
// -----------------------------------------------------------------

// A cache of `elements` values of `dtype` holding arbitrary earlier contents, as raw bytes.
std::vector<uint8_t> cache_bytes(int64_t elements, DType dtype, uint64_t seed) {
  return store(random_floats(static_cast<size_t>(elements), seed), dtype).raw(dtype);
}

TEST_F(CudaBackendTest, FusedRopeAndKvWriteEqualsTheTwoOpsBitwise) {
  const int64_t tokens = 7, heads = 8, kv_heads = 2, head_dim = 128, slots_in_cache = 64;
  std::vector<float> inv_freq(head_dim / 2);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    inv_freq[i] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * i / head_dim));
  }
  const std::vector<int32_t> positions = {3, 4, 5, 6, 7, 100, 4000};
  const std::vector<int32_t> slots = {63, 1, 2, 30, 31, 32, 0};
  const std::vector<float> q = random_floats(tokens * heads * head_dim, 17);
  const std::vector<float> k = random_floats(tokens * kv_heads * head_dim, 18);
  const std::vector<float> v = random_floats(tokens * kv_heads * head_dim, 19);
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    const std::vector<uint8_t> cache = cache_bytes(slots_in_cache * kv_heads * head_dim, dtype, 20);
    for (const RopeStyle style : {RopeStyle::kRotateHalf, RopeStyle::kInterleaved}) {
      const RopeParams params{tokens, heads, kv_heads, head_dim, style};
      DeviceBuffer positions_d = upload(*gpu_, positions), inv_freq_d = upload(*gpu_, inv_freq);
      DeviceBuffer slots_d = upload(*gpu_, slots), v_d = upload(*gpu_, v);
      DeviceBuffer q1 = upload(*gpu_, q), k1 = upload(*gpu_, k);
      DeviceBuffer kc1 = upload(*gpu_, cache), vc1 = upload(*gpu_, cache);
      ASSERT_TRUE(gpu_->rope(params, positions_d.as<int32_t>(), inv_freq_d.as<float>(),
                             q1.as<float>(), k1.as<float>())
                      .is_ok());
      ASSERT_TRUE(gpu_->kv_write({tokens, kv_heads, head_dim, slots_in_cache, dtype},
                                 k1.as<float>(), v_d.as<float>(), slots_d.as<int32_t>(), kc1.data(),
                                 vc1.data())
                      .is_ok());
      DeviceBuffer q2 = upload(*gpu_, q), k2 = upload(*gpu_, k);
      DeviceBuffer kc2 = upload(*gpu_, cache), vc2 = upload(*gpu_, cache);
      ASSERT_TRUE(gpu_->rope_kv_write(params, {tokens, kv_heads, head_dim, slots_in_cache, dtype},
                                      positions_d.as<int32_t>(), inv_freq_d.as<float>(),
                                      slots_d.as<int32_t>(), q2.as<float>(), k2.as<float>(),
                                      v_d.as<float>(), kc2.data(), vc2.data())
                      .is_ok());
      EXPECT_TRUE(bitwise_equal(download(*gpu_, q1, q.size()), download(*gpu_, q2, q.size())));
      EXPECT_TRUE(bitwise_equal(download(*gpu_, k1, k.size()), download(*gpu_, k2, k.size())));
      EXPECT_EQ(download<uint8_t>(*gpu_, kc1, cache.size()),
                download<uint8_t>(*gpu_, kc2, cache.size()))
          << dtype_name(dtype);
      EXPECT_EQ(download<uint8_t>(*gpu_, vc1, cache.size()),
                download<uint8_t>(*gpu_, vc2, cache.size()))
          << dtype_name(dtype);
    }
  }
}

// ---- Attention
// -----------------------------------------------------------------------------------

struct AttentionCase {
  int64_t heads;
  int64_t kv_heads;
  int64_t head_dim;
  int64_t block_size;
  std::vector<int64_t> new_tokens;  // per sequence
  std::vector<int64_t> context;     // per sequence, including the new tokens
  int64_t window = 0;
  DType cache_dtype = DType::kF32;
};

// A paged cache with scattered blocks (and unused ones), as the CPU suite builds it; the caches
// are raw bytes of params.cache_dtype.
struct PagedInputs {
  AttentionParams params{};
  std::vector<float> q;
  std::vector<uint8_t> k_cache, v_cache;
  std::vector<int32_t> query_start, lengths, tables;
  int64_t max_context = 0;
};

PagedInputs make_paged_inputs(const AttentionCase& c, uint64_t seed) {
  PagedInputs in;
  const int64_t seqs = static_cast<int64_t>(c.context.size());
  int64_t max_blocks = 0, total_blocks = 3;  // 3 blocks nobody owns
  for (const int64_t length : c.context) {
    max_blocks = std::max(max_blocks, (length + c.block_size - 1) / c.block_size);
    total_blocks += (length + c.block_size - 1) / c.block_size;
    in.max_context = std::max(in.max_context, length);
  }
  std::vector<int32_t> free_blocks(total_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  Rng rng(seed);
  for (size_t i = free_blocks.size() - 1; i > 0; --i) {
    std::swap(free_blocks[i], free_blocks[rng.next() % (i + 1)]);
  }
  const int64_t row = c.kv_heads * c.head_dim;
  in.k_cache = cache_bytes(total_blocks * c.block_size * row, c.cache_dtype, seed + 1);
  in.v_cache = cache_bytes(total_blocks * c.block_size * row, c.cache_dtype, seed + 2);
  in.tables.assign(std::max<int64_t>(seqs * max_blocks, 1), 0);
  in.query_start = {0};
  size_t next_free = 0;
  for (int64_t s = 0; s < seqs; ++s) {
    for (int64_t b = 0; b < (c.context[s] + c.block_size - 1) / c.block_size; ++b) {
      in.tables[s * max_blocks + b] = free_blocks[next_free++];
    }
    in.query_start.push_back(in.query_start.back() + static_cast<int32_t>(c.new_tokens[s]));
    in.lengths.push_back(static_cast<int32_t>(c.context[s]));
  }
  const int64_t tokens = in.query_start.back();
  in.q = random_floats(tokens * c.heads * c.head_dim, seed + 3);
  in.params = {
      seqs,       tokens,       c.heads,    c.kv_heads,
      c.head_dim, c.block_size, max_blocks, 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
      c.window,   c.cache_dtype};
  return in;
}

std::vector<float> gpu_attention(CudaBackend& gpu, const PagedInputs& in) {
  DeviceBuffer q = upload(gpu, in.q), k = upload(gpu, in.k_cache), v = upload(gpu, in.v_cache);
  DeviceBuffer query_start = upload(gpu, in.query_start), lengths = upload(gpu, in.lengths);
  DeviceBuffer tables = upload(gpu, in.tables);
  const size_t count =
      static_cast<size_t>(in.params.num_tokens * in.params.num_heads * in.params.head_dim);
  DeviceBuffer out = poisoned(gpu, count);
  const Status status =
      gpu.attention(in.params, q.as<float>(), k.data(), v.data(), query_start.as<int32_t>(),
                    lengths.as<int32_t>(), tables.as<int32_t>(), nullptr, out.as<float>());
  EXPECT_TRUE(status.is_ok()) << status.to_string();
  const Status synced = gpu.synchronize();
  EXPECT_TRUE(synced.is_ok()) << synced.to_string();
  return download(gpu, out, count);
}

std::vector<float> cpu_attention(cpu::CpuBackend& cpu, const PagedInputs& in) {
  std::vector<float> out(
      static_cast<size_t>(in.params.num_tokens * in.params.num_heads * in.params.head_dim));
  const Status status = cpu.attention(in.params, in.q.data(), in.k_cache.data(), in.v_cache.data(),
                                      in.query_start.data(), in.lengths.data(), in.tables.data(),
                                      nullptr, out.data());
  EXPECT_TRUE(status.is_ok()) << status.to_string();
  return out;
}

TEST_F(CudaBackendTest, AttentionIsBatchInvariantBitwise) {
  // Sequence A (context 1100, verification-shaped: 5 new tokens) alone runs the per-split
  // schedule; among 140 short sequences the grid is large and each block merges its splits in
  // registers. Both, and A's rows fed one at a time (decode), give the same bits; with either
  // cache dtype.
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)) + " cache");
    const int64_t heads = 8, kv_heads = 2, head_dim = 128, block_size = 16, fillers = 140;
    AttentionCase all{heads, kv_heads, head_dim, block_size, {5}, {1100}, 0, dtype};
    for (int64_t i = 0; i < fillers; ++i) {
      all.new_tokens.push_back(1);
      all.context.push_back(30 + i % 17);
    }
    const PagedInputs batch = make_paged_inputs(all, 7);
    const size_t a_values = static_cast<size_t>(5 * heads * head_dim);
    const std::vector<float> in_batch = gpu_attention(*gpu_, batch);

    auto only_a = [&](int64_t new_tokens, int64_t context, int64_t first_row) {
      PagedInputs a = batch;
      a.params.num_seqs = 1;
      a.params.num_tokens = new_tokens;
      a.query_start = {0, static_cast<int32_t>(new_tokens)};
      a.lengths = {static_cast<int32_t>(context)};
      a.tables.resize(static_cast<size_t>(batch.params.max_blocks_per_seq));  // A's row
      a.q.assign(batch.q.begin() + first_row * heads * head_dim,
                 batch.q.begin() + (first_row + new_tokens) * heads * head_dim);
      return gpu_attention(*gpu_, a);
    };
    const std::vector<float> alone = only_a(5, 1100, 0);
    EXPECT_TRUE(bitwise_equal(alone, std::span<const float>(in_batch).subspan(0, a_values)));
    for (int64_t i = 0; i < 5; ++i) {
      const std::vector<float> decode = only_a(1, 1096 + i, i);
      EXPECT_TRUE(bitwise_equal(
          decode, std::span<const float>(alone).subspan(i * heads * head_dim, heads * head_dim)))
          << "row " << i;
    }
    // And the batch against the CPU.
    const double atol = 8.0 * static_cast<double>(head_dim + 1100 + 16) * kUnitRoundoff;
    EXPECT_TRUE(all_close(in_batch, cpu_attention(*cpu_, batch), atol, 0.0));
  }
}

// ---- The whole model
// ------------------------------------------------------------------------------

class CudaModelTest : public CudaBackendTest, public ::testing::WithParamInterface<DType> {};

TEST_P(CudaModelTest, LogitsMatchTheCpuModelForPrefillAndDecode) {
  const DType dtype = GetParam();
  testing::TempDir dir;
  fixtures::GeneratorOptions options;
  options.vocab_size = 300;
  options.hidden_size = 256;
  options.intermediate_size = 384;
  options.num_layers = 2;
  options.num_heads = 4;  // head_dim 64
  options.num_kv_heads = 2;
  options.dtype = dtype;
  options.seed = 5;
  fixtures::write_random_checkpoint(options, dir.path());
  // The device holds every checkpoint as bf16 (converted at load); the CPU computes with the
  // stored dtype. The CPU reference is therefore the bf16 checkpoint of the same draws: for f32
  // exactly the weights the device holds; for f16 they may differ in a last bf16 bit (f16 rounds
  // first), which the looser tolerance covers.
  testing::TempDir reference_dir;
  options.dtype = DType::kBF16;
  fixtures::write_random_checkpoint(options, reference_dir.path());
  ModelOptions model_options;
  model_options.kv_cache_tokens = 256;
  model_options.kv_block_size = 16;

  for (const bool batch_invariant : {false, true}) {
    gpu_->set_batch_invariant(batch_invariant);
    auto cpu_model = Model::load(reference_dir.path(), *cpu_, model_options);
    auto gpu_model = Model::load(dir.path(), *gpu_, model_options);
    const SequenceId cpu_sequence = cpu_model->kv_cache().add_sequence();
    const SequenceId gpu_sequence = gpu_model->kv_cache().add_sequence();

    // A 20-token prefill (above 16 rows: the GEMM path unless batch invariant), then decode steps
    // on the CPU's greedy tokens.
    std::vector<int32_t> tokens;
    for (int i = 0; i < 20; ++i) tokens.push_back((7 + 37 * i) % 300);
    for (int step = 0; step < 4; ++step) {
      Logits cpu_logits, gpu_logits;
      const SequenceInput cpu_input[] = {{cpu_sequence, tokens, true}};
      const SequenceInput gpu_input[] = {{gpu_sequence, tokens, true}};
      cpu_model->forward(cpu_input, &cpu_logits);
      gpu_model->forward(gpu_input, &gpu_logits);
      ASSERT_EQ(gpu_logits.values.size(), cpu_logits.values.size());
      float scale = 0.0f;
      for (const float value : cpu_logits.values) scale = std::max(scale, std::abs(value));
      // The decode steps read keys and values the rounded prefill wrote: the same tolerance.
      const bool rounded_prefill = !batch_invariant || dtype == DType::kF16;
      const double atol = (rounded_prefill ? 3e-2 : 1e-3) * scale;
      EXPECT_TRUE(all_close(gpu_logits.values, cpu_logits.values, atol, 0.0))
          << dtype_name(dtype) << " step " << step << (batch_invariant ? " batch invariant" : "");
      for (int64_t r = 0; r < cpu_logits.rows(); ++r) {
        const std::span<const float> cpu_row = cpu_logits.row(r);
        const std::span<const float> gpu_row = gpu_logits.row(r);
        std::vector<float> sorted(cpu_row.begin(), cpu_row.end());
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
        if (sorted[0] - sorted[1] <= 2.0 * atol) continue;
        EXPECT_EQ(std::max_element(gpu_row.begin(), gpu_row.end()) - gpu_row.begin(),
                  std::max_element(cpu_row.begin(), cpu_row.end()) - cpu_row.begin())
            << "row " << r << " step " << step;
      }
      const std::span<const float> last = cpu_logits.last(0);
      tokens = {static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin())};
    }
  }
  gpu_->set_batch_invariant(false);
}

TEST_F(CudaBackendTest, SyntheticModelsMatchOnBothBackends) {
  // The same seed writes the same bf16 weights on both backends (the fill is bitwise shared), so
  // a synthetic model's logits differ only by the kernels' rounding.
  const ModelConfig config = synthetic_config("tiny");
  ModelOptions options;
  options.kv_cache_tokens = 64;
  const auto on_cpu = Model::synthetic(config, "synthetic tiny", 3, *cpu_, options);
  const auto on_gpu = Model::synthetic(config, "synthetic tiny", 3, *gpu_, options);
  EXPECT_EQ(on_gpu->weight_bytes(), on_cpu->weight_bytes());
  const std::vector<int32_t> tokens = {1, 17, 4000, 5, 5, 260, 99};
  Logits cpu_logits, gpu_logits;
  const SequenceInput cpu_input[] = {{on_cpu->kv_cache().add_sequence(), tokens, true}};
  const SequenceInput gpu_input[] = {{on_gpu->kv_cache().add_sequence(), tokens, true}};
  on_cpu->forward(cpu_input, &cpu_logits);
  on_gpu->forward(gpu_input, &gpu_logits);
  float scale = 0.0f;
  for (const float value : cpu_logits.values) scale = std::max(scale, std::abs(value));
  EXPECT_TRUE(all_close(gpu_logits.values, cpu_logits.values, 1e-3 * scale, 0.0));
}

// Logits of `tokens` prefilled (above 16 rows: the GEMM path), then three greedy decode steps.
std::vector<std::vector<float>> prefill_and_decode(Model& model, std::vector<int32_t> tokens) {
  const SequenceId sequence = model.kv_cache().add_sequence();
  std::vector<std::vector<float>> steps;
  for (int step = 0; step < 4; ++step) {
    Logits logits;
    const SequenceInput input[] = {{sequence, tokens, true}};
    model.forward(input, &logits);
    steps.push_back(logits.values);
    const std::span<const float> last = logits.last(0);
    tokens = {static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin())};
  }
  model.kv_cache().remove_sequence(sequence);
  return steps;
}

// The GPU's steps against the CPU's: within `relative` of the largest CPU logit, and the same
// argmax wherever the CPU's top two are further apart than twice that.
void expect_close_steps(const std::vector<std::vector<float>>& gpu,
                        const std::vector<std::vector<float>>& cpu, int64_t vocab, double relative,
                        const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t step = 0; step < cpu.size(); ++step) {
    ASSERT_EQ(gpu[step].size(), cpu[step].size());
    float scale = 0.0f;
    for (const float value : cpu[step]) scale = std::max(scale, std::abs(value));
    const double atol = relative * scale;
    EXPECT_TRUE(all_close(gpu[step], cpu[step], atol, 0.0)) << what << " step " << step;
    for (size_t r = 0; r < cpu[step].size() / vocab; ++r) {
      const std::span<const float> cpu_row(cpu[step].data() + r * vocab, vocab);
      const std::span<const float> gpu_row(gpu[step].data() + r * vocab, vocab);
      std::vector<float> sorted(cpu_row.begin(), cpu_row.end());
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
      if (sorted[0] - sorted[1] <= 2.0 * atol) continue;
      EXPECT_EQ(std::max_element(gpu_row.begin(), gpu_row.end()) - gpu_row.begin(),
                std::max_element(cpu_row.begin(), cpu_row.end()) - cpu_row.begin())
          << what << " row " << r << " step " << step;
    }
  }
}

std::vector<int32_t> twenty_tokens() {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 20; ++i) tokens.push_back((7 + 37 * i) % 300);
  return tokens;
}

fixtures::GeneratorOptions small_model(DType dtype) {
  fixtures::GeneratorOptions options;
  options.vocab_size = 300;
  options.hidden_size = 256;
  options.intermediate_size = 384;
  options.num_layers = 2;
  options.num_heads = 4;
  options.num_kv_heads = 2;
  options.dtype = dtype;
  options.seed = 5;
  return options;
}

TEST_F(CudaBackendTest, ModelsQuantizedAtLoadMatchTheCpu) {
  // Both backends quantize the same bf16 checkpoint on the host (the same codes and scales); the
  // logits differ by the kernels' rounding, and in prefill by the GEMM's bf16 tiles.
  testing::TempDir dir;
  fixtures::write_random_checkpoint(small_model(DType::kBF16), dir.path());
  for (const WeightQuantize quantize : {WeightQuantize::kFP8, WeightQuantize::kINT8}) {
    for (const bool head : {false, true}) {
      ModelOptions options;
      options.kv_cache_tokens = 256;
      options.quantize = quantize;
      options.quantize_output = head;
      const auto on_cpu = Model::load(dir.path(), *cpu_, options);
      const auto on_gpu = Model::load(dir.path(), *gpu_, options);
      EXPECT_EQ(on_gpu->weight_bytes(), on_cpu->weight_bytes());
      const std::string what = std::string(quantize == WeightQuantize::kFP8 ? "fp8" : "int8") +
                               (head ? " with its head" : "");
      expect_close_steps(prefill_and_decode(*on_gpu, twenty_tokens()),
                         prefill_and_decode(*on_cpu, twenty_tokens()), 300, 3e-2, what);
    }
  }
}

TEST_F(CudaBackendTest, PreQuantizedFp8CheckpointsMatchTheCpu) {
  for (const testing::Fp8Layout& layout :
       {testing::Fp8Layout{"block_128", "fp8", 128, 128, false},
        testing::Fp8Layout{"channel", "compressed-tensors", 0, 0, false},
        testing::Fp8Layout{"tensor", "compressed-tensors", 0, 0, true}}) {
    testing::TempDir dir;
    fixtures::write_random_checkpoint(small_model(DType::kF32), dir / "fp8");
    fixtures::write_random_checkpoint(small_model(DType::kF32), dir / "twin");
    testing::write_fp8_checkpoint(dir / "fp8", dir / "twin", layout);
    ModelOptions options;
    options.kv_cache_tokens = 256;
    const auto on_cpu = Model::load(dir / "fp8", *cpu_, options);
    const auto on_gpu = Model::load(dir / "fp8", *gpu_, options);
    // The device holds the other tensors (f32 here) as bf16: within the prefill tolerance.
    expect_close_steps(prefill_and_decode(*on_gpu, twenty_tokens()),
                       prefill_and_decode(*on_cpu, twenty_tokens()), 300, 3e-2, layout.label);
  }
}

TEST_F(CudaBackendTest, QuantizedSyntheticModelsMatchOnBothBackends) {
  const ModelConfig config = synthetic_config("tiny");
  for (const WeightQuantize quantize : {WeightQuantize::kFP8, WeightQuantize::kINT8}) {
    ModelOptions options;
    options.kv_cache_tokens = 64;
    options.quantize = quantize;
    const auto on_cpu = Model::synthetic(config, "synthetic tiny", 3, *cpu_, options);
    const auto on_gpu = Model::synthetic(config, "synthetic tiny", 3, *gpu_, options);
    EXPECT_EQ(on_gpu->weight_bytes(), on_cpu->weight_bytes());
    // Seven tokens: the skinny kernel throughout, f32 activations.
    std::vector<std::vector<float>> gpu_steps =
        prefill_and_decode(*on_gpu, {1, 17, 4000, 5, 5, 260, 99});
    std::vector<std::vector<float>> cpu_steps =
        prefill_and_decode(*on_cpu, {1, 17, 4000, 5, 5, 260, 99});
    expect_close_steps(gpu_steps, cpu_steps, config.vocab_size, 1e-3,
                       quantize == WeightQuantize::kFP8 ? "fp8" : "int8");
  }
}

INSTANTIATE_TEST_SUITE_P(WeightDtypes, CudaModelTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& tested) {
                           return std::string(dtype_name(tested.param));
                         });

}  // namespace
}  // namespace specrun::kernels::cuda
