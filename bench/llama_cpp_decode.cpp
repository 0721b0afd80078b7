// Times llama.cpp's own decoding, without a wrapper in between: loads a GGUF file through
// libllama (the prebuilt CPU build npm's @node-llama-cpp/linux-x64 ships), prefills C - STEPS
// tokens of each of BATCH sequences in batches of 512, then calls llama_decode STEPS times with
// one token per sequence (BATCH tokens, one sequence id each, as a server decodes several users),
// REPS times on a cleared KV cache. KV is the cache's type: f16 (llama.cpp's default), q8_0, or f32 (the
// bytes tapelm's cache holds). Prints one JSON line: the median, minimum and maximum ms per step
// and the median prefill ms. Built and run by bench/llama_cpp_decode.sh against llama.cpp's own
// llama.h (from the source bundle node-llama-cpp ships).
//
//   llama_cpp_decode BACKEND_DIR MODEL.gguf CONTEXT STEPS REPS THREADS [BATCH (1)] [KV (f16)]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"

static void quiet(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

int main(int argc, char** argv) {
  if (argc < 7 || argc > 9) {
    std::fprintf(stderr, "usage: llama_cpp_decode BACKEND_DIR MODEL.gguf CONTEXT STEPS REPS THREADS [BATCH] [f16|f32]\n");
    return 2;
  }
  const int C = std::atoi(argv[3]), S = std::atoi(argv[4]), R = std::atoi(argv[5]), threads = std::atoi(argv[6]);
  const int B = argc > 7 ? std::atoi(argv[7]) : 1;  // at most 512: one step is one batch of B tokens
  const char* kv = argc > 8 ? argv[8] : "f16";
  if (C <= S || S < 1 || R < 1 || threads < 1 || B < 1 || B > 512 || (std::strcmp(kv, "f16") != 0 && std::strcmp(kv, "f32") != 0 && std::strcmp(kv, "q8_0") != 0)) {
    std::fprintf(stderr, "llama_cpp_decode: bad arguments\n");
    return 2;
  }
  llama_log_set(quiet, nullptr);
  ggml_backend_load_all_from_path(argv[1]);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.progress_callback = [](float, void*) { return true; };  // no progress dots
  llama_model* model = llama_model_load_from_file(argv[2], mp);
  if (!model) {
    std::fprintf(stderr, "cannot load %s\n", argv[2]);
    return 1;
  }
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(C) * B;  // C positions for each sequence
  cp.n_seq_max = B;
  cp.n_batch = 512;
  cp.n_ubatch = 512;
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  if (std::strcmp(kv, "f32") == 0) cp.type_k = cp.type_v = GGML_TYPE_F32;
  if (std::strcmp(kv, "q8_0") == 0) cp.type_k = cp.type_v = GGML_TYPE_Q8_0;  // a quantized V needs flash attention (auto)
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    std::fprintf(stderr, "cannot make a context of %d x %d\n", B, C);
    return 1;
  }
  const int V = llama_vocab_n_tokens(llama_model_get_vocab(model));
  const int P = C - S;
  std::vector<std::vector<llama_token>> prompts(B, std::vector<llama_token>(P));
  unsigned seed = 12345;
  for (auto& p : prompts)
    for (auto& t : p) t = static_cast<llama_token>(3 + (seed = seed * 1103515245u + 12345u) % (V - 3));
  llama_batch batch = llama_batch_init(512, 0, 1);
  auto add = [&](llama_token t, int pos, int seq, bool logits) {
    const int i = batch.n_tokens++;
    batch.token[i] = t;
    batch.pos[i] = pos;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = seq;
    batch.logits[i] = logits;
  };
  std::vector<double> steps, prefills;
  using clock = std::chrono::steady_clock;
  for (int r = 0; r < R; r++) {
    llama_memory_clear(llama_get_memory(ctx), true);
    const auto t0 = clock::now();
    for (int b = 0; b < B; b++)
      for (int i = 0; i < P; i += 512) {
        batch.n_tokens = 0;
        const int n = std::min(512, P - i);
        for (int j = 0; j < n; j++) add(prompts[b][i + j], i + j, b, i + j == P - 1);
        if (llama_decode(ctx, batch) != 0) return std::fprintf(stderr, "prefill failed\n"), 1;
      }
    const auto t1 = clock::now();
    std::vector<llama_token> tok(B);
    for (int b = 0; b < B; b++) tok[b] = prompts[b].back();
    for (int s = 0; s < S; s++) {
      batch.n_tokens = 0;
      for (int b = 0; b < B; b++) add(tok[b], P + s, b, true);
      if (llama_decode(ctx, batch) != 0) return std::fprintf(stderr, "decode failed\n"), 1;
      for (int b = 0; b < B; b++) {  // greedy, as a generation would
        const float* logits = llama_get_logits_ith(ctx, b);
        tok[b] = static_cast<llama_token>(std::max_element(logits, logits + V) - logits);
      }
    }
    const auto t2 = clock::now();
    prefills.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    steps.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count() / S);
  }
  std::sort(steps.begin(), steps.end());
  std::sort(prefills.begin(), prefills.end());
  std::printf("{\"impl\": \"llama.cpp\", \"batch\": %d, \"kv_cache\": \"%s\", \"context\": %d, \"prompt\": %d, \"steps\": %d, "
              "\"threads\": %d, \"step_ms\": %.4f, \"step_ms_min\": %.4f, \"step_ms_max\": %.4f, \"prefill_ms\": %.2f}\n",
              B, kv, C, P, S, threads, steps[steps.size() / 2], steps.front(), steps.back(), prefills[prefills.size() / 2]);
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
