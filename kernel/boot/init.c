// SPDX-License-Identifier: GPL-2.0
/*
 * The boot test's init: a static PID 1 that checks, on the kernel it runs
 * on, what the series changes where KUnit has no seam, and prints one
 * "BOOTTEST <check>: PASS|FAIL <detail>" line per check, then a summary
 * line, and reboots (qemu -no-reboot exits).
 *
 *  overlayfs: permission results on an overlay mounted by root, seen by
 *	an unprivileged task; and, with a kprobe, how many times
 *	override_creds() runs (a reference on the mounter's credentials)
 *	while that task checks permissions: the check the ovl patch changes.
 *  AppArmor: enabled, this task unconfined, files opened and closed by
 *	two tasks at once (file_alloc_security takes the label's reference).
 *  ucounts: rt signals queued from child user namespaces fail exactly at
 *	the limit their parents' namespaces set, with the namespaces' rlimit
 *	caches cold and warm, siblings share it exactly, also when one of
 *	them holds cached units, a task of the init namespace gets exactly
 *	its own limit while a child namespace holds cached units, and the
 *	charge on the init namespace is back where it was once the
 *	namespaces are gone.  The ucounts patch
 *	shows: one signal in a child namespace charges the init namespace a
 *	batch, and, counted with kprobes, signals from a child namespace
 *	charge the parent chain once per batch, not once per signal.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SIGPENDING_LIMIT	100
#define NESTED_LIMIT		40
#define CACHE_BATCH		16	/* RLIMIT_CACHE_BATCH of the patch */
#define WARM_SIGNALS		5
#define SIGNAL_PAIRS		1000

static int passed, failed;

static void check(const char *name, int ok, const char *fmt, ...)
{
	va_list ap;

	printf("BOOTTEST %s: %s ", name, ok ? "PASS" : "FAIL");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	if (ok)
		passed++;
	else
		failed++;
}

/* Writes all of @s to @path opened with @flags: 0, or -1. */
static int write_with(const char *path, int flags, const char *s)
{
	int fd = open(path, flags, 0644);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = write(fd, s, strlen(s));
	close(fd);
	return n == (ssize_t)strlen(s) ? 0 : -1;
}

static int write_file(const char *path, const char *s)
{
	return write_with(path, O_WRONLY | O_CREAT | O_TRUNC, s);
}

static int read_file(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, size - 1);
	close(fd);
	if (n < 0)
		return -1;
	buf[n] = 0;
	return 0;
}

/* Runs fn in a child and returns its exit status (-1 if it died). */
static int in_child(int (*fn)(void *), void *arg)
{
	int status;
	pid_t pid = fork();

	if (pid == 0)
		_exit(fn(arg));
	if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status))
		return -1;
	return WEXITSTATUS(status);
}

/* ---- overlayfs ---- */

#define OVL "/ovl"
#define MERGED OVL "/merged"

static int become_user(void)
{
	return setresgid(1000, 1000, 1000) || setresuid(1000, 1000, 1000);
}

/* bit 0: pub readable, bit 1: secret refused with EACCES, bit 2: pub not
 * writable (EACCES), bit 3: dir searchable */
static int ovl_user_checks(void *arg)
{
	int r = 0, fd;

	(void)arg;
	if (become_user())
		return 255;
	if (faccessat(AT_FDCWD, MERGED "/pub", R_OK, AT_EACCESS) == 0)
		r |= 1;
	if (faccessat(AT_FDCWD, MERGED "/secret", R_OK, AT_EACCESS) && errno == EACCES)
		r |= 2;
	fd = open(MERGED "/pub", O_WRONLY);
	if (fd < 0 && errno == EACCES)
		r |= 4;
	if (fd >= 0)
		close(fd);
	if (faccessat(AT_FDCWD, MERGED "/dir/inner", R_OK, AT_EACCESS) == 0)
		r |= 8;
	return r;
}

