/* SPDX-License-Identifier: MIT */
/*
 * test_give_way.c - the callback thread gives way before a batch when a
 * fence started within PERCPUREF_CALLBACK_YIELD_US (src/deferred.c,
 * "Giving way"): it yields once, so that killers sharing its CPU queue
 * more for the same fence.  Here a thread pinned to one CPU (the callback
 * thread its first kill starts takes the same CPU) kills refs in a loop,
 * with the window at 1 s so that every batch after the first follows a
 * fence: the thread gives way, its sched_yield() calls show it (wrapped:
 * tests/CMakeLists.txt), and every ref is still released exactly once.
 * It does not while a barrier waits for it, nor while a sync switch waits
 * for the switch it is to end; a fork child forgets a barrier of the
 * parent's that waited, and its counts are 0 after a wait that a signal
 * handler's fork interrupted (a switch's, a paced kill's, or between a
 * wait's updates).  Child runs: with the window
 * at 0 it never gives way; at 2 ms, a kill after a quiet spell of 20 ms
 * does not either.  How much it gains is the benchmark's to say
 * (switch-storm's kill and managed variants).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "child.h"
#include "internal.h"
#include "percpuref/percpu_ref.h"
#include "pin.h"
#include "ref_mode.h"
#include "signaller.h"
#include "tap.h"

#define KILLS 2000
/* Exit statuses of the child runs. */
#define CHILD_OK 0
#define CHILD_GAVE_WAY 1
#define CHILD_LOST_RELEASE 2
#define CHILD_COUNT_WRONG 3
#define CHILD_NOT_PACED 4

struct object {
	struct percpu_ref ref;
	int releases;		/* atomic: counted on the callback thread */
};

static struct object objects[KILLS];

/* sched_yield() calls made on the library's callback thread (atomic). */
static unsigned long callback_thread_yields;

int __real_sched_yield(void);

int __wrap_sched_yield(void)
{
	char name[16] = "";

	if (!prctl(PR_GET_NAME, name) && !strcmp(name, "percpuref-cb"))
		__atomic_fetch_add(&callback_thread_yields, 1, __ATOMIC_RELAXED);
	return __real_sched_yield();
}

static unsigned long yields_seen(void)
{
	return __atomic_load_n(&callback_thread_yields, __ATOMIC_RELAXED);
}

static void count_release(struct percpu_ref *ref)
{
	struct object *o = caa_container_of(ref, struct object, ref);

	/* Release: pairs with the check's acquire. */
	__atomic_fetch_add(&o->releases, 1, __ATOMIC_RELEASE);
}

/* Kills @n of objects[], yielding every 16 kills (room for the callback
 * thread on this CPU), then waits for them: the number not released
 * exactly once. */
static int kill_and_count(int n)
{
	int i, wrong = 0;

	for (i = 0; i < n; i++) {
		if (percpu_ref_init(&objects[i].ref, count_release, 0))
			abort();
		percpu_ref_kill(&objects[i].ref);
		if (i % 16 == 15)
			sched_yield();
	}
	percpu_ref_barrier();
	for (i = 0; i < n; i++) {
		wrong += __atomic_load_n(&objects[i].releases, __ATOMIC_ACQUIRE) != 1;
		percpu_ref_exit(&objects[i].ref);
		objects[i].releases = 0;
	}
	return wrong;
}

/* PERCPUREF_CALLBACK_YIELD_US=0: a storm of kills, and no yield. */
static int child_no_interval(void)
{
	cpu_set_t allowed;

	/* Before the library's first use: the callback thread takes this CPU. */
	(void)pin_here(&allowed);
	if (kill_and_count(KILLS))
		return CHILD_LOST_RELEASE;
	return percpuref_test_deferred_gave_way() ? CHILD_GAVE_WAY : CHILD_OK;
}

/* 2 ms: two kills 20 ms apart, each its own batch after a quiet spell. */
static int child_quiet(void)
{
	static const struct timespec quiet = { 0, 20000000 };

	if (kill_and_count(1))
		return CHILD_LOST_RELEASE;
	nanosleep(&quiet, NULL);
	if (kill_and_count(1))
		return CHILD_LOST_RELEASE;
	return percpuref_test_deferred_gave_way() ? CHILD_GAVE_WAY : CHILD_OK;
}

