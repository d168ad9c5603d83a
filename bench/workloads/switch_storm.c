/* SPDX-License-Identifier: MIT */
/*
 * switch_storm.c - many independent refs changing mode at once: does a mode
 * change on one ref wait for mode changes on others?  (The proposal's
 * limitation 4: one global switch lock serialises every mode change.)
 *
 * Each thread cycles its own refs, never touched by another thread, through
 * a whole life, in batches of --batch refs so that asynchronous kills of one
 * batch share the callback thread's fences:
 *   kill      init -> --burst get/put pairs -> kill -> (release, on the
 *             library's callback thread) -> exit: a per-connection object;
 *   managed   init ALLOW_REINIT -> switch_to_managed -> burst ->
 *             switch_to_unmanaged -> kill -> release -> exit: the same
 *             life with a stay under management, three more mode changes.
 * One operation is one ref's whole life (a "cycle").  The release callback
 * counts releases per thread; a thread exits its batch only once every ref
 * of it was released, and teardown checks that every ref was released
 * exactly once (a lost or doubled release fails the run).
 *
 * Metrics: the CPU time a cycle costs on its own thread, not counting the
 * waits for releases (worker_cpu), and on the library's callback thread,
 * which finishes every kill (callback_cpu), both over the threads' whole
 * lives; and offload_bound = worker / (worker + callback), the efficiency
 * this design allows where no CPU is spare for the callback thread
 * (docs/percpu_ref.md).
 */
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include <percpuref/percpu_ref.h>

#include "bench.h"

enum storm_kind { STORM_KILL, STORM_MANAGED };

static long opt_batch = 32, opt_burst = 16;

struct storm_ref {
	struct percpu_ref ref;
	unsigned long *released;	/* the owning thread's counter */
};

struct storm_local {
	struct storm_ref *refs;
	unsigned long released;		/* atomic: release callbacks */
	unsigned long lives;		/* refs this thread initialised */
	uint64_t cpu_ns_at_start;	/* this thread's CPU clock */
	uint64_t cpu_ns_waiting;	/* of it, waiting for releases */
};

struct storm_state {
	uint64_t callback_cpu_ns_before;
	uint64_t worker_cpu_ns;		/* atomic: summed by thread_fini */
	uint64_t lives;			/* atomic: likewise */
};

static void storm_setup(struct bench_run *run)
{
	struct storm_state *s = bench_zalloc(sizeof(*s));

	s->callback_cpu_ns_before = bench_threads_cpu_ns("percpuref-cb");
	run->state = s;
}

static void storm_release(struct percpu_ref *ref)
{
	struct storm_ref *r = (struct storm_ref *)ref;

	/* Release: the owner exits the ref after seeing the count. */
	__atomic_fetch_add(r->released, 1, __ATOMIC_RELEASE);
}

static void storm_thread_init(struct bench_thread *t)
{
	struct storm_local *l = bench_zalloc(sizeof(*l));

	l->refs = bench_zalloc((size_t)opt_batch * sizeof(*l->refs));
	t->local = l;
	l->cpu_ns_at_start = bench_clock_ns(CLOCK_THREAD_CPUTIME_ID);
}

