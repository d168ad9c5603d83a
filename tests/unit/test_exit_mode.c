/* SPDX-License-Identifier: MIT */
/*
 * test_exit_mode.c - what a process's exit does after it ran the library's
 * exit handler (0.4.32).  That handler is registered with atexit() at the
 * library's first use, so exit() runs it before the atexit() handlers and
 * the static destructors registered earlier (C++ globals that exist
 * before any library call: every constant-initialised one).  What those
 * kill or let go of used to be finished later, on the library's threads or
 * in its ELF destructor, after they had destroyed what a @release may use
 * (review 171: a C++ static owner's ~T wrote into a destroyed global).
 * Now, on the thread that runs the exit, a kill switches the ref to
 * atomic mode there (0.4.33: under the hold that marks it dead), and a
 * percpu_rcuref waits for its grace period, so confirm,
 * @unpublish and @release run before the call returns (a percpu_rcuref's
 * only while the reclaimer runs no callback, whose exits it would race:
 * queued otherwise, as before); and the handler's
 * managed pass takes a ref still held from management (killed, the
 * manager's reference its initial one), so its last holder's put releases
 * it, on that holder's thread.
 *
 * Each scenario is a child process: its main() registers a handler of its
 * own first, then makes the library's first call; that handler, run after
 * the library's, does the scenario's calls and checks at once (exit
 * status 10 + the check's number when one fails, 20 when a thread that
 * should have gone on is still blocked after 3 s).  Review 174's cases:
 * a kill or put under a lock must not wait for another ref's callbacks
 * that take it (on the exiting thread or another); the teardown of a
 * managed ref (unmanage, then kill) still works; a child forked by another
 * thread during the exit, and an exit() called from a callback, change
 * nothing; refs in use by other threads through the handler are each
 * released once.  Review 175's: a percpu_rcuref @release on the exiting
 * thread never runs beside the reclaimer's callbacks, which may exit the
 * ref.  A shutdown called by the program, not exit, still leaves
 * held managed refs managed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "child.h"
#include "internal.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_rcuref.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

static struct percpu_ref ref, other;
static struct percpu_rcuref rcuref, rcu_other;
static int released, unpublished, stop;	/* atomic */
static pthread_t released_on;

static void set(int *flag)
{
	__atomic_store_n(flag, 1, __ATOMIC_SEQ_CST);
}

static bool is_set(int *flag)
{
	return __atomic_load_n(flag, __ATOMIC_SEQ_CST);
}

static void wait_for(int *flag)
{
	while (!is_set(flag))
		usleep(1000);
}

/* Whether @flag was set within @ms. */
static bool wait_for_ms(int *flag, int ms)
{
	for (int i = 0; i < ms && !is_set(flag); i++)
		usleep(1000);
	return is_set(flag);
}

static int nr_released(void)
{
	return __atomic_load_n(&released, __ATOMIC_SEQ_CST);
}

/* In a handler: the scenario failed its check @n. */
static void check(bool cond, int n)
{
	if (!cond)
		_exit(10 + n);
}

static void count_release(struct percpu_ref *r)
{
	(void)r;
	released_on = pthread_self();
	__atomic_fetch_add(&released, 1, __ATOMIC_SEQ_CST);
}

static void count_rcu_release(struct percpu_rcuref *r)
{
	(void)r;
	__atomic_fetch_add(&released, 1, __ATOMIC_SEQ_CST);
}

static void count_unpublish(struct percpu_rcuref *r)
{
	(void)r;
	__atomic_fetch_add(&unpublished, 1, __ATOMIC_SEQ_CST);
}

static void late_kill(void)
{
	check(nr_released() == 0, 0);
	percpu_ref_kill(&ref);
	check(nr_released() == 1, 1);
	check(pthread_equal(released_on, pthread_self()), 2);
}

static void late_kill_rcu(void)
{
	percpu_rcuref_kill(&rcuref);
	check(__atomic_load_n(&unpublished, __ATOMIC_SEQ_CST) == 1, 1);
	check(nr_released() == 1, 2);
}

