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
 * Exit between zero and @release (the allowed cases in percpu_rcuref.h:
 * its own @unpublish, the reclaimer's callbacks, a read-side section that
 * keeps the grace period open): the state belongs to whoever holds the
 * ref's place in the release pipeline, so an exit then only marks it.
 * @phase, changed with atomic RMWs after zero() set it, says where the ref
 * is: 0 (live, or in @release), ZEROING (zero() runs @unpublish), QUEUED
 * (waiting for its grace period), plus EXITED.  zero() moves ZEROING ->
 * QUEUED with a CAS that fails if an exit came, and then frees the state
 * instead of queueing it; after_grace_period() swaps in 0 and frees it
 * instead of calling @release if an exit came; percpu_rcuref_exit() frees
 * it only when its fetch_or saw neither ZEROING nor QUEUED.  Each exit
 * takes ref->state with an exchange, so of two exits only one gets it; of
 * an exit and the pipeline, one RMW on each side decides, so exactly one
 * frees the state.  What this cannot cover, and the header forbids: an exit
 * from another thread before zero() set ZEROING (the put reaching zero
 * there, or the reclaimer about to release a managed ref), or once
 * after_grace_period() swapped in 0 (@release may already run, and may
 * free the object).
 *
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

enum {
	RCUREF_ZEROING = 1,	/* zero() is running @unpublish */
	RCUREF_QUEUED = 2,	/* on the RCU queue, waiting for a grace period */
	RCUREF_EXITED = 4,	/* exited meanwhile: the pipeline frees the state */
};

struct percpu_rcuref_state {
	percpu_rcuref_func_t *unpublish;
	percpu_rcuref_func_t *release;
	struct percpu_rcuref *owner;
	unsigned int phase;			/* RCUREF_*; atomic RMWs only */
	struct percpuref_deferred rcu_work;	/* queued at zero */
};

static void after_grace_period(struct percpuref_deferred *work)
{
	struct percpu_rcuref_state *st =
		caa_container_of(work, struct percpu_rcuref_state, rcu_work);
	percpu_rcuref_func_t *release = st->release;
	struct percpu_rcuref *owner = st->owner;

	/* Acq_rel, against percpu_rcuref_exit()'s fetch_or: whichever comes
	 * second frees st, after the other's last use of it.  From here on an
	 * exit frees st at once (from @release, or racing it). */
	if (__atomic_exchange_n(&st->phase, 0, __ATOMIC_ACQ_REL) & RCUREF_EXITED) {
		free(st);
		return;
	}
	/* With the RCU batch's lock released, as every @release run by a
	 * batch (percpu_ref.c, run_release()). */
	percpuref_batch_pause();
	release(owner);
	/* As after every callback (percpu_ref.c, run_callback()). */
	percpuref_prepare_unload();
	percpuref_batch_resume();
}

static void zero(struct percpu_ref *ref)
{
	struct percpu_rcuref *r = caa_container_of(ref, struct percpu_rcuref, ref);
	/* Relaxed: init and exit, its only writers, happen before zero. */
	struct percpu_rcuref_state *st = __atomic_load_n(&r->state, __ATOMIC_RELAXED);
	unsigned int zeroing = RCUREF_ZEROING;

	/* Reinitialised before its @release ran (the header forbids it): the
	 * work item is queued still, and queueing it again linked the RCU
	 * queue to itself.  Unpublished all the same, as the kernel's is:
	 * the pending @release may free it.  Relaxed: in any use the header
	 * allows, the exchange that took the item off (after_grace_period())
	 * happens before this zero, which then reads 0. */
	if (__atomic_load_n(&st->phase, __ATOMIC_RELAXED) & RCUREF_QUEUED) {
		if (st->unpublish)
			st->unpublish(r);
		percpuref_warn(__func__, "ref %p reached zero again before its @release ran "
			       "(reinit between zero and @release?); not queued again",
			       (void *)r);
		return;
	}
	/* Relaxed: an exit allowed to meet ZEROING runs after this on this
	 * thread (from @unpublish), or after @unpublish returned, ordered by
	 * whatever told its caller so (the CAS below then sees EXITED). */
	__atomic_store_n(&st->phase, RCUREF_ZEROING, __ATOMIC_RELAXED);
	if (st->unpublish)
		st->unpublish(r);
	/* Acq_rel, against percpu_rcuref_exit()'s fetch_or: an exit during
	 * @unpublish (its own, or another thread's) makes the CAS fail, and
	 * the state is ours to free; after it, exits leave it to the queue. */
	if (!__atomic_compare_exchange_n(&st->phase, &zeroing, RCUREF_QUEUED, false,
					 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		free(st);
		return;
	}
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
	/* As a refused percpu_ref_init() leaves it, whose gets and puts warn:
	 * dead and atomic with no data, written once the runtime is set up. */
	percpuref_runtime_init();
	ref->ref.percpu_count_ptr = __PERCPU_REF_ATOMIC_DEAD;
	ref->ref.data = NULL;
	if (!release)
		return -EINVAL;
	st = percpuref_zalloc(sizeof(*st));
	if (!st)
		return -ENOMEM;
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
	struct percpu_rcuref_state *st;

	if (!ref || !percpuref_ref_exit(&ref->ref))
		return;	/* refused (warned): the ref keeps its state */
	/* Acq_rel: of two exits (from @release and another thread) one
	 * gets the state. */
	st = __atomic_exchange_n(&ref->state, NULL, __ATOMIC_ACQ_REL);
	/* Acq_rel: pairs with zero()'s CAS and after_grace_period()'s
	 * exchange; in ZEROING or QUEUED the one that sees EXITED frees st. */
	if (st && !(__atomic_fetch_or(&st->phase, RCUREF_EXITED, __ATOMIC_ACQ_REL) &
		    (RCUREF_ZEROING | RCUREF_QUEUED)))
		free(st);
}

/* The kill paces itself on the callback thread's backlog; its release
 * goes on to the reclaimer's RCU queue, which it paces on too. */
PERCPUREF_API void percpu_rcuref_kill(struct percpu_rcuref *ref)
{
	percpu_ref_kill(&ref->ref);
	percpuref_rcu_pace();
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
	int ret = percpuref_managed_may_wait(__func__);

	if (ret)
		return ret;
	ret = percpu_ref_barrier();	/* kills still switching */
	if (!ret)
		percpuref_wait_rcu();
	return ret;
}
