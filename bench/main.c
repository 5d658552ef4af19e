/*
 * adg-bench: contention benchmarks across thread counts, for libadg, the
 * reference design (seed) and a per-thread floor, measured side by side in
 * one run on one machine.
 *
 *   adg-bench [options]               the sweep: table, CSV, JSON, plot
 *   adg-bench --callgrind [options]   instructions per node and per step
 *
 * This file only runs the parts in order; driver.h says what each does.
 */
#include "driver.h"

#include <stdlib.h>

/* Indexed by enum impl_id. */
const bench_impl *const impls[N_IMPLS] = {
	[IMPL_ADG] = &bench_adg,
	[IMPL_SEED] = &bench_seed,
	[IMPL_FLOOR] = &bench_floor,
};

int main(int argc, char **argv)
{
	struct options o;
	if (!parse_options(argc, argv, &o)) {
		usage(stderr);
		return 2;
	}
	bench_adg_heap_slabs = o.heap_slabs;
	if (o.count_child)
		return count_child(&o);
	if (o.callgrind)
		return callgrind(&o);

	struct results r;
	print_heading(&o);
	measure(&o, &r);
	print_report(&o, &r);
	char dir[1024];
	int status = write_results(&o, &r, dir, sizeof dir);
	if (status == 0 && o.plot)
		plot(&o, &r, dir);
	free(r.cells);
	return status;
}
