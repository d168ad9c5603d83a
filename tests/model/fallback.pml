/* SPDX-License-Identifier: MIT */
/*
 * fallback.pml - Model C: the fold of a kill under the fallback readers
 * (src/fallback.c, fallback.h), with the readers' stores buffered as on
 * x86 (TSO).
 *
 * What is checked (SPIN, safety): as Model A (fold.pml), with the per-CPU
 * calls made by fallback readers instead of rseq sections.  Two users, each
 * owning one unit (slot[me]) and holding one reference, do get/put pairs;
 * a killer sets DEAD and ATOMIC, takes the switch's extra reference and
 * drops the initial one; the callback thread runs the reader fence and
 * folds.  Asserted: the count is exact in every state (monitor), no unit
 * add lands after the fold, an atomic get never sees zero, @release runs
 * once, only when nobody holds a reference, and it does run.
 *
 * The reader section.  Enter loads the grace-period count gp and stores it
 * into ctr[me]; that store sits in the user's store buffer (pend[me]) until
 * it drains, which may happen at any moment (the drain process) and must
 * happen before the user's next store (FIFO).  The mode-word load does not
 * wait for it: this is the reordering a compiler barrier allows on x86.  If
 * the word is per-CPU the user adds to its unit (a store: the buffer drains
 * first), then exits (release; ctr below).  The fence: advances gp, then
 * membarrier(PRIVATE_EXPEDITED), which drains every user's buffer (a full
 * barrier on every CPU running a thread of the process), then it waits for
 * each user in a section older than the new gp.
 *
 * Mutants: -DMUTANT_NO_MEMBARRIER (no drain: a reader whose ctr store is
 * still buffered reads the old mode word while the fence reads its ctr as
 * 0) and -DMUTANT_NO_WAIT (no wait for the readers).  Built with
 * -DUSER_VISIBLE_ONLY both must fail on what a program would see: @release
 * while a reference is held, or a get that finds zero.
 *
 * ctr as the C keeps it: the gp of the outermost section plus the nesting
 * depth - 1, gp's nesting bits being 1 (here gp = 4k + 1, two nesting
 * bits: entry stores gp, a nested entry ctr + 1, an exit the value it
 * entered with - 1, so depth 0 outside); the fence waits for a ctr with
 * nesting bits set and another gp (reader_blocks()).
 *
 * -DNEST: a signal handler may interrupt user 0 once, at any step of one
 * of its sections (before its entry store, with it buffered or drained,
 * after its mode-word load, after its add), and make a get/put pair of
 * nested sections on the same unit before the section goes on.  A nested
 * entry reads the thread's own ctr (its buffered store forwarded) and
 * takes ctr + 1, keeping the outermost gp; its exit puts back what it
 * found.  The handler's own entry (its ctr load, gp load and store) is one
 * step: the outer section's split steps show that pattern.  A handler
 * interrupted by another is not modelled (each leaves the nesting bits as
 * it found them, so by induction the outer one sees what this model
 * checks; review 156 checked depth 3 by hand: 64.9 million states).
 * Mutants, with -DNEST (each fails on `!(folded)`, a unit add after the
 * fold, and is tested with -DUSER_VISIBLE_ONLY on `(total==0)`):
 *  -DMUTANT_NEST_RELOADS_GP: a nested entry takes the current gp, as an
 *   outermost one does: its exit leaves depth 0 under the new gp, and the
 *   fence stops waiting for the interrupted section.
 *  -DMUTANT_NEST_EXIT_ZERO: a nested exit stores "outside" (the outer
 *   entry's value - 1): the interrupted section looks ended.
 *  -DMUTANT_NEST_NO_FORWARD: a nested entry reads ctr from memory, not
 *   the outer entry's store still buffered: it takes the gp, and its
 *   exit leaves depth 0 as in NEST_RELOADS_GP.
 *  -DMUTANT_FENCE_DEPTH1: the fence waits only for depth 1: a nested
 *   section's ctr (depth 2) reads as none.
 */

#define NUSER	2
#ifndef OPS
#ifdef NEST
#define OPS	1		/* get/put pairs per user (and the handler's) */
#else
#define OPS	2		/* get/put pairs per user */
#endif
#endif
#define BIAS	100		/* stands for PERCPU_COUNT_BIAS */
#define ATOMIC	1
#define DEAD	2
#ifdef USER_VISIBLE_ONLY
#define NR_WATCHERS 3		/* init and the two drains */
#else
#define NR_WATCHERS 4		/* init, the drains and the monitor */
#endif

byte mode;
short count = BIAS + 1;		/* bias + the initial reference */
short slot[NUSER] = 1;		/* each user's unit; it starts with one reference */
#define NEST_MASK 3		/* ctr's nesting bits */
byte gp = 1;			/* grace-period count: 4k + 1 */
byte ctr[NUSER];		/* outermost gp + depth - 1; depth 0: outside */
byte pend[NUSER];		/* buffered ctr store (entries only: never 0), 0: none */
bit interrupted;		/* -DNEST: the handler has run */

short total = NUSER + 1;	/* ghost: references held by anyone */
bit folded;
bit queued;
byte released;

inline release()
{
	assert(released == 0);
	assert(total == 0);
	released++
}

inline atomic_put()
{
	atomic {
		assert(count > 0);
		count--;
		total--;
		if
		:: count == 0 -> release()
		:: else
		fi
	}
}

