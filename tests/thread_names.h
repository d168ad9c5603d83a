/* SPDX-License-Identifier: MIT */
/*
 * Threads of this process by name (/proc/self/task/TID/comm): how tests
 * find the library's threads ("percpuref-cb", "percpuref-recl"); and
 * whether one sleeps (/proc/self/task/TID/stat).
 */
#ifndef PERCPUREF_TESTS_THREAD_NAMES_H
#define PERCPUREF_TESTS_THREAD_NAMES_H

#include <dirent.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

/* The name of thread @tid (decimal) of this process, without its newline,
 * into @name; false when it cannot be read (no such thread). */
static inline bool thread_name(const char *tid, char name[32])
{
	char path[300];
	bool read;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/task/%s/comm", tid);
	f = fopen(path, "r");
	if (!f)
		return false;
	read = fgets(name, 32, f) != NULL;
	fclose(f);
	if (read)
		name[strcspn(name, "\n")] = '\0';
	return read;
}

/* The id of the thread named @name; 0: none. */
static inline pid_t thread_named(const char *name)
{
	DIR *tasks = opendir("/proc/self/task");
	struct dirent *d;
	char comm[32];
	pid_t tid = 0;

	while (tasks && (d = readdir(tasks)))
		if (thread_name(d->d_name, comm) && !strcmp(comm, name))
			tid = (pid_t)atoi(d->d_name);
	if (tasks)
		closedir(tasks);
	return tid;
}

/* Waits, up to 10 s, until thread @tid sleeps ('S' in its /proc stat): in
 * a blocking call.  False if it does not, or has ended. */
static inline bool wait_until_sleeping(pid_t tid)
{
	struct timespec start, now;
	char path[64], stat[256], *state;

	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (now = start; now.tv_sec - start.tv_sec < 10; clock_gettime(CLOCK_MONOTONIC, &now)) {
		FILE *f = fopen(path, "r");
		bool sleeping = false;

		if (!f)
			return false;
		if (fgets(stat, sizeof(stat), f) && (state = strrchr(stat, ')')))
			sleeping = state[1] == ' ' && state[2] == 'S';
		fclose(f);
		if (sleeping)
			return true;
		sched_yield();
	}
	return false;
}

#endif
