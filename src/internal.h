/* SPDX-License-Identifier: MIT */
/*
 * internal.h - what the library's source files share and the public headers
 * do not show: the reader fence, rseq areas, the per-CPU
 * allocator, warnings and the fault-injection hook the tests use.
 */
#ifndef PERCPUREF_INTERNAL_H
#define PERCPUREF_INTERNAL_H

#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <percpuref/compiler.h>
#include <percpuref/percpu_ref.h>
#include <percpuref/this_cpu.h>

#include <urcu/urcu-bp.h>

/*
 * Lock order of the whole library, outermost first: the one place it is
 * written down.  A thread holding a lock of one rank takes only locks of
 * higher ranks.  fork() takes every lock in this order (prepare hooks,
 * ascending) and releases them in reverse (parent and child hooks,
 * descending), so the child inherits none held by a thread it lacks.
 *
 * The batch locks come first: a library thread, or a polling thread in
 * percpu_ref_poll(), holds one for a whole unit of work (fence, callbacks, and
 * the user's confirm callbacks they call; around a user's @release it lets go,
 * its state where a fork child finds it: percpuref_batch_pause()), so a fork
 * never cuts one in half.  Fork takes every polling thread's (rank POLL_BATCH,
 * after the registry of polling threads, in its order); a polling thread takes
 * its own only.  The sync-switch lock next: every switch_to_atomic_sync()
 * read-holds it over its fence, so a fork never cuts one in half either; it is
 * only tried under a switch lock (a fork waiting for it makes the switch step
 * back).  liburcu-bp's locks (its grace-period and registry mutexes,
 * urcu_bp_before_fork()) come next, before every lock a reader may take inside
 * a read-side section: a grace period holds liburcu's lock while it waits for
 * such a reader, so a fork holding the reader's lock while it waits for
 * liburcu's would deadlock (test_hardening.c, finding 5).  Consequences for
 * callers: inside a read-side section no call that takes a batch lock or waits
 * for a library thread (barrier, flush, shutdown, exit(); a fork there leaves
 * the scan batch and liburcu alone); from a callback run on a library thread no
 * wait for either library thread (barrier, flush: refused with -EDEADLK).
 */
enum percpuref_lock_rank {
	PERCPUREF_RANK_DEFERRED_BATCH,	/* deferred.c: a batch in flight */
	PERCPUREF_RANK_POLL_BATCH,	/* deferred.c: polling threads' batches */
	PERCPUREF_RANK_SCAN,		/* managed.c: a scan or RCU batch */
	PERCPUREF_RANK_SYNC_SWITCH,	/* percpu_ref.c: sync switches */
	PERCPUREF_RANK_URCU,		/* liburcu-bp (runtime.c) */
	PERCPUREF_RANK_SWITCH,		/* percpu_ref.c: mode switches */
	PERCPUREF_RANK_ALLOC,		/* percpu_alloc.c: chunks, slots, spares */
	PERCPUREF_RANK_DEFERRED,	/* deferred.c: the queue */
	PERCPUREF_RANK_MANAGED,		/* managed.c: thread, config, stats */
	PERCPUREF_RANK_READERS,		/* fallback.c: the fallback readers */
	PERCPUREF_RANK_MIGRATION,	/* runtime.c: the migration fence */
	PERCPUREF_RANK_LIBRARY_THREADS,	/* runtime.c: the library's threads' CPUs */
	PERCPUREF_NR_RANKS
};

/*
 * Fork and exit hooks: runtime.c is the lowest layer; each module above
 * registers its own (from a constructor, before any thread of ours runs).
 * @prepare takes the module's lock of @rank; @parent releases it; @child
 * resets what the parent's threads left (they do not exist in the child),
 * may restart the module's thread, and releases the lock.  NULL: nothing.
 */
struct percpuref_fork_hooks {
	enum percpuref_lock_rank rank;
	void (*prepare)(void);
	void (*parent)(void);
	void (*child)(void);
};
void percpuref_register_fork_hooks(const struct percpuref_fork_hooks *hooks);
/*
 * @fn runs at process exit (highest @rank first, so the reclaimer stops
 * before the callback thread it feeds), unless exit() was called where
 * waiting for the library's threads would hang: on one of them, or inside
 * a liburcu-bp read-side section (test_hardening.c, finding 7).
 */
void percpuref_register_exit_hook(enum percpuref_lock_rank rank, void (*fn)(void));

/*
 * A batch (ranks DEFERRED_BATCH, POLL_BATCH and SCAN): deferred.c's
 * callback batches and polling threads' polls, managed.c's scans and RCU
 * batches.  Its lock is taken through these so
 * the thread knows it holds one: a debug build asserts the rank order, a
 * fork from a callback leaves every batch lock alone, and a callback run
 * under one is refused the calls that would wait for a library thread
 * (percpuref_holds_batch_lock()).  One runner at a time: begin() waits
 * for the role (@running, under @lock), which the runner keeps while it
 * pauses in a @release with @lock released (percpuref_batch_pause()); a
 * second batch meanwhile could be counted done before the first, and a
 * waiter return early.  Fork takes @lock only (fork_prepare()), so it
 * waits for no @release; its child gives the role up (fork_child()).
 */
struct percpuref_batch {
	pthread_mutex_t lock;
	pthread_cond_t idle;	/* signalled when @running goes false */
	bool running;
	enum percpuref_lock_rank rank;
};
#define PERCPUREF_BATCH_INIT(r)                                                    \
	{ PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, (r) }
void percpuref_batch_begin(struct percpuref_batch *b);
/* begin() unless another runner has the role (running, or paused in a
 * @release): false then, nothing held. */
