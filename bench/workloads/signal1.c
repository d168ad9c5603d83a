/* SPDX-License-Identifier: MIT */
/*
 * signal1.c - will-it-scale signal1 run inside containers: every queued
 * signal charges RLIMIT_SIGPENDING up the user-namespace chain to the root
 * (the ucounts rlimit case, docs/design.md).
 *
 * The model.  One tree stands for the ucounts hierarchy: its root is
 * init_ucounts and under it one child namespace per container (hcount's
 * variants put one parent namespace, the container runtime's, between the
 * root and the containers: a level more to charge).  Each container runs
 * --workers threads (default 1): thread i belongs to container i / workers,
 * so a measurement at N threads has K = ceil(N / workers) containers (the
 * last one short of workers when N is not a multiple, as in the harness's
 * one-thread row).
 * One counted operation, a "signal", is what signal1 does per iteration,
 * raise(SIGUSR1) and its delivery:
 *
 *   send      __sigqueue_alloc(): charge 1 unit of SIGPENDING at the
 *             container's namespace against this process's RLIMIT_SIGPENDING
 *             (the variant's charge: hcount_charge_max for hcount's), take
 *             a sigqueue entry from the worker's
 *             free list, fill its siginfo and append it to the pending list;
 *   deliver   dequeue the entry, copy its siginfo out to the handler (which
 *             folds si_value into a sum), uncharge the unit at the namespace
 *             the entry recorded, and put the entry back on the free list.
 *
 * The queue work is private to the worker, so the only cache lines that
 * workers of different containers can share are those the charge and the
 * uncharge write.  Variants (no-cache and cached through the hcount API,
 * the others through signal1_model.h):
 *
 *   global    the kernel's code, the report's "before" row: Linux 6.12's
 *             inc_rlimit_get_ucounts() and dec_rlimit_put_ucounts(), an
 *             atomic add on every level from the container to the root,
 *             checked after the add and unwound when over, and a get or a
 *             put of a level's ucounts reference when its count goes from
 *             0 to 1 or back; every container writes the root's line.
 *   no-cache  hcount without caches (HCOUNT_NO_CACHE): every charge and
 *             uncharge walks container -> parent -> root, a compare-and-
 *             swap per level that never passes a max (exact, where the
 *             kernel's add may pass it for a moment) and an add to the
 *             container's own count; no reference to take.
 *   cached    a tree with batched caches (--batch units per refill, default
 *             HCOUNT_BATCH_DEFAULT): a charge takes a unit from the
 *             container's own cache and an uncharge puts it back, one lock
 *             round trip on the container's own line; the parent and the
 *             root are touched only when a cache refills or overflows,
 *             which a one-deep signal queue never makes happen after the
 *             first refill.  Today's library policy.
 *   cached-report  the report's own cache policy (signal1_model.h): the
 *             containers' namespaces directly under the root, an atomic
 *             cache per container refilled with 16 units and returning 16
 *             as soon as it holds more than 16, and --override-rlimit for
 *             the path that skips the parents' max.  The report's "after".
 *   percpu-counter  the series' next revision: a percpu_counter per level,
 *             per-CPU deltas folded past a batch, an approximate limit
 *             check that turns exact near the limit.
 *
 * Reading the table.  The harness groups the threads into containers
 * (.group, .group_size = &opt_workers), so the table has the report's shape:
 * a row per container count (by default the report's 1, 2, 4 ... 64) and,
 * per variant, the signals/s of one container next to the total.  Those
 * counts run past the CPUs by design (.oversubscribe); the rows that do are
 * flagged '!': their workers time-share CPUs, so per-container throughput
 * falls as CPUs / K for every variant and only the total (Msignals/s) stays
 * comparable.  With --workers 1, eff = throughput(K) / (K x throughput(1))
 * is the per-container throughput relative to one container alone.
 *
 * Invariants, checked by each worker after its loop and by teardown (a
 * failure exits through bench_die, which the smoke test relies on):
 *   - no charge is refused: a worker has at most one signal pending, and
 *     setup checks that the rlimit leaves room for every worker (the
 *     report's model may refuse one with room left, under concurrency: it
 *     is retried, and counted in the "refusals" metric with --limit);
 *   - every signal sent was delivered, with the si_value it was sent with
 *     (the sum of 0 .. n-1), and the queue is empty after the loop;
 *   - conservation: after the run every container's own units are zero,
 *     hcount_tree_check() holds, and once the containers and the parent are
 *     destroyed (returning their caches) the root's count is zero; in
 *     signal1_model.h's tree, every level's count is zero once the caches
 *     are drained, and every level holds only its namespace's reference.
 */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <unistd.h>

