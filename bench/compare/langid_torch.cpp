// examples/langid's model (a byte embedding of 32, a GRU of hidden size
// 64, a linear layer to 9 languages, softmax cross-entropy, SGD) written
// with PyTorch's C++ API (libtorch) as a PyTorch user would, both ways
// such a user spends T cores, to compare with libadg: the same words, the
// same initial weights, learning rates and batch order (read from the
// folder `langid --export` writes; words.hpp describes it).
//
// - batched: each mini-batch's words padded to its longest, packed
//   (pack_padded_sequence) and run through torch::nn::GRU, one graph per
//   batch, its ops spread over T intra-op threads (at::set_num_threads(T),
//   OpenBLAS's T threads in the products).
// - word: one graph per word, a torch::nn::GRUCell called once per byte;
//   T threads of our own take whole batches in turn (Hogwild), each with
//   one intra-op thread and modules of its own whose parameters alias the
//   shared ones' storage (as in fashion_torch.cpp: with the shared tensors
//   themselves, one thread's in-place update bumps the version counter
//   another thread's graph saved, and its backward fails).
// Inter-op threads are 1. BLAS threads can only be set from the
// environment before the library loads, so this program checks that
// OPENBLAS_NUM_THREADS is T in batched mode and 1 in word mode.
//
// Usage: langid_torch batched|word SETUP_DIR DATA_DIR THREADS
// Prints a line per epoch and a "result key=value ..." line, as langid
// does, with cpu_per_wall: the process's CPU time over the wall time of
// the training (evaluation excluded). Built by scripts/compare-langid.sh;
// not part of libadg's build.
#include "timing.hpp"
#include "words.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace
{

namespace nn = torch::nn;
using gru::classes;
using gru::embed;
using gru::hidden;

// The parameters as one set of tensors in the export's order (embed,
// w_ih, w_hh, b_ih, b_hh, w_out, b_out), shaped as torch's modules keep
// them.
std::vector<torch::Tensor> from_setup(const words::setup &s)
{
	std::vector<torch::Tensor> t;
	for (int p = 0; p < gru::n_params; p++) {
		auto v = torch::tensor(s.initial[p]);
		const gru::shape &sh = gru::shapes[p];
		t.push_back(sh.rows == 1 ? v : v.reshape({sh.rows, sh.cols}));
	}
	return t;
}

// The modules of the model, their parameters set to the tensors of p
// (set_data: the module's parameter then aliases p's storage).
struct modules {
	nn::Embedding embedding{gru::n_bytes, embed};
	nn::GRU rnn{nn::GRUOptions(embed, hidden)};
	nn::GRUCell cell{nn::GRUCellOptions(embed, hidden)};
	nn::Linear out{hidden, classes};

	explicit modules(const std::vector<torch::Tensor> &p)
	{
		embedding->weight.set_data(p[gru::p_embed]);
		for (auto &item : rnn->named_parameters()) {
			const std::string &name = item.key();
			int k = name == "weight_ih_l0"	 ? gru::p_w_ih
				: name == "weight_hh_l0" ? gru::p_w_hh
				: name == "bias_ih_l0"	 ? gru::p_b_ih
							 : gru::p_b_hh;
			item.value().set_data(p[k]);
		}
		cell->weight_ih.set_data(p[gru::p_w_ih]);
		cell->weight_hh.set_data(p[gru::p_w_hh]);
		cell->bias_ih.set_data(p[gru::p_b_ih]);
		cell->bias_hh.set_data(p[gru::p_b_hh]);
		out->weight.set_data(p[gru::p_w_out]);
		out->bias.set_data(p[gru::p_b_out]);
	}

	// The parameters a mode's graphs reach: the GRU's or the cell's,
	// which alias the same storage but each get their own gradients.
	std::vector<torch::Tensor> parameters(bool batched_mode) const
	{
		std::vector<torch::Tensor> all{embedding->weight};
		if (batched_mode)
			for (const auto &p : rnn->parameters())
				all.push_back(p);
		else
			all.insert(all.end(), {cell->weight_ih, cell->weight_hh,
					       cell->bias_ih, cell->bias_hh});
		all.insert(all.end(), {out->weight, out->bias});
		return all;
	}

	// A batch's logits, its words padded and packed through the GRU.
	torch::Tensor batched(const words::dataset &d, const int *ids, int n)
	{
		std::size_t longest = 0;
		for (int i = 0; i < n; i++)
			longest = std::max(longest, d.text[ids[i]].size());
		auto bytes = torch::zeros(
			{static_cast<long>(longest), static_cast<long>(n)},
			torch::kLong);
		std::vector<long> lengths(static_cast<std::size_t>(n));
		auto b = bytes.accessor<long, 2>();
		for (int i = 0; i < n; i++) {
			const std::string &w = d.text[ids[i]];
			lengths[i] = static_cast<long>(w.size());
			for (std::size_t t = 0; t < w.size(); t++)
				b[static_cast<long>(t)][i] =
					static_cast<unsigned char>(w[t]);
		}
		auto packed = nn::utils::rnn::pack_padded_sequence(
			embedding(bytes), torch::tensor(lengths), false, false);
		auto h = std::get<1>(rnn->forward_with_packed_input(packed));
		return out(h[0]);
	}

	// One word's logits (1 x 9), a cell call per byte.
	torch::Tensor word(const std::string &w)
	{
		std::vector<long> b(w.begin(), w.end());
		for (long &v : b)
			v &= 0xff;
		auto x = embedding(torch::tensor(b));
		torch::Tensor h;
		for (long t = 0; t < static_cast<long>(b.size()); t++)
			h = t == 0 ? cell(x.slice(0, 0, 1))
				   : cell(x.slice(0, t, t + 1), h);
		return out(h);
	}
};

// Test accuracy (%) and mean loss, 512 words at a time, no graph.
std::pair<double, double> evaluate(modules &m, const words::dataset &test)
{
	torch::NoGradGuard no_grad;
	std::vector<int> ids(test.size());
	for (std::size_t i = 0; i < ids.size(); i++)
		ids[i] = static_cast<int>(i);
	double right = 0, loss = 0;
	for (std::size_t first = 0; first < ids.size(); first += 512) {
		int n = static_cast<int>(
			std::min<std::size_t>(512, ids.size() - first));
		auto logits = m.batched(test, &ids[first], n);
		auto y = torch::tensor(std::vector<long>(
			test.label.begin() + static_cast<long>(first),
			test.label.begin() + static_cast<long>(first) + n));
		right += logits.argmax(1).eq(y).sum().item<double>();
		loss += torch::nn::functional::cross_entropy(
				logits, y,
				nn::functional::CrossEntropyFuncOptions()
					.reduction(torch::kSum))
				.item<double>();
	}
	return {100.0 * right / static_cast<double>(test.size()),
		loss / static_cast<double>(test.size())};
}

} // namespace