/*
 * A kill on the exiting thread while another thread switches the ref back
 * to per-CPU mode (legal: a dead ref stays as it is): its confirm and
 * @release still run before it returns, on its thread.  0.4.32 made the
 * ref atomic, dropped the switch lock, then killed: a switch back to
 * per-CPU in between sent the kill's confirm and @release to the callback
 * thread (review 175; it failed here in 20 runs of 20).  The racer calls as soon as the
 * count loses its bias, which the fold does under the lock, so that it
 * waits for that lock, not for the end of a switch in flight (a futex
 * wake, later than the killer's relock).
 */
#define RACE_ROUNDS 2000
#define RACE_MS 1000
static int confirmed, racing;	/* atomic */
static pthread_t confirmed_on;

static void count_confirm(struct percpu_ref *r)
{
	(void)r;
	confirmed_on = pthread_self();
	set(&confirmed);
}

static void *switch_back_to_percpu(void *arg)
{
	(void)arg;
	set(&racing);
	while (!is_set(&stop))
		/* Relaxed: only when to try; the switch lock orders the rest. */
		if (__atomic_load_n(&ref.data->count, __ATOMIC_RELAXED) < PERCPU_COUNT_BIAS)
			percpu_ref_switch_to_percpu(&ref);
	return NULL;
}

/* Its rounds for RACE_MS at most (slow under valgrind and a loaded CPU). */
static void late_kill_racing_switch(void)
{
	uint64_t end = now_ns() + RACE_MS * 1000000ull;

	for (int round = 0; round < RACE_ROUNDS && now_ns() < end; round++) {
		pthread_t racer;

		__atomic_store_n(&stop, 0, __ATOMIC_SEQ_CST);
		__atomic_store_n(&confirmed, 0, __ATOMIC_SEQ_CST);
		__atomic_store_n(&racing, 0, __ATOMIC_SEQ_CST);
		if (round)
			check(!percpu_ref_init(&ref, count_release, PERCPU_REF_ALLOW_REINIT), 0);
		check(!pthread_create(&racer, NULL, switch_back_to_percpu, NULL), 1);
		while (!is_set(&racing))
			sched_yield();
		percpu_ref_kill_and_confirm(&ref, count_confirm);
		check(is_set(&confirmed) && pthread_equal(confirmed_on, pthread_self()), 2);
		check(nr_released() == round + 1 && pthread_equal(released_on, pthread_self()), 3);
		set(&stop);
		pthread_join(racer, NULL);
		percpu_ref_exit(&ref);
	}
}

/*
 * A percpu_rcuref's @release run on the exiting thread lets go of the
 * refs its object holds, a percpu_ref and a percpu_rcuref: their
 * callbacks run before the parent's kill returns too.  0.4.32 queued
 * them (inside that @release the thread held the reclaimer's role, so it
 * read as no exit's), to run after the older globals were destroyed
 * (review 177; a C++ static owner of such an object: heap-use-after-free).
 */
static struct percpu_ref nested_ref;
static struct percpu_rcuref nested_rcu;

static void parent_drops_children(struct percpu_rcuref *r)
{
	(void)r;
	percpu_ref_kill(&nested_ref);
	percpu_rcuref_kill(&nested_rcu);
	__atomic_fetch_add(&released, 1, __ATOMIC_SEQ_CST);
}

static void late_nested_teardown(void)
{
	percpu_rcuref_kill(&rcuref);
	/* The parent, its percpu_ref child (on this thread), its rcuref child. */
	check(nr_released() == 3, 1);
	check(pthread_equal(released_on, pthread_self()), 2);
}

/*
 * A held managed ref taken from management by the exit, cycled as a
 * managed ref may be (unmanage, read it atomic, back to per-CPU, manage
 * again) before its holder lets go: each call answers 0 without a
 * warning, and the holder's put releases it, once, on its thread.
 * 0.4.32 refused the switch back to managed (dead), warning (review 177).
 */
/* percpu_ref_switch_to_managed(), whose one warning goes to /dev/null. */
static int switch_to_managed_quietly(struct percpu_ref *r)
{
	unsigned long warned = percpuref_warning_count();
	int saved = dup(STDERR_FILENO), null = open("/dev/null", O_WRONLY), ret;

	check(saved >= 0 && null >= 0 && dup2(null, STDERR_FILENO) >= 0, 7);
	ret = percpu_ref_switch_to_managed(r);
	check(dup2(saved, STDERR_FILENO) >= 0, 8);
	close(saved);
	close(null);
	check(percpuref_warning_count() == warned + 1, 9);
	return ret;
}

