/*
 * adg-bench --callgrind: instructions per registered node and per backward
 * step, counted by valgrind's callgrind, exact and repeatable where times
 * are not, so that two commits compare to the instruction.
 *
 * adg-bench runs itself under valgrind once per implementation, as a child
 * (--count-child) that builds and runs backward over --iterations chains in
 * bench_count_phases; the figures are the inclusive counts of its two phase
 * functions, read back with callgrind_annotate.
 *
 * --phases splits adg's and floor's counts by phase (docs/bench.md has the
 * table): the child runs again under --toggle-collect, once collecting only
 * inside bench_build_phase and once only inside bench_backward_phase, so
 * that a function's inclusive count in each profile is what it cost in
 * that phase alone (release, say, runs in both).
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

/* The inclusive counts of every function of a profile, one per line, as
 * callgrind_annotate prints them, in a temporary file; NULL on failure. */
static FILE *annotate(const char *profile)
{
	char cmd[8192];
	snprintf(cmd, sizeof cmd,
		 "callgrind_annotate --inclusive=yes --threshold=100 '%s'",
		 profile);
	FILE *p = popen(cmd, "r"), *out = tmpfile();
	if (p == NULL || out == NULL) {
		if (p)
			pclose(p);
		if (out)
			fclose(out);
		return NULL;
	}
	char line[4096];
	while (fgets(line, sizeof line, p))
		fputs(line, out);
	pclose(p);
	return out;
}

/* function's inclusive count in an annotation, 0 when it never ran: the
 * line that names exactly ":function [". */
static double function_ir(FILE *annotation, const char *function)
{
	char want[256], line[4096];
	snprintf(want, sizeof want, ":%s [", function);
	rewind(annotation);
	while (fgets(line, sizeof line, annotation)) {
		if (strstr(line, want) == NULL)
			continue;
		double ir = 0;
		for (const char *s = line;
		     *s == ' ' || *s == ',' || (*s >= '0' && *s <= '9'); s++)
			if (*s >= '0' && *s <= '9')
				ir = ir * 10 + (*s - '0');
		return ir;
	}
	return 0;
}

/* Inclusive instruction count of a function in a callgrind profile; NAN
 * when it cannot be read or the function never ran. */
static double inclusive_ir(const char *profile, const char *function)
{
	FILE *a = annotate(profile);
	if (a == NULL)
		return NAN;
	double ir = function_ir(a, function);
	fclose(a);
	return ir > 0 ? ir : NAN;
}

/* Runs the count child of impl under callgrind, collecting only inside
 * toggle; returns the annotation, or NULL. */
static FILE *phase_profile(const struct options *o, const char *self,
			   const char *impl, const char *toggle)
{
	char profile[] = "/tmp/adg-callgrind-XXXXXX";
	int fd = mkstemp(profile);
	if (fd < 0)
		return NULL;
	close(fd);
	char cmd[16384];
	snprintf(cmd, sizeof cmd,
		 "valgrind --tool=callgrind --callgrind-out-file='%s' "
		 "--toggle-collect=%s '%s' --count-child=%s --iterations=%ld "
		 "--chain=%d --leaves=%d >/dev/null 2>&1",
		 profile, toggle, self, impl, o->iterations, o->p.chain,
		 o->p.leaves);
	FILE *a = system(cmd) == 0 ? annotate(profile) : NULL;
	remove(profile);
	return a;
}

/* One row of the phase table: adg's and floor's counts per unit. */
static void phase_row(const char *phase, double adg, double floor_,
		      double units, const char *what)
{
	printf("%-22s %8.1f %8.1f   %s\n", phase, adg / units, floor_ / units,
	       what);
}

/* --phases: instructions per registered node and per backward step, by
 * phase, adg beside floor (docs/bench.md, "Where the instructions go"). */
