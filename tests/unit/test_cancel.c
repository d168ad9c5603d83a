/* SPDX-License-Identifier: MIT */
/*
 * Thread cancellation (docs/percpu_ref.md, "What a calling thread must do"):
 * no library function acts on a cancellation request, and the callbacks it
 * runs run with cancellation disabled.  Each case runs one call on a thread
 * that has a deferred cancellation pending when it makes the call: the
 * call must return, its operation must be complete (a kill's put made, a
 * switch finished), and the thread must then die at its own next
 * cancellation point.  Without that, the thread dies inside the call at
 * its first condition wait, join, sleep or write to stderr, holding a
 * library lock or with an operation half done, and the next call that
 * needs that lock hangs (the alarm turns a hang into a failure).  The last
 * case runs in a child process, which a seccomp filter and a full fd table
 * leave with no fence but a sleep.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "percpuref/hcount.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_rcuref.h"
#include "percpuref/percpu_ref.h"
#include "child.h"
#include "sandbox.h"
#include "tap.h"

static void on_alarm(int sig)
{
	static const char msg[] = "Bail out! hung: a cancelled thread left a library lock held\n";

	(void)sig;
	(void)!write(STDOUT_FILENO, msg, sizeof(msg) - 1);
	_exit(1);
}

static void bail_out(const char *what)
{
	printf("Bail out! %s failed\n", what);
	exit(1);
}

static void pause_ms(long ms)
{
	struct timespec t = { ms / 1000, (ms % 1000) * 1000000 };

	nanosleep(&t, NULL);
}

/* A flag one thread sets and another waits for (sequentially consistent:
 * each also orders what was written before it). */
static void set_flag(int *flag)
{
	__atomic_store_n(flag, 1, __ATOMIC_SEQ_CST);
}

static void wait_flag(int *flag)
{
	while (!__atomic_load_n(flag, __ATOMIC_SEQ_CST))
		sched_yield();
}

struct victim {
	void (*call)(void *arg);
	void *arg;
	int ready, cancelled, returned;
};

/* Gets a cancellation request while it cannot act on it, then makes the
 * call with it pending; acts on it at pthread_testcancel(). */
static void *victim_main(void *arg)
{
	struct victim *v = arg;

	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
	set_flag(&v->ready);
	wait_flag(&v->cancelled);
	pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
	v->call(v->arg);
	set_flag(&v->returned);
	pthread_testcancel();
	return NULL;
}

/*
 * Runs @call on a thread with a cancellation pending.  @unblock (may be
 * NULL) lets the call finish: it runs once the call has had time to reach
 * its wait.  0 when the call returned and the thread then died of the
 * cancellation; 1 when it died inside the call; 2 when it was not
 * cancelled at all; 3 when no thread started.
 */
static int run_victim(void (*call)(void *), void *arg, void (*unblock)(void))
{
	struct victim v = { call, arg, 0, 0, 0 };
	pthread_t t;
	void *res = NULL;

	if (pthread_create(&t, NULL, victim_main, &v))
		return 3;
	wait_flag(&v.ready);
	pthread_cancel(t);
	set_flag(&v.cancelled);
	if (unblock) {
		pause_ms(100);
		unblock();
	}
	pthread_join(t, &res);
	if (!__atomic_load_n(&v.returned, __ATOMIC_SEQ_CST))
		return 1;
	return res == PTHREAD_CANCELED ? 0 : 2;
}

static void call_with_cancel_pending(const char *name, void (*call)(void *), void *arg,
				     void (*unblock)(void))
{
	int ret = run_victim(call, arg, unblock);

	if (ret == 3)
		bail_out("pthread_create");
	ok(ret == 0 || ret == 2, "%s: returned with a cancellation pending", name);
	ok(ret == 0, "%s: then cancelled at the caller's next cancellation point", name);
}

/* The callback thread held up inside a kill's confirm callback. */
static struct percpu_ref holder;
static int holder_entered, holder_go;

static void hold_callback_thread(struct percpu_ref *ref)
{
	(void)ref;
	set_flag(&holder_entered);
	wait_flag(&holder_go);
}

static void noop_release(struct percpu_ref *ref)
{
	(void)ref;
}

static void block_callback_thread(void)
{
	holder_entered = holder_go = 0;
	if (percpu_ref_init(&holder, noop_release, 0))
		bail_out("percpu_ref_init");
	percpu_ref_kill_and_confirm(&holder, hold_callback_thread);
	wait_flag(&holder_entered);
}

