/* SPDX-License-Identifier: MIT */
/*
 * switch_storm.c - many independent refs changing mode at once: does a mode
 * change on one ref wait for mode changes on others?  (The proposal's
 * limitation 4: one global switch lock serialises every mode change.)
 *
 * Each thread cycles its own refs, never touched by another thread, through
 * a whole life, in batches of --batch refs so that asynchronous kills of one
 * batch share the callback thread's fences, with up to --in-flight batches
 * killed and not yet released (1, the default: a thread waits for each
 * batch's releases before it starts the next; more: it goes on with new
 * refs meanwhile, as a server whose connections are freed by their release
 * does, and waits only for the oldest batch when all are in flight):
 *   kill      init -> --burst get/put pairs -> kill -> (release, on the
 *             library's callback thread) -> exit: a per-connection object;
 *   managed   init ALLOW_REINIT -> switch_to_managed -> burst ->
 *             switch_to_unmanaged -> kill -> release -> exit: the same
 *             life with a stay under management, three more mode changes;
 *   kill-poll, managed-poll   the same on polling threads
 *             (percpu_ref_poll_register()): each thread finishes its own
 *             kills in a percpu_ref_poll() after every batch, whose fences
 *             are paced and shared, and waits for its oldest batch with
 *             PERCPU_REF_POLL_WAIT; the callback thread is idle.
 * One operation is one ref's whole life (a "cycle"), counted when its batch
 * is retired.  The release callback counts releases per batch; a thread
 * exits a batch only once every ref of it was released, and fails the run
 * if a batch counts more releases than refs (a doubled release), or fewer
 * after a percpu_ref_barrier() (a lost one; otherwise a lost one leaves
 * the thread waiting, and the run fails at --hang-limit).
 *
 * The library's threads may never start (a sandbox that refuses new
 * threads once the program runs; the library warns), and kills then wait
 * in the callback thread's queue until a barrier runs them on its caller.
 * So a wait that sees no release for STORM_LOOK_YIELDS yields looks for a
 * thread named percpuref-cb, and when two looks STORM_LOOK_NS apart find
 * none (one just created is named by its creator right after), the
 * threads of kill and managed wait for their releases with
 * percpu_ref_barrier() from then on, which runs every queued kill on its
 * caller, as work (worker_cpu), with a warning; metric barrier_waits
 * counts those waits.  The managed variants then also flush after each
 * batch: no reclaimer frees the exited refs' nodes; as they do when,
 * after their first batch, two such looks find no percpuref-recl (once
 * a process, with a warning: the polling variants never look for the
 * callback thread).  Where /proc cannot be read, nothing is looked
 * for.  The first point's window holds the first wait's looks (about
 * 10 ms).  Up to 0.4.0 such a run waited out --hang-limit and failed.
 * (A probe before the first point would start
 * the callback thread from the main thread; the library's
 * threads take the CPU affinity of the thread that starts them, so the
 * callback thread would no longer share worker 0's CPU as it does when
 * that worker's kill starts it, and the figures would change: 1.1 ->
 * 2.2 us a kill cycle at one thread on the 2-vCPU guest.)
 *
 * Metrics: the CPU time a cycle costs on its own thread, not counting the
 * waits for releases (worker_cpu), and on the library's callback thread,
 * which finishes every kill (callback_cpu), both over the threads' whole
 * lives; and offload_bound = worker / (worker + callback), the efficiency
 * this design allows where no CPU is spare for the callback thread
 * (docs/percpu_ref.md).  For the -poll variants callback_cpu is 0 (or not
 * measured, the thread never started) and offload_bound 100%: nothing is
 * offloaded; their worker_cpu counts a waiting poll as work, its wait for
 * another thread's fence included.
 */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <percpuref/managed.h>
#include <percpuref/percpu_ref.h>

#include "bench.h"

enum storm_kind { STORM_KILL, STORM_MANAGED, STORM_KIND = 1, STORM_POLL = 2 };

static long opt_batch = 32, opt_burst = 16, opt_in_flight = 1;

