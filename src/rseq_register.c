/* SPDX-License-Identifier: MIT */
/*
 * rseq_register.c - whose rseq area the fast path uses, and the library's
 * own per-thread registration where the C library registered none.
 *
 * Choice (once, at runtime set-up).  glibc >= 2.35 exports __rseq_size and
 * __rseq_offset; a non-zero size means glibc registered an area for every
 * thread (or tried to: a thread whose registration failed reads cpu_id < 0
 * and takes the fallback per call).  The symbols are weak references, so
 * that the build needs no glibc that has them and the run reads NULL
 * where there are none; they also bind in a static executable, where
 * dlsym (used until 0.3.1) finds no symbols, so that such programs took
 * the fallback although glibc had registered its areas.  Built against
 * glibc >= 2.35, the references carry its version, so the library then
 * needs 2.35 to load (its pthread calls need 2.34 in any case).  Where
 * the size is missing or zero (glibc < 2.35, musl, the tunable
 * glibc.pthread.rseq=0, a kernel that refused glibc) the library registers
 * its own area: own_area, an initial-exec TLS variable, so its offset from
 * the thread pointer is the same in every thread, as glibc's is.  The
 * initialising thread registers at once, which is the probe: ENOSYS (no
 * rseq, valgrind, qemu-user), EPERM (seccomp) or EINVAL (another area is
 * registered for this thread: librseq, tcmalloc, LTTng, or libc after
 * all; warned, since the program then loses the fast path without
 * otherwise knowing why) means no rseq fast path for the process.  The
 * kernel never lets a thread have two areas, so a wrong guess here fails
 * the probe; it cannot double-register.  The other way round, once a
 * thread's area is ours, a later registration of another on that thread
 * fails with EINVAL (docs/percpu_ref.md, "rseq-own").
 *
 * Own areas, per thread.  own_area.cpu_id starts at -1 (the TLS image), so
 * a thread's first fast-path call fails the inline check and comes to
 * percpuref_rseq_register_self() through the slow path, which registers and
 * arranges for the area to be unregistered when the thread exits (return,
 * pthread_exit, cancellation; thread_exit.c), before its TLS can be reused.  After that the thread is retired: it
 * never registers again, and any later call on it (another key destructor)
 * takes the atomic count.  A fork child's thread keeps its registration:
 * the kernel copies it to the child along with the memory, TLS and hook.
 * Asynchronous signals are blocked during a registration (own_register());
 * a synchronous signal's handler that interrupts one finds the thread
 * REGISTERING and takes the fallback for that call.
 *
 * Ordering.  Nothing here orders memory for another thread.  own_in_use
 * and the offset chosen are written at set-up, under the runtime's
 * pthread_once(), and reach other threads with the first counter (as
 * runtime.c publishes the offset); percpuref_fast_path() reads the offset
 * relaxed after that once.  The rest is the thread's own: own_state and
 * own_area in TLS, and cpu_id (glibc's area or ours), written by the
 * kernel on this thread's behalf (a relaxed load, for single-copy
 * atomicity).  own_threads is a statistic for the tests: relaxed adds
 * and loads, and a plain store in a fork child, which has one thread.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"
#include "percpuref/percpu_ref.h"

#if PERCPUREF_HAVE_RSEQ

#ifndef __NR_rseq
#if defined(__x86_64__)
#define __NR_rseq 334
#elif defined(__aarch64__)
#define __NR_rseq 293
#endif
#endif
#define RSEQ_FLAG_UNREGISTER 1
#define RSEQ_CPU_ID_UNINITIALIZED ((uint32_t)-1)

enum own_state {
	OWN_UNREGISTERED,	/* never registered (the TLS image's value) */
	OWN_REGISTERING,	/* syscall in progress */
	OWN_REGISTERED,
	OWN_RETIRED,		/* unregistered at thread exit, or failed */
};

static __thread struct percpuref_rseq_area own_area
	__attribute__((tls_model("initial-exec"))) = { .cpu_id = RSEQ_CPU_ID_UNINITIALIZED };
static __thread enum own_state own_state __attribute__((tls_model("initial-exec")));
/* Set once at set-up, before any thread can reach the slow path here. */
static bool own_in_use;
/* Threads with an own area registered now (tests); relaxed, a statistic. */
static unsigned int own_threads;

static int sys_rseq(struct percpuref_rseq_area *area, int flags)
{
	return (int)syscall(__NR_rseq, area, (unsigned int)sizeof(*area), flags,
			    PERCPUREF_RSEQ_SIG);
}

static void own_unregister(void *unused)
{
	(void)unused;
	own_state = OWN_RETIRED;
	/* Fails only for an area the kernel does not know: nothing to undo.
	 * Relaxed: a statistic for the tests; nothing is read through it. */
	if (sys_rseq(&own_area, RSEQ_FLAG_UNREGISTER) == 0)
		__atomic_fetch_sub(&own_threads, 1, __ATOMIC_RELAXED);
}

