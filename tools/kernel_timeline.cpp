// Kernel timeline of a run, for finding where a decode step's time goes inside
// its CUDA graph (ncu times kernels one at a time, which hides how programmatic
// launch overlaps them). A CUPTI injection library: the CUDA driver loads it
// when CUDA_INJECTION64_PATH names it, and at exit it writes one CSV row per
// kernel (start and end in ns, grid, block, dynamic shared memory, registers,
// graph id, the launch's correlation id, name) to $MERE_TIMELINE.
//
//   g++ -std=c++20 -O2 -shared -fPIC -I/usr/local/cuda/include tools/kernel_timeline.cpp \
//       -L/usr/local/cuda/lib64 -lcupti -o kernel_timeline.so
//   CUDA_INJECTION64_PATH=$PWD/kernel_timeline.so MERE_TIMELINE=t.csv mere bench ...
//   python3 tools/kernel_timeline.py t.csv
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cxxabi.h>
#include <mutex>
#include <string>

namespace {

FILE* out = nullptr;
std::mutex out_mutex;
constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

std::string demangled(const char* name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : name;
  std::free(d);
  for (char& c : s)
    if (c == ',') c = ';';  // one CSV field
  return s;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(out_mutex);
  CUpti_Activity* record = nullptr;
  while (out && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    std::fprintf(out, "%llu,%llu,%d,%d,%d,%d,%u,%u,%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                 k->gridX * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ, k->dynamicSharedMemory,
                 k->registersPerThread, k->graphId, k->correlationId, demangled(k->name).c_str());
  }
  std::free(buffer);
}

void flush_at_exit() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(out_mutex);
  if (out) std::fclose(out), out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection() {
  const char* path = std::getenv("MERE_TIMELINE");
  out = std::fopen(path ? path : "kernel_timeline.csv", "w");
  if (!out) return 0;
  std::fprintf(out, "start_ns,end_ns,blocks,threads,dynamic_smem,registers,graph,correlation,name\n");
  cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  std::atexit(flush_at_exit);
  return 1;
}
