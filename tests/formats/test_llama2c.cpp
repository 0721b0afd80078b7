// llama2.c interop: its model files read and written exactly. The fixtures were written by
// llama2.c's own model.py and export.py (tests/fixtures/llama2c/make_llama2c_fixtures.py): two
// small GQA models, one with a shared classifier and one without, each as a version 0 and a
// version 1 file, with PyTorch's logits and greedy continuation, and the same weights in tapelm's
// layout (NAME.h5).
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "data/io.h"
#include "nn/generate.h"
#include "train/formats/checkpoint.h"
#include "train/formats/llama2c.h"
#include "test_util.h"
#include "data/tokenizer/char.h"
#include "data/tokenizer/sentencepiece.h"

using namespace tapelm;
using namespace tapelm::test;
namespace fs = std::filesystem;
namespace tt = boost::test_tools;
namespace lc = tapelm::llama2c;  // the suite's name is a namespace of its own

namespace {

const std::vector<std::string> kLlama2cModels{"gqa_tied", "gqa_untied", "spm_tied"};

std::string l2c(const std::string& name) { return fixture_path("llama2c/" + name); }
std::string bin(const std::string& model, int version) { return l2c(model + ".v" + std::to_string(version) + ".bin"); }
std::string bytes_of(const std::string& path) { return read_file_bytes(path, "test file"); }

// The byte range of version 0's RoPE tables, from the header of the fixture's model.
std::pair<size_t, size_t> v0_table_range(const GPTConfig& c) {
  const int64_t d = c.n_embd, hd = c.head_dim(), L = c.n_layer, kv = c.n_kv_head * hd;
  const int64_t before = c.vocab_size * d + L * (d + d * d + 2 * d * kv + d * d + d + 3 * d * c.mlp_hidden) + d;
  return {28 + 4 * before, 28 + 4 * (before + 2 * c.block_size * hd / 2)};
}

template <class T> void put(std::string& b, size_t off, T v) { std::memcpy(b.data() + off, &v, sizeof v); }

}  // namespace

BOOST_AUTO_TEST_SUITE(llama2c)

BOOST_AUTO_TEST_CASE(rope_rows_move_between_half_split_and_interleaved) {
  // one head of hd 4 over 1 column: half-split rows (a0, a1 | b0, b1) rotate pairs (a_i, b_i),
  // which llama2.c keeps side by side: a0 b0 a1 b1
  Tensor w = Tensor::from({8, 1}, {0, 1, 2, 3, 10, 11, 12, 13});
  BOOST_TEST(lc::interleave_rope_rows(w, 2).to_vector() == std::vector<float>({0, 2, 1, 3, 10, 12, 11, 13}),
             tt::per_element());
  Tensor r = randn({24, 5}, 3);
  BOOST_TEST(lc::half_split_rope_rows(lc::interleave_rope_rows(r, 3), 3).to_vector() == r.to_vector(),
             tt::per_element());
}

BOOST_AUTO_TEST_CASE(import_reproduces_llama2c_logits) {
  for (const std::string& name : kLlama2cModels)
    for (int version : {0, 1}) {
      BOOST_TEST_CONTEXT(name << " v" << version) {
        lc::Model m = lc::read_model(bin(name, version));
        H5File f = H5File::open_read(l2c(name + ".h5"));
        BOOST_TEST((m.gpt->config() == read_model_config(f)));
        BOOST_TEST(m.header.shared_classifier == (name != "gqa_untied"));
        // the weights, permuted on the way in, are the ones the fixture script permuted in PyTorch
        for (const auto& [pname, p] : m.gpt->named_parameters())
          BOOST_TEST(p.val().to_vector() == f.read_tensor("/model/" + pname).to_vector(), pname);
        Shape s;
        Index x(f.read_ints("/expected/tokens", &s), {});
        x.shape = s;
        m.gpt->eval();
        NoGrad ng;
        Tensor logits = m.gpt->forward(x).val();
        Tensor want = f.read_tensor("/expected/logits");
        BOOST_TEST_REQUIRE(logits.shape() == want.shape());
        double worst = 0;
        for (int64_t i = 0; i < want.numel(); i++) worst = std::max(worst, double(std::fabs(logits[i] - want[i])));
        BOOST_TEST(worst < 1e-4, "logits max |diff| " << worst);
        BOOST_TEST_MESSAGE(name << " v" << version << ": logits max |tapelm - PyTorch| " << worst << " over "
                                << want.numel() << " logits");
      }
    }
}

