/* SPDX-License-Identifier: MIT */
/*
 * test_rcuref.c - rcuref.h: the biased count, each zone (valid, saturation,
 * dead), the revive race of the last put (replayed step by step through the
 * slow path), misuse reports, and two concurrent tests: get/put pairs on a
 * live ref, and rounds where every thread races its last put against
 * revivals, checking that exactly one put per round returns true and that
 * no get succeeds afterwards.  Objects are freed after
 * urcu_bp_synchronize_rcu(), the flavour rcuref_put() protects against (not
 * with call_rcu: its worker thread would outlive the test and show up in
 * valgrind's leak report).
 */
#include <pthread.h>
#include <stdlib.h>
#include <urcu/urcu-bp.h>

#include <percpuref/rcuref.h>

#include "internal.h"
#include "tap.h"

static unsigned int raw(rcuref_t *ref)
{
	return __atomic_load_n(&ref->refcnt, __ATOMIC_RELAXED);
}

static void test_counting(void)
{
	rcuref_t r;

	rcuref_init(&r, 1);
	is(raw(&r), RCUREF_ONEREF, "one reference is stored as 0 (biased by -1)");
	is(rcuref_read(&r), 1, "rcuref_read undoes the bias");
	ok(rcuref_get(&r), "get on a live ref succeeds");
	ok(rcuref_get(&r), "again");
	is(rcuref_read(&r), 3, "three references");
	ok(!rcuref_put(&r), "a put that leaves references returns false");
	ok(!rcuref_put(&r), "again");
	ok(rcuref_put(&r), "the last put returns true");
	is(raw(&r), RCUREF_DEAD, "and marks the count DEAD");
	is(rcuref_read(&r), 0, "rcuref_read of a dead ref is 0");

	rcuref_init(&r, 5);
	is(rcuref_read(&r), 5, "rcuref_init(5)");
}

static void test_dead(void)
{
	rcuref_t r = RCUREF_INIT(1);
	unsigned long warnings;

	ok(rcuref_put(&r), "last put");
	warnings = percpuref_warning_count();
	ok(!rcuref_get(&r), "get on a dead ref fails");
	is(raw(&r), RCUREF_DEAD, "and resets the count to DEAD");
	is(percpuref_warning_count(), warnings, "a failing get is not misuse");

	ok(!rcuref_put(&r), "an imbalanced put on a dead ref returns false");
	is(raw(&r), RCUREF_DEAD, "and leaves it DEAD");
	is(percpuref_warning_count(), warnings + 1, "and warns");
	ok(!rcuref_put(&r), "a second one returns false too");
	is(percpuref_warning_count(), warnings + 1, "warned once");

	/* Gets racing with the dead marker land anywhere in the zone. */
	__atomic_store_n(&r.refcnt, RCUREF_RELEASED, __ATOMIC_RELAXED);
	ok(!rcuref_get(&r), "a get at the bottom of the dead zone fails");
	is(raw(&r), RCUREF_DEAD, "and re-centres the count");

	/* RCUREF_RELEASED itself is dead, whichever way a count lands on it. */
	__atomic_store_n(&r.refcnt, RCUREF_RELEASED, __ATOMIC_RELAXED);
	is(rcuref_read(&r), 0, "rcuref_read at RCUREF_RELEASED is 0");
	__atomic_store_n(&r.refcnt, RCUREF_RELEASED - 1, __ATOMIC_RELAXED);
	ok(!rcuref_get(&r), "a get that lands on RCUREF_RELEASED fails");
	is(raw(&r), RCUREF_DEAD, "and re-centres the count");
	__atomic_store_n(&r.refcnt, RCUREF_RELEASED + 1, __ATOMIC_RELAXED);
	ok(!rcuref_put(&r), "a put that lands on RCUREF_RELEASED does not release");
	is(raw(&r), RCUREF_DEAD, "and keeps the count dead, not saturated");
	ok(!rcuref_get(&r), "so a later get still fails");
}

static void test_saturation(void)
{
	rcuref_t r = RCUREF_INIT(RCUREF_MAXREF + 1);
	unsigned long warnings = percpuref_warning_count();

	is(raw(&r), RCUREF_MAXREF, "INT_MAX + 1 references: RCUREF_MAXREF");
	ok(rcuref_get(&r), "the get that crosses RCUREF_MAXREF succeeds");
	is(raw(&r), RCUREF_SATURATED, "pins the count at RCUREF_SATURATED");
	is(percpuref_warning_count(), warnings + 1, "and warns");
	ok(rcuref_get(&r), "gets on a saturated ref succeed");
	is(raw(&r), RCUREF_SATURATED, "and re-pin it");
	for (int i = 0; i < 1000; i++)
		if (rcuref_put(&r))
			break;
	is(raw(&r), RCUREF_SATURATED, "1000 puts: still pinned");
	ok(rcuref_read(&r) > RCUREF_MAXREF, "rcuref_read shows it saturated");
	is(percpuref_warning_count(), warnings + 1, "warned once for the object");

	/* The saturation zone's lower edge, reached by puts. */
	__atomic_store_n(&r.refcnt, RCUREF_MAXREF + 2, __ATOMIC_RELAXED);
	ok(!rcuref_put(&r), "a put just inside the saturation zone does not release");
	is(raw(&r), RCUREF_SATURATED, "and re-pins");
}

/*
 * The kernel's "possible critical states" table, one step at a time: T2's
 * fast path has decremented to NOREF and is about to cmpxchg; T1 revives
 * the ref and drops it again.  Exactly one of them may release.
 */
