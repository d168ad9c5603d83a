/* SPDX-License-Identifier: MIT */
/*
 * What percpuref_shutdown() finishes in a program with no other thread:
 * everything pending at the call and everything its callbacks queue, to
 * the end, also when the library cannot start a thread.
 *
 *  - A kill whose release drops the last user reference of a managed ref:
 *    the release ran after the shutdown's pass, which nothing repeated, so
 *    the managed ref outlived the shutdown.
 *  - A managed ref whose release, run by the reclaimer while the shutdown
 *    starts, kills another ref: the kill came after the shutdown had
 *    finished the pending kills (a round that did those before stopping
 *    the reclaimer).
 *  - A chain of refs whose kills each kill the next, with thread
 *    creation failing (pthread_create wrapped: the linker's --wrap) once
 *    the callback thread runs: a stopped callback thread leaves what was
 *    queued after the stop to a new one, which cannot start; the shutdown
 *    must run the rest itself, and the refusal is warned once, not at
 *    every try.  (pthread_join wrapped too: the chain waits for the
 *    shutdown's stop of the thread, see chain_confirm().)
 *  - A switch whose thread could not start, and a mode call on the ref
 *    once threads can start: the call must start the thread it waits for.
 *  - While no thread can start at all (a sandbox that refuses clone, an
 *    exhausted RLIMIT_NPROC): percpu_ref_barrier() and
 *    percpu_rcuref_barrier() returned -EAGAIN with the releases undone,
 *    and percpu_ref_exit() of a ref whose switch was queued waited for
 *    ever; percpu_ref_managed_flush() returned -EAGAIN with the managed
 *    ref unreleased; each must finish the work on the calling thread.
 *  - The same chain of kills made by the releases, from a polling thread
 *    (percpu_ref_poll_register()) with no thread able to start: the
 *    shutdown runs each release itself, and the kill it makes waits on
 *    the caller's own queue, which the shutdown must take over too (it
 *    stopped after the first release, the rest of the chain stranded).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <unistd.h>

#include "internal.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_rcuref.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

#define CHAIN 20

static bool refuse_threads;	/* atomic */

int __real_pthread_create(pthread_t *thread, const pthread_attr_t *attr,
			  void *(*fn)(void *), void *arg);
int __wrap_pthread_create(pthread_t *thread, const pthread_attr_t *attr,
			  void *(*fn)(void *), void *arg)
{
	if (__atomic_load_n(&refuse_threads, __ATOMIC_SEQ_CST))
		return EAGAIN;
	return __real_pthread_create(thread, attr, fn, arg);
}

/* The thread the chain's confirms run on, and whether a join of it (the
 * shutdown's stop) has begun (atomic both). */
static pthread_t chain_thread;
static bool chain_thread_joined;

int __real_pthread_join(pthread_t thread, void **ret);
int __wrap_pthread_join(pthread_t thread, void **ret)
{
	if (__atomic_load_n(&chain_thread_joined, __ATOMIC_SEQ_CST) == false &&
	    pthread_equal(thread, __atomic_load_n(&chain_thread, __ATOMIC_SEQ_CST)))
		__atomic_store_n(&chain_thread_joined, true, __ATOMIC_SEQ_CST);
	return __real_pthread_join(thread, ret);
}

static struct percpu_ref managed, killer;
static bool managed_released;

static void managed_release(struct percpu_ref *ref)
{
	(void)ref;
	managed_released = true;
}

static void killer_release(struct percpu_ref *ref)
{
	(void)ref;
	/* Slow: the shutdown's pass is under way by now. */
	usleep(20000);
	percpu_ref_put(&managed);	/* the manager's is the only one left */
}

static struct percpu_ref reclaimed, cascaded;
static bool reclaim_started, cascaded_released;	/* atomic */

static void cascaded_release(struct percpu_ref *ref)
{
	(void)ref;
	usleep(20000);
	__atomic_store_n(&cascaded_released, true, __ATOMIC_SEQ_CST);
}

static void reclaimed_release(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_store_n(&reclaim_started, true, __ATOMIC_SEQ_CST);
	usleep(20000);	/* the shutdown is stopping the reclaimer meanwhile */
	percpu_ref_kill(&cascaded);
}

