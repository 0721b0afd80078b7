// The checkpoint format (docs/formats.md §2): full round trips, weights-only and h5py-written files, the
// optimizer hyper-parameters read back on resume, mismatches that load nothing, the files derived
// from checkpoints (eval's gradients, convert's output), and the CLI's one-line errors.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <unistd.h>
#include <csignal>
#include <sys/wait.h>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>

#include "data/io.h"
#include "data/tempfile.h"
#include "train/formats/checkpoint.h"
#include "data/io.h"
#include "test_util.h"
#include "data/tokenizer/char.h"
#include "data/tokenizer/sentencepiece.h"
#include "train/train_config.h"

using namespace tapelm;
using namespace tapelm::test;
namespace fs = std::filesystem;

namespace {

TrainConfig tiny_config(const std::string& optimizer = "adamw", bool tied = true) {
  return TrainConfig::from_json({{"vocab_size", 12}, {"n_layer", 1}, {"n_head", 2}, {"n_kv_head", 1},
                                 {"n_embd", 8}, {"block_size", 8}, {"tie_embeddings", tied},
                                 {"optimizer", optimizer}, {"learning_rate", 1e-3}, {"beta2", 0.99}});
}

const Tokenizer& tokenizer() {
  static Tokenizer t = Tokenizer::of(CharTokenizer::from_text("abcdefghijkl"));
  return t;
}

// One optimizer step on made-up gradients, so every state tensor exists and differs from zero.
void take_a_step(const NamedParams& params, Optimizer& opt) {
  for (const auto& [name, p] : params)
    for (int64_t i = 0; i < p.numel(); i++) p.grad().data()[i] = 0.01f * static_cast<float>(i % 7) - 0.02f;
  opt.step(1e-3);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A trained-looking full checkpoint of tiny_config(optimizer, tied) at path.
void save_tiny(const std::string& path, const std::string& optimizer = "adamw", bool tied = true) {
  const TrainConfig cfg = tiny_config(optimizer, tied);
  GPT model(cfg.model, 5);
  auto opt = cfg.make_optimizer(model.named_parameters());
  take_a_step(model.named_parameters(), *opt);
  TrainState st;
  st.step = 1;
  st.tokens_seen = 16;
  save_training_checkpoint(path, model, *opt, cfg, st, tokenizer());
}

// A copy of the full checkpoint src at dst with edit applied to each tensor as it is copied (the
// savers refuse non-finite tensors, so a bad file is made by hand).
void copy_checkpoint(const std::string& src, const std::string& dst,
                     const std::function<void(const std::string&, Tensor&)>& edit) {
  H5File in = H5File::open_read(src);
  H5File out = H5File::create(dst);
  for (const char* a : {"format", "config"}) out.write_attr("/", a, in.read_attr_string("/", a));
  out.write_attr("/", "format_version", in.read_attr_int("/", "format_version"));
  for (const std::string& n : in.list_datasets_recursive("/")) {
    if (n.find("sampler_state") != std::string::npos) {
      out.write_bytes(n, in.read_bytes(n));
      continue;
    }
    Tensor t = in.read_tensor(n);
    edit("/" + n, t);
    out.write_tensor(n, t);
  }
  for (const char* a : {"type", "hparams"}) out.write_attr("/optim", a, in.read_attr_string("/optim", a));
  out.write_attr("/optim", "step", in.read_attr_int("/optim", "step"));
  for (const char* a : {"config", "dropout_rng", "extra"}) out.write_attr("/train", a, in.read_attr_string("/train", a));
  for (const char* a : {"step", "tokens_seen"}) out.write_attr("/train", a, in.read_attr_int("/train", a));
}

/// AdamW whose recorded hyper-parameters are whatever the test says.
struct AdamWRecording : AdamW {
  std::string json;
  AdamWRecording(NamedParams p, std::string j) : AdamW(std::move(p), 1e-3), json(std::move(j)) {}
  std::string hparams_json() const override { return json; }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(checkpoint)

BOOST_AUTO_TEST_CASE(full_round_trip_restores_everything) {
  TempDir d;
  const TrainConfig cfg = tiny_config();
  GPT model(cfg.model, 5);
  auto opt = cfg.make_optimizer(model.named_parameters());
  take_a_step(model.named_parameters(), *opt);
  take_a_step(model.named_parameters(), *opt);
  TrainState st;
  st.step = 2;
  st.tokens_seen = 123456789012;
  st.dropout_rng = 0xFEDCBA9876543210ull;  // above int64: stored as a string
  st.sampler_state = std::string("\0\x01\xff state", 9);
  st.extra_json = R"({"uptrain_from": "x.h5"})";
  st.world_size = 3;
  st.rank_dropout_rngs = {11, 12};
  st.rank_sampler_states = {"one", ""};
  save_training_checkpoint(d / "ck.h5", model, *opt, cfg, st, tokenizer());

  GPT back(cfg.model, 99);
  auto opt2 = cfg.make_optimizer(back.named_parameters());
  TrainState st2;
  H5File f = H5File::open_read(d / "ck.h5");
  load_training_checkpoint(f, back, *opt2, st2);
  auto a = model.named_parameters(), b = back.named_parameters();
  BOOST_TEST_REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); i++) {
    BOOST_TEST(same_bits(a[i].second.val(), b[i].second.val()), a[i].first);
    for (const std::string& key : opt->state_keys())
      BOOST_TEST(same_bits(opt->state(key).at(a[i].first).f32(), opt2->state(key).at(a[i].first).f32()), key << " " << a[i].first);
  }
  BOOST_TEST(opt2->steps() == 2);
  BOOST_TEST(st2.step == 2);
  BOOST_TEST(st2.tokens_seen == 123456789012);
  BOOST_TEST(st2.dropout_rng == 0xFEDCBA9876543210ull);
  BOOST_TEST(back.dropout_rng().state() == 0xFEDCBA9876543210ull);
  BOOST_TEST(st2.sampler_state == st.sampler_state);
  BOOST_TEST(st2.extra_json == st.extra_json);
  BOOST_TEST(st2.world_size == 3);
  BOOST_TEST(st2.rank_dropout_rngs == st.rank_dropout_rngs);
  BOOST_TEST(st2.rank_sampler_states == st.rank_sampler_states);
  BOOST_TEST(st2.optim_hparams_changed.empty(), st2.optim_hparams_changed);
  BOOST_TEST(read_train_config(f).to_json() == cfg.to_json());
  BOOST_TEST((read_tokenizer(f) == tokenizer()));
  BOOST_TEST(has_train_config(f));
  BOOST_TEST(has_tokenizer(f));
  const CheckpointInfo info = inspect_checkpoint(d / "ck.h5");
  BOOST_TEST((info.config == cfg.model));
  BOOST_TEST(info.has_train);
  BOOST_TEST(info.step == 2);
  BOOST_TEST(info.tokens_seen == 123456789012);
  BOOST_TEST(info.has_tokenizer);
  // A one-process run writes no per-rank groups, so its files are as before multi-rank runs.
  st.world_size = 1;
  save_training_checkpoint(d / "one.h5", model, *opt, cfg, st, tokenizer());
  TrainState st3;
  load_training_checkpoint(H5File::open_read(d / "one.h5"), back, *opt2, st3);
  BOOST_TEST(st3.world_size == 1);
  BOOST_TEST(st3.rank_sampler_states.empty());
}

BOOST_AUTO_TEST_CASE(optimizer_hparams_are_read_back_on_resume) {
  TempDir d;
  save_tiny(d / "ck.h5");
  const TrainConfig saved_cfg = tiny_config();
  GPT saved(saved_cfg.model, 5);
  auto saved_opt = saved_cfg.make_optimizer(saved.named_parameters());
  take_a_step(saved.named_parameters(), *saved_opt);

  // The same hyper-parameters: nothing to report.
  {
    GPT m(saved_cfg.model, 1);
    auto opt = saved_cfg.make_optimizer(m.named_parameters());
    TrainState st;
    load_training_checkpoint(H5File::open_read(d / "ck.h5"), m, *opt, st);
    BOOST_TEST(st.optim_hparams_changed.empty(), st.optim_hparams_changed);
  }
  // Other ones: the state comes from the checkpoint, the hyper-parameters stay the run's, and
  // every difference is named.
  TrainConfig run = saved_cfg;
  run.learning_rate = 3e-4;
  run.beta2 = 0.95;
  GPT m(run.model, 1);
  auto opt = run.make_optimizer(m.named_parameters());
  TrainState st;
  load_training_checkpoint(H5File::open_read(d / "ck.h5"), m, *opt, st);
  BOOST_TEST(st.optim_hparams_changed == "beta2 0.99 -> 0.95, lr 0.001 -> 0.0003");
  const auto& h = dynamic_cast<const AdamW&>(*opt).hparams();
  BOOST_TEST(h.lr == 3e-4);
  BOOST_TEST(h.beta2 == 0.95);
  BOOST_TEST(opt->steps() == 1);
  for (const auto& [name, p] : saved.named_parameters())
    BOOST_TEST(same_bits(opt->state("exp_avg_sq").at(name).f32(), saved_opt->state("exp_avg_sq").at(name).f32()), name);

  // Hyper-parameters the optimizer would not accept are a bad checkpoint, and nothing loads.
  {
    GPT w(saved_cfg.model, 5);
    AdamWRecording bad(w.named_parameters(), R"({"lr": 0.001, "momentum": 0.9})");
    save_training_checkpoint(d / "bad.h5", w, bad, saved_cfg, TrainState{}, tokenizer());
    GPT target(saved_cfg.model, 1);
    auto o = saved_cfg.make_optimizer(target.named_parameters());
    const float before = target.named_parameters()[0].second.val()[0];
    TrainState s;
    const std::string msg = error_of([&] { load_training_checkpoint(H5File::open_read(d / "bad.h5"), target, *o, s); });
    BOOST_TEST(msg.find("bad.h5") != std::string::npos, msg);
    BOOST_TEST(msg.find("hparams") != std::string::npos, msg);
    BOOST_TEST(msg.find("momentum") != std::string::npos, msg);
    BOOST_TEST(target.named_parameters()[0].second.val()[0] == before);
    BOOST_TEST(o->steps() == 0);
  }
  // Another optimizer type is an error, not a silent fresh start.
  {
    const TrainConfig sgd = tiny_config("sgd");
    GPT target(sgd.model, 1);
    auto o = sgd.make_optimizer(target.named_parameters());
    TrainState s;
    const std::string msg = error_of([&] { load_training_checkpoint(H5File::open_read(d / "ck.h5"), target, *o, s); });
    BOOST_TEST(msg.find("optimizer state is adamw but the run uses sgd") != std::string::npos, msg);
  }
}

BOOST_AUTO_TEST_CASE(cli_resume_names_changed_hparams) {
  TempDir d;
  const std::string text = std::string(TAPELM_SOURCE_DIR) + "/corpora/tinyshakespeare.txt";
  std::ofstream(d / "cfg.json") << R"({"n_layer": 1, "n_head": 2, "n_embd": 8, "block_size": 8, "max_iters": 2,
    "batch_size": 2, "eval_iters": 1, "eval_interval": 2, "warmup_iters": 0, "learning_rate": 0.001})";
  const std::string base = "train --config " + (d / "cfg.json") + " --data " + text + " --out " + (d / "run");
  Run first = run_cli(base + " --quiet");
  BOOST_TEST_REQUIRE(first.code == 0, first.err);
  Run same = run_cli(base + " --resume --set max_iters=3");
  BOOST_TEST_REQUIRE(same.code == 0, same.err);
  BOOST_TEST(same.out.find("hyper-parameters") == std::string::npos, same.out);
  Run changed = run_cli(base + " --resume --set max_iters=4 --set learning_rate=0.0005");
  BOOST_TEST_REQUIRE(changed.code == 0, changed.err);
  BOOST_TEST(changed.out.find("not the checkpoint's: lr 0.001 -> 0.0005") != std::string::npos, changed.out);
  BOOST_TEST(inspect_checkpoint(d / "run/checkpoint.h5").step == 4);
  // a switch of precision on resume is said too (it was silent); bf16-emulated runs on any CPU
  Run precision = run_cli(base + " --resume --set max_iters=5 --precision bf16-emulated");
  BOOST_TEST_REQUIRE(precision.code == 0, precision.err);
  BOOST_TEST(precision.out.find("resuming in precision bf16-emulated, where the checkpoint trained in f32") != std::string::npos, precision.out);
}

