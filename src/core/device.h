// Device memory, copies, the compute stream and CUDA graphs. device.cpp holds the
// CUDA implementation and, for a build without it, stubs that report no GPU.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
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
// Bytes the process holds on the GPU (in use plus cached), and the cached part.
size_t device_bytes_reserved();
size_t device_bytes_cached();
// Bytes the driver has free on the GPU, plus what our cache holds unused (0 without CUDA).
size_t device_bytes_available();
// Returns the cached (unused) blocks to the driver, e.g. after loading a model,
// whose temporaries would otherwise stay reserved.
void release_cached_device_memory();

// The stream every CUDA op runs on (a cudaStream_t), blocking with respect to the
// legacy default stream so plain cudaMemcpy sees finished results.
void* cuda_stream();
// Host-to-device copy queued on the compute stream (from pinned memory it does not block).
void copy_to_device_async(void* dst, const void* src, size_t bytes);
// Device-to-host copy queued on the compute stream (into pinned memory it does not block).
void copy_to_host_async(void* dst, const void* src, size_t bytes);
// Page-locked host memory, so that async copies really are async.
std::shared_ptr<void> pinned_alloc(size_t bytes);
// The address kernels write pinned_alloc's memory through (mapped host memory).
void* pinned_device_address(void* pinned);

// A point in the compute stream the host can wait for.
class CudaEvent {
 public:
  CudaEvent();
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  void record();       // marks the work queued so far
  void synchronize();  // blocks until that work has finished

 private:
  void* event_ = nullptr;
};

// A captured sequence of CUDA work on the compute stream, replayed with one
// launch. Memory allocated while capturing belongs to the graph until it is
// destroyed (its pointers are baked into the captured kernels), so tensors freed
// during capture are not handed to anyone else.
class CudaGraph {
 public:
  CudaGraph();
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Runs `work` once under stream capture; nothing executes until replay().
  void capture(const std::function<void()>& work);
  void replay();
  bool is_captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mere