/* When a wait looks for the callback thread (top of the file). */
#define STORM_LOOK_YIELDS 4096u
#define STORM_LOOK_NS 10000000ull

/* Set once two looks found no callback thread: every later wait of the
 * process uses the barrier.  Relaxed: a flag alone, which a thread that
 * misses it finds again by looking. */
static bool storm_threads_refused;
/* Set once two looks found no reclaimer (storm_look_for_reclaimer()):
 * every later managed batch is flushed.  Relaxed, as above; looked for
 * once a process (storm_reclaimer_looked). */
static bool storm_reclaimer_absent, storm_reclaimer_looked;

struct storm_ref {
	struct percpu_ref ref;
	unsigned long *released;	/* its batch's counter */
};

struct storm_batch {
	struct storm_ref *refs;		/* --batch of them */
	unsigned long released;		/* atomic: release callbacks */
	unsigned long lives;		/* refs initialised, 0: slot free */
};

struct storm_local {
	struct storm_state *state;
	struct storm_batch *batches;	/* --in-flight of them, a ring */
	long next;			/* the slot the next batch takes */
	unsigned long lives;		/* refs this thread initialised */
	uint64_t cpu_ns_at_start;	/* this thread's CPU clock */
	uint64_t cpu_ns_waiting;	/* of it, waiting for releases */
	bool polling;			/* a -poll variant's thread */
	bool managed;			/* a managed variant's thread */
};

struct storm_state {
	uint64_t callback_cpu_ns_before;
	uint64_t worker_cpu_ns;		/* atomic: summed by thread_fini */
	uint64_t lives;			/* atomic: likewise */
	uint64_t barrier_waits;		/* atomic: waits that used a barrier */
};

static void storm_release(struct percpu_ref *ref)
{
	struct storm_ref *r = (struct storm_ref *)ref;

	/* Release: the owner exits the ref after seeing the count. */
	__atomic_fetch_add(r->released, 1, __ATOMIC_RELEASE);
}

static int storm_poll(unsigned int flags)
{
	int ret = percpu_ref_poll(flags);

	if (ret < 0)
		bench_die("switch-storm: percpu_ref_poll: %s", strerror(-ret));
	return ret;
}

/* Every release of @b, which percpu_ref_barrier() finished here. */
static void storm_barrier(struct storm_batch *b)
{
	unsigned long released;
	int ret = percpu_ref_barrier();

	if (ret)
		bench_die("switch-storm: percpu_ref_barrier: %s", strerror(-ret));
	/* Acquire: pairs with storm_release(). */
	released = __atomic_load_n(&b->released, __ATOMIC_ACQUIRE);
	if (released < b->lives)
		bench_die("switch-storm: %lu releases for %lu refs after a barrier", released,
			  b->lives);
}

/* No thread named @name runs: two looks STORM_LOOK_NS apart (top of the
 * file) find none.  False where /proc cannot be read. */
static bool storm_thread_absent(const char *name)
{
	struct timespec pause = { 0, (long)STORM_LOOK_NS };

	if (bench_threads_named(name, NULL) != 0)
		return false;
	nanosleep(&pause, NULL);
	return bench_threads_named(name, NULL) == 0;
}

/* No callback thread runs?  Says so once. */
static bool storm_no_callback_thread(void)
{
	if (!storm_thread_absent("percpuref-cb"))
		return false;
	if (!__atomic_exchange_n(&storm_threads_refused, true, __ATOMIC_RELAXED))
		fprintf(stderr, "percpuref-bench: warning: switch-storm: the library's callback "
			"thread does not run (could it start?); kill and managed wait for their "
			"releases with percpu_ref_barrier(), which runs the kills on its caller\n");
	return true;
}

/*
 * Once a process, after a managed batch (its first switch_to_managed
 * started the reclaimer, or was refused the thread): no reclaimer runs?
 * Says so.  The polling variants never look for the callback thread,
 * which they do not need, and managed-poll, flushing only when that look
 * failed, left every exited ref's node listed for the run: memory grew
 * by the impl of every cycle (about 100 MB a second).
 */
