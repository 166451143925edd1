#include "runtime/engine/device.h"

#include <charconv>
#include <stdexcept>
#include <string_view>

#include <spdlog/spdlog.h>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "runtime/base/check.h"
#if SPECRUN_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace specrun {

std::shared_ptr<kernels::cpu::ThreadPool> make_thread_pool(int threads) {
  try {
    return std::make_shared<kernels::cpu::ThreadPool>(threads);
  } catch (const std::runtime_error& error) {  // a worker that cannot start, saying which
    throw Error(error.what());
  }
}

int thread_count(const kernels::cpu::ThreadPool& pool) {
  return pool.num_threads();
}

DeviceSpec parse_device(const std::string& text) {
  if (text == "cpu") return {DeviceSpec::Kind::kCpu, 0};
  if (text == "cuda") return {DeviceSpec::Kind::kCuda, 0};
  const std::string prefix = "cuda:";
  if (text.size() > prefix.size() && text.compare(0, prefix.size(), prefix) == 0) {
    int index = -1;
    const char* first = text.data() + prefix.size();
    const char* last = text.data() + text.size();
    const auto [end, error] = std::from_chars(first, last, index);
    if (error == std::errc() && end == last && index >= 0) return {DeviceSpec::Kind::kCuda, index};
  }
  throw Error("device '" + text + "' is not cpu, cuda or cuda:N");
}

kernels::cpu::Activations cpu_activations(ActivationPrecision precision,
                                          const kernels::cpu::MatmulVariant& variant) {
  switch (precision) {
    case ActivationPrecision::kF32:
      return kernels::cpu::Activations::kF32;
    case ActivationPrecision::kBF16:
      return kernels::cpu::Activations::kBF16;
    case ActivationPrecision::kInt8:
      return kernels::cpu::Activations::kInt8;
    case ActivationPrecision::kAuto:
      break;
  }
  // Rounding to bf16 saves time only where bf16 pairs are multiplied in hardware; GGUF's blocks
  // meet int8 activations everywhere (llama.cpp's way, several times f32's speed).
  return variant.multiplies_bf16_pairs() ? kernels::cpu::Activations::kBF16
                                         : kernels::cpu::Activations::kF32Int8Blocks;
}

bool cuda_backend_built() {
  return SPECRUN_HAVE_CUDA != 0;
}

std::unique_ptr<kernels::Backend> make_backend(const std::string& device,
                                               std::shared_ptr<kernels::cpu::ThreadPool> pool,
                                               const BackendOptions& options) {
  const DeviceSpec spec = parse_device(device);
  if (spec.kind == DeviceSpec::Kind::kCpu) {
    const kernels::cpu::MatmulVariant& variant = kernels::cpu::best_matmul_variant();
    const kernels::cpu::Activations activations = cpu_activations(options.activations, variant);
    const char* described =
        activations == kernels::cpu::Activations::kF32 ? "f32 activations"
        : activations == kernels::cpu::Activations::kF32Int8Blocks
            ? "f32 activations, int8 per block for GGUF's 4- and 8-bit blocks"
        : activations == kernels::cpu::Activations::kBF16
            ? "bf16 activations for bf16 weights and 8-bit ones with a scale per row, int8 per "
              "block for GGUF's blocks"
            : "int8 activations for INT8 weights with a scale per row and per block for GGUF's "
              "blocks, bf16 for bf16 and FP8 ones";
    spdlog::debug("cpu: the '{}' matmul kernels, {}", variant.name, described);
    return std::make_unique<kernels::cpu::CpuBackend>(std::move(pool), activations, &variant);
  }
#if SPECRUN_HAVE_CUDA
  std::unique_ptr<kernels::cuda::CudaBackend> backend;
  const Status status = kernels::cuda::CudaBackend::create(spec.index, &backend);
  if (!status.is_ok()) throw Error("device '" + device + "': " + status.to_string());
  backend->set_batch_invariant(options.deterministic);
  backend->set_notice_handler(
      [device](std::string_view message) { spdlog::warn("device '{}': {}", device, message); });
  return backend;
#else
  (void)options;
  throw Error("device '" + device +
              "': this build of specrun has no CUDA backend (configure it where nvcc is "
              "installed, with -DSPECRUN_CUDA=ON)");
#endif
}

}  // namespace specrun
