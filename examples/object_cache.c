/* SPDX-License-Identifier: MIT */
/*
 * object_cache.c - a lookup table whose entries nobody owns: managed
 * percpu_rcuref.  Lookups find an entry or create it; the library's
 * reclaimer releases an entry at the first scan that finds no reference
 * on it but its own (no idle time, no LRU: an entry put down just before
 * a scan goes at that scan, and the next lookup creates it again).
 *
 * No owner could kill an entry: whoever created it is just its first user.
 * So the entry is handed to the manager (the reclaimer thread), which
 * takes a reference of its own and periodically checks whether its
 * reference is the only one left; if so it calls @unpublish (take the
 * entry out of the table) at once, and @release after an RCU grace period
 * (free it).  Readers find entries under percpu_rcuref_read_lock() and
 * tryget them, which fails once the reclaimer decided to release.
 *
 * The steps:
 *   create:  percpu_rcuref_init(&e->ref, unpublish, release, PERCPU_REF_INIT_ATOMIC)
 *                                            count 1: the creator's reference
 *            percpu_rcuref_switch_to_managed(&e->ref)
 *                                            the manager takes its own (count 2)
 *            publish e in the table; return it to the caller with the
 *            creator's reference, which the caller drops with put like any
 *            other (never kill a managed ref)
 *   lookup:  read_lock; e = table[key]; ok = e && tryget(&e->ref); read_unlock
 *   done:    percpu_rcuref_put(&e->ref)
 *   idle:    the reclaimer: unpublish(e) -> grace period -> release(e)
 * INIT_ATOMIC: until the switch to managed mode the count is one atomic,
 * so an entry that failed before it went live (none can here) would just
 * be exited and freed; the switch makes it per-CPU.
 *
 * The reclaimer scans every 5 s by default; here it scans every
 * millisecond (percpu_ref_managed_set_config()), and the users pause now
 * and then, so entries go idle and are released while the other user
 * looks them up: the lookups race with releases until RELEASES_WANTED
 * entries went that way.  Then percpu_ref_managed_flush() makes the final
 * checks deterministic.
 */
/* rand_r() and nanosleep(), which -std=c11 alone hides. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <percpuref/managed.h>
#include <percpuref/percpu_rcuref.h>

#include "check.h"

#define KEYS 64
#define THREADS 2
#define RELEASES_WANTED 5000	/* while the lookups run */
#define PHASE_LIMIT_S 60	/* at most, on a slow (sanitized) build */
#define ENTRY_MAGIC 0x5ca1ab1eUL

struct entry {
	struct percpu_rcuref ref;
	unsigned long key;
	unsigned long magic;	/* ENTRY_MAGIC while allocated */
};

static struct entry *table[KEYS];	/* RCU-protected pointers */
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;	/* writers */
static long created, released;
static long lost_races;		/* lookups whose tryget found it released */
static bool stop;		/* the users' loop: set by main() */

static struct entry *entry_of(struct percpu_rcuref *ref)
{
	return (struct entry *)((char *)ref - offsetof(struct entry, ref));
}

/* Reclaimer thread, at once: nobody may find the entry from now on. */
static void entry_unpublish(struct percpu_rcuref *ref)
{
	struct entry *e = entry_of(ref);

	pthread_mutex_lock(&table_lock);
	if (table[e->key] == e)
		__atomic_store_n(&table[e->key], NULL, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&table_lock);
}

/* Reclaimer thread, after a grace period: no reader still sees it. */
static void entry_release(struct percpu_rcuref *ref)
{
	struct entry *e = entry_of(ref);

	CHECK(e->magic == ENTRY_MAGIC);
	e->magic = 0;
	percpu_rcuref_exit(&e->ref);
	free(e);
	__atomic_fetch_add(&released, 1, __ATOMIC_RELAXED);
}

static struct entry *entry_create(unsigned long key)
{
	struct entry *e = malloc(sizeof(*e));

	CHECK(e != NULL);
	e->key = key;
	e->magic = ENTRY_MAGIC;
	CHECK(percpu_rcuref_init(&e->ref, entry_unpublish, entry_release,
				 PERCPU_REF_INIT_ATOMIC) == 0);
	/* The manager takes its own reference; ours goes to the caller. */
	CHECK(percpu_rcuref_switch_to_managed(&e->ref) == 0);
	__atomic_fetch_add(&created, 1, __ATOMIC_RELAXED);
	return e;
}

