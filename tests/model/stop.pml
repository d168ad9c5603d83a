/* SPDX-License-Identifier: MIT */
/*
 * stop.pml - Model N: a push that races the reclaimer's stop is scanned,
 * by the stopper's drain or by a thread the push starts.
 *
 * percpuref_shutdown() stops the reclaimer (src/managed.c: stop_thread(),
 * the thread's exit in reclaimer_main()) and then scans the list itself
 * (drain()).  A pusher (percpuref_managed_push(), then
 * percpuref_managed_kick()) CASes the list or its CPU's stage and then
 * reads kick_needed: true takes the lock and starts a thread if none runs
 * (ensure_thread()), false trusts the running thread to scan it.  The
 * thread keeps kick_needed false while it runs, and as it stops sets it
 * true (an exchange; the stopper fences before the drain), so that a push
 * after the stop starts a new thread and a push before it is seen by the
 * drain.
 *
 * SPIN interleaves sequentially consistently, which is what the exchange
 * and the fence give this pair.  The store that was there was relaxed:
 * C11 let a pusher read the old false after the drain had looked at the
 * list (no happens-before from the store to the pusher's load, and the
 * drain's looks at the stages are relaxed).  The mutant models that store
 * as two copies of the flag: the thread and the stopper see the new value
 * at once, pushers only when a propagation step runs, at any later point.
 *
 * Modelled: PUSHERS threads each push ITEMS items; the thread takes the
 * whole list at a time with the lock dropped (a scan), and sleeps idle as
 * in wakeup.pml (flag set, the list re-read, cond_wait); one stopper stops
 * it once and drains.  Each pusher waits until every item has been
 * taken, so an item left unseen with no thread running leaves the pushers
 * waiting for ever: an invalid end state.
 *
 * Mutants (each must fail):
 *  -DMUTANT_RELAXED_EXIT: the stop's store of the flag reaches pushers
 *   late (the relaxed store that was in managed.c): a push after the
 *   drain reads the old false and starts no thread.
 *  -DMUTANT_EXIT_NO_FLAG: the stop leaves the flag false: a push after it
 *   starts no thread.
 *  -DMUTANT_NO_DRAIN: the stopper does not scan after the join: a push
 *   that found the thread running, before its stop, is stranded.
 */

#define PUSHERS	2
#define ITEMS	2

byte list;		/* items pushed and not yet taken */
byte taken;		/* items scanned */
bit flag = 0;		/* kick_needed, as the thread and the stopper see it */
bit pusher_flag = 0;	/* kick_needed, as the pushers see it */
bit propagating;	/* a store to flag not yet seen by pushers (mutant) */
bit locked;		/* managed_lock */
bit waiting;		/* the thread is blocked in cond_wait */
bit running = 1;	/* thread.running */
bit stopping;		/* thread.stopping */
byte exits;		/* threads ended: what a join waits for */

inline lock()
{
	atomic { !locked -> locked = 1 }
}

inline unlock()
{
	locked = 0
}

/* A store every thread sees at once (seq_cst, or relaxed under the lock
 * and read only under it before a seq_cst step). */
inline set_flag(v)
{
	atomic { flag = v; pusher_flag = v }
}

/* The lock held (ensure_thread()): a new thread starts awake. */
inline ensure_thread()
{
	if
	:: !running ->
		running = 1;
		stopping = 0;
		set_flag(0);
		run reclaimer()
	:: else -> skip
	fi
}

#ifdef MUTANT_RELAXED_EXIT
/* The relaxed store's value reaches the pushers at some later step. */
active proctype propagation()
{
end_idle:
	do
	:: atomic { propagating -> pusher_flag = flag; propagating = 0 }
	od
}
#endif

active proctype reclaimer()
{
	lock();
	do
	:: stopping ->
#ifndef MUTANT_EXIT_NO_FLAG
#ifdef MUTANT_RELAXED_EXIT
		atomic { flag = 1; propagating = 1 };
#else
		set_flag(1);	/* exchange; the stopper's fence */
#endif
#endif
		running = 0;
		unlock();
		exits++;
		break
	:: !stopping && list > 0 ->
		/* A scan: the lock dropped meanwhile. */
		unlock();
		atomic { taken = taken + list; list = 0 };
		lock()
	:: !stopping && list == 0 ->
		/* Idle (wakeup.pml): the flag, the list re-read, cond_wait. */
		set_flag(1);
		if
		:: list > 0 -> skip
		:: list == 0 ->
			atomic { locked = 0; waiting = 1 };
end_asleep:		!waiting;
			lock()
		fi;
		set_flag(0)
	od
}

active [PUSHERS] proctype pusher()
{
	byte i;

	for (i : 1 .. ITEMS) {
		atomic { list++ };
		/* percpuref_managed_kick(). */
		if
		:: pusher_flag ->
			lock();
			ensure_thread();
			unlock();
			waiting = 0	/* cond_signal */
		:: else -> skip
		fi
	}
	/* Every item must be scanned: one left unseen blocks here. */
	taken == PUSHERS * ITEMS
}

/* percpuref_shutdown(): stop_thread(), then drain(). */
active proctype stopper()
{
	byte seen;

	lock();
	if
	:: running && !stopping ->
		stopping = 1;
		seen = exits;
		waiting = 0;	/* cond_signal */
		unlock();
		exits > seen	/* the join */
	:: else -> unlock()
	fi;
#ifndef MUTANT_NO_DRAIN
	/* A pass of its own over the list and every stage. */
	atomic { taken = taken + list; list = 0 }
#endif
}
