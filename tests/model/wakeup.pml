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
 * Modelled: PUSHERS threads each push ITEMS items; the thread takes the
 * whole list at a time (with the mutex dropped, as both do while they run
 * a batch or a scan).  The condition variable has no spurious wake-ups:
 * those would only hide a lost one.  Each pusher waits until every item has
 * been taken, so a push left unseen leaves the thread asleep and the
 * pushers waiting for ever: an invalid end state.  The thread's sleep is a
 * valid end state once everything is taken.
 *
 * Mutant (-DMUTANT_NO_RECHECK): the thread sleeps without re-reading the
 * list after setting the flag.  A push between its first read and the flag
 * finds the flag clear and signals nobody: SPIN finds the pushers stuck.
 */

#define PUSHERS	2
#define ITEMS	2

byte list;		/* items pushed and not yet taken */
byte taken;		/* items the thread took */
bit flag;		/* kick_needed / thread_sleeping */
bit locked;		/* the thread's mutex */
bit waiting;		/* the thread is blocked in cond_wait */

inline lock()
{
	atomic { !locked -> locked = 1 }
}

inline unlock()
{
	locked = 0
}

active proctype library_thread()
{
	lock();
	do
	:: list > 0 ->
		/* A batch or a scan: the mutex dropped meanwhile. */
		unlock();
		atomic { taken = taken + list; list = 0 };
		lock()
	:: list == 0 ->
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

	for (i : 1 .. ITEMS) {
		atomic { list++ };
		if
		:: flag ->
			lock();
			unlock();
			waiting = 0	/* cond_signal */
		:: else -> skip
		fi
	}
	/* Every item must be taken: a lost wake-up blocks here. */
	taken == PUSHERS * ITEMS
}