static struct percpu_ref chain[CHAIN];
static int chain_released;	/* atomic */
static bool chain_go;		/* atomic: the shutdown is about to start */

static void chain_release(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_fetch_add(&chain_released, 1, __ATOMIC_SEQ_CST);
}

/*
 * The next kill from the confirmation, which always runs where the batch
 * runs (a release may run on the killer's thread, in its put).  The chain
 * starts with the shutdown and outlasts the first batch, all that the
 * shutdown waits for before it stops the thread: the first link goes on
 * once the shutdown waits for it (its wait's target is taken: the next
 * link is not part of it), and a later link that the callback thread
 * runs goes on once the shutdown joins that thread, so that the thread
 * stops with a link still queued, which a new thread must take.  By
 * sleeps alone (2 ms a link) the chain raced the shutdown: this thread
 * kept off its CPU for 40 ms between chain_go and the shutdown's wait (a
 * 100 ms sleep put there: 1 of 1) let the callback thread run the whole
 * chain, no start was refused, and no warning came ("warned once": got
 * 0).  Each wait is bounded (10 s): a shutdown that never waits or never
 * stops the thread fails the checks, not the deadline.
 */
static void chain_confirm(struct percpu_ref *ref)
{
	long i = ref - chain;

	while (!__atomic_load_n(&chain_go, __ATOMIC_SEQ_CST))
		usleep(100);
	if (i == 0) {
		__atomic_store_n(&chain_thread, pthread_self(), __ATOMIC_SEQ_CST);
		(void)POLL_UNTIL(percpuref_test_deferred_waiters());
	} else if (percpuref_on_library_thread()) {
		(void)POLL_UNTIL(__atomic_load_n(&chain_thread_joined, __ATOMIC_SEQ_CST));
	}
	usleep(2000);
	if (i + 1 < CHAIN)
		percpu_ref_kill_and_confirm(&chain[i + 1], chain_confirm);
}

static struct percpu_ref orphan;
static bool orphan_released;	/* atomic */

static void orphan_release(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_store_n(&orphan_released, true, __ATOMIC_SEQ_CST);
}

static struct percpu_ref stranded_kill, stranded_switch, self_exiting, stranded_managed;
static struct percpu_rcuref stranded_rcu, stranded_managed_rcu;
static bool stranded_released, stranded_confirmed, stranded_rcu_released;	/* atomic */
static bool stranded_managed_released, stranded_managed_rcu_released;		/* atomic */

static void stranded_managed_release(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_store_n(&stranded_managed_released, true, __ATOMIC_SEQ_CST);
}

static void stranded_managed_rcu_release(struct percpu_rcuref *ref)
{
	(void)ref;
	__atomic_store_n(&stranded_managed_rcu_released, true, __ATOMIC_SEQ_CST);
}

static void stranded_release(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_store_n(&stranded_released, true, __ATOMIC_SEQ_CST);
}

static void self_exiting_release(struct percpu_ref *ref)
{
	percpu_ref_exit(ref);
}

static void stranded_confirm(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_store_n(&stranded_confirmed, true, __ATOMIC_SEQ_CST);
}

static void stranded_rcu_release(struct percpu_rcuref *ref)
{
	(void)ref;
	__atomic_store_n(&stranded_rcu_released, true, __ATOMIC_SEQ_CST);
}

/* Every wait of the library with no thread able to start; the alarm is
 * the deadline of the calls that hung. */
