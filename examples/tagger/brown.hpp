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
#include <cstdint>
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

namespace detail
{

/* A token as read: where its word is in its text's bytes, and its tag's
 * id among the folded tags in the order first seen. Offsets rather than
 * strings: a million tokens, read in every sanitizer build. */
struct token {
	std::size_t word;
	std::uint32_t length;
	int tag, form; // form: an index into forms::names, set there
};

struct text {
	std::string bytes;
	std::vector<std::vector<token>> sentences;
};

/* The folded tags, ids in the order first seen, and each raw tag's. */
struct tag_table {
	std::unordered_map<std::string, int> raw; // raw tag -> folded id
	std::map<std::string, int> folded;	  // folded tag -> its id
	std::string key;			  // reused: no allocation
	int id(const char *tag, std::size_t length)
	{
		key.assign(tag, length);
		auto found = raw.find(key);
		if (found != raw.end())
			return found->second;
		std::string name = fold(key);
		int id = -1;
		if (!name.empty())
			id = folded.emplace(name,
					    static_cast<int>(folded.size()))
				     .first->second;
		raw.emplace(key, id);
		return id;
	}
};

inline bool blank(char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
}

/* The sentences of dir/name: a line's tokens, for each line with one. */
inline text read_text(const std::string &dir, const std::string &name,
		      tag_table &tags)
{
	std::string path = dir + "/" + name;
	std::ifstream in(path, std::ios::binary | std::ios::ate);
	if (!in)
		throw missing(path + ": " + std::strerror(errno) +
			      " (run scripts/fetch-brown.sh again)");
	text t;
	t.bytes.resize(static_cast<std::size_t>(in.tellg()));
	in.seekg(0);
	in.read(&t.bytes[0], static_cast<std::streamsize>(t.bytes.size()));
	if (!in)
		throw std::runtime_error(path + ": cannot read");
	const std::string &b = t.bytes;
	std::vector<token> tokens;
	int number = 1;
	for (std::size_t at = 0; at <= b.size(); at++) {
		if (at == b.size() || b[at] == '\n') {
			if (!tokens.empty())
				t.sentences.push_back(std::move(tokens));
			tokens.clear();
			number++;
			continue;
		}
		if (blank(b[at]))
			continue;
		std::size_t end = at, slash = std::string::npos;
		for (; end < b.size() && b[end] != '\n' && !blank(b[end]);
		     end++)
			if (b[end] == '/')
				slash = end;
		int tag = slash == std::string::npos || slash == at
				  ? -1
				  : tags.id(&b[slash + 1], end - slash - 1);
		if (tag < 0)
			throw std::runtime_error(
				path + ":" + std::to_string(number) + ": \"" +
				b.substr(at, end - at) +
				"\" is not word/tag (run "
				"scripts/fetch-brown.sh "
				"again)");
		tokens.push_back(
			{at, static_cast<std::uint32_t>(slash - at), tag, 0});
		at = end - 1;
	}
	if (t.sentences.empty())
		throw std::runtime_error(path + ": no sentence in it");
	return t;
}

inline bool is_test(std::size_t file)
{
	return file % test_every == test_every - 1;
}

/* The word forms of all the texts, each token's noted (one look-up a
 * token), and the training texts' counts of them and their bytes. */
struct forms {
	std::vector<std::string> names; // as first seen
	std::vector<int> counts;	// in the training texts
	bool bytes[256] = {};		// in a training text's word
	std::unordered_map<std::string, int> ids{1 << 16};

