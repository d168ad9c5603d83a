/* SPDX-License-Identifier: MIT */
/*
 * bench.h - what a workload sees of the benchmark harness.
 *
 * One binary, percpuref-bench, runs every workload; a workload is one file
 * in bench/workloads/ that fills in a struct bench_workload and registers it
 * with PERCPUREF_BENCH_WORKLOAD().  The harness owns everything else: the
 * command line, CPU topology and pinning, timing, repetitions, the table
 * and the JSON (docs/bench.md).
 *
 * A measurement is one variant at one thread count.  For each, the harness
 *   1. calls setup(run) on the main thread (shared objects go in run->state);
 *   2. starts run->nthreads threads, each pinned to its own CPU before it
 *      runs, which call thread_init(t) and wait on a start barrier;
 *   3. releases the barrier, lets the threads warm up, snapshots every
 *      thread's operation count and the clock (then calls
 *      window_open(run)), sleeps for the duration, snapshots again (then
 *      calls window_close(run)), then sets the stop flag;
 *   4. joins the threads (each calls thread_fini(t) after its loop) and
 *      calls teardown(run) on the main thread.
 * Only the operations counted between the two snapshots are reported, so
 * thread start-up, warm-up and the stop are outside the measured window.
 * Figures other than the throughput (a latency, a peak of memory) go with
 * the measurement through bench_report_metric().
 *
 * The variant's loop runs on each thread after the barrier:
 *
 *	static void my_loop(struct bench_thread *t)
 *	{
 *		struct my_state *s = t->run->state;
 *
 *		while (bench_running(t)) {
 *			for (int i = 0; i < BENCH_BATCH; i++)
 *				one_operation(s);
 *			bench_count(t, BENCH_BATCH);
 *		}
 *	}
 *
 * The loop is the workload's own, so nothing but the operation is inside
 * it: no indirect call per operation, and the stop flag and the counter are
 * touched once per batch.  The counter lives in the thread's own padded
 * struct bench_thread, never shared with another writer.
 *
 * Hooks run on the thread they name; any of them may be NULL.  A workload
 * that cannot go on (allocation failure, a count that did not come back to
 * its start value) calls bench_die(), which exits with status 1.  What the
 * user can get wrong is checked before anything runs, with a usage message
 * and exit status 2: the harness rejects what is not a number, and the
 * workload's validate() hook the values its options cannot take, so setup()
 * never sees them.
 *
 * Every field after the hooks is optional, and zero keeps the plain
 * behaviour: rows of 1,2,4,...,max threads, never more than the usable CPUs
 * unless --oversubscribe, and a table of per-thread figures.  A workload
 * whose threads come in groups (signal1: K containers of W workers each)
 * names the group and points at the option holding its size; the table
 * then has a row label and a throughput column per group, and its default
 * rows (threads) are counted in groups.
 */
#ifndef PERCPUREF_BENCH_H
#define PERCPUREF_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <percpuref/compiler.h>

PERCPUREF_BEGIN_DECLS

/* Operations per batch that the example loop above uses. */
#define BENCH_BATCH 64

struct bench_workload;
struct bench_variant;
struct bench_metrics;

/* The most threads a row may have (--threads, --baseline, a workload's
 * group size): the harness keeps a flag per count up to it. */
#define BENCH_MAX_THREADS (1u << 16)

/* One measurement: a variant at a thread count. */
struct bench_run {
	const struct bench_workload *workload;
	const struct bench_variant *variant;
	unsigned int nthreads;
	void *state;		/* the workload's: set by setup() */
	/*
	 * Set once by the main thread at the end of the window; read
	 * relaxed by the loops (bench_running()), which only need to see
	 * it eventually.
	 */
	bool stop;
	/* The harness's: what bench_report_metric() attached. */
	struct bench_metrics *metrics;
};

/*
 * One thread of a measurement.  Each lives on its own pair of cache lines
 * (128 bytes, against the adjacent-line prefetcher), so the counter the
 * thread writes never shares a line with another thread's.
 */
struct bench_thread {
	struct bench_run *run;
	unsigned int index;	/* 0 .. run->nthreads - 1 */
	int cpu;		/* the CPU it is pinned to */
	void *local;		/* the workload's: e.g. set by thread_init() */
	/*
	 * Operations done so far: written only by this thread, read by the
	 * main thread for its snapshots (relaxed on both sides: the
	 * snapshots need a recent value, not an ordering).
	 */
	uint64_t ops;
} __attribute__((aligned(128)));

struct bench_variant {
	const char *name;	/* as given to --variants */
	const char *help;	/* one line for --list */
	void (*loop)(struct bench_thread *t);	/* the measured loop */
	long arg;		/* free for the workload, e.g. a mode flag */
};

enum bench_option_type {
	BENCH_OPT_LONG,		/* long *value */
	BENCH_OPT_DOUBLE,	/* double *value */
	BENCH_OPT_STRING,	/* const char **value */
	BENCH_OPT_BOOL,		/* bool *value; the flag takes no argument */
};

/*
 * A workload option, "--name VALUE" on the command line after the
 * workload's name.  *value holds the default until the command line
 * overrides it, and is reported in the JSON "params" of every row.
 */
struct bench_option {
	const char *name;
	enum bench_option_type type;
	void *value;
	const char *help;
};

struct bench_workload {
	const char *name;	/* first argument of percpuref-bench */
	const char *help;	/* one line for --help and --list */
	/*
	 * What one counted operation is, singular ("pair", "open"): the
	 * table's columns become ns/<op> and M<op>s/s.
	 */
	const char *op;
	const struct bench_variant *variants;	/* ended by { NULL } */
	const struct bench_option *options;	/* ended by { NULL }; or NULL */
	/* Scaling efficiency does not apply (not comparable per thread). */
	bool no_efficiency;
	/*
	 * Its threads block or sleep by design (wait for a release, a scan,
	 * a fence's readers): a worker with less CPU time than the window is
	 * no sign that another thread took its CPU, and goes unreported (the
	 * harness then reads no worker's CPU clock).
	 */
	bool waits;

