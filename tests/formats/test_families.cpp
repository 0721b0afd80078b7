// Every family row of train/formats/families.cpp walked through every format it is written in and
// back. The names themselves are held against the real programs elsewhere (the HF fixtures saved by
// transformers, the GGUF files llama.cpp ran); here the table is held to what makes it a table: each
// parameter of a model lands in exactly one file tensor, no two tensors share a name, the file's
// values come back bit for bit, and a family's config survives its own config.json and GGUF keys.
#include <boost/test/unit_test.hpp>
#include <set>

#include "nn/gpt.h"
#include "train/formats/checkpoint.h"
#include "train/formats/families.h"
#include "train/formats/gguf.h"
#include "train/formats/hf.h"
#include "train/formats/layout.h"
#include "test_util.h"

using namespace tapelm;
using namespace tapelm::test;
namespace fmt = tapelm::formats;

namespace {

// A small model of family f: 2 layers, GQA (4 heads, 2 KV heads) where the family's configs have a
// KV count, untied or tied, with biases when `bias` and the family allows the choice.
GPTConfig small_config(const fmt::FamilyInfo& f, bool tied, bool bias) {
  GPTConfig c;
  fmt::apply_family(f.family, c);
  c.n_layer = 2, c.n_embd = 16, c.n_head = 4, c.n_kv_head = *f.hf.kv_heads ? 2 : 4, c.mlp_hidden = 24;
  c.vocab_size = 513, c.block_size = 8, c.tie_embeddings = tied, c.dropout = 0;
  c.norm_eps = 1.0 / 131072;  // GGUF keeps it in float32, which holds this exactly
  if (c.pos == PosKind::Rope) c.rope_theta = 50000;
  if (bias && !f.qkv_bias_only && !f.unbiased) c.bias = true;
  if (!f.swiglu && !f.relu) c.mlp = f.gguf.gelu;  // the GELU llama.cpp computes
  if (!*f.hf.eps) c.norm_eps = f.hf.eps_fallback;  // a family without the key (OPT) has one ε
  if (f.partial_rotary) c.rotary_dims = 2;  // of a head's 4 dims
  if (*f.hf.head_dim) c.head_size = 8;      // a head width of its own where the family has the key (d / H is 4)
  if (f.embed_scale) c.embed_scale = fmt::sqrt_d_as(c.n_embd, "float32");  // √16: Gemma's, for this width
  c.parallel_residual = f.parallel_residual;
  c.validate();
  return c;
}

// Every parameter set to values no two share (the layout's transforms must move each, not zero it).
void fill_distinct(GPT& m) {
  float next = 0.001f;
  for (auto& [name, p] : m.named_parameters()) {
    Tensor t = p.val();
    for (int64_t i = 0; i < t.numel(); i++) t.data()[i] = (next += 0.001f);
  }
}

// The formats a family's layout is written in: llama2.c holds Llama's structure without biases alone.
std::vector<fmt::Format> formats_of(const fmt::FamilyInfo& f, const GPTConfig& c) {
  std::vector<fmt::Format> out{fmt::Format::tapelm, fmt::Format::hf};
  if (!f.gguf.none) out.push_back(fmt::Format::gguf);
  if (f.family == fmt::Family::llama && !c.bias) out.push_back(fmt::Format::llama2c);
  return out;
}

const char* format_name(fmt::Format f) {
  return f == fmt::Format::tapelm ? "tapelm" : f == fmt::Format::hf ? "hf" : f == fmt::Format::gguf ? "gguf" : "llama2c";
}

}  // namespace

BOOST_AUTO_TEST_SUITE(families)