static int callgrind_phases(const struct options *o, const char *self)
{
	FILE *ab = phase_profile(o, self, "adg", "bench_build_phase");
	FILE *fb = phase_profile(o, self, "floor", "bench_build_phase");
	FILE *ak = phase_profile(o, self, "adg", "bench_backward_phase");
	FILE *fk = phase_profile(o, self, "floor", "bench_backward_phase");
	if (ab == NULL || fb == NULL || ak == NULL || fk == NULL) {
		fprintf(stderr, "adg-bench: a phase profile failed\n");
		return 1;
	}
	double n = (double)o->iterations * o->p.chain; /* nodes = steps */

	printf("\nby phase, Ir per registered node / per backward step "
	       "(inclusive counts, callgrind --toggle-collect per phase)\n");
	printf("%-22s %8s %8s   %s\n", "phase", "adg", "floor", "adg; floor");
	/* The workload moves its temporaries: adg_op_moving, adg_op's
	 * twin, registers every node. */
	double a_op =
		function_ir(ab, "adg_op") + function_ir(ab, "adg_op_moving");
	double a_place = function_ir(ab, "adg_graph_place");
	double a_locate = function_ir(ab, "adg_graph_lock_of");
	double a_unref = function_ir(ab, "adg_node_unref");
	double f_op = function_ir(fb, "f_op");
	double f_alloc = function_ir(fb, "malloc");
	double f_unref = function_ir(fb, "release");
	double a_build = function_ir(ab, "bench_build_phase");
	double f_build = function_ir(fb, "bench_build_phase");
	phase_row("register: locate", a_locate, 0, n,
		  "adg_graph_lock_of: the parent's graph, read side, lock; "
		  "none");
	phase_row("register: allocate", a_op - a_place, f_alloc, n,
		  "adg_op less placement: node memory, id, fields, parents' "
		  "refs; malloc");
	phase_row("register: link", a_place - a_locate, f_op - f_alloc, n,
		  "adg_graph_place less locate: into the graph, unlock; "
		  "f_op less malloc: tape slot, refs");
	phase_row("register: free", a_unref, f_unref, n,
		  "adg_node_unref (a moved handle needs none); release: "
		  "the caller's handle on the previous node");
	phase_row("register: bench", a_build - a_op - a_unref,
		  f_build - f_op - f_unref, n,
		  "the chain loop, the product, the bench's wrappers");
	phase_row("register: total", a_build, f_build, n, "bench_build_phase");
	double a_back = function_ir(ak, "bench_backward_phase");
	double f_back = function_ir(fk, "bench_backward_phase");
	double a_take = function_ir(ak, "adg_tape_take");
	double a_step = function_ir(ak, "mul_run");
	double f_step = function_ir(fk, "mul_run");
	double a_give = function_ir(ak, "adg_step_give");
	double f_give = function_ir(fk, "u64map_add_slot");
	double a_let_go = function_ir(ak, "adg_run_let_go");
	double a_free = a_let_go + function_ir(ak, "adg_node_unref") +
			function_ir(ak, "adg_grads_free");
	double f_free = function_ir(fk, "release");
	/* The loop's own: what the runner spends around the steps. floor's
	 * release runs inside f_backward but for the root's own drop. Both
	 * entry points run the one body (each names itself in a reason):
	 * the bench calls one of them. */
	double a_loop = function_ir(ak, "adg_backward") +
			function_ir(ak, "adg_backward_with") - a_take - a_step -
			a_let_go;
	double f_loop = function_ir(fk, "f_backward") - f_step - f_free;
	phase_row("backward: locate", a_take, 0, n,
		  "adg_tape_take: the walk under the root's lock; none (the "
		  "tape is the creation order)");
	phase_row("backward: step", a_step - a_give, f_step - f_give, n,
		  "mul_run less the delivery of its gradients");
	phase_row("backward: give", a_give, f_give, n,
		  "adg_step_give; u64map_add_slot");
	phase_row("backward: free", a_free, f_free, n,
		  "adg_run_let_go, the root's unref, adg_grads_free; release");
	phase_row("backward: run loop", a_loop, f_loop, n,
		  "adg_backward_with's own (the table, the order, the step "
		  "calls); f_backward's own");
	phase_row("backward: bench", a_back - a_take - a_step - a_free - a_loop,
		  f_back - f_step - f_free - f_loop, n,
		  "the bench's wrappers, reading the probe's gradient");
	phase_row("backward: total", a_back, f_back, n, "bench_backward_phase");
	fclose(ab);
	fclose(fb);
	fclose(ak);
	fclose(fk);
	return 0;
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
	return o->phases ? callgrind_phases(o, self) : 0;
}
