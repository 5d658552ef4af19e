/* The model of examples/tagger without autodiff: its sizes and
 * parameters, their initialisation, and the kernels of its forward and
 * backward passes on plain float arrays (products through CBLAS): an LSTM
 * step over a batch of rows and a whole sequence of them, an embedding's
 * gather and scatter-add, the MLP's layer; the generic kernels (the
 * generator, products, nonlinearities, softmax cross-entropy) are
 * ../kernels.hpp's, re-exported here as lstm::shuffled and so on.
 * tagger.cpp records these kernels as libadg ops; the floor in
 * bench/compare calls them by hand, so both do the same arithmetic. No
 * libadg here.
 *
 * The model is dynet-benchmark's bilstm-tagger-withchar: a known word's
 * embedding of 128, or, for a rare word, the last hidden states of a
 * character LSTM of 64 each way over its bytes between two boundaries
 * (char embedding 20); a word LSTM of 50 each way over the sentence; an
 * MLP of 32 (tanh) on each token's two hidden states; a linear layer to
 * the tags and softmax cross-entropy. The LSTM cell is PyTorch's (gates
 * i, f, g, o; one bias, W = [W_ih W_hh] as one matrix):
 *
 *	z = W [x ; h] + b,  i = s(z_i), f = s(z_f), g = tanh(z_g), o = s(z_o)
 *	c' = f c + i g,  h' = o tanh(c'),  h = c = 0 before the first step.
 *
 * Matrices are row-major. A sequence of len steps over n rows (n sentences
 * of one length, or n spellings of one length) keeps its rows time-major:
 * row t * n + b is row b's step t, so that a time step is n consecutive
 * rows and the products over every step at once are one GEMM. */
#ifndef EXAMPLES_TAGGER_LSTM_HPP
#define EXAMPLES_TAGGER_LSTM_HPP

