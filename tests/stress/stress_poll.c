/* SPDX-License-Identifier: MIT */
/*
 * Polling threads under load: workers kill refs of their own (kill,
 * kill_and_confirm, or an asynchronous switch_to_atomic first), poll plain
 * or waiting or not at all, and register and unregister at random, while a
 * controller calls percpu_ref_barrier() and forks (not under
 * ThreadSanitizer): every kill must be released exactly once, wherever it
 * was finished (its own thread, the callback thread after a hand-over, a
 * fork child).  Each @release polls: refused inside a poll (-EDEADLK)
 * and on a thread that is not a polling one (-EPERM: the callback thread,
 * or a put's), allowed from a put on a polling thread.  A
 * hang (a kill stranded on a queue nobody polls) is caught by the
 * watchdog: no worker round for 10 s (30 s under ThreadSanitizer or
 * valgrind) aborts.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "child.h"
#include "percpuref/percpu_ref.h"
#include "rnd.h"
#include "tap.h"

#define WORKERS 4
#define RING 64

struct slot {
	struct percpu_ref ref;
	int released;		/* atomic */
	bool live;		/* initialised, not yet exited: its worker's */
};

static struct slot slots[WORKERS][RING];
static unsigned long rounds[WORKERS];	/* atomic: progress */
static unsigned long kills, releases, bad_callbacks;	/* atomic */
static bool stop;			/* atomic */

/* This thread: not a polling one, a polling one, or inside its poll. */
enum poll_state { NOT_POLLING, REGISTERED, IN_POLL };
static __thread enum poll_state state;

static unsigned long polls_that_finished;	/* atomic */

static int poll_as(enum poll_state during, unsigned int flags)
{
	enum poll_state before = state;
	int ret;

	state = during;
	ret = percpu_ref_poll(flags);
	state = before;
	if (ret > 0)
		__atomic_fetch_add(&polls_that_finished, 1, __ATOMIC_RELAXED);
	return ret;
}

static void release_slot(struct percpu_ref *ref)
{
	struct slot *s = (struct slot *)ref;	/* ref is the first member */
	enum poll_state here = state;
	int ret = poll_as(here == REGISTERED ? IN_POLL : here, 0);

	/* A poll from a @release: refused inside a poll (-EDEADLK) and on
	 * a thread that is not a polling one (the callback thread, or a
	 * put's), allowed from a put on a polling thread. */
	if (here == IN_POLL ? ret != -EDEADLK : here == NOT_POLLING ? ret != -EPERM : ret < 0)
		__atomic_fetch_add(&bad_callbacks, 1, __ATOMIC_RELAXED);
	/* Counted before the slot: its worker may see it and finish. */
	__atomic_fetch_add(&releases, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&s->released, 1, __ATOMIC_RELEASE);
}

static void confirm_nothing(struct percpu_ref *ref)
{
	(void)ref;
}

/* Waits for @s's release (polling if registered), checks it and exits. */
static void retire(struct slot *s, bool registered)
{
	if (!s->live)
		return;
	while (__atomic_load_n(&s->released, __ATOMIC_ACQUIRE) == 0) {
		/* Acquire: pairs with release_slot(). */
		if (!registered || poll_as(IN_POLL, PERCPU_REF_POLL_WAIT) <= 0)
			sched_yield();
	}
	if (__atomic_load_n(&s->released, __ATOMIC_ACQUIRE) != 1)
		__atomic_fetch_add(&bad_callbacks, 1, __ATOMIC_RELAXED);
	percpu_ref_exit(&s->ref);
	s->released = 0;
	s->live = false;
}

