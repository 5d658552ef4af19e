/* The tensor layer of the example trainers (see tensor.h). */
#include "tensor.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>

/* ------------------------------------------------------- gradient pool */

static size_t elements(const struct tensor *t)
{
	return (size_t)t->rows * (size_t)t->cols;
}

struct tensor *pool_get(struct tensor_pool *pool, int rows, int cols)
{
	size_t n = (size_t)rows * (size_t)cols, i;
	for (i = 0; i < pool->n_sizes && pool->sizes[i].elements != n; i++)
		;
	if (i == pool->n_sizes && i < TENSOR_POOL_SIZES) {
		pool->sizes[i].elements = n;
		pool->sizes[i].free = NULL;
		pool->n_sizes++;
	}
	struct tensor *t = NULL;
	if (i < pool->n_sizes && pool->sizes[i].free != NULL) {
		t = pool->sizes[i].free;
		pool->sizes[i].free = t->next_free;
	} else {
		t = malloc(sizeof *t + n * sizeof(float));
		if (t == NULL)
			return NULL;
	}
	t->rows = rows;
	t->cols = cols;
	t->next_free = NULL;
	pool->outstanding++;
	return t;
}

void pool_put(struct tensor_pool *pool, struct tensor *t)
{
	size_t n = elements(t), i;
	pool->outstanding--;
	for (i = 0; i < pool->n_sizes; i++) {
		if (pool->sizes[i].elements == n) {
			t->next_free = pool->sizes[i].free;
			pool->sizes[i].free = t;
			return;
		}
	}
	free(t); /* a size beyond the pool's table: not kept */
}

void pool_clear(struct tensor_pool *pool)
{
	for (size_t i = 0; i < pool->n_sizes; i++) {
		while (pool->sizes[i].free != NULL) {
			struct tensor *t = pool->sizes[i].free;
			pool->sizes[i].free = t->next_free;
			free(t);
		}
	}
}

void tensor_add(struct tensor *sum, const struct tensor *value)
{
	assert(sum->rows == value->rows && sum->cols == value->cols);
	for (size_t i = 0, n = elements(sum); i < n; i++)
		sum->data[i] += value->data[i];
}

/* Folds value into *sum, which keeps its buffer; value goes back to the
 * pool. Both are gradients of the same node, so of the same shape. */
static int grad_add(void **sum, void *value, void *ctx)
{
	tensor_add(*sum, value);
	pool_put(ctx, value);
	return 0;
}

static void grad_free(void *value, void *ctx)
{
	pool_put(ctx, value);
}

adg_grad_ops tensor_grad_ops(struct tensor_pool *pool)
{
	return (adg_grad_ops){.add = grad_add, .free = grad_free, .ctx = pool};
}

/* --------------------------------------------------------------- arena */

struct arena_block {
	struct arena_block *next;
	max_align_t data[]; /* aligned for any type */
};

void *arena_alloc(struct arena *arena, size_t size)
{
	const size_t align = _Alignof(max_align_t);
	size = (size + align - 1) / align * align;
	if (size <= arena->capacity - arena->used) {
		void *p = arena->base + arena->used;
		arena->used += size;
		return p;
	}
	struct arena_block *block = malloc(sizeof *block + size);
	if (block == NULL)
		return NULL;
	block->next = arena->overflow;
	arena->overflow = block;
	arena->overflow_bytes += size;
	return block->data;
}

struct tensor *arena_tensor(struct arena *arena, int rows, int cols)
{
	size_t n = (size_t)rows * (size_t)cols;
	struct tensor *t = arena_alloc(arena, sizeof *t + n * sizeof(float));
	if (t != NULL) {
		t->rows = rows;
		t->cols = cols;
		t->next_free = NULL;
	}
	return t;
}

