/* SPDX-License-Identifier: MIT */
/*
 * exitconv.pml - review 174: the exit's conversion of a held managed ref
 * (src/percpu_ref.c: percpuref_managed_finish()'s at_exit branch,
 * unmanage_held_at_exit()) racing its holders' puts, a tryget and a
 * tryget_live.
 *
 * State after the check's fold: the ref is atomic; the count holds the
 * manager's reference, the switch's, and one per holder.  R, the exit's
 * check: the compare-and-swap of 2 to 0 (release if only the manager and
 * the switch hold it), else the load that chooses the pin, then the
 * conversion: set_managed(false), the mode word's DEAD, the subtract of
 * 2 (acq_rel; released by R when it reaches zero).  H1, H2: holders, each
 * puts its reference once (H2 first takes and drops one more with a
 * tryget).  T: a tryget_live (DEAD read, then add unless zero) and, if it
 * got one, a put.  A put that reaches zero reads @managed: true pins the
 * ref (pin_dropped_manager_ref(): a warning and a leak), false runs
 * @release (__percpu_ref_release_life()).  Memory sequentially
 * consistent (the C11 argument is in the review: the holder's
 * read-modify-write reads from R's release subtract, so its acquire
 * load of @managed reads false).
 *
 * Asserted: @release runs exactly once, after every holder let go, and
 * never with a warning (no pin); the ref is DEAD before any @release a
 * holder's put runs (hrel == 0 at R's store of DEAD), as every released
 * ref is: a @release may reinit it, which needs it dead.
 *
 * Mutants:
 *  -DMUTANT_SUB_FIRST   subtract before set_managed(false): a holder's
 *                       put reaching zero in between reads managed and
 *                       pins the ref (a leak and a false warning).
 *  -DMUTANT_DEAD_AFTER  DEAD set after the subtract: the last holder's
 *                       put may run @release on a ref not yet dead (its
 *                       reinit refused, "not dead"), and tryget_live
 *                       may succeed after it.  (R holds the ref's switch
 *                       lock throughout, so a @release that exits the ref
 *                       waits for R, and R's late store is no use after
 *                       free; the model leaves the lock out.)
 */

byte count = 4;		/* manager + switch + H1 + H2 */
bool managed = true;
bool dead = false;
byte released = 0;	/* @release runs, whoever's */
byte hrel = 0;		/* of them, by a holder's put */
bool pinned = false;
byte holders = 2;	/* references held by H1, H2, T */
byte finished = 0;

/* Every state: @release at most once, never under a holder, no pin. */
#define SAFE	(released <= 1 && (released == 0 || holders == 0) && !pinned)

inline put_one() {
	atomic {
		count = count - 1;
		holders = holders - 1;
		if
		:: count == 0 ->
			if
			:: managed -> pinned = true
			:: else -> released++; hrel++
			fi
		:: else -> skip
		fi;
		assert(SAFE)
	}
}

inline tryget() {
	atomic { if :: count > 0 -> count++; holders++; got = true :: else -> skip fi }
}

active proctype H1() {
	put_one();
	finished++
}

active proctype H2() {
	bool got = false;
	tryget();
	if :: got -> put_one() :: else -> skip fi;
	put_one();
	finished++
}

active proctype T() {
	bool got = false;
	if
	:: !dead -> tryget()	/* tryget_live: DEAD read first */
	:: else -> skip
	fi;
	if :: got -> put_one() :: else -> skip fi;
	finished++
}

active proctype R() {
	byte c;
	atomic {
		if
		:: count == 2 -> count = 0; released++; goto done
		:: else -> skip
		fi
	}
	c = count;	/* chooses the pin */
	if
	:: c < 2 -> goto done	/* a put too many: not modelled */
	:: else -> skip
	fi;
#ifdef MUTANT_SUB_FIRST
	atomic { count = count - 2; if :: count == 0 -> released++ :: else -> skip fi; assert(SAFE) }
	managed = false;
	dead = true;
#else
	managed = false;
#ifndef MUTANT_DEAD_AFTER
	dead = true;
#endif
	atomic { count = count - 2; if :: count == 0 -> released++ :: else -> skip fi; assert(SAFE) }
#ifdef MUTANT_DEAD_AFTER
	/* The mode word's store, after a holder's @release may have freed it. */
	assert(hrel == 0);
	dead = true;
#endif
#endif
done:
	finished++
}

active proctype Final() {
	finished == 4;
	assert(released == 1 && !pinned && holders == 0 && count == 0)
}
