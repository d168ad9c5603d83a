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
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#else
#define UNDER_TSAN 0
#endif

/* Under valgrind (ctest's valgrind_ tests set PERCPUREF_VALGRIND): every
 * instruction is emulated, threads run one at a time, and the leak check
 * counts what a fork child never frees.  Tests take fewer rounds. */
#define UNDER_VALGRIND (getenv("PERCPUREF_VALGRIND") != NULL)

/* Under an emulator (a cross build's tests under qemu-user set
 * PERCPUREF_TEST_EMULATOR: run_mode_env() below runs children with it). */
#define UNDER_EMULATOR \
	(getenv("PERCPUREF_TEST_EMULATOR") && *getenv("PERCPUREF_TEST_EMULATOR"))

/* Under ASan, or valgrind: neither keeps the library's spare impls, whose
 * reuse some tests check. */
static inline bool under_memory_checker(void)
{
#if defined(__SANITIZE_ADDRESS__)
	return true;
#else
	return UNDER_VALGRIND;
#endif
}

/* Why a test whose fork children start threads is skipped here, or NULL:
 * ThreadSanitizer allows no threads in a fork child, and under valgrind
 * the children leak by design. */
static inline const char *fork_children_untestable(void)
{
	if (UNDER_TSAN)
		return "ThreadSanitizer: no threads in a fork child";
	if (UNDER_VALGRIND)
		return "valgrind: fork children leak by design";
	return NULL;
}

/* ASan's stack printer symbolises; ThreadSanitizer would report its
 * allocations inside a signal handler (and halt_on_error stops there). */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define CHILD_ASAN_STACK 1
#else
#define CHILD_ASAN_STACK 0
#endif
/* glibc's backtrace() (musl has none: the /proc lines alone there). */
#if !CHILD_ASAN_STACK && defined(__GLIBC__)
#include <execinfo.h>
#define CHILD_BACKTRACE 1
#else
#define CHILD_BACKTRACE 0
#endif

/* A wait status as one number: the code, or 128 + the signal that ended it. */
static inline int child_exit_code(int status)
{
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Exit status of a child (child_exit_code()). */
static inline int wait_child(pid_t pid)
{
	int status;

	if (pid <= 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return child_exit_code(status);
}

/*
 * waitpid(@pid, @status, 0) for at most @seconds (CLOCK_MONOTONIC); then
 * the child is killed with SIGKILL, reaped, and *@overdue set (false
 * otherwise).  For a child whose own deadline (an alarm) might not end it:
 * under qemu-user a process stuck inside the emulator takes no signal but
 * SIGKILL, which the kernel delivers itself (fork_gate.h: the lock it got
 * stuck on).  Polled, from 1 ms up to 8 ms between looks.  Returns
 * waitpid()'s result.  The stress tests give a child CHILD_GRACE_S past
 * its own deadline.
 */
#define CHILD_GRACE_S 40
static inline pid_t waitpid_within(pid_t pid, int *status, unsigned int seconds, bool *overdue)
{
	struct timespec now, nap = { 0, 1000 * 1000 };
	time_t end;
	pid_t got;

	clock_gettime(CLOCK_MONOTONIC, &now);
	end = now.tv_sec + (time_t)seconds;
	*overdue = false;
	while ((got = waitpid(pid, status, WNOHANG)) == 0) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec >= end) {
			*overdue = true;
			kill(pid, SIGKILL);
			while ((got = waitpid(pid, status, 0)) < 0 && errno == EINTR)
				;
			return got;
		}
		nanosleep(&nap, NULL);
		if (nap.tv_nsec < 8 * 1000 * 1000)
			nap.tv_nsec *= 2;
	}
	return got;
}

/* Re-executes this test in @mode with the environment @envp; its exit
 * status (see wait_child()). */
