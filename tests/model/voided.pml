/* SPDX-License-Identifier: MIT */
/*
 * voided.pml - Model T: a pending @release while its ref is revived or
 * exited: a handler's release that its thread's section holds back, and
 * the reclaimer's release of a managed ref, which a revive voids.
 *
 * src/percpu_ref.c: percpu_ref_put_many() (percpu_ref.h,
 * __percpu_ref_atomic_put()) and __percpu_ref_release_life(), defer_handler_release(),
 * run_one_handler_release(), drop_exit_hold(); percpu_ref_resurrect(),
 * percpu_ref_reinit() (percpu_ref_is_zero()), percpu_ref_kill(),
 * percpu_ref_get(), percpu_ref_switch_to_managed() (manage_locked(),
 * list_node()), percpu_ref_switch_to_unmanaged() (unstage_node()),
 * percpuref_ref_exit(); the reclaimer's percpuref_managed_node_exited(),
 * percpuref_managed_begin() and _finish() (one step, see below),
 * percpuref_managed_free(), percpuref_managed_release() and
 * percpuref_managed_release_done().
 *
 * Model I (owed.pml) has the owed count and the lists with a user that
 * only chooses "zero again" or "exit"; this one has what makes those
 * happen: the count, DEAD, the managed flag, mstate, release_voided,
 * exited and the ref's switch lock (one stripe: one lock), with the calls
 * that change them, so that a revive, a second kill or zero, managed mode
 * and an exit meet both kinds of pending release.
 *
 * Processes.  H, thread 0: inside a read-side section its signal handler
 * puts its reference; at zero the release is deferred (linked to thread
 * 0's list, or counted if linked already).  The handler may wait for a
 * reference U hands it and put that too (still inside the section: the
 * REZERO cases of test_fallback_edges.c).  Then the section ends and H runs
 * its list; references still held after that are put outside any section.
 * U, thread 1: up to OPS calls, each chosen among reinit, resurrect, get
 * (kept or handed to H), put (plain, or in its own handler inside its own
 * section, whose list it then runs), kill, switch_to_managed,
 * switch_to_unmanaged and exit (its last).  U is a correct user: it puts
 * only references it holds, and exits only when no put of H's is in flight
 * or to come.  R, the reclaimer: a pass over the node whenever it is
 * listed, and one last pass once H and U are done.  Two starts: the ref
 * dead and unmanaged with H's reference its last (handler-release-*), or
 * managed and live, held by the manager, H and U.
 *
 * Abstracted.  The count is one number: per-CPU and atomic mode are not
 * told apart (Models A, C: the fold is exact), so a zero happens where the
 * count does; the kill's switch is not modelled (a kill is DEAD and the
 * kill's put; a zero reached by the callback thread's put of the switch's
 * reference, in finish_atomic_switch() under the lock, runs its release
 * after the unlock with neither a managed test nor voiding: a revive in
 * between is the kernel's window, and nothing there can lose it).  The reclaimer's check (begin, fence, finish) is
 * one step under the lock: every call here that changes the count's
 * owners but a get and a put waits for it (the in-flight mark), and a get
 * or put cannot take a managed ref to zero (the manager's reference).  The
 * count in that step leaves out the switch's reference: it releases at
 * 1, the manager's alone.  A put's load of data->lives, its decrement
 * and its reads of the managed flag and of lives are three steps, as in
 * the code.  The release callback does
 * nothing itself: U's calls racing it stand for a release that revives or
 * exits its ref.  The stage is one bit (taken): until a pass takes the
 * node, an unmanage or exit may take it back (unstage_node(); Model L has
 * the stage itself).  Fork, RCU readers, the pinned-node path and the
 * list order (owed.pml) are not modelled.  SPIN's
 * interleaving is sequentially consistent; every variable here is written
 * under the lock or by one atomic RMW, and the put's unlocked reads of
 * lives and of the managed flag are ordered by the acquire and release
 * pairs percpu_ref.h (__percpu_ref_atomic_put()) and
 * __percpu_ref_release_life() name, which give what SC gives here.
 *
 * Asserted.  The impl is never touched after it is freed nor freed twice;
 * a release begins (the step that commits to it: a put's managed test, a
 * runner's decrement, the reclaimer's test under the lock) only on a ref
 * not exited; the reclaimer's begins only on a ref not revived since its
 * zero, and it is voided only where a revive came since; a zero reached
 * by a put is never lost (pinned as a put of the manager's reference); at
 * the end the impl is freed exactly when exited and every zero was run,
 * voided or skipped because of the exit, once.
 *
 * A handler's deferred release is not voided by a revive: it runs on the
 * revived ref, documented (docs/percpu_ref.md, "Signal handlers": "A
 * reinit from another thread meanwhile, and a second zero, owe a second
 * release, as in the kernel").  -DSTRICT asserts that no release at all
 * begins while the count is not zero, and fails on that: see there.
 *
 * The bug it found (review 163; fixed in 0.4.30, tests/unit/
 * test_put_revive.c): the ref killed, H's reference its last; U
 * resurrects it (legal at any count while dead) and, with DEAD cleared,
 * H's put takes the count to zero before U's add; U makes it managed;
 * H's release then read the managed flag (relaxed, no lock, after the
 * decrement), took its put for one of the manager's reference, pinned the
 * count and never ran the zero's release; the revived ref, pinned, never
 * reached zero again (-DMUTANT_NO_LIFE, the order up to 0.4.29).  A
 * reinit that reads zero in the same window did the same.  Now the put
 * loads data->lives (acquire) before its decrement, a resurrection
 * stores lives + 1 (release) after its count add, and the release pins
 * only when the ref is managed and lives still reads what the put
 * loaded: a zero of an earlier life runs its release.
 *
 * Mutants (the assertion each fails on in brackets).  -DMUTANT_NO_LIFE:
 * the release tests the managed flag alone [(lost==0)].
 * -DMUTANT_LIFE_AFTER: the put loads lives after its decrement
 * [(lost==0)].  -DMUTANT_LIVES_FIRST: the resurrection stores lives + 1
 * before its count add [(lost==0)].
 * -DMUTANT_NO_VOID: the revive does not set release_voided: the
 * reclaimer's release runs on the revived ref [!(revived)].
 * -DMUTANT_NO_CLEAR: release_done keeps release_voided: a later managed
 * zero's release is voided with no revive since [revived].
 * -DMUTANT_CLEAR_AT_TEST: release_voided is cleared at managed_release's
 * test instead of at release_done: a revive between the two (a release
 * that reinits its ref) stays set and voids the next zero's [revived].
 * -DMUTANT_VOID_ANY: the revive sets it whatever mstate, not only
 * RELEASING: a later zero's release is voided [revived].
 * -DMUTANT_EXITED_AT_FINISH: whether the ref was exited is read at the
 * check, not under the lock at the call: an exit in between (another
 * ref's release of the batch) and the release runs on the exited ref
 * [!(exited)].  -DMUTANT_DONE_UNLOCKED: release_done reads exited before
 * taking the lock: an exit in between takes a reclaimer hold that nobody
 * lets go of, the impl leaks [(freed==exited)].
 * -DMUTANT_EXIT_LISTED_ONLY: the exit counts a reclaimer hold only for a
 * listed node, not for one whose release is pending: it frees the impl
 * under the reclaimer, which lets go of a hold it was never given
 * [(w&4)].  -DMUTANT_RUNNER_LOADS_EXITED: a handler list's runner reads
 * the exit bit before its decrement: an exit in between, and the release
 * runs on the exited ref [!(exited)].
 *
 * Non-vacuity, each must fail: -DWITNESS_VOID_THEN_ZERO
 * (a revive voided a reclaimer's release and a later zero's release ran),
 * -DWITNESS_EXIT_SKIPS (an exit skipped a deferred handler release and the
 * runner freed the impl), -DWITNESS_EXIT_RELEASING (an exit while the
 * reclaimer's release was pending, the reclaimer freeing the impl),
 * -DWITNESS_EXIT_BOTH (an exit found a handler release owed and the
 * reclaimer holding the node).
 */

