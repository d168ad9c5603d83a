/* SPDX-License-Identifier: MIT */
/*
 * wakeup.pml - Model E: a push that meets the library's thread going to
 * sleep is never left unseen.
 *
 * Two library threads sleep without a timeout while they have nothing to
 * do and are woken by whoever gives them work, with no lock on the pusher's
 * side unless the thread may be asleep: the callback thread (src/deferred.c:
 * pending, thread_sleeping) and the reclaimer (src/managed.c: list_head,
 * kick_needed).  Both follow one protocol:
 *   thread, with its mutex held, the list found empty:
 *       flag = 1; if the list is still empty, cond_wait; flag = 0
 *   pusher:
 *       push (CAS on the list head); if flag: lock, unlock, signal
 * The flag, the re-read and the push are sequentially consistent (SPIN's
 * interleaving), and the thread holds the mutex from setting the flag until
 * cond_wait releases it.  The pusher signals after unlocking, as
 * deferred.c does; managed.c signals before it, which wakes a thread that
 * is certainly waiting too.
 *
 * Stopping (the callback thread's, src/deferred.c): a stopper (shutdown,
 * exit()) sets stopping, signals and joins the thread.  The thread, seeing
 * stopping, sets the flag as before sleeping and exits at once, whatever is
 * queued: waiting for an empty list hung shutdown and exit() while another
 * thread kept pushing.  A push after the flag owes a wake-up, and its
 * pusher, finding no thread running, starts one; a push before it may have
 * found the thread awake and signalled nobody, so the stopper, once the
 * thread is gone, starts a new thread if the list is not empty.  (The
 * reclaimer's stopper scans the list itself afterwards: stop.pml.)
 *
 * Modelled: PUSHERS threads each push ITEMS items and one stopper stops the
 * thread once, at any point; the thread takes the whole list at a time
 * (with the mutex dropped, as both do while they run a batch or a scan).
 * A pusher reads "running" and then the flag, as deferred.c does; its
 * relaxed read of "running" may see true after the thread cleared it.  The
 * condition variable has no spurious wake-ups: those would only hide a
 * lost one.  Each pusher waits until every item has been taken, so a push
 * left unseen leaves the pushers waiting for ever: an invalid end state.
 * The thread's sleep is a valid end state once everything is taken.
 *
 * Mutants: -DMUTANT_NO_RECHECK: the thread sleeps without re-reading the
 * list after setting the flag.  A push between its first read and the flag
 * finds the flag clear and signals nobody: SPIN finds the pushers stuck.
 * -DMUTANT_NO_RESTART: the stopper does not look at the list after the
 * join; a last push that found the stopping thread awake is stranded.
 * -DMUTANT_STOP_NO_FLAG: the stopping thread exits without setting the
 * flag; a push after it that reads the relaxed "running" stale (true)
 * finds the flag clear and starts nobody.
 */

#define PUSHERS	2
#define ITEMS	2

byte list;		/* items pushed and not yet taken */
byte taken;		/* items the thread took */
bit flag;		/* kick_needed / thread_sleeping */
bit locked;		/* the thread's mutex */
bit waiting;		/* the thread is blocked in cond_wait */
bit running = 1;	/* a thread runs (thread.running) */
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

/* The mutex held (ensure_thread()). */
inline ensure_thread()
{
	if
	:: !running ->
		running = 1;
		stopping = 0;
		flag = 0;
		run library_thread()
	:: else -> skip
	fi
}

active proctype library_thread()
{
	lock();
	do
	:: stopping ->
		/* As before sleeping (the flag taken back if the list is not
		 * empty), then exit: the mutex is held until running is
		 * clear; a join returns once the thread has ended. */
#ifndef MUTANT_STOP_NO_FLAG
		flag = 1;
		if
		:: list > 0 -> flag = 0
		:: else -> skip
		fi;
#endif
		running = 0;
		unlock();
		exits++;
		break
	:: !stopping && list > 0 ->
		/* A batch or a scan: the mutex dropped meanwhile. */
		unlock();
		atomic { taken = taken + list; list = 0 };
		lock()
	:: !stopping && list == 0 ->
		flag = 1;
#ifndef MUTANT_NO_RECHECK
		if
		:: list > 0 -> skip
		:: list == 0 ->
#endif
			/* cond_wait: releases the mutex and waits, one step. */
			atomic { locked = 0; waiting = 1 };
end_asleep:		!waiting;
			lock();
#ifndef MUTANT_NO_RECHECK
		fi;
#endif
		flag = 0
	od
}

active [PUSHERS] proctype pusher()
{
	byte i;
	bit owed;

	for (i : 1 .. ITEMS) {
		atomic { list++ };
		/* deferred.c: !thread.running || thread_sleeping.  Running
		 * is read relaxed: a stopped thread may still read as
		 * running, and then only the flag tells. */
		if
		:: !running -> owed = 1
		:: true ->
			if
			:: flag -> owed = 1
			:: else -> owed = 0
			fi
		fi;
		if
		:: owed ->
			lock();
			ensure_thread();
			unlock();
			waiting = 0	/* cond_signal */
		:: else -> skip
		fi
	}
	/* Every item must be taken: a lost wake-up blocks here. */
	taken == PUSHERS * ITEMS
}

/* percpuref_stop_thread(), then percpuref_deferred_stop()'s look. */
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
		exits > seen	/* pthread_join */
	:: else -> unlock()
	fi;
	lock();
#ifndef MUTANT_NO_RESTART
	if
	:: list > 0 -> ensure_thread()
	:: else -> skip
	fi;
#endif
	unlock()
}