static void test_no_thread_can_start(void)
{
	if (!ok(!percpu_ref_init(&stranded_kill, stranded_release, 0) &&
		!percpu_ref_init(&stranded_switch, NULL, 0) &&
		!percpu_rcuref_init(&stranded_rcu, NULL, stranded_rcu_release, 0) &&
		!percpu_ref_init(&stranded_managed, stranded_managed_release,
				 PERCPU_REF_REL_MANAGED) &&
		!percpu_rcuref_init(&stranded_managed_rcu, NULL, stranded_managed_rcu_release,
				    PERCPU_REF_REL_MANAGED),
		"refs initialised"))
		return;
	percpuref_shutdown();	/* no library thread runs now */
	__atomic_store_n(&refuse_threads, true, __ATOMIC_SEQ_CST);
	alarm(30);

	percpu_ref_kill(&stranded_kill);
	is(percpu_ref_barrier(), 0, "no thread can start: percpu_ref_barrier() succeeds");
	ok(__atomic_load_n(&stranded_released, __ATOMIC_SEQ_CST),
	   "and the kill's release has run");

	percpu_ref_switch_to_atomic(&stranded_switch, stranded_confirm);
	percpu_ref_exit(&stranded_switch);
	ok(__atomic_load_n(&stranded_confirmed, __ATOMIC_SEQ_CST),
	   "percpu_ref_exit() of a ref whose switch is queued returns, the switch confirmed");

	/* The exit runs the kill's release, which exits the ref: the wait
	 * then read the exited ref's data (NULL: SIGSEGV). */
	if (ok(!percpu_ref_init(&self_exiting, self_exiting_release, 0), "ref initialised")) {
		percpu_ref_kill(&self_exiting);
		percpu_ref_exit(&self_exiting);
		ok(!self_exiting.data, "an exit whose wait ran a release that exited the ref returns");
	}

	percpu_rcuref_kill(&stranded_rcu);
	is(percpu_rcuref_barrier(), 0, "percpu_rcuref_barrier() succeeds");
	ok(__atomic_load_n(&stranded_rcu_released, __ATOMIC_SEQ_CST),
	   "and the release after the grace period has run");

	/* The manager's references are the last: a flush must release both,
	 * the rcuref's release after a grace period. */
	percpu_ref_put(&stranded_managed);
	percpu_rcuref_put(&stranded_managed_rcu);
	/* The hook counts the reclaimer's start (refused here by the
	 * wrapper), then the pass's marker: refused, the flush returns (it
	 * scanned for ever, warning at each try). */
	percpuref_fault_fail_nth_alloc(2);
	is(percpu_ref_managed_flush(), -ENOMEM,
	   "percpu_ref_managed_flush() with no memory for a pass fails");
	percpuref_fault_fail_nth_alloc(0);
	ok(!__atomic_load_n(&stranded_managed_released, __ATOMIC_SEQ_CST),
	   "and has released nothing");
	is(percpu_ref_managed_flush(), 0, "percpu_ref_managed_flush() succeeds");
	ok(__atomic_load_n(&stranded_managed_released, __ATOMIC_SEQ_CST),
	   "and the managed ref's release has run");
	ok(__atomic_load_n(&stranded_managed_rcu_released, __ATOMIC_SEQ_CST),
	   "and the managed rcuref's release has run");

	alarm(0);
	__atomic_store_n(&refuse_threads, false, __ATOMIC_SEQ_CST);
	percpu_ref_exit(&stranded_kill);
	percpu_rcuref_exit(&stranded_rcu);
	percpu_ref_exit(&stranded_managed);
	percpu_rcuref_exit(&stranded_managed_rcu);
}

static struct percpu_ref polled_chain[CHAIN];
static int polled_chain_released;	/* atomic */

static void polled_chain_release(struct percpu_ref *ref)
{
	long i = ref - polled_chain;

	__atomic_fetch_add(&polled_chain_released, 1, __ATOMIC_SEQ_CST);
	if (i + 1 < CHAIN)
		percpu_ref_kill(&polled_chain[i + 1]);
}

static void test_polling_thread_chain(void)
{
	int i;

	for (i = 0; i < CHAIN && !percpu_ref_init(&polled_chain[i], polled_chain_release, 0); i++)
		;
	if (!ok(i == CHAIN, "polled chain initialised"))
		return;
	percpuref_shutdown();	/* no library thread runs now */
	is(percpu_ref_poll_register(), 0, "polled chain: register");
	__atomic_store_n(&refuse_threads, true, __ATOMIC_SEQ_CST);
	alarm(30);
	percpu_ref_kill(&polled_chain[0]);
	percpuref_shutdown();
	is(__atomic_load_n(&polled_chain_released, __ATOMIC_SEQ_CST), CHAIN,
	   "with no thread to start, shutdown on a polling thread finishes the kills its "
	   "releases queue on that thread");
	alarm(0);
	__atomic_store_n(&refuse_threads, false, __ATOMIC_SEQ_CST);
	/* Whatever the shutdown left, so that every ref can be exited. */
	while (percpu_ref_poll(PERCPU_REF_POLL_WAIT) > 0)
		;
	is(percpu_ref_poll_unregister(), 0, "polled chain: unregister");
	for (i = 0; i < CHAIN; i++)
		percpu_ref_exit(&polled_chain[i]);
}

