/* SPDX-License-Identifier: MIT */
/*
 * deferred.c - the library's callback thread: work that must wait for a
 * reader fence (the second half of an asynchronous switch to atomic mode).
 *
 * This is call_rcu() built for our own readers: callers queue an item after
 * publishing the new mode flags; the thread takes the whole queue, waits one
 * reader fence for the batch (percpuref_fence_readers(): membarrier for rseq
 * readers, plus a liburcu-bp grace period once fallback readers exist) and
 * runs the items in queue order.  One fence covers every item queued before
 * it started, as one grace period covers every call_rcu() before it.
 *
 * Why not liburcu's call_rcu: its worker hands items over through lock-free
 * queues the thread sanitizer cannot see (liburcu is not instrumented), it is
 * shared with every other liburcu user in the process, and we need to stop
 * our thread at shutdown and count fences.  Here every hand-off goes through
 * deferred_lock, so ordering is plain mutex ordering: whatever the caller
 * wrote before queueing is visible to the item's function, and whatever the
 * functions did is visible to percpuref_deferred_barrier() callers.
 *
 * Fork: the thread holds batch_lock (rank DEFERRED_BATCH) from taking a
 * batch until its items have run and are counted, and fork takes it first
 * (runtime.c), so a fork never falls inside a batch: in the child every
 * item is either done or still queued (a batch cut in half was lost, with
 * barrier and exit hanging for it: issue 8, finding 2).  The thread does
 * not exist in the child; the child starts its own if items are queued.
 * The price: fork waits for a batch in flight, callbacks included.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>

#include "internal.h"

static pthread_mutex_t batch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t deferred_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_queued = PTHREAD_COND_INITIALIZER;
static pthread_cond_t work_done = PTHREAD_COND_INITIALIZER;
static struct percpuref_deferred *queue_head, **queue_tail = &queue_head;
static unsigned long nr_queued, nr_done;	/* items ever queued / finished */
static bool thread_running, thread_stopping;
static pthread_t thread;
static unsigned long batch_fences;

static void *deferred_thread(void *arg)
{
	struct percpuref_deferred *batch, *next;
	unsigned long n;

	(void)arg;
	pthread_mutex_lock(&deferred_lock);
	for (;;) {
		while (!queue_head && !thread_stopping)
			pthread_cond_wait(&work_queued, &deferred_lock);
		if (!queue_head)
			break;
		/* In rank order: the batch lock, then the queue's.  Only this
		 * thread takes items, so the queue is still non-empty. */
		pthread_mutex_unlock(&deferred_lock);
		percpuref_batch_lock(PERCPUREF_RANK_DEFERRED_BATCH, &batch_lock);
		pthread_mutex_lock(&deferred_lock);
		batch = queue_head;
		queue_head = NULL;
		queue_tail = &queue_head;
		pthread_mutex_unlock(&deferred_lock);

		percpuref_fence_readers();
		for (n = 0; batch; batch = next, n++) {
			next = batch->next;	/* the function may free the item */
			batch->fn(batch);
		}

		pthread_mutex_lock(&deferred_lock);
		batch_fences++;
		nr_done += n;
		pthread_cond_broadcast(&work_done);
		percpuref_batch_unlock(PERCPUREF_RANK_DEFERRED_BATCH, &batch_lock);
	}
	thread_running = false;
	pthread_cond_broadcast(&work_done);
	pthread_mutex_unlock(&deferred_lock);
	return NULL;
}

/* Lock held.  A failure to start leaves the items queued for the next try. */
static bool ensure_thread(void)
{
	if (thread_running)
		return true;
	thread_stopping = false;
	thread_running = percpuref_start_thread(&thread, deferred_thread, "percpuref-cb");
	return thread_running;
}

void percpuref_call_after_grace_period(struct percpuref_deferred *d, percpuref_deferred_fn fn)
{
	pthread_mutex_lock(&deferred_lock);
	d->fn = fn;
	d->next = NULL;
	*queue_tail = d;
	queue_tail = &d->next;
	nr_queued++;
	if (ensure_thread())
		pthread_cond_signal(&work_queued);
	pthread_mutex_unlock(&deferred_lock);
}

int percpuref_wait_deferred(void)
{
	unsigned long target;
	int ret = 0;

	/* Waiting for the thread while holding a batch lock (a callback) could
	 * wait for a fork waiting for us, or for ourselves. */
	if (percpuref_on_library_thread() || percpuref_holds_batch_lock())
		return -EDEADLK;
	pthread_mutex_lock(&deferred_lock);
	target = nr_queued;
	while (nr_done < target) {
		if (!ensure_thread()) {
			ret = -EAGAIN;
			break;
		}
		pthread_cond_wait(&work_done, &deferred_lock);
	}
	pthread_mutex_unlock(&deferred_lock);
	return ret;
}

void percpuref_deferred_stop(void)
{
	pthread_t joinee;

	if (percpuref_wait_deferred())
		return;
	pthread_mutex_lock(&deferred_lock);
	if (!thread_running) {
		pthread_mutex_unlock(&deferred_lock);
		return;
	}
	thread_stopping = true;
	joinee = thread;
	pthread_cond_signal(&work_queued);
	pthread_mutex_unlock(&deferred_lock);
	pthread_join(joinee, NULL);
}

static void batch_fork_prepare(void)
{
	percpuref_batch_lock(PERCPUREF_RANK_DEFERRED_BATCH, &batch_lock);
}

static void batch_fork_release(void)
{
	percpuref_batch_unlock(PERCPUREF_RANK_DEFERRED_BATCH, &batch_lock);
}

static void queue_fork_prepare(void)
{
	pthread_mutex_lock(&deferred_lock);
}

static void queue_fork_parent(void)
{
	pthread_mutex_unlock(&deferred_lock);
}

static void queue_fork_child(void)
{
	/*
	 * The thread is gone, and a condition variable it (or any parent
	 * thread) waited on keeps those phantom waiters in the child, where a
	 * signal could be spent on one of them: start both from scratch.  No
	 * batch is in flight (batch_lock): what is queued is all that is left.
	 */
	pthread_cond_init(&work_queued, NULL);
	pthread_cond_init(&work_done, NULL);
	thread_running = false;
	thread_stopping = false;
	if (queue_head)
		ensure_thread();
	pthread_mutex_unlock(&deferred_lock);
}

static const struct percpuref_fork_hooks batch_hooks = {
	.rank = PERCPUREF_RANK_DEFERRED_BATCH,
	.prepare = batch_fork_prepare,
	.parent = batch_fork_release,
	.child = batch_fork_release,
};

static const struct percpuref_fork_hooks queue_hooks = {
	.rank = PERCPUREF_RANK_DEFERRED,
	.prepare = queue_fork_prepare,
	.parent = queue_fork_parent,
	.child = queue_fork_child,
};

static __attribute__((constructor)) void deferred_register(void)
{
	percpuref_register_fork_hooks(&batch_hooks);
	percpuref_register_fork_hooks(&queue_hooks);
	percpuref_register_exit_hook(PERCPUREF_RANK_DEFERRED_BATCH, percpuref_deferred_stop);
}

unsigned long percpuref_deferred_fences(void)
{
	unsigned long n;

	pthread_mutex_lock(&deferred_lock);
	n = batch_fences;
	pthread_mutex_unlock(&deferred_lock);
	return n;
}
