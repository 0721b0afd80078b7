#pragma once
// MHA -> GQA/MQA conversion (SPEC.md §4; Ainslie et al. 2023, §2.1): contiguous groups of kv
// heads become one head, by the mean of their wk/wv row blocks (and biases), the group's first
// head, or a fresh random init. Everything else is copied.
#include <memory>
#include <string>

#include "autograd/error.h"
#include "nn/gpt.h"

namespace tapelm {

enum class ConvertMethod { Mean, First, Random };

/// "mean" | "first" | "random", else std::invalid_argument naming the value.
ConvertMethod parse_convert_method(const std::string& s);
std::string to_string(ConvertMethod m);

/// A new model with n_kv_head = G; G must divide the source's n_kv_head.
std::unique_ptr<GPT> convert_kv_heads(const GPT& src, int64_t G, ConvertMethod method, uint64_t seed = 0);

}  // namespace tapelm
