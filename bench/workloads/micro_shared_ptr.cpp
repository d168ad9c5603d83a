/* SPDX-License-Identifier: MIT */
/*
 * micro_shared_ptr.cpp - the shared_ptr variant of the micro workload:
 * what C++ code pays for a shared reference.
 *
 * Copying a std::shared_ptr increments the control block's use count and
 * destroying the copy decrements it: with libstdc++ both are locked RMWs
 * on one shared line once the process has started a second thread (before
 * that, __libc_single_threaded lets libstdc++ use plain adds; the harness
 * has always started its threads by the time this runs).  The pair loop
 * lives here so the copy is a real C++ copy, inlined, with no call per pair.
 * No exception leaves this file: the harness is C, which an exception
 * crossing would end in terminate() (SIGABRT) instead of an error exit.
 */
#include <cstdlib>
#include <memory>
#include <new>

#include "bench.h"
#include "micro_shared_ptr.h"

typedef std::shared_ptr<long> long_ptr;

void *micro_shared_ptr_new(void)
{
	/* Aligned block: the shared_ptr (read by all) shares no line. */
	void *mem = bench_zalloc(sizeof(long_ptr));

	/* make_shared: one allocation for the control block and the long.
	 * Its std::bad_alloc must not reach the C harness (terminate()). */
	try {
		return new (mem) long_ptr(std::make_shared<long>(0));
	} catch (const std::bad_alloc &e) {
		bench_die("micro shared_ptr: make_shared: out of memory (%s)", e.what());
	}
}

void micro_shared_ptr_delete(void *sp)
{
	static_cast<long_ptr *>(sp)->~long_ptr();
	free(sp);
}

void micro_shared_ptr_pairs(void *sp, unsigned int n)
{
	const long_ptr &shared = *static_cast<const long_ptr *>(sp);

	for (unsigned int i = 0; i < n; i++) {
		long_ptr copy(shared);	/* atomic increment of use_count */
	}				/* atomic decrement */
}

long micro_shared_ptr_use_count(void *sp)
{
	return static_cast<long_ptr *>(sp)->use_count();
}
