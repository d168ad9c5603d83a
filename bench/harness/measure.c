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
 * A point that does not end is reported, not waited on for ever: after the
 * stop flag each thread has --hang-limit seconds to return (joins with a
 * timeout), and a --processes child as long past its window; then the run
 * fails, naming the thread or process (a hung thread cannot be taken back:
 * _exit(), no atexit handlers that might wait on it).  Those seconds count
 * the time this process was awake to watch (awake_clock): a job stopped
 * with Ctrl-Z and resumed does not fail on resuming.  Such a pause counts
 * in the point's time per operation, as does a window that overran its
 * end (this process got no CPU): standard error says so, having seen a
 * SIGCONT (a handler counts them) or the window's length.
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

/*
 * Seconds this process was awake since awake_clock_start(): a gap of more
 * than a second between two reads (the job stopped, this thread not run)
 * counts as one second.  Read it at least every few hundred milliseconds.
 */
struct awake_clock {
	double last;
	double awake;
};

static void awake_clock_start(struct awake_clock *c)
{
	c->last = bench_seconds();
	c->awake = 0;
}

static double awake_seconds(struct awake_clock *c)
{
	double now = bench_seconds();

	c->awake += fmin(now - c->last, 1.0);
	c->last = now;
	return c->awake;
}

/* SIGCONTs received: a stop (Ctrl-Z, SIGSTOP) ended since a read. */
static unsigned long continues;

static void count_continue(int sig)
{
	(void)sig;
	/* Read by the main thread after the point: only the count matters. */
	__atomic_fetch_add(&continues, 1, __ATOMIC_RELAXED);
}

/* The count of SIGCONTs so far, the handler installed on the first call. */
static unsigned long continues_so_far(void)
{
	static bool installed;

	if (!installed) {
		struct sigaction sa = { .sa_handler = count_continue, .sa_flags = SA_RESTART };

		sigemptyset(&sa.sa_mask);
		if (sigaction(SIGCONT, &sa, NULL))
			bench_die("sigaction (SIGCONT): %s", strerror(errno));
		installed = true;
	}
	return __atomic_load_n(&continues, __ATOMIC_RELAXED);
}

/* A point the run was stopped in, or whose window lasted well past
 * @duration (no CPU for this process), measured that time too: says so on
 * standard error.  @since: continues_so_far() before the point. */
static void warn_if_disturbed(const struct bench_workload *w, const struct bench_variant *v,
			      unsigned int n, const char *units, double seconds, double duration,
			      unsigned long since)
{
	if (continues_so_far() != since)
		fprintf(stderr, "percpuref-bench: warning: %s %s, %u %s: the run was stopped "
			"and continued during this point; its time per operation counts the "
			"pause\n", w->name, v->name, n, units);
	else if (seconds - duration > fmax(0.5, duration / 4))
		fprintf(stderr, "percpuref-bench: warning: %s %s, %u %s: the window lasted "
			"%.3g s instead of %.3g s (the run got no CPU); its time per "
			"operation counts that\n", w->name, v->name, n, units, seconds,
			duration);
}

/* Joins the threads of a point whose window has closed, each within
 * @hang_limit awake seconds. */
static void join_threads(const struct bench_workload *w, const struct bench_variant *v,
			 const struct bench_thread *threads, const pthread_t *tids,
			 unsigned int nthreads, double hang_limit)
{
	struct awake_clock clock;

	awake_clock_start(&clock);
	for (unsigned int i = 0; i < nthreads; i++) {
		for (;;) {
			struct timespec until;
			int err;

			clock_gettime(CLOCK_REALTIME, &until);
			until.tv_nsec += 100 * 1000 * 1000;
			if (until.tv_nsec >= 1000 * 1000 * 1000) {
				until.tv_sec++;
				until.tv_nsec -= 1000 * 1000 * 1000;
			}
			err = pthread_timedjoin_np(tids[i], NULL, &until);
			if (!err)
				break;
			if (err != ETIMEDOUT)
				bench_die("pthread_timedjoin_np (thread %u): %s", i, strerror(err));
			if (awake_seconds(&clock) > hang_limit) {
				fflush(stdout);
				fprintf(stderr, "percpuref-bench: %s %s, %u thread%s: thread %u (CPU %d) "
					"has not returned %g s after its window closed (--hang-limit): "
					"its loop hangs\n", w->name, v->name, nthreads,
					nthreads == 1 ? "" : "s", i, threads[i].cpu, hang_limit);
				_exit(1);
			}
		}
	}
}

