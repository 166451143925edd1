// The matmul's run-time choice among the copies compiled for several instruction sets
// (kernels/CMakeLists.txt defines SPECRUN_HAVE_MATMUL_<VARIANT> for each one built).
#include <array>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"

#define SPECRUN_DECLARE_MATMUL_VARIANT(variant)                                                    \
  namespace specrun::kernels::cpu::variant {                                                       \
  Status matmul_group(const float* x, const MatmulTarget* targets, size_t count, ThreadPool& pool, \
                      Activations activations);                                                    \
  }

#if defined(SPECRUN_HAVE_MATMUL_NATIVE)
SPECRUN_DECLARE_MATMUL_VARIANT(native)
#endif
#if defined(SPECRUN_HAVE_MATMUL_X86_64_V4_BF16)
SPECRUN_DECLARE_MATMUL_VARIANT(x86_64_v4_bf16)
#endif
#if defined(SPECRUN_HAVE_MATMUL_X86_64_V3)
SPECRUN_DECLARE_MATMUL_VARIANT(x86_64_v3)
#endif
#if defined(SPECRUN_HAVE_MATMUL_PORTABLE)
SPECRUN_DECLARE_MATMUL_VARIANT(portable)
#endif

namespace specrun::kernels::cpu {
namespace {

[[maybe_unused]] bool always() {
  return true;
}

constexpr auto kVariants = std::to_array<MatmulVariant>({
#if defined(SPECRUN_HAVE_MATMUL_NATIVE)
  {"native", always, native::matmul_group},
#endif
#if defined(SPECRUN_HAVE_MATMUL_X86_64_V4_BF16)
      {"x86-64-v4+bf16", has_x86_64_v4_bf16, x86_64_v4_bf16::matmul_group},
#endif
#if defined(SPECRUN_HAVE_MATMUL_X86_64_V3)
      {"x86-64-v3", has_x86_64_v3, x86_64_v3::matmul_group},
#endif
#if defined(SPECRUN_HAVE_MATMUL_PORTABLE)
      {"portable", always, portable::matmul_group},
#endif
});
static_assert(!kVariants.empty(), "the build compiles at least one copy of the matmul");

}  // namespace

std::span<const MatmulVariant> matmul_variants() {
  return kVariants;
}

const MatmulVariant& best_matmul_variant() {
  // The CPU does not change under a running process: chosen once.
  static const MatmulVariant& best = []() -> const MatmulVariant& {
    for (const MatmulVariant& variant : kVariants) {
      if (variant.supported()) return variant;
    }
    return kVariants.back();  // the build's baseline: the process would not have started without it
  }();
  return best;
}

Status matmul_group(const float* x, const MatmulTarget* targets, size_t count, ThreadPool& pool,
                    Activations activations, const MatmulVariant* variant) {
  if (variant == nullptr) variant = &best_matmul_variant();
  return variant->group(x, targets, count, pool, activations);
}

Status matmul(const MatmulParams& params, const float* x, const void* weight,
              const float* weight_scales, const void* bias, float* out, ThreadPool& pool,
              Activations activations, const MatmulVariant* variant) {
  const MatmulTarget target{params, weight, weight_scales, bias, out};
  return matmul_group(x, &target, 1, pool, activations, variant);
}

}  // namespace specrun::kernels::cpu
