/* SPDX-License-Identifier: MIT */
/*
 * hcount.c - slow paths of the hierarchical charge counters.
 *
 * The object.  A tree of namespaces; each namespace has, per resource type,
 * one slot (its own cache line) holding limit, count, cached and own
 * (include/percpuref/hcount.h defines them).  The invariant, exact whenever
 * no call is in progress:
 *
 *   count(ns) = own(ns) + sum over children c of (count(c) + cached(c))
 *   0 <= own, 0 <= cached (0 at the root), count(ns) <= limit(ns)
 *
 * Every unit lies in exactly one own() or cached(), and is counted once in
 * count() of every level above where it lies: nothing is lost or created.
 *
 * Cache mode: all of a slot's fields change together under the slot's lock,
 * so a slot is always self-consistent.  Units move between a namespace and
 * its parent only with both slots locked, child first.  Locks are always
 * taken from a namespace towards the root (a thread holds a chain and only
 * ever adds the parent of the highest slot it holds), so there is no cycle
 * and no deadlock.  The four moves:
 *
 *   charge (fast)   cached(ns) -= n, own(ns) += n, count(ns) += n: one lock.
 *   refill          the chain ns, parent, ... is locked upwards until a
 *                   level can serve the units from its cache (or is the
 *                   root); every level is checked against its limit before
 *                   anything is written, then all levels commit.  A charge
 *                   never writes a level and then takes it back, so not
 *                   even a read-out sees units of a charge that will fail
 *                   (no other call could: the walk holds each level's
 *                   lock until it commits or gives up).
 *   give back       hand over hand upwards: a cache above 2 * batch keeps
 *                   batch and moves the rest to the parent's cache.
 *   drain           a refused level f: under the tree mutex, every cache
 *                   strictly below f is moved up one level, children before
 *                   parents (post-order), so all of it reaches f.
 *
 * Exactness.  Caches inflate count() of the levels above them, so a charge
 * that meets a full level f first retries without batches (a refill then
 * takes exactly what it needs), then drains below f and retries (unless
 * own(f) + n alone passes f's limit: no drain can help then, and a task
 * refused again and again at its rlimit must not empty its descendants'
 * caches each time); if the
 * retry is refused at a level at or below f the refusal is final, else it
 * drains below that higher level and retries again (at most depth times).
 * The drain marks each namespace strictly below f (its slot's `draining`)
 * when it visits it, under that slot's lock, and unmarks them all once the
 * charge is decided.  A refill starting at a marked namespace takes no
 * batch; a give-back moves all of a marked level's cache up, level after
 * level, and stops only at an unmarked one.  So no cache below f fills
 * again behind the drain: a refill reads the mark of the namespace x it
 * starts from while holding x's lock, and holds the whole chain from x up
 * while it writes.  If it locked x after the visit of x, the lock orders
 * the mark before its read, and it adds no batch anywhere.  If before, the
 * visit of x waits for it, and the post-order visits every ancestor of x
 * below f later still, moving the batches it left there.  A give-back
 * reads each level's mark under that level's lock, so it leaves units
 * only at a level not visited yet (whose visit moves them) or above f.
 * Marks stay within f's subtree: namespaces elsewhere see no drain (a
 * single flag for the tree once sent every uncharge of every tenant to the
 * root while any tenant was being refused).  So after the drain, count(f)
 * = usage of f's subtree + units of charges and uncharges in progress; the
 * charges among them succeed.
 *
 * No-cache mode: no locks.  A charge adds n to count() of each level from ns
 * to the root with a compare-and-swap that checks the limit, and subtracts
 * it again from the levels below one that refuses; own(ns) changes after the
 * walk (charge) or before it (uncharge, a compare-and-swap that refuses to
 * go below zero).  So that no count ever dips below the units it holds (a
 * dip would let another charge pass a limit), the charge adds to own(ns)
 * with release and the uncharge takes from it with acquire: an uncharge
 * that takes a charge's units happens after that charge's additions, and
 * its subtractions follow them in each count's modification order.  Beyond
 * that the counts are pure counters: relaxed atomics suffice for them,
 * except against hcount_ns_set_limit() (see there).
 *
 * The tree mutex protects the registry of children (create, destroy, and
 * the drain's traversal) and serialises drains; no fast path takes it.
 *
 * SPIN checks the drains (tests/model/hcount.pml, Model O: charges and
 * uncharges are linearizable, refusals included; mutants without the
 * marks, the give-back's respect of them, the post-order, the mutex, the
 * fast path's limit test or the retry's bound fail) and the no-cache
 * lowering (hcount_limit.pml, Model P); docs/model.md.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <percpuref/hcount.h>

#include "internal.h"

/*
 * Fault injection for the tests (declared extern there): when >= 0, the
 * allocation after this many more succeeds fails, and the hook disarms.
 */
