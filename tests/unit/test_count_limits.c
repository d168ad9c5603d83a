/* SPDX-License-Identifier: MIT */
/*
 * Counts at the edges of what a call may move (docs/percpu_ref.md,
 * "Counts"):
 *  - get_many/tryget_many/put_many of more than 2^24 references at once
 *    went onto the per-CPU words in slices, whose sum keeps only the low
 *    32 bits of the net count: 2^32 references taken so read as none at
 *    the fold, and the kill released the ref under them, with no warning
 *    (2^31 read as minus 2^31: a ref pinned and leaked, its references
 *    all held, with a warning that puts outnumbered gets).  They go on the
 *    atomic count now, exact in every mode; a call of 2^62 or more, more
 *    than a count holds (an unsigned -1, say), is warned and refused;
 *  - put_many(ref, 0) on a released ref (atomic, count 0) read its
 *    subtract of 0 as the one reaching zero and ran @release a second
 *    time ("misuse never double-releases"); get_many(ref, 0) there warned
 *    and pinned the count, and a later reinit was refused.  A call of
 *    none now does nothing;
 *  - an exit kept the count for is_zero() shifted, its top bits lost: a
 *    held ref exited at a count of 2^63 read as zero.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>

#include "child.h"
#include "internal.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

static int released;

static void count_release(struct percpu_ref *ref)
{
	(void)ref;
	released++;
}

/* Takes @nr references in one call (tryget if @try), kills, drops them
 * in one call: released once, only after the put. */
static void many_then_kill(const char *what, unsigned int flags, unsigned long nr, bool try)
{
	struct percpu_ref r;
	unsigned long warnings;

	released = 0;
	ok(!percpu_ref_init(&r, count_release, flags), "%s: init", what);
	warnings = percpuref_warning_count();
	if (try)
		ok(percpu_ref_tryget_many(&r, nr), "%s: tryget_many succeeds", what);
	else
		percpu_ref_get_many(&r, nr);
	percpu_ref_kill(&r);
	ok(!percpu_ref_barrier(), "%s: barrier", what);
	is(released, 0, "%s: not released while the references are held", what);
	ok(!percpu_ref_is_zero(&r), "%s: and not zero", what);
	percpu_ref_put_many(&r, nr - 1);
	printf("# %s: count %#lx\n", what, r.data->count);
	is(released, 0, "%s: one reference left: not released", what);
	percpu_ref_put(&r);
	is(released, 1, "%s: released once at the last put", what);
	ok(percpu_ref_is_zero(&r), "%s: zero", what);
	is(percpuref_warning_count() - warnings, 0, "%s: no warning", what);
	percpu_ref_exit(&r);
}

/*
 * The per-CPU words' window (percpu_ref.h, PERCPU_REF_NET_BITS): their
 * net share of the count may reach 2^30 - 1 references held, or 2^30
 * dropped of references taken on the atomic count, each through calls of
 * at most PERCPU_REF_PERCPU_MAX_NR.  Killed at either edge, the ref keeps
 * its exact count: released once, at the last put.
 */
static void window_edge(const char *what, bool held)
{
	const unsigned long slice = PERCPU_REF_PERCPU_MAX_NR;
	const unsigned long edge = 1UL << (PERCPU_REF_NET_BITS - 1);
	unsigned long share = held ? edge - 1 : edge, left, warnings;
	struct percpu_ref r;

	released = 0;
	ok(!percpu_ref_init(&r, count_release, 0), "%s: init", what);
	warnings = percpuref_warning_count();
	if (!held)
		percpu_ref_get_many(&r, share + 5);	/* atomic: above the slice */
	for (left = share; left; left -= left < slice ? left : slice) {
		if (held)
			percpu_ref_get_many(&r, left < slice ? left : slice);
		else
			percpu_ref_put_many(&r, left < slice ? left : slice);
	}
	percpu_ref_kill(&r);
	ok(!percpu_ref_barrier(), "%s: barrier", what);
	is(released, 0, "%s: not released while references are held", what);
	/* Held: the per-CPU share, taken back on the atomic count now. */
	percpu_ref_put_many(&r, held ? share - 1 : 4);
	is(released, 0, "%s: one reference left: not released", what);
	percpu_ref_put(&r);
	is(released, 1, "%s: released once at the last put", what);
	is(percpuref_warning_count() - warnings, 0, "%s: no warning", what);
	percpu_ref_exit(&r);
}

static void test_huge_counts(void)
{
	window_edge("2^30 - 1 held on the per-CPU words", true);
	window_edge("2^30 dropped on the per-CPU words", false);
	many_then_kill("get 2^32 per-CPU", 0, 1UL << 32, false);
	many_then_kill("get 2^31 per-CPU", 0, 1UL << 31, false);
	many_then_kill("get 2^32 + 5 per-CPU", 0, (1UL << 32) + 5, false);
	many_then_kill("tryget 2^32 per-CPU", 0, 1UL << 32, true);
	many_then_kill("get 2^32 atomic", PERCPU_REF_INIT_ATOMIC, 1UL << 32, false);
	many_then_kill("get 2^40 per-CPU", 0, 1UL << 40, false);
}

/* More than a count can hold: refused (warned), the ref not released by
 * a count that wrapped. */
static void test_too_many(void)
{
	struct percpu_ref r;
	unsigned long warnings;

	released = 0;
	ok(!percpu_ref_init(&r, count_release, 0), "too many: init");
	warnings = percpuref_warning_count();
	percpu_ref_get_many(&r, ULONG_MAX);
	ok(percpuref_warning_count() > warnings, "get_many(ULONG_MAX) warned");
	ok(!percpu_ref_tryget_many(&r, 1UL << 62), "tryget_many(2^62) fails");
	percpu_ref_kill(&r);
	ok(!percpu_ref_barrier(), "too many: barrier");
	is(released, 0, "too many: never released (count pinned)");
	percpu_ref_exit(&r);
}

