#pragma once
// Small dense linear algebra in double for the conversion methods (head_dim × head_dim and
// d × d problems): products, a Cholesky solve, an SVD and the orthogonal Procrustes rotation.
// BLAS and LAPACK (OpenBLAS, through cblas and LAPACKE) do the work, so d in the thousands takes
// seconds; linalg.cpp is the one file in train/ that may include their headers (check_layers.sh).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tapelm::la {

/// A row-major matrix of doubles.
struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<double> a;
  Mat() = default;
  Mat(int64_t r, int64_t c) : rows(r), cols(c), a(static_cast<size_t>(r * c), 0.0) {}
  double& operator()(int64_t i, int64_t j) { return a[static_cast<size_t>(i * cols + j)]; }
  double operator()(int64_t i, int64_t j) const { return a[static_cast<size_t>(i * cols + j)]; }
  static Mat identity(int64_t n);
};

/// mᵀ
Mat transpose(const Mat& m);
/// a · b
Mat matmul(const Mat& a, const Mat& b);
/// a · bᵀ
Mat matmul_nt(const Mat& a, const Mat& b);
/// xᵀ x (cols × cols, exactly symmetric): a Gram matrix at half the cost of matmul.
Mat gram(const Mat& x);
/// a + b (same shapes)
Mat add(const Mat& a, const Mat& b);
/// s · a
Mat scale(const Mat& a, double s);
/// Σ a_ii
double trace(const Mat& a);
/// Σ a_ij²
double sq_norm(const Mat& a);

/// X with A X = B for a symmetric positive definite A (Cholesky, LAPACK dposv, reading A's lower
/// triangle); throws an internal Error when A is not.
Mat solve_spd(const Mat& A, const Mat& B);

/// A = U diag(s) Vᵀ for a square A (LAPACK dgesdd, dgesvd when that does not converge): U and V
/// orthogonal whatever the rank, s ≥ 0 in no particular order (LAPACK's are descending, but that is not promised).
struct SVD {
  Mat U, V;
  std::vector<double> s;
};
SVD svd(const Mat& A);

/// The orthogonal Ω maximising tr(Ωᵀ M), i.e. minimising ‖A Ω − B‖ for M = Aᵀ B: Ω = U Vᵀ.
Mat procrustes(const Mat& M);
/// max over orthogonal Ω of tr(Ωᵀ M): the sum of M's singular values (nuclear norm).
double nuclear_norm(const Mat& M);

}  // namespace tapelm::la
