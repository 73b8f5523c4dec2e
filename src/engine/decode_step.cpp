#include "engine/decode_step.h"

#include <algorithm>

#include "ops/ops.h"

namespace mere {

DecodeStep::DecodeStep(const Model& model, std::span<SeqState* const> states, DeviceSampler& sampler, bool use_graph,
                       bool kernel_token_slots)
    : model_(model),
      states_(states.begin(), states.end()),
      sampler_(sampler),
      use_graph_(use_graph),
      kernel_token_slots_(kernel_token_slots) {
  MERE_CHECK(model.info().device == Device::cuda, "device decoding needs a model on the GPU");
  MERE_CHECK(!states_.empty(), "DecodeStep: no sequences");
  MERE_CHECK(sampler.rows() == batch(), "DecodeStep: the sampler has {} rows for {} sequences", sampler.rows(),
             batch());
  capacity_ = states_.front()->capacity();
  for (SeqState* s : states_) {
    MERE_CHECK(s->length() == length(), "DecodeStep: sequences at {} and {} tokens; a batch shares one offset",
               length(), s->length());
    capacity_ = std::min(capacity_, s->capacity());
  }
  const int64_t B = batch();
  Tensor buffer = Tensor::zeros({B + 1}, DType::i32, Device::cuda);
  tokens_ = buffer.slice_rows(0, B);
  pos_ = buffer.slice_rows(B, B + 1);
  host_slots_ = pinned_alloc(size_t(kSlots * B + 1) * sizeof(int32_t));
  if (kernel_token_slots_) device_slots_ = static_cast<int32_t*>(pinned_device_address(host_slots_.get()));
  if (use_graph_)
    for (SeqState* s : states_) s->reserve(s->capacity());
}

int32_t* DecodeStep::host_slot(int64_t position) const {
  return static_cast<int32_t*>(host_slots_.get()) + (position % kSlots) * batch();
}

void DecodeStep::set_device_position(int64_t position) {
  auto* staged = static_cast<int32_t*>(host_slots_.get()) + kSlots * batch();
  device_synchronize();  // the previous upload from this slot has finished
  *staged = int32_t(position);
  copy_to_device_async(pos_.raw(), staged, sizeof(int32_t));
}

int DecodeStep::ticket_for_slot(bool in_slots) {
  const int ticket = next_ticket_++;
  const int64_t position = length();
  if (!in_slots) {
    copy_to_host_async(host_slot(position), tokens_.raw(), size_t(batch()) * sizeof(int32_t));
    ++token_copies_;
  }
  ticket_position_[size_t(ticket % kSlots)] = position;
  ready_[size_t(ticket % kSlots)].record();
  return ticket;
}

int DecodeStep::begin(const Tensor& prefill_logits) {
  sampler_.sample(prefill_logits, tokens_.data<int32_t>());
  set_device_position(length());
  return ticket_for_slot(/*in_slots=*/false);
}

void DecodeStep::run_step() {
  ops::set_decode_keys(length() + 1);
  ops::set_cached_rows_final(true);  // see advance_position, the step's last kernel
  Tensor logits = model_.run(tokens_, pos_, states_, /*all_logits=*/false);  // [B, vocab]
  sampler_.sample(logits, tokens_.data<int32_t>());
  if (kernel_token_slots_)  // the new tokens, at the position it moves to
    ops::advance_position(pos_, 1, tokens_, device_slots_, kSlots);
  else
    ops::advance_position(pos_, 1);
}

int DecodeStep::queue() {
  MERE_CHECK(length() < capacity_, "context is full: the cache holds {} tokens", capacity_);
  // run_step says its key count to the launches; what runs next (a prefill) is
  // not this step, even when this one throws.
  struct ForgetKeys {
    ~ForgetKeys() {
      ops::set_decode_keys(0);
      ops::set_cached_rows_final(false);
    }
  } forget_keys;
  if (!use_graph_) {
    for (SeqState* s : states_) s->reserve(s->length() + 1);
    run_step();
    ++eager_steps_;
  } else {
    const int64_t keys = length() + 1;
    auto served = std::find_if(graphs_.begin(), graphs_.end(), [&](const auto& g) { return g->keys.holds(keys); });
    if (served != graphs_.end()) {
      (*served)->graph.replay();
      ++replays_;
    } else {
      // Run the step eagerly (it also warms the allocator with the step's block
      // sizes), then capture the same call for the later steps its forms serve.
      run_step();
      auto g = std::make_unique<Graph>();
      g->graph.capture([&] { run_step(); });
      g->keys = ops::decode_keys_range();
      graphs_.push_back(std::move(g));
      ++captures_;
    }
  }
  for (SeqState* s : states_) s->advance(1);
  return ticket_for_slot(/*in_slots=*/kernel_token_slots_);
}

std::span<const int32_t> DecodeStep::wait_all(int ticket) {
  MERE_CHECK(ticket >= next_ticket_ - kSlots && ticket < next_ticket_, "DecodeStep: ticket {} is no longer held",
             ticket);
  const int64_t position = ticket_position_[size_t(ticket % kSlots)];
  MERE_CHECK(position != kRolledBack, "DecodeStep: ticket {} was rolled back", ticket);
  ready_[size_t(ticket % kSlots)].synchronize();
  return {host_slot(position), size_t(batch())};
}

int32_t DecodeStep::wait(int ticket) {
  MERE_ASSERT(batch() == 1);
  return wait_all(ticket)[0];
}

void DecodeStep::roll_back(int64_t n) {
  if (n <= 0) return;
  device_synchronize();
  for (SeqState* s : states_) s->truncate(s->length() - n);
  for (int64_t& position : ticket_position_)  // their slots will hold other steps' tokens
    if (position > length()) position = kRolledBack;
  set_device_position(length());
}

}  // namespace mere
