/* SPDX-License-Identifier: MIT */
/*
 * test_sync_fork.c - forks amid synchronous switches (src/percpu_ref.c,
 * lock_for_sync_switch(), sync_switch_fork_lock/unlock/child();
 * tests/model/syncfork.pml, Model V).
 *
 * 1 (storm): SWITCHERS threads switch refs of their own to atomic
 *   synchronously and back without pause, all on one stripe's neighbours
 *   and on refs of distinct stripes, while the main thread forks FORKS
 *   times.  glibc's default rwlock prefers readers: without the gate a
 *   fork could wait for ever (the alarm ends the test; the worst fork's
 *   time is printed, not bounded).  Each child checks that no synchronous
 *   switch is half done on an inherited ref, switches an inherited ref and
 *   a new one synchronously (the rwlock re-initialised, the flag down, the
 *   gate free), and forks a grandchild that does the same.
 * 2 (release): a @release run at the end of a synchronous switch (the
 *   switch's own reference was the last) forks, and switches another ref
 *   synchronously, while a second thread keeps switching: the release
 *   runs after the read unlock, so the fork does not wait for its own
 *   thread.  The child does a synchronous switch.
 * Exit status of a child: 0 fine, 1 a switch half done, 128 + SIGALRM a
 * hang.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "percpuref/percpu_ref.h"
#include "child.h"
#include "tap.h"

#define SWITCHERS 3
#define REFS_EACH 4
#define FORKS 200

static struct percpu_ref refs[SWITCHERS][REFS_EACH];
static int stop;	/* atomic */
static unsigned long switches[SWITCHERS];	/* atomic */

