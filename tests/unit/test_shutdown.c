/* SPDX-License-Identifier: MIT */
/*
 * percpuref_shutdown() from two threads at once (or exit() while another
 * thread is in it): it stops the reclaimer and the callback thread, and
 * each used to be joined by both callers, which is undefined (glibc hung
 * in the second pthread_join).  Rounds: start both library threads (a
 * managed ref dropped by its creator, a killed ref), then two threads call
 * shutdown together; every ref must be released and every call return.
 * Under a deadline: a hang fails the test instead of stalling the suite.
 *
 * Then shutdown and exit() while another thread keeps queueing work: each
 * used to drain until no work was left, which never happened while that
 * thread ran, so both hung for ever.  A child per kind of work (a managed
 * ref dropped by its creator, a kill, a kill of a percpu_rcuref) starts a
 * thread that makes and drops such refs in a loop, drops one more itself,
 * calls percpuref_shutdown(), checks that this one was released, and calls
 * exit(); a child that has not exited by its deadline fails.
 *
 * Then a ref whose @release revives it (reinit) and drops it again, so
 * that it is released again and again: managed (a put), killed, and a
 * killed percpu_rcuref.  Each round of a shutdown released it once more,
 * and since the release ran on a library thread or on the shutdown's own,
 * the shutdown took it for its own cascade and went on for ever: exit()
 * never returned (2 of 2 runs, managed; likewise killed).  A child per
 * kind lets it cycle, calls percpuref_shutdown(), which must have released
 * it at least once and return, then exit(), which must return too.
 *
 * But a shutdown must still follow what is finite: a managed ref whose
 * release revives it seven times, all eight releases by one shutdown
 * (under the first rule, a second revival ends the shutdown, it ran 2);
 * and a chain of 24 managed refs, each release dropping the next, while
 * another thread kills and resurrects a ref of its own in a loop (its own
 * work, not the callbacks': counted as theirs, it ended the shutdown
 * after 1 of 24 here, after 5 at exit() in a review's runs).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "child.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_rcuref.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

#define ROUNDS 300
/*
 * Per child: its shutdown and exit (which runs the shutdown twice since
 * 0.3.4: before the older statics' destructors, and after them) wait for
 * a bounded backlog (BUSY_BACKLOG below): 0.2-0.5 s a child, 1.3-1.6 s
 * under ThreadSanitizer, on the idle 2-vCPU guest.  The deadlines leave
 * room for a loaded machine; a hang is what they are for.  Under
 * qemu-user every thread start and exit goes through the emulator's own
 * clone, and a revive child starts the callback thread 95 (killed) to 215
 * (percpu_rcuref) times: 0.2 and 3.5 s there idle, up to 4.5 s under two
 * busy loops, and past 20 s twice in CI beside the kernel's build, the
 * main thread found in pthread_create() each time; its deadline now
 * follows its progress (deadline_follows_revivals()).
 */
#define CHILD_DEADLINE_S (UNDER_TSAN ? 90 : UNDER_EMULATOR ? 60 : 20)
#define DEADLINE_S (120 + 3 * CHILD_DEADLINE_S)
#define CHILD_NOT_RELEASED 2

static pthread_barrier_t round_start, round_end;
static long made, released;	/* atomic */

/* The ref a busy child drops just before its shutdown (below); set once
 * it was released (a busy ref gets its address only after that ref was
 * freed). */
static void *watched;
static bool watched_released;	/* atomic */

static void note_release(void *ref)
{
	if (ref == __atomic_load_n(&watched, __ATOMIC_SEQ_CST))
		__atomic_store_n(&watched_released, true, __ATOMIC_SEQ_CST);
	__atomic_fetch_add(&released, 1, __ATOMIC_SEQ_CST);
}

static void free_ref(struct percpu_ref *ref)
{
	percpu_ref_exit(ref);
	note_release(ref);
	free(ref);
}

/* A managed ref the reclaimer releases, a killed one the callback thread
 * finishes: both threads running. */
static void start_library_threads(void)
{
	struct percpu_ref *managed = malloc(sizeof(*managed)), *killed = malloc(sizeof(*killed));

	if (managed && !percpu_ref_init(managed, free_ref, PERCPU_REF_REL_MANAGED)) {
		__atomic_fetch_add(&made, 1, __ATOMIC_SEQ_CST);
		percpu_ref_put(managed);
	} else {
		free(managed);
	}
	if (killed && !percpu_ref_init(killed, free_ref, 0)) {
		__atomic_fetch_add(&made, 1, __ATOMIC_SEQ_CST);
		percpu_ref_kill(killed);
	} else {
		free(killed);
	}
}

