/* SPDX-License-Identifier: MIT */
/*
 * fork() from a callback (docs/percpu_ref.md: allowed, the child may only
 * exec or _exit): the fork must return in the parent, and the library must
 * keep working there.  A callback on a library thread runs inside that
 * thread's batch (a confirm holding its batch lock, a @release with it
 * released), and fork takes the batch locks first, so the forking thread
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
 * And a user's fork while a @release run by a library thread waits for a
 * lock the forking thread holds (cases 4-6): fork waited for the batch,
 * callbacks included, the @release for the lock: a deadlock (a Rust Drop,
 * std's Command forking under a lock).  A @release now runs
 * with its batch lock released; the fork child finds the rest of the batch
 * requeued and runs it, and never the @release it interrupted.
 * Each case runs in a child of the test (a hang or a crash there fails that
 * case only, under a deadline).  Skipped under ThreadSanitizer (no threads
 * in the child of a threaded process) and valgrind (the grandchildren leak
 * what the vanished threads held, by design).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "percpuref/managed.h"
#include "percpuref/percpu_rcuref.h"
#include "percpuref/percpu_ref.h"
#include "child.h"
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

/*
 * Waits for a case's own child: 0 if it exited 0, else the case's failure
 * code: 3 (no child), 10 + its exit status, or 100 + its signal (114: it
 * hung).
 */
