// The CUDA logits processing, sampling and verification kernels (kernels/cuda/sampling.h,
// kernels/cuda/verify.h) against the CPU reference (tests/host_sampling.h,
// tests/host_verifiers.h). Every test skips without a device.
//
// Tolerance for the processed distributions: |gpu - ref| <= atol + rtol * |ref| with
// rtol = 3 * 2^-23 and atol = 3 * 2^-149. Both sides compute every weight in double; the device's
// exp is within 1 ulp of the host's and its sums run in another order, which moves the double
// results by about vocab * 2^-53 relative, far below f32 resolution. What reaches the output is the
// rounding to f32: on the filtered path one rounding of the quotient (at most 1 ulp apart), on the
// unfiltered path the CPU's f32 weight times the f32 reciprocal of the total, where each of the two
// roundings and the product can land one ulp apart: 3 ulps, and an f32 ulp is at most 2^-23 of the
// value (2^-149 absolute among subnormals). Which tokens are kept is exact: ties rank by id on both
// sides, and the top-p cut is redone in the CPU's order whenever the parallel sums are within
// rounding of it.
//
// Sampled tokens: the device accumulates the CDF in a different (fixed) order than the CPU, so its
// token equals the CPU's unless uniform * total lies within about vocab * 2^-52 of a boundary of
// the CDF. The tests compute the CPU's CDF and excuse a mismatch only when the target lies within
// 1e-9 of the total of a boundary (the chance of that for a random uniform is about vocab * 1e-9,
// and the tests count such cases to show they stay rare).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/core/random_stream.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/verify.h"
#include "runtime/sampling/rng.h"
#include "runtime/sampling/speculative_step.h"
#include "specrun/error.hpp"
#include "tests/host_sampling.h"
#include "tests/host_verifiers.h"
#include "tests/verify_testing.h"
#include "verify/verifier.h"

