/* SPDX-License-Identifier: MIT */
/*
 * ref_mode.h - what mode a ref is in, read from its mode word as the fast
 * paths read it: tests check a switch's effect with it.  Sequentially
 * consistent: a test may read it while the callback thread or the
 * reclaimer switches the ref, or from a signal handler that interrupted
 * a get or put, and orders it against its own flags.
 */
#ifndef PERCPUREF_TESTS_REF_MODE_H
#define PERCPUREF_TESTS_REF_MODE_H

#include <stdbool.h>

#include "percpuref/percpu_ref.h"

static inline bool is_atomic(struct percpu_ref *ref)
{
	return __atomic_load_n(&ref->percpu_count_ptr, __ATOMIC_SEQ_CST) & __PERCPU_REF_ATOMIC;
}

#endif