static void late_remanage(void)
{
	for (int cycle = 0; cycle < 2; cycle++) {
		check(percpu_ref_switch_to_unmanaged(&ref) == 0, 1);
		percpu_ref_switch_to_atomic_sync(&ref);
		percpu_ref_switch_to_percpu(&ref);
		check(percpu_ref_switch_to_managed(&ref) == 0, 2);
	}
	check(nr_released() == 0, 3);
	/* Managed again, as far as its holders can tell: a second switch is
	 * refused as on any managed ref (warned; its line kept from ctest's
	 * eyes, which fail the test on any). */
	check(switch_to_managed_quietly(&ref) == -EALREADY, 6);
	percpu_ref_put(&ref);
	check(nr_released() == 1, 4);
	check(pthread_equal(released_on, pthread_self()), 5);
}

/*
 * A kill's confirm on the exiting thread that forks (a callback may: the
 * child only _exits): the first build of 0.4.33 ran that confirm inside
 * the kill's switch, holding the lock a fork takes for writing, and the
 * fork waited for its own thread (review 178: exit() hung, 3 runs of 3).
 */
static void confirm_forks(struct percpu_ref *r)
{
	pid_t pid;

	(void)r;
	pid = fork();
	if (pid == 0)
		_exit(0);
	check(pid > 0 && wait_child(pid) == 0, 1);
	set(&confirmed);
}

static void late_fork_in_confirm(void)
{
	percpu_ref_kill_and_confirm(&ref, confirm_forks);
	check(is_set(&confirmed) && nr_released() == 1, 2);
}

/*
 * A confirm run inside such a @release (a kill of the object's child with
 * a confirm that lets go of a third ref): that third ref is released
 * before the parent's kill returns too (review 178: 0.4.32 and the first
 * build of 0.4.33 queued it, the confirm being pinned).
 */
static struct percpu_rcuref third;

static void confirm_kills_third(struct percpu_ref *r)
{
	(void)r;
	percpu_rcuref_kill(&third);
}

static void parent_kills_child_confirmed(struct percpu_rcuref *r)
{
	(void)r;
	percpu_ref_kill_and_confirm(&nested_ref, confirm_kills_third);
}

static void late_confirm_in_nested(void)
{
	percpu_rcuref_kill(&rcuref);
	/* The child and the third. */
	check(nr_released() == 2, 1);
}

/*
 * A chain of percpu_rcurefs, each @release killing the next, torn down by
 * an exit() called on a thread with a small stack: each link is released
 * after the one before has returned, not inside it (review 178: the first
 * build of 0.4.33 recursed, a link deeper each, and 50,000 links
 * overflowed the main thread's 8 MiB stack).
 */
#define CHAIN_LINKS 5000
#define CHAIN_STACK (256 * 1024)

struct link {
	struct percpu_rcuref ref;
	struct link *next;
};

static struct link *chain;

static void link_release(struct percpu_rcuref *r)
{
	struct link *l = (struct link *)r;

	if (l->next)
		percpu_rcuref_kill(&l->next->ref);
	percpu_rcuref_exit(r);
	free(l);
	__atomic_fetch_add(&released, 1, __ATOMIC_SEQ_CST);
}

static void late_chain(void)
{
	percpu_rcuref_kill(&chain->ref);
	check(nr_released() == CHAIN_LINKS, 1);
}

static void *exit_on_small_stack(void *arg)
{
	(void)arg;
	exit(0);
}

static int setup_chain(void)
{
	pthread_attr_t attr;
	pthread_t t;

	for (int i = 0; i < CHAIN_LINKS; i++) {
		struct link *l = calloc(1, sizeof(*l));

		if (!l || percpu_rcuref_init(&l->ref, NULL, link_release, 0))
			return 4;
		l->next = chain;
		chain = l;
	}
	if (pthread_attr_init(&attr) || pthread_attr_setstacksize(&attr, CHAIN_STACK) ||
	    pthread_create(&t, &attr, exit_on_small_stack, NULL))
		return 5;
	pause();
	return 0;
}

