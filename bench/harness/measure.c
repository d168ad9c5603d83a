/* SPDX-License-Identifier: MIT */
/*
 * measure.c - one measurement: a variant's loop on N pinned threads for a
 * fixed time, counted between two snapshots.
 *
 * Each thread is created with its CPU affinity already set (it never runs
 * anywhere else), runs the workload's thread_init, and waits on a barrier
 * shared with the main thread.  After the barrier the main thread sleeps
 * through a warm-up (duration / 5: page faults, cache misses, frequency
 * ramp-up), reads CLOCK_MONOTONIC and every thread's counter, sleeps for
 * the duration to an absolute deadline, reads the clock and the counters
 * again, and only then sets the stop flag.  So the sample is exactly the
 * operations completed inside [t0, t1], with every thread running
 * throughout: no start-up skew, no tail where some threads have stopped.
 *
 * Ordering: the counters and the stop flag are relaxed atomics.  A snapshot
 * may miss the last batch a thread is committing; that is one batch per
 * thread in hundreds of millions of operations.  The stop flag needs no
 * ordering either: the threads' results are read after pthread_join(),
 * which orders everything.
 *
 * A point that does not end is reported, not waited on for ever: a
 * watchdog thread gives each phase that could hang (the workload's setup,
 * the threads' start, each thread's return after the stop flag, the
 * teardown; a --processes point's children, from the last fork) its
 * --hang-limit, in seconds the run was awake to watch (a pause with
 * Ctrl-Z does not count), and past it ends the run naming the phase (a
 * hung thread cannot be taken back: _exit(), no atexit handler that might
 * wait on it).  The warm-up and the window are the main thread's sleeps,
 * unwatched.  A SIGCONT handler counts continues: a point whose window
 * one fell in, or whose window closed well late (no CPU for the run),
 * gets a warning, since its time per operation counts that; so does a
 * point where a worker's CPU clock advanced by less than 90% of the
 * window (another thread had its CPU, or it blocked: a thread's CPU clock
 * cannot tell the two apart, and schedstat's run-queue delay, which can,
 * reads 0 on kernels without schedstats), unless the workload's threads
 * wait by design (->waits) or the point has more threads than CPUs.
 *
 * The workload's own figures (bench_report_metric()) go into the sample,
 * from setup() and teardown() only: run->metrics is NULL while the threads
 * exist, so a call from a thread's hook fails loudly instead of racing.
 *
 * --processes (measure_processes()): the point as N copies of its
 * one-thread measurement, each a forked process pinned where thread i
 * would have run, all at once: the machine's own scaling, with nothing
 * shared (no library state, fence, library thread or workload object).
 * The children's main threads meet at a process-shared barrier after
 * their threads' start barrier, so their windows open together (within
 * the time a barrier takes to wake N processes) and, of equal length,
 * overlap; each child writes its count and window to a shared mapping
 * before it exits, which the parent reads after reaping it (exit and
 * wait order it).  Throughput only: the children's metrics are dropped,
 * since what a sum or mean of them means is the workload's to say.  A
 * child that fails, or is stopped on its own, makes the parent kill the
 * others (they would wait at the barrier for ever); a parent that dies
 * takes the children with it (PR_SET_PDEATHSIG).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static pthread_barrier_t start_barrier;

void metrics_set(struct bench_metrics *m, const char *name, double value, const char *unit)
{
	struct metric *x;

	for (unsigned int i = 0; i < m->n; i++) {
		if (!strcmp(m->v[i].name, name)) {
			m->v[i].value = value;
			return;
		}
	}
	if (m->n == m->cap) {
		m->cap = m->cap ? 2 * m->cap : 8;
		m->v = realloc(m->v, m->cap * sizeof(*m->v));
		if (!m->v)
			bench_die("out of memory");
	}
	x = &m->v[m->n++];
	x->name = strdup(name);
	x->unit = strdup(unit ? unit : "");
	x->value = value;
	if (!x->name || !x->unit)
		bench_die("out of memory");
}

void metrics_free(struct bench_metrics *m)
{
	for (unsigned int i = 0; i < m->n; i++) {
		free(m->v[i].name);
		free(m->v[i].unit);
	}
	free(m->v);
	*m = (struct bench_metrics){ 0 };
}

void bench_report_metric(struct bench_run *run, const char *name, double value, const char *unit)
{
	if (!name || !*name)
		bench_die("workload %s: a metric needs a name", run->workload->name);
	if (!run->metrics)
		bench_die("workload %s: metric %s reported outside setup() and teardown()",
			  run->workload->name, name);
	metrics_set(run->metrics, name, value, unit);
}

static void *thread_main(void *arg)
{
	struct bench_thread *t = arg;
	const struct bench_workload *w = t->run->workload;

	if (w->thread_init)
		w->thread_init(t);
	pthread_barrier_wait(&start_barrier);
	t->run->variant->loop(t);
	if (w->thread_fini)
		w->thread_fini(t);
	return NULL;
}

static void sleep_until(double when)
{
	struct timespec ts = { .tv_sec = (time_t)when };

	ts.tv_nsec = (long)((when - ts.tv_sec) * 1e9);
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* SIGCONTs received: a stop (Ctrl-Z, SIGSTOP) ended since a read. */
static unsigned long continues;

