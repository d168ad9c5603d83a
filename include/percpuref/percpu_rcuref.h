/* SPDX-License-Identifier: MIT */
/*
 * percpu_rcuref.h - a per-CPU reference count for objects that readers find
 * under RCU (the proposal's "percpu rcuref"): a percpu_ref whose release is
 * deferred past an RCU grace period, so that a reader who found the object
 * in an RCU-protected structure may call percpu_rcuref_tryget() on it even
 * while it is being released: the memory stays valid until the reader's
 * read-side section ends, and tryget fails once the count reached zero.
 *
 * When the count reaches zero (the last put, or the reclaimer for a managed
 * ref) the library calls @unpublish at once: remove the object from every
 * structure where readers can find it.  Then it waits for an RCU grace
 * period that starts after @unpublish returned and calls @release on the
 * reclaimer thread (or on the thread of a percpuref_shutdown(), which exit()
 * runs too, or of a barrier or flush that runs the queue itself because no
 * thread can start, or, after exit() ran the library's exit handler, on
 * the exiting thread that reached zero, while the reclaimer runs no
 * callback: docs/percpu_ref.md, "At process exit"; one @release at a time
 * in every case): no reader can still hold a pointer it found before, so
 * @release may percpu_rcuref_exit() and free the object.
 *
 * RCU flavour: liburcu-bp (link with liburcu-bp; pkg-config percpuref pulls
 * it in).  Readers bracket lookups with percpu_rcuref_read_lock()/unlock(),
 * which are urcu_bp_read_lock()/unlock() plus what ThreadSanitizer needs to
 * see the grace period; calling urcu_bp_read_lock() directly works as well.
 * No thread registration.  Get/put/tryget need no read-side section.
 *
 * Managed mode as for percpu_ref (percpu_ref.h, managed.h): after
 * percpu_rcuref_switch_to_managed() (or PERCPU_REF_REL_MANAGED at init) the
 * manager holds a reference of its own and nobody kills the ref; the creator
 * drops its initial reference with percpu_rcuref_put() like any user.  The
 * reclaimer finds it held by the manager alone, calls @unpublish, and
 * @release follows after a grace period.  percpu_ref_managed_flush() waits
 * for both.
 */
#ifndef PERCPUREF_PERCPU_RCUREF_H
#define PERCPUREF_PERCPU_RCUREF_H

#include <percpuref/compiler.h>
#include <percpuref/percpu_ref.h>

PERCPUREF_BEGIN_DECLS

struct percpu_rcuref;
typedef void(percpu_rcuref_func_t)(struct percpu_rcuref *);
struct percpu_rcuref_state;

struct percpu_rcuref {
	struct percpu_ref ref;
	struct percpu_rcuref_state *state;	/* private: callbacks, queue link */
};

/*
 * percpu_rcuref_init - one reference, per-CPU unless @flags say otherwise
 * (percpu_ref_init() flags).  @unpublish may be NULL (an object readers
 * cannot find); @release may not.  0, -EINVAL or -ENOMEM.
 */
PERCPUREF_API int percpu_rcuref_init(struct percpu_rcuref *ref, percpu_rcuref_func_t *unpublish,
				     percpu_rcuref_func_t *release, unsigned int flags);
