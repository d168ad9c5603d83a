/* SPDX-License-Identifier: MIT */
/*
 * percpuref_set_library_cpus() and PERCPUREF_LIBRARY_CPUS: where the
 * library's threads (the callback thread, the reclaimer) run.  Each
 * thread's affinity is read back from the kernel by its thread id, found
 * by its name.  The attacks: a list that is not one, CPUs no thread can
 * use (while threads run, and while none does), a thread started by
 * another library thread while a choice holds, a fork child whose set
 * must not reach the parent's threads (their ids are valid across the
 * fork: the same user may move them), a kernel that refuses the second
 * thread only (the first must move back), threads that start and end
 * while another thread sets.  The test links with
 * -Wl,--wrap=sched_setaffinity: every thread id the library passes must
 * name a live thread of the library's (named "percpuref-..."), never an
 * id a thread left, which the kernel may give to any other thread.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "percpuref/managed.h"
#include "percpuref/percpu_ref.h"
#include "capture.h"
#include "child.h"
#include "internal.h"
#include "sandbox.h"
#include "tap.h"
#include "thread_names.h"

/* The thread ids the library moved, and those that named no live
 * library thread. */
static int ids_moved, strangers_moved;	/* atomic */

int __real_sched_setaffinity(pid_t tid, size_t size, const cpu_set_t *set);

int __wrap_sched_setaffinity(pid_t tid, size_t size, const cpu_set_t *set)
{
	char id[16], comm[32] = "";

	if (tid) {
		/* Relaxed: counts, read once the threads are joined. */
		__atomic_fetch_add(&ids_moved, 1, __ATOMIC_RELAXED);
		snprintf(id, sizeof(id), "%d", (int)tid);
		if (!thread_name(id, comm) || strncmp(comm, "percpuref-", 10)) {
			__atomic_fetch_add(&strangers_moved, 1, __ATOMIC_RELAXED);
			printf("# sched_setaffinity(%s): not a library thread (\"%s\")\n", id, comm);
		}
	}
	return __real_sched_setaffinity(tid, size, set);
}

static cpu_set_t process_cpus;	/* this thread's affinity at the start */
static int first_cpu, last_cpu;	/* the lowest and highest CPU in it */
static char first_list[16], last_list[16];

static void noop_release(struct percpu_ref *ref)
{
	(void)ref;
}

/* Thread @tid's affinity is @want (one CPU, or -1: process_cpus). */
static bool affinity_is(pid_t tid, int want)
{
	cpu_set_t got, expected;

	if (!tid || sched_getaffinity(tid, sizeof(got), &got))
		return false;
	if (want < 0) {
		expected = process_cpus;
	} else {
		CPU_ZERO(&expected);
		CPU_SET(want, &expected);
	}
	return CPU_EQUAL(&got, &expected);
}

/* The same, waited for up to 5 s: a thread that starts takes the choice
 * itself, after the call that started it returned. */
static bool affinity_becomes(pid_t tid, int want)
{
	for (int i = 0; i < 5000; i++) {
		if (affinity_is(tid, want))
			return true;
		usleep(1000);
	}
	return false;
}

/* Starts the callback thread (a kill) and waits until it ran the kill;
 * its id. */
static pid_t start_callback_thread(void)
{
	struct percpu_ref ref;

	if (percpu_ref_init(&ref, noop_release, 0))
		return 0;
	percpu_ref_kill(&ref);
	percpu_ref_barrier();
	percpu_ref_exit(&ref);
	return thread_named("percpuref-cb");
}

/* Starts the reclaimer (a managed ref, released at once); its id. */
static pid_t start_reclaimer(void)
{
	struct percpu_ref ref;

	if (percpu_ref_init(&ref, noop_release, PERCPU_REF_REL_MANAGED))
		return 0;
	percpu_ref_put(&ref);
	percpu_ref_managed_flush();
	percpu_ref_exit(&ref);
	return thread_named("percpuref-recl");
}

