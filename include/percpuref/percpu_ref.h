/* SPDX-License-Identifier: MIT */
/*
 * percpu_ref.h - per-CPU reference counts with the kernel's API and rules
 * (include/linux/percpu-refcount.h, minus gfp flags), in userspace.
 *
 * A percpu_ref starts with one reference, the "initial" one.  While it is in
 * per-CPU mode, get and put each add to the current CPU's counter with one
 * non-atomic instruction (see this_cpu.h): no shared cache line is written,
 * and nobody can tell whether the total is zero.  To let the count reach zero
 * the owner kills the ref: it switches to atomic mode (after a reader fence,
 * the per-CPU counters are folded into one atomic counter) and drops the
 * initial reference.  From then on every put is an atomic decrement and the
 * one that reaches zero calls @release, exactly once.
 *
 * Modes: per-CPU -> atomic -> dead.  PERCPU_REF_INIT_ATOMIC starts a ref in
 * atomic mode and percpu_ref_switch_to_atomic() keeps it there ("sticky")
 * until percpu_ref_switch_to_percpu(); both need a ref that was never killed.
 * A dead ref can be brought back with percpu_ref_resurrect() (count > 0; at
 * 0 it does what reinit does, as the kernel's) or percpu_ref_reinit()
 * (count == 0, else warned and ignored), when it was created with
 * PERCPU_REF_ALLOW_REINIT (or INIT_ATOMIC / INIT_DEAD, which imply it).
 *
 * Threads: nothing to do, but before unloading code that called percpuref
 * (percpuref_prepare_unload()).  No call needs thread registration; any
 * thread may call any function.  Switching waits for "a grace period" of
 * the readers of per-CPU counters:
 * membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ) for the rseq fast path,
 * or a grace period of the fallback readers in a process without rseq
 * (docs/percpu_ref.md).  percpuref_fast_path() says which path this
 * process uses.
 *
 * Callbacks: @release runs on the thread whose put drops the last reference;
 * if that last reference was the one a switch holds while it waits, it runs
 * on the library's callback thread ("percpuref-cb"), or on the caller's
 * thread for percpu_ref_switch_to_atomic_sync().  While that thread cannot
 * start, a call that waits for its work (a barrier, an exit, a mode call)
 * runs the work on the calling thread, under the caller's locks.  A managed ref is released
 * by the reclaimer thread, or by the thread of a percpuref_shutdown() (at
 * exit() too), or of a percpu_ref_managed_flush() that scans itself because
 * no thread can start (docs/managed.md).  Confirm callbacks
 * (kill_and_confirm, switch_to_atomic) run on the callback thread, or on the
 * caller's thread when the ref was already atomic.  Callbacks may free the
 * object, call percpu_ref_exit() on the ref they were called for (@release
 * only), kill their own ref from its confirm callback, and use any call on
 * other refs that does not wait for a library thread: on a library thread
 * percpu_ref_barrier() and percpu_ref_managed_flush() are refused
 * (-EDEADLK), and so is a mode call on a ref whose asynchronous switch the
 * callback thread has yet to finish (warned, ignored).  The full table is in
 * docs/percpu_ref.md ("What a callback may call").
 *
 * Misuse is reported with one line on stderr naming the function and the ref
 * ("percpuref: percpu_ref_kill_and_confirm: called more than once on ref
 * 0x...; ignored"), and
 * the call then does the least harmful thing: a count that would drop below
 * zero, or a get on a released ref, saturates the count so the object stays
 * leaked and is never released twice (the kernel's refcount_t rule).
 */
#ifndef PERCPUREF_PERCPU_REF_H
#define PERCPUREF_PERCPU_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <percpuref/compiler.h>
#include <percpuref/this_cpu.h>

/*
 * ThreadSanitizer cannot see a per-CPU put (an rseq commit, or a relaxed add
 * on the fallback path) happen before the switcher's fold, which the reader
 * fence orders.  Under TSAN a put releases on the ref and the fold acquires
 * it, so accesses made under a reference happen before @release for TSAN as
 * they do for the hardware.  Nothing in other builds.
 */
#if defined(__SANITIZE_THREAD__)
#define PERCPUREF_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PERCPUREF_TSAN 1
#endif
#endif
#ifdef PERCPUREF_TSAN
#include <sanitizer/tsan_interface.h>
#define percpuref_tsan_release(addr) __tsan_release(addr)
#define percpuref_tsan_acquire(addr) __tsan_acquire(addr)
#else
#define percpuref_tsan_release(addr) ((void)(addr))
#define percpuref_tsan_acquire(addr) ((void)(addr))
#endif

PERCPUREF_BEGIN_DECLS

