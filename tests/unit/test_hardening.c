/* SPDX-License-Identifier: MIT */
/*
 * Regression tests of the library where real servers live, numbered by
 * finding (other files cite them as "test_hardening.c, finding N"): the
 * fast path on an untrustworthy CPU count (1); fork in the middle of the
 * callback thread's batch (2), of the reclaimer's RCU batch (3) and of a
 * scan's release phase (4: the batch goes on in the child, but for the
 * @release the parent was running, which a fork no longer waits for:
 * test_callback_fork.c); fork against a liburcu-bp grace period (5); a
 * release callback exiting another ref of its batch (6); exit() inside a
 * read-side section (7); membarrier refused by seccomp after start-up (8);
 * kill from the ref's own confirm callback (10); a put that dropped the
 * manager's reference (11); bad reclaimer settings (12); membarrier and
 * migration both refused (13); liburcu-bp switched to plain fences
 * while a thread that holds stderr registers as its reader (14).
 * Finding 9 (32-bit builds refused) is tests/compile/check_lp64.sh.
 *
 * Scenarios that can hang or die run in a child process with a deadline:
 * re-executed with a mode argument (posix_spawn: works under every
 * sanitizer) or, where the finding is about fork itself, forked.
 * ThreadSanitizer cannot run threads in the child of a threaded process, so
 * under TSAN the forked scenarios are skipped, and the output says so.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "internal.h"
#include "fallback.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_rcuref.h"
#include "percpuref/percpu_ref.h"
#include "child.h"
#include "sandbox.h"
#include "tap.h"

/* A child that has not finished by then is hung (the findings' symptom). */
#define CHILD_DEADLINE_S 20

struct object {
	struct percpu_ref ref;
	int releases;		/* atomic: callbacks run on library threads */
	int confirms;
};

static void obj_release(struct percpu_ref *ref)
{
	struct object *o = caa_container_of(ref, struct object, ref);

	/* Release: the test thread reads what the callback did after it. */
	__atomic_fetch_add(&o->releases, 1, __ATOMIC_RELEASE);
}

static int releases_of(struct object *o)
{
	/* Acquire: pairs with obj_release(). */
	return __atomic_load_n(&o->releases, __ATOMIC_ACQUIRE);
}

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

/*
 * A managed ref nobody but the manager references once the caller drops
 * the initial reference, which it keeps (the manager takes its own).
 */
static void make_managed(struct percpu_ref *ref, percpu_ref_func_t *release)
{
	percpu_ref_init(ref, release, PERCPU_REF_INIT_ATOMIC);
	percpu_ref_switch_to_managed(ref);
}

static void set_interval(unsigned long interval_ms)
{
	struct percpu_ref_managed_config c = { interval_ms, PERCPU_REF_MANAGED_MAX_PER_SCAN,
					       PERCPU_REF_SCAN_BATCHED };

	percpu_ref_managed_set_config(&c);
}

/*
 * No periodic scan until the config saved in @saved is set again: the
 * interval at its longest (the next scan is due a day after the last one
 * started), then a flush, so that what was pending is done.  For a case
 * whose puts must meet the reclaimer in one flush: with the interval of
 * 5 s, a scan could fall between two puts of a caller kept off its CPU
 * there, as on a loaded machine.
 */
static void hold_periodic_scans(struct percpu_ref_managed_config *saved)
{
	struct percpu_ref_managed_config longest;

	percpu_ref_managed_get_config(saved);
	longest = *saved;
	longest.interval_ms = PERCPU_REF_MANAGED_INTERVAL_MAX_MS;
	percpu_ref_managed_set_config(&longest);
	percpu_ref_managed_flush();
}

/* ---- Finding 1: the fast path never writes past the per-CPU units. ---- */

static int mode_one_unit(void)
{
	struct object a = { 0 }, b = { 0 };
	cpu_set_t one;
	int i;

	/* The CPU count source says 1, as sysconf may when sysfs is hidden. */
	percpuref_fault_cpu_units(1);
	CPU_ZERO(&one);
	CPU_SET(1, &one);
	if (sched_setaffinity(0, sizeof(one), &one))
		return 77;	/* no CPU 1 to run on */
	percpu_ref_init(&a.ref, obj_release, 0);
	percpu_ref_init(&b.ref, obj_release, 0);
	for (i = 0; i < 1000; i++)
		percpu_ref_get(&a.ref);
	percpu_ref_get(&b.ref);
	for (i = 0; i < 1000; i++)
		percpu_ref_put(&a.ref);
	percpu_ref_kill(&a.ref);
	percpu_ref_kill(&b.ref);
	percpu_ref_barrier();
	if (releases_of(&a) != 1 || releases_of(&b) != 0)
		return 1;
	percpu_ref_put(&b.ref);
	if (releases_of(&b) != 1)
		return 2;
	percpu_ref_exit(&a.ref);
	percpu_ref_exit(&b.ref);
	return 0;
}

/* The file is read whole: a sparse mask longer than a line buffer (CPUs
 * 0, 2, ..., 8190: 20 KB) once read as CPUs up to where it was cut. */
static void test_long_possible_mask(void)
{
	size_t size = 0, len = 0;
	char *text = NULL;
	unsigned int cpu, got = 0;
	FILE *f = open_memstream(&text, &size);

	if (f) {
		for (cpu = 0; cpu < PERCPUREF_MAX_CPUS; cpu += 2)
			fprintf(f, cpu ? ",%u" : "%u", cpu);
		fputc('\n', f);
		fclose(f);
		len = text ? strlen(text) : 0;
	}
	if (len) {
		FILE *in = fmemopen(text, len, "r");

		if (in) {
			got = percpuref_cpu_count_from_file(in);
			fclose(in);
		}
	}
	free(text);
	is(got, PERCPUREF_MAX_CPUS - 1, "1: a %zu-byte possible mask is read whole", len);
}

/* 1 (sysfs): the possible mask is read as a list of CPUs below the cap, or
 * not at all (the caller then asks sysconf()): a lying mask used to wrap
 * the count to 0 or 2^31 and fail every init with -ENOMEM. */
static void test_possible_mask(void)
{
	static const struct {
		const char *text;
		unsigned int count;
	} cases[] = {
		{ "0-191\n", 192 },	{ "0\n", 1 },	     { "0,2-5\n", 6 },
		{ "0-1,4\n", 5 },	{ "0-8191\n", 8192 }, { "0-8192\n", 0 },
		{ "0-99999\n", 0 },	{ "0-4294967294\n", 0 },
		{ "0-1,3000000000\n", 0 }, { "0-18446744073709551616\n", 0 },
		{ "", 0 },		{ "\n", 0 },	     { "garbage\n", 0 },
		{ "-1\n", 0 },		{ "5-2\n", 0 },     { "0-\n", 0 },
		{ "0,\n", 0 },		{ "0-3x\n", 0 },    { " 0-3\n", 0 },
	};
	unsigned int i, wrong = 0;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		unsigned int got = percpuref_parse_cpu_list(cases[i].text, NULL);

		if (got != cases[i].count) {
			printf("# \"%s\": %u CPUs, want %u\n", cases[i].text, got, cases[i].count);
			wrong++;
		}
	}
	is(wrong, 0, "1: possible masks read as lists of CPUs below %u, lies refused",
	   PERCPUREF_MAX_CPUS);
	test_long_possible_mask();
}

/* The CPUs of @set as a list ("0-3,8"), into @out of @size bytes. */
static void cpu_list_of(const struct percpuref_cpu_mask *set, char *out, size_t size)
{
	const unsigned int per_word = 8 * sizeof(set->bits[0]);
	size_t len = 0;
	unsigned int cpu = 0, last;

	out[0] = '\0';
	while (cpu < PERCPUREF_MAX_CPUS) {
		if (!(set->bits[cpu / per_word] >> (cpu % per_word) & 1)) {
			cpu++;
			continue;
		}
		for (last = cpu; last + 1 < PERCPUREF_MAX_CPUS &&
				 set->bits[(last + 1) / per_word] >> ((last + 1) % per_word) & 1;
		     last++)
			;
		len += (size_t)snprintf(out + len, size - len, last > cpu ? "%s%u-%u" : "%s%u",
					len ? "," : "", cpu, last);
		if (len >= size)
			return;
		cpu = last + 1;
	}
}

