/* Which part of speech is each word of a sentence? dynet-benchmark's
 * BiLSTM tagger with a character model (bilstm-tagger-withchar), trained
 * with libadg's C++ layer (adg.hpp) on the tagged Brown corpus
 * (scripts/fetch-brown.sh fetches it, brown.hpp reads it): the model of
 * lstm.hpp (a known word's embedding of 128, or for a rare word the last
 * states of a character BiLSTM of 64 each way over its bytes; a word
 * BiLSTM of 50 each way; an MLP of 32, tanh; softmax over the tags), by
 * SGD on mini-batches of B sentences, each batch's loss the mean over its
 * tokens, the learning rate falling linearly from --lr over the epochs.
 * --chars off: the plain bilstm-tagger, rare words share <unk>'s
 * embedding.
 *
 * Graphs whose shape comes from the data, nested: a graph's rare words
 * each bring a character BiLSTM, grouped by spelling length (a char
 * embedding op, an op per direction over the group's spellings), whose
 * last states join the known words' embeddings in one op; then an op per
 * direction of the word LSTM over every time step, and an output op (the
 * MLP, the output layer, the loss). --graphs sentence records a graph per
 * sentence; --graphs length (the default) a graph per group of sentences
 * of one length, rows = sentences, so that every product multiplies n
 * rows at once, as DyNet's automatic batching does, and the rare words of
 * a unit's (a batch's) graphs share their char ops, a group per spelling
 * length. The graphs of a batch (or of a work unit) meet only at their
 * summed loss and, by length, at those char ops.
 *
 * Threads train one of three ways, as examples/langid's:
 * - sync (--mode sync, the default): each batch's graphs are dealt, whole,
 *   into ceil(B / --unit-sentences) work units, as many whatever the
 *   thread count; the threads take the units in turn, record each and run
 *   its backward with a gradient reducer's hook (adg::reducer), which sums
 *   each parameter's unit gradients in a fixed tree over unit indices and
 *   applies one SGD step once the round is done: bitwise the same weights
 *   at every thread count.
 * - hogwild: each thread takes whole batches and applies each parameter's
 *   gradient, without a lock, as soon as it is final (on_param_ready).
 * - --models N: N independent models, one per thread, each from its own
 *   seed (seed + its index), sharing one registry.
 *
 * Prints a line per epoch (loss, accuracy on the training tokens as they
 * were tagged during the epoch, on the test files after it, words/s), the
 * accuracy of the most frequent tags on the test files, and the line a
 * script reads: "result mode=M threads=T models=N batch=B chars=on|off
 * epochs=E samples_per_s=X words_per_s=Y test_accuracy=Z weights=HASH"
 * (samples: sentences; words: tokens). --csv writes each epoch's figures;
 * --export writes the setup bench/compare reads (setup.hpp). Usage:
 * tagger [options] DIR, DIR the unpacked corpus (--help lists the
 * options). Exit status 0; 1 on an error or a missed check; 2 on bad
 * usage; 77 when the data is missing and --skip-if-missing is given. */
#include "../jitter.h"
#include "../trainer_cli.hpp"
#include "brown.hpp"
#include "lstm.hpp"
#include "setup.hpp"

#include <adg.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace
{

using lstm::char_dim;
using lstm::char_hidden;
using lstm::features;
using lstm::mlp_hidden;
using lstm::word_dim;
using lstm::word_hidden;

/* ------------------------------------------------------------ gradients */

/* The gradient type of every node: a rows x cols matrix, dense, or sparse
 * (the word embedding's: only the rows of the words a graph has, ids
 * sorted, a row of values each). Every other gradient is dense, so that
 * sums take the same arithmetic however the graphs were dealt: a sum's
 * form depends on its operands alone. */
struct grad {
	int rows = 0, cols = 0;
	bool sparse = false;
	std::vector<int> ids; /* sparse: distinct rows, ascending */
	std::vector<float> v; /* dense: rows x cols; sparse: ids x cols */

	static grad dense(int rows, int cols)
	{
		grad g;
		g.rows = rows;
		g.cols = cols;
		g.v.assign(static_cast<std::size_t>(rows) * cols, 0.0f);
		return g;
	}

	grad &operator+=(const grad &o)
	{
		if (sparse && !o.sparse)
			densify();
		if (!sparse && !o.sparse) {
			for (std::size_t i = 0; i < v.size(); i++)
				v[i] += o.v[i];
		} else if (!sparse) {
			for (std::size_t k = 0; k < o.ids.size(); k++) {
				float *to = v.data() +
					    static_cast<std::size_t>(o.ids[k]) *
						    cols;
				const float *from = o.v.data() + k * cols;
				for (int j = 0; j < cols; j++)
					to[j] += from[j];
			}
		} else {
			merge(o);
		}
		return *this;
	}

	/* Rows [first, last) of o added to the same rows of this, both
	 * dense: a slice of a parameter's fold. The same arithmetic as +=
	 * on those rows. */
	void add_rows(const grad &o, int first, int last)
	{
		std::size_t from = static_cast<std::size_t>(first) * cols,
			    to = static_cast<std::size_t>(last) * cols;
		for (std::size_t i = from; i < to; i++)
			v[i] += o.v[i];
	}

private:
	void densify()
	{
		std::vector<float> d(static_cast<std::size_t>(rows) * cols);
		for (std::size_t k = 0; k < ids.size(); k++)
			std::copy_n(v.data() + k * cols, cols,
				    d.data() +
					    static_cast<std::size_t>(ids[k]) *
						    cols);
		v = std::move(d);
		ids.clear();
		sparse = false;
	}

	/* Two sparse gradients' rows merged by id; a row both hold is added
	 * (this + o), the others copied. */
	void merge(const grad &o)
	{
		std::vector<int> m;
		std::vector<float> w;
		m.reserve(ids.size() + o.ids.size());
		w.reserve(v.size() + o.v.size());
		std::size_t i = 0, j = 0;
		const std::size_t c = static_cast<std::size_t>(cols);
		while (i < ids.size() || j < o.ids.size()) {
			if (j == o.ids.size() ||
			    (i < ids.size() && ids[i] < o.ids[j])) {
				m.push_back(ids[i]);
				w.insert(w.end(), v.begin() + i * c,
					 v.begin() + (i + 1) * c);
				i++;
			} else if (i == ids.size() || o.ids[j] < ids[i]) {
				m.push_back(o.ids[j]);
				w.insert(w.end(), o.v.begin() + j * c,
					 o.v.begin() + (j + 1) * c);
				j++;
			} else {
				m.push_back(ids[i]);
				for (std::size_t k = 0; k < c; k++)
					w.push_back(v[i * c + k] +
						    o.v[j * c + k]);
				i++;
				j++;
			}
		}
		ids = std::move(m);
		v = std::move(w);
	}
};

grad scalar(float x)
{
	grad g = grad::dense(1, 1);
	g.v[0] = x;
	return g;
}

} // namespace

/* The loss's seed, 1 as a 1 x 1 grad: adg::backward<grad>(loss). */
template <> struct adg::one<grad> {
	static grad value()
	{
		return scalar(1);
	}
};

