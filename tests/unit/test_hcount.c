/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of <percpuref/hcount.h>: exact cache arithmetic of the fast and
 * slow paths, exact limits with caches in the way (drains), the caller's own
 * limit, no-cache mode, misuse (error code and no change), allocation
 * failure, conservation after destruction, and that hcount_tree_check()
 * notices a broken invariant, and that a contended slot lock gives the CPU
 * to a preempted holder of lower real-time priority.  Single-threaded but
 * for that last one; tests/stress/stress_hcount.c does the concurrent part.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <percpuref/hcount.h>

#include "capture.h"
#include "child.h"
#include "tap.h"

/* src/hcount.c: the allocation after this many more fails (-1: off). */
extern long __hcount_fault_alloc;

#define MAX_NS 16
#define MAX_TYPES 3

/* Every field of every namespace: "changes nothing" is snapshot equality. */
struct snap {
	long v[MAX_NS][MAX_TYPES][4];
};

static void snap_take(struct snap *s, struct hcount_ns **ns, int nr, unsigned int types)
{
	memset(s, 0, sizeof(*s));
	for (int i = 0; i < nr; i++) {
		for (unsigned int t = 0; t < types; t++) {
			s->v[i][t][0] = hcount_ns_count(ns[i], t);
			s->v[i][t][1] = hcount_ns_cached(ns[i], t);
			s->v[i][t][2] = hcount_ns_own(ns[i], t);
			s->v[i][t][3] = hcount_ns_limit(ns[i], t);
		}
	}
}

static int snap_same(struct hcount_ns **ns, int nr, unsigned int types, const struct snap *before)
{
	struct snap now;

	snap_take(&now, ns, nr, types);
	return memcmp(&now, before, sizeof(now)) == 0;
}

static void create_without_result(void *ret)
{
	*(int *)ret = hcount_tree_create(NULL, 1, HCOUNT_BATCH_DEFAULT, NULL);
}

struct bad_limit_create {
	struct hcount_ns *parent;
	int ret;
};

static void create_with_zero_limit(void *arg)
{
	struct bad_limit_create *c = arg;
	struct hcount_ns *ns;

	c->ret = hcount_ns_create(&ns, c->parent, (const long[]){ 0 });
}

struct bad_charge {
	struct hcount_ns *ns;
	long max;	/* HCOUNT_UNLIMITED: hcount_charge() */
	int ret;
};

static void charge_nothing(void *arg)
{
	struct bad_charge *c = arg;

	c->ret = c->max == HCOUNT_UNLIMITED ? hcount_charge(c->ns, 0, 0)
					    : hcount_charge_max(c->ns, 0, 0, c->max);
}

/* A charge's warning names the call the program made ("naming the call":
 * both reached the slow path as hcount_charge). */
static void check_charge_warning_names(struct hcount_ns *ns)
{
	struct bad_charge plain = { ns, HCOUNT_UNLIMITED, 0 }, with_max = { ns, 3, 0 };
	char msg[256];

	capture_stderr(charge_nothing, &plain, msg, sizeof(msg));
	is(plain.ret, -EINVAL, "charge of 0 units refused");
	ok(strstr(msg, "hcount_charge: ") != NULL, "and the warning names hcount_charge: %s", msg);
	capture_stderr(charge_nothing, &with_max, msg, sizeof(msg));
	is(with_max.ret, -EINVAL, "charge_max of 0 units refused");
	ok(strstr(msg, "hcount_charge_max: ") != NULL,
	   "and the warning names hcount_charge_max: %s", msg);
}

static void test_create_args(void)
{
	struct hcount_tree *tree = (struct hcount_tree *)&tree, *keep = tree;
	struct hcount_ns *ns = (struct hcount_ns *)&ns, *nkeep = ns;
	long zero[2] = { 5, 0 }, neg[2] = { -1, 5 }, good[2] = { 7, 9 };

	is(hcount_tree_create(&tree, 0, HCOUNT_BATCH_DEFAULT, NULL), -EINVAL,
	   "tree: 0 types refused");
	is(hcount_tree_create(&tree, HCOUNT_TYPES_MAX + 1, 16, NULL), -EINVAL,
	   "tree: too many types refused");
	is(hcount_tree_create(&tree, 1, HCOUNT_BATCH_MAX + 1, NULL), -EINVAL,
	   "tree: batch above HCOUNT_BATCH_MAX refused");
	is(hcount_tree_create(&tree, 2, 16, zero), -EINVAL, "tree: zero root limit refused");
	is(hcount_tree_create(&tree, 2, 16, neg), -EINVAL, "tree: negative root limit refused");
	ok(tree == keep, "tree: *treep untouched on error");
	{
		char msg[256];
		int ret;

		/* It was warned as "bad nr_types 1 or batch 16", both valid. */
		capture_stderr(create_without_result, &ret, msg, sizeof(msg));
		msg[strcspn(msg, "\n")] = '\0';
		is(ret, -EINVAL, "tree: no result pointer refused");
		ok(strstr(msg, "no result pointer") != NULL, "tree: and said so: %s", msg);
	}
	ok(hcount_tree_root(NULL) == NULL, "no tree: no root (it dereferenced NULL)");

	is(hcount_tree_create(&tree, 2, 16, good), 0, "tree: created");
	ok(hcount_ns_parent(hcount_tree_root(tree)) == NULL, "root has no parent");
	is(hcount_ns_limit(hcount_tree_root(tree), 1), 9, "root limits from root_limits");
	is(hcount_ns_create(&ns, hcount_tree_root(tree), zero), -EINVAL, "ns: zero limit refused");
	is(hcount_ns_create(&ns, hcount_tree_root(tree), neg), -EINVAL,
	   "ns: negative limit refused");
	is(hcount_ns_create(&ns, NULL, NULL), -EINVAL, "ns: no parent refused");
	{
		struct bad_limit_create c = { hcount_tree_root(tree), 0 };
		char msg[256], parent[32];

		/* It was warned as "type 0: limit 0 is not positive": no object. */
		capture_stderr(create_with_zero_limit, &c, msg, sizeof(msg));
		msg[strcspn(msg, "\n")] = '\0';
		snprintf(parent, sizeof(parent), "%p", (void *)c.parent);
		is(c.ret, -EINVAL, "ns: zero limit refused again");
		ok(strstr(msg, parent) != NULL, "ns: and the warning names the parent: %s", msg);
	}
	ok(ns == nkeep, "ns: *nsp untouched on error");
	is(hcount_tree_root(tree)->nr_children, 0, "ns: refused creates registered nothing");
	is(hcount_ns_create(&ns, hcount_tree_root(tree), NULL), 0, "ns: created, NULL limits");
	is(hcount_ns_limit(ns, 0), HCOUNT_UNLIMITED, "ns: NULL limits are unlimited");
	check_charge_warning_names(ns);
	is(hcount_tree_check(tree), 0, "check: fresh tree is consistent");
	is(hcount_ns_destroy(ns), 0, "ns: destroyed");
	is(hcount_tree_destroy(tree), 0, "tree: destroyed");
}