/* 1 (lists a user writes): a range's pattern, the kernel's USED/GROUP
 * (bitmap_parselist()) or taskset's STRIDE, names the CPUs those tools
 * do; one the kernel refuses (its numbers are 32-bit), or that names
 * none, is no list.  A step past the range ends it (a wrapped step went
 * round for ever). */
static void test_cpu_list_patterns(void)
{
	static const struct {
		const char *text, *cpus;
		unsigned int count;
	} cases[] = {
		{ "0-15:2/8", "0-1,8-9", 10 },		{ "0-7:2", "0,2,4,6", 7 },
		{ "0-7:1/2", "0,2,4,6", 7 },		{ "0-8:2", "0,2,4,6,8", 9 },
		{ "1-10:3/4", "1-3,5-7,9-10", 11 },	{ "0-9:4/4", "0-9", 10 },
		{ "0-7:8/8", "0-7", 8 },		{ "5-5:1/2", "5", 6 },
		{ "0-8191:1/4096", "0,4096", 4097 },	{ "0-7:2,9\n", "0,2,4,6,9", 10 },
		{ "3,0-11:2/6,1", "0-1,3,6-7", 8 },
		{ "1-7:1/4294967295", "1", 2 },
		{ "0-8191:4294967295/4294967295", "0-8191", 8192 },
		{ "0-1:4294967296", "", 0 },	{ "0-1:1/4294967297", "", 0 },
		{ "1-7:1/18446744073709551615", "", 0 },
		{ "0-7:0/2", "", 0 },	{ "0-7:3/2", "", 0 },	{ "0-7:0", "", 0 },
		{ "0-7:", "", 0 },	{ "0-7:2/", "", 0 },	{ "0-7:/2", "", 0 },
		{ "5:1/2", "", 0 },	{ "0-7:2/4/8", "", 0 },	{ "0-7:2:4", "", 0 },
		{ "0-7:2/4x", "", 0 },	{ "0-8192:1/2", "", 0 }, { "0-7: 2", "", 0 },
		{ "0-7:1/18446744073709551616", "", 0 },
	};
	unsigned int i, wrong = 0;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct percpuref_cpu_mask set;
		unsigned int got;
		char cpus[64];

		memset(&set, 0xa5, sizeof(set));	/* cleared by the parse */
		got = percpuref_parse_cpu_list(cases[i].text, &set);
		cpu_list_of(&set, cpus, sizeof(cpus));
		/* A refused list's set is the caller's to drop. */
		if (got != cases[i].count || (got && strcmp(cpus, cases[i].cpus))) {
			printf("# \"%s\": %u, CPUs \"%s\"; want %u, \"%s\"\n", cases[i].text,
			       got, cpus, cases[i].count, cases[i].cpus);
			wrong++;
		}
		if (percpuref_parse_cpu_list(cases[i].text, NULL) != got) {
			printf("# \"%s\": another count without a set\n", cases[i].text);
			wrong++;
		}
	}
	is(wrong, 0, "1: range patterns (USED/GROUP, STRIDE) name the kernel's and taskset's "
		     "CPUs; refused ones are no list");
}

/* A child mode's verdict: 77, its "cannot be tested here", is a comment
 * saying @why; anything else must be 0. */
static void child_verdict(int ret, const char *why, const char *what)
{
	if (ret == 77)
		printf("# skipped: %s\n", why);
	else
		is(ret, 0, "%s", what);
}

static void test_one_unit(void)
{
	child_verdict(run_mode("--one-unit"), "no CPU 1 to run on (finding 1)",
		      "1: one per-CPU unit, thread on CPU 1: counts exact, no stray write");
}

/*
 * 1 (fence): the fence used once membarrier is refused runs on every CPU
 * this process may use, whatever the CPU count and the fencing thread's
 * own affinity say.  It once stopped at max(count, affinity): a count of 1
 * and a thread pinned to CPU 0 left CPU 1's readers unfenced.
 */
static int mode_fence_cpus(void)
{
	cpu_set_t all, first;
	int n, visited;

	percpuref_fault_cpu_units(1);
	if (sched_getaffinity(0, sizeof(all), &all) || (n = CPU_COUNT(&all)) < 2)
		return 77;
	CPU_ZERO(&first);
	for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
		if (CPU_ISSET(cpu, &all)) {
			CPU_SET(cpu, &first);
			break;
		}
	if (sched_setaffinity(0, sizeof(first), &first) || percpuref_nr_units() == 0)
		return 3;
	visited = percpuref_fence_by_migration();
	if (visited < n) {
		fprintf(stderr, "fence ran on %d CPUs of %d\n", visited, n);
		return 1;
	}
	/* And it leaves the thread where it was. */
	if (sched_getaffinity(0, sizeof(all), &all) || !CPU_EQUAL(&all, &first))
		return 2;
	/* Threads it cannot list (a full fd table: /proc/self/task does not
	 * open) may sit in another cpuset: refused, not done half. */
	{
		struct rlimit before;
		int err;

		if (!fill_fd_table(&before))
			return 3;
		visited = percpuref_fence_by_migration();
		err = errno;
		/* Back, for LeakSanitizer, which reads /proc at exit. */
		setrlimit(RLIMIT_NOFILE, &before);
		errno = err;
		if (visited != -1 || errno != EMFILE) {
			fprintf(stderr, "fence without a thread list: %d (errno %d)\n", visited,
				errno);
			return 4;
		}
	}
	return 0;
}

static void test_fence_cpus(void)
{
	child_verdict(run_mode("--fence-cpus"), "one CPU, nothing to miss (finding 1, fence)",
		      "1: the migration fence runs on every CPU, not only up to the count, "
		      "and is refused when it cannot list the threads");
}

/*
 * 1 (fence, cpusets): with threads of one process in different cpusets
 * (cgroup v1), the fence ran on its own cpuset's CPUs only and reported
 * success, leaving a thread on another CPU unfenced; now it is refused.
 * And it restored the affinity it had read, which a cpuset narrowed at
 * that moment had cut down, so the thread stayed narrow once the cpuset
 * widened again.  Needs root, a cgroup v1 cpuset hierarchy, two CPUs.
 */
#define CPUSET_ROOT "/sys/fs/cgroup/cpuset"

static char cpuset_dir[2][128];
static int pinned_stop;		/* atomic: the pinned thread may end */
static pid_t pinned_tid;	/* atomic: its thread id, once it runs */

static bool cpuset_write(const char *dir, const char *file, const char *value)
{
	char path[192];
	FILE *f;
	bool ok;

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	if (!(f = fopen(path, "w")))
		return false;
	ok = fputs(value, f) >= 0;
	return fclose(f) == 0 && ok;
}

static bool cpuset_move(const char *dir, pid_t tid)
{
	char v[24];

	snprintf(v, sizeof(v), "%d", (int)tid);
	return cpuset_write(dir, "tasks", v);
}

/* Every thread of the process but @except into @dir (a sanitizer's own
 * thread included: it would use the CPUs of the group it was left in). */
static bool cpuset_move_all(const char *dir, pid_t except)
{
	DIR *tasks = opendir("/proc/self/task");
	struct dirent *d;
	bool ok = tasks != NULL;

	while (ok && (d = readdir(tasks))) {
		pid_t tid = (pid_t)atoi(d->d_name);

		if (tid > 0 && tid != except)
			ok = cpuset_move(dir, tid);
	}
	if (tasks)
		closedir(tasks);
	return ok;
}

static bool cpuset_make(int i, const char *cpus)
{
	snprintf(cpuset_dir[i], sizeof(cpuset_dir[i]), CPUSET_ROOT "/percpuref-test-%d-%d",
		 (int)getpid(), i);
	return (mkdir(cpuset_dir[i], 0755) == 0 || errno == EEXIST) &&
	       cpuset_write(cpuset_dir[i], "cpuset.mems", "0") &&
	       cpuset_write(cpuset_dir[i], "cpuset.cpus", cpus);
}