static inline int run_mode_env(const char *mode, char **envp)
{
	/* A cross build's tests run under an emulator (qemu-user), which
	 * cannot exec a foreign binary by itself: it runs the child too. */
	char *emulator = getenv("PERCPUREF_TEST_EMULATOR");
	char *argv[] = { emulator, program_invocation_name, (char *)mode, NULL };
	char **args = emulator && *emulator ? argv : argv + 1;
	pid_t pid;

	if (posix_spawnp(&pid, args[0], NULL, NULL, args, envp))
		return -1;
	return wait_child(pid);
}

/* The same with this process's environment. */
static inline int run_mode(const char *mode)
{
	return run_mode_env(mode, environ);
}

/*
 * A deadline for a child (or a test) that may hang.  After @seconds the
 * process dies by SIGALRM, as from a bare alarm(): the default action,
 * which the kernel carries out even when none of its threads can run (a
 * real-time spinner, a handler stuck on a lock), so exit statuses stay
 * 128 + SIGALRM.  A second before, a timer sends SIGURG to the thread
 * that set the deadline (the test's, where a hang shows), whose handler
 * prints that thread's stack to stderr, then has every other thread of the
 * process print its own, one at a time (a fork child's hang may be in the
 * thread it started: the callback thread a barrier waits for), so that a
 * hang in CI says where it hung; a thread that prints nothing within its
 * 200 ms (it blocks SIGURG, as the library's threads do in a program
 * that does not open it to them as this header does below, or its handler
 * cannot run) has its /proc stat and
 * syscall lines printed instead: its name, its state, and the system call
 * it waits in with its stack pointer and pc.  Where the handler cannot run
 * (ThreadSanitizer defers it until the thread leaves a lock wait), the
 * process still dies on time.  ASan's printer symbolises; with glibc,
 * glibc's backtrace() prints each frame as BINARY(+OFFSET), for addr2line
 * -e BINARY OFFSET, and is called once when the process starts (below), as
 * its first call loads libgcc_s with dlopen(): not in a handler, nor in a
 * fork child of a threaded process.  Only async-signal-safe calls in the
 * handler: the task list is read with getdents64.
 */
static int child_deadline_printed;	/* stacks printed: the handler's acks */

static inline void child_deadline_print_one(const char *msg, size_t len)
{
	ssize_t unused = write(STDERR_FILENO, msg, len);

	(void)unused;
#if CHILD_ASAN_STACK
	__sanitizer_print_stack_trace();
#elif CHILD_BACKTRACE
	void *frames[64];

	backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
#endif
	/* Release: the forwarding thread reads it before the next thread. */
	__atomic_fetch_add(&child_deadline_printed, 1, __ATOMIC_RELEASE);
}

/* Appends /proc/self/task/@tid/@file (its first 1 KiB, a line) to stderr. */
static inline void child_deadline_print_task_file(const char *tid, const char *file)
{
	char path[64] = "/proc/self/task/", buf[1024];
	ssize_t n;
	int fd;

	strcat(strcat(strcat(path, tid), "/"), file);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return;
	if (buf[n - 1] != '\n')
		buf[n++] = '\n';
	if (write(STDERR_FILENO, buf, (size_t)n) < 0)
		return;
}

/* A thread that printed nothing (it blocks SIGURG, or its handler could
 * not run): its name, state and, if in a system call, the call's number,
 * arguments, stack pointer and pc (for addr2line): the kernel's view. */
static inline void child_deadline_print_silent(const char *tid)
{
	static const char msg[] = "# deadline near: a thread that did not answer; stat, syscall:\n";
	ssize_t unused = write(STDERR_FILENO, msg, sizeof(msg) - 1);

	(void)unused;
	child_deadline_print_task_file(tid, "stat");
	child_deadline_print_task_file(tid, "syscall");
}

