/* SPDX-License-Identifier: MIT */
/*
 * Refs that share a switch stripe (its lock word and its futex word, with
 * the waiters' flag): every mode call of one waits, on the stripe's word,
 * while switches of the others end, so a waiter is woken for a stripe-mate
 * and must wait again for its own ref; confirm and release callbacks call
 * into a stripe-mate; a managed stripe-mate is checked by the reclaimer;
 * forks come in between (not under ThreadSanitizer), which take no
 * stripe.  A hang (a wake skipped while someone waits, a waiters' flag
 * that went wrong, a stripe a fork child finds locked) is caught by the
 * watchdog, which aborts after 10 s (30 s under ThreadSanitizer or
 * valgrind) without a round of some worker or of the managed ref's user.
 * With the stripe's wake made a wake of one waiter, five runs of five
 * hung (0.4.14; with the condition variables before it, a signal instead
 * of a broadcast hung two of five: busy stripe-mates end switches often
 * enough to rescue most lost wake-ups).  With the fork's flag not read
 * after a stripe is taken, three runs of three passed here and in
 * tests/stress/stress_fork.c: the child unlocks a word it finds locked,
 * and a section a fork cut halfway is rarely met there; the model
 * (tests/model/gate.pml, MUTANT_CHECK_FIRST) is what fails then.
 * Every worker round releases its ref exactly once, which the end checks.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "child.h"
#include "internal.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_ref.h"
#include "rnd.h"
#include "tap.h"

#define WORKERS 4
/* 32 refs a stripe on average: 7 that share pool[0]'s, at any stripe
 * count a build chooses (PERCPUREF_SWITCH_STRIPE_BITS). */
#define POOL (32 * PERCPUREF_SWITCH_STRIPES)

static struct percpu_ref pool[POOL];
/* mate[0..WORKERS-1]: each worker's own; shared: always alive; managed:
 * toggled; child: the fork child's. */
static struct percpu_ref *mate[WORKERS], *shared, *managed, *child_ref;
/* progress[WORKERS], finished[WORKERS]: the managed ref's user. */
static unsigned long progress[WORKERS + 1];	/* atomic */
static bool finished[WORKERS + 1];		/* atomic */
static unsigned long worker_releases[WORKERS];	/* atomic */
static unsigned long releases, forks;	/* atomic */
/* The managed user's ref released (by the reclaimer), atomic. */
static unsigned long managed_releases;
static bool stop, dog_stop;		/* atomic */

static bool pick_mates(void)
{
	unsigned int want = percpuref_switch_stripe_index(&pool[0]), n = 0, i;
	struct percpu_ref *found[WORKERS + 3];

	for (i = 0; i < POOL && n < WORKERS + 3; i++)
		if (percpuref_switch_stripe_index(&pool[i]) == want)
			found[n++] = &pool[i];
	if (n < WORKERS + 3)
		return false;
	for (i = 0; i < WORKERS; i++)
		mate[i] = found[i];
	shared = found[WORKERS];
	managed = found[WORKERS + 1];
	child_ref = found[WORKERS + 2];
	return true;
}

static __thread unsigned int cb_seed = 1;

static void poke_shared(void)
{
	switch (rnd(&cb_seed) % 3) {
	case 0:
		percpu_ref_switch_to_atomic_sync(shared);
		break;
	case 1:
		percpu_ref_switch_to_percpu(shared);
		break;
	default:
		percpu_ref_switch_to_atomic(shared, NULL);
		break;
	}
}

static void slow_confirm(struct percpu_ref *ref)
{
	(void)ref;
	if (rnd(&cb_seed) % 2)
		usleep(rnd(&cb_seed) % 200);
	poke_shared();
}

static void count_release(struct percpu_ref *ref)
{
	int i;

	for (i = 0; i < WORKERS; i++)
		if (ref == mate[i])
			__atomic_fetch_add(&worker_releases[i], 1, __ATOMIC_RELAXED);
	if (ref == managed)
		__atomic_fetch_add(&managed_releases, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&releases, 1, __ATOMIC_RELAXED);
	if (!(rnd(&cb_seed) % 4))
		poke_shared();
}

static percpu_ref_func_t *some_confirm(unsigned int *seed)
{
	return rnd(seed) % 2 ? slow_confirm : NULL;
}

