/* SPDX-License-Identifier: MIT */
/*
 * runtime.c - process-wide machinery under every per-CPU counter: which fast
 * path is usable, the reader fence that makes mode switches exact, fork,
 * warnings, fault injection.
 *
 * Fast path choice.  percpuref_rseq_offset is set once, before the first
 * per-CPU counter is allocated, when (a) an rseq area is registered for the
 * initialising thread, glibc's or the library's own (rseq_register.c), and
 * (b) membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ) succeeded.
 * Threads without a registered area see cpu_id < 0 and take the slow path
 * per call (this_cpu.h), which registers the library's own area if that is
 * the one in use, else counts without a unit (percpu_ref.c: the ref's
 * unit-less word, or its atomic count).  A process without rseq
 * uses the fallback readers of fallback.c instead, with two units per CPU.
 *
 * Unloading.  Each sequence leaves its thread's rseq area pointing at its
 * descriptor, which lies in the object the sequence was inlined into; the
 * kernel clears it lazily, at the thread's next preemption, signal or
 * rseq membarrier.  A thread that blocks right after a sequence still
 * points into the object when it wakes, and dies by SIGSEGV if the object
 * was unloaded meanwhile.  percpuref_prepare_unload() clears this thread's
 * pointer.  The library calls it after every user callback it runs, on
 * whichever thread (a callback's sequences are its own object's, and the
 * thread's owner never called there), before anything can report the
 * callback done: a barrier or flush that returned leaves no library
 * thread pointing into the callbacks' object.
 *
 * The reader fence (percpuref_fence_readers) is this library's grace period.
 * A switcher first stores the new mode flags into the ref's mode word, then:
 *  - rseq readers: MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ interrupts every
 *    running thread of the process; the kernel restarts any rseq critical
 *    section that had not committed, and the restarted section re-reads the
 *    mode word.  Threads not running were already restarted when preempted.
 *    Every commit that happened before the interrupt is visible to the
 *    switcher when membarrier returns (it implies a full barrier on each CPU).
 *  - fallback readers (a process without rseq) run a short read-side
 *    section on a unit they own; percpuref_readers_fence() waits for them
 *    with membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) and a grace-period
 *    count (fallback.c), and returns at once while no thread registered.
 *
 * A fence that membarrier refuses (a seccomp filter installed after
 * start-up) degrades instead of aborting: the fencing thread moves itself
 * onto every CPU in turn (sched_setaffinity).  Running there means whatever
 * ran there was switched out: an rseq critical section it was in is aborted
 * and restarts, and the context switch is a full barrier on that CPU, so
 * every commit made before is visible: what membarrier(..._RSEQ) promises.
 * liburcu-bp, which aborts when its own membarrier fails, is told to use
 * plain fences instead (percpuref_synchronize_rcu()).  Threads on a CPU id
 * beyond the units allocated (an untrustworthy CPU count) never commit on
 * the rseq path: the sequence checks cpu_id against percpuref_nr_cpu_units
 * and sends them to the slow path, which uses the atomic count.
 *
 * Where moving between CPUs is refused too, nothing can abort a section any
 * more: the fence switches the fast path off (new sections see no unit and
 * take the slow path) and gives the sections in flight, a few instructions
 * each, 10 ms from its publish to end (a sequence reads the unit bound, or
 * on aarch64 the area's place, again inside its critical section, so a
 * thread stopped before the section began, which nothing restarts, cannot
 * commit after; this_cpu.h), a sleep that signals do not cut short;
 * every fence that finds the fast path off before those 10 ms are up
 * waits for them too (percpuref_fence_readers()), not only the one that
 * switched it off, and first for any switch-off between its publish and
 * its stamp of the end (switch_fast_path_off(); a fork child, which has
 * no such thread, resets their count).  tests/model/switchoff.pml, Model
 * S, checks the handshake.
 *
 * Work that must wait for a fence runs on the library's own callback thread
 * (deferred.c), or on a polling thread that queued it, which looks later
 * whether a fence has covered it: every fence takes a ticket (a counter
 * incremented, seq_cst, before it starts) and, once it ended, raises
 * fence_covered to its ticket (release).  Work stamped with the tickets
 * taken so far, read (seq_cst) after the seq_cst exchange that published
 * its mode flags (percpuref_fence_stamp()), is covered once fence_covered is above the
 * stamp (acquire): that fence took its ticket after the stamp was read,
 * so after the flags were visible, as the kernel's rcu_seq_snap() argues
 * for a grace period.  Fences may overlap; each covers what it started
 * after, so the mark only rises.
 *
 * Layering.  This is the lowest layer, with the fast paths it chooses
 * between (rseq_register.c, fallback.c) and thread_exit.c: they call
 * nothing above them (tests/compile/check_layers.sh checks the objects,
 * against the layers it writes down).  Modules above register fork hooks, one per lock rank (internal.h writes the lock
 * order down), and exit hooks.  Fork takes every rank in order (liburcu-bp's
 * own locks at their rank) and releases them in reverse, so the child never
 * inherits a lock held by a thread that does not exist there; batch locks a
 * forking thread holds itself (fork from a callback) are left to it.  Our
 * threads start under their module's lock, and the module's prepare hook,
 * having taken it, waits until a thread it started runs our code: no fork
 * lands in a thread's start-up, where a sanitizer runtime holds locks of
 * its own that no hook takes (percpuref_wait_thread_started()).  The
 * child counts one more fork generation before any hook runs, so a
 * release that the child's threads run for the parent's queued work can
 * tell the parent's objects by it (percpuref_fork_generation()).
 *
 * Signal masks.  The library's threads (the callback thread, the
 * reclaimer) block every signal for their whole life, as liburcu's
 * call_rcu threads do and as the kernel's kthreads ignore them: a
 * process-directed signal then goes to one of the user's threads.  A
 * library thread is always inside a library call, holding its locks, and
 * a handler there whose put ran a @release that fences or switches waited
 * for a lock its own thread held (the readers' lock, in a fence), for
 * ever; the documented rule (a handler may interrupt only a get or put)
 * is one no program could keep for threads it does not start, whose mask
 * was whichever thread's that started them.  percpuref_start_thread()
 * blocks them around pthread_create(), so none arrives before the
 * thread's first instruction; a thread a fork child's hooks start gets
 * the same mask.  All but the synchronous ones (SIGSEGV, SIGBUS, SIGFPE,
 * SIGILL, SIGTRAP, SIGSYS), which the thread's own instruction raises: the
 * kernel holds none of those pending, it unblocks a blocked one and
 * resets it to its default action, so blocking them only killed the
 * process where the program's handler would have run (a callback's write
 * to a page a SIGSEGV handler maps on demand, a membarrier a seccomp
 * filter traps to a SIGSYS handler; tests/unit/test_library_thread_signals.c).
 * Those six, sent by kill() to the process, may still land on one of our
 * threads (docs/percpu_ref.md says so).
 * Tests open one signal with
 * percpuref_test_library_threads_accept() (tests/child.h's deadline has
 * every thread of a hung child print its stack on SIGURG).
 *
 * Placement.  A library thread runs where the thread whose call started
 * it may run (its affinity, which pthread_create() copies: a callback
 * thread started by a pinned worker's kill shares that worker's CPU),
 * unless percpuref_set_library_cpus() or PERCPUREF_LIBRARY_CPUS chose
 * their CPUs; one started by another library thread gets the CPUs that
 * one started with, so that a NULL set takes both back there.  Each
 * library thread lists itself (library_threads) as it starts, taking the
 * choice then, and delists itself as it ends, by return or pthread_exit()
 * (a cleanup handler).  A set changes every listed thread under the
 * list's lock, all or none.  So a set reaches only live threads of ours
 * (the id of a thread that ended may name another thread by then, of
 * ours or of another process), and a fork child lists none of the
 * parent's (but one forked from a signal handler inside a get or put,
 * which takes no lock and may only exec or _exit).
 *
 * Backlogs.  A queue one of the library's threads works off (the callback
 * thread's switches, the reclaimer's RCU-deferred releases) paces the
 * callers that fill it faster than the thread empties it
 * (percpuref_backlog_wait(); deferred.c, "Backlog").  Its counts are the
 * queue's, under the queue's lock; the waiter reads the runner's count of
 * items run without it (relaxed: compared, nothing read through it) to
 * tell a stuck thread (no item in BACKLOG_STALL_MS) from a long batch.
 * The wait holds only the queue's lock, dropped in the condition wait, and
 * never runs where the thread's work may wait for the caller.
 */
#define _GNU_SOURCE
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <linux/membarrier.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <urcu/tls-compat.h>

#include "fallback.h"
#include "internal.h"
#include "percpuref/this_cpu.h"

PERCPUREF_API ptrdiff_t percpuref_rseq_offset;
PERCPUREF_API unsigned int percpuref_nr_cpu_units;
/* The possible CPUs (a fault's count in tests): percpuref_nr_cpu_units
 * before the fallback readers' units multiply it. */
static unsigned int nr_cpu_ids;
PERCPUREF_API uint64_t percpuref_this_cpu_params;
/*
 * The offset of the registered rseq areas the sequences have written: the
 * last non-zero percpuref_rseq_offset, kept when the fast path is turned
 * off, as the areas still point at the last sequences run
 * (percpuref_prepare_unload()).  With no offset, params points the x86-64
 * sequence at the library's own area, never registered then unless it was
 * the one in use, which this names.
 */
static ptrdiff_t sequence_area_offset;

/*
 * Publishes the fast path: @offset (0: none) into percpuref_rseq_offset and,
 * with percpuref_nr_cpu_units, into percpuref_this_cpu_params (this_cpu.h),
 * params first: the x86-64 sequence reads only params, the rest of the
 * library only the offset.  With no offset, params points the sequence at
 * the library's own area, which it may write whether registered or not, and
 * allows it no unit; either way params is not 0 (this_cpu.h).  @order:
 * relaxed before the first counter exists, seq_cst when a running process
 * turns the fast path off.
 */
static void publish_fast_path(ptrdiff_t offset, int order)
{
	uint64_t params = (uint32_t)(int32_t)percpuref_rseq_own_area_offset();

	if (offset)
		params = (uint32_t)(int32_t)offset | (uint64_t)percpuref_nr_cpu_units << 32;
#if defined(__x86_64__)
	/* Never 0 once set up: percpuref_this_cpu_add_after_setup(). */
	assert((uint32_t)params != 0);
#endif
	/* Relaxed: written once, by the set-up (the only caller with an
	 * offset), and read by percpuref_prepare_unload() on threads whose
	 * sequences ran on counters created after it (see there). */
	if (offset)
		__atomic_store_n(&sequence_area_offset, offset, __ATOMIC_RELAXED);
	__atomic_store_n(&percpuref_this_cpu_params, params, order);
	__atomic_store_n(&percpuref_rseq_offset, offset, order);
}

