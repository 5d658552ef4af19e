// examples/digits/digits.c's model and training, written with PyTorch's
// C++ API (libtorch) as a PyTorch user would, to compare the two: the
// same data and split, the same initial weights, learning rates and
// batch order (read from the file `digits --export` writes; its format is
// described above write_setup in digits.c), Hogwild SGD on T threads.
//
// Usage: digits_torch SETUP DATA.csv THREADS
// Prints a line per epoch and a "result ..." line, as digits does.
// Built by scripts/compare-torch.sh; not part of libadg's build.
#include "timing.hpp"

#include <torch/torch.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace
{

struct Setup {
	int epochs = 0, batch = 0, n_train = 0;
	std::vector<float> lr;
	std::vector<float> w1, b1, w2, b2;
	std::vector<std::vector<int64_t>> order; // per epoch
};

void expect(std::istream &in, const std::string &word)
{
	std::string got;
	if (!(in >> got) || got != word)
		throw std::runtime_error("setup: expected \"" + word +
					 "\", read \"" + got + "\"");
}

template <typename T> std::vector<T> read_values(std::istream &in, size_t n)
{
	std::vector<T> v(n);
	for (auto &x : v)
		if (!(in >> x))
			throw std::runtime_error("setup: too few values");
	return v;
}

Setup read_setup(const std::string &path)
{
	std::ifstream in(path);
	if (!in)
		throw std::runtime_error(path + ": cannot open");
	Setup s;
	int version, pixels, hidden, classes;
	expect(in, "digits-setup");
	in >> version;
	expect(in, "sizes");
	in >> pixels >> hidden >> classes;
	if (!in || version != 1 || pixels != 64 || hidden != 64 ||
	    classes != 10)
		throw std::runtime_error(path + ": not a 64-64-10 setup, v1");
	expect(in, "epochs");
	in >> s.epochs;
	expect(in, "batch");
	in >> s.batch;
	expect(in, "train");
	in >> s.n_train;
	expect(in, "lr");
	s.lr = read_values<float>(in, s.epochs);
	expect(in, "w1");
	s.w1 = read_values<float>(in, 64 * 64);
	expect(in, "b1");
	s.b1 = read_values<float>(in, 64);
	expect(in, "w2");
	s.w2 = read_values<float>(in, 10 * 64);
	expect(in, "b2");
	s.b2 = read_values<float>(in, 10);
	for (int e = 0; e < s.epochs; e++) {
		expect(in, "order");
		s.order.push_back(read_values<int64_t>(in, s.n_train));
	}
	return s;
}

struct Split {
	torch::Tensor x, y; // n x 64 floats in 0..1, n labels
};

// Row i of the csv goes to the test set when i % 5 == 4, as in digits.c.
void read_digits(const std::string &path, Split &train, Split &test)
{
	std::ifstream in(path);
	if (!in)
		throw std::runtime_error(path + ": cannot open (run "
						"scripts/fetch-digits.sh)");
	std::vector<float> x[2];
	std::vector<int64_t> y[2];
	std::string line;
	for (int row = 0; std::getline(in, line); row++) {
		int part = row % 5 == 4;
		std::istringstream fields(line);
		std::string field;
		for (int i = 0; i <= 64; i++) {
			if (!std::getline(fields, field, ','))
				throw std::runtime_error(path + ": short line");
			int v = std::stoi(field);
			if (i < 64)
				x[part].push_back(static_cast<float>(v) / 16);
			else
				y[part].push_back(v);
		}
	}
	Split *out[2] = {&train, &test};
	for (int p = 0; p < 2; p++) {
		auto n = static_cast<int64_t>(y[p].size());
		out[p]->x = torch::tensor(x[p]).reshape({n, 64});
		out[p]->y = torch::tensor(y[p]);
	}
}

// The model: parameters are plain tensors, the layers functional calls.
struct Params {
	torch::Tensor w1, b1, w2, b2;
	std::vector<torch::Tensor> all() const
	{
		return {w1, b1, w2, b2};
	}
};

torch::Tensor forward(const Params &p, const torch::Tensor &x)
{
	namespace F = torch::nn::functional;
	return F::linear(torch::relu(F::linear(x, p.w1, p.b1)), p.w2, p.b2);
}

// Hogwild threads need tensors of their own over the shared parameters'
// storage. With the shared tensors themselves, one thread's in-place
// update (the optimizer's step) bumps the version counter that another
// thread's autograd graph saved, and that thread's backward fails with
// "modified by an inplace operation". Tensors made with from_blob on the
// same memory have counters of their own, as Hogwild across processes
// effectively has, while the threads still read and write the same
// values, without a lock: the unsynchronised updates are Hogwild's.
Params thread_view(const Params &shared)
{
	auto view = [](const torch::Tensor &t) {
		return torch::from_blob(t.data_ptr<float>(), t.sizes())
			.requires_grad_(true);
	};
	return {view(shared.w1), view(shared.b1), view(shared.w2),
		view(shared.b2)};
}

void train_epoch(const Params &shared, const Split &train,
		 const std::vector<int64_t> &order, int batch, float lr,
		 std::atomic<int> &next_batch)
{
	Params p = thread_view(shared);
	torch::optim::SGD optimizer(p.all(), torch::optim::SGDOptions(lr));
	int n_train = static_cast<int>(order.size());
	int n_batches = (n_train + batch - 1) / batch;
	for (;;) {
		// Relaxed: the counter hands out batch numbers and publishes
		// nothing (the order was written before the threads started).
		int k = next_batch.fetch_add(1, std::memory_order_relaxed);
		if (k >= n_batches)
			break;
		int first = k * batch, n = std::min(batch, n_train - first);
		auto rows = torch::from_blob(
			const_cast<int64_t *>(order.data()) + first, {n},
			torch::kLong);
		auto x = train.x.index_select(0, rows);
		auto y = train.y.index_select(0, rows);
		auto loss =
			torch::nn::functional::cross_entropy(forward(p, x), y);
		optimizer.zero_grad();
		loss.backward();
		optimizer.step();
	}
}

void evaluate(const Params &p, const Split &s, double &loss, double &accuracy)
{
	torch::NoGradGuard no_grad;
	auto logits = forward(p, s.x);
	loss = torch::nn::functional::cross_entropy(logits, s.y).item<double>();
	accuracy = 100.0 * logits.argmax(1).eq(s.y).sum().item<double>() /
		   static_cast<double>(s.y.size(0));
}

} // namespace

