// The trainer: bit-exact resume, its pieces against train(), loss going down, gradient accumulation,
// the NaN stop, signals (between micro-batches too), one writer per run directory.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "autograd/float16.h"
#include "train/formats/checkpoint.h"
#include "train/trainer.h"
#include "train/study/uptrain.h"
#include "data/prepare.h"
#include "test_util.h"
#include "train/train_config.h"

using namespace tapelm;
using namespace tapelm::test;
namespace fs = std::filesystem;
namespace tt = boost::test_tools;

namespace {
/// Both checkpoints hold the same weights and AdamW moments, bit for bit.
void expect_same_weights(const std::string& a_path, const std::string& b_path) {
  H5File a = H5File::open_read(a_path), b = H5File::open_read(b_path);
  for (const std::string& n : a.list_datasets_recursive("/model")) {
    BOOST_TEST(a.read_tensor("/model/" + n).to_vector() == b.read_tensor("/model/" + n).to_vector(), n);
    BOOST_TEST(a.read_tensor("/optim/exp_avg_sq/" + n).to_vector() == b.read_tensor("/optim/exp_avg_sq/" + n).to_vector(), n);
  }
}

/// `tapelm train` of tiny_train(10^6) into d/run with `flags`, sent `signal` after `seconds` (and
/// SIGKILL 20 s later: a run that ignores the signal fails the test instead of hanging it).
Run train_until_signal(const TempDir& d, const std::string& flags, const std::string& signal, int seconds) {
  std::ofstream(d / "cfg.json") << tiny_train(1000000).to_json().dump();
  return run_cli("train --config " + (d / "cfg.json") + " --data " + std::string(TAPELM_SOURCE_DIR) +
                     "/corpora/tinyshakespeare.txt --out " + (d / "run") + " " + flags,
                 "timeout --preserve-status -k 20 -s " + signal + " " + std::to_string(seconds) + " ");
}

/// tiny_train changed by `vary`, run 8 steps straight (d/straight) and 4 then resumed to 8
/// (d/split), beside plain tiny_train(8) (d/f32): the split run is the straight one bit for bit
/// (weights, moments, final loss), and its loss differs from float32 training's by less than 0.02.
void expect_split_run_is_straight_and_near_f32(const TempDir& d, const std::function<void(TrainConfig&)>& vary,
                                               const std::string& what) {
  TrainOptions quiet;
  quiet.quiet = true;
  TrainConfig c8 = tiny_train(8), c4 = tiny_train(4);
  vary(c8);
  vary(c4);
  const TrainResult f32 = tapelm::train(tiny_train(8), shakespeare(), d / "f32", quiet);
  const TrainResult straight = tapelm::train(c8, shakespeare(), d / "straight", quiet);
  tapelm::train(c4, shakespeare(), d / "split", quiet);
  TrainOptions resume = quiet;
  resume.resume = true;
  const TrainResult split = tapelm::train(c8, shakespeare(), d / "split", resume);
  expect_same_weights(d / "straight/checkpoint.h5", d / "split/checkpoint.h5");
  BOOST_TEST(split.val_loss_full == straight.val_loss_full);
  BOOST_TEST(straight.val_loss_full != f32.val_loss_full);
  BOOST_TEST(std::fabs(straight.val_loss_full - f32.val_loss_full) < 0.02,
             what << " " << straight.val_loss_full << " vs f32 " << f32.val_loss_full);
}

/// "pid <this process's pid>": what a refused writer is told of a lock this test holds.
std::string this_pid() { return "pid " + std::to_string(::getpid()); }
}  // namespace

BOOST_AUTO_TEST_SUITE(trainer)

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
  expect_same_weights(d / "straight/checkpoint.h5", d / "split/checkpoint.h5");
  H5File a = H5File::open_read(d / "straight/checkpoint.h5"), b = H5File::open_read(d / "split/checkpoint.h5");
  BOOST_TEST(a.read_attr_int("/train", "step") == 8);
  BOOST_TEST(b.read_attr_int("/train", "tokens_seen") == 8 * 4 * 16);
}

