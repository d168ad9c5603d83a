/*
 * signal1.c - will-it-scale signal1 run inside containers: every queued
 * signal charges RLIMIT_SIGPENDING up the user-namespace chain to the root
 * (DESIGN.md 1c, the ucounts rlimit case).
 *
 * The model.  One hcount tree stands for the ucounts hierarchy: its root is
 * init_ucounts, under it one parent namespace (the container runtime's),
 * and under that one child namespace per container.  Each container runs
 * --workers threads (default 1): thread i belongs to container i / workers,
 * so a measurement at N threads has K = ceil(N / workers) containers (the
 * last one short of workers when N is not a multiple, as in the harness's
 * one-thread row).
 * One counted operation, a "signal", is what signal1 does per iteration,
 * raise(SIGUSR1) and its delivery:
 *
 *   send      __sigqueue_alloc(): charge 1 unit of SIGPENDING at the
 *             container's namespace against this process's RLIMIT_SIGPENDING
 *             (hcount_charge_max), take a sigqueue entry from the worker's
 *             free list, fill its siginfo and append it to the pending list;
 *   deliver   dequeue the entry, copy its siginfo out to the handler (which
 *             folds si_value into a sum), uncharge the unit at the namespace
 *             the entry recorded, and put the entry back on the free list.
 *
 * The queue work is private to the worker, so the only cache lines that
 * workers of different containers can share are those the charge and the
 * uncharge write.  Variants (both through the hcount API):
 *
 *   global    a no-cache tree (HCOUNT_NO_CACHE): every charge and uncharge
 *             walks container -> parent -> root with an atomic on each
 *             level, so all containers write the parent's and the root's
 *             lines: the kernel's inc_rlimit_ucounts(), the "before" row.
 *   cached    a tree with batched caches (--batch units per refill, default
 *             HCOUNT_BATCH_DEFAULT): a charge takes a unit from the
 *             container's own cache and an uncharge puts it back, one lock
 *             round trip on the container's own line; the parent and the
 *             root are touched only when a cache refills or overflows,
 *             which a one-deep signal queue never makes happen after the
 *             first refill.  The "after" row.
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
 *     setup checks that the rlimit leaves room for every worker;
 *   - every signal sent was delivered, with the si_value it was sent with
 *     (the sum of 0 .. n-1), and the queue is empty after the loop;
 *   - conservation: after the run every container's own units are zero,
 *     hcount_tree_check() holds, and once the containers and the parent are
 *     destroyed (returning their caches) the root's count is zero.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <percpuref/hcount.h>

#include "bench.h"

/* The one resource type of the tree: UCOUNT_RLIMIT_SIGPENDING. */
#define SIGPENDING 0U

static long opt_workers = 1;
static long opt_batch = HCOUNT_BATCH_DEFAULT;

struct signal1_state {
	struct hcount_tree *tree;	/* root: init_ucounts */
	struct hcount_ns *parent;	/* the container runtime's namespace */
	struct hcount_ns **containers;	/* one child namespace per container */
	unsigned int nr_containers;
	long rlimit;			/* RLIMIT_SIGPENDING, the charge's max */
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
	struct siginfo_model info;
};

/* One worker: a thread of a container; everything here is private to it. */
struct worker {
	struct hcount_ns *ns;		/* its container's namespace */
	long rlimit;
	struct sigqueue *pending;	/* head of the pending list */
	struct sigqueue **tail;		/* where the next entry is linked */
	struct sigqueue *free;		/* free entries (the sigqueue cache) */
	struct sigqueue entry;		/* the only entry: one signal in flight */
	uint64_t sent;
	uint64_t value_sum;		/* what the handler saw */
	int pid;
};

