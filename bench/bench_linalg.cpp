// The conversion's dense double linear algebra (train/study/convert/linalg.h) on BLAS and LAPACK, against
// the hand-written loops it replaced (kept verbatim below in namespace old), at d 1024 and 4096:
// a Gram matrix XᵀX of 16384 tokens × (d+1) features (the calibration's Σ, x̃ = [x; 1]), a d × d
// SPD solve with d right-hand sides (the fit's normal equations), SVDs of 128 × 128 and d × d
// (Procrustes), and a d × d product. Each time is the median of 3 runs (one run when that one
// exceeded the budget). An old run predicted to take longer than the budget (2 minutes) is not
// run: it is extrapolated from the largest size that fit, by d³ (d² for the Gram matrix, whose
// token count is fixed) — a lower bound, since the old loops slow down further out of cache.
//
//   bench_linalg [--threads N] [--budget SECONDS] [--sizes 1024,4096] [--only gram|solve|svd|matmul]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "autograd/error.h"
#include "autograd/runtime.h"
#include "train/study/convert/linalg.h"

using namespace tapelm;
using la::Mat;

// The implementation before LAPACK, as it was: plain loops, one thread.
namespace old {

Mat transpose(const Mat& m) {
  Mat t(m.cols, m.rows);
  for (int64_t i = 0; i < m.rows; i++)
    for (int64_t j = 0; j < m.cols; j++) t(j, i) = m(i, j);
  return t;
}

Mat matmul(const Mat& a, const Mat& b) {
  if (a.cols != b.rows) throw Error(ErrorKind::internal, "la::matmul: inner sizes differ");
  Mat c(a.rows, b.cols);
  for (int64_t i = 0; i < a.rows; i++)
    for (int64_t k = 0; k < a.cols; k++) {
      const double v = a(i, k);
      if (v == 0) continue;
      for (int64_t j = 0; j < b.cols; j++) c(i, j) += v * b(k, j);
    }
  return c;
}

Mat solve_spd(const Mat& A, const Mat& B) {
  const int64_t n = A.rows;
  if (A.cols != n || B.rows != n) throw Error(ErrorKind::internal, "la::solve_spd: shapes");
  // A = L Lᵀ, then L y = b and Lᵀ x = y for every column b of B.
  Mat L(n, n);
  for (int64_t j = 0; j < n; j++) {
    double d = A(j, j);
    for (int64_t k = 0; k < j; k++) d -= L(j, k) * L(j, k);
    if (!(d > 0))
      throw Error(ErrorKind::internal, "la::solve_spd: matrix not positive definite at pivot " + std::to_string(j));
    L(j, j) = std::sqrt(d);
    for (int64_t i = j + 1; i < n; i++) {
      double s = A(i, j);
      for (int64_t k = 0; k < j; k++) s -= L(i, k) * L(j, k);
      L(i, j) = s / L(j, j);
    }
  }
  Mat X = B;
  for (int64_t c = 0; c < B.cols; c++) {
    for (int64_t i = 0; i < n; i++) {
      double s = X(i, c);
      for (int64_t k = 0; k < i; k++) s -= L(i, k) * X(k, c);
      X(i, c) = s / L(i, i);
    }
    for (int64_t i = n - 1; i >= 0; i--) {
      double s = X(i, c);
      for (int64_t k = i + 1; k < n; k++) s -= L(k, i) * X(k, c);
      X(i, c) = s / L(i, i);
    }
  }
  return X;
}

la::SVD svd(const Mat& A) {
  const int64_t n = A.rows;
  if (A.cols != n) throw Error(ErrorKind::internal, "la::svd: square matrices only");
  // One-sided Jacobi: rotate pairs of columns of W = A V until they are orthogonal; then the
  // column norms are the singular values and the normalised columns are U.
  Mat W = A, V = Mat::identity(n);
  const double eps = 1e-15;
  for (int sweep = 0; sweep < 60; sweep++) {
    bool rotated = false;
    for (int64_t p = 0; p < n - 1; p++)
      for (int64_t q = p + 1; q < n; q++) {
        double alpha = 0, beta = 0, gamma = 0;
        for (int64_t i = 0; i < n; i++) {
          alpha += W(i, p) * W(i, p);
          beta += W(i, q) * W(i, q);
          gamma += W(i, p) * W(i, q);
        }
        if (std::fabs(gamma) <= eps * std::sqrt(alpha * beta) || gamma == 0) continue;
        rotated = true;
        // The rotation angle that zeroes the off-diagonal of the 2×2 Gram matrix [[α, γ], [γ, β]].
        const double zeta = (beta - alpha) / (2 * gamma);
        const double t = (zeta >= 0 ? 1.0 : -1.0) / (std::fabs(zeta) + std::sqrt(1 + zeta * zeta));
        const double c = 1 / std::sqrt(1 + t * t), s = c * t;
        for (int64_t i = 0; i < n; i++) {
          const double wp = W(i, p), wq = W(i, q);
          W(i, p) = c * wp - s * wq;
          W(i, q) = s * wp + c * wq;
          const double vp = V(i, p), vq = V(i, q);
          V(i, p) = c * vp - s * vq;
          V(i, q) = s * vp + c * vq;
        }
      }
    if (!rotated) break;
  }
  la::SVD r;
  r.V = V;
  r.U = Mat(n, n);
  r.s.assign(static_cast<size_t>(n), 0);
  double smax = 0;
  for (int64_t j = 0; j < n; j++) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += W(i, j) * W(i, j);
    r.s[j] = std::sqrt(s);
    smax = std::max(smax, r.s[j]);
  }
  // Columns with (numerically) zero singular value get an orthonormal completion (Gram-Schmidt
  // over the standard basis), so U is orthogonal whatever the rank.
  std::vector<bool> done(static_cast<size_t>(n), false);
  for (int64_t j = 0; j < n; j++)
    if (r.s[j] > 1e-13 * smax && r.s[j] > 0) {
      for (int64_t i = 0; i < n; i++) r.U(i, j) = W(i, j) / r.s[j];
      done[j] = true;
    }
  int64_t e = 0;
  for (int64_t j = 0; j < n; j++) {
    if (done[j]) continue;
    for (; e < n; e++) {
      std::vector<double> u(static_cast<size_t>(n), 0);
      u[e] = 1;
      for (int pass = 0; pass < 2; pass++)
        for (int64_t k = 0; k < n; k++) {
          if (!done[k]) continue;
          double d = 0;
          for (int64_t i = 0; i < n; i++) d += r.U(i, k) * u[i];
          for (int64_t i = 0; i < n; i++) u[i] -= d * r.U(i, k);
        }
      double nn = 0;
      for (double v : u) nn += v * v;
      if (nn > 1e-6) {
        for (int64_t i = 0; i < n; i++) r.U(i, j) = u[i] / std::sqrt(nn);
        done[j] = true;
        e++;
        break;
      }
    }
    r.s[j] = 0;
  }
  return r;
}

}  // namespace old

