/* SPDX-License-Identifier: MIT */
/*
 * The library's PERCPUREF_* settings are ignored in a process that runs
 * with privileges another user gave it (setuid: the kernel's AT_SECURE),
 * where whoever starts it chooses the environment; they were read there
 * as anywhere.  As root: a copy of this program, setuid root, started as
 * nobody with PERCPUREF_NO_RSEQ=1, must take the fast path a plain start
 * takes; a plain copy started so must take the fallback (the setting
 * still works where it is the caller's own).  Each child prints
 * percpuref_fast_path() on its standard output.  The copies live in a
 * directory only root may list, each removed once its last child ran;
 * only a parent whose real user is root makes them (a copy left by a
 * killed run, started by another user, made new setuid-root copies).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "child.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

#define NOBODY 65534

static char dir[] = "/tmp/percpuref-secure-env-XXXXXX";
static char plain[64], setuid_copy[64];

/* This program, copied to @path with @mode, owned by root. */
static int copy_self(const char *path, mode_t mode)
{
	char buf[65536];
	ssize_t n;
	int in = open("/proc/self/exe", O_RDONLY), out;

	if (in < 0)
		return -1;
	out = open(path, O_WRONLY | O_CREAT | O_EXCL, 0700);
	if (out < 0) {
		close(in);
		return -1;
	}
	while ((n = read(in, buf, sizeof(buf))) > 0)
		if (write(out, buf, (size_t)n) != n) {
			n = -1;
			break;
		}
	close(in);
	/* chmod after the write: a write clears the set-user-ID bit. */
	if (close(out) || n < 0 || fchownat(AT_FDCWD, path, 0, 0, 0) || chmod(path, mode))
		return -1;
	return 0;
}

/* Runs @path as nobody with @env; its output (one line) into @out. */
static int run_as_nobody(const char *path, char *const env[], char *out, size_t size)
{
	int pipefd[2];
	ssize_t n;
	pid_t pid;

	if (pipe(pipefd))
		return -1;
	pid = fork();
	if (pid == 0) {
		char *argv[] = { (char *)path, (char *)"--print-fast-path", NULL };

		dup2(pipefd[1], 1);
		if (setgroups(0, NULL) || setresgid(NOBODY, NOBODY, NOBODY) ||
		    setresuid(NOBODY, NOBODY, NOBODY))
			_exit(3);
		execve(path, argv, env);
		_exit(4);
	}
	close(pipefd[1]);
	n = pid > 0 ? read(pipefd[0], out, size - 1) : -1;
	close(pipefd[0]);
	out[n > 0 ? n : 0] = '\0';
	out[strcspn(out, "\n")] = '\0';
	return wait_child(pid);
}

int main(int argc, char **argv)
{
	char *no_env[] = { NULL };
	char *no_rseq[] = { (char *)"PERCPUREF_NO_RSEQ=1", NULL };
	char base[64], told[64], privileged[64];
	struct statvfs fs;

	if (argc > 1 && !strcmp(argv[1], "--print-fast-path")) {
		printf("%s\n", percpuref_fast_path());
		return 0;
	}
	if (getuid() != 0 || geteuid() != 0) {
		skip("not root: cannot make a setuid-root copy");
		return done_testing();
	}
	if (UNDER_TSAN || under_memory_checker() || getenv("PERCPUREF_TEST_EMULATOR")) {
		skip("a sanitizer, valgrind or an emulator runs the children otherwise");
		return done_testing();
	}
	if (!mkdtemp(dir) || chmod(dir, 0711)) {
		skip("no directory for the copies: %s", strerror(errno));
		return done_testing();
	}
	if (statvfs(dir, &fs) || (fs.f_flag & (ST_NOSUID | ST_NOEXEC))) {
		skip("%s is on a nosuid or noexec file system", dir);
		rmdir(dir);
		return done_testing();
	}
	snprintf(plain, sizeof(plain), "%s/plain", dir);
	snprintf(setuid_copy, sizeof(setuid_copy), "%s/setuid", dir);
	if (!ok(!copy_self(plain, 0755) && !copy_self(setuid_copy, 04755),
		"copies made, one setuid root"))
		goto out;
	ok(run_as_nobody(plain, no_env, base, sizeof(base)) == 0 && *base,
	   "plain copy, no setting: %s", base);
	ok(run_as_nobody(plain, no_rseq, told, sizeof(told)) == 0 && *told,
	   "plain copy, PERCPUREF_NO_RSEQ=1: %s", told);
	unlink(plain);
	if (!strcmp(base, "fallback")) {
		skip("no rseq here: a setting ignored and one obeyed look the same");
		goto out;
	}
	ok(!strcmp(told, "fallback"), "the caller's own setting is obeyed");
	ok(run_as_nobody(setuid_copy, no_rseq, privileged, sizeof(privileged)) == 0 && *privileged,
	   "setuid copy, PERCPUREF_NO_RSEQ=1: %s", privileged);
	unlink(setuid_copy);
	ok(*base && !strcmp(privileged, base),
	   "a setuid program ignores the setting: %s, as with none", privileged);
out:
	unlink(plain);
	unlink(setuid_copy);
	rmdir(dir);
	return done_testing();
}
