/* examples/tagger's data, without libadg: brown.hpp on a tiny corpus this
 * test writes (the tag folding, the split by file, the vocabulary and the
 * spellings, the errors, each naming its file) and setup.hpp's round trip
 * and refusals. A plain main() as test_cpp.cpp's, so that every build
 * runs it; prints "tagger-data: N passed, M failed" and Criterion's
 * summary line (scripts/test.sh and scripts/valgrind.sh read it). */
#include "brown.hpp"
#include "setup.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace
{

namespace fs = std::filesystem;

struct check_failed {
	std::string what;
};

#define EXPECT(cond)                                                           \
	do {                                                                   \
		if (!(cond))                                                   \
			throw check_failed{std::string(__FILE__ ":") +         \
					   std::to_string(__LINE__) + ": " +   \
					   #cond};                             \
	} while (0)

/* Runs statement, which must throw an X whose what() holds every string
 * of the list that follows. */
#define EXPECT_THROWS(X, statement, ...)                                       \
	do {                                                                   \
		bool thrown_ = false;                                          \
		try {                                                          \
			statement;                                             \
		} catch (const X &e) {                                         \
			thrown_ = true;                                        \
			const std::vector<std::string> parts_{__VA_ARGS__};    \
			for (const std::string &part_ : parts_)                \
				EXPECT(says(e, part_));                        \
		}                                                              \
		EXPECT(thrown_ && "threw " #X);                                \
	} while (0)

bool says(const std::exception &e, const std::string &part)
{
	bool found = std::string(e.what()).find(part) != std::string::npos;
	if (!found)
		std::printf("  message \"%s\" lacks \"%s\"\n", e.what(),
			    part.c_str());
	return found;
}

struct test_case {
	const char *name;
	void (*run)();
};

std::vector<test_case> &all_tests()
{
	static std::vector<test_case> tests;
	return tests;
}

struct registrar {
	registrar(const char *name, void (*run)())
	{
		all_tests().push_back({name, run});
	}
};

#define TEST(name)                                                             \
	void name();                                                           \
	const registrar name##_registrar(#name, name);                         \
	void name()

/* A fresh folder under the system's temporary one, gone with the test. */
struct temp_dir {
	std::string path;
	temp_dir()
	{
		std::string pattern =
			(fs::temp_directory_path() / "tagger-data.XXXXXX")
				.string();
		std::vector<char> name(pattern.begin(), pattern.end());
		name.push_back('\0');
		if (!mkdtemp(name.data()))
			throw std::runtime_error("mkdtemp failed");
		path = name.data();
	}
	~temp_dir()
	{
		std::error_code ignored;
		fs::remove_all(path, ignored);
	}
	void write(const std::string &name, const std::string &text) const
	{
		std::ofstream(path + "/" + name, std::ios::binary) << text;
	}
};

/* ---------------------------------------------------------- brown.hpp */

/* Twelve texts, t00 .. t11, listed out of order in cats.txt: t09 is the
 * test file (index 9), the eleven others train. In training, "the" is
 * seen 11 times and "an" 6 (known), "cat" and "zoo" 5 (rare: 5 is not
 * more than 5), "The" once, "dog" 3 times; the test file has "dog" 7
 * times more (test counts do not count) and "zq", whose 'q' no training
 * word has. */
void write_corpus(const temp_dir &d)
{
	std::string cats;
	for (int f = 11; f >= 0; f--)
		cats += "t" + std::string(f < 10 ? "0" : "") +
			std::to_string(f) + " news\n";
	d.write("cats.txt", cats);
	d.write("t00", "\n\n\tThe/at-tl the/at cat/nn ./.\n"
		       "\n\tthe/at\tcat/nn-tl-hl  dog/fw-nn\n");
	d.write("t01", "\tit's/pps+bez the/at 1/2/cd cat/NN\n");
	d.write("t02", "\tthe/at dog/nn ;/---hl cat/nn-nc\n");
	d.write("t03", "\tthe/at cat/nn dog/nn\n");
	for (int f = 4; f <= 8; f++)
		d.write("t0" + std::to_string(f),
			"\tzoo/fw-*\t\tan/at the/at-hl\n");
	d.write("t09", "\tdog/nn dog/nn dog/nn dog/nn dog/nn dog/nn dog/nn "
		       "zq/nn the/at new/jj+in\n");
	d.write("t10", "\tthe/at an/at\n");
	d.write("t11", "\tthey're/ppss+ber-n\n");
}

int id_of(const std::vector<std::string> &names, const std::string &name)
{
	for (std::size_t i = 0; i < names.size(); i++)
		if (names[i] == name)
			return static_cast<int>(i);
	return -1;
}

std::vector<int> spelled(const brown::corpus &c, const std::string &word)
{
	std::vector<int> ids;
	for (char b : word)
		ids.push_back(id_of(c.chars, std::string(1, b)));
	return ids;
}

TEST(folding)
{
	EXPECT(brown::fold("nn") == "nn");
	EXPECT(brown::fold("nn-tl") == "nn");
	EXPECT(brown::fold("nn-tl-hl") == "nn");
	EXPECT(brown::fold("nns-tl-nc") == "nns");
	EXPECT(brown::fold("fw-nn") == "nn");
	EXPECT(brown::fold("fw-nn-tl") == "nn");
	EXPECT(brown::fold("fw-in+at-t") == "in");
	EXPECT(brown::fold("pps+bez") == "pps");
	EXPECT(brown::fold("ppss+ber-n") == "ppss");
	EXPECT(brown::fold("NN-TL") == "nn");
	EXPECT(brown::fold("---hl") == "--");
	EXPECT(brown::fold("--") == "--");
	EXPECT(brown::fold("fw-*") == "*");
	EXPECT(brown::fold("md*") == "md*");
	EXPECT(brown::fold("nn$-tl") == "nn$");
	EXPECT(brown::fold("fw-").empty());
}

TEST(split_tags_and_counts)
{
	temp_dir d;
	write_corpus(d);
	brown::corpus c = brown::load(d.path);
	EXPECT(c.train_files == 11 && c.test_files == 1);
	/* t00 has 2 sentences, t01 .. t08, t10, t11 one each. */
	EXPECT(c.train.size() == 12 && c.test.size() == 1);
	EXPECT(c.train_tokens == 4 + 3 + 4 + 4 + 3 + 5 * 3 + 2 + 1);
	EXPECT(c.test_tokens == 10);
	EXPECT((c.tags == std::vector<std::string>{"*", "--", ".", "at", "cd",
						   "jj", "nn", "pps", "ppss"}));
	/* File order, then line order: t00's second sentence second. */
	auto tag = [&](const char *name) { return id_of(c.tags, name); };
	EXPECT((c.train[0].tags ==
		std::vector<int>{tag("at"), tag("at"), tag("nn"), tag(".")}));
	EXPECT((c.train[1].tags ==
		std::vector<int>{tag("at"), tag("nn"), tag("nn")}));
	EXPECT((c.train[2].tags ==
		std::vector<int>{tag("pps"), tag("at"), tag("cd"), tag("nn")}));
	EXPECT(c.train[3].tags[2] == tag("--"));
	EXPECT(c.train[5].tags[0] == tag("*"));
	EXPECT(c.train[11].tags[0] == tag("ppss"));
	EXPECT(c.test[0].tags[9] == tag("jj"));
	std::string text = brown::summary(c);
	EXPECT(text.find("9 tags") != std::string::npos);
	EXPECT(text.find("1 test files, 1 sentences, 10 tokens") !=
	       std::string::npos);
}

TEST(vocabulary_and_spellings)
{
	temp_dir d;
	write_corpus(d);
	brown::corpus c = brown::load(d.path);
	EXPECT((c.words == std::vector<std::string>{"<unk>", "an", "the"}));
	int the = 2;
	EXPECT(c.train[0].words[1] == the && c.train[0].words[0] == 0);
	EXPECT(c.train[0].spellings[1].empty());
	/* Rare: spelled by their bytes, never a boundary (0). */
	EXPECT(c.train[0].words[2] == 0);
	EXPECT(c.train[0].spellings[2] == spelled(c, "cat"));
	EXPECT(c.train[0].spellings[0] == spelled(c, "The"));
	EXPECT(c.train[2].spellings[2] == spelled(c, "1/2"));
	/* "dog" is seen 3 times in training and 7 in test: still rare. */
	EXPECT(c.test[0].words[0] == 0 &&
	       c.test[0].spellings[0] == spelled(c, "dog"));
	EXPECT(c.test[0].words[8] == the && c.test[0].spellings[8].empty());
	/* Chars: boundary, unseen, then the training words' bytes in byte
	 * order; 'q' is in no training word. */
	EXPECT(c.chars.size() > 2 && c.chars[2] == "'");
	EXPECT(id_of(c.chars, "q") == -1);
	for (std::size_t k = 3; k < c.chars.size(); k++)
		EXPECT(c.chars[k - 1] < c.chars[k] && c.chars[k].size() == 1);
	int z = id_of(c.chars, "z");
	EXPECT(z >= 2);
	EXPECT((c.test[0].spellings[7] == std::vector<int>{z, 1}));
	for (const auto &s : c.train)
		EXPECT(s.words.size() == s.tags.size() &&
		       s.words.size() == s.spellings.size());
	EXPECT(brown::rare_share(c.test) == 0.9);
}

/* load must throw E naming file, with what in its message, once
 * change has been made to the good corpus. */
template <typename E>
void refuses(void (*change)(const temp_dir &), const std::string &file,
	     const char *what)
{
	temp_dir d;
	write_corpus(d);
	change(d);
	try {
		EXPECT_THROWS(E, brown::load(d.path),
			      (d.path + "/" + file).c_str(), what);
	} catch (check_failed &f) {
		f.what += std::string(" (the case of \"") + what + "\")";
		throw;
	}
}

TEST(load_refusals)
{
	refuses<brown::missing>(
		[](const temp_dir &d) { fs::remove(d.path + "/t03"); }, "t03",
		"fetch-brown.sh");
	refuses<brown::missing>(
		[](const temp_dir &d) { fs::remove(d.path + "/cats.txt"); },
		"cats.txt", "fetch-brown.sh");
	refuses<std::runtime_error>(
		[](const temp_dir &d) { d.write("t02", "\tthe/at dog\n"); },
		"t02:1", "\"dog\" is not word/tag");
	refuses<std::runtime_error>(
		[](const temp_dir &d) { d.write("t10", "\n\ta/at /at\n"); },
		"t10:2", "\"/at\" is not word/tag");
	refuses<std::runtime_error>(
		[](const temp_dir &d) { d.write("t10", "\tdog/\n"); }, "t10:1",
		"\"dog/\" is not word/tag");
	refuses<std::runtime_error>(
		[](const temp_dir &d) { d.write("t11", "\n \t\n"); }, "t11",
		"no sentence");
	refuses<std::runtime_error>(
		[](const temp_dir &d) { d.write("t08", ""); }, "t08",
		"no sentence");
	refuses<std::runtime_error>(
		[](const temp_dir &d) {
			d.write("cats.txt", "t01 a\nt01 b\n");
		},
		"cats.txt", "names t01 twice");
	refuses<std::runtime_error>(
		[](const temp_dir &d) { d.write("cats.txt", "../x news\n"); },
		"cats.txt:1", "not a text's name");
	refuses<std::runtime_error>(
		[](const temp_dir &d) { d.write("cats.txt", "\n"); },
		"cats.txt", "names no text");
}

/* ---------------------------------------------------------- setup.hpp */

tagger::setup small_setup()
{
	tagger::setup s;
	s.epochs = 3;
	s.batch = 16;
	s.subset = 4;
	s.chars = false;
	s.seed = 0xfedcba9876543210u;
	s.lr = {0.1f, 0.1f / 3, 1e-7f};
	s.n_words = 7;
	s.n_chars = 5;
	s.n_tags = 3;
	s.weights.resize(tagger::n_weights(7, 5, 3));
	for (std::size_t i = 0; i < s.weights.size(); i++)
		s.weights[i] = 1.0f / static_cast<float>(i + 3) -
			       static_cast<float>(i % 7);
	s.order = {3, 1, 0, 2, 0, 1, 2, 3, 2, 2, 1, 0};
	return s;
}

TEST(shapes_table)
{
	std::vector<tagger::shape> p = tagger::shapes(7, 5, 3);
	EXPECT(p.size() == tagger::dims::params);
	const char *names[] = {"word_embed", "char_embed", "char_fwd_w",
			       "char_fwd_b", "char_bwd_w", "char_bwd_b",
			       "word_fwd_w", "word_fwd_b", "word_bwd_w",
			       "word_bwd_b", "mlp_w",	   "mlp_b",
			       "out_w",	     "out_b"};
	int sizes[][2] = {{7, 128},   {5, 20},	{256, 84},  {1, 256},
			  {256, 84},  {1, 256}, {200, 178}, {1, 200},
			  {200, 178}, {1, 200}, {32, 100},  {1, 32},
			  {3, 32},    {1, 3}};
	std::size_t n = 0;
	for (std::size_t k = 0; k < p.size(); k++) {
		EXPECT(std::string(p[k].name) == names[k]);
		EXPECT(p[k].rows == sizes[k][0] && p[k].cols == sizes[k][1]);
		n += static_cast<std::size_t>(sizes[k][0] * sizes[k][1]);
	}
	EXPECT(tagger::n_weights(7, 5, 3) == n);
}

TEST(setup_round_trip)
{
	temp_dir d;
	tagger::setup s = small_setup();
	tagger::write_setup(d.path + "/run", s);
	tagger::setup r = tagger::read_setup(d.path + "/run");
	EXPECT(r.epochs == 3 && r.batch == 16 && r.subset == 4 && !r.chars);
	EXPECT(r.seed == s.seed);
	EXPECT(r.lr == s.lr && r.weights == s.weights && r.order == s.order);
	EXPECT(r.n_words == 7 && r.n_chars == 5 && r.n_tags == 3);
	s.chars = true;
	s.subset = 0; /* all the training sentences: 4 of them */
	tagger::write_setup(d.path, s);
	r = tagger::read_setup(d.path);
	EXPECT(r.chars && r.subset == 0 && r.order == s.order);
}

/* read_setup must throw naming file and what, after change to a good
 * setup's folder. */
void refused(void (*change)(const std::string &), const char *file,
	     const char *what)
{
	temp_dir d;
	tagger::write_setup(d.path, small_setup());
	change(d.path);
	try {
		EXPECT_THROWS(std::runtime_error, tagger::read_setup(d.path),
			      (d.path + "/" + file).c_str(), what);
	} catch (check_failed &f) {
		f.what += std::string(" (the case of \"") + what + "\")";
		throw;
	}
}

/* Replaces the first from in dir/setup.txt by to. */
void edit(const std::string &dir, const std::string &from,
	  const std::string &to)
{
	std::ifstream in(dir + "/setup.txt");
	std::string text((std::istreambuf_iterator<char>(in)),
			 std::istreambuf_iterator<char>());
	std::size_t at = text.find(from);
	if (at == std::string::npos)
		throw std::runtime_error("no " + from + " in setup.txt");
	text.replace(at, from.size(), to);
	std::ofstream(dir + "/setup.txt") << text;
}

TEST(setup_refusals)
{
	refused([](const std::string &dir) { fs::remove(dir + "/setup.txt"); },
		"setup.txt", "cannot open");
	refused(
		[](const std::string &dir) {
			edit(dir, "tagger-setup 1", "langid-setup 1");
		},
		"setup.txt", "expected \"tagger-setup\"");
	refused(
		[](const std::string &dir) {
			edit(dir, "tagger-setup 1", "tagger-setup 2");
		},
		"setup.txt", "not version 1");
	refused(
		[](const std::string &dir) {
			edit(dir, " 128 20 64 50 32", " 128 20 64 64 32");
		},
		"setup.txt", "not a 128-20-64-50-32 model");
	refused(
		[](const std::string &dir) {
			edit(dir, "chars off", "chars 0");
		},
		"setup.txt", "chars not on|off");
	refused(
		[](const std::string &dir) {
			edit(dir, "params word_embed 7", "params word_embed 8");
		},
		"setup.txt", "parameter 1 is not word_embed");
	refused(
		[](const std::string &dir) {
			fs::resize_file(dir + "/weights.f32",
					fs::file_size(dir + "/weights.f32") -
						4);
		},
		"weights.f32", "not the parameters' size");
	refused(
		[](const std::string &dir) {
			std::ofstream(dir + "/weights.f32",
				      std::ios::binary | std::ios::app)
				<< "1234";
		},
		"weights.f32", "not the parameters' size");
	refused([](const std::string &dir) { fs::remove(dir + "/order.i32"); },
		"order.i32", "cannot open");
	refused(
		[](const std::string &dir) {
			fs::resize_file(dir + "/order.i32", 11 * 4);
		},
		"order.i32", "not E orders of 32-bit ints");
	refused(
		[](const std::string &dir) {
			std::ofstream(dir + "/order.i32", std::ios::binary |
								  std::ios::in |
								  std::ios::out)
				.write("\x04\0\0\0", 4); // 4 of 0 .. 3
		},
		"order.i32", "out of range");
	refused(
		[](const std::string &dir) {
			edit(dir, "subset 4", "subset 5");
		},
		"order.i32", "not as long as the subset");
}

TEST(write_refusals)
{
	temp_dir d;
	tagger::setup s = small_setup();
	s.lr.pop_back();
	EXPECT_THROWS(std::runtime_error, tagger::write_setup(d.path, s),
		      "not a learning rate per epoch");
	s = small_setup();
	s.weights.pop_back();
	EXPECT_THROWS(std::runtime_error, tagger::write_setup(d.path, s),
		      "not the parameters' size");
	s = small_setup();
	s.order.pop_back();
	EXPECT_THROWS(std::runtime_error, tagger::write_setup(d.path, s),
		      "not E orders of the same length");
	EXPECT(!fs::exists(d.path + "/setup.txt"));
	d.write("file", "not a folder");
	EXPECT_THROWS(std::runtime_error,
		      tagger::write_setup(d.path + "/file/x", small_setup()),
		      "cannot write the setup");
}

} // namespace

int main()
{
	int passed = 0, failed = 0;
	for (const test_case &t : all_tests()) {
		std::string why;
		try {
			t.run();
		} catch (const check_failed &f) {
			why = f.what;
		} catch (const std::exception &e) {
			why = std::string("threw: ") + e.what();
		}
		if (why.empty()) {
			std::printf("ok %s\n", t.name);
			passed++;
		} else {
			std::printf("FAILED %s: %s\n", t.name, why.c_str());
			failed++;
		}
	}
	std::printf("tagger-data: %d passed, %d failed\n", passed, failed);
	std::printf(
		"[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | "
		"Crashing: 0\n",
		passed + failed, passed, failed);
	return failed == 0 ? 0 : 1;
}