static void count_continue(int sig)
{
	(void)sig;
	/* Read after the fact (the window, a watchdog's wake): only the count
	 * matters, no other memory is ordered by it. */
	__atomic_fetch_add(&continues, 1, __ATOMIC_RELAXED);
}

/* The count of SIGCONTs so far.  The handler is installed by
 * measure_setup(), on the main thread, before any other thread exists. */
static unsigned long continues_so_far(void)
{
	return __atomic_load_n(&continues, __ATOMIC_RELAXED);
}

/*
 * Which thread counts a SIGCONT decides whether the count is read after
 * it: a thread other than the reader might run its handler only after the
 * reader looked (a pause then counted as time awake).  So SIGCONT is
 * blocked on the main thread, and so on every thread it creates (the
 * workers, the library's threads), but around the warm-up and window
 * sleeps, whose end reads the count (paused); and unblocked on the
 * watchdog while it watches a phase, as it reads the count after each
 * wait (never in the warm-up and window, which are unwatched: unwatch()
 * waits until the watchdog blocked it).  A blocked SIGCONT still
 * continues a stopped process: only its handler waits.
 */
static void continues_to(bool unblocked)
{
	sigset_t set;

	sigemptyset(&set);
	sigaddset(&set, SIGCONT);
	pthread_sigmask(unblocked ? SIG_UNBLOCK : SIG_BLOCK, &set, NULL);
}

void measure_setup(void)
{
	struct sigaction sa = { .sa_handler = count_continue, .sa_flags = SA_RESTART };

	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGCONT, &sa, NULL))
		bench_die("sigaction (SIGCONT): %s", strerror(errno));
	continues_to(false);
}

/* The point as messages name it: "micro private, 2 threads" (or processes). */
static void point_name(char *buf, size_t size, const struct bench_workload *w,
		       const struct bench_variant *v, unsigned int n, bool processes)
{
	snprintf(buf, size, "%s %s, %u %s%s", w->name, v->name, n,
		 processes ? "process" : "thread", n == 1 ? "" : processes ? "es" : "s");
}

/* Below this share of the window on its CPU, a worker was kept off it. */
#define WORKER_CPU_STARVED 0.9

/*
 * A point whose window the run was stopped in, or that lasted well past
 * @duration (no CPU for this process), measured that time too; one where
 * a worker ran for less of the window than WORKER_CPU_STARVED measured
 * another thread's time on its CPU: says so on standard error, the first
 * that applies (a stop or a run without CPU also stops the workers' CPU
 * clocks).
 */
