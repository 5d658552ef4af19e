/* The model of examples/langid, without autodiff: its sizes and
 * parameters, their initialisation, and the kernels of its forward and
 * backward passes over a group of words of one length, on plain float
 * arrays (products through CBLAS). langid.cpp records these kernels as
 * libadg ops; bench/compare/langid_floor.cpp calls them by hand, as the
 * floor libadg is measured against, so both do the same arithmetic.
 *
 * The model: a word's UTF-8 bytes, each embedded in 32 floats; a GRU of
 * hidden size 64 over them, as PyTorch's torch::nn::GRU computes it (gates
 * r, z, n in that order, two bias vectors):
 *
 *	r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
 *	z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
 *	n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
 *	h' = (1 - z) * n + z * h,	h = 0 before the first byte;
 *
 * then a linear layer from the last hidden state to the 9 languages and
 * softmax cross-entropy. Matrices are row-major; a group of n words of
 * length L keeps its per-byte rows time-major (row t * n + b is word b's
 * byte t), so that time step t is n consecutive rows. */
#ifndef EXAMPLES_LANGID_GRU_HPP
#define EXAMPLES_LANGID_GRU_HPP

#include <cblas.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace gru
{

constexpr int n_bytes = 256, embed = 32, hidden = 64, gates = 3 * hidden;
constexpr int classes = 9;
constexpr int max_length = 20; /* bytes of the longest word */

/* The parameters, in the order every side (trainer, floor, PyTorch's
 * export) keeps them. */
enum param { p_embed, p_w_ih, p_w_hh, p_b_ih, p_b_hh, p_w_out, p_b_out };
constexpr int n_params = 7;
struct shape {
	const char *name;
	int rows, cols;
};
constexpr shape shapes[n_params] = {
	{"embed", n_bytes, embed}, {"w_ih", gates, embed},
	{"w_hh", gates, hidden},   {"b_ih", 1, gates},
	{"b_hh", 1, gates},	   {"w_out", classes, hidden},
	{"b_out", 1, classes},
};
constexpr std::size_t elements(int p)
{
	return static_cast<std::size_t>(shapes[p].rows) * shapes[p].cols;
}

/* A model's values, as plain floats. */
using weights = std::array<std::vector<float>, n_params>;

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

/* PyTorch's defaults: the embedding N(0, 1); the GRU's and the linear
 * layer's weights and biases U(-1/sqrt(64), 1/sqrt(64)). */
inline weights initial_weights(std::uint64_t seed)
{
	std::uint64_t state = seed;
	weights w;
	const double bound = 1 / std::sqrt(static_cast<double>(hidden));
	for (int p = 0; p < n_params; p++) {
		w[p].resize(elements(p));
		for (float &v : w[p]) {
			if (p == p_embed) {
				double u = uniform01(state);
				double a = uniform01(state);
				v = static_cast<float>(
					std::sqrt(-2 * std::log(u)) *
					std::cos(6.283185307179586 * a));
			} else {
				v = static_cast<float>(
					bound * (2 * uniform01(state) - 1));
			}
		}
	}
	return w;
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

/* FNV-1a over the bits of every parameter: equal only for bitwise equal
 * weights. */
inline std::uint64_t fingerprint(const weights &w,
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

/* y (n x m) = x (n x k) w^T (w: m x k), + beta y. */
inline void product_nt(int n, int m, int k, const float *x, const float *w,
		       float *y, float beta = 0)
{
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, k, 1, x, k,
		    w, k, beta, y, m);
}

/* y (n x k) = d (n x m) w (m x k), + beta y. */
inline void product_nn(int n, int k, int m, const float *d, const float *w,
		       float *y, float beta = 0)
{
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, k, m, 1, d, m,
		    w, k, beta, y, k);
}

/* g (m x k) = a^T b, + beta g: a is r x m, b is r x k, a weight's
 * gradient summed over r rows. */
inline void product_tn(int r, int m, int k, const float *a, const float *b,
		       float *g, float beta = 0)
{
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, k, r, 1, a, m,
		    b, k, beta, g, k);
}

/* s (1 x m) = the sum of the rows of d (r x m), + s when accumulating. */
inline void column_sums(int r, int m, const float *d, float *s,
			bool accumulate = false)
{
	if (!accumulate)
		std::fill_n(s, m, 0.0f);
	for (int i = 0; i < r; i++)
		for (int j = 0; j < m; j++)
			s[j] += d[static_cast<std::size_t>(i) * m + j];
}

/* -------------------------------------------------- forward, backward */

/* The gates' nonlinearities, both through expf: glibc's tanhf goes
 * through expm1f, which took a third of a training step's time. */
inline float sigmoid(float x)
{
	return 1 / (1 + std::exp(-x));
}

inline float tanh_of(float x)
{
	float t = std::exp(-2 * std::fabs(x));
	return std::copysign((1 - t) / (1 + t), x);
}

