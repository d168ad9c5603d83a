/* SPDX-License-Identifier: MIT */
/*
 * Confirm callbacks that call back into their own ref (docs/percpu_ref.md,
 * "What a callback may call"), where the rules depend on whether the switch
 * is in flight:
 *  - kill of its own ref from a confirm is done at once, even after the
 *    callback made a synchronous switch of another ref (whose own finish
 *    used to forget, on return, whose confirm was running: the kill was
 *    then refused and the ref never released);
 *  - exit of its own ref from a confirm is warned and ignored, also when
 *    the confirm runs at once because the ref was atomic already (exit
 *    then went through, and kill_and_confirm's put of the initial
 *    reference read the exited ref: a crash);
 *  - a refused call changes nothing: resurrect from the ref's own
 *    confirm_kill (it used to clear DEAD and add a reference before being
 *    refused), switch_to_percpu (it cleared force_atomic) and
 *    switch_to_atomic_sync from the confirm of a switch still in flight;
 *  - a confirm run at once is not a switch in flight: from it, a switch of
 *    the same ref that another thread started meanwhile is waited for, not
 *    taken for the callback's own (switch_to_atomic_sync returned before
 *    it was folded, switch_to_percpu was refused);
 *  - a release that runs inside a confirm run at once (a kill from it, or
 *    its put of the last reference) may exit the ref: only a kill's own
 *    confirm is refused that, its put still to come;
 *  - two kills, or two resurrects, that wait for the same switch in flight
 *    check the ref's state after the wait: one of them is refused (both
 *    went through: a kill put the initial reference twice and released the
 *    ref under a user's reference, a resurrect added two).
 */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "internal.h"
#include "percpuref/percpu_ref.h"
#include "ref_mode.h"
#include "tap.h"

static struct percpu_ref a, other;
static int released;		/* atomic */
static unsigned long warnings_in_confirm;
static bool dying_in_confirm, live_in_confirm;

static void count_release(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_fetch_add(&released, 1, __ATOMIC_SEQ_CST);
}

static void sync_other_then_kill_own(struct percpu_ref *ref)
{
	percpu_ref_switch_to_atomic_sync(&other);
	percpu_ref_kill(ref);
}

/* Calls @call on its own ref from a confirm, counting the warnings. */
static void count_warnings(percpu_ref_func_t *call, struct percpu_ref *ref)
{
	unsigned long before = percpuref_warning_count();

	call(ref);
	warnings_in_confirm = percpuref_warning_count() - before;
}

static void exit_own(struct percpu_ref *ref)
{
	count_warnings(percpu_ref_exit, ref);
}

static void resurrect_own(struct percpu_ref *ref)
{
	count_warnings(percpu_ref_resurrect, ref);
	dying_in_confirm = percpu_ref_is_dying(ref);
}

static void percpu_own(struct percpu_ref *ref)
{
	count_warnings(percpu_ref_switch_to_percpu, ref);
}

static void atomic_sync_own(struct percpu_ref *ref)
{
	count_warnings(percpu_ref_switch_to_atomic_sync, ref);
	live_in_confirm = percpu_ref_tryget_live(ref);
	if (live_in_confirm)
		percpu_ref_put(ref);
}

static void test_kill_own_after_nested_sync(void)
{
	released = 0;
	ok(!percpu_ref_init(&a, count_release, 0) && !percpu_ref_init(&other, NULL, 0),
	   "nested: init");
	percpu_ref_switch_to_atomic(&a, sync_other_then_kill_own);
	is(percpu_ref_barrier(), 0, "nested: barrier");
	ok(percpu_ref_is_dying(&a), "own kill after a nested sync switch is done");
	is(__atomic_load_n(&released, __ATOMIC_SEQ_CST), 1, "and the ref is released");
	percpu_ref_exit(&a);
	percpu_ref_exit(&other);
}

static void test_exit_own_in_immediate_confirm(void)
{
	released = 0;
	warnings_in_confirm = 0;
	ok(!percpu_ref_init(&a, count_release, PERCPU_REF_INIT_ATOMIC), "exit: init atomic");
	/* Atomic already: confirm_kill runs at once, on this thread. */
	percpu_ref_kill_and_confirm(&a, exit_own);
	is(warnings_in_confirm, 1, "exit of its own ref from an immediate confirm is warned");
	is(__atomic_load_n(&released, __ATOMIC_SEQ_CST), 1,
	   "and ignored: the kill's put released the ref");
	percpu_ref_exit(&a);
}

/* A confirm_kill run at once (the ref atomic already) runs before the
 * kill's put of the initial reference, as the kernel's: the ref is not
 * released under it. */
static int released_in_confirm;

