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
 * first), then exits with ctr = 0 (release).  The fence: gp++, then
 * membarrier(PRIVATE_EXPEDITED), which drains every user's buffer (a full
 * barrier on every CPU running a thread of the process), then it waits for
 * each user whose ctr is non-zero and older than the new gp.
 *
 * Mutants: -DMUTANT_NO_MEMBARRIER (no drain: a reader whose ctr store is
 * still buffered reads the old mode word while the fence reads its ctr as
 * 0) and -DMUTANT_NO_WAIT (no wait for the readers).  Built with
 * -DUSER_VISIBLE_ONLY both must fail on what a program would see: @release
 * while a reference is held, or a get that finds zero.
 */

#define NUSER	2
#define OPS	2		/* get/put pairs per user */
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
byte gp = 1;			/* grace-period count */
byte ctr[NUSER];		/* 0: outside a section; else the gp it began in */
byte pend[NUSER];		/* buffered ctr store, 0: none */

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

/* percpuref_reader_add by user @me adding @d, then the atomic path if
 * the mode word was flagged (__percpu_ref_*_slow). */
inline reader_add(me, d)
{
	pend[me] = gp;			/* enter: ctr store, buffered */
	m = mode;			/* may pass the buffered store */
	if
	:: m == 0 ->
		atomic {
			drain(me);
#ifndef USER_VISIBLE_ONLY
			assert(!folded);
#endif
			slot[me] = slot[me] + d;
			total = total + d
		}
	:: else
	fi;
	atomic { drain(me); ctr[me] = 0 };	/* exit, release */
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

proctype user(byte me)
{
	byte i, m;

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
	gp++;
	newgp = gp;
#ifndef MUTANT_NO_MEMBARRIER
	atomic { drain(0); drain(1) }
#endif
#ifndef MUTANT_NO_WAIT
	(ctr[0] == 0 || ctr[0] == newgp);
	(ctr[1] == 0 || ctr[1] == newgp);
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
