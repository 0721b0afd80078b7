// Exact parity with the PyTorch reference: every fixture's weights go through the checkpoint
// reader, its tokens through the model, and loss, logits and every parameter's gradient must
// match what PyTorch computed (tests/fixtures/parity: the six public ones plus extra configurations
// written by tests/fixtures/make_fixtures.py with the reference's own exporter).
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>

#include "train/formats/checkpoint.h"
#include "test_util.h"

using namespace tapelm;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> fixtures() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(test::fixture_path("parity")))
    if (e.path().extension() == ".h5") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

double norm(const Tensor& a) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); i++) s += double(a[i]) * a[i];
  return std::sqrt(s);
}

// ‖a − b‖ / ‖b‖, where ‖b‖ is floored at `floor`: a gradient that vanishes in exact arithmetic
// (the key bias without RoPE: softmax ignores a constant added to a row of scores) holds only
// rounding noise in both programs, so it is compared against that floor instead.
double rel_err(const Tensor& a, const Tensor& b, double floor) {
  double num = 0;
  for (int64_t i = 0; i < a.numel(); i++) num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(num) / std::max(norm(b), floor);
}

void split_tokens(const std::vector<int32_t>& tok, const Shape& s, Index& x, Index& y) {
  const int64_t B = s[0], T1 = s[1];
  x.shape = y.shape = {B, T1 - 1};
  x.data.clear();
  y.data.clear();
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t + 1 < T1; t++) {
      x.data.push_back(tok[b * T1 + t]);
      y.data.push_back(tok[b * T1 + t + 1]);
    }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(parity)

BOOST_AUTO_TEST_CASE(every_fixture_matches_pytorch) {
  const auto files = fixtures();
  BOOST_TEST_REQUIRE(files.size() >= 6u);
  for (const std::string& path : files) {
    BOOST_TEST_CONTEXT(fs::path(path).filename().string()) {
      std::unique_ptr<GPT> model = load_model(path).model;
      model->eval();
      H5File f = H5File::open_read(path);
      Shape ts;
      std::vector<int32_t> tok = f.read_ints("/tokens", &ts);
      Index x, y;
      split_tokens(tok, ts, x, y);
      Var logits = model->forward(x);
      Var loss = cross_entropy(logits, y);
      backward(loss);
      const double want = f.read_attr_double("/expected", "loss");
      BOOST_TEST(std::fabs(loss.item() - want) / std::fabs(want) < 1e-5, "loss " << loss.item() << " vs " << want);
      Tensor el = f.read_tensor("/expected/logits");
      double worst = 0;
      for (int64_t i = 0; i < el.numel(); i++) worst = std::max(worst, double(std::fabs(el[i] - logits.val()[i])));
      BOOST_TEST(worst < 1e-4, "logits max |diff| " << worst);
      double worst_grad = 0, global = 0;
      std::string worst_name;
      for (auto& [name, p] : model->named_parameters()) global += std::pow(norm(f.read_tensor("/expected/grad/" + name)), 2);
      const double floor = 1e-3 * std::sqrt(global);
      for (auto& [name, p] : model->named_parameters()) {
        Tensor g = f.read_tensor("/expected/grad/" + name);
        const double e = rel_err(p.grad(), g, floor);
        BOOST_TEST(e < 1e-4, name << " gradient relative error " << e);
        if (e > worst_grad) worst_grad = e, worst_name = name;
      }
      BOOST_TEST_MESSAGE(fs::path(path).filename().string() << ": loss " << loss.item() << " (PyTorch " << want
                                                            << "), logits max diff " << worst
                                                            << ", largest gradient relative error " << worst_grad
                                                            << " (" << worst_name << ")");
    }
  }
}

BOOST_AUTO_TEST_CASE(weights_round_trip_and_mismatch_errors) {
  const std::string dir = (fs::temp_directory_path() / ("tapelm_parity_" + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  std::unique_ptr<GPT> m = load_model(test::fixture_path("parity/gqa.h5")).model;
  save_model(dir + "/w.h5", *m);
  std::unique_ptr<GPT> m2 = load_model(dir + "/w.h5").model;
  BOOST_TEST((m2->config() == m->config()));
  auto a = m->named_parameters(), b = m2->named_parameters();
  BOOST_TEST_REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); i++) BOOST_TEST(a[i].second.val().to_vector() == b[i].second.val().to_vector());

  // a model of another shape names every missing, extra and mis-shaped parameter; nothing loads
  GPTConfig other = m->config();
  other.n_kv_head = 1;
  other.tie_embeddings = false;
  GPT target(other, 3);
  const float before = target.blocks[0]->attn->wq->weight.val()[0];
  H5File f = H5File::open_read(dir + "/w.h5");
  try {
    read_model_weights(f, target);
    BOOST_ERROR("mismatch accepted");
  } catch (const Error& e) {
    const std::string msg = e.what();
    BOOST_TEST(msg.find("missing lm_head.weight") != std::string::npos, msg);
    BOOST_TEST(msg.find("blocks.0.attn.wk.weight [16, 32] (expected [8, 32])") != std::string::npos, msg);
    BOOST_TEST(msg.find("blocks.1.attn.wv.weight") != std::string::npos, msg);
    BOOST_TEST(msg.find("w.h5") != std::string::npos, msg);
  }
  BOOST_TEST(target.blocks[0]->attn->wq->weight.val()[0] == before);
  fs::remove_all(dir);
}

BOOST_AUTO_TEST_SUITE_END()