/* A counted reference to the entry of @key, found or created. */
static struct entry *cache_lookup(unsigned long key)
{
	struct entry *e, *fresh;

	percpu_rcuref_read_lock();
	/* Acquire pairs with the release store that published the entry. */
	e = __atomic_load_n(&table[key], __ATOMIC_ACQUIRE);
	if (e && !percpu_rcuref_tryget(&e->ref)) {
		e = NULL;	/* being released: create a new one */
		__atomic_fetch_add(&lost_races, 1, __ATOMIC_RELAXED);
	}
	percpu_rcuref_read_unlock();
	if (e)
		return e;

	fresh = entry_create(key);
	pthread_mutex_lock(&table_lock);
	/* Someone may have published a live entry meanwhile: use it. */
	e = table[key];
	if (e && percpu_rcuref_tryget(&e->ref)) {
		pthread_mutex_unlock(&table_lock);
		/* Our unused entry: the reclaimer finds it idle and frees it
		 * (unpublish sees it is not in the table). */
		percpu_rcuref_put(&fresh->ref);
		return e;
	}
	__atomic_store_n(&table[key], fresh, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&table_lock);
	return fresh;
}

static void *user(void *arg)
{
	unsigned int seed = (unsigned int)(uintptr_t)arg;
	const struct timespec pause = { .tv_nsec = 100 * 1000 };

	/* Relaxed: a stop flag; the join orders everything after it. */
	for (unsigned long i = 0; !__atomic_load_n(&stop, __ATOMIC_RELAXED); i++) {
		unsigned long key = (unsigned long)rand_r(&seed) % KEYS;
		struct entry *e = cache_lookup(key);

		CHECK(e->magic == ENTRY_MAGIC && e->key == key);
		percpu_rcuref_put(&e->ref);
		/* Now and then nothing held: entries go idle, and go. */
		if (i % 64 == 63)
			nanosleep(&pause, NULL);
	}
	return NULL;
}

int main(void)
{
	struct percpu_ref_managed_config config;
	pthread_t threads[THREADS];
	const struct timespec tick = { .tv_nsec = 1000 * 1000 };
	time_t start = time(NULL);
	long released_racing;
	struct entry *pinned;

	percpu_ref_managed_get_config(&config);
	config.interval_ms = 1;
	CHECK(percpu_ref_managed_set_config(&config) == 0);

	for (uintptr_t i = 0; i < THREADS; i++)
		CHECK(pthread_create(&threads[i], NULL, user, (void *)(i + 1)) == 0);
	while (__atomic_load_n(&released, __ATOMIC_RELAXED) < RELEASES_WANTED &&
	       time(NULL) - start < PHASE_LIMIT_S)
		nanosleep(&tick, NULL);
	__atomic_store_n(&stop, true, __ATOMIC_RELAXED);
	for (int i = 0; i < THREADS; i++)
		CHECK(pthread_join(threads[i], NULL) == 0);
	/* The lookups raced with releases, or this showed nothing.  Atomic:
	 * the reclaimer may still be releasing an entry a lost race left. */
	released_racing = __atomic_load_n(&released, __ATOMIC_RELAXED);
	CHECK(released_racing >= RELEASES_WANTED);

	/* A user still holding an entry keeps it; every idle one goes. */
	pinned = cache_lookup(7);
	CHECK(percpu_ref_managed_flush() == 0);
	CHECK(__atomic_load_n(&released, __ATOMIC_RELAXED) ==
	      __atomic_load_n(&created, __ATOMIC_RELAXED) - 1);
	for (unsigned long k = 0; k < KEYS; k++)
		CHECK(table[k] == (k == 7 ? pinned : NULL));
	CHECK(pinned->magic == ENTRY_MAGIC);

	/* Dropping the last user reference lets the reclaimer take it too. */
	percpu_rcuref_put(&pinned->ref);
	CHECK(percpu_ref_managed_flush() == 0);
	CHECK(released == created && table[7] == NULL);
	printf("object_cache: %ld entries created, %ld released while lookups ran (%ld lookups "
	       "found theirs being released), all released by the reclaimer\n",
	       created, released_racing, lost_races);
	return 0;
}