static void storm_loop(struct bench_thread *t)
{
	struct storm_local *l = t->local;
	enum storm_kind kind = (enum storm_kind)t->run->variant->arg;
	unsigned int flags = kind == STORM_MANAGED ? PERCPU_REF_ALLOW_REINIT : 0;
	long i, j;

	while (bench_running(t)) {
		unsigned long target = l->released;
		long n = 0;

		/* Up to --batch refs; stop between two once measuring ended: a
		 * batch of long bursts would outlast a short point (4096 bursts
		 * of 10^6 pairs take seconds). */
		do {
			struct storm_ref *r = &l->refs[n++];

			r->released = &l->released;
			if (percpu_ref_init(&r->ref, storm_release, flags))
				bench_die("switch-storm: percpu_ref_init failed");
			if (kind == STORM_MANAGED && percpu_ref_switch_to_managed(&r->ref))
				bench_die("switch-storm: switch_to_managed failed");
			for (j = 0; j < opt_burst; j++) {
				percpu_ref_get(&r->ref);
				percpu_ref_put(&r->ref);
			}
			if (kind == STORM_MANAGED && percpu_ref_switch_to_unmanaged(&r->ref))
				bench_die("switch-storm: switch_to_unmanaged failed");
			percpu_ref_kill(&r->ref);
		} while (n < opt_batch && bench_running(t));
		target += (unsigned long)n;
		l->lives += (unsigned long)n;
		/* Acquire: pairs with storm_release().  Yield: the callback
		 * thread that finishes the kills may need this CPU.  The time
		 * spent so is waiting, not the cycle's work (worker_cpu). */
		if (__atomic_load_n(&l->released, __ATOMIC_ACQUIRE) < target) {
			uint64_t wait_start = bench_clock_ns(CLOCK_THREAD_CPUTIME_ID);

			while (__atomic_load_n(&l->released, __ATOMIC_ACQUIRE) < target)
				sched_yield();
			l->cpu_ns_waiting += bench_clock_ns(CLOCK_THREAD_CPUTIME_ID) - wait_start;
		}
		for (i = 0; i < n; i++)
			percpu_ref_exit(&l->refs[i].ref);
		bench_count(t, (uint64_t)n);
	}
}

static void storm_thread_fini(struct bench_thread *t)
{
	struct storm_local *l = t->local;
	struct storm_state *s = t->run->state;
	uint64_t worked = bench_clock_ns(CLOCK_THREAD_CPUTIME_ID) - l->cpu_ns_at_start -
			  l->cpu_ns_waiting;

	/* Relaxed: the main thread reads them after joining this thread. */
	__atomic_fetch_add(&s->worker_cpu_ns, worked, __ATOMIC_RELAXED);
	__atomic_fetch_add(&s->lives, (uint64_t)l->lives, __ATOMIC_RELAXED);
	if (__atomic_load_n(&l->released, __ATOMIC_ACQUIRE) != l->lives)
		bench_die("switch-storm: %lu releases for %lu refs", l->released, l->lives);
	free(l->refs);
	free(l);
}

static void storm_teardown(struct bench_run *run)
{
	struct storm_state *s = run->state;
	uint64_t callback_now = bench_threads_cpu_ns("percpuref-cb");
	double worker, callback;

	/* Every kill of the run was released before its thread ended. */
	worker = s->lives ? (double)s->worker_cpu_ns / (double)s->lives : NAN;
	/* No callback thread found (or its clock refused): not measured. */
	callback = s->lives && callback_now && callback_now >= s->callback_cpu_ns_before
			   ? (double)(callback_now - s->callback_cpu_ns_before) / (double)s->lives
			   : NAN;
	bench_report_metric(run, "worker_cpu", worker, "ns");
	bench_report_metric(run, "callback_cpu", callback, "ns");
	bench_report_metric(run, "offload_bound", 100.0 * worker / (worker + callback), "%");
	free(s);
}

static const char *storm_validate(void)
{
	if (opt_batch < 1 || opt_batch > 4096)
		return "--batch: want 1..4096";
	if (opt_burst < 0 || opt_burst > 1000000)
		return "--burst: want 0..1000000";
	return NULL;
}

static const struct bench_variant storm_variants[] = {
	{ "kill", "init, get/put burst, kill, release, exit", storm_loop, STORM_KILL },
	{ "managed", "the same with switch_to_managed and _unmanaged before the kill", storm_loop,
	  STORM_MANAGED },
	{ NULL },
};

static const struct bench_option storm_options[] = {
	{ .name = "batch", .type = BENCH_OPT_LONG, .value = &opt_batch,
	  .help = "refs a thread kills before it waits for their releases" },
	{ .name = "burst", .type = BENCH_OPT_LONG, .value = &opt_burst,
	  .help = "get/put pairs on each ref between init and kill" },
	{ NULL },
};

static const struct bench_workload switch_storm = {
	.name = "switch-storm",
	.help = "each thread cycles its own refs through init, kill, release, exit",
	.op = "cycle",
	.variants = storm_variants,
	.options = storm_options,
	.setup = storm_setup,
	.thread_init = storm_thread_init,
	.thread_fini = storm_thread_fini,
	.teardown = storm_teardown,
	.validate = storm_validate,
};
PERCPUREF_BENCH_WORKLOAD(switch_storm);
