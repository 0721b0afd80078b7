// Evaluation: the mean over targets however the batches fall, its gradient, and the loaders of
// `tapelm eval --data` agreeing on the same tokens.
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstring>
#include <iterator>
#include <map>
#include <filesystem>
#include <thread>
#include <tuple>
#include <cmath>
#include <fstream>

#include "data/dataset.h"
#include "data/sampler.h"
#include "data/tokens.h"
#include "nn/generate.h"
#include "train/eval.h"
#include "train/formats/model_source.h"
#include "train/streamed.h"
#include "train/formats/h5file.h"
#include "train/formats/registry.h"
#include "train/formats/safetensors.h"
#include "test_util.h"
#include "data/tokenizer/char.h"
#include "nn/accounting.h"

using namespace tapelm;
using namespace tapelm::test;
namespace fs = std::filesystem;
namespace tt = boost::test_tools;

namespace {

GPTConfig small_config() {
  return GPTConfig{.vocab_size = 13, .block_size = 6, .n_layer = 1, .n_head = 2, .n_kv_head = 1, .n_embd = 8,
                   .mlp_hidden = 16};
}

// n windows of T random ids as a [n, T] batch, targets the next ids; `ignored` targets set to -1.
std::pair<Index, Index> random_batch(int64_t n, int64_t T, uint64_t seed, const std::vector<int64_t>& ignored = {}) {
  Rng r(seed);
  Index x, y;
  x.shape = y.shape = {n, T};
  for (int64_t i = 0; i < n * T; i++) {
    x.data.push_back(static_cast<int32_t>(r.below(13)));
    y.data.push_back(static_cast<int32_t>(r.below(13)));
  }
  for (int64_t i : ignored) y.data[i] = -1;
  return {x, y};
}

// Window w of a batch alone, as a [1, T] batch.
std::pair<Index, Index> window(const std::pair<Index, Index>& b, int64_t w) {
  const int64_t T = b.first.shape[1];
  Index x, y;
  x.shape = y.shape = {1, T};
  x.data.assign(b.first.data.begin() + w * T, b.first.data.begin() + (w + 1) * T);
  y.data.assign(b.second.data.begin() + w * T, b.second.data.begin() + (w + 1) * T);
  return {x, y};
}

// a and b draw the same tokens for m's tokenizer's "ROMEO: the", twice over, past block_size:
// greedy and seeded (temperature 0.8, top-k 20).
void expect_same_draws(const Decoder& a, const Decoder& b, const formats::OpenedModel& m, const std::string& what) {
  const int64_t n = m.config.block_size + 20;
  const std::vector<int32_t> prompt = m.tok->encode("ROMEO: the");
  SampleOptions greedy, drawn;
  greedy.greedy = true;
  drawn.temperature = 0.8, drawn.top_k = 20;
  for (const SampleOptions& o : {greedy, drawn})
    BOOST_TEST(generate(a, {prompt, prompt}, n, o, 5) == generate(b, {prompt, prompt}, n, o, 5), what << (o.greedy ? ", greedy" : ", drawn"));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(eval)

BOOST_AUTO_TEST_CASE(the_mean_is_over_targets_whatever_the_batches) {
  GPT model(small_config(), 5);
  const int64_t T = 6;
  // three windows, two, and one: 5 + 0 + 6 | 6 + 3 | 2 targets (one window has none at all)
  std::vector<std::pair<Index, Index>> batches{random_batch(3, T, 1, {2, 6, 7, 8, 9, 10, 11}),
                                               random_batch(2, T, 2, {7, 9, 11}),
                                               random_batch(1, T, 3, {0, 1, 2, 3})};
  // Expected, one window at a time: loss × its targets, over all targets.
  double sum = 0;
  int64_t total = 0;
  double window_mean = 0;
  int64_t windows = 0;
  {
    NoGrad ng;
    model.eval();
    for (const auto& b : batches)
      for (int64_t w = 0; w < b.first.shape[0]; w++) {
        auto [x, y] = window(b, w);
        const int64_t n = std::count_if(y.data.begin(), y.data.end(), [](int32_t t) { return t >= 0; });
        if (n == 0) continue;
        const double l = model.loss(x, y).item();
        sum += l * static_cast<double>(n);
        total += n;
        window_mean += l;
        windows++;
      }
    model.train();
  }
  window_mean /= static_cast<double>(windows);
  const double want = sum / static_cast<double>(total);
  const EvalResult r = evaluate(model, EvalBatches(batches));
  BOOST_TEST(r.targets == 22);
  BOOST_TEST(total == 22);
  BOOST_TEST(r.loss == want, tt::tolerance(1e-6));
  BOOST_TEST(std::fabs(window_mean - want) > 1e-4, "the windows' mean must differ for this test to tell");
  BOOST_TEST(model.is_training(), "evaluation leaves the model in the mode it found");

  // the gradient variant: the same loss, and d(mean)/d(param) as one batch of every window gives
  const EvalResult g = evaluate_with_grads(model, EvalBatches(batches));
  BOOST_TEST(g.loss == want, tt::tolerance(1e-6));
  BOOST_TEST(g.targets == 22);
  std::vector<std::vector<float>> split_grads;
  for (auto& [name, p] : model.named_parameters()) {
    split_grads.push_back(p.grad().to_vector());
    p.zero_grad();
  }
  Index x, y;
  x.shape = y.shape = {6, T};
  for (const auto& b : batches) {
    x.data.insert(x.data.end(), b.first.data.begin(), b.first.data.end());
    y.data.insert(y.data.end(), b.second.data.begin(), b.second.data.end());
  }
  std::vector<std::pair<Index, Index>> one{{x, y}};
  evaluate_with_grads(model, EvalBatches(one));
  size_t i = 0;
  for (auto& [name, p] : model.named_parameters()) {
    const std::vector<float> a = p.grad().to_vector(), &b = split_grads[i++];
    double num = 0, den = 0;
    for (size_t k = 0; k < a.size(); k++) num += std::pow(a[k] - b[k], 2), den += double(a[k]) * a[k];
    BOOST_TEST(std::sqrt(num / std::max(den, 1e-30)) < 1e-5, name);
  }
}

BOOST_AUTO_TEST_CASE(windows_give_the_same_mean_in_any_batch_size_and_over_ranks_flag) {
  GPT model(small_config(), 9);
  std::vector<int32_t> data;
  Rng r(4);
  for (int i = 0; i < 100; i++) data.push_back(static_cast<int32_t>(r.below(13)));
  const std::vector<int64_t> starts = eval_windows(data, 6);
  BOOST_TEST(starts.size() == 16u);  // (100 - 1) / 6
  const EvalResult one = evaluate(model, EvalBatches(data, starts, 6, 1));
  const EvalResult five = evaluate(model, EvalBatches(data, starts, 6, 5));  // 5, 5, 5, 1
  BOOST_TEST(one.targets == 96);
  BOOST_TEST(five.targets == 96);
  BOOST_TEST(five.loss == one.loss, tt::tolerance(1e-6));
  BOOST_TEST(evaluate_windows(model, data, starts, 6, 5, true) == five.loss);  // one rank: the same
  BOOST_TEST(evaluate_split(model, data) == evaluate_windows(model, data, starts, 6, 32));
  // final_eval_tokens k: the first ⌈k / T⌉ windows, as `eval --tokens`; 40 tokens at T 6 are 7
  // windows (42 targets), 5 tokens one window, 91 or more all 16
  const std::vector<int64_t> seven(starts.begin(), starts.begin() + 7), one_window{0};
  BOOST_TEST(evaluate_split(model, data, false, 40) == evaluate_windows(model, data, seven, 6, 32));
  BOOST_TEST(evaluate_split(model, data, false, 40) != evaluate_split(model, data));
  BOOST_TEST(evaluate_split(model, data, false, 5) == evaluate_windows(model, data, one_window, 6, 32));
  BOOST_TEST(evaluate_split(model, data, false, 1000) == evaluate_split(model, data));
  BOOST_TEST(split_eval_what(40, 100, 6) == "the first 42 tokens of the val split");
  BOOST_TEST(split_eval_what(91, 100, 6) == "the whole val split");
  BOOST_TEST(split_eval_what(90, 100, 6) == "the first 90 tokens of the val split");
  BOOST_TEST(split_eval_what(0, 100, 6) == "the whole val split");
  BOOST_CHECK_EXCEPTION(EvalBatches(data, starts, 6, 0), Error, test::is_kind(ErrorKind::usage));
}

BOOST_AUTO_TEST_CASE(text_bin_directory_and_h5_loaders_agree) {
  TempDir d;
  std::string text;
  Rng r(11);
  for (int i = 0; i < 300; i++) text += static_cast<char>('a' + r.below(10));
  std::ofstream(d / "c.txt") << text;
  const Tokenizer tok = Tokenizer::of(CharTokenizer::from_text(text));
  const std::vector<int32_t> ids = tok.encode(text);
  write_token_file(d / "c.bin", ids);
  prepare(d / "c.txt", d / "corpus");
  GPTConfig c = small_config();
  GPT model(c, 3);
  const int64_t T = c.block_size;
  // the parity layout: one row of T+1 tokens per non-overlapping window
  const std::vector<int64_t> starts = eval_windows(ids, T);
  std::vector<int32_t> rows;
  for (int64_t s : starts) rows.insert(rows.end(), ids.begin() + s, ids.begin() + s + T + 1);
  {
    H5File f = H5File::create(d / "c.h5");
    f.write_ints("/tokens", rows, {static_cast<int64_t>(starts.size()), T + 1});
  }
  const EvalResult text_all = evaluate(model, load_eval_data(d / "c.txt", "all", c, &tok).batches(4));
  const EvalResult own_tok = evaluate(model, load_eval_data(d / "c.txt", "all", c, nullptr).batches(4));
  const EvalResult bin = evaluate(model, load_eval_data(d / "c.bin", "val", c, nullptr).batches(4));
  const EvalResult dir = evaluate(model, load_eval_data(d / "corpus", "all", c, nullptr).batches(4));
  const EvalResult h5 = evaluate(model, load_eval_data(d / "c.h5", "val", c, nullptr).batches(4));
  BOOST_TEST(text_all.targets == (300 - 1) / T * T);
  for (const EvalResult* e : {&own_tok, &bin, &dir, &h5}) {
    BOOST_TEST(e->targets == text_all.targets);
    BOOST_TEST(e->loss == text_all.loss, tt::tolerance(1e-6));
  }
  // --split picks the 90/10 split's part; all is both
  const EvalData val = load_eval_data(d / "c.txt", "val", c, &tok);
  const EvalData train = load_eval_data(d / "c.txt", "train", c, &tok);
  const TokenSplit sp = split_90_10(ids);
  BOOST_TEST((val.ids == sp.val));
  BOOST_TEST((train.ids == sp.train));
  // errors name the file
  GPTConfig tiny_vocab = c;
  tiny_vocab.vocab_size = 5;
  try {
    load_eval_data(d / "c.bin", "all", tiny_vocab, nullptr);
    BOOST_ERROR("ids beyond the vocabulary were accepted");
  } catch (const std::exception& e) {
    BOOST_TEST(std::string(e.what()).find("c.bin") != std::string::npos, e.what());
  }
  {
    H5File f = H5File::create(d / "none.h5");
    f.write_ints("/tokens", {3, -1, 4, -1}, {2, 2});  // inputs, but every target ignored
  }
  try {
    load_eval_data(d / "none.h5", "all", c, nullptr);
    BOOST_ERROR("a file without targets was accepted");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == d / "none.h5" + ": no target positions to evaluate");
  }
}

// eval --stream reads one block at a time and keeps every window's hidden state: the same ops as
// the loaded model's forward, so the same loss to the last bit (JSON prints doubles round-trip),
// for a Llama read from an HF directory and from a checkpoint, and a GPT-2 with learned positions
// and biases from a GGUF file; --tokens takes the first windows.
BOOST_AUTO_TEST_CASE(streamed_evaluation_gives_the_loaded_models_loss_bit_for_bit) {
  TempDir d;
  const std::string text = fixture_path("tiny.txt");
  std::vector<int32_t> ids(700);
  for (size_t i = 0; i < ids.size(); i++) ids[i] = static_cast<int32_t>((i * 31 + i / 5) % 256);
  write_token_file(d / "ids.bin", ids);
  Run imp = run_cli("import --format hf --model " + fixture_path("hf/llama_mha_f32") + " --out " + (d / "llama.h5"));
  BOOST_TEST_REQUIRE(imp.code == 0, imp.err);
  Run exp = run_cli("export --format gguf --dtype f32 --checkpoint " + fixture_path("gguf/gpt2_gpt2mini.h5") + " --out " + (d / "gpt2.gguf"));
  BOOST_TEST_REQUIRE(exp.code == 0, exp.err);
  for (const std::string& model : {fixture_path("hf/llama_mha_f32"), d / "llama.h5", d / "gpt2.gguf"})
    for (const std::string& extra : {std::string(""), std::string(" --tokens 100 --batch 2")}) {
      BOOST_TEST_CONTEXT(model << extra) {
        const std::string base = "eval --checkpoint " + model + " --data " + (d / "ids.bin") + " --json" + extra;
        const Run whole = run_cli(base), streamed = run_cli(base + " --stream");
        BOOST_TEST_REQUIRE(whole.code == 0, whole.err);
        BOOST_TEST_REQUIRE(streamed.code == 0, streamed.err);
        const nlohmann::json a = nlohmann::json::parse(whole.out), b = nlohmann::json::parse(streamed.out);
        BOOST_TEST(a["loss"].get<double>() == b["loss"].get<double>(), a.dump() << " / " << b.dump());
        BOOST_TEST(a["tokens"] == b["tokens"]);
        BOOST_TEST(b["streamed"] == true);
        if (!extra.empty()) BOOST_TEST(a["tokens"].get<int64_t>() < 200);
      }
    }
  expect_error(run_cli("eval --checkpoint " + (d / "llama.h5") + " --data " + (d / "ids.bin") + " --stream --grad-out " + (d / "g.h5")),
               "--grad-out needs the whole model in memory");
}

// sample --stream reads every block from the file for each token: the same ops as the loaded
// model's decode_step, so the same draws, greedy and seeded, through the prefill, one token at a
// time and past block_size (the window cropped and refilled); for a BF16 Llama from an HF
// directory, a Qwen2 (q/k/v biases) checkpoint and a GPT-2 (learned positions) GGUF file.
BOOST_AUTO_TEST_CASE(streamed_sampling_draws_the_loaded_models_tokens) {
  TempDir d;
  Run exp = run_cli("export --format gguf --dtype f32 --checkpoint " + fixture_path("gguf/gpt2_gpt2mini.h5") + " --out " + (d / "gpt2.gguf"));
  BOOST_TEST_REQUIRE(exp.code == 0, exp.err);
  for (const std::string& model : {fixture_path("hf/llama_gqa_bf16_spm"), fixture_path("gguf/qwen2_qwen2mini.h5"), d / "gpt2.gguf"}) {
    const formats::OpenedModel m = formats::open_model(model);
    const std::unique_ptr<GPT> loaded = m.load();
    const StreamedModel streamed(m);
    expect_same_draws(streamed, *loaded, m, model);
  }
  const std::string base = "sample --checkpoint " + fixture_path("hf/llama_gqa_bf16_spm") + " --prompt ROMEO --tokens 40 --seed 3";
  const Run whole = run_cli(base), streamed = run_cli(base + " --stream");
  BOOST_TEST_REQUIRE(whole.code == 0, whole.err);
  BOOST_TEST_REQUIRE(streamed.code == 0, streamed.err);
  BOOST_TEST(whole.out == streamed.out);
  BOOST_TEST(streamed.err.find("one block at a time") != std::string::npos, streamed.err);
  // a q8_0 GGUF file decodes with q8_0 weights streamed as in memory (streamed ran float32 and the
  // texts differed from byte 8); --weights q8_0 over an f32 file alike (it was refused streamed)
  Run q8 = run_cli("export --format gguf --dtype q8_0 --checkpoint " + fixture_path("gguf/llama_spm.h5") + " --out " + (d / "q8.gguf"));
  BOOST_TEST_REQUIRE(q8.code == 0, q8.err);
  for (const auto& [model, weights] : std::vector<std::pair<std::string, std::string>>{{d / "q8.gguf", "auto"}, {d / "gpt2.gguf", "q8_0"}}) {
    const std::string args = model + " --weights " + weights, cmd = "sample --prompt ROMEO --tokens 60 --seed 3 --checkpoint " + model;
    const Run in_memory = run_cli(cmd + " --weights " + weights), one_block = run_cli(cmd + " --weights " + weights + " --stream"),
              as_f32 = run_cli(cmd + " --weights f32");
    BOOST_TEST_REQUIRE(in_memory.code == 0, in_memory.err);
    BOOST_TEST_REQUIRE(one_block.code == 0, one_block.err);
    BOOST_TEST(in_memory.out == one_block.out, args);
    BOOST_TEST(in_memory.out != as_f32.out, args << ": q8_0 and f32 weights give the same text; the test proves nothing");
  }
  // a GGUF file and an HF directory's weights cut while a streamed run has them open: the next
  // block read is refused naming the file (was SIGBUS, or text from half of each model)
  fs::copy(fixture_path("hf/llama_gqa_bf16_spm"), d / "hf", fs::copy_options::recursive);
  for (const auto& [model, file] : std::vector<std::pair<std::string, std::string>>{{d / "gpt2.gguf", d / "gpt2.gguf"},
                                                                                    {d / "hf", d / "hf/model.safetensors"}}) {
    const formats::OpenedModel m = formats::open_model(model);
    const StreamedModel streamed(m);
    BOOST_TEST_REQUIRE(::truncate(file.c_str(), static_cast<off_t>(fs::file_size(file) / 2)) == 0);
    test::expect_throw([&] { streamed.for_each_block([](const Block&, int64_t) {}); }, ErrorKind::data, {file, "changed while it was read"});
  }
}

// A model too large for memory in float32 but not in its file's 16 bits (or in q8_0) is read once
// and kept packed (StreamedModel::keep_blocks): the same ops as the loaded model packed alike, so
// the same draws, greedy and seeded, through the prefill and past block_size; for a BF16 Llama
// from an HF directory (its values kept exactly in bf16), and a GPT-2 GGUF file (learned
// positions, biases) in f16 and q8_0, and a Llama GGUF file (q and k rows in llama.cpp's
// interleaved RoPE order) in f16 and q8_0. A matrix the file stores in the packed type is mapped
// from it, not copied: all of them for the HF Llama and the Llama GGUF files (their q and k
// products reordered), GPT-2's but its fused q|k|v in f16, none when q8_0 is asked of an f16 file.
// The 16-bit logits are the float32 model's but for the order of the sums; `sample --weights`
// gives the packed run's text.
BOOST_AUTO_TEST_CASE(kept_blocks_decode_as_the_loaded_model_packed_alike) {
  TempDir d;
  for (const auto& [from, to, dtype] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"gguf/gpt2_gpt2mini.h5", "gpt2.gguf", "f16"}, {"gguf/llama_spm.h5", "llama.gguf", "f16"}, {"gguf/llama_spm.h5", "q8.gguf", "q8_0"}}) {
    Run exp = run_cli("export --format gguf --dtype " + dtype + " --checkpoint " + fixture_path(from) + " --out " + (d / to));
    BOOST_TEST_REQUIRE(exp.code == 0, exp.err);
  }
  for (const auto& [model, type] : std::vector<std::pair<std::string, WeightType>>{{fixture_path("hf/llama_gqa_bf16_spm"), WeightType::bf16},
                                                                                   {d / "gpt2.gguf", WeightType::f16},
                                                                                   {d / "gpt2.gguf", WeightType::q8_0},
                                                                                   {d / "llama.gguf", WeightType::f16},
                                                                                   {d / "q8.gguf", WeightType::q8_0}}) {
    const formats::OpenedModel m = formats::open_model(model);
    const std::unique_ptr<GPT> f32 = m.load(), packed = m.load();
    packed->pack_weights(type);
    StreamedModel kept(m);
    kept.pack_weights(type);
    kept.keep_blocks();
    BOOST_TEST(kept.keeps_blocks());
    // the bytes mapped, by the config's shapes: every block matrix (and an untied head) but GPT-2's q|k|v
    double want = 0;
    for (const auto& [name, shape] : parameter_shapes(m.config)) {
      const bool matrix = shape.size() == 2 && (name.rfind("blocks.", 0) == 0 || name == "lm_head.weight");
      const bool gpt2_qkv = model == d / "gpt2.gguf" && name.find(".attn.w") != std::string::npos && name.find(".attn.wo") == std::string::npos;
      if (matrix && !gpt2_qkv && !(model == d / "gpt2.gguf" && type == WeightType::q8_0))
        want += type == WeightType::q8_0 ? double(shape[0] * q8_0_bytes(shape[1])) : 2.0 * double(shape_numel(shape));
    }
    BOOST_TEST((want > 0.0 || type == WeightType::q8_0));
    BOOST_TEST(kept.mapped_bytes() == want, model << " " << to_string(type));
    BOOST_TEST(m.mappable_bytes(type) == want, model << " " << to_string(type));
    // what sample holds a model too large in float32 in: its matrices' own 16-bit type
    if (model != d / "q8.gguf")
      BOOST_TEST((m.matrices_dtype() == (type == WeightType::q8_0 ? WeightType::f16 : type)), model << ": " << m.dtypes);
    BOOST_TEST(packed->weight_bytes() == StreamedModel::resident_bytes(m.config, type), model << " " << to_string(type));
    expect_same_draws(kept, *packed, m, model + " " + to_string(type));
    if (type == WeightType::q8_0) continue;
    // 16-bit weights hold the file's values: the logits differ from float32's by sum order only
    NoGrad ng;
    KVCache c1 = f32->make_cache(1, m.config.block_size), c2 = packed->make_cache(1, m.config.block_size);
    const std::vector<int32_t> prompt = m.tok->encode("ROMEO: the");
    Index ids;
    ids.shape = {1, static_cast<int64_t>(prompt.size())};
    ids.data = prompt;
    const Tensor a = f32->decode_step(ids, c1), b = packed->decode_step(ids, c2);
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < a.numel(); i++) {
      worst = std::max(worst, double(std::fabs(a[i] - b[i])));
      scale = std::max(scale, double(std::fabs(a[i])));
    }
    BOOST_TEST(worst <= 1e-5 * std::max(1.0, scale), model << ": max |logit f32 - " << to_string(type) << "| " << worst);
  }
  const std::string cmd = "sample --checkpoint " + fixture_path("hf/llama_gqa_bf16_spm") + " --prompt ROMEO --tokens 40 --seed 3 --weights ";
  const Run b16 = run_cli(cmd + "bf16"), b16_streamed = run_cli(cmd + "bf16 --stream");
  BOOST_TEST_REQUIRE(b16.code == 0, b16.err);
  BOOST_TEST_REQUIRE(b16_streamed.code == 0, b16_streamed.err);
  BOOST_TEST(b16.out == b16_streamed.out);
  expect_error(run_cli(cmd + "f8"), "--weights");
  BOOST_TEST((formats::open_model(d / "q8.gguf").matrices_dtype() == WeightType::f32));
}

