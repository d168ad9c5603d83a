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
 * A thread the allocator could give no unit (percpu_ref.c, the unit-less
 * word) adds to one more word of the same encoding, which the filter reads
 * before the first collect and after the second (snapshot_held()), and
 * adds to the per-CPU sum: a reference can be taken on a CPU's word and
 * dropped on the unit-less one, or the other way round, so only the sum of
 * all words says how many are held.  The atomic count does not change
 * while the ref is per-CPU (users add to the words), so the model keeps it
 * as a constant: 1, the manager's reference, with every holder on the
 * words (a count holding more, left by the last switch to per-CPU, only
 * shifts the sum the words' net is added to).
 *
 * Modelled: two CPUs; user U takes a reference before the check starts and
 * holds it until the check is done; user V does PAIRS get/put pairs, each
 * get and each put on any CPU (V migrates between them); the reclaimer runs
 * one filter while U holds, then, once both users are done, one more on
 * the now idle ref.  Each user add goes to either CPU's word or to the
 * unit-less word.  Each read of a word is one step, each user add one step
 * (an rseq commit, or the unit-less word's CAS); memory is sequentially
 * consistent.
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
 *  -DMUTANT_NO_UNITLESS: the references held summed from the CPUs' words
 *   only: a reference taken on a CPU's word and dropped on the unit-less
 *   one reads as still held, and the idle ref is kept out for ever (the
 *   first violation pan finds); U's reference held on the unit-less word
 *   is not seen, and the ref in use goes on to the switch.
 *  -DMUTANT_NO_UNITLESS_COMPARE: the unit-less word read around the
 *   collects but its two reads not compared: a get and a put of V on it
 *   that straddle the collects hide U's reference, as with one collect.
 */

#define NCPU	2
#define PAIRS	3
#define UNITLESS	NCPU	/* the unit-less word's index */

/* Get and put totals (a word's low bits and its high bits) of each CPU's
 * word, then of the unit-less word. */
byte gets[NCPU + 1];
byte puts[NCPU + 1];
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
 * consistently: the unit-less word read around two collects, all equal,
 * and the references held (the atomic count's 1, the manager's, plus the
 * net of every word) at most 1. */
inline filter(passed)
{
	ug1 = gets[UNITLESS]; up1 = puts[UNITLESS];
	collect(g1, p1);
#ifdef MUTANT_SINGLE_COLLECT
	g2 = g1; p2 = p1;
#else
	collect(g2, p2);
#endif
	ug2 = gets[UNITLESS]; up2 = puts[UNITLESS];
#ifdef MUTANT_NO_UNITLESS
	held = 1 + g2 - p2;
#else
	held = 1 + g2 - p2 + ug2 - up2;
#endif
#ifdef MUTANT_NO_UNITLESS_COMPARE
	passed = (g1 == g2 && p1 == p2 && held <= 1)
#else
	passed = (g1 == g2 && p1 == p2 && ug1 == ug2 && up1 == up2 && held <= 1)
#endif
}

/* The word a user adds to: a CPU's, or the unit-less one. */
inline pick_word(w)
{
	if
	:: w = 0
	:: w = 1
	:: w = UNITLESS
	fi
}

active proctype user_u()
{
	byte w;

	pick_word(w);
	gets[w]++;
	u_holding = 1;
	check_done;		/* hold across the whole filter */
	pick_word(w);
	puts[w]++;
	users_done++
}

active proctype user_v()
{
	byte w, n = 0;

	do
	:: n < PAIRS ->
		pick_word(w);
		gets[w]++;
		pick_word(w);
		puts[w]++;
		n++
	:: else -> break
	od;
	users_done++
}

active proctype reclaimer()
{
	short g1, p1, g2, p2, ug1, up1, ug2, up2, held;
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