static void cpuset_cleanup(void)
{
	char path[sizeof(cpuset_dir) + 8];
	FILE *f;
	int tid;

	/* Every task in them back to the root, then the groups go. */
	for (int i = 0; i < 2; i++) {
		if (!cpuset_dir[i][0])
			continue;
		snprintf(path, sizeof(path), "%s/tasks", cpuset_dir[i]);
		if ((f = fopen(path, "r"))) {
			while (fscanf(f, "%d", &tid) == 1)
				cpuset_move(CPUSET_ROOT, tid);
			fclose(f);
		}
		/* A joined thread may still be leaving its group: EBUSY. */
		for (int tries = 0; rmdir(cpuset_dir[i]) && errno == EBUSY && tries < 100;
		     tries++)
			sleep_ms(10);
	}
}

static void *pinned_thread(void *unused)
{
	(void)unused;
	/* Relaxed, both: flags; nothing else is handed over. */
	__atomic_store_n(&pinned_tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELAXED);
	while (!__atomic_load_n(&pinned_stop, __ATOMIC_RELAXED))
		sched_yield();
	return NULL;
}

/* Pinned by its own choice to CPU 0 inside a wider cpuset, it fences
 * until told to stop. */
static int fencer_go;		/* atomic: it has been moved; pin and fence */

static void *fencing_thread(void *unused)
{
	cpu_set_t zero;

	(void)unused;
	__atomic_store_n(&pinned_tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELAXED);
	while (!__atomic_load_n(&fencer_go, __ATOMIC_ACQUIRE))
		sched_yield();
	CPU_ZERO(&zero);
	CPU_SET(0, &zero);
	sched_setaffinity(0, sizeof(zero), &zero);
	while (!__atomic_load_n(&pinned_stop, __ATOMIC_RELAXED))
		percpuref_fence_by_migration();
	return NULL;
}

static int affinity_count(void)
{
	cpu_set_t set;

	return sched_getaffinity(0, sizeof(set), &set) ? -1 : CPU_COUNT(&set);
}

static int mode_fence_cpusets(void)
{
	pid_t self = (pid_t)syscall(SYS_gettid);
	int split, narrowed_without, narrowed_with, refused = -2;
	pthread_t t;

	if (affinity_count() < 2 || !cpuset_make(0, "0") || !cpuset_make(1, "1")) {
		cpuset_cleanup();
		return 77;
	}
	/* Split: this thread in {0}, another thread of the process in {1}. */
	if (pthread_create(&t, NULL, pinned_thread, NULL)) {
		cpuset_cleanup();
		return 3;
	}
	while (!__atomic_load_n(&pinned_tid, __ATOMIC_RELAXED))
		sched_yield();
	split = cpuset_move(cpuset_dir[1], __atomic_load_n(&pinned_tid, __ATOMIC_RELAXED)) &&
		cpuset_move(cpuset_dir[0], self) ? percpuref_fence_by_migration() : -2;
	__atomic_store_n(&pinned_stop, 1, __ATOMIC_RELAXED);
	pthread_join(t, NULL);
	/* Narrow: this thread in {0,1}, narrowed to {0} and widened again,
	 * first without a fence in between (what the kernel does alone),
	 * then with one. */
	narrowed_without = narrowed_with = -2;
	if (cpuset_write(cpuset_dir[0], "cpuset.cpus", "0-1") &&
	    cpuset_write(cpuset_dir[0], "cpuset.cpus", "0") &&
	    cpuset_write(cpuset_dir[0], "cpuset.cpus", "0-1")) {
		narrowed_without = affinity_count() < 2;
		cpuset_write(cpuset_dir[0], "cpuset.cpus", "0");
		percpuref_fence_by_migration();
		cpuset_write(cpuset_dir[0], "cpuset.cpus", "0-1");
		narrowed_with = affinity_count() < 2;
	}
	/* Concurrent: this thread in {0}; another in {0,1} but pinned to 0
	 * fences meanwhile.  No thread may use CPU 1, so no fence of ours
	 * may be refused; one that read the other's passing affinity was
	 * (36 in 2000 in a reviewer's run), turning the fast path off. */
	__atomic_store_n(&pinned_tid, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&pinned_stop, 0, __ATOMIC_RELAXED);
	if (cpuset_write(cpuset_dir[0], "cpuset.cpus", "0") &&
	    cpuset_write(cpuset_dir[1], "cpuset.cpus", "0-1") &&
	    !pthread_create(&t, NULL, fencing_thread, NULL)) {
		while (!__atomic_load_n(&pinned_tid, __ATOMIC_RELAXED))
			sched_yield();
		pid_t other = __atomic_load_n(&pinned_tid, __ATOMIC_RELAXED);

		if (cpuset_move(cpuset_dir[1], other) && cpuset_move_all(cpuset_dir[0], other)) {
			__atomic_store_n(&fencer_go, 1, __ATOMIC_RELEASE);
			sleep_ms(10);
			refused = 0;
			for (int i = 0; i < 2000; i++)
				refused += percpuref_fence_by_migration() < 0;
		}
		__atomic_store_n(&fencer_go, 1, __ATOMIC_RELEASE);
		__atomic_store_n(&pinned_stop, 1, __ATOMIC_RELAXED);
		pthread_join(t, NULL);
	}
	cpuset_cleanup();
	if (split == -2 || narrowed_without == -2 || refused == -2)
		return 3;
	if (split != -1) {
		fprintf(stderr, "fence across cpusets: %d, want -1 (refused)\n", split);
		return 1;
	}
	if (!narrowed_without && narrowed_with) {
		fprintf(stderr, "a fence under a narrowed cpuset narrowed the thread for good\n");
		return 2;
	}
	if (refused) {
		fprintf(stderr, "%d of 2000 fences refused beside another thread's\n", refused);
		return 4;
	}
	return 0;
}

static void test_fence_cpusets(void)
{
	child_verdict(run_mode("--fence-cpusets"),
		      "no cgroup v1 cpuset to write, or one CPU (finding 1, fence across cpusets)",
		      "1: the migration fence is refused across cpusets, leaves a "
		      "narrowed thread free to widen, and is not refused beside another fence");
}

/* ---- Findings 2-4: fork while a library thread is in a batch. ---- */

static int in_callback;		/* atomic: a slow callback has started */

/* The first callback to run announces itself, then takes its time, so
 * that the test thread forks while the batch is in flight. */
static void slow_first_callback(void)
{
	if (__atomic_exchange_n(&in_callback, 1, __ATOMIC_ACQ_REL) == 0)
		sleep_ms(200);
}

static void wait_in_callback(void)
{
	while (!__atomic_load_n(&in_callback, __ATOMIC_ACQUIRE))
		sleep_ms(1);
}

static void slow_confirm(struct percpu_ref *ref)
{
	(void)ref;
	slow_first_callback();
}

static void test_fork_deferred_batch(void)
{
	struct object a = { 0 }, b = { 0 };
	pid_t pid;

	__atomic_store_n(&in_callback, 0, __ATOMIC_RELAXED);
	percpu_ref_init(&a.ref, obj_release, 0);
	percpu_ref_init(&b.ref, obj_release, 0);
	percpu_ref_kill_and_confirm(&a.ref, slow_confirm);
	percpu_ref_kill(&b.ref);
	wait_in_callback();
	pid = fork();
	if (pid == 0) {
		child_deadline(CHILD_DEADLINE_S);
		if (percpu_ref_barrier())
			_exit(3);
		/* The fork waited for the confirm; it may then land in the
		 * @release that follows (a's, or b's if a's ended first),
		 * which runs with the batch lock released: that one is the
		 * parent's thread's.  Every other release ran here. */
		if (releases_of(&a) > 1 || releases_of(&b) > 1 ||
		    releases_of(&a) + releases_of(&b) < 1)
			_exit(1);
		percpu_ref_exit(&a.ref);
		percpu_ref_exit(&b.ref);
		exit(0);	/* the destructors run: must not hang */
	}
	is(wait_child(pid), 0, "2: fork during the callback thread's batch: child's barrier, "
	   "releases and exit complete");
	percpu_ref_barrier();
	percpu_ref_exit(&a.ref);
	percpu_ref_exit(&b.ref);
}

