// One decode step on the GPU, with nothing on the host in between: forward the
// token in device memory at the position in device memory, sample the next token
// into the same slot (DeviceSampler), move the position on. With the cuda_graphs
// lever the three are captured once and each step is one graph replay.
// The host reads tokens through a small ring of pinned slots and events, so it
// can queue step k + 1 before it has looked at token k (pipelined decoding).
#pragma once

#include <array>
#include <memory>

#include "core/device.h"
#include "models/model.h"
#include "sampling/device_sampler.h"

namespace mere {

class DecodeStep {
 public:
  // Reserves every cache row up front when graphs are on: a graph bakes in the cache's addresses.
  DecodeStep(const Model& model, SeqState& state, DeviceSampler& sampler, bool use_graph);

  // Samples the first token from the prefill's last logits into the token slot,
  // and puts the device position at state.length(). Returns its ticket.
  int begin(const Tensor& prefill_logits);
  // Queues one step: forwards the token in the slot at state.length(), samples
  // the next one into the slot, advances the state. Returns the new token's ticket.
  int queue();
  // Waits for a ticket's token (queued at most kSlots - 1 tickets ago) and returns it.
  int32_t wait(int ticket);
  // Forgets the last n positions (steps queued past a stop): the state and the
  // device position move back. Waits for the queued work first.
  void roll_back(int64_t n);

  static constexpr int kSlots = 4;
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }
  int64_t eager_steps() const { return eager_steps_; }

 private:
  int ticket_for_slot();  // copies the slot to the next pinned slot, records its event
  void set_device_position(int64_t position);
  void run_step();  // forward, sample, advance position: what a graph captures

  const Model& model_;
  SeqState& state_;
  DeviceSampler& sampler_;
  bool use_graph_;
  Tensor token_, pos_;                 // device i32 [1] each
  std::shared_ptr<void> host_slots_;   // pinned i32 [kSlots + 1]: ticket slots, then the position to upload
  std::array<CudaEvent, kSlots> ready_;
  int next_ticket_ = 0;
  CudaGraph graph_;
  int64_t captures_ = 0, replays_ = 0, eager_steps_ = 0;
};

}  // namespace mere
