/* SPDX-License-Identifier: MIT */
/*
 * check.h - the one helper the examples share: CHECK(cond) stops the
 * program with the file, line and condition when @cond is false.  Unlike
 * assert() it stays on in release builds (-DNDEBUG), so the test command
 * that runs the examples checks what they claim.
 */
#ifndef PERCPUREF_EXAMPLES_CHECK_H
#define PERCPUREF_EXAMPLES_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                              \
	do {                                                                     \
		if (!(cond)) {                                                   \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__,  \
				__LINE__, #cond);                                \
			exit(1);                                                 \
		}                                                                \
	} while (0)

#endif
