/* SPDX-License-Identifier: MIT */
/*
 * rcuref_zones.pml - Model U: rcuref_t (include/percpuref/rcuref.h, the
 * slow paths in src/refcount_baselines.c): get and put, fast and slow
 * paths, with the zones scaled down so that every zone is reachable.
 *
 * The 32-bit count becomes a 5-bit one (mod 32), each constant divided by
 * 2^27, which keeps the zones' relative layout and the sign test:
 *   ONEREF 0, MAXREF 15, saturation zone 16..23 (SATURATED 20),
 *   dead zone 24 (RELEASED) .. 31 (NOREF), DEAD 28.
 * "(int)cnt >= 0" is "cnt < 16".  Each marker sits 4 values from the edge
 * of its zone (2^29 in the code); the model's three threads have at most
 * three operations between their atomic and their pin, as the code's
 * 2^29 is "more racing operations than can exist".
 *
 * Each atomic (the get's add_fetch, the put's sub_fetch, the last put's
 * cmpxchg, the pins' stores) is one step; SPIN's interleaving is
 * sequentially consistent, so memory orders are NOT modelled (the
 * release/acquire argument in rcuref.h is checked by review and TSan
 * only).  RCU: each get and put runs in a read-side section (the put's
 * is rcuref_put()'s urcu_bp_read_lock(); a get by a thread holding no
 * reference is a lookup: it finds the object only while it is
 * published).  The put whose cmpxchg returns true unpublishes the object,
 * then a grace period (each thread seen outside a section) frees it.
 *
 * Scenarios (init picks one): RACE: the count at ONEREF, held by thread
 * 0; thread 0 may get once more, threads 1 and 2 look the object up and
 * get up to twice each, and every thread puts what it holds: last puts
 * race with revivals and with gets on the dead count.  SATURATE: the count at MAXREF - 1 (15
 * references, 12 held by a holder that never puts), one each held by the
 * three threads, which get and put: gets cross MAXREF, pins race with
 * puts.  With -DMISUSE, a third scenario: RACE plus one imbalanced put by
 * a thread that holds no reference.
 *
 * Checked (balanced scenarios): a put returns true at most once, only
 * with no reference held, and with the count then DEAD; no get succeeds
 * after that (use after release), and no get fails before it; no access
 * to the count after the free; no imbalance warning; once a pin stored
 * SATURATED nothing is released and the count ends at SATURATED; with
 * every reference put (RACE), exactly one put returned true and the
 * count ends DEAD.  With MISUSE: at most one release (an imbalanced put
 * may release with a reference held, and be missed: a count cannot
 * tell; the model does not check those).
 *
 * Options: -DKERNEL_GET_REREAD: the get slow path re-reads the count, as
 * the kernel's still does (the port passes the add's result): must pass.
 * -DCHECK_SAT_REPORT_ONCE: asserts rcuref.h's "saturation (reported)
 * once per object": fails (two gets can each cross MAXREF).
 * Mutants: -DMUTANT_PUT_REREAD: the put slow path re-reads the count,
 * as the kernel did before 6.15 ("rcuref: Plug slowpath race in
 * rcuref_put()"), with its "if (cnt > MAXREF)" guard on the saturation
 * pin: a put that dropped the last reference re-reads after a revival, a
 * put and that put's DEAD, and warns of an imbalanced put that was not
 * one (false_imbalance, the only violation pan -c0 -e finds for it).
 * -DMUTANT_STORE_DEAD: the last put stores DEAD instead of its cmpxchg:
 * it kills a revived count (get_after_release, a release with a reference
 * held).  -DMUTANT_NO_DEAD_PIN: a failed get does not reset the
 * count to DEAD: failed gets walk it out of the dead zone, a get revives
 * it after the release.  -DMUTANT_SAT_GET_FAILS: a get in the saturation
 * zone fails.  -DMUTANT_NO_PUT_PIN: a put in the saturation zone does not
 * pin it back: the count drifts from SATURATED.  -DMUTANT_PUT_NO_RCU:
 * rcuref_put() without its read-side section: the late cmpxchg of a put
 * preempted after its decrement writes freed memory (the deconstruction
 * race in rcuref.h).
 */

#define N	32	/* the scaled count's modulus */
#define MAXREF	15
#define SATURATED 20
#define RELEASED 24
#define DEAD	28
#define NOREF	31

#define RACE	0
#define SATURATE 1
#define MISUSED	2

byte c;			/* ref->refcnt */
byte scenario;
bit misuse;		/* the scenario has an imbalanced put */
byte held;		/* references held by threads (ghost) */
/* Ghosts, each the one failing assertion its name says (no misuse). */
bit get_after_release, get_failed_live, false_imbalance;
bit released;		/* a put returned true */
bit published = 1;
bit freed;
bit warned_imbalance;
bit pinned_sat;		/* a pin stored SATURATED */
byte sat_reports;
bit in_cs[3];
byte finished;

/* Every access to the count: never after the free (with MISUSE, a
 * holder whose reference the imbalanced put released may well: not
 * checked there). */
inline touch()
{
	assert(misuse || !freed)
}

