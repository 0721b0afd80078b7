// Times llama.cpp's own decoding, without a wrapper in between: loads a GGUF file through
// libllama (the prebuilt CPU build npm's @node-llama-cpp/linux-x64 ships), prefills C - STEPS
// tokens in batches of 512, then calls llama_decode STEPS times with one token each (batch 1),
// REPS times on a cleared KV cache. Prints one JSON line: the median, minimum and maximum ms per
// step and the median prefill ms. Built and run by bench/llama_cpp_decode.sh against llama.cpp's
// own llama.h (from the source bundle node-llama-cpp ships).
//
//   llama_cpp_decode BACKEND_DIR MODEL.gguf CONTEXT STEPS REPS THREADS
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"

static void quiet(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: llama_cpp_decode BACKEND_DIR MODEL.gguf CONTEXT STEPS REPS THREADS\n");
    return 2;
  }
  const int C = std::atoi(argv[3]), S = std::atoi(argv[4]), R = std::atoi(argv[5]), threads = std::atoi(argv[6]);
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
  cp.n_ctx = C;
  cp.n_batch = 512;
  cp.n_ubatch = 512;
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    std::fprintf(stderr, "cannot make a context of %d\n", C);
    return 1;
  }
  const int V = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::vector<llama_token> prompt(C - S);
  unsigned seed = 12345;
  for (auto& t : prompt) t = static_cast<llama_token>(3 + (seed = seed * 1103515245u + 12345u) % (V - 3));
  std::vector<double> steps, prefills;
  using clock = std::chrono::steady_clock;
  for (int r = 0; r < R; r++) {
    llama_memory_clear(llama_get_memory(ctx), true);
    const auto t0 = clock::now();
    for (size_t i = 0; i < prompt.size(); i += 512) {
      const int n = static_cast<int>(std::min<size_t>(512, prompt.size() - i));
      if (llama_decode(ctx, llama_batch_get_one(&prompt[i], n)) != 0) return std::fprintf(stderr, "prefill failed\n"), 1;
    }
    const auto t1 = clock::now();
    llama_token tok = prompt.back();
    for (int s = 0; s < S; s++) {
      if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) return std::fprintf(stderr, "decode failed\n"), 1;
      const float* logits = llama_get_logits_ith(ctx, -1);
      tok = static_cast<llama_token>(std::max_element(logits, logits + V) - logits);  // greedy, as a generation would
    }
    const auto t2 = clock::now();
    prefills.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    steps.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count() / S);
  }
  std::sort(steps.begin(), steps.end());
  std::sort(prefills.begin(), prefills.end());
  std::printf("{\"impl\": \"llama.cpp\", \"context\": %d, \"prompt\": %d, \"steps\": %d, \"threads\": %d, \"step_ms\": %.4f, "
              "\"step_ms_min\": %.4f, \"step_ms_max\": %.4f, \"prefill_ms\": %.2f}\n",
              C, C - S, S, threads, steps[steps.size() / 2], steps.front(), steps.back(), prefills[prefills.size() / 2]);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
