#pragma once
// Parameter count, FLOPs per token and KV-cache bytes per token of a config (nanoGPT/PaLM-style
// estimates, with K and V projections scaled by KV/H), and the memory check made before a model
// is allocated.
#include <string>

#include "autograd/quant.h"
#include "nn/config.h"

namespace tapelm {

struct ModelCost {
  int64_t params;                 // a tied head counted once
  double forward_flops_per_token;  // matmuls (2 per multiply-add) + attention 4·T·d per layer
  double train_flops_per_token;    // 3 × forward (backward is twice the forward)
  int64_t kv_cache_bytes_per_token;  // float32 K and V of every layer
  int64_t attention_params;        // the q, k, v and output projections of every layer, biases included
  int64_t kv_params;               // the k and v projections of every layer, biases included
  int64_t matmul_weights;          // weights multiplied per token (the head's included, tied or not)
};

/// Costs at context length T (default: block_size). Computed in double, so a config of absurd
/// size gives absurd (saturated) figures rather than an overflow.
ModelCost model_cost(const GPTConfig& c, int64_t T = 0);
/// K and V of every layer for one token, stored as t (f16/bf16 half of f32, q8 34/128 of it).
int64_t kv_cache_bytes_per_token(const GPTConfig& c, KvType t);

/// Bytes of memory available to this process now: /proc/meminfo's MemAvailable (else the physical
/// memory), lowered to what a cgroup v2 limit (memory.max − memory.current) or an address-space
/// limit (RLIMIT_AS − VmSize) leaves.
double available_memory_bytes();
/// An address-space limit (ulimit -v, prlimit --as) applies: what a file's mapping takes counts
/// against it as an allocation does.
bool address_space_limited();
/// Bytes a no-grad forward of `batch` × T tokens holds at its peak beside the weights and the KV
/// cache (a prefill): one block's activations at a time (residual, norm, q, k, v, attention
/// output, projection: 7 rows of d; the MLP's 3 hidden rows), each thread's attention scratch of
/// one 32-query block, and the last position's logits.
double prefill_bytes(const GPTConfig& c, int64_t batch, int64_t T, int threads);
/// "1.50 GB": a byte count for messages.
std::string byte_size_str(double bytes);
/// Throws a config Error "<what> needs <size>, more than the <size> of memory available" when
/// need > available.
void check_memory(double need, double available, const std::string& what);

}  // namespace tapelm
