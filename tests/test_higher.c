/* Higher-order gradients (issue 13): steps of a retained backward record
 * their gradients as ops (tests/dual.h), so that a backward from a
 * gradient's node gives second and third derivatives, Hessian-vector
 * products and gradient penalties.
 *
 * Each scenario runs with no executor, an executor of no worker, and pools
 * of 2 and 4 threads, so that steps record ops into the graph being run
 * while the backward runs on pool threads: it must not deadlock, and the
 * results must be bitwise the same for all four. Results are checked
 * against closed forms to 1e-12, relative to the larger of 1 and the
 * closed form's magnitude (absolute below 1). */
#include "dual.h"
#include "fixture.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

static void open_higher(void)
{
	dual_reset();
	fixture_open(NULL);
}

TestSuite(higher, .init = open_higher, .timeout = 120);

/* ------------------------------------------------------------- executors */

enum { N_HOWS = 4 };

static const char *const how_names[N_HOWS] = {"no executor",
					      "an executor of 0 workers",
					      "a pool of 2", "a pool of 4"};

struct how {
	adg_pool *pool;
	adg_executor ex;
	const adg_executor *exec; /* what backward passes get */
};

static void how_open(struct how *h, int i)
{
	static const unsigned threads[N_HOWS] = {0, 1, 2, 4};
	h->pool = NULL;
	h->exec = NULL;
	if (i == 0)
		return;
	cr_assert_eq(adg_pool_new(threads[i], &h->pool), 0);
	cr_assert_eq(adg_pool_executor(h->pool, &h->ex), 0);
	if (i == 1)
		h->ex.n_workers = 0;
	else
		cr_assert_eq(h->ex.n_workers, threads[i]);
	h->exec = &h->ex;
}

static void how_close(struct how *h)
{
	cr_assert_eq(adg_pool_free(h->pool), 0);
}

/* ----------------------------------------------- duals that must succeed */

static struct dual leaf(double v)
{
	struct dual x;
	int rc = dual_leaf(reg, v, &x);
	cr_assert_eq(rc, 0, "dual_leaf: %s", adg_strerror(rc));
	return x;
}

static struct dual add(struct dual a, struct dual b)
{
	struct dual y;
	int rc = dual_add(reg, a, b, &y);
	cr_assert_eq(rc, 0, "dual_add: %s", adg_strerror(rc));
	return y;
}

static struct dual mul(struct dual a, struct dual b)
{
	struct dual y;
	int rc = dual_mul(reg, a, b, &y);
	cr_assert_eq(rc, 0, "dual_mul: %s", adg_strerror(rc));
	return y;
}

static struct dual scale(struct dual a, double c)
{
	struct dual y;
	int rc = dual_scale(reg, a, c, &y);
	cr_assert_eq(rc, 0, "dual_scale: %s", adg_strerror(rc));
	return y;
}

static struct dual dsin(struct dual a)
{
	struct dual y;
	int rc = dual_sin(reg, a, &y);
	cr_assert_eq(rc, 0, "dual_sin: %s", adg_strerror(rc));
	return y;
}

static void drop(struct dual *x)
{
	cr_assert_eq(dual_drop(x), 0);
}

/* The seed of a backward: a leaf of value 1 when its gradients are to be
 * recorded (they are nodes then), else the constant 1. */
static struct dual *seed(bool record)
{
	struct dual *s = dual_box(record ? leaf(1.0) : dual_const(1.0));
	cr_assert_not_null(s);
	return s;
}

static int try_backward(struct dual root, bool record, bool retain,
			const adg_executor *ex, adg_grads **out)
{
	adg_grad_ops ops = dual_ops(reg);
	adg_backward_options o = {
		.size = sizeof o, .executor = ex, .retain = retain};
	return adg_backward_with(reg, root.node, seed(record), &ops, &o, out);
}

static adg_grads *backward(struct dual root, bool record, bool retain,
			   const adg_executor *ex)
{
	adg_grads *g = NULL;
	int rc = try_backward(root, record, retain, ex, &g);
	cr_assert_eq(rc, 0, "%s backward: %s",
		     retain ? "retained" : "consuming", adg_strerror(rc));
	cr_assert_not_null(g);
	return g;
}