bool percpuref_batch_try_begin(struct percpuref_batch *b);
void percpuref_batch_end(struct percpuref_batch *b);
void percpuref_batch_fork_prepare(struct percpuref_batch *b);
void percpuref_batch_fork_parent(struct percpuref_batch *b);
void percpuref_batch_fork_child(struct percpuref_batch *b);
/* In a child hook: whether this thread's fork took @b's lock, so that a
 * runner paused in a @release at the fork was another thread (one that
 * forks from its own callback leaves the lock alone). */
bool percpuref_batch_fork_took(const struct percpuref_batch *b);
bool percpuref_holds_batch_lock(void);
/*
 * Around a user's @release run under a batch lock: the batch mutexes the
 * thread holds are released meanwhile, so a fork need not wait for the
 * callback (a @release that waits for a lock the forking thread holds
 * deadlocked both: a Rust Drop and std's Command).  The thread
 * still counts as holding them (percpuref_holds_batch_lock()), and the
 * batch's owner keeps the runner role (deferred.c's batch_running,
 * managed.c's scan_running), so no other batch starts meanwhile.  What
 * the batch has left to do must be where a fork child finds it (not on
 * the runner's stack) whenever it pauses.  Nests; no-ops on a thread
 * that holds no batch lock.
 */
void percpuref_batch_pause(void);
void percpuref_batch_resume(void);
/*
 * Around a confirm callback: a switch is half done on the thread's stack
 * (its item off the queue, its mark still set), so a @release nested in
 * the callback (a put of another ref's last reference) pauses nothing: a
 * fork child would inherit the switch half done, and its exit of that ref
 * waited for ever.  Strictly nested within pauses.
 */
void percpuref_batch_pin(void);
void percpuref_batch_unpin(void);
/* Inside a confirm callback (pinned): a poll there would run a @release
 * that cannot pause its batch lock. */
bool percpuref_in_confirm(void);
/* For a batch begun inside a confirm, which guards no batch lock of its
 * own (managed.c's exit loop): the pins set aside, so that the batch
 * pauses around its @releases, then given back. */
unsigned int percpuref_batch_pins_take(void);
void percpuref_batch_pins_restore(unsigned int pins);

/* True on a thread started by percpuref_start_thread(). */
extern __thread bool percpuref_library_thread __attribute__((tls_model("initial-exec")));

static inline bool percpuref_on_library_thread(void)
{
	return percpuref_library_thread;
}

/*
 * Cancellation.  No library function acts on a cancellation request, and
 * the callbacks the library runs run with cancellation disabled: a thread
 * cancelled at a condition wait, a join, a write to stderr or inside a
 * callback would die holding a library lock, or with its operation half
 * done (a kill's put never made).  A caller's thread has it disabled
 * around each such wait, fence, warning and callback (a pair costs ~10 ns),
 * and acts on a pending request at its next cancellation point after the
 * call returns.  Library threads keep it disabled, so they skip the disable
 * (the callback thread runs a callback twice per kill); the restore is
 * never skipped, as a callback may have enabled it, and the state it found
 * must be back for the next callback, or the caller.
 */
static inline int percpuref_cancel_disable(void)
{
	int old = PTHREAD_CANCEL_DISABLE;

	if (!percpuref_library_thread)
		pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
	return old;
}

static inline void percpuref_cancel_restore(int old)
{
	pthread_setcancelstate(old, NULL);
}

/*
 * percpuref_synchronize_rcu - a liburcu-bp grace period that survives
 * membarrier being refused after start-up (liburcu-bp itself would abort):
 * see runtime.c.  Not inside a read-side section.
 */
void percpuref_synchronize_rcu(void);

/* Whether this thread is inside a liburcu-bp read-side section; unlike
 * urcu_bp_read_ongoing(), registers nothing (runtime.c). */
bool percpuref_rcu_read_ongoing(void);

/*
 * percpuref_exit_began - whether exit() has run the library's exit handler
 * (runtime.c), which it does before the destructors of the static objects
 * built before the library's first use: the managed passes from then on
 * leave no held ref managed.  percpuref_exiting_thread - whether the
 * calling thread is the one that ran it, and may wait (no batch held, no
 * RCU read-side section): its kills and percpu_rcuref releases finish on
 * it, those of the static destructors and of the atexit() handlers
 * registered before that use (docs/percpu_ref.md, "At process exit").
 */
bool percpuref_exit_began(void);
bool percpuref_exiting_thread(void);
/* Whether this thread's exit holds the reclaimer's role to run percpu_rcuref
 * @releases itself (managed.c, percpuref_run_after_rcu_here()), which
 * percpuref_exiting_thread() accepts in place of no batch lock. */
extern __thread bool percpuref_exit_rcu_role __attribute__((tls_model("initial-exec")));

/* Runtime set-up: rseq/membarrier detection, CPU count, fork handlers.
 * Idempotent and thread-safe; every slow path that may be first calls it. */
void percpuref_runtime_init(void);
/* Whether the library's fork handlers are registered, trying again if
 * pthread_atfork() refused them (warned); no ref is made without them. */
bool percpuref_fork_handlers_registered(void);

/* Number of per-CPU units: every CPU id the kernel may report is below it. */
unsigned int percpuref_nr_units(void);
/* Number of possible CPUs: every CPU id the kernel may report is below it
 * too (the units are twice as many for the fallback readers). */
unsigned int percpuref_nr_cpus(void);

/*
 * percpuref_fence_readers - wait until no per-CPU update that read a mode
 * word before this call can still commit.  The caller has already stored the
 * new mode flags.  rseq readers: membarrier(..._RSEQ) aborts every
 * uncommitted sequence.  Fallback readers (fallback.c): a grace period,
 * taken only once some thread registered as one.  Sleeps.
 */
