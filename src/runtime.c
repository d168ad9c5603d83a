/*
 * runtime.c - process-wide machinery under every per-CPU counter: which fast
 * path is usable, the reader fence that makes mode switches exact, the
 * fallback read side, deferred callbacks, fork, warnings, fault injection.
 *
 * Fast path choice.  percpuref_rseq_usable is set once, before the first
 * per-CPU counter is allocated, when (a) glibc registered an rseq area for the
 * initialising thread, and (b) membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_
 * EXPEDITED_RSEQ) succeeded.  Threads whose own rseq registration failed see
 * cpu_id < 0 and take the fallback per call (this_cpu.h).
 *
 * The reader fence (percpuref_fence_readers) is this library's grace period.
 * A switcher first stores the new mode flags into the ref's mode word, then:
 *  - rseq readers: MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ interrupts every
 *    running thread of the process; the kernel restarts any rseq critical
 *    section that had not committed, and the restarted section re-reads the
 *    mode word.  Threads not running were already restarted when preempted.
 *    Every commit that happened before the interrupt is visible to the
 *    switcher when membarrier returns (it implies a full barrier on each CPU).
 *  - fallback readers run inside a liburcu-bp read-side section; a grace
 *    period (urcu_bp_synchronize_rcu) waits for them.  The grace period is
 *    skipped while no thread has ever taken the fallback: a thread announces
 *    itself once (store flag, then read the mode word), the switcher does
 *    (store mode word, then load flag), all four sequentially consistent.
 *    By the store-buffer (Dekker) argument at least one side sees the
 *    other's store, so either the switcher waits a grace period or the
 *    reader sees the new mode.
 *
 * liburcu-bp is the flavour because it needs nothing from calling threads:
 * readers register themselves on first use.  Work that must wait for a fence
 * runs on the library's own callback thread (deferred.c).  Fork: liburcu's own atfork
 * hooks run from ours, and the locks this library owns are taken around fork
 * so the child never inherits one held by a thread that does not exist there.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"
#include "managed.h"
#include "percpuref/this_cpu.h"

PERCPUREF_API bool percpuref_rseq_usable;

static pthread_once_t runtime_once = PTHREAD_ONCE_INIT;
static unsigned int nr_units;
/* Set (never cleared) once any thread has used the fallback read side. */
static bool fallback_readers_seen;
static __thread bool fallback_announced;
static unsigned long warnings;
static long fault_countdown;

static int sys_membarrier(int cmd, unsigned int flags)
{
	return (int)syscall(__NR_membarrier, cmd, flags, 0);
}

/* Highest possible CPU id + 1, from the kernel's "possible" mask. */
static unsigned int read_possible_cpus(void)
{
	FILE *f = fopen("/sys/devices/system/cpu/possible", "r");
	unsigned int lo, hi, max = 0;
	int c;

	if (f) {
		/* Format: "0-191" or "0,2-5": the last range ends highest. */
		while (fscanf(f, "%u", &lo) == 1) {
			hi = lo;
			c = fgetc(f);
			if (c == '-' && fscanf(f, "%u", &hi) == 1)
				c = fgetc(f);
			if (hi + 1 > max)
				max = hi + 1;
			if (c != ',')
				break;
		}
		fclose(f);
	}
	if (max == 0) {
		long n = sysconf(_SC_NPROCESSORS_CONF);

		max = n > 0 ? (unsigned int)n : 1;
	}
	return max;
}

static bool rseq_registered_here(void)
{
#if PERCPUREF_HAVE_RSEQ
	struct rseq *rs;

	if (__rseq_size == 0)
		return false;
	rs = (struct rseq *)((char *)__builtin_thread_pointer() + __rseq_offset);
	return (int32_t)__atomic_load_n(&rs->cpu_id, __ATOMIC_RELAXED) >= 0;
#else
	return false;
#endif
}

static bool membarrier_rseq_register(void)
{
	int cmds = sys_membarrier(MEMBARRIER_CMD_QUERY, 0);

	if (cmds < 0 || !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ))
		return false;
	return sys_membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ, 0) == 0;
}

/* The library's locks, in the order they nest; held across fork(). */
static pthread_mutex_t *const fork_locks[] = {
	&percpuref_scan_lock,
	&percpuref_switch_lock,
	&percpuref_alloc_lock,
	&percpuref_deferred_lock,
	&percpuref_managed_lock,
};
#define NR_FORK_LOCKS (sizeof(fork_locks) / sizeof(fork_locks[0]))

static void fork_prepare(void)
{
	unsigned int i;

	for (i = 0; i < NR_FORK_LOCKS; i++)
		pthread_mutex_lock(fork_locks[i]);
	urcu_bp_before_fork();
}