// recompute: blocks (activation checkpointing) trains the very run the stored activations train:
// every logged loss and every weight equal, bit for bit, with dropout and gradient accumulation.
BOOST_AUTO_TEST_CASE(recompute_blocks_trains_the_same_run_bit_for_bit) {
  TempDir d;
  TrainOptions quiet;
  quiet.quiet = true;
  TrainConfig stored = tiny_train(6);
  stored.grad_accum = 2;
  TrainConfig recomputed = stored;
  recomputed.recompute = Recompute::blocks;
  tapelm::train(stored, shakespeare(), d / "stored", quiet);
  tapelm::train(recomputed, shakespeare(), d / "recomputed", quiet);
  auto m1 = read_metrics(d / "stored/metrics.jsonl"), m2 = read_metrics(d / "recomputed/metrics.jsonl");
  BOOST_TEST_REQUIRE(m1.size() == m2.size());
  for (size_t i = 0; i < m1.size(); i++)
    for (const char* k : {"train_loss", "val_loss", "grad_norm"})
      if (m1[i].contains(k)) BOOST_TEST(m1[i][k].get<double>() == m2[i].value(k, -1.0), k << " at line " << i);
  expect_same_weights(d / "stored/checkpoint.h5", d / "recomputed/checkpoint.h5");
  // the memory check counts what each keeps: 16 layers of d 64 at T 256, batch 512, store about
  // 21 GB of activations (refused in 4 GB) and keep 1.9 GB when recomputed (accepted)
  TrainConfig big = TrainConfig::from_json({{"vocab_size", 65}, {"n_layer", 16}, {"n_head", 4}, {"n_embd", 64}, {"block_size", 256},
                                            {"batch_size", 512}, {"eval_iters", 1}});
  expect_throw([&] { check_training_memory(big, 4e9); }, ErrorKind::config, {"one step's activations"});
  big.recompute = Recompute::blocks;
  BOOST_CHECK_NO_THROW(check_training_memory(big, 4e9));
  // the attention-output distillation term needs the blocks' activations: refused, not run stored
  recomputed.distill_attention = 0.5;
  expect_throw([&] { recomputed.validate(); }, ErrorKind::config, {"recompute \"blocks\" with distill_attention 0.5"});
}

