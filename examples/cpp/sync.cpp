/* Synchronous data-parallel training on T threads through the reducer
 * (adg::reducer, <adg/reducer.hpp>): the perceptron of mlp.hpp, each
 * batch cut into T shares, each thread recording and running backward the
 * graph of its share, the reducer summing each weight's T gradients in
 * thread order and taking the SGD step once, while the other threads'
 * backward passes go on. Summing in a fixed order makes a run bitwise
 * reproducible for a given T, which it checks: T = 1 through the reducer
 * is the plain one-thread trainer to the last bit, and two runs at T = 2,
 * and at T = 4, give the same bits. Usage: sync-cpp (exits 1 on a failed
 * check). */
#include "mlp.hpp"

#include <cstdio>
#include <exception>
#include <thread>

namespace
{

using namespace mlp;

constexpr int steps = 10;
constexpr double rate = 0.5;

/* The plain trainer: the whole batch on this thread, the step from the
 * backward's gradients. */
std::uint64_t train_plain(const vec &x)
{
	adg::registry reg; /* first: it outlives every node */
	std::mt19937 rng(31);
	model m = make_model(reg, rng);
	for (int step = 0; step < steps; step++) {
		double loss = 0;
		adg::gradients<vec> g = adg::backward(
			forward(reg, m, x, 0, n_samples, &loss), vec{1.0});
		for (param *p : {&m.w1, &m.b1, &m.w2, &m.b2})
			sgd(p->value, g.get(p->leaf), rate);
	}
	return fingerprint(m);
}

/* The same training on t threads: thread p takes samples [lo, hi) of
 * every batch. */
std::uint64_t train_sync(const vec &x, int t)
{
	adg::registry reg;
	std::mt19937 rng(31);
	model m = make_model(reg, rng);
	param *params[] = {&m.w1, &m.b1, &m.w2, &m.b2};
	/* Once per weight and step, on the thread that brought its last
	 * gradient: no other thread reads the weight until every thread
	 * has ended the round. */
	adg::reducer<vec> red(t, {m.w1.leaf, m.b1.leaf, m.w2.leaf, m.b2.leaf},
			      [&](const adg::reduction<vec> &r) {
				      if (r.sum != nullptr)
					      sgd(params[r.param]->value,
						  *r.sum, rate);
			      });
	std::vector<std::thread> threads;
	for (int p = 0; p < t; p++)
		threads.emplace_back([&, p] {
			std::size_t lo = n_samples * p / t,
				    hi = n_samples * (p + 1) / t;
			vec share(x.begin() + lo * n_in, x.begin() + hi * n_in);
			for (int step = 0; step < steps; step++)
				red.round(p, [&] {
					double loss = 0;
					adg::backward(forward(reg, m, share, lo,
							      n_samples, &loss),
						      vec{1.0}, red.hook(p));
				});
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
	std::uint64_t plain = train_plain(x), one = train_sync(x, 1);
	std::printf("plain %016llx, T = 1 %016llx\n", (unsigned long long)plain,
		    (unsigned long long)one);
	failed |= plain != one;
	for (int t : {2, 4}) {
		std::uint64_t a = train_sync(x, t), b = train_sync(x, t);
		std::printf("T = %d: %016llx, again %016llx\n", t,
			    (unsigned long long)a, (unsigned long long)b);
		failed |= a != b;
	}
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