/* x (L*n x embed): the embedding of each byte, rows time-major. */
inline void embed_bytes(const float *table, const unsigned char *bytes,
			int rows, float *x)
{
	for (int i = 0; i < rows; i++)
		std::copy_n(table + static_cast<std::size_t>(bytes[i]) * embed,
			    embed, x + static_cast<std::size_t>(i) * embed);
}

/* The embedding's gradient: each row of dx added to its byte's row of
 * g, whose first row is byte `first` (a band of the table). */
inline void embed_backward(const float *dx, const unsigned char *bytes,
			   int rows, int first, float *g)
{
	for (int i = 0; i < rows; i++) {
		float *row =
			g + static_cast<std::size_t>(bytes[i] - first) * embed;
		for (int j = 0; j < embed; j++)
			row[j] += dx[static_cast<std::size_t>(i) * embed + j];
	}
}

/* gi (rows x gates) = x w_ih^T + b_ih: the input's share of every gate,
 * for every time step at once. */
inline void project(int rows, const float *x, const float *w_ih,
		    const float *b_ih, float *gi)
{
	for (int i = 0; i < rows; i++)
		std::copy_n(b_ih, gates,
			    gi + static_cast<std::size_t>(i) * gates);
	product_nt(rows, gates, embed, x, w_ih, gi, 1);
}

/* One time step of n words: gi their rows of the projection, h_prev their
 * hidden states (null at the first step: zeros). Writes h, and what the
 * backward needs: saved (n x gates) the gates r, z and n, and ghn
 * (n x hidden) W_hn h + b_hn. */
inline void cell_forward(int n, const float *gi, const float *h_prev,
			 const float *w_hh, const float *b_hh, float *saved,
			 float *ghn, float *h)
{
	/* gh = h_prev W_hh^T + b_hh, into saved for now */
	for (int b = 0; b < n; b++)
		std::copy_n(b_hh, gates,
			    saved + static_cast<std::size_t>(b) * gates);
	if (h_prev != nullptr)
		product_nt(n, gates, hidden, h_prev, w_hh, saved, 1);
	for (int b = 0; b < n; b++) {
		const float *i = gi + static_cast<std::size_t>(b) * gates;
		float *s = saved + static_cast<std::size_t>(b) * gates;
		float *hn = ghn + static_cast<std::size_t>(b) * hidden;
		float *out = h + static_cast<std::size_t>(b) * hidden;
		for (int j = 0; j < hidden; j++) {
			float r = sigmoid(i[j] + s[j]);
			float z = sigmoid(i[hidden + j] + s[hidden + j]);
			hn[j] = s[2 * hidden + j];
			float c = tanh_of(i[2 * hidden + j] + r * hn[j]);
			float prev =
				h_prev != nullptr
					? h_prev[static_cast<std::size_t>(b) *
							 hidden +
						 j]
					: 0.0f;
			out[j] = (1 - z) * c + z * prev;
			s[j] = r;
			s[hidden + j] = z;
			s[2 * hidden + j] = c;
		}
	}
}

/* The step's backward, from dh (n x hidden): dgi (n x gates), the
 * gradient of its rows of the projection; dgh (n x gates), that of
 * W_hh h_prev + b_hh, from which the caller takes W_hh's (dgh^T h_prev)
 * and b_hh's (column sums); and, unless h_prev is null, dh_prev
 * (n x hidden). */
inline void cell_backward(int n, const float *dh, const float *h_prev,
			  const float *saved, const float *ghn,
			  const float *w_hh, float *dgi, float *dgh,
			  float *dh_prev)
{
	for (int b = 0; b < n; b++) {
		std::size_t at = static_cast<std::size_t>(b) * hidden;
		const float *s = saved + static_cast<std::size_t>(b) * gates;
		float *di = dgi + static_cast<std::size_t>(b) * gates;
		float *dg = dgh + static_cast<std::size_t>(b) * gates;
		for (int j = 0; j < hidden; j++) {
			float r = s[j], z = s[hidden + j],
			      c = s[2 * hidden + j];
			float prev = h_prev != nullptr ? h_prev[at + j] : 0.0f;
			float d = dh[at + j];
			float dc = d * (1 - z) * (1 - c * c);
			float dz = d * (prev - c) * z * (1 - z);
			float dr = dc * ghn[at + j] * r * (1 - r);
			di[j] = dg[j] = dr;
			di[hidden + j] = dg[hidden + j] = dz;
			di[2 * hidden + j] = dc;
			dg[2 * hidden + j] = dc * r;
			if (dh_prev != nullptr)
				dh_prev[at + j] = d * z;
		}
	}
	if (dh_prev != nullptr)
		product_nn(n, hidden, gates, dgh, w_hh, dh_prev, 1);
}