#include <percpuref/hcount.h>

#include "bench.h"
#include "signal1_model.h"

/* The one resource type of the tree: UCOUNT_RLIMIT_SIGPENDING. */
#define SIGPENDING 0U

static long opt_workers = 1;
static long opt_batch = HCOUNT_BATCH_DEFAULT;
static long opt_limit;
static bool opt_override_rlimit;

/* The hcount variants first; SIGNAL1_KERNEL and after use signal1_model.h. */
enum signal1_kind {
	SIGNAL1_NO_CACHE,
	SIGNAL1_CACHED,
	SIGNAL1_KERNEL,
	SIGNAL1_REPORT,
	SIGNAL1_PCPU_COUNTER,
};

struct signal1_state {
	struct hcount_tree *tree;	/* root: init_ucounts */
	struct hcount_ns *parent;	/* the container runtime's namespace */
	struct hcount_ns **containers;	/* one child namespace per container */
	unsigned int nr_containers;
	long rlimit;			/* RLIMIT_SIGPENDING, the charge's max */
	struct sig1_tree *model;	/* global, cached-report, percpu-counter */
	uint64_t refusals;		/* cached-report's retried; atomic */
};

/* The part of kernel_siginfo_t that a SI_TKILL signal carries. */
struct siginfo_model {
	int signo;
	int code;
	int pid;
	unsigned int uid;
	uint64_t value;
};

struct sigqueue {
	struct sigqueue *next;
	struct hcount_ns *ucounts;	/* where the pending unit was charged */
	struct sig1_level *level;	/* the same, in signal1_model.h's tree */
	struct siginfo_model info;
};

/* One worker: a thread of a container; everything here is private to it. */
struct worker {
	struct hcount_ns *ns;		/* its container's namespace */
	struct sig1_tree *model;	/* global, cached-report, percpu-counter ... */
	struct sig1_level *level;	/* ... and its container's level there */
	int cpu;			/* percpu-counter: whose delta */
	long rlimit;
	struct sigqueue *pending;	/* head of the pending list */
	struct sigqueue **tail;		/* where the next entry is linked */
	struct sigqueue *free;		/* free entries (the sigqueue cache) */
	struct sigqueue entry;		/* the only entry: one signal in flight */
	uint64_t sent;
	uint64_t value_sum;		/* what the handler saw */
	uint64_t refusals;		/* cached-report: refused with room left */
	int pid;
};