BOOST_AUTO_TEST_CASE(greedy_continuation_matches_pytorch) {
  for (const std::string& name : kLlama2cModels) {
    lc::Model m = lc::read_model(bin(name, 0));
    H5File f = H5File::open_read(l2c(name + ".h5"));
    const std::vector<int32_t> prompt = f.read_ints("/expected/greedy_prompt"), want = f.read_ints("/expected/greedy");
    m.gpt->eval();
    SampleOptions o;
    o.greedy = true;
    const auto got = generate(*m.gpt, {prompt}, static_cast<int64_t>(want.size() - prompt.size()), o, 1);
    BOOST_TEST(got.at(0) == want, tt::per_element());
    BOOST_TEST_MESSAGE(name << ": greedy continuation of " << want.size() - prompt.size()
                            << " tokens equals PyTorch's (smallest winning margin there "
                            << f.read_attr_double("/expected", "greedy_min_margin") << ")");
  }
}

BOOST_AUTO_TEST_CASE(export_writes_llama2c_bytes) {
  // From the tapelm-layout weights, not from an import: export alone must give export.py's bytes.
  for (const std::string& name : kLlama2cModels) {
    BOOST_TEST_CONTEXT(name) {
      std::unique_ptr<GPT> m = load_model(l2c(name + ".h5")).model;
      BOOST_TEST((lc::model_bytes(*m, 1) == bytes_of(bin(name, 1))), "version 1 bytes differ");
      // version 0: byte for byte outside the RoPE tables, which run.c skips and which PyTorch's
      // float32 cos/sin round differently from a correctly rounded cos/sin in a few last bits
      const std::string got = lc::model_bytes(*m, 0), want = bytes_of(bin(name, 0));
      BOOST_TEST_REQUIRE(got.size() == want.size());
      const auto [t0, t1] = v0_table_range(m->config());
      BOOST_TEST(got.compare(0, t0, want, 0, t0) == 0);
      BOOST_TEST(got.compare(t1, std::string::npos, want, t1, std::string::npos) == 0);
      double worst = 0;
      int differ = 0;
      for (size_t o = t0; o < t1; o += 4) {
        float a, b;
        std::memcpy(&a, got.data() + o, 4);
        std::memcpy(&b, want.data() + o, 4);
        worst = std::max(worst, double(std::fabs(a - b)));
        differ += a != b;
      }
      BOOST_TEST(worst < 1e-6);
      BOOST_TEST_MESSAGE(name << ": exported v1 equals export.py's byte for byte; v0 too outside the RoPE tables, where "
                              << differ << " of " << (t1 - t0) / 4 << " floats differ, by at most " << worst);
    }
  }
}

BOOST_AUTO_TEST_CASE(import_then_export_is_byte_identical) {
  TempDir d;
  for (const std::string& name : kLlama2cModels)
    for (int version : {0, 1}) {
      BOOST_TEST_CONTEXT(name << " v" << version) {
        const std::string ck = d / (name + std::to_string(version) + ".h5"), out = d / (name + std::to_string(version) + ".bin");
        Run r = run_cli("import --format llama2c --model " + bin(name, version) + " --out " + ck);
        BOOST_TEST_REQUIRE(r.code == 0, r.err);
        r = run_cli("export --checkpoint " + ck + " --format llama2c --version " + std::to_string(version) + " --out " + out);
        BOOST_TEST_REQUIRE(r.code == 0, r.err);
        BOOST_TEST((bytes_of(out) == bytes_of(bin(name, version))), "the round trip changed bytes");
      }
    }
  // the default version is 0, the one run.c reads
  const std::string ck = d / "t.h5";
  BOOST_TEST_REQUIRE(run_cli("import --format llama2c --model " + bin("gqa_untied", 1) + " --out " + ck).code == 0);
  BOOST_TEST_REQUIRE(run_cli("export --checkpoint " + ck + " --format llama2c --out " + (d / "t.bin")).code == 0);
  lc::Model m = lc::read_model(d / "t.bin");
  BOOST_TEST(m.header.version == 0);
  BOOST_TEST(!m.header.shared_classifier);
}

