/* SPDX-License-Identifier: MIT */
/*
 * hcount.h - hierarchical charge counters: per-namespace resource counts
 * with limits, charged up a tree of namespaces (the kernel's ucounts rlimit
 * charges), with a per-namespace cache of units already charged to the
 * ancestors so that steady-state charges touch only the namespace's memory.
 *
 * A tree has nr_types resource types and one root namespace; every other
 * namespace has a parent.  For each namespace ns and type t:
 *
 *   own(ns)     units charged at ns itself (hcount_charge(ns, ...)) and not
 *               yet uncharged;
 *   cached(ns)  units charged to every strict ancestor of ns on ns's behalf
 *               but not used by ns yet (the cache; always 0 for the root and
 *               in no-cache mode);
 *   count(ns)   units charged to ns: its own units, plus everything its
 *               children hold charged to it (their counts and their caches);
 *   limit(ns)   count(ns) never passes it.
 *
 * The invariant, exact whenever no call is in progress (hcount_tree_check()
 * verifies it for every namespace and type):
 *
 *   count(ns) = own(ns) + sum over children c of (count(c) + cached(c))
 *   0 <= own(ns), 0 <= cached(ns), count(ns) <= limit(ns)
 *
 * so count(root) = all own units of the tree + all caches: no unit is lost
 * or created.  The usage of a subtree, usage(ns) = sum of own() over the
 * subtree of ns, is count(ns) minus the caches below ns.
 *
 * Charging n units at ns ("the caller's own limit" max: pass HCOUNT_UNLIMITED
 * for none) succeeds when, for the namespace itself,
 *   usage(ns) + n <= min(limit(ns), max)
 * and for every strict ancestor a,
 *   usage(a) + n <= limit(a)
 * otherwise it fails with -EDQUOT and changes no own() or limit (caches
 * below a full level may have been drained into it, which moves cached()
 * and count() but no usage).  max is the
 * inc_rlimit_ucounts() rule: a task's rlimit bounds the count of the
 * namespace it charges (all users of that namespace and its descendants),
 * not the counts of the ancestors.
 *
 * Caches: a charge that finds n units in cached(ns) and room under ns's limit
 * moves them to own(ns) under the namespace's own lock: one cache line,
 * nothing shared.  Otherwise it refills: it charges the missing units plus
 * `batch` (the tree's batch, HCOUNT_BATCH_DEFAULT = 16) to the parent, which
 * serves them from its own cache or refills from its parent in turn.  An
 * uncharge puts units back in the cache; a cache above 2 * batch gives all
 * but `batch` back to the parent.  Limits stay exact: caches never make a
 * charge fail.  A charge that meets a full level drains every cache below
 * that level back up (under the tree's mutex) and tries again without
 * batches; it is refused only if the level is full of real usage.  Precisely:
 * a refused charge had, at one instant during the call, usage + n above the
 * limit at some level on its path, where usage counts units of charges that
 * completed or are about to complete successfully (so refusals are
 * linearizable).  A destroyed namespace gives its cache back.
 *
 * No-cache mode (batch == HCOUNT_NO_CACHE): every charge walks to the root
 * adding n to each level's count with a compare-and-swap that checks the
 * limit, and undoes the levels below if one refuses (the kernel adds and
 * checks after the add; this never passes a limit, even for a moment).  A
 * charge is refused only where
 * its units would pass a limit, but, as in the kernel, that may be because
 * of the units of a concurrent charge that is itself about to fail and undo
 * them; and a count may pass a limit that is being lowered for as long as
 * such a charge holds its units there.
 *
 * Threads: any thread may call anything; nothing needs registering.  A
 * namespace must not be destroyed while another call may still use it (the
 * caller's reference counting covers that, as for the kernel's ucounts);
 * hcount_ns_own() reading 0 does not say so (a no-cache uncharge zeroes
 * own, then walks the ancestors).  hcount orders no memory for the caller:
 * a successful charge is not an acquire, an uncharge not a release.
 * Nothing is async-signal-safe: a handler that charges or uncharges while
 * its thread holds a slot lock (in any call here) spins for ever.
 *
 * Errors are negative errno values: -EINVAL for a bad argument (and a
 * one-line warning on stderr naming the call), -EDQUOT for a refused charge,
 * -ERANGE for uncharging more than own(ns) (warned), -EBUSY for destroying a
 * namespace that still has children or own units (warned) or lowering a
 * limit below the usage, -ENOMEM when allocation fails (nothing leaks).  An
 * error changes no own() and no limit; a refused charge or lowering may
 * have drained caches (see above).
 *
 * See docs/hcount.md for the cost of each call and the exactness argument.
 */
