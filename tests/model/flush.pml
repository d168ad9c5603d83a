/* SPDX-License-Identifier: MIT */
/*
 * flush.pml - Model G: a flush's pass starts after the call, so every
 * managed ref whose last user reference was dropped before the call is
 * released by the time the flush returns (src/managed.c, scan_once() and
 * percpu_ref_managed_flush()).
 *
 * The list is a stack: a pass pushes a marker on top and walks only the
 * nodes below it; a node pushed later sits above the marker and waits for
 * the next pass.  A flush takes its target under managed_lock, as the pass
 * after the last one counted (passes_started + 1), and waits until that
 * many passes are done.  The proof needs the pass's start to be one step
 * under managed_lock: the check for an empty list, the marker's push and
 * the count.  Then a flush's lock section comes either before the pass
 * starts (the pass is its target, and its marker goes above every node
 * pushed before the call) or after (the pass is counted, and the target is
 * a later one).
 *
 * Modelled: USERS threads each push a managed ref of their own, drop their
 * reference (only the manager's is left) and flush; after the flush the
 * ref must be released.  The scanner runs a pass whenever a flush waits
 * for one, and up to EXTRA passes of its own (its interval), at any
 * moment.  Below the marker is a bit per ref, set for the refs on the list
 * when a marker is pushed; the walk releases a ref below the marker whose
 * count is the manager's alone.  The list is empty when no ref is on it.
 *
 * Mutants: -DMUTANT_COUNT_AFTER_PUSH: the marker is pushed, then the pass
 * counted in a later lock section (the code before 0.3.3): a flush in
 * between names a pass whose marker is below its ref.
 * -DMUTANT_EMPTY_UNLOCKED: the list is found empty before managed_lock is
 * taken to count the empty pass: a flush in between names that pass.
 * Both end with an assertion violation.
 */

#define USERS	3
#define EXTRA	2

bit locked;			/* managed_lock */
byte started, done;		/* passes_started, passes_done */
byte flush_target;
byte extra_left = EXTRA;
bit listed[USERS];		/* on the list */
bit below[USERS];		/* below the open pass's marker */
bit idle[USERS];		/* only the manager's reference is left */
bit released[USERS];

inline lock()
{
	atomic { !locked -> locked = 1 }
}

inline unlock()
{
	locked = 0
}

/* Every listed ref goes below the new marker: one step, the CAS. */
inline push_marker()
{
	atomic {
		for (i : 0 .. USERS - 1) {
			below[i] = listed[i]
		}
	}
}

inline list_empty(e)
{
	e = 1;
	for (i : 0 .. USERS - 1) {
		if
		:: listed[i] -> e = 0
		:: else -> skip
		fi
	}
}

active proctype scanner()
{
	byte i;
	bit is_empty;

end_idle:
	do
	:: flush_target > done || extra_left > 0 ->
		atomic {
			if
			:: flush_target <= done -> extra_left--
			:: else -> skip
			fi
		};
#ifdef MUTANT_EMPTY_UNLOCKED
		list_empty(is_empty);
		lock();
#else
		lock();
		list_empty(is_empty);
#endif
		if
		:: is_empty ->
			started++;
			done++;
			unlock()
		:: else ->
#ifdef MUTANT_COUNT_AFTER_PUSH
			unlock();
			push_marker();
			lock();
			started++;
			unlock();
#else
			push_marker();
			started++;
			unlock();
#endif
			/* The walk: a ref at a time, released if idle. */
			for (i : 0 .. USERS - 1) {
				atomic {
					if
					:: below[i] && listed[i] && idle[i] ->
						released[i] = 1;
						listed[i] = 0
					:: else -> skip
					fi;
					below[i] = 0
				}
			}
			lock();
			done++;
			unlock()
		fi
	od
}

active [USERS] proctype user()
{
	byte me = _pid - 1, target;

	listed[me] = 1;		/* init REL_MANAGED: the push */
	idle[me] = 1;		/* percpu_ref_put(): the manager's is left */
	/* percpu_ref_managed_flush() */
	lock();
	target = started + 1;
	if
	:: flush_target < target -> flush_target = target
	:: else -> skip
	fi;
	unlock();
	done >= target;
	assert(released[me])
}
