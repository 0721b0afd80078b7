#pragma once
// Parameter count, FLOPs per token and KV-cache bytes per token of a config (nanoGPT/PaLM-style
// estimates, with K and V projections scaled by KV/H), and the memory check made before a model
// is allocated.
#include <string>

#include "nn/config.h"

namespace tapelm {

struct ModelCost {
  int64_t params;                 // a tied head counted once
  double forward_flops_per_token;  // matmuls (2 per multiply-add) + attention 4·T·d per layer
  double train_flops_per_token;    // 3 × forward (backward is twice the forward)
  int64_t kv_cache_bytes_per_token;  // float32 K and V of every layer
};

/// Costs at context length T (default: block_size). Computed in double, so a config of absurd
/// size gives absurd (saturated) figures rather than an overflow.
ModelCost model_cost(const GPTConfig& c, int64_t T = 0);

/// Bytes of memory available to this process now: /proc/meminfo's MemAvailable, else the
/// physical memory.
double available_memory_bytes();
/// "1.50 GB": a byte count for messages.
std::string byte_size_str(double bytes);
/// Throws a config Error "<what> needs <size>, more than the <size> of memory available" when
/// need > available.
void check_memory(double need, double available, const std::string& what);

}  // namespace tapelm
