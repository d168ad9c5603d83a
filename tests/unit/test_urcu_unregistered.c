/* SPDX-License-Identifier: MIT */
/*
 * test_urcu_unregistered.c - before it waits (a managed flush, a
 * percpu_rcuref barrier, a fork, the process's exit) the library asks
 * liburcu-bp whether the caller is inside a read-side section.
 * urcu_bp_read_ongoing() registers a thread it does not know yet, which
 * allocates and blocks signals, and liburcu-bp aborts the process where
 * either fails: up to 0.4.30 a flush, a barrier, a fork or the exit of a
 * thread that never read under RCU ended in SIGABRT where memory ran out
 * (a review's probe, with malloc failing).  A thread that never
 * registered is in no section, and the library no longer asks for it.
 *
 * The test defines urcu_bp_register(): liburcu-bp's own calls of it go
 * through its PLT, so this one stands in (the executable exports it,
 * ENABLE_EXPORTS); it counts and calls liburcu-bp's.  A thread's first
 * urcu_bp_read_ongoing() must register through it (the control), or
 * the test could not tell.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "child.h"
#include "internal.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_rcuref.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

static int registrations;	/* atomic */
/* Set where a registration must end the process with status 3. */
static bool register_exits;

void urcu_bp_register(void)
{
	static void (*real)(void);

	__atomic_fetch_add(&registrations, 1, __ATOMIC_RELAXED);
	if (register_exits)
		_exit(3);
	if (!real)
		real = (void (*)(void))dlsym(RTLD_NEXT, "urcu_bp_register");
	if (!real)
		abort();
	real();
}

static int registered(void)
{
	return __atomic_load_n(&registrations, __ATOMIC_RELAXED);
}

/* Runs @fn on a thread of its own, which never read under RCU; returns how
 * many registrations it made. */
static int registrations_by(void *(*fn)(void *), void *arg)
{
	int before = registered();
	pthread_t t;

	if (pthread_create(&t, NULL, fn, arg) || pthread_join(t, NULL))
		abort();
	return registered() - before;
}

static void *asks_itself(void *unused)
{
	(void)unused;
	(void)urcu_bp_read_ongoing();
	return NULL;
}

static void *flushes(void *ret)
{
	*(int *)ret = percpu_ref_managed_flush();
	return NULL;
}

static void *rcuref_barrier(void *ret)
{
	*(int *)ret = percpu_rcuref_barrier();
	return NULL;
}

/* The fork's prepare handler asks on the forking thread. */
static void *forks(void *status)
{
	pid_t pid = fork();

	if (pid == 0)
		_exit(0);
	*(int *)status = wait_child(pid);
	return NULL;
}

/* The "exit" mode: the process's exit asks on the thread that calls
 * exit(), here the main thread, which never registered (the library's
 * atexit hook, set at its first use, and its destructor). */
static int exit_unregistered(void)
{
	struct percpu_ref ref;

	if (percpu_ref_init(&ref, NULL, 0))
		return 2;
	percpu_ref_kill(&ref);
	percpu_ref_exit(&ref);
	register_exits = true;
	exit(0);
}

int main(int argc, char **argv)
{
	int ret = -1, status = -1, made;
	const char *untestable;

	if (argc > 1 && !strcmp(argv[1], "exit"))
		return exit_unregistered();

	is(registrations_by(asks_itself, NULL), 1,
	   "control: a new thread's own urcu_bp_read_ongoing() registers it, through this "
	   "test's urcu_bp_register()");

	made = registrations_by(flushes, &ret);
	ok(made == 0 && ret == 0, "percpu_ref_managed_flush() on a thread that never read "
	   "under RCU: 0 (%d), and registered nothing (%d)", ret, made);
	made = registrations_by(rcuref_barrier, &ret);
	ok(made == 0 && ret == 0, "percpu_rcuref_barrier() there: 0 (%d), and registered "
	   "nothing (%d)", ret, made);

	untestable = fork_children_untestable();
	if (untestable) {
		skip("fork: %s", untestable);
	} else {
		made = registrations_by(forks, &status);
		ok(made == 0 && status == 0, "fork() there: its prepare handler registered "
		   "nothing (%d; child %d)", made, status);
	}
	is(run_mode("exit"), 0, "exit() on a thread that never read under RCU registered "
	   "nothing (3: it did)");
	return done_testing();
}
