// examples/tagger's model (dynet-benchmark's bilstm-tagger-withchar: word
// embedding 128, a character BiLSTM of 64 per direction for rare words, a
// word BiLSTM of 50 per direction, an MLP of 32, softmax over the tags,
// SGD) written with PyTorch's C++ API (libtorch) as a PyTorch user would,
// both ways such a user spends T cores, to compare with libadg: the same
// sentences, initial weights, learning rates and batch order (read from
// the folder `tagger --export` writes; setup.hpp describes it).
//
// - batched: each mini-batch's sentences padded to its longest, packed
//   (pack_padded_sequence) and run through a bidirectional torch::nn::LSTM,
//   one graph per batch; the batch's rare words spelled by the character
//   BiLSTM at once, padded and packed too; the ops spread over T intra-op
//   threads (at::set_num_threads(T), OpenBLAS's T threads).
// - sentence: one graph per sentence, as dynet-benchmark's PyTorch tagger
//   builds them: the sentence through the bidirectional nn::LSTM as a batch
//   of one, its rare words' spellings through the character nn::LSTM
//   together (padded; packed here, so that the backward direction starts
//   at each word's end). Each sentence's summed loss over the batch's token
//   count is backpropagated at once and the gradients add up, so a batch's
//   update is the gradient of its mean loss, as libadg's batch of B is. T
//   threads of our own take whole batches in turn (Hogwild), each with one
//   intra-op thread and modules whose parameters alias the shared storage (as
//   in langid_torch.cpp).
// The word embedding's gradient is sparse (the rows of the batch's words,
// as libadg's trainer keeps it), so that SGD does not sweep the whole
// table every batch. An LSTM weight of the export, W = [W_ih W_hh] and b,
// becomes weight_ih, weight_hh and bias_ih; bias_hh is zero and not
// trained.
// Inter-op threads are 1. BLAS threads can only be set from the
// environment before the library loads, so this program checks that
// OPENBLAS_NUM_THREADS is T in batched mode and 1 in sentence mode.
//
// Usage: tagger_torch batched|sentence SETUP_DIR DATA_DIR THREADS
//                     [TEST_SENTENCES]
// DATA_DIR is the unpacked corpus (scripts/fetch-brown.sh prints it);
// TEST_SENTENCES, when given, evaluates on the first that many test
// sentences only. Prints a line per epoch and a "result key=value ..."
// line, as the trainer does, with cpu_per_wall: the process's CPU time
// over the wall time of the training (evaluation excluded). Built by
// scripts/compare-tagger.sh; not part of libadg's build.
#include "brown.hpp"
#include "setup.hpp"
#include "timing.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace
{

namespace nn = torch::nn;
namespace rnn = torch::nn::utils::rnn;

constexpr long word_dim = 128, char_dim = 20, char_hidden = 64;
constexpr long word_hidden = 50, mlp_dim = 32;

// The spec's 14 parameters, in its order.
enum spec_param {
	s_word_embed,
	s_char_embed,
	s_char_fwd_w,
	s_char_fwd_b,
	s_char_bwd_w,
	s_char_bwd_b,
	s_word_fwd_w,
	s_word_fwd_b,
	s_word_bwd_w,
	s_word_bwd_b,
	s_mlp_w,
	s_mlp_b,
	s_out_w,
	s_out_b,
	n_spec
};

// The same values as torch's modules keep them: each LSTM direction's W
// split into weight_ih and weight_hh columns.
enum torch_param {
	t_word_embed,
	t_char_embed,
	t_char_ih,
	t_char_hh,
	t_char_b,
	t_char_ih_r,
	t_char_hh_r,
	t_char_b_r,
	t_word_ih,
	t_word_hh,
	t_word_b,
	t_word_ih_r,
	t_word_hh_r,
	t_word_b_r,
	t_mlp_w,
	t_mlp_b,
	t_out_w,
	t_out_b,
	n_torch
};

// The export's flat weights as the modules' tensors (their own storage).
std::vector<torch::Tensor> from_setup(const tagger::setup &s)
{
	auto shapes = tagger::shapes(s.n_words, s.n_chars, s.n_tags);
	if (shapes.size() != n_spec)
		throw std::runtime_error("setup.hpp's table has not 14 rows");
	std::size_t at = 0;
	std::vector<torch::Tensor> spec;
	for (const auto &sh : shapes) {
		long n = static_cast<long>(sh.rows) * sh.cols;
		if (at + static_cast<std::size_t>(n) > s.weights.size())
			throw std::runtime_error("the setup's weights are "
						 "shorter than the table");
		auto v = torch::from_blob(const_cast<float *>(&s.weights[at]),
					  {n}, torch::kFloat)
				 .clone();
		spec.push_back(sh.rows == 1 || sh.cols == 1
				       ? v
				       : v.reshape({sh.rows, sh.cols}));
		at += static_cast<std::size_t>(n);
	}
	if (at != s.weights.size())
		throw std::runtime_error("the setup's weights are longer "
					 "than the table");
	std::vector<torch::Tensor> t(n_torch);
	t[t_word_embed] = spec[s_word_embed];
	t[t_char_embed] = spec[s_char_embed];
	auto split = [&](int w, int b, long in, int ih) {
		t[ih] = spec[w].narrow(1, 0, in).contiguous();
		t[ih + 1] = spec[w].narrow(1, in, spec[w].size(1) - in)
				    .contiguous();
		t[ih + 2] = spec[b].reshape({-1});
	};
	split(s_char_fwd_w, s_char_fwd_b, char_dim, t_char_ih);
	split(s_char_bwd_w, s_char_bwd_b, char_dim, t_char_ih_r);
	split(s_word_fwd_w, s_word_fwd_b, word_dim, t_word_ih);
	split(s_word_bwd_w, s_word_bwd_b, word_dim, t_word_ih_r);
	t[t_mlp_w] = spec[s_mlp_w];
	t[t_mlp_b] = spec[s_mlp_b].reshape({-1});
	t[t_out_w] = spec[s_out_w];
	t[t_out_b] = spec[s_out_b].reshape({-1});
	return t;
}

// FNV-1a over the bits of the spec's 14 parameters in order (W = [W_ih
// W_hh] again), as the trainer prints it.
std::uint64_t fingerprint(const std::vector<torch::Tensor> &t)
{
	std::vector<torch::Tensor> spec = {
		t[t_word_embed],
		t[t_char_embed],
		torch::cat({t[t_char_ih], t[t_char_hh]}, 1),
		t[t_char_b],
		torch::cat({t[t_char_ih_r], t[t_char_hh_r]}, 1),
		t[t_char_b_r],
		torch::cat({t[t_word_ih], t[t_word_hh]}, 1),
		t[t_word_b],
		torch::cat({t[t_word_ih_r], t[t_word_hh_r]}, 1),
		t[t_word_b_r],
		t[t_mlp_w],
		t[t_mlp_b],
		t[t_out_w],
		t[t_out_b],
	};
	std::uint64_t hash = 0xcbf29ce484222325u;
	for (const auto &p : spec) {
		auto c = p.contiguous();
		const auto *b =
			static_cast<const unsigned char *>(c.data_ptr());
		std::size_t n =
			static_cast<std::size_t>(c.numel()) * sizeof(float);
		for (std::size_t i = 0; i < n; i++)
			hash = (hash ^ b[i]) * 0x100000001b3u;
	}
	return hash;
}

// The modules of the model, their parameters set to the tensors of p
// (set_data: the module's parameter then aliases p's storage).
struct modules {
	nn::Embedding words, chars;
	nn::LSTM char_lstm{
		nn::LSTMOptions(char_dim, char_hidden).bidirectional(true)};
	nn::LSTM word_lstm{
		nn::LSTMOptions(word_dim, word_hidden).bidirectional(true)};
	nn::Linear mlp{2 * word_hidden, mlp_dim};
	nn::Linear out;

	modules(const std::vector<torch::Tensor> &p, int n_tags)
	    : words(nn::EmbeddingOptions(p[t_word_embed].size(0), word_dim)
			    .sparse(true)),
	      chars(p[t_char_embed].size(0), char_dim), out(mlp_dim, n_tags)
	{
		words->weight.set_data(p[t_word_embed]);
		chars->weight.set_data(p[t_char_embed]);
		alias(char_lstm, p, t_char_ih, t_char_ih_r);
		alias(word_lstm, p, t_word_ih, t_word_ih_r);
		mlp->weight.set_data(p[t_mlp_w]);
		mlp->bias.set_data(p[t_mlp_b]);
		out->weight.set_data(p[t_out_w]);
		out->bias.set_data(p[t_out_b]);
	}

	static void alias(nn::LSTM &lstm, const std::vector<torch::Tensor> &p,
			  int fwd, int bwd)
	{
		for (auto &item : lstm->named_parameters()) {
			const std::string &name = item.key();
			int k = name.find("_reverse") != std::string::npos
					? bwd
					: fwd;
			if (name.rfind("bias_hh", 0) == 0) {
				// The export has one bias: the other is 0.
				item.value().set_data(
					torch::zeros_like(p[k + 2]));
				item.value().requires_grad_(false);
				continue;
			}
			if (name.rfind("weight_hh", 0) == 0)
				k += 1;
			else if (name.rfind("bias_ih", 0) == 0)
				k += 2;
			item.value().set_data(p[k]);
		}
	}

	// What SGD updates: every parameter but the zero bias_hh; the
	// character model's only when it is on.
	std::vector<torch::Tensor> parameters(bool with_chars) const
	{
		std::vector<torch::Tensor> all{words->weight};
		if (with_chars) {
			all.push_back(chars->weight);
			for (const auto &q : char_lstm->parameters())
				if (q.requires_grad())
					all.push_back(q);
		}
		for (const auto &q : word_lstm->parameters())
			if (q.requires_grad())
				all.push_back(q);
		all.insert(all.end(),
			   {mlp->weight, mlp->bias, out->weight, out->bias});
		return all;
	}

	// n spellings' embeddings (n x 128), rows in the order given: each
	// spelled boundary, bytes, boundary, padded, packed through the
	// character BiLSTM at once; [forward's last h ; backward's last h].
	torch::Tensor spell(const std::vector<const std::vector<int> *> &w)
	{
		const long n = static_cast<long>(w.size());
		std::vector<long> rank(w.size());
		for (std::size_t i = 0; i < rank.size(); i++)
			rank[i] = static_cast<long>(i);
		std::stable_sort(rank.begin(), rank.end(), [&](long a, long b) {
			return w[a]->size() > w[b]->size();
		});
		const long longest = static_cast<long>(w[rank[0]]->size()) + 2;
		auto ids = torch::zeros({longest, n}, torch::kLong);
		auto a = ids.accessor<long, 2>();
		std::vector<long> lengths(w.size());
		for (long j = 0; j < n; j++) {
			const std::vector<int> &c = *w[rank[j]];
			lengths[j] = static_cast<long>(c.size()) + 2;
			for (std::size_t t = 0; t < c.size(); t++)
				a[static_cast<long>(t) + 1][j] = c[t];
		}
		auto packed = rnn::pack_padded_sequence(
			chars(ids), torch::tensor(lengths), false, true);
		auto h = std::get<0>(std::get<1>(
			char_lstm->forward_with_packed_input(packed)));
		auto sorted = torch::cat({h[0], h[1]}, 1);
		// Back to the order given: row rank[j] is sorted's row j.
		std::vector<long> back(w.size());
		for (long j = 0; j < n; j++)
			back[rank[j]] = j;
		return sorted.index_select(0, torch::tensor(back));
	}

	// A batch's tag scores, its sentences padded and packed through the
	// word BiLSTM (rare words spelled when with_chars), and their tags, in
	// the packed order (time step by time step, longest sentence first).
	std::pair<torch::Tensor, torch::Tensor>
	batched(std::vector<const brown::sentence *> s, bool with_chars)
	{
		std::stable_sort(s.begin(), s.end(), [](auto *a, auto *b) {
			return a->words.size() > b->words.size();
		});
		const long n = static_cast<long>(s.size());
		const long longest = static_cast<long>(s[0]->words.size());
		auto ids = torch::zeros({longest, n}, torch::kLong);
		auto a = ids.accessor<long, 2>();
		std::vector<long> lengths(s.size()), rare_rows, tags;
		std::vector<const std::vector<int> *> spellings;
		for (long b = 0; b < n; b++) {
			lengths[b] = static_cast<long>(s[b]->words.size());
			for (long t = 0; t < lengths[b]; t++) {
				a[t][b] = s[b]->words[t];
				if (with_chars && s[b]->words[t] == 0) {
					rare_rows.push_back(t * n + b);
					spellings.push_back(
						&s[b]->spellings[t]);
				}
			}
		}
		for (long t = 0; t < longest; t++)
			for (long b = 0; b < n && lengths[b] > t; b++)
				tags.push_back(s[b]->tags[t]);
		auto x = words(ids);
		if (!rare_rows.empty())
			x = x.reshape({longest * n, word_dim})
				    .index_copy(0, torch::tensor(rare_rows),
						spell(spellings))
				    .reshape({longest, n, word_dim});
		auto packed = rnn::pack_padded_sequence(
			x, torch::tensor(lengths), false, true);
		auto h = std::get<0>(
				 word_lstm->forward_with_packed_input(packed))
				 .data();
		return {out(torch::tanh(mlp(h))), torch::tensor(tags)};
	}

	// One sentence's summed loss, its graph alone: the sentence as a
	// batch of one through the word BiLSTM, its rare words spelled
	// together by the character BiLSTM (padded and packed), as
	// dynet-benchmark's PyTorch tagger spells a sentence's.
	torch::Tensor sentence_loss(const brown::sentence &s, bool with_chars)
	{
		const long len = static_cast<long>(s.words.size());
		std::vector<long> ids(s.words.begin(), s.words.end());
		auto x = words(torch::tensor(ids));
		if (with_chars) {
			std::vector<long> rows;
			std::vector<const std::vector<int> *> spellings;
			for (long t = 0; t < len; t++)
				if (s.words[t] == 0) {
					rows.push_back(t);
					spellings.push_back(&s.spellings[t]);
				}
			if (!rows.empty())
				x = x.index_copy(0, torch::tensor(rows),
						 spell(spellings));
		}
		auto h = std::get<0>(word_lstm->forward(x.unsqueeze(1)))
				 .squeeze(1);
		std::vector<long> y(s.tags.begin(), s.tags.end());
		return nn::functional::cross_entropy(
			out(torch::tanh(mlp(h))), torch::tensor(y),
			nn::functional::CrossEntropyFuncOptions().reduction(
				torch::kSum));
	}
};

// Test accuracy (%) and mean loss per token, 256 sentences at a time, no
// graph.
std::pair<double, double> evaluate(modules &m,
				   const std::vector<brown::sentence> &test,
				   std::size_t count, bool with_chars)
{
	torch::NoGradGuard no_grad;
	double right = 0, loss = 0, tokens = 0;
	for (std::size_t first = 0; first < count; first += 256) {
		std::vector<const brown::sentence *> s;
		for (std::size_t i = first; i < std::min(count, first + 256);
		     i++)
			if (!test[i].words.empty())
				s.push_back(&test[i]);
		if (s.empty())
			continue;
		auto [scores, y] = m.batched(s, with_chars);
		right += scores.argmax(1).eq(y).sum().item<double>();
		loss += nn::functional::cross_entropy(
				scores, y,
				nn::functional::CrossEntropyFuncOptions()
					.reduction(torch::kSum))
				.item<double>();
		tokens += static_cast<double>(y.size(0));
	}
	return {100.0 * right / tokens, loss / tokens};
}

struct options {
	std::string mode, setup_dir, data_dir;
	int threads = 1;
	long test_sentences = -1;
};

options parse(int argc, char **argv)
{
	if (argc != 5 && argc != 6)
		throw std::invalid_argument(
			"usage: tagger_torch batched|sentence SETUP_DIR "
			"DATA_DIR THREADS [TEST_SENTENCES]");
	options o{argv[1], argv[2], argv[3], std::atoi(argv[4]), -1};
	if (o.mode != "batched" && o.mode != "sentence")
		throw std::invalid_argument("mode: batched or sentence");
	if (o.threads < 1 || o.threads > 1024)
		throw std::invalid_argument("threads: 1 to 1024");
	if (argc == 6) {
		o.test_sentences = std::atol(argv[5]);
		if (o.test_sentences < 1)
			throw std::invalid_argument("test sentences: >= 1");
	}
	return o;
}

// The training sentences the setup orders (the first N of the corpus's),
// after checking that the setup is of this corpus.
int check_setup(const tagger::setup &s, const brown::corpus &c)
{
	if (s.epochs < 1 || s.batch < 1 || s.order.empty() ||
	    s.order.size() % static_cast<std::size_t>(s.epochs) != 0)
		throw std::runtime_error("the setup's order is not "
					 "epochs x sentences");
	for (std::int32_t i : s.order)
		if (i < 0 || static_cast<std::size_t>(i) >= c.train.size())
			throw std::runtime_error("the setup orders a sentence "
						 "the corpus has not");
	if (s.n_words != static_cast<int>(c.words.size()) ||
	    s.n_chars != static_cast<int>(c.chars.size()) ||
	    s.n_tags != static_cast<int>(c.tags.size()))
		throw std::runtime_error("the setup's sizes are not the "
					 "corpus's");
	return static_cast<int>(s.order.size() /
				static_cast<std::size_t>(s.epochs));
}

// One SGD step on a batch's sentences with modules m: zero_grad, forward,
// backward (one graph, or one per sentence), step. Returns the batch's
// summed loss.
double train_batch(modules &m, torch::optim::SGD &sgd,
		   const std::vector<const brown::sentence *> &batch,
		   long tokens, bool chars, bool batched_mode)
{
	sgd.zero_grad();
	double loss_sum = 0;
	if (batched_mode) {
		auto [scores, y] = m.batched(batch, chars);
		auto loss = nn::functional::cross_entropy(scores, y);
		loss.backward();
		loss_sum = loss.item<double>() * static_cast<double>(tokens);
	} else {
		// Each sentence's share of the batch's mean.
		auto scale = 1.0 / static_cast<double>(tokens);
		for (auto *x : batch) {
			auto loss = m.sentence_loss(*x, chars);
			(loss * scale).backward();
			loss_sum += loss.item<double>();
		}
	}
	sgd.step();
	return loss_sum;
}

// An epoch's training over the shared parameters: the summed loss and
// the tokens trained on.
struct epoch_sums {
	double loss = 0;
	double tokens = 0;
};

// What one epoch needs: the setup, the training sentences, the shared
// parameters and the modules over them, how to train.
struct trainer {
	const tagger::setup &s;
	const std::vector<brown::sentence> &train;
	int n; // sentences an epoch
	std::vector<torch::Tensor> &shared;
	modules &main_modules;
	bool batched_mode;
	int n_threads;
	std::atomic<int> wrong_threads{0};

	// Epoch e: batched, or on one thread, with main_modules; else T
	// Hogwild threads, each on modules of its own over the shared
	// storage, taking batches in turn.
	epoch_sums epoch(int e)
	{
		const std::int32_t *order =
			&s.order[static_cast<std::size_t>(e) * n];
		std::atomic<int> next{0};
		std::vector<epoch_sums> sums(
			static_cast<std::size_t>(n_threads));
		auto train_on = [&](modules &m, epoch_sums &sum) {
			torch::optim::SGD sgd(
				m.parameters(s.chars),
				torch::optim::SGDOptions(s.lr[e]));
			const int n_batches = (n + s.batch - 1) / s.batch;
			// Relaxed: hands out batch numbers, publishes nothing.
			for (int k; (k = next.fetch_add(
					     1, std::memory_order_relaxed)) <
				    n_batches;) {
				int first = k * s.batch;
				int size = std::min(s.batch, n - first);
				std::vector<const brown::sentence *> batch;
				long tokens = 0;
				for (int i = 0; i < size; i++) {
					const auto &x = train[order[first + i]];
					if (x.words.empty())
						continue;
					batch.push_back(&x);
					tokens += static_cast<long>(
						x.words.size());
				}
				if (batch.empty())
					continue;
				sum.loss += train_batch(m, sgd, batch, tokens,
							s.chars, batched_mode);
				sum.tokens += static_cast<double>(tokens);
			}
		};
		if (batched_mode || n_threads == 1) {
			train_on(main_modules, sums[0]);
		} else {
			std::vector<std::thread> threads;
			for (int t = 0; t < n_threads; t++)
				threads.emplace_back([&, t] {
					// Each thread's own setting, from
					// at::set_num_threads.
					if (torch::get_num_threads() != 1)
						wrong_threads++;
					std::vector<torch::Tensor> view;
					for (auto &p : shared)
						view.push_back(torch::from_blob(
							p.data_ptr<float>(),
							p.sizes()));
					modules mine(view, s.n_tags);
					train_on(mine, sums[t]);
				});
			for (auto &t : threads)
				t.join();
		}
		epoch_sums all;
		for (const epoch_sums &x : sums) {
			all.loss += x.loss;
			all.tokens += x.tokens;
		}
		return all;
	}
};

} // namespace

