/* SPDX-License-Identifier: MIT */
/*
 * config_snapshot.c - a configuration snapshot published by one thread and
 * read by every worker: percpu_rcuref, its read lock, and a kill when the
 * snapshot is replaced.
 *
 * Workers look the current snapshot up on every request and keep it for
 * the length of the request; an admin thread replaces it now and then.
 * Why not a plain percpu_ref?  Between a worker's load of `current` and
 * its tryget, the admin may swap the pointer and the last put may free the
 * old snapshot: the tryget would touch freed memory.  percpu_rcuref frees
 * only after an RCU grace period, so a worker that loaded the pointer
 * inside percpu_rcuref_read_lock() may tryget it: the memory is still
 * there, and tryget fails only once the count reached zero (which cannot
 * happen here while the snapshot is current: the admin's initial
 * reference keeps it alive until the swap).
 *
 * The steps:
 *   admin:   percpu_rcuref_init(&new->ref, NULL, release, 0)   count 1 (the admin's)
 *            old = exchange(&current, new)                     publish (release order)
 *            percpu_rcuref_kill(&old->ref)                     drop the admin's reference
 *   worker:  percpu_rcuref_read_lock(); c = load(&current);
 *            ok = percpu_rcuref_tryget(&c->ref); percpu_rcuref_read_unlock();
 *            ... use c for the whole request ...;  percpu_rcuref_put(&c->ref)
 *   release: runs on the library's reclaimer thread after a grace period;
 *            percpu_rcuref_exit() and free.
 * No @unpublish callback: the admin already took the old snapshot out of
 * `current` before killing it, so nobody can find it any more.
 */
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>

#include <percpuref/percpu_rcuref.h>

#include "check.h"

#define WORKERS 2
#define SNAPSHOTS 200
#define SETTINGS 16

struct config {
	struct percpu_rcuref ref;
	long version;
	/* Each equal to version; the release sets version to -1 first, so a
	 * reader of a torn snapshot, or of a freed one whose block malloc has
	 * not reused yet, sees them differ (a reused block: ASan sees it). */
	long settings[SETTINGS];
};

static struct config *current;		/* the published snapshot */
static long released;			/* snapshots freed (reclaimer thread) */
static long seen[WORKERS];		/* newest version each worker used */
static bool stop;

static void config_release(struct percpu_rcuref *ref)
{
	struct config *c = (struct config *)ref;	/* ref is the first member */

	for (int i = 0; i < SETTINGS; i++)
		CHECK(c->settings[i] == c->version);
	c->version = -1;
	percpu_rcuref_exit(&c->ref);
	free(c);
	__atomic_fetch_add(&released, 1, __ATOMIC_RELAXED);
}

static struct config *config_new(long version)
{
	struct config *c = malloc(sizeof(*c));

	CHECK(c != NULL);
	c->version = version;
	for (int i = 0; i < SETTINGS; i++)
		c->settings[i] = version;
	CHECK(percpu_rcuref_init(&c->ref, NULL, config_release, 0) == 0);
	return c;
}

/* The worker's lookup: a counted reference to the current snapshot. */
static struct config *config_get(void)
{
	struct config *c;

	percpu_rcuref_read_lock();
	/* Acquire pairs with the admin's exchange: the settings are visible. */
	c = __atomic_load_n(&current, __ATOMIC_ACQUIRE);
	if (!percpu_rcuref_tryget(&c->ref))
		c = NULL;	/* replaced and released meanwhile: retry */
	percpu_rcuref_read_unlock();
	return c;
}

static void *worker(void *arg)
{
	long *my_seen = arg, last_version = 0;

	while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
		struct config *c = config_get();

		if (!c)
			continue;
		/* A request: the snapshot cannot go away while we hold it. */
		CHECK(c->version >= last_version);
		for (int i = 0; i < SETTINGS; i++)
			CHECK(c->settings[i] == c->version);
		last_version = c->version;
		percpu_rcuref_put(&c->ref);
		__atomic_store_n(my_seen, last_version, __ATOMIC_RELAXED);
	}
	return NULL;
}

int main(void)
{
	pthread_t workers[WORKERS];

	current = config_new(1);
	for (int i = 0; i < WORKERS; i++)
		CHECK(pthread_create(&workers[i], NULL, worker, &seen[i]) == 0);

	/*
	 * The admin: replace the snapshot, then kill the old one.  It first
	 * waits for every worker to have used the current snapshot, so that
	 * every snapshot is read however the threads are scheduled; a real
	 * admin would not wait.
	 */
	for (long v = 2; v <= SNAPSHOTS; v++) {
		struct config *old;

		for (int i = 0; i < WORKERS; i++)
			while (__atomic_load_n(&seen[i], __ATOMIC_RELAXED) < v - 1)
				sched_yield();
		old = __atomic_exchange_n(&current, config_new(v), __ATOMIC_ACQ_REL);
		percpu_rcuref_kill(&old->ref);
	}

	__atomic_store_n(&stop, true, __ATOMIC_RELAXED);
	for (int i = 0; i < WORKERS; i++)
		CHECK(pthread_join(workers[i], NULL) == 0);

	/* Shutdown: kill the last snapshot and wait for every release. */
	percpu_rcuref_kill(&current->ref);
	CHECK(percpu_rcuref_barrier() == 0);
	CHECK(__atomic_load_n(&released, __ATOMIC_RELAXED) == SNAPSHOTS);
	printf("config_snapshot: %d snapshots published, all released\n", SNAPSHOTS);
	return 0;
}
