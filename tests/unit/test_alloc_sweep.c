/* SPDX-License-Identifier: MIT */
/*
 * Allocation-failure sweep: each scenario below makes every public call
 * that allocates (and the calls around them), and runs once for each N =
 * 1, 2, ... with the library's Nth allocation refused, until a run
 * refuses none: so every allocation the scenario reaches is refused once,
 * whichever call makes it, on whichever thread, without a test aimed at
 * it.  The library's hook (percpuref_fault_fail_nth_alloc()) counts its
 * allocations and its threads' starts; hcount has a hook of its own.  A
 * second sweep refuses the Nth and every one after (memory that runs out:
 * percpuref_fault_fail_from_nth_alloc()), until a call fails.
 *
 * Each run is a forked child of a parent that never calls the library (so
 * each starts it from nothing: its first chunk, its threads' first start),
 * with a deadline: a hang is a failed run, not a hung CI.  In the child,
 * every call that can fail must return 0 or its documented error, an error
 * only when an allocation was refused meanwhile, and then succeed when
 * called again with memory back; every @release (and @unpublish, confirm)
 * runs exactly once in the end; every per-CPU counter is back in the
 * allocator.  The child exits through exit(), so under ASan
 * LeakSanitizer checks it for leaks too.  Exit status: CHILD_REFUSED
 * (passed, an allocation refused), CHILD_CLEAN (passed, none refused:
 * the sweep of that scenario is complete), 1 (a check failed; the child
 * says which on stdout), 128 + SIGALRM (hung).  Skipped where fork
 * children cannot be tested (fork_children_untestable()).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include "internal.h"
#include "percpuref/hcount.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_rcuref.h"
#include "percpuref/percpu_ref.h"
#include "child.h"
#include "tap.h"

/* src/hcount.c: the allocation after this many more fails (-1: off). */
extern long __hcount_fault_alloc;

#define CHILD_DEADLINE_S 20
#define CHILD_REFUSED 0
#define CHILD_CLEAN 10
/* More runs than any scenario needs: a sweep that does not end fails. */
#define MAX_N 200

static const char *scenario_name;
static long scenario_n;
static bool hcount_armed;
/* From the Nth on every allocation and thread start is refused, until a
 * call fails (memory runs out), rather than the Nth alone. */
static bool sticky;

static void __attribute__((format(printf, 2, 3))) fail_at(int line, const char *fmt, ...)
{
	va_list ap;

	printf("# %s, N = %ld%s, line %d: ", scenario_name, scenario_n,
	       sticky ? " and on" : "", line);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	_exit(1);
}

#define CHECK(cond, ...)                                \
	do {                                            \
		if (!(cond))                            \
			fail_at(__LINE__, __VA_ARGS__); \
	} while (0)

/* Allocations refused so far in this child, by either hook. */
static unsigned long refused_now(void)
{
	/* Relaxed: hcount's hook is only ever used from this thread. */
	return percpuref_fault_refused_allocs() +
	       (hcount_armed && __atomic_load_n(&__hcount_fault_alloc, __ATOMIC_RELAXED) == -1);
}

/* Memory is back (hcount's hook disarms at its refusal). */
static void disarm(void)
{
	percpuref_fault_fail_nth_alloc(0);
}

/*
 * Runs @expr, which returns 0 or a negative errno.  An error must be one
 * of @e1, @e2, come with a refused allocation, and the call made again
 * once memory is back must succeed.
 */
