/* SPDX-License-Identifier: MIT */
/* Built against the *installed* library through pkg-config and CMake by
 * check_install.sh: proves the headers, libraries, percpuref.pc and the
 * CMake package install and work together. */
#include <percpuref/percpu_rcuref.h>
#include <percpuref/percpu_ref.h>
#include <stdio.h>
#include <urcu-bp.h>

static int released;

static void release(struct percpu_ref *ref)
{
	(void)ref;
	released = 1;
}

int main(void)
{
	struct percpu_ref ref;

	if (percpu_ref_init(&ref, release, 0))
		return 1;
	percpu_ref_get(&ref);
	percpu_ref_put(&ref);
	percpu_ref_kill(&ref);
	percpu_ref_barrier();
	percpu_ref_exit(&ref);
	/* liburcu-bp directly, as percpu_rcuref.h allows: pkg-config's
	 * --libs must name it (it was only in Requires.private). */
	urcu_bp_read_lock();
	urcu_bp_read_unlock();
	urcu_bp_synchronize_rcu();
	/* 0.4.26's: the consumer then needs PERCPUREF_0.4.26. */
	printf("installed percpuref: released=%d, fences: %s\n", released,
	       percpuref_fence_method());
	return released ? 0 : 1;
}