namespace {

constexpr int64_t kTokens = 16384;
constexpr int kRuns = 3;

Mat random_mat(int64_t r, int64_t c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  Mat m(r, c);
  for (double& v : m.a) v = nd(rng);
  return m;
}

/// Calibration-like inputs: N tokens of d features and the constant 1 that carries the biases.
Mat tokens(int64_t d, uint64_t seed) {
  Mat x = random_mat(kTokens, d + 1, seed);
  for (int64_t t = 0; t < kTokens; t++) x(t, d) = 1;
  return x;
}

/// A well-conditioned SPD matrix (condition number about 30): the Gram matrix of 2n random rows.
Mat spd(int64_t n, uint64_t seed) {
  Mat g = la::scale(la::gram(random_mat(2 * n, n, seed)), 1.0 / static_cast<double>(2 * n));
  for (int64_t i = 0; i < n; i++) g(i, i) += 0.1;
  return g;
}

/// Singular values as a 1 × n matrix, descending: the part of an SVD two implementations share.
Mat sorted_values(const la::SVD& d) {
  Mat s(1, static_cast<int64_t>(d.s.size()));
  s.a = d.s;
  std::sort(s.a.begin(), s.a.end(), std::greater<>());
  return s;
}

/// One problem at one size: runs the old or the new implementation once on inputs made beforehand.
using Run = std::function<Mat(bool use_old)>;

struct Problem {
  std::string key, name;
  std::function<std::string(int64_t)> shape;
  int exponent;  // how the old cost grows with the size
  std::function<Run(int64_t)> make;
  std::vector<int64_t> sizes;
};

double seconds_of(const Run& run, bool use_old, Mat* out) {
  const auto t0 = std::chrono::steady_clock::now();
  Mat r = run(use_old);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (out) *out = std::move(r);
  return s;
}

/// The median of kRuns runs, or the one run when that already took longer than the budget (the
/// old loops outgrow their d³ prediction once the matrices leave the cache).
double median_of_runs(const Run& run, bool use_old, Mat* out, double budget, int* runs) {
  std::vector<double> t = {seconds_of(run, use_old, out)};
  if (t[0] <= budget)
    for (int i = 1; i < kRuns; i++) t.push_back(seconds_of(run, use_old, nullptr));
  *runs = static_cast<int>(t.size());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// max |a − b| / max |b|
double rel_diff(const Mat& a, const Mat& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < b.a.size(); i++) {
    d = std::max(d, std::fabs(a.a[i] - b.a[i]));
    m = std::max(m, std::fabs(b.a[i]));
  }
  return m > 0 ? d / m : d;
}

struct Row {
  std::string problem, shape;
  double old_s = 0, new_s = 0, agree = -1;
  int old_runs = 0, new_runs = 0;
  bool extrapolated = false;
  int64_t from = 0;  // the size the extrapolation started from
};

std::string fmt_seconds(double s) {
  char b[32];
  if (s >= 100) std::snprintf(b, sizeof b, "%.0f", s);
  else if (s >= 1) std::snprintf(b, sizeof b, "%.2f", s);
  else std::snprintf(b, sizeof b, "%.4f", s);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  double budget = 120;
  std::vector<int64_t> ds = {1024, 4096};
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--threads") threads = std::atoi(v.c_str());
    else if (k == "--budget") budget = std::atof(v.c_str());
    else if (k == "--only") only = v;
    else if (k == "--sizes") {
      ds.clear();
      for (size_t at = 0; at < v.size();) {
        const size_t comma = std::min(v.find(',', at), v.size());
        ds.push_back(std::atoll(v.substr(at, comma - at).c_str()));
        at = comma + 1;
      }
    } else {
      std::fprintf(stderr, "usage: bench_linalg [--threads N] [--budget SECONDS] [--sizes 1024,4096] "
                           "[--only gram|solve|svd|matmul]\n");
      return 2;
    }
  }
  set_num_threads(threads);
  std::fprintf(stderr, "bench_linalg: %d threads, old runs over %.0f s extrapolated, median of %d runs\n",
               get_num_threads(), budget, kRuns);