static void note_released(struct percpu_ref *ref)
{
	(void)ref;
	released_in_confirm = __atomic_load_n(&released, __ATOMIC_SEQ_CST);
}

static void test_immediate_confirm_before_put(void)
{
	released = 0;
	released_in_confirm = -1;
	ok(!percpu_ref_init(&a, count_release, PERCPU_REF_INIT_ATOMIC), "order: init atomic");
	percpu_ref_kill_and_confirm(&a, note_released);
	is(released_in_confirm, 0, "order: an immediate confirm_kill runs before the release");
	is(__atomic_load_n(&released, __ATOMIC_SEQ_CST), 1, "order: the kill's put releases it");
	percpu_ref_exit(&a);
}

static void test_refused_calls_change_nothing(void)
{
	warnings_in_confirm = 0;
	ok(!percpu_ref_init(&a, NULL, PERCPU_REF_ALLOW_REINIT), "resurrect: init");
	percpu_ref_kill_and_confirm(&a, resurrect_own);
	is(percpu_ref_barrier(), 0, "resurrect: barrier");
	is(warnings_in_confirm, 1, "resurrect of its own ref from confirm_kill is warned");
	ok(dying_in_confirm, "and leaves the ref dead");
	ok(percpu_ref_is_zero(&a), "and its count untouched (released by the kill)");
	percpu_ref_exit(&a);

	warnings_in_confirm = 0;
	ok(!percpu_ref_init(&a, NULL, PERCPU_REF_ALLOW_REINIT), "percpu: init");
	percpu_ref_switch_to_atomic(&a, percpu_own);
	is(percpu_ref_barrier(), 0, "percpu: barrier");
	is(warnings_in_confirm, 1, "switch_to_percpu of its own ref from confirm is warned");
	/* force_atomic still set: a kill and reinit comes back atomic. */
	percpu_ref_kill(&a);
	is(percpu_ref_barrier(), 0, "percpu: kill");
	percpu_ref_reinit(&a);
	ok(is_atomic(&a), "and did not undo switch_to_atomic (reinit stays atomic)");
	percpu_ref_kill(&a);
	percpu_ref_exit(&a);

	warnings_in_confirm = 0;
	live_in_confirm = false;
	ok(!percpu_ref_init(&a, NULL, PERCPU_REF_ALLOW_REINIT), "sync: init");
	percpu_ref_switch_to_atomic(&a, atomic_sync_own);
	is(percpu_ref_barrier(), 0, "sync: barrier");
	is(warnings_in_confirm, 0, "switch_to_atomic_sync of its own ref from confirm is "
	   "done at once (atomic already)");
	ok(live_in_confirm, "the ref stays live");
	percpu_ref_switch_to_percpu(&a);
	ok(!is_atomic(&a), "and goes back to per-CPU afterwards");
	percpu_ref_kill(&a);
	percpu_ref_exit(&a);
}

/* A release nested in a confirm run at once may exit its ref: nothing uses
 * the ref after switch_to_atomic's confirm (a kill's would: its put). */
static bool exited_in_release;

static void release_exits(struct percpu_ref *ref)
{
	unsigned long before = percpuref_warning_count();

	__atomic_fetch_add(&released, 1, __ATOMIC_SEQ_CST);
	percpu_ref_exit(ref);
	exited_in_release = !ref->data && percpuref_warning_count() == before;
}

static void kill_own(struct percpu_ref *ref)
{
	percpu_ref_kill(ref);
}

static void put_own(struct percpu_ref *ref)
{
	percpu_ref_put(ref);
}

static void test_release_in_at_once_confirm(void)
{
	released = 0;
	exited_in_release = false;
	ok(!percpu_ref_init(&a, release_exits, PERCPU_REF_INIT_ATOMIC), "release: init atomic");
	percpu_ref_switch_to_atomic(&a, kill_own);	/* at once; the kill too */
	ok(__atomic_load_n(&released, __ATOMIC_SEQ_CST) == 1 && exited_in_release,
	   "release: a kill from an at-once confirm releases, and the release exits the ref");
	percpu_ref_exit(&a);

	released = 0;
	exited_in_release = false;
	ok(!percpu_ref_init(&a, release_exits, 0), "release: init");
	percpu_ref_get(&a);		/* the last reference, handed to put_own */
	percpu_ref_kill(&a);
	is(percpu_ref_barrier(), 0, "release: kill");
	percpu_ref_switch_to_atomic(&a, put_own);	/* dead, so atomic: at once */
	ok(__atomic_load_n(&released, __ATOMIC_SEQ_CST) == 1 && exited_in_release,
	   "release: the last put in an at-once confirm releases, and the release exits the ref");
	percpu_ref_exit(&a);
}

static int slow_confirmed;	/* atomic */
static int confirmed_before_sync, warnings_in_at_once;

