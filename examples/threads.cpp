/* libadg with threads, in C++ (examples/threads.c with adg.hpp): N threads
 * share parameter leaves, each builds its own graph per step (a
 * data-parallel trainer's pattern), runs backward on it, and the caller sums
 * the gradients the threads got. The parameters' leaves couple nothing: each
 * thread's graph stays its own.
 *
 * Per step a thread computes loss = (w0*x0 + w1*x1 + w2*x2 + w3*x3)^2 for
 * its own x, so d loss / d wi = 2 * (w . x) * xi; the program checks the
 * summed gradients against that. Usage: threads-cpp [N] (default 4). */
#include <adg.hpp>

#include <array>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace
{

constexpr std::size_t params = 4;
constexpr int steps = 1000;
constexpr std::array<double, params> w_value = {0.5, -1.0, 0.25, 2.0};

struct worker {
	std::array<double, params> grad_sum{}; /* over this thread's steps */
	std::array<double, params> want{};     /* the same sums, by hand */
	std::string error; /* what stopped the thread, if anything */
};

/* y = a * b: the step keeps the forward values it needs in its captures. */
adg::node mul(adg::registry &reg, const adg::node &a, double av,
	      const adg::node &b, double bv)
{
	return adg::op(
		reg, {a, b},
		[av, bv](adg::step_call<double> &c) {
			double g = c.grad_or(0.0);
			c.give(0, g * bv);
			c.give(1, g * av);
		},
		"mul");
}

void one_step(adg::registry &reg, const std::array<adg::node, params> &w,
	      worker &me, std::minstd_rand &rng)
{
	std::array<double, params> x{};
	double dot = 0;
	std::array<adg::node, params> xs, terms;
	for (std::size_t i = 0; i < params; i++) {
		x[i] = static_cast<double>(rng() % 7) - 3;
		dot += w_value[i] * x[i];
		xs[i] = adg::leaf(reg);
		terms[i] = mul(reg, w[i], w_value[i], xs[i], x[i]);
	}
	adg::node s = adg::op(
		reg, {terms[0], terms[1], terms[2], terms[3]},
		[](adg::step_call<double> &c) {
			double g = c.grad_or(0.0);
			for (std::size_t i = 0; i < c.n_parents(); i++)
				c.give(i, g);
		},
		"sum");
	adg::node loss = mul(reg, s, dot, s, dot); /* dot^2 */
	adg::gradients<double> grads = adg::backward(loss, 1.0);
	for (std::size_t i = 0; i < params; i++) {
		me.grad_sum[i] += grads.get(w[i]);
		me.want[i] += 2 * dot * x[i];
	}
	/* The handles go as the scope ends, in any order: what is
	 * unreachable is freed. */
}

void run(adg::registry &reg, const std::array<adg::node, params> &w, worker &me,
	 unsigned seed)
{
	std::minstd_rand rng(seed);
	try {
		for (int i = 0; i < steps; i++)
			one_step(reg, w, me, rng);
	} catch (const std::exception &e) {
		me.error = e.what();
	}
}

} // namespace

int main(int argc, char **argv)
{
	long arg = argc > 1 ? std::atol(argv[1]) : 4;
	if (arg < 1 || arg > 256) {
		std::fprintf(stderr, "usage: threads-cpp [1..256]\n");
		return 2;
	}
	auto n = static_cast<unsigned>(arg);
	try {
		adg::registry reg; /* first: it outlives every node */
		std::array<adg::node, params> w;
		for (adg::node &p : w)
			p = adg::leaf(reg);

		std::vector<worker> workers(n);
		std::vector<std::thread> threads;
		for (unsigned t = 0; t < n; t++)
			threads.emplace_back(run, std::ref(reg), std::cref(w),
					     std::ref(workers[t]), 1234u + t);
		for (std::thread &t : threads)
			t.join();

		int failed = 0;
		std::array<double, params> total{}, want{};
		for (unsigned t = 0; t < n; t++) {
			if (!workers[t].error.empty()) {
				std::fprintf(stderr, "thread %u: %s\n", t,
					     workers[t].error.c_str());
				failed = 1;
			}
			for (std::size_t i = 0; i < params; i++) {
				total[i] += workers[t].grad_sum[i];
				want[i] += workers[t].want[i];
			}
		}
		for (std::size_t i = 0; i < params; i++) {
			std::printf("d loss / d w%zu summed over %u threads x "
				    "%d steps: %g\n",
				    i, n, steps, total[i]);
			if (total[i] != want[i]) {
				std::fprintf(stderr, "w%zu: got %g, want %g\n",
					     i, total[i], want[i]);
				failed = 1;
			}
		}
		/* Every step's graph is gone; only the parameters remain. */
		adg_stats st = reg.stats();
		std::printf("live nodes %llu, live graphs %llu\n",
			    static_cast<unsigned long long>(st.live_nodes),
			    static_cast<unsigned long long>(st.live_graphs));
		if (st.live_nodes != params || st.live_graphs != 0)
			failed = 1;
		w = {};	     /* drop the parameters */
		reg.close(); /* throws ADG_EBUSY if a node were left */
		return failed;
	} catch (const std::exception &e) {
		std::fprintf(stderr, "threads-cpp: %s\n", e.what());
		return 1;
	}
}