BOOST_AUTO_TEST_CASE(train_config_builds_its_optimizer_through_make_optimizer) {
  TrainConfig c = tiny_config("sgd");
  c.momentum = 0.8;
  c.nesterov = true;
  c.weight_decay = 0.05;
  GPT m(c.model, 1);
  auto sgd = c.make_optimizer(m.named_parameters());
  BOOST_TEST(sgd->type() == "sgd");
  const auto& hs = dynamic_cast<const SGD&>(*sgd).hparams();
  BOOST_TEST(hs.lr == 1e-3);
  BOOST_TEST(hs.momentum == 0.8);
  BOOST_TEST(hs.nesterov);
  BOOST_TEST(hs.weight_decay == 0.05);
  BOOST_TEST(hs.dampening == 0.0);
  c = tiny_config();
  c.eps = 1e-7;
  auto adamw = c.make_optimizer(m.named_parameters());
  const auto& ha = dynamic_cast<const AdamW&>(*adamw).hparams();
  BOOST_TEST(ha.beta1 == 0.9);
  BOOST_TEST(ha.beta2 == 0.99);
  BOOST_TEST(ha.eps == 1e-7);
  BOOST_TEST(ha.weight_decay == c.weight_decay);
  // What the checkpoint records reads back as the same optimizer.
  BOOST_TEST(make_optimizer("adamw", {}, adamw->hparams_json())->hparams_json() == adamw->hparams_json());
}

