#include "engine/decode_graph.h"

namespace mere {

DecodeGraph::DecodeGraph(const Model& model, SeqState& state) : model_(model), state_(state) {
  MERE_CHECK(model.info().device == Device::cuda, "CUDA graphs need a model on the GPU");
  Tensor buffer = Tensor::zeros({2}, DType::i32, Device::cuda);
  ids_ = buffer.slice_rows(0, 1);
  pos_ = buffer.slice_rows(1, 2);
  staging_ = pinned_alloc(2 * sizeof(int32_t));
  state_.reserve(state_.capacity());
}

Tensor DecodeGraph::step(int32_t token) {
  MERE_CHECK(state_.length() < state_.capacity(), "context is full: the cache holds {} tokens", state_.capacity());
  // The previous step's copy has finished: its logits were read before this call.
  auto* staged = static_cast<int32_t*>(staging_.get());
  staged[0] = token;
  staged[1] = int32_t(state_.length());
  copy_to_device_async(ids_.raw(), staged, 2 * sizeof(int32_t));
  Tensor logits;
  if (!graph_.is_captured()) {
    // Run once eagerly (this step's result, and it warms the allocator), then
    // capture the same call for every later step.
    logits = model_.run(ids_, pos_, state_, /*all_logits=*/false);
    graph_.capture([&] { logits_ = model_.run(ids_, pos_, state_, false); });
    ++captures_;
  } else {
    graph_.replay();
    logits = logits_;
    ++replays_;
  }
  state_.advance(1);
  return logits;
}

}  // namespace mere
