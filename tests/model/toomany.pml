/* SPDX-License-Identifier: MIT */
/*
 * toomany.pml - Model X: a put too many during the reclaimer's check of a
 * managed ref.
 *
 * src/percpu_ref.c: percpuref_managed_begin() (start_atomic_switch(),
 * and the filter's snapshot_held() with -DFILTERED),
 * percpuref_managed_finish() (fold_percpu_counts(), the pin of a count
 * at 1 or below zero, the compare-and-swap of 2 to 0, the drop of the
 * switch's reference and 0.4.31's pin when that leaves zero or less,
 * switch_to_percpu_locked() with its refusal at zero);
 * percpu_ref.h: percpu_ref_get()/put() (rseq section, or
 * __percpu_ref_atomic_add() / __percpu_ref_atomic_put() when FLAGGED),
 * __percpu_ref_count_misuse(), __percpu_ref_release_life() (the put that
 * reaches zero on a managed ref: pin_dropped_manager_ref()).
 *
 * Processes.  H, a correct holder: it holds the creator's reference and
 * makes OPS rounds of get and put, then puts its reference.  B, a buggy
 * holder: it holds one reference, puts it, and once H is done puts one
 * more, which drops the manager's reference (B waits for H: a put too
 * many while H still holds a reference takes the count to where the
 * manager's reference alone would be, and the ref is released under H,
 * in this library as in any count; not the case checked here).  R, the
 * reclaimer: SCANS passes while H and B run, then FINAL passes once they
 * are done.  A pass does nothing once the ref was released or is pinned
 * (begin's early unlink); otherwise it checks the ref: begin (set ATOMIC,
 * the switch's reference: none when the ref is atomic already,
 * start_atomic_switch() refuses), the reader fence, then finish.
 *
 * Asserted:
 *  - @release runs at most once, never while H or B holds a reference,
 *    and never after the put too many (released == 0, held == 0,
 *    extra == 0 at the compare-and-swap that releases);
 *  - the fold subtracts only a bias the count carries (biased);
 *  - the count is exact in every state until it is pinned (monitor: the
 *    count, less the bias while biased, plus the slot and what the fold
 *    took from it, equals the references held, the manager's and the
 *    switch's included, less the put too many);
 *  - no count at zero or below while atomic goes unobserved: whoever's
 *    read-modify-write took it there pins it next (pinning), or it was
 *    released (monitor, zero_seen);
 *  - once pinned, the count stays in the underflow zone, the bias taken
 *    off while the ref is biased (monitor, stays_pinned);
 *  - at the end, with no release, the ref is pinned: count SATURATED,
 *    atomic, impl->pinned set (begin unlinks it); exactly one warning for
 *    the one put too many.
 *
 * The count is 8 bits, and the constants keep the 64-bit code's zones and
 * sums: W 256 (2^64), the underflow zone from UZ 192 (3 * 2^62),
 * SATURATED 224 (7 * 2^61), BIAS 120 (2^63 - 2^32).  So, as in the code,
 * SATURATED + BIAS (88) and SATURATED + 1 - BIAS (105) read as ordinary
 * counts, and 0 - BIAS (136) is not in the underflow zone.  Every
 * read-modify-write is one step and returns the value the code tests; a
 * plain store (pin_count()) and a plain load are steps of their own.
 * The per-CPU words are one slot holding the net count (Models A and B
 * have several CPUs and the words' monotonic encoding, Model D the
 * filter's collects, Model J the unit-less word, none here); an rseq
 * section is a start step (arm, read the mode word) and a commit step
 * that restarts if the fence came between; memory is sequentially
 * consistent.  The switch lock is held by the reclaimer throughout a
 * check, and H and B make no call that takes it.  With -DFILTERED the
 * filter's snapshot is one atomic read of the count and the slot (the
 * double collect's consistent snapshot, filter.pml).
 *
 * The code.  Default: the fix proposed with this model (review 172): the
 * switch's reference and the bias go back in one compare-and-swap, from c
 * to c - 1 + BIAS, taken only for 1 < c < UZ; any other c pins the ref
 * (1: warned, a put dropped the manager's reference; 0 or below: the put
 * that went there warned).  -DCODE_0_4_31: the code of 0.4.31, a subtract
 * of the switch's reference (pinned at zero or below: the branch review
 * 169 added), then switch_to_percpu_locked(): a load that refuses zero,
 * the bias add and the mode word's store, each a step.
 *
 * Found (-DCODE_0_4_31 fails, 1,714 states): a put too many that lands
 * after the subtract and before the bias.  B's own put made per-CPU
 * before the pass, H's get and puts between the read and the subtract:
 * the subtract leaves 1, the manager's; B's put too many takes it to 0
 * and pins it.  Before switch_to_percpu_locked()'s load, the load
 * reads 0 and leaves the ref atomic, not marked pinned (and warns a second
 * time): the next pass's begin takes no switch's reference (atomic
 * already), and its fold subtracts a bias the count never had (biased; 0
 * becomes 136, 2^63 + 2^32 in the code, out of the underflow zone).
 * Between the load and the add, the add biases the zero and B's
 * SATURATED store lands on the biased count: the ref goes per-CPU with a
 * pin that reads as a count of 2^62 + 2^61 + 2^32 (stays_pinned), never
 * pinned again, checked (a switch and a fence) at every pass.  Neither
 * releases it.  tests/unit/repro_toomany.c lands the puts there in C.
 *
 * -DONE_STEP (with -DCODE_0_4_31): the subtract, the load and the bias
 * add as one step, which leaves only the window the 0.4.31 branch was
 * written for (the read to the compare-and-swap): it passes, and
 * -DMUTANT_NO_PIN, the branch removed, fails there (biased; zero_seen
 * too): the ref is left atomic at zero, unobserved, and the next fold
 * unbiases it.  Under the fix the pin of a count at 1 only pins a pass
 * earlier (the next fold finds 1), so removing it is no mutant there.
 *
 * -DFILTERED: the filter (snapshot_held()) lets the check go on only when
 * it sees no reference besides the manager's, and then no legitimate put
 * can come between the read and the swap: one put too many cannot reach
 * the window, in either code (the unit test sets BATCHED for that reason).
 */

