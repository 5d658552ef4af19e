/* Which language is a word in? A character-level GRU trained with libadg's
 * C++ layer (adg.hpp) on the words of nine languages that Debian ships
 * (scripts/fetch-words.sh fetches them): the model of gru.hpp (a word's
 * UTF-8 bytes, an embedding of 32, a GRU of hidden size 64, a linear layer
 * to the 9 languages, softmax cross-entropy), by SGD on mini-batches of B
 * words, with a learning rate falling linearly from 0.1 over the epochs.
 *
 * Graphs whose shape comes from the data (--graphs): each mini-batch is
 * recorded as one graph per word, its length the word's (`word`), or as
 * one graph per group of the batch's words of equal length (`length`, the
 * default), whose time steps multiply n x 64 matrices instead of vectors,
 * as DyNet's automatic batching does. A graph is an embedding op, the
 * input projection of every time step at once, one GRU cell op per time
 * step, and the output layer with its loss; the graphs of one batch meet
 * only at the batch's mean loss, whose backward runs them all. Both give
 * the same model; their sums are taken in other orders.
 *
 * Threads train one of three ways:
 * - sync (--mode sync, the default): each mini-batch's graphs are dealt,
 *   whole, into ceil(B / --unit-words) work units (deal), as many
 *   whatever the thread count; the T threads take the units in turn,
 *   record each and run its backward with a gradient reducer's hook
 *   (adg::reducer), which sums each parameter's unit gradients in a
 *   fixed tree over unit indices and applies one SGD step once the round
 *   is done. Bitwise the same weights at every T. --unit-words 0 deals
 *   the graphs to the T threads instead, summed in thread order: bitwise
 *   reproducible for a given T, and on one thread the plain trainer.
 * - hogwild: each thread takes whole mini-batches in turn and applies each
 *   parameter's gradient, without a lock, as soon as it is final.
 * - --models N: N independent models, each trained by one thread from its
 *   own seed (seed + its index), as a hyper-parameter sweep or an
 *   ensemble trains them. All threads share one registry.
 * And plain (--mode plain): one thread, no reducer, each gradient applied
 * from the backward's ready hook.
 *
 * Prints a line per epoch, a confusion matrix of the test words, and a
 * line a script can read: "result mode=M threads=T models=N batch=B
 * graphs=G epochs=E samples_per_s=X test_accuracy=Y weights=HASH"; --csv
 * writes each epoch's figures. Usage: langid [options] DIR, DIR holding
 * fetch-words.sh's train.txt and test.txt (--help lists the options).
 * Exit status 0; 1 on an error or a missed check; 2 on bad usage; 77 when
 * the data is missing and --skip-if-missing is given. */
#include "../jitter.h"
#include "../trainer_cli.hpp"
#include "gru.hpp"
#include "words.hpp"

