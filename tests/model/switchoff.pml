/* SPDX-License-Identifier: MIT */
/*
 * switchoff.pml - Model S: the fast path's switch-off.  Where neither
 * membarrier nor a move between CPUs can abort an rseq section any more,
 * a fence switches the per-CPU fast path off and gives the sections in
 * flight 10 ms; no fence, the switching one or any other, returns while
 * a section that began on the old fast path is still in flight.
 *
 * src/runtime.c: switch_fast_path_off(): increment switch_offs_stamping
 * (seq_cst), publish_fast_path(0, seq_cst) (percpuref_this_cpu_params
 * first, then percpuref_rseq_offset), [the test hook's sleep,
 * percpuref_test_switch_off_stamp_delay()], read the clock, raise
 * switch_off_wait_end_ns to now + SWITCH_OFF_WAIT_NS (a CAS loop, raised
 * only), decrement the count (release).  wait_for_sections_at_switch_off():
 * wait until the count reads 0 (acquire), read the end (relaxed); 0: return;
 * else sleep until it.  percpuref_fence_readers(): load the offset
 * (acquire); non-zero: membarrier, refused, then percpuref_fence_without_
 * membarrier(): the migration fence, refused too, then switch_fast_path_off()
 * and the wait; 0: the wait.  The readers (include/percpuref/this_cpu.h,
 * __percpuref_this_cpu_add()): x86-64 loads the params word, aarch64 the
 * offset (percpuref_this_rseq_area()); with units allowed the section runs
 * on the per-CPU fast path and its add lands at the commit; otherwise the
 * slow path (not a concern here: Model J's word).
 *
 * Time.  Clock reads are the only times that matter: clk counts the
 * stamps' reads (read e happens when clk goes from e - 1 to e), and an
 * end stamped from read e is "e" (0: never stamped).  The deadline of
 * read e (read e's time plus 10 ms) is an event, `passed` counting those
 * passed, in the order of the reads (a monotonic clock), never before its
 * read.  The timing argument the code rests on ("a few instructions
 * each", the design comment) is the one assumption: a section that read
 * the fast path as on ends within 10 ms, so deadline e cannot pass while
 * a section that began before read e is in flight.  A fence's sleep
 * (left = end - now; sleep left) is a wait for passed >= end.
 *
 * Memory: sequentially consistent.  The code's orders give what the
 * model uses: a fence that loads the offset as 0 (acquire) from a
 * switch-off's seq_cst store sees that switch-off's increment; reading
 * the count 0 it reads a value in the release sequence of that
 * switch-off's decrement (every later write of the count is an RMW), so
 * it reads that switch-off's end or a later, higher one.  C11 allows it
 * not to see another switch-off's increment, where SC makes it wait for
 * that one too; that is harmless, as every end stamped after its own
 * publish covers every old section (see MUTANT_LOWER below).
 *
 * Modelled: NREADER threads each making SECTIONS sections, each reading
 * the params word (x86-64) or the offset (aarch64), chosen per section;
 * NFENCE fences, each a percpuref_fence_readers() in a process where
 * membarrier and migration are refused: one that reads the offset
 * non-zero switches the fast path off (two or three may overlap) and
 * waits; one that reads 0 waits.  A deadline clock.
 *
 * Asserted: when a fence returns, no section that read the fast path as
 * on is still in flight (`no_old_section`): its add has landed.
 *
 * Left out: a fence whose membarrier or migration works (it aborts every
 * section: Models A and R); the mode word (the claim is stronger without
 * it: every old section, whatever it read; -DPREEMPT has it); a fork
 * child (one thread, in no section: its count's reset only frees its
 * fences from waiting for a stamp that never comes, a liveness matter
 * test_hardening's --no-fence-fork checks); the 10 ms cap on one sleep
 * (the clock is monotonic here); a clock read refused
 * (percpuref_monotonic_ns() gives 0: an end in the past for another
 * thread whose clock works).
 *
 * Mutants (each must fail on `no_old_section`):
 *  -DMUTANT_STAMP_FIRST: the end is read from the clock before the count
 *   and the publish (the order a second review of finding 13 found,
 *   test_hardening.c --no-fence-late-stamp): a section that reads the
 *   fast path between the clock read and the publish is not covered by
 *   that end's deadline.
 *  -DMUTANT_COUNT_AFTER_PUBLISH: the count is raised after the publish: a
 *   fence that reads the offset 0 in between reads the count 0, the end 0.
 *  -DMUTANT_NO_COUNT_WAIT: the fence reads the end without waiting for
 *   the count: an end not yet stamped reads 0.
 *  -DMUTANT_END_FIRST: the fence reads the end, then waits for the count.
 *  -DMUTANT_DEC_BEFORE_STAMP: the count is lowered before the end is
 *   raised.
 *  -DMUTANT_FENCE_NO_WAIT: a fence that reads the offset 0 waits for
 *   nothing (the first review of finding 13).
 * Mutants that pass (the step is not needed for this claim):
 *  -DMUTANT_LOWER: the end is stored, not raised (may be lowered): every
 *   end is read after its own switch-off's publish, so after the first
 *   publish, after which no section reads the fast path as on.
 *  -DMUTANT_PARAMS_LAST: publish_fast_path() stores the offset first: the
 *   count is raised before either store.
 * Witnesses (each must fail on its own assertion: the search reaches it):
 *  -DWITNESS_SLEEP: a fence sleeps for a deadline while an old section
 *   is in flight.
 *  -DWITNESS_COUNT: a fence that read the offset 0 waits for the count
 *   while the end reads 0 and an old section is in flight.
 *  -DWITNESS_OVERLAP: two switch-offs stamp at once.
 *
 * Up to 0.4.29 the code failed two more cases (review 162); each is a
 * mutant now, and must fail on `no_old_section`:
 *  -DMUTANT_SIGNAL: a signal cuts the fence's sleep short: the sleep was
 *   one nanosleep() whose EINTR was ignored (test_hardening.c
 *   --no-fence-signal: the switching fence returned after 1 ms).
 *   percpuref_sleep_us() now sleeps the rest after an EINTR.
 *  -DPREEMPT -DMUTANT_NO_RELOAD: see -DPREEMPT below; the section's unit
 *   bound was the one loaded before label 1 (test_hardening.c
 *   --no-fence-before-label-1: an add landed on a per-CPU copy 30 to 79
 *   ms after the switch-off).
 * -DPREEMPT (passes): the mode word, and a section split where the code
 *   splits it: the params word (or the offset) is loaded before label 1,
 *   where a preemption or a signal aborts nothing and lasts without
 *   bound; from label 1 (cpu_id, the unit bound or the offset read again,
 *   the mode word) to the commit the section is the few instructions the
 *   10 ms are for (a restart there re-reads everything: not modelled, it
 *   only ends a section sooner).  The first NFENCE - 1 fences are other
 *   refs' switches, the last this ref's (it stores ATOMIC first), and
 *   only its verdict counts: no section that read the word per-CPU is in
 *   flight.  Without the second read a section holding the old params
 *   enters label 1 after the switch-off's deadline, reads the word
 *   per-CPU, and this ref's fence, finding the end past, waits for
 *   nothing.
  */

