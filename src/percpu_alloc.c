/* SPDX-License-Identifier: MIT */
/*
 * percpu_alloc.c - the per-CPU counter allocator.
 *
 * Layout (the kernel's percpu allocator in miniature): memory comes in
 * chunks; a chunk holds one unit per possible CPU, each unit
 * 1 << PERCPUREF_UNIT_SHIFT bytes of slots, units back to back (or
 * PERCPUREF_UNIT_COLOUR bytes apart: this_cpu.h).  A counter is a slot
 * at the same offset in every unit, named by the address of its CPU 0 copy:
 * CPU n's copy is n * PERCPUREF_UNIT_STRIDE bytes further.  So a counter
 * costs 8 bytes per CPU, counters of one CPU are packed together (the fast
 * path writes a unit's lines only from that CPU; a fold, which reads
 * every copy and zeroes those that are not, and the free links touch them
 * from any), and no two CPUs' copies ever share a cache line.  Chunks are
 * mapped without their pages, and neither the fold nor an exit's clear
 * stores a zero over a zero, so a unit's pages are backed only once a
 * ref's user wrote a copy there: a unit of a CPU no user ran on (a
 * possible CPU the machine does not have) costs no memory, but for CPU
 * 0's, which the free links write, and where transparent huge pages back
 * a chunk whole (docs/percpu_ref.md, "Clean lines stay clean").  A free
 * slot's copies are zero but CPU 0's, its link: whoever frees one leaves
 * them so (internal.h), and an allocation zeroes the link alone.  (Up to
 * 0.4.10 it zeroed every copy, lines the fold of the slot's last life had
 * just read: two passes over them a life, each line a miss where other
 * threads' slots share it.)  The fast path needs no table lookup: a shift
 * (a multiply where the units are spaced) and an add.
 *
 * Chunks are anonymous mappings reserved whole and populated by the kernel as
 * slots are first touched; slots are handed out from a free list first, then
 * from the unused tail of the newest chunk.  A free slot links to the next
 * free slot through its CPU 0 copy, so the free list costs no memory.
 * Chunks are never unmapped: a freed slot is reused by the next allocation,
 * which keeps memory flat under churn (memory is limitation 1 of the managed
 * refcount proposal; docs/percpu_ref.md).
 *
 * Thread caches.  One mutex (alloc_lock) guards the chunk table, the shared
 * free list and the tail.  Taken on every init and exit, it serialised
 * threads that create and destroy refs (switch-storm at sixteen threads:
 * they spent most of their system time in the futex of this lock, whose
 * holder also zeroed sixteen CPUs' copies of the slot, each a cache miss).
 * So every thread keeps a cache of free slots, Bonwick's magazine layer
 * ("Magazines and Vmem", USENIX 2001): magazines of up to MAGAZINE_SLOTS
 * slots each, the loaded one and a stack of up to FULL_MAGAZINES full
 * ones: Bonwick's previous magazine (the top) and, below it, a depot of
 * the thread's own (THREAD_DEPOT_MAGAZINES).  An allocation pops from the
 * loaded magazine; when that is empty it swaps in the stack's top, and
 * only when the stack is empty does it take the lock, to trade for a full
 * magazine from the depot (the shared pool's stack of full magazines), or
 * failing that to fill one slot by slot from the free list and the tail,
 * which it takes in whole lines (a take ends on a line boundary), mapping
 * a chunk if the pool is empty.  So two threads' magazines from the tail
 * share no line of a unit (where a magazine is a line or more): up to
 * 0.4.14 the allocation that mapped a chunk took one slot alone, every
 * later magazine straddled two lines, and two threads taking magazines
 * in turn shared a line at each end (a probe, two threads cycling refs
 * as switch-storm's kill-poll does: 14 to 31 of each thread's 69 to 91
 * lines of counters held the other's too, a fold reading a line the
 * other CPU's adds wrote; now none, 64 lines each).
 * A free pushes on the loaded magazine; when that is full it goes on the
 * stack, and only when the stack is full does the lock go, to push the
 * stack's top on the depot first.  So a thread takes the lock at most once
 * per MAGAZINE_SLOTS allocations or frees past what it keeps, and for O(1)
 * work: a depot push or pop moves a whole chain of slots by its head.
 * (The first build moved slots one by one under the lock, each a cache
 * miss on a line another thread wrote last; two polling threads of
 * switch-storm, whose frees come in bursts of a fence's worth, made 19,000
 * context switches in 2.4 s waiting on it.)  The thread's own depot came
 * in 0.4.13: with the pair alone, a polling thread's burst of frees (every
 * kill a poll found covered by a fence) filled both magazines and pushed
 * the rest on the shared depot, and its next batch of inits popped them
 * back, so most magazines went through the lock (two kill-poll threads of
 * switch-storm, 16 batches in flight: 50,902 pushes in 2.1 million
 * allocations; 23, their exits', with 14 kept), and a magazine another
 * thread had pushed mixed that thread's slots into this one's lines, where
 * a fold or an allocation then missed on a line the other CPU wrote.
 * Kept, a thread's slots come back to it.  A cache is its thread's alone:
 * no atomics but the count, which percpuref_get_counter_stats() reads.  It
 * goes back whole when the thread exits (percpuref_at_thread_exit(); a
 * thread that cannot register that hook uses no cache).  The cache lives
 * on the heap, TLS holding only its address: a thread whose first call
 * comes from a key destructor in glibc's last round registers a hook that
 * never runs (thread_exit.c), and a registry node in its TLS would outlive
 * the thread, reused by the next thread on that stack (a list looped on
 * itself: test_percpu_ref, first call in the last destructor round).  On
 * the heap such a cache stays in the registry until the pool is about to
 * map a chunk: then each cache whose owner mark reads orphaned
 * (thread_exit.c) is emptied into the pool and freed.  (Before the marks
 * its slots were lost, up to 2 * MAGAZINE_SLOTS a thread, and a program
 * that kept starting such threads mapped chunk after chunk.)  The
 * library's own threads use none: the callback thread frees the counter of
 * every killed ref and allocates none, so its cache would only fill and
 * give back; and freeing straight into the pool before the release, it
 * leaves the slot there for a thread that saw the release.  At most (2 +
 * THREAD_DEPOT_MAGAZINES) * MAGAZINE_SLOTS free slots (512) wait in a live
 * thread's cache; a new chunk is mapped only when the shared pool (depot,
 * free list, tail) is empty (a refill takes what is left and maps none
 * while anything is),
 * whatever other caches hold.  The link's zeroing happens outside the
 * lock, by the allocating thread, the slot being its own from the moment
 * it left the pool.
 *
 * A magazine is a chain of free slots linked through their CPU 0 copies,
 * named by its first slot; the depot is an array of such names (grown
 * under the lock; when it cannot grow, the magazine goes back slot by
 * slot to the free list instead).
 *
 * Counting: slots_handed_out (lock) counts slots out of the shared pool, in
 * caches or in use; in_use is that minus every registered cache's count
 * (registry: the list of caches, lock), exact whenever no other thread
 * allocates or frees meanwhile, and never below zero (the counts are read
 * one by one while their owners move slots between them).
 *
 * Spares.  The same caches and lock carry a second kind of object: the
 * refs' bookkeeping (percpu_ref.c's impls), which the reclaimer frees
 * when a ref exited while listed, and an application thread's exit of an
 * unmanaged ref (percpuref_spare_keep()).  free() of memory another thread's
 * malloc() took locks that thread's arena, and every malloc() of a
 * thread whose frees all go elsewhere finds its tcache empty and locks
 * the arena too: with two threads cycling managed refs (switch-storm's
 * managed-poll) the reclaimer and the workers met on those locks, 40% of
 * the process's futex calls.  So the reclaimer hands chains of up to
 * PERCPUREF_SPARE_CHAIN such objects to a depot of its own
 * (spare_depot, at most PERCPUREF_SPARE_DEPOT_CHAINS chains: 4,096
 * objects, 590 KB of impls; past that it frees them), and an init takes
 * one from its thread's cache, which loads a whole chain from the depot
 * when empty: the lock once per chain on both sides.  An exit on an
 * application thread keeps its impl in that chain too, for the thread's
 * next init: a malloc() and a free() a ref, without a tcache entry for
 * most of a batch, were the largest symbol of a kill cycle at sixteen
 * threads (docs/percpu_ref.md); a full chain goes to the depot first.  A
 * thread holds at most one chain (PERCPUREF_SPARE_CHAIN objects), given
 * back to the depot (or freed) at its exit, as its slots are; a library
 * thread holds none and takes none (its exits free).  A spare that a
 * thread without a cache frees goes back to the arena it first came
 * from: the cross-arena free, moved, not gone.
 * Only the depot's top chain may be short (spare_put_locked()), so a full
 * depot holds 4,096 whatever lengths the chains came in.
 * An init finds the depot empty without the lock (spare_depot_count, a
 * relaxed hint written under it: a chain given meanwhile waits for the
 * next init).
 * The allocator reads only an object's first word, the link.  Under
 * ASan and valgrind there are none (percpuref_spares_off()): a spare is
 * reused within microseconds, where a free()d block stays in the tool's
 * quarantine, so a stale access to an exited ref would go unreported.
 *
 * Fork: the child keeps the forking thread's cache; every other thread's
 * cache is freed, its slots and spares lost to the child (at most
 * (2 + THREAD_DEPOT_MAGAZINES) * MAGAZINE_SLOTS slots each, counted in use
 * there, and one chain):
 * its owner may have been halfway through a push or a pop, and does not
 * exist in the child.  The depot is the pool's,
 * consistent under the lock that fork holds.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "internal.h"

#define SLOTS_PER_CHUNK ((1UL << PERCPUREF_UNIT_SHIFT) / PERCPUREF_COUNTER_STRIDE)
/* Slots in a 64-byte line of a unit (one where a slot fills a line). */
#define SLOTS_PER_LINE (PERCPUREF_COUNTER_STRIDE < 64 ? 64 / PERCPUREF_COUNTER_STRIDE : 1)
#define MAGAZINE_SLOTS PERCPUREF_MAGAZINE_SLOTS
#define THREAD_DEPOT_MAGAZINES PERCPUREF_THREAD_DEPOT_MAGAZINES
#define FULL_MAGAZINES (1 + THREAD_DEPOT_MAGAZINES)