#define OVL_ACCESSES 1000

/* Permission checks of an unprivileged task on the overlay, many times. */
static int ovl_user_access_loop(void *arg)
{
	int i;

	(void)arg;
	if (become_user())
		return 255;
	for (i = 0; i < OVL_ACCESSES; i++)
		if (faccessat(AT_FDCWD, MERGED "/dir/inner", R_OK, AT_EACCESS))
			return 1;
	return 0;
}

static int append_file(const char *path, const char *s)
{
	return write_with(path, O_WRONLY | O_APPEND, s);
}

static long kprobe_hits(const char *event)
{
	char buf[4096], *line;
	long hits = -1;

	if (read_file("/sys/kernel/tracing/kprobe_profile", buf, sizeof(buf)))
		return -1;
	for (line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
		char name[64];
		long h, miss;

		if (sscanf(line, " %63s %ld %ld", name, &h, &miss) == 3 &&
		    !strcmp(name, event))
			hits = h;
	}
	return hits;
}

static void test_overlay(void)
{
	int r, fd;
	long before, after;
	struct stat st;

	r = mount("tmpfs", OVL, "tmpfs", 0, "mode=0755") ||
	    mkdir(OVL "/lower", 0755) || mkdir(OVL "/upper", 0755) ||
	    mkdir(OVL "/work", 0755) || mkdir(MERGED, 0755) ||
	    mkdir(OVL "/lower/dir", 0755) ||
	    write_file(OVL "/lower/pub", "public\n") ||
	    write_file(OVL "/lower/secret", "secret\n") ||
	    write_file(OVL "/lower/dir/inner", "inner\n") ||
	    chmod(OVL "/lower/secret", 0600) ||
	    mount("overlay", MERGED, "overlay", 0,
		  "lowerdir=" OVL "/lower,upperdir=" OVL "/upper,workdir=" OVL "/work");
	check("ovl-mount", !r, "(%s)", r ? strerror(errno) : "overlay on " MERGED);
	if (r)
		return;

	r = in_child(ovl_user_checks, NULL);
	check("ovl-user-read", r >= 0 && r != 255 && (r & 1), "(uid 1000 reads a 0644 file)");
	check("ovl-user-secret", r >= 0 && r != 255 && (r & 2), "(uid 1000 gets EACCES on a 0600 root file)");
	check("ovl-user-write", r >= 0 && r != 255 && (r & 4), "(uid 1000 cannot open a 0644 root file for writing)");
	check("ovl-user-search", r >= 0 && r != 255 && (r & 8), "(uid 1000 reads through a lower dir)");

	fd = open(MERGED "/pub", O_WRONLY | O_APPEND);
	r = fd >= 0 && write(fd, "root\n", 5) == 5;
	if (fd >= 0)
		close(fd);
	check("ovl-root-copy-up", r && stat(OVL "/upper/pub", &st) == 0,
	      "(root writes a lower file, it is copied up)");

	if (mount("sysfs", "/sys", "sysfs", 0, NULL) ||
	    mount("tracefs", "/sys/kernel/tracing", "tracefs", 0, NULL) ||
	    write_file("/sys/kernel/tracing/kprobe_events", "p:ovlcred override_creds\n") ||
	    write_file("/sys/kernel/tracing/events/kprobes/ovlcred/enable", "1\n")) {
		check("ovl-no-cred-ref", 0, "(cannot set a kprobe on override_creds: %s)",
		      strerror(errno));
		return;
	}
	before = kprobe_hits("ovlcred");
	r = in_child(ovl_user_access_loop, NULL);
	after = kprobe_hits("ovlcred");
	write_file("/sys/kernel/tracing/events/kprobes/ovlcred/enable", "0\n");
	/* Each access checks the overlay root, dir and inner: 3 checks. */
	check("ovl-no-cred-ref", r == 0 && before >= 0 && after - before < OVL_ACCESSES / 10,
	      "(override_creds() ran %ld times during %d permission-checking accesses; "
	      "the unpatched kernel takes one reference per check)",
	      after - before, OVL_ACCESSES);
}