BOOST_AUTO_TEST_CASE(weights_only_files) {
  TempDir d;
  const TrainConfig cfg = tiny_config();
  GPT model(cfg.model, 5);
  save_model(d / "w.h5", model);
  std::unique_ptr<GPT> back = load_model(d / "w.h5").model;
  BOOST_TEST((back->config() == model.config()));
  auto a = model.named_parameters(), b = back->named_parameters();
  for (size_t i = 0; i < a.size(); i++) BOOST_TEST(same_bits(a[i].second.val(), b[i].second.val()), a[i].first);
  H5File f = H5File::open_read(d / "w.h5");
  BOOST_TEST(!has_train_config(f));
  BOOST_TEST(!has_tokenizer(f));
  BOOST_TEST(error_of([&] { read_train_config(f); }).find("no training state") != std::string::npos);
  BOOST_TEST(error_of([&] { read_tokenizer(f); }).find("no tokenizer") != std::string::npos);
  auto opt = cfg.make_optimizer(back->named_parameters());
  TrainState st;
  BOOST_TEST(error_of([&] { load_training_checkpoint(f, *back, *opt, st); }).find("not a full training checkpoint") !=
             std::string::npos);
  const CheckpointInfo info = inspect_checkpoint(d / "w.h5");
  BOOST_TEST(!info.has_train);
  BOOST_TEST(!info.has_tokenizer);
}