static int slow_confirm_started;	/* atomic */
static int slow_confirm_saw_waiter;	/* atomic */

/* Returns once a caller counts as waiting for the thread (10 s at most:
 * then, with the fence 10 s old, nothing would yield; the tests check
 * slow_confirm_saw_waiter). */
static void confirm_when_waited_for(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_store_n(&slow_confirm_started, 1, __ATOMIC_RELAXED);
	if (POLL_UNTIL(percpuref_test_deferred_waiters()))
		__atomic_store_n(&slow_confirm_saw_waiter, 1, __ATOMIC_RELAXED);
}

/* Arms confirm_when_waited_for() for one kill. */
static void arm_slow_confirm(void)
{
	__atomic_store_n(&slow_confirm_started, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&slow_confirm_saw_waiter, 0, __ATOMIC_RELAXED);
}

/* The waits for the thread that test_no_yield_while() tries, on @ref: a
 * barrier after its kill, and a sync switch behind its asynchronous one
 * (which the thread is to end). */
static void kill_then_barrier(struct percpu_ref *ref)
{
	percpu_ref_kill(ref);
	percpu_ref_barrier();
}

static void sync_switch_behind_async(struct percpu_ref *ref)
{
	percpu_ref_switch_to_atomic(ref, NULL);
	percpu_ref_switch_to_atomic_sync(ref);
	ok(is_atomic(ref), "the ref is atomic after the sync switch");
}

/*
 * A caller waits for the thread (@wait: the @waiter): no yield on its
 * path.  The thread is in a confirm that returns once the caller counts
 * as waiting, and then finds the caller's item queued, with a fence just
 * before.
 */
static void test_no_yield_while(const char *waiter, void (*wait)(struct percpu_ref *))
{
	unsigned long gave;

	arm_slow_confirm();
	if (percpu_ref_init(&objects[0].ref, count_release, 0) ||
	    percpu_ref_init(&objects[1].ref, count_release, 0))
		abort();
	percpu_ref_kill_and_confirm(&objects[0].ref, confirm_when_waited_for);
	while (!__atomic_load_n(&slow_confirm_started, __ATOMIC_RELAXED))
		sched_yield();
	gave = percpuref_test_deferred_gave_way();
	wait(&objects[1].ref);
	ok(__atomic_load_n(&slow_confirm_saw_waiter, __ATOMIC_RELAXED),
	   "the %s counted as waiting", waiter);
	is(percpuref_test_deferred_gave_way(), gave, "no yield while the %s waits", waiter);
	is(percpuref_test_deferred_waiters(), 0, "and none counted waiting after it");
	if (!percpu_ref_is_dying(&objects[1].ref))
		kill_then_barrier(&objects[1].ref);
	ok(__atomic_load_n(&objects[0].releases, __ATOMIC_ACQUIRE) == 1 &&
	   __atomic_load_n(&objects[1].releases, __ATOMIC_ACQUIRE) == 1, "both released once");
	for (int i = 0; i < 2; i++) {
		percpu_ref_exit(&objects[i].ref);
		objects[i].releases = 0;
	}
}

static pthread_t main_thread;
/* fork_in_handler()'s last fork (0 in its child, -1 for none or a failed
 * one), how many it made and failed to make (atomic), and whether it
 * forks no more (a signal that comes after the test's own end). */
static volatile pid_t handler_child = -1;
static int handler_forks, handler_fork_failures;
static volatile sig_atomic_t handler_forks_closed;

/* Forks, once a process: a child that hangs dies by SIGALRM in 20 s. */
static void fork_in_handler(int sig)
{
	(void)sig;
	if (handler_child == 0 || handler_forks_closed)
		return;
	handler_child = fork();
	if (handler_child == 0)
		alarm(20);
	else
		__atomic_fetch_add(handler_child > 0 ? &handler_forks : &handler_fork_failures, 1,
				   __ATOMIC_RELAXED);
}

/* Once the sync switch waits, interrupts it with a signal whose handler
 * forks (the fork then waits for this batch to end). */
static void confirm_then_signal(struct percpu_ref *ref)
{
	confirm_when_waited_for(ref);
	pthread_kill(main_thread, SIGUSR1);
}

