// SPDX-License-Identifier: MIT
/*
 * create_first.c - an LD_PRELOAD shim for cli.sh: another process winning a
 * race.  The first open() or fopen() of $CREATE_FIRST_PATH finds that file
 * just created by "someone else" (content "theirs", and a marker file
 * $CREATE_FIRST_PATH.shim saying the shim ran), then goes on as asked.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static void create_first(const char *path)
{
	const char *target = getenv("CREATE_FIRST_PATH");
	static int done;
	char marker[4096];
	int fd;

	if (done || !target || strcmp(path, target))
		return;
	done = 1;
	/* The raw syscall: open() here would be ours again. */
	fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CREAT | O_EXCL, 0666);
	if (fd < 0)
		return;
	if (write(fd, "theirs\n", 7) != 7)
		abort();
	close(fd);
	snprintf(marker, sizeof(marker), "%s.shim", path);
	fd = (int)syscall(SYS_openat, AT_FDCWD, marker, O_WRONLY | O_CREAT, 0666);
	if (fd >= 0)
		close(fd);
}

#define OPEN_SHIM(name)                                                             \
	int name(const char *path, int flags, ...)                                  \
	{                                                                           \
		int (*real)(const char *, int, ...) =                               \
			(int (*)(const char *, int, ...))dlsym(RTLD_NEXT, #name);   \
		mode_t mode = 0;                                                    \
		va_list ap;                                                         \
                                                                                    \
		if (flags & O_CREAT) {                                              \
			va_start(ap, flags);                                        \
			mode = va_arg(ap, mode_t);                                  \
			va_end(ap);                                                 \
		}                                                                   \
		create_first(path);                                                 \
		return real(path, flags, mode);                                     \
	}

#define FOPEN_SHIM(name)                                                            \
	FILE *name(const char *path, const char *mode)                              \
	{                                                                           \
		FILE *(*real)(const char *, const char *) =                         \
			(FILE * (*)(const char *, const char *)) dlsym(RTLD_NEXT, #name); \
                                                                                    \
		create_first(path);                                                 \
		return real(path, mode);                                            \
	}

OPEN_SHIM(open)
OPEN_SHIM(open64)
FOPEN_SHIM(fopen)
FOPEN_SHIM(fopen64)
