// Hugging Face model directories in and out. The fixtures (tests/fixtures/hf/make_hf_fixtures.py)
// are small Llama, Mistral, Qwen2 and GPT-2 models in HF's layout, in F32, BF16 and F16, one
// sharded, with the logits and greedy continuation of other projects' own model code on the same
// weights: llama2.c's model.py for the Llama layout, nanoGPT's model.py for GPT-2's; and a Phi-3
// model (fused q|k|v and gate|up) with a PyTorch forward written from transformers' modeling_phi3.py
// (tests/fixtures/hf/make_phi3_fixture.py).
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <deque>
#include <functional>
#include <tuple>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "data/io.h"
#include "nn/generate.h"
#include "train/formats/checkpoint.h"
#include "autograd/float16.h"
#include "train/formats/hf.h"
#include "train/formats/safetensors.h"
#include "train/formats/registry.h"
#include "test_util.h"

using namespace tapelm;
using namespace tapelm::test;
namespace fs = std::filesystem;
namespace tt = boost::test_tools;
namespace st = tapelm::safetensors;

namespace {

struct Fixture {
  std::string name, dtype;  // dtype: how the export should write it
};
const std::vector<Fixture> kModels{{"llama_mha_f32", "f32"},           {"llama_gqa_bf16_spm", "bf16"},
                                   {"mistral_mqa_f16_sharded", "f16"}, {"qwen2_gqa_bias", "f32"},
                                   {"gpt2_hub_layout", "f32"},         {"gpt2_prefixed_untied_bf16", "bf16"},
                                   {"phi3_gqa_f32", "f32"},            {"gptneox_mha_f32", "f32"},
                                   {"opt_mha_f32", "f32"},             {"qwen3_gqa_f32", "f32"},
                                   {"olmo2_mha_f32", "f32"},           {"gemma_mha_f32", "f32"}};
// The fixtures with a sentencepiece tokenizer.model.
bool has_spm(const std::string& name) { return name == "llama_gqa_bf16_spm" || name == "phi3_gqa_f32" || name == "gemma_mha_f32"; }

std::string hfx(const std::string& name) { return fixture_path("hf/" + name); }

// Every tensor of a model directory (single file or shards) by name, as stored bytes.
std::map<std::string, std::string> stored_tensors(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    const st::File f = st::File::open(e.path().string());
    for (const st::TensorInfo& t : f.tensors()) out[t.name] = std::string(f.bytes(t));
  }
  return out;
}

// A safetensors file from a header text and a data size.
std::string st_file(const std::string& header, size_t data_bytes) {
  std::string b(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(b.data(), &n, 8);
  return b + header + std::string(data_bytes, '\0');
}

}  // namespace

BOOST_AUTO_TEST_SUITE(hf)