namespace
{

/* ---------------------------------------------------------------- model */

/* A model's parameters, shared by the threads that train it: their values
 * as relaxed atomics, so that Hogwild's updates without a lock may be
 * lost, as Hogwild allows, but are never a data race; and the leaves that
 * stand for them in every graph. A thread copies the dense parameters
 * before each batch (the kernels, BLAS, read the copy) and reads the word
 * embedding's rows its graphs need straight from here; in sync the
 * reducer's barrier orders the updates before the next batch's reads. */
struct model {
	lstm::sizes sizes;
	std::array<std::size_t, lstm::n_params> elements{};
	std::array<std::unique_ptr<std::atomic<float>[]>, lstm::n_params>
		values;
	std::vector<adg::node> leaves;

	model(adg::registry &reg, const lstm::sizes &s,
	      const lstm::weights &initial)
	    : sizes(s)
	{
		auto shapes = lstm::shapes(s);
		for (int p = 0; p < lstm::n_params; p++) {
			elements[p] = initial[p].size();
			values[p].reset(new std::atomic<float>[elements[p]]);
			for (std::size_t i = 0; i < elements[p]; i++)
				values[p][i].store(initial[p][i],
						   std::memory_order_relaxed);
			leaves.push_back(adg::leaf(reg, shapes[p].name));
		}
	}

	void copy_to(lstm::weights &w, bool with_words = true) const
	{
		for (int p = 0; p < lstm::n_params; p++) {
			if (p == lstm::p_word_embed && !with_words)
				continue;
			w[p].resize(elements[p]);
			for (std::size_t i = 0; i < elements[p]; i++)
				w[p][i] = values[p][i].load(
					std::memory_order_relaxed);
		}
	}

	/* Row `row` of the word embedding into out (word_dim floats). */
	void word_row(int row, float *out) const
	{
		const std::atomic<float> *v =
			values[lstm::p_word_embed].get() +
			static_cast<std::size_t>(row) * word_dim;
		for (int j = 0; j < word_dim; j++)
			out[j] = v[j].load(std::memory_order_relaxed);
	}

	/* One SGD step on parameter p: value -= lr * g, on g's rows only
	 * when it is sparse. */
	void sgd(int p, const grad &g, float lr)
	{
		if (!g.sparse) {
			sgd_rows(p, g, lr, 0, g.rows);
			return;
		}
		const std::size_t c = static_cast<std::size_t>(g.cols);
		for (std::size_t k = 0; k < g.ids.size(); k++) {
			std::atomic<float> *v =
				values[p].get() +
				static_cast<std::size_t>(g.ids[k]) * c;
			for (std::size_t j = 0; j < c; j++)
				v[j].store(
					v[j].load(std::memory_order_relaxed) -
						lr * g.v[k * c + j],
					std::memory_order_relaxed);
		}
	}

	/* The step on rows [first, last) of dense parameter p: a slice. */
	void sgd_rows(int p, const grad &g, float lr, int first, int last)
	{
		std::size_t from = static_cast<std::size_t>(first) * g.cols,
			    to = static_cast<std::size_t>(last) * g.cols;
		std::atomic<float> *v = values[p].get();
		for (std::size_t i = from; i < to; i++)
			v[i].store(v[i].load(std::memory_order_relaxed) -
					   lr * g.v[i],
				   std::memory_order_relaxed);
	}
};

/* ------------------------------------------------------------ recording */

/* Bump allocation for one batch's (or unit's) forward values and backward
 * scratch, which the steps' closures point into: reset once its graphs
 * are gone, so that a batch calls malloc only while the first ones find
 * the size (examples/langid's). */
class arena
{
public:
	template <class T> T *make(std::size_t n)
	{
		static_assert(std::is_trivially_destructible_v<T>);
		std::size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
		if (blocks_.empty() || used_ + bytes > size_) {
			size_ = std::max<std::size_t>(bytes, 1 << 20);
			blocks_.emplace_back(new char[size_]);
			used_ = 0;
		}
		T *p = reinterpret_cast<T *>(blocks_.back().get() + used_);
		used_ += bytes;
		total_ += bytes;
		return p;
	}
	void reset()
	{
		if (blocks_.size() > 1) {
			blocks_.clear();
			size_ = total_;
			blocks_.emplace_back(new char[size_]);
		}
		used_ = total_ = 0;
	}

private:
	std::vector<std::unique_ptr<char[]>> blocks_;
	std::size_t size_ = 0, used_ = 0, total_ = 0;
};

enum class graphs { sentence, length };

using brown::sentence;

/* A batch's sentences, ids[0..n) of set, as its graphs take them: one
 * each, or one group per length, shortest first, each group's sentences
 * in the batch's order. */
std::vector<std::vector<int>>
split_into_graphs(const std::vector<sentence> &set, const int *ids, int n,
		  graphs how)
{
	std::vector<std::vector<int>> groups;
	if (how == graphs::sentence) {
		for (int i = 0; i < n; i++)
			groups.push_back({ids[i]});
		return groups;
	}
	std::vector<int> sorted(ids, ids + n);
	auto length = [&](int i) { return set[i].words.size(); };
	std::stable_sort(sorted.begin(), sorted.end(),
			 [&](int x, int y) { return length(x) < length(y); });
	for (int i = 0, j; i < n; i = j) {
		for (j = i + 1; j < n && length(sorted[j]) == length(sorted[i]);
		     j++)
			;
		groups.emplace_back(&sorted[i], &sorted[j]);
	}
	return groups;
}

/* A graph's work, in about a token's word-LSTM step each: its length
 * times its sentences plus 2 (a step's own cost), and 3/5 of that per
 * step of a rare word's spelling (a char step of both directions costs
 * about 0.6 of a word step). */
long work_of(const std::vector<sentence> &set, const std::vector<int> &g,
	     bool chars)
{
	long len = static_cast<long>(set[g[0]].words.size());
	long w = 5 * len * static_cast<long>(g.size() + 2);
	if (chars)
		for (int i : g)
			for (std::size_t t = 0; t < set[i].words.size(); t++)
				if (set[i].words[t] == 0)
					w += 3 * static_cast<long>(
							 set[i].spellings[t]
								 .size() +
							 2);
	return w;
}

/* A batch's graphs dealt into parts, as langid deals them: whole graphs,
 * the most work first, each to the part with the least work so far (the
 * lowest index on a tie), each part's then kept in the batch's order; a
 * part may get none. It depends on the batch and parts alone, whatever
 * the timing: with sync's units as the parts, part of what makes a
 * round's sums the same at every T. */
std::vector<std::vector<std::vector<int>>>
deal(const std::vector<sentence> &set, std::vector<std::vector<int>> groups,
     int parts, bool chars)
{
	std::vector<std::vector<std::vector<int>>> dealt(
		static_cast<std::size_t>(parts));
	if (parts == 1) {
		dealt[0] = std::move(groups);
		return dealt;
	}
	std::vector<long> work(groups.size());
	std::vector<int> by_work(groups.size());
	for (std::size_t i = 0; i < groups.size(); i++) {
		work[i] = work_of(set, groups[i], chars);
		by_work[i] = static_cast<int>(i);
	}
	std::stable_sort(by_work.begin(), by_work.end(),
			 [&](int x, int y) { return work[x] > work[y]; });
	std::vector<long> load(static_cast<std::size_t>(parts));
	std::vector<int> part_of(groups.size());
	for (int g : by_work) {
		int least = static_cast<int>(
			std::min_element(load.begin(), load.end()) -
			load.begin());
		load[least] += work[g];
		part_of[g] = least;
	}
	for (std::size_t i = 0; i < groups.size(); i++)
		dealt[part_of[i]].push_back(std::move(groups[i]));
	return dealt;
}

/* One thread's recording of graphs for one model: the copy of the dense
 * weights its kernels read, the arena of its forward values, and the
 * loss and right tags since the last take, for the epoch's figures. */
class learner
{
public:
	/* share_spellings: the graphs of one record share their rare
	 * words' char ops (graphs by length) or have their own (graphs by
	 * sentence). */
	learner(adg::registry &reg, const model &m, bool chars,
		bool share_spellings)
	    : reg_(reg), model_(m), chars_(chars),
	      share_spellings_(share_spellings), n_tags_(m.sizes.tags)
	{
	}