BOOST_AUTO_TEST_CASE(files_written_by_h5py_load) {
  // The parity fixtures were written by PyTorch + h5py: weights only, root attributes as h5py stores them.
  for (const char* name : {"mha.h5", "gqa.h5", "mqa.h5"}) {
    const std::string path = fixture_path(std::string("parity/") + name);
    std::unique_ptr<GPT> m = load_model(path).model;
    const CheckpointInfo info = inspect_checkpoint(path);
    BOOST_TEST((info.config == m->config()), name);
    BOOST_TEST(!info.has_train, name);
  }
}

BOOST_AUTO_TEST_CASE(optimizer_state_of_other_parameters_loads_nothing) {
  TempDir d;
  save_tiny(d / "untied.h5", "adamw", false);  // has optimizer state for lm_head.weight
  const TrainConfig cfg = tiny_config();
  GPT target(cfg.model, 1);
  auto opt = cfg.make_optimizer(target.named_parameters());
  const float before = target.named_parameters()[0].second.val()[0];
  TrainState st;
  st.step = 42;
  const std::string msg = error_of([&] { load_training_checkpoint(H5File::open_read(d / "untied.h5"), target, *opt, st); });
  BOOST_TEST(msg.find("lm_head.weight names no parameter") != std::string::npos, msg);
  BOOST_TEST(target.named_parameters()[0].second.val()[0] == before);
  BOOST_TEST(opt->state("exp_avg").empty());
  BOOST_TEST(st.step == 42);
}

