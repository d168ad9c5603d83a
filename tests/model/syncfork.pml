/* SPDX-License-Identifier: MIT */
/*
 * syncfork.pml - a fork amid synchronous switches: the sync-switch rwlock
 * and its fork gate (src/percpu_ref.c, lock_for_sync_switch(),
 * percpu_ref_switch_to_atomic_sync(), sync_switch_fork_lock/unlock/child()),
 * with the stripe lock's own fork gate (gate.pml) at the later rank.
 *
 * A synchronous switch takes its ref's stripe (lock_stripe(): the lock,
 * then fork_pending), reads sync_switch_fork_waiting (relaxed) and, if it
 * is down, try-read-locks sync_switch_lock; if either says no it lets go
 * of the stripe, sleeps on sync_switch_fork_gate and starts over.  Having
 * both, it marks its switch in flight, drops the stripe, fences (the lock
 * dropped), takes the stripe back to finish (the fold, switch_ended()),
 * drops it and only then read-unlocks; its @release runs after that and
 * may fork.  A fork's prepare at rank SYNC_SWITCH takes the gate, raises
 * the flag and write-locks; at rank SWITCH it takes fork_gate, raises
 * fork_pending and waits for the stripe word to read unlocked; then the
 * process forks.  The parent's handlers run in reverse rank order; the
 * child's re-initialise the rwlock, lower the flag, unlock the gate, and
 * unlock a stripe word a stepping-back thread left locked.
 *
 * The rwlock is glibc's default kind (PTHREAD_RWLOCK_PREFER_READER_NP):
 * a try-read-lock fails only while a writer holds the lock, never for a
 * writer that waits, which is why the gate and flag exist.  A relaxed
 * flag is modelled sequentially consistent but read in a step of its own,
 * before the try-lock, so a switch may read it down and enter after the
 * fork raised it.
 *
 * Modelled: THREADS switching threads, all refs on one stripe (the worst
 * case), each looping any number of times; one of them may fork from its
 * @release (RELEASE_FORKS, default on), and one more thread forks once at
 * any moment, so two forks may overlap.  Not modelled: the asynchronous
 * switches and batch locks (gate.pml), wait_switch_done()'s sleep on
 * `ended` (ended.pml), lock_unmanaged()'s refusal, memory orders weaker
 * than SC for the seq_cst accesses.
 *
 * Asserted at each fork: no thread between its read lock and its read
 * unlock, none inside a stripe section, no synchronous switch in flight,
 * and the child's copy lets its only thread switch at once (stripe
 * unlocked, rwlock free, flag down, gate free).  Asserted while a fork
 * waits for the write lock: at most THREADS read locks are taken after it
 * began to wait (each by a switch that read the flag before it rose), so
 * a stream of switches cannot starve the fork.  Checked: no deadlock
 * (invalid end state).
 *
 * Mutants, each found by SPIN:
 * -DMUTANT_NO_FLAG: switches ignore sync_switch_fork_waiting; glibc's
 *  reader preference lets looping switches hold the fork off: (late<=THREADS).
 * -DMUTANT_FLAG_BEFORE_GATE: the fork raises the flag before it takes the
 *  gate; the first fork's end lowers the second's flag: (late<=THREADS).
 * -DMUTANT_BLOCKING_RDLOCK: pthread_rwlock_rdlock() under the stripe
 *  instead of the try: the fork holds the write lock and waits for the
 *  stripe, the switch holds the stripe and waits for the read lock:
 *  invalid end state.
 * -DMUTANT_UNLOCK_BEFORE_FINISH: the read unlock right after the fence,
 *  before the finish: a fork copies a switch in flight: (in_flight==0).
 * -DMUTANT_RELEASE_UNDER_RDLOCK: @release (which forks) runs before the
 *  read unlock: the fork waits for its own thread's read lock: invalid end
 *  state.
 * -DMUTANT_CHILD_UNLOCK: the child's handler unlocks the rwlock instead of
 *  re-initialising it; glibc's unlock from a thread that is not the
 *  recorded writer takes it for a reader's: (child_writer==0).
 * -DMUTANT_CHILD_KEEPS_FLAG: the child's handler leaves the flag raised:
 *  its switches step back for ever: (child_flag==0).
 */

#ifndef THREADS
#define THREADS 2
#endif
#ifndef RELEASE_FORKS
#define RELEASE_FORKS 1
#endif

