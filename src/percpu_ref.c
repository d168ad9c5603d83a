/* SPDX-License-Identifier: MIT */
/*
 * percpu_ref.c - slow paths of the per-CPU reference count: init and exit,
 * mode switches, kill, resurrect and reinit, and misuse handling.
 *
 * The object.  A percpu_ref is a mode word (percpu_count_ptr: the address of
 * CPU 0's counter with the ATOMIC and DEAD flags in its low bits) plus a
 * separately allocated percpu_ref_data holding the atomic count.  The
 * per-CPU words only ever grow: a get adds nr, a put adds nr * (2^31 - 1),
 * nr above the low 31 bits and minus nr in them (percpu_ref.h,
 * PERCPU_REF_NET_BITS), so the reclaimer can see a ref in use without
 * switching it.  The total number of references is  data->count + net
 * where net is the low 31 bits of the sum of the per-CPU words,
 * sign-extended (percpuref_counter_net()): any one word's low bits may be
 * "negative" (a get on one CPU, the put on another), only the sum means
 * something.
 *
 * Life cycle: per-CPU -> atomic -> dead (and back, with ALLOW_REINIT).
 *  - Per-CPU mode: the fast paths add to this CPU's counter and never look
 *    at zero.  data->count carries PERCPU_COUNT_BIAS (2^63 - 2^32) so that atomic
 *    operations racing with a switch can never see it reach zero.
 *  - To atomic: under the switch lock set ATOMIC in the mode word and take an
 *    extra reference (atomic: the flag is already visible to this thread);
 *    then the reader fence (membarrier for rseq readers, a grace period
 *    for fallback readers; runtime.c, fallback.c) guarantees that no per-CPU update which
 *    read the old mode word can still land.  Only then is it safe to sum the
 *    per-CPU counters and add (sum - BIAS) to data->count in one atomic add:
 *    adding CPUs one by one could let the count touch zero halfway.
 *    Finally the confirm callback runs and the extra reference is dropped;
 *    if that was the last one, @release runs there.
 *  - Kill: set DEAD, switch to atomic as above, drop the initial reference.
 *    The fold zeroes each per-CPU counter it reads as other than zero, so
 *    an atomic ref with no switch in flight has them all zero, as has a
 *    free slot (but for CPU 0's link: the allocator's invariant,
 *    internal.h): one pass over a counter's copies a life, where an
 *    allocation's zeroing and the fold made two, and no store of a zero
 *    over a zero.  An exit of a per-CPU ref zeroes them so before the
 *    free.
 *  - To per-CPU: add BIAS (the counters are zero), then clear ATOMIC with
 *    a release store; it pairs with the reader's load of the mode word
 *    (an rseq load on x86 is ordered by TSO; the fallback loads with acquire)
 *    so any reader that sees the flag clear also sees the zeroed counters.
 *
 * Callers without a unit (more threads than fallback units, a CPU past the
 * units counted, a call after the thread's exit hook) count on one more
 * word, the impl's unitless_word, with a CAS, while the mode word says
 * per-CPU and the word is open (unitless_add()): the fold closes it with
 * an exchange and adds it to the per-CPU words' sum, and the switch to
 * per-CPU mode reopens it at 0, so a reference taken on a per-CPU word and
 * dropped without a unit cancels out in the sum (on the atomic count, 2^30
 * of them read the count 2^31 off).  Every add lands before the exchange
 * or finds the word closed (one RMW order on the word), so the fold counts
 * each once; tests/model/unitless.pml.
 *
 * Concurrency.  A ref's mode changes serialise on its switch lock, one of
 * SWITCH_STRIPES locks its address hashes to (the kernel and the proposal
 * have one global lock: limitation 4); independent refs switch in
 * parallel.  A switch to atomic in flight is marked by a non-NULL
 * data->confirm_switch; the next mode change on that ref waits on its
 * stripe's futex word, the lock dropped, until it is cleared.  A fork
 * takes no stripe: it waits for every thread inside a switch's critical
 * section and keeps new ones out (below, and tests/model/gate.pml).
 * Callbacks (confirm, release) are never called with the lock held, so
 * they may call into the API on other refs.
 * The asynchronous switch (switch_to_atomic, kill) finishes on the library's
 * callback thread after one fence for the whole batch (deferred.c); percpu_ref_switch_to_atomic_sync() waits for the fence
 * on the calling thread instead, which costs a membarrier, not a grace period
 * plus a hand-off, when the process uses rseq.
 *
 * Managed mode (percpu_ref_switch_to_managed; the list and the thread are
 * in managed.c).  The switch takes a reference that belongs to the manager
 * (the seed's and the 2024 series' contract: the creator keeps its initial
 * reference and drops it with a put, like every user); the ref is per-CPU
 * except while the reclaimer checks it, and kill and the mode calls refuse
 * it (tested under the switch lock after any wait for a switch in flight,
 * which drops the lock: lock_unmanaged(); tests/model/modes.pml).  A check
 * is a switch to atomic mode done in two halves under the switch lock,
 * percpuref_managed_begin() and, after a reader fence,
 * percpuref_managed_finish(): fold, then one CAS of the count from 2 (the
 * manager's reference and the switch's) to 0.  If it succeeds nobody else
 * held a reference and none can be taken any more (tryget sees 0; no one
 * holds one to get from): the ref is dead, the reclaimer unlinks its node
 * and only then calls @release, so a release never races the walk.  If it
 * fails the ref goes back to per-CPU mode, the manager's reference intact.
 * The proposal instead drops the manager's reference with a put and then
 * tries tryget to see whether that was the last: there a user put may reach
 * zero in between, and that putter goes on to touch the ref (the call to
 * @release) while the manager, seeing zero, unlinks and frees it.  The
 * kernel covers that with RCU-freed objects; the CAS needs nothing: no user
 * put can reach zero on a managed ref, and one that does dropped the
 * manager's reference (misuse: warned, count pinned, never released).
 * But a put reads the managed flag only after its zero, and a reinit may
 * come at once (the count reads zero) and a switch to managed after it:
 * so the put loads data->lives (acquire) before its subtract, a
 * resurrection stores lives + 1 (release) after its add, and a zero whose
 * lives no longer match is of an earlier life and runs its @release
 * (__percpu_ref_release_life(); tests/model/voided.pml).
 * The reclaimer owns a node while it is linked or its release is pending
 * (mstate): an exit meanwhile only marks it exited, and the reclaimer frees
 * it; a linked one without taking its switch lock, on an acquire load of
 * the mark (IMPL_EXITED), which is the exit's last access to the impl.
 * But a node still on top of the stage it was pushed on, which no pass
 * has taken, goes back to its ref when the ref is unmanaged or exited
 * (unstage_node(); managed.c, percpuref_managed_unstage()).
 * The in-flight mark (confirm_switch) makes exit, switch_to_unmanaged
 * and switch_to_managed wait for a check to end, and @release is called
 * only after every mark of the batch is cleared, so a release callback may
 * exit or unmanage any other ref of the same batch (the release of a ref
 * exited so is skipped: its object may be gone).  A put that dropped the
 * manager's reference is found by the check (count 1 after the fold):
 * warned once, the ref stays atomic with a saturated count, and the next
 * pass unlinks it for good (pinned).  A failed check goes back to per-CPU
 * mode with one CAS that drops the switch's reference and adds the bias,
 * from a count the manager's reference keeps above zero: a put too many
 * can land in no step between (tests/model/toomany.pml).  A check after
 * exit() ran the library's exit handler does not go back: a held ref
 * becomes a killed, unmanaged one (the managed flag cleared and DEAD set
 * before the subtract of the manager's and the switch's references, so a
 * holder's put that then reaches zero reads it unmanaged, through the
 * count's release sequence, and releases it: tests/model/exitconv.pml).
 * On the thread that runs the exit a kill is synchronous: DEAD set under
 * the hold that starts its switch, the fence and fold there, then its
 * confirm and its put, so it leaves nothing to the callback thread
 * (docs/percpu_ref.md, "At process exit").
 *
 * Releases in signal handlers.  A get or put may run in a signal handler
 * (docs/percpu_ref.md, "Signal handlers"), and its put may reach zero.  On
 * the fallback path the handler may have interrupted a get or put of its
 * own thread inside its read-side section (fallback.h), which cannot end
 * before the handler returns, and which every fence waits for: a @release
 * run there that waits for a fence (a synchronous switch while another
 * thread holds the fallback readers' lock for a fence of its own, a
 * barrier while the callback thread fences, an exit waiting for a switch)
 * waited for ever.  So a release reached while the thread's own section is
 * open is not run there: the ref goes on the thread's list of
 * handler_releases, and the interrupted get or put runs the list once its
 * section has ended, on the same thread, as it returns.  A count at zero
 * stays at zero (only @release or a later reinit may change it), and
 * nothing else runs the ref's @release, so the delay changes when it runs,
 * not how often.  A reinit before it ran, and a second zero that a
 * handler defers too (on any thread), owe two: the impl counts them
 * (owed_and_holds) and sits on the first thread's list once, which runs
 * both (a second zero outside a handler runs its release at once, as any).
 * An exit before that thread took a release off the count means that
 * release never runs (the object may be gone), as a managed ref's; the
 * impl is freed by whoever lets go of it last, the exit, that list or the
 * reclaimer (drop_exit_hold()).
 *
 * Exits under RCU readers.  An RCU-released ref (percpu_rcuref.c) may be
 * exited between its zero and its @release while readers that found it
 * still call tryget, which reads the count through ref->data.  Such an
 * exit (percpuref_ref_exit()'s @readers_hold) leaves the impl to its
 * caller with one more hold, let go after the grace period, and a mode
 * word that no other ref without data has (EXITED_UNDER_READERS); a
 * tryget loads ref->data once, and one that finds none reads that word
 * and fails quietly.  A tryget racing any other exit is misuse, as in the
 * kernel: warned where it finds no data, undefined where it does.
 *
 * Misuse never corrupts the count: a count pushed below zero or a get on a
 * released ref pins the count at PERCPU_REF_SATURATED (the object leaks,
 * release never runs twice); kill twice, resurrect of a live ref, reinit of a
 * non-zero ref, and switching back to per-CPU mode a ref created without
 * ALLOW_REINIT or one released at zero in atomic mode, warn and do nothing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fallback.h"
#include "internal.h"
#include "managed.h"
#include "percpuref/percpu_ref.h"

/*
 * Per-ref switch locks, striped: a ref's mode changes serialise on the
 * stripe its address hashes to, so independent refs switch in parallel (the
 * proposal's limitation 4 was one global lock).  A stripe is a lock word
 * and the futex word its in-flight switches are waited on with, one cache
 * line; refs that share a stripe share both, and every waiter re-checks
 * its own ref.  The stripe depends on the ref's address only, so it stays
 * the same from init to exit and after.  No path holds two stripes at once.
 *
 * The lock word is its own fork gate.  Up to 0.4.13 a fork's prepare
 * locked every stripe, in index order, which made more stripes cost every
 * fork (2.5-4.0 ms with 2^14 of them, docs/percpu_ref.md) and wrote all
 * their pages in the parent and the child.  Now a fork raises fork_pending
 * and then reads every lock word until it reads unlocked; a thread that
 * takes a stripe reads the flag after its lock's compare-and-swap, and if
 * the flag is up lets go of the stripe, untouched, and sleeps on
 * fork_gate, which the fork holds until its parent or child handler.
 * Dekker's pattern: the lock's seq_cst compare-and-swap and the fork's
 * seq_cst exchange of the flag are each followed by a seq_cst load of the
 * other's word, so either the fork sees the stripe locked and waits, or the
 * thread sees the flag.  So at the fork no thread is inside a switch's
 * critical section; a word may read locked in the child only for a thread
 * that was stepping back, which the child's handler unlocks.  The fork
 * only reads the stripes (the pages of unused ones map the zero page), so
 * their number costs it a read of 64 bytes each.  (A signal handler's call
 * that interrupted a section of its own thread, outside the documented
 * use, may wait for a fork that waits for that section, as it could wait
 * for the stripe before.)  Waiters for a switch in flight let go of the
 * stripe while they sleep and take it back through the same check
 * (wait_switch_ended()); tests/model/gate.pml.
 */
#define SWITCH_STRIPES PERCPUREF_SWITCH_STRIPES

struct percpuref_switch_stripe {
	/* 0 unlocked, 1 locked, 2 locked with sleepers (futex). */
	uint32_t lock;
	/* Bumped (the low 31 bits) under the lock when a switch to atomic of
	 * one of its refs ends, and waited on (futex) with the lock dropped;
	 * SWITCH_WAITERS set by a waiter, under the lock. */
	uint32_t ended;
} __attribute__((aligned(64)));

#define SWITCH_WAITERS (1u << 31)

/*
 * Zeroed memory is unlocked and a futex word needs nothing, so the stripes
 * need no constructor, which could run after a program's own constructors
 * used refs (a program linked with the static library runs its
 * constructors first; up to 0.4.8 ours initialised pthread mutexes).  (A
 * static initialiser of every element made clang take 40 s and 1.8 GB for
 * 2^20 stripes.)
 */
static struct percpuref_switch_stripe switch_stripes[SWITCH_STRIPES];

static bool fork_pending;
static pthread_mutex_t fork_gate = PTHREAD_MUTEX_INITIALIZER;

static struct percpuref_switch_stripe *stripe_of(const struct percpu_ref *ref)
{
	return &switch_stripes[percpuref_switch_stripe_index(ref)];
}

/* The futex lock of "Futexes Are Tricky" (Drepper), as glibc's mutexes. */
static void lock_word(uint32_t *word)
{
	uint32_t seen = 0;

	/* Seq_cst: acquires the section, and is ordered before the load of
	 * fork_pending (Dekker, above). */
	if (__atomic_compare_exchange_n(word, &seen, 1, false, __ATOMIC_SEQ_CST,
					__ATOMIC_RELAXED))
		return;
	/* Seq_cst likewise; 2 tells the holder to wake a sleeper. */
	if (seen != 2)
		seen = __atomic_exchange_n(word, 2, __ATOMIC_SEQ_CST);
	while (seen != 0) {
		percpuref_futex_wait(word, 2, NULL);
		seen = __atomic_exchange_n(word, 2, __ATOMIC_SEQ_CST);
	}
}

