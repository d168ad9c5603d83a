/* SPDX-License-Identifier: MIT */
/* Built against the *installed* library through pkg-config by
 * check_install.sh: proves the headers, libraries and percpuref.pc install
 * and work together. */
#include <percpuref/percpu_ref.h>
#include <stdio.h>

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
	printf("installed percpuref: released=%d\n", released);
	return released ? 0 : 1;
}
