/* SPDX-License-Identifier: MIT */
/*
 * Fork torture: the main thread forks at random moments while
 * worker threads keep every kind of library activity going: per-CPU refs
 * switched to atomic and back, killed and reinitialised (the callback
 * thread's batches); managed refs created, used and dropped (the
 * reclaimer's scans and release phases, scan interval 1 ms); percpu_rcuref
 * lookups under read-side sections while entries are killed and replaced
 * (the reclaimer's RCU batches); hcount charges and uncharges.
 *
 * Each child, under a deadline (a hang ends it with SIGALRM), checks:
 *  - percpu_ref_barrier(), percpu_rcuref_barrier(), percpu_ref_managed_flush()
 *    return 0, and percpuref_shutdown() (what exit() runs) completes;
 *  - every ref unreferenced at the fork was released: releases of killed
 *    refs >= kills, of managed refs >= refs dropped (the counters are bumped
 *    after the drop, so the values the child sees are lower bounds), of
 *    percpu_rcurefs >= kills - readers (a reader that held a reference at
 *    the fork never puts it in the child), each less one: a fork does not
 *    wait for a @release a library thread runs, which is then the parent's
 *    alone (the callback thread's for kills, the reclaimer's for the
 *    others, one at a time; none of these releases nests another);
 *  - refs the main thread (the one thread the child keeps) holds come out
 *    exact: its ref counts as many as it took, releases when it drops them,
 *    and its managed refs are released exactly when unreferenced (the one
 *    it dropped before the fork may be the one whose @release the fork cut:
 *    then that ref reached zero, and every worker's managed ref dropped by
 *    then is released; not after a shutdown, which released it before).
 * The child does not touch the hcount tree: a slot lock or tree mutex held
 * by a worker at the fork stays held in the child (hcount has no fork hooks;
 * see docs/hcount.md).  Under ThreadSanitizer the test is skipped (no
 * threads in the child of a threaded process), and says so; under valgrind
 * too (its leak check would flag what the vanished workers held).
 *
 * Under AddressSanitizer no fork lands in an allocation: gcc 12's ASan,
 * unlike glibc's malloc, does not take its allocator's locks around a
 * fork, so a thread inside malloc() at the fork leaves a size-class lock
 * held in the child, and the first allocation there from that class hangs
 * (seen as the child killed by SIGALRM: the library threads the child
 * restarts hung in ASan's own thread start-up, which allocates).  The main
 * thread forks only once every worker has started (ASan's start-up of a
 * thread allocates); under ASan it closes the allocation gate around
 * fork(), and the workers allocate (calloc() and the inits that allocate)
 * inside it, and so does the one @release that frees
 * (robj_release(): a library thread runs a @release with its batch lock
 * released, so a fork may land in it).  The library's own threads
 * otherwise allocate and free only under the batch locks its fork hooks
 * take, and fork waits until a
 * library thread just started is past its start-up (ASan's allocates):
 * every other round the main thread stops them (percpuref_shutdown()) and
 * forks soon after, while the workers' kills and releases start them
 * again.  The plain build forks amid the workers' allocations too.
 *
 * STRESS_SECONDS bounds the run (default 3 s); STRESS_SEED replays choices.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <urcu/compiler.h>

#include <percpuref/hcount.h>
#include <percpuref/managed.h>
#include <percpuref/percpu_rcuref.h>
#include <percpuref/percpu_ref.h>

#include "child.h"
#include "fork_gate.h"
#include "rnd.h"
#include "tap.h"

#define SWITCHERS 2
#define MANAGERS 2
#define READERS 2
#define RCU_SLOTS 8
#define WORKERS 8	/* main()'s fns[]: worker threads */
#define CHILD_DEADLINE_S 20

static int stop;			/* atomic */
static unsigned long kills, kill_releases;	/* atomic: per-CPU refs */
static unsigned long dropped, managed_releases;	/* atomic: managed refs */
static unsigned long rcu_kills, rcu_releases;	/* atomic: percpu_rcurefs */

