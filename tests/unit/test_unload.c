/* SPDX-License-Identifier: MIT */
/*
 * Unloading code that ran the inline fast paths: each get and put leaves
 * its thread's rseq area pointing at a descriptor in the object it was
 * inlined into, and the kernel reads that pointer at the thread's next
 * preemption or signal.  Once the object is unloaded, a thread still
 * pointing there dies by SIGSEGV.  Each scenario loads tests/plugin's
 * object, runs its fast paths on one thread (this one, a worker that then
 * blocks, or each of the library's threads through a callback), unloads
 * it and makes that thread enter the kernel again, in a child process: the
 * child must exit 0.  Without percpuref_prepare_unload() on the user's
 * threads, or without the library's own call after each callback it runs,
 * the child dies.  Skipped without an rseq fast path.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "child.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_rcuref.h"
#include "tap.h"
#include "thread_names.h"

struct plugin {
	void *handle;
	void (*touch)(struct percpu_ref *ref);
	void (*set_touched)(struct percpu_ref *ref);
	percpu_ref_func_t *release;
	percpu_rcuref_func_t *rcu_release;
	int (*calls)(void);
};

/* Exit statuses of a child that could not run its scenario. */
enum {
	SETUP_FAILED = 2,
	NOT_UNLOADED = 3,
	CALLBACK_MISSING = 4,
	NO_POINTER = 5,		/* the fast path left nothing to clear */
	NOT_CLEARED = 6,
	KEY_LEFT = 7,		/* an unloaded copy's pthread key */
};

static struct plugin plugin;

static void *plugin_symbol(const char *name)
{
	void *sym = dlsym(plugin.handle, name);

	if (!sym) {
		fprintf(stderr, "# %s: %s\n", name, dlerror());
		exit(SETUP_FAILED);
	}
	return sym;
}

static void load_plugin(void)
{
	plugin.handle = dlopen(UNLOAD_PLUGIN, RTLD_NOW | RTLD_LOCAL);
	if (!plugin.handle) {
		fprintf(stderr, "# dlopen: %s\n", dlerror());
		exit(SETUP_FAILED);
	}
	plugin.touch = (void (*)(struct percpu_ref *))plugin_symbol("plugin_touch");
	plugin.set_touched = (void (*)(struct percpu_ref *))plugin_symbol("plugin_set_touched");
	plugin.release = (percpu_ref_func_t *)plugin_symbol("plugin_release");
	plugin.rcu_release = (percpu_rcuref_func_t *)plugin_symbol("plugin_rcu_release");
	plugin.calls = (int (*)(void))plugin_symbol("plugin_calls");
}

/* Unmaps the plugin: a scenario whose object stayed mapped proves nothing. */
static void unload_plugin(void)
{
	void *again;

	if (dlclose(plugin.handle)) {
		fprintf(stderr, "# dlclose: %s\n", dlerror());
		exit(SETUP_FAILED);
	}
	again = dlopen(UNLOAD_PLUGIN, RTLD_NOW | RTLD_NOLOAD);
	if (again) {
		fprintf(stderr, "# the plugin is still loaded\n");
		exit(NOT_UNLOADED);
	}
}

static void nothing(struct percpu_ref *ref)
{
	(void)ref;
}

static void rcu_nothing(struct percpu_rcuref *ref)
{
	(void)ref;
}

static void on_signal(int sig)
{
	(void)sig;
}

/* Enters the kernel in each way that makes it read this thread's area. */
static void preempt_self(void)
{
	struct timespec ms = { 0, 1000000 };

	signal(SIGUSR1, on_signal);
	raise(SIGUSR1);
	sched_yield();
	nanosleep(&ms, NULL);
}

static void init_or_die(struct percpu_ref *ref, percpu_ref_func_t *release, unsigned int flags)
{
	if (percpu_ref_init(ref, release, flags))
		exit(SETUP_FAILED);
}

/* Loads the plugin, whose callbacks will get and put @touched (a new
 * per-CPU ref). */
static void load_plugin_touching(struct percpu_ref *touched)
{
	init_or_die(touched, nothing, 0);
	load_plugin();
	plugin.set_touched(touched);
}

/* Kills @ref and frees it once released: 0, or the barrier's error. */
static int kill_and_exit(struct percpu_ref *ref)
{
	int ret;

	percpu_ref_kill(ref);
	ret = percpu_ref_barrier();
	percpu_ref_exit(ref);
	return ret;
}