#include <adg.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace
{

using gru::classes;
using gru::embed;
using gru::gates;
using gru::hidden;

/* ------------------------------------------------------------ gradients */

/* The gradient type of every node: a rows x cols matrix, held as the sum
 * of two parts, either possibly empty:
 * - a band: rows [first, first + count) as dense floats, the other rows
 *   zero. An embedding's gradient touches only the rows of the bytes a
 *   batch has; a time step's, only its rows of the projection.
 * - products: a weight's gradient as the products that make it, a^T b
 *   (a: r x rows, b: r x cols; dy^T x for y = x W^T), not multiplied out.
 *   a and b are borrowed: rows of the batch's forward values and of its
 *   backward's scratch, in the arena of the thread that recorded them,
 *   which outlives every gradient of the batch (the update that reads
 *   them comes before the thread's next batch).
 * Adding bands gives a band (the whole matrix when neither holds the
 * other). Adding products keeps both, and merges two whose rows follow
 * each other in memory into one: a group's time steps keep their rows in
 * one block, so the gradient of W_hh, which every time step gives, ends
 * as one product per graph, multiplied out once, when the update applies
 * it (add_to), as a backward through time by hand would compute it,
 * instead of a 192 x 64 matrix per time step. */
struct grad {
	int rows = 0, cols = 0;
	int first = 0, count = 0;
	std::vector<float> band; /* count x cols */
	struct product {
		const float *a, *b;
		int r;
	};
	std::vector<product> products;

	/* Rows [first, first + count) of a rows x cols matrix, zeros. */
	static grad band_of(int rows, int cols, int first, int count)
	{
		grad g;
		g.rows = rows;
		g.cols = cols;
		g.first = first;
		g.count = count;
		g.band.resize(static_cast<std::size_t>(count) * cols);
		return g;
	}
	static grad whole(int rows, int cols)
	{
		return band_of(rows, cols, 0, rows);
	}
	/* a^T b, a r x rows, b r x cols, both borrowed. */
	static grad product_of(int rows, int cols, const float *a,
			       const float *b, int r)
	{
		grad g;
		g.rows = rows;
		g.cols = cols;
		g.products.push_back({a, b, r});
		return g;
	}

	grad &operator+=(const grad &o)
	{
		if (o.count > 0 && count == 0) {
			first = o.first;
			count = o.count;
			band = o.band;
		} else if (o.count > 0) {
			if (o.first < first ||
			    o.first + o.count > first + count) {
				std::vector<float> w(
					static_cast<std::size_t>(rows) * cols);
				std::copy(band.begin(), band.end(),
					  w.begin() + static_cast<long>(first) *
							      cols);
				first = 0;
				count = rows;
				band = std::move(w);
			}
			float *to = band.data() +
				    static_cast<std::size_t>(o.first - first) *
					    cols;
			for (std::size_t i = 0; i < o.band.size(); i++)
				to[i] += o.band[i];
		}
		for (const product &p : o.products)
			append(p);
		return *this;
	}

	/* out (rows x cols) += the whole matrix. */
	void add_to(float *out) const
	{
		float *to = out + static_cast<std::size_t>(first) * cols;
		for (std::size_t i = 0; i < band.size(); i++)
			to[i] += band[i];
		for (const product &p : products)
			gru::product_tn(p.r, rows, cols, p.a, p.b, out, 1);
	}

	/* Rows [first, last) of o added to the same rows of this, both
	 * whole: what one thread folds of a parameter in slices while
	 * others fold the other rows. */
	void add_rows(const grad &o, int first_row, int last_row)
	{
		std::size_t from = static_cast<std::size_t>(first_row) * cols,
			    to = static_cast<std::size_t>(last_row) * cols;
		for (std::size_t i = from; i < to; i++)
			band[i] += o.band[i];
	}

	/* The whole matrix as one band, products multiplied out: the form
	 * a parameter in slices is folded in (add_rows). Adds nothing to
	 * any element, so the sums keep their bits. */
	void make_whole()
	{
		multiply_out();
		if (count == rows)
			return;
		std::vector<float> w(static_cast<std::size_t>(rows) * cols);
		std::copy(band.begin(), band.end(),
			  w.begin() + static_cast<long>(first) * cols);
		first = 0;
		count = rows;
		band = std::move(w);
	}

	/* The products multiplied out: the whole matrix as a band. */
	void multiply_out()
	{
		if (products.empty())
			return;
		std::vector<float> w(static_cast<std::size_t>(rows) * cols);
		add_to(w.data());
		first = 0;
		count = rows;
		band = std::move(w);
		products.clear();
	}

private:
	/* p merged with the last product when their rows follow each
	 * other, in either order (a backward gives the last time step
	 * first). */
	void append(const product &p)
	{
		if (!products.empty()) {
			product &last = products.back();
			std::size_t ra = static_cast<std::size_t>(rows),
				    rb = static_cast<std::size_t>(cols);
			if (p.a == last.a + last.r * ra &&
			    p.b == last.b + last.r * rb) {
				last.r += p.r;
				return;
			}
			if (last.a == p.a + p.r * ra &&
			    last.b == p.b + p.r * rb) {
				last = {p.a, p.b, last.r + p.r};
				return;
			}
		}
		products.push_back(p);
	}
};

/* The gradient of a node with a value of 1 x 1. */
grad scalar(float v)
{
	grad g = grad::whole(1, 1);
	g.band[0] = v;
	return g;
}

} // namespace

