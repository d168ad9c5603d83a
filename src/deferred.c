/* SPDX-License-Identifier: MIT */
/*
 * deferred.c - the library's callback thread: work that must wait for a
 * reader fence (the second half of an asynchronous switch to atomic mode).
 *
 * This is call_rcu() built for our own readers: callers queue an item after
 * publishing the new mode flags; the thread takes the whole queue, waits one
 * reader fence for the batch (percpuref_fence_readers(): membarrier for rseq
 * readers, the fallback readers' own grace period in a process without
 * rseq) and runs the items in queue order.  One fence covers every item
 * queued before it started, as one grace period covers every call_rcu()
 * before it.
 *
 * Why not liburcu's call_rcu: its worker hands items over through lock-free
 * queues the thread sanitizer cannot see (liburcu is not instrumented), it is
 * shared with every other liburcu user in the process, and we need to stop
 * our thread at shutdown and count fences.
 *
 * The queue.  Queueing takes no lock (issue 9: with one mutex per kill,
 * threads killing their own refs serialised on it and on a futex wake each,
 * and switch-storm lost half its throughput at two threads): callers push
 * onto a lock-free stack (pending) with a release CAS; the thread takes the
 * whole stack with an acquire exchange and reverses it into queue order, so
 * whatever a caller wrote before queueing is visible to the item's function.
 * Only a push that finds the thread asleep (or not started) takes
 * deferred_lock, to start or wake it, and not at once: the push leaves
 * that wake-up owed by the pushing thread (wake_owed), which pays it with
 * percpuref_deferred_wake_owed() once it has dropped the lock it pushed
 * under (a ref's switch lock).  Woken under that lock, the thread ran its
 * fence and then waited for the lock to finish the very item it was woken
 * for (switch-storm: one such wait per batch, nearly all futex waits on
 * the switch locks).  No wake-up is lost: the thread
 * swaps thread_sleeping in and then reads the stack, a pusher CASes the
 * stack and then reads thread_sleeping, all four sequentially consistent,
 * so one of them sees the other (Dekker).  The thread's side exchanges
 * rather than stores: C11 and aarch64 order a seq_cst store before a later
 * seq_cst load, but qemu-user runs aarch64's store-release and load-acquire
 * on x86 as a plain store and load, which pass each other in the store
 * buffer (a CI run hung on a wake-up so lost); a read-modify-write is a
 * locked instruction there.  The thread sets the flag under the lock and
 * keeps it until cond_wait releases the lock, so a pusher that saw it
 * signals a thread that is waiting or about to re-check.  Whatever the
 * functions did is visible to percpuref_wait_deferred() callers through
 * deferred_lock, under which the thread counts them done.
 *
 * Counting.  nr_queued is incremented before the push, nr_done after a whole
 * batch ran.  A waiter wants every item pushed before its call; it reads
 * nr_queued (>= those items) and waits for nr_done to reach it.  Items run
 * before the batch that takes the last of "its" items were all pushed (so
 * counted) before that one, so nr_done cannot reach the target until that
 * batch has run: a waiter never returns early, and items still being pushed
 * only make it wait longer.
 *
 * Stopping (shutdown, exit()): the stopper waits for the items queued
 * before its call, then sets thread.stopping; the thread exits after the
 * batch it is running, whatever was pushed since, and the stopper starts a
 * new thread if anything is left, or runs one batch itself if none can
 * start (percpuref_deferred_stop()).  A stop that waited for an empty
 * stack never came while another thread kept killing refs.  Every waiter
 * does the same while no thread can start (percpuref_wait_deferred()): a
 * barrier, an exit or a mode call waiting for an asynchronous switch runs
 * the batches on its own thread rather than fail or wait for ever.
 * tests/model/wakeup.pml checks that no push is stranded.
 *
 * Fork: a batch's runner (the thread, or a stopper that could not start
 * one) holds batch_lock (callback_batch.lock, rank DEFERRED_BATCH) from
 * taking the batch until its items have run and are counted, and fork
 * takes it first (runtime.c), so a fork falls inside a batch only where
 * the runner lets go of the lock: around a @release
 * (percpuref_batch_pause()), which may wait for a lock the forking thread
 * holds (a deadlock when fork waited for it).  The runner then keeps the
 * items not started in batch_rest, and its role (percpuref_batch_begin():
 * no second batch meanwhile, whose count could satisfy a waiter before
 * the first batch ran), so in the child
 * every item is done, queued, or in batch_rest, which the child queues
 * again (a batch cut in half was lost, with barrier and exit hanging for
 * it: issue 8, finding 2), but for the item whose @release was running:
 * its switch was finished, and its release is the parent's thread's.  The
 * thread does not exist in the child; the child starts its own if items
 * are queued.  An item some other thread was pushing at the fork may be
 * missing in the child (its caller does not exist there): the child counts
 * what is queued.  The price: fork waits for a batch's fence and for its
 * confirm callbacks, which run between halves of a switch.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>

#include "internal.h"

static struct percpuref_batch callback_batch = PERCPUREF_BATCH_INIT(PERCPUREF_RANK_DEFERRED_BATCH);
/* The runner's (callback_batch): the items of its batch not started. */
static struct percpuref_deferred *batch_rest;
static pthread_mutex_t deferred_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_queued = PTHREAD_COND_INITIALIZER;
static pthread_cond_t work_done = PTHREAD_COND_INITIALIZER;
/* Lock-free: pushed by any thread, taken whole by a batch (run_batch()). */
static struct percpuref_deferred *pending;
static unsigned long nr_queued;		/* atomic: items ever queued */
static unsigned long nr_done;		/* deferred_lock: items finished */
/* Written under deferred_lock; pushers read them without (see above). */
static struct percpuref_thread thread;
static bool thread_sleeping;
static unsigned long batch_fences;
/* This thread pushed onto the stack of a thread that may sleep. */
static __thread bool wake_owed;