/* Exact arithmetic of caches, refills and give-backs, batch 16. */
static void test_batches(void)
{
	struct hcount_tree *tree;
	struct hcount_ns *root, *mid, *leaf;
	int i, fails = 0;

	hcount_tree_create(&tree, 1, HCOUNT_BATCH_DEFAULT, NULL);
	root = hcount_tree_root(tree);
	hcount_ns_create(&mid, root, NULL);
	hcount_ns_create(&leaf, mid, NULL);

	is(hcount_charge(leaf, 0, 1), 0, "batch: first charge refills the chain");
	is(hcount_ns_count(leaf, 0), 1, "batch: leaf count 1");
	is(hcount_ns_cached(leaf, 0), 16, "batch: leaf took 1 + 16 from mid, caches 16");
	is(hcount_ns_count(mid, 0), 17, "batch: mid count 17");
	is(hcount_ns_cached(mid, 0), 16, "batch: mid took 17 + 16 from root, caches 16");
	is(hcount_ns_count(root, 0), 33, "batch: root count 33");

	for (i = 0; i < 16; i++)
		fails += hcount_charge(leaf, 0, 1) != 0;
	is(fails, 0, "batch: 16 charges from the cache");
	is(hcount_ns_cached(leaf, 0), 0, "batch: leaf cache used up");
	is(hcount_ns_count(mid, 0), 17, "batch: cache hits did not touch mid");
	is(hcount_ns_count(root, 0), 33, "batch: cache hits did not touch root");

	is(hcount_charge(leaf, 0, 1), 0, "batch: 18th charge refills");
	is(hcount_ns_cached(leaf, 0), 16, "batch: leaf refilled to 16");
	is(hcount_ns_count(mid, 0), 34, "batch: mid count 34");
	is(hcount_ns_cached(mid, 0), 16, "batch: mid refilled 17 from root, caches 16");
	is(hcount_ns_count(root, 0), 50, "batch: root count 50");
	is(hcount_tree_check(tree), 0, "batch: invariant holds");

	is(hcount_uncharge(leaf, 0, 16), 0, "batch: uncharge 16 into the cache");
	is(hcount_ns_cached(leaf, 0), 32, "batch: leaf caches 32 (high-water)");
	is(hcount_ns_count(mid, 0), 34, "batch: uncharge under high-water keeps mid");
	is(hcount_uncharge(leaf, 0, 1), 0, "batch: uncharge past high-water");
	is(hcount_ns_cached(leaf, 0), 16, "batch: leaf gave back to 16");
	is(hcount_ns_count(mid, 0), 17, "batch: mid count 34 - 17");
	is(hcount_ns_cached(mid, 0), 16, "batch: mid passed its own excess on");
	is(hcount_ns_count(root, 0), 33, "batch: root count 50 - 17");
	is(hcount_ns_own(leaf, 0), 1, "batch: leaf owns 1");
	is(hcount_uncharge(leaf, 0, 1), 0, "batch: last uncharge");
	is(hcount_ns_count(root, 0), hcount_ns_cached(leaf, 0) + hcount_ns_cached(mid, 0),
	   "batch: root count is exactly the caches once all is uncharged");
	is(hcount_tree_check(tree), 0, "batch: invariant holds");

	/* Root charges: no cache at the root. */
	is(hcount_charge(root, 0, 5), 0, "batch: charge at the root");
	is(hcount_ns_own(root, 0), 5, "batch: root owns 5");
	is(hcount_ns_cached(root, 0), 0, "batch: root never caches");
	is(hcount_uncharge(root, 0, 5), 0, "batch: uncharge at the root");

	/* Destruction gives caches back: conservation after destruction. */
	is(hcount_ns_destroy(leaf), 0, "batch: leaf destroyed");
	is(hcount_ns_count(mid, 0), 0, "batch: leaf's cache left mid's count");
	is(hcount_ns_count(root, 0), hcount_ns_cached(mid, 0), "batch: root count = mid's cache");
	is(hcount_ns_destroy(mid), 0, "batch: mid destroyed");
	is(hcount_ns_count(root, 0), 0, "batch: every unit back at the root");
	is(hcount_tree_destroy(tree), 0, "batch: tree destroyed");
}

/*
 * A destroyed namespace's cache goes to its parent, which then keeps at
 * most its high-water mark (2 * batch; above it, batch), as after an
 * uncharge: 33 units there leave 16, exactly 32 stay.  And HCOUNT_BATCH_MAX
 * itself is a batch a tree takes.
 */
