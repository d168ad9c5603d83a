/* SPDX-License-Identifier: MIT */
/*
 * Stress of the reclaimer's wake-ups: a push onto the managed list that
 * meets the reclaimer going to sleep must not be left unseen.
 *
 * The reclaimer sleeps without a timeout only when the list is empty, and
 * a push wakes it only if it has said so (src/managed.c, kick_needed).  So
 * the list is kept empty most of the time: each thread puts one managed ref
 * at a time under management (init with PERCPU_REF_REL_MANAGED, then drops
 * its own reference), waits for the reclaimer to release it, and starts
 * again after a random spin, so that pushes land at every point of the
 * reclaimer's way from its last scan to its sleep.  Interval 0: with a ref
 * listed, scans run back to back, so a release comes within microseconds.
 * A push left unseen is a ref the sleeping reclaimer never releases: the
 * wait for it times out and the test fails (instead of hanging).  Nothing
 * calls percpu_ref_managed_flush() while it runs, since a flush wakes the
 * thread itself and would hide a lost wake-up.
 * Duration: STRESS_SECONDS (default 2).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>

#include "percpuref/managed.h"
#include "percpuref/percpu_ref.h"
#include "rnd.h"
#include "tap.h"

#define NR_THREADS 2
#define RELEASE_TIMEOUT_S 5.0
#define MIN_ROUNDS 100

static long all_rounds;	/* atomic: the threads' rounds, for their progress */

struct waiter {
	struct percpu_ref ref;
	int released;		/* set by release */
	long lost;
	int init_failed;
	double seconds;
	unsigned int seed;
};

static void waiter_release(struct percpu_ref *ref)
{
	struct waiter *w = (struct waiter *)ref;

	/* Release: the thread exits the ref after seeing it. */
	__atomic_store_n(&w->released, 1, __ATOMIC_RELEASE);
}

static void *cycle(void *arg)
{
	struct waiter *w = arg;
	uint64_t end = now_ns() + (uint64_t)(w->seconds * 1e9);

	while (stress_goes_on(end, __atomic_load_n(&all_rounds, __ATOMIC_RELAXED) > MIN_ROUNDS) &&
	       !w->lost) {
		unsigned int spin;
		double deadline;

		for (spin = rnd(&w->seed) % 4096; spin; spin--)
			__asm__ __volatile__("" ::: "memory");
		w->released = 0;
		if (percpu_ref_init(&w->ref, waiter_release, PERCPU_REF_REL_MANAGED)) {
			w->init_failed = 1;
			break;
		}
		percpu_ref_put(&w->ref);	/* the manager's is the last one */
		deadline = now_seconds() + RELEASE_TIMEOUT_S;
		/* Acquire: pairs with waiter_release(). */
		while (!__atomic_load_n(&w->released, __ATOMIC_ACQUIRE)) {
			if (now_seconds() > deadline) {
				/* Still listed: left to the exit hook. */
				w->lost = 1;
				return NULL;
			}
			sched_yield();
		}
		percpu_ref_exit(&w->ref);
		__atomic_fetch_add(&all_rounds, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

int main(void)
{
	struct percpu_ref_managed_config config = {
		.interval_ms = 0,
		.max_per_scan = PERCPU_REF_MANAGED_MAX_PER_SCAN,
		.strategy = PERCPU_REF_SCAN_FILTERED,
	};
	static struct waiter waiters[NR_THREADS];
	pthread_t threads[NR_THREADS];
	long rounds, lost = 0;
	int i, started = 0, init_failed = 0;

	ok(percpu_ref_managed_set_config(&config) == 0, "interval 0");
	for (i = 0; i < NR_THREADS; i++) {
		waiters[i].seconds = stress_seconds(2);
		waiters[i].seed = (unsigned int)i * 7919u + 1;
		started += pthread_create(&threads[i], NULL, cycle, &waiters[i]) == 0;
	}
	is(started, NR_THREADS, "threads started");
	for (i = 0; i < started; i++)
		pthread_join(threads[i], NULL);
	for (i = 0; i < started; i++) {
		lost += waiters[i].lost;
		init_failed += waiters[i].init_failed;
	}
	rounds = __atomic_load_n(&all_rounds, __ATOMIC_RELAXED);
	is(init_failed, 0, "percpu_ref_init");
	printf("# %ld refs released one at a time per thread\n", rounds);
	is(lost, 0, "every ref released within %.0f s (no push left unseen)", RELEASE_TIMEOUT_S);
	ok(rounds > MIN_ROUNDS, "refs went through");
	return done_testing();
}