BOOST_AUTO_TEST_CASE(import_reproduces_reference_logits) {
  for (const Fixture& fx : kModels) {
    BOOST_TEST_CONTEXT(fx.name) {
      TempDir d;
      const tapelm::hf::ImportResult imported = tapelm::hf::import_model(hfx(fx.name), d / "ck.h5");
      // a BF16 (F16) model is kept in BF16 (F16): the checkpoint is not twice the model's size
      const std::string kept = imported.dtypes == "BF16" ? "bf16" : imported.dtypes == "F16" ? "f16" : "f32";
      BOOST_TEST(to_string(imported.kept) == kept);
      const H5File ck = H5File::open_read(d / "ck.h5");
      const std::string stored = kept == "f32" ? "F32" : kept == "bf16" ? "BF16" : "F16";
      for (const std::string& n : ck.list_datasets_recursive("/model")) BOOST_TEST(ck.tensor_encoding("/model/" + n) == stored, n);
      LoadedModel l = load_model(d / "ck.h5");
      H5File f = H5File::open_read(hfx(fx.name + ".expected.h5"));
      Shape s;
      Index x(f.read_ints("/tokens", &s), {});
      x.shape = s;
      l.model->eval();
      NoGrad ng;
      const Tensor logits = l.model->forward(x).val(), want = f.read_tensor("/logits");
      BOOST_TEST_REQUIRE(logits.shape() == want.shape());
      double worst = 0;
      for (int64_t i = 0; i < want.numel(); i++) worst = std::max(worst, double(std::fabs(logits[i] - want[i])));
      BOOST_TEST(worst < 1e-4, "logits max |diff| " << worst);
      BOOST_TEST_MESSAGE(fx.name << ": logits max |tapelm - reference| " << worst << " over " << want.numel() << " logits");

      const std::vector<int32_t> prompt = f.read_ints("/greedy_prompt"), greedy = f.read_ints("/greedy");
      SampleOptions o;
      o.greedy = true;
      const auto got = generate(*l.model, {prompt}, static_cast<int64_t>(greedy.size() - prompt.size()), o, 1);
      BOOST_TEST(got.at(0) == greedy, tt::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(import_reads_the_config_as_the_reference_ran_it) {
  const auto c = [](const std::string& n) { return tapelm::hf::read_config(hfx(n + "/config.json")); };
  const auto llama = c("llama_gqa_bf16_spm");
  BOOST_TEST(llama.architecture == "LlamaForCausalLM");
  BOOST_TEST(llama.config.n_kv_head == 2);
  BOOST_TEST(llama.config.rope_theta == 500000.0);
  BOOST_TEST(llama.config.norm_eps == 1e-6);
  BOOST_TEST(llama.config.tie_embeddings);
  BOOST_TEST(!llama.config.bias);
  const auto qwen = c("qwen2_gqa_bias");
  BOOST_TEST(qwen.config.qkv_bias);
  BOOST_TEST(!qwen.config.bias);
  BOOST_TEST(!qwen.config.tie_embeddings);
  const auto g = c("gpt2_hub_layout");
  BOOST_TEST((g.config.mlp == MlpKind::GeluTanh));  // gelu_new
  BOOST_TEST((c("gpt2_prefixed_untied_bf16").config.mlp == MlpKind::Gelu));
  BOOST_TEST(g.config.mlp_hidden == 4 * g.config.n_embd);  // n_inner null
  BOOST_TEST(g.config.bias);
  BOOST_TEST(g.config.dropout == 0.0);  // the config's resid_pdrop is training's, not the model's function
  const auto q3 = c("qwen3_gqa_f32");  // head_dim 32 under hidden 64 / 4 heads
  BOOST_TEST(q3.architecture == "Qwen3ForCausalLM");
  BOOST_TEST(q3.config.head_size == 32);
  BOOST_TEST(q3.config.head_dim() == 32);
  BOOST_TEST((q3.config.qk_norm == QkNorm::head));
  BOOST_TEST((!q3.config.bias && !q3.config.qkv_bias));
  BOOST_TEST(q3.config.family.empty());  // its structure (q/k norms) names it
  const auto g7 = c("gemma_mha_f32");  // torch_dtype float32: √64 = 8
  BOOST_TEST(g7.architecture == "GemmaForCausalLM");
  BOOST_TEST((g7.config.norm == NormKind::RMSNorm1p && g7.config.mlp == MlpKind::GeGLU));
  BOOST_TEST(g7.config.embed_scale == 8.0);
  BOOST_TEST(g7.config.head_dim() == 32);
  BOOST_TEST(g7.config.tie_embeddings);
  // √d as transformers rounds it in the model's dtype: √3072 = 55.4256 in float32, 55.5 in bfloat16
  nlohmann::json gj = nlohmann::json::parse(slurp(hfx("gemma_mha_f32/config.json")));
  gj["hidden_size"] = 3072, gj["torch_dtype"] = "bfloat16";
  BOOST_TEST(tapelm::hf::parse_config(gj, "config.json").config.embed_scale == 55.5);
  gj["torch_dtype"] = "float32";
  BOOST_TEST(tapelm::hf::parse_config(gj, "config.json").config.embed_scale == static_cast<double>(std::sqrt(3072.f)));
  const auto o2 = c("olmo2_mha_f32");
  BOOST_TEST(o2.architecture == "Olmo2ForCausalLM");
  BOOST_TEST((o2.config.qk_norm == QkNorm::all && o2.config.norm_position == NormPosition::post));
  BOOST_TEST(o2.config.n_kv_head == 4);
  const auto o = c("opt_mha_f32");
  BOOST_TEST(o.architecture == "OPTForCausalLM");
  BOOST_TEST((o.config.mlp == MlpKind::Relu));
  BOOST_TEST(o.config.block_size == 64);  // max_position_embeddings: the table holds 66 rows
  BOOST_TEST(o.config.norm_eps == 1e-5);  // no key: PyTorch's LayerNorm default
  BOOST_TEST((o.config.bias && o.config.tie_embeddings && o.config.pos == PosKind::Learned));
  const auto n = c("gptneox_mha_f32");  // rotary_pct 0.25 of 16 dims, use_parallel_residual
  BOOST_TEST(n.architecture == "GPTNeoXForCausalLM");
  BOOST_TEST(n.config.rotary_dims == 4);
  BOOST_TEST(n.config.parallel_residual);
  BOOST_TEST(n.config.bias);
  BOOST_TEST(!n.config.tie_embeddings);
  BOOST_TEST((n.config.mlp == MlpKind::Gelu));
  BOOST_TEST((n.config.norm == NormKind::LayerNorm && n.config.pos == PosKind::Rope));
  BOOST_TEST(n.config.family.empty());  // its structure names it
}

BOOST_AUTO_TEST_CASE(export_then_import_gives_the_same_tensors_and_config) {
  for (const Fixture& fx : kModels) {
    BOOST_TEST_CONTEXT(fx.name) {
      TempDir d;
      tapelm::hf::import_model(hfx(fx.name), d / "ck.h5");
      const auto r = tapelm::hf::export_model(formats::open_model(d / "ck.h5"), d / "out", wt(fx.dtype));
      // the same bytes for every tensor the original holds (GPT-2's mask buffers are no weights;
      // tapelm writes GPT-2's names with the "transformer." prefix GPT2LMHeadModel saves)
      const auto was = stored_tensors(hfx(fx.name)), now = stored_tensors(d / "out");
      size_t compared = 0;
      for (const auto& [name, bytes] : was) {
        if (name.find(".attn.bias") != std::string::npos) continue;
        std::string n = name;
        if (r.architecture == "GPT2LMHeadModel" && n.rfind("transformer.", 0) != 0 && n != "lm_head.weight") n = "transformer." + n;
        auto it = now.find(n);
        BOOST_TEST_REQUIRE((it != now.end()), n);
        compared++;
        if (n.ends_with("decoder.embed_positions.weight")) {
          // OPT's two rows before position 0: no parameter holds them; written as zeros
          const size_t lead = bytes.size() / static_cast<size_t>(tapelm::hf::read_config(hfx(fx.name + "/config.json")).config.block_size + 2) * 2;
          BOOST_TEST((it->second.substr(lead) == bytes.substr(lead)), n);
          BOOST_TEST((it->second.substr(0, lead) == std::string(lead, '\0')), n);
          BOOST_TEST((bytes.substr(0, lead) != std::string(lead, '\0')), n << ": the fixture's own rows are not zeros");
          continue;
        }
        BOOST_TEST((it->second == bytes), n);
      }
      BOOST_TEST(compared == now.size());
      const auto a = tapelm::hf::read_config(hfx(fx.name + "/config.json")), b = tapelm::hf::read_config(d / "out/config.json");
      BOOST_TEST((a.config == b.config));
      // Mistral without a sliding window is Llama's function, written as Llama
      BOOST_TEST(b.architecture == (a.architecture == "MistralForCausalLM" ? "LlamaForCausalLM" : a.architecture));
      BOOST_TEST(fs::exists(d / "out/generation_config.json"));
      BOOST_TEST(fs::exists(d / "out/tokenizer.model") == has_spm(fx.name));
      if (has_spm(fx.name))
        BOOST_TEST(slurp(d / "out/tokenizer.model") == slurp(hfx(fx.name + "/tokenizer.model")));
    }
  }
}

BOOST_AUTO_TEST_CASE(export_shards_as_save_pretrained_and_imports_back) {
  TempDir d;
  tapelm::hf::import_model(hfx("qwen2_gqa_bias"), d / "ck.h5");
  // 20 kB per shard: the 2-layer model's 190 kB of float32 weights in about 10 files
  const auto r = tapelm::hf::export_model(formats::open_model(d / "ck.h5"), d / "out", WeightType::f32, 20000);
  const nlohmann::json idx = nlohmann::json::parse(slurp(d / "out/model.safetensors.index.json"));
  BOOST_TEST(idx["weight_map"].size() == stored_tensors(hfx("qwen2_gqa_bias")).size());
  size_t shards = 0;
  uint64_t data = 0;
  for (const auto& e : fs::directory_iterator(d.path / "out"))
    if (e.path().extension() == ".safetensors") {
      shards++;
      const st::File f = st::File::open(e.path().string());
      uint64_t here = 0;
      for (const auto& t : f.tensors()) here += t.end - t.begin;
      // a shard holds more than the limit only when one tensor alone does
      BOOST_TEST((here <= 20000 || f.tensors().size() == 1), e.path());
      data += here;
    }
  BOOST_TEST(shards > 5);
  BOOST_TEST(idx["metadata"]["total_size"].get<uint64_t>() == data);
  BOOST_TEST(!fs::exists(d / "out/model.safetensors"));
  tapelm::hf::import_model(d / "out", d / "back.h5");
  const LoadedModel a = load_model(d / "ck.h5"), b = load_model(d / "back.h5");
  const NamedParams pa = a.model->named_parameters(), pb = b.model->named_parameters();
  BOOST_TEST_REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); i++) {
    BOOST_TEST(pa[i].first == pb[i].first);
    BOOST_TEST(pa[i].second.val().to_vector() == pb[i].second.val().to_vector(), pa[i].first);
  }
  // exporting again unsharded removes the shards and index a loader would otherwise prefer
  tapelm::hf::export_model(formats::open_model(d / "ck.h5"), d / "out", WeightType::f32);
  BOOST_TEST(fs::exists(d / "out/model.safetensors"));
  BOOST_TEST(!fs::exists(d / "out/model.safetensors.index.json"));
  for (const auto& e : fs::directory_iterator(d.path / "out")) BOOST_TEST(e.path().filename().string().rfind("model-", 0) != 0);
}

BOOST_AUTO_TEST_CASE(a_tapelm_gpt_exports_as_gpt2_with_zero_biases) {
  // tapelm's default model (layernorm, exact GELU, learned positions, no biases, tied) is GPT-2's
  // function with every bias zero: exported so, it imports back to the same logits.
  TempDir d;
  GPTConfig c;
  c.vocab_size = 50;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_kv_head = 2;
  c.n_embd = 16;
  c.mlp_hidden = 64;
  GPT m(c, 7);
  save_model(d / "ck.h5", m);
  const auto r = tapelm::hf::export_model(formats::open_model(d / "ck.h5"), d / "out", WeightType::f32);
  BOOST_TEST(r.architecture == "GPT2LMHeadModel");
  BOOST_TEST(r.note.find("biases written as zeros") != std::string::npos);
  const nlohmann::json cfg = nlohmann::json::parse(slurp(d / "out/config.json"));
  BOOST_TEST(cfg["activation_function"] == "gelu");
  tapelm::hf::import_model(d / "out", d / "back.h5");
  const LoadedModel b = load_model(d / "back.h5");
  BOOST_TEST(b.model->config().bias);
  Index x({1, 5, 9, 2, 30, 49}, {1, 6});
  m.eval();
  b.model->eval();
  NoGrad ng;
  BOOST_TEST(m.forward(x).val().to_vector() == b.model->forward(x).val().to_vector(), tt::per_element());
}

BOOST_AUTO_TEST_CASE(export_refuses_what_no_hf_architecture_computes) {
  GPTConfig c;
  c.n_kv_head = 2;  // learned positions with 2 KV heads for 4 query heads
  BOOST_CHECK_EXCEPTION(tapelm::hf::architecture_for(c, "ck.h5"), Error, [](const Error& e) {
    return std::string(e.what()).find("ck.h5: 2 key/value heads for 4 query heads") == 0;
  });
  c.n_kv_head = 4;
  c.pos = PosKind::Rope;  // rope with layernorm and GELU: GPT-NeoX's
  BOOST_TEST(tapelm::hf::architecture_for(c, "") == "GPTNeoXForCausalLM");
  c.norm = NormKind::RMSNorm;  // rope with RMSNorm and GELU: no family's
  BOOST_CHECK_EXCEPTION(tapelm::hf::architecture_for(c, "ck.h5"), Error,
                        [](const Error& e) { return std::string(e.what()).find("match no architecture other programs run") != std::string::npos; });
  c.norm = NormKind::RMSNorm;
  c.mlp = MlpKind::SwiGLU;
  BOOST_TEST(tapelm::hf::architecture_for(c, "") == "LlamaForCausalLM");
  c.qkv_bias = true;
  BOOST_TEST(tapelm::hf::architecture_for(c, "") == "Qwen2ForCausalLM");
  TempDir d;
  write_bytes(d / "file", "x");
  tapelm::hf::import_model(hfx("llama_mha_f32"), d / "ck.h5");
  expect_error(run_cli("export --checkpoint " + (d / "ck.h5") + " --format hf --out " + (d / "file")), "exists and is not a directory");
  expect_error(run_cli("export --checkpoint " + (d / "ck.h5") + " --format hf --version 1 --out " + (d / "o")), "--version");
  expect_error(run_cli("export --checkpoint " + (d / "ck.h5") + " --format llama2c --dtype bf16 --out " + (d / "o.bin")), "--dtype");
  BOOST_TEST(!fs::exists(d / "o"));
}

BOOST_AUTO_TEST_CASE(hostile_safetensors_headers_are_refused_naming_the_fault) {
  TempDir d;
  auto refused = [&](const std::string& what, const std::string& bytes, const std::string& part) {
    BOOST_TEST_CONTEXT(what) {
      write_bytes(d / "m.safetensors", bytes);
      BOOST_CHECK_EXCEPTION(st::File::open(d / "m.safetensors"), Error, [&](const Error& e) {
        const std::string m = e.what();
        BOOST_TEST_MESSAGE(what << ": " << m);
        return e.kind() == ErrorKind::data && m.find("m.safetensors") != std::string::npos && m.find(part) != std::string::npos &&
               m.find('\n') == std::string::npos;
      });
    }
  };
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  BOOST_TEST(st::File::open((write_bytes(d / "ok.safetensors", st_file(ok, 8)), d / "ok.safetensors")).tensors().size() == 1);
  refused("empty", "", "truncated");
  refused("header past the end", st_file(ok, 8).substr(0, 20), "runs past the file's end");
  std::string huge(8, '\0');
  const uint64_t n = 200'000'000;
  std::memcpy(huge.data(), &n, 8);
  refused("header over 100 MB", huge, "exceeds the format's limit");
  refused("not JSON", st_file("{\"a\":", 0), "not valid JSON");
  refused("not an object", st_file("[1,2]", 0), "not a JSON object");
  refused("duplicate", st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
          "tensor 'a' appears twice");
  // a key repeated inside one entry (once: the last one won; the safetensors library refuses it)
  refused("duplicate key in an entry", st_file(R"({"a":{"dtype":"F32","shape":[1],"shape":[2],"data_offsets":[0,8]}})", 8), "has the key 'shape' twice");
  refused("unknown dtype", st_file(R"({"a":{"dtype":"F17","shape":[2],"data_offsets":[0,8]}})", 8), "unknown dtype 'F17'");
  refused("no shape", st_file(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8), "has no shape");
  refused("negative dim", st_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "non-negative integer");
  refused("overflow", st_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
          "more elements than fit in 64 bits");
  refused("bytes disagree", st_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "needs 3 x 4 bytes");
  refused("reversed offsets", st_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8), "end before they begin");
  refused("overlap",
          st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
          "overlaps");
  refused("gap",
          st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12),
          "a gap before it");
  refused("past the end", st_file(ok, 4), "(truncated)");
  refused("trailing bytes", st_file(ok, 12), "(trailing bytes)");
  refused("metadata value", st_file(R"({"__metadata__":{"format":1}})", 0), "__metadata__ value 'format' is not a string");
  refused("deep", st_file(R"({"a":{"dtype":"F32","shape":[[[2]]],"data_offsets":[0,8]}})", 8), "nests deeper");
  refused("offsets not a pair", st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8), "data_offsets must be [begin, end]");
  ::mkfifo((d / "fifo.safetensors").c_str(), 0600);
  BOOST_CHECK_EXCEPTION(st::File::open(d / "fifo.safetensors"), Error,
                        [](const Error& e) { return std::string(e.what()).find("not a regular file") != std::string::npos; });
  // an integer tensor is a valid file, but no weight
  write_bytes(d / "int.safetensors", st_file(R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8));
  const st::File f = st::File::open(d / "int.safetensors");
  float v;
  BOOST_CHECK_EXCEPTION(f.read_f32(f.tensors()[0], &v), Error,
                        [](const Error& e) { return std::string(e.what()).find("tensor 'a' has dtype I64") != std::string::npos; });
}

