// The CUDA sampling and verification kernels (kernels/cuda/sampling.h, kernels/cuda/verify.h)
// beyond what each op computes, which test_cuda_backend_ops holds against the CPU reference
// (tests/test_backend_ops.cpp): the launchers' own refusals of a shape or a workspace the backend
// never passes them, and the distribution of the tokens the device's rejection sampling emits.
// Every test skips without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/core/random_stream.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/verify.h"
#include "tests/host_sampling.h"
#include "tests/verify_testing.h"
#include "verify/verifier.h"

namespace specrun::kernels::cuda {
namespace {

bool has_device() {
  std::vector<DeviceInfo> devices;
  return list_devices(&devices).is_ok() && !devices.empty();
}

void check_cuda(cudaError_t error, const std::string& what) {
  if (error != cudaSuccess) throw std::runtime_error(what + ": " + cudaGetErrorString(error));
}

void check_ok(const Status& status, const std::string& what) {
  if (!status.is_ok()) throw std::runtime_error(what + ": " + status.to_string());
}

// Device memory for `count` elements of T, freed on destruction.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t count) : count_(count) {
    void* data = nullptr;
    check_cuda(cudaMalloc(&data, std::max<size_t>(count, 1) * sizeof(T)), "cudaMalloc");
    data_ = static_cast<T*>(data);
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    if (!host.empty()) {
      check_cuda(cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
                 "upload");
      settle();
    }
  }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return data_; }
  // Fills every byte with 0xff first, so that an element a kernel forgets to write shows up (as
  // -1 for integers, NaN for floats).
  void poison() {
    check_cuda(cudaMemset(data_, 0xff, count_ * sizeof(T)), "cudaMemset");
    settle();
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    if (count_ > 0) {
      check_cuda(cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost),
                 "download");
    }
    return host;
  }

 private:
  // cudaMemset and a pageable upload run on the legacy default stream, which does not order work
  // on the tests' non-blocking streams: without this wait, a kernel could run before its input
  // arrived or before the poison, whose late 0xff bytes then overwrite its output (seen on an
  // H200 as a row status of -1 when the test binaries ran side by side).
  static void settle() { check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

  size_t count_;
  T* data_ = nullptr;
};

