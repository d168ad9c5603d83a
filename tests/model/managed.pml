/* SPDX-License-Identifier: MIT */
/*
 * managed.pml - Model B: the reclaimer's check of a managed ref.
 *
 * What is checked (SPIN, safety): a managed ref (the manager, i.e. the
 * reclaimer, holds a reference of its own; the ref is per-CPU between
 * checks; the creator's reference is one more user reference);
 * two users that each tryget and, on success, put, OPS times; the manager
 * that checks the ref SCANS times while the users run and once more after
 * they are done.  A check is percpuref_managed_begin() (set ATOMIC, take the
 * switch's extra reference), the reader fence, and percpuref_managed_finish()
 * (fold: read each slot and zero it unless it reads zero, then one add of
 * sum - BIAS; then one CAS of the count from 2 to 0; on success the ref is
 * dead and @release runs, on failure drop the extra reference and switch
 * back to per-CPU: add BIAS, clear ATOMIC, the slots being zero since the
 * fold).  Asserted:
 *  - @release runs at most once, only when no user holds a reference, and
 *    the check after the users are done does run it;
 *  - no tryget succeeds after @release;
 *  - no user put ever takes the atomic count to zero;
 *  - the count is exact in every state (monitor: count, less the bias while
 *    biased, plus the live slots and what the fold took from them so far
 *    equals the references held), and no per-CPU add lands while the
 *    slots are folded, nor between a slot's read and its zeroing;
 *  - the slots are zero when the ref goes back to per-CPU mode.
 *
 * Abstractions, as in fold.pml: an rseq section is a start step (clear the
 * abort bit, choose a CPU, read the mode word) and a commit step (restart if
 * the fence set the abort bit); the fence sets every user's abort bit in one
 * step; memory is sequentially consistent; the fallback read side is not
 * modelled; BIAS stands for 2^63.  tryget in atomic mode is
 * __percpu_ref_atomic_add_not_zero() as one step (its CAS loop retries until
 * it wins or sees zero).  The saturation zones are not modelled: no misuse
 * happens here.  The object is never freed in the model; a tryget after the
 * release stands for a lookup that raced with it (the release callback is
 * what unpublishes the object).
 *
 * Mutant (spin -DMUTANT_PUT_TRYGET): the proposal's check.  After a full
 * switch to atomic (extra reference dropped) the manager puts its
 * reference and then trygets: failure means the ref is dead and the manager
 * tears it down.  A user put in between takes the count to zero, so that
 * user calls @release too: SPIN finds the double release.
 *
 * Mutant (spin -DUSER_VISIBLE_ONLY -DMUTANT_NO_CLEAR): the fold reads the
 * slots without zeroing them, and the switch back trusts they are zero
 * (0.4.11 moved the zeroing from the switch back and the allocation to the
 * fold): the counts of the last per-CPU period are counted again, and the
 * next fold leaves the count below the manager's and the switch's
 * references (its assertion; without it, the release check and then the
 * monitor fail).
 */

#define NCPU	2
#define NUSER	2
#define OPS	2		/* tryget/put rounds per user */
#define SCANS	2		/* checks while the users run */
#define BIAS	100		/* stands for PERCPU_COUNT_BIAS */
#define ATOMIC	1
#define DEAD	2

byte mode;			/* the mode word's flag bits */
short count = BIAS + 1;		/* bias + the manager's reference */
short slot[NCPU];		/* per-CPU counters (may go negative) */
bit abort_rseq[NUSER];		/* set by the fence: restart the section */

/* Ghosts. */
short total = 1;		/* references held by anyone */
byte users_held;		/* references held by users */
bit biased = 1;			/* count carries BIAS */
bit slots_live = 1;		/* slots are part of the count */
short taken;			/* what the fold zeroed and has not added yet */
byte released;			/* times @release ran */
byte users_done;

/* @release: once, and only when no user holds a reference. */
inline release()
{
	assert(released == 0);
	assert(users_held == 0);
	released++
}

/* Start of an rseq section: arm it, pick the CPU, read the mode word. */
inline rseq_start(me)
{
	atomic {
		abort_rseq[me] = 0;
		if
		:: cpu = 0
		:: cpu = 1
		fi;
		m = mode
	}
}