// A safetensors file is mapped a tensor at a time: its address space is the header's and one
// tensor's, not the file's (under `prlimit --as` a 618 MB model left 7.59 MB, and streaming was
// refused where the same model as a checkpoint streamed at 146 MB). A sparse 2 GiB file is read in
// a child process whose address space may grow by 512 MiB only: the small tensor comes back; the
// whole file mapped, as before, did not fit. Skipped under AddressSanitizer, whose shadow memory
// needs terabytes of address space.
BOOST_AUTO_TEST_CASE(a_safetensors_file_is_mapped_a_tensor_at_a_time) {
  if (test::sanitized()) {
    BOOST_TEST_MESSAGE("skipped: an address-space limit stops AddressSanitizer itself");
    return;
  }
  TempDir d;
  const uint64_t big = uint64_t(1) << 29;  // floats: 2 GiB
  const std::string header = R"({"small":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"big":{"dtype":"F32","shape":[)" +
                             std::to_string(big) + R"(],"data_offsets":[16,)" + std::to_string(16 + 4 * big) + "]}}";
  std::string head = st_file(header, 0);
  const float small[4] = {1.5f, -2.f, 3.25f, 4.f};
  head.append(reinterpret_cast<const char*>(small), sizeof small);
  const std::string path = d / "big.safetensors";
  write_bytes(path, head);
  BOOST_TEST_REQUIRE(::truncate(path.c_str(), static_cast<off_t>(head.size() + 4 * big)) == 0);  // sparse: no disk used
  const pid_t child = ::fork();
  BOOST_TEST_REQUIRE(child >= 0);
  if (child == 0) {
    std::ifstream status("/proc/self/status");
    uint64_t vm_kb = 0;
    for (std::string line; std::getline(status, line);)
      if (line.rfind("VmSize:", 0) == 0) vm_kb = std::stoull(line.substr(7));
    const rlimit lim{(vm_kb << 10) + (uint64_t(512) << 20), (vm_kb << 10) + (uint64_t(512) << 20)};
    if (::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(3);
    try {
      const st::File f = st::File::open(path);
      float out[4] = {};
      f.read_f32(*f.find("small"), out);
      ::_exit(std::memcmp(out, small, sizeof small) == 0 ? 0 : 4);
    } catch (...) {
      ::_exit(5);
    }
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0, "exit " << WEXITSTATUS(status) << " (5: the file could not be opened or read within the limit)");
}

BOOST_AUTO_TEST_CASE(bad_model_directories_give_one_line_and_write_nothing) {
  TempDir d;
  const std::string src = hfx("llama_mha_f32");
  auto copy_model = [&](const std::string& name) {
    fs::copy(src, d / name, fs::copy_options::recursive);
    return d / name;
  };
  auto import_of = [&](const std::string& dir) { return run_cli("import --format hf --model " + dir + " --out " + (d / "out.h5")); };
  auto edit_config = [&](const std::string& dir, const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json j = nlohmann::json::parse(slurp(dir + "/config.json"));
    f(j);
    write_bytes(dir + "/config.json", j.dump());
  };
  // config fields that change the function are refused, naming the field and its value
  const std::vector<std::tuple<std::string, std::function<void(nlohmann::json&)>, std::string>> fields{
      {"rope_scaling", [](auto& j) { j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; }, "rope_scaling"},
      {"rope_parameters", [](auto& j) { j["rope_parameters"] = {{"rope_type", "yarn"}}; }, "rope_parameters.rope_type \"yarn\""},
      {"head_dim", [](auto& j) { j["head_dim"] = 0; }, "head_dim 0 is no head width"},
      {"partial_rotary", [](auto& j) { j["partial_rotary_factor"] = 0.5; }, "partial_rotary_factor 0.5"},
      {"act", [](auto& j) { j["hidden_act"] = "gelu"; }, "hidden_act \"gelu\""},
      {"bias", [](auto& j) { j["attention_bias"] = true; }, "attention_bias true with mlp_bias false"},
      {"arch", [](auto& j) { j["architectures"] = {"FalconForCausalLM"}; }, "architecture \"FalconForCausalLM\""},
      {"type", [](auto& j) { j["num_attention_heads"] = "4"; }, "num_attention_heads"},
      {"kv", [](auto& j) { j["num_key_value_heads"] = 3; }, "num_key_value_heads 3 does not divide num_attention_heads 4"},
      {"window", [](auto& j) { j["architectures"] = {"MistralForCausalLM"}; j["sliding_window"] = 16; },
       "sliding_window 16 is shorter than the context"},
      // Mistral without the key: transformers' default window, 4096 (once imported as full attention)
      {"mistral_default_window",
       [](auto& j) { j["architectures"] = {"MistralForCausalLM"}; j.erase("sliding_window"); j["max_position_embeddings"] = 8192; },
       "no sliding_window (Mistral's default is 4096) is shorter than the context (max_position_embeddings 8192)"},
      // beyond GGUF's context_length range (once accepted, then sample died of std::bad_alloc)
      {"positions", [](auto& j) { j["max_position_embeddings"] = 2147483647; }, "max_position_embeddings 2147483647 is beyond the 16777216"},
      {"quantized", [](auto& j) { j["quantization_config"] = {{"bits", 4}}; }, "quantization_config"},
      {"missing", [](auto& j) { j.erase("hidden_size"); }, "has no hidden_size"},
  };
  for (const auto& [name, edit, part] : fields) {
    BOOST_TEST_CONTEXT(name) {
      const std::string dir = copy_model("cfg_" + name);
      edit_config(dir, edit);
      expect_error(import_of(dir), part);
    }
  }
  // GPT-2's
  const std::string g = d / "gpt2_act";
  fs::copy(hfx("gpt2_hub_layout"), g, fs::copy_options::recursive);
  edit_config(g, [](auto& j) { j["activation_function"] = "relu"; });
  expect_error(import_of(g), "activation_function \"relu\"");
  edit_config(g, [](auto& j) { j["activation_function"] = "gelu_new"; j["scale_attn_by_inverse_layer_idx"] = true; });
  expect_error(import_of(g), "scale_attn_by_inverse_layer_idx");
  // Phi-3's: LongRoPE (Phi-3-mini-128k), Phi-4-mini's partial rotary factor, Phi-3-mini-4k's window
  // of 2047 (here 16) under a longer context; its fused tensors read as Llama's names are missing
  const std::string p3 = d / "phi3";
  fs::copy(hfx("phi3_gqa_f32"), p3, fs::copy_options::recursive);
  const std::string p3_config = slurp(p3 + "/config.json");
  for (const auto& [edit, part] : std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>>{
           {[](auto& j) { j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0, 1.0}}}; }, "rope_scaling"},
           {[](auto& j) { j["partial_rotary_factor"] = 0.75; }, "partial_rotary_factor 0.75: tapelm rotates the whole head"},
           {[](auto& j) { j["sliding_window"] = 16; }, "sliding_window 16 is shorter than the context (max_position_embeddings 64)"},
           {[](auto& j) { j["architectures"] = {"LlamaForCausalLM"}; j["model_type"] = "llama"; },
            "do not match LlamaForCausalLM as config.json describes it: missing model.layers.0.self_attn.q_proj.weight"}}) {
    write_bytes(p3 + "/config.json", p3_config);
    edit_config(p3, edit);
    expect_error(import_of(p3), part);
  }
  // GPT-NeoX's: a rotary fraction that leaves an odd count (or none), attention without biases
  // beside an MLP with them, RoPE scaling, another activation; read as GPT-2 (whose defaults claim 12 layers)
  const std::string nx = d / "neox";
  fs::copy(hfx("gptneox_mha_f32"), nx, fs::copy_options::recursive);
  const std::string nx_config = slurp(nx + "/config.json");
  for (const auto& [edit, part] : std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>>{
           {[](auto& j) { j["rotary_pct"] = 0.1; }, "rotary_pct 0.1 rotates 1 of 16 dims a head: RoPE needs a positive even count"},
           {[](auto& j) { j["rotary_pct"] = 0; }, "rotates 0 of 16 dims"},
           {[](auto& j) { j["rope_parameters"] = {{"rope_type", "default"}, {"partial_rotary_factor", 1.5}}; }, "partial_rotary_factor 1.5 rotates 0"},
           {[](auto& j) { j["attention_bias"] = false; }, "attention_bias false"},
           {[](auto& j) { j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}}; }, "rope_scaling"},
           {[](auto& j) { j["hidden_act"] = "relu"; }, "hidden_act \"relu\": tapelm reads GPTNeoXForCausalLM with gelu, gelu_new, gelu_pytorch_tanh"},
           {[](auto& j) { j["architectures"] = {"GPT2LMHeadModel"}; j["model_type"] = "gpt2"; }, "the config claims 12 layers, but the 28 tensors"}}) {
    write_bytes(nx + "/config.json", nx_config);
    edit_config(nx, edit);
    expect_error(import_of(nx), part);
  }
  // Qwen3's: attention_bias (q, k, v and o biased, the MLP not); Qwen3Config's head_dim of 128
  // when the key is absent, which these tensors are not
  const std::string q3d = d / "qwen3";
  fs::copy(hfx("qwen3_gqa_f32"), q3d, fs::copy_options::recursive);
  const std::string q3_config = slurp(q3d + "/config.json");
  for (const auto& [edit, part] : std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>>{
           {[](auto& j) { j["attention_bias"] = true; }, "attention_bias true: biases on q, k, v and o alone"},
           {[](auto& j) { j.erase("head_dim"); }, "mis-shaped model.layers.0.self_attn.q_proj.weight"},
           {[](auto& j) { j["architectures"] = {"Qwen2ForCausalLM"}; j["model_type"] = "qwen2"; }, "model.layers.0.self_attn.q_norm.weight"}}) {
    write_bytes(q3d + "/config.json", q3_config);
    edit_config(q3d, edit);
    expect_error(import_of(q3d), part);
  }
  // Gemma's: an activation other than the tanh GELU (hidden_act "gelu" is Gemma-7B's and is not
  // what runs), attention_bias
  const std::string gm = d / "gemma";
  fs::copy(hfx("gemma_mha_f32"), gm, fs::copy_options::recursive);
  const std::string gm_config = slurp(gm + "/config.json");
  for (const auto& [edit, part] : std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>>{
           {[](auto& j) { j["hidden_activation"] = "gelu"; }, "hidden_activation \"gelu\": tapelm reads GemmaForCausalLM with gelu_pytorch_tanh"},
           {[](auto& j) { j["attention_bias"] = true; }, "attention_bias true"}}) {
    write_bytes(gm + "/config.json", gm_config);
    edit_config(gm, edit);
    expect_error(import_of(gm), part);
  }
  // OLMo-2's: attention_bias; read as Llama, its post-norms are tensors Llama has not
  const std::string ol = d / "olmo2";
  fs::copy(hfx("olmo2_mha_f32"), ol, fs::copy_options::recursive);
  const std::string ol_config = slurp(ol + "/config.json");
  for (const auto& [edit, part] : std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>>{
           {[](auto& j) { j["attention_bias"] = true; }, "attention_bias true"},
           {[](auto& j) { j["architectures"] = {"LlamaForCausalLM"}; j["model_type"] = "llama"; }, "missing model.layers.0.input_layernorm.weight"}}) {
    write_bytes(ol + "/config.json", ol_config);
    edit_config(ol, edit);
    expect_error(import_of(ol), part);
  }
  // OPT's: OPT-350m's post-norm blocks and projected embedding, no biases, no norm weights, no
  // final norm, another activation; a position table without its two leading rows
  const std::string op = d / "opt";
  fs::copy(hfx("opt_mha_f32"), op, fs::copy_options::recursive);
  const std::string op_config = slurp(op + "/config.json");
  for (const auto& [edit, part] : std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>>{
           {[](auto& j) { j["do_layer_norm_before"] = false; }, "do_layer_norm_before false (OPT-350m's post-norm blocks)"},
           {[](auto& j) { j["word_embed_proj_dim"] = 32; }, "word_embed_proj_dim 32 is not hidden_size 64"},
           {[](auto& j) { j["enable_bias"] = false; }, "enable_bias false"},
           {[](auto& j) { j["layer_norm_elementwise_affine"] = false; }, "layer_norm_elementwise_affine false"},
           {[](auto& j) { j["_remove_final_layer_norm"] = true; }, "_remove_final_layer_norm true"},
           {[](auto& j) { j["activation_function"] = "gelu"; }, "activation_function \"gelu\": tapelm reads OPTForCausalLM with relu"},
           {[](auto& j) { j["max_position_embeddings"] = 66; }, "model.decoder.embed_positions.weight"}}) {
    write_bytes(op + "/config.json", op_config);
    edit_config(op, edit);
    expect_error(import_of(op), part);
  }

  // tensors: one missing, one extra, a wrong shape
  const std::string m = copy_model("missing");
  const st::File f = st::File::open(src + "/model.safetensors");
  auto rewrite = [&](const std::string& dir, const std::function<void(std::vector<st::OutTensor>&, std::deque<std::vector<float>>&)>& edit) {
    std::deque<std::vector<float>> keep;
    std::vector<st::OutTensor> ts;
    for (const auto& t : f.tensors()) {
      keep.emplace_back(t.numel());
      f.read_f32(t, keep.back().data());
      ts.push_back({t.name, t.shape, [v = keep.back()] { return v; }});
    }
    edit(ts, keep);
    write_files_atomic_streamed({{dir + "/model.safetensors", [&](std::FILE* out) { st::write(out, ts, "F32", {}, "test"); }}});
  };
  rewrite(m, [](auto& ts, auto&) { ts.erase(ts.begin() + 3); });
  expect_error(import_of(m), "do not match LlamaForCausalLM as config.json describes it: missing model.layers.0.self_attn.k_proj.weight");
  const std::string x = copy_model("extra");
  rewrite(x, [](auto& ts, auto& keep) {
    ts.push_back({"model.layers.9.mlp.up_proj.weight", {2, 2}, [] { return std::vector<float>(4, 0.f); }});
  });
  expect_error(import_of(x), "do not match LlamaForCausalLM as config.json describes it: extra model.layers.9.mlp.up_proj.weight");
  const std::string s = copy_model("shape");
  rewrite(s, [](auto& ts, auto&) { ts[1].shape = {16, 2}; });
  expect_error(import_of(s), "mis-shaped model.layers.0.input_layernorm.weight [16, 2] (expected [32])");

  // shards: one named in the index but absent, an index naming a path outside the directory
  const std::string sh = d / "shards";
  fs::copy(hfx("mistral_mqa_f16_sharded"), sh, fs::copy_options::recursive);
  fs::remove(sh + "/model-00002-of-00003.safetensors");
  expect_error(import_of(sh), "model-00002-of-00003.safetensors: no such file");
  std::string idx = slurp(sh + "/model.safetensors.index.json");
  idx.replace(idx.find("model-00002-of-00003"), 20, "../../etc/passwd0000");
  write_bytes(sh + "/model.safetensors.index.json", idx);
  expect_error(import_of(sh), "not a file name in");
  // an index naming a tensor its shard does not hold (was accepted)
  const std::string named = d / "named";
  fs::copy(hfx("mistral_mqa_f16_sharded"), named, fs::copy_options::recursive);
  nlohmann::json index = nlohmann::json::parse(slurp(named + "/model.safetensors.index.json"));
  index["weight_map"]["model.layers.0.mlp.extra.weight"] = "model-00001-of-00003.safetensors";
  write_bytes(named + "/model.safetensors.index.json", index.dump());
  expect_error(import_of(named), "puts tensor 'model.layers.0.mlp.extra.weight' in");
  // a config claiming layers of d 65,536 (2 layers: 0.4 TB) over the 0.2 MB fixture: the tensors'
  // shapes are checked against the claim before anything is allocated (was refused after 49 s at
  // 3.7 GB, once the model was built)
  const std::string huge = copy_model("huge");
  edit_config(huge, [](auto& j) {
    j["hidden_size"] = 65536, j["intermediate_size"] = 196608;
    j["num_attention_heads"] = 512, j["num_key_value_heads"] = 512;
  });
  expect_error(import_of(huge), "mis-shaped model.embed_tokens.weight [300, 32] (expected [300, 65536])");
  // a config claiming 10^9 layers over the 2-layer fixture: refused at once by every command and
  // --format (convert ran past 120 s under a 6 GiB cap listing the claimed layers' tensors)
  const std::string deep = copy_model("deep");
  edit_config(deep, [](auto& j) { j["num_hidden_layers"] = 1000000000; });
  for (const std::string& cmd : {"import --format hf --model " + deep + " --out " + (d / "deep.h5"),
                                  "convert --from " + deep + " --kv-heads 2 --out " + (d / "deep.h5"),
                                  "convert --from " + deep + " --kv-heads 2 --format hf --out " + (d / "deep_hf"),
                                  "convert --from " + deep + " --kv-heads 2 --format gguf --out " + (d / "deep.gguf"),
                                  "eval --checkpoint " + deep + " --data " + fixture_path("tiny.txt")}) {
    const Run r = run_cli(cmd, "timeout 20 ");
    expect_error(r, "the config claims 1000000000 layers, but the");
  }
  // a corrupt sentencepiece model beside the weights: named, without sentencepiece's source line
  const std::string spm = d / "spm";
  fs::copy(hfx("llama_gqa_bf16_spm"), spm, fs::copy_options::recursive);
  write_bytes(spm + "/tokenizer.model", "garbage");
  const Run corrupt = import_of(spm);
  expect_error(corrupt, spm + "/tokenizer.model: not a sentencepiece model");
  BOOST_TEST(corrupt.err.find("Internal") == std::string::npos, corrupt.err);
  expect_error(import_of(d / "nowhere"), "not a directory");
  BOOST_TEST(!fs::exists(d / "out.h5"));
}