int main(int argc, char **argv)
{
	options o;
	try {
		o = parse(argc, argv);
	} catch (const std::invalid_argument &e) {
		std::fprintf(stderr, "%s\n", e.what());
		return 2;
	}
	const int n_threads = o.threads;
	const bool batched_mode = o.mode == "batched";
	const int intra = batched_mode ? n_threads : 1;
	const char *blas = std::getenv("OPENBLAS_NUM_THREADS");
	if (blas == nullptr || std::atoi(blas) != intra) {
		std::fprintf(stderr,
			     "tagger_torch: %s on %d threads wants "
			     "OPENBLAS_NUM_THREADS=%d in the environment (it "
			     "is %s)\n",
			     o.mode.c_str(), n_threads, intra,
			     blas != nullptr ? blas : "unset");
		return 2;
	}
	torch::set_num_interop_threads(1);
	torch::set_num_threads(intra);
	try {
		tagger::setup s = tagger::read_setup(o.setup_dir);
		brown::corpus c = brown::load(o.data_dir);
		const int n = check_setup(s, c);
		const std::size_t n_test =
			o.test_sentences > 0
				? std::min(c.test.size(),
					   static_cast<std::size_t>(
						   o.test_sentences))
				: c.test.size();
		std::vector<torch::Tensor> shared = from_setup(s);
		modules main_modules(shared, s.n_tags);
		trainer run{s,	      c.train,	    n,
			    shared,   main_modules, batched_mode,
			    n_threads};
		timing::epoch_clock timer;
		double accuracy = 0, train_loss = 0, tokens_seen = 0;
		for (int e = 0; e < s.epochs; e++) {
			timer.start();
			epoch_sums sum = run.epoch(e);
			double took = timer.stop();
			train_loss = sum.loss / sum.tokens;
			tokens_seen += sum.tokens;
			auto [acc, test_loss] =
				evaluate(main_modules, c.test, n_test, s.chars);
			accuracy = acc;
			std::printf("T=%d torch %s epoch %2d  loss %.4f  test "
				    "loss %.4f  test %6.2f%%  %8.0f samples/s  "
				    "%8.0f words/s\n",
				    n_threads, o.mode.c_str(), e + 1,
				    train_loss, test_loss, accuracy, n / took,
				    sum.tokens / took);
			std::fflush(stdout);
		}
		if (run.wrong_threads.load() != 0)
			throw std::runtime_error("a Hogwild thread had more "
						 "than one intra-op thread");
		std::printf("result mode=%s threads=%d models=1 batch=%d "
			    "chars=%s epochs=%d samples_per_s=%.1f "
			    "words_per_s=%.0f test_accuracy=%.2f "
			    "weights=%016" PRIx64 " loss=%.6f side=torch "
			    "cpu_per_wall=%.2f intra_op=%d inter_op=%d "
			    "openblas=%s os_threads=%d\n",
			    o.mode.c_str(), n_threads, s.batch,
			    s.chars ? "on" : "off", s.epochs,
			    static_cast<double>(n) * s.epochs / timer.wall(),
			    tokens_seen / timer.wall(), accuracy,
			    fingerprint(shared), train_loss,
			    timer.cpu() / timer.wall(),
			    torch::get_num_threads(),
			    torch::get_num_interop_threads(), blas,
			    timing::os_threads());
	} catch (const std::exception &e) {
		std::fprintf(stderr, "tagger_torch: %s\n", e.what());
		return 1;
	}
	return 0;
}