static void storm_look_for_reclaimer(void)
{
	/* Relaxed: the flag alone decides who looks. */
	if (__atomic_load_n(&storm_reclaimer_looked, __ATOMIC_RELAXED) ||
	    __atomic_exchange_n(&storm_reclaimer_looked, true, __ATOMIC_RELAXED))
		return;
	if (!storm_thread_absent("percpuref-recl"))
		return;
	__atomic_store_n(&storm_reclaimer_absent, true, __ATOMIC_RELAXED);
	fprintf(stderr, "percpuref-bench: warning: switch-storm: the library's reclaimer "
		"thread does not run (could it start?); the managed variants flush after "
		"each batch\n");
}

/*
 * Yields until every ref of @b was released (the callback thread that
 * finishes the kills may need this CPU); false if it turned out that no
 * callback thread runs, and the barrier must finish them.  Acquire: pairs
 * with storm_release().
 */
static bool storm_yield_released(struct storm_batch *b)
{
	unsigned long seen = __atomic_load_n(&b->released, __ATOMIC_ACQUIRE), now;
	unsigned int yields = 0;

	while ((now = __atomic_load_n(&b->released, __ATOMIC_ACQUIRE)) < b->lives) {
		sched_yield();
		if (now != seen) {
			seen = now;
			yields = 0;
		} else if (++yields == STORM_LOOK_YIELDS) {
			yields = 0;
			if (storm_no_callback_thread())
				return false;
		}
	}
	return true;
}

static void storm_setup(struct bench_run *run)
{
	struct storm_state *s = bench_zalloc(sizeof(*s));

	(void)bench_threads_named("percpuref-cb", &s->callback_cpu_ns_before);
	run->state = s;
}

/*
 * Waits for the releases of @b's refs, exits them and frees the slot: the
 * batch's cycles are complete.  Their count, or 0 for a free slot.
 */
static unsigned long storm_retire(struct storm_local *l, struct storm_batch *b)
{
	unsigned long i, released;

	if (!b->lives)
		return 0;
	/* Acquire: pairs with storm_release().  Yield: the callback thread
	 * that finishes the kills may need this CPU.  The time spent so is
	 * waiting, not the cycle's work (worker_cpu); a barrier that runs
	 * the kills here is work. */
	if (__atomic_load_n(&b->released, __ATOMIC_ACQUIRE) < b->lives) {
		bool finished = false;

		if (l->polling || !__atomic_load_n(&storm_threads_refused, __ATOMIC_RELAXED)) {
			uint64_t wait_start = bench_clock_ns(CLOCK_THREAD_CPUTIME_ID);

			/* A polling thread finishes them itself (work, not
			 * waiting), and needs no callback thread. */
			while (l->polling &&
			       __atomic_load_n(&b->released, __ATOMIC_ACQUIRE) < b->lives &&
			       storm_poll(PERCPU_REF_POLL_WAIT) > 0)
				wait_start = bench_clock_ns(CLOCK_THREAD_CPUTIME_ID);
			if (l->polling) {
				while (__atomic_load_n(&b->released, __ATOMIC_ACQUIRE) < b->lives)
					sched_yield();
				finished = true;
			} else {
				finished = storm_yield_released(b);
			}
			l->cpu_ns_waiting += bench_clock_ns(CLOCK_THREAD_CPUTIME_ID) - wait_start;
		}
		if (!finished) {
			storm_barrier(b);
			__atomic_fetch_add(&l->state->barrier_waits, 1, __ATOMIC_RELAXED);
		}
	}
	for (i = 0; i < b->lives; i++)
		percpu_ref_exit(&b->refs[i].ref);
	/* No reclaimer frees the nodes of refs exited while listed: a pass
	 * here does (it runs on its caller when no thread can start). */
	if (l->managed && (__atomic_load_n(&storm_threads_refused, __ATOMIC_RELAXED) ||
			   __atomic_load_n(&storm_reclaimer_absent, __ATOMIC_RELAXED)) &&
	    percpu_ref_managed_flush())
		bench_die("switch-storm: percpu_ref_managed_flush failed");
	/* Relaxed: every release of the batch was seen above; one more now
	 * would be a doubled release, which the check below catches. */
	released = __atomic_exchange_n(&b->released, 0, __ATOMIC_RELAXED);
	if (released != b->lives)
		bench_die("switch-storm: %lu releases for %lu refs", released, b->lives);
	b->lives = 0;
	return released;
}

