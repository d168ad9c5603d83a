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
 * (stress_model.c), bracketed by thread_ending_begin() and
 * thread_ending_end().  qemu-user 7.2 (Debian 12's) holds a lock of its
 * own, clone_lock, while a thread starts and while one exits, and its
 * fork does not take it: a fork that lands while another thread exits
 * gives a child whose first pthread_create() waits for that lock for
 * ever, inside the emulator, with every host signal blocked, so that not
 * even the child's own alarm() ends it.  CI's stress_model hung so (its
 * child's library start-up, after a worker's fork met another worker's
 * percpuref_shutdown()); the child's only thread was found waiting on a
 * mutex in qemu's data, called from its clone emulation.  On Linux itself
 * no lock outlives the fork this way, so the native tests race forks
 * against shutdowns as before.  Thread starts need no gate: the library's
 * fork hooks wait until a thread it started runs its code, which under
 * qemu comes after the emulator let go of the lock.
 *
 * Either way, a call is active, or a fork is coming (new calls wait, the
 * forker waits for the active ones).  Atomics and yields, no futex: the
 * fork child inherits the gate closed, and its own reclaimer may wait on
 * it before the main thread opens it there; a pthread rwlock kept the
 * marks of the parent's waiters, and a thread waiting on one before the
 * child reinitialised it waited for ever.  Sequentially consistent: each
 * side's store, then its load of the other side's (a Dekker pair).  A
 * thread inside one bracket enters no other (it would wait for a forker
 * that waits for it).  Where neither applies each call does nothing.
 */
#ifndef PERCPUREF_TESTS_FORK_GATE_H
#define PERCPUREF_TESTS_FORK_GATE_H

#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>

#if defined(__SANITIZE_ADDRESS__)
#define FORK_GATE_ALLOCATIONS 1
#else
#define FORK_GATE_ALLOCATIONS 0
#endif

static unsigned int gate_forking, gate_active;

/* Whether the gate keeps forks from thread ends: under an emulator, or
 * under ASan (where it closes against allocations, and a thread's end
 * frees).  Relaxed: every thread computes the same answer. */
static inline bool fork_gate_thread_ends(void)
{
	static int cached = -1;
	int on = __atomic_load_n(&cached, __ATOMIC_RELAXED);

	if (on < 0) {
		const char *emulator = getenv("PERCPUREF_TEST_EMULATOR");

		on = FORK_GATE_ALLOCATIONS || (emulator && *emulator);
		__atomic_store_n(&cached, on, __ATOMIC_RELAXED);
	}
	return on;
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

static inline void thread_ending_end(void)
{
	if (fork_gate_thread_ends())
		fork_gate_leave();
}

static inline void fork_begin(void)
{
	if (!fork_gate_thread_ends())
		return;
	__atomic_store_n(&gate_forking, 1, __ATOMIC_SEQ_CST);
	while (__atomic_load_n(&gate_active, __ATOMIC_SEQ_CST))
		sched_yield();
}

static inline void fork_end(void)
{
	if (fork_gate_thread_ends())
		__atomic_store_n(&gate_forking, 0, __ATOMIC_SEQ_CST);
}

#endif
