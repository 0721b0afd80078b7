#pragma once
// MHA -> GQA/MQA conversion (SPEC.md §4; Ainslie et al. 2023, §2.1): groups of kv heads become
// one head. The paper's methods: the mean of the group's wk/wv row blocks (and biases), the
// group's first head, or a fresh random init. Beyond them:
//   mean-norm  mean pooling, each pooled head rescaled to the average norm of its members;
//   aligned    the members rotated onto a common reference first (generalised Procrustes on
//              calibration activations, folded into wq/wk and wv/wo so the MHA model is
//              unchanged; Jin et al. 2024, arXiv 2412.20677), then mean pooling;
//   fit        the merged wk and wv that change the members' attention scores and outputs least
//              on calibration inputs (a closed-form weighted mean with head_dim × head_dim weights);
//   aligned-fit  the alignment folded in first, then fit: the rotated query heads and output
//              slices give the least-squares merge more to work with.
// Grouping: contiguous (head g·r … (g+1)·r−1) or similar (heads with alike aligned K/V
// activations, found by a swap search and made contiguous by a function-preserving permutation).
// Everything but the attention weights is copied.
#include <memory>
#include <string>
#include <vector>

#include "autograd/error.h"
#include "data/shards.h"
#include "nn/gpt.h"
#include "train/convert/linalg.h"

namespace tapelm {

enum class ConvertMethod { Mean, First, Random, MeanNorm, Aligned, Fit, AlignedFit };
enum class Grouping { Contiguous, Similar };

/// "mean" | "first" | "random" | "mean-norm" | "aligned" | "fit" | "aligned-fit", else a usage Error naming the value.
ConvertMethod parse_convert_method(const std::string& s);
std::string to_string(ConvertMethod m);
/// Every method, in the order the study reports them.
std::vector<std::string> convert_method_names();
/// "contiguous" | "similar", else a usage Error naming the value.
Grouping parse_grouping(const std::string& s);
std::string to_string(Grouping g);
/// True when the method or grouping reads calibration activations.
bool needs_calibration(ConvertMethod m, Grouping g);

/// Second moments of every layer's attention input on calibration tokens: per layer the mean over
/// tokens of x̃ x̃ᵀ with x̃ = [ln1(x); 1] ((d+1) × (d+1); the 1 carries the biases). Every
/// quantity the methods need — Gram matrices of K, V and Q activations of any heads — is
/// W̃_a Σ W̃_bᵀ for row blocks W̃ = [W | b] of the projections, so this is all they keep.
struct Calibration {
  std::vector<la::Mat> gram;
  int64_t tokens = 0;
};

/// Runs the model (eval mode, no tape) on the batches of ids and accumulates the layers' Σ.
Calibration calibrate(GPT& model, const std::vector<Index>& batches);

/// `tokens` tokens of `ids` as windows of T at seeded random starts, batches of up to 32 windows.
/// Data shorter than one window or than `tokens` -> a data Error naming `what`.
std::vector<Index> calibration_batches(const TokenSeq& ids, int64_t T, int64_t tokens, uint64_t seed,
                                       const std::string& what);

struct ConvertOptions {
  ConvertMethod method = ConvertMethod::Mean;
  Grouping grouping = Grouping::Contiguous;
  uint64_t seed = 0;                   // random init
  const Calibration* calib = nullptr;  // required when needs_calibration(method, grouping)
};

/// A new model with n_kv_head = G; G must divide the source's n_kv_head.
std::unique_ptr<GPT> convert_kv_heads(const GPT& src, int64_t G, const ConvertOptions& o);
/// The paper's methods with contiguous groups (no calibration).
std::unique_ptr<GPT> convert_kv_heads(const GPT& src, int64_t G, ConvertMethod method, uint64_t seed = 0);

// The function-preserving steps, exposed for their tests. `model` keeps its shape and, up to
// rounding, its outputs.

/// Rotates every kv head of each group of `rep` consecutive kv heads onto the group's common
/// reference (generalised Procrustes on the calibration activations; RoPE models: 2×2 rotations
/// on each RoPE plane of the keys only) and folds the rotations into wq/wk and wv/wo.
void align_kv_heads(GPT& model, int64_t rep, const Calibration& c);

/// The kv-head order of layer `layer` that puts similar heads into the same group of `rep`
/// (swap search on aligned K and V activation distances): perm[new position] = old kv head.
std::vector<int64_t> similar_order(const GPT& model, int64_t layer, int64_t rep, const Calibration& c);

/// Permutes layer `layer`'s kv heads (rows of wk, wv) and with them their query heads (rows of
/// wq, columns of wo): new kv head j is old kv head perm[j].
void permute_kv_heads(GPT& model, int64_t layer, const std::vector<int64_t>& perm);

}  // namespace tapelm
