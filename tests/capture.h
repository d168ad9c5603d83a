/* SPDX-License-Identifier: MIT */
/*
 * Tests that check what the library prints: run a call with stderr sent
 * to a temporary file.
 */
#ifndef PERCPUREF_TESTS_CAPTURE_H
#define PERCPUREF_TESTS_CAPTURE_H

#include <stdio.h>
#include <unistd.h>

/* Runs @fn(@arg) with stderr sent to a temporary file; what it printed (at
 * most @len - 1 bytes) goes to @buf. */
static inline void capture_stderr(void (*fn)(void *), void *arg, char *buf, size_t len)
{
	FILE *tmp = tmpfile();
	int saved = dup(STDERR_FILENO);
	size_t n;

	fflush(stderr);
	dup2(fileno(tmp), STDERR_FILENO);
	fn(arg);
	fflush(stderr);
	dup2(saved, STDERR_FILENO);
	close(saved);
	rewind(tmp);
	n = fread(buf, 1, len - 1, tmp);
	buf[n] = '\0';
	fclose(tmp);
}

#endif
