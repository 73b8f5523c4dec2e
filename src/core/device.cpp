// Device memory and copies: cudaMalloc/cudaMemcpy with the CUDA backend,
// stubs that report no GPU without it.
#include "core/device.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/error.h"

#ifdef MERE_HAVE_CUDA

#include "core/cuda_check.h"

namespace mere {

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string cuda_device_description() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) return std::string("no CUDA device: ") + cudaGetErrorString(err);
  cudaDeviceProp p;
  MERE_CUDA(cudaGetDeviceProperties(&p, 0));
  return fmt::format("{}, {} SMs, {:.0f} GB, sm_{}{}", p.name, p.multiProcessorCount, p.totalGlobalMem / 1e9,
                     p.major, p.minor);
}

// A caching allocator: freed blocks wait in per-size free lists and are handed
// out again, so a forward pass that allocates the same activations every step
// never calls cudaMalloc/cudaFree (cudaFree synchronises the whole device).
// Sizes round up to 512 bytes; when cudaMalloc fails the cache is released and
// the allocation retried.
namespace {

struct BlockCache {
  std::mutex mutex;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;
  std::unordered_map<void*, size_t> sizes;  // every live or cached block
  size_t cached_bytes = 0;
  // Blocks a CUDA graph captured: theirs until the graph is destroyed. While
  // capturing, a block freed by a dead tensor may serve a later allocation of the
  // same capture (the graph keeps stream order), never anything outside it.
  struct GraphBlocks {
    std::vector<void*> all;
    std::unordered_map<size_t, std::vector<void*>> reusable;
    std::unordered_set<void*> live;
    bool capturing = true;
  };
  GraphBlocks* capturing = nullptr;
  std::unordered_map<void*, GraphBlocks*> owner;

  void release_cached() {
    for (auto& [size, blocks] : free_blocks)
      for (void* p : blocks) {
        cudaFree(p);
        sizes.erase(p);
      }
    free_blocks.clear();
    cached_bytes = 0;
  }
};

BlockCache& block_cache() {
  static BlockCache* cache = new BlockCache;  // never destroyed: frees may come during exit
  return *cache;
}

}  // namespace

void* device_alloc(size_t bytes) {
  const size_t size = std::max<size_t>((bytes + 511) / 512 * 512, 512);
  BlockCache& cache = block_cache();
  std::lock_guard lock(cache.mutex);
  auto take = [&](void* p) {
    if (cache.capturing) {
      cache.capturing->all.push_back(p);
      cache.capturing->live.insert(p);
      cache.owner[p] = cache.capturing;
    }
    return p;
  };
  if (cache.capturing) {
    auto& reusable = cache.capturing->reusable[size];
    if (!reusable.empty()) {
      void* p = reusable.back();
      reusable.pop_back();
      cache.capturing->live.insert(p);
      return p;
    }
  }
  auto it = cache.free_blocks.find(size);
  if (it != cache.free_blocks.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    cache.cached_bytes -= size;
    return take(p);
  }
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, size);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it so later calls do not see it
    cache.release_cached();
    err = cudaMalloc(&p, size);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    fail("out of GPU memory: cannot allocate {:.2f} GB ({:.2f} GB free of {:.2f} GB)", bytes / 1e9,
         free_bytes / 1e9, total / 1e9);
  }
  cache.sizes[p] = size;
  return take(p);
}

void device_free(void* p) {
  if (!p) return;
  BlockCache& cache = block_cache();
  std::lock_guard lock(cache.mutex);
  auto it = cache.sizes.find(p);
  if (it == cache.sizes.end()) return;
  auto owned = cache.owner.find(p);
  if (owned != cache.owner.end()) {  // the graph still uses it; it returns with the graph
    BlockCache::GraphBlocks* g = owned->second;
    g->live.erase(p);
    if (g->capturing) g->reusable[it->second].push_back(p);
    return;
  }
  cache.free_blocks[it->second].push_back(p);
  cache.cached_bytes += it->second;
}

size_t device_bytes_reserved() {
  BlockCache& cache = block_cache();
  std::lock_guard lock(cache.mutex);
  size_t total = 0;
  for (const auto& [p, size] : cache.sizes) total += size;
  return total;
}

size_t device_bytes_cached() {
  BlockCache& cache = block_cache();
  std::lock_guard lock(cache.mutex);
  return cache.cached_bytes;
}

size_t device_bytes_available() {
  size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return free_bytes + device_bytes_cached();
}

void release_cached_device_memory() {
  BlockCache& cache = block_cache();
  std::lock_guard lock(cache.mutex);
  cache.release_cached();
}

void* cuda_stream() {
  static cudaStream_t s = [] {
    cudaStream_t created;
    MERE_CUDA(cudaStreamCreateWithFlags(&created, cudaStreamDefault));
    return created;
  }();
  return s;
}

void copy_to_device_async(void* dst, const void* src, size_t bytes) {
  MERE_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(cuda_stream())));
}

void copy_to_host_async(void* dst, const void* src, size_t bytes) {
  MERE_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(cuda_stream())));
}

CudaEvent::CudaEvent() {
  cudaEvent_t e;
  MERE_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  event_ = e;
}
CudaEvent::~CudaEvent() { cudaEventDestroy(static_cast<cudaEvent_t>(event_)); }
void CudaEvent::record() {
  MERE_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(cuda_stream())));
}
void CudaEvent::synchronize() { MERE_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(event_))); }

