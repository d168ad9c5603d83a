/* SPDX-License-Identifier: MIT */
/*
 * Stress of managed percpu_refs while the reclaimer scans as fast as it can
 * (interval 0), its strategy and per-scan limit flipped at random.
 *
 * Long-lived objects: workers tryget / tryget_live / get / put a table of
 * static managed refs (held by the manager alone between uses); a
 * controller restarts every released one with reinit, and now and then
 * takes a reference, takes the ref off management, kills it itself and
 * puts it back.  Checked: every life ends in exactly one release, no tryget
 * succeeds on a released ref.
 *
 * Short-lived objects: a producer creates heap objects, switches them to
 * managed and hands them (with the creator's reference)
 * to the workers, who use them and drop the reference; the reclaimer frees
 * them in @release (poisoned first, so ASan catches any late access), and
 * one release in eight creates a new managed object itself.  Checked: every
 * object is freed exactly once, by the end.
 *
 * Cyclers: threads that each make 1 to CYCLE_BATCH heap refs managed,
 * use them, and end each, in push order or the reverse (so that its node
 * is on top of its stage or below another), in one of three ways:
 * unmanaged, killed and exited after its release; exited while managed;
 * unmanaged, managed again, then as the first.  A node still on top is
 * taken back (percpuref_managed_unstage()) while the reclaimer takes the
 * stages back to back and other threads push on the same CPUs.  Checked:
 * each killed ref released exactly once, none exited while managed ever
 * released (its object is freed at once, poisoned).
 *
 * Flushes: a thread makes a managed ref of its own, drops its reference and
 * flushes, again and again, during the above and then for a third of the
 * time alone, the list held non-empty, with a thread reading the statistics
 * as a monitor would.  Checked: every flush that returns 0 has released
 * the ref.  A flush that took its target while a pass was opening named
 * that pass, which began before the ref was pushed, and returned with the
 * ref unreleased (about 1 in 20,000 flushes of the second phase; the
 * statistics reader keeps managed_lock busy, widening the window).
 * Duration: STRESS_SECONDS (default 2).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_ref.h"
#include "rnd.h"
#include "tap.h"

/* A kill's release the controller waits for comes within microseconds;
 * one that has not come in this long never will (a lost release ran into
 * ctest's timeout of 600 s).  Generous for the sanitizers and valgrind. */
#define KILL_RELEASE_TIMEOUT_S 60.0

#define container_of(p, type, member) ((type *)((char *)(p)-offsetof(type, member)))

#define NR_STATIC 32
#define NR_WORKERS 3
#define NR_CYCLERS 2
#define CYCLE_BATCH 4
#define RING 64
#define MAGIC 0x5eed5eedUL

struct obj {
	struct percpu_ref ref;
	int released;		/* set by release, cleared before reinit */
	long releases, lives;
};

struct heap_obj {
	struct percpu_ref ref;
	unsigned long magic;
	unsigned long uses;	/* atomic: workers add to it */
};

static struct obj objs[NR_STATIC];
static int stop;
static long errors, created, freed, spawns;
/*
 * Heap objects made and not yet freed.  A release that makes one counts it
 * before its own free, so 0 means none is left, nor any release that could
 * make one.  The end waited for freed == created read as two loads: a
 * release could make an object between them, and the final count raced
 * with a release still running (ThreadSanitizer, stress_managed).
 */
static long live;
static long flushes, flush_misses;	/* the flusher's */
static long cycles;			/* the cyclers' refs, ended */

/* Hand-off of heap objects, each with one user reference. */
static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;
static struct heap_obj *ring[RING];
static unsigned int ring_head, ring_tail;

static void obj_release(struct percpu_ref *ref)
{
	struct obj *o = container_of(ref, struct obj, ref);

	if (__atomic_exchange_n(&o->released, 1, __ATOMIC_SEQ_CST))
		__atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);	/* twice */
	__atomic_fetch_add(&o->releases, 1, __ATOMIC_RELAXED);
}

static struct heap_obj *heap_obj_new(void);

static void heap_release(struct percpu_ref *ref)
{
	struct heap_obj *h = container_of(ref, struct heap_obj, ref);

	if (h->magic != MAGIC)
		__atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);
	/* Now and then a release makes a new managed object and drops its
	 * creator's reference: the next pass releases it. */
	if (__atomic_fetch_add(&spawns, 1, __ATOMIC_RELAXED) % 8 == 0) {
		struct heap_obj *spawned = heap_obj_new();

		percpu_ref_switch_to_managed(&spawned->ref);
		percpu_ref_put(&spawned->ref);
	}
	percpu_ref_exit(&h->ref);
	memset(h, 0xa5, sizeof(*h));
	free(h);
	__atomic_fetch_add(&freed, 1, __ATOMIC_RELAXED);
	/* Release: the main thread's acquire load that reads 0 sees every
	 * count before it. */
	__atomic_fetch_sub(&live, 1, __ATOMIC_RELEASE);
}

