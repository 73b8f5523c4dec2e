// main() of the gpu test binary: without a GPU, say so and exit 77, which ctest
// reports as "skipped" (SKIP_RETURN_CODE); with one, run the tests as usual.
#include <gtest/gtest.h>

#include <cstdio>

#include "core/device.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!mere::cuda_available()) {
    std::printf("gpu tests skipped: %s\n", mere::cuda_device_description().c_str());
    return 77;
  }
  return RUN_ALL_TESTS();
}
