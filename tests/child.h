/* SPDX-License-Identifier: MIT */
/*
 * Tests that run a scenario in a child process: re-executed with a mode
 * argument (posix_spawn: works under every sanitizer), or forked.
 * ThreadSanitizer cannot run threads in the child of a threaded process
 * (UNDER_TSAN: forked scenarios skip it).
 */
#ifndef PERCPUREF_TESTS_CHILD_H
#define PERCPUREF_TESTS_CHILD_H

#include <errno.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#else
#define UNDER_TSAN 0
#endif

/* Exit status of a child: its code, or 128 + the signal that ended it. */
static inline int wait_child(pid_t pid)
{
	int status;

	if (pid <= 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Re-executes this test in @mode; its exit status (see wait_child()). */
static inline int run_mode(const char *mode)
{
	/* A cross build's tests run under an emulator (qemu-user), which
	 * cannot exec a foreign binary by itself: it runs the child too. */
	char *emulator = getenv("PERCPUREF_TEST_EMULATOR");
	char *argv[] = { emulator, program_invocation_name, (char *)mode, NULL };
	char **args = emulator && *emulator ? argv : argv + 1;
	pid_t pid;

	if (posix_spawnp(&pid, args[0], NULL, NULL, args, environ))
		return -1;
	return wait_child(pid);
}

#endif
