// Device memory and copies. The CUDA implementation lives in core/cuda/device.cu;
// a CPU-only build gets the stubs in device_cpu_only.cpp, which report no GPU.
#pragma once

#include <cstddef>
#include <string>

namespace mere {

enum class Device : unsigned char { cpu, cuda };

// True when this binary has the CUDA backend and a GPU is visible.
bool cuda_available();
// "NVIDIA H200, 132 SMs, 141 GB" or why there is none.
std::string cuda_device_description();

void* device_alloc(size_t bytes);  // cached cudaMalloc; an error names the size and the free memory
void device_free(void* p);         // back to the cache, for the next allocation of that size
// Copies between any two devices; synchronous with respect to the host.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
void zero_bytes(void* p, Device device, size_t bytes);
void device_synchronize();

}  // namespace mere