static struct heap_obj *heap_obj_new(void)
{
	struct heap_obj *h = calloc(1, sizeof(*h));

	if (!h || percpu_ref_init(&h->ref, heap_release, PERCPU_REF_ALLOW_REINIT))
		abort();
	h->magic = MAGIC;
	__atomic_fetch_add(&created, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&live, 1, __ATOMIC_RELAXED);
	return h;
}

static struct heap_obj *ring_take(void)
{
	struct heap_obj *h = NULL;

	pthread_mutex_lock(&ring_lock);
	if (ring_tail != ring_head)
		h = ring[ring_tail++ % RING];
	pthread_mutex_unlock(&ring_lock);
	return h;
}

static bool ring_give(struct heap_obj *h)
{
	bool ok = false;

	pthread_mutex_lock(&ring_lock);
	if (ring_head - ring_tail < RING) {
		ring[ring_head++ % RING] = h;
		ok = true;
	}
	pthread_mutex_unlock(&ring_lock);
	return ok;
}

static void use_static(unsigned int *seed)
{
	struct obj *o = &objs[rnd(seed) % NR_STATIC];
	bool got = rnd(seed) & 1 ? percpu_ref_tryget_live(&o->ref) : percpu_ref_tryget(&o->ref);
	unsigned int k, extra = rnd(seed) % 3;

	if (!got)
		return;
	if (__atomic_load_n(&o->released, __ATOMIC_SEQ_CST))
		__atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);
	for (k = 0; k < extra; k++)
		percpu_ref_get(&o->ref);
	if (rnd(seed) % 16 == 0)
		sched_yield();
	percpu_ref_put_many(&o->ref, extra + 1);
}

static void use_heap(unsigned int *seed)
{
	struct heap_obj *h = ring_take();
	unsigned int k, n = rnd(seed) % 4;

	if (!h)
		return;
	for (k = 0; k < n; k++) {
		percpu_ref_get(&h->ref);
		if (h->magic != MAGIC)
			__atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);
		__atomic_fetch_add(&h->uses, 1, __ATOMIC_RELAXED);
		percpu_ref_put(&h->ref);
	}
	percpu_ref_put(&h->ref);	/* the reference handed over */
}

static void *worker(void *arg)
{
	unsigned int seed = (unsigned int)(uintptr_t)arg;

	while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
		use_static(&seed);
		if (rnd(&seed) % 4 == 0)
			use_heap(&seed);
	}
	return NULL;
}

struct cycled {
	struct percpu_ref ref;
	unsigned long magic;
	int released;
};

static void cycled_release(struct percpu_ref *ref)
{
	struct cycled *c = container_of(ref, struct cycled, ref);

	if (c->magic != MAGIC || __atomic_exchange_n(&c->released, 1, __ATOMIC_SEQ_CST))
		__atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);
}

/* Unmanaged, killed, released once, exited. */
static void cycled_kill(struct cycled *c)
{
	if (percpu_ref_switch_to_unmanaged(&c->ref))
		__atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);
	percpu_ref_kill(&c->ref);
	while (!__atomic_load_n(&c->released, __ATOMIC_SEQ_CST))
		sched_yield();
	percpu_ref_exit(&c->ref);
}

static void *cycler(void *arg)
{
	unsigned int seed = (unsigned int)(uintptr_t)arg;
	struct cycled *batch[CYCLE_BATCH];
	unsigned int i, n;
	bool reverse;

	while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
		n = 1 + rnd(&seed) % CYCLE_BATCH;
		for (i = 0; i < n; i++) {
			struct cycled *c = calloc(1, sizeof(*c));

			if (!c || percpu_ref_init(&c->ref, cycled_release, PERCPU_REF_ALLOW_REINIT))
				abort();
			c->magic = MAGIC;
			percpu_ref_switch_to_managed(&c->ref);
			percpu_ref_get(&c->ref);
			percpu_ref_put(&c->ref);
			batch[i] = c;
		}
		reverse = rnd(&seed) & 1;
		for (i = 0; i < n; i++) {
			struct cycled *c = batch[reverse ? n - 1 - i : i];

			switch (rnd(&seed) % 3) {
			case 0:
				cycled_kill(c);
				break;
			case 1:	/* the creator's reference keeps it */
				if (__atomic_load_n(&c->released, __ATOMIC_SEQ_CST))
					__atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);
				percpu_ref_exit(&c->ref);
				break;
			default:
				if (percpu_ref_switch_to_unmanaged(&c->ref) ||
				    percpu_ref_switch_to_managed(&c->ref))
					__atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);
				cycled_kill(c);
				break;
			}
			memset(c, 0xa5, sizeof(*c));
			free(c);
			__atomic_fetch_add(&cycles, 1, __ATOMIC_RELAXED);
		}
	}
	return NULL;
}