#define RETRYING(expr, e1, e2)                                                                 \
	do {                                                                                   \
		unsigned long before_ = refused_now();                                         \
		int ret_ = (expr);                                                             \
		if (ret_) {                                                                    \
			CHECK(ret_ == (e1) || ret_ == (e2), "%s: %d (%s), not a documented "  \
			      "error", #expr, ret_, strerror(-ret_));                          \
			CHECK(refused_now() != before_, "%s: %d (%s) with no allocation "      \
			      "refused", #expr, ret_, strerror(-ret_));                        \
			disarm();                                                              \
			ret_ = (expr);                                                         \
			CHECK(ret_ == 0, "%s again, after a refusal: %d (%s)", #expr, ret_,    \
			      strerror(-ret_));                                                \
		}                                                                              \
	} while (0)

/* A call that can only succeed here (-errno, or errno as pthread_*() return it). */
#define MUST(expr)                                                                      \
	do {                                                                            \
		int ret_ = (expr);                                                      \
		CHECK(ret_ == 0, "%s: %d (%s)", #expr, ret_, strerror(ret_ < 0 ? -ret_ : ret_)); \
	} while (0)

struct object {
	struct percpu_ref ref;
	int releases;		/* atomic: callbacks run on library threads */
	int confirms;
	unsigned int flags;
};

static int count_of(int *p)
{
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static void bump(int *p)
{
	/* Release: read by the checks after a barrier or flush. */
	__atomic_fetch_add(p, 1, __ATOMIC_RELEASE);
}

static void obj_release(struct percpu_ref *ref)
{
	bump(&caa_container_of(ref, struct object, ref)->releases);
}

static void obj_confirm(struct percpu_ref *ref)
{
	bump(&caa_container_of(ref, struct object, ref)->confirms);
}

/* percpu_ref_init(), where a refusal must leave the ref exitable. */
static int init_obj(struct object *o, unsigned int flags)
{
	int ret = percpu_ref_init(&o->ref, obj_release, flags);

	o->flags = flags;
	if (ret)
		percpu_ref_exit(&o->ref);	/* allowed, does nothing */
	return ret;
}

static void flush_all(void)
{
	MUST(percpu_ref_barrier());
	RETRYING(percpu_ref_managed_flush(), -ENOMEM, -ENOMEM);
	MUST(percpu_ref_barrier());
}

/* A long interval: scans only when a flush asks, so the count of
 * allocations a run makes is the same from run to run. */
static void quiet_reclaimer(void)
{
	struct percpu_ref_managed_config c;

	percpu_ref_managed_get_config(&c);
	c.interval_ms = PERCPU_REF_MANAGED_INTERVAL_MAX_MS;
	MUST(percpu_ref_managed_set_config(&c));
}

/* Every flag combination init takes, each driven to its release. */
static void scenario_init_flags(void)
{
	static const unsigned int flags[] = {
		0,
		PERCPU_REF_INIT_ATOMIC,
		PERCPU_REF_INIT_DEAD,
		PERCPU_REF_ALLOW_REINIT,
		PERCPU_REF_INIT_ATOMIC | PERCPU_REF_ALLOW_REINIT,
		PERCPU_REF_INIT_DEAD | PERCPU_REF_ALLOW_REINIT,
		PERCPU_REF_REL_MANAGED,
		PERCPU_REF_INIT_ATOMIC | PERCPU_REF_REL_MANAGED,
		PERCPU_REF_INIT_DEAD | PERCPU_REF_REL_MANAGED,
	};
	enum { NR = sizeof(flags) / sizeof(flags[0]) };
	struct object o[NR];
	unsigned int i;

	memset(o, 0, sizeof(o));
	for (i = 0; i < NR; i++)
		RETRYING(init_obj(&o[i], flags[i]), -ENOMEM, -ENOMEM);
	for (i = 0; i < NR; i++) {
		struct percpu_ref *ref = &o[i].ref;

		if (o[i].flags & PERCPU_REF_INIT_DEAD) {
			CHECK(percpu_ref_is_zero(ref), "INIT_DEAD ref %u not zero", i);
			percpu_ref_reinit(ref);
		}
		percpu_ref_get(ref);
		percpu_ref_put(ref);
		if (o[i].flags & PERCPU_REF_REL_MANAGED)
			percpu_ref_put(ref);	/* the manager's is left */
		else
			percpu_ref_kill(ref);
	}
	flush_all();
	for (i = 0; i < NR; i++) {
		CHECK(count_of(&o[i].releases) == 1, "ref %u (flags %#x): %d releases", i,
		      o[i].flags, count_of(&o[i].releases));
		percpu_ref_exit(&o[i].ref);
	}
}

/* Every mode call on one ref, back and forth, then reinit and resurrect. */
static void scenario_switches(void)
{
	struct object o = { 0 };
	struct percpu_ref *ref = &o.ref;

	RETRYING(init_obj(&o, PERCPU_REF_ALLOW_REINIT), -ENOMEM, -ENOMEM);
	percpu_ref_switch_to_atomic(ref, obj_confirm);
	percpu_ref_switch_to_atomic_sync(ref);
	CHECK(count_of(&o.confirms) == 1, "switch_to_atomic: %d confirms", count_of(&o.confirms));
	percpu_ref_switch_to_percpu(ref);
	RETRYING(percpu_ref_switch_to_managed(ref), -ENOMEM, -ENOMEM);
	percpu_ref_get(ref);
	flush_all();
	CHECK(count_of(&o.releases) == 0, "managed and held: released");
	RETRYING(percpu_ref_switch_to_unmanaged(ref), -ENOMEM, -ENOMEM);
	percpu_ref_put(ref);
	percpu_ref_kill_and_confirm(ref, obj_confirm);
	MUST(percpu_ref_barrier());
	CHECK(count_of(&o.confirms) == 2, "kill_and_confirm: %d confirms", count_of(&o.confirms));
	CHECK(count_of(&o.releases) == 1, "kill: %d releases", count_of(&o.releases));

	percpu_ref_reinit(ref);
	percpu_ref_get(ref);
	percpu_ref_kill(ref);
	percpu_ref_resurrect(ref);
	percpu_ref_put(ref);
	MUST(percpu_ref_barrier());
	CHECK(count_of(&o.releases) == 1, "resurrected: %d releases", count_of(&o.releases));
	percpu_ref_switch_to_atomic_sync(ref);
	percpu_ref_kill(ref);
	MUST(percpu_ref_barrier());
	CHECK(count_of(&o.releases) == 2, "reinit, kill: %d releases", count_of(&o.releases));
	percpu_ref_exit(ref);
}

/* Kills finished by polling threads: this one and a second one. */
static void poll_own_kills(const char *who)
{
	struct object o[3];
	unsigned int i;
	int ret;

	memset(o, 0, sizeof(o));
	RETRYING(percpu_ref_poll_register(), -ENOMEM, -EAGAIN);
	for (i = 0; i < 3; i++)
		RETRYING(init_obj(&o[i], 0), -ENOMEM, -ENOMEM);
	percpu_ref_kill(&o[0].ref);
	percpu_ref_kill_and_confirm(&o[1].ref, obj_confirm);
	percpu_ref_switch_to_atomic(&o[2].ref, obj_confirm);
	while ((ret = percpu_ref_poll(PERCPU_REF_POLL_WAIT)) > 0)
		;
	CHECK(ret == 0, "%s: poll: %d", who, ret);
	CHECK(count_of(&o[0].releases) == 1 && count_of(&o[1].releases) == 1 &&
	      count_of(&o[1].confirms) == 1 && count_of(&o[2].confirms) == 1,
	      "%s: polled: releases %d %d, confirms %d %d", who, count_of(&o[0].releases),
	      count_of(&o[1].releases), count_of(&o[1].confirms), count_of(&o[2].confirms));
	MUST(percpu_ref_poll_unregister());
	percpu_ref_kill(&o[2].ref);	/* the callback thread's */
	MUST(percpu_ref_barrier());
	CHECK(count_of(&o[2].releases) == 1, "%s: %d releases after the barrier", who,
	      count_of(&o[2].releases));
	for (i = 0; i < 3; i++)
		percpu_ref_exit(&o[i].ref);
}

static struct object left_queued[2];

/* Then a kill queued and never polled: its exit hands it over. */
static void *second_poller(void *arg)
{
	(void)arg;
	poll_own_kills("second thread");
	RETRYING(percpu_ref_poll_register(), -ENOMEM, -EAGAIN);
	percpu_ref_kill(&left_queued[0].ref);
	return NULL;
}

static void scenario_poll(void)
{
	pthread_t t;

	RETRYING(init_obj(&left_queued[0], 0), -ENOMEM, -ENOMEM);
	RETRYING(init_obj(&left_queued[1], 0), -ENOMEM, -ENOMEM);
	RETRYING(percpu_ref_poll_register(), -ENOMEM, -EAGAIN);
	/* A second poller struct while this thread holds the first. */
	MUST(pthread_create(&t, NULL, second_poller, NULL));
	MUST(pthread_join(t, NULL));
	/* Queued here, handed over by the unregister. */
	percpu_ref_kill(&left_queued[1].ref);
	MUST(percpu_ref_poll_unregister());
	MUST(percpu_ref_barrier());
	CHECK(count_of(&left_queued[0].releases) == 1 && count_of(&left_queued[1].releases) == 1,
	      "kills left queued at exit, at unregister: %d, %d releases",
	      count_of(&left_queued[0].releases), count_of(&left_queued[1].releases));
	percpu_ref_exit(&left_queued[0].ref);
	percpu_ref_exit(&left_queued[1].ref);
	/* Its struct free again: taken back, then released by the unregister. */
	poll_own_kills("main thread");
}

/*
 * A fork with the library's threads running: the child's hooks start
 * them again (or cannot), and both processes go on with their copies of
 * the refs; the hook's count goes on in each.
 */
static void fork_finish(struct object *o, const char *who)
{
	unsigned int i;

	percpu_ref_kill(&o[2].ref);
	percpu_ref_put(&o[3].ref);
	flush_all();
	for (i = 0; i < 4; i++) {
		CHECK(count_of(&o[i].releases) == 1, "%s: ref %u: %d releases", who, i,
		      count_of(&o[i].releases));
		percpu_ref_exit(&o[i].ref);
	}
}

static void scenario_fork(void)
{
	struct object o[4];
	pid_t pid;

	memset(o, 0, sizeof(o));
	RETRYING(init_obj(&o[0], 0), -ENOMEM, -ENOMEM);
	RETRYING(init_obj(&o[1], PERCPU_REF_REL_MANAGED), -ENOMEM, -ENOMEM);
	RETRYING(init_obj(&o[2], 0), -ENOMEM, -ENOMEM);
	RETRYING(init_obj(&o[3], PERCPU_REF_REL_MANAGED), -ENOMEM, -ENOMEM);
	percpu_ref_kill(&o[0].ref);
	percpu_ref_put(&o[1].ref);
	flush_all();
	fflush(stdout);
	pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		scenario_name = "fork (its child)";
		fork_finish(o, "child");
		percpuref_shutdown();
		fflush(stdout);
		/* Not exit(): LeakSanitizer in the child of a threaded process
		 * tries to stop the parent's threads ("not suspended. False
		 * leaks are possible"); the parent runs the same code. */
		_exit(0);
	}
	CHECK(wait_child(pid) == 0, "fork's child failed");
	fork_finish(o, "parent");
}

struct robj {
	struct percpu_rcuref ref;
	int unpublished, releases;
	unsigned int flags;
};

static void robj_unpublish(struct percpu_rcuref *ref)
{
	bump(&caa_container_of(ref, struct robj, ref)->unpublished);
}

static void robj_release(struct percpu_rcuref *ref)
{
	struct robj *o = caa_container_of(ref, struct robj, ref);

	/* The documented pattern: exit from @release. */
	percpu_rcuref_exit(ref);
	bump(&o->releases);
}

static int rinit(struct robj *o, unsigned int flags)
{
	int ret = percpu_rcuref_init(&o->ref, robj_unpublish, robj_release, flags);

	o->flags = flags;
	if (ret)
		percpu_rcuref_exit(&o->ref);
	return ret;
}

/* percpu_rcuref killed, managed at init, switched to managed, switched
 * back and killed. */
static void scenario_rcuref(void)
{
	struct robj o[4];
	unsigned int i;

	memset(o, 0, sizeof(o));
	RETRYING(rinit(&o[0], 0), -ENOMEM, -ENOMEM);
	RETRYING(rinit(&o[1], PERCPU_REF_REL_MANAGED), -ENOMEM, -ENOMEM);
	RETRYING(rinit(&o[2], PERCPU_REF_ALLOW_REINIT), -ENOMEM, -ENOMEM);
	RETRYING(rinit(&o[3], PERCPU_REF_REL_MANAGED), -ENOMEM, -ENOMEM);
	RETRYING(percpu_rcuref_switch_to_managed(&o[2].ref), -ENOMEM, -ENOMEM);
	percpu_rcuref_kill(&o[0].ref);
	percpu_rcuref_put(&o[1].ref);
	percpu_rcuref_put(&o[2].ref);
	RETRYING(percpu_rcuref_switch_to_unmanaged(&o[3].ref), -ENOMEM, -ENOMEM);
	percpu_rcuref_kill(&o[3].ref);
	MUST(percpu_rcuref_barrier());
	RETRYING(percpu_ref_managed_flush(), -ENOMEM, -ENOMEM);
	MUST(percpu_rcuref_barrier());
	for (i = 0; i < 4; i++)
		CHECK(count_of(&o[i].unpublished) == 1 && count_of(&o[i].releases) == 1,
		      "rcuref %u (flags %#x): %d unpublished, %d releases", i, o[i].flags,
		      count_of(&o[i].unpublished), count_of(&o[i].releases));
}

/*
 * Managed refs: released by flushes, one released and reinitialised (back
 * under management), one exited while listed (its node left to the
 * reclaimer), one still held at the end (shutdown keeps it).
 */
static void scenario_managed(void)
{
	struct object o[4];
	unsigned int i;

	memset(o, 0, sizeof(o));
	RETRYING(init_obj(&o[0], PERCPU_REF_REL_MANAGED), -ENOMEM, -ENOMEM);
	RETRYING(init_obj(&o[1], PERCPU_REF_ALLOW_REINIT), -ENOMEM, -ENOMEM);
	RETRYING(init_obj(&o[2], PERCPU_REF_REL_MANAGED), -ENOMEM, -ENOMEM);
	RETRYING(init_obj(&o[3], PERCPU_REF_REL_MANAGED), -ENOMEM, -ENOMEM);
	RETRYING(percpu_ref_switch_to_managed(&o[1].ref), -ENOMEM, -ENOMEM);
	percpu_ref_put(&o[0].ref);
	percpu_ref_put(&o[1].ref);
	percpu_ref_exit(&o[2].ref);	/* held: never released */
	flush_all();
	CHECK(count_of(&o[0].releases) == 1 && count_of(&o[1].releases) == 1 &&
	      count_of(&o[2].releases) == 0 && count_of(&o[3].releases) == 0,
	      "first flush: releases %d %d %d %d", count_of(&o[0].releases),
	      count_of(&o[1].releases), count_of(&o[2].releases), count_of(&o[3].releases));
	percpu_ref_reinit(&o[0].ref);	/* managed again, count 2 */
	percpu_ref_put(&o[0].ref);
	flush_all();
	CHECK(count_of(&o[0].releases) == 2, "reinit, flush: %d releases",
	      count_of(&o[0].releases));
	percpuref_shutdown();
	CHECK(count_of(&o[3].releases) == 0, "shutdown released a held ref");
	percpu_ref_put(&o[3].ref);
	flush_all();
	CHECK(count_of(&o[3].releases) == 1, "last ref: %d releases", count_of(&o[3].releases));
	for (i = 0; i < 4; i++)
		percpu_ref_exit(&o[i].ref);
}

/*
 * The allocator's depot: exits that fill both of this thread's magazines
 * (32 slots each, or a build's PERCPUREF_MAGAZINE_SLOTS) and the thread's
 * own depot (PERCPUREF_THREAD_DEPOT_MAGAZINES of them) push one on the
 * shared depot, which grows; the thread then takes as many counters as
 * its own depot held straight from the allocator (no allocation of
 * memory: under ASan, where no impl is kept, an init each would take the
 * sweep past its runs), and inits empty the rest of the cache (4 and 32
 * slots) and pop one from the shared depot.
 */
#define DEPOT_REFS ((3 + PERCPUREF_THREAD_DEPOT_MAGAZINES) * PERCPUREF_MAGAZINE_SLOTS + 4)
#define DEPOT_HELD (PERCPUREF_THREAD_DEPOT_MAGAZINES * PERCPUREF_MAGAZINE_SLOTS)
#define DEPOT_REINITS (PERCPUREF_MAGAZINE_SLOTS + 8)

static struct object depot_objs[DEPOT_REFS];
static uintptr_t depot_held[DEPOT_HELD];

static void depot_setup(void)
{
	unsigned int i;

	for (i = 0; i < DEPOT_REFS; i++)
		MUST(init_obj(&depot_objs[i], 0));
}

static void scenario_depot(void)
{
	unsigned int i;

	for (i = 0; i < DEPOT_REFS; i++)
		percpu_ref_exit(&depot_objs[i].ref);
	for (i = 0; i < DEPOT_HELD; i++)
		if (!(depot_held[i] = percpuref_counter_alloc()))
			fail_at(__LINE__, "a cached counter refused");
	for (i = 0; i < DEPOT_REINITS; i++)
		RETRYING(init_obj(&depot_objs[i], 0), -ENOMEM, -ENOMEM);
	for (i = 0; i < DEPOT_REINITS; i++)
		percpu_ref_exit(&depot_objs[i].ref);
	for (i = 0; i < DEPOT_HELD; i++)
		percpuref_counter_free(depot_held[i]);
}

/*
 * Work left for exit() to finish: a kill, a switch, a kill queued on a
 * polling thread's queue, a managed ref held by the manager alone, and
 * percpu_rcuref ones killed and managed.  Checked by at_exit_check(),
 * which runs after the library's own exit handler.
 */
static struct object exit_objs[4];
static struct robj exit_robjs[2];

static void scenario_exit(void)
{
	RETRYING(init_obj(&exit_objs[0], 0), -ENOMEM, -ENOMEM);
	RETRYING(init_obj(&exit_objs[1], PERCPU_REF_REL_MANAGED), -ENOMEM, -ENOMEM);
	RETRYING(init_obj(&exit_objs[2], PERCPU_REF_ALLOW_REINIT), -ENOMEM, -ENOMEM);
	RETRYING(init_obj(&exit_objs[3], 0), -ENOMEM, -ENOMEM);
	RETRYING(rinit(&exit_robjs[0], 0), -ENOMEM, -ENOMEM);
	RETRYING(rinit(&exit_robjs[1], PERCPU_REF_REL_MANAGED), -ENOMEM, -ENOMEM);
	RETRYING(percpu_ref_poll_register(), -ENOMEM, -EAGAIN);
	percpu_ref_kill(&exit_objs[3].ref);	/* on this thread's queue, never polled */
	percpu_ref_kill(&exit_objs[0].ref);
	percpu_ref_put(&exit_objs[1].ref);
	percpu_ref_switch_to_atomic(&exit_objs[2].ref, obj_confirm);
	percpu_rcuref_kill(&exit_robjs[0].ref);
	percpu_rcuref_put(&exit_robjs[1].ref);
}

static void at_exit_check(void)
{
	unsigned long refused = refused_now();
	unsigned int i;

	for (i = 0; i < 4; i++)
		CHECK(count_of(&exit_objs[i].releases) == (i == 2 ? 0 : 1),
		      "at exit: ref %u: %d releases", i, count_of(&exit_objs[i].releases));
	CHECK(count_of(&exit_objs[2].confirms) == 1, "at exit: the switch not confirmed");
	for (i = 0; i < 2; i++)
		CHECK(count_of(&exit_robjs[i].unpublished) == 1 &&
		      count_of(&exit_robjs[i].releases) == 1,
		      "at exit: rcuref %u: %d unpublished, %d releases", i,
		      count_of(&exit_robjs[i].unpublished), count_of(&exit_robjs[i].releases));
	CHECK(refused <= 1, "%lu allocations refused, armed for one", refused);
	/* _exit() to report whether a refusal came, so the leak check
	 * comes first: the library's exit handler has run. */
#if defined(__SANITIZE_ADDRESS__)
	__lsan_do_leak_check();
#endif
	fflush(stdout);
	_exit(refused ? CHILD_REFUSED : CHILD_CLEAN);
}

/* hcount: trees with and without caches, namespaces, charges. */
static void hcount_run(unsigned int batch)
{
	static const long limits[2] = { 1000, 50 };
	struct hcount_tree *tree = NULL;
	struct hcount_ns *a = NULL, *b = NULL;
	int i;

	RETRYING(hcount_tree_create(&tree, 2, batch, limits), -ENOMEM, -ENOMEM);
	RETRYING(hcount_ns_create(&a, hcount_tree_root(tree), NULL), -ENOMEM, -ENOMEM);
	RETRYING(hcount_ns_create(&b, a, limits), -ENOMEM, -ENOMEM);
	for (i = 0; i < 40; i++) {
		MUST(hcount_charge(b, 0, 3));
		MUST(hcount_charge(a, 1, 1));
	}
	CHECK(hcount_charge(b, 1, 11) == -EDQUOT, "charge over the root's limit");
	MUST(hcount_ns_set_limit(a, 0, 500));
	MUST(hcount_tree_check(tree));
	for (i = 0; i < 40; i++) {
		MUST(hcount_uncharge(b, 0, 3));
		MUST(hcount_uncharge(a, 1, 1));
	}
	MUST(hcount_ns_destroy(b));
	MUST(hcount_ns_destroy(a));
	MUST(hcount_tree_check(tree));
	MUST(hcount_tree_destroy(tree));
}

static void scenario_hcount(void)
{
	hcount_run(HCOUNT_BATCH_DEFAULT);
	hcount_run(HCOUNT_NO_CACHE);
}

enum hook {
	HOOK_LIBRARY,		/* percpuref_fault_*: one refusal, or every one from N */
	HOOK_LIBRARY_ONCE,	/* the same, one refusal only: the waits are not
				 * what it is about (each child costs LeakSanitizer
				 * about 40 ms) */
	HOOK_HCOUNT,		/* __hcount_fault_alloc: one refusal */
};

struct scenario {
	const char *name;
	void (*setup)(void);	/* before the hook is armed */
	void (*run)(void);
	enum hook hook;
	/* Leaves work for exit(); checks it after the library's handler. */
	void (*at_exit)(void);
};

static const struct scenario scenarios[] = {
	{ "init with each flag", NULL, scenario_init_flags, HOOK_LIBRARY_ONCE, NULL },
	{ "switches, kill, reinit, resurrect", NULL, scenario_switches, HOOK_LIBRARY, NULL },
	{ "polling threads", NULL, scenario_poll, HOOK_LIBRARY, NULL },
	{ "percpu_rcuref", NULL, scenario_rcuref, HOOK_LIBRARY, NULL },
	{ "managed, flush, shutdown", NULL, scenario_managed, HOOK_LIBRARY, NULL },
	{ "allocator depot", depot_setup, scenario_depot, HOOK_LIBRARY_ONCE, NULL },
	{ "fork", NULL, scenario_fork, HOOK_LIBRARY, NULL },
	/* Once: with memory short for good, exit's pass tries three times
	 * in 111 ms, then gives up on the managed refs (managed.c, drain()):
	 * seconds per sweep. */
	{ "work left for exit()", NULL, scenario_exit, HOOK_LIBRARY_ONCE, at_exit_check },
	{ "hcount", NULL, scenario_hcount, HOOK_HCOUNT, NULL },
};

static void __attribute__((noreturn)) run_child(const struct scenario *s, long n)
{
	struct percpuref_counter_stats stats;
	unsigned long refused;

	child_deadline(CHILD_DEADLINE_S);
	scenario_name = s->name;
	scenario_n = n;
	/* Before the library's first use, which registers its own: runs
	 * after it. */
	if (s->at_exit && atexit(s->at_exit))
		fail_at(__LINE__, "atexit refused");
	quiet_reclaimer();
	if (s->setup)
		s->setup();
	if (s->hook == HOOK_HCOUNT) {
		hcount_armed = true;
		__atomic_store_n(&__hcount_fault_alloc, n - 1, __ATOMIC_RELAXED);
	} else if (sticky) {
		percpuref_fault_fail_from_nth_alloc(n);
	} else {
		percpuref_fault_fail_nth_alloc(n);
	}
	s->run();
	if (s->at_exit)
		exit(1);	/* the status at_exit() gives, or a failure */
	/* What the threads still do (exit's shutdown too): with the hook
	 * still armed, a refusal there must not lose a release either. */
	percpuref_shutdown();
	disarm();
	refused = refused_now();
	CHECK(sticky || refused <= 1, "%lu allocations refused, armed for one", refused);
	percpuref_get_counter_stats(&stats);
	CHECK(stats.in_use == 0, "%zu per-CPU counters still in use", (size_t)stats.in_use);
	fflush(stdout);
	exit(refused ? CHILD_REFUSED : CHILD_CLEAN);
}

/* One scenario's sweep, N = 1, 2, ... until a run refuses nothing. */
static void sweep(const struct scenario *s)
{
	uint64_t start = now_ns();
	long n, failed = 0, first_failed = 0;
	int status = 0, first_status = 0;

	for (n = 1; n <= MAX_N; n++) {
		pid_t pid;

		fflush(stdout);
		pid = fork();
		if (pid == 0)
			run_child(s, n);
		status = wait_child(pid);
		if (status == CHILD_CLEAN)
			break;
		if (status != CHILD_REFUSED) {
			if (!failed++) {
				first_failed = n;
				first_status = status;
			}
			printf("# %s: N = %ld%s: exit status %d%s\n", s->name, n,
			       sticky ? " and on" : "", status,
			       status == 128 + SIGALRM ? " (hung)" : "");
		}
	}
	if (!ok(!failed && status == CHILD_CLEAN, "%s: allocations 1..%ld %s, %.2f s", s->name,
		n - 1, sticky ? "each the first of all refused" : "each refused alone",
		(double)(now_ns() - start) / 1e9))
		printf("#   %ld runs failed, the first at N = %ld (exit status %d)%s\n", failed,
		       first_failed, first_status,
		       status == CHILD_CLEAN ? "" : "; the sweep did not end");
}

int main(void)
{
	const char *why = fork_children_untestable();
	size_t i;

	if (why) {
		skip("%s", why);
		return done_testing();
	}
	for (i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
		sweep(&scenarios[i]);
	/* Memory that runs out: the waits that run the library's work on
	 * the caller when no thread can start, a pass that gets no marker. */
	sticky = true;
	for (i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
		if (scenarios[i].hook == HOOK_LIBRARY)
			sweep(&scenarios[i]);
	return done_testing();
}
