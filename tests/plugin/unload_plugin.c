/* SPDX-License-Identifier: MIT */
/*
 * unload_plugin.c - the object tests/unit/test_unload.c loads and unloads.
 * percpuref's inline fast paths are compiled here, so the rseq descriptor
 * a get or put leaves its thread pointing at lies in this object, as in a
 * user's plugin.  It links no percpuref of its own: the library's symbols
 * come from the test executable, whose copy runs the refs.
 */
#include <percpuref/percpu_rcuref.h>

/* The ref the callbacks below get and put: set before they can run. */
static struct percpu_ref *touched;
static int calls;	/* atomic: callbacks run on the library's threads */

void plugin_touch(struct percpu_ref *ref)
{
	percpu_ref_get(ref);
	percpu_ref_put(ref);
}

void plugin_set_touched(struct percpu_ref *ref)
{
	touched = ref;
}

/* A @release that drops a reference to another object, as most do. */
void plugin_release(struct percpu_ref *ref)
{
	(void)ref;
	plugin_touch(touched);
	__atomic_fetch_add(&calls, 1, __ATOMIC_RELEASE);
}

void plugin_rcu_release(struct percpu_rcuref *ref)
{
	plugin_release(&ref->ref);
}

int plugin_calls(void)
{
	return __atomic_load_n(&calls, __ATOMIC_ACQUIRE);
}