#ifndef OPS
#define OPS	6	/* U's calls */
#endif

#define OWED	3	/* owed_and_holds: releases owed (low bits) */
#define RECL	4	/* IMPL_RECLAIMER_HOLDS */
#define EXITED	8	/* IMPL_EXITED */
#define PINNED	200	/* PERCPU_REF_SATURATED */

#define OFF		0	/* MNODE_OFF */
#define LISTED		1	/* MNODE_LISTED */
#define RELEASING	2	/* MNODE_RELEASING */

bit lk;			/* the ref's switch lock (stripe) */
byte count;		/* references: the manager's, H's, U's */
bit dead;		/* __PERCPU_REF_DEAD */
bit managed;		/* data->managed */
byte mstate;
bit voided;		/* release_voided */
bit exited;		/* impl->exited (with IMPL_EXITED, one step) */
byte w;			/* owed_and_holds */
bit on_list[2];		/* linked to thread t's handler list */
byte links;
bit freed;
byte lives;		/* data->lives */

/* Ghosts. */
byte zeros;		/* the count reached zero */
byte ran;		/* releases begun */
byte voids;		/* reclaimer's releases voided by a revive */
byte skips;		/* releases not run: exited first */
byte lost;		/* zeros whose release never runs (pinned) */
bit mpending;		/* a reclaimer's zero whose release is undecided */
bit revived;		/* a revive since that zero */
byte hheld;		/* references H holds */
byte uref;		/* references U holds */
byte inflight;		/* puts between their zero and their decision */
bit h_done;
bit u_done;
bit recl_gone;		/* the reclaimer let go of its hold */
bit taken;		/* a pass took the node off its stage */
#ifdef WITNESS_VOID_THEN_ZERO
byte ran_after_void;
#endif
#ifdef WITNESS_EXIT_SKIPS
bit runner_freed;
#endif
#ifdef WITNESS_EXIT_RELEASING
bit recl_freed_releasing;
#endif
#ifdef WITNESS_EXIT_BOTH
bit exit_found_both;
#endif