namespace specrun::kernels::cuda {
namespace {

constexpr double kRtol = 3.0 * 0x1.0p-23;
constexpr double kAtol = 3.0 * 0x1.0p-149;
constexpr double kBoundary = 1e-9;  // relative distance of a sampling target from a CDF boundary

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

LogitsSettings row_sampling(const SamplingParams& params) {
  return LogitsSettings{params.temperature, static_cast<int32_t>(params.top_k), params.top_p,
                        params.min_p};
}

// Temperature 0 (greedy), below and above 1; top-k off, 1, small, large; top-p off, mild, strong;
// min-p off and on: every combination.
std::vector<SamplingParams> settings_grid() {
  std::vector<SamplingParams> grid;
  for (const float temperature : {0.0f, 0.7f, 1.3f}) {
    for (const int64_t top_k : {0, 1, 5, 50}) {
      for (const float top_p : {1.0f, 0.9f, 0.5f}) {
        for (const float min_p : {0.0f, 0.05f}) {
          SamplingParams params;
          params.temperature = temperature;
          params.top_k = top_k;
          params.top_p = top_p;
          params.min_p = min_p;
          grid.push_back(params);
        }
      }
    }
  }
  return grid;
}

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

bool close_enough(float gpu, float ref) {
  return std::fabs(static_cast<double>(gpu) - static_cast<double>(ref)) <=
         kAtol + kRtol * std::fabs(static_cast<double>(ref));
}

// The device's processed distributions for `logits` ([rows, vocab]) under per-row `settings`.
std::vector<float> device_process_logits(const std::vector<float>& logits,
                                         const std::vector<LogitsSettings>& settings, int64_t vocab,
                                         std::vector<int32_t>* statuses) {
  const auto rows = static_cast<int64_t>(settings.size());
  const ProcessLogitsParams params{rows, vocab};
  size_t workspace_bytes = 0;
  check_ok(process_logits_workspace_bytes(params, &workspace_bytes), "workspace size");
  Stream stream;
  DeviceArray<float> device_logits(logits);
  DeviceArray<LogitsSettings> device_settings(settings);
  DeviceArray<unsigned char> workspace(workspace_bytes);
  DeviceArray<float> probs(logits.size());
  DeviceArray<int32_t> row_status(settings.size());
  probs.poison();
  row_status.poison();
  check_ok(
      launch_process_logits(params, device_logits.get(), device_settings.get(), workspace.get(),
                            workspace_bytes, probs.get(), row_status.get(), stream.get()),
      "process_logits");
  stream.synchronize();
  *statuses = row_status.download();
  return probs.download();
}

void compare_process_logits(int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<SamplingParams> params;
  std::vector<float> logits;
  for (const LogitKind kind : {LogitKind::kSpread, LogitKind::kTies, LogitKind::kWide}) {
    for (const SamplingParams& setting : settings_grid()) {
      params.push_back(setting);
      const std::vector<float> row = make_logits(kind, vocab, rng);
      logits.insert(logits.end(), row.begin(), row.end());
    }
  }
  std::vector<LogitsSettings> settings;
  for (const SamplingParams& p : params) settings.push_back(row_sampling(p));
  std::vector<int32_t> statuses;
  const std::vector<float> gpu = device_process_logits(logits, settings, vocab, &statuses);

  std::vector<float> ref(static_cast<size_t>(vocab));
  int64_t mismatches = 0;
  std::string first_mismatches;
  for (size_t r = 0; r < params.size(); ++r) {
    ASSERT_EQ(statuses[r], static_cast<int32_t>(RowStatus::kOk)) << "row " << r;
    const std::span<const float> row_logits(logits.data() + r * static_cast<size_t>(vocab),
                                            static_cast<size_t>(vocab));
    process_logits(params[r], row_logits, ref);
    for (int64_t i = 0; i < vocab; ++i) {
      const float g = gpu[r * static_cast<size_t>(vocab) + static_cast<size_t>(i)];
      const float e = ref[static_cast<size_t>(i)];
      if (close_enough(g, e)) continue;
      if (++mismatches <= 8) {
        first_mismatches +=
            "\n  row " + std::to_string(r) + " (t " + std::to_string(params[r].temperature) +
            " k " + std::to_string(params[r].top_k) + " p " + std::to_string(params[r].top_p) +
            " min_p " + std::to_string(params[r].min_p) + ") token " + std::to_string(i) +
            ": gpu " + std::to_string(g) + " cpu " + std::to_string(e);
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << first_mismatches;
}

TEST(CudaProcessLogits, MatchesCpuVocab17) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  compare_process_logits(17, 1);
}

TEST(CudaProcessLogits, MatchesCpuVocab1000) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  compare_process_logits(1000, 2);
}

TEST(CudaProcessLogits, MatchesCpuVocab32000) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  compare_process_logits(32000, 3);
}

TEST(CudaProcessLogits, MatchesCpuVocab128256) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  compare_process_logits(128256, 4);
}

TEST(CudaProcessLogits, TopPCutsExactlyAtTies) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  // Four tokens tied at the top and the rest far below: top_p 0.5 reaches the target exactly
  // after two of them (2 == 0.5 * 4 up to the tail), the case where summation order decides.
  const int64_t vocab = 4096;
  std::vector<float> logits(static_cast<size_t>(vocab), -INFINITY);
  for (const int64_t token : {7, 100, 2000, 4095}) logits[static_cast<size_t>(token)] = 2.0f;
  std::vector<SamplingParams> params(4);
  params[0].top_p = 0.5f;
  params[1].top_p = 0.5f;
  params[1].temperature = 0.7f;
  params[2].top_p = 0.75f;
  params[2].top_k = 3;
  params[3].top_p = 0.25f;
  std::vector<float> all_logits;
  std::vector<LogitsSettings> settings;
  for (const SamplingParams& p : params) {
    all_logits.insert(all_logits.end(), logits.begin(), logits.end());
    settings.push_back(row_sampling(p));
  }
  std::vector<int32_t> statuses;
  const std::vector<float> gpu = device_process_logits(all_logits, settings, vocab, &statuses);
  std::vector<float> ref(static_cast<size_t>(vocab));
  for (size_t r = 0; r < params.size(); ++r) {
    EXPECT_EQ(statuses[r], static_cast<int32_t>(RowStatus::kOk));
    process_logits(params[r], logits, ref);
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_TRUE(close_enough(gpu[r * ref.size() + i], ref[i]))
          << "row " << r << " token " << i << ": gpu " << gpu[r * ref.size() + i] << " cpu "
          << ref[i];
    }
  }
}

