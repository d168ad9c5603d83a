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
 *
 * Under AddressSanitizer no fork lands in an allocation or a free, as in
 * stress_fork.c (docs/percpu_ref.md: gcc 12's ASan takes none of its
 * allocator's locks around fork()).  A worker's free() may be allocating
 * the quarantine's next batch, under that size class's lock; a child that
 * inherits the lock held hangs as soon as the callback thread it starts
 * frees in ASan's thread start-up (pthread_getattr_np()'s buffer: its
 * first free allocates a quarantine batch too), and the child's barrier
 * waits for that thread until the deadline.  (Threads that only free,
 * forking, each child starting a thread: 3 children of 300 hung so,
 * stack and all; one CI run in ~85 hung a child of this test in its
 * barrier.)  And a worker still in its first round may be in ASan's
 * thread start-up or the runtime's set-up, which allocate too (a child
 * forked in the latter hung in its fork handler, in aligned_alloc(), with
 * no deadline armed yet).  So the main thread forks only once every
 * worker is past its first round (its one-time allocations: thread
 * start-up, runtime set-up, counter cache), and closes a gate around
 * fork() that the workers' inits and exits (the calls that allocate and
 * free) take.  The plain build forks amid all of them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "child.h"
#include "fork_gate.h"
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

/* Workers past their first round (atomic): under ASan a fork waits for
 * them (their one-time allocations), then closes tests/fork_gate.h. */
static unsigned int workers_ready;

/* Release: the worker's one-time allocations before a fork that saw it. */
static void worker_ready(void)
{
	__atomic_fetch_add(&workers_ready, 1, __ATOMIC_RELEASE);
}

/* Under ASan, false until every worker is ready (acquire: pairs with
 * worker_ready()); then the gate closes behind the allocators inside. */
static bool fork_when_ready(void)
{
#if defined(__SANITIZE_ADDRESS__)
	if (__atomic_load_n(&workers_ready, __ATOMIC_ACQUIRE) < WORKERS)
		return false;
#endif
	fork_begin();
	return true;
}

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
	allocating_begin();
	percpu_ref_exit(&s->ref);	/* frees */
	allocating_end();
	s->released = 0;
	s->live = false;
}

static void *worker(void *arg)
{
	unsigned int id = (unsigned int)(uintptr_t)arg, seed = id * 7919 + 1, next = 0, i;
	bool registered = false, failed;

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
		allocating_begin();
		failed = percpu_ref_init(&s->ref, release_slot, PERCPU_REF_ALLOW_REINIT) != 0;
		allocating_end();
		if (failed)
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
		if (__atomic_fetch_add(&rounds[id], 1, __ATOMIC_RELAXED) == 0)
			worker_ready();
	}
	for (i = 0; i < RING; i++)
		retire(&slots[id][i], registered);
	if (registered)
		percpu_ref_poll_unregister();
	return NULL;
}

/* A fork child: its barrier finishes what the parent's threads queued,
 * every kill made before the fork; nothing is released twice.  False if no fork was made (ASan: a worker
 * not ready yet). */
static bool fork_once(void)
{
	pid_t pid;

	if (!fork_when_ready())
		return false;
	pid = fork();
	if (pid == 0) {
		/* Counted by the parent before the fork (acquire: its kills'
		 * counts, read in this copy of its memory). */
		unsigned long killed = __atomic_load_n(&kills, __ATOMIC_ACQUIRE);
		unsigned int w, i;

		child_deadline(10);
		if (percpu_ref_barrier())
			_exit(4);
		/* Every kill the parent made before the fork is released here
		 * (the polling workers' queues too: dropped, they passed 3 of
		 * 3 runs that checked only for double releases), but for a
		 * @release running at the fork on a worker or the callback
		 * thread, which is that thread's, not the child's. */
		if (__atomic_load_n(&releases, __ATOMIC_ACQUIRE) + WORKERS + 1 < killed)
			_exit(6);
		for (w = 0; w < WORKERS; w++)
			for (i = 0; i < RING; i++)
				if (__atomic_load_n(&slots[w][i].released, __ATOMIC_ACQUIRE) > 1)
					_exit(5);
		_exit(0);
	}
	fork_end();
	if (wait_child(pid) != 0)
		__atomic_fetch_add(&bad_callbacks, 1, __ATOMIC_RELAXED);
	return true;
}

int main(void)
{
	double seconds = stress_seconds(5);
	unsigned int patience = UNDER_TSAN || UNDER_VALGRIND ? 30 : 10;
	bool forks = !UNDER_TSAN && !UNDER_VALGRIND;
	unsigned long seen[WORKERS] = { 0 }, barriers = 0, nr_forks = 0;
	uint64_t end = now_ns() + (uint64_t)(seconds * 1e9), last_progress[WORKERS];
	pthread_t threads[WORKERS];
	unsigned int i, seed = 42;

	for (i = 0; i < WORKERS; i++) {
		last_progress[i] = now_ns();
		if (pthread_create(&threads[i], NULL, worker, (void *)(uintptr_t)i))
			return 1;
	}
	while (stress_goes_on(end, __atomic_load_n(&polls_that_finished, __ATOMIC_RELAXED) > 0)) {
		usleep(1000 + rnd(&seed) % 4000);
		if (percpu_ref_barrier())
			__atomic_fetch_add(&bad_callbacks, 1, __ATOMIC_RELAXED);
		barriers++;
		if (forks && rnd(&seed) % 16 == 0 && fork_once())
			nr_forks++;
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