BOOST_AUTO_TEST_CASE(imported_model_converts_and_exports) {
  // import an MHA... here GQA-3 -> MQA by mean pooling -> export: what the export holds is the
  // converted model, which run.c's MQA path (kv_mul = n_heads) reads
  TempDir d;
  BOOST_TEST_REQUIRE(run_cli("import --format llama2c --model " + bin("gqa_untied", 0) + " --out " + (d / "a.h5")).code == 0);
  Run r = run_cli("convert --from " + (d / "a.h5") + " --kv-heads 1 --method mean --out " + (d / "mqa.h5"));
  BOOST_TEST_REQUIRE(r.code == 0, r.err);
  r = run_cli("export --checkpoint " + (d / "mqa.h5") + " --format llama2c --out " + (d / "mqa.bin"));
  BOOST_TEST_REQUIRE(r.code == 0, r.err);
  lc::Model back = lc::read_model(d / "mqa.bin");
  BOOST_TEST(back.header.n_kv_heads == 1);
  std::unique_ptr<GPT> mqa = load_model(d / "mqa.h5").model;
  for (const auto& [name, p] : back.gpt->named_parameters()) {
    bool same = false;
    for (const auto& [n2, p2] : mqa->named_parameters())
      if (n2 == name) same = p.val().to_vector() == p2.val().to_vector();
    BOOST_TEST(same, name);
  }
}

BOOST_AUTO_TEST_CASE(imported_model_uptrains_with_a_training_config) {
  // a weights-only import has no original run: uptrain takes the training keys from --config
  TempDir d;
  BOOST_TEST_REQUIRE(run_cli("import --format llama2c --model " + bin("gqa_tied", 0) + " --out " + (d / "a.h5")).code == 0);
  std::ofstream(d / "cfg.json") << R"({"batch_size": 2, "max_iters": 20, "learning_rate": 0.001, "warmup_iters": 2,
                                      "eval_interval": 5, "eval_iters": 1, "log_interval": 5})";
  const std::string up = "uptrain --from " + (d / "a.h5") + " --kv-heads 1 --fraction 0.1 --data " + fixture_path("tiny.txt") +
                         " --quiet --out " + (d / "run");
  expect_error(run_cli(up), "give one with --config");
  std::ofstream(d / "other.json") << R"({"n_head": 8, "max_iters": 20})";
  expect_error(run_cli(up + " --config " + (d / "other.json")), "n_head 8 differs");
  BOOST_TEST(!fs::exists(d / "run/checkpoint.h5"));
  Run r = run_cli(up + " --config " + (d / "cfg.json"));
  BOOST_TEST_REQUIRE(r.code == 0, r.err);
  const CheckpointInfo info = inspect_checkpoint(d / "run/checkpoint.h5");
  BOOST_TEST(info.config.n_kv_head == 1);
  BOOST_TEST(info.step == 2);
  BOOST_TEST(info.config.block_size == 32);
}

