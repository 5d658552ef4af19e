/*
 * Thread records: what libadg keeps of each thread that uses it (its reader
 * word, its shards' slots), the threads lock, and fork.
 *
 * A record lives in memory of libadg's own, never freed, and the thread
 * finds it through one initial-exec TLS pointer. Not in the thread's TLS:
 * that memory goes with the thread, and nothing tells a library reliably
 * when. A pthread key's destructor is not run for a key first set in
 * glibc's last destructor round (a thread whose first call into libadg
 * comes from another key's destructor), nor for a thread that calls
 * libadg again after it ran; and a later thread created on the same cached
 * stack has the same TLS addresses. A record on a list in the dead
 * thread's TLS was read after its thread was gone, and linked twice by the
 * next thread on that stack (a cycle: grace periods and registry frees
 * looped for ever).
 *
 * So no exit hook at all. A record keeps its thread's id, and a thread that
 * needs a record or a shard and finds none free asks the kernel whether
 * the owners of those it would take still exist (tgkill with no signal:
 * ESRCH once a thread has ended, however it ended). One that does not is
 * released: its shards go back for adoption and the record to the free
 * list. A thread id may be reused, after the kernel has cycled through
 * its pid space: then a record whose thread has ended reads as live until
 * the new thread with its id ends too, which costs memory, never
 * correctness. A thread that has ended is never inside a read-side section
 * (sections run no user code), so its word reads 0 and grace periods pass
 * over it meanwhile. Records number at most the threads alive at once, and
 * one more for each thread that ended and was not yet found gone.
 *
 * (A robust mutex held for the thread's life, which the kernel marks when
 * the thread ends, says the same without a system call, but a mutex held
 * for ever is an edge from it to every lock the thread takes after in
 * ThreadSanitizer's lock-order graph: a user's program under TSan would
 * read a lock-order inversion wherever it first called libadg with a lock
 * of its own held.)
 *
 * fork: only the forking thread lives on in the child. The threads lock,
 * and every registry's kinds lock, are held across fork (pthread_atfork,
 * registered before the threads lock is first taken),
 * so the child inherits whole lists; there the other threads' records and
 * shards are set aside, their words at 0, never to be taken or adopted:
 * another thread may have been halfway through changing one when the fork
 * came.
 */
#include "internal.h"
#include "readside.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

__thread struct adg_thread *adg_self __attribute__((tls_model("initial-exec")));

/*
 * The threads lock: held to register a thread, to change any thread's slots,
 * to adopt or hand back a shard, to add a shard to a registry, and to add or
 * take away a registry. Taken when a thread first uses libadg or a
 * registry, by adg_registry_new and adg_registry_free, and across fork:
 * never on a path that a training loop repeats. Never held while waiting
 * for a grace period.
 */
static pthread_mutex_t threads_lock = PTHREAD_MUTEX_INITIALIZER;
/* Every record, newest first: pushed under the lock (release), never
 * taken off, read lock-free by grace periods (acquire). */
static struct adg_thread *_Atomic threads_all;
/* Released records, linked through next_free, under the lock. */
static struct adg_thread *threads_free;
/* Every registry, for fork (its kinds lock), under the lock. */
static struct adg_registry *threads_registries;

/* The owner of shards that the forking thread's child found owned by
 * other threads: they are never adopted (see above). */
static struct adg_thread threads_forked_away;

static pthread_once_t threads_once = PTHREAD_ONCE_INIT;

#ifdef ADG_TSAN
/* ThreadSanitizer cannot see that a thread's end comes before the kernel
 * says it is gone, so it would read the next owner's use of a record, or
 * of a shard it adopts, as racing with the last owner's. A key's
 * destructor, run again in the second destructor round, releases the
 * record there; the thread that finds it gone acquires it. Not later:
 * TSan's runtime finishes a thread in a destructor round of its own, and
 * instrumented code after that crashes it (LLVM's runtime, which rustc's
 * -Zsanitizer=thread links, did in this function's entry in the last
 * round). An annotation, no more: nothing depends on it but TSan's view
 * (and TSan builds do not run libadg from late destructor rounds: see
 * tests/test_threads.c). */
static pthread_key_t threads_tsan_key;
static bool threads_tsan_key_ok;
static __thread int threads_tsan_rounds; /* this thread's, so far */

static void threads_tsan_end(void *record)
{
	if (++threads_tsan_rounds < 2) {
		(void)pthread_setspecific(threads_tsan_key, record);
		return;
	}
	adg_tsan_release(record);
}
#endif

static void threads_before_fork(void);
static void threads_after_fork_parent(void);
static void threads_after_fork_child(void);

static void threads_init(void)
{
#ifdef ADG_TSAN
	threads_tsan_key_ok =
		pthread_key_create(&threads_tsan_key, threads_tsan_end) == 0;
#endif
	/* Can fail only for want of memory; a child of a fork that came
	 * while another thread held the lock would then hang in it. */
	(void)pthread_atfork(threads_before_fork, threads_after_fork_parent,
			     threads_after_fork_child);
}

void adg_threads_lock(void)
{
	/* The fork hooks before the lock's first use: a fork while any
	 * thread holds it must find them. */
	pthread_once(&threads_once, threads_init);
	pthread_mutex_lock(&threads_lock);
}

void adg_threads_unlock(void)
{
	pthread_mutex_unlock(&threads_lock);
}

struct adg_thread *adg_threads_first(void)
{
	/* Acquire: pairs with the push's release, so a record read here is
	 * initialised, and its next_all, which never changes, with it. */
	return atomic_load_explicit(&threads_all, memory_order_acquire);
}

