/* SPDX-License-Identifier: MIT */
/*
 * rcuref.pml - Model M: an RCU-released ref exited between its zero and
 * its @release while readers that found it may still tryget it.
 *
 * src/percpu_rcuref.c: zero() sets ZEROING, runs @unpublish, adds QUEUED
 * and queues the ref for a grace period; after_grace_period() swaps the
 * phase to 0 and, if an exit came, lets go of what it held and frees the
 * state, else calls @release (which exits the ref itself: the model's
 * @release is that exit).  percpu_rcuref_exit() takes the state, reads the
 * phase and, between zero and @release (ZEROING or QUEUED), exits the
 * percpu_ref with a readers' hold (src/percpu_ref.c, percpuref_ref_exit():
 * the quiet mode word, then the data pointer cleared, then the hold taken
 * instead of freeing the data), then marks the phase EXITED; whichever of
 * the exit and after_grace_period() comes second frees the state.  A
 * reader's tryget loads the data pointer once: with data it reads the
 * count there (0: it fails); without, it reads the mode word, and fails
 * quietly on the readers' word, where any other word is misuse (warned).
 * Each step is one atomic access (SPIN's interleaving is sequentially
 * consistent; the code's are acquire-release pairs on the same words:
 * the data pointer's release store and the readers' acquire load, the
 * phase's RMWs).
 *
 * Modelled: one ref at zero (the kill's put), one reader in a read-side
 * section that began before @unpublish returned (it found the ref), which
 * trygets up to twice at any point, and one exit or none: from @unpublish
 * itself; from another thread inside a read-side section that began before
 * @unpublish returned, once it saw the zero (ZEROING or later); from the
 * reclaimer after the grace period, before this ref's turn (another ref's
 * @release); or right after the kill, inside a read-side section, by a
 * thread that waits for the kill's switch to end and then, since its put
 * reached zero, for zero() to say it began (kill_then_exit_wait(): under
 * the switch lock, after zero()'s load of the state and store of ZEROING).
 * The grace period waits for every section.
 * Checked: the data is never read after it is freed, and freed exactly
 * once; the state likewise, and zero() never loads it taken; no tryget
 * warns; @release runs exactly when no exit came.
 *
 * Mutants: -DMUTANT_EXIT_FREES_DATA: the exit frees the data at once, as
 * up to 0.4.20: the reader's tryget reads freed memory.
 * -DMUTANT_LOUD_WORD: the exit leaves the word of every exit (atomic and
 * dead): a reader that finds no data warns.  -DMUTANT_CLEAR_FIRST: the
 * exit clears the data pointer before it writes the readers' word: a
 * reader in between finds no data and the kill's word, and warns.
 * -DMUTANT_ZERO_LETS_GO: zero() lets go of an exit's hold and frees the
 * state when an exit came during @unpublish, where 0.4.20 freed the state
 * there instead of queueing it: the data is freed before the grace period.
 * -DMUTANT_NO_RELEASE_WAIT: the exit after a kill waits for the switch
 * only, as 0.4.21's first build did: it takes the state before zero()
 * loads it.  -DMUTANT_BEGINS_FIRST: zero() says it began before it stores
 * ZEROING (its second build): the exit finds the phase 0, frees the state
 * as for a live ref, and zero() writes to it.
 */

#define ZEROING	1
#define QUEUED	2
#define EXITED	4

#define NONE		0
#define IN_UNPUBLISH	1
#define OTHER_THREAD	2
#define RECLAIMER	3
#define AFTER_KILL	4

byte phase;
bit state_ptr = 1;	/* ref->state points at the state */
bit switch_ended;	/* the kill's switch ended, its put at zero */
bit release_pending;	/* ... and zero() has not said it began */
bit data_ptr = 1;	/* ref->data points at the data */
bit readers_word;	/* the mode word is the readers' (else the kill's) */
bit data_freed, st_freed;
bit hold;		/* the exit's readers' hold, in the state */
byte exit_from;
bit exited;
bit warned;
byte released;
bit queued;
bit reader_in_section = 1, exiter_in_section;
bit gp_over;

inline free_data()
{
	atomic { assert(!data_freed); data_freed = 1 }
}

inline free_st()
{
	atomic { assert(!st_freed); st_freed = 1 }
}

