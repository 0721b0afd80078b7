#pragma once
// Small dense linear algebra in double for the conversion methods (head_dim × head_dim and
// d × d problems): products, a Cholesky solve, a one-sided Jacobi SVD and the orthogonal
// Procrustes rotation. Sizes here are at most a few hundred, so clarity beats blocking.
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

Mat transpose(const Mat& m);
/// a · b
Mat matmul(const Mat& a, const Mat& b);
/// a · bᵀ
Mat matmul_nt(const Mat& a, const Mat& b);
Mat add(const Mat& a, const Mat& b);
Mat scale(const Mat& a, double s);
double trace(const Mat& a);
/// Σ a_ij²
double sq_norm(const Mat& a);

/// X with A X = B for a symmetric positive definite A (Cholesky); throws Error when A is not.
Mat solve_spd(const Mat& A, const Mat& B);

/// A = U diag(s) Vᵀ for a square A (one-sided Jacobi, Hestenes): U and V orthogonal (columns of U
/// for zero singular values completed to an orthonormal basis), s ≥ 0 in no particular order.
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