int main(void)
{
	struct percpu_ref_managed_config config;
	unsigned long warnings;
	int i;

	if (!ok(!percpu_ref_init(&managed, managed_release, PERCPU_REF_REL_MANAGED) &&
		!percpu_ref_init(&killer, killer_release, 0), "refs initialised"))
		return done_testing();
	percpu_ref_kill(&killer);
	percpuref_shutdown();
	ok(managed_released, "a managed ref dropped by a kill's release is released by shutdown");
	percpu_ref_exit(&managed);
	percpu_ref_exit(&killer);

	/* Scans every millisecond: the reclaimer releases it soon. */
	percpu_ref_managed_get_config(&config);
	config.interval_ms = 1;
	percpu_ref_managed_set_config(&config);
	if (!ok(!percpu_ref_init(&reclaimed, reclaimed_release, PERCPU_REF_REL_MANAGED) &&
		!percpu_ref_init(&cascaded, cascaded_release, 0), "refs initialised"))
		return done_testing();
	percpu_ref_put(&reclaimed);
	while (!__atomic_load_n(&reclaim_started, __ATOMIC_SEQ_CST))
		usleep(100);
	percpuref_shutdown();
	ok(__atomic_load_n(&cascaded_released, __ATOMIC_SEQ_CST),
	   "a ref killed by a release the reclaimer was running is released by shutdown");
	percpu_ref_exit(&reclaimed);
	percpu_ref_exit(&cascaded);

	for (i = 0; i < CHAIN && !percpu_ref_init(&chain[i], chain_release, 0); i++)
		;
	if (!ok(i == CHAIN, "chain initialised"))
		return done_testing();
	percpu_ref_kill_and_confirm(&chain[0], chain_confirm);
	__atomic_store_n(&refuse_threads, true, __ATOMIC_SEQ_CST);
	warnings = percpuref_warning_count();
	__atomic_store_n(&chain_go, true, __ATOMIC_SEQ_CST);
	percpuref_shutdown();
	is(__atomic_load_n(&chain_released, __ATOMIC_SEQ_CST), CHAIN,
	   "with no thread to start, shutdown finishes a chain of kills itself");
	/* Every kill and every round tries to start one again. */
	is(percpuref_warning_count() - warnings, 1, "the refused start warned once");
	__atomic_store_n(&refuse_threads, false, __ATOMIC_SEQ_CST);
	for (i = 0; i < CHAIN; i++)
		percpu_ref_exit(&chain[i]);

	/* A switch to atomic whose callback thread could not start, then a
	 * switch back once threads can start again: the second waited for
	 * the first for ever (nothing started the thread); the deadline is
	 * the failure. */
	if (!ok(!percpu_ref_init(&orphan, orphan_release, PERCPU_REF_ALLOW_REINIT),
		"ref initialised"))
		return done_testing();
	__atomic_store_n(&refuse_threads, true, __ATOMIC_SEQ_CST);
	percpu_ref_switch_to_atomic(&orphan, NULL);
	__atomic_store_n(&refuse_threads, false, __ATOMIC_SEQ_CST);
	alarm(30);
	percpu_ref_switch_to_percpu(&orphan);
	alarm(0);
	ok(!(__atomic_load_n(&orphan.percpu_count_ptr, __ATOMIC_RELAXED) & __PERCPU_REF_ATOMIC),
	   "a mode call waiting for a switch whose thread could not start starts it once it can");
	percpu_ref_kill(&orphan);
	percpu_ref_barrier();
	ok(__atomic_load_n(&orphan_released, __ATOMIC_SEQ_CST), "and the ref is released");
	percpu_ref_exit(&orphan);

	test_no_thread_can_start();
	test_polling_thread_chain();
	return done_testing();
}