static void test_destroy_gives_back(void)
{
	struct hcount_tree *tree;
	struct hcount_ns *root, *mid, *leaf;
	int own_at_mid;

	for (own_at_mid = 0; own_at_mid < 2; own_at_mid++) {
		hcount_tree_create(&tree, 1, HCOUNT_BATCH_DEFAULT, NULL);
		root = hcount_tree_root(tree);
		hcount_ns_create(&mid, root, NULL);
		hcount_ns_create(&leaf, mid, NULL);
		hcount_charge(leaf, 0, 1);	/* leaf and mid cache 16 each */
		if (own_at_mid)
			hcount_charge(mid, 0, 1);	/* from mid's cache: 15 */
		hcount_uncharge(leaf, 0, 1);	/* the leaf caches 17 */
		is(hcount_ns_cached(leaf, 0), 17, "destroy/%d: the leaf caches 17", own_at_mid);
		is(hcount_ns_destroy(leaf), 0, "destroy/%d: leaf destroyed", own_at_mid);
		is(hcount_ns_cached(mid, 0), own_at_mid ? 32 : 16,
		   own_at_mid ? "destroy/1: mid keeps 15 + 17, its high-water mark"
			      : "destroy/0: mid got 16 + 17 and passed all but 16 on");
		is(hcount_ns_count(root, 0), hcount_ns_count(mid, 0) + hcount_ns_cached(mid, 0),
		   "destroy/%d: the root counts mid's usage and cache", own_at_mid);
		is(hcount_tree_check(tree), 0, "destroy/%d: invariant holds", own_at_mid);
		if (own_at_mid)
			hcount_uncharge(mid, 0, 1);
		hcount_ns_destroy(mid);
		is(hcount_ns_count(root, 0), 0, "destroy/%d: all units back at the root", own_at_mid);
		hcount_tree_destroy(tree);
	}
	tree = NULL;
	is(hcount_tree_create(&tree, 1, HCOUNT_BATCH_MAX, NULL), 0,
	   "tree: batch HCOUNT_BATCH_MAX accepted");
	if (tree)
		hcount_tree_destroy(tree);
}

/*
 * Root limit 40; leaves a, b, c under the root and d under mid.  Caches of
 * up to 16 sit in a, b, mid and d while usage approaches 40: every unit up to
 * the limit must still be granted, one more never.
 */
static void test_exact_limit(unsigned int batch)
{
	long lim[1] = { 40 };
	struct hcount_tree *tree;
	struct hcount_ns *ns[6], *root, *mid, *leaves[4];
	struct snap before;
	int i, granted = 0, refused = 0, other = 0;

	hcount_tree_create(&tree, 1, batch, lim);
	root = ns[0] = hcount_tree_root(tree);
	hcount_ns_create(&leaves[0], root, NULL);
	hcount_ns_create(&leaves[1], root, NULL);
	hcount_ns_create(&leaves[2], root, NULL);
	hcount_ns_create(&mid, root, NULL);
	hcount_ns_create(&leaves[3], mid, NULL);
	ns[1] = leaves[0], ns[2] = leaves[1], ns[3] = leaves[2], ns[4] = mid, ns[5] = leaves[3];

	for (i = 0; i < 3; i++)
		hcount_charge(leaves[i], 0, 1);
	if (batch)
		ok(hcount_ns_count(root, 0) > 3, "exact/%u: caches charged beyond usage", batch);
	for (i = 0; granted + 3 < 40 && i < 1000; i++) {
		int r = hcount_charge(leaves[i % 4], 0, 1);

		granted += r == 0;
		other += r != 0;
	}
	is(granted + 3, 40, "exact/%u: usage reached the limit exactly", batch);
	is(other, 0, "exact/%u: no refusal below the limit", batch);
	is(hcount_ns_count(root, 0), 40, "exact/%u: root count == limit", batch);
	snap_take(&before, ns, 6, 1);
	for (i = 0; i < 8; i++)
		refused += hcount_charge(leaves[i % 4], 0, 1) == -EDQUOT;
	is(refused, 8, "exact/%u: every charge above the limit refused", batch);
	ok(snap_same(ns, 6, 1, &before), "exact/%u: refusals changed nothing", batch);
	is(hcount_tree_check(tree), 0, "exact/%u: invariant holds", batch);

	/* A unit freed in one subtree must be reachable from another. */
	is(hcount_uncharge(leaves[0], 0, 1), 0, "exact/%u: one unit freed at a", batch);
	is(hcount_charge(leaves[3], 0, 1), 0, "exact/%u: d gets it despite a's cache", batch);
	is(hcount_charge(leaves[3], 0, 1), -EDQUOT, "exact/%u: and no more", batch);
	/* n > 1: room for 2 after freeing 2, not for 3. */
	hcount_uncharge(leaves[1], 0, 2);
	is(hcount_charge(leaves[2], 0, 3), -EDQUOT, "exact/%u: 3 refused with 2 free", batch);
	is(hcount_charge(leaves[2], 0, 2), 0, "exact/%u: 2 granted with 2 free", batch);
	is(hcount_tree_check(tree), 0, "exact/%u: invariant holds", batch);

	for (i = 0; i < 4; i++)
		hcount_uncharge(leaves[i], 0, hcount_ns_own(leaves[i], 0));
	for (i = 3; i >= 0; i--)
		hcount_ns_destroy(leaves[i]);
	is(hcount_ns_destroy(mid), 0, "exact/%u: namespaces destroyed", batch);
	is(hcount_ns_count(root, 0), 0, "exact/%u: all units back at the root", batch);
	hcount_tree_destroy(tree);
}

/*
 * Root limit 40: leaf (under mid) and mid cache 16 units each, one and two
 * levels below the root; b, a child of the root, must still get every unit
 * up to the limit.
 */