#define W	256		/* 2^64 */
#define UZ	192		/* PERCPU_REF_UNDERFLOW_ZONE, 3 * 2^62 */
#define SAT	224		/* PERCPU_REF_SATURATED, 7 * 2^61 */
#define BIAS	120		/* PERCPU_COUNT_BIAS, 2^63 - 2^32 */
#define ATOMIC	1
#define DEAD	2

#ifndef OPS
#define OPS	1		/* H's get/put rounds */
#endif
#ifndef SCANS
#define SCANS	2		/* passes while H and B run */
#endif
#ifndef FINAL
#define FINAL	2		/* passes once they are done */
#endif

#define ADD(x, d)	(((x) + (d)) % W)
#define SUB(x, d)	(((x) + W - (d)) % W)

byte mode;			/* the mode word's flag bits */
byte count = BIAS + 3;		/* bias + the manager's, H's and B's */
short slot;			/* the per-CPU words' net count */
bit abort_rseq[2];		/* set by the fence: restart the section */
bit impl_pinned;		/* impl->pinned */

/* Ghosts. */
short truth = 3;		/* references the count stands for */
byte held = 2;			/* references H and B hold */
bit extra;			/* B's put too many has landed */
bit biased = 1;			/* the count carries BIAS */
short taken;			/* what the fold took from the slot, not yet added */
bit pinned;			/* a pin_count() store has happened */
byte pinning;			/* RMWs that saw zero or below, pin not yet stored */
byte released;			/* times @release ran */
byte warned;			/* misuse warnings */
bit h_done;
byte users_done;

/* The count less the bias while biased: what the code's zones test. */
#define UNBIASED	((count + W - (biased -> BIAS : 0)) % W)

