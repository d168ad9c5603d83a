/* SPDX-License-Identifier: MIT */
/*
 * test_fast_path.c - the three per-CPU fast paths and the per-thread state
 * behind them: which path the process took (PERCPUREF_EXPECT_FAST_PATH, set
 * by the test variants), own rseq areas and fallback readers registered on
 * a thread's first call and given back when it exits by return,
 * pthread_exit or cancellation (the library's own area unregistered then,
 * so that a later key destructor registers one), every fallback unit
 * claimable, a fork child that keeps its thread's registration, and
 * counts that stay exact while a signal handler takes and
 * drops references in the middle of the thread's own calls.  And a program
 * that registered an rseq area of its own (librseq, tcmalloc) before the
 * library's first use, where glibc registered none: the library's probe
 * fails (EINVAL), it takes the fallback, exact, and says so once (it
 * said nothing: the program lost the fast path without knowing why); and
 * one that registers its own after the library abandoned its area
 * (membarrier refused).  A fork from a thread that never used the library,
 * beside one that did: the child keeps none of the other threads'
 * registrations or counter caches.  The nomembarrier_ variants check that
 * their readers are the ones for a refused membarrier.
 */
#define _GNU_SOURCE
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "fallback.h"
#include "child.h"
#include "registrations.h"
#include "sandbox.h"
#include "signaller.h"
#include "tap.h"

#define NR_THREADS 6
#define PAIRS 10000

static struct percpu_ref ref;
static int releases;

static void count_release(struct percpu_ref *r)
{
	(void)r;
	__atomic_fetch_add(&releases, 1, __ATOMIC_RELAXED);
}

static void pairs(void)
{
	for (int i = 0; i < PAIRS; i++) {
		percpu_ref_get(&ref);
		percpu_ref_put(&ref);
	}
}

static void test_which_path(void)
{
	const char *want = getenv("PERCPUREF_EXPECT_FAST_PATH");
	const char *no_membarrier = getenv("PERCPUREF_NO_MEMBARRIER");
	/* As the library reads it: any value but empty or 0. */
	bool membarrier_refused_by_env = no_membarrier && *no_membarrier &&
					 strcmp(no_membarrier, "0");
	/* The program's first library call: it sets the library up itself,
	 * or it named a process not yet set up ("none"). */
	const char *fences = percpuref_fence_method();
	const char *path = percpuref_fast_path();

	printf("# fast path: %s\n", path);
	ok(!strcmp(path, "rseq-glibc") || !strcmp(path, "rseq-own") || !strcmp(path, "fallback"),
	   "percpuref_fast_path() names a known path");
	if (want && *want)
		ok(!strcmp(path, want), "fast path is %s as the variant expects (got %s)", want, path);
	/* The nomembarrier_ variants: their readers are the sequentially
	 * consistent ones, or those variants test the membarrier ones again. */
	if (!strcmp(path, "fallback") && membarrier_refused_by_env)
		/* Relaxed: set by the setup, before the first counter. */
		ok(__atomic_load_n(&percpuref_readers_fence_needed, __ATOMIC_RELAXED),
		   "PERCPUREF_NO_MEMBARRIER: the readers act as if membarrier were refused");
	/* An rseq path started with membarrier registered; the fallback
	 * fences with it unless refused (PERCPUREF_NO_MEMBARRIER, or a kernel
	 * without PRIVATE_EXPEDITED): then its readers fence themselves. */
	int cmds = (int)syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0);
	bool refused = membarrier_refused_by_env || cmds < 0 ||
		       !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED);
	const char *want_fences = strcmp(path, "fallback") || !refused ? "membarrier"
								       : "reader-fences";

	ok(!strcmp(fences, want_fences), "percpuref_fence_method() is %s on the %s path here "
	   "(got %s)", want_fences, path, fences);
}

enum exit_how { BY_RETURN, BY_PTHREAD_EXIT, BY_CANCEL };

/* counted: every thread made its calls; go: the main thread counted the
 * registrations, the threads may exit. */
