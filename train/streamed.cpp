#include "train/streamed.h"

#include "autograd/ops.h"

namespace tapelm {

StreamedModel::StreamedModel(const formats::OpenedModel& m) : m_(m) {
  const GPTConfig& c = m.config;
  for (const auto& [name, shape] : parameter_shapes(c))
    if (name.rfind("blocks.", 0) != 0) outer_.emplace(name, Tensor::empty(shape));
  m.read(outer_);
  ln_f_ = std::make_shared<Norm>(c.n_embd, c.norm, c.bias, c.norm_eps);
  ln_f_->weight.val() = outer_.at("ln_f.weight");
  if (ln_f_->bias.defined()) ln_f_->bias.val() = outer_.at("ln_f.bias");
}

Tensor StreamedModel::embed(const Index& idx) const {
  if (outer_.empty()) throw Error(ErrorKind::internal, "StreamedModel::embed after drop_outer");
  const int64_t T = idx.shape.at(1);
  if (T > m_.config.block_size)
    throw Error(ErrorKind::shape, "gpt: sequence of " + std::to_string(T) + " positions exceeds block_size " +
                                      std::to_string(m_.config.block_size));
  Var x = embedding(Var(outer_.at("wte.weight")), idx);
  if (m_.config.pos == PosKind::Learned) x = add(x, slice(Var(outer_.at("wpe.weight")), 0, 0, T));
  return x.val();
}

void StreamedModel::for_each_block(const std::function<void(const Block&, int64_t)>& f) const {
  const auto dropout_rng = std::make_shared<Rng>(0);
  for (int64_t l = 0; l < m_.config.n_layer; l++) {
    Block blk(m_.config, dropout_rng);
    blk.eval();
    const std::string prefix = "blocks." + std::to_string(l) + ".";
    formats::TensorMap mine;
    for (const auto& [n, p] : blk.named_parameters()) mine.emplace(prefix + n, p.val());
    m_.read(mine);
    f(blk, l);
  }
}

Var StreamedModel::logits(const Tensor& x) const {
  if (outer_.empty()) throw Error(ErrorKind::internal, "StreamedModel::logits after drop_outer");
  const Tensor& head = m_.config.tie_embeddings ? outer_.at("wte.weight") : outer_.at("lm_head.weight");
  return linear(ln_f_->forward(Var(x)), Var(head));
}

}  // namespace tapelm