class Stream {
 public:
  Stream() { check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream"); }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const { check_cuda(cudaStreamSynchronize(stream_), "synchronize"); }

 private:
  cudaStream_t stream_ = nullptr;
};

TEST(CudaProcessLogits, RejectsBadShapesAndSmallWorkspaces) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  size_t bytes = 0;
  EXPECT_EQ(process_logits_workspace_bytes({2, 0}, &bytes).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(process_logits_workspace_bytes({-1, 10}, &bytes).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(process_logits_workspace_bytes({100000, 100000}, &bytes).code(),
            StatusCode::kUnsupported);
  const ProcessLogitsParams params{2, 100};
  ASSERT_TRUE(process_logits_workspace_bytes(params, &bytes).is_ok());
  DeviceArray<float> logits(200), probs(200);
  DeviceArray<LogitsSettings> settings(2);
  DeviceArray<unsigned char> workspace(bytes);
  DeviceArray<int32_t> statuses(2);
  EXPECT_EQ(launch_process_logits(params, logits.get(), settings.get(), workspace.get(), bytes - 1,
                                  probs.get(), statuses.get(), nullptr)
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(launch_process_logits(params, logits.get(), settings.get(), workspace.get() + 4,
                                  bytes - 4, probs.get(), statuses.get(), nullptr)
                .code(),
            StatusCode::kInvalidArgument);
}

TEST(CudaSample, RejectsBadShapesAndSmallWorkspaces) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  Stream stream;
  DeviceArray<SampleRow> rows(1);
  DeviceArray<float> logits(8);
  DeviceArray<float> q(8);
  DeviceArray<SampledRow> out(1);
  DeviceArray<unsigned char> workspace(1);
  // vocab past width needs a token map.
  EXPECT_FALSE(launch_sample_rows({1, 8, 9}, rows.get(), logits.get(), nullptr, workspace.get(), 1,
                                  q.get(), out.get(), nullptr, stream.get())
                   .is_ok());
  EXPECT_FALSE(launch_sample_rows({1, 8, 8}, rows.get(), logits.get(), nullptr, workspace.get(), 1,
                                  q.get(), out.get(), nullptr, stream.get())
                   .is_ok());
}

// ---- verification -------------------------------------------------------------------------------

struct DeviceVerdict {
  std::vector<int32_t> tokens;    // [batch, gamma + 1]
  std::vector<int32_t> accepted;  // [batch]
};

// Row b's random numbers: the stream of seed * 100003 + b, from output position 7 * b.
RowDraws row_draws(uint64_t seed, int64_t b) {
  return {RandomStream(seed * 100003 + static_cast<uint64_t>(b)), 7 * b};
}

// launch_verify over the case, every row by `rule` with row_draws(seed, b).
DeviceVerdict device_verify(const testing::VerifyBatch& c, VerifyRule rule, uint64_t seed) {
  Stream stream;
  std::vector<VerifyRow> rows;
  for (int64_t b = 0; b < c.batch; ++b) {
    const RowDraws draws = row_draws(seed, b);
    rows.push_back({draws.stream.seed(), draws.position, b * (c.gamma + 1),
                    c.counts[static_cast<size_t>(b)], rule});
  }
  DeviceArray<VerifyRow> device_rows(rows);
  DeviceArray<float> p(c.p);
  DeviceArray<float> q(c.q);
  DeviceArray<int32_t> drafts(c.drafts);
  DeviceArray<int32_t> tokens(static_cast<size_t>(c.batch * (c.gamma + 1)));
  DeviceArray<int32_t> accepted(static_cast<size_t>(c.batch));
  DeviceArray<int32_t> taken(static_cast<size_t>(c.batch));
  tokens.poison();
  accepted.poison();
  const VerifyParams params{
      c.batch, c.gamma, c.batch * (c.gamma + 1), c.vocab_p, c.point_masses ? 0 : c.vocab_q, 0};
  check_ok(launch_verify(params, device_rows.get(), p.get(), nullptr,
                         c.point_masses ? nullptr : q.get(), c.gamma > 0 ? drafts.get() : nullptr,
                         nullptr, nullptr, tokens.get(), accepted.get(), taken.get(), stream.get()),
           "verify");
  stream.synchronize();
  return DeviceVerdict{tokens.download(), accepted.download()};
}

// ---- distribution -------------------------------------------------------------------------------

TEST(CudaRejectionVerify, EmittedTokensFollowTheTarget) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  // tests/test_verify.cpp's fixed step: vocabulary 4, two drafts. The first emitted token must
  // follow p_0 exactly, and, when the first draft was accepted, the second must follow p_1.
  const std::vector<std::vector<float>> q = {{0.50f, 0.30f, 0.15f, 0.05f},
                                             {0.10f, 0.20f, 0.30f, 0.40f}};
  const std::vector<std::vector<float>> p = {
      {0.10f, 0.20f, 0.30f, 0.40f}, {0.25f, 0.25f, 0.25f, 0.25f}, {0.70f, 0.10f, 0.10f, 0.10f}};
  const int64_t draws = 100000;
  testing::VerifyBatch c;
  c.batch = draws;
  c.gamma = 2;
  c.vocab_p = 4;
  c.vocab_q = 4;
  for (int64_t b = 0; b < draws; ++b) {
    c.counts.push_back(2);
    for (const auto& row : p) c.p.insert(c.p.end(), row.begin(), row.end());
    const RandomStream stream(static_cast<uint64_t>(b));
    for (size_t i = 0; i < q.size(); ++i) {
      c.q.insert(c.q.end(), q[i].begin(), q[i].end());
      c.drafts.push_back(sample_from(q[i], stream.uniform(static_cast<int64_t>(i), Draw::kDraft)));
    }
  }
  const DeviceVerdict gpu = device_verify(c, VerifyRule::kRejection, 0);
  std::map<int64_t, int64_t> first, second;
  int64_t second_draws = 0;
  for (int64_t b = 0; b < draws; ++b) {
    ++first[gpu.tokens[static_cast<size_t>(b * 3)]];
    if (gpu.accepted[static_cast<size_t>(b)] >= 1) {
      ++second[gpu.tokens[static_cast<size_t>(b * 3 + 1)]];
      ++second_draws;
    }
  }
  const auto expected = [](const std::vector<float>& row) {
    std::map<int64_t, double> out;
    for (size_t x = 0; x < row.size(); ++x) out[static_cast<int64_t>(x)] = row[x];
    return out;
  };
  const auto first_check = testing::chi_square(first, expected(p[0]), draws);
  EXPECT_LT(first_check.statistic, first_check.critical()) << "df " << first_check.degrees;
  const auto second_check = testing::chi_square(second, expected(p[1]), second_draws);
  EXPECT_LT(second_check.statistic, second_check.critical()) << "df " << second_check.degrees;
  // The test is sharp: the same counts are far from the draft's distribution.
  const auto wrong = testing::chi_square(first, expected(q[0]), draws);
  EXPECT_GT(wrong.statistic, wrong.critical());
}

TEST(CudaRejectionVerify, PointMassDraftsFollowTheTarget) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  // Prompt lookup proposes token 1 with q a point mass: accept with probability p(1), recover
  // from p without token 1. The first token must still follow p_0.
  const std::vector<float> p0 = {0.1f, 0.6f, 0.3f};
  const std::vector<float> p1 = {0.3f, 0.3f, 0.4f};
  const int64_t draws = 100000;
  testing::VerifyBatch c;
  c.batch = draws;
  c.gamma = 1;
  c.vocab_p = 3;
  c.point_masses = true;
  for (int64_t b = 0; b < draws; ++b) {
    c.counts.push_back(1);
    c.drafts.push_back(1);
    c.p.insert(c.p.end(), p0.begin(), p0.end());
    c.p.insert(c.p.end(), p1.begin(), p1.end());
  }
  const DeviceVerdict gpu = device_verify(c, VerifyRule::kRejection, 7);
  std::map<int64_t, int64_t> counts;
  for (int64_t b = 0; b < draws; ++b) ++counts[gpu.tokens[static_cast<size_t>(b * 2)]];
  const auto check = testing::chi_square(counts, {{0, 0.1}, {1, 0.6}, {2, 0.3}}, draws);
  EXPECT_LT(check.statistic, check.critical()) << "df " << check.degrees;
}

}  // namespace
}  // namespace specrun::kernels::cuda