static void *shut_down(void *starter)
{
	int i;

	for (i = 0; i < ROUNDS; i++) {
		if (starter)
			start_library_threads();
		pthread_barrier_wait(&round_start);
		percpuref_shutdown();
		pthread_barrier_wait(&round_end);
	}
	return NULL;
}

static const char *const busy_kinds[] = { "managed", "kill", "rcuref" };
static const char *busy_kind;

/*
 * The busy thread's refs: each release takes BUSY_RELEASE_US, and the
 * thread keeps at most BUSY_BACKLOG of them not yet released, making more
 * as soon as some are.  So the library threads do not catch up (a stop
 * that waited until no work was left, the bug, does not return: the kill
 * child hung 3 of 3 times against such a mutant, plain and under TSan),
 * yet what any one stop waits for is bounded (256 releases, a few tens of
 * ms).  Unbounded and with instant releases, the backlog grew with the
 * child's whole life, by the ratio of the busy thread's speed to the
 * library threads' in each of the three waits (the shutdown, then the
 * exit's two): the kill child took 3 to over 20 s, the rcuref child under
 * ThreadSanitizer 12 to over 90 s, against their deadlines of 20 and 90.
 */
#define BUSY_BACKLOG 256
#define BUSY_RELEASE_US 50

static void free_busy_ref(struct percpu_ref *ref)
{
	usleep(BUSY_RELEASE_US);
	free_ref(ref);
}

static void free_rcuref(struct percpu_rcuref *ref)
{
	usleep(BUSY_RELEASE_US);
	percpu_rcuref_exit(ref);
	note_release(ref);
	free(ref);
}

/* One ref of busy_kind, whose last reference is gone when this returns;
 * the watched one if @watch. */
static void drop_one(bool watch)
{
	if (!strcmp(busy_kind, "rcuref")) {
		struct percpu_rcuref *ref = malloc(sizeof(*ref));

		if (!ref || percpu_rcuref_init(ref, NULL, free_rcuref, 0))
			abort();
		if (watch)
			__atomic_store_n(&watched, ref, __ATOMIC_SEQ_CST);
		percpu_rcuref_kill(ref);
		return;
	}
	struct percpu_ref *ref = malloc(sizeof(*ref));
	bool managed = !strcmp(busy_kind, "managed");

	if (!ref || percpu_ref_init(ref, free_busy_ref, managed ? PERCPU_REF_REL_MANAGED : 0))
		abort();
	if (watch)
		__atomic_store_n(&watched, ref, __ATOMIC_SEQ_CST);
	if (managed)
		percpu_ref_put(ref);
	else
		percpu_ref_kill(ref);
}

static void *keep_dropping(void *arg)
{
	(void)arg;
	for (;;) {
		while (__atomic_load_n(&made, __ATOMIC_SEQ_CST) -
		       __atomic_load_n(&released, __ATOMIC_SEQ_CST) >= BUSY_BACKLOG)
			usleep(10);
		drop_one(false);
		__atomic_fetch_add(&made, 1, __ATOMIC_SEQ_CST);
	}
	return NULL;
}

static struct percpu_ref slow_kill;
static struct percpu_rcuref slow_rcu;

static void slow_ref_release(struct percpu_ref *ref)
{
	(void)ref;
	usleep(20000);
}

static void slow_rcuref_release(struct percpu_rcuref *ref)
{
	(void)ref;
	usleep(50000);
}

static int busy_child(const char *kind)
{
	struct percpu_ref_managed_config config;
	pthread_t busy;

	child_deadline(CHILD_DEADLINE_S);
	busy_kind = kind;
	/* Back-to-back scans: the reclaimer is always busy too. */
	percpu_ref_managed_get_config(&config);
	config.interval_ms = 0;
	percpu_ref_managed_set_config(&config);
	if (pthread_create(&busy, NULL, keep_dropping, NULL))
		return 1;
	usleep(50000);
	/* Pending at the call: released by it, whatever the busy thread does;
	 * behind a slow kill, so that a kill's switch is still queued at the
	 * call, and for a percpu_rcuref behind a slow RCU release too: its
	 * RCU release is queued only once the switch is done (a round that
	 * ran the RCU releases before the switches left it to a thread). */
	if (percpu_ref_init(&slow_kill, slow_ref_release, 0) ||
	    percpu_rcuref_init(&slow_rcu, NULL, slow_rcuref_release, 0))
		return 1;
	percpu_ref_kill(&slow_kill);
	if (!strcmp(kind, "rcuref"))
		percpu_rcuref_kill(&slow_rcu);
	drop_one(true);
	percpuref_shutdown();
	if (!__atomic_load_n(&watched_released, __ATOMIC_SEQ_CST))
		return CHILD_NOT_RELEASED;
	/* The exit hooks run percpuref_shutdown() again. */
	exit(0);
}