long __hcount_fault_alloc = -1;

static void *hc_alloc(size_t size)
{
	/* Relaxed: set by a test before the calls it wants to fail. */
	long left = __atomic_load_n(&__hcount_fault_alloc, __ATOMIC_RELAXED);

	if (left >= 0) {
		__atomic_store_n(&__hcount_fault_alloc, left - 1, __ATOMIC_RELAXED);
		if (left == 0)
			return NULL;
	}
	size = (size + PERCPUREF_CACHELINE - 1) & ~(size_t)(PERCPUREF_CACHELINE - 1);
	return aligned_alloc(PERCPUREF_CACHELINE, size);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#else
	percpuref_barrier();
#endif
}

/*
 * Contended slot lock: spin on a plain load for a while, then yield, so a
 * holder that was preempted inside its few-instruction section gets the CPU
 * back (2-CPU machines, valgrind's serialised threads); after
 * SLOT_LOCK_YIELDS yields, sleep between tries.  sched_yield() gives the
 * CPU only to threads of the caller's priority: a real-time waiter that
 * preempted a holder of lower priority on its CPU spun for ever, yielding
 * to nobody (tests/unit/test_hcount.c, "rt").  A sleep lets any holder run;
 * it runs with cancellation disabled, as hcount is no cancellation point.
 */
#define SLOT_LOCK_SPINS 128
#define SLOT_LOCK_YIELDS 64

void __hcount_slot_lock_contended(struct hcount_slot *s)
{
	unsigned int spins = 0, yields = 0;

	do {
		/* Relaxed: only a hint; the exchange below acquires. */
		while (__atomic_load_n(&s->lock, __ATOMIC_RELAXED)) {
			if (++spins < SLOT_LOCK_SPINS) {
				cpu_relax();
				continue;
			}
			spins = 0;
			if (yields < SLOT_LOCK_YIELDS) {
				yields++;
				sched_yield();
			} else {
				/*
				 * nanosleep() is a cancellation point: a
				 * thread cancelled here would die holding
				 * the chain of slots below this one, or the
				 * tree mutex (internal.h, "Cancellation").
				 */
				int cancel = percpuref_cancel_disable();

				percpuref_sleep_us(20);
				percpuref_cancel_restore(cancel);
			}
		}
		/* Acquire: pairs with the release in __hcount_slot_unlock(). */
	} while (__atomic_exchange_n(&s->lock, 1, __ATOMIC_ACQUIRE));
}

static inline struct hcount_slot *slot(struct hcount_ns *ns, unsigned int type)
{
	return &ns->slots[type];
}

static inline long lmin(long a, long b)
{
	return a < b ? a : b;
}

/* Unlocks type's slots of @from and its ancestors up to @to (inclusive). */
static void unlock_chain(struct hcount_ns *from, struct hcount_ns *to, unsigned int type)
{
	for (;; from = from->parent) {
		__hcount_slot_unlock(slot(from, type));
		if (from == to)
			return;
	}
}

/* Units a level asks its parent for when it lacks @need: plus a batch. */
static long refill_amount(long need, unsigned int batch, bool surplus)
{
	if (surplus && need <= LONG_MAX - (long)batch)
		return need + (long)batch;
	return need;
}

/*
 * chain_charge - charge @n at @ns (its own units), refilling caches up the
 * chain as needed, with batches if @surplus and no drain runs.  Returns NULL
 * on success, or the level that refused, with *@drainable telling whether
 * it had children (caches that may inflate its count) when it refused.
 * Cache mode only.
 */