static void test_deep_cache(void)
{
	long lim[1] = { 40 };
	struct hcount_tree *tree;
	struct hcount_ns *root, *mid, *leaf, *b;

	hcount_tree_create(&tree, 1, HCOUNT_BATCH_DEFAULT, lim);
	root = hcount_tree_root(tree);
	hcount_ns_create(&mid, root, NULL);
	hcount_ns_create(&leaf, mid, NULL);
	hcount_ns_create(&b, root, NULL);
	is(hcount_charge(leaf, 0, 1), 0, "deep: leaf charged 1");
	is(hcount_ns_cached(leaf, 0), 16, "deep: leaf caches 16");
	is(hcount_ns_cached(mid, 0), 16, "deep: mid caches 16");
	is(hcount_charge(b, 0, 7), 0, "deep: b charged 7 (no batch: it would pass 40)");
	is(hcount_ns_count(root, 0), 40, "deep: root count at its limit, usage 8");
	is(hcount_charge(b, 0, 32), 0, "deep: b gets the 32 units cached below mid");
	is(hcount_ns_cached(leaf, 0), 0, "deep: leaf's cache was drained");
	is(hcount_charge(leaf, 0, 1), -EDQUOT, "deep: usage 40, nothing left");
	is(hcount_tree_check(tree), 0, "deep: invariant holds");
	hcount_uncharge(b, 0, 39);
	hcount_uncharge(leaf, 0, 1);
	hcount_ns_destroy(b);
	hcount_ns_destroy(leaf);
	hcount_ns_destroy(mid);
	is(hcount_ns_count(root, 0), 0, "deep: all units back at the root");
	hcount_tree_destroy(tree);
}

/* A limit in the middle of the tree; its sibling subtree is not affected. */
static void test_mid_limit(unsigned int batch)
{
	long lim[1] = { 10 };
	struct hcount_tree *tree;
	struct hcount_ns *root, *mid, *other, *l1, *l2;
	int i, granted = 0;

	hcount_tree_create(&tree, 1, batch, NULL);
	root = hcount_tree_root(tree);
	hcount_ns_create(&mid, root, lim);
	hcount_ns_create(&other, root, NULL);
	hcount_ns_create(&l1, mid, NULL);
	hcount_ns_create(&l2, mid, NULL);
	for (i = 0; i < 40; i++)
		granted += hcount_charge(i % 2 ? l1 : l2, 0, 1) == 0;
	is(granted, 10, "mid/%u: subtree granted exactly its limit", batch);
	is(hcount_charge(mid, 0, 1), -EDQUOT, "mid/%u: own charge at the full level refused",
	   batch);
	is(hcount_charge(other, 0, 100), 0, "mid/%u: sibling subtree unaffected", batch);
	is(hcount_tree_check(tree), 0, "mid/%u: invariant holds", batch);
	hcount_uncharge(l1, 0, 5);
	hcount_uncharge(l2, 0, 5);
	hcount_uncharge(other, 0, 100);
	hcount_ns_destroy(l1);
	hcount_ns_destroy(l2);
	hcount_ns_destroy(mid);
	hcount_ns_destroy(other);
	is(hcount_ns_count(root, 0), 0, "mid/%u: all units back at the root", batch);
	hcount_tree_destroy(tree);
}

/* The caller's own limit bounds the usage of the charged namespace only. */
static void test_caller_max(unsigned int batch)
{
	struct hcount_tree *tree;
	struct hcount_ns *root, *mid, *leaf;
	struct snap before;
	struct hcount_ns *all[3];

	hcount_tree_create(&tree, 1, batch, NULL);
	root = all[0] = hcount_tree_root(tree);
	hcount_ns_create(&mid, root, NULL);
	hcount_ns_create(&leaf, mid, NULL);
	all[1] = mid, all[2] = leaf;

	is(hcount_charge_max(leaf, 0, 5, 5), 0, "max/%u: 5 within max 5", batch);
	snap_take(&before, all, 3, 1);
	is(hcount_charge_max(leaf, 0, 1, 5), -EDQUOT, "max/%u: 6th refused by max 5", batch);
	is(hcount_charge_max(leaf, 0, 1, 0), -EDQUOT, "max/%u: max 0 refuses", batch);
	ok(snap_same(all, 3, 1, &before), "max/%u: refusals changed nothing", batch);
	is(hcount_charge_max(leaf, 0, 1, -1), -EINVAL, "max/%u: negative max is misuse", batch);
	is(hcount_charge_max(leaf, 0, 1, 6), 0, "max/%u: granted under max 6", batch);
	/* mid's usage is the leaf's 6 (its count may be more: the cache). */
	is(hcount_charge_max(mid, 0, 1, 6), -EDQUOT, "max/%u: max counts descendants' usage",
	   batch);
	is(hcount_charge_max(mid, 0, 1, 7), 0, "max/%u: caches below do not count against max",
	   batch);
	/* Ancestors are bounded by their limits, not by the caller's max. */
	is(hcount_charge_max(root, 0, 1, 100), 0, "max/%u: root charge", batch);
	ok(hcount_ns_count(root, 0) > 2, "max/%u: root count above the next max", batch);
	is(hcount_uncharge(leaf, 0, 6), 0, "max/%u: leaf emptied", batch);
	is(hcount_charge_max(leaf, 0, 2, 2), 0, "max/%u: max ignores ancestors' counts", batch);
	is(hcount_tree_check(tree), 0, "max/%u: invariant holds", batch);
	hcount_uncharge(leaf, 0, 2);
	hcount_uncharge(mid, 0, 1);
	hcount_uncharge(root, 0, 1);
	hcount_ns_destroy(leaf);
	hcount_ns_destroy(mid);
	is(hcount_ns_count(root, 0), 0, "max/%u: all units back at the root", batch);
	hcount_tree_destroy(tree);
}

/*
 * A refusal no drain could undo (max 0 at a namespace that owns nothing)
 * leaves the caches below it alone: a task refused again and again at its
 * rlimit used to empty its descendants' caches every time (one refusing
 * thread cut a leaf's charges from 225 to 10 million a second).
 */