static unsigned int workers_started;	/* atomic */

static void worker_started(void)
{
	/* Release: orders the worker's start-up allocations before a fork
	 * that saw the count (fork_once()). */
	__atomic_fetch_add(&workers_started, 1, __ATOMIC_RELEASE);
}

static bool stopping(void)
{
	return __atomic_load_n(&stop, __ATOMIC_RELAXED);
}

static void bump(unsigned long *counter)
{
	/* Release: a child that sees the count sees the drop before it. */
	__atomic_fetch_add(counter, 1, __ATOMIC_RELEASE);
}

static unsigned long read_count(unsigned long *counter)
{
	return __atomic_load_n(counter, __ATOMIC_ACQUIRE);
}

/* A managed ref the caller holds one reference to. */
static int make_managed(struct percpu_ref *ref, percpu_ref_func_t *release)
{
	int err = percpu_ref_init(ref, release, PERCPU_REF_INIT_ATOMIC);

	if (err)
		return err;
	/* The manager takes its own; the initial one stays the caller's. */
	return percpu_ref_switch_to_managed(ref);
}

/* ---- switchers: mode switches, kills, reinit ---- */

/* Every other one sleeps 300 us, so that forks land while the callback
 * thread is paused in a @release, its batch's other items cut off: the
 * child must run them.  Without the sleep none of 12 children found such
 * items, and a child that dropped them passed 3 of 3 runs; with it 12 of
 * 70 did, and that child fails. */
static void count_kill_release(struct percpu_ref *ref)
{
	static unsigned int calls;	/* atomic */

	(void)ref;
	if (__atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED) % 2 == 0)
		usleep(300);
	bump(&kill_releases);
}

static void *switcher(void *arg)
{
	unsigned int seed = (unsigned int)(uintptr_t)arg;
	struct percpu_ref ref;
	int i, err;

	allocating_begin();
	err = percpu_ref_init(&ref, count_kill_release, PERCPU_REF_ALLOW_REINIT);
	allocating_end();
	worker_started();	/* a failed one too: the forker waits for all */
	if (err)
		return (void *)1;
	while (!stopping()) {
		for (i = 0; i < 50; i++) {
			percpu_ref_get(&ref);
			percpu_ref_put(&ref);
		}
		switch (rnd(&seed) % 4) {
		case 0:
			percpu_ref_switch_to_atomic(&ref, NULL);
			percpu_ref_switch_to_percpu(&ref);
			break;
		case 1:
			percpu_ref_switch_to_atomic_sync(&ref);
			percpu_ref_switch_to_percpu(&ref);
			break;
		default:
			percpu_ref_kill(&ref);
			bump(&kills);
			while (!percpu_ref_is_zero(&ref))
				sched_yield();
			percpu_ref_reinit(&ref);
			break;
		}
	}
	percpu_ref_kill(&ref);
	bump(&kills);
	percpu_ref_barrier();
	percpu_ref_exit(&ref);
	return NULL;
}

/* ---- managers: managed refs made, used, dropped ---- */

struct mobj {
	struct percpu_ref ref;
	struct mobj *next;	/* the creating thread's list */
};

static void count_managed_release(struct percpu_ref *ref)
{
	(void)ref;
	bump(&managed_releases);
}

static void *manager(void *arg)
{
	unsigned int seed = (unsigned int)(uintptr_t)arg;
	struct mobj *list = NULL, *o;
	int i;

	worker_started();

	while (!stopping()) {
		allocating_begin();
		o = calloc(1, sizeof(*o));
		if (!o || make_managed(&o->ref, count_managed_release)) {
			free(o);
			allocating_end();
			return (void *)1;
		}
		allocating_end();
		for (i = (int)(rnd(&seed) % 100); i > 0; i--) {
			percpu_ref_get(&o->ref);
			percpu_ref_put(&o->ref);
		}
		percpu_ref_put(&o->ref);	/* now only the manager's */
		bump(&dropped);
		o->next = list;
		list = o;
		if (rnd(&seed) % 8 == 0)
			usleep(100);
	}
	percpu_ref_managed_flush();
	while ((o = list)) {
		list = o->next;
		percpu_ref_exit(&o->ref);
		free(o);
	}
	return NULL;
}

