/* The setup a run of examples/tagger exports for bench/compare/ (the
 * sizes, the initial weights, each epoch's learning rate and order),
 * written by the trainer and read by the floor and the PyTorch side, so
 * that all three train the same model the same way. No libadg here.
 *
 * A folder of three files:
 * - setup.txt, whitespace-separated words:
 *     tagger-setup 1
 *     sizes W C T 128 20 64 50 32    words, chars, tags, then the word
 *                                    embedding, char embedding, char
 *                                    LSTM, word LSTM and MLP sizes
 *     chars on|off                   off: the plain bilstm-tagger
 *     epochs E batch B subset S seed X
 *     lr E floats                    each epoch's learning rate
 *     params word_embed W 128 ... out_b 1 T
 *     files weights.f32 order.i32
 *   S: the training sentences used, the first S of brown::corpus::train
 *   (0: all of them); floats with 9 significant digits, which read back
 *   to the same float;
 * - weights.f32: the initial values of the 14 parameters of shapes(), in
 *   that order, each row-major, as 32-bit floats in this machine's byte
 *   order (all 14 also with chars off, which leaves 1 to 5 unused);
 * - order.i32: E times N 32-bit ints in this machine's byte order, each
 *   epoch's order of the N training sentences (0-based, into the
 *   training sentences used), epoch 1 first. */
#ifndef EXAMPLES_TAGGER_SETUP_HPP
#define EXAMPLES_TAGGER_SETUP_HPP