/* Takes x's gradient out of g. */
static struct dual take(adg_grads *g, struct dual x)
{
	void *v = NULL;
	int rc = adg_grads_take(g, dual_id(x), &v);
	cr_assert_eq(rc, 0, "no gradient for %llu: %s",
		     (unsigned long long)dual_id(x), adg_strerror(rc));
	struct dual d;
	dual_unbox(v, &d);
	return d;
}

static void grads_free(adg_grads *g)
{
	cr_assert_eq(adg_grads_free(g), 0);
}

static void check(double got, double want, const char *what, int how, double x)
{
	double tol = 1e-12 * fmax(1.0, fabs(want));
	cr_expect(fabs(got - want) <= tol,
		  "%s at %g with %s: got %.17g, want %.17g", what, x,
		  how_names[how], got, want);
}

static struct adg_stats stats(void)
{
	struct adg_stats st = {.size = sizeof st};
	cr_assert_eq(adg_registry_stats(reg, &st), 0);
	return st;
}

/* Every handle of the scenario dropped: the registry is back to before,
 * and no gradient value is left. */
static void expect_back_to(const struct adg_stats *before)
{
	struct adg_stats now = stats();
	cr_expect_eq(now.live_nodes, before->live_nodes, "live nodes %llu",
		     (unsigned long long)now.live_nodes);
	cr_expect_eq(now.live_steps, before->live_steps, "live steps %llu",
		     (unsigned long long)now.live_steps);
	cr_expect_eq(now.live_graphs, before->live_graphs, "live graphs %llu",
		     (unsigned long long)now.live_graphs);
	cr_expect_eq(atomic_load(&dual_values_live), 0, "gradients left");
	cr_expect_eq(atomic_load(&dual_steps_live), 0, "steps left");
	cr_expect_eq(atomic_load(&dual_errors), 0, "a callback failed");
}

/* The same results for every executor, bitwise. */
static void expect_same(const double *got, const double *want, int n, int how)
{
	for (int i = 0; i < n; i++)
		cr_expect_eq(got[i], want[i],
			     "%s: result %d got %.17g, want %.17g",
			     how_names[how], i, got[i], want[i]);
}

/* ------------------------------------------------------------------ x³ */

/* f = x * x * x: a retained backward records f' = 3x² as a node; a
 * retained backward from it records f'' = 6x, and a consuming one from
 * that gives f''' = 6. f's graph stays usable after the retained passes. */
CHECKED_TEST(higher, derivatives_of_x_cubed)
{
	const double xs[] = {-1.5, 0.3, 2.0};
	enum { NX = sizeof xs / sizeof xs[0] };
	double out[N_HOWS][NX][3];
	for (int h = 0; h < N_HOWS; h++) {
		struct how how;
		how_open(&how, h);
		for (int i = 0; i < NX; i++) {
			struct adg_stats before = stats();
			double xv = xs[i];
			struct dual x = leaf(xv), a = mul(x, x), f = mul(a, x);
			drop(&a);

			adg_grads *g = backward(f, true, true, how.exec);
			struct dual gx = take(g, x);
			grads_free(g);
			cr_assert_not_null(gx.node, "f' is not a node");
			check(gx.value, 3 * xv * xv, "f'", h, xv);

			/* f's steps are still registered: again, the same. */
			g = backward(f, true, true, how.exec);
			struct dual again = take(g, x);
			grads_free(g);
			cr_expect_eq(again.value, gx.value);
			drop(&again);

			g = backward(gx, true, true, how.exec);
			struct dual gxx = take(g, x);
			grads_free(g);
			cr_assert_not_null(gxx.node, "f'' is not a node");
			check(gxx.value, 6 * xv, "f''", h, xv);

			g = backward(gxx, false, false, how.exec);
			struct dual gxxx = take(g, x);
			grads_free(g);
			cr_expect_null(gxxx.node, "a constant seed recorded");
			check(gxxx.value, 6, "f'''", h, xv);

			out[h][i][0] = gx.value;
			out[h][i][1] = gxx.value;
			out[h][i][2] = gxxx.value;
			drop(&gx);
			drop(&gxx);
			drop(&f);
			drop(&x);
			expect_back_to(&before);
		}
		how_close(&how);
		expect_same(&out[h][0][0], &out[0][0][0], NX * 3, h);
	}
}

