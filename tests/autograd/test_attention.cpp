// The attention op (MHA, GQA, MQA: each group's query heads against one K/V head) against a naive
// double-precision reference and finite differences, and RoPE against its closed form.
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "autograd/attention.h"
#include "autograd/float16.h"
#include "autograd/ops.h"
#include "autograd/runtime.h"
#include "test_util.h"

using namespace tapelm;
using tapelm::test::check_grad;
namespace tt = boost::test_tools;
namespace bdata = boost::unit_test::data;

namespace {

// softmax(q kᵀ/√hd) v per head, kv head h / (H/KV), in double with explicit loops.
std::vector<double> naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t H, int64_t KV,
                                    bool causal, const Index* keep) {
  const int64_t B = q.dim(0), T = q.dim(1), hd = q.dim(2) / H, Tk = k.dim(1);
  std::vector<double> y(q.numel(), 0.0);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      const int64_t g = h / (H / KV);
      for (int64_t i = 0; i < T; i++) {
        std::vector<double> s(Tk, -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < Tk; j++) {
          if ((causal && j > i) || (keep && !keep->data[b * Tk + j])) continue;
          double d = 0;
          for (int64_t c = 0; c < hd; c++) d += double(q[(b * T + i) * H * hd + h * hd + c]) * k[(b * Tk + j) * KV * hd + g * hd + c];
          s[j] = d / std::sqrt(double(hd));
          mx = std::max(mx, s[j]);
        }
        if (mx == -INFINITY) continue;
        double z = 0;
        for (int64_t j = 0; j < Tk; j++) z += s[j] == -INFINITY ? 0 : std::exp(s[j] - mx);
        for (int64_t j = 0; j < Tk; j++) {
          if (s[j] == -INFINITY) continue;
          const double p = std::exp(s[j] - mx) / z;
          for (int64_t c = 0; c < hd; c++) y[(b * T + i) * H * hd + h * hd + c] += p * v[(b * Tk + j) * KV * hd + g * hd + c];
        }
      }
    }
  return y;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(attention)

// (H, KV): MHA, GQA, MQA, an odd head count, and odd groups.
BOOST_DATA_TEST_CASE(attention_matches_naive_reference, bdata::make({4, 4, 4, 3, 6}) ^ bdata::make({4, 2, 1, 3, 3}), H, KV) {
  const int64_t B = 2, T = 7, hd = 5;
  Tensor q = randn({B, T, H * hd}, 1), k = randn({B, T, KV * hd}, 2), v = randn({B, T, KV * hd}, 3);
  Index keep({1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1}, {B, T});
  for (bool causal : {true, false})
    for (const Index* kk : {static_cast<const Index*>(nullptr), static_cast<const Index*>(&keep)}) {
      AttentionOptions o{H, KV, causal, 0.f, 0, kk};
      Tensor y = tapelm::attention(Var(q), Var(k), Var(v), o).val();
      std::vector<double> ref = naive_attention(q, k, v, H, KV, causal, kk);
      double worst = 0;
      for (int64_t i = 0; i < y.numel(); i++) worst = std::max(worst, std::fabs(y[i] - ref[i]));
      BOOST_TEST(worst < 1e-5, "H=" << H << " KV=" << KV << " causal=" << causal << " mask=" << (kk != nullptr)
                                    << ": max |diff| " << worst);
    }
}

