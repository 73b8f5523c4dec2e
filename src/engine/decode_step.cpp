#include "engine/decode_step.h"

#include "ops/ops.h"

namespace mere {

DecodeStep::DecodeStep(const Model& model, SeqState& state, DeviceSampler& sampler, bool use_graph)
    : model_(model), state_(state), sampler_(sampler), use_graph_(use_graph) {
  MERE_CHECK(model.info().device == Device::cuda, "device decoding needs a model on the GPU");
  Tensor buffer = Tensor::zeros({2}, DType::i32, Device::cuda);
  token_ = buffer.slice_rows(0, 1);
  pos_ = buffer.slice_rows(1, 2);
  host_slots_ = pinned_alloc((kSlots + 1) * sizeof(int32_t));
  if (use_graph_) state_.reserve(state_.capacity());
}

void DecodeStep::set_device_position(int64_t position) {
  auto* staged = static_cast<int32_t*>(host_slots_.get()) + kSlots;
  device_synchronize();  // the previous upload from this slot has finished
  *staged = int32_t(position);
  copy_to_device_async(pos_.raw(), staged, sizeof(int32_t));
}

int DecodeStep::ticket_for_slot() {
  const int ticket = next_ticket_++;
  copy_to_host_async(static_cast<int32_t*>(host_slots_.get()) + ticket % kSlots, token_.raw(), sizeof(int32_t));
  ready_[size_t(ticket % kSlots)].record();
  return ticket;
}

int DecodeStep::begin(const Tensor& prefill_logits) {
  sampler_.sample(prefill_logits, token_.data<int32_t>());
  set_device_position(state_.length());
  return ticket_for_slot();
}

void DecodeStep::run_step() {
  Tensor logits = model_.run(token_, pos_, state_, /*all_logits=*/false);
  sampler_.sample(logits, token_.data<int32_t>());
  ops::advance_position(pos_, 1);
}

int DecodeStep::queue() {
  MERE_CHECK(state_.length() < state_.capacity(), "context is full: the cache holds {} tokens", state_.capacity());
  if (!use_graph_) {
    state_.reserve(state_.length() + 1);
    run_step();
    ++eager_steps_;
  } else if (!graph_.is_captured()) {
    // Run the first step eagerly (it also warms the allocator with the step's
    // block sizes), then capture the same call for every later step.
    run_step();
    graph_.capture([&] { run_step(); });
    ++captures_;
  } else {
    graph_.replay();
    ++replays_;
  }
  state_.advance(1);
  return ticket_for_slot();
}

int32_t DecodeStep::wait(int ticket) {
  MERE_CHECK(ticket >= next_ticket_ - kSlots && ticket < next_ticket_, "DecodeStep: ticket {} is no longer held",
             ticket);
  ready_[size_t(ticket % kSlots)].synchronize();
  return static_cast<int32_t*>(host_slots_.get())[ticket % kSlots];
}

void DecodeStep::roll_back(int64_t n) {
  if (n <= 0) return;
  device_synchronize();
  state_.truncate(state_.length() - n);
  set_device_position(state_.length());
}

}  // namespace mere