/* ------------------------------------------- f(x, y) = x²y + sin(x)y */

struct xy {
	struct dual x, y, f;
};

static struct xy build_f(double xv, double yv)
{
	struct xy s = {leaf(xv), leaf(yv), {0}};
	struct dual xx = mul(s.x, s.x), xxy = mul(xx, s.y);
	struct dual sx = dsin(s.x), sxy = mul(sx, s.y);
	s.f = add(xxy, sxy);
	drop(&xx);
	drop(&xxy);
	drop(&sx);
	drop(&sxy);
	return s;
}

static void drop_f(struct xy *s)
{
	drop(&s->x);
	drop(&s->y);
	drop(&s->f);
}

/* ∇f as nodes, from a retained backward; checked against the closed
 * form. */
static void gradient(struct xy *s, const struct how *how, int h,
		     struct dual *gx, struct dual *gy)
{
	adg_grads *g = backward(s->f, true, true, how->exec);
	*gx = take(g, s->x);
	*gy = take(g, s->y);
	grads_free(g);
	cr_assert_not_null(gx->node);
	cr_assert_not_null(gy->node);
	double x = s->x.value, y = s->y.value;
	check(gx->value, 2 * x * y + cos(x) * y, "df/dx", h, x);
	check(gy->value, x * x + sin(x), "df/dy", h, x);
}

static const double points[][2] = {{0.7, -1.3}, {-2.1, 0.4}, {3.0, 2.5}};
enum { NP = sizeof points / sizeof points[0] };

/* H v by a backward from s = ∇f · v, for v the unit vectors and another:
 * H = [[2y − y sin x, 2x + cos x], [2x + cos x, 0]]. */
CHECKED_TEST(higher, hessian_vector_products)
{
	static const double vs[][2] = {{1, 0}, {0, 1}, {0.5, -2}};
	enum { NV = sizeof vs / sizeof vs[0] };
	double out[N_HOWS][NP][NV][2];
	for (int h = 0; h < N_HOWS; h++) {
		struct how how;
		how_open(&how, h);
		for (int p = 0; p < NP; p++) {
			for (int k = 0; k < NV; k++) {
				struct adg_stats before = stats();
				double x = points[p][0], y = points[p][1];
				double vx = vs[k][0], vy = vs[k][1];
				struct xy s = build_f(x, y);
				struct dual gx, gy;
				gradient(&s, &how, h, &gx, &gy);
				struct dual a = scale(gx, vx),
					    b = scale(gy, vy);
				struct dual dot = add(a, b);
				drop(&a);
				drop(&b);

				adg_grads *g =
					backward(dot, false, false, how.exec);
				struct dual hx = take(g, s.x),
					    hy = take(g, s.y);
				grads_free(g);
				double h00 = 2 * y - y * sin(x),
				       h01 = 2 * x + cos(x);
				check(hx.value, h00 * vx + h01 * vy, "(Hv)_x",
				      h, x);
				check(hy.value, h01 * vx, "(Hv)_y", h, x);
				out[h][p][k][0] = hx.value;
				out[h][p][k][1] = hy.value;

				drop(&dot);
				drop(&gx);
				drop(&gy);
				drop_f(&s);
				expect_back_to(&before);
			}
		}
		how_close(&how);
		expect_same(&out[h][0][0][0], &out[0][0][0][0], NP * NV * 2, h);
	}
}

/* total = f + (∂f/∂x)², then its backward:
 * ∂/∂x = gx + 2 gx (2y − y sin x), ∂/∂y = (x² + sin x) + 2 gx (2x + cos x). */
