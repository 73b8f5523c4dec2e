#include "models/blocks/token_embeddings.h"

#include "quant/load_weight.h"

namespace mere {

TokenEmbeddings load_token_embeddings(const Checkpoint& checkpoint, int64_t vocab, int64_t d_model, bool tied,
                                      const QuantizationConfig& quant, Device device) {
  TokenEmbeddings t;
  t.embed = load_weight(checkpoint, "model.embed_tokens", {vocab, d_model}, "vocab_size, hidden_size", quant)
                .to_device(device);
  t.final_norm = checkpoint.get("model.norm.weight", {d_model}, "hidden_size").to_device(device);
  if (tied) {
    t.lm_head = t.embed;
    if (checkpoint.has("lm_head.weight")) load_weight(checkpoint, "lm_head", {vocab, d_model}, "tied copy, unused", quant);
  } else {
    t.lm_head = load_weight(checkpoint, "lm_head", {vocab, d_model}, "vocab_size, hidden_size", quant).to_device(device);
  }
  return t;
}

}  // namespace mere