/* A one-line error, with the variant and the measurement's thread count. */
#define signal1_die(run, fmt, ...)                                            \
	bench_die("signal1 %s, %u threads: " fmt, (run)->variant->name,       \
		  (run)->nthreads, ##__VA_ARGS__)

static void signal1_setup(struct bench_run *run)
{
	struct signal1_state *s = bench_zalloc(sizeof(*s));
	unsigned int batch = run->variant->arg ? (unsigned int)opt_batch : HCOUNT_NO_CACHE;
	struct rlimit rl;
	long limits[1];

	if (getrlimit(RLIMIT_SIGPENDING, &rl))
		signal1_die(run, "getrlimit(RLIMIT_SIGPENDING): %m");
	s->rlimit = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (rlim_t)HCOUNT_UNLIMITED
			    ? HCOUNT_UNLIMITED : (long)rl.rlim_cur;
	if (s->rlimit < (long)run->nthreads)
		signal1_die(run, "RLIMIT_SIGPENDING %ld leaves no room for every worker",
			    s->rlimit);
	/* As for user namespaces: each one's maximum is its creator's rlimit. */
	limits[0] = s->rlimit;
	if (hcount_tree_create(&s->tree, 1, batch, limits) ||
	    hcount_ns_create(&s->parent, hcount_tree_root(s->tree), limits))
		signal1_die(run, "cannot create the namespace tree");
	s->nr_containers = (run->nthreads + opt_workers - 1) / opt_workers;
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

	w->ns = s->containers[t->index / opt_workers];
	w->rlimit = s->rlimit;
	w->tail = &w->pending;
	w->free = &w->entry;
	w->pid = 1000 + (int)t->index;
	t->local = w;
}

/* raise(SIGUSR1): charge the pending unit, then queue the entry. */
static inline void signal_send(struct bench_thread *t, struct worker *w)
{
	struct sigqueue *q;

	if (percpuref_unlikely(hcount_charge_max(w->ns, SIGPENDING, 1, w->rlimit)))
		signal1_die(t->run, "thread %u: SIGPENDING charge refused", t->index);
	q = w->free;
	w->free = q->next;
	q->ucounts = w->ns;
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
static inline void signal_deliver(struct bench_thread *t, struct worker *w)
{
	struct sigqueue *q = w->pending;
	struct siginfo_model info;

	w->pending = q->next;
	if (!w->pending)
		w->tail = &w->pending;
	info = q->info;
	if (percpuref_unlikely(hcount_uncharge(q->ucounts, SIGPENDING, 1)))
		signal1_die(t->run, "thread %u: SIGPENDING uncharge failed", t->index);
	q->next = w->free;
	w->free = q;
	/* The handler. */
	w->value_sum += info.value;
}

/* Both variants: the tree's mode decides what a charge costs. */
static void signal1_loop(struct bench_thread *t)
{
	struct worker *w = t->local;

	while (bench_running(t)) {
		for (int i = 0; i < BENCH_BATCH; i++) {
			signal_send(t, w);
			signal_deliver(t, w);
		}
		bench_count(t, BENCH_BATCH);
	}
}

static void signal1_thread_fini(struct bench_thread *t)
{
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
	free(w);
}

static void signal1_teardown(struct bench_run *run)
{
	struct signal1_state *s = run->state;
	struct hcount_ns *root = hcount_tree_root(s->tree);

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

	if (opt_workers < 1 || opt_workers > 1 << 16)
		return "--workers: want 1..65536";
	if (opt_batch < 1 || opt_batch > (long)HCOUNT_BATCH_MAX) {
		snprintf(why, sizeof(why), "--batch: want 1..%u", HCOUNT_BATCH_MAX);
		return why;
	}
	return NULL;
}

static const struct bench_option signal1_options[] = {
	{ "workers", BENCH_OPT_LONG, &opt_workers,
	  "threads per container; containers = threads / workers, rounded up" },
	{ "batch", BENCH_OPT_LONG, &opt_batch, "units per cache refill (cached variant)" },
	{ NULL },
};

static const struct bench_variant signal1_variants[] = {
	{ "global", "no cache: every charge walks to the root with atomics (before)",
	  signal1_loop, 0 },
	{ "cached", "per-namespace batched cache of charged units (after)", signal1_loop, 1 },
	{ NULL },
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
	/* The report's container counts, most of them past the CPUs. */
	.threads = "1,2,4,8,16,32,64",
	.oversubscribe = true,
	.group = "container",
	.group_size = &opt_workers,
};
PERCPUREF_BENCH_WORKLOAD(signal1);