/*
 * The kernel reads rseq_cs at this thread's next preemption, migration,
 * signal or rseq membarrier, and reads the descriptor it points to and the
 * signature before the abort handler that descriptor names; the ABI
 * (include/uapi/linux/rseq.h) asks user space to clear it before the
 * descriptor is unmapped, the kernel's rseq selftests before its code is.
 * Clearing it in each sequence costs a store per get and put (0.15 ns of a
 * 1.24 ns pair here); librseq's rseq_prepare_unload() leaves it to the
 * unloading code too.  Outside a sequence (a call never is inside one), so
 * the kernel restarts nothing.
 */
PERCPUREF_API void percpuref_prepare_unload(void)
{
#if PERCPUREF_HAVE_RSEQ
	/* Relaxed: this thread's sequences ran on counters created after the
	 * set-up that published it, and whoever handed it a counter ordered
	 * the creation before. */
	ptrdiff_t offset = __atomic_load_n(&sequence_area_offset, __ATOMIC_RELAXED);
	struct percpuref_rseq_area *area;

	if (!offset)
		return;
	area = (struct percpuref_rseq_area *)((char *)percpuref_thread_pointer() + offset);
	/* Single-copy atomic, as the ABI asks: the kernel reads it at an
	 * interrupt of this thread, which the signal fence orders the store
	 * before, and before whatever the caller does next (an unmap). */
	__atomic_store_n(&area->rseq_cs, 0, __ATOMIC_RELAXED);
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
#endif
}

/* liburcu-bp's: set when its readers may rely on its membarrier (ABI). */
extern int urcu_bp_has_sys_membarrier;

static pthread_once_t runtime_once = PTHREAD_ONCE_INIT;
/* Set once membarrier was refused; fences migrate from then on. */
static bool membarrier_refused;
/* Set once a migration fence was refused too (warned once). */
static bool migration_refused_warned;
/* Set once a fence left adds in flight (internal.h). */
static bool unfenced_adds;
/*
 * When the sections in flight at the fast path's switch-off are taken to
 * have ended (monotonic ns, read after the offset of 0 was published;
 * only raised), 0 while it was never switched off; and the switch-offs
 * between their count's increment, before they publish the offset of 0,
 * and their decrement, after they raised the end: a fence that read the
 * offset as 0 waits for those first (wait_for_sections_at_switch_off()).
 */
static uint64_t switch_off_wait_end_ns;
static unsigned int switch_offs_stamping;
#define SWITCH_OFF_WAIT_NS (10 * 1000 * 1000)
/* Test hook: a switch-off sleeps this long between publish and stamp. */
static unsigned long switch_off_stamp_delay_us;
static const struct percpuref_fork_hooks *fork_hooks[PERCPUREF_NR_RANKS];
static void (*exit_hooks[PERCPUREF_NR_RANKS])(void);
/* Batch locks (by rank bit) this thread holds; see percpuref_batch_lock(). */
static __thread unsigned int batch_ranks_held;
/* Their mutexes, by rank, and how deeply the thread is inside user
 * callbacks run with them released (percpuref_batch_pause()). */
static __thread pthread_mutex_t *batch_mutexes[PERCPUREF_NR_RANKS];
static __thread unsigned int batch_pauses;
/* Confirm callbacks on this thread's stack (percpuref_batch_pin()). */
static __thread unsigned int batch_pins;
/* The batch locks' rank bits. */
#define BATCH_RANKS                                                                        \
	(1u << PERCPUREF_RANK_DEFERRED_BATCH | 1u << PERCPUREF_RANK_POLL_BATCH |           \
	 1u << PERCPUREF_RANK_SCAN)
/* Ranks this thread left alone in fork_prepare(): per thread, as two
 * threads may be inside fork() at once (one waiting for a batch whose
 * callback forks). */
static __thread unsigned int fork_skipped_ranks;
/* Test hook: signals the library's threads leave open ("Signal masks"). */
static sigset_t library_threads_accept;
__thread bool percpuref_library_thread __attribute__((tls_model("initial-exec")));
/*
 * Work queued from outside while a shutdown drains (percpuref_note_work()):
 * by a thread that is neither one of ours nor in a shutdown itself.  The
 * callbacks a shutdown waits for run on our threads or on its own, so
 * what they queue is its own cascade, which it follows to the end; a
 * release run by a user's last put is that user's work.
 */
static unsigned int shutdowns_running;
static unsigned long outside_work;
/* Counts the periods in which some shutdown runs (from none running to
 * one), so that revivals within one are told from revivals in several
 * (percpuref_note_revival()): overlapping shutdowns share a period, so
 * that one thread's shutdowns called back to back do not keep resetting
 * what another's counts. */
static unsigned long shutdown_epoch;
static __thread bool in_shutdown;
static unsigned long warnings;
static long fault_countdown;
/* What the countdown becomes at its refusal: 0 (disarmed) or -1 (every
 * later one refused too).  Written before the countdown, read after it. */
static long fault_then;
static unsigned long fault_refused;
/* Test hook: the CPU count source's answer (0: ask the kernel). */
static unsigned int fault_cpu_units;
/*
 * Fence tickets (percpuref_fence_stamp()): fences started, the highest
 * ticket of a fence that ended, and when the last one started.
 */
static unsigned long fence_tickets;
static unsigned long fence_covered;
static uint64_t fence_last_start_ns;

static int sys_membarrier(int cmd, unsigned int flags)
{
	return (int)syscall(__NR_membarrier, cmd, flags, 0);
}

#define CPU_MASK_BYTES sizeof(struct percpuref_cpu_mask)

static bool cpu_mask_isset(unsigned int cpu, const struct percpuref_cpu_mask *set)
{
	return CPU_ISSET_S(cpu, CPU_MASK_BYTES, (const cpu_set_t *)set->bits);
}

/* The affinity of thread @tid (0: the caller); 0, or -1 with errno set. */
static int cpu_mask_get(pid_t tid, struct percpuref_cpu_mask *set)
{
	return sched_getaffinity(tid, CPU_MASK_BYTES, (cpu_set_t *)set->bits);
}

static int cpu_mask_set(pid_t tid, const struct percpuref_cpu_mask *set)
{
	return sched_setaffinity(tid, CPU_MASK_BYTES, (const cpu_set_t *)set->bits);
}

/* The CPU number @p starts with into *@out, *@end past it; false if none
 * (strtoul() alone would skip blanks and take a sign). */
static bool read_cpu_number(const char *p, char **end, unsigned long *out)
{
	if (*p < '0' || *p > '9')
		return false;
	errno = 0;
	*out = strtoul(p, end, 10);
	return !errno;
}

/*
 * A list of CPUs in the kernel's syntax ("0-191\n", "0,2-5": sysfs masks,
 * cpuset.cpus, taskset -c), into @set unless NULL: the highest CPU id + 1,
 * or 0 when the text is no such list or names a CPU at or above
 * PERCPUREF_MAX_CPUS (a sysfs that lies: a count of 2^32 wrapped and
 * failed every allocation, one of 100000 made every ref cost 400 MB).
 * The kernel's own limit (NR_CPUS) is 8192 at most.  A range may end in
 * a pattern: ":USED/GROUP", the kernel's (bitmap_parselist(), boot
 * parameters and cpuset.cpus: "0-15:2/8" is 0,1,8,9), or ":STRIDE",
 * taskset's ("0-7:2" is 0,2,4,6, as "0-7:1/2"), after a range only, as
 * both read it; one the kernel refuses (GROUP or STRIDE 0 or 2^32 and
 * above, USED above GROUP) or that names no CPU (USED 0) is no list.
 */
PERCPUREF_API unsigned int percpuref_parse_cpu_list(const char *text,
						 struct percpuref_cpu_mask *set)
{
	unsigned long lo, hi, used, group, start, last, cpu, count = 0;
	const char *p = text;
	bool ranged;
	char *end;

	if (set)
		memset(set, 0, sizeof(*set));
	for (;;) {
		if (!read_cpu_number(p, &end, &lo))
			return 0;
		hi = lo;
		ranged = *end == '-';
		if (ranged && !read_cpu_number(end + 1, &end, &hi))
			return 0;
		if (hi < lo || hi >= PERCPUREF_MAX_CPUS)
			return 0;
		used = group = hi - lo + 1;	/* one group: the whole range */
		if (ranged && *end == ':') {
			used = 1;		/* taskset's stride */
			if (!read_cpu_number(end + 1, &end, &group))
				return 0;
			if (*end == '/') {	/* the kernel's USED/GROUP */
				used = group;
				if (!read_cpu_number(end + 1, &end, &group))
					return 0;
			}
			/* The kernel reads 32-bit numbers (taskset
			 * truncates: 2^32 + 1 is a stride of 1 there). */
			if (!used || used > group || group > UINT32_MAX)
				return 0;
		}
		/* Each group's first @used CPUs, up to @hi.  A step of up
		 * to 2^32 - 1 wraps a 32-bit unsigned long: each is compared
		 * with the room left before it is taken. */
		for (start = lo;; start += group) {
			last = hi - start < used ? hi : start + used - 1;
			if (last + 1 > count)
				count = last + 1;
			for (cpu = start; set && cpu <= last; cpu++)
				CPU_SET_S(cpu, CPU_MASK_BYTES, (cpu_set_t *)set->bits);
			if (group > hi - start)
				break;
		}
		if (*end != ',')
			break;
		p = end + 1;
	}
	return *end == '\0' || *end == '\n' ? (unsigned int)count : 0;
}

/*
 * The CPU count from the possible mask's file @f (the whole line: a sparse
 * mask of 8192 CPUs takes 20 KB, and one cut short would read as a smaller
 * count), or 0, warned, when it does not read as such a mask.
 */
PERCPUREF_API unsigned int percpuref_cpu_count_from_file(FILE *f)
{
	unsigned int count = 0;
	size_t size = 0;
	char *text = NULL;

	if (getline(&text, &size, f) > 0) {
		count = percpuref_parse_cpu_list(text, NULL);
		if (!count)
			percpuref_warn("percpuref_runtime_init", "/sys/devices/system/cpu/possible "
				       "reads \"%.*s\", not a list of CPUs below %u; counting CPUs "
				       "with sysconf()", (int)strcspn(text, "\n"), text,
				       PERCPUREF_MAX_CPUS);
	}
	free(text);
	return count;
}

const char *percpuref_getenv(const char *name)
{
	return secure_getenv(name);
}

