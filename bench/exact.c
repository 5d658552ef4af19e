/*
 * adg-bench-exact: what an exact sum (adg/exact.h) costs beside a float
 * sum, on one thread, in one run: ns per element of adding an array of
 * floats into n sums (a[i] += b[i] against adg_exact_add), of merging two
 * accumulators (against a float add of two arrays) and of rounding, for n
 * that fit in L1, L2 and well past the caches (Fashion-MNIST's MLP
 * gradient, 200,704 floats). Each figure is the median of R runs, the
 * kinds taken in turn within each run; the ratios are of those medians.
 *
 * usage: adg-bench-exact [R]   (default 9)
 */
#include <adg.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, by_value);
	return v[n / 2];
}

/* Keeps the float sums from being optimized away. */
static volatile float sink;

enum { KINDS = 4, MAX_RUNS = 101 };
static const char *const kind_name[KINDS] = {
	"float add (a[i] += b[i])",
	"adg_exact_add",
	"adg_exact_merge",
	"adg_exact_round",
};

int main(int argc, char **argv)
{
	int runs = argc > 1 ? atoi(argv[1]) : 9;
	if (runs < 1 || runs > MAX_RUNS) {
		fprintf(stderr, "usage: adg-bench-exact [R], 1 <= R <= %d\n",
			MAX_RUNS);
		return 2;
	}
	const size_t sizes[] = {1024, 27648, 200704};
	printf("exact sums against float sums, one thread, ns per element, "
	       "median of %d runs\n",
	       runs);
	printf("%-26s", "n");
	for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
		printf("%18zu", sizes[s]);
	printf("\n");
	double result[KINDS][3];
	for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
		size_t n = sizes[s];
		float *a = calloc(n, sizeof *a), *b = malloc(n * sizeof *b);
		adg_exact *sum, *other;
		if (a == NULL || b == NULL || adg_exact_new(n, &sum) != 0 ||
		    adg_exact_new(n, &other) != 0) {
			fprintf(stderr, "adg-bench-exact: no memory\n");
			return 1;
		}
		uint64_t state = 88172645463325252u;
		for (size_t i = 0; i < n; i++) {
			state ^= state << 13;
			state ^= state >> 7;
			state ^= state << 17;
			/* gradient-like: small, of both signs, many scales */
			b[i] = (float)((int64_t)(state >> 40) - (1 << 23)) *
			       0x1p-30f / (float)(1 + (state & 63));
		}
		adg_exact_add(other, 0, b, n);
		/* Repeats so that each timed stretch is a few ms. */
		int reps = (int)(4000000 / n) + 1;
		double t[KINDS][MAX_RUNS];
		for (int r = 0; r < runs; r++) {
			double start = now_ns();
			for (int k = 0; k < reps; k++)
				for (size_t i = 0; i < n; i++)
					a[i] += b[i];
			sink = a[n / 2];
			t[0][r] = (now_ns() - start) / ((double)reps * n);

			start = now_ns();
			for (int k = 0; k < reps; k++)
				adg_exact_add(sum, 0, b, n);
			t[1][r] = (now_ns() - start) / ((double)reps * n);

			start = now_ns();
			for (int k = 0; k < reps; k++)
				adg_exact_merge(sum, other, 0, n);
			t[2][r] = (now_ns() - start) / ((double)reps * n);

			start = now_ns();
			for (int k = 0; k < reps; k++)
				adg_exact_round(sum, 0, a, n);
			t[3][r] = (now_ns() - start) / ((double)reps * n);
		}
		for (int k = 0; k < KINDS; k++)
			result[k][s] = median(t[k], runs);
		adg_exact_free(sum);
		adg_exact_free(other);
		free(a);
		free(b);
	}
	for (int k = 0; k < KINDS; k++) {
		printf("%-26s", kind_name[k]);
		for (size_t s = 0; s < 3; s++) {
			if (k == 0)
				printf("%18.3f", result[k][s]);
			else
				printf("%9.3f (%5.1fx)", result[k][s],
				       result[k][s] / result[0][s]);
		}
		printf("\n");
	}
	printf("memory: 72 bytes a sum against 4 for a float (18x)\n");
	return 0;
}