  const auto square = [](int64_t n) { return std::to_string(n) + "×" + std::to_string(n); };
  const std::vector<Problem> problems = {
      {"gram", "Gram XᵀX (la::gram: dsyrk)",
       [](int64_t d) { return "X " + std::to_string(kTokens) + "×" + std::to_string(d + 1); }, 2,
       [](int64_t d) -> Run {
         auto x = std::make_shared<Mat>(tokens(d, 1));
         return [x](bool o) { return o ? old::matmul(old::transpose(*x), *x) : la::gram(*x); };
       },
       ds},
      {"solve", "SPD solve, d right-hand sides (dposv)", [square](int64_t d) { return square(d) + " · X = " + square(d); }, 3,
       [](int64_t d) -> Run {
         auto a = std::make_shared<Mat>(spd(d, 2));
         auto b = std::make_shared<Mat>(random_mat(d, d, 3));
         return [a, b](bool o) { return o ? old::solve_spd(*a, *b) : la::solve_spd(*a, *b); };
       },
       ds},
      {"svd", "SVD (dgesdd)", square, 3,
       [](int64_t d) -> Run {
         auto a = std::make_shared<Mat>(random_mat(d, d, 4));
         return [a](bool o) { return sorted_values(o ? old::svd(*a) : la::svd(*a)); };
       },
       {}},
      {"matmul", "matmul (dgemm)", [square](int64_t d) { return square(d) + " · " + square(d); }, 3,
       [](int64_t d) -> Run {
         auto a = std::make_shared<Mat>(random_mat(d, d, 5));
         auto b = std::make_shared<Mat>(random_mat(d, d, 6));
         return [a, b](bool o) { return o ? old::matmul(*a, *b) : la::matmul(*a, *b); };
       },
       ds},
  };