/*
 * Another thread forks while a @release run there lets go of two more
 * percpu_rcurefs, which wait for the exiting thread's next round: the
 * child, which that thread is not in, releases them (its reclaimer runs
 * them; review 179: the first build of that round kept them on the
 * exiting thread's own list, which the child lacks, and lost them).
 */
static struct percpu_rcuref loop_b, loop_c;
static int loop_forked, loop_fork_go, loop_child_status = -1;	/* atomic */

static void parent_kills_two_then_waits(struct percpu_rcuref *r)
{
	(void)r;
	percpu_rcuref_kill(&loop_b);
	percpu_rcuref_kill(&loop_c);
	set(&loop_fork_go);
	wait_for(&loop_forked);
}

static void *fork_in_loop(void *arg)
{
	pid_t pid;

	(void)arg;
	wait_for(&loop_fork_go);
	pid = fork();
	if (pid == 0) {
		/* Whichever thread forked, the two are this child's to release. */
		if (percpu_rcuref_barrier())
			_exit(1);
		_exit(nr_released() == 2 ? 0 : 2);
	}
	__atomic_store_n(&loop_child_status, pid < 0 ? 3 : wait_child(pid), __ATOMIC_SEQ_CST);
	set(&loop_forked);
	return NULL;
}

static void late_fork_in_loop(void)
{
	percpu_rcuref_kill(&rcuref);
	check(__atomic_load_n(&loop_child_status, __ATOMIC_SEQ_CST) == 0, 1);
	check(nr_released() == 2, 2);
}

/* The same reached from a kill's confirm (pinned): the @release that waits
 * for the fork ran with the reclaimer's lock kept (a pinned thread's
 * pause keeps it), which the fork waits for: exit() hung (review 180). */
static void confirm_kills_parent(struct percpu_ref *r)
{
	(void)r;
	percpu_rcuref_kill(&rcuref);
}

static void late_fork_in_loop_confirm(void)
{
	percpu_ref_kill_and_confirm(&ref, confirm_kills_parent);
	check(__atomic_load_n(&loop_child_status, __ATOMIC_SEQ_CST) == 0, 1);
	/* loop_b, loop_c and ref. */
	check(nr_released() == 3, 2);
}

static void late_managed_put(void)
{
	/* Held by us alone now, no longer managed: a kill's state. */
	check(nr_released() == 0, 0);
	check(percpu_ref_is_dying(&ref), 1);
	check(!percpu_ref_tryget_live(&ref), 2);
	/* A second holder for a while: a put is not the last one. */
	check(percpu_ref_tryget(&ref), 3);
	percpu_ref_put(&ref);
	check(nr_released() == 0, 4);
	percpu_ref_put(&ref);
	check(nr_released() == 1, 5);
	check(pthread_equal(released_on, pthread_self()), 6);
}

static void late_managed_put_rcu(void)
{
	check(nr_released() == 0, 0);
	percpu_rcuref_put(&rcuref);
	check(__atomic_load_n(&unpublished, __ATOMIC_SEQ_CST) == 1, 1);
	check(nr_released() == 1, 2);
}

/* A managed ref nobody held at the exit: the library's handler released it. */
static void late_idle_managed(void)
{
	check(nr_released() == 1, 1);
}

/* A held managed ref's teardown as written before the exit: unmanage, then kill. */
static void late_unmanage_kill(void)
{
	check(percpu_ref_switch_to_unmanaged(&ref) == 0, 1);
	check(nr_released() == 0, 2);
	percpu_ref_kill(&ref);	/* our reference: the initial one now */
	check(nr_released() == 1, 3);
}

/*
 * The cross cases.  One thread holds lock L and kills ref (or puts
 * rcuref's last reference), whose callbacks take no lock; just before,
 * another kills other (rcu_other), whose confirm (@release) takes L and
 * waits for it on a library thread.  The first must not wait for that:
 * the first build of 0.4.32 waited for every callback queued, and the
 * thread, then exit(), hung (review 174).  @here: the thread that runs the
 * exit holds L, as a static destructor would; else a thread still running.
 */
static pthread_mutex_t lock_l = PTHREAD_MUTEX_INITIALIZER;
static int go, l_held, other_killed, done;	/* atomic */
static bool rcu_mode, here;

static void take_l(void)
{
	pthread_mutex_lock(&lock_l);
	pthread_mutex_unlock(&lock_l);
}

