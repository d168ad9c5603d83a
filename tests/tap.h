/* SPDX-License-Identifier: MIT */
/*
 * Minimal TAP producer shared by the unit and stress tests.
 *
 * ok()/is() print one TAP line each and count failures; skip() prints a
 * test that cannot run here as "ok N - # SKIP why"; done_testing()
 * prints the plan and the closing "N passed, N failed" line and returns the
 * exit status.  Nothing here is concurrent: call from the main thread, or
 * use tap_fail_count() under your own lock.
 */
#ifndef PERCPUREF_TESTS_TAP_H
#define PERCPUREF_TESTS_TAP_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int tap_run, tap_failed;

static inline int tap_ok(int cond, const char *file, int line, const char *fmt, ...)
{
	va_list ap;

	tap_run++;
	if (!cond)
		tap_failed++;
	printf("%sok %d - ", cond ? "" : "not ", tap_run);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	if (!cond)
		printf("#   failed at %s:%d\n", file, line);
	fflush(stdout);
	return cond;
}

#define ok(cond, ...) tap_ok(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

/* One planned test that cannot run here; the reason says why. */
static inline __attribute__((format(printf, 1, 2))) void skip(const char *fmt, ...)
{
	va_list ap;

	printf("ok %d - # SKIP ", ++tap_run);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}
#define is(got, want, ...)                                                   \
	do {                                                                 \
		long long got_ = (long long)(got), want_ = (long long)(want); \
		if (!ok(got_ == want_, __VA_ARGS__))                          \
			printf("#   got %lld, want %lld\n", got_, want_);   \
	} while (0)

static inline int done_testing(void)
{
	printf("1..%d\n", tap_run);
	printf("%d passed, %d failed\n", tap_run - tap_failed, tap_failed);
	return tap_failed ? 1 : 0;
}

/* Seconds a stress test runs: $STRESS_SECONDS, else the test's default. */
static inline double stress_seconds(double dflt)
{
	const char *env = getenv("STRESS_SECONDS");
	double v = env && *env ? atof(env) : 0;

	return v > 0 ? v : dflt;
}

/* @clock's time in ns; 0 when the clock cannot be read. */
static inline uint64_t clock_ns(clockid_t clock)
{
	struct timespec ts;

	if (clock_gettime(clock, &ts))
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The monotonic clock, for deadlines and rates. */
static inline uint64_t now_ns(void)
{
	return clock_ns(CLOCK_MONOTONIC);
}

/* Polls @cond every millisecond until it holds, 10 s at most; its last
 * value. */
#define POLL_UNTIL(cond)                                                   \
	({                                                                 \
		bool held_ = (cond);                                       \
		for (int polls_ = 0; !held_ && polls_ < 10000; polls_++) { \
			usleep(1000);                                      \
			held_ = (cond);                                    \
		}                                                          \
		held_;                                                     \
	})

static inline double now_seconds(void)
{
	return (double)now_ns() / 1e9;
}

/* How long past its time a stress run may go on for its progress. */
#define STRESS_PATIENCE_S 30

/*
 * Whether a stress run goes on: until @end_ns, and past it while
 * @progressed is false, STRESS_PATIENCE_S more at most.  Under valgrind or
 * a sanitizer on a loaded machine a 1 s run could end before its threads
 * did anything, and its check that they made progress fail for the
 * machine's sake (valgrind_stress_poll did so once, CI's CPUs shared with
 * a kernel build); a run that makes no progress in that time fails it.
 */
static inline int stress_goes_on(uint64_t end_ns, int progressed)
{
	uint64_t now = now_ns();

	return now < end_ns || (!progressed && now - end_ns < STRESS_PATIENCE_S * UINT64_C(1000000000));
}

#endif
