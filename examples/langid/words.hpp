/* The data of examples/langid, as scripts/fetch-words.sh writes it, and
 * the setup a run exports for bench/compare/ (the initial weights, each
 * epoch's learning rate and order), read and written the same way by the
 * trainer, the floor and the PyTorch side. No libadg here. */
#ifndef EXAMPLES_LANGID_WORDS_HPP
#define EXAMPLES_LANGID_WORDS_HPP

#include "../setup_text.hpp"
#include "gru.hpp"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace words
{

/* The languages, in the order of their labels (fetch-words.sh's). */
inline const char *const codes[gru::classes] = {"en", "fr", "de", "es", "it",
						"pt", "nl", "pl", "sv"};
inline const char *const names[gru::classes] = {
	"English",    "French", "German", "Spanish", "Italian",
	"Portuguese", "Dutch",	"Polish", "Swedish"};

/* Words (their UTF-8 bytes) and their languages. */
struct dataset {
	std::vector<std::string> text;
	std::vector<int> label;
	std::size_t size() const
	{
		return label.size();
	}
};

/* A file of the data set is not there: scripts/fetch-words.sh has not
 * run. Tests skip on it; anything else wrong with the data is a
 * std::runtime_error. */
struct missing : std::runtime_error {
	using std::runtime_error::runtime_error;
};

/* dir/name (train.txt or test.txt): lines "CODE<tab>WORD". Keeps the first
 * per_language words of each language (0: all of them), in the file's
 * order (fetch-words.sh's sample order, so a subset is a sample too). */
inline dataset read(const std::string &dir, const std::string &name,
		    int per_language = 0)
{
	std::string path = dir + "/" + name;
	std::ifstream in(path);
	if (!in)
		throw missing(path + ": " + std::strerror(errno) +
			      " (scripts/fetch-words.sh makes it)");
	dataset d;
	int kept[gru::classes] = {};
	std::string line;
	for (int number = 1; std::getline(in, line); number++) {
		std::size_t tab = line.find('\t');
		int label = -1;
		for (int k = 0; k < gru::classes && tab != std::string::npos;
		     k++)
			if (line.compare(0, tab, codes[k]) == 0)
				label = k;
		std::size_t bytes = line.size() - tab - 1;
		if (label < 0 || bytes < 1 ||
		    bytes > static_cast<std::size_t>(gru::max_length))
			throw std::runtime_error(
				path + ":" + std::to_string(number) +
				": not CODE<tab>WORD of 1 to 20 bytes (run "
				"scripts/fetch-words.sh again)");
		if (per_language > 0 && kept[label] >= per_language)
			continue;
		kept[label]++;
		d.text.push_back(line.substr(tab + 1));
		d.label.push_back(label);
	}
	for (int k = 0; k < gru::classes; k++)
		if (kept[k] == 0)
			throw std::runtime_error(path + ": no word of " +
						 names[k]);
	return d;
}

/* What bench/compare/ needs to train the same model the same way, in a
 * folder of three files:
 * - setup.txt, whitespace-separated words:
 *     langid-setup 1
 *     sizes 256 32 64 9              bytes, embedding, hidden, classes
 *     epochs E batch B subset S seed X
 *     lr E floats                    each epoch's learning rate
 *     params embed 256 32 w_ih 192 32 ... b_out 1 9
 *     files weights.f32 order.i32
 *   S: the training words per language (0: all); floats with 9
 *   significant digits, which read back to the same float;
 * - weights.f32: the initial values of the parameters listed, in that
 *   order, each row-major, as 32-bit floats in this machine's byte order;
 * - order.i32: E times N 32-bit ints in this machine's byte order, each
 *   epoch's order of the N training words (0-based, into the training
 *   words as read with that subset), epoch 1 first. */
struct setup : setup_text::run {
	gru::weights initial;
	std::vector<std::vector<int>> order;
};

inline void write_setup(const std::string &dir, const setup &s)
{
	std::ofstream text(dir + "/setup.txt");
	std::ofstream weights(dir + "/weights.f32", std::ios::binary);
	std::ofstream order(dir + "/order.i32", std::ios::binary);
	if (!text || !weights || !order)
		throw std::runtime_error(dir + ": cannot write the setup (" +
					 std::strerror(errno) + ")");
	text.precision(9);
	text << "langid-setup 1\nsizes " << gru::n_bytes << ' ' << gru::embed
	     << ' ' << gru::hidden << ' ' << gru::classes << '\n';
	setup_text::write_run(text, s);
	text << "\nparams";
	for (int p = 0; p < gru::n_params; p++) {
		text << ' ' << gru::shapes[p].name << ' ' << gru::shapes[p].rows
		     << ' ' << gru::shapes[p].cols;
		weights.write(
			reinterpret_cast<const char *>(s.initial[p].data()),
			static_cast<std::streamsize>(s.initial[p].size() *
						     sizeof(float)));
	}
	text << "\nfiles weights.f32 order.i32\n";
	for (const auto &epoch : s.order)
		for (int i : epoch) {
			std::int32_t v = i;
			order.write(reinterpret_cast<const char *>(&v),
				    sizeof v);
		}
	if (!text.flush() || !weights.flush() || !order.flush())
		throw std::runtime_error(dir + ": writing the setup failed");
}

/* Reads what write_setup wrote. The reader checks that each epoch's
 * order is as long as its training words (read with the setup's
 * subset). */
inline setup read_setup(const std::string &dir)
{
	const std::string where = dir + "/setup.txt";
	std::ifstream text(where);
	if (!text)
		throw std::runtime_error(where +
					 ": cannot open (run langid "
					 "--export " +
					 dir + ")");
	auto expect = [&](const char *word) {
		setup_text::expect(text, where, word);
	};
	setup s;
	int version, sizes[4];
	expect("langid-setup");
	text >> version;
	expect("sizes");
	for (int &n : sizes)
		text >> n;
	if (!text || version != 1 || sizes[0] != gru::n_bytes ||
	    sizes[1] != gru::embed || sizes[2] != gru::hidden ||
	    sizes[3] != gru::classes)
		throw std::runtime_error(
			where + ": not a 256-32-64-9 setup, version 1");
	setup_text::read_run(text, where, s);
	expect("params");
	for (int p = 0; p < gru::n_params; p++) {
		std::string name;
		int rows, cols;
		text >> name >> rows >> cols;
		if (!text || name != gru::shapes[p].name ||
		    rows != gru::shapes[p].rows || cols != gru::shapes[p].cols)
			throw std::runtime_error(
				where + ": parameter " + std::to_string(p + 1) +
				" is not " + gru::shapes[p].name);
	}
	expect("files");
	std::string weights_file, order_file;
	text >> weights_file >> order_file;
	auto open = [&](const std::string &name) {
		std::ifstream in(dir + "/" + name, std::ios::binary);
		if (!in)
			throw std::runtime_error(dir + "/" + name +
						 ": cannot open");
		return in;
	};
	std::ifstream in = open(weights_file);
	for (int p = 0; p < gru::n_params; p++) {
		s.initial[p].resize(gru::elements(p));
		in.read(reinterpret_cast<char *>(s.initial[p].data()),
			static_cast<std::streamsize>(gru::elements(p) *
						     sizeof(float)));
	}
	if (!in || in.peek() != std::char_traits<char>::eof())
		throw std::runtime_error(dir + "/" + weights_file +
					 ": not the parameters' size");
	/* The orders: the words per epoch is the file's size over E. */
	in = open(order_file);
	in.seekg(0, std::ios::end);
	auto bytes = static_cast<std::size_t>(in.tellg());
	std::size_t n = bytes / sizeof(std::int32_t) / s.epochs;
	if (bytes == 0 || n * sizeof(std::int32_t) * s.epochs != bytes)
		throw std::runtime_error(dir + "/" + order_file +
					 ": not E orders of 32-bit ints");
	std::vector<std::int32_t> order(n * s.epochs);
	in.seekg(0);
	in.read(reinterpret_cast<char *>(order.data()),
		static_cast<std::streamsize>(bytes));
	for (int e = 0; e < s.epochs; e++) {
		auto first = order.begin() + static_cast<long>(e * n);
		s.order.emplace_back(first, first + static_cast<long>(n));
		for (int i : s.order.back())
			if (i < 0 || static_cast<std::size_t>(i) >= n)
				throw std::runtime_error(dir + "/" +
							 order_file +
							 ": an index out of "
							 "range");
	}
	return s;
}

} // namespace words

#endif /* EXAMPLES_LANGID_WORDS_HPP */