static void *worker(void *arg)
{
	unsigned int id = (unsigned int)(uintptr_t)arg, seed = id * 7919 + 1, next = 0, i;
	bool registered = false;

	while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
		struct slot *s = &slots[id][next];
		unsigned int r = rnd(&seed);

		next = (next + 1) % RING;
		retire(s, registered);
		if (r % 64 == 0) {
			int ret = registered ? percpu_ref_poll_unregister() : percpu_ref_poll_register();

			if (ret)
				__atomic_fetch_add(&bad_callbacks, 1, __ATOMIC_RELAXED);
			registered = !registered;
			state = registered ? REGISTERED : NOT_POLLING;
		}
		if (percpu_ref_init(&s->ref, release_slot, PERCPU_REF_ALLOW_REINIT))
			continue;
		s->live = true;
		percpu_ref_get(&s->ref);
		percpu_ref_put(&s->ref);
		switch (r / 64 % 4) {
		case 0:
			percpu_ref_kill_and_confirm(&s->ref, confirm_nothing);
			break;
		case 1:
			percpu_ref_switch_to_atomic(&s->ref, NULL);
			percpu_ref_kill(&s->ref);
			break;
		default:
			percpu_ref_kill(&s->ref);
		}
		__atomic_fetch_add(&kills, 1, __ATOMIC_RELAXED);
		if (registered && r / 256 % 4 == 0)
			(void)poll_as(IN_POLL, r / 1024 % 8 ? 0 : PERCPU_REF_POLL_WAIT);
		__atomic_fetch_add(&rounds[id], 1, __ATOMIC_RELAXED);
	}
	for (i = 0; i < RING; i++)
		retire(&slots[id][i], registered);
	if (registered)
		percpu_ref_poll_unregister();
	return NULL;
}

/* A fork child: its barrier finishes what the parent's threads queued;
 * nothing is released twice. */
static void fork_once(void)
{
	pid_t pid = fork();

	if (pid == 0) {
		unsigned int w, i;

		child_deadline(10);
		if (percpu_ref_barrier())
			_exit(4);
		for (w = 0; w < WORKERS; w++)
			for (i = 0; i < RING; i++)
				if (__atomic_load_n(&slots[w][i].released, __ATOMIC_ACQUIRE) > 1)
					_exit(5);
		_exit(0);
	}
	if (wait_child(pid) != 0)
		__atomic_fetch_add(&bad_callbacks, 1, __ATOMIC_RELAXED);
}

int main(void)
{
	double seconds = stress_seconds(5);
	unsigned int patience = UNDER_TSAN || getenv("PERCPUREF_VALGRIND") ? 30 : 10;
	bool forks = !UNDER_TSAN && !getenv("PERCPUREF_VALGRIND");
	unsigned long seen[WORKERS] = { 0 }, barriers = 0, nr_forks = 0;
	uint64_t end = now_ns() + (uint64_t)(seconds * 1e9), last_progress[WORKERS];
	pthread_t threads[WORKERS];
	unsigned int i, seed = 42;

	for (i = 0; i < WORKERS; i++) {
		last_progress[i] = now_ns();
		if (pthread_create(&threads[i], NULL, worker, (void *)(uintptr_t)i))
			return 1;
	}
	while (now_ns() < end) {
		usleep(1000 + rnd(&seed) % 4000);
		if (percpu_ref_barrier())
			__atomic_fetch_add(&bad_callbacks, 1, __ATOMIC_RELAXED);
		barriers++;
		if (forks && rnd(&seed) % 16 == 0) {
			fork_once();
			nr_forks++;
		}
		for (i = 0; i < WORKERS; i++) {
			unsigned long r = __atomic_load_n(&rounds[i], __ATOMIC_RELAXED);

			if (r != seen[i])
				last_progress[i] = now_ns();
			seen[i] = r;
			if (now_ns() - last_progress[i] > patience * UINT64_C(1000000000)) {
				fprintf(stderr, "stress_poll: worker %u made no round for %u s\n", i,
					patience);
				abort();
			}
		}
	}
	__atomic_store_n(&stop, true, __ATOMIC_RELAXED);
	for (i = 0; i < WORKERS; i++)
		pthread_join(threads[i], NULL);
	printf("# %lu kills, %lu polls that finished some, %lu barriers, %lu forks\n", kills,
	       polls_that_finished, barriers, nr_forks);
	ok(kills > 0, "workers killed refs");
	ok(polls_that_finished > 0, "polls finished kills");
	/* Atomic: counted by other threads (their last counts came before
	 * the slots their workers waited for). */
	is(__atomic_load_n(&releases, __ATOMIC_RELAXED), kills, "every kill released once");
	is(bad_callbacks, 0, "no doubled release, refused call accepted, or failed child");
	return done_testing();
}