static struct hcount_ns *chain_charge(struct hcount_ns *ns, unsigned int type, long n, long max,
				      bool surplus, bool *drainable)
{
	unsigned int batch = ns->batch;
	struct hcount_ns *y = ns, *top;
	struct hcount_slot *s;
	long amt = n, lim;

	__hcount_slot_lock(slot(ns, type));
	/* Relaxed: ordered by ns's slot lock against the drainer (top comment). */
	if (__atomic_load_n(&slot(ns, type)->draining, __ATOMIC_RELAXED))
		surplus = false;
	lim = lmin(__hcount_get(&slot(ns, type)->limit), max);
	/* Walk up, locking, until a level can serve amt; check every level. */
	for (;;) {
		long count, cached;

		s = slot(y, type);
		count = __hcount_get(&s->count);
		cached = __hcount_get(&s->cached);
		if (amt > lim - count) {
			/*
			 * Relaxed: a child's creation precedes any refill from
			 * y.  A drain only takes the caches below y out of its
			 * count: it cannot help when y's own units and n pass
			 * the limit already (usage(y) >= own(y)).
			 */
			*drainable = __atomic_load_n(&y->nr_children, __ATOMIC_RELAXED) != 0 &&
				     n <= lim - __hcount_get(&s->own);
			unlock_chain(ns, y, type);
			return y;
		}
		if (!y->parent || cached >= amt)
			break;
		amt = refill_amount(amt - cached, batch, surplus);
		y = y->parent;
		__hcount_slot_lock(slot(y, type));
		lim = __hcount_get(&slot(y, type)->limit);
	}
	top = y;
	/* Commit: recompute the same amounts from the same locked state. */
	amt = n;
	for (y = ns;; y = y->parent) {
		long cached;

		s = slot(y, type);
		cached = __hcount_get(&s->cached);
		__hcount_set(&s->count, __hcount_get(&s->count) + amt);
		if (y == top) {
			if (y->parent)
				__hcount_set(&s->cached, cached - amt);
			break;
		}
		long r = refill_amount(amt - cached, batch, surplus);

		__hcount_set(&s->cached, cached + r - amt);
		amt = r;
	}
	s = slot(ns, type);
	__hcount_set(&s->own, __hcount_get(&s->own) + n);
	unlock_chain(ns, top, type);
	return NULL;
}

/*
 * give_back_unlock - with @y's slot locked, move cache above the high-water
 * mark (2 * batch, trimmed to batch; everything from a level a drain runs
 * above) to the parent, hand over hand up the chain; returns with no slot
 * locked.
 */
static void give_back_unlock(struct hcount_ns *y, unsigned int type)
{
	for (;;) {
		struct hcount_slot *s = slot(y, type), *ps;
		struct hcount_ns *p = y->parent;
		long cached = __hcount_get(&s->cached);
		/* Relaxed: ordered by y's slot lock against the drainer. */
		bool all = __atomic_load_n(&s->draining, __ATOMIC_RELAXED);
		long hiwat = all ? 0 : 2 * (long)y->batch;
		long keep = all ? 0 : (long)y->batch;

		if (!p || cached <= hiwat) {
			__hcount_slot_unlock(s);
			return;
		}
		ps = slot(p, type);
		__hcount_slot_lock(ps);
		__hcount_set(&ps->count, __hcount_get(&ps->count) - (cached - keep));
		if (p->parent)
			__hcount_set(&ps->cached, __hcount_get(&ps->cached) + (cached - keep));
		__hcount_set(&s->cached, keep);
		__hcount_slot_unlock(s);
		y = p;
	}
}

/* Moves @y's whole cache into its parent's (the parent's count drops);
 * for a drain (@mark), marks @y as below one, in the same lock hold. */
static void drain_one(struct hcount_ns *y, unsigned int type, bool mark)
{
	struct hcount_slot *s = slot(y, type), *ps = slot(y->parent, type);
	long cached;

	__hcount_slot_lock(s);
	if (mark)
		/* Relaxed: read under this lock (top comment). */
		__atomic_store_n(&s->draining, 1, __ATOMIC_RELAXED);
	__hcount_slot_lock(ps);
	cached = __hcount_get(&s->cached);
	__hcount_set(&ps->count, __hcount_get(&ps->count) - cached);
	if (y->parent->parent)
		__hcount_set(&ps->cached, __hcount_get(&ps->cached) + cached);
	__hcount_set(&s->cached, 0);
	__hcount_slot_unlock(ps);
	__hcount_slot_unlock(s);
}