/*
 * A fork from a signal handler that interrupted this thread's wait for a
 * switch (outside the contract, which allows such a fork only in a get or
 * put, but it neither hangs nor loses anything): the child begins at 0,
 * and its return from the wait leaves it there (a plain decrement wrapped
 * it to ULONG_MAX).
 */
static void test_handler_fork_in_switch_wait(void)
{
	struct sigaction fork_action = { .sa_handler = fork_in_handler }, old;
	const char *why = fork_children_untestable();
	int status = -1;

	if (why) {
		skip("fork from a handler in a switch's wait: %s", why);
		return;
	}
	arm_slow_confirm();
	main_thread = pthread_self();
	if (sigaction(SIGUSR1, &fork_action, &old) ||
	    percpu_ref_init(&objects[0].ref, count_release, 0))
		abort();
	percpu_ref_switch_to_atomic(&objects[0].ref, confirm_then_signal);
	percpu_ref_switch_to_atomic_sync(&objects[0].ref);
	if (handler_child == 0)
		_exit(percpuref_test_deferred_waiters() == 0 ? 0 : 1);
	sigaction(SIGUSR1, &old, NULL);
	if (handler_child > 0)
		waitpid(handler_child, &status, 0);
	ok(__atomic_load_n(&slow_confirm_saw_waiter, __ATOMIC_RELAXED) && handler_child > 0 &&
	   WIFEXITED(status) && WEXITSTATUS(status) == 0,
	   "a fork from a handler in a switch's wait: the child counts no waiter after it");
	is(percpuref_test_deferred_waiters(), 0, "nor does the parent");
	percpu_ref_exit(&objects[0].ref);
}

enum { HANDLER_FORKS = 200 };

/*
 * A handler's fork may land anywhere in a wait's counting, between the
 * updates of one count and another too: the child's count is 0 once the
 * wait it interrupted has ended.  With a count of the thread's own kept
 * beside the shared one, a fork between the two updates left the child
 * at 1 for good (about half of the children: 907 of 1,939 in a review's
 * run, 69-236 of this test's 200-odd here, on either fast path).
 */
static void test_fork_amid_counting(void)
{
	struct sigaction fork_action = { .sa_handler = fork_in_handler }, old;
	const char *why = fork_children_untestable();
	struct signaller signaller;
	int forks, wrong = 0, status;

	if (why) {
		skip("fork from a handler amid the count's updates: %s", why);
		return;
	}
	__atomic_store_n(&handler_forks, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&handler_fork_failures, 0, __ATOMIC_RELAXED);
	/* A signal every 50 us; a fork takes longer, so each lands at a
	 * point of the loop that varies with the fork's own time. */
	if (sigaction(SIGUSR1, &fork_action, &old) || signaller_start(&signaller, 50000))
		abort();
	/* Every child, forked anywhere in the loop until the handler forks
	 * no more (one forked just before the close makes the close too),
	 * leaves at its top: past the loop it would go on as a second test
	 * process. */
	for (;;) {
		if (handler_child == 0)
			_exit(percpuref_test_deferred_waiters() == 0 ? 0 : 1);
		if (handler_forks_closed)
			break;
		if (__atomic_load_n(&handler_forks, __ATOMIC_RELAXED) +
			    __atomic_load_n(&handler_fork_failures, __ATOMIC_RELAXED) >=
		    HANDLER_FORKS) {
			handler_forks_closed = 1;
		} else {
			/* wait_switch_ended()'s count around its futex wait */
			percpuref_deferred_waiter_begin();
			percpuref_deferred_waiter_end();
		}
	}
	/* A signal sent before the stop, handled as the join returns, finds
	 * the handler closed. */
	signaller_stop(&signaller);
	sigaction(SIGUSR1, &old, NULL);
	forks = __atomic_load_n(&handler_forks, __ATOMIC_RELAXED);
	for (int i = 0; i < forks; i++)
		if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
			wrong++;
	ok(forks >= HANDLER_FORKS && !handler_fork_failures,
	   "%d forks from a handler amid a wait's counting (%d failed)", forks,
	   handler_fork_failures);
	is(wrong, 0, "each child counts no waiter once its wait ended");
	is(percpuref_test_deferred_waiters(), 0, "nor does the parent");
}