inline lock()
{
	atomic { !lk -> lk = 1 }
}

inline unlock()
{
	lk = 0
}

inline touch()
{
	assert(!freed)
}

inline free_impl()
{
	atomic { assert(!freed); freed = 1 }
}

/* The step that commits to a release. */
inline begins()
{
	assert(!exited);
#ifdef STRICT
	assert(count == 0);
#endif
	ran++
#ifdef WITNESS_VOID_THEN_ZERO
	;
	if
	:: voids > 0 -> ran_after_void++
	:: else -> skip
	fi
#endif
}

/* defer_handler_release(): the fetch_add, then the link if it was 0. */
inline defer(t)
{
	atomic {
		touch();
		old = w;
		w = w + 1
	};
	if
	:: old == 0 ->
		atomic {
			assert(!on_list[t]);
			on_list[t] = 1;
			links++;
			assert(links == 1)
		}
	:: else -> skip
	fi
}

/* run_handler_releases(): thread t's section has ended. */
inline run_list(t)
{
	do
	:: on_list[t] ->
		touch();	/* next, ref, release */
#ifdef MUTANT_RUNNER_LOADS_EXITED
		ex = (w & EXITED);
#endif
		atomic {	/* drop_exit_hold(impl, 1) */
			w = w - 1;
			left = w;
			if
			:: (left & OWED) == 0 -> on_list[t] = 0; links--
			:: else -> skip
			fi;
#ifdef MUTANT_RUNNER_LOADS_EXITED
			if
			:: !ex -> begins()
			:: else -> skips++
			fi
#else
			if
			:: !(left & EXITED) -> begins()
			:: else -> skips++
			fi
#endif
		};
		if
		:: left == EXITED ->
			free_impl()
#ifdef WITNESS_EXIT_SKIPS
			;
			runner_freed = 1
#endif
		:: else -> skip
		fi
	:: else -> break
	od
}

/* percpu_ref_put(): lives loaded, the decrement, then
 * __percpu_ref_release_life(). */
