#include "nn/layers.h"

namespace tapelm {

namespace {
thread_local bool t_unzeroed = false;
}

UnzeroedWeights::UnzeroedWeights() : before_(t_unzeroed) { t_unzeroed = true; }
UnzeroedWeights::~UnzeroedWeights() { t_unzeroed = before_; }

Linear::Linear(int64_t in, int64_t out, bool has_bias) {
  weight = register_parameter("weight", t_unzeroed ? Tensor::empty({out, in}) : Tensor::zeros({out, in}));
  if (has_bias) bias = register_parameter("bias", Tensor::zeros({out}));
}

void Linear::pack(WeightType type, const std::string& what) {
  packed = std::make_shared<const PackedMatrix>(PackedMatrix::pack(weight.val(), type, what));
  weight.val() = Tensor();
}

Embedding::Embedding(int64_t num, int64_t dim) { weight = register_parameter("weight", Tensor::zeros({num, dim})); }

Norm::Norm(int64_t dim, NormKind kind, bool has_bias, double eps)
    : rms_(kind != NormKind::LayerNorm), one_plus_(kind == NormKind::RMSNorm1p), eps_(static_cast<float>(eps)) {
  weight = register_parameter("weight", Tensor::full({dim}, one_plus_ ? 0.f : 1.f));  // a scale of one
  if (has_bias && !rms_) bias = register_parameter("bias", Tensor::zeros({dim}));
}

Var Norm::forward(const Var& x) const {
  if (one_plus_) return rmsnorm(x, add(weight, 1.f), eps_);  // Gemma's: scaled by (1 + w)
  return rms_ ? rmsnorm(x, weight, eps_) : layernorm(x, weight, bias, eps_);
}

Var Dropout::forward(const Var& x) const {
  if (!is_training() || p_ == 0.f) return x;
  return dropout(x, p_, rng_->next_u64());
}

MLP::MLP(const GPTConfig& c)
    : gated_(c.gated()), tanh_(c.mlp == MlpKind::GeluTanh || c.mlp == MlpKind::GeGLU), relu_(c.mlp == MlpKind::Relu) {
  if (gated_) {
    gate = register_module("gate", std::make_shared<Linear>(c.n_embd, c.mlp_hidden, c.bias));
    up = register_module("up", std::make_shared<Linear>(c.n_embd, c.mlp_hidden, c.bias));
    down = register_module("down", std::make_shared<Linear>(c.mlp_hidden, c.n_embd, c.bias));
  } else {
    fc = register_module("fc", std::make_shared<Linear>(c.n_embd, c.mlp_hidden, c.bias));
    proj = register_module("proj", std::make_shared<Linear>(c.mlp_hidden, c.n_embd, c.bias));
  }
}

Var MLP::forward(const Var& x) const {
  // the gate's activation: SiLU (SwiGLU) or the tanh GELU (GeGLU, Gemma's gelu_pytorch_tanh)
  const auto act = [this](const Var& g) { return tanh_ ? gelu(g, true) : silu(g); };
  if (gated_ && gate->packed) return down->forward(mul(act(gate->forward(x)), up->forward(x)));
  if (gated_) {
    const std::vector<Var> gu = linears(x, {gate->weight, up->weight}, {gate->bias, up->bias});
    return down->forward(mul(act(gu[0]), gu[1]));
  }
  const Var h = fc->forward(x);
  return proj->forward(relu_ ? relu(h) : gelu(h, tanh_));
}

Attention::Attention(const GPTConfig& c, std::shared_ptr<Rng> rng)
    : H_(c.n_head), KV_(c.n_kv_head), hd_(c.head_dim()), rot_(c.rope_dims()), rope_(c.pos == PosKind::Rope),
      per_head_norm_(c.qk_norm == QkNorm::head), theta_(c.rope_theta), p_(static_cast<float>(c.dropout)), rng_(std::move(rng)) {
  const bool qkv_bias = c.bias || c.qkv_bias;
  wq = register_module("wq", std::make_shared<Linear>(c.n_embd, H_ * hd_, qkv_bias));
  wk = register_module("wk", std::make_shared<Linear>(c.n_embd, KV_ * hd_, qkv_bias));
  wv = register_module("wv", std::make_shared<Linear>(c.n_embd, KV_ * hd_, qkv_bias));
  wo = register_module("wo", std::make_shared<Linear>(H_ * hd_, c.n_embd, c.bias));
  if (c.qk_norm != QkNorm::none) {
    const bool head = c.qk_norm == QkNorm::head;
    q_norm = register_module("q_norm", std::make_shared<Norm>(head ? hd_ : H_ * hd_, NormKind::RMSNorm, false, c.norm_eps));
    k_norm = register_module("k_norm", std::make_shared<Norm>(head ? hd_ : KV_ * hd_, NormKind::RMSNorm, false, c.norm_eps));
  }
}

void Attention::position(Var& q, Var& k, int64_t pos) const {
  if (q_norm && per_head_norm_) {  // each head's hd values: [B, T, heads, hd]
    const Shape qs = q.shape(), ks = k.shape();
    q = reshape(q_norm->forward(reshape(q, {qs[0], qs[1], H_, hd_})), qs);
    k = reshape(k_norm->forward(reshape(k, {ks[0], ks[1], KV_, hd_})), ks);
  } else if (q_norm) {
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  if (rope_) {
    q = rope(q, H_, pos, theta_, rot_);
    k = rope(k, KV_, pos, theta_, rot_);
  }
}

std::vector<Var> Attention::qkv(const Var& x) const {
  if (wq->packed) return {wq->forward(x), wk->forward(x), wv->forward(x)};
  return linears(x, {wq->weight, wk->weight, wv->weight}, {wq->bias, wk->bias, wv->bias});
}

Var Attention::forward(const Var& x, const Index* key_keep) const {
  const std::vector<Var> p = qkv(x);
  Var q = p[0], k = p[1], v = p[2];
  position(q, k, 0);
  if (kv_round != KvType::f32) {
    k = round_kv(k, KV_, kv_round);
    v = round_kv(v, KV_, kv_round);
  }
  AttentionOptions o;
  o.n_head = H_;
  o.n_kv_head = KV_;
  o.key_keep = key_keep;
  if (is_training() && p_ > 0) {
    o.dropout = p_;
    o.seed = rng_->next_u64();
  }
  return wo->forward(attention(q, k, v, o));
}

Var Attention::forward_cached(const Var& x, LayerCache& cache, int64_t pos) const {
  const std::vector<Var> p = qkv(x);
  Var q = p[0], k = p[1], v = p[2];
  position(q, k, pos);
  return wo->forward(attention_cached(q, k, v, cache.k, cache.v, H_, KV_, pos));
}

Block::Block(const GPTConfig& c, std::shared_ptr<Rng> rng) : parallel_(c.parallel_residual), post_(c.norm_position == NormPosition::post) {
  ln1 = register_module("ln1", std::make_shared<Norm>(c.n_embd, c.norm, c.bias, c.norm_eps));
  attn = register_module("attn", std::make_shared<Attention>(c, rng));
  ln2 = register_module("ln2", std::make_shared<Norm>(c.n_embd, c.norm, c.bias, c.norm_eps));
  mlp = register_module("mlp", std::make_shared<MLP>(c));
  drop = register_module("drop", std::make_shared<Dropout>(c.dropout, rng));
}

Var Block::forward(const Var& x, const Index* key_keep, Tensor* attn_in, Var* attn_out) const {
  if (post_) {  // x + ln1(attn(x)), then + ln2(mlp(that)) (OLMo-2)
    if (attn_in) *attn_in = x.val();
    const Var o = attn->forward(x, key_keep);
    if (attn_out) *attn_out = o;
    const Var h = add(x, drop->forward(ln1->forward(o)));
    return add(h, drop->forward(ln2->forward(mlp->forward(h))));
  }
  Var a = ln1->forward(x);
  if (attn_in) *attn_in = a.val();
  const Var o = attn->forward(a, key_keep);
  if (attn_out) *attn_out = o;
  if (parallel_) return add(add(x, drop->forward(o)), drop->forward(mlp->forward(ln2->forward(x))));
  Var h = add(x, drop->forward(o));
  return add(h, drop->forward(mlp->forward(ln2->forward(h))));
}

std::vector<std::pair<std::string, std::shared_ptr<Linear>>> Block::linears() const {
  std::vector<std::pair<std::string, std::shared_ptr<Linear>>> out{
      {"attn.wq", attn->wq}, {"attn.wk", attn->wk}, {"attn.wv", attn->wv}, {"attn.wo", attn->wo}};
  for (auto [name, lin] : {std::pair{"mlp.fc", mlp->fc}, {"mlp.proj", mlp->proj}, {"mlp.gate", mlp->gate},
                           {"mlp.up", mlp->up}, {"mlp.down", mlp->down}})
    if (lin) out.emplace_back(name, lin);
  return out;
}

Var Block::forward_cached(const Var& x, LayerCache& cache, int64_t pos) const {
  if (post_) {
    const Var h = add(x, ln1->forward(attn->forward_cached(x, cache, pos)));
    return add(h, ln2->forward(mlp->forward(h)));
  }
  Var h = add(x, attn->forward_cached(ln1->forward(x), cache, pos));
  return add(h, mlp->forward(ln2->forward(parallel_ ? x : h)));
}

}  // namespace tapelm