static int saw_paced;	/* atomic */

/* Once this process's main thread waits, paced, for the callback thread
 * (10 s at most), interrupts it with a signal whose handler forks. */
static void confirm_when_paced(struct percpu_ref *ref)
{
	(void)ref;
	if (!POLL_UNTIL(percpuref_test_deferred_paced()))
		return;
	__atomic_store_n(&saw_paced, 1, __ATOMIC_RELAXED);
	pthread_kill(main_thread, SIGUSR1);
}

/*
 * PERCPUREF_CALLBACK_BACKLOG=2: kills past the backlog wait for the
 * callback thread, which is in a confirm that signals the waiting thread;
 * its handler forks.  In the child the wait goes on and ends: its count
 * of paced waiters is 0 after (a plain decrement wrapped it to UINT_MAX,
 * and its callback thread never gave way again; found by review).  The
 * child checks as its kills return and goes no further: the fork
 * interrupted a wait on a condition variable that the child's hooks
 * made anew, which a wait with no timeout there (a barrier's) may never
 * see signalled (out of the contract: a forking handler may interrupt
 * only a get or a put; docs/percpu_ref.md, "fork()").  For the same
 * reason the fork hangs where the signal finds the wait between two of
 * its timed sleeps, holding the lock that the fork's hooks take (a
 * microsecond in 25 ms): the run then ends by SIGALRM, and is tried again.
 */
static int child_paced_fork(void)
{
	struct sigaction fork_action = { .sa_handler = fork_in_handler };
	int status = -1, wrong = 0;

	child_deadline(30);	/* after its child's 20 s (fork_in_handler()) */
	main_thread = pthread_self();
	if (sigaction(SIGUSR1, &fork_action, NULL))
		return CHILD_COUNT_WRONG;
	for (int i = 0; i < 16; i++)
		if (percpu_ref_init(&objects[i].ref, count_release, 0))
			abort();
	percpu_ref_kill_and_confirm(&objects[0].ref, confirm_when_paced);
	for (int i = 1; i < 16; i++)
		percpu_ref_kill(&objects[i].ref);	/* past the backlog: paced */
	if (handler_child == 0)
		_exit(percpuref_test_deferred_paced() == 0 ? CHILD_OK : CHILD_COUNT_WRONG);
	percpu_ref_barrier();
	for (int i = 0; i < 16; i++)
		wrong += __atomic_load_n(&objects[i].releases, __ATOMIC_ACQUIRE) != 1;
	if (handler_child > 0)
		status = wait_child(handler_child);
	if (wrong)
		return CHILD_LOST_RELEASE;
	if (!__atomic_load_n(&saw_paced, __ATOMIC_RELAXED))
		return CHILD_NOT_PACED;
	return status == CHILD_OK && percpuref_test_deferred_paced() == 0 ? CHILD_OK
									   : CHILD_COUNT_WRONG;
}

static void test_paced_fork(void)
{
	const char *why = fork_children_untestable();
	int status;

	if (why) {
		skip("fork from a handler in a paced wait: %s", why);
		return;
	}
	setenv("PERCPUREF_CALLBACK_BACKLOG", "2", 1);
	for (int run = 0; run < 3; run++) {
		status = run_mode("--paced-fork");
		if (status != 128 + SIGALRM)
			break;
		printf("# run %d: the handler's fork hung (it found the lock held)\n", run + 1);
	}
	unsetenv("PERCPUREF_CALLBACK_BACKLOG");
	if (status == CHILD_NOT_PACED)
		printf("# the confirm never saw the killer paced\n");
	is(status, CHILD_OK, "a fork from a handler in a paced wait: the child counts none after");
}

static int child_run(const char *what, const char *interval_us, const char *mode)
{
	int status;

	setenv("PERCPUREF_CALLBACK_YIELD_US", interval_us, 1);
	status = run_mode(mode);
	setenv("PERCPUREF_CALLBACK_YIELD_US", "1000000", 1);
	if (status == CHILD_LOST_RELEASE)
		printf("# %s: a ref was not released exactly once\n", what);
	return status;
}