/* Flags of percpu_ref_init(). */
enum {
	PERCPU_REF_INIT_ATOMIC = 1 << 0,	/* start (and stay) atomic */
	PERCPU_REF_INIT_DEAD = 1 << 1,		/* start dead, count 0 */
	PERCPU_REF_ALLOW_REINIT = 1 << 2,	/* may switch back after kill */
	PERCPU_REF_REL_MANAGED = 1 << 3,	/* init + switch_to_managed */
};

/* Mode bits in the low bits of percpu_count_ptr. */
enum {
	__PERCPU_REF_ATOMIC = 1UL << 0,
	__PERCPU_REF_DEAD = 1UL << 1,
	__PERCPU_REF_ATOMIC_DEAD = __PERCPU_REF_ATOMIC | __PERCPU_REF_DEAD,
	__PERCPU_REF_FLAG_BITS = 2,
};

/*
 * Atomic-count zones (unsigned long arithmetic).  An unbiased count lives
 * in [0, 2^62); a count in the top quarter, [3 * 2^62, 2^64), went below
 * zero and is pinned at PERCPU_REF_SATURATED.  While per-CPU, the atomic
 * count carries PERCPU_COUNT_BIAS and holds bias + net - P, where net is
 * the whole count (below 2^62) and P the per-CPU words' share (within 2^30
 * either way): it reaches 2^62 + 2^30 when references taken on the atomic
 * count (calls of more than PERCPU_REF_PERCPU_MAX_NR) are dropped on the
 * per-CPU words.  The bias, 2^63 - 2^32, keeps that, plus a switch's extra
 * reference, below the top quarter and the count above zero (with 2^63,
 * a net count within 2^31 of 2^62 read as misuse).
 */
#define PERCPU_COUNT_BIAS ((1UL << 63) - (1UL << 32))

/*
 * Per-CPU words count monotonically, so that the reclaimer can tell a ref
 * in use from an idle one without switching it (docs/managed.md, "check
 * before switch"): a get adds nr, a put adds nr * PERCPU_REF_PUT_DELTA, that
 * is nr above the low PERCPU_REF_NET_BITS bits and minus nr in them.  Every
 * get and put moves a word forward (two equal reads of a word mean nothing
 * happened to it in between: a word returns to a value only after at
 * least 2^33 gets and puts on it, 2^33 + 4 puts and 4 gets the fewest;
 * counted in references, so 2^10 calls of PERCPU_REF_PERCPU_MAX_NR that
 * leave the net count as it was do it: the filter then costs a check), and
 * the low PERCPU_REF_NET_BITS bits of the sum over the CPUs, sign
 * extended, are the per-CPU net count.  Hence the one
 * limit: references that move through the per-CPU words in one per-CPU
 * period stay within 2^30 either way (more live references than that is
 * not a real program; callers without a unit add to one more word of the
 * ref's, counted with these; but references taken on the words by calls
 * of up to PERCPU_REF_PERCPU_MAX_NR and dropped by larger ones, or the
 * other way, move the words' share with none held, and 2^30 of them net
 * leak the ref: docs/percpu_ref.md, "Counts");
 * a get_many/tryget_many/put_many of more than
 * PERCPU_REF_PERCPU_MAX_NR goes on the atomic count instead, exact in
 * every mode while the net count stays below 2^62 (and the per-CPU words'
 * share within 2^30).  31 bits, not 32: a put's 2^31 - 1 fits an x86-64
 * add's sign-extended 32-bit immediate, and an add of an immediate to
 * memory costs about half an add of a register on recent Intel cores (the
 * pair 2.81 -> 1.77 ns, docs/percpu_ref.md "Counts"); 2^32 - 1 needed a
 * register.  Compiled into callers: a change of either is an ABI change.
 */
#define PERCPU_REF_NET_BITS 31
#define PERCPU_REF_PUT_DELTA ((1UL << PERCPU_REF_NET_BITS) - 1)
#define PERCPU_REF_PERCPU_MAX_NR (1UL << 24)
#define PERCPU_REF_UNDERFLOW_ZONE (3UL << 62)
#define PERCPU_REF_SATURATED (7UL << 61)

struct percpu_ref;
typedef void(percpu_ref_func_t)(struct percpu_ref *);

/* Shared, rarely written part of a ref: allocated by percpu_ref_init(). */
struct percpu_ref_data {
	unsigned long count;		  /* atomic count (+ bias if per-CPU) */
	percpu_ref_func_t *release;
	percpu_ref_func_t *confirm_switch; /* non-NULL: switch in progress */
	bool force_atomic;		  /* switch_to_atomic / INIT_ATOMIC */
	bool allow_reinit;
	bool managed;			  /* the reclaimer holds a reference */
	struct percpu_ref *ref;
	/*
	 * Resurrections so far (a reinit is one), stored (release) after the
	 * resurrection's count add; a put loads it (acquire) before its
	 * subtract, so a put whose zero came before a resurrection hands the
	 * older value to __percpu_ref_release_life(), which then knows the
	 * zero was not of the ref's present life (since 0.4.30).
	 */
	unsigned long lives;
};