static void unblock_callback_thread(void)
{
	set_flag(&holder_go);
}

static void release_holder(void)
{
	percpu_ref_barrier();
	percpu_ref_exit(&holder);
}

/* The first call of the process: the runtime reads sysfs (stdio). */
static void call_init(void *arg)
{
	struct percpu_ref *ref = arg;

	if (percpu_ref_init(ref, noop_release, PERCPU_REF_ALLOW_REINIT))
		ref->data = NULL;
}

static void call_switch_to_atomic_sync(void *arg)
{
	percpu_ref_switch_to_atomic_sync(arg);
}

static void call_barrier(void *arg)
{
	(void)arg;
	percpu_ref_barrier();
}

static void call_rcuref_barrier(void *arg)
{
	(void)arg;
	percpu_rcuref_barrier();
}

static void call_kill(void *arg)
{
	percpu_ref_kill(arg);
}

static int confirm_ran;

static void confirm_with_cancellation_point(struct percpu_ref *ref)
{
	(void)ref;
	pthread_testcancel();
	set_flag(&confirm_ran);
}

static void call_kill_and_confirm(void *arg)
{
	percpu_ref_kill_and_confirm(arg, confirm_with_cancellation_point);
}

static void call_managed_flush(void *arg)
{
	(void)arg;
	percpu_ref_managed_flush();
}

static void call_shutdown(void *arg)
{
	(void)arg;
	percpuref_shutdown();
}

static int busy_result;

static void call_hcount_destroy_busy(void *arg)
{
	busy_result = hcount_tree_destroy(arg);
}

/*
 * A charge at a leaf with an empty cache, whose parent's slot lock this
 * thread holds: the charge holds the leaf's lock while it waits for the
 * parent's, long enough to go from spinning and yielding to sleeping.
 */
static struct hcount_ns *held_mid, *charged_leaf;
static int charge_result = -1;

static void call_hcount_charge_contended(void *arg)
{
	(void)arg;
	charge_result = hcount_charge(charged_leaf, 0, 1);
}

static void unlock_held_mid(void)
{
	__hcount_slot_unlock(&held_mid->slots[0]);
}

/* An RCU-deferred release that holds up the reclaimer (it runs them). */
static int rcu_entered, rcu_go, rcu_released;

static void held_rcu_release(struct percpu_rcuref *ref)
{
	set_flag(&rcu_entered);
	wait_flag(&rcu_go);
	percpu_rcuref_exit(ref);
	__atomic_fetch_add(&rcu_released, 1, __ATOMIC_SEQ_CST);
}

static void rcu_release(struct percpu_rcuref *ref)
{
	percpu_rcuref_exit(ref);
	__atomic_fetch_add(&rcu_released, 1, __ATOMIC_SEQ_CST);
}

static void unblock_reclaimer(void)
{
	set_flag(&rcu_go);
}

static int released;

static void count_release(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_fetch_add(&released, 1, __ATOMIC_SEQ_CST);
}

/* A callback that enables cancellation and leaves it so, and one that
 * records the state it runs in. */
static int state_seen = -1;

static int cancel_state(void)
{
	int state;

	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &state);
	pthread_setcancelstate(state, NULL);
	return state;
}

static void enabling_callback(struct percpu_ref *ref)
{
	(void)ref;
	pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
}

static void recording_release(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_store_n(&state_seen, cancel_state(), __ATOMIC_SEQ_CST);
}

/*
 * A callback that changes the cancellation state: the library puts back the
 * state it found, for the next callback on the callback thread and for the
 * caller on the caller's thread.
 */
static void test_callback_changes_state(void)
{
	struct percpu_ref a, b, c;
	int old;

	if (percpu_ref_init(&a, enabling_callback, 0) || percpu_ref_init(&b, recording_release, 0))
		bail_out("percpu_ref_init");
	percpu_ref_kill(&a);	/* released on the callback thread */
	percpu_ref_barrier();
	percpu_ref_kill(&b);
	percpu_ref_barrier();
	is(state_seen, PTHREAD_CANCEL_DISABLE,
	   "a release after one that enabled cancellation runs with it disabled");
	percpu_ref_exit(&a);
	percpu_ref_exit(&b);

	if (percpu_ref_init(&c, noop_release, PERCPU_REF_INIT_ATOMIC))
		bail_out("percpu_ref_init");
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
	percpu_ref_kill_and_confirm(&c, enabling_callback);	/* at once, here */
	is(cancel_state(), PTHREAD_CANCEL_DISABLE,
	   "a caller gets back its own state after a confirm that enabled cancellation");
	pthread_setcancelstate(old, NULL);
	percpu_ref_exit(&c);
}

