/* SPDX-License-Identifier: MIT */
/*
 * test_backlog.c - a thread that kills refs faster than the callback thread
 * finishes them waits for it (src/deferred.c, "Backlog"), so what waits for
 * a release stays bounded; the wait ends when the thread stops making
 * progress (a callback waiting for a lock the killer holds) and is skipped
 * inside a read-side section; a percpu_rcuref's kill paces on the
 * reclaimer's queue of RCU-deferred releases too; every ref is still
 * released exactly once.
 * The limit is 64 here (PERCPUREF_CALLBACK_BACKLOG, set before the
 * library's first use).  Up to 0.4.6 nothing bounded it: a thread making
 * and killing refs in a loop left 1.7 million waiting after 2 s (333 MB).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "percpuref/percpu_rcuref.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

#define LIMIT 64

static unsigned long released;		/* atomic */
static pthread_mutex_t held_by_killer = PTHREAD_MUTEX_INITIALIZER;
static bool confirms_take_the_lock;	/* set while no kill is queued */

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/*
 * On the callback thread, slower than a kill, so that the thread falls
 * behind.  A confirm, not the release: it holds the switch's reference
 * until the kill's own put is done, so the release runs on the callback
 * thread too, never in the killer's put (which may run it, as any put).
 */
static void slow_confirm(struct percpu_ref *ref)
{
	double until = now() + 20e-6;

	(void)ref;
	if (confirms_take_the_lock) {
		pthread_mutex_lock(&held_by_killer);
		pthread_mutex_unlock(&held_by_killer);
	}
	while (now() < until)
		;
}

static void count_release(struct percpu_ref *ref)
{
	percpu_ref_exit(ref);
	free(ref);
	/* Release: the killer's count of what waits reads it. */
	__atomic_fetch_add(&released, 1, __ATOMIC_RELEASE);
}

/* Kills @n new refs; returns the most that were killed and not released
 * when a kill returned. */
static unsigned long kill_many(unsigned long n, unsigned long *killed)
{
	unsigned long most = 0;

	for (unsigned long i = 0; i < n; i++) {
		struct percpu_ref *ref = malloc(sizeof(*ref));

		if (!ref || percpu_ref_init(ref, count_release, 0))
			abort();
		percpu_ref_kill_and_confirm(ref, slow_confirm);
		++*killed;
		unsigned long waiting = *killed - __atomic_load_n(&released, __ATOMIC_ACQUIRE);

		if (waiting > most)
			most = waiting;
	}
	return most;
}

/* The killer waits: never more than LIMIT killed and not released. */
static void test_paced(unsigned long *killed)
{
	unsigned long most = kill_many(2000, killed);

	ok(most <= LIMIT, "2000 kills: at most %lu waiting for their release (limit %d)", most,
	   LIMIT);
	percpu_ref_barrier();
	is(__atomic_load_n(&released, __ATOMIC_ACQUIRE), *killed, "every ref released once");
}

/*
 * The confirms wait for a lock the killer holds: a wait for the thread
 * would never end.  It ends when no batch finished for a second, and the
 * kills after it do not wait; once the thread makes progress again, kills
 * are paced again.
 */
static void test_stalled(unsigned long *killed)
{
	double start;

	pthread_mutex_lock(&held_by_killer);
	confirms_take_the_lock = true;
	start = now();
	kill_many(4 * LIMIT, killed);
	ok(now() - start < 10, "a killer holding the confirms' lock goes on (%.2f s)",
	   now() - start);
	pthread_mutex_unlock(&held_by_killer);
	percpu_ref_barrier();
	confirms_take_the_lock = false;
	is(__atomic_load_n(&released, __ATOMIC_ACQUIRE), *killed, "then every ref released once");
	test_paced(killed);
}

/* Inside a read-side section the killer does not wait (the thread's
 * releases may wait for a grace period): with the thread stalled, it goes
 * on at once, without the second a stall takes. */
static void test_read_section(unsigned long *killed)
{
	double start;

	pthread_mutex_lock(&held_by_killer);
	confirms_take_the_lock = true;
	start = now();
	percpu_rcuref_read_lock();
	kill_many(4 * LIMIT, killed);
	percpu_rcuref_read_unlock();
	ok(now() - start < 0.9, "inside a read-side section the killer does not wait (%.2f s)",
	   now() - start);
	pthread_mutex_unlock(&held_by_killer);
	percpu_ref_barrier();
	confirms_take_the_lock = false;
	is(__atomic_load_n(&released, __ATOMIC_ACQUIRE), *killed, "and every ref released once");
}

static unsigned long rcu_released;	/* atomic */

/* On the reclaimer, after a grace period: slower than a kill. */
static void slow_rcu_release(struct percpu_rcuref *ref)
{
	double until = now() + 20e-6;

	while (now() < until)
		;
	percpu_rcuref_exit(ref);
	free(ref);
	/* Release: the killer's count of what waits reads it. */
	__atomic_fetch_add(&rcu_released, 1, __ATOMIC_RELEASE);
}

/* A percpu_rcuref's release goes on from the callback thread to the
 * reclaimer's RCU queue, which the kill paces on too: at most LIMIT wait
 * in each. */
static void test_rcu_paced(void)
{
	unsigned long killed, most = 0;

	for (killed = 1; killed <= 2000; killed++) {
		struct percpu_rcuref *ref = malloc(sizeof(*ref));

		if (!ref || percpu_rcuref_init(ref, NULL, slow_rcu_release, 0))
			abort();
		percpu_rcuref_kill(ref);
		unsigned long waiting = killed - __atomic_load_n(&rcu_released, __ATOMIC_ACQUIRE);

		if (waiting > most)
			most = waiting;
	}
	ok(most <= 2 * LIMIT, "2000 percpu_rcuref kills: at most %lu waiting (limit %d twice)",
	   most, LIMIT);
	percpu_rcuref_barrier();
	is(__atomic_load_n(&rcu_released, __ATOMIC_ACQUIRE), 2000, "every percpu_rcuref released once");
}

int main(void)
{
	unsigned long killed = 0;

	setenv("PERCPUREF_CALLBACK_BACKLOG", "64", 1);
	test_paced(&killed);
	test_stalled(&killed);
	test_read_section(&killed);
	test_rcu_paced();
	return done_testing();
}