static void warn_if_disturbed(const struct bench_workload *w, const struct bench_variant *v,
			      unsigned int n, bool processes, const struct topology *topo,
			      const struct sample *s, double seconds, double duration)
{
	bool late = seconds - duration > fmax(0.5, duration / 4);
	/* NAN compares false: not measured, not reported. */
	bool starved = !w->waits && n <= topo->ncpus && s->worker_cpu_min < WORKER_CPU_STARVED;
	unsigned int i = s->worker_cpu_min_index;
	char point[160];

	if (!s->paused && !late && !starved)
		return;
	point_name(point, sizeof(point), w, v, n, processes);
	progress_erase();
	if (s->paused)
		fprintf(stderr, "percpuref-bench: warning: %s: the run was stopped and continued "
			"during this point's window; its time per operation counts the "
			"pause\n", point);
	else if (late)
		fprintf(stderr, "percpuref-bench: warning: %s: the window lasted %.3g s instead "
			"of %.3g s (the run got no CPU); its time per operation counts that\n",
			point, seconds, duration);
	else
		fprintf(stderr, "percpuref-bench: warning: %s: %s %u (CPU %d) ran %.0f%% of "
			"the window (another thread had its CPU: the library's, the "
			"workload's, another process's; or it blocked); its time per "
			"operation counts that\n", point, processes ? "process" : "worker", i,
			topo->order[i % topo->ncpus], 100 * s->worker_cpu_min);
}

/* Kills the children not reaped yet and reaps them, waiting two seconds at
 * most (one traced by a tracer that does not reap it, or in uninterruptible
 * sleep, is left to init: the run ends anyway). */
static void kill_children(const pid_t *pids, const bool *reaped, unsigned int n)
{
	double until = bench_seconds() + 2;
	unsigned int left = 0;

	for (unsigned int i = 0; i < n; i++)
		if (pids[i] > 0 && !reaped[i])
			kill(pids[i], SIGKILL);
	do {
		left = 0;
		for (unsigned int i = 0; i < n; i++)
			if (pids[i] > 0 && !reaped[i] && !waitpid(pids[i], NULL, WNOHANG))
				left++;
		if (left)
			nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000 * 1000 }, NULL);
	} while (left && bench_seconds() < until);
}

/*
 * The watchdog: a thread that ends the run when one phase of a point (the
 * workload's setup, its threads' start, a thread's return once the window
 * closed, the teardown; a --processes point's children) has lasted its
 * limit in seconds of the time the run was awake to watch.  It sleeps on
 * a condition variable on CLOCK_MONOTONIC (a wall clock stepped back would
 * stretch the wait), a second at most at a time; each wake adds the time
 * since the one before, at most a second (more: the process got no CPU),
 * and nothing when a SIGCONT came in between (the run was stopped: Ctrl-Z,
 * then fg).  A hung phase cannot be taken back, so the run ends there:
 * the message, the children killed (--processes), _exit(1), with no atexit
 * handler that might wait for what hangs.
 */
struct watchdog {
	pthread_mutex_t lock;
	pthread_cond_t wake;		/* on CLOCK_MONOTONIC */
	pthread_t thread;
	unsigned long phase;		/* bumped by each watch(), unwatch() */
	bool watching;
	bool quit;
	/* SIGCONT unblocked on the watchdog: only while it watches, so that
	 * in the warm-up and the window (unwatched) the main thread alone
	 * runs the handler, before it reads the count. */
	bool counts_continues;
	double limit;			/* seconds awake */
	char what[320];			/* the message, if the phase hangs */
	/* --processes: the children (reaped[] written under the lock), named
	 * in the message and killed. */
	const pid_t *pids;
	const bool *reaped;
	unsigned int nprocs;
	const struct topology *topo;
};

static double timespec_seconds(const struct timespec *ts)
{
	return (double)ts->tv_sec + (double)ts->tv_nsec / 1e9;
}

/* A child of a --processes point not reaped yet: gone (reaped by the main
 * thread, which has not marked it yet), a zombie, or running. */
enum child_state { CHILD_GONE, CHILD_ZOMBIE, CHILD_RUNNING };

static enum child_state child_state(pid_t pid)
{
	siginfo_t info = { 0 };

	/* WNOWAIT: a zombie stays for its reaper. */
	if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT))
		return CHILD_GONE;
	return info.si_pid ? CHILD_ZOMBIE : CHILD_RUNNING;
}

