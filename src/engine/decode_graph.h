// One decode step as a CUDA graph. The token id and position live in device
// memory: each step the host writes them (pinned memory, an async copy on the
// compute stream) and replays the graph captured on the first step.
#pragma once

#include <memory>

#include "core/device.h"
#include "models/model.h"

namespace mere {

class DecodeGraph {
 public:
  // Reserves every cache row up front: the graph bakes in the cache's addresses.
  DecodeGraph(const Model& model, SeqState& state);

  // Runs `token` at state.length() and advances the state. Returns the logits
  // [1, vocab] on the device, valid until the next step.
  Tensor step(int32_t token);

  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }

 private:
  const Model& model_;
  SeqState& state_;
  Tensor ids_, pos_;              // device i32 [1] each, views of one buffer
  std::shared_ptr<void> staging_; // pinned host [token, position]
  CudaGraph graph_;
  Tensor logits_;                 // the graph's output
  int64_t captures_ = 0, replays_ = 0;
};

}  // namespace mere
