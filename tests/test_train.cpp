// Conversion, the trainer (bit-exact resume, NaN stop, signals), evaluation and the CLI's
// handling of bad input.
#include <sys/wait.h>

#include <csignal>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/dataset.h"
#include "data/tokens.h"
#include "train/checkpoint/checkpoint.h"
#include "train/convert.h"
#include "train/uptrain.h"
#include "train/trainer.h"
#include "test_util.h"

using namespace tapelm;
using namespace tapelm::test;
namespace fs = std::filesystem;
namespace tt = boost::test_tools;

namespace {

const Corpus& shakespeare() {
  static Corpus c = load_corpus(std::string(TAPELM_SOURCE_DIR) + "/corpora/tinyshakespeare.txt");
  return c;
}

TrainConfig tiny_train(int64_t iters) {
  nlohmann::json j = {{"vocab_size", 65}, {"n_layer", 2},         {"n_head", 4},          {"n_kv_head", 2},
                      {"n_embd", 32},     {"block_size", 16},     {"batch_size", 4},      {"max_iters", iters},
                      {"dropout", 0.1},   {"learning_rate", 3e-3}, {"min_lr", 3e-4},      {"warmup_iters", 6},
                      {"lr_decay_iters", 10}, {"grad_clip", 0.5}, {"eval_interval", 5},   {"eval_iters", 2},
                      {"log_interval", 1}, {"checkpoint_interval", 100}, {"seed", 7}};
  return TrainConfig::from_json(j);
}

std::string fixture(const std::string& name) { return test::fixture_path("parity/" + name); }

}  // namespace

BOOST_AUTO_TEST_SUITE(train)

// ---- conversion -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(conversion_reproduces_the_reference) {
  H5File f = H5File::open_read(fixture("convert_mha.h5"));
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
    GPTConfig c;
    c.vocab_size = 13;
    c.block_size = 8;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = 4;
    c.n_embd = 16;
    c.mlp_hidden = 32;
    c.bias = true;
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
  std::unique_ptr<GPT> m = load_model(fixture("gqa.h5"));
  auto same = convert_kv_heads(*m, 2, ConvertMethod::Mean);
  auto a = m->named_parameters(), b = same->named_parameters();
  for (size_t i = 0; i < a.size(); i++) BOOST_TEST(a[i].second.val().to_vector() == b[i].second.val().to_vector());
  auto r = convert_kv_heads(*m, 1, ConvertMethod::Random, 5);
  const Tensor& wk = r->blocks[0]->attn->wk->weight.val();
  double s2 = 0;
  for (int64_t i = 0; i < wk.numel(); i++) s2 += double(wk[i]) * wk[i];
  BOOST_TEST(std::sqrt(s2 / wk.numel()) == 0.02, tt::tolerance(0.15));
  BOOST_CHECK_THROW(convert_kv_heads(*m, 3, ConvertMethod::Mean), std::invalid_argument);
  BOOST_CHECK_THROW(convert_kv_heads(*m, 4, ConvertMethod::Mean), std::invalid_argument);  // 2 -> 4 is not a pooling
  BOOST_CHECK_THROW(parse_convert_method("median"), std::invalid_argument);
  Run bad = run_cli("convert --from " + fixture("gqa.h5") + " --kv-heads 3 --out /tmp/never.h5");
  expect_error(bad, "cannot convert 2 kv heads to 3");
  BOOST_TEST(!fs::exists("/tmp/never.h5"));
}