void arena_reset(struct arena *arena)
{
	if (arena->overflow != NULL) {
		/* Next time, one block that holds all of this time's. */
		size_t wanted = arena->capacity + arena->overflow_bytes;
		while (arena->overflow != NULL) {
			struct arena_block *next = arena->overflow->next;
			free(arena->overflow);
			arena->overflow = next;
		}
		arena->overflow_bytes = 0;
		free(arena->base);
		arena->base = malloc(wanted);
		arena->capacity = arena->base != NULL ? wanted : 0;
	}
	arena->used = 0;
}

void arena_free(struct arena *arena)
{
	arena_reset(arena);
	free(arena->base);
	arena->base = NULL;
	arena->capacity = 0;
}

/* ------------------------------------------------------------ recorder */

struct recorded {
	adg_node *node;
	struct recorded *next;
};

int recorder_reset(struct recorder *rec)
{
	int rc = 0;
	/* Any order: a node goes when nothing that could still run its step
	 * holds it. */
	for (struct recorded *r = rec->nodes; r != NULL; r = r->next) {
		int unref = adg_node_unref(r->node);
		rc = rc != 0 ? rc : unref;
	}
	rec->nodes = NULL;
	arena_reset(&rec->arena);
	return rc;
}

/* Records a node for inputs[0..n) whose step is backward(closure): its
 * parents are the inputs that have a node, and slots[i] is input i's slot
 * among them (-1 for a constant). With no such input the value is a
 * constant too and *out is NULL. */
static int record(struct recorder *rec, const struct var *inputs, size_t n,
		  int *slots, adg_backward_fn backward, const char *name,
		  void *closure, adg_node **out)
{
	adg_node *parents[2];
	size_t n_parents = 0;
	assert(n <= 2);
	for (size_t i = 0; i < n; i++) {
		slots[i] = inputs[i].node != NULL ? (int)n_parents : -1;
		if (inputs[i].node != NULL)
			parents[n_parents++] = inputs[i].node;
	}
	*out = NULL;
	if (n_parents == 0)
		return 0;
	/* Allocated first, so that nothing can fail once the node exists. */
	struct recorded *r = arena_alloc(&rec->arena, sizeof *r);
	if (r == NULL)
		return ADG_ENOMEM;
	adg_step step = {.backward = backward, .user = closure, .name = name};
	int rc = adg_op(rec->registry, parents, n_parents, &step, out);
	if (rc != 0)
		return rc;
	r->node = *out;
	r->next = rec->nodes;
	rec->nodes = r;
	return 0;
}

/* Hands grad to the parent at slot; libadg owns it from here, and frees
 * it with the pool's ops if this fails. By slot, not by id: no lookup. */
static int pass(adg_step_call *call, int slot, struct tensor *grad)
{
	return adg_step_give(call, (size_t)slot, grad);
}

/* -------------------------------------------------------------- matmul */

void matmul_nt(const struct tensor *x, const struct tensor *w, struct tensor *y)
{
	assert(x->cols == w->cols && y->rows == x->rows && y->cols == w->rows);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, x->rows, w->rows,
		    x->cols, 1.0f, x->data, x->cols, w->data, w->cols, 0.0f,
		    y->data, y->cols);
}

/* The step keeps the forward's operands: the arena holds x until the
 * backward has run. w is a parameter: the thread's own copy of it, or the
 * shared one when nothing can change it before this step has run (a
 * gradient reducer updates it once every thread has given its gradient,
 * which this step computes after its last read of w). Either way the
 * gradient is that of the weights the forward used. */
struct matmul_step {
	struct tensor_pool *pool;
	const struct tensor *x, *w;
	int slots[2]; /* of x and w */
};

