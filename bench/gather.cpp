/*
 * The cpp-shared workload: does a parameter shared by two threads couple
 * them in adg.hpp? Each thread records chains through adg.hpp as
 * docs/guide.md recommends for parents gathered at run time, a
 * std::vector<adg::node_ref> refilled for each op, whose parents are the
 * running value and a parameter; runs each chain's backward and drops it.
 * The same code over one parameter per thread and over one for both:
 * libadg only reads a leaf parent, so the two should run alike. A third
 * form gathers copied handles (std::vector<adg::node>), the recipe before
 * the borrowed form, whose copies write the shared parameter's count.
 */
#include "gather.h"

#include <adg.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

/* bench.h is C; the one thing wanted from it. */
extern "C" std::uint64_t bench_now_ns(void);

namespace
{

/* One thread's share of a run: what it counted, on its own clock. */
struct gatherer {
	std::uint64_t nodes = 0, start_ns = 0, end_ns = 0;
	bool failed = false;
};

/* The run's start line and stop flag. Relaxed: they order nothing but
 * themselves; each thread's counts reach the main thread through join. */
struct gather_run {
	std::atomic<int> ready{0};
	std::atomic<bool> go{false}, stop{false};
};

/* One chain of n ops over param, Parent the form's vector element
 * (adg::node_ref: borrowed; adg::node: copied handles), then its
 * backward; everything it made is dropped on return. */
template <class Parent>
void gather_chain(adg::registry &reg, const adg::node &param,
		  std::vector<Parent> &parents, int n)
{
	adg::node y = adg::leaf(reg); /* the input: the thread's own */
	double yv = 1.0, wv = 1.0000001;
	for (int k = 0; k < n; k++) {
		parents.clear(); /* keeps its capacity: no allocation */
		parents.push_back(y);
		parents.push_back(param);
		y = adg::op(reg, parents,
			    [a = yv, b = wv](adg::step_call<double> &c) {
				    double g = c.grad_or(0.0);
				    c.give(0, g * b);
				    c.give(1, g * a);
			    });
		yv *= wv;
	}
	parents.clear(); /* a copied form's handles go before the backward */
	adg::backward(y, 1.0);
}

/* One thread's loop until the stop flag: shared, or null for a parameter
 * of its own, made on this thread. */
template <class Parent>
void gather_thread(adg::registry &reg, const adg::node *shared, int n,
		   gather_run &run, gatherer &out)
{
	try {
		adg::node own;
		if (shared == nullptr)
			own = adg::leaf(reg);
		const adg::node &param = shared ? *shared : own;
		std::vector<Parent> parents;
		parents.reserve(2);
		run.ready.fetch_add(1, std::memory_order_relaxed);
		while (!run.go.load(std::memory_order_relaxed))
			std::this_thread::yield();
		out.start_ns = bench_now_ns();
		while (!run.stop.load(std::memory_order_relaxed)) {
			gather_chain(reg, param, parents, n);
			out.nodes += static_cast<std::uint64_t>(n);
		}
		out.end_ns = bench_now_ns();
	} catch (...) {
		out.failed = true;
		run.ready.fetch_add(1, std::memory_order_relaxed);
	}
}

/* Two threads of gather_thread on reg; their nodes per second. */
template <class Parent>
double gather_two(adg::registry &reg, const adg::node *shared, int n, int ms)
{
	gather_run run;
	gatherer counts[2];
	std::thread threads[2];
	for (int i = 0; i < 2; i++)
		threads[i] = std::thread(gather_thread<Parent>, std::ref(reg),
					 shared, n, std::ref(run),
					 std::ref(counts[i]));
	while (run.ready.load(std::memory_order_relaxed) < 2)
		std::this_thread::yield();
	run.go.store(true, std::memory_order_relaxed);
	std::this_thread::sleep_for(std::chrono::milliseconds(ms));
	run.stop.store(true, std::memory_order_relaxed);
	for (std::thread &t : threads)
		t.join();
	if (counts[0].failed || counts[1].failed)
		return -1;
	std::uint64_t start = std::min(counts[0].start_ns, counts[1].start_ns);
	std::uint64_t end = std::max(counts[0].end_ns, counts[1].end_ns);
	double secs = static_cast<double>(end - start) * 1e-9;
	return static_cast<double>(counts[0].nodes + counts[1].nodes) / secs;
}

} // namespace

extern "C" double bench_gather_cpp_nodes(int form, int n, int ms)
{
	try {
		adg::registry reg;
		double rate = -1;
		if (form == BENCH_GATHER_SEPARATE) {
			rate = gather_two<adg::node_ref>(reg, nullptr, n, ms);
		} else {
			adg::node shared = adg::leaf(reg, "shared");
			if (form == BENCH_GATHER_SHARED)
				rate = gather_two<adg::node_ref>(reg, &shared,
								 n, ms);
			else if (form == BENCH_GATHER_COPIED)
				rate = gather_two<adg::node>(reg, &shared, n,
							     ms);
		}
		return rate;
	} catch (...) {
		return -1;
	}
}
