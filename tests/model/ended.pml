/* SPDX-License-Identifier: MIT */
/*
 * ended.pml - the wait for a switch in flight on a stripe's `ended` futex
 * word (src/percpu_ref.c, wait_switch_ended() and switch_ended()).
 *
 * A waiter, its stripe held and its ref's switch found in flight, reads
 * `ended`, stores it back with SWITCH_WAITERS set, drops the stripe and
 * sleeps on the futex while the word still holds that value; woken (or the
 * value changed), it takes the stripe back and looks at its ref again.
 * Whoever ends a switch, under the stripe, stores (old + 1) with the flag
 * clear and wakes every sleeper if the flag was set.  Refs that share the
 * stripe share the word, so a waiter may be woken for another ref's switch
 * and sleep again.
 *
 * Modelled: REFS refs on one stripe; each has an ender that starts and
 * ends SWITCHES switches in turn (the switch's owner: the callback thread,
 * a synchronous switch's finish, the reclaimer) and a waiter that, at any
 * moment, waits until its ref has no switch in flight.  The counter has
 * BITS bits (the code has 31), so that SPIN reaches its wrap: a sleeper's
 * value may come back (ABA) after 2^BITS ends.  The futex has no spurious
 * wake-ups and no timeout (those only hide a lost wake-up); the stripe is
 * a plain mutex (its fork gate: gate.pml).  A sleeper nobody wakes, once
 * every switch has ended, is an invalid end state.
 *
 * Found: the search passes with BITS 1, and with BITS 0 (no counter at
 * all): a sleeper's value carries SWITCH_WAITERS, and the flag in the word
 * means a waiter whose switch is still in flight, whose end wakes every
 * sleeper.  So the wrap of the 31 bits cannot lose a wake-up; an ABA only
 * keeps a waiter asleep past its own ref's end until the next end on the
 * stripe.
 *
 * Mutants, each found by SPIN:
 * -DMUTANT_NO_WAITERS_BIT: the waiter does not set SWITCH_WAITERS; the
 *  ender, which wakes only for it, wakes nobody: invalid end state.
 * -DMUTANT_READ_UNLOCKED: the waiter reads the word after dropping the
 *  stripe; an end in between is missed: invalid end state.
 * -DMUTANT_WAKE_ONE: the ender wakes one sleeper, maybe another ref's
 *  waiter, which sleeps again: invalid end state.
 */

#ifndef REFS
#define REFS 2
#endif
#ifndef SWITCHES
#define SWITCHES 2
#endif
#ifndef BITS
#define BITS 1
#endif
#define CMASK ((1 << BITS) - 1)
#define WAITERS (1 << BITS)

byte ended;		/* low BITS bits: the count; bit BITS: SWITCH_WAITERS */
bit stripe;
bit flight[REFS];
bit asleep[REFS];	/* waiter r sleeps in the kernel's futex queue */

inline lock(l)
{
	atomic { !l -> l = 1 }
}

inline unlock(l)
{
	l = 0
}

/* switch_ended(), stripe held */
inline switch_ended()
{
	byte old, k;

	old = ended;
	ended = ((old & CMASK) + 1) & CMASK;
#ifdef MUTANT_WAKE_ONE
	if
	:: (old & WAITERS) ->
		atomic {
			if
			:: asleep[0] -> asleep[0] = 0
			:: asleep[1] -> asleep[1] = 0
			:: else -> skip
			fi
		}
	:: else -> skip
	fi
#else
	if
	:: (old & WAITERS) ->
		atomic {
			k = 0;
			do
			:: k < REFS -> asleep[k] = 0; k++
			:: else -> break
			od
		}
	:: else -> skip
	fi
#endif
}

proctype ender(byte r)
{
	byte n;

	for (n : 1 .. SWITCHES) {
		lock(stripe);
		flight[r] = 1;		/* start_atomic_switch() */
		unlock(stripe);
		lock(stripe);		/* finish_atomic_switch() */
		flight[r] = 0;
		switch_ended();
		unlock(stripe)
	}
}

proctype waiter(byte r)
{
	byte seen;

	lock(stripe);
	do
	:: !flight[r] -> break
	:: else ->		/* wait_switch_ended() */
#ifdef MUTANT_READ_UNLOCKED
		unlock(stripe);
		seen = ended | WAITERS;
		ended = seen;
#else
#ifdef MUTANT_NO_WAITERS_BIT
		seen = ended;
#else
		seen = ended | WAITERS;
		ended = seen;
#endif
		unlock(stripe);
#endif
		/* percpuref_futex_wait(): compare and queue atomically */
		atomic {
			if
			:: ended == seen -> asleep[r] = 1
			:: else -> skip
			fi
		}
		!asleep[r];
		lock(stripe)
	od;
	unlock(stripe)
}

init
{
	byte i;

	atomic {
		for (i : 0 .. REFS - 1) {
			run ender(i);
			run waiter(i)
		}
	}
}