static uint64_t snapshot(const struct bench_thread *threads, unsigned int n)
{
	uint64_t sum = 0;

	for (unsigned int i = 0; i < n; i++)
		sum += __atomic_load_n(&threads[i].ops, __ATOMIC_RELAXED);
	return sum;
}

/* measure(); with @processes, the main thread waits there for the other
 * processes of a --processes point before its warm-up. */
static struct sample measure_with(const struct bench_workload *w, const struct bench_variant *v,
				  unsigned int nthreads, const struct topology *topo,
				  double duration, double hang_limit,
				  pthread_barrier_t *processes)
{
	struct sample s = { 0 };
	struct bench_run run = { .workload = w, .variant = v, .nthreads = nthreads,
				 .metrics = &s.metrics };
	struct bench_thread *threads = bench_zalloc(nthreads * sizeof(*threads));
	pthread_t *tids = calloc(nthreads, sizeof(*tids));
	uint64_t ops0;
	double t0;
	int err;

	if (!tids)
		bench_die("out of memory");
	if (w->setup)
		w->setup(&run);
	/* Metrics come from the main thread's hooks only: none while threads run. */
	run.metrics = NULL;
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
	}
	pthread_barrier_wait(&start_barrier);
	if (processes)
		pthread_barrier_wait(processes);

	sleep_until(bench_seconds() + duration / 5);
	t0 = bench_seconds();
	ops0 = snapshot(threads, nthreads);
	sleep_until(t0 + duration);
	s.seconds = bench_seconds() - t0;
	s.ops = snapshot(threads, nthreads) - ops0;
	__atomic_store_n(&run.stop, true, __ATOMIC_RELAXED);

	join_threads(w, v, threads, tids, nthreads, hang_limit);
	pthread_barrier_destroy(&start_barrier);
	run.metrics = &s.metrics;
	if (w->teardown)
		w->teardown(&run);
	free(tids);
	free(threads);
	return s;
}

struct sample measure(const struct bench_workload *w, const struct bench_variant *v,
		      unsigned int nthreads, const struct topology *topo, double duration,
		      double hang_limit)
{
	unsigned long since = continues_so_far();
	struct sample s = measure_with(w, v, nthreads, topo, duration, hang_limit, NULL);

	warn_if_disturbed(w, v, nthreads, nthreads == 1 ? "thread" : "threads", s.seconds,
			  duration, since);
	return s;
}

/* What the children of a --processes point share with the parent. */
struct processes_shared {
	pthread_barrier_t barrier;	/* process-shared: the windows open */
	struct {
		uint64_t ops;
		double seconds;
	} out[];			/* child i's one-thread sample */
};

/* Kills and reaps the children still running. */
static void kill_children(const pid_t *pids, const bool *reaped, unsigned int n)
{
	for (unsigned int i = 0; i < n; i++)
		if (pids[i] > 0 && !reaped[i])
			kill(pids[i], SIGKILL);
	for (unsigned int i = 0; i < n; i++)
		if (pids[i] > 0 && !reaped[i])
			waitpid(pids[i], NULL, 0);
}