// sample's plan for a model by the memory available (plan_decode), on the BF16 HF Llama: whole
// in float32 when 4 bytes a parameter and the cache take at most 90 % of it; just short of that,
// its matrices kept in bf16, all of them mapped from the file and not counted (but under an
// address-space limit); just short of what keeping counts, streamed in float32; q8_0 asked of a
// BF16 file is kept but not mapped; asked to stream, streamed. The same model imported as a BF16
// tapelm checkpoint, and as safetensors whose 16-bit values sit at odd offsets, maps nothing.
BOOST_AUTO_TEST_CASE(sample_plans_what_fits) {
  TempDir d;
  const std::string hf = fixture_path("hf/llama_gqa_bf16_spm");
  const formats::OpenedModel m = formats::open_model(hf);
  const double params = static_cast<double>(model_cost(m.config).params), beside = 12345;
  const double whole = 4 * params + beside;
  // every block matrix and an untied head, 2 bytes a value; the largest float32 block, or head
  double matrices_bf16 = 0, largest = 0;
  std::map<int64_t, double> blocks;
  for (const auto& [name, shape] : parameter_shapes(m.config)) {
    const bool block = name.rfind("blocks.", 0) == 0;
    if (shape.size() == 2 && (block || name == "lm_head.weight")) matrices_bf16 += 2.0 * double(shape_numel(shape));
    if (block) blocks[std::stoll(name.substr(7))] += 4.0 * double(shape_numel(shape));
    if (name == "lm_head.weight") largest = 4.0 * double(shape_numel(shape));
  }
  for (const auto& [l, n] : blocks) largest = std::max(largest, n);
  const DecodePlan roomy = plan_decode(m, beside, false, "auto", 10 * whole, false);
  BOOST_TEST(to_string(roomy.hold) == "whole");
  BOOST_TEST((roomy.weights == WeightType::f32));
  BOOST_TEST(roomy.bytes == whole);
  const double short_of_whole = whole / 0.9 * (1 - 1e-9);
  const DecodePlan kept = plan_decode(m, beside, false, "auto", short_of_whole, false);
  BOOST_TEST(to_string(kept.hold) == "kept");
  BOOST_TEST((kept.weights == WeightType::bf16));
  BOOST_TEST(kept.mapped == matrices_bf16);
  BOOST_TEST(kept.bytes + kept.mapped == StreamedModel::resident_bytes(m.config, WeightType::bf16) + largest + beside);
  // under an address-space limit the mapped bytes count: for this 2-layer model, the packed
  // model and a float32 block are more than the float32 model, so where it kept, it streams
  BOOST_TEST_REQUIRE(kept.bytes + kept.mapped > whole);
  BOOST_TEST(to_string(plan_decode(m, beside, false, "auto", short_of_whole, true).hold) == "streamed");
  const DecodePlan streamed = plan_decode(m, beside, false, "auto", kept.bytes / 0.9 * (1 - 1e-9), false);
  BOOST_TEST(to_string(streamed.hold) == "streamed");
  BOOST_TEST((streamed.weights == WeightType::f32));
  BOOST_TEST(streamed.bytes == StreamedModel::resident_bytes(m.config) + beside);
  const DecodePlan q8 = plan_decode(m, beside, false, "q8_0", short_of_whole, false);
  BOOST_TEST(to_string(q8.hold) == "kept");
  BOOST_TEST((q8.weights == WeightType::q8_0));
  BOOST_TEST(q8.mapped == 0.0);
  BOOST_TEST(to_string(plan_decode(m, beside, true, "auto", 10 * whole, false).hold) == "streamed");
  test::expect_throw([&] { plan_decode(m, beside, false, "f8", whole, false); }, ErrorKind::usage, {"--weights", "f8"});

  // a BF16 checkpoint: its datasets are BF16, but an HDF5 file is read, not mapped
  Run imp = run_cli("import --format hf --model " + hf + " --out " + (d / "ck.h5"));
  BOOST_TEST_REQUIRE(imp.code == 0, imp.err);
  // the safetensors header one byte longer (a space): every tensor at an odd offset
  fs::copy(hf, d / "odd", fs::copy_options::recursive);
  {
    std::ifstream in(d / "odd/model.safetensors", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    BOOST_TEST_REQUIRE(n % 2 == 0);
    bytes.insert(8 + n, " ");
    n++;
    std::memcpy(bytes.data(), &n, 8);
    std::ofstream(d / "odd/model.safetensors", std::ios::binary | std::ios::trunc) << bytes;
  }
  for (const std::string& other : {std::string(d / "ck.h5"), std::string(d / "odd")}) {
    const formats::OpenedModel o = formats::open_model(other);
    BOOST_TEST((o.matrices_dtype() == WeightType::bf16), other);
    BOOST_TEST(o.mappable_bytes(WeightType::bf16) == 0.0, other);
    const DecodePlan p = plan_decode(o, beside, false, "auto", 10 * whole, false);
    BOOST_TEST(p.mapped == 0.0, other);
    const DecodePlan pk = plan_decode(o, beside, false, "auto", short_of_whole, false);
    BOOST_TEST(pk.mapped == 0.0, other);
    // read and packed, not mapped: the same tokens as the HF directory's mapped matrices
    StreamedModel read(o), mapped(m);
    for (StreamedModel* s : {&read, &mapped}) {
      s->pack_weights(WeightType::bf16);
      s->keep_blocks();
    }
    BOOST_TEST(read.mapped_bytes() == 0.0, other);
    BOOST_TEST(mapped.mapped_bytes() == matrices_bf16);
    expect_same_draws(read, mapped, o, other);
  }
}

// Mapped matrices are the file's: a value that is not finite is refused when they are mapped,
// naming the tensor and its row, and a file written while they are kept is refused at the next
// step (they would be the new file's values) rather than decoded from.
BOOST_AUTO_TEST_CASE(mapped_matrices_are_checked_and_watched) {
  TempDir d;
  fs::copy(fixture_path("hf/llama_gqa_bf16_spm"), d / "hf", fs::copy_options::recursive);
  const std::string file = d / "hf/model.safetensors";
  const std::string name = "model.layers.1.mlp.up_proj.weight";
  uint64_t at = 0;  // where row 2 of that tensor starts in the file
  {
    const safetensors::File f = safetensors::File::open(file);
    const safetensors::TensorInfo* t = f.find(name);
    BOOST_TEST_REQUIRE(t);
    BOOST_TEST_REQUIRE(t->dtype == "BF16");
    std::ifstream in(file, std::ios::binary);
    uint64_t header = 0;
    in.read(reinterpret_cast<char*>(&header), 8);
    at = 8 + header + t->begin + 2 * static_cast<uint64_t>(2 * t->shape[1]);
  }
  const auto write_at = [&](uint64_t off, const std::string& bytes) {
    std::fstream io(file, std::ios::binary | std::ios::in | std::ios::out);
    io.seekp(static_cast<std::streamoff>(off));
    io.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  std::string old(2, '\0');
  {
    std::ifstream in(file, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(at));
    in.read(old.data(), 2);
  }
  {
    const formats::OpenedModel m = formats::open_model(d / "hf");
    StreamedModel kept(m);
    kept.pack_weights(WeightType::bf16);
    kept.keep_blocks();
    BOOST_TEST(kept.mapped_bytes() > 0.0);
    kept.for_each_block([](const Block&, int64_t) {});  // unchanged: no error
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a modification time of its own
    write_at(at, old);  // the same bytes, written again
    test::expect_throw([&] { kept.for_each_block([](const Block&, int64_t) {}); }, ErrorKind::data, {file, "changed while it was read"});
  }
  {
    // streamed (not kept): one block's matrices mapped at a time
    const formats::OpenedModel m = formats::open_model(d / "hf");
    StreamedModel streamed(m);
    streamed.pack_weights(WeightType::bf16);
    std::vector<double> during;
    streamed.for_each_block([&](const Block&, int64_t) { during.push_back(streamed.mapped_bytes()); });
    double layer0 = 0;
    for (const auto& [name, shape] : parameter_shapes(m.config))
      if (shape.size() == 2 && name.rfind("blocks.0.", 0) == 0) layer0 += 2.0 * double(shape_numel(shape));
    BOOST_TEST_REQUIRE(during.size() == static_cast<size_t>(m.config.n_layer));
    for (double b : during) BOOST_TEST(b == layer0);  // the layers are alike
    BOOST_TEST(streamed.mapped_bytes() == 0.0);
  }
  write_at(at, std::string("\xc0\x7f", 2));  // bf16 NaN (0x7fc0), little-endian
  const formats::OpenedModel m = formats::open_model(d / "hf");
  StreamedModel kept(m);
  kept.pack_weights(WeightType::bf16);
  test::expect_throw([&] { kept.keep_blocks(); }, ErrorKind::data, {name, "row 2", "not finite"});
}

BOOST_AUTO_TEST_SUITE_END()
