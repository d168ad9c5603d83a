/* SPDX-License-Identifier: MIT */
/*
 * headers_cxx.cpp - every public header compiles as C++17 with -Wall -Wextra
 * -pedantic -Werror, and its inline functions work when called from C++.
 * Each header's fast paths are called at least once so their bodies are
 * instantiated (an unused static inline function is never compiled).  A
 * header added to include/percpuref/ gets a line here.
 */
#include <errno.h>
#include <string.h>

#include <percpuref/compiler.h>
#include <percpuref/hcount.h>
#include <percpuref/kref.h>
#include <percpuref/managed.h>
#include <percpuref/percpu_rcuref.h>
#include <percpuref/percpu_ref.h>
#include <percpuref/percpuref.hpp>
#include <percpuref/rcuref.h>
#include <percpuref/this_cpu.h>

static int kref_released, percpu_released;

static void kref_release(struct kref *)
{
	kref_released++;
}

static void percpu_release(struct percpu_ref *)
{
	percpu_released++;
}

static int check_kref()
{
	struct kref k = KREF_INIT(1);

	kref_get(&k);
	if (!kref_get_unless_zero(&k) || kref_read(&k) != 3)
		return 1;
	kref_put(&k, kref_release);
	kref_put(&k, kref_release);
	return kref_put(&k, kref_release) == 1 && kref_released == 1 ? 0 : 1;
}

static int check_rcuref()
{
	rcuref_t r = RCUREF_INIT(1);

	if (!rcuref_get(&r) || rcuref_read(&r) != 2 || rcuref_put(&r))
		return 1;
	return rcuref_put_rcusafe(&r) && !rcuref_get(&r) ? 0 : 1;
}

/* Atomic mode, so the kill releases synchronously on this thread. */
static int check_percpu_ref()
{
	struct percpu_ref ref;
	int bad;

	if (percpu_ref_init(&ref, percpu_release, PERCPU_REF_INIT_ATOMIC))
		return 1;
	percpu_ref_get(&ref);
	bad = !percpu_ref_tryget(&ref) || !percpu_ref_tryget_live(&ref);
	percpu_ref_put_many(&ref, 3);
	percpu_ref_kill(&ref);
	bad |= !percpu_ref_is_dying(&ref) || percpu_released != 1;
	percpu_ref_exit(&ref);
	return bad;
}

static int rcuref_released;

static void rcuref_unpublish(struct percpu_rcuref *)
{
}

static void rcuref_release(struct percpu_rcuref *ref)
{
	rcuref_released++;
	percpu_rcuref_exit(ref);
}

static int check_percpu_rcuref()
{
	struct percpu_rcuref ref;

	if (percpu_rcuref_init(&ref, rcuref_unpublish, rcuref_release, 0))
		return 1;
	percpu_rcuref_read_lock();
	bool got = percpu_rcuref_tryget(&ref);
	percpu_rcuref_read_unlock();
	percpu_rcuref_get(&ref);
	percpu_rcuref_put(&ref);
	if (got)
		percpu_rcuref_put(&ref);
	percpu_rcuref_kill(&ref);
	percpu_rcuref_barrier();
	return got && rcuref_released == 1 ? 0 : 1;
}

static int check_hcount()
{
	struct hcount_tree *tree;
	struct hcount_ns *ns;
	long limit = 10;
	int bad;

	if (hcount_tree_create(&tree, 1, HCOUNT_BATCH_DEFAULT, &limit))
		return 1;
	if (hcount_ns_create(&ns, hcount_tree_root(tree), &limit))
		return 1;
	bad = hcount_charge(ns, 0, 3) != 0 || hcount_ns_count(ns, 0) != 3 ||
	      hcount_charge(ns, 0, 8) != -EDQUOT || hcount_uncharge(ns, 0, 3) != 0;
	bad |= hcount_ns_destroy(ns) != 0 || hcount_tree_destroy(tree) != 0;
	return bad;
}

static int check_managed()
{
	struct percpu_ref_managed_stats stats;

	percpu_ref_managed_get_stats(&stats);
	return percpu_ref_managed_flush() == 0 ? 0 : 1;
}

/* this_cpu.h's own calls, on the mode word of a ref in atomic mode (which
 * the library wrote, as the _after_setup variant needs): flagged, or no
 * rseq, never added. */
static int check_this_cpu()
{
	struct percpu_ref ref;
	int bad;

	if (percpu_ref_init(&ref, percpu_release, PERCPU_REF_INIT_ATOMIC))
		return 1;
	bad = percpuref_this_cpu_add(&ref.percpu_count_ptr, 1) == PERCPUREF_THIS_CPU_DONE ||
	      percpuref_this_cpu_add_after_setup(&ref.percpu_count_ptr, 1) ==
		      PERCPUREF_THIS_CPU_DONE;
	/* The area exactly when the process counts on rseq. */
	bad |= !percpuref_this_rseq_area() != !strncmp(percpuref_fast_path(), "fallback", 8);
#if PERCPUREF_HAVE_RSEQ
	/* At the published offset from the thread pointer. */
	if (struct percpuref_rseq_area *rs = percpuref_this_rseq_area())
		bad |= reinterpret_cast<char *>(rs) -
				static_cast<char *>(percpuref_thread_pointer()) !=
			percpuref_rseq_offset;
#endif
	percpu_ref_exit(&ref);
	return bad;
}

int main()
{
	return check_kref() | check_rcuref() | check_percpu_ref() | check_percpu_rcuref() |
	       check_hcount() | check_managed() | check_this_cpu();
}
