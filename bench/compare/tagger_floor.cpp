// The floor of examples/tagger: its model (examples/tagger/lstm.hpp)
// trained by the same SGD, from the same setup (tagger --export), with the
// backward through time written out by hand and no autodiff at all, on one
// thread. It batches as the trainer's default does (--graphs length): a
// batch's sentences in groups of one length, the batch's rare words
// spelled in groups of one spelling length (sync shares them by work unit,
// half a batch by default), every time step of a group one product of its
// rows; and it calls the same kernels, so what the trainer
// takes above it, on one thread, is libadg's (recording, the backward,
// gradients as values) and the trainer's own. Gradients are dense and
// summed in place, an embedding's only in the rows the batch touched
// (those rows alone are cleared and updated).
//
// Usage: tagger_floor SETUP_DIR DATA_DIR [TEST_SENTENCES]
// DATA_DIR is the unpacked corpus (scripts/fetch-brown.sh prints it);
// TEST_SENTENCES, when given, evaluates on the first that many test
// sentences only. Prints a line per epoch (the mean training loss per
// token, the test loss and accuracy) and a "result key=value ..." line, as
// the trainer does. Built by scripts/compare-tagger.sh; not part of
// libadg's build.
#include "brown.hpp"
#include "lstm.hpp"
#include "setup.hpp"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

extern "C" void openblas_set_num_threads(int);

namespace
{

using lstm::char_cell;
using lstm::char_hidden;
using lstm::features;
using lstm::mlp_hidden;
using lstm::word_cell;
using lstm::word_dim;
using lstm::word_hidden;
using spelling = const std::vector<int> *;

// One LSTM direction's forward values over a sequence, kept for its
// backward, and its gradients' scratch.
struct direction {
	std::vector<float> gates, c, h, dz, dx;
	void size_for(const lstm::cell &k, std::size_t rows)
	{
		gates.resize(rows * k.gates());
		c.resize(rows * k.hidden);
		h.resize(rows * k.hidden);
		dz.resize(rows * k.gates());
		dx.resize(rows * k.in);
	}
};

// A group of n rare words of one spelling length: their char ids and
// embedded bytes, both directions' values, their embeddings (n x 128)
// and the gradient those get from the word LSTMs.
struct spell_group {
	int n = 0, len = 0;
	std::vector<spelling> words;
	std::vector<int> ids;
	std::vector<float> x, out, dout, dh_last;
	direction dir[2];
};

// The trainer's model and its gradients, and the scratch of one group of
// sentences.
struct floor_model {
	lstm::weights w, g;
	int n_tags = 0;
	// scratch, grown to the largest group and reused
	std::vector<int> ids, tags;
	std::vector<float> x, feat, m, scores, dscores, dm, dfeat, dhf, dhb, dw,
		db;
	direction dir[2];
	std::vector<spell_group> groups; // [0, n_groups) in use
	int n_groups = 0;
	std::vector<int> touched_words, touched_chars;

	// W's and b's gradients of one sequence_backward, added to g.
	void add_gradient(int p_w, int p_b)
	{
		for (std::size_t i = 0; i < g[p_w].size(); i++)
			g[p_w][i] += dw[i];
		for (std::size_t i = 0; i < g[p_b].size(); i++)
			g[p_b][i] += db[i];
	}

	void spell_forward(spell_group &sg)
	{
		const std::size_t rows =
			static_cast<std::size_t>(sg.len) * sg.n;
		sg.ids = lstm::spelled(sg.words);
		sg.x.resize(rows * lstm::char_dim);
		lstm::gather(w[lstm::p_char_embed].data(), lstm::char_dim,
			     sg.ids.data(), static_cast<int>(rows), sg.x.data(),
			     lstm::char_dim);
		sg.out.resize(static_cast<std::size_t>(sg.n) * word_dim);
		sg.dout.assign(static_cast<std::size_t>(sg.n) * word_dim, 0.0f);
		for (int d = 0; d < 2; d++) {
			direction &r = sg.dir[d];
			r.size_for(char_cell, rows);
			lstm::sequence_forward(
				char_cell, sg.len, sg.n, d == 1, sg.x.data(),
				w[d == 0 ? lstm::p_char_fwd_w
					 : lstm::p_char_bwd_w]
					.data(),
				w[d == 0 ? lstm::p_char_fwd_b
					 : lstm::p_char_bwd_b]
					.data(),
				r.gates.data(), r.c.data(), r.h.data());
			const float *last =
				r.h.data() + static_cast<std::size_t>(
						     d == 0 ? sg.len - 1 : 0) *
						     sg.n * char_hidden;
			for (int b = 0; b < sg.n; b++)
				std::copy_n(
					last + static_cast<std::size_t>(b) *
							char_hidden,
					char_hidden,
					sg.out.data() +
						static_cast<std::size_t>(b) *
							word_dim +
						d * char_hidden);
		}
		for (int id : sg.ids)
			touched_chars.push_back(id);
	}