void percpuref_fence_readers(void);
/*
 * Fence tickets (runtime.c): percpuref_fence_stamp(), called after the new
 * mode flags are stored with a seq_cst exchange, names the fences started
 * so far;
 * percpuref_fence_covers(stamp) is true once a fence that started after it
 * has ended (and the caller then sees what that fence made visible), and
 * percpuref_fence_started_after(stamp) once such a fence has started.
 * percpuref_fence_readers_paced() runs a fence unless one started in the
 * last @interval_ns (any caller's): true if it ran one.
 * percpuref_fence_started_within() says whether one did.
 */
unsigned long percpuref_fence_stamp(void);
bool percpuref_fence_covers(unsigned long stamp);
bool percpuref_fence_started_after(unsigned long stamp);
bool percpuref_fence_readers_paced(uint64_t interval_ns);
bool percpuref_fence_started_within(uint64_t interval_ns);
uint64_t percpuref_monotonic_ns(void);
/*
 * Every condition variable of the library that a timed wait uses runs on
 * CLOCK_MONOTONIC: a step of the wall clock (an NTP step, a date set by
 * hand) neither stretches a wait nor ends it at once.  percpuref_cond_init()
 * sets it once, before anything can wait on the variable (a pthread_once at
 * the process's first init, or before a library thread's first start), and
 * again in a fork child; never in a constructor, which in a program linked
 * with the static library may run after the program's own constructors used
 * the library.  percpuref_deadline() is now plus @ms on that clock, for
 * pthread_cond_timedwait().
 */
void percpuref_cond_init(pthread_cond_t *cond);
void percpuref_deadline(struct timespec *deadline, unsigned long ms);
/*
 * A futex of this process: sleeps while *@word is @expected, until a wake
 * or @until (percpuref_deadline()'s clock and form) if not NULL; returns
 * at once if the word differs, and on a signal (callers re-check).
 */
void percpuref_futex_wait(uint32_t *word, uint32_t expected, const struct timespec *until);
void percpuref_futex_wake_one(uint32_t *word);
void percpuref_futex_wake_all(uint32_t *word);
/*
 * The fence of a membarrier refused after start-up (runtime.c): warns once,
 * then runs the calling thread on every CPU in turn, a full barrier on each
 * that also aborts the rseq sections there; where that is refused too,
 * disables the rseq fast path and waits for sections in flight.
 */
void percpuref_fence_without_membarrier(int err);
/*
 * A fence that could not stop every add in flight: the wait above after
 * both were refused, or a signal handler's fence that skipped the section
 * it interrupted (fallback.c).  Such an add may land after a fold, on a
 * copy the fold zeroed, and stay there: from then on an allocation zeroes
 * every copy of its slot again, and a switch back to per-CPU mode too (as
 * up to 0.4.10), so that it stays on its own ref and never reaches the
 * slot's next owner.  Relaxed: the flag is set before the fence returns,
 * so before the fold, the free and the next allocation of any slot whose
 * fence it was (coherence).
 */
void percpuref_note_unfenced_adds(void);
PERCPUREF_API bool percpuref_unfenced_adds_possible(void);

/*
 * rseq areas (rseq_register.c).  percpuref_rseq_choose(): the offset of the
 * rseq area the fast path can use, glibc's or the library's own (then
 * registered for the calling thread), or 0; once, at set-up.
 * percpuref_rseq_own_area_offset(): where the own area lies from every
 * thread pointer, registered or not.
 * percpuref_rseq_abandon() undoes an own registration the process will not
 * use.  percpuref_rseq_register_self(): registers the calling thread's own
 * area if the process uses own areas and this thread never had one; true
 * when it is registered now.  percpuref_rseq_own(): own areas in use.
 */
ptrdiff_t percpuref_rseq_choose(void);
ptrdiff_t percpuref_rseq_own_area_offset(void);
void percpuref_rseq_abandon(void);
bool percpuref_rseq_register_self(void);
bool percpuref_rseq_own(void);
/*
 * percpuref_at_thread_exit - call @fn(@arg) when the calling thread exits
 * (return, pthread_exit, cancellation), before its TLS goes; thread_exit.c.
 * At most four per thread (one per module).  False when it cannot be arranged.
 */
bool percpuref_at_thread_exit(void (*fn)(void *), void *arg);
/*
 * An owner mark: what a thread holds for as long as it owns something on
 * the heap that its exit hook gives back (a fallback unit, a counters
 * cache), so that another thread can tell when the owner exited without
 * that hook running (thread_exit.c).  Callers serialise the calls on one
 * mark with a lock of their own, except owner_mark_give_back().
 */
#if defined(__GLIBC__) && !defined(PERCPUREF_TSAN)
#define PERCPUREF_ROBUST_MARKS 1
#else
#define PERCPUREF_ROBUST_MARKS 0
#endif
struct percpuref_owner_mark {
#if PERCPUREF_ROBUST_MARKS
	pthread_mutex_t held;
#else
	bool held;			/* a flag only: thread_exit.c */
#endif
};
/* Unowned.  Also in a fork child, over a mark a parent's thread held. */
void percpuref_owner_mark_init(struct percpuref_owner_mark *mark);
/* This thread owns it now; false if another thread does. */
bool percpuref_owner_mark_take(struct percpuref_owner_mark *mark);
/* By its owner: unowned again. */
void percpuref_owner_mark_give_back(struct percpuref_owner_mark *mark);
/*
 * True if its owner exited holding it (then it is unowned again, and the
 * owner's writes are visible to the caller); false while the owner lives,
 * and always where the kernel keeps no robust-futex list (qemu-user),
 * outside glibc and under ThreadSanitizer.
 */