BOOST_AUTO_TEST_CASE(every_family_and_format_maps_each_parameter_once_and_back) {
  int walked = 0;
  for (const fmt::FamilyInfo& f : fmt::families())
    for (bool tied : {false, true})
      for (bool bias : {false, true}) {
        const GPTConfig c = small_config(f, tied, bias);
        BOOST_TEST_REQUIRE((fmt::family_of(c, "test") == f.family), f.name << ": its own config is another family");
        GPT model(c, 7);
        fill_distinct(model);
        const fmt::TensorMap params = fmt::tensors_of(model);
        for (fmt::Format fo : formats_of(f, c))
          for (const std::string& prefix : {std::string(), std::string(f.hf.prefix)}) {
            if (fo != fmt::Format::hf && !prefix.empty()) continue;
            const std::string what = std::string(f.name) + " in " + format_name(fo) + (prefix.empty() ? "" : " with " + prefix) +
                                     (tied ? ", tied" : "") + (c.bias ? ", biased" : "");
            for (int version : fo == fmt::Format::llama2c ? std::vector<int>{0, 1} : std::vector<int>{0}) {
              const std::vector<fmt::FileTensor> lay = fmt::layout(c, f.family, fo, {.hf_prefix = prefix, .llama2c_version = version});
              std::set<std::string> names, parts;
              fmt::TensorMap back;
              for (const auto& [name, t] : params) back.emplace(name, Tensor::zeros(t.shape()));
              for (const fmt::FileTensor& t : lay) {
                BOOST_TEST(names.insert(t.name).second, what << ": " << t.name << " twice");
                BOOST_TEST(t.name.find_first_of("{}") == std::string::npos, what << ": " << t.name << " keeps a placeholder");
                if (!prefix.empty() && t.name != "lm_head.weight" && t.name != "embed_out.weight") BOOST_TEST(t.name.starts_with(prefix), what << ": " << t.name);
                if (t.extra) continue;
                for (const auto& [part, shape] : t.parts) {
                  BOOST_TEST(parts.insert(part).second, what << ": parameter " << part << " in two file tensors");
                  // a part the model lacks is a bias written as zeros, in a family whose layout has them everywhere
                  if (!params.count(part)) BOOST_TEST((f.all_biases && part.ends_with(".bias") && fo != fmt::Format::tapelm), what << ": " << part);
                }
                fmt::store_file_values(t, fmt::file_values(t, params).data(), back);
              }
              for (const auto& [name, t] : params) {
                BOOST_TEST(parts.count(name) == 1u, what << ": parameter " << name << " in no file tensor");
                BOOST_TEST(same_bits(t, back.at(name)), what << ": " << name << " does not come back");
              }
              // the layer-count check accepts the truth and refuses a config claiming far more
              GPTConfig claim = c;
              BOOST_CHECK_NO_THROW(fmt::check_layer_count(c, f.family, fo, {.hf_prefix = prefix, .llama2c_version = version}, lay.size(), what));
              claim.n_layer = 1000;
              claim.layer_kv_heads.clear();
              BOOST_CHECK_THROW(fmt::check_layer_count(claim, f.family, fo, {.hf_prefix = prefix, .llama2c_version = version}, lay.size(), what),
                                Error);
              walked++;
            }
          }
      }
  BOOST_TEST_MESSAGE("families × formats walked: " << walked);
  BOOST_TEST(walked >= static_cast<int>(fmt::families().size()) * 4 * 2);
}

BOOST_AUTO_TEST_CASE(every_family_config_survives_its_config_json_and_aliases) {
  for (const fmt::FamilyInfo& f : fmt::families())
    for (bool tied : {false, true})
      for (bool bias : {false, true}) {
        GPTConfig c = small_config(f, tied, bias);
        const std::string arch = tapelm::hf::architecture_for(c, "test");
        BOOST_TEST(arch == f.hf_architecture);
        const nlohmann::ordered_json written = tapelm::hf::config_json(c, arch, "float32", 1, 2);
        const tapelm::hf::HfConfig back = tapelm::hf::parse_config(nlohmann::json::parse(written.dump()), "config.json");
        BOOST_TEST((back.family == f.family), f.name);
        BOOST_TEST((back.config == c), f.name << ": " << written.dump() << " read back as another config");
        BOOST_TEST(back.bos_token_id == 1);
        BOOST_TEST(back.eos_token_id == 2);
        // each alias names the family, by architecture and by model_type alone
        for (const auto& [alias, model_type] : f.hf_aliases) {
          BOOST_TEST(fmt::find_family(alias) == &f);
          nlohmann::json j = nlohmann::json::parse(written.dump());
          j.erase("architectures");
          j["model_type"] = model_type;
          j["sliding_window"] = nullptr;  // Mistral's window, none
          BOOST_TEST((tapelm::hf::parse_config(j, "config.json").family == f.family), alias);
        }
      }
}