TEST(CudaProcessLogits, MarksRowsTheCpuRejects) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t vocab = 300;
  Rng rng(5);
  const std::vector<float> good = make_logits(LogitKind::kSpread, vocab, rng);
  struct Case {
    std::vector<float> logits;
    SamplingParams params;
    RowStatus expected;
  };
  std::vector<Case> cases;
  const auto with = [&](size_t index, float value) {
    std::vector<float> row = good;
    row[index] = value;
    return row;
  };
  SamplingParams plain;
  cases.push_back({with(0, NAN), plain, RowStatus::kCorruptLogits});
  cases.push_back({with(123, INFINITY), plain, RowStatus::kCorruptLogits});
  cases.push_back(
      {std::vector<float>(static_cast<size_t>(vocab), -INFINITY), plain, RowStatus::kAllBanned});
  SamplingParams negative_temperature;
  negative_temperature.temperature = -1.0f;
  cases.push_back({good, negative_temperature, RowStatus::kBadSettings});
  SamplingParams zero_top_p;
  zero_top_p.top_p = 0.0f;
  cases.push_back({good, zero_top_p, RowStatus::kBadSettings});
  SamplingParams large_min_p;
  large_min_p.min_p = 2.0f;
  cases.push_back({good, large_min_p, RowStatus::kBadSettings});
  SamplingParams negative_top_k;
  negative_top_k.top_k = -1;
  cases.push_back({good, negative_top_k, RowStatus::kBadSettings});
  // A valid row among them is unaffected by its neighbours.
  std::vector<float> one_allowed(static_cast<size_t>(vocab), -INFINITY);
  one_allowed[42] = -3.0f;
  SamplingParams filtered;
  filtered.top_k = 5;
  filtered.top_p = 0.9f;
  cases.push_back({one_allowed, filtered, RowStatus::kOk});

  std::vector<float> logits;
  std::vector<LogitsSettings> settings;
  for (const Case& c : cases) {
    logits.insert(logits.end(), c.logits.begin(), c.logits.end());
    settings.push_back(row_sampling(c.params));
  }
  std::vector<int32_t> statuses;
  const std::vector<float> gpu = device_process_logits(logits, settings, vocab, &statuses);
  for (size_t r = 0; r < cases.size(); ++r) {
    EXPECT_EQ(statuses[r], static_cast<int32_t>(cases[r].expected)) << "row " << r;
    std::vector<float> expected(static_cast<size_t>(vocab), 0.0f);
    if (cases[r].expected == RowStatus::kOk) {
      process_logits(cases[r].params, cases[r].logits, expected);
    } else if (cases[r].expected != RowStatus::kBadSettings) {
      EXPECT_THROW(process_logits(cases[r].params, cases[r].logits, expected), Error);
      std::fill(expected.begin(), expected.end(), 0.0f);
    }
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_EQ(gpu[r * expected.size() + i], expected[i]) << "row " << r << " token " << i;
    }
  }
}

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

// ---- argmax and sampling ------------------------------------------------------------------------

TEST(CudaArgmax, MatchesCpuExactly) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t vocab : {1, 17, 1000, 128256}) {
    SCOPED_TRACE("vocab " + std::to_string(vocab));
    Rng rng(static_cast<uint64_t>(vocab));
    std::vector<std::vector<float>> rows;
    for (int i = 0; i < 8; ++i) rows.push_back(make_logits(LogitKind::kTies, vocab, rng));
    for (int i = 0; i < 4; ++i) rows.push_back(make_logits(LogitKind::kSpread, vocab, rng));
    rows.emplace_back(static_cast<size_t>(vocab), -INFINITY);  // every token banned: 0
    rows.emplace_back(static_cast<size_t>(vocab), 0.0f);
    rows.back().front() = -0.0f;  // -0 and +0 tie: the lowest id wins
    std::vector<float> nan_first = make_logits(LogitKind::kSpread, vocab, rng);
    nan_first.front() = NAN;  // the CPU never replaces a NaN at index 0
    rows.push_back(nan_first);
    std::vector<float> nan_inside = make_logits(LogitKind::kSpread, vocab, rng);
    nan_inside[static_cast<size_t>(vocab - 1)] = NAN;  // and never picks a later NaN
    rows.push_back(nan_inside);

    std::vector<float> flat;
    for (const auto& row : rows) flat.insert(flat.end(), row.begin(), row.end());
    Stream stream;
    DeviceArray<float> values(flat);
    DeviceArray<int32_t> out(rows.size());
    out.poison();
    check_ok(launch_argmax({static_cast<int64_t>(rows.size()), vocab}, values.get(), out.get(),
                           stream.get()),
             "argmax");
    stream.synchronize();
    const std::vector<int32_t> gpu = out.download();
    for (size_t r = 0; r < rows.size(); ++r) EXPECT_EQ(gpu[r], argmax(rows[r])) << "row " << r;
  }
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