/*
 * The area the header finds from the thread pointer (percpuref_this_rseq_area())
 * is this thread's registered one: the CPU it holds is the kernel's, read
 * between two sched_getcpu() calls that agree (no migration between).  The
 * header reads the thread pointer itself, so this runs it as compiled by
 * whatever built the test (clang up to 13 could not compile it: the
 * clang13_ variants).  NULL exactly on the fallback.
 */
/* The CPU in @area, read between two sched_getcpu() calls that agree. */
static void check_area_cpu(const struct percpuref_rseq_area *area)
{
	for (int tries = 0; tries < 1000; tries++) {
		int before = sched_getcpu();
		/* Relaxed: the kernel writes it on this thread's behalf. */
		uint32_t cpu = __atomic_load_n(&area->cpu_id, __ATOMIC_RELAXED);

		if (before >= 0 && sched_getcpu() == before) {
			is(cpu, before, "the area at the thread pointer holds the thread's CPU");
			return;
		}
	}
	ok(0, "sched_getcpu() read the same CPU twice in a row");
}

static void test_this_rseq_area(void)
{
	const char *path = percpuref_fast_path();
	struct percpuref_rseq_area *area;

	releases = 0;
	percpu_ref_init(&ref, count_release, 0);
	pairs();	/* registers this thread's own area under rseq-own */
	area = percpuref_this_rseq_area();
	if (!strcmp(path, "fallback"))
		ok(!area, "no rseq area on the fallback");
	else if (ok(area != NULL, "an rseq area on the %s path", path))
		check_area_cpu(area);
	percpu_ref_kill(&ref);
	percpu_ref_barrier();
	is(releases, 1, "the area's ref released once");
	percpu_ref_exit(&ref);
}

static pthread_barrier_t counted, go;

static void *user(void *arg)
{
	enum exit_how how = (enum exit_how)(long)arg;

	pairs();
	percpu_ref_get(&ref);	/* kept: the main thread drops them */
	pthread_barrier_wait(&counted);
	pthread_barrier_wait(&go);
	if (how == BY_PTHREAD_EXIT)
		pthread_exit(NULL);
	if (how == BY_CANCEL)
		for (;;)
			pause();	/* a cancellation point */
	return NULL;
}

/*
 * Each way out of a thread runs the exit hooks: the registrations the
 * threads made are all given back, and the counts they left are exact.
 */
static void test_thread_exit(enum exit_how how, const char *name)
{
	pthread_t t[NR_THREADS];
	unsigned int before, during;
	int i;

	releases = 0;
	percpu_ref_init(&ref, count_release, 0);
	pairs();	/* the main thread registers first, as it would */
	before = registered_threads();
	pthread_barrier_init(&counted, NULL, NR_THREADS + 1);
	pthread_barrier_init(&go, NULL, NR_THREADS + 1);
	for (i = 0; i < NR_THREADS; i++)
		pthread_create(&t[i], NULL, user, (void *)(long)how);
	pthread_barrier_wait(&counted);
	during = registered_threads();
	pthread_barrier_wait(&go);
	for (i = 0; i < NR_THREADS; i++) {
		if (how == BY_CANCEL)
			pthread_cancel(t[i]);
		pthread_join(t[i], NULL);
	}
	pthread_barrier_destroy(&counted);
	pthread_barrier_destroy(&go);
	if (strcmp(percpuref_fast_path(), "rseq-glibc"))
		ok(during > before, "%s: the threads registered (%u, then %u)", name, before,
		   during);
	is(registered_threads(), before, "%s: every registration given back", name);
	percpu_ref_put_many(&ref, NR_THREADS);
	percpu_ref_kill(&ref);
	percpu_ref_barrier();
	is(releases, 1, "%s: count exact, released once", name);
	percpu_ref_exit(&ref);
}

/*
 * On the fallback path every unit can be claimed: as many threads as
 * units, each registered at once, hold one each, and one more holds none
 * (it counts without one).  A unit no claim reached cost a thread its
 * unit, for nothing.
 */