static void test_none(void)
{
	struct percpu_ref r;
	unsigned long warnings;

	released = 0;
	ok(!percpu_ref_init(&r, count_release, PERCPU_REF_ALLOW_REINIT), "none: init");
	percpu_ref_get_many(&r, 0);
	percpu_ref_put_many(&r, 0);
	ok(percpu_ref_tryget_many(&r, 0), "none: tryget_many(0) of a live ref succeeds");
	percpu_ref_kill(&r);
	ok(!percpu_ref_barrier(), "none: barrier");
	is(released, 1, "none: released by the kill");
	warnings = percpuref_warning_count();
	percpu_ref_put_many(&r, 0);
	is(released, 1, "put_many(0) of a released ref does not release it again");
	percpu_ref_get_many(&r, 0);
	ok(percpu_ref_is_zero(&r), "get_many(0) of a released ref leaves it at zero");
	ok(!percpu_ref_tryget_many(&r, 0), "tryget_many(0) of a released ref fails");
	is(percpuref_warning_count() - warnings, 0, "none of them warned");
	percpu_ref_reinit(&r);
	ok(!percpu_ref_is_dying(&r), "reinit afterwards goes through");
	percpu_ref_kill(&r);
	ok(!percpu_ref_barrier(), "none: barrier again");
	is(released, 2, "released again after reinit and kill");
	percpu_ref_exit(&r);
}

/*
 * A legitimate count near 2^62 while per-CPU: references taken on the
 * atomic count (calls of more than 2^24) and dropped on the per-CPU words
 * (calls of up to 2^24) leave the atomic count's share above the net count
 * by up to 2^30.  With a bias of 2^63 that share reached the underflow
 * zone (3 * 2^62) with the net count still below 2^62: the next call on
 * the atomic count read as misuse.  A get pinned the ref without a warning
 * (as already pinned: leaked); a tryget "succeeded" on the pinned-looking
 * count without adding, and then the put that drops the kill's initial
 * reference (atomic, before the fold) pinned it silently too, or, after
 * the fold, the count was short and the ref released with references held.
 * Fixed by a bias of 2^63 - 2^32 (percpu_ref.h).
 */
static void near_limit(const char *what, bool try)
{
	const unsigned long big = (1UL << 62) - 3, slice = PERCPU_REF_PERCPU_MAX_NR;
	struct percpu_ref r;
	unsigned long warnings;

	released = 0;
	ok(!percpu_ref_init(&r, count_release, 0), "%s: init", what);
	warnings = percpuref_warning_count();
	percpu_ref_get_many(&r, big);		/* atomic count: 2^62 - 2 */
	for (int i = 0; i < 3; i++)
		percpu_ref_put_many(&r, slice);	/* per-CPU words: -3 * 2^24 */
	percpu_ref_get_many(&r, slice + 1);	/* net 2^62 - 1 - 2^25 */
	/* net 2^62 - 2^24 after this one: below 2^62 */
	if (try)
		ok(percpu_ref_tryget_many(&r, slice + 1), "%s: tryget_many succeeds", what);
	else
		percpu_ref_get_many(&r, slice + 1);
	is(percpuref_warning_count() - warnings, 0, "%s: net below 2^62: no warning", what);
	percpu_ref_kill(&r);
	ok(!percpu_ref_barrier(), "%s: barrier", what);
	is(released, 0, "%s: not released by the kill", what);
	percpu_ref_put_many(&r, big - 3 * slice - 1);
	percpu_ref_put_many(&r, slice + 1);
	percpu_ref_put(&r);
	is(released, 0, "%s: 2^24 + 1 references left: not released", what);
	percpu_ref_put_many(&r, slice + 1);
	is(released, 1, "%s: released once at the last put", what);
	is(percpuref_warning_count() - warnings, 0, "%s: no warning at all", what);
	percpu_ref_exit(&r);
}

static void test_near_limit(void)
{
	near_limit("get near 2^62 per-CPU", false);
	near_limit("tryget near 2^62 per-CPU", true);
}

/*
 * percpu_ref_exit() keeps the count in the mode word for
 * percpu_ref_is_zero(), shifted past the two flag bits, so a count of 2^62
 * or more lost its top bits there.  A per-CPU ref's atomic count carries
 * the bias: with the initial reference and 2^32 - 1 taken in one call it
 * reads 2^63, which was kept as 0, and is_zero() said true of a ref exited
 * with all of them held.
 */
static void test_exit_keeps_count(void)
{
	struct percpu_ref r;

	released = 0;
	ok(!percpu_ref_init(&r, count_release, 0), "exit keeps count: init");
	percpu_ref_get_many(&r, (1UL << 32) - 1);
	percpu_ref_exit(&r);
	ok(!percpu_ref_is_zero(&r), "exited with 2^32 references held: is_zero() is false");
	ok(percpu_ref_is_dying(&r), "and it is dying");

	ok(!percpu_ref_init(&r, count_release, PERCPU_REF_INIT_ATOMIC), "exit keeps count: init");
	percpu_ref_put(&r);
	is(released, 1, "atomic ref released by its put");
	percpu_ref_exit(&r);
	ok(percpu_ref_is_zero(&r), "exited at zero: is_zero() is true");
}

int main(void)
{
	/* get_many(ULONG_MAX) went through 2^40 slices: hours. */
	child_deadline(100);
	test_none();
	test_huge_counts();
	test_too_many();
	test_near_limit();
	test_exit_keeps_count();
	return done_testing();
}