/*
 * Walks of the namespaces strictly below @top, tree mutex held (the
 * registry is stable).  Without recursion: a tree may be HCOUNT_DEPTH_MAX
 * deep, and a walk that recursed once per level overflowed small thread
 * stacks.  Post-order: every namespace after all of its descendants.
 */
static struct hcount_ns *leftmost_leaf(struct hcount_ns *ns)
{
	while (ns->first_child)
		ns = ns->first_child;
	return ns;
}

static struct hcount_ns *postorder_first(struct hcount_ns *top)
{
	return top->first_child ? leftmost_leaf(top->first_child) : NULL;
}

static struct hcount_ns *postorder_next(struct hcount_ns *ns, struct hcount_ns *top)
{
	if (ns->next_sibling)
		return leftmost_leaf(ns->next_sibling);
	return ns->parent == top ? NULL : ns->parent;
}

#define for_each_below_postorder(ns, top) \
	for ((ns) = postorder_first(top); (ns); (ns) = postorder_next((ns), (top)))

/* Post-order: every cache strictly below @f ends in f's cache.  Tree mutex. */
static void drain_below(struct hcount_ns *f, unsigned int type)
{
	struct hcount_ns *c;

	for_each_below_postorder(c, f)
		drain_one(c, type, true);
}

/* Clears the marks drain_one() left strictly below @f.  Tree mutex. */
static void unmark_below(struct hcount_ns *f, unsigned int type)
{
	struct hcount_ns *c;

	for_each_below_postorder(c, f) {
		struct hcount_slot *s = slot(c, type);

		__hcount_slot_lock(s);
		/* Relaxed: read under this lock; a stale mark would only
		 * cost a batch-less refill or a full give-back. */
		__atomic_store_n(&s->draining, 0, __ATOMIC_RELAXED);
		__hcount_slot_unlock(s);
	}
}

/* Ends the drains below @f (the highest level drained); tree mutex. */
static void drain_end(struct hcount_ns *f, unsigned int type)
{
	unmark_below(f, type);
	/* f collected the caches below it; give back its excess as usual. */
	__hcount_slot_lock(slot(f, type));
	give_back_unlock(f, type);
}

/* The charge met a full level @f that has caches below it: drain, retry. */
static int charge_drain_retry(struct hcount_ns *ns, unsigned int type, long n, long max,
			      struct hcount_ns *f)
{
	struct hcount_tree *tree = ns->tree;
	struct hcount_ns *drained;
	bool drainable;
	int ret;

	pthread_mutex_lock(&tree->mutex);
	for (;;) {
		drain_below(f, type);
		drained = f;
		f = chain_charge(ns, type, n, max, false, &drainable);
		if (!f) {
			ret = 0;
			break;
		}
		/* f is on ns's path: at or below `drained` means drained. */
		if (f->depth >= drained->depth || !drainable) {
			ret = -EDQUOT;
			break;
		}
	}
	drain_end(drained, type);
	pthread_mutex_unlock(&tree->mutex);
	return ret;
}

