// The attention op (MHA, GQA, MQA: each group's query heads against one K/V head) against a naive
// double-precision reference and finite differences, and RoPE against its closed form.
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <cmath>

#include "autograd/attention.h"
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

// A decoding step (one new query row per sequence) over a long KV cache: split into 256-key chunks
// spread over the threads and combined in order. Checked against softmax(q kᵀ/√hd) v computed
// naively in double on the same cache, and for bit-identical results on 1, 2 and 3 threads.
BOOST_AUTO_TEST_CASE(decode_step_over_long_contexts) {
  const int64_t B = 2, H = 8, hd = 16, max_len = 800;
  const int before = get_num_threads();
  for (int64_t KV : {8, 2, 1})
    for (int64_t pos : {0, 254, 255, 256, 700}) {  // the new token's position: pos + 1 keys visible
      BOOST_TEST_CONTEXT("KV " << KV << ", " << pos + 1 << " keys") {
        const int64_t row = KV * hd;
        Tensor ck = randn({B, KV, max_len, hd}, 20 + KV), cv = randn({B, KV, max_len, hd}, 30 + KV);
        const Tensor q = randn({B, 1, H * hd}, 40 + pos), kn = randn({B, 1, row}, 50 + pos), vn = randn({B, 1, row}, 60 + pos);
        std::vector<std::vector<float>> outs;
        for (int threads : {1, 2, 3}) {
          set_num_threads(threads);
          Tensor k1 = ck.clone(), v1 = cv.clone();
          outs.push_back(attention_cached(Var(q), Var(kn), Var(vn), k1, v1, H, KV, pos).val().to_vector());
        }
        BOOST_TEST(outs[0] == outs[1], tt::per_element());
        BOOST_TEST(outs[0] == outs[2], tt::per_element());
        // the cache with the new row written at pos, as attention_cached writes it
        double worst = 0;
        for (int64_t b = 0; b < B; b++)
          for (int64_t h = 0; h < H; h++) {
            const int64_t g = h / (H / KV);
            // the cache is [B, KV, max_len, hd]
            auto key = [&](int64_t j, int64_t d) { return j == pos ? kn[(b * row) + g * hd + d] : ck[((b * KV + g) * max_len + j) * hd + d]; };
            auto val = [&](int64_t j, int64_t d) { return j == pos ? vn[(b * row) + g * hd + d] : cv[((b * KV + g) * max_len + j) * hd + d]; };
            std::vector<double> sc(pos + 1);
            double mx = -1e300, sum = 0;
            for (int64_t j = 0; j <= pos; j++) {
              double dot = 0;
              for (int64_t d = 0; d < hd; d++) dot += double(q[b * H * hd + h * hd + d]) * key(j, d);
              sc[j] = dot / std::sqrt(double(hd));
              mx = std::max(mx, sc[j]);
            }
            for (double& x : sc) sum += (x = std::exp(x - mx));
            for (int64_t d = 0; d < hd; d++) {
              double y = 0;
              for (int64_t j = 0; j <= pos; j++) y += sc[j] / sum * val(j, d);
              worst = std::max(worst, std::fabs(y - outs[0][b * H * hd + h * hd + d]));
            }
          }
        BOOST_TEST(worst < 2e-5, "max |decode - double reference| " << worst);
      }
    }
  set_num_threads(before);
}

BOOST_AUTO_TEST_SUITE_END()
