/*
 * How the bench's adg side carries a gradient (impl_adg.c, layer.c): a
 * double inside libadg's opaque pointer, its bits XORed with a NaN payload
 * that arithmetic never yields, so that no value becomes NULL. Nothing is
 * allocated per gradient; bench_adg_grad_ops folds and frees them.
 */
#ifndef ADG_BENCH_ADG_GRADS_H
#define ADG_BENCH_ADG_GRADS_H

#include <adg.h>
#include <stdint.h>
#include <string.h>

#define BENCH_GRAD_TAG UINT64_C(0x7ff4d1a9c0ffee01)

static inline void *bench_grad_encode(double d)
{
	uint64_t bits;
	memcpy(&bits, &d, sizeof bits);
	return (void *)(uintptr_t)(bits ^ BENCH_GRAD_TAG);
}

static inline double bench_grad_decode(const void *p)
{
	uint64_t bits = (uint64_t)(uintptr_t)p ^ BENCH_GRAD_TAG;
	double d;
	memcpy(&d, &bits, sizeof d);
	return d;
}

/* add sums two encoded doubles; free has nothing to free. */
extern const adg_grad_ops bench_adg_grad_ops;

#endif
