#pragma once
// MHA -> GQA/MQA conversion (Ainslie et al. 2023, §2.1): groups of kv heads become one head, by a
// method of the table in methods.h. The pipeline, each step as the method's row says:
//   1. similar grouping: permute kv heads so that alike heads are neighbours (heads.h);
//   2. aligns: rotate each group's members onto a common reference (heads.h);
//   3. pool each group's K/V into one, rescaled if the method rescales (merge.h);
//   4. fits: replace the pooled K/V by the least-squares merge (merge.h).
// Steps 1 and 2 preserve the source's function, on a copy of it. Everything but the attention's
// K and V projections is copied (from that copy, so that the rotations stay folded into wq, wo).
#include <memory>
#include <vector>

#include "autograd/error.h"
#include "nn/gpt.h"
#include "train/study/convert/calibrate.h"
#include "train/study/convert/methods.h"

namespace tapelm {

struct ConvertOptions {
  Variant variant;
  uint64_t seed = 0;                   // random init
  const Calibration* calib = nullptr;  // required when conversion_calibrates (calibrate.h)
};

/// The config of src's model converted to G[l] key/value heads in layer l (one count: every
/// layer); a count that does not divide its layer's is a config Error naming the layer.
GPTConfig converted_config(const GPTConfig& src, const std::vector<int64_t>& G);

/// A new model of converted_config(src, G).
std::unique_ptr<GPT> convert_kv_heads(const GPT& src, const std::vector<int64_t>& G, const ConvertOptions& o);
/// Every layer to G kv heads; G must divide the source's n_kv_head.
std::unique_ptr<GPT> convert_kv_heads(const GPT& src, int64_t G, const ConvertOptions& o);

/// One layer of that conversion: `out`, an attention of G kv heads, from `src`, an attention of
/// config c (the layer's: GPTConfig::layer; all else in a block is copied as it is). S: the layer's
/// calibration second moments (null when the variant does not calibrate); rng: the method's random
/// draws, one stream through the layers in order (Rng(seed ^ 0xC0DE)). convert_kv_heads is this on
/// every layer; a conversion that holds one block at a time calls it directly and gets the same
/// bits. Statistics that are not finite, a linear-algebra step that fails on them, and a result
/// that is not finite are data Errors naming `layer` and the variant.
void convert_attention(const Attention& src, const Attention& out, const GPTConfig& c, int64_t G, const Variant& v,
                       const la::Mat* S, Rng& rng, int64_t layer);

}  // namespace tapelm
