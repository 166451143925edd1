// The CUDA backend's first piece: device discovery and a kernel round trip. Skips without a device.
#include <gtest/gtest.h>

#include "kernels/cuda/device.h"

namespace specrun::kernels::cuda {
namespace {

TEST(CudaDevice, ListsDevicesOrNone) {
  std::vector<DeviceInfo> devices;
  const Status status = list_devices(&devices);
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  for (const DeviceInfo& device : devices) {
    EXPECT_FALSE(device.name.empty());
    EXPECT_GT(device.total_memory_bytes, 0u);
    EXPECT_GT(device.multiprocessor_count, 0);
  }
}

TEST(CudaDevice, KernelRoundTrip) {
  std::vector<DeviceInfo> devices;
  ASSERT_TRUE(list_devices(&devices).is_ok());
  if (devices.empty()) GTEST_SKIP() << "no CUDA device";
  std::vector<float> values;
  const Status status = fill_and_read_back(0, 2.5f, 1000, &values);
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  ASSERT_EQ(values.size(), 1000u);
  for (const float value : values) EXPECT_EQ(value, 2.5f);
}

TEST(CudaDevice, RejectsEmptyFill) {
  std::vector<float> values;
  EXPECT_EQ(fill_and_read_back(0, 1.0f, 0, &values).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specrun::kernels::cuda
