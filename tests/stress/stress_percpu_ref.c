/* SPDX-License-Identifier: MIT */
/*
 * Stress of percpu_ref: worker threads take and drop references on a few
 * shared refs (tryget, tryget_live, get/put, _many) while a controller
 * thread flips modes (async and sync switch to atomic, back to per-CPU),
 * kills and resurrects, kills and reinits, at random.
 *
 * With the argument "unitless" the runtime counts one CPU
 * (percpuref_fault_cpu_units()), so callers lack a unit part of the time:
 * on CPU 1 with rseq (workers move between CPUs 0 and 1), and all but two
 * threads on the fallback path (two units a CPU); and workers hand some
 * references to whichever worker drops them next.  References then cross
 * between the per-CPU words and the ref's unit-less word while the modes
 * flip (docs/percpu_ref.md, "Counts"; tests/model/unitless.pml), and one
 * unit-less add in 64 yields its CPU in the middle, where a fold may come.
 *
 * Checked: every life (init or reinit) ends in exactly one release; no
 * tryget succeeds on a released ref; every confirm callback runs exactly
 * once; at the end every count is exactly the initial reference.
 * Duration: STRESS_SECONDS (default 2).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#define container_of(p, type, member) ((type *)((char *)(p)-offsetof(type, member)))

#include "internal.h"
#include "percpuref/percpu_ref.h"
#include "rnd.h"
#include "tap.h"

#define NR_REFS 8
#define NR_WORKERS 3

struct obj {
	struct percpu_ref ref;
	int released;		/* set by release, cleared before reinit */
	long releases;		/* releases seen */
	long lives_ended;	/* kills meant to end a life */
	unsigned long handed;	/* references left for another worker to drop */
};

static struct obj objs[NR_REFS];
static int stop;
static long errors, confirms_wanted, confirms_seen;
static long worker_ops;	/* atomic: the workers' ops, 64 at a time while they run */
static bool unitless;

/* Drops the references handed over on @o, if any. */
static void drop_handed(struct obj *o)
{
	/* Relaxed: the references are held until the put, which orders. */
	unsigned long n = __atomic_exchange_n(&o->handed, 0, __ATOMIC_RELAXED);

	if (n)
		percpu_ref_put_many(&o->ref, n);
}

/* To CPU 0 or 1, whichever is allowed (a refused move changes nothing). */
static void move_to_cpu(unsigned int cpu)
{
	cpu_set_t one;

	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	(void)sched_setaffinity(0, sizeof(one), &one);
}

static void obj_release(struct percpu_ref *ref)
{
	struct obj *o = container_of(ref, struct obj, ref);

	/* Release store: the controller waits for it before reinit. */
	if (__atomic_exchange_n(&o->released, 1, __ATOMIC_SEQ_CST))
		__atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);	/* twice */
	__atomic_fetch_add(&o->releases, 1, __ATOMIC_RELAXED);
}

static void count_confirm(struct percpu_ref *ref)
{
	(void)ref;
	__atomic_fetch_add(&confirms_seen, 1, __ATOMIC_RELAXED);
}

static void *worker(void *arg)
{
	unsigned int seed = (unsigned int)(uintptr_t)arg, k, extra;
	long ops = 0;

	while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
		struct obj *o = &objs[rnd(&seed) % NR_REFS];
		bool live = rnd(&seed) & 1;
		bool got = live ? percpu_ref_tryget_live(&o->ref) : percpu_ref_tryget(&o->ref);

		if (unitless)
			drop_handed(&objs[rnd(&seed) % NR_REFS]);
		if (!got)
			continue;
		if (__atomic_load_n(&o->released, __ATOMIC_SEQ_CST))
			__atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);
		extra = rnd(&seed) % 4;
		for (k = 0; k < extra; k++)
			percpu_ref_get(&o->ref);
		percpu_ref_get_many(&o->ref, 3);
		if (rnd(&seed) % 8 == 0) {
			if (unitless)
				move_to_cpu(rnd(&seed) % 2);
			sched_yield();
		}
		if (unitless && rnd(&seed) % 2)
			__atomic_fetch_add(&o->handed, 3, __ATOMIC_RELAXED);
		else
			percpu_ref_put_many(&o->ref, 3);
		for (k = 0; k < extra; k++)
			percpu_ref_put(&o->ref);
		percpu_ref_put(&o->ref);
		if (++ops % 64 == 0)
			__atomic_fetch_add(&worker_ops, 64, __ATOMIC_RELAXED);
	}
	__atomic_fetch_add(&worker_ops, ops % 64, __ATOMIC_RELAXED);
	return NULL;
}

/* False, and the run stops, if a killed ref is not released within 30 s:
 * a reference lost by the count, not a hang until ctest's timeout. */