/* ---- AppArmor ---- */

#define OPENS 20000

static int open_close_loop(void *arg)
{
	int i, fd;

	(void)arg;
	for (i = 0; i < OPENS; i++) {
		fd = open("/init", O_RDONLY);
		if (fd < 0)
			return 1;
		close(fd);
	}
	return 0;
}

static void test_apparmor(void)
{
	char buf[256];
	pid_t pids[2];
	int i, status, ok = 1;

	check("apparmor-enabled",
	      !read_file("/sys/module/apparmor/parameters/enabled", buf, sizeof(buf)) &&
	      buf[0] == 'Y', "(/sys/module/apparmor/parameters/enabled)");
	check("apparmor-unconfined",
	      !read_file("/proc/self/attr/apparmor/current", buf, sizeof(buf)) &&
	      !strncmp(buf, "unconfined", 10), "(/proc/self/attr/apparmor/current)");
	for (i = 0; i < 2; i++) {
		pids[i] = fork();
		if (pids[i] == 0)
			_exit(open_close_loop(NULL));
	}
	for (i = 0; i < 2; i++)
		if (pids[i] < 0 || waitpid(pids[i], &status, 0) < 0 ||
		    !WIFEXITED(status) || WEXITSTATUS(status))
			ok = 0;
	check("apparmor-open-close", ok, "(two tasks opened and closed a file %d times each)",
	      OPENS);
	check("apparmor-still-unconfined",
	      !read_file("/proc/self/attr/apparmor/current", buf, sizeof(buf)) &&
	      !strncmp(buf, "unconfined", 10), "(after the opens)");
}

/* ---- ucounts ---- */

/* The init namespace's SIGPENDING charge for uid 0 (SigQ's first field). */
static long sigq(void)
{
	char buf[4096], *p;

	if (read_file("/proc/self/status", buf, sizeof(buf)))
		return -1;
	p = strstr(buf, "SigQ:");
	return p ? strtol(p + 5, NULL, 10) : -1;
}

/* Queues SIGRTMIN to itself until refused; returns how many went in. */
static long queue_until_refused(void)
{
	union sigval v = { 0 };
	long n = 0;

	while (n < 100000 && sigqueue(getpid(), SIGRTMIN, v) == 0)
		n++;
	return errno == EAGAIN ? n : -1;
}

static void block_rt(void)
{
	sigset_t set;

	sigemptyset(&set);
	sigaddset(&set, SIGRTMIN);
	sigprocmask(SIG_BLOCK, &set, NULL);
}

static int set_soft_sigpending(long soft)
{
	struct rlimit rl;

	getrlimit(RLIMIT_SIGPENDING, &rl);
	rl.rlim_cur = soft;
	return setrlimit(RLIMIT_SIGPENDING, &rl);
}

/* Queues @n SIGRTMIN to itself and takes them back; 0 on success. */
static int queue_and_take(int n)
{
	union sigval v = { 0 };
	sigset_t set;
	int i, sig;

	sigemptyset(&set);
	sigaddset(&set, SIGRTMIN);
	for (i = 0; i < n; i++)
		if (sigqueue(getpid(), SIGRTMIN, v))
			return -1;
	for (i = 0; i < n; i++)
		if (sigwait(&set, &sig) || sig != SIGRTMIN)
			return -1;
	return 0;
}

#define NS_NESTED	1	/* a grandchild in a namespace of its own queues */
#define NS_WARM		2	/* warm the namespace's cache first */
#define NS_IDLE		4	/* then queue nothing */
#define NS_ONE		8	/* then queue one signal only */

/*
 * A child in a new user namespace: raises its own limit far above its
 * parent's, queues until refused (or as @mode says), reports the count on
 * @fd and waits for a byte on @go before exiting (its signals stay queued
 * until then).
 */
