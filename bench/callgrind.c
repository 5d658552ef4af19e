/*
 * adg-bench --callgrind: instructions per registered node and per backward
 * step, counted by valgrind's callgrind, exact and repeatable where times
 * are not, so that two commits compare to the instruction.
 *
 * adg-bench runs itself under valgrind once per implementation, as a child
 * (--count-child) that builds and runs backward over --iterations chains in
 * bench_count_phases; the figures are the inclusive counts of its two phase
 * functions, read back with callgrind_annotate.
 */
#include "driver.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int count_child(const struct options *o)
{
	for (enum impl_id i = 0; i < N_IMPLS; i++) {
		if (strcmp(impls[i]->name, o->count_child) != 0)
			continue;
		bench_counts c = {0};
		bench_count_phases(impls[i], &o->p, o->iterations, &c);
		printf("%llu %llu\n", (unsigned long long)c.nodes,
		       (unsigned long long)c.steps);
		return 0;
	}
	return 2;
}

/* Inclusive instruction count of a function in a callgrind profile. */
static double inclusive_ir(const char *profile, const char *function)
{
	char cmd[8192], line[4096];
	snprintf(cmd, sizeof cmd, "callgrind_annotate --inclusive=yes '%s'",
		 profile);
	FILE *p = popen(cmd, "r");
	if (p == NULL)
		return NAN;
	double ir = NAN;
	while (fgets(line, sizeof line, p)) {
		if (strstr(line, function) == NULL)
			continue;
		char digits[64];
		int k = 0;
		for (const char *s = line; *s && k < 63; s++) {
			if (*s >= '0' && *s <= '9')
				digits[k++] = *s;
			else if (*s != ',' && k > 0)
				break;
		}
		digits[k] = 0;
		if (k > 0) {
			ir = atof(digits);
			break;
		}
	}
	pclose(p);
	return ir;
}

int callgrind(const struct options *o)
{
	if (system("command -v valgrind >/dev/null 2>&1") != 0) {
		fprintf(stderr, "adg-bench: valgrind not found "
				"(scripts/bench.sh --callgrind installs it)\n");
		return 1;
	}
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n <= 0)
		return 1;
	self[n] = 0;
	printf("callgrind: chain of %d products on %d leaves, %ld iterations, "
	       "1 thread; instructions (Ir) per node, exact and repeatable\n",
	       o->p.chain, o->p.leaves, o->iterations);
	printf("%-6s %14s %14s %14s\n", "impl", "Ir/registered", "Ir/backward",
	       "Ir/node total");
	double total[N_IMPLS];
	for (enum impl_id i = 0; i < N_IMPLS; i++) {
		total[i] = NAN;
		if (!o->impl_on[i])
			continue;
		char profile[] = "/tmp/adg-callgrind-XXXXXX";
		int fd = mkstemp(profile);
		if (fd < 0)
			return 1;
		close(fd);
		char cmd[16384];
		snprintf(cmd, sizeof cmd,
			 "valgrind --tool=callgrind --callgrind-out-file='%s' "
			 "'%s' --count-child=%s --iterations=%ld --chain=%d "
			 "--leaves=%d 2>/dev/null",
			 profile, self, impls[i]->name, o->iterations,
			 o->p.chain, o->p.leaves);
		FILE *p = popen(cmd, "r");
		unsigned long long nodes = 0, steps = 0;
		if (p == NULL || fscanf(p, "%llu %llu", &nodes, &steps) != 2) {
			fprintf(stderr, "adg-bench: callgrind run failed\n");
			if (p)
				pclose(p);
			remove(profile);
			continue;
		}
		pclose(p);
		double build = inclusive_ir(profile, "bench_build_phase");
		double back = inclusive_ir(profile, "bench_backward_phase");
		remove(profile);
		total[i] = (build + back) / nodes;
		printf("%-6s %14.1f %14.1f %14.1f\n", impls[i]->name,
		       build / nodes, back / steps, total[i]);
	}
	if (!isnan(total[IMPL_ADG]) && !isnan(total[IMPL_FLOOR]))
		printf("adg / floor: %.2f x instructions per node\n",
		       total[IMPL_ADG] / total[IMPL_FLOOR]);
	if (!isnan(total[IMPL_ADG]) && !isnan(total[IMPL_SEED]))
		printf("adg / seed:  %.2f x instructions per node\n",
		       total[IMPL_ADG] / total[IMPL_SEED]);
	return 0;
}
