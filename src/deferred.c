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
 * The queue.  Queueing takes no lock (with one mutex per kill,
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
 * Giving way (0.4.18).  Where the CPUs are all busy, the thread shares one
 * with threads that kill (in switch-storm, worker 0's, whose first kill
 * started it: the library's threads take the CPUs of the thread that
 * starts them).  Woken by their kills, it ran batches of a few items, each
 * with a fence that interrupts every CPU running the process: the more CPU
 * it got, the smaller its batches and the more fences (0.4.17 took the
 * reclaimer's load off that CPU, and `managed` got slower so).  So before
 * a batch, if a fence started within PERCPUREF_CALLBACK_YIELD_US (300 µs)
 * and nobody waits for the thread in percpuref_wait_deferred() (a barrier,
 * a shutdown, process exit), in the backlog (a paced kill) or for an
 * asynchronous switch it is to end (a sync switch, a reinit or an exit
 * behind it; both counted by percpuref_deferred_waiter_begin()), it
 * yields once (give_way_after_a_fence()): the killers on its CPU run
 * first, and what they queue joins the batch.  Where nothing else is
 * runnable the yield returns at once; a fence after a quiet spell does not
 * yield at all.  The price is latency where the CPU is contended: the
 * batch waits until the threads ready there have had their turn (on Linux
 * a scheduler slice each at most).  The Dekker pair is untouched: the
 * thread is awake (thread_sleeping false) across the yield, and
 * run_batch() takes the stack after it; a stop asked meanwhile is seen
 * before the batch.
 *
 * Counting.  nr_queued is incremented before the push, nr_done after a whole
 * batch ran.  A waiter wants every item pushed before its call; it reads
 * nr_queued (>= those items) and waits for nr_done to reach it.  Items run
 * before the batch that takes the last of "its" items were all pushed (so
 * counted) before that one, so nr_done cannot reach the target until that
 * batch has run: a waiter never returns early, and items still being pushed
 * only make it wait longer.  tests/model/deferred.pml (Model Q) checks it
 * with the polling threads' queues, hand-overs and a second runner.
 *
 * Stopping (shutdown, exit()): the stopper waits for the items queued
 * before its call, then sets thread.stopping; the thread exits after the
 * batch it is running, whatever was pushed since, and the stopper starts a
 * new thread if anything is left (its own poll queue, if it polls, taken
 * over again first), or runs one batch itself if none can start
 * (percpuref_deferred_stop()).  A stop that waited for an empty
 * stack never came while another thread kept killing refs.  Every waiter
 * does the same while no thread can start (percpuref_wait_deferred()): a
 * barrier, an exit or a mode call waiting for an asynchronous switch runs
 * the batches on its own thread rather than fail or wait for ever.
 * tests/model/wakeup.pml checks that no push is stranded.
 *
 * Backlog.  Killing refs costs the killer less than finishing them costs the
 * thread (a thread making and killing refs in a loop left 2 million
 * waiting after 2 s, 395 MB, and a shutdown or exit() waited for them all).
 * A push that leaves more than PERCPUREF_CALLBACK_BACKLOG items (default
 * 65536) queued and not done makes its caller wait, as the kill or switch
 * returns (percpuref_deferred_pace(), holding no lock of ours: the
 * thread's items take the switch locks), for the items before its own but
 * half the limit: runtime.c's percpuref_backlog_wait(), with its rules
 * (no wait in a callback or read-side section; after a stall, none until
 * the thread has run more items), which the reclaimer's RCU queue shares
 * (managed.c).  The runner counts each item it ran (backlog.ran), so that
 * a wait sees its target reached in the middle of a batch and tells a
 * thread stuck in a callback from a long batch.  A polling thread's items
 * never reach the stack: its polls pace it.
 *
 * Fork: a batch's runner (the thread, or a stopper that could not start one)
 * holds batch_lock (callback_batch.lock, rank DEFERRED_BATCH) from taking the
 * batch until its items have run and are counted, and fork takes it first
 * (runtime.c), so a fork falls inside a batch only where the runner lets go of
 * the lock: around a @release (percpuref_batch_pause()), which may wait for a
 * lock the forking thread holds (a deadlock when fork waited for it).  The
 * runner then keeps the items not started in batch_rest, and its role
 * (percpuref_batch_begin(): no second batch meanwhile, whose count could
 * satisfy a waiter before the first batch ran), so in the child every item is
 * done, queued, or in batch_rest, which the child queues again (a batch cut in
 * half was lost, with barrier and exit hanging for it: test_hardening.c,
 * finding 2), but for the item whose @release was running: its switch was
 * finished, and its release is the parent's thread's.  The thread does not
 * exist in the child; the child starts its own if items are queued.  An item
 * some other thread was pushing at the fork may be missing in the child (its
 * caller does not exist there): the child counts what is queued.  The price:
 * fork waits for a batch's fence and for its confirm callbacks, which run
 * between halves of a switch.
 *
 * Polling threads (percpu_ref_poll_register()).  A registered thread's
 * items go on a queue of its own (struct poller: a FIFO under its lock,
 * taken only briefly), each stamped with the fence tickets taken so far
 * (runtime.c: percpuref_fence_stamp(), read after the seq_cst exchange
 * that published the caller's mode flags).  Its percpu_ref_poll() takes the
 * prefix whose stamps a fence has covered (stamps rise along the queue:
 * one thread stamps them in order) and runs it under the poller's batch
 * lock, as the callback thread runs its batch (pausing around a
 * @release; rest holds what is not started), so the acquire that saw
 * the ticket covered orders the fold after every commit that fence saw.
 * With nothing covered, it runs a fence if none started in the last
 * poll_interval_ns (any thread's).  With
 * PERCPU_REF_POLL_WAIT and nothing finished yet, it waits for a fence
 * that started after its oldest item, or runs one if none did: a fence
 * covers every thread's items queued before it, so threads whose oldest
 * items are as old share it (a thread that waited for each batch with a
 * fence of its own interrupted every other CPU once a batch).  It returns
 * once it finished some.  So the kernel's shape: the second half of a
 * kill runs where it was queued, and the fences are shared.  Nothing is
 * stranded on a queue whose thread does not poll: a barrier, an exit,
 * unregistering and thread exit move the queues, and a call waiting for
 * a switch in flight moves that switch's item (found through polled_by:
 * percpuref_deferred_take_polled_item(); it may overtake older items of
 * its queue, which nothing orders against), onto the callback
 * thread's stack (where an extra fence only delays them), pushing under
 * the poller's lock, which fork takes: a fork child finds each item on
 * one queue or the other, never in a hand-over's hands; a barrier then
 * also waits until each other poller has run what its poll had taken
 * (nr_done reaching the nr_taken it read, under the poller's lock).
 * Counts only rise, and a poller is never freed (the next thread to
 * register claims it), so a barrier walks the registry without a lock
 * (published with a release store; next never changes).  Fork takes the
 * registry lock and every poller's batch lock (rank POLL_BATCH), then
 * with the queue lock every poller's lock (rank DEFERRED; the list as it
 * was then, fork_pollers: a fork from a callback holds no registry lock,
 * and a poller registered since is not the fork's to unlock): in the child,
 * the pollers of threads that do not exist hand their queue and rest to
 * the callback thread; the forking thread's keeps its own.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>

#include "internal.h"

static struct percpuref_batch callback_batch = PERCPUREF_BATCH_INIT(PERCPUREF_RANK_DEFERRED_BATCH);
/* The runner's (callback_batch): the items of its batch not started. */
static struct percpuref_deferred *batch_rest;
static pthread_mutex_t deferred_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_queued = PTHREAD_COND_INITIALIZER;
/* On CLOCK_MONOTONIC (timed waits) once the thread is first started, or
 * in a fork child: ensure_thread(), queue_fork_child(). */
static pthread_cond_t work_done = PTHREAD_COND_INITIALIZER;
/* Lock-free: pushed by any thread, taken whole by a batch (run_batch()). */
static struct percpuref_deferred *pending;
static unsigned long nr_queued;		/* atomic: items ever queued */
static unsigned long nr_done;		/* deferred_lock (read without: pacing) */
/* Written under deferred_lock; pushers read them without (see above). */
static struct percpuref_thread thread;
static bool thread_sleeping;
static unsigned long batch_fences;
static unsigned long gave_way;		/* give_way_after_a_fence()'s yields */
/* Callers waiting for the thread, in percpuref_wait_deferred() or for an
 * asynchronous switch to end (atomic; see percpuref_deferred_waiter_begin()). */
static unsigned long waiters;
/* This thread pushed onto the stack of a thread that may sleep. */
static __thread bool wake_owed;

/* Backlog (see above). */
static struct percpuref_backlog backlog =
	PERCPUREF_BACKLOG_INIT(&deferred_lock, &work_done, &nr_queued, &nr_done, &thread);
/* This thread's push passed the limit: it waits once its locks are
 * dropped, for the items before the backlog_owed_queued-th. */
static __thread bool backlog_owed;
static __thread unsigned long backlog_owed_queued;

/*
 * A poll starts a fence only if none started in this long (any thread's):
 * sixteen CPUs then take an interrupt from our polls once every 300 µs at
 * most, however many kills they queue.  It is also about how long a kill
 * waits for its fence on a thread that polls often.  PERCPUREF_POLL_
 * INTERVAL_US sets it (0..1000000), read at the first registration.
 */
#define POLL_INTERVAL_DEFAULT_US 300
static uint64_t poll_interval_ns = POLL_INTERVAL_DEFAULT_US * UINT64_C(1000);
static pthread_once_t poll_interval_once = PTHREAD_ONCE_INIT;

/*
 * The callback thread gives way before a batch when a fence started less
 * than this long ago (give_way_after_a_fence()): the poll interval's
 * default, so that it yields where fences come about as often as polls
 * may start them.  PERCPUREF_CALLBACK_YIELD_US sets it (0..1000000; 0:
 * never), read as the thread starts.
 */
#define CALLBACK_YIELD_DEFAULT_US 300
static uint64_t callback_yield_ns = CALLBACK_YIELD_DEFAULT_US * UINT64_C(1000);
static pthread_once_t callback_yield_once = PTHREAD_ONCE_INIT;

static void read_callback_yield(void)
{
	unsigned long us;

	if (percpuref_env_ulong("percpuref-cb", "PERCPUREF_CALLBACK_YIELD_US", 1000000, &us))
		callback_yield_ns = us * UINT64_C(1000);
}

static void read_poll_interval(void)
{
	unsigned long us;

	if (percpuref_env_ulong("percpu_ref_poll_register", "PERCPUREF_POLL_INTERVAL_US",
				1000000, &us))
		poll_interval_ns = us * UINT64_C(1000);
}

/*
 * A polling thread's state (percpu_ref_poll_register()).  Never freed: a
 * thread that stops polling leaves it for the next one to claim, so that
 * barrier and exit walk the registry without a lock.
 */
struct poller {
	struct percpuref_batch batch;	/* its polls, as callback_batch */
	pthread_mutex_t lock;		/* rank DEFERRED: the fields below */
	pthread_cond_t ran;		/* broadcast when nr_done rises */
	struct percpuref_deferred *head, **tail;	/* queued, oldest first */
	struct percpuref_deferred *rest;	/* batch: taken, not started */
	unsigned long nr_taken, nr_done;	/* items taken by polls, and run */
	bool in_use;			/* also written under registry_lock */
	struct poller *next;		/* set before publication */
};
/* Published with a release store, pushed under registry_lock. */
static struct poller *pollers;
/* Registration, release, fork: rank POLL_BATCH, before every poll batch. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread struct poller *my_poller;
static __thread bool poller_exit_armed;
/* The C++ poll_registration that registered this thread (percpuref.hpp):
 * one slot for the process, whatever copies of the header's code its
 * plugins hold, which a thread_local of the header's own was not. */
static __thread void *poll_owner;

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
	/* Relaxed: we stay awake and take the stack, and swap the flag in
	 * again (seq_cst, above) before we sleep, or we stop and leave the
	 * items to the stopper (push_pending()).  A pusher that reads the
	 * stale true only owes a wake-up. */
	__atomic_store_n(&thread_sleeping, false, __ATOMIC_RELAXED);
	return true;
}

unsigned long percpuref_deferred_run(struct percpuref_deferred **rest,
				     struct percpuref_backlog *counted)
{
	struct percpuref_deferred *item;
	unsigned long n;

	/* Taken off before it runs (it may free the item, or pause): a fork
	 * child finds in *rest exactly the items not started. */
	for (n = 0; (item = *rest); n++) {
		*rest = item->next;
		item->fn(item);
		/* Relaxed: a count that paced callers compare (runtime.c). */
		if (counted)
			__atomic_fetch_add(&counted->ran, 1, __ATOMIC_RELAXED);
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
	n = percpuref_deferred_run(&batch_rest, &backlog);

	pthread_mutex_lock(&deferred_lock);
	batch_fences += n != 0;
	/* Relaxed: read without the lock by percpuref_backlog_over(). */
	__atomic_store_n(&nr_done, nr_done + n, __ATOMIC_RELAXED);
	pthread_cond_broadcast(&work_done);
	percpuref_batch_end(&callback_batch);
}

/*
 * The thread's, deferred_lock held (dropped around the yield): a fence that
 * started less than callback_yield_ns ago (any thread's) means kills are
 * coming fast, and this batch's fence would interrupt every CPU again at
 * once.  So whatever else is runnable on this CPU (the killers, where the
 * CPUs are all busy) runs first, and what they queue meanwhile joins this
 * batch: sched_yield(), which returns at once where nothing else is
 * runnable.  Once a batch: the yield only orders us behind those ready now.
 * Not while a caller waits for the thread (a barrier, a shutdown, a paced
 * kill, a switch it is to end): the yield would lie on its path.
 */
static void give_way_after_a_fence(void)
{
	/* Relaxed: see percpuref_deferred_waiter_begin(). */
	if (__atomic_load_n(&waiters, __ATOMIC_RELAXED) || backlog.waiting ||
	    !percpuref_fence_started_within(callback_yield_ns))
		return;
	pthread_mutex_unlock(&deferred_lock);
	sched_yield();
	pthread_mutex_lock(&deferred_lock);
	gave_way++;
}

static void *deferred_thread(void *arg)
{
	(void)arg;
	/* Before the lock: a warning writes to stderr, which may block. */
	pthread_once(&callback_yield_once, read_callback_yield);
	pthread_mutex_lock(&deferred_lock);
	for (;;) {
		while (queue_empty() && !thread.stopping) {
			if (pushed_while_going_to_sleep())
				break;
			pthread_cond_wait(&work_queued, &deferred_lock);
			/* Relaxed: as in pushed_while_going_to_sleep(). */
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
		give_way_after_a_fence();
		/* A stop asked during the yield: as before the batch. */
		if (thread.stopping)
			continue;
		run_batch();
	}
	/* Relaxed: under deferred_lock, which orders it for ensure_thread()
	 * and the stopper; a pusher reads it without the lock, and our last
	 * look at the stack, made first, covers a stale read
	 * (push_pending()). */
	__atomic_store_n(&thread.running, false, __ATOMIC_RELAXED);
	pthread_cond_broadcast(&work_done);
	pthread_mutex_unlock(&deferred_lock);
	return NULL;
}

static void init_work_done(void)
{
	percpuref_cond_init(&work_done);
}

/*
 * Lock held.  A failure to start leaves the items queued for the next try.
 * Every wait on work_done follows a call that found the thread running, so
 * the condition variable gets its clock here, before the first start, and
 * not in a constructor: a program linked with the static library runs its
 * own constructors first, and kills there waited on the default clock with
 * monotonic deadlines, or on one reset under them (test_early_constructor).
 */
static bool ensure_thread(void)
{
	static pthread_once_t work_done_once = PTHREAD_ONCE_INIT;

	if (thread.running)
		return true;
	pthread_once(&work_done_once, init_work_done);
	thread.stopping = false;
	/* Relaxed, both: under deferred_lock, which orders them for its
	 * next holders; pushers read them without it (push_pending()), and
	 * the new thread swaps thread_sleeping in (seq_cst) before it
	 * first sleeps. */
	__atomic_store_n(&thread_sleeping, false, __ATOMIC_RELAXED);
	__atomic_store_n(&thread.running,
			 percpuref_start_thread(&thread, deferred_thread, "percpuref-cb"),
			 __ATOMIC_RELAXED);
	return thread.running;
}

/* Onto the callback thread's queue, counted; leaves a wake-up owed if the
 * thread may sleep.  Returns nr_queued with it. */
static unsigned long push_pending(struct percpuref_deferred *d)
{
	struct percpuref_deferred *top = __atomic_load_n(&pending, __ATOMIC_RELAXED);
	/* Relaxed: a waiter that must see it is ordered after this call. */
	unsigned long queued = __atomic_add_fetch(&nr_queued, 1, __ATOMIC_RELAXED);

	do
		d->next = top;
	/* Release: the item and what the caller wrote before are visible to
	 * the thread, whose exchange acquires.  Seq_cst: the Dekker pair of
	 * the thread's going to sleep (see above). */
	while (!__atomic_compare_exchange_n(&pending, &top, d, true, __ATOMIC_SEQ_CST,
					    __ATOMIC_RELAXED));
	/* An awake thread takes the whole stack before it sleeps.  Relaxed,
	 * running: written under deferred_lock.  A stale false owes a
	 * needless wake-up.  A stale true: a stopping thread makes the
	 * Dekker pair's look at the stack before it clears running, so we
	 * read thread_sleeping true, or that look found items and the
	 * stopper starts a thread for them (percpuref_deferred_stop()),
	 * whose look at the stack follows our load; where none can start,
	 * our item waits for the next try, as a wake-up owed would. */
	if (!__atomic_load_n(&thread.running, __ATOMIC_RELAXED) ||
	    __atomic_load_n(&thread_sleeping, __ATOMIC_SEQ_CST))
		wake_owed = true;
	return queued;
}

void percpuref_call_after_grace_period(struct percpuref_deferred *d, percpuref_deferred_fn fn)
{
	struct poller *p = my_poller;

	d->fn = fn;
	d->polled_by = p;
	percpuref_note_work();
	if (!p) {
		unsigned long queued = push_pending(d);

		if (percpuref_backlog_over(&backlog, queued)) {
			backlog_owed = true;
			backlog_owed_queued = queued;
		}
		return;
	}
	d->next = NULL;
	/* After the caller's mode flags: the fence that covers it. */
	d->stamp = percpuref_fence_stamp();
	pthread_mutex_lock(&p->lock);
	*p->tail = d;
	p->tail = &d->next;
	pthread_mutex_unlock(&p->lock);
}

/* Every queued item of @p, oldest first, off its queue.  Its lock held. */
static struct percpuref_deferred *poller_take_all(struct poller *p)
{
	struct percpuref_deferred *list = p->head;

	p->head = NULL;
	p->tail = &p->head;
	return list;
}

/* @list (a polling thread's, oldest first) onto the callback thread's queue. */
static void push_pending_list(struct percpuref_deferred *list)
{
	struct percpuref_deferred *d;

	while ((d = list)) {
		list = d->next;
		push_pending(d);
	}
}

/* @p's queue onto the callback thread's. */
static void poller_hand_over(struct poller *p)
{
	/* Pushed under the lock: a fork (which takes it) finds the items on
	 * one queue or the other, never in our hands; and a barrier beside
	 * us that finds the queue empty finds them counted in nr_queued
	 * (review 158: pushed after the unlock, it read its target without
	 * them and returned before they ran). */
	pthread_mutex_lock(&p->lock);
	push_pending_list(poller_take_all(p));
	pthread_mutex_unlock(&p->lock);
}

/* Every polling thread's queue onto the callback thread's: barrier, exit. */
static void take_all_polled(void)
{
	struct poller *p;

	/* Acquire: pairs with the registration's release; next never changes. */
	for (p = __atomic_load_n(&pollers, __ATOMIC_ACQUIRE); p; p = p->next)
		poller_hand_over(p);
}

void percpuref_deferred_take_polled_item(struct percpuref_deferred *d)
{
	/* Written when it was queued, under the caller's lock. */
	struct poller *p = d->polled_by;
	struct percpuref_deferred **link;

	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	for (link = &p->head; *link && *link != d; link = &(*link)->next)
		;
	/* Gone: taken by its poll, which runs it, or handed over. */
	if (*link) {
		*link = d->next;
		if (p->tail == &d->next)
			p->tail = link;
		/* Under the lock, as every hand-over: a fork finds the item
		 * on one queue or the other, and a barrier that finds it gone
		 * finds it counted (tests/model/deferred.pml,
		 * MUTANT_MOVE_UNLOCKED). */
		push_pending(d);
	}
	pthread_mutex_unlock(&p->lock);
}

/* Waits until every polling thread but ours finished the items its poll
 * had taken when we looked (those queued are taken over, so barrier and
 * exit wait for them on the callback thread's count). */
static void wait_polled_batches(void)
{
	struct poller *p;

	/* Acquire: pairs with poller_claim()'s release, as in
	 * take_all_polled(); next never changes. */
	for (p = __atomic_load_n(&pollers, __ATOMIC_ACQUIRE); p; p = p->next) {
		unsigned long target;

		if (p == my_poller)
			continue;
		pthread_mutex_lock(&p->lock);
		target = p->nr_taken;
		while ((long)(p->nr_done - target) < 0)
			pthread_cond_wait(&p->ran, &p->lock);
		pthread_mutex_unlock(&p->lock);
	}
}

/*
 * The covered prefix of @p's queue into p->rest, counted taken; its lock
 * held.  Stamps rise along the queue (one thread stamps them in order).
 * Returns whether items remain queued.
 */
static bool poller_take_covered(struct poller *p)
{
	struct percpuref_deferred **end = &p->rest, *d;
	unsigned long n = 0;

	while ((d = p->head) && percpuref_fence_covers(d->stamp)) {
		p->head = d->next;
		*end = d;
		end = &d->next;
		n++;
	}
	*end = NULL;
	if (!p->head)
		p->tail = &p->head;
	p->nr_taken += n;
	return p->head != NULL;
}


PERCPUREF_API int percpu_ref_poll(unsigned int flags)
{
	struct poller *p = my_poller;
	unsigned long ran = 0, n, oldest_stamp, spins = 0;
	bool queued;
	int cancel;

	if (flags & ~PERCPU_REF_POLL_WAIT)
		return -EINVAL;
	if (!p)
		return -EPERM;
	/* Inside a callback: a @release this very poll runs, or a confirm
	 * (one run at once on a user's thread too: pinned, so a @release
	 * our poll ran there would hold our batch lock, and a fork waiting
	 * for it would wait for whatever that @release waits for). */
	if (percpuref_holds_batch_lock() || percpuref_in_confirm())
		return -EDEADLK;
	cancel = percpuref_cancel_disable();
	percpuref_batch_begin(&p->batch);
	for (;;) {
		pthread_mutex_lock(&p->lock);
		queued = poller_take_covered(p);
		oldest_stamp = queued ? p->head->stamp : 0;
		pthread_mutex_unlock(&p->lock);
		if (!p->rest) {
			if (!queued)
				break;
			/* A plain poll, or a waiting one that finished some:
			 * a fence only if one is due. */
			if (!(flags & PERCPU_REF_POLL_WAIT) || ran) {
				if (!percpuref_fence_readers_paced(poll_interval_ns))
					break;
				continue;
			}
			/* Waiting, nothing finished: wait for a fence that
			 * started after the oldest item (another thread's: a
			 * membarrier ends within microseconds, the fallback
			 * fences may take milliseconds, a migration fence or
			 * a refused one's 10 ms sleep); if none did, start
			 * one (it covers every thread's older ones). */
			if (percpuref_fence_started_after(oldest_stamp))
				percpuref_yield_or_nap(++spins);
			else
				percpuref_fence_readers();
			continue;
		}
		n = percpuref_deferred_run(&p->rest, NULL);
		pthread_mutex_lock(&p->lock);
		p->nr_done += n;
		pthread_cond_broadcast(&p->ran);
		pthread_mutex_unlock(&p->lock);
		ran += n;
	}
	percpuref_batch_end(&p->batch);
	percpuref_cancel_restore(cancel);
	return ran > INT_MAX ? INT_MAX : (int)ran;
}

/* Hands @p's queue to the callback thread and frees it for another thread. */
static void poller_leave(struct poller *p)
{
	struct percpuref_deferred *list;

	pthread_mutex_lock(&registry_lock);
	pthread_mutex_lock(&p->lock);
	list = poller_take_all(p);
	/* Pushed under the lock, as every hand-over (poller_hand_over()). */
	push_pending_list(list);
	p->in_use = false;
	pthread_mutex_unlock(&p->lock);
	pthread_mutex_unlock(&registry_lock);
	my_poller = NULL;
	percpuref_deferred_wake_owed();
}

static void poller_thread_exit(void *unused)
{
	(void)unused;
	/* The hook ran and is gone: a registration from a later TLS or key
	 * destructor of this thread arms it again, or its queue would wait
	 * for a barrier.  thread_exit.c runs it in the next round of key
	 * destructors; one made in glibc's last round is never run, and that
	 * queue waits for a barrier or the process's exit, as every hook
	 * registered there is lost. */
	poller_exit_armed = false;
	if (my_poller)
		poller_leave(my_poller);
}

/* Registry lock held.  A free struct, else a new one, claimed. */
static struct poller *poller_claim(void)
{
	struct poller *p;

	for (p = pollers; p; p = p->next)
		if (!p->in_use)
			break;
	if (!p) {
		p = percpuref_zalloc(sizeof(*p));
		if (!p)
			return NULL;
		pthread_mutex_init(&p->batch.lock, NULL);
		pthread_cond_init(&p->batch.idle, NULL);
		p->batch.rank = PERCPUREF_RANK_POLL_BATCH;
		pthread_mutex_init(&p->lock, NULL);
		pthread_cond_init(&p->ran, NULL);
		p->tail = &p->head;
		p->next = pollers;
		/* Release: the fields above, for lock-free walkers. */
		__atomic_store_n(&pollers, p, __ATOMIC_RELEASE);
	}
	/* The lock: a barrier may be reading the counts. */
	pthread_mutex_lock(&p->lock);
	p->in_use = true;
	pthread_mutex_unlock(&p->lock);
	return p;
}

PERCPUREF_API int percpu_ref_poll_register(void)
{
	struct poller *p;
	int cancel;

	if (percpuref_on_library_thread())
		return -EPERM;
	if (my_poller)
		return -EALREADY;
	if (percpuref_holds_batch_lock())
		return -EDEADLK;
	percpuref_runtime_init();
	/* Before any poll reads it: every poller registered after this.  Its
	 * warning writes to stderr, a cancellation point. */
	cancel = percpuref_cancel_disable();
	pthread_once(&poll_interval_once, read_poll_interval);
	percpuref_cancel_restore(cancel);
	if (!poller_exit_armed) {
		if (!percpuref_at_thread_exit(poller_thread_exit, NULL))
			return -EAGAIN;
		poller_exit_armed = true;
	}
	pthread_mutex_lock(&registry_lock);
	p = poller_claim();
	pthread_mutex_unlock(&registry_lock);
	if (!p)
		return -ENOMEM;
	my_poller = p;
	return 0;
}

PERCPUREF_API void **__percpu_ref_poll_owner(void)
{
	return &poll_owner;
}

PERCPUREF_API int percpu_ref_poll_unregister(void)
{
	if (!my_poller)
		return -EPERM;
	if (percpuref_holds_batch_lock())
		return -EDEADLK;
	poller_leave(my_poller);
	return 0;
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

void percpuref_deferred_pace(void)
{
	if (!backlog_owed)
		return;
	backlog_owed = false;
	percpuref_backlog_wait(&backlog, backlog_owed_queued);
}

int percpuref_wait_deferred(void)
{
	unsigned long target;
	int cancel;

	/* Waiting for the thread while holding a batch lock (a callback) could
	 * wait for a fork waiting for us, or for ourselves. */
	if (percpuref_on_library_thread() || percpuref_holds_batch_lock())
		return -EDEADLK;
	/* Polling threads' queues too: one may never poll again. */
	take_all_polled();
	percpuref_deferred_wake_owed();
	/* Relaxed: every push we must wait for happened before this call
	 * (ours, or ordered before it by the caller), so coherence reads a
	 * count that includes it; one racing with us only waits longer. */
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
		percpuref_deferred_waiter_begin();
		pthread_cond_wait(&work_done, &deferred_lock);
		percpuref_deferred_waiter_end();
	}
	pthread_mutex_unlock(&deferred_lock);
	wait_polled_batches();
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
	/* A release the wait ran here (no thread could start) kills onto our
	 * own queue if we poll, which no shutdown round would look at again
	 * (its chain of kills stopped after the first release); what other
	 * polling threads queue meanwhile is theirs. */
	if (my_poller)
		poller_hand_over(my_poller);
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

/* Registration first, then every polling thread's batch lock, in order. */
static void poll_batch_fork_prepare(void)
{
	struct poller *p;

	pthread_mutex_lock(&registry_lock);
	for (p = pollers; p; p = p->next)
		pthread_mutex_lock(&p->batch.lock);
}

static void poll_batch_fork_parent(void)
{
	struct poller *p;

	for (p = pollers; p; p = p->next)
		pthread_mutex_unlock(&p->batch.lock);
	pthread_mutex_unlock(&registry_lock);
}

/* Their queues went to the callback thread (queue_fork_child()). */
static void poll_batch_fork_child(void)
{
	struct poller *p;

	for (p = pollers; p; p = p->next) {
		if (p != my_poller)
			p->batch.running = false;
		pthread_cond_init(&p->batch.idle, NULL);
		pthread_mutex_unlock(&p->batch.lock);
	}
	pthread_mutex_unlock(&registry_lock);
}

/* The pollers queue_fork_prepare() locked: a fork from a callback does not
 * hold registry_lock, and one registered since is not ours to unlock. */
static struct poller *fork_pollers;

static void queue_fork_prepare(void)
{
	struct poller *p;

	pthread_mutex_lock(&deferred_lock);
	percpuref_wait_thread_started(&thread);
	/* Acquire: pairs with poller_claim()'s release, so each poller's
	 * lock is initialised; a fork from a callback holds no
	 * registry_lock. */
	fork_pollers = __atomic_load_n(&pollers, __ATOMIC_ACQUIRE);
	for (p = fork_pollers; p; p = p->next)
		pthread_mutex_lock(&p->lock);
}

static void queue_fork_parent(void)
{
	struct poller *p;

	for (p = fork_pollers; p; p = p->next)
		pthread_mutex_unlock(&p->lock);
	pthread_mutex_unlock(&deferred_lock);
}

/*
 * Child, queue lock and every polling thread's held.  The polling threads
 * but ours do not exist here: what they had queued, and what a poll
 * paused in a @release had left to run (rest: the fork held its batch
 * lock, so it was paused or not in a poll), goes to the callback thread;
 * the @release in progress was the parent's thread's.  Ours keeps its own
 * (a fork from its own callback comes back to its poll).
 */
static void polled_fork_child(void)
{
	struct poller *p;

	for (p = fork_pollers; p; p = p->next) {
		pthread_cond_init(&p->ran, NULL);
		if (p != my_poller) {
			struct percpuref_deferred *list = poller_take_all(p);

			/* The older first, as they were queued. */
			push_pending_list(p->rest);
			p->rest = NULL;
			push_pending_list(list);
			p->in_use = false;
			p->nr_taken = p->nr_done = 0;
		}
		pthread_mutex_unlock(&p->lock);
	}
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
	percpuref_cond_init(&work_done);
	thread.running = false;
	thread_sleeping = false;
	thread.stopping = false;
	polled_fork_child();
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
	/* Paced callers compare queue positions with it (internal.h); the
	 * items of a batch cut in half that ran are no longer counted. */
	backlog.ran = nr_done;
	/* Counted by threads the child lacks: left as they were, the
	 * child's thread would never give way.  A fork from a signal
	 * handler (outside the contract but for one that interrupted a get
	 * or put: docs/percpu_ref.md, "fork()") may interrupt this thread's
	 * own wait, counted or about to be, which goes on in the child after
	 * the handler: its end finds 0 and leaves it (a count of the thread's
	 * own, kept beside, left the child at +1 for good where the fork fell
	 * between their updates), or takes one of a wait begun meanwhile,
	 * which then counts no more: a hint, one yield at worst.  Relaxed:
	 * only this thread runs. */
	__atomic_store_n(&waiters, 0, __ATOMIC_RELAXED);
	backlog.waiting = 0;
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

static const struct percpuref_fork_hooks poll_batch_hooks = {
	.rank = PERCPUREF_RANK_POLL_BATCH,
	.prepare = poll_batch_fork_prepare,
	.parent = poll_batch_fork_parent,
	.child = poll_batch_fork_child,
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
	percpuref_register_fork_hooks(&poll_batch_hooks);
	percpuref_register_fork_hooks(&queue_hooks);
	percpuref_register_exit_hook(PERCPUREF_RANK_DEFERRED_BATCH, deferred_exit_hook);
}

/* A count kept under deferred_lock, read there. */
static unsigned long read_counted(const unsigned long *count)
{
	unsigned long n;

	pthread_mutex_lock(&deferred_lock);
	n = *count;
	pthread_mutex_unlock(&deferred_lock);
	return n;
}

PERCPUREF_API unsigned long percpuref_deferred_stalls(void)
{
	return percpuref_backlog_stalls(&backlog);
}

/*
 * Relaxed both: the count only tells the thread not to give way.  A
 * barrier counts itself under deferred_lock, under which the thread looks,
 * so the thread sees it exactly.  A wait for a switch counts itself with
 * no lock: counted just after the thread looked, it costs that waiter one
 * yield, as before there was a count; gone just before, it keeps the
 * thread from one yield.  Neither orders anything a wait depends on (a
 * barrier's end is told under the lock, a switch's by its stripe's word
 * and futex).
 */
void percpuref_deferred_waiter_begin(void)
{
	__atomic_fetch_add(&waiters, 1, __ATOMIC_RELAXED);
}

void percpuref_deferred_waiter_end(void)
{
	unsigned long n = __atomic_load_n(&waiters, __ATOMIC_RELAXED);

	/* Not below 0: in a fork child a wait that the fork interrupted
	 * ends on the 0 the child began with (queue_fork_child()). */
	while (n && !__atomic_compare_exchange_n(&waiters, &n, n - 1, false, __ATOMIC_RELAXED,
						 __ATOMIC_RELAXED))
		;
}

PERCPUREF_API unsigned long percpuref_test_deferred_waiters(void)
{
	/* Relaxed: a test's look at a hint; nothing is read through it. */
	return __atomic_load_n(&waiters, __ATOMIC_RELAXED);
}

PERCPUREF_API unsigned int percpuref_test_deferred_paced(void)
{
	unsigned int n;

	pthread_mutex_lock(&deferred_lock);
	n = backlog.waiting;
	pthread_mutex_unlock(&deferred_lock);
	return n;
}

PERCPUREF_API unsigned long percpuref_test_deferred_rearm_left(void)
{
	return percpuref_backlog_rearm_left(&backlog);
}

PERCPUREF_API unsigned long percpuref_test_deferred_gave_way(void)
{
	return read_counted(&gave_way);
}

unsigned long percpuref_deferred_fences(void)
{
	return read_counted(&batch_fences);
}