static void fork_parent(void)
{
	unsigned int i;

	urcu_bp_after_fork_parent();
	for (i = NR_FORK_LOCKS; i-- > 0;)
		pthread_mutex_unlock(fork_locks[i]);
}

static void fork_child(void)
{
	unsigned int i;

	urcu_bp_after_fork_child();
	percpuref_deferred_after_fork_child();
	/* Re-register for the child's mm; harmless if it was inherited. */
	if (percpuref_rseq_usable && !membarrier_rseq_register())
		percpuref_rseq_usable = false;
	/* Last: it may start the child's reclaimer, which blocks on the
	 * locks until they are released below. */
	percpuref_managed_after_fork_child();
	for (i = NR_FORK_LOCKS; i-- > 0;)
		pthread_mutex_unlock(fork_locks[i]);
}

static void runtime_init_once(void)
{
	const char *no_rseq = getenv("PERCPUREF_NO_RSEQ");

	nr_units = read_possible_cpus();
	percpuref_rseq_usable = !(no_rseq && *no_rseq && strcmp(no_rseq, "0")) &&
				rseq_registered_here() && membarrier_rseq_register();
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

void percpuref_runtime_init(void)
{
	pthread_once(&runtime_once, runtime_init_once);
}

unsigned int percpuref_nr_units(void)
{
	percpuref_runtime_init();
	return nr_units;
}

void percpuref_fence_readers(void)
{
	if (percpuref_rseq_usable &&
	    sys_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, 0) != 0) {
		/* Registered at init, so only a kernel bug gets here. */
		percpuref_warn(__func__, "membarrier failed: %s", strerror(errno));
		abort();
	}
	/* Sequentially consistent, as the mode-word store before it and the
	 * flag store and mode-word load of the fallback reader: in the single
	 * total order one of the two stores comes first, so either we see the
	 * flag or the reader sees the new mode (store-buffer / Dekker). */
	if (__atomic_load_n(&fallback_readers_seen, __ATOMIC_SEQ_CST))
		urcu_bp_synchronize_rcu();
}

void percpuref_fallback_read_lock(void)
{
	if (percpuref_unlikely(!fallback_announced)) {
		fallback_announced = true;
		/* Before the mode-word load that follows; see the fence. */
		__atomic_store_n(&fallback_readers_seen, true, __ATOMIC_SEQ_CST);
	}
	urcu_bp_read_lock();
}

void percpuref_fallback_read_unlock(void)
{
	urcu_bp_read_unlock();
}

unsigned long *percpuref_fallback_this_cpu(uintptr_t cpu0)
{
	int cpu = sched_getcpu();

	/* Any unit is correct on the fallback path (the add is atomic); a
	 * CPU id we cannot place just shares unit 0. */
	if (cpu < 0 || (unsigned int)cpu >= nr_units)
		cpu = 0;
	return percpuref_counter_on(cpu0, (unsigned int)cpu);
}

bool percpuref_start_thread(pthread_t *thread, void *(*fn)(void *), const char *name)
{
	int err = pthread_create(thread, NULL, fn, NULL);

	if (err) {
		percpuref_warn(name, "cannot start thread: %s", strerror(err));
		return false;
	}
	pthread_setname_np(*thread, name);
	return true;
}

void *percpuref_zalloc(size_t size)
{
	if (percpuref_fault_should_fail())
		return NULL;
	return calloc(1, size);
}

PERCPUREF_API void percpuref_fault_fail_nth_alloc(long nth)
{
	/* Relaxed: tests arm it from the thread that then allocates. */
	__atomic_store_n(&fault_countdown, nth, __ATOMIC_RELAXED);
}

bool percpuref_fault_should_fail(void)
{
	long left = __atomic_load_n(&fault_countdown, __ATOMIC_RELAXED);

	while (left > 0) {
		/* Relaxed CAS: only the count itself is shared. */
		if (__atomic_compare_exchange_n(&fault_countdown, &left, left - 1, false,
						__ATOMIC_RELAXED, __ATOMIC_RELAXED))
			return left == 1;
	}
	return false;
}

void percpuref_warn(const char *fn, const char *fmt, ...)
{
	char line[256];
	va_list ap;
	int n;

	n = snprintf(line, sizeof(line), "percpuref: %s: ", fn);
	va_start(ap, fmt);
	if (n > 0 && (size_t)n < sizeof(line))
		vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	/* One write so concurrent warnings never interleave mid-line. */
	fprintf(stderr, "%s\n", line);
	/* Relaxed: a statistic. */
	__atomic_fetch_add(&warnings, 1, __ATOMIC_RELAXED);
}

PERCPUREF_API unsigned long percpuref_warning_count(void)
{
	return __atomic_load_n(&warnings, __ATOMIC_RELAXED);
}