#ifndef PERCPUREF_HCOUNT_H
#define PERCPUREF_HCOUNT_H

#include <errno.h>
#include <limits.h>
#include <pthread.h>

#include <percpuref/compiler.h>

PERCPUREF_BEGIN_DECLS

#define HCOUNT_BATCH_DEFAULT 16U	/* units per cache refill / give-back */
#define HCOUNT_NO_CACHE 0U		/* batch of a tree without caches */
#define HCOUNT_BATCH_MAX (1U << 20)
#define HCOUNT_TYPES_MAX 64U
#define HCOUNT_DEPTH_MAX 1024U		/* root: depth 0 (the kernel nests 32) */
/* A limit or max that refuses nothing but a count past LONG_MAX. */
#define HCOUNT_UNLIMITED LONG_MAX

/*
 * One namespace's state for one type, alone on its cache line.  In cache
 * mode every field is written under `lock` (spins, yields, then sleeps); fields
 * are accessed with relaxed atomics so that the lockless read-outs below do
 * not race.  In no-cache mode `lock` is unused and count/own are updated with
 * atomic read-modify-writes.
 */
struct hcount_slot {
	int lock;
	/*
	 * Nonzero while a drain runs above this namespace (a refused charge
	 * or a lowered limit emptying the caches below a level): refills from
	 * here then take no batch, and uncharges give the cache back past
	 * this level.  Set and cleared by the drain, under `lock`; read under
	 * `lock` (docs/hcount.md, "Exactness").
	 */
	int draining;
	long limit;
	long count;
	long cached;
	long own;
} __attribute__((aligned(PERCPUREF_CACHELINE)));

struct hcount_tree;

struct hcount_ns {
	/* Read-only after creation: what the fast paths read. */
	struct hcount_slot *slots;	/* nr_types slots (same allocation) */
	struct hcount_tree *tree;
	struct hcount_ns *parent;	/* NULL for the root */
	unsigned int nr_types;
	unsigned int batch;		/* the tree's; 0: no-cache mode */
	int fast;			/* cache mode and not the root */
	unsigned int depth;		/* root: 0 */
	/* Registry of children: written under the tree's mutex. */
	unsigned int nr_children;	/* also read under slot locks */
	struct hcount_ns *first_child;
	struct hcount_ns *next_sibling;
	struct hcount_ns **pprev;
};

struct hcount_tree {
	unsigned int nr_types;
	unsigned int batch;
	struct hcount_ns *root;
	/* Registry, drains, destroy; never taken by a fast path. */
	pthread_mutex_t mutex __attribute__((aligned(PERCPUREF_CACHELINE)));
};

/*
 * hcount_tree_create - a tree of @nr_types (1..HCOUNT_TYPES_MAX) resource
 * types whose caches refill and give back @batch units at a time
 * (HCOUNT_BATCH_DEFAULT; HCOUNT_NO_CACHE for no caches; at most
 * HCOUNT_BATCH_MAX).  The tree comes with its root namespace, whose limits
 * are @root_limits[0..nr_types-1] (each > 0; NULL: all HCOUNT_UNLIMITED).
 * Returns 0 and sets *@treep, or -EINVAL / -ENOMEM.
 */
PERCPUREF_API int hcount_tree_create(struct hcount_tree **treep, unsigned int nr_types,
				     unsigned int batch, const long *root_limits);

/*
 * hcount_tree_destroy - free a tree whose root has no children and no own
 * units left (else -EBUSY, nothing freed).  0 on success; -EINVAL (warned)
 * for a NULL tree.
 */
PERCPUREF_API int hcount_tree_destroy(struct hcount_tree *tree);

/*
 * hcount_tree_check - verify the invariant (see the top of this file) and
 * the registry for every namespace and type.  Meaningful only while no
 * charge, uncharge or set_limit is in progress; excludes creates, destroys
 * and drains itself.  Returns 0, or -EUCLEAN after printing the first
 * violation on stderr; -EINVAL (warned) for a NULL tree.
 */
