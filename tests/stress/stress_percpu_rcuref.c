/* SPDX-License-Identifier: MIT */
/*
 * Stress of percpu_rcuref: readers look objects up in an RCU-protected
 * table and tryget them, while the reclaimer scans back to back and a
 * writer keeps refilling the table with new objects: a third killed by the
 * writer after a while, a third managed from init (REL_MANAGED), a third
 * switched to managed once published; the writer puts its own reference of
 * every managed one.  @unpublish clears the slot, @release
 * poisons and frees the object (ASan catches a reader that touches it
 * late).  A quarter of the objects, of every life, are exited by their own
 * @unpublish instead, as percpu_rcuref.h allows, while readers may still
 * tryget them: their @release never runs, and they are freed at the end,
 * once no reader can hold them.
 *
 * Checked: no tryget succeeds after @unpublish (the count reached zero),
 * every object is unpublished and released (or exited) exactly once, in
 * that order, and no tryget warns (one on an object exited under readers
 * did).  Duration: STRESS_SECONDS (default 2).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_rcuref.h"
#include "rnd.h"
#include "tap.h"

#define container_of(p, type, member) ((type *)((char *)(p)-offsetof(type, member)))

#define SLOTS 32
#define NR_READERS 3
#define MAGIC 0xfeedf00dUL

struct obj {
	struct percpu_rcuref ref;
	unsigned long magic;
	unsigned int slot;
	int unpublished;	/* atomic */
	bool exit_in_unpublish;
	struct obj *next_exited;	/* on the exited list */
};

static struct obj *table[SLOTS];	/* RCU-protected */
static int stop;
static long errors, created, unpublished, freed, lookups, hits;
static struct obj *exited;	/* exited by @unpublish, freed at the end */

static void obj_unpublish(struct percpu_rcuref *ref)
{
	struct obj *o = container_of(ref, struct obj, ref);
	struct obj *expected = o;

	if (__atomic_exchange_n(&o->unpublished, 1, __ATOMIC_SEQ_CST))
		__atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);
	/* Relaxed: the slot goes back to the writer; readers who still
	 * load o are covered by the grace period. */
	__atomic_compare_exchange_n(&table[o->slot], &expected, NULL, false, __ATOMIC_RELAXED,
				    __ATOMIC_RELAXED);
	__atomic_fetch_add(&unpublished, 1, __ATOMIC_RELAXED);
	if (!o->exit_in_unpublish)
		return;
	/* Readers that found it may still tryget it: kept until the end. */
	percpu_rcuref_exit(ref);
	o->next_exited = __atomic_load_n(&exited, __ATOMIC_RELAXED);
	while (!__atomic_compare_exchange_n(&exited, &o->next_exited, o, true, __ATOMIC_RELEASE,
					    __ATOMIC_RELAXED))
		;
}

static void obj_release(struct percpu_rcuref *ref)
{
	struct obj *o = container_of(ref, struct obj, ref);

	if (o->magic != MAGIC || !__atomic_load_n(&o->unpublished, __ATOMIC_SEQ_CST))
		__atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);
	percpu_rcuref_exit(&o->ref);
	memset(o, 0x5a, sizeof(*o));
	free(o);
	__atomic_fetch_add(&freed, 1, __ATOMIC_RELAXED);
}

static void *reader(void *arg)
{
	unsigned int seed = (unsigned int)(uintptr_t)arg;
	long n = 0, got = 0;

	while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
		struct obj *o;
		bool ok;

		percpu_rcuref_read_lock();
		/* Acquire: pairs with the writer's release store. */
		o = __atomic_load_n(&table[rnd(&seed) % SLOTS], __ATOMIC_ACQUIRE);
		ok = o && percpu_rcuref_tryget(&o->ref);
		if (o && o->magic != MAGIC)
			__atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);
		percpu_rcuref_read_unlock();
		n++;
		if (!ok)
			continue;
		got++;
		if (__atomic_load_n(&o->unpublished, __ATOMIC_SEQ_CST))
			__atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);
		percpu_rcuref_get(&o->ref);
		if (rnd(&seed) % 16 == 0)
			sched_yield();
		percpu_rcuref_put(&o->ref);
		percpu_rcuref_put(&o->ref);
	}
	__atomic_fetch_add(&lookups, n, __ATOMIC_RELAXED);
	__atomic_fetch_add(&hits, got, __ATOMIC_RELAXED);
	return NULL;
}

