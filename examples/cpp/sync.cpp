/* Synchronous data-parallel training on T threads through the reducer
 * (adg::reducer, <adg/reducer.hpp>): the perceptron of mlp.hpp, each
 * batch cut into work units of a fixed number of samples, whichever
 * thread is free taking the next, recording and running backward the
 * graph of that unit; the reducer sums each weight's unit gradients in a
 * fixed tree over unit indices and takes the SGD step once the round is
 * done. The sums depend on the units alone, not on which thread computed
 * which, so a run gives the same bits at every T, which it checks: T = 1,
 * 2, 3, 4 and 8 give the bits of the same tree folded by hand on one
 * thread. Without units (one share per thread, summed in thread order)
 * the bits are those of a given T; T = 1 is the plain trainer's. Usage:
 * sync-cpp (exits 1 on a failed check). */
#include "mlp.hpp"

#include <cstdio>
#include <exception>
#include <optional>
#include <thread>

namespace
{

using namespace mlp;

constexpr int steps = 10;
constexpr double rate = 0.5;
/* 9 units, of 12 samples but the last of 4: not a power of two, so the
 * tree has holes. */
constexpr std::size_t unit_samples = 12,
		      n_units = (n_samples + unit_samples - 1) / unit_samples;

/* The plain trainer: the whole batch on this thread, the step from the
 * backward's gradients. */
std::uint64_t train_plain(const vec &x)
{
	adg::registry reg; /* first: it outlives every node */
	std::mt19937 rng(31);
	model m = make_model(reg, rng);
	for (int step = 0; step < steps; step++) {
		double loss = 0;
		adg::gradients<vec> g = adg::backward<vec>(
			forward(reg, m, x, 0, n_samples, &loss));
		for (param *p : {&m.w1, &m.b1, &m.w2, &m.b2})
			sgd(p->value, g.get(p->leaf), rate);
	}
	return fingerprint(m);
}

/* Samples [lo, hi) of x. */
vec rows(const vec &x, std::size_t lo, std::size_t hi)
{
	return vec(x.begin() + static_cast<long>(lo * n_in),
		   x.begin() + static_cast<long>(hi * n_in));
}

/* The reducer's tree, by hand: the sum of units [lo, lo + size) of
 * grads (size a power of two; a unit past the last is none), the right
 * half's sum added into the left half's. */
std::optional<vec> fold(std::vector<vec> &grads, std::size_t lo,
			std::size_t size)
{
	if (size == 1)
		return lo < grads.size() ? std::optional<vec>(grads[lo])
					 : std::nullopt;
	std::optional<vec> left = fold(grads, lo, size / 2),
			   right = fold(grads, lo + size / 2, size / 2);
	if (!left || !right)
		return left ? left : right;
	*left += *right;
	return left;
}

/* The units on this thread, a backward each, each weight's gradients
 * folded by hand in the reducer's tree: what every T must give. */
std::uint64_t train_units_by_hand(const vec &x)
{
	adg::registry reg;
	std::mt19937 rng(31);
	model m = make_model(reg, rng);
	std::size_t leaves = 1;
	while (leaves < n_units)
		leaves *= 2;
	for (int step = 0; step < steps; step++) {
		param *params[] = {&m.w1, &m.b1, &m.w2, &m.b2};
		std::vector<vec> grads[4];
		for (std::size_t u = 0; u < n_units; u++) {
			std::size_t lo = u * unit_samples,
				    hi = std::min(lo + unit_samples, n_samples);
			double loss = 0;
			adg::gradients<vec> g = adg::backward<vec>(forward(
				reg, m, rows(x, lo, hi), lo, n_samples, &loss));
			for (int i = 0; i < 4; i++)
				grads[i].push_back(g.get(params[i]->leaf));
		}
		for (int i = 0; i < 4; i++)
			sgd(params[i]->value, *fold(grads[i], 0, leaves), rate);
	}
	return fingerprint(m);
}

/* The same training on t threads through the reducer: with units, thread
 * p takes units as they come; without, samples [lo, hi) of every batch,
 * its share. */
std::uint64_t train_sync(const vec &x, int t, bool units)
{
	adg::registry reg;
	std::mt19937 rng(31);
	model m = make_model(reg, rng);
	param *params[] = {&m.w1, &m.b1, &m.w2, &m.b2};
	adg::reducer_options<vec> o;
	o.units = units ? n_units : 0;
	/* Once per weight and step, at the round's end (all or nothing): no
	 * thread reads a weight until every thread has ended the round. */
	adg::reducer<vec> red(
		t, {m.w1.leaf, m.b1.leaf, m.w2.leaf, m.b2.leaf},
		[&](const adg::reduction<vec> &r) {
			if (r.sum != nullptr)
				sgd(params[r.param]->value, *r.sum, rate);
		},
		std::move(o));
	auto backward = [&](std::size_t p, std::size_t lo, std::size_t hi) {
		double loss = 0;
		adg::backward<vec>(
			forward(reg, m, rows(x, lo, hi), lo, n_samples, &loss),
			red.hook(p));
	};
	std::vector<std::thread> threads;
	for (int p = 0; p < t; p++)
		threads.emplace_back([&, p] {
			for (int step = 0; step < steps; step++) {
				if (units) {
					red.round(p, [&](std::size_t u) {
						std::size_t lo =
							u * unit_samples;
						backward(
							p, lo,
							std::min(
								lo + unit_samples,
								n_samples));
					});
					continue;
				}
				red.round(p, [&] {
					backward(p, n_samples * p / t,
						 n_samples * (p + 1) / t);
				});
			}
		});
	for (std::thread &th : threads)
		th.join();
	return fingerprint(m);
}

int run()
{
	std::mt19937 rng(29);
	const vec x = make_data(rng);
	int failed = 0;
	std::uint64_t by_hand = train_units_by_hand(x);
	std::printf("units folded by hand %016llx\n",
		    (unsigned long long)by_hand);
	for (int t : {1, 2, 3, 4, 8}) {
		std::uint64_t h = train_sync(x, t, true);
		std::printf("units, T = %d: %016llx\n", t,
			    (unsigned long long)h);
		failed |= h != by_hand;
	}
	std::uint64_t plain = train_plain(x), one = train_sync(x, 1, false);
	std::printf("plain %016llx, a share per thread, T = 1 %016llx\n",
		    (unsigned long long)plain, (unsigned long long)one);
	failed |= plain != one;
	std::uint64_t a = train_sync(x, 4, false), b = train_sync(x, 4, false);
	std::printf("a share per thread, T = 4: %016llx, again %016llx\n",
		    (unsigned long long)a, (unsigned long long)b);
	failed |= a != b;
	return failed;
}

} // namespace

int main()
{
	try {
		int failed = run();
		std::puts(failed ? "sync-cpp: FAILED" : "sync-cpp: ok");
		return failed;
	} catch (const std::exception &e) {
		std::fprintf(stderr, "sync-cpp: %s\n", e.what());
		return 1;
	}
}