	void spell_backward(spell_group &sg)
	{
		const std::size_t rows =
			static_cast<std::size_t>(sg.len) * sg.n;
		sg.dh_last.resize(static_cast<std::size_t>(sg.n) * char_hidden);
		for (int d = 0; d < 2; d++) {
			direction &r = sg.dir[d];
			for (int b = 0; b < sg.n; b++)
				std::copy_n(
					sg.dout.data() +
						static_cast<std::size_t>(b) *
							word_dim +
						d * char_hidden,
					char_hidden,
					sg.dh_last.data() +
						static_cast<std::size_t>(b) *
							char_hidden);
			const int p_w = d == 0 ? lstm::p_char_fwd_w
					       : lstm::p_char_bwd_w;
			dw.resize(g[p_w].size());
			db.resize(g[p_w + 1].size());
			lstm::sequence_backward(
				char_cell, sg.len, sg.n, d == 1, sg.x.data(),
				w[p_w].data(), r.gates.data(), r.c.data(),
				r.h.data(), nullptr, sg.dh_last.data(),
				r.dz.data(), r.dx.data(), dw.data(), db.data());
			add_gradient(p_w, p_w + 1);
			lstm::scatter_add(r.dx.data(), lstm::char_dim,
					  sg.ids.data(), static_cast<int>(rows),
					  lstm::char_dim,
					  g[lstm::p_char_embed].data());
		}
	}

