/* SPDX-License-Identifier: MIT */
/*
 * test_kref.c - kref.h: counting, release exactly once, and the refcount_t
 * saturation rules (get from zero, overflow, put below zero), each reported
 * once by a stderr line naming the function and the object, each leaving
 * the object leaked rather than released twice.  Ends with concurrent
 * get/put and a concurrent last put, checking that @release runs once and
 * sees every thread's writes (the release/acquire pairing in kref_put()).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <percpuref/kref.h>

#include "internal.h"
#include "capture.h"
#include "tap.h"

static int released;

static void count_release(struct kref *kref)
{
	(void)kref;
	released++;
}

static void do_get(void *kref)
{
	kref_get(kref);
}

static void do_put(void *kref)
{
	kref_put(kref, count_release);
}

static void test_counting(void)
{
	struct kref k;

	kref_init(&k);
	is(kref_read(&k), 1, "kref_init sets the count to one");
	kref_get(&k);
	kref_get(&k);
	is(kref_read(&k), 3, "kref_get adds one each");
	released = 0;
	is(kref_put(&k, count_release), 0, "a put that leaves references returns 0");
	is(kref_put(&k, count_release), 0, "again");
	is(released, 0, "no release while references remain");
	is(kref_put(&k, count_release), 1, "the last put returns 1");
	is(released, 1, "and called release once");
	is(kref_read(&k), 0, "the count is zero");
}

static void test_get_unless_zero(void)
{
	struct kref k = KREF_INIT(1);
	unsigned long warnings = percpuref_warning_count();

	ok(kref_get_unless_zero(&k), "get_unless_zero succeeds on a live count");
	is(kref_read(&k), 2, "and took a reference");
	kref_put(&k, count_release);
	released = 0;
	kref_put(&k, count_release);
	ok(!kref_get_unless_zero(&k), "get_unless_zero fails on a released count");
	is(kref_read(&k), 0, "and left it at zero");
	is(released, 1, "nothing released twice");
	is(percpuref_warning_count(), warnings, "failing on zero is not misuse");
}

static void test_get_from_zero(void)
{
	struct kref k = KREF_INIT(0);
	unsigned long warnings = percpuref_warning_count();
	char msg[512], ptr[32];

	capture_stderr(do_get, &k, msg, sizeof(msg));
	snprintf(ptr, sizeof(ptr), "%p", (void *)&k);
	is(percpuref_warning_count(), warnings + 1, "kref_get on zero warns");
	ok(strstr(msg, "kref_get") && strstr(msg, ptr), "naming the function and the kref: %.*s",
	   (int)strcspn(msg, "\n"), msg);
	is(strchr(msg, '\n') - msg + 1, (long)strlen(msg), "on one line");
	ok(strstr(msg, "get on released"), "as a get on a released kref");
	is(kref_read(&k), KREF_SATURATED, "and pins the count at KREF_SATURATED");

	released = 0;
	for (int i = 0; i < 1000; i++)
		kref_put(&k, count_release);
	kref_get(&k);
	ok(kref_get_unless_zero(&k), "get_unless_zero succeeds on a saturated count");
	is(released, 0, "puts on a saturated count never release");
	is(kref_read(&k), KREF_SATURATED, "each operation re-pins it");
	is(percpuref_warning_count(), warnings + 1, "and the object warned only once");
}

static void test_overflow(void)
{
	struct kref a = KREF_INIT(KREF_MAX), b = KREF_INIT(KREF_MAX);
	unsigned long warnings = percpuref_warning_count();
	char msg[512];

	capture_stderr(do_get, &a, msg, sizeof(msg));
	is(percpuref_warning_count(), warnings + 1, "kref_get past KREF_MAX warns");
	ok(strstr(msg, "kref_get") && strstr(msg, "overflow"), "as an overflow: %.*s",
	   (int)strcspn(msg, "\n"), msg);
	is(kref_read(&a), KREF_SATURATED, "and saturates");

	ok(kref_get_unless_zero(&b), "get_unless_zero at KREF_MAX succeeds");
	is(percpuref_warning_count(), warnings + 2, "warns");
	is(kref_read(&b), KREF_SATURATED, "and saturates");

	/* KREF_MAX is the last live count, not misuse: a put from it counts. */
	struct kref c = KREF_INIT(KREF_MAX);

	is(kref_put(&c, count_release), 0, "a put from KREF_MAX returns 0");
	is(kref_read(&c), KREF_MAX - 1, "and takes one off");
	is(percpuref_warning_count(), warnings + 2, "unwarned");
}

