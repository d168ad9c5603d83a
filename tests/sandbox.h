/* SPDX-License-Identifier: MIT */
/*
 * What a sandbox or a busy process refuses a library that is already
 * running: membarrier(2) (a seccomp filter installed after start-up), and
 * new file descriptors (a full fd table); and the filters' installer, for
 * tests that refuse other calls.
 */
#ifndef PERCPUREF_TESTS_SANDBOX_H
#define PERCPUREF_TESTS_SANDBOX_H

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "child.h"

/*
 * install_filter() - install the seccomp filter @filter (@len
 * instructions) on every thread of the process (@flags
 * SECCOMP_FILTER_FLAG_TSYNC) or on the calling one (0).  0, or -1 where
 * no filter can be installed.
 */
static inline int install_filter(struct sock_filter *filter, unsigned short len,
				 unsigned int flags)
{
	struct sock_fprog prog = { len, filter };

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
		return -1;
	return (int)syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog);
}

/*
 * A filter's first instructions: a call of another architecture than
 * @audit_arch passes; one of ours jumps @not_it instructions on unless it
 * is system call @call.
 */
#define FILTER_MATCH_CALL(audit_arch, call, not_it)                                   \
	BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),      \
	BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (audit_arch), 1, 0),                      \
	BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),                                 \
	BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),        \
	BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (call), 0, (not_it))

/*
 * filter_membarrier() - install a seccomp filter, on every thread of the
 * process (the library's included), that answers membarrier(2) with
 * @action (SECCOMP_RET_ERRNO | EPERM: it fails; SECCOMP_RET_TRAP: a SIGSYS
 * handler emulates it).  0, or -1 where no filter can be installed.
 * x86_64 system calls only: other architectures' calls pass (tests skip
 * there).
 */
static inline int filter_membarrier(unsigned int action)
{
	struct sock_filter filter[] = {
		FILTER_MATCH_CALL(AUDIT_ARCH_X86_64, __NR_membarrier, 1),
		BPF_STMT(BPF_RET | BPF_K, action),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};

	return install_filter(filter, sizeof(filter) / sizeof(filter[0]), SECCOMP_FILTER_FLAG_TSYNC);
}

/* membarrier(2) fails with EPERM. */
static inline int refuse_membarrier(void)
{
	return filter_membarrier(SECCOMP_RET_ERRNO | EPERM);
}

/*
 * run_mode() of a mode that calls refuse_membarrier(); 77 (skip) under
 * qemu-user, where the filter would bind the emulator's own (host) system
 * calls too, so nothing of ours would be tested.
 */
static inline int run_mode_without_membarrier(const char *mode)
{
	return UNDER_EMULATOR ? 77 : run_mode(mode);
}

/*
 * fill_fd_table() - lower the open-file limit to the lowest free
 * descriptor, so that nothing more opens (EMFILE); *@before is the limit
 * to restore (LeakSanitizer reads /proc at exit).  False if it cannot.
 */
static inline bool fill_fd_table(struct rlimit *before)
{
	struct rlimit full;
	int lowest_free = dup(0);

	if (lowest_free < 0 || getrlimit(RLIMIT_NOFILE, before))
		return false;
	close(lowest_free);
	full = *before;
	full.rlim_cur = (rlim_t)lowest_free;
	return setrlimit(RLIMIT_NOFILE, &full) == 0;
}

#endif
