// exp(x) for x <= 0, without branches or calls, so that a loop over a row of logits vectorises
// (std::exp is a library call per element: most of the time processing a row took). Within 2 ulps
// of the correctly rounded result for normal results (tested against std::exp, see
// tests/test_sampler.cpp), subnormal results included to their own spacing, and exactly 1 at 0;
// -infinity (a banned token) gives 0. Only IEEE additions, multiplications, fused multiply-adds
// (std::fma, a single rounding wherever it runs) and integer bit operations: every instruction set
// gives the same bits. Vectorised where the target has FMA (x86-64-v3 and up); elsewhere std::fma
// is a library call, exact but slow.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace specrun::kernels::cpu {

[[gnu::always_inline]] inline double exp_nonpositive(double x) {
  // Below -1000 every result is 0 (the smallest subnormal is exp(-744.4)); the clamp keeps n and
  // the integer arithmetic below in range, and maps -infinity there too.
  x = std::max(x, -1000.0);
  // x = n ln2 + r, |r| <= ln2 / 2 (Cody and Waite's split of ln2: n * kLn2High is exact).
  constexpr double kLog2e = 0x1.71547652b82fep0;
  constexpr double kLn2High = 0x1.62e42fee00000p-1;
  constexpr double kLn2Low = 0x1.a39ef35793c76p-33;
  constexpr double kRound = 0x1.8p52;  // adding it rounds to an integer held in the low bits
  const double shifted = std::fma(x, kLog2e, kRound);
  const double n = shifted - kRound;
  const double r = std::fma(-n, kLn2Low, std::fma(-n, kLn2High, x));
  // exp(r) by its Taylor series to r^13 (the next term is below 2^-58 of the sum for |r| <= 0.347).
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = std::fma(p, r, 1.0 / 479001600.0);
  p = std::fma(p, r, 1.0 / 39916800.0);
  p = std::fma(p, r, 1.0 / 3628800.0);
  p = std::fma(p, r, 1.0 / 362880.0);
  p = std::fma(p, r, 1.0 / 40320.0);
  p = std::fma(p, r, 1.0 / 5040.0);
  p = std::fma(p, r, 1.0 / 720.0);
  p = std::fma(p, r, 1.0 / 120.0);
  p = std::fma(p, r, 1.0 / 24.0);
  p = std::fma(p, r, 1.0 / 6.0);
  p = std::fma(p, r, 0.5);
  p = std::fma(p, r, 1.0);
  p = std::fma(p, r, 1.0);
  // times 2^n as 2^a * 2^b with a = max(n, -1000): both normal powers of two for n down to
  // -1443, the first product exact, the second rounding once (to a subnormal, where the result is
  // one). The exponents' bits come by the same rounding trick: no 64-bit shifts to the right or
  // conversions, which baseline x86-64 lacks in vectors.
  const double a = std::max(n, -1000.0);
  const double b = n - a;
  const int64_t a_bits = std::bit_cast<int64_t>(a + kRound) - std::bit_cast<int64_t>(kRound);
  const int64_t b_bits = std::bit_cast<int64_t>(b + kRound) - std::bit_cast<int64_t>(kRound);
  return p * std::bit_cast<double>((a_bits + 1023) << 52) *
         std::bit_cast<double>((b_bits + 1023) << 52);
}

}  // namespace specrun::kernels::cpu
