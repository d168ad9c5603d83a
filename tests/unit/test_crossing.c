/* SPDX-License-Identifier: MIT */
/*
 * References that cross between a thread with a per-CPU unit and one
 * without (docs/percpu_ref.md, "Counts"): taken on the per-CPU words by
 * one, dropped by the other.  A thread without a unit (more threads than
 * fallback units, a CPU beyond the units the runtime counted, a call
 * after the thread's exit hook) used the atomic count, so each such
 * reference moved the words' share, which the fold reads modulo 2^31, by
 * one for good: up to 0.4.1, 2^30 net crossings in one per-CPU period
 * made the kill read the count 2^31 off.  Words to count: warned ("count
 * <= 0 after folding"), pinned, never released; count to words: read 2^31
 * too high, never released, silently.  Such a thread now adds to the
 * ref's own word, counted with the per-CPU words at the fold, so a
 * crossing cancels out.  And a managed ref whose references crossed so is
 * released by the filtered scan: with the word left out of the filter's
 * snapshot, a reference taken on the words and dropped on it read as
 * held, and the filter skipped the ref for ever.
 *
 * Each case runs in its own process.  With rseq, of the first two CPUs
 * this process may run on, A and B, the runtime is told there are B
 * (percpuref_fault_cpu_units()): this thread runs on A, which has a unit,
 * the worker on B, which has none.  On the fallback path the runtime is
 * told there is one CPU (two units): this thread and a parked thread hold
 * both, and the worker has none.  The worker's gets alternate get_many
 * and tryget_many; a variant first takes the ref to atomic mode and back
 * (the word closed by the fold, reopened by the switch back).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdio.h>
#include <string.h>

#include "child.h"
#include "fallback.h"
#include "internal.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

/* 2^24 a call (the most that goes on the per-CPU words), 65 calls: net
 * 2^30 + 2^24 crossings, past the 2^30 the share's 31 bits hold. */
#define CHUNK PERCPU_REF_PERCPU_MAX_NR
#define ROUNDS 65

/* What the unit-less worker does for each round. */
enum worker_op { WORKER_PUT, WORKER_GET, WORKER_TRYGET, WORKER_CHECK_UNITLESS, WORKER_QUIT };

static struct percpu_ref ref, scratch;
static int released;
static sem_t go, done;
static enum worker_op op;
static bool worker_unitless, tryget_failed;
static int cpu_a, cpu_b;	/* with rseq: this thread's, the worker's */
static sem_t park, parked;

static void count_release(struct percpu_ref *r)
{
	(void)r;
	__atomic_fetch_add(&released, 1, __ATOMIC_RELAXED);
}

static bool on_fallback(void)
{
	return !strcmp(percpuref_fast_path(), "fallback");
}

static bool pin_to(int cpu)
{
	cpu_set_t one;

	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	return !sched_setaffinity(0, sizeof(one), &one) && sched_getcpu() == cpu;
}

/* Without a unit: checked after a call on the scratch ref claimed one if
 * the thread could. */
static bool thread_is_unitless(void)
{
	percpu_ref_get(&scratch);
	percpu_ref_put(&scratch);
	if (on_fallback())
		return percpuref_reader_self.state == PERCPUREF_READER_ATOMIC;
	return (unsigned int)sched_getcpu() >= percpuref_nr_units();
}

static void *parked_thread(void *arg)
{
	(void)arg;
	percpu_ref_get(&scratch);	/* claims the second fallback unit */
	percpu_ref_put(&scratch);
	sem_post(&parked);
	sem_wait(&park);
	return NULL;
}

static void *worker(void *arg)
{
	bool pinned = true;

	(void)arg;
	if (!on_fallback())
		pinned = pin_to(cpu_b);
	for (;;) {
		sem_wait(&go);
		switch (op) {
		case WORKER_PUT:
			percpu_ref_put_many(&ref, CHUNK);
			break;
		case WORKER_GET:
			percpu_ref_get_many(&ref, CHUNK);
			break;
		case WORKER_TRYGET:
			if (!percpu_ref_tryget_many(&ref, CHUNK))
				tryget_failed = true;
			break;
		case WORKER_CHECK_UNITLESS:
			worker_unitless = pinned && thread_is_unitless();
			break;
		case WORKER_QUIT:
			sem_post(&done);
			return NULL;
		}
		sem_post(&done);
	}
}

static void worker_do(enum worker_op what)
{
	op = what;
	sem_post(&go);
	sem_wait(&done);
}

static pthread_t worker_thread, parked_holder;

/*
 * Starts the worker, and on the fallback path the parked thread first.
 * Returns 0 when this thread has a unit and the worker has none, 77 when
 * that cannot be arranged here (one CPU), another code otherwise.
 */