inline put(t, inh)
{
#ifndef MUTANT_LIFE_AFTER
	life = lives;		/* acquire */
#endif
	atomic {
		touch();
		assert(count > 0 && count < PINNED);
		count--;
		z = (count == 0);
		if
		:: z -> zeros++; inflight++
		:: else -> skip
		fi
	};
#ifdef MUTANT_LIFE_AFTER
	life = lives;
#endif
	if
	:: z ->
		m = managed;	/* acquire, no lock */
		if
#ifdef MUTANT_NO_LIFE
		:: m ->
#else
		:: m && lives == life ->	/* then lives, relaxed */
#endif
			/* pin_dropped_manager_ref(): this zero's release
			 * never runs (a correct user's put never gets
			 * here) */
			atomic {
				count = PINNED;
				lost++;
				inflight--;
				assert(lost == 0)
			}
		:: else ->
			if
			:: inh -> defer(t); inflight--
			:: else -> atomic { begins(); inflight-- }
			fi
		fi
	:: else -> skip
	fi
}

/* percpuref_managed_free() and the exited branch of release_done. */
inline drop_recl()
{
	atomic {
		touch();
		assert(w & RECL);
		w = w - RECL;
		left = w;
		recl_gone = 1
	};
	if
	:: left == EXITED -> free_impl()
	:: else -> skip
	fi
}

/* unstage_node(): a listed node still on top of its stage comes back. */
inline unstage()
{
	if
	:: atomic { mstate == LISTED && !taken -> mstate = OFF }
	:: true -> skip
	fi
}

proctype H()
{
	byte old, left, life;
	bit z, ex, m;

	put(0, 1);	/* in its handler, inside its section */
	if
	:: true
	:: (hheld > 1 || u_done) ->	/* the handler waits for another */
		if
		:: hheld > 1 -> hheld--; put(0, 1)
		:: else -> skip
		fi
	fi;
	hheld--;	/* the first put's */
	run_list(0);	/* the section ended */
	do
	:: hheld > 0 -> put(0, 0); hheld--
	:: hheld == 0 && u_done -> break
	od;
	h_done = 1
}

/* percpu_ref_resurrect() under the lock it takes. */
inline resurrect()
{
	lock();
	touch();
	if
	:: !dead -> skip	/* warned */
	:: else ->
		dead = 0;
#ifdef MUTANT_VOID_ANY
		voided = 1;
#else
#ifndef MUTANT_NO_VOID
		if
		:: mstate == RELEASING -> voided = 1
		:: else -> skip
		fi;
#endif
#endif
		if
		:: mpending -> revived = 1
		:: else -> skip
		fi;
#ifdef MUTANT_LIVES_FIRST
		lives++;
#endif
		if
		:: managed -> count = count + 2
		:: else -> count++
		fi;
#ifndef MUTANT_LIVES_FIRST
		lives++;	/* release, after the add */
#endif
		uref++;
		if
		:: managed && mstate == OFF -> taken = 0; mstate = LISTED
		:: else -> skip
		fi
	fi;
	unlock()
}

/* percpuref_ref_exit() */
inline exit_ref()
{
	lock();
	touch();
	unstage();
	atomic {
		exited = 1;
#ifdef MUTANT_EXIT_LISTED_ONLY
		recl = (mstate == LISTED);
#else
		recl = (mstate != OFF);
#endif
		old = w;
		if
		:: recl -> w = w | EXITED | RECL
		:: else -> w = w | EXITED
		fi
#ifdef WITNESS_EXIT_BOTH
		;
		exit_found_both = (recl && (old & OWED) != 0)
#endif
	};
	unlock();
	if
	:: old == 0 && !recl -> free_impl()
	:: else -> skip
	fi
}

proctype U()
{
	byte old, left, n, life;
	bit z, ex, recl, m;

	do
	:: n < OPS ->
		n++;
		if
		:: /* reinit: percpu_ref_is_zero(), then resurrect */
			lock();
			z = (count == 0);
			unlock();
			if
			:: z -> resurrect()
			:: else -> skip
			fi
		:: /* resurrect: dead at any count */
			resurrect()
		:: uref > 0 -> atomic { touch(); count++; uref++ }	/* get */
		:: uref > 0 && !h_done ->	/* get, handed to H */
			atomic { touch(); count++; hheld++ }
		:: uref > 0 -> uref--; put(1, 0)
		:: uref > 0 ->	/* in its own handler, inside a section */
			uref--;
			put(1, 1);
			run_list(1)
		:: uref > 0 ->	/* kill */
			lock();
			touch();
			if
			:: managed || dead -> unlock()	/* refused */
			:: else ->
				dead = 1;
				unlock();
				uref--;
				put(1, 0)
			fi
		:: uref > 0 ->	/* switch_to_managed */
			lock();
			touch();
			if
			:: !dead && !managed ->
				count++;
				managed = 1;
				if
				:: mstate == OFF -> taken = 0; mstate = LISTED
				:: else -> skip
				fi
			:: else -> skip	/* refused */
			fi;
			unlock()
		:: uref > 0 ->	/* switch_to_unmanaged */
			lock();
			touch();
			if
			:: managed && !dead ->
				managed = 0;
				unstage();
				unlock();
				atomic { count--; assert(count > 0) }
			:: else -> unlock()	/* refused */
			fi
		:: hheld == 0 && inflight == 0 -> exit_ref(); break
		fi
	:: else -> break
	od;
	u_done = 1
}