static int matmul_backward(adg_step_call *call, void *user)
{
	const struct matmul_step *s = user;
	const struct tensor *g = call->grad, *x = s->x, *w = s->w;
	if (g == NULL)
		return 0; /* nothing reached this node: nothing to pass on */
	if (s->slots[0] >= 0) { /* dx = g w: n x m times m x k */
		struct tensor *dx = pool_get(s->pool, x->rows, x->cols);
		if (dx == NULL)
			return ADG_ENOMEM;
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->rows,
			    w->cols, g->cols, 1.0f, g->data, g->cols, w->data,
			    w->cols, 0.0f, dx->data, dx->cols);
		int rc = pass(call, s->slots[0], dx);
		if (rc != 0)
			return rc;
	}
	if (s->slots[1] >= 0) { /* dw = g^T x: m x n times n x k */
		struct tensor *dw = pool_get(s->pool, w->rows, w->cols);
		if (dw == NULL)
			return ADG_ENOMEM;
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, g->cols,
			    x->cols, g->rows, 1.0f, g->data, g->cols, x->data,
			    x->cols, 0.0f, dw->data, dw->cols);
		return pass(call, s->slots[1], dw);
	}
	return 0;
}

int op_matmul_nt(struct recorder *rec, struct var x, struct var w,
		 struct var *out)
{
	struct tensor *y =
		arena_tensor(&rec->arena, x.value->rows, w.value->rows);
	struct matmul_step *s = arena_alloc(&rec->arena, sizeof *s);
	if (y == NULL || s == NULL)
		return ADG_ENOMEM;
	matmul_nt(x.value, w.value, y);
	*s = (struct matmul_step){
		.pool = rec->pool, .x = x.value, .w = w.value};
	struct var inputs[2] = {x, w};
	out->value = y;
	return record(rec, inputs, 2, s->slots, matmul_backward, "matmul", s,
		      &out->node);
}

/* ------------------------------------------------------------ bias add */

void add_bias(const struct tensor *x, const struct tensor *bias,
	      struct tensor *y)
{
	assert(bias->rows == 1 && bias->cols == x->cols);
	for (int i = 0; i < x->rows; i++)
		for (int j = 0; j < x->cols; j++)
			y->data[i * x->cols + j] =
				x->data[i * x->cols + j] + bias->data[j];
}

struct bias_step {
	struct tensor_pool *pool;
	int slots[2]; /* of x and the bias */
};

static int bias_backward(adg_step_call *call, void *user)
{
	const struct bias_step *s = user;
	struct tensor *g = call->grad;
	if (g == NULL)
		return 0;
	if (s->slots[1] >= 0) { /* d bias: g summed over the rows */
		struct tensor *db = pool_get(s->pool, 1, g->cols);
		if (db == NULL)
			return ADG_ENOMEM;
		for (int j = 0; j < g->cols; j++)
			db->data[j] = 0;
		for (int i = 0; i < g->rows; i++)
			for (int j = 0; j < g->cols; j++)
				db->data[j] += g->data[i * g->cols + j];
		int rc = pass(call, s->slots[1], db);
		if (rc != 0)
			return rc;
	}
	if (s->slots[0] >= 0) {
		/* dx is g itself: take it rather than copy it. */
		call->grad = NULL;
		return pass(call, s->slots[0], g);
	}
	return 0;
}

int op_add_bias(struct recorder *rec, struct var x, struct var bias,
		struct var *out)
{
	struct tensor *y =
		arena_tensor(&rec->arena, x.value->rows, x.value->cols);
	struct bias_step *s = arena_alloc(&rec->arena, sizeof *s);
	if (y == NULL || s == NULL)
		return ADG_ENOMEM;
	add_bias(x.value, bias.value, y);
	s->pool = rec->pool;
	struct var inputs[2] = {x, bias};
	out->value = y;
	return record(rec, inputs, 2, s->slots, bias_backward, "bias", s,
		      &out->node);
}

/* ---------------------------------------------------------------- ReLU */

void relu(const struct tensor *x, struct tensor *y)
{
	for (size_t i = 0, n = elements(x); i < n; i++)
		y->data[i] = x->data[i] > 0 ? x->data[i] : 0;
}