static void test_bad_lists(void)
{
	static const char *const bad[] = { "", "x", "1-0", "0,", ",0", "-1", " 0", "0 ",
					   "8192", "0-8192", "1a", "0--1", "99999999999999999999",
					   "0-1:0", "0-1:0/1", "0-1:2/1", "0:1/2", "0-1:1/" };
	bool all_refused = true;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (percpuref_set_library_cpus(bad[i]) != -EINVAL) {
			printf("# \"%s\" was not refused\n", bad[i]);
			all_refused = false;
		}
	ok(all_refused, "lists that are not lists of CPUs below 8192: -EINVAL");
	is(percpuref_set_library_cpus(NULL), 0, "NULL with no choice made: 0");
	is(percpuref_set_library_cpus("8191"), 0,
	   "a CPU this machine may lack, no thread running to check it: 0");
	is(percpuref_set_library_cpus(NULL), 0, "and back to the default");
}

/* Both threads follow every choice; NULL takes them back to what they
 * inherited.  Needs two CPUs. */
static void test_choices(void)
{
	char pattern[48];
	pid_t cb, recl;

	is(percpuref_set_library_cpus(last_list), 0, "choose CPU %d before any thread runs",
	   last_cpu);
	cb = start_callback_thread();
	recl = start_reclaimer();
	ok(cb && recl, "both library threads found by name");
	is(percpuref_test_library_threads_listed(), 2, "and both listed");
	ok(affinity_becomes(cb, last_cpu), "the callback thread started on CPU %d", last_cpu);
	ok(affinity_becomes(recl, last_cpu), "the reclaimer started on CPU %d", last_cpu);

	is(percpuref_set_library_cpus(first_list), 0, "choose CPU %d while both run", first_cpu);
	ok(affinity_is(cb, first_cpu) && affinity_is(recl, first_cpu),
	   "both moved by the time the call returned");

	/* A range with a pattern names its first CPU only: a stride, a
	 * group, each as wide as the range. */
	snprintf(pattern, sizeof(pattern), "%d-%d:%d", first_cpu, last_cpu,
		 last_cpu - first_cpu + 1);
	is(percpuref_set_library_cpus(last_list), 0, "choose CPU %d again", last_cpu);
	is(percpuref_set_library_cpus(pattern), 0, "choose \"%s\" (taskset's stride)", pattern);
	ok(affinity_is(cb, first_cpu) && affinity_is(recl, first_cpu), "both on CPU %d only",
	   first_cpu);
	snprintf(pattern, sizeof(pattern), "%d-%d:1/%d", first_cpu, last_cpu,
		 last_cpu - first_cpu + 1);
	is(percpuref_set_library_cpus(last_list), 0, "choose CPU %d again", last_cpu);
	is(percpuref_set_library_cpus(pattern), 0, "choose \"%s\" (the kernel's group)",
	   pattern);
	ok(affinity_is(cb, first_cpu) && affinity_is(recl, first_cpu), "both on CPU %d only",
	   first_cpu);

	is(percpuref_set_library_cpus("8191"), -EINVAL,
	   "a CPU no running thread may use: -EINVAL");
	ok(affinity_is(cb, first_cpu) && affinity_is(recl, first_cpu),
	   "and neither thread moved");

	is(percpuref_set_library_cpus(NULL), 0, "back to the default while both run");
	ok(affinity_is(cb, -1) && affinity_is(recl, -1),
	   "both back to the affinity they inherited (this thread's)");
}

/* A release on the reclaimer kills another ref: the callback thread
 * starts from the reclaimer. */
static struct percpu_ref inner;

static void release_kills_inner(struct percpu_ref *ref)
{
	(void)ref;
	percpu_ref_kill(&inner);
}

/* A library thread started by another while a choice holds goes back
 * where the first one started (not to the choice it inherited, nor to
 * where the thread whose call made the first start is). */
