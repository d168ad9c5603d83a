// SPDX-License-Identifier: MIT
/*
 * freeze_threads.c - for cli.sh: freeze_threads TID... stops those threads
 * and keeps them stopped, so that a point of percpuref-bench never ends: a
 * thread that does not come back from its loop, a --processes child that
 * does not exit, neither of them stopped in a way its parent can see
 * (ptrace stops are the tracer's to see, not the parent's).
 *
 * Each thread is seized (PTRACE_SEIZE) and interrupted (PTRACE_INTERRUPT);
 * then "frozen" goes to standard output, and this program reaps what its
 * tracees do until none is left: it never resumes one, and a tracee
 * killed must be reaped here before its real parent can see it end.
 * Exit status 77 (skip) when ptrace is refused (a sandbox, Yama), 78 when
 * a thread is gone already (the run ended before it could be frozen, on a
 * loaded machine), 1 on any other failure.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/types.h>
#include <sys/wait.h>

int main(int argc, char **argv)
{
	int status;

	if (argc < 2) {
		fprintf(stderr, "usage: freeze_threads TID...\n");
		return 1;
	}
	for (int i = 1; i < argc; i++) {
		pid_t tid = (pid_t)atoi(argv[i]);

		if (ptrace(PTRACE_SEIZE, tid, NULL, NULL)) {
			fprintf(stderr, "freeze_threads: PTRACE_SEIZE %d: %s\n", tid,
				strerror(errno));
			return errno == EPERM ? 77 : errno == ESRCH ? 78 : 1;
		}
		if (ptrace(PTRACE_INTERRUPT, tid, NULL, NULL) ||
		    waitpid(tid, &status, __WALL) != tid || !WIFSTOPPED(status)) {
			fprintf(stderr, "freeze_threads: thread %d did not stop\n", tid);
			return 1;
		}
	}
	printf("frozen\n");
	fflush(stdout);
	/* Stops (a signal's delivery) stay stopped; exits are reaped. */
	while (waitpid(-1, &status, __WALL) > 0 || errno == EINTR)
		;
	return 0;
}
