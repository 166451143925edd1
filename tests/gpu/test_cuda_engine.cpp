// The public engine on the CUDA backend: in deterministic mode greedy speculative output equals
// greedy target-only output token for token, as on the CPU; the device is named in the engine's
// info; and its greedy output follows the CPU backend's while their logits agree. Skips without a
// device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device.h"
#include "specrun/specrun.hpp"
#include "tests/test_support.h"

namespace specrun {
namespace {

bool have_device() {
  std::vector<kernels::cuda::DeviceInfo> devices;
  return kernels::cuda::list_devices(&devices).is_ok() && !devices.empty();
}

class CudaEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
    testing::write_layer_skip_pair(dir_.path());
  }

  EngineConfig config(const std::string& device, bool deterministic) const {
    EngineConfig config;
    config.target = (dir_ / "target").string();
    config.draft = (dir_ / "draft").string();
    config.device = device;
    config.deterministic = deterministic;
    config.activations = ActivationPrecision::kF32;  // on the CPU, the exact reference
    config.kv_cache_tokens = 2048;
    config.max_batch = 16;
    return config;
  }

  static Request greedy_request(const std::vector<int32_t>& prompt, SpeculationMethod method,
                                int64_t gamma) {
    Request request;
    request.prompt_ids = prompt;
    SamplingSettings sampling;
    sampling.temperature = 0.0f;
    sampling.max_tokens = 48;
    sampling.stop_at_eos = false;
    request.sampling = sampling;
    SpeculationSettings speculation;
    speculation.method = method;
    speculation.controller = GammaControl::kFixed;
    speculation.gamma = gamma;
    speculation.gamma_max = 8;
    request.speculation = speculation;
    return request;
  }

  static std::vector<std::vector<int32_t>> prompts() {
    return {{1, 5, 9, 2, 7}, {3}, {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                   22, 23, 24, 25, 26, 27, 28, 29, 30, 31}};
  }

  testing::TempDir dir_;
};

TEST_F(CudaEngineTest, DeterministicGreedySpeculationEqualsTheTargetAlone) {
  const auto engine = Engine::create(config("cuda", true));
  EXPECT_EQ(engine->info().device, "cuda:0");
  for (const std::vector<int32_t>& prompt : prompts()) {
    const Result alone = engine->submit(greedy_request(prompt, SpeculationMethod::kNone, 0)).wait();
    ASSERT_EQ(alone.reason, FinishReason::kMaxTokens) << alone.error;
    for (const int64_t gamma : {1, 3, 5, 8}) {
      for (const SpeculationMethod method :
           {SpeculationMethod::kDraftModel, SpeculationMethod::kPromptLookup}) {
        const Result speculative = engine->submit(greedy_request(prompt, method, gamma)).wait();
        ASSERT_EQ(speculative.reason, FinishReason::kMaxTokens) << speculative.error;
        EXPECT_EQ(speculative.tokens, alone.tokens) << "gamma " << gamma;
      }
    }
  }
}

TEST_F(CudaEngineTest, DeterministicGreedySpeculationEqualsAQuantizedTargetAlone) {
  // Quantized at load (both models): the same exactness, now over the 8-bit kernels.
  for (const Quantization quantization : {Quantization::kFP8, Quantization::kINT8}) {
    EngineConfig quantized = config("cuda", true);
    quantized.quantize = quantization;
    quantized.draft_quantize = quantization;
    const auto engine = Engine::create(quantized);
    for (const std::vector<int32_t>& prompt : prompts()) {
      const Result alone =
          engine->submit(greedy_request(prompt, SpeculationMethod::kNone, 0)).wait();
      ASSERT_EQ(alone.reason, FinishReason::kMaxTokens) << alone.error;
      for (const int64_t gamma : {1, 4, 8}) {
        const Result speculative =
            engine->submit(greedy_request(prompt, SpeculationMethod::kDraftModel, gamma)).wait();
        ASSERT_EQ(speculative.reason, FinishReason::kMaxTokens) << speculative.error;
        EXPECT_EQ(speculative.tokens, alone.tokens)
            << to_string(quantization) << " gamma " << gamma;
      }
    }
  }
}

TEST_F(CudaEngineTest, ConcurrentRequestsInDeterministicModeEqualTheirRunsAlone) {
  const auto engine = Engine::create(config("cuda", true));
  std::vector<std::vector<int32_t>> expected;
  for (const std::vector<int32_t>& prompt : prompts()) {
    expected.push_back(
        engine->submit(greedy_request(prompt, SpeculationMethod::kNone, 0)).wait().tokens);
  }
  std::vector<RequestHandle> handles;
  for (int round = 0; round < 4; ++round) {
    for (const std::vector<int32_t>& prompt : prompts()) {
      handles.push_back(engine->submit(greedy_request(prompt, SpeculationMethod::kDraftModel, 4)));
    }
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    EXPECT_EQ(handles[i].wait().tokens, expected[i % expected.size()]) << "request " << i;
  }
}

TEST_F(CudaEngineTest, DeterministicGreedySpeculationWithDraftingAheadEqualsTheTargetAlone) {
  // Overlapped drafting forced on (with auto each row's policy decides): drafts proposed ahead, on
  // the draft's own stream beside the verification, and kept are the drafts the device would have
  // proposed, so the output is still the target's alone.
  EngineConfig settings = config("cuda", true);
  settings.overlap_drafting = OverlapDrafting::kOn;
  const auto engine = Engine::create(settings);
  for (const std::vector<int32_t>& prompt : prompts()) {
    const Result alone = engine->submit(greedy_request(prompt, SpeculationMethod::kNone, 0)).wait();
    ASSERT_EQ(alone.reason, FinishReason::kMaxTokens) << alone.error;
    for (const int64_t gamma : {1, 3, 6}) {
      const Result speculative =
          engine->submit(greedy_request(prompt, SpeculationMethod::kDraftModel, gamma)).wait();
      ASSERT_EQ(speculative.reason, FinishReason::kMaxTokens) << speculative.error;
      EXPECT_EQ(speculative.tokens, alone.tokens) << "gamma " << gamma;
    }
  }
  EXPECT_GT(engine->stats().drafted_ahead, 0);
  EXPECT_GT(engine->stats().ahead_taken, 0);
}