struct sample measure_processes(const struct bench_workload *w, const struct bench_variant *v,
				unsigned int nprocs, const struct topology *topo, double duration,
				double hang_limit)
{
	struct awake_clock clock;
	struct processes_shared *sh;
	size_t size = sizeof(*sh) + nprocs * sizeof(sh->out[0]);
	pthread_barrierattr_t attr;
	struct sample s = { 0 };
	pid_t *pids = calloc(nprocs, sizeof(*pids));
	bool *reaped = calloc(nprocs, sizeof(*reaped));
	pid_t parent = getpid();
	double seconds = 0, longest = 0;
	unsigned long since = continues_so_far();

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
	for (unsigned int i = 0; i < nprocs; i++) {
		pids[i] = fork();
		if (pids[i] < 0) {
			int err = errno;

			kill_children(pids, reaped, i);
			bench_die("--processes: fork (process %u of %u): %s", i + 1, nprocs,
				  strerror(err));
		}
		if (!pids[i]) {
			/* Thread i's CPU, as the only one of a copy of the topology. */
			int cpu = topo->order[i % topo->ncpus];
			struct topology one = *topo;
			struct sample mine;

			/* A parent killed before it could kill us would leave us
			 * at the barrier, a worker spinning, for ever. */
			if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != parent)
				_exit(1);

			one.ncpus = 1;
			one.order = &cpu;
			mine = measure_with(w, v, 1, &one, duration, hang_limit, &sh->barrier);
			sh->out[i].ops = mine.ops;
			sh->out[i].seconds = mine.seconds;
			_exit(0);
		}
	}
	/* From the last fork: each child's warm-up and window, then
	 * --hang-limit for its set-up, start and teardown. */
	awake_clock_start(&clock);
	for (unsigned int left = nprocs; left;) {
		int status;
		/* Stops too: a child stopped (SIGSTOP) held the others at the
		 * barrier, and this wait, until something continued it. */
		pid_t pid = waitpid(-1, &status, WUNTRACED | WNOHANG);
		unsigned int i = 0;

		if (pid < 0)
			bench_die("--processes: wait: %s", strerror(errno));
		if (!pid) {
			if (awake_seconds(&clock) > 1.2 * duration + hang_limit) {
				while (reaped[i])
					i++;
				kill_children(pids, reaped, nprocs);
				bench_die("--processes: %u of %u processes (the first on CPU %d, "
					  "pid %d) had not ended %g s after their windows would "
					  "have closed (--hang-limit); killed", left, nprocs,
					  topo->order[i % topo->ncpus], (int)pids[i], hang_limit);
			}
			nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000 * 1000 }, NULL);
			continue;
		}
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
				bench_die("--processes: wait: %s", strerror(errno));
			if (pid && WIFCONTINUED(status))
				continue;
			if (!pid) {
				kill_children(pids, reaped, nprocs);
				bench_die("--processes: the process on CPU %d (pid %d) was stopped "
					  "(signal %d); its window cannot be measured",
					  topo->order[i % topo->ncpus], (int)pids[i], stop);
			}
			/* Ended since: its status is the one to read. */
		}
		reaped[i] = true;
		left--;
		if (!WIFEXITED(status) || WEXITSTATUS(status)) {
			/* The others would wait at the barrier for ever. */
			kill_children(pids, reaped, nprocs);
			bench_die("--processes: the process on CPU %d failed (%s %d)",
				  topo->order[i % topo->ncpus],
				  WIFEXITED(status) ? "exit status" : "signal",
				  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
		}
	}
	/* One window for all: their mean, each count scaled to it.  Each
	 * child that exited 0 wrote a window of at least --duration. */
	for (unsigned int i = 0; i < nprocs; i++) {
		if (!(sh->out[i].seconds > 0))
			bench_die("--processes: the process on CPU %d reported no window",
				  topo->order[i % topo->ncpus]);
		longest = fmax(longest, sh->out[i].seconds);
		seconds += sh->out[i].seconds / nprocs;
	}
	warn_if_disturbed(w, v, nprocs, nprocs == 1 ? "process" : "processes", longest,
			  duration, since);
	for (unsigned int i = 0; i < nprocs; i++)
		s.ops += (uint64_t)llround(sh->out[i].ops * (seconds / sh->out[i].seconds));
	s.seconds = seconds;
	pthread_barrier_destroy(&sh->barrier);
	munmap(sh, size);
	free(pids);
	free(reaped);
	return s;
}
