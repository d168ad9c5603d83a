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
#include <string.h>
#include <sys/wait.h>
#include <time.h>
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
 * A deadline for a child (or a test) that may hang.  After @seconds the
 * process dies by SIGALRM, as from a bare alarm(): the default action,
 * which the kernel carries out even when none of its threads can run (a
 * real-time spinner, a handler stuck on a lock), so exit statuses stay
 * 128 + SIGALRM.  A second before, a timer sends SIGURG to the thread
 * that set the deadline (the test's, where a hang shows), whose handler
 * prints that thread's stack to stderr, so that a hang in CI says where
 * it hung; where the handler cannot run (ThreadSanitizer defers it until
 * the thread leaves a lock wait), the process still dies on time.  ASan's
 * printer symbolises; elsewhere glibc's backtrace() prints each frame as
 * BINARY(+OFFSET), for addr2line -e BINARY OFFSET, and is called once
 * when the process starts (below), as its first call loads libgcc_s with
 * dlopen(): not in a handler, nor in a fork child of a threaded process.
 */
static inline void child_deadline_print_stack(int sig)
{
	static const char msg[] = "# deadline near: stack of the thread that set it\n";
	int saved_errno = errno;
	ssize_t unused = write(STDERR_FILENO, msg, sizeof(msg) - 1);

	(void)sig;
	(void)unused;
#if CHILD_ASAN_STACK
	__sanitizer_print_stack_trace();
#else
	void *frames[64];

	backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
#endif
	errno = saved_errno;
}

#if !CHILD_ASAN_STACK
static __attribute__((constructor)) void child_deadline_load_backtrace(void)
{
	void *frame;

	(void)backtrace(&frame, 1);
}
#endif

static inline void child_deadline(unsigned int seconds)
{
	/* This process's timer: a fork child has none of its parent's. */
	static pid_t timer_pid;
	static timer_t timer;
	struct sigaction print;
	struct sigevent to_this_thread;
	struct itimerspec when;

	/* Fields one by one: C++ includes this file too. */
	memset(&print, 0, sizeof(print));
	print.sa_handler = child_deadline_print_stack;
	print.sa_flags = SA_RESETHAND | SA_RESTART;
	memset(&to_this_thread, 0, sizeof(to_this_thread));
	to_this_thread.sigev_notify = SIGEV_THREAD_ID;
	to_this_thread.sigev_signo = SIGURG;
	to_this_thread._sigev_un._tid = gettid();
	memset(&when, 0, sizeof(when));
	if (timer_pid == getpid())
		timer_delete(timer);
	timer_pid = timer_create(CLOCK_MONOTONIC, &to_this_thread, &timer) ? 0 : getpid();
	if (seconds > 1)
		when.it_value.tv_sec = seconds - 1;
	else
		when.it_value.tv_nsec = 500 * 1000 * 1000;
	sigaction(SIGURG, &print, NULL);
	if (timer_pid)
		timer_settime(timer, 0, &when, NULL);
	alarm(seconds);
}

#endif
