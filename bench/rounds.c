/*
 * The rounds workload (adg only): T participants of one gradient reducer
 * (include/adg/reducer.h) run rounds that carry next to nothing, one
 * double per participant to one parameter, so that a round's cost is
 * the reducer's own: the climb, the apply and, above all, the barrier.
 * ops counts rounds (participant 0's), so the rate is rounds per second
 * whatever T.
 *
 * Participants must agree on the round they stop after: participant 0
 * reads the stop flag before it ends a round and writes what it read in
 * a word of that round's parity; every participant reads it after the
 * round's end (the barrier orders the write before), and the next write
 * of the same word, two rounds on, comes after every participant has
 * ended the round between, and read it.
 */
#include "bench.h"

#include "adg/reducer.h"

#include <stdio.h>
#include <stdlib.h>

/* A participant's contribution, on a line of its own. */
struct rounds_value {
	_Alignas(64) double v;
};

struct rounds {
	adg_reducer *red;
	uint64_t id;
	double applied; /* the last round's sum, written by its apply */
	atomic_int stop_after[2];
	struct rounds_value *values;
};

static int rounds_add(void **sum, const void *value, void *ctx)
{
	(void)ctx;
	*(double *)*sum += *(const double *)value;
	return 0;
}

static int rounds_apply(const adg_reduction *red, void *ctx)
{
	struct rounds *s = ctx;
	s->applied = red->sum != NULL ? *(const double *)red->sum : 0;
	return 0;
}

static void rounds_release(void *value, size_t participant, void *ctx)
{
	(void)value, (void)participant, (void)ctx;
}

void *bench_rounds_setup(const bench_impl *impl, void *reg,
			 const bench_params *p, int threads)
{
	(void)impl, (void)reg, (void)p;
	struct rounds *s = calloc(1, sizeof *s);
	s->values = aligned_alloc(64, (size_t)threads * sizeof *s->values);
	s->id = 1;
	adg_reducer_options o = {
		.size = sizeof o,
		.n_participants = (size_t)threads,
		.param_ids = &s->id,
		.n_params = 1,
		.ops = {.add = rounds_add,
			.apply = rounds_apply,
			.release = rounds_release,
			.ctx = s},
	};
	if (adg_reducer_new(&o, &s->red) != 0) {
		fprintf(stderr, "rounds: adg_reducer_new failed\n");
		exit(1);
	}
	return s;
}

void bench_rounds_teardown(void *shared)
{
	struct rounds *s = shared;
	adg_reducer_free(s->red);
	free(s->values);
	free(s);
}

void bench_rounds_thread(void *shared, int index, const atomic_int *stop,
			 bench_counts *out)
{
	struct rounds *s = shared;
	size_t p = (size_t)index;
	out->start_ns = bench_now_ns();
	for (uint64_t k = 0;; k++) {
		atomic_int *word = &s->stop_after[k & 1];
		/* Relaxed: the barrier orders it (above). */
		if (index == 0)
			atomic_store_explicit(
				word,
				atomic_load_explicit(stop,
						     memory_order_relaxed),
				memory_order_relaxed);
		s->values[p].v = 1.0;
		if (adg_reducer_give(s->red, p, s->id, &s->values[p].v) != 0 ||
		    adg_reducer_end(s->red, p, 0) != 0) {
			fprintf(stderr, "rounds: a round failed\n");
			exit(1);
		}
		out->ops += index == 0;
		if (atomic_load_explicit(word, memory_order_relaxed))
			return;
	}
}