/* Every other thread prints its stack, each given up to 200 ms. */
static inline void child_deadline_forward(void)
{
	const struct timespec one_ms = { 0, 1000000 };
	char buf[1024];
	long n;
	int dir = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (dir < 0)
		return;
	while ((n = syscall(SYS_getdents64, dir, buf, sizeof(buf))) > 0) {
		for (long off = 0; off < n;) {
			/* struct linux_dirent64: ino 8, off 8, reclen 2, type 1, name */
			unsigned short reclen;
			const char *name = buf + off + 19, *tid_name = name;
			pid_t tid = 0;
			int before = __atomic_load_n(&child_deadline_printed, __ATOMIC_ACQUIRE);

			memcpy(&reclen, buf + off + 16, sizeof(reclen));
			off += reclen;
			for (; *name >= '0' && *name <= '9'; name++)
				tid = tid * 10 + (*name - '0');
			if (!tid || tid == gettid() ||
			    syscall(SYS_tgkill, getpid(), tid, SIGURG))
				continue;
			for (int ms = 0; ms < 200 && __atomic_load_n(&child_deadline_printed,
								   __ATOMIC_ACQUIRE) == before;
			     ms++)
				nanosleep(&one_ms, NULL);
			if (__atomic_load_n(&child_deadline_printed, __ATOMIC_ACQUIRE) == before)
				child_deadline_print_silent(tid_name);
		}
	}
	close(dir);
}

static inline void child_deadline_print_stack(int sig)
{
	static const char first[] = "# deadline near: stack of the thread that set it\n";
	static const char other[] = "# deadline near: stack of another thread\n";
	static int forwarding;
	int saved_errno = errno;

	(void)sig;
	if (__atomic_exchange_n(&forwarding, 1, __ATOMIC_ACQ_REL)) {
		child_deadline_print_one(other, sizeof(other) - 1);
	} else {
		child_deadline_print_one(first, sizeof(first) - 1);
		child_deadline_forward();
	}
	errno = saved_errno;
}

/* The library's threads block every signal but the one a test opens
 * (src/runtime.c, "Signal masks"): SIGURG, for the deadline's stacks.
 * Before main(), so before the library starts any. */
#ifdef __cplusplus
extern "C"
#endif
void percpuref_test_library_threads_accept(int sig);
static __attribute__((constructor)) void child_deadline_open_library_threads(void)
{
	percpuref_test_library_threads_accept(SIGURG);
}

#if CHILD_BACKTRACE
static __attribute__((constructor)) void child_deadline_load_backtrace(void)
{
	void *frame;

	(void)backtrace(&frame, 1);
}
#endif

/* This process's timer: a fork child has none of its parent's. */
static pid_t child_deadline_timer_pid;
static timer_t child_deadline_timer;

/* Arms this process's timer (if it has one) and alarm for @seconds from
 * now.  child_deadline() calls it; a child that is slow, not hung, calls
 * it again as long as it shows progress, to push its deadline back (the
 * stack printer still aimed at the thread that set it). */
static inline void child_deadline_rearm(unsigned int seconds)
{
	struct itimerspec when;

	memset(&when, 0, sizeof(when));
	if (seconds > 1)
		when.it_value.tv_sec = seconds - 1;
	else
		when.it_value.tv_nsec = 500 * 1000 * 1000;
	if (child_deadline_timer_pid == getpid())
		timer_settime(child_deadline_timer, 0, &when, NULL);
	alarm(seconds);
}

static inline void child_deadline(unsigned int seconds)
{
	struct sigaction print;
	struct sigevent to_this_thread;

	/* Fields one by one: C++ includes this file too. */
	memset(&print, 0, sizeof(print));
	print.sa_handler = child_deadline_print_stack;
	print.sa_flags = SA_RESTART;
	memset(&to_this_thread, 0, sizeof(to_this_thread));
	to_this_thread.sigev_notify = SIGEV_THREAD_ID;
	to_this_thread.sigev_signo = SIGURG;
#ifdef sigev_notify_thread_id	/* musl */
	to_this_thread.sigev_notify_thread_id = gettid();
#else
	to_this_thread._sigev_un._tid = gettid();
#endif
	if (child_deadline_timer_pid == getpid())
		timer_delete(child_deadline_timer);
	child_deadline_timer_pid = timer_create(CLOCK_MONOTONIC, &to_this_thread,
						&child_deadline_timer) ? 0 : getpid();
	sigaction(SIGURG, &print, NULL);
	child_deadline_rearm(seconds);
}

#endif