int main(int argc, char **argv)
{
	if (argc != 5) {
		std::fprintf(stderr,
			     "usage: langid_torch batched|word SETUP_DIR "
			     "DATA_DIR THREADS\n");
		return 2;
	}
	std::string mode = argv[1];
	if (mode != "batched" && mode != "word") {
		std::fprintf(stderr, "mode: batched or word\n");
		return 2;
	}
	int n_threads = std::atoi(argv[4]);
	if (n_threads < 1 || n_threads > 1024) {
		std::fprintf(stderr, "threads: 1 to 1024\n");
		return 2;
	}
	int intra = mode == "batched" ? n_threads : 1;
	const char *blas = std::getenv("OPENBLAS_NUM_THREADS");
	if (blas == nullptr || std::atoi(blas) != intra) {
		std::fprintf(stderr,
			     "langid_torch: %s on %d threads wants "
			     "OPENBLAS_NUM_THREADS=%d in the environment (it "
			     "is %s)\n",
			     mode.c_str(), n_threads, intra,
			     blas != nullptr ? blas : "unset");
		return 2;
	}
	torch::set_num_interop_threads(1);
	torch::set_num_threads(intra);
	try {
		words::setup s = words::read_setup(argv[2]);
		words::dataset train =
			words::read(argv[3], "train.txt", s.subset);
		words::dataset test = words::read(argv[3], "test.txt");
		if (s.order[0].size() != train.size())
			throw std::runtime_error(
				"the setup orders another number of words");
		std::vector<torch::Tensor> shared = from_setup(s);
		modules main_modules(shared);
		const int n = static_cast<int>(train.size());
		const int n_batches = (n + s.batch - 1) / s.batch;
		timing::epoch_clock timer;
		double accuracy = 0;
		std::atomic<int> wrong_threads{0};
		for (int e = 0; e < s.epochs; e++) {
			const std::vector<int> &order = s.order[e];
			std::atomic<int> next{0};
			// One thread's epoch, on modules over the shared
			// parameters: zero_grad, forward, backward, step, per
			// batch, taking batches in turn from next.
			auto train_on = [&](modules &m) {
				torch::optim::SGD sgd(
					m.parameters(mode == "batched"),
					torch::optim::SGDOptions(s.lr[e]));
				for (;;) {
					// Relaxed: hands out batch numbers,
					// publishes nothing.
					int k = next.fetch_add(
						1, std::memory_order_relaxed);
					if (k >= n_batches)
						break;
					int first = k * s.batch;
					int size = std::min(s.batch, n - first);
					const int *ids = &order[first];
					sgd.zero_grad();
					torch::Tensor loss;
					if (mode == "batched") {
						std::vector<long> y;
						for (int i = 0; i < size; i++)
							y.push_back(
								train.label
									[ids[i]]);
						loss = nn::functional::
							cross_entropy(
								m.batched(train,
									  ids,
									  size),
								torch::tensor(
									y));
					} else {
						std::vector<torch::Tensor>
							losses;
						for (int i = 0; i < size; i++)
							losses.push_back(nn::functional::cross_entropy(
								m.word(train.text
									       [ids[i]]),
								torch::tensor({static_cast<
									long>(
									train.label
										[ids[i]])})));
						loss = torch::stack(losses)
							       .sum() /
						       size;
					}
					loss.backward();
					sgd.step();
				}
			};
			timer.start();
			if (mode == "batched" || n_threads == 1) {
				train_on(main_modules);
			} else {
				std::vector<std::thread> threads;
				for (int t = 0; t < n_threads; t++)
					threads.emplace_back([&] {
						// Each thread's own setting,
						// from at::set_num_threads.
						if (torch::get_num_threads() !=
						    1)
							wrong_threads++;
						std::vector<torch::Tensor> view;
						for (auto &p : shared)
							view.push_back(torch::from_blob(
								p.data_ptr<
									float>(),
								p.sizes()));
						modules mine(view);
						train_on(mine);
					});
				for (auto &t : threads)
					t.join();
			}
			double took = timer.stop();
			auto [acc, test_loss] = evaluate(main_modules, test);
			accuracy = acc;
			std::printf(
				"T=%d torch %s epoch %2d  test loss %.4f  test "
				"%6.2f%%  %9.0f samples/s\n",
				n_threads, mode.c_str(), e + 1, test_loss,
				accuracy, n / took);
			std::fflush(stdout);
		}
		if (wrong_threads.load() != 0)
			throw std::runtime_error("a Hogwild thread had more "
						 "than one intra-op thread");
		std::printf("result side=torch mode=%s threads=%d batch=%d "
			    "epochs=%d samples_per_s=%.0f test_accuracy=%.2f "
			    "cpu_per_wall=%.2f intra_op=%d inter_op=%d "
			    "openblas=%s os_threads=%d\n",
			    mode.c_str(), n_threads, s.batch, s.epochs,
			    static_cast<double>(n) * s.epochs / timer.wall(),
			    accuracy, timer.cpu() / timer.wall(),
			    torch::get_num_threads(),
			    torch::get_num_interop_threads(), blas,
			    timing::os_threads());
	} catch (const std::exception &e) {
		std::fprintf(stderr, "langid_torch: %s\n", e.what());
		return 1;
	}
	return 0;
}
