/* SPDX-License-Identifier: MIT */
/*
 * micro_shared_ptr.h - the std::shared_ptr variant of the micro workload,
 * seen from C (implemented in micro_shared_ptr.cpp).  The pointer is an
 * opaque std::shared_ptr<long> *.
 */
#ifndef PERCPUREF_BENCH_MICRO_SHARED_PTR_H
#define PERCPUREF_BENCH_MICRO_SHARED_PTR_H

#include <percpuref/compiler.h>

PERCPUREF_BEGIN_DECLS

/* A new shared_ptr owning one long (use_count 1), on its own cache lines. */
void *micro_shared_ptr_new(void);
void micro_shared_ptr_delete(void *sp);
/* @n times: copy *sp into a local shared_ptr and destroy the copy. */
void micro_shared_ptr_pairs(void *sp, unsigned int n);
long micro_shared_ptr_use_count(void *sp);

PERCPUREF_END_DECLS

#endif