static __attribute__((noreturn)) void ns_child(int fd, int go, int mode)
{
	union sigval v = { 0 };
	long n = 0;
	char c;

	/* map our ids, so that a namespace can be created inside this one */
	if (unshare(CLONE_NEWUSER) || write_file("/proc/self/uid_map", "0 0 1\n") ||
	    write_file("/proc/self/setgroups", "deny\n") ||
	    write_file("/proc/self/gid_map", "0 0 1\n"))
		_exit(2);
	if (mode & NS_NESTED) {
		/* the grandchild's namespace gets NESTED_LIMIT from us */
		pid_t pid;
		int status;

		if (set_soft_sigpending(NESTED_LIMIT))
			_exit(3);
		pid = fork();
		if (pid == 0)
			ns_child(fd, go, mode & ~NS_NESTED);
		if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status))
			_exit(6);
		_exit(WEXITSTATUS(status));
	}
	block_rt();
	if (set_soft_sigpending(100000))
		_exit(3);
	if ((mode & NS_WARM) && queue_and_take(WARM_SIGNALS))
		_exit(7);
	if (mode & NS_ONE)
		n = sigqueue(getpid(), SIGRTMIN, v) ? -1 : 1;
	else if (!(mode & NS_IDLE))
		n = queue_until_refused();
	if (write(fd, &n, sizeof(n)) != sizeof(n))
		_exit(4);
	if (read(go, &c, 1) != 1)
		_exit(5);
	_exit(0);
}

/* In the init namespace, as uid 0 like the namespaces' owner. */
static int init_ns_queue(void *arg)
{
	(void)arg;
	block_rt();
	return queue_until_refused();
}

/*
 * Starts @nr children, child i in @modes[i]; @serial: each one once the
 * one before it has reported.  Returns their counts; @parent_count: also
 * how many signals a task of the init namespace then queues.
 */
static int run_ns_children(int nr, const int *modes, int serial, long *counts,
			   long *sigq_held, long *parent_count)
{
	int res[2], go[2], i, status, ok = 1;
	pid_t pids[4];

	if (pipe(res) || pipe(go))
		return 0;
	for (i = 0; i < nr; i++) {
		counts[i] = -1;
		pids[i] = fork();
		if (pids[i] == 0) {
			close(res[0]);
			close(go[1]);
			ns_child(res[1], go[0], modes[i]);
		}
		if (serial && read(res[0], &counts[i], sizeof(long)) != sizeof(long))
			ok = 0;
	}
	close(res[1]);
	close(go[0]);
	for (i = 0; !serial && i < nr; i++)
		if (read(res[0], &counts[i], sizeof(long)) != sizeof(long))
			ok = 0;
	*sigq_held = sigq();
	if (parent_count)
		*parent_count = in_child(init_ns_queue, NULL);
	for (i = 0; i < nr; i++)
		if (write(go[1], "x", 1) != 1)
			ok = 0;
	for (i = 0; i < nr; i++)
		if (pids[i] < 0 || waitpid(pids[i], &status, 0) < 0 || !WIFEXITED(status) ||
		    WEXITSTATUS(status)) {
			printf("BOOTTEST note: namespace child %d: status 0x%x\n", i, status);
			ok = 0;
		}
	close(res[0]);
	close(go[1]);
	return ok;
}

/* The namespaces go away asynchronously: waits for SigQ to settle. */
static long sigq_settled(long want)
{
	struct timespec ts = { 0, 20 * 1000 * 1000 };
	long now = sigq();
	int i;

	for (i = 0; i < 250 && now != want; i++) {
		nanosleep(&ts, NULL);
		now = sigq();
	}
	return now;
}

/* In a new user namespace: SIGNAL_PAIRS signals, each queued and taken. */
static int ns_signal_pairs(void *arg)
{
	int i;

	(void)arg;
	if (unshare(CLONE_NEWUSER))
		return 2;
	block_rt();
	for (i = 0; i < SIGNAL_PAIRS; i++)
		if (queue_and_take(1))
			return 1;
	return 0;
}

