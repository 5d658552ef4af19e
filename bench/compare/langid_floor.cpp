// The floor of examples/langid: its model (examples/langid/gru.hpp)
// trained by the same SGD, from the same setup (langid --export), with the
// backward through time written out by hand and no autodiff at all. It
// batches as langid's default does (--graphs length: each batch's words
// grouped by length, each group's time steps multiplying n x 64 matrices)
// and calls the same kernels, so what langid takes above it, on one
// thread, is libadg's (recording, the backward, gradients as values) and
// the trainer's. Gradients are dense and summed in place: each weight's in
// one product per group, over all its time steps.
//
// Usage: langid_floor SETUP_DIR DATA_DIR
// Prints a line per epoch and a "result key=value ..." line, as langid
// does. Built by scripts/compare-langid.sh; not part of libadg's build.
#include "gru.hpp"
#include "words.hpp"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace
{

using gru::classes;
using gru::embed;
using gru::gates;
using gru::hidden;

// One group's forward values, kept for its backward, and its gradients'
// scratch: grown to the largest group, reused.
struct group_buffers {
	std::vector<unsigned char> bytes;
	std::vector<int> labels;
	std::vector<float> x, gi, saved, ghn, h, logits, dlogits, dh, dh_prev,
		dgi, dgh, dx;
	void size_for(int n, int len)
	{
		auto rows = static_cast<std::size_t>(n) * len;
		bytes.resize(rows);
		labels.resize(static_cast<std::size_t>(n));
		x.resize(rows * embed);
		gi.resize(rows * gates);
		saved.resize(rows * gates);
		ghn.resize(rows * hidden);
		h.resize(rows * hidden);
		logits.resize(static_cast<std::size_t>(n) * classes);
		dlogits.resize(static_cast<std::size_t>(n) * classes);
		dh.resize(static_cast<std::size_t>(n) * hidden);
		dh_prev.resize(static_cast<std::size_t>(n) * hidden);
		dgi.resize(rows * gates);
		dgh.resize(rows * gates);
		dx.resize(rows * embed);
	}
};

// Forward and backward of n words of length len (ids into d), adding the
// gradients of scale times their summed loss into g. Returns the loss.
double group_step(const gru::weights &w, const words::dataset &d,
		  const int *ids, int n, int len, float scale, gru::weights &g,
		  group_buffers &m)
{
	const int rows = n * len;
	m.size_for(n, len);
	for (int b = 0; b < n; b++) {
		m.labels[b] = d.label[ids[b]];
		for (int t = 0; t < len; t++)
			m.bytes[static_cast<std::size_t>(t) * n + b] =
				static_cast<unsigned char>(d.text[ids[b]][t]);
	}
	// Forward, every time step's values kept.
	gru::embed_bytes(w[gru::p_embed].data(), m.bytes.data(), rows,
			 m.x.data());
	gru::project(rows, m.x.data(), w[gru::p_w_ih].data(),
		     w[gru::p_b_ih].data(), m.gi.data());
	auto at = [n](int t, int cols) {
		return static_cast<std::size_t>(t) * n * cols;
	};
	for (int t = 0; t < len; t++)
		gru::cell_forward(n, m.gi.data() + at(t, gates),
				  t > 0 ? m.h.data() + at(t - 1, hidden)
					: nullptr,
				  w[gru::p_w_hh].data(), w[gru::p_b_hh].data(),
				  m.saved.data() + at(t, gates),
				  m.ghn.data() + at(t, hidden),
				  m.h.data() + at(t, hidden));
	const float *h_last = m.h.data() + at(len - 1, hidden);
	gru::classify(n, h_last, w[gru::p_w_out].data(), w[gru::p_b_out].data(),
		      m.logits.data());
	double loss =
		gru::cross_entropy(n, classes, m.logits.data(), m.labels.data(),
				   scale, m.dlogits.data(), nullptr);

	// Backward through time.
	gru::product_tn(n, classes, hidden, m.dlogits.data(), h_last,
			g[gru::p_w_out].data(), 1);
	gru::column_sums(n, classes, m.dlogits.data(), g[gru::p_b_out].data(),
			 true);
	gru::product_nn(n, hidden, classes, m.dlogits.data(),
			w[gru::p_w_out].data(), m.dh.data());
	for (int t = len - 1; t >= 0; t--) {
		gru::cell_backward(
			n, m.dh.data(),
			t > 0 ? m.h.data() + at(t - 1, hidden) : nullptr,
			m.saved.data() + at(t, gates),
			m.ghn.data() + at(t, hidden), w[gru::p_w_hh].data(),
			m.dgi.data() + at(t, gates),
			m.dgh.data() + at(t, gates),
			t > 0 ? m.dh_prev.data() : nullptr);
		std::swap(m.dh, m.dh_prev);
	}
	// W_hh's gradient from steps 1.. (step 0 saw h = 0), b_hh's from all.
	if (len > 1)
		gru::product_tn(rows - n, gates, hidden,
				m.dgh.data() + at(1, gates), m.h.data(),
				g[gru::p_w_hh].data(), 1);
	gru::column_sums(rows, gates, m.dgh.data(), g[gru::p_b_hh].data(),
			 true);
	gru::product_tn(rows, gates, embed, m.dgi.data(), m.x.data(),
			g[gru::p_w_ih].data(), 1);
	gru::column_sums(rows, gates, m.dgi.data(), g[gru::p_b_ih].data(),
			 true);
	gru::product_nn(rows, embed, gates, m.dgi.data(), w[gru::p_w_ih].data(),
			m.dx.data());
	gru::embed_backward(m.dx.data(), m.bytes.data(), rows, 0,
			    g[gru::p_embed].data());
	return loss;
}

} // namespace