BOOST_DATA_TEST_CASE(attention_gradients, bdata::make({4, 4, 4}) ^ bdata::make({4, 2, 1}), H, KV) {
  for (auto [B, T, hd] : {std::tuple{2, 5, 3}, std::tuple{1, 1, 2}, std::tuple{3, 9, 4}}) {
    const std::string what = "attention H=" + std::to_string(H) + " KV=" + std::to_string(KV) + " T=" + std::to_string(T);
    std::vector<Tensor> in{randn({B, T, H * hd}, 5), randn({B, T, KV * hd}, 6), randn({B, T, KV * hd}, 7)};
    AttentionOptions o{H, KV, true, 0.f, 0, nullptr};
    check_grad(what, [o](const std::vector<Var>& x) { return tapelm::attention(x[0], x[1], x[2], o); }, in);
    AttentionOptions od{H, KV, true, 0.25f, 99, nullptr};
    check_grad(what + " dropout", [od](const std::vector<Var>& x) { return tapelm::attention(x[0], x[1], x[2], od); }, in);
    AttentionOptions onc{H, KV, false, 0.f, 0, nullptr};
    check_grad(what + " non-causal", [onc](const std::vector<Var>& x) { return tapelm::attention(x[0], x[1], x[2], onc); }, in);
  }
}

BOOST_AUTO_TEST_CASE(attention_gradients_with_key_mask) {
  Index keep({1, 0, 1, 1, 0, 1, 1, 1}, {2, 4});
  AttentionOptions om{4, 2, true, 0.f, 0, &keep};
  check_grad("attention key mask", [om](const std::vector<Var>& x) { return tapelm::attention(x[0], x[1], x[2], om); },
             {randn({2, 4, 12}, 8), randn({2, 4, 6}, 9), randn({2, 4, 6}, 10)});
}

// The gradients are the same bits on any number of threads. Where the (sequence, KV head) pairs
// are fewer than the threads, each query head is a work item and its share of its group's dK and dV
// is added in head order, as one thread adds them. Batch 1, 2 and 3, T 70 (three query blocks of
// 32), with dropout, causal and not; MHA, GQA and MQA; v with no gradient (dK alone); the second
// backward adds to the gradients the first left.
BOOST_AUTO_TEST_CASE(attention_gradients_are_the_same_bits_on_any_thread_count) {
  const int64_t T = 70, hd = 8;
  for (auto [B, H, KV] : {std::tuple{1, 4, 1}, std::tuple{1, 4, 2}, std::tuple{3, 4, 1}, std::tuple{1, 4, 4}, std::tuple{2, 6, 3}})
    for (bool causal : {true, false})
      for (bool v_grad : {true, false}) {
        std::vector<std::vector<float>> first;
        for (int threads : {1, 2, 3, 4}) {
          ThreadCount tc(threads);
          Var q(randn({B, T, H * hd}, 11), true), k(randn({B, T, KV * hd}, 12), true), v(randn({B, T, KV * hd}, 13), v_grad);
          const Var w(randn({B, T, H * hd}, 14));
          const AttentionOptions o{H, KV, causal, 0.1f, 5, nullptr};
          for (int pass = 0; pass < 2; pass++) backward(sum(mul(tapelm::attention(q, k, v, o), w)));
          std::vector<std::vector<float>> g{q.grad().to_vector(), k.grad().to_vector()};
          if (v_grad) g.push_back(v.grad().to_vector());
          if (threads == 1) {
            first = g;
            continue;
          }
          for (size_t i = 0; i < g.size(); i++)
            BOOST_TEST((g[i] == first[i]), "B=" << B << " H=" << H << " KV=" << KV << " causal=" << causal << " threads="
                                                << threads << ": d" << "qkv"[i] << " differs from one thread's");
        }
      }
}

BOOST_AUTO_TEST_CASE(rope_values_and_gradient) {
  // One head of size 4 at position 3: pairs (0,2) rotate by 3·θ^0, (1,3) by 3·θ^(-1/2).
  Tensor x = Tensor::from({1, 4, 4}, std::vector<float>(16, 0.f));
  for (int i = 0; i < 4; i++) x[12 + i] = static_cast<float>(i + 1);
  Tensor y = rope(Var(x), 1, 0, 10000.0).val();
  const double a0 = 3.0, a1 = 3.0 / 100.0;
  BOOST_TEST(y[12] == 1 * std::cos(a0) - 3 * std::sin(a0), tt::tolerance(1e-5));
  BOOST_TEST(y[14] == 3 * std::cos(a0) + 1 * std::sin(a0), tt::tolerance(1e-5));
  BOOST_TEST(y[13] == 2 * std::cos(a1) - 4 * std::sin(a1), tt::tolerance(1e-5));
  BOOST_TEST(y[15] == 4 * std::cos(a1) + 2 * std::sin(a1), tt::tolerance(1e-5));
  for (int64_t pos0 : {0, 5})
    check_grad("rope pos0=" + std::to_string(pos0), [pos0](const std::vector<Var>& v) { return rope(v[0], 3, pos0, 10000.0); },
               {randn({2, 3, 12}, 11)});
}