/*
 * Lock held.  The phase hung: says so and ends the process; unless the
 * phase is a --processes point's children and none is running any more
 * (the main thread reaps them: the watchdog looks again in 10 ms).  The message goes out with write(): a hung
 * thread may hold stdio's lock on stderr, or a reader that stopped reading
 * fill stdout's pipe, and the run must end all the same.
 */
static void watchdog_expire(struct watchdog *wd)
{
	bool *gone = NULL;
	char msg[512];
	int len;

	if (wd->pids) {
		unsigned int left = 0, first = 0;

		gone = calloc(wd->nprocs, sizeof(*gone));
		for (unsigned int i = wd->nprocs; i-- > 0;) {
			enum child_state state = wd->reaped[i] ? CHILD_GONE
							       : child_state(wd->pids[i]);

			if (gone)
				gone[i] = state == CHILD_GONE;
			if (state == CHILD_RUNNING) {
				left++;
				first = i;
			}
		}
		if (!left) {
			free(gone);
			return;
		}
		len = snprintf(msg, sizeof(msg), "percpuref-bench: --processes: %u of %u processes "
			       "(the first on CPU %d, pid %d) %s; killed\n", left, wd->nprocs,
			       wd->topo->order[first % wd->topo->ncpus], (int)wd->pids[first],
			       wd->what);
	} else {
		len = snprintf(msg, sizeof(msg), "percpuref-bench: %s\n", wd->what);
	}
	progress_erase();
	if (write(STDERR_FILENO, msg, len < (int)sizeof(msg) ? (size_t)len : sizeof(msg) - 1) < 0)
		_exit(1);
	if (wd->pids)
		kill_children(wd->pids, gone ? gone : wd->reaped, wd->nprocs);
	/* Last, and only if nothing holds it: a full pipe could block it. */
	if (!ftrylockfile(stdout)) {
		fflush_unlocked(stdout);
		funlockfile(stdout);
	}
	_exit(1);
}

static void *watchdog_main(void *arg)
{
	struct watchdog *wd = arg;

	/* Named, so that tests can tell it from the workers. */
	pthread_setname_np(pthread_self(), "bench-watchdog");
	pthread_mutex_lock(&wd->lock);
	while (!wd->quit) {
		unsigned long phase = wd->phase, since = continues_so_far();
		struct timespec now, until;
		double awake = 0, last;

		if (!wd->watching) {
			if (wd->counts_continues) {
				continues_to(false);
				wd->counts_continues = false;
				pthread_cond_broadcast(&wd->wake);	/* unwatch() */
			}
			pthread_cond_wait(&wd->wake, &wd->lock);
			continue;
		}
		if (!wd->counts_continues) {
			continues_to(true);
			wd->counts_continues = true;
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
		last = timespec_seconds(&now);
		while (!wd->quit && wd->phase == phase) {
			/* Past the limit with nothing to expire (watchdog_expire()):
			 * 10 ms, not a deadline in the past, each time. */
			double step = fmax(0.01, fmin(1.0, wd->limit - awake) + 0.001), t;
			unsigned long c;

			until = now;
			until.tv_sec += (time_t)step;
			until.tv_nsec += (long)((step - (double)(time_t)step) * 1e9);
			if (until.tv_nsec >= 1000000000L) {
				until.tv_sec++;
				until.tv_nsec -= 1000000000L;
			}
			pthread_cond_timedwait(&wd->wake, &wd->lock, &until);
			clock_gettime(CLOCK_MONOTONIC, &now);
			t = timespec_seconds(&now);
			c = continues_so_far();
			if (c == since)
				awake += fmin(t - last, 1.0);
			since = c;
			last = t;
			if (wd->phase == phase && !wd->quit && awake > wd->limit)
				watchdog_expire(wd);
		}
	}
	pthread_mutex_unlock(&wd->lock);
	return NULL;
}

static void watchdog_start(struct watchdog *wd)
{
	pthread_condattr_t attr;
	int err;

	*wd = (struct watchdog){ .lock = PTHREAD_MUTEX_INITIALIZER };
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&wd->wake, &attr);
	pthread_condattr_destroy(&attr);
	err = pthread_create(&wd->thread, NULL, watchdog_main, wd);
	if (err)
		bench_die("pthread_create (the watchdog): %s", strerror(err));
}