static void *flusher(void *arg)
{
	struct obj o = { 0 };
	int ret;

	(void)arg;
	while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
		__atomic_store_n(&o.released, 0, __ATOMIC_SEQ_CST);
		if (percpu_ref_init(&o.ref, obj_release, PERCPU_REF_REL_MANAGED))
			abort();
		percpu_ref_put(&o.ref);	/* only the manager's is left */
		ret = percpu_ref_managed_flush();
		flushes++;
		if (ret || !__atomic_load_n(&o.released, __ATOMIC_SEQ_CST))
			flush_misses++;
		/* Whatever the flush did, the ref goes before its exit. */
		while (!__atomic_load_n(&o.released, __ATOMIC_SEQ_CST))
			percpu_ref_managed_flush();
		percpu_ref_exit(&o.ref);
	}
	return NULL;
}

static void *stats_reader(void *arg)
{
	struct percpu_ref_managed_stats stats;

	(void)arg;
	while (!__atomic_load_n(&stop, __ATOMIC_RELAXED))
		percpu_ref_managed_get_stats(&stats);
	return NULL;
}

/* The flusher and a statistics reader alone, a held managed ref keeping
 * the list non-empty (so every pass pushes a marker), scans back to back. */
static void flush_phase(double seconds)
{
	struct percpu_ref_managed_config c = { 0, 0, PERCPU_REF_SCAN_FILTERED };
	pthread_t flush_thread, stats_thread;
	struct obj held = { 0 };
	double start = now_seconds();

	if (percpu_ref_init(&held.ref, obj_release, PERCPU_REF_REL_MANAGED))
		abort();
	percpu_ref_managed_set_config(&c);
	__atomic_store_n(&stop, 0, __ATOMIC_RELAXED);
	pthread_create(&flush_thread, NULL, flusher, NULL);
	pthread_create(&stats_thread, NULL, stats_reader, NULL);
	while (now_seconds() - start < seconds)
		usleep(10000);
	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	pthread_join(flush_thread, NULL);
	pthread_join(stats_thread, NULL);
	percpu_ref_put(&held.ref);
	while (!__atomic_load_n(&held.released, __ATOMIC_SEQ_CST))
		percpu_ref_managed_flush();
	percpu_ref_exit(&held.ref);
}

static void *producer(void *arg)
{
	struct heap_obj *h;

	(void)arg;
	while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
		h = heap_obj_new();
		/* The creator's reference is the one we hand over. */
		percpu_ref_switch_to_managed(&h->ref);
		while (!ring_give(h)) {
			if (__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
				percpu_ref_put(&h->ref);
				break;
			}
			sched_yield();
		}
	}
	return NULL;
}

static void flip_config(unsigned int *seed)
{
	static const unsigned long maxes[] = { 0, 1, 7, 100 };
	struct percpu_ref_managed_config c = {
		.interval_ms = 0,
		.max_per_scan = maxes[rnd(seed) % 4],
		.strategy = rnd(seed) & 1 ? PERCPU_REF_SCAN_FAITHFUL : PERCPU_REF_SCAN_BATCHED,
	};

	percpu_ref_managed_set_config(&c);
}

/* Kills whose release never came (the controller stops at the first). */
static long lost_kills;

static long controller(double seconds)
{
	double start = now_seconds(), deadline;
	unsigned int seed = 42, i;
	long ops = 0;

	do {
		struct obj *o = &objs[rnd(&seed) % NR_STATIC];

		if (rnd(&seed) % 64 == 0)
			flip_config(&seed);
		if (rnd(&seed) % 8 == 0 && !__atomic_load_n(&o->released, __ATOMIC_SEQ_CST) &&
		    percpu_ref_tryget(&o->ref)) {
			/* Our reference keeps it from the reclaimer; the
			 * manager drops its own, and we end this life
			 * ourselves, our reference as the initial one. */
			if (percpu_ref_switch_to_unmanaged(&o->ref))
				__atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);
			percpu_ref_kill(&o->ref);
			deadline = now_seconds() + KILL_RELEASE_TIMEOUT_S;
			while (!__atomic_load_n(&o->released, __ATOMIC_SEQ_CST)) {
				if (now_seconds() > deadline) {
					lost_kills++;
					return ops;
				}
				sched_yield();
			}
			__atomic_store_n(&o->released, 0, __ATOMIC_SEQ_CST);
			o->lives++;
			percpu_ref_reinit(&o->ref);
			percpu_ref_switch_to_managed(&o->ref);
			percpu_ref_put(&o->ref);	/* the new initial one */
			ops++;
		}
		for (i = 0; i < NR_STATIC; i++) {
			o = &objs[i];
			if (!__atomic_load_n(&o->released, __ATOMIC_SEQ_CST))
				continue;
			/* Released by the reclaimer: start the next life,
			 * managed again; drop the new initial reference. */
			__atomic_store_n(&o->released, 0, __ATOMIC_SEQ_CST);
			o->lives++;
			percpu_ref_reinit(&o->ref);
			percpu_ref_put(&o->ref);
			ops++;
		}
		sched_yield();
	} while (now_seconds() - start < seconds);
	return ops;
}

