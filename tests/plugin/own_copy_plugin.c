/* SPDX-License-Identifier: MIT */
/*
 * own_copy_plugin.c - a plugin that carries its own copy of percpuref (the
 * static library, its symbols kept local), as a user's plugin may, for
 * tests/unit/test_unload.c: each load is a new copy with its own pthread
 * key for thread-exit hooks, which its unload must not leave behind.
 */
#include <percpuref/percpu_ref.h>

static void nothing(struct percpu_ref *ref)
{
	(void)ref;
}

/* A ref's life on the calling thread: its cache of counters, and so a
 * thread-exit hook of this copy, is set up for this thread; then the
 * thread is made ready for the unload.  0 or -errno. */
int own_copy_run(void)
{
	struct percpu_ref ref;
	int err = percpu_ref_init(&ref, nothing, PERCPU_REF_INIT_ATOMIC);

	if (err)
		return err;
	percpu_ref_get(&ref);
	percpu_ref_put(&ref);
	percpu_ref_exit(&ref);
	/* The rseq area points at this object's sequence: the thread may
	 * unload it (the rule for any object that inlined the fast path). */
	percpuref_prepare_unload();
	return 0;
}
