/* SPDX-License-Identifier: MIT */
/*
 * registrations.h - how many threads hold a registration of the fast path
 * now: an rseq area of the library's own, or a fallback reader's unit (0
 * under rseq-glibc, whose areas glibc registers for every thread).
 */
#ifndef PERCPUREF_TESTS_REGISTRATIONS_H
#define PERCPUREF_TESTS_REGISTRATIONS_H

#include "internal.h"

static inline unsigned int registered_threads(void)
{
	return percpuref_rseq_own_threads() + percpuref_readers_registered();
}

#endif