int main(int argc, char **argv)
{
	if (argc != 3) {
		std::fprintf(stderr,
			     "usage: langid_floor SETUP_DIR DATA_DIR\n");
		return 2;
	}
	openblas_set_num_threads(1); // one thread: the floor at T = 1
	try {
		words::setup s = words::read_setup(argv[1]);
		words::dataset train_set =
			words::read(argv[2], "train.txt", s.subset);
		words::dataset test_set = words::read(argv[2], "test.txt");
		if (s.order[0].size() != train_set.size())
			throw std::runtime_error(
				"the setup orders another number of words");
		gru::weights w = s.initial, g = s.initial;
		group_buffers m;
		const int n = static_cast<int>(train_set.size());
		double seconds = 0, accuracy = 0;
		for (int e = 0; e < s.epochs; e++) {
			const std::vector<int> &order = s.order[e];
			double loss = 0;
			auto start = std::chrono::steady_clock::now();
			for (int first = 0; first < n; first += s.batch) {
				int size = std::min(s.batch, n - first);
				float scale = 1.0f / static_cast<float>(size);
				for (auto &v : g)
					std::fill(v.begin(), v.end(), 0.0f);
				// As langid --graphs length groups a batch.
				std::vector<int> ids(order.begin() + first,
						     order.begin() + first +
							     size);
				std::stable_sort(
					ids.begin(), ids.end(),
					[&](int a, int b) {
						return train_set.text[a]
							       .size() <
						       train_set.text[b].size();
					});
				for (int i = 0, j; i < size; i = j) {
					int len = static_cast<int>(
						train_set.text[ids[i]].size());
					for (j = i + 1;
					     j < size &&
					     train_set.text[ids[j]].size() ==
						     static_cast<std::size_t>(
							     len);
					     j++)
						;
					loss += group_step(w, train_set,
							   &ids[i], j - i, len,
							   scale, g, m);
				}
				for (int p = 0; p < gru::n_params; p++)
					for (std::size_t i = 0; i < w[p].size();
					     i++)
						w[p][i] -= s.lr[e] * g[p][i];
			}
			std::chrono::duration<double> took =
				std::chrono::steady_clock::now() - start;
			seconds += took.count();
			gru::scores sc =
				gru::evaluate(w, test_set.text, test_set.label);
			accuracy = sc.accuracy;
			std::printf(
				"floor epoch %2d  loss %.4f  test loss %.4f  "
				"test %6.2f%%  %9.0f samples/s\n",
				e + 1, loss / n, sc.loss, sc.accuracy,
				n / took.count());
			std::fflush(stdout);
		}
		std::printf("result side=floor mode=floor threads=1 batch=%d "
			    "epochs=%d samples_per_s=%.0f test_accuracy=%.2f "
			    "weights=%016" PRIx64 "\n",
			    s.batch, s.epochs,
			    static_cast<double>(n) * s.epochs / seconds,
			    accuracy, gru::fingerprint(w));
	} catch (const std::exception &e) {
		std::fprintf(stderr, "langid_floor: %s\n", e.what());
		return 1;
	}
	return 0;
}