static void test_hopeless_refusal_keeps_caches(unsigned int batch)
{
	struct hcount_tree *tree;
	struct hcount_ns *mid, *leaf;
	long cached;

	hcount_tree_create(&tree, 1, batch, NULL);
	hcount_ns_create(&mid, hcount_tree_root(tree), NULL);
	hcount_ns_create(&leaf, mid, NULL);
	hcount_charge(leaf, 0, 1);
	hcount_uncharge(leaf, 0, 1);	/* the unit stays in the leaf's cache */
	cached = hcount_ns_cached(leaf, 0);
	ok(cached > 0, "hopeless/%u: the leaf holds a cache", batch);
	is(hcount_charge_max(mid, 0, 1, 0), -EDQUOT, "hopeless/%u: max 0 at mid refuses", batch);
	is(hcount_ns_cached(leaf, 0), cached, "hopeless/%u: the leaf keeps its cache", batch);
	hcount_charge(mid, 0, 1);
	is(hcount_charge_max(mid, 0, 1, 1), -EDQUOT, "hopeless/%u: own 1 + 1 passes max 1",
	   batch);
	is(hcount_ns_cached(leaf, 0), cached, "hopeless/%u: the leaf still keeps it", batch);
	is(hcount_tree_check(tree), 0, "hopeless/%u: invariant holds", batch);
	hcount_uncharge(mid, 0, 1);
	hcount_ns_destroy(leaf);
	hcount_ns_destroy(mid);
	hcount_tree_destroy(tree);
}

/* Misuse gets an error code and changes nothing. */
static void test_misuse(unsigned int batch)
{
	struct hcount_tree *tree;
	struct hcount_ns *all[3], *root, *mid, *leaf;
	struct snap before;

	hcount_tree_create(&tree, 2, batch, NULL);
	root = all[0] = hcount_tree_root(tree);
	hcount_ns_create(&mid, root, NULL);
	hcount_ns_create(&leaf, mid, NULL);
	all[1] = mid, all[2] = leaf;
	hcount_charge(leaf, 0, 3);
	hcount_charge(leaf, 1, 2);
	snap_take(&before, all, 3, 2);

	is(hcount_uncharge(leaf, 0, 4), -ERANGE, "misuse/%u: uncharge above own", batch);
	is(hcount_uncharge(mid, 0, 1), -ERANGE, "misuse/%u: uncharge a child's units", batch);
	is(hcount_uncharge(root, 1, 1), -ERANGE, "misuse/%u: uncharge at the root", batch);
	is(hcount_uncharge(leaf, 0, 0), -EINVAL, "misuse/%u: uncharge 0", batch);
	is(hcount_uncharge(leaf, 0, -1), -EINVAL, "misuse/%u: uncharge negative", batch);
	is(hcount_uncharge(leaf, 2, 1), -EINVAL, "misuse/%u: uncharge bad type", batch);
	is(hcount_charge(leaf, 0, 0), -EINVAL, "misuse/%u: charge 0", batch);
	is(hcount_charge(leaf, 0, -5), -EINVAL, "misuse/%u: charge negative", batch);
	is(hcount_charge(leaf, 2, 1), -EINVAL, "misuse/%u: charge bad type", batch);
	is(hcount_ns_set_limit(leaf, 0, 0), -EINVAL, "misuse/%u: zero limit", batch);
	is(hcount_ns_set_limit(leaf, 0, -7), -EINVAL, "misuse/%u: negative limit", batch);
	is(hcount_ns_set_limit(leaf, 2, 7), -EINVAL, "misuse/%u: limit of a bad type", batch);
	is(hcount_ns_destroy(mid), -EBUSY, "misuse/%u: destroy with children", batch);
	is(hcount_ns_destroy(leaf), -EBUSY, "misuse/%u: destroy with own units", batch);
	is(hcount_ns_destroy(root), -EINVAL, "misuse/%u: destroy the root", batch);
	is(hcount_tree_destroy(tree), -EBUSY, "misuse/%u: destroy a tree with namespaces", batch);
	is(hcount_ns_count(leaf, 2), -EINVAL, "misuse/%u: read-out of a bad type", batch);
	is(hcount_charge(NULL, 0, 1), -EINVAL, "misuse/%u: charge a NULL namespace", batch);
	is(hcount_charge_max(NULL, 0, 1, 5), -EINVAL, "misuse/%u: charge_max a NULL namespace",
	   batch);
	is(hcount_uncharge(NULL, 0, 1), -EINVAL, "misuse/%u: uncharge a NULL namespace", batch);
	ok(hcount_ns_count(NULL, 0) == -EINVAL && hcount_ns_cached(NULL, 0) == -EINVAL &&
		   hcount_ns_own(NULL, 0) == -EINVAL && hcount_ns_limit(NULL, 0) == -EINVAL,
	   "misuse/%u: read-outs of a NULL namespace", batch);
	ok(hcount_ns_parent(NULL) == NULL, "misuse/%u: parent of a NULL namespace", batch);
	ok(hcount_tree_destroy(NULL) == -EINVAL && hcount_tree_check(NULL) == -EINVAL,
	   "misuse/%u: destroy and check a NULL tree", batch);
	ok(snap_same(all, 3, 2, &before), "misuse/%u: nothing changed", batch);
	is(hcount_tree_check(tree), 0, "misuse/%u: invariant holds", batch);

	hcount_uncharge(leaf, 0, 3);
	hcount_uncharge(leaf, 1, 2);
	is(hcount_ns_destroy(leaf), 0, "misuse/%u: leaf destroyed once empty", batch);
	is(hcount_ns_destroy(mid), 0, "misuse/%u: mid destroyed once childless", batch);
	hcount_charge(root, 1, 1);
	is(hcount_tree_destroy(tree), -EBUSY, "misuse/%u: destroy a tree with root units", batch);
	hcount_uncharge(root, 1, 1);
	is(hcount_tree_destroy(tree), 0, "misuse/%u: tree destroyed once empty", batch);
}