struct percpu_ref {
	/*
	 * Address of CPU 0's counter, or'ed with __PERCPU_REF_ATOMIC/_DEAD.
	 * After percpu_ref_exit(): ATOMIC_DEAD | (final count << FLAG_BITS), a
	 * count too large for that kept as the largest that fits (never 0).
	 * Written under the switch lock; read locklessly by the fast paths.
	 */
	uintptr_t percpu_count_ptr;
	struct percpu_ref_data *data;
};

/* Slow paths (src/percpu_ref.c). */
PERCPUREF_API int percpu_ref_init(struct percpu_ref *ref, percpu_ref_func_t *release,
				  unsigned int flags);
PERCPUREF_API void percpu_ref_exit(struct percpu_ref *ref);
PERCPUREF_API void percpu_ref_switch_to_atomic(struct percpu_ref *ref,
					       percpu_ref_func_t *confirm_switch);
PERCPUREF_API void percpu_ref_switch_to_atomic_sync(struct percpu_ref *ref);
PERCPUREF_API void percpu_ref_switch_to_percpu(struct percpu_ref *ref);
PERCPUREF_API void percpu_ref_kill_and_confirm(struct percpu_ref *ref,
					       percpu_ref_func_t *confirm_kill);
PERCPUREF_API void percpu_ref_resurrect(struct percpu_ref *ref);
PERCPUREF_API void percpu_ref_reinit(struct percpu_ref *ref);
PERCPUREF_API bool percpu_ref_is_zero(struct percpu_ref *ref);
/*
 * percpu_ref_barrier - wait until every asynchronous switch (kill,
 * switch_to_atomic) started before the call has been confirmed, and the
 * releases those switches triggered have run.  For tests and shutdown.
 * Returns 0, or -EDEADLK (and warns) when called from a callback on one
 * of the library's threads, from shutdown, or from a callback that a poll
 * runs (or a wait that runs the queued work itself), which would wait for
 * itself; a @release run by a put on the putter's own thread may call it.
 * While the callback thread cannot start (pthread_create() refused), it
 * runs the switches and their callbacks on the calling thread, as an exit
 * or a mode call that waits for such a switch does.
 */
PERCPUREF_API int percpu_ref_barrier(void);

/*
 * Polling threads: kills finished on the thread that made them.
 *
 * percpu_ref_poll_register - from now on, the asynchronous switches this
 * thread starts (percpu_ref_kill(), _kill_and_confirm(), _switch_to_atomic())
 * are finished by this thread, inside its own percpu_ref_poll() calls,
 * rather than by the library's callback thread: their confirm callbacks and
 * the @release a kill triggers run there.  The kernel runs the second half
 * of a kill on the CPU that queued it; a thread that kills many refs
 * (switch-storm: 16 threads killing their own) then shares no callback
 * thread, and the fences its polls start are paced and shared by all.
 * Like liburcu's QSBR flavour, it asks the thread to poll: call
 * percpu_ref_poll() regularly (between requests, say), and unregister
 * before blocking for long.  Whatever is queued when the thread
 * unregisters or exits is handed to the callback thread, and so is every
 * polling thread's queue when any thread calls percpu_ref_barrier(), and
 * at process exit; a call that waits for one switch in flight (exit,
 * reinit, switch_to_percpu of its ref) hands over that switch alone.  The
 * pacing, 300 µs, is read from PERCPUREF_POLL_INTERVAL_US (0..1000000)
 * at the first registration.  Returns 0, -EALREADY if registered (inside
 * a callback its own poll runs, too), -EPERM on one of the library's
 * threads, -EDEADLK inside a callback run by a wait that runs the queue
 * itself (no callback thread could start), -ENOMEM, or -EAGAIN when no
 * hook at thread exit could be set.
 *
 * percpu_ref_poll - finishes this thread's switches whose reader fence has
 * ended, running their callbacks, and starts that fence (shared with every
 * thread) if none started within the pacing interval.  With PERCPU_REF_POLL_WAIT,
 * when none can be finished yet, it first waits for the oldest: for a
 * fence another thread started after it (one fence serves every thread's
 * older switches), else it runs one.  So `while (percpu_ref_poll(
 * PERCPU_REF_POLL_WAIT) > 0);` finishes them all, including any the
 * callbacks start (those another thread's barrier took over meanwhile
 * finish on the callback thread).  Returns how many it finished, -EPERM
 * if the thread is not registered, -EINVAL for an unknown flag, or
 * -EDEADLK inside a callback the library runs (a @release that this very
 * poll runs, or any confirm callback, even one run at once).
 *
 * percpu_ref_poll_unregister - hands what is queued to the callback thread
 * and stops.  0, -EPERM if not registered, -EDEADLK inside a callback
 * that a poll runs (or a wait that runs the queue itself).
 */