#include "../kernels.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace lstm
{

/* The shared kernels, also by this namespace's name (lstm::shuffled). */
using namespace kernels;

constexpr int word_dim = 128, char_dim = 20, char_hidden = 64;
constexpr int word_hidden = 50, mlp_hidden = 32;
constexpr int features = 2 * word_hidden; /* a token's [fwd ; bwd] */

/* The parameters, in the order every side keeps them (the spec's table;
 * setup.hpp's shapes()). */
enum param {
	p_word_embed,
	p_char_embed,
	p_char_fwd_w,
	p_char_fwd_b,
	p_char_bwd_w,
	p_char_bwd_b,
	p_word_fwd_w,
	p_word_fwd_b,
	p_word_bwd_w,
	p_word_bwd_b,
	p_mlp_w,
	p_mlp_b,
	p_out_w,
	p_out_b,
};
constexpr int n_params = 14;

struct shape {
	const char *name;
	int rows, cols;
};

/* The vocabulary's sizes, which fix the shapes of the tables. */
struct sizes {
	int words, chars, tags;
};

inline std::array<shape, n_params> shapes(const sizes &s)
{
	const int cg = 4 * char_hidden, wg = 4 * word_hidden;
	return {{
		{"word_embed", s.words, word_dim},
		{"char_embed", s.chars, char_dim},
		{"char_fwd_w", cg, char_dim + char_hidden},
		{"char_fwd_b", 1, cg},
		{"char_bwd_w", cg, char_dim + char_hidden},
		{"char_bwd_b", 1, cg},
		{"word_fwd_w", wg, word_dim + word_hidden},
		{"word_fwd_b", 1, wg},
		{"word_bwd_w", wg, word_dim + word_hidden},
		{"word_bwd_b", 1, wg},
		{"mlp_w", mlp_hidden, features},
		{"mlp_b", 1, mlp_hidden},
		{"out_w", s.tags, mlp_hidden},
		{"out_b", 1, s.tags},
	}};
}

/* A model's values, as plain floats, each parameter row-major. */
using weights = std::array<std::vector<float>, n_params>;

/* PyTorch's defaults: embeddings N(0, 1); an LSTM's weights and biases
 * U(-1/sqrt(H), 1/sqrt(H)); a linear layer's U(-1/sqrt(in), 1/sqrt(in)). */
inline weights initial_weights(const sizes &s, std::uint64_t seed)
{
	std::uint64_t state = seed;
	auto table = shapes(s);
	weights w;
	for (int p = 0; p < n_params; p++) {
		double bound = 0;
		switch (p) {
		case p_char_fwd_w:
		case p_char_fwd_b:
		case p_char_bwd_w:
		case p_char_bwd_b:
			bound = 1 / std::sqrt(double(char_hidden));
			break;
		case p_word_fwd_w:
		case p_word_fwd_b:
		case p_word_bwd_w:
		case p_word_bwd_b:
			bound = 1 / std::sqrt(double(word_hidden));
			break;
		case p_mlp_w:
		case p_mlp_b:
			bound = 1 / std::sqrt(double(features));
			break;
		case p_out_w:
		case p_out_b:
			bound = 1 / std::sqrt(double(mlp_hidden));
			break;
		default: /* the embeddings */
			break;
		}
		w[p].resize(static_cast<std::size_t>(table[p].rows) *
			    table[p].cols);
		initialise(w[p], bound, state);
	}
	return w;
}

/* --------------------------------------------------------- embeddings */

/* out (n x cols, ldo) = the rows ids[0..n) of table (cols wide). */
inline void gather(const float *table, int cols, const int *ids, int n,
		   float *out, int ldo)
{
	for (int i = 0; i < n; i++)
		std::copy_n(table + static_cast<std::size_t>(ids[i]) * cols,
			    cols, out + static_cast<std::size_t>(i) * ldo);
}

/* gather's backward: row i of dy (n x cols, ldd) added to row ids[i] of
 * g (a table's gradient, cols wide), in row order. */
inline void scatter_add(const float *dy, int ldd, const int *ids, int n,
			int cols, float *g)
{
	for (int i = 0; i < n; i++) {
		float *row = g + static_cast<std::size_t>(ids[i]) * cols;
		const float *d = dy + static_cast<std::size_t>(i) * ldd;
		for (int j = 0; j < cols; j++)
			row[j] += d[j];
	}
}

/* ----------------------------------------------------------------- LSTM */

/* An LSTM's sizes: in inputs, hidden units; W is gates() x cols(). */
struct cell {
	int in, hidden;
	int gates() const
	{
		return 4 * hidden;
	}
	int cols() const
	{
		return in + hidden;
	}
};

/* z (rows x 4H) = x W_x^T + b: the inputs' share of every gate, for
 * every time step at once (W_x: W's first `in` columns). */
inline void project(const cell &k, int rows, const float *x, const float *w,
		    const float *b, float *z)
{
	const int g = k.gates();
	for (int i = 0; i < rows; i++)
		std::copy_n(b, g, z + static_cast<std::size_t>(i) * g);
	product_nt(rows, g, k.in, x, k.in, w, k.cols(), z, g, 1);
}

/* One time step of n rows. z (n x 4H) holds their projection (project)
 * and is left holding the gates i, f, g, o, activated: what the backward
 * needs, with c_prev and c. h_prev and c_prev null at the first step
 * (zeros). Writes c and h (n x H). */
inline void step_forward(const cell &k, int n, float *z, const float *h_prev,
			 const float *c_prev, const float *w, float *c,
			 float *h)
{
	const int H = k.hidden, g = k.gates();
	if (h_prev != nullptr)
		product_nt(n, g, H, h_prev, H, w + k.in, k.cols(), z, g, 1);
	for (int b = 0; b < n; b++) {
		float *s = z + static_cast<std::size_t>(b) * g;
		std::size_t at = static_cast<std::size_t>(b) * H;
		for (int j = 0; j < H; j++) {
			float i = sigmoid(s[j]), f = sigmoid(s[H + j]),
			      gg = tanh_of(s[2 * H + j]),
			      o = sigmoid(s[3 * H + j]);
			float prev = c_prev != nullptr ? c_prev[at + j] : 0.0f;
			float cc = f * prev + i * gg;
			s[j] = i;
			s[H + j] = f;
			s[2 * H + j] = gg;
			s[3 * H + j] = o;
			c[at + j] = cc;
			h[at + j] = o * tanh_of(cc);
		}
	}
}

/* The step's backward. dh (n x H): the gradient of its h, everything
 * included; dc (n x H): that of its c from the step after (zeros after
 * the last), left holding c_prev's. Writes dz (n x 4H), the gradient of
 * the gates' inputs, and, unless null (the first step), dh_prev (n x H),
 * the gradient h_prev gets through W_h. */
inline void step_backward(const cell &k, int n, const float *gates,
			  const float *c_prev, const float *c, const float *dh,
			  float *dc, const float *w, float *dz, float *dh_prev)
{
	const int H = k.hidden, g = k.gates();
	for (int b = 0; b < n; b++) {
		const float *s = gates + static_cast<std::size_t>(b) * g;
		float *d = dz + static_cast<std::size_t>(b) * g;
		std::size_t at = static_cast<std::size_t>(b) * H;
		for (int j = 0; j < H; j++) {
			float i = s[j], f = s[H + j], gg = s[2 * H + j],
			      o = s[3 * H + j];
			float tc = tanh_of(c[at + j]);
			float prev = c_prev != nullptr ? c_prev[at + j] : 0.0f;
			float dcc = dc[at + j] + dh[at + j] * o * (1 - tc * tc);
			d[j] = dcc * gg * i * (1 - i);
			d[H + j] = dcc * prev * f * (1 - f);
			d[2 * H + j] = dcc * i * (1 - gg * gg);
			d[3 * H + j] = dh[at + j] * tc * o * (1 - o);
			dc[at + j] = dcc * f;
		}
	}
	if (dh_prev != nullptr)
		product_nn(n, H, g, dz, g, w + k.in, k.cols(), dh_prev, H);
}

/* A sequence of len steps over n rows, time-major, forward in time or, with
 * reverse, from the last step to the first. x (len*n x in). Writes, for
 * every step at its rows: gates (len*n x 4H, as step_forward leaves z),
 * c and h (len*n x H). The sequence's last hidden state is h's rows of
 * step len - 1, or of step 0 in reverse. */
inline void sequence_forward(const cell &k, int len, int n, bool reverse,
			     const float *x, const float *w, const float *b,
			     float *gates, float *c, float *h)
{
	const std::size_t g = k.gates(), H = k.hidden, rows = n;
	project(k, len * n, x, w, b, gates);
	for (int s = 0; s < len; s++) {
		int t = reverse ? len - 1 - s : s,
		    before = reverse ? t + 1 : t - 1;
		const float *h_prev = s > 0 ? h + before * rows * H : nullptr;
		const float *c_prev = s > 0 ? c + before * rows * H : nullptr;
		step_forward(k, n, gates + t * rows * g, h_prev, c_prev, w,
			     c + t * rows * H, h + t * rows * H);
	}
}

/* sequence_forward's backward. The gradient of the outputs: dh_all
 * (len*n x H, every step's h) or, when null, dh_last (n x H, the last
 * state's only). Writes dz (len*n x 4H, the gates' inputs'), dx (len*n x
 * in) unless null, and W's and b's gradients into dw (4H x (in + H)) and
 * db (4H), overwriting them: dW = dz^T [x ; h_prev] over every step, one
 * product each for W_x and W_h, rows in time order. */
inline void sequence_backward(const cell &k, int len, int n, bool reverse,
			      const float *x, const float *w,
			      const float *gates, const float *c,
			      const float *h, const float *dh_all,
			      const float *dh_last, float *dz, float *dx,
			      float *dw, float *db)
{
	const int H = k.hidden, g = k.gates();
	const std::size_t step_h = static_cast<std::size_t>(n) * H,
			  step_g = static_cast<std::size_t>(n) * g;
	std::vector<float> dh(step_h), dc(step_h, 0.0f), carry(step_h, 0.0f);
	for (int s = len - 1; s >= 0; s--) {
		int t = reverse ? len - 1 - s : s,
		    before = reverse ? t + 1 : t - 1;
		for (std::size_t i = 0; i < step_h; i++)
			dh[i] = carry[i];
		if (dh_all != nullptr)
			for (std::size_t i = 0; i < step_h; i++)
				dh[i] += dh_all[t * step_h + i];
		else if (s == len - 1)
			for (std::size_t i = 0; i < step_h; i++)
				dh[i] += dh_last[i];
		const float *c_prev = s > 0 ? c + before * step_h : nullptr;
		step_backward(k, n, gates + t * step_g, c_prev, c + t * step_h,
			      dh.data(), dc.data(), w, dz + t * step_g,
			      s > 0 ? carry.data() : nullptr);
	}
	const int rows = len * n, cols = k.cols();
	if (dx != nullptr)
		product_nn(rows, k.in, g, dz, g, w, cols, dx, k.in);
	product_tn(rows, g, k.in, dz, x, k.in, dw, cols);
	/* W_h: step t's h_prev is step t - 1's h (t + 1's in reverse), so
	 * the steps that have one pair with h shifted by a step. */
	const int paired = (len - 1) * n;
	if (reverse)
		product_tn(paired, g, H, dz, h + step_h, H, dw + k.in, cols);
	else
		product_tn(paired, g, H, dz + step_g, h, H, dw + k.in, cols);
	column_sums(rows, g, dz, db);
}

/* ------------------------------------------------------------------ MLP */

/* y (n x out) = tanh(x w^T + b) when squash, else x w^T + b; x n x in. */
inline void layer_forward(int n, int in, int out, const float *x,
			  const float *w, const float *b, bool squash, float *y)
{
	for (int i = 0; i < n; i++)
		std::copy_n(b, out, y + static_cast<std::size_t>(i) * out);
	product_nt(n, out, in, x, in, w, in, y, out, 1);
	if (squash)
		for (std::size_t i = 0; i < static_cast<std::size_t>(n) * out;
		     i++)
			y[i] = tanh_of(y[i]);
}

/* layer_forward's backward from dy (n x out), y its output: dy becomes
 * the gradient of the layer's input to tanh (when squash); writes dw
 * (out x in), db (out) and, unless null, dx (n x in). */
inline void layer_backward(int n, int in, int out, const float *x,
			   const float *w, const float *y, bool squash,
			   float *dy, float *dw, float *db, float *dx)
{
	if (squash)
		for (std::size_t i = 0; i < static_cast<std::size_t>(n) * out;
		     i++)
			dy[i] *= 1 - y[i] * y[i];
	product_tn(n, out, in, dy, x, in, dw, in);
	column_sums(n, out, dy, db);
	if (dx != nullptr)
		product_nn(n, in, out, dy, out, w, in, dx, in);
}

/* ------------------------------------------------- the model's forward */

constexpr cell char_cell{char_dim, char_hidden};
constexpr cell word_cell{word_dim, word_hidden};

/* The char ids of n spellings of one length s, as the char LSTMs take
 * them: s + 2 steps (a boundary, the bytes, a boundary), time-major. */
inline std::vector<int>
spelled(const std::vector<const std::vector<int> *> &spellings)
{
	const std::size_t n = spellings.size(), s = spellings[0]->size();
	std::vector<int> ids((s + 2) * n, 0);
	for (std::size_t b = 0; b < n; b++)
		for (std::size_t t = 0; t < s; t++)
			ids[(t + 1) * n + b] = (*spellings[b])[t];
	return ids;
}

/* A rare word's embedding for n spellings of one length: out (n x 128,
 * leading dimension ldo) = [forward LSTM's last h ; backward's]. */
inline void
spell_forward(const weights &w,
	      const std::vector<const std::vector<int> *> &spellings,
	      float *out, int ldo)
{
	const int n = static_cast<int>(spellings.size()),
		  len = static_cast<int>(spellings[0]->size()) + 2;
	const std::size_t rows = static_cast<std::size_t>(len) * n;
	std::vector<int> ids = spelled(spellings);
	std::vector<float> x(rows * char_dim), gates(rows * 4 * char_hidden),
		c(rows * char_hidden), h(rows * char_hidden);
	gather(w[p_char_embed].data(), char_dim, ids.data(),
	       static_cast<int>(rows), x.data(), char_dim);
	for (int d = 0; d < 2; d++) {
		sequence_forward(char_cell, len, n, d == 1, x.data(),
				 w[d == 0 ? p_char_fwd_w : p_char_bwd_w].data(),
				 w[d == 0 ? p_char_fwd_b : p_char_bwd_b].data(),
				 gates.data(), c.data(), h.data());
		const float *last = h.data() + static_cast<std::size_t>(
						       d == 0 ? len - 1 : 0) *
						       n * char_hidden;
		for (int b = 0; b < n; b++)
			std::copy_n(last + static_cast<std::size_t>(b) *
						    char_hidden,
				    char_hidden,
				    out + static_cast<std::size_t>(b) * ldo +
					    d * char_hidden);
	}
}

/* What a model makes of a set of sentences: mean loss, accuracy, and per
 * tag its tokens and those tagged right. */
struct scores {
	double loss = 0, accuracy = 0;	 /* mean per token; % */
	std::vector<long> tokens, right; /* per tag */
};

/* Tags sentences (each with words, tags and spellings as brown.hpp's)
 * without a graph: sentences of one length go through together, up to 256
 * at a time, their rare words' spellings grouped by length. chars false:
 * rare words take word 0's embedding. */
template <class Sentence>
scores evaluate(const weights &w, const std::vector<Sentence> &sentences,
		bool chars, int n_tags)
{
	constexpr std::size_t chunk = 256;
	scores out;
	out.tokens.assign(static_cast<std::size_t>(n_tags), 0);
	out.right.assign(static_cast<std::size_t>(n_tags), 0);
	std::map<std::size_t, std::vector<int>> by_length;
	for (std::size_t i = 0; i < sentences.size(); i++)
		if (!sentences[i].words.empty())
			by_length[sentences[i].words.size()].push_back(
				static_cast<int>(i));
	double total = 0;
	long seen = 0, right = 0;
	std::vector<float> x, gates, c, hf, hb, feat, m, sc;
	std::vector<int> ids, tags, guess;
	for (const auto &[len_, all] : by_length) {
		const int len = static_cast<int>(len_);
		for (std::size_t first = 0; first < all.size();
		     first += chunk) {
			const int n = static_cast<int>(
				std::min(chunk, all.size() - first));
			const std::size_t rows = len_ * n;
			ids.assign(rows, 0);
			tags.assign(rows, 0);
			x.assign(rows * word_dim, 0.0f);
			std::map<std::size_t,
				 std::vector<const std::vector<int> *>>
				rare;
			std::map<std::size_t, std::vector<std::size_t>> where;
			for (int b = 0; b < n; b++) {
				const Sentence &s = sentences[all[first + b]];
				for (int t = 0; t < len; t++) {
					std::size_t r =
						static_cast<std::size_t>(t) *
							n +
						b;
					ids[r] = s.words[t];
					tags[r] = s.tags[t];
					if (chars && s.words[t] == 0) {
						std::size_t l =
							s.spellings[t].size();
						rare[l].push_back(
							&s.spellings[t]);
						where[l].push_back(r);
					}
				}
			}
			gather(w[p_word_embed].data(), word_dim, ids.data(),
			       static_cast<int>(rows), x.data(), word_dim);
			for (const auto &[l, spellings] : rare) {
				std::vector<float> e(spellings.size() *
						     word_dim);
				spell_forward(w, spellings, e.data(), word_dim);
				for (std::size_t i = 0; i < spellings.size();
				     i++)
					std::copy_n(e.data() + i * word_dim,
						    word_dim,
						    x.data() +
							    where[l][i] *
								    word_dim);
			}
			gates.resize(rows * 4 * word_hidden);
			c.resize(rows * word_hidden);
			hf.resize(rows * word_hidden);
			hb.resize(rows * word_hidden);
			sequence_forward(word_cell, len, n, false, x.data(),
					 w[p_word_fwd_w].data(),
					 w[p_word_fwd_b].data(), gates.data(),
					 c.data(), hf.data());
			sequence_forward(word_cell, len, n, true, x.data(),
					 w[p_word_bwd_w].data(),
					 w[p_word_bwd_b].data(), gates.data(),
					 c.data(), hb.data());
			feat.resize(rows * features);
			for (std::size_t r = 0; r < rows; r++) {
				std::copy_n(hf.data() + r * word_hidden,
					    word_hidden,
					    feat.data() + r * features);
				std::copy_n(hb.data() + r * word_hidden,
					    word_hidden,
					    feat.data() + r * features +
						    word_hidden);
			}
			m.resize(rows * mlp_hidden);
			sc.resize(rows * n_tags);
			guess.resize(rows);
			layer_forward(static_cast<int>(rows), features,
				      mlp_hidden, feat.data(),
				      w[p_mlp_w].data(), w[p_mlp_b].data(),
				      true, m.data());
			layer_forward(static_cast<int>(rows), mlp_hidden,
				      n_tags, m.data(), w[p_out_w].data(),
				      w[p_out_b].data(), false, sc.data());
			total += cross_entropy(static_cast<int>(rows), n_tags,
					       sc.data(), tags.data(), 1,
					       nullptr, guess.data());
			for (std::size_t r = 0; r < rows; r++) {
				out.tokens[tags[r]]++;
				if (guess[r] == tags[r]) {
					out.right[tags[r]]++;
					right++;
				}
			}
			seen += static_cast<long>(rows);
		}
	}
	if (seen > 0) {
		out.loss = total / static_cast<double>(seen);
		out.accuracy = 100.0 * right / static_cast<double>(seen);
	}
	return out;
}

} // namespace lstm

#endif /* EXAMPLES_TAGGER_LSTM_HPP */