bool percpuref_owner_mark_orphaned(struct percpuref_owner_mark *mark);
/* Fork child: only the forking thread's registration survives. */
void percpuref_rseq_after_fork_child(void);
/* For tests (exported like the fault-injection hook below): threads with
 * an own rseq area registered now, and registered fallback readers. */
PERCPUREF_API unsigned int percpuref_rseq_own_threads(void);
PERCPUREF_API unsigned int percpuref_readers_registered(void);

/*
 * Deferred work (deferred.c): @fn(@d) runs on the library's callback thread
 * after a reader fence that started after this call, or, called on a
 * polling thread (percpu_ref_poll_register()), in one of its
 * percpu_ref_poll() calls after such a fence.  The item must stay valid
 * until @fn runs; @fn may free it.
 */
struct percpuref_deferred;
typedef void (*percpuref_deferred_fn)(struct percpuref_deferred *);
struct percpuref_deferred {
	struct percpuref_deferred *next;
	percpuref_deferred_fn fn;
	/* Set by percpuref_call_after_grace_period() (not by managed.c's
	 * RCU queue): percpuref_fence_stamp() when queued on a polling
	 * thread, and that thread's queue (NULL: the callback thread's). */
	unsigned long stamp;
	void *polled_by;
};
void percpuref_call_after_grace_period(struct percpuref_deferred *d, percpuref_deferred_fn fn);
/* Runs the items of the list *@rest in order, taking each off before it
 * runs (each @fn may free its item, or pause its batch: *@rest is then what
 * a fork child must run again); returns how many ran, counting each in
 * @counted's ran as it returns (@counted may be NULL).  The batches of both
 * queues, this one and the reclaimer's RCU queue (managed.c), end with it. */
struct percpuref_backlog;
unsigned long percpuref_deferred_run(struct percpuref_deferred **rest,
				     struct percpuref_backlog *counted);
/* After dropping the locks held around percpuref_call_after_grace_period():
 * start or wake the thread if that call found it asleep (or not running). */
void percpuref_deferred_wake_owed(void);
/* As a kill or an asynchronous switch returns, holding no library lock:
 * wait for the thread to work off a backlog that this thread's push passed
 * the limit of (deferred.c, "Backlog"; not on a library thread, in a
 * callback or in a read-side section). */
void percpuref_deferred_pace(void);
/* Moves @d onto the callback thread's queue if a polling thread's queue
 * still holds it (a wake-up owed: pay it with
 * percpuref_deferred_wake_owed()): for a caller about to wait for it, a
 * switch in flight, holding the lock the item's function takes, so that
 * the item stays queued or taken meanwhile.  Any lock up to rank SWITCH. */
void percpuref_deferred_take_polled_item(struct percpuref_deferred *d);
/* Starts the thread if it is not running (a start refused earlier left
 * queued items to the next try); false if it still cannot start.  Takes
 * the queue's lock (rank DEFERRED: a switch lock may be held). */
bool percpuref_deferred_start(void);
/* Wait for every item queued before this call, running the batches on the
 * calling thread while no thread can start: 0, or -EDEADLK when called on a
 * library thread or under a batch lock (a callback). */
int percpuref_wait_deferred(void);
/* Shutdown: waits for every item queued before the call, then stops the
 * thread and, if items were queued meanwhile, starts a new one for them
 * (threads start on demand), or runs them on the caller's thread if none
 * can start.  True when a thread runs on return or items ran here. */
bool percpuref_deferred_stop(void);
/* Fences the callback thread waited for (one per batch). */
unsigned long percpuref_deferred_fences(void);
/* Around a wait for the callback thread (a barrier's, or one for an
 * asynchronous switch to end: percpu_ref.c): it does not give way
 * meanwhile (deferred.c, "Giving way").  Any lock or none. */
void percpuref_deferred_waiter_begin(void);
void percpuref_deferred_waiter_end(void);
/* Batches before which the callback thread gave way, and the callers of
 * percpuref_wait_deferred() and of a switch's end waiting now (tests). */
PERCPUREF_API unsigned long percpuref_test_deferred_gave_way(void);
PERCPUREF_API unsigned long percpuref_test_deferred_waiters(void);
/* Callers in a paced wait for the callback thread now (tests; takes its
 * lock). */
PERCPUREF_API unsigned int percpuref_test_deferred_paced(void);
/* Items the callback thread still runs before a kill over the backlog's
 * limit waits again, after a stall (tests). */
PERCPUREF_API unsigned long percpuref_test_deferred_rearm_left(void);
/* Paced waits that found the callback thread stalled (tests). */
PERCPUREF_API unsigned long percpuref_deferred_stalls(void);

/*
 * The switch stripe of the ref at @ref (percpu_ref.c: one of
 * PERCPUREF_SWITCH_STRIPES locks, a cache line each).  Fibonacci hashing
 * of the address: neighbouring refs spread.  Here so that
 * tests/stress/stress_stripe_mates.c finds refs that share one.  2^14 of
 * them since 0.4.14 (256 before), 1 MiB of which a process touches the
 * pages its refs hash to: a fork no longer takes them but reads their lock
 * words, so their number costs it a read of 64 bytes each.  A build may
 * set other bits (-DPERCPUREF_SWITCH_STRIPE_BITS=16) to measure what
 * threads sharing stripes cost (docs/lent-16core.md).
 */
#ifndef PERCPUREF_SWITCH_STRIPE_BITS
#define PERCPUREF_SWITCH_STRIPE_BITS 14
#endif
_Static_assert(PERCPUREF_SWITCH_STRIPE_BITS >= 1 && PERCPUREF_SWITCH_STRIPE_BITS <= 20,
	       "PERCPUREF_SWITCH_STRIPE_BITS: 1 to 20");