#define PERCPU_REF_POLL_WAIT 1u
PERCPUREF_API int percpu_ref_poll_register(void);
PERCPUREF_API int percpu_ref_poll(unsigned int flags);
PERCPUREF_API int percpu_ref_poll_unregister(void);
/* For percpuref.hpp: this thread's slot for the poll_registration that
 * registered it, one per thread in the library (not a thread_local of the
 * header's, of which plugins loaded with RTLD_LOCAL each had a copy). */
PERCPUREF_API void **__percpu_ref_poll_owner(void);

/*
 * Managed mode (docs/managed.md; control and statistics in managed.h).
 *
 * percpu_ref_switch_to_managed - put @ref under the manager: the library's
 * reclaimer takes a reference of its own, switches the ref to (and keeps it
 * in) per-CPU mode, checks it periodically and calls @release, exactly
 * once, once the manager's is the only reference left: on its own thread,
 * or on the thread of a percpuref_shutdown() (at exit() too) or of a flush
 * that scans itself because no thread can start.
 * Every reference the caller held before, the initial one included, stays
 * the caller's, to drop with percpu_ref_put(); nobody kills a managed ref.
 * The ref must be live (never killed, count above zero) and allowed to
 * switch back to per-CPU mode (PERCPU_REF_ALLOW_REINIT, INIT_ATOMIC,
 * INIT_DEAD or REL_MANAGED).  Returns 0; -EALREADY if already managed,
 * -EINVAL otherwise (both warned, nothing changed).
 *
 * PERCPU_REF_REL_MANAGED at init does the same switch: a fresh ref counts 2,
 * the creator's initial reference and the manager's.  With INIT_DEAD it
 * starts dead and goes under management at its first reinit.
 *
 * On a managed ref, kill, switch_to_atomic(_sync) and switch_to_percpu warn
 * and do nothing: the reclaimer owns the mode.  get/put/tryget work in every
 * mode.  Once released the ref is dead and atomic with count 0 (tryget
 * fails); reinit or resurrect gives the caller a new initial reference and
 * the manager its own again (count 2), back under management.  exit of a
 * managed ref, released or not, is allowed: the ref is never checked again
 * (the reclaimer frees the list node later, unless the exit takes it back
 * first); @release does not run.  From
 * another thread than the reclaimer, exit a ref held by the manager alone
 * only while holding a reference, or after its @release ran: otherwise
 * the reclaimer may be running @release already.  A put
 * that drops the manager's reference (more puts than gets) is misuse:
 * warned once, count pinned, never released.
 */
PERCPUREF_API int percpu_ref_switch_to_managed(struct percpu_ref *ref);
/*
 * percpu_ref_switch_to_unmanaged - the manager drops its reference; the ref
 * is an ordinary per-CPU ref again, which the caller may kill as usual.  The
 * caller must hold a reference.  Waits for a check of the ref in flight.  0,
 * or -EINVAL (warned) when the ref is not managed or was already released.
 */
PERCPUREF_API int percpu_ref_switch_to_unmanaged(struct percpu_ref *ref);
/*
 * percpuref_shutdown - stop the library's threads (reclaimer and callback
 * thread) once the work pending at the call is done: every pending switch
 * and the release it leads to (RCU-deferred ones included), a last full
 * scan that releases every managed ref whose only reference is the
 * manager's, every pending RCU-deferred release; free the reclaimer's own
 * memory.  Then the same again for what callbacks queued meanwhile (a
 * release that kills or drops other refs), until nothing is left; but if
 * another thread queued work meanwhile, it returns after the round in
 * which it saw that (such a thread may never stop), leaving what is still
 * queued to the threads, which start again for it.  So too when
 * callbacks bring one ref back to life (reinit, resurrect) 64 times
 * within one shutdown (a @release that reinits its ref and drops it
 * again, each time, would keep the shutdown, and exit(), going for ever);
 * a callback that makes and drops a new ref each time it runs still does,
 * as an atexit() handler that loops would.  Managed refs still referenced
 * stay managed but are not checked again until the reclaimer starts
 * again: at the next managed ref (switch_to_managed, REL_MANAGED init, or
 * the reinit of a managed ref), percpu_ref_managed_flush(), percpu_rcuref
 * release, or at exit; one whose last user lets go after the shutdown
 * waits for that (call percpu_ref_managed_flush() to have it checked).
 * Also runs at process exit: before the destructors of the static
 * objects built before the library's first use (an atexit() handler
 * registered then), and once more after all of them: exit() called
 * holding a lock that a pending @release takes waits for ever.  After
 * that handler (0.4.32), on the thread that runs the exit, a kill switches
 * its ref on that thread and a percpu_rcuref waits for its own grace
 * period, so their callbacks run before the call returns; and the
 * handler's pass kills the managed refs still held, the manager's
 * reference their initial one, so their last put releases them
 * (docs/percpu_ref.md, "At process exit").  Not from a callback on one of the
 * library's threads, nor from shutdown, nor from a callback that a poll or
 * a wait running the queued work itself runs, nor inside an RCU read-side
 * section, where it would wait for itself (warned, does nothing).
 */