CHECKED_TEST(higher, gradient_penalty)
{
	double out[N_HOWS][NP][2];
	for (int h = 0; h < N_HOWS; h++) {
		struct how how;
		how_open(&how, h);
		for (int p = 0; p < NP; p++) {
			struct adg_stats before = stats();
			double x = points[p][0], y = points[p][1];
			struct xy s = build_f(x, y);
			struct dual gx, gy;
			gradient(&s, &how, h, &gx, &gy);
			struct dual pen = mul(gx, gx), total = add(s.f, pen);
			drop(&pen);

			adg_grads *g = backward(total, false, false, how.exec);
			struct dual tx = take(g, s.x), ty = take(g, s.y);
			grads_free(g);
			double fx = 2 * x * y + cos(x) * y;
			check(tx.value, fx + 2 * fx * (2 * y - y * sin(x)),
			      "d total/dx", h, x);
			check(ty.value,
			      x * x + sin(x) + 2 * fx * (2 * x + cos(x)),
			      "d total/dy", h, x);
			out[h][p][0] = tx.value;
			out[h][p][1] = ty.value;

			drop(&total);
			drop(&gx);
			drop(&gy);
			drop_f(&s);
			expect_back_to(&before);
		}
		how_close(&how);
		expect_same(&out[h][0][0], &out[0][0][0], NP * 2, h);
	}
}

/* ----------------------------------------------------- call->retained */

/* f = x * y + sin x: its three steps see call->retained 1 in a retained
 * backward, which leaves them registered, and 0 in a consuming one. */
CHECKED_TEST(higher, steps_see_whether_the_backward_retains)
{
	for (int h = 0; h < N_HOWS; h++) {
		struct how how;
		how_open(&how, h);
		struct adg_stats before = stats();
		atomic_store(&dual_runs_retained, 0);
		atomic_store(&dual_runs_consuming, 0);
		struct dual x = leaf(0.25), y = leaf(-3);
		struct dual xy = mul(x, y), sx = dsin(x), f = add(xy, sx);
		drop(&xy);
		drop(&sx);
		cr_assert_eq(stats().live_steps, before.live_steps + 3);

		adg_grads *g = backward(f, false, true, how.exec);
		cr_expect_eq(atomic_load(&dual_runs_retained), 3);
		cr_expect_eq(atomic_load(&dual_runs_consuming), 0);
		cr_expect_eq(stats().live_steps, before.live_steps + 3,
			     "a retained backward took steps");
		struct dual rx = take(g, x);
		grads_free(g);

		g = backward(f, false, false, how.exec);
		cr_expect_eq(atomic_load(&dual_runs_retained), 3);
		cr_expect_eq(atomic_load(&dual_runs_consuming), 3);
		cr_expect_eq(stats().live_steps, before.live_steps,
			     "a consuming backward left steps");
		struct dual cx = take(g, x);
		grads_free(g);
		cr_expect_eq(rx.value, cx.value);
		check(cx.value, -3 + cos(0.25), "df/dx", h, 0.25);

		drop(&f);
		drop(&x);
		drop(&y);
		expect_back_to(&before);
		how_close(&how);
	}
}

/* A consuming backward whose gradients are nodes: steps record ops on
 * parents it has consumed. The ops are made and f' has the right value,
 * but a backward from f' needs a consumed step: ADG_EUNAVAILABLE, the
 * seed freed, nothing taken; every handle dropped, nothing is left. */
CHECKED_TEST(higher, recording_in_a_consuming_backward_cannot_go_back)
{
	for (int h = 0; h < N_HOWS; h++) {
		struct how how;
		how_open(&how, h);
		struct adg_stats before = stats();
		struct dual x = leaf(1.5), a = mul(x, x), f = mul(a, x);
		drop(&a);

		adg_grads *g = backward(f, true, false, how.exec);
		struct dual gx = take(g, x);
		grads_free(g);
		cr_assert_not_null(gx.node);
		check(gx.value, 3 * 1.5 * 1.5, "f'", h, 1.5);
		uint64_t steps = stats().live_steps;

		for (int retain = 0; retain < 2; retain++) {
			g = (adg_grads *)&g;
			int rc = try_backward(gx, false, retain, how.exec, &g);
			cr_expect_eq(rc, ADG_EUNAVAILABLE, "retain %d: %s",
				     retain, adg_error_name(rc));
			cr_expect_null(g);
			cr_expect_eq(atomic_load(&dual_values_live), 0,
				     "the seed was not freed");
			cr_expect_eq(stats().live_steps, steps,
				     "a failed backward took steps");
		}
		drop(&gx);
		drop(&f);
		drop(&x);
		expect_back_to(&before);
		how_close(&how);
	}
}

