// tapelm: the command line, a thin layer of flag parsing over the library.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "autograd/blas.h"
#include "autograd/gradcheck.h"
#include "autograd/ops.h"

using namespace tapelm;

namespace {

// A tiny forward/backward through every kind of op a transformer layer uses, with a gradient check.
int run_demo(int threads) {
  set_num_threads(threads);
  const int64_t B = 2, T = 8, C = 16, V = 11;
  Var wte(randn({V, C}, 1, 0.5f), true), w1(randn({4 * C, C}, 2, 0.2f), true), w2(randn({C, 4 * C}, 3, 0.2f), true);
  Var g(Tensor::full({C}, 1.f), true), head(randn({V, C}, 4, 0.2f), true);
  Index idx, tgt;
  idx.shape = tgt.shape = {B, T};
  for (int64_t i = 0; i < B * T; i++) {
    idx.data.push_back(static_cast<int32_t>((i * 7) % V));
    tgt.data.push_back(static_cast<int32_t>((i * 7 + 3) % V));
  }
  auto forward = [&](const std::vector<Var>& p) {
    Var x = embedding(p[0], idx);
    x = x + linear(gelu(linear(layernorm(x, p[3]), p[1])), p[2]);
    return cross_entropy(linear(layernorm(x, p[3]), p[4]), tgt);
  };
  std::vector<Var> params{wte, w1, w2, g, head};
  Var loss = forward(params);
  std::printf("demo: loss %.6f (ln V = %.6f), tape of %zu ops\n", loss.item(), std::log(double(V)),
              Tape::get().size());
  backward(loss);
  double gn = 0;
  for (Var& p : params)
    for (int64_t i = 0; i < p.numel(); i++) gn += double(p.grad()[i]) * p.grad()[i];
  std::printf("demo: gradient norm %.6f over %zu parameters\n", std::sqrt(gn), params.size());
  GradCheckResult r = gradcheck(forward, {wte.val(), w1.val(), w2.val(), g.val(), head.val()});
  std::printf("demo: finite-difference check %s (worst ratio %.3f)\n", r.ok ? "passed" : "FAILED", r.worst_ratio);
  return r.ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tapelm: train small GPT language models with MHA, GQA or MQA attention"};
  app.require_subcommand(1);
  int threads = 0;
  app.add_option("--threads", threads, "threads for kernels and BLAS (0: all cores)");
  auto* demo = app.add_subcommand("demo", "a tiny forward/backward with a gradient check");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*demo) return run_demo(threads);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tapelm: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