bool percpuref_env_ulong(const char *who, const char *name, unsigned long max,
			 unsigned long *value)
{
	const char *env = percpuref_getenv(name);
	unsigned long v;
	char *end;

	if (!env || !*env)
		return false;
	errno = 0;
	v = strtoul(env, &end, 10);
	if (errno || *end || *env < '0' || *env > '9') {
		percpuref_warn(who, "%s=\"%s\" is not a number; ignored", name, env);
		return false;
	}
	if (v > max) {
		percpuref_warn(who, "%s=%lu is above %lu; ignored", name, v, max);
		return false;
	}
	*value = v;
	return true;
}

/*
 * Backlogs (internal.h; deferred.c, "Backlog").  The limit is read at the
 * first test.  A stall is BACKLOG_STALL_MS with no item run: an item takes
 * microseconds, a batch of the limit's items seconds.
 */
#define BACKLOG_DEFAULT 65536
#define BACKLOG_MAX (1UL << 30)
#define BACKLOG_STALL_MS 100
#define BACKLOG_LOOK_MS 25
#define BACKLOG_WAIT_MAX_MS 1000
static unsigned long backlog_limit = BACKLOG_DEFAULT;
static pthread_once_t backlog_once = PTHREAD_ONCE_INIT;
/* Confirms and releases this thread is running (percpu_ref.c). */
static __thread unsigned int callbacks_running;

static void read_backlog_limit(void)
{
	unsigned long limit;

	if (percpuref_env_ulong("percpu_ref_kill", "PERCPUREF_CALLBACK_BACKLOG", BACKLOG_MAX,
				&limit))
		backlog_limit = limit;
}

void percpuref_callback_enter(void)
{
	callbacks_running++;
}

void percpuref_callback_leave(void)
{
	callbacks_running--;
}

unsigned long percpuref_backlog_rearm_left(struct percpuref_backlog *b)
{
	/* Relaxed, here and below: hints (internal.h).  rearm_items is 0
	 * but after a stall, so a push reads ran only then. */
	unsigned long rearm = __atomic_load_n(&b->rearm_items, __ATOMIC_RELAXED), since;

	if (!rearm)
		return 0;
	since = __atomic_load_n(&b->ran, __ATOMIC_RELAXED) -
		__atomic_load_n(&b->stalled_at, __ATOMIC_RELAXED);
	return since < rearm ? rearm - since : 0;
}

bool percpuref_backlog_over(struct percpuref_backlog *b, unsigned long queued)
{
	pthread_once(&backlog_once, read_backlog_limit);
	if (!backlog_limit)
		return false;
	/* After a stall, nobody waits until rearm_items more have run
	 * (percpuref_backlog_wait()): a killer that holds the lock its
	 * callbacks take stalls again at once, and re-armed at every batch it
	 * lost 80% of its time; never re-armed before the backlog was down to
	 * half, which a killer faster than the thread never lets it be, one
	 * slow callback turned pacing off for good. */
	if (percpuref_backlog_rearm_left(b))
		return false;
	/* The finished batches' count: up to a batch behind the items run,
	 * which the wait then finds past its target at once.  Signed: done
	 * may be newer than queued.  Relaxed: a hint (internal.h). */
	return (long)(queued - __atomic_load_n(b->done, __ATOMIC_RELAXED)) > (long)backlog_limit;
}

unsigned long percpuref_backlog_stalls(struct percpuref_backlog *b)
{
	unsigned long n;

	pthread_mutex_lock(b->lock);
	n = b->stalls;
	pthread_mutex_unlock(b->lock);
	return n;
}

void percpuref_backlog_wait(struct percpuref_backlog *b, unsigned long queued)
{
	/* Run up to the caller's push but half the limit: what others queue
	 * later cannot keep it waiting. */
	unsigned long target = queued - backlog_limit / 2, ran_before, ran_seen;
	uint64_t start, seen_ns;
	bool stalled = false;
	int cancel;

	if (percpuref_library_thread || callbacks_running || percpuref_in_confirm() ||
	    percpuref_holds_batch_lock() || percpuref_rcu_read_ongoing())
		return;
	cancel = percpuref_cancel_disable();
	start = percpuref_monotonic_ns();
	pthread_mutex_lock(b->lock);
	b->waiting++;
	/* Relaxed, here and in the loop: ran is a position the runner
	 * writes without the lock, compared and never read through: it
	 * paces, and orders nothing. */
	ran_before = ran_seen = __atomic_load_n(&b->ran, __ATOMIC_RELAXED);
	/* After the lock: a wait for it is no stall of the thread. */
	seen_ns = percpuref_monotonic_ns();
	for (;;) {
		unsigned long ran = __atomic_load_n(&b->ran, __ATOMIC_RELAXED);
		uint64_t now = percpuref_monotonic_ns();
		struct timespec deadline;

		/* Its own share only, the limit's items and a second at most
		 * (below): a backlog that unpaced pushes (callbacks',
		 * read-side sections') made larger, or items each of nearly a
		 * stall, kept a paced caller for seconds to hours. */
		if (!b->thread->running || (long)(target - ran) <= 0 ||
		    ran - ran_before >= backlog_limit)
			break;
		/* A stall: no item seen to run for BACKLOG_STALL_MS, judged
		 * by looks BACKLOG_LOOK_MS apart at most, so that within a
		 * wait a stuck item of 125 ms or more shows (but for this
		 * thread's own delays in being scheduled).  A timed wait of
		 * the stall's whole length, restarted whenever an item had
		 * run, missed one of 150 ms that began in the second half of
		 * such a wait (test_backlog, one slow callback: once batches
		 * grew in 0.4.18, the killer was often waiting as it began).
		 * Before the second's cap, which would hide it. */
		if (ran != ran_seen) {
			ran_seen = ran;
			seen_ns = now;
		} else if (now - seen_ns >= BACKLOG_STALL_MS * UINT64_C(1000000)) {
			stalled = true;
			break;
		}
		if (now - start >= BACKLOG_WAIT_MAX_MS * UINT64_C(1000000))
			break;
		/* Woken at each batch's end, or for the next look. */
		percpuref_deadline(&deadline, BACKLOG_LOOK_MS);
		(void)pthread_cond_timedwait(b->progress, b->lock, &deadline);
	}
	if (stalled) {
		/* From one item, the thread back at work after a slow
		 * callback (re-armed only after half the limit's items, the
		 * killer went on unpaced meanwhile and queued a million);
		 * doubled at each stall that follows a re-arm with no wait
		 * between that the thread finished, as for a killer holding
		 * its callbacks' lock: log2 of the items run, stalls of
		 * BACKLOG_STALL_MS. */
		unsigned long rearm = b->rearm_items ? 2 * b->rearm_items : 1;

		/* Relaxed, the stores and the load of ran: hints under
		 * @lock, which pushes read without it
		 * (percpuref_backlog_rearm_left()); stale, they only
		 * change which pushes wait. */
		__atomic_store_n(&b->rearm_items, rearm < BACKLOG_MAX ? rearm : BACKLOG_MAX,
				 __ATOMIC_RELAXED);
		__atomic_store_n(&b->stalled_at, __atomic_load_n(&b->ran, __ATOMIC_RELAXED),
				 __ATOMIC_RELAXED);
		b->stalls++;
	} else {
		/* Relaxed: a hint, as above. */
		__atomic_store_n(&b->rearm_items, 0, __ATOMIC_RELAXED);
	}
	/* Not below 0: a fork child begins at 0 (its hooks), and a fork from
	 * a signal handler that interrupted this wait leaves it to end
	 * there (outside the contract: docs/percpu_ref.md, "fork()"). */
	if (b->waiting)
		b->waiting--;
	pthread_mutex_unlock(b->lock);
	percpuref_cancel_restore(cancel);
}

/* CPU count from the possible mask, else from sysconf(), else 1. */
static unsigned int read_possible_cpus(void)
{
	FILE *f = fopen("/sys/devices/system/cpu/possible", "r");
	unsigned int count = 0;
	long n;

	if (f) {
		count = percpuref_cpu_count_from_file(f);
		fclose(f);
	}
	if (count)
		return count;
	/* Where /sys is hidden.  glibc may read the same file: bounded too. */
	n = sysconf(_SC_NPROCESSORS_CONF);
	return n > 0 && n <= PERCPUREF_MAX_CPUS ? (unsigned int)n : 1;
}

static bool membarrier_rseq_register(void)
{
	int cmds = sys_membarrier(MEMBARRIER_CMD_QUERY, 0);

	if (cmds < 0 || !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ))
		return false;
	return sys_membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ, 0) == 0;
}

void percpuref_register_fork_hooks(const struct percpuref_fork_hooks *hooks)
{
	/* One module per rank, so the order between any two is written. */
	assert(hooks->rank < PERCPUREF_NR_RANKS && !fork_hooks[hooks->rank]);
	fork_hooks[hooks->rank] = hooks;
}

void percpuref_register_exit_hook(enum percpuref_lock_rank rank, void (*fn)(void))
{
	assert(rank < PERCPUREF_NR_RANKS && !exit_hooks[rank]);
	exit_hooks[rank] = fn;
}

static void batch_lock(enum percpuref_lock_rank rank, pthread_mutex_t *lock)
{
	/* Debug builds check the written order: no lower rank after. */
	assert(!(batch_ranks_held >> rank));
	pthread_mutex_lock(lock);
	batch_ranks_held |= 1u << rank;
	batch_mutexes[rank] = lock;
}

static void batch_unlock(enum percpuref_lock_rank rank, pthread_mutex_t *lock)
{
	batch_ranks_held &= ~(1u << rank);
	batch_mutexes[rank] = NULL;
	pthread_mutex_unlock(lock);
}

void percpuref_batch_begin(struct percpuref_batch *b)
{
	batch_lock(b->rank, &b->lock);
	while (b->running)
		pthread_cond_wait(&b->idle, &b->lock);
	b->running = true;
}

bool percpuref_batch_try_begin(struct percpuref_batch *b)
{
	batch_lock(b->rank, &b->lock);
	if (b->running) {
		batch_unlock(b->rank, &b->lock);
		return false;
	}
	b->running = true;
	return true;
}

void percpuref_batch_end(struct percpuref_batch *b)
{
	b->running = false;
	pthread_cond_broadcast(&b->idle);
	batch_unlock(b->rank, &b->lock);
}

void percpuref_batch_fork_prepare(struct percpuref_batch *b)
{
	batch_lock(b->rank, &b->lock);
}

void percpuref_batch_fork_parent(struct percpuref_batch *b)
{
	batch_unlock(b->rank, &b->lock);
}

void percpuref_batch_fork_child(struct percpuref_batch *b)
{
	/* A runner paused in a @release at the fork does not exist here
	 * (what it had left is the module's to requeue), nor do the
	 * parent's waiters on @idle. */
	b->running = false;
	pthread_cond_init(&b->idle, NULL);
	batch_unlock(b->rank, &b->lock);
}

bool percpuref_batch_fork_took(const struct percpuref_batch *b)
{
	return !(fork_skipped_ranks & (1u << b->rank));
}