/* pin_count(): relaxed store of SATURATED. */
inline pin()
{
	count = SAT;
	pinned = 1;
	pinning--
}

inline rseq_start(me)
{
	atomic {
		abort_rseq[me] = 0;
		m = mode
	}
}

/* percpu_ref_get() of a holder. */
inline get(me)
{
	do
	:: rseq_start(me);
	   if
	   :: m & ATOMIC ->
		/* __percpu_ref_atomic_add() */
		atomic {
			old = count;
			count = ADD(count, 1);
			truth++; held++;
			if
			:: old == 0 || old >= UZ -> pinning++; bad = 1
			:: else -> bad = 0
			fi
		};
		if
		:: bad ->	/* __percpu_ref_count_misuse() */
			atomic {
				if
				:: old < UZ -> warned++
				:: else
				fi;
				pin()
			}
		:: else
		fi;
		break
	   :: else ->
		atomic {
			if
			:: abort_rseq[me] -> skip	/* restart */
			:: else -> slot++; truth++; held++; break
			fi
		}
	   fi
	od
}

/* percpu_ref_put(); too_many: B's last. */
inline put(me, too_many)
{
	do
	:: rseq_start(me);
	   if
	   :: m & ATOMIC ->
		/* __percpu_ref_atomic_put(): sub_and_test */
		atomic {
			old = count;
			count = SUB(count, 1);
			truth--;
			if
			:: too_many -> extra = 1
			:: else -> held--
			fi;
			if
			:: old == 1 || SUB(old, 1) >= UZ -> pinning++; bad = 1
			:: else -> bad = 0
			fi
		};
		if
		:: bad ->
			/* At zero: __percpu_ref_release_life(), managed and
			 * the same life: pin_dropped_manager_ref().  Below:
			 * __percpu_ref_count_misuse(). */
			atomic {
				if
				:: old < UZ -> warned++
				:: else
				fi;
				pin()
			}
		:: else
		fi;
		break
	   :: else ->
		atomic {
			if
			:: abort_rseq[me] -> skip
			:: else ->
				slot--; truth--;
				if
				:: too_many -> extra = 1
				:: else -> held--
				fi;
				break
			fi
		}
	   fi
	od
}

proctype holder()
{
	byte i, m, old;
	bit bad;

	for (i : 1 .. OPS) {
		get(0);
		put(0, 0)
	}
	put(0, 0);		/* the creator's reference */
	h_done = 1;
	users_done++
}

proctype buggy()
{
	byte m, old;
	bit bad;

	put(1, 0);		/* its own */
	h_done;
	put(1, 1);		/* one too many: the manager's */
	users_done++
}

inline fence()
{
	atomic {
		abort_rseq[0] = 1;
		abort_rseq[1] = 1
	}
}

/* The ref's release: at the compare-and-swap that takes the count to 0. */
inline release()
{
	assert(released == 0);
	assert(held == 0);
	assert(extra == 0);
	released++
}

/* percpuref_managed_begin(), the fence, percpuref_managed_finish(): one
 * round of a do loop, which a break leaves early (a return). */
