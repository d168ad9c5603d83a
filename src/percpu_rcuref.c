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
 * added once @unpublish returned (waiting for its grace period), plus
 * EXITED.  zero() always queues (but a zero that finds ZEROING or QUEUED,
 * a reinit's misuse: warned); after_grace_period() swaps in 0 and, if
 * an exit came, frees the state instead of calling @release;
 * percpu_rcuref_exit() frees it only when its fetch_or saw neither ZEROING
 * nor QUEUED.  Each exit takes ref->state with an exchange, so of two exits
 * only one gets it; of an exit and the pipeline, one RMW on each side
 * decides, so exactly one frees the state.  And acquire-release on those
 * two RMWs (the exit's fetch_or of EXITED, after_grace_period()'s
 * exchange of 0) is what orders the other side's last use of the state
 * before the free: whichever comes second, and frees, reads the other's
 * write, so the exit's read of the phase and write of readers_hold, or
 * the pipeline's reads of @release and the owner, happen before the
 * free, and neither side touches the state after its RMW but to free
 * it.  zero()'s last uses reach the pipeline through the RCU queue's
 * mutex.  What this cannot cover, and the header forbids: an exit from
 * another thread before zero() set ZEROING (the put reaching zero there,
 * or the reclaimer about to release a managed ref), or once
 * after_grace_period() swapped in 0 (@release may already run, and may
 * free the object).
 *
 * Readers may still tryget a ref exited so: they found the object before
 * @unpublish returned, and their sections may outlast the exit.  So such
 * an exit keeps the ref's percpu_ref_data with a readers' hold
 * (percpuref_ref_exit()), its trygets failing quietly meanwhile, and the
 * pipeline lets go of it in after_grace_period(): the grace period began
 * after @unpublish returned (zero() queues then) and ends after the
 * exit's own section, if it had one, so every reader that could reach the
 * data has left.  The exit freed it at once: a reader's tryget then wrote
 * into freed memory, or into the next ref's count, "succeeding" after
 * zero (tests/unit/test_percpu_rcuref.c, test_exit_under_readers()).
 * An exit right after a kill waits for the kill's switch, whose put may
 * reach zero and call zero() on the thread that ended it: it waits for
 * that zero() to set ZEROING too before it takes the state
 * (kill_then_exit_wait()).
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
	RCUREF_ZEROING = 1,	/* zero() ran @unpublish, or runs it */
	RCUREF_QUEUED = 2,	/* on the RCU queue, waiting for a grace period */
	RCUREF_EXITED = 4,	/* exited meanwhile: the pipeline frees the state */
};

struct percpu_rcuref_state {
	percpu_rcuref_func_t *unpublish;
	percpu_rcuref_func_t *release;
	struct percpu_rcuref *owner;
	unsigned int phase;			/* RCUREF_*; atomic RMWs only */
	struct percpuref_deferred rcu_work;	/* queued at zero */
	/* An exit between zero and @release: the data its readers may
	 * still read, let go after the grace period. */
	struct percpu_ref_data *readers_hold;
};

/* The state of an exited ref, and the readers' hold its exit took, if
 * any: let go by whichever of the exit and the pipeline comes second. */
static void free_exited_state(struct percpu_rcuref_state *st)
{
	percpuref_ref_exit_readers_gone(st->readers_hold);
	free(st);
}

