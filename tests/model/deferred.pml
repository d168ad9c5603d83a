/* SPDX-License-Identifier: MIT */
/*
 * deferred.pml - Model Q: a barrier (percpuref_wait_deferred()) returns
 * only once every item queued before its call has run, whichever queue
 * the item was on: the callback thread's stack, a polling thread's queue,
 * a poll's batch in flight, or moved between them meanwhile.
 *
 * src/deferred.c.  push_pending() increments nr_queued, then pushes the
 * item with a CAS; a batch (run_batch(), under the batch lock from before
 * it takes the stack until it counted) takes the whole stack with one
 * exchange, runs it, and adds the number run to nr_done under
 * deferred_lock.  A polling thread's items go on its FIFO under its lock
 * (percpuref_call_after_grace_period()); its poll (percpu_ref_poll())
 * takes a covered prefix under the lock and counts it in nr_taken, runs it
 * with the lock dropped, and adds it to nr_done under the lock.  A caller
 * waiting for a switch in flight moves that switch's item off the poller's
 * queue onto the stack, pushing under the poller's lock
 * (percpuref_deferred_take_polled_item()).  The barrier: every poller's
 * queue onto the stack, each under its lock (take_all_polled()); target =
 * nr_queued; wait for nr_done >= target, running a batch itself whenever
 * no thread can start; then, for each other poller, wait until its
 * nr_done reaches the nr_taken read under its lock (wait_polled_batches()).
 *
 * Modelled: one poller P that queues two items (0, 1) and polls up to
 * twice, each poll taking any prefix of its queue (the fences that cover
 * them are not modelled: any prefix is a superset of the covered ones);
 * a user U that pushes two items (2, 3) onto the stack; a mover M that
 * moves item 1 off P's queue if it is still there; the callback thread T,
 * which runs a batch whenever the stack is not empty; and the barrier B,
 * which starts at any point and may also run batches itself at any turn
 * of its wait (as where no thread can start; here T runs as well, so the
 * batch lock is what keeps their batches apart).  A batch runs its items
 * in any order (the C runs them oldest first).  A lock section that
 * touches only what its lock guards is one step (Lipton's reduction, as
 * in Model O); a push inside one, whose words the thread reads without
 * the lock, is two (the count, then the CAS); memory is sequentially
 * consistent (the C's locks, the exchange's acquire and the CAS's release
 * order what the model's steps order).
 *
 * Asserted: no item runs twice; when B returns, every item whose queueing
 * call had returned when B was called has run.
 *
 * Mutants (each must fail on `before_ran`, the barrier's assertion):
 *  -DMUTANT_TARGET_FIRST: B reads nr_queued before it takes the pollers'
 *   queues: the items it pushes itself are not in its target.
 *  -DMUTANT_MOVE_UNLOCKED: the mover pushes item 1 after dropping the
 *   poller's lock: B's hand-over finds the queue without it and B's
 *   target without it.
 *  -DMUTANT_COUNT_AFTER_PUSH: push_pending() counts after its CAS: a batch
 *   that took an item not counted yet counts it done, and nr_done reaches
 *   a target whose item is still on the stack.
 *  -DMUTANT_NO_BATCH_LOCK: a runner takes the stack before the batch lock:
 *   a second batch of later items is counted while the first one's items
 *   wait to run.
 *  -DMUTANT_TAKEN_AT_DONE: a poll counts its items taken only with its
 *   done count: B reads nr_taken without the batch it is running.
 *  -DMUTANT_NO_WAIT_POLLED: B does not wait for the polls' batches
 *   (wait_polled_batches()).
 *
 * -DLEAVE: P then stops polling (percpu_ref_poll_unregister(),
 * poller_leave()): what is left on its queue goes onto the stack, pushed
 * under its lock.  Mutant -DLEAVE -DMUTANT_LEAVE_UNLOCKED: pushed after
 * the unlock, B's hand-over finds the queue empty and its target without
 * them.
 */

#define NITEMS	4
#define P0	0
#define P1	1
#define U0	2
#define U1	3

bit batch_lock;
bit poller_lock;
byte nr_queued, nr_done;		/* the callback thread's counts */
byte nr_taken, poller_done;		/* P's counts */
bit on_stack[NITEMS];
byte queue[2];				/* P's FIFO, oldest first */
byte queue_len;
bit queued[NITEMS];			/* ghost: its queueing call returned */
bit ran[NITEMS];
bit before[NITEMS];			/* ghost: queued when B was called */
bit before_ran;				/* ghost: B's verdict */

#define stack_empty	(!on_stack[P0] && !on_stack[P1] && !on_stack[U0] && !on_stack[U1])

inline run_item(i)
{
	atomic {
		assert(!ran[i]);
		ran[i] = 1
	}
}

/* push_pending(): the count, then the CAS (one step: the stack is a set). */
inline push_pending(i)
{
#ifdef MUTANT_COUNT_AFTER_PUSH
	on_stack[i] = 1;
	nr_queued++
#else
	nr_queued++;
	on_stack[i] = 1
#endif
}

/*
 * run_batch(): the exchange takes the stack, its items run, and their
 * number is added to nr_done (one step: deferred_lock's section, which
 * the barrier's test of nr_done shares).  The caller declares batch, n
 * and i.
 */
inline take_stack()
{
	atomic {
		for (i : 0 .. NITEMS - 1) {
			batch[i] = on_stack[i];
			n = n + on_stack[i];
			on_stack[i] = 0
		}
		i = 0
	}
}