/* The buffer drains before any later store of the user (FIFO). */
inline drain(u)
{
	if
	:: pend[u] != 0 -> ctr[u] = pend[u]; pend[u] = 0
	:: else
	fi
}

/* The user's own ctr, as its loads see it: its buffered store forwarded. */
#define OWN_CTR(u)	(pend[u] != 0 -> pend[u] : ctr[u])

/* The atomic path after a section that found the mode word flagged
 * (__percpu_ref_*_slow). */
inline atomic_path(m, d)
{
	if
	:: m != 0 && d > 0 ->
		atomic {
			assert(count != 0);
			count = count + d;
			total = total + d
		}
	:: m != 0 && d < 0 -> atomic_put()
	:: else
	fi
}

#ifdef NEST
/* A signal handler's section on user 0's thread, inside one of its own. */
inline nested_add(d)
{
	atomic {
		/* inside the interrupted section: ctr + 1; before its entry
		 * store or after its exit: the handler's is the outermost */
#if defined(MUTANT_NEST_RELOADS_GP)
		he = gp;
#elif defined(MUTANT_NEST_NO_FORWARD)
		he = (ctr[0] & NEST_MASK -> ctr[0] + 1 : gp);
#else
		he = (OWN_CTR(0) & NEST_MASK -> OWN_CTR(0) + 1 : gp);
#endif
		drain(0);
		pend[0] = he
	};
	hm = mode;
	if
	:: hm == 0 ->
		atomic {
			drain(0);
#ifndef USER_VISIBLE_ONLY
			assert(!folded);
#endif
			slot[0] = slot[0] + d;
			total = total + d
		}
	:: else
	fi;
#ifdef MUTANT_NEST_EXIT_ZERO
	atomic { drain(0); ctr[0] = he & ~NEST_MASK };	/* gp - 1: outside */
#else
	atomic { drain(0); ctr[0] = he - 1 };	/* exit, release */
#endif
	he = 0;
	atomic_path(hm, d);
	hm = 0
}

/* The handler runs here, once, if user 0 is the caller. */
inline maybe_interrupt(me)
{
	if
	:: me == 0 && !interrupted -> interrupted = 1; nested_add(1); nested_add(-1)
	:: true
	fi
}
#else
inline maybe_interrupt(me)
{
	skip
}
#endif

/* percpuref_reader_add by user @me adding @d, then the atomic path if
 * the mode word was flagged (__percpu_ref_*_slow). */
inline reader_add(me, d)
{
	/* enter: ctr = gp (nothing open: no handler is running) */
	e = gp;
	maybe_interrupt(me);
	atomic { drain(me); pend[me] = e };	/* buffered */
	maybe_interrupt(me);
	m = mode;			/* may pass the buffered store */
	maybe_interrupt(me);
	if
	:: m == 0 ->
		atomic {
			drain(me);
#ifndef USER_VISIBLE_ONLY
			assert(!folded);
#endif
			slot[me] = slot[me] + d;
			total = total + d
		};
		maybe_interrupt(me)
	:: else
	fi;
	atomic { drain(me); ctr[me] = e - 1; e = 0 };	/* exit, release */
	atomic_path(m, d);
	m = 0
}

proctype user(byte me)
{
	byte i, m, e;
#ifdef NEST
	byte he, hm;
#endif

	for (i : 1 .. OPS) {
		reader_add(me, 1);
		reader_add(me, -1)
	}
	reader_add(me, -1)
}

/* A store buffer drains on its own at any moment. */
proctype drainer(byte u)
{
end:	do
	:: atomic { pend[u] != 0 -> ctr[u] = pend[u]; pend[u] = 0 }
	od
}

inline fold()
{
	sum = slot[0];
	sum = sum + slot[1];
	atomic {
		count = count + sum - BIAS;
		folded = 1;
		assert(count > 0)
	}
}

proctype killer()
{
	mode = mode | DEAD;
	mode = mode | ATOMIC;
	atomic { count++; total++ };
	queued = 1;
	atomic_put()
}

/* percpuref_readers_fence(), then finish_atomic_switch(). */
proctype finisher()
{
	short sum;
	byte newgp;

	queued;
	gp = gp + NEST_MASK + 1;
	newgp = gp;
#ifndef MUTANT_NO_MEMBARRIER
	atomic { drain(0); drain(1) }
#endif
#ifndef MUTANT_NO_WAIT
	/* reader_blocks(): a section open (nesting bits) from an older gp */
#ifdef MUTANT_FENCE_DEPTH1
	!((ctr[0] & NEST_MASK) == 1 && ((ctr[0] ^ newgp) & ~NEST_MASK));
	!((ctr[1] & NEST_MASK) == 1 && ((ctr[1] ^ newgp) & ~NEST_MASK));
#else
	!((ctr[0] & NEST_MASK) && ((ctr[0] ^ newgp) & ~NEST_MASK));
	!((ctr[1] & NEST_MASK) && ((ctr[1] ^ newgp) & ~NEST_MASK));
#endif
#endif
	fold();
	atomic_put()
}

#ifndef USER_VISIBLE_ONLY
active proctype monitor()
{
end:	atomic {
		!(folded && count == total ||
		  !folded && count - BIAS + slot[0] + slot[1] == total) ->
		assert(false)
	}
}
#endif

init
{
	atomic {
		run drainer(0);
		run drainer(1);
		run user(0);
		run user(1);
		run killer();
		run finisher()
	}
	_nr_pr == NR_WATCHERS;
	assert(released == 1);
	assert(count == 0 && total == 0)
}