  std::vector<Row> rows;
  for (Problem p : problems) {
    if (!only.empty() && p.key != only) continue;
    if (p.sizes.empty()) {  // the SVD: the head_dim-sized one Procrustes runs per head, then d × d
      p.sizes = {128};
      p.sizes.insert(p.sizes.end(), ds.begin(), ds.end());
    }
    // The old implementation climbs doubling sizes from an eighth of the smallest: each step is
    // run only when the last measured time, scaled by the size ratio, predicts it within budget.
    int64_t last_n = 0;
    double last_t = 0;
    const int64_t top = *std::max_element(p.sizes.begin(), p.sizes.end());
    for (int64_t n = std::max<int64_t>(p.sizes.front() / 8, 8); n <= top; n *= 2) {
      const bool target = std::find(p.sizes.begin(), p.sizes.end(), n) != p.sizes.end();
      const double predicted = last_n ? last_t * std::pow(static_cast<double>(n) / last_n, p.exponent) : 0;
      const bool run_old = predicted <= budget;
      if (!target && !run_old) continue;
      const Run run = p.make(n);
      if (!target) {  // a step on the way: one run of the old implementation
        last_t = seconds_of(run, true, nullptr);
        last_n = n;
        std::fprintf(stderr, "  %s %s: old %.3f s (step)\n", p.name.c_str(), p.shape(n).c_str(), last_t);
        continue;
      }
      Row r{p.name, p.shape(n)};
      Mat fresh, before;
      r.new_s = median_of_runs(run, false, &fresh, budget, &r.new_runs);
      if (run_old) {
        r.old_s = median_of_runs(run, true, &before, budget, &r.old_runs);
        r.agree = rel_diff(before, fresh);
        last_t = r.old_s;
        last_n = n;
      } else {
        r.old_s = predicted;
        r.extrapolated = true;
        r.from = last_n;
      }
      std::fprintf(stderr, "  %s %s: old %.3f s%s, new %.4f s\n", p.name.c_str(), r.shape.c_str(), r.old_s,
                   r.extrapolated ? " (extrapolated)" : "", r.new_s);
      rows.push_back(r);
    }
  }

  std::printf("| problem | shape | old loops (s) | LAPACK/BLAS (s) | speedup | max rel. diff |\n");
  std::printf("|---|---|---:|---:|---:|---:|\n");
  for (const Row& r : rows) {
    char agree[32] = "—";
    if (r.agree >= 0) std::snprintf(agree, sizeof agree, "%.1e", r.agree);
    std::string old_s = fmt_seconds(r.old_s);
    if (r.extrapolated) old_s = "≈ " + old_s + " (from " + std::to_string(r.from) + ")";
    if (r.old_runs == 1) old_s += " (1 run)";
    std::string new_s = fmt_seconds(r.new_s);
    if (r.new_runs == 1) new_s += " (1 run)";
    const double speedup = r.old_s / r.new_s;
    std::printf("| %s | %s | %s | %s | %s%.*f× | %s |\n", r.problem.c_str(), r.shape.c_str(), old_s.c_str(),
                new_s.c_str(), r.extrapolated ? "≈ " : "", speedup < 10 ? 1 : 0, speedup, agree);
  }
  return 0;
}
