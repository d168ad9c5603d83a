/* SPDX-License-Identifier: MIT */
/*
 * hcount_limit.pml - Model P: in hcount's no-cache mode, once a lowering
 * of a limit returns 0, no charge completes above the new limit.
 *
 * src/hcount.c, no-cache mode: no locks.  A charge (nocache_charge())
 * walks from its namespace to the root; at each level it reads the limit
 * and the count, compare-and-swaps count + n in when it fits, re-reads the
 * limit, and takes the units back (and from the levels below) when the
 * re-read limit is passed; the walk done, it adds n to own.
 * hcount_ns_set_limit() (under the tree mutex, one setter at a time)
 * exchanges the new limit in, reads the count, and puts the old limit
 * back with -EBUSY when the count is above the new one.  The CAS and the
 * re-read, against the exchange and the read, are a Dekker pair
 * (sequentially consistent in the C): either the lowering reads the
 * charge's units or the charge reads the lowered limit.
 *
 * Modelled: the root R with limit OLD and its child X (unlimited); CHARGERS
 * threads each charge 1 unit at X and, when that succeeds, uncharge it
 * (own first, then each count); one setter lowers R's limit to NEW once,
 * at any point.  Each access to a shared word is one step; memory is
 * sequentially consistent, as the seq_cst accesses of the pair make it
 * for these words.
 *
 * Asserted: whenever a charge completes, and when the lowering returns 0,
 * if the lowering has returned 0, the units held at R (charges completed
 * and not yet uncharged) are within NEW.  At the end: the counts are 0 and
 * the limit is NEW or OLD as the lowering returned.  Not asserted: that
 * a refusal was due (a charge that overlaps a lowering that fails may be
 * refused against the limit it tried; docs/hcount.md).
 *
 * Sequentially consistent: the pair's seq_cst accesses are taken as
 * given, so the model shows the order of the steps, not their memory
 * orders (weaker ones would pass it too).
 *
 * Mutants (each must fail on `(held<=1)`, the lowered limit):
 *  -DMUTANT_READ_COUNT_FIRST: the setter reads the count before it
 *   exchanges the limit in: a charge between the two passes the old limit
 *   and the lowering passes the old count.
 *  -DMUTANT_NO_RECHECK: the charge does not re-read the limit after its
 *   CAS: one that read the old limit completes after the lowering read
 *   the count without it.
 */

#define OLD	3
#define NEW	1	/* the mutants' tests look for "(held<=1)" */
#define CHARGERS 3
#define R	0
#define X	1

byte limit[2];
byte count[2];
byte own;		/* own(X) */
byte held;		/* ghost: units of completed charges not yet uncharged */
bit lowered;		/* the lowering returned 0 */
byte finished;

proctype charger()
{
	byte y, lim, c, z;
	bit ok;

	/* nocache_charge(ns = X, n = 1) */
	y = X;
	ok = 1;
	do
	:: lim = limit[y];
	   c = count[y];
	   do
	   :: 1 > lim - c -> ok = 0; break
	   :: else ->
		atomic {
			if
			:: count[y] == c -> count[y] = c + 1; break
			:: else -> c = count[y]		/* the CAS failed */
			fi
		}
	   od;
	   if
	   :: !ok -> break
	   :: else
	   fi;
#ifndef MUTANT_NO_RECHECK
	   if
	   :: c + 1 > limit[y] -> count[y] = count[y] - 1; ok = 0; break
	   :: else
	   fi;
#endif
	   if
	   :: y == R -> break
	   :: else -> y = R
	   fi
	od;
	if
	:: ok ->
		atomic {
			own = own + 1;
			held = held + 1;
			assert(!lowered || held <= NEW)
		};
		/* nocache_uncharge(): own, then each count */
		atomic { own = own - 1; held = held - 1 };
		count[X] = count[X] - 1;
		count[R] = count[R] - 1
	:: else ->
		/* refuse: take the unit back from the levels below y */
		if
		:: y == R -> count[X] = count[X] - 1
		:: else
		fi
	fi;
	finished++
}

proctype setter()
{
	byte old, c;

#ifdef MUTANT_READ_COUNT_FIRST
	c = count[R];
	atomic { old = limit[R]; limit[R] = NEW };
#else
	atomic { old = limit[R]; limit[R] = NEW };
	c = count[R];
#endif
	if
	:: c <= NEW ->
		atomic {
			lowered = 1;
			assert(!lowered || held <= NEW)
		}
	:: else -> limit[R] = old
	fi;
	finished++
}

init
{
	byte i;

	atomic {
		limit[R] = OLD;
		limit[X] = 255;
		run setter();
		for (i : 1 .. CHARGERS) {
			run charger()
		}
	};
	finished == CHARGERS + 1;
	assert(count[R] == 0 && count[X] == 0 && own == 0 && held == 0 &&
	       limit[R] == (lowered -> NEW : OLD))
}