BOOST_AUTO_TEST_CASE(bad_files_give_one_line_and_write_nothing) {
  TempDir d;
  const std::string v0 = bytes_of(bin("gqa_tied", 0)), v1 = bytes_of(bin("gqa_tied", 1));
  auto import_of = [&](const std::string& file_name, const std::string& bytes) {
    write_bytes(d / file_name, bytes);
    return run_cli("import --format llama2c --model " + (d / file_name) + " --out " + (d / "out.h5"));
  };
  expect_error(import_of("cut.bin", v0.substr(0, v0.size() - 100)), "cut.bin: truncated");
  expect_error(import_of("cut_header.bin", v0.substr(0, 20)), "shorter than the 28-byte header");
  std::string bigger = v0;
  put<int32_t>(bigger, 4, 32);  // hidden_dim 64 -> 32: the header no longer describes the file
  expect_error(import_of("hidden.bin", bigger), "hidden.bin: sizes disagree");
  std::string grouping = v0;
  put<int32_t>(grouping, 16, 3);  // 4 query heads over 3 kv heads
  expect_error(import_of("groups.bin", grouping), "n_heads 4 is not a multiple of n_kv_heads 3");
  std::string magic = v1;
  put<uint32_t>(magic, 0, 0x616b3433);
  expect_error(import_of("magic.bin", magic), "bad magic 0x616b3433");
  std::string version = v1;
  put<int32_t>(version, 4, 2);
  expect_error(import_of("version.bin", version), "version 2 is not supported");
  expect_error(import_of("v1cut.bin", v1.substr(0, v1.size() - 4)), "v1cut.bin: truncated");
  expect_error(import_of("empty.bin", ""), "empty.bin: truncated");
  // a 92-byte file claiming 2^31 − 1 layers: refused as truncated from the header's arithmetic
  // (the layer list it would need ran out of memory after 18 s)
  std::string layers(92, '\0');
  for (auto [at, v] : std::vector<std::pair<size_t, int32_t>>{{0, 16}, {4, 32}, {8, 2147483647}, {12, 2}, {16, 1}, {20, 64}, {24, 32}})
    put<int32_t>(layers, at, v);
  expect_error(import_of("layers.bin", layers), "layers.bin: truncated");
  // a context later commands cannot hold (sample's KV cache, a v0 export's RoPE tables) is
  // refused at import, naming the field; it imported, then sample and export died of bad_alloc
  std::string context = v1;
  put<int32_t>(context, 32, 2147483647);  // v1: magic, version, dim, hidden, layers, heads, kv heads, vocab, max_seq_len
  expect_error(import_of("context.bin", context), "max_seq_len 2147483647");
  expect_error(run_cli("import --format llama2c --model " + (d / "missing.bin") + " --out " + (d / "out.h5")), "missing.bin");
  // a llama2.c file given as GGUF: refused by the GGUF reader, naming what it lacks
  expect_error(run_cli("import --format gguf --model " + bin("gqa_tied", 0) + " --out " + (d / "out.h5")), "GGUF's magic");
  BOOST_TEST(!fs::exists(d / "out.h5"));
  for (const auto& e : fs::directory_iterator(d.path)) BOOST_TEST(e.path().extension() == ".bin", e.path());
}

BOOST_AUTO_TEST_CASE(export_refuses_what_llama2c_cannot_express) {
  TempDir d;
  const GPTConfig llama = read_model_config(H5File::open_read(l2c("gqa_tied.h5")));
  auto refused = [&](const std::string& what, const std::function<void(GPTConfig&)>& change, const std::string& part) {
    GPTConfig c = llama;
    change(c);
    save_model(d / (what + ".h5"), GPT(c, 1));
    expect_error(run_cli("export --checkpoint " + (d / (what + ".h5")) + " --format llama2c --out " + (d / (what + ".bin"))),
                 "llama2.c cannot express " + part);
    BOOST_TEST(!fs::exists(d / (what + ".bin")), what);
  };
  refused("layernorm", [](GPTConfig& c) { c.norm = NormKind::LayerNorm; }, "norm \"layernorm\"");
  refused("gelu", [](GPTConfig& c) { c.mlp = MlpKind::Gelu; }, "mlp \"gelu\"");
  refused("bias", [](GPTConfig& c) { c.bias = true; }, "biases");
  refused("learned", [](GPTConfig& c) { c.pos = PosKind::Learned; }, "pos \"learned\"");
  refused("theta", [](GPTConfig& c) { c.rope_theta = 500000; }, "rope_theta");
  refused("eps", [](GPTConfig& c) { c.norm_eps = 1e-6; }, "norm_eps");
  expect_error(run_cli("export --checkpoint " + l2c("gqa_tied.h5") + " --format llama2c --version 2 --out " + (d / "v2.bin")),
               "--version");
  BOOST_TEST(!fs::exists(d / "v2.bin"));
}

