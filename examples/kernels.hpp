/* What the C++ trainers' models share, without autodiff and without
 * libadg: a seeded generator and the initialisation, each epoch's order
 * and learning rate, a fingerprint of the weights, products through
 * CBLAS, and the nonlinearities and softmax cross-entropy on plain float
 * arrays. langid/gru.hpp and tagger/lstm.hpp build their models on these
 * (and re-export them, so gru::shuffled is kernels::shuffled); the floors
 * in bench/compare call them through those headers, so that trainer and
 * floor do the same arithmetic. Matrices are row-major. */
#ifndef EXAMPLES_KERNELS_HPP
#define EXAMPLES_KERNELS_HPP

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kernels
{

/* splitmix64: a tiny, fixed generator, so that the initial weights and
 * each epoch's order depend on the seed alone (up to libm's rounding). */
inline std::uint64_t next_random(std::uint64_t &state)
{
	std::uint64_t z = (state += 0x9e3779b97f4a7c15u);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

inline double uniform01(std::uint64_t &state) /* in (0, 1) */
{
	return (static_cast<double>(next_random(state) >> 11) + 0.5) /
	       9007199254740992.0;
}

/* Fills v as PyTorch's defaults do, drawing from state: bound 0, N(0, 1)
 * (an embedding; Box-Muller, two draws a value); else U(-bound, bound)
 * (an LSTM's, a GRU's or a linear layer's weights and biases). */
inline void initialise(std::vector<float> &v, double bound,
		       std::uint64_t &state)
{
	for (float &x : v) {
		if (bound == 0) {
			double u = uniform01(state);
			double a = uniform01(state);
			x = static_cast<float>(std::sqrt(-2 * std::log(u)) *
					       std::cos(6.283185307179586 * a));
		} else {
			x = static_cast<float>(bound *
					       (2 * uniform01(state) - 1));
		}
	}
}

/* Epoch e's order of n examples: a Fisher-Yates shuffle from a generator
 * seeded by the seed and the epoch. */
inline std::vector<int> shuffled(int n, std::uint64_t seed, int epoch)
{
	std::uint64_t state =
		seed * 1000003u + static_cast<unsigned>(epoch) + 1;
	std::vector<int> order(static_cast<std::size_t>(n));
	for (int i = 0; i < n; i++)
		order[i] = i;
	for (int i = n - 1; i > 0; i--)
		std::swap(order[i], order[next_random(state) %
					  static_cast<unsigned>(i + 1)]);
	return order;
}

/* Epoch e's learning rate: lr falling linearly to lr / epochs at the
 * last epoch. */
inline float learning_rate(double lr, int epochs, int epoch)
{
	return static_cast<float>(lr * (epochs - epoch) / epochs);
}

/* FNV-1a over the bits of every parameter of w (vectors of floats) in
 * order: equal only for bitwise equal weights. Chains through hash, so
 * that several models hash as one. */
template <class Weights>
std::uint64_t fingerprint(const Weights &w,
			  std::uint64_t hash = 0xcbf29ce484222325u)
{
	for (const auto &v : w)
		for (float f : v) {
			unsigned char b[sizeof f];
			std::copy_n(reinterpret_cast<const unsigned char *>(&f),
				    sizeof f, b);
			for (unsigned char c : b)
				hash = (hash ^ c) * 0x100000001b3u;
		}
	return hash;
}

/* ---------------------------------------------------------- products */

/* y (n x m, leading dimension ldy) = x (n x k, ldx) w^T (w: m x k, ldw),
 * + beta y. */
inline void product_nt(int n, int m, int k, const float *x, int ldx,
		       const float *w, int ldw, float *y, int ldy,
		       float beta = 0)
{
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, k, 1, x, ldx,
		    w, ldw, beta, y, ldy);
}

/* The same on packed matrices (each leading dimension its columns). */
inline void product_nt(int n, int m, int k, const float *x, const float *w,
		       float *y, float beta = 0)
{
	product_nt(n, m, k, x, k, w, k, y, m, beta);
}

/* y (n x k, ldy) = d (n x m, ldd) w (m x k, ldw), + beta y. */
inline void product_nn(int n, int k, int m, const float *d, int ldd,
		       const float *w, int ldw, float *y, int ldy,
		       float beta = 0)
{
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, k, m, 1, d,
		    ldd, w, ldw, beta, y, ldy);
}

