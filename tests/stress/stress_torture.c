/* SPDX-License-Identifier: MIT */
/*
 * The managed-mode torture test of the 2024 kernel series
 * (lib/percpu-refcount-torture.c, "percpu-refcount: Add torture test for
 * percpu refcount" and its runtime-switch extension), ported to this API.
 *
 * nrefs refs, each created either PERCPU_REF_INIT_ATOMIC and then switched
 * to managed, or with PERCPU_REF_REL_MANAGED (at random).  nusers threads
 * each pick a ref at random, take a reference of their own, and then
 * niterations times: get, busy-wait delay_us, now and then (one iteration in
 * switch_one_in) take the ref off management, switch it to atomic mode
 * synchronously, maybe back to per-CPU, and put it under management again,
 * all under a per-ref mutex as in the series; then put.  Once every user
 * holds its reference the creator drops every ref's initial reference with
 * a plain put, as the series does.  A manager thread flushes the reclaimer
 * back to back while users run.  When a user is done it marks itself gone
 * and drops its own reference.
 *
 * Checked at the end, after a last flush: every ref released exactly once,
 * never while one of its users still ran (the release callback checks), and
 * left atomic with a zero count; no warning from the library.
 *
 * Busted modes (TORTURE_BUSTED), which must be detected and reported as a
 * failure: "early" runs one thread per ref that momentarily puts as many
 * references as the ref has users and gets them back (a premature release,
 * or a put of the manager's reference); "late" runs one that keeps taking
 * and dropping an extra reference after the users are gone (a release that
 * never comes, or a get on a released ref).  The busted threads keep going
 * for a few cycles past the last flush, so the damage shows whatever the
 * interleaving; then the test prints "torture: busted-<mode> detected: ..."
 * and exits 1.
 *
 * Parameters (environment; the series' module parameters in brackets, its
 * defaults 2 refs, 2 users, 100 iterations, 10 us; its verified run 50
 * refs, 300 users, 50000 iterations): TORTURE_NREFS [nrefs],
 * TORTURE_NUSERS [nusers], TORTURE_NITERATIONS [niterations],
 * TORTURE_DELAY_US [delay_us], TORTURE_SWITCH_ONE_IN, TORTURE_BUSTED
 * [busted_early_ref_release, busted_late_ref_release], TORTURE_SEED.
 * STRESS_SECONDS caps the users' run time (they stop early, still
 * correctly), for valgrind and sanitizer builds.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_ref.h"
#include "rnd.h"
#include "tap.h"

struct torture_ref {
	struct percpu_ref ref;
	pthread_mutex_t switch_mutex;	/* the series' ref_switch_mutexes */
	long nusers;			/* users that picked this ref */
	int running;			/* users not yet gone: atomic */
	int releases;			/* atomic */
	int premature;			/* releases while running > 0: atomic */
	unsigned long busted_cycles;	/* busted thread's: atomic */
};

static long nrefs = 4, nusers = 8, niterations = 10000, delay_us = 10, switch_one_in = 16;
static const char *busted = "";
static struct torture_ref *refs;
static int users_running;		/* atomic */
static int stop_busted;			/* atomic */
static uint64_t deadline_ns;
static pthread_barrier_t start_barrier;
static uint64_t switches;		/* atomic: runtime switch cycles done */

/* The kernel's udelay(): a busy wait, the thread stays on its CPU. */
static void delay(void)
{
	uint64_t until = now_ns() + (uint64_t)delay_us * 1000u;

	while (now_ns() < until)
		;
}

static long env_long(const char *name, long def, long min)
{
	const char *s = getenv(name);
	char *end;
	long v;

	if (!s || !*s)
		return def;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < min) {
		fprintf(stderr, "torture: %s=\"%s\": want an integer >= %ld\n", name, s, min);
		exit(2);
	}
	return v;
}

static void torture_release(struct percpu_ref *ref)
{
	struct torture_ref *t = (struct torture_ref *)ref;

	/* Sequentially consistent: pairs with the user's decrement of
	 * running before its last put. */
	if (__atomic_load_n(&t->running, __ATOMIC_SEQ_CST))
		__atomic_fetch_add(&t->premature, 1, __ATOMIC_SEQ_CST);
	__atomic_fetch_add(&t->releases, 1, __ATOMIC_SEQ_CST);
}

/* The series' runtime switch: managed -> unmanaged -> atomic (-> per-CPU)
 * -> managed, with the user's reference held throughout. */