static void test_revive_race(void)
{
	rcuref_t r = RCUREF_INIT(2);
	unsigned int t2_cnt;

	ok(!rcuref_put(&r), "T1 put: one reference left");
	t2_cnt = __atomic_sub_fetch(&r.refcnt, 1, __ATOMIC_RELEASE);
	is(t2_cnt, RCUREF_NOREF, "T2 put's decrement reaches NOREF");
	ok(rcuref_get(&r), "T1 get revives the ref before T2's cmpxchg");
	ok(!rcuref_put_slowpath(&r, t2_cnt), "T2's cmpxchg fails: T2 must not release");
	is(raw(&r), RCUREF_ONEREF, "T1's reference is intact");
	ok(rcuref_put(&r), "T1's put releases");
	ok(!rcuref_get(&r), "and the ref stays dead");

	/* Same start, but T1's put marks it dead first. */
	rcuref_init(&r, 1);
	t2_cnt = __atomic_sub_fetch(&r.refcnt, 1, __ATOMIC_RELEASE);
	ok(rcuref_get(&r), "T1 revives");
	ok(rcuref_put(&r), "T1's put marks it dead");
	ok(!rcuref_put_slowpath(&r, t2_cnt), "T2's late cmpxchg fails");
	is(raw(&r), RCUREF_DEAD, "the count stays DEAD");
}

static void test_rcusafe(void)
{
	rcuref_t r = RCUREF_INIT(1);
	bool released;

	urcu_bp_read_lock();
	ok(rcuref_get(&r), "get inside a read-side section");
	ok(!rcuref_put_rcusafe(&r), "rcuref_put_rcusafe drops it");
	released = rcuref_put_rcusafe(&r);
	urcu_bp_read_unlock();
	ok(released, "and the last one returns true");
}

/* Concurrent part. */
enum { NTHREADS = 4, PAIRS = 100000, ROUNDS = 300, REVIVALS = 50 };

struct object {
	rcuref_t ref;
};

static struct object *current_obj;
static int releases, late_gets;
static pthread_barrier_t barrier;

/* The releasing put only counts; the owner frees after a grace period. */
static void put_object(struct object *obj)
{
	if (rcuref_put(&obj->ref))
		__atomic_fetch_add(&releases, 1, __ATOMIC_RELAXED);
}

static void *pairs_thread(void *arg)
{
	struct object *obj = arg;

	pthread_barrier_wait(&barrier);
	for (int i = 0; i < PAIRS; i++) {
		if (rcuref_get(&obj->ref))
			put_object(obj);
	}
	return NULL;
}

/*
 * Each round every thread owns one reference to a fresh object, revives and
 * drops extra references a few times, then drops its own; after a barrier
 * it tries one more get, which must fail.  The owner frees the object only
 * after the last barrier of the round.
 */
static void *race_thread(void *arg)
{
	(void)arg;
	for (int round = 0; round < ROUNDS; round++) {
		struct object *obj;

		pthread_barrier_wait(&barrier);
		obj = __atomic_load_n(&current_obj, __ATOMIC_ACQUIRE);
		for (int i = 0; i < REVIVALS; i++) {
			if (rcuref_get(&obj->ref))
				put_object(obj);
		}
		put_object(obj);
		pthread_barrier_wait(&barrier);
		/* Every reference is gone: a get can only fail now. */
		if (rcuref_get(&obj->ref))
			__atomic_fetch_add(&late_gets, 1, __ATOMIC_RELAXED);
		pthread_barrier_wait(&barrier);
	}
	return NULL;
}

static void test_concurrent(void)
{
	pthread_t tids[NTHREADS];
	struct object *obj = malloc(sizeof(*obj));
	int bad_rounds = 0;

	rcuref_init(&obj->ref, 1);
	pthread_barrier_init(&barrier, NULL, NTHREADS);
	for (int i = 0; i < NTHREADS; i++)
		pthread_create(&tids[i], NULL, pairs_thread, obj);
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(tids[i], NULL);
	pthread_barrier_destroy(&barrier);
	is(rcuref_read(&obj->ref), 1, "%d threads x %d get/put pairs leave one reference",
	   NTHREADS, PAIRS);
	is(releases, 0, "and released nothing");
	put_object(obj);
	is(releases, 1, "the owner's put releases");
	urcu_bp_synchronize_rcu();
	free(obj);

	pthread_barrier_init(&barrier, NULL, NTHREADS + 1);
	for (int i = 0; i < NTHREADS; i++)
		pthread_create(&tids[i], NULL, race_thread, NULL);
	for (int round = 0; round < ROUNDS; round++) {
		obj = malloc(sizeof(*obj));
		rcuref_init(&obj->ref, NTHREADS);
		releases = 0;
		/* Release: publishes the initialised count with the pointer. */
		__atomic_store_n(&current_obj, obj, __ATOMIC_RELEASE);
		pthread_barrier_wait(&barrier);
		pthread_barrier_wait(&barrier);
		pthread_barrier_wait(&barrier);
		if (releases != 1)
			bad_rounds++;
		/* Every thread is done with it: the late gets ran before. */
		urcu_bp_synchronize_rcu();
		free(obj);
	}
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(tids[i], NULL);
	pthread_barrier_destroy(&barrier);
	is(bad_rounds, 0, "%d rounds of racing last puts: exactly one release each", ROUNDS);
	is(late_gets, 0, "no get succeeds after the last put");
}

int main(void)
{
	test_counting();
	test_dead();
	test_saturation();
	test_revive_race();
	test_rcusafe();
	test_concurrent();
	return done_testing();
}
