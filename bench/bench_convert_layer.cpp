// Converting one layer at a real model's width: a one-layer model of Llama-2-7B's layer shape
// (d 4096, 32 heads of 128, SwiGLU hidden 11008) converted to 8 KV heads by a calibrated method
// (default aligned-fit), given its calibration inputs (16,384 tokens of the layer's attention
// input). Timed apart:
//   sigma     forming Σ = mean of x̃ x̃ᵀ over the tokens (x̃ = [x; 1]), as calibrate() accumulates it:
//             2 · N · d² ≈ 0.55 TFLOP at 7B's shape, in float32 products summed in double
//   convert   the conversion itself (alignment's Procrustes per head and group, the fit's solves)
//   forward   (--forward) the calibration forward pass that produces those inputs in a real
//             conversion: the layer's forward on the tokens, 2 · N · (layer parameters) + the
//             attention's 4 · N · T · d, bounded by the machine's peak rather than by the method
// and the peak resident set of the process. The calibration inputs are random (the timing depends on
// the shapes, not the values); the weights are the model's random init.
//
//   bench_convert_layer [--d 4096] [--heads 32] [--kv 8] [--hidden 11008] [--tokens 16384]
//                       [--method aligned-fit] [--threads N] [--forward] [--window 512]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "autograd/runtime.h"
#include "nn/accounting.h"
#include "nn/gpt.h"
#include "train/study/convert/calibrate.h"
#include "train/study/convert/convert.h"

using namespace tapelm;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double peak_rss_gb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / (1024.0 * 1024.0);  // ru_maxrss is in KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
  int64_t d = 4096, heads = 32, kv = 8, hidden = 11008, tokens = 16384, window = 512;
  int threads = 0;
  bool forward = false;
  std::string method_name = "aligned-fit";
  for (int i = 1; i < argc; i++) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_convert_layer: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--d") d = std::atoll(next().c_str());
    else if (k == "--heads") heads = std::atoll(next().c_str());
    else if (k == "--kv") kv = std::atoll(next().c_str());
    else if (k == "--hidden") hidden = std::atoll(next().c_str());
    else if (k == "--tokens") tokens = std::atoll(next().c_str());
    else if (k == "--window") window = std::atoll(next().c_str());
    else if (k == "--method") method_name = next();
    else if (k == "--threads") threads = std::atoi(next().c_str());
    else if (k == "--forward") forward = true;
    else {
      std::fprintf(stderr, "usage: bench_convert_layer [--d 4096] [--heads 32] [--kv 8] [--hidden 11008] [--tokens 16384] "
                           "[--method aligned-fit] [--threads N] [--forward] [--window 512]\n");
      return 2;
    }
  }
  try {
    set_num_threads(threads);
    GPTConfig c;
    c.vocab_size = 256;
    c.block_size = window;
    c.n_layer = 1;
    c.n_head = heads;
    c.n_kv_head = heads;
    c.n_embd = d;
    c.mlp_hidden = hidden;
    c.norm = NormKind::RMSNorm;
    c.mlp = MlpKind::SwiGLU;
    c.pos = PosKind::Rope;
    c.tie_embeddings = false;
    c.validate();
    const Variant v{&method(method_name)};
    std::printf("one layer: d %ld, %ld heads of %ld, hidden %ld -> %ld KV heads by %s; %ld calibration tokens; %d threads\n",
                (long)d, (long)heads, (long)(d / heads), (long)hidden, (long)kv, method_name.c_str(), (long)tokens, get_num_threads());
    double t = now_s();
    GPT model(c, 1);
    model.eval();
    std::printf("model built in %.1f s (%.2f GB of float32 weights)\n", now_s() - t, 4.0 * model.num_parameters() / 1e9);

    if (forward) {
      // the calibration forward pass: windows of `window` tokens, as calibration_batches draws them
      std::mt19937_64 rng(7);
      std::vector<int32_t> ids(static_cast<size_t>(tokens));
      for (auto& id : ids) id = static_cast<int32_t>(rng() % 256);
      const std::vector<Index> batches = calibration_batches(TokenSeq(ids), window, tokens - window, 1, "bench tokens");
      t = now_s();
      const Calibration cal = calibrate(model, batches);
      const double s = now_s() - t;
      const ModelCost cost = model_cost(c, window);
      const double flops = cost.forward_flops_per_token * static_cast<double>(cal.tokens);
      std::printf("forward   %8.2f s  calibration forward of %ld tokens (windows of %ld): %.2f TFLOP, %.0f GFLOP/s\n", s,
                  (long)cal.tokens, (long)window, flops / 1e12, flops / s / 1e9);
    }

    // calibration inputs: N(0, 1) activations, in the batches calibrate() would see
    const int64_t chunk = 4096;
    std::vector<Tensor> xs;
    std::mt19937_64 rng(11);
    std::normal_distribution<float> nd;
    for (int64_t at = 0; at < tokens; at += chunk) {
      const int64_t n = std::min(chunk, tokens - at);
      Tensor x = Tensor::empty({n, d});
      for (int64_t i = 0; i < x.numel(); i++) x.data()[i] = nd(rng);
      xs.push_back(x);
    }
    t = now_s();
    Calibration cal;
    cal.gram.assign(1, la::Mat(d + 1, d + 1));
    for (const Tensor& x : xs) accumulate_gram(cal.gram[0], x);
    cal.tokens = tokens;
    finish_gram(cal.gram[0], tokens);
    const double sigma_s = now_s() - t;
    const double sigma_flops = 2.0 * static_cast<double>(tokens) * static_cast<double>(d) * static_cast<double>(d);
    std::printf("sigma     %8.2f s  Σ of %ld tokens: %.2f TFLOP, %.0f GFLOP/s\n", sigma_s, (long)tokens, sigma_flops / 1e12,
                sigma_flops / sigma_s / 1e9);
    xs.clear();

    t = now_s();
    const ConvertOptions o{.variant = v, .seed = 1, .calib = &cal};
    const std::unique_ptr<GPT> out = convert_kv_heads(model, kv, o);
    const double conv_s = now_s() - t;
    std::printf("convert   %8.2f s  %s to %ld KV heads\n", conv_s, method_name.c_str(), (long)kv);
    std::printf("total     %8.2f s  per layer (Σ + conversion); peak RSS %.2f GB\n", sigma_s + conv_s, peak_rss_gb());
    std::printf("a %ld-layer model: %.1f minutes of conversion given its calibration inputs\n", 32L, 32 * (sigma_s + conv_s) / 60);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_convert_layer: %s\n", e.what());
    return 1;
  }
}