static void runtime_switch(struct torture_ref *t, unsigned int r)
{
	pthread_mutex_lock(&t->switch_mutex);
	percpu_ref_switch_to_unmanaged(&t->ref);
	delay();
	percpu_ref_switch_to_atomic_sync(&t->ref);
	if (r & 1)
		percpu_ref_switch_to_percpu(&t->ref);
	delay();
	percpu_ref_switch_to_managed(&t->ref);
	pthread_mutex_unlock(&t->switch_mutex);
	__atomic_fetch_add(&switches, 1, __ATOMIC_RELAXED);
	delay();
}

static void *user_thread(void *arg)
{
	struct torture_ref *t = arg;
	unsigned int seed = (unsigned int)(uintptr_t)&seed ^ (unsigned int)now_ns();
	long i;

	percpu_ref_get(&t->ref);	/* our own, held to the end */
	pthread_barrier_wait(&start_barrier);
	for (i = 0; i < niterations && now_ns() < deadline_ns; i++) {
		percpu_ref_get(&t->ref);
		delay();
		if (switch_one_in && rnd(&seed) % switch_one_in == 0)
			runtime_switch(t, rnd(&seed));
		percpu_ref_put(&t->ref);
	}
	/* Gone before the last put: a release from here on is on time. */
	__atomic_fetch_sub(&t->running, 1, __ATOMIC_SEQ_CST);
	percpu_ref_put(&t->ref);
	__atomic_fetch_sub(&users_running, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

static void *manager_thread(void *arg)
{
	(void)arg;
	while (__atomic_load_n(&users_running, __ATOMIC_SEQ_CST))
		percpu_ref_managed_flush();
	return NULL;
}

static void *busted_thread(void *arg)
{
	struct torture_ref *t = arg;
	long j;

	while (!__atomic_load_n(&stop_busted, __ATOMIC_SEQ_CST)) {
		if (!strcmp(busted, "early")) {
			/* Puts the users' share momentarily (the series'
			 * percpu_ref_busted_early_thread). */
			for (j = 0; j < t->nusers; j++)
				percpu_ref_put(&t->ref);
			delay();
			for (j = 0; j < t->nusers; j++)
				percpu_ref_get(&t->ref);
		} else {
			/* An extra reference, taken and dropped again and
			 * again, also after the users are gone. */
			percpu_ref_get(&t->ref);
			delay();
			percpu_ref_put(&t->ref);
		}
		__atomic_fetch_add(&t->busted_cycles, 1, __ATOMIC_SEQ_CST);
		delay();
	}
	return NULL;
}

/* Waits until every busted thread of a ref with users ran two more cycles. */
static void busted_run_on(void)
{
	unsigned long *seen = calloc((size_t)nrefs, sizeof(*seen));
	long i;

	if (!seen)
		abort();
	for (i = 0; i < nrefs; i++)
		seen[i] = __atomic_load_n(&refs[i].busted_cycles, __ATOMIC_SEQ_CST);
	for (i = 0; i < nrefs; i++)
		while ((!strcmp(busted, "late") || refs[i].nusers) &&
		       __atomic_load_n(&refs[i].busted_cycles, __ATOMIC_SEQ_CST) < seen[i] + 2)
			delay();
	free(seen);
}

int main(void)
{
	pthread_t *users, *busters = NULL, manager;
	unsigned long warnings_before;
	unsigned int seed;
	long i, released = 0, wrong = 0, premature = 0, not_zero = 0, warnings;
	struct percpu_ref_managed_config c = { 0, 0, PERCPU_REF_SCAN_BATCHED };
	uint64_t start;

	nrefs = env_long("TORTURE_NREFS", nrefs, 1);
	nusers = env_long("TORTURE_NUSERS", nusers, 1);
	niterations = env_long("TORTURE_NITERATIONS", niterations, 1);
	delay_us = env_long("TORTURE_DELAY_US", delay_us, 0);
	switch_one_in = env_long("TORTURE_SWITCH_ONE_IN", switch_one_in, 0);
	seed = (unsigned int)env_long("TORTURE_SEED", (long)(now_ns() % 1000000), 0);
	if (getenv("TORTURE_BUSTED"))
		busted = getenv("TORTURE_BUSTED");
	if (*busted && strcmp(busted, "early") && strcmp(busted, "late")) {
		fprintf(stderr, "torture: TORTURE_BUSTED=\"%s\": want early or late\n", busted);
		return 2;
	}
	start = now_ns();
	deadline_ns = start + (uint64_t)(stress_seconds(30) * 1e9);
	/* The reclaimer only scans when the manager thread flushes. */
	c.interval_ms = 3600000;
	c.strategy = seed & 1 ? PERCPU_REF_SCAN_FAITHFUL : PERCPU_REF_SCAN_BATCHED;
	percpu_ref_managed_set_config(&c);
	printf("# nrefs %ld nusers %ld niterations %ld delay_us %ld switch 1/%ld seed %u "
	       "strategy %s busted %s\n", nrefs, nusers, niterations, delay_us, switch_one_in,
	       seed, seed & 1 ? "faithful" : "batched", *busted ? busted : "none");

	refs = calloc((size_t)nrefs, sizeof(*refs));
	users = calloc((size_t)nusers, sizeof(*users));
	if (!refs || !users)
		return 1;
	warnings_before = percpuref_warning_count();
	for (i = 0; i < nrefs; i++) {
		bool rel_managed = rnd(&seed) & 1;

		pthread_mutex_init(&refs[i].switch_mutex, NULL);
		if (percpu_ref_init(&refs[i].ref, torture_release,
				    rel_managed ? PERCPU_REF_REL_MANAGED : PERCPU_REF_INIT_ATOMIC))
			return 1;
		if (!rel_managed && percpu_ref_switch_to_managed(&refs[i].ref))
			return 1;
	}
	users_running = (int)nusers;
	pthread_barrier_init(&start_barrier, NULL, (unsigned int)nusers + 1);
	for (i = 0; i < nusers; i++) {
		struct torture_ref *t = &refs[rnd(&seed) % nrefs];

		t->nusers++;
		t->running++;
		if (pthread_create(&users[i], NULL, user_thread, t))
			return 1;
	}
	pthread_create(&manager, NULL, manager_thread, NULL);
	/* Every user holds its own reference: drop the creator's, with a
	 * plain put, as the series does. */
	pthread_barrier_wait(&start_barrier);
	for (i = 0; i < nrefs; i++)
		percpu_ref_put(&refs[i].ref);
	if (*busted) {
		busters = calloc((size_t)nrefs, sizeof(*busters));
		if (!busters)
			return 1;
		for (i = 0; i < nrefs; i++)
			pthread_create(&busters[i], NULL, busted_thread, &refs[i]);
	}

	for (i = 0; i < nusers; i++)
		pthread_join(users[i], NULL);
	pthread_join(manager, NULL);
	percpu_ref_managed_flush();
	if (*busted)
		busted_run_on();

	for (i = 0; i < nrefs; i++) {
		struct torture_ref *t = &refs[i];
		int n = __atomic_load_n(&t->releases, __ATOMIC_SEQ_CST);

		released += n == 1;
		wrong += n != 1;
		premature += __atomic_load_n(&t->premature, __ATOMIC_SEQ_CST);
		if (!(t->ref.percpu_count_ptr & __PERCPU_REF_ATOMIC) || !percpu_ref_is_zero(&t->ref))
			not_zero++;
	}
	warnings = (long)(percpuref_warning_count() - warnings_before);
	printf("# %.2f s, %lu runtime switches; released %ld/%ld, premature %ld, "
	       "not zero %ld, library warnings %ld\n", (now_ns() - start) / 1e9,
	       (unsigned long)__atomic_load_n(&switches, __ATOMIC_RELAXED), released, nrefs,
	       premature, not_zero, warnings);

	if (*busted) {
		__atomic_store_n(&stop_busted, 1, __ATOMIC_SEQ_CST);
		for (i = 0; i < nrefs; i++)
			pthread_join(busters[i], NULL);
		free(busters);
		percpu_ref_managed_flush();
		for (i = 0; i < nrefs; i++) {
			percpu_ref_exit(&refs[i].ref);
			pthread_mutex_destroy(&refs[i].switch_mutex);
		}
		free(refs);
		free(users);
		if (!(wrong || premature || not_zero || warnings)) {
			printf("torture: busted-%s NOT detected\n", busted);
			return 0;
		}
		printf("torture: busted-%s detected: %ld refs not released exactly once, "
		       "%ld premature releases, %ld not atomic and zero, %ld library "
		       "warnings\n", busted, wrong, premature, not_zero, warnings);
		/* Before any exit-time report (a sanitizer's) can cut it off. */
		fflush(stdout);
		return 1;
	}
	is(released, nrefs, "every ref released exactly once after the creator's and the users' puts");
	is(premature, 0, "no release while a user still ran");
	is(not_zero, 0, "every released ref is atomic with a zero count");
	is(warnings, 0, "no misuse reported by the library");
	for (i = 0; i < nrefs; i++) {
		percpu_ref_exit(&refs[i].ref);
		pthread_mutex_destroy(&refs[i].switch_mutex);
	}
	free(refs);
	free(users);
	return done_testing();
}
