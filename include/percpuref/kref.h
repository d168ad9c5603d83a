/* SPDX-License-Identifier: MIT */
/*
 * kref.h - the kernel's kref (include/linux/kref.h) on a refcount_t-style
 * saturating atomic count: the baseline every per-CPU scheme is measured
 * against, and the count the AppArmor label case started from.
 *
 * One 32-bit count, written with one atomic read-modify-write per get and
 * per put.  Every thread that takes or drops a reference writes the same
 * cache line, which is exactly what stops it from scaling.
 *
 * Zones of the count (unsigned int):
 *
 *   0            released: the put that reached it called @release
 *   1..INT_MAX   live references
 *   >= 2^31      "negative": misuse was detected, the count is pinned at
 *                KREF_SATURATED (INT_MIN / 2) and the object is leaked
 *
 * Like refcount_t, misuse is caught where it happens and answered with the
 * least harmful thing: a get on a released count (use after free), a get
 * that would overflow INT_MAX, and a put below zero each print one line on
 * stderr naming the function and the kref, and pin the count at
 * KREF_SATURATED.  KREF_SATURATED lies 2^30 away from both 0 and INT_MAX, so
 * racing gets and puts cannot walk a pinned count back into the live zone,
 * and @release is never called for it: the object leaks instead of being
 * freed twice.  Operations on a count that is already pinned re-pin it
 * silently, so each object warns once.  Detection is after the fact, as in
 * the kernel: the increment from 0 has already happened when it is noticed.
 *
 * Memory ordering (as refcount_t): gets are relaxed, because the caller
 * reached the object through something that already orders it (a lock, an
 * RCU-protected pointer, a reference it holds).  A put is a release
 * operation, so everything this thread did to the object happens before the
 * count drops; the put that reaches zero then issues an acquire fence
 * (__kref_acquire_after_dec()), pairing with the release of every other
 * put, so @release sees every access made under every reference.
 *
 * Any thread, any context; no registration.  The fast paths are inline;
 * only the misuse report is out of line (src/refcount_baselines.c).
 */
#ifndef PERCPUREF_KREF_H
#define PERCPUREF_KREF_H

#include <percpuref/compiler.h>

PERCPUREF_BEGIN_DECLS

struct kref {
	unsigned int refcount;	/* only accessed with __atomic builtins */
};

/* Largest live count; anything above it is the saturated zone. */
#define KREF_MAX 0x7FFFFFFFU
/* Where a misused count is pinned: INT_MIN / 2, as refcount_t. */
#define KREF_SATURATED 0xC0000000U

/* Static initialiser: struct kref k = KREF_INIT(1); */
#define KREF_INIT(n) { (n) }

/*
 * The acquire half of the put that reached zero: a fence, the kernel's
 * smp_acquire__after_ctrl_dep().  ThreadSanitizer does not model fences, so
 * under it an acquire load of the count stands in: it reads this put's own
 * decrement, which lies in the release sequence of every earlier put (Rust's
 * Arc does the same).
 */
#ifdef __SANITIZE_THREAD__
#define __kref_acquire_after_dec(kref) \
	((void)__atomic_load_n(&(kref)->refcount, __ATOMIC_ACQUIRE))
#else
#define __kref_acquire_after_dec(kref) __atomic_thread_fence(__ATOMIC_ACQUIRE)
#endif

/*
 * Reports misuse in @fn (old value @old) unless the count was already
 * pinned, and pins it at KREF_SATURATED.
 */
PERCPUREF_API void __kref_misuse(struct kref *kref, unsigned int old, const char *fn);

/*
 * kref_init - set the count to one, before the object is published.  A plain
 * relaxed store: whatever publishes the object orders it.
 */
static inline void kref_init(struct kref *kref)
{
	__atomic_store_n(&kref->refcount, 1, __ATOMIC_RELAXED);
}

/*
 * kref_read - the current count (KREF_SATURATED and above: misused).  A
 * relaxed snapshot, for statistics and tests; it orders nothing.
 */
static inline unsigned int kref_read(const struct kref *kref)
{
	return __atomic_load_n(&kref->refcount, __ATOMIC_RELAXED);
}

/*
 * kref_get - take a reference; the caller must already hold one.  One
 * relaxed atomic add.  A get on a released count or one that would pass
 * KREF_MAX is misuse: warned, count pinned.
 */
static inline void kref_get(struct kref *kref)
{
	/* Relaxed: the reference the caller holds keeps the object alive. */
	unsigned int old = __atomic_fetch_add(&kref->refcount, 1, __ATOMIC_RELAXED);

	if (percpuref_unlikely(old == 0 || old >= KREF_MAX))
		__kref_misuse(kref, old, "kref_get");
}

/*
 * kref_get_unless_zero - take a reference unless the count is zero; returns
 * non-zero on success.  For lookups that can race with the last put (the
 * object found under a lock or in an RCU read-side section).  A pinned count
 * succeeds: the object is leaked, so a reference to it is safe.
 */
static inline int __attribute__((warn_unused_result))
kref_get_unless_zero(struct kref *kref)
{
	unsigned int old = __atomic_load_n(&kref->refcount, __ATOMIC_RELAXED);

	do {
		if (old == 0)
			return 0;
		if (percpuref_unlikely(old >= KREF_MAX)) {
			__kref_misuse(kref, old, "kref_get_unless_zero");
			return 1;
		}
		/*
		 * Relaxed, like the kernel's refcount_inc_not_zero(): the
		 * lookup that found the object orders the caller's later
		 * accesses to it.
		 */
	} while (!__atomic_compare_exchange_n(&kref->refcount, &old, old + 1, 1,
					      __ATOMIC_RELAXED, __ATOMIC_RELAXED));
	return 1;
}

/*
 * kref_put - drop a reference; the put that drops the last one calls
 * @release(@kref) on this thread and returns 1, every other put returns 0.
 * A put on a released or pinned count is misuse: warned, count pinned,
 * @release not called.
 */
static inline int kref_put(struct kref *kref, void (*release)(struct kref *kref))
{
	/*
	 * Release: this thread's accesses to the object happen before the
	 * count drops (pairs with the acquire fence below, in whichever
	 * thread drops the last reference).
	 */
	unsigned int old = __atomic_fetch_sub(&kref->refcount, 1, __ATOMIC_RELEASE);

	if (old == 1) {
		/* Pairs with the release decrement of every earlier put. */
		__kref_acquire_after_dec(kref);
		release(kref);
		return 1;
	}
	if (percpuref_unlikely(old == 0 || old > KREF_MAX))
		__kref_misuse(kref, old, "kref_put");
	return 0;
}

PERCPUREF_END_DECLS

#endif