static void unlock_word(uint32_t *word)
{
	/* Release: the section happens before the next holder's acquire and
	 * before a fork that reads the word unlocked (its seq_cst load). */
	if (__atomic_exchange_n(word, 0, __ATOMIC_RELEASE) == 2)
		percpuref_futex_wake_one(word);
}

static void lock_stripe(struct percpuref_switch_stripe *stripe)
{
	for (;;) {
		lock_word(&stripe->lock);
		/* Seq_cst: after the lock's compare-and-swap (Dekker). */
		if (!__atomic_load_n(&fork_pending, __ATOMIC_SEQ_CST))
			return;
		unlock_word(&stripe->lock);
		pthread_mutex_lock(&fork_gate);
		pthread_mutex_unlock(&fork_gate);
	}
}

static void unlock_stripe(struct percpuref_switch_stripe *stripe)
{
	unlock_word(&stripe->lock);
}

static void lock_switch(const struct percpu_ref *ref)
{
	lock_stripe(stripe_of(ref));
}

static void unlock_switch(const struct percpu_ref *ref)
{
	unlock_stripe(stripe_of(ref));
}

/* Lock held.  Waits for a switch of a ref of this stripe to end, or until
 * @until (CLOCK_MONOTONIC, percpuref_deadline()) if not NULL, with the
 * lock dropped meanwhile.  @callback_thread_ends_it: the switch waited
 * for is asynchronous, so the wait counts as one that the callback thread
 * does not give way to others before (deferred.c). */
static void wait_switch_ended(const struct percpu_ref *ref, const struct timespec *until,
			      bool callback_thread_ends_it)
{
	struct percpuref_switch_stripe *stripe = stripe_of(ref);
	/* Under the lock: a switch that ends after the unlock changes the
	 * word first, and the futex then returns at once. */
	uint32_t seen = stripe->ended | SWITCH_WAITERS;

	/* Relaxed: read under the lock by whoever ends a switch. */
	__atomic_store_n(&stripe->ended, seen, __ATOMIC_RELAXED);
	unlock_switch(ref);
	if (callback_thread_ends_it)
		percpuref_deferred_waiter_begin();
	percpuref_futex_wait(&stripe->ended, seen, until);
	if (callback_thread_ends_it)
		percpuref_deferred_waiter_end();
	lock_switch(ref);
}

/* Lock held.  A switch of @ref ended: wakes its stripe's waiters, if any
 * (the callback thread ends one per kill; a wake nobody waits for is a
 * system call).  A fork child may find the flag of a parent's waiter: one
 * wake for nobody, and it is clear. */
static void switch_ended(const struct percpu_ref *ref)
{
	struct percpuref_switch_stripe *stripe = stripe_of(ref);
	uint32_t old = stripe->ended;

	/* Relaxed: other threads read it under the lock, the kernel's futex
	 * compare atomically. */
	__atomic_store_n(&stripe->ended, (old + 1) & ~SWITCH_WAITERS, __ATOMIC_RELAXED);
	if (old & SWITCH_WAITERS)
		percpuref_futex_wake_all(&stripe->ended);
}

/*
 * How a fork waits for a stripe's section to end: a few yields (a section
 * is mostly a few hundred nanoseconds), then sleeps that double from 50 µs
 * to 1 ms.  Not yields alone: under SCHED_FIFO a yield gives the CPU to no
 * thread of lower priority, so a real-time thread's fork spun, while a
 * holder of that CPU preempted inside its section waited, until the
 * kernel's real-time throttling (up to 1 s, and for ever without it;
 * test_fork_priority).  A section may also block: on a lock of a later
 * rank (which no fork holds yet), a warning's write to stderr, a library
 * thread's start.
 */
#define FORK_WAIT_YIELDS 64
#define FORK_WAIT_FIRST_NS 50000L
#define FORK_WAIT_MAX_NS 1000000L

static void fork_wait_unlocked(const uint32_t *word)
{
	struct timespec pause = { 0, FORK_WAIT_FIRST_NS };
	unsigned int yields = 0;

	/* Seq_cst (an acquire): a section that ended happens before the
	 * fork; ordered after the exchange of fork_pending (Dekker). */
	while (__atomic_load_n(word, __ATOMIC_SEQ_CST)) {
		if (yields < FORK_WAIT_YIELDS) {
			yields++;
			sched_yield();
			continue;
		}
		nanosleep(&pause, NULL);
		if (pause.tv_nsec < FORK_WAIT_MAX_NS)
			pause.tv_nsec *= 2;
	}
}

static void switch_fork_lock(void)
{
	unsigned int i;

	pthread_mutex_lock(&fork_gate);
	/* Seq_cst: ordered before the loads of the lock words (Dekker).  An
	 * exchange, not a store: qemu-user lets a seq_cst store pass a later
	 * load (deferred.c), and a fork then read a stripe unlocked that a
	 * thread locked having read the flag down. */
	(void)__atomic_exchange_n(&fork_pending, true, __ATOMIC_SEQ_CST);
	for (i = 0; i < SWITCH_STRIPES; i++)
		fork_wait_unlocked(&switch_stripes[i].lock);
}

static void switch_fork_unlock(void)
{
	/* Relaxed: fork_gate's unlock below releases it to the threads that
	 * saw the flag and wait on the gate; one that still reads it up
	 * steps back through the gate once more.  (In the child, this
	 * thread is the only one.) */
	__atomic_store_n(&fork_pending, false, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&fork_gate);
}

/*
 * Which process this is, as release_pending_in marks say it: one more in
 * each fork child (switch_fork_child()), where a release the parent's
 * thread was about to begin never runs.  Not the pid, which a grandchild
 * in a new pid namespace, or a later process, may share: an exit there
 * waited for that release for ever (a review).  Written only in a child
 * before it has other threads; read under a switch lock.
 */
static unsigned long process_generation = 1;

static void switch_fork_child(void)
{
	unsigned int i;

	process_generation++;

	/* A word locked here is a parent's thread's that was stepping back
	 * from the fork: it touched nothing.  Written only then, so that the
	 * child copies no page of them.  Relaxed, the load and the store:
	 * the child has no other thread yet. */
	for (i = 0; i < SWITCH_STRIPES; i++)
		if (__atomic_load_n(&switch_stripes[i].lock, __ATOMIC_RELAXED))
			__atomic_store_n(&switch_stripes[i].lock, 0, __ATOMIC_RELAXED);
	switch_fork_unlock();
}

static const struct percpuref_fork_hooks switch_hooks = {
	.rank = PERCPUREF_RANK_SWITCH,
	.prepare = switch_fork_lock,
	.parent = switch_fork_unlock,
	.child = switch_fork_child,
};

/*
 * Synchronous switches in flight, read-held from before the first half to
 * after the fold, written by fork: a switch_to_atomic_sync() holds no
 * switch lock during its fence, so without it a fork in that window left
 * the child a ref whose switch nobody would finish, and the child's kill
 * or exit of it waited for ever.  No thread takes it twice (no callback
 * runs while it is held).
 *
 * Writers first, so that a stream of switches cannot starve a fork: a fork
 * holds sync_switch_fork_gate from before it waits for the lock until it
 * lets go of it, and raises sync_switch_fork_waiting meanwhile; a switch
 * that sees the flag, or finds the lock taken, steps back and sleeps on
 * the gate (lock_for_sync_switch()).  Up to 0.4.3 glibc's writer-first kind
 * (PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP) did it, which no other C
 * library has: the library did not compile with musl.
 */
static pthread_rwlock_t sync_switch_lock = PTHREAD_RWLOCK_INITIALIZER;
static pthread_mutex_t sync_switch_fork_gate = PTHREAD_MUTEX_INITIALIZER;
/* Relaxed, both sides: it decides who goes first, not who may enter (the
 * lock does); a switch that misses it delays the fork by one switch. */
static bool sync_switch_fork_waiting;

static void sync_switch_fork_lock(void)
{
	/* The gate first: a switch that sees the flag finds the gate held,
	 * and sleeps on it rather than spin, and a second fork's flag
	 * cannot be cleared by the first fork's end. */
	pthread_mutex_lock(&sync_switch_fork_gate);
	/* Relaxed: a hint to step back; the write lock below decides, and a
	 * switch that misses the flag only delays the fork by one switch. */
	__atomic_store_n(&sync_switch_fork_waiting, true, __ATOMIC_RELAXED);
	pthread_rwlock_wrlock(&sync_switch_lock);
}

static void sync_switch_fork_unlock(void)
{
	pthread_rwlock_unlock(&sync_switch_lock);
	/* Relaxed: the gate's unlock below releases it to the switches that
	 * sleep on the gate; one that reads it up steps back once more. */
	__atomic_store_n(&sync_switch_fork_waiting, false, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&sync_switch_fork_gate);
}

static void sync_switch_fork_child(void)
{
	/* Not an unlock: glibc knows the writer by its thread id, which the
	 * child's thread does not have.  The gate, a plain mutex, is
	 * unlocked as the switch locks are. */
	pthread_rwlock_init(&sync_switch_lock, NULL);
	/* Relaxed: the child has no other thread yet. */
	__atomic_store_n(&sync_switch_fork_waiting, false, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&sync_switch_fork_gate);
}

static const struct percpuref_fork_hooks sync_switch_hooks = {
	.rank = PERCPUREF_RANK_SYNC_SWITCH,
	.prepare = sync_switch_fork_lock,
	.parent = sync_switch_fork_unlock,
	.child = sync_switch_fork_child,
};

static __attribute__((constructor)) void switch_register(void)
{
	percpuref_register_fork_hooks(&switch_hooks);
	percpuref_register_fork_hooks(&sync_switch_hooks);
}
/* The ref whose switch this thread is finishing (callbacks run inside). */
static __thread struct percpu_ref *finishing_switch_of;

/*
 * Every user callback runs through one of the three functions below, which
 * then forget the rseq sequence it ran last (percpuref_prepare_unload()):
 * a @release or confirm runs the fast path of its own object, on a thread
 * whose owner never called into that object (ours, or the caller of a put
 * or kill), and nobody else can clear it there before the object goes.
 */

/* The confirm callback of a switch this thread finishes.  Nested: the
 * callback may finish another ref's switch (switch_to_atomic_sync). */
static void run_confirm(struct percpu_ref *ref, percpu_ref_func_t *confirm)
{
	struct percpu_ref *outer = finishing_switch_of;
	int cancel = percpuref_cancel_disable();

	finishing_switch_of = ref;
	percpuref_batch_pin();
	confirm(ref);
	percpuref_batch_unpin();
	percpuref_prepare_unload();
	finishing_switch_of = outer;
	percpuref_cancel_restore(cancel);
}

/*
 * confirm_kill callbacks this thread runs at once (the ref was atomic
 * already), innermost first, each frame on its caller's stack.  Not a
 * switch in flight: another thread's switch of the ref is waited for as
 * usual.  Only exit refuses their refs, which the kill's put still uses
 * (a release cannot run inside one: the initial reference is held).
 * switch_to_atomic's confirm run at once needs none: nothing uses the
 * ref after it, and a release nested in it may exit the ref.
 */
struct kill_confirm {
	struct percpu_ref *ref;
	struct kill_confirm *outer;
};
static __thread struct kill_confirm *kill_confirms;

/* A release, or a confirm nothing follows, on whichever thread it falls to. */
static void run_callback(struct percpu_ref *ref, percpu_ref_func_t *fn)
{
	int cancel = percpuref_cancel_disable();

	percpuref_callback_enter();
	fn(ref);
	percpuref_callback_leave();
	percpuref_prepare_unload();
	percpuref_cancel_restore(cancel);
}

/*
 * A @release.  Run by a batch (the callback thread's, a scan), it runs with
 * the batch lock released (percpuref_batch_pause()): a fork waits for no
 * release.  Nothing of the batch's is left on our stack meanwhile: the
 * switch was finished, and the ref's impl (a managed release's) is ours
 * until the call returns, in the child too, where it stays so.
 */
static void run_release(struct percpu_ref *ref, percpu_ref_func_t *release)
{
	percpuref_batch_pause();
	run_callback(ref, release);
	percpuref_batch_resume();
}

/*
 * switch_to_atomic's confirm, run at once (the ref was atomic already).
 * Pinned as every other confirm, so that percpu_ref_poll() refuses inside
 * it (-EDEADLK, percpu_ref.h: any confirm); unpinned, a poll there ran.
 * Nothing else changes: a caller under a batch lock is inside a confirm
 * (pinned already) or a paused @release, where a nested @release pauses
 * nothing either.
 */
static void run_switch_confirm_at_once(struct percpu_ref *ref, percpu_ref_func_t *confirm)
{
	percpuref_batch_pin();
	run_callback(ref, confirm);
	percpuref_batch_unpin();
}

static void run_kill_confirm_at_once(struct percpu_ref *ref, percpu_ref_func_t *confirm)
{
	struct kill_confirm frame = { ref, kill_confirms };
	/* The kill's put comes after it. */
	int cancel = percpuref_cancel_disable();

	kill_confirms = &frame;
	percpuref_batch_pin();
	confirm(ref);
	percpuref_batch_unpin();
	percpuref_prepare_unload();
	kill_confirms = frame.outer;
	percpuref_cancel_restore(cancel);
}

/* The end of every kill: @confirm at once where the ref was atomic, its
 * switch done (NULL where the switch still to finish runs it, or none was
 * given), then the put of the initial reference. */
static void confirm_and_put_initial(struct percpu_ref *ref, percpu_ref_func_t *confirm)
{
	if (confirm)
		run_kill_confirm_at_once(ref, confirm);
	percpu_ref_put(ref);	/* the initial reference */
}