/* Relaxed: a peek; the exchange that takes the items acquires. */
static bool queue_empty(void)
{
	return !__atomic_load_n(&pending, __ATOMIC_RELAXED);
}

/* Takes every pushed item, oldest first. */
static struct percpuref_deferred *take_pending(void)
{
	/* Acquire: pairs with the pushes' release CAS. */
	struct percpuref_deferred *top = __atomic_exchange_n(&pending, NULL, __ATOMIC_ACQUIRE);
	struct percpuref_deferred *batch = NULL, *next;

	for (; top; top = next) {
		next = top->next;
		top->next = batch;
		batch = top;
	}
	return batch;
}

/*
 * Deferred_lock held.  Says the thread is about to sleep (or stop), then
 * re-reads the stack: the Dekker pair of a push (see above).  True, with the
 * flag taken back, when something was pushed meanwhile.
 */
static bool pushed_while_going_to_sleep(void)
{
	/* An exchange, not a store: see above. */
	(void)__atomic_exchange_n(&thread_sleeping, true, __ATOMIC_SEQ_CST);
	if (!__atomic_load_n(&pending, __ATOMIC_SEQ_CST))
		return false;
	__atomic_store_n(&thread_sleeping, false, __ATOMIC_RELAXED);
	return true;
}

unsigned long percpuref_deferred_run(struct percpuref_deferred **rest)
{
	struct percpuref_deferred *item;
	unsigned long n;

	/* Taken off before it runs (it may free the item, or pause): a fork
	 * child finds in *rest exactly the items not started. */
	for (n = 0; (item = *rest); n++) {
		*rest = item->next;
		item->fn(item);
	}
	return n;
}

/*
 * deferred_lock held on entry and on return, dropped meanwhile.  Takes
 * every pushed item and runs them after one fence, all under batch_lock
 * (taken first: rank order), so that a fork waits for the batch.  Run by
 * the thread, or by a stopper that cannot start one.
 */