static int set_up(void)
{
	cpu_set_t allowed;
	int cpu, found = 0;

	if (sched_getaffinity(0, sizeof(allowed), &allowed))
		return 1;
	for (cpu = 0; cpu < CPU_SETSIZE && found < 2; cpu++)
		if (CPU_ISSET(cpu, &allowed))
			*(found++ ? &cpu_b : &cpu_a) = cpu;
	/* Units for CPUs 0 to B - 1 with rseq; the fallback path counts
	 * two a CPU, so one CPU there. */
	percpuref_fault_cpu_units(found == 2 && !getenv("PERCPUREF_NO_RSEQ") ?
				  (unsigned int)cpu_b : 1);
	if (percpu_ref_init(&scratch, NULL, 0))
		return 2;
	if (!on_fallback() && (found < 2 || !pin_to(cpu_a)))
		return 77;
	if (thread_is_unitless())
		return 3;	/* this thread must own the unit */
	sem_init(&go, 0, 0);
	sem_init(&done, 0, 0);
	sem_init(&park, 0, 0);
	sem_init(&parked, 0, 0);
	if (on_fallback()) {
		if (pthread_create(&parked_holder, NULL, parked_thread, NULL))
			return 4;
		sem_wait(&parked);
	}
	if (pthread_create(&worker_thread, NULL, worker, NULL))
		return 5;
	worker_do(WORKER_CHECK_UNITLESS);
	if (!worker_unitless)
		return 6;
	return 0;
}

static void tear_down(void)
{
	worker_do(WORKER_QUIT);
	pthread_join(worker_thread, NULL);
	if (on_fallback()) {
		sem_post(&park);
		pthread_join(parked_holder, NULL);
	}
	percpu_ref_exit(&scratch);
}

/* Takes CHUNK on this thread's unit and the worker drops them (or the
 * other way round), ROUNDS times, then kills: released once, at the kill,
 * without a warning.  With @flip, after a switch to atomic mode and back. */
static int case_crossing(bool words_to_unitless, bool flip)
{
	unsigned long warnings;
	int i, err = set_up();

	if (err)
		return err;
	if (percpu_ref_init(&ref, count_release, flip ? PERCPU_REF_ALLOW_REINIT : 0))
		return 10;
	if (flip) {
		percpu_ref_switch_to_atomic_sync(&ref);
		percpu_ref_switch_to_percpu(&ref);
	}
	warnings = percpuref_warning_count();
	for (i = 0; i < ROUNDS; i++) {
		if (words_to_unitless) {
			percpu_ref_get_many(&ref, CHUNK);
			worker_do(WORKER_PUT);
		} else {
			worker_do(i % 2 ? WORKER_TRYGET : WORKER_GET);
			percpu_ref_put_many(&ref, CHUNK);
		}
	}
	if (tryget_failed)
		return 14;
	percpu_ref_kill(&ref);
	if (percpu_ref_barrier())
		return 11;
	if (released != 1) {
		fprintf(stderr, "# released %d times after the kill, count %#lx\n", released,
			ref.data->count);
		return 12;
	}
	if (percpuref_warning_count() != warnings)
		return 13;
	percpu_ref_exit(&ref);
	tear_down();
	return 0;
}

/* A managed ref, one reference taken on this thread's unit and dropped by
 * the worker (a filter that misses the worker's word reads two held, the
 * manager's and that one): the initial reference dropped, a flush
 * releases it. */
static int case_managed(void)
{
	struct percpu_ref_managed_config config = { 0, 0, PERCPU_REF_SCAN_FILTERED };
	int err = set_up();

	if (err)
		return err;
	if (percpu_ref_managed_set_config(&config))
		return 20;
	if (percpu_ref_init(&ref, count_release, PERCPU_REF_REL_MANAGED))
		return 21;
	percpu_ref_get_many(&ref, CHUNK);
	worker_do(WORKER_PUT);
	percpu_ref_put(&ref);
	if (percpu_ref_managed_flush())
		return 22;
	if (released != 1) {
		fprintf(stderr, "# released %d times after a flush\n", released);
		return 23;
	}
	percpu_ref_exit(&ref);
	tear_down();
	return 0;
}

static void run_case(const char *mode, const char *what)
{
	int status = run_mode(mode);

	if (status == 77)
		skip("%s: no second CPU to run the worker on", what);
	else
		is(status, 0, "%s", what);
}

int main(int argc, char **argv)
{
	if (argc > 1) {
		child_deadline(60);
		if (!strcmp(argv[1], "words-to-unitless"))
			return case_crossing(true, false);
		if (!strcmp(argv[1], "unitless-to-words"))
			return case_crossing(false, false);
		if (!strcmp(argv[1], "flipped"))
			return case_crossing(true, true);
		if (!strcmp(argv[1], "managed"))
			return case_managed();
		return 99;
	}
	run_case("words-to-unitless", "2^30 + 2^24 references taken on a unit, dropped without "
		 "one: released once at the kill, no warning");
	run_case("unitless-to-words", "2^30 + 2^24 references taken without a unit (get_many and "
		 "tryget_many), dropped on one: released once at the kill");
	run_case("flipped", "the same after a switch to atomic mode and back (the word reopened)");
	run_case("managed", "managed ref, a reference taken on a unit and dropped without one: "
		 "released by a filtered flush");
	return done_testing();
}
