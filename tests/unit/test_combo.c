/* SPDX-License-Identifier: MIT */
/*
 * test_combo.c - combinations of features that each have tests of their
 * own, each case in a child with a deadline (a hang or a crash fails the
 * case, never the run):
 *  - on the fallback fast path, a signal handler interrupts a get or put
 *    (a read-side section of its thread) and its put releases a ref whose
 *    release waits for a fence that another thread runs: a barrier with a
 *    kill queued for the callback thread, or a synchronous switch while
 *    another thread switches refs of its own.  Both are allowed
 *    (docs/percpu_ref.md, "Signal handlers"); the other thread's fence
 *    waits for the interrupted section, which cannot end before the
 *    handler returns.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "percpuref/percpu_ref.h"
#include "child.h"
#include "signaller.h"
#include "tap.h"

#define DEADLINE_S 20
#define NR_RELEASES 200

static struct percpu_ref hot, victims[NR_RELEASES], queued[NR_RELEASES], other, fenced;
static volatile sig_atomic_t handled;
static int stop_fencer;

static void pairs(struct percpu_ref *r, int n)
{
	for (int i = 0; i < n; i++) {
		percpu_ref_get(r);
		percpu_ref_put(r);
	}
}

/* The release of victims[i], run by the handler's put: a kill for the
 * callback thread, then a barrier that waits for its fence. */
static void release_kills_and_waits(struct percpu_ref *r)
{
	percpu_ref_kill(&queued[r - victims]);
	(void)percpu_ref_barrier();
}

/* The release of victims[i]: a fence of its own thread's. */
static void release_switches(struct percpu_ref *r)
{
	(void)r;
	percpu_ref_switch_to_atomic_sync(&other);
	percpu_ref_switch_to_percpu(&other);
}

static void on_signal(int sig)
{
	int saved_errno = errno;

	(void)sig;
	if (handled < NR_RELEASES) {
		percpu_ref_put(&victims[handled]);	/* the last reference */
		handled++;
	}
	errno = saved_errno;
}

/* Another thread's fences, back to back. */
static void *fencer(void *arg)
{
	(void)arg;
	while (!__atomic_load_n(&stop_fencer, __ATOMIC_RELAXED)) {
		percpu_ref_switch_to_atomic_sync(&fenced);
		percpu_ref_switch_to_percpu(&fenced);
	}
	return NULL;
}

static int handler_case(percpu_ref_func_t *release, bool with_fencer)
{
	struct signaller signaller;
	struct sigaction sa;
	pthread_t t;
	int i;

	child_deadline(DEADLINE_S);
	percpu_ref_init(&hot, NULL, PERCPU_REF_ALLOW_REINIT);
	percpu_ref_init(&other, NULL, PERCPU_REF_ALLOW_REINIT);
	percpu_ref_init(&fenced, NULL, PERCPU_REF_ALLOW_REINIT);
	for (i = 0; i < NR_RELEASES; i++)
		if (percpu_ref_init(&victims[i], release, PERCPU_REF_INIT_ATOMIC) ||
		    percpu_ref_init(&queued[i], NULL, 0))
			return 2;
	pairs(&hot, 10);	/* registered before any handler runs */
	/* The callback thread started (an allocation) before any handler
	 * runs, as the fallback unit above. */
	percpu_ref_kill(&hot);
	if (percpu_ref_barrier())
		return 6;
	percpu_ref_reinit(&hot);
	if (with_fencer && pthread_create(&t, NULL, fencer, NULL))
		return 3;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGUSR1, &sa, NULL);
	if (signaller_start(&signaller, 50000))
		return 4;
	while (handled < NR_RELEASES) {
		pairs(&hot, 1000);
#ifdef __SANITIZE_THREAD__
		/* Signals arrive only at a blocking call (test_fallback_edges.c). */
		nanosleep(&(struct timespec){ 0, 0 }, NULL);
#endif
	}
	signaller_stop(&signaller);
	if (with_fencer) {
		__atomic_store_n(&stop_fencer, 1, __ATOMIC_RELAXED);
		pthread_join(t, NULL);
	}
	return percpu_ref_barrier() ? 5 : 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "handler-barrier"))
		return handler_case(release_kills_and_waits, false);
	if (argc > 1 && !strcmp(argv[1], "handler-sync-contended"))
		return handler_case(release_switches, true);

	/* The sections that a handler can interrupt are the fallback's. */
	setenv("PERCPUREF_NO_RSEQ", "1", 1);
	is(run_mode("handler-barrier"), 0,
	   "fallback: a handler's release kills and waits for a barrier");
	is(run_mode("handler-sync-contended"), 0,
	   "fallback: a handler's release switches synchronously while another thread fences");
	return done_testing();
}