// Backend::sample's kernel against kernels/cpu/sampling.h's sample_row: every rule, rankings,
// weights, lookup's probe, with and without a token map (a reduced head), and rows that fail.
void compare_sample(int64_t vocab, bool with_map, uint64_t seed) {
  Rng rng(seed);
  // A reduced head scores every third token and the last.
  std::vector<int32_t> map;
  if (with_map) {
    for (int64_t t = 0; t < vocab; t += 3) map.push_back(static_cast<int32_t>(t));
    if (map.back() != vocab - 1) map.push_back(static_cast<int32_t>(vocab - 1));
  }
  const int64_t width = with_map ? static_cast<int64_t>(map.size()) : vocab;
  std::vector<SampleRow> rows;
  std::vector<float> logits;
  const SampleRule rules[] = {SampleRule::kArgmax, SampleRule::kInverseCdf,
                              SampleRule::kSharedNoise};
  int64_t index = 0;
  for (const SamplingParams& params : settings_grid()) {
    const SampleRule rule = params.temperature == 0.0f ? SampleRule::kArgmax : rules[index % 3];
    const LogitKind kind = index % 4 == 3 ? LogitKind::kTies : LogitKind::kSpread;
    const std::vector<float> row = make_logits(kind, width, rng);
    logits.insert(logits.end(), row.begin(), row.end());
    SampleRow entry{};
    entry.settings = row_sampling(params);
    entry.seed = 7000 + static_cast<uint64_t>(index);
    entry.position = index % 5;
    entry.rule = rule;
    entry.draw = Draw::kDraft;
    entry.ranked = index % 2 == 0 ? 4 : 10;
    entry.probe = static_cast<int32_t>(rng.uniform() * static_cast<double>(vocab));
    entry.weigh = index % 3 != 0 ? 1 : 0;
    rows.push_back(entry);
    ++index;
  }
  // Rows that fail: corrupt logits, every token banned, an unknown rule, too many ranked.
  for (int fault = 0; fault < 4; ++fault) {
    std::vector<float> row = make_logits(LogitKind::kSpread, width, rng);
    if (fault == 0) row[static_cast<size_t>(width / 3)] = NAN;
    if (fault == 1) std::fill(row.begin(), row.end(), -INFINITY);
    logits.insert(logits.end(), row.begin(), row.end());
    SampleRow entry{};
    entry.settings = row_sampling(SamplingParams{});
    entry.rule = fault == 2 ? static_cast<SampleRule>(7) : SampleRule::kInverseCdf;
    entry.draw = Draw::kDraft;
    entry.ranked = fault == 3 ? static_cast<int32_t>(kMaxRanked + 1) : 2;
    entry.probe = -1;
    entry.weigh = 1;
    rows.push_back(entry);
  }
  const auto count = static_cast<int64_t>(rows.size());
  const SampleParams params{count, width, vocab};

  std::vector<float> cpu_q(logits.size());
  std::vector<SampledRow> cpu(rows.size());
  for (int64_t r = 0; r < count; ++r) {
    const auto offset = static_cast<size_t>(r * width);
    cpu::sample_row(rows[static_cast<size_t>(r)],
                    std::span<const float>(logits).subspan(offset, static_cast<size_t>(width)), map,
                    std::span<float>(cpu_q).subspan(offset, static_cast<size_t>(width)),
                    &cpu[static_cast<size_t>(r)]);
  }

  size_t workspace_bytes = 0;
  check_ok(sample_workspace_bytes(params, &workspace_bytes), "workspace size");
  Stream stream;
  DeviceArray<SampleRow> device_rows(rows);
  DeviceArray<float> device_logits(logits);
  DeviceArray<int32_t> device_map(map);
  DeviceArray<unsigned char> workspace(workspace_bytes);
  DeviceArray<float> q(logits.size());
  DeviceArray<SampledRow> out(rows.size());
  DeviceArray<int32_t> drawn(rows.size());
  q.poison();
  out.poison();
  drawn.poison();
  check_ok(launch_sample_rows(params, device_rows.get(), device_logits.get(),
                              with_map ? device_map.get() : nullptr, workspace.get(),
                              workspace_bytes, q.get(), out.get(), drawn.get(), stream.get()),
           "sample");
  stream.synchronize();
  const std::vector<float> gpu_q = q.download();
  const std::vector<SampledRow> gpu = out.download();
  const std::vector<int32_t> gpu_drawn = drawn.download();

  int64_t near_boundary = 0;
  for (int64_t r = 0; r < count; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    const SampledRow& want = cpu[static_cast<size_t>(r)];
    const SampledRow& got = gpu[static_cast<size_t>(r)];
    const SampleRow& row = rows[static_cast<size_t>(r)];
    ASSERT_EQ(got.status, want.status);
    // The token again for the next forward, 0 where the row failed.
    EXPECT_EQ(gpu_drawn[static_cast<size_t>(r)], std::max(got.token, 0));
    const auto offset = static_cast<size_t>(r * width);
    for (int64_t i = 0; i < width; ++i) {
      const auto at = offset + static_cast<size_t>(i);
      ASSERT_TRUE(close_enough(gpu_q[at], cpu_q[at]))
          << "q entry " << i << ": gpu " << gpu_q[at] << " cpu " << cpu_q[at];
    }
    if (want.status != static_cast<int32_t>(RowStatus::kOk)) {
      EXPECT_EQ(got.token, -1);
      continue;
    }
    if (row.rule == SampleRule::kInverseCdf &&
        cdf_margin(std::span<const float>(cpu_q).subspan(offset, static_cast<size_t>(width)),
                   RandomStream(row.seed).uniform(row.position, row.draw)) < kBoundary) {
      ++near_boundary;
      continue;
    }
    EXPECT_EQ(got.token, want.token);
    for (int32_t k = 0; k < kMaxRanked; ++k) {
      EXPECT_EQ(got.ranked[k], want.ranked[k]) << "place " << k;
    }
    const auto near = [](double gpu_value, double cpu_value, double relative) {
      return std::fabs(gpu_value - cpu_value) <= relative * std::fabs(cpu_value);
    };
    EXPECT_TRUE(near(got.top_probability, want.top_probability, 1e-12))
        << got.top_probability << " vs " << want.top_probability;
    EXPECT_TRUE(close_enough(got.token_weight, want.token_weight));
    EXPECT_TRUE(close_enough(got.probe_weight, want.probe_weight));
    for (int32_t k = 0; k < kMaxRanked; ++k) {
      EXPECT_TRUE(close_enough(got.ranked_weight[k], want.ranked_weight[k])) << "place " << k;
    }
  }
  EXPECT_LE(near_boundary, 1);
}