	/* Records one graph per group of sentences of set, joined by their
	 * loss: the sum of their tokens' cross-entropies over tokens, the
	 * batch's. An empty node when there is no group. Reads the weights
	 * as refresh copied them last; with fresh, copies them first. */
	adg::node record(const std::vector<sentence> &set,
			 const std::vector<std::vector<int>> &groups,
			 long tokens, bool fresh = true)
	{
		mem_.reset(); /* the last batch's (unit's) graphs are gone */
		if (fresh)
			refresh();
		if (groups.empty())
			return adg::node();
		std::vector<adg::node> losses;
		float scale = 1.0f / static_cast<float>(tokens);
		/* With graphs by length, the rare words of all of them share
		 * the char LSTMs' ops, a group per spelling length: more rows
		 * to each product. A graph per sentence spells its own. */
		spellings all;
		if (chars_ && share_spellings_)
			all = spell(set, groups, 0, groups.size());
		for (std::size_t g = 0; g < groups.size(); g++) {
			spellings own;
			if (chars_ && !share_spellings_)
				own = spell(set, groups, g, g + 1);
			const spellings &s = share_spellings_ ? all : own;
			static const std::vector<rare_word> none;
			const std::vector<rare_word> &rare =
				s.per_graph.empty()
					? none
					: s.per_graph[share_spellings_ ? g : 0];
			losses.push_back(record_group(set, groups[g], scale,
						      s.groups, rare));
		}
		return adg::op(
			reg_, losses,
			[](adg::step_call<grad> &c) {
				for (std::size_t i = 0; i < c.n_parents(); i++)
					c.give(i, scalar(c.grad()->v[0]));
			},
			"sum");
	}

	/* Copies the dense weights that record's kernels read: once a round
	 * in sync, whose units all read the round's weights. */
	void refresh()
	{
		model_.copy_to(w_, false);
	}

	struct tally {
		double loss = 0;
		long tokens = 0, right = 0;
	};
	tally take()
	{
		tally t = tally_;
		tally_ = tally();
		return t;
	}

private:
	adg::registry &reg_;
	const model &model_;
	const bool chars_, share_spellings_;
	const int n_tags_;
	lstm::weights w_;
	arena mem_;
	std::vector<float> zeros_;
	tally tally_;

	float *floats(std::size_t n)
	{
		return mem_.make<float>(n);
	}

	const adg::node &leaf(int p) const
	{
		return model_.leaves[p];
	}

	const float *weight(int p) const
	{
		return w_[p].data();
	}

	/* A node's gradient as dense rows x cols: zeros when no child gave
	 * one. */
	const float *dense(const grad *g, std::size_t n)
	{
		if (g != nullptr)
			return g->v.data();
		zeros_.assign(n, 0.0f);
		return zeros_.data();
	}

	/* The ops of one direction of an LSTM over len steps of n rows, x
	 * (len*n x in) from node xs: all of its hidden states (h, len*n x
	 * H) or, with last_only, the last one's only (n x H). Returns the
	 * node; *h_out the states. */
	adg::node record_lstm(const lstm::cell &k, int len, int n, bool reverse,
			      const float *x, const adg::node &xs, int p_w,
			      bool last_only, const float **h_out)
	{
		const std::size_t rows = static_cast<std::size_t>(len) * n;
		float *gates = floats(rows * k.gates());
		float *c = floats(rows * k.hidden);
		float *h = floats(rows * k.hidden);
		const float *w = weight(p_w);
		lstm::sequence_forward(k, len, n, reverse, x, w,
				       weight(p_w + 1), gates, c, h);
		*h_out = last_only ? h + static_cast<std::size_t>(
						 reverse ? 0 : len - 1) *
						     n * k.hidden
				   : h;
		learner *self = this; /* the steps run on this thread */
		return adg::op(
			reg_, {xs, leaf(p_w), leaf(p_w + 1)},
			[self, k, len, n, reverse, x, w, gates, c, h, rows,
			 last_only](adg::step_call<grad> &call) {
				const float *dh = self->dense(
					call.grad(),
					(last_only ? static_cast<std::size_t>(n)
						   : rows) *
						k.hidden);
				float *dz = self->floats(rows * k.gates());
				grad dx = grad::dense(static_cast<int>(rows),
						      k.in);
				grad dw = grad::dense(k.gates(), k.cols());
				grad db = grad::dense(1, k.gates());
				lstm::sequence_backward(
					k, len, n, reverse, x, w, gates, c, h,
					last_only ? nullptr : dh,
					last_only ? dh : nullptr, dz,
					dx.v.data(), dw.v.data(), db.v.data());
				call.give(0, std::move(dx));
				call.give(1, std::move(dw));
				call.give(2, std::move(db));
			},
			reverse ? "lstm bwd" : "lstm fwd");
	}

	/* m rare words' spellings of one length s: their char embeddings
	 * (an op), and a char LSTM each way over boundary, bytes, boundary
	 * (an op each), whose last states are the words' embeddings. */
	struct spelled {
		adg::node fwd, bwd;
		const float *h_fwd, *h_bwd; /* m x 64 each */
		int m;
	};
	/* A rare word of a graph: its row there, and where it is spelled:
	 * row i of spelled group k. */
	struct rare_word {
		std::size_t row;
		int k, i;
	};
	/* The spelled groups of some graphs, and each graph's rare words. */
	struct spellings {
		std::vector<spelled> groups;
		std::vector<std::vector<rare_word>> per_graph;
	};

	/* The rare words of graphs [first, last) of groups, spelled in a
	 * group per spelling length, shortest first, each group's words in
	 * the graphs' order, then row order. */
	spellings spell(const std::vector<sentence> &set,
			const std::vector<std::vector<int>> &groups,
			std::size_t first, std::size_t last)
	{
		std::map<std::size_t,
			 std::vector<std::pair<std::size_t, std::size_t>>>
			by_length; /* (graph, row) */
		for (std::size_t g = first; g < last; g++) {
			const std::vector<int> &group = groups[g];
			const std::size_t n = group.size(),
					  len = set[group[0]].words.size();
			for (std::size_t r = 0; r < len * n; r++) {
				const sentence &s = set[group[r % n]];
				if (s.words[r / n] == 0)
					by_length[s.spellings[r / n].size()]
						.push_back({g, r});
			}
		}
		spellings out;
		out.per_graph.resize(last - first);
		std::vector<const std::vector<int> *> sp;
		for (const auto &[length, words] : by_length) {
			sp.clear();
			int k = static_cast<int>(out.groups.size()), i = 0;
			for (const auto &[g, r] : words) {
				const std::size_t n = groups[g].size();
				sp.push_back(&set[groups[g][r % n]]
						      .spellings[r / n]);
				out.per_graph[g - first].push_back({r, k, i++});
			}
			out.groups.push_back(record_spelling(sp));
		}
		return out;
	}