static void watchdog_stop(struct watchdog *wd)
{
	pthread_mutex_lock(&wd->lock);
	wd->quit = true;
	pthread_cond_signal(&wd->wake);
	pthread_mutex_unlock(&wd->lock);
	pthread_join(wd->thread, NULL);
	pthread_cond_destroy(&wd->wake);
	pthread_mutex_destroy(&wd->lock);
}

/* With @new_phase, from now the phase that @fmt describes (how it hangs)
 * has @limit seconds awake to end, which unwatch() or the next new phase
 * says; without, the phase watched goes on, its time kept, only described
 * anew. */
static void __attribute__((format(printf, 4, 5)))
watch(struct watchdog *wd, bool new_phase, double limit, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&wd->lock);
	va_start(ap, fmt);
	vsnprintf(wd->what, sizeof(wd->what), fmt, ap);
	va_end(ap);
	wd->limit = limit;
	if (new_phase || !wd->watching) {
		wd->watching = true;
		wd->phase++;
		pthread_cond_signal(&wd->wake);
	}
	pthread_mutex_unlock(&wd->lock);
}

/* Returns once the watchdog no longer counts continues: a SIGCONT in the
 * warm-up or the window that the watchdog took ran its handler whenever
 * the watchdog got the CPU, and under load after the window's end had
 * read the count, so a stopped run was reported as one that got no CPU
 * (a --processes child, in CI). */
static void unwatch(struct watchdog *wd)
{
	pthread_mutex_lock(&wd->lock);
	wd->watching = false;
	wd->phase++;
	pthread_cond_broadcast(&wd->wake);
	while (wd->counts_continues)
		pthread_cond_wait(&wd->wake, &wd->lock);
	pthread_mutex_unlock(&wd->lock);
}

/* Each worker's CPU clock now, in @ns; 0 for one that cannot be read
 * (no clock id, or its thread gone: a worker past its thread_init and the
 * barrier never reads 0). */
static void read_cpu_clocks(const clockid_t *clocks, const bool *have, unsigned int n,
			    uint64_t *ns)
{
	for (unsigned int i = 0; i < n; i++)
		ns[i] = have[i] ? bench_clock_ns(clocks[i]) : 0;
}

/* Worker (or process) @i had @share of the window on its CPU (NAN: not
 * measured): kept in @s where it is the least so far. */
static void note_worker_cpu(struct sample *s, unsigned int i, double share)
{
	if (isfinite(share) && !(share >= s->worker_cpu_min)) {
		s->worker_cpu_min = share;
		s->worker_cpu_min_index = i;
	}
}

static uint64_t snapshot(const struct bench_thread *threads, unsigned int n)
{
	uint64_t sum = 0;

	for (unsigned int i = 0; i < n; i++)
		sum += __atomic_load_n(&threads[i].ops, __ATOMIC_RELAXED);
	return sum;
}

/* measure(), its phases watched by @wd; with @processes, the main thread
 * waits there for the other processes of a --processes point before its
 * warm-up. */