enum cache_state { CACHE_UNREGISTERED, CACHE_ACTIVE, CACHE_RETIRED };

struct slot_cache {
	uintptr_t loaded;		/* the loaded magazine's first slot, or 0 */
	unsigned long nr_loaded;	/* its slots, 0..MAGAZINE_SLOTS */
	uintptr_t full[FULL_MAGAZINES];	/* a stack; its top: the previous one */
	unsigned int nr_full;		/* 0..FULL_MAGAZINES */
	unsigned long count;		/* atomic: all those slots; the owner
					 * writes it, the stats read it */
	struct percpuref_spares spares;	/* a chain, or empty */
	struct slot_cache *prev, *next;	/* registry (alloc_lock) */
	struct percpuref_owner_mark owner; /* held by the thread it serves */
};

static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t *chunks;		/* base of each chunk (CPU 0's unit) */
static size_t nr_chunks, chunks_capacity;
static uintptr_t free_head;		/* a free slot's CPU 0 address, or 0 */
static size_t tail_used = SLOTS_PER_CHUNK; /* slots handed out of the newest chunk */
static size_t slots_handed_out, slots_on_free_list;
static uintptr_t *depot;		/* full magazines, by first slot */
static size_t depot_count, depot_capacity;
static struct percpuref_spares spare_depot[PERCPUREF_SPARE_DEPOT_CHAINS];
static unsigned int spare_depot_count;	/* lock; read without it as a hint */
static struct slot_cache registry = { .prev = &registry, .next = &registry };
static __thread struct slot_cache *cache;	/* this thread's, on the heap */
static __thread enum cache_state cache_state;