PERCPUREF_API void percpuref_shutdown(void);

/*
 * percpuref_set_library_cpus - choose the CPUs the library's threads (the
 * callback thread "percpuref-cb", the reclaimer "percpuref-recl") may run
 * on.  @cpus lists CPUs and ranges of them, comma-separated ("3",
 * "0-3,8": the kernel's list format, without blanks); a range may end in
 * the kernel's pattern ":USED/GROUP" ("0-15:2/8": 0,1,8,9) or taskset's
 * stride ":STRIDE" ("0-7:2": 0,2,4,6).  The threads running now
 * change at once (all of them or, on an error, none), those started later
 * take it as they start.  NULL goes back to the default: a thread may run
 * where the thread whose call started it could at that moment
 * (pthread_create() copies the affinity: a callback thread started by a
 * pinned worker's kill shares that worker's CPU), or, started by another
 * library thread, where that one started; running ones go back there.
 * PERCPUREF_LIBRARY_CPUS in the environment makes the same choice when
 * the library sets itself up; a call overrides it.  Returns 0; -EINVAL
 * when @cpus is not such a list of CPUs below 8192 (a pattern the kernel
 * refuses, or one that names no CPU, among them), or a running library
 * thread may use none of them (offline, outside its cpuset; for NULL,
 * none of those it started with); the kernel's error otherwise (-EPERM
 * from a sandbox; for NULL, also the one that kept a thread's first CPUs
 * from being read at its start).  With no library
 * thread running nothing checks the choice: a thread that then cannot
 * take it warns on stderr and runs where it started.  Any thread, a
 * callback included; not from a signal handler.
 */
PERCPUREF_API int percpuref_set_library_cpus(const char *cpus);

/*
 * percpuref_get_counter_stats - occupancy of the per-CPU counter allocator that
 * every percpu_ref (and percpu_rcuref) draws its counter from: for memory
 * reports and leak checks.  Any thread.  Exact while no other thread
 * creates or exits a ref; meanwhile each of their counts may be off by the
 * calls in flight.  @free counts the counters allocatable without a new
 * chunk, and those each live thread keeps for its own next inits (up to 512
 * a thread, given back when it exits): another thread may map a chunk while
 * some are kept.  A thread whose first call came from its last TLS
 * destructor cannot give them back itself: they stay counted as free, and
 * the allocator takes them back before it maps a new chunk.  In a fork
 * child, the counters other threads of the parent kept, dead threads' left
 * behind so included, count as in use.
 */
struct percpuref_counter_stats {
	size_t chunks;		/* chunks mapped (one unit per possible CPU each) */
	size_t in_use;		/* counters allocated */
	size_t free;		/* counters not in use, mapped: see above */
	size_t bytes_mapped;	/* address space reserved for counters */
};
PERCPUREF_API void percpuref_get_counter_stats(struct percpuref_counter_stats *stats);

/*
 * percpuref_fast_path - which per-CPU fast path this process uses, as one
 * word for reports: "rseq-glibc" (rseq areas registered by glibc),
 * "rseq-own" (rseq areas this library registers, where the C library
 * registered none) or "fallback" (per-thread units and the fallback
 * readers' grace period: no rseq).  Chosen at the first per-CPU counter;
 * this call chooses it if none exists yet.  Any thread.
 */
PERCPUREF_API const char *percpuref_fast_path(void);

/*
 * percpuref_fence_method - how a switch's fence reaches this process's
 * fast-path sections, as one word for reports: "membarrier" (the kernel
 * interrupts every CPU running this process: an rseq section restarts, a
 * fallback reader's compiler barrier becomes a full one), "migration"
 * (membarrier refused on the rseq path: the fence runs a moment on every
 * CPU), "reader-fences" (membarrier refused on the fallback path: every
 * get and put fences its own section, a full barrier each) or "none" (no
 * per-CPU section left to fence: every thread counts on each ref's shared
 * word, as after a sandbox refused both membarrier and migration on the
 * rseq path).  A refusal after start-up (a seccomp filter installed later)
 * shows once a fence has met it (on the fallback, a fence while some
 * thread holds a unit).  Any thread.  Since 0.4.26.
 */
