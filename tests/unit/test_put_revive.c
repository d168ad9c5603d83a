/* SPDX-License-Identifier: MIT */
/*
 * test_put_revive.c - a put that takes the count to zero, and a reinit and
 * switch_to_managed by another thread before the put reaches its release
 * (review 163; tests/model/voided.pml, Model T).
 *
 * Between a put's subtract and its release the ref reads zero
 * (percpu_ref_is_zero()), so another thread may reinit it
 * (docs/percpu_ref.md: "reinit: needs count == 0") and make it managed.
 * Up to 0.4.29 the release then read the managed flag, took the put for
 * one that dropped the manager's reference (misuse), warned, pinned the
 * count and never ran the @release of the zero it reached; the revived
 * ref, pinned, never reached zero again.  Every zero runs one @release,
 * as in the kernel (docs/percpu_ref.md, "Signal handlers"): the put now
 * hands the release the ref's life it put (data->lives, loaded before its
 * subtract), and a zero of an earlier life runs its @release.
 *
 * The window is widened: __percpu_ref_release_life is wrapped (the
 * linker's --wrap, tests/CMakeLists.txt) for the calls the inline put
 * makes from this file, and the wrapper waits for the other thread before
 * it calls the library's.  A fast path whose put reaches zero inside the
 * library (not through the inline call: the fallback's) skips.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdbool.h>
#include <sched.h>
#include <stdio.h>

#include "percpuref/managed.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

static struct percpu_ref victim;
static int releases;		/* atomic */
static int stage;		/* atomic: 1 the put is at zero, 2 go on */
static bool armed;		/* atomic */
static bool putter_done;	/* atomic */

void __real___percpu_ref_release_life(struct percpu_ref *ref, unsigned long life);
void __wrap___percpu_ref_release_life(struct percpu_ref *ref, unsigned long life)
{
	if (ref == &victim && __atomic_exchange_n(&armed, false, __ATOMIC_SEQ_CST)) {
		__atomic_store_n(&stage, 1, __ATOMIC_SEQ_CST);
		while (__atomic_load_n(&stage, __ATOMIC_SEQ_CST) != 2)
			sched_yield();
	}
	__real___percpu_ref_release_life(ref, life);
}

static void on_release(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_fetch_add(&releases, 1, __ATOMIC_SEQ_CST);
}

static void *putter(void *arg)
{
	struct percpu_ref scratch;

	(void)arg;
	/* The thread's first get and put (rseq-own registers its area in
	 * the library): the put below takes the inline path where it can. */
	if (!percpu_ref_init(&scratch, NULL, 0)) {
		percpu_ref_get(&scratch);
		percpu_ref_put(&scratch);
		percpu_ref_exit(&scratch);
	}
	percpu_ref_put(&victim);	/* the last reference */
	__atomic_store_n(&putter_done, true, __ATOMIC_SEQ_CST);
	return NULL;
}

int main(void)
{
	pthread_t thread;
	bool reached;

	if (percpu_ref_init(&victim, on_release,
			    PERCPU_REF_INIT_ATOMIC | PERCPU_REF_ALLOW_REINIT)) {
		ok(0, "init");
		return done_testing();
	}
	percpu_ref_get(&victim);	/* the putter's */
	percpu_ref_kill(&victim);	/* dead, one reference left */
	__atomic_store_n(&armed, true, __ATOMIC_SEQ_CST);
	if (pthread_create(&thread, NULL, putter, NULL)) {
		ok(0, "pthread_create");
		return done_testing();
	}
	while (!__atomic_load_n(&stage, __ATOMIC_SEQ_CST) &&
	       !__atomic_load_n(&putter_done, __ATOMIC_SEQ_CST))
		sched_yield();
	reached = __atomic_load_n(&stage, __ATOMIC_SEQ_CST) == 1;
	if (!reached) {
		pthread_join(thread, NULL);
		skip("the put reached zero inside the library on %s: no window to widen",
		     percpuref_fast_path());
		percpu_ref_exit(&victim);
		return done_testing();
	}
	/* The put is past its decrement, before its release. */
	ok(percpu_ref_is_zero(&victim), "the ref reads zero while the put is in flight");
	percpu_ref_reinit(&victim);
	is(percpu_ref_switch_to_managed(&victim), 0, "made managed after the reinit");
	__atomic_store_n(&stage, 2, __ATOMIC_SEQ_CST);
	pthread_join(thread, NULL);
	is(__atomic_load_n(&releases, __ATOMIC_SEQ_CST), 1,
	   "the zero the put reached runs its release (every zero runs one)");

	/* The revived ref's own zero: unmanaged, killed, put. */
	is(percpu_ref_switch_to_unmanaged(&victim), 0, "unmanaged");
	percpu_ref_kill(&victim);
	percpu_ref_barrier();
	ok(percpu_ref_is_zero(&victim), "the revived ref reaches zero after its kill");
	is(__atomic_load_n(&releases, __ATOMIC_SEQ_CST), 2, "and runs a release of its own");
	percpu_ref_exit(&victim);
	return done_testing();
}
