// examples/fashion/fashion.c's model (an MLP 784-256-128-10, ReLU,
// softmax cross-entropy, SGD) written with PyTorch's C++ API (libtorch)
// as a PyTorch user would, to compare the two: the same data, the same
// initial weights, learning rates and batch order (read from the folder
// `fashion --export` writes; write_setup in fashion.c describes it).
//
// Three modes, each on T threads:
// - intra: one graph per batch, its ops spread over T intra-op threads
//   (at::set_num_threads(T); OpenBLAS's own T threads in the matmuls).
// - hogwild: T threads of our own take whole batches in turn, each over
//   tensors of its own aliasing the shared parameters' storage, with one
//   intra-op thread.
// - floor: no autodiff at all: the same ops under NoGradGuard and a
//   backward written by hand with torch ops, then the SGD step, on T
//   intra-op threads as in intra. What is left of intra's time above it
//   is autograd's and the optimizer's.
// Inter-op threads are 1 in every mode. BLAS threads can only be set from
// the environment before the library loads (Debian's libtorch reaches
// OpenBLAS through two libraries, each with a pool of its own), so this
// program checks that OPENBLAS_NUM_THREADS is T in intra and floor, 1 in
// hogwild, and refuses to run otherwise.
//
// Usage: fashion_torch MODE SETUP_DIR DATA_DIR THREADS
// Prints a line per epoch and a "result key=value ..." line, as fashion
// does, with cpu_per_wall: the process's CPU time over the wall time of
// the training (evaluation excluded), about 1.0 on one thread, and the
// thread counts it ran with. Built by scripts/compare-torch.sh; not part
// of libadg's build.
#include "timing.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace
{

const int kPixels = 784, kHidden1 = 256, kHidden2 = 128, kClasses = 10;

enum class Mode { intra, hogwild, floor };

struct Setup {
	int epochs = 0, batch = 0, n_train = 0;
	std::vector<float> lr;
	std::vector<float> weights;		 // w1 b1 w2 b2 w3 b3
	std::vector<std::vector<int64_t>> order; // per epoch
};

void expect(std::istream &in, const std::string &word)
{
	std::string got;
	if (!(in >> got) || got != word)
		throw std::runtime_error("setup.txt: expected \"" + word +
					 "\", read \"" + got + "\"");
}

// The bytes of path, which must hold exactly `bytes` of them.
std::vector<char> read_bytes(const std::string &path, size_t bytes)
{
	std::ifstream in(path, std::ios::binary);
	if (!in)
		throw std::runtime_error(path + ": cannot open");
	std::vector<char> data(bytes);
	if (!in.read(data.data(), static_cast<std::streamsize>(bytes)) ||
	    in.peek() != std::char_traits<char>::eof())
		throw std::runtime_error(path + ": not " +
					 std::to_string(bytes) + " bytes");
	return data;
}

Setup read_setup(const std::string &dir)
{
	std::ifstream in(dir + "/setup.txt");
	if (!in)
		throw std::runtime_error(dir +
					 "/setup.txt: cannot open (run "
					 "fashion --export " +
					 dir + ")");
	Setup s;
	int version, sizes[4];
	std::string seed, weights_file, order_file;
	expect(in, "fashion-setup");
	in >> version;
	expect(in, "sizes");
	for (int &n : sizes)
		in >> n;
	if (!in || version != 1 || sizes[0] != kPixels ||
	    sizes[1] != kHidden1 || sizes[2] != kHidden2 ||
	    sizes[3] != kClasses)
		throw std::runtime_error(dir + ": not a 784-256-128-10 setup, "
					       "version 1");
	expect(in, "epochs");
	in >> s.epochs;
	expect(in, "batch");
	in >> s.batch;
	expect(in, "train");
	in >> s.n_train;
	expect(in, "seed");
	in >> seed;
	if (!in || s.epochs < 1 || s.batch < 1 || s.n_train < 1 ||
	    s.n_train > 60000)
		throw std::runtime_error(dir + "/setup.txt: bad sizes");
	expect(in, "lr");
	s.lr.resize(s.epochs);
	for (float &lr : s.lr)
		in >> lr;
	expect(in, "params");
	size_t n_weights = 0;
	for (int i = 0; i < 6; i++) {
		std::string name;
		int rows, cols;
		in >> name >> rows >> cols;
		n_weights += static_cast<size_t>(rows) * cols;
	}
	expect(in, "files");
	in >> weights_file >> order_file;
	if (!in || n_weights != 235146)
		throw std::runtime_error(dir + "/setup.txt: bad parameters");
	auto w =
		read_bytes(dir + "/" + weights_file, n_weights * sizeof(float));
	s.weights.resize(n_weights);
	std::memcpy(s.weights.data(), w.data(), w.size());
	auto n = static_cast<size_t>(s.n_train);
	auto o =
		read_bytes(dir + "/" + order_file,
			   static_cast<size_t>(s.epochs) * n * sizeof(int32_t));
	const auto *order = reinterpret_cast<const int32_t *>(o.data());
	for (int e = 0; e < s.epochs; e++) {
		std::vector<int64_t> v(order + e * n, order + (e + 1) * n);
		for (int64_t i : v)
			if (i < 0 || i >= s.n_train)
				throw std::runtime_error(
					dir + "/" + order_file +
					": index out of range");
		s.order.push_back(std::move(v));
	}
	return s;
}

struct Split {
	torch::Tensor x, y; // n x 784 floats in 0..1, n labels
};

// Big-endian 32-bit word at p.
uint32_t word(const char *p)
{
	const auto *b = reinterpret_cast<const unsigned char *>(p);
	return static_cast<uint32_t>(b[0]) << 24 |
	       static_cast<uint32_t>(b[1]) << 16 |
	       static_cast<uint32_t>(b[2]) << 8 | b[3];
}

// The first `keep` of the `count` images of an IDX pair (prefix train or
// t10k) in dir, pixels scaled to 0..1 as fashion.c scales them.
Split read_idx(const std::string &dir, const std::string &prefix, int count,
	       int keep)
{
	auto images = read_bytes(dir + "/" + prefix + "-images-idx3-ubyte",
				 16 + static_cast<size_t>(count) * kPixels);
	auto labels = read_bytes(dir + "/" + prefix + "-labels-idx1-ubyte",
				 8 + static_cast<size_t>(count));
	if (word(images.data()) != 0x803 ||
	    word(images.data() + 4) != static_cast<uint32_t>(count) ||
	    word(images.data() + 8) != 28 || word(images.data() + 12) != 28 ||
	    word(labels.data()) != 0x801 ||
	    word(labels.data() + 4) != static_cast<uint32_t>(count))
		throw std::runtime_error(dir + "/" + prefix +
					 "-*: bad IDX headers (run "
					 "scripts/fetch-fashion.sh)");
	std::vector<float> x(static_cast<size_t>(keep) * kPixels);
	std::vector<int64_t> y(static_cast<size_t>(keep));
	for (size_t i = 0; i < x.size(); i++)
		x[i] = static_cast<float>(
			       static_cast<unsigned char>(images[16 + i])) /
		       255.0f;
	for (size_t i = 0; i < y.size(); i++) {
		y[i] = static_cast<unsigned char>(labels[8 + i]);
		if (y[i] >= kClasses)
			throw std::runtime_error(prefix + ": bad label");
	}
	return {torch::tensor(x).reshape({keep, kPixels}), torch::tensor(y)};
}

// The model: parameters are plain tensors, the layers functional calls.
struct Params {
	torch::Tensor w1, b1, w2, b2, w3, b3;
	std::vector<torch::Tensor> all() const
	{
		return {w1, b1, w2, b2, w3, b3};
	}
};

Params from_setup(const Setup &s)
{
	const int64_t shapes[6][2] = {{kHidden1, kPixels},  {1, kHidden1},
				      {kHidden2, kHidden1}, {1, kHidden2},
				      {kClasses, kHidden2}, {1, kClasses}};
	std::vector<torch::Tensor> t;
	size_t at = 0;
	for (const auto &shape : shapes) {
		auto n = static_cast<size_t>(shape[0] * shape[1]);
		std::vector<float> v(s.weights.begin() + at,
				     s.weights.begin() + at + n);
		auto value = torch::tensor(v);
		// Weights rows x cols, biases vectors, as nn::Linear has them.
		t.push_back(shape[0] == 1
				    ? value
				    : value.reshape({shape[0], shape[1]}));
		at += n;
	}
	return {t[0], t[1], t[2], t[3], t[4], t[5]};
}

torch::Tensor forward(const Params &p, const torch::Tensor &x)
{
	namespace F = torch::nn::functional;
	auto a1 = torch::relu(F::linear(x, p.w1, p.b1));
	auto a2 = torch::relu(F::linear(a1, p.w2, p.b2));
	return F::linear(a2, p.w3, p.b3);
}

// Hogwild threads need tensors of their own over the shared parameters'
// storage (see bench/compare/digits_torch.cpp): with the shared tensors
// themselves, one thread's in-place update bumps the version counter that
// another thread's graph saved, and that thread's backward fails.
Params thread_view(const Params &shared)
{
	auto view = [](const torch::Tensor &t) {
		return torch::from_blob(t.data_ptr<float>(), t.sizes())
			.requires_grad_(true);
	};
	return {view(shared.w1), view(shared.b1), view(shared.w2),
		view(shared.b2), view(shared.w3), view(shared.b3)};
}

struct Batch {
	torch::Tensor x, y;
};

Batch batch_of(const Split &train, const std::vector<int64_t> &order, int batch,
	       int k)
{
	int n_train = static_cast<int>(order.size());
	int first = k * batch, n = std::min(batch, n_train - first);
	auto rows = torch::from_blob(
		const_cast<int64_t *>(order.data()) + first, {n}, torch::kLong);
	return {train.x.index_select(0, rows), train.y.index_select(0, rows)};
}

// One epoch the way a PyTorch user writes it: forward, loss, zero_grad,
// backward, step. In intra mode p is the shared parameters and one thread
// runs this; in hogwild each thread runs it over a view of them, taking
// batches in turn from next_batch.
void train_autograd(const Params &p, const Split &train,
		    const std::vector<int64_t> &order, int batch, float lr,
		    std::atomic<int> &next_batch)
{
	torch::optim::SGD optimizer(p.all(), torch::optim::SGDOptions(lr));
	int n_batches = (static_cast<int>(order.size()) + batch - 1) / batch;
	for (;;) {
		// Relaxed: the counter hands out batch numbers and publishes
		// nothing (the order was written before the threads started).
		int k = next_batch.fetch_add(1, std::memory_order_relaxed);
		if (k >= n_batches)
			break;
		auto b = batch_of(train, order, batch, k);
		auto loss = torch::nn::functional::cross_entropy(
			forward(p, b.x), b.y);
		optimizer.zero_grad();
		loss.backward();
		optimizer.step();
	}
}

// One epoch with no autodiff: the forward as forward() computes it, the
// gradients of the mean cross-entropy written out by hand with torch ops,
// and the SGD step, in place on the shared parameters.
void train_floor(const Params &p, const Split &train,
		 const std::vector<int64_t> &order, int batch, float lr)
{
	torch::NoGradGuard no_grad;
	int n_batches = (static_cast<int>(order.size()) + batch - 1) / batch;
	for (int k = 0; k < n_batches; k++) {
		auto b = batch_of(train, order, batch, k);
		int64_t n = b.x.size(0);
		auto a1 = torch::relu(torch::addmm(p.b1, b.x, p.w1.t()));
		auto a2 = torch::relu(torch::addmm(p.b2, a1, p.w2.t()));
		auto logits = torch::addmm(p.b3, a2, p.w3.t());
		// d mean loss / d logits = (softmax - one hot) / n
		auto d = torch::softmax(logits, 1);
		d.scatter_add_(1, b.y.view({n, 1}), torch::full({n, 1}, -1.0f));
		d.div_(static_cast<double>(n));
		auto dw3 = d.t().mm(a2), db3 = d.sum(0);
		auto d2 = torch::threshold_backward(d.mm(p.w3), a2, 0);
		auto dw2 = d2.t().mm(a1), db2 = d2.sum(0);
		auto d1 = torch::threshold_backward(d2.mm(p.w2), a1, 0);
		auto dw1 = d1.t().mm(b.x), db1 = d1.sum(0);
		p.w1.sub_(dw1, lr);
		p.b1.sub_(db1, lr);
		p.w2.sub_(dw2, lr);
		p.b2.sub_(db2, lr);
		p.w3.sub_(dw3, lr);
		p.b3.sub_(db3, lr);
	}
}

double accuracy_on(const Params &p, const Split &s)
{
	torch::NoGradGuard no_grad;
	auto logits = forward(p, s.x);
	return 100.0 * logits.argmax(1).eq(s.y).sum().item<double>() /
	       static_cast<double>(s.y.size(0));
}

double loss_on(const Params &p, const Split &s)
{
	torch::NoGradGuard no_grad;
	return torch::nn::functional::cross_entropy(forward(p, s.x), s.y)
		.item<double>();
}

} // namespace

