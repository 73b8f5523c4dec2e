// How fast a few SMs bring memory into L2 with prefetches (per-line
// prefetch.global.L2, its evict_last form, or cp.async.bulk.prefetch.L2 of 16 KB),
// and whether a full-grid read after them then runs at L2 speed. Measured for the
// side_prefetcher experiment (docs/benchmarks.md, fiftieth session: about 0.26 TB/s
// an SM whatever the form, so a prefetcher beside the decode chain would need a
// tenth of the SMs). Not part of the build; on the GPU machine:
//   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -o /tmp/pfb tools/l2_prefetch_bench.cu && /tmp/pfb
// Columns: the consumer's time (us) after a prefetch of 16 MB by `blocks` blocks of 128
// threads that then spin d us, and (pf) the time from the prefetch kernel's start to the consumer's.
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__global__ void consume(const uint4* p, size_t n, unsigned long long* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p + i));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) atomicAdd(sink, 1ull);
}

// mode 0: prefetch.global.L2 per 128-byte line (each thread its lines)
// mode 1: prefetch.global.L2::evict_last per line
// mode 2: cp.async.bulk.prefetch.L2 of `chunk` bytes per thread
// Then spin for `delay_ns` (so the consumer starts after it).
__global__ void prefetcher(const char* p, size_t bytes, int mode, int chunk, long long delay_ns) {
  long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const size_t tid = blockIdx.x * size_t(blockDim.x) + threadIdx.x, nt = size_t(gridDim.x) * blockDim.x;
  if (mode == 2) {
    for (size_t o = tid * chunk; o < bytes; o += nt * chunk)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + o), "r"(chunk) : "memory");
  } else {
    for (size_t o = tid * 128; o < bytes; o += nt * 128) {
      if (mode == 0) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
      else asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p + o));
    }
  }
  long long t;
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < delay_ns);
}

int main() {
  const size_t big = 512ull << 20, flush_bytes = 256ull << 20;
  char *buf, *flush; unsigned long long* sink;
  CK(cudaMalloc(&buf, big)); CK(cudaMalloc(&flush, flush_bytes)); CK(cudaMalloc(&sink, 8));
  CK(cudaMemset(buf, 1, big)); CK(cudaMemset(flush, 2, flush_bytes));
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceProp prop; cudaGetDeviceProperties(&prop, 0);
  printf("%s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);
  cudaEvent_t a, b, c; cudaEventCreate(&a); cudaEventCreate(&b); cudaEventCreate(&c);
  auto flush_l2 = [&]() { consume<<<sms * 4, 256>>>((const uint4*)flush, flush_bytes / 16, sink); };
  auto time_consume = [&](size_t bytes) {
    cudaEventRecord(a);
    consume<<<sms * 4, 256>>>((const uint4*)buf, bytes / 16, sink);
    cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); return ms * 1000.f;
  };
  // Baselines: cold and warm reads of 8, 16 and 32 MB; a full 512 MB read (HBM rate).
  for (size_t mb : {8, 16, 32}) {
    size_t bytes = mb << 20; float cold = 0, warm = 0;
    for (int r = 0; r < 5; ++r) { flush_l2(); cold += time_consume(bytes); warm += time_consume(bytes); }
    printf("consume %zu MB: cold %.1f us (%.2f TB/s), warm %.1f us (%.2f TB/s)\n", mb, cold / 5, bytes / (cold / 5) / 1e6,
           warm / 5, bytes / (warm / 5) / 1e6);
  }
  { flush_l2(); float t = time_consume(big); printf("consume 512 MB: %.1f us (%.2f TB/s)\n", t, big / t / 1e6); }
  // Prefetch 16 MB with `blocks` blocks of 128 threads, spin `delay` us, then consume it.
  const size_t bytes = 16ull << 20;
  for (int mode : {0, 1, 2}) {
    for (int blocks : {1, 2, 4, 8, 16, 32, 132}) {
      printf("mode %d blocks %3d:", mode, blocks);
      for (int delay_us : {0, 2, 4, 8, 16, 32, 64}) {
        float t = 0, tp = 0;
        for (int r = 0; r < 3; ++r) {
          flush_l2();
          cudaEventRecord(c);
          prefetcher<<<blocks, 128>>>(buf, bytes, mode, 16384, delay_us * 1000ll);
          cudaEventRecord(a);
          consume<<<sms * 4, 256>>>((const uint4*)buf, bytes / 16, sink);
          cudaEventRecord(b); cudaEventSynchronize(b);
          float ms, ms2; cudaEventElapsedTime(&ms, a, b); cudaEventElapsedTime(&ms2, c, a);
          t += ms * 1000.f; tp += ms2 * 1000.f;
        }
        printf("  d%d: %.1f (pf %.1f)", delay_us, t / 3, tp / 3);
      }
      printf("\n");
    }
  }
  CK(cudaGetLastError());
  return 0;
}
