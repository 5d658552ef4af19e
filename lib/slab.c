/*
 * Node slabs: node memory of libadg's own (see internal.h, "node slabs").
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
#include "internal.h"

/* 16 KiB, doubling with each slab the class holds, up to 1 MiB: a thread
 * that makes small graphs holds little, and the partial pages at a slab's
 * two ends (4 KiB together, on average) are a small part of a big one. */
#define SLAB_BYTES_MIN ((size_t)16 << 10)
#define SLAB_DOUBLINGS 6

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
	char *base = adg_alloc(sh->registry, bytes);
	if (base == NULL)
		return NULL;
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
		.first_page = (char *)first,
		.end = (char *)end,
		.next = sh->slabs,
	};
	atomic_init(&s->freed_remotely, 0);
	ADG_ASSERT(end > first); /* bytes is at least four pages */
	slab_start_page(s, s->first_page);
	if (sh->slabs != NULL)
		sh->slabs->prev = s;
	sh->slabs = s;
	sh->slabs_held[cls]++;
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
	adg_free(sh->registry, s, s->bytes);
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
		/* Full: its next free lists it (adg_slab_free). */
		if (s != NULL)
			s->findable = false;
		s = sh->slabs_with_room[cls];
		if (s != NULL) {
			slab_unlink_with_room(sh, s);
		} else {
			s = slab_new(sh, cls);
			if (s == NULL)
				return NULL;
		}
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
		adg_free(sh->registry, s, s->bytes);
		s = next;
	}
	sh->slabs = NULL;
	for (uint32_t c = 0; c < ADG_SLAB_CLASSES; c++) {
		sh->slab_current[c] = NULL;
		sh->slabs_with_room[c] = NULL;
		sh->slabs_held[c] = 0;
	}
	atomic_store_explicit(&sh->slabs_freed_remotely, NULL,
			      memory_order_relaxed);
}
