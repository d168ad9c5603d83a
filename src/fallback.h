/* SPDX-License-Identifier: MIT */
/*
 * fallback.h - the fallback fast path (src/fallback.c): per-CPU counting for
 * threads of a process without rseq, with an asymmetric fence.  Internal.
 */
#ifndef PERCPUREF_FALLBACK_H
#define PERCPUREF_FALLBACK_H

#include <stdbool.h>
#include <stdint.h>

#include "internal.h"

/* Low bits of a reader's ctr: nesting depth (signal handlers nest). */
#define PERCPUREF_READER_NEST_MASK 0xffffUL
/* Grace-period counter step, above the nesting bits. */
#define PERCPUREF_READER_GP_STEP (PERCPUREF_READER_NEST_MASK + 1)

/* Units per possible CPU in a process without rseq (runtime.c). */
#define PERCPUREF_READER_UNITS_PER_CPU 2

enum percpuref_reader_state {
	PERCPUREF_READER_NEW,		/* not registered yet (TLS image) */
	PERCPUREF_READER_REGISTERING,	/* registration in progress */
	PERCPUREF_READER_UNIT,		/* registered, owns a unit */
	PERCPUREF_READER_ATOMIC,	/* no unit, or exited: atomic path */
};

struct percpuref_reader {
	/*
	 * The section counter, in the record of the unit this thread owns
	 * (fallback.c), on the heap: a fence reads it, and a thread whose exit
	 * hook never runs must leave nothing there that goes with its TLS.
	 * 0 in the nesting bits: outside any section.  Otherwise the value of
	 * percpuref_readers_gp when the outermost section began, plus the
	 * nesting depth - 1.  Written by this thread only; read by fences.
	 */
	unsigned long *ctr;
	unsigned int unit;		/* the unit this thread owns alone */
	unsigned char state;		/* enum percpuref_reader_state */
};

extern __thread struct percpuref_reader percpuref_reader_self
	__attribute__((tls_model("initial-exec")));
/* Grace-period counter, nesting bits 1; advanced by each fence. */
extern unsigned long percpuref_readers_gp;
/* membarrier(PRIVATE_EXPEDITED) refused: readers fence themselves. */
extern bool percpuref_readers_fence_needed;

/* True once set up with units (none: their allocation failed, or the
 * process took the rseq path first). */
bool percpuref_readers_have_units(void);

/* Registers this thread and claims a unit; true when it owns one now. */
bool percpuref_reader_register(void);

/* A non-atomic add that a signal handler on this thread cannot split. */
static inline void percpuref_reader_unit_add(unsigned long *counter, unsigned long delta)
{
#if defined(__x86_64__)
	/* "e": a constant delta (a get's 1, a put's 2^31 - 1) as an
	 * immediate, cheaper than a register (percpu_ref.h). */
	__asm__ __volatile__("addq %1, %0" : "+m"(*counter) : "er"(delta) : "cc");
#else
	/* Relaxed: the unit is this thread's alone; only signal safety. */
	__atomic_fetch_add(counter, delta, __ATOMIC_RELAXED);
#endif
}

/*
 * percpuref_reader_add - the fallback fast path: add @delta to this
 * thread's unit of the counter whose mode word is *@mode_word, inside a
 * read-side section, unless the word is flagged.  NO_RSEQ: this thread has
 * no unit (the caller counts without one: percpu_ref.c, unitless_add()).
 */