static int reap_case_child(pid_t pid)
{
	int status;

	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return 3;
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		return WIFEXITED(status) ? 10 + WEXITSTATUS(status) : 100 + WTERMSIG(status);
	return 0;
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

/* Cases 4-6: a @release that waits for the forking thread's lock. */
static pthread_mutex_t user_lock = PTHREAD_MUTEX_INITIALIZER;
static struct percpu_rcuref rcu_waits, rcu_counts;
static int releases;	/* atomic: release_counts() */
/* The forking process and its fork generation, set before the fork; a
 * counting release that runs in its child but finds the generation not
 * one more sets wrong_generation (the child's threads ran the parent's
 * work before the child counted its generation). */
static pid_t forker_pid;
static unsigned long forker_generation;
static int wrong_generation;

static void check_generation(void)
{
	/* Atomic: a release in the parent may run while they are set. */
	pid_t forker = __atomic_load_n(&forker_pid, __ATOMIC_SEQ_CST);

	if (forker && getpid() != forker &&
	    percpuref_fork_generation() != __atomic_load_n(&forker_generation, __ATOMIC_SEQ_CST) + 1)
		__atomic_store_n(&wrong_generation, 1, __ATOMIC_SEQ_CST);
}

static void take_user_lock(void)
{
	__atomic_store_n(&in_release, 1, __ATOMIC_SEQ_CST);
	pthread_mutex_lock(&user_lock);
	pthread_mutex_unlock(&user_lock);
	__atomic_fetch_add(&releases, 1, __ATOMIC_SEQ_CST);
}

static void release_waits(struct percpu_ref *ref)
{
	(void)ref;
	take_user_lock();
}

static void release_counts(struct percpu_ref *ref)
{
	(void)ref;
	check_generation();
	__atomic_fetch_add(&releases, 1, __ATOMIC_SEQ_CST);
}

static void rcu_release_waits(struct percpu_rcuref *ref)
{
	(void)ref;
	take_user_lock();
}

static void rcu_release_counts(struct percpu_rcuref *ref)
{
	(void)ref;
	check_generation();
	__atomic_fetch_add(&releases, 1, __ATOMIC_SEQ_CST);
}

/*
 * With user_lock held: waits until a library thread is inside a @release
 * that waits for it, forks, and in the child waits (@wait) for the rest of
 * the work: exactly one release must have run there (the other ref's,
 * before the fork or in the child, where it must see the child's fork
 * generation: exit status 7), none of the waiting one.  Then lets the
 * parent's @release go on, waits again, and wants @total releases.
 */
static int fork_under_user_lock(int (*wait)(void), int total)
{
	int ret;
	pid_t pid;

	wait_for(&in_release, 1);
	usleep(20000);		/* the @release now waits for user_lock */
	__atomic_store_n(&forker_generation, percpuref_fork_generation(), __ATOMIC_SEQ_CST);
	__atomic_store_n(&forker_pid, getpid(), __ATOMIC_SEQ_CST);
	pid = fork();		/* waited for the @release's batch: a hang */
	if (pid == 0) {
		child_deadline(CASE_DEADLINE_S / 2);	/* a hang here fails the case */
		if (wait())
			_exit(4);
		if (__atomic_load_n(&wrong_generation, __ATOMIC_SEQ_CST))
			_exit(7);
		_exit(__atomic_load_n(&releases, __ATOMIC_SEQ_CST) == 1 ? 0 : 5);
	}
	pthread_mutex_unlock(&user_lock);
	if ((ret = reap_case_child(pid)))
		return ret;
	if (wait() || __atomic_load_n(&releases, __ATOMIC_SEQ_CST) != total)
		return 6;
	return 0;
}

/* Case 4: a kill's @release, on the callback thread.  A first batch holds
 * the thread (its confirm waits for @gate_open) while the two kills queue,
 * so that their puts are not the last ones: a kill whose switch finished
 * first released on the killer's own thread, which holds user_lock. */
static struct percpu_ref gate;
static int gate_open;

static void gate_confirm(struct percpu_ref *ref)
{
	(void)ref;
	wait_for(&gate_open, 1);
}

static int case_kill_release_waits_for_forker(void)
{
	if (percpu_ref_init(&gate, NULL, 0) || percpu_ref_init(&killed, release_waits, 0) ||
	    percpu_ref_init(&later, release_counts, 0))
		return 2;
	percpu_ref_kill_and_confirm(&gate, gate_confirm);
	percpu_ref_kill(&killed);
	percpu_ref_kill(&later);	/* the same batch, or the next */
	pthread_mutex_lock(&user_lock);
	__atomic_store_n(&gate_open, 1, __ATOMIC_SEQ_CST);
	return fork_under_user_lock(percpu_ref_barrier, 2);
}

/* Case 5: a managed @release, on the reclaimer (a scan). */
static int case_managed_release_waits_for_forker(void)
{
	set_interval_0();
	if (percpu_ref_init(&managed, release_waits, PERCPU_REF_REL_MANAGED) ||
	    percpu_ref_init(&later, release_counts, PERCPU_REF_REL_MANAGED))
		return 2;
	pthread_mutex_lock(&user_lock);
	percpu_ref_put(&managed);	/* the manager's are the last ones */
	percpu_ref_put(&later);
	return fork_under_user_lock(percpu_ref_managed_flush, 2);
}

/* Case 6: a percpu_rcuref's @release, after its grace period (an RCU
 * batch on the reclaimer), the waiting one killed last: the batch's other
 * item usually ran before the fork, and nothing is left to requeue.  The
 * child once counted the cut batch as queued still, and its barrier
 * waited for it for ever. */
static int case_rcu_release_waits_for_forker(void)
{
	if (percpu_rcuref_init(&rcu_waits, NULL, rcu_release_waits, 0) ||
	    percpu_rcuref_init(&rcu_counts, NULL, rcu_release_counts, 0))
		return 2;
	pthread_mutex_lock(&user_lock);
	percpu_rcuref_kill(&rcu_counts);
	percpu_rcuref_kill(&rcu_waits);
	return fork_under_user_lock(percpu_rcuref_barrier, 2);
}

/*
 * Case 7: a confirm callback puts another ref's last reference, whose
 * @release runs inside the confirm.  That @release keeps the batch lock
 * (the switch the confirm belongs to is half done on the stack), so the
 * fork waits for it: the child gets the switch whole.  Paused there, it
 * let the fork in, and the child's exit of the confirmed ref waited for
 * ever for a switch no thread would finish.
 */
static struct percpu_ref nested;
static int nested_in_release, nested_released, confirmed_released;

static void nested_release(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_store_n(&nested_in_release, 1, __ATOMIC_SEQ_CST);
	usleep(200000);		/* the main thread forks meanwhile */
	__atomic_fetch_add(&nested_released, 1, __ATOMIC_SEQ_CST);
}

static void confirmed_release(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_fetch_add(&confirmed_released, 1, __ATOMIC_SEQ_CST);
}

static void confirm_puts_last(struct percpu_ref *ref)
{
	(void)ref;
	percpu_ref_put(&nested);
}

static int case_release_nested_in_confirm(void)
{
	int ret;
	pid_t pid;

	if (percpu_ref_init(&killed, confirmed_release, 0) ||
	    percpu_ref_init(&nested, nested_release, 0))
		return 2;
	percpu_ref_get(&nested);
	percpu_ref_kill(&nested);	/* one reference left: ours */
	if (percpu_ref_barrier())
		return 4;
	percpu_ref_kill_and_confirm(&killed, confirm_puts_last);
	wait_for(&nested_in_release, 1);
	pid = fork();
	if (pid == 0) {
		child_deadline(CASE_DEADLINE_S / 2);
		if (percpu_ref_barrier())
			_exit(4);
		percpu_ref_exit(&killed);	/* waited for the half-done switch */
		/* The fork waited for the confirm and the release inside it;
		 * the confirmed ref's own release comes after, and may be
		 * the one in progress at the fork. */
		_exit(__atomic_load_n(&nested_released, __ATOMIC_SEQ_CST) == 1 &&
			      __atomic_load_n(&confirmed_released, __ATOMIC_SEQ_CST) <= 1
		      ? 0 : 5);
	}
	if ((ret = reap_case_child(pid)))
		return ret;
	if (percpu_ref_barrier() || __atomic_load_n(&confirmed_released, __ATOMIC_SEQ_CST) != 1)
		return 6;
	percpu_ref_exit(&killed);
	percpu_ref_exit(&nested);
	return 0;
}

/*
 * Case 8: a managed @release in progress at the fork, in the child: it
 * never runs there, but the ref must live on.  Reinit, put the caller's
 * reference, flush: the reclaimer releases it again.  The child's copy of
 * the ref stayed "release pending" for good, and its reinit never went
 * back on the managed list: nothing released it again.
 */
static int case_managed_reinit_after_fork(void)
{
	int ret;
	pid_t pid;

	set_interval_0();
	if (percpu_ref_init(&managed, release_waits,
			    PERCPU_REF_REL_MANAGED | PERCPU_REF_ALLOW_REINIT))
		return 2;
	pthread_mutex_lock(&user_lock);
	percpu_ref_put(&managed);	/* the manager's is the last one */
	wait_for(&in_release, 1);
	usleep(20000);		/* the @release now waits for user_lock */
	pid = fork();
	if (pid == 0) {
		child_deadline(CASE_DEADLINE_S / 2);
		pthread_mutex_unlock(&user_lock);	/* the child's copy */
		if (!percpu_ref_is_zero(&managed))
			_exit(5);
		percpu_ref_reinit(&managed);
		percpu_ref_put(&managed);
		if (percpu_ref_managed_flush() || percpu_ref_managed_flush())
			_exit(4);
		if (__atomic_load_n(&releases, __ATOMIC_SEQ_CST) != 1)
			_exit(6);
		percpu_ref_exit(&managed);
		_exit(0);
	}
	pthread_mutex_unlock(&user_lock);
	if ((ret = reap_case_child(pid)))
		return ret;
	if (percpu_ref_managed_flush() || __atomic_load_n(&releases, __ATOMIC_SEQ_CST) != 1)
		return 6;
	percpu_ref_exit(&managed);
	return 0;
}

/*
 * Case 9: a fork long after a managed @release returned, its ref exited
 * and its memory reused: the child must find no cut node.  A scanner that
 * left the finished node named would have the child finish it again, on
 * freed memory.
 */
struct heap_ref {
	struct percpu_ref ref;
	char pad[64];
};

static void release_counts_and_exits(struct percpu_ref *ref)
{
	__atomic_fetch_add(&releases, 1, __ATOMIC_SEQ_CST);
	percpu_ref_exit(ref);
}

static int case_fork_after_release_done(void)
{
	struct heap_ref *obj = calloc(1, sizeof(*obj));
	pid_t pid;

	set_interval_0();
	if (!obj || percpu_ref_init(&obj->ref, release_counts_and_exits, PERCPU_REF_REL_MANAGED))
		return 2;
	percpu_ref_put(&obj->ref);
	if (percpu_ref_managed_flush() || __atomic_load_n(&releases, __ATOMIC_SEQ_CST) != 1)
		return 4;
	free(obj);		/* exited by its release: the node is freed too */
	for (int i = 0; i < 64; i++)	/* the memory goes to others */
		free(malloc(sizeof(*obj) + 256));
	pid = fork();
	if (pid == 0) {
		child_deadline(CASE_DEADLINE_S / 2);
		_exit(percpu_ref_managed_flush() || percpu_ref_managed_flush() ? 4 : 0);
	}
	return reap_case_child(pid);
}

/*
 * Case 10: the same with the ref alive and reinitialised before the fork,
 * so on the managed list again: finished again in the child, its node
 * would be pushed a second time (a cycle in the list, and the child's
 * flush never ended), whatever the build.
 */
static int case_fork_after_reinit(void)
{
	int ret;
	pid_t pid;

	set_interval_0();
	if (percpu_ref_init(&managed, release_counts, PERCPU_REF_REL_MANAGED))
		return 2;
	percpu_ref_put(&managed);
	if (percpu_ref_managed_flush() || __atomic_load_n(&releases, __ATOMIC_SEQ_CST) != 1)
		return 4;
	percpu_ref_reinit(&managed);	/* listed again, held by us */
	if (percpu_ref_managed_flush())
		return 4;
	pid = fork();
	if (pid == 0) {
		child_deadline(CASE_DEADLINE_S / 2);
		percpu_ref_put(&managed);
		if (percpu_ref_managed_flush() || percpu_ref_managed_flush())
			_exit(4);
		_exit(__atomic_load_n(&releases, __ATOMIC_SEQ_CST) == 2 ? 0 : 5);
	}
	if ((ret = reap_case_child(pid)))
		return ret;
	return __atomic_load_n(&releases, __ATOMIC_SEQ_CST) == 1 ? 0 : 6;
}

/* Runs @fn in a child under a deadline: its exit status, or 128 + signal. */
static int run_case(int (*fn)(void))
{
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		child_deadline(CASE_DEADLINE_S);
		_exit(fn());
	}
	return wait_child(pid);
}