void percpuref_batch_pause(void)
{
	unsigned int rank;

	/* Nested (a release inside a release): the outermost pause did it.
	 * Pinned: a switch is half done on our stack, the lock stays. */
	if (!batch_ranks_held || batch_pins || batch_pauses++)
		return;
	for (rank = PERCPUREF_NR_RANKS; rank-- > 0;)
		if (batch_ranks_held & (1u << rank))
			pthread_mutex_unlock(batch_mutexes[rank]);
}

void percpuref_batch_resume(void)
{
	unsigned int rank;

	if (!batch_ranks_held || batch_pins || --batch_pauses)
		return;
	for (rank = 0; rank < PERCPUREF_NR_RANKS; rank++)
		if (batch_ranks_held & (1u << rank))
			pthread_mutex_lock(batch_mutexes[rank]);
}

void percpuref_batch_pin(void)
{
	batch_pins++;
}

void percpuref_batch_unpin(void)
{
	batch_pins--;
}

unsigned int percpuref_batch_pins_take(void)
{
	unsigned int pins = batch_pins;

	batch_pins = 0;
	return pins;
}

void percpuref_batch_pins_restore(unsigned int pins)
{
	batch_pins = pins;
}

bool percpuref_holds_batch_lock(void)
{
	return batch_ranks_held != 0;
}

bool percpuref_in_confirm(void)
{
	return batch_pins != 0;
}

/* Whether pthread_atfork() took fork_prepare() and the others: 0 not
 * yet, FORK_HANDLERS_REGISTERED, or the pid of the process one of whose
 * threads is registering them (percpuref_fork_handlers_registered()). */
#define FORK_HANDLERS_REGISTERED (-1)
static int fork_handlers;
static bool fork_handlers_refusal_warned;

static void fork_prepare(void)
{
	unsigned int rank;

	/*
	 * A callback that forks holds its own batch lock.  It leaves every
	 * batch lock alone, not only its own: the other one may rank below it,
	 * and the other library thread's callback may be forking too, waiting
	 * for ours.  So such a fork does not wait for the other thread's batch
	 * in flight; its child may only exec or _exit (docs/percpu_ref.md).
	 * A fork inside a liburcu-bp read-side section leaves the scan batch
	 * and liburcu's locks alone: a grace period holds both while it waits
	 * for this very section (an RCU batch of the reclaimer's).  Its child
	 * may only exec or _exit too.
	 */
	fork_skipped_ranks = batch_ranks_held ? BATCH_RANKS : 0;
	if (percpuref_rcu_read_ongoing())
		fork_skipped_ranks |= 1u << PERCPUREF_RANK_SCAN | 1u << PERCPUREF_RANK_URCU;
	/*
	 * A fork from a signal handler that interrupted a get or put of this
	 * thread inside its fallback read-side section (the library calls
	 * nothing from inside one): every reader fence in flight waits for
	 * that section, which cannot end before the handler returns, and
	 * holds what fork would wait for (the readers' lock, the sync-switch
	 * lock, a batch lock; liburcu's, through a reader that fences inside
	 * its read-side section), so the fork and the fence waited for each
	 * other for ever (tests/unit/test_fallback_edges.c, handler-fork).
	 * It leaves every rank alone, waits for none of them, and its child
	 * may only exec or _exit, as one forked from a callback.
	 */
	if (percpuref_reader_interrupted())
		fork_skipped_ranks = ~0u;
	for (rank = 0; rank < PERCPUREF_NR_RANKS; rank++)
		if (fork_hooks[rank] && fork_hooks[rank]->prepare &&
		    !(fork_skipped_ranks & (1u << rank)))
			fork_hooks[rank]->prepare();
}

static void fork_parent(void)
{
	unsigned int rank;

	for (rank = PERCPUREF_NR_RANKS; rank-- > 0;)
		if (fork_hooks[rank] && fork_hooks[rank]->parent &&
		    !(fork_skipped_ranks & (1u << rank)))
			fork_hooks[rank]->parent();
}

/*
 * Forks this process descends from since the library was loaded in an
 * ancestor (percpuref_fork_generation()).  Written only by fork_child(),
 * while the child has one thread; relaxed: a number, inherited whole.
 */
static unsigned long fork_generation;

PERCPUREF_API unsigned long percpuref_fork_generation(void)
{
	return __atomic_load_n(&fork_generation, __ATOMIC_RELAXED);
}

/*
 * Set by the first run of runtime_at_exit() that runs the exit hooks (not
 * one on a library thread, inside a batch or an RCU read-side section:
 * nothing may wait for the exiting thread there), never cleared but in a
 * fork child of another thread (review 174).  exiting_here: on the thread
 * that ran it, which goes on to the static destructors and the atexit()
 * handlers registered before our first use (percpuref_exit_began(),
 * percpuref_exiting_thread()).
 */
static bool exit_began;
static __thread bool exiting_here __attribute__((tls_model("initial-exec")));

bool percpuref_exit_began(void)
{
	/* Relaxed: see runtime_at_exit(). */
	return __atomic_load_n(&exit_began, __ATOMIC_RELAXED);
}

__thread bool percpuref_exit_rcu_role __attribute__((tls_model("initial-exec")));

/* No batch lock held, or only the scan batch that this thread's exit took
 * for a percpu_rcuref's @release (percpuref_run_after_rcu_here()), paused
 * around that @release: what the @release kills or lets go of is the
 * exit's too, and so is what a confirm it runs (pinned) lets go of
 * (reviews 177 and 178: queued, for after the older globals). */
bool percpuref_exiting_thread(void)
{
	return exiting_here && !percpuref_rcu_read_ongoing() &&
	       (!percpuref_holds_batch_lock() ||
		(percpuref_exit_rcu_role &&
		 batch_ranks_held == 1u << PERCPUREF_RANK_SCAN));
}

static void fork_child(void)
{
	unsigned int rank;

	/* First: the hooks below may start threads that run the parent's
	 * queued work, and callers tell the parent's objects by it.
	 * Relaxed: the child has one thread here; any other starts after
	 * this store (pthread_create()). */
	__atomic_store_n(&fork_generation, fork_generation + 1, __ATOMIC_RELAXED);
	/* This handler runs, so the handlers are registered, whatever the
	 * parent's registering thread had stored yet.  Relaxed: one thread. */
	__atomic_store_n(&fork_handlers, FORK_HANDLERS_REGISTERED, __ATOMIC_RELAXED);
	/* A child of a thread that does not run the exit is no exit's: it
	 * runs on (review 174).  Relaxed: one thread. */
	__atomic_store_n(&exit_began, exiting_here, __ATOMIC_RELAXED);

	/* Re-register for the child's mm; harmless if it was inherited. */
	if (percpuref_rseq_offset && !membarrier_refused && !membarrier_rseq_register())
		publish_fast_path(0, __ATOMIC_RELAXED);
	percpuref_rseq_after_fork_child();
	/* A switch-off another thread was stamping stamps nothing here, and
	 * this thread, the only one, has no section in flight: fences need
	 * not wait for it (they waited for ever). */
	switch_offs_stamping = 0;
	/* Of the parent's shutdowns, only this thread's (a callback of its
	 * that forked) goes on here. */
	shutdowns_running = in_shutdown;
	/* Only if the parent was set up (units counted): a child forked
	 * before that sets itself up later, units and all.  A parent on the
	 * fallback path had its units, which the child keeps
	 * (readers_fork_child()), its membarrier probed again here; one whose
	 * rseq fast path was switched off (no membarrier, no migration) had
	 * none, its threads counting without a unit: the child gets units
	 * (one a CPU), fenced as this probe finds membarrier. */
	if (!percpuref_rseq_offset && percpuref_nr_cpu_units)
		percpuref_readers_setup(percpuref_nr_cpu_units);
	for (rank = PERCPUREF_NR_RANKS; rank-- > 0;)
		if (fork_hooks[rank] && fork_hooks[rank]->child &&
		    !(fork_skipped_ranks & (1u << rank)))
			fork_hooks[rank]->child();
}

/*
 * One migration fence at a time: one that read, through /proc, another's
 * passing affinity (widened, or on a CPU out of its reach) refused
 * spuriously, and a refusal turns the fast path off for good.  A set of
 * the library's threads' CPUs holds it too: a fence on a library thread
 * restores the affinity it saved, which would undo a set made meanwhile.
 * Rank MIGRATION: its holders take no other library lock but the next.
 */
static pthread_mutex_t migration_lock = PTHREAD_MUTEX_INITIALIZER;

/*
 * The library's threads and the CPUs chosen for them ("Placement" at the
 * top), under library_threads_lock (rank LIBRARY_THREADS, last: a leaf).
 * Not the migration lock: a thread that starts or ends waits for no fence.
 */
static pthread_mutex_t library_threads_lock = PTHREAD_MUTEX_INITIALIZER;

/* A library thread, listed from its start to its end. */
struct library_thread_node {
	pid_t tid;
	int inherited_err;		/* 0, or why inherited could not be read */
	struct percpuref_cpu_mask inherited;	/* its affinity at its start */
	struct percpuref_cpu_mask before;	/* before the set in progress moved it */
	struct library_thread_node *prev, *next;
};

static struct library_thread_node library_threads = {
	.prev = &library_threads,
	.next = &library_threads,
};
/* This thread's node while it is a listed library thread. */
static __thread struct library_thread_node *own_library_node;
/* The CPUs chosen for the library's threads, if chosen. */
static struct percpuref_cpu_mask library_cpus;
static bool library_cpus_chosen;
/* A start that could not take them has warned since they were chosen. */
static bool library_cpus_warned;

static void library_threads_link(struct library_thread_node *node)
{
	node->next = &library_threads;
	node->prev = library_threads.prev;
	library_threads.prev->next = node;
	library_threads.prev = node;
}

/*
 * A library thread's first step: listed, it takes the chosen CPUs, if
 * any.  After the start-up post (percpuref_wait_thread_started()): a
 * fork's prepare hook may hold the lock while this thread waits for it,
 * never the other way round.  A set that ran meanwhile chose what is read
 * here, under the lock.
 */
static void library_thread_enter(struct library_thread_node *node)
{
	int err = 0;

	node->tid = (pid_t)syscall(SYS_gettid);
	node->inherited_err = cpu_mask_get(0, &node->inherited) ? errno : 0;
	pthread_mutex_lock(&library_threads_lock);
	library_threads_link(node);
	own_library_node = node;
	if (library_cpus_chosen && cpu_mask_set(0, &library_cpus) && !library_cpus_warned) {
		err = errno;
		library_cpus_warned = true;
	}
	pthread_mutex_unlock(&library_threads_lock);
	if (err)
		percpuref_warn(NULL, "a library thread cannot run on the CPUs chosen for them "
			       "(percpuref_set_library_cpus(), PERCPUREF_LIBRARY_CPUS): %s; it runs "
			       "where it started", strerror(err));
}

