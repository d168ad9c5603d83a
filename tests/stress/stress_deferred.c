/* SPDX-License-Identifier: MIT */
/*
 * Stress of the callback thread's hand-off (src/deferred.c): one thread
 * queues an item, waits until it ran, and queues the next at once, so that
 * pushes keep landing while the callback thread finishes a batch and goes
 * to sleep (with one pusher it goes to sleep after nearly every item).
 * That is the window of the Dekker pair between a push and the thread's
 * going to sleep: if either side's store can pass its later load, the push
 * sees the thread awake, the thread sees an empty stack, and the item is
 * never run (a lost wake-up; only the next push would run it).  The pusher
 * varies how long it waits before the next push, to sweep the window.
 * Only where a seq_cst store can pass a later seq_cst load does the window
 * open: under qemu-user (aarch64 on x86), when the thread's side stored
 * instead of exchanging, 4 s runs lost an item in 7 of 8 tries; x86 and
 * aarch64 hardware order those, so there the test guards the protocol.
 *
 * Checked: every item runs exactly once, in turn, and none waits longer
 * than LOST_AFTER_S: the thread sleeps with no timeout, so an item it
 * missed waits for ever.  A lost item is counted, then another push wakes
 * the thread so that the test ends.
 * Duration: STRESS_SECONDS (default 2).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include <percpuref/percpu_ref.h>

#include "internal.h"
#include "rnd.h"
#include "tap.h"

#define LOST_AFTER_S 10.0
#define SPIN_MAX 256
#define MIN_PUSHES 100

struct item {
	struct percpuref_deferred deferred;
	long seq;
};

static long ran;			/* items run; callback thread, atomic */
static long not_in_turn, lost, pushes;
static int stop;
static struct percpuref_deferred wake_item;

static void item_ran(struct percpuref_deferred *d)
{
	struct item *it = (struct item *)d;

	/* Only this thread writes ran; release: the pusher reuses the item
	 * once it sees the count. */
	if (__atomic_load_n(&ran, __ATOMIC_RELAXED) != it->seq)
		__atomic_fetch_add(&not_in_turn, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&ran, it->seq + 1, __ATOMIC_RELEASE);
}

static void wake_ran(struct percpuref_deferred *d)
{
	(void)d;
}

/* Waits until item @seq ran; false if that took LOST_AFTER_S. */
static bool wait_ran(long seq)
{
	double waiting = 0;
	unsigned long polls = 0;

	/* Acquire: pairs with item_ran()'s release; the item is free. */
	while (__atomic_load_n(&ran, __ATOMIC_ACQUIRE) != seq + 1) {
		/* The clock only now and then, to push again at once. */
		if (++polls % 65536)
			continue;
		if (polls == 65536)
			waiting = now_seconds();
		else if (now_seconds() - waiting > LOST_AFTER_S)
			return false;
	}
	return true;
}

static void *pusher(void *arg)
{
	unsigned int seed = 1, spin;
	struct item it = { .seq = 0 };

	(void)arg;
	for (; !__atomic_load_n(&stop, __ATOMIC_RELAXED); it.seq++) {
		percpuref_call_after_grace_period(&it.deferred, item_ran);
		percpuref_deferred_wake_owed();	/* no lock held: at once */
		if (!wait_ran(it.seq)) {
			/* The thread sleeps on our item: a push wakes it. */
			lost++;
			percpuref_call_after_grace_period(&wake_item, wake_ran);
			percpuref_deferred_wake_owed();
			if (!wait_ran(it.seq)) {
				printf("Bail out! item %ld still not run after a second push\n",
				       it.seq);
				_exit(1);
			}
			break;	/* the wake item is queued once */
		}
		/* The next push at once, or after a short random spin. */
		for (spin = rnd(&seed) % SPIN_MAX; spin; spin--)
			__asm__ __volatile__("" ::: "memory");
	}
	pushes = it.seq + (lost ? 1 : 0);
	return NULL;
}

int main(void)
{
	uint64_t end = now_ns() + (uint64_t)(stress_seconds(2) * 1e9);
	pthread_t thread;

	/* The runtime, so that every batch pays its real reader fence. */
	printf("# fast path: %s\n", percpuref_fast_path());
	if (pthread_create(&thread, NULL, pusher, NULL))
		return 1;
	while (stress_goes_on(end, __atomic_load_n(&ran, __ATOMIC_RELAXED) > MIN_PUSHES))
		percpuref_sleep_us(10000);
	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	pthread_join(thread, NULL);
	is(percpuref_wait_deferred(), 0, "every queued item finished");
	printf("# %ld items pushed, %ld ran, %lu batches\n", pushes, ran,
	       percpuref_deferred_fences());
	ok(pushes > MIN_PUSHES || lost, "the pusher made progress");
	is(ran, pushes, "every item ran");
	is(not_in_turn, 0, "every item ran once, in turn");
	is(lost, 0, "no item waited %.0f s for a thread that slept (lost wake-up)",
	   LOST_AFTER_S);
	return done_testing();
}
