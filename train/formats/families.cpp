#include "train/formats/families.h"

#include <cmath>

#include "autograd/error.h"
#include "autograd/float16.h"

namespace tapelm::formats {

namespace {

// A sliding window at least as long as the context never applies; a shorter one is refused.
// `fallback` is the window a config without the key has (0: none).
void check_window(const HfJson& j, const GPTConfig& c, int64_t fallback) {
  if (j.json().contains("sliding_window") ? !j.has("sliding_window") : fallback == 0) return;  // null: no window
  int64_t w = fallback;
  j.get("sliding_window", w);
  if (w < c.block_size)
    j.refuse((j.json().contains("sliding_window") ? "sliding_window " + std::to_string(w)
                                                   : "no sliding_window (Mistral's default is " + std::to_string(fallback) + ")") +
             " is shorter than the context (max_position_embeddings " + std::to_string(c.block_size) + "): tapelm attends over the whole context");
}

// Llama and Mistral: biases on every projection or none; Mistral's window is 4096 by default, as
// transformers' MistralConfig has it.
void llama_read(const HfJson& j, const std::string& architecture, GPTConfig& c) {
  check_window(j, c, architecture == "MistralForCausalLM" ? 4096 : 0);
  bool attn_bias = false, mlp_bias = false;
  j.get("attention_bias", attn_bias);
  j.get("mlp_bias", mlp_bias);
  if (attn_bias != mlp_bias)
    j.refuse(std::string("attention_bias ") + (attn_bias ? "true" : "false") + " with mlp_bias " + (mlp_bias ? "true" : "false") +
             ": tapelm's bias puts biases on every projection or none (Qwen2's q/k/v biases are qkv_bias)");
  c.bias = attn_bias;
}
void llama_write(const GPTConfig& c, nlohmann::ordered_json& j) {
  j["attention_bias"] = c.bias;
  j["mlp_bias"] = c.bias;
  j["pretraining_tp"] = 1;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
}

// Qwen2 uses its window only when use_sliding_window is true.
void qwen2_read(const HfJson& j, const std::string&, GPTConfig& c) {
  bool sliding = false;
  j.get("use_sliding_window", sliding);
  if (sliding) check_window(j, c, 0);
}
void qwen2_write(const GPTConfig& c, nlohmann::ordered_json& j) {
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["max_window_layers"] = c.n_layer;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
}

// GPT-2: its attention-score options other than the default change the function.
void gpt2_read(const HfJson& j, const std::string&, GPTConfig&) {
  bool scale = true, by_layer = false, cross = false;
  j.get("scale_attn_weights", scale);
  j.get("scale_attn_by_inverse_layer_idx", by_layer);
  j.get("add_cross_attention", cross);
  if (!scale) j.refuse("scale_attn_weights false: tapelm scales scores by 1/sqrt(head dim)");
  if (by_layer) j.refuse("scale_attn_by_inverse_layer_idx true: tapelm scales every layer's scores alike");
  if (cross) j.refuse("add_cross_attention true: tapelm's blocks have no cross-attention");
}
void gpt2_write(const GPTConfig&, nlohmann::ordered_json& j) {
  for (const char* k : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) j[k] = 0.0;
  j["scale_attn_weights"] = true;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
  j["initializer_range"] = 0.02;
}

// Phi-3: its window is a key (null in the models without one); LongRoPE (rope_scaling) and a
// partial rotary factor are refused by the reader of every RoPE family.
void phi3_read(const HfJson& j, const std::string&, GPTConfig& c) { check_window(j, c, 0); }
void phi3_write(const GPTConfig& c, nlohmann::ordered_json& j) {
  j["original_max_position_embeddings"] = c.block_size;
  j["sliding_window"] = nullptr;
  j["attention_dropout"] = 0.0;
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["initializer_range"] = 0.02;
}

// GPT-NeoX: RoPE on rotary_pct of each head with base rotary_emb_base (transformers 4; the
// rope_theta and partial_rotary_factor of transformers 5 are read by every RoPE family's reader),
// the parallel residual as a key, and biases on every projection (attention_bias false would take
// the attention's alone away, which tapelm's bias cannot say).
void gptneox_read(const HfJson& j, const std::string&, GPTConfig& c) {
  c.parallel_residual = true;
  j.get("use_parallel_residual", c.parallel_residual);
  bool bias = true;
  j.get("attention_bias", bias);
  if (!bias) j.refuse("attention_bias false: tapelm's bias puts biases on every projection or none, and GPT-NeoX's MLP has them");
  if (j.has("rotary_emb_base")) j.get("rotary_emb_base", c.rope_theta);
  const bool factor = j.json().contains("partial_rotary_factor") ||
                      (j.has("rope_parameters") && j.json()["rope_parameters"].is_object() && j.json()["rope_parameters"].contains("partial_rotary_factor"));
  if (factor) return;  // read by the RoPE reader
  double pct = 0.25;  // GPTNeoXConfig's default
  j.get("rotary_pct", pct);
  if (c.n_head <= 0 || (c.head_size == 0 && c.n_embd % c.n_head)) return;  // no head width: the config's check names the counts
  // int(head_size * rotary_pct), as transformers sizes it (a fraction out of range is not cast)
  const int64_t rot = pct > 0 && pct <= 1 ? static_cast<int64_t>(static_cast<double>(c.head_dim()) * pct) : 0;
  if (rot <= 0 || rot % 2)
    j.refuse("rotary_pct " + echo_json(nlohmann::json(pct)) + " rotates " + std::to_string(rot) + " of " + std::to_string(c.head_dim()) +
             " dims a head: RoPE needs a positive even count");
  c.rotary_dims = rot == c.head_dim() ? 0 : rot;
}
void gptneox_write(const GPTConfig& c, nlohmann::ordered_json& j) {
  j["rotary_pct"] = static_cast<double>(c.rope_dims()) / static_cast<double>(c.head_dim());
  j["rotary_emb_base"] = c.rope_theta;
  j["use_parallel_residual"] = c.parallel_residual;
  j["attention_bias"] = true;
  j["attention_dropout"] = 0.0;
  j["hidden_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
}

// OPT: pre-LayerNorm blocks with a final norm, biases, the embedding as wide as the model; the
// 350M model's post-norm and projected embedding (word_embed_proj_dim) are another function.
void opt_read(const HfJson& j, const std::string&, GPTConfig& c) {
  bool before = true, affine = true, bias = true, remove_final = false;
  j.get("do_layer_norm_before", before);
  j.get("layer_norm_elementwise_affine", affine);
  j.get("enable_bias", bias);
  j.get("_remove_final_layer_norm", remove_final);
  if (!before) j.refuse("do_layer_norm_before false (OPT-350m's post-norm blocks): tapelm's blocks normalise before attention and MLP");
  if (!affine) j.refuse("layer_norm_elementwise_affine false: tapelm's LayerNorm has a weight and a bias");
  if (!bias) j.refuse("enable_bias false: tapelm reads OPT with biases on every projection and norm");
  if (remove_final) j.refuse("_remove_final_layer_norm true: tapelm's model ends with a norm");
  if (j.has("word_embed_proj_dim")) {
    int64_t w = c.n_embd;
    j.get("word_embed_proj_dim", w);
    if (w != c.n_embd)
      j.refuse("word_embed_proj_dim " + std::to_string(w) + " is not hidden_size " + std::to_string(c.n_embd) +
               " (OPT-350m's project_in/project_out): tapelm's embedding is as wide as the model");
  }
}
void opt_write(const GPTConfig& c, nlohmann::ordered_json& j) {
  j["word_embed_proj_dim"] = c.n_embd;
  j["do_layer_norm_before"] = true;
  j["enable_bias"] = true;
  j["layer_norm_elementwise_affine"] = true;
  for (const char* k : {"dropout", "attention_dropout", "activation_dropout", "layerdrop"}) j[k] = 0.0;
  j["init_std"] = 0.02;
}

// Qwen3: Qwen2's window keys; attention_bias puts biases on q, k, v and o but not the MLP, which
// tapelm's bias cannot say.
void qwen3_read(const HfJson& j, const std::string& arch, GPTConfig& c) {
  qwen2_read(j, arch, c);
  bool bias = false;
  j.get("attention_bias", bias);
  if (bias) j.refuse("attention_bias true: biases on q, k, v and o alone, which tapelm's bias and qkv_bias cannot say");
}
void qwen3_write(const GPTConfig& c, nlohmann::ordered_json& j) {
  qwen2_write(c, j);
  j["attention_bias"] = false;
}

// OLMo-2: no biases (attention_bias true would put them on q, k, v and o alone).
void olmo2_read(const HfJson& j, const std::string&, GPTConfig&) {
  bool bias = false;
  j.get("attention_bias", bias);
  if (bias) j.refuse("attention_bias true: biases on q, k, v and o alone, which tapelm's bias and qkv_bias cannot say");
}
void olmo2_write(const GPTConfig&, nlohmann::ordered_json& j) {
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
}

// Gemma: its MLP's activation is hidden_activation (hidden_act, "gelu" in Gemma-7B's file, is not
// what transformers runs: without hidden_activation it takes gelu_pytorch_tanh); no biases.
void gemma_read(const HfJson& j, const std::string&, GPTConfig& c) {
  std::string act = "gelu_pytorch_tanh";
  if (j.has("hidden_activation")) j.get("hidden_activation", act);
  if (act != "gelu_pytorch_tanh" && act != "gelu_tanh")
    j.refuse("hidden_activation \"" + cut_for_message(act) + "\": tapelm reads GemmaForCausalLM with gelu_pytorch_tanh");
  bool bias = false;
  j.get("attention_bias", bias);
  if (bias) j.refuse("attention_bias true: biases on q, k, v and o alone, which tapelm's bias and qkv_bias cannot say");
  std::string dtype = "float32";
  if (j.has("torch_dtype")) j.get("torch_dtype", dtype);
  else if (j.has("dtype")) j.get("dtype", dtype);  // transformers 5's spelling
  c.embed_scale = sqrt_d_as(c.n_embd, dtype);
}
void gemma_write(const GPTConfig&, nlohmann::ordered_json& j) {
  j["hidden_activation"] = "gelu_pytorch_tanh";
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
}

// Llama's config.json keys, which Mistral and Qwen2 share.
HfConfigKeys llama_keys(const char* model_type, decltype(HfConfigKeys::read) read, decltype(HfConfigKeys::write) write) {
  return {.model_type = model_type,
          .vocab = {"vocab_size"},
          .hidden = {"hidden_size"},
          .layers = {"num_hidden_layers"},
          .heads = {"num_attention_heads"},
          .ffn = {"intermediate_size"},
          .positions = {"max_position_embeddings", 2048},
          .kv_heads = "num_key_value_heads",
          .head_dim = "head_dim",
          .eps = "rms_norm_eps",
          .eps_fallback = 1e-6,
          .act = "hidden_act",
          .acts = {{"silu", MlpKind::SwiGLU}},
          .read = read,
          .write = write};
}

// Phi-3's: Llama's, with Phi3Config's defaults for the epsilon and the positions.
HfConfigKeys phi3_keys() {
  HfConfigKeys k = llama_keys("phi3", phi3_read, phi3_write);
  k.positions = {"max_position_embeddings", 4096};
  k.eps_fallback = 1e-5;
  return k;
}

// Qwen3's: Llama's, with Qwen3Config's defaults (ε 1e-6, 32768 positions, head_dim 128).
HfConfigKeys qwen3_keys() {
  HfConfigKeys k = llama_keys("qwen3", qwen3_read, qwen3_write);
  k.positions = {"max_position_embeddings", 32768};
  k.head_dim_fallback = 128;
  return k;
}

// OLMo-2's: Llama's without head_dim (Olmo2Config has none), ε 1e-5 by default.
HfConfigKeys olmo2_keys() {
  HfConfigKeys k = llama_keys("olmo2", olmo2_read, olmo2_write);
  k.head_dim = "";
  k.eps_fallback = 1e-5;
  return k;
}

// Gemma's: Llama's, with GemmaConfig's defaults (Gemma-7B's: head_dim 256, 8192 positions, ε 1e-6,
// tied) and its activation read by gemma_read (hidden_act is not what runs).
HfConfigKeys gemma_keys() {
  HfConfigKeys k = llama_keys("gemma", gemma_read, gemma_write);
  k.positions = {"max_position_embeddings", 8192};
  k.head_dim_fallback = 256;
  k.act = "hidden_act";
  k.acts = {{"gelu_pytorch_tanh", MlpKind::GeGLU}, {"gelu", MlpKind::GeGLU}, {"gelu_tanh", MlpKind::GeGLU}};
  k.tie_fallback = true;
  return k;
}

const std::vector<FamilyInfo>& rows() {
  static const std::vector<FamilyInfo> table{
      {.family = Family::llama,
       .name = "llama",
       .hf_architecture = "LlamaForCausalLM",
       .hf_aliases = {{"MistralForCausalLM", "mistral"}},  // Llama's function with a sliding window by default
       .norm = NormKind::RMSNorm,
       .pos = PosKind::Rope,
       .swiglu = true,
       .gguf_interleaves_rope = true,
       .hf = llama_keys("llama", llama_read, llama_write),
       // llama.cpp's deci (Llama-3.1-Nemotron's variable layers) is its llama graph with each
       // layer's own head counts; its llama sizes every layer's K and V by one count
       .gguf = {.eps = "attention.layer_norm_rms_epsilon", .rope = true, .per_layer_kv_arch = "deci", .optional_bias = true}},
      {.family = Family::qwen2,
       .name = "qwen2",
       .hf_architecture = "Qwen2ForCausalLM",
       .norm = NormKind::RMSNorm,
       .pos = PosKind::Rope,
       .swiglu = true,
       .qkv_bias_only = true,
       .hf = llama_keys("qwen2", qwen2_read, qwen2_write),
       .gguf = {.eps = "attention.layer_norm_rms_epsilon", .rope = true}},
      {.family = Family::gpt2,
       .name = "gpt2",
       .hf_architecture = "GPT2LMHeadModel",
       .norm = NormKind::LayerNorm,
       .pos = PosKind::Learned,
       .all_biases = true,
       .fused_qkv = true,
       .hf_conv1d = true,
       .names = {{Format::hf, Role::tok_embd, "{P}wte"},
                 {Format::hf, Role::pos_embd, "{P}wpe"},
                 {Format::hf, Role::attn_norm, "{P}h.{L}.ln_1"},
                 {Format::hf, Role::attn_qkv, "{P}h.{L}.attn.c_attn"},
                 {Format::hf, Role::attn_out, "{P}h.{L}.attn.c_proj"},
                 {Format::hf, Role::ffn_norm, "{P}h.{L}.ln_2"},
                 {Format::hf, Role::ffn_up, "{P}h.{L}.mlp.c_fc"},
                 {Format::hf, Role::ffn_down, "{P}h.{L}.mlp.c_proj"},
                 {Format::hf, Role::output_norm, "{P}ln_f"}},
       // GPT2Config's defaults: the 124M model
       .hf = {.model_type = "gpt2",
              .vocab = {"vocab_size", 50257},
              .hidden = {"n_embd", 768},
              .layers = {"n_layer", 12},
              .heads = {"n_head", 12},
              .ffn = {"n_inner", 0},
              .positions = {"n_positions", 1024},
              .eps = "layer_norm_epsilon",
              .eps_fallback = 1e-5,
              .act = "activation_function",
              .acts = {{"gelu_new", MlpKind::GeluTanh}, {"gelu_pytorch_tanh", MlpKind::GeluTanh}, {"gelu", MlpKind::Gelu}},
              .tie_fallback = true,
              .prefix = "transformer.",
              .read = gpt2_read,
              .write = gpt2_write},
       .gguf = {.eps = "attention.layer_norm_epsilon"}},
      // Phi-3 (mini is MHA): Llama's function with q|k|v and gate|up fused, rotated half-split in
      // GGUF too (llama.cpp's NEOX RoPE)
      {.family = Family::phi3,
       .name = "phi3",
       .hf_architecture = "Phi3ForCausalLM",
       .norm = NormKind::RMSNorm,
       .pos = PosKind::Rope,
       .swiglu = true,
       .unbiased = true,
       .fused_qkv = true,
       .fused_gate_up = true,
       .names = {{Format::hf, Role::attn_qkv, "model.layers.{L}.self_attn.qkv_proj"},
                 {Format::hf, Role::ffn_gate_up, "model.layers.{L}.mlp.gate_up_proj"},
                 {Format::gguf, Role::ffn_gate_up, "blk.{L}.ffn_up"}},
       .hf = phi3_keys(),
       .gguf = {.eps = "attention.layer_norm_rms_epsilon", .rope = true, .no_window_key = true}},
      // Qwen3: Llama's function with q and k RMS-normalised per head before RoPE (one weight of hd
      // values each), a head width of its own (head_dim), no biases; NEOX RoPE in GGUF
      {.family = Family::qwen3,
       .name = "qwen3",
       .hf_architecture = "Qwen3ForCausalLM",
       .norm = NormKind::RMSNorm,
       .pos = PosKind::Rope,
       .swiglu = true,
       .unbiased = true,
       .qk_norm = QkNorm::head,
       .hf = qwen3_keys(),
       .gguf = {.eps = "attention.layer_norm_rms_epsilon", .rope = true}},
      // OLMo-2: Llama's function but for its norms — on the attention's and the MLP's outputs,
      // before each residual add, none on their inputs — and q, k RMS-normalised over the whole
      // projection before RoPE; NEOX RoPE in GGUF
      {.family = Family::olmo2,
       .name = "olmo2",
       .hf_architecture = "Olmo2ForCausalLM",
       .norm = NormKind::RMSNorm,
       .pos = PosKind::Rope,
       .swiglu = true,
       .unbiased = true,
       .qk_norm = QkNorm::all,
       .norm_position = NormPosition::post,
       .names = {{Format::hf, Role::attn_norm, "model.layers.{L}.post_attention_layernorm"},
                 {Format::hf, Role::ffn_norm, "model.layers.{L}.post_feedforward_layernorm"},
                 {Format::gguf, Role::attn_norm, "blk.{L}.post_attention_norm"},
                 {Format::gguf, Role::ffn_norm, "blk.{L}.post_ffw_norm"}},
       .hf = olmo2_keys(),
       .gguf = {.eps = "attention.layer_norm_rms_epsilon", .rope = true}},
      // Gemma (7B is MHA): RMSNorm scaled by (1 + w), embeddings times √d, GeGLU with the tanh GELU,
      // heads of their own width (256 under d 3072), tied; NEOX RoPE and norms stored as 1 + w in GGUF
      {.family = Family::gemma,
       .name = "gemma",
       .hf_architecture = "GemmaForCausalLM",
       .norm = NormKind::RMSNorm1p,
       .pos = PosKind::Rope,
       .geglu = true,
       .embed_scale = true,
       .unbiased = true,
       .hf = gemma_keys(),
       .gguf = {.eps = "attention.layer_norm_rms_epsilon", .rope = true, .gelu = MlpKind::GeGLU, .norm_plus_one = true}},
      // GPT-NeoX (Pythia): LayerNorm, RoPE on part of each head (half-split, as tapelm and llama.cpp's
      // NEOX rotate), biases everywhere, exact GELU, attention and MLP optionally side by side; HF
      // interleaves q|k|v head by head, llama.cpp's gptneox stacks them (convert_hf_to_gguf reorders)
      {.family = Family::gptneox,
       .name = "gptneox",
       .hf_architecture = "GPTNeoXForCausalLM",
       .norm = NormKind::LayerNorm,
       .pos = PosKind::Rope,
       .all_biases = true,
       .fused_qkv = true,
       .hf_qkv_per_head = true,
       .parallel_residual = true,
       .partial_rotary = true,
       .names = {{Format::hf, Role::tok_embd, "{P}embed_in"},
                 {Format::hf, Role::attn_norm, "{P}layers.{L}.input_layernorm"},
                 {Format::hf, Role::attn_qkv, "{P}layers.{L}.attention.query_key_value"},
                 {Format::hf, Role::attn_out, "{P}layers.{L}.attention.dense"},
                 {Format::hf, Role::ffn_norm, "{P}layers.{L}.post_attention_layernorm"},
                 {Format::hf, Role::ffn_up, "{P}layers.{L}.mlp.dense_h_to_4h"},
                 {Format::hf, Role::ffn_down, "{P}layers.{L}.mlp.dense_4h_to_h"},
                 {Format::hf, Role::output_norm, "{P}final_layer_norm"},
                 {Format::hf, Role::output, "embed_out"}},
       // GPTNeoXConfig's defaults: the 20B model
       .hf = {.model_type = "gpt_neox",
              .vocab = {"vocab_size", 50432},
              .hidden = {"hidden_size", 6144},
              .layers = {"num_hidden_layers", 44},
              .heads = {"num_attention_heads", 64},
              .ffn = {"intermediate_size", 24576},
              .positions = {"max_position_embeddings", 2048},
              .eps = "layer_norm_eps",
              .eps_fallback = 1e-5,
              .act = "hidden_act",
              .acts = {{"gelu", MlpKind::Gelu}, {"gelu_new", MlpKind::GeluTanh}, {"gelu_pytorch_tanh", MlpKind::GeluTanh}},
              .prefix = "gpt_neox.",
              .read = gptneox_read,
              .write = gptneox_write},
       // llama.cpp computes GELU by its tanh form for every gptneox model; Pythia was trained with
       // the exact one, which is what tapelm reads and writes (tests/formats/test_gguf.cpp measures the gap)
       .gguf = {.eps = "attention.layer_norm_epsilon", .rope = true, .gelu = MlpKind::Gelu}},
      // OPT: GPT-2's structure with ReLU, q/k/v/out projections apart, and a position table whose
      // first two rows come before position 0 (OPTLearnedPositionalEmbedding's offset)
      {.family = Family::opt,
       .name = "opt",
       .hf_architecture = "OPTForCausalLM",
       .norm = NormKind::LayerNorm,
       .pos = PosKind::Learned,
       .relu = true,
       .all_biases = true,
       .hf_position_offset = 2,
       .names = {{Format::hf, Role::tok_embd, "{P}decoder.embed_tokens"},
                 {Format::hf, Role::pos_embd, "{P}decoder.embed_positions"},
                 {Format::hf, Role::attn_norm, "{P}decoder.layers.{L}.self_attn_layer_norm"},
                 {Format::hf, Role::attn_q, "{P}decoder.layers.{L}.self_attn.q_proj"},
                 {Format::hf, Role::attn_k, "{P}decoder.layers.{L}.self_attn.k_proj"},
                 {Format::hf, Role::attn_v, "{P}decoder.layers.{L}.self_attn.v_proj"},
                 {Format::hf, Role::attn_out, "{P}decoder.layers.{L}.self_attn.out_proj"},
                 {Format::hf, Role::ffn_norm, "{P}decoder.layers.{L}.final_layer_norm"},
                 {Format::hf, Role::ffn_up, "{P}decoder.layers.{L}.fc1"},
                 {Format::hf, Role::ffn_down, "{P}decoder.layers.{L}.fc2"},
                 {Format::hf, Role::output_norm, "{P}decoder.final_layer_norm"}},
       // OPTConfig's defaults: the 125M model; its LayerNorms are PyTorch's, ε 1e-5, no key
       .hf = {.model_type = "opt",
              .vocab = {"vocab_size", 50272},
              .hidden = {"hidden_size", 768},
              .layers = {"num_hidden_layers", 12},
              .heads = {"num_attention_heads", 12},
              .ffn = {"ffn_dim", 3072},
              .positions = {"max_position_embeddings", 2048},
              .eps = "",
              .eps_fallback = 1e-5,
              .act = "activation_function",
              .acts = {{"relu", MlpKind::Relu}},
              .tie_fallback = true,
              .prefix = "model.",
              .read = opt_read,
              .write = opt_write},
       .gguf = {.eps = "", .none = true}},
  };
  return table;
}

}  // namespace

const std::vector<FamilyInfo>& families() { return rows(); }

double sqrt_d_as(int64_t d, const std::string& torch_dtype) {
  const float r = std::sqrt(static_cast<float>(d));
  if (torch_dtype == "bfloat16") return bf16_to_f32(f32_to_bf16(r));
  if (torch_dtype == "float16") return f16_to_f32(f32_to_f16(r));
  return r;
}

bool is_sqrt_d(double scale, int64_t d) {
  for (const char* t : {"float32", "bfloat16", "float16"})
    if (scale == sqrt_d_as(d, t)) return true;
  return false;
}

const FamilyInfo& family_info(Family f) {
  for (const FamilyInfo& x : rows())
    if (x.family == f) return x;
  throw Error(ErrorKind::internal, "families: a family without a row");
}

const FamilyInfo* find_family(const std::string& name) {
  for (const FamilyInfo& x : rows()) {
    if (name == x.name || name == x.hf_architecture || name == x.hf.model_type) return &x;
    for (const auto& [arch, model_type] : x.hf_aliases)
      if (name == arch || name == model_type) return &x;
  }
  return nullptr;
}

namespace {
bool has_structure(const FamilyInfo& x, const GPTConfig& c) {
  return c.norm == x.norm && c.pos == x.pos && (c.mlp == MlpKind::SwiGLU) == x.swiglu && (c.mlp == MlpKind::Relu) == x.relu &&
         (c.mlp == MlpKind::GeGLU) == x.geglu && (c.embed_scale != 0) == x.embed_scale &&
         x.qkv_bias_only == (c.qkv_bias && !c.bias) &&
         (!x.unbiased || (!c.bias && !c.qkv_bias)) && c.qk_norm == x.qk_norm && c.norm_position == x.norm_position &&
         (!c.parallel_residual || x.parallel_residual) &&
         (c.head_size == 0 || c.head_size * c.n_head == c.n_embd || *x.hf.head_dim) &&
         (c.rope_dims() == c.head_dim() || x.partial_rotary);
}
}  // namespace

std::string family_key(Family f, const GPTConfig& c) {
  GPTConfig by_structure = c;
  by_structure.family.clear();
  for (const FamilyInfo& x : rows())
    if (has_structure(x, by_structure)) return x.family == f ? "" : family_info(f).name;
  return family_info(f).name;
}

Family family_of(const GPTConfig& c, const std::string& what) {
  auto refuse = [&](const std::string& why) -> Family { throw Error(ErrorKind::config, what + ": " + why); };
  if (!c.family.empty()) {
    const FamilyInfo* x = find_family(c.family);
    if (!x || c.family != x->name) return refuse("config family \"" + c.family + "\" is no family tapelm writes");
    if (!has_structure(*x, c))
      return refuse("config family \"" + c.family + "\": " + x->name + "'s layout is " + to_string(x->norm) + ", " + (x->swiglu ? "swiglu" : x->geglu ? "geglu" : x->relu ? "relu" : "gelu") +
                    ", " + to_string(x->pos) + (x->qkv_bias_only ? ", biases on q, k and v" : x->all_biases ? ", biases" : ", no biases") +
                    ", which this config's norm, mlp, pos and bias keys are not");
    return x->family;
  }
  for (const FamilyInfo& x : rows())
    if (has_structure(x, c)) return x.family;
  for (const FamilyInfo& x : rows()) {  // none: why, for the family the config is closest to
    GPTConfig plain = c;  // the family but for an option its files have no key for
    plain.parallel_residual = false;
    plain.rotary_dims = 0;
    plain.qk_norm = x.qk_norm;
    plain.norm_position = x.norm_position;
    if (has_structure(x, plain)) {
      if (c.norm_position != x.norm_position)
        refuse("norm_position \"" + to_string(c.norm_position) + "\": " + x.name + "'s layout has \"" + to_string(x.norm_position) +
               "\" (olmo2 normalises the outputs, with q/k norms over the projection)");
      if (c.qk_norm != x.qk_norm)
        refuse("qk_norm \"" + to_string(c.qk_norm) + "\": " + x.name + "'s layout has " + to_string(x.qk_norm) +
               " (qwen3 normalises q and k per head)");
      refuse(c.parallel_residual && !x.parallel_residual
                 ? "parallel_residual: " + std::string(x.name) + "'s layout adds the attention, then the MLP (gptneox has the parallel residual)"
                 : "rotary_dims " + std::to_string(c.rotary_dims) + ": " + x.name + "'s layout rotates the whole head (gptneox rotates part)");
    }
    if (x.all_biases && c.norm == x.norm && c.pos == x.pos && (c.mlp == MlpKind::SwiGLU) == x.swiglu && c.qkv_bias && !c.bias)
      refuse("qkv_bias without bias: " + std::string(x.name) + "'s layout has biases everywhere or (written as zeros) nowhere");
  }
  std::string known;
  for (const FamilyInfo& x : rows()) {
    if (x.qkv_bias_only) continue;  // named by the family it varies
    known += std::string(known.empty() ? "" : "; ") + x.name + ": " + to_string(x.norm) + ", " + (x.swiglu ? "swiglu" : x.geglu ? "geglu" : x.relu ? "relu" : "gelu") + ", " +
             to_string(x.pos) + (x.qk_norm != QkNorm::none ? ", qk_norm " + to_string(x.qk_norm) : "") +
             (x.norm_position != NormPosition::pre ? ", norm_position " + to_string(x.norm_position) : "");
  }
  return refuse("norm \"" + to_string(c.norm) + "\", mlp \"" + to_string(c.mlp) + "\", pos \"" + to_string(c.pos) +
                "\" match no architecture other programs run (" + known + ")");
}

void apply_family(Family f, GPTConfig& c) {
  const FamilyInfo& x = family_info(f);
  c.norm = x.norm;
  c.pos = x.pos;
  if (x.swiglu) c.mlp = MlpKind::SwiGLU;
  else if (x.geglu) c.mlp = MlpKind::GeGLU;
  else if (x.relu) c.mlp = MlpKind::Relu;
  else if (c.gated() || c.mlp == MlpKind::Relu) c.mlp = MlpKind::GeluTanh;
  c.embed_scale = x.embed_scale ? sqrt_d_as(c.n_embd, "float32") : 0;
  if (x.all_biases) c.bias = true, c.qkv_bias = false;
  if (x.qkv_bias_only) c.bias = false, c.qkv_bias = true;
  if (x.unbiased) c.bias = false, c.qkv_bias = false;
  c.qk_norm = x.qk_norm;
  c.norm_position = x.norm_position;
  c.family = family_key(f, c);
}

}  // namespace tapelm::formats
