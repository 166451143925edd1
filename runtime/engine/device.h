// Where the models run: the [runtime] device setting ("cpu", "cuda" or "cuda:N") and the backend
// it names. device.cpp is the one place in the runtime that names a concrete backend; everything
// else reaches the kernels through kernels/backend.h, so the CPU's types appear here only by name.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/backend.h"
#include "specrun/settings.hpp"

namespace specrun {
namespace kernels::cpu {
class ThreadPool;
struct MatmulVariant;
enum class Activations : uint8_t;
}  // namespace kernels::cpu

struct DeviceSpec {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;  // which backend
  int index = 0;           // CUDA ordinal; 0 for the CPU
};

// Parses "cpu", "cuda" (ordinal 0) or "cuda:N"; throws Error naming the text otherwise.
DeviceSpec parse_device(const std::string& text);

struct BackendOptions {
  // Batch-invariant kernels everywhere, so that a sequence's logits are bitwise the same whatever
  // shares the call (the CPU backend always is; CUDA then runs every matmul through its skinny
  // kernel instead of cuBLAS, slower for prefill).
  bool deterministic = false;
  // CPU: how matmuls with bf16 weights treat their activations; auto is resolved against the
  // matmul copy this CPU runs (cpu_activations).
  ActivationPrecision activations = ActivationPrecision::kAuto;
};

// What `precision` means for the CPU backend's kernels with the matmul copy `variant`: auto is
// bf16 where that copy multiplies bf16 pairs in hardware, else f32.
kernels::cpu::Activations cpu_activations(ActivationPrecision precision,
                                          const kernels::cpu::MatmulVariant& variant);

// Whether this build has the CUDA backend (nvcc was found when it was configured).
bool cuda_backend_built();

// A pool of `threads` CPU threads (0: one per core); throws Error saying why one cannot start.
std::shared_ptr<kernels::cpu::ThreadPool> make_thread_pool(int threads);
// How many threads the pool runs.
int thread_count(const kernels::cpu::ThreadPool& pool);

// The backend for `device`; the CPU backend runs on `pool`. Throws Error naming the device when
// this build has no CUDA backend, or when the CUDA device cannot be opened (no driver, no such
// ordinal).
std::unique_ptr<kernels::Backend> make_backend(const std::string& device,
                                               std::shared_ptr<kernels::cpu::ThreadPool> pool,
                                               const BackendOptions& options = {});

}  // namespace specrun
