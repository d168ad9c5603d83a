/* SPDX-License-Identifier: MIT */
/*
 * Callback audit: every kind of callback makes every call that
 * docs/percpu_ref.md and docs/managed.md allow it, and the calls they refuse
 * are refused (-EDEADLK and a warning), never a hang.  Kinds:
 *   release on the putter's thread, release on the callback thread (kill),
 *   confirm on the callback thread, a managed ref's release on the reclaimer,
 *   @unpublish, the RCU-deferred @release, and a release run by
 *   percpuref_shutdown() on the caller's thread.
 * What the callbacks started (a managed ref, a percpu_rcuref) must complete
 * afterwards: released exactly once.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_rcuref.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

enum kind { USER_RELEASE, CB_RELEASE, CB_CONFIRM, MANAGED_RELEASE, UNPUBLISH, RCU_RELEASE,
	    SHUTDOWN_RELEASE, NR_KINDS };
static const char *const kind_name[] = { "release (putter's thread)", "release (callback thread)",
					 "confirm", "managed release (reclaimer)", "unpublish",
					 "RCU-deferred release", "release (shutdown)" };

static struct percpu_ref other;	/* live, per-CPU, ALLOW_REINIT: the test's */
static int failed[NR_KINDS], ran[NR_KINDS];	/* atomic */
static int spawned_releases;			/* atomic */
static int released_unconfirmed;		/* atomic */

static void fail(enum kind k, const char *what)
{
	printf("# %s: %s\n", kind_name[k], what);
	__atomic_fetch_add(&failed[k], 1, __ATOMIC_RELAXED);
}

static void spawned_release(struct percpu_ref *ref)
{
	percpu_ref_exit(ref);
	free(ref);
	__atomic_fetch_add(&spawned_releases, 1, __ATOMIC_RELEASE);
}

/* A ref switched to atomic asynchronously: its confirm, then its release. */
struct switched_ref {
	struct percpu_ref ref;
	bool confirmed;		/* written before the switch's put */
};

static void switched_confirm(struct percpu_ref *ref)
{
	((struct switched_ref *)ref)->confirmed = true;
}

static void switched_release(struct percpu_ref *ref)
{
	if (!((struct switched_ref *)ref)->confirmed)
		__atomic_fetch_add(&released_unconfirmed, 1, __ATOMIC_RELAXED);
	spawned_release(ref);
}

static void spawned_rcu_release(struct percpu_rcuref *ref)
{
	percpu_rcuref_exit(ref);
	free(ref);
	__atomic_fetch_add(&spawned_releases, 1, __ATOMIC_RELEASE);
}

/*
 * The calls every callback may make.  The waits are refused on a library
 * thread and under a batch lock (shutdown's callbacks); @on_library: where
 * this kind must run (a release or unpublish after a kill runs wherever the
 * last put happened, which may be either).
 */
