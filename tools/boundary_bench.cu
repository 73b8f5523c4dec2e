// What a dependent step costs between two decode kernels, against a barrier
// inside one persistent kernel: the measurement behind the choice of a
// persistent decode-layer kernel (issue 6, docs/benchmarks.md).
//
// 1. A chain of kernels in a CUDA graph with programmatic launch, as the
//    decode step runs: each waits for the one before, reads the value it
//    wrote and writes the next (one thread), with `blocks` blocks of 256.
// 2. One cooperative kernel of `blocks` blocks doing the same steps, a grid
//    barrier (a monotonic arrival counter, release/acquire) between steps.
// Build and run on the GPU machine:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a tools/boundary_bench.cu -o /tmp/boundary_bench
//   /tmp/boundary_bench
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                                               \
  do {                                                                                            \
    cudaError_t e = (call);                                                                       \
    if (e != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e));             \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

__global__ void chained_step(int* value) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (blockIdx.x == 0 && threadIdx.x == 0) value[0] = value[0] + 1;
}

__device__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__global__ void persistent_steps(int* value, unsigned* arrived, int steps) {
  for (int i = 0; i < steps; ++i) {
    if (blockIdx.x == 0 && threadIdx.x == 0) value[0] = value[0] + 1;
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(arrived, 1u);
      const unsigned target = unsigned(i + 1) * gridDim.x;
      while (load_acquire(arrived) < target) {
      }
    }
    __syncthreads();
  }
}

// Microseconds per step of a graph of `steps` chained kernels.
float chain_us(int blocks, int steps, int* value, cudaStream_t stream) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(256);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < steps; ++i) CHECK(cudaLaunchKernelEx(&config, chained_step, value));
  CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, stream));  // warm-up
  cudaEvent_t begin, end;
  CHECK(cudaEventCreate(&begin));
  CHECK(cudaEventCreate(&end));
  CHECK(cudaEventRecord(begin, stream));
  CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaEventRecord(end, stream));
  CHECK(cudaEventSynchronize(end));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, begin, end));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return ms * 1000.0f / float(steps);
}

float persistent_us(int blocks, int steps, int* value, unsigned* arrived, cudaStream_t stream) {
  void* args[] = {&value, &arrived, &steps};
  cudaEvent_t begin, end;
  CHECK(cudaEventCreate(&begin));
  CHECK(cudaEventCreate(&end));
  float ms = 0;
  for (int round = 0; round < 2; ++round) {  // the first is a warm-up
    CHECK(cudaMemsetAsync(arrived, 0, sizeof(unsigned), stream));
    CHECK(cudaEventRecord(begin, stream));
    CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(persistent_steps), dim3(blocks), dim3(256), args, 0,
                                      stream));
    CHECK(cudaEventRecord(end, stream));
    CHECK(cudaEventSynchronize(end));
    CHECK(cudaEventElapsedTime(&ms, begin, end));
  }
  return ms * 1000.0f / float(steps);
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  int* value;
  unsigned* arrived;
  CHECK(cudaMalloc(&value, sizeof(int)));
  CHECK(cudaMalloc(&arrived, sizeof(unsigned)));
  CHECK(cudaMemset(value, 0, sizeof(int)));
  const int steps = 2000;
  std::printf("| blocks | chained kernels (graph, programmatic launch) us a step | persistent kernel, grid barrier us a step |\n");
  std::printf("|---|---|---|\n");
  for (int blocks : {2, sms, 2 * sms}) {
    const float chain = chain_us(blocks, steps, value, stream);
    const float barrier = persistent_us(blocks, steps, value, arrived, stream);
    std::printf("| %d | %.2f | %.2f |\n", blocks, chain, barrier);
  }
  int final_value = 0;
  CHECK(cudaMemcpy(&final_value, value, sizeof(int), cudaMemcpyDeviceToHost));
  std::printf("steps counted: %d (expected %d)\n", final_value, 3 * 2 * steps + 3 * 2 * steps);
  return 0;
}