/* True when this thread's rseq area points into the plugin's object. */
static bool points_into_plugin(void)
{
	struct percpuref_rseq_area *area = percpuref_this_rseq_area();
	Dl_info info;

	return area && area->rseq_cs &&
	       dladdr((void *)(uintptr_t)area->rseq_cs, &info) &&
	       info.dli_fname && !strcmp(info.dli_fname, UNLOAD_PLUGIN);
}

/* Touches @ref through the plugin until the pointer is left there: the
 * kernel clears it itself when it preempts this thread between the touch
 * and the look (a loaded machine does, now and then). */
static bool touch_leaving_pointer(struct percpu_ref *ref)
{
	int tries;

	for (tries = 0; tries < 1000; tries++) {
		plugin.touch(ref);
		if (points_into_plugin())
			return true;
	}
	return false;
}

/* This thread ran the plugin's fast path, then unloads it.  Checks the
 * premise of every scenario too: the fast path left the pointer in the
 * plugin, and the call took it back.  A premise that fails frees @ref all
 * the same, so that its status, not the leak checker's, is the exit's. */
static int scenario_main(void)
{
	struct percpu_ref ref;
	int premise = 0;

	init_or_die(&ref, nothing, 0);
	load_plugin();
	if (touch_leaving_pointer(&ref)) {
		percpuref_prepare_unload();
		if (percpuref_this_rseq_area()->rseq_cs != 0)
			premise = NOT_CLEARED;
	} else {
		premise = NO_POINTER;
	}
	if (premise) {
		kill_and_exit(&ref);
		return premise;
	}
	unload_plugin();
	preempt_self();
	return kill_and_exit(&ref);
}

static int wake_pipe[2];
static pid_t worker_tid;	/* atomic: set once the worker cleared */

/* Runs the fast path, then sleeps in the kernel across the unload.
 * Nothing between the two wakes another thread: that could get this one
 * preempted, and the kernel would clear the pointer itself. */