/* ---- percpu_rcuref: readers look up, one thread replaces ---- */

struct robj {
	struct percpu_rcuref ref;
	int slot;
};

static struct robj *table[RCU_SLOTS];	/* RCU-protected: atomic pointers */

static void robj_unpublish(struct percpu_rcuref *ref)
{
	struct robj *o = caa_container_of(ref, struct robj, ref);
	struct robj *expected = o;

	/* Release, as every publication: pairs with the readers' acquire. */
	__atomic_compare_exchange_n(&table[o->slot], &expected, NULL, false, __ATOMIC_RELEASE,
				    __ATOMIC_RELAXED);
}

static void robj_release(struct percpu_rcuref *ref)
{
	struct robj *o = caa_container_of(ref, struct robj, ref);

	/* It frees, on the reclaimer, which a fork no longer waits for in
	 * a @release: gated like the workers' allocations (ASan, fork_gate.h). */
	allocating_begin();
	percpu_rcuref_exit(ref);
	free(o);
	allocating_end();
	bump(&rcu_releases);
}

static void *reader(void *arg)
{
	unsigned int seed = (unsigned int)(uintptr_t)arg;
	struct robj *o;

	worker_started();

	while (!stopping()) {
		percpu_rcuref_read_lock();
		o = __atomic_load_n(&table[rnd(&seed) % RCU_SLOTS], __ATOMIC_ACQUIRE);
		if (o && percpu_rcuref_tryget(&o->ref)) {
			percpu_rcuref_read_unlock();
			percpu_rcuref_put(&o->ref);
		} else {
			percpu_rcuref_read_unlock();
		}
	}
	return NULL;
}

static void *replacer(void *arg)
{
	unsigned int seed = (unsigned int)(uintptr_t)arg;
	struct robj *o, *old;
	int slot;

	worker_started();

	while (!stopping()) {
		slot = (int)(rnd(&seed) % RCU_SLOTS);
		allocating_begin();
		o = calloc(1, sizeof(*o));
		if (!o || percpu_rcuref_init(&o->ref, robj_unpublish, robj_release, 0)) {
			free(o);
			allocating_end();
			return (void *)1;
		}
		allocating_end();
		o->slot = slot;
		old = __atomic_exchange_n(&table[slot], o, __ATOMIC_ACQ_REL);
		if (old) {
			percpu_rcuref_kill(&old->ref);
			bump(&rcu_kills);
		}
		usleep(200);
	}
	for (slot = 0; slot < RCU_SLOTS; slot++) {
		old = __atomic_exchange_n(&table[slot], NULL, __ATOMIC_ACQ_REL);
		if (old) {
			percpu_rcuref_kill(&old->ref);
			bump(&rcu_kills);
		}
	}
	percpu_rcuref_barrier();
	return NULL;
}

/* ---- hcount: charges and uncharges ---- */

static struct hcount_tree *tree;

static void *charger(void *arg)
{
	unsigned int seed = (unsigned int)(uintptr_t)arg;
	long held = 0;

	worker_started();

	while (!stopping()) {
		if (rnd(&seed) % 2 && hcount_charge(hcount_tree_root(tree), 0, 1) == 0)
			held++;
		else if (held && hcount_uncharge(hcount_tree_root(tree), 0, 1) == 0)
			held--;
	}
	while (held--)
		hcount_uncharge(hcount_tree_root(tree), 0, 1);
	return NULL;
}

/* ---- the forker (main thread) and its children ---- */

struct own {
	struct percpu_ref plain;	/* per-CPU, main thread's references */
	struct percpu_ref kept, freed;	/* managed: kept referenced, freed not */
	int releases[3];		/* atomic */
};

static void own_plain_release(struct percpu_ref *ref)
{
	struct own *o = caa_container_of(ref, struct own, plain);

	__atomic_fetch_add(&o->releases[0], 1, __ATOMIC_RELEASE);
}

