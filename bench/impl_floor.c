/*
 * floor: a per-thread tape with no sharing and no locking, the physical
 * floor for the per-node cost. Nodes are allocated as libadg allocates
 * them (malloc), appended to the calling thread's tape, counted with plain
 * integers; backward walks the tape from the root down, running the steps
 * of marked nodes and marking their parents. Only a thread's own nodes and
 * shared leaves (which nothing writes) may be parents, which is what the
 * workloads it runs do.
 */
#include "bench.h"

#include <stdatomic.h>
#include <stdlib.h>

struct fnode {
	uint64_t id;
	long refs;  /* handles + non-leaf child slots; this thread's only */
	size_t pos; /* on the tape */
	uint32_t n;
	bool leaf, marked, consumed;
	const bench_step *step;
	struct fnode *parents[]; /* NULL for a leaf; then n ids */
};

static const uint64_t *ids_of(const struct fnode *f)
{
	return (const uint64_t *)(f->parents + f->n);
}

struct tape {
	struct fnode **nodes;
	size_t len, cap, live;
	uint64_t next_id;
	u64map grads;
};

static __thread struct tape tape;
/* Ranges of ids for threads, taken once per thread. */
static atomic_uint_fast64_t id_ranges = 1;

static uint64_t next_id(void)
{
	if ((tape.next_id & 0xffffffff) == 0)
		tape.next_id = atomic_fetch_add(&id_ranges, 1) << 32 | 1;
	return tape.next_id++;
}

static void *f_open(void)
{
	return (void *)1; /* nothing is shared */
}

static void f_close(void *reg)
{
	(void)reg;
}

static struct fnode *fnode_new(uint32_t n)
{
	struct fnode *f = malloc(sizeof *f + n * (sizeof(void *) + 8));
	if (f == NULL)
		abort();
	f->id = next_id();
	f->refs = 1;
	f->n = n;
	f->marked = f->consumed = false;
	return f;
}

static void *f_leaf(void *reg)
{
	(void)reg;
	struct fnode *f = fnode_new(0);
	f->leaf = true;
	f->pos = SIZE_MAX;
	f->step = NULL;
	return f;
}

static void *f_op(void *reg, void *const *parents, size_t n,
		  const bench_step *step)
{
	(void)reg;
	struct fnode *f = fnode_new((uint32_t)n);
	uint64_t *ids = (uint64_t *)(f->parents + n);
	f->leaf = false;
	f->step = step;
	for (size_t i = 0; i < n; i++) {
		struct fnode *p = parents[i];
		ids[i] = p->id;
		f->parents[i] = p->leaf ? NULL : p;
		if (!p->leaf)
			p->refs++;
	}
	if (tape.len == tape.cap) {
		tape.cap = tape.cap ? 2 * tape.cap : 1024;
		tape.nodes = realloc(tape.nodes, tape.cap * sizeof *tape.nodes);
		if (tape.nodes == NULL)
			abort();
	}
	f->pos = tape.len;
	tape.nodes[tape.len++] = f;
	tape.live++;
	return f;
}

static void release(struct fnode *f)
{
	while (f != NULL && --f->refs == 0) {
		struct fnode *next = NULL;
		if (!f->leaf) {
			tape.nodes[f->pos] = NULL;
			if (--tape.live == 0)
				tape.len = 0;
			/* n > 0: it still holds its parents (unrun, or
			 * consumed and not yet let go of them) */
			if (f->n > 0) {
				/* parents but the first recurse; chains are
				 * followed in the loop */
				for (uint32_t i = 1; i < f->n; i++)
					release(f->parents[i]);
				next = f->n > 0 ? f->parents[0] : NULL;
			}
		}
		free(f);
		f = next;
	}
}

static void f_unref(void *reg, void *node)
{
	(void)reg;
	release(node);
}

static uint64_t f_id(void *node)
{
	return ((struct fnode *)node)->id;
}

static int f_backward(void *reg, void *root, void **grads)
{
	(void)reg;
	struct fnode *r = root;
	if (tape.grads.cap == 0)
		u64map_init(&tape.grads, 64);
	u64map_clear(&tape.grads);
	*grads = &tape.grads;
	if (r->leaf) {
		u64map_add_double(&tape.grads, r->id, 1.0);
		return 0;
	}
	if (r->consumed)
		return -1;
	r->marked = true;
	u64map_add_double(&tape.grads, r->id, 1.0);
	size_t top = r->pos;
	for (size_t i = top + 1; i-- > 0;) {
		struct fnode *f = tape.nodes[i];
		if (f == NULL || !f->marked)
			continue;
		double g = u64map_take_double(&tape.grads, f->id);
		bench_call c = {&bench_floor, &tape.grads, g, ids_of(f), f->n};
		int rc = f->step->run(&c, f->step);
		f->marked = false;
		f->consumed = true;
		for (uint32_t k = 0; k < f->n; k++)
			if (f->parents[k] != NULL)
				f->parents[k]->marked = true;
		if (rc != 0)
			return rc;
	}
	/* The consumed nodes let go of their parents. */
	for (size_t i = top + 1; i-- > 0;) {
		struct fnode *f = i < tape.len ? tape.nodes[i] : NULL;
		if (f == NULL || !f->consumed || f->n == 0)
			continue;
		uint32_t n = f->n;
		f->n = 0;  /* nothing left to let go of */
		f->refs++; /* hold f while its parents go */
		for (uint32_t k = 0; k < n; k++)
			release(f->parents[k]);
		release(f);
	}
	return 0;
}

static void f_grads_free(void *grads)
{
	(void)grads; /* the thread's map, cleared at the next backward */
}

static void f_thread_begin(void *reg)
{
	(void)reg;
}

static void f_thread_end(void *reg)
{
	(void)reg;
	free(tape.nodes);
	u64map_destroy(&tape.grads);
	tape = (struct tape){0};
}

const bench_impl bench_floor = {
	.name = "floor",
	.has_graphs = false,
	.open = f_open,
	.close = f_close,
	.leaf = f_leaf,
	.op = f_op,
	.unref = f_unref,
	.id = f_id,
	.backward = f_backward,
	.grad = u64map_get_double,
	.grads_free = f_grads_free,
	.add_grad = u64map_add_slot,
	.graph_id = NULL,
	.thread_begin = f_thread_begin,
	.thread_end = f_thread_end,
};