PERCPUREF_API const char *percpuref_fence_method(void);

/*
 * percpuref_fork_generation - how many fork()s separate this process from
 * the one where the library was loaded: 0 there, one more in each child
 * of a fork() that runs the atfork handlers, counted before the child's
 * library threads start (they finish, in the child, the kills its parent
 * had queued).  A release that finds it changed since the object was made
 * runs on the child's copy of a parent's object (the bindings leak such
 * copies rather than run their destructors twice).  It tells a child whose
 * process ID equals its parent's (both PID 1 of their PID namespaces); a
 * child made without the handlers (_Fork(), clone(), a fork before the
 * library's constructor ran) is not counted, so compare the process ID
 * too.  Any thread, async-signal-safe.
 */
PERCPUREF_API unsigned long percpuref_fork_generation(void);

/*
 * percpuref_prepare_unload - forget the calling thread's last rseq
 * sequence, so that the code it ran in can be unmapped.  Each get and put
 * on the rseq fast path is inlined into the caller's object (a plugin, a
 * JIT's code) and leaves the thread's rseq area pointing at a descriptor
 * in that object; the kernel reads it at the thread's next preemption or
 * signal, and kills the thread (SIGSEGV) once the object is gone.  The
 * library's own functions do the same inside libpercpuref.so.  So, as the
 * kernel's rseq ABI requires: every thread that called percpuref from an
 * object that will be dlclose()d (or while libpercpuref.so itself may be)
 * calls this after its last such call and before the unload (a thread
 * that exited needs nothing).  The calls a callback makes are the
 * library's to forget: it calls this after every callback, on whichever
 * thread it ran (its own, or the one whose put released the ref).  One
 * store; any thread, async-signal-safe.  Call it whatever
 * percpuref_fast_path() says: a process may leave the rseq fast path at
 * run time (a refused membarrier), with areas still pointing at earlier
 * sequences, and the call still clears them.
 */
PERCPUREF_API void percpuref_prepare_unload(void);

/* Out-of-line halves of the fast paths: fallback (no rseq) and misuse. */
PERCPUREF_API void __percpu_ref_get_slow(struct percpu_ref *ref, unsigned long nr);
PERCPUREF_API bool __percpu_ref_tryget_slow(struct percpu_ref *ref, unsigned long nr,
					    bool live);
PERCPUREF_API void __percpu_ref_put_slow(struct percpu_ref *ref, unsigned long nr);
PERCPUREF_API void __percpu_ref_count_misuse(struct percpu_ref *ref, unsigned long old,
					     unsigned long nr, bool get);
PERCPUREF_API void __percpu_ref_release(struct percpu_ref *ref);
PERCPUREF_API void __percpu_ref_release_life(struct percpu_ref *ref, unsigned long life);
/* More than PERCPU_REF_PERCPU_MAX_NR at once, on the atomic count (named
 * for the slices they once cut; the names stay for binaries built before). */
PERCPUREF_API void __percpu_ref_get_sliced(struct percpu_ref *ref, unsigned long nr);
PERCPUREF_API bool __percpu_ref_tryget_sliced(struct percpu_ref *ref, unsigned long nr);
PERCPUREF_API void __percpu_ref_put_sliced(struct percpu_ref *ref, unsigned long nr);

/*
 * percpu_ref_kill - drop the initial reference and let the count reach zero.
 * Switches to atomic mode after a grace period; @release runs once the last
 * reference is gone.  Calling it twice is misuse (warned, ignored).
 */
static inline void percpu_ref_kill(struct percpu_ref *ref)
{
	percpu_ref_kill_and_confirm(ref, NULL);
}

/*
 * Atomic-mode helpers.  get is relaxed (holding a reference orders nothing);
 * put is acquire-release: release so that accesses made under the reference
 * happen before the release callback, acquire so that the putter reaching
 * zero sees every other putter's accesses (same instruction as a plain
 * locked subtract on x86).
 */
static inline void __percpu_ref_atomic_add(struct percpu_ref *ref, unsigned long nr)
{
	unsigned long old = __atomic_fetch_add(&ref->data->count, nr, __ATOMIC_RELAXED);

	if (percpuref_unlikely(old == 0 || old >= PERCPU_REF_UNDERFLOW_ZONE))
		__percpu_ref_count_misuse(ref, old, nr, true);
}