/* Its last step, by return or pthread_exit(): never listed dead, so a
 * set never reaches a thread id the kernel may have given to another. */
static void library_thread_leave(void *arg)
{
	struct library_thread_node *node = arg;

	pthread_mutex_lock(&library_threads_lock);
	node->prev->next = node->next;
	node->next->prev = node->prev;
	own_library_node = NULL;
	pthread_mutex_unlock(&library_threads_lock);
}

PERCPUREF_API int percpuref_set_library_cpus(const char *cpus)
{
	struct library_thread_node *node, *moved_up_to;
	struct percpuref_cpu_mask chosen;
	int err = 0, undo_err = 0;

	if (cpus && !percpuref_parse_cpu_list(cpus, &chosen))
		return -EINVAL;
	/* The environment's choice is read there: a call overrides it. */
	percpuref_runtime_init();
	pthread_mutex_lock(&migration_lock);
	pthread_mutex_lock(&library_threads_lock);
	/* Back to where they started needs every start known: else none moves. */
	for (node = library_threads.next; !cpus && node != &library_threads; node = node->next)
		if (node->inherited_err)
			err = node->inherited_err;
	/* The threads before moved_up_to have moved. */
	moved_up_to = library_threads.next;
	for (node = library_threads.next; !err && node != &library_threads; node = node->next) {
		if (cpu_mask_get(node->tid, &node->before) ||
		    cpu_mask_set(node->tid, cpus ? &chosen : &node->inherited)) {
			err = errno;
			moved_up_to = node;
		}
	}
	/* All or nothing: those go back. */
	for (node = library_threads.next; err && node != moved_up_to; node = node->next)
		if (cpu_mask_set(node->tid, &node->before))
			undo_err = errno;
	if (!err) {
		library_cpus_chosen = cpus != NULL;
		if (cpus)
			library_cpus = chosen;
		library_cpus_warned = false;
	}
	pthread_mutex_unlock(&library_threads_lock);
	pthread_mutex_unlock(&migration_lock);
	if (undo_err)
		percpuref_warn("percpuref_set_library_cpus", "a library thread moved by this "
			       "refused call cannot move back (%s)", strerror(undo_err));
	return -err;
}

PERCPUREF_API unsigned int percpuref_test_library_threads_listed(void)
{
	const struct library_thread_node *node;
	unsigned int n = 0;

	pthread_mutex_lock(&library_threads_lock);
	for (node = library_threads.next; node != &library_threads; node = node->next)
		n++;
	pthread_mutex_unlock(&library_threads_lock);
	return n;
}

/* PERCPUREF_LIBRARY_CPUS, at set-up: before any library thread exists. */
static void library_cpus_from_env(void)
{
	const char *env = percpuref_getenv("PERCPUREF_LIBRARY_CPUS");
	struct percpuref_cpu_mask chosen;

	if (!env || !*env)
		return;
	if (!percpuref_parse_cpu_list(env, &chosen)) {
		percpuref_warn(NULL, "PERCPUREF_LIBRARY_CPUS=\"%s\" is not a list of CPUs "
			       "below %u; ignored", env, PERCPUREF_MAX_CPUS);
		return;
	}
	pthread_mutex_lock(&library_threads_lock);
	library_cpus = chosen;
	library_cpus_chosen = true;
	pthread_mutex_unlock(&library_threads_lock);
}

static void migration_fork_lock(void)
{
	pthread_mutex_lock(&migration_lock);
}

static void migration_fork_unlock(void)
{
	pthread_mutex_unlock(&migration_lock);
}

static void library_threads_fork_lock(void)
{
	pthread_mutex_lock(&library_threads_lock);
}

static void library_threads_fork_parent(void)
{
	pthread_mutex_unlock(&library_threads_lock);
}

/*
 * The parent's library threads do not exist here: a set must not reach
 * their ids, which name the parent's threads (the same user may move
 * those).  A library thread that forked (from a callback) goes on here
 * as one, under its new id.
 */
static void library_threads_fork_child(void)
{
	library_threads.next = library_threads.prev = &library_threads;
	if (own_library_node) {
		own_library_node->tid = (pid_t)syscall(SYS_gettid);
		library_threads_link(own_library_node);
	}
	pthread_mutex_unlock(&library_threads_lock);
}

static const struct percpuref_fork_hooks urcu_fork_hooks = {
	.rank = PERCPUREF_RANK_URCU,
	.prepare = urcu_bp_before_fork,
	.parent = urcu_bp_after_fork_parent,
	.child = urcu_bp_after_fork_child,
};

static const struct percpuref_fork_hooks migration_fork_hooks = {
	.rank = PERCPUREF_RANK_MIGRATION,
	.prepare = migration_fork_lock,
	.parent = migration_fork_unlock,
	.child = migration_fork_unlock,
};

static const struct percpuref_fork_hooks library_threads_fork_hooks = {
	.rank = PERCPUREF_RANK_LIBRARY_THREADS,
	.prepare = library_threads_fork_lock,
	.parent = library_threads_fork_parent,
	.child = library_threads_fork_child,
};

/*
 * pthread_atfork() can fail (ENOMEM, its only error).  Up to 0.4.30 the
 * library went on without its fork handlers, silently, and a fork child
 * waited for ever for the parent's callback thread.  Now neither a ref
 * nor a library thread is made before they are registered: the load
 * tries, and while refused each percpu_ref_init() and each thread start
 * tries again; the init fails with -ENOMEM, and the start as a refused
 * pthread_create() does (its work done by whoever waits for it: a flush
 * with no ref started the reclaimer, a review found).  The refusal is
 * warned once.  One registration at a time, without a lock a fork could
 * leave taken: a caller that finds another thread registering fails too
 * (only after a refusal at load).  The claim is the claiming process's
 * pid: a fork child that inherited a claim its parent's thread held,
 * which has no such thread, takes it over (a review found such a child
 * refused for ever).  A fork child whose handlers ran reads them
 * registered (fork_child()).  tests/unit/test_atfork_refused.c.
 */
bool percpuref_fork_handlers_registered(void)
{
	int self, state, err;

	/* Acquire: pairs with the release store below; nothing is read
	 * under it but the answer. */
	state = __atomic_load_n(&fork_handlers, __ATOMIC_ACQUIRE);
	if (state == FORK_HANDLERS_REGISTERED)
		return true;
	self = getpid();
	do {
		if (state == FORK_HANDLERS_REGISTERED)
			return true;
		/* Another thread of this process registers them. */
		if (state == self)
			return false;
		/* Claims the one registration: unclaimed, or claimed in the
		 * parent of this fork child.  Acquire, as the load above, for
		 * a failure that reads them registered. */
	} while (!__atomic_compare_exchange_n(&fork_handlers, &state, self, false,
					      __ATOMIC_ACQUIRE, __ATOMIC_ACQUIRE));
	err = pthread_atfork(fork_prepare, fork_parent, fork_child);
	/* Relaxed: one warning, whichever thread gives it. */
	if (err && !__atomic_exchange_n(&fork_handlers_refusal_warned, true, __ATOMIC_RELAXED))
		percpuref_warn(NULL, "pthread_atfork refused (%s): no ref or library thread "
			       "can be made until the fork handlers are registered (each init "
			       "and thread start tries again)", strerror(err));
	/* Release: the registration before the answer. */
	__atomic_store_n(&fork_handlers, err ? 0 : FORK_HANDLERS_REGISTERED, __ATOMIC_RELEASE);
	return !err;
}

static __attribute__((constructor)) void runtime_register(void)
{
	percpuref_register_fork_hooks(&urcu_fork_hooks);
	percpuref_register_fork_hooks(&migration_fork_hooks);
	percpuref_register_fork_hooks(&library_threads_fork_hooks);
	(void)percpuref_fork_handlers_registered();
}

/*
 * Process exit: the modules' exit hooks, unless waiting for our threads
 * would hang (see percpuref_register_exit_hook()).  Run twice: registered
 * with atexit() at the library's first use, so that exit() runs them
 * before the destructors of the static objects that existed by then (C++
 * globals, registered earlier, run later): a release still pending at
 * exit (an owner killed as main() returns, a managed object dropped) may
 * use them.  As an ELF destructor only, they ran after every static
 * destructor, and such a release wrote into destroyed globals
 * (tests/cxx/test_exit_order.cpp).  And as the ELF destructor still, for
 * the work those later destructors queue (their kills start our threads
 * again), and for a process where atexit() was refused.
 */
static __attribute__((destructor)) void runtime_at_exit(void)
{
	unsigned int rank;

	if (percpuref_library_thread || percpuref_rcu_read_ongoing())
		return;
	/* Not from a callback that a poll or a wait runs: its batch stays
	 * held, and a thread that waits on it would wait for the exit (review
	 * 174).  Relaxed: read by this thread, and by the scans after it
	 * (ordered by the scan lock when they are this thread's, a hint for
	 * the reclaimer's: a scan that reads it late converts nothing). */
	if (!percpuref_holds_batch_lock()) {
		exiting_here = true;
		__atomic_store_n(&exit_began, true, __ATOMIC_RELAXED);
	}
	for (rank = PERCPUREF_NR_RANKS; rank-- > 0;)
		if (exit_hooks[rank])
			exit_hooks[rank]();
}

/*
 * Under valgrind, whatever the tool: it preloads its core
 * (vgpreload_core-ARCH-OS.so) into every dynamically linked client.  Its
 * RUNNING_ON_VALGRIND needs <valgrind/valgrind.h> where the library is
 * built, and a build without it kept spares under valgrind; the loaded
 * object is found wherever the library was built, and stays loaded when
 * the program clears LD_PRELOAD, which names it too.
 */
static bool valgrind_core_loaded;

static int is_valgrind_core(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)size;
	(void)data;
	return info->dlpi_name && strstr(info->dlpi_name, "/vgpreload_core-") != NULL;
}

bool percpuref_under_valgrind(void)
{
	percpuref_runtime_init();
	return valgrind_core_loaded;
}

