/*
 * Node slabs: node memory of libadg's own (see slab.h).
 *
 * Why not a block of the allocator's per node: glibc keeps memory order for
 * a rebuilt graph only by coalescing freed neighbours, which it does not do
 * for chunks of 128 bytes or less (its fastbins), so a node could not get
 * smaller than that without its graph's backward losing memory order; and
 * every chunk carries a header and rounding of its own.
 *
 * The owner of a slab is a shard, so one thread at a time: it cuts, reuses
 * and lists with plain loads and stores. Other threads free through the
 * slab's freed_remotely stack and the owner shard's slabs_freed_remotely
 * list of slabs; the owner takes both when it runs out of room, so a slab
 * whose nodes other threads freed goes back, or is reused, then. A shard
 * whose thread exited keeps its slabs, and what other threads free of them,
 * until a thread adopts it or the registry goes: at most what that thread
 * had made at once.
 */
#include "slab.h"

#include <sys/mman.h>
#if defined(ADG_SLAB_ASAN) && __has_include(<sanitizer/lsan_interface.h>)
#include <sanitizer/lsan_interface.h>
#define SLAB_LSAN_ROOTS 1
#endif

/* 32 KiB, doubling with each slab the class holds, up to 1 MiB: a thread
 * that makes small graphs holds little, and the partial slab pages at a
 * slab's two ends (8 KiB together, on average, mostly never touched) are a
 * small part of a big one. At least 32 KiB, so that a slab of an
 * allocator's, aligned as malloc's are, has whole slab pages. */
#define SLAB_BYTES_MIN ((size_t)32 << 10)
#define SLAB_DOUBLINGS 5

/*
 * Huge pages. A graph of millions of nodes on memory never touched pays a
 * page fault per 4 KiB page, some 40 nodes. With the default allocator, a
 * class that already holds SLAB_HUGE_AFTER slabs (some 20 MiB) takes its
 * next ones as mappings of libadg's own, 2 MiB long and 2 MiB aligned and
 * advised for transparent huge pages (MADV_HUGEPAGE), so that where the
 * system allows them (THP "madvise" or "always") one fault maps 2 MiB.
 * Not sooner, because the kernel backs the whole 2 MiB at the first touch:
 * a small graph would hold memory it never uses. Not with an allocator of
 * the caller's: its memory is the caller's to advise. Such a slab, once
 * its last node is freed, stays mapped as a spare for the shard's next big
 * graph: a trainer that builds one of the same size each step maps and
 * faults its memory in once. The spares go with the registry.
 */
#if defined(MADV_HUGEPAGE)
#define SLAB_HUGE_BYTES ((size_t)2 << 20)
#define SLAB_HUGE_AFTER 24

/* A 2 MiB mapping, 2 MiB aligned, advised for huge pages; NULL when the
 * system refuses the mapping (the caller takes a slab of the allocator's
 * instead). */
static char *slab_map_huge(void)
{
	/* Twice the length, to cut an aligned 2 MiB out of it. */
	size_t len = 2 * SLAB_HUGE_BYTES;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	char *base = (char *)(((uintptr_t)p + SLAB_HUGE_BYTES - 1) &
			      ~(uintptr_t)(SLAB_HUGE_BYTES - 1));
	char *end = base + SLAB_HUGE_BYTES;
	if (base > p)
		munmap(p, (size_t)(base - p));
	if (p + len > end)
		munmap(end, (size_t)(p + len - end));
	/* Advice only: where the kernel has no huge pages it fails, and the
	 * slab has 4 KiB pages, as one of the allocator's would. */
	(void)madvise(base, SLAB_HUGE_BYTES, MADV_HUGEPAGE);
#ifdef SLAB_LSAN_ROOTS
	/* LeakSanitizer scans the heap and the stacks, not mappings: the
	 * blocks that only nodes point at (graphs, users' closures) would
	 * read as leaked. */
	__lsan_register_root_region(base, SLAB_HUGE_BYTES);
#endif
	return base;
}

