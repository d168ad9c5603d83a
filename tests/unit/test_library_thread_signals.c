/* SPDX-License-Identifier: MIT */
/*
 * The library's threads block every asynchronous signal (src/runtime.c,
 * "Signal masks"), but not those their own instructions raise: a
 * synchronous SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP or SIGSYS that
 * finds its signal blocked is not held pending, the kernel unblocks it and
 * resets it to its default action, which kills the process.  So a callback
 * on the callback thread that faults on a page the program's SIGSEGV
 * handler maps on demand (a garbage collector's write barrier, a file
 * mapping's SIGBUS), or a library system call that a sandbox's seccomp
 * filter traps (SECCOMP_RET_TRAP, emulated by a SIGSYS handler: docs/
 * percpu_ref.md allows seccomp after start-up), killed the process where
 * the same code on any other thread went on.  Each case in a child.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "percpuref/percpu_ref.h"
#include "child.h"
#include "sandbox.h"
#include "tap.h"

static char *page;
static long page_size;
static int faults;		/* atomic */
static int off_main;		/* atomic: handlers run off the main thread */
static pid_t main_tid;

static void note_thread(void)
{
	if (gettid() != main_tid)
		__atomic_fetch_add(&off_main, 1, __ATOMIC_SEQ_CST);
}

/* Maps the page on demand, as a write barrier or a lazy mapping would. */
static void on_segv(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	if ((char *)si->si_addr < page || (char *)si->si_addr >= page + page_size)
		abort();
	mprotect(page, (size_t)page_size, PROT_READ | PROT_WRITE);
	note_thread();
	__atomic_fetch_add(&faults, 1, __ATOMIC_SEQ_CST);
}

/* The kill's confirm, on the callback thread: a write to the page. */
static void confirm_writes(struct percpu_ref *ref)
{
	(void)ref;
	*(volatile char *)page = 1;
}

static void noop_release(struct percpu_ref *ref)
{
	(void)ref;
}

/* Exit status 2: set-up failed; 3: the page was never faulted in; 4: not
 * on a library thread (the case tested nothing). */
static int confirm_faults(void)
{
	struct sigaction sa;
	struct percpu_ref r;

	child_deadline(20);
	main_tid = gettid();
	page_size = sysconf(_SC_PAGESIZE);
	page = mmap(NULL, (size_t)page_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED)
		return 2;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_segv;
	sa.sa_flags = SA_SIGINFO;
	if (sigaction(SIGSEGV, &sa, NULL) || percpu_ref_init(&r, noop_release, 0))
		return 2;
	/* Per-CPU: the callback thread finishes the switch, confirm and all. */
	percpu_ref_kill_and_confirm(&r, confirm_writes);
	if (percpu_ref_barrier())
		return 2;
	percpu_ref_exit(&r);
	if (__atomic_load_n(&faults, __ATOMIC_SEQ_CST) != 1)
		return 3;
	return __atomic_load_n(&off_main, __ATOMIC_SEQ_CST) == 1 ? 0 : 4;
}

#if defined(__x86_64__)
static int trapped;		/* atomic: membarrier calls trapped */

/* A sandbox's emulation of a trapped call: it fails with EPERM. */
static void on_sys(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)si;
	((ucontext_t *)uc)->uc_mcontext.gregs[REG_RAX] = -EPERM;
	note_thread();
	__atomic_fetch_add(&trapped, 1, __ATOMIC_SEQ_CST);
}

/* A ref killed and waited for: the callback thread finishes its switch,
 * a fence and all.  0, or -1. */
static int kill_on_callback_thread(void)
{
	struct percpu_ref r;

	if (percpu_ref_init(&r, noop_release, 0))
		return -1;
	percpu_ref_kill(&r);
	if (percpu_ref_barrier())
		return -1;
	percpu_ref_exit(&r);
	return 0;
}

/* Exit status 2: set-up failed; 4: trapped, never on a library thread;
 * 77: no filter here, or this fast path's fence calls no membarrier (the
 * fallback with no reader registered, or membarrier refused already). */
static int membarrier_trapped(void)
{
	struct sigaction sa;

	child_deadline(20);
	main_tid = gettid();
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sys;
	sa.sa_flags = SA_SIGINFO;
	if (sigaction(SIGSYS, &sa, NULL))
		return 2;
	/* Started up, the callback thread running: then the sandbox. */
	if (kill_on_callback_thread())
		return 2;
	/* Trapped to the SIGSYS handler (sandbox.h). */
	if (filter_membarrier(SECCOMP_RET_TRAP))
		return 77;
	/* The callback thread's fence calls membarrier: trapped there. */
	if (kill_on_callback_thread())
		return 2;
	if (!__atomic_load_n(&trapped, __ATOMIC_SEQ_CST))
		return 77;
	return __atomic_load_n(&off_main, __ATOMIC_SEQ_CST) ? 0 : 4;
}
#endif

int main(int argc, char **argv)
{
	int ret;

	if (argc > 1 && !strcmp(argv[1], "confirm-faults"))
		return confirm_faults();
#if defined(__x86_64__)
	if (argc > 1 && !strcmp(argv[1], "membarrier-trapped"))
		return membarrier_trapped();
#endif

	is(run_mode("confirm-faults"), 0,
	   "a confirm on the callback thread faults on a page the SIGSEGV handler maps");
#if defined(__x86_64__)
	if (UNDER_VALGRIND || UNDER_TSAN)
		ok(1, "skipped: seccomp filters under valgrind or ThreadSanitizer");
	else if ((ret = run_mode_without_membarrier("membarrier-trapped")) == 77)
		ok(1, "skipped: no seccomp filter here, or no membarrier on this fast path");
	else
		is(ret, 0, "membarrier trapped to a SIGSYS handler on the callback thread");
#else
	(void)ret;
#endif
	return done_testing();
}
