/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of <percpuref/percpu_rcuref.h>: @unpublish at zero, @release
 * only after every read-side section that began before it has ended,
 * tryget failing from zero on, managed mode, and misuse of init.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_rcuref.h"
#include "tap.h"

struct object {
	struct percpu_rcuref ref;
	int unpublished, released;	/* atomic: set on other threads */
};

static void obj_unpublish(struct percpu_rcuref *ref)
{
	struct object *o = caa_container_of(ref, struct object, ref);

	__atomic_store_n(&o->unpublished, 1, __ATOMIC_RELEASE);
}

static void obj_release(struct percpu_rcuref *ref)
{
	struct object *o = caa_container_of(ref, struct object, ref);

	/* Unpublished first, then released: checked from the test thread. */
	if (!__atomic_load_n(&o->unpublished, __ATOMIC_ACQUIRE))
		abort();
	__atomic_fetch_add(&o->released, 1, __ATOMIC_RELEASE);
}

static void plain_release(struct percpu_rcuref *ref)
{
	struct object *o = caa_container_of(ref, struct object, ref);

	__atomic_fetch_add(&o->released, 1, __ATOMIC_RELEASE);
}

static int released(struct object *o)
{
	return __atomic_load_n(&o->released, __ATOMIC_ACQUIRE);
}

static int reader_state;	/* 1: in a read-side section; 2: may leave */

static void *reader(void *arg)
{
	(void)arg;
	percpu_rcuref_read_lock();
	__atomic_store_n(&reader_state, 1, __ATOMIC_SEQ_CST);
	while (__atomic_load_n(&reader_state, __ATOMIC_SEQ_CST) != 2)
		usleep(1000);
	percpu_rcuref_read_unlock();
	return NULL;
}

static void test_kill_waits_for_readers(void)
{
	struct object o = { 0 };
	pthread_t t;

	is(percpu_rcuref_init(&o.ref, obj_unpublish, obj_release, 0), 0, "init: 0");
	percpu_rcuref_get(&o.ref);
	ok(percpu_rcuref_tryget(&o.ref), "tryget on a live ref");
	percpu_rcuref_put(&o.ref);
	percpu_rcuref_kill(&o.ref);
	/* The kill's switch finished before the reader starts: on the
	 * fallback path the switch's fence is a grace period, which would
	 * wait for the reader too. */
	percpu_ref_barrier();
	ok(__atomic_load_n(&o.unpublished, __ATOMIC_ACQUIRE) == 0, "still referenced: not unpublished");
	pthread_create(&t, NULL, reader, NULL);
	while (!__atomic_load_n(&reader_state, __ATOMIC_SEQ_CST))
		usleep(1000);
	percpu_rcuref_put(&o.ref);	/* the last: unpublish at once */
	ok(__atomic_load_n(&o.unpublished, __ATOMIC_ACQUIRE), "last put unpublished it at once");
	ok(!percpu_rcuref_tryget(&o.ref), "tryget fails from zero on");
	usleep(50000);
	is(released(&o), 0, "release waits for a reader that began before");
	__atomic_store_n(&reader_state, 2, __ATOMIC_SEQ_CST);
	pthread_join(t, NULL);
	is(percpu_rcuref_barrier(), 0, "barrier: 0");
	is(released(&o), 1, "released once the reader left");
	percpu_rcuref_exit(&o.ref);
}

static void test_managed(void)
{
	struct object o = { 0 };

	percpu_rcuref_init(&o.ref, obj_unpublish, obj_release, PERCPU_REF_ALLOW_REINIT);
	is(percpu_rcuref_switch_to_managed(&o.ref), 0, "switch_to_managed: 0");
	percpu_ref_managed_flush();
	is(released(&o), 0, "managed, referenced: kept");
	percpu_rcuref_put(&o.ref);
	percpu_ref_managed_flush();
	ok(__atomic_load_n(&o.unpublished, __ATOMIC_ACQUIRE) && released(&o) == 1,
	   "managed: unpublished and released by the time flush returns");
	percpu_rcuref_exit(&o.ref);

	percpu_rcuref_init(&o.ref, obj_unpublish, obj_release, PERCPU_REF_ALLOW_REINIT);
	percpu_rcuref_switch_to_managed(&o.ref);
	is(percpu_rcuref_switch_to_unmanaged(&o.ref), 0, "switch_to_unmanaged: 0");
	percpu_rcuref_exit(&o.ref);

	/* PERCPU_REF_REL_MANAGED at init: managed with the creator's
	 * reference and the manager's. */
	memset(&o, 0, sizeof(o));
	is(percpu_rcuref_init(&o.ref, obj_unpublish, obj_release, PERCPU_REF_REL_MANAGED), 0,
	   "init with REL_MANAGED: 0");
	percpu_ref_managed_flush();
	is(released(&o), 0, "REL_MANAGED: the creator's reference keeps it");
	percpu_rcuref_put(&o.ref);
	percpu_ref_managed_flush();
	ok(__atomic_load_n(&o.unpublished, __ATOMIC_ACQUIRE) && released(&o) == 1,
	   "REL_MANAGED: unpublished and released after the creator's put");
	percpu_rcuref_exit(&o.ref);
}

static void test_init_errors(void)
{
	struct object o = { 0 };

	is(percpu_rcuref_init(&o.ref, NULL, NULL, 0), -EINVAL, "no release: -EINVAL");
	percpu_rcuref_exit(&o.ref);	/* harmless */
	is(percpu_rcuref_init(NULL, NULL, obj_release, 0), -EINVAL, "NULL ref: -EINVAL");
	percpuref_fault_fail_nth_alloc(1);
	is(percpu_rcuref_init(&o.ref, NULL, obj_release, 0), -ENOMEM, "no memory: -ENOMEM");
	percpuref_fault_fail_nth_alloc(2);
	is(percpu_rcuref_init(&o.ref, NULL, obj_release, 0), -ENOMEM, "no memory later: -ENOMEM");
	percpuref_fault_fail_nth_alloc(0);
	percpu_rcuref_exit(&o.ref);
	is(percpu_rcuref_init(&o.ref, NULL, plain_release, PERCPU_REF_INIT_ATOMIC), 0,
	   "no unpublish is fine");
	percpu_rcuref_kill(&o.ref);
	percpu_rcuref_barrier();
	is(released(&o), 1, "and released after the grace period");
	percpu_rcuref_exit(&o.ref);
}

int main(void)
{
	test_kill_waits_for_readers();
	test_managed();
	test_init_errors();
	return done_testing();
}
