/* SPDX-License-Identifier: MIT */
/*
 * test_managed_unstaged.c - the managed list without its per-CPU stages.
 * Their array is allocated once a process, with the managed configuration
 * (src/managed.c, managed_cpus_alloc()); here that allocation is refused.
 * The library warns, every push goes on the list's one head, and nothing
 * changes but that no node is taken back by its ref (the take-back of
 * 0.4.17 pops a stage): a ref held by the manager alone is released by a
 * pass, exactly once, and the nodes of unmanaged and exited refs wait for
 * a pass that unlinks and frees them.  Two threads cycle managed refs
 * through those three ends while passes run, for the sanitizers.  Up to
 * 0.4.17 the allocation was outside the fault-injection hook, and no test
 * ran these paths.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "capture.h"
#include "child.h"
#include "internal.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

#define CYCLERS 2
#define CYCLES 3000

struct object {
	struct percpu_ref ref;
	int releases;		/* atomic: counted on a library thread */
};

static void obj_release(struct percpu_ref *ref)
{
	struct object *o = caa_container_of(ref, struct object, ref);

	/* Release: pairs with releases_of()'s acquire. */
	__atomic_fetch_add(&o->releases, 1, __ATOMIC_RELEASE);
}

static int releases_of(struct object *o)
{
	return __atomic_load_n(&o->releases, __ATOMIC_ACQUIRE);
}

static void read_config(void *out)
{
	percpu_ref_managed_get_config(out);
}

/* The managed configuration's first read allocates the stages: refused. */
static void test_stages_refused(void)
{
	struct percpu_ref_managed_config config;
	struct object warm = { 0 };
	unsigned long refused;
	char printed[512];

	/* The runtime's own first allocations, before the hook is armed. */
	percpu_ref_init(&warm.ref, obj_release, 0);
	percpu_ref_exit(&warm.ref);
	refused = percpuref_fault_refused_allocs();
	percpuref_fault_fail_nth_alloc(1);
	capture_stderr(read_config, &config, printed, sizeof(printed));
	percpuref_fault_fail_nth_alloc(0);
	printed[strcspn(printed, "\n")] = '\0';
	is(percpuref_fault_refused_allocs() - refused, 1, "the stages' allocation was refused");
	ok(strstr(printed, "per-CPU stages") != NULL, "and warned: %s", printed);
}

/* Each end of a managed life, one ref at a time, with no pass due. */
static void test_ends(void)
{
	struct object a = { 0 }, b = { 0 }, c = { 0 };
	struct percpu_ref_data *first;
	struct percpu_ref_managed_stats stats;
	unsigned long spares;
	bool spares_kept = !under_memory_checker();
	struct percpu_ref_managed_config slow = { PERCPU_REF_MANAGED_INTERVAL_MAX_MS,
						  PERCPU_REF_MANAGED_MAX_PER_SCAN,
						  PERCPU_REF_SCAN_FILTERED };

	percpu_ref_managed_set_config(&slow);
	percpu_ref_managed_flush();
	spares = percpuref_test_spares_waiting();

	percpu_ref_init(&a.ref, obj_release, PERCPU_REF_ALLOW_REINIT);
	first = a.ref.data;
	is(percpu_ref_switch_to_managed(&a.ref), 0, "managed");
	is(percpu_ref_switch_to_unmanaged(&a.ref), 0, "and unmanaged");
	percpu_ref_kill(&a.ref);
	percpu_ref_barrier();
	is(releases_of(&a), 1, "the kill released it once");
	percpu_ref_exit(&a.ref);
	percpu_ref_init(&b.ref, obj_release, PERCPU_REF_ALLOW_REINIT);
	if (spares_kept)
		ok(b.ref.data != first, "its node stays for the reclaimer: not this init's impl");
	is(percpu_ref_switch_to_managed(&b.ref), 0, "another managed");
	percpu_ref_exit(&b.ref);	/* live and managed: never released */

	percpu_ref_init(&c.ref, obj_release, PERCPU_REF_ALLOW_REINIT);
	is(percpu_ref_switch_to_managed(&c.ref), 0, "a third managed");
	percpu_ref_put(&c.ref);		/* the manager's reference alone */
	is(releases_of(&c), 0, "no pass yet: held by the manager");
	is(percpu_ref_managed_flush(), 0, "a pass");
	is(releases_of(&c), 1, "it released the ref held by the manager alone");
	is(releases_of(&b), 0, "and not the exited one");
	if (spares_kept)
		is(percpuref_test_spares_waiting() - spares, 2,
		   "it freed both exited refs' impls, kept as spares");
	percpu_ref_managed_get_stats(&stats);
	ok(stats.released >= 1, "the reclaimer counts its release (%llu)",
	   (unsigned long long)stats.released);
	percpu_ref_exit(&c.ref);
	is(releases_of(&c), 1, "once");
}

/*
 * A cycler's refs: each ends one of three ways, by index: held by the
 * manager alone (a pass releases it), unmanaged and killed (the callback
 * thread releases it), or exited while managed (never released).
 */
enum end { BY_MANAGER, BY_KILL, BY_EXIT, ENDS };

static struct object objects[CYCLERS][CYCLES];
static int cyclers_done;	/* atomic */

static void *cycler(void *arg)
{
	struct object *objs = arg;
	int i;

	for (i = 0; i < CYCLES; i++) {
		struct percpu_ref *ref = &objs[i].ref;

		if (percpu_ref_init(ref, obj_release, PERCPU_REF_ALLOW_REINIT) ||
		    percpu_ref_switch_to_managed(ref))
			abort();
		percpu_ref_get(ref);
		percpu_ref_put(ref);
		switch (i % ENDS) {
		case BY_MANAGER:
			percpu_ref_put(ref);
			break;
		case BY_KILL:
			if (percpu_ref_switch_to_unmanaged(ref))
				abort();
			percpu_ref_kill(ref);
			break;
		case BY_EXIT:
			percpu_ref_exit(ref);
			break;
		}
	}
	/* Release: the main thread's flushes follow every push. */
	__atomic_fetch_add(&cyclers_done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void test_cyclers(void)
{
	struct percpu_ref_managed_config fast = { 1, PERCPU_REF_MANAGED_MAX_PER_SCAN,
						  PERCPU_REF_SCAN_FILTERED };
	pthread_t threads[CYCLERS];
	int t, i, wrong = 0;

	percpu_ref_managed_set_config(&fast);
	for (t = 0; t < CYCLERS; t++)
		if (pthread_create(&threads[t], NULL, cycler, objects[t]))
			abort();
	while (__atomic_load_n(&cyclers_done, __ATOMIC_ACQUIRE) < CYCLERS)
		percpu_ref_managed_flush();
	for (t = 0; t < CYCLERS; t++)
		pthread_join(threads[t], NULL);
	percpu_ref_barrier();
	percpu_ref_managed_flush();
	for (t = 0; t < CYCLERS; t++)
		for (i = 0; i < CYCLES; i++) {
			struct object *o = &objects[t][i];

			wrong += releases_of(o) != (i % ENDS != BY_EXIT);
			if (i % ENDS != BY_EXIT)
				percpu_ref_exit(&o->ref);
		}
	is(wrong, 0, "%d threads x %d managed lives on the one head: each released once, "
	   "but the exited", CYCLERS, CYCLES);
}

int main(void)
{
	test_stages_refused();
	test_ends();
	test_cyclers();
	return done_testing();
}