	explicit forms(std::vector<text> &texts)
	{
		std::string key;
		for (std::size_t f = 0; f < texts.size(); f++)
			for (auto &tokens : texts[f].sentences)
				for (token &t : tokens) {
					key.assign(texts[f].bytes, t.word,
						   t.length);
					t.form = number(key);
					if (!is_test(f))
						count(t.form, key);
				}
	}
	int number(const std::string &key)
	{
		auto at = ids.emplace(key, static_cast<int>(names.size()));
		if (at.second) {
			names.push_back(key);
			counts.push_back(0);
		}
		return at.first->second;
	}
	void count(int form, const std::string &key)
	{
		counts[static_cast<std::size_t>(form)]++;
		for (char b : key)
			bytes[static_cast<unsigned char>(b)] = true;
	}
};

/* The word ids: c.words[0] "<unk>", then the forms seen more than
 * rare_max times in training, in byte order. Returns each form's id. */
inline std::vector<int> word_ids(forms &f, corpus &c)
{
	c.words = {"<unk>"};
	for (std::size_t w = 0; w < f.names.size(); w++)
		if (f.counts[w] > rare_max)
			c.words.push_back(f.names[w]);
	std::sort(c.words.begin() + 1, c.words.end());
	std::vector<int> id(f.names.size(), 0);
	for (std::size_t w = 1; w < c.words.size(); w++)
		id[static_cast<std::size_t>(f.ids[c.words[w]])] =
			static_cast<int>(w);
	return id;
}

/* The char ids: c.chars[0] the boundary, [1] a byte unseen, then the
 * bytes seen, in byte order. Returns each byte's id. */
inline std::vector<int> char_ids(const forms &f, corpus &c)
{
	std::vector<int> id(256, 1);
	c.chars = {"<boundary>", "<unseen>"};
	for (int b = 0; b < 256; b++)
		if (f.bytes[b]) {
			id[static_cast<std::size_t>(b)] =
				static_cast<int>(c.chars.size());
			c.chars.push_back(std::string(1, static_cast<char>(b)));
		}
	return id;
}

/* The tag ids: the folded tags in byte order. Returns each tag's, by its
 * id as read. */
inline std::vector<int> tag_ids(const tag_table &tags, corpus &c)
{
	std::vector<int> id(tags.folded.size());
	for (const auto &tag : tags.folded) {
		id[static_cast<std::size_t>(tag.second)] =
			static_cast<int>(c.tags.size());
		c.tags.push_back(tag.first);
	}
	return id;
}

/* A sentence as read, in ids. */
inline sentence to_ids(const std::vector<token> &tokens,
		       const std::string &bytes, const std::vector<int> &word,
		       const std::vector<int> &chars,
		       const std::vector<int> &tag)
{
	sentence s;
	s.words.reserve(tokens.size());
	s.tags.reserve(tokens.size());
	s.spellings.resize(tokens.size());
	for (std::size_t i = 0; i < tokens.size(); i++) {
		const token &t = tokens[i];
		s.words.push_back(word[static_cast<std::size_t>(t.form)]);
		s.tags.push_back(tag[static_cast<std::size_t>(t.tag)]);
		if (s.words.back() != 0)
			continue;
		s.spellings[i].reserve(t.length);
		for (std::size_t k = 0; k < t.length; k++)
			s.spellings[i].push_back(
				chars[static_cast<unsigned char>(
					bytes[t.word + k])]);
	}
	return s;
}

} // namespace detail

/* Reads the unpacked package in dir. Throws std::runtime_error naming the
 * file and what is wrong (missing file, bad token, ...); brown::missing
 * for a file that is not there.
 *
 * Ids are deterministic: tags, known words and bytes in byte order. The
 * tags are those of all the files (a test file's rare tag has its class
 * too); words and bytes those of the training files. */
inline corpus load(const std::string &dir)
{
	detail::tag_table tags;
	std::vector<detail::text> texts;
	for (const std::string &name : file_names(dir))
		texts.push_back(detail::read_text(dir, name, tags));
	detail::forms forms(texts);
	corpus c;
	std::vector<int> word = detail::word_ids(forms, c);
	std::vector<int> chars = detail::char_ids(forms, c);
	std::vector<int> tag = detail::tag_ids(tags, c);
	for (std::size_t f = 0; f < texts.size(); f++) {
		bool test = detail::is_test(f);
		(test ? c.test_files : c.train_files)++;
		for (const auto &tokens : texts[f].sentences) {
			(test ? c.test_tokens : c.train_tokens) +=
				tokens.size();
			(test ? c.test : c.train)
				.push_back(detail::to_ids(tokens,
							  texts[f].bytes, word,
							  chars, tag));
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