TEST(CudaSample, MatchesCpuSampleRow) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t vocab : {17, 1000, 128256}) {
    for (const bool with_map : {false, true}) {
      SCOPED_TRACE("vocab " + std::to_string(vocab) + (with_map ? ", reduced head" : ""));
      compare_sample(vocab, with_map, static_cast<uint64_t>(vocab) * 2 + (with_map ? 1 : 0));
    }
  }
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

// One batch in the dense layout of kernels/cuda/verify.h.
struct VerifyCase {
  int64_t batch = 0;
  int64_t gamma = 0;
  int64_t vocab_p = 0;
  int64_t vocab_q = 0;
  bool point_masses = false;
  std::vector<float> p;         // [batch, gamma + 1, vocab_p]
  std::vector<float> q;         // [batch, gamma, vocab_q]; empty for point masses
  std::vector<int32_t> drafts;  // [batch, gamma], -1 past a row's count
  std::vector<int32_t> counts;  // [batch]

  std::span<const float> p_row(int64_t b, int64_t i) const {
    return {p.data() + (b * (gamma + 1) + i) * vocab_p, static_cast<size_t>(vocab_p)};
  }
};

Proposals proposals_of(const VerifyCase& c) {
  Proposals proposals;
  proposals.batch = c.batch;
  proposals.gamma = c.gamma;
  proposals.vocab = c.point_masses ? 0 : c.vocab_q;
  proposals.tokens = c.drafts;
  proposals.counts = c.counts;
  proposals.probs = c.q;
  return proposals;
}

// The case's rows as the scorer lays them out: row b's p_0..p_gamma from b * (gamma + 1).
Scores scores_of(const VerifyCase& c) {
  Scores scores;
  scores.vocab = c.vocab_p;
  for (int64_t b = 0; b <= c.batch; ++b) scores.row_begin.push_back(b * (c.gamma + 1));
  scores.hold(c.p);
  return scores;
}

struct CaseOptions {
  int64_t batch = 16;
  int64_t gamma = 4;
  int64_t vocab_p = 1000;
  int64_t vocab_q = 1000;
  bool point_masses = false;
  float noise = 1.0f;  // how far the target's logits stray from the draft's
  bool same = false;   // p_i = q_{i+1} exactly: every draft is accepted
  uint64_t seed = 1;
};