// ---- the trainer --------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(resume_is_bit_exact) {
  // AdamW, clipping, dropout 0.1 and a warmup (6 steps) that spans the break at step 4.
  TempDir d;
  TrainOptions quiet;
  quiet.quiet = true;
  tapelm::train(tiny_train(8), shakespeare(), d / "straight", quiet);
  tapelm::train(tiny_train(4), shakespeare(), d / "split", quiet);
  TrainOptions resume = quiet;
  resume.resume = true;
  TrainResult r = tapelm::train(tiny_train(8), shakespeare(), d / "split", resume);
  BOOST_TEST(r.steps == 8);
  auto m1 = read_metrics(d / "straight/metrics.jsonl"), m2 = read_metrics(d / "split/metrics.jsonl");
  BOOST_TEST_REQUIRE(m1.size() == m2.size());
  for (size_t i = 0; i < m1.size(); i++) {
    BOOST_TEST(m1[i]["step"] == m2[i]["step"]);
    if (m1[i].contains("train_loss")) BOOST_TEST(m1[i]["train_loss"].get<double>() == m2[i]["train_loss"].get<double>());
  }
  BOOST_TEST(m1.back()["val_loss_full"].get<double>() == m2.back()["val_loss_full"].get<double>());
  bool first_half_closed = false;  // the first call's own last step (4) had its closing evaluation
  for (const auto& rec : m2) first_half_closed |= rec["step"] == 4 && rec.contains("val_loss_full");
  BOOST_TEST(first_half_closed);
  H5File a = H5File::open_read(d / "straight/checkpoint.h5"), b = H5File::open_read(d / "split/checkpoint.h5");
  for (const std::string& n : a.list_datasets_recursive("/model")) {
    BOOST_TEST(a.read_tensor("/model/" + n).to_vector() == b.read_tensor("/model/" + n).to_vector(), n);
    BOOST_TEST(a.read_tensor("/optim/exp_avg_sq/" + n).to_vector() == b.read_tensor("/optim/exp_avg_sq/" + n).to_vector(), n);
  }
  BOOST_TEST(a.read_attr_int("/train", "step") == 8);
  BOOST_TEST(b.read_attr_int("/train", "tokens_seen") == 8 * 4 * 16);
}

BOOST_AUTO_TEST_CASE(the_trainers_pieces_make_the_run_train_makes) {
  TempDir d;
  TrainOptions quiet;
  quiet.quiet = true;
  tapelm::train(tiny_train(3), shakespeare(), d / "whole", quiet);
  fs::create_directories(d / "parts");
  std::ofstream(d / "parts/checkpoint.h5.tmp.123") << "left behind by a killed job";
  Trainer t(tiny_train(3), shakespeare(), d / "parts", quiet);
  BOOST_TEST(!fs::exists(d / "parts/checkpoint.h5.tmp.123"));
  for (int i = 0; i < 3; i++) BOOST_TEST(std::isfinite(t.step().loss));
  BOOST_TEST(t.steps_done() == 3);
  t.save();
  H5File a = H5File::open_read(d / "whole/checkpoint.h5"), b = H5File::open_read(d / "parts/checkpoint.h5");
  for (const std::string& n : a.list_datasets_recursive("/model"))
    BOOST_TEST(a.read_tensor("/model/" + n).to_vector() == b.read_tensor("/model/" + n).to_vector(), n);
  BOOST_TEST(b.read_attr_int("/train", "step") == 3);
}

