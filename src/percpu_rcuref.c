/* SPDX-License-Identifier: MIT */
/*
 * percpu_rcuref.c - the RCU-released per-CPU ref (percpu_rcuref.h).
 *
 * A percpu_rcuref is a percpu_ref whose own release function (zero())
 * does two things: it calls the user's @unpublish at once, on the thread
 * that took the count to zero (the last putter, the callback thread that
 * finished a kill, or the reclaimer), then queues the object for the
 * reclaimer's RCU queue (managed.c), which waits for one liburcu-bp grace
 * period per batch and calls the user's @release.
 *
 * Why this is safe for a reader who found the object under
 * percpu_rcuref_read_lock() and calls tryget:
 *  - before zero, tryget succeeds (per-CPU mode: always; atomic: count > 0);
 *  - at and after zero, tryget fails: the count is zero in atomic mode, and
 *    a ref only reaches zero in atomic mode (the percpu_ref rule), never to
 *    be revived except by reinit, which only @release may do;
 *  - the memory (the object, its percpu_ref_data and state) is freed at the
 *    earliest in @release, after a grace period that started after
 *    @unpublish: any reader that could still see the pointer was in a
 *    read-side section that began before that, and has ended.
 * The grace period runs on the reclaimer thread, not with liburcu's
 * call_rcu, so that the hand-off is a mutex ThreadSanitizer can see; the
 * grace period itself it cannot see, so read_unlock releases on
 * percpuref_rcu_tsan_sync and the reclaimer acquires it after each grace
 * period (TSAN builds only).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>

#include "internal.h"
#include "managed.h"
#include "percpuref/percpu_rcuref.h"

struct percpu_rcuref_state {
	percpu_rcuref_func_t *unpublish;
	percpu_rcuref_func_t *release;
	struct percpu_rcuref *owner;
	struct percpuref_deferred rcu_work;	/* queued at zero */
};

static void after_grace_period(struct percpuref_deferred *work)
{
	struct percpu_rcuref_state *st =
		caa_container_of(work, struct percpu_rcuref_state, rcu_work);

	/* @release may exit the ref, which frees st: nothing after. */
	st->release(st->owner);
}

static void zero(struct percpu_ref *ref)
{
	struct percpu_rcuref *r = caa_container_of(ref, struct percpu_rcuref, ref);
	struct percpu_rcuref_state *st = r->state;

	if (st->unpublish)
		st->unpublish(r);
	/* The queue's mutex orders @unpublish before the grace period. */
	percpuref_call_after_rcu(&st->rcu_work, after_grace_period);
}

PERCPUREF_API int percpu_rcuref_init(struct percpu_rcuref *ref, percpu_rcuref_func_t *unpublish,
				     percpu_rcuref_func_t *release, unsigned int flags)
{
	struct percpu_rcuref_state *st;
	int err;

	if (!ref)
		return -EINVAL;
	ref->state = NULL;
	if (!release) {
		ref->ref.data = NULL;
		return -EINVAL;
	}
	st = percpuref_zalloc(sizeof(*st));
	if (!st) {
		ref->ref.data = NULL;
		return -ENOMEM;
	}
	st->unpublish = unpublish;
	st->release = release;
	st->owner = ref;
	/* Before init: with PERCPU_REF_REL_MANAGED the reclaimer may reach the
	 * ref as soon as percpu_ref_init() links it. */
	ref->state = st;
	err = percpu_ref_init(&ref->ref, zero, flags);
	if (err) {
		ref->state = NULL;
		free(st);
	}
	return err;
}

PERCPUREF_API void percpu_rcuref_exit(struct percpu_rcuref *ref)
{
	if (!ref)
		return;
	percpu_ref_exit(&ref->ref);
	free(ref->state);
	ref->state = NULL;
}

PERCPUREF_API void percpu_rcuref_kill(struct percpu_rcuref *ref)
{
	percpu_ref_kill(&ref->ref);
}

PERCPUREF_API int percpu_rcuref_switch_to_managed(struct percpu_rcuref *ref)
{
	return percpu_ref_switch_to_managed(&ref->ref);
}

PERCPUREF_API int percpu_rcuref_switch_to_unmanaged(struct percpu_rcuref *ref)
{
	return percpu_ref_switch_to_unmanaged(&ref->ref);
}

PERCPUREF_API void percpu_rcuref_read_lock(void)
{
	urcu_bp_read_lock();
}

PERCPUREF_API void percpu_rcuref_read_unlock(void)
{
	/* For TSAN: pairs with the acquire after each grace period. */
	percpuref_tsan_release(&percpuref_rcu_tsan_sync);
	urcu_bp_read_unlock();
}

PERCPUREF_API int percpu_rcuref_barrier(void)
{
	int ret = percpu_ref_barrier();	/* kills still switching */

	return ret ? ret : percpuref_wait_rcu();
}