static void confirm_takes_l(struct percpu_ref *r)
{
	(void)r;
	take_l();
}

static void rcu_release_takes_l(struct percpu_rcuref *r)
{
	(void)r;
	take_l();
}

static void *kill_other(void *arg)
{
	(void)arg;
	wait_for(&go);
	wait_for(&l_held);
	if (rcu_mode)
		percpu_rcuref_kill(&rcu_other);
	else
		percpu_ref_kill_and_confirm(&other, confirm_takes_l);
	set(&other_killed);
	return NULL;
}

static void kill_under_l(void)
{
	pthread_mutex_lock(&lock_l);
	set(&l_held);
	wait_for(&other_killed);
	usleep(100 * 1000);	/* other's callback under way, waiting for L */
	if (rcu_mode)
		percpu_rcuref_put(&rcuref);	/* the last reference */
	else
		percpu_ref_kill(&ref);
	pthread_mutex_unlock(&lock_l);
	set(&done);
}

static void *kill_under_l_thread(void *arg)
{
	(void)arg;
	wait_for(&go);
	kill_under_l();
	return NULL;
}

static void late_cross(void)
{
	set(&go);
	if (here) {
		kill_under_l();
		/* A percpu_rcuref's @release waits for the reclaimer's
		 * callback in progress, other's, which waits for L: queued
		 * behind it (review 175), it runs once L is free. */
		check(rcu_mode || nr_released() == 1, 1);
	}
	if (!wait_for_ms(&done, 3000))
		_exit(20);
}

/*
 * A child forked while exit() runs, by a thread that does not run it, is
 * no exit's and runs on: its managed refs stay managed (it inherited the
 * exit's flag in the first build, review 174).
 */
static int fork_go, fork_status = -1;	/* atomic */

static void *forker(void *arg)
{
	pid_t pid;

	(void)arg;
	wait_for(&fork_go);
	pid = fork();
	if (pid == 0) {
		if (percpu_ref_init(&other, count_release, PERCPU_REF_REL_MANAGED))
			_exit(4);
		percpu_ref_managed_flush();
		check(!percpu_ref_is_dying(&other), 1);
		check(percpu_ref_tryget_live(&other), 2);
		check(percpu_ref_switch_to_unmanaged(&other) == 0, 3);
		_exit(0);
	}
	__atomic_store_n(&fork_status, pid < 0 ? 5 : wait_child(pid), __ATOMIC_SEQ_CST);
	return NULL;
}

static void late_fork_other(void)
{
	set(&fork_go);
	for (int i = 0; i < 5000 && __atomic_load_n(&fork_status, __ATOMIC_SEQ_CST) < 0; i++)
		usleep(1000);
	_exit(__atomic_load_n(&fork_status, __ATOMIC_SEQ_CST));
}

/*
 * exit() from a confirm callback, on the callback thread: the library's
 * handler does nothing there, and marks no exit.  A handler registered
 * before the first use asks a worker to finish and waits for it; the
 * worker's kill must not wait for the callback thread, which is in exit()
 * (the first build marked the exit even so, review 174).
 */
static int flush_asked, worker_done;	/* atomic */

static void confirm_exits(struct percpu_ref *r)
{
	(void)r;
	exit(0);
}

static void *flush_worker(void *arg)
{
	(void)arg;
	wait_for(&flush_asked);
	percpu_ref_kill(&other);
	set(&worker_done);
	return NULL;
}

static void late_flush(void)
{
	set(&flush_asked);
	if (!wait_for_ms(&worker_done, 3000))
		_exit(20);
}

/*
 * percpu_rcuref.h lets a callback the reclaimer runs exit a ref between
 * its zero and its @release.  A parent's @release, on the reclaimer, exits
 * its embedded child and frees both, while the exiting thread's kill took
 * the child to zero: the child's @release, run on the exiting thread, must
 * not run beside it (the first build of 0.4.32 ran it there unguarded:
 * a heap-use-after-free, review 175).
 */
struct parent {
	struct percpu_rcuref ref;
	struct percpu_rcuref child;
	int data;
};

static struct parent *parent;
static int child_releasing, parent_released, overlap;	/* atomic */