BOOST_AUTO_TEST_CASE(gradients_and_converted_files) {
  TempDir d;
  const TrainConfig cfg = tiny_config();
  GPT model(cfg.model, 5);
  auto params = model.named_parameters();
  for (int64_t i = 0; i < params[0].second.numel(); i++) params[0].second.grad().data()[i] = 0.5f;
  write_gradients(d / "g.h5", model, 2.25);
  H5File g = H5File::open_read(d / "g.h5");
  BOOST_TEST(g.read_attr_double("/", "loss") == 2.25);
  BOOST_TEST(g.list_datasets_recursive("/grad").size() == params.size());
  BOOST_TEST(same_bits(g.read_tensor("/grad/" + params[0].first), params[0].second.grad()));
  BOOST_TEST(same_bits(g.read_tensor("/grad/" + params[1].first), Tensor::zeros(params[1].second.shape())));

  write_converted(d / "c.h5", model, &tokenizer(), R"({"kv_heads": 2, "method": "mean"})");
  H5File c = H5File::open_read(d / "c.h5");
  BOOST_TEST((read_tokenizer(c) == tokenizer()));
  BOOST_TEST(c.read_attr_string("/", "converted_from") == R"({"kv_heads": 2, "method": "mean"})");
  BOOST_TEST((load_model(d / "c.h5").model->config() == model.config()));
  write_converted(d / "c2.h5", model, nullptr, "{}");
  BOOST_TEST(!inspect_checkpoint(d / "c2.h5").has_tokenizer);
}

BOOST_AUTO_TEST_CASE(non_finite_weights_or_state_are_refused_on_load) {
  TempDir d;
  save_tiny(d / "good.h5");
  copy_checkpoint(d / "good.h5", d / "copy.h5", [](const std::string&, Tensor&) {});
  const TrainConfig cfg = tiny_config();
  GPT model(cfg.model, 1);
  auto opt = cfg.make_optimizer(model.named_parameters());
  TrainState st;
  load_training_checkpoint(H5File::open_read(d / "copy.h5"), model, *opt, st);  // the copy itself is good
  const float before = model.named_parameters()[0].second.val()[0];

  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::string obj;
    float value;
    std::string says;
  };
  for (const Case& c : {Case{"/model/wte.weight", nan, "NaN at index 5"}, Case{"/model/ln_f.weight", inf, "Inf at index 5"},
                        Case{"/optim/exp_avg_sq/wpe.weight", -inf, "-Inf at index 5"}}) {
    BOOST_TEST_CONTEXT(c.obj) {
      const std::string path = d / "bad.h5";
      copy_checkpoint(d / "good.h5", path, [&](const std::string& n, Tensor& t) {
        if (n == c.obj) t[5] = c.value;
      });
      expect_throw([&] { load_training_checkpoint(H5File::open_read(path), model, *opt, st); }, ErrorKind::checkpoint,
                   {path + ": " + c.obj + " holds " + c.says});
      if (c.obj.starts_with("/model"))
        expect_throw([&] { load_model(path); }, ErrorKind::checkpoint, {path + ": " + c.obj + " holds " + c.says});
      BOOST_TEST(model.named_parameters()[0].second.val()[0] == before);  // nothing restored
    }
  }
}

