/* What the setups the C++ trainers export for bench/compare/ share
 * (langid's words.hpp, the tagger's setup.hpp): the words of setup.txt
 * that say how a run trains,
 *     epochs E batch B subset S seed X
 *     lr E floats                    each epoch's learning rate
 * written and read the same way by both, and the reading of a word that
 * must be there. No libadg here. */
#ifndef EXAMPLES_SETUP_TEXT_HPP
#define EXAMPLES_SETUP_TEXT_HPP

#include <cstdint>
#include <istream>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace setup_text
{

/* How a run trains; each trainer's setup adds its model's sizes, initial
 * weights and orders. */
struct run {
	int epochs = 0, batch = 0, subset = 0;
	std::uint64_t seed = 0;
	std::vector<float> lr; /* one a epoch */
};

/* Reads the next word of text; throws std::runtime_error "where:
 * expected ..." unless it is word. */
inline void expect(std::istream &text, const std::string &where,
		   const char *word)
{
	std::string got;
	if (!(text >> got) || got != word)
		throw std::runtime_error(where + ": expected \"" + word +
					 "\", read \"" + got + "\"");
}

/* Writes r's two lines, without the last line's end; floats as text's
 * precision says (9 significant digits read back to the same float). */
inline void write_run(std::ostream &text, const run &r)
{
	text << "epochs " << r.epochs << " batch " << r.batch << " subset "
	     << r.subset << " seed " << r.seed << "\nlr";
	for (float lr : r.lr)
		text << ' ' << lr;
}

/* Reads what write_run wrote into r; throws std::runtime_error naming
 * where and what is wrong. */
inline void read_run(std::istream &text, const std::string &where, run &r)
{
	expect(text, where, "epochs");
	text >> r.epochs;
	expect(text, where, "batch");
	text >> r.batch;
	expect(text, where, "subset");
	text >> r.subset;
	expect(text, where, "seed");
	text >> r.seed;
	if (!text || r.epochs < 1 || r.epochs > 1 << 20 || r.batch < 1 ||
	    r.subset < 0)
		throw std::runtime_error(where +
					 ": bad epochs, batch, subset or seed");
	expect(text, where, "lr");
	r.lr.resize(static_cast<std::size_t>(r.epochs));
	for (float &lr : r.lr)
		text >> lr;
	if (!text)
		throw std::runtime_error(where + ": not E learning rates");
}

} // namespace setup_text

#endif /* EXAMPLES_SETUP_TEXT_HPP */