/*
 * percpu_rcuref_exit - free what init allocated: for a ref whose count never
 * reached zero, or from @release or after it.  Between zero and @release,
 * only where no @release can be running: from the ref's own @unpublish,
 * from any callback the reclaimer runs (every @release, a managed ref's
 * @unpublish: docs/managed.md), or inside a read-side section that began
 * before the ref's @unpublish returned (its grace period cannot end yet);
 * the exit then stops the release: @release never runs.  "Zero" there is
 * @unpublish begun, as @unpublish tells the exiting thread (a flag it
 * sets): percpu_ref_is_zero() reads true a moment before the thread whose
 * put took the count to zero calls it, and another thread's exit in that
 * moment frees what that thread is about to read (a review's faulted).
 * Readers that found the object before @unpublish returned may still call
 * percpu_rcuref_tryget() on it, which fails without a warning: the library
 * keeps the count they read until their sections have ended, and the
 * object's own memory must outlive them too (free it after
 * percpu_rcuref_barrier(), or from a later @release).  One exit of a ref in
 * that window: a second one racing it cannot tell that readers may look.
 * An exit right after percpu_rcuref_kill() of a per-CPU ref waits for the
 * kill's switch and, where that took the count to zero, for @unpublish to
 * begin (on the thread that ended the switch).  Inside a read-side section
 * that began before the kill it is then such an exit; outside one,
 * @release may run first, so there it is safe only where @release does
 * not free the object (an exit racing @release's own is harmless).  Where
 * others still hold references after the kill, the exit is one of a held
 * ref: not allowed.
 * Elsewhere, call percpu_rcuref_barrier() first.  A managed ref held only by the manager
 * may be under release at any time: exit it from another thread only while
 * holding a reference.  An exit the library refuses (from the ref's own
 * kill confirm: warned) leaves the ref whole.  percpu_ref_reinit() of
 * &ref->ref: only from @release or after it, never between zero and
 * @release.  One that does, and reaches zero again before that @release
 * ran (from the ref's own @unpublish too), is unpublished and warned, and
 * not queued a second time (which corrupted the RCU queue); the pending
 * @release still runs, and may free the object.
 */
PERCPUREF_API void percpu_rcuref_exit(struct percpu_rcuref *ref);
/* Drop the initial reference (unmanaged refs); see percpu_ref_kill(). */
PERCPUREF_API void percpu_rcuref_kill(struct percpu_rcuref *ref);
/* See percpu_ref_switch_to_managed() / _unmanaged(). */
PERCPUREF_API int percpu_rcuref_switch_to_managed(struct percpu_rcuref *ref);
PERCPUREF_API int percpu_rcuref_switch_to_unmanaged(struct percpu_rcuref *ref);
/* RCU read-side section for lookups; nestable, any thread. */
PERCPUREF_API void percpu_rcuref_read_lock(void);
PERCPUREF_API void percpu_rcuref_read_unlock(void);
/*
 * percpu_rcuref_barrier - wait until the release of every ref queued for
 * release before the call has run, and of every kill still switching.  A
 * put that reaches zero queues it after @unpublish returns and before the
 * put returns (the reclaimer, likewise, before it goes on; a put in a
 * signal handler that interrupted a get or put of its thread on the
 * fallback path, before that get or put returns): a put still
 * running on another thread is not waited for, even once its @unpublish
 * returned.
 * 0, or -EDEADLK (warned) on one of the library's threads (its callbacks),
 * from shutdown, from a callback that a poll or a wait running the queue
 * itself runs, from a @release that the thread running exit() runs in the
 * reclaimer's place (docs/percpu_ref.md, "At process exit"), or inside a
 * read-side section (it would wait for itself); a callback run by a put
 * on the putter's own thread otherwise may call it.  While the library's
 * threads cannot start, it runs their queues, grace period and callbacks,
 * on the calling thread.
 */
PERCPUREF_API int percpu_rcuref_barrier(void);

/* percpu_rcuref_get - one more reference; the caller holds one. */
static inline void percpu_rcuref_get(struct percpu_rcuref *ref)
{
	percpu_ref_get(&ref->ref);
}

/*
 * percpu_rcuref_tryget - a reference unless the count reached zero.  Safe on
 * an object found under percpu_rcuref_read_lock(), even one being released.
 */
static inline bool percpu_rcuref_tryget(struct percpu_rcuref *ref)
{
	return percpu_ref_tryget(&ref->ref);
}

/* percpu_rcuref_put - drop one; the last starts the deferred release. */
static inline void percpu_rcuref_put(struct percpu_rcuref *ref)
{
	percpu_ref_put(&ref->ref);
}

PERCPUREF_END_DECLS

#endif