static void writer(double seconds)
{
	long created_before = __atomic_load_n(&created, __ATOMIC_RELAXED);
	struct obj *killable[SLOTS] = { 0 };
	double elapsed;
	struct timespec start, now;
	unsigned int seed = 3, i;

	clock_gettime(CLOCK_MONOTONIC, &start);
	do {
		i = rnd(&seed) % SLOTS;
		if (killable[i] && rnd(&seed) % 2) {
			percpu_rcuref_kill(&killable[i]->ref);	/* its life ends */
			killable[i] = NULL;
		}
		if (!__atomic_load_n(&table[i], __ATOMIC_RELAXED) && !killable[i]) {
			struct obj *o = calloc(1, sizeof(*o));
			/* Killed by us, managed from init, or managed once
			 * published. */
			unsigned int life = rnd(&seed) % 3;

			if (!o || percpu_rcuref_init(&o->ref, obj_unpublish, obj_release,
						     life == 1 ? PERCPU_REF_REL_MANAGED
							       : PERCPU_REF_ALLOW_REINIT))
				abort();
			o->magic = MAGIC;
			o->slot = i;
			o->exit_in_unpublish = rnd(&seed) % 4 == 0;
			__atomic_fetch_add(&created, 1, __ATOMIC_RELAXED);
			/* Release: readers see an initialised object. */
			__atomic_store_n(&table[i], o, __ATOMIC_RELEASE);
			if (life == 0) {
				killable[i] = o;
			} else {
				if (life == 2)
					percpu_rcuref_switch_to_managed(&o->ref);
				percpu_rcuref_put(&o->ref);	/* the creator's */
			}
		}
		if (rnd(&seed) % 8 == 0)
			sched_yield();
		clock_gettime(CLOCK_MONOTONIC, &now);
		elapsed = (double)(now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9;
		/* On a slow or loaded machine (valgrind), past the time until
		 * the phase made enough objects for the check below. */
	} while (elapsed < seconds ||
		 (__atomic_load_n(&created, __ATOMIC_RELAXED) - created_before < 60 && elapsed < 30));
	for (i = 0; i < SLOTS; i++)
		if (killable[i])
			percpu_rcuref_kill(&killable[i]->ref);
}

int main(void)
{
	struct percpu_ref_managed_config c = { 0, 0, PERCPU_REF_SCAN_BATCHED };
	unsigned long warned = percpuref_warning_count();
	pthread_t threads[NR_READERS];
	long i;

	percpu_ref_managed_set_config(&c);
	for (i = 0; i < NR_READERS; i++)
		pthread_create(&threads[i], NULL, reader, (void *)(uintptr_t)(i + 1));
	writer(stress_seconds(2) / 2);
	c.strategy = PERCPU_REF_SCAN_FAITHFUL;
	percpu_ref_managed_set_config(&c);
	writer(stress_seconds(2) / 2);
	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	for (i = 0; i < NR_READERS; i++)
		pthread_join(threads[i], NULL);
	percpu_rcuref_barrier();	/* the writer's kills */
	percpu_ref_managed_flush();	/* the managed ones */
	/* Acquire: pairs with the pushes' release. */
	for (struct obj *o = __atomic_load_n(&exited, __ATOMIC_ACQUIRE), *next; o; o = next) {
		next = o->next_exited;
		if (o->ref.ref.data || o->ref.state)
			errors++;	/* not exited */
		memset(o, 0x5a, sizeof(*o));
		free(o);
		freed++;
	}

	printf("# %ld objects, %ld lookups, %ld trygets succeeded\n", created, lookups, hits);
	ok(created > 100 && hits > 1000, "objects came and went, readers found them");
	is(unpublished, created, "every object unpublished once");
	is(freed, created, "every object released (or exited) once, after its unpublish");
	is(errors, 0, "no tryget after zero, no stale object seen");
	is(percpuref_warning_count() - warned, 0, "no call warned");
	return done_testing();
}
