#include "autograd/attention.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "autograd/error.h"
#include "autograd/kernels/attention.h"
#include "autograd/record.h"

namespace tapelm {

Var attention(const Var& q, const Var& k, const Var& v, const AttentionOptions& opt) {
  const int64_t H = opt.n_head, KV = opt.n_kv_head;
  if (H <= 0 || KV <= 0 || H % KV != 0)
    fail("attention", "n_head " + std::to_string(H) + " is not a multiple of n_kv_head " + std::to_string(KV));
  if (q.ndim() != 3 || k.ndim() != 3 || v.shape() != k.shape() || q.dim(0) != k.dim(0) || q.dim(2) % H != 0)
    fail("attention", "q " + shape_str(q.shape()) + ", k " + shape_str(k.shape()) + ", v " + shape_str(v.shape()));
  const int64_t B = q.dim(0), Tq = q.dim(1), Tk = k.dim(1), hd = q.dim(2) / H;
  if (k.dim(2) != KV * hd)
    fail("attention", "k " + shape_str(k.shape()) + " does not hold " + std::to_string(KV) + " heads of size " +
                          std::to_string(hd) + " for q " + shape_str(q.shape()));
  if (opt.causal && Tq != Tk) fail("attention", "causal attention needs as many queries as keys, got q " +
                                                    shape_str(q.shape()) + " and k " + shape_str(k.shape()));
  if (opt.key_keep && (opt.key_keep->numel() != B * Tk))
    fail("attention", "key mask " + shape_str(opt.key_keep->shape) + " for keys " + shape_str(k.shape()));
  if (!(opt.dropout >= 0.f && opt.dropout < 1.f)) fail("attention", "dropout " + std::to_string(opt.dropout) + " not in [0, 1)");
  const kern::AttnShape s{B, Tq, Tk, H, KV, hd, Tk * KV * hd, 0, opt.causal};
  Tensor out = Tensor::empty(q.shape());
  const bool need_grad = grad_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  Tensor probs = Tensor::empty(need_grad ? Shape{B, H, Tq, Tk} : Shape{0});
  const int32_t* keep = opt.key_keep ? opt.key_keep->data.data() : nullptr;
  kern::attention_fwd(out.data(), need_grad ? probs.data() : nullptr, q.val().data(), k.val().data(), v.val().data(),
                      s, keep, opt.dropout, opt.seed);
  const float p = opt.dropout;
  const uint64_t seed = opt.seed;
  return record({q, k, v}, out, [q, k, v, probs, s, p, seed](const Tensor& dout) {
    kern::attention_bwd(q.requires_grad() ? q.grad().data() : nullptr, k.requires_grad() ? k.grad().data() : nullptr,
                        v.requires_grad() ? v.grad().data() : nullptr, dout.data(), probs.data(), q.val().data(),
                        k.val().data(), v.val().data(), s, p, seed);
  });
}

void check_kv_type(KvType t, int64_t hd) {
  if (t == KvType::q8 && hd % kQ8Block != 0)
    fail(ErrorKind::usage, "kv_cache q8 stores blocks of 32 values along each head, but the head dimension is " +
                               std::to_string(hd) + " (use f16 or bf16)");
}

KvStore::KvStore(KvType t, int64_t b, int64_t kv, int64_t len, int64_t d)
    : type(t), batch(b), heads(kv), max_len(len), hd(d),
      data(static_cast<size_t>(b * kv * len * kv_row_bytes(t, d))) {
  check_kv_type(t, d);
}

namespace {
// f16 holds magnitudes up to 65504, a q8_0 block's f16 scale up to 127 · 65504: beyond, the cache
// would hold infinities and the logits NaN.
void check_storable(const Tensor& x, KvType t, const char* what) {
  if (t == KvType::f32 || t == KvType::bf16) return;
  const float limit = t == KvType::f16 ? 65504.f : 127.f * 65504.f;
  const float* p = x.data();
  float worst = 0;
  for (int64_t i = 0; i < x.numel(); i++) worst = std::max(worst, std::fabs(p[i]));
  if (worst > limit)
    fail(ErrorKind::data, "kv_cache " + to_string(t) + ": a " + what + " of magnitude " +
                              std::to_string(worst) + " is beyond what it can hold (" + std::to_string(limit) +
                              "); use kv_cache bf16 or f32");
}
}  // namespace

Var attention_cached(const Var& q, const Var& k_new, const Var& v_new, KvStore& cache_k, KvStore& cache_v,
                     int64_t H, int64_t KV, int64_t pos) {
  if (H <= 0 || KV <= 0 || H % KV != 0)
    fail("attention_cached", "n_head " + std::to_string(H) + " is not a multiple of n_kv_head " + std::to_string(KV));
  if (q.ndim() != 3 || q.dim(2) % H != 0)
    fail("attention_cached", "q " + shape_str(q.shape()) + " does not hold " + std::to_string(H) + " heads");
  const int64_t B = q.dim(0), t = q.dim(1), hd = q.dim(2) / H, row = KV * hd;
  const auto same = [&](const KvStore& c) {
    return c.type == cache_k.type && c.batch == B && c.heads == KV && c.hd == hd && c.max_len == cache_k.max_len;
  };
  if (!same(cache_k) || !same(cache_v) || k_new.shape() != Shape{B, t, row} || v_new.shape() != k_new.shape())
    fail("attention_cached", "q " + shape_str(q.shape()) + ", new k " + shape_str(k_new.shape()) + ", cache " +
                                 shape_str({cache_k.batch, cache_k.heads, cache_k.max_len, cache_k.hd}));
  const int64_t max_len = cache_k.max_len;
  if (pos < 0 || pos + t > max_len)
    fail("attention_cached", "positions " + std::to_string(pos) + ".." + std::to_string(pos + t - 1) +
                                 " do not fit a cache of " + std::to_string(max_len));
  check_storable(k_new.val(), cache_k.type, "key");
  check_storable(v_new.val(), cache_k.type, "value");
  kern::kv_cache_write(cache_k.data.data(), cache_v.data.data(), cache_k.type, k_new.val().data(), v_new.val().data(), B,
                       t, KV, hd, max_len, pos);
  Tensor y = Tensor::empty(q.shape());
  const kern::AttnShape s{B, t, pos + t, H, KV, hd, KV * max_len * hd, pos, true, max_len * hd, hd};
  kern::attention_fwd_stored(y.data(), q.val().data(), cache_k.data.data(), cache_v.data.data(), cache_k.type, s);
  return Var(y);
}

Var round_kv(const Var& x, int64_t n_heads, KvType t) {
  if (x.ndim() != 3 || n_heads <= 0 || x.dim(2) % n_heads != 0)
    fail("round_kv", "input " + shape_str(x.shape()) + " does not hold " + std::to_string(n_heads) + " heads");
  if (grad_enabled() && x.requires_grad()) fail("round_kv", "rounding to a KV cache's type is for evaluation: no gradient");
  const int64_t hd = x.dim(2) / n_heads, rows = x.numel() / hd;
  check_kv_type(t, hd);
  Tensor out = Tensor::empty(x.shape());
  kv_round_rows(t, out.data(), x.val().data(), rows, hd);
  return Var(out);
}

namespace {
struct RopeTable {
  Tensor cos_t, sin_t;
};
// Tables are small and reused by every layer and step: cache them by (positions, hd, theta).
const RopeTable& rope_table(int64_t n_pos, int64_t rot, double theta) {
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int64_t, double>, RopeTable> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_tuple(n_pos, rot, theta);
  auto it = cache.find(key);
  if (it == cache.end()) {
    RopeTable t{Tensor::empty({n_pos, rot / 2}), Tensor::empty({n_pos, rot / 2})};
    kern::rope_tables(t.cos_t.data(), t.sin_t.data(), n_pos, rot, theta);
    it = cache.emplace(key, std::move(t)).first;
  }
  return it->second;
}
}  // namespace

Var rope(const Var& x, int64_t n_heads, int64_t pos0, double theta, int64_t rot) {
  if (x.ndim() != 3 || n_heads <= 0 || x.dim(2) % n_heads != 0 || pos0 < 0)
    fail("rope", "input " + shape_str(x.shape()) + " with " + std::to_string(n_heads) + " heads");
  const int64_t B = x.dim(0), T = x.dim(1), hd = x.dim(2) / n_heads;
  if (rot == 0) rot = hd;
  if (rot < 0 || rot > hd || rot % 2 != 0)
    fail("rope", "input " + shape_str(x.shape()) + " with " + std::to_string(n_heads) + " heads: " + std::to_string(rot) +
                     " rotated dims must be even and at most the head dim " + std::to_string(hd));
  // Round the table up so decoding positions reuse one table.
  const int64_t n_pos = std::max<int64_t>(64, int64_t(1) << static_cast<int>(std::ceil(std::log2(double(pos0 + T)))));
  const RopeTable& tab = rope_table(n_pos, rot, theta);
  Tensor out = Tensor::empty(x.shape());
  kern::rope_apply(out.data(), x.val().data(), B, T, n_heads, hd, rot, pos0, tab.cos_t.data(), tab.sin_t.data(), false, false);
  Tensor ct = tab.cos_t, st = tab.sin_t;
  return record({x}, out, [xs = GradSlot(x), B, T, n_heads, hd, rot, pos0, ct, st](const Tensor& dout) {
    kern::rope_apply(xs.grad().data(), dout.data(), B, T, n_heads, hd, rot, pos0, ct.data(), st.data(), true, true);
  });
}

}  // namespace tapelm