#define PERCPUREF_SWITCH_STRIPES (1u << PERCPUREF_SWITCH_STRIPE_BITS)
static inline unsigned int percpuref_switch_stripe_index(const void *ref)
{
	uint64_t h = (uint64_t)(uintptr_t)ref * UINT64_C(0x9E3779B97F4A7C15);

	return (unsigned int)(h >> (64 - PERCPUREF_SWITCH_STRIPE_BITS));
}

/*
 * The per-CPU allocator's measurement options (percpu_alloc.c), here so
 * that the tests check the build's values.  A build may space the slots
 * further apart (-DPERCPUREF_COUNTER_STRIDE=64, bytes, a power of two) to
 * measure what threads whose counters share a cache line of a unit cost
 * (docs/lent-16core.md): each slot then fills a line of its own, 64 bytes
 * a CPU instead of 8.  Or another magazine size
 * (-DPERCPUREF_MAGAZINE_SLOTS=128), or another number of full magazines a
 * thread keeps in its own depot besides its pair
 * (-DPERCPUREF_THREAD_DEPOT_MAGAZINES=1), to measure what trading
 * magazines costs: a thread holds up to (2 + that number) magazines of
 * free slots, 512 by default.  scripts/test.sh runs the layout's and the
 * allocator's tests with them (and the stripe bits above) set otherwise.
 */
#ifndef PERCPUREF_COUNTER_STRIDE
#define PERCPUREF_COUNTER_STRIDE 8
#endif
_Static_assert(PERCPUREF_COUNTER_STRIDE >= sizeof(unsigned long) &&
		       (PERCPUREF_COUNTER_STRIDE & (PERCPUREF_COUNTER_STRIDE - 1)) == 0 &&
		       PERCPUREF_COUNTER_STRIDE <= 4096,
	       "PERCPUREF_COUNTER_STRIDE: a power of two, 8 to 4096");
#ifndef PERCPUREF_MAGAZINE_SLOTS
#define PERCPUREF_MAGAZINE_SLOTS 32
#endif
_Static_assert(PERCPUREF_MAGAZINE_SLOTS >= 1 && PERCPUREF_MAGAZINE_SLOTS <= 4096,
	       "PERCPUREF_MAGAZINE_SLOTS: 1 to 4096");
#ifndef PERCPUREF_THREAD_DEPOT_MAGAZINES
#define PERCPUREF_THREAD_DEPOT_MAGAZINES 14
#endif
_Static_assert(PERCPUREF_THREAD_DEPOT_MAGAZINES >= 1 && PERCPUREF_THREAD_DEPOT_MAGAZINES <= 256,
	       "PERCPUREF_THREAD_DEPOT_MAGAZINES: 1 to 256");

/*
 * Per-CPU allocator (percpu_alloc.c).  A free slot's copies are zero on
 * every unit but CPU 0's, which holds its free link: an allocation zeroes
 * that one, and whoever frees a slot leaves the others zero (a fold clears
 * them: percpuref_counter_take_sum(); an exit of a per-CPU ref:
 * percpuref_counter_clear()).  So a counter comes zeroed.
 */
uintptr_t percpuref_counter_alloc(void);	/* CPU 0's address, or 0: ENOMEM */
void percpuref_counter_free(uintptr_t cpu0);
static inline unsigned long *percpuref_counter_on(uintptr_t cpu0, unsigned int cpu)
{
	return (unsigned long *)(cpu0 + (uintptr_t)cpu * PERCPUREF_UNIT_STRIDE);
}
/* percpuref_get_counter_stats(): public, in <percpuref/percpu_ref.h>. */
/*
 * Spare objects (percpu_alloc.c, "Spares"): the memory of the refs'
 * bookkeeping (struct percpu_ref_impl) that the reclaimer or an exit let
 * go of, kept for the next init on an application thread instead of a
 * free().  A chain is up to PERCPUREF_SPARE_CHAIN objects linked through
 * their first word, NULL-terminated; give() keeps it (the depot's entries
 * are full chains but the top one, which a short chain fills up first),
 * and frees what a full depot (PERCPUREF_SPARE_DEPOT_CHAINS chains of
 * PERCPUREF_SPARE_CHAIN) has no room for; take() returns one object, its
 * contents undefined, or NULL (then malloc).
 */
#define PERCPUREF_SPARE_CHAIN 32
#define PERCPUREF_SPARE_DEPOT_CHAINS 128
/* A chain and its length: one being built, a depot's entry, a cache's. */
struct percpuref_spares {
	void *first;
	unsigned long n;
};
/* Gives @spares' chain (none if empty) and empties @spares. */
void percpuref_spares_give(struct percpuref_spares *spares);
void *percpuref_spare_take(void);
/* Keeps @obj (its first word free) as a spare of this thread's cache, or
 * frees it: no cache, or spares off. */
void percpuref_spare_keep(void *obj);
/*
 * No spares where a use after free must be caught: under AddressSanitizer,
 * and under valgrind (percpuref_under_valgrind(): its core is loaded),
 * what would be a spare is free()d, into the tool's quarantine.  A spare
 * is reused by the next init, often within microseconds: a stale access
 * to an exited ref would land on a live one, unreported, where a free()d
 * block stays poisoned for a long time.
 */