static void slab_unmap_huge(void *base)
{
#ifdef SLAB_LSAN_ROOTS
	__lsan_unregister_root_region(base, SLAB_HUGE_BYTES);
#endif
#ifdef ADG_SLAB_ASAN
	/* The shadow outlives the mapping: memory mapped here later must not
	 * read as freed nodes. */
	ASAN_UNPOISON_MEMORY_REGION(base, SLAB_HUGE_BYTES);
#endif
	munmap(base, SLAB_HUGE_BYTES);
}
#else
#define SLAB_HUGE_BYTES ((size_t)0)
#define SLAB_HUGE_AFTER UINT32_MAX
static char *slab_map_huge(void)
{
	return NULL;
}
static void slab_unmap_huge(void *base)
{
	(void)base;
}
#endif

/* Gives s's memory back, to the allocator or the system. */
static void slab_give_back(struct adg_shard *sh, struct adg_slab *s)
{
	adg_count(sh, ADG_C_SLAB_BYTES_FREED, s->bytes);
	if (s->mapped) {
		adg_count(sh, ADG_C_HUGE_BYTES_FREED, s->bytes);
		slab_unmap_huge(s);
	} else {
		adg_free(sh->registry, s, s->bytes);
	}
}

static void slab_start_page(struct adg_slab *s, char *page)
{
	*(struct adg_slab **)page = s;
	s->bump = page + sizeof(struct adg_slab *);
	s->page_end = page + ADG_SLAB_PAGE;
}

/* Cuts a node from s, or reuses a free one; NULL when s is full. */
static void *slab_take(struct adg_slab *s)
{
	void *p = s->free_list;
	if (p != NULL) {
		s->free_list = s->free_list->next;
		return p;
	}
	if (s->bump + s->node_size > s->page_end) {
		if (s->page_end == s->end)
			return NULL;
		slab_start_page(s, s->page_end);
	}
	p = s->bump;
	s->bump += s->node_size;
	return p;
}

static void slab_link_with_room(struct adg_shard *sh, struct adg_slab *s)
{
	struct adg_slab **head = &sh->slabs_with_room[s->cls];
	s->prev_with_room = NULL;
	s->next_with_room = *head;
	if (*head != NULL)
		(*head)->prev_with_room = s;
	*head = s;
	s->findable = true;
}

static void slab_unlink_with_room(struct adg_shard *sh, struct adg_slab *s)
{
	if (s->prev_with_room != NULL)
		s->prev_with_room->next_with_room = s->next_with_room;
	else
		sh->slabs_with_room[s->cls] = s->next_with_room;
	if (s->next_with_room != NULL)
		s->next_with_room->prev_with_room = s->prev_with_room;
	s->prev_with_room = s->next_with_room = NULL;
}