struct relu_step {
	const struct tensor *y; /* the output: where it is 0, so is dx */
	int slot;
};

static int relu_backward(adg_step_call *call, void *user)
{
	const struct relu_step *s = user;
	struct tensor *g = call->grad;
	if (g == NULL)
		return 0;
	call->grad = NULL; /* masked in place and passed on */
	for (size_t i = 0, n = elements(g); i < n; i++)
		if (!(s->y->data[i] > 0))
			g->data[i] = 0;
	return pass(call, s->slot, g);
}

int op_relu(struct recorder *rec, struct var x, struct var *out)
{
	struct tensor *y =
		arena_tensor(&rec->arena, x.value->rows, x.value->cols);
	struct relu_step *s = arena_alloc(&rec->arena, sizeof *s);
	if (y == NULL || s == NULL)
		return ADG_ENOMEM;
	relu(x.value, y);
	s->y = y;
	out->value = y;
	return record(rec, &x, 1, &s->slot, relu_backward, "relu", s,
		      &out->node);
}

/* --------------------------------------------------- softmax and loss */

double softmax_xent(const struct tensor *logits, const int *labels,
		    struct tensor *probs, int *correct)
{
	double loss = 0;
	int right = 0, cols = logits->cols;
	for (int i = 0; i < logits->rows; i++) {
		const float *z = logits->data + (size_t)i * cols;
		float *p = probs->data + (size_t)i * cols;
		int best = 0;
		for (int j = 1; j < cols; j++)
			if (z[j] > z[best])
				best = j;
		/* Shifted by the largest logit, so that expf cannot
		 * overflow. */
		float sum = 0;
		for (int j = 0; j < cols; j++) {
			p[j] = expf(z[j] - z[best]);
			sum += p[j];
		}
		for (int j = 0; j < cols; j++)
			p[j] /= sum;
		loss += (double)(logf(sum) - (z[labels[i]] - z[best]));
		right += best == labels[i];
	}
	*correct = right;
	return loss;
}

struct xent_step {
	struct tensor_pool *pool;
	const struct tensor *probs;
	const int *labels;
	int slot;
};

static int xent_backward(adg_step_call *call, void *user)
{
	const struct xent_step *s = user;
	const struct tensor *g = call->grad, *p = s->probs;
	if (g == NULL)
		return 0;
	/* d mean / d logits[i][j] = (p[i][j] - [j == label i]) / rows */
	struct tensor *d = pool_get(s->pool, p->rows, p->cols);
	if (d == NULL)
		return ADG_ENOMEM;
	float scale = g->data[0] / (float)p->rows;
	for (int i = 0; i < p->rows; i++)
		for (int j = 0; j < p->cols; j++)
			d->data[i * p->cols + j] =
				scale * (p->data[i * p->cols + j] -
					 (float)(j == s->labels[i]));
	return pass(call, s->slot, d);
}

int op_softmax_xent(struct recorder *rec, struct var logits, const int *labels,
		    struct var *loss, int *correct)
{
	int rows = logits.value->rows;
	struct tensor *probs =
		arena_tensor(&rec->arena, rows, logits.value->cols);
	struct tensor *y = arena_tensor(&rec->arena, 1, 1);
	struct xent_step *s = arena_alloc(&rec->arena, sizeof *s);
	int *kept = arena_alloc(&rec->arena, (size_t)rows * sizeof *kept);
	if (probs == NULL || y == NULL || s == NULL || kept == NULL)
		return ADG_ENOMEM;
	for (int i = 0; i < rows; i++)
		kept[i] = labels[i];
	y->data[0] =
		(float)(softmax_xent(logits.value, labels, probs, correct) /
			rows);
	*s = (struct xent_step){
		.pool = rec->pool, .probs = probs, .labels = kept};
	loss->value = y;
	return record(rec, &logits, 1, &s->slot, xent_backward, "softmax_xent",
		      s, &loss->node);
}