#include "../setup_text.hpp"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace tagger
{

/* The model's fixed sizes (dynet-benchmark's bilstm-tagger-withchar). */
namespace dims
{
constexpr int word_embed = 128; // a word's embedding
constexpr int char_embed = 20;	// a byte's embedding
constexpr int char_hidden = 64; // the char LSTM, each direction
constexpr int word_hidden = 50; // the word LSTM, each direction
constexpr int mlp = 32;		// the MLP's tanh layer
constexpr int gates = 4;	// i, f, g, o
constexpr int params = 14;	// shapes()'s entries
} // namespace dims

struct shape {
	const char *name;
	int rows, cols; // a vector is 1 row
};

/* The parameters, in their order in weights.f32 and in the trainers. */
inline std::vector<shape> shapes(int n_words, int n_chars, int n_tags)
{
	using namespace dims;
	const int char_in = char_embed + char_hidden;
	const int word_in = word_embed + word_hidden;
	static_assert(2 * char_hidden == word_embed,
		      "a spelled word stands in for an embedded one");
	return {
		{"word_embed", n_words, word_embed},
		{"char_embed", n_chars, char_embed},
		{"char_fwd_w", gates * char_hidden, char_in},
		{"char_fwd_b", 1, gates * char_hidden},
		{"char_bwd_w", gates * char_hidden, char_in},
		{"char_bwd_b", 1, gates * char_hidden},
		{"word_fwd_w", gates * word_hidden, word_in},
		{"word_fwd_b", 1, gates * word_hidden},
		{"word_bwd_w", gates * word_hidden, word_in},
		{"word_bwd_b", 1, gates * word_hidden},
		{"mlp_w", mlp, 2 * word_hidden},
		{"mlp_b", 1, mlp},
		{"out_w", n_tags, mlp},
		{"out_b", 1, n_tags},
	};
}

/* The floats of all the parameters together. */
inline std::size_t n_weights(int n_words, int n_chars, int n_tags)
{
	std::size_t n = 0;
	for (const shape &p : shapes(n_words, n_chars, n_tags))
		n += static_cast<std::size_t>(p.rows) *
		     static_cast<std::size_t>(p.cols);
	return n;
}

struct setup : setup_text::run {
	bool chars = true;
	std::vector<float> weights;	 // n_weights() floats
	std::vector<std::int32_t> order; // E x N, epoch by epoch
	int n_words = 0, n_chars = 0, n_tags = 0;
};

/* Throws std::runtime_error "where: what" unless ok. */
inline void require(bool ok, const std::string &where, const char *what)
{
	if (!ok)
		throw std::runtime_error(where + ": " + what);
}

/* What write_setup and read_setup both check of a setup: sizes, and the
 * vectors' lengths against them. */
inline void check_setup(const setup &s, const std::string &where)
{
	require(s.n_words >= 1 && s.n_chars >= 2 && s.n_tags >= 2, where,
		"want at least 1 word, 2 chars and 2 tags");
	require(s.epochs >= 1 && s.batch >= 1 && s.subset >= 0, where,
		"want epochs >= 1, batch >= 1, subset >= 0");
	require(s.lr.size() == static_cast<std::size_t>(s.epochs), where,
		"not a learning rate per epoch");
	require(s.weights.size() == n_weights(s.n_words, s.n_chars, s.n_tags),
		where, "not the parameters' size");
	std::size_t e = static_cast<std::size_t>(s.epochs);
	std::size_t n = s.order.size() / e;
	require(n > 0 && n * e == s.order.size(), where,
		"not E orders of the same length");
	require(s.subset == 0 || n == static_cast<std::size_t>(s.subset), where,
		"an order is not as long as the subset");
	for (std::int32_t i : s.order)
		require(i >= 0 && static_cast<std::size_t>(i) < n, where,
			"an index of an order out of range");
}

/* Writes s into dir (made when not there). Throws std::runtime_error on
 * a setup that does not hold together or a file it cannot write. */
inline void write_setup(const std::string &dir, const setup &s)
{
	check_setup(s, dir);
	std::error_code made;
	std::filesystem::create_directories(dir, made);
	std::ofstream text(dir + "/setup.txt");
	std::ofstream weights(dir + "/weights.f32", std::ios::binary);
	std::ofstream order(dir + "/order.i32", std::ios::binary);
	if (!text || !weights || !order)
		throw std::runtime_error(dir + ": cannot write the setup (" +
					 std::strerror(errno) + ")");
	text.precision(9);
	text << "tagger-setup 1\nsizes " << s.n_words << ' ' << s.n_chars << ' '
	     << s.n_tags << ' ' << dims::word_embed << ' ' << dims::char_embed
	     << ' ' << dims::char_hidden << ' ' << dims::word_hidden << ' '
	     << dims::mlp << "\nchars " << (s.chars ? "on" : "off") << '\n';
	setup_text::write_run(text, s);
	text << "\nparams";
	for (const shape &p : shapes(s.n_words, s.n_chars, s.n_tags))
		text << ' ' << p.name << ' ' << p.rows << ' ' << p.cols;
	text << "\nfiles weights.f32 order.i32\n";
	weights.write(
		reinterpret_cast<const char *>(s.weights.data()),
		static_cast<std::streamsize>(s.weights.size() * sizeof(float)));
	order.write(reinterpret_cast<const char *>(s.order.data()),
		    static_cast<std::streamsize>(s.order.size() *
						 sizeof(std::int32_t)));
	if (!text.flush() || !weights.flush() || !order.flush())
		throw std::runtime_error(dir + ": writing the setup failed");
}

/* The bytes of dir/name, when it holds exactly want of them. */
inline std::vector<char> read_exactly(const std::string &dir,
				      const std::string &name, std::size_t want,
				      const char *what)
{
	std::string path = dir + "/" + name;
	require(name.find('/') == std::string::npos && !name.empty(),
		dir + "/setup.txt", "a file name with a '/'");
	std::ifstream in(path, std::ios::binary | std::ios::ate);
	if (!in)
		throw std::runtime_error(path + ": cannot open (" +
					 std::strerror(errno) + ")");
	auto size = static_cast<std::size_t>(in.tellg());
	require(size == want, path, what);
	std::vector<char> bytes(size);
	in.seekg(0);
	in.read(bytes.data(), static_cast<std::streamsize>(size));
	require(static_cast<bool>(in), path, "cannot read");
	return bytes;
}

/* Reads what write_setup wrote; throws std::runtime_error naming the
 * file and what is wrong with it. */
inline setup read_setup(const std::string &dir)
{
	std::string where = dir + "/setup.txt";
	std::ifstream text(where);
	if (!text)
		throw std::runtime_error(where +
					 ": cannot open (run tagger "
					 "--export " +
					 dir + ")");
	auto expect = [&](const char *word) {
		setup_text::expect(text, where, word);
	};
	setup s;
	int version = 0, fixed[5] = {};
	expect("tagger-setup");
	text >> version;
	require(text && version == 1, where, "not version 1");
	expect("sizes");
	text >> s.n_words >> s.n_chars >> s.n_tags;
	for (int &n : fixed)
		text >> n;
	require(text && fixed[0] == dims::word_embed &&
			fixed[1] == dims::char_embed &&
			fixed[2] == dims::char_hidden &&
			fixed[3] == dims::word_hidden && fixed[4] == dims::mlp,
		where, "not a 128-20-64-50-32 model");
	require(s.n_words >= 1 && s.n_chars >= 2 && s.n_tags >= 2 &&
			s.n_words <= 1 << 24 && s.n_chars <= 1 << 16 &&
			s.n_tags <= 1 << 16,
		where, "not sizes of a vocabulary");
	expect("chars");
	std::string chars;
	text >> chars;
	require(chars == "on" || chars == "off", where, "chars not on|off");
	s.chars = chars == "on";
	setup_text::read_run(text, where, s);
	expect("params");
	int p = 0;
	for (const shape &want : shapes(s.n_words, s.n_chars, s.n_tags)) {
		std::string name;
		int rows = 0, cols = 0;
		text >> name >> rows >> cols;
		p++;
		if (!text || name != want.name || rows != want.rows ||
		    cols != want.cols)
			throw std::runtime_error(where + ": parameter " +
						 std::to_string(p) +
						 " is not " + want.name);
	}
	expect("files");
	std::string weights_file, order_file;
	text >> weights_file >> order_file;
	require(static_cast<bool>(text), where, "no file names");

	std::size_t n = n_weights(s.n_words, s.n_chars, s.n_tags);
	std::vector<char> bytes =
		read_exactly(dir, weights_file, n * sizeof(float),
			     "not the parameters' size");
	s.weights.resize(n);
	std::memcpy(s.weights.data(), bytes.data(), bytes.size());

	/* The orders: their length is the file's over E. */
	std::string path = dir + "/" + order_file;
	std::ifstream in(path, std::ios::binary | std::ios::ate);
	if (!in)
		throw std::runtime_error(path + ": cannot open (" +
					 std::strerror(errno) + ")");
	auto size = static_cast<std::size_t>(in.tellg());
	std::size_t ints = size / sizeof(std::int32_t);
	require(ints * sizeof(std::int32_t) == size &&
			ints % static_cast<std::size_t>(s.epochs) == 0 &&
			ints > 0,
		path, "not E orders of 32-bit ints");
	bytes = read_exactly(dir, order_file, size, "changed size");
	s.order.resize(ints);
	std::memcpy(s.order.data(), bytes.data(), bytes.size());
	check_setup(s, path);
	return s;
}

} // namespace tagger

#endif /* EXAMPLES_TAGGER_SETUP_HPP */