/*
 * percpuref_fork_generation(): one more in a child, two more in its
 * child, unchanged in the parent.  Exit status 6: a wrong count.
 */
static int case_fork_generation(void)
{
	unsigned long parent = percpuref_fork_generation();
	pid_t pid = fork();

	if (pid == 0) {
		pid_t grandchild;

		if (percpuref_fork_generation() != parent + 1)
			_exit(6);
		grandchild = fork();
		if (grandchild == 0)
			_exit(percpuref_fork_generation() == parent + 2 ? 0 : 6);
		_exit(wait_child(grandchild));
	}
	if (pid < 0)
		return 3;
	if (wait_child(pid) != 0 || percpuref_fork_generation() != parent)
		return 6;
	return 0;
}

int main(void)
{
	const char *untestable = fork_children_untestable();

	if (untestable) {
		ok(1, "skipped under %s", untestable);
		return done_testing();
	}
	/* Exit status 2: set-up failed; 3: a fork failed; 4: a barrier or flush
	 * failed; 5: a kill not released; 6: a wrong fork generation; 7: a
	 * release the child ran for its parent saw the parent's generation;
	 * 128 + n: signal n (14: hang). */
	is(run_case(case_fork_generation), 0,
	   "percpuref_fork_generation() counts forks in the children, not in the parent");
	is(run_case(case_release_forks), 0, "a managed release forks");
	is(run_case(case_two_callbacks_fork), 0,
	   "a confirm callback and a managed release fork at once");
	is(run_case(case_user_fork_meets_callback_fork), 0,
	   "a user's fork waits for a batch whose confirm forks; kills and barriers work after");
	is(run_case(case_kill_release_waits_for_forker), 0,
	   "a kill's release waits for a lock the forking thread holds: the fork goes on, the "
	   "child runs the rest of the batch");
	is(run_case(case_managed_release_waits_for_forker), 0,
	   "the same with a managed release on the reclaimer");
	is(run_case(case_rcu_release_waits_for_forker), 0,
	   "the same with a percpu_rcuref release after its grace period");
	is(run_case(case_release_nested_in_confirm), 0,
	   "a release nested in a confirm keeps the batch lock: the child gets the switch whole");
	is(run_case(case_managed_reinit_after_fork), 0,
	   "a managed ref whose release the fork cut is reinitialised and released in the child");
	is(run_case(case_fork_after_release_done), 0,
	   "a fork after a managed release returned finds no cut node in the child");
	is(run_case(case_fork_after_reinit), 0,
	   "the same with the ref reinitialised before the fork: listed once in the child");
	return done_testing();
}