// Exports replace a directory whole or not at all. A weight beyond F16's range (1e5) and a q8_0
// block beyond its scale's (2e7 / 127 > 65504) are refused naming the tensor (both were written
// as Inf, exit 0, and tapelm's own import then refused the file), and the failed export leaves the
// earlier export's files as they were, byte for byte (the export once renamed file by file, so a
// kill between renames mixed a new config.json with old weights). A later export with another
// tokenizer, or none, leaves none of the earlier one's files (a stale tokenizer.model beside a
// new tokenizer.json was read first, and sample printed garbage).
BOOST_AUTO_TEST_CASE(exports_replace_a_directory_whole_or_not_at_all) {
  TempDir d;
  tapelm::hf::import_model(hfx("llama_gqa_bf16_spm"), d / "spm.h5");
  auto tree = [](const std::string& dir) {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename() != ".lock") files[e.path().filename().string()] = slurp(e.path().string());
    return files;
  };
  auto with_weight = [&](const std::string& name, int64_t count, float v) {
    LoadedModel lm = load_model(d / "spm.h5");
    for (auto& [n, p] : lm.model->named_parameters())
      if (n == "blocks.0.attn.wo.weight") std::fill(p.val().data(), p.val().data() + count, v);
    write_converted(d / name, *lm.model, lm.tok ? &*lm.tok : nullptr, "{}");
    return d / name;
  };
  const std::string big = with_weight("big.h5", 1, 1e5f), huge = with_weight("huge.h5", 32, 2e7f);
  Run r = run_cli("export --format hf --dtype f32 --checkpoint " + (d / "spm.h5") + " --out " + (d / "out"));
  BOOST_TEST_REQUIRE(r.code == 0, r.err);
  const auto first = tree(d / "out");
  BOOST_TEST(first.count("tokenizer.model") == 1u);
  expect_error(run_cli("export --format hf --dtype f16 --checkpoint " + big + " --out " + (d / "out")),
               "tensor model.layers.0.self_attn.o_proj.weight holds 100000.000000 at element 0, beyond F16's range");
  BOOST_TEST((tree(d / "out") == first));
  expect_error(run_cli("export --format gguf --dtype f16 --checkpoint " + big + " --out " + (d / "x.gguf")), "beyond F16's range");
  expect_error(run_cli("export --format gguf --dtype q8_0 --checkpoint " + huge + " --out " + (d / "x.gguf")),
               "beyond what a q8_0 block's F16 scale can hold");
  BOOST_TEST(!fs::exists(d / "x.gguf"));
  // another tokenizer: the old one's file is gone
  r = run_cli("export --format hf --checkpoint " + fixture_path("gguf/gpt2_gpt2mini.h5") + " --out " + (d / "out"));
  BOOST_TEST_REQUIRE(r.code == 0, r.err);
  BOOST_TEST(!fs::exists(d / "out/tokenizer.model"));
  BOOST_TEST(fs::exists(d / "out/tokenizer.json"));
  // no tokenizer: no tokenizer file
  LoadedModel bare = load_model(d / "spm.h5");
  save_model(d / "bare.h5", *bare.model);
  r = run_cli("export --format hf --checkpoint " + (d / "bare.h5") + " --out " + (d / "out"));
  BOOST_TEST_REQUIRE(r.code == 0, r.err);
  for (const char* f : {"tokenizer.model", "tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"})
    BOOST_TEST(!fs::exists(d / ("out/" + std::string(f))), f);
}

