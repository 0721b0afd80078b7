// GGUF export checked by llama.cpp itself. tests/fixtures/gguf/make_gguf_fixtures.sh trained five
// small models (llama GQA with sentencepiece; llama MQA, Qwen2 with q/k/v biases, GPT-2 MHA and
// GPT-2 GQA with byte-level BPE vocabularies), exported them to GGUF in several dtypes and ran each file in
// llama.cpp (npm's node-llama-cpp, llama_cpp_oracle.mjs): llama_cpp.json holds each file's hash,
// llama.cpp's tokens of a prompt, its logits after every prompt token and its greedy text. Here the
// export is rebuilt from the same checkpoint (it must be the very file llama.cpp ran, byte for
// byte), and tapelm's tokens, logits and greedy text are held against llama.cpp's.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "data/io.h"
#include "nn/generate.h"
#include "train/formats/checkpoint.h"
#include "train/formats/gguf.h"
#include "train/formats/gguf_file.h"
#include "train/study/convert/convert.h"
#include "train/formats/registry.h"
#include "test_util.h"

using namespace tapelm;
using namespace tapelm::test;
namespace fs = std::filesystem;
using json = nlohmann::json;
namespace tt = boost::test_tools;
namespace gg = ::tapelm::gguf;

namespace {

std::string gx(const std::string& name) { return fixture_path("gguf/" + name); }

std::string fnv1a64(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char b : bytes) h = (h ^ b) * 0x100000001b3ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Little-endian float32 values from base64 (how the fixture stores llama.cpp's logits).
std::vector<float> floats_of_base64(const std::string& s) {
  static const std::string abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    if (c == '=') break;
    acc = acc << 6 | static_cast<uint32_t>(abc.find(c));
    bits += 6;
    if (bits >= 8) bytes += static_cast<char>((acc >> (bits -= 8)) & 0xFF);
  }
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

// "llama_spm_q8_0.gguf" -> {"llama_spm", "q8_0"}
std::pair<std::string, std::string> split_name(const std::string& file) {
  const std::string stem = file.substr(0, file.size() - 5);
  for (const char* d : {"_q8_0", "_bf16", "_f16", "_f32"}) {
    const std::string suffix = d;
    if (stem.size() > suffix.size() && stem.compare(stem.size() - suffix.size(), suffix.size(), suffix) == 0)
      return {stem.substr(0, stem.size() - suffix.size()), suffix.substr(1)};
  }
  return {stem, ""};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(gguf)

namespace {

// Every export of an oracle file against what llama.cpp computed on it.
void expect_llama_cpp_agrees(const std::string& oracle_file, size_t models) {
  const json oracle = json::parse(read_file_bytes(gx(oracle_file), "fixture"));
  const std::string prompt = oracle["prompt"];
  BOOST_TEST_REQUIRE(oracle["models"].size() == models);
  for (auto it = oracle["models"].begin(); it != oracle["models"].end(); ++it) {
    const auto [name, dtype] = split_name(it.key());
    const json& want = it.value();
    BOOST_TEST_CONTEXT(it.key()) {
      TempDir d;
      gg::export_model(formats::open_model(gx(name + ".h5")), d / "m.gguf", wt(dtype));
      const std::string bytes = read_file_bytes(d / "m.gguf", "export");
      // the file llama.cpp ran, byte for byte: what it computed is about this export
      BOOST_TEST(bytes.size() == want["bytes"].get<size_t>());
      BOOST_TEST(fnv1a64(bytes) == want["fnv1a64"].get<std::string>());

      LoadedModel l = load_model(gx(name + ".h5"));
      std::vector<int32_t> tokens;
      if (l.tok->bos_id() >= 0) tokens.push_back(l.tok->bos_id());
      for (int32_t id : l.tok->encode(prompt)) tokens.push_back(id);
      BOOST_TEST(tokens == want["tokens"].get<std::vector<int32_t>>(), tt::per_element());

      // logits of the weights as the file stores them (f16, bf16, q8_0 rounded as written), and
      // of the weights unrounded: the rounding must bring tapelm closer to llama.cpp, or the file
      // would not hold what tapelm meant to write
      l.model->eval();
      NoGrad ng;
      const int64_t T = static_cast<int64_t>(tokens.size()), V = l.model->config().vocab_size;
      const json& wl = want["logits"];
      BOOST_TEST_REQUIRE(wl.size() == static_cast<size_t>(T));
      auto max_diff = [&](const Tensor& logits, double* scale) {
        double worst = 0;
        for (int64_t t = 0; t < T; t++) {
          const std::vector<float> row = floats_of_base64(wl[t].get<std::string>());
          BOOST_TEST_REQUIRE(row.size() == static_cast<size_t>(V));
          for (int64_t v = 0; v < V; v++) {
            worst = std::max(worst, double(std::fabs(logits[t * V + v] - row[v])));
            if (scale) *scale = std::max(*scale, double(std::fabs(row[v])));
          }
        }
        return worst;
      };
      const double unrounded = max_diff(l.model->forward(Index(tokens, {1, T})).val(), nullptr);
      gg::round_like_export(*l.model, wt(dtype));
      double scale = 0;
      const double worst = max_diff(l.model->forward(Index(tokens, {1, T})).val(), &scale);
      // f32 files ran with an f32 KV cache and no flash attention: llama and qwen2 differ by
      // summation order alone, gpt2 also by ggml's GELU, looked up in an f16 table. llama.cpp
      // multiplies f16, bf16 and q8_0 weights by activations rounded to the same type (ggml's
      // vec_dot types) and keeps K and V in f16, which tapelm does not: those differ by that
      // rounding (f16: 11 bits of mantissa, bf16: 8, q8_0: 7 bits per 32-value block).
      // gptneox also by the GELU itself: Pythia's is the exact one, llama.cpp's gptneox computes
      // the tanh form (|difference| ≤ 4.8e-4 per activation); gemma's GeGLU by the same f16 table
      const bool gelu = name.rfind("gpt2", 0) == 0 || name.rfind("gptneox", 0) == 0 || name.rfind("gemma", 0) == 0;
      const double tol = dtype == "f32" ? (gelu ? 5e-4 : 2e-5) : dtype == "f16" ? 1e-3 : dtype == "bf16" ? 1e-2 : 3e-2;
      BOOST_TEST(worst <= tol * std::max(1.0, scale), "logits max |tapelm - llama.cpp| " << worst << " (largest logit " << scale << ")");
      if (dtype != "f32") BOOST_TEST(worst < unrounded, "rounded " << worst << ", unrounded " << unrounded);
      BOOST_TEST_MESSAGE(it.key() << ": logits max |tapelm - llama.cpp| " << worst << " (unrounded weights " << unrounded
                                  << "), largest " << scale);

      SampleOptions o;
      o.greedy = true;
      const std::vector<int32_t> greedy = want["greedy"].get<std::vector<int32_t>>();
      const auto got = generate(*l.model, {tokens}, static_cast<int64_t>(greedy.size()), o, 1);
      const std::vector<int32_t> ours(got.at(0).begin() + T, got.at(0).end());
      BOOST_TEST(ours == greedy, tt::per_element());
      BOOST_TEST(l.tok->decode(ours) == want["text"].get<std::string>());

      // decoding as llama.cpp ran these files: K and V in an f16 cache, q8_0 matrices multiplied
      // as q8_0 (activations rounded to q8_0 blocks, as ggml's q8_0 dot product takes them). For
      // q8_0 files the rounding of the activations is most of the difference above, so the logits
      // must come closer; llama.cpp also rounds q to f16 for its K·q product and the
      // probabilities for V·p, and (f16 and bf16 files) the activations to the weights' type,
      // which tapelm does not: those stay within the forward's bound.
      if (dtype == "f32") continue;
      if (dtype == "q8_0") l.model->pack_weights(WeightType::q8_0);
      KVCache cache = l.model->make_cache(1, T, KvType::f16);
      Tensor stepwise = Tensor::empty({T, V});
      for (int64_t t = 0; t < T; t++) {
        const Tensor row = l.model->decode_step(Index({tokens[t]}, {1, 1}), cache);
        std::copy(row.data(), row.data() + V, stepwise.data() + t * V);
      }
      const double decoded = max_diff(stepwise, nullptr);
      if (dtype == "q8_0") BOOST_TEST(decoded < 0.9 * worst, "decoded as llama.cpp does: " << decoded << ", forward: " << worst);
      BOOST_TEST(decoded <= tol * std::max(1.0, scale), "decoded: logits max |tapelm - llama.cpp| " << decoded);
      BOOST_TEST_MESSAGE(it.key() << ": decoded with an f16 cache" << (dtype == "q8_0" ? " and q8_0 weights" : "") << ": "
                                  << decoded);
      SampleOptions fo = o;
      fo.kv_cache = KvType::f16;
      const auto got16 = generate(*l.model, {tokens}, static_cast<int64_t>(greedy.size()), fo, 1);
      BOOST_TEST(std::vector<int32_t>(got16.at(0).begin() + T, got16.at(0).end()) == greedy, tt::per_element());
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(llama_cpp_runs_the_exports_as_tapelm_does) { expect_llama_cpp_agrees("llama_cpp.json", 9); }

// A model with KV heads per layer (2 in layer 0, 1 in layer 1: make_gguf_kvlayers_fixture.sh):
// llama.cpp reads head_count_kv as an array and computes what tapelm computes.
BOOST_AUTO_TEST_CASE(llama_cpp_runs_kv_heads_per_layer_as_tapelm_does) { expect_llama_cpp_agrees("llama_cpp_kvlayers.json", 1); }

// A Phi-3 model (make_gguf_phi3_fixture.sh: the Phi-3 HF fixture imported): written as llama.cpp's
// phi3 (q|k|v in one attn_qkv, gate|up in one ffn_up, rows as HF holds them for its NEOX RoPE), it
// computes what tapelm computes, in f32 and q8_0.
BOOST_AUTO_TEST_CASE(llama_cpp_runs_phi3_as_tapelm_does) { expect_llama_cpp_agrees("llama_cpp_phi3.json", 2); }

// A GPT-NeoX (Pythia-shaped) model (make_gguf_family_fixtures.sh): written as llama.cpp's gptneox
// (q|k|v stacked in attn_qkv, RoPE on rope.dimension_count = 4 of 16 dims, use_parallel_residual),
// it computes what tapelm computes but for llama.cpp's GELU, in f32 and q8_0, to the same greedy text.
BOOST_AUTO_TEST_CASE(llama_cpp_runs_gptneox_as_tapelm_does) { expect_llama_cpp_agrees("llama_cpp_gptneox.json", 2); }

// A Qwen3 model (make_gguf_family_fixtures.sh): written as llama.cpp's qwen3 (attn_q_norm and
// attn_k_norm of one head's width, heads of width 32 under d 64 as attention.key_length and
// value_length, NEOX RoPE), it computes what tapelm computes, in f32 and q8_0.
BOOST_AUTO_TEST_CASE(llama_cpp_runs_qwen3_as_tapelm_does) { expect_llama_cpp_agrees("llama_cpp_qwen3.json", 2); }

// An OLMo-2 model (make_gguf_family_fixtures.sh): written as llama.cpp's olmo2 (post_attention_norm
// and post_ffw_norm on the sublayers' outputs, attn_q_norm and attn_k_norm over the projections),
// it computes what tapelm computes, in f32 and q8_0.
BOOST_AUTO_TEST_CASE(llama_cpp_runs_olmo2_as_tapelm_does) { expect_llama_cpp_agrees("llama_cpp_olmo2.json", 2); }

// A Gemma model (make_gguf_family_fixtures.sh): written as llama.cpp's gemma (norms stored as 1 + w,
// heads of width 32 as attention.key_length, NEOX RoPE; llama.cpp scales the embeddings by √d and
// computes GeGLU itself), it computes what tapelm computes, in f32 and q8_0.
BOOST_AUTO_TEST_CASE(llama_cpp_runs_gemma_as_tapelm_does) { expect_llama_cpp_agrees("llama_cpp_gemma.json", 2); }

// Import reads back what export wrote, tokenizer included: export -> import -> export gives the
// same file, and the imported tokenizer (rebuilt from the GGUF metadata alone) tokenizes the prompt
// as llama.cpp did.
BOOST_AUTO_TEST_CASE(import_then_export_gives_the_same_file) {
  json oracle = json::parse(read_file_bytes(gx("llama_cpp.json"), "fixture"));
  for (const char* more : {"llama_cpp_gptneox.json", "llama_cpp_qwen3.json", "llama_cpp_olmo2.json", "llama_cpp_gemma.json"})
    oracle["models"].update(json::parse(read_file_bytes(gx(more), "fixture"))["models"]);
  for (auto it = oracle["models"].begin(); it != oracle["models"].end(); ++it) {
    const auto [name, dtype] = split_name(it.key());
    BOOST_TEST_CONTEXT(it.key()) {
      TempDir d;
      fs::create_directories(d / "a");
      fs::create_directories(d / "b");
      gg::export_model(formats::open_model(gx(name + ".h5")), d / "a.gguf", wt(dtype));
      Run r = run_cli("import --format gguf --model " + (d / "a.gguf") + " --out " + (d / ("b/" + name + ".h5")));
      BOOST_TEST_REQUIRE(r.code == 0, r.err);
      BOOST_TEST((r.out.find("dequantized") != std::string::npos) == (dtype == "q8_0"), r.out);
      gg::export_model(formats::open_model(d / ("b/" + name + ".h5")), d / "b.gguf", wt(dtype));  // same stem: same general.name
      BOOST_TEST((read_file_bytes(d / "a.gguf", "a") == read_file_bytes(d / "b.gguf", "b")));
      LoadedModel l = load_model(d / ("b/" + name + ".h5"));
      BOOST_TEST_REQUIRE(l.tok.has_value());
      std::vector<int32_t> tokens;
      if (l.tok->bos_id() >= 0) tokens.push_back(l.tok->bos_id());
      for (int32_t id : l.tok->encode(oracle["prompt"].get<std::string>())) tokens.push_back(id);
      BOOST_TEST(tokens == it.value()["tokens"].get<std::vector<int32_t>>(), tt::per_element());
    }
  }
}

// A model whose layers have different numbers of KV heads: GGUF holds a count per layer (llama.cpp's
// head_count_kv array, under its deci architecture: llama's graph with per-layer heads) and reads
// it back; HF and llama2.c have one count and refuse it in one line, as GGUF does for other layouts.
BOOST_AUTO_TEST_CASE(kv_heads_per_layer_travel_as_an_array) {
  LoadedModel l = load_model(gx("llama_spm.h5"));  // 2 layers, 4 query heads, 2 KV heads
  const auto m = convert_kv_heads(*l.model, std::vector<int64_t>{2, 1}, {});
  TempDir d;
  write_converted(d / "pl.h5", *m, &*l.tok, "{}");
  gg::export_model(formats::open_model(d / "pl.h5"), d / "a.gguf", WeightType::f32);
  {
    const gg::File f(d / "a.gguf");
    BOOST_TEST(f.string("general.architecture") == "deci");  // llama.cpp's llama graph with each layer's own heads
    const gg::Value* kv = f.find_key("deci.attention.head_count_kv");
    BOOST_TEST_REQUIRE(kv);
    BOOST_TEST(kv->nums == (std::vector<double>{2, 1}), tt::per_element());
    BOOST_TEST(f.counts("deci.attention.head_count_kv", 2) == (std::vector<int64_t>{2, 1}), tt::per_element());
    BOOST_TEST(f.counts("deci.attention.head_count", 2) == (std::vector<int64_t>{4, 4}), tt::per_element());  // one count for all
  }
  fs::create_directories(d / "b");
  Run r = run_cli("import --format gguf --model " + (d / "a.gguf") + " --out " + (d / "b/pl.h5"));
  BOOST_TEST_REQUIRE(r.code == 0, r.err);
  // (its norm_eps went through the file's float32: the configs differ there, the files below do not)
  BOOST_TEST(load_model(d / "b/pl.h5").model->config().layer_kv_heads == (std::vector<int64_t>{2, 1}), tt::per_element());
  gg::export_model(formats::open_model(d / "b/pl.h5"), d / "b.gguf", WeightType::f32);  // same stem: same general.name
  BOOST_TEST((read_file_bytes(d / "b.gguf", "b") == read_file_bytes(d / "a.gguf", "a")));
  expect_error(run_cli("export --checkpoint " + (d / "pl.h5") + " --format hf --out " + (d / "hf")),
               "key/value heads per layer (2,1): a Hugging Face config has one num_key_value_heads");
  expect_error(run_cli("export --checkpoint " + (d / "pl.h5") + " --format llama2c --out " + (d / "m.bin")),
               "llama2.c cannot express key/value heads per layer 2,1");
  BOOST_TEST(!fs::exists(d / "hf"));
  BOOST_TEST(!fs::exists(d / "m.bin"));
  const auto q = convert_kv_heads(*load_model(gx("qwen2_qwen2mini.h5")).model, std::vector<int64_t>{2, 1}, {});
  write_converted(d / "q.h5", *q, nullptr, "{}");
  expect_error(run_cli("export --checkpoint " + (d / "q.h5") + " --format gguf --out " + (d / "q.gguf")),
               "key/value heads per layer (2,1) in qwen2's layout: llama.cpp runs them in the llama layout alone");
}

namespace {

// A GGUF file built field by field, for the reader's refusals.
struct Builder {
  std::string kvs, infos, data;
  uint64_t n_kv = 0, n_t = 0;
  static void u32(std::string& b, uint32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); }
  static void u64(std::string& b, uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); }
  static void str(std::string& b, const std::string& s) { u64(b, s.size()), b += s; }
  Builder& kv_str(const std::string& k, const std::string& v) { return str(kvs, k), u32(kvs, 8), str(kvs, v), n_kv++, *this; }
  Builder& kv_u32(const std::string& k, uint32_t v) { return str(kvs, k), u32(kvs, 4), u32(kvs, v), n_kv++, *this; }
  Builder& kv_f32(const std::string& k, float v) {
    str(kvs, k), u32(kvs, 6), kvs.append(reinterpret_cast<const char*>(&v), 4), n_kv++;
    return *this;
  }
  Builder& kv_raw(const std::string& k, uint32_t type, const std::string& bytes) { return str(kvs, k), u32(kvs, type), kvs += bytes, n_kv++, *this; }
  Builder& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(infos, name), u32(infos, static_cast<uint32_t>(ne.size()));
    for (uint64_t e : ne) u64(infos, e);
    u32(infos, type), u64(infos, offset), n_t++;
    return *this;
  }
  // A llama model's hyperparameters (1 layer, d 32, 4 heads), no tensors.
  Builder& llama() {
    return kv_str("general.architecture", "llama").kv_u32("llama.block_count", 1).kv_u32("llama.embedding_length", 32)
        .kv_u32("llama.attention.head_count", 4).kv_u32("llama.feed_forward_length", 64).kv_u32("llama.context_length", 16)
        .kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  }
  std::string bytes(uint32_t version = 3) const {
    std::string b = "GGUF";
    u32(b, version), u64(b, n_t), u64(b, n_kv);
    b += kvs + infos;
    b.resize((b.size() + 31) / 32 * 32, '\0');
    return b + data;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(bad_gguf_files_give_one_line_and_write_nothing) {
  TempDir d;
  gg::export_model(formats::open_model(gx("llama_spm.h5")), d / "good.gguf", WeightType::f32);
  const std::string good = read_file_bytes(d / "good.gguf", "good");
  auto patch = [&](size_t at, uint64_t v, int width) {
    std::string b = good;
    std::memcpy(&b[at], &v, width);
    return b;
  };
  std::string u64s;
  Builder::u64(u64s, 1);
  auto claiming = [](uint32_t blocks, uint32_t d) {
    Builder b;
    b.kv_str("general.architecture", "llama").kv_u32("llama.block_count", blocks).kv_u32("llama.embedding_length", d)
        .kv_u32("llama.attention.head_count", 4).kv_u32("llama.feed_forward_length", 4 * d).kv_u32("llama.context_length", 16)
        .kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f).tensor("token_embd.weight", {32, 8}, 0, 0);
    b.data = std::string(1024, '\0');
    return b.bytes();
  };
  const std::vector<std::pair<std::string, std::string>> bad{
      {good.substr(0, 2), "GGUF's magic"},
      {"GGUX" + good.substr(4), "GGUF's magic"},
      {patch(4, 1, 4), "version 1"},
      {patch(8, uint64_t(1) << 60, 8), "tensors, more than the file can hold"},
      {patch(16, uint64_t(1) << 60, 8), "metadata entries, more than the file can hold"},
      {patch(24, uint64_t(1) << 62, 8), "runs past the end of the file"},
      {good.substr(0, 200), "more than the file can hold"},
      {good.substr(0, 2000), "more than the rest of the file can hold"},
      {good.substr(0, good.size() - 64), "runs past the end of the file"},
      {Builder().kv_str("general.architecture", "llama").kv_str("general.architecture", "llama").bytes(), "appears twice"},
      {Builder().kv_raw("x", 13, "").bytes(), "value type 13"},
      {Builder().kv_raw("x", 9, std::string("\x09\0\0\0", 4) + u64s).bytes(), "array of arrays"},
      {Builder().kv_raw("x", 9, std::string("\x04\0\0\0", 4) + std::string("\xff\xff\xff\xff\xff\xff\xff\x0f", 8)).bytes(),
       "more than the rest of the file"},
      {Builder().kv_raw("x", 7, "\x05").bytes(), "bool of value 5"},
      {Builder().tensor("t", {1u << 30, 1u << 30, 1u << 30}, 0, 0).bytes(), "overflows"},
      {Builder().tensor("t", {32}, 2, 0).bytes(), "ggml type 2"},
      {Builder().tensor("t", {7}, 8, 0).bytes(), "not a multiple of 32"},
      {[] { Builder b; b.tensor("t", {4}, 0, 4); b.data = std::string(64, '\0'); return b.bytes(); }(), "not a multiple of the alignment"},
      {[] { Builder b; b.tensor("t", {4}, 0, 1u << 20); b.data = std::string(64, '\0'); return b.bytes(); }(), "runs past the end of the file"},
      {[] { Builder b; b.tensor("t", {8}, 0, 0).tensor("u", {8}, 0, 0); b.data = std::string(64, '\0'); return b.bytes(); }(), "overlaps"},
      {[] { Builder b; b.tensor("t", {8}, 0, 0).tensor("t", {8}, 0, 32); b.data = std::string(64, '\0'); return b.bytes(); }(), "tensor t appears twice"},
      {Builder().kv_u32("general.alignment", 24).bytes(), "power of two"},
      {Builder().kv_str("general.architecture", "falcon").bytes(), "general.architecture \"falcon\""},
      {Builder().bytes(), "general.architecture is missing"},
      {Builder().llama().kv_str("llama.rope.scaling.type", "linear").bytes(), "rope scaling"},
      {Builder().llama().kv_u32("llama.expert_count", 8).bytes(), "mixture of experts"},
      // a head width of its own is key_length (Qwen3, Gemma); value_length must equal it (was
      // accepted and ignored)
      {[] { Builder b; b.llama().kv_u32("llama.attention.value_length", 16).tensor("token_embd.weight", {32, 8}, 0, 0); b.data = std::string(1024, '\0'); return b.bytes(); }(),
       "llama.attention.value_length 16 is not key_length 8"},
      {Builder().llama().bytes(), "token_embd.weight is missing"},
      {[] { Builder b; b.llama().tensor("token_embd.weight", {32, 8}, 0, 0); b.data = std::string(1024, '\0'); return b.bytes(); }(),
       "missing blk.0.attn_norm.weight"},
      {[] { Builder b; b.llama().kv_u32("llama.attention.head_count_kv", 3).tensor("token_embd.weight", {32, 8}, 0, 0); b.data = std::string(1024, '\0'); return b.bytes(); }(),
       "do not divide"},
      // 1 KB files claiming 65,536 blocks, or one block of d 16,384 and 64 layers' worth of
      // width: the tensor table is checked against the claim before anything is allocated (was
      // 58 s to refuse, and std::bad_alloc)
      {claiming(65536, 32), "llama.block_count is 65536, but the file holds 1 tensors"},
      {claiming(1, 16384), "mis-shaped token_embd.weight [8, 32] (expected [8, 16384])"},
  };
  for (size_t i = 0; i < bad.size(); i++) {
    BOOST_TEST_CONTEXT("case " << i << ": " << bad[i].second) {
      write_file_atomic(d / "bad.gguf", bad[i].first);
      expect_error(run_cli("import --format gguf --model " + (d / "bad.gguf") + " --out " + (d / "out.h5")), bad[i].second);
      BOOST_TEST(!fs::exists(d / "out.h5"));
    }
  }
}

// A gpt2 vocabulary with a token that is not UTF-8 (was the JSON library's raw "type_error.316")
// and a token type outside 1-6 (was accepted): patched in place in an exported file. The array
// after a key is: value type 9 (u32), element type (u32), count (u64), then the elements.
BOOST_AUTO_TEST_CASE(a_bad_gpt2_vocabulary_is_named) {
  TempDir d;
  gg::export_model(formats::open_model(gx("gpt2_gpt2mini.h5")), d / "good.gguf", WeightType::f32);
  const std::string good = read_file_bytes(d / "good.gguf", "good");
  auto first_element = [&](const std::string& key) {
    const size_t at = good.find(key);
    BOOST_TEST_REQUIRE(at != std::string::npos);
    return at + key.size() + 4 + 4 + 8;
  };
  std::string bad_utf8 = good;
  bad_utf8[first_element("tokenizer.ggml.tokens") + 8] = '\xff';  // past the first string's u64 length
  std::string bad_type = good;
  const int32_t nine = 9;
  std::memcpy(&bad_type[first_element("tokenizer.ggml.token_type")], &nine, 4);
  for (const auto& [bytes, why] : {std::pair{bad_utf8, "tokenizer.ggml.tokens[0] is not valid UTF-8"},
                                   std::pair{bad_type, "tokenizer.ggml.token_type[0] is not a token type 1-6"}}) {
    write_file_atomic(d / "bad.gguf", bytes);
    expect_error(run_cli("import --format gguf --model " + (d / "bad.gguf") + " --out " + (d / "out.h5")), why);
    BOOST_TEST(!fs::exists(d / "out.h5"));
  }
}

BOOST_AUTO_TEST_CASE(q8_0_blocks_are_ggmls) {
  // One block: max |x| = 2.54 gives d = 0.02 (f16 0x251F, 0.0200043...), and x / d rounds half
  // away from zero as C's roundf: 0.01 / 0.02 = 0.5 -> 1, -0.03 / 0.02 = -1.5 -> -2.
  std::vector<float> x(32, 0.f);
  x[0] = 2.54f, x[1] = -2.54f, x[2] = 0.01f, x[3] = -0.03f, x[4] = 1.0f;
  const std::vector<uint8_t> q = gg::quantize_q8_0(x.data(), 32);
  BOOST_TEST_REQUIRE(q.size() == 34u);
  BOOST_TEST((q[0] | q[1] << 8) == 0x251F);
  BOOST_TEST(static_cast<int8_t>(q[2]) == 127);
  BOOST_TEST(static_cast<int8_t>(q[3]) == -127);
  BOOST_TEST(static_cast<int8_t>(q[4]) == 1);
  BOOST_TEST(static_cast<int8_t>(q[5]) == -2);
  BOOST_TEST(static_cast<int8_t>(q[6]) == 50);  // 1.0 / 0.02 = 50
  const std::vector<float> back = gg::dequantize_q8_0(q.data(), 32);
  BOOST_TEST(std::fabs(back[0] - 2.54f) < 1e-3);
  BOOST_TEST(back[7] == 0.f);
  // all zeros: d = 0 and every value 0, no division by zero
  const std::vector<float> z(64, 0.f);
  const std::vector<uint8_t> qz = gg::quantize_q8_0(z.data(), 64);
  BOOST_TEST(std::all_of(qz.begin(), qz.end(), [](uint8_t b) { return b == 0; }));
}

BOOST_AUTO_TEST_CASE(what_llama_cpp_cannot_run_is_refused_naming_why) {
  TempDir d;
  // a char tokenizer, the exact GELU, another layout, a bad dtype: one line each, nothing written
  std::string text;
  for (int i = 0; i < 40; i++) text += "abc abd abe\n";
  write_file_atomic(d / "t.txt", text);
  const std::string common = R"("n_layer": 1, "n_embd": 8, "n_head": 2, "mlp_hidden": 16, "block_size": 4, "batch_size": 1,
    "max_iters": 1, "eval_iters": 1, "eval_interval": 1)";
  auto train = [&](const std::string& name, const std::string& keys) {
    write_file_atomic(d / (name + ".json"), "{" + common + ", " + keys + "}");
    Run r = run_cli("train --config " + (d / (name + ".json")) + " --data " + (d / "t.txt") + " --out " + (d / name) + " --quiet");
    BOOST_TEST_REQUIRE(r.code == 0, r.err);
    return d / (name + "/checkpoint.h5");
  };
  const std::string llama_char = train("lc", R"("norm": "rmsnorm", "mlp": "swiglu", "pos": "rope")");
  expect_error(run_cli("export --format gguf --checkpoint " + llama_char + " --out " + (d / "x.gguf")), "char tokenizer has no llama.cpp form");
  const std::string gelu = train("ge", R"("norm": "layernorm", "mlp": "gelu", "pos": "learned")");
  expect_error(run_cli("export --format gguf --checkpoint " + gelu + " --out " + (d / "x.gguf")), "gelu_tanh");
  const std::string mixed = train("mx", R"("norm": "rmsnorm", "mlp": "gelu", "pos": "rope")");
  expect_error(run_cli("export --format gguf --checkpoint " + mixed + " --out " + (d / "x.gguf")), "match no architecture other programs run");
  expect_error(run_cli("export --format gguf --dtype q4_0 --checkpoint " + mixed + " --out " + (d / "x.gguf")), "q4_0");
  expect_error(run_cli("export --format hf --dtype q8_0 --checkpoint " + mixed + " --out " + (d / "x")), "q8_0 is for --format gguf");
  BOOST_TEST(!fs::exists(d / "x.gguf"));
}

BOOST_AUTO_TEST_SUITE_END()
