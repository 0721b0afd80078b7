#include "train/study/convert/linalg.h"

#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <limits>
#include <string>

#include "autograd/error.h"

namespace tapelm::la {

namespace {

/// A size as the 32-bit integer BLAS and LAPACK take; larger is a caller's bug, not a silent wrap.
int blas_int(int64_t n, const char* what) {
  if (n < 0 || n > std::numeric_limits<int>::max())
    throw Error(ErrorKind::internal, std::string(what) + ": size " + std::to_string(n) + " out of BLAS range");
  return static_cast<int>(n);
}

/// c = a · b, or a · bᵀ with tb; c is already sized and zero-size products stay zero (BLAS
/// refuses a leading dimension of 0).
void gemm(const Mat& a, const Mat& b, bool tb, Mat& c, const char* what) {
  if (c.a.empty() || a.cols == 0) return;
  cblas_dgemm(CblasRowMajor, CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blas_int(c.rows, what),
              blas_int(c.cols, what), blas_int(a.cols, what), 1.0, a.a.data(), blas_int(a.cols, what), b.a.data(),
              blas_int(b.cols, what), 0.0, c.a.data(), blas_int(c.cols, what));
}

}  // namespace

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
  gemm(a, b, false, c, "la::matmul");
  return c;
}

Mat matmul_nt(const Mat& a, const Mat& b) {
  if (a.cols != b.cols) throw Error(ErrorKind::internal, "la::matmul_nt: inner sizes differ");
  Mat c(a.rows, b.rows);
  gemm(a, b, true, c, "la::matmul_nt");
  return c;
}

Mat gram(const Mat& x) {
  const int64_t n = x.cols;
  Mat g(n, n);
  if (n == 0 || x.rows == 0) return g;
  // dsyrk does half of gemm's work: it fills only the upper triangle, mirrored below.
  cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, blas_int(n, "la::gram"), blas_int(x.rows, "la::gram"), 1.0,
              x.a.data(), blas_int(n, "la::gram"), 0.0, g.a.data(), blas_int(n, "la::gram"));
  for (int64_t i = 1; i < n; i++)
    for (int64_t j = 0; j < i; j++) g(i, j) = g(j, i);
  return g;
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
  if (n == 0 || B.cols == 0) return B;
  // dposv factors A = L Lᵀ from A's lower triangle (in place, hence the copy) and overwrites B with X.
  Mat L = A, X = B;
  const lapack_int info =
      LAPACKE_dposv(LAPACK_ROW_MAJOR, 'L', blas_int(n, "la::solve_spd"), blas_int(B.cols, "la::solve_spd"),
                    L.a.data(), blas_int(n, "la::solve_spd"), X.a.data(), blas_int(B.cols, "la::solve_spd"));
  if (info > 0)
    throw Error(ErrorKind::internal, "la::solve_spd: matrix not positive definite at pivot " + std::to_string(info - 1));
  if (info < 0)  // LAPACKE checks A (argument 5) and B (7) for NaN before LAPACK sees them
    throw Error(ErrorKind::internal, "la::solve_spd: LAPACKE_dposv refused argument " + std::to_string(-info) +
                                         (info == -5 || info == -7 ? " (NaN in A or B)" : ""));
  return X;
}

SVD svd(const Mat& A) {
  const int64_t n = A.rows;
  if (A.cols != n) throw Error(ErrorKind::internal, "la::svd: square matrices only");
  SVD r;
  if (n == 0) return r;
  const int ni = blas_int(n, "la::svd");
  // A's row-major buffer is Aᵀ in LAPACK's column-major order, and Aᵀ = V diag(s) Uᵀ: LAPACK's
  // "U" comes back as V (column-major, i.e. Vᵀ read row-major) and its "Vᵀ" as U read row-major.
  // That spares LAPACKE's row-major path three n × n transposes.
  Mat work = A, vt(n, n);
  r.U = Mat(n, n);
  r.s.assign(static_cast<size_t>(n), 0);
  lapack_int info = LAPACKE_dgesdd(LAPACK_COL_MAJOR, 'A', ni, ni, work.a.data(), ni, r.s.data(), vt.a.data(), ni,
                                   r.U.a.data(), ni);
  if (info > 0) {
    // Divide and conquer did not converge (rare); the QR iteration of dgesvd is slower but sturdier.
    work = A;
    std::vector<double> superb(static_cast<size_t>(std::max<int64_t>(n - 1, 1)));
    info = LAPACKE_dgesvd(LAPACK_COL_MAJOR, 'A', 'A', ni, ni, work.a.data(), ni, r.s.data(), vt.a.data(), ni,
                          r.U.a.data(), ni, superb.data());
  }
  if (info != 0)
    throw Error(ErrorKind::internal, "la::svd: LAPACK failed (info " + std::to_string(info) + ")" +
                                         (info < 0 ? ", NaN in the matrix?" : ", no convergence"));
  r.V = transpose(vt);
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