static const char *const revive_kinds[] = { "managed", "kill", "rcuref" };
static const char *revive_kind;
static unsigned long revivals;	/* atomic */
static struct percpu_ref reviving;
static struct percpu_rcuref reviving_rcu;

/* Comes back to life each time, with no holder but its owner or manager. */
static void revive(struct percpu_ref *ref)
{
	__atomic_fetch_add(&revivals, 1, __ATOMIC_SEQ_CST);
	percpu_ref_reinit(ref);
	if (!strcmp(revive_kind, "managed"))
		percpu_ref_put(ref);	/* the caller's new reference */
	else
		percpu_ref_kill(ref);
}

static void revive_rcuref(struct percpu_rcuref *ref)
{
	__atomic_fetch_add(&revivals, 1, __ATOMIC_SEQ_CST);
	percpu_ref_reinit(&ref->ref);
	percpu_rcuref_kill(ref);
}

/*
 * A revive child's deadline follows its revivals: pushed back while they
 * rise, it ends a child that made none for CHILD_DEADLINE_S.  Under
 * qemu-user such a child is slow, not hung: every thread start waits for
 * the emulator to set the new host thread up, and with sixteen busy
 * threads on its CPU a child took 43 s, new revivals coming all along; a
 * 20 s deadline then reproduced CI's two failures, stacks and all (a
 * review, 0.4.31).  A shutdown that never stopped reviving would still
 * end at the parent's deadline.
 */
static void *deadline_follows_revivals(void *unused)
{
	unsigned long seen = 0, now;

	(void)unused;
	for (;;) {
		sleep(1);
		now = __atomic_load_n(&revivals, __ATOMIC_SEQ_CST);
		if (now != seen) {
			seen = now;
			child_deadline_rearm(CHILD_DEADLINE_S);
		}
	}
	return NULL;
}

static int revive_child(const char *kind)
{
	unsigned long before;
	pthread_t watcher;

	child_deadline(CHILD_DEADLINE_S);
	if (pthread_create(&watcher, NULL, deadline_follows_revivals, NULL))
		return 1;
	revive_kind = kind;
	if (!strcmp(kind, "rcuref")) {
		if (percpu_rcuref_init(&reviving_rcu, NULL, revive_rcuref, PERCPU_REF_ALLOW_REINIT))
			return 1;
		percpu_rcuref_kill(&reviving_rcu);
	} else if (!strcmp(kind, "managed")) {
		if (percpu_ref_init(&reviving, revive, PERCPU_REF_REL_MANAGED))
			return 1;
		percpu_ref_put(&reviving);
	} else {
		if (percpu_ref_init(&reviving, revive, PERCPU_REF_ALLOW_REINIT))
			return 1;
		percpu_ref_kill(&reviving);
	}
	usleep(20000);
	before = __atomic_load_n(&revivals, __ATOMIC_SEQ_CST);
	percpuref_shutdown();
	if (__atomic_load_n(&revivals, __ATOMIC_SEQ_CST) == before)
		return CHILD_NOT_RELEASED;
	exit(0);
}

#define FINITE_RELEASES 8
#define CHAIN 24
static unsigned long finite_releases;	/* atomic */
static struct percpu_ref revived, chain[CHAIN], toggled;
static bool toggling_stops;	/* atomic */

/* Revived FINITE_RELEASES - 1 times, then left released. */
static void revive_a_few_times(struct percpu_ref *ref)
{
	if (__atomic_add_fetch(&finite_releases, 1, __ATOMIC_SEQ_CST) < FINITE_RELEASES) {
		percpu_ref_reinit(ref);
		percpu_ref_put(ref);
	}
}

/* Each link's release drops the next link's creator reference. */
static void drop_next_link(struct percpu_ref *ref)
{
	size_t i = (size_t)(ref - chain);

	__atomic_fetch_add(&finite_releases, 1, __ATOMIC_SEQ_CST);
	if (i + 1 < CHAIN)
		percpu_ref_put(&chain[i + 1]);
}