// The directory's tokenizer.json is read (byte-level BPE) or the import is refused naming the
// field: a model never loses its tokenizer silently. (tests/test_bytebpe.cpp imports a real one.)
BOOST_AUTO_TEST_CASE(a_tokenizer_json_that_is_not_byte_level_bpe_is_refused) {
  TempDir d;
  fs::copy(hfx("llama_mha_f32"), d / "m", fs::copy_options::recursive);
  write_bytes(d / "m/tokenizer.json", R"({"model": {"type": "WordPiece", "vocab": {}}})");
  expect_error(run_cli("import --format hf --model " + (d / "m") + " --out " + (d / "ck.h5")), "model.type");
  BOOST_TEST(!fs::exists(d / "ck.h5"));
  write_bytes(d / "m/tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Metaspace"}})");
  expect_error(run_cli("import --format hf --model " + (d / "m") + " --out " + (d / "ck.h5")), "not a byte-level vocabulary");
  BOOST_TEST(!fs::exists(d / "ck.h5"));
}

BOOST_AUTO_TEST_CASE(half_precision_conversions_round_as_ieee_does) {
  // widening then narrowing is the identity on every f16 and bf16 value but NaN payloads
  for (uint32_t h = 0; h < 65536; h++) {
    const uint16_t v = static_cast<uint16_t>(h);
    const bool nan16 = (v & 0x7c00) == 0x7c00 && (v & 0x3ff), nanbf = (v & 0x7f80) == 0x7f80 && (v & 0x7f);
    if (!nan16 && f32_to_f16(f16_to_f32(v)) != v) BOOST_FAIL("f16 " << h);
    if (!nanbf && f32_to_bf16(bf16_to_f32(v)) != v) BOOST_FAIL("bf16 " << h);
    if (nan16) BOOST_TEST(std::isnan(f16_to_f32(v)));
  }
  // derivations: f16 has 10 mantissa bits, so 1 + 2^-11 is halfway between 1 (0x3c00, even) and
  // 1 + 2^-10 (0x3c01): ties go to even; 1 + 3·2^-11 is halfway between 0x3c01 and 0x3c02 (even)
  BOOST_TEST(f32_to_f16(1.0f + std::ldexp(1.f, -11)) == 0x3c00);
  BOOST_TEST(f32_to_f16(1.0f + 3 * std::ldexp(1.f, -11)) == 0x3c02);
  BOOST_TEST(f32_to_f16(65504.f) == 0x7bff);  // the largest half
  BOOST_TEST(f32_to_f16(65519.f) == 0x7bff);  // below the midpoint 65520 to the next (infinite) step
  BOOST_TEST(f32_to_f16(65520.f) == 0x7c00);  // the midpoint rounds to even: infinity
  BOOST_TEST(f32_to_f16(std::ldexp(1.f, -24)) == 0x0001);  // the smallest subnormal
  BOOST_TEST(f32_to_f16(std::ldexp(1.f, -25)) == 0x0000);  // half of it: a tie, to even (zero)
  BOOST_TEST(f32_to_f16(std::ldexp(3.f, -26)) == 0x0001);  // three quarters of it: up
  BOOST_TEST(f32_to_f16(-0.f) == 0x8000);
  // bf16 keeps float32's upper 16 bits: 1 + 2^-8 is halfway between 0x3f80 (even) and 0x3f81
  BOOST_TEST(f32_to_bf16(1.0f + std::ldexp(1.f, -8)) == 0x3f80);
  BOOST_TEST(f32_to_bf16(1.0f + 3 * std::ldexp(1.f, -8)) == 0x3f82);
  BOOST_TEST(f32_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds up past the largest bf16
  BOOST_TEST(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

BOOST_AUTO_TEST_SUITE_END()