	void (*setup)(struct bench_run *run);
	void (*thread_init)(struct bench_thread *t);
	void (*thread_fini)(struct bench_thread *t);
	void (*teardown)(struct bench_run *run);
	/*
	 * Optional, on the main thread right after each snapshot of the
	 * window (step 3), with the threads running: a workload whose
	 * metrics are rates (the reclaimer's scans) takes them over the
	 * window, not over setup, warm-up and stop.
	 */
	void (*window_open)(struct bench_run *run);
	void (*window_close)(struct bench_run *run);

	/*
	 * Called once the command line is parsed, before anything runs:
	 * NULL if the options' values are usable, else why not ("--workers:
	 * want 1..65536"; a literal, or formatted into a static buffer),
	 * which the harness prints with the usage, exiting with status 2.
	 */
	const char *(*validate)(void);
	/*
	 * Called once the rows are planned, before the first one runs, with
	 * the largest thread count of any row: NULL if every row can run,
	 * else why not, as validate().  NULL: no limit on the rows.
	 */
	const char *(*validate_rows)(unsigned int max_threads);
	/*
	 * Rows when --threads is not given, in its syntax ("1,2,4,8,16"),
	 * counted in groups when group is set.  NULL: 1,2,4,...,max threads.
	 */
	const char *threads;
	/*
	 * Oversubscription is part of the design: thread counts above the
	 * usable CPUs need no --oversubscribe.  Their rows are still flagged.
	 */
	bool oversubscribe;
	/*
	 * What a group of threads is, singular ("container"): threads
	 * i*size .. i*size+size-1 form group i, and N threads make
	 * ceil(N / size) groups (the last one short when size does not
	 * divide N).  size is *group_size, the value of one of the
	 * workload's BENCH_OPT_LONG options, which validate() keeps in
	 * 1..BENCH_MAX_THREADS; NULL: one thread per group.
	 */
	const char *group;
	const long *group_size;
	/*
	 * Thread 0 has a part of its own (fence-cost: the one that fences):
	 * --processes, which would make every process a thread 0, is refused.
	 */
	bool roles;
};

/*
 * PERCPUREF_BENCH_WORKLOAD(w) - register the workload w (a static struct
 * bench_workload) with the harness.  It puts a pointer to w in the linker
 * section "percpuref_bench_workloads", which the harness walks at start-up
 * through the __start_/__stop_ symbols the linker provides.
 */
#define PERCPUREF_BENCH_WORKLOAD(w)                                         \
	static const struct bench_workload *const bench_workload_ptr_##w   \
		__attribute__((used, section("percpuref_bench_workloads"))) = &(w)

/* bench_running - false once the main thread has ended the measurement. */
static inline bool bench_running(const struct bench_thread *t)
{
	return !__atomic_load_n(&t->run->stop, __ATOMIC_RELAXED);
}

/* bench_count - add @n operations to this thread's count. */
static inline void bench_count(struct bench_thread *t, uint64_t n)
{
	/* Single writer: a relaxed load and store, no locked instruction. */
	__atomic_store_n(&t->ops, __atomic_load_n(&t->ops, __ATOMIC_RELAXED) + n,
			 __ATOMIC_RELAXED);
}

/*
 * bench_report_metric - attach a figure of the workload's own to this
 * measurement: @name (a short identifier, "stale_peak"; copied) = @value,
 * in @unit ("ms", "KiB"; copied; NULL or "" for a count).  Call it from
 * setup() or teardown(), on the main thread; reporting a name again
 * replaces its value.  The figures land in the measurement's JSON object
 * ("metrics", "metric_units") and in a second table after the main one;
 * with --repeat, a row's figure is the mean over its repetitions.  A value
 * that is not finite (NAN: not measured) shows as "-" and JSON null.
 */
void bench_report_metric(struct bench_run *run, const char *name, double value,
			 const char *unit);

/* Zeroed memory aligned to 128 bytes, for shared objects; dies on ENOMEM. */
void *bench_zalloc(size_t size);

/* bench_clock_ns - @clock's time in ns; 0 when the clock cannot be read. */
uint64_t bench_clock_ns(clockid_t clock);
/* bench_seconds - CLOCK_MONOTONIC in seconds. */
static inline double bench_seconds(void)
{
	return bench_clock_ns(CLOCK_MONOTONIC) * 1e-9;
}

/*
 * bench_threads_named - how many of this process's threads are named
 * @name ("percpuref-cb"), and their CPU time in ns, summed, in *@cpu_ns
 * (when not NULL; 0 when there are none or their clocks cannot be read):
 * for a workload's metrics on the library's own threads, and to tell
 * whether they run.  -1, *@cpu_ns untouched, when /proc/self/task cannot
 * be read (a sandbox without /proc), or not one thread's name in it (not
 * even the caller's): unknown, where 0 made every look for a library
 * thread find none.
 */
int bench_threads_named(const char *name, uint64_t *cpu_ns);
/*
 * bench_thread_named_clock - as bench_threads_named(), with the CPU clock
 * of a thread found (the last) in *@clock instead of the sum: read it
 * with bench_clock_ns(), which returns 0 once that thread has ended, so a
 * thread of the same name started since is never read in its place.
 */
int bench_thread_named_clock(const char *name, clockid_t *clock);

/* Print "percpuref-bench: <message>" on stderr and exit with status 1. */
void bench_die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

PERCPUREF_END_DECLS

#endif