int main(int argc, char **argv)
{
	if (argc != 4) {
		std::fprintf(stderr,
			     "usage: digits_torch SETUP DATA.csv THREADS\n");
		return 2;
	}
	int n_threads = std::atoi(argv[3]);
	if (n_threads < 1 || n_threads > 1024) {
		std::fprintf(stderr, "threads: 1 to 1024\n");
		return 2;
	}
	// Our T threads are the parallelism, as in digits.c: no intra-op
	// threads inside each small matmul, and no inter-op pool.
	torch::set_num_threads(1);
	torch::set_num_interop_threads(1);
	try {
		Setup setup = read_setup(argv[1]);
		Split train, test;
		read_digits(argv[2], train, test);
		if (train.y.size(0) != setup.n_train)
			throw std::runtime_error("setup and data disagree on "
						 "the training set's size");
		auto from = [](std::vector<float> &v,
			       std::vector<int64_t> shape) {
			return torch::tensor(v).reshape(shape);
		};
		Params shared{from(setup.w1, {64, 64}), from(setup.b1, {64}),
			      from(setup.w2, {10, 64}), from(setup.b2, {10})};
		timing::epoch_clock timer;
		double accuracy = 0;
		for (int e = 0; e < setup.epochs; e++) {
			std::atomic<int> next_batch{0};
			timer.start();
			std::vector<std::thread> threads;
			for (int t = 0; t < n_threads; t++)
				threads.emplace_back(
					train_epoch, std::cref(shared),
					std::cref(train),
					std::cref(setup.order[e]), setup.batch,
					setup.lr[e], std::ref(next_batch));
			for (auto &t : threads)
				t.join();
			double took = timer.stop();
			double loss, train_accuracy, unused;
			evaluate(shared, train, loss, train_accuracy);
			evaluate(shared, test, unused, accuracy);
			std::printf("T=%d B=%d epoch %2d  loss %.4f  train "
				    "%6.2f%%  test %6.2f%%  %8.0f samples/s\n",
				    n_threads, setup.batch, e + 1, loss,
				    train_accuracy, accuracy,
				    setup.n_train / took);
		}
		std::printf("result threads=%d batch=%d epochs=%d "
			    "samples_per_s=%.0f test_accuracy=%.2f\n",
			    n_threads, setup.batch, setup.epochs,
			    setup.n_train * setup.epochs / timer.wall(),
			    accuracy);
	} catch (const std::exception &e) {
		std::fprintf(stderr, "digits_torch: %s\n", e.what());
		return 1;
	}
	return 0;
}