// trainable kv|attention: the frozen parameters get no gradient and the trained ones the very
// gradient a run of every parameter computes (bit for bit, stored or recomputed blocks); the
// config's count of trained parameters and of multiplied weights is the model's own, for
// biased, GQA, per-layer, SwiGLU and untied shapes; and the memory check counts gradients and
// optimizer state of the trained parameters only.
BOOST_AUTO_TEST_CASE(frozen_parameters_get_no_gradient_and_the_trained_ones_the_full_gradient) {
  TrainConfig c = tiny_train(1);
  c.model.dropout = 0;
  Index x({}, {2, 16}), y({}, {2, 16});
  for (int i = 0; i < 32; i++) {
    x.data.push_back(shakespeare().train[i]);
    y.data.push_back(shakespeare().train[i + 1]);
  }
  for (const bool recompute : {false, true})
    for (const Trainable t : {Trainable::kv, Trainable::attention}) {
      GPT model(c.model, 3);
      model.recompute_blocks = recompute;
      backward(model.loss(x, y));
      std::map<std::string, std::vector<float>> full;
      for (auto& [n, p] : model.named_parameters()) {
        full[n] = p.grad().to_vector();
        p.drop_grad();
      }
      const NamedParams trained = trained_parameters(model, t);
      backward(model.loss(x, y));
      for (auto& [n, p] : model.named_parameters()) {
        BOOST_TEST(p.has_grad() == is_trained(t, n), n);
        if (p.has_grad()) BOOST_TEST(p.grad().to_vector() == full[n], n << (recompute ? " (recomputed)" : ""));
      }
      BOOST_TEST(trained.size() == (t == Trainable::kv ? 4u : 8u));
    }
  // counts from the config against the model's tensors
  auto json_of = [](nlohmann::json m) {
    nlohmann::json j = {{"vocab_size", 65}, {"n_layer", 2}, {"n_head", 4}, {"n_embd", 32}, {"block_size", 16}};
    if (m.is_object()) j.update(m);
    return j;
  };
  for (const nlohmann::json& shape :
       {json_of({}), json_of({{"bias", true}, {"n_kv_head", 2}}), json_of({{"qkv_bias", true}, {"n_kv_head", {4, 1}}}),
        json_of({{"mlp", "swiglu"}, {"mlp_hidden", 48}, {"tie_embeddings", false}, {"n_kv_head", 1}})}) {
    TrainConfig tc = TrainConfig::from_json(shape);
    GPT model(tc.model, 1);
    int64_t matmul = 0;  // every 2-D weight but the embeddings is multiplied; the head is d × V, tied or not
    for (const auto& [n, p] : model.named_parameters())
      if (p.ndim() == 2 && n != "wte.weight" && n != "wpe.weight") matmul += p.numel();
    if (tc.model.tie_embeddings) matmul += tc.model.n_embd * tc.model.vocab_size;
    BOOST_TEST(model_cost(tc.model).matmul_weights == matmul, shape.dump());
    for (const Trainable t : {Trainable::all, Trainable::attention, Trainable::kv}) {
      tc.trainable = t;
      int64_t n = 0;
      for (const auto& [name, p] : trained_parameters(model, t)) n += p.numel();
      BOOST_TEST(tc.trained_params() == n, shape.dump() << " " << to_string(t));
    }
  }
  // 8 layers of d 1024 with the MLP 4d wide: 12 d² = 12.6 M parameters a layer, 101 M in all, of
  // them 4 d² a layer in the q, k, v and output projections (33.6 M). 16 bytes for every parameter
  // is 1.61 GB, refused in 1.2 GB; 4 bytes of every weight (0.40 GB) and 12 more for the 33.6 M
  // trained (0.40 GB) fit
  TrainConfig big = TrainConfig::from_json({{"vocab_size", 65}, {"n_layer", 8}, {"n_head", 16}, {"n_embd", 1024}, {"block_size", 16},
                                            {"batch_size", 1}, {"eval_iters", 1}});
  expect_throw([&] { check_training_memory(big, 1.2e9); }, ErrorKind::config, {"with gradients and optimizer state"});
  big.trainable = Trainable::attention;
  BOOST_CHECK_NO_THROW(check_training_memory(big, 1.2e9));
}

