/* SPDX-License-Identifier: MIT */
/*
 * Threads of this process by name (/proc/self/task/TID/comm): how tests
 * find the library's threads ("percpuref-cb", "percpuref-recl").
 */
#ifndef PERCPUREF_TESTS_THREAD_NAMES_H
#define PERCPUREF_TESTS_THREAD_NAMES_H

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

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

#endif