// GPT-NeoX's partial rotary: RoPE on the first rot dims of each head, half-split within them, with
// the angles of a head of size rot; the other dims pass through.
BOOST_AUTO_TEST_CASE(partial_rope_rotates_the_first_dims_and_passes_the_rest) {
  // One head of size 6, rot 4, position 3: pairs (0,2) by 3·θ^0, (1,3) by 3·θ^(-2/4); 4, 5 unchanged.
  Tensor x = Tensor::from({1, 4, 6}, std::vector<float>(24, 0.f));
  for (int i = 0; i < 6; i++) x[18 + i] = static_cast<float>(i + 1);
  Tensor y = rope(Var(x), 1, 0, 10000.0, 4).val();
  const double a0 = 3.0, a1 = 3.0 / 100.0;
  BOOST_TEST(y[18] == 1 * std::cos(a0) - 3 * std::sin(a0), tt::tolerance(1e-5));
  BOOST_TEST(y[20] == 3 * std::cos(a0) + 1 * std::sin(a0), tt::tolerance(1e-5));
  BOOST_TEST(y[19] == 2 * std::cos(a1) - 4 * std::sin(a1), tt::tolerance(1e-5));
  BOOST_TEST(y[21] == 4 * std::cos(a1) + 2 * std::sin(a1), tt::tolerance(1e-5));
  BOOST_TEST(y[22] == 5.f);
  BOOST_TEST(y[23] == 6.f);
  // rot = the head is the whole-head rotation, bit for bit; fewer dims rotate less
  const Tensor z = randn({2, 3, 12}, 12);
  BOOST_TEST(rope(Var(z), 3, 2, 10000.0, 4).val().to_vector() == rope(Var(z), 3, 2, 10000.0).val().to_vector(), tt::per_element());
  BOOST_TEST(rope(Var(z), 3, 2, 10000.0, 2).val().to_vector() != rope(Var(z), 3, 2, 10000.0).val().to_vector());
  for (int64_t pos0 : {0, 5})
    check_grad("partial rope pos0=" + std::to_string(pos0), [pos0](const std::vector<Var>& v) { return rope(v[0], 3, pos0, 10000.0, 2); },
               {randn({2, 3, 12}, 13)});
  expect_throw([] { rope(Var(randn({1, 2, 12}, 1)), 3, 0, 10000.0, 3); }, ErrorKind::shape, {"3 rotated dims must be even"});
  expect_throw([] { rope(Var(randn({1, 2, 12}, 1)), 3, 0, 10000.0, 6); }, ErrorKind::shape, {"at most the head dim 4"});
}

namespace {
// x [B, KV, max_len, hd] as a cache of the given type, and the values it stands for.
KvStore store_of(const Tensor& x, KvType type) {
  KvStore s(type, x.dim(0), x.dim(1), x.dim(2), x.dim(3));
  kv_encode_rows(type, s.data.data(), x.data(), x.numel() / x.dim(3), x.dim(3));
  return s;
}
std::vector<float> rounded(const Tensor& x, KvType type, int64_t hd) {
  std::vector<uint8_t> bytes(static_cast<size_t>(x.numel() / hd * kv_row_bytes(type, hd)));
  kv_encode_rows(type, bytes.data(), x.data(), x.numel() / hd, hd);
  std::vector<float> back(static_cast<size_t>(x.numel()));
  kv_decode_rows(type, back.data(), bytes.data(), x.numel() / hd, hd);
  return back;
}
}  // namespace