static void test_started_by_library_thread(void)
{
	struct percpu_ref outer;
	cpu_set_t one;
	pid_t cb, recl;

	percpuref_shutdown();
	CPU_ZERO(&one);
	CPU_SET(first_cpu, &one);
	if (sched_setaffinity(0, sizeof(one), &one)) {
		skip("cannot pin this thread: %s", strerror(errno));
		return;
	}
	percpu_ref_init(&inner, noop_release, 0);
	percpu_ref_init(&outer, release_kills_inner, PERCPU_REF_REL_MANAGED);
	recl = thread_named("percpuref-recl");
	sched_setaffinity(0, sizeof(process_cpus), &process_cpus);
	ok(affinity_becomes(recl, first_cpu),
	   "the reclaimer started by this thread pinned to CPU %d runs there", first_cpu);
	is(percpuref_set_library_cpus(last_list), 0, "choose CPU %d", last_cpu);
	percpu_ref_put(&outer);
	percpu_ref_managed_flush();	/* the reclaimer releases it */
	percpu_ref_barrier();		/* the callback thread ran the kill */
	cb = thread_named("percpuref-cb");
	ok(affinity_becomes(cb, last_cpu) && affinity_is(recl, last_cpu),
	   "the reclaimer, and the callback thread its callback started, on CPU %d", last_cpu);
	is(percpuref_set_library_cpus(NULL), 0, "back to the default");
	ok(affinity_is(recl, first_cpu) && affinity_is(cb, first_cpu),
	   "both back on CPU %d, where the reclaimer started", first_cpu);
	percpu_ref_exit(&outer);
	percpu_ref_exit(&inner);
	percpuref_shutdown();
}

/* The default: a thread takes the affinity of the thread whose call
 * started it, pinned or not. */
static void test_default_inherits(void)
{
	cpu_set_t one;
	pid_t cb;

	percpuref_shutdown();
	CPU_ZERO(&one);
	CPU_SET(last_cpu, &one);
	if (sched_setaffinity(0, sizeof(one), &one)) {
		skip("cannot pin this thread: %s", strerror(errno));
		return;
	}
	cb = start_callback_thread();
	sched_setaffinity(0, sizeof(process_cpus), &process_cpus);
	ok(affinity_becomes(cb, last_cpu),
	   "no choice: a callback thread started by a thread pinned to CPU %d runs there",
	   last_cpu);
	is(percpuref_set_library_cpus(first_list), 0, "choose CPU %d", first_cpu);
	ok(affinity_is(cb, first_cpu), "the pinned-by-inheritance thread moved");
	is(percpuref_set_library_cpus(NULL), 0, "back to the default");
	ok(affinity_is(cb, last_cpu), "back to what it inherited: CPU %d", last_cpu);
	percpuref_shutdown();
}

static void start_both(void *arg)
{
	pid_t *tids = arg;

	tids[0] = start_callback_thread();
	tids[1] = start_reclaimer();
}

/* A choice no thread was running to check: each start that cannot take
 * it runs where it started; one warning until the next choice. */
static void test_unusable_choice_at_start(void)
{
	char out[2048];
	pid_t tids[2];
	unsigned long before;
	const char *hit;
	int lines = 0;

	percpuref_shutdown();
	is(percpuref_set_library_cpus("8191"), 0, "CPU 8191 chosen while no thread runs");
	before = percpuref_warning_count();
	capture_stderr(start_both, tids, out, sizeof(out));
	for (hit = out; (hit = strstr(hit, "cannot run on the CPUs chosen")); hit++)
		lines++;
	is(lines, 1, "one warning for the two starts");
	/* No call of the API to name: "percpuref: percpuref: ..." up to 0.4.26. */
	ok(strstr(out, "percpuref: a library thread cannot run") && !strstr(out, "percpuref: percpuref"),
	   "prefixed once, naming no call");
	is(percpuref_warning_count() - before, 1, "counted once");
	if (lines != 1)
		printf("# stderr: %s", out);
	ok(affinity_becomes(tids[0], -1) && affinity_becomes(tids[1], -1),
	   "both threads run where they started");
	is(percpuref_set_library_cpus(NULL), 0, "back to the default");
	percpuref_shutdown();
}

/*
 * A fork child's set reaches none of the parent's threads: their ids are
 * not the child's, yet sched_setaffinity() on them would succeed.  The
 * child's own callback thread takes its choice.  Exit status: 0, or 2
 * (set refused), 3 (its thread did not move).
 */
static int child_sets(void)
{
	pid_t cb;

	if (percpuref_set_library_cpus(first_list))
		return 2;
	cb = start_callback_thread();
	return affinity_becomes(cb, first_cpu) ? 0 : 3;
}