static bool confirming_kill_of(const struct percpu_ref *ref)
{
	const struct kill_confirm *frame;

	for (frame = kill_confirms; frame; frame = frame->outer)
		if (frame->ref == ref)
			return true;
	return false;
}

/* Where a ref's managed-list node is; switch lock. */
enum mnode_state {
	MNODE_OFF,		/* not on the list: exit frees the impl */
	MNODE_LISTED,		/* linked: the reclaimer frees it if exited */
	MNODE_RELEASING,	/* unlinked, release pending: likewise */
};

/* A ref the exit's check took from management while held
 * (unmanage_held_at_exit()), for the teardown written before the exit
 * began: switch_to_unmanaged then kill.  Switch lock. */
enum exit_unmanaged {
	EXIT_UNMANAGED_NONE,
	EXIT_UNMANAGED_UNMANAGE_OWED,	/* switch_to_unmanaged: 0, quietly */
	EXIT_UNMANAGED_KILL_OWED,	/* then kill: puts the caller's reference;
					 * or switch_to_managed: 0, UNMANAGE_OWED */
};

struct percpu_ref_impl {
	union {
		/* On one thread's handler_releases (or handler_releases_to_run)
		 * while owed_and_holds counts a release: @releases signal
		 * handlers reached inside sections, waiting for that thread's
		 * section to end.  Only the thread that raised the count from
		 * zero links it, and it stays linked, once, until the count
		 * falls back to zero. */
		struct percpu_ref_impl *handler_next;
		/* Once a spare (exited, unowned): the next in its chain.
		 * First: where the allocator reads it. */
		void *spare_next;
	};
	struct percpu_ref_data data;	/* ref->data points here */
	struct percpuref_deferred switch_work;
	struct percpuref_mnode mnode;
	enum mnode_state mstate;
	bool exited;			/* exit ran while the reclaimer owned it */
	bool release_voided;		/* revived while its release was pending */
	bool pinned;			/* manager's reference put by a user: leaked */
	enum exit_unmanaged exit_unmanaged; /* by the exit's check, held then */
	bool async_switch;		/* the switch in flight is the callback thread's */
	/* The process (process_generation) where a switch's put took the
	 * count to zero and the release it calls has not begun
	 * (percpuref_ref_release_begins()); 0 otherwise, or until the next
	 * such switch for a release that does not say so (any but an
	 * RCU-released ref's). */
	unsigned long release_pending_in;
	/* Its revivals in the last shutdown (percpuref_note_revival()). */
	struct percpuref_revivals revivals;
	const char *switch_caller;	/* the call that started it, for warnings */
	/* The handler releases owed (the low bits), and once exited who
	 * still holds the impl (see IMPL_EXITED): the last to let go frees
	 * it (drop_exit_hold()). */
	unsigned int owed_and_holds;
	/* The per-CPU word of callers without a unit (unitless_add()),
	 * UNITLESS_FOLDED set from the fold to the next per-CPU period. */
	unsigned long unitless_word;
};

/*
 * unitless_word: counts as the per-CPU words do (a get adds nr, a put nr *
 * PERCPU_REF_PUT_DELTA), modulo 2^63, its top bit set once the fold has
 * taken it (and while the ref is atomic): then callers use the atomic
 * count.
 */
#define UNITLESS_FOLDED (1UL << 63)

/*
 * In owed_and_holds.  IMPL_EXITED: exit ran.  Releases still owed then
 * never run (the object may be gone), and the thread that counts off the
 * last one lets go of the impl.  IMPL_RECLAIMER_HOLDS: exit found the
 * reclaimer holding the node (mstate not MNODE_OFF), which lets go when it
 * frees the node.  A ref switched to managed after a handler deferred its
 * release (reinit first), or unmanaged and then released in a handler
 * before the reclaimer unlinked it, has both.  IMPL_READERS_HOLD: the exit
 * came while RCU readers may still tryget the ref (percpuref_ref_exit()'s
 * @readers_hold), whose count they read until their sections end:
 * percpuref_ref_exit_readers_gone() lets go after a grace period.
 */
#define IMPL_EXITED		(1u << 31)
#define IMPL_RECLAIMER_HOLDS	(1u << 30)
#define IMPL_READERS_HOLD	(1u << 29)
#define IMPL_OWED_MASK		(IMPL_READERS_HOLD - 1)

/*
 * An exited impl the reclaimer let go of last waits as a spare for the
 * next init (percpu_alloc.c, "Spares"), linked through spare_next, its
 * first word: the scanner freed every such impl with free(), on the arena
 * of the thread that made it, whose next malloc() then met it on that
 * arena's lock.  An exit that frees the impl itself keeps it in its
 * thread's cache the same way (percpuref_spare_keep()).  Not under the
 * memory checkers (percpuref_spares_off()).
 */
_Static_assert(offsetof(struct percpu_ref_impl, spare_next) == 0, "the allocator's link");

/* A zeroed impl: a spare if this thread's cache or the depot has one. */
static struct percpu_ref_impl *impl_alloc(void)
{
	struct percpu_ref_impl *impl = percpuref_spare_take();

	if (!impl)
		return percpuref_zalloc(sizeof(*impl));
	memset(impl, 0, sizeof(*impl));
	return impl;
}

/* @hold (1 for an owed release, IMPL_RECLAIMER_HOLDS) lets go of @impl;
 * the last to let go of an exited one frees it, or chains it on @spares
 * if not NULL.  Returns what is left of owed_and_holds (the impl may be
 * gone: read nothing of it after).  Acquire-release: every holder's
 * accesses precede the free or the reuse. */
static unsigned int drop_exit_hold(struct percpu_ref_impl *impl, unsigned int hold,
				   struct percpuref_spares *spares)
{
	unsigned int left = __atomic_sub_fetch(&impl->owed_and_holds, hold, __ATOMIC_ACQ_REL);

	if (left != IMPL_EXITED)
		return left;
	if (!spares) {
		free(impl);
		return left;
	}
	impl->spare_next = spares->first;
	spares->first = impl;
	spares->n++;
	return left;
}

static struct percpu_ref_impl *impl_of(struct percpu_ref_data *data)
{
	return caa_container_of(data, struct percpu_ref_impl, data);
}

static uintptr_t mode_word(struct percpu_ref *ref)
{
	/* Relaxed: writers hold the switch lock; lockless readers order
	 * themselves (see the fast paths). */
	return __atomic_load_n(&ref->percpu_count_ptr, __ATOMIC_RELAXED);
}

static void set_mode_word(struct percpu_ref *ref, uintptr_t word)
{
	/* Sequentially consistent: without membarrier, the fallback readers'
	 * fence relies on it (fallback.h).  An exchange, not a store, for
	 * qemu-user, which lets a seq_cst store pass a later seq_cst load
	 * (deferred.c).  Clearing ATOMIC goes through
	 * switch_to_percpu_locked()'s release store instead. */
	__atomic_exchange_n(&ref->percpu_count_ptr, word, __ATOMIC_SEQ_CST);
}

static uintptr_t counter_of(struct percpu_ref *ref)
{
	return mode_word(ref) & ~(uintptr_t)__PERCPU_REF_ATOMIC_DEAD;
}

static void noop_confirm(struct percpu_ref *ref)
{
	(void)ref;
}

static void init_managed(struct percpu_ref *ref);

PERCPUREF_API int percpu_ref_init(struct percpu_ref *ref, percpu_ref_func_t *release,
				  unsigned int flags)
{
	struct percpu_ref_impl *impl;
	unsigned long start_count = 0;
	uintptr_t cpu0;

	/* First: a mode word the library wrote implies a set-up runtime, so
	 * the inline sequence need not test for one that is not set up
	 * (percpuref_this_cpu_add_after_setup()), even on a refused ref. */
	percpuref_runtime_init();
	if (!ref)
		return -EINVAL;
	ref->percpu_count_ptr = __PERCPU_REF_ATOMIC_DEAD;
	ref->data = NULL;
	if (flags & ~(unsigned int)(PERCPU_REF_INIT_ATOMIC | PERCPU_REF_INIT_DEAD |
				    PERCPU_REF_ALLOW_REINIT | PERCPU_REF_REL_MANAGED))
		return -EINVAL;

	/* A fork child of a process without them may wait for ever. */
	if (!percpuref_fork_handlers_registered())
		return -ENOMEM;
	cpu0 = percpuref_counter_alloc();
	if (!cpu0)
		return -ENOMEM;
	impl = impl_alloc();
	if (!impl) {
		percpuref_counter_free(cpu0);
		return -ENOMEM;
	}

	impl->data.force_atomic = flags & PERCPU_REF_INIT_ATOMIC;
	impl->data.allow_reinit = flags & (PERCPU_REF_ALLOW_REINIT | PERCPU_REF_REL_MANAGED);
	if (flags & (PERCPU_REF_INIT_ATOMIC | PERCPU_REF_INIT_DEAD)) {
		cpu0 |= __PERCPU_REF_ATOMIC;
		impl->data.allow_reinit = true;
		impl->unitless_word = UNITLESS_FOLDED;
	} else {
		start_count += PERCPU_COUNT_BIAS;
	}
	if (flags & PERCPU_REF_INIT_DEAD)
		cpu0 |= __PERCPU_REF_DEAD;
	else
		start_count++;

	impl->data.count = start_count;
	impl->data.release = release;
	impl->data.ref = ref;
	ref->percpu_count_ptr = cpu0;
	ref->data = &impl->data;
	if (flags & PERCPU_REF_REL_MANAGED)
		init_managed(ref);
	return 0;
}

/* What wait_switch_done() found. */
enum switch_wait {
	SWITCH_NONE,		/* no switch in flight */
	SWITCH_MAY_NOT_WAIT,	/* one in flight that the caller may not wait for */
	SWITCH_REF_EXITED,	/* the ref was exited while the lock was dropped */
};

/*
 * Waits until no switch to atomic is in flight on @ref.  Lock held, the
 * ref usable.  SWITCH_MAY_NOT_WAIT when that would wait for itself: inside
 * the switch's own confirm callback, or in a callback run under a batch
 * lock for an asynchronous switch that the callback thread has yet to
 * finish (the thread running the callback, or a fork waiting for it, holds
 * up the callback thread).  The wait drops the lock, and the ref may be
 * exited meanwhile (by its @release, which the wait itself may run when no
 * thread can start: SIGSEGV on the NULL data): SWITCH_REF_EXITED.  A
 * caller that holds the lock since an earlier wait finds SWITCH_NONE.
 */
static enum switch_wait wait_switch_done(struct percpu_ref *ref)
{
	enum switch_wait found = SWITCH_NONE;
	bool ran_queue;
	int cancel;

	if (!ref->data->confirm_switch)
		return SWITCH_NONE;
	cancel = percpuref_cancel_disable();
	for (;;) {
		if (!ref->data) {
			found = SWITCH_REF_EXITED;
			break;
		}
		if (!ref->data->confirm_switch)
			break;
		if (finishing_switch_of == ref ||
		    (impl_of(ref->data)->async_switch && percpuref_holds_batch_lock())) {
			found = SWITCH_MAY_NOT_WAIT;
			break;
		}
		/*
		 * An asynchronous switch is the callback thread's to finish,
		 * and a refused start of that thread left it queued for the
		 * next push or barrier, which may never come (a call waiting
		 * for such a switch hung for ever): start it, and if it cannot
		 * start, run the queue here, the lock dropped as in the wait
		 * (the switch's item takes it).  A library thread may not run
		 * the queue: it tries again every 50 ms.
		 */
		/* It may sit on a polling thread's queue, ours or one that
		 * never polls again: hand it over. */
		if (impl_of(ref->data)->async_switch)
			percpuref_deferred_take_polled_item(&impl_of(ref->data)->switch_work);
		if (impl_of(ref->data)->async_switch && !percpuref_deferred_start()) {
			struct timespec until;

			unlock_switch(ref);
			ran_queue = !percpuref_wait_deferred();
			lock_switch(ref);
			if (ran_queue)
				continue;
			percpuref_deadline(&until, 50);
			wait_switch_ended(ref, &until, true);
			continue;
		}
		percpuref_deferred_wake_owed();
		wait_switch_ended(ref, NULL, impl_of(ref->data)->async_switch);
	}
	percpuref_cancel_restore(cancel);
	return found;
}

/* Lock held.  A listed node still on top of its stage, which no pass has
 * taken, goes back to the ref at once (percpuref_managed_unstage()): a ref
 * made managed and then unmanaged, or exited, before the reclaimer saw it
 * costs the reclaimer nothing, and its exit frees the impl on its own
 * thread instead of the next pass. */
static void unstage_node(struct percpu_ref_impl *impl)
{
	if (impl->mstate == MNODE_LISTED && percpuref_managed_unstage(&impl->mnode))
		impl->mstate = MNODE_OFF;
}

/*
 * The mode word of a ref exited with a readers' hold (percpuref_ref_exit()):
 * dead but not atomic, the final count above the flags as any exit's.  A
 * ref with data may have a dead word without ATOMIC (a kill's, until its
 * switch sets it), one without data never otherwise: an exit leaves
 * ATOMIC_DEAD, a refused init ATOMIC_DEAD.  So a tryget that finds no data
 * and this word fails quietly, as on any released ref, where misuse warns.
 */
#define EXITED_UNDER_READERS __PERCPU_REF_DEAD

static bool exited_under_readers(struct percpu_ref *ref)
{
	return (mode_word(ref) & __PERCPU_REF_ATOMIC_DEAD) == EXITED_UNDER_READERS;
}