int main(int argc, char **argv)
{
	if (argc != 5) {
		std::fprintf(stderr, "usage: fashion_torch intra|hogwild|floor "
				     "SETUP_DIR DATA_DIR THREADS\n");
		return 2;
	}
	std::string mode_name = argv[1];
	Mode mode;
	if (mode_name == "intra")
		mode = Mode::intra;
	else if (mode_name == "hogwild")
		mode = Mode::hogwild;
	else if (mode_name == "floor")
		mode = Mode::floor;
	else {
		std::fprintf(stderr, "mode: intra, hogwild or floor\n");
		return 2;
	}
	int n_threads = std::atoi(argv[4]);
	if (n_threads < 1 || n_threads > 1024) {
		std::fprintf(stderr, "threads: 1 to 1024\n");
		return 2;
	}
	int intra = mode == Mode::hogwild ? 1 : n_threads;
	const char *blas = std::getenv("OPENBLAS_NUM_THREADS");
	if (blas == nullptr || std::atoi(blas) != intra) {
		std::fprintf(stderr,
			     "fashion_torch: %s on %d threads wants "
			     "OPENBLAS_NUM_THREADS=%d in the environment (it "
			     "is %s)\n",
			     mode_name.c_str(), n_threads, intra,
			     blas != nullptr ? blas : "unset");
		return 2;
	}
	torch::set_num_interop_threads(1);
	torch::set_num_threads(intra);
	try {
		if (torch::get_num_threads() != intra)
			throw std::runtime_error("at::set_num_threads did "
						 "not take");
		Setup setup = read_setup(argv[2]);
		Split train = read_idx(argv[3], "train", 60000, setup.n_train);
		Split test = read_idx(argv[3], "t10k", 10000, 10000);
		Params shared = from_setup(setup);
		if (mode == Mode::intra)
			for (auto &t : shared.all())
				t.requires_grad_(true);
		timing::epoch_clock timer;
		double accuracy = 0;
		std::atomic<int> wrong_threads{0};
		for (int e = 0; e < setup.epochs; e++) {
			std::atomic<int> next_batch{0};
			const auto &order = setup.order[e];
			float lr = setup.lr[e];
			timer.start();
			if (mode == Mode::intra) {
				train_autograd(shared, train, order,
					       setup.batch, lr, next_batch);
			} else if (mode == Mode::floor) {
				train_floor(shared, train, order, setup.batch,
					    lr);
			} else {
				std::vector<std::thread> threads;
				for (int t = 0; t < n_threads; t++)
					threads.emplace_back([&] {
						// Each thread's own setting,
						// from at::set_num_threads.
						if (torch::get_num_threads() !=
						    1)
							wrong_threads++;
						train_autograd(
							thread_view(shared),
							train, order,
							setup.batch, lr,
							next_batch);
					});
				for (auto &t : threads)
					t.join();
			}
			double took = timer.stop();
			double loss = loss_on(shared, train);
			accuracy = accuracy_on(shared, test);
			std::printf("T=%d B=%d %s epoch %2d  loss %.4f  test "
				    "%6.2f%%  %8.0f samples/s\n",
				    n_threads, setup.batch, mode_name.c_str(),
				    e + 1, loss, accuracy,
				    setup.n_train / took);
			std::fflush(stdout);
		}
		if (wrong_threads.load() != 0)
			throw std::runtime_error("a Hogwild thread had more "
						 "than one intra-op thread");
		std::printf("result side=torch mode=%s threads=%d batch=%d "
			    "epochs=%d samples_per_s=%.0f test_accuracy=%.2f "
			    "cpu_per_wall=%.2f intra_op=%d inter_op=%d "
			    "openblas=%s os_threads=%d\n",
			    mode_name.c_str(), n_threads, setup.batch,
			    setup.epochs,
			    static_cast<double>(setup.n_train) * setup.epochs /
				    timer.wall(),
			    accuracy, timer.cpu() / timer.wall(),
			    torch::get_num_threads(),
			    torch::get_num_interop_threads(), blas,
			    timing::os_threads());
	} catch (const std::exception &e) {
		std::fprintf(stderr, "fashion_torch: %s\n", e.what());
		return 1;
	}
	return 0;
}