static struct adg_slab *slab_new(struct adg_shard *sh, uint32_t cls)
{
	uint32_t held = sh->slabs_held[cls];
	size_t bytes = SLAB_BYTES_MIN
		       << (held < SLAB_DOUBLINGS ? held : SLAB_DOUBLINGS);
	char *base = NULL;
	bool mapped = false;
	/* A spare first, whatever the class holds: its memory is mapped
	 * and faulted in already, where a new block of the allocator's may
	 * not be (glibc gives a freed heap top back to the system). */
	if (sh->huge_spares != NULL) {
		base = (char *)sh->huge_spares;
		sh->huge_spares = sh->huge_spares->next;
		mapped = true;
	} else if (sh->registry->maps_huge_slabs &&
		   (held >= SLAB_HUGE_AFTER || sh->slabs_held_huge[cls] != 0)) {
		/* A class holding a mapped slab is big already: it does not
		 * go through the allocator's blocks again. */
		if ((base = slab_map_huge()) != NULL) {
			adg_count(sh, ADG_C_SLAB_BYTES_TAKEN, SLAB_HUGE_BYTES);
			adg_count(sh, ADG_C_HUGE_BYTES_TAKEN, SLAB_HUGE_BYTES);
		}
		mapped = base != NULL;
	}
	if (mapped) {
		bytes = SLAB_HUGE_BYTES;
	} else if ((base = adg_alloc(sh->registry, bytes)) != NULL) {
		adg_count(sh, ADG_C_SLAB_BYTES_TAKEN, bytes);
	} else {
		return NULL;
	}
	/* The slab's own fields, then whole pages of nodes: the page a node
	 * lies in must be the slab's, for adg_slab_of. */
	uintptr_t first = ((uintptr_t)base + sizeof(struct adg_slab) +
			   ADG_SLAB_PAGE - 1) &
			  ~(uintptr_t)(ADG_SLAB_PAGE - 1);
	uintptr_t end =
		((uintptr_t)base + bytes) & ~(uintptr_t)(ADG_SLAB_PAGE - 1);
	struct adg_slab *s = (struct adg_slab *)base;
	*s = (struct adg_slab){
		.owner = sh,
		.cls = cls,
		.node_size = (uint32_t)adg_node_size(cls),
		.bytes = bytes,
		.mapped = mapped,
		.first_page = (char *)first,
		.end = (char *)end,
		.next = sh->slabs,
	};
	atomic_init(&s->freed_remotely, 0);
	ADG_ASSERT(end > first); /* bytes is at least four slab pages */
	slab_start_page(s, s->first_page);
	if (sh->slabs != NULL)
		sh->slabs->prev = s;
	sh->slabs = s;
	sh->slabs_held[cls]++;
	sh->slabs_held_huge[cls] += mapped;
	return s;
}

static void slab_release(struct adg_shard *sh, struct adg_slab *s)
{
	if (s->findable)
		slab_unlink_with_room(sh, s);
	if (s->prev != NULL)
		s->prev->next = s->next;
	else
		sh->slabs = s->next;
	if (s->next != NULL)
		s->next->prev = s->prev;
	sh->slabs_held[s->cls]--;
	if (s->mapped) {
		sh->slabs_held_huge[s->cls]--;
		/* Kept for this shard's next big graph, which would map
		 * and fault its memory in again. They number at most what
		 * the shard once had in use: a new one is mapped only when
		 * none is spare. */
		s->next = sh->huge_spares;
		sh->huge_spares = s;
		return;
	}
	slab_give_back(sh, s);
}

/* Takes the frees other threads made of sh's slabs. */
static void slab_take_remote_frees(struct adg_shard *sh)
{
	/* Mostly there are none: a load, which leaves the line shared, where
	 * an exchange would take it from the threads that push. */
	if (atomic_load_explicit(&sh->slabs_freed_remotely,
				 memory_order_relaxed) == NULL)
		return;
	/* acq_rel: acquire pairs with the pushers' release (the slabs' next
	 * links); release, so that this thread's reads of those links happen
	 * before a pusher that finds the list empty writes one again. */
	struct adg_slab *s = atomic_exchange_explicit(
		&sh->slabs_freed_remotely, NULL, memory_order_acq_rel);
	while (s != NULL) {
		/* Read before the stack is taken: once it is, the next free
		 * of s lists it again, writing this link. */
		struct adg_slab *next = s->next_freed_remotely;
		/* acq_rel, as above: acquire, so that every free on the
		 * stack happened before its node is reused; release, for
		 * the link read above. Clears the listed bit. */
		uintptr_t top = atomic_exchange_explicit(&s->freed_remotely, 0,
							 memory_order_acq_rel);
		struct adg_slab_free *first =
			(struct adg_slab_free *)(top & ~(uintptr_t)1);
		struct adg_slab_free *last = first;
		uint32_t n = 1;
		ADG_ASSERT(first != NULL); /* listed with a free on it */
		while (last->next != NULL) {
			last = last->next;
			n++;
		}
		last->next = s->free_list;
		s->free_list = first;
		ADG_ASSERT(s->used >= n);
		s->used -= n;
		if (s->used == 0 || !s->findable)
			adg_slab_free_slow(sh, s);
		s = next;
	}
}