static void after_grace_period(struct percpuref_deferred *work)
{
	struct percpu_rcuref_state *st =
		caa_container_of(work, struct percpu_rcuref_state, rcu_work);
	percpu_rcuref_func_t *release = st->release;
	struct percpu_rcuref *owner = st->owner;

	/* Acq_rel, against percpu_rcuref_exit()'s fetch_or: whichever comes
	 * second frees st, after the other's last use of it (its write of
	 * readers_hold included).  From here on an exit frees st at once
	 * (from @release, or racing it). */
	if (__atomic_exchange_n(&st->phase, 0, __ATOMIC_ACQ_REL) & RCUREF_EXITED) {
		free_exited_state(st);
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

	/* Reinitialised before its @release ran (the header forbids it): the
	 * work item is queued still (QUEUED), or about to be by the zero()
	 * whose @unpublish reinitialised it and took it to zero again, nested
	 * (ZEROING: it queued the item, then its caller queued it again), and
	 * queueing it again linked the RCU queue to itself.  Unpublished all
	 * the same, as the kernel's is: the pending @release may free it.
	 * Relaxed: in any use the header allows, the exchange that took the
	 * item off (after_grace_period()) happens before this zero, which
	 * then reads 0. */
	if (__atomic_load_n(&st->phase, __ATOMIC_RELAXED) & (RCUREF_ZEROING | RCUREF_QUEUED)) {
		/* As below (the phase stands for ZEROING). */
		percpuref_ref_release_begins(ref);
		if (st->unpublish)
			st->unpublish(r);
		percpuref_warn(__func__, "ref %p reached zero again before its @release ran "
			       "(reinit between zero and @release?); not queued again",
			       (void *)r);
		return;
	}
	/* Relaxed: an exit allowed to meet ZEROING runs after this on this
	 * thread (from @unpublish), after the switch lock below (an exit
	 * right after a kill), or after @unpublish returned, ordered by
	 * whatever told its caller so. */
	__atomic_store_n(&st->phase, RCUREF_ZEROING, __ATOMIC_RELAXED);
	/* After the load of r->state and the store of ZEROING: an exit that
	 * waits for this zero (kill_then_exit_wait()) takes the state once
	 * this says so, and finds ZEROING.  Under the ref's switch lock,
	 * which that exit's check takes too: it orders both. */
	percpuref_ref_release_begins(ref);
	if (st->unpublish)
		st->unpublish(r);
	/* Queued even if an exit came during @unpublish (its own, or another
	 * thread's): the readers' hold that exit took waits for the grace
	 * period too (after_grace_period() frees st).  Relaxed: no exit's
	 * fetch_or needs anything of ours (ZEROING or QUEUED, it leaves st to
	 * the pipeline either way); the queue's mutex orders @unpublish
	 * before the grace period. */
	__atomic_fetch_or(&st->phase, RCUREF_QUEUED, __ATOMIC_RELAXED);
	/*
	 * On the thread that runs the exit, after our exit handler (a static
	 * destructor, an atexit() handler registered before our first use):
	 * the grace period and @release here, before the put or kill that
	 * reached zero returns.  Queued, @release ran on the reclaimer after
	 * the static objects older than our first use were destroyed (review
	 * 171).  Only while no callback of the reclaimer's runs: those may
	 * exit this ref meanwhile, which a @release run beside them would
	 * race (review 175); and waiting for them could wait for one that
	 * waits for a lock this thread holds (review 174): then queued, as
	 * before.
	 */
	if (!percpuref_exiting_thread() ||
	    !percpuref_run_after_rcu_here(&st->rcu_work, after_grace_period))
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

/*
 * An exit right after a kill (or a switch to atomic) waits for that switch,
 * and its put may take the count to zero and run zero() on the thread that
 * finished it, which reads ref->state: let that zero() begin before the
 * exit takes the state (0.4.21's first build took it during the wait, and
 * zero() faulted), and the exit is then one between zero and @release.
 * percpuref_ref_wait_switch() waits for the switch and says whether its
 * release has yet to begin, under the ref's switch lock, which zero()'s
 * percpuref_ref_release_begins() takes after its load of the state.
 * The thread that ended the switch calls zero() next, so this rarely
 * waits long.  (In a fork child that release runs in the parent only: not
 * waited for.)
 */
static void kill_then_exit_wait(struct percpu_rcuref *ref)
{
	unsigned long tries = 0;

	while (percpuref_ref_wait_switch(&ref->ref))
		percpuref_yield_or_nap(++tries);
}

PERCPUREF_API void percpu_rcuref_exit(struct percpu_rcuref *ref)
{
	struct percpu_rcuref_state *st;
	bool under_readers;

	if (!ref)
		return;
	kill_then_exit_wait(ref);
	/* Acq_rel: of two exits (from @release and another thread) one
	 * gets the state, which the pipeline frees only after this exit's
	 * mark below: ours to read until then. */
	st = __atomic_exchange_n(&ref->state, NULL, __ATOMIC_ACQ_REL);
	/* Between zero and @release: readers may still tryget it.  Relaxed,
	 * as zero()'s store of ZEROING: an exit allowed to find it runs after
	 * it on zero()'s thread, or is ordered after @unpublish by whatever
	 * told its caller so.  In those uses the phase stays ZEROING or
	 * QUEUED until our mark below (an exit from @unpublish, a callback
	 * of the reclaimer, which runs after_grace_period() itself, or a
	 * read-side section that holds the grace period open). */
	under_readers = st && (__atomic_load_n(&st->phase, __ATOMIC_RELAXED) &
			       (RCUREF_ZEROING | RCUREF_QUEUED));
	if (!percpuref_ref_exit(&ref->ref, under_readers ? &st->readers_hold : NULL)) {
		/* Refused (warned: its own kill's confirm, which no zero
		 * can race, holding the switch's reference): the ref keeps
		 * its state.  Release: pairs with the acq_rel exchange of the
		 * exit that takes the state next, so our read of its phase
		 * happens before that exit, or the pipeline after that
		 * exit's mark, frees it.  (Init's plain store needs none:
		 * the ref's hand-off to other threads orders it.) */
		__atomic_store_n(&ref->state, st, __ATOMIC_RELEASE);
		return;
	}
	/* Acq_rel: pairs with after_grace_period()'s exchange; in ZEROING or
	 * QUEUED the one that sees EXITED frees st.  Outside them (the header
	 * forbids an exit that finds them here and not above), the hold is
	 * ours to let go. */
	if (st && !(__atomic_fetch_or(&st->phase, RCUREF_EXITED, __ATOMIC_ACQ_REL) &
		    (RCUREF_ZEROING | RCUREF_QUEUED)))
		free_exited_state(st);
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