// Distributions processed as the engine would (some with top-k/top-p zeros), a target that
// agrees with the draft more or less, drafts drawn from q (or, for point masses, mostly from p and
// sometimes anything, out of range included), counts from 0 to gamma.
VerifyCase make_case(const CaseOptions& options) {
  VerifyCase c;
  c.batch = options.batch;
  c.gamma = options.gamma;
  c.vocab_p = options.vocab_p;
  c.vocab_q = options.vocab_q;
  c.point_masses = options.point_masses;
  Rng rng(options.seed);
  const int64_t wide = std::max(c.vocab_p, c.vocab_q);
  std::vector<SamplingParams> flavours(4);
  flavours[1].temperature = 0.8f;
  flavours[1].top_k = 40;
  flavours[2].temperature = 1.2f;
  flavours[2].top_p = 0.9f;
  flavours[3].min_p = 0.05f;
  std::vector<float> p_row(static_cast<size_t>(c.vocab_p));
  std::vector<float> q_row(static_cast<size_t>(c.vocab_q));
  for (int64_t b = 0; b < c.batch; ++b) {
    const auto count = static_cast<int32_t>(b % (c.gamma + 1));
    c.counts.push_back(count);
    const SamplingParams& flavour = flavours[static_cast<size_t>(b % 4)];
    for (int64_t i = 0; i <= c.gamma; ++i) {
      std::vector<float> logits(static_cast<size_t>(wide));
      for (float& logit : logits) logit = static_cast<float>((rng.uniform() - 0.5) * 8.0);
      std::vector<float> target_logits(logits.begin(), logits.begin() + c.vocab_p);
      if (!options.same) {
        for (float& logit : target_logits) {
          logit += static_cast<float>((rng.uniform() - 0.5) * options.noise);
        }
      }
      process_logits(flavour, target_logits, p_row);
      c.p.insert(c.p.end(), p_row.begin(), p_row.end());
      if (i == c.gamma) break;
      if (!c.point_masses) {
        process_logits(flavour, std::span<const float>(logits.data(), q_row.size()), q_row);
        if (options.same) q_row = p_row;
        c.q.insert(c.q.end(), q_row.begin(), q_row.end());
      }
      int32_t draft = -1;
      if (i < count) {
        if (!c.point_masses) {
          draft = sample_from(q_row, rng.uniform());
        } else if (rng.uniform() < 0.8) {
          draft = sample_from(p_row, rng.uniform());
        } else {
          draft = static_cast<int32_t>(rng.uniform() * static_cast<double>(c.vocab_p + 3));
        }
      }
      c.drafts.push_back(draft);
    }
  }
  return c;
}

// The distribution the final token of row b was drawn from, as the CPU forms it.
std::vector<float> final_distribution(const VerifyCase& c, int64_t b, int32_t k) {
  const auto p = c.p_row(b, k);
  std::vector<float> result(p.begin(), p.end());
  if (k == c.counts[static_cast<size_t>(b)]) return result;  // the bonus token
  const int32_t draft = c.drafts[static_cast<size_t>(b * c.gamma + k)];
  double mass = 0.0;
  for (int64_t x = 0; x < c.vocab_p; ++x) {
    float q_x = 0.0f;
    if (c.point_masses) {
      q_x = x == draft ? 1.0f : 0.0f;
    } else if (x < c.vocab_q) {
      q_x = c.q[static_cast<size_t>((b * c.gamma + k) * c.vocab_q + x)];
    }
    result[static_cast<size_t>(x)] = std::max(0.0f, p[static_cast<size_t>(x)] - q_x);
    mass += result[static_cast<size_t>(x)];
  }
  if (mass > 0.0) return result;
  return std::vector<float>(p.begin(), p.end());
}

struct DeviceVerdict {
  std::vector<int32_t> tokens;    // [batch, gamma + 1]
  std::vector<int32_t> accepted;  // [batch]
};

// Row b's random numbers: the stream of seed * 100003 + b, from output position 7 * b.
RowDraws row_draws(uint64_t seed, int64_t b) {
  return {RandomStream(seed * 100003 + static_cast<uint64_t>(b)), 7 * b};
}

