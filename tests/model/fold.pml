/* SPDX-License-Identifier: MIT */
/*
 * fold.pml - Model A: the exact fold of a kill under the rseq fast path.
 *
 * What is checked (SPIN, safety): a ref with two CPUs' counters, a mode word
 * and a biased atomic count; two users that hold one reference each and take
 * and drop further ones through the per-CPU fast path (an rseq section:
 * pick a CPU, read the mode word, commit one add) or the atomic path when
 * the word is flagged; a killer (percpu_ref_kill_and_confirm(): set DEAD,
 * set ATOMIC, take the switch's extra reference, queue the finish, drop the
 * initial reference) and the callback thread that finishes the switch
 * (reader fence, fold the counters with one add of sum - BIAS, drop the extra
 * reference).  Asserted:
 *  - the count is exact in every state: with the ghost total of references
 *    held by anyone, count - BIAS + slot[0] + slot[1] == total before the
 *    fold and count == total after it (monitor process);
 *  - no per-CPU add lands after the fold;
 *  - an atomic get never sees zero; the fold never leaves zero;
 *  - @release runs once, only when nobody holds a reference, and it does run.
 *
 * The rseq abstraction.  A section is two steps: start (arm: clear this
 * thread's abort bit, choose the CPU, read the mode word) and commit (if the
 * abort bit is set, restart from the top; otherwise add to slot[cpu]).  The
 * reader fence, membarrier(PRIVATE_EXPEDITED_RSEQ), is one step that sets
 * every thread's abort bit: the kernel restarts every section that has not
 * committed.  The commit is one add instruction, so it is one step; two users
 * "on" the same CPU at once stand for a preempted one, whose restart the
 * model does not force (the adds commute, so nothing is lost by that).
 * Memory is sequentially consistent: membarrier and the seq_cst mode-word
 * store give the switcher that much (runtime.c).  The fallback read side is
 * Model C's (fallback.pml).  Counts are small integers;
 * BIAS stands for 2^63 (no wrap-around is needed at these sizes).
 *
 * Mutants (spin -DMUTANT_NOFENCE / -DMUTANT_EARLY_FOLD): the finish without
 * the fence, or folding before the fence.  A user that read the mode word
 * before the flag then commits its add after the fold: the add is lost.
 * With -DUSER_VISIBLE_ONLY the two ghost checks (the monitor and "no add
 * after the fold") are left out, so what fails is what a program would see:
 * @release runs while a user still holds a reference, or the count reads
 * zero under one.  The mutant tests build that way and must fail.
 *
 * -DPOLLED: the finish as a polling thread does it (deferred.c), with the
 * fence tickets of runtime.c.  The killer stamps its switch with the
 * tickets taken so far, after its mode stores; another thread's fence
 * runs at any time, taking a ticket, fencing, then raising the covered
 * mark to its ticket; the finisher folds once the mark is above the stamp,
 * running a ticketed fence of its own meanwhile if it likes (a poll's due
 * fence, or PERCPU_REF_POLL_WAIT's).  Mutants: the stamp read before the
 * mode stores (MUTANT_EARLY_STAMP), or a mark equal to the stamp taken as
 * covered (MUTANT_COVERS_EQUAL): a fence that took its ticket before the
 * flag was set then counts, a user that read the old mode word after it
 * commits after the fold, and the ghost check fails.
 */

#define NCPU	2
#define NUSER	2
#define OPS	2		/* get/put pairs per user */
#define BIAS	100		/* stands for PERCPU_COUNT_BIAS */
#define ATOMIC	1
#define DEAD	2
#ifdef USER_VISIBLE_ONLY
#define NR_WATCHERS 1		/* init */
#else
#define NR_WATCHERS 2		/* init and the monitor */
#endif

byte mode;			/* the mode word's flag bits */
short count = BIAS + 1;		/* atomic count: bias + the initial reference */
/* Each user starts with one reference, taken per-CPU on its own CPU. */
short slot[NCPU] = 1;		/* per-CPU counters (may go negative) */
bit abort_rseq[NUSER];		/* set by the fence: restart the section */

#ifdef POLLED
byte tickets;			/* fences started */
byte covered;			/* the highest ticket of a fence that ended */
byte stamp;			/* the killer's switch's */
#endif