	// Forward and backward of n sentences of length len, adding the
	// gradients of scale times their summed loss into g (a rare word's
	// embedding's into its spell group's dout). rare[b][t]: the (group,
	// index) of sentence b's word t when spelled, else (-1, 0). Returns
	// the summed loss.
	double sentence_group(
		const std::vector<const brown::sentence *> &s, int len,
		const std::vector<std::vector<std::pair<int, int>>> &rare,
		float scale)
	{
		const int n = static_cast<int>(s.size()), rows = n * len;
		const auto R = static_cast<std::size_t>(rows);
		ids.resize(R);
		tags.resize(R);
		for (int b = 0; b < n; b++)
			for (int t = 0; t < len; t++) {
				std::size_t r =
					static_cast<std::size_t>(t) * n + b;
				ids[r] = s[b]->words[t];
				tags[r] = s[b]->tags[t];
			}
		x.resize(R * word_dim);
		lstm::gather(w[lstm::p_word_embed].data(), word_dim, ids.data(),
			     rows, x.data(), word_dim);
		for (int b = 0; b < n; b++)
			for (int t = 0; t < len; t++) {
				auto [k, i] = rare[b][t];
				if (k >= 0)
					std::copy_n(
						groups[k].out.data() +
							static_cast<
								std::size_t>(
								i) *
								word_dim,
						word_dim,
						x.data() +
							(static_cast<
								 std::size_t>(
								 t) *
								 n +
							 b) * word_dim);
			}
		for (int d = 0; d < 2; d++) {
			dir[d].size_for(word_cell, R);
			lstm::sequence_forward(
				word_cell, len, n, d == 1, x.data(),
				w[d == 0 ? lstm::p_word_fwd_w
					 : lstm::p_word_bwd_w]
					.data(),
				w[d == 0 ? lstm::p_word_fwd_b
					 : lstm::p_word_bwd_b]
					.data(),
				dir[d].gates.data(), dir[d].c.data(),
				dir[d].h.data());
		}
		feat.resize(R * features);
		for (std::size_t r = 0; r < R; r++)
			for (int d = 0; d < 2; d++)
				std::copy_n(dir[d].h.data() + r * word_hidden,
					    word_hidden,
					    feat.data() + r * features +
						    d * word_hidden);
		m.resize(R * mlp_hidden);
		scores.resize(R * n_tags);
		dscores.resize(R * n_tags);
		lstm::layer_forward(rows, features, mlp_hidden, feat.data(),
				    w[lstm::p_mlp_w].data(),
				    w[lstm::p_mlp_b].data(), true, m.data());
		lstm::layer_forward(rows, mlp_hidden, n_tags, m.data(),
				    w[lstm::p_out_w].data(),
				    w[lstm::p_out_b].data(), false,
				    scores.data());
		double loss = lstm::cross_entropy(rows, n_tags, scores.data(),
						  tags.data(), scale,
						  dscores.data(), nullptr);

		// Backward: the output layer, the MLP, both word LSTMs.
		dm.resize(R * mlp_hidden);
		dfeat.resize(R * features);
		dw.resize(g[lstm::p_out_w].size());
		db.resize(g[lstm::p_out_b].size());
		lstm::layer_backward(rows, mlp_hidden, n_tags, m.data(),
				     w[lstm::p_out_w].data(), scores.data(),
				     false, dscores.data(), dw.data(),
				     db.data(), dm.data());
		add_gradient(lstm::p_out_w, lstm::p_out_b);
		dw.resize(g[lstm::p_mlp_w].size());
		db.resize(g[lstm::p_mlp_b].size());
		lstm::layer_backward(rows, features, mlp_hidden, feat.data(),
				     w[lstm::p_mlp_w].data(), m.data(), true,
				     dm.data(), dw.data(), db.data(),
				     dfeat.data());
		add_gradient(lstm::p_mlp_w, lstm::p_mlp_b);
		dhf.resize(R * word_hidden);
		dhb.resize(R * word_hidden);
		for (std::size_t r = 0; r < R; r++) {
			std::copy_n(dfeat.data() + r * features, word_hidden,
				    dhf.data() + r * word_hidden);
			std::copy_n(dfeat.data() + r * features + word_hidden,
				    word_hidden, dhb.data() + r * word_hidden);
		}
		for (int d = 0; d < 2; d++) {
			const int p_w = d == 0 ? lstm::p_word_fwd_w
					       : lstm::p_word_bwd_w;
			dw.resize(g[p_w].size());
			db.resize(g[p_w + 1].size());
			lstm::sequence_backward(
				word_cell, len, n, d == 1, x.data(),
				w[p_w].data(), dir[d].gates.data(),
				dir[d].c.data(), dir[d].h.data(),
				d == 0 ? dhf.data() : dhb.data(), nullptr,
				dir[d].dz.data(), dir[d].dx.data(), dw.data(),
				db.data());
			add_gradient(p_w, p_w + 1);
		}
		// The inputs' gradient: a known word's to its embedding, a
		// spelled word's to its spell group.
		float *g_embed = g[lstm::p_word_embed].data();
		for (int b = 0; b < n; b++)
			for (int t = 0; t < len; t++) {
				std::size_t r =
					static_cast<std::size_t>(t) * n + b;
				auto [k, i] = rare[b][t];
				float *to =
					k >= 0 ? groups[k].dout.data() +
							 static_cast<
								 std::size_t>(
								 i) *
								 word_dim
					       : g_embed + static_cast<
								   std::size_t>(
								   ids[r]) *
								   word_dim;
				const float *f =
					dir[0].dx.data() + r * word_dim;
				const float *bk =
					dir[1].dx.data() + r * word_dim;
				for (int j = 0; j < word_dim; j++)
					to[j] += f[j] + bk[j];
				if (k < 0)
					touched_words.push_back(ids[r]);
			}
		return loss;
	}

