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
 * Fork: the thread does not exist in a child; deferred_lock is held across
 * fork (runtime.c), the child marks the thread absent and the next queue or
 * barrier call starts it again, so items queued before fork still run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>

#include "internal.h"

pthread_mutex_t percpuref_deferred_lock = PTHREAD_MUTEX_INITIALIZER;
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
	pthread_mutex_lock(&percpuref_deferred_lock);
	for (;;) {
		while (!queue_head && !thread_stopping)
			pthread_cond_wait(&work_queued, &percpuref_deferred_lock);
		if (!queue_head)
			break;
		batch = queue_head;
		queue_head = NULL;
		queue_tail = &queue_head;
		pthread_mutex_unlock(&percpuref_deferred_lock);

		percpuref_fence_readers();
		for (n = 0; batch; batch = next, n++) {
			next = batch->next;	/* the function may free the item */
			batch->fn(batch);
		}

		pthread_mutex_lock(&percpuref_deferred_lock);
		batch_fences++;
		nr_done += n;
		pthread_cond_broadcast(&work_done);
	}
	thread_running = false;
	pthread_cond_broadcast(&work_done);
	pthread_mutex_unlock(&percpuref_deferred_lock);
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
	pthread_mutex_lock(&percpuref_deferred_lock);
	d->fn = fn;
	d->next = NULL;
	*queue_tail = d;
	queue_tail = &d->next;
	nr_queued++;
	if (ensure_thread())
		pthread_cond_signal(&work_queued);
	pthread_mutex_unlock(&percpuref_deferred_lock);
}

bool percpuref_on_deferred_thread(void)
{
	bool on;

	pthread_mutex_lock(&percpuref_deferred_lock);
	on = thread_running && pthread_equal(pthread_self(), thread);
	pthread_mutex_unlock(&percpuref_deferred_lock);
	return on;
}

int percpuref_wait_deferred(void)
{
	unsigned long target;
	int ret = 0;

	if (percpuref_on_deferred_thread())
		return -EDEADLK;
	pthread_mutex_lock(&percpuref_deferred_lock);
	target = nr_queued;
	while (nr_done < target) {
		if (!ensure_thread()) {
			ret = -EAGAIN;
			break;
		}
		pthread_cond_wait(&work_done, &percpuref_deferred_lock);
	}
	pthread_mutex_unlock(&percpuref_deferred_lock);
	return ret;
}

void percpuref_deferred_stop(void)
{
	pthread_t joinee;

	if (percpuref_wait_deferred())
		return;
	pthread_mutex_lock(&percpuref_deferred_lock);
	if (!thread_running) {
		pthread_mutex_unlock(&percpuref_deferred_lock);
		return;
	}
	thread_stopping = true;
	joinee = thread;
	pthread_cond_signal(&work_queued);
	pthread_mutex_unlock(&percpuref_deferred_lock);
	pthread_join(joinee, NULL);
}

void percpuref_deferred_after_fork_child(void)
{
	/*
	 * Lock held across fork by runtime.c.  The thread is gone, and a
	 * condition variable it (or any parent thread) waited on keeps those
	 * phantom waiters in the child, where a signal could be spent on one
	 * of them: start both from scratch.
	 */
	pthread_cond_init(&work_queued, NULL);
	pthread_cond_init(&work_done, NULL);
	thread_running = false;
	thread_stopping = false;
}

unsigned long percpuref_deferred_fences(void)
{
	unsigned long n;

	pthread_mutex_lock(&percpuref_deferred_lock);
	n = batch_fences;
	pthread_mutex_unlock(&percpuref_deferred_lock);
	return n;
}