// A decoding step (one new query row per sequence) over a long KV cache: split into chunks of up
// to 256 keys (shorter where a batch has few KV heads: at one sequence and one KV head, 32 keys
// at 255 and 256 keys, 87 at 701) spread over the threads and combined in order; and a prefill of
// 5 rows over the same cache. For each storage type (f32; f16, bf16 and q8 widened as they are
// read) checked against softmax(q kᵀ/√hd) v computed naively in double on the cache's values (the
// old rows and the new ones as the type rounds them), and for bit-identical results on 1, 2 and 3
// threads. 8 query heads over 8, 4, 2 and 1 KV heads: the products' register blocks of 1, 2, 4 and
// 8 heads, with keys left over at the end of a chunk (255, 701 keys).
BOOST_AUTO_TEST_CASE(decode_step_over_long_contexts) {
  const int64_t H = 8, hd = 32, max_len = 800;
  const int before = get_num_threads();
  for (int64_t B : {2, 1})
    for (KvType type : {KvType::f32, KvType::f16, KvType::bf16, KvType::q8})
      for (int64_t KV : {8, 4, 2, 1})
        for (auto [pos, t] : {std::pair<int64_t, int64_t>{0, 1}, {254, 1}, {255, 1}, {256, 1}, {700, 1}, {300, 5}}) {
          if (type != KvType::f32 && KV == 2) continue;  // the types read every head alike
          if (B == 1 && (type == KvType::bf16 || KV == 8)) continue;  // one sequence: the shortened chunks
          BOOST_TEST_CONTEXT("batch " << B << ", " << to_string(type) << ", KV " << KV << ", " << t << " new rows at " << pos) {
            const int64_t row = KV * hd;
            const Tensor ck = randn({B, KV, max_len, hd}, 20 + KV), cv = randn({B, KV, max_len, hd}, 30 + KV);
            const Tensor q = randn({B, t, H * hd}, 40 + pos), kn = randn({B, t, row}, 50 + pos), vn = randn({B, t, row}, 60 + pos);
            std::vector<std::vector<float>> outs;
            for (int threads : {1, 2, 3}) {
              set_num_threads(threads);
              KvStore k1 = store_of(ck, type), v1 = store_of(cv, type);
              outs.push_back(attention_cached(Var(q), Var(kn), Var(vn), k1, v1, H, KV, pos).val().to_vector());
            }
            BOOST_TEST(outs[0] == outs[1], tt::per_element());
            BOOST_TEST(outs[0] == outs[2], tt::per_element());
            // the cache's values with the new rows at pos.., as attention_cached stores them
            const std::vector<float> rk = rounded(ck, type, hd), rv = rounded(cv, type, hd), rkn = rounded(kn, type, hd),
                                     rvn = rounded(vn, type, hd);
            double worst = 0;
            for (int64_t b = 0; b < B; b++)
              for (int64_t i = 0; i < t; i++)
                for (int64_t h = 0; h < H; h++) {
                  const int64_t g = h / (H / KV), last = pos + i;  // keys 0 .. last visible
                  // the cache is [B, KV, max_len, hd]; the new rows [B, t, KV·hd]
                  auto key = [&](int64_t j, int64_t d) {
                    return j >= pos ? rkn[(b * t + j - pos) * row + g * hd + d] : rk[((b * KV + g) * max_len + j) * hd + d];
                  };
                  auto val = [&](int64_t j, int64_t d) {
                    return j >= pos ? rvn[(b * t + j - pos) * row + g * hd + d] : rv[((b * KV + g) * max_len + j) * hd + d];
                  };
                  const float* qr = q.data() + (b * t + i) * H * hd + h * hd;
                  std::vector<double> sc(last + 1);
                  double mx = -1e300, sum = 0;
                  for (int64_t j = 0; j <= last; j++) {
                    double dot = 0;
                    for (int64_t d = 0; d < hd; d++) dot += double(qr[d]) * key(j, d);
                    sc[j] = dot / std::sqrt(double(hd));
                    mx = std::max(mx, sc[j]);
                  }
                  for (double& x : sc) sum += (x = std::exp(x - mx));
                  for (int64_t d = 0; d < hd; d++) {
                    double y = 0;
                    for (int64_t j = 0; j <= last; j++) y += sc[j] / sum * val(j, d);
                    worst = std::max(worst, std::fabs(y - outs[0][(b * t + i) * H * hd + h * hd + d]));
                  }
                }
            BOOST_TEST(worst < 2e-5, "max |attention - double reference| " << worst);
          }
        }
  set_num_threads(before);
}

