/* SPDX-License-Identifier: MIT */
/*
 * stage.pml - Model L: a node taken back off its CPU's stage
 * (src/managed.c, percpuref_managed_unstage(); 0.4.17).
 *
 * A stage is a push-only stack: pushers CAS its top, and a pass takes the
 * whole stack with one exchange, after which the nodes are the reclaimer's
 * (it unlinks those of refs no longer managed, under each ref's switch
 * lock).  The one pop: a ref unmanaged (or exited) while its node is still
 * the top of its stage replaces the top by the node below, one CAS from
 * the node to the next pointer it read, under the ref's switch lock, which
 * every push of that node also holds (list_node() pushes only a node no
 * longer listed, and only the reclaimer's unlink, under the same lock,
 * makes it so).  The argument: a node read on top has been there since its
 * push, so the node below it then is below it still, on the stage.  A general pop needs tags or hazard pointers for
 * that (the ABA problem).
 *
 * Modelled: ref A, made managed (pushed, if not listed) and unmanaged
 * (taken back, if on top) ROUNDS times each by two threads, under A's
 * lock; ref B, managed throughout, pushed once on the same stage by a
 * third; the scanner, PASSES passes, each a take (the exchange; the nodes
 * reachable from what it returned become the reclaimer's) and then the
 * walk (an unmanaged node is unlinked and no longer listed, under its
 * lock; a managed one stays the reclaimer's).  Asserted: a take finds
 * only listed nodes that are not the reclaimer's already, in a chain
 * without a cycle; a pop hands the stage a node below that is not the
 * reclaimer's; at the end every managed ref's node is listed, and every
 * node is listed exactly when it is on the stage or the reclaimer's,
 * never both.
 *
 * Mutant -DMUTANT_POP_UNLOCKED: the pop outside A's switch lock (the lock
 * dropped once the ref is unmanaged).  The shortest trail: the other
 * thread manages A again, finds its node still listed and pushes nothing,
 * and the pop then takes the node off: a managed ref on no list, never
 * checked.  A longer one is the ABA: between the pop's read of the node
 * below and its CAS, a pass takes A and B, unlinks A, the other thread
 * manages A again and pushes it on the emptied stage; the CAS finds A on
 * top and puts B, the reclaimer's, back on the stage.  SPIN finds an
 * assertion violation either way.
 *
 * Mutant -DMUTANT_UNLINK_UNLOCKED: the other half of the argument, the
 * reclaimer's unlink without the ref's lock: it reads A unmanaged, the
 * other thread manages A again and, finding the node listed, pushes
 * nothing; the unlink then drops it: a managed ref on no list.
 *
 * Not shown here: why the pop swaps in the node recorded at the push
 * rather than the node's next pointer.  While the node is on top the two
 * are equal (the model's scanner never writes next[]); the code's scanner
 * writes the next pointer of a node it took, which a pop that then fails
 * would have read unordered, a data race (ThreadSanitizer saw it in
 * stress_managed), not a wrong value.
 */

#define NIL	255
#define A	0
#define B	1
#define NODES	2
#define ROUNDS	2
#define PASSES	3

byte stage = NIL;		/* the stage's top */
byte next[NODES];
byte below_of[NODES];		/* the node below at the push */
bit managed[NODES];
bit listed[NODES];		/* mstate MNODE_LISTED */
bit reclaimers[NODES];		/* taken by a pass, not unlinked yet */
bit lock_a;			/* A's switch lock */
byte finished;

inline lock()
{
	atomic { !lock_a -> lock_a = 1 }
}

inline unlock()
{
	lock_a = 0
}

/* A's lock around the pop, and around the reclaimer's unlink; each mutant
 * drops one of them (the pop's: released before it). */
inline pop_unlock_before()
{
#ifdef MUTANT_POP_UNLOCKED
	unlock()
#else
	skip
#endif
}

inline pop_unlock_after()
{
#ifdef MUTANT_POP_UNLOCKED
	skip
#else
	unlock()
#endif
}

inline unlink_lock()
{
#ifdef MUTANT_UNLINK_UNLOCKED
	skip
#else
	lock()
#endif
}

inline unlink_unlock()
{
#ifdef MUTANT_UNLINK_UNLOCKED
	skip
#else
	unlock()
#endif
}

/* percpuref_managed_push(): read the top, link below it, CAS. */
inline push(node)
{
	do
	:: top = stage;
		next[node] = top;
		if
		:: atomic { stage == top -> stage = node }; break
		:: atomic { stage != top -> skip }
		fi
	od;
	below_of[node] = top
}

/* percpuref_managed_unstage(): one CAS from the node to the node below. */
inline unstage(node)
{
	below = below_of[node];
	atomic {
		if
		:: stage == node ->
			assert(!reclaimers[node]);
			assert(below == NIL || (listed[below] && !reclaimers[below]));
			stage = below;
			listed[node] = 0
		:: else -> skip
		fi
	}
}

/* percpu_ref_switch_to_managed() of A: list_node(). */
active proctype manage_a()
{
	byte top, round;

	for (round : 1 .. ROUNDS) {
		lock();
		if
		:: !managed[A] ->
			managed[A] = 1;
			if
			:: !listed[A] -> listed[A] = 1; push(A)
			:: else -> skip
			fi
		:: else -> skip
		fi;
		unlock()
	}
	finished++
}

/* percpu_ref_switch_to_unmanaged() of A: unstage_node(). */
active proctype unmanage_a()
{
	byte below, round;

	for (round : 1 .. ROUNDS) {
		lock();
		if
		:: managed[A] ->
			managed[A] = 0;
			pop_unlock_before();
			if
			:: listed[A] -> unstage(A)
			:: else -> skip
			fi;
			pop_unlock_after()
		:: else -> unlock()
		fi
	}
	finished++
}

/* Another ref of the same CPU, managed throughout. */
active proctype push_b()
{
	byte top;

	managed[B] = 1;
	listed[B] = 1;
	push(B);
	finished++
}

active proctype scanner()
{
	byte pass, x, steps;

	for (pass : 1 .. PASSES) {
		/* take_stages(): the exchange; the chain is the reclaimer's. */
		atomic {
			x = stage;
			stage = NIL;
			steps = 0;
			do
			:: x == NIL -> break
			:: else ->
				assert(listed[x] && !reclaimers[x]);
				reclaimers[x] = 1;
				x = next[x];
				steps++;
				assert(steps <= NODES)
			od
		};
		/* The walk: an unmanaged node is unlinked (MANAGED_UNLINK),
		 * under its ref's switch lock. */
		if
		:: reclaimers[A] ->
			unlink_lock();
			if
			:: !managed[A] -> reclaimers[A] = 0; listed[A] = 0
			:: else -> skip
			fi;
			unlink_unlock()
		:: else -> skip
		fi
	}
	finished++
}

/* At the end: listed exactly when on the stage or the reclaimer's. */
active proctype check()
{
	byte x, steps;
	bit on_stage[NODES];

	finished == 4;
	x = stage;
	steps = 0;
	do
	:: x == NIL -> break
	:: else ->
		assert(!on_stage[x]);
		on_stage[x] = 1;
		x = next[x];
		steps++;
		assert(steps <= NODES)
	od;
	for (x : 0 .. NODES - 1) {
		assert(!managed[x] || listed[x]);
		assert(!(on_stage[x] && reclaimers[x]));
		assert(listed[x] == (on_stage[x] || reclaimers[x]))
	}
}