static void child_release(struct percpu_rcuref *r)
{
	struct parent *p = (struct parent *)((char *)r - offsetof(struct parent, child));

	set(&child_releasing);
	/* Time for the parent's @release, were it to run beside this one. */
	if (wait_for_ms(&parent_released, 300))
		set(&overlap);
	p->data++;
}

static void parent_release(struct percpu_rcuref *r)
{
	struct parent *p = (struct parent *)r;

	percpu_rcuref_exit(&p->child);
	percpu_rcuref_exit(&p->ref);
	free(p);
	set(&parent_released);
}

static void *kill_parent(void *arg)
{
	(void)arg;
	wait_for(&child_releasing);
	percpu_rcuref_kill(&parent->ref);	/* not the exiting thread's */
	return NULL;
}

static void late_kill_child(void)
{
	percpu_rcuref_kill(&parent->child);
	check(!is_set(&overlap), 1);
}

/*
 * Managed refs held by their creators and used by workers (tryget,
 * tryget_live, get) while the handler's pass takes them from management;
 * the late handler drops the creators' references, stops the workers:
 * each ref released exactly once, by whichever put was its last.
 */
#define STRESS_REFS 64
#define STRESS_WORKERS 3
static struct percpu_ref stress_ref[STRESS_REFS];
static int stress_released[STRESS_REFS];	/* atomic */
static pthread_t workers[STRESS_WORKERS];

static void stress_release(struct percpu_ref *r)
{
	__atomic_fetch_add(&stress_released[r - stress_ref], 1, __ATOMIC_SEQ_CST);
}

static void *stress_worker(void *arg)
{
	unsigned int seed = (unsigned int)(uintptr_t)arg;

	while (!is_set(&stop)) {
		struct percpu_ref *r = &stress_ref[rand_r(&seed) % STRESS_REFS];

		if (rand_r(&seed) % 2 ? percpu_ref_tryget_live(r) : percpu_ref_tryget(r)) {
			percpu_ref_get(r);
			if (rand_r(&seed) % 4 == 0)
				sched_yield();
			percpu_ref_put(r);
			percpu_ref_put(r);
		}
	}
	return NULL;
}

static void late_stress(void)
{
	for (int i = 0; i < STRESS_REFS; i++)
		percpu_ref_put(&stress_ref[i]);	/* the creator's */
	set(&stop);
	for (int i = 0; i < STRESS_WORKERS; i++)
		pthread_join(workers[i], NULL);
	for (int i = 0; i < STRESS_REFS; i++)
		check(__atomic_load_n(&stress_released[i], __ATOMIC_SEQ_CST) == 1, 1);
}

/* A thread the exit leaves running, as a server's workers are: detached,
 * so ThreadSanitizer does not report it as leaked. */
static int start_detached(void *(*fn)(void *))
{
	pthread_t t;

	return pthread_create(&t, NULL, fn, NULL) || pthread_detach(t);
}

static int setup_cross(void)
{
	if (rcu_mode) {
		/* rcuref: killed now, one reference left for the put. */
		if (percpu_rcuref_init(&rcuref, NULL, count_rcu_release, 0) ||
		    percpu_rcuref_init(&rcu_other, NULL, rcu_release_takes_l, 0))
			return 4;
		percpu_rcuref_get(&rcuref);
		percpu_rcuref_kill(&rcuref);
		percpu_ref_barrier();
	} else if (percpu_ref_init(&ref, count_release, 0) ||
		   /* No count: its release may come once L is free. */
		   percpu_ref_init(&other, NULL, 0)) {
		return 4;
	}
	if (start_detached(kill_other) || (!here && start_detached(kill_under_l_thread)))
		return 5;
	return 0;
}

