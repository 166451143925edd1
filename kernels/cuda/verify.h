// Speculative verification on the device: Backend::verify (kernels/backend.h) for the greedy,
// rejection and shared-noise rules, alternates included, so that the distributions stay on the
// device and only the verdict crosses to the host. kernels/cpu/verify.h is the reference. Plain
// C++ can include this header: it names the stream type only by forward declaration.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/core/status.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace specrun::kernels::cuda {

// Backend::verify's contract, every pointer a device pointer. One block per row: thread 0 walks
// the row's drafts (the acceptance tests, reading a few values of p and q each, and the random
// numbers of the row's stream, computed on the device by the same Philox function as the host's),
// and the whole block draws each token it needs from a vocabulary-wide row: the argmax (exact),
// the shared-noise Gumbel-max (the same token as the CPU's unless two tokens' scores p / -log u
// lie within the last bit of the device's log, which may differ from the host's by one ulp), and
// the inverse CDF of a recovered or bonus token (block_sample_from's order of summation: the CPU's
// token unless the uniform lies within about vocab * 2^-52 of a boundary of the CDF). The
// acceptance decisions are exact.
Status launch_verify(const VerifyParams& params, const VerifyRow* rows, const float* p,
                     const int32_t* p_status, const float* q, const int32_t* drafts,
                     const int32_t* alternates, const int64_t* alternate_rows, int32_t* tokens,
                     int32_t* accepted, int32_t* alternate_taken, CUstream_st* stream);

}  // namespace specrun::kernels::cuda
