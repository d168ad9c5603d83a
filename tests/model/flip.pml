/* SPDX-License-Identifier: MIT */
/*
 * flip.pml - Model R: a membarrier refused mid-run flips the fallback
 * readers to fencing themselves, and no fence, the flipping one or a later
 * one, misses a section that read the mode word before its switch.
 *
 * src/fallback.c, percpuref_readers_fence(): advance gp; while the flag
 * percpuref_readers_fence_needed is unset, membarrier(PRIVATE_EXPEDITED);
 * when that is refused (a seccomp filter installed after set-up), set the
 * flag (seq_cst) and run on every CPU in turn (runtime.c,
 * percpuref_fence_without_membarrier(), the migration fence); once the
 * flag is set, no barrier at all; then wait for each reader whose ctr
 * has nesting bits and another gp (reader_blocks(), seq_cst loads).
 * src/fallback.h, percpuref_reader_add(): load gp (acquire), store ctr
 * (relaxed), a compiler barrier, load the flag, store ctr again with a
 * seq_cst exchange if it is set, load the mode word (seq_cst), add to
 * the unit if per-CPU, store ctr - 1 (release).
 *
 * Memory: x86's TSO, as in Model C.  A user's ctr store goes into its
 * store buffer (pend), which drains at any moment (a drainer per user)
 * and before the user's next store or locked instruction; loads read
 * memory, so the mode-word load passes a buffered store.  The fencer's and the
 * switcher's stores are locked or followed by full barriers, so they
 * take effect at once.  membarrier drains every buffer in one step; the
 * migration fence drains one user's buffer per step (running on that
 * user's CPU is a context switch between two of the user's steps, a full
 * barrier there).  The unit add and the exit are stores too (they drain
 * the entry's store first, FIFO); the exit is visible at once, which
 * only lets the fence stop waiting sooner.
 *
 * Modelled: two users, each two sections in a row (no nesting: Model C
 * has it); one fencer that runs a fence (any switch's, of another ref:
 * no mode change), then switches the ref (the seq_cst exchange of the
 * mode word) and fences again; a sandbox that makes membarrier refuse at
 * any moment, so the flip happens in either fence, or in none.
 *
 * Asserted: when the switch's fence returns, every section that read the
 * mode word as it was before the switch has ended, its add included
 * (percpuref_readers_fence()'s contract, fallback.h: after it, the fold
 * may run).
 *
 * Mutants (each must fail on `old_sections_ended`):
 *  -DMUTANT_FLAG_FIRST: the reader loads the flag before its ctr store,
 *   and exchanges ctr when it is set (the code up to 0.4.28): a reader
 *   the flipping migration preempts between the two makes a plain store
 *   after it; a later fence, with no barrier, reads ctr from memory
 *   while the store is buffered and the section's mode-word load has
 *   passed it.
 *  -DMUTANT_NO_MIGRATION: the flip sets the flag and does not run on
 *   every CPU: a section in flight with a buffered store is missed.
 *  -DMUTANT_NO_EXCHANGE: a reader that reads the flag set does not
 *   exchange: the store-buffer pattern, unfenced on the reader's side.
 *
 * -DURCU: the same flip of liburcu-bp's urcu_bp_has_sys_membarrier
 * (runtime.c, percpuref_synchronize_rcu(); fence_needed stands for the
 * flag's 0).  Its readers (urcu_bp_read_lock()) store their ctr, then
 * read the flag and take a full barrier when it is 0: the users' steps
 * above, with the exchange for that barrier, and the mode word for the
 * pointer the updater unpublished.  The flipper (our reclaimer) sets the
 * flag to 0 and runs on every CPU; a grace period on another thread (the
 * program's own urcu_bp_synchronize_rcu(), liburcu-bp's call_rcu worker)
 * takes rcu_gp_lock, reads the flag, runs membarrier if it is 1 (where it
 * is refused liburcu-bp aborts: not modelled) and only a full barrier of
 * its own if 0, and waits for the readers.  This configuration FAILS, and
 * its test expects it to (a limitation, docs/percpu_ref.md, "seccomp
 * after start-up"): a grace period that reads the flag 0 while the
 * migration has not reached a reader that read it 1 misses that reader's
 * buffered store (review 158).  -DGP_LOCK, the flipper holding
 * rcu_gp_lock across the store and the migration, passes; the library
 * cannot do that: liburcu-bp takes that lock only with its registry lock
 * (urcu_bp_before_fork()), and holding that one there deadlocked
 * (review 159, test_hardening.c, finding 14).
 */

#define NUSER	2
#define SECTIONS 2
#define NEST_MASK 3	/* gp is 4k + 1, as in Model C */