BOOST_AUTO_TEST_CASE(training_lowers_the_loss_and_grad_accum_matches_a_big_batch) {
  TempDir d;
  TrainOptions quiet;
  quiet.quiet = true;
  TrainConfig c = tiny_train(40);
  c.model.dropout = 0;
  c.lr_decay_iters = 40;
  TrainResult r = tapelm::train(c, shakespeare(), d / "run", quiet);
  auto m = read_metrics(d / "run/metrics.jsonl");
  BOOST_TEST(m.front()["val_loss"].get<double>() > r.val_loss + 0.5, "val loss " << m.front()["val_loss"] << " -> " << r.val_loss);
  BOOST_TEST(m.front()["val_loss"].get<double>() == std::log(65.0), tt::tolerance(0.05));
  // the final evaluation covers the whole val split: the same number as evaluating the saved
  // weights afresh, on the last record only
  std::unique_ptr<GPT> saved = load_model(d / "run/checkpoint.h5");
  BOOST_TEST(r.val_loss_full == evaluate_split(*saved, shakespeare().val));
  BOOST_TEST(r.val_loss_full != r.val_loss);
  BOOST_TEST(m.back()["val_loss_full"].get<double>() == r.val_loss_full);
  for (size_t i = 0; i + 1 < m.size(); i++) BOOST_TEST(!m[i].contains("val_loss_full"), "record " << i);
  // two micro-batches of 4 accumulate to the step one batch of 8 takes (the sampler draws the
  // same 8 windows in the same order); equal up to float summation order
  TrainConfig acc = c, big = c;
  acc.max_iters = big.max_iters = 1;
  acc.grad_accum = 2;
  big.batch_size = 8;
  tapelm::train(acc, shakespeare(), d / "acc", quiet);
  tapelm::train(big, shakespeare(), d / "big", quiet);
  H5File fa = H5File::open_read(d / "acc/checkpoint.h5"), fb = H5File::open_read(d / "big/checkpoint.h5");
  for (const std::string& n : fa.list_datasets_recursive("/model")) {
    Tensor a = fa.read_tensor("/model/" + n), b = fb.read_tensor("/model/" + n);
    double worst = 0;
    for (int64_t i = 0; i < a.numel(); i++) worst = std::max(worst, double(std::fabs(a[i] - b[i])));
    BOOST_TEST(worst < 1e-6, n << ": max |diff| " << worst);
  }
}

BOOST_AUTO_TEST_CASE(nan_loss_stops_and_keeps_the_last_checkpoint) {
  TempDir d;
  TrainOptions quiet;
  quiet.quiet = true;
  TrainConfig c = tiny_train(50);
  c.learning_rate = 1e12;
  c.min_lr = 1e12;
  c.warmup_iters = 0;
  c.grad_clip = 0;
  c.checkpoint_interval = 1;
  try {
    tapelm::train(c, shakespeare(), d / "run", quiet);
    BOOST_ERROR("training with lr 1e12 did not stop");
  } catch (const TrainError& e) {
    const std::string msg = e.what();
    BOOST_TEST((msg.find("NaN") != std::string::npos || msg.find("Inf") != std::string::npos), msg);
  }
  // whatever step it stopped at, the checkpoint on disk is a complete, loadable file
  BOOST_TEST_REQUIRE(fs::exists(d / "run/checkpoint.h5"));
  BOOST_CHECK_NO_THROW(load_model(d / "run/checkpoint.h5"));
  for (const auto& e : fs::directory_iterator(d / "run"))
    BOOST_TEST(e.path().filename().string().find(".tmp") == std::string::npos, e.path());
}

BOOST_AUTO_TEST_CASE(sigint_saves_and_exits_cleanly) {
  TempDir d;
  std::ofstream(d / "cfg.json") << tiny_train(1000000).to_json().dump();
  Run r = run_cli("train --config " + (d / "cfg.json") + " --data " + std::string(TAPELM_SOURCE_DIR) +
                      "/corpora/tinyshakespeare.txt --out " + (d / "run") + " --set log_interval=50",
                  "timeout --preserve-status -s INT 4 ");
  BOOST_TEST(r.code == 0, r.err);
  BOOST_TEST(r.out.find("stopped by signal at step") != std::string::npos, r.out);
  H5File f = H5File::open_read(d / "run/checkpoint.h5");
  BOOST_TEST(f.read_attr_int("/train", "step") > 0);
  // and it resumes from there
  Run again = run_cli("train --out " + (d / "run") + " --resume --quiet --set max_iters=" +
                      std::to_string(f.read_attr_int("/train", "step") + 2) + " --data " +
                      std::string(TAPELM_SOURCE_DIR) + "/corpora/tinyshakespeare.txt");
  BOOST_TEST(again.code == 0, again.err);
}