/* A one-line error, with the variant and the measurement's thread count. */
#define signal1_die(run, fmt, ...)                                            \
	bench_die("signal1 %s, %u threads: " fmt, (run)->variant->name,       \
		  (run)->nthreads, ##__VA_ARGS__)

/* The task's limit: --limit, else RLIMIT_SIGPENDING; -1 if unreadable. */
static long sigpending_limit(void)
{
	struct rlimit rl;

	if (opt_limit)
		return opt_limit;
	if (getrlimit(RLIMIT_SIGPENDING, &rl))
		return -1;
	return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (rlim_t)HCOUNT_UNLIMITED
		       ? HCOUNT_UNLIMITED : (long)rl.rlim_cur;
}

static void signal1_setup(struct bench_run *run)
{
	struct signal1_state *s = bench_zalloc(sizeof(*s));
	unsigned int batch = run->variant->arg == SIGNAL1_CACHED ? (unsigned int)opt_batch
								 : HCOUNT_NO_CACHE;
	long limits[1];

	/* signal1_validate_rows() checked it against every row. */
	s->rlimit = sigpending_limit();
	s->nr_containers = (run->nthreads + opt_workers - 1) / opt_workers;
	if (run->variant->arg >= SIGNAL1_KERNEL) {
		long ncpus = sysconf(_SC_NPROCESSORS_CONF);

		/* The report's tree: containers directly under the root. */
		s->model = sig1_tree_create(s->nr_containers, s->rlimit,
					    ncpus > 0 ? (unsigned int)ncpus : 1);
		s->model->override_rlimit = opt_override_rlimit;
		run->state = s;
		return;
	}
	/* As for user namespaces: each one's maximum is its creator's rlimit. */
	limits[0] = s->rlimit;
	if (hcount_tree_create(&s->tree, 1, batch, limits) ||
	    hcount_ns_create(&s->parent, hcount_tree_root(s->tree), limits))
		signal1_die(run, "cannot create the namespace tree");
	s->containers = bench_zalloc(s->nr_containers * sizeof(*s->containers));
	for (unsigned int i = 0; i < s->nr_containers; i++)
		if (hcount_ns_create(&s->containers[i], s->parent, limits))
			signal1_die(run, "cannot create container %u", i);
	run->state = s;
}

static void signal1_thread_init(struct bench_thread *t)
{
	struct signal1_state *s = t->run->state;
	struct worker *w = bench_zalloc(sizeof(*w));

	if (s->model) {
		w->model = s->model;
		w->level = s->model->containers[t->index / opt_workers];
		if (t->cpu >= (int)s->model->ncpus)
			signal1_die(t->run, "CPU %d past the %u per-CPU deltas", t->cpu,
				    s->model->ncpus);
	} else {
		w->ns = s->containers[t->index / opt_workers];
	}
	w->cpu = t->cpu;
	w->rlimit = s->rlimit;
	w->tail = &w->pending;
	w->free = &w->entry;
	w->pid = 1000 + (int)t->index;
	t->local = w;
}

/* The pending unit: charged at the worker's container, true if allowed. */
static inline __attribute__((always_inline)) bool
signal_charge(struct worker *w, enum signal1_kind kind)
{
	switch (kind) {
	case SIGNAL1_NO_CACHE:
	case SIGNAL1_CACHED:
		return !hcount_charge_max(w->ns, SIGPENDING, 1, w->rlimit);
	case SIGNAL1_KERNEL:
		return sig1_kernel_charge(w->model, w->level, w->rlimit);
	case SIGNAL1_REPORT:
		/*
		 * The patch as posted may refuse with room left, while
		 * another worker's batch sits on a level before it is taken
		 * back (signal1_model.h): retried, and counted.  Room is
		 * there (validate_rows), so a run of refusals means a bug.
		 */
		for (unsigned int tries = 0; !sig1_report_charge(w->model, w->level, w->rlimit);
		     tries++) {
			if (tries == SIG1_REPORT_RETRIES)
				return false;
			w->refusals++;
		}
		return true;
	case SIGNAL1_PCPU_COUNTER:
		return sig1_pcpu_charge(w->model, w->level, w->cpu, w->rlimit);
	}
	return false;
}

/* The unit of @q, given back; false if the uncharge failed. */
static inline __attribute__((always_inline)) bool
signal_uncharge(struct worker *w, const struct sigqueue *q, enum signal1_kind kind)
{
	switch (kind) {
	case SIGNAL1_NO_CACHE:
	case SIGNAL1_CACHED:
		return !hcount_uncharge(q->ucounts, SIGPENDING, 1);
	case SIGNAL1_KERNEL:
		return sig1_kernel_uncharge(q->level, NULL);
	case SIGNAL1_REPORT:
		sig1_report_uncharge(q->level);
		return true;
	case SIGNAL1_PCPU_COUNTER:
		sig1_pcpu_uncharge(w->model, q->level, w->cpu);
		return true;
	}
	return false;
}

/* raise(SIGUSR1): charge the pending unit, then queue the entry. */
static inline __attribute__((always_inline)) void
signal_send(struct bench_thread *t, struct worker *w, enum signal1_kind kind)
{
	struct sigqueue *q;

	if (percpuref_unlikely(!signal_charge(w, kind)))
		signal1_die(t->run, "thread %u: SIGPENDING charge refused", t->index);
	q = w->free;
	w->free = q->next;
	q->ucounts = w->ns;
	q->level = w->level;
	q->info = (struct siginfo_model){
		.signo = SIGUSR1,
		.code = SI_TKILL,
		.pid = w->pid,
		.uid = 1000,
		.value = w->sent++,
	};
	q->next = NULL;
	*w->tail = q;
	w->tail = &q->next;
}

/* Delivery: dequeue, copy out for the handler, uncharge, free the entry. */
static inline __attribute__((always_inline)) void
signal_deliver(struct bench_thread *t, struct worker *w, enum signal1_kind kind)
{
	struct sigqueue *q = w->pending;
	struct siginfo_model info;

	w->pending = q->next;
	if (!w->pending)
		w->tail = &w->pending;
	info = q->info;
	if (percpuref_unlikely(!signal_uncharge(w, q, kind)))
		signal1_die(t->run, "thread %u: SIGPENDING uncharge failed", t->index);
	q->next = w->free;
	w->free = q;
	/* The handler. */
	w->value_sum += info.value;
}

/* One loop per model, @kind a constant; hcount's mode is the tree's. */
static inline __attribute__((always_inline)) void
signal1_loop(struct bench_thread *t, enum signal1_kind kind)
{
	struct worker *w = t->local;

	while (bench_running(t)) {
		for (int i = 0; i < BENCH_BATCH; i++) {
			signal_send(t, w, kind);
			signal_deliver(t, w, kind);
		}
		bench_count(t, BENCH_BATCH);
	}
}

static void signal1_hcount_loop(struct bench_thread *t)
{
	signal1_loop(t, SIGNAL1_CACHED);
}

static void signal1_kernel_loop(struct bench_thread *t)
{
	signal1_loop(t, SIGNAL1_KERNEL);
}

static void signal1_report_loop(struct bench_thread *t)
{
	signal1_loop(t, SIGNAL1_REPORT);
}

static void signal1_pcpu_counter_loop(struct bench_thread *t)
{
	signal1_loop(t, SIGNAL1_PCPU_COUNTER);
}

static void signal1_thread_fini(struct bench_thread *t)
{
	struct signal1_state *s = t->run->state;
	struct worker *w = t->local;
	/* Sum of 0 .. sent-1, modulo 2^64 like value_sum. */
	uint64_t want = w->sent % 2 ? w->sent * ((w->sent - 1) / 2)
				    : (w->sent / 2) * (w->sent - 1);

	if (w->sent != t->ops || w->pending || w->free != &w->entry)
		signal1_die(t->run, "thread %u: %llu signals sent, %llu counted, queue %s",
			    t->index, (unsigned long long)w->sent,
			    (unsigned long long)t->ops, w->pending ? "not empty" : "broken");
	if (w->value_sum != want)
		signal1_die(t->run, "thread %u: handler saw si_value sum %llu, want %llu",
			    t->index, (unsigned long long)w->value_sum,
			    (unsigned long long)want);
	/* Relaxed: a sum, read in teardown after every thread joined. */
	__atomic_fetch_add(&s->refusals, w->refusals, __ATOMIC_RELAXED);
	free(w);
}

static void signal1_teardown(struct bench_run *run)
{
	struct signal1_state *s = run->state;
	struct hcount_ns *root;

	if (s->model) {
		for (unsigned int i = 0; i < s->nr_containers; i++)
			if (sig1_pcpu_sum(s->model, s->model->containers[i]))
				signal1_die(run, "container %u still holds %ld units", i,
					    sig1_pcpu_sum(s->model, s->model->containers[i]));
		/*
		 * The report's drains (a refill the limit refused; none in
		 * percpu-counter), with --limit only: the default limit leaves
		 * room for every refill.
		 */
		if (opt_limit) {
			bool report = run->variant->arg == SIGNAL1_REPORT;

			bench_report_metric(run, "drains", report ? (double)s->model->drains : NAN,
					    NULL);
			bench_report_metric(run, "refusals", report ? (double)s->refusals : NAN,
					    NULL);
		}
		if (!sig1_tree_destroy(s->model))
			signal1_die(run, "units or ucounts references left in the tree after the "
				    "caches were drained");
		free(s);
		return;
	}
	root = hcount_tree_root(s->tree);
	for (unsigned int i = 0; i < s->nr_containers; i++)
		if (hcount_ns_own(s->containers[i], SIGPENDING))
			signal1_die(run, "container %u still holds %ld units", i,
				    hcount_ns_own(s->containers[i], SIGPENDING));
	if (hcount_tree_check(s->tree))
		signal1_die(run, "hcount_tree_check failed after the run");
	for (unsigned int i = 0; i < s->nr_containers; i++)
		if (hcount_ns_destroy(s->containers[i]))
			signal1_die(run, "cannot destroy container %u", i);
	if (hcount_ns_destroy(s->parent))
		signal1_die(run, "cannot destroy the parent namespace");
	if (hcount_ns_count(root, SIGPENDING) || hcount_ns_own(root, SIGPENDING))
		signal1_die(run, "root count %ld, own %ld after teardown, want 0",
			    hcount_ns_count(root, SIGPENDING), hcount_ns_own(root, SIGPENDING));
	if (hcount_tree_destroy(s->tree))
		signal1_die(run, "cannot destroy the tree");
	free(s->containers);
	free(s);
}

static const char *signal1_validate(void)
{
	static char why[64];

	if (opt_workers < 1 || opt_workers > BENCH_MAX_THREADS)
		return "--workers: want 1..65536";
	if (opt_batch < 1 || opt_batch > (long)HCOUNT_BATCH_MAX) {
		snprintf(why, sizeof(why), "--batch: want 1..%u", HCOUNT_BATCH_MAX);
		return why;
	}
	if (opt_limit < 0)
		return "--limit: want 0 (the process's RLIMIT_SIGPENDING) or more";
	return NULL;
}

/* Each worker keeps one signal pending: the limit must leave room for all. */
static const char *signal1_validate_rows(unsigned int max_threads)
{
	static char why[96];
	long limit = sigpending_limit();

	if (limit < 0)
		return "getrlimit(RLIMIT_SIGPENDING) failed";
	if (limit < (long)max_threads) {
		snprintf(why, sizeof(why), "a limit of %ld pending signals leaves no room for %u "
			 "workers", limit, max_threads);
		return why;
	}
	return NULL;
}

static const struct bench_option signal1_options[] = {
	{ "workers", BENCH_OPT_LONG, &opt_workers,
	  "threads per container; containers = threads / workers, rounded up" },
	{ "batch", BENCH_OPT_LONG, &opt_batch, "units per cache refill (cached variant)" },
	{ "limit", BENCH_OPT_LONG, &opt_limit,
	  "every namespace's max and the task's rlimit (0: RLIMIT_SIGPENDING)" },
	{ "override-rlimit", BENCH_OPT_BOOL, &opt_override_rlimit,
	  "global, cached-report, percpu-counter: override_rlimit (parents' max unchecked)" },
	{ 0 },
};

static const struct bench_variant signal1_variants[] = {
	{ "global", "the kernel's: an atomic add per level up to the root (before)",
	  signal1_kernel_loop, SIGNAL1_KERNEL },
	{ "no-cache", "hcount without caches: a compare-and-swap per level, exact",
	  signal1_hcount_loop, SIGNAL1_NO_CACHE },
	{ "cached", "hcount's batched cache of charged units (today's policy)",
	  signal1_hcount_loop, SIGNAL1_CACHED },
	{ "cached-report", "the report's cache: batch 16, containers under the root (after)",
	  signal1_report_loop, SIGNAL1_REPORT },
	{ "percpu-counter", "a percpu_counter per level, exact read near the limit (v2)",
	  signal1_pcpu_counter_loop, SIGNAL1_PCPU_COUNTER },
	{ 0 },
};

static const struct bench_workload signal1 = {
	.name = "signal1",
	.help = "queue and take a signal, charged to RLIMIT_SIGPENDING per container",
	.op = "signal",
	.variants = signal1_variants,
	.options = signal1_options,
	.setup = signal1_setup,
	.thread_init = signal1_thread_init,
	.thread_fini = signal1_thread_fini,
	.teardown = signal1_teardown,
	.validate = signal1_validate,
	.validate_rows = signal1_validate_rows,
	/* The report's container counts, most of them past the CPUs. */
	.threads = "1,2,4,8,16,32,64",
	.oversubscribe = true,
	.group = "container",
	.group_size = &opt_workers,
};
PERCPUREF_BENCH_WORKLOAD(signal1);