BOOST_AUTO_TEST_CASE(non_finite_weights_or_state_are_never_saved) {
  TempDir d;
  const TrainConfig cfg = tiny_config();
  GPT model(cfg.model, 5);
  auto opt = cfg.make_optimizer(model.named_parameters());
  take_a_step(model.named_parameters(), *opt);
  TrainState st;
  st.step = 3;
  save_training_checkpoint(d / "ck.h5", model, *opt, cfg, st, tokenizer());
  save_model(d / "w.h5", model);
  const std::vector<char> ck = file_bytes(d / "ck.h5"), w = file_bytes(d / "w.h5");
  st.step = 4;

  const std::string name = model.named_parameters()[2].first;
  Tensor& m = opt->state("exp_avg").at(name).tensor();
  m[1] = std::numeric_limits<float>::infinity();
  expect_throw([&] { save_training_checkpoint(d / "ck.h5", model, *opt, cfg, st, tokenizer()); }, ErrorKind::checkpoint,
               {"step 4: optimizer state exp_avg/" + name + " holds Inf at index 1", d / "ck.h5"});
  m[1] = 0;
  {  // bf16 moments, read in place: 0xFF80 is bf16's -Inf
    TrainConfig c16 = cfg;
    c16.moments = Moments::bf16;
    auto o16 = c16.make_optimizer(model.named_parameters());
    take_a_step(model.named_parameters(), *o16);
    o16->state("exp_avg_sq").at(name).bf16_data()[2] = 0xFF80;
    expect_throw([&] { save_training_checkpoint(d / "ck.h5", model, *o16, c16, st, tokenizer()); }, ErrorKind::checkpoint,
                 {"step 4: optimizer state exp_avg_sq/" + name + " holds -Inf at index 2", d / "ck.h5"});
  }
  model.named_parameters()[2].second.val()[3] = std::numeric_limits<float>::quiet_NaN();
  expect_throw([&] { save_training_checkpoint(d / "ck.h5", model, *opt, cfg, st, tokenizer()); }, ErrorKind::checkpoint,
               {"step 4: parameter " + name + " holds NaN at index 3", d / "ck.h5"});
  expect_throw([&] { save_model(d / "w.h5", model); }, ErrorKind::checkpoint, {"parameter " + name + " holds NaN"});
  expect_throw([&] { write_converted(d / "c.h5", model, nullptr, "{}"); }, ErrorKind::checkpoint, {"parameter " + name});
  // the previous files are untouched, and nothing else was written
  BOOST_TEST((file_bytes(d / "ck.h5") == ck));
  BOOST_TEST((file_bytes(d / "w.h5") == w));
  BOOST_TEST((d.listing() == std::set<std::string>{"ck.h5", "w.h5"}));
}

