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
#include <execinfo.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#else
#define UNDER_TSAN 0
#endif

/* ASan's stack printer symbolises; ThreadSanitizer would report its
 * allocations inside a signal handler (and halt_on_error stops there). */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define CHILD_ASAN_STACK 1
#else
#define CHILD_ASAN_STACK 0
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

/*
 * A deadline for a child (or a test) that may hang: after @seconds,
 * SIGALRM prints the stack of the thread it lands on (in a forked child,
 * the only one) to stderr and then ends the process by SIGALRM, so the
 * exit status stays 128 + SIGALRM and a hang in CI says where it hung.
 * ASan's printer symbolises; elsewhere glibc's backtrace() gives
 * addresses (addr2line -e BINARY turns them into lines), and is called
 * once beforehand, as its first call loads libgcc_s, which allocates.
 */
static inline void child_deadline_fired(int sig)
{
	static const char msg[] = "# deadline passed: stack of the hung thread\n";
	int saved_errno = errno;
	ssize_t unused = write(STDERR_FILENO, msg, sizeof(msg) - 1);

	(void)unused;
#if CHILD_ASAN_STACK
	__sanitizer_print_stack_trace();
#else
	void *frames[64];

	backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
#endif
	errno = saved_errno;
	signal(sig, SIG_DFL);
	raise(sig);
}

static inline void child_deadline(unsigned int seconds)
{
#if !CHILD_ASAN_STACK
	void *frame;

	(void)backtrace(&frame, 1);
#endif
	signal(SIGALRM, child_deadline_fired);
	alarm(seconds);
}

#endif