static pthread_barrier_t units_claimed, units_go;

static void *unit_holder(void *arg)
{
	(void)arg;
	pairs();
	pthread_barrier_wait(&units_claimed);
	pthread_barrier_wait(&units_go);
	return NULL;
}

static void test_every_unit_claimable(void)
{
	unsigned int units = percpuref_nr_units(), before, holding, i, extra;
	pthread_t *t;

	if (strcmp(percpuref_fast_path(), "fallback")) {
		skip("every unit claimable: no units on %s", percpuref_fast_path());
		return;
	}
	releases = 0;
	percpu_ref_init(&ref, count_release, 0);
	pairs();		/* this thread holds one */
	before = registered_threads();
	extra = units - before + 1;
	t = calloc(extra, sizeof(*t));
	pthread_barrier_init(&units_claimed, NULL, extra + 1);
	pthread_barrier_init(&units_go, NULL, extra + 1);
	for (i = 0; i < extra; i++)
		pthread_create(&t[i], NULL, unit_holder, NULL);
	pthread_barrier_wait(&units_claimed);
	holding = registered_threads();
	pthread_barrier_wait(&units_go);
	for (i = 0; i < extra; i++)
		pthread_join(t[i], NULL);
	pthread_barrier_destroy(&units_claimed);
	pthread_barrier_destroy(&units_go);
	free(t);
	is(holding, units, "every one of the %u units claimable, and no more", units);
	percpu_ref_kill(&ref);
	percpu_ref_barrier();
	is(releases, 1, "every unit held: count exact, released once");
	percpu_ref_exit(&ref);
}

#if PERCPUREF_HAVE_RSEQ
/* rseq(2) on @area for this thread: flags 0 registers, 1 unregisters
 * (RSEQ_FLAG_UNREGISTER); 0 or -1 (errno). */
static long rseq_call(struct percpuref_rseq_area *area, int flags)
{
	return syscall(__NR_rseq, area, (unsigned int)sizeof(*area), flags, PERCPUREF_RSEQ_SIG);
}

/*
 * The library's own area is unregistered when its thread exits, not just
 * uncounted: a key destructor of the program's, which runs after the
 * library's exit hook, registers an area (librseq's does, in a thread's
 * last destructors).  0 there, or the errno of the refusal.
 */
static struct percpuref_rseq_area after_exit_area;
static pthread_key_t after_exit_key;
static int after_exit_err = -1;

static void register_after_exit(void *arg)
{
	(void)arg;
	after_exit_err = rseq_call(&after_exit_area, 0) ? errno : 0;
	if (!after_exit_err)
		rseq_call(&after_exit_area, 1);
}

static void *user_then_key(void *arg)
{
	(void)arg;
	pairs();	/* registers the library's area */
	pthread_setspecific(after_exit_key, &after_exit_key);
	return NULL;
}

static void test_area_gone_at_exit(void)
{
	pthread_t t;

	if (strcmp(percpuref_fast_path(), "rseq-own")) {
		skip("the library's area at thread exit: the fast path is %s",
		     percpuref_fast_path());
		return;
	}
	percpu_ref_init(&ref, count_release, 0);
	pthread_key_create(&after_exit_key, register_after_exit);
	pthread_create(&t, NULL, user_then_key, NULL);
	pthread_join(t, NULL);
	pthread_key_delete(after_exit_key);
	is(after_exit_err, 0, "the library's own rseq area is unregistered at thread exit: "
			      "a later key destructor registers one (errno %d)", after_exit_err);
	percpu_ref_kill(&ref);
	percpu_ref_barrier();
	percpu_ref_exit(&ref);
}
#endif

static pthread_key_t late_key;

static void late_user(void *arg)
{
	(void)arg;
	pairs();	/* the thread's first call */
}

static void *arm_late_user(void *arg)
{
	(void)arg;
	pthread_setspecific(late_key, &late_key);
	return NULL;
}