// ---- uptraining ------------------------------------------------------------------------------------

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

// ---- the command line with good and bad input -----------------------------------------------------

BOOST_AUTO_TEST_CASE(eval_cli_on_a_parity_fixture) {
  TempDir d;
  const std::string f = fixture("mha.h5");
  Run r = run_cli("eval --checkpoint " + f + " --data " + f + " --grad-out " + (d / "g.h5") + " --json");
  BOOST_TEST_REQUIRE(r.code == 0, r.err);
  nlohmann::json j = nlohmann::json::parse(r.out);
  H5File fx = H5File::open_read(f), g = H5File::open_read(d / "g.h5");
  const double want = fx.read_attr_double("/expected", "loss");
  BOOST_TEST(std::fabs(j["loss"].get<double>() - want) / want < 1e-5);
  BOOST_TEST(j["tokens"].get<int64_t>() == 48);
  BOOST_TEST(j["perplexity"].get<double>() == std::exp(want), tt::tolerance(1e-4));
  BOOST_TEST(g.read_attr_double("/", "loss") == want, tt::tolerance(1e-5));
  for (const std::string& n : fx.list_datasets_recursive("/expected/grad")) {
    Tensor a = g.read_tensor("/grad/" + n), b = fx.read_tensor("/expected/grad/" + n);
    double num = 0, den = 0;
    for (int64_t i = 0; i < a.numel(); i++) num += std::pow(a[i] - b[i], 2), den += double(b[i]) * b[i];
    BOOST_TEST(std::sqrt(num / den) < 1e-4, n);
  }
}

