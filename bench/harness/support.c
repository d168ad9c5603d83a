/* SPDX-License-Identifier: MIT */
/*
 * support.c - the two helpers that every harness file and every workload
 * calls: bench_die() and bench_zalloc() (declared in bench.h).
 *
 * They live apart from main.c so that no harness file depends on the
 * command line's file: topology.c, measure.c and report.c call down into
 * this file and nothing here calls back up.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

void bench_die(const char *fmt, ...)
{
	va_list ap;

	/* The table so far on stdout first, so the message follows it. */
	fflush(stdout);
	fprintf(stderr, "percpuref-bench: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

void *bench_zalloc(size_t size)
{
	size_t rounded = (size + 127) & ~(size_t)127;
	void *p = aligned_alloc(128, rounded ? rounded : 128);

	if (!p)
		bench_die("out of memory (%zu bytes)", size);
	return memset(p, 0, rounded ? rounded : 128);
}
