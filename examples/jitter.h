/*
 * Random pauses for the trainers' tests. With ADG_EXAMPLE_JITTER_US=N in
 * the environment, each unit of a sync round waits 0 to N microseconds
 * before it starts, at random and differently on every run, so that the
 * tests comparing weights across thread counts see other interleavings
 * than the scheduler's usual ones: which thread takes which unit, and the
 * order units finish in, change. The weights must not. Unset or 0: no
 * pause.
 */
#ifndef ADG_EXAMPLE_JITTER_H
#define ADG_EXAMPLE_JITTER_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static inline void jitter_pause(void)
{
	/* getenv each time: no shared state to initialise across threads,
	 * and a unit's work dwarfs it. */
	const char *max_text = getenv("ADG_EXAMPLE_JITTER_US");
	long max_us = max_text != NULL ? strtol(max_text, NULL, 10) : 0;
	if (max_us <= 0)
		return;
	/* Each thread's own xorshift64*, seeded from the clock and the
	 * thread's address: other pauses on every run. */
	static __thread uint64_t state;
	if (state == 0) {
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		uint64_t seed = (uint64_t)now.tv_nsec << 20;
		seed ^= (uint64_t)now.tv_sec ^ (uintptr_t)&state;
		state = seed | 1; /* never 0, xorshift's fixed point */
	}
	state ^= state >> 12;
	state ^= state << 25;
	state ^= state >> 27;
	uint64_t r = (state * 0x2545F4914F6CDD1DULL) >> 33;
	long us = (long)(r % (uint64_t)(max_us + 1));
	struct timespec pause = {.tv_sec = us / 1000000,
				 .tv_nsec = (us % 1000000) * 1000};
	nanosleep(&pause, NULL);
}

#endif