inline run_batch()
{
#ifdef MUTANT_NO_BATCH_LOCK
	take_stack();
	atomic { !batch_lock -> batch_lock = 1 };
#else
	atomic { !batch_lock -> batch_lock = 1 };
	take_stack();
#endif
	do
	:: batch[P0] -> batch[P0] = 0; run_item(P0)
	:: batch[P1] -> batch[P1] = 0; run_item(P1)
	:: batch[U0] -> batch[U0] = 0; run_item(U0)
	:: batch[U1] -> batch[U1] = 0; run_item(U1)
	:: else -> break
	od;
	atomic {
		nr_done = nr_done + n;
		n = 0;
		batch_lock = 0
	}
}

active proctype callback_thread()
{
	bit batch[NITEMS];
	byte n, i;

end:
	do
	:: !stack_empty -> run_batch()
	od
}

/* percpuref_call_after_grace_period() from a registered thread: its
 * lock section, one step (it touches only what the lock guards). */
inline poller_queue(item)
{
	atomic {
		!poller_lock ->
		queue[queue_len] = item;
		queue_len++;
		queued[item] = 1
	}
}

active proctype poller()
{
	bit rest[NITEMS];
	byte k, n, polls = 0;
#ifdef LEAVE
	byte left[2];
#endif

	poller_queue(P0);
	poller_queue(P1);
end:
	do
	:: polls < 2 ->
		polls++;
		/* percpu_ref_poll(): the covered prefix into rest, counted
		 * taken (poller_take_covered(), one lock section) */
		atomic {
			!poller_lock ->
			do
			:: n < queue_len -> n++
			:: break
			od;
			for (k : 0 .. n - 1) {
				rest[queue[k]] = 1
			}
			for (k : n .. queue_len - 1) {
				queue[k - n] = queue[k]
			}
			queue_len = queue_len - n;
#ifndef MUTANT_TAKEN_AT_DONE
			nr_taken = nr_taken + n;
#endif
			k = 0
		}
		do
		:: rest[P0] -> rest[P0] = 0; run_item(P0)
		:: rest[P1] -> rest[P1] = 0; run_item(P1)
		:: else -> break
		od;
		atomic {
			!poller_lock ->
#ifdef MUTANT_TAKEN_AT_DONE
			nr_taken = nr_taken + n;
#endif
			poller_done = poller_done + n;
			n = 0
		}
	:: else -> break
	od;
#ifdef LEAVE
	/* poller_leave(): the queue onto the stack, pushed under its lock */
	atomic {
		!poller_lock -> poller_lock = 1;
		k = queue_len;
		left[0] = queue[0];
		left[1] = queue[1];
		queue_len = 0
	}
#ifdef MUTANT_LEAVE_UNLOCKED
	poller_lock = 0;
#endif
	if
	:: k > 0 -> push_pending(left[0])
	:: else -> skip
	fi;
	if
	:: k > 1 -> push_pending(left[1])
	:: else -> skip
	fi;
	atomic { poller_lock = 0; k = 0; left[0] = 0; left[1] = 0 }
#endif
}

active proctype user()
{
	push_pending(U0);
	queued[U0] = 1;
	push_pending(U1);
	queued[U1] = 1
}

/*
 * percpuref_deferred_take_polled_item(item 1), by a caller waiting for
 * its switch: the lookup and unlink in the lock section's first step,
 * the push in two, the unlock with the last.
 */
active proctype mover()
{
	byte k;
	bit found;

	queued[P1];
	atomic {
		!poller_lock -> poller_lock = 1;
		for (k : 0 .. queue_len - 1) {
			if
			:: queue[k] == P1 -> found = 1
			:: found -> queue[k - 1] = queue[k]
			:: else -> skip
			fi
		}
		queue_len = queue_len - found;
		k = 0
	}
	if
	:: found ->
#ifdef MUTANT_MOVE_UNLOCKED
		poller_lock = 0;
		push_pending(P1)
#else
		push_pending(P1);
		poller_lock = 0
#endif
	:: else -> poller_lock = 0
	fi
}

active proctype barrier()
{
	bit batch[NITEMS];
	byte target, n, i, k, nhanded;
	byte handed[2];

	atomic {
		for (i : 0 .. NITEMS - 1) {
			before[i] = queued[i]
		}
		i = 0
	}
#ifdef MUTANT_TARGET_FIRST
	target = nr_queued;
#endif
	/* take_all_polled(): P's queue onto the stack, pushed under its lock */
	atomic {
		!poller_lock -> poller_lock = 1;
		nhanded = queue_len;
		handed[0] = queue[0];
		handed[1] = queue[1];
		queue_len = 0
	}
	for (k : 0 .. nhanded - 1) {
		push_pending(handed[k])
	}
	atomic {
		poller_lock = 0;
		k = 0;
		nhanded = 0;
		handed[0] = 0;
		handed[1] = 0
	}
#ifndef MUTANT_TARGET_FIRST
	target = nr_queued;
#endif
	/* percpuref_wait_deferred(): until nr_done reaches target; where no
	 * thread can start, it runs the batches itself */
	do
	:: nr_done >= target -> break
	:: nr_done < target && !stack_empty -> run_batch()
	od;
#ifndef MUTANT_NO_WAIT_POLLED
	/* wait_polled_batches(): until P's nr_done reaches the nr_taken read */
	atomic { !poller_lock -> target = nr_taken };
	atomic { !poller_lock && poller_done >= target };
#endif
	atomic {
		before_ran = 1;
		for (i : 0 .. NITEMS - 1) {
			before_ran = before_ran && (!before[i] || ran[i])
		}
		assert(before_ran)
	}
}
