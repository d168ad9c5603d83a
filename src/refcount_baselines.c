/* SPDX-License-Identifier: MIT */
/*
 * refcount_baselines.c - the out-of-line halves of the atomic baselines,
 * kref.h and rcuref.h: misuse reports, the rcuref zone handling, and
 * rcuref_put() with its RCU read-side section.
 *
 * Everything here runs only off the fast paths: a count in the saturated or
 * dead zone, or the put that drops the last rcuref.  The zone rules and the
 * memory-ordering argument are in the two headers; this file only adds the
 * repairs (pin the count back to the middle of its zone) and the reports.
 *
 * Pinning is a plain relaxed store, as in the kernel: a racing get or put
 * may move the value a little, but the zones are 2^29 wide on each side of
 * their marker, so it never leaves the zone, and the next slow path puts it
 * back.  No ordering is needed: a pinned object is leaked, nothing is
 * released through it.
 */
#include <string.h>
/*
 * Without _LGPL_SOURCE: the inline urcu_bp_read_lock() trips UBSan on
 * liburcu's misaligned reader struct, so take the exported function.
 */
#include <urcu/urcu-bp.h>

#include <percpuref/kref.h>
#include <percpuref/rcuref.h>

#include "internal.h"

void __kref_misuse(struct kref *kref, unsigned int old, const char *fn)
{
	/*
	 * old above KREF_MAX: the count was already pinned (and reported);
	 * otherwise this operation is the one that left the live zone.
	 */
	if (old == 0 && strcmp(fn, "kref_put") == 0)
		percpuref_warn(fn, "put on released kref %p (count 0): saturated, leaking it",
			       (void *)kref);
	else if (old == 0)
		percpuref_warn(fn, "get on released kref %p (use after free?): saturated, leaking it",
			       (void *)kref);
	else if (old == KREF_MAX)
		percpuref_warn(fn, "kref %p overflowed: saturated, leaking it", (void *)kref);
	/* Relaxed: a pin; the kref is leaked, and nothing is released or
	 * read through it on the strength of this store. */
	__atomic_store_n(&kref->refcount, KREF_SATURATED, __ATOMIC_RELAXED);
}

bool rcuref_get_slowpath(rcuref_t *ref, unsigned int cnt)
{
	/* Dead: fail, and undo the increment so it stays mid-zone.  Relaxed:
	 * the get fails, so its caller reads nothing through the object. */
	if (cnt >= RCUREF_RELEASED) {
		__atomic_store_n(&ref->refcnt, RCUREF_DEAD, __ATOMIC_RELAXED);
		return false;
	}
	/*
	 * Saturation zone: succeed (the object is leaked, a reference to it
	 * is safe) and pin.  Only the get that crossed RCUREF_MAXREF reports.
	 */
	if (cnt == RCUREF_MAXREF + 1)
		percpuref_warn("rcuref_get", "rcuref %p saturated: leaking it", (void *)ref);
	/* Relaxed: a pin; the object leaks, and the get succeeds ordered,
	 * as every get, by whatever found the object (rcuref.h). */
	__atomic_store_n(&ref->refcnt, RCUREF_SATURATED, __ATOMIC_RELAXED);
	return true;
}

bool rcuref_put_slowpath(rcuref_t *ref, unsigned int cnt)
{
	static bool imbalance_reported;

	if (percpuref_likely(cnt == RCUREF_NOREF)) {
		/*
		 * This put dropped the last reference.  Mark it dead unless a
		 * get revived it (or that get's own last put already marked
		 * it): then this put must not release, and needs no retry.
		 * Release: keeps this thread's accesses before DEAD is seen.
		 * Acquire (the kernel's smp_acquire__after_ctrl_dep(), folded
		 * into the cmpxchg so ThreadSanitizer can follow it): the
		 * NOREF it reads comes from this put's own decrement, in the
		 * release sequence of every earlier put, so the destructor
		 * sees their accesses.
		 */
		return __atomic_compare_exchange_n(&ref->refcnt, &cnt, RCUREF_DEAD, false,
						   __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
	}
	/* A put on a dead count is imbalanced: keep it dead, never release.
	 * Relaxed, the flag and the count: the flag only picks which put
	 * warns; the count stays dead and this put releases nothing. */
	if (cnt >= RCUREF_RELEASED) {
		if (!__atomic_exchange_n(&imbalance_reported, true, __ATOMIC_RELAXED))
			percpuref_warn("rcuref_put", "imbalanced put on dead rcuref %p", (void *)ref);
		__atomic_store_n(&ref->refcnt, RCUREF_DEAD, __ATOMIC_RELAXED);
		return false;
	}
	/* A put on a saturated count: pin it mid-zone; never release.
	 * Relaxed: the object is leaked, nothing is released through it. */
	__atomic_store_n(&ref->refcnt, RCUREF_SATURATED, __ATOMIC_RELAXED);
	return false;
}

bool rcuref_put(rcuref_t *ref)
{
	bool released;

	/*
	 * The read-side section spans the decrement and the cmpxchg of the
	 * last put, so a concurrent revive-and-free cannot complete its grace
	 * period before this thread's last write to the count.
	 */
	urcu_bp_read_lock();
	released = rcuref_put_rcusafe(ref);
	urcu_bp_read_unlock();
	return released;
}
