// The matmul's run-time choice among the copies compiled for several instruction sets
// (kernels/CMakeLists.txt defines SPECRUN_HAVE_MATMUL_<VARIANT> for each one built).
#include <array>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#if defined(SPECRUN_HAVE_MATMUL_AMX)
#include "kernels/cpu/matmul_amx.h"
#endif

#define SPECRUN_DECLARE_MATMUL_VARIANT(variant)                                                    \
  namespace specrun::kernels::cpu::variant {                                                       \
  Status matmul_group(const float* x, const MatmulTarget* targets, size_t count, ThreadPool& pool, \
                      Activations activations);                                                    \
  bool multiplies_bf16_pairs();                                                                    \
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

#if defined(SPECRUN_HAVE_MATMUL_AMX)
bool amx_supported() {
  return has_x86_64_v4_bf16() && has_amx_bf16();
}

Status amx_group(const float* x, const MatmulTarget* targets, size_t count, ThreadPool& pool,
                 Activations activations);
#endif

constexpr auto kVariants = std::to_array<MatmulVariant>({
#if defined(SPECRUN_HAVE_MATMUL_AMX)
  {"amx", amx_supported, amx_group, always, WeightLayout::kPairTiles},
#endif
#if defined(SPECRUN_HAVE_MATMUL_NATIVE)
      {"native", always, native::matmul_group, native::multiplies_bf16_pairs},
#endif
#if defined(SPECRUN_HAVE_MATMUL_X86_64_V4_BF16)
      {"x86-64-v4+bf16", has_x86_64_v4_bf16, x86_64_v4_bf16::matmul_group,
       x86_64_v4_bf16::multiplies_bf16_pairs},
#endif
#if defined(SPECRUN_HAVE_MATMUL_X86_64_V3)
      {"x86-64-v3", has_x86_64_v3, x86_64_v3::matmul_group, x86_64_v3::multiplies_bf16_pairs},
#endif
#if defined(SPECRUN_HAVE_MATMUL_PORTABLE)
      {"portable", always, portable::matmul_group, portable::multiplies_bf16_pairs},
#endif
});
static_assert(!kVariants.empty(), "the build compiles at least one copy of the matmul");

#if defined(SPECRUN_HAVE_MATMUL_AMX)
// The amx copy: weights in pair tiles through the tile multiply, every other weight through the
// best of the other copies (which AVX-512 with AVX512-BF16 is, where AMX is).
Status amx_group(const float* x, const MatmulTarget* targets, size_t count, ThreadPool& pool,
                 Activations activations) {
  if (Status status = check_matmul_group(targets, count); !status.is_ok()) return status;
  std::array<MatmulTarget, kMaxMatmulGroup> tiled{}, other{};
  size_t tiled_count = 0, other_count = 0;
  for (size_t t = 0; t < count; ++t) {
    const MatmulParams& params = targets[t].params;
    if (params.weight_layout != WeightLayout::kPairTiles) {
      other[other_count++] = targets[t];
    } else if (params.weight_dtype != DType::kBF16 || !rounds_to_bf16(activations)) {
      return Status::invalid_argument(
          "matmul: weights in pair tiles are bf16 and meet bf16 activations");
    } else {
      tiled[tiled_count++] = targets[t];
    }
  }
  if (other_count > 0) {
    const MatmulVariant* fallback = nullptr;
    for (const MatmulVariant& variant : kVariants) {
      if (variant.group != amx_group && variant.supported()) {
        fallback = &variant;
        break;
      }
    }
    if (fallback == nullptr) return Status::unsupported("matmul: no copy besides amx runs here");
    if (Status status = fallback->group(x, other.data(), other_count, pool, activations);
        !status.is_ok()) {
      return status;
    }
  }
  if (tiled_count == 0 || targets[0].params.rows == 0) return Status::ok();
  amx_matmul_group(x, tiled.data(), tiled_count, pool);
  // Bias after the sums, as the other copies add it.
  for (size_t t = 0; t < tiled_count; ++t) {
    const MatmulTarget& target = tiled[t];
    if (target.bias == nullptr) continue;
    const MatmulParams& params = target.params;
    for (int64_t f = 0; f < params.out_features; ++f) {
      const float bias = load_as_f32(target.bias, params.bias_dtype, static_cast<size_t>(f));
      for (int64_t r = 0; r < params.rows; ++r) target.out[r * params.out_features + f] += bias;
    }
  }
  return Status::ok();
}
#endif

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