BOOST_AUTO_TEST_CASE(generation_stops_at_the_stop_id) {
  lc::Model m = lc::read_model(bin("gqa_untied", 0));
  H5File f = H5File::open_read(l2c("gqa_untied.h5"));
  const std::vector<int32_t> prompt = f.read_ints("/expected/greedy_prompt"), want = f.read_ints("/expected/greedy");
  // the first generated id after the first that did not come before: generation ends just before it
  size_t k = prompt.size() + 1;
  while (std::find(want.begin() + prompt.size(), want.begin() + k, want[k]) != want.begin() + k) k++;
  m.gpt->eval();
  SampleOptions o;
  o.greedy = true;
  o.stop_id = want[k];
  const auto got = generate(*m.gpt, {prompt}, static_cast<int64_t>(want.size() - prompt.size()), o, 1);
  BOOST_TEST(got.at(0) == std::vector<int32_t>(want.begin(), want.begin() + k), tt::per_element());
}

BOOST_AUTO_TEST_CASE(tokenizer_bin_equals_llama2c_export) {
  const Tokenizer tok = SentencePiece::load(bytes_of(fixture_path("spm_bpe512.model")));
  BOOST_TEST((lc::tokenizer_bytes(tok, "t") == bytes_of(l2c("spm_bpe512.tokenizer.bin"))),
             "tokenizer.bin differs from llama2.c's tokenizer.py export");
  const lc::TokenizerBin t = lc::read_tokenizer_bin(l2c("spm_bpe512.tokenizer.bin"), 512);
  BOOST_TEST(t.pieces.at(1) == "\n<s>\n");
  BOOST_TEST(t.pieces.at(3) == "<0x00>");
  expect_throw([&] { lc::tokenizer_bytes(Tokenizer::of(CharTokenizer::from_text("abc")), "ck.h5"); }, ErrorKind::config,
               {"ck.h5", "char tokenizer"});
}

BOOST_AUTO_TEST_CASE(sample_prints_pytorchs_greedy_text) {
  // import with the sentencepiece model, then `sample --greedy`: BOS first, then the prompt's
  // pieces, stopping at BOS, as run.c -t 0 does; the text PyTorch's greedy ids decode to
  TempDir d;
  const std::string spm = fixture_path("spm_bpe512.model");
  Run r = run_cli("import --format llama2c --model " + bin("spm_tied", 0) + " --tokenizer-model " + spm +
                  " --tokenizer-bin " + l2c("spm_bpe512.tokenizer.bin") + " --out " + (d / "ck.h5"));
  BOOST_TEST_REQUIRE(r.code == 0, r.err);
  H5File f = H5File::open_read(l2c("spm_tied.h5"));
  const std::string prompt = f.read_attr_string("/expected", "greedy_prompt_text"),
                    want = f.read_attr_string("/expected", "greedy_text");
  const int64_t n = static_cast<int64_t>(f.read_ints("/expected/greedy").size() - f.read_ints("/expected/greedy_prompt").size());
  r = run_cli("sample --checkpoint " + (d / "ck.h5") + " --greedy --prompt '" + prompt + "' --tokens " + std::to_string(n));
  BOOST_TEST_REQUIRE(r.code == 0, r.err);
  BOOST_TEST(r.out == want + "\n");
  BOOST_TEST_MESSAGE("tapelm sample --greedy: " << r.out.substr(0, r.out.size() - 1) << "\nPyTorch greedy:        " << want);

  // export writes tokenizer.bin beside the model: both as llama2.c's scripts wrote them
  fs::create_directories(d / "out");
  r = run_cli("export --checkpoint " + (d / "ck.h5") + " --format llama2c --out " + (d / "out/model.bin"));
  BOOST_TEST_REQUIRE(r.code == 0, r.err);
  BOOST_TEST((bytes_of(d / "out/model.bin") == bytes_of(bin("spm_tied", 0))));
  BOOST_TEST((bytes_of(d / "out/tokenizer.bin") == bytes_of(l2c("spm_bpe512.tokenizer.bin"))));
}