// The q8_0 product against its definition: per block of 32, the exact integer sum of the int8
// products times both f16 scales, summed in double; x rounded to q8_0 as ggml's
// quantize_row_q8_0_ref does (d = max|x|/127 in f16, q = round(x/d)). The decoding path (M ≤ 16
// rows, int8 dot products) and the prefill path (sgemm on the widened values) both, with a bias,
// on 1 and 2 threads (bit-identical). On the decoding path every kernel (activation rows in fours,
// W rows in fours, one by one) sums a row's blocks in one order, so a row's product has the same
// bits whatever rows are beside it: M = 6 is a group of four and two rows left, N = 37 two tiles
// of 16 and a tile of 5 (a four and one row left).
BOOST_AUTO_TEST_CASE(q8_0_products_match_their_definition) {
  const int64_t K = 96, N = 37;
  const Tensor w = randn({N, K}, 7), bias = randn({N}, 8);
  const PackedMatrix wq = PackedMatrix::pack(w, WeightType::q8_0, "w");
  const int64_t rb = q8_0_bytes(K);
  auto block = [](const uint8_t* p, int64_t i, float* d) {
    uint16_t h;
    std::memcpy(&h, p + i * kQ8BlockBytes, 2);
    *d = f16_to_f32(h);
    return reinterpret_cast<const int8_t*>(p + i * kQ8BlockBytes + 2);
  };
  const int before = get_num_threads();
  for (int64_t M : {1, 3, 6, 16, 40}) {
    const Tensor x = randn({M, K}, 10 + M);
    std::vector<std::vector<float>> outs;
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      outs.push_back(linear_packed(Var(x), wq, Var(bias)).val().to_vector());
    }
    BOOST_TEST(outs[0] == outs[1], tt::per_element());
    if (M <= kern::kQ8RowsDirect)
      for (int64_t m = 0; m < M; m++) {
        const Tensor row = Tensor::from({1, K}, std::vector<float>(x.data() + m * K, x.data() + (m + 1) * K));
        const std::vector<float> alone = linear_packed(Var(row), wq, Var(bias)).val().to_vector();
        const std::vector<float> beside(outs[0].begin() + m * N, outs[0].begin() + (m + 1) * N);
        BOOST_TEST(alone == beside, tt::per_element());
      }
    double worst = 0;
    for (int64_t m = 0; m < M; m++) {
      // ggml's rounding of x, written out here from its definition
      std::vector<uint8_t> xq(static_cast<size_t>(rb));
      for (int64_t i = 0; i < K / 32; i++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = std::max(amax, std::fabs(x[m * K + i * 32 + j]));
        const float d = amax / 127.f, id = d != 0 ? 1.f / d : 0.f;  // f32, as ggml; stored in f16
        const uint16_t dh = f32_to_f16(d);
        std::memcpy(&xq[i * 34], &dh, 2);
        for (int j = 0; j < 32; j++) xq[i * 34 + 2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[m * K + i * 32 + j] * id)));
      }
      for (int64_t n = 0; n < N; n++) {
        double want = bias[n];
        for (int64_t i = 0; i < K / 32; i++) {
          float dw, dx;
          const int8_t* qw = block(wq.data.data() + n * rb, i, &dw);
          const int8_t* qx = block(xq.data(), i, &dx);
          int32_t sum = 0;
          for (int j = 0; j < 32; j++) sum += int32_t(qw[j]) * int32_t(qx[j]);
          want += double(dw) * double(dx) * sum;
        }
        worst = std::max(worst, std::fabs(want - outs[0][m * N + n]));
      }
    }
    BOOST_TEST(worst < 1e-4, M << " rows: max |q8_0 product - definition| " << worst);
  }
  set_num_threads(before);
}