static void own_kept_release(struct percpu_ref *ref)
{
	struct own *o = caa_container_of(ref, struct own, kept);

	__atomic_fetch_add(&o->releases[1], 1, __ATOMIC_RELEASE);
}

static void own_freed_release(struct percpu_ref *ref)
{
	struct own *o = caa_container_of(ref, struct own, freed);

	__atomic_fetch_add(&o->releases[2], 1, __ATOMIC_RELEASE);
}

static int releases(struct own *o, int i)
{
	return __atomic_load_n(&o->releases[i], __ATOMIC_ACQUIRE);
}

/* A @release a library thread was running at the fork (see above). */
#define IN_PROGRESS 1

/* Runs in the child: 0 when every check holds, else the first that failed. */
static int child_checks(struct own *o, int held, bool drained)
{
	unsigned long k = read_count(&kills), d = read_count(&dropped);
	unsigned long rk = read_count(&rcu_kills);

	child_deadline(CHILD_DEADLINE_S);
	if (percpu_ref_barrier() || percpu_rcuref_barrier() || percpu_ref_managed_flush())
		return 2;
	if (read_count(&kill_releases) + IN_PROGRESS < k)
		return 3;
	if (read_count(&managed_releases) + IN_PROGRESS < d)
		return 4;
	if (read_count(&rcu_releases) + READERS + IN_PROGRESS < rk)
		return 5;
	/* o->freed was dropped before the fork.  A shutdown before the fork
	 * released it in the parent (its pass releases every ref only the
	 * manager holds).  Otherwise it is released once, unless its @release
	 * is the one a fork cut: then the ref did reach zero, and no worker's
	 * @release was cut. */
	if (releases(o, 1) != 0 || releases(o, 2) > 1 ||
	    (releases(o, 2) == 0 && (drained || !percpu_ref_is_zero(&o->freed) ||
				     read_count(&managed_releases) < d)))
		return 6;
	/* The main thread's references are all there, and only those. */
	percpu_ref_kill(&o->plain);
	percpu_ref_barrier();
	if (releases(o, 0) != 0)
		return 7;
	percpu_ref_put_many(&o->plain, (unsigned long)held);
	if (releases(o, 0) != 1)
		return 8;
	percpu_ref_put(&o->kept);
	if (percpu_ref_managed_flush() || releases(o, 1) != 1)
		return 9;
	/* What exit() runs (the library's exit hook) must complete too.  The
	 * child then leaves with _exit(): the refs the vanished workers held
	 * are leaked here by design, and the leak checker would say so. */
	percpuref_shutdown();
	return 0;
}

static int fork_once(unsigned int *seed, int round)
{
	struct own o;
	int held = 1 + (int)(rnd(seed) % 5), i, status, ret = 0;
	bool drained = rnd(seed) % 2, overdue;
	pid_t pid;

	memset(&o, 0, sizeof(o));
	if (percpu_ref_init(&o.plain, own_plain_release, 0) ||
	    make_managed(&o.kept, own_kept_release) || make_managed(&o.freed, own_freed_release))
		return -1;
	for (i = 0; i < held; i++)
		percpu_ref_get(&o.plain);
	percpu_ref_put(&o.freed);
	/* Every other round the library's threads stop, and the workers start
	 * them again while the fork may come. */
	if (drained) {
		thread_ending_begin();	/* under qemu-user: fork_gate.h */
		percpuref_shutdown();
		thread_ending_end();
		usleep(rnd(seed) % 200);
	} else {
		usleep(rnd(seed) % 3000);
	}
	while (__atomic_load_n(&workers_started, __ATOMIC_ACQUIRE) < WORKERS)
		sched_yield();
	fork_begin();
	pid = fork();
	if (pid == 0) {
		/* The child's @release that frees takes the gate too. */
		fork_end_child();
		_exit(child_checks(&o, held, drained));
	}
	fork_end();
	if (pid < 0 ||
	    waitpid_within(pid, &status, CHILD_DEADLINE_S + CHILD_GRACE_S, &overdue) != pid) {
		ret = -1;
	} else if (overdue) {
		printf("# round %d: child still running %d s after its deadline: killed\n", round,
		       CHILD_GRACE_S);
		ret = 1;
	} else if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		printf("# round %d: child %s %d\n", round,
		       WIFEXITED(status) ? "failed check" : "killed by signal",
		       WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
		ret = 1;
	}
	/* The parent's copies are untouched by the child. */
	percpu_ref_put(&o.kept);
	percpu_ref_put_many(&o.plain, (unsigned long)held);
	percpu_ref_kill(&o.plain);
	percpu_ref_managed_flush();
	percpu_ref_barrier();
	if (releases(&o, 0) != 1 || releases(&o, 1) != 1 || releases(&o, 2) != 1)
		ret = ret ? ret : 1;
	percpu_ref_exit(&o.plain);
	percpu_ref_exit(&o.kept);
	percpu_ref_exit(&o.freed);
	return ret;
}