/* The same on packed matrices. */
inline void product_nn(int n, int k, int m, const float *d, const float *w,
		       float *y, float beta = 0)
{
	product_nn(n, k, m, d, m, w, k, y, k, beta);
}

/* g (m x k, ldg) = a^T b, + beta g: a is r x m, b is r x k (ldb), a
 * weight's gradient summed over r rows. Over no rows g is beta g, made
 * here: BLAS need not touch g when the inner size is 0. */
inline void product_tn(int r, int m, int k, const float *a, const float *b,
		       int ldb, float *g, int ldg, float beta = 0)
{
	if (r == 0) {
		if (beta != 1)
			for (int i = 0; i < m; i++) {
				float *row =
					g + static_cast<std::size_t>(i) * ldg;
				for (int j = 0; j < k; j++)
					row[j] = beta == 0 ? 0.0f
							   : beta * row[j];
			}
		return;
	}
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, k, r, 1, a, m,
		    b, ldb, beta, g, ldg);
}

/* The same on packed matrices. */
inline void product_tn(int r, int m, int k, const float *a, const float *b,
		       float *g, float beta = 0)
{
	product_tn(r, m, k, a, b, k, g, k, beta);
}

/* s (m) = the sum of the rows of d (r x m), in row order; added to s
 * when accumulating. */
inline void column_sums(int r, int m, const float *d, float *s,
			bool accumulate = false)
{
	if (!accumulate)
		std::fill_n(s, m, 0.0f);
	for (int i = 0; i < r; i++)
		for (int j = 0; j < m; j++)
			s[j] += d[static_cast<std::size_t>(i) * m + j];
}

/* ---------------------------------------------------- nonlinearities */

/* Both through expf: glibc's tanhf goes through expm1f, which took a
 * third of the GRU's training step's time. */
inline float sigmoid(float x)
{
	return 1 / (1 + std::exp(-x));
}

inline float tanh_of(float x)
{
	float t = std::exp(-2 * std::fabs(x));
	return std::copysign((1 - t) / (1 + t), x);
}

/* Softmax cross-entropy of each row of scores (n x classes) against its
 * label: returns the summed loss; writes each row's best guess (its first
 * largest score) into guess (when not null) and into dscores (when not
 * null) the gradient of scale times the summed loss. */
inline double cross_entropy(int n, int classes, const float *scores,
			    const int *labels, float scale, float *dscores,
			    int *guess)
{
	double total = 0;
	std::vector<double> e(static_cast<std::size_t>(classes));
	for (int b = 0; b < n; b++) {
		const float *l = scores + static_cast<std::size_t>(b) * classes;
		int best = 0;
		for (int k = 1; k < classes; k++)
			if (l[k] > l[best])
				best = k;
		double sum = 0;
		for (int k = 0; k < classes; k++) {
			e[k] = std::exp(static_cast<double>(l[k] - l[best]));
			sum += e[k];
		}
		total += std::log(sum) - (l[labels[b]] - l[best]);
		if (guess != nullptr)
			guess[b] = best;
		if (dscores == nullptr)
			continue;
		float *d = dscores + static_cast<std::size_t>(b) * classes;
		for (int k = 0; k < classes; k++)
			d[k] = static_cast<float>(
				scale *
				(e[k] / sum - (k == labels[b] ? 1 : 0)));
	}
	return total;
}

} // namespace kernels

#endif /* EXAMPLES_KERNELS_HPP */
