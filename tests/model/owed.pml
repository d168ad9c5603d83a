/* SPDX-License-Identifier: MIT */
/*
 * owed.pml - Model I: the releases signal handlers defer, counted on the
 * ref, run once each, and the ref's private part freed exactly once.
 *
 * On the fallback fast path a put in a signal handler that interrupted a
 * get or put of its own thread does not run the @release it reaches: it
 * leaves it on that thread's list, which the interrupted call runs once
 * its section has ended (src/percpu_ref.c: defer_handler_release(),
 * run_one_handler_release(), owed_and_holds).  The ref may be reinited
 * and reach zero again before that list ran, on the same thread or
 * another, and it may be exited meanwhile, with the reclaimer holding it
 * too if it was made managed in between.  The protocol:
 *   defer:  old = w++; if old == 0, link the impl to this thread's list
 *   run:    read next, ref, release; left = --w;
 *           if !(left & OWED) unlink; if !(left & EXITED) release
 *           else if left == EXITED free
 *   exit:   old = w |= EXITED (| RECL when the reclaimer holds the node);
 *           free if old == 0 and the reclaimer does not hold it
 *   reclaimer, after an exit that left it a hold: left = w -= RECL;
 *           free if left == EXITED
 * Each a single atomic read-modify-write (SPIN's interleaving is
 * sequentially consistent; the code's are acquire-release RMWs on one
 * word, which the model's total order of them matches).
 *
 * Modelled: two threads, each with its list (a flag: the model has one
 * ref) and its runner, which never interleaves with its own thread's
 * handler (the runner blocks the signals; a handler defers only inside a
 * section, which the runner is not).  A user makes the first zero in a
 * handler of thread 0, then chooses: no more, or a reinit and a second
 * zero in a handler of either thread, at any point of the runners' work;
 * then an exit or none, and for an exit whether the reclaimer holds the
 * node.  A put after the exit is the caller's misuse: not modelled.
 * Checked: the impl is never read after it is freed, never freed twice,
 * never on two lists or twice on one; the handler_next a runner follows
 * is the one its own thread's link wrote; at the end it is off every list,
 * freed if and only if exited, and every release owed either ran or was
 * counted off after the exit (never one of those before it skipped).
 *
 * Mutants: -DMUTANT_LINK_ALWAYS: every deferral links the impl (0.4.0): a
 * second zero before the first ran links it twice.  -DMUTANT_FREE_AT_EXIT:
 * the exit frees whatever is owed (0.4.0): the runner reads the freed
 * impl.  -DMUTANT_UNLINK_ON_LOAD: the runner reads the count, unlinks on
 * one, then decrements: a second zero in between is owed with the impl
 * on no list, and its release never runs.  -DMUTANT_RECLAIMER_FREES: the
 * reclaimer frees the node of an exited ref whatever is owed, as it did
 * before the handler lists held the impl: the runner reads the freed impl
 * (a ref made managed after a handler deferred its release).
 * -DMUTANT_NEXT_AFTER_COUNT: the runner reads handler_next after its
 * decrement: at zero another thread's handler may have linked the impl to
 * its own list meanwhile, and the runner goes on down that list.
 * -DMUTANT_EXIT_READS_AFTER_MARK: the exit reads the impl after its mark
 * (whether the reclaimer holds it, as up to 0.4.15): since 0.4.16 the
 * reclaimer frees a node it finds marked without the switch lock that the
 * exit holds (percpuref_managed_node_exited()), and the read meets the
 * freed impl.  The model's reclaimer starts at the mark and takes no lock.
 */

#define OWED	3	/* the low bits: releases owed (at most 2 here) */
#define RECL	4	/* IMPL_RECLAIMER_HOLDS */
#define EXITED	8	/* IMPL_EXITED */

byte w;			/* owed_and_holds */
bit on_list[2];		/* linked to thread t's list */
byte next_of;		/* handler_next: written by thread next_of - 1's link */
byte links;		/* lists the impl is on */
bit freed;
byte owed_total;	/* releases deferred */
byte released;		/* releases run */
byte skipped;		/* releases counted off after the exit */
bit busy[2];		/* thread t's handler or runner is running */
bit user_done;
bit exited;

inline lock(t)
{
	atomic { !busy[t] -> busy[t] = 1 }
}

inline unlock(t)
{
	busy[t] = 0
}

inline touch()
{
	assert(!freed)
}

inline free_impl()
{
	atomic { assert(!freed); freed = 1 }
}

/* A handler of thread t puts the last reference. */
inline defer(t)
{
	lock(t);
	touch();
	atomic {
		old = w;
		w = w + 1;
		owed_total++
	}
#ifdef MUTANT_LINK_ALWAYS
	if
	:: true ->
#else
	if
	:: old == 0 ->
#endif
		atomic {
			assert(!on_list[t]);
			on_list[t] = 1;
			next_of = t + 1;
			links++;
			assert(links == 1)
		}
	:: else -> skip
	fi;
	unlock(t)
}

/* Thread t's section ended: its list, one release at a time. */
proctype runner(byte t)
{
	byte left;

	do
	:: on_list[t] ->
		lock(t);
		if
		:: on_list[t] ->
#ifndef MUTANT_NEXT_AFTER_COUNT
			touch();	/* next, ref, release */
			assert(next_of == t + 1);
#endif
#ifdef MUTANT_UNLINK_ON_LOAD
			if
			:: (w & OWED) == 1 ->
				atomic { on_list[t] = 0; links-- }
			:: else -> skip
			fi;
			touch();
			atomic { w = w - 1; left = w };
#else
			/* The unlink is a write to the thread's own list that
			 * no other process reads: one step with the decrement. */
			atomic {
				w = w - 1;
				left = w;
				if
				:: (left & OWED) == 0 -> on_list[t] = 0; links--
				:: else -> skip
				fi
			}
#endif
#ifdef MUTANT_NEXT_AFTER_COUNT
			assert(next_of == t + 1);
#endif
			if
			:: !(left & EXITED) -> released++
			:: else ->
				skipped++;
				if
				:: left == EXITED -> free_impl()
				:: else -> skip
				fi
			fi
		:: else -> skip
		fi;
		unlock(t)
	:: user_done && !on_list[t] -> break
	od
}

/* Started by an exit that left it a hold. */
proctype reclaimer()
{
	byte left;

	touch();
	atomic { w = w - RECL; left = w };
	if
	:: left == EXITED -> free_impl()
#ifdef MUTANT_RECLAIMER_FREES
	:: else -> free_impl()
#else
	:: else -> skip
#endif
	fi
}

proctype user()
{
	byte old;

	defer(0);
	if
	:: true
	:: defer(0)	/* reinited, taken, killed: zero again here */
	:: defer(1)	/* or on the other thread */
	fi;
	if
	:: true
	:: atomic { old = w; w = w | EXITED; exited = 1 };
		if
		:: old == 0 -> free_impl()
#ifdef MUTANT_FREE_AT_EXIT
		:: old != 0 -> free_impl()
#else
		:: old != 0 -> skip
#endif
		fi
	:: atomic { w = w | EXITED | RECL; exited = 1 };
		run reclaimer()
#ifdef MUTANT_EXIT_READS_AFTER_MARK
		;
		touch()
#endif
	fi;
	user_done = 1
}

init {
	atomic {
		run runner(0);
		run runner(1);
		run user()
	}
	_nr_pr == 1;
	assert(links == 0);
	assert(freed == exited);
	assert(released + skipped == owed_total);
	assert(exited || skipped == 0)
}