BOOST_AUTO_TEST_CASE(cli_refuses_non_finite_and_corrupted_checkpoints) {
  TempDir d;
  const std::string fixture = fixture_path("parity/mha.h5");  // its /tokens are the data
  std::unique_ptr<GPT> model = load_model(fixture).model;
  const std::string name = "blocks.0.mlp.fc.weight";
  const NamedParams params = model->named_parameters();
  const Var wv = std::find_if(params.begin(), params.end(), [&](const auto& np) { return np.first == name; })->second;
  Tensor w = wv.val();
  auto eval_ck = [&](const std::string& path, const std::string& flags = "") {
    return run_cli("eval --checkpoint " + path + " --data " + fixture + flags);
  };
  // weights that overflow in the forward pass: finite on disk, but no loss to print
  save_model(d / "huge.h5", *model);
  {
    std::unique_ptr<GPT> huge = load_model(d / "huge.h5").model;
    for (const auto& [n, p] : huge->named_parameters())
      for (int64_t i = 0; i < p.numel(); i++) p.val()[i] = 3e38f;
    save_model(d / "huge.h5", *huge);
  }
  for (const std::string flags : {"", " --json"}) {
    expect_error(eval_ck(d / "huge.h5", flags), d / "huge.h5");
    // one NaN or Inf weight: refused on load, naming the dataset
    for (const float v : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      const float keep = w[7];
      w[7] = v;
      {
        H5File f = H5File::create(d / "bad.h5");
        write_model(f, *model);
      }
      w[7] = keep;
      const Run r = eval_ck(d / "bad.h5", flags);
      expect_error(r, d / "bad.h5: /model/" + name + " holds " + (std::isnan(v) ? "NaN" : "Inf") + " at index 7");
      BOOST_TEST(r.out.empty(), r.out);
    }
  }
  // a flipped bit in a checksummed dataset: one line naming the file and the dataset
  save_model(d / "flip.h5", *model);
  std::vector<char> bytes = file_bytes(d / "flip.h5");
  const char* p = reinterpret_cast<const char*>(w.data());
  auto at = std::search(bytes.begin(), bytes.end(), p, p + w.numel() * 4);
  BOOST_TEST_REQUIRE((at != bytes.end()));
  at[123] ^= 0x01;
  std::ofstream(d / "flip.h5", std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  for (const std::string flags : {"", " --json"})
    expect_error(eval_ck(d / "flip.h5", flags), d / "flip.h5: cannot read dataset /model/" + name);
}

BOOST_AUTO_TEST_CASE(cli_rejects_bad_checkpoints_with_one_line) {
  TempDir d;
  const std::string text = std::string(TAPELM_SOURCE_DIR) + "/corpora/tinyshakespeare.txt";
  const std::string ck = fixture_path("parity/mha.h5");
  // checkpoints: another format, version or config; missing, extra, mis-shaped; truncated; garbage
  auto with_attr = [&](const std::string& name, const std::function<void(H5File&)>& edit) {
    fs::copy_file(ck, d / name);
    fs::permissions(d / name, fs::perms::owner_read | fs::perms::owner_write);
    H5File::open_read(d / name);  // a valid copy first
    {
      H5File f = H5File::create(d / (name + ".new"));
      H5File src = H5File::open_read(d / name);
      f.write_attr("/", "format", src.read_attr_string("/", "format"));
      f.write_attr("/", "format_version", src.read_attr_int("/", "format_version"));
      f.write_attr("/", "config", src.read_attr_string("/", "config"));
      for (const std::string& n : src.list_datasets_recursive("/model")) f.write_tensor("/model/" + n, src.read_tensor("/model/" + n));
      edit(f);
    }
    fs::rename(d / (name + ".new"), d / name);
    return d / name;
  };
  auto eval_ck = [&](const std::string& path) { return run_cli("eval --checkpoint " + path + " --data " + text); };
  expect_error(eval_ck(with_attr("fmt.h5", [](H5File& f) { f.write_attr("/", "format", std::string("pytorch")); })), "not a tapelm checkpoint");
  expect_error(eval_ck(with_attr("ver.h5", [](H5File& f) { f.write_attr("/", "format_version", int64_t(7)); })), "format_version 7");
  expect_error(eval_ck(with_attr("cfg.h5", [](H5File& f) { f.write_attr("/", "config", std::string(R"({"n_head": 3})")); })), "bad model config");
  expect_error(eval_ck(with_attr("extra.h5", [](H5File& f) { f.write_tensor("/model/blocks.9.attn.wq.weight", Tensor::zeros({2})); })), "extra blocks.9.attn.wq.weight");
  expect_error(eval_ck(with_attr("shape.h5", [](H5File& f) { f.write_tensor("/model/ln_f.weight", Tensor::zeros({31})); })), "mis-shaped ln_f.weight [31]");
  {
    // missing: a file without one parameter
    H5File src = H5File::open_read(ck);
    H5File f = H5File::create(d / "missing.h5");
    f.write_attr("/", "format", std::string("tapelm"));
    f.write_attr("/", "format_version", int64_t(1));
    f.write_attr("/", "config", src.read_attr_string("/", "config"));
    for (const std::string& n : src.list_datasets_recursive("/model"))
      if (n != "wpe.weight") f.write_tensor("/model/" + n, src.read_tensor("/model/" + n));
  }
  expect_error(eval_ck(d / "missing.h5"), "missing wpe.weight");
  {
    std::ifstream in(ck, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(d / "trunc.h5", std::ios::binary).write(bytes.data(), bytes.size() / 2);
    std::ofstream(d / "text.h5") << "not an hdf5 file at all\n";
  }
  expect_error(eval_ck(d / "trunc.h5"), "trunc.h5");
  expect_error(eval_ck(d / "text.h5"), "text.h5");
  expect_error(run_cli("sample --checkpoint " + ck), "no tokenizer");
  expect_error(run_cli("eval --checkpoint " + (d / "none.h5") + " --data " + text), "none.h5");
  expect_error(run_cli("uptrain --from " + ck + " --kv-heads 1 --method mean --fraction 0.1 --data " + text + " --out " +
                       (d / "up")),
               "weights only");
  // nothing half-written anywhere
  for (const auto& e : fs::recursive_directory_iterator(d.path))
    BOOST_TEST(e.path().string().find(".tmp") == std::string::npos, e.path());
}

BOOST_AUTO_TEST_CASE(sentencepiece_tokenizer_is_stored_and_old_char_files_load) {
  TempDir d;
  GPT model(tiny_config().model, 1);
  const Tokenizer sp = SentencePiece::load(
      read_file_bytes(test::fixture_path("spm_bpe512.model"), "model"));
  write_converted(d / "sp.h5", model, &sp, "{}");
  {
    H5File f = H5File::open_read(d / "sp.h5");
    const Tokenizer back = read_tokenizer(f);
    BOOST_TEST((back.kind() == TokenizerKind::sentencepiece));
    BOOST_TEST((back == sp));
    BOOST_TEST(back.encode("ROMEO: hello") == sp.encode("ROMEO: hello"));
    BOOST_TEST(f.read_attr_string("/tokenizer", "kind") == "sentencepiece");
  }
  // a file as tapelm wrote them before the kind attribute: /tokenizer with only attr json
  {
    H5File f = H5File::create(d / "old.h5");
    f.create_group("/tokenizer");
    f.write_attr("/tokenizer", "json", tokenizer().serialized());
  }
  {
    H5File f = H5File::open_read(d / "old.h5");
    BOOST_TEST((read_tokenizer(f) == tokenizer()));
  }
  // a corrupt model inside the checkpoint is one error naming the file
  {
    H5File f = H5File::create(d / "bad.h5");
    f.create_group("/tokenizer");
    f.write_attr("/tokenizer", "kind", std::string("sentencepiece"));
    f.write_bytes("/tokenizer/model", {1, 2, 3});
  }
  H5File bad = H5File::open_read(d / "bad.h5");
  const std::string e = error_of([&] { read_tokenizer(bad); });
  BOOST_TEST(e.find(d / "bad.h5") != std::string::npos);
  BOOST_TEST(e.find("not a sentencepiece model") != std::string::npos);
}

// A signal during a write used to leave `*.tmp.PID` files that nothing removed (convert, import,
// export: 12 of 12 timed trials). A child process stands for a tapelm command with the default
// signal dispositions: it holds a guarded temp file when the signal comes.
BOOST_AUTO_TEST_CASE(a_signal_mid_write_removes_the_temp_file_and_the_next_writer_removes_dead_ones) {
  TempDir d;
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    const std::string tmp = d / ("w.h5.tmp.child" + std::to_string(sig));
    const pid_t pid = ::fork();
    BOOST_TEST_REQUIRE(pid >= 0);
    if (pid == 0) {
      for (int s : {SIGTERM, SIGINT, SIGHUP}) ::signal(s, SIG_DFL);
      std::ofstream(tmp) << "half a checkpoint";
      const TempFileGuard guard(tmp);
      ::raise(sig);
      ::_exit(0);  // not reached: the signal ends the process
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    BOOST_TEST(WIFSIGNALED(status), "signal " << sig);
    BOOST_TEST((WIFSIGNALED(status) && WTERMSIG(status) == sig), "signal " << sig);
    BOOST_TEST(!fs::exists(tmp), "signal " << sig);
  }
  // kill -9 gives no chance: the next writer of the same path removes a dead process's temps and
  // leaves a live one's (another writer's file being written)
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ::waitpid(gone, nullptr, 0);
  const std::string dead = d / ("w.h5.tmp." + std::to_string(gone) + ".0"), live = d / ("w.h5.tmp." + std::to_string(::getppid()) + ".0");
  const std::string dead_bin = d / ("m.bin.tmp." + std::to_string(gone) + ".0");
  for (const std::string& f : {dead, live, dead_bin}) std::ofstream(f) << "left behind";
  save_model(d / "w.h5", GPT(tiny_train(1).model, 1));
  BOOST_TEST(!fs::exists(dead));
  BOOST_TEST(fs::exists(live));
  write_file_atomic(d / "m.bin", "model");
  BOOST_TEST(!fs::exists(dead_bin));
}

BOOST_AUTO_TEST_SUITE_END()