BOOST_AUTO_TEST_CASE(bad_tokenizers_give_one_line_and_write_nothing) {
  TempDir d;
  const std::string spm = fixture_path("spm_bpe512.model"), tb = bytes_of(l2c("spm_bpe512.tokenizer.bin"));
  write_bytes(d / "short.bin", tb.substr(0, tb.size() - 40));
  expect_error(run_cli("import --format llama2c --model " + bin("spm_tied", 0) + " --tokenizer-model " + spm +
                       " --tokenizer-bin " + (d / "short.bin") + " --out " + (d / "o.h5")),
               "fewer than the model's vocab_size 512");
  std::string other = tb;
  other[4 + 8 + 1] ^= 1;  // a byte of id 0's piece "<unk>"
  write_bytes(d / "other.bin", other);
  expect_error(run_cli("import --format llama2c --model " + bin("spm_tied", 0) + " --tokenizer-model " + spm +
                       " --tokenizer-bin " + (d / "other.bin") + " --out " + (d / "o.h5")),
               "piece 0 differs");
  expect_error(run_cli("import --format llama2c --model " + bin("gqa_tied", 0) + " --tokenizer-model " + spm + " --out " +
                       (d / "o.h5")),
               "has 512 pieces, the model's vocab_size is 300");
  BOOST_TEST(!fs::exists(d / "o.h5"));
  // a checkpoint with a char tokenizer: no tokenizer.bin for run.c, so no export
  std::unique_ptr<GPT> m = load_model(l2c("gqa_tied.h5")).model;
  const Tokenizer chars = Tokenizer::of(CharTokenizer::from_text("abc"));
  write_converted(d / "char.h5", *m, &chars, "{}");
  expect_error(run_cli("export --checkpoint " + (d / "char.h5") + " --format llama2c --out " + (d / "char.bin")),
               "llama2.c cannot express a char tokenizer");
  BOOST_TEST(!fs::exists(d / "char.bin"));
  BOOST_TEST(!fs::exists(d / "tokenizer.bin"));
}

// export writes the model and its tokenizer together or not at all: a directory where tokenizer.bin
// goes left the new model.bin written, and an immutable old tokenizer.bin left the new model
// beside the old tokenizer.
BOOST_AUTO_TEST_CASE(export_commits_the_model_and_its_tokenizer_together) {
  TempDir d;
  const std::string ck = d / "ck.h5";  // with its sentencepiece tokenizer
  BOOST_TEST_REQUIRE(run_cli("import --format llama2c --model " + bin("spm_tied", 0) + " --tokenizer-model " +
                             fixture_path("spm_bpe512.model") + " --out " + ck).code == 0);
  fs::create_directories(d / "x/tokenizer.bin");
  expect_error(run_cli("export --checkpoint " + ck + " --format llama2c --out " + (d / "x/model.bin")),
               "holds tokenizer.bin, which tapelm did not write");
  BOOST_TEST(!fs::exists(d / "x/model.bin"));
}

