/* SPDX-License-Identifier: MIT */
/*
 * test_register_signal.c - a signal that arrives while a thread's first get
 * or put registers the thread (its own rseq area, or its fallback unit) is
 * held until the registration is done, so that its handler may fork, as a
 * handler that interrupts a get or put may (docs/percpu_ref.md, "Signal
 * handlers"):
 *  - held: the handler runs after the registration, not inside it;
 *  - fork: the handler forks, and the fork and the first get and put end;
 *  - window: the signal lands just before the registration blocks the
 *    signals, and its handler's get and put register the thread first:
 *    the interrupted registration must see that, not register again (the
 *    fallback took a second unit for the thread and gave one back at its
 *    exit, found by review of the first version of the mask).  Such a
 *    handler breaks the rule that a thread make one get and put before it
 *    unblocks signals whose handlers use refs (docs/percpu_ref.md); the
 *    library still counts it exactly.
 *    Up to 0.4.7 the fork waited for the fallback readers' lock, held by
 *    the registration it interrupted, on the same thread: both hung (found
 *    by review; on the library's own rseq areas the fork waited for the
 *    allocator's lock, held by the calloc() the registration's
 *    __cxa_thread_atexit_impl makes).
 * The moment: this file defines __cxa_thread_atexit_impl, to which the
 * library's weak reference binds; the registration calls it, and it raises
 * the signal on the registering thread before it calls glibc's.  For the
 * window, it defines pthread_sigmask too, which raises the signal before
 * the registration's block.  On
 * glibc's rseq areas a thread's first call registers nothing, and on musl
 * there is no such function: both cases skip there.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <percpuref/percpu_ref.h>

#include "child.h"
#include "internal.h"
#include "tap.h"

static __thread int raise_here;			/* armed by the thread below */
static volatile sig_atomic_t in_registration;	/* the hook's call in progress */
static volatile sig_atomic_t handled, handled_inside, fork_failed;
static int hook_calls;				/* atomic */
static int (*glibc_thread_atexit)(void (*)(void *), void *, void *);
static __thread int raise_before_block;		/* the window's arming */
static int (*glibc_sigmask)(int, const sigset_t *, sigset_t *);
static unsigned int readers_then;		/* registered, in the thread */

int pthread_sigmask(int how, const sigset_t *set, sigset_t *old)
{
	if (!glibc_sigmask)	/* a call before main()'s look-up */
		glibc_sigmask = (int (*)(int, const sigset_t *, sigset_t *))
			dlsym(RTLD_NEXT, "pthread_sigmask");
	if (raise_before_block && how == SIG_BLOCK) {
		raise_before_block = 0;
		raise(SIGUSR1);
	}
	return glibc_sigmask(how, set, old);
}

int __cxa_thread_atexit_impl(void (*fn)(void *), void *arg, void *dso);
int __cxa_thread_atexit_impl(void (*fn)(void *), void *arg, void *dso)
{
	int ret;

	if (!glibc_thread_atexit)
		return -1;
	__atomic_fetch_add(&hook_calls, 1, __ATOMIC_RELAXED);
	in_registration = 1;
	if (raise_here) {
		raise_here = 0;
		raise(SIGUSR1);
	}
	ret = glibc_thread_atexit(fn, arg, dso);
	in_registration = 0;
	return ret;
}

static void on_signal(int sig)
{
	(void)sig;
	handled_inside = in_registration;
	handled = 1;
}

static void on_signal_fork(int sig)
{
	int saved_errno = errno;
	pid_t pid;

	on_signal(sig);
	pid = fork();
	if (pid == 0)
		_exit(0);	/* a child forked here may only exec or _exit */
	if (pid < 0 || wait_child(pid) != 0)
		fork_failed = 1;
	errno = saved_errno;
}

static void release_nothing(struct percpu_ref *ref)
{
	(void)ref;
}

static struct percpu_ref ref;

static void on_signal_get_put(int sig)
{
	on_signal(sig);
	percpu_ref_get(&ref);
	percpu_ref_put(&ref);
}

