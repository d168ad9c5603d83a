/* SPDX-License-Identifier: MIT */
/*
 * support.c - helpers for every harness file and workload (declared in
 * bench.h): bench_die(), bench_zalloc(), bench_clock_ns(), and
 * bench_threads_named(), a library thread found by its name, and its CPU time
 * (or its CPU clock: bench_thread_named_clock());
 * and for the harness (harness.h), progress_shown()/progress_erase(): the
 * progress line main.c keeps on stderr, erased before any message so that
 * the message starts a line of its own.
 *
 * They live apart from main.c so that no harness file depends on the
 * command line's file: topology.c, measure.c and report.c call down into
 * this file and nothing here calls back up.
 */
#include <dirent.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

/* Set by the main thread only; read by the watchdog (measure.c) too. */
static bool progress_on_screen;

void progress_shown(void)
{
	__atomic_store_n(&progress_on_screen, true, __ATOMIC_RELAXED);
}

void progress_erase(void)
{
	/* write(): stderr is unbuffered, and the watchdog may erase it while
	 * a hung thread holds stdio's lock on it. */
	if (__atomic_exchange_n(&progress_on_screen, false, __ATOMIC_RELAXED) &&
	    write(STDERR_FILENO, "\r\033[K", 4) < 0)
		return;
}

void bench_die(const char *fmt, ...)
{
	va_list ap;

	/* The table so far on stdout first, so the message follows it. */
	fflush(stdout);
	progress_erase();
	fprintf(stderr, "percpuref-bench: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

void *bench_zalloc(size_t size)
{
	size_t rounded = (size + 127) & ~(size_t)127;
	void *p = aligned_alloc(128, rounded ? rounded : 128);

	if (!p)
		bench_die("out of memory (%zu bytes)", size);
	return memset(p, 0, rounded ? rounded : 128);
}

uint64_t bench_clock_ns(clockid_t clock)
{
	struct timespec ts;

	if (clock_gettime(clock, &ts))
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* bench_threads_named(), and the CPU clock of the last thread found in
 * *@clock when @clock is not NULL. */
static int walk_threads_named(const char *name, uint64_t *cpu_ns, clockid_t *clock)
{
	char path[300], comm[32];
	DIR *tasks = opendir("/proc/self/task");
	struct dirent *d;
	uint64_t sum = 0;
	int found = 0;
	bool read_one = false;
	FILE *f;

	if (!tasks)
		return -1;
	while ((d = readdir(tasks))) {
		pid_t tid = (pid_t)atoi(d->d_name);

		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", d->d_name);
		f = tid > 0 ? fopen(path, "r") : NULL;
		if (!f)
			continue;
		if (fgets(comm, sizeof(comm), f)) {
			read_one = true;
			/* Another thread's CPU clock: Linux's
			 * MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED), what
			 * glibc's pthread_getcpuclockid() returns. */
			if (!strncmp(comm, name, strlen(name)) && comm[strlen(name)] == '\n') {
				clockid_t cpu_clock = (clockid_t)(((unsigned int)~tid << 3) | 6);

				found++;
				sum += bench_clock_ns(cpu_clock);
				if (clock)
					*clock = cpu_clock;
			}
		}
		fclose(f);
	}
	closedir(tasks);
	/* Not even the caller's own name: the names cannot be read. */
	if (!read_one)
		return -1;
	if (cpu_ns)
		*cpu_ns = sum;
	return found;
}

int bench_threads_named(const char *name, uint64_t *cpu_ns)
{
	return walk_threads_named(name, cpu_ns, NULL);
}

int bench_thread_named_clock(const char *name, clockid_t *clock)
{
	return walk_threads_named(name, NULL, clock);
}