static void test_set_limit(unsigned int batch)
{
	struct hcount_tree *tree;
	struct hcount_ns *root, *mid, *leaf;

	hcount_tree_create(&tree, 1, batch, NULL);
	root = hcount_tree_root(tree);
	hcount_ns_create(&mid, root, NULL);
	hcount_ns_create(&leaf, mid, NULL);
	hcount_charge(leaf, 0, 5);
	if (batch)
		ok(hcount_ns_count(mid, 0) > 5, "limit/%u: mid's count includes a cache", batch);
	is(hcount_ns_set_limit(mid, 0, 4), -EBUSY, "limit/%u: below usage refused", batch);
	is(hcount_ns_limit(mid, 0), HCOUNT_UNLIMITED, "limit/%u: refused set changed nothing",
	   batch);
	is(hcount_ns_set_limit(mid, 0, 5), 0, "limit/%u: down to the usage (caches drained)",
	   batch);
	is(hcount_ns_limit(mid, 0), 5, "limit/%u: limit set", batch);
	is(hcount_charge(leaf, 0, 1), -EDQUOT, "limit/%u: lowered limit enforced", batch);
	is(hcount_ns_set_limit(mid, 0, 6), 0, "limit/%u: raised", batch);
	is(hcount_charge(leaf, 0, 1), 0, "limit/%u: raised limit grants", batch);
	is(hcount_ns_set_limit(root, 0, 6), 0, "limit/%u: root limit to the usage", batch);
	is(hcount_charge(leaf, 0, 1), -EDQUOT, "limit/%u: root limit enforced", batch);
	is(hcount_tree_check(tree), 0, "limit/%u: invariant holds", batch);
	hcount_uncharge(leaf, 0, 6);
	hcount_ns_destroy(leaf);
	hcount_ns_destroy(mid);
	is(hcount_ns_count(root, 0), 0, "limit/%u: all units back at the root", batch);
	hcount_tree_destroy(tree);
}

/* No-cache mode: every level's count is exactly its subtree's usage. */
static void test_nocache(void)
{
	long lim[1] = { 10 };
	struct hcount_tree *tree;
	struct hcount_ns *root, *mid, *a, *b;

	hcount_tree_create(&tree, 1, HCOUNT_NO_CACHE, lim);
	root = hcount_tree_root(tree);
	hcount_ns_create(&mid, root, NULL);
	hcount_ns_create(&a, mid, NULL);
	hcount_ns_create(&b, root, NULL);
	is(hcount_charge(a, 0, 3), 0, "nocache: charge 3");
	is(hcount_ns_count(a, 0), 3, "nocache: leaf count 3");
	is(hcount_ns_count(mid, 0), 3, "nocache: mid count 3");
	is(hcount_ns_count(root, 0), 3, "nocache: root count 3");
	is(hcount_ns_cached(a, 0), 0, "nocache: no cache");
	is(hcount_charge(b, 0, 7), 0, "nocache: fill the root from b");
	is(hcount_charge(a, 0, 1), -EDQUOT, "nocache: root full");
	is(hcount_ns_count(a, 0), 3, "nocache: refusal undid the leaf level");
	is(hcount_ns_count(mid, 0), 3, "nocache: refusal undid the mid level");
	is(hcount_uncharge(a, 0, 2), 0, "nocache: uncharge 2");
	is(hcount_ns_count(root, 0), 8, "nocache: root count 8");
	is(hcount_tree_check(tree), 0, "nocache: invariant holds");
	hcount_uncharge(a, 0, 1);
	hcount_uncharge(b, 0, 7);
	hcount_ns_destroy(a);
	hcount_ns_destroy(b);
	hcount_ns_destroy(mid);
	is(hcount_ns_count(root, 0), 0, "nocache: root count 0");
	hcount_tree_destroy(tree);
}

static void test_types(void)
{
	long lim[3] = { 100, 2, 50 };
	struct hcount_tree *tree;
	struct hcount_ns *root, *leaf;

	hcount_tree_create(&tree, 3, HCOUNT_BATCH_DEFAULT, lim);
	root = hcount_tree_root(tree);
	hcount_ns_create(&leaf, root, NULL);
	is(hcount_charge(leaf, 1, 2), 0, "types: type 1 up to its limit 2");
	is(hcount_charge(leaf, 1, 1), -EDQUOT, "types: type 1 full");
	is(hcount_charge(leaf, 0, 30), 0, "types: type 0 unaffected");
	is(hcount_ns_count(leaf, 2), 0, "types: type 2 untouched");
	is(hcount_ns_count(root, 2), 0, "types: type 2 untouched at the root");
	is(hcount_ns_count(root, 1), 2, "types: type 1 did not cache past its limit");
	is(hcount_tree_check(tree), 0, "types: invariant holds");
	hcount_uncharge(leaf, 1, 2);
	hcount_uncharge(leaf, 0, 30);
	hcount_ns_destroy(leaf);
	hcount_tree_destroy(tree);
}

/* The walks of a drain and of the check, from a thread with a small stack. */
static void *drain_and_check_deep(void *chain)
{
	struct hcount_ns **ns = chain;
	static intptr_t ok_both;

	ok_both = hcount_ns_set_limit(ns[0], 0, 1) == 0 &&
		  hcount_tree_check(ns[0]->tree) == 0;
	return &ok_both;
}

/*
 * Depth is capped.  Drains and the check walk the whole depth without
 * recursing: a thread with a 32 KiB stack runs them at the deepest level
 * (they recursed once per level and overflowed it).
 */
