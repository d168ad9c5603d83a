/* SPDX-License-Identifier: MIT */
/*
 * test_exit_mode.c - what a process's exit does after it ran the library's
 * exit handler (0.4.32).  That handler is registered with atexit() at the
 * library's first use, so exit() runs it before the atexit() handlers and
 * the static destructors registered earlier (C++ globals that exist
 * before any library call: every constant-initialised one).  What those
 * kill or let go of used to be finished later, on the library's threads or
 * in its ELF destructor, after they had destroyed what a @release may use
 * (review 171: a C++ static owner's ~T wrote into a destroyed global).
 * Now a kill waits for its switch and @release, a percpu_rcuref release
 * for its grace period, and a managed ref still held when the handler
 * runs is no longer managed (killed, the manager's reference its initial
 * one), so its last holder's put releases it, on that holder's thread.
 *
 * Each scenario is a child process: its main() registers a handler of its
 * own first, then makes the library's first call; that handler, run after
 * the library's, does the scenario's kill or put and checks at once
 * (exit status 10 + the check's number when one fails).  A shutdown
 * called by the program, not exit, still leaves held managed refs managed.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "child.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_rcuref.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

static struct percpu_ref ref;
static struct percpu_rcuref rcuref;
static int released, unpublished;	/* atomic */
static pthread_t released_on;

static void count_release(struct percpu_ref *r)
{
	(void)r;
	released_on = pthread_self();
	__atomic_fetch_add(&released, 1, __ATOMIC_SEQ_CST);
}

static void count_rcu_release(struct percpu_rcuref *r)
{
	(void)r;
	__atomic_fetch_add(&released, 1, __ATOMIC_SEQ_CST);
}

static void count_unpublish(struct percpu_rcuref *r)
{
	(void)r;
	__atomic_fetch_add(&unpublished, 1, __ATOMIC_SEQ_CST);
}

static int nr_released(void)
{
	return __atomic_load_n(&released, __ATOMIC_SEQ_CST);
}

/* In a handler: the scenario failed its check @n. */
static void check(bool cond, int n)
{
	if (!cond)
		_exit(10 + n);
}

static void late_kill(void)
{
	check(nr_released() == 0, 0);
	percpu_ref_kill(&ref);
	check(nr_released() == 1, 1);
}

static void late_kill_rcu(void)
{
	percpu_rcuref_kill(&rcuref);
	check(__atomic_load_n(&unpublished, __ATOMIC_SEQ_CST) == 1, 1);
	check(nr_released() == 1, 2);
}

static void late_managed_put(void)
{
	/* Held by us alone now, no longer managed: a kill's state. */
	check(nr_released() == 0, 0);
	check(percpu_ref_is_dying(&ref), 1);
	check(!percpu_ref_tryget_live(&ref), 2);
	/* A second holder for a while: a put is not the last one. */
	check(percpu_ref_tryget(&ref), 3);
	percpu_ref_put(&ref);
	check(nr_released() == 0, 4);
	percpu_ref_put(&ref);
	check(nr_released() == 1, 5);
	check(pthread_equal(released_on, pthread_self()), 6);
}

static void late_managed_put_rcu(void)
{
	check(nr_released() == 0, 0);
	percpu_rcuref_put(&rcuref);
	check(__atomic_load_n(&unpublished, __ATOMIC_SEQ_CST) == 1, 1);
	check(nr_released() == 1, 2);
}

/* A managed ref nobody held at the exit: the library's handler released it. */
static void late_idle_managed(void)
{
	check(nr_released() == 1, 1);
}

static int scenario(const char *mode)
{
	void (*late)(void);

	if (!strcmp(mode, "--kill"))
		late = late_kill;
	else if (!strcmp(mode, "--kill-rcu"))
		late = late_kill_rcu;
	else if (!strcmp(mode, "--managed-put"))
		late = late_managed_put;
	else if (!strcmp(mode, "--managed-put-rcu"))
		late = late_managed_put_rcu;
	else if (!strcmp(mode, "--idle-managed"))
		late = late_idle_managed;
	else
		return 2;
	/* Before the library's first use: runs after its exit handler. */
	if (atexit(late))
		return 3;
	if (late == late_kill_rcu || late == late_managed_put_rcu) {
		if (percpu_rcuref_init(&rcuref, count_unpublish, count_rcu_release,
				       late == late_managed_put_rcu ? PERCPU_REF_REL_MANAGED : 0))
			return 4;
	} else if (percpu_ref_init(&ref, count_release,
				   late == late_kill ? 0 : PERCPU_REF_REL_MANAGED)) {
		return 4;
	}
	if (late == late_idle_managed)
		percpu_ref_put(&ref);	/* the manager's alone */
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1)
		return scenario(argv[1]);

	is(run_mode("--kill"), 0, "after the exit handler: a kill returns with its @release run");
	is(run_mode("--kill-rcu"), 0,
	   "after the exit handler: a percpu_rcuref kill returns with @unpublish and @release run");
	is(run_mode("--managed-put"), 0,
	   "after the exit handler: a held managed ref is killed; its last put releases it, "
	   "on the putter's thread");
	is(run_mode("--managed-put-rcu"), 0,
	   "after the exit handler: likewise a managed percpu_rcuref, its grace period waited for");
	is(run_mode("--idle-managed"), 0,
	   "the exit handler released the managed ref nobody held, as before");

	/* Not at exit: a shutdown leaves a held managed ref managed. */
	percpu_ref_init(&ref, count_release, PERCPU_REF_REL_MANAGED);
	percpuref_shutdown();
	ok(!percpu_ref_is_dying(&ref) && percpu_ref_tryget_live(&ref),
	   "a shutdown, not exit: the held managed ref is still managed and live");
	percpu_ref_put(&ref);	/* the tryget's */
	percpu_ref_put(&ref);	/* the creator's */
	is(nr_released(), 0, "a shutdown, not exit: the last put leaves it to the reclaimer");
	percpu_ref_managed_flush();
	is(nr_released(), 1, "a shutdown, not exit: the next pass released it");
	percpu_ref_exit(&ref);
	return done_testing();
}
