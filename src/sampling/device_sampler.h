// Sampling on the GPU: logits in device memory in, a token id in device memory
// out, so the decode loop (one CUDA graph per step) never copies logits to the
// host. Same rule, seed scheme and tokens as Sampler (sampler.h); the penalty
// state (which tokens are present) and the draw counter live on the device.
// A sampler of several rows samples a batch (one row per sequence) in one
// launch; each row has its own penalty state and draw counter, so a row gets the
// tokens its sequence would get with a sampler of its own.
#pragma once

#include <cstdint>
#include <vector>

#include "sampling/sampler.h"

namespace mere {

class Tensor;

class DeviceSampler {
 public:
  // Allocates the device state: per row a presence flag per token and a draw counter.
  DeviceSampler(const SamplingParams& params, int64_t vocab, int64_t rows = 1);
  ~DeviceSampler();
  DeviceSampler(const DeviceSampler&) = delete;
  DeviceSampler& operator=(const DeviceSampler&) = delete;

  // Sets the penalty state from the tokens already in the context (the prompt)
  // and the draw counter to 0, for every row. Synchronous; not for graph capture.
  void reset(const std::vector<int32_t>& context);
  // The same with one context per row (contexts.size() == rows()).
  void reset(const std::vector<std::vector<int32_t>>& contexts);
  // Queues on the compute stream the sampling of logits (f32 [rows, vocab] on
  // the GPU, or [vocab] for one row) and writes row r's token to out_ids[r]
  // (device memory); the same kernel marks the token present and advances the
  // row's draw counter, so the call can be captured once in a CudaGraph and
  // replayed every step. No host synchronisation, no allocation.
  void sample(const Tensor& logits, int32_t* out_ids);
  // Draws row `row` made since reset (reads the device counter: synchronises).
  int64_t draws(int64_t row = 0) const;

  const SamplingParams& params() const { return params_; }
  int64_t vocab() const { return vocab_; }
  int64_t rows() const { return rows_; }

 private:
  SamplingParams params_;
  int64_t vocab_, rows_;
  int per_thread_ = 0;      // logits each thread of the kernel holds
  void* state_ = nullptr;   // device: uint64 draws[rows], then uint8 present[rows][vocab]
};

}  // namespace mere

#ifdef MERE_HAVE_CUDA
#include <cuda_runtime.h>

// The kernel side (device_sampler.cu): raw pointers and numbers only.
namespace mere::cuda {

struct SampleArgs {
  const float* logits;         // [rows, vocab]
  int64_t vocab;
  int64_t rows;
  int per_thread;
  uint8_t* present;            // [rows, vocab]
  uint64_t* draws;             // [rows]
  int32_t* out_id;             // [rows]
  SamplingParams params;
};

// Logits per thread for this vocab (0 when it is too large), after raising the
// kernel's shared-memory limit to match.
cudaError_t prepare_sample_kernel(int64_t vocab, int* per_thread);
cudaError_t launch_sample(const SampleArgs& args, cudaStream_t stream);

}  // namespace mere::cuda
#endif