	spelled record_spelling(const std::vector<const std::vector<int> *> &sp)
	{
		const int m = static_cast<int>(sp.size());
		const int len = static_cast<int>(sp[0]->size()) + 2;
		const std::size_t crow = static_cast<std::size_t>(len) * m;
		int *ids = mem_.make<int>(crow);
		std::fill_n(ids, crow, 0); /* the boundaries */
		for (int b = 0; b < m; b++)
			for (int t = 0; t + 2 < len; t++)
				ids[static_cast<std::size_t>(t + 1) * m + b] =
					(*sp[b])[t];
		float *x = floats(crow * char_dim);
		lstm::gather(weight(lstm::p_char_embed), char_dim, ids,
			     static_cast<int>(crow), x, char_dim);
		const int n_chars = model_.sizes.chars;
		learner *self = this;
		adg::node xs = adg::op(
			reg_, {leaf(lstm::p_char_embed)},
			[self, ids, crow, n_chars](adg::step_call<grad> &c) {
				grad d = grad::dense(n_chars, char_dim);
				lstm::scatter_add(
					self->dense(c.grad(), crow * char_dim),
					char_dim, ids, static_cast<int>(crow),
					char_dim, d.v.data());
				c.give(0, std::move(d));
			},
			"chars");
		spelled s;
		s.m = m;
		s.fwd = record_lstm(lstm::char_cell, len, m, false, x, xs,
				    lstm::p_char_fwd_w, true, &s.h_fwd);
		s.bwd = record_lstm(lstm::char_cell, len, m, true, x, xs,
				    lstm::p_char_bwd_w, true, &s.h_bwd);
		return s;
	}

	/* One graph: the loss of the sentences ids of set (one length),
	 * times scale. */
	adg::node record_group(const std::vector<sentence> &set,
			       const std::vector<int> &group, float scale,
			       const std::vector<spelled> &spelled_groups,
			       const std::vector<rare_word> &rare)
	{
		const int n = static_cast<int>(group.size());
		const int len = static_cast<int>(set[group[0]].words.size());
		const std::size_t rows = static_cast<std::size_t>(len) * n;
		int *word = mem_.make<int>(rows);
		int *tag = mem_.make<int>(rows);
		for (int b = 0; b < n; b++) {
			const sentence &s = set[group[b]];
			for (int t = 0; t < len; t++) {
				std::size_t r =
					static_cast<std::size_t>(t) * n + b;
				word[r] = s.words[t];
				tag[r] = s.tags[t];
			}
		}

		/* The inputs: the known words' embeddings (and with chars
		 * off the rare ones', <unk>'s), then the spelled words'. */
		float *x = floats(rows * word_dim);
		for (std::size_t r = 0; r < rows; r++)
			if (!chars_ || word[r] != 0)
				model_.word_row(word[r], x + r * word_dim);
		/* The spelled groups this graph takes words of, as slots of
		 * the words op: slot[k] is group k's place among them. */
		std::vector<int> slot(spelled_groups.size(), -1);
		std::vector<adg::node_ref> parents{leaf(lstm::p_word_embed)};
		std::vector<int> used;
		for (const rare_word &w : rare) {
			if (slot[w.k] < 0) {
				slot[w.k] = static_cast<int>(used.size());
				used.push_back(w.k);
				parents.push_back(spelled_groups[w.k].fwd);
				parents.push_back(spelled_groups[w.k].bwd);
			}
			const spelled &s = spelled_groups[w.k];
			std::size_t i = static_cast<std::size_t>(w.i);
			float *to = x + w.row * word_dim;
			std::copy_n(s.h_fwd + i * char_hidden, char_hidden, to);
			std::copy_n(s.h_bwd + i * char_hidden, char_hidden,
				    to + char_hidden);
		}
		/* What the words op's backward needs: each used group's
		 * size, and each rare word's row, slot and row there. */
		const std::size_t n_used = used.size(), n_rare = rare.size();
		int *sizes = mem_.make<int>(n_used);
		for (std::size_t j = 0; j < n_used; j++)
			sizes[j] = spelled_groups[used[j]].m;
		rare_word *at = mem_.make<rare_word>(n_rare);
		for (std::size_t j = 0; j < n_rare; j++)
			at[j] = {rare[j].row, slot[rare[j].k], rare[j].i};
		const bool chars = chars_;
		const int n_words = model_.sizes.words;
		learner *self = this;
		adg::node xs = adg::op(
			reg_, parents,
			[self, rows, word, chars, n_words, sizes, n_used, at,
			 n_rare](adg::step_call<grad> &c) {
				const float *dx =
					self->dense(c.grad(), rows * word_dim);
				c.give(0, embedding_grad(dx, word, rows, chars,
							 n_words));
				std::vector<grad> f, b;
				for (std::size_t j = 0; j < n_used; j++) {
					f.push_back(grad::dense(sizes[j],
								char_hidden));
					b.push_back(grad::dense(sizes[j],
								char_hidden));
				}
				for (std::size_t j = 0; j < n_rare; j++) {
					const float *from =
						dx + at[j].row * word_dim;
					std::size_t i =
						static_cast<std::size_t>(
							at[j].i);
					std::copy_n(from, char_hidden,
						    f[at[j].k].v.data() +
							    i * char_hidden);
					std::copy_n(from + char_hidden,
						    char_hidden,
						    b[at[j].k].v.data() +
							    i * char_hidden);
				}
				for (std::size_t j = 0; j < n_used; j++) {
					c.give(1 + 2 * j, std::move(f[j]));
					c.give(2 + 2 * j, std::move(b[j]));
				}
			},
			"words");

		/* The word LSTM both ways, every step's state. */
		const float *hf, *hb;
		adg::node fwd = record_lstm(lstm::word_cell, len, n, false, x,
					    xs, lstm::p_word_fwd_w, false, &hf);
		adg::node bwd = record_lstm(lstm::word_cell, len, n, true, x,
					    xs, lstm::p_word_bwd_w, false, &hb);
		return record_output(fwd, bwd, hf, hb, rows, tag, scale);
	}

	/* The word embedding's gradient: row r of dx added to the row of
	 * word[r], for the rows that took one (all with chars off; the
	 * known words' with them on), rows of one word in row order. */
	static grad embedding_grad(const float *dx, const int *word,
				   std::size_t rows, bool chars, int n_words)
	{
		std::vector<std::pair<int, std::size_t>> taken;
		for (std::size_t r = 0; r < rows; r++)
			if (!chars || word[r] != 0)
				taken.push_back({word[r], r});
		std::sort(taken.begin(), taken.end());
		grad g;
		g.rows = n_words;
		g.cols = word_dim;
		g.sparse = true;
		for (const auto &[id, r] : taken) {
			if (g.ids.empty() || g.ids.back() != id) {
				g.ids.push_back(id);
				g.v.resize(g.v.size() + word_dim, 0.0f);
			}
			float *to = g.v.data() + g.v.size() - word_dim;
			for (int j = 0; j < word_dim; j++)
				to[j] += dx[r * word_dim + j];
		}
		return g;
	}