/* Drops @nr from the atomic count; true when that reached zero (the caller
 * then owns the release). */
static inline bool __percpu_ref_atomic_sub_and_test(struct percpu_ref *ref, unsigned long nr)
{
	unsigned long old = __atomic_fetch_sub(&ref->data->count, nr, __ATOMIC_ACQ_REL);

	/* A put of none releases nothing: a released ref's count is 0 too
	 * (it ran @release a second time). */
	if (old == nr)
		return nr != 0;
	if (percpuref_unlikely(old - nr >= PERCPU_REF_UNDERFLOW_ZONE))
		__percpu_ref_count_misuse(ref, old, nr, false);
	return false;
}

/*
 * A put on the atomic count; the one that reaches zero releases, telling
 * __percpu_ref_release_life() which life of the ref it put: a ref revived
 * and switched to managed between this zero and that call would otherwise
 * read as a managed ref whose manager's reference a put dropped, and this
 * zero's @release was lost (up to 0.4.29; review 163).  Acquire: pairs
 * with the resurrection's release store, after its count add, so a put
 * that loads the new value subtracts after that add, not before.
 */
static inline void __percpu_ref_atomic_put(struct percpu_ref *ref, unsigned long nr)
{
	unsigned long life = __atomic_load_n(&ref->data->lives, __ATOMIC_ACQUIRE);

	if (__percpu_ref_atomic_sub_and_test(ref, nr))
		__percpu_ref_release_life(ref, life);
}

/* Adds one reference unless the count is zero (the kernel's add_unless),
 * on the @data a tryget loaded once: an RCU-released ref may be exited
 * under its readers (percpu_rcuref.h), whose data stays valid until their
 * read-side sections end but whose pointer to it is cleared at once. */
static inline bool __percpu_ref_atomic_add_not_zero(struct percpu_ref_data *data,
						    unsigned long nr)
{
	/* Relaxed, the load and the compare-and-swap: a tryget that succeeds
	 * is a get (above); what the caller reads through the object was
	 * ordered by the lookup that found it, and what it does under the
	 * reference reaches @release through its put.  A zero only fails
	 * the call: nothing is read on the strength of it. */
	unsigned long old = __atomic_load_n(&data->count, __ATOMIC_RELAXED);

	do {
		if (old == 0)
			return false;
		/* A saturated count stays pinned: succeed, leak. */
		if (percpuref_unlikely(old >= PERCPU_REF_UNDERFLOW_ZONE))
			return true;
	} while (!__atomic_compare_exchange_n(&data->count, &old, old + nr, true,
					      __ATOMIC_RELAXED, __ATOMIC_RELAXED));
	return true;
}

/*
 * percpu_ref_get_many - take @nr references.  The caller must already hold
 * one (or otherwise know the ref cannot be released meanwhile).  Per-CPU
 * mode: one non-atomic add on this CPU's counter.  Atomic mode: one atomic
 * add.  Any thread; from a signal handler only when it interrupted no
 * library call but a get or put, and the thread has called the library
 * before (a thread's first call may allocate: docs/percpu_ref.md,
 * "Signal handlers").
 */
static inline void percpu_ref_get_many(struct percpu_ref *ref, unsigned long nr)
{
	enum percpuref_this_cpu_result r;

	if (percpuref_unlikely(nr > PERCPU_REF_PERCPU_MAX_NR)) {
		__percpu_ref_get_sliced(ref, nr);
		return;
	}
	r = percpuref_this_cpu_add_after_setup(&ref->percpu_count_ptr, nr);
	if (percpuref_likely(r == PERCPUREF_THIS_CPU_DONE))
		return;
	/* No data: exited, or its init failed (the slow path warns). */
	if (r == PERCPUREF_THIS_CPU_FLAGGED && percpuref_likely(ref->data))
		__percpu_ref_atomic_add(ref, nr);
	else
		__percpu_ref_get_slow(ref, nr);
}

/* percpu_ref_get - take one reference; see percpu_ref_get_many(). */
static inline void percpu_ref_get(struct percpu_ref *ref)
{
	percpu_ref_get_many(ref, 1);
}

/*
 * percpu_ref_tryget_many - take @nr references unless the count is zero.
 * Per-CPU mode always succeeds (zero cannot be seen there); atomic mode
 * succeeds while the count is above zero, dead or not.
 */