static void *kill_and_resurrect(void *arg)
{
	(void)arg;
	while (!__atomic_load_n(&toggling_stops, __ATOMIC_SEQ_CST)) {
		percpu_ref_kill(&toggled);
		percpu_ref_resurrect(&toggled);
	}
	return NULL;
}

/* Exit status: 0, 1 set-up, CHILD_NOT_RELEASED some release not run. */
static int finite_child(const char *kind)
{
	unsigned long want;
	pthread_t toggler;
	size_t i;

	child_deadline(CHILD_DEADLINE_S);
	if (!strcmp(kind, "revivals")) {
		want = FINITE_RELEASES;
		if (percpu_ref_init(&revived, revive_a_few_times, PERCPU_REF_REL_MANAGED))
			return 1;
		percpu_ref_put(&revived);
		percpuref_shutdown();
	} else {
		want = CHAIN;
		/* Held (its count stays 1 or more), atomic: a kill queues
		 * nothing, a resurrect revives it. */
		if (percpu_ref_init(&toggled, NULL, PERCPU_REF_INIT_ATOMIC | PERCPU_REF_ALLOW_REINIT))
			return 1;
		percpu_ref_get(&toggled);
		for (i = 0; i < CHAIN; i++)
			if (percpu_ref_init(&chain[i], drop_next_link, PERCPU_REF_REL_MANAGED))
				return 1;
		if (pthread_create(&toggler, NULL, kill_and_resurrect, NULL))
			return 1;
		usleep(10000);
		percpu_ref_put(&chain[0]);
		percpuref_shutdown();
		__atomic_store_n(&toggling_stops, true, __ATOMIC_SEQ_CST);
		pthread_join(toggler, NULL);
	}
	if (__atomic_load_n(&finite_releases, __ATOMIC_SEQ_CST) != want) {
		printf("# %s: %lu of %lu releases\n", kind,
		       __atomic_load_n(&finite_releases, __ATOMIC_SEQ_CST), want);
		return CHILD_NOT_RELEASED;
	}
	exit(0);
}

int main(int argc, char **argv)
{
	pthread_t a, b;
	size_t i;

	if (argc > 1 && !strncmp(argv[1], "revive-", 7))
		return revive_child(argv[1] + 7);
	if (argc > 1 && !strncmp(argv[1], "finite-", 7))
		return finite_child(argv[1] + 7);
	if (argc > 1)
		return busy_child(argv[1]);
	child_deadline(DEADLINE_S);
	pthread_barrier_init(&round_start, NULL, 2);
	pthread_barrier_init(&round_end, NULL, 2);
	if (!ok(!pthread_create(&a, NULL, shut_down, (void *)1), "first thread started"))
		return done_testing();
	if (!ok(!pthread_create(&b, NULL, shut_down, NULL), "second thread started"))
		return done_testing();	/* the first waits at the barrier: exit ends it */
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	/* Every ref unreferenced before a shutdown is released by it; a hang
	 * is the deadline's to catch. */
	is(__atomic_load_n(&released, __ATOMIC_SEQ_CST), __atomic_load_n(&made, __ATOMIC_SEQ_CST),
	   "%d rounds of two concurrent shutdowns returned, every ref released", ROUNDS);
	for (i = 0; i < sizeof(busy_kinds) / sizeof(busy_kinds[0]); i++)
		is(run_mode(busy_kinds[i]), 0, "shutdown and exit return while another thread "
		   "keeps dropping %s refs", busy_kinds[i]);
	for (i = 0; i < sizeof(revive_kinds) / sizeof(revive_kinds[0]); i++) {
		char mode[32];

		snprintf(mode, sizeof(mode), "revive-%s", revive_kinds[i]);
		is(run_mode(mode), 0, "shutdown releases, and it and exit return, while a %s "
		   "ref's release revives it each time", revive_kinds[i][0] == 'm' ? "managed" :
		   revive_kinds[i][0] == 'k' ? "killed" : "killed percpu_rcuref");
	}
	is(run_mode("finite-revivals"), 0, "one shutdown runs all %d releases of a managed ref "
	   "its release revives %d times", FINITE_RELEASES, FINITE_RELEASES - 1);
	is(run_mode("finite-chain"), 0, "one shutdown releases a chain of %d managed refs while "
	   "another thread kills and resurrects its own ref", CHAIN);
	return done_testing();
}