PERCPUREF_API int hcount_tree_check(struct hcount_tree *tree);

/* hcount_tree_root - the tree's root namespace; NULL for NULL. */
static inline struct hcount_ns *hcount_tree_root(const struct hcount_tree *tree)
{
	return tree ? tree->root : NULL;
}

/*
 * hcount_ns_create - a namespace under @parent with limits @limits[t] for
 * each type (each > 0; NULL: all HCOUNT_UNLIMITED).  A child's limit may be
 * above its parent's: the effective limit is the smallest on the path.
 * Returns 0 and sets *@nsp, or -EINVAL (also when @parent is at depth
 * HCOUNT_DEPTH_MAX) / -ENOMEM.  Takes the tree's mutex.
 */
PERCPUREF_API int hcount_ns_create(struct hcount_ns **nsp, struct hcount_ns *parent,
				   const long *limits);

/*
 * hcount_ns_destroy - give the namespace's caches back to its parent and
 * free it.  -EBUSY (nothing changes) while it has children or own units;
 * -EINVAL for the root (use hcount_tree_destroy()).  Takes the tree's mutex.
 * Once it returned 0, @ns is freed: passing it to any call, destroy
 * included, is undefined (not detected).
 */
PERCPUREF_API int hcount_ns_destroy(struct hcount_ns *ns);

/*
 * hcount_ns_set_limit - set @ns's limit for @type (> 0, else -EINVAL).
 * Lowering it below the usage of @ns's subtree gives -EBUSY and keeps the
 * old limit; when the count with the units cached below @ns is above
 * @limit, those caches are drained before the call decides (they refill
 * on later charges), so they never cause -EBUSY.  No-cache mode: a charge
 * that overlaps the call may be refused against a limit the call then
 * does not keep, and the units a concurrent charge holds for a moment
 * before it fails higher up count as usage here, so the call may return
 * -EBUSY although the usage itself never passed @limit (as the kernel's
 * count would).
 */
PERCPUREF_API int hcount_ns_set_limit(struct hcount_ns *ns, unsigned int type, long limit);

/* Out-of-line halves of the fast paths (refill, give-back, drain, errors). */
PERCPUREF_API int __hcount_charge_slow(struct hcount_ns *ns, unsigned int type, long n,
				       long max);
PERCPUREF_API int __hcount_uncharge_slow(struct hcount_ns *ns, unsigned int type, long n);
PERCPUREF_API void __hcount_slot_lock_contended(struct hcount_slot *s);

static inline long __hcount_get(const long *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);	/* under the slot lock */
}

static inline void __hcount_set(long *p, long v)
{
	__atomic_store_n(p, v, __ATOMIC_RELAXED);	/* under the slot lock */
}

static inline void __hcount_slot_lock(struct hcount_slot *s)
{
	/* Acquire: pairs with the release in __hcount_slot_unlock(). */
	if (percpuref_unlikely(__atomic_exchange_n(&s->lock, 1, __ATOMIC_ACQUIRE)))
		__hcount_slot_lock_contended(s);
}

static inline void __hcount_slot_unlock(struct hcount_slot *s)
{
	/* Release: publishes the slot's fields to the next holder. */
	__atomic_store_n(&s->lock, 0, __ATOMIC_RELEASE);
}

/*
 * hcount_charge_max - charge @n (> 0) units of @type at @ns, refusing when
 * the usage of @ns would pass min(limit, @max) (@max >= 0, the caller's own
 * limit, e.g. its rlimit; 0 refuses everything) or an ancestor's would pass
 * its limit.  Returns 0, -EDQUOT (refused: no own() or limit changed) or
 * -EINVAL.
 * Cache mode, units in the cache: one lock round trip on @ns's slot line.
 * Otherwise the slow path (refill from the parent chain; drain on refusal;
 * no-cache mode walks to the root with atomics).  Any thread.
 */
