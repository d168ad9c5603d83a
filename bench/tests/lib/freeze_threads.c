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

/* Whether thread @tid has ended: gone, or a zombie not yet reaped (whose
 * PTRACE_SEIZE fails with EPERM, as a refusal would). */
static int ended(pid_t tid)
{
	char path[64], line[512], state = 0, *comm_end;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)tid);
	f = fopen(path, "r");
	if (!f)
		return 1;
	/* "pid (comm) state ...": comm may hold spaces and parentheses. */
	if (fgets(line, sizeof(line), f) && (comm_end = strrchr(line, ')')))
		(void)sscanf(comm_end + 1, " %c", &state);
	fclose(f);
	return state == 'Z' || state == 'X';
}

int main(int argc, char **argv)
{
	int status, err;

	if (argc < 2) {
		fprintf(stderr, "usage: freeze_threads TID...\n");
		return 1;
	}
	for (int i = 1; i < argc; i++) {
		char *end;
		long tid = strtol(argv[i], &end, 10);

		if (*end || end == argv[i] || tid <= 0 || tid != (pid_t)tid) {
			fprintf(stderr, "freeze_threads: not a thread id: \"%s\"\n", argv[i]);
			return 1;
		}
		if (ptrace(PTRACE_SEIZE, (pid_t)tid, NULL, NULL)) {
			err = errno;
			fprintf(stderr, "freeze_threads: PTRACE_SEIZE %ld: %s\n", tid, strerror(err));
			if (err == ESRCH || ended((pid_t)tid))
				return 78;
			return err == EPERM ? 77 : 1;
		}
		/* A thread that ends meanwhile reports its exit, not a stop. */
		if (ptrace(PTRACE_INTERRUPT, (pid_t)tid, NULL, NULL) ||
		    waitpid((pid_t)tid, &status, __WALL) != (pid_t)tid || !WIFSTOPPED(status)) {
			err = errno;
			fprintf(stderr, "freeze_threads: thread %ld did not stop\n", tid);
			return err == ESRCH || ended((pid_t)tid) ? 78 : 1;
		}
	}
	printf("frozen\n");
	fflush(stdout);
	/* Stops (a signal's delivery) stay stopped; exits are reaped. */
	while (waitpid(-1, &status, __WALL) > 0 || errno == EINTR)
		;
	return 0;
}
