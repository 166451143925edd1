#include "kernels/cuda/device.h"

#include <cuda_runtime.h>

#include <string>

namespace specrun::kernels::cuda {
namespace {

Status device_error(cudaError_t error, const char* what) {
  return Status::error(StatusCode::kDeviceError,
                       std::string(what) + ": " + cudaGetErrorString(error));
}

__global__ void fill_kernel(float* data, int count, float value) {
  const int index = blockIdx.x * blockDim.x + threadIdx.x;
  if (index < count) data[index] = value;
}

}  // namespace

Status list_devices(std::vector<DeviceInfo>* devices) {
  devices->clear();
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return Status::ok();
  }
  if (error != cudaSuccess) return device_error(error, "cudaGetDeviceCount");
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp properties{};
    const cudaError_t property_error = cudaGetDeviceProperties(&properties, i);
    if (property_error != cudaSuccess)
      return device_error(property_error, "cudaGetDeviceProperties");
    devices->push_back(DeviceInfo{i, properties.name, properties.major, properties.minor,
                                  properties.totalGlobalMem, properties.multiProcessorCount});
  }
  return Status::ok();
}

Status fill_and_read_back(int device_index, float value, int count, std::vector<float>* out) {
  if (count <= 0) return Status::invalid_argument("fill_and_read_back: count must be positive");
  cudaError_t error = cudaSetDevice(device_index);
  if (error != cudaSuccess) return device_error(error, "cudaSetDevice");
  float* data = nullptr;
  error = cudaMalloc(&data, static_cast<size_t>(count) * sizeof(float));
  if (error != cudaSuccess) return device_error(error, "cudaMalloc");
  constexpr int kThreads = 256;
  fill_kernel<<<(count + kThreads - 1) / kThreads, kThreads>>>(data, count, value);
  error = cudaGetLastError();
  if (error == cudaSuccess) {
    out->resize(static_cast<size_t>(count));
    error = cudaMemcpy(out->data(), data, static_cast<size_t>(count) * sizeof(float),
                       cudaMemcpyDeviceToHost);
  }
  cudaFree(data);
  return error == cudaSuccess ? Status::ok() : device_error(error, "fill kernel");
}

}  // namespace specrun::kernels::cuda
