#include "runtime/engine/device.h"

#include <charconv>
#include <string_view>

#include <spdlog/spdlog.h>

#include "kernels/cpu/cpu_backend.h"
#include "runtime/base/check.h"
#if SPECRUN_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace specrun {

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

bool cuda_backend_built() {
  return SPECRUN_HAVE_CUDA != 0;
}

std::unique_ptr<kernels::Backend> make_backend(const std::string& device,
                                               std::shared_ptr<kernels::cpu::ThreadPool> pool,
                                               const BackendOptions& options) {
  const DeviceSpec spec = parse_device(device);
  if (spec.kind == DeviceSpec::Kind::kCpu) {
    return std::make_unique<kernels::cpu::CpuBackend>(
        std::move(pool), options.bf16_activations ? kernels::cpu::Activations::kBF16
                                                  : kernels::cpu::Activations::kF32);
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
