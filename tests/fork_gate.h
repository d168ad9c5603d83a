/* SPDX-License-Identifier: MIT */
/*
 * fork_gate.h - under AddressSanitizer, threads that allocate or free (a
 * ref's init and exit, a @release that frees) against a thread that forks
 * (stress_fork.c, stress_poll.c).  GCC 12's libasan holds allocator locks
 * that no fork hook takes: a fork that lands while another thread holds
 * one leaves the child's first allocation waiting for ever, which is why
 * docs/percpu_ref.md asks users not to fork while their threads are in
 * malloc().  An allocator is active, or a fork is coming (new allocators
 * wait, the forker waits for the active ones).  Atomics and yields, no
 * futex: the fork child inherits the gate closed, and its own reclaimer
 * may wait on it before the main thread opens it there; a pthread rwlock
 * kept the marks of the parent's waiters, and a thread waiting on one
 * before the child reinitialised it waited for ever.  Sequentially
 * consistent: each side's store, then its load of the other side's (a
 * Dekker pair).  Without ASan each call does nothing.
 */
#ifndef PERCPUREF_TESTS_FORK_GATE_H
#define PERCPUREF_TESTS_FORK_GATE_H

#include <sched.h>

#if defined(__SANITIZE_ADDRESS__)
static unsigned int gate_forking, gate_active;

static inline void allocating_begin(void)
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

static inline void allocating_end(void)
{
	__atomic_fetch_sub(&gate_active, 1, __ATOMIC_SEQ_CST);
}

static inline void fork_begin(void)
{
	__atomic_store_n(&gate_forking, 1, __ATOMIC_SEQ_CST);
	while (__atomic_load_n(&gate_active, __ATOMIC_SEQ_CST))
		sched_yield();
}

static inline void fork_end(void)
{
	__atomic_store_n(&gate_forking, 0, __ATOMIC_SEQ_CST);
}
#else
static inline void allocating_begin(void)
{
}

static inline void allocating_end(void)
{
}

static inline void fork_begin(void)
{
}

static inline void fork_end(void)
{
}
#endif

#endif