/* ---------------------------------------------------------------- wide */

enum { WIDE = 48 };

/* Σ of terms[lo, hi) as a balanced tree of adds (a new handle). */
static struct dual sum_tree(const struct dual *terms, int lo, int hi)
{
	if (hi - lo == 1) {
		struct dual t;
		cr_assert_eq(dual_copy(terms[lo], &t), 0);
		return t;
	}
	int mid = lo + (hi - lo) / 2;
	struct dual a = sum_tree(terms, lo, mid), b = sum_tree(terms, mid, hi);
	struct dual s = add(a, b);
	drop(&a);
	drop(&b);
	return s;
}

/* f = Σ sin(x_i) y over 48 leaves: independent branches whose steps record
 * at once on the pool's threads, into the one graph being run. Then
 * s = Σ ∂f/∂x_i, and its backward: ∂s/∂x_i = −sin(x_i) y,
 * ∂s/∂y = Σ cos x_i. */
CHECKED_TEST(higher, wide_graph_records_from_many_threads_at_once)
{
	double out[N_HOWS][WIDE + 1];
	for (int h = 0; h < N_HOWS; h++) {
		struct how how;
		how_open(&how, h);
		struct adg_stats before = stats();
		const double yv = 1.75;
		struct dual x[WIDE], t[WIDE], y = leaf(yv);
		for (int i = 0; i < WIDE; i++) {
			x[i] = leaf(0.1 * i - 2);
			struct dual sx = dsin(x[i]);
			t[i] = mul(sx, y);
			drop(&sx);
		}
		struct dual f = sum_tree(t, 0, WIDE);
		for (int i = 0; i < WIDE; i++)
			drop(&t[i]);

		struct dual gx[WIDE];
		adg_grads *g = backward(f, true, true, how.exec);
		for (int i = 0; i < WIDE; i++) {
			gx[i] = take(g, x[i]);
			check(gx[i].value, cos(x[i].value) * yv, "df/dx_i", h,
			      x[i].value);
		}
		grads_free(g);
		struct dual s = sum_tree(gx, 0, WIDE);

		g = backward(s, false, false, how.exec);
		double cos_sum = 0;
		for (int i = 0; i < WIDE; i++) {
			struct dual hx = take(g, x[i]);
			check(hx.value, -sin(x[i].value) * yv, "ds/dx_i", h,
			      x[i].value);
			cos_sum += cos(x[i].value);
			out[h][i] = hx.value;
		}
		struct dual hy = take(g, y);
		grads_free(g);
		check(hy.value, cos_sum, "ds/dy", h, yv);
		out[h][WIDE] = hy.value;

		drop(&s);
		for (int i = 0; i < WIDE; i++) {
			drop(&gx[i]);
			drop(&x[i]);
		}
		drop(&f);
		drop(&y);
		expect_back_to(&before);
		how_close(&how);
		expect_same(out[h], out[0], WIDE + 1, h);
	}
}

/* -------------------------------------- retained passes on many threads */

enum { PASSERS = 4 };

struct passers {
	struct dual x, y, f;
	const adg_executor *exec;
	/* per thread: the first failing code, ∇f and H·(1, 1) */
	int rc[PASSERS];
	double grad[PASSERS][2], hv[PASSERS][2];
};

static int take_value(adg_grads *g, struct dual x, double *value)
{
	void *v = NULL;
	int rc = adg_grads_take(g, dual_id(x), &v);
	if (rc != 0)
		return rc;
	struct dual d;
	dual_unbox(v, &d);
	*value = d.value;
	return dual_drop(&d);
}