TEST_F(CudaEngineTest, DraftsLeftOnTheDeviceWaitOnceAStepAndDecodeAsReadBack) {
  // Without prompt lookup, alternates, a floor or drafting ahead, the drafts (and rejection
  // sampling's q) stay on the device: the target's stream waits for the draft's event and gathers
  // them. Greedy and shared noise give the target's own tokens; rejection sampling the tokens of
  // the same requests with the drafts read back (a floor no draft falls below); one wait a step.
  EngineConfig settings = config("cuda", true);
  settings.overlap_drafting = OverlapDrafting::kOff;
  const auto engine = Engine::create(settings);
  struct Rule {
    float temperature;
    Verification verification;
  };
  for (const Rule rule :
       {Rule{0.0f, Verification::kRejection}, Rule{0.8f, Verification::kSharedNoise},
        Rule{0.8f, Verification::kRejection}}) {
    for (const std::vector<int32_t>& prompt : prompts()) {
      for (const int64_t gamma : {1, 4}) {
        SCOPED_TRACE(std::string(to_string(rule.verification)) + " at T " +
                     std::to_string(rule.temperature) + ", gamma " + std::to_string(gamma));
        const auto request = [&](SpeculationMethod method, float floor) {
          Request r = greedy_request(prompt, method, gamma);
          r.sampling->temperature = rule.temperature;
          r.sampling->seed = 11;
          r.speculation->verification = rule.verification;
          r.speculation->draft_lookup_ngram = 0;
          r.speculation->draft_alternates = 0;
          r.speculation->draft_p_min = floor;
          return r;
        };
        const Result on_device =
            engine->submit(request(SpeculationMethod::kDraftModel, 0.0f)).wait();
        ASSERT_EQ(on_device.reason, FinishReason::kMaxTokens) << on_device.error;
        EXPECT_EQ(on_device.stats.host_waits, on_device.stats.steps);
        const Result read_back =
            engine->submit(request(SpeculationMethod::kDraftModel, 1e-6f)).wait();
        EXPECT_EQ(on_device.tokens, read_back.tokens);
        EXPECT_EQ(on_device.stats.accepted, read_back.stats.accepted);
        if (rule.verification == Verification::kSharedNoise || rule.temperature == 0.0f) {
          const Result alone = engine->submit(request(SpeculationMethod::kNone, 0.0f)).wait();
          EXPECT_EQ(on_device.tokens, alone.tokens);
        }
      }
    }
  }
}

TEST_F(CudaEngineTest, GreedyOutputFollowsTheCpuBackend) {
  // The backends round differently, so a near tie may go either way; the layer-skip pair's
  // logits are well separated, so the first tokens agree.
  const auto gpu = Engine::create(config("cuda", false));
  const auto cpu = Engine::create(config("cpu", false));
  for (const std::vector<int32_t>& prompt : prompts()) {
    const Request request = greedy_request(prompt, SpeculationMethod::kDraftModel, 4);
    const std::vector<int32_t> on_gpu = gpu->submit(request).wait().tokens;
    const std::vector<int32_t> on_cpu = cpu->submit(request).wait().tokens;
    ASSERT_EQ(on_gpu.size(), on_cpu.size());
    const std::vector<int32_t> gpu_head(on_gpu.begin(), on_gpu.begin() + 8);
    const std::vector<int32_t> cpu_head(on_cpu.begin(), on_cpu.begin() + 8);
    EXPECT_EQ(gpu_head, cpu_head);
  }
}

TEST_F(CudaEngineTest, TheMemoryPlanCountsTheBackendsOwnScratch) {
  // The device's scratch and cuBLAS's workspace are planned beside the models; the host's
  // backend takes nothing of its own.
  const MemoryPlan on_gpu = plan_memory(config("cuda", false));
  const MemoryPlan on_cpu = plan_memory(config("cpu", false));
  EXPECT_EQ(on_cpu.scratch_bytes, 0u);
  EXPECT_GE(on_gpu.scratch_bytes, kernels::cuda::kCublasWorkspaceBytes);
  EXPECT_EQ(on_gpu.total_bytes, on_gpu.target.weight_bytes + on_gpu.target.kv_bytes +
                                    on_gpu.target.workspace_bytes + on_gpu.draft.weight_bytes +
                                    on_gpu.draft.kv_bytes + on_gpu.draft.workspace_bytes +
                                    on_gpu.scratch_bytes);
  EXPECT_NE(to_string(on_gpu).find("scratch"), std::string::npos) << to_string(on_gpu);
  EXPECT_EQ(Engine::create(config("cuda", false))->info().memory.scratch_bytes,
            on_gpu.scratch_bytes);
}

TEST(CudaEngine, AMissingOrdinalIsOneClearError) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  testing::TempDir dir;
  testing::write_layer_skip_pair(dir.path());
  EngineConfig config;
  config.target = (dir / "target").string();
  config.device = "cuda:999";
  try {
    Engine::create(config);
    FAIL() << "created an engine on cuda:999";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("device 'cuda:999'"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace specrun