std::shared_ptr<void> pinned_alloc(size_t bytes) {
  void* p = nullptr;
  MERE_CUDA(cudaMallocHost(&p, bytes));
  return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
}

void* pinned_device_address(void* pinned) {
  void* device = nullptr;
  MERE_CUDA(cudaHostGetDevicePointer(&device, pinned, 0));
  return device;
}

struct CudaGraph::Impl {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  BlockCache::GraphBlocks blocks;
};

CudaGraph::CudaGraph() : impl_(std::make_unique<Impl>()) {}

CudaGraph::~CudaGraph() {
  if (impl_->exec) cudaGraphExecDestroy(impl_->exec);
  if (impl_->graph) cudaGraphDestroy(impl_->graph);
  BlockCache& cache = block_cache();
  std::lock_guard lock(cache.mutex);
  for (void* p : impl_->blocks.all) {
    cache.owner.erase(p);
    if (!impl_->blocks.live.count(p)) {  // no tensor holds it: back to the free lists
      cache.free_blocks[cache.sizes[p]].push_back(p);
      cache.cached_bytes += cache.sizes[p];
    }
  }
}

void CudaGraph::capture(const std::function<void()>& work) {
  MERE_CHECK(!impl_->exec, "CudaGraph::capture: already captured");
  auto stream = static_cast<cudaStream_t>(cuda_stream());
  {
    BlockCache& cache = block_cache();
    std::lock_guard lock(cache.mutex);
    cache.capturing = &impl_->blocks;
  }
  auto stop_capturing = [&] {
    BlockCache& cache = block_cache();
    std::lock_guard lock(cache.mutex);
    cache.capturing = nullptr;
    impl_->blocks.capturing = false;
    impl_->blocks.reusable.clear();
  };
  MERE_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  try {
    work();
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(stream, &broken);
    if (broken) cudaGraphDestroy(broken);
    stop_capturing();
    throw;
  }
  cudaError_t ended = cudaStreamEndCapture(stream, &impl_->graph);
  stop_capturing();
  MERE_CUDA(ended);
  MERE_CUDA(cudaGraphInstantiate(&impl_->exec, impl_->graph, 0));
}

void CudaGraph::replay() {
  MERE_CHECK(impl_->exec, "CudaGraph::replay: nothing captured");
  MERE_CUDA(cudaGraphLaunch(impl_->exec, static_cast<cudaStream_t>(cuda_stream())));
}

bool CudaGraph::is_captured() const { return impl_->exec != nullptr; }

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::cpu && src_device == Device::cpu) {  // no driver needed (CPU-only machines)
    std::memcpy(dst, src, bytes);
    return;
  }
  cudaMemcpyKind kind = src_device == Device::cpu
                            ? (dst_device == Device::cpu ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice)
                            : (dst_device == Device::cpu ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice);
  MERE_CUDA(cudaMemcpy(dst, src, bytes, kind));
}

void zero_bytes(void* p, Device device, size_t bytes) {
  if (device == Device::cpu) {
    std::memset(p, 0, bytes);
  } else {
    MERE_CUDA(cudaMemset(p, 0, bytes));
  }
}

void device_synchronize() {
  // A CUDA build on a machine without a GPU runs everything on the CPU: nothing to wait for.
  static const bool has_gpu = cuda_available();
  if (has_gpu) MERE_CUDA(cudaDeviceSynchronize());
}

}  // namespace mere

#else

namespace mere {

bool cuda_available() { return false; }
std::string cuda_device_description() { return "this binary was built without the CUDA backend"; }
void* device_alloc(size_t) { fail("CUDA is not available: this binary was built without the CUDA backend"); }
void device_free(void*) {}
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  MERE_CHECK(dst_device == Device::cpu && src_device == Device::cpu,
             "CUDA is not available: this binary was built without the CUDA backend");
  std::memcpy(dst, src, bytes);
}
void zero_bytes(void* p, Device device, size_t bytes) {
  MERE_CHECK(device == Device::cpu, "CUDA is not available: this binary was built without the CUDA backend");
  std::memset(p, 0, bytes);
}
void device_synchronize() {}

size_t device_bytes_reserved() { return 0; }
size_t device_bytes_cached() { return 0; }
size_t device_bytes_available() { return 0; }
void release_cached_device_memory() {}
void* cuda_stream() { return nullptr; }
void copy_to_device_async(void*, const void*, size_t) {
  fail("CUDA is not available: this binary was built without the CUDA backend");
}
void copy_to_host_async(void*, const void*, size_t) {
  fail("CUDA is not available: this binary was built without the CUDA backend");
}
CudaEvent::CudaEvent() = default;
CudaEvent::~CudaEvent() = default;
void CudaEvent::record() { fail("CUDA events need the CUDA backend; this binary was built without it"); }
void CudaEvent::synchronize() {}
std::shared_ptr<void> pinned_alloc(size_t bytes) { return std::shared_ptr<void>(::operator new(bytes), [](void* p) { ::operator delete(p); }); }
void* pinned_device_address(void* pinned) { return pinned; }

struct CudaGraph::Impl {};
CudaGraph::CudaGraph() : impl_(std::make_unique<Impl>()) {}
CudaGraph::~CudaGraph() = default;
void CudaGraph::capture(const std::function<void()>&) {
  fail("CUDA graphs need the CUDA backend; this binary was built without it");
}
void CudaGraph::replay() { fail("CUDA graphs need the CUDA backend; this binary was built without it"); }
bool CudaGraph::is_captured() const { return false; }

}  // namespace mere


#endif