/* One pass of the reclaimer over the node, when it is listed. */
inline pass()
{
	if
	:: (w & EXITED) ->	/* node_exited(): no stripe */
		drop_recl()
	:: else ->
		lock();
		if
		:: exited -> drop_recl()	/* MANAGED_FREE */
		:: !exited && !managed -> mstate = OFF	/* MANAGED_UNLINK */
		:: !exited && managed && count == 1 ->
			/* begin, fence, finish: the CAS from the
			 * manager's (and the switch's) to zero */
			count = 0;
			dead = 1;
			mstate = RELEASING;
			zeros++;
			mpending = 1;
			revived = 0;
			rel = 1
#ifdef MUTANT_EXITED_AT_FINISH
			;
			ex = exited
#endif
		:: else -> skip	/* held: back to per-CPU */
		fi;
		unlock()
	fi;
	if
	:: rel ->
		rel = 0;
		/* percpuref_managed_release() */
		touch();
		lock();
		atomic {
#ifdef MUTANT_EXITED_AT_FINISH
			go = !ex && !voided;
#else
			go = !exited && !voided;
#endif
			if
			:: go ->
				assert(!revived);
				begins()
			:: !go && exited -> skips++
			:: !go && !exited ->
				assert(revived);
				voids++
			fi;
#ifdef MUTANT_CLEAR_AT_TEST
			voided = 0;
#endif
			mpending = 0
		};
		unlock();
		/* the release runs here; then release_done() */
#ifdef MUTANT_DONE_UNLOCKED
		ex = exited;
		lock();
		if
		:: ex ->
#else
		lock();
		if
		:: exited ->
#endif
			unlock();
			drop_recl()
#ifdef WITNESS_EXIT_RELEASING
			;
			recl_freed_releasing = freed
#endif
		:: else ->
			touch();
#if !defined(MUTANT_NO_CLEAR) && !defined(MUTANT_CLEAR_AT_TEST)
			voided = 0;
#endif
			mstate = OFF;
			if
			:: managed && !dead -> taken = 0; mstate = LISTED
			:: else -> skip
			fi;
			unlock()
		fi
	:: else -> skip
	fi
}

proctype R()
{
	byte left;
	bit rel, go, ex;

	do
	:: atomic { mstate == LISTED && !recl_gone -> taken = 1 }; pass()
	:: h_done && u_done ->
		if
		:: atomic { mstate == LISTED && !recl_gone -> taken = 1 }; pass()
		:: else -> skip
		fi;
		break
	od
}

init {
	atomic {
		if
		:: /* killed, H's reference the last (handler-release-*) */
			dead = 1;
			count = 1;
			hheld = 1
		:: /* managed: the manager's, H's and U's */
			managed = 1;
			mstate = LISTED;
			count = 3;
			hheld = 1;
			uref = 1
		fi;
		run H();
		run U();
		run R()
	}
	_nr_pr == 1;
	assert(links == 0);
	assert(freed == exited);
	assert(zeros == ran + voids + skips);
#ifdef WITNESS_VOID_THEN_ZERO
	assert(ran_after_void == 0)
#endif
#ifdef WITNESS_EXIT_SKIPS
	assert(!runner_freed)
#endif
#ifdef WITNESS_EXIT_RELEASING
	assert(!recl_freed_releasing)
#endif
#ifdef WITNESS_EXIT_BOTH
	assert(!exit_found_both)
#endif
}
