// The input embedding, the final norm and the output head every decoder
// family stores as model.embed_tokens, model.norm and lm_head (tied to the
// embedding when the config says so), and their loader.
#pragma once

#include "io/checkpoint.h"
#include "ops/weight.h"
#include "quant/quant_config.h"

namespace mere {

struct TokenEmbeddings {
  Weight embed;       // [vocab, d_model]
  Weight lm_head;     // [vocab, d_model]; the embedding itself when tied
  Tensor final_norm;  // [d_model]
};

// Reads them onto `device`; a tied checkpoint's stored lm_head copy is read and dropped.
TokenEmbeddings load_token_embeddings(const Checkpoint& checkpoint, int64_t vocab, int64_t d_model, bool tied,
                                      const QuantizationConfig& quant, Device device);

}  // namespace mere