// frozen_weights: the frozen block weights held in 16 bits (trainable attention | kv). Started from
// weights that are all bf16 values (as a bf16 source's are), `auto` holds them in bf16, and the run
// is the float32 one bit for bit: every train loss, weight and moment, straight, and interrupted
// then resumed with `bf16` asked for. A 16-bit copy that lost or changed a value, or a block not
// widened back before its backward, would differ. The checkpoint keeps the config's "auto".
// `auto` takes float32 for values no 16-bit type holds; a 16-bit type under shard parameters on 2
// ranks is refused; and the memory estimate counts 2 bytes a frozen block weight and one block's
// of them in float32, and every weight in float32 as the run starts.
BOOST_AUTO_TEST_CASE(frozen_weights_held_in_16_bits_train_the_float32_run_bit_for_bit) {
  TempDir d;
  TrainConfig c = tiny_train(6);
  c.trainable = Trainable::attention;
  const auto start = [&c](bool rounded) {
    auto m = std::make_unique<GPT>(c.model, 5);
    if (rounded)
      for (auto& [name, p] : m->named_parameters())
        for (int64_t i = 0; i < p.numel(); i++) p.val().data()[i] = bf16_to_f32(f32_to_bf16(p.val().data()[i]));
    return m;
  };
  // the types a rule holds the frozen block weights of a model in
  const auto held = [](const NarrowedBlocks::HeldAs& rule, const GPT& m) {
    std::set<WeightType> types;
    for (const auto& [name, p] : m.named_parameters())
      if (name.rfind("blocks.", 0) == 0 && name.find(".attn.") == std::string::npos) types.insert(rule(name, p.val()));
    return types;
  };
  BOOST_TEST((held(frozen_weights_held_as(c, 1), *start(false)) == std::set<WeightType>{WeightType::f32, WeightType::bf16}));  // norms are 1
  auto run = [&](FrozenWeights f, int64_t steps, const std::string& dir, bool resume) {
    TrainConfig rc = c;
    rc.max_iters = steps;
    rc.frozen_weights = f;
    const std::unique_ptr<GPT> from = start(true);
    if (!resume) BOOST_TEST((held(frozen_weights_held_as(rc, 1), *from) == std::set<WeightType>{f == FrozenWeights::f32 ? WeightType::f32 : WeightType::bf16}));
    TrainOptions o;
    o.quiet = true;
    o.resume = resume;
    if (!resume) o.init_from = from.get();
    return tapelm::train(rc, shakespeare(), d / dir, o);
  };
  const TrainResult f32 = run(FrozenWeights::f32, 6, "f32", false), narrowed = run(FrozenWeights::automatic, 6, "auto", false);
  run(FrozenWeights::automatic, 3, "split", false);
  const TrainResult split = run(FrozenWeights::bf16, 6, "split", true);
  BOOST_TEST(narrowed.val_loss_full == f32.val_loss_full);
  BOOST_TEST(split.val_loss_full == f32.val_loss_full);
  const auto m0 = read_metrics(d / "f32/metrics.jsonl");
  for (const std::string run_dir : {"auto", "split"}) {
    const auto m = read_metrics(d / (run_dir + "/metrics.jsonl"));
    int losses = 0;
    for (const auto& a : m0)
      for (const auto& b : m)
        if (a.contains("train_loss") && b.contains("train_loss") && a["step"] == b["step"]) {
          BOOST_TEST(a["train_loss"].get<double>() == b["train_loss"].get<double>(), run_dir << " step " << a["step"]);
          losses++;
        }
    BOOST_TEST(losses == 6, run_dir);
    H5File a = H5File::open_read(d / "f32/checkpoint.h5"), b = H5File::open_read(d / (run_dir + "/checkpoint.h5"));
    for (const std::string& n : a.list_datasets_recursive("/model"))
      BOOST_TEST(a.read_tensor("/model/" + n).to_vector() == b.read_tensor("/model/" + n).to_vector(), run_dir << " " << n);
    const std::vector<std::string> moments = a.list_datasets_recursive("/optim/exp_avg_sq");
    BOOST_TEST(moments.size() == 2 * 4u);  // each layer's q, k, v and output projections
    for (const std::string& n : moments)
      BOOST_TEST(a.read_tensor("/optim/exp_avg_sq/" + n).to_vector() == b.read_tensor("/optim/exp_avg_sq/" + n).to_vector(), run_dir << " " << n);
  }
  BOOST_TEST((read_train_config(H5File::open_read(d / "auto/checkpoint.h5")).frozen_weights == FrozenWeights::automatic));
  // under shard parameters on 2 ranks a rank keeps its share in float32
  TrainConfig sharded = c;
  sharded.shard = Shard::parameters;
  BOOST_TEST((held(frozen_weights_held_as(sharded, 2), *start(true)) == std::set<WeightType>{WeightType::f32}));
  sharded.frozen_weights = FrozenWeights::f16;
  BOOST_TEST((held(frozen_weights_held_as(sharded, 2), *start(true)) == std::set<WeightType>{WeightType::f32}));
  expect_throw([&] { check_frozen_weights(sharded, 2); }, ErrorKind::config, {"frozen_weights \"f16\" is not combined with shard"});
  // the estimate: tiny_train's blocks each hold 2 norms of d = 32 and the MLP's 2 matrices of
  // 32 × 128 frozen (8256 weights); with 6 layers, 6 blocks' at 2 bytes instead of 4 and one
  // block's widened to float32 while it runs
  TrainConfig deep = c;
  deep.model.n_layer = 6;
  TrainConfig in_bf16 = deep;
  in_bf16.frozen_weights = FrozenWeights::bf16;
  BOOST_TEST(training_memory(deep).weights - training_memory(in_bf16).weights == 2.0 * 6 * 8256 - 4.0 * 8256);
  // built (or read, with the optimizer's state, when resuming) in float32, then narrowed
  BOOST_TEST(training_memory(in_bf16).start == training_memory(deep).weights + training_memory(deep).optimizer);
  BOOST_TEST(training_memory(deep).start == 0.0);
  // what is known to be held (the counts of NarrowedBlocks): under `auto` too, whose own estimate
  // counts float32; handed over narrowed (uptrain's conversion), no float32 start at all
  const HeldNarrowed counted{.values = 6 * 8256.0, .largest_block = 8256.0, .since_start = false};
  BOOST_TEST(training_memory(deep).weights - training_memory(deep, 1, 0, &counted).weights == 2.0 * 6 * 8256 - 4.0 * 8256);
  BOOST_TEST(training_memory(deep, 1, 0, &counted).start == training_memory(deep).weights + training_memory(deep).optimizer);
  const HeldNarrowed handed{.values = 6 * 8256.0, .largest_block = 8256.0, .since_start = true};
  BOOST_TEST(training_memory(deep, 1, 0, &handed).weights == training_memory(deep, 1, 0, &counted).weights);
  BOOST_TEST(training_memory(deep, 1, 0, &handed).start == 0.0);
  BOOST_TEST(training_memory(deep, 1, 0, &handed).total() < training_memory(deep).total());
}