int main(void)
{
	pthread_t threads[NR_WORKERS], cyclers[NR_CYCLERS], prod, flush_thread;
	struct percpu_ref_managed_stats stats;
	struct heap_obj *h;
	long control_ops, i, releases = 0, lives = 0;
	unsigned int seed = 7;
	bool once = true;
	unsigned long warned = percpuref_warning_count();

	flip_config(&seed);
	for (i = 0; i < NR_STATIC; i++) {
		if (percpu_ref_init(&objs[i].ref, obj_release, PERCPU_REF_ALLOW_REINIT))
			return 1;
		objs[i].lives = 1;
		percpu_ref_switch_to_managed(&objs[i].ref);
		percpu_ref_put(&objs[i].ref);
	}
	for (i = 0; i < NR_WORKERS; i++)
		pthread_create(&threads[i], NULL, worker, (void *)(uintptr_t)(i + 1));
	for (i = 0; i < NR_CYCLERS; i++)
		pthread_create(&cyclers[i], NULL, cycler, (void *)(uintptr_t)(i + 100));
	pthread_create(&prod, NULL, producer, NULL);
	pthread_create(&flush_thread, NULL, flusher, NULL);
	control_ops = controller(stress_seconds(2) * 2 / 3);
	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	for (i = 0; i < NR_WORKERS; i++)
		pthread_join(threads[i], NULL);
	for (i = 0; i < NR_CYCLERS; i++)
		pthread_join(cyclers[i], NULL);
	pthread_join(prod, NULL);
	pthread_join(flush_thread, NULL);
	flush_phase(stress_seconds(2) / 3);
	while ((h = ring_take()))
		percpu_ref_put(&h->ref);

	/* Nobody holds a user reference now: one flush per generation of
	 * objects made by releases (each makes at most one). */
	for (i = 0; i < 100 && percpu_ref_managed_flush() == 0 &&
		    __atomic_load_n(&live, __ATOMIC_ACQUIRE) != 0;
	     i++)
		;
	percpu_ref_managed_get_stats(&stats);
	printf("# %ld restarts; reclaimer: %lu scans, %lu refs checked, %lu released, "
	       "%lu fences; %ld heap objects\n", control_ops, (unsigned long)stats.scans,
	       (unsigned long)stats.refs_scanned, (unsigned long)stats.released,
	       (unsigned long)stats.fences, __atomic_load_n(&created, __ATOMIC_RELAXED));
	is(lost_kills, 0, "every kill of the controller's released within %.0f s",
	   KILL_RELEASE_TIMEOUT_S);
	ok(control_ops > 10 && __atomic_load_n(&created, __ATOMIC_RELAXED) > 100 &&
	   __atomic_load_n(&cycles, __ATOMIC_RELAXED) > 100,
	   "lives restarted and objects went through (%ld cycled refs)",
	   __atomic_load_n(&cycles, __ATOMIC_RELAXED));
	percpu_ref_barrier();	/* releases of the controller's kills */
	for (i = 0; i < NR_STATIC; i++) {
		long n = __atomic_load_n(&objs[i].releases, __ATOMIC_RELAXED);

		releases += n;
		lives += objs[i].lives;
		if (n != objs[i].lives) {
			printf("# ref %ld: %ld releases for %ld lives\n", i, n, objs[i].lives);
			once = false;
		}
		percpu_ref_exit(&objs[i].ref);
	}
	ok(once, "every life of %ld ended in exactly one release (%ld)", lives, releases);
	is(__atomic_load_n(&freed, __ATOMIC_RELAXED), __atomic_load_n(&created, __ATOMIC_RELAXED),
	   "every heap object freed exactly once");
	is(errors, 0, "no tryget succeeded on a released ref, no double release, no stale object, "
	   "no ref exited while managed released");
	is(flush_misses, 0, "every one of %ld flushes released the ref dropped before it", flushes);
	/* A count below zero is leaked and warned, not released: only the
	 * warning shows it. */
	is(percpuref_warning_count() - warned, 0, "no call warned");
	return done_testing();
}