#define NREADER	2	/* OLD_BEFORE() and the ghosts' macros name two */
#ifndef SECTIONS
#define SECTIONS 2
#endif
#ifndef NFENCE
#define NFENCE	3
#endif

bit params = 1;			/* percpuref_this_cpu_params allows units */
bit offset = 1;			/* percpuref_rseq_offset != 0 */
byte stamping;			/* switch_offs_stamping */
byte endv;			/* switch_off_wait_end_ns: a read's number, 0 none */
byte clk;			/* clock reads made by the stamps */
byte passed;			/* deadlines passed: read e's iff passed >= e */
bit inflight[NREADER];		/* ghost: a section on the old fast path (PREEMPT: past label 1) */
byte began[NREADER];		/* ghost: clk when that section read it */
bit no_old_section;		/* ghost: a fence's verdict */
#ifdef PREEMPT
bit mode;			/* the ref's mode word: 1 ATOMIC */
bit permode[NREADER];		/* ghost: in a section that read the word per-CPU */
#define MUST_COVER	(permode[0] || permode[1])
#else
#define MUST_COVER	ANY_OLD
#endif
bit witness;			/* ghost: for the witnesses */

#define OLD_BEFORE(e)	((inflight[0] && began[0] < (e)) || (inflight[1] && began[1] < (e)))
#define ANY_OLD		(inflight[0] || inflight[1])

proctype reader(byte me)
{
	byte i;
#ifdef PREEMPT
	bit old;
#endif

	for (i : 1 .. SECTIONS) {
#ifndef PREEMPT
		/* The params word (x86-64) or the offset (aarch64). */
		atomic {
			if
			:: params -> inflight[me] = 1; began[me] = clk
			:: offset -> inflight[me] = 1; began[me] = clk
			:: !params || !offset -> skip	/* the slow path */
			fi
		}
		/* The commit: the add lands (or the section ends without
		 * one: a flagged word, a restart, the same for the claim). */
		atomic { inflight[me] = 0; began[me] = 0 }
#else
		/* The params word (x86-64: this_cpu.h's load of the
		 * area's offset, before label 1) or the offset (aarch64:
		 * percpuref_this_rseq_area(), before the asm). */
		atomic {
			if
			:: params -> old = 1
			:: offset -> old = 1
			:: !params || !offset -> skip
			fi
		}
		/* Before label 1: a preemption or a signal here aborts
		 * nothing (the kernel restarts only an IP inside [1, 2)),
		 * and lasts as long as it lasts: no bound. */
		if
		:: old ->
#ifndef MUTANT_NO_RELOAD
			/* Label 1: the unit bound (x86-64) or the offset
			 * (aarch64) read again; from here on a preemption
			 * restarts the section (the few instructions the
			 * 10 ms are for). */
			atomic {
				if
				:: params -> inflight[me] = 1; began[me] = clk
				:: offset -> inflight[me] = 1; began[me] = clk
				:: else -> old = 0
				fi
			};
			if
			:: old ->
				atomic {
					if
					:: !mode -> permode[me] = 1
					:: else -> skip
					fi
				}
			:: else -> skip
			fi;
#else
			/* Up to 0.4.29, label 1: cpu_id, the mode word,
			 * against the bound read before it. */
			atomic {
				if
				:: !mode -> inflight[me] = 1; permode[me] = 1; began[me] = clk
				:: else -> skip
				fi
			};
#endif
			/* The commit. */
			atomic { inflight[me] = 0; permode[me] = 0; began[me] = 0; old = 0 }
		:: else -> skip
		fi
#endif
	}
}