/* The mean loss's seed, 1 as a 1 x 1 grad, so that a backward from it
 * needs none: adg::backward<grad>(loss). */
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
 * stand for them in every graph. A thread copies the values before each
 * batch (gru.hpp's kernels, BLAS, read the copy); in sync the reducer's
 * barrier orders the updates before the next batch's copies. */
struct model {
	std::array<std::unique_ptr<std::atomic<float>[]>, gru::n_params> values;
	std::vector<adg::node> leaves;

	model(adg::registry &reg, const gru::weights &initial)
	{
		for (int p = 0; p < gru::n_params; p++) {
			values[p].reset(
				new std::atomic<float>[gru::elements(p)]);
			for (std::size_t i = 0; i < gru::elements(p); i++)
				values[p][i].store(initial[p][i],
						   std::memory_order_relaxed);
			leaves.push_back(adg::leaf(reg, gru::shapes[p].name));
		}
	}

	void copy_to(gru::weights &w) const
	{
		for (int p = 0; p < gru::n_params; p++) {
			w[p].resize(gru::elements(p));
			for (std::size_t i = 0; i < gru::elements(p); i++)
				w[p][i] = values[p][i].load(
					std::memory_order_relaxed);
		}
	}

	/* One SGD step on parameter p: value -= lr * g, g multiplied out
	 * first (in sync the participants did that, each its own). */
	void sgd(int p, grad &g, float lr)
	{
		g.multiply_out();
		sgd_rows(p, g, lr, g.first, g.first + g.count);
	}

	/* The step on rows [first_row, last_row) of parameter p only, of g
	 * multiplied out and holding them: a slice's update. */
	void sgd_rows(int p, const grad &g, float lr, int first_row,
		      int last_row)
	{
		std::size_t from = static_cast<std::size_t>(first_row -
							    g.first) *
				   g.cols,
			    to = static_cast<std::size_t>(last_row - g.first) *
				 g.cols;
		std::atomic<float> *v =
			values[p].get() +
			static_cast<std::size_t>(g.first) * g.cols;
		for (std::size_t i = from; i < to; i++)
			v[i].store(v[i].load(std::memory_order_relaxed) -
					   lr * g.band[i],
				   std::memory_order_relaxed);
	}
};

/* ------------------------------------------------------------ recording */

/* Bump allocation for one batch's forward values, which the steps'
 * closures point into: reset once the batch's graphs are gone, so that a
 * batch calls malloc only while the first ones find the size. */
class arena
{
public:
	template <class T> T *make(std::size_t n)
	{
		static_assert(std::is_trivially_destructible_v<T>);
		/* 64-byte steps: every value starts on a cache line */
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
	/* Everything made so far is gone; next time one block holds it. */
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

enum class graphs { word, length };

/* n words of one length, as a graph takes them: bytes time-major. */
struct group {
	int n, len;
	const unsigned char *bytes; /* len x n */
	const int *labels;	    /* n */
};

/* A batch's words, ids[0..n) of d, as its graphs take them: one word
 * each, or one group per length, shortest first, each group's words in
 * the batch's order. */
std::vector<std::vector<int>>
split_into_graphs(const words::dataset &d, const int *ids, int n, graphs how)
{
	std::vector<std::vector<int>> groups;
	if (how == graphs::word) {
		for (int i = 0; i < n; i++)
			groups.push_back({ids[i]});
		return groups;
	}
	std::vector<int> sorted(ids, ids + n);
	std::stable_sort(sorted.begin(), sorted.end(), [&](int x, int y) {
		return d.text[x].size() < d.text[y].size();
	});
	for (int i = 0, j; i < n; i = j) {
		for (j = i + 1; j < n && d.text[sorted[j]].size() ==
						 d.text[sorted[i]].size();
		     j++)
			;
		groups.emplace_back(&sorted[i], &sorted[j]);
	}
	return groups;
}

/* A batch's graphs dealt into parts: whole graphs, largest first, each to
 * the part with the least work so far (the lowest index on a tie), each
 * part's then kept in the batch's order; a part may get none. Whole
 * graphs, so that a part's time steps multiply as many words at once as
 * the batch's do: cutting each group in parts would leave each nearly as
 * many time steps, of fewer words each. A graph's work: its length times
 * its words plus 2, a time step's cost being about that of two words
 * besides theirs. It depends on the batch and parts alone, whatever the
 * timing: with the units of sync as the parts, part of what makes a
 * round's sums the same at every T. */
std::vector<std::vector<std::vector<int>>>
deal(const words::dataset &d, std::vector<std::vector<int>> groups, int parts)
{
	std::vector<std::vector<std::vector<int>>> dealt(
		static_cast<std::size_t>(parts));
	if (parts == 1) {
		dealt[0] = std::move(groups);
		return dealt;
	}
	auto work = [&](const std::vector<int> &g) {
		return static_cast<long>(d.text[g[0]].size()) *
		       static_cast<long>(g.size() + 2);
	};
	std::vector<int> by_work(groups.size());
	for (std::size_t i = 0; i < groups.size(); i++)
		by_work[i] = static_cast<int>(i);
	std::stable_sort(by_work.begin(), by_work.end(), [&](int x, int y) {
		return work(groups[x]) > work(groups[y]);
	});
	std::vector<long> load(static_cast<std::size_t>(parts));
	std::vector<int> part_of(groups.size());
	for (int g : by_work) {
		int least = static_cast<int>(
			std::min_element(load.begin(), load.end()) -
			load.begin());
		load[least] += work(groups[g]);
		part_of[g] = least;
	}
	for (std::size_t i = 0; i < groups.size(); i++)
		dealt[part_of[i]].push_back(std::move(groups[i]));
	return dealt;
}

/* One thread's recording of batches for one model: the copy of the
 * weights its kernels read, the arena of its forward values, and the
 * batch's loss for the epoch's figures. */
class learner
{
public:
	learner(adg::registry &reg, const model &m) : reg_(reg), model_(m)
	{
	}

	/* Records one graph per group of words of d (split_into_graphs),
	 * joined by their loss: the sum of the words' cross-entropies over
	 * batch, the batch's size. An empty node when there is no group.
	 * Reads the weights as refresh copied them last; with fresh, copies
	 * them first. */
	adg::node record(const words::dataset &d,
			 const std::vector<std::vector<int>> &groups, int batch,
			 bool fresh = true)
	{
		mem_.reset(); /* the last batch's (or unit's) graphs are gone */
		if (fresh)
			refresh();
		if (groups.empty())
			return adg::node();
		std::vector<adg::node> losses;
		float scale = 1.0f / static_cast<float>(batch);
		for (const std::vector<int> &ids : groups)
			losses.push_back(record_group(
				gather(d, ids.data(),
				       static_cast<int>(ids.size())),
				scale));
		return adg::op(
			reg_, losses,
			[](adg::step_call<grad> &c) {
				for (std::size_t i = 0; i < c.n_parents(); i++)
					c.give(i, scalar(c.grad()->band[0]));
			},
			"sum");
	}

	/* Copies the weights that record's kernels read: once a round in
	 * sync with units, whose units all read the round's weights. */
	void refresh()
	{
		model_.copy_to(w_);
	}

	/* The summed cross-entropy and the words, since the last take. */
	std::pair<double, long> take_loss()
	{
		auto l = std::make_pair(loss_, words_);
		loss_ = 0;
		words_ = 0;
		return l;
	}

private:
	adg::registry &reg_;
	const model &model_;
	gru::weights w_;
	arena mem_;
	std::vector<float> scratch_;
	double loss_ = 0;
	long words_ = 0;

	group gather(const words::dataset &d, const int *ids, int n)
	{
		int len = static_cast<int>(d.text[ids[0]].size());
		auto *bytes = mem_.make<unsigned char>(
			static_cast<std::size_t>(len) * n);
		int *labels = mem_.make<int>(n);
		for (int b = 0; b < n; b++) {
			labels[b] = d.label[ids[b]];
			for (int t = 0; t < len; t++)
				bytes[t * n + b] = static_cast<unsigned char>(
					d.text[ids[b]][t]);
		}
		return {n, len, bytes, labels};
	}

	float *floats(std::size_t n)
	{
		return mem_.make<float>(n);
	}

	/* g as dense rows x cols, zeros where there is none: its band when
	 * that is all of it, else multiplied out into scratch_. */
	const float *dense(const grad *g, int rows, int cols)
	{
		if (g != nullptr && g->products.empty() && g->first == 0 &&
		    g->count == rows)
			return g->band.data();
		scratch_.assign(static_cast<std::size_t>(rows) * cols, 0.0f);
		if (g != nullptr)
			g->add_to(scratch_.data());
		return scratch_.data();
	}

	const adg::node &leaf(int p) const
	{
		return model_.leaves[p];
	}

	/* One graph: the loss of group g's words, times scale. */
	adg::node record_group(const group g, float scale)
	{
		const int n = g.n, rows = g.len * n;
		learner *self = this; /* the steps run on this thread */

		/* The embedding of every byte; its gradient, a band of the
		 * table from the lowest byte to the highest. */
		float *x = floats(static_cast<std::size_t>(rows) * embed);
		gru::embed_bytes(w_[gru::p_embed].data(), g.bytes, rows, x);
		auto [lo, hi] = std::minmax_element(g.bytes, g.bytes + rows);
		adg::node xs = adg::op(
			reg_, {leaf(gru::p_embed)},
			[self, g, rows, lo = *lo,
			 hi = *hi](adg::step_call<grad> &c) {
				grad d = grad::band_of(gru::n_bytes, embed, lo,
						       hi - lo + 1);
				gru::embed_backward(
					self->dense(c.grad(), rows, embed),
					g.bytes, rows, lo, d.band.data());
				c.give(0, std::move(d));
			},
			"embed");

		/* The input's share of the gates, every time step at once.
		 * W_ih's gradient is dgi^T x: dgi copied into the arena for
		 * it. */
		const float *w_ih = w_[gru::p_w_ih].data();
		float *gi = floats(static_cast<std::size_t>(rows) * gates);
		gru::project(rows, x, w_ih, w_[gru::p_b_ih].data(), gi);
		adg::node proj = adg::op(
			reg_, {xs, leaf(gru::p_w_ih), leaf(gru::p_b_ih)},
			[self, rows, x, w_ih](adg::step_call<grad> &c) {
				float *dgi = self->floats(
					static_cast<std::size_t>(rows) * gates);
				std::copy_n(self->dense(c.grad(), rows, gates),
					    static_cast<std::size_t>(rows) *
						    gates,
					    dgi);
				grad dx = grad::whole(rows, embed);
				gru::product_nn(rows, embed, gates, dgi, w_ih,
						dx.band.data());
				grad db = grad::whole(1, gates);
				gru::column_sums(rows, gates, dgi,
						 db.band.data());
				c.give(0, std::move(dx));
				c.give(1, grad::product_of(gates, embed, dgi, x,
							   rows));
				c.give(2, std::move(db));
			},
			"project");

		/* A cell op per time step, over rows t * n .. of blocks that
		 * hold every step's: the hidden states, and the backward's
		 * dgh, so that W_hh's gradient, dgh^T h_prev over the steps,
		 * is one product (grad). The first step has no h_prev
		 * (zeros), so neither h_prev nor W_hh as parents. */
		const float *w_hh = w_[gru::p_w_hh].data();
		float *hs = floats(static_cast<std::size_t>(rows) * hidden);
		float *dghs = floats(static_cast<std::size_t>(rows) * gates);
		adg::node h;
		for (int t = 0; t < g.len; t++) {
			float *saved =
				floats(static_cast<std::size_t>(n) * gates);
			float *ghn =
				floats(static_cast<std::size_t>(n) * hidden);
			const float *h_prev =
				t > 0 ? hs + static_cast<std::size_t>(t - 1) *
							n * hidden
				      : nullptr;
			gru::cell_forward(
				n, gi + static_cast<std::size_t>(t) * n * gates,
				h_prev, w_hh, w_[gru::p_b_hh].data(), saved,
				ghn,
				hs + static_cast<std::size_t>(t) * n * hidden);
			float *dgh =
				dghs + static_cast<std::size_t>(t) * n * gates;
			auto step = [self, n, t, rows, h_prev, saved, ghn, dgh,
				     w_hh](adg::step_call<grad> &c) {
				const float *dh =
					self->dense(c.grad(), n, hidden);
				grad dgi = grad::band_of(rows, gates, t * n, n);
				grad dh_prev =
					grad::whole(h_prev ? n : 0, hidden);
				gru::cell_backward(n, dh, h_prev, saved, ghn,
						   w_hh, dgi.band.data(), dgh,
						   h_prev ? dh_prev.band.data()
							  : nullptr);
				grad db = grad::whole(1, gates);
				gru::column_sums(n, gates, dgh, db.band.data());
				c.give(0, std::move(dgi));
				if (h_prev == nullptr) {
					c.give(1, std::move(db));
					return;
				}
				c.give(1, std::move(dh_prev));
				c.give(2, grad::product_of(gates, hidden, dgh,
							   h_prev, n));
				c.give(3, std::move(db));
			};
			if (t == 0)
				h = adg::op(reg_, {proj, leaf(gru::p_b_hh)},
					    step, "cell");
			else
				h = adg::op(reg_,
					    {proj, h, leaf(gru::p_w_hh),
					     leaf(gru::p_b_hh)},
					    step, "cell");
		}

		/* The output layer and the loss, scaled. */
		const float *w_out = w_[gru::p_w_out].data();
		const float *h_last =
			hs + static_cast<std::size_t>(g.len - 1) * n * hidden;
		float *logits = floats(static_cast<std::size_t>(n) * classes);
		gru::classify(n, h_last, w_out, w_[gru::p_b_out].data(),
			      logits);
		float *dlogits = floats(static_cast<std::size_t>(n) * classes);
		loss_ += gru::cross_entropy(n, classes, logits, g.labels, scale,
					    dlogits, nullptr);
		words_ += n;
		return adg::op(
			reg_, {h, leaf(gru::p_w_out), leaf(gru::p_b_out)},
			[n, h_last, dlogits, w_out](adg::step_call<grad> &c) {
				float seed = c.grad()->band[0];
				for (int i = 0; i < n * classes; i++)
					dlogits[i] *= seed;
				grad dh = grad::whole(n, hidden);
				gru::product_nn(n, hidden, classes, dlogits,
						w_out, dh.band.data());
				grad db = grad::whole(1, classes);
				gru::column_sums(n, classes, dlogits,
						 db.band.data());
				c.give(0, std::move(dh));
				c.give(1, grad::product_of(classes, hidden,
							   dlogits, h_last, n));
				c.give(2, std::move(db));
			},
			"output");
	}
};

/* ----------------------------------------------------------------- runs */

enum class mode { sync, hogwild, plain, models };

const char *mode_name(mode m)
{
	switch (m) {
	case mode::sync:
		return "sync";
	case mode::hogwild:
		return "hogwild";
	case mode::plain:
		return "plain";
	default:
		return "models";
	}
}

/* Sync's words per unit, by default: a batch of B words is ceil(B / 16)
 * units. Each unit costs a backward of its own and its gradient,
 * 27,593 floats, made whole and folded: on one thread at B = 32, two
 * units train at 0.99 x the plain trainer, within the noise
 * (docs/trainers.md). 16 makes the default batch of 32 two units, dealt
 * as the shares of two threads were, and B = 256 sixteen, a unit for
 * each of 16 threads. */
constexpr int default_unit_words = 16;

struct options {
	std::string data, csv, export_dir;
	std::vector<int> threads{1};
	mode how = mode::sync;
	graphs shape = graphs::length;
	int models = 1, batch = 32, epochs = 5, subset = 0, test_subset = 0;
	/* Sync: words per unit; 0, a share per thread. */
	int unit_words = default_unit_words;
	double lr = 0.1;
	std::uint64_t seed = 1;
	double min_test_accuracy = -1;
	bool same_weights = false, same_as_plain = false;
	bool skip_if_missing = false;
};

/* What a run ends with. */
struct outcome {
	double samples_per_s = 0, per_model_samples_per_s = 0;
	double accuracy = 0; /* % on the test words, mean over the models */
	std::uint64_t hash = 0;
	gru::scores first; /* the first model's, on the test words */
};

using cli::on_threads;
using cli::rows_of;
using cli::seconds_since;

/* Trains from scratch with o's settings on n_threads threads; prints a
 * line per epoch (and writes it to csv unless null), then the confusion
 * matrix and the result line. */
outcome train(const options &o, int n_threads, const words::dataset &train_set,
	      const words::dataset &test_set, std::FILE *csv)
{
	const int n_models = o.how == mode::models ? n_threads : 1;
	const int n = static_cast<int>(train_set.size());
	const int n_batches = (n + o.batch - 1) / o.batch;
	/* Declared first: the leaves in the models must go before it. */
	adg::registry reg;
	std::vector<std::unique_ptr<model>> models;
	for (int m = 0; m < n_models; m++)
		models.push_back(std::make_unique<model>(
			reg, gru::initial_weights(o.seed + m)));
	std::vector<std::unique_ptr<learner>> learners;
	for (int t = 0; t < n_threads; t++)
		learners.push_back(std::make_unique<learner>(
			reg, *models[o.how == mode::models ? t : 0]));

	/* Written by this thread between epochs, read by the workers. */
	float lr = 0;
	std::vector<std::vector<int>> order(static_cast<std::size_t>(n_models));

	/* Hogwild, plain and each of --models: the ready hook applies each
	 * parameter's gradient as soon as it is final, told the parameter's
	 * index in m.leaves. */
	auto apply_when_ready = [&](model &m) {
		adg::backward_options b;
		b.on_param_ready(
			m.leaves, [&m, &lr](std::size_t p, adg::grad_ref g) {
				m.sgd(static_cast<int>(p), *g.as<grad>(), lr);
			});
		return b;
	};
	/* Sync: the reducer sums each parameter's gradients in a tree over
	 * unit indices (or thread indices, a share per thread) and applies
	 * them once per batch, when every thread has ended it (all or
	 * nothing). Each thread multiplies out the products of each of its
	 * units from the ready hook, so that the threads share that work;
	 * the reducer only adds and steps. The large parameters are cut into
	 * slices of rows, which the threads at the batch's end fold and
	 * apply side by side; that changes no bit (whole bands add alike in
	 * slices or not). */
	const bool units = o.how == mode::sync && o.unit_words > 0;
	const int n_units =
		units ? (o.batch + o.unit_words - 1) / o.unit_words : 0;
	std::unique_ptr<adg::reducer<grad>> red;
	if (o.how == mode::sync) {
		adg::reducer_options<grad> ro;
		ro.units = static_cast<std::size_t>(n_units);
		for (int p = 0; p < gru::n_params; p++)
			ro.slices.push_back(n_threads > 1 && gru::elements(p) >=
								     4096
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
	adg::backward_options multiplied;
	multiplied.leaves_only = true;
	/* Whole for the slices; with units whole at every T, so that the
	 * sums take the same arithmetic whatever the slices (a band added
	 * to a band keeps a -0 that a whole matrix's +0 would not). */
	multiplied.on_ready = [whole = units || n_threads > 1](
				      std::uint64_t, adg::grad_ref g) {
		grad *mine = g.as<grad>();
		if (mine != nullptr && whole)
			mine->make_whole();
		else if (mine != nullptr)
			mine->multiply_out();
	};
	auto one_thread = [&](int t) {
		learner &l = *learners[t];
		if (o.how == mode::sync) {
			const adg::backward_options hooked =
				red->hook(t, multiplied);
			for (int k = 0; k < n_batches; k++) {
				int first = k * o.batch;
				int size = std::min(o.batch, n - first);
				auto dealt =
					deal(train_set,
					     split_into_graphs(train_set,
							       &order[0][first],
							       size, o.shape),
					     units ? n_units : n_threads);
				/* A unit with no graph (a batch with fewer
				 * graphs than units) gives no gradient. */
				auto run = [&](std::size_t u, bool fresh) {
					adg::node loss =
						l.record(train_set, dealt[u],
							 size, fresh);
					if (loss)
						adg::backward<grad>(loss,
								    hooked);
				};
				if (!units) {
					red->round(t, [&] { run(t, true); });
					continue;
				}
				/* Every unit reads the round's weights. */
				l.refresh();
				red->round(t, [&](std::size_t u) {
					jitter_pause(); /* tests' interleavings
							 */
					run(u, false);
				});
			}
			return;
		}
		/* Each of --models takes every batch of its own order. */
		int m = o.how == mode::models ? t : 0, mine = 0;
		adg::backward_options b = apply_when_ready(*models[m]);
		for (;;) {
			int k = o.how == mode::models
					? mine++
					: next.fetch_add(
						  1, std::memory_order_relaxed);
			if (k >= n_batches)
				break;
			int first = k * o.batch;
			int size = std::min(o.batch, n - first);
			adg::node loss = l.record(
				train_set,
				split_into_graphs(train_set, &order[m][first],
						  size, o.shape),
				size);
			adg::backward<grad>(loss, b);
		}
	};

	outcome out;
	double trained = 0;
	for (int e = 0; e < o.epochs; e++) {
		lr = gru::learning_rate(o.lr, o.epochs, e);
		for (int m = 0; m < n_models; m++)
			order[m] = gru::shuffled(n, o.seed + m, e);
		next.store(0, std::memory_order_relaxed);
		auto start = std::chrono::steady_clock::now();
		on_threads(n_threads, one_thread);
		double took = seconds_since(start);
		trained += took;

		double loss = 0;
		long seen = 0;
		for (auto &l : learners) {
			auto [sum, count] = l->take_loss();
			loss += sum;
			seen += count;
		}
		double accuracy = 0, test_loss = 0;
		for (int m = 0; m < n_models; m++) {
			gru::weights w;
			models[m]->copy_to(w);
			gru::scores s =
				gru::evaluate(w, test_set.text, test_set.label);
			accuracy += s.accuracy / n_models;
			test_loss += s.loss / n_models;
			if (m == 0)
				out.first = s;
		}
		double rate = static_cast<double>(n) * n_models / took;
		std::printf("T=%d %s graphs=%s epoch %2d  loss %.4f  test "
			    "loss %.4f  test %6.2f%%  %9.0f samples/s\n",
			    n_threads, mode_name(o.how),
			    o.shape == graphs::word ? "word" : "length", e + 1,
			    loss / static_cast<double>(seen), test_loss,
			    accuracy, rate);
		std::fflush(stdout);
		if (csv != nullptr)
			std::fprintf(
				csv,
				"%s,%d,%d,%s,%d,%d,%.3f,%.6f,%.6f,%.4f,%.1f\n",
				mode_name(o.how), n_threads, n_models,
				o.shape == graphs::word ? "word" : "length",
				o.batch, e + 1, trained,
				loss / static_cast<double>(seen), test_loss,
				accuracy, rate);
		out.accuracy = accuracy;
	}
	out.samples_per_s =
		static_cast<double>(n) * n_models * o.epochs / trained;
	out.per_model_samples_per_s = out.samples_per_s / n_models;
	std::uint64_t hash = 0xcbf29ce484222325u;
	for (auto &m : models) {
		gru::weights w;
		m->copy_to(w);
		hash = gru::fingerprint(w, hash);
	}
	out.hash = hash;

	std::printf("confusion matrix of the %zu test words%s (rows: the "
		    "language, columns: the guess)\n    ",
		    test_set.size(), n_models > 1 ? ", the first model" : "");
	for (const char *code : words::codes)
		std::printf("%6s", code);
	std::printf("\n");
	for (int k = 0; k < classes; k++) {
		std::printf("  %s", words::codes[k]);
		for (int j = 0; j < classes; j++)
			std::printf("%6d", out.first.confusion[k][j]);
		std::printf("\n");
	}
	std::printf("result mode=%s threads=%d models=%d batch=%d graphs=%s "
		    "epochs=%d samples_per_s=%.0f test_accuracy=%.2f "
		    "weights=%016" PRIx64
		    " per_model_samples_per_s=%.0f unit_words=%d\n",
		    mode_name(o.how), n_threads, n_models, o.batch,
		    o.shape == graphs::word ? "word" : "length", o.epochs,
		    out.samples_per_s, out.accuracy, out.hash,
		    out.per_model_samples_per_s, units ? o.unit_words : 0);
	std::fflush(stdout);
	return out;
}

/* ----------------------------------------------------------------- main */

void usage(std::FILE *to)
{
	std::fputs(
		"usage: langid [options] DIR\n"
		"  DIR holds train.txt and test.txt (scripts/fetch-words.sh)\n"
		"  --threads LIST   thread counts to train with, one run each "
		"(1,2; default 1)\n"
		"  --mode M         sync (the default): each batch's graphs "
		"dealt into units\n"
		"                   that the threads take in turn, their "
		"gradients summed by a\n"
		"                   reducer in a fixed order: the same weights "
		"at any thread\n"
		"                   count; hogwild: each thread\n"
		"                   takes whole batches and updates the "
		"weights "
		"without a lock;\n"
		"                   plain: one thread, no reducer\n"
		"  --models N       N independent models at once, one per "
		"thread (N threads)\n"
		"  --graphs G       length (the default): a graph per group of "
		"a batch's words\n"
		"                   of one length; word: a graph per word\n"
		"  --batch B        mini-batch size (default 32)\n"
		"  --unit-words N   sync: ceil(B / N) units a batch (default "
		"16; each costs a\n"
		"                   backward and a sum of the whole gradient); "
		"0: the graphs\n"
		"                   dealt to the threads, summed in thread "
		"order (the weights\n"
		"                   then depend on the thread count)\n"
		"  --epochs E       epochs per run (default 5)\n"
		"  --lr X           first epoch's learning rate, falling "
		"linearly to X / E\n"
		"                   at the last (default 0.1)\n"
		"  --seed S         initial weights and orders (default 1)\n"
		"  --subset N       train on the first N words of each "
		"language only\n"
		"  --test-subset N  test on the first N words of each language "
		"only\n"
		"  --csv FILE       write each epoch's figures\n"
		"  --export DIR     write the initial weights, learning rates "
		"and orders\n"
		"                   for bench/compare/ (words.hpp), and train "
		"nothing\n"
		"  --min-test-accuracy P  exit 1 unless every run ends at P% "
		"or more\n"
		"  --same-weights   exit 1 unless the runs end with bitwise "
		"identical weights:\n"
		"                   all of them in sync with units, else those "
		"with the same\n"
		"                   thread count\n"
		"  --same-as-plain  exit 1 unless every run on one thread ends "
		"with the\n"
		"                   weights of the plain trainer (trained "
		"after them); sync\n"
		"                   with --unit-words 0 only\n"
		"  --skip-if-missing  exit 77 (a skipped test) when DIR has no "
		"data\n",
		to);
}

/* Parses argv into o; false on bad usage. */
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
		} else if (a == "--same-as-plain") {
			o.same_as_plain = true;
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
			else if (std::strcmp(v, "plain") == 0)
				o.how = mode::plain;
			else
				return false;
		} else if (a == "--models") {
			if (!cli::whole_number(v, 1, 1024, n))
				return false;
			o.how = mode::models;
			o.models = static_cast<int>(n);
		} else if (a == "--graphs") {
			if (std::strcmp(v, "word") == 0)
				o.shape = graphs::word;
			else if (std::strcmp(v, "length") == 0)
				o.shape = graphs::length;
			else
				return false;
		} else if (a == "--batch" || a == "--epochs" ||
			   a == "--subset" || a == "--test-subset" ||
			   a == "--unit-words") {
			if (!cli::whole_number(
				    v,
				    a == "--batch" || a == "--epochs" ? 1 : 0,
				    1000000, n))
				return false;
			(a == "--batch"	       ? o.batch
			 : a == "--epochs"     ? o.epochs
			 : a == "--subset"     ? o.subset
			 : a == "--unit-words" ? o.unit_words
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
	if (o.how == mode::plain)
		for (int t : o.threads)
			if (t != 1)
				return false;
	/* Units would make T = 1 sum per unit, the plain trainer per batch:
	 * other bits. */
	if (o.same_as_plain && o.how == mode::sync && o.unit_words > 0)
		return false;
	return !o.data.empty() && o.lr > 0;
}

/* --export: what bench/compare/ reads (words.hpp's setup). */
void export_setup(const options &o, std::size_t n_train)
{
	if (mkdir(o.export_dir.c_str(), 0777) != 0 && errno != EEXIST)
		throw std::runtime_error(o.export_dir + ": " +
					 std::strerror(errno));
	words::setup s;
	s.epochs = o.epochs;
	s.batch = o.batch;
	s.subset = o.subset;
	s.seed = o.seed;
	s.initial = gru::initial_weights(o.seed);
	for (int e = 0; e < o.epochs; e++) {
		s.lr.push_back(gru::learning_rate(o.lr, o.epochs, e));
		s.order.push_back(
			gru::shuffled(static_cast<int>(n_train), o.seed, e));
	}
	words::write_setup(o.export_dir, s);
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
	 * thread's small matrices on that thread (OPENBLAS_NUM_THREADS=1
	 * keeps OpenBLAS's pool from starting; this covers a run without
	 * it). */
	openblas_set_num_threads(1);
	try {
		words::dataset train_set, test_set;
		try {
			train_set = words::read(o.data, "train.txt", o.subset);
			test_set =
				words::read(o.data, "test.txt", o.test_subset);
		} catch (const words::missing &e) {
			std::fprintf(stderr, "langid: %s\n", e.what());
			return o.skip_if_missing ? 77 : 1;
		}
		std::printf("%s: %zu training words, %zu test words, 9 "
			    "languages\n",
			    o.data.c_str(), train_set.size(), test_set.size());
		if (!o.export_dir.empty()) {
			export_setup(o, train_set.size());
			return 0;
		}
		std::FILE *csv = cli::open_csv(
			o.csv, "mode,threads,models,graphs,batch,epoch,"
			       "seconds,train_loss,test_loss,test_accuracy,"
			       "samples_per_s\n");
		int failed = 0;
		std::vector<outcome> outcomes;
		for (std::size_t r = 0; r < o.threads.size(); r++) {
			outcomes.push_back(train(o, o.threads[r], train_set,
						 test_set, csv));
			/* With units every run ends with the same weights,
			 * whatever its thread count. */
			if (!cli::check_run(o.threads, outcomes, r,
					    o.min_test_accuracy, o.same_weights,
					    o.how == mode::sync &&
						    o.unit_words > 0))
				failed = 1;
		}
		if (o.same_as_plain) {
			options plain = o;
			plain.how = mode::plain;
			outcome p =
				train(plain, 1, train_set, test_set, nullptr);
			for (std::size_t r = 0; r < o.threads.size(); r++)
				if (o.threads[r] == 1 &&
				    outcomes[r].hash != p.hash) {
					std::fprintf(
						stderr,
						"T=1 %s: weights %016" PRIx64
						", not the plain "
						"trainer's %016" PRIx64 "\n",
						mode_name(o.how),
						outcomes[r].hash, p.hash);
					failed = 1;
				}
		}
		if (!cli::close_csv(csv, o.csv))
			failed = 1;
		return failed;
	} catch (const std::exception &e) {
		std::fprintf(stderr, "langid: %s\n", e.what());
		return 1;
	}
}
