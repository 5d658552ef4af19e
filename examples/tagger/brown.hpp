/* The tagged Brown corpus for examples/tagger, as scripts/fetch-brown.sh
 * unpacks it: tokens to ids, tags folded, split by file, with the
 * vocabulary of dynet-benchmark's taggers. Read the same way by the
 * trainer, the floor and the PyTorch side. No libadg here.
 *
 * The package's files: cats.txt names the 500 texts ("ca01 news", a line
 * each); each text has a sentence per line that holds a token, tokens
 * "word/tag" apart by blanks (spaces, tabs), the tag after the last '/'
 * (a word such as 1/2 holds one too). */
#ifndef EXAMPLES_TAGGER_BROWN_HPP
#define EXAMPLES_TAGGER_BROWN_HPP

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace brown
{

/* A word form seen more than this many times in the training files is
 * known (has its own embedding); any other is rare and spelled. */
constexpr int rare_max = 5;
/* Every tenth file, by name, is a test file: those at index % 10 == 9. */
constexpr std::size_t test_every = 10;

struct sentence {
	std::vector<int> words; // per token: known-word id >= 1, or 0 (rare)
	std::vector<int> tags;	// per token: tag id
	// per token: its bytes' char ids (>= 1, no boundaries) for a rare
	// word, empty for a known one
	std::vector<std::vector<int>> spellings;
};

struct corpus {
	std::vector<sentence> train, test; // in file order, line order
	std::vector<std::string> words;	   // words[0] == "<unk>"
	std::vector<std::string> chars;	   // [0] boundary, [1] unseen byte
	std::vector<std::string> tags;	   // folded
	std::size_t train_files = 0, test_files = 0;
	std::size_t train_tokens = 0, test_tokens = 0;
};

/* A file of the corpus is not there (scripts/fetch-brown.sh has not run,
 * or not whole). Tests may skip on it; anything else wrong with the data
 * is a plain std::runtime_error. */
struct missing : std::runtime_error {
	using std::runtime_error::runtime_error;
};

/* The tag set: lower case; a compound tag (pps+bez, "it's") keeps its
 * first part; a foreign word's fw- prefix goes (fw-nn -> nn); then every
 * -tl (title), -hl (headline) and -nc (cited) suffix, in any number
 * (nn-tl-hl -> nn). Negations (md*) and possessives (nn$) stay classes of
 * their own. Cutting at '+' first also drops the stray suffixes of a few
 * compounds (ppss+ber-n). Returns "" for a tag with nothing left. */
inline std::string fold(std::string tag)
{
	for (char &c : tag)
		if (c >= 'A' && c <= 'Z')
			c = static_cast<char>(c - 'A' + 'a');
	if (tag.compare(0, 3, "fw-") == 0)
		tag.erase(0, 3);
	tag = tag.substr(0, tag.find('+'));
	auto ends = [&](const char *suffix) {
		return tag.size() > 3 &&
		       tag.compare(tag.size() - 3, 3, suffix) == 0;
	};
	while (ends("-tl") || ends("-hl") || ends("-nc"))
		tag.resize(tag.size() - 3);
	return tag;
}

/* One token as read: the word's bytes and its tag, folded. */
struct token {
	std::string word, tag;
};
using text = std::vector<std::vector<token>>; // a file's sentences

/* The texts' names, from dir/cats.txt, sorted. */
inline std::vector<std::string> file_names(const std::string &dir)
{
	std::string path = dir + "/cats.txt";
	std::ifstream in(path);
	if (!in)
		throw missing(path + ": " + std::strerror(errno) +
			      " (scripts/fetch-brown.sh fetches the corpus)");
	std::vector<std::string> names;
	std::string line;
	for (int number = 1; std::getline(in, line); number++) {
		std::istringstream words(line);
		std::string name;
		if (!(words >> name))
			continue;
		bool plain = std::all_of(name.begin(), name.end(), [](char c) {
			return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
		});
		if (!plain)
			throw std::runtime_error(
				path + ":" + std::to_string(number) +
				": not a text's name: " + name);
		names.push_back(name);
	}
	std::sort(names.begin(), names.end());
	if (names.empty())
		throw std::runtime_error(path + ": names no text");
	auto twice = std::adjacent_find(names.begin(), names.end());
	if (twice != names.end())
		throw std::runtime_error(path + ": names " + *twice + " twice");
	return names;
}

/* The sentences of dir/name, tags folded. */
inline text read_text(const std::string &dir, const std::string &name)
{
	std::string path = dir + "/" + name;
	std::ifstream in(path, std::ios::binary);
	if (!in)
		throw missing(path + ": " + std::strerror(errno) +
			      " (run scripts/fetch-brown.sh again)");
	text sentences;
	std::string line;
	for (int number = 1; std::getline(in, line); number++) {
		std::vector<token> tokens;
		std::size_t end = 0;
		for (;;) {
			const char *blank = " \t\r\f\v";
			std::size_t start = line.find_first_not_of(blank, end);
			if (start == std::string::npos)
				break;
			end = std::min(line.find_first_of(blank, start),
				       line.size());
			std::string item = line.substr(start, end - start);
			std::size_t slash = item.rfind('/');
			std::string tag =
				slash == std::string::npos
					? ""
					: fold(item.substr(slash + 1));
			if (slash == 0 || tag.empty())
				throw std::runtime_error(
					path + ":" + std::to_string(number) +
					": \"" + item +
					"\" is not word/tag (run "
					"scripts/fetch-brown.sh again)");
			tokens.push_back({item.substr(0, slash), tag});
		}
		if (!tokens.empty())
			sentences.push_back(std::move(tokens));
	}
	if (in.bad())
		throw std::runtime_error(path + ": cannot read");
	if (sentences.empty())
		throw std::runtime_error(path + ": no sentence in it");
	return sentences;
}

/* Ids of the keys of a sorted map, from first on, in byte order. */
template <typename T>
std::vector<std::string> assign_ids(std::map<std::string, T> &ids, int first)
{
	std::vector<std::string> names;
	for (auto &entry : ids) {
		entry.second = static_cast<T>(first + names.size());
		names.push_back(entry.first);
	}
	return names;
}

/* Reads the unpacked package in dir. Throws std::runtime_error naming the
 * file and what is wrong (missing file, bad token, ...); brown::missing
 * for a file that is not there.
 *
 * Ids are deterministic: tags, known words and bytes in byte order. The
 * tags are those of all 500 files (a test file's rare tag has its class
 * too); words and bytes those of the training files. */
inline corpus load(const std::string &dir)
{
	std::vector<std::string> names = file_names(dir);
	std::vector<text> texts;
	for (const std::string &name : names)
		texts.push_back(read_text(dir, name));
	auto is_test = [](std::size_t file) {
		return file % test_every == test_every - 1;
	};

	std::map<std::string, int> tag_ids, word_ids;
	std::unordered_map<std::string, int> seen; // training word counts
	bool bytes[256] = {};
	for (std::size_t f = 0; f < texts.size(); f++)
		for (const auto &tokens : texts[f])
			for (const token &t : tokens) {
				tag_ids[t.tag] = 0;
				if (is_test(f))
					continue;
				seen[t.word]++;
				for (unsigned char c : t.word)
					bytes[c] = true;
			}
	corpus c;
	c.tags = assign_ids(tag_ids, 0);
	for (const auto &entry : seen)
		if (entry.second > rare_max)
			word_ids[entry.first] = 0;
	c.words = assign_ids(word_ids, 1);
	c.words.insert(c.words.begin(), "<unk>");
	int char_ids[256] = {};
	c.chars = {"<boundary>", "<unseen>"};
	for (int b = 0; b < 256; b++)
		if (bytes[b]) {
			char_ids[b] = static_cast<int>(c.chars.size());
			c.chars.push_back(std::string(1, static_cast<char>(b)));
		}

	for (std::size_t f = 0; f < texts.size(); f++) {
		bool test = is_test(f);
		(test ? c.test_files : c.train_files)++;
		for (const auto &tokens : texts[f]) {
			sentence s;
			for (const token &t : tokens) {
				auto known = word_ids.find(t.word);
				s.words.push_back(known == word_ids.end()
							  ? 0
							  : known->second);
				s.tags.push_back(tag_ids[t.tag]);
				s.spellings.emplace_back();
				if (known == word_ids.end())
					for (unsigned char b : t.word)
						s.spellings.back().push_back(
							bytes[b] ? char_ids[b]
								 : 1);
			}
			(test ? c.test_tokens : c.train_tokens) +=
				tokens.size();
			(test ? c.test : c.train).push_back(std::move(s));
		}
	}
	return c;
}

/* The share of the tokens of these sentences that are rare words. */
inline double rare_share(const std::vector<sentence> &sentences)
{
	std::size_t rare = 0, all = 0;
	for (const sentence &s : sentences)
		for (int w : s.words) {
			rare += w == 0;
			all++;
		}
	return all ? static_cast<double>(rare) / static_cast<double>(all) : 0.0;
}

/* What was loaded, in a few lines, for a program's log. */
inline std::string summary(const corpus &c)
{
	char line[512];
	std::snprintf(line, sizeof line,
		      "brown: %zu training files, %zu sentences, %zu tokens "
		      "(%.2f%% rare)\n"
		      "brown: %zu test files, %zu sentences, %zu tokens "
		      "(%.2f%% rare)\n"
		      "brown: %zu tags (folded), %zu words (<unk> and those "
		      "seen more than %d times in training), %zu chars "
		      "(boundary, unseen and %zu bytes)\n",
		      c.train_files, c.train.size(), c.train_tokens,
		      100 * rare_share(c.train), c.test_files, c.test.size(),
		      c.test_tokens, 100 * rare_share(c.test), c.tags.size(),
		      c.words.size(), rare_max, c.chars.size(),
		      c.chars.size() - 2);
	return line;
}

} // namespace brown

#endif /* EXAMPLES_TAGGER_BROWN_HPP */