static void runtime_init_once(void)
{
	const char *no_rseq = percpuref_getenv("PERCPUREF_NO_RSEQ");
	ptrdiff_t offset = 0;
	/* Reading sysfs (stdio) is a cancellation point. */
	int cancel = percpuref_cancel_disable();

	library_cpus_from_env();
	valgrind_core_loaded = dl_iterate_phdr(is_valgrind_core, NULL) != 0;
	/* Before anything can be pending: see runtime_at_exit(). */
	if (atexit(runtime_at_exit))
		percpuref_warn(NULL, "atexit refused: releases pending at exit run after "
			       "the static destructors");

	/* Before the fast path can be used: it checks cpu_id against it. */
	nr_cpu_ids = fault_cpu_units ? fault_cpu_units : read_possible_cpus();
	percpuref_nr_cpu_units = nr_cpu_ids;
	if (!(no_rseq && *no_rseq && strcmp(no_rseq, "0")))
		offset = percpuref_rseq_choose();
	/* The params word holds 32 bits of it; TLS offsets are far smaller. */
	if (offset && (offset != (int32_t)offset || !membarrier_rseq_register())) {
		percpuref_rseq_abandon();
		offset = 0;
	}
	if (!offset) {
		/* Fallback readers own a unit each: room for two per CPU
		 * before threads count without one. */
		percpuref_nr_cpu_units *= PERCPUREF_READER_UNITS_PER_CPU;
		percpuref_readers_setup(percpuref_nr_cpu_units);
	}
	/* Relaxed: published to other threads with the first counter. */
	publish_fast_path(offset, __ATOMIC_RELAXED);
	percpuref_cancel_restore(cancel);
}

void percpuref_runtime_init(void)
{
	pthread_once(&runtime_once, runtime_init_once);
}

unsigned int percpuref_nr_units(void)
{
	percpuref_runtime_init();
	return percpuref_nr_cpu_units;
}

unsigned int percpuref_nr_cpus(void)
{
	percpuref_runtime_init();
	return nr_cpu_ids;
}

/*
 * Adds to @used the CPUs every thread of the process may run on.  False,
 * errno set, when /proc cannot list them (a chroot, a full fd table), or
 * lists ids of another pid namespace (a /proc mounted outside ours: every
 * id would read as an exited thread); the caller's own id is the check.
 */
static bool add_threads_cpus(struct percpuref_cpu_mask *used)
{
	DIR *dir = opendir("/proc/self/task");
	pid_t self = (pid_t)syscall(SYS_gettid);
	bool self_listed = false;
	struct percpuref_cpu_mask one;
	struct dirent *d;
	int err;

	if (!dir)
		return false;
	for (errno = 0; (d = readdir(dir)); errno = 0) {
		long tid = strtol(d->d_name, NULL, 10);

		self_listed |= tid == self;
		/* A thread that exited meanwhile (ESRCH) runs nowhere. */
		if (tid > 0 && cpu_mask_get((pid_t)tid, &one) == 0)
			for (size_t i = 0; i < sizeof(one.bits) / sizeof(one.bits[0]); i++)
				used->bits[i] |= one.bits[i];
	}
	err = errno ? errno : self_listed ? 0 : ESRCH;	/* ESRCH: foreign ids */
	closedir(dir);
	errno = err;
	return !err;
}

/*
 * The refused-membarrier fence: run on every CPU in turn (see the top).
 * Which CPUs: every CPU a thread of the process may run on (each thread's
 * affinity, read through /proc/self/task, which already leaves out CPUs
 * outside that thread's cpuset or offline), and every CPU this thread may
 * be given (its affinity widened to all CPUs, then read back); never a
 * count of ours, which may be too low (sysfs).  A CPU some thread may use
 * but this one may not (threads in different cpusets: cgroup v1, or v2's
 * threaded subtrees), one that leaves this thread's cpuset during the
 * fence, or CPUs that cannot be listed (no /proc) cannot be fenced this
 * way: the fence is refused, and its caller turns the fast path off.
 * The thread's affinity is restored; one that covered its whole cpuset is
 * restored as "every CPU", so that a cpuset narrowed during the fence and
 * widened later widens it again (restoring the narrowed mask would have
 * made it the thread's request for good).
 * Returns the number of CPUs run on, or -1 when the fence was refused.
 */
static int fence_by_migration_locked(void)
{
	struct percpuref_cpu_mask saved, every, reach, used = { { 0 } }, one;
	int visited = 0, err = 0;

	memset(&every, 0xff, sizeof(every));
	if (cpu_mask_get(0, &saved))
		return -1;
	if (cpu_mask_set(0, &every) || cpu_mask_get(0, &reach)) {
		err = errno;
		cpu_mask_set(0, &saved);
		errno = err;
		return -1;
	}
	/* Without the list, a thread in another cpuset would go unseen. */
	if (!add_threads_cpus(&used))
		err = errno ? errno : ENOENT;
	for (unsigned int cpu = 0; cpu < PERCPUREF_MAX_CPUS && !err; cpu++) {
		if (!cpu_mask_isset(cpu, &reach)) {
			if (cpu_mask_isset(cpu, &used))
				err = EINVAL;	/* what a move there would get */
			continue;
		}
		memset(&one, 0, sizeof(one));
		CPU_SET_S(cpu, CPU_MASK_BYTES, (cpu_set_t *)one.bits);
		if (cpu_mask_set(0, &one) == 0) {
			/* The kernel moves the caller before the call returns;
			 * a sandbox may answer 0 and move nothing, which fences
			 * nothing: a move not made is a move refused (a CPU
			 * that went offline in between too, conservatively). */
			if (sched_getcpu() != (int)cpu)
				err = EPERM;
			else
				visited++;
		/* EINVAL: the CPU went offline, or left this thread's cpuset
		 * meanwhile; only one no thread may use can be skipped. */
		} else if (errno != EINVAL || cpu_mask_isset(cpu, &used)) {
			err = errno;
		}
	}
	if (!memcmp(&saved, &reach, sizeof(saved)) || cpu_mask_set(0, &saved))
		cpu_mask_set(0, &every);
	if (err) {
		errno = err;
		return -1;
	}
	return visited;
}

int percpuref_fence_by_migration(void)
{
	int ret;

	pthread_mutex_lock(&migration_lock);
	ret = fence_by_migration_locked();
	pthread_mutex_unlock(&migration_lock);
	return ret;
}

/*
 * Sleeps until the sections in flight at the switch-off have had their
 * time: once no switch-off is between its publish and its stamp, until
 * the end, one sleep of at most SWITCH_OFF_WAIT_NS (a clock that went
 * back, a fork child's new time namespace, cannot make it longer).
 */
static void wait_for_sections_at_switch_off(void)
{
	unsigned long tries = 0;
	uint64_t end;
	int64_t left;

	/* Acquire: pairs with the decrement's release, after the stamp; the
	 * caller's acquire load of the offset ordered the increment. */
	while (__atomic_load_n(&switch_offs_stamping, __ATOMIC_ACQUIRE))
		percpuref_yield_or_nap(++tries);
	end = __atomic_load_n(&switch_off_wait_end_ns, __ATOMIC_RELAXED);
	/* Never switched off (every fence of a process on the fallback
	 * path comes here): no clock read. */
	if (!end)
		return;
	left = (int64_t)(end - percpuref_monotonic_ns());
	if (left > 0)
		percpuref_sleep_us((unsigned long)((left < SWITCH_OFF_WAIT_NS ? left
									: SWITCH_OFF_WAIT_NS) + 999) / 1000);
}