static size_t chunk_bytes(void)
{
	return (size_t)percpuref_nr_units() * PERCPUREF_UNIT_STRIDE;
}

/* Maps a new chunk and makes it the tail.  Lock held.  0 or -ENOMEM. */
static int add_chunk(void)
{
	void *base;

	if (nr_chunks == chunks_capacity) {
		size_t capacity = chunks_capacity ? 2 * chunks_capacity : 8;
		uintptr_t *grown = percpuref_fault_should_fail()
					   ? NULL
					   : realloc(chunks, capacity * sizeof(*chunks));

		if (!grown)
			return -ENOMEM;
		chunks = grown;
		chunks_capacity = capacity;
	}
	if (percpuref_fault_should_fail())
		return -ENOMEM;
	base = mmap(NULL, chunk_bytes(), PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (base == MAP_FAILED)
		return -ENOMEM;
	chunks[nr_chunks++] = (uintptr_t)base;
	tail_used = 0;
	return 0;
}

/* Lock held. */
static void pool_put(uintptr_t cpu0)
{
	*(uintptr_t *)cpu0 = free_head;
	free_head = cpu0;
	slots_on_free_list++;
	slots_handed_out--;
}

/* Lock held.  The @n slots chained from @first onto the free list. */
static void pool_put_chain(uintptr_t first, unsigned long n)
{
	while (n--) {
		uintptr_t next = *(uintptr_t *)first;

		pool_put(first);
		first = next;
	}
}

/* Lock held, depot not empty.  Its top magazine's first slot; the
 * magazine's slots leave the pool. */
static uintptr_t depot_pop(void)
{
	slots_handed_out += MAGAZINE_SLOTS;
	return depot[--depot_count];
}

static void take_back_orphaned_caches(void);

/* Lock held.  Whether the shared pool holds no slot. */
static bool pool_empty(void)
{
	return !free_head && !depot_count && tail_used == SLOTS_PER_CHUNK;
}

/* Lock held.  Leaves the pool with a slot unless it is empty and no chunk
 * can be mapped: before a chunk is mapped, what the caches of dead
 * threads hold goes back.  False when it stays empty. */
static bool pool_fill(void)
{
	if (!pool_empty())
		return true;
	take_back_orphaned_caches();
	return !pool_empty() || add_chunk() == 0;
}

/* Lock held, free_head set.  The free list's first slot, out of the pool. */
static uintptr_t free_list_take(void)
{
	uintptr_t cpu0 = free_head;

	free_head = *(uintptr_t *)cpu0;
	slots_on_free_list--;
	slots_handed_out++;
	return cpu0;
}

/* Lock held, tail_used < SLOTS_PER_CHUNK.  The tail's next slot. */
static uintptr_t tail_take(void)
{
	slots_handed_out++;
	return chunks[nr_chunks - 1] + tail_used++ * PERCPUREF_COUNTER_STRIDE;
}

/* Lock held.  One slot out of the shared pool for a thread without a
 * cache (a library thread, one past its exit hook), which allocates only
 * here, or 0 when the pool is empty and no chunk can be mapped.  The
 * depot's magazines are its too, unpacked onto the free list when that
 * is empty, or a chunk was mapped while they sat there, and memory grew
 * under churn without bound. */
static uintptr_t pool_take(void)
{
	if (!pool_fill())
		return 0;
	if (!free_head && depot_count)
		pool_put_chain(depot_pop(), MAGAZINE_SLOTS);
	return free_head ? free_list_take() : tail_take();
}

/* The stats' count of @c (relaxed: read under alloc_lock by
 * percpuref_get_counter_stats(), exact once the owner is quiet, which is
 * all the stats promise). */
static void cache_count(struct slot_cache *c)
{
	__atomic_store_n(&c->count,
			 c->nr_loaded + c->nr_full * MAGAZINE_SLOTS,
			 __ATOMIC_RELAXED);
}

/* Lock held.  Puts the magazine at @first, of @n slots, back in the pool:
 * on the depot when full and the depot can hold it, else slot by slot. */
static void pool_put_magazine(uintptr_t first, unsigned long n)
{
	if (n == MAGAZINE_SLOTS && depot_count == depot_capacity) {
		size_t capacity = depot_capacity ? 2 * depot_capacity : 16;
		uintptr_t *grown = percpuref_fault_should_fail()
					   ? NULL
					   : realloc(depot, capacity * sizeof(*depot));

		if (grown) {
			depot = grown;
			depot_capacity = capacity;
		}
	}
	if (n == MAGAZINE_SLOTS && depot_count < depot_capacity) {
		depot[depot_count++] = first;
		slots_handed_out -= n;
		return;
	}
	pool_put_chain(first, n);
}

/* The object after spare @obj in its chain. */
static void *spare_next(void *obj)
{
	return *(void **)obj;
}

/* Frees @chain's objects and empties it. */
static void spares_free(struct percpuref_spares *chain)
{
	while (chain->first) {
		void *next = spare_next(chain->first);

		free(chain->first);
		chain->first = next;
	}
	chain->n = 0;
}

/* Lock held.  Moves @chain onto the depot, emptying it, or what does not
 * fit when the depot is full, for the caller to free.  Every entry but
 * the top one is a full chain: a chain is spliced onto a short top where
 * both fit, else fills it up and the rest becomes the new top (a full
 * chain goes below a short top instead: no walk).  So a full depot holds
 * 4,096 whatever came in what order.  Threads that exit give back what is
 * left of their chains, often a few objects (one, for a thread that made
 * a ref and exited it), and a reclaimer pass's last chain is short: as
 * entries of their own (up to 0.4.19), 128 such threads filled the depot
 * with 128 objects, and chains of 20 with 2,560.  The walk (at most 31
 * links: a short chain's tail, or the part that fills the top) is under
 * the lock; only a short chain, or a full one when the depot is full,
 * takes it.  Taking the top (percpuref_spare_take()) keeps the rule. */
static void spare_put_locked(struct percpuref_spares *chain)
{
	struct percpuref_spares *top = spare_depot_count ? &spare_depot[spare_depot_count - 1]
							 : NULL;
	bool short_top = top && top->n < PERCPUREF_SPARE_CHAIN;
	bool room = spare_depot_count < PERCPUREF_SPARE_DEPOT_CHAINS;

	if (!chain->n)
		return;
	if (short_top && chain->n == PERCPUREF_SPARE_CHAIN && room) {
		/* A full chain goes below the short top. */
		spare_depot[spare_depot_count] = *top;
		*top = *chain;
	} else {
		if (short_top) {
			/* The first min(room on the top, n) objects of @chain
			 * go onto the top. */
			unsigned long fill = PERCPUREF_SPARE_CHAIN - top->n, i;
			void *last = chain->first, *rest;

			for (i = 1; i < fill && spare_next(last); i++)
				last = spare_next(last);
			rest = spare_next(last);
			*(void **)last = top->first;
			top->first = chain->first;
			top->n += i;
			*chain = (struct percpuref_spares){ rest, chain->n - i };
		}
		if (!chain->n || !room)
			return;
		spare_depot[spare_depot_count] = *chain;
	}
	/* Relaxed: the hint percpuref_spare_take() reads without the lock. */
	__atomic_store_n(&spare_depot_count, spare_depot_count + 1, __ATOMIC_RELAXED);
	*chain = (struct percpuref_spares){ NULL, 0 };
}

/* Lock held.  Empties @c into the pool and takes it off the registry. */
static void cache_unlink(struct slot_cache *c)
{
	pool_put_magazine(c->loaded, c->nr_loaded);
	while (c->nr_full)
		pool_put_magazine(c->full[--c->nr_full], MAGAZINE_SLOTS);
	/* Rare (a thread's exit): the frees may as well wait under the lock. */
	spare_put_locked(&c->spares);
	spares_free(&c->spares);
	c->prev->next = c->next;
	c->next->prev = c->prev;
}

/* Lock held.  The caches whose threads exited without their hook go back
 * into the pool. */
static void take_back_orphaned_caches(void)
{
	struct slot_cache *c, *next;

	for (c = registry.next; c != &registry; c = next) {
		next = c->next;
		/* Its owner's last writes to it are visible: the mark's
		 * acquire (thread_exit.c). */
		if (!percpuref_owner_mark_orphaned(&c->owner))
			continue;
		cache_unlink(c);
		free(c);
	}
}

static void cache_retire(void *arg)
{
	struct slot_cache *c = arg;

	pthread_mutex_lock(&alloc_lock);
	cache_unlink(c);
	pthread_mutex_unlock(&alloc_lock);
	/* Not this thread's cache from here on, before the mark goes: a fork
	 * from a signal handler past this point took the mark again in the
	 * child (alloc_fork_child()), and the free() below left it on the
	 * child thread's robust list. */
	cache_state = CACHE_RETIRED;
	cache = NULL;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	percpuref_owner_mark_give_back(&c->owner);
	free(c);
}

/* This thread's cache, registered on first use; NULL if it has none (a
 * library thread; its exit hook could not be registered, or it ran). */
static struct slot_cache *my_cache(void)
{
	struct slot_cache *c;

	if (cache_state == CACHE_ACTIVE)
		return cache;
	if (cache_state == CACHE_RETIRED || percpuref_on_library_thread())
		return NULL;
	/* A failure here (the fault hook's too) is final for the thread: no
	 * cache, no retry. */
	cache_state = CACHE_RETIRED;
	c = percpuref_zalloc(sizeof(*c));
	if (!c)
		return NULL;
	percpuref_owner_mark_init(&c->owner);
	percpuref_owner_mark_take(&c->owner);
	if (!percpuref_at_thread_exit(cache_retire, c)) {
		percpuref_owner_mark_give_back(&c->owner);
		free(c);
		return NULL;
	}
	/* Named ours before it is linked: a fork child keeps the forking
	 * thread's cache by this name (alloc_fork_child()). */
	cache = c;
	pthread_mutex_lock(&alloc_lock);
	c->next = &registry;
	c->prev = registry.prev;
	registry.prev->next = c;
	registry.prev = c;
	pthread_mutex_unlock(&alloc_lock);
	cache_state = CACHE_ACTIVE;
	return c;
}

/* Pushes the free slot @cpu0 on @c's loaded magazine, which has room: its
 * owner's free, or a refill under the lock. */
static void cache_push(struct slot_cache *c, uintptr_t cpu0)
{
	*(uintptr_t *)cpu0 = c->loaded;
	c->loaded = cpu0;
	c->nr_loaded++;
}

/* Lock held.  Loads @c with a full magazine from the depot, or one filled
 * slot by slot from the free list and then from the tail in whole lines,
 * mapping a chunk when the pool is empty; loads nothing when no chunk can
 * be mapped. */
static void cache_refill_locked(struct slot_cache *c)
{
	unsigned long end;

	if (!pool_fill())
		return;
	if (depot_count) {
		c->loaded = depot_pop();
		c->nr_loaded = MAGAZINE_SLOTS;
		return;
	}
	while (c->nr_loaded < MAGAZINE_SLOTS && free_head)
		cache_push(c, free_list_take());
	/* A take from the tail ends on a line boundary, so that the next
	 * thread's take begins on one: shorter wherever the whole take
	 * would end inside a line (the free list gave slots, or a thread
	 * without a cache took one off the tail), none where no boundary
	 * lies within it and the free list gave slots.
	 * Where a magazine is shorter than a line, lines are shared
	 * whatever the takes: a full take, for fewer trips to the lock. */
	end = tail_used + (MAGAZINE_SLOTS - c->nr_loaded);
	if (end > SLOTS_PER_CHUNK)
		end = SLOTS_PER_CHUNK;
	if (MAGAZINE_SLOTS >= SLOTS_PER_LINE && end % SLOTS_PER_LINE) {
		if (end - end % SLOTS_PER_LINE > tail_used)
			end -= end % SLOTS_PER_LINE;
		else if (c->nr_loaded)
			end = tail_used;
	}
	while (tail_used < end)
		cache_push(c, tail_take());
}

/* One slot out of @c, or 0 when it has none. */
static uintptr_t cache_pop(struct slot_cache *c)
{
	uintptr_t cpu0;

	if (!c->nr_loaded && c->nr_full) {
		c->loaded = c->full[--c->nr_full];
		c->nr_loaded = MAGAZINE_SLOTS;
	}
	if (!c->nr_loaded)
		return 0;
	cpu0 = c->loaded;
	c->loaded = *(uintptr_t *)cpu0;
	c->nr_loaded--;
	return cpu0;
}

uintptr_t percpuref_counter_alloc(void)
{
	struct slot_cache *c = my_cache();
	uintptr_t cpu0 = c ? cache_pop(c) : 0;

	if (!cpu0) {
		pthread_mutex_lock(&alloc_lock);
		if (c) {
			/* No slot, no full magazine: load one (mapping a
			 * chunk if need be), then take from it. */
			cache_refill_locked(c);
			cpu0 = cache_pop(c);
			/* Under the lock that counted the loaded slots out of
			 * the pool: the stats never see them twice or not at all. */
			cache_count(c);
		} else {
			cpu0 = pool_take();
		}
		pthread_mutex_unlock(&alloc_lock);
		if (!cpu0)
			return 0;
	} else {
		cache_count(c);
	}
	/* The free link; the other copies are zero (internal.h), unless a
	 * fence let an add through. */
	if (percpuref_unfenced_adds_possible())
		percpuref_counter_clear(cpu0, percpuref_nr_units());
	else
		*percpuref_counter_on(cpu0, 0) = 0;
	return cpu0;
}

void percpuref_counter_free(uintptr_t cpu0)
{
	struct slot_cache *c = my_cache();

	if (!c) {
		pthread_mutex_lock(&alloc_lock);
		pool_put(cpu0);
		pthread_mutex_unlock(&alloc_lock);
		return;
	}
	if (c->nr_loaded == MAGAZINE_SLOTS) {
		/* Full: it goes on the stack.  When that is full, its top
		 * goes to the depot first, and the count follows under the
		 * lock that counted its slots back into the pool. */
		if (c->nr_full == FULL_MAGAZINES) {
			pthread_mutex_lock(&alloc_lock);
			pool_put_magazine(c->full[--c->nr_full], MAGAZINE_SLOTS);
			cache_count(c);
			pthread_mutex_unlock(&alloc_lock);
		}
		c->full[c->nr_full++] = c->loaded;
		c->loaded = 0;
		c->nr_loaded = 0;
	}
	cache_push(c, cpu0);
	cache_count(c);
}

void percpuref_spares_give(struct percpuref_spares *spares)
{
	if (!spares->n)
		return;
	pthread_mutex_lock(&alloc_lock);
	spare_put_locked(spares);
	pthread_mutex_unlock(&alloc_lock);
	spares_free(spares);
}

void percpuref_spare_keep(void *obj)
{
	struct slot_cache *c = percpuref_spares_off() ? NULL : my_cache();

	if (!c) {
		free(obj);
		return;
	}
	/* A full chain goes to the depot first, as a reclaimer's does. */
	if (c->spares.n == PERCPUREF_SPARE_CHAIN) {
		struct percpuref_spares full = c->spares;

		c->spares = (struct percpuref_spares){ NULL, 0 };
		percpuref_spares_give(&full);
	}
	*(void **)obj = c->spares.first;
	c->spares.first = obj;
	c->spares.n++;
}

void *percpuref_spare_take(void)
{
	struct slot_cache *c = my_cache();
	void *obj;

	if (!c)
		return NULL;
	if (!c->spares.n) {
		/* Relaxed: a hint; the lock orders the chain's contents. */
		if (!__atomic_load_n(&spare_depot_count, __ATOMIC_RELAXED))
			return NULL;
		pthread_mutex_lock(&alloc_lock);
		if (spare_depot_count) {
			c->spares = spare_depot[spare_depot_count - 1];
			/* Relaxed: the hint, as in spare_put_locked(). */
			__atomic_store_n(&spare_depot_count, spare_depot_count - 1,
					 __ATOMIC_RELAXED);
		}
		pthread_mutex_unlock(&alloc_lock);
		if (!c->spares.n)
			return NULL;
	}
	obj = c->spares.first;
	c->spares.first = spare_next(obj);
	c->spares.n--;
	return obj;
}

PERCPUREF_API unsigned long percpuref_test_spares_waiting(void)
{
	unsigned long n = 0;
	unsigned int i;

	pthread_mutex_lock(&alloc_lock);
	for (i = 0; i < spare_depot_count; i++)
		n += spare_depot[i].n;
	pthread_mutex_unlock(&alloc_lock);
	return n;
}

PERCPUREF_API void percpuref_test_spares_drop(void)
{
	unsigned int i;

	if (cache_state == CACHE_ACTIVE)
		spares_free(&cache->spares);
	/* A test's: the frees may as well wait under the lock. */
	pthread_mutex_lock(&alloc_lock);
	for (i = 0; i < spare_depot_count; i++)
		spares_free(&spare_depot[i]);
	/* Relaxed: the hint, as in spare_put_locked(). */
	__atomic_store_n(&spare_depot_count, 0, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&alloc_lock);
}

PERCPUREF_API void percpuref_get_counter_stats(struct percpuref_counter_stats *stats)
{
	size_t cached = 0;
	struct slot_cache *c;

	pthread_mutex_lock(&alloc_lock);
	/* Relaxed: statistics each owner writes without the lock
	 * (cache_count()), exact once the owner is quiet, which is all the
	 * stats promise. */
	for (c = registry.next; c != &registry; c = c->next)
		cached += __atomic_load_n(&c->count, __ATOMIC_RELAXED);
	/* The counts are read one after another, each owner's moving
	 * meanwhile: a slot one thread popped and another pushed before the
	 * walk reached it is counted in both caches.  Never more than went
	 * out of the pool (in use read 2^64 - 29); in use + free stays the
	 * mapped total. */
	if (cached > slots_handed_out)
		cached = slots_handed_out;
	stats->chunks = nr_chunks;
	stats->in_use = slots_handed_out - cached;
	stats->free = slots_on_free_list + depot_count * MAGAZINE_SLOTS + cached +
		      (SLOTS_PER_CHUNK - tail_used);
	stats->bytes_mapped = nr_chunks * chunk_bytes();
	pthread_mutex_unlock(&alloc_lock);
}

static void alloc_fork_lock(void)
{
	pthread_mutex_lock(&alloc_lock);
}

static void alloc_fork_parent(void)
{
	pthread_mutex_unlock(&alloc_lock);
}

/* Other threads' caches go, their slots lost: their owners do not exist
 * here, and may have been halfway through a push or a pop.  The C library
 * has reset its allocator's locks before the child handlers run. */
static void alloc_fork_child(void)
{
	struct slot_cache *c, *next;
	bool mine_linked = false;

	/* Ours is kept if linked, whatever its state says: a fork from a
	 * signal handler may come between the link and the state, and the
	 * thread goes on from there in the child. */
	for (c = registry.next; c != &registry; c = next) {
		next = c->next;
		if (c == cache)
			mine_linked = true;
		else
			free(c);
	}
	registry.next = registry.prev = &registry;
	if (mine_linked) {
		cache->next = cache->prev = &registry;
		registry.next = registry.prev = cache;
	}
	/* Its mark is the parent thread's (thread_exit.c): this one's now. */
	if (cache) {
		percpuref_owner_mark_init(&cache->owner);
		percpuref_owner_mark_take(&cache->owner);
	}
	pthread_mutex_unlock(&alloc_lock);
}

static const struct percpuref_fork_hooks alloc_hooks = {
	.rank = PERCPUREF_RANK_ALLOC,
	.prepare = alloc_fork_lock,
	.parent = alloc_fork_parent,
	.child = alloc_fork_child,
};

static __attribute__((constructor)) void alloc_register(void)
{
	percpuref_register_fork_hooks(&alloc_hooks);
}