static int scenario(const char *mode)
{
	static const struct {
		const char *mode;
		void (*late)(void);
	} scenarios[] = {
		{ "--kill", late_kill },
		{ "--kill-rcu", late_kill_rcu },
		{ "--kill-racing-switch", late_kill_racing_switch },
		{ "--nested-teardown", late_nested_teardown },
		{ "--remanage", late_remanage },
		{ "--fork-in-confirm", late_fork_in_confirm },
		{ "--confirm-in-nested", late_confirm_in_nested },
		{ "--rcu-chain", late_chain },
		{ "--fork-in-loop", late_fork_in_loop },
		{ "--fork-in-loop-confirm", late_fork_in_loop_confirm },
		{ "--managed-put", late_managed_put },
		{ "--managed-put-rcu", late_managed_put_rcu },
		{ "--idle-managed", late_idle_managed },
		{ "--unmanage-kill", late_unmanage_kill },
		{ "--cross-kill", late_cross },
		{ "--cross-kill-here", late_cross },
		{ "--cross-rcu", late_cross },
		{ "--cross-rcu-here", late_cross },
		{ "--fork-other", late_fork_other },
		{ "--exit-from-callback", late_flush },
		{ "--stress", late_stress },
		{ "--rcu-exit-from-reclaimer", late_kill_child },
	};
	void (*late)(void) = NULL;
	size_t i;

	for (i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
		if (!strcmp(mode, scenarios[i].mode))
			late = scenarios[i].late;
	if (!late)
		return 2;
	child_deadline(10);
	/* Before the library's first use: runs after its exit handler. */
	if (atexit(late))
		return 3;
	if (late == late_cross) {
		rcu_mode = strstr(mode, "rcu") != NULL;
		here = strstr(mode, "here") != NULL;
		return setup_cross();
	}
	if (late == late_kill_rcu || late == late_managed_put_rcu)
		return percpu_rcuref_init(&rcuref, count_unpublish, count_rcu_release,
					  late == late_managed_put_rcu ? PERCPU_REF_REL_MANAGED : 0)
		       ? 4 : 0;
	if (late == late_kill_child) {
		parent = calloc(1, sizeof(*parent));
		if (!parent || percpu_rcuref_init(&parent->ref, NULL, parent_release, 0) ||
		    percpu_rcuref_init(&parent->child, NULL, child_release, 0))
			return 4;
		return start_detached(kill_parent) ? 5 : 0;
	}
	if (late == late_stress) {
		for (i = 0; i < STRESS_REFS; i++)
			if (percpu_ref_init(&stress_ref[i], stress_release, PERCPU_REF_REL_MANAGED))
				return 4;
		for (i = 0; i < STRESS_WORKERS; i++)
			if (pthread_create(&workers[i], NULL, stress_worker, (void *)(i + 1)))
				return 5;
		usleep(20 * 1000);
		return 0;
	}
	if (late == late_chain)
		return setup_chain();
	if (late == late_fork_in_loop_confirm &&
	    percpu_ref_init(&ref, count_release, 0))
		return 4;
	if (late == late_fork_in_loop || late == late_fork_in_loop_confirm)
		return percpu_rcuref_init(&rcuref, NULL, parent_kills_two_then_waits, 0) ||
		       percpu_rcuref_init(&loop_b, NULL, count_rcu_release, 0) ||
		       percpu_rcuref_init(&loop_c, NULL, count_rcu_release, 0) ||
		       start_detached(fork_in_loop) ? 4 : 0;
	if (late == late_confirm_in_nested)
		return percpu_rcuref_init(&rcuref, NULL, parent_kills_child_confirmed, 0) ||
		       percpu_ref_init(&nested_ref, count_release, 0) ||
		       percpu_rcuref_init(&third, NULL, count_rcu_release, 0) ? 4 : 0;
	if (late == late_nested_teardown)
		return percpu_rcuref_init(&rcuref, NULL, parent_drops_children, 0) ||
		       percpu_ref_init(&nested_ref, count_release, 0) ||
		       percpu_rcuref_init(&nested_rcu, NULL, count_rcu_release, 0) ? 4 : 0;
	if (late == late_kill_racing_switch)
		return percpu_ref_init(&ref, count_release, PERCPU_REF_ALLOW_REINIT) ? 4 : 0;
	if (percpu_ref_init(&ref, count_release,
			    late == late_managed_put || late == late_idle_managed ||
			    late == late_unmanage_kill || late == late_remanage
			    ? PERCPU_REF_REL_MANAGED : 0))
		return 4;
	if (late == late_idle_managed)
		percpu_ref_put(&ref);	/* the manager's alone */
	if (late == late_fork_other && start_detached(forker))
		return 5;
	if (late == late_flush) {
		if (percpu_ref_init(&other, count_release, 0) ||
		    start_detached(flush_worker))
			return 5;
		/* Per-CPU: the confirm runs on the callback thread. */
		percpu_ref_kill_and_confirm(&ref, confirm_exits);
		pause();
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1)
		return scenario(argv[1]);

	is(run_mode("--kill"), 0,
	   "after the exit handler: a kill returns with its @release run, on its thread");
	is(run_mode("--kill-racing-switch"), 0,
	   "after the exit handler: a kill racing another thread's switch back to per-CPU still "
	   "returns with its confirm and @release run, on its thread");
	is(run_mode("--nested-teardown"), 0,
	   "after the exit handler: what a percpu_rcuref's @release run there lets go of is "
	   "released before its kill returns");
	is(run_mode("--remanage"), 0,
	   "after the exit handler: a held managed ref taken from management cycles "
	   "unmanaged and managed without a warning; its holder's put releases it");
	if (fork_children_untestable())
		skip("fork in a confirm at exit: %s", fork_children_untestable());
	else
		is(run_mode("--fork-in-confirm"), 0,
		   "after the exit handler: a kill's confirm that forks does not hang the exit");
	if (fork_children_untestable())
		skip("fork during the exit's releases: %s", fork_children_untestable());
	else
	{
		is(run_mode("--fork-in-loop"), 0,
		   "after the exit handler: a child forked by another thread while a @release run "
		   "there lets go of percpu_rcurefs releases them");
		is(run_mode("--fork-in-loop-confirm"), 0,
		   "likewise from a kill's confirm: the fork does not wait for that @release");
	}
	is(run_mode("--confirm-in-nested"), 0,
	   "after the exit handler: what a confirm inside a percpu_rcuref's @release lets go of "
	   "is released before the outer kill returns");
	is(run_mode("--rcu-chain"), 0,
	   "after the exit handler: a chain of 5,000 percpu_rcurefs torn down on a 256 KiB "
	   "stack, each link released once");
	is(run_mode("--kill-rcu"), 0,
	   "after the exit handler: a percpu_rcuref kill returns with @unpublish and @release run");
	is(run_mode("--managed-put"), 0,
	   "after the exit handler: a held managed ref is killed; its last put releases it, "
	   "on the putter's thread");
	is(run_mode("--managed-put-rcu"), 0,
	   "after the exit handler: likewise a managed percpu_rcuref, its grace period waited for");
	is(run_mode("--idle-managed"), 0,
	   "the exit handler released the managed ref nobody held, as before");
	is(run_mode("--unmanage-kill"), 0,
	   "after the exit handler: unmanage then kill of a held managed ref releases it, "
	   "no warning");
	is(run_mode("--cross-kill-here"), 0,
	   "the exiting thread's kill under a lock waits for no other ref's callback");
	is(run_mode("--cross-kill"), 0, "likewise a kill by a thread still running");
	is(run_mode("--cross-rcu-here"), 0,
	   "the exiting thread's percpu_rcuref put under a lock waits for no other ref's release "
	   "(its own queued behind it)");
	is(run_mode("--cross-rcu"), 0, "likewise a put by a thread still running");
	if (fork_children_untestable())
		skip("fork during the exit: %s", fork_children_untestable());
	else
		is(run_mode("--fork-other"), 0,
		   "a child forked during the exit by another thread keeps its managed refs managed");
	is(run_mode("--exit-from-callback"), 0,
	   "exit() from a callback marks no exit: a worker's kill waits for nothing");
	is(run_mode("--rcu-exit-from-reclaimer"), 0,
	   "the exiting thread's percpu_rcuref @release never runs beside the reclaimer's callbacks");
	is(run_mode("--stress"), 0,
	   "managed refs in use by workers through the exit: each released once");

	/* Not at exit: a shutdown leaves a held managed ref managed. */
	percpu_ref_init(&ref, count_release, PERCPU_REF_REL_MANAGED);
	percpuref_shutdown();
	ok(!percpu_ref_is_dying(&ref) && percpu_ref_tryget_live(&ref),
	   "a shutdown, not exit: the held managed ref is still managed and live");
	percpu_ref_put(&ref);	/* the tryget's */
	percpu_ref_put(&ref);	/* the creator's */
	is(nr_released(), 0, "a shutdown, not exit: the last put leaves it to the reclaimer");
	percpu_ref_managed_flush();
	is(nr_released(), 1, "a shutdown, not exit: the next pass released it");
	percpu_ref_exit(&ref);
	return done_testing();
}
