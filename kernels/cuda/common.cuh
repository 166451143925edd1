// What every CUDA kernel family shares: status from CUDA errors, the device-side index checks,
// widening of stored weights to f32, and the fixed-order warp reductions that keep results
// deterministic. Included only from .cu files (it needs nvcc).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/core/dtype.h"
#include "kernels/core/status.h"

namespace specrun::kernels::cuda {

inline constexpr unsigned kFullWarp = 0xffffffffu;
inline constexpr int kWarpSize = 32;

inline Status cuda_error_status(cudaError_t error, const char* what) {
  return Status::error(StatusCode::kDeviceError,
                       std::string(what) + ": " + cudaGetErrorString(error));
}

// Called right after a launch: reports a bad launch configuration, and any earlier asynchronous
// fault the runtime has noticed by now.
inline Status launch_status(const char* what) {
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? Status::ok() : cuda_error_status(error, what);
}

inline bool is_aligned(const void* pointer, size_t bytes) {
  return reinterpret_cast<uintptr_t>(pointer) % bytes == 0;
}

// ---- Device-side index checks ------------------------------------------------------------------
// The CPU backend validates token ids, slots and attention metadata by reading them; here they
// live in device memory, and reading them on the host would stall the stream. Kernels check them
// instead, skip what is invalid (so nothing is read or written out of bounds), and record the
// first failure here; the backend turns the record into a Status at its next host wait.

enum class DeviceCheck : int {
  kNone = 0,
  kTokenId = 1,        // embedding: id outside [0, bound); kOutOfRange
  kSlot = 2,           // kv_write: slot outside [0, bound); kOutOfRange
  kQueryStart = 3,     // attention: query_start does not cover [0, num_tokens); kInvalidArgument
  kContextLength = 4,  // attention: a sequence's context length is impossible; kInvalidArgument
};

struct DeviceErrorRecord {
  int check;      // a DeviceCheck; kNone while nothing failed
  int reserved;   // keeps the 64-bit fields aligned
  int64_t index;  // the token or sequence that failed
  int64_t value;  // the offending value
  int64_t bound;  // the limit it broke
};

// First failure wins; a null record only skips the report.
__device__ inline void report_device_error(DeviceErrorRecord* record, DeviceCheck check,
                                           int64_t index, int64_t value, int64_t bound) {
  if (record == nullptr) return;
  if (atomicCAS(&record->check, 0, static_cast<int>(check)) == 0) {
    record->index = index;
    record->value = value;
    record->bound = bound;
  }
}

// ---- Stored weights ----------------------------------------------------------------------------

template <DType kDType>
struct Stored;

template <>
struct Stored<DType::kF32> {
  using Type = float;
  __device__ static float widen(float value) { return value; }
};

template <>
struct Stored<DType::kF16> {
  using Type = uint16_t;
  __device__ static float widen(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
};

template <>
struct Stored<DType::kBF16> {
  using Type = uint16_t;
  // bfloat16 is the top half of an f32: widening is a shift.
  __device__ static float widen(uint16_t bits) {
    return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  }
};

// Elements of a 16-byte vector of the stored type.
template <DType kDType>
inline constexpr int kVectorElements = 16 / static_cast<int>(sizeof(typename Stored<kDType>::Type));

// Widens one 16-byte vector (4 f32 or 8 halves) at a 16-byte aligned address, exactly.
template <DType kDType>
__device__ __forceinline__ void load_vector(const typename Stored<kDType>::Type* source,
                                            float (&out)[kVectorElements<kDType>]) {
  const uint4 bits = __ldg(reinterpret_cast<const uint4*>(source));
  const uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
  if constexpr (kDType == DType::kF32) {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(words[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // Little-endian: the lower half-word is the element at the lower address.
      out[2 * i] = Stored<kDType>::widen(static_cast<uint16_t>(words[i] & 0xffffu));
      out[2 * i + 1] = Stored<kDType>::widen(static_cast<uint16_t>(words[i] >> 16));
    }
  }
}

// Reads element `index` of a buffer of runtime `dtype` as f32 (biases, where speed is no issue).
__device__ __forceinline__ float load_element_f32(const void* data, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(data)[index];
    case DType::kF16:
      return Stored<DType::kF16>::widen(static_cast<const uint16_t*>(data)[index]);
    case DType::kBF16:
      return Stored<DType::kBF16>::widen(static_cast<const uint16_t*>(data)[index]);
  }
  return 0.0f;
}

// ---- Fixed-order reductions
// ---------------------------------------------------------------------- A butterfly: lanes i and
// i^offset add the same two values (addition commutes), so every lane ends with the same bits, and
// the tree depends on nothing but the lane values.

__device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value = __fadd_rn(value, __shfl_xor_sync(kFullWarp, value, offset));
  }
  return value;
}

__device__ __forceinline__ float warp_max(float value) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(kFullWarp, value, offset));
  }
  return value;
}

}  // namespace specrun::kernels::cuda
