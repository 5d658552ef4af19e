/*
 * adg-bench's statistics: a cell's runs reduced to the figures the reports
 * print. Medians, so that one run disturbed by the machine moves nothing;
 * min and max show how far the runs spread.
 */
#include "driver.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

double median(const double *v, int n)
{
	double s[MAX_RUNS];
	memcpy(s, v, n * sizeof *s);
	qsort(s, n, sizeof *s, cmp_double);
	return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

double vmin(const double *v, int n)
{
	double m = v[0];
	for (int i = 1; i < n; i++)
		m = v[i] < m ? v[i] : m;
	return m;
}

double vmax(const double *v, int n)
{
	double m = v[0];
	for (int i = 1; i < n; i++)
		m = v[i] > m ? v[i] : m;
	return m;
}

const struct cell *next_ok(const struct results *r, const struct cell *prev)
{
	for (const struct cell *c = prev ? prev + 1 : r->cells;
	     c < r->cells + r->n_cells; c++)
		if (c->ok)
			return c;
	return NULL;
}

const struct cell *find_cell(const struct results *r, int workload,
			     enum impl_id impl, int threads)
{
	for (const struct cell *c = next_ok(r, NULL); c; c = next_ok(r, c))
		if (c->workload == workload && c->impl == impl &&
		    c->threads == threads)
			return c;
	return NULL;
}

double rate_of(const struct results *r, int workload, enum impl_id impl,
	       int threads)
{
	const struct cell *c = find_cell(r, workload, impl, threads);
	return c ? median(c->rate, c->runs) : NAN;
}

int workload_index(const char *name)
{
	for (int i = 0; i < bench_n_workloads; i++)
		if (strcmp(bench_workloads[i].name, name) == 0)
			return i;
	return -1;
}

double wide_ns(const struct results *r, enum wide_kind kind, int workers)
{
	const struct wide *w = &r->wide;
	for (int m = 0; m < w->n_modes; m++) {
		if (w->workers[m] != workers)
			continue;
		for (int k = 0; k < w->runs; k++)
			if (isnan(w->ns_step[kind][m][k]))
				return NAN; /* a failed run voids the mode */
		return median(w->ns_step[kind][m], w->runs);
	}
	return NAN;
}

double wide_ratio(const struct results *r, enum wide_kind kind, int workers,
		  int base)
{
	const struct wide *w = &r->wide;
	int a = -1, b = -1;
	for (int m = 0; m < w->n_modes; m++) {
		if (w->workers[m] == workers)
			a = m;
		if (w->workers[m] == base)
			b = m;
	}
	if (a < 0 || b < 0 || w->runs == 0)
		return NAN;
	double q[MAX_RUNS];
	for (int k = 0; k < w->runs; k++) {
		q[k] = w->ns_step[kind][a][k] / w->ns_step[kind][b][k];
		if (isnan(q[k]))
			return NAN; /* a failed run voids the mode */
	}
	return median(q, w->runs);
}

double wide_kind_ratio(const struct results *r, enum wide_kind kind,
		       enum wide_kind base_kind, int workers)
{
	const struct wide *w = &r->wide;
	for (int m = 0; m < w->n_modes; m++) {
		if (w->workers[m] != workers || w->runs == 0)
			continue;
		double q[MAX_RUNS];
		for (int k = 0; k < w->runs; k++) {
			q[k] = w->ns_step[kind][m][k] /
			       w->ns_step[base_kind][m][k];
			if (isnan(q[k]))
				return NAN; /* a failed run voids the mode */
		}
		return median(q, w->runs);
	}
	return NAN;
}

void wide_mode(char *buf, size_t size, int workers)
{
	if (workers == WIDE_SEQ)
		snprintf(buf, size, "sequential");
	else
		snprintf(buf, size, "%d worker%s", workers,
			 workers == 1 ? "" : "s");
}

const bench_big_result *big_result(const struct results *r,
				   enum big_shape shape, enum impl_id impl,
				   int size)
{
	const struct big *b = &r->big;
	return size >= 0 && size < b->n_sizes && b->ok[shape][impl][size]
		       ? &b->res[shape][impl][size]
		       : NULL;
}

_Static_assert(BIG_BRANCHES == 64, "big_shape_name names 64 chains");

const char *big_shape_name(enum big_shape shape)
{
	return shape == BIG_CHAIN ? "chain" : "64 chains";
}

void big_size(char *buf, size_t size, long n)
{
	int e = 0;
	long m = n;
	while (m >= 10 && m % 10 == 0) {
		m /= 10;
		e++;
	}
	if (m == 1 && e > 0)
		snprintf(buf, size, "10^%d", e);
	else
		snprintf(buf, size, "%ld", n);
}
