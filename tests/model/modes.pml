/* SPDX-License-Identifier: MIT */
/*
 * modes.pml - Model F: mode calls, kill and managed mode under the switch
 * lock, with a switch in flight.
 *
 * Every mode change of a ref goes through its switch lock (a stripe of
 * src/percpu_ref.c), and a call that finds a switch in flight waits for it
 * on the stripe's futex word, with the lock dropped.  The reclaimer
 * owns the mode and the initial reference of a managed ref, so kill and the
 * mode calls refuse one; and a check of a managed ref starts from per-CPU
 * with no switch in flight (percpuref_managed_begin()).  Both hold only if
 * a call decides "not managed" under the same hold of the lock as its
 * action: lock_unmanaged() waits for the switch in flight itself and tests
 * again after the wait.
 *
 * Modelled, each step as in the code:
 *  - the ref starts with the creator's reference and an asynchronous
 *    switch to atomic in flight (an earlier percpu_ref_switch_to_atomic()
 *    whose confirm has not run);
 *  - the callback thread finishes asynchronous switches
 *    (finish_atomic_switch(): lock, fold, unlock, confirm, lock, drop the
 *    switch's reference, clear the in-flight mark, broadcast, unlock);
 *  - one caller makes one of the mode calls, chosen by SPIN: kill,
 *    switch_to_atomic, switch_to_atomic_sync (which finishes its own
 *    switch) or switch_to_percpu;
 *  - another calls switch_to_managed, then, or not, puts the creator's
 *    reference (the managed contract), then, or not, switch_to_unmanaged;
 *  - the reclaimer checks the ref SCANS times while they run (exact check:
 *    begin under the lock, fence, finish under the lock; the filter, which
 *    only skips, is filter.pml's) and once more after the creator has put
 *    its reference;
 *  - the creator puts its reference once the calls are done, unless the
 *    kill or the managing caller dropped it.
 * The count is the exact number of references (the fold is fold.pml's); a
 * put reaches the release only in atomic mode.  The fence is one step.
 *
 * Asserted:
 *  - kill never kills a managed ref, and no call starts a switch of one;
 *  - a check starts from per-CPU, live, with no switch in flight;
 *  - @release runs at most once, at count zero;
 *  - at the end no reference is left, and the ref was released if it was
 *    killed, atomic or managed (a managed ref nobody holds is released by
 *    the reclaimer; an unmanaged per-CPU one is never released, as in the
 *    kernel).
 *
 * Mutants (each must fail):
 *  -DMUTANT_TEST_BEFORE_WAIT: lock_unmanaged() as it was before commit
 *   621435a, testing "not managed" once, before the caller's own wait for
 *   the switch in flight.  A switch_to_managed() that takes the lock during
 *   that wait makes the ref managed, and the call goes on with it: SPIN
 *   finds the kill of a managed ref.
 *  -DMUTANT_MANAGE_NO_WAIT: switch_to_managed() without its wait: the ref
 *   becomes managed with a switch to atomic in flight, and the reclaimer's
 *   check starts on it.
 *  -DMUTANT_UNMANAGE_NO_WAIT: switch_to_unmanaged() without its wait: it
 *   puts the manager's reference while a check holds the ref atomic, and
 *   the check's CAS then releases the ref under the creator's reference.
 *  -DMUTANT_UNMANAGE_DEAD: switch_to_unmanaged() without its test for a ref
 *   the reclaimer released: after the creator dropped its reference, it
 *   puts the manager's reference of a released ref, below zero.
 */

#define NCALLERS	2	/* mode callers */
#define SCANS	2

#define KILL	0
#define ATOMIC	1
#define SYNC	2
#define PERCPU	3

bit locked;			/* the ref's switch lock */
bit in_flight = 1;		/* data->confirm_switch != NULL */
bit async_switch = 1;		/* the callback thread finishes the one in flight */
bit atomic_mode = 1;		/* __PERCPU_REF_ATOMIC */
bit dead;			/* __PERCPU_REF_DEAD */
bit force_atomic = 1;
bit managed;
byte count = 2;			/* the creator's and the switch's */
byte released;

/* Ghosts. */
bit creator_holds = 1;		/* the initial reference */
byte calls_done;
bit creator_done;
bit scans_done;
bit reclaimer_done;

inline lock()
{
	atomic { locked == 0 -> locked = 1 }
}

inline unlock()
{
	locked = 0
}

inline release()
{
	assert(released == 0);
	assert(count == 0);
	assert(!creator_holds);
	released++
}

/* wait_switch_done(), from a thread that is no callback: the condition
 * variable drops the lock until a broadcast, and the loop tests again. */
inline wait_switch_done()
{
	do
	:: !in_flight -> break
	:: else ->
		unlock();
		!in_flight;
		lock()
	od
}

/* start_atomic_switch(); sets started. */
inline start_atomic_switch(async)
{
	assert(!managed);
	if
	:: atomic_mode -> started = 0
	:: else ->
		atomic_mode = 1;
		in_flight = 1;
		async_switch = async;
		count++;		/* the switch's reference */
		started = 1
	fi
}

/* switch_to_percpu_locked() (every ref here allows reinit). */
inline to_percpu()
{
	atomic_mode = 0
}

/* The second half of finish_atomic_switch(), lock held: drop the
 * switch's reference (one atomic subtract and test), end the switch. */
inline drop_switch_ref()
{
	atomic {
		count--;
		if
		:: count == 0 -> release()
		:: else
		fi
	};
	in_flight = 0
}

