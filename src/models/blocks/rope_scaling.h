// RoPE frequencies from config.json, in both layouts: rope_theta + rope_scaling
// (most published checkpoints) and rope_parameters (transformers 5).
// Reference: transformers modeling_rope_utils.py (ROPE_INIT_FUNCTIONS).
#pragma once

#include "io/config.h"
#include "ops/ops.h"

namespace mere {

// Types: default, linear, llama3, yarn. Others are refused with a clear error.
ops::RopeTable rope_table_from_config(const ConfigJson& config, int head_dim);

}  // namespace mere