static void run_batch(void)
{
	unsigned long n;

	pthread_mutex_unlock(&deferred_lock);
	percpuref_batch_begin(&callback_batch);
	/* Empty only if another runner took the items first. */
	batch_rest = take_pending();
	if (batch_rest)
		percpuref_fence_readers();
	n = percpuref_deferred_run(&batch_rest);

	pthread_mutex_lock(&deferred_lock);
	batch_fences += n != 0;
	nr_done += n;
	pthread_cond_broadcast(&work_done);
	percpuref_batch_end(&callback_batch);
}

static void *deferred_thread(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&deferred_lock);
	for (;;) {
		while (queue_empty() && !thread.stopping) {
			if (pushed_while_going_to_sleep())
				break;
			pthread_cond_wait(&work_queued, &deferred_lock);
			__atomic_store_n(&thread_sleeping, false, __ATOMIC_RELAXED);
		}
		/* Stopping: as before sleeping (the Dekker pair), so that a
		 * later push owes a wake-up, which starts a new thread once
		 * thread.running is false; an earlier one stays queued, and
		 * the stopper starts a thread for it, or runs it if none can
		 * start (percpuref_deferred_stop()).
		 * A stop waits for no batch queued after it was asked: while
		 * another thread kept killing refs, this thread never found
		 * the stack empty, and shutdown and exit() hung. */
		if (thread.stopping) {
			(void)pushed_while_going_to_sleep();
			break;
		}
		run_batch();
	}
	__atomic_store_n(&thread.running, false, __ATOMIC_RELAXED);
	pthread_cond_broadcast(&work_done);
	pthread_mutex_unlock(&deferred_lock);
	return NULL;
}

/* Lock held.  A failure to start leaves the items queued for the next try. */
static bool ensure_thread(void)
{
	if (thread.running)
		return true;
	thread.stopping = false;
	__atomic_store_n(&thread_sleeping, false, __ATOMIC_RELAXED);
	__atomic_store_n(&thread.running,
			 percpuref_start_thread(&thread, deferred_thread, "percpuref-cb"),
			 __ATOMIC_RELAXED);
	return thread.running;
}

void percpuref_call_after_grace_period(struct percpuref_deferred *d, percpuref_deferred_fn fn)
{
	struct percpuref_deferred *top = __atomic_load_n(&pending, __ATOMIC_RELAXED);

	d->fn = fn;
	percpuref_note_work();
	/* Relaxed: a waiter that must see it is ordered after this call. */
	__atomic_fetch_add(&nr_queued, 1, __ATOMIC_RELAXED);
	do
		d->next = top;
	/* Release: the item and what the caller wrote before are visible to
	 * the thread, whose exchange acquires.  Seq_cst: the Dekker pair of
	 * the thread's going to sleep (see above). */
	while (!__atomic_compare_exchange_n(&pending, &top, d, true, __ATOMIC_SEQ_CST,
					    __ATOMIC_RELAXED));
	/* An awake thread takes the whole stack before it sleeps. */
	if (!__atomic_load_n(&thread.running, __ATOMIC_RELAXED) ||
	    __atomic_load_n(&thread_sleeping, __ATOMIC_SEQ_CST))
		wake_owed = true;
}

bool percpuref_deferred_start(void)
{
	bool running;

	pthread_mutex_lock(&deferred_lock);
	running = ensure_thread();
	pthread_mutex_unlock(&deferred_lock);
	return running;
}

void percpuref_deferred_wake_owed(void)
{
	bool running;

	if (!wake_owed)
		return;
	wake_owed = false;
	running = percpuref_deferred_start();
	/* Outside the lock, so the woken thread does not wait for it.  The
	 * thread set thread_sleeping under the lock and holds it until
	 * cond_wait releases it: having taken the lock, we know it waits. */
	if (running)
		pthread_cond_signal(&work_queued);
}

