#include "train/convert/linalg.h"

#include <cmath>
#include <string>

#include "autograd/error.h"

namespace tapelm::la {

Mat Mat::identity(int64_t n) {
  Mat m(n, n);
  for (int64_t i = 0; i < n; i++) m(i, i) = 1;
  return m;
}

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

Mat matmul_nt(const Mat& a, const Mat& b) {
  if (a.cols != b.cols) throw Error(ErrorKind::internal, "la::matmul_nt: inner sizes differ");
  Mat c(a.rows, b.rows);
  for (int64_t i = 0; i < a.rows; i++)
    for (int64_t j = 0; j < b.rows; j++) {
      double s = 0;
      for (int64_t k = 0; k < a.cols; k++) s += a(i, k) * b(j, k);
      c(i, j) = s;
    }
  return c;
}

Mat add(const Mat& a, const Mat& b) {
  Mat c = a;
  for (size_t i = 0; i < c.a.size(); i++) c.a[i] += b.a[i];
  return c;
}

Mat scale(const Mat& a, double s) {
  Mat c = a;
  for (double& v : c.a) v *= s;
  return c;
}

double trace(const Mat& a) {
  double t = 0;
  for (int64_t i = 0; i < std::min(a.rows, a.cols); i++) t += a(i, i);
  return t;
}

double sq_norm(const Mat& a) {
  double s = 0;
  for (double v : a.a) s += v * v;
  return s;
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

SVD svd(const Mat& A) {
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
  SVD r;
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

Mat procrustes(const Mat& M) {
  // tr(Ωᵀ U S Vᵀ) = tr(S Vᵀ Ωᵀ U) ≤ Σ s_i, with equality at Ω = U Vᵀ.
  const SVD d = svd(M);
  return matmul_nt(d.U, d.V);
}

double nuclear_norm(const Mat& M) {
  double s = 0;
  for (double v : svd(M).s) s += v;
  return s;
}

}  // namespace tapelm::la
