/* SPDX-License-Identifier: MIT */
/*
 * fork.pml - Model H: a fork while a scan runs the @release calls of the
 * refs it released (src/managed.c, run_scan_releases() and the fork hooks;
 * src/runtime.c, percpuref_batch_pause() and the fork hooks' order).
 *
 * The scanner holds scan_lock for a whole scan but for each @release: it
 * takes the next ref off scan_released and names it scan_releasing under
 * the lock, releases the lock (the pause), runs @release, takes the lock
 * again (the resume), finishes the ref's node (percpuref_managed_release_
 * done()) and clears scan_releasing.  A user's fork takes scan_lock first
 * (fork_prepare), so the child's copy shows the scan between two of those
 * steps; the child's hooks then hand every ref still on scan_released to
 * the child's next scan (@release and node both), and the one named
 * scan_releasing to it for its node only: that @release was the parent's
 * thread's.  A @release that forks (a callback) leaves scan_lock alone,
 * and goes on in the child: its ref is its own there, not a cut one.
 *
 * Modelled: N refs released by one scan; a @release takes the user's lock
 * and drops it (a Rust Drop under a mutex); a user thread forks once with
 * that lock held, at any moment; the scan's @release may fork once too.
 * A fork's child is its hooks and what its threads then do, evaluated in
 * one step on the copy: every @release run before the fork or by the
 * child, every node finished before the fork or by the child.
 *
 * Asserted, in each child, for every ref: its node is finished exactly
 * once; its @release runs at most once, and exactly once unless it was the
 * one the fork cut.  Checked: no deadlock (an invalid end state).
 *
 * Mutants, each found by SPIN:
 * -DMUTANT_NO_PAUSE: the @release runs with scan_lock held (0.3.3): the
 * fork, holding the user's lock, waits for the scan, and the @release for
 * that lock: a deadlock.
 * -DMUTANT_NO_CUT: the child does not finish the cut ref's node (0.3.4):
 * it stayed "release pending", and a reinit there never went back on the
 * list.
 * -DMUTANT_CUT_OWN: the cut is taken from a callback's fork as well: the
 * node of the @release that goes on in the child is finished twice.
 * -DMUTANT_NAME_LATE: scan_releasing is set after the lock is released: a
 * fork in between finds a ref neither queued nor named, never finished.
 * -DMUTANT_NO_CLEAR: the name stays after the node is finished: a later
 * fork's child finishes it again (on freed memory).
 */

#define N	3
#define NONE	255

bit scan_lock;
bit user_lock;
bit queued[N] = 1;		/* on scan_released: all, at first */
byte releasing = NONE;		/* scan_releasing */
bit ran[N];			/* its @release returned */
bit finished[N];		/* its node finished */
bit callback_forked;

inline lock(l)
{
	atomic { !l -> l = 1 }
}

inline unlock(l)
{
	l = 0
}

/*
 * The child of a fork: @took_lock when the forking thread took scan_lock
 * (a user's fork), @own the ref whose @release forks (NONE for a user).
 */
inline child(took_lock, own)
{
	d_step {
		cut = NONE;
#ifdef MUTANT_CUT_OWN
		if
		:: releasing != NONE -> cut = releasing
		:: else -> skip
		fi;
#else
		if
		:: took_lock && releasing != NONE -> cut = releasing
		:: else -> skip
		fi;
#endif
		for (j : 0 .. N - 1) {
			/* The child's scan runs the queued ones whole; the
			 * forking callback finishes its own @release. */
			child_ran = ran[j] + queued[j] + (j == own);
			child_finished = finished[j] + queued[j] + (j == own);
#ifndef MUTANT_NO_CUT
			child_finished = child_finished + (j == cut);
#endif
			assert(child_finished == 1);
			assert(child_ran <= 1);
			assert(child_ran == 1 || j == cut)
		}
	}
}

active proctype scanner()
{
	byte i, j, cut, child_ran, child_finished;

	lock(scan_lock);		/* percpuref_batch_begin() */
	for (i : 0 .. N - 1) {
#ifdef MUTANT_NAME_LATE
		queued[i] = 0;
#ifndef MUTANT_NO_PAUSE
		unlock(scan_lock);
#endif
		releasing = i;
#else
		atomic { queued[i] = 0; releasing = i };
#ifndef MUTANT_NO_PAUSE
		unlock(scan_lock);	/* percpuref_batch_pause() */
#endif
#endif
		/* @release */
		lock(user_lock);
		unlock(user_lock);
		if
		:: !callback_forked ->
			callback_forked = 1;
			child(0, i)
		:: true -> skip
		fi;
		ran[i] = 1;
#ifndef MUTANT_NO_PAUSE
		lock(scan_lock);	/* percpuref_batch_resume() */
#endif
		finished[i] = 1;	/* percpuref_managed_release_done() */
#ifndef MUTANT_NO_CLEAR
		releasing = NONE
#else
		skip
#endif
	}
	unlock(scan_lock)		/* percpuref_batch_end() */
}

active proctype user()
{
	byte j, cut, child_ran, child_finished;

	lock(user_lock);
	lock(scan_lock);		/* the fork hooks' prepare */
	child(1, NONE);
	unlock(scan_lock);		/* and parent */
	unlock(user_lock)
}