	/* The MLP, the output layer and the loss of a graph's rows, times
	 * scale; counts the loss and the right tags. */
	adg::node record_output(const adg::node &fwd, const adg::node &bwd,
				const float *hf, const float *hb,
				std::size_t rows, const int *tag, float scale)
	{
		const int T = n_tags_, r = static_cast<int>(rows);
		float *feat = floats(rows * features);
		for (std::size_t i = 0; i < rows; i++) {
			std::copy_n(hf + i * word_hidden, word_hidden,
				    feat + i * features);
			std::copy_n(hb + i * word_hidden, word_hidden,
				    feat + i * features + word_hidden);
		}
		float *m = floats(rows * mlp_hidden);
		float *scores = floats(rows * T);
		const float *mlp_w = weight(lstm::p_mlp_w),
			    *out_w = weight(lstm::p_out_w);
		lstm::layer_forward(r, features, mlp_hidden, feat, mlp_w,
				    weight(lstm::p_mlp_b), true, m);
		lstm::layer_forward(r, mlp_hidden, T, m, out_w,
				    weight(lstm::p_out_b), false, scores);
		float *dscores = floats(rows * T);
		int *guess = mem_.make<int>(rows);
		tally_.loss += lstm::cross_entropy(r, T, scores, tag, scale,
						   dscores, guess);
		tally_.tokens += r;
		for (std::size_t i = 0; i < rows; i++)
			tally_.right += guess[i] == tag[i];
		learner *self = this;
		return adg::op(
			reg_,
			{fwd, bwd, leaf(lstm::p_mlp_w), leaf(lstm::p_mlp_b),
			 leaf(lstm::p_out_w), leaf(lstm::p_out_b)},
			[self, r, T, feat, m, dscores, mlp_w,
			 out_w](adg::step_call<grad> &c) {
				const std::size_t rows_ =
					static_cast<std::size_t>(r);
				float seed = c.grad()->v[0];
				for (std::size_t i = 0; i < rows_ * T; i++)
					dscores[i] *= seed;
				float *dm = self->floats(rows_ * mlp_hidden);
				float *dfeat = self->floats(rows_ * features);
				grad dow = grad::dense(T, mlp_hidden);
				grad dob = grad::dense(1, T);
				lstm::layer_backward(r, mlp_hidden, T, m, out_w,
						     nullptr, false, dscores,
						     dow.v.data(), dob.v.data(),
						     dm);
				grad dmw = grad::dense(mlp_hidden, features);
				grad dmb = grad::dense(1, mlp_hidden);
				lstm::layer_backward(r, features, mlp_hidden,
						     feat, mlp_w, m, true, dm,
						     dmw.v.data(), dmb.v.data(),
						     dfeat);
				grad dhf = grad::dense(r, word_hidden);
				grad dhb = grad::dense(r, word_hidden);
				for (std::size_t i = 0; i < rows_; i++) {
					std::copy_n(dfeat + i * features,
						    word_hidden,
						    dhf.v.data() +
							    i * word_hidden);
					std::copy_n(dfeat + i * features +
							    word_hidden,
						    word_hidden,
						    dhb.v.data() +
							    i * word_hidden);
				}
				c.give(0, std::move(dhf));
				c.give(1, std::move(dhb));
				c.give(2, std::move(dmw));
				c.give(3, std::move(dmb));
				c.give(4, std::move(dow));
				c.give(5, std::move(dob));
			},
			"output");
	}
};

/* ----------------------------------------------------------------- runs */

enum class mode { sync, hogwild, models };

const char *mode_name(mode m)
{
	switch (m) {
	case mode::sync:
		return "sync";
	case mode::hogwild:
		return "hogwild";
	default:
		return "models";
	}
}

/* Sync's sentences per unit, by default: a batch of B sentences is
 * ceil(B / 16) units, so the default batch of 32 is two units (one per
 * thread at T = 2) and B = 256 sixteen. Each unit costs a backward of its
 * own and a fold of its dense gradient (about 140,000 floats). */
constexpr int default_unit_sentences = 16;

struct options {
	std::string data, csv, export_dir;
	std::vector<int> threads{1};
	mode how = mode::sync;
	graphs shape = graphs::length;
	bool chars = true;
	int models = 1, batch = 32, epochs = 3, subset = 0, test_subset = 0;
	int unit_sentences = default_unit_sentences;
	int top_tags = 12;
	double lr = 4.0; /* B = 32: 95% after 3 epochs (docs/trainers.md) */
	std::uint64_t seed = 1;
	double min_test_accuracy = -1;
	bool same_weights = false, skip_if_missing = false, check = false;
};

struct outcome {
	double samples_per_s = 0, words_per_s = 0, per_model_words_per_s = 0;
	double accuracy = 0; /* % on the test tokens, mean over the models */
	std::uint64_t hash = 0;
	lstm::scores first; /* the first model's, on the test files */
};

using cli::on_threads;
using cli::rows_of;
using cli::seconds_since;

const char *graphs_name(graphs g)
{
	return g == graphs::sentence ? "sentence" : "length";
}

/* The accuracy of the most frequent tags of the test files. */
void print_tags(const lstm::scores &s, const brown::corpus &c, int top,
		bool several)
{
	std::vector<int> by_count(c.tags.size());
	std::iota(by_count.begin(), by_count.end(), 0);
	std::stable_sort(by_count.begin(), by_count.end(), [&](int x, int y) {
		return s.tokens[x] > s.tokens[y];
	});
	long all = std::accumulate(s.tokens.begin(), s.tokens.end(), 0L);
	std::printf("per-tag accuracy on the test files%s, the %d most "
		    "frequent tags:\n",
		    several ? " (the first model)" : "", top);
	for (int i = 0; i < top && i < static_cast<int>(by_count.size()); i++) {
		int t = by_count[i];
		if (s.tokens[t] == 0)
			break;
		std::printf("  %-6s %7ld tokens (%5.2f%%)  %6.2f%% right\n",
			    c.tags[t].c_str(), s.tokens[t],
			    100.0 * s.tokens[t] / static_cast<double>(all),
			    100.0 * s.right[t] /
				    static_cast<double>(s.tokens[t]));
	}
}

/* Trains from scratch with o's settings on n_threads threads; prints a
 * line per epoch (and writes it to csv unless null), the per-tag
 * accuracy and the result line. */
outcome train(const options &o, int n_threads, const brown::corpus &corpus,
	      const std::vector<sentence> &train_set,
	      const std::vector<sentence> &test_set, std::FILE *csv)
{
	const int n_models = o.how == mode::models ? n_threads : 1;
	const int n = static_cast<int>(train_set.size());
	const int n_batches = (n + o.batch - 1) / o.batch;
	const lstm::sizes sizes{static_cast<int>(corpus.words.size()),
				static_cast<int>(corpus.chars.size()),
				static_cast<int>(corpus.tags.size())};
	long tokens = 0;
	for (const sentence &s : train_set)
		tokens += static_cast<long>(s.words.size());
	/* Declared first: the leaves in the models must go before it. */
	adg::registry reg;
	std::vector<std::unique_ptr<model>> models;
	for (int m = 0; m < n_models; m++)
		models.push_back(std::make_unique<model>(
			reg, sizes, lstm::initial_weights(sizes, o.seed + m)));
	std::vector<std::unique_ptr<learner>> learners;
	for (int t = 0; t < n_threads; t++)
		learners.push_back(std::make_unique<learner>(
			reg, *models[o.how == mode::models ? t : 0], o.chars,
			o.shape == graphs::length));

	/* Written by this thread between epochs, read by the workers. */
	float lr = 0;
	std::vector<std::vector<int>> order(static_cast<std::size_t>(n_models));

	/* Sync: the reducer sums each parameter's unit gradients in a tree
	 * over unit indices and applies them once per batch, when every
	 * thread has ended it (all or nothing). The large dense parameters
	 * are cut into slices of rows, which the threads at the batch's end
	 * fold and apply side by side; that changes no bit (dense rows add
	 * alike in slices or not). The word embedding, sparse, is whole. */
	const int n_units = (o.batch + o.unit_sentences - 1) / o.unit_sentences;
	std::unique_ptr<adg::reducer<grad>> red;
	if (o.how == mode::sync) {
		adg::reducer_options<grad> ro;
		ro.units = static_cast<std::size_t>(n_units);
		for (int p = 0; p < lstm::n_params; p++)
			ro.slices.push_back(
				n_threads > 1 && p != lstm::p_word_embed &&
						models[0]->elements[p] >= 4096
					? 2 * std::size_t(n_threads)
					: 1);
		ro.add_slice = [](grad &sum, const grad &value, std::size_t k,
				  std::size_t n_slices) {
			auto [first, last] = rows_of(sum.rows, k, n_slices);
			sum.add_rows(value, first, last);
		};
		red = std::make_unique<adg::reducer<grad>>(
			static_cast<std::size_t>(n_threads), models[0]->leaves,
			[&](const adg::reduction<grad> &r) {
				if (r.sum == nullptr)
					return;
				int p = static_cast<int>(r.param);
				if (r.n_slices == 1) {
					models[0]->sgd(p, *r.sum, lr);
					return;
				}
				auto [first, last] = rows_of(
					r.sum->rows, r.slice, r.n_slices);
				models[0]->sgd_rows(p, *r.sum, lr, first, last);
			},
			std::move(ro));
	}

	/* Hogwild: the next batch to take. Relaxed: a counter that hands
	 * out batch numbers and publishes nothing (the order was published
	 * by the threads' start). */
	std::atomic<int> next{0};
	auto batch_of = [&](int m, int k) {
		int first = k * o.batch;
		int size = std::min(o.batch, n - first);
		long t = 0;
		for (int i = 0; i < size; i++)
			t += static_cast<long>(
				train_set[order[m][first + i]].words.size());
		return std::make_pair(split_into_graphs(train_set,
							&order[m][first], size,
							o.shape),
				      t);
	};
	auto one_thread = [&](int t) {
		learner &l = *learners[t];
		if (o.how == mode::sync) {
			adg::backward_options plain;
			plain.leaves_only = true;
			const adg::backward_options hooked =
				red->hook(t, plain);
			for (int k = 0; k < n_batches; k++) {
				auto [groups, batch_tokens] = batch_of(0, k);
				auto dealt = deal(train_set, std::move(groups),
						  n_units, o.chars);
				/* Every unit reads the round's weights. */
				l.refresh();
				red->round(t, [&, batch_tokens = batch_tokens](
						      std::size_t u) {
					jitter_pause(); /* tests' interleavings
							 */
					adg::node loss =
						l.record(train_set, dealt[u],
							 batch_tokens, false);
					/* A unit with no graph gives none. */
					if (loss)
						adg::backward<grad>(loss,
								    hooked);
				});
			}
			return;
		}
		/* Each of --models takes every batch of its own order. */
		int m = o.how == mode::models ? t : 0, mine = 0;
		model &mm = *models[m];
		adg::backward_options b;
		b.on_param_ready(
			mm.leaves, [&mm, &lr](std::size_t p, adg::grad_ref g) {
				mm.sgd(static_cast<int>(p), *g.as<grad>(), lr);
			});
		for (;;) {
			int k = o.how == mode::models
					? mine++
					: next.fetch_add(
						  1, std::memory_order_relaxed);
			if (k >= n_batches)
				break;
			auto [groups, batch_tokens] = batch_of(m, k);
			adg::node loss =
				l.record(train_set, groups, batch_tokens);
			adg::backward<grad>(loss, b);
		}
	};

	outcome out;
	double trained = 0;
	for (int e = 0; e < o.epochs; e++) {
		lr = lstm::learning_rate(o.lr, o.epochs, e);
		for (int m = 0; m < n_models; m++)
			order[m] = lstm::shuffled(n, o.seed + m, e);
		next.store(0, std::memory_order_relaxed);
		auto start = std::chrono::steady_clock::now();
		on_threads(n_threads, one_thread);
		double took = seconds_since(start);
		trained += took;

		learner::tally sum;
		for (auto &l : learners) {
			learner::tally t = l->take();
			sum.loss += t.loss;
			sum.tokens += t.tokens;
			sum.right += t.right;
		}
		double accuracy = 0, test_loss = 0;
		for (int m = 0; m < n_models; m++) {
			lstm::weights w;
			models[m]->copy_to(w);
			lstm::scores s = lstm::evaluate(w, test_set, o.chars,
							sizes.tags);
			accuracy += s.accuracy / n_models;
			test_loss += s.loss / n_models;
			if (m == 0)
				out.first = std::move(s);
		}
		double train_loss = sum.loss / static_cast<double>(sum.tokens);
		double train_accuracy =
			100.0 * sum.right / static_cast<double>(sum.tokens);
		double rate = static_cast<double>(tokens) * n_models / took;
		std::printf("T=%d %s graphs=%s chars=%s epoch %2d  %7.1f s  "
			    "loss %.4f  train %6.2f%%  test loss %.4f  test "
			    "%6.2f%%  %8.0f words/s\n",
			    n_threads, mode_name(o.how), graphs_name(o.shape),
			    o.chars ? "on" : "off", e + 1, trained, train_loss,
			    train_accuracy, test_loss, accuracy, rate);
		std::fflush(stdout);
		if (csv != nullptr)
			std::fprintf(csv,
				     "%s,%d,%d,%s,%s,%d,%d,%.3f,%.6f,%.4f,%."
				     "6f,%.4f,%.1f\n",
				     mode_name(o.how), n_threads, n_models,
				     graphs_name(o.shape),
				     o.chars ? "on" : "off", o.batch, e + 1,
				     trained, train_loss, train_accuracy,
				     test_loss, accuracy, rate);
		out.accuracy = accuracy;
	}
	out.samples_per_s =
		static_cast<double>(n) * n_models * o.epochs / trained;
	out.words_per_s =
		static_cast<double>(tokens) * n_models * o.epochs / trained;
	out.per_model_words_per_s = out.words_per_s / n_models;
	std::uint64_t hash = 0xcbf29ce484222325u;
	for (auto &m : models) {
		lstm::weights w;
		m->copy_to(w);
		hash = lstm::fingerprint(w, hash);
	}
	out.hash = hash;
	print_tags(out.first, corpus, o.top_tags, n_models > 1);
	std::printf("result mode=%s threads=%d models=%d batch=%d chars=%s "
		    "epochs=%d samples_per_s=%.0f words_per_s=%.0f "
		    "test_accuracy=%.2f weights=%016" PRIx64
		    " graphs=%s unit_sentences=%d per_model_words_per_s=%.0f "
		    "lr=%g\n",
		    mode_name(o.how), n_threads, n_models, o.batch,
		    o.chars ? "on" : "off", o.epochs, out.samples_per_s,
		    out.words_per_s, out.accuracy, out.hash,
		    graphs_name(o.shape),
		    o.how == mode::sync ? o.unit_sentences : 0,
		    out.per_model_words_per_s, o.lr);
	std::fflush(stdout);
	return out;
}

/* ----------------------------------------------------------------- main */

void usage(std::FILE *to)
{
	std::fputs(
		"usage: tagger [options] DIR\n"
		"  DIR: the unpacked Brown corpus (scripts/fetch-brown.sh "
		"prints it)\n"
		"  --threads LIST   thread counts to train with, one run each "
		"(1,2; default 1)\n"
		"  --mode M         sync (the default): each batch's graphs "
		"dealt into units\n"
		"                   that the threads take in turn, their "
		"gradients summed by a\n"
		"                   reducer in a fixed order: the same weights "
		"at any thread\n"
		"                   count; hogwild: each thread takes whole "
		"batches and updates\n"
		"                   the weights without a lock\n"
		"  --models N       N independent models at once, one per "
		"thread (N threads)\n"
		"  --graphs G       length (the default): a graph per group of "
		"a batch's (a\n"
		"                   unit's) sentences of one length; sentence: "
		"a graph each\n"
		"  --chars on|off   on (the default): rare words spelled by "
		"the char BiLSTM;\n"
		"                   off: they share <unk>'s embedding\n"
		"  --batch B        sentences per mini-batch (default 32)\n"
		"  --unit-sentences N  sync: ceil(B / N) units a batch "
		"(default 16)\n"
		"  --epochs E       epochs per run (default 3)\n"
		"  --lr X           first epoch's learning rate, falling "
		"linearly to X / E\n"
		"                   at the last (default 4; the loss is the "
		"batch's mean)\n"
		"  --seed S         initial weights and orders (default 1)\n"
		"  --subset N       train on the first N training sentences "
		"only\n"
		"  --test-subset N  test on the first N test sentences only\n"
		"  --top-tags N     per-tag accuracy of the N most frequent "
		"tags (default 12)\n"
		"  --csv FILE       write each epoch's figures\n"
		"  --export DIR     write the setup (sizes, initial weights, "
		"learning rates,\n"
		"                   orders) for bench/compare/ (setup.hpp), "
		"and train nothing\n"
		"  --min-test-accuracy P  exit 1 unless every run ends at P% "
		"or more\n"
		"  --same-weights   exit 1 unless the runs end with bitwise "
		"identical weights\n"
		"                   (sync: all of them; else those with the "
		"same thread count)\n"
		"  --check          check the gradients of a batch's graphs "
		"against finite\n"
		"                   differences, and train nothing\n"
		"  --skip-if-missing  exit 77 (a skipped test) when DIR has no "
		"data\n",
		to);
}

bool parse(int argc, char **argv, options &o)
{
	for (int i = 1; i < argc; i++) {
		std::string a = argv[i];
		bool has_value = i + 1 < argc;
		const char *v = has_value ? argv[i + 1] : "";
		long n = 0;
		if (a == "--help") {
			usage(stdout);
			std::exit(0);
		} else if (a == "--same-weights") {
			o.same_weights = true;
			continue;
		} else if (a == "--check") {
			o.check = true;
			continue;
		} else if (a == "--skip-if-missing") {
			o.skip_if_missing = true;
			continue;
		} else if (a.rfind("--", 0) != 0) {
			if (!o.data.empty())
				return false;
			o.data = a;
			continue;
		}
		if (!has_value)
			return false;
		i++;
		if (a == "--threads") {
			if (!cli::thread_list(v, o.threads))
				return false;
		} else if (a == "--mode") {
			if (std::strcmp(v, "sync") == 0)
				o.how = mode::sync;
			else if (std::strcmp(v, "hogwild") == 0)
				o.how = mode::hogwild;
			else
				return false;
		} else if (a == "--models") {
			if (!cli::whole_number(v, 1, 1024, n))
				return false;
			o.how = mode::models;
			o.models = static_cast<int>(n);
		} else if (a == "--graphs") {
			if (std::strcmp(v, "sentence") == 0)
				o.shape = graphs::sentence;
			else if (std::strcmp(v, "length") == 0)
				o.shape = graphs::length;
			else
				return false;
		} else if (a == "--chars") {
			if (std::strcmp(v, "on") == 0)
				o.chars = true;
			else if (std::strcmp(v, "off") == 0)
				o.chars = false;
			else
				return false;
		} else if (a == "--batch" || a == "--epochs" ||
			   a == "--subset" || a == "--test-subset" ||
			   a == "--unit-sentences" || a == "--top-tags") {
			bool positive = a == "--batch" || a == "--epochs" ||
					a == "--unit-sentences";
			if (!cli::whole_number(v, positive ? 1 : 0, 10000000,
					       n))
				return false;
			(a == "--batch"		   ? o.batch
			 : a == "--epochs"	   ? o.epochs
			 : a == "--subset"	   ? o.subset
			 : a == "--unit-sentences" ? o.unit_sentences
			 : a == "--top-tags"	   ? o.top_tags
						   : o.test_subset) =
				static_cast<int>(n);
		} else if (a == "--lr" || a == "--min-test-accuracy") {
			double x;
			if (!cli::real_number(v, x))
				return false;
			(a == "--lr" ? o.lr : o.min_test_accuracy) = x;
		} else if (a == "--seed") {
			if (!cli::whole_number(v, 0, 1L << 40, n))
				return false;
			o.seed = static_cast<std::uint64_t>(n);
		} else if (a == "--csv") {
			o.csv = v;
		} else if (a == "--export") {
			o.export_dir = v;
		} else {
			return false;
		}
	}
	if (o.how == mode::models)
		o.threads = {o.models};
	return !o.data.empty() && o.lr > 0;
}

/* --export: what bench/compare/ reads (setup.hpp). */
void export_setup(const options &o, const brown::corpus &c, std::size_t n_train)
{
	tagger::setup s;
	s.epochs = o.epochs;
	s.batch = o.batch;
	s.subset = o.subset;
	s.chars = o.chars;
	s.seed = o.seed;
	s.n_words = static_cast<int>(c.words.size());
	s.n_chars = static_cast<int>(c.chars.size());
	s.n_tags = static_cast<int>(c.tags.size());
	const lstm::sizes sizes{s.n_words, s.n_chars, s.n_tags};
	/* lstm.hpp's table and setup.hpp's, which the other sides read,
	 * must be one table. */
	auto ours = lstm::shapes(sizes);
	auto theirs = tagger::shapes(s.n_words, s.n_chars, s.n_tags);
	for (int p = 0; p < lstm::n_params; p++)
		if (theirs.size() != ours.size() ||
		    std::strcmp(ours[p].name, theirs[p].name) != 0 ||
		    ours[p].rows != theirs[p].rows ||
		    ours[p].cols != theirs[p].cols)
			throw std::logic_error(
				std::string("parameter ") + ours[p].name +
				": lstm.hpp and setup.hpp disagree");
	lstm::weights w = lstm::initial_weights(sizes, o.seed);
	for (const auto &p : w)
		s.weights.insert(s.weights.end(), p.begin(), p.end());
	for (int e = 0; e < o.epochs; e++) {
		s.lr.push_back(lstm::learning_rate(o.lr, o.epochs, e));
		for (int i :
		     lstm::shuffled(static_cast<int>(n_train), o.seed, e))
			s.order.push_back(i);
	}
	tagger::write_setup(o.export_dir, s);
}

/* --check: the gradients a batch's graphs give, against central
 * differences of the same loss computed without a graph (lstm::evaluate,
 * the mean cross-entropy over the batch's tokens): a dozen elements of
 * every parameter, the largest of its gradient and others at random.
 * The batch: training sentences with rare words, two pairs of one length
 * (a graph of two rows with --graphs length) and two more. Returns the
 * exit status. */
int check_gradients(const options &o, const brown::corpus &corpus)
{
	const std::vector<sentence> &all = corpus.train;
	std::map<std::size_t, std::vector<int>> by_length;
	for (std::size_t i = 0; i < all.size() && i < 400; i++) {
		std::size_t len = all[i].words.size();
		bool rare = std::count(all[i].words.begin(), all[i].words.end(),
				       0) > 0;
		if (len >= 3 && len <= 12 && rare)
			by_length[len].push_back(static_cast<int>(i));
	}
	std::vector<sentence> set;
	int pairs = 0, singles = 0;
	for (const auto &[len, ids] : by_length) {
		if (ids.size() >= 2 && pairs < 2) {
			set.push_back(all[ids[0]]);
			set.push_back(all[ids[1]]);
			pairs++;
		} else if (singles < 2) {
			set.push_back(all[ids[0]]);
			singles++;
		}
	}
	if (set.empty())
		throw std::runtime_error("--check: no sentence to check with");
	const lstm::sizes sizes{static_cast<int>(corpus.words.size()),
				static_cast<int>(corpus.chars.size()),
				static_cast<int>(corpus.tags.size())};
	lstm::weights w = lstm::initial_weights(sizes, o.seed);
	std::vector<int> ids(set.size());
	std::iota(ids.begin(), ids.end(), 0);
	long tokens = 0;
	for (const sentence &s : set)
		tokens += static_cast<long>(s.words.size());

	std::array<grad, lstm::n_params> got;
	std::array<bool, lstm::n_params> has{};
	{
		adg::registry reg;
		model m(reg, sizes, w);
		learner l(reg, m, o.chars, o.shape == graphs::length);
		adg::node loss =
			l.record(set,
				 split_into_graphs(set, ids.data(),
						   static_cast<int>(ids.size()),
						   o.shape),
				 tokens);
		adg::backward_options b;
		b.on_param_ready(m.leaves, [&](std::size_t p, adg::grad_ref g) {
			got[p] = *g.as<grad>();
			has[p] = true;
		});
		adg::backward<grad>(loss, b);
	}
	auto shapes = lstm::shapes(sizes);
	std::uint64_t state = o.seed + 7;
	const float eps = 1e-2f;
	int failures = 0;
	std::printf("checking the gradients of %zu sentences (%ld tokens), "
		    "graphs=%s chars=%s\n",
		    set.size(), tokens, graphs_name(o.shape),
		    o.chars ? "on" : "off");
	for (int p = 0; p < lstm::n_params; p++) {
		bool used = o.chars ||
			    (p < lstm::p_char_embed || p > lstm::p_char_bwd_b);
		if (!has[p]) {
			std::printf("  %-10s no gradient%s\n", shapes[p].name,
				    used ? ": FAILED" : " (unused)");
			failures += used;
			continue;
		}
		grad d = grad::dense(shapes[p].rows, shapes[p].cols);
		d += got[p];
		std::vector<std::size_t> at(d.v.size());
		std::iota(at.begin(), at.end(), 0);
		std::stable_sort(at.begin(), at.end(),
				 [&](std::size_t x, std::size_t y) {
					 return std::fabs(d.v[x]) >
						std::fabs(d.v[y]);
				 });
		std::vector<std::size_t> pick(
			at.begin(),
			at.begin() + std::min<std::size_t>(6, at.size()));
		for (int k = 0; k < 6; k++)
			pick.push_back(lstm::next_random(state) % d.v.size());
		double worst = 0, largest = 0;
		for (std::size_t i : pick) {
			float keep = w[p][i];
			w[p][i] = keep + eps;
			double up = lstm::evaluate(w, set, o.chars, sizes.tags)
					    .loss;
			w[p][i] = keep - eps;
			double down =
				lstm::evaluate(w, set, o.chars, sizes.tags)
					.loss;
			w[p][i] = keep;
			double numeric = (up - down) / (2.0 * eps);
			largest = std::max(largest, std::fabs(numeric));
			worst = std::max(worst, std::fabs(numeric - d.v[i]));
		}
		/* float forwards: differences of about 1e-7 in a loss of
		 * about 4, over 2 eps */
		bool ok = worst <= 1e-5 + 1e-2 * largest;
		std::printf("  %-10s %2zu elements, largest %.2e, worst "
			    "difference %.2e %s\n",
			    shapes[p].name, pick.size(), largest, worst,
			    ok ? "ok" : "FAILED");
		failures += !ok;
	}
	return failures > 0;
}

/* The tag most tokens of these sentences have, and its share in %. */
std::pair<int, double> majority(const std::vector<sentence> &set,
				std::size_t n_tags)
{
	std::vector<long> count(n_tags);
	long all = 0;
	for (const sentence &s : set)
		for (int t : s.tags) {
			count[t]++;
			all++;
		}
	int best = static_cast<int>(
		std::max_element(count.begin(), count.end()) - count.begin());
	return {best, all > 0 ? 100.0 * count[best] / all : 0.0};
}

} // namespace