bool percpuref_ref_exit(struct percpu_ref *ref, struct percpu_ref_data **readers_hold)
{
	struct percpu_ref_data *data;
	bool left_to_reclaimer, reclaimer_holds;
	enum switch_wait wait;
	unsigned long count;
	uintptr_t cpu0;

	if (!ref)
		return true;
	lock_switch(ref);
	data = ref->data;
	if (!data) {	/* never initialised successfully, or exited */
		unlock_switch(ref);
		return true;
	}
	/* Its own confirm: the switch, or the kill's put, still uses it. */
	wait = finishing_switch_of == ref || confirming_kill_of(ref) ? SWITCH_MAY_NOT_WAIT :
		wait_switch_done(ref);
	if (wait == SWITCH_MAY_NOT_WAIT) {
		percpuref_warn("percpu_ref_exit", "ref %p exited from its confirm callback or while "
			       "its switch is in flight; ignored: the switch still reads it, do "
			       "not free it", (void *)ref);
		unlock_switch(ref);
		return false;
	}
	/* Exited during the wait: done, as a second exit. */
	if (wait == SWITCH_REF_EXITED) {
		unlock_switch(ref);
		return true;
	}
	data = ref->data;	/* the wait may have dropped the lock */
	cpu0 = counter_of(ref);
	if (cpu0) {
		/* An atomic ref's words are zero since its fold (no switch is
		 * in flight); a per-CPU one's are counts. */
		if (!(mode_word(ref) & __PERCPU_REF_ATOMIC))
			percpuref_counter_clear(cpu0, percpuref_nr_units());
		percpuref_counter_free(cpu0);
	}
	/* Keep the final count readable by percpu_ref_is_zero().  One the
	 * shift past the flag bits would cut (2^62 and above: a per-CPU ref's
	 * biased count, a pinned one) is kept as the largest that fits: as
	 * a multiple of 2^62 it read as zero.  Relaxed: no call may race an
	 * exit but a reader's tryget under a readers' hold, which changes no
	 * count at zero. */
	count = __atomic_load_n(&data->count, __ATOMIC_RELAXED);
	if (count > ULONG_MAX >> __PERCPU_REF_FLAG_BITS)
		count = ULONG_MAX >> __PERCPU_REF_FLAG_BITS;
	set_mode_word(ref, (readers_hold ? EXITED_UNDER_READERS : __PERCPU_REF_ATOMIC_DEAD) |
			   (count << __PERCPU_REF_FLAG_BITS));
	/* Release, after the mode word: a tryget that reads no data with
	 * acquire reads the word above (__percpu_ref_tryget_slow()). */
	__atomic_store_n(&ref->data, NULL, __ATOMIC_RELEASE);
	/* A node the reclaimer still reaches, a release a thread's handler
	 * list still owes, or readers' trygets, hold the impl: the last to
	 * let go frees it.  Acquire-release against the owed count's
	 * changes: whichever comes second sees the other's
	 * (run_one_handler_release()); release also for the reclaimer, which
	 * frees a listed node it finds marked without this lock
	 * (percpuref_managed_node_exited()).  So nothing of the impl is read
	 * after the mark where the reclaimer holds it. */
	unstage_node(impl_of(data));
	impl_of(data)->exited = true;
	left_to_reclaimer = impl_of(data)->mstate == MNODE_LISTED;
	reclaimer_holds = impl_of(data)->mstate != MNODE_OFF;
	if (readers_hold)
		*readers_hold = data;
	if (__atomic_fetch_or(&impl_of(data)->owed_and_holds,
			      IMPL_EXITED | (reclaimer_holds ? IMPL_RECLAIMER_HOLDS : 0) |
				      (readers_hold ? IMPL_READERS_HOLD : 0),
			      __ATOMIC_ACQ_REL) ||
	    reclaimer_holds || readers_hold)
		data = NULL;
	unlock_switch(ref);
	if (data)
		percpuref_spare_keep(impl_of(data));
	if (left_to_reclaimer)
		percpuref_managed_exited();
	return true;
}

PERCPUREF_API void percpu_ref_exit(struct percpu_ref *ref)
{
	percpuref_ref_exit(ref, NULL);
}

bool percpuref_ref_wait_switch(struct percpu_ref *ref)
{
	bool pending = false;

	lock_switch(ref);
	if (ref->data && (finishing_switch_of == ref || confirming_kill_of(ref) ||
			  wait_switch_done(ref) == SWITCH_NONE))
		/* Not a fork child's copy: the release runs in the parent. */
		pending = ref->data &&
			  impl_of(ref->data)->release_pending_in == process_generation;
	unlock_switch(ref);
	return pending;
}

void percpuref_ref_release_begins(struct percpu_ref *ref)
{
	lock_switch(ref);
	if (ref->data)
		impl_of(ref->data)->release_pending_in = 0;
	unlock_switch(ref);
}

void percpuref_ref_exit_readers_gone(struct percpu_ref_data *data)
{
	if (data)
		(void)drop_exit_hold(impl_of(data), IMPL_READERS_HOLD, NULL);
}

/* Misuse: pin @ref's count so that it is leaked, never released.  Relaxed:
 * a best-effort pin, as refcount_t's saturation. */
static void pin_count(struct percpu_ref *ref)
{
	__atomic_store_n(&ref->data->count, PERCPU_REF_SATURATED, __ATOMIC_RELAXED);
}

/*
 * Folds the per-CPU counters into data->count.  Called after the reader
 * fence, with the switch's extra reference held, so the result is >= 1 in a
 * correct program; anything else means puts outnumbered gets.
 */
static void fold_percpu_counts(struct percpu_ref *ref)
{
	unsigned long net, count, unitless;

	/* For TSAN: pairs with the release in percpu_ref_put_many(). */
	percpuref_tsan_acquire(&ref->data);
	/* Closes the word of callers without a unit: each of their adds lands
	 * before this (counted here) or finds it closed (and goes on the
	 * atomic count).  Acquire: pairs with a put's release CAS, so that
	 * the putter's accesses happen before @release. */
	unitless = __atomic_exchange_n(&impl_of(ref->data)->unitless_word, UNITLESS_FOLDED,
				       __ATOMIC_ACQUIRE);
	/* The fence made every update of the per-CPU words visible already;
	 * they stay zero from here while the ref is atomic. */
	net = percpuref_counter_net(percpuref_counter_take_sum(counter_of(ref),
							       percpuref_nr_units()) +
				    unitless);
	/* Relaxed: no release can race (extra reference held); the putter
	 * that reaches zero later orders after this through the RMW chain. */
	count = __atomic_add_fetch(&ref->data->count, net - PERCPU_COUNT_BIAS, __ATOMIC_RELAXED);
	if (count == 0 || count >= PERCPU_REF_UNDERFLOW_ZONE) {
		percpuref_warn(impl_of(ref->data)->switch_caller,
			       "ref %p count %ld <= 0 after folding per-CPU counts; leaked",
			       (void *)ref, (long)count);
		pin_count(ref);
	}
}

/* Second half of a switch to atomic, after the reader fence: fold, confirm,
 * drop the switch's reference.  Never called with the lock held.  Returns
 * the @release the caller must call (the switch's reference was the last
 * one), or NULL. */
static percpu_ref_func_t *finish_atomic_switch(struct percpu_ref *ref)
{
	struct percpu_ref_data *data = ref->data;
	percpu_ref_func_t *confirm, *release = data->release;
	bool released;

	lock_switch(ref);
	fold_percpu_counts(ref);
	confirm = data->confirm_switch;
	/* A kill or switch without a confirm keeps the lock: one hold per
	 * switch, not two, on the callback thread's path. */
	if (confirm != noop_confirm) {
		unlock_switch(ref);
		run_confirm(ref, confirm);
		lock_switch(ref);
	}
	/* A dead ref that may never go back needs no per-CPU counter. */
	if ((mode_word(ref) & __PERCPU_REF_DEAD) && !data->allow_reinit) {
		percpuref_counter_free(counter_of(ref));
		set_mode_word(ref, __PERCPU_REF_ATOMIC_DEAD);
	}
	released = __percpu_ref_atomic_sub_and_test(ref, 1);
	if (released)
		impl_of(data)->release_pending_in = process_generation;
	data->confirm_switch = NULL;
	switch_ended(ref);
	unlock_switch(ref);

	/* The data may be gone once the lock is dropped (a waiting exit):
	 * use the release function read before. */
	return released ? release : NULL;
}

static void switch_work_fn(struct percpuref_deferred *work)
{
	struct percpu_ref_impl *impl = caa_container_of(work, struct percpu_ref_impl, switch_work);
	struct percpu_ref *ref = impl->data.ref;
	percpu_ref_func_t *release;

	/* The callback thread fenced the readers before calling us. */
	release = finish_atomic_switch(ref);
	if (release)
		run_release(ref, release);
}

/*
 * First half of a switch to atomic.  Lock held, no switch in flight.
 * Returns true when a switch was started (the caller must fence and finish
 * it, or has it finished asynchronously when @async, and then call
 * percpuref_deferred_wake_owed() after unlocking); false when the ref was
 * atomic already and @confirm must be called by the caller after unlocking.
 * @caller names the call in the fold's warning.
 * A dead ref is always atomic, so only switch_to_atomic and kill start one
 * through switch_mode_locked().
 */
static bool start_atomic_switch(struct percpu_ref *ref, percpu_ref_func_t *confirm, bool async,
				const char *caller)
{
	if (mode_word(ref) & __PERCPU_REF_ATOMIC)
		return false;
	set_mode_word(ref, mode_word(ref) | __PERCPU_REF_ATOMIC);
	ref->data->confirm_switch = confirm ? confirm : noop_confirm;
	impl_of(ref->data)->async_switch = async;
	impl_of(ref->data)->switch_caller = caller;
	/* Held until the switch is confirmed; atomic since the flag is set.
	 * Relaxed: a get, and holding a reference orders nothing; the ref
	 * was per-CPU, so the count still carries the bias and no put can
	 * take it to zero before the fold. */
	__atomic_fetch_add(&ref->data->count, 1, __ATOMIC_RELAXED);
	if (async)
		percpuref_call_after_grace_period(&impl_of(ref->data)->switch_work,
						  switch_work_fn);
	return true;
}

/*
 * The rest of a switch to per-CPU mode, the bias added already.  The
 * per-CPU words are zero: cleared by the fold that made the ref atomic (no
 * switch is in flight), or never written (created atomic, or dead); unless
 * a fence let an add through (internal.h).
 */
static void percpu_again_locked(struct percpu_ref *ref, uintptr_t cpu0)
{
	if (percpuref_unfenced_adds_possible())
		percpuref_counter_clear(cpu0, percpuref_nr_units());
	/* Reopened.  Relaxed: published by the release store below, which
	 * unitless_add()'s acquire load of the mode word pairs with; an add
	 * that lands on it now belongs to the new period, whose fold takes
	 * it (the exchange reads the latest value). */
	__atomic_store_n(&impl_of(ref->data)->unitless_word, 0, __ATOMIC_RELAXED);
	/* Release: a reader that sees ATOMIC clear sees the bias and the zeroed
	 * counters (pairs with the acquire/TSO load of the mode word). */
	__atomic_store_n(&ref->percpu_count_ptr, mode_word(ref) & ~(uintptr_t)__PERCPU_REF_ATOMIC,
			 __ATOMIC_RELEASE);
}

/* Lock held, no switch in flight, ref atomic and not dead. */
static void switch_to_percpu_locked(struct percpu_ref *ref, const char *caller)
{
	uintptr_t cpu0 = counter_of(ref);

	if (!(mode_word(ref) & __PERCPU_REF_ATOMIC))
		return;
	if (!ref->data->allow_reinit || !cpu0) {
		percpuref_warn(caller, "ref %p was created without PERCPU_REF_ALLOW_REINIT; "
			       "stays atomic", (void *)ref);
		return;
	}
	/*
	 * Atomic, not dead, at zero: a put took it there and ran (or runs)
	 * @release.  Per-CPU, a tryget could not fail, and a switch to managed
	 * would take the manager's reference on a released object.  Relaxed:
	 * a caller that holds no reference races that put anyway (misuse);
	 * this catches the call made after it.  The lock's callers other than
	 * the user's switch hold a reference here (manage_locked()'s tryget,
	 * the reclaimer's manager's reference).
	 */
	if (!__atomic_load_n(&ref->data->count, __ATOMIC_RELAXED)) {
		percpuref_warn(caller, "ref %p count is zero (released); stays atomic",
			       (void *)ref);
		return;
	}
	/* Relaxed: published by the release store below. */
	__atomic_fetch_add(&ref->data->count, PERCPU_COUNT_BIAS, __ATOMIC_RELAXED);
	percpu_again_locked(ref, cpu0);
}


/*
 * The kernel's __percpu_ref_switch_mode(): wait for a switch in flight, set
 * force_atomic to @force_atomic, then go where it and DEAD say.  Lock held.
 * Returns the confirm callback the caller must run after unlocking (ref was
 * atomic already), or NULL.  Refused (warned), it changes nothing.
 */
static percpu_ref_func_t *switch_mode_locked(struct percpu_ref *ref, bool force_atomic,
					     percpu_ref_func_t *confirm, const char *caller)
{
	/* Never SWITCH_REF_EXITED: the callers waited under this hold. */
	if (wait_switch_done(ref) != SWITCH_NONE) {
		/*
		 * Inside the ref's own confirm callback: the ref is atomic and
		 * folded already (the switch holds its reference until the
		 * callback returns), so a kill or a switch to atomic is done
		 * now, as the kernel does (test_hardening.c, finding 10); going
		 * per-CPU cannot be.
		 */
		if (finishing_switch_of == ref &&
		    (force_atomic || (mode_word(ref) & __PERCPU_REF_DEAD))) {
			ref->data->force_atomic = force_atomic;
			return confirm ? confirm : noop_confirm;
		}
		percpuref_warn(caller, "ref %p switched from a callback while its switch is in "
			       "flight; ignored", (void *)ref);
		return NULL;
	}
	ref->data->force_atomic = force_atomic;
	if (force_atomic || (mode_word(ref) & __PERCPU_REF_DEAD)) {
		if (!start_atomic_switch(ref, confirm, true, caller))
			return confirm;
	} else {
		switch_to_percpu_locked(ref, caller);
	}
	return NULL;
}

static bool ref_usable(struct percpu_ref *ref, const char *caller)
{
	if (ref && ref->data)
		return true;
	percpuref_warn(caller, "ref %p is not initialised (or already exited)", (void *)ref);
	return false;
}

