// Sampling on the GPU: logits in device memory in, a token id in device memory
// out, so the decode loop (one CUDA graph per step) never copies logits to the
// host. Same rule, seed scheme and tokens as Sampler (sampler.h); the penalty
// state (which tokens are present) and the draw counter live on the device.
#pragma once

#include <cstdint>
#include <vector>

#include "sampling/sampler.h"

namespace mere {

class Tensor;

class DeviceSampler {
 public:
  // Allocates the device state: a presence flag per token and the draw counter.
  DeviceSampler(const SamplingParams& params, int64_t vocab);
  ~DeviceSampler();
  DeviceSampler(const DeviceSampler&) = delete;
  DeviceSampler& operator=(const DeviceSampler&) = delete;

  // Sets the penalty state from the tokens already in the context (the prompt)
  // and the draw counter to 0. Synchronous; not for graph capture.
  void reset(const std::vector<int32_t>& context);
  // Queues on the compute stream the sampling of logits (f32 [1, vocab] or
  // [vocab] on the GPU) and writes the token to *out_id (device memory); the
  // same kernel marks the token present and advances the draw counter, so the
  // call can be captured once in a CudaGraph and replayed every step. No host
  // synchronisation, no allocation.
  void sample(const Tensor& logits, int32_t* out_id);
  // Draws made since reset (reads the device counter: synchronises).
  int64_t draws() const;

  const SamplingParams& params() const { return params_; }
  int64_t vocab() const { return vocab_; }

 private:
  SamplingParams params_;
  int64_t vocab_;
  int per_thread_ = 0;      // logits each thread of the kernel holds
  void* state_ = nullptr;   // device: uint64 draws, then uint8 present[vocab]
};

}  // namespace mere

#ifdef MERE_HAVE_CUDA
#include <cuda_runtime.h>

// The kernel side (device_sampler.cu): raw pointers and numbers only.
namespace mere::cuda {

struct SampleArgs {
  const float* logits;         // [vocab]
  int64_t vocab;
  int per_thread;
  uint8_t* present;            // [vocab]
  uint64_t* draws;
  int32_t* out_id;
  SamplingParams params;
};

// Logits per thread for this vocab (0 when it is too large), after raising the
// kernel's shared-memory limit to match.
cudaError_t prepare_sample_kernel(int64_t vocab, int* per_thread);
cudaError_t launch_sample(const SampleArgs& args, cudaStream_t stream);

}  // namespace mere::cuda
#endif
