// Conversion of K/V heads (mean, first, random) and uptraining.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <csignal>
#include <filesystem>

#include "train/checkpoint/checkpoint.h"
#include "train/convert.h"
#include "train/uptrain.h"
#include "test_util.h"

using namespace tapelm;
using namespace tapelm::test;
namespace fs = std::filesystem;
namespace tt = boost::test_tools;

BOOST_AUTO_TEST_SUITE(convert)

BOOST_AUTO_TEST_CASE(conversion_reproduces_the_reference) {
  H5File f = H5File::open_read(parity_fixture("convert_mha.h5"));
  GPT src(read_model_config(f));
  read_model_weights(f, src);
  Index x, y;
  Shape s;
  std::vector<int32_t> tok = f.read_ints("/tokens", &s);
  x.shape = y.shape = {s[0], s[1] - 1};
  for (int64_t b = 0; b < s[0]; b++)
    for (int64_t t = 0; t + 1 < s[1]; t++) x.data.push_back(tok[b * s[1] + t]), y.data.push_back(tok[b * s[1] + t + 1]);
  for (auto [method, G] : {std::pair{"mean", 2}, std::pair{"mean", 1}, std::pair{"first", 2}}) {
    const std::string g = std::string("/expected/convert/") + method + "_kv" + std::to_string(G);
    auto out = convert_kv_heads(src, G, parse_convert_method(method), 0);
    BOOST_TEST(out->config().n_kv_head == G);
    for (const auto& [name, p] : out->named_parameters())
      BOOST_TEST(p.val().to_vector() == f.read_tensor(g + "/model/" + name).to_vector(), tt::per_element());
    NoGrad ng;
    const double loss = out->loss(x, y).item(), want = f.read_attr_double(g, "loss");
    BOOST_TEST(std::fabs(loss - want) / want < 1e-5, method << " kv" << G << ": loss " << loss << " vs " << want);
  }
}

BOOST_AUTO_TEST_CASE(equal_heads_convert_with_unchanged_outputs) {
  for (int64_t G : {2, 1}) {
    GPTConfig c{.vocab_size = 13, .block_size = 8, .n_layer = 2, .n_head = 4, .n_kv_head = 4, .n_embd = 16,
                .mlp_hidden = 32, .bias = true};
    GPT m(c, 3);
    const int64_t rep = 4 / G;
    for (auto& [name, p] : m.named_parameters()) {
      if (name.find(".attn.wk.") == std::string::npos && name.find(".attn.wv.") == std::string::npos) continue;
      Tensor& t = p.val();
      t = randn(t.shape(), 77 + t.numel(), 0.3f);
      const int64_t block = t.numel() / 4;  // one head's rows
      for (int64_t h = 0; h < 4; h++) std::copy(t.data() + (h / rep) * rep * block, t.data() + ((h / rep) * rep + 1) * block, t.data() + h * block);
    }
    Index ids({1, 5, 2, 7, 3, 3, 9, 12, 0, 4, 6, 8, 10, 11, 2, 1}, {2, 8});
    NoGrad ng;
    Tensor before = m.forward(ids).val();
    for (const char* method : {"mean", "first"}) {
      auto out = convert_kv_heads(m, G, parse_convert_method(method));
      Tensor after = out->forward(ids).val();
      double worst = 0;
      for (int64_t i = 0; i < after.numel(); i++) worst = std::max(worst, double(std::fabs(after[i] - before[i])));
      BOOST_TEST(worst < 1e-6, method << " G=" << G << ": max |diff| " << worst);
    }
  }
}

