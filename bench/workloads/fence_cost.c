/* SPDX-License-Identifier: MIT */
/*
 * fence_cost.c - what one reader fence costs, on the thread that waits for
 * it and on every other CPU running a thread of the process.
 *
 * Every switch to atomic mode waits for a reader fence (with rseq a
 * membarrier, an IPI to every other CPU that is running one of the
 * process's threads at the time; without, the fallback readers' grace
 * period, which sends one too).  A kill is such a switch, so switch-storm
 * can scale only as far as its threads can pay for the fences their kills
 * need; at one thread no other CPU runs the process and a membarrier sends
 * no IPI at all, which is why that bound is a property of the machine more
 * than of the library (docs/percpu_ref.md).  This workload measures it in
 * one run:
 *
 *   thread 0 (the fencer) alternates 10 ms phases: quiet (get+put pairs
 *   on a ref of its own, as the others) and fencing
 *   (percpu_ref_switch_to_atomic_sync() and back to per-CPU mode on that
 *   ref, back to back: one fence each);
 *   threads 1..N-1 (the victims) make get+put pairs on a ref of their own
 *   in per-CPU mode all along, counting them per phase.
 *
 * Metrics (the result; the table counts every thread's pairs over both
 * phases, a mixture, so it has no efficiency column), over the threads'
 * whole run, warm-up included, not only the table's window:
 *   fence_ns   the fencer's time per sync switch and switch back (the
 *              fence, plus a fold and the counters' zeroing);
 *   quiet_ns   a victim's ns per pair in the quiet phases;
 *   fenced_ns  the same in the fencing phases;
 *   loss       how much of a victim's pair rate the fences took (%);
 *   lost_ns    a victim's time lost per fence: loss x fence_ns.
 * At one thread there is no victim: fence_ns alone, the fence nobody else
 * pays for.  Pairs counted in a batch that straddles a phase change go to
 * the phase read at its end (64 pairs against 10 ms phases).
 *
 * Each victim's ref comes back to its one reference and is released by its
 * kill at the end; the fencer's, after its last switch back, likewise.
 */
#include <math.h>
#include <stdlib.h>
#include <time.h>

#include <percpuref/percpu_ref.h>

#include "bench.h"

#define PHASE_NS 10000000

enum fence_phase { PHASE_OFF, PHASE_QUIET, PHASE_FENCING };

struct fence_state {
	unsigned int phase;		/* atomic: enum fence_phase, set by the fencer */
	uint64_t quiet_ns, fencing_ns;	/* the fencer's: time in each phase */
	uint64_t fences;		/* the fencer's */
	uint64_t pairs[2];		/* atomic: victims' pairs, quiet and fencing */
};

struct fence_local {
	struct percpu_ref ref;		/* first: the release finds the struct */
	unsigned int releases;
	uint64_t pairs[2];		/* quiet, fencing */
};

static void note_release(struct percpu_ref *ref)
{
	((struct fence_local *)ref)->releases++;
}

static void fence_setup(struct bench_run *run)
{
	run->state = bench_zalloc(sizeof(struct fence_state));
}

static void fence_thread_init(struct bench_thread *t)
{
	struct fence_local *l = bench_zalloc(sizeof(*l));

	/* The fencer's switches back need ALLOW_REINIT. */
	if (percpu_ref_init(&l->ref, note_release, PERCPU_REF_ALLOW_REINIT))
		bench_die("fence-cost: percpu_ref_init failed");
	t->local = l;
}

/* One batch of get+put pairs on the thread's own ref, counted for the table. */
static void make_pairs(struct bench_thread *t, struct fence_local *l)
{
	int i;

	for (i = 0; i < BENCH_BATCH; i++) {
		percpu_ref_get(&l->ref);
		percpu_ref_put(&l->ref);
	}
	bench_count(t, BENCH_BATCH);
}