/* Switches the fast path off, with the end of the wait for its sections. */
static void switch_fast_path_off(void)
{
	/* Relaxed: set by a test before the switch-off. */
	unsigned long delay_us = __atomic_load_n(&switch_off_stamp_delay_us, __ATOMIC_RELAXED);
	uint64_t end, seen;

	/* Seq_cst, then the offset's seq_cst store: a fence that reads the
	 * offset as 0 (acquire) sees the switch-off stamping. */
	__atomic_add_fetch(&switch_offs_stamping, 1, __ATOMIC_SEQ_CST);
	publish_fast_path(0, __ATOMIC_SEQ_CST);
	if (delay_us)
		percpuref_sleep_us(delay_us);
	/* Read after the publish: the sections in flight then get all of it. */
	end = percpuref_monotonic_ns() + SWITCH_OFF_WAIT_NS;
	seen = __atomic_load_n(&switch_off_wait_end_ns, __ATOMIC_RELAXED);
	/* Relaxed: the decrement below releases it.  Raised only: a
	 * switch-off beside this one may have stamped a later end. */
	while ((int64_t)(end - seen) > 0 &&
	       !__atomic_compare_exchange_n(&switch_off_wait_end_ns, &seen, end, true,
					    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
	/* Release: the end before the count that lets fences read it. */
	__atomic_sub_fetch(&switch_offs_stamping, 1, __ATOMIC_RELEASE);
}

void percpuref_fence_without_membarrier(int err)
{
	/* Relaxed: set once at start-up; 0 only in a process without rseq,
	 * or after a switch-off, which follows this function's first call. */
	bool rseq = __atomic_load_n(&percpuref_rseq_offset, __ATOMIC_RELAXED) != 0;

	/* Relaxed: a flag; fences read it to skip the doomed syscall.  With
	 * rseq every fence runs on every CPU from now on.  Without, only
	 * those that meet the refusal do, for the sections in flight: the
	 * fallback readers' first fence to meet it (fallback.c, "The flip")
	 * and liburcu-bp's switch (percpuref_synchronize_rcu()); the readers
	 * of both fence themselves from then on. */
	if (!__atomic_exchange_n(&membarrier_refused, true, __ATOMIC_RELAXED))
		percpuref_warn("percpuref_fence_readers", "membarrier refused (%s); %s",
			       strerror(err),
			       rseq ? "fencing by running on every CPU from now on"
				    : "the fences that meet it run on every CPU for the "
				      "sections in flight, and readers fence themselves from then on");
	if (percpuref_fence_by_migration() < 0) {
		/* Nothing left that aborts an rseq section elsewhere: send new
		 * calls to the fallback and give sections in flight (a few
		 * instructions) time to end.  Warned once: exactness is at
		 * stake.  Without rseq there is no fast path to switch off:
		 * only the sections in flight get the time. */
		int move_err = errno;

		/* Relaxed: a warn-once flag, nothing read through it. */
		if (!__atomic_exchange_n(&migration_refused_warned, true, __ATOMIC_RELAXED))
			percpuref_warn("percpuref_fence_readers",
				       "cannot run on every CPU either (%s); %s", strerror(move_err),
				       rseq ? "per-CPU fast path disabled"
					    : "sections in flight are given 10 ms");
		percpuref_note_unfenced_adds();
		switch_fast_path_off();
		wait_for_sections_at_switch_off();
	}
}

PERCPUREF_API void percpuref_test_switch_off_stamp_delay(unsigned long us)
{
	/* Relaxed: a test's setting, made before the switch-off it delays
	 * (the test orders it: same thread, or before pthread_create()). */
	__atomic_store_n(&switch_off_stamp_delay_us, us, __ATOMIC_RELAXED);
}

void percpuref_note_unfenced_adds(void)
{
	/* Relaxed: set before the fence returns, so before the fold and
	 * free of any slot it fenced (internal.h). */
	__atomic_store_n(&unfenced_adds, true, __ATOMIC_RELAXED);
}

PERCPUREF_API bool percpuref_unfenced_adds_possible(void)
{
	/* Relaxed: whatever hands a slot on after its fence (alloc_lock,
	 * the switch lock, this thread) orders the flag with it
	 * (internal.h). */
	return __atomic_load_n(&unfenced_adds, __ATOMIC_RELAXED);
}

/*
 * urcu_bp_read_ongoing() registers a thread liburcu-bp does not know,
 * which allocates and blocks signals, and liburcu-bp aborts the process
 * where either fails: the checks before a wait (a flush, a barrier, a
 * fork, the exit) ended in SIGABRT where memory ran out, on threads that
 * never read under RCU (tests/unit/test_urcu_unregistered.c).  A thread
 * liburcu-bp never registered is in no read-side section: its reader
 * pointer, liburcu-bp's exported TLS that its inline read_lock() tests
 * (urcu/static/urcu-bp.h), is NULL.  Declared here: the rest of that
 * header is for _LGPL_SOURCE builds.
 */
struct urcu_bp_reader;
extern DECLARE_URCU_TLS(struct urcu_bp_reader *, urcu_bp_reader);

bool percpuref_rcu_read_ongoing(void)
{
	/* Plain load: the thread's own variable, written by its own
	 * registration. */
	return URCU_TLS(urcu_bp_reader) && urcu_bp_read_ongoing();
}

/*
 * Both fences reach cancellation points: liburcu-bp's grace period polls,
 * a refused fence sleeps, and opendir() and readdir() may be ones (POSIX).
 * A caller's thread is then halfway through a switch, and on the fallback
 * path holds readers_lock: see percpuref_cancel_disable().
 */
void percpuref_synchronize_rcu(void)
{
	int cancel = percpuref_cancel_disable();

	/* Relaxed: liburcu-bp reads it the same way. */
	if (__atomic_load_n(&urcu_bp_has_sys_membarrier, __ATOMIC_RELAXED) &&
	    sys_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) != 0) {
		/* liburcu-bp would abort on its own membarrier.  Its readers
		 * then take a full barrier; the migration fence orders those
		 * that read the old setting, as the membarrier would have.
		 * A grace period that is not ours (the program's own, or
		 * liburcu-bp's call_rcu worker's) may read the new setting
		 * before the migration has reached those readers and miss
		 * one (tests/model/flip.pml, -DURCU; docs/percpu_ref.md,
		 * "seccomp after start-up").  Holding liburcu-bp's locks
		 * across the flip (urcu_bp_before_fork()) closes that window
		 * but deadlocks: with its registry lock held, the warnings'
		 * stderr, the migration's malloc and migration_lock wait for
		 * threads whose first read-side section waits for that lock
		 * (review 159). */
		int err = errno;

		__atomic_store_n(&urcu_bp_has_sys_membarrier, 0, __ATOMIC_SEQ_CST);
		percpuref_fence_without_membarrier(err);
	}
	urcu_bp_synchronize_rcu();
	percpuref_cancel_restore(cancel);
}

uint64_t percpuref_monotonic_ns(void)
{
	/* 0 where the clock is refused (a seccomp filter on the syscall
	 * behind the vDSO), not whatever the stack held. */
	struct timespec ts = { 0, 0 };

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

void percpuref_cond_init(pthread_cond_t *cond)
{
	pthread_condattr_t attr;

	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(cond, &attr);
	pthread_condattr_destroy(&attr);
}

void percpuref_deadline(struct timespec *deadline, unsigned long ms)
{
	clock_gettime(CLOCK_MONOTONIC, deadline);
	deadline->tv_sec += (time_t)(ms / 1000);
	deadline->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (deadline->tv_nsec >= 1000000000L) {
		deadline->tv_sec++;
		deadline->tv_nsec -= 1000000000L;
	}
}

void percpuref_futex_wait(uint32_t *word, uint32_t expected, const struct timespec *until)
{
	/* Not the caller's errno: a @release in a signal handler may get here
	 * (pthread_mutex_lock() and pthread_cond_wait() left it alone). */
	int saved = errno;

	/* FUTEX_WAIT_BITSET: an absolute timeout, on CLOCK_MONOTONIC without
	 * FUTEX_CLOCK_REALTIME.  EAGAIN (the word changed), EINTR and
	 * ETIMEDOUT all return: callers re-check under their lock. */
	(void)syscall(SYS_futex, word, FUTEX_WAIT_BITSET_PRIVATE, expected, until, NULL,
		      FUTEX_BITSET_MATCH_ANY);
	errno = saved;
}

static void futex_wake(uint32_t *word, int nr)
{
	int saved = errno;	/* as percpuref_futex_wait() */

	(void)syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, nr, NULL, NULL, 0);
	errno = saved;
}

void percpuref_futex_wake_one(uint32_t *word)
{
	futex_wake(word, 1);
}

void percpuref_futex_wake_all(uint32_t *word)
{
	futex_wake(word, INT_MAX);
}

unsigned long percpuref_fence_stamp(void)
{
	/* Seq_cst, after the caller's seq_cst exchange of the mode word: the
	 * flags are visible to every CPU before this load (a locked
	 * exchange on x86, store-release then load-acquire on arm64), so
	 * before the ticket increment of any fence that takes a later
	 * ticket, and so before its membarrier (rcu_seq_snap()'s argument,
	 * without its smp_mb(): the exchange orders as much). */
	return __atomic_load_n(&fence_tickets, __ATOMIC_SEQ_CST);
}

bool percpuref_fence_covers(unsigned long stamp)
{
	/* Acquire: pairs with the release CAS in percpuref_fence_readers(),
	 * so the caller sees every commit that fence made visible. */
	return (long)(__atomic_load_n(&fence_covered, __ATOMIC_ACQUIRE) - stamp) > 0;
}

bool percpuref_fence_started_after(unsigned long stamp)
{
	/* Relaxed: a hint for waiting; percpuref_fence_covers() orders. */
	return (long)(__atomic_load_n(&fence_tickets, __ATOMIC_RELAXED) - stamp) > 0;
}

bool percpuref_fence_started_within(uint64_t interval_ns)
{
	/* Relaxed: pacing only.  Read before the clock, as below. */
	uint64_t last = __atomic_load_n(&fence_last_start_ns, __ATOMIC_RELAXED);

	return percpuref_monotonic_ns() - last < interval_ns;
}

bool percpuref_fence_readers_paced(uint64_t interval_ns)
{
	/* Relaxed, here and in the claim: pacing only, the fence orders.
	 * Read before the clock, so a start stored meanwhile is not in our
	 * future (now - last would wrap and read as long ago). */
	uint64_t last = __atomic_load_n(&fence_last_start_ns, __ATOMIC_RELAXED);
	uint64_t now = percpuref_monotonic_ns();

	/* Not due, or lost to another thread's claim (it starts one now). */
	if (now - last < interval_ns ||
	    !__atomic_compare_exchange_n(&fence_last_start_ns, &last, now, false,
					 __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		return false;
	percpuref_fence_readers();
	return true;
}

void percpuref_fence_readers(void)
{
	int cancel = percpuref_cancel_disable();
	/* Seq_cst: see percpuref_fence_stamp(). */
	unsigned long ticket = __atomic_add_fetch(&fence_tickets, 1, __ATOMIC_SEQ_CST);
	unsigned long covered;

	uint64_t started = percpuref_monotonic_ns();
	/* Relaxed: pacing only (percpuref_fence_readers_paced()).  Raised,
	 * never lowered: an overlapping fence may have started later. */
	uint64_t last = __atomic_load_n(&fence_last_start_ns, __ATOMIC_RELAXED);

	while ((int64_t)(started - last) > 0 &&
	       !__atomic_compare_exchange_n(&fence_last_start_ns, &last, started, true,
					    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;

	/* Acquire: pairs with the switch-off's seq_cst store of 0 (release),
	 * so an offset of 0 comes with the switch-off's stamping count. */
	if (__atomic_load_n(&percpuref_rseq_offset, __ATOMIC_ACQUIRE)) {
		/* Relaxed: a flag to skip a doomed syscall; read stale, the
		 * syscall is refused again, and we fence as below. */
		if (__atomic_load_n(&membarrier_refused, __ATOMIC_RELAXED))
			percpuref_fence_without_membarrier(EPERM);
		else if (sys_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, 0) != 0)
			percpuref_fence_without_membarrier(errno);
	} else {
		/* Off, or never on: a switch-off less than 10 ms ago left
		 * sections in flight that no fence can abort. */
		wait_for_sections_at_switch_off();
	}
	percpuref_readers_fence();
	/* Release: the commits this fence made visible to us are visible to
	 * whoever sees the ticket covered.  A fence that ended after a later
	 * ticket's leaves the higher mark: each covers what it started after. */
	covered = __atomic_load_n(&fence_covered, __ATOMIC_RELAXED);
	while ((long)(ticket - covered) > 0 &&
	       !__atomic_compare_exchange_n(&fence_covered, &covered, ticket, true,
					    __ATOMIC_RELEASE, __ATOMIC_RELAXED))
		;
	percpuref_cancel_restore(cancel);
}

PERCPUREF_API const char *percpuref_fence_method(void)
{
	percpuref_runtime_init();
	/* Relaxed, all three: each changes at most once, one way (the
	 * offset to 0, the refusals to true), read for a report's word; the
	 * offset as percpuref_fast_path() reads it. */
	if (__atomic_load_n(&percpuref_rseq_offset, __ATOMIC_RELAXED))
		return __atomic_load_n(&membarrier_refused, __ATOMIC_RELAXED) ? "migration"
									       : "membarrier";
	if (!percpuref_readers_have_units())
		return "none";
	return __atomic_load_n(&percpuref_readers_fence_needed, __ATOMIC_RELAXED) ? "reader-fences"
										  : "membarrier";
}

static void *library_thread_main(void *arg)
{
	struct percpuref_thread *t = arg;
	/* pthread_create() ordered the creator's store before us. */
	void *(*fn)(void *) = t->fn;
	struct library_thread_node node;
	void *ret;

	percpuref_library_thread = true;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
	/* Named by itself before it lists itself, so that no set finds it
	 * nameless (tests/unit/test_library_cpus.c checks every id a set
	 * reaches by its name), and by its creator, so that it carries its
	 * name once the call that started it returns. */
	pthread_setname_np(pthread_self(), t->name);
	/* Refused (a CPU gone offline since): as any child, where it is. */
	if (t->start_cpus_given)
		cpu_mask_set(0, &t->start_cpus);
	/* The C library's and the sanitizers' start-up is behind us. */
	sem_post(&t->started);
	library_thread_enter(&node);
	pthread_cleanup_push(library_thread_leave, &node);
	ret = fn(NULL);
	pthread_cleanup_pop(1);
	return ret;
}

/* Also consumes its post: the count is 0 again for the next start. */
void percpuref_wait_thread_started(struct percpuref_thread *t)
{
	int saved_errno = errno, cancel;

	if (!t->starting)
		return;
	/* sem_wait() is a cancellation point; a signal may interrupt it. */
	cancel = percpuref_cancel_disable();
	while (sem_wait(&t->started) && errno == EINTR)
		;
	percpuref_cancel_restore(cancel);
	t->starting = false;
	errno = saved_errno;
}

/* Raised by the thread's own instructions: never blocked ("Signal masks"). */
static const int synchronous_signals[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS };

void percpuref_sigfill_async(sigset_t *set)
{
	sigfillset(set);
	for (size_t i = 0; i < sizeof(synchronous_signals) / sizeof(synchronous_signals[0]); i++)
		sigdelset(set, synchronous_signals[i]);
}

bool percpuref_start_thread(struct percpuref_thread *t, void *(*fn)(void *), const char *name)
{
	sigset_t blocked, creators;
	int err;

	/* The last thread's post, if no fork took it, is not this one's. */
	percpuref_wait_thread_started(t);
	if (!t->fn)
		sem_init(&t->started, 0, 0);
	t->fn = fn;
	t->name = name;
	/* Started by a library thread: where that one started, not the
	 * CPUs chosen since ("Placement" above).  Read by the new thread
	 * before its post, which the next start on @t waits for. */
	t->start_cpus_given = own_library_node && !own_library_node->inherited_err;
	if (t->start_cpus_given)
		t->start_cpus = own_library_node->inherited;
	/* The thread inherits this mask: every signal but the synchronous
	 * ones blocked from its first instruction on ("Signal masks" above). */
	percpuref_sigfill_async(&blocked);
	for (int sig = 1; sig < NSIG; sig++)
		if (sigismember(&library_threads_accept, sig) == 1)
			sigdelset(&blocked, sig);
	pthread_sigmask(SIG_SETMASK, &blocked, &creators);
	/* A start the fault hook refuses fails as one without memory for
	 * its stack does (internal.h).  So does one while the fork handlers
	 * are refused: a fork child would wait for this thread for ever
	 * (percpuref_fork_handlers_registered()); the work is done by those
	 * who wait for it, as when thread starts are refused. */
	err = percpuref_fault_should_fail() ? EAGAIN
	      : !percpuref_fork_handlers_registered() ? ENOMEM
	      : pthread_create(&t->id, NULL, library_thread_main, t);
	pthread_sigmask(SIG_SETMASK, &creators, NULL);
	if (err) {
		if (!t->start_refused)
			percpuref_warn(name, "cannot start thread: %s", strerror(err));
		t->start_refused = true;
		return false;
	}
	t->start_refused = false;
	t->starting = true;
	pthread_setname_np(t->id, name);
	return true;
}

unsigned long percpuref_shutdown_begin(void)
{
	in_shutdown = true;
	/* Seq_cst: work queued after this is counted, as far as the relaxed
	 * read in percpuref_note_work() sees it soon; one counted late only
	 * costs the shutdown another round. */
	if (__atomic_fetch_add(&shutdowns_running, 1, __ATOMIC_SEQ_CST) == 0)
		/* Seq_cst as the count above: a hint compared under each
		 * ref's switch lock; a revival in between counts against
		 * the last period, which at worst ends this shutdown early. */
		__atomic_fetch_add(&shutdown_epoch, 1, __ATOMIC_SEQ_CST);
	return __atomic_load_n(&outside_work, __ATOMIC_SEQ_CST);
}

bool percpuref_outside_work_since(unsigned long mark)
{
	/* Relaxed: a count; the shutdown's locks order what it drains. */
	return __atomic_load_n(&outside_work, __ATOMIC_RELAXED) != mark;
}

void percpuref_shutdown_end(void)
{
	/* Seq_cst, as the increment in percpuref_shutdown_begin(), though
	 * its readers load it relaxed, a hint (percpuref_note_work()): it
	 * orders nothing, only the count must stay exact. */
	__atomic_fetch_sub(&shutdowns_running, 1, __ATOMIC_SEQ_CST);
	in_shutdown = false;
}

/* The calling thread is one whose work a shutdown follows as its own
 * cascade (one of our threads, or a thread in a shutdown): not outside
 * work. */
static bool shutdown_cascade_thread(void)
{
	return percpuref_library_thread || in_shutdown;
}

void percpuref_note_work(void)
{
	/* Relaxed: a hint read on every queueing, written twice per shutdown. */
	if (__atomic_load_n(&shutdowns_running, __ATOMIC_RELAXED) && !shutdown_cascade_thread())
		__atomic_fetch_add(&outside_work, 1, __ATOMIC_RELAXED);
}

void percpuref_note_revival(struct percpuref_revivals *revivals)
{
	unsigned long epoch;

	/* Relaxed: hints, as in percpuref_note_work(); a revival counted a
	 * round late costs the shutdown that round.  Only the callbacks':
	 * another thread's is its own work, counted where it queues any. */
	if (!__atomic_load_n(&shutdowns_running, __ATOMIC_RELAXED) || !shutdown_cascade_thread())
		return;
	epoch = __atomic_load_n(&shutdown_epoch, __ATOMIC_RELAXED);
	if (revivals->epoch != epoch) {
		revivals->epoch = epoch;
		revivals->count = 0;
	}
	if (++revivals->count == PERCPUREF_SHUTDOWN_REVIVALS_MAX)
		__atomic_fetch_add(&outside_work, 1, __ATOMIC_RELAXED);
}

void percpuref_stop_thread(struct percpuref_thread *t, pthread_mutex_t *lock,
			   pthread_cond_t *wake, pthread_cond_t *exited)
{
	pthread_t joinee = t->id;
	int cancel = percpuref_cancel_disable();

	if (t->stopping) {
		while (t->running && t->stopping)
			pthread_cond_wait(exited, lock);
		pthread_mutex_unlock(lock);
	} else if (!t->running) {
		pthread_mutex_unlock(lock);
	} else {
		t->stopping = true;
		pthread_cond_signal(wake);
		pthread_mutex_unlock(lock);
		pthread_join(joinee, NULL);
	}
	percpuref_cancel_restore(cancel);
}

void percpuref_sleep_us(unsigned long us)
{
	struct timespec pause = { (time_t)(us / 1000000), (long)(us % 1000000) * 1000 };
	int saved_errno = errno;

	/* A signal handled meanwhile ends nanosleep() early (EINTR; never
	 * restarted, SA_RESTART or not): the rest, until it is slept.  The
	 * wait for the sections in flight at a switch-off is one sleep, and
	 * a 1 ms interval timer cut it to 1 ms (test_hardening
	 * --no-fence-signal).  errno kept: fences run in signal handlers. */
	while (nanosleep(&pause, &pause) != 0 && errno == EINTR)
		;
	errno = saved_errno;
}

void percpuref_yield_or_nap(unsigned long tries)
{
	if (tries <= 64)
		sched_yield();
	else
		percpuref_sleep_us(50);
}

/*
 * malloc() then memset(), not calloc(): glibc's calloc() passes by the
 * thread's cache of free blocks (tcache) to the arena and its lock, and
 * every init makes one of these (switch-storm: 7% of a cycle's samples in
 * calloc, about 14 ns of 220, against half that).  The empty asm keeps the
 * compiler from folding the pair back into calloc().
 */
void *percpuref_zalloc(size_t size)
{
	void *p;

	if (percpuref_fault_should_fail())
		return NULL;
	p = malloc(size);
	if (!p)
		return NULL;
	__asm__ volatile("" : "+r"(p));
	return memset(p, 0, size);
}

static void fault_arm(long nth, long then)
{
	__atomic_store_n(&fault_then, then, __ATOMIC_RELAXED);
	/* Release: pairs with the acquire loads in fault_refuse(), so a
	 * library thread that sees the count sees its mode. */
	__atomic_store_n(&fault_countdown, nth, __ATOMIC_RELEASE);
}

PERCPUREF_API void percpuref_fault_fail_nth_alloc(long nth)
{
	fault_arm(nth, 0);
}

PERCPUREF_API void percpuref_fault_fail_from_nth_alloc(long nth)
{
	fault_arm(nth, -1);
}

PERCPUREF_API void percpuref_test_library_threads_accept(int sig)
{
	/* Before the library starts a thread: read by the next starts. */
	sigaddset(&library_threads_accept, sig);
}

PERCPUREF_API void percpuref_fault_cpu_units(unsigned int n)
{
	/* Before the runtime initialises: read once, by runtime_init_once(). */
	fault_cpu_units = n;
}

PERCPUREF_API unsigned long percpuref_fault_refused_allocs(void)
{
	/* Relaxed: a statistic for the test that armed the fault. */
	return __atomic_load_n(&fault_refused, __ATOMIC_RELAXED);
}

static bool fault_refuse(void)
{
	/* Acquire: pairs with fault_arm()'s release, for fault_then. */
	long left = __atomic_load_n(&fault_countdown, __ATOMIC_ACQUIRE);

	if (left < 0)
		return true;
	while (left > 0) {
		/* Relaxed: ordered by the acquire that read @left. */
		long next = left > 1 ? left - 1 : __atomic_load_n(&fault_then, __ATOMIC_RELAXED);

		/* Acquire: a re-arm's count re-read, as above. */
		if (__atomic_compare_exchange_n(&fault_countdown, &left, next, false,
						__ATOMIC_ACQUIRE, __ATOMIC_ACQUIRE))
			return left == 1;
	}
	return false;
}

bool percpuref_fault_should_fail(void)
{
	if (!fault_refuse())
		return false;
	/* Relaxed: a statistic, read by the test that armed the fault. */
	__atomic_fetch_add(&fault_refused, 1, __ATOMIC_RELAXED);
	return true;
}

void percpuref_warn(const char *fn, const char *fmt, ...)
{
	char line[256];
	va_list ap;
	int n, cancel;

	n = fn ? snprintf(line, sizeof(line), "percpuref: %s: ", fn)
	       : snprintf(line, sizeof(line), "percpuref: ");
	va_start(ap, fmt);
	if (n > 0 && (size_t)n < sizeof(line))
		vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	/* One write so concurrent warnings never interleave mid-line; a
	 * write is a cancellation point. */
	cancel = percpuref_cancel_disable();
	fprintf(stderr, "%s\n", line);
	percpuref_cancel_restore(cancel);
	/* Relaxed: a statistic. */
	__atomic_fetch_add(&warnings, 1, __ATOMIC_RELAXED);
}

PERCPUREF_API unsigned long percpuref_warning_count(void)
{
	/* Relaxed: a statistic; nothing is read on the strength of it. */
	return __atomic_load_n(&warnings, __ATOMIC_RELAXED);
}
