/* SPDX-License-Identifier: MIT */
/*
 * fork() from a callback (docs/percpu_ref.md: allowed, the child may only
 * exec or _exit): the fork must return in the parent, and the library must
 * keep working there.  A callback on a library thread holds that thread's
 * batch lock, and fork takes the batch locks first, so the forking thread
 * must leave alone every batch lock, not only its own:
 *  - a managed ref's @release (reclaimer, scan lock held) that forks must
 *    not take the callback thread's batch lock, which ranks below it (a
 *    debug build asserted the order, a release build took it);
 *  - a confirm callback (callback thread) and a managed @release
 *    (reclaimer) forking at once each waited for the other's batch lock:
 *    a deadlock;
 *  - a user thread's fork waiting for the callback thread's batch while a
 *    confirm callback of that batch forks too: the ranks a fork skips are
 *    the forking thread's own; when they were one variable for the process,
 *    the user's fork kept the batch lock it took, and every later kill and
 *    barrier hung.
 * Each case runs in a child of the test (a hang or a crash there fails that
 * case only, under a deadline).  Skipped under ThreadSanitizer (no threads
 * in the child of a threaded process) and valgrind (the grandchildren leak
 * what the vanished threads held, by design).
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "percpuref/managed.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

#define CASE_DEADLINE_S 20

static struct percpu_ref killed, managed, later;
static int in_release, in_confirm, forks_done;	/* atomic */

/* Forks a child that exits at once; true if it exited 0. */
static bool fork_and_reap(void)
{
	int status;
	pid_t pid = fork();

	if (pid == 0)
		_exit(0);
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return false;
	__atomic_fetch_add(&forks_done, 1, __ATOMIC_SEQ_CST);
	return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void wait_for(int *flag, int value)
{
	while (__atomic_load_n(flag, __ATOMIC_SEQ_CST) < value)
		usleep(100);
}

static void set_interval_0(void)
{
	struct percpu_ref_managed_config config = { 0, PERCPU_REF_MANAGED_MAX_PER_SCAN,
						    PERCPU_REF_SCAN_FILTERED };

	percpu_ref_managed_set_config(&config);
}

/* Case 1: a managed @release forks. */
static void release_forks(struct percpu_ref *ref)
{
	(void)ref;
	if (!fork_and_reap())
		_exit(3);
}

static int case_release_forks(void)
{
	set_interval_0();
	if (percpu_ref_init(&managed, release_forks, PERCPU_REF_REL_MANAGED))
		return 2;
	percpu_ref_put(&managed);	/* the manager's is the last one */
	wait_for(&forks_done, 1);
	return percpu_ref_managed_flush() == 0 ? 0 : 4;
}

/* Case 2: a confirm callback and a managed @release fork at once. */
static void release_forks_after_confirm(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_store_n(&in_release, 1, __ATOMIC_SEQ_CST);
	wait_for(&in_confirm, 1);
	usleep(20000);		/* the confirm's fork goes first */
	if (!fork_and_reap())
		_exit(3);
}

static void confirm_forks(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_store_n(&in_confirm, 1, __ATOMIC_SEQ_CST);
	wait_for(&in_release, 1);
	if (!fork_and_reap())
		_exit(3);
}

static int case_two_callbacks_fork(void)
{
	set_interval_0();
	if (percpu_ref_init(&killed, NULL, 0) ||
	    percpu_ref_init(&managed, release_forks_after_confirm, PERCPU_REF_REL_MANAGED))
		return 2;
	percpu_ref_kill_and_confirm(&killed, confirm_forks);
	percpu_ref_put(&managed);
	wait_for(&forks_done, 2);
	return percpu_ref_barrier() == 0 && percpu_ref_managed_flush() == 0 ? 0 : 4;
}

/* Case 3: the user's fork waits for a batch whose confirm forks. */
static void confirm_forks_late(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_store_n(&in_confirm, 1, __ATOMIC_SEQ_CST);
	usleep(100000);		/* the user's fork now waits for this batch */
	if (!fork_and_reap())
		_exit(3);
}

static int case_user_fork_meets_callback_fork(void)
{
	if (percpu_ref_init(&killed, NULL, 0) || percpu_ref_init(&later, NULL, 0))
		return 2;
	percpu_ref_kill_and_confirm(&killed, confirm_forks_late);
	wait_for(&in_confirm, 1);
	if (!fork_and_reap())
		return 3;
	/* The callback thread and the batch locks are free again. */
	percpu_ref_kill(&later);
	if (percpu_ref_barrier() != 0)
		return 4;
	if (!percpu_ref_is_zero(&later))
		return 5;
	percpu_ref_exit(&killed);
	percpu_ref_exit(&later);
	return 0;
}

/* Runs @fn in a child under a deadline: its exit status, or 128 + signal. */
static int run_case(int (*fn)(void))
{
	int status;
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		alarm(CASE_DEADLINE_S);
		_exit(fn());
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(void)
{
#if defined(__SANITIZE_THREAD__)
	ok(1, "skipped under ThreadSanitizer: no threads in a fork child");
	return done_testing();
#endif
	if (getenv("PERCPUREF_VALGRIND")) {
		ok(1, "skipped under valgrind: fork children leak by design");
		return done_testing();
	}
	/* Exit status 2: set-up failed; 3: a fork failed; 4: a barrier or flush
	 * failed; 5: a kill not released; 128 + n: signal n (14: hang). */
	is(run_case(case_release_forks), 0, "a managed release forks");
	is(run_case(case_two_callbacks_fork), 0,
	   "a confirm callback and a managed release fork at once");
	is(run_case(case_user_fork_meets_callback_fork), 0,
	   "a user's fork waits for a batch whose confirm forks; kills and barriers work after");
	return done_testing();
}