static bool is_managed(struct percpu_ref *ref)
{
	/* Relaxed: written under the switch lock, which callers hold
	 * (__percpu_ref_release_life() reads it without, with acquire). */
	return __atomic_load_n(&ref->data->managed, __ATOMIC_RELAXED);
}

static void set_managed(struct percpu_ref *ref, bool managed)
{
	/* Release: __percpu_ref_release_life() reads it without the switch
	 * lock, and must then see the resurrections made under that lock
	 * before; every other reader holds the lock. */
	__atomic_store_n(&ref->data->managed, managed, __ATOMIC_RELEASE);
}

/*
 * Takes the switch lock for a mode call or kill, unless @ref is unusable
 * (never initialised, exited) or managed (the reclaimer owns its mode and
 * initial reference then): those warn and return false without the lock.
 * Returns with no switch in flight, except where wait_switch_done() may not
 * wait (a callback), so that the caller's own wait does not drop the lock:
 * the managed test holds only while the lock is held, and a
 * switch_to_managed() that took it during the wait would otherwise be
 * followed by a kill or a mode change on a managed ref.
 */
static bool lock_unmanaged(struct percpu_ref *ref, const char *caller)
{
	if (!ref_usable(ref, caller))
		return false;
	lock_switch(ref);
	/* Tested before the wait too: a managed ref is refused at once, not
	 * after the reclaimer's check of it. */
	if (!is_managed(ref)) {
		if (wait_switch_done(ref) == SWITCH_REF_EXITED) {
			unlock_switch(ref);
			percpuref_warn(caller, "ref %p was exited meanwhile; ignored", (void *)ref);
			return false;
		}
		if (!is_managed(ref))
			return true;
	}
	unlock_switch(ref);
	percpuref_warn(caller, "ref %p is managed (the reclaimer owns its mode); ignored",
		       (void *)ref);
	return false;
}

/* Lock held.  Links the ref's node unless the reclaimer owns it already
 * (listed, or unlinked with its release pending: that release relinks it).
 * True when the reclaimer must be kicked after unlocking. */
static bool list_node(struct percpu_ref *ref)
{
	struct percpu_ref_impl *impl = impl_of(ref->data);

	if (impl->mstate != MNODE_OFF)
		return false;
	impl->mstate = MNODE_LISTED;
	percpuref_managed_push(&impl->mnode);
	return true;
}

PERCPUREF_API void percpu_ref_switch_to_atomic(struct percpu_ref *ref,
					       percpu_ref_func_t *confirm_switch)
{
	percpu_ref_func_t *confirm_now;

	if (!lock_unmanaged(ref, __func__))
		return;
	confirm_now = switch_mode_locked(ref, true, confirm_switch, __func__);
	unlock_switch(ref);
	percpuref_deferred_wake_owed();
	if (confirm_now)
		run_switch_confirm_at_once(ref, confirm_now);
	percpuref_deferred_pace();
}

/* What lock_for_sync_switch() leaves its caller with. */
enum sync_switch_lock_outcome {
	SYNC_SWITCH_READY,	/* switch lock and sync_switch_lock held */
	SYNC_SWITCH_IN_FLIGHT,	/* switch lock held; a callback must not wait
				 * for the switch in flight */
	SYNC_SWITCH_UNUSABLE,	/* no lock: the ref became unusable meanwhile */
};

/*
 * Switch lock held: waits until no switch is in flight and read-locks
 * sync_switch_lock, which ranks before the switch locks, so is only tried
 * here; when a fork waits for it or holds it, steps back (unlocked) until
 * the fork is done, and starts over (@caller: the call that relocks).
 */
static enum sync_switch_lock_outcome lock_for_sync_switch(struct percpu_ref *ref,
							  const char *caller)
{
	for (;;) {
		/* Never SWITCH_REF_EXITED: lock_unmanaged() waited. */
		if (wait_switch_done(ref) != SWITCH_NONE)
			return SYNC_SWITCH_IN_FLIGHT;
		/* Relaxed: the flag only says who goes first; the try-lock
		 * decides who enters, and a stale flag costs the fork one
		 * switch or this switch one step back. */
		if (!__atomic_load_n(&sync_switch_fork_waiting, __ATOMIC_RELAXED) &&
		    !pthread_rwlock_tryrdlock(&sync_switch_lock))
			return SYNC_SWITCH_READY;
		unlock_switch(ref);
		/* Held by the fork until it is done. */
		pthread_mutex_lock(&sync_switch_fork_gate);
		pthread_mutex_unlock(&sync_switch_fork_gate);
		if (!lock_unmanaged(ref, caller))
			return SYNC_SWITCH_UNUSABLE;
	}
}

/*
 * sync_switch_lock held, a switch to atomic started without a confirm
 * (start_atomic_switch(), not @async: no callback runs while that lock is
 * held) and the switch lock dropped since: the rest of it on the calling
 * thread, the fence, the fold and a @release the switch's reference was
 * the last of.  sync_switch_lock released on return.
 */
static void finish_switch_here(struct percpu_ref *ref)
{
	percpu_ref_func_t *release;

	percpuref_fence_readers();
	release = finish_atomic_switch(ref);
	/* Before @release, which may switch another ref synchronously. */
	pthread_rwlock_unlock(&sync_switch_lock);
	if (release)
		run_release(ref, release);
}

PERCPUREF_API void percpu_ref_switch_to_atomic_sync(struct percpu_ref *ref)
{
	if (!lock_unmanaged(ref, __func__))
		return;
	switch (lock_for_sync_switch(ref, __func__)) {
	case SYNC_SWITCH_UNUSABLE:
		return;
	case SYNC_SWITCH_IN_FLIGHT:
		if (finishing_switch_of == ref)
			/* Its own confirm: atomic and folded already, as for
			 * switch_to_atomic there (test_hardening.c, finding 10). */
			ref->data->force_atomic = true;
		else
			percpuref_warn(__func__, "ref %p switched from a callback while its switch "
				       "is in flight; ignored", (void *)ref);
		unlock_switch(ref);
		return;
	case SYNC_SWITCH_READY:
		break;
	}
	ref->data->force_atomic = true;
	if (!start_atomic_switch(ref, NULL, false, __func__)) {
		pthread_rwlock_unlock(&sync_switch_lock);
		unlock_switch(ref);
		return;
	}
	unlock_switch(ref);
	finish_switch_here(ref);
}

/* Lock held: a ref that an exit's kill switches here (kill_here_at_exit()). */
static bool percpu_live_unmanaged(struct percpu_ref *ref)
{
	return !is_managed(ref) &&
	       !(mode_word(ref) & (__PERCPU_REF_ATOMIC | __PERCPU_REF_DEAD));
}

/*
 * A kill on the thread that runs the exit, after our exit handler (a
 * static destructor, an atexit() handler registered before our first use),
 * done here in full: the DEAD flag and the start of the switch to atomic
 * under one hold of the switch lock, then, on this thread, the fence and
 * the fold, @confirm_kill, and the put of the initial reference, so that
 * the confirm and the @release that put may lead to run before it
 * returns.  Queued, they ran on the callback thread after the static
 * objects older than our first use were destroyed (review 171); a wait
 * for the callback thread would wait for every other ref's queued
 * callbacks too, one of which may take a lock this thread holds (review
 * 174); and a switch to atomic apart from the kill let another thread's
 * switch back to per-CPU land between them (review 175).  Only a per-CPU,
 * unmanaged, live ref: false otherwise (the kill itself then warns about
 * the others, and finds an atomic one ready); true when it killed the
 * ref, or refused the call with a warning (exited or made managed
 * meanwhile).
 */
static bool kill_here_at_exit(struct percpu_ref *ref, percpu_ref_func_t *confirm_kill)
{
	if (!ref || !ref->data)
		return false;
	lock_switch(ref);
	if (!percpu_live_unmanaged(ref)) {
		unlock_switch(ref);
		return false;
	}
	switch (lock_for_sync_switch(ref, "percpu_ref_kill_and_confirm")) {
	case SYNC_SWITCH_UNUSABLE:
		return true;
	case SYNC_SWITCH_IN_FLIGHT:
		unlock_switch(ref);
		return false;
	case SYNC_SWITCH_READY:
		break;
	}
	/* Stepped back at the fork gate: anything may have happened. */
	if (!percpu_live_unmanaged(ref)) {
		pthread_rwlock_unlock(&sync_switch_lock);
		unlock_switch(ref);
		return false;
	}
	set_mode_word(ref, mode_word(ref) | __PERCPU_REF_DEAD);
	/* Per-CPU: it starts.  Without the confirm, which would run with
	 * sync_switch_lock read-held: a fork it makes or waits for would
	 * wait for this thread (review 178: the first build of 0.4.33 hung
	 * so).  At once after the switch instead, as a kill of an atomic ref
	 * runs it, before the put. */
	start_atomic_switch(ref, NULL, false, "percpu_ref_kill_and_confirm");
	unlock_switch(ref);
	finish_switch_here(ref);	/* never releases: the initial ref is held */
	confirm_and_put_initial(ref, confirm_kill);
	return true;
}

PERCPUREF_API void percpu_ref_switch_to_percpu(struct percpu_ref *ref)
{
	if (!lock_unmanaged(ref, __func__))
		return;
	switch_mode_locked(ref, false, NULL, __func__);
	unlock_switch(ref);
}

PERCPUREF_API void percpu_ref_kill_and_confirm(struct percpu_ref *ref,
					       percpu_ref_func_t *confirm_kill)
{
	percpu_ref_func_t *confirm_now;

	if (percpuref_exiting_thread() && kill_here_at_exit(ref, confirm_kill))
		return;
	if (!lock_unmanaged(ref, __func__))
		return;
	/* Refused means nothing done: no DEAD, no put (but see
	 * test_hardening.c's finding 10 in switch_mode_locked(): from its own
	 * confirm callback it works).  The wait first: a kill that waited with
	 * us may have killed it. */
	if (wait_switch_done(ref) != SWITCH_NONE && finishing_switch_of != ref) {
		unlock_switch(ref);
		percpuref_warn(__func__, "ref %p killed from a callback while its switch is in "
			       "flight; ignored", (void *)ref);
		return;
	}
	if (mode_word(ref) & __PERCPU_REF_DEAD) {
		/* A teardown of a managed ref that the exit's check overtook:
		 * atomic and dead already, the caller's reference its initial
		 * one (unmanage_held_at_exit()). */
		if (impl_of(ref->data)->exit_unmanaged == EXIT_UNMANAGED_KILL_OWED) {
			impl_of(ref->data)->exit_unmanaged = EXIT_UNMANAGED_NONE;
			unlock_switch(ref);
			confirm_and_put_initial(ref, confirm_kill);
			return;
		}
		unlock_switch(ref);
		percpuref_warn(__func__, "called more than once on ref %p; ignored", (void *)ref);
		return;
	}
	set_mode_word(ref, mode_word(ref) | __PERCPU_REF_DEAD);
	confirm_now = switch_mode_locked(ref, ref->data->force_atomic, confirm_kill, __func__);
	unlock_switch(ref);
	percpuref_deferred_wake_owed();
	confirm_and_put_initial(ref, confirm_now);
	percpuref_deferred_pace();
}

PERCPUREF_API void percpu_ref_resurrect(struct percpu_ref *ref)
{
	bool push;

	if (!ref_usable(ref, __func__))
		return;
	lock_switch(ref);
	/* Refused means nothing changed: still dead, no reference added.
	 * The wait first: a resurrect that waited with us may have done it. */
	switch (wait_switch_done(ref)) {
	case SWITCH_NONE:
		break;
	case SWITCH_MAY_NOT_WAIT:
		unlock_switch(ref);
		percpuref_warn(__func__, "ref %p resurrected from a callback while its switch is "
			       "in flight; ignored", (void *)ref);
		return;
	case SWITCH_REF_EXITED:
		unlock_switch(ref);
		percpuref_warn(__func__, "ref %p was exited meanwhile; ignored", (void *)ref);
		return;
	}
	if (!(mode_word(ref) & __PERCPU_REF_DEAD)) {
		unlock_switch(ref);
		percpuref_warn(__func__, "ref %p is not dead; ignored", (void *)ref);
		return;
	}
	if (!ref->data->allow_reinit) {
		unlock_switch(ref);
		percpuref_warn(__func__, "ref %p was created without PERCPU_REF_ALLOW_REINIT; "
			       "ignored", (void *)ref);
		return;
	}
	set_mode_word(ref, mode_word(ref) & ~(uintptr_t)__PERCPU_REF_DEAD);
	impl_of(ref->data)->exit_unmanaged = EXIT_UNMANAGED_NONE;
	percpuref_note_revival(&impl_of(ref->data)->revivals);
	/* Released by a scan whose @release has yet to run: it never will,
	 * whatever becomes of the ref meanwhile (percpuref_managed_release()). */
	if (impl_of(ref->data)->mstate == MNODE_RELEASING)
		impl_of(ref->data)->release_voided = true;
	/* The caller's new initial reference, and for a managed ref the
	 * manager's own again; relaxed like any get (the count may be zero
	 * here: reinit). */
	__atomic_fetch_add(&ref->data->count, is_managed(ref) ? 2 : 1, __ATOMIC_RELAXED);
	/* Release: after the add, for a put that loads it before its
	 * subtract (__percpu_ref_atomic_put()): one that reads this value
	 * subtracts after the add, so its zero is of the new life. */
	__atomic_store_n(&ref->data->lives, ref->data->lives + 1, __ATOMIC_RELEASE);
	switch_mode_locked(ref, ref->data->force_atomic, NULL, __func__);
	push = is_managed(ref) && list_node(ref);
	unlock_switch(ref);
	if (push)
		percpuref_managed_kick();
}

PERCPUREF_API void percpu_ref_reinit(struct percpu_ref *ref)
{
	if (!ref_usable(ref, __func__))
		return;
	if (!percpu_ref_is_zero(ref)) {
		percpuref_warn(__func__, "ref %p count is not zero; ignored", (void *)ref);
		return;
	}
	percpu_ref_resurrect(ref);
}

