#pragma once
// KV heads where each layer needs them: given a budget of key/value heads summed over the layers
// (e.g. that of uniform GQA-2, 2·L), the counts per layer that cost the model least. A layer's
// cost at count g is measured, not modelled: the loss on the calibration windows (next-token
// cross-entropy) with that layer alone converted to g heads by the method, less the source's
// loss. The allocation minimises the summed cost under the budget exactly (dynamic programming
// over the layers), treating the layers' costs as additive. (On the tiny study's model, the
// measured costs picked the best of the 13 allocations that spend GQA-2's budget, for mean pooling and
// aligned-fit alike; the fit's calibrated residual per layer, tried first, picked uniform for
// aligned-fit and a worse than uniform one for mean: docs/guide/uptraining.md.)
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "nn/gpt.h"
#include "train/study/convert/calibrate.h"
#include "train/study/convert/methods.h"

namespace tapelm {

/// A model's loss on the calibration windows (convert_model.h's next_token_loss: eval mode, the
/// windows' next tokens).
using ModelLoss = std::function<double(GPT&)>;

/// Per layer, the cost of each count dividing its kv heads (its own count: 0): the loss of src
/// with that layer alone converted by v (calibrated by `calib` when v needs it), less src's own.
/// A fresh method (random init) is a usage Error: nothing to place heads by.
std::vector<std::map<int64_t, double>> layer_costs(GPT& src, const Variant& v, const Calibration* calib, const ModelLoss& loss);

/// The counts per layer, one of each layer's candidates, summing to at most `budget`, of least
/// total cost (ties broken alike every time: at each layer, the most heads). A budget below the
/// fewest heads the candidates allow or above the most is a usage Error naming both.
std::vector<int64_t> allocate_kv_heads(const std::vector<std::map<int64_t, double>>& costs, int64_t budget);

/// A budget a model of config c can take: from one head per layer to all it has; else the usage
/// Error allocate_kv_heads gives (checked before any work).
void check_kv_budget(const GPTConfig& c, int64_t budget);

/// The allocation for converting src by v under the budget: layer_costs, then allocate_kv_heads.
std::vector<int64_t> kv_budget_heads(GPT& src, int64_t budget, const Variant& v, const Calibration* calib, const ModelLoss& loss);

}  // namespace tapelm
