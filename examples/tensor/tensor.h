/* A small tensor layer on libadg, for the trainers in examples/digits and
 * examples/fashion: dense float matrices, and the ops a multi-layer
 * perceptron needs (matmul through CBLAS, bias add, ReLU, softmax
 * cross-entropy), each recorded as an adg_op whose step computes its
 * parents' gradients.
 *
 * Memory, per thread, so that a training step calls malloc only while the
 * first steps find their sizes:
 * - forward values and step closures come from an arena that is emptied
 *   once the step's backward has run and its nodes are dropped;
 * - gradients come from a pool of tensors by size, and go back to it
 *   through the gradient ops (tensor_grad_ops): add sums into the
 *   gradient it keeps and gives the other back, free gives one back.
 * Everything here belongs to one thread: the backward runs on the thread
 * that records the graph (no executor), so the steps, the gradient ops
 * and the ready hook all run there too. A gradient the hook hands on to
 * another thread (a gradient reducer's sum, say) may be read and written
 * there, but goes back to its pool on its own thread: adg_reducer's
 * release callback runs on the participant that gave the gradient. */
#ifndef EXAMPLES_TENSOR_H
#define EXAMPLES_TENSOR_H

#include <adg.h>
#include <stddef.h>

/* A rows x cols matrix of floats, row-major; a vector is 1 x n. */
struct tensor {
	int rows, cols;
	struct tensor *next_free; /* in its pool's free list */
	float data[];
};

/* Gradient tensors, recycled by size. */
#define TENSOR_POOL_SIZES 16
struct tensor_pool {
	struct {
		size_t elements;
		struct tensor *free;
	} sizes[TENSOR_POOL_SIZES];
	size_t n_sizes;
	long outstanding; /* handed out, not yet given back: 0 when idle */
};

/* A tensor of rows x cols from the pool (contents undefined), or NULL
 * when out of memory. */
struct tensor *pool_get(struct tensor_pool *pool, int rows, int cols);
/* Gives t back to the pool it came from. */
void pool_put(struct tensor_pool *pool, struct tensor *t);
/* Frees every tensor the pool holds (not those handed out). */
void pool_clear(struct tensor_pool *pool);

/* sum += value, element by element; both of the same shape. */
void tensor_add(struct tensor *sum, const struct tensor *value);

/* libadg's gradient ops over the tensors of pool. */
adg_grad_ops tensor_grad_ops(struct tensor_pool *pool);

/* Bump allocation for one training step's forward values and closures. */
struct arena_block;
struct arena {
	char *base;
	size_t capacity, used;
	/* Blocks allocated when base was full, freed by arena_reset, which
	 * then grows base to hold them all next time. */
	struct arena_block *overflow;
	size_t overflow_bytes;
};

/* size bytes aligned for any type, valid until arena_reset; NULL when
 * out of memory. */
void *arena_alloc(struct arena *arena, size_t size);
/* A rows x cols tensor in the arena (contents undefined), or NULL. */
struct tensor *arena_tensor(struct arena *arena, int rows, int cols);
void arena_reset(struct arena *arena);
void arena_free(struct arena *arena);

/* Records the graph of one training step: where its values live and the
 * nodes it made, which recorder_reset drops. */
struct recorded;
struct recorder {
	adg_registry *registry;
	struct arena arena;
	struct tensor_pool *pool; /* where steps take gradient tensors */
	struct recorded *nodes;	  /* the nodes this step's ops made */
};

/* Drops the nodes recorded so far (their graph goes with them) and
 * empties the arena. Call it after the backward, or to give up on a
 * graph: its steps are released unrun. Returns 0 or the first error of
 * adg_node_unref. */
int recorder_reset(struct recorder *rec);

/* A value of the forward pass and the node that made it: node is NULL
 * for a constant (an input batch), which gets no gradient. */
struct var {
	struct tensor *value;
	adg_node *node;
};

/* Forward kernels, for the ops below and for evaluation without a graph.
 * y = x w^T: x is n x k, w is m x k, y is n x m. */
void matmul_nt(const struct tensor *x, const struct tensor *w,
	       struct tensor *y);
void add_bias(const struct tensor *x, const struct tensor *bias,
	      struct tensor *y);
void relu(const struct tensor *x, struct tensor *y);
/* Row-wise softmax of logits into probs; returns the summed cross-entropy
 * -log probs[i][labels[i]] and counts the rows whose largest logit is
 * their label into *correct. */
double softmax_xent(const struct tensor *logits, const int *labels,
		    struct tensor *probs, int *correct);

/* The ops: each computes its value into the recorder's arena and records
 * a node whose parents are its non-constant inputs. Each returns 0 or a
 * libadg error code; on error nothing new is recorded. */
int op_matmul_nt(struct recorder *rec, struct var x, struct var w,
		 struct var *out);
int op_add_bias(struct recorder *rec, struct var x, struct var bias,
		struct var *out);
int op_relu(struct recorder *rec, struct var x, struct var *out);
/* The mean cross-entropy over the rows of logits, a 1 x 1 tensor; counts
 * the rows predicted right into *correct. */
int op_softmax_xent(struct recorder *rec, struct var logits, const int *labels,
		    struct var *loss, int *correct);

#endif /* EXAMPLES_TENSOR_H */