BOOST_AUTO_TEST_CASE(every_family_travels_through_hf_and_gguf_files_and_back) {
  // a byte-level BPE vocabulary of 513 ids, which llama.cpp's gpt2 tokenizer takes for every family
  const Tokenizer tok = read_tokenizer(H5File::open_read(fixture_path("gguf/gpt2_gpt2mini.h5")));
  BOOST_TEST_REQUIRE(tok.vocab_size() == 513);
  TempDir dir;
  for (const fmt::FamilyInfo& f : fmt::families())
    for (bool tied : {false, true}) {
      GPTConfig c = small_config(f, tied, true);
      GPT model(c, 11);
      fill_distinct(model);
      const fmt::TensorMap params = fmt::tensors_of(model);
      const auto fill = [&](fmt::ModelSink& s) {
        for (const auto& [name, t] : params) s.tensor(name, t);
      };
      const std::string what = std::string(f.name) + (tied ? " tied" : "");
      const std::string hf_dir = dir / (std::string(f.name) + (tied ? "_tied" : "") + "_hf");
      const std::string gguf_file = dir / (std::string(f.name) + (tied ? "_tied" : "") + ".gguf");
      tapelm::hf::write_model(hf_dir, c, &tok, WeightType::f32, what, fill);
      std::vector<std::string> paths{hf_dir};
      if (f.gguf.none) {  // no llama.cpp architecture: refused in one line, nothing written
        expect_throw([&] { tapelm::gguf::write_model(gguf_file, c, &tok, WeightType::f32, what, fill); }, ErrorKind::config,
                     {"llama.cpp has no architecture for " + std::string(f.name)});
        BOOST_TEST(!std::filesystem::exists(gguf_file));
      } else {
        tapelm::gguf::write_model(gguf_file, c, &tok, WeightType::f32, what, fill);
        paths.push_back(gguf_file);
      }
      for (const std::string& path : paths) {
        const fmt::OpenedModel m = fmt::open_model(path);
        BOOST_TEST((m.config == c), what << " from " << path << " is another config: " << m.config.to_json().dump() << " for " << c.to_json().dump());
        const std::unique_ptr<GPT> loaded = m.load();
        for (const auto& [name, t] : fmt::tensors_of(*loaded)) BOOST_TEST(same_bits(t, params.at(name)), what << " from " << path << ": " << name);
      }
    }
}

// The `family` key names the family where the structure names another (Phi-3 has Llama's): an
// importer sets it only then, and a family whose structure the config has not is refused at
// export, as is a name no row has; a name with other characters is no config at all.
BOOST_AUTO_TEST_CASE(the_family_key_names_what_the_structure_does_not) {
  for (const fmt::FamilyInfo& f : fmt::families()) {
    const GPTConfig c = small_config(f, false, false);
    BOOST_TEST(c.family == (f.family == fmt::Family::phi3 ? "phi3" : ""), f.name);
    BOOST_TEST((c.to_json().contains("family") == !c.family.empty()), f.name);  // configs without it stay as they were
  }
  GPTConfig phi3 = small_config(fmt::family_info(fmt::Family::phi3), false, false);
  phi3.bias = true;
  expect_throw([&] { fmt::family_of(phi3, "m.h5"); }, ErrorKind::config,
               {"m.h5: config family \"phi3\": phi3's layout is rmsnorm, swiglu, rope, no biases"});
  phi3.bias = false;
  phi3.family = "falcon";
  expect_throw([&] { fmt::family_of(phi3, "m.h5"); }, ErrorKind::config, {"config family \"falcon\" is no family tapelm writes"});
  phi3.family = "Phi-3";
  expect_throw([&] { phi3.validate(); }, ErrorKind::config, {"config family must be a family's name"});
  // GPT-NeoX's options where only gptneox has keys for them: named, not "no architecture"
  GPTConfig llama = small_config(fmt::family_info(fmt::Family::llama), false, false);
  llama.parallel_residual = true;
  expect_throw([&] { fmt::family_of(llama, "m.h5"); }, ErrorKind::config,
               {"m.h5: parallel_residual: llama's layout adds the attention, then the MLP (gptneox has the parallel residual)"});
  llama.parallel_residual = false;
  llama.rotary_dims = 2;
  expect_throw([&] { fmt::family_of(llama, "m.h5"); }, ErrorKind::config, {"m.h5: rotary_dims 2: llama's layout rotates the whole head"});
  GPTConfig gpt2 = small_config(fmt::family_info(fmt::Family::gpt2), false, true);
  gpt2.parallel_residual = true;
  expect_throw([&] { fmt::family_of(gpt2, "m.h5"); }, ErrorKind::config, {"parallel_residual: gpt2's layout"});
}

BOOST_AUTO_TEST_SUITE_END()