static void *blocked_worker(void *arg)
{
	char c = 0;

	plugin.touch(arg);
	percpuref_prepare_unload();
	__atomic_store_n(&worker_tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
	if (read(wake_pipe[0], &c, 1) != 1)
		return (void *)1;
	return NULL;
}

static int scenario_blocked(void)
{
	struct percpu_ref ref;
	pthread_t worker;
	void *failed;
	pid_t tid;
	char c = 0;

	init_or_die(&ref, nothing, 0);
	load_plugin();
	if (pipe(wake_pipe) || pthread_create(&worker, NULL, blocked_worker, &ref))
		return SETUP_FAILED;
	while (!(tid = __atomic_load_n(&worker_tid, __ATOMIC_ACQUIRE)))
		sched_yield();
	if (!wait_until_sleeping(tid))
		return SETUP_FAILED;
	unload_plugin();
	if (write(wake_pipe[1], &c, 1) != 1 || pthread_join(worker, &failed) || failed)
		return SETUP_FAILED;
	return kill_and_exit(&ref);
}

static int kill_returned;	/* atomic: set by the killing thread */

/* Holds the switch's reference until the kill's own put is done, so that
 * the switch's put is the last one and @release runs on this thread. */
static void confirm_after_kill(struct percpu_ref *ref)
{
	(void)ref;
	while (!__atomic_load_n(&kill_returned, __ATOMIC_ACQUIRE))
		sched_yield();
}

/* The callback thread runs the plugin's @release, sleeps, and is woken. */
static int scenario_kill(void)
{
	struct percpu_ref touched, ref, wake;

	load_plugin_touching(&touched);
	init_or_die(&ref, plugin.release, 0);
	percpu_ref_kill_and_confirm(&ref, confirm_after_kill);
	if (plugin.calls() != 0)
		return SETUP_FAILED;	/* released on this thread after all */
	__atomic_store_n(&kill_returned, 1, __ATOMIC_RELEASE);
	if (percpu_ref_barrier() || plugin.calls() != 1)
		return CALLBACK_MISSING;
	unload_plugin();
	percpu_ref_exit(&ref);
	init_or_die(&wake, nothing, 0);
	return kill_and_exit(&wake) || kill_and_exit(&touched);
}

/* The callback thread runs the plugin's function as a kill's confirm; a
 * reference held meanwhile keeps the release (a callback of its own) out
 * of that batch. */
static int scenario_confirm(void)
{
	struct percpu_ref touched, ref;

	load_plugin_touching(&touched);
	init_or_die(&ref, nothing, 0);
	percpu_ref_get(&ref);
	percpu_ref_kill_and_confirm(&ref, plugin.release);
	if (percpu_ref_barrier() || plugin.calls() != 1)
		return CALLBACK_MISSING;
	unload_plugin();
	if (kill_and_exit(&touched))
		return SETUP_FAILED;
	percpu_ref_put(&ref);
	percpu_ref_exit(&ref);
	return 0;
}

/* The confirm of a switch of an atomic ref runs at once, on this thread,
 * and nothing follows it.  (A kill's confirm run at once is followed by
 * the kill's own put, whose sequence in the library takes the pointer
 * back anyway.) */
static int scenario_confirm_now(void)
{
	struct percpu_ref touched, ref;

	load_plugin_touching(&touched);
	init_or_die(&ref, nothing, PERCPU_REF_INIT_ATOMIC);
	percpu_ref_switch_to_atomic(&ref, plugin.release);
	if (plugin.calls() != 1)
		return CALLBACK_MISSING;
	unload_plugin();
	preempt_self();
	return kill_and_exit(&ref) || kill_and_exit(&touched);
}

/* This thread's last put runs the plugin's @release: its only sequence
 * of the plugin, which this thread's owner never called. */
static int scenario_put(void)
{
	struct percpu_ref touched, ref;

	load_plugin_touching(&touched);
	init_or_die(&ref, plugin.release, PERCPU_REF_INIT_ATOMIC);
	percpu_ref_get(&ref);
	percpu_ref_kill(&ref);
	if (percpu_ref_barrier() || plugin.calls() != 0)
		return SETUP_FAILED;
	percpu_ref_put(&ref);
	if (plugin.calls() != 1)
		return CALLBACK_MISSING;
	unload_plugin();
	preempt_self();
	percpu_ref_exit(&ref);
	return kill_and_exit(&touched);
}

/* The reclaimer runs the plugin's @release in a scan, sleeps, is woken. */
static int scenario_managed(void)
{
	struct percpu_ref touched, ref, wake;

	load_plugin_touching(&touched);
	init_or_die(&ref, plugin.release, PERCPU_REF_REL_MANAGED);
	percpu_ref_put(&ref);
	if (percpu_ref_managed_flush() || plugin.calls() != 1)
		return CALLBACK_MISSING;
	unload_plugin();
	percpu_ref_exit(&ref);
	init_or_die(&wake, nothing, PERCPU_REF_REL_MANAGED);
	percpu_ref_put(&wake);
	percpu_ref_managed_flush();
	percpu_ref_exit(&wake);
	return kill_and_exit(&touched);
}

/* The reclaimer runs the plugin's @release after a grace period. */
static int scenario_rcu(void)
{
	struct percpu_rcuref ref, wake;
	struct percpu_ref touched;

	load_plugin_touching(&touched);
	if (percpu_rcuref_init(&ref, NULL, plugin.rcu_release, 0))
		return SETUP_FAILED;
	percpu_rcuref_kill(&ref);
	if (percpu_rcuref_barrier() || plugin.calls() != 1)
		return CALLBACK_MISSING;
	unload_plugin();
	percpu_rcuref_exit(&ref);
	if (percpu_rcuref_init(&wake, NULL, rcu_nothing, 0))
		return SETUP_FAILED;
	percpu_rcuref_kill(&wake);
	percpu_rcuref_barrier();
	percpu_rcuref_exit(&wake);
	return kill_and_exit(&touched);
}

/*
 * A plugin with its own copy of the library (tests/plugin/own_copy_plugin.c)
 * whose thread-exit hooks a thread armed: each copy makes a pthread key for
 * them.  A key destructor of the application's, run before the copy's own
 * (a lower key), unloads the plugin during that thread's exit: the copy's
 * key destructor then ran in unmapped memory (SIGSEGV).  And every load
 * took a key that its unload left behind, until pthread_key_create() failed
 * for everyone (1024 keys: a review's 1100 loads).
 */
static void *own_copy;

static void unload_own_copy(void *unused)
{
	(void)unused;
	dlclose(own_copy);
}

static void *run_own_copy(void *key)
{
	int (*run)(void) = (int (*)(void))dlsym(own_copy, "own_copy_run");

	if (!run || run())
		return (void *)1;
	/* Unloads the plugin from this thread's exit (see above). */
	if (key)
		pthread_setspecific(*(pthread_key_t *)key, own_copy);
	return NULL;
}

/* Loads the plugin, runs it on a new thread, and joins that thread. */
static int own_copy_round(pthread_key_t *unload_key)
{
	pthread_t t;
	void *failed;

	own_copy = dlopen(OWN_COPY_PLUGIN, RTLD_NOW | RTLD_LOCAL);
	if (!own_copy) {
		fprintf(stderr, "# %s\n", dlerror());
		return SETUP_FAILED;
	}
	if (pthread_create(&t, NULL, run_own_copy, unload_key) || pthread_join(t, &failed) ||
	    failed)
		return SETUP_FAILED;
	return 0;
}

static int scenario_own_copy(void)
{
	pthread_key_t unload_key, probe, again;
	int i, err;

	/* First: a lower key than any copy's. */
	if (pthread_key_create(&unload_key, unload_own_copy))
		return SETUP_FAILED;
	err = own_copy_round(&unload_key);
	if (err)
		return err;
	if (dlopen(OWN_COPY_PLUGIN, RTLD_NOW | RTLD_NOLOAD))
		return NOT_UNLOADED;
	/* glibc hands out the lowest free key: after three more rounds, a new
	 * key takes the probe's place unless a round left one behind. */
	if (pthread_key_create(&probe, NULL) || pthread_key_delete(probe))
		return SETUP_FAILED;
	for (i = 0; i < 3; i++) {
		err = own_copy_round(NULL);
		if (err)
			return err;
		dlclose(own_copy);
	}
	if (pthread_key_create(&again, NULL))
		return KEY_LEFT;
	return again == probe ? 0 : KEY_LEFT;
}

static const struct {
	const char *mode, *what;
	int (*run)(void);
} scenarios[] = {
	{ "main", "the unloading thread ran the fast path", scenario_main },
	{ "blocked", "a thread blocked in the kernel across the unload", scenario_blocked },
	{ "kill", "the callback thread ran the plugin's @release", scenario_kill },
	{ "put", "this thread's last put ran the plugin's @release", scenario_put },
	{ "confirm", "the callback thread ran the plugin's confirm", scenario_confirm },
	{ "confirm-now", "this thread's switch ran the plugin's confirm at once",
	  scenario_confirm_now },
	{ "managed", "the reclaimer released a managed ref into the plugin", scenario_managed },
	{ "rcu", "the reclaimer ran an RCU-deferred @release", scenario_rcu },
};
#define NR_SCENARIOS (sizeof(scenarios) / sizeof(scenarios[0]))

int main(int argc, char **argv)
{
	unsigned int i;

	for (i = 0; i < NR_SCENARIOS; i++)
		if (argc > 1 && !strcmp(argv[1], scenarios[i].mode))
			return scenarios[i].run();
	if (argc > 1 && !strcmp(argv[1], "own-copy"))
		return scenario_own_copy();
#ifdef __GLIBC__
	/* On every fast path: the copy's key is not about rseq.  Each
	 * unloaded copy leaves its heap behind (docs/percpu_ref.md): not the
	 * leak checker's business here.  ThreadSanitizer's atexit()
	 * interceptor keeps the copy's exit handler past the unload, and
	 * calls it at exit, in unmapped memory. */
	if (UNDER_TSAN) {
		printf("# skipped a plugin's own copy of the library under ThreadSanitizer\n");
	} else {
		const char *asan = getenv("ASAN_OPTIONS");
		char *saved = asan ? strdup(asan) : NULL;

		setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
		is(run_mode("own-copy"), 0, "a plugin with its own copy of the library, unloaded "
		   "from a thread's exit and loaded again: no key destructor in unmapped memory, "
		   "no key left");
		if (saved)
			setenv("ASAN_OPTIONS", saved, 1);
		else
			unsetenv("ASAN_OPTIONS");
		free(saved);
	}
#endif
	/* No rseq area for the kernel to read (valgrind, qemu-user, no rseq):
	 * nothing could fail.  Under valgrind the children would even run
	 * natively, on rseq, under this process's label. */
	if (!strcmp(percpuref_fast_path(), "fallback")) {
		printf("1..0 # SKIP no rseq fast path in this process\n");
		return 0;
	}
#ifndef __GLIBC__
	/* musl's dlclose() never unloads: nothing to survive. */
	printf("1..0 # SKIP dlclose() unloads nothing in this C library\n");
	return 0;
#endif
	/* A few times each: a thread the kernel happened to preempt between
	 * its last sequence and the unload was cleared by the kernel. */
	for (i = 0; i < NR_SCENARIOS; i++) {
		int status = 0, round;

		for (round = 0; round < 5 && status == 0; round++)
			status = run_mode(scenarios[i].mode);
		is(status, 0, "%s: %s, unloaded, survives (%s)", scenarios[i].mode,
		   scenarios[i].what, percpuref_fast_path());
	}
	return done_testing();
}
