/* SPDX-License-Identifier: MIT */
/*
 * A library thread that a fork child's hooks start again has the signal
 * mask of the thread that forked, as it would have had started by that
 * thread outside fork().  liburcu-bp's fork prepare hook blocks every
 * signal in the forking thread and its child hook restores them only after
 * ours ran; the callback thread our queue hook starts (items were queued
 * at the fork) had every signal blocked for its whole life, and
 * tests/child.h's deadline, which has each thread of a hung child print
 * its stack on SIGURG, got nothing from the thread a child's barrier waits
 * for (runtime.c, "Signal masks").
 *
 * The scenario, deterministic: ref A's @release holds the callback thread
 * (paused in it: the fork goes on; A's confirm waits for the kill's put, so
 * that the switch's drop is the last) while B is killed, so B's switch is
 * queued at the fork and the child's hook starts a callback thread for it.
 * The child checks that a SIGUSR1 sent to that thread is handled there and
 * then its SigBlk against its own main thread's (restored by then), and
 * runs B with a barrier.  The test blocks SIGUSR2 first, so the mask
 * compared is not the empty one.  Skipped under ThreadSanitizer (no
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
#include <sys/syscall.h>
#include <unistd.h>

#include "percpuref/percpu_ref.h"
#include "child.h"
#include "tap.h"

static struct percpu_ref a, b;
static int a_killed, in_release_a, gate, released_a, released_b;	/* atomic */
static pid_t usr1_tid;					/* atomic: SIGUSR1 ran here */

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

static void on_usr1(int sig)
{
	(void)sig;
	__atomic_store_n(&usr1_tid, gettid(), __ATOMIC_SEQ_CST);
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

/* Exit status 2: no callback thread started by the fork hooks; 3: masks
 * differ; 4: SIGUSR1 never handled there (blocked); 5: B not released. */
static int child(void)
{
	char mine[128], its[128];
	struct sigaction sa;
	pid_t cb = other_thread();
	int i;

	child_deadline(20);
	if (!cb)
		return 2;
	/* First the signal, which waits out the thread's start-up (glibc
	 * starts it with every signal blocked, then sets its mask). */
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_usr1;
	sigaction(SIGUSR1, &sa, NULL);
	syscall(SYS_tgkill, getpid(), cb, SIGUSR1);
	for (i = 0; i < 5000 && __atomic_load_n(&usr1_tid, __ATOMIC_SEQ_CST) != cb; i++)
		usleep(1000);
	if (__atomic_load_n(&usr1_tid, __ATOMIC_SEQ_CST) != cb)
		return 4;
	if (!sigblk_of(gettid(), mine, sizeof(mine)) || !sigblk_of(cb, its, sizeof(its)))
		return 3;
	if (strcmp(mine, its)) {
		fprintf(stderr, "# main thread %s, callback thread %s\n", mine, its);
		return 3;
	}
	if (percpu_ref_barrier() || __atomic_load_n(&released_b, __ATOMIC_SEQ_CST) != 1)
		return 5;
	return 0;
}

int main(void)
{
	const char *untestable = fork_children_untestable();
	sigset_t usr2;
	pid_t pid;
	int i;

	if (untestable) {
		ok(1, "skipped under %s", untestable);
		return done_testing();
	}
	/* qemu-user: /proc/self/task lists the emulator's own threads too,
	 * and SigBlk there is the host's mask, not the emulated one. */
	if (getenv("PERCPUREF_TEST_EMULATOR") && *getenv("PERCPUREF_TEST_EMULATOR")) {
		ok(1, "skipped under an emulator: its threads and masks are the host's");
		return done_testing();
	}
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
	/* Queued behind A's batch: the fork finds it on the queue. */
	percpu_ref_kill(&b);
	fflush(stdout);
	pid = fork();
	if (pid == 0)
		_exit(child());
	__atomic_store_n(&gate, 1, __ATOMIC_SEQ_CST);
	is(wait_child(pid), 0,
	   "the callback thread a fork child's hook started has the forking thread's signal mask");
	ok(percpu_ref_barrier() == 0, "barrier after the fork");
	is(__atomic_load_n(&released_a, __ATOMIC_SEQ_CST), 1, "A released once in the parent");
	is(__atomic_load_n(&released_b, __ATOMIC_SEQ_CST), 1, "B released once in the parent");
	percpu_ref_exit(&a);
	percpu_ref_exit(&b);
	return done_testing();
}