static inline bool percpu_ref_tryget_many(struct percpu_ref *ref, unsigned long nr)
{
	enum percpuref_this_cpu_result r;
	struct percpu_ref_data *data;

	if (percpuref_unlikely(nr > PERCPU_REF_PERCPU_MAX_NR))
		return __percpu_ref_tryget_sliced(ref, nr);
	r = percpuref_this_cpu_add_after_setup(&ref->percpu_count_ptr, nr);
	if (percpuref_likely(r == PERCPUREF_THIS_CPU_DONE))
		return true;
	/* Loaded once, and atomically: an exit under RCU readers clears it
	 * (__percpu_ref_atomic_add_not_zero()); none goes to the slow path,
	 * which tells such an exit from misuse.  Relaxed: the only non-NULL
	 * pointer stored here is init's, which reached this thread with the
	 * ref itself; the slow path loads a NULL again with acquire, for the
	 * exit's mode word. */
	data = __atomic_load_n(&ref->data, __ATOMIC_RELAXED);
	if (r == PERCPUREF_THIS_CPU_FLAGGED && percpuref_likely(data))
		return __percpu_ref_atomic_add_not_zero(data, nr);
	return __percpu_ref_tryget_slow(ref, nr, false);
}

/* percpu_ref_tryget - one reference unless the count is zero. */
static inline bool percpu_ref_tryget(struct percpu_ref *ref)
{
	return percpu_ref_tryget_many(ref, 1);
}

/*
 * percpu_ref_tryget_live - one reference unless the ref was killed.  Once a
 * kill's confirm callback has run, every later tryget_live fails; one that
 * races with the kill itself may still succeed (as in the kernel).
 */
static inline bool percpu_ref_tryget_live(struct percpu_ref *ref)
{
	enum percpuref_this_cpu_result r;
	struct percpu_ref_data *data;

	r = percpuref_this_cpu_add_after_setup(&ref->percpu_count_ptr, 1);
	if (percpuref_likely(r == PERCPUREF_THIS_CPU_DONE))
		return true;
	if (r == PERCPUREF_THIS_CPU_FLAGGED) {
		/* Relaxed: a kill sets DEAD (seq_cst, under the switch lock)
		 * before its confirm runs, so a call ordered after the confirm
		 * reads it (or a later resurrect's word) by coherence; one
		 * racing the kill may miss it, as allowed above. */
		if (__atomic_load_n(&ref->percpu_count_ptr, __ATOMIC_RELAXED) & __PERCPU_REF_DEAD)
			return false;
		/* Loaded once, relaxed, as in percpu_ref_tryget_many(): only
		 * init stores one that is not NULL, and it came with the ref;
		 * NULL goes to the slow path, which loads it with acquire. */
		data = __atomic_load_n(&ref->data, __ATOMIC_RELAXED);
		if (percpuref_likely(data))
			return __percpu_ref_atomic_add_not_zero(data, 1);
	}
	return __percpu_ref_tryget_slow(ref, 1, true);
}

/*
 * percpu_ref_put_many - drop @nr references.  Per-CPU mode: one non-atomic
 * subtract on this CPU's counter (never releases).  Atomic mode: an atomic
 * subtract; the put that reaches zero calls @release on this thread.
 */
static inline void percpu_ref_put_many(struct percpu_ref *ref, unsigned long nr)
{
	enum percpuref_this_cpu_result r;

	if (percpuref_unlikely(nr > PERCPU_REF_PERCPU_MAX_NR)) {
		__percpu_ref_put_sliced(ref, nr);
		return;
	}
	/* Pairs with the fold's acquire.  On &ref->data, not on the mode
	 * word: a release store to the mode word would reset TSAN's clock
	 * for that address.  (The only atomic stores to &ref->data, an
	 * exit's, come after every fold of the ref.) */
	percpuref_tsan_release(&ref->data);
	r = percpuref_this_cpu_add_after_setup(&ref->percpu_count_ptr, nr * PERCPU_REF_PUT_DELTA);

	if (percpuref_likely(r == PERCPUREF_THIS_CPU_DONE))
		return;
	if (r != PERCPUREF_THIS_CPU_FLAGGED || percpuref_unlikely(!ref->data))
		__percpu_ref_put_slow(ref, nr);
	else
		__percpu_ref_atomic_put(ref, nr);
}

/* percpu_ref_put - drop one reference; see percpu_ref_put_many(). */
static inline void percpu_ref_put(struct percpu_ref *ref)
{
	percpu_ref_put_many(ref, 1);
}

/* percpu_ref_is_dying - true once the ref was killed (until resurrected). */
static inline bool percpu_ref_is_dying(struct percpu_ref *ref)
{
	/* Relaxed: a snapshot, as the kernel's plain read; a call ordered
	 * after the kill reads DEAD (or a later resurrect's word) by
	 * coherence, one racing it may not. */
	return __atomic_load_n(&ref->percpu_count_ptr, __ATOMIC_RELAXED) & __PERCPU_REF_DEAD;
}

PERCPUREF_END_DECLS

#endif
