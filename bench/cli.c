/*
 * adg-bench's command line: the defaults, the usage text and the parser.
 *
 * getopt_long accepts any unambiguous prefix of a long option and names
 * the candidates of an ambiguous one in the table's order, so the table's
 * names and order are part of the interface. It sets the switches
 * (--no-idle, --callgrind, ...) itself, through pointers into the options:
 * hence a table per call.
 */
#include "driver.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

void usage(FILE *f)
{
	fprintf(f, "usage: adg-bench [options]\n"
		   "  --workloads=LIST  comma-separated, from:");
	for (int i = 0; i < bench_n_workloads; i++)
		fprintf(f, " %s", bench_workloads[i].name);
	fprintf(f,
		" (default: all)\n"
		"  --threads=LIST    thread counts (default 1,2,4,8,32,128)\n"
		"  --impls=LIST      from: adg seed floor (default: all)\n"
		"  --runs=N          runs per cell, median reported (default "
		"5)\n"
		"  --ms=N            milliseconds per run (default 100)\n"
		"  --chain=K         nodes per chain/tree (default 32)\n"
		"  --leaves=N        leaves per chain (default 4)\n"
		"  --params=P        shared parameters (default 20)\n"
		"  --hidden=H        trainer hidden units (default 8)\n"
		"  --idle-graphs=N   idle graphs for the idle check "
		"(default 100000)\n"
		"  --no-idle         skip the idle-graphs check\n"
		"  --no-checkpoint   skip the checkpoint workload\n"
		"  --out=DIR         results folder (default results)\n"
		"  --no-plot         skip the gnuplot PNG\n"
		"  --callgrind       count instructions per node under "
		"valgrind instead\n"
		"  --iterations=N    chains per callgrind run (default "
		"2000)\n"
		"  --phases          with --callgrind: adg's and floor's "
		"instructions\n"
		"                    per node and per step, split by phase "
		"(docs/bench.md)\n"
		"  --wide-workers=LIST\n"
		"                    worker counts for wide, besides "
		"sequential "
		"(default 1,2;\n"
		"                    1 always runs); cores: 1, 2, 4, ... up to "
		"the cores\n"
		"  --wide-branches=B chains joined at wide's root (default "
		"64)\n"
		"  --wide-chain=L    steps per chain in wide (default 50)\n"
		"  --big-max=N       big's largest graph: 10^3, 10^4, ... up "
		"to N nodes (default\n"
		"                    1000000 when --workloads names big, "
		"100000 when it runs as\n"
		"                    one of all; at most 10000000: some 2 GB)"
		"\n"
		"  --heap-slabs      give adg's registries malloc as their "
		"allocator, so that\n"
		"                    no node slab is mapped for huge pages "
		"(to compare)\n\n");
	for (int i = 0; i < bench_n_workloads; i++)
		fprintf(f, "  %-14s %s\n", bench_workloads[i].name,
			bench_workloads[i].about);
	fprintf(f,
		"\nAlso measured, on one thread: a backward's cost with idle "
		"graphs alive (adg, seed),\nhow early the gradient-ready hook "
		"sees parameters (adg), and the checkpoint\nworkload's peak "
		"live outputs and nodes/s under both strategies (adg).\n");
}

static int parse_list(const char *s, int *out, int max)
{
	int n = 0;
	while (*s && n < max) {
		char *end;
		long v = strtol(s, &end, 10);
		if (end == s || v < 1 || v > MAX_THREADS)
			return -1;
		out[n++] = (int)v;
		s = *end == ',' ? end + 1 : end;
		if (*end != ',' && *end != 0)
			return -1;
	}
	return n;
}

static bool parse_names(const char *s, bool *on, int n,
			const char *(*name)(int))
{
	memset(on, 0, n * sizeof *on);
	char buf[512];
	snprintf(buf, sizeof buf, "%s", s);
	for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
		int i = 0;
		while (i < n && strcmp(name(i), tok) != 0)
			i++;
		if (i == n)
			return false;
		on[i] = true;
	}
	return true;
}

static const char *workload_name(int i)
{
	return bench_workloads[i].name;
}

static const char *impl_name(int i)
{
	return impls[i]->name;
}

/* --wide-workers: a list, or "cores" for 1, 2, 4, ... up to the cores
 * this process may run on. 1 is in it whatever the list says: it is the
 * base of the speedups. Repeats are dropped; the counts are sorted. */
static bool parse_workers(const char *arg, struct options *o)
{
	int list[32], n = 0;
	if (strcmp(arg, "cores") == 0) {
		int cores = available_cores();
		for (int w = 1; w <= cores && w <= WIDE_MAX_WORKERS; w *= 2)
			list[n++] = w;
	} else if ((n = parse_list(arg, list, 32)) <= 0) {
		return false;
	}
	o->wide_workers[0] = 1;
	o->n_wide_workers = 1;
	for (int i = 0; i < n; i++) {
		bool seen = false;
		for (int j = 0; j < o->n_wide_workers; j++)
			seen = seen || o->wide_workers[j] == list[i];
		if (seen)
			continue;
		if (list[i] > WIDE_MAX_WORKERS ||
		    o->n_wide_workers == WIDE_MAX_COUNTS)
			return false;
		int j = o->n_wide_workers++;
		for (; list[i] < o->wide_workers[j - 1]; j--)
			o->wide_workers[j] = o->wide_workers[j - 1];
		o->wide_workers[j] = list[i];
	}
	return true;
}