/* logits (n x classes) = h w_out^T + b_out. */
inline void classify(int n, const float *h, const float *w_out,
		     const float *b_out, float *logits)
{
	for (int b = 0; b < n; b++)
		std::copy_n(b_out, classes,
			    logits + static_cast<std::size_t>(b) * classes);
	product_nt(n, classes, hidden, h, w_out, logits, 1);
}

/* Softmax cross-entropy of each row of logits against its label: returns
 * the summed loss, counts the rows whose largest logit is their label
 * into *correct (when not null), and writes into dlogits (when not null)
 * the gradient of scale times the summed loss. */
inline double cross_entropy(int n, const float *logits, const int *labels,
			    float scale, float *dlogits, int *correct)
{
	double total = 0;
	for (int b = 0; b < n; b++) {
		const float *l = logits + static_cast<std::size_t>(b) * classes;
		int best = 0;
		for (int k = 1; k < classes; k++)
			if (l[k] > l[best])
				best = k;
		double sum = 0;
		for (int k = 0; k < classes; k++)
			sum += std::exp(static_cast<double>(l[k] - l[best]));
		total += std::log(sum) - (l[labels[b]] - l[best]);
		if (correct != nullptr && best == labels[b])
			++*correct;
		if (dlogits == nullptr)
			continue;
		float *d = dlogits + static_cast<std::size_t>(b) * classes;
		for (int k = 0; k < classes; k++) {
			double p =
				std::exp(static_cast<double>(l[k] - l[best])) /
				sum;
			d[k] = static_cast<float>(
				scale * (p - (k == labels[b] ? 1 : 0)));
		}
	}
	return total;
}

/* --------------------------------------------------------- evaluation */

/* What a model makes of a set of words. */
struct scores {
	double loss = 0, accuracy = 0; /* mean; % */
	std::array<std::array<int, classes>, classes>
		confusion{}; /* [true][guess] */
};

/* The model's mean loss, accuracy and confusion on words (each a string
 * of bytes, 1 to max_length) with their labels, without a graph: words of
 * one length go through together, up to 256 at a time. */
template <class Words>
scores evaluate(const weights &w, const Words &words,
		const std::vector<int> &labels)
{
	constexpr int chunk = 256;
	scores s;
	std::vector<std::vector<int>> by_length(max_length + 1);
	for (std::size_t i = 0; i < labels.size(); i++)
		by_length[words[i].size()].push_back(static_cast<int>(i));
	std::vector<unsigned char> bytes;
	std::vector<float> x, gi, saved, ghn, h[2], logits;
	std::vector<int> y;
	double total = 0;
	int correct = 0;
	for (int len = 1; len <= max_length; len++) {
		const std::vector<int> &all = by_length[len];
		for (std::size_t first = 0; first < all.size();
		     first += chunk) {
			int n = static_cast<int>(std::min<std::size_t>(
				chunk, all.size() - first));
			std::size_t rows = static_cast<std::size_t>(len) * n;
			bytes.resize(rows);
			y.resize(n);
			for (int b = 0; b < n; b++) {
				int i = all[first + b];
				y[b] = labels[i];
				for (int t = 0; t < len; t++)
					bytes[static_cast<std::size_t>(t) * n +
					      b] =
						static_cast<unsigned char>(
							words[i][t]);
			}
			x.resize(rows * embed);
			gi.resize(rows * gates);
			saved.resize(static_cast<std::size_t>(n) * gates);
			ghn.resize(static_cast<std::size_t>(n) * hidden);
			h[0].resize(static_cast<std::size_t>(n) * hidden);
			h[1].resize(static_cast<std::size_t>(n) * hidden);
			logits.resize(static_cast<std::size_t>(n) * classes);
			embed_bytes(w[p_embed].data(), bytes.data(),
				    static_cast<int>(rows), x.data());
			project(static_cast<int>(rows), x.data(),
				w[p_w_ih].data(), w[p_b_ih].data(), gi.data());
			for (int t = 0; t < len; t++)
				cell_forward(
					n,
					gi.data() +
						static_cast<std::size_t>(t) *
							n * gates,
					t > 0 ? h[(t - 1) % 2].data() : nullptr,
					w[p_w_hh].data(), w[p_b_hh].data(),
					saved.data(), ghn.data(),
					h[t % 2].data());
			classify(n, h[(len - 1) % 2].data(), w[p_w_out].data(),
				 w[p_b_out].data(), logits.data());
			total += cross_entropy(n, logits.data(), y.data(), 1,
					       nullptr, &correct);
			for (int b = 0; b < n; b++) {
				const float *l =
					logits.data() +
					static_cast<std::size_t>(b) * classes;
				int guess = static_cast<int>(
					std::max_element(l, l + classes) - l);
				s.confusion[y[b]][guess]++;
			}
		}
	}
	if (!labels.empty()) {
		s.loss = total / static_cast<double>(labels.size());
		s.accuracy =
			100.0 * correct / static_cast<double>(labels.size());
	}
	return s;
}

} // namespace gru

#endif /* EXAMPLES_LANGID_GRU_HPP */