/*
 * A thread whose first call comes from a pthread key destructor, after
 * glibc ran the thread's TLS destructors (__cxa_thread_atexit_impl's list,
 * which it runs once): its registration was never given back, so the
 * fallback's units ran out for good, and the next fence read the exited
 * thread's TLS (a crash once the stack was unmapped).
 */
static void test_first_call_in_key_destructor(void)
{
	pthread_t t[NR_THREADS];
	unsigned int before;
	int i;

	releases = 0;
	percpu_ref_init(&ref, count_release, 0);
	pairs();
	before = registered_threads();
	pthread_key_create(&late_key, late_user);
	for (i = 0; i < NR_THREADS; i++)
		pthread_create(&t[i], NULL, arm_late_user, NULL);
	for (i = 0; i < NR_THREADS; i++)
		pthread_join(t[i], NULL);
	pthread_key_delete(late_key);
	is(registered_threads(), before,
	   "first call in a key destructor: every registration given back");
	percpu_ref_kill(&ref);
	percpu_ref_barrier();
	is(releases, 1, "first call in a key destructor: count exact, released once");
	percpu_ref_exit(&ref);
}

#ifndef __SANITIZE_THREAD__	/* TSan refuses threads in a threaded parent's child */
static void *child_user(void *arg)
{
	(void)arg;
	pairs();
	return NULL;
}

/* The forking thread keeps its registration in the child; new threads of
 * the child register and give back as in the parent. */
static void test_fork(void)
{
	unsigned int parent_registered;
	int status = -1;
	pid_t pid;

	releases = 0;
	percpu_ref_init(&ref, count_release, 0);
	pairs();
	parent_registered = registered_threads();
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		const char *path = percpuref_fast_path();
		pthread_t t;

		child_deadline(20);	/* a hang fails the test, and says where */
		if (registered_threads() != (strcmp(path, "rseq-glibc") ? 1u : 0u))
			_exit(3);
		pairs();
		pthread_create(&t, NULL, child_user, NULL);
		pthread_join(t, NULL);
		if (registered_threads() != (strcmp(path, "rseq-glibc") ? 1u : 0u))
			_exit(4);
		percpu_ref_kill(&ref);
		if (percpu_ref_barrier() != 0)
			_exit(2);
		_exit(releases == 1 ? 0 : 1);
	}
	waitpid(pid, &status, 0);
	ok(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	   "fork child keeps its registration, counts exactly (status %d)", status);
	is(registered_threads(), parent_registered, "parent's registrations untouched");
	percpu_ref_kill(&ref);
	percpu_ref_barrier();
	is(releases, 1, "parent releases its own copy");
	percpu_ref_exit(&ref);
}
#endif

/*
 * A signal handler that takes references in the middle of the thread's own
 * get and put (nesting on the fallback reader's section, a restart on
 * rseq): one kept per signal, so a lost or doubled add shows in the count.
 * The signals are sent to the main thread alone (pthread_kill), from a
 * helper thread, so every handler runs there.
 */
static volatile sig_atomic_t handled;

static void on_signal(int sig)
{
	(void)sig;
	percpu_ref_get(&ref);
	percpu_ref_get(&ref);
	percpu_ref_put(&ref);
	handled++;
}

static void test_signal_nesting(void)
{
	struct signaller signaller;
	struct sigaction sa;
	struct timespec start, now;

	releases = 0;
	percpu_ref_init(&ref, count_release, 0);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGUSR1, &sa, NULL);
	handled = 0;
	signaller_start(&signaller, 100000);
	/* Until 200 handlers ran, for 10 s at most: 2000 rounds (60 ms) could
	 * end before a loaded machine first ran the new signaller thread. */
	clock_gettime(CLOCK_MONOTONIC, &start);
	do {
		pairs();
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while (handled < 200 && now.tv_sec - start.tv_sec < 10);
	signaller_stop(&signaller);
	ok(handled > 0, "signal handlers ran during get/put (%d)", (int)handled);
	percpu_ref_put_many(&ref, (unsigned long)handled);
	percpu_ref_kill(&ref);
	percpu_ref_barrier();
	is(releases, 1, "count exact after %d handlers, released once", (int)handled);
	percpu_ref_exit(&ref);
	signal(SIGUSR1, SIG_IGN);	/* none is pending: the sender has stopped */
}