int main(int argc, char **argv)
{
	options o;
	if (!parse(argc, argv, o)) {
		usage(stderr);
		return 2;
	}
	/* The threads here are the parallelism: BLAS multiplies one
	 * thread's small matrices on that thread. */
	openblas_set_num_threads(1);
	try {
		brown::corpus corpus;
		try {
			corpus = brown::load(o.data);
		} catch (const brown::missing &e) {
			std::fprintf(stderr, "tagger: %s\n", e.what());
			return o.skip_if_missing ? 77 : 1;
		}
		std::fputs(brown::summary(corpus).c_str(), stdout);
		if (o.check)
			return check_gradients(o, corpus);
		std::vector<sentence> &train_set = corpus.train;
		std::vector<sentence> &test_set = corpus.test;
		if (o.subset > 0 &&
		    static_cast<std::size_t>(o.subset) < train_set.size())
			train_set.resize(static_cast<std::size_t>(o.subset));
		if (o.test_subset > 0 &&
		    static_cast<std::size_t>(o.test_subset) < test_set.size())
			test_set.resize(
				static_cast<std::size_t>(o.test_subset));
		long train_tokens = 0, test_tokens = 0;
		for (const sentence &s : train_set)
			train_tokens += static_cast<long>(s.words.size());
		for (const sentence &s : test_set)
			test_tokens += static_cast<long>(s.words.size());
		auto [top, share] = majority(test_set, corpus.tags.size());
		std::printf(
			"training on %zu sentences (%ld tokens), testing on "
			"%zu (%ld tokens); the majority tag of those, %s, "
			"is %.2f%% of them\n",
			train_set.size(), train_tokens, test_set.size(),
			test_tokens, corpus.tags[top].c_str(), share);
		if (!o.export_dir.empty()) {
			export_setup(o, corpus, train_set.size());
			return 0;
		}
		std::FILE *csv = cli::open_csv(
			o.csv, "mode,threads,models,graphs,chars,batch,"
			       "epoch,seconds,train_loss,train_accuracy,"
			       "test_loss,test_accuracy,words_per_s\n");
		int failed = 0;
		std::vector<outcome> outcomes;
		for (std::size_t r = 0; r < o.threads.size(); r++) {
			outcomes.push_back(train(o, o.threads[r], corpus,
						 train_set, test_set, csv));
			/* Sync's units: every run the same weights,
			 * whatever its thread count. */
			if (!cli::check_run(o.threads, outcomes, r,
					    o.min_test_accuracy, o.same_weights,
					    o.how == mode::sync))
				failed = 1;
		}
		if (!cli::close_csv(csv, o.csv))
			failed = 1;
		return failed;
	} catch (const std::exception &e) {
		std::fprintf(stderr, "tagger: %s\n", e.what());
		return 1;
	}
}