static void test_put_below_zero(void)
{
	struct kref k = KREF_INIT(1);
	unsigned long warnings;
	char msg[512];

	released = 0;
	kref_put(&k, count_release);
	warnings = percpuref_warning_count();
	capture_stderr(do_put, &k, msg, sizeof(msg));
	is(percpuref_warning_count(), warnings + 1, "a put on a released kref warns");
	ok(strstr(msg, "kref_put"), "naming kref_put: %.*s", (int)strcspn(msg, "\n"), msg);
	ok(strstr(msg, "put on released"), "as a put on a released kref, not a get");
	is(kref_read(&k), KREF_SATURATED, "and saturates");
	kref_put(&k, count_release);
	is(released, 1, "release ran once, never again");
	is(percpuref_warning_count(), warnings + 1, "the second bad put is silent");
}

/* Concurrent part: NTHREADS threads on one kref. */
enum { NTHREADS = 4, PAIRS = 100000 };

static struct kref shared;
static int written[NTHREADS];
static int release_calls, release_saw_all;
static pthread_barrier_t barrier;

static void check_release(struct kref *kref)
{
	int all = 1;

	(void)kref;
	/*
	 * Relaxed loads: only the release/acquire pairing in kref_put()
	 * guarantees they see the putters' relaxed stores.
	 */
	for (int i = 0; i < NTHREADS; i++)
		all &= __atomic_load_n(&written[i], __ATOMIC_RELAXED);
	release_saw_all = all;
	__atomic_fetch_add(&release_calls, 1, __ATOMIC_RELAXED);
}

static void *pairs_thread(void *arg)
{
	(void)arg;
	pthread_barrier_wait(&barrier);
	for (int i = 0; i < PAIRS; i++) {
		kref_get(&shared);
		kref_put(&shared, check_release);
	}
	return NULL;
}

static void *last_put_thread(void *arg)
{
	int id = (int)(long)arg;

	pthread_barrier_wait(&barrier);
	__atomic_store_n(&written[id], 1, __ATOMIC_RELAXED);
	kref_put(&shared, check_release);
	return NULL;
}

static void run_threads(void *(*fn)(void *))
{
	pthread_t tids[NTHREADS];

	pthread_barrier_init(&barrier, NULL, NTHREADS);
	for (long i = 0; i < NTHREADS; i++)
		pthread_create(&tids[i], NULL, fn, (void *)i);
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(tids[i], NULL);
	pthread_barrier_destroy(&barrier);
}

static void test_concurrent(void)
{
	kref_init(&shared);
	run_threads(pairs_thread);
	is(kref_read(&shared), 1, "%d threads x %d get/put pairs leave the count at 1",
	   NTHREADS, PAIRS);
	is(release_calls, 0, "without releasing");

	for (int round = 0; round < 200; round++) {
		__atomic_store_n(&shared.refcount, NTHREADS, __ATOMIC_RELAXED);
		memset(written, 0, sizeof(written));
		release_calls = release_saw_all = 0;
		run_threads(last_put_thread);
		if (release_calls != 1 || !release_saw_all)
			break;
	}
	is(release_calls, 1, "racing last puts: release runs exactly once (200 rounds)");
	ok(release_saw_all, "and sees every putter's writes");
}

int main(void)
{
	test_counting();
	test_get_unless_zero();
	test_get_from_zero();
	test_overflow();
	test_put_below_zero();
	test_concurrent();
	return done_testing();
}