	// Spells the rare words of the sentences s (none when !chars) in
	// groups of one spelling length, into groups[0 .. n_groups); returns
	// per sentence and word its (group, index), or (-1, 0).
	std::vector<std::vector<std::pair<int, int>>>
	spell_rare(const std::vector<const brown::sentence *> &s, bool chars)
	{
		std::vector<std::vector<std::pair<int, int>>> rare(s.size());
		std::map<std::size_t, int> group_of;
		n_groups = 0;
		for (std::size_t b = 0; b < s.size(); b++) {
			const brown::sentence &x0 = *s[b];
			rare[b].assign(x0.words.size(), {-1, 0});
			if (!chars)
				continue;
			for (std::size_t t = 0; t < x0.words.size(); t++) {
				if (x0.words[t] != 0)
					continue;
				auto [it, added] = group_of.try_emplace(
					x0.spellings[t].size(), n_groups);
				if (added) {
					if (groups.size() <=
					    static_cast<std::size_t>(n_groups))
						groups.emplace_back();
					groups[n_groups].words.clear();
					n_groups++;
				}
				spell_group &sg = groups[it->second];
				rare[b][t] = {
					it->second,
					static_cast<int>(sg.words.size())};
				sg.words.push_back(&x0.spellings[t]);
			}
		}
		for (int k = 0; k < n_groups; k++) {
			groups[k].n = static_cast<int>(groups[k].words.size());
			groups[k].len =
				static_cast<int>(groups[k].words[0]->size()) +
				2;
			spell_forward(groups[k]);
		}
		return rare;
	}

	// One SGD step on the batch s (its mean loss); returns its summed
	// loss.
	double batch_step(std::vector<const brown::sentence *> s, bool chars,
			  float lr)
	{
		long tokens = 0;
		for (auto *x0 : s)
			tokens += static_cast<long>(x0->words.size());
		const float scale = 1.0f / static_cast<float>(tokens);
		for (int p = 0; p < lstm::n_params; p++)
			if (p != lstm::p_word_embed && p != lstm::p_char_embed)
				std::fill(g[p].begin(), g[p].end(), 0.0f);
		clear_rows(lstm::p_word_embed, touched_words, word_dim);
		clear_rows(lstm::p_char_embed, touched_chars, lstm::char_dim);
		touched_words.clear();
		touched_chars.clear();

		// The batch's sentences by length, a group each, as the
		// trainer's graphs take them; the batch's rare words spelled
		// in groups of one spelling length, as those graphs share
		// their char ops.
		std::stable_sort(s.begin(), s.end(), [](auto *a, auto *b) {
			return a->words.size() < b->words.size();
		});
		auto rare = spell_rare(s, chars);
		double loss = 0;
		for (std::size_t i = 0, j; i < s.size(); i = j) {
			const std::size_t len = s[i]->words.size();
			for (j = i + 1;
			     j < s.size() && s[j]->words.size() == len; j++)
				;
			std::vector<const brown::sentence *> part(
				s.begin() + static_cast<long>(i),
				s.begin() + static_cast<long>(j));
			std::vector<std::vector<std::pair<int, int>>> where(
				rare.begin() + static_cast<long>(i),
				rare.begin() + static_cast<long>(j));
			loss += sentence_group(part, static_cast<int>(len),
					       where, scale);
		}
		for (int k = 0; k < n_groups; k++)
			spell_backward(groups[k]);

		// SGD: every dense parameter, the touched rows of the tables.
		for (int p = 0; p < lstm::n_params; p++)
			if (p != lstm::p_word_embed && p != lstm::p_char_embed)
				for (std::size_t i = 0; i < w[p].size(); i++)
					w[p][i] -= lr * g[p][i];
		step_rows(lstm::p_word_embed, touched_words, word_dim, lr);
		step_rows(lstm::p_char_embed, touched_chars, lstm::char_dim,
			  lr);
		return loss;
	}

	void clear_rows(int p, const std::vector<int> &rows, int cols)
	{
		for (int r : rows)
			std::fill_n(g[p].data() +
					    static_cast<std::size_t>(r) * cols,
				    cols, 0.0f);
	}

	// w -= lr g on each distinct row of rows.
	void step_rows(int p, std::vector<int> &rows, int cols, float lr)
	{
		std::sort(rows.begin(), rows.end());
		rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
		for (int r : rows) {
			std::size_t at = static_cast<std::size_t>(r) * cols;
			for (int j = 0; j < cols; j++)
				w[p][at + j] -= lr * g[p][at + j];
		}
	}
};

// The setup's flat weights as lstm.hpp's 14 vectors.
lstm::weights from_setup(const tagger::setup &s)
{
	lstm::weights w;
	auto table = lstm::shapes({s.n_words, s.n_chars, s.n_tags});
	std::size_t at = 0;
	for (int p = 0; p < lstm::n_params; p++) {
		std::size_t n =
			static_cast<std::size_t>(table[p].rows) * table[p].cols;
		w[p].assign(s.weights.begin() + static_cast<long>(at),
			    s.weights.begin() + static_cast<long>(at + n));
		at += n;
	}
	if (at != s.weights.size())
		throw std::runtime_error("the setup's weights are not "
					 "lstm.hpp's table");
	return w;
}

} // namespace

