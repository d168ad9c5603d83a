/* SPDX-License-Identifier: MIT */
/*
 * fork_gate.h - keeps a test's fork() apart from what, in another thread,
 * would leave the fork child stuck for reasons that are not the library's.
 *
 * Under AddressSanitizer: threads that allocate or free (a ref's init and
 * exit, a @release that frees) against a thread that forks (stress_fork.c,
 * stress_poll.c).  GCC 12's libasan holds allocator locks that no fork
 * hook takes: a fork that lands while another thread holds one leaves the
 * child's first allocation waiting for ever, which is why
 * docs/percpu_ref.md asks users not to fork while their threads are in
 * malloc().  allocating_begin() and allocating_end() bracket those calls.
 *
 * Under an emulator (a cross build's tests under qemu-user, which set
 * PERCPUREF_TEST_EMULATOR): calls that end threads, percpuref_shutdown()
 * (stress_model.c, stress_fork.c), bracketed by thread_ending_begin() and
 * thread_ending_end().  qemu-user 7.2 (Debian 12's) holds a lock of its
 * own, clone_lock, while a thread starts and while one exits, and its
 * fork does not take it: a fork that lands while another thread exits
 * gives a child whose first pthread_create() waits for that lock for
 * ever, inside the emulator, with every host signal blocked, so that not
 * even the child's own alarm() ends it.  CI's stress_model hung so (its
 * child's library start-up, after a worker's fork met another worker's
 * percpuref_shutdown()); the child's only thread was found waiting on a
 * mutex in qemu's data, called from its clone emulation.  A join is no
 * proof that the lock is free: qemu wakes the joiner before its exiting
 * thread lets go of it.  So under the emulator thread_ending_end() starts
 * a thread that waits for ever, and waits until it runs
 * (fork_gate_settle()): that start takes the lock, after the exits the
 * call joined let go of it, and no thread of the test ends near the
 * fork.  On Linux itself no lock outlives a fork this way, and the native
 * tests race forks against shutdowns as before.
 * The library's own thread starts need no gate: its fork hooks wait until
 * a thread it started runs its code, which under qemu comes after the
 * emulator let go of the lock.  Threads a test starts or ends itself are
 * that test's to keep from its forks (stress_rcuref_switch.c,
 * stress_exit_teardown.c).
 *
 * Either way, a call is active, or forks are coming (new calls wait, each
 * forker waits for the active ones; the forkers are counted, as several
 * threads may fork at once).  Atomics and yields, no futex: the fork child
 * inherits the gate closed, and its own reclaimer may wait on it before
 * the main thread opens it there (fork_end_child()); a pthread rwlock kept
 * the marks of the parent's waiters, and a thread waiting on one before
 * the child reinitialised it waited for ever.  Sequentially consistent:
 * each side's store, then its load of the other side's (a Dekker pair).
 * A thread inside one bracket enters no other (it would wait for a forker
 * that waits for it).  Where neither applies each call does nothing.
 */
#ifndef PERCPUREF_TESTS_FORK_GATE_H
#define PERCPUREF_TESTS_FORK_GATE_H

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <unistd.h>

#include "child.h"

#if defined(__SANITIZE_ADDRESS__)
#define FORK_GATE_ALLOCATIONS 1
#else
#define FORK_GATE_ALLOCATIONS 0
#endif

static unsigned int gate_forking, gate_active;

/* Whether the gate keeps forks from thread ends: under an emulator, or
 * under ASan (where it closes against allocations, and a thread's end
 * frees). */
static inline bool fork_gate_thread_ends(void)
{
	return FORK_GATE_ALLOCATIONS || UNDER_EMULATOR;
}

static inline void fork_gate_enter(void)
{
	for (;;) {
		if (!__atomic_load_n(&gate_forking, __ATOMIC_SEQ_CST)) {
			__atomic_fetch_add(&gate_active, 1, __ATOMIC_SEQ_CST);
			if (!__atomic_load_n(&gate_forking, __ATOMIC_SEQ_CST))
				return;
			__atomic_fetch_sub(&gate_active, 1, __ATOMIC_SEQ_CST);
		}
		sched_yield();
	}
}

static inline void fork_gate_leave(void)
{
	__atomic_fetch_sub(&gate_active, 1, __ATOMIC_SEQ_CST);
}

static inline void allocating_begin(void)
{
	if (FORK_GATE_ALLOCATIONS)
		fork_gate_enter();
}

static inline void allocating_end(void)
{
	if (FORK_GATE_ALLOCATIONS)
		fork_gate_leave();
}

static inline void thread_ending_begin(void)
{
	if (fork_gate_thread_ends())
		fork_gate_enter();
}

/* Set by each parked thread once it runs the test's code. */
static unsigned int fork_gate_parked_running;

static inline void *fork_gate_parked(void *unused)
{
	(void)unused;
	/* Seq_cst: read by fork_gate_settle() (a count, nothing else). */
	__atomic_fetch_add(&fork_gate_parked_running, 1, __ATOMIC_SEQ_CST);
	for (;;)
		pause();
	return NULL;	/* not reached; GCC 12 asks for it */
}

/* Under the emulator: returns once every thread that ended before the
 * call has let go of qemu's clone lock.  A thread start takes that lock
 * in the creating thread, then once more in the new thread before it runs
 * any of the test's code: so the wait is for the new thread to run.  The
 * started thread never ends, lest its own end hold the lock. */
static inline void fork_gate_settle(void)
{
	unsigned int running = __atomic_load_n(&fork_gate_parked_running, __ATOMIC_SEQ_CST);
	pthread_t parked;

	if (pthread_create(&parked, NULL, fork_gate_parked, NULL) == 0) {
		pthread_detach(parked);
		while (__atomic_load_n(&fork_gate_parked_running, __ATOMIC_SEQ_CST) == running)
			sched_yield();
	} else {
		usleep(20 * 1000);	/* no thread to spare: a margin, no proof */
	}
}

static inline void thread_ending_end(void)
{
	if (!fork_gate_thread_ends())
		return;
	if (UNDER_EMULATOR)
		fork_gate_settle();
	fork_gate_leave();
}

static inline void fork_begin(void)
{
	if (!fork_gate_thread_ends())
		return;
	__atomic_fetch_add(&gate_forking, 1, __ATOMIC_SEQ_CST);
	while (__atomic_load_n(&gate_active, __ATOMIC_SEQ_CST))
		sched_yield();
}

/* The parent's, after its fork(). */
static inline void fork_end(void)
{
	if (fork_gate_thread_ends())
		__atomic_fetch_sub(&gate_forking, 1, __ATOMIC_SEQ_CST);
}

/* The child's: it has no other forker, whatever the parent counted. */
static inline void fork_end_child(void)
{
	if (fork_gate_thread_ends())
		__atomic_store_n(&gate_forking, 0, __ATOMIC_SEQ_CST);
}

#endif