BOOST_AUTO_TEST_CASE(conversion_identity_random_and_errors) {
  std::unique_ptr<GPT> m = load_model(parity_fixture("gqa.h5"));
  auto same = convert_kv_heads(*m, 2, ConvertMethod::Mean);
  auto a = m->named_parameters(), b = same->named_parameters();
  for (size_t i = 0; i < a.size(); i++) BOOST_TEST(a[i].second.val().to_vector() == b[i].second.val().to_vector());
  auto r = convert_kv_heads(*m, 1, ConvertMethod::Random, 5);
  const Tensor& wk = r->blocks[0]->attn->wk->weight.val();
  double s2 = 0;
  for (int64_t i = 0; i < wk.numel(); i++) s2 += double(wk[i]) * wk[i];
  BOOST_TEST(std::sqrt(s2 / wk.numel()) == 0.02, tt::tolerance(0.15));
  BOOST_CHECK_EXCEPTION(convert_kv_heads(*m, 3, ConvertMethod::Mean), Error, is_kind(ErrorKind::config));
  BOOST_CHECK_EXCEPTION(convert_kv_heads(*m, 4, ConvertMethod::Mean), Error, is_kind(ErrorKind::config));  // 2 -> 4 is not a pooling
  BOOST_CHECK_EXCEPTION(parse_convert_method("median"), Error, is_kind(ErrorKind::usage));
  TempDir d;
  Run bad = run_cli("convert --from " + parity_fixture("gqa.h5") + " --kv-heads 3 --out " + (d / "never.h5"));
  expect_error(bad, "cannot convert 2 kv heads to 3");
  BOOST_TEST(!fs::exists(d / "never.h5"));
}

BOOST_AUTO_TEST_CASE(uptraining_lowers_the_loss_counts_steps_and_resumes) {
  TempDir d;
  TrainOptions quiet;
  quiet.quiet = true;
  TrainConfig pre = tiny_train(40);
  pre.model.n_kv_head = 4;
  pre.model.dropout = 0;
  pre.lr_decay_iters = 40;
  tapelm::train(pre, shakespeare(), d / "mha", quiet);
  UptrainOptions o;
  o.kv_heads = 1;
  o.fraction = 0.25;
  o.quiet = true;
  UptrainResult r = uptrain(d / "mha/checkpoint.h5", shakespeare(), d / "mqa", o);
  BOOST_TEST(r.steps == 10);  // 0.25 × 40
  BOOST_TEST(H5File::open_read(d / "mqa/checkpoint.h5").read_attr_int("/train", "step") == 10);
  BOOST_TEST(r.val_loss < r.loss_before, "uptrained " << r.val_loss << " vs converted " << r.loss_before);
  BOOST_TEST(r.config.model.n_kv_head == 1);
  // continue: the original run's final learning rate, constant
  TrainConfig cont = uptrain_config(pre, {.kv_heads = 2, .fraction = 0.1, .schedule = UptrainSchedule::Continue});
  BOOST_TEST(cont.max_iters == 4);
  BOOST_TEST(cont.learning_rate == lr_at(40, pre.schedule()));
  BOOST_TEST(!cont.decay_lr);
  // interrupted after its first step (a signal), then resumed: the same weights as in one go
  o.stop = signal_stop_token();
  std::raise(SIGINT);
  uptrain(d / "mha/checkpoint.h5", shakespeare(), d / "mqa2", o);
  BOOST_TEST(H5File::open_read(d / "mqa2/checkpoint.h5").read_attr_int("/train", "step") == 1);
  o.stop.clear();
  o.resume = true;
  UptrainResult r2 = uptrain(d / "mha/checkpoint.h5", shakespeare(), d / "mqa2", o);
  BOOST_TEST(r2.val_loss == r.val_loss);
  H5File a = H5File::open_read(d / "mqa/checkpoint.h5"), b = H5File::open_read(d / "mqa2/checkpoint.h5");
  for (const std::string& n : a.list_datasets_recursive("/model"))
    BOOST_TEST(a.read_tensor("/model/" + n).to_vector() == b.read_tensor("/model/" + n).to_vector(), n);
  // α = 0: convert and evaluate only
  o.resume = false;
  o.fraction = 0;
  UptrainResult z = uptrain(d / "mha/checkpoint.h5", shakespeare(), d / "zero", o);
  BOOST_TEST(z.steps == 0);
  BOOST_TEST(z.val_loss == z.loss_before);
}

BOOST_AUTO_TEST_SUITE_END()
