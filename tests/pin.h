/* SPDX-License-Identifier: MIT */
/*
 * Tests that need the calling thread to stay on one CPU: its pushes share
 * a stage of the managed list, or the library's threads it starts take
 * that CPU too.
 */
#ifndef PERCPUREF_TESTS_PIN_H
#define PERCPUREF_TESTS_PIN_H

#include <sched.h>
#include <stdbool.h>

/*
 * This thread pinned to the CPU it runs on, @saved its affinity before;
 * false (nothing changed) where it cannot be.
 */
static inline bool pin_here(cpu_set_t *saved)
{
	cpu_set_t one;
	int cpu = sched_getcpu();

	if (cpu < 0 || sched_getaffinity(0, sizeof(*saved), saved))
		return false;
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	return !sched_setaffinity(0, sizeof(one), &one);
}

#endif