static void nothing(void *arg)
{
	(void)arg;
}

/*
 * Re-executed (mode --fence-refused): membarrier refused by a seccomp
 * filter, and the migration fence refused too (a full fd table: the
 * threads cannot be listed), so a fence gives up the per-CPU fast path and
 * sleeps, halfway through a synchronous switch and, on the fallback path,
 * holding the readers' lock.  Exit status: 0; 1 when the call did not
 * return; 77 when no filter can be installed; a hang ends as SIGALRM.
 */
static int mode_fence_refused(void)
{
	static struct percpu_ref a, b;
	struct rlimit before;
	int ret;
	pid_t pid;

	if (percpu_ref_init(&a, noop_release, PERCPU_REF_ALLOW_REINIT) ||
	    percpu_ref_init(&b, noop_release, PERCPU_REF_ALLOW_REINIT))
		return 3;
	percpu_ref_get(&a);	/* a fallback reader, where rseq is off */
	percpu_ref_put(&a);
	/* pthread_cancel() loads the unwinder on first use: while files open. */
	if (run_victim(nothing, NULL, NULL) || refuse_membarrier())
		return 77;
	if (!fill_fd_table(&before))
		return 3;
	ret = run_victim(call_switch_to_atomic_sync, &a, NULL);
	setrlimit(RLIMIT_NOFILE, &before);
	if (ret)
		return 1;
	/* The readers' lock, the switch in flight, the fork lock. */
	percpu_ref_switch_to_atomic_sync(&b);
	percpu_ref_switch_to_percpu(&a);
	percpu_ref_switch_to_atomic_sync(&a);
	if (!UNDER_TSAN) {	/* no threads in a threaded process's child */
		pid = fork();
		if (pid == 0)
			_exit(0);
		if (wait_child(pid) != 0)
			return 3;
	}
	percpu_ref_exit(&a);
	percpu_ref_exit(&b);
	return 0;
}