void *adg_slab_alloc_slow(struct adg_shard *sh, uint32_t cls)
{
	ADG_ASSERT(!sh->shared); /* node makers have shards of their own */
	slab_take_remote_frees(sh);
	struct adg_slab *s = sh->slab_current[cls];
	void *p = s != NULL ? slab_take(s) : NULL;
	if (p == NULL) {
		/* The replacement first: should none come, the full slab
		 * stays current, findable, and the lists stay as they were. */
		struct adg_slab *next = sh->slabs_with_room[cls];
		if (next != NULL) {
			slab_unlink_with_room(sh, next);
		} else {
			next = slab_new(sh, cls);
			if (next == NULL)
				return NULL;
		}
		/* Full: its next free lists it (adg_slab_free). */
		if (s != NULL)
			s->findable = false;
		s = next;
		s->findable = true;
		sh->slab_current[cls] = s;
		p = slab_take(s);
		ADG_ASSERT(p != NULL); /* a listed slab has a free node */
	}
	s->used++;
	adg_slab_unpoison(p, s->node_size);
	return p;
}

void adg_slab_free_slow(struct adg_shard *sh, struct adg_slab *s)
{
	if (s->used != 0) {
		slab_link_with_room(sh, s);
		return;
	}
	if (sh->slab_current[s->cls] != s) {
		slab_release(sh, s);
		return;
	}
	/* The current slab, empty: cut from its start again, so that the
	 * next graph lies in order. Its free list holds every node it cut. */
	s->free_list = NULL;
	slab_start_page(s, s->first_page);
}

void adg_slab_free_remote(struct adg_slab *s, void *p)
{
	struct adg_slab_free *f = p;
	/* Before the push: once pushed, the owner may reuse it. */
	adg_slab_poison(p, s->node_size);
	/* acq_rel: release, so that this thread's use of the node happens
	 * before the owner reuses it (it takes the stack with acquire);
	 * acquire, pairing with the owner's take when this push finds the
	 * stack empty, for the list link written below. */
	uintptr_t top =
		atomic_load_explicit(&s->freed_remotely, memory_order_relaxed);
	do
		f->next = (struct adg_slab_free *)(top & ~(uintptr_t)1);
	while (!atomic_compare_exchange_weak_explicit(
		&s->freed_remotely, &top, (uintptr_t)f | 1,
		memory_order_acq_rel, memory_order_relaxed));
	if ((top & 1) != 0)
		return; /* listed already: the owner will take this free too */
	/* The first free since the owner took the stack: list the slab. The
	 * owner cannot release it meanwhile, since it counts this node as
	 * used until it takes the stack, which it finds through this list.
	 * Release: the owner's acquire take sees the link. */
	struct adg_shard *owner = s->owner;
	struct adg_slab *head = atomic_load_explicit(
		&owner->slabs_freed_remotely, memory_order_relaxed);
	do
		s->next_freed_remotely = head;
	while (!atomic_compare_exchange_weak_explicit(
		&owner->slabs_freed_remotely, &head, s, memory_order_release,
		memory_order_relaxed));
}

void adg_slab_free_all(struct adg_shard *sh)
{
	struct adg_slab *s = sh->slabs;
	while (s != NULL) {
		struct adg_slab *next = s->next;
		slab_give_back(sh, s);
		s = next;
	}
	sh->slabs = NULL;
	for (s = sh->huge_spares; s != NULL;) {
		struct adg_slab *next = s->next;
		slab_give_back(sh, s);
		s = next;
	}
	sh->huge_spares = NULL;
	for (uint32_t c = 0; c < ADG_SLAB_CLASSES; c++) {
		sh->slab_current[c] = NULL;
		sh->slabs_with_room[c] = NULL;
		sh->slabs_held[c] = 0;
		sh->slabs_held_huge[c] = 0;
	}
	atomic_store_explicit(&sh->slabs_freed_remotely, NULL,
			      memory_order_relaxed);
}