static inline enum percpuref_this_cpu_result
percpuref_reader_add(const uintptr_t *mode_word, unsigned long delta)
{
	struct percpuref_reader *self = &percpuref_reader_self;
	enum percpuref_this_cpu_result result = PERCPUREF_THIS_CPU_FLAGGED;
	unsigned long ctr, *ctr_slot;
	uintptr_t word;

	if (percpuref_unlikely(self->state != PERCPUREF_READER_UNIT) &&
	    !percpuref_reader_register())
		return PERCPUREF_THIS_CPU_NO_RSEQ;
	ctr_slot = self->ctr;
	/*
	 * Enter.  Relaxed load and store: only this thread writes ctr, and a
	 * signal handler that runs in between leaves it as it found it.  The
	 * acquire load of the grace-period counter pairs with the fence's
	 * release store: a section that starts with the new count sees the
	 * mode word stored before it.
	 */
	ctr = __atomic_load_n(ctr_slot, __ATOMIC_RELAXED);
	ctr = (ctr & PERCPUREF_READER_NEST_MASK) ? ctr + 1 :
	      __atomic_load_n(&percpuref_readers_gp, __ATOMIC_ACQUIRE);
	/*
	 * Order the ctr store before the mode-word load.  Normally the
	 * fence's membarrier(PRIVATE_EXPEDITED) makes a compiler barrier a
	 * full barrier whenever it matters.  Without membarrier the store is
	 * made again with a sequentially consistent exchange of the same
	 * value: in C11's single total order of the sequentially consistent
	 * operations (this exchange, the mode-word load, the switcher's
	 * mode-word exchange, the fence's ctr loads) either the fence's ctr
	 * load follows the exchange and reads it, or this section's
	 * mode-word load follows the switcher's exchange and sees the new
	 * word.  (An exchange, a locked instruction, rather than a seq_cst
	 * thread fence: mfence made a pair 28 ns instead of 17 on the 2-vCPU
	 * test machine.)  The mode-word load is sequentially consistent
	 * either way (and acquire, pairing with the release store that
	 * clears ATOMIC after zeroing the counters).
	 *
	 * The flag is read after the store, not before (liburcu-bp's
	 * urcu_bp_smp_mb_slave() reads its own after the store too): a
	 * membarrier refused mid-run sets the flag, then runs the fencing
	 * thread on every CPU (fallback.c, "The flip").  A load that read
	 * the flag unset came before that thread reached this thread's CPU,
	 * so the store before it was drained by the context switch there;
	 * one that reads it set exchanges.  Read before the store, an unset
	 * flag sent a thread preempted between the two, by that very
	 * migration, into a plain store that a later fence (flag set: no
	 * barrier of its own) could miss in the store buffer while the
	 * section's mode-word load passed it (tests/model/flip.pml).  The
	 * compiler barrier keeps the store before the flag's load in the
	 * code.  Relaxed flag load: the migration orders it, not its memory
	 * order.  A signal handler between the store and the exchange
	 * leaves ctr as it found it, so the exchange stores what is there.
	 */
	__atomic_store_n(ctr_slot, ctr, __ATOMIC_RELAXED);
	percpuref_barrier();
	if (percpuref_unlikely(__atomic_load_n(&percpuref_readers_fence_needed,
					       __ATOMIC_RELAXED)))
		/* Seq_cst: against the switcher's mode-word exchange and
		 * the fence's ctr loads (above). */
		(void)__atomic_exchange_n(ctr_slot, ctr, __ATOMIC_SEQ_CST);
	word = __atomic_load_n(mode_word, __ATOMIC_SEQ_CST);
	if (!(word & PERCPUREF_MODE_FLAGS)) {
		percpuref_reader_unit_add(percpuref_counter_on(word, self->unit), delta);
		result = PERCPUREF_THIS_CPU_DONE;
	}
	/*
	 * Exit.  Release: the add happens before a fence that sees it.  From
	 * the value stored at entry, not a reload (a signal handler leaves
	 * ctr as it found it): a reload would wait for that store to forward.
	 */
	__atomic_store_n(ctr_slot, ctr - 1, __ATOMIC_RELEASE);
	return result;
}

/*
 * True inside one of this thread's sections.  The library calls nothing
 * from inside one, so a caller that finds one open runs in a signal
 * handler that interrupted a get or put of its thread (or in a handler
 * nested in such a handler).  Relaxed: this thread's own word.
 */
static inline bool percpuref_reader_interrupted(void)
{
	const struct percpuref_reader *self = &percpuref_reader_self;

	return self->state == PERCPUREF_READER_UNIT &&
	       (__atomic_load_n(self->ctr, __ATOMIC_RELAXED) & PERCPUREF_READER_NEST_MASK);
}

/*
 * percpuref_readers_set_exit_work - have every thread's exit with a unit
 * call @fn last, outside every section, with the synchronous signals
 * open: percpu_ref.c's releases that a thread's handlers left to a get or
 * put that never returned.  A hook, so that this layer calls nothing
 * above it.  Async-signal-safe: set from the handler that leaves one.
 */
void percpuref_readers_set_exit_work(void (*fn)(void));

/* Set-up for a process (or fork child) without rseq and @nr_units
 * units: membarrier, the unit map, the exit hook. */
void percpuref_readers_setup(unsigned int nr_units);
/*
 * percpuref_readers_fence - the fallback half of percpuref_fence_readers():
 * once it returns, every section that read a mode word stored before the
 * call has ended and its add is visible.  Returns at once while no thread
 * has registered as a reader.
 */
void percpuref_readers_fence(void);

#endif