/* percpu_rcuref_exit(), after kill_then_exit_wait(): the state taken
 * (one exit).  Its caller declares under and old. */
inline do_exit()
{
	state_ptr = 0;
	assert(!st_freed);
	under = (phase & (ZEROING | QUEUED)) != 0;
	/* percpuref_ref_exit(), under the ref's switch lock. */
	if
	:: under ->
#ifdef MUTANT_CLEAR_FIRST
		data_ptr = 0;
		readers_word = 1;
#else
#ifndef MUTANT_LOUD_WORD
		readers_word = 1;
#endif
		data_ptr = 0;
#endif
#ifdef MUTANT_EXIT_FREES_DATA
		free_data()
#else
		hold = 1
#endif
	:: else ->
		data_ptr = 0;
		free_data()
	fi;
	exited = 1;
	atomic { old = phase; phase = phase | EXITED };
	if
	:: (old & (ZEROING | QUEUED)) == 0 ->
		if
		:: hold -> hold = 0; free_data()
		:: else -> skip
		fi;
		free_st()
	:: else -> skip
	fi
}

proctype reader()
{
	byte tries;
	bit data;

	do
	:: tries < 2 ->
		tries++;
		data = data_ptr;	/* loaded once */
		if
		:: data -> assert(!data_freed)	/* the count: 0, fails */
		:: else ->
			if
			:: readers_word -> skip		/* fails quietly */
			:: else -> warned = 1
			fi
		fi
	:: true -> break
	od;
	reader_in_section = 0
}

/* Another thread, inside a read-side section that began before @unpublish
 * returned, told of the zero. */
proctype other_exiter()
{
	bit under;
	byte old;

	(phase & ZEROING) != 0;
	do_exit();
	exiter_in_section = 0
}

/* Right after the kill, in a read-side section. */
proctype kill_exiter()
{
	bit under;
	byte old;

	switch_ended;
#ifndef MUTANT_NO_RELEASE_WAIT
	!release_pending;
#endif
	do_exit();
	exiter_in_section = 0
}

/* The kill's put reached zero: zero(), then the reclaimer. */
proctype pipeline()
{
	bit under;
	byte old;

	atomic { switch_ended = 1; release_pending = 1 };
	assert(state_ptr);	/* zero()'s load of the state */
#ifdef MUTANT_BEGINS_FIRST
	release_pending = 0;
	atomic { assert(!st_freed); phase = ZEROING };
#else
	atomic { assert(!st_freed); phase = ZEROING };
	release_pending = 0;
#endif
	/* @unpublish */
	if
	:: exit_from == IN_UNPUBLISH -> do_exit()
	:: else -> skip
	fi;
#ifdef MUTANT_ZERO_LETS_GO
	if
	:: phase & EXITED ->
		if
		:: hold -> hold = 0; free_data()
		:: else -> skip
		fi;
		free_st();
		goto done
	:: else -> skip
	fi;
#endif
	atomic { phase = phase | QUEUED; queued = 1 };
	/* The grace period: every section that began before it. */
	!reader_in_section && !exiter_in_section;
	gp_over = 1;
	if
	:: exit_from == RECLAIMER -> do_exit()	/* another ref's @release */
	:: else -> skip
	fi;
	/* after_grace_period() */
	atomic { old = phase; phase = 0 };
	if
	:: old & EXITED ->
		if
		:: hold -> hold = 0; free_data()
		:: else -> skip
		fi;
		free_st()
	:: else ->
		released++;
		do_exit()	/* @release exits the ref: phase 0 */
	fi;
done:
	skip
}

init {
	atomic {
		if
		:: exit_from = NONE
		:: exit_from = IN_UNPUBLISH
		:: exit_from = OTHER_THREAD; exiter_in_section = 1
		:: exit_from = RECLAIMER
		:: exit_from = AFTER_KILL; exiter_in_section = 1
		fi;
		run reader();
		if
		:: exit_from == OTHER_THREAD -> run other_exiter()
		:: exit_from == AFTER_KILL -> run kill_exiter()
		:: else -> skip
		fi;
		run pipeline()
	}
	_nr_pr == 1;
	assert(data_freed && st_freed && !hold);
	assert(!warned);
	assert(released == (exit_from == NONE))
}