byte gp = 1;			/* percpuref_readers_gp */
byte ctr[NUSER];		/* each unit record's ctr, in memory */
byte pend[NUSER];		/* a user's buffered ctr store (never 0), 0: none */
bit fence_needed;		/* percpuref_readers_fence_needed */
bit refused;			/* membarrier is refused from now on */
bit mode;			/* the ref's mode word: 0 per-CPU, 1 ATOMIC */
bit open_per_cpu[NUSER];	/* ghost: in a section that read the word per-CPU */
bit old_sections_ended;		/* ghost: the fence's verdict */

inline drain(u)
{
	if
	:: pend[u] != 0 -> ctr[u] = pend[u]; pend[u] = 0
	:: else -> skip
	fi
}

proctype user(byte me)
{
	byte i, e;
	bit flag, word;

	for (i : 1 .. SECTIONS) {
		e = gp;					/* acquire */
#ifdef MUTANT_FLAG_FIRST
		flag = fence_needed;
		if
		:: flag -> atomic { drain(me); ctr[me] = e }	/* exchange */
		:: else -> atomic { drain(me); pend[me] = e }
		fi;
#else
		atomic { drain(me); pend[me] = e };	/* relaxed store */
		flag = fence_needed;			/* after a compiler barrier */
		if
#ifdef MUTANT_NO_EXCHANGE
		:: flag -> skip
#else
		:: flag -> atomic { drain(me) }		/* the exchange: the same value */
#endif
		:: else -> skip
		fi;
#endif
		atomic { word = mode; open_per_cpu[me] = !word };	/* seq_cst: a plain load */
		if
		:: word == 0 -> atomic { drain(me) }	/* the unit add */
		:: else -> skip
		fi;
		atomic {				/* exit */
			drain(me);
			ctr[me] = e - 1;
			open_per_cpu[me] = 0;
			e = 0;
			flag = 0;
			word = 0
		}
	}
}

proctype drainer(byte u)
{
end:
	do
	:: atomic { pend[u] != 0 -> ctr[u] = pend[u]; pend[u] = 0 }
	od
}

#define READER_BLOCKS(u, g)	((ctr[u] & NEST_MASK) && ((ctr[u] ^ g) & ~NEST_MASK))

/* percpuref_readers_fence(), readers_lock held: one fencer. */
inline readers_fence()
{
	gp = gp + NEST_MASK + 1;			/* release */
	if
	:: !fence_needed && !refused ->
		atomic { drain(0); drain(1) }		/* membarrier */
	:: !fence_needed && refused ->
		fence_needed = 1;			/* seq_cst */
#ifndef MUTANT_NO_MIGRATION
		atomic { drain(0) };			/* on user 0's CPU */
		atomic { drain(1) }			/* on user 1's CPU */
#else
		skip
#endif
	:: else -> skip				/* the readers fence */
	fi;
	!READER_BLOCKS(0, gp);				/* wait_for_reader() */
	!READER_BLOCKS(1, gp)
}

#ifndef URCU
proctype fencer()
{
	readers_fence();	/* another ref's switch: it may flip */
	mode = 1;		/* this ref's switch: the mode-word exchange */
	readers_fence();
	atomic {
		old_sections_ended = !open_per_cpu[0] && !open_per_cpu[1];
		assert(old_sections_ended)
	}
}
#else
bit gp_lock;			/* liburcu-bp's rcu_gp_lock */

/* percpuref_synchronize_rcu()'s flip, once membarrier is refused. */
proctype flipper()
{
	refused;
#ifdef GP_LOCK
	atomic { !gp_lock -> gp_lock = 1 };
#endif
	if
	:: !fence_needed ->
		fence_needed = 1;			/* seq_cst store of 0 */
		atomic { drain(0) };			/* on user 0's CPU */
		atomic { drain(1) }			/* on user 1's CPU */
	:: else -> skip
	fi;
#ifdef GP_LOCK
	gp_lock = 0
#endif
}

/* Another thread's urcu_bp_synchronize_rcu() after an unpublish. */
proctype fencer()
{
	mode = 1;			/* rcu_assign_pointer(p, NULL) */
	atomic { !gp_lock -> gp_lock = 1 };
	gp = gp + NEST_MASK + 1;
	if
	:: !fence_needed -> atomic { drain(0); drain(1) }	/* membarrier */
	:: else -> skip		/* its own full barrier only */
	fi;
	!READER_BLOCKS(0, gp);
	!READER_BLOCKS(1, gp);
	atomic {
		old_sections_ended = !open_per_cpu[0] && !open_per_cpu[1];
		assert(old_sections_ended);
		gp_lock = 0
	}
}
#endif

/* A seccomp filter installed after set-up. */
proctype sandbox()
{
	refused = 1
}

init
{
	atomic {
		run drainer(0);
		run drainer(1);
		run user(0);
		run user(1);
		run fencer();
#ifdef URCU
		run flipper();
#endif
		run sandbox()
	}
}