// launch_verify over the case, every row by `rule` with row_draws(seed, b).
DeviceVerdict device_verify(const VerifyCase& c, VerifyRule rule, uint64_t seed) {
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

// The device rejection sampler against RejectionSampler with the same per-row streams.
void compare_rejection(const VerifyCase& c, uint64_t seed) {
  const int64_t width = c.gamma + 1;
  std::vector<RowDraws> draws;
  for (int64_t b = 0; b < c.batch; ++b) draws.push_back(row_draws(seed, b));
  const Verdict cpu = RejectionSampler().verify(proposals_of(c), scores_of(c), draws);
  const DeviceVerdict gpu = device_verify(c, VerifyRule::kRejection, seed);

  int64_t near_boundary = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    const auto row = static_cast<size_t>(b);
    const int32_t k = cpu.accepted[row];
    ASSERT_EQ(gpu.accepted[row], k) << "row " << b;
    for (int64_t j = 0; j < width; ++j) {
      const int32_t expected = cpu.tokens[static_cast<size_t>(b * width + j)];
      const int32_t got = gpu.tokens[static_cast<size_t>(b * width + j)];
      if (j == k && got != expected) {
        const double u = draws[row].stream.uniform(draws[row].position + k, Draw::kToken);
        if (cdf_margin(final_distribution(c, b, k), u) < kBoundary) {
          ++near_boundary;
          continue;
        }
      }
      EXPECT_EQ(got, expected) << "row " << b << " position " << j << " (accepted " << k << ")";
    }
  }
  EXPECT_LE(near_boundary, 1);
}

TEST(CudaRejectionVerify, MatchesCpuWithDraftDistributions) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  CaseOptions options;
  options.batch = 40;
  options.seed = 11;
  compare_rejection(make_case(options), 1);
  options.noise = 4.0f;  // mostly rejections
  options.seed = 12;
  compare_rejection(make_case(options), 2);
}

TEST(CudaRejectionVerify, MatchesCpuWithPointMasses) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  CaseOptions options;
  options.batch = 40;
  options.point_masses = true;
  options.seed = 13;
  compare_rejection(make_case(options), 3);
}

TEST(CudaRejectionVerify, MatchesCpuWithGammaZero) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  CaseOptions options;
  options.batch = 12;
  options.gamma = 0;
  options.seed = 14;
  const VerifyCase c = make_case(options);
  compare_rejection(c, 4);
  const DeviceVerdict gpu = device_verify(c, VerifyRule::kGreedy, 4);
  EXPECT_EQ(gpu.accepted, std::vector<int32_t>(static_cast<size_t>(c.batch), 0));
}

TEST(CudaRejectionVerify, AcceptsEverythingWhenTheDistributionsAgree) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  CaseOptions options;
  options.batch = 20;
  options.same = true;
  options.seed = 15;
  const VerifyCase c = make_case(options);
  compare_rejection(c, 5);
  const DeviceVerdict gpu = device_verify(c, VerifyRule::kRejection, 6);
  EXPECT_EQ(gpu.accepted, c.counts);
}

TEST(CudaRejectionVerify, RejectsADraftTheTargetForbids) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  CaseOptions options;
  options.batch = 20;
  options.seed = 16;
  VerifyCase c = make_case(options);
  for (int64_t b = 0; b < c.batch; ++b) {
    if (c.counts[static_cast<size_t>(b)] == 0) continue;
    const int32_t draft = c.drafts[static_cast<size_t>(b * c.gamma)];
    c.p[static_cast<size_t>(b * (c.gamma + 1) * c.vocab_p + draft)] = 0.0f;  // p_0(d_1) = 0
  }
  compare_rejection(c, 6);
  const DeviceVerdict gpu = device_verify(c, VerifyRule::kRejection, 7);  // any uniform rejects
  for (int64_t b = 0; b < c.batch; ++b) {
    EXPECT_EQ(gpu.accepted[static_cast<size_t>(b)], 0) << "row " << b;
  }
}

TEST(CudaRejectionVerify, MatchesCpuAcrossVocabularyWidths) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  CaseOptions options;
  options.batch = 30;
  options.vocab_q = 1040;  // drafts beyond the target's vocabulary: p = 0 there
  options.seed = 17;
  compare_rejection(make_case(options), 7);
  options.vocab_q = 960;  // q is zero beyond its width
  options.seed = 18;
  compare_rejection(make_case(options), 8);
}

TEST(CudaRejectionVerify, MatchesCpuOnALargeVocabulary) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  CaseOptions options;
  options.batch = 6;
  options.gamma = 5;
  options.vocab_p = 32000;
  options.vocab_q = 32000;
  options.seed = 19;
  compare_rejection(make_case(options), 9);
}