/* Deadlines pass in order, each after its read, never while a section
 * that began before that read is in flight (the 10 ms assumption). */
active proctype deadlines()
{
end:
	do
	:: atomic { passed < clk && !OLD_BEFORE(passed + 1) -> passed++ }
	od
}

inline read_clock(mine)
{
	atomic { clk++; mine = clk }
}

inline publish_off()
{
#ifdef MUTANT_PARAMS_LAST
	offset = 0;
	params = 0
#else
	params = 0;			/* seq_cst, params first */
	offset = 0			/* seq_cst */
#endif
}

/* switch_fast_path_off() */
inline switch_off(mine, seen)
{
#ifdef MUTANT_STAMP_FIRST
	read_clock(mine);
#endif
#ifndef MUTANT_COUNT_AFTER_PUBLISH
	stamping++;			/* seq_cst */
#endif
	publish_off();
#ifdef MUTANT_COUNT_AFTER_PUBLISH
	stamping++;
#endif
	/* [the test hook's sleep: any delay, as every step here] */
#ifndef MUTANT_STAMP_FIRST
	read_clock(mine);		/* end = now + SWITCH_OFF_WAIT_NS */
#endif
#ifdef MUTANT_DEC_BEFORE_STAMP
	stamping--;
#endif
	seen = endv;			/* relaxed */
#ifdef MUTANT_LOWER
	endv = mine;
#else
	do				/* raised only: a weak CAS loop */
	:: atomic {
		mine > seen ->
		if
		:: endv == seen -> endv = mine; break
		:: endv == seen -> skip	/* a weak CAS's spurious failure */
		:: else -> seen = endv
		fi
	   }
	:: mine <= seen -> break
	od;
#endif
#ifndef MUTANT_DEC_BEFORE_STAMP
	stamping--;			/* release */
#endif
	mine = 0;
	seen = 0
}

/* wait_for_sections_at_switch_off() */
inline wait_for_sections(e)
{
#ifdef WITNESS_COUNT
	atomic { if :: stamping > 0 && endv == 0 && ANY_OLD -> witness = 1 :: else -> skip fi };
	assert(!witness);
#endif
#ifdef MUTANT_END_FIRST
	e = endv;
#endif
#ifndef MUTANT_NO_COUNT_WAIT
	stamping == 0;			/* acquire, yield or nap */
#endif
#ifndef MUTANT_END_FIRST
	e = endv;			/* relaxed */
#endif
	if
	:: e == 0 -> skip		/* never switched off */
	:: else ->
#ifdef WITNESS_SLEEP
		atomic { if :: passed < e && ANY_OLD -> witness = 1 :: else -> skip fi };
		assert(!witness);
#endif
		/* left = end - now; sleep left when > 0 */
		if
		:: passed >= e
#ifdef MUTANT_SIGNAL
		:: skip			/* nanosleep() returned EINTR */
#endif
		fi
	fi;
	e = 0
}

/* percpuref_fence_readers() with membarrier and migration refused. */
proctype fence(bit ours)
{
	byte mine, seen, e;

#ifdef PREEMPT
	/* This ref's switch (the mode-word exchange), or another ref's,
	 * whose fence switches the fast path off all the same. */
	if
	:: ours -> mode = 1
	:: else -> skip
	fi;
#endif
	if
	:: offset ->			/* acquire */
		/* membarrier refused, migration refused:
		 * percpuref_fence_without_membarrier() */
		switch_off(mine, seen);
		wait_for_sections(e)
	:: else ->
#ifndef MUTANT_FENCE_NO_WAIT
		wait_for_sections(e)
#else
		skip
#endif
	fi;
	atomic {
#ifdef PREEMPT
		no_old_section = !ours || !MUST_COVER;
#else
		no_old_section = !MUST_COVER;
#endif
		assert(no_old_section)
	}
}

#ifdef WITNESS_OVERLAP
active proctype overlap()
{
end:	atomic { stamping >= 2 -> witness = 1 };
	assert(!witness)
}
#endif

init
{
	byte i;

	atomic {
		for (i : 0 .. NREADER - 1) {
			run reader(i)
		}
		/* The last one this ref's switch (PREEMPT: the others
		 * another ref's). */
		for (i : 1 .. NFENCE) {
			run fence(i == NFENCE)
		}
	}
}