static void test_fork_child(void)
{
	const char *why = fork_children_untestable();
	pid_t cb, pid;

	if (why) {
		skip("%s", why);
		return;
	}
	is(percpuref_set_library_cpus(last_list), 0, "parent: CPU %d", last_cpu);
	cb = start_callback_thread();
	ok(affinity_becomes(cb, last_cpu), "parent's callback thread on CPU %d", last_cpu);
	pid = fork();
	if (pid == 0)
		_exit(child_sets());
	is(wait_child(pid), 0, "child chose CPU %d; its own callback thread moved there",
	   first_cpu);
	ok(affinity_is(cb, last_cpu), "the parent's callback thread stayed on CPU %d", last_cpu);
	is(percpuref_set_library_cpus(NULL), 0, "back to the default");
	percpuref_shutdown();
}

#if defined(__x86_64__)
#define FILTER_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define FILTER_ARCH AUDIT_ARCH_AARCH64
#endif

#ifdef FILTER_ARCH
/* A seccomp filter on this thread only: sched_setaffinity(@tid, ...)
 * fails with EPERM, on any other thread id it passes.  0, or -1. */
static int refuse_setaffinity_of(pid_t tid)
{
	struct sock_filter filter[] = {
		FILTER_MATCH_CALL(FILTER_ARCH, __NR_sched_setaffinity, 3),
		/* The low half of the first argument (little-endian). */
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned int)tid, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};

	return install_filter(filter, sizeof(filter) / sizeof(filter[0]), 0);
}

/*
 * Child of test_all_or_nothing(): the kernel moves the callback thread
 * (listed first) and refuses to move the reclaimer.  The only check of
 * the rollback: CPU 8191, elsewhere in this file, is refused for every
 * thread alike.  0 when the call
 * failed with -EPERM and the callback thread is back where it was; 2: no
 * filter or no threads; 3: another return; 4: the callback thread moved.
 */
static int partial_child(void)
{
	pid_t tids[2];
	int ret;

	start_both(tids);
	if (!tids[0] || !tids[1] || !affinity_becomes(tids[1], -1) ||
	    refuse_setaffinity_of(tids[1]))
		return 2;
	ret = percpuref_set_library_cpus(first_list);
	if (ret != -EPERM) {
		fprintf(stderr, "# returned %d\n", ret);
		return 3;
	}
	return affinity_is(tids[0], -1) && affinity_is(tids[1], -1) ? 0 : 4;
}
#endif

static void test_all_or_nothing(void)
{
#ifdef FILTER_ARCH
	const char *emulator = getenv("PERCPUREF_TEST_EMULATOR");

	if (emulator && *emulator) {
		skip("qemu-user: the filter would bind the emulator's own calls");
		return;
	}
	is(run_mode("--partial"), 0,
	   "the kernel refuses the second thread: -EPERM, the first moved back");
#else
	skip("the seccomp filter is written for x86_64 and aarch64");
#endif
}

/* Child of test_environment(): 0 when the callback thread runs on the
 * CPU $WANT_CPU names (-1: where it started), with $WANT_WARNING's text on
 * stderr if set; 2: no thread; 3: elsewhere; 4: warning missing. */
static int environment_child(void)
{
	const char *want_warning = getenv("WANT_WARNING");
	int want = atoi(getenv("WANT_CPU") ? getenv("WANT_CPU") : "-1");
	char out[2048];
	pid_t tids[2];

	capture_stderr(start_both, tids, out, sizeof(out));
	if (!tids[0])
		return 2;
	if (want_warning && !strstr(out, want_warning)) {
		fprintf(stderr, "# stderr: %s", out);
		return 4;
	}
	return affinity_becomes(tids[0], want) ? 0 : 3;
}

static int run_environment_child(const char *value, int want, const char *warning)
{
	char want_text[16];
	int status;

	snprintf(want_text, sizeof(want_text), "%d", want);
	setenv("PERCPUREF_LIBRARY_CPUS", value, 1);
	setenv("WANT_CPU", want_text, 1);
	if (warning)
		setenv("WANT_WARNING", warning, 1);
	status = run_mode("--environment");
	unsetenv("PERCPUREF_LIBRARY_CPUS");
	unsetenv("WANT_CPU");
	unsetenv("WANT_WARNING");
	return status;
}