#if PERCPUREF_HAVE_RSEQ
/* An area of the program's own, as librseq registers. */
static struct percpuref_rseq_area foreign_area;

/* The children's last step: pairs on ref, its kill: released once? */
static bool pairs_released_once(void)
{
	pairs();
	percpu_ref_kill(&ref);
	percpu_ref_barrier();
	if (releases != 1)
		return false;
	percpu_ref_exit(&ref);
	return true;
}

/* Runs the child @mode with glibc's rseq registration off, so that the
 * library registers areas of its own: its status is the verdict on
 * @what, 77 a skip for @why_not. */
static void child_without_glibc_rseq(const char *mode, const char *what, const char *why_not)
{
	char tunable[] = "GLIBC_TUNABLES=glibc.pthread.rseq=0";
	char *envp[] = { tunable, NULL };
	int status;

	if (getenv("PERCPUREF_TEST_EMULATOR")) {
		skip("%s: qemu-user has no rseq", what);
		return;
	}
	status = run_mode_env(mode, envp);
	if (status == 77)
		skip("%s: %s", what, why_not);
	else
		is(status, 0, "%s", what);
}

/*
 * Child, started with glibc's registration off: registers foreign_area,
 * then uses the library.  Exit status: 0; 77 this kernel or glibc left no
 * room for the area (skip); 2 not the fallback; 3 not one warning; 4 the
 * count or release wrong.
 */
static int foreign_area_child(void)
{
	unsigned long warned = percpuref_warning_count();

	if (rseq_call(&foreign_area, 0) != 0)
		return 77;
	releases = 0;
	percpu_ref_init(&ref, count_release, 0);
	if (strcmp(percpuref_fast_path(), "fallback"))
		return 2;
	if (percpuref_warning_count() - warned != 1)
		return 3;
	return pairs_released_once() ? 0 : 4;
}

/*
 * Child, started with glibc's registration off and membarrier refused:
 * the library registers an area of its own, finds it cannot fence rseq
 * sections, and takes the fallback; the area it abandons is unregistered,
 * so the program registers one of its own (librseq, tcmalloc) on that
 * thread.  Exit status: 0; 77 no area can be registered here at all (a
 * kernel or sandbox without rseq: probed first), or no filter could be
 * installed (skip); 2 not the fallback; 3 an own-area thread still
 * counted; 4 the program's registration refused (the library's area left
 * registered); 5 the count or release wrong.
 */
static int abandoned_area_child(void)
{
	if (rseq_call(&foreign_area, 0) != 0 || rseq_call(&foreign_area, 1) != 0)
		return 77;
	if (refuse_membarrier())
		return 77;
	releases = 0;
	percpu_ref_init(&ref, count_release, 0);
	if (strcmp(percpuref_fast_path(), "fallback"))
		return 2;
	if (percpuref_rseq_own_threads() != 0)
		return 3;
	if (rseq_call(&foreign_area, 0) != 0)
		return 4;
	return pairs_released_once() ? 0 : 5;
}
#endif

/*
 * A fork from a thread that never used the library, while another thread
 * has a counter cache, a registration and a section that may be open:
 * the child, that one thread, has no registration of the parent's (its
 * units and own-rseq count are the parent's threads'), walks a registry
 * of counter caches that holds none of theirs (the others are freed in
 * it: a registry kept as it was sent percpuref_get_counter_stats() round
 * freed caches, for ever), and counts and fences exactly.
 */
static bool fork_beside_stop;
static pthread_barrier_t fork_beside_started;

