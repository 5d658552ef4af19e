/*
 * The cpp-shared workload's interface, C and C++ alike (bench.h is C
 * only): gather.cpp measures, measure.c calls it.
 */
#ifndef ADG_BENCH_GATHER_H
#define ADG_BENCH_GATHER_H

#ifdef __cplusplus
extern "C" {
#endif

/* What the two threads' ops take as their parameter parent, and how they
 * gather their parents. */
enum bench_gather_form {
	/* One parameter per thread, made on that thread; gathered borrowed
	 * (std::vector<adg::node_ref>): the base, nothing shared. */
	BENCH_GATHER_SEPARATE,
	/* One parameter for both; gathered borrowed: the guide's recipe. */
	BENCH_GATHER_SHARED,
	/* One parameter for both; gathered as copied handles
	 * (std::vector<adg::node>): each copy writes its count. */
	BENCH_GATHER_COPIED,
	BENCH_GATHER_FORMS
};

/* Ops of one thread's chain, per graph. */
#define BENCH_GATHER_OPS 1000

/* Two threads, started together, each recording chains of n ops through
 * adg.hpp, y = op(reg, parents, lambda) with parents {y, the parameter}
 * gathered into a vector refilled for each op, then running each chain's
 * backward and dropping it, for ms milliseconds, on a fresh registry.
 * Returns the nodes both registered per second, over the interval from
 * the first one's start to the last one's stop; negative on failure. */
double bench_gather_cpp_nodes(int form, int n, int ms);

#ifdef __cplusplus
}
#endif

#endif