/* rcuref_get(): the caller is in a read-side section.  Sets ok. */
inline do_get()
{
	atomic { touch(); c = (c + 1) % N; cnt = c };
	if
	:: cnt <= MAXREF -> ok = 1
	:: else ->
		/* rcuref_get_slowpath() */
#ifdef KERNEL_GET_REREAD
		atomic { touch(); cnt = c };
#endif
		if
		:: cnt >= RELEASED ->
#ifndef MUTANT_NO_DEAD_PIN
			atomic { touch(); c = DEAD };
#endif
			ok = 0
		:: else ->
#ifdef KERNEL_GET_REREAD
			if
			:: cnt > MAXREF ->
				atomic { touch(); c = SATURATED; pinned_sat = 1 }
			:: else -> skip
			fi;
			ok = 1
#else
			if
			:: cnt == MAXREF + 1 -> sat_reports++
			:: else -> skip
			fi;
			atomic { touch(); c = SATURATED; pinned_sat = 1 };
#ifdef MUTANT_SAT_GET_FAILS
			ok = 0
#else
			ok = 1
#endif
#endif
		fi
	fi;
	/* One name per assertion: tests/CMakeLists.txt splits its specs at
	 * '|', so an expected violation cannot name an "a || b". */
	if
	:: ok -> atomic { get_after_release = !misuse && released;
			  assert(!get_after_release); held++ }
	:: else -> get_failed_live = !misuse && !released; assert(!get_failed_live)
	fi
}

/* The put that returns true, in the step of its cmpxchg. */
inline mark_released()
{
	assert(!released);
	assert(misuse || (held == 0 && !pinned_sat));
	released = 1
}

/* rcuref_put() (rcuref_put_rcusafe() inside the section).  mine: the
 * caller holds the reference it drops.  Sets ok. */
inline do_put(mine)
{
	atomic {
		touch();
		c = (c + N - 1) % N;
		cnt = c;
		if
		:: mine -> held--
		:: else -> skip
		fi
	};
	if
	:: cnt <= MAXREF -> ok = 0
	:: else ->
		/* rcuref_put_slowpath() */
#ifdef MUTANT_PUT_REREAD
		atomic { touch(); cnt = c };
#endif
		if
		:: cnt == NOREF ->
#ifdef MUTANT_STORE_DEAD
			atomic { touch(); c = DEAD; ok = 1; mark_released() }
#else
			atomic {
				touch();
				if
				:: c == NOREF -> c = DEAD; ok = 1; mark_released()
				:: else -> ok = 0
				fi
			}
#endif
		:: cnt >= RELEASED && cnt != NOREF ->	/* imbalanced */
			warned_imbalance = 1;
			atomic { touch(); c = DEAD };
			ok = 0
#ifdef MUTANT_PUT_REREAD
		:: cnt <= MAXREF -> ok = 0	/* the kernel's "if (cnt > MAXREF)" */
#endif
		:: cnt > MAXREF && cnt < RELEASED ->
#ifndef MUTANT_NO_PUT_PIN
			atomic { touch(); c = SATURATED; pinned_sat = 1 };
#endif
			ok = 0
		fi
	fi
}

proctype thread(byte me; byte own; byte gets; bit misput)
{
	byte cnt;
	bit ok;

	do
	:: gets > 0 ->
		gets--;
		in_cs[me] = 1;
		if
		:: own > 0 || published ->	/* holds it, or finds it */
			do_get();
			if
			:: ok -> own++
			:: else -> skip
			fi
		:: else -> skip
		fi;
		in_cs[me] = 0
	:: own > 0 ->
		own--;
#ifndef MUTANT_PUT_NO_RCU
		in_cs[me] = 1;
#endif
		do_put(1);
		in_cs[me] = 0;
		if
		:: ok -> published = 0		/* the caller unpublishes */
		:: else -> skip
		fi
	:: misput && published ->	/* an imbalanced put */
		misput = 0;
		in_cs[me] = 1;
		do_put(0);
		in_cs[me] = 0;
		if
		:: ok -> published = 0
		:: else -> skip
		fi
	:: own == 0 && gets == 0 -> break
	od;
	finished++
}

/* Frees the object a grace period after it was unpublished: every
 * thread seen outside a read-side section. */
proctype reclaimer()
{
end:	released && !published;
	!in_cs[0];
	!in_cs[1];
	!in_cs[2];
	freed = 1
}

init {
	atomic {
		if
		:: scenario = RACE
		:: scenario = SATURATE
#ifdef MISUSE
		:: scenario = MISUSED; misuse = 1
#endif
		fi;
		if
		:: scenario == RACE ->
			c = 0; held = 1;
			run thread(0, 1, 1, 0);
			run thread(1, 0, 2, 0);
			run thread(2, 0, 2, 0)
		:: scenario == SATURATE ->
			c = MAXREF - 1; held = 15;	/* 12 never put */
			run thread(0, 1, 1, 0);
			run thread(1, 1, 1, 0);
			run thread(2, 1, 1, 0)
		:: else ->
			c = 0; held = 1;
			run thread(0, 1, 1, 0);
			run thread(1, 0, 1, 1);
			run thread(2, 0, 1, 0)
		fi;
		run reclaimer()
	}
	finished == 3;
	if
	:: scenario == RACE ->
		assert(released);
		assert(c == DEAD);
		assert(held == 0)
	:: scenario == SATURATE ->
		assert(!released);
		assert(!pinned_sat || c == SATURATED);
#ifdef CHECK_SAT_REPORT_ONCE
		assert(sat_reports <= 1)
#endif
	:: else -> skip
	fi;
	false_imbalance = !misuse && warned_imbalance;
	assert(!false_imbalance)
}
