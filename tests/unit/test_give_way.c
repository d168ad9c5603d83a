/* SPDX-License-Identifier: MIT */
/*
 * test_give_way.c - the callback thread gives way before a batch when a
 * fence started within the poll interval (src/deferred.c, "Giving way"):
 * it yields once, so that killers sharing its CPU queue more for the same
 * fence.  Here a thread pinned to one CPU (the callback thread its first
 * kill starts takes the same CPU) kills refs in a loop, with the interval
 * at 1 s so that every batch after the first follows a fence: the thread
 * gives way, and every ref is still released exactly once.  Child runs:
 * with PERCPUREF_POLL_INTERVAL_US=0 it never gives way; with 2 ms, a kill
 * after a quiet spell of 20 ms does not either.  How much it gains is the
 * benchmark's to say (switch-storm's kill and managed variants).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "child.h"
#include "internal.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

#define KILLS 2000
/* Exit statuses of the child runs. */
#define CHILD_OK 0
#define CHILD_GAVE_WAY 1
#define CHILD_LOST_RELEASE 2

struct object {
	struct percpu_ref ref;
	int releases;		/* atomic: counted on the callback thread */
};

static struct object objects[KILLS];

static void count_release(struct percpu_ref *ref)
{
	struct object *o = caa_container_of(ref, struct object, ref);

	/* Release: pairs with the check's acquire. */
	__atomic_fetch_add(&o->releases, 1, __ATOMIC_RELEASE);
}

/* Kills @n of objects[], yielding every 16 kills (room for the callback
 * thread on this CPU), then waits for them: the number not released
 * exactly once. */
static int kill_and_count(int n)
{
	int i, wrong = 0;

	for (i = 0; i < n; i++) {
		if (percpu_ref_init(&objects[i].ref, count_release, 0))
			abort();
		percpu_ref_kill(&objects[i].ref);
		if (i % 16 == 15)
			sched_yield();
	}
	percpu_ref_barrier();
	for (i = 0; i < n; i++) {
		wrong += __atomic_load_n(&objects[i].releases, __ATOMIC_ACQUIRE) != 1;
		percpu_ref_exit(&objects[i].ref);
		objects[i].releases = 0;
	}
	return wrong;
}

/* Before the library's first use: the callback thread takes this CPU. */
static bool pin_here(void)
{
	cpu_set_t one;
	int cpu = sched_getcpu();

	CPU_ZERO(&one);
	if (cpu >= 0)
		CPU_SET(cpu, &one);
	return cpu >= 0 && !sched_setaffinity(0, sizeof(one), &one);
}

/* PERCPUREF_POLL_INTERVAL_US=0: a storm of kills, and no yield. */
static int child_no_interval(void)
{
	pin_here();
	if (kill_and_count(KILLS))
		return CHILD_LOST_RELEASE;
	return percpuref_test_deferred_gave_way() ? CHILD_GAVE_WAY : CHILD_OK;
}

/* 2 ms: two kills 20 ms apart, each its own batch after a quiet spell. */
static int child_quiet(void)
{
	static const struct timespec quiet = { 0, 20000000 };

	if (kill_and_count(1))
		return CHILD_LOST_RELEASE;
	nanosleep(&quiet, NULL);
	if (kill_and_count(1))
		return CHILD_LOST_RELEASE;
	return percpuref_test_deferred_gave_way() ? CHILD_GAVE_WAY : CHILD_OK;
}

static int child_run(const char *what, const char *interval_us, const char *mode)
{
	int status;

	setenv("PERCPUREF_POLL_INTERVAL_US", interval_us, 1);
	status = run_mode(mode);
	setenv("PERCPUREF_POLL_INTERVAL_US", "1000000", 1);
	if (status == CHILD_LOST_RELEASE)
		printf("# %s: a ref was not released exactly once\n", what);
	return status;
}

int main(int argc, char **argv)
{
	unsigned long gave, fences;
	bool pinned;

	if (argc > 1 && !strcmp(argv[1], "--no-interval"))
		return child_no_interval();
	if (argc > 1 && !strcmp(argv[1], "--quiet"))
		return child_quiet();

	setenv("PERCPUREF_POLL_INTERVAL_US", "1000000", 1);
	pinned = pin_here();
	is(kill_and_count(KILLS), 0, "%d kills: each released once", KILLS);
	gave = percpuref_test_deferred_gave_way();
	fences = percpuref_deferred_fences();
	ok(gave > 0 && gave <= fences, "the thread gave way before %lu of its %lu batches%s", gave,
	   fences, pinned ? " (sharing this CPU)" : "");
	is(child_run("interval 0", "0", "--no-interval"), CHILD_OK,
	   "PERCPUREF_POLL_INTERVAL_US=0: never gave way, each released once");
	is(child_run("quiet", "2000", "--quiet"), CHILD_OK,
	   "a kill after a quiet spell: no yield, released once");
	return done_testing();
}