/* lock_unmanaged(); sets ok, with the lock held when ok. */
inline lock_unmanaged()
{
	lock();
#ifdef MUTANT_TEST_BEFORE_WAIT
	ok = !managed;
#else
	ok = 0;
	if
	:: !managed ->
		wait_switch_done();
		ok = !managed
	:: else
	fi;
#endif
	if
	:: !ok -> unlock()
	:: else
	fi
}

/* switch_mode_locked(), lock held: wait, then go where force_atomic and
 * DEAD say. */
inline switch_mode_locked(force)
{
	wait_switch_done();
	force_atomic = force;
	if
	:: force_atomic || dead -> start_atomic_switch(1)
	:: else -> to_percpu()
	fi
}

/* percpu_ref_put() of a user: a per-CPU put cannot release. */
inline put()
{
	atomic {
		count--;
		if
		:: atomic_mode && count == 0 -> release()
		:: else
		fi
	}
}

proctype caller()
{
	byte op;
	bit ok, started;

	if
	:: op = KILL
	:: op = ATOMIC
	:: op = SYNC
	:: op = PERCPU
	fi;
	lock_unmanaged();
	if
	:: ok && op == KILL ->
		wait_switch_done();
		if
		:: dead -> unlock()	/* a second kill: warned, ignored */
		:: else ->
			assert(!managed);
			dead = 1;
			switch_mode_locked(force_atomic);
			unlock();
			atomic { creator_holds = 0; put() }	/* the initial reference */
		fi
	:: ok && op == ATOMIC ->
		switch_mode_locked(1);
		unlock()
	:: ok && op == SYNC ->
		/* lock_for_sync_switch(), then a switch of its own. */
		wait_switch_done();
		force_atomic = 1;
		start_atomic_switch(0);
		unlock();
		if
		:: started ->
			skip;		/* the reader fence */
			lock(); unlock();	/* fold */
			lock(); drop_switch_ref(); unlock()
		:: else
		fi
	:: ok && op == PERCPU ->
		switch_mode_locked(0);
		unlock()
	:: else
	fi;
	calls_done++
}

/* percpu_ref_switch_to_unmanaged(); uses is_managed. */
inline switch_to_unmanaged()
{
	lock();
#ifndef MUTANT_UNMANAGE_NO_WAIT
	wait_switch_done();	/* a check in flight ends it */
#endif
#ifdef MUTANT_UNMANAGE_DEAD
	is_managed = managed;
#else
	is_managed = managed && !dead;
#endif
	if
	:: is_managed -> managed = 0
	:: else
	fi;
	unlock();
	if
	:: is_managed -> put()	/* the manager's: per-CPU, no release */
	:: else
	fi
}

proctype manage_caller()
{
	bit is_managed, became;

	/* percpu_ref_switch_to_managed(). */
	lock();
#ifndef MUTANT_MANAGE_NO_WAIT
	wait_switch_done();
#endif
	if
	:: !managed && !dead && count > 0 ->
		count++;		/* tryget: the manager's reference */
		force_atomic = 0;
		to_percpu();
		managed = 1;
		became = 1
	:: else
	fi;
	unlock();
	if
	:: became ->
		/* The managed contract: the creator drops its reference and
		 * leaves the ref to the reclaimer.  Then misuse the library
		 * must refuse: a switch to unmanaged once the reclaimer
		 * released the ref. */
		atomic { assert(creator_holds); creator_holds = 0; put() };
		released || scans_done;
		if
		:: released -> switch_to_unmanaged()
		:: else
		fi
	:: true ->
		/* Or the creator keeps it, and the ref goes back, or not. */
		if
		:: true -> switch_to_unmanaged()
		:: true
		fi
	fi;
	calls_done++
}

/* The callback thread: finishes asynchronous switches. */
active proctype callback_thread()
{
end:	do
	:: atomic { in_flight && async_switch -> async_switch = 0 };
		/* after the grace period */
		lock(); unlock();	/* fold, read the confirm */
		skip;			/* the confirm callback */
		lock(); drop_switch_ref(); unlock()
	od
}

/* One check of a listed ref: percpuref_managed_begin(), the fence,
 * percpuref_managed_finish(). */
inline check()
{
	lock();
	if
	:: managed && !dead ->
		assert(!in_flight && !atomic_mode);
		/* start_atomic_switch(), synchronous. */
		atomic_mode = 1;
		in_flight = 1;
		count++;
		unlock();
		skip;			/* the reader fence */
		lock();
		atomic {
			if
			:: count == 2 ->	/* the CAS from 2 to 0 */
				count = 0;
				dead = 1;
				release();
				cas_failed = 0
			:: else -> cas_failed = 1
			fi
		};
		if
		:: cas_failed ->
			count--;	/* the switch's reference */
			to_percpu()
		:: else
		fi;
		in_flight = 0
	:: else
	fi;
	unlock()
}

proctype reclaimer()
{
	byte s;
	bit cas_failed;

	for (s : 1 .. SCANS) {
		check()
	}
	scans_done = 1;
	creator_done;
	check();
	reclaimer_done = 1
}

proctype creator()
{
	calls_done == NCALLERS + 1;
	if
	:: creator_holds -> atomic { creator_holds = 0; put() }
	:: else
	fi;
	creator_done = 1
}

/* Once everything is done: no reference left, released where it must be. */
active proctype final()
{
	atomic {
		reclaimer_done && !in_flight && !locked ->
		assert(count == 0);
		assert(released == 1 || (!dead && !atomic_mode && !managed))
	}
}

init
{
	atomic {
		run caller();
		run caller();
		run manage_caller();
		run reclaimer();
		run creator()
	}
}
