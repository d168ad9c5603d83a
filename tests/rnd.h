/* SPDX-License-Identifier: MIT */
/*
 * The stress tests' random numbers: the C standard's example LCG on a
 * caller-held seed, so that each thread has its own sequence and a seed
 * printed by a test reproduces its run.  Not for anything but choosing.
 */
#ifndef PERCPUREF_TESTS_RND_H
#define PERCPUREF_TESTS_RND_H

static inline unsigned int rnd(unsigned int *seed)
{
	*seed = *seed * 1103515245u + 12345u;
	return *seed >> 16;
}

#endif