static int nocache_charge(struct hcount_ns *ns, unsigned int type, long n, long max)
{
	struct hcount_ns *y, *z;

	for (y = ns; y; y = y->parent) {
		struct hcount_slot *s = slot(y, type);
		/* Relaxed: a pure counter; the limit check is below. */
		long lim = __atomic_load_n(&s->limit, __ATOMIC_RELAXED);
		long c = __atomic_load_n(&s->count, __ATOMIC_RELAXED);

		if (y == ns)
			lim = lmin(lim, max);
		do {
			if (n > lim - c)
				goto refuse;
			/*
			 * Seq_cst, and the seq_cst load of the limit after it:
			 * pairs with set_limit's exchange of the limit and
			 * load of the count (Dekker): a lowering either sees
			 * this count or this charge sees the lowered limit.
			 */
		} while (!__atomic_compare_exchange_n(&s->count, &c, c + n, false,
						      __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
		if (c + n > __atomic_load_n(&s->limit, __ATOMIC_SEQ_CST)) {
			/* Relaxed: takes back the units added just above. */
			__atomic_fetch_sub(&s->count, n, __ATOMIC_RELAXED);
			goto refuse;
		}
	}
	/*
	 * Release: pairs with nocache_uncharge()'s acquire CAS of own, so an
	 * uncharge of these units takes them off each count after this walk
	 * added them there, never before.
	 */
	__atomic_fetch_add(&slot(ns, type)->own, n, __ATOMIC_RELEASE);
	return 0;
refuse:
	for (z = ns; z != y; z = z->parent)
		/* Relaxed: returns units this call added. */
		__atomic_fetch_sub(&slot(z, type)->count, n, __ATOMIC_RELAXED);
	return -EDQUOT;
}

static int nocache_uncharge(struct hcount_ns *ns, unsigned int type, long n)
{
	struct hcount_slot *s = slot(ns, type);
	/* Relaxed: the CAS below decides. */
	long own = __atomic_load_n(&s->own, __ATOMIC_RELAXED);
	struct hcount_ns *y;

	do {
		if (n > own)
			return -ERANGE;
		/*
		 * Acquire on success: pairs with nocache_charge()'s release
		 * add of own, so the subtractions below come after the
		 * additions of the charges whose units this takes.
		 */
	} while (!__atomic_compare_exchange_n(&s->own, &own, own - n, false, __ATOMIC_ACQUIRE,
					      __ATOMIC_RELAXED));
	for (y = ns; y; y = y->parent)
		/* Relaxed: pure counter. */
		__atomic_fetch_sub(&slot(y, type)->count, n, __ATOMIC_RELAXED);
	return 0;
}

int __hcount_charge_slow(struct hcount_ns *ns, unsigned int type, long n, long max)
{
	/* hcount_charge() passes no limit of its own. */
	const char *call = max == HCOUNT_UNLIMITED ? "hcount_charge" : "hcount_charge_max";
	struct hcount_ns *f;
	bool drainable;

	if (!ns) {
		percpuref_warn(call, "no namespace");
		return -EINVAL;
	}
	if (type >= ns->nr_types || n <= 0 || max < 0) {
		percpuref_warn(call, "namespace %p: bad type %u, n %ld or max %ld", (void *)ns, type,
			       n, max);
		return -EINVAL;
	}
	if (!ns->batch)
		return nocache_charge(ns, type, n, max);
	f = chain_charge(ns, type, n, max, true, &drainable);
	/* A batch may have been what did not fit above ns: try without. */
	if (f && f != ns)
		f = chain_charge(ns, type, n, max, false, &drainable);
	if (!f)
		return 0;
	if (!drainable)
		return -EDQUOT;
	return charge_drain_retry(ns, type, n, max, f);
}

int __hcount_uncharge_slow(struct hcount_ns *ns, unsigned int type, long n)
{
	struct hcount_slot *s;
	long own;
	int ret;

	if (!ns) {
		percpuref_warn("hcount_uncharge", "no namespace");
		return -EINVAL;
	}
	if (type >= ns->nr_types || n <= 0) {
		percpuref_warn("hcount_uncharge", "namespace %p: bad type %u or n %ld", (void *)ns,
			       type, n);
		return -EINVAL;
	}
	if (!ns->batch) {
		ret = nocache_uncharge(ns, type, n);
		if (ret)
			percpuref_warn("hcount_uncharge",
				       "namespace %p type %u: %ld units, more than charged",
				       (void *)ns, type, n);
		return ret;
	}
	s = slot(ns, type);
	__hcount_slot_lock(s);
	own = __hcount_get(&s->own);
	if (n > own) {
		__hcount_slot_unlock(s);
		percpuref_warn("hcount_uncharge",
			       "namespace %p type %u: %ld units, only %ld charged", (void *)ns,
			       type, n, own);
		return -ERANGE;
	}
	__hcount_set(&s->own, own - n);
	__hcount_set(&s->count, __hcount_get(&s->count) - n);
	if (ns->parent)
		__hcount_set(&s->cached, __hcount_get(&s->cached) + n);
	give_back_unlock(ns, type);
	return 0;
}

int hcount_ns_set_limit(struct hcount_ns *ns, unsigned int type, long limit)
{
	struct hcount_tree *tree;
	struct hcount_slot *s;
	bool drainable, ok;
	long old;

	if (!ns) {
		percpuref_warn("hcount_ns_set_limit", "no namespace");
		return -EINVAL;
	}
	if (type >= ns->nr_types || limit <= 0) {
		percpuref_warn("hcount_ns_set_limit", "namespace %p: bad type %u or limit %ld",
			       (void *)ns, type, limit);
		return -EINVAL;
	}
	tree = ns->tree;
	s = slot(ns, type);
	if (!ns->batch) {
		/* The mutex serialises setters, so restoring `old` is safe. */
		pthread_mutex_lock(&tree->mutex);
		/*
		 * Seq_cst exchange, then load: pairs with nocache_charge()
		 * (Dekker).  An exchange, not a store, for qemu-user, which
		 * lets a seq_cst store pass a later seq_cst load (deferred.c).
		 */
		old = __atomic_exchange_n(&s->limit, limit, __ATOMIC_SEQ_CST);
		ok = __atomic_load_n(&s->count, __ATOMIC_SEQ_CST) <= limit;
		if (!ok)
			/* Relaxed: a charge that saw the lower limit was refused. */
			__atomic_store_n(&s->limit, old, __ATOMIC_RELAXED);
		pthread_mutex_unlock(&tree->mutex);
		return ok ? 0 : -EBUSY;
	}
	__hcount_slot_lock(s);
	ok = __hcount_get(&s->count) <= limit;
	if (ok)
		__hcount_set(&s->limit, limit);
	/* Relaxed: read under the slot lock, see chain_charge(). */
	drainable = __atomic_load_n(&ns->nr_children, __ATOMIC_RELAXED) != 0;
	__hcount_slot_unlock(s);
	if (ok || !drainable)
		return ok ? 0 : -EBUSY;
	pthread_mutex_lock(&tree->mutex);
	drain_below(ns, type);
	__hcount_slot_lock(s);
	ok = __hcount_get(&s->count) <= limit;
	if (ok)
		__hcount_set(&s->limit, limit);
	__hcount_slot_unlock(s);
	drain_end(ns, type);
	pthread_mutex_unlock(&tree->mutex);
	return ok ? 0 : -EBUSY;
}

/* @what and @obj name the object in the warning: the root limits array,
 * or the parent of the new namespace. */
static bool limits_valid(const char *fn, const char *what, const void *obj,
			 unsigned int nr_types, const long *limits)
{
	unsigned int t;

	for (t = 0; limits && t < nr_types; t++) {
		if (limits[t] <= 0) {
			percpuref_warn(fn, "%s %p type %u: limit %ld is not positive", what, obj, t,
				       limits[t]);
			return false;
		}
	}
	return true;
}

/* One allocation: the namespace, then its slots on their own lines. */
static struct hcount_ns *ns_alloc(struct hcount_tree *tree, struct hcount_ns *parent,
				  const long *limits)
{
	size_t head = (sizeof(struct hcount_ns) + PERCPUREF_CACHELINE - 1) &
		      ~(size_t)(PERCPUREF_CACHELINE - 1);
	struct hcount_ns *ns = hc_alloc(head + tree->nr_types * sizeof(struct hcount_slot));
	unsigned int t;

	if (!ns)
		return NULL;
	memset(ns, 0, head + tree->nr_types * sizeof(struct hcount_slot));
	ns->slots = (struct hcount_slot *)((char *)ns + head);
	ns->tree = tree;
	ns->parent = parent;
	ns->nr_types = tree->nr_types;
	ns->batch = tree->batch;
	ns->fast = tree->batch && parent;
	ns->depth = parent ? parent->depth + 1 : 0;
	for (t = 0; t < tree->nr_types; t++)
		ns->slots[t].limit = limits ? limits[t] : HCOUNT_UNLIMITED;
	return ns;
}

int hcount_tree_create(struct hcount_tree **treep, unsigned int nr_types, unsigned int batch,
		       const long *root_limits)
{
	struct hcount_tree *tree;

	if (!treep) {
		percpuref_warn("hcount_tree_create", "no result pointer");
		return -EINVAL;
	}
	if (nr_types == 0 || nr_types > HCOUNT_TYPES_MAX || batch > HCOUNT_BATCH_MAX) {
		percpuref_warn("hcount_tree_create", "bad nr_types %u or batch %u", nr_types,
			       batch);
		return -EINVAL;
	}
	if (!limits_valid("hcount_tree_create", "root limits", root_limits, nr_types, root_limits))
		return -EINVAL;
	tree = hc_alloc(sizeof(*tree));
	if (!tree)
		return -ENOMEM;
	memset(tree, 0, sizeof(*tree));
	tree->nr_types = nr_types;
	tree->batch = batch;
	tree->root = ns_alloc(tree, NULL, root_limits);
	if (!tree->root) {
		free(tree);
		return -ENOMEM;
	}
	pthread_mutex_init(&tree->mutex, NULL);
	*treep = tree;
	return 0;
}

int hcount_tree_destroy(struct hcount_tree *tree)
{
	struct hcount_ns *root;
	unsigned int t;

	if (!tree) {
		percpuref_warn("hcount_tree_destroy", "no tree");
		return -EINVAL;
	}
	root = tree->root;
	pthread_mutex_lock(&tree->mutex);
	if (root->nr_children) {
		/* Read under the mutex: a create or destroy beside us writes it. */
		unsigned int nr_children = root->nr_children;

		pthread_mutex_unlock(&tree->mutex);
		percpuref_warn("hcount_tree_destroy", "tree %p: root still has %u children",
			       (void *)tree, nr_children);
		return -EBUSY;
	}
	for (t = 0; t < tree->nr_types; t++) {
		long own = hcount_ns_own(root, t);

		if (own) {
			pthread_mutex_unlock(&tree->mutex);
			percpuref_warn("hcount_tree_destroy",
				       "tree %p type %u: %ld units still charged", (void *)tree, t,
				       own);
			return -EBUSY;
		}
	}
	pthread_mutex_unlock(&tree->mutex);
	pthread_mutex_destroy(&tree->mutex);
	free(root);
	free(tree);
	return 0;
}

int hcount_ns_create(struct hcount_ns **nsp, struct hcount_ns *parent, const long *limits)
{
	struct hcount_tree *tree;
	struct hcount_ns *ns;

	if (!nsp || !parent) {
		percpuref_warn("hcount_ns_create", "no %s", nsp ? "parent" : "result pointer");
		return -EINVAL;
	}
	tree = parent->tree;
	if (parent->depth >= HCOUNT_DEPTH_MAX) {
		percpuref_warn("hcount_ns_create", "parent %p is at the maximum depth %u",
			       (void *)parent, HCOUNT_DEPTH_MAX);
		return -EINVAL;
	}
	if (!limits_valid("hcount_ns_create", "child of namespace", parent, tree->nr_types,
			  limits))
		return -EINVAL;
	ns = ns_alloc(tree, parent, limits);
	if (!ns)
		return -ENOMEM;
	pthread_mutex_lock(&tree->mutex);
	ns->next_sibling = parent->first_child;
	if (ns->next_sibling)
		ns->next_sibling->pprev = &ns->next_sibling;
	parent->first_child = ns;
	ns->pprev = &parent->first_child;
	/* Relaxed: read under slot locks; see chain_charge(). */
	__atomic_store_n(&parent->nr_children, parent->nr_children + 1, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&tree->mutex);
	*nsp = ns;
	return 0;
}

int hcount_ns_destroy(struct hcount_ns *ns)
{
	struct hcount_tree *tree;
	struct hcount_ns *p;
	unsigned int t;

	if (!ns || !ns->parent) {
		percpuref_warn("hcount_ns_destroy", "namespace %p is %s", (void *)ns,
			       ns ? "the root" : "NULL");
		return -EINVAL;
	}
	tree = ns->tree;
	p = ns->parent;
	pthread_mutex_lock(&tree->mutex);
	if (ns->nr_children) {
		/* Read under the mutex: a create or destroy beside us writes it. */
		unsigned int nr_children = ns->nr_children;

		pthread_mutex_unlock(&tree->mutex);
		percpuref_warn("hcount_ns_destroy", "namespace %p still has %u children",
			       (void *)ns, nr_children);
		return -EBUSY;
	}
	for (t = 0; t < tree->nr_types; t++) {
		long own = hcount_ns_own(ns, t);

		if (own) {
			pthread_mutex_unlock(&tree->mutex);
			percpuref_warn("hcount_ns_destroy",
				       "namespace %p type %u: %ld units still charged", (void *)ns,
				       t, own);
			return -EBUSY;
		}
	}
	/* No children and no own units: count(ns) == 0; only the cache is left. */
	for (t = 0; t < tree->nr_types && tree->batch; t++) {
		drain_one(ns, t, false);
		__hcount_slot_lock(slot(p, t));
		give_back_unlock(p, t);
	}
	*ns->pprev = ns->next_sibling;
	if (ns->next_sibling)
		ns->next_sibling->pprev = ns->pprev;
	/* Relaxed: read under slot locks; see chain_charge(). */
	__atomic_store_n(&p->nr_children, p->nr_children - 1, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&tree->mutex);
	free(ns);
	return 0;
}

/* One namespace's links to its children and its counts; tree mutex. */
static int check_ns(struct hcount_ns *ns)
{
	struct hcount_ns *c;
	unsigned int t, nr = 0;

	for (c = ns->first_child; c; c = c->next_sibling) {
		if (c->parent != ns || c->depth != ns->depth + 1 || *c->pprev != c) {
			percpuref_warn("hcount_tree_check", "namespace %p: bad links to child %p",
				       (void *)ns, (void *)c);
			return -EUCLEAN;
		}
		nr++;
	}
	if (nr != ns->nr_children) {
		percpuref_warn("hcount_tree_check", "namespace %p: %u children listed, %u counted",
			       (void *)ns, nr, ns->nr_children);
		return -EUCLEAN;
	}
	for (t = 0; t < ns->nr_types; t++) {
		long count = hcount_ns_count(ns, t), own = hcount_ns_own(ns, t);
		long cached = hcount_ns_cached(ns, t), limit = hcount_ns_limit(ns, t);
		long below = 0, sum;
		/* A corrupt tree's sums may overflow: that is a finding too. */
		bool overflow = false;

		for (c = ns->first_child; c; c = c->next_sibling)
			overflow |= __builtin_add_overflow(below, hcount_ns_count(c, t), &below) ||
				    __builtin_add_overflow(below, hcount_ns_cached(c, t), &below);
		overflow |= __builtin_add_overflow(own, below, &sum);
		if (overflow) {
			percpuref_warn("hcount_tree_check",
				       "namespace %p type %u: own and children's counts add up "
				       "beyond a long's range", (void *)ns, t);
			return -EUCLEAN;
		}
		if (own < 0 || cached < 0 || (cached && (!ns->parent || !ns->batch)) ||
		    count > limit || count != sum) {
			percpuref_warn("hcount_tree_check",
				       "namespace %p type %u: count %ld, own %ld, children %ld, "
				       "cached %ld, limit %ld",
				       (void *)ns, t, count, own, below, cached, limit);
			return -EUCLEAN;
		}
		/* Relaxed: quiescent, as the fields above. */
		if (__atomic_load_n(&slot(ns, t)->draining, __ATOMIC_RELAXED)) {
			percpuref_warn("hcount_tree_check",
				       "namespace %p type %u: marked as below a drain, with none "
				       "running", (void *)ns, t);
			return -EUCLEAN;
		}
	}
	return 0;
}

/*
 * Pre-order, without recursion (see postorder_next()): a namespace's links
 * to its children are checked before the walk enters them, so the climb
 * back through ->parent follows checked links only.
 */
static struct hcount_ns *preorder_next(struct hcount_ns *ns)
{
	if (ns->first_child)
		return ns->first_child;
	for (; ns->parent; ns = ns->parent)
		if (ns->next_sibling)
			return ns->next_sibling;
	return NULL;
}

int hcount_tree_check(struct hcount_tree *tree)
{
	struct hcount_ns *ns;
	int ret;

	if (!tree) {
		percpuref_warn("hcount_tree_check", "no tree");
		return -EINVAL;
	}
	pthread_mutex_lock(&tree->mutex);
	for (ns = tree->root, ret = 0; ns && !ret; ns = preorder_next(ns))
		ret = check_ns(ns);
	pthread_mutex_unlock(&tree->mutex);
	return ret;
}