static void fencer(struct bench_thread *t, struct fence_state *s, struct fence_local *l)
{
	uint64_t start;

	while (bench_running(t)) {
		/* Relaxed: the victims only sort their counts by it. */
		__atomic_store_n(&s->phase, PHASE_QUIET, __ATOMIC_RELAXED);
		start = bench_clock_ns(CLOCK_MONOTONIC);
		do
			make_pairs(t, l);
		while (bench_clock_ns(CLOCK_MONOTONIC) - start < PHASE_NS && bench_running(t));
		s->quiet_ns += bench_clock_ns(CLOCK_MONOTONIC) - start;
		/* No fence once the victims stop: none would pay for it. */
		if (!bench_running(t))
			break;

		__atomic_store_n(&s->phase, PHASE_FENCING, __ATOMIC_RELAXED);
		start = bench_clock_ns(CLOCK_MONOTONIC);
		do {
			percpu_ref_switch_to_atomic_sync(&l->ref);
			percpu_ref_switch_to_percpu(&l->ref);
			s->fences++;
		} while (bench_clock_ns(CLOCK_MONOTONIC) - start < PHASE_NS && bench_running(t));
		s->fencing_ns += bench_clock_ns(CLOCK_MONOTONIC) - start;
	}
	__atomic_store_n(&s->phase, PHASE_OFF, __ATOMIC_RELAXED);
}

static void fence_loop(struct bench_thread *t)
{
	struct fence_state *s = t->run->state;
	struct fence_local *l = t->local;
	unsigned int phase;

	if (t->index == 0) {
		fencer(t, s, l);
		return;
	}
	while (bench_running(t)) {
		make_pairs(t, l);
		phase = __atomic_load_n(&s->phase, __ATOMIC_RELAXED);
		if (phase != PHASE_OFF)
			l->pairs[phase - PHASE_QUIET] += BENCH_BATCH;
	}
}

static void fence_thread_fini(struct bench_thread *t)
{
	struct fence_state *s = t->run->state;
	struct fence_local *l = t->local;

	/* Relaxed: the main thread reads them after joining this thread. */
	__atomic_fetch_add(&s->pairs[0], l->pairs[0], __ATOMIC_RELAXED);
	__atomic_fetch_add(&s->pairs[1], l->pairs[1], __ATOMIC_RELAXED);
	/* The pairs and switches left the count at one: only the kill may
	 * release, once.  The barrier waits for the kill's switch, whose
	 * release it orders before its return, on whichever thread it ran. */
	if (l->releases)
		bench_die("fence-cost: thread %u's ref released during the run", t->index);
	percpu_ref_kill(&l->ref);
	percpu_ref_barrier();
	if (l->releases != 1)
		bench_die("fence-cost: thread %u's ref released %u times by its kill, want 1",
			  t->index, l->releases);
	percpu_ref_exit(&l->ref);
	free(l);
}

static void fence_teardown(struct bench_run *run)
{
	struct fence_state *s = run->state;
	unsigned int victims = run->nthreads - 1;
	double fence = s->fences ? (double)s->fencing_ns / (double)s->fences : NAN;
	double quiet = NAN, fenced = NAN, loss = NAN;

	if (victims && s->pairs[0] && s->pairs[1]) {
		quiet = (double)s->quiet_ns * victims / (double)s->pairs[0];
		fenced = (double)s->fencing_ns * victims / (double)s->pairs[1];
		loss = 1.0 - quiet / fenced;
	}
	bench_report_metric(run, "fence_ns", fence, "ns");
	bench_report_metric(run, "quiet_ns", quiet, "ns");
	bench_report_metric(run, "fenced_ns", fenced, "ns");
	bench_report_metric(run, "loss", 100.0 * loss, "%");
	bench_report_metric(run, "lost_ns", loss * fence, "ns");
	free(s);
}

static const struct bench_variant fence_variants[] = {
	{ "sync-switch", "thread 0 fences in 10 ms bursts, the others make per-CPU pairs",
	  fence_loop, 0 },
	{ 0 },
};

static const struct bench_workload fence_cost = {
	.name = "fence-cost",
	.help = "what a reader fence costs its caller and the other CPUs",
	.op = "pair",
	.variants = fence_variants,
	.no_efficiency = true,
	/* Thread 0's fence waits for preempted readers (on the fallback it
	 * yields, then sleeps). */
	.waits = true,
	.roles = true,
	.setup = fence_setup,
	.thread_init = fence_thread_init,
	.thread_fini = fence_thread_fini,
	.teardown = fence_teardown,
};
PERCPUREF_BENCH_WORKLOAD(fence_cost);