static void *switcher(void *arg)
{
	long id = (long)arg;
	int i = 0;

	while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
		struct percpu_ref *r = &refs[id][i++ % REFS_EACH];

		percpu_ref_switch_to_atomic_sync(r);
		percpu_ref_switch_to_percpu(r);
		__atomic_fetch_add(&switches[id], 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

static int child_switches(int depth)
{
	struct percpu_ref fresh;
	int i, j;

	for (i = 0; i < SWITCHERS; i++)
		for (j = 0; j < REFS_EACH; j++)
			if (__atomic_load_n(&refs[i][j].data->confirm_switch, __ATOMIC_RELAXED))
				return 1;
	percpu_ref_switch_to_atomic_sync(&refs[0][0]);
	percpu_ref_switch_to_percpu(&refs[0][0]);
	if (percpu_ref_init(&fresh, NULL, PERCPU_REF_ALLOW_REINIT))
		return 2;
	percpu_ref_switch_to_atomic_sync(&fresh);
	percpu_ref_switch_to_percpu(&fresh);
	percpu_ref_switch_to_atomic_sync(&fresh);
	percpu_ref_kill(&fresh);
	percpu_ref_exit(&fresh);
	if (depth == 0) {
		pid_t pid = fork();

		if (pid == 0) {
			child_deadline(10);
			_exit(child_switches(1));
		}
		return wait_child(pid);
	}
	return 0;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void test_storm(void)
{
	pthread_t t[SWITCHERS];
	int i, j, bad = 0, hung = 0, cut = 0, forks = UNDER_VALGRIND ? 20 : FORKS;
	uint64_t worst = 0;
	unsigned long before[SWITCHERS], progressed = 0;

	for (i = 0; i < SWITCHERS; i++)
		for (j = 0; j < REFS_EACH; j++)
			percpu_ref_init(&refs[i][j], NULL, PERCPU_REF_ALLOW_REINIT);
	__atomic_store_n(&stop, 0, __ATOMIC_RELAXED);
	for (i = 0; i < SWITCHERS; i++)
		pthread_create(&t[i], NULL, switcher, (void *)(long)i);
	for (i = 0; i < SWITCHERS; i++)
		while (!__atomic_load_n(&switches[i], __ATOMIC_RELAXED))
			usleep(1000);
	for (i = 0; i < SWITCHERS; i++)
		before[i] = __atomic_load_n(&switches[i], __ATOMIC_RELAXED);
	for (i = 0; i < forks; i++) {
		uint64_t t0 = mono_ns(), took;
		pid_t pid = fork();
		int ret;

		if (pid == 0) {
			child_deadline(20);
			_exit(child_switches(0));
		}
		took = mono_ns() - t0;
		if (took > worst)
			worst = took;
		ret = wait_child(pid);
		cut += ret == 1;
		hung += ret == 128 + SIGALRM;
		bad += ret != 0 && ret != 1 && ret != 128 + SIGALRM;
	}
	for (i = 0; i < SWITCHERS; i++)
		progressed += __atomic_load_n(&switches[i], __ATOMIC_RELAXED) - before[i];
	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	for (i = 0; i < SWITCHERS; i++)
		pthread_join(t[i], NULL);
	ok(!cut && !hung && !bad, "1 (storm): %d forks amid %d synchronous switchers: children "
	   "switch synchronously, and their children (%d half done, %d hung, %d failed)",
	   forks, SWITCHERS, cut, hung, bad);
	/* Not a bound (a loaded machine's fork takes what it takes): a fork
	 * the switches starved would not return before the alarm. */
	printf("# 1 (storm): worst fork %.1f ms; %lu switches meanwhile\n",
	       (double)worst / 1e6, progressed);
	for (i = 0; i < SWITCHERS; i++)
		for (j = 0; j < REFS_EACH; j++) {
			percpu_ref_kill(&refs[i][j]);
			percpu_ref_exit(&refs[i][j]);
		}
}

static struct percpu_ref rel_ref, other_ref;
static int rel_children_bad;	/* atomic */
static int rel_runs;		/* atomic */

static void forking_release(struct percpu_ref *ref)
{
	pid_t pid;
	int ret;

	(void)ref;
	/* Another ref, synchronously, from the release. */
	percpu_ref_switch_to_atomic_sync(&other_ref);
	percpu_ref_switch_to_percpu(&other_ref);
	pid = fork();
	if (pid == 0) {
		struct percpu_ref fresh;

		child_deadline(10);
		if (__atomic_load_n(&refs[0][0].data->confirm_switch, __ATOMIC_RELAXED))
			_exit(1);
		percpu_ref_switch_to_atomic_sync(&refs[0][0]);
		percpu_ref_switch_to_percpu(&refs[0][0]);
		percpu_ref_init(&fresh, NULL, 0);
		percpu_ref_switch_to_atomic_sync(&fresh);
		percpu_ref_kill(&fresh);
		percpu_ref_exit(&fresh);
		_exit(0);
	}
	ret = wait_child(pid);
	if (ret != 0)
		__atomic_fetch_add(&rel_children_bad, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&rel_runs, 1, __ATOMIC_RELAXED);
}

static void test_release_forks(void)
{
	pthread_t t;
	int i, n = UNDER_VALGRIND ? 10 : 100;

	for (i = 0; i < REFS_EACH; i++)
		percpu_ref_init(&refs[0][i], NULL, PERCPU_REF_ALLOW_REINIT);
	percpu_ref_init(&other_ref, NULL, PERCPU_REF_ALLOW_REINIT);
	__atomic_store_n(&stop, 0, __ATOMIC_RELAXED);
	pthread_create(&t, NULL, switcher, (void *)0L);
	for (i = 0; i < n; i++) {
		percpu_ref_init(&rel_ref, forking_release, 0);
		/* The last reference dropped per-CPU: the synchronous switch's
		 * fold finds only its own, and its finish releases. */
		percpu_ref_put(&rel_ref);
		percpu_ref_switch_to_atomic_sync(&rel_ref);
		percpu_ref_exit(&rel_ref);
	}
	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	pthread_join(t, NULL);
	ok(__atomic_load_n(&rel_runs, __ATOMIC_RELAXED) == n &&
	   !__atomic_load_n(&rel_children_bad, __ATOMIC_RELAXED),
	   "2 (release): %d releases of synchronous switches forked (%d ran, %d children failed)",
	   n, __atomic_load_n(&rel_runs, __ATOMIC_RELAXED),
	   __atomic_load_n(&rel_children_bad, __ATOMIC_RELAXED));
	for (i = 0; i < REFS_EACH; i++) {
		percpu_ref_kill(&refs[0][i]);
		percpu_ref_exit(&refs[0][i]);
	}
	percpu_ref_kill(&other_ref);
	percpu_ref_exit(&other_ref);
}

int main(void)
{
	const char *why = fork_children_untestable();

	if (why) {
		skip("%s", why);
		return done_testing();
	}
	alarm(120);
	test_storm();
	test_release_forks();
	return done_testing();
}
