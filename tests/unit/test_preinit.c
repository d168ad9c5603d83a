/* SPDX-License-Identifier: MIT */
/*
 * test_preinit.c - the per-CPU add called before anything set the library
 * up (this program's first library call): it must take the slow-path exit
 * and write nothing.  Before the x86-64 sequence tested for "no unit" ahead
 * of its rseq_cs store, the zero params word sent that store to %fs:8,
 * glibc's DTV pointer, and the process died at exit in realloc().
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>

#include "percpuref/percpu_ref.h"
#include "percpuref/this_cpu.h"
#include "tap.h"

static __thread int dynamic_tls = 7;	/* touched after the call */

static void no_release(struct percpu_ref *ref)
{
	(void)ref;
}

int main(void)
{
	uintptr_t flagged = 1;	/* a mode word with a flag: never commits */
	unsigned char before[64], after[64];
	struct percpu_ref ref;
	enum percpuref_this_cpu_result r;

	/* The thread's TCB head, where glibc keeps tcb, dtv, self. */
	memcpy(before, __builtin_thread_pointer(), sizeof(before));
	r = percpuref_this_cpu_add(&flagged, 1);
	memcpy(after, __builtin_thread_pointer(), sizeof(after));
	ok(r != PERCPUREF_THIS_CPU_DONE, "before set-up: nothing added (result %d)", (int)r);
	ok(!memcmp(before, after, sizeof(before)), "before set-up: the TCB head is untouched");
	ok(dynamic_tls == 7, "TLS still reads");

	is(percpu_ref_init(&ref, no_release, 0), 0, "then a ref works");
	percpu_ref_get(&ref);
	percpu_ref_put(&ref);
	ok(!percpu_ref_is_zero(&ref), "its count is exact");
	percpu_ref_exit(&ref);
	return done_testing();
}
