/* SPDX-License-Identifier: MIT */
/*
 * The library's threads block every signal (but SIGURG, which tests/child.h
 * opens to them for its deadline's stacks, and the synchronous ones, which
 * the kernel never holds pending), whichever thread started them
 * and whatever its mask (src/runtime.c, "Signal masks"): the callback
 * thread a call starts, and the one a fork child's hooks start again.  Up
 * to 0.3.14 both took the mask of the thread that started them, and a
 * process-directed signal whose handler used refs could land on one in
 * the middle of a fence (test_combo.c, "library-thread-signal").
 *
 * The scenario, deterministic: ref A's @release holds the callback thread
 * (paused in it: the fork goes on; A's confirm waits for the kill's put, so
 * that the switch's drop is the last) while B is killed, so B's switch is
 * queued at the fork and the child's hook starts a callback thread for it.
 * The main thread leaves SIGUSR1 open and blocks SIGUSR2, so neither the
 * empty mask nor its own is the one expected.  The parent's callback
 * thread and the child's must show the same SigBlk as a thread that
 * blocked every signal but SIGURG.  Skipped under ThreadSanitizer (no
 * threads in a fork child), valgrind (the child leaks by design) and
 * qemu-user (the threads and masks /proc shows are the emulator's).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "percpuref/percpu_ref.h"
#include "child.h"
#include "tap.h"

static struct percpu_ref a, b;
static int a_killed, in_release_a, gate, released_a, released_b;	/* atomic */
static char expected[128];	/* SigBlk of a thread that blocks all but SIGURG */

static void release_a(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_store_n(&in_release_a, 1, __ATOMIC_SEQ_CST);
	while (!__atomic_load_n(&gate, __ATOMIC_SEQ_CST))
		usleep(1000);
	__atomic_fetch_add(&released_a, 1, __ATOMIC_SEQ_CST);
}

/* On the callback thread, before its switch drops its reference: once the
 * kill's put is made, that drop is the last, and A's @release runs there. */
static void confirm_a(struct percpu_ref *ref)
{
	(void)ref;
	while (!__atomic_load_n(&a_killed, __ATOMIC_SEQ_CST))
		usleep(1000);
}

static void release_b(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_fetch_add(&released_b, 1, __ATOMIC_SEQ_CST);
}

/* The SigBlk line of thread @tid of this process into @out; false if none. */
static bool sigblk_of(pid_t tid, char *out, size_t size)
{
	char path[64], buf[4096], *line;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/self/task/%d/status", (int)tid);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	line = strstr(buf, "SigBlk:");
	if (!line)
		return false;
	snprintf(out, size, "%.*s", (int)strcspn(line, "\n"), line);
	return true;
}

/* The one thread of this process besides the caller; 0 if not exactly one. */
static pid_t other_thread(void)
{
	DIR *dir = opendir("/proc/self/task");
	struct dirent *e;
	pid_t found = 0;
	int others = 0;

	if (!dir)
		return 0;
	while ((e = readdir(dir)))
		if (e->d_name[0] != '.' && atoi(e->d_name) != gettid()) {
			found = atoi(e->d_name);
			others++;
		}
	closedir(dir);
	return others == 1 ? found : 0;
}

/* Whether the one thread besides the caller blocks what a library thread
 * must; says which thread and what it blocks if not. */
static bool library_thread_blocks_all(const char *where)
{
	pid_t cb = other_thread();
	char its[128];

	if (!cb || !sigblk_of(cb, its, sizeof(its))) {
		fprintf(stderr, "# %s: no callback thread\n", where);
		return false;
	}
	if (strcmp(expected, its)) {
		fprintf(stderr, "# %s: callback thread %s, want %s\n", where, its, expected);
		return false;
	}
	return true;
}

/* Exit status 3: the restarted callback thread's mask is not all blocked;
 * 5: B not released. */
static int child(void)
{
	child_deadline(20);
	/* First the barrier: the thread ran B's switch, so it is past the C
	 * library's start-up, which blocks every signal, its own included,
	 * until it sets the thread's mask. */
	if (percpu_ref_barrier() || __atomic_load_n(&released_b, __ATOMIC_SEQ_CST) != 1)
		return 5;
	return library_thread_blocks_all("fork child") ? 0 : 3;
}

int main(void)
{
	const char *untestable = fork_children_untestable();
	sigset_t usr2, all_but_urg, mine;
	pid_t pid;
	int i;

	if (untestable) {
		ok(1, "skipped under %s", untestable);
		return done_testing();
	}
	/* qemu-user: /proc/self/task lists the emulator's own threads too,
	 * and SigBlk there is the host's mask, not the emulated one. */
	if (UNDER_EMULATOR) {
		ok(1, "skipped under an emulator: its threads and masks are the host's");
		return done_testing();
	}
	/* The mask expected, as /proc shows it: this thread's, for a while. */
	sigfillset(&all_but_urg);
	sigdelset(&all_but_urg, SIGURG);
	/* Never blocked: the synchronous ones (runtime.c, "Signal masks"). */
	sigdelset(&all_but_urg, SIGSEGV);
	sigdelset(&all_but_urg, SIGBUS);
	sigdelset(&all_but_urg, SIGFPE);
	sigdelset(&all_but_urg, SIGILL);
	sigdelset(&all_but_urg, SIGTRAP);
	sigdelset(&all_but_urg, SIGSYS);
	pthread_sigmask(SIG_SETMASK, &all_but_urg, &mine);
	if (!sigblk_of(gettid(), expected, sizeof(expected)))
		return 1;
	pthread_sigmask(SIG_SETMASK, &mine, NULL);
	sigemptyset(&usr2);
	sigaddset(&usr2, SIGUSR2);
	pthread_sigmask(SIG_BLOCK, &usr2, NULL);
	if (percpu_ref_init(&a, release_a, 0) || percpu_ref_init(&b, release_b, 0))
		return 1;
	percpu_ref_kill_and_confirm(&a, confirm_a);
	__atomic_store_n(&a_killed, 1, __ATOMIC_SEQ_CST);
	for (i = 0; i < 20000 && !__atomic_load_n(&in_release_a, __ATOMIC_SEQ_CST); i++)
		usleep(1000);
	ok(__atomic_load_n(&in_release_a, __ATOMIC_SEQ_CST), "A's release holds the callback thread");
	ok(library_thread_blocks_all("parent"),
	   "the callback thread blocks every signal but SIGURG, not its creator's mask");
	/* Queued behind A's batch: the fork finds it on the queue. */
	percpu_ref_kill(&b);
	fflush(stdout);
	pid = fork();
	if (pid == 0)
		_exit(child());
	__atomic_store_n(&gate, 1, __ATOMIC_SEQ_CST);
	is(wait_child(pid), 0,
	   "the callback thread a fork child's hook started blocks every signal but SIGURG");
	ok(percpu_ref_barrier() == 0, "barrier after the fork");
	is(__atomic_load_n(&released_a, __ATOMIC_SEQ_CST), 1, "A released once in the parent");
	is(__atomic_load_n(&released_b, __ATOMIC_SEQ_CST), 1, "B released once in the parent");
	percpu_ref_exit(&a);
	percpu_ref_exit(&b);
	return done_testing();
}