static inline int hcount_charge_max(struct hcount_ns *ns, unsigned int type, long n, long max)
{
	struct hcount_slot *s;
	long count, cached, lim;

	if (percpuref_unlikely(!ns || !ns->fast || type >= ns->nr_types || n <= 0 || max < 0))
		return __hcount_charge_slow(ns, type, n, max);
	s = &ns->slots[type];
	__hcount_slot_lock(s);
	count = __hcount_get(&s->count);
	cached = __hcount_get(&s->cached);
	lim = __hcount_get(&s->limit);
	if (max < lim)
		lim = max;
	if (percpuref_likely(cached >= n && n <= lim - count)) {
		__hcount_set(&s->count, count + n);
		__hcount_set(&s->cached, cached - n);
		__hcount_set(&s->own, __hcount_get(&s->own) + n);
		__hcount_slot_unlock(s);
		return 0;
	}
	__hcount_slot_unlock(s);
	return __hcount_charge_slow(ns, type, n, max);
}

/*
 * hcount_charge - hcount_charge_max() without a caller limit.  Its warnings
 * name hcount_charge, and so do hcount_charge_max()'s with @max
 * HCOUNT_UNLIMITED: that is the same call.
 */
static inline int hcount_charge(struct hcount_ns *ns, unsigned int type, long n)
{
	return hcount_charge_max(ns, type, n, HCOUNT_UNLIMITED);
}

/*
 * hcount_uncharge - give back @n (> 0) units of @type charged at @ns.
 * Returns 0, -EINVAL, or -ERANGE when @n is above own(@ns) (nothing
 * changes).  Cache mode: the units go to @ns's cache, one lock round trip on
 * @ns's slot line, unless the cache passes 2 * batch (then all but batch go
 * to the parent) or a drain runs above @ns.  No-cache mode: walks to the root.
 */
static inline int hcount_uncharge(struct hcount_ns *ns, unsigned int type, long n)
{
	struct hcount_slot *s;
	long own, cached;

	if (percpuref_unlikely(!ns || !ns->fast || type >= ns->nr_types || n <= 0))
		return __hcount_uncharge_slow(ns, type, n);
	s = &ns->slots[type];
	__hcount_slot_lock(s);
	own = __hcount_get(&s->own);
	cached = __hcount_get(&s->cached);
	/*
	 * Relaxed: the slot lock orders this load against the drainer's
	 * store (docs/hcount.md, "Exactness").  n <= own bounds cached + n:
	 * both are charged to the parent, whose count is a long.
	 */
	if (percpuref_likely(n <= own && cached + n <= 2 * (long)ns->batch &&
			     !__atomic_load_n(&s->draining, __ATOMIC_RELAXED))) {
		__hcount_set(&s->own, own - n);
		__hcount_set(&s->count, __hcount_get(&s->count) - n);
		__hcount_set(&s->cached, cached + n);
		__hcount_slot_unlock(s);
		return 0;
	}
	__hcount_slot_unlock(s);
	return __hcount_uncharge_slow(ns, type, n);
}

/*
 * Read-outs: a relaxed snapshot of one field (exact when quiescent), or
 * -EINVAL for a NULL namespace or a bad type (not warned).  count: units
 * charged to @ns (own units and all that its children hold); cached: units
 * of @ns's cache; own: units charged at @ns itself; limit: @ns's limit.
 */
static inline long hcount_ns_count(const struct hcount_ns *ns, unsigned int type)
{
	return ns && type < ns->nr_types
		       ? __atomic_load_n(&ns->slots[type].count, __ATOMIC_RELAXED)
		       : -EINVAL;
}

static inline long hcount_ns_cached(const struct hcount_ns *ns, unsigned int type)
{
	return ns && type < ns->nr_types
		       ? __atomic_load_n(&ns->slots[type].cached, __ATOMIC_RELAXED)
		       : -EINVAL;
}

static inline long hcount_ns_own(const struct hcount_ns *ns, unsigned int type)
{
	return ns && type < ns->nr_types
		       ? __atomic_load_n(&ns->slots[type].own, __ATOMIC_RELAXED)
		       : -EINVAL;
}

static inline long hcount_ns_limit(const struct hcount_ns *ns, unsigned int type)
{
	return ns && type < ns->nr_types
		       ? __atomic_load_n(&ns->slots[type].limit, __ATOMIC_RELAXED)
		       : -EINVAL;
}

/* hcount_ns_parent - @ns's parent; NULL for the root (and for NULL). */
static inline struct hcount_ns *hcount_ns_parent(const struct hcount_ns *ns)
{
	return ns ? ns->parent : NULL;
}

PERCPUREF_END_DECLS

#endif