// The 16-bit products against their definition: Σ over k of the widened weight times x, in
// double, plus the bias. K = 100 leaves a tail past the kernel's steps of 16; M covers the
// decoding path (1-4 rows, groups of 4 and the 1-3 left) and the prefill's (sgemm on widened
// panels, M > 16); 1 and 2 threads give the same bits. Packing weights that are 16-bit values
// already keeps them exactly (what a bf16 or f16 file holds), and f16 refuses what it cannot hold.
BOOST_AUTO_TEST_CASE(w16_products_match_their_definition) {
  const int64_t K = 100, N = 37;
  const Tensor bias = randn({N}, 8);
  const int before = get_num_threads();
  for (WeightType type : {WeightType::bf16, WeightType::f16}) {
    const bool bf16 = type == WeightType::bf16;
    Tensor w = randn({N, K}, 7);
    for (int64_t i = 0; i < w.numel(); i++) w.data()[i] = bf16 ? bf16_to_f32(f32_to_bf16(w[i])) : f16_to_f32(f32_to_f16(w[i]));
    const PackedMatrix wp = PackedMatrix::pack(w, type, "w");
    BOOST_TEST(wp.bytes() == 2 * N * K);
    const uint16_t* h = reinterpret_cast<const uint16_t*>(wp.data.data());
    int64_t changed = 0;
    for (int64_t i = 0; i < w.numel(); i++) changed += (bf16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i])) != w[i];
    BOOST_TEST(changed == 0, to_string(type) << ": " << changed << " values not kept exactly");
    for (int64_t M : {1, 2, 3, 4, 5, 7, 16, 17, 40}) {
      const Tensor x = randn({M, K}, 10 + M);
      std::vector<std::vector<float>> outs;
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        outs.push_back(linear_packed(Var(x), wp, Var(bias)).val().to_vector());
      }
      BOOST_TEST(outs[0] == outs[1], tt::per_element());
      double worst = 0;
      for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
          double want = bias[n];
          for (int64_t k = 0; k < K; k++) want += double(w[n * K + k]) * double(x[m * K + k]);
          worst = std::max(worst, std::fabs(want - outs[0][m * N + n]));
        }
      BOOST_TEST(worst < 2e-5, to_string(type) << ", " << M << " rows: max |product - definition| " << worst);
    }
  }
  set_num_threads(before);
  Tensor big = randn({2, 32}, 3);
  big.data()[37] = 70000.f;
  BOOST_CHECK_EXCEPTION(PackedMatrix::pack(big, WeightType::f16, "blocks.0.attn.wq.weight"), Error, [](const Error& e) {
    const std::string m = e.what();
    return e.kind() == ErrorKind::data && m.find("blocks.0.attn.wq.weight") != std::string::npos && m.find("row 1") != std::string::npos;
  });
  BOOST_CHECK_NO_THROW(PackedMatrix::pack(big, WeightType::bf16, "w"));
  Var xg(randn({1, 32}, 4), true);
  BOOST_CHECK_THROW(linear_packed(xg, PackedMatrix::pack(randn({3, 32}, 5), WeightType::bf16, "w")), Error);
  // a finite float past bf16's largest (0x7f7f, about 3.39e38) would round to infinity
  big.data()[37] = std::numeric_limits<float>::max();
  test::expect_throw([&] { PackedMatrix::pack(big, WeightType::bf16, "blocks.0.attn.wq.weight"); }, ErrorKind::data,
                     {"blocks.0.attn.wq.weight", "row 1", "bf16"});
}