/*
 * Counts, with kprobes, the charges of signals from a child namespace and
 * how often the cache's slow path (the only one that charges the parent
 * chain) runs.  The unpatched kernel has no such path: every charge
 * writes the parent chain.
 */
static void test_ucounts_batched(void)
{
	long charges[2], slow[2];
	int r;

	if (append_file("/sys/kernel/tracing/kprobe_events",
			"p:uccharge inc_rlimit_get_ucounts\n") ||
	    write_file("/sys/kernel/tracing/events/kprobes/uccharge/enable", "1\n")) {
		check("ucounts-parent-batched", 0, "(cannot set a kprobe on inc_rlimit_get_ucounts: %s)",
		      strerror(errno));
		return;
	}
	if (append_file("/sys/kernel/tracing/kprobe_events",
			"p:ucslow rlimit_charge_slow\n") ||
	    write_file("/sys/kernel/tracing/events/kprobes/ucslow/enable", "1\n")) {
		check("ucounts-parent-batched", 0,
		      "(no rlimit_charge_slow to probe: %s; every charge writes the parent chain)",
		      strerror(errno));
		write_file("/sys/kernel/tracing/events/kprobes/uccharge/enable", "0\n");
		return;
	}
	charges[0] = kprobe_hits("uccharge");
	slow[0] = kprobe_hits("ucslow");
	r = in_child(ns_signal_pairs, NULL);
	charges[1] = kprobe_hits("uccharge");
	slow[1] = kprobe_hits("ucslow");
	write_file("/sys/kernel/tracing/events/kprobes/uccharge/enable", "0\n");
	write_file("/sys/kernel/tracing/events/kprobes/ucslow/enable", "0\n");
	check("ucounts-parent-batched",
	      r == 0 && charges[0] >= 0 && slow[0] >= 0 &&
	      charges[1] - charges[0] >= SIGNAL_PAIRS &&
	      (slow[1] - slow[0]) * CACHE_BATCH <= charges[1] - charges[0],
	      "(%ld charges of %d signals queued and taken in a child namespace, "
	      "%ld of them charged the parent chain)",
	      charges[1] - charges[0], SIGNAL_PAIRS, slow[1] - slow[0]);
}

