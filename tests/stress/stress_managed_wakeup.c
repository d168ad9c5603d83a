/* SPDX-License-Identifier: MIT */
/*
 * Stress of the reclaimer's wake-ups: a push onto the managed list that
 * meets the reclaimer going to sleep must not be left unseen.
 *
 * The reclaimer sleeps without a timeout only when the list is empty, and
 * a push wakes it only if it has said so (src/managed.c, kick_needed).  So
 * the list is kept empty most of the time: one thread puts one ref at a
 * time under management (switch_to_managed, then drops its own
 * reference), waits for the reclaimer to release it, and after a random
 * spin of up to 2047 iterations puts the next one under management, so
 * that pushes land at every point of the reclaimer's way from its last
 * scan to its sleep.  The next ref is initialised while the reclaimer
 * works on the last one, so that nothing but the spin (no allocation)
 * comes between the release and the push.  One thread: a second one's
 * push woke the reclaimer within microseconds and rescued a lost one (a
 * reclaimer that never re-checks the list before sleeping passed 8 of 8
 * runs with two threads pushing; with one it fails 3 of 3, and a
 * relaxed store of its going-to-sleep flag 4 of 6).  Interval 0: with a
 * ref listed, scans run back to back, so a release comes within
 * microseconds.  A push left unseen is a ref the sleeping reclaimer never
 * releases: the wait for it times out and the test fails (instead of
 * hanging).  Nothing calls percpu_ref_managed_flush() while it runs,
 * since a flush wakes the thread itself and would hide a lost wake-up.
 * Duration: STRESS_SECONDS (default 2).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "percpuref/managed.h"
#include "percpuref/percpu_ref.h"
#include "rnd.h"
#include "tap.h"

#define NR_THREADS 1
#define RELEASE_TIMEOUT_S 5.0
#define MIN_ROUNDS 100
/* The wait yields its CPU now and then: on one CPU a pure busy wait
 * starved the reclaimer it waits for. */
#define YIELD_EVERY 64

static long all_rounds;	/* atomic: the threads' rounds, for their progress */

struct slot {
	struct percpu_ref ref;	/* first: the release finds the slot from it */
	int released;		/* set by release */
};

struct waiter {
	struct slot slots[2];	/* the ref going through, and the next */
	long lost;
	int init_failed;
	double seconds;
	unsigned int seed;
};

static void waiter_release(struct percpu_ref *ref)
{
	struct slot *slot = (struct slot *)ref;

	/* Release: the thread exits the ref after seeing it. */
	__atomic_store_n(&slot->released, 1, __ATOMIC_RELEASE);
}

static void *cycle(void *arg)
{
	struct waiter *w = arg;
	uint64_t end = now_ns() + (uint64_t)(w->seconds * 1e9);
	struct slot *slot = &w->slots[0], *next = &w->slots[1], *done;
	bool next_released = false;

	if (percpu_ref_init(&slot->ref, waiter_release, PERCPU_REF_ALLOW_REINIT)) {
		w->init_failed = 1;
		return NULL;
	}
	while (stress_goes_on(end, __atomic_load_n(&all_rounds, __ATOMIC_RELAXED) > MIN_ROUNDS) &&
	       !w->lost) {
		unsigned int spin, waited = 0;
		double deadline;

		slot->released = 0;
		if (percpu_ref_switch_to_managed(&slot->ref)) {
			w->init_failed = 1;
			return NULL;
		}
		percpu_ref_put(&slot->ref);	/* the manager's is the last one */
		/* The last round's ref goes, the next round's is made, while
		 * the reclaimer works on this one. */
		if (next_released)
			percpu_ref_exit(&next->ref);
		if (percpu_ref_init(&next->ref, waiter_release, PERCPU_REF_ALLOW_REINIT)) {
			w->init_failed = 1;
			return NULL;
		}
		deadline = now_seconds() + RELEASE_TIMEOUT_S;
		/* Acquire: pairs with waiter_release(). */
		while (!__atomic_load_n(&slot->released, __ATOMIC_ACQUIRE)) {
			if (now_seconds() > deadline) {
				/* Still listed: left to the exit hook. */
				w->lost = 1;
				return NULL;
			}
			if (++waited % YIELD_EVERY == 0)
				sched_yield();
		}
		for (spin = rnd(&w->seed) % 2048; spin; spin--)
			__asm__ __volatile__("" ::: "memory");
		done = slot;
		slot = next;
		next = done;
		next_released = true;
		__atomic_fetch_add(&all_rounds, 1, __ATOMIC_RELAXED);
	}
	/* The next round's ref, made and never used, and the last one. */
	percpu_ref_exit(&slot->ref);
	if (next_released)
		percpu_ref_exit(&next->ref);
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
	printf("# %ld refs released one at a time\n", rounds);
	is(lost, 0, "every ref released within %.0f s (no push left unseen)", RELEASE_TIMEOUT_S);
	ok(rounds > MIN_ROUNDS, "refs went through");
	return done_testing();
}