#if defined(__SANITIZE_ADDRESS__)
#define PERCPUREF_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PERCPUREF_ASAN 1
#endif
#endif
bool percpuref_under_valgrind(void);
static inline bool percpuref_spares_off(void)
{
#if defined(PERCPUREF_ASAN)
	return true;
#else
	return percpuref_under_valgrind();
#endif
}
/* Test hooks: the spare objects waiting in the depot (not in caches); and
 * freeing those and the calling thread's, so that its next init allocates
 * (a test of a refused allocation). */
PERCPUREF_API unsigned long percpuref_test_spares_waiting(void);
PERCPUREF_API void percpuref_test_spares_drop(void);
/* Test hook: a switch-off of the fast path (a fence that can neither call
 * membarrier nor move between CPUs) sleeps @us between publishing the
 * offset of 0 and stamping the end of its wait (runtime.c). */
PERCPUREF_API void percpuref_test_switch_off_stamp_delay(unsigned long us);
/* Test hook: the reclaimer's filter reads every ref in use (its collects
 * differ), as it does one got and put on another CPU throughout them. */
PERCPUREF_API void percpuref_test_filter_sees_use(bool on);
/* Called by the managed check between its read of a ref's count and its
 * compare-and-swap (percpuref_managed_finish(), switch lock held), where
 * a test makes puts land; NULL in programs.  Not exported: the tests link
 * the static library. */
extern void (*percpuref_test_finish_window)(struct percpu_ref *ref);
/* Test hook: every @every-th add to a ref's unit-less word (0: none)
 * yields its CPU between its read of the mode word and its
 * compare-and-swap, the window in which a switch may fold the word
 * (percpu_ref.c, unitless_add()): a preemption there, a whole fence
 * long, is what the word's FOLDED bit is for, and no stress run reached
 * one by chance. */
PERCPUREF_API void percpuref_test_unitless_yield(unsigned int every);

/* Sum of the per-CPU words of the counter at @cpu0.  Acquire loads: no
 * later read (the reclaimer filter's second collect) moves before them; the
 * writers' adds are ordered by a reader fence or by reading twice. */
static inline unsigned long percpuref_counter_sum(uintptr_t cpu0, unsigned int nr_units)
{
	unsigned long sum = 0;
	unsigned int cpu;

	for (cpu = 0; cpu < nr_units; cpu++)
		sum += __atomic_load_n(percpuref_counter_on(cpu0, cpu), __ATOMIC_ACQUIRE);
	return sum;
}

/*
 * The fold's sum: as percpuref_counter_sum(), each word that is not zero
 * zeroed once read.
 * Only after the reader fence of a switch to atomic, which no add can
 * follow, under the ref's switch lock: the words then stay zero while the
 * ref is atomic (a switch back to per-CPU mode finds them so, and a free
 * leaves them so), and a counter's copies are written by a fold, not by
 * both the fold and the next allocation: one pass over their lines a
 * life, not two (docs/percpu_ref.md, "One pass over the copies").  A word
 * that reads zero (a CPU the ref's users never ran on: most of them, where
 * a thread keeps to its CPU) is not written: storing its zero again
 * would dirty a line that must then be written back when evicted, or
 * fetched from this CPU's cache by the next CPU to touch it, where a clean
 * line costs neither and can stay shared (with sixteen units, a one-thread
 * kill-poll cycle went from 272-292 to 226-251 ns: docs/percpu_ref.md).
 * Relaxed stores: the next to read them is the same ref under the same
 * lock, whose switch back publishes them with the mode word's release, or
 * the slot's next owner, after the allocator's lock or on this thread.
 */
static inline unsigned long percpuref_counter_take_sum(uintptr_t cpu0, unsigned int nr_units)
{
	unsigned long sum = 0, *word;
	unsigned int cpu;

	for (cpu = 0; cpu < nr_units; cpu++) {
		unsigned long copy;

		word = percpuref_counter_on(cpu0, cpu);
		copy = __atomic_load_n(word, __ATOMIC_ACQUIRE);
		if (copy) {
			sum += copy;
			__atomic_store_n(word, 0, __ATOMIC_RELAXED);
		}
	}
	return sum;
}

/* Zeroes the counter's per-CPU words: before the free of one that was
 * per-CPU (an exit without a kill), or where a fence let an add through
 * (percpuref_note_unfenced_adds()).  The caller owns them: under the
 * ref's switch lock, or just allocated; the next owner reads them after
 * the allocator's lock or on this thread.  The fold's pass, its sum
 * dropped: a word that reads zero is not written (a late add that lands
 * after the read stays, as one after a store would). */
static inline void percpuref_counter_clear(uintptr_t cpu0, unsigned int nr_units)
{
	(void)percpuref_counter_take_sum(cpu0, nr_units);
}

/* The per-CPU net count a sum of monotonic words stands for (percpu_ref.h,
 * PERCPU_REF_PUT_DELTA): its low PERCPU_REF_NET_BITS bits, sign-extended
 * (gcc and clang shift a negative long right arithmetically). */
static inline unsigned long percpuref_counter_net(unsigned long sum)
{
	const unsigned int high = sizeof(sum) * CHAR_BIT - PERCPU_REF_NET_BITS;

	return (unsigned long)((long)(sum << high) >> high);
}

/* The most CPUs the library counts: the kernel's largest NR_CPUS. */
#define PERCPUREF_MAX_CPUS 8192u

/* A CPU set as large as the library's CPU cap (cpu_set_t holds 1024). */
struct percpuref_cpu_mask {
	unsigned long bits[PERCPUREF_MAX_CPUS / (8 * sizeof(unsigned long))];
};

/*
 * One of the library's threads (the reclaimer, the callback thread), each
 * field under its module's lock.  stopping: one caller is joining it.
 */