/* Set once the fork below is done (atomic); the release waits for it. */
static int forked;

/* A release, run by the callback thread with the batch lock let go: a
 * fork may come meanwhile.  Run by the kill's own put (the thread ended
 * the switch first), at once. */
static void release_after_fork(struct percpu_ref *ref)
{
	count_release(ref);
	if (percpuref_on_library_thread())
		POLL_UNTIL(__atomic_load_n(&forked, __ATOMIC_ACQUIRE));
}

static void *barrier_thread(void *arg)
{
	(void)arg;
	percpu_ref_barrier();
	return NULL;
}

/*
 * A fork while another thread's barrier waits for the thread: that thread
 * does not exist in the child, whose count of waiters starts at 0 (it kept
 * the parent's 1, and the child's callback thread never gave way again).
 */
static void test_fork_forgets_waiters(void)
{
	const char *why = fork_children_untestable();
	struct object *o = NULL;
	pthread_t waiter;
	int status = -1, wrong = 0;
	bool counted;
	pid_t pid;

	if (why) {
		skip("fork with a barrier waiting: %s", why);
		return;
	}
	/* Until the release is the callback thread's (up to 10 kills). */
	for (int i = 0; i < 10 && !o; i++) {
		if (percpu_ref_init(&objects[i].ref, release_after_fork, 0))
			abort();
		percpu_ref_kill(&objects[i].ref);
		if (!__atomic_load_n(&objects[i].releases, __ATOMIC_ACQUIRE))
			o = &objects[i];
	}
	if (!o) {
		ok(0, "a fork child forgets a waiting barrier: 10 kills released by their put");
		return;
	}
	if (pthread_create(&waiter, NULL, barrier_thread, NULL))
		abort();
	counted = POLL_UNTIL(percpuref_test_deferred_waiters());
	pid = fork();
	if (pid == 0)
		_exit(percpuref_test_deferred_waiters() == 0 ? 0 : 1);
	__atomic_store_n(&forked, 1, __ATOMIC_RELEASE);
	pthread_join(waiter, NULL);
	if (pid > 0)
		waitpid(pid, &status, 0);
	ok(counted && pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	   "a fork child forgets the parent's waiting barrier (counted in the parent: %d)",
	   counted);
	for (struct object *k = objects; k <= o; k++) {
		wrong += __atomic_load_n(&k->releases, __ATOMIC_ACQUIRE) != 1;
		percpu_ref_exit(&k->ref);
		k->releases = 0;
	}
	is(wrong, 0, "each of its %d refs released once", (int)(o - objects) + 1);
}

int main(int argc, char **argv)
{
	unsigned long gave, fences;
	cpu_set_t allowed;
	bool pinned;

	if (argc > 1 && !strcmp(argv[1], "--no-interval"))
		return child_no_interval();
	if (argc > 1 && !strcmp(argv[1], "--quiet"))
		return child_quiet();
	if (argc > 1 && !strcmp(argv[1], "--paced-fork"))
		return child_paced_fork();

	setenv("PERCPUREF_CALLBACK_YIELD_US", "1000000", 1);
	pinned = pin_here(&allowed);	/* as in child_no_interval() */
	is(kill_and_count(KILLS), 0, "%d kills: each released once", KILLS);
	gave = percpuref_test_deferred_gave_way();
	fences = percpuref_deferred_fences();
	ok(gave > 0 && gave <= fences, "the thread gave way before %lu of its %lu batches%s", gave,
	   fences, pinned ? " (sharing this CPU)" : "");
	ok(yields_seen() >= gave, "it called sched_yield() for each (%lu)", yields_seen());
	test_no_yield_while("barrier", kill_then_barrier);
	test_no_yield_while("sync switch", sync_switch_behind_async);
	test_handler_fork_in_switch_wait();
	test_fork_forgets_waiters();
	test_fork_amid_counting();
	test_paced_fork();
	is(child_run("window 0", "0", "--no-interval"), CHILD_OK,
	   "PERCPUREF_CALLBACK_YIELD_US=0: never gave way, each released once");
	is(child_run("quiet", "2000", "--quiet"), CHILD_OK,
	   "a kill after a quiet spell: no yield, released once");
	return done_testing();
}