static void slow_confirm(struct percpu_ref *ref)
{
	(void)ref;
	usleep(100000);
	__atomic_store_n(&slow_confirmed, 1, __ATOMIC_SEQ_CST);
}

/* Another thread: the ref per-CPU again, then a slow switch to atomic. */
static void *start_slow_switch(void *arg)
{
	(void)arg;
	percpu_ref_switch_to_percpu(&a);
	percpu_ref_switch_to_atomic(&a, slow_confirm);
	return NULL;
}

static void at_once_meets_other_switch(struct percpu_ref *ref)
{
	unsigned long before;
	pthread_t t;

	if (pthread_create(&t, NULL, start_slow_switch, NULL))
		return;
	pthread_join(t, NULL);	/* its switch is in flight now */
	before = percpuref_warning_count();
	percpu_ref_switch_to_atomic_sync(ref);
	confirmed_before_sync = __atomic_load_n(&slow_confirmed, __ATOMIC_SEQ_CST);
	percpu_ref_switch_to_percpu(ref);
	warnings_in_at_once = (int)(percpuref_warning_count() - before);
}

static void test_at_once_confirm_waits_for_others(void)
{
	__atomic_store_n(&slow_confirmed, 0, __ATOMIC_SEQ_CST);
	confirmed_before_sync = -1;
	ok(!percpu_ref_init(&a, NULL, PERCPU_REF_INIT_ATOMIC), "at once: init atomic");
	/* Atomic already: the confirm runs at once, on this thread. */
	percpu_ref_switch_to_atomic(&a, at_once_meets_other_switch);
	is(confirmed_before_sync, 1, "at once: switch_to_atomic_sync waits for another "
	   "thread's switch of the ref");
	is(warnings_in_at_once, 0, "at once: switch_to_percpu waits too, not refused");
	ok(!is_atomic(&a), "at once: and the ref is per-CPU");
	percpu_ref_kill(&a);
	percpu_ref_exit(&a);
}

static void *kill_a(void *arg)
{
	(void)arg;
	percpu_ref_kill(&a);
	return NULL;
}

static void *resurrect_a(void *arg)
{
	(void)arg;
	percpu_ref_resurrect(&a);
	return NULL;
}

/* Two threads call @call on a while a slow switch of it is in flight. */
static unsigned long race_during_switch(void *(*call)(void *))
{
	unsigned long before = percpuref_warning_count();
	pthread_t t1, t2;
	bool two;

	usleep(20000);		/* the switch's confirm is sleeping now */
	two = !pthread_create(&t1, NULL, call, NULL);
	if (two && pthread_create(&t2, NULL, call, NULL)) {
		pthread_join(t1, NULL);
		return ULONG_MAX;
	}
	if (two) {
		pthread_join(t1, NULL);
		pthread_join(t2, NULL);
	}
	return two ? percpuref_warning_count() - before : ULONG_MAX;
}

static void test_racing_kills_and_resurrects(void)
{
	released = 0;
	ok(!percpu_ref_init(&a, count_release, PERCPU_REF_ALLOW_REINIT), "kills: init");
	percpu_ref_get(&a);	/* a user's */
	percpu_ref_switch_to_atomic(&a, slow_confirm);
	is(race_during_switch(kill_a), 1, "kills: two kills waiting for one switch, one warned");
	is(percpu_ref_barrier(), 0, "kills: barrier");
	is(__atomic_load_n(&released, __ATOMIC_SEQ_CST), 0,
	   "kills: not released while the user holds a reference");
	percpu_ref_put(&a);
	is(__atomic_load_n(&released, __ATOMIC_SEQ_CST), 1, "kills: released at the user's put");

	/* A new life, per-CPU, killed with a slow confirm: two resurrects
	 * wait for that kill's switch. */
	percpu_ref_reinit(&a);
	percpu_ref_switch_to_percpu(&a);
	released = 0;
	percpu_ref_kill_and_confirm(&a, slow_confirm);
	is(race_during_switch(resurrect_a), 1,
	   "resurrects: two waiting for one kill's switch, one warned");
	is(percpu_ref_barrier(), 0, "resurrects: barrier");
	percpu_ref_kill(&a);
	is(percpu_ref_barrier(), 0, "resurrects: kill");
	is(__atomic_load_n(&released, __ATOMIC_SEQ_CST), 2,
	   "resurrects: one reference added, so the next kill releases");
	percpu_ref_exit(&a);
}

int main(void)
{
	test_kill_own_after_nested_sync();
	test_exit_own_in_immediate_confirm();
	test_immediate_confirm_before_put();
	test_refused_calls_change_nothing();
	test_at_once_confirm_waits_for_others();
	test_release_in_at_once_confirm();
	test_racing_kills_and_resurrects();
	return done_testing();
}