static void test_depth(void)
{
	pthread_attr_t attr;
	pthread_t small_stack;
	void *walked = NULL;
	static struct hcount_ns *chain[HCOUNT_DEPTH_MAX + 1];
	struct hcount_tree *tree;
	struct hcount_ns *extra = NULL;
	unsigned int d, made = 0;

	hcount_tree_create(&tree, 1, HCOUNT_BATCH_DEFAULT, NULL);
	chain[0] = hcount_tree_root(tree);
	for (d = 1; d <= HCOUNT_DEPTH_MAX; d++)
		made += hcount_ns_create(&chain[d], chain[d - 1], NULL) == 0;
	is(made, HCOUNT_DEPTH_MAX, "depth: a chain down to HCOUNT_DEPTH_MAX");
	is(hcount_ns_create(&extra, chain[HCOUNT_DEPTH_MAX], NULL), -EINVAL,
	   "depth: one level more refused");
	ok(extra == NULL, "depth: nothing returned");
	is(hcount_charge(chain[HCOUNT_DEPTH_MAX], 0, 1), 0, "depth: charge at the bottom");
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 32768 > PTHREAD_STACK_MIN ? 32768 : PTHREAD_STACK_MIN);
	if (pthread_create(&small_stack, &attr, drain_and_check_deep, chain) == 0)
		pthread_join(small_stack, &walked);
	pthread_attr_destroy(&attr);
	ok(walked && *(intptr_t *)walked,
	   "depth: on a 32 KiB stack, root limit 1 drains the whole chain and the check holds");
	is(hcount_ns_count(chain[0], 0), 1, "depth: the unit is counted at the root, and only there");
	is(hcount_ns_cached(chain[HCOUNT_DEPTH_MAX - 1], 0), 0, "depth: no cache left below");
	hcount_uncharge(chain[HCOUNT_DEPTH_MAX], 0, 1);
	for (d = HCOUNT_DEPTH_MAX; d > 0; d--)
		hcount_ns_destroy(chain[d]);
	is(hcount_ns_count(chain[0], 0), 0, "depth: all units back at the root");
	hcount_tree_destroy(tree);
}

/* Counts near LONG_MAX: refill arithmetic must not overflow. */
static void test_overflow(void)
{
	struct hcount_tree *tree;
	struct hcount_ns *root, *mid, *leaf;

	hcount_tree_create(&tree, 1, HCOUNT_BATCH_DEFAULT, NULL);
	root = hcount_tree_root(tree);
	hcount_ns_create(&mid, root, NULL);
	hcount_ns_create(&leaf, mid, NULL);
	is(hcount_charge(leaf, 0, LONG_MAX), 0, "overflow: LONG_MAX units granted");
	is(hcount_ns_count(root, 0), LONG_MAX, "overflow: root count LONG_MAX");
	is(hcount_charge(leaf, 0, 1), -EDQUOT, "overflow: one more refused");
	is(hcount_charge(root, 0, 1), -EDQUOT, "overflow: at the root too");
	is(hcount_uncharge(leaf, 0, LONG_MAX), 0, "overflow: all uncharged");
	is(hcount_tree_check(tree), 0, "overflow: invariant holds");
	is(hcount_charge(leaf, 0, LONG_MAX - 40), 0, "overflow: nearly LONG_MAX again");
	is(hcount_tree_check(tree), 0, "overflow: invariant holds");
	hcount_uncharge(leaf, 0, LONG_MAX - 40);
	hcount_ns_destroy(leaf);
	hcount_ns_destroy(mid);
	is(hcount_ns_count(root, 0), 0, "overflow: root count 0");
	hcount_tree_destroy(tree);
}

static void test_enomem(void)
{
	struct hcount_tree *tree = NULL;
	struct hcount_ns *ns = NULL;

	__hcount_fault_alloc = 0;
	is(hcount_tree_create(&tree, 1, 16, NULL), -ENOMEM, "nomem: tree allocation");
	__hcount_fault_alloc = 1;
	is(hcount_tree_create(&tree, 1, 16, NULL), -ENOMEM, "nomem: root allocation");
	ok(tree == NULL, "nomem: no tree returned");
	__hcount_fault_alloc = -1;
	is(hcount_tree_create(&tree, 1, 16, NULL), 0, "nomem: tree created without the fault");
	__hcount_fault_alloc = 0;
	is(hcount_ns_create(&ns, hcount_tree_root(tree), NULL), -ENOMEM,
	   "nomem: namespace allocation");
	ok(ns == NULL, "nomem: no namespace returned");
	is(hcount_tree_root(tree)->nr_children, 0, "nomem: nothing registered");
	is(hcount_tree_check(tree), 0, "nomem: invariant holds");
	is(hcount_tree_destroy(tree), 0, "nomem: tree destroyed (valgrind: nothing leaked)");
}

