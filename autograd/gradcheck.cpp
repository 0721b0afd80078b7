#include "autograd/gradcheck.h"

#include <cmath>
#include <random>
#include <sstream>

namespace tapelm {

Tensor randn(const Shape& shape, uint64_t seed, float std) {
  Tensor t = Tensor::empty(shape);
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, std);
  for (int64_t i = 0; i < t.numel(); i++) t[i] = d(g);
  return t;
}

Tensor rand_uniform(const Shape& shape, uint64_t seed, float lo, float hi) {
  Tensor t = Tensor::empty(shape);
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < t.numel(); i++) t[i] = d(g);
  return t;
}

GradCheckResult gradcheck(const std::function<Var(const std::vector<Var>&)>& f, const std::vector<Tensor>& inputs,
                          const GradCheckOptions& opt) {
  std::vector<Var> xs;
  for (const Tensor& t : inputs) xs.emplace_back(t.clone(), true);
  return gradcheck_vars([&] { return f(xs); }, xs, opt);
}

GradCheckResult gradcheck_vars(const std::function<Var()>& f, const std::vector<Var>& xs, const GradCheckOptions& opt) {
  for (const Var& x : xs) x.drop_grad();
  clear_tape();
  Var y = f();
  Tensor w = randn(y.shape(), opt.seed);
  backward(y, w);

  auto objective = [&]() {
    NoGrad ng;
    Var out = f();
    double s = 0;
    for (int64_t i = 0; i < out.numel(); i++) s += double(w[i]) * out.val()[i];
    return s;
  };

  GradCheckResult r;
  for (size_t k = 0; k < xs.size(); k++) {
    Tensor analytic = xs[k].has_grad() ? xs[k].grad().clone() : Tensor::zeros(xs[k].shape());
    float* x = xs[k].val().data();
    for (int64_t j = 0; j < xs[k].numel(); j++) {
      const float orig = x[j];
      // The steps actually taken after rounding to float, not the nominal eps.
      const float xp = static_cast<float>(orig + opt.eps), xm = static_cast<float>(orig - opt.eps);
      x[j] = xp;
      const double fp = objective();
      x[j] = xm;
      const double fm = objective();
      x[j] = orig;
      const double numeric = (fp - fm) / (double(xp) - double(xm));
      const double err = std::fabs(analytic[j] - numeric);
      const double ratio = err / (opt.atol + opt.rtol * std::fabs(numeric));
      if (ratio > r.worst_ratio) {
        r.worst_ratio = ratio;
        std::ostringstream o;
        o << "input " << k << " " << shape_str(xs[k].shape()) << " element " << j << ": backprop " << analytic[j]
          << " numeric " << numeric;
        r.detail = o.str();
      }
    }
  }
  r.ok = r.worst_ratio <= 1.0;
  return r;
}

}  // namespace tapelm
