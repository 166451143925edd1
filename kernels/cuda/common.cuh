// What every CUDA kernel family shares: status from CUDA errors, the device-side index checks,
// widening of stored weights to f32, and the fixed-order warp reductions that keep results
// deterministic. Included only from .cu files (it needs nvcc).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
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
  kGatherIndex = 5,    // gather, gather_rows: index outside [-1, bound); kOutOfRange
  kGatherColumn = 6,   // gather_rows: column outside [0, bound); kOutOfRange
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

// f32 to bf16 bits, round to nearest even; NaN stays a quiet NaN with the same top bits. The same
// arithmetic as the CPU's f32_to_bf16 (kernels/core/dtype.h), so a bf16 KV cache holds the same
// bits on both backends.
__device__ __forceinline__ uint16_t round_to_bf16(float value) {
  const uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// Quantized weights widen to their codes' values; the caller applies the scale.
template <>
struct Stored<DType::kF8E4M3> {
  using Type = uint8_t;
  // One hardware conversion on sm_89 and later (exact: every E4M3 value is an f16).
  __device__ static float widen(uint8_t code) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
  }
};

template <>
struct Stored<DType::kI8> {
  using Type = uint8_t;  // the two's-complement byte
  __device__ static float widen(uint8_t code) {
    return static_cast<float>(static_cast<int8_t>(code));
  }
};

// Elements of a 16-byte vector of the stored type.
template <DType kDType>
inline constexpr int kVectorElements = 16 / static_cast<int>(sizeof(typename Stored<kDType>::Type));

// Widens elements [4 q, 4 q + 4) of a 16-byte chunk (`bits`: its four 32-bit words), exactly. A
// quarter is one word of 8-bit codes, two words of halves, or all four words of f32.
template <DType kDType, int kQuarter>
__device__ __forceinline__ void widen_quarter(const uint4& bits, float (&out)[4]) {
  const uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
  if constexpr (kDType == DType::kF8E4M3) {
    const uint32_t word = words[kQuarter];
    // Two codes per conversion instruction, to two halves, to two floats.
    const float2 low = __half22float2(__half2(
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word & 0xffffu), __NV_E4M3)));
    const float2 high = __half22float2(__half2(
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> 16), __NV_E4M3)));
    out[0] = low.x;
    out[1] = low.y;
    out[2] = high.x;
    out[3] = high.y;
  } else if constexpr (kDType == DType::kI8) {
    // Biased to unsigned (code + 128), each byte placed in the mantissa of 2^23, whose float is
    // then 2^23 + code + 128 exactly: a byte permute and a subtraction per code.
    const uint32_t biased = words[kQuarter] ^ 0x80808080u;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      out[b] = __fsub_rn(
          __uint_as_float(__byte_perm(biased, 0x4b000000u, 0x7540u | static_cast<uint32_t>(b))),
          8388736.0f);  // 2^23 + 128
    }
  } else if constexpr (kDType == DType::kF32) {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(words[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      // Little-endian: the lower half-word is the element at the lower address.
      const uint32_t word = words[2 * kQuarter + i];
      out[2 * i] = Stored<kDType>::widen(static_cast<uint16_t>(word & 0xffffu));
      out[2 * i + 1] = Stored<kDType>::widen(static_cast<uint16_t>(word >> 16));
    }
  }
}

// Widens one 16-byte vector (4 f32, 8 halves or 16 codes) at a 16-byte aligned address, exactly.
template <DType kDType>
__device__ __forceinline__ void load_vector(const typename Stored<kDType>::Type* source,
                                            float (&out)[kVectorElements<kDType>]) {
  const uint4 bits = __ldg(reinterpret_cast<const uint4*>(source));
  float quarter[4];
  widen_quarter<kDType, 0>(bits, quarter);
#pragma unroll
  for (int e = 0; e < 4; ++e) out[e] = quarter[e];
  if constexpr (kVectorElements < kDType >> 4) {
    widen_quarter<kDType, 1>(bits, quarter);
#pragma unroll
    for (int e = 0; e < 4; ++e) out[4 + e] = quarter[e];
  }
  if constexpr (kVectorElements < kDType >> 8) {
    widen_quarter<kDType, 2>(bits, quarter);
#pragma unroll
    for (int e = 0; e < 4; ++e) out[8 + e] = quarter[e];
    widen_quarter<kDType, 3>(bits, quarter);
#pragma unroll
    for (int e = 0; e < 4; ++e) out[12 + e] = quarter[e];
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
    default:  // biases are never quantized (check_matmul's callers)
      break;
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
