/*
 * adg/exact.hpp: libadg's exact sums (adg/exact.h) in C++, an annex of
 * adg.hpp, which includes it: arrays of float sums whose bits depend on
 * their terms alone, not on their order, their grouping, or the thread
 * that added them.
 *
 *     adg::exact_sum mine(n), theirs(n);
 *     mine.add(gradient);       // any number of terms, in any order
 *     mine += theirs;           // another thread's, merged exactly
 *     std::vector<float> g = mine.rounded(); // each sum rounded once
 *
 * With the reducer (adg/reducer.hpp), for a trainer whose work is not
 * fixed units (samples taken by whichever thread is free): the gradient
 * type is adg::exact_ref, which points to an accumulator its participant
 * keeps, one per participant and parameter. Not an exact_sum, which the
 * reducer would box and drop each round; an exact_sum * would need an
 * add of its own, where exact_ref's += merges, so the default add
 * serves. A parameter in slices merges its slice's range in add_slice,
 * and apply rounds that range. Each participant clears its accumulators
 * once its end returns, before adding the next round's terms:
 *
 *     adg::reducer_options<adg::exact_ref> o;
 *     o.slices = {4, 1};
 *     o.add_slice = [](adg::exact_ref &sum, const adg::exact_ref &v,
 *                      std::size_t k, std::size_t n_slices) {
 *             std::size_t n = sum.sum->size(), first = n * k / n_slices;
 *             sum.sum->merge(*v.sum, first, n * (k + 1) / n_slices - first);
 *     };
 *     adg::reducer<adg::exact_ref> red(T, params, [&](const auto &r) {
 *             // round r.sum->sum's sums of slice r.slice, step the weights
 *     }, o);
 *     // participant p's thread, every round:
 *     mine[p][k].add(g);                          // each sample it takes
 *     red.give(p, params[k], adg::exact_ref{&mine[p][k]}); // each k
 *     red.end(p);
 *     mine[p][k].clear();                         // each k
 */
#ifndef ADG_EXACT_HPP
#define ADG_EXACT_HPP

#include "../adg.hpp" /* beside this one, whatever the include path */

#include <vector>

namespace adg
{

/* n sums of float terms, each kept exactly (adg_exact: 72 bytes a sum),
 * rounded once to the nearest float, ties to even. Move-only, as
 * adg::pool: a default-made or moved-from exact_sum is empty (false as a
 * bool), and every call on one but raw(), assignment and destruction
 * throws adg::error ADG_EINVAL. Threads: one thread at a time adds to or
 * clears an accumulator; merges into disjoint ranges of one, and rounds
 * of it, may run at once on several threads while no thread adds to or
 * clears the accumulators they read. */
class exact_sum
{
public:
	/* An empty exact_sum. */
	exact_sum() noexcept = default;
	/* n sums, each 0 (adg_exact_new). Throws adg::error ADG_EINVAL for
	 * n 0 or too large, ADG_ENOMEM. */
	explicit exact_sum(std::size_t n);
	exact_sum(exact_sum &&other) noexcept;
	exact_sum &operator=(exact_sum &&other) noexcept;
	exact_sum(const exact_sum &) = delete;
	exact_sum &operator=(const exact_sum &) = delete;
	/* Frees the sums (adg_exact_free). */
	~exact_sum();

	/* The number of sums (adg_exact_length). */
	std::size_t size() const;
	/* Sets every sum to 0 (adg_exact_clear). */
	void clear();
	/* Adds values[i] to sum first + i, for i < count, exactly
	 * (adg_exact_add). Throws adg::error ADG_EINVAL for a range past
	 * the sums, ADG_EVALUE for a value infinite or NaN (nothing is
	 * added; the reason names the first such values[i]). */
	void add(const float *values, std::size_t count, std::size_t first = 0);
	/* Adds values[i] to sum i, as above. */
	void add(const std::vector<float> &values);
	/* Adds other's sums first to first + count - 1 to the same sums of
	 * this one, exactly; other is only read (adg_exact_merge). Throws
	 * adg::error ADG_EINVAL for other empty or this one, lengths that
	 * differ, a range past the sums. */
	void merge(const exact_sum &other, std::size_t first,
		   std::size_t count);
	/* Merges all of other's sums, as merge does. */
	exact_sum &operator+=(const exact_sum &other);
	/* Writes sums first to first + count - 1, each rounded once to the
	 * nearest float (ties to even; +0 for a sum of 0, an infinity past
	 * FLT_MAX), to out[0] to out[count - 1] (adg_exact_round). Throws
	 * adg::error ADG_EINVAL for a range past the sums. */
	void round(float *out, std::size_t count, std::size_t first = 0) const;
	/* Every sum, rounded as above. */
	std::vector<float> rounded() const;