/*
 * Registers this thread's own area; true when it is registered now.
 * Asynchronous signals wait until it is done: the exit hook's first
 * calloc() holds the allocator's lock, which a handler's fork takes (it
 * hung; a get or put that a forking handler interrupts is allowed).  Two
 * system calls, once per thread: the state is read again once they are
 * blocked, a handler having perhaps registered the thread just before (the
 * second registration then failed, EBUSY, and retired the thread's area).
 * On a failure of the system call, its errno value is in *@err unless
 * @err is NULL.
 */
static bool own_register(int *err)
{
	sigset_t async, old;
	bool registered = false;

	percpuref_sigfill_async(&async);
	pthread_sigmask(SIG_BLOCK, &async, &old);
	if (own_state != OWN_UNREGISTERED) {
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		return own_state == OWN_REGISTERED;
	}
	own_state = OWN_REGISTERING;
	if (sys_rseq(&own_area, 0) != 0) {
		if (err)
			*err = errno;
		own_state = OWN_RETIRED;
	} else {
		/* Relaxed: a statistic, as in own_unregister(). */
		__atomic_fetch_add(&own_threads, 1, __ATOMIC_RELAXED);
		registered = percpuref_at_thread_exit(own_unregister, NULL);
		if (registered)
			own_state = OWN_REGISTERED;
		else
			own_unregister(NULL);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return registered;
}

/* glibc >= 2.35 (<sys/rseq.h>, declared here for older headers). */
extern const unsigned int __rseq_size __attribute__((weak, visibility("default")));
extern const ptrdiff_t __rseq_offset __attribute__((weak, visibility("default")));

/* glibc's __rseq_offset when glibc registered areas, else NULL. */
static const ptrdiff_t *glibc_rseq_offset(void)
{
	if (!&__rseq_size || !&__rseq_offset || __rseq_size == 0)
		return NULL;
	return &__rseq_offset;
}

ptrdiff_t percpuref_rseq_own_area_offset(void)
{
	return (char *)&own_area - (char *)percpuref_thread_pointer();
}

ptrdiff_t percpuref_rseq_choose(void)
{
	const ptrdiff_t *glibc_offset = glibc_rseq_offset();
	struct percpuref_rseq_area *rs;
	int err = 0;

	if (glibc_offset) {
		rs = (struct percpuref_rseq_area *)((char *)percpuref_thread_pointer() +
						    *glibc_offset);
		/* Relaxed: the kernel writes it on this thread's behalf. */
		if ((int32_t)__atomic_load_n(&rs->cpu_id, __ATOMIC_RELAXED) < 0)
			return 0;
		return *glibc_offset;
	}
	if (!own_register(&err)) {
		if (err == EINVAL)
			percpuref_warn(NULL, "this thread has an rseq area of another's "
				       "(librseq, tcmalloc?); per-CPU fast path: the fallback");
		return 0;
	}
	own_in_use = true;
	return percpuref_rseq_own_area_offset();
}

void percpuref_rseq_abandon(void)
{
	if (!own_in_use)
		return;
	own_in_use = false;
	/* The exit hook then finds the area unregistered: harmless. */
	own_unregister(NULL);
}

bool percpuref_rseq_register_self(void)
{
	if (!own_in_use || own_state != OWN_UNREGISTERED)
		return false;
	return own_register(NULL);
}

bool percpuref_rseq_own(void)
{
	return own_in_use;
}

void percpuref_rseq_after_fork_child(void)
{
	own_threads = own_state == OWN_REGISTERED;
}

PERCPUREF_API unsigned int percpuref_rseq_own_threads(void)
{
	/* Relaxed: a statistic for the tests; nothing is read through it. */
	return __atomic_load_n(&own_threads, __ATOMIC_RELAXED);
}

#else /* !PERCPUREF_HAVE_RSEQ */

ptrdiff_t percpuref_rseq_own_area_offset(void)
{
	return 0;
}

ptrdiff_t percpuref_rseq_choose(void)
{
	return 0;
}

void percpuref_rseq_abandon(void)
{
}

bool percpuref_rseq_register_self(void)
{
	return false;
}

bool percpuref_rseq_own(void)
{
	return false;
}

void percpuref_rseq_after_fork_child(void)
{
}

PERCPUREF_API unsigned int percpuref_rseq_own_threads(void)
{
	return 0;
}

#endif

PERCPUREF_API const char *percpuref_fast_path(void)
{
	percpuref_runtime_init();
	/* Relaxed: the set-up's store is ordered before us by that call's
	 * pthread_once(); it changes later only to 0 (runtime.c: a
	 * switch-off, a fork child without membarrier), which only changes
	 * the word we report. */
	if (__atomic_load_n(&percpuref_rseq_offset, __ATOMIC_RELAXED) == 0)
		return "fallback";
	return percpuref_rseq_own() ? "rseq-own" : "rseq-glibc";
}