// A matrix over bytes held elsewhere (a mapped file's, PackedMatrix::over) multiplies as the same
// bytes packed; rows in interleaved RoPE order (llama.cpp's q and k: head h's row 2i holds
// tapelm's row i, row 2i + 1 its row hd/2 + i) give tapelm's half-split outputs, bias added in
// that order; a value or a q8_0 scale that is not finite is refused naming the row.
BOOST_AUTO_TEST_CASE(matrices_over_outside_bytes_multiply_as_packed_ones) {
  const int64_t heads = 2, hd = 4, rows = heads * hd, cols = 64;
  const Tensor w = randn({rows, cols}, 11), bias = randn({rows}, 12);
  Tensor inter = Tensor::empty({rows, cols});  // w's rows in the interleaved order
  for (int64_t h = 0; h < heads; h++)
    for (int64_t i = 0; i < hd / 2; i++)
      for (int64_t j = 0; j < 2; j++)
        std::copy_n(w.data() + (h * hd + j * hd / 2 + i) * cols, cols, inter.data() + (h * hd + 2 * i + j) * cols);
  NoGrad ng;
  for (int64_t M : {1, 3, 20}) {  // the direct kernels and the panel path
    const Var x(randn({M, cols}, 13));
    for (WeightType type : {WeightType::bf16, WeightType::f16, WeightType::q8_0}) {
      const PackedMatrix packed = PackedMatrix::pack(w, type, "w");
      auto bytes = std::make_shared<const std::vector<uint8_t>>(PackedMatrix::pack(inter, type, "w").data);
      PackedMatrix over = PackedMatrix::over(type, rows, cols, bytes->data(), bytes, "w");
      over.rope_heads = heads;
      BOOST_TEST(over.mapped());
      BOOST_TEST(over.bytes() == packed.bytes());
      const Tensor want = linear_packed(x, packed, Var(bias)).val(), got = linear_packed(x, over, Var(bias)).val();
      BOOST_TEST(std::equal(want.data(), want.data() + want.numel(), got.data()), to_string(type) << ", " << M << " rows");
    }
  }
  std::vector<uint16_t> h16(static_cast<size_t>(rows * cols), 0x3f80);  // bf16 1.0
  h16[3 * cols + 5] = 0x7fc0;                                           // a NaN in row 3
  test::expect_throw([&] { PackedMatrix::over(WeightType::bf16, rows, cols, reinterpret_cast<const uint8_t*>(h16.data()), nullptr, "tensor t"); },
                     ErrorKind::data, {"tensor t", "row 3", "not finite"});
  h16[3 * cols + 5] = 0x7c00;  // bf16 1.0 ... f16 +inf
  test::expect_throw([&] { PackedMatrix::over(WeightType::f16, rows, cols, reinterpret_cast<const uint8_t*>(h16.data()), nullptr, "tensor t"); },
                     ErrorKind::data, {"row 3", "not finite"});
  std::vector<uint8_t> q = PackedMatrix::pack(w, WeightType::q8_0, "w").data;
  q[static_cast<size_t>(5 * q8_0_bytes(cols) + kQ8BlockBytes + 1)] = 0x7c;  // row 5's second block: scale +inf
  q[static_cast<size_t>(5 * q8_0_bytes(cols) + kQ8BlockBytes)] = 0x00;
  test::expect_throw([&] { PackedMatrix::over(WeightType::q8_0, rows, cols, q.data(), nullptr, "tensor t"); }, ErrorKind::data,
                     {"row 5", "q8_0 block", "not finite"});
}

BOOST_AUTO_TEST_SUITE_END()