// ... and an immutable old tokenizer.bin leaves the old model and the old tokenizer.
BOOST_AUTO_TEST_CASE(export_keeps_the_old_pair_when_the_old_tokenizer_cannot_be_replaced,
                     *boost::unit_test::precondition(test::chattr_works)) {
  TempDir d;
  const std::string ck = d / "ck.h5";
  BOOST_TEST_REQUIRE(run_cli("import --format llama2c --model " + bin("spm_tied", 0) + " --tokenizer-model " +
                             fixture_path("spm_bpe512.model") + " --out " + ck).code == 0);
  fs::create_directories(d / "y");
  write_bytes(d / "y/model.bin", "the old model");
  write_bytes(d / "y/tokenizer.bin", "the old tokenizer");
  // as an earlier export leaves it: tapelm's manifest of the folder lists its tokenizer.bin
  write_bytes(d / "y/.tapelm-manifest.json", R"({"format": "tapelm-manifest", "version": 1, "files": {"tokenizer.bin": {"by": "llama2c export"}}})");
  BOOST_TEST_REQUIRE(std::system(("chattr +i " + (d / "y/tokenizer.bin")).c_str()) == 0);
  const Run r = run_cli("export --checkpoint " + ck + " --format llama2c --out " + (d / "y/model.bin"));
  std::system(("chattr -i " + (d / "y/tokenizer.bin")).c_str());
  expect_error(r, "tokenizer.bin");
  BOOST_TEST(bytes_of(d / "y/model.bin") == "the old model");
  BOOST_TEST(bytes_of(d / "y/tokenizer.bin") == "the old tokenizer");
  for (const auto& e : fs::directory_iterator(d / "y")) BOOST_TEST(e.path().filename().string().find(".tmp") == std::string::npos);
}

// import and export stream: what they hold is one tensor, never the model (import loaded the whole
// model, 4 bytes a parameter; export 8, and built the file in memory). A 313 MB version 1 file of
// zeros (sparse: no disk), 6 layers of d 1024 with 1024 ids, is imported and exported back in a
// child process whose peak RSS (wait4's ru_maxrss) must stay below half the model; the export's
// bytes equal the file's. Skipped under AddressSanitizer, whose shadow memory is the RSS.
BOOST_AUTO_TEST_CASE(import_and_export_hold_one_tensor_not_the_model) {
  if (test::sanitized()) {
    BOOST_TEST_MESSAGE("skipped: AddressSanitizer's shadow memory is most of its RSS");
    return;
  }
  TempDir d;
  // export.py's version 1 header: magic, version, dim, hidden_dim, n_layers, n_heads, n_kv_heads,
  // vocab_size, max_seq_len, then shared_classifier and zeros to 256 bytes
  std::string head(256, '\0');
  const int32_t ints[9] = {static_cast<int32_t>(lc::kMagic), 1, 1024, 2816, 6, 8, 8, 1024, 256};
  std::memcpy(head.data(), ints, sizeof ints);
  head[36] = 1;
  const uint64_t params = 1024ull * 1024 + 6ull * (2 * 1024 + 4 * 1024 * 1024 + 3 * 1024 * 2816) + 1024;
  const std::string model = d / "big.bin";
  write_bytes(model, head);
  BOOST_TEST_REQUIRE(::truncate(model.c_str(), static_cast<off_t>(256 + 4 * params)) == 0);
  auto peak_mb = [&](const std::string& args) {
    const pid_t child = ::fork();
    if (child == 0) {
      const std::string cmd = std::string(TAPELM_BINARY) + " " + args + " >/dev/null 2>&1";
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    int status = 0;
    rusage ru{};
    ::wait4(child, &status, 0, &ru);
    BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), args << ": exit " << WEXITSTATUS(status));
    return static_cast<double>(ru.ru_maxrss) / 1024.0;  // kB
  };
  const double model_mb = 4.0 * static_cast<double>(params) / (1 << 20);
  const double in = peak_mb("import --format llama2c --model " + model + " --out " + (d / "big.h5"));
  const double out = peak_mb("export --format llama2c --version 1 --checkpoint " + (d / "big.h5") + " --out " + (d / "back.bin"));
  BOOST_TEST_MESSAGE("model " << model_mb << " MB; peak RSS: import " << in << " MB, export " << out << " MB");
  BOOST_TEST(in < model_mb / 2, "import's peak RSS " << in << " MB for a " << model_mb << " MB model");
  BOOST_TEST(out < model_mb / 2, "export's peak RSS " << out << " MB for a " << model_mb << " MB model");
  BOOST_TEST(bytes_of(d / "back.bin") == bytes_of(model));
}

BOOST_AUTO_TEST_SUITE_END()
