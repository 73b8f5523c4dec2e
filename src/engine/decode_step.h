// One decode step on the GPU, with nothing on the host in between: forward the
// tokens in device memory at the position in device memory, sample the next
// tokens into the same slots (DeviceSampler), move the position on. With the
// cuda_graphs lever the three are captured once and each step is one graph replay.
// The host reads tokens through a small ring of pinned slots and events, so it
// can queue step k + 1 before it has looked at tokens k (pipelined decoding).
// The slots are indexed by the tokens' position; with lever kernel_token_slots
// the step's last kernel writes them there itself, instead of a copy queued
// between graph replays.
//
// A step drives B sequences at one offset (same-offset batching): B token slots,
// one shared position, one forward over B rows, the sampler's B rows. B = 1 is
// the single-sequence step; it is the same code. The graph is captured for this
// step's states (their count and identity, their caches' addresses): another
// batch makes another DecodeStep. A kernel may take another form as the context
// grows (lever wide_attention_blocks): each graph serves the key counts its
// launches said they hold for (ops::decode_keys_range), and a step outside them
// captures one more.
#pragma once

#include <array>
#include <memory>
#include <span>
#include <vector>

#include "core/device.h"
#include "models/model.h"
#include "ops/ops.h"
#include "sampling/device_sampler.h"

namespace mere {

class DecodeStep {
 public:
  // `states` all hold the same number of tokens; `sampler` has one row per state.
  // Reserves every cache row up front when graphs are on: a graph bakes in the cache's addresses.
  DecodeStep(const Model& model, std::span<SeqState* const> states, DeviceSampler& sampler, bool use_graph,
             bool kernel_token_slots = false);
  DecodeStep(const Model& model, SeqState& state, DeviceSampler& sampler, bool use_graph,
             bool kernel_token_slots = false)
      : DecodeStep(model, std::span<SeqState* const>(std::array<SeqState*, 1>{&state}), sampler, use_graph,
                   kernel_token_slots) {}

  // Samples the first tokens from the prefill's last logits (f32 [B, vocab] on
  // the GPU, row b for state b) into the token slots, and puts the device
  // position at the states' length. Returns its ticket.
  int begin(const Tensor& prefill_logits);
  // Queues one step: forwards the tokens in the slots at the states' length,
  // samples the next ones into the slots, advances the states. Returns the new tokens' ticket.
  int queue();
  // Waits for a ticket's tokens (queued at most kSlots - 1 tickets ago) and
  // returns them, one per state; they stay valid until kSlots - 1 more tickets are issued.
  std::span<const int32_t> wait_all(int ticket);
  // The same for a step of one sequence.
  int32_t wait(int ticket);
  // Forgets the last n positions (steps queued past a stop) of every state: the
  // states and the device position move back, and their tickets are no longer
  // held. Waits for the queued work first.
  void roll_back(int64_t n);

  static constexpr int kSlots = 4;
  int64_t batch() const { return int64_t(states_.size()); }
  int64_t length() const { return states_.front()->length(); }
  int64_t capacity() const { return capacity_; }
  int64_t captures() const { return captures_; }  // graphs captured, one per form
  int64_t replays() const { return replays_; }
  int64_t eager_steps() const { return eager_steps_; }
  int64_t token_copies() const { return token_copies_; }  // device-to-host copies of tokens queued

 private:
  int32_t* host_slot(int64_t position) const;  // B pinned tokens, those of one position
  // Records the event of the tokens at the states' length, after copying them
  // to their pinned slots unless a kernel wrote them there (in_slots).
  int ticket_for_slot(bool in_slots);
  void set_device_position(int64_t position);
  void run_step();  // forward, sample, advance position: what a graph captures

  const Model& model_;
  std::vector<SeqState*> states_;
  DeviceSampler& sampler_;
  bool use_graph_;
  bool kernel_token_slots_;
  int64_t capacity_ = 0;               // the smallest state's: a step needs room in every one
  Tensor tokens_, pos_;                // device i32 [B] and [1]
  std::shared_ptr<void> host_slots_;   // pinned i32 [kSlots * B + 1]: tokens by position % kSlots, then the position to upload
  int32_t* device_slots_ = nullptr;    // host_slots_ as kernels address it (kernel_token_slots)
  std::array<CudaEvent, kSlots> ready_;
  std::array<int64_t, kSlots> ticket_position_{};  // the position whose tokens a held ticket waits for
  static constexpr int64_t kRolledBack = -1;
  int next_ticket_ = 0;
  struct Graph {
    ops::KeyCountRange keys;  // the steps' key counts it serves
    CudaGraph graph;
  };
  std::vector<std::unique_ptr<Graph>> graphs_;
  int64_t captures_ = 0, replays_ = 0, eager_steps_ = 0, token_copies_ = 0;
};

}  // namespace mere
