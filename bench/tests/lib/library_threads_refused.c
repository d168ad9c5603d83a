// SPDX-License-Identifier: MIT
/*
 * library_threads_refused.c - an LD_PRELOAD shim for cli.sh: the library's
 * own threads (percpuref-cb, percpuref-recl) cannot start, as in a sandbox
 * that lets a program start its threads and then refuses new ones, while
 * the bench's threads start.  The library creates its threads with every
 * asynchronous signal blocked (src/runtime.c, "Signal masks") and the
 * bench never does (it blocks SIGCONT at most), so a pthread_create() from
 * a thread that blocks every one of a handful of asynchronous signals is
 * refused as one without memory for its stack (EAGAIN).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>

typedef int create_fn(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

int pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*start)(void *),
		   void *arg)
{
	static const int async[] = { SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGALRM };
	static create_fn *real_create;
	unsigned int blocked = 0;
	sigset_t mask;

	if (!pthread_sigmask(SIG_BLOCK, NULL, &mask))
		for (unsigned int i = 0; i < sizeof(async) / sizeof(async[0]); i++)
			blocked += sigismember(&mask, async[i]) == 1;
	if (blocked == sizeof(async) / sizeof(async[0]))
		return EAGAIN;
	/* Relaxed: every thread finds the same address. */
	if (!__atomic_load_n(&real_create, __ATOMIC_RELAXED))
		__atomic_store_n(&real_create, (create_fn *)dlsym(RTLD_NEXT, "pthread_create"),
				 __ATOMIC_RELAXED);
	if (!real_create)
		return ENOSYS;
	return real_create(thread, attr, start, arg);
}