/*
 * Fills @b with up to --batch new refs, each through init, its burst and
 * kill; stops between two once measuring ended: a batch of long bursts
 * would outlast a short point (4096 bursts of 10^6 pairs take seconds).
 */
static void storm_fill(struct bench_thread *t, struct storm_batch *b)
{
	struct storm_local *l = t->local;
	enum storm_kind kind = (enum storm_kind)(t->run->variant->arg & STORM_KIND);
	unsigned int flags = kind == STORM_MANAGED ? PERCPU_REF_ALLOW_REINIT : 0;
	long j;

	do {
		struct storm_ref *r = &b->refs[b->lives++];

		r->released = &b->released;
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
	} while (b->lives < (unsigned long)opt_batch && bench_running(t));
	l->lives += b->lives;
	if (kind == STORM_MANAGED)
		storm_look_for_reclaimer();
	if (l->polling)
		storm_poll(0);
}

/*
 * Before the start barrier, so before the warm-up: all batches but one go
 * in flight here, and the loop's first pass fills the last, so that every
 * pass of the loop inside the window retires one batch.  Counted at
 * retirement, cycles would otherwise be missing from a window that opened
 * while the ring was still filling (4096 x 64 refs take longer than a
 * short warm-up).
 */
static void storm_thread_init(struct bench_thread *t)
{
	struct storm_local *l = bench_zalloc(sizeof(*l));
	long i;

	l->state = t->run->state;
	l->polling = t->run->variant->arg & STORM_POLL;
	l->managed = (t->run->variant->arg & STORM_KIND) == STORM_MANAGED;
	if (l->polling && (i = percpu_ref_poll_register()))
		bench_die("switch-storm: percpu_ref_poll_register: %s", strerror((int)-i));
	l->batches = bench_zalloc((size_t)opt_in_flight * sizeof(*l->batches));
	for (i = 0; i < opt_in_flight; i++)
		l->batches[i].refs = bench_zalloc((size_t)opt_batch * sizeof(*l->batches[i].refs));
	t->local = l;
	l->cpu_ns_at_start = bench_clock_ns(CLOCK_THREAD_CPUTIME_ID);
	for (i = 0; i < opt_in_flight - 1; i++)
		storm_fill(t, &l->batches[i]);
	l->next = opt_in_flight - 1;
}

static void storm_loop(struct bench_thread *t)
{
	struct storm_local *l = t->local;
	long i;

	while (bench_running(t)) {
		struct storm_batch *b = &l->batches[l->next];

		l->next = (l->next + 1) % opt_in_flight;
		/* The oldest batch in flight (none on the first pass). */
		bench_count(t, storm_retire(l, b));
		storm_fill(t, b);
	}
	/* The batches still in flight; the measurement has ended. */
	for (i = 0; i < opt_in_flight; i++)
		(void)storm_retire(l, &l->batches[i]);
}

static void storm_thread_fini(struct bench_thread *t)
{
	struct storm_local *l = t->local;
	struct storm_state *s = t->run->state;
	uint64_t worked = bench_clock_ns(CLOCK_THREAD_CPUTIME_ID) - l->cpu_ns_at_start -
			  l->cpu_ns_waiting;
	long i;

	/* Relaxed: the main thread reads them after joining this thread. */
	__atomic_fetch_add(&s->worker_cpu_ns, worked, __ATOMIC_RELAXED);
	__atomic_fetch_add(&s->lives, (uint64_t)l->lives, __ATOMIC_RELAXED);
	for (i = 0; i < opt_in_flight; i++)
		free(l->batches[i].refs);
	free(l->batches);
	if (l->polling)
		(void)percpu_ref_poll_unregister();
	free(l);
}