BOOST_AUTO_TEST_CASE(bad_input_gives_one_clear_line) {
  TempDir d;
  const std::string text = std::string(TAPELM_SOURCE_DIR) + "/corpora/tinyshakespeare.txt";
  std::ofstream(d / "cfg.json") << R"({"n_layer": 1, "n_head": 2, "n_embd": 8, "block_size": 8, "max_iters": 2, "batch_size": 2})";
  const std::string cfg = " --config " + (d / "cfg.json");
  auto train_with = [&](const std::string& data, const std::string& extra = "") {
    return run_cli("train" + cfg + " --data " + data + " --out " + (d / "out") + extra + " --quiet");
  };
  expect_error(train_with(d / "missing.txt"), "missing.txt");
  std::ofstream(d / "empty.txt").close();
  expect_error(train_with(d / "empty.txt"), "empty.txt");
  std::ofstream(d / "short.txt") << "to be or not";
  expect_error(train_with(d / "short.txt"), "shorter than block_size + 1");
  expect_error(train_with(text, " --set n_layerz=3"), "unknown config key 'n_layerz'");
  expect_error(train_with(text, " --set batch_size='\"big\"'"), "'batch_size' must be an integer");
  expect_error(train_with(text, " --set n_kv_head=3 --set n_head=2"), "n_head 2 is not divisible by n_kv_head 3");
  expect_error(run_cli("train --out " + (d / "nothing") + " --resume --data " + text), "checkpoint.h5");
  expect_error(train_with(text, " --set vocab_size=10"), "vocab_size");
  std::ofstream(d / "afile") << "x";
  expect_error(run_cli("train" + cfg + " --data " + text + " --out " + (d / "afile") + "/run --quiet"), "afile");
  BOOST_TEST(!fs::exists(d / "out/checkpoint.h5"));

  // token files: bad header, size disagreeing with the count, ids beyond the vocabulary
  const std::string ck = fixture("mha.h5");
  write_token_file(d / "ok.bin", std::vector<int32_t>(40, 3));
  {
    std::fstream f(d / "ok.bin", std::ios::in | std::ios::out | std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::ofstream(d / "badmagic.bin", std::ios::binary).write("XXXX", 4).write(bytes.data() + 4, bytes.size() - 4);
    std::ofstream(d / "badsize.bin", std::ios::binary).write(bytes.data(), bytes.size() - 2);
  }
  expect_error(run_cli("eval --checkpoint " + ck + " --data " + (d / "badmagic.bin")), "badmagic.bin");
  expect_error(run_cli("eval --checkpoint " + ck + " --data " + (d / "badsize.bin")), "badsize.bin");
  write_token_file(d / "bigid.bin", std::vector<int32_t>(40, 70));
  expect_error(run_cli("eval --checkpoint " + ck + " --data " + (d / "bigid.bin")), "70");

  // nothing half-written anywhere
  for (const auto& e : fs::recursive_directory_iterator(d.path))
    BOOST_TEST(e.path().string().find(".tmp") == std::string::npos, e.path());
}

BOOST_AUTO_TEST_CASE(train_sample_and_inspect_cli) {
  TempDir d;
  const std::string text = std::string(TAPELM_SOURCE_DIR) + "/corpora/tinyshakespeare.txt";
  std::ofstream(d / "cfg.json") << R"({"n_layer": 1, "n_head": 2, "n_kv_head": 1, "n_embd": 16, "block_size": 16,
    "max_iters": 3, "batch_size": 2, "eval_iters": 1, "eval_interval": 2, "log_interval": 1})";
  Run t = run_cli("train --config " + (d / "cfg.json") + " --data " + text + " --out " + (d / "run"));
  BOOST_TEST_REQUIRE(t.code == 0, t.err);
  BOOST_TEST(t.out.find("step 3/3") != std::string::npos, t.out);
  BOOST_TEST(t.out.find("tok/s") != std::string::npos);
  BOOST_TEST(t.out.find("ETA") != std::string::npos);
  auto m = read_metrics(d / "run/metrics.jsonl");
  BOOST_TEST(m.back()["step"] == 3);
  for (const char* k : {"train_loss", "val_loss", "lr", "tokens_per_s", "val_loss_full"}) BOOST_TEST(m.back().contains(k), k);
  Run s = run_cli("sample --checkpoint " + (d / "run/checkpoint.h5") + " --prompt ROMEO: --tokens 20 --seed 3");
  BOOST_TEST(s.code == 0, s.err);
  BOOST_TEST(s.out.rfind("ROMEO:", 0) == 0u, s.out);
  Run s2 = run_cli("sample --checkpoint " + (d / "run/checkpoint.h5") + " --prompt ROMEO: --tokens 20 --seed 3");
  BOOST_TEST(s.out == s2.out);
  expect_error(run_cli("sample --checkpoint " + (d / "run/checkpoint.h5") + " --prompt 'é'"), "U+00E9");
  Run i = run_cli("inspect " + (d / "run/checkpoint.h5"));
  BOOST_TEST(i.code == 0, i.err);
  BOOST_TEST(i.out.find("KV-cache bytes per token 64") != std::string::npos, i.out);  // (K, V) · 1 layer · 1 head · hd 8 · 4 bytes
  BOOST_TEST(i.out.find("MQA") != std::string::npos, i.out);
  Run e = run_cli("eval --checkpoint " + (d / "run/checkpoint.h5") + " --data " + text + " --json");
  BOOST_TEST(e.code == 0, e.err);
  // the val split (111,540 tokens) in non-overlapping windows of 16 positions
  BOOST_TEST(nlohmann::json::parse(e.out)["tokens"].get<int64_t>() == (111540 - 1) / 16 * 16);
  // train's closing figure is what `eval` says of the checkpoint (other batching: float order only)
  BOOST_TEST(m.back()["val_loss_full"].get<double>() == nlohmann::json::parse(e.out)["loss"].get<double>(),
             tt::tolerance(1e-5));
  BOOST_TEST(t.out.find("val loss on the whole val split") != std::string::npos, t.out);
}

BOOST_AUTO_TEST_SUITE_END()