static void allowed_calls(enum kind k, int on_library)
{
	bool refused = percpuref_on_library_thread() || percpuref_holds_batch_lock();
	unsigned long warned = percpuref_warning_count();
	int want = refused ? -EDEADLK : 0, released = 0;

	if (on_library >= 0 && refused != on_library)
		fail(k, "ran on an unexpected thread");
	struct percpu_rcuref *rcu, kept;
	struct percpu_ref *m, *u, fresh;
	struct switched_ref *sw;

	/* get, tryget, put on a live ref. */
	percpu_ref_get(&other);
	if (!percpu_ref_tryget(&other) || !percpu_ref_tryget_live(&other))
		fail(k, "tryget on a live ref failed");
	percpu_ref_put_many(&other, 3);

	/* Synchronous switches of another ref, there and back. */
	percpu_ref_switch_to_atomic_sync(&other);
	percpu_ref_switch_to_percpu(&other);

	/* A new ref: init, use, kill with a reference held and resurrect,
	 * kill (atomic: released at once), reinit, kill again, exit. */
	if (percpu_ref_init(&fresh, NULL, PERCPU_REF_INIT_ATOMIC)) {
		fail(k, "init failed");
	} else {
		percpu_ref_get(&fresh);
		percpu_ref_kill(&fresh);
		percpu_ref_resurrect(&fresh);
		if (percpu_ref_is_dying(&fresh))
			fail(k, "resurrect left the ref dead");
		percpu_ref_put(&fresh);
		percpu_ref_kill(&fresh);
		released = percpu_ref_is_zero(&fresh);
		percpu_ref_reinit(&fresh);
		if (percpu_ref_is_zero(&fresh) || percpu_ref_is_dying(&fresh))
			fail(k, "reinit left the ref dead");
		percpu_ref_kill(&fresh);
		released &= percpu_ref_is_zero(&fresh);
		percpu_ref_exit(&fresh);
		if (!released)
			fail(k, "a killed atomic ref did not reach zero");
	}

	/* A new ref managed and unmanaged again, then killed from per-CPU
	 * mode (an asynchronous switch) and released by its own callback,
	 * whose exit leaves the node to the reclaimer: another ref's node
	 * goes on top of it on this CPU's stage, so that the unmanage does
	 * not take it back (test_managed.c, test_unstage), unless this
	 * thread moved to another CPU in between. */
	u = calloc(1, sizeof(*u));
	if (!u || percpu_ref_init(u, spawned_release, PERCPU_REF_ALLOW_REINIT)) {
		fail(k, "init of the unmanaged ref failed");
		free(u);
	} else {
		struct percpu_ref above;

		if (percpu_ref_init(&above, NULL, PERCPU_REF_ALLOW_REINIT)) {
			fail(k, "init of the ref above failed");
			percpu_ref_exit(u);
			free(u);
		} else {
			if (percpu_ref_switch_to_managed(u) ||
			    percpu_ref_switch_to_managed(&above) ||
			    percpu_ref_switch_to_unmanaged(u))
				fail(k, "switch_to_managed / _unmanaged failed");
			percpu_ref_kill(u);
			percpu_ref_exit(&above);	/* a live managed ref */
		}
	}

	/* A new ref switched to atomic asynchronously, never waited for, and
	 * its initial reference dropped at once: the switch confirms on the
	 * callback thread, and the ref is released after that, by the switch
	 * or by the put, whichever comes last. */
	sw = calloc(1, sizeof(*sw));
	if (!sw || percpu_ref_init(&sw->ref, switched_release, 0)) {
		fail(k, "init of the switched ref failed");
		free(sw);
	} else {
		percpu_ref_switch_to_atomic(&sw->ref, switched_confirm);
		percpu_ref_put(&sw->ref);
	}

	/* A new managed ref, left to the reclaimer. */
	m = calloc(1, sizeof(*m));
	if (!m || percpu_ref_init(m, spawned_release, PERCPU_REF_INIT_ATOMIC)) {
		fail(k, "managed init failed");
		free(m);
	} else {
		if (percpu_ref_switch_to_managed(m))
			fail(k, "switch_to_managed failed");
		percpu_ref_put(m);
	}

	/* RCU: a read-side section, and a new percpu_rcuref killed. */
	percpu_rcuref_read_lock();
	percpu_rcuref_read_unlock();
	if (percpu_rcuref_init(&kept, NULL, spawned_rcu_release, 0))
		fail(k, "rcuref init failed");
	else
		percpu_rcuref_exit(&kept);	/* never reached zero */
	rcu = calloc(1, sizeof(*rcu));
	if (!rcu || percpu_rcuref_init(rcu, NULL, spawned_rcu_release, PERCPU_REF_INIT_ATOMIC)) {
		fail(k, "rcuref init failed");
		free(rcu);
	} else {
		percpu_rcuref_kill(rcu);
	}

	if (percpuref_warning_count() != warned)
		fail(k, "an allowed call warned");
	/* The waits: refused on a library thread or under a batch lock. */
	if (percpu_ref_barrier() != want || percpu_rcuref_barrier() != want ||
	    percpu_ref_managed_flush() != want)
		fail(k, "barrier / flush: wrong answer");
	if (refused && percpuref_warning_count() - warned != 3)
		fail(k, "the refusals were not warned");
	__atomic_fetch_add(&ran[k], 1, __ATOMIC_RELEASE);
}

static void user_release(struct percpu_ref *ref)
{
	(void)ref;
	allowed_calls(USER_RELEASE, 0);
}

static void cb_release(struct percpu_ref *ref)
{
	(void)ref;
	allowed_calls(CB_RELEASE, -1);
}

static void cb_confirm(struct percpu_ref *ref)
{
	(void)ref;
	allowed_calls(CB_CONFIRM, 1);
}

static void managed_release(struct percpu_ref *ref)
{
	(void)ref;
	allowed_calls(MANAGED_RELEASE, 1);
}

static void shutdown_release(struct percpu_ref *ref)
{
	(void)ref;
	allowed_calls(SHUTDOWN_RELEASE, 1);
}

static void rcu_unpublish(struct percpu_rcuref *ref)
{
	(void)ref;
	allowed_calls(UNPUBLISH, -1);
}

static void rcu_release(struct percpu_rcuref *ref)
{
	(void)ref;
	allowed_calls(RCU_RELEASE, 1);
}

/*
 * A call that would wait for a switch the callback thread has yet to finish
 * (here: exit of a ref killed after ours, queued behind us) is refused from
 * a callback on that thread, warned, rather than waiting for itself.
 */
static struct percpu_ref queued_behind;
static int queued, exit_answered;	/* atomic */

/* A confirm callback: always on the callback thread for a kill of a
 * per-CPU ref (a release might run on the killer's own thread). */
static void exit_queued_confirm(struct percpu_ref *ref)
{
	(void)ref;
	/* Until the other kill is queued behind this callback's batch. */
	while (!__atomic_load_n(&queued, __ATOMIC_ACQUIRE))
		sched_yield();
	percpu_ref_exit(&queued_behind);
	__atomic_store_n(&exit_answered, 1, __ATOMIC_RELEASE);
}

