#include "train/convert.h"

#include <stdexcept>

namespace tapelm {

ConvertMethod parse_convert_method(const std::string& s) {
  if (s == "mean") return ConvertMethod::Mean;
  if (s == "first") return ConvertMethod::First;
  if (s == "random") return ConvertMethod::Random;
  throw Error(ErrorKind::usage, "unknown conversion method \"" + s + "\" (expected mean, first or random)");
}

std::string to_string(ConvertMethod m) {
  switch (m) {
    case ConvertMethod::Mean: return "mean";
    case ConvertMethod::First: return "first";
    case ConvertMethod::Random: return "random";
  }
  return "?";
}

std::unique_ptr<GPT> convert_kv_heads(const GPT& src, int64_t G, ConvertMethod method, uint64_t seed) {
  const GPTConfig& c = src.config();
  if (G <= 0 || c.n_kv_head % G != 0)
    throw Error(ErrorKind::config, "cannot convert " + std::to_string(c.n_kv_head) + " kv heads to " + std::to_string(G) +
                                ": the new count must divide the old");
  GPTConfig nc = c;
  nc.n_kv_head = G;
  auto out = std::make_unique<GPT>(nc, seed);
  const int64_t rep = c.n_kv_head / G, hd = c.head_dim();
  Rng rng(seed ^ 0xC0DE);
  auto dst_params = out->named_parameters();
  auto src_params = src.named_parameters();
  for (size_t i = 0; i < src_params.size(); i++) {
    const std::string& name = src_params[i].first;
    const Tensor& s = src_params[i].second.val();
    Tensor& d = dst_params[i].second.val();
    const bool kv = name.find(".attn.wk.") != std::string::npos || name.find(".attn.wv.") != std::string::npos;
    if (!kv) {
      d = s.clone();
      continue;
    }
    // Rows are head-major: head h owns rows [h*hd, (h+1)*hd) of the weight (or bias).
    const int64_t cols = s.ndim() == 2 ? s.dim(1) : 1, block = hd * cols;
    d = Tensor::empty(s.ndim() == 2 ? Shape{G * hd, cols} : Shape{G * hd});
    for (int64_t g = 0; g < G; g++) {
      float* o = d.data() + g * block;
      const float* first = s.data() + g * rep * block;
      switch (method) {
        case ConvertMethod::Mean:
          // Sum in head order, then divide: PyTorch's mean over the group axis, to the bit.
          for (int64_t e = 0; e < block; e++) {
            float acc = first[e];
            for (int64_t r = 1; r < rep; r++) acc += first[r * block + e];
            o[e] = acc / static_cast<float>(rep);
          }
          break;
        case ConvertMethod::First:
          std::copy(first, first + block, o);
          break;
        case ConvertMethod::Random:
          for (int64_t e = 0; e < block; e++) o[e] = s.ndim() == 2 ? static_cast<float>(rng.normal() * 0.02) : 0.f;
          break;
      }
    }
  }
  return out;
}

}  // namespace tapelm