inline check()
{
	do
	:: true ->
#ifdef FILTERED
	/* snapshot_held(): skipped when held besides the manager. */
	atomic {
		v = ADD(count, W - BIAS);
		v = (v + slot + W) % W
	};
	if
	:: v > 1 && v < UZ -> break
	:: else
	fi;
#endif
	/* start_atomic_switch(): nothing when atomic already. */
	if
	:: mode & ATOMIC -> skip
	:: else ->
		mode = mode | ATOMIC;
		atomic { count = ADD(count, 1); truth++ }
	fi;
	fence();
	/* fold_percpu_counts(): after the fence no commit lands. */
	atomic { copy = slot; slot = 0; taken = copy };
	atomic {
		assert(biased);		/* the bias it takes off is there */
		count = (count + W + copy + W - BIAS) % W;
		biased = 0;
		taken = 0;
		v = count;
		if
		:: v == 0 || v >= UZ -> pinning++; bad = 1
		:: else -> bad = 0
		fi
	};
	if
	:: bad -> atomic { warned++; pin() }
	:: else
	fi;
	/* The relaxed load, and the pin of a count at 1 or below zero. */
	v = count;
	if
	:: v == 1 || v >= UZ ->
		atomic { pinning++; if :: v == 1 -> warned++ :: else fi };
		atomic { pin(); impl_pinned = 1 };
		break
	:: else
	fi;
	/* The compare-and-swap of 2 to 0. */
	atomic {
		if
		:: count == 2 ->
			count = 0;
			truth = truth - 2;
			mode = mode | DEAD;
			release();
			ok = 1
		:: else -> ok = 0
		fi
	};
	if
	:: ok -> break
	:: else
	fi;
#ifdef CODE_0_4_31
#ifdef ONE_STEP
	atomic {	/* the subtract to the bias add: no put between */
#endif
	/* The switch's reference: a subtract. */
	atomic {
		count = SUB(count, 1);
		truth--;
		v = count;
		if
		:: v == 0 || v >= UZ ->
#ifndef MUTANT_NO_PIN
			pinning++;
#endif
			bad = 1
		:: else -> bad = 0
		fi
	};
#ifndef MUTANT_NO_PIN
	if
	:: bad ->
		atomic { if :: v == 0 -> warned++ :: else fi; pin(); impl_pinned = 1 };
		break
	:: else
	fi;
#endif
	/* switch_to_percpu_locked(): load, refuse zero, add the bias. */
	v = count;
	if
	:: v == 0 ->
		warned++;	/* "count is zero (released); stays atomic" */
		break
	:: else
	fi;
	atomic { count = ADD(count, BIAS); biased = 1 };
#ifdef ONE_STEP
	};
#endif
#else
	/* The fix: the switch's reference and the bias in one
	 * compare-and-swap, taken only from 1 < c < UZ. */
	atomic {
		v = count;
		if
		:: v > 1 && v < UZ ->
			count = ADD(v, BIAS - 1);
			truth--;
			biased = 1;
			bad = 0
		:: else -> pinning++; bad = 1
		fi
	};
	if
	:: bad ->
		/* The switch's reference goes under the pin. */
		atomic {
			if :: v == 1 -> warned++ :: else fi;
			truth--; pin(); impl_pinned = 1
		};
		break
	:: else
	fi;
#endif
	mode = mode & ~ATOMIC;	/* release store: per-CPU again */
	break
	od
}

inline pass()
{
	if
	:: released || impl_pinned -> skip	/* unlinked */
	:: else -> check()
	fi
}

proctype reclaimer()
{
	byte s, v;
	short copy;
	bit bad, ok;

	for (s : 1 .. SCANS) {
		pass()
	}
	users_done == 2;
	for (s : 1 .. FINAL) {
		pass()
	}
	assert(pinning == 0);
	assert(released || (impl_pinned && count == SAT && (mode & ATOMIC)));
	assert(warned == 1)		/* one put too many, one warning */
}

/* Every state. */
active proctype monitor()
{
end:	atomic {
		!(pinned ||
		  (count + W - (biased -> BIAS : 0) + slot + taken + W) % W == (truth + W) % W) ->
		assert(pinned ||
		       (count + W - (biased -> BIAS : 0) + slot + taken + W) % W == (truth + W) % W)
	}
}

/* No zero or below while atomic without its pin on the way. */
active proctype zero_monitor()
{
	bit zero_seen;
end:	atomic {
		(!biased && truth <= 0 && !released && !pinned && pinning == 0) ->
		zero_seen = 1;
		assert(!zero_seen)
	}
}

/* A pin stays a pin. */
active proctype pin_monitor()
{
	bit stays_pinned;
end:	atomic {
		(pinned && UNBIASED < UZ) ->
		stays_pinned = 0;
		assert(stays_pinned)
	}
}

init
{
	atomic {
		run holder();
		run buggy();
		run reclaimer()
	}
}
