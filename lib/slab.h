/*
 * Node slabs (slab.c): the memory nodes with few parents live in, and the
 * inline fast paths of taking and freeing it, which read the calling
 * thread's shard (internal.h). Rules: I22 to I24 in docs/concurrency.md.
 */
#ifndef ADG_SLAB_H
#define ADG_SLAB_H

#include "internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define ADG_SLAB_ASAN 1
#endif
#if defined(ADG_ASSERTIONS) && __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define ADG_SLAB_MEMCHECK 1
#endif

/*
 * Node memory of libadg's own (slab.c). A slab is one block of the
 * registry's allocator, owned by one shard and holding nodes of one size
 * class, bumped in the order they are made, so that a graph one thread
 * made lies in memory in the order its backward walks it. Each slab page
 * (ADG_SLAB_PAGE) that holds nodes starts with the slab's address, which
 * is how a node finds its slab. The owner reuses freed room (its free
 * list) before bumping; other threads' frees go on a lock-free list the
 * owner takes when it runs out of room. A slab goes back to the allocator
 * once all its nodes are free.
 */
/* 8 KiB, two of the system's pages: a node never straddles a slab page,
 * so each page loses the slab's address and the room short of a node at
 * its end, 24 bytes in 8 KiB for 96-byte nodes where 4 KiB pages lost 64
 * in 4 KiB (1.6 % of a graph's memory). */
#define ADG_SLAB_PAGE 8192

/* A free node's first word, linking it into a slab's free list. */
struct adg_slab_free {
	struct adg_slab_free *next;
};

struct adg_slab {
	/* Other threads' frees: a stack of free nodes, pushed with a compare
	 * and swap, its low bit set once the slab is on its owner's
	 * slabs_freed_remotely (the pusher that set it put it there), and
	 * cleared when the owner takes the stack. */
	_Atomic uintptr_t freed_remotely;
	struct adg_slab *next_freed_remotely;
	/* Set at creation, never changed: any thread may read it. */
	struct adg_shard *owner;
	uint32_t cls;
	uint32_t node_size;
	size_t bytes; /* asked of the allocator, or mapped */
	bool mapped;  /* a mapping of libadg's own, for huge pages */
	char *first_page;
	char *end; /* of the last whole page */

	/* The owner's, a line away from freed_remotely (a slab is a block
	 * of the allocator's, aligned as malloc's are, so not _Alignas). */
	char apart[ADG_CACHELINE];
	struct adg_slab_free *free_list;
	char *bump;	/* where the next node is cut */
	char *page_end; /* of bump's page */
	uint32_t used;	/* nodes cut or reused, less the frees taken */
	/* Current, or in the shard's slabs_with_room: a free needs not list
	 * it for the owner to find its room. */
	bool findable;
	struct adg_slab *prev_with_room, *next_with_room;
	struct adg_slab *prev, *next; /* in the shard's slabs */
};

/* The slab node p lies in. */
static inline struct adg_slab *adg_slab_of(const void *p)
{
	return *(struct adg_slab *const *)((uintptr_t)p &
					   ~(uintptr_t)(ADG_SLAB_PAGE - 1));
}

void *adg_slab_alloc_slow(struct adg_shard *shard, uint32_t cls);
void adg_slab_free_slow(struct adg_shard *shard, struct adg_slab *slab);
void adg_slab_free_remote(struct adg_slab *slab, void *p);
/* A freed node's first word links it into a free list: it stays readable,
 * the rest is poisoned, so that a use after free is caught by ASan (and by
 * memcheck in builds with assertions) as it was with one block a node.
 * Nothing in other builds. */
static inline void adg_slab_poison(void *p, size_t size)
{
	char *rest = (char *)p + sizeof(struct adg_slab_free);
	size_t len = size - sizeof(struct adg_slab_free);
	(void)rest;
	(void)len;
#ifdef ADG_SLAB_ASAN
	ASAN_POISON_MEMORY_REGION(rest, len);
#endif
#ifdef ADG_SLAB_MEMCHECK
	VALGRIND_MAKE_MEM_NOACCESS(rest, len);
#endif
}

static inline void adg_slab_unpoison(void *p, size_t size)
{
	(void)p;
	(void)size;
#ifdef ADG_SLAB_ASAN
	ASAN_UNPOISON_MEMORY_REGION(p, size);
#endif
#ifdef ADG_SLAB_MEMCHECK
	VALGRIND_MAKE_MEM_UNDEFINED(p, size);
#endif
}

/* A node of class cls (its parent count) for the calling thread, which
 * owns shard; NULL when the allocator fails. */
static inline void *adg_slab_alloc(struct adg_shard *shard, uint32_t cls)
{
	ADG_ASSERT(cls < ADG_SLAB_CLASSES); /* I23 */
	struct adg_slab *s = shard->slab_current[cls];
	if (adg_likely(s != NULL)) {
		ADG_ASSERT(s->owner == shard); /* I22 */
		void *p = s->free_list;
		if (p != NULL) {
			s->free_list = s->free_list->next;
		} else if (s->bump + s->node_size <= s->page_end) {
			p = s->bump;
			s->bump += s->node_size;
		} else {
			return adg_slab_alloc_slow(shard, cls);
		}
		s->used++;
		adg_slab_unpoison(p, s->node_size);
		return p;
	}
	return adg_slab_alloc_slow(shard, cls);
}

/* Frees node memory p of a slab's; shard is the calling thread's (or the
 * registry's fallback shard). */
static inline void adg_slab_free(struct adg_shard *shard, void *p)
{
	struct adg_slab *s = adg_slab_of(p);
	if (adg_unlikely(s->owner != shard)) {
		adg_slab_free_remote(s, p);
		return;
	}
	ADG_ASSERT(s->used > 0); /* I24 */
	struct adg_slab_free *f = p;
	f->next = s->free_list;
	s->free_list = f;
	adg_slab_poison(p, s->node_size);
	/* The slab goes back, or gets listed as having room. */
	if (adg_unlikely(--s->used == 0 || !s->findable))
		adg_slab_free_slow(shard, s);
}

/* Registry teardown: gives a shard's node slabs back to the allocator. */
void adg_slab_free_all(struct adg_shard *shard);

#endif /* ADG_SLAB_H */
