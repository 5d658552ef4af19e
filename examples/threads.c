/* libadg with threads: N threads share parameter leaves, each builds its
 * own graph per step (a data-parallel trainer's pattern), runs backward on
 * it, and the caller sums the gradients the threads got. The parameters'
 * leaves couple nothing: each thread's graph stays its own.
 *
 * Per step a thread computes loss = (w0*x0 + w1*x1 + w2*x2 + w3*x3)^2 for
 * its own x, so d loss / d wi = 2 * (w . x) * xi; the program checks the
 * summed gradients against that. Usage: threads [N] (default 4). */
#include <adg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "boxed.h"

#define PARAMS 4
#define STEPS  1000

static adg_registry *reg;
static adg_node *w[PARAMS];
static const double w_value[PARAMS] = {0.5, -1.0, 0.25, 2.0};

struct worker {
	int index;
	double grad_sum[PARAMS]; /* summed over this thread's steps */
	double want[PARAMS];	 /* the same sums, by hand */
	int rc;
};

/* Steps keep the forward values they need in their closure. */
struct product {
	double a, b; /* y = a * b */
};

/* Adds d into parent i's gradient. */
static int send(adg_step_call *call, size_t i, double d)
{
	void *v = boxed(d);
	if (v == NULL)
		return ADG_ENOMEM;
	return adg_step_give(call, i, v);
}

static int product_backward(adg_step_call *call, void *user)
{
	const struct product *p = user;
	double g = call->grad ? *(double *)call->grad : 0;
	int rc = send(call, 0, g * p->b);
	return rc != 0 ? rc : send(call, 1, g * p->a);
}

static int sum_backward(adg_step_call *call, void *user)
{
	(void)user;
	double g = call->grad ? *(double *)call->grad : 0;
	int rc = 0;
	for (size_t i = 0; i < call->n_parents && rc == 0; i++)
		rc = send(call, i, g);
	return rc;
}

static void free_closure(void *user)
{
	free(user);
}

/* y = a * b, recording its step; returns 0 or an error code. */
static int mul(adg_node *a, double av, adg_node *b, double bv, adg_node **y)
{
	struct product *p = malloc(sizeof *p);
	if (p == NULL)
		return ADG_ENOMEM;
	*p = (struct product){av, bv};
	adg_node *parents[2] = {a, b};
	adg_step step = {.backward = product_backward,
			 .release = free_closure,
			 .user = p};
	int rc = adg_op(reg, parents, 2, &step, y);
	if (rc != 0)
		free(p); /* on error the closure is still ours */
	return rc;
}

static int one_step(struct worker *me, unsigned int *seed)
{
	double x[PARAMS], dot = 0;
	adg_node *xs[PARAMS] = {0}, *terms[PARAMS] = {0}, *s = NULL,
		 *loss = NULL;
	adg_grads *grads = NULL;
	int rc = 0;

	for (int i = 0; i < PARAMS && rc == 0; i++) {
		x[i] = (double)(rand_r(seed) % 7) - 3;
		dot += w_value[i] * x[i];
		rc = adg_leaf(reg, &xs[i]);
		if (rc == 0)
			rc = mul(w[i], w_value[i], xs[i], x[i], &terms[i]);
	}
	if (rc == 0) {
		adg_step step = {.backward = sum_backward,
				 .release = NULL,
				 .user = NULL};
		rc = adg_op(reg, terms, PARAMS, &step, &s);
	}
	if (rc == 0)
		rc = mul(s, dot, s, dot, &loss); /* dot^2 */
	if (rc == 0)
		rc = adg_backward(reg, loss, boxed(1.0), &boxed_ops, &grads);
	for (int i = 0; i < PARAMS && rc == 0; i++) {
		void *g;
		rc = adg_grads_get_node(grads, w[i], &g);
		if (rc == 0) {
			me->grad_sum[i] += *(double *)g;
			me->want[i] += 2 * dot * x[i];
		}
	}
	adg_grads_free(grads);
	/* Handles go in any order; what is unreachable is freed. */
	adg_node *all[] = {loss,     s,	    terms[0], terms[1], terms[2],
			   terms[3], xs[0], xs[1],    xs[2],	xs[3]};
	for (size_t i = 0; i < sizeof all / sizeof *all; i++)
		if (all[i] != NULL)
			adg_node_unref(all[i]);
	return rc;
}

static void *worker_main(void *arg)
{
	struct worker *me = arg;
	unsigned int seed = 1234u + (unsigned int)me->index;
	for (int step = 0; step < STEPS && me->rc == 0; step++)
		me->rc = one_step(me, &seed);
	return NULL;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 4;
	if (n < 1 || n > 256) {
		fprintf(stderr, "usage: threads [1..256]\n");
		return 2;
	}
	int rc = adg_registry_new(NULL, &reg);
	for (int i = 0; i < PARAMS && rc == 0; i++)
		rc = adg_leaf(reg, &w[i]);
	if (rc != 0) {
		fprintf(stderr, "setup: %s\n", adg_strerror(rc));
		return 1;
	}

	struct worker *workers = calloc(n, sizeof *workers);
	pthread_t *tid = calloc(n, sizeof *tid);
	if (workers == NULL || tid == NULL)
		return 1;
	for (int t = 0; t < n; t++) {
		workers[t].index = t;
		pthread_create(&tid[t], NULL, worker_main, &workers[t]);
	}
	double total[PARAMS] = {0}, want[PARAMS] = {0};
	int failed = 0;
	for (int t = 0; t < n; t++) {
		pthread_join(tid[t], NULL);
		if (workers[t].rc != 0) {
			fprintf(stderr, "thread %d: %s\n", t,
				adg_strerror(workers[t].rc));
			failed = 1;
		}
		for (int i = 0; i < PARAMS; i++) {
			total[i] += workers[t].grad_sum[i];
			want[i] += workers[t].want[i];
		}
	}
	for (int i = 0; i < PARAMS; i++) {
		printf("d loss / d w%d summed over %d threads x %d steps: %g\n",
		       i, n, STEPS, total[i]);
		if (total[i] != want[i]) {
			fprintf(stderr, "w%d: got %g, want %g\n", i, total[i],
				want[i]);
			failed = 1;
		}
	}
	/* Every step's graph is gone; only the parameters remain. */
	struct adg_stats st = {.size = sizeof st};
	adg_registry_stats(reg, &st);
	printf("live nodes %llu, live graphs %llu\n",
	       (unsigned long long)st.live_nodes,
	       (unsigned long long)st.live_graphs);
	if (st.live_nodes != PARAMS || st.live_graphs != 0)
		failed = 1;
	for (int i = 0; i < PARAMS; i++)
		adg_node_unref(w[i]);
	rc = adg_registry_free(reg);
	if (rc != 0) {
		fprintf(stderr, "adg_registry_free: %s\n", adg_strerror(rc));
		failed = 1;
	}
	free(workers);
	free(tid);
	return failed;
}
