/* SPDX-License-Identifier: MIT */
/*
 * unitless.pml - Model J: callers without a unit add to the ref's own
 * word, which the fold closes and counts, so that a reference taken on a
 * per-CPU word and dropped without a unit (or the other way) cancels out.
 *
 * The per-CPU words keep the net count modulo 2^31 (percpu_ref.h), which
 * the fold sign-extends: exact while the net of what went through them in
 * one per-CPU period stays within 2^30 either way.  A caller without a
 * unit (more threads than fallback units, a CPU past the units counted, a
 * call after its thread's exit hook) used the atomic count, so a reference
 * taken on one side and dropped on the other moved that net by one for
 * good, and 2^30 of them read the count 2^31 off.  Now, while the mode
 * word says per-CPU, it adds to unitless_word with a CAS unless the word
 * is closed; otherwise it uses the atomic count, as callers with a unit do
 * from the moment the mode word says atomic (before the fold: a word still
 * open then would take the other side of their crossings for as long as
 * the fence lasts).  The fold closes the word with one exchange and adds
 * its value to the per-CPU words' sum; the switch to per-CPU mode reopens
 * it at 0 (src/percpu_ref.c: unitless_add(), fold_percpu_counts(),
 * switch_to_percpu_locked()).  "Atomic" is either flag of the mode word:
 * a kill sets DEAD before its switch sets ATOMIC, and callers with a unit
 * use the count from the first.
 *
 * Modelled with the modulus 8 for 2^31 (the net read in [-4, 3]): one
 * user, holding a reference of its own, makes ROUNDS crossings, each a
 * reference taken on a per-CPU word and dropped without a unit or the
 * other way, the direction chosen each round, then drops its reference on
 * either side; a switcher takes the ref to atomic mode (the extra
 * reference, the fold, the extra reference dropped), back to per-CPU
 * mode, and kills it (the same, then the initial reference dropped).  A
 * per-CPU add reads the mode and adds in one step (the reader fence,
 * fold.pml, guarantees that no add that read per-CPU mode lands after the
 * fold); a unit-less add reads the mode word, then its word, then CASes
 * it, or, having read the mode atomic or the word closed, adds to the
 * atomic count: steps the switcher may come between (an add that read
 * per-CPU mode and lands after the flag, or one that read the word closed
 * and lands after the reopening, is a crossing, at most one a thread in
 * each period: within the window here).  Sequentially consistent memory.
 *
 * Asserted: at each fold the count equals the references held (the
 * extra one included); the ref is released exactly once, when the last
 * reference goes, and never before.
 *
 * Mutants (each must fail):
 *  -DMUTANT_ATOMIC_COUNT: unit-less callers always use the atomic count
 *   (up to 0.4.1): four crossings one way in one period read as minus four.
 *  -DMUTANT_FOLD_LOAD: the fold reads the word, then closes it with a
 *   store: an add landing in between is lost.
 *  -DMUTANT_IGNORE_FOLDED: a unit-less add goes on the word even when it
 *   is closed: counted by no fold.
 *  -DMUTANT_NO_REOPEN: the switch to per-CPU mode leaves the word closed:
 *   unit-less callers stay on the atomic count while the ref is per-CPU,
 *   and their crossings move the words' net as before.
 *  -DMUTANT_NO_MODE_CHECK: a unit-less add uses the word until the fold
 *   closes it, atomic mode or not (a first version of this change): while
 *   the switch fences, callers with a unit use the atomic count, and four
 *   crossings between the two read as minus four.
 */

#define M	8	/* the words' modulus, for 2^31 */
#define BIAS	64	/* PERCPU_COUNT_BIAS */
#define ROUNDS	4
#ifdef MUTANT_IGNORE_FOLDED
#define IGNORING_FOLDED 1
#else
#define IGNORING_FOLDED 0
#endif

byte words;		/* the per-CPU words' net, modulo M */
byte uw;		/* unitless_word's net, modulo M */
bit uw_closed;		/* UNITLESS_FOLDED */
bit atomic_mode;
short count = BIAS + 2;	/* atomic count: per-CPU, bias + the two below */
short held = 2;		/* references truly held: the initial one, the user's */
byte released;
bit user_done;

/* An atomic-count add of d, with its release. */
inline count_add(d)
{
	atomic {
		count = count + d;
		held = held + d;
		assert(count == 0 || count >= 1);
		if
		:: count == 0 -> assert(held == 0); released++
		:: else -> skip
		fi
	}
}

/* A caller with a unit: the rseq commit or the fallback reader's add. */
inline unit_add(d)
{
	if
	:: atomic { !atomic_mode -> words = (words + M + d) % M; held = held + d }
	:: atomic { atomic_mode -> skip }; count_add(d)
	fi
}

/* A caller without a unit: unitless_add(), else the atomic count. */
inline unitless_add(d)
{
	seen_atomic = atomic_mode;
#ifdef MUTANT_NO_MODE_CHECK
	seen_atomic = 0;
#endif
	do
	:: seen = uw; seen_closed = uw_closed;
#if defined(MUTANT_ATOMIC_COUNT)
		count_add(d); break
#else
		if
		:: seen_atomic -> count_add(d); break
#ifndef MUTANT_IGNORE_FOLDED
		:: !seen_atomic && seen_closed -> count_add(d); break
#endif
		:: !seen_atomic && (!seen_closed || IGNORING_FOLDED) ->
			atomic {
				if
				:: uw == seen && uw_closed == seen_closed ->
					uw = (uw + M + d) % M;
					held = held + d;
					landed = 1
				:: else -> skip
				fi
			};
			if
			:: landed -> landed = 0; break
			:: else -> skip
			fi
		fi
#endif
	od
}

active proctype user()
{
	byte n, seen;
	bit seen_atomic, seen_closed, landed;

	do
	:: n < ROUNDS ->
		if
		:: unit_add(1); unitless_add(-1)
		:: unitless_add(1); unit_add(-1)
		fi;
		n++
	:: else -> break
	od;
	/* Its own reference, which it made the crossings under. */
	if
	:: unit_add(-1)
	:: unitless_add(-1)
	fi;
	user_done = 1
}

/* start_atomic_switch(), the fence, fold_percpu_counts(). */
inline to_atomic_and_fold()
{
	atomic { atomic_mode = 1; count++; held++ };
#ifdef MUTANT_FOLD_LOAD
	taken = uw;
	atomic { uw = 0; uw_closed = 1 };
#else
	atomic { taken = uw; uw = 0; uw_closed = 1 };
#endif
	atomic {
		net = (words + taken) % M;
		if
		:: net >= M / 2 -> net = net - M
		:: else -> skip
		fi;
		count = count + net - BIAS;
		assert(count == held)
	}
}

active proctype switcher()
{
	short net;
	byte taken;

	/* switch_to_atomic_sync: fold, the extra reference dropped. */
	to_atomic_and_fold();
	count_add(-1);
	/* switch_to_percpu_locked(). */
#ifdef MUTANT_NO_REOPEN
	atomic { count = count + BIAS; words = 0; atomic_mode = 0 };
#else
	atomic { count = count + BIAS; words = 0; uw = 0; uw_closed = 0; atomic_mode = 0 };
#endif
	/* kill: fold, the extra reference, the initial one. */
	to_atomic_and_fold();
	count_add(-1);
	count_add(-1);
	user_done;
	assert(released == 1 && held == 0)
}