// bf16-emulated training (autograd/autocast.h): resumes bit-exact like f32 training, computes
// other numbers than f32 (the rounding is in the step) and stays close to them.
BOOST_AUTO_TEST_CASE(bf16_training_resumes_bit_exact_and_stays_near_f32) {
  TempDir d;
  expect_split_run_is_straight_and_near_f32(d, [](TrainConfig& c) { c.precision = Precision::bf16_emulated; }, "bf16");
  BOOST_TEST((read_train_config(H5File::open_read(d / "split/checkpoint.h5")).precision == Precision::bf16_emulated));
}

// moments: bf16 keeps AdamW's moments in bfloat16: the checkpoint holds them as bf16 datasets (read
// back widened: every value's low 16 bits zero), a resume narrows them back exactly, and the random bits of
// the rounding come from the parameter's name and the step, so the split run is the straight one
// bit for bit. The run's loss stays near float32 moments' (a different run: other moments).
BOOST_AUTO_TEST_CASE(bf16_moments_resume_bit_exact_and_stay_near_f32) {
  TempDir d;
  expect_split_run_is_straight_and_near_f32(d, [](TrainConfig& c) { c.moments = Moments::bf16; }, "bf16 moments");
  H5File f = H5File::open_read(d / "split/checkpoint.h5");
  int64_t checked = 0;
  for (const std::string key : {"exp_avg", "exp_avg_sq"})
    for (const std::string& n : f.list_datasets_recursive("/optim/" + key)) {
      BOOST_TEST(f.tensor_encoding("/optim/" + key + "/" + n) == "BF16", key << "/" << n);
      const Tensor t = f.read_tensor("/optim/" + key + "/" + n);
      for (int64_t i = 0; i < t.numel(); i++, checked++)
        BOOST_TEST_REQUIRE((float_bits(t[i]) & 0xFFFFu) == 0u, key << "/" << n << "[" << i << "] " << t[i]);
    }
  BOOST_TEST(checked > 1000);
  BOOST_TEST((read_train_config(f).moments == Moments::bf16));
  BOOST_TEST(f.read_attr_string("/optim", "hparams").find(R"("moments":"bf16")") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(mapped_shards_train_as_the_text_does_and_resume_bit_exact) {
  TempDir d;
  PrepareOptions po;
  po.texts = {std::string(TAPELM_SOURCE_DIR) + "/corpora/tinyshakespeare.txt"};
  po.out_dir = d / "corpus";
  po.shard_tokens = 300000;  // four train shards: windows cross their boundaries
  prepare_corpus(po);
  const Corpus shards = load_corpus(d / "corpus");
  TrainOptions quiet;
  quiet.quiet = true;
  tapelm::train(tiny_train(8), shakespeare(), d / "text", quiet);
  tapelm::train(tiny_train(8), shards, d / "straight", quiet);
  tapelm::train(tiny_train(4), shards, d / "split", quiet);
  TrainOptions resume = quiet;
  resume.resume = true;
  BOOST_TEST(tapelm::train(tiny_train(8), shards, d / "split", resume).steps == 8);
  expect_same_weights(d / "text/checkpoint.h5", d / "straight/checkpoint.h5");
  expect_same_weights(d / "straight/checkpoint.h5", d / "split/checkpoint.h5");
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
  // the final evaluation covers the val split's first final_eval_tokens: the same number as
  // evaluating the saved weights afresh, on the last record only
  std::unique_ptr<GPT> saved = load_model(d / "run/checkpoint.h5").model;
  BOOST_TEST(r.val_loss_full == evaluate_split(*saved, shakespeare().val, false, kTinyFinalEvalTokens));
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
  c.learning_rate = c.min_lr = 1e12;  // diverges at once: no warmup, no clipping
  c.warmup_iters = 0;
  c.grad_clip = 0;
  c.checkpoint_interval = 1;
  try {
    tapelm::train(c, shakespeare(), d / "run", quiet);
    BOOST_ERROR("training with lr 1e12 did not stop");
  } catch (const Error& e) {
    const std::string msg = e.what();
    BOOST_TEST((msg.find("NaN") != std::string::npos || msg.find("Inf") != std::string::npos), msg);
  }
  // whatever step it stopped at, the checkpoint on disk is a complete, loadable file
  BOOST_TEST_REQUIRE(fs::exists(d / "run/checkpoint.h5"));
  BOOST_CHECK_NO_THROW(load_model(d / "run/checkpoint.h5"));
  for (const auto& e : fs::directory_iterator(d / "run"))
    BOOST_TEST(e.path().filename().string().find(".tmp") == std::string::npos, e.path());
}

BOOST_AUTO_TEST_CASE(divergence_never_saves_non_finite_weights) {
  // lr 1e30 (as `--set learning_rate=1e30 --set checkpoint_interval=1`): the first update leaves
  // huge but finite weights, the next forward a finite loss but non-finite gradients. The update
  // they would make is refused, so the last checkpoint holds the finite weights of the step before.
  for (const double grad_clip : {0.0, 1.0}) {
    BOOST_TEST_CONTEXT("grad_clip " << grad_clip) {
      TempDir d;
      TrainOptions quiet;
      quiet.quiet = true;
      TrainConfig c = tiny_train(50);
      c.learning_rate = c.min_lr = 1e30;
      c.warmup_iters = 0;
      c.grad_clip = grad_clip;
      c.checkpoint_interval = 1;
      std::string msg;
      try {
        tapelm::train(c, shakespeare(), d / "run", quiet);
      } catch (const Error& e) {
        msg = e.what();
      }
      BOOST_TEST_REQUIRE(!msg.empty(), "training with lr 1e30 did not stop");
      BOOST_TEST(msg.find("step ") == 0, msg);
      GPT model(c.model, 1);
      const NamedParams params = model.named_parameters();
      BOOST_TEST(std::any_of(params.begin(), params.end(), [&](const auto& p) { return msg.find(p.first) != std::string::npos; }),
                 "no parameter named in: " << msg);
      // the checkpoint on disk is finite everywhere: model and optimizer state load (load checks it)
      BOOST_TEST_REQUIRE(fs::exists(d / "run/checkpoint.h5"));
      auto opt = c.make_optimizer(params);
      TrainState st;
      BOOST_CHECK_NO_THROW(load_training_checkpoint(H5File::open_read(d / "run/checkpoint.h5"), model, *opt, st));
      BOOST_TEST(st.step >= 1);
      BOOST_TEST(msg.find("step " + std::to_string(st.step) + ":") == 0, msg);  // stopped at the step after it
    }
  }
}

BOOST_AUTO_TEST_CASE(sigint_saves_and_exits_cleanly) {
  TempDir d;
  Run r = train_until_signal(d, "--set log_interval=50", "INT", 4);
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

BOOST_AUTO_TEST_CASE(a_stop_between_micro_batches_abandons_the_step_and_resumes_bit_exact) {
  TempDir d;
  TrainOptions quiet;
  quiet.quiet = true;
  TrainConfig c = tiny_train(4);
  c.grad_accum = 3;
  tapelm::train(c, shakespeare(), d / "straight", quiet);
  // stopped after the first micro-batch of step 3: the checkpoint is step 2's, and resuming from
  // it gives the uninterrupted run
  TrainConfig two = c;
  two.max_iters = 2;
  tapelm::train(two, shakespeare(), d / "split", quiet);
  TrainOptions stopping = quiet;
  stopping.resume = true;
  stopping.stop = StopToken();  // not quiet's: copies of a token share its flag
  stopping.stop.request();
  TrainResult r = tapelm::train(c, shakespeare(), d / "split", stopping);
  BOOST_TEST(r.interrupted);
  BOOST_TEST(r.steps == 2);
  BOOST_TEST(H5File::open_read(d / "split/checkpoint.h5").read_attr_int("/train", "step") == 2);
  TrainOptions resume = quiet;
  resume.resume = true;
  BOOST_TEST(tapelm::train(c, shakespeare(), d / "split", resume).steps == 4);
  expect_same_weights(d / "straight/checkpoint.h5", d / "split/checkpoint.h5");
  // a Trainer that goes on after an abandoned step has none of its partial gradients
  TrainOptions pieces = quiet;
  pieces.stop = StopToken();
  Trainer t(c, shakespeare(), d / "pieces", pieces);
  t.step();
  pieces.stop.request();
  const Trainer::Step s = t.step();
  BOOST_TEST(s.abandoned);
  BOOST_TEST(t.steps_done() == 1);
  pieces.stop.clear();
  for (int i = 0; i < 3; i++) BOOST_TEST(!t.step().abandoned);
  t.save();
  expect_same_weights(d / "straight/checkpoint.h5", d / "pieces/checkpoint.h5");
}

BOOST_AUTO_TEST_CASE(sigterm_is_honoured_between_micro_batches) {
  // a step of 10^9 micro-batches never ends: the stop must not wait for it
  TempDir d;
  Run r = train_until_signal(d, "--set grad_accum=1000000000", "TERM", 3);
  BOOST_TEST(r.code == 0, r.err);
  BOOST_TEST(r.out.find("stopped by signal at step 0") != std::string::npos, r.out);
  BOOST_TEST(H5File::open_read(d / "run/checkpoint.h5").read_attr_int("/train", "step") == 0);
}

BOOST_AUTO_TEST_CASE(a_second_writer_is_refused_and_the_first_finishes) {
  TempDir d;
  TrainOptions quiet;
  quiet.quiet = true;
  Trainer first(tiny_train(3), shakespeare(), d / "run", quiet);
  std::ofstream(d / "run/checkpoint.h5.tmp.999") << "the first writer's checkpoint, being written";
  expect_throw([&] { Trainer second(tiny_train(5), shakespeare(), d / "run", quiet); }, ErrorKind::train,
               {d / "run", this_pid()});
  BOOST_TEST(fs::exists(d / "run/checkpoint.h5.tmp.999"));  // not the second writer's to remove
  fs::remove(d / "run/checkpoint.h5.tmp.999");
  BOOST_TEST(first.run().steps == 3);
  BOOST_TEST(H5File::open_read(d / "run/checkpoint.h5").read_attr_int("/train", "step") == 3);
  std::vector<int64_t> steps;
  for (const auto& rec : read_metrics(d / "run/metrics.jsonl")) steps.push_back(rec["step"].get<int64_t>());
  BOOST_TEST(steps == (std::vector<int64_t>{0, 1, 2, 3}), tt::per_element());
}

BOOST_AUTO_TEST_CASE(uptrain_locks_its_run_directory) {
  TempDir d;
  TrainOptions quiet;
  quiet.quiet = true;
  tapelm::train(tiny_train(2), shakespeare(), d / "mha", quiet);
  const DirLock held(d / "up");
  UptrainOptions o;
  o.quiet = true;
  o.known_loss_before = 1;  // no evaluation of the conversion: it is not what is tested
  for (double alpha : {0.0, 1.0}) {  // α = 0 writes its checkpoint without training
    o.fraction = alpha;
    expect_throw([&] { uptrain(d / "mha/checkpoint.h5", shakespeare(), d / "up", o); }, ErrorKind::train,
                 {d / "up", this_pid()});
    // the lock comes first, before the source is read and converted: with a source that does not
    // exist the error is still the lock's (it was the missing file's, after loading, for α > 0)
    expect_throw([&] { uptrain(d / "missing.h5", shakespeare(), d / "up", o); }, ErrorKind::train, {d / "up", this_pid()});
  }
  BOOST_TEST(!fs::exists(d / "up/checkpoint.h5"));
}

// A resume with nothing to resume from fails before the run directory is made (it was left
// behind holding .lock); uptrain refuses before converting.
BOOST_AUTO_TEST_CASE(a_resume_without_a_checkpoint_leaves_nothing_behind) {
  TempDir d;
  TrainOptions o;
  o.quiet = true;
  o.resume = true;
  expect_throw([&] { tapelm::train(tiny_train(2), shakespeare(), d / "fresh", o); }, ErrorKind::train,
               {d / "fresh", "no checkpoint.h5 to resume from"});
  BOOST_TEST(!fs::exists(d / "fresh"));
  o.resume = false;
  tapelm::train(tiny_train(2), shakespeare(), d / "mha", o);
  UptrainOptions u;
  u.quiet = true;
  u.resume = true;
  u.fraction = 1.0;
  expect_throw([&] { uptrain(d / "mha/checkpoint.h5", shakespeare(), d / "up", u); }, ErrorKind::train,
               {d / "up", "no checkpoint.h5 to resume from"});
  BOOST_TEST(!fs::exists(d / "up"));
}

// distill_attention: each block's attention output against the teacher's, relative. A teacher that
// is the model with the attention's output projection doubled gives outputs exactly 2·o in a
// one-layer model (scaling by 2 is exact in floating point), so the term is
// ‖o − 2o‖² / ‖2o‖² = 1/4 at the first step; weighted heavily, training lowers it.
BOOST_AUTO_TEST_CASE(the_attention_output_term_is_its_definition_and_training_lowers_it) {
  TempDir d;
  TrainConfig cfg = tiny_train(6);
  cfg.model.n_layer = 1;
  cfg.model.dropout = 0;
  cfg.distill_attention = 100;
  GPT student(cfg.model, 11), teacher(cfg.model, 11);
  int doubled = 0;
  for (auto& [name, p] : teacher.named_parameters())
    if (name.find("attn.wo") != std::string::npos) {
      Tensor& w = p.val();
      for (int64_t i = 0; i < w.numel(); i++) w[i] *= 2;
      doubled++;
    }
  BOOST_REQUIRE(doubled >= 1);
  teacher.eval();
  TrainOptions o;
  o.quiet = true;
  o.init_from = &student;
  o.teacher = &teacher;
  Trainer t(cfg, shakespeare(), d / "run", o);
  const Trainer::Step first = t.step();
  BOOST_TEST(first.distill == -1.0);  // λ = 0: no soft-target term
  BOOST_TEST(first.distill_attention == 0.25, tt::tolerance(1e-5));
  double last = first.distill_attention;
  for (int i = 0; i < 5; i++) last = t.step().distill_attention;
  BOOST_TEST(last < 0.2, "the attention term after 6 steps: " << last);
}

BOOST_AUTO_TEST_SUITE_END()
