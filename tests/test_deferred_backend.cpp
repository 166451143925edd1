// The deferred test backend (tests/deferred_backend.h) behaves as a device's streams do, so that
// the engine's suites run on it catch a missing wait on the CPU; and the CPU backend's streams and
// events (kernels/backend.h).
#include "tests/deferred_backend.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "runtime/base/device_buffer.h"

namespace specrun::testing {
namespace {

using kernels::Backend;

std::unique_ptr<DeferredBackend> make_deferred(uint64_t seed) {
  return std::make_unique<DeferredBackend>(
      std::make_unique<kernels::cpu::CpuBackend>(std::make_shared<kernels::cpu::ThreadPool>(1)),
      seed);
}

template <typename T>
std::vector<T> read(Backend& backend, const DeviceBuffer& buffer, size_t count) {
  std::vector<T> host(count);
  EXPECT_TRUE(backend.copy_to_host(host.data(), buffer.data(), count * sizeof(T)).is_ok());
  return host;
}

template <typename T>
void write(Backend& backend, const DeviceBuffer& buffer, const std::vector<T>& host) {
  ASSERT_TRUE(backend.copy_to_device(buffer.data(), host.data(), host.size() * sizeof(T)).is_ok());
}

TEST(DeferredBackend, OpsRunOnlyWhenTheHostAsksForTheirResults) {
  const auto device = make_deferred(0);
  DeviceBuffer buffer(*device, 64 * sizeof(float), "values");
  const kernels::FillParams fill{64, DType::kF32, 7, -1.0f, 1.0f};
  ASSERT_TRUE(device->fill_uniform(fill, buffer.data()).is_ok());
  EXPECT_EQ(device->pending(), 1);
  const std::vector<float> values = read<float>(*device, buffer, 64);
  EXPECT_EQ(device->pending(), 0);

  kernels::cpu::CpuBackend cpu(std::make_shared<kernels::cpu::ThreadPool>(1));
  std::vector<float> expected(64);
  ASSERT_TRUE(cpu.fill_uniform(fill, expected.data()).is_ok());
  EXPECT_EQ(values, expected);
  EXPECT_EQ(device->transfer_counts().host_waits, 1);
  EXPECT_EQ(device->transfer_counts().bytes_to_host, 64 * sizeof(float));
}

TEST(DeferredBackend, ACopyToTheDeviceTakesTheHostsBytesAtOnce) {
  const auto device = make_deferred(0);
  DeviceBuffer buffer(*device, 4 * sizeof(int32_t), "ids");
  std::vector<int32_t> host = {1, 2, 3, 4};
  write(*device, buffer, host);
  host.assign(4, 9);  // reused before the copy runs
  EXPECT_EQ(read<int32_t>(*device, buffer, 4), std::vector<int32_t>({1, 2, 3, 4}));
}

TEST(DeferredBackend, AFailedOpIsReportedByTheStreamsNextWait) {
  const auto device = make_deferred(0);
  // An op that fails as it runs (a token id outside the table, which only the data says) is
  // accepted when queued, as a launch is, and reported when the stream is waited for.
  DeviceBuffer ids(*device, sizeof(int32_t), "ids");
  DeviceBuffer table(*device, 4 * 2 * sizeof(float), "table");
  DeviceBuffer out(*device, 2 * sizeof(float), "out");
  write(*device, ids, std::vector<int32_t>{99});
  write(*device, table, std::vector<float>(8, 1.0f));
  const kernels::EmbeddingParams params{1, 4, 2, DType::kF32};
  EXPECT_TRUE(device->embedding(params, ids.as<int32_t>(), table.data(), out.as<float>()).is_ok());
  const Status reported = device->synchronize();
  EXPECT_EQ(reported.code(), StatusCode::kOutOfRange) << reported.message();
  EXPECT_TRUE(device->synchronize().is_ok());  // reported once
  // A bad shape is refused at once, before any backend sees it (Backend checks it).
  EXPECT_EQ(device->argmax({1, 0}, nullptr, out.as<int32_t>()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(device->synchronize().is_ok());
}

// What the step will hand from the draft's stream to the target's: the producer computes a row of
// logits (a matmul), the consumer samples its argmax. `wait` is the event wait between them.
kernels::SampledRow hand_over(Backend& producer, bool wait) {
  const std::unique_ptr<Backend> consumer = producer.create_stream();
  constexpr int64_t kIn = 8, kVocab = 16;
  DeviceBuffer x(producer, kIn * sizeof(float), "x");
  DeviceBuffer weight(producer, kVocab * kIn * sizeof(float), "weight");
  DeviceBuffer logits(producer, kVocab * sizeof(float), "logits");
  DeviceBuffer q(producer, kVocab * sizeof(float), "q");
  DeviceBuffer rows(producer, sizeof(kernels::SampleRow), "rows");
  DeviceBuffer out(producer, sizeof(kernels::SampledRow), "out");
  std::vector<float> weights(kVocab * kIn, 0.0f);
  for (int64_t i = 0; i < kIn; ++i) weights[static_cast<size_t>(11 * kIn + i)] = 1.0f;  // token 11
  write(producer, x, std::vector<float>(kIn, 0.5f));
  write(producer, weight, weights);
  write(producer, logits, std::vector<float>(kVocab, 0.0f));  // what a missing wait reads
  kernels::SampleRow row{};
  row.settings = {0.0f, 0, 1.0f, 0.0f};
  row.rule = kernels::SampleRule::kArgmax;
  row.draw = kernels::Draw::kDraft;
  row.probe = -1;
  row.weigh = 1;
  write(*consumer, rows, std::vector<kernels::SampleRow>{row});
  EXPECT_TRUE(producer.synchronize().is_ok());
  EXPECT_TRUE(consumer->synchronize().is_ok());

  const std::unique_ptr<kernels::Event> logits_ready = producer.create_event();
  EXPECT_TRUE(producer
                  .matmul({1, kIn, kVocab, DType::kF32, DType::kF32}, x.as<float>(), weight.data(),
                          nullptr, nullptr, logits.as<float>())
                  .is_ok());
  EXPECT_TRUE(producer.record(*logits_ready).is_ok());
  if (wait) {
    EXPECT_TRUE(consumer->wait(*logits_ready).is_ok());
  }
  EXPECT_TRUE(consumer
                  ->sample({1, kVocab, kVocab}, rows.as<kernels::SampleRow>(), logits.as<float>(),
                           nullptr, q.as<float>(), out.as<kernels::SampledRow>(), nullptr)
                  .is_ok());
  kernels::SampledRow sampled{};
  EXPECT_TRUE(consumer->copy_to_host(&sampled, out.data(), sizeof(sampled)).is_ok());
  EXPECT_TRUE(producer.synchronize().is_ok());
  return sampled;
}

TEST(DeferredBackend, AReadOfAnotherStreamsOutputWithoutAWaitReadsWhatWasThereBefore) {
  // On the CPU backend the host's order is the device's, so the missing wait goes unseen.
  kernels::cpu::CpuBackend cpu(std::make_shared<kernels::cpu::ThreadPool>(1));
  EXPECT_EQ(hand_over(cpu, /*wait=*/true).token, 11);
  EXPECT_EQ(hand_over(cpu, /*wait=*/false).token, 11);
  // On the deferred backend, with the wait, the consumer reads the producer's logits in every
  // interleaving; without it, the producer has not run when the consumer samples: every logit is
  // still 0, a tie the lowest id wins, at a confidence of 1/16.
  for (uint64_t seed = 0; seed < 24; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const auto device = make_deferred(seed);
    const kernels::SampledRow waited = hand_over(*device, /*wait=*/true);
    EXPECT_EQ(waited.token, 11);
    EXPECT_GT(waited.top_probability, 0.5);
  }
  const auto device = make_deferred(0);
  const kernels::SampledRow raced = hand_over(*device, /*wait=*/false);
  EXPECT_EQ(raced.token, 0);
  EXPECT_DOUBLE_EQ(raced.top_probability, 1.0 / 16.0);
}

// Three streams in a chain: a fills, b waits for a and adds its own fill, c waits for b and copies
// the sum; the host reads c's copy. Then a writes again, into a buffer of its own or, with
// `overwrite_input`, into b's addend, which nothing orders against b's add. The sum read.
std::vector<float> chain(uint64_t seed, bool overwrite_input) {
  constexpr int64_t kCount = 32;
  const auto a = make_deferred(seed);
  const std::unique_ptr<Backend> b = a->create_stream();
  const std::unique_ptr<Backend> c = a->create_stream();
  DeviceBuffer sum(*a, kCount * sizeof(float), "sum");
  DeviceBuffer addend(*a, kCount * sizeof(float), "addend");
  DeviceBuffer other(*a, kCount * sizeof(float), "other");
  DeviceBuffer copy(*a, kCount * sizeof(float), "copy");
  const std::unique_ptr<kernels::Event> filled = a->create_event();
  const std::unique_ptr<kernels::Event> added = b->create_event();
  EXPECT_TRUE(a->fill_uniform({kCount, DType::kF32, 1, -1.0f, 1.0f}, sum.data()).is_ok());
  EXPECT_TRUE(a->record(*filled).is_ok());
  EXPECT_TRUE(b->fill_uniform({kCount, DType::kF32, 2, -1.0f, 1.0f}, addend.data()).is_ok());
  EXPECT_TRUE(b->wait(*filled).is_ok());
  EXPECT_TRUE(b->add(kCount, addend.as<float>(), sum.as<float>()).is_ok());
  EXPECT_TRUE(b->record(*added).is_ok());
  EXPECT_TRUE(c->wait(*added).is_ok());
  EXPECT_TRUE(c->copy_on_device(copy.data(), sum.data(), kCount * sizeof(float)).is_ok());
  DeviceBuffer& target = overwrite_input ? addend : other;
  EXPECT_TRUE(a->fill_uniform({kCount, DType::kF32, 3, 5.0f, 5.0f}, target.data()).is_ok());
  std::vector<float> result = read<float>(*c, copy, kCount);
  EXPECT_TRUE(a->synchronize().is_ok());
  EXPECT_TRUE(b->synchronize().is_ok());
  return result;
}

TEST(DeferredBackend, EveryInterleavingKeepsEachStreamsOrderAndItsWaits) {
  const std::vector<float> expected = chain(0, false);
  kernels::cpu::CpuBackend cpu(std::make_shared<kernels::cpu::ThreadPool>(1));
  std::vector<float> first(32), second(32);
  ASSERT_TRUE(cpu.fill_uniform({32, DType::kF32, 1, -1.0f, 1.0f}, first.data()).is_ok());
  ASSERT_TRUE(cpu.fill_uniform({32, DType::kF32, 2, -1.0f, 1.0f}, second.data()).is_ok());
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(expected[i], first[i] + second[i]);
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    EXPECT_EQ(chain(seed, false), expected) << "seed " << seed;
  }
}

TEST(DeferredBackend, AWriteNothingOrdersAgainstAnotherStreamsReadRacesIt) {
  // Run as late as allowed, a's overwrite comes after b's add; some random interleavings run it
  // first, and b adds the overwritten values: the race a device would have, made visible.
  const std::vector<float> expected = chain(0, false);
  EXPECT_EQ(chain(0, true), expected);
  int raced = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) raced += chain(seed, true) != expected ? 1 : 0;
  EXPECT_GT(raced, 0);
  EXPECT_LT(raced, 40);
}

TEST(DeferredBackend, FreeingMemoryWaitsForEveryStream) {
  const auto device = make_deferred(0);
  const std::unique_ptr<Backend> other = device->create_stream();
  DeviceBuffer buffer(*device, 16 * sizeof(float), "values");
  ASSERT_TRUE(other->fill_uniform({16, DType::kF32, 5, 0.0f, 1.0f}, buffer.data()).is_ok());
  EXPECT_EQ(static_cast<DeferredBackend&>(*other).pending(), 1);
  { DeviceBuffer released(*device, 8, "released"); }  // its deallocate runs every queue
  EXPECT_EQ(static_cast<DeferredBackend&>(*other).pending(), 0);
}

TEST(BackendStreams, EventsOfAnotherBackendAreRefused) {
  kernels::cpu::CpuBackend cpu(std::make_shared<kernels::cpu::ThreadPool>(1));
  const auto device = make_deferred(0);
  const std::unique_ptr<kernels::Event> foreign = device->create_event();
  EXPECT_EQ(cpu.record(*foreign).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu.wait(*foreign).code(), StatusCode::kInvalidArgument);
  const std::unique_ptr<kernels::Event> own = cpu.create_event();
  EXPECT_EQ(device->record(*own).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(device->wait(*own).code(), StatusCode::kInvalidArgument);
  // An event never recorded is a point already passed.
  EXPECT_TRUE(cpu.wait(*own).is_ok());
  EXPECT_TRUE(device->wait(*device->create_event()).is_ok());
}

TEST(BackendStreams, ACpuStreamSharesTheMemoryAndCountsItsOwnTransfers) {
  kernels::cpu::CpuBackend cpu(std::make_shared<kernels::cpu::ThreadPool>(1));
  const std::unique_ptr<Backend> stream = cpu.create_stream();
  ASSERT_NE(stream, nullptr);
  EXPECT_FALSE(stream->runs_models_concurrently());
  DeviceBuffer buffer(cpu, 4 * sizeof(float), "values");
  ASSERT_TRUE(stream->fill_uniform({4, DType::kF32, 3, 1.0f, 1.0f}, buffer.data()).is_ok());
  EXPECT_EQ(read<float>(cpu, buffer, 4), std::vector<float>(4, 1.0f));
  EXPECT_EQ(cpu.transfer_counts().host_waits, 1);
  EXPECT_EQ(stream->transfer_counts().host_waits, 0);
}

}  // namespace
}  // namespace specrun::testing