/*
 * Managed mode.  The manager's reference is the initial one; the reclaimer
 * (managed.c) checks a listed ref with percpuref_managed_begin(), a reader
 * fence and percpuref_managed_finish(), all under this file's switch lock
 * except the fence; see the design comment at the top.
 */

/*
 * Lock held, no switch in flight, ref live with allow_reinit and not
 * managed.  Takes the manager's reference (false, nothing changed, when the
 * count is zero: nobody holds a reference to hand over), forces per-CPU
 * mode and links the node; *@push says whether to kick the reclaimer after
 * unlocking.
 */
static bool manage_locked(struct percpu_ref *ref, bool *push)
{
	/* Per-CPU: a per-CPU add, which cannot fail; atomic: add unless zero. */
	if (!percpu_ref_tryget(ref))
		return false;
	ref->data->force_atomic = false;
	switch_to_percpu_locked(ref, "percpu_ref_switch_to_managed");
	set_managed(ref, true);
	*push = list_node(ref);
	return true;
}

/* PERCPU_REF_REL_MANAGED at init: the ref cannot be shared yet. */
static void init_managed(struct percpu_ref *ref)
{
	bool push = false;

	lock_switch(ref);
	if (mode_word(ref) & __PERCPU_REF_DEAD) {
		/* Managed from its first reinit on, per-CPU then. */
		ref->data->force_atomic = false;
		set_managed(ref, true);
	} else {
		manage_locked(ref, &push);	/* count 1: cannot fail */
	}
	unlock_switch(ref);
	if (push)
		percpuref_managed_kick();
}

PERCPUREF_API int percpu_ref_switch_to_managed(struct percpu_ref *ref)
{
	const char *why = NULL;
	enum switch_wait wait;
	bool push = false;
	int ret = -EINVAL;

	if (!ref_usable(ref, __func__))
		return -EINVAL;
	lock_switch(ref);
	wait = wait_switch_done(ref);
	if (wait == SWITCH_MAY_NOT_WAIT)
		why = "called from a callback while the ref's switch is in flight";
	else if (wait == SWITCH_REF_EXITED)
		why = "ref was exited meanwhile";
	else if ((is_managed(ref) && !(mode_word(ref) & __PERCPU_REF_DEAD)) ||
		 /* Converted by the exit's check: managed to its holders. */
		 impl_of(ref->data)->exit_unmanaged == EXIT_UNMANAGED_UNMANAGE_OWED)
		why = "already managed", ret = -EALREADY;
	else if (impl_of(ref->data)->exit_unmanaged == EXIT_UNMANAGED_KILL_OWED) {
		/* Managed again after the unmanage that the exit's check
		 * answered quietly: the manager's reference is the one that
		 * check dropped already, so the ref stays as the check left
		 * it, and its holders' last put releases it (the next
		 * unmanage answers quietly again; review 177).  Per-CPU after
		 * a reinit, as manage_locked() leaves a ref (review 178). */
		impl_of(ref->data)->exit_unmanaged = EXIT_UNMANAGED_UNMANAGE_OWED;
		ref->data->force_atomic = false;
		ret = 0;
	} else if (mode_word(ref) & __PERCPU_REF_DEAD)
		why = "ref is dead (killed or released); reinit it first";
	else if (!ref->data->allow_reinit)
		why = "ref was created without PERCPU_REF_ALLOW_REINIT";
	else if (!manage_locked(ref, &push))
		why = "count is zero: no reference to hand over";
	else
		ret = 0;
	unlock_switch(ref);
	if (why)
		percpuref_warn(__func__, "ref %p: %s; ignored", (void *)ref, why);
	if (push)
		percpuref_managed_kick();
	return ret;
}

PERCPUREF_API int percpu_ref_switch_to_unmanaged(struct percpu_ref *ref)
{
	const char *why = NULL;

	if (!ref_usable(ref, __func__))
		return -EINVAL;
	lock_switch(ref);
	/* A check in flight ends with the ref per-CPU or released. */
	if (wait_switch_done(ref) == SWITCH_REF_EXITED) {
		why = "ref was exited meanwhile";
	} else if (impl_of(ref->data)->exit_unmanaged == EXIT_UNMANAGED_UNMANAGE_OWED) {
		/* The exit's check did it, and dropped the manager's
		 * reference (unmanage_held_at_exit()). */
		impl_of(ref->data)->exit_unmanaged = EXIT_UNMANAGED_KILL_OWED;
		unlock_switch(ref);
		return 0;
	} else if (!is_managed(ref)) {
		why = "ref is not managed";
	} else if (mode_word(ref) & __PERCPU_REF_DEAD) {
		why = "ref was released by the reclaimer";
	} else {
		set_managed(ref, false);
		/* Off its stage, or the reclaimer unlinks the node. */
		unstage_node(impl_of(ref->data));
	}
	unlock_switch(ref);
	if (why) {
		percpuref_warn(__func__, "ref %p: %s; ignored", (void *)ref, why);
		return -EINVAL;
	}
	/* The manager's reference.  Per-CPU (no check in flight, and no mode
	 * call accepts a managed ref), so this put cannot release: the
	 * caller's reference keeps the ref alive. */
	percpu_ref_put(ref);
	return 0;
}

/* A user put dropped the manager's reference of managed @ref: warn, and
 * pin the count so the ref is leaked, never released. */
static void pin_dropped_manager_ref(struct percpu_ref *ref)
{
	percpuref_warn("percpu_ref_put", "ref %p is managed: a put dropped the manager's "
		       "reference; leaked", (void *)ref);
	pin_count(ref);
}

static struct percpu_ref_impl *impl_of_node(struct percpuref_mnode *node)
{
	return caa_container_of(node, struct percpu_ref_impl, mnode);
}

static bool filter_sees_use;	/* test hook */

PERCPUREF_API void percpuref_test_filter_sees_use(bool on)
{
	/* Relaxed: a test's setting; the scanner reads nothing on the
	 * strength of it. */
	__atomic_store_n(&filter_sees_use, on, __ATOMIC_RELAXED);
}

/*
 * The filter: the references held on @ref, into *@held, from two collects
 * of its per-CPU words (monotonic, percpu_ref.h) and of the atomic count;
 * false when the collects differ (the ref is in use).  Equal collects mean
 * nothing changed in between, so the second is one consistent snapshot
 * (every word held its value from the end of the first collect to the
 * start of the second; tests/model/filter.pml).  Reads only: the ref stays
 * per-CPU.  A wrong "manager only" costs a check (the exact one follows); a
 * truly idle ref reads equal twice, so it is never kept out.
 */
static bool snapshot_held(struct percpu_ref *ref, unsigned long *held)
{
	uintptr_t cpu0 = counter_of(ref);
	unsigned int nr_units = percpuref_nr_units();
	unsigned long *unitless = &impl_of(ref->data)->unitless_word;
	unsigned long count1, count2, sum1, sum2, unitless1, unitless2;

	/* Relaxed: a test's setting, read by the scanner alone. */
	if (__atomic_load_n(&filter_sees_use, __ATOMIC_RELAXED))
		return false;

	/* Acquire loads throughout: the second collect is read after the
	 * first (the double-collect argument).  The unit-less word is one
	 * more per-CPU word, moving forward with every add. */
	count1 = __atomic_load_n(&ref->data->count, __ATOMIC_ACQUIRE);
	unitless1 = __atomic_load_n(unitless, __ATOMIC_ACQUIRE);
	sum1 = percpuref_counter_sum(cpu0, nr_units);
	sum2 = percpuref_counter_sum(cpu0, nr_units);
	unitless2 = __atomic_load_n(unitless, __ATOMIC_ACQUIRE);
	count2 = __atomic_load_n(&ref->data->count, __ATOMIC_ACQUIRE);
	*held = count2 - PERCPU_COUNT_BIAS + percpuref_counter_net(sum2 + unitless2);
	return sum1 == sum2 && unitless1 == unitless2 && count1 == count2;
}

PERCPUREF_API unsigned long percpuref_test_percpu_net(struct percpu_ref *ref)
{
	/* Relaxed: the test ordered the adds before the call. */
	return percpuref_counter_net(percpuref_counter_sum(counter_of(ref), percpuref_nr_units()) +
				     __atomic_load_n(&impl_of(ref->data)->unitless_word,
						     __ATOMIC_RELAXED));
}

enum percpuref_managed_verdict percpuref_managed_begin(struct percpuref_mnode *node, bool filter,
						      unsigned long *others)
{
	struct percpu_ref_impl *impl = impl_of_node(node);
	struct percpu_ref *ref = impl->data.ref;
	unsigned long held;

	if (impl->exited)
		return MANAGED_FREE;
	/* Pinned and leaked: checking it again would only warn again. */
	if (impl->pinned) {
		impl->mstate = MNODE_OFF;
		return MANAGED_UNLINK;
	}
	/*
	 * A managed ref is per-CPU and has no switch in flight here: the
	 * switch to managed waited for any, and every call that could start
	 * one refuses a managed ref.  An unmanaged one leaves the list.
	 */
	if (!is_managed(ref)) {
		impl->mstate = MNODE_OFF;
		return MANAGED_UNLINK;
	}
	/* Skipped: in use, or held besides the manager.  A count at or
	 * below the manager's alone (a put too many) goes on to the exact
	 * check, which reports and pins it. */
	if (filter) {
		if (!snapshot_held(ref, &held)) {
			*others = ULONG_MAX;
			return MANAGED_SKIP;
		}
		if (held > 1 && held < PERCPU_REF_UNDERFLOW_ZONE) {
			*others = held - 1;
			return MANAGED_SKIP;
		}
	}
	start_atomic_switch(ref, noop_confirm, false, "percpuref_reclaimer");
	return MANAGED_CHECK;
}

void (*percpuref_test_finish_window)(struct percpu_ref *ref);

/*
 * The exit's check found @ref held besides the manager (its compare-and-
 * swap failed): atomic, the switch's reference and the manager's in the
 * count.  Rather than per-CPU and managed again, where its last holder's
 * put would leave it for a pass that comes after the static destructors
 * (the library's last exit hook), it becomes what a kill makes of an
 * unmanaged ref: no longer managed, DEAD, the manager's reference its
 * initial one, dropped with the switch's.  Its last holder's put then
 * releases it on that holder's thread, inside the static destructor that
 * lets go of it (its @release may reinit it: unmanaged, live until a
 * kill).  A teardown written for a managed ref, switch_to_unmanaged() then
 * kill, still drops the caller's reference: the first returns 0 quietly,
 * the second puts it (review 174); switch_to_managed() after the first
 * answers 0 too, and leaves the ref so (review 177).  True when that is done; *@released when
 * the holders let go meanwhile and this drop reached zero.  False, nothing
 * done, for a count a put too many left at 1 or below (the caller pins
 * it).  Lock held.
 */
static bool unmanage_held_at_exit(struct percpu_ref *ref, bool *released)
{
	/* Relaxed: only chooses the pin, as in percpuref_managed_finish(). */
	unsigned long count = __atomic_load_n(&ref->data->count, __ATOMIC_RELAXED);

	if (count < 2 || count >= PERCPU_REF_UNDERFLOW_ZONE)
		return false;
	/* Before the drop: a put that reaches zero after it reads the ref
	 * unmanaged (its acquire of @managed, through the count's
	 * read-modify-writes from this release) and releases it; and its
	 * @release finds it dead, as every released ref is
	 * (tests/model/exitconv.pml: MUTANT_SUB_FIRST, MUTANT_DEAD_AFTER). */
	set_managed(ref, false);
	set_mode_word(ref, mode_word(ref) | __PERCPU_REF_DEAD);
	/* Acq_rel: release for the put above; acquire when it reaches zero,
	 * pairing with the holders' puts as the compare-and-swap does. */
	count = __atomic_sub_fetch(&ref->data->count, 2, __ATOMIC_ACQ_REL);
	*released = count == 0;
	/* Released here: no teardown is owed.  After the drop is soon enough:
	 * a holder's @release that unmanages or reinits the ref takes this
	 * lock first. */
	if (!*released)
		impl_of(ref->data)->exit_unmanaged = EXIT_UNMANAGED_UNMANAGE_OWED;
	/* Below zero: a put too many came since the load. */
	if (count >= PERCPU_REF_UNDERFLOW_ZONE) {
		pin_dropped_manager_ref(ref);
		impl_of(ref->data)->pinned = true;
	}
	return true;
}