/* One thread's work, with no assertion (the main thread checks): ∇f as
 * nodes from a retained backward from f, then (∂f/∂x + ∂f/∂y) and a
 * retained backward from it, over the graph the other threads run too. */
static int passer(struct passers *p, int i)
{
	adg_grad_ops ops = dual_ops(reg);
	adg_backward_options o = {
		.size = sizeof o, .executor = p->exec, .retain = 1};
	struct dual s1, gx = dual_const(0), gy = dual_const(0),
			dot = dual_const(0);
	int rc = dual_leaf(reg, 1.0, &s1);
	if (rc != 0)
		return rc;
	struct dual *seed1 = dual_box(s1);
	if (seed1 == NULL) {
		(void)dual_drop(&s1);
		return ADG_ENOMEM;
	}
	adg_grads *g = NULL;
	rc = adg_backward_with(reg, p->f.node, seed1, &ops, &o, &g);
	if (rc != 0)
		return rc;
	void *v;
	if ((rc = adg_grads_take(g, dual_id(p->x), &v)) == 0) {
		dual_unbox(v, &gx);
		rc = adg_grads_take(g, dual_id(p->y), &v);
		if (rc == 0)
			dual_unbox(v, &gy);
	}
	int frc = adg_grads_free(g);
	if (rc == 0)
		rc = frc;
	if (rc == 0)
		rc = dual_add(reg, gx, gy, &dot);
	p->grad[i][0] = gx.value;
	p->grad[i][1] = gy.value;
	if (rc == 0) {
		struct dual *seed2 = dual_box(dual_const(1.0));
		rc = seed2 == NULL ? ADG_ENOMEM
				   : adg_backward_with(reg, dot.node, seed2,
						       &ops, &o, &g);
	}
	if (rc == 0) {
		rc = take_value(g, p->x, &p->hv[i][0]);
		if (rc == 0)
			rc = take_value(g, p->y, &p->hv[i][1]);
		frc = adg_grads_free(g);
		if (rc == 0)
			rc = frc;
	}
	int drc[3] = {dual_drop(&dot), dual_drop(&gx), dual_drop(&gy)};
	for (int k = 0; k < 3; k++)
		if (rc == 0)
			rc = drc[k];
	return rc;
}

static void *passer_thread(void *arg)
{
	struct thread *t = arg;
	struct passers *p = t->s;
	p->rc[t->i] = passer(p, t->i);
	return NULL;
}

/* Retained backward passes over one graph, from four threads at once on
 * one pool: each records its own gradient nodes into the graph the others
 * are running, and gets exact results. */
CHECKED_TEST(higher, retained_passes_record_from_several_threads_at_once)
{
	for (int h = 0; h < N_HOWS; h++) {
		struct how how;
		how_open(&how, h);
		struct adg_stats before = stats();
		const double x = 0.7, y = -1.3;
		struct xy s = build_f(x, y);
		struct passers p = {
			.x = s.x, .y = s.y, .f = s.f, .exec = how.exec};
		run_threads(PASSERS, passer_thread, &p);
		double fx = 2 * x * y + cos(x) * y, fy = x * x + sin(x);
		double h00 = 2 * y - y * sin(x), h01 = 2 * x + cos(x);
		for (int i = 0; i < PASSERS; i++) {
			cr_expect_eq(p.rc[i], 0, "thread %d: %s", i,
				     adg_error_name(p.rc[i]));
			check(p.grad[i][0], fx, "df/dx", h, x);
			check(p.grad[i][1], fy, "df/dy", h, x);
			check(p.hv[i][0], h00 + h01, "(H1)_x", h, x);
			check(p.hv[i][1], h01, "(H1)_y", h, x);
		}
		cr_expect_eq(stats().live_steps, before.live_steps + 5,
			     "gradient nodes outlived their handles");
		drop_f(&s);
		expect_back_to(&before);
		how_close(&how);
	}
}
