/* SPDX-License-Identifier: MIT */
/*
 * rcuref.h - the kernel's rcuref_t (include/linux/rcuref.h and lib/rcuref.c,
 * Thomas Gleixner, Linux 6.4) in userspace: a reference count for objects
 * that are freed only after an RCU grace period, whose get is one
 * unconditional atomic add instead of an inc_not_zero cmpxchg loop.
 *
 * The count is stored biased by -1: a count of N references reads N - 1, so
 * the last put takes it from 0 to -1 (RCUREF_NOREF) and the sign bit alone
 * tells the fast paths that something unusual happened.  Zones of the
 * stored value (unsigned int):
 *
 *   RCUREF_ONEREF    0x00000000  one reference
 *   RCUREF_MAXREF    0x7FFFFFFF  INT_MAX + 1 references: the last valid value
 *   saturation zone  0x80000000 .. 0xBFFFFFFF
 *     RCUREF_SATURATED 0xA0000000  where an overflowed count is pinned
 *   dead zone        0xC0000000 (RCUREF_RELEASED) .. 0xFFFFFFFF
 *     RCUREF_DEAD      0xE0000000  the last reference was dropped
 *     RCUREF_NOREF     0xFFFFFFFF  the last put is marking it dead
 *
 * Get and put add and subtract unconditionally and look at the result
 * afterwards.  A get that lands in the dead zone fails and resets the count
 * to RCUREF_DEAD; a get or put in the saturation zone resets it to
 * RCUREF_SATURATED (the object leaks: better than a wrap-around).  Both
 * markers sit in the middle of their zone, which leaves room for 2^29 racing
 * operations in each direction before a value could escape.
 *
 * The last put (result RCUREF_NOREF) tries cmpxchg(NOREF -> DEAD).  Between
 * its decrement and that cmpxchg a concurrent get may revive the count
 * (NOREF -> ONEREF): the cmpxchg then fails, the put returns false, and the
 * reviver's own last put will try again.  Only the put whose cmpxchg
 * succeeds returns true; the caller then unpublishes the object and frees
 * it after a grace period.  After DEAD, gets land at DEAD + n, still in the
 * dead zone, and fail.
 *
 * Deconstruction race, and why rcuref_put() enters an RCU read-side
 * section: a putter that decremented to NOREF and is preempted before its
 * cmpxchg no longer holds a reference, yet still writes the count.  Another
 * thread can revive, drop and free the object meanwhile; the late cmpxchg
 * would then write freed memory.  The kernel disables preemption around the
 * put; here rcuref_put() holds a liburcu-bp read-side section (no thread
 * registration needed) across the decrement and the cmpxchg, so the memory
 * must be freed with the liburcu-bp flavour: urcu_bp_call_rcu() or after
 * urcu_bp_synchronize_rcu().  Callers already inside urcu_bp_read_lock() can
 * use rcuref_put_rcusafe(), which is fully inline.
 *
 * Memory ordering (as the kernel): gets are relaxed; whatever the caller
 * used to find the object (the RCU-protected pointer load, a lock) orders
 * its accesses.  A put is a release operation; the cmpxchg of the put that
 * marks the count dead is also an acquire (the kernel's release cmpxchg plus
 * smp_acquire__after_ctrl_dep()), pairing with the release of every other
 * put, so the destructor sees all their accesses.
 *
 * Misuse is reported with one line on stderr: saturation by each get that
 * crosses RCUREF_MAXREF (once per object, unless a put takes the count
 * back below it before the crossing get has pinned it and another get
 * crosses: tests/model/rcuref_zones.pml's CHECK_SAT_REPORT_ONCE), an
 * imbalanced put on a dead count once per process (a dead count carries
 * no room to remember it).
 *
 * One deviation from the kernel: both slow paths get the value the fast
 * path's atomic returned instead of re-reading the count; the kernel made
 * the same change to the put side in 6.15 ("rcuref: Plug slowpath race in
 * rcuref_put()"), where a re-read could see another thread's NOREF.
 */
#ifndef PERCPUREF_RCUREF_H
#define PERCPUREF_RCUREF_H

#include <stdbool.h>

#include <percpuref/compiler.h>

PERCPUREF_BEGIN_DECLS

typedef struct {
	unsigned int refcnt;	/* references - 1; only __atomic builtins */
} rcuref_t;

#define RCUREF_ONEREF 0x00000000U
#define RCUREF_MAXREF 0x7FFFFFFFU
#define RCUREF_SATURATED 0xA0000000U
#define RCUREF_RELEASED 0xC0000000U
#define RCUREF_DEAD 0xE0000000U
#define RCUREF_NOREF 0xFFFFFFFFU

/* Static initialiser for @n references: rcuref_t r = RCUREF_INIT(1); */
#define RCUREF_INIT(n) { (n) - 1U }

/* Slow paths (src/refcount_baselines.c); @cnt is the fast path's result. */
PERCPUREF_API bool rcuref_get_slowpath(rcuref_t *ref, unsigned int cnt);
PERCPUREF_API bool rcuref_put_slowpath(rcuref_t *ref, unsigned int cnt);
/* rcuref_put_rcusafe() inside a liburcu-bp read-side section. */
PERCPUREF_API bool __attribute__((warn_unused_result)) rcuref_put(rcuref_t *ref);

/*
 * rcuref_init - set the count to @cnt references (usually 1) before the
 * object is published; relaxed, the publication orders it.
 */
static inline void rcuref_init(rcuref_t *ref, unsigned int cnt)
{
	__atomic_store_n(&ref->refcnt, cnt - 1, __ATOMIC_RELAXED);
}

/*
 * rcuref_read - the number of references: 0 once dead, a value above
 * RCUREF_MAXREF + 1 when saturated.  A snapshot, for statistics and tests.
 */
static inline unsigned int rcuref_read(rcuref_t *ref)
{
	unsigned int c = __atomic_load_n(&ref->refcnt, __ATOMIC_RELAXED);

	return c >= RCUREF_RELEASED ? 0 : c + 1;
}

/*
 * rcuref_get - take a reference unless the last one was dropped; true on
 * success.  Typically called in an RCU read-side section on an object just
 * found through an RCU-protected pointer.  One relaxed atomic add; the slow
 * path runs only in the saturation and dead zones.
 */
static inline bool __attribute__((warn_unused_result)) rcuref_get(rcuref_t *ref)
{
	/*
	 * Relaxed: the RCU-protected lookup that found the object orders the
	 * caller's accesses; failing leaves the count in the dead zone.
	 */
	unsigned int cnt = __atomic_add_fetch(&ref->refcnt, 1, __ATOMIC_RELAXED);

	if (percpuref_likely((int)cnt >= 0))
		return true;
	return rcuref_get_slowpath(ref, cnt);
}

/*
 * rcuref_put_rcusafe - drop a reference; true when this was the last one
 * and the count is now dead: the caller must unpublish the object and free
 * it after a liburcu-bp grace period.  The caller must be inside
 * urcu_bp_read_lock() (see the deconstruction race above).
 */
static inline bool __attribute__((warn_unused_result)) rcuref_put_rcusafe(rcuref_t *ref)
{
	/*
	 * Release: this thread's accesses to the object happen before the
	 * count drops (pairs with the acquire cmpxchg of the put that marks
	 * it dead, in rcuref_put_slowpath()).
	 */
	unsigned int cnt = __atomic_sub_fetch(&ref->refcnt, 1, __ATOMIC_RELEASE);

	if (percpuref_likely((int)cnt >= 0))
		return false;
	return rcuref_put_slowpath(ref, cnt);
}

PERCPUREF_END_DECLS

#endif