static void test_ucounts(void)
{
	static const int plain[2], nested[1] = { NS_NESTED }, warm[1] = { NS_WARM },
		one[1] = { NS_ONE }, warm_idle_then_plain[2] = { NS_WARM | NS_IDLE, 0 },
		warm_idle[1] = { NS_WARM | NS_IDLE };
	struct rlimit rl = { SIGPENDING_LIMIT, 100000 };
	long base, held, after, parent, counts[2];
	int ok;

	/* children raise their soft limit up to this hard one */
	if (setrlimit(RLIMIT_SIGPENDING, &rl)) {
		check("ucounts-setup", 0, "(setrlimit: %s)", strerror(errno));
		return;
	}
	base = sigq();

	ok = run_ns_children(1, plain, 0, counts, &held, NULL);
	check("ucounts-child-exact", ok && counts[0] == SIGPENDING_LIMIT,
	      "(a child namespace queued %ld signals; its parent's limit is %d)",
	      counts[0], SIGPENDING_LIMIT);
	check("ucounts-parent-charged", ok && held - base == SIGPENDING_LIMIT,
	      "(the init namespace is charged %ld while the child holds them)", held - base);
	after = sigq_settled(base);
	check("ucounts-conserved-1", after == base,
	      "(init namespace charge %ld after teardown, %ld before)", after, base);

	ok = run_ns_children(2, plain, 0, counts, &held, NULL);
	check("ucounts-siblings-exact", ok && counts[0] + counts[1] == SIGPENDING_LIMIT,
	      "(two sibling namespaces queued %ld + %ld signals concurrently; limit %d)",
	      counts[0], counts[1], SIGPENDING_LIMIT);
	after = sigq_settled(base);
	check("ucounts-conserved-2", after == base,
	      "(init namespace charge %ld after teardown, %ld before)", after, base);

	ok = run_ns_children(1, nested, 0, counts, &held, NULL);
	check("ucounts-nested-exact", ok && counts[0] == NESTED_LIMIT,
	      "(a grandchild namespace queued %ld signals; its parent's limit is %d)",
	      counts[0], NESTED_LIMIT);
	after = sigq_settled(base);
	check("ucounts-conserved-3", after == base,
	      "(init namespace charge %ld after teardown, %ld before)", after, base);

	ok = run_ns_children(1, warm, 0, counts, &held, NULL);
	check("ucounts-warm-exact", ok && counts[0] == SIGPENDING_LIMIT &&
	      held - base == SIGPENDING_LIMIT,
	      "(a child namespace that queued and took %d signals first queued %ld; "
	      "limit %d, init namespace charged %ld)",
	      WARM_SIGNALS, counts[0], SIGPENDING_LIMIT, held - base);
	after = sigq_settled(base);
	check("ucounts-conserved-4", after == base,
	      "(init namespace charge %ld after teardown, %ld before)", after, base);

	ok = run_ns_children(2, warm_idle_then_plain, 1, counts, &held, NULL);
	check("ucounts-sibling-warm-exact", ok && counts[0] == 0 &&
	      counts[1] == SIGPENDING_LIMIT && held - base == SIGPENDING_LIMIT,
	      "(a namespace queued %ld signals while its sibling, idle, had queued and "
	      "taken %d; limit %d, init namespace charged %ld)",
	      counts[1], WARM_SIGNALS, SIGPENDING_LIMIT, held - base);
	after = sigq_settled(base);
	check("ucounts-conserved-5", after == base,
	      "(init namespace charge %ld after teardown, %ld before)", after, base);

	ok = run_ns_children(1, warm_idle, 0, counts, &held, &parent);
	check("ucounts-own-limit-exact", ok && parent == SIGPENDING_LIMIT - base,
	      "(a task of the init namespace queued %ld signals while an idle child "
	      "namespace had charged %ld to it; its own limit is %d, %ld were pending)",
	      parent, held - base, SIGPENDING_LIMIT, base);
	after = sigq_settled(base);
	check("ucounts-conserved-6", after == base,
	      "(init namespace charge %ld after teardown, %ld before)", after, base);

	ok = run_ns_children(1, one, 0, counts, &held, NULL);
	check("ucounts-batch-charged", ok && counts[0] == 1 && held - base == CACHE_BATCH,
	      "(one signal queued in a child namespace charges the init namespace %ld; "
	      "a batch is %d)", held - base, CACHE_BATCH);
	after = sigq_settled(base);
	check("ucounts-conserved-7", after == base,
	      "(init namespace charge %ld after teardown, %ld before)", after, base);

	test_ucounts_batched();
	after = sigq_settled(base);
	check("ucounts-conserved-8", after == base,
	      "(init namespace charge %ld after teardown, %ld before)", after, base);
}

int main(void)
{
	mkdir("/proc", 0755);
	mkdir("/sys", 0755);
	mkdir(OVL, 0755);
	if (mount("proc", "/proc", "proc", 0, NULL))
		printf("BOOTTEST warning: cannot mount /proc: %s\n", strerror(errno));
	printf("BOOTTEST start: %ld CPUs online\n", sysconf(_SC_NPROCESSORS_ONLN));
	fflush(stdout);

	test_overlay();
	test_apparmor();
	test_ucounts();

	printf("BOOTTEST done: %d passed, %d failed\n", passed, failed);
	fflush(stdout);
	sync();
	reboot(RB_AUTOBOOT);
	return 0;
}
