/* SPDX-License-Identifier: MIT */
/*
 * filter.pml - Model D: the reclaimer's filter, "check before switch".
 *
 * Before switching a managed ref to atomic mode for the exact check
 * (managed.pml), the reclaimer reads the ref's per-CPU counters twice
 * without switching (two collects) and skips the ref unless both collects
 * read the same values and those values say that the manager's is the only
 * reference.  The per-CPU words are monotonic: a get adds 1 and a put adds
 * 2^31 - 1 (minus one in the low 31 bits, plus one above them), so every
 * operation changes the word and two equal reads of a word mean nothing
 * happened to it in between; two equal collects then prove one consistent
 * snapshot (every word held its value over the interval between the end of
 * the first collect and the start of the second).  The model keeps a get
 * total and a put total per CPU, which is what the word encodes.
 *
 * Modelled: two CPUs; user U takes a reference before the check starts and
 * holds it until the check is done; user V does PAIRS get/put pairs, each
 * get and each put on any CPU (V migrates between them); the reclaimer runs
 * one filter while U holds, then, once both users are done, one more on
 * the now idle ref.  Each read of a CPU's word is one step, each user add
 * one step (an rseq commit); memory is sequentially consistent.
 *
 * Asserted:
 *  - no atomic window for a ref in use: while U holds its reference, the
 *    filter never lets the ref through to the switch;
 *  - no false "in use" for an idle ref: the filter after the users are
 *    done lets it through (the exact check then releases it).
 * The exact check that follows the filter is managed.pml's, unchanged, so
 * release stays exactly once whatever the filter says.
 *
 * Mutants (each must fail):
 *  -DMUTANT_SINGLE_COLLECT: one collect; a get and a put of V that straddle
 *   the collect on two CPUs hide U's reference from it.
 *  -DMUTANT_NET_COUNTERS: two collects over plain net counters (a put
 *   subtracts): V's pairs can restore every counter between the reads
 *   (ABA), so two equal collects can both be inconsistent.
 */

#define NCPU	2
#define PAIRS	3

byte gets[NCPU];		/* per-CPU get totals (the word's low bits) */
byte puts[NCPU];		/* per-CPU put totals (its high bits) */
bit u_holding;
bit check_done;
byte users_done;

/* One collect: *sg, *sp are the sums of what it read, word by word. */
inline collect(sg, sp)
{
	sg = 0; sp = 0;
	i = 0;
	do
	:: i < NCPU ->
		atomic {
#ifdef MUTANT_NET_COUNTERS
			/* Only the net value is read: gets - puts. */
			sg = sg + gets[i] - puts[i];
#else
			sg = sg + gets[i];
			sp = sp + puts[i];
#endif
			i++
		}
	:: else -> break
	od
}

/* The filter: true (passed) when the ref looks held by the manager only,
 * consistently; the manager's reference is in the atomic count, so "only
 * the manager" is a per-CPU net of zero. */
inline filter(passed)
{
	collect(g1, p1);
#ifdef MUTANT_SINGLE_COLLECT
	g2 = g1; p2 = p1;
#else
	collect(g2, p2);
#endif
	passed = (g1 == g2 && p1 == p2 && g2 - p2 == 0)
}

active proctype user_u()
{
	byte cpu;

	if
	:: cpu = 0
	:: cpu = 1
	fi;
	gets[cpu]++;
	u_holding = 1;
	check_done;		/* hold across the whole filter */
	if
	:: cpu = 0
	:: cpu = 1
	fi;
	puts[cpu]++;
	users_done++
}

active proctype user_v()
{
	byte cpu, n = 0;

	do
	:: n < PAIRS ->
		if
		:: cpu = 0
		:: cpu = 1
		fi;
		gets[cpu]++;
		if
		:: cpu = 0
		:: cpu = 1
		fi;
		puts[cpu]++;
		n++
	:: else -> break
	od;
	users_done++
}

active proctype reclaimer()
{
	short g1, p1, g2, p2;
	byte i;
	bit passed;

	u_holding;
	filter(passed);
	assert(!passed);	/* U holds a reference: no switch */
	check_done = 1;
	users_done == 2;
	filter(passed);
	assert(passed)		/* idle: on to the exact check */
}