bool percpuref_managed_finish(struct percpuref_mnode *node, unsigned long *others, bool at_exit)
{
	struct percpu_ref_impl *impl = impl_of_node(node);
	struct percpu_ref *ref = impl->data.ref;
	unsigned long last = 2;	/* the manager's and the switch's */
	void (*finish_window)(struct percpu_ref *ref);
	unsigned long count;
	bool released;

	fold_percpu_counts(ref);
	/*
	 * Only the switch's reference left: a user put the manager's.  Warn
	 * once, leave the ref atomic and pinned, and stop checking it (the
	 * next pass unlinks it): a ref pinned below zero by a put or by the
	 * fold likewise.
	 *
	 * Relaxed: this thread's fold just wrote it (lock held), and the
	 * value only chooses the pin, which frees nothing, or the holders
	 * counted in a warning; whether the ref is released is the acquire
	 * compare-and-swap's to say, which reads the count again.
	 */
	count = __atomic_load_n(&ref->data->count, __ATOMIC_RELAXED);
	if (count == 1 || count >= PERCPU_REF_UNDERFLOW_ZONE) {
		if (count == 1)
			pin_dropped_manager_ref(ref);
		impl->pinned = true;
		/* No number of holders: warned as misuse already. */
		*others = ULONG_MAX;
		ref->data->confirm_switch = NULL;
		switch_ended(ref);
		return false;
	}
	*others = count - last;
	/* Acquire: pairs with the test's release store of the hook, so
	 * the hook finds what the test set up for it. */
	finish_window = __atomic_load_n(&percpuref_test_finish_window, __ATOMIC_ACQUIRE);
	if (finish_window)
		finish_window(ref);
	/*
	 * Drop both references only if no other is left.  Acquire on success:
	 * pairs with the acq_rel decrement of every user put made in atomic
	 * mode (those made per-CPU are ordered by the reader fence), so the
	 * users' accesses happen before @release.  Relaxed on failure: the ref
	 * survives and nothing is read under it.
	 */
	released = __atomic_compare_exchange_n(&ref->data->count, &last, 0, false,
					       __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
	if (released) {
		set_mode_word(ref, mode_word(ref) | __PERCPU_REF_DEAD);
		impl->mstate = MNODE_RELEASING;
	} else if (at_exit && unmanage_held_at_exit(ref, &released)) {
		/* No held warning: nobody is waiting for the reclaimer now. */
		*others = ULONG_MAX;
		if (released)
			impl->mstate = MNODE_RELEASING;
	} else {
		/*
		 * The switch's reference; the manager's keeps it above zero,
		 * unless puts since the read above dropped that one too (a
		 * put too many): then the count reads 1 (the switch's alone),
		 * zero or below it, and the ref is pinned as above.  Taken
		 * per-CPU at zero it read as released (switch_to_percpu_locked()
		 * refuses it since 0.4.31, which left a managed ref atomic at
		 * zero, and the next pass's fold took it below zero; review
		 * 169).  Relaxed: the value only chooses the pin.
		 */
		count = __atomic_load_n(&ref->data->count, __ATOMIC_RELAXED);
		/*
		 * The switch's reference and the bias back in one
		 * compare-and-swap, from a count the manager's reference
		 * still keeps above zero: 0.4.31's subtract and then
		 * switch_to_percpu_locked()'s add left a window in which a
		 * put too many took the atomic count to zero and pinned it,
		 * and the add then made that pin a biased count (per-CPU,
		 * never pinned again), or the switch, reading zero, left the
		 * ref atomic and unmarked for the next pass's fold to
		 * unbias (tests/model/toomany.pml, CODE_0_4_31).  Relaxed:
		 * the release store of the mode word publishes the bias.
		 */
		while (count > 1 && count < PERCPU_REF_UNDERFLOW_ZONE &&
		       !__atomic_compare_exchange_n(&ref->data->count, &count,
						    count - 1 + PERCPU_COUNT_BIAS, true,
						    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
			;
		if (count <= 1 || count >= PERCPU_REF_UNDERFLOW_ZONE) {
			/* 1: the switch's alone.  0 or below: the put that
			 * went there warned (or is about to). */
			if (count == 1)
				pin_dropped_manager_ref(ref);
			else
				pin_count(ref);
			impl->pinned = true;
			*others = ULONG_MAX;
		} else {
			percpu_again_locked(ref, counter_of(ref));
		}
	}
	ref->data->confirm_switch = NULL;
	switch_ended(ref);
	return released;
}

struct percpuref_switch_stripe *percpuref_managed_lock_node(struct percpuref_mnode *node)
{
	struct percpuref_switch_stripe *stripe = stripe_of(impl_of_node(node)->data.ref);

	lock_stripe(stripe);
	return stripe;
}

void percpuref_managed_unlock_node(struct percpuref_switch_stripe *stripe)
{
	unlock_stripe(stripe);
}

struct percpu_ref *percpuref_managed_ref(struct percpuref_mnode *node)
{
	return impl_of_node(node)->data.ref;
}

void percpuref_managed_free(struct percpuref_mnode *node, struct percpuref_spares *spares)
{
	(void)drop_exit_hold(impl_of_node(node), IMPL_RECLAIMER_HOLDS,
			     percpuref_spares_off() ? NULL : spares);
}

bool percpuref_managed_node_exited(struct percpuref_mnode *node)
{
	/* Acquire: pairs with the exit's mark (percpuref_ref_exit()), after
	 * which the exit reads and writes nothing of the impl: a listed
	 * node's impl is the reclaimer's alone from then on. */
	return __atomic_load_n(&impl_of_node(node)->owed_and_holds, __ATOMIC_ACQUIRE) &
	       IMPL_EXITED;
}

void percpuref_managed_release(struct percpuref_mnode *node)
{
	struct percpu_ref_impl *impl = impl_of_node(node);
	/* The ref's address only, never dereferenced: it may be exited. */
	struct percpu_ref *ref = impl->data.ref;
	bool run;

	/*
	 * The impl is ours until mstate leaves RELEASING: an exit meanwhile
	 * only marks it (percpu_ref_exit()).  An exit before the call (the
	 * release callback of another ref of the batch) means the object may be
	 * gone: its @release never runs then (test_hardening.c, finding 6).
	 * Nor after a reinit or resurrect since the scan released it (the ref
	 * read zero, and whoever reinits waits for that): the ref lives again,
	 * and its next zero, managed or not, has a release of its own; this one
	 * would free it under its new holders.  Only one that begins while the
	 * callback runs can race it, as with any percpu_ref.
	 */
	lock_switch(ref);
	run = !impl->exited && !impl->release_voided;
	unlock_switch(ref);
	if (run && impl->data.release)
		run_release(impl->data.ref, impl->data.release);
	percpuref_managed_release_done(node);
}

void percpuref_managed_release_done(struct percpuref_mnode *node)
{
	struct percpu_ref_impl *impl = impl_of_node(node);
	struct percpu_ref *ref = impl->data.ref;	/* likewise */
	bool push = false;

	lock_switch(ref);
	if (impl->exited) {
		unlock_switch(ref);
		(void)drop_exit_hold(impl, IMPL_RECLAIMER_HOLDS, NULL);
		return;
	}
	impl->release_voided = false;
	impl->mstate = MNODE_OFF;
	/* Reinit from the release callback (or racing it): back on the list. */
	if (is_managed(impl->data.ref) && !(mode_word(impl->data.ref) & __PERCPU_REF_DEAD))
		push = list_node(impl->data.ref);
	unlock_switch(ref);
	if (push)
		percpuref_managed_kick();
}

PERCPUREF_API bool percpu_ref_is_zero(struct percpu_ref *ref)
{
	unsigned long count;

	if (!(mode_word(ref) & __PERCPU_REF_ATOMIC_DEAD))
		return false;
	/* The lock keeps data from being freed under us.  Acquire: pairs
	 * with the acq_rel decrement that took the count to zero, so a
	 * caller that reads zero sees what every holder did before its put,
	 * as @release does (the kernel reads it relaxed; free here). */
	lock_switch(ref);
	if (ref->data)
		count = __atomic_load_n(&ref->data->count, __ATOMIC_ACQUIRE);
	else
		count = mode_word(ref) >> __PERCPU_REF_FLAG_BITS;
	unlock_switch(ref);
	return count == 0;
}

PERCPUREF_API int percpu_ref_barrier(void)
{
	int ret = percpuref_wait_deferred();

	if (ret == -EDEADLK)
		percpuref_warn(__func__, "called from a callback; would wait for itself");
	return ret;
}

/*
 * Slow halves of the fast paths, for calls the inline rseq sequence could
 * not make.  In a process that uses own rseq areas a thread's first call
 * registers its area and retries the sequence; in a process without rseq
 * the fallback reader adds to the thread's own unit (fallback.h).  Either
 * way a thread that still has no unit adds to the ref's unit-less word
 * (unitless_add()), or, while the ref is atomic, to the atomic count.
 * Release callbacks run after the read-side section has ended.
 */
static __attribute__((noinline)) enum percpuref_this_cpu_result
own_rseq_percpu_add(struct percpu_ref *ref, unsigned long delta)
{
	if (!percpuref_rseq_register_self())
		return PERCPUREF_THIS_CPU_NO_RSEQ;
	return percpuref_this_cpu_add_after_setup(&ref->percpu_count_ptr, delta);
}

/*
 * The @releases that signal handlers of this thread reached while it was
 * inside a read-side section of its own (see the top of the file), newest
 * first, linked through handler_next.  A handler pushes with a CAS, the
 * interrupted get or put takes the whole list with an exchange: each one
 * instruction, which no handler of this thread can split, so a handler
 * that runs in between finds the word as it was or as it will be.
 * Relaxed: only this thread reads and writes it.  Initial-exec, as the
 * reader's own state: read on every fallback get and put.
 */
static __thread struct percpu_ref_impl *handler_releases __attribute__((tls_model("initial-exec")));

static void run_exiting_handler_releases(void);

/*
 * In a signal handler, inside a section of this thread: leave @ref's
 * @release to the interrupted get or put (fallback_percpu_add()).  A ref
 * whose earlier release still waits on some thread's list (reinit, then
 * zero again, before that thread's section ended) is counted there, not
 * linked twice: its thread runs both, one per zero, as the kernel does.
 */
static void defer_handler_release(struct percpu_ref *ref)
{
	struct percpu_ref_impl *impl = impl_of(ref->data);
	struct percpu_ref_impl *top;

	/* Acquire-release: acquire against the decrement that took the
	 * count to zero, so that its thread's read of handler_next precedes
	 * our write below; release for the reinit and kill the count orders
	 * after, which that thread's decrement acquires. */
	if (__atomic_fetch_add(&impl->owed_and_holds, 1, __ATOMIC_ACQ_REL))
		return;
	/* Before the push: an exit after it runs what this thread owes. */
	percpuref_readers_set_exit_work(run_exiting_handler_releases);
	/* Relaxed, the load and the compare-and-swap: this thread's own
	 * list; the get or put this handler interrupted reads it only after
	 * the handler returned, on the same thread, handler_next included. */
	top = __atomic_load_n(&handler_releases, __ATOMIC_RELAXED);
	do
		impl->handler_next = top;
	while (!__atomic_compare_exchange_n(&handler_releases, &top, impl, true, __ATOMIC_RELAXED,
					    __ATOMIC_RELAXED));
}

/*
 * The deferred releases that run_handler_releases() took from
 * handler_releases and has not yet run, oldest first.  Each is counted
 * off before its @release runs, and unlinked with its last one, so one
 * that leaves by pthread_exit() or a longjmp leaves the rest here, for the
 * thread's exit or the next run, never lost, never run twice.  Only this
 * thread, outside every signal handler's push, touches it: a plain
 * thread-local.
 */
static __thread struct percpu_ref_impl *handler_releases_to_run;

/*
 * One of the releases @impl, first on handler_releases_to_run, is owed.
 * Everything it needs is read before the count falls: at zero another
 * thread's handler may link the impl to its own list, or, exited, it is
 * ours to free.  An exit that came before the count fell means the ref's
 * object may be gone: this release never runs, as a managed ref's
 * (percpuref_managed_release()).  One after it finds the release running
 * or run, as an exit racing any release.
 */
static void run_one_handler_release(struct percpu_ref_impl *impl)
{
	struct percpu_ref_impl *next = impl->handler_next;
	struct percpu_ref *ref = impl->data.ref;
	percpu_ref_func_t *release = impl->data.release;
	/* Acquire-release (in drop_exit_hold()): against
	 * defer_handler_release()'s increment and the exit's mark (see
	 * both).  Exited, the last one owed frees the impl there. */
	unsigned int left = drop_exit_hold(impl, 1, NULL);

	if (!(left & IMPL_OWED_MASK))
		handler_releases_to_run = next;
	if (!(left & IMPL_EXITED))
		run_release(ref, release);
}

/*
 * Outside every section: the deferred releases, oldest first, with every
 * signal blocked but the synchronous ones (a blocked one that the
 * release's own instruction raises kills the process instead of running
 * the program's handler: internal.h), as the handler ran with its own
 * signal blocked at least: a handler of the next signal would otherwise
 * interrupt the release's own calls (a switch halfway, its lock held),
 * which only a get or put may be (docs/percpu_ref.md, "Signal handlers"),
 * and a release that switched a ref the next handler's release switches
 * too waited for its own thread.  A release may exit and free its ref:
 * the next is read before it runs.
 */
static __attribute__((noinline)) void run_handler_releases(void)
{
	struct percpu_ref_impl *list, *taken = NULL, **tail, *impl;
	sigset_t all, old;

	percpuref_sigfill_async(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	/* Relaxed: this thread's own list; a handler's push lands wholly
	 * before or after this one instruction, and we read what it wrote
	 * after it returned, on the same thread. */
	list = __atomic_exchange_n(&handler_releases, NULL, __ATOMIC_RELAXED);
	while ((impl = list)) {
		list = impl->handler_next;
		impl->handler_next = taken;
		taken = impl;
	}
	/* Behind those that an earlier run left: they are older. */
	for (tail = &handler_releases_to_run; *tail; tail = &(*tail)->handler_next)
		;
	*tail = taken;
	while ((impl = handler_releases_to_run))
		run_one_handler_release(impl);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/*
 * The thread exits (fallback.c runs it, as the exit work that
 * defer_handler_release() set, after reader_exit() gave the unit back)
 * with releases its handlers left: a handler that interrupted a get or put
 * left by pthread_exit() (or a thread_local destructor's put on the way
 * out), and the interrupted call, which was to run them, never returns; or
 * a deferred release that left by pthread_exit() before the next one ran.
 * Run here, or never: the ref stayed at zero, unreleased.
 */
static void run_exiting_handler_releases(void)
{
	/* Relaxed: this thread's own list, which only it and its handlers
	 * touch. */
	if (__atomic_load_n(&handler_releases, __ATOMIC_RELAXED) || handler_releases_to_run)
		run_handler_releases();
}

/* Inlined, with the rseq half out of line, so that the fallback reader
 * runs without a call or a saved register.  DONE, FLAGGED (atomic mode:
 * nothing added) or NO_RSEQ (this thread has no unit: nothing added). */
static inline __attribute__((always_inline)) enum percpuref_this_cpu_result
fallback_percpu_add(struct percpu_ref *ref, unsigned long delta)
{
	enum percpuref_this_cpu_result r;

	/* Relaxed, as percpuref_this_rseq_area() reads it: set up before
	 * the ref's init, which reached this thread with the ref; a
	 * switch-off's 0 orders nothing here (the sections that miss it are
	 * given time: runtime.c). */
	if (percpuref_likely(!__atomic_load_n(&percpuref_rseq_offset, __ATOMIC_RELAXED))) {
		r = percpuref_reader_add(&ref->percpu_count_ptr, delta);
		/* A handler interrupted our section and reached a release:
		 * ours to run now that the section has ended, unless it was
		 * a section nested in the interrupted one.  The load below
		 * stays after the section's closing store, which a relaxed
		 * load may otherwise pass: a release deferred in between
		 * would wait for the thread's next get or put.  Against this
		 * thread's handlers only: a compiler barrier, no instruction. */
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		if (percpuref_unlikely(__atomic_load_n(&handler_releases, __ATOMIC_RELAXED)) &&
		    !percpuref_reader_interrupted())
			run_handler_releases();
	} else {
		r = own_rseq_percpu_add(ref, delta);
	}
	/* For TSAN, as in percpu_ref_put_many(), now covering this
	 * function's own accesses to the ref and its counter. */
	if (r == PERCPUREF_THIS_CPU_DONE)
		percpuref_tsan_release(&ref->data);
	return r;
}

/* Whether an inline sequence may have run before the runtime's set-up,
 * writing through a params word of 0 (warn_no_data()). */
static bool sequence_ran_before_setup(void)
{
#if PERCPUREF_HAVE_RSEQ && defined(__x86_64__)
	/* Relaxed: a ref the library wrote reached this thread ordered after
	 * the set-up, as this_cpu.h requires of every caller. */
	return !__atomic_load_n(&percpuref_this_cpu_params, __ATOMIC_RELAXED);
#else
	return false;	/* no such sequence; params stays 0 without rseq */
#endif
}

/*
 * A ref without data (exited, or its init failed) has a dead mode word,
 * atomic too but after an exit under readers (EXITED_UNDER_READERS), so
 * its gets and puts come here: warned and ignored, as every other call on
 * it, instead of a load through the null data pointer.  A ref never
 * passed to percpu_ref_init() is undefined, as in the kernel; zeroed
 * memory, the likely case, has mode word 0, which the sequence takes for
 * per-CPU mode and which faults once the runtime is set up.  On x86-64
 * before set-up (params 0), whatever the mode word, the sequence comes
 * here having written the rseq_cs field at the thread pointer's offset 0
 * (percpuref_this_cpu_add_after_setup()), and the ref is not one the
 * library wrote (percpu_ref_init() sets the runtime up first): stop the
 * process with a message rather than go on with the thread's TLS damaged.
 */
static void warn_no_data(struct percpu_ref *ref, const char *fn)
{
	if (!mode_word(ref) || sequence_ran_before_setup()) {
		percpuref_warn(fn, "ref %p was never initialised (zeroed memory, or an object "
			       "percpu_ref_init() never saw?); aborting", (void *)ref);
		abort();
	}
	percpuref_warn(fn, "ref %p exited, or its init failed, or was never initialised; ignored",
		       (void *)ref);
}

static bool has_no_data(struct percpu_ref *ref, const char *fn)
{
	if (percpuref_likely(ref->data))
		return false;
	warn_no_data(ref, fn);
	return true;
}

/*
 * A tryget's data, loaded once: an exit under RCU readers clears the
 * pointer while they may still read the count it pointed to, which stays
 * valid until their sections end (percpuref_ref_exit()).  NULL without a
 * word for such an exit, warned as by has_no_data() otherwise.  Acquire:
 * pairs with the exit's release store, so that a tryget that reads no data
 * reads the exit's mode word.
 */
static struct percpu_ref_data *tryget_data(struct percpu_ref *ref)
{
	struct percpu_ref_data *data = __atomic_load_n(&ref->data, __ATOMIC_ACQUIRE);

	if (percpuref_unlikely(!data) && !exited_under_readers(ref))
		warn_no_data(ref, "percpu_ref_tryget");
	return data;
}

static unsigned int unitless_yield_every, unitless_adds;	/* test hook */

PERCPUREF_API void percpuref_test_unitless_yield(unsigned int every)
{
	/* Relaxed: a test's setting; it only paces the adds with yields. */
	__atomic_store_n(&unitless_yield_every, every, __ATOMIC_RELAXED);
}

/*
 * A caller without a unit (more threads than fallback units, a CPU past
 * the units counted, a call after its thread's exit hook): adds @delta to
 * the ref's unit-less word, as to one more per-CPU word, while the ref is
 * per-CPU and the fold has not closed the word; false otherwise (the
 * caller uses the atomic count).  On the atomic count instead, a
 * reference taken on a per-CPU word and dropped here (or the other way)
 * moved the words' share, read modulo 2^31 at the fold, by one for good:
 * 2^30 of them in one per-CPU period read the count 2^31 off
 * (docs/percpu_ref.md, "Counts"; tests/model/unitless.pml).  A flagged
 * mode word (atomic, or dead: a kill sets DEAD before its switch sets
 * ATOMIC) goes to the count before the fold closes the word, since callers
 * with a unit do: with the word open, crossings between the two for as
 * long as the kill or the switch's fence lasts would move its share.  The
 * CAS lands before the fold's exchange (counted there) or finds the word
 * closed; if the next per-CPU period reopened it at the value read (0),
 * the add lands in that period, and counts there.  Acquire mode load:
 * pairs with switch_to_percpu_locked()'s release store, so a caller that
 * reads per-CPU mode reads the reopened word, not the closed one (no
 * crossing onto the count on a weakly ordered CPU); an add that read
 * per-CPU mode and lands after a flag is one crossing, at most one a
 * thread each period.  Release CAS: a put's accesses before the fold's
 * acquire exchange (ThreadSanitizer sees that through the put's
 * annotation on &ref->data as well, so only review guards this order).
 */
static bool unitless_add(struct percpu_ref *ref, struct percpu_ref_data *data, unsigned long delta)
{
	unsigned long *word = &impl_of(data)->unitless_word;
	unsigned long old;
	/* Relaxed: a test's setting and a count of its own. */
	unsigned int every = __atomic_load_n(&unitless_yield_every, __ATOMIC_RELAXED);

	if (__atomic_load_n(&ref->percpu_count_ptr, __ATOMIC_ACQUIRE) & PERCPUREF_MODE_FLAGS)
		return false;
	if (percpuref_unlikely(every) &&
	    __atomic_add_fetch(&unitless_adds, 1, __ATOMIC_RELAXED) % every == 0)
		sched_yield();
	old = __atomic_load_n(word, __ATOMIC_RELAXED);
	do {
		if (old & UNITLESS_FOLDED)
			return false;
	} while (!__atomic_compare_exchange_n(word, &old, (old + delta) & ~UNITLESS_FOLDED, true,
					      __ATOMIC_RELEASE, __ATOMIC_RELAXED));
	return true;
}

/* A slow-path add: true if it landed on a per-CPU word or the unit-less
 * one, or if the ref has no data (warned); false if the caller must use
 * the atomic count. */
static bool slow_percpu_add(struct percpu_ref *ref, unsigned long delta, const char *fn)
{
	enum percpuref_this_cpu_result r = fallback_percpu_add(ref, delta);

	if (r == PERCPUREF_THIS_CPU_DONE || has_no_data(ref, fn))
		return true;
	return r == PERCPUREF_THIS_CPU_NO_RSEQ && unitless_add(ref, ref->data, delta);
}

PERCPUREF_API void __percpu_ref_get_slow(struct percpu_ref *ref, unsigned long nr)
{
	if (!slow_percpu_add(ref, nr, "percpu_ref_get"))
		__percpu_ref_atomic_add(ref, nr);
}

PERCPUREF_API bool __percpu_ref_tryget_slow(struct percpu_ref *ref, unsigned long nr, bool live)
{
	enum percpuref_this_cpu_result r = fallback_percpu_add(ref, nr);
	struct percpu_ref_data *data;

	if (r == PERCPUREF_THIS_CPU_DONE)
		return true;
	if (live && (mode_word(ref) & __PERCPU_REF_DEAD)) {
		/* Refused, but not before set-up: a ref the library never
		 * wrote, and rseq_cs written at %fs:8 (warn_no_data()). */
		if (sequence_ran_before_setup())
			warn_no_data(ref, "percpu_ref_tryget_live");
		return false;
	}
	data = tryget_data(ref);
	if (!data)
		return false;
	/* Per-CPU mode: succeeds, as on a unit. */
	if (r == PERCPUREF_THIS_CPU_NO_RSEQ && unitless_add(ref, data, nr))
		return true;
	return __percpu_ref_atomic_add_not_zero(data, nr);
}

PERCPUREF_API void __percpu_ref_put_slow(struct percpu_ref *ref, unsigned long nr)
{
	if (!slow_percpu_add(ref, nr * PERCPU_REF_PUT_DELTA, "percpu_ref_put"))
		__percpu_ref_atomic_put(ref, nr);
}

/*
 * get/tryget/put of more than PERCPU_REF_PERCPU_MAX_NR: on the atomic count,
 * which is exact in every mode (per-CPU, the bias keeps it from zero and the
 * fold adds to it).  Not on the per-CPU words, in slices: their sum keeps
 * only the low PERCPU_REF_NET_BITS (31) bits of the net count, so 2^31
 * references taken so read as none at the fold (2^32 up to 0.3.16), and a
 * kill released the ref under them (tests/unit/test_count_limits.c).  An
 * unbiased count lives below 2^62: a call of that many or more (an
 * unsigned -1) is refused, warned, and, for get and put, pins the count as
 * any misuse does.
 */
#define ATOMIC_MAX_NR (1UL << 62)

static bool too_many(struct percpu_ref *ref, unsigned long nr, const char *fn, bool pin)
{
	if (percpuref_likely(nr < ATOMIC_MAX_NR))
		return false;
	percpuref_warn(fn, "ref %p: %lu references in one call, more than a count holds; %s",
		       (void *)ref, nr, pin ? "leaked" : "failed");
	if (pin)
		pin_count(ref);
	return true;
}

PERCPUREF_API void __percpu_ref_get_sliced(struct percpu_ref *ref, unsigned long nr)
{
	if (has_no_data(ref, "percpu_ref_get") || too_many(ref, nr, "percpu_ref_get", true))
		return;
	__percpu_ref_atomic_add(ref, nr);
}

PERCPUREF_API bool __percpu_ref_tryget_sliced(struct percpu_ref *ref, unsigned long nr)
{
	struct percpu_ref_data *data = tryget_data(ref);

	if (!data || too_many(ref, nr, "percpu_ref_tryget", false))
		return false;
	return __percpu_ref_atomic_add_not_zero(data, nr);
}

PERCPUREF_API void __percpu_ref_put_sliced(struct percpu_ref *ref, unsigned long nr)
{
	if (has_no_data(ref, "percpu_ref_put") || too_many(ref, nr, "percpu_ref_put", true))
		return;
	__percpu_ref_atomic_put(ref, nr);
}

/*
 * A put took @ref to zero; @life: data->lives as it loaded it before its
 * subtract (__percpu_ref_atomic_put()).  Only the reclaimer takes a
 * managed ref to zero (the manager's reference is dropped only together
 * with the last one), so a put that reaches zero on a managed ref dropped
 * a reference it did not have: pinned, never released.  Unless the ref
 * was resurrected since that zero (the count reads zero, so a reinit may
 * come at once) and then made managed: the zero is of the ref's life
 * before, and runs its @release, as the zero before any reinit does
 * ("Releases in signal handlers", above).  Up to 0.4.29 that zero read as
 * a dropped manager's reference: its @release never ran and the revived
 * ref was pinned for good (review 163, tests/model/voided.pml,
 * tests/unit/test_put_revive.c).  A misusing put that loaded @life before
 * a resurrection and reached zero after it runs @release instead of being
 * pinned: misuse racing a reinit, not told apart.
 */
PERCPUREF_API void __percpu_ref_release_life(struct percpu_ref *ref, unsigned long life)
{
	/* Acquire: pairs with set_managed()'s release, under the switch lock
	 * that a resurrection before it held too, so a resurrection before
	 * the switch to managed shows in @lives (relaxed, ordered so). */
	if (__atomic_load_n(&ref->data->managed, __ATOMIC_ACQUIRE) &&
	    __atomic_load_n(&ref->data->lives, __ATOMIC_RELAXED) == life) {
		pin_dropped_manager_ref(ref);
		return;
	}
	if (!ref->data->release)
		return;
	/* A signal handler's put, inside a section of its thread: the fences
	 * the release may wait for wait for that section (top of the file). */
	if (percpuref_unlikely(percpuref_reader_interrupted()))
		defer_handler_release(ref);
	else
		run_release(ref, ref->data->release);
}

/* The release of binaries built before 0.4.30, which do not pass @life:
 * read here, after the zero, so a resurrection in between still reads as
 * the present life for them. */
PERCPUREF_API void __percpu_ref_release(struct percpu_ref *ref)
{
	/* Acquire: as in __percpu_ref_atomic_put(). */
	__percpu_ref_release_life(ref, __atomic_load_n(&ref->data->lives, __ATOMIC_ACQUIRE));
}

PERCPUREF_API void __percpu_ref_count_misuse(struct percpu_ref *ref, unsigned long old,
					     unsigned long nr, bool get)
{
	/* A call of none took or dropped nothing (a get of 0 on a count of
	 * 0): not misuse, and the count stays as it was. */
	if (!nr)
		return;
	/* Already saturated: stay pinned, already reported. */
	if (old < PERCPU_REF_UNDERFLOW_ZONE) {
		if (get)
			percpuref_warn("percpu_ref_get", "ref %p get on a released ref "
				       "(count was 0); leaked", (void *)ref);
		else
			percpuref_warn("percpu_ref_put", "ref %p put of %lu below zero "
				       "(count was %lu); leaked", (void *)ref, nr, old);
	}
	pin_count(ref);
}