/*
 * 2 (sync): fork while another thread is inside switch_to_atomic_sync(),
 * whose fence runs with no switch lock held.  The child must not inherit
 * the switch half done: nobody would finish it there, and its kill or exit
 * of the ref would wait for ever.  Exit status: 1 caught mid-switch, 128 +
 * SIGALRM a hang.
 *
 * The forks start once the switcher has switched: a fork while the new
 * thread was still in ASan's start-up (which frees pthread_getattr_np()'s
 * buffer) left ASan's allocator locked in the child, and the callback
 * thread the child starts hung in its own start-up (GCC 12's libasan takes
 * no allocator lock around fork; stress_fork.c has the same rule).  Seen once
 * under ctest, and in 4 of 200 processes at their first fork; glibc's malloc
 * is fork-safe.
 */
static struct percpu_ref sync_ref;
static int sync_stop;		/* atomic */
static int sync_switched;	/* atomic: the switcher ran a switch */

static void *sync_switcher(void *arg)
{
	(void)arg;
	while (!__atomic_load_n(&sync_stop, __ATOMIC_RELAXED)) {
		percpu_ref_switch_to_atomic_sync(&sync_ref);
		percpu_ref_switch_to_percpu(&sync_ref);
		__atomic_store_n(&sync_switched, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

static void test_fork_sync_switch(void)
{
	/* Each fork copies the process under valgrind, whose check of each
	 * child's exit is what it adds here: fewer there. */
	int forks = UNDER_VALGRIND ? 30 : 300;
	int i, cut = 0, hung = 0, other = 0;
	pthread_t t;

	percpu_ref_init(&sync_ref, NULL, PERCPU_REF_ALLOW_REINIT);
	__atomic_store_n(&sync_stop, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&sync_switched, 0, __ATOMIC_RELAXED);
	if (pthread_create(&t, NULL, sync_switcher, NULL)) {
		ok(0, "2 (sync): switcher started");
		return;
	}
	while (!__atomic_load_n(&sync_switched, __ATOMIC_RELAXED))
		sleep_ms(1);
	for (i = 0; i < forks; i++) {
		pid_t pid = fork();
		int ret;

		if (pid == 0) {
			child_deadline(CHILD_DEADLINE_S);
			if (__atomic_load_n(&sync_ref.data->confirm_switch, __ATOMIC_RELAXED))
				_exit(1);
			percpu_ref_kill(&sync_ref);
			percpu_ref_exit(&sync_ref);
			_exit(0);
		}
		ret = wait_child(pid);
		cut += ret == 1;
		hung += ret == 128 + SIGALRM;
		other += ret != 0 && ret != 1 && ret != 128 + SIGALRM;
	}
	__atomic_store_n(&sync_stop, 1, __ATOMIC_RELAXED);
	pthread_join(t, NULL);
	ok(!cut && !hung && !other, "2 (sync): %d forks amid synchronous switches: no child "
	   "inherits one half done (%d did, %d hung, %d failed otherwise)", forks, cut, hung, other);
	percpu_ref_kill(&sync_ref);
	percpu_ref_exit(&sync_ref);
}

struct robj {
	struct percpu_rcuref ref;
	int releases;
};

static void robj_release(struct percpu_rcuref *ref)
{
	struct robj *o = caa_container_of(ref, struct robj, ref);

	slow_first_callback();
	__atomic_fetch_add(&o->releases, 1, __ATOMIC_RELEASE);
}

static void test_fork_rcu_batch(void)
{
	struct robj a = { 0 }, b = { 0 };
	pid_t pid;

	__atomic_store_n(&in_callback, 0, __ATOMIC_RELAXED);
	percpu_rcuref_init(&a.ref, NULL, robj_release, PERCPU_REF_INIT_ATOMIC);
	percpu_rcuref_init(&b.ref, NULL, robj_release, PERCPU_REF_INIT_ATOMIC);
	percpu_rcuref_kill(&a.ref);
	percpu_rcuref_kill(&b.ref);
	wait_in_callback();
	pid = fork();
	if (pid == 0) {
		child_deadline(CHILD_DEADLINE_S);
		if (percpu_rcuref_barrier() || percpu_ref_managed_flush())
			_exit(3);
		/* The other's, run here; never the one in progress (both,
		 * if the fork came after the first had ended). */
		if (__atomic_load_n(&a.releases, __ATOMIC_ACQUIRE) +
			    __atomic_load_n(&b.releases, __ATOMIC_ACQUIRE) < 1 ||
		    __atomic_load_n(&a.releases, __ATOMIC_ACQUIRE) > 1 ||
		    __atomic_load_n(&b.releases, __ATOMIC_ACQUIRE) > 1)
			_exit(1);
		exit(0);
	}
	is(wait_child(pid), 0, "3: fork during the reclaimer's RCU batch: child's barrier, "
	   "flush and exit complete, the rest of the batch released");
	percpu_rcuref_barrier();
	percpu_rcuref_exit(&a.ref);
	percpu_rcuref_exit(&b.ref);
}

static void slow_release(struct percpu_ref *ref)
{
	slow_first_callback();
	obj_release(ref);
}

static void test_fork_release_phase(void)
{
	struct object a = { 0 }, b = { 0 };
	pid_t pid;

	__atomic_store_n(&in_callback, 0, __ATOMIC_RELAXED);
	make_managed(&a.ref, slow_release);
	make_managed(&b.ref, slow_release);
	percpu_ref_put(&a.ref);
	percpu_ref_put(&b.ref);
	set_interval(1);
	wait_in_callback();
	pid = fork();
	if (pid == 0) {
		child_deadline(CHILD_DEADLINE_S);
		if (percpu_ref_managed_flush())
			_exit(3);
		/* The other's, run here; never the one in progress (both,
		 * if the fork came after the first had ended). */
		if (releases_of(&a) + releases_of(&b) < 1 || releases_of(&a) > 1 ||
		    releases_of(&b) > 1)
			_exit(1);
		exit(0);
	}
	is(wait_child(pid), 0, "4: fork during a scan's release phase: the child releases "
	   "the other ref");
	percpu_ref_managed_flush();
	set_interval(PERCPU_REF_MANAGED_INTERVAL_MS);
	is(releases_of(&a) + releases_of(&b), 2, "4: parent released both");
	percpu_ref_exit(&a.ref);
	percpu_ref_exit(&b.ref);
}

/* ---- Finding 5: fork against a grace period waiting for a reader. ---- */

static int phase;	/* atomic: how far the three threads of mode_gp_fork got */

static void wait_phase(int at_least)
{
	while (__atomic_load_n(&phase, __ATOMIC_ACQUIRE) < at_least)
		sleep_ms(1);
}

static void *gp_thread(void *arg)
{
	(void)arg;
	wait_phase(1);
	__atomic_store_n(&phase, 2, __ATOMIC_RELEASE);
	urcu_bp_synchronize_rcu();	/* waits for the reader */
	return NULL;
}

static void *fork_thread(void *arg)
{
	pid_t pid;

	(void)arg;
	wait_phase(2);
	sleep_ms(50);			/* the grace period holds its lock */
	__atomic_store_n(&phase, 3, __ATOMIC_RELEASE);
	pid = fork();
	if (pid == 0)
		_exit(0);
	return (void *)(intptr_t)wait_child(pid);
}

static int mode_gp_fork(void)
{
	struct percpu_ref ref;
	pthread_t gp, forker;
	void *forked;

	percpu_ref_init(&ref, NULL, 0);	/* the library is initialised */
	percpu_ref_exit(&ref);
	pthread_create(&gp, NULL, gp_thread, NULL);
	pthread_create(&forker, NULL, fork_thread, NULL);
	percpu_rcuref_read_lock();
	__atomic_store_n(&phase, 1, __ATOMIC_RELEASE);
	wait_phase(3);
	sleep_ms(50);			/* the fork's prepare handler runs */
	/* A reader taking a library lock inside its read-side section. */
	if (percpu_ref_init(&ref, NULL, 0))
		return 1;
	percpu_ref_exit(&ref);
	percpu_rcuref_read_unlock();
	pthread_join(gp, NULL);
	pthread_join(forker, &forked);
	return (int)(intptr_t)forked;
}

/* ---- Finding 6: a release callback exits another ref of its batch. ---- */

static struct object pair[2];
static bool pair_exited[2];	/* reclaimer thread only */

static void exit_other_release(struct percpu_ref *ref)
{
	int self = ref == &pair[1].ref, other = !self;

	obj_release(ref);
	if (!pair_exited[other]) {
		pair_exited[other] = true;
		percpu_ref_exit(&pair[other].ref);
		/* The object is gone: its release must never run now. */
		memset(&pair[other].ref, 0xa5, sizeof(pair[other].ref));
	}
}

/*
 * Both puts before one flush, with no periodic scan between them: a scan
 * there (the test thread kept off its CPU between the puts, on a loaded
 * machine) released the first ref alone, whose release exited the second
 * and overwrote it, and the second put then ran on that garbage: SIGSEGV
 * (a 5.5 s sleep between the puts, against the interval of 5 s).
 */
static void test_release_exits_other(void)
{
	struct percpu_ref_managed_config saved;
	int i;

	hold_periodic_scans(&saved);
	for (i = 0; i < 2; i++)
		make_managed(&pair[i].ref, exit_other_release);
	for (i = 0; i < 2; i++)
		percpu_ref_put(&pair[i].ref);
	percpu_ref_managed_flush();
	percpu_ref_managed_set_config(&saved);
	is(releases_of(&pair[0]) + releases_of(&pair[1]), 1,
	   "6: a ref exited by a release callback of its batch is not released");
	for (i = 0; i < 2; i++)
		if (!pair_exited[i])
			percpu_ref_exit(&pair[i].ref);
}

/* ---- Finding 7: exit() inside a percpu_rcuref read-side section. ---- */

static void noop_rcu_release(struct percpu_rcuref *ref)
{
	percpu_rcuref_exit(ref);
}

static int mode_exit_in_reader(void)
{
	static struct percpu_rcuref r;

	percpu_rcuref_init(&r, NULL, noop_rcu_release, 0);
	percpu_rcuref_read_lock();
	/* Its release waits for a grace period, which waits for us. */
	percpu_rcuref_kill(&r);
	sleep_ms(50);
	exit(0);
}

/* ---- Finding 8: membarrier refused after start-up (sandbox.h). ---- */

static void rcu_count_release(struct percpu_rcuref *ref)
{
	struct robj *o = caa_container_of(ref, struct robj, ref);

	__atomic_fetch_add(&o->releases, 1, __ATOMIC_RELEASE);
}

/* A hundred get/put pairs on @o, then its kill: released once? */
static bool pairs_then_kill(struct object *o)
{
	int i;

	for (i = 0; i < 100; i++) {
		percpu_ref_get(&o->ref);
		percpu_ref_put(&o->ref);
	}
	percpu_ref_kill(&o->ref);
	return !percpu_ref_barrier() && releases_of(o) == 1;
}

/* The calls that move this thread (the migration fence's, tid 0), counted
 * (linked with --wrap=sched_setaffinity: tests/CMakeLists.txt). */
static unsigned long self_moves;
int __real_sched_setaffinity(pid_t tid, size_t size, const cpu_set_t *set);
int __wrap_sched_setaffinity(pid_t tid, size_t size, const cpu_set_t *set)
{
	if (!tid)	/* Relaxed: read on this thread, after its own fences. */
		__atomic_fetch_add(&self_moves, 1, __ATOMIC_RELAXED);
	return __real_sched_setaffinity(tid, size, set);
}

/* Exit status 1-3: a count or release wrong (after the refusal: a kill, a
 * sync switch, the managed and RCU releases); 4: membarrier not refused;
 * 5: a fence after the first refused one moved this thread nowhere (with
 * rseq, nothing else fences); 6: on the fallback path, the readers not
 * told to fence themselves. */
static int mode_seccomp(void)
{
	struct object a = { 0 }, b = { 0 }, m = { 0 };
	struct robj r = { 0 };
	unsigned long moves;
	bool fallback;

	/* Start-up: the library and both its threads are running. */
	percpu_ref_init(&a.ref, obj_release, 0);
	percpu_ref_init(&b.ref, obj_release, PERCPU_REF_ALLOW_REINIT);
	make_managed(&m.ref, obj_release);
	percpu_rcuref_init(&r.ref, NULL, rcu_count_release, 0);
	percpu_ref_switch_to_atomic_sync(&b.ref);
	percpu_ref_switch_to_percpu(&b.ref);
	if (refuse_membarrier())
		return 77;
	if (syscall(__NR_membarrier, 0, 0) != -1 || errno != EPERM)
		return 4;
	if (!pairs_then_kill(&a))
		return 1;
	fallback = !strcmp(percpuref_fast_path(), "fallback");
	if (fallback &&
	    /* Relaxed: stored by this thread's own refused fence. */
	    !__atomic_load_n(&percpuref_readers_fence_needed, __ATOMIC_RELAXED))
		return 6;
	/* The refused fence named: reports tell the slower path by it. */
	if (strcmp(percpuref_fence_method(), fallback ? "reader-fences" : "migration"))
		return 7;
	moves = __atomic_load_n(&self_moves, __ATOMIC_RELAXED);
	percpu_ref_switch_to_atomic_sync(&b.ref);
	if (!fallback && __atomic_load_n(&self_moves, __ATOMIC_RELAXED) == moves)
		return 5;
	percpu_ref_kill(&b.ref);
	if (releases_of(&b) != 1)
		return 2;
	percpu_ref_put(&m.ref);
	percpu_rcuref_kill(&r.ref);
	if (percpu_ref_managed_flush() || percpu_rcuref_barrier() || releases_of(&m) != 1 ||
	    __atomic_load_n(&r.releases, __ATOMIC_ACQUIRE) != 1)
		return 3;
	percpu_ref_exit(&a.ref);
	percpu_ref_exit(&b.ref);
	percpu_ref_exit(&m.ref);
	percpu_rcuref_exit(&r.ref);
	return 0;
}

/*
 * ---- Finding 14: the switch of liburcu-bp to plain fences holds none of
 * its locks (review 159). ----  Once membarrier is refused, the reclaimer's
 * grace period (percpuref_synchronize_rcu()) sets liburcu-bp's flag to 0,
 * warns and runs on every CPU.  Holding liburcu-bp's locks over that
 * (urcu_bp_before_fork(): its registry lock among them) hung here: a
 * logging thread holds stderr, then enters its first read-side section,
 * whose registration waits for the registry lock, while the reclaimer
 * waits for stderr to warn.
 */
extern int urcu_bp_has_sys_membarrier;	/* liburcu-bp's ABI */

static int stderr_held;		/* the holder has stderr */
static int switch_unseen;	/* the holder gave up waiting for the switch */

/* Holds stderr until the switch has begun (liburcu-bp's flag reads 0),
 * then enters this thread's first read-side section, which registers it:
 * a switch that held the registry lock and waited to warn hung here. */
static void *stderr_holder(void *arg)
{
	int tries = 0;

	(void)arg;
	flockfile(stderr);
	__atomic_store_n(&stderr_held, 1, __ATOMIC_SEQ_CST);
	/* Seq_cst: the reclaimer's store of 0 is seq_cst. */
	while (__atomic_load_n(&urcu_bp_has_sys_membarrier, __ATOMIC_SEQ_CST) && ++tries < 5000)
		sleep_ms(1);
	if (tries >= 5000)
		__atomic_store_n(&switch_unseen, 1, __ATOMIC_SEQ_CST);
	urcu_bp_read_lock();
	urcu_bp_read_unlock();
	funlockfile(stderr);
	return NULL;
}

/* Exit status 2: init failed; 3: no thread; 4: the release ran not once;
 * 5: liburcu-bp still set to use membarrier; 6: the switch did not begin
 * while stderr was held (nothing tested); 77: no seccomp filter here, or
 * liburcu-bp never used membarrier. */
static int mode_seccomp_logger(void)
{
	static struct robj r;
	pthread_t t;

	if (percpu_rcuref_init(&r.ref, NULL, rcu_count_release, 0))
		return 2;
	/* The reclaimer running, before the filter. */
	percpu_rcuref_get(&r.ref);
	percpu_rcuref_kill(&r.ref);
	percpu_rcuref_barrier();
	/* Relaxed: liburcu-bp set it at its start-up, before ours. */
	if (!__atomic_load_n(&urcu_bp_has_sys_membarrier, __ATOMIC_RELAXED) ||
	    refuse_membarrier())
		return 77;
	if (pthread_create(&t, NULL, stderr_holder, NULL))
		return 3;
	while (!__atomic_load_n(&stderr_held, __ATOMIC_SEQ_CST))
		sleep_ms(1);
	/* The last reference: an RCU release, whose grace period switches
	 * liburcu-bp and warns. */
	percpu_rcuref_put(&r.ref);
	percpu_rcuref_barrier();
	pthread_join(t, NULL);
	if (__atomic_load_n(&switch_unseen, __ATOMIC_SEQ_CST))
		return 6;
	if (__atomic_load_n(&r.releases, __ATOMIC_ACQUIRE) != 1)
		return 4;
	if (__atomic_load_n(&urcu_bp_has_sys_membarrier, __ATOMIC_RELAXED))
		return 5;
	percpu_rcuref_exit(&r.ref);
	return 0;
}

/*
 * ---- Finding 13: neither membarrier nor migration (a sandbox that
 * refuses both after start-up). ----  The fence then disables the rseq
 * fast path and waits for sections in flight (runtime.c): the counts stay
 * exact here, on the fallback path from then on.  And since a section
 * that outlived the wait would add to a copy the fold had zeroed, an
 * allocation zeroes every copy of its slot again (internal.h,
 * percpuref_note_unfenced_adds()): a trace left on a free slot, as such
 * an add would leave it, is gone when the slot is handed out.
 */
/* membarrier(2) fails with EPERM; sched_setaffinity(2) gets
 * @migration_action (EPERM too, or SECCOMP_RET_ERRNO | 0: "done", and
 * nothing moved, as some sandboxes answer). */
static int refuse_membarrier_and_migration(unsigned int migration_action)
{
	struct sock_filter filter[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_membarrier, 3, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_sched_setaffinity, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_RET | BPF_K, migration_action),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
	};

	return install_filter(filter, sizeof(filter) / sizeof(filter[0]), SECCOMP_FILTER_FLAG_TSYNC);
}

/* @fake_moves: sched_setaffinity() answers 0 and moves nothing; a fence
 * that took that for a move fenced nothing (a review's reading), and the
 * fast path stayed on. */
static int mode_no_fence(bool fake_moves)
{
	/* Static: a failure returns with a kill in flight, which the exit
	 * handler then finishes. */
	static struct object a, b;
	cpu_set_t cpus;
	uintptr_t slot, again;
	bool started_on_rseq;

	percpu_ref_init(&a.ref, obj_release, 0);
	started_on_rseq = strcmp(percpuref_fast_path(), "fallback");
	percpu_ref_init(&b.ref, obj_release, PERCPU_REF_ALLOW_REINIT);
	percpu_ref_switch_to_atomic_sync(&b.ref);
	percpu_ref_switch_to_percpu(&b.ref);
	if (percpuref_unfenced_adds_possible())
		return 10;	/* before any refusal */
	if (percpuref_nr_units() < 2 ||
	    refuse_membarrier_and_migration(fake_moves ? SECCOMP_RET_ERRNO : SECCOMP_RET_ERRNO | EPERM))
		return 77;
	sched_getaffinity(0, sizeof(cpus), &cpus);
	if (syscall(__NR_membarrier, 0, 0) != -1 || errno != EPERM ||
	    (sched_setaffinity(0, sizeof(cpus), &cpus) != -1 || errno != EPERM) != fake_moves)
		return 77;	/* another architecture's calls pass the filter */
	if (!pairs_then_kill(&a))
		return 1;
	if (strcmp(percpuref_fast_path(), "fallback"))
		return 2;
	/* No per-CPU section is left to fence where rseq went (its threads
	 * have no unit); a fallback's readers fence themselves. */
	if (strcmp(percpuref_fence_method(), started_on_rseq ? "none" : "reader-fences"))
		return 8;
	if (!percpuref_unfenced_adds_possible())
		return 3;
	/* The switch back zeroes too; the counts stay exact.  A trace on a
	 * copy the fold zeroed, as an add that outlived the wait leaves it,
	 * is gone with it: it reached the kill's fold, and b was never
	 * released. */
	percpu_ref_switch_to_atomic_sync(&b.ref);
	*percpuref_counter_on(b.ref.percpu_count_ptr & ~(uintptr_t)__PERCPU_REF_ATOMIC_DEAD, 1) = 5;
	percpu_ref_switch_to_percpu(&b.ref);
	percpu_ref_get(&b.ref);
	percpu_ref_put(&b.ref);
	percpu_ref_kill(&b.ref);
	if (percpu_ref_barrier() || releases_of(&b) != 1)
		return 4;
	/* A trace on a free slot's copy (this thread's cache hands the slot
	 * back, last in first out). */
	slot = percpuref_counter_alloc();
	if (!slot)
		return 5;
	*percpuref_counter_on(slot, 1) = 5;
	percpuref_counter_free(slot);
	again = percpuref_counter_alloc();
	if (again != slot)
		return 6;
	if (*percpuref_counter_on(again, 1) != 0)
		return 7;
	percpuref_counter_free(again);
	percpu_ref_exit(&a.ref);
	percpu_ref_exit(&b.ref);
	return 0;
}

/*
 * The fence that switches the fast path off waits 10 ms for the sections
 * in flight; so must every fence that reads the fast path as off before
 * those 10 ms are up: a switch whose fence returned at once folded the
 * copies while such a section could still add to one (a review found the
 * later fences waited for nothing).  Another thread fences as soon as it
 * sees the offset go to 0; its fence must not end before the first
 * fence's start plus 10 ms.  With --no-fence-late-stamp the switch-off
 * is held for 20 ms between its publish of the offset and its stamp of
 * the wait's end (a switching thread preempted there): the other fence
 * must wait for the stamp, then 10 ms (a second review: the end was read
 * from the clock before the publish, and could be lowered).
 */
static uint64_t overlap_ended_ns;

/*
 * The rseq fast path in use, then membarrier and migration refused: false
 * where that cannot be had here (no rseq fast path to switch off, one CPU,
 * no filter, or another architecture's calls, which pass the filter).
 */
static bool rseq_then_no_fence(void)
{
	/* Sets the library up (the offset is set at the first call). */
	return !strncmp(percpuref_fast_path(), "rseq", 4) && percpuref_nr_units() >= 2 &&
	       !refuse_membarrier_and_migration(SECCOMP_RET_ERRNO | EPERM) &&
	       syscall(__NR_membarrier, 0, 0) == -1 && errno == EPERM;
}

static void *fence_once_switched_off(void *arg)
{
	(void)arg;
	/* Relaxed: a spin until the switch-off; the fence orders the rest. */
	while (__atomic_load_n(&percpuref_rseq_offset, __ATOMIC_RELAXED))
		;
	percpuref_fence_readers();
	overlap_ended_ns = percpuref_monotonic_ns();
	return NULL;
}

static int mode_no_fence_overlap(unsigned long stamp_delay_us)
{
	uint64_t started, least = (stamp_delay_us + 10000) * 1000;
	pthread_t other;

	if (!rseq_then_no_fence())
		return 77;
	percpuref_test_switch_off_stamp_delay(stamp_delay_us);
	if (pthread_create(&other, NULL, fence_once_switched_off, NULL))
		return 1;
	started = percpuref_monotonic_ns();
	percpuref_fence_readers();
	pthread_join(other, NULL);
	if (percpuref_rseq_offset)
		return 2;
	if (overlap_ended_ns < started + least) {
		fprintf(stderr, "the other fence ended %.3f ms after the switch-off began\n",
			(double)(overlap_ended_ns - started) / 1e6);
		return 3;
	}
	return 0;
}

/*
 * The switching fence's own 10 ms with an interval timer firing every
 * millisecond on its thread: up to 0.4.29 the wait was one nanosleep(),
 * which a handled signal ends early (EINTR; never restarted, SA_RESTART
 * or not), and the fence returned after about 1 ms while a section that
 * read the fast path as on could still add (review 162, Model S's
 * -DSIGNAL).  A profiler's SIGPROF does the same.
 */
static void on_alarm(int sig)
{
	(void)sig;
}

static int mode_no_fence_signal(void)
{
	struct itimerval every_ms = { { 0, 1000 }, { 0, 1000 } }, off = { { 0, 0 }, { 0, 0 } };
	uint64_t started, ended;
	struct sigaction sa;

	if (!rseq_then_no_fence())
		return 77;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sa.sa_flags = SA_RESTART;
	if (sigaction(SIGALRM, &sa, NULL) || setitimer(ITIMER_REAL, &every_ms, NULL))
		return 1;
	started = percpuref_monotonic_ns();
	percpuref_fence_readers();	/* switches the fast path off, and waits */
	ended = percpuref_monotonic_ns();
	setitimer(ITIMER_REAL, &off, NULL);
	if (percpuref_rseq_offset)
		return 2;
	if (ended < started + 10 * 1000 * 1000) {
		fprintf(stderr, "the switching fence ended %.3f ms after it began\n",
			(double)(ended - started) / 1e6);
		return 3;
	}
	return 0;
}

/*
 * A thread stopped between its sequence's read of the params word and
 * label 1, where a preemption or a signal aborts nothing: up to 0.4.29 it
 * kept the units it had read and, run again after a switch-off of the
 * fast path and its 10 ms, added to a per-CPU copy (4 runs of 4, 30 to
 * 79 ms after the switch-off), where a later switch's fence, finding the
 * 10 ms past, waited for nothing (review 162, Model S's -DPREEMPT).  The
 * units are now read again after label 1.  Here a handler parks the
 * thread on the sequence's lea or rseq_cs store, found from the
 * descriptors of the sequences inlined in this program (the asm is
 * verbatim, so the two instructions are 7 and 5 bytes long), until the
 * fast path is off, its wait done and a second fence run: the per-CPU
 * copies must not change once it goes on.  x86-64 only.
 */
#if defined(__x86_64__)
struct rseq_descriptor {
	uint32_t version, flags;
	uint64_t start_ip, post_commit_offset, abort_ip;
};
extern const struct rseq_descriptor __start___rseq_cs[] __attribute__((weak));
extern const struct rseq_descriptor __stop___rseq_cs[] __attribute__((weak));

static struct object stalled;
static int stall_caught, stall_released, stall_stop;	/* atomic */

/* The last two instructions before label 1: lea 3b(%rip),%rax (7 bytes)
 * and mov %rax,%fs:8(%rcx) (5), after the params word's load. */
static bool has_sequence_layout(const struct rseq_descriptor *d)
{
	static const unsigned char lea[] = { 0x48, 0x8d, 0x05 };
	static const unsigned char store_rseq_cs[] = { 0x64, 0x48, 0x89, 0x41, 0x08 };

	return !memcmp((const void *)(uintptr_t)(d->start_ip - 12), lea, sizeof(lea)) &&
	       !memcmp((const void *)(uintptr_t)(d->start_ip - 5), store_rseq_cs,
		       sizeof(store_rseq_cs));
}

static bool before_label_1(uint64_t ip)
{
	const struct rseq_descriptor *d;

	for (d = __start___rseq_cs; d && d < __stop___rseq_cs; d++)
		if ((ip == d->start_ip - 12 || ip == d->start_ip - 5) && has_sequence_layout(d))
			return true;
	return false;
}

/* Some sequence of this program has the layout above: else this test
 * would find no place to stop and skip for ever (a change to the asm must
 * change the test with it). */
static bool sequence_layout_known(void)
{
	const struct rseq_descriptor *d;

	for (d = __start___rseq_cs; d && d < __stop___rseq_cs; d++)
		if (has_sequence_layout(d))
			return true;
	return false;
}

static void park_before_label_1(int sig, siginfo_t *si, void *context)
{
	ucontext_t *uc = context;

	(void)sig;
	(void)si;
	if (__atomic_load_n(&stall_caught, __ATOMIC_SEQ_CST) ||
	    !before_label_1((uint64_t)uc->uc_mcontext.gregs[REG_RIP]))
		return;
	__atomic_store_n(&stall_caught, 1, __ATOMIC_SEQ_CST);
	while (!__atomic_load_n(&stall_released, __ATOMIC_SEQ_CST))
		;
}

static void *get_put_until_stopped(void *arg)
{
	(void)arg;
	while (!__atomic_load_n(&stall_stop, __ATOMIC_RELAXED)) {
		percpu_ref_get(&stalled.ref);
		percpu_ref_put(&stalled.ref);
	}
	return NULL;
}

static unsigned long stalled_copies(void)
{
	return percpuref_counter_sum(stalled.ref.percpu_count_ptr &
					     ~(uintptr_t)__PERCPU_REF_ATOMIC_DEAD,
				     percpuref_nr_units());
}

static int mode_no_fence_before_label_1(void)
{
	struct timespec pause = { 0, 200 * 1000 };
	unsigned long before, after;
	struct sigaction sa;
	pthread_t worker;
	int tries;

	/* ThreadSanitizer runs handlers at its own points, never inside a
	 * sequence. */
	if (UNDER_TSAN || &__start___rseq_cs[0] == &__stop___rseq_cs[0])
		return 77;
	if (!sequence_layout_known()) {
		fprintf(stderr, "no sequence ends in the lea and rseq_cs store before label 1\n");
		return 4;
	}
	if (!rseq_then_no_fence())
		return 77;
	if (percpu_ref_init(&stalled.ref, obj_release, 0))
		return 1;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = park_before_label_1;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	if (sigaction(SIGUSR1, &sa, NULL) ||
	    pthread_create(&worker, NULL, get_put_until_stopped, NULL))
		return 1;
	for (tries = 0; !__atomic_load_n(&stall_caught, __ATOMIC_SEQ_CST) && tries < 20000;
	     tries++) {
		pthread_kill(worker, SIGUSR1);
		nanosleep(&pause, NULL);
	}
	if (!__atomic_load_n(&stall_caught, __ATOMIC_SEQ_CST)) {
		__atomic_store_n(&stall_stop, 1, __ATOMIC_RELAXED);
		pthread_join(worker, NULL);
		fprintf(stderr, "no signal landed before label 1 in %d tries\n", tries);
		return 77;
	}
	percpuref_fence_readers();	/* switches the fast path off, waits 10 ms */
	if (percpuref_rseq_offset)
		return 2;
	percpuref_fence_readers();	/* finds the 10 ms past: waits for nothing */
	before = stalled_copies();
	__atomic_store_n(&stall_stop, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&stall_released, 1, __ATOMIC_SEQ_CST);
	pthread_join(worker, NULL);
	after = stalled_copies();
	fprintf(stderr, "caught after %d signals; the per-CPU copies changed by %ld after the "
		"switch-off\n", tries, (long)(after - before));
	return after != before ? 3 : 0;
}
#else
static int mode_no_fence_before_label_1(void)
{
	return 77;
}
#endif

/*
 * A fork while another thread is between its switch-off's publish and its
 * stamp: the child has no such thread, and its fences must not wait for
 * that stamp (they did, for ever, before the child's count was reset).
 */
static void *switch_off_slowly(void *arg)
{
	(void)arg;
	percpuref_fence_readers();
	return NULL;
}

static int mode_no_fence_fork(void)
{
	pthread_t other;
	pid_t pid;
	int status;

	if (!rseq_then_no_fence())
		return 77;
	percpuref_test_switch_off_stamp_delay(300000);
	if (pthread_create(&other, NULL, switch_off_slowly, NULL))
		return 1;
	/* Relaxed: a spin until the other thread's publish. */
	while (__atomic_load_n(&percpuref_rseq_offset, __ATOMIC_RELAXED))
		;
	pid = fork();
	if (pid == 0) {
		alarm(5);	/* the hang this catches: SIGALRM, 128 + 14 */
		percpuref_fence_readers();
		_exit(0);
	}
	status = wait_child(pid);
	pthread_join(other, NULL);
	if (status) {
		fprintf(stderr, "the child's fence: status %d\n", status);
		return 2;
	}
	return 0;
}

/* ---- Finding 10: kill from the ref's own confirm callback. ---- */

static struct object self_killed;

static void confirm_kill_count(struct percpu_ref *ref)
{
	struct object *o = caa_container_of(ref, struct object, ref);

	__atomic_fetch_add(&o->confirms, 1, __ATOMIC_RELEASE);
}

static void kill_from_confirm(struct percpu_ref *ref)
{
	percpu_ref_kill_and_confirm(ref, confirm_kill_count);
}

static void test_kill_from_confirm(void)
{
	unsigned long warned = percpuref_warning_count();

	percpu_ref_init(&self_killed.ref, obj_release, 0);
	percpu_ref_switch_to_atomic(&self_killed.ref, kill_from_confirm);
	percpu_ref_barrier();
	is(__atomic_load_n(&self_killed.confirms, __ATOMIC_ACQUIRE), 1,
	   "10: kill from the ref's own confirm callback calls confirm_kill");
	is(releases_of(&self_killed), 1, "10: and releases the ref once");
	is(percpuref_warning_count() - warned, 0, "10: without a warning");
	percpu_ref_exit(&self_killed.ref);
}

/* ---- Finding 11: a put dropped the manager's reference. ---- */

/* No periodic scan between the two puts: one there (the test thread kept
 * off its CPU between them) found the manager's reference the last one and
 * released the ref before the misuse (a 5.5 s sleep there: released, and
 * the second put warned as a put below zero instead). */
static void test_dropped_manager_ref(void)
{
	struct percpu_ref_managed_stats before, after;
	struct percpu_ref_managed_config saved;
	struct object o = { 0 };
	unsigned long warned;
	int i;

	hold_periodic_scans(&saved);
	make_managed(&o.ref, obj_release);
	percpu_ref_put(&o.ref);
	warned = percpuref_warning_count();
	percpu_ref_put(&o.ref);		/* misuse: the manager's reference */
	percpu_ref_managed_flush();
	percpu_ref_managed_get_stats(&before);
	for (i = 0; i < 3; i++)
		percpu_ref_managed_flush();
	percpu_ref_managed_get_stats(&after);
	percpu_ref_managed_set_config(&saved);
	is(percpuref_warning_count() - warned, 1, "11: warned once");
	is(after.refs_scanned - before.refs_scanned, 0, "11: the pinned ref is no longer scanned");
	is(releases_of(&o), 0, "11: and never released");
	percpu_ref_exit(&o.ref);
}

/* ---- Finding 12: every reclaimer setting is validated. ---- */

static int mode_print_interval(void)
{
	struct percpu_ref_managed_config c;

	percpu_ref_managed_get_config(&c);
	return c.interval_ms == PERCPU_REF_MANAGED_INTERVAL_MS && percpuref_warning_count() == 1
		       ? 0 : 1;
}

static void test_settings(void)
{
	struct percpu_ref_managed_config c, now;

	percpu_ref_managed_get_config(&c);
	c.interval_ms = PERCPU_REF_MANAGED_INTERVAL_MAX_MS + 1;
	is(percpu_ref_managed_set_config(&c), -EINVAL, "12: interval above the maximum: -EINVAL");
	c.interval_ms = ~0UL / 1000;
	is(percpu_ref_managed_set_config(&c), -EINVAL, "12: interval that would wrap: -EINVAL");
	percpu_ref_managed_get_config(&now);
	is(now.interval_ms, PERCPU_REF_MANAGED_INTERVAL_MS, "12: nothing changed");
	is(percpu_ref_managed_set_config(NULL), -EINVAL, "12: NULL config: -EINVAL");
	setenv("PERCPUREF_SCAN_INTERVAL_MS", "18446744073709551", 1);
	is(run_mode("--print-interval"), 0, "12: huge interval from the environment: warned, "
	   "default kept");
	unsetenv("PERCPUREF_SCAN_INTERVAL_MS");
}

int main(int argc, char **argv)
{
	if (argc > 1) {
		child_deadline(CHILD_DEADLINE_S);
		if (!strcmp(argv[1], "--one-unit"))
			return mode_one_unit();
		if (!strcmp(argv[1], "--fence-cpus"))
			return mode_fence_cpus();
		if (!strcmp(argv[1], "--fence-cpusets"))
			return mode_fence_cpusets();
		if (!strcmp(argv[1], "--gp-fork"))
			return mode_gp_fork();
		if (!strcmp(argv[1], "--exit-in-reader"))
			return mode_exit_in_reader();
		if (!strcmp(argv[1], "--seccomp"))
			return mode_seccomp();
		if (!strcmp(argv[1], "--seccomp-logger"))
			return mode_seccomp_logger();
		if (!strcmp(argv[1], "--no-fence"))
			return mode_no_fence(false);
		if (!strcmp(argv[1], "--no-fence-fake-moves"))
			return mode_no_fence(true);
		if (!strcmp(argv[1], "--no-fence-overlap"))
			return mode_no_fence_overlap(0);
		if (!strcmp(argv[1], "--no-fence-late-stamp"))
			return mode_no_fence_overlap(20000);
		if (!strcmp(argv[1], "--no-fence-fork"))
			return mode_no_fence_fork();
		if (!strcmp(argv[1], "--no-fence-signal"))
			return mode_no_fence_signal();
		if (!strcmp(argv[1], "--no-fence-before-label-1"))
			return mode_no_fence_before_label_1();
		if (!strcmp(argv[1], "--print-interval"))
			return mode_print_interval();
		return 2;
	}
	test_possible_mask();
	test_cpu_list_patterns();
	test_one_unit();
	test_fence_cpus();
	test_fence_cpusets();
	if (UNDER_TSAN) {
		printf("# skipped findings 2-5 (fork of a threaded process) under "
		       "ThreadSanitizer\n");
	} else {
		test_fork_deferred_batch();
		test_fork_rcu_batch();
		test_fork_release_phase();
		test_fork_sync_switch();
		is(run_mode("--gp-fork"), 0, "5: fork while a grace period waits for a reader "
		   "that takes a library lock: no deadlock");
	}
	test_release_exits_other();
	is(run_mode("--exit-in-reader"), 0, "7: exit() inside a read-side section completes");
	child_verdict(run_mode_without_membarrier("--seccomp"),
		      "finding 8: cannot install a seccomp filter here",
		      "8: membarrier refused after start-up: switches, kills, "
		      "releases still exact, no abort");
	child_verdict(run_mode_without_membarrier("--seccomp-logger"),
		      "finding 14: cannot install a seccomp filter here, or liburcu-bp "
		      "does not use membarrier",
		      "14: liburcu-bp switched to plain fences while a thread holds stderr "
		      "and then registers as its reader: no deadlock");
	child_verdict(run_mode_without_membarrier("--no-fence"),
		      "finding 13: cannot refuse membarrier and migration here",
		      "13: membarrier and migration refused: the fast path goes, "
		      "releases stay exact, and a trace on a free slot is zeroed at allocation");
	child_verdict(run_mode_without_membarrier("--no-fence-fake-moves"),
		      "finding 13: cannot refuse membarrier and migration here",
		      "13: membarrier refused, moves between CPUs answered and not made: the "
		      "fast path goes too");
	child_verdict(run_mode_without_membarrier("--no-fence-overlap"),
		      "finding 13: cannot refuse membarrier and migration here",
		      "13: a fence that finds the fast path just switched off waits for the "
		      "sections in flight too");
	child_verdict(run_mode_without_membarrier("--no-fence-late-stamp"),
		      "finding 13: cannot refuse membarrier and migration here",
		      "13: and for a switch-off held between its publish and its stamp");
	child_verdict(run_mode_without_membarrier("--no-fence-fork"),
		      "finding 13: cannot refuse membarrier and migration here",
		      "13: a fork child of a process mid-switch-off does not wait for its stamp");
	child_verdict(run_mode_without_membarrier("--no-fence-signal"),
		      "finding 13: cannot refuse membarrier and migration here",
		      "13: signals on the switching fence's thread do not cut its wait short");
	child_verdict(run_mode_without_membarrier("--no-fence-before-label-1"),
		      "finding 13: cannot refuse membarrier and migration here, not x86-64, or "
		      "no signal landed before a sequence's label 1",
		      "13: a thread stopped before its sequence's label 1 does not add to a "
		      "per-CPU copy after the switch-off");
	test_kill_from_confirm();
	test_dropped_manager_ref();
	test_settings();
	return done_testing();
}
