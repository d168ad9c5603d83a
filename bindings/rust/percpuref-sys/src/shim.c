/* SPDX-License-Identifier: MIT */
/*
 * shim.c - out-of-line copies of the header-only fast paths, for Rust,
 * which cannot call a static inline C function.  Each is the inline
 * function and nothing else: one call more per get or put, still no
 * shared cache line written in per-CPU mode.
 */
#include <errno.h>
#include <stddef.h>

#include <percpuref/compiler.h>
#include <percpuref/percpu_rcuref.h>
#include <percpuref/percpu_ref.h>

PERCPUREF_API void percpuref_sys_get(struct percpu_ref *ref)
{
	percpu_ref_get(ref);
}

PERCPUREF_API bool percpuref_sys_tryget(struct percpu_ref *ref)
{
	return percpu_ref_tryget(ref);
}

PERCPUREF_API bool percpuref_sys_tryget_live(struct percpu_ref *ref)
{
	return percpu_ref_tryget_live(ref);
}

PERCPUREF_API void percpuref_sys_put(struct percpu_ref *ref)
{
	percpu_ref_put(ref);
}

PERCPUREF_API void percpuref_sys_kill(struct percpu_ref *ref)
{
	percpu_ref_kill(ref);
}

PERCPUREF_API bool percpuref_sys_is_dying(struct percpu_ref *ref)
{
	return percpu_ref_is_dying(ref);
}

/*
 * The C side of what src/lib.rs declares, for its test to compare: the
 * layout of struct percpu_ref, the init flags, the poll flag and the errno
 * values the library returns that the Rust crates tell apart, in this
 * order.
 */
PERCPUREF_API void percpuref_sys_abi(size_t out[12])
{
	out[0] = sizeof(struct percpu_ref);
	out[1] = _Alignof(struct percpu_ref);
	out[2] = offsetof(struct percpu_ref, percpu_count_ptr);
	out[3] = offsetof(struct percpu_ref, data);
	out[4] = PERCPU_REF_INIT_ATOMIC;
	out[5] = PERCPU_REF_INIT_DEAD;
	out[6] = PERCPU_REF_ALLOW_REINIT;
	out[7] = PERCPU_REF_POLL_WAIT;
	out[8] = EPERM;
	out[9] = EALREADY;
	out[10] = EDEADLK;
	out[11] = EINVAL;
}
