// Writes a synthetic Hugging Face model directory of a real model's shape with random weights:
// the input of bench/convert_streamed.sh, which times a conversion of a model larger than the
// memory a float32 copy of it would need. Matrices are uniform with the standard deviation 0.02
// of tapelm's (and GPT-2's) init, norm weights 1, biases 0: the times and the memory depend on the
// shapes, not the values. Tensors are written one at a time (at most one float32 tensor in
// memory) into shards of at most --shard-gb, with model.safetensors.index.json, as
// save_pretrained cuts them.
//
//   make_synthetic_hf --out DIR [--family llama|gpt2] [--layers 32] [--d 4096] [--heads 32]
//                     [--kv 32] [--hidden 11008] [--vocab 32000] [--ctx 4096]
//                     [--dtype bf16|f16|f32] [--shard-gb 2] [--seed 1]
//
// Llama-2-7B: the defaults. GPT-2-XL: --family gpt2 --layers 48 --d 1600 --heads 25 --kv 25
// --hidden 6400 --vocab 50257 --ctx 1024.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "autograd/error.h"
#include "train/formats/hf.h"
#include "train/formats/layout.h"
#include "train/formats/safetensors.h"

using namespace tapelm;
namespace fs = std::filesystem;
namespace st = tapelm::safetensors;

namespace {

// splitmix64: a fast, seedable stream; the values only need the right scale.
uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void write_file(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0)
    throw Error(ErrorKind::io, path + ": cannot write");
}

}  // namespace

int main(int argc, char** argv) {
  std::string out, family = "llama", dtype = "bf16";
  int64_t layers = 32, d = 4096, heads = 32, kv = 32, hidden = 11008, vocab = 32000, ctx = 4096;
  double shard_gb = 2;
  uint64_t seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--out") out = v;
    else if (k == "--family") family = v;
    else if (k == "--dtype") dtype = v;
    else if (k == "--layers") layers = std::stoll(v);
    else if (k == "--d") d = std::stoll(v);
    else if (k == "--heads") heads = std::stoll(v);
    else if (k == "--kv") kv = std::stoll(v);
    else if (k == "--hidden") hidden = std::stoll(v);
    else if (k == "--vocab") vocab = std::stoll(v);
    else if (k == "--ctx") ctx = std::stoll(v);
    else if (k == "--shard-gb") shard_gb = std::stod(v);
    else if (k == "--seed") seed = std::stoull(v);
    else {
      std::fprintf(stderr, "make_synthetic_hf: unknown flag %s\n", k.c_str());
      return 1;
    }
  }
  if (out.empty()) {
    std::fprintf(stderr, "make_synthetic_hf: --out DIR is required\n");
    return 1;
  }
  try {
    const formats::FamilyInfo* fam = formats::find_family(family);
    if (!fam) throw Error(ErrorKind::usage, "--family " + family + ": llama, qwen2 or gpt2");
    GPTConfig c;
    formats::apply_family(fam->family, c);
    c.n_layer = layers, c.n_embd = d, c.n_head = heads, c.n_kv_head = kv, c.mlp_hidden = hidden;
    c.vocab_size = vocab, c.block_size = ctx, c.tie_embeddings = fam->hf.tie_fallback;
    c.validate();
    const std::string st_dtype = dtype == "bf16" ? "BF16" : dtype == "f16" ? "F16" : "F32";
    const std::string torch_dtype = dtype == "bf16" ? "bfloat16" : dtype == "f16" ? "float16" : "float32";
    formats::LayoutOptions lo;
    lo.hf_prefix = fam->hf.prefix;
    std::vector<st::OutTensor> tensors;
    uint64_t stream = seed;
    for (const formats::FileTensor& t : formats::layout(c, fam->family, formats::Format::hf, lo)) {
      const uint64_t tensor_seed = splitmix(stream);
      const bool ones = t.shape.size() == 1 && t.name.find("bias") == std::string::npos;
      const bool zeros = t.name.find("bias") != std::string::npos;
      tensors.push_back({t.name, t.shape, [shape = t.shape, tensor_seed, ones, zeros] {
                           int64_t n = 1;
                           for (int64_t s : shape) n *= s;
                           std::vector<float> v(static_cast<size_t>(n), ones ? 1.f : 0.f);
                           if (ones || zeros) return v;
                           uint64_t s = tensor_seed;
                           const float a = 0.02f * std::sqrt(3.f);  // uniform on [-a, a]: sd 0.02
                           for (float& x : v) x = a * (static_cast<float>(splitmix(s) >> 40) / 8388608.f - 1.f);
                           return v;
                         }});
    }
    fs::create_directories(out);
    const st::ShardPlan plan = st::plan_shards(tensors, st_dtype, static_cast<uint64_t>(shard_gb * 1e9));
    for (size_t i = 0; i < plan.names.size(); i++) {
      const std::string path = (fs::path(out) / plan.names[i]).string();
      std::FILE* f = std::fopen(path.c_str(), "wb");
      if (!f) throw Error(ErrorKind::io, path + ": cannot create");
      st::write(f, plan.shards[i], st_dtype, {{"format", "pt"}}, path);
      if (std::fclose(f) != 0) throw Error(ErrorKind::io, path + ": cannot write");
      std::printf("wrote %s (%zu tensors)\n", path.c_str(), plan.shards[i].size());
      std::fflush(stdout);
    }
    if (!plan.index_json.empty()) write_file((fs::path(out) / "model.safetensors.index.json").string(), plan.index_json);
    const std::string arch = hf::architecture_for(c, "synthetic model");
    write_file((fs::path(out) / "config.json").string(), hf::config_json(c, arch, torch_dtype, -1, -1).dump(2) + "\n");
    std::printf("%s: %s, %ld layers, d %ld, %ld heads, %ld kv heads, hidden %ld, vocab %ld, context %ld, %s\n", out.c_str(), arch.c_str(),
                (long)layers, (long)d, (long)heads, (long)kv, (long)hidden, (long)vocab, (long)ctx, dtype.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_synthetic_hf: %s\n", e.what());
    return 1;
  }
  return 0;
}