int main(void)
{
	struct percpu_ref_managed_config fast = { 1, PERCPU_REF_MANAGED_MAX_PER_SCAN,
						  PERCPU_REF_SCAN_BATCHED };
	void *(*fns[])(void *) = { switcher, switcher, manager, manager, reader, reader,
				   replacer, charger };
	_Static_assert(sizeof(fns) / sizeof(fns[0]) == WORKERS, "WORKERS counts fns[]");
	pthread_t threads[WORKERS];
	const char *seed_env = getenv("STRESS_SEED");
	unsigned int seed = seed_env ? (unsigned int)strtoul(seed_env, NULL, 0)
				     : (unsigned int)now_ns();
	double seconds = stress_seconds(3);
	uint64_t end;
	int rounds = 0, failed = 0;
	size_t i;
	void *ret;

#if defined(__SANITIZE_THREAD__)
	printf("# skipped: ThreadSanitizer cannot run threads in the child of a threaded "
	       "process\n");
	ok(1, "fork torture skipped under ThreadSanitizer");
	return done_testing();
#endif
	if (UNDER_VALGRIND) {
		/* Its leak check would fail every child: the refs the vanished
		 * workers held are leaked there by design.  Plain and ASan
		 * runs cover it. */
		printf("# skipped under valgrind: children leak by design\n");
		ok(1, "fork torture skipped under valgrind");
		return done_testing();
	}
	printf("# seed %u, %.1f s\n", seed, seconds);
	fflush(stdout);		/* not again in every child */
	percpu_ref_managed_set_config(&fast);
	if (hcount_tree_create(&tree, 1, HCOUNT_BATCH_DEFAULT, NULL))
		return 1;
	for (i = 0; i < sizeof(fns) / sizeof(fns[0]); i++)
		pthread_create(&threads[i], NULL, fns[i], (void *)(uintptr_t)(seed + i));
	end = now_ns() + (uint64_t)(seconds * 1e9);
	/* Three rounds at least, however slow the machine: a shutdown may
	 * take a while when managed refs keep coming. */
	while ((now_ns() < end || rounds < 3) && !failed) {
		int r = fork_once(&seed, rounds);

		if (r < 0) {
			printf("# round %d: could not set up (%s)\n", rounds, strerror(errno));
			failed = 1;
		}
		failed |= r != 0;
		rounds++;
	}
	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	for (i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
		pthread_join(threads[i], &ret);
		failed |= ret != NULL;
	}
	ok(!failed, "%d forks amid switches, kills, scans, releases, RCU lookups, charges: every "
	   "child's barrier, flush, exit complete, releases and counts exact", rounds);
	percpu_ref_managed_flush();
	is(read_count(&kill_releases), read_count(&kills), "parent: every kill released");
	is(read_count(&managed_releases), read_count(&dropped),
	   "parent: every dropped managed ref released");
	is(read_count(&rcu_releases), read_count(&rcu_kills), "parent: every rcuref released");
	hcount_tree_destroy(tree);
	return done_testing();
}