/* sync_switch_lock, glibc default kind */
byte readers;
bit writer;
/* sync_switch_fork_gate, sync_switch_fork_waiting */
bit sync_gate;
bit sync_flag;
/* the stripe lock and its fork gate (gate.pml) */
bit stripe;
bit fork_gate;
bit fork_pending;
byte inside;		/* threads inside a stripe section */
byte in_rdlock;		/* threads between read lock and read unlock */
byte in_flight;		/* synchronous switches started, not finished */
bit fork_waits;		/* a fork holds the gate, waits for the write lock */
byte late;		/* read locks taken while fork_waits */

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
	:: lock(stripe);
		if
		:: !fork_pending -> inside++; break
		:: else -> unlock(stripe); lock(fork_gate); unlock(fork_gate)
		fi
	od
}

inline drop_stripe()
{
	atomic { inside--; stripe = 0 }
}

inline got_rdlock()
{
	in_rdlock++;
	if
	:: fork_waits -> late++; assert(late <= THREADS)
	:: else -> skip
	fi
}

/* fork() with the library's handlers (runtime.c, fork_prepare() etc.) */
inline do_fork()
{
	/* rank SYNC_SWITCH: sync_switch_fork_lock() */
#ifdef MUTANT_FLAG_BEFORE_GATE
	sync_flag = 1;
	lock(sync_gate);
#else
	lock(sync_gate);
	sync_flag = 1;
#endif
	atomic { fork_waits = 1; late = 0 };
	atomic { !writer && readers == 0 -> writer = 1; fork_waits = 0 };
	/* rank SWITCH: switch_fork_lock() */
	lock(fork_gate);
	fork_pending = 1;
	stripe == 0;
	atomic {
		/* fork(), then the child's handlers and its first switch */
		assert(inside == 0);
		assert(in_rdlock == 0);
		assert(in_flight == 0);
		child_stripe = 0;	/* switch_fork_child() */
#ifdef MUTANT_CHILD_UNLOCK
		child_writer = writer;
#else
		child_writer = 0;	/* pthread_rwlock_init() */
#endif
#ifdef MUTANT_CHILD_KEEPS_FLAG
		child_flag = sync_flag;
#else
		child_flag = 0;
#endif
		assert(child_stripe == 0);
		assert(child_writer == 0);
		assert(child_flag == 0);
	}
	/* parent handlers, reverse rank order */
	fork_pending = 0;
	unlock(fork_gate);
	writer = 0;		/* sync_switch_fork_unlock() */
	sync_flag = 0;
	unlock(sync_gate)
}

proctype switcher(bit release_forks)
{
	bit ok;
	bit child_stripe, child_writer, child_flag;

	do
	:: take_stripe();	/* lock_unmanaged() */
		/* lock_for_sync_switch() */
#ifdef MUTANT_NO_FLAG
		if
		:: true ->
#else
		if
		:: sync_flag -> ok = 0
		:: else ->
#endif
#ifdef MUTANT_BLOCKING_RDLOCK
			atomic { !writer -> readers++; ok = 1; got_rdlock() }
#else
			atomic {
				if
				:: !writer -> readers++; ok = 1; got_rdlock()
				:: else -> ok = 0
				fi
			}
#endif
		fi;
		if
		:: ok ->
			in_flight++;	/* start_atomic_switch() */
			drop_stripe();
			/* percpuref_fence_readers() */
#ifdef MUTANT_UNLOCK_BEFORE_FINISH
			atomic { readers--; in_rdlock-- };
#endif
			take_stripe();	/* finish_atomic_switch() */
			in_flight--;
			drop_stripe();
#ifdef MUTANT_RELEASE_UNDER_RDLOCK
			if
			:: release_forks -> do_fork()
			:: else -> skip
			fi;
#endif
#ifndef MUTANT_UNLOCK_BEFORE_FINISH
			atomic { readers--; in_rdlock-- };
#endif
#ifndef MUTANT_RELEASE_UNDER_RDLOCK
			/* run_release(): a @release that forks */
			if
			:: release_forks -> do_fork()
			:: else -> skip
			fi
#endif
		:: else ->
			drop_stripe();
			lock(sync_gate);
			unlock(sync_gate)
		fi
	:: break
	od
}

proctype forker()
{
	bit child_stripe, child_writer, child_flag;

	do_fork()
}

init
{
	byte i;

	atomic {
		for (i : 1 .. THREADS) {
			run switcher(RELEASE_FORKS && i == 1)
		}
		run forker()
	}
}