static void storm_teardown(struct bench_run *run)
{
	struct storm_state *s = run->state;
	uint64_t callback_now = 0;
	double worker, callback;

	(void)bench_threads_named("percpuref-cb", &callback_now);
	/* Every kill of the run was released before its thread ended. */
	worker = s->lives ? (double)s->worker_cpu_ns / (double)s->lives : NAN;
	/* No callback thread found (or its clock refused): not measured. */
	callback = s->lives && callback_now && callback_now >= s->callback_cpu_ns_before
			   ? (double)(callback_now - s->callback_cpu_ns_before) / (double)s->lives
			   : NAN;
	bench_report_metric(run, "worker_cpu", worker, "ns");
	bench_report_metric(run, "callback_cpu", callback, "ns");
	bench_report_metric(run, "offload_bound", 100.0 * worker / (worker + callback), "%");
	bench_report_metric(run, "barrier_waits", (double)s->barrier_waits, NULL);
	free(s);
}

static const char *storm_validate(void)
{
	if (opt_batch < 1 || opt_batch > 4096)
		return "--batch: want 1..4096";
	if (opt_burst < 0 || opt_burst > 1000000)
		return "--burst: want 0..1000000";
	if (opt_in_flight < 1 || opt_in_flight > 64)
		return "--in-flight: want 1..64";
	/*
	 * thread_init fills all batches but one before the start barrier,
	 * where nothing stops it: 63 x 4096 x 10^6 pairs ran out --hang-limit
	 * and failed as a hang.  2^30 pairs: 1.5 s a thread on rseq, 20 s on
	 * the fallback with reader fences, against the default 60 s limit
	 * (the bound does not follow --hang-limit).
	 */
	if ((opt_in_flight - 1) * opt_batch * (opt_burst + 1) > (1l << 30))
		return "--in-flight: (in-flight - 1) x batch x (burst + 1) over 2^30 pairs, which "
		       "each thread runs before the first point, inside --hang-limit";
	return NULL;
}

static const struct bench_variant storm_variants[] = {
	{ "kill", "init, get/put burst, kill, release, exit", storm_loop, STORM_KILL },
	{ "managed", "the same with switch_to_managed and _unmanaged before the kill", storm_loop,
	  STORM_MANAGED },
	{ "kill-poll", "kill, each thread finishing its own kills (percpu_ref_poll)", storm_loop,
	  STORM_KILL | STORM_POLL },
	{ "managed-poll", "managed, each thread finishing its own kills", storm_loop,
	  STORM_MANAGED | STORM_POLL },
	{ 0 },
};

static const struct bench_option storm_options[] = {
	{ .name = "batch", .type = BENCH_OPT_LONG, .value = &opt_batch,
	  .help = "refs a thread kills in one batch, whose releases it waits for together" },
	{ .name = "burst", .type = BENCH_OPT_LONG, .value = &opt_burst,
	  .help = "get/put pairs on each ref between init and kill" },
	{ .name = "in-flight", .type = BENCH_OPT_LONG, .value = &opt_in_flight,
	  .help = "batches a thread may have killed and not yet released; "
		  "(in-flight - 1) x batch x (burst + 1) at most 2^30" },
	{ 0 },
};

static const struct bench_workload switch_storm = {
	.name = "switch-storm",
	.help = "each thread cycles its own refs through init, kill, release, exit",
	.op = "cycle",
	.waits = true,		/* for its batches' releases */
	.variants = storm_variants,
	.options = storm_options,
	.setup = storm_setup,
	.thread_init = storm_thread_init,
	.thread_fini = storm_thread_fini,
	.teardown = storm_teardown,
	.validate = storm_validate,
};
PERCPUREF_BENCH_WORKLOAD(switch_storm);