	/* The C handle, for calls this layer does not wrap; null if empty. */
	adg_exact *raw() const noexcept;
	explicit operator bool() const noexcept;

private:
	/* raw_, or adg::error ADG_EINVAL naming what when empty. */
	adg_exact *live(const char *what) const;
	adg_exact *raw_ = nullptr;
};

/* A reducer's gradient of exact sums (reducer<exact_ref>): a participant's
 * own accumulator, borrowed. The reducer drops the reference at the round's
 * end, never the accumulator, which its participant clears once its end
 * returns. Boxed, not inline, so that a parameter may be in slices. */
struct exact_ref {
	exact_sum *sum = nullptr;
	/* *sum += *other.sum: the reducer's default add. Throws adg::error
	 * ADG_EINVAL for a null sum, and as exact_sum's += does. */
	exact_ref &operator+=(const exact_ref &other);
};

/* -------------------------------------------------------- implementation */

static_assert(!detail::is_inline_v<exact_ref>,
	      "an exact_ref is boxed: a reducer's slices need it");

inline exact_sum::exact_sum(std::size_t n)
{
	check(adg_exact_new(n, &raw_), "adg_exact_new");
}

inline exact_sum::exact_sum(exact_sum &&other) noexcept : raw_(other.raw_)
{
	other.raw_ = nullptr;
}

inline exact_sum &exact_sum::operator=(exact_sum &&other) noexcept
{
	if (this != &other) {
		exact_sum gone(std::move(*this));
		raw_ = other.raw_;
		other.raw_ = nullptr;
	}
	return *this;
}

inline exact_sum::~exact_sum()
{
	adg_exact_free(raw_); /* NULL: a no-op */
}

inline adg_exact *exact_sum::live(const char *what) const
{
	if (raw_ == nullptr)
		throw error(ADG_EINVAL, std::string(what) +
						": an empty exact_sum "
						"(default-made or moved from)");
	return raw_;
}

inline std::size_t exact_sum::size() const
{
	std::size_t n = 0;
	check(adg_exact_length(live("exact_sum::size"), &n),
	      "adg_exact_length");
	return n;
}

inline void exact_sum::clear()
{
	check(adg_exact_clear(live("exact_sum::clear")), "adg_exact_clear");
}

inline void exact_sum::add(const float *values, std::size_t count,
			   std::size_t first)
{
	check(adg_exact_add(live("exact_sum::add"), first, values, count),
	      "adg_exact_add");
}

inline void exact_sum::add(const std::vector<float> &values)
{
	add(values.data(), values.size(), 0);
}

inline void exact_sum::merge(const exact_sum &other, std::size_t first,
			     std::size_t count)
{
	check(adg_exact_merge(live("exact_sum::merge"), other.raw_, first,
			      count),
	      "adg_exact_merge");
}

inline exact_sum &exact_sum::operator+=(const exact_sum &other)
{
	adg_exact *raw = live("exact_sum::operator+=");
	std::size_t n = 0;
	check(adg_exact_length(raw, &n), "adg_exact_length");
	check(adg_exact_merge(raw, other.raw_, 0, n), "adg_exact_merge");
	return *this;
}

inline void exact_sum::round(float *out, std::size_t count,
			     std::size_t first) const
{
	check(adg_exact_round(live("exact_sum::round"), first, out, count),
	      "adg_exact_round");
}

inline std::vector<float> exact_sum::rounded() const
{
	std::vector<float> out(size());
	round(out.data(), out.size(), 0);
	return out;
}

inline adg_exact *exact_sum::raw() const noexcept
{
	return raw_;
}

inline exact_sum::operator bool() const noexcept
{
	return raw_ != nullptr;
}

inline exact_ref &exact_ref::operator+=(const exact_ref &other)
{
	if (sum == nullptr || other.sum == nullptr)
		throw error(ADG_EINVAL, "exact_ref::operator+=: a null sum");
	*sum += *other.sum;
	return *this;
}

} // namespace adg

#endif /* ADG_EXACT_HPP */