/* percpu_ref_tryget(); sets ok. */
inline tryget(me)
{
	do
	:: rseq_start(me);
	   if
	   :: m != 0 ->
		/* FLAGGED: __percpu_ref_atomic_add_not_zero(). */
		atomic {
			if
			:: count == 0 -> ok = 0
			:: else ->
				assert(released == 0);
				count++; total++; users_held++; ok = 1
			fi
		};
		break
	   :: else ->
		atomic {
			if
			:: abort_rseq[me] -> skip	/* restart */
			:: else ->
				assert(slots_live);
				assert(released == 0);
				slot[cpu]++; total++; users_held++; ok = 1;
				break
			fi
		}
	   fi
	od
}

/* percpu_ref_put(). */
inline put(me)
{
	do
	:: rseq_start(me);
	   if
	   :: m != 0 ->
		/* FLAGGED: __percpu_ref_atomic_sub_and_test(). */
		atomic {
			count--; total--; users_held--;
			if
			:: count == 0 ->
#ifdef MUTANT_PUT_TRYGET
				release()	/* the putter calls @release */
#else
				assert(false)	/* a user put reached zero */
#endif
			:: else
			fi
		};
		break
	   :: else ->
		atomic {
			if
			:: abort_rseq[me] -> skip	/* restart */
			:: else ->
				assert(slots_live);
				slot[cpu]--; total--; users_held--;
				break
			fi
		}
	   fi
	od
}

proctype user(byte me)
{
	byte i, cpu, m;
	bit ok;

	for (i : 1 .. OPS) {
		tryget(me);
		if
		:: ok -> put(me)
		:: else
		fi
	}
	users_done++
}

/* The reader fence: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ). */
inline fence()
{
	atomic {
		abort_rseq[0] = 1;
		abort_rseq[1] = 1
	}
}

/* fold_percpu_counts(): percpuref_counter_take_sum(), each slot read
 * and then, if not zero, zeroed (a zero slot is left unwritten), then one
 * add. */
inline fold()
{
	copy = slot[0];
	sum = copy;
#ifndef MUTANT_NO_CLEAR
	if
	:: copy != 0 -> atomic { slot[0] = 0; taken = sum }
	:: else
	fi;
#endif
	copy = slot[1];
	sum = sum + copy;
#ifndef MUTANT_NO_CLEAR
	if
	:: copy != 0 -> atomic { slot[1] = 0; taken = sum }
	:: else
	fi;
#endif
	atomic {
		count = count + sum - BIAS;
		biased = 0;
		slots_live = 0;
		taken = 0;
		assert(count >= 2)	/* manager's and switch's at least */
	}
}

/* switch_to_percpu_locked(): bias, then release-store the word; the
 * slots are zero since the fold. */
inline to_percpu()
{
	atomic { count = count + BIAS; biased = 1 };
#ifndef USER_VISIBLE_ONLY
	assert(slot[0] == 0 && slot[1] == 0);
#endif
	slots_live = 1;
	mode = mode & ~ATOMIC
}

/* One check of the ref. */
inline check()
{
	/* percpuref_managed_begin(): start_atomic_switch(). */
	mode = mode | ATOMIC;
	atomic { count++; total++ };
	fence();
	fold();
#ifndef MUTANT_PUT_TRYGET
	/* percpuref_managed_finish(): one CAS from 2 to 0. */
	atomic {
		if
		:: count == 2 ->
			count = 0; total = total - 2;
			mode = mode | DEAD;
			release()
		:: else ->
			count--; total--	/* the switch's reference */
		fi
	};
	if
	:: released == 0 -> to_percpu()
	:: else
	fi
#else
	/* The proposal: finish the switch, put, then tryget. */
	atomic { count--; total-- };	/* the switch's reference */
	atomic { count--; total-- };	/* percpu_ref_put: the manager's */
	atomic {
		if
		:: count == 0 ->		/* tryget failed: dead */
			mode = mode | DEAD;
			release();
			dead = 1
		:: else ->
			count++; total++	/* tryget: the manager's again */
		fi
	};
	if
	:: !dead -> to_percpu()
	:: else
	fi
#endif
}

proctype manager()
{
	byte s;
	short sum, copy;
	bit dead;

	for (s : 1 .. SCANS) {
		if
		:: released != 0 || dead -> break
		:: else -> check()
		fi
	}
	users_done == NUSER;
	if
	:: released == 0 && !dead -> check()
	:: else
	fi;
	assert(released == 1)		/* nobody else holds it: released */
}

/* count is exact in every state. */
active proctype monitor()
{
end:	atomic {
		!(count - (biased -> BIAS : 0) + (slots_live -> slot[0] + slot[1] + taken : 0) ==
		  total) ->
		assert(false)
	}
}

init
{
	atomic {
		run user(0);
		run user(1);
		run manager()
	}
}