/* hcount_tree_check() must fail on each kind of broken invariant. */
static void test_check(void)
{
	struct hcount_tree *tree;
	struct hcount_ns *root, *leaf;
	long saved;

	hcount_tree_create(&tree, 1, HCOUNT_BATCH_DEFAULT, NULL);
	root = hcount_tree_root(tree);
	hcount_ns_create(&leaf, root, NULL);
	hcount_charge(leaf, 0, 3);
	is(hcount_tree_check(tree), 0, "check: consistent");
	root->slots[0].count++;
	is(hcount_tree_check(tree), -EUCLEAN, "check: a created unit is caught");
	root->slots[0].count -= 2;
	is(hcount_tree_check(tree), -EUCLEAN, "check: a lost unit is caught");
	root->slots[0].count++;
	leaf->slots[0].cached--;
	leaf->slots[0].own++;
	leaf->slots[0].count++;
	is(hcount_tree_check(tree), 0, "check: a unit moved from cache to own is consistent");
	leaf->slots[0].own--;
	is(hcount_tree_check(tree), -EUCLEAN, "check: count != own + children is caught");
	leaf->slots[0].count--;
	leaf->slots[0].cached++;
	/* Sums still add up; only the sign rule can catch this. */
	leaf->slots[0].cached -= 17;
	leaf->slots[0].own += 17;
	leaf->slots[0].count += 17;
	is(hcount_tree_check(tree), -EUCLEAN, "check: a negative cache is caught");
	leaf->slots[0].cached += 17;
	leaf->slots[0].own -= 17;
	leaf->slots[0].count -= 17;
	is(hcount_tree_check(tree), 0, "check: consistent again");
	root->slots[0].limit = 2;
	is(hcount_tree_check(tree), -EUCLEAN, "check: count above limit is caught");
	root->slots[0].limit = HCOUNT_UNLIMITED;
	root->nr_children++;
	is(hcount_tree_check(tree), -EUCLEAN, "check: a broken registry is caught");
	root->nr_children--;
	is(hcount_tree_check(tree), 0, "check: consistent again");
	leaf->slots[0].draining = 1;
	is(hcount_tree_check(tree), -EUCLEAN, "check: a drain's mark left behind is caught");
	leaf->slots[0].draining = 0;
	/* Sums that would pass LONG_MAX are a broken tree, not an overflow
	 * (UBSan stops the sanitizer build on one). */
	saved = leaf->slots[0].count;
	leaf->slots[0].count = LONG_MAX;
	is(hcount_tree_check(tree), -EUCLEAN, "check: children's sum past LONG_MAX is caught");
	leaf->slots[0].count = saved;
	saved = root->slots[0].own;
	root->slots[0].own = LONG_MAX;
	is(hcount_tree_check(tree), -EUCLEAN, "check: own + children past LONG_MAX is caught");
	root->slots[0].own = saved;
	is(hcount_tree_check(tree), 0, "check: consistent again");
	hcount_uncharge(leaf, 0, 3);
	hcount_ns_destroy(leaf);
	hcount_tree_destroy(tree);
}

/*
 * A slot lock's holder preempted by a waiter of higher real-time priority
 * on its CPU: the waiter must block for a while at last, or the holder
 * never runs again.  The contended lock once only spun and called
 * sched_yield(), which under SCHED_FIFO yields to no lower priority: the
 * waiter spun for ever (a hang; the child's alarm ends it here).
 */
#define RT_CHILD_DEADLINE_S 10

struct rt_waiter {
	struct hcount_ns *ns;
	sem_t go;
	int charged;
};

static void *rt_waiter_charge(void *arg)
{
	struct rt_waiter *w = arg;

	while (sem_wait(&w->go))
		;
	/* Preempts the holder, which holds the slot lock this needs. */
	w->charged = hcount_charge(w->ns, 0, 1);
	return NULL;
}

static int mode_rt_holder(void)
{
	struct sched_param low = { .sched_priority = 1 }, high = { .sched_priority = 2 };
	struct hcount_tree *tree;
	struct hcount_ns *leaf;
	struct rt_waiter w = { .charged = -1 };
	pthread_attr_t attr;
	pthread_t waiter;
	cpu_set_t mask, one;
	int cpu, err;

	/* Both threads on one CPU, so the waiter runs only by preempting. */
	if (sched_getaffinity(0, sizeof(mask), &mask))
		return 3;
	for (cpu = 0; !CPU_ISSET(cpu, &mask); cpu++)
		;
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	if (sched_setaffinity(0, sizeof(one), &one))
		return 3;
	/* No CAP_SYS_NICE nor RLIMIT_RTPRIO (a container): cannot test. */
	err = pthread_setschedparam(pthread_self(), SCHED_FIFO, &low);
	if (err == EPERM)
		return 77;
	if (err || hcount_tree_create(&tree, 1, HCOUNT_BATCH_DEFAULT, NULL) ||
	    hcount_ns_create(&leaf, hcount_tree_root(tree), NULL) || sem_init(&w.go, 0, 0))
		return 3;
	w.ns = leaf;
	pthread_attr_init(&attr);
	pthread_attr_setinheritsched(&attr, PTHREAD_EXPLICIT_SCHED);
	pthread_attr_setschedpolicy(&attr, SCHED_FIFO);
	pthread_attr_setschedparam(&attr, &high);
	if (pthread_create(&waiter, &attr, rt_waiter_charge, &w))
		return 3;
	pthread_attr_destroy(&attr);

	__hcount_slot_lock(&leaf->slots[0]);
	sem_post(&w.go);	/* the waiter runs here, until it gives way */
	__hcount_slot_unlock(&leaf->slots[0]);
	pthread_join(waiter, NULL);
	if (w.charged || hcount_ns_count(leaf, 0) != 1)
		return 4;
	hcount_uncharge(leaf, 0, 1);
	hcount_ns_destroy(leaf);
	hcount_tree_destroy(tree);
	sem_destroy(&w.go);
	return 0;
}

static void test_rt_holder(void)
{
	int ret = run_mode("--rt-holder");

	if (ret == 77) {
		printf("# skipped: SCHED_FIFO refused (no CAP_SYS_NICE)\n");
		return;
	}
	is(ret, 0, "rt: a waiter of higher priority lets the preempted holder unlock");
}

int main(int argc, char **argv)
{
	static const unsigned int batches[] = { HCOUNT_BATCH_DEFAULT, 1, HCOUNT_NO_CACHE };
	unsigned int i;

	if (argc > 1) {
		child_deadline(RT_CHILD_DEADLINE_S);
		if (!strcmp(argv[1], "--rt-holder"))
			return mode_rt_holder();
		return 2;
	}
	test_create_args();
	test_batches();
	test_deep_cache();
	test_destroy_gives_back();
	for (i = 0; i < 3; i++) {
		test_exact_limit(batches[i]);
		test_mid_limit(batches[i]);
		test_caller_max(batches[i]);
		if (batches[i] != HCOUNT_NO_CACHE)	/* no caches to keep */
			test_hopeless_refusal_keeps_caches(batches[i]);
		test_misuse(batches[i]);
		test_set_limit(batches[i]);
	}
	test_nocache();
	test_types();
	test_depth();
	test_overflow();
	test_enomem();
	test_check();
	test_rt_holder();
	return done_testing();
}