static void *fork_beside_user(void *arg)
{
	struct percpu_ref own;

	(void)arg;
	for (int i = 0; i < 3; i++) {	/* a counter cache of its own */
		percpu_ref_init(&own, NULL, 0);
		percpu_ref_exit(&own);
	}
	pairs();			/* registered */
	pthread_barrier_wait(&fork_beside_started);
	/* Relaxed: a flag the main thread sets once. */
	while (!__atomic_load_n(&fork_beside_stop, __ATOMIC_RELAXED))
		pairs();
	return NULL;
}

static void fork_beside_child(void)
{
	struct percpuref_counter_stats before, during, after;
	struct percpu_ref mine;

	child_deadline(20);	/* a hang fails the test, and says where */
	if (registered_threads() != 0)
		_exit(3);
	percpuref_get_counter_stats(&before);
	releases = 0;
	if (percpu_ref_init(&mine, count_release, 0) != 0)
		_exit(4);
	percpuref_get_counter_stats(&during);
	for (int i = 0; i < PAIRS; i++) {
		percpu_ref_get(&mine);
		percpu_ref_put(&mine);
	}
	percpu_ref_switch_to_atomic_sync(&mine);	/* a reader fence */
	percpu_ref_kill(&mine);
	if (percpu_ref_barrier() != 0 || releases != 1)
		_exit(5);
	percpu_ref_exit(&mine);
	percpuref_get_counter_stats(&after);
	if (during.in_use != before.in_use + 1 || after.in_use != before.in_use)
		_exit(6);
	_exit(0);
}

static void *fork_beside_forker(void *arg)
{
	int *status = arg;
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid == 0)
		fork_beside_child();
	waitpid(pid, status, 0);
	return NULL;
}

static void test_fork_beside_users(void)
{
	const char *why = fork_children_untestable();
	pthread_t user, forker;
	int status = -1;

	if (why) {
		skip("fork beside other users: %s", why);
		return;
	}
	releases = 0;
	percpu_ref_init(&ref, count_release, 0);
	pthread_barrier_init(&fork_beside_started, NULL, 2);
	pthread_create(&user, NULL, fork_beside_user, NULL);
	pthread_barrier_wait(&fork_beside_started);
	pthread_create(&forker, NULL, fork_beside_forker, &status);
	pthread_join(forker, NULL);
	__atomic_store_n(&fork_beside_stop, true, __ATOMIC_RELAXED);
	pthread_join(user, NULL);
	pthread_barrier_destroy(&fork_beside_started);
	ok(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	   "fork from a thread that never used the library, beside one that did: "
	   "no registration of the parent's, counter caches and counts exact (status %d)",
	   status);
	percpu_ref_kill(&ref);
	percpu_ref_barrier();
	is(releases, 1, "fork beside other users: the parent's count exact");
	percpu_ref_exit(&ref);
}

int main(int argc, char **argv)
{
#if PERCPUREF_HAVE_RSEQ
	if (argc > 1 && !strcmp(argv[1], "--foreign-area"))
		return foreign_area_child();
	if (argc > 1 && !strcmp(argv[1], "--abandoned-area"))
		return abandoned_area_child();
#endif
	(void)argc;
	(void)argv;
	test_which_path();
	test_this_rseq_area();
	test_thread_exit(BY_RETURN, "return");
	test_thread_exit(BY_PTHREAD_EXIT, "pthread_exit");
	test_thread_exit(BY_CANCEL, "cancellation");
	test_first_call_in_key_destructor();
	test_every_unit_claimable();
#if PERCPUREF_HAVE_RSEQ
	test_area_gone_at_exit();
#endif
#ifndef __SANITIZE_THREAD__
	test_fork();
#endif
	test_fork_beside_users();
	test_signal_nesting();
#if PERCPUREF_HAVE_RSEQ
	child_without_glibc_rseq("--foreign-area",
				 "an rseq area of the program's own: the fallback, exact, warned once",
				 "no rseq area could be registered in the child");
	child_without_glibc_rseq("--abandoned-area",
				 "an rseq area the library abandons (membarrier refused) is "
				 "unregistered: the program registers its own",
				 "no rseq area, or no seccomp filter, in the child");
#endif
	return done_testing();
}