int percpuref_wait_deferred(void)
{
	unsigned long target;
	int cancel;

	/* Waiting for the thread while holding a batch lock (a callback) could
	 * wait for a fork waiting for us, or for ourselves. */
	if (percpuref_on_library_thread() || percpuref_holds_batch_lock())
		return -EDEADLK;
	target = __atomic_load_n(&nr_queued, __ATOMIC_RELAXED);
	cancel = percpuref_cancel_disable();
	pthread_mutex_lock(&deferred_lock);
	while (nr_done < target) {
		/* No thread can start (a sandbox that refuses clone, an
		 * exhausted RLIMIT_NPROC): run the batches here, as a stopper
		 * does.  Barriers returned -EAGAIN with the work undone, and
		 * exit waited for it for ever (wait_switch_done()). */
		if (!ensure_thread()) {
			run_batch();
			continue;
		}
		pthread_cond_wait(&work_done, &deferred_lock);
	}
	pthread_mutex_unlock(&deferred_lock);
	percpuref_cancel_restore(cancel);
	return 0;
}

bool percpuref_deferred_stop(void)
{
	bool ran = false, running;

	if (percpuref_wait_deferred() == -EDEADLK)
		return false;
	pthread_mutex_lock(&deferred_lock);
	percpuref_stop_thread(&thread, &deferred_lock, &work_queued, &work_done);
	pthread_mutex_lock(&deferred_lock);
	/* Pushed before the thread's last look, by a caller that found it
	 * awake (see deferred_thread()), or by the thread's own callbacks:
	 * nobody else would start a thread for it.  Ordered: the thread read
	 * the stack (seq_cst) before we joined.  If no thread can start, run
	 * them here, as the stopping thread did before it stopped at once;
	 * one batch, as others may keep pushing. */
	if (!queue_empty() && !ensure_thread()) {
		run_batch();
		ran = true;
	}
	running = thread.running;
	pthread_mutex_unlock(&deferred_lock);
	return running || ran;
}

static void deferred_exit_hook(void)
{
	(void)percpuref_deferred_stop();
}

static void batch_fork_prepare(void)
{
	percpuref_batch_fork_prepare(&callback_batch);
}

static void batch_fork_parent(void)
{
	percpuref_batch_fork_parent(&callback_batch);
}

/* The items not started went back on the queue (queue_fork_child()). */
static void batch_fork_child(void)
{
	percpuref_batch_fork_child(&callback_batch);
}

static void queue_fork_prepare(void)
{
	pthread_mutex_lock(&deferred_lock);
	percpuref_wait_thread_started(&thread);
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
	 * signal could be spent on one of them: start both from scratch.  A
	 * batch is in flight only paused in a @release (batch_lock is ours):
	 * the items it had not started go back under the pending ones, oldest
	 * at the bottom of the stack, to run again after a fence of the
	 * child's; the release in progress was the parent's thread's and goes
	 * on there only.  What is queued now is all that is left.
	 */
	struct percpuref_deferred *d, **bottom = &pending, *rest = NULL;
	unsigned long queued = 0;

	pthread_cond_init(&work_queued, NULL);
	pthread_cond_init(&work_done, NULL);
	thread.running = false;
	thread_sleeping = false;
	thread.stopping = false;
	while ((d = batch_rest)) {
		batch_rest = d->next;
		d->next = rest;
		rest = d;
	}
	while (*bottom)
		bottom = &(*bottom)->next;
	*bottom = rest;
	for (d = pending; d; d = d->next)
		queued++;
	nr_queued = nr_done + queued;
	if (pending)
		ensure_thread();
	pthread_mutex_unlock(&deferred_lock);
}

static const struct percpuref_fork_hooks batch_hooks = {
	.rank = PERCPUREF_RANK_DEFERRED_BATCH,
	.prepare = batch_fork_prepare,
	.parent = batch_fork_parent,
	.child = batch_fork_child,
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
	percpuref_register_exit_hook(PERCPUREF_RANK_DEFERRED_BATCH, deferred_exit_hook);
}

unsigned long percpuref_deferred_fences(void)
{
	unsigned long n;

	pthread_mutex_lock(&deferred_lock);
	n = batch_fences;
	pthread_mutex_unlock(&deferred_lock);
	return n;
}