static struct sample measure_with(const struct bench_workload *w, const struct bench_variant *v,
				  unsigned int nthreads, const struct topology *topo,
				  double duration, double hang_limit, struct watchdog *wd,
				  pthread_barrier_t *processes)
{
	struct sample s = { .worker_cpu_min = NAN };
	struct bench_run run = { .workload = w, .variant = v, .nthreads = nthreads,
				 .metrics = &s.metrics };
	struct bench_thread *threads = bench_zalloc(nthreads * sizeof(*threads));
	pthread_t *tids = calloc(nthreads, sizeof(*tids));
	clockid_t *clocks = calloc(nthreads, sizeof(*clocks));
	uint64_t *cpu0 = calloc(nthreads, sizeof(*cpu0)), *cpu1 = calloc(nthreads, sizeof(*cpu1));
	bool *have_clock = calloc(nthreads, sizeof(*have_clock));
	/* Only where a short share can mean a thief: see warn_if_disturbed(). */
	bool watch_cpu = !w->waits && nthreads <= topo->ncpus;
	unsigned long continues0;
	char point[160];
	uint64_t ops0;
	double t0;
	int err;

	if (!tids || !clocks || !cpu0 || !cpu1 || !have_clock)
		bench_die("out of memory");
	point_name(point, sizeof(point), w, v, nthreads, false);
	if (w->setup) {
		watch(wd, true, hang_limit, "%s: the workload's setup has not returned after %g s "
		      "(--hang-limit)", point, hang_limit);
		w->setup(&run);
	}
	/* Metrics come from the main thread's hooks only: none while threads run. */
	run.metrics = NULL;
	watch(wd, true, hang_limit, "%s: the threads have not all started (thread_init, the "
	      "start barrier) after %g s (--hang-limit)", point, hang_limit);
	pthread_barrier_init(&start_barrier, NULL, nthreads + 1);
	for (unsigned int i = 0; i < nthreads; i++) {
		pthread_attr_t attr;
		cpu_set_t set;

		threads[i].run = &run;
		threads[i].index = i;
		threads[i].cpu = topo->order[i % topo->ncpus];
		CPU_ZERO(&set);
		CPU_SET(threads[i].cpu, &set);
		pthread_attr_init(&attr);
		err = pthread_attr_setaffinity_np(&attr, sizeof(set), &set);
		if (err)
			bench_die("pinning thread %u to CPU %d: pthread_attr_setaffinity_np: %s", i,
				  threads[i].cpu, strerror(err));
		err = pthread_create(&tids[i], &attr, thread_main, &threads[i]);
		pthread_attr_destroy(&attr);
		/* pthread_create() pins the thread with sched_setaffinity() before
		 * it runs, and returns what that returned: with these attributes,
		 * anything but EAGAIN (no memory, a thread or process limit) is
		 * the kernel refusing the CPU (a cpuset that excludes it, a CPU
		 * gone offline since the topology was read). */
		if (err && err != EAGAIN)
			bench_die("pinning thread %u to CPU %d was refused: "
				  "sched_setaffinity (in pthread_create): %s", i, threads[i].cpu,
				  strerror(err));
		if (err)
			bench_die("pthread_create (thread %u on CPU %d): %s", i, threads[i].cpu,
				  strerror(err));
		have_clock[i] = watch_cpu && !pthread_getcpuclockid(tids[i], &clocks[i]);
	}
	pthread_barrier_wait(&start_barrier);
	/* The other processes are the parent's to wait for (its limit runs
	 * from its last fork); the warm-up and the window are sleeps, with
	 * nothing to hang.  A SIGCONT in them is this thread's to count
	 * (continues_to()). */
	unwatch(wd);
	if (processes)
		pthread_barrier_wait(processes);
	continues_to(true);
	sleep_until(bench_seconds() + duration / 5);
	continues0 = continues_so_far();
	t0 = bench_seconds();
	ops0 = snapshot(threads, nthreads);
	read_cpu_clocks(clocks, have_clock, nthreads, cpu0);
	if (w->window_open)
		w->window_open(&run);
	sleep_until(t0 + duration);
	s.seconds = bench_seconds() - t0;
	s.ops = snapshot(threads, nthreads) - ops0;
	read_cpu_clocks(clocks, have_clock, nthreads, cpu1);
	if (w->window_close)
		w->window_close(&run);
	for (unsigned int i = 0; i < nthreads; i++) {
		double ran_ns = cpu0[i] && cpu1[i] ? (double)(cpu1[i] - cpu0[i]) : NAN;

		note_worker_cpu(&s, i, ran_ns / (s.seconds * 1e9));
	}
	s.paused = continues_so_far() != continues0;
	continues_to(false);
	__atomic_store_n(&run.stop, true, __ATOMIC_RELAXED);

	/* One limit for all the joins, the thread waited for named. */
	for (unsigned int i = 0; i < nthreads; i++) {
		watch(wd, !i, hang_limit, "%s: thread %u (CPU %d) has not returned %g s after "
		      "the window closed (--hang-limit): its loop hangs", point, i,
		      threads[i].cpu, hang_limit);
		pthread_join(tids[i], NULL);
	}
	pthread_barrier_destroy(&start_barrier);
	run.metrics = &s.metrics;
	if (w->teardown) {
		watch(wd, true, hang_limit, "%s: the workload's teardown has not returned after %g s "
		      "(--hang-limit)", point, hang_limit);
		w->teardown(&run);
	}
	unwatch(wd);
	free(have_clock);
	free(cpu1);
	free(cpu0);
	free(clocks);
	free(tids);
	free(threads);
	return s;
}