static void test_environment(void)
{
	is(run_environment_child(last_list, last_cpu, NULL), 0,
	   "PERCPUREF_LIBRARY_CPUS=%d: the callback thread runs there", last_cpu);
	is(run_environment_child("zz", -1, "PERCPUREF_LIBRARY_CPUS=\"zz\" is not a list"), 0,
	   "PERCPUREF_LIBRARY_CPUS=zz: warned, ignored");
	is(run_environment_child("", -1, NULL), 0, "PERCPUREF_LIBRARY_CPUS empty: as if unset");
}

/*
 * Sets back and forth while the library's threads start and end (a
 * shutdown stops them, the next kill starts one): each set must reach
 * only live library threads (the wrapper above counts the others).
 */
static int churn_stop;	/* atomic: relaxed, a flag; the join orders the rest */

static void *setter(void *arg)
{
	unsigned long *sets = arg;

	while (!__atomic_load_n(&churn_stop, __ATOMIC_RELAXED)) {
		if (percpuref_set_library_cpus(*sets & 1 ? first_list : last_list) == 0)
			++*sets;
		if (percpuref_set_library_cpus(NULL) == 0)
			++*sets;
	}
	return NULL;
}

static void test_churn(void)
{
	double seconds = UNDER_VALGRIND ? 0.5 : 1.5;
	uint64_t end = now_ns() + (uint64_t)(seconds * 1e9);
	unsigned long sets = 0, starts = 0;
	unsigned int listed_after_shutdown = 0;
	pthread_t set_thread;

	__atomic_store_n(&churn_stop, 0, __ATOMIC_RELAXED);
	if (pthread_create(&set_thread, NULL, setter, &sets)) {
		ok(0, "setting thread started");
		return;
	}
	while (now_ns() < end) {
		if (start_callback_thread())
			starts++;
		percpuref_shutdown();
		/* The setter's calls list nobody; a shutdown joined the rest. */
		listed_after_shutdown |= percpuref_test_library_threads_listed();
	}
	__atomic_store_n(&churn_stop, 1, __ATOMIC_RELAXED);
	pthread_join(set_thread, NULL);
	printf("# %lu sets, %lu callback thread starts\n", sets, starts);
	ok(sets > 0 && starts > 0, "sets and starts both ran");
	is(listed_after_shutdown, 0, "no library thread listed after any of the shutdowns");
	is(percpuref_set_library_cpus(NULL), 0, "back to the default");
}

int main(int argc, char **argv)
{
	if (sched_getaffinity(0, sizeof(process_cpus), &process_cpus)) {
		ok(0, "sched_getaffinity: %s", strerror(errno));
		return done_testing();
	}
	first_cpu = -1;
	for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
		if (CPU_ISSET(cpu, &process_cpus)) {
			if (first_cpu < 0)
				first_cpu = cpu;
			last_cpu = cpu;
		}
	snprintf(first_list, sizeof(first_list), "%d", first_cpu);
	snprintf(last_list, sizeof(last_list), "%d", last_cpu);
	if (argc > 1 && !strcmp(argv[1], "--environment"))
		return environment_child();
#ifdef FILTER_ARCH
	if (argc > 1 && !strcmp(argv[1], "--partial"))
		return partial_child();
#endif

	test_bad_lists();
	if (first_cpu == last_cpu) {
		skip("this process may use one CPU: no choice moves a thread");
	} else {
		test_choices();
		test_default_inherits();
		test_unusable_choice_at_start();
		test_fork_child();
		test_started_by_library_thread();
		test_environment();
		test_all_or_nothing();
	}
	test_churn();
	ok(__atomic_load_n(&ids_moved, __ATOMIC_RELAXED) > 0,
	   "the library's moves went through the wrapper (%d)",
	   __atomic_load_n(&ids_moved, __ATOMIC_RELAXED));
	is(__atomic_load_n(&strangers_moved, __ATOMIC_RELAXED), 0,
	   "every thread id a set reached was a live library thread's");
	return done_testing();
}
