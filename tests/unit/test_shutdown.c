/* SPDX-License-Identifier: MIT */
/*
 * percpuref_shutdown() from two threads at once (or exit() while another
 * thread is in it): it stops the reclaimer and the callback thread, and
 * each used to be joined by both callers, which is undefined (glibc hung
 * in the second pthread_join).  Rounds: start both library threads (a
 * managed ref dropped by its creator, a killed ref), then two threads call
 * shutdown together; every ref must be released and every call return.
 * Under a deadline: a hang fails the test instead of stalling the suite.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "percpuref/managed.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

#define ROUNDS 300
#define DEADLINE_S 120

static pthread_barrier_t round_start, round_end;
static long made, released;	/* atomic */

static void free_ref(struct percpu_ref *ref)
{
	percpu_ref_exit(ref);
	free(ref);
	__atomic_fetch_add(&released, 1, __ATOMIC_SEQ_CST);
}

/* A managed ref the reclaimer releases, a killed one the callback thread
 * finishes: both threads running. */
static void start_library_threads(void)
{
	struct percpu_ref *managed = malloc(sizeof(*managed)), *killed = malloc(sizeof(*killed));

	if (managed && !percpu_ref_init(managed, free_ref, PERCPU_REF_REL_MANAGED)) {
		__atomic_fetch_add(&made, 1, __ATOMIC_SEQ_CST);
		percpu_ref_put(managed);
	} else {
		free(managed);
	}
	if (killed && !percpu_ref_init(killed, free_ref, 0)) {
		__atomic_fetch_add(&made, 1, __ATOMIC_SEQ_CST);
		percpu_ref_kill(killed);
	} else {
		free(killed);
	}
}

static void *shut_down(void *starter)
{
	int i;

	for (i = 0; i < ROUNDS; i++) {
		if (starter)
			start_library_threads();
		pthread_barrier_wait(&round_start);
		percpuref_shutdown();
		pthread_barrier_wait(&round_end);
	}
	return NULL;
}

int main(void)
{
	pthread_t a, b;

	alarm(DEADLINE_S);
	pthread_barrier_init(&round_start, NULL, 2);
	pthread_barrier_init(&round_end, NULL, 2);
	ok(!pthread_create(&a, NULL, shut_down, (void *)1) &&
	   !pthread_create(&b, NULL, shut_down, NULL), "threads started");
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	ok(1, "%d rounds of two concurrent shutdowns returned", ROUNDS);
	/* Every ref unreferenced before a shutdown is released by it. */
	is(__atomic_load_n(&released, __ATOMIC_SEQ_CST), __atomic_load_n(&made, __ATOMIC_SEQ_CST),
	   "every ref released");
	return done_testing();
}