struct sample measure(const struct bench_workload *w, const struct bench_variant *v,
		      unsigned int nthreads, const struct topology *topo, double duration,
		      double hang_limit)
{
	struct watchdog wd;
	struct sample s;

	watchdog_start(&wd);
	s = measure_with(w, v, nthreads, topo, duration, hang_limit, &wd, NULL);
	watchdog_stop(&wd);
	warn_if_disturbed(w, v, nthreads, false, topo, &s, s.seconds, duration);
	return s;
}

/* What the children of a --processes point share with the parent. */
struct processes_shared {
	pthread_barrier_t barrier;	/* process-shared: the windows open */
	struct {
		uint64_t ops;
		double seconds;
		bool paused;
		double worker_cpu;
	} out[];			/* child i's one-thread sample */
};

/* A --processes point failed: the message first (a reap may take time),
 * then the children killed, exit status 1.  The watchdog's lock is held to
 * the end, so the watchdog cannot end the run a second time meanwhile. */
static void __attribute__((noreturn, format(printf, 2, 3)))
processes_fail(struct watchdog *wd, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&wd->lock);
	fflush(stdout);
	progress_erase();
	fputs("percpuref-bench: --processes: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	kill_children(wd->pids, wd->reaped, wd->nprocs);
	exit(1);
}