int main(int argc, char **argv)
{
	struct percpu_ref ref = { 0 }, killed;
	struct percpu_rcuref r1, r2;
	struct hcount_tree *tree;

	if (argc > 1) {
		alarm(20);
		return strcmp(argv[1], "--fence-refused") ? 2 : mode_fence_refused();
	}
	signal(SIGALRM, on_alarm);
	alarm(60);

	/* Before any other library call: the runtime's first use. */
	call_with_cancel_pending("first init", call_init, &ref, NULL);
	ok(ref.data != NULL, "first init: the ref works");
	if (!ref.data && percpu_ref_init(&ref, noop_release, PERCPU_REF_ALLOW_REINIT))
		bail_out("percpu_ref_init");

	/* A synchronous switch waiting for an asynchronous one in flight. */
	block_callback_thread();
	percpu_ref_switch_to_atomic(&ref, NULL);
	call_with_cancel_pending("switch_to_atomic_sync waiting", call_switch_to_atomic_sync, &ref,
				 unblock_callback_thread);
	ok(percpu_ref_is_zero(&ref) == false && percpu_ref_barrier() == 0,
	   "switch_to_atomic_sync waiting: the library still works");
	percpu_ref_switch_to_percpu(&ref);
	release_holder();

	/* A barrier waiting for the callback thread. */
	block_callback_thread();
	percpu_ref_switch_to_atomic(&ref, NULL);
	call_with_cancel_pending("percpu_ref_barrier waiting", call_barrier, NULL,
				 unblock_callback_thread);
	percpu_ref_switch_to_percpu(&ref);
	release_holder();
	ok(percpu_ref_barrier() == 0, "percpu_ref_barrier waiting: the library still works");

	/* A warning: written to stderr after the lock is dropped. */
	if (percpu_ref_init(&killed, count_release, 0))
		bail_out("percpu_ref_init");
	percpu_ref_kill(&killed);
	percpu_ref_barrier();
	call_with_cancel_pending("second kill (a warning)", call_kill, &killed, NULL);
	percpu_ref_exit(&killed);

	/* A kill's confirm run at once on the caller's thread, with a
	 * cancellation point in it: the kill's put still comes after. */
	released = 0;
	if (percpu_ref_init(&killed, count_release, PERCPU_REF_INIT_ATOMIC))
		bail_out("percpu_ref_init");
	call_with_cancel_pending("kill_and_confirm, confirm at once", call_kill_and_confirm,
				 &killed, NULL);
	ok(confirm_ran, "kill_and_confirm: the confirm ran to its end");
	is(released, 1, "kill_and_confirm: the kill's put released the ref");
	percpu_ref_exit(&killed);

	/* A flush waiting for a reclaimer pass. */
	call_with_cancel_pending("percpu_ref_managed_flush", call_managed_flush, NULL, NULL);
	ok(percpu_ref_managed_flush() == 0, "percpu_ref_managed_flush: the library still works");

	/* An RCU barrier waiting for the reclaimer, held up in a release. */
	if (percpu_rcuref_init(&r1, NULL, held_rcu_release, PERCPU_REF_INIT_ATOMIC) ||
	    percpu_rcuref_init(&r2, NULL, rcu_release, PERCPU_REF_INIT_ATOMIC))
		bail_out("percpu_rcuref_init");
	percpu_rcuref_kill(&r1);
	wait_flag(&rcu_entered);
	percpu_rcuref_kill(&r2);
	call_with_cancel_pending("percpu_rcuref_barrier waiting", call_rcuref_barrier, NULL,
				 unblock_reclaimer);
	ok(percpu_rcuref_barrier() == 0 && rcu_released == 2,
	   "percpu_rcuref_barrier waiting: both released, the library still works");

	test_callback_changes_state();

	/* A shutdown joining the library's threads (both running). */
	percpu_ref_switch_to_atomic(&ref, NULL);
	percpu_ref_switch_to_percpu(&ref);
	percpu_ref_managed_flush();
	call_with_cancel_pending("percpuref_shutdown", call_shutdown, NULL, NULL);
	percpu_ref_switch_to_atomic(&ref, NULL);
	ok(percpu_ref_barrier() == 0, "percpuref_shutdown: the threads start again");
	percpu_ref_exit(&ref);
	percpuref_shutdown();

	/* hcount: a refused destroy warns. */
	if (hcount_tree_create(&tree, 1, HCOUNT_BATCH_DEFAULT, NULL) ||
	    hcount_charge(hcount_tree_root(tree), 0, 1))
		bail_out("hcount");
	call_with_cancel_pending("hcount_tree_destroy refused", call_hcount_destroy_busy, tree,
				 NULL);
	is(busy_result, -EBUSY, "hcount_tree_destroy refused: -EBUSY");
	is(hcount_uncharge(hcount_tree_root(tree), 0, 1), 0, "hcount: the tree still works");
	is(hcount_tree_destroy(tree), 0, "hcount: destroyed");

	/* hcount: a charge that sleeps on a contended slot lock. */
	if (hcount_tree_create(&tree, 1, HCOUNT_BATCH_DEFAULT, NULL) ||
	    hcount_ns_create(&held_mid, hcount_tree_root(tree), NULL) ||
	    hcount_ns_create(&charged_leaf, held_mid, NULL))
		bail_out("hcount");
	__hcount_slot_lock(&held_mid->slots[0]);
	call_with_cancel_pending("hcount_charge sleeping on a slot lock",
				 call_hcount_charge_contended, NULL, unlock_held_mid);
	is(charge_result, 0, "hcount_charge sleeping on a slot lock: charged");
	is(hcount_uncharge(charged_leaf, 0, 1), 0, "hcount: the leaf's lock was released");
	is(hcount_tree_check(tree), 0, "hcount: invariant holds");
	hcount_ns_destroy(charged_leaf);
	hcount_ns_destroy(held_mid);
	is(hcount_tree_destroy(tree), 0, "hcount: destroyed");

	alarm(0);

	{
		int ret = run_mode_without_membarrier("--fence-refused");

		if (ret == 77)
			printf("# skipped: cannot refuse membarrier here\n");
		else
			is(ret, 0, "switch_to_atomic_sync whose fence is refused: returned, and "
			   "the library still works (fork included)");
	}
	return done_testing();
}