/* Reads an int option that must be at least least; atoi, as ever. */
static bool at_least(int *field, const char *arg, int least)
{
	*field = atoi(arg);
	return *field >= least;
}

/* Applies one option; false when its value is out of range. */
static bool apply(int c, struct options *o)
{
	switch (c) {
	case 'w':
		o->workloads_named = true;
		return parse_names(optarg, o->workload_on, bench_n_workloads,
				   workload_name);
	case 't':
		o->n_threads = parse_list(optarg, o->threads, 32);
		return o->n_threads > 0;
	case 'i':
		return parse_names(optarg, o->impl_on, N_IMPLS, impl_name);
	case 'r':
		return at_least(&o->runs, optarg, 1) && o->runs <= MAX_RUNS;
	case 'm':
		return at_least(&o->ms, optarg, 1);
	case 'k':
		return at_least(&o->p.chain, optarg, 2);
	case 'l':
		return at_least(&o->p.leaves, optarg, 2);
	case 'p':
		return at_least(&o->p.params, optarg, 1);
	case 'H':
		return at_least(&o->p.trainer_hidden, optarg, 1);
	case 'g':
		return at_least(&o->p.idle_graphs, optarg, 0);
	case 'o':
		o->out_dir = optarg;
		return true;
	case 'n':
		o->iterations = atol(optarg);
		return o->iterations >= 1;
	case 'C':
		o->count_child = optarg;
		return true;
	case 'W':
		return parse_workers(optarg, o);
	case 'B':
		return at_least(&o->p.wide_branches, optarg, 1);
	case 'L':
		return at_least(&o->p.wide_chain, optarg, 1);
	case 'M':
		o->big_max = atol(optarg);
		return o->big_max >= BIG_SMALLEST && o->big_max <= BIG_LARGEST;
	case 'h':
		usage(stdout);
		exit(0);
	case 0: /* a switch, set by getopt_long itself */
		return true;
	default:
		return false;
	}
}

bool parse_options(int argc, char **argv, struct options *o)
{
	static const int default_threads[] = {1, 2, 4, 8, 32, 128};
	*o = (struct options){
		.runs = 5,
		.ms = 100,
		.idle_ms = 300,
		.p = {.chain = 32,
		      .leaves = 4,
		      .params = 20,
		      .idle_graphs = 100000,
		      .trainer_hidden = 8,
		      .wide_branches = 64,
		      .wide_chain = 50},
		.out_dir = "results",
		.plot = true,
		.idle = true,
		.checkpoint = true,
		.iterations = 2000,
		.wide_workers = {1, 2},
		.n_wide_workers = 2,
	};
	for (int i = 0; i < bench_n_workloads; i++)
		o->workload_on[i] = true;
	for (int i = 0; i < N_IMPLS; i++)
		o->impl_on[i] = true;
	memcpy(o->threads, default_threads, sizeof default_threads);
	o->n_threads = 6;
	const struct option longs[] = {
		{"workloads", required_argument, 0, 'w'},
		{"threads", required_argument, 0, 't'},
		{"impls", required_argument, 0, 'i'},
		{"runs", required_argument, 0, 'r'},
		{"ms", required_argument, 0, 'm'},
		{"chain", required_argument, 0, 'k'},
		{"leaves", required_argument, 0, 'l'},
		{"params", required_argument, 0, 'p'},
		{"hidden", required_argument, 0, 'H'},
		{"idle-graphs", required_argument, 0, 'g'},
		{"no-idle", no_argument, &o->idle, 0},
		{"no-checkpoint", no_argument, &o->checkpoint, 0},
		{"out", required_argument, 0, 'o'},
		{"no-plot", no_argument, &o->plot, 0},
		{"heap-slabs", no_argument, &o->heap_slabs, 1},
		{"callgrind", no_argument, &o->callgrind, 1},
		{"phases", no_argument, &o->phases, 1},
		{"iterations", required_argument, 0, 'n'},
		{"count-child", required_argument, 0, 'C'},
		{"help", no_argument, 0, 'h'},
		{"wide-workers", required_argument, 0, 'W'},
		{"wide-branches", required_argument, 0, 'B'},
		{"wide-chain", required_argument, 0, 'L'},
		{"big-max", required_argument, 0, 'M'},
		{0, 0, 0, 0},
	};
	int c;
	while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1)
		if (!apply(c, o))
			return false;
	/* 10^6 costs big some 6 s on 2 cores, a tenth of the run of every
	 * workload: there it stops at 10^5 unless asked for. */
	if (o->big_max == 0)
		o->big_max = o->workloads_named ? 1000000 : 100000;
	return optind == argc;
}