struct sample measure_processes(const struct bench_workload *w, const struct bench_variant *v,
				unsigned int nprocs, const struct topology *topo, double duration,
				double hang_limit)
{
	struct processes_shared *sh;
	size_t size = sizeof(*sh) + nprocs * sizeof(sh->out[0]);
	pthread_barrierattr_t attr;
	struct sample s = { .worker_cpu_min = NAN };
	pid_t *pids = calloc(nprocs, sizeof(*pids));
	bool *reaped = calloc(nprocs, sizeof(*reaped));
	pid_t parent = getpid();
	double seconds = 0, longest = 0;
	struct watchdog wd;

	if (!pids || !reaped)
		bench_die("out of memory");
	sh = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		bench_die("--processes: mmap: %s", strerror(errno));
	pthread_barrierattr_init(&attr);
	pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
	pthread_barrier_init(&sh->barrier, &attr, nprocs);
	pthread_barrierattr_destroy(&attr);
	/* Nothing buffered twice: the children exit with _exit(). */
	fflush(NULL);
	/* The forks come while this is the process's only thread: one running
	 * beside a fork (the watchdog starting, say) may hold a lock of the
	 * C library's, or a sanitizer's, that the child then waits for. */
	for (unsigned int i = 0; i < nprocs; i++) {
		pids[i] = fork();
		if (pids[i] < 0) {
			int err = errno;

			pids[i] = 0;
			kill_children(pids, reaped, i);
			bench_die("--processes: fork (process %u of %u): %s", i + 1, nprocs,
				  strerror(err));
		}
		if (!pids[i]) {
			/* Thread i's CPU, as the only one of a copy of the topology. */
			int cpu = topo->order[i % topo->ncpus];
			struct topology one = *topo;
			struct watchdog mine_wd;
			struct sample mine;

			/* A parent killed before it could kill us would leave us
			 * at the barrier, a worker spinning, for ever. */
			if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != parent)
				_exit(1);

			one.ncpus = 1;
			one.order = &cpu;
			/* The parent's watchdog thread is not ours: a fork copies
			 * only this thread. */
			watchdog_start(&mine_wd);
			mine = measure_with(w, v, 1, &one, duration, hang_limit, &mine_wd,
					    &sh->barrier);
			watchdog_stop(&mine_wd);
			sh->out[i].ops = mine.ops;
			sh->out[i].seconds = mine.seconds;
			sh->out[i].paused = mine.paused;
			sh->out[i].worker_cpu = mine.worker_cpu_min;
			_exit(0);
		}
	}
	watchdog_start(&wd);
	wd.pids = pids;		/* read by the watchdog after watch()'s lock */
	wd.reaped = reaped;
	wd.nprocs = nprocs;
	wd.topo = topo;
	/* From the last fork: each child's warm-up and window, then
	 * --hang-limit for its set-up, start and teardown. */
	watch(&wd, true, 1.2 * duration + hang_limit, "had not ended %g s after their windows "
	      "would have closed (--hang-limit)", hang_limit);
	for (unsigned int left = nprocs; left;) {
		int status;
		/* Stops too: a child stopped (SIGSTOP) held the others at the
		 * barrier, and this wait, until something continued it. */
		pid_t pid = waitpid(-1, &status, WUNTRACED);
		unsigned int i = 0;

		if (pid < 0)
			processes_fail(&wd, "wait: %s", strerror(errno));
		while (i < nprocs && pids[i] != pid)
			i++;
		if (i == nprocs)
			continue;	/* not ours: a child our exec inherited */
		if (WIFSTOPPED(status)) {
			int stop = WSTOPSIG(status);

			/* A stop of the whole job (Ctrl-Z) stops this process
			 * too, maybe after the wait took a child's stop; the
			 * SIGCONT that resumes it (fg) resumes the child as well,
			 * and a job paused so is no failure, as it is none for a
			 * run of threads.  A child still stopped now was stopped
			 * alone. */
			pid = waitpid(pids[i], &status, WCONTINUED | WNOHANG);
			if (pid < 0)
				processes_fail(&wd, "wait: %s", strerror(errno));
			if (pid && WIFCONTINUED(status))
				continue;
			if (!pid)
				processes_fail(&wd, "the process on CPU %d (pid %d) was stopped "
					       "(signal %d); its window cannot be measured",
					       topo->order[i % topo->ncpus], (int)pids[i], stop);
			/* Ended since: its status is the one to read. */
		}
		pthread_mutex_lock(&wd.lock);
		reaped[i] = true;
		pthread_mutex_unlock(&wd.lock);
		left--;
		/* The others would wait at the barrier for ever. */
		if (!WIFEXITED(status) || WEXITSTATUS(status))
			processes_fail(&wd, "the process on CPU %d (pid %d) failed (%s %d)",
				       topo->order[i % topo->ncpus], (int)pids[i],
				       WIFEXITED(status) ? "exit status" : "signal",
				       WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
	}
	watchdog_stop(&wd);
	/* One window for all: their mean, each count scaled to it.  Each
	 * child that exited 0 wrote a window of at least --duration. */
	for (unsigned int i = 0; i < nprocs; i++) {
		if (!(sh->out[i].seconds > 0))
			bench_die("--processes: the process on CPU %d reported no window",
				  topo->order[i % topo->ncpus]);
		longest = fmax(longest, sh->out[i].seconds);
		seconds += sh->out[i].seconds / nprocs;
		s.paused |= sh->out[i].paused;
		note_worker_cpu(&s, i, sh->out[i].worker_cpu);
	}
	warn_if_disturbed(w, v, nprocs, true, topo, &s, longest, duration);
	for (unsigned int i = 0; i < nprocs; i++)
		s.ops += (uint64_t)llround(sh->out[i].ops * (seconds / sh->out[i].seconds));
	s.seconds = seconds;
	pthread_barrier_destroy(&sh->barrier);
	munmap(sh, size);
	free(pids);
	free(reaped);
	return s;
}
