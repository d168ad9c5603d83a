/* SPDX-License-Identifier: MIT */
/*
 * test_exit_hook_refused.c - a thread whose exit hook cannot be set
 * (thread_exit.c: pthread_setspecific() and __cxa_thread_atexit_impl()
 * both refuse, as they may for want of memory) takes nothing it could not
 * give back: no fallback unit (fallback.c), no rseq area of the library's
 * own (rseq_register.c), and no poll registration (deferred.c: -EAGAIN).
 * It still counts, exactly, through the shared paths, and once it has
 * exited the process holds as many registrations and counters in use as
 * before it.  Until this test no failure of the hook was ever made: a
 * unit not given back then (one leaked a thread) survived every test.
 * (A counter cache it kept would be taken back as a dead thread's anyway,
 * percpu_alloc.c: not a difference this test can see.)
 *
 * Linked with --wrap=pthread_setspecific and
 * --wrap=__cxa_thread_atexit_impl (tests/CMakeLists.txt): the library's
 * calls come here, and fail on the thread that asks.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "internal.h"
#include "percpuref/percpu_ref.h"
#include "registrations.h"
#include "tap.h"

#define NR_REFS 64
#define PAIRS 10000

static __thread bool refuse_hooks;

int __real_pthread_setspecific(pthread_key_t key, const void *value);
int __wrap_pthread_setspecific(pthread_key_t key, const void *value)
{
	return refuse_hooks ? ENOMEM : __real_pthread_setspecific(key, value);
}

/* Weak, as the library's reference: a C library without it (musl) had the
 * library use the key alone, and refuses here as it did. */
int __real___cxa_thread_atexit_impl(void (*fn)(void *), void *arg, void *dso)
	__attribute__((weak));
int __wrap___cxa_thread_atexit_impl(void (*fn)(void *), void *arg, void *dso)
{
	if (refuse_hooks || !__real___cxa_thread_atexit_impl)
		return -1;
	return __real___cxa_thread_atexit_impl(fn, arg, dso);
}

static struct percpu_ref shared;
static int releases;

static void count_release(struct percpu_ref *r)
{
	(void)r;
	__atomic_fetch_add(&releases, 1, __ATOMIC_RELAXED);
}

static void pairs(void)
{
	for (int i = 0; i < PAIRS; i++) {
		percpu_ref_get(&shared);
		percpu_ref_put(&shared);
	}
}

struct refused_thread {
	unsigned int registered_inside;	/* registered_threads() after its calls */
	int poll_register;		/* percpu_ref_poll_register()'s answer */
	bool refs_counted;		/* its own refs released once each */
};

static int own_releases;

static void count_own_release(struct percpu_ref *r)
{
	(void)r;
	own_releases++;		/* this thread's refs, released on it */
}

static void *refused_user(void *arg)
{
	struct refused_thread *t = arg;
	static struct percpu_ref own[NR_REFS];

	refuse_hooks = true;
	pairs();
	for (int i = 0; i < NR_REFS; i++)
		percpu_ref_init(&own[i], count_own_release, PERCPU_REF_INIT_ATOMIC);
	for (int i = 0; i < NR_REFS; i++) {
		percpu_ref_get(&own[i]);
		percpu_ref_put(&own[i]);
		percpu_ref_kill(&own[i]);	/* atomic: released here, at once */
		percpu_ref_exit(&own[i]);
	}
	t->refs_counted = own_releases == NR_REFS;
	t->registered_inside = registered_threads();
	t->poll_register = percpu_ref_poll_register();
	if (t->poll_register == 0)
		percpu_ref_poll_unregister();
	return NULL;
}

int main(void)
{
	struct percpuref_counter_stats before_stats, after_stats;
	struct refused_thread t = { 0 };
	unsigned int before;
	pthread_t thread;

	printf("# fast path: %s\n", percpuref_fast_path());
	percpu_ref_init(&shared, count_release, 0);
	pairs();	/* this thread registered */
	before = registered_threads();
	percpuref_get_counter_stats(&before_stats);
	pthread_create(&thread, NULL, refused_user, &t);
	pthread_join(thread, NULL);
	is(t.registered_inside, before,
	   "exit hook refused: the thread took no unit and no rseq area of the library's");
	is(t.poll_register, -EAGAIN, "exit hook refused: poll registration refused (EAGAIN)");
	ok(t.refs_counted, "exit hook refused: its own refs counted and released once each");
	is(registered_threads(), before, "exit hook refused: no registration left after its exit");
	percpuref_get_counter_stats(&after_stats);
	is(after_stats.in_use, before_stats.in_use,
	   "exit hook refused: every counter it allocated is free again");
	percpu_ref_kill(&shared);
	percpu_ref_barrier();
	is(releases, 1, "exit hook refused: the shared count exact, released once");
	percpu_ref_exit(&shared);
	return done_testing();
}