struct percpuref_thread {
	pthread_t id;
	bool running;
	bool stopping;
	bool starting;		/* started; its start-up not yet waited for */
	bool start_refused;	/* warned; not again until a start succeeds */
	void *(*fn)(void *);	/* what it runs; NULL: never started */
	const char *name;	/* its name, at most 15 chars */
	/* Started by a library thread: the CPUs that one started with,
	 * which it starts on (runtime.c, "Placement"). */
	bool start_cpus_given;
	struct percpuref_cpu_mask start_cpus;
	sem_t started;		/* posted once it runs library code */
};

/*
 * Starts @t, named @name (at most 15 chars), running @fn; false, after a
 * warning naming it (once until a start succeeds: every push and wait
 * tries again), when pthread_create() fails.  The module's lock, the
 * one its fork hooks take, held.  Does not wait for the thread's start-up:
 * the module's fork prepare hook does (percpuref_wait_thread_started()).
 */
bool percpuref_start_thread(struct percpuref_thread *t, void *(*fn)(void *), const char *name);

/*
 * The module's lock held: waits until the thread last started from @t runs
 * library code.  The module's fork prepare hook calls it, so that no fork
 * lands in a thread's start-up: gcc 12's ASan takes allocator locks there
 * that no fork hook takes, and a child that inherited one held hangs on
 * its first allocation of that size, as do the threads its hooks start
 * again.  A child's hooks start threads without waiting: its fork() itself
 * never hangs there.
 */
void percpuref_wait_thread_started(struct percpuref_thread *t);

/*
 * Called with @lock (the module's) held, returns with it released: asks @t
 * to stop (signals @wake, on which it sleeps) and waits for it to exit.
 * One caller joins it; a concurrent one (two shutdowns, or exit() during
 * one) waits on @exited until it is gone or a new one was started:
 * joining a thread twice is undefined.  The thread's module clears
 * running under @lock and broadcasts @exited when the thread ends.
 */
void percpuref_stop_thread(struct percpuref_thread *t, pthread_mutex_t *lock,
			   pthread_cond_t *wake, pthread_cond_t *exited);

/*
 * Bounding a shutdown (percpuref_shutdown()) while other threads keep using
 * the library: it drains until quiet, which such threads may never let it
 * be.  Every place that queues work for a library thread calls
 * percpuref_note_work(); a shutdown brackets itself with _begin() (which
 * returns a mark) and _end(), and stops draining once
 * percpuref_outside_work_since(mark) says a thread that is neither one of
 * ours nor in a shutdown queued work meanwhile.  Lock-free, any lock held.
 */
unsigned long percpuref_shutdown_begin(void);
bool percpuref_outside_work_since(unsigned long mark);
void percpuref_shutdown_end(void);
void percpuref_note_work(void);
/*
 * A ref comes back to life (reinit or resurrect), during a shutdown
 * perhaps.  Callbacks that revive one ref again and again (a @release
 * that reinits its ref and drops it again, each time) would keep a
 * shutdown going for ever, exit() with it: the revivals callbacks make
 * (on the library's threads or a shutdown's own) are counted per ref and
 * shutdown period, and the PERCPUREF_SHUTDOWN_REVIVALS_MAXth counts as
 * outside work, so the shutdown ends with that round and leaves what is
 * still queued to the threads.  Fewer, a ref reused a few times as its
 * release cascades, end nothing early.  @revivals: the ref's own (zero at
 * init), under its switch lock.
 */
#define PERCPUREF_SHUTDOWN_REVIVALS_MAX 64
struct percpuref_revivals {
	unsigned long epoch;	/* the shutdown period counted in */
	unsigned int count;
};
void percpuref_note_revival(struct percpuref_revivals *revivals);

/*
 * A queue that one of the library's threads works off, paced (deferred.c,
 * "Backlog"): a caller that leaves more than the limit queued and not run
 * waits, holding no library lock, until the items queued before its own
 * have run but half the limit.  @queued counts the items queued (written
 * under @lock or atomically), ran those run, counted by the runner as each
 * returns (relaxed: percpuref_deferred_run(); a fork child sets it to the
 * items it counts done), so the two compare as positions in the queue; on
 * a line of its own, which only the runner writes and only waits read
 * (read at every push, it would move between the CPUs once per kill);
 * @done, the items of finished batches (relaxed stores under @lock), is
 * what a push reads instead;
 * @progress is broadcast under @lock at each batch's end; @thread works it
 * off.  A wait that sees no item run for BACKLOG_STALL_MS (looking every
 * BACKLOG_LOOK_MS at least; a stall: a
 * callback waiting for a lock the caller holds) sets stalled_at to ran and
 * rearm_items to one, or doubles it at each stall that follows: nobody
 * waits again until rearm_items more have run; a wait that ends without a
 * stall sets it back to 0.  Those two fields are written under @lock, read
 * without it (relaxed: hints).
 */
struct percpuref_backlog {
	pthread_mutex_t *lock;
	pthread_cond_t *progress;
	const unsigned long *queued, *done;
	const struct percpuref_thread *thread;
	unsigned long stalled_at, rearm_items;
	unsigned long stalls;	/* @lock: waits that found it stalled */
	unsigned int waiting;	/* @lock: callers in percpuref_backlog_wait() */
	unsigned long ran __attribute__((aligned(64)));
};
#define PERCPUREF_BACKLOG_INIT(lock_, progress_, queued_, done_, thread_) \
	{ (lock_), (progress_), (queued_), (done_), (thread_), 0, 0, 0, 0, 0 }
/* True when @queued (the count a push just made, or read) leaves more than
 * PERCPUREF_CALLBACK_BACKLOG items of @b not run, and @b is not stalled.
 * Lock-free. */