static bool wait_released(struct obj *o)
{
	double start = now_seconds();

	while (!__atomic_load_n(&o->released, __ATOMIC_SEQ_CST)) {
		if (now_seconds() - start > 30) {
			printf("# ref %td not released 30 s after its kill\n", o - objs);
			return false;
		}
		sched_yield();
	}
	return true;
}

static bool stuck;

/* The progress the run must make on each side. */
#define MIN_CONTROL_OPS 100
#define MIN_WORKER_OPS 1000

static long controller(double seconds)
{
	uint64_t end = now_ns() + (uint64_t)(seconds * 1e9);
	unsigned int seed = 42;
	long ops = 0;

	do {
		struct obj *o = &objs[rnd(&seed) % NR_REFS];

		switch (rnd(&seed) % 6) {
		case 0:
			__atomic_fetch_add(&confirms_wanted, 1, __ATOMIC_RELAXED);
			percpu_ref_switch_to_atomic(&o->ref, count_confirm);
			break;
		case 1:
			percpu_ref_switch_to_atomic_sync(&o->ref);
			break;
		case 2:
		case 3:
			percpu_ref_switch_to_percpu(&o->ref);
			break;
		case 4:	/* kill while holding a reference, then resurrect */
			percpu_ref_get(&o->ref);
			__atomic_fetch_add(&confirms_wanted, 1, __ATOMIC_RELAXED);
			percpu_ref_kill_and_confirm(&o->ref, count_confirm);
			if (rnd(&seed) & 1)
				sched_yield();
			percpu_ref_resurrect(&o->ref);
			percpu_ref_put(&o->ref);
			break;
		case 5:	/* end this life, start the next */
			o->lives_ended++;
			percpu_ref_kill(&o->ref);
			if (!wait_released(o)) {
				stuck = true;
				return ops;
			}
			__atomic_store_n(&o->released, 0, __ATOMIC_SEQ_CST);
			percpu_ref_reinit(&o->ref);
			break;
		}
		ops++;
	} while (stress_goes_on(end, ops > MIN_CONTROL_OPS &&
			       __atomic_load_n(&worker_ops, __ATOMIC_RELAXED) > MIN_WORKER_OPS));
	return ops;
}

int main(int argc, char **argv)
{
	pthread_t threads[NR_WORKERS];
	long control_ops, i;
	bool exact = true, once = true;
	unsigned long warned = percpuref_warning_count();

	unitless = argc > 1 && !strcmp(argv[1], "unitless");
	if (unitless) {
		percpuref_fault_cpu_units(1);
		/* Preempted between the mode word and the word's CAS, now
		 * and then: without it an add that ignored the FOLDED bit
		 * (and was lost in a folded word) passed 4 of 4 runs. */
		percpuref_test_unitless_yield(64);
	}

	for (i = 0; i < NR_REFS; i++)
		if (percpu_ref_init(&objs[i].ref, obj_release, PERCPU_REF_ALLOW_REINIT))
			return 1;
	for (i = 0; i < NR_WORKERS; i++)
		pthread_create(&threads[i], NULL, worker, (void *)(uintptr_t)(i + 1));
	control_ops = controller(stress_seconds(2));
	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	for (i = 0; i < NR_WORKERS; i++)
		pthread_join(threads[i], NULL);
	for (i = 0; i < NR_REFS; i++)
		drop_handed(&objs[i]);
	percpu_ref_barrier();

	printf("# %ld controller ops, %ld worker ops\n", control_ops, worker_ops);
	ok(!stuck, "every kill that ended a life released the ref");
	ok(control_ops > MIN_CONTROL_OPS && worker_ops > MIN_WORKER_OPS, "both sides made progress");
	for (i = 0; i < NR_REFS; i++) {
		struct obj *o = &objs[i];

		percpu_ref_switch_to_atomic_sync(&o->ref);
		if (__atomic_load_n(&o->ref.data->count, __ATOMIC_RELAXED) != 1) {
			printf("# ref %ld count %lu\n", i, o->ref.data->count);
			exact = false;
		}
		o->lives_ended++;
		percpu_ref_kill(&o->ref);
		percpu_ref_barrier();
		if (o->releases != o->lives_ended) {
			printf("# ref %ld: %ld releases for %ld lives\n", i, o->releases, o->lives_ended);
			once = false;
		}
		percpu_ref_exit(&o->ref);
	}
	ok(exact, "every count is exactly the initial reference at the end");
	ok(once, "every life ended in exactly one release");
	is(errors, 0, "no tryget succeeded on a released ref, no double release");
	is(confirms_seen, confirms_wanted, "every confirm callback ran exactly once");
	/* A count driven below zero is pinned and warned, never released
	 * twice: only the warning shows it. */
	is(percpuref_warning_count() - warned, 0, "no call warned");
	return done_testing();
}