int main(int argc, char **argv)
{
	if (argc != 3 && argc != 4) {
		std::fprintf(stderr, "usage: tagger_floor SETUP_DIR DATA_DIR "
				     "[TEST_SENTENCES]\n");
		return 2;
	}
	long test_sentences = argc == 4 ? std::atol(argv[3]) : -1;
	if (argc == 4 && test_sentences < 1) {
		std::fprintf(stderr, "test sentences: >= 1\n");
		return 2;
	}
	openblas_set_num_threads(1); // one thread: the floor at T = 1
	try {
		tagger::setup s = tagger::read_setup(argv[1]);
		brown::corpus c = brown::load(argv[2]);
		if (s.n_words != static_cast<int>(c.words.size()) ||
		    s.n_chars != static_cast<int>(c.chars.size()) ||
		    s.n_tags != static_cast<int>(c.tags.size()))
			throw std::runtime_error(
				"the setup's sizes are not the corpus's");
		const int n = static_cast<int>(
			s.order.size() / static_cast<std::size_t>(s.epochs));
		if (static_cast<std::size_t>(n) > c.train.size())
			throw std::runtime_error(
				"the setup orders more "
				"sentences than the corpus has");
		if (test_sentences > 0 &&
		    static_cast<std::size_t>(test_sentences) < c.test.size())
			c.test.resize(static_cast<std::size_t>(test_sentences));
		floor_model fm;
		fm.w = from_setup(s);
		fm.g = fm.w;
		for (auto &v : fm.g)
			std::fill(v.begin(), v.end(), 0.0f);
		fm.n_tags = s.n_tags;
		double seconds = 0, accuracy = 0, tokens_seen = 0, loss = 0;
		for (int e = 0; e < s.epochs; e++) {
			const std::int32_t *order =
				&s.order[static_cast<std::size_t>(e) * n];
			double sum = 0, words = 0;
			auto start = std::chrono::steady_clock::now();
			for (int first = 0; first < n; first += s.batch) {
				int size = std::min(s.batch, n - first);
				std::vector<const brown::sentence *> batch;
				for (int i = 0; i < size; i++) {
					const auto &x =
						c.train[order[first + i]];
					if (x.words.empty())
						continue;
					batch.push_back(&x);
					words += static_cast<double>(
						x.words.size());
				}
				if (!batch.empty())
					sum += fm.batch_step(batch, s.chars,
							     s.lr[e]);
			}
			std::chrono::duration<double> took =
				std::chrono::steady_clock::now() - start;
			seconds += took.count();
			tokens_seen += words;
			loss = sum / words;
			lstm::scores sc =
				lstm::evaluate(fm.w, c.test, s.chars, s.n_tags);
			accuracy = sc.accuracy;
			std::printf(
				"floor epoch %2d  loss %.4f  test loss %.4f  "
				"test %6.2f%%  %8.0f samples/s  %8.0f "
				"words/s\n",
				e + 1, loss, sc.loss, sc.accuracy,
				n / took.count(), words / took.count());
			std::fflush(stdout);
		}
		std::printf("result mode=floor threads=1 models=1 batch=%d "
			    "chars=%s epochs=%d samples_per_s=%.1f "
			    "words_per_s=%.0f test_accuracy=%.2f "
			    "weights=%016" PRIx64 " loss=%.6f side=floor\n",
			    s.batch, s.chars ? "on" : "off", s.epochs,
			    static_cast<double>(n) * s.epochs / seconds,
			    tokens_seen / seconds, accuracy,
			    lstm::fingerprint(fm.w), loss);
	} catch (const std::exception &e) {
		std::fprintf(stderr, "tagger_floor: %s\n", e.what());
		return 1;
	}
	return 0;
}