/* The window's thread: the signal comes before the registration's block. */
static void *first_get_put_window(void *unused)
{
	(void)unused;
	raise_before_block = 1;
	percpu_ref_get(&ref);
	percpu_ref_put(&ref);
	readers_then = percpuref_readers_registered();
	return NULL;
}

/* A thread whose first library call is a get: it registers there. */
static void *first_get_put(void *unused)
{
	(void)unused;
	raise_here = 1;
	percpu_ref_get(&ref);
	percpu_ref_put(&ref);
	return NULL;
}

/* Runs first_get_put() on a new thread with @handler on SIGUSR1.
 * Exit status 2: init failed; 3: no thread; 4: the registration called no
 * hook; 5: no handler ran; 6: it ran inside the registration; 7: its fork
 * failed. */
static int run_case(void (*handler)(int), void *(*thread)(void *))
{
	struct sigaction sa = { .sa_handler = handler, .sa_flags = SA_RESTART };
	pthread_t t;

	child_deadline(30);
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	if (percpu_ref_init(&ref, release_nothing, 0))
		return 2;
	if (pthread_create(&t, NULL, thread, NULL))
		return 3;
	pthread_join(t, NULL);
	percpu_ref_kill(&ref);
	percpu_ref_barrier();
	percpu_ref_exit(&ref);
	if (!__atomic_load_n(&hook_calls, __ATOMIC_RELAXED))
		return 4;
	return !handled ? 5 : handled_inside ? 6 : fork_failed ? 7 : 0;
}

int main(int argc, char **argv)
{
	glibc_thread_atexit = (int (*)(void (*)(void *), void *, void *))
		dlsym(RTLD_NEXT, "__cxa_thread_atexit_impl");
	if (argc > 1 && !strcmp(argv[1], "held"))
		return run_case(on_signal, first_get_put);
	if (argc > 1 && !strcmp(argv[1], "fork"))
		return run_case(on_signal_fork, first_get_put);
	if (argc > 1 && !strcmp(argv[1], "window")) {
		unsigned int before = percpuref_readers_registered();
		int status = run_case(on_signal_get_put, first_get_put_window);

		/* Exit status 8: the thread held more than one unit. */
		return status ? status : readers_then == before + 1 ? 0 : 8;
	}
	if (!strcmp(percpuref_fast_path(), "rseq-glibc")) {
		skip("a signal in a thread's registration: none on rseq-glibc");
		skip("a fork from it: none on rseq-glibc");
	} else if (UNDER_VALGRIND) {
		/* No --trace-children: the case's child runs natively. */
		skip("a signal in a thread's registration: the child runs outside valgrind");
		skip("a fork from it: the child runs outside valgrind");
	} else if (!glibc_thread_atexit) {
		skip("a signal in a thread's registration: no __cxa_thread_atexit_impl to hook");
		skip("a fork from it: no __cxa_thread_atexit_impl to hook");
	} else {
		is(run_mode("held"), 0, "a signal in a thread's registration is handled after it");
		/* Its fork from a handler fails a CHECK of ThreadSanitizer's
		 * own (with threads running: its deadlock detector). */
		if (UNDER_TSAN)
			skip("a fork from it: ThreadSanitizer cannot fork in a handler");
		else
			is(run_mode("fork"), 0,
			   "its handler forks: the fork and the first get and put end");
	}
	/* Units are the fallback's: the window's count is theirs. */
	if (strcmp(percpuref_fast_path(), "fallback"))
		skip("a signal just before the registration's block: no units on %s",
		     percpuref_fast_path());
	else if (UNDER_TSAN)
		/* The handler's get registers the thread, a calloc() in a
		 * handler (percpu_ref.md asks for a get and put before such
		 * signals are unblocked), which ThreadSanitizer reports. */
		skip("a signal just before the registration's block: the handler allocates");
	else if (UNDER_VALGRIND || !glibc_thread_atexit)
		skip("a signal just before the registration's block: %s",
		     UNDER_VALGRIND ? "the child runs outside valgrind" : "no hook");
	else
		is(run_mode("window"), 0,
		   "a handler that registered the thread first: one unit for the thread");
	return done_testing();
}