static void one_round(struct percpu_ref *r, unsigned int *seed)
{
	if (percpu_ref_init(r, count_release, PERCPU_REF_ALLOW_REINIT))
		abort();
	switch (rnd(seed) % 4) {
	case 0:	/* exit waits for the kill's switch */
		percpu_ref_kill_and_confirm(r, some_confirm(seed));
		break;
	case 1:	/* mode calls wait for the switch in flight */
		percpu_ref_switch_to_atomic(r, some_confirm(seed));
		percpu_ref_switch_to_percpu(r);
		percpu_ref_get(r);
		percpu_ref_switch_to_atomic(r, some_confirm(seed));
		percpu_ref_put(r);
		percpu_ref_switch_to_atomic_sync(r);
		percpu_ref_switch_to_percpu(r);
		percpu_ref_kill_and_confirm(r, some_confirm(seed));
		break;
	case 2:	/* resurrect waits for the kill's switch */
		percpu_ref_get(r);
		percpu_ref_kill_and_confirm(r, some_confirm(seed));
		percpu_ref_resurrect(r);
		percpu_ref_put(r);
		percpu_ref_kill_and_confirm(r, some_confirm(seed));
		break;
	default:	/* managed and back, while the reclaimer checks it */
		if (!percpu_ref_switch_to_managed(r)) {
			if (rnd(seed) % 2)
				usleep(rnd(seed) % 300);
			percpu_ref_switch_to_unmanaged(r);
		}
		percpu_ref_kill_and_confirm(r, some_confirm(seed));
		break;
	}
	if (rnd(seed) % 8 == 0)
		(void)percpu_ref_barrier();
	percpu_ref_exit(r);
}

static void *worker(void *arg)
{
	long i = (long)arg;
	unsigned int seed = (unsigned int)i * 7919u + 1;

	cb_seed = seed ^ 0x5555;
	while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
		one_round(mate[i], &seed);
		if (rnd(&seed) % 4 == 0)
			poke_shared();
		__atomic_fetch_add(&progress[i], 1, __ATOMIC_RELAXED);
	}
	__atomic_store_n(&finished[i], true, __ATOMIC_RELAXED);
	return NULL;
}

/* The managed mate: listed, checked by a reclaimer scanning back to back,
 * with users coming and going. */
static void *managed_user(void *arg)
{
	unsigned int seed = 99;
	bool unmanaged;

	(void)arg;
	while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
		if (percpu_ref_init(managed, count_release, PERCPU_REF_ALLOW_REINIT))
			abort();
		percpu_ref_switch_to_managed(managed);
		for (int k = rnd(&seed) % 50; k-- > 0;) {
			percpu_ref_get(managed);
			percpu_ref_put(managed);
		}
		unmanaged = rnd(&seed) % 2;
		if (unmanaged)
			percpu_ref_switch_to_unmanaged(managed);
		/* Our reference: a managed ref is then released by the reclaimer. */
		percpu_ref_put(managed);
		if (rnd(&seed) % 2)
			usleep(rnd(&seed) % 500);
		/* Still managed, half the time: its check and release, a
		 * flush away; otherwise an exit soon after its push takes
		 * its node back off its stage before any pass met it. */
		if (!unmanaged && rnd(&seed) % 2)
			percpu_ref_managed_flush();
		percpu_ref_exit(managed);
		__atomic_fetch_add(&progress[WORKERS], 1, __ATOMIC_RELAXED);
	}
	__atomic_store_n(&finished[WORKERS], true, __ATOMIC_RELAXED);
	return NULL;
}

/* Not the main thread: a fork there waits for a batch that may be hung. */
static void *watchdog(void *arg)
{
	unsigned long last[WORKERS + 1] = { 0 }, stuck[WORKERS + 1] = { 0 };
	unsigned long limit = UNDER_TSAN || UNDER_VALGRIND ? 300 : 100;
	long i;

	(void)arg;
	while (!__atomic_load_n(&dog_stop, __ATOMIC_RELAXED)) {
		usleep(100000);
		for (i = 0; i <= WORKERS; i++) {
			unsigned long p = __atomic_load_n(&progress[i], __ATOMIC_RELAXED);

			if (__atomic_load_n(&finished[i], __ATOMIC_RELAXED))
				continue;
			stuck[i] = p == last[i] ? stuck[i] + 1 : 0;
			last[i] = p;
			if (stuck[i] >= limit) {	/* 10 s (30 s) without a round */
				printf("not ok - %s %ld stuck after %lu rounds\n",
				       i < WORKERS ? "worker" : "managed user", i, p);
				fflush(stdout);
				if (getenv("STRIPE_MATES_PAUSE"))
					pause();	/* for a debugger */
				abort();
			}
		}
	}
	return NULL;
}

