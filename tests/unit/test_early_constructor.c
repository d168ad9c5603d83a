/* SPDX-License-Identifier: MIT */
/*
 * test_early_constructor.c - a program that uses the library from its own
 * constructor, before the library's constructors ran: the order whenever
 * the static library is linked into the program (this test links it so,
 * as every test does; its constructor comes first in the link), and C++
 * globals that hold refs.  A managed round (the reclaimer starts and
 * sleeps on its condition variable) and 2000 paced kills run there, and
 * again in main().  Nothing the library's constructors do may reset a
 * condition variable that a thread of the library already waits on, nor
 * give a timed wait a clock its deadline is not on.  In 0.4.9 as first
 * committed the constructors initialised them (to put their timed waits on
 * CLOCK_MONOTONIC): the reclaimer, asleep on the reset one, never woke,
 * and main()'s flush waited for ever; and kills before that constructor
 * waited on a wall-clock condition variable with monotonic deadlines, each
 * wait over at once: 1976 to 2000 left waiting against a limit of 64.
 * The switch stripes are zeroed memory that no constructor sets up, which
 * relies on zero bytes being the C library's static initialisers.
 *
 * A real stall (the callback thread kept off its CPU 100 ms on a loaded
 * machine) turns pacing off for a while too, so a round of kills counts
 * if any of three is paced without a stall; with waits that end at once,
 * none is.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

#define LIMIT 64
#define KILLS 2000
#define ROUNDS 3

static unsigned long released;		/* atomic */
static unsigned long issued;		/* refs the paced rounds killed */
static unsigned long confirm_spins = 20000;	/* slower than a kill */

static void count_release(struct percpu_ref *ref)
{
	(void)ref;
	/* Release: the killer's count of what waits reads it. */
	__atomic_fetch_add(&released, 1, __ATOMIC_RELEASE);
}

/* On the callback thread: slower than a kill, so that it falls behind. */
static void slow_confirm(struct percpu_ref *ref)
{
	(void)ref;
	for (volatile unsigned long i = 0; i < confirm_spins; i++)
		;
}

/* One managed ref, released by the reclaimer's flush: 1 once it was. */
static int managed_round(void)
{
	struct percpu_ref ref;
	unsigned long before = __atomic_load_n(&released, __ATOMIC_ACQUIRE);
	int ret;

	if (percpu_ref_init(&ref, count_release, PERCPU_REF_ALLOW_REINIT) ||
	    percpu_ref_switch_to_managed(&ref))
		return -1;
	percpu_ref_put(&ref);	/* the manager's reference is the last */
	ret = percpu_ref_managed_flush();
	if (ret)
		return ret;
	ret = __atomic_load_n(&released, __ATOMIC_ACQUIRE) - before == 1;
	percpu_ref_exit(&ref);
	return ret;
}

/* KILLS refs killed with a slow confirm; the most that were killed and
 * not released when a kill returned, or 0 when an init failed. */
static unsigned long paced_kills(struct percpu_ref *refs)
{
	unsigned long most = 0, start = __atomic_load_n(&released, __ATOMIC_ACQUIRE);

	for (unsigned long i = 0; i < KILLS; i++) {
		if (percpu_ref_init(&refs[i], count_release, 0))
			return 0;
		issued++;
		percpu_ref_kill_and_confirm(&refs[i], slow_confirm);
		unsigned long waiting =
			i + 1 - (__atomic_load_n(&released, __ATOMIC_ACQUIRE) - start);

		if (waiting > most)
			most = waiting;
	}
	percpu_ref_barrier();
	for (unsigned long i = 0; i < KILLS; i++)
		percpu_ref_exit(&refs[i]);
	return most;
}

/* Up to ROUNDS rounds of paced kills, until one is paced (at most LIMIT
 * waiting) with no stall; that one's figures, or the last round's. */
static void paced_rounds(struct percpu_ref *refs, unsigned long *most, unsigned long *stalls)
{
	for (int round = 0; round < ROUNDS; round++) {
		unsigned long before = percpuref_deferred_stalls();

		*most = paced_kills(refs);
		*stalls = percpuref_deferred_stalls() - before;
		if (*most > 0 && *most <= LIMIT && !*stalls)
			return;
	}
}

static int early_managed;
static unsigned long early_most, early_stalls;
static struct percpu_ref *refs;

static __attribute__((constructor)) void early(void)
{
	/* A wait for ever is the failure this test looks for. */
	alarm(120);
	/* Before the library's first use: its backlog limit. */
	setenv("PERCPUREF_CALLBACK_BACKLOG", "64", 1);
	refs = malloc(KILLS * sizeof(*refs));
	if (!refs)
		abort();
	early_managed = managed_round();
	paced_rounds(refs, &early_most, &early_stalls);
	/* The reclaimer and the callback thread go to sleep. */
	usleep(100000);
}

int main(void)
{
	/* Zero bytes, as static storage is before any constructor runs. */
	static const pthread_mutex_t zeroed_mutex;
	static const pthread_cond_t zeroed_cond;
	pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
	pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
	unsigned long stalls, most;

	ok(!memcmp(&mutex, &zeroed_mutex, sizeof(mutex)) &&
	   !memcmp(&cond, &zeroed_cond, sizeof(cond)),
	   "the C library's static mutex and condition variable initialisers are zero bytes");
	is(early_managed, 1, "a managed ref flushed from the program's constructor is released");
	ok(early_most > 0 && early_most <= LIMIT,
	   "2000 kills from the constructor: at most %lu waiting (limit %d)", early_most, LIMIT);
	is(early_stalls, 0, "and no paced wait of theirs counted a stall");
	is(managed_round(), 1, "after the library's constructors: a flush still wakes the reclaimer");
	paced_rounds(refs, &most, &stalls);
	ok(most > 0 && most <= LIMIT, "2000 kills from main(): at most %lu waiting (limit %d)", most,
	   LIMIT);
	is(stalls, 0, "and no stall");
	is(__atomic_load_n(&released, __ATOMIC_ACQUIRE), 2 + issued,
	   "every ref released once (%lu)", 2 + issued);
	free(refs);
	return done_testing();
}