/* Ghosts. */
short total = NUSER + 1;	/* references held by anyone */
bit folded;			/* count no longer carries the bias, slots dead */
bit queued;			/* the kill queued the finish of its switch */
byte released;			/* times @release ran */

/* @release: once, and only when nobody holds a reference. */
inline release()
{
	assert(released == 0);
	assert(total == 0);
	released++
}

/* Atomic-mode put (__percpu_ref_atomic_sub_and_test, acq_rel). */
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

/*
 * One per-CPU fast-path call (percpuref_this_cpu_add) by user @me adding
 * @d, falling back to the atomic path when the mode word is flagged.
 */
inline fast_add(me, d)
{
	do
	:: atomic {
		abort_rseq[me] = 0;
		if
		:: cpu = 0
		:: cpu = 1
		fi;
		m = mode
	   };
	   if
	   :: m != 0 ->
		/* FLAGGED: the atomic path. */
		if
		:: d > 0 ->
			atomic {
				assert(count != 0);	/* get on a released ref */
				count = count + d;
				total = total + d
			}
		:: else -> atomic_put()
		fi;
		break
	   :: else ->
		atomic {
			if
			:: abort_rseq[me] -> skip	/* restart */
			:: else ->
#ifndef USER_VISIBLE_ONLY
				assert(!folded);	/* no add lands after the fold */
#endif
				slot[cpu] = slot[cpu] + d;
				total = total + d;
				break
			fi
		}
	   fi
	od
}

proctype user(byte me)
{
	byte i, cpu, m;

	for (i : 1 .. OPS) {
		fast_add(me, 1);	/* percpu_ref_get, holding one already */
		fast_add(me, -1)	/* percpu_ref_put */
	}
	fast_add(me, -1)		/* drop the reference it started with */
}

/* The reader fence: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ). */
inline fence()
{
	atomic {
		abort_rseq[0] = 1;
		abort_rseq[1] = 1
	}
}

#ifdef POLLED
/* percpuref_fence_readers() with its ticket. */
inline ticketed_fence()
{
	atomic { tickets++; t = tickets };
	fence();
	atomic {
		if
		:: covered < t -> covered = t
		:: else
		fi
	}
}

/* Another thread's fence (a poll's, the callback thread's). */
proctype fencer()
{
	byte t;

	ticketed_fence()
}
#endif

/* fold_percpu_counts(): the slots read one by one, then one atomic add. */
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

/* percpu_ref_kill(): start_atomic_switch() under the lock, then the put. */
proctype killer()
{
#if defined(POLLED) && defined(MUTANT_EARLY_STAMP)
	stamp = tickets;
#endif
	mode = mode | DEAD;
	mode = mode | ATOMIC;
	atomic { count++; total++ };	/* the switch's extra reference */
#if defined(POLLED) && !defined(MUTANT_EARLY_STAMP)
	stamp = tickets;		/* percpuref_fence_stamp() */
#endif
	queued = 1;
	atomic_put()			/* the initial reference */
}

/* The callback thread: fence, finish_atomic_switch(). */
proctype finisher()
{
	short sum;
#ifdef POLLED
	byte t;
	bit own;
#endif

	queued;
#if defined(POLLED)
	/* percpu_ref_poll(): fold once covered; meanwhile maybe fence. */
	do
#ifdef MUTANT_COVERS_EQUAL
	:: covered >= stamp -> break
#else
	:: covered > stamp -> break
#endif
	:: own == 0 -> own = 1; ticketed_fence()	/* one covers it */
	od;
	fold();
#elif defined(MUTANT_EARLY_FOLD)
	fold();
	fence();
#elif defined(MUTANT_NOFENCE)
	fold();
#else
	fence();
	fold();
#endif
	atomic_put()			/* the switch's extra reference */
}

#ifndef USER_VISIBLE_ONLY
/* count is exact in every state. */
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
		/* The initial reference is the killer's. */
		run user(0);
		run user(1);
		run killer();
		run finisher();
#ifdef POLLED
		run fencer()
#endif
	}
	/* Everything else done: released, exactly once, count zero. */
	_nr_pr == NR_WATCHERS;
	assert(released == 1);
	assert(count == 0 && total == 0)
}