/* 0 when a fork child ran its switches and exited 0; else its status
 * (wait_child(): 128 + SIGALRM when it hung for 20 s), or -1. */
static int fork_once(void)
{
	pid_t pid = fork();

	if (pid < 0)
		return 0;
	if (pid == 0) {
		child_deadline(20);
		if (percpu_ref_init(child_ref, NULL, PERCPU_REF_ALLOW_REINIT))
			_exit(3);
		percpu_ref_kill_and_confirm(child_ref, slow_confirm);
		percpu_ref_exit(child_ref);
		percpu_ref_switch_to_percpu(shared);
		percpu_ref_switch_to_atomic_sync(shared);
		percpu_ref_switch_to_percpu(shared);
		_exit(0);
	}
	return wait_child(pid);
}

int main(void)
{
	struct percpu_ref_managed_config config;
	pthread_t threads[WORKERS + 1], dog;
	double seconds = stress_seconds(5);
	unsigned long t;
	uint64_t end;
	int fork_failures = 0;
	bool no_forks;
	long i;

	if (!ok(pick_mates(), "found %d refs on one stripe", WORKERS + 3))
		return done_testing();
	if (percpu_ref_init(shared, count_release, PERCPU_REF_ALLOW_REINIT))
		abort();
	percpu_ref_managed_get_config(&config);
	config.interval_ms = 0;
	config.max_per_scan = 0;
	percpu_ref_managed_set_config(&config);

	for (i = 0; i < WORKERS; i++)
		if (pthread_create(&threads[i], NULL, worker, (void *)i))
			abort();
	if (pthread_create(&threads[WORKERS], NULL, managed_user, NULL) ||
	    pthread_create(&dog, NULL, watchdog, NULL))
		abort();

	/* Forks on the side: not under TSan (no threads in the child of a
	 * threaded process), nor valgrind (its leak check fails every child:
	 * what the vanished workers held leaks there by design). */
	no_forks = UNDER_TSAN || UNDER_VALGRIND;
	/* For @seconds of wall time: a child takes a while (its kill's
	 * confirm, the shared ref's sync switch among busy stripe-mates), and
	 * counted in ticks the run took four times its time in CI. */
	end = clock_ns(CLOCK_MONOTONIC) + (uint64_t)(seconds * 1e9);
	for (t = 0; clock_ns(CLOCK_MONOTONIC) < end; t++) {
		usleep(100000);
		if (!no_forks && t % 2 == 0) {
			int r = fork_once();

			if (r) {
				fork_failures++;
				printf("# fork child: status %d\n", r);
			}
			__atomic_fetch_add(&forks, 1, __ATOMIC_RELAXED);
		}
	}
	__atomic_store_n(&stop, true, __ATOMIC_RELAXED);
	for (i = 0; i <= WORKERS; i++)
		pthread_join(threads[i], NULL);
	__atomic_store_n(&dog_stop, true, __ATOMIC_RELAXED);
	pthread_join(dog, NULL);
	for (i = 0; i < WORKERS; i++)
		printf("# worker %ld: %lu rounds\n", i, progress[i]);
	printf("# releases %lu, forks %lu\n", __atomic_load_n(&releases, __ATOMIC_RELAXED),
	       __atomic_load_n(&forks, __ATOMIC_RELAXED));
	/* A round's release may run after its exit returned (exit waits for
	 * the switch, not for @release): the barrier waits for the last. */
	percpu_ref_barrier();
	for (i = 0; i < WORKERS; i++)
		if (!progress[i] ||
		    __atomic_load_n(&worker_releases[i], __ATOMIC_RELAXED) != progress[i])
			break;
	if (!ok(i == WORKERS, "every worker made rounds, each released once, none hung"))
		printf("# worker %ld: %lu rounds, %lu releases\n", i, progress[i],
		       worker_releases[i]);
	ok(__atomic_load_n(&managed_releases, __ATOMIC_RELAXED) > 0,
	   "the reclaimer checked and released the managed stripe-mate (%lu times in %lu rounds)",
	   __atomic_load_n(&managed_releases, __ATOMIC_RELAXED), progress[WORKERS]);
	ok(fork_failures == 0, "fork children finished (%d failed)", fork_failures);
	percpu_ref_switch_to_percpu(shared);
	percpu_ref_kill(shared);
	percpu_ref_barrier();
	percpu_ref_exit(shared);
	return done_testing();
}
