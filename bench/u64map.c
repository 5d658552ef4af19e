/* A small open-addressing hash map from nonzero u64 keys to u64 values,
 * used by the seed port's locator and by the seed and floor gradient
 * containers. */
#include "bench.h"

#include <stdlib.h>
#include <string.h>

static size_t home(const u64map *m, uint64_t key)
{
	return (size_t)((key * UINT64_C(0x9e3779b97f4a7c15)) >> 17) &
	       (m->cap - 1);
}

static void alloc_arrays(u64map *m, size_t cap)
{
	m->keys = calloc(cap, sizeof *m->keys);
	m->vals = calloc(cap, sizeof *m->vals);
	if (m->keys == NULL || m->vals == NULL)
		abort(); /* the bench has no use for a half-built run */
	m->cap = cap;
}

void u64map_init(u64map *m, size_t expected)
{
	size_t cap = 16;
	while (cap / 4 * 3 < expected)
		cap *= 2;
	m->count = 0;
	alloc_arrays(m, cap);
}

void u64map_destroy(u64map *m)
{
	free(m->keys);
	free(m->vals);
	m->keys = m->vals = NULL;
	m->cap = m->count = 0;
}

void u64map_clear(u64map *m)
{
	memset(m->keys, 0, m->cap * sizeof *m->keys);
	m->count = 0;
}

static size_t probe(const u64map *m, uint64_t key)
{
	size_t i = home(m, key);
	while (m->keys[i] != 0 && m->keys[i] != key)
		i = (i + 1) & (m->cap - 1);
	return i;
}

static void grow(u64map *m)
{
	uint64_t *keys = m->keys, *vals = m->vals;
	size_t cap = m->cap;
	alloc_arrays(m, cap * 2);
	for (size_t i = 0; i < cap; i++)
		if (keys[i] != 0) {
			size_t j = probe(m, keys[i]);
			m->keys[j] = keys[i];
			m->vals[j] = vals[i];
		}
	free(keys);
	free(vals);
}

uint64_t *u64map_slot(u64map *m, uint64_t key)
{
	size_t i = probe(m, key);
	if (m->keys[i] == 0) {
		if (m->count + 1 > m->cap / 4 * 3) {
			grow(m);
			i = probe(m, key);
		}
		m->keys[i] = key;
		m->vals[i] = 0;
		m->count++;
	}
	return &m->vals[i];
}

uint64_t *u64map_find(const u64map *m, uint64_t key)
{
	size_t i = probe(m, key);
	return m->keys[i] == 0 ? NULL : &m->vals[i];
}

bool u64map_remove(u64map *m, uint64_t key, uint64_t *val)
{
	size_t i = probe(m, key), mask = m->cap - 1;
	if (m->keys[i] == 0)
		return false;
	if (val != NULL)
		*val = m->vals[i];
	/* Backward-shift deletion: no tombstones. */
	size_t j = i;
	for (;;) {
		j = (j + 1) & mask;
		if (m->keys[j] == 0)
			break;
		size_t h = home(m, m->keys[j]);
		bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
		if (!stays) {
			m->keys[i] = m->keys[j];
			m->vals[i] = m->vals[j];
			i = j;
		}
	}
	m->keys[i] = 0;
	m->count--;
	return true;
}

bool u64map_next(const u64map *m, size_t *pos, uint64_t *key, uint64_t *val)
{
	while (*pos < m->cap) {
		size_t i = (*pos)++;
		if (m->keys[i] != 0) {
			*key = m->keys[i];
			if (val != NULL)
				*val = m->vals[i];
			return true;
		}
	}
	return false;
}