bool percpuref_backlog_over(struct percpuref_backlog *b, unsigned long queued);
/* Waits until @b's items before the @queued-th have run but half the limit,
 * for at most the limit's items run and BACKLOG_WAIT_MAX_MS, or until none
 * ran for BACKLOG_STALL_MS (@b stalled then); at once on a library thread,
 * inside a callback the library runs, under a batch lock or in a read-side
 * section, where the thread's work may wait for the caller.  No library
 * lock held. */
void percpuref_backlog_wait(struct percpuref_backlog *b, unsigned long queued);
/* Items still to run before a push over the limit waits again, after a
 * stall (0 when armed).  Lock-free. */
unsigned long percpuref_backlog_rearm_left(struct percpuref_backlog *b);
/* @b's stalls so far, read under its lock (tests). */
unsigned long percpuref_backlog_stalls(struct percpuref_backlog *b);
/* Around every confirm and release the library runs (percpu_ref.c), for
 * percpuref_backlog_wait(). */
void percpuref_callback_enter(void);
void percpuref_callback_leave(void);

/* The library's settings from the environment (PERCPUREF_*): none in a
 * process whose privileges another user gave it (setuid, setgid, file
 * capabilities: the kernel's AT_SECURE), where whoever starts it chooses
 * the environment; glibc ignores its own tunables there too. */
const char *percpuref_getenv(const char *name);
/* A setting from the environment: @name's value if it is a number (decimal
 * digits only: strtoul() alone takes blanks and a sign, and " -1" for
 * ULONG_MAX) no larger than @max; otherwise warned (as @who) and false. */
bool percpuref_env_ulong(const char *who, const char *name, unsigned long max,
			 unsigned long *value);

/* Memory for the library's own objects; fails on demand (see below). */
void *percpuref_zalloc(size_t size);

/*
 * Fault injection for tests.  Counted together: allocations made through
 * percpuref_zalloc() (a thread's slot cache among them), the per-CPU
 * allocator (a chunk, its table, and the depot's growth, which a free may
 * make) and the managed list's stages (managed.c), and starts of the
 * library's threads (a stack each: refused as
 * pthread_create() refuses one, EAGAIN).  percpuref_fault_fail_nth_alloc():
 * the @nth next fails (1 = the very next), and the hook disarms; -1: every
 * one fails until disarmed (memory short for a while); 0 disarms.
 * percpuref_fault_fail_from_nth_alloc(): the @nth next and every one after
 * fail, until disarmed (memory runs out, at a point a test chooses).
 * percpuref_fault_refused_allocs(): those so refused since the process
 * started.  Exposed (default visibility) so tests linking the static
 * library can reach them; not part of the installed API.
 */
PERCPUREF_API void percpuref_fault_fail_nth_alloc(long nth);
PERCPUREF_API void percpuref_fault_fail_from_nth_alloc(long nth);
PERCPUREF_API unsigned long percpuref_fault_refused_allocs(void);
bool percpuref_fault_should_fail(void);
/* runtime.c's parser of CPU lists (the possible mask, a choice of CPUs):
 * the highest CPU + 1, the CPUs into @set unless NULL; 0: not a list, or
 * too large.  Exposed for tests. */
PERCPUREF_API unsigned int percpuref_parse_cpu_list(const char *text,
						    struct percpuref_cpu_mask *set);
PERCPUREF_API unsigned int percpuref_cpu_count_from_file(FILE *f);
/*
 * Test hook: the CPU count source answers @n, as a count from sysconf()
 * does where /sys is hidden (a chroot, a minimal container).  Call before
 * anything else of the library.
 */
PERCPUREF_API void percpuref_fault_cpu_units(unsigned int n);
/* Every signal but the synchronous ones (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
 * SIGTRAP, SIGSYS), which the kernel never holds pending: a blocked one
 * raised by the thread's own instruction is reset to its default action
 * and kills the process (runtime.c, "Signal masks").  The set to block
 * around user code that no other signal may interrupt. */
void percpuref_sigfill_async(sigset_t *set);
/* Test hook: the library's threads started from now on leave @sig open
 * (runtime.c, "Signal masks"); they block every other. */
PERCPUREF_API void percpuref_test_library_threads_accept(int sig);
/* Test hook: how many library threads are listed (runtime.c, "Placement"):
 * those started and not yet ended. */
PERCPUREF_API unsigned int percpuref_test_library_threads_listed(void);
/*
 * The fence used once membarrier is refused: runs the calling thread on
 * every CPU a thread of the process may use.  The number of CPUs, or -1
 * (errno set) when a move was refused or such a CPU is out of this
 * thread's reach (runtime.c).  Visible for tests.
 */
PERCPUREF_API int percpuref_fence_by_migration(void);

/* Sleeps @us microseconds, signals or not (a pause while waiting for
 * another thread; errno kept). */
void percpuref_sleep_us(unsigned long us);
/* One step of a wait for another thread that is usually done within
 * microseconds but may take milliseconds: the first 64 tries yield the
 * CPU, later ones sleep 50 µs.  @tries counts from 1. */
void percpuref_yield_or_nap(unsigned long tries);

/* One-line diagnostic on stderr: "percpuref: <fn>: <message>", or
 * "percpuref: <message>" where no call of the API is to blame (@fn NULL). */
void percpuref_warn(const char *fn, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Count of warnings printed so far (tests assert misuse was reported). */
PERCPUREF_API unsigned long percpuref_warning_count(void);
/* The net count a per-CPU ref's words hold, its unit-less word included
 * (src/percpu_ref.c), sign-extended: for tests, while nothing switches it. */
struct percpu_ref;
PERCPUREF_API unsigned long percpuref_test_percpu_net(struct percpu_ref *ref);

#endif
