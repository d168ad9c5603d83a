/* SPDX-License-Identifier: MIT */
/*
 * gate.pml - Model K: a fork amid switch sections, with no stripe taken
 * by the fork (src/percpu_ref.c, lock_stripe(), wait_switch_ended() and
 * switch_fork_lock()).
 *
 * A thread takes its ref's stripe (a compare-and-swap of the lock word)
 * and then reads fork_pending; if the flag is up it lets go of the stripe,
 * having touched nothing under it, waits for the fork (fork_gate, which
 * the fork holds), and tries again.  A fork's prepare, after the locks of
 * earlier ranks (here the callback thread's batch lock), takes fork_gate,
 * raises fork_pending and reads the lock word until it reads unlocked;
 * then the process forks.  No thread of the parent may be inside a
 * section then (the child has none of them, and a section's writes would
 * be half done there); a lock word the child finds locked is a thread's
 * that was stepping back, and the child's handler unlocks it.  A thread
 * whose ref has a switch in flight waits for it with the stripe dropped,
 * and takes it back the same way; the callback thread ends the switch
 * under its batch lock and the stripe.
 *
 * Modelled: two threads and the callback thread, one stripe, one switch in
 * flight that the threads may wait for, and one fork at any moment.
 * SPIN's interleaving is sequentially consistent, as the code's seq_cst
 * compare-and-swap, store and loads make it (Dekker's pattern).
 *
 * Asserted at the fork: no thread inside a section, and the child's lock
 * word unlocked once its handler ran.  Checked: no deadlock (an invalid
 * end state).
 *
 * Mutants, each found by SPIN:
 * -DMUTANT_CHECK_FIRST: the flag is read before the stripe is taken: a
 * fork that raises it in between reads the word unlocked and forks while
 * the thread is inside.
 * -DMUTANT_RELOCK_UNCHECKED: a waiter takes the stripe back without
 * reading the flag (what pthread_cond_wait() does with its mutex, why the
 * waits sleep on a futex word): a fork that read the word unlocked while
 * the waiter slept forks with it inside.
 * -DMUTANT_NO_CHILD_UNLOCK: the child keeps the lock word as the fork
 * found it: locked, when a thread was stepping back, and nobody there
 * will unlock it.
 */

#define THREADS	2

bit fork_pending;
bit fork_gate;
bit batch;		/* the callback thread's batch lock: an earlier rank */
bit stripe;		/* the lock word */
byte inside;		/* threads inside a section */
bit ended;		/* the switch in flight ended */

inline lock(l)
{
	atomic { !l -> l = 1 }
}

inline unlock(l)
{
	l = 0
}

/* lock_stripe() */
inline take_stripe()
{
	do
#ifdef MUTANT_CHECK_FIRST
	:: !fork_pending -> lock(stripe); inside++; break
	:: fork_pending -> lock(fork_gate); unlock(fork_gate)
#else
	:: lock(stripe);
		if
		:: !fork_pending -> inside++; break
		:: else -> unlock(stripe); lock(fork_gate); unlock(fork_gate)
		fi
#endif
	od
}

inline drop_stripe()
{
	atomic { inside--; stripe = 0 }
}

proctype thread()
{
	take_stripe();
	if
	:: !ended ->		/* wait_switch_ended() */
		drop_stripe();
		ended;
#ifdef MUTANT_RELOCK_UNCHECKED
		lock(stripe);
		inside++;
#else
		take_stripe();
#endif
	:: else -> skip
	fi;
	drop_stripe()
}

proctype callback()
{
	lock(batch);
	take_stripe();
	ended = 1;		/* switch_ended() */
	drop_stripe();
	unlock(batch)
}

proctype forker()
{
	bit child_stripe;

	lock(batch);		/* the earlier ranks' prepare */
	lock(fork_gate);	/* switch_fork_lock() */
	fork_pending = 1;
	stripe == 0;
	atomic {		/* fork(), and the child's handler */
		assert(inside == 0);
		child_stripe = stripe;
#ifndef MUTANT_NO_CHILD_UNLOCK
		child_stripe = 0;
#endif
		assert(child_stripe == 0)
	}
	fork_pending = 0;	/* switch_fork_unlock() */
	unlock(fork_gate);
	unlock(batch)
}

init
{
	byte i;

	atomic {
		for (i : 1 .. THREADS) {
			run thread()
		}
		run callback();
		run forker()
	}
}