TEST(CudaVerify, MarksCountsOutsideGamma) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  CaseOptions options;
  options.batch = 3;
  options.gamma = 2;
  options.vocab_p = 50;
  options.vocab_q = 50;
  options.seed = 20;
  VerifyCase c = make_case(options);
  c.counts[1] = 3;
  for (const VerifyRule rule :
       {VerifyRule::kRejection, VerifyRule::kGreedy, VerifyRule::kSharedNoise}) {
    const DeviceVerdict gpu = device_verify(c, rule, 1);
    EXPECT_EQ(gpu.accepted[1], -1);
    for (int64_t j = 0; j <= c.gamma; ++j) {
      EXPECT_EQ(gpu.tokens[static_cast<size_t>(c.gamma + 1 + j)], -1);
    }
    EXPECT_GE(gpu.accepted[0], 0);
    EXPECT_GE(gpu.accepted[2], 0);
  }
}

TEST(CudaGreedyVerify, MatchesCpuExactly) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t vocab : {1000, 128256}) {
    for (const int64_t gamma : {0, 5}) {
      SCOPED_TRACE("vocab " + std::to_string(vocab) + " gamma " + std::to_string(gamma));
      Rng rng(static_cast<uint64_t>(vocab + gamma));
      VerifyCase c;
      c.batch = vocab > 1000 ? 4 : 24;
      c.gamma = gamma;
      c.vocab_p = vocab;
      c.vocab_q = vocab;
      c.point_masses = true;
      std::vector<float> p_row(static_cast<size_t>(vocab));
      SamplingParams params;
      for (int64_t b = 0; b < c.batch; ++b) {
        const auto count = static_cast<int32_t>(b % (gamma + 1));
        c.counts.push_back(count);
        for (int64_t i = 0; i <= gamma; ++i) {
          // Tied logits give tied probabilities: the lowest id must win on both sides.
          process_logits(params, make_logits(LogitKind::kTies, vocab, rng), p_row);
          c.p.insert(c.p.end(), p_row.begin(), p_row.end());
          if (i == gamma) break;
          int32_t draft = -1;
          if (i < count) {
            draft = rng.uniform() < 0.75
                        ? argmax(p_row)
                        : static_cast<int32_t>(rng.uniform() * static_cast<double>(vocab));
          }
          c.drafts.push_back(draft);
        }
      }
      const std::vector<RowDraws> unused(static_cast<size_t>(c.batch));
      const Verdict cpu = GreedyVerifier().verify(proposals_of(c), scores_of(c), unused);
      const DeviceVerdict gpu = device_verify(c, VerifyRule::kGreedy, 0);
      EXPECT_EQ(gpu.accepted, cpu.accepted);
      EXPECT_EQ(gpu.tokens, cpu.tokens);
    }
  }
}

TEST(CudaSharedNoiseVerify, MatchesCpu) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  // The target's own Gumbel-max tokens under each row's noise: the same as the CPU's unless two
  // tokens' scores lie within the last bit of the device's log (at most one row here).
  for (const int64_t vocab : {1000, 32000}) {
    CaseOptions options;
    options.batch = vocab > 1000 ? 8 : 40;
    options.vocab_p = vocab;
    options.vocab_q = vocab;
    options.point_masses = true;
    options.seed = static_cast<uint64_t>(vocab);
    const VerifyCase c = make_case(options);
    std::vector<RowDraws> draws;
    for (int64_t b = 0; b < c.batch; ++b) draws.push_back(row_draws(3, b));
    const Verdict cpu = SharedNoiseVerifier().verify(proposals_of(c), scores_of(c), draws);
    const DeviceVerdict gpu = device_verify(c, VerifyRule::kSharedNoise, 3);
    int64_t differing = 0;
    for (int64_t b = 0; b < c.batch; ++b) {
      const auto row = static_cast<size_t>(b);
      const auto first = cpu.tokens.begin() + b * (c.gamma + 1);
      const bool same =
          gpu.accepted[row] == cpu.accepted[row] &&
          std::equal(first, first + c.gamma + 1, gpu.tokens.begin() + b * (c.gamma + 1));
      differing += same ? 0 : 1;
    }
    EXPECT_LE(differing, 1) << "vocab " << vocab;
  }
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
  VerifyCase c;
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
  VerifyCase c;
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
