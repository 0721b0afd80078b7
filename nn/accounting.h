#pragma once
// Parameter count, FLOPs per token and KV-cache bytes per token of a config (nanoGPT/PaLM-style
// estimates, with K and V projections scaled by KV/H).
#include "nn/config.h"

namespace tapelm {

struct ModelCost {
  int64_t params;                 // a tied head counted once
  double forward_flops_per_token;  // matmuls (2 per multiply-add) + attention 4·T·d per layer
  double train_flops_per_token;    // 3 × forward (backward is twice the forward)
  int64_t kv_cache_bytes_per_token;  // float32 K and V of every layer
};

/// Costs at context length T (default: block_size).
ModelCost model_cost(const GPTConfig& c, int64_t T = 0);

}  // namespace tapelm
