/* The model of examples/langid, without autodiff: its sizes and
 * parameters, their initialisation, and the kernels of its forward and
 * backward passes over a group of words of one length, on plain float
 * arrays (products through CBLAS; the generic ones, the generator, the
 * fingerprint and the loss in ../kernels.hpp, re-exported here as
 * gru::shuffled and so on). langid.cpp records these kernels as
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

#include "../kernels.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace gru
{

/* The shared kernels, also by this namespace's name (gru::shuffled). */
using namespace kernels;

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

/* PyTorch's defaults: the embedding N(0, 1); the GRU's and the linear
 * layer's weights and biases U(-1/sqrt(64), 1/sqrt(64)). */
inline weights initial_weights(std::uint64_t seed)
{
	std::uint64_t state = seed;
	weights w;
	const double bound = 1 / std::sqrt(static_cast<double>(hidden));
	for (int p = 0; p < n_params; p++) {
		w[p].resize(elements(p));
		initialise(w[p], p == p_embed ? 0 : bound, state);
	}
	return w;
}

/* -------------------------------------------------- forward, backward */

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
	std::vector<int> y, guess;
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
			guess.resize(n);
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
			total += cross_entropy(n, classes, logits.data(),
					       y.data(), 1, nullptr,
					       guess.data());
			for (int b = 0; b < n; b++) {
				correct += guess[b] == y[b];
				s.confusion[y[b]][guess[b]]++;
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
