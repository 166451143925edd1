// The CUDA backend's logits against Hugging Face transformers (float32 on the CPU), on the models
// and references of test_hf_conformance, in the default mode and in the deterministic
// (batch-invariant) one. Skips without a CUDA device or without the references. On a machine
// that reaches no package registry, make the references where transformers is installed
// (`.venv/bin/python tests/reference/hf_reference.py cases --out build/hf_reference`, or any
// ctest run of test_hf_conformance), take build/hf_reference along, and point
// SPECRUN_HF_REFERENCE_DIR at it (tools/gpu-check.sh does).
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device.h"
#include "tests/hf_conformance.h"

namespace specrun {
namespace {

// Bounds, as a fraction of the row's largest |logit|, from how weights and activations reach the
// device (runtime/model: every checkpoint is held as bf16 on the device; kernels/cuda: f32
// accumulation throughout, but the GEMM path for more than 16 rows rounds activations to bf16):
// - bf16 checkpoint, deterministic mode: every matmul is the skinny kernel on f32 activations
//   and the weights are the very values transformers widened to f32, so only f32 rounding in
//   other orders and the device's exp/rsqrt/sincos (a few ulp) separate the two: the CPU's 1e-4,
//   widened tenfold for the device's transcendental functions and its reductions of whole rows.
// - otherwise, one factor of every product carries a bf16 rounding (2^-9 relative): the prefill
//   GEMM's activations (default mode), or the weights of an f32 checkpoint converted at load.
//   Independent roundings of relative size 2^-9 over a dot product leave it off by about 2^-9
//   of the row's scale, compounding over 2-3 layers: 3e-2 of the largest logit, the bound
//   test_cuda_backend derives for the same rounding against the CPU backend.
constexpr double kExactWeightsTolerance = 1e-3;
constexpr double kRoundedTolerance = 3e-2;

bool have_device() {
  std::vector<kernels::cuda::DeviceInfo> devices;
  return kernels::cuda::list_devices(&devices).is_ok() && !devices.empty();
}

// (case, deterministic)
class CudaHfConformanceTest : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(CudaHfConformanceTest, LogitsAndGreedyContinuationMatchTransformers) {
  const auto& [name, deterministic] = GetParam();
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  testing::TempDir scratch;
  std::string skip_reason;
  const std::filesystem::path directory = testing::hf_reference_dir(name, scratch, &skip_reason);
  if (directory.empty()) GTEST_SKIP() << skip_reason;
  const testing::HfReference reference = testing::load_hf_reference(directory, name);
  ASSERT_FALSE(reference.prompts.empty());

  std::unique_ptr<kernels::cuda::CudaBackend> backend;
  const Status created = kernels::cuda::CudaBackend::create(0, &backend);
  ASSERT_TRUE(created.is_ok()) << created.to_string();
  backend->set_batch_invariant(deterministic);
  ModelOptions options;
  options.kv_cache_tokens = 1024;
  options.kv_cache_dtype = DType::kF32;  // the reference's exact keys and values
  auto model = Model::load(directory / name, *backend, options);

  const bool bf16 = name.ends_with("_bf16");
  const double tolerance = bf16 && deterministic ? kExactWeightsTolerance : kRoundedTolerance;
  const testing::HfComparison c = testing::compare_with_hf(*model, reference, tolerance);
  std::cout << "[ hf cuda ] " << testing::describe(name, c, tolerance)
            << (deterministic ? " deterministic" : "") << "\n";
  EXPECT_EQ(c.violations, 0) << c.violations << " logits beyond the bound; first at "
                             << c.first_violation;
  EXPECT_EQ(c.greedy_failures, 0) << "greedy choices differ where the reference has a clear "
                                     "margin; first at "
                                  << c.first_greedy_failure;
}

INSTANTIATE_TEST_SUITE_P(
    Models, CudaHfConformanceTest,
    ::testing::Combine(::testing::ValuesIn(testing::hf_case_names()), ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<std::string, bool>>& param_info) {
      return std::get<0>(param_info.param) +
             (std::get<1>(param_info.param) ? "_deterministic" : "_default");
    });

}  // namespace
}  // namespace specrun