static void test_wait_for_own_thread(void)
{
	unsigned long warned = percpuref_warning_count();
	struct percpu_ref a;

	percpu_ref_init(&a, NULL, 0);
	percpu_ref_init(&queued_behind, NULL, 0);
	percpu_ref_kill_and_confirm(&a, exit_queued_confirm);
	percpu_ref_kill(&queued_behind);
	__atomic_store_n(&queued, 1, __ATOMIC_RELEASE);
	percpu_ref_barrier();
	ok(__atomic_load_n(&exit_answered, __ATOMIC_ACQUIRE),
	   "exit of a ref whose switch is queued behind the callback: answered, no hang");
	is(percpuref_warning_count() - warned, 1, "and warned (refused)");
	ok(queued_behind.data && percpu_ref_is_zero(&queued_behind),
	   "the ref was left alone and finished its switch");
	percpu_ref_exit(&queued_behind);
	percpu_ref_exit(&a);
}

static void settle(void)
{
	int i;

	/* What the callbacks started may start more: a few rounds. */
	for (i = 0; i < 3; i++) {
		percpu_ref_barrier();
		percpu_rcuref_barrier();
		percpu_ref_managed_flush();
	}
}

static int spawned(void)
{
	return __atomic_load_n(&spawned_releases, __ATOMIC_ACQUIRE);
}

/* Refs a run of allowed_calls() leaves to be released: a managed ref, an
 * unmanaged one killed, one switched to atomic, a percpu_rcuref killed. */
#define MADE_PER_RUN 4

/* @k ran once, cleanly, and what callbacks made since @before
 * (MADE_PER_RUN per callback run) were released. */
static void check(enum kind k, int before, int made)
{
	settle();
	is(__atomic_load_n(&ran[k], __ATOMIC_ACQUIRE), 1, "%s ran once", kind_name[k]);
	is(__atomic_load_n(&failed[k], __ATOMIC_RELAXED), 0,
	   "%s: every allowed call worked, the waits answered right", kind_name[k]);
	is(spawned() - before, made, "%s: the refs and rcurefs made were released",
	   kind_name[k]);
	is(__atomic_load_n(&released_unconfirmed, __ATOMIC_RELAXED), 0,
	   "%s: the refs switched asynchronously were confirmed before their release",
	   kind_name[k]);
}

static void set_interval(unsigned long interval_ms)
{
	struct percpu_ref_managed_config c = { interval_ms, PERCPU_REF_MANAGED_MAX_PER_SCAN,
					       PERCPU_REF_SCAN_BATCHED };

	percpu_ref_managed_set_config(&c);
}

int main(void)
{
	struct percpu_rcuref r1;
	struct percpu_ref a;
	int before;

	percpu_ref_init(&other, NULL, PERCPU_REF_ALLOW_REINIT);

	before = spawned();
	percpu_ref_init(&a, user_release, PERCPU_REF_INIT_ATOMIC);
	percpu_ref_put(&a);
	check(USER_RELEASE, before, MADE_PER_RUN);
	percpu_ref_exit(&a);

	before = spawned();
	percpu_ref_init(&a, cb_release, 0);
	percpu_ref_kill(&a);
	check(CB_RELEASE, before, MADE_PER_RUN);
	percpu_ref_exit(&a);

	before = spawned();
	percpu_ref_init(&a, NULL, 0);
	percpu_ref_switch_to_atomic(&a, cb_confirm);
	check(CB_CONFIRM, before, MADE_PER_RUN);
	percpu_ref_exit(&a);

	before = spawned();
	percpu_ref_init(&a, managed_release, PERCPU_REF_INIT_ATOMIC);
	percpu_ref_switch_to_managed(&a);
	percpu_ref_put(&a);
	check(MANAGED_RELEASE, before, MADE_PER_RUN);
	percpu_ref_exit(&a);

	before = spawned();
	percpu_rcuref_init(&r1, rcu_unpublish, rcu_release, 0);
	percpu_rcuref_kill(&r1);
	check(UNPUBLISH, before, 2 * MADE_PER_RUN);	/* the RCU release's included */
	check(RCU_RELEASE, before, 2 * MADE_PER_RUN);
	percpu_rcuref_exit(&r1);

	/* No scan before shutdown's own: the release runs on this thread. */
	set_interval(PERCPU_REF_MANAGED_INTERVAL_MAX_MS);
	before = spawned();
	percpu_ref_init(&a, shutdown_release, PERCPU_REF_INIT_ATOMIC);
	percpu_ref_switch_to_managed(&a);
	percpu_ref_put(&a);
	percpuref_shutdown();
	check(SHUTDOWN_RELEASE, before, MADE_PER_RUN);
	set_interval(PERCPU_REF_MANAGED_INTERVAL_MS);
	percpu_ref_exit(&a);

	test_wait_for_own_thread();

	percpu_ref_kill(&other);
	percpu_ref_barrier();
	percpu_ref_exit(&other);
	return done_testing();
}