/* Under the lock: t's thread is gone. Its shards get owner (NULL: they go
 * back for adoption), its slots are cleared, and it is live no more. */
static void threads_end(struct adg_thread *t, struct adg_thread *owner)
{
	for (int i = 0; i < ADG_THREAD_SLOTS; i++) {
		struct adg_thread_slot *slot = &t->slots[i];
		if (atomic_load_explicit(&slot->registry,
					 memory_order_relaxed) == NULL)
			continue;
		slot->shard->owner = owner;
		atomic_store_explicit(&slot->registry, NULL,
				      memory_order_relaxed);
	}
	for (struct adg_shard *s = t->overflow; s != NULL; s = s->next_overflow)
		s->owner = owner;
	t->overflow = NULL;
	/* Relaxed: its thread is gone, and the lock orders this store before
	 * the next owner's first section. A thread never ends inside a
	 * section, except in a child of fork, whose other threads stopped
	 * wherever they were. */
	ADG_ASSERT(owner == &threads_forked_away ||
		   atomic_load_explicit(&t->reader, memory_order_relaxed) == 0);
	atomic_store_explicit(&t->reader, 0, memory_order_relaxed);
	t->live = false;
}

bool adg_thread_gone_locked(struct adg_thread *t)
{
	if (t == &threads_forked_away || t == adg_self)
		return false;
	ADG_ASSERT(t->live);
	/* Signal 0: only whether a thread of this process has that id.
	 * Any answer but ESRCH (a sandbox that forbids the call, say)
	 * counts as alive. */
	if (syscall(SYS_tgkill, getpid(), t->tid, 0) == 0 || errno != ESRCH)
		return false;
	adg_tsan_acquire(t); /* see threads_tsan_end */
	threads_end(t, NULL);
	t->next_free = threads_free;
	threads_free = t;
	return true;
}

/* Under the lock: a record for the calling thread: a released one, one
 * whose thread is found gone, or a new one; NULL for want of memory. */
static struct adg_thread *threads_take(void)
{
	if (threads_free == NULL)
		for (struct adg_thread *t = adg_threads_first(); t != NULL;
		     t = t->next_all)
			if (t->live)
				(void)adg_thread_gone_locked(t);
	struct adg_thread *t = threads_free;
	if (t != NULL) {
		threads_free = t->next_free;
		return t;
	}
	void *p = NULL;
	if (posix_memalign(&p, ADG_CACHELINE, sizeof *t) != 0)
		return NULL;
	t = p;
	*t = (struct adg_thread){.next_all = adg_threads_first()};
	/* Release: see adg_threads_first. */
	atomic_store_explicit(&threads_all, t, memory_order_release);
	return t;
}

struct adg_thread *adg_thread_register(void)
{
	/* The read side's set-up first: its sections read what it sets. */
	adg_rcu_init();
	adg_threads_lock();
	ADG_TEST_POINT(ADG_TP_THREADS_LOCKED);
	struct adg_thread *t = threads_take();
	if (t != NULL) {
		t->tid = (pid_t)syscall(SYS_gettid);
		t->live = true;
		adg_self = t;
#ifdef ADG_TSAN
		if (threads_tsan_key_ok)
			(void)pthread_setspecific(threads_tsan_key, t);
#endif
	}
	adg_threads_unlock();
	return t;
}

void adg_threads_add_registry_locked(struct adg_registry *r)
{
	r->next_registry = threads_registries;
	threads_registries = r;
}

void adg_threads_remove_registry_locked(struct adg_registry *r)
{
	struct adg_registry **link = &threads_registries;
	while (*link != r)
		link = &(*link)->next_registry;
	*link = r->next_registry;
}

#ifdef ADG_TEST_HOOKS
size_t adg_threads_live(void)
{
	size_t n = 0;
	adg_threads_lock();
	for (struct adg_thread *t = adg_threads_first(); t != NULL;
	     t = t->next_all)
		n += t->live && !adg_thread_gone_locked(t);
	adg_threads_unlock();
	return n;
}

size_t adg_threads_records(void)
{
	size_t n = 0;
	for (struct adg_thread *t = adg_threads_first(); t != NULL;
	     t = t->next_all)
		n++;
	return n;
}
#endif

/* fork. Lock order: the threads lock, then each registry's kinds lock
 * (no path takes them the other way round). */
static void threads_before_fork(void)
{
	pthread_mutex_lock(&threads_lock);
	for (struct adg_registry *r = threads_registries; r != NULL;
	     r = r->next_registry)
		adg_spin_lock(&r->kinds_lock);
}

static void threads_unlock_all(void)
{
	for (struct adg_registry *r = threads_registries; r != NULL;
	     r = r->next_registry)
		adg_spin_unlock(&r->kinds_lock);
	pthread_mutex_unlock(&threads_lock);
}

static void threads_after_fork_parent(void)
{
	threads_unlock_all();
}

static void threads_after_fork_child(void)
{
	struct adg_thread *self = adg_self;

	for (struct adg_thread *t = adg_threads_first(); t != NULL;
	     t = t->next_all) {
		/* Set aside, never taken again: a thread stopped wherever
		 * it was may have been changing its record, or a shard. */
		if (t == self)
			t->tid = (pid_t)syscall(SYS_gettid); /* the child's */
		else if (t->live)
			threads_end(t, &threads_forked_away);
	}
	/* Relaxed: the child has one thread. Its sections on the shared
	 * counter, if any, were the other threads'. */
	atomic_store_explicit(&adg_rcu_unregistered_readers, 0,
			      memory_order_relaxed);
	threads_unlock_all();
}
