// CUDA device discovery: the first piece of the CUDA backend, and what the runtime asks before it
// picks a device. Compiled only when nvcc is found (SPECRUN_CUDA).
#pragma once

#include <string>
#include <vector>

#include "kernels/core/status.h"

namespace specrun::kernels::cuda {

struct DeviceInfo {
  int index;                  // CUDA ordinal
  std::string name;           // "NVIDIA H100 80GB HBM3"
  int compute_major;          // compute capability, major
  int compute_minor;          // compute capability, minor
  size_t total_memory_bytes;  // global memory
  int multiprocessor_count;   // SMs
};

// The visible devices; an empty list (and ok) when there is no driver or no device.
Status list_devices(std::vector<DeviceInfo>* devices);

// Writes value into `count` floats on device `device_index` and reads them back: a round trip
// through allocation, a kernel launch and both copy directions.
Status fill_and_read_back(int device_index, float value, int count, std::vector<float>* out);

}  // namespace specrun::kernels::cuda
