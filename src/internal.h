/*
 * internal.h - what the library's source files share and the public headers
 * do not show: the reader fence, the fallback read side, the per-CPU
 * allocator, warnings and the fault-injection hook the tests use.
 */
#ifndef PERCPUREF_INTERNAL_H
#define PERCPUREF_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <percpuref/compiler.h>
#include <percpuref/percpu_ref.h>
#include <percpuref/this_cpu.h>

#include <urcu/urcu-bp.h>

/* The library's locks (held across fork() by runtime.c, in this order). */
extern pthread_mutex_t percpuref_switch_lock;	/* percpu_ref.c: mode switches */
extern pthread_mutex_t percpuref_alloc_lock;	/* percpu_alloc.c: chunks, slots */
extern pthread_mutex_t percpuref_deferred_lock;	/* deferred.c: callback queue */

/* Runtime set-up: rseq/membarrier detection, CPU count, fork handlers.
 * Idempotent and thread-safe; every slow path that may be first calls it. */
void percpuref_runtime_init(void);

/* Number of per-CPU units: every CPU id the kernel may report is below it. */
unsigned int percpuref_nr_units(void);

/*
 * percpuref_fence_readers - wait until no per-CPU update that read a mode
 * word before this call can still commit.  The caller has already stored the
 * new mode flags.  rseq readers: membarrier(..._RSEQ) aborts every
 * uncommitted sequence.  Fallback readers (sched_getcpu + atomic inside an
 * RCU read-side section): an RCU grace period, taken only once some thread
 * has used the fallback (see percpuref_fallback_read_lock()).  Sleeps; must
 * not be called inside an RCU read-side section.
 */
void percpuref_fence_readers(void);

/* Fallback read side.  Nestable; any thread, no registration. */
void percpuref_fallback_read_lock(void);
void percpuref_fallback_read_unlock(void);
/* This CPU's copy of the per-CPU counter at @cpu0 (fallback path). */
unsigned long *percpuref_fallback_this_cpu(uintptr_t cpu0);

/*
 * Deferred work (deferred.c): @fn(@d) runs on the library's callback thread
 * after a reader fence that started after this call.  The item must stay
 * valid until @fn runs; @fn may free it.
 */
struct percpuref_deferred;
typedef void (*percpuref_deferred_fn)(struct percpuref_deferred *);
struct percpuref_deferred {
	struct percpuref_deferred *next;
	percpuref_deferred_fn fn;
};
void percpuref_call_after_grace_period(struct percpuref_deferred *d, percpuref_deferred_fn fn);
/* Wait for every item queued before this call: 0, or -EDEADLK when called
 * on the callback thread itself, -EAGAIN if the thread cannot start. */
int percpuref_wait_deferred(void);
bool percpuref_on_deferred_thread(void);
/* Drain the queue and stop the thread (shutdown); it restarts on demand. */
void percpuref_deferred_stop(void);
void percpuref_deferred_after_fork_child(void);
/* Fences the callback thread waited for (one per batch). */
unsigned long percpuref_deferred_fences(void);

/* Per-CPU allocator (percpu_alloc.c).  Counters are zeroed on allocation. */
uintptr_t percpuref_counter_alloc(void);	/* CPU 0's address, or 0: ENOMEM */
void percpuref_counter_free(uintptr_t cpu0);
static inline unsigned long *percpuref_counter_on(uintptr_t cpu0, unsigned int cpu)
{
	return (unsigned long *)(cpu0 + ((uintptr_t)cpu << PERCPUREF_UNIT_SHIFT));
}
/* percpuref_get_counter_stats(): public, in <percpuref/percpu_ref.h>. */

/* Starts one of the library's threads, named @name (at most 15 chars);
 * false, after a warning naming it, when pthread_create() fails. */
bool percpuref_start_thread(pthread_t *thread, void *(*fn)(void *), const char *name);

/* Memory for the library's own objects; fails on demand (see below). */
void *percpuref_zalloc(size_t size);

/*
 * Fault injection for tests: the @nth next allocation made through
 * percpuref_zalloc() or the per-CPU allocator fails (1 = the very next);
 * 0 disarms.  Exposed (default visibility) so tests linking the static
 * library can reach it; not part of the installed API.
 */
PERCPUREF_API void percpuref_fault_fail_nth_alloc(long nth);
bool percpuref_fault_should_fail(void);

/* One-line diagnostic on stderr: "percpuref: <fn>: <message>". */
void percpuref_warn(const char *fn, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Count of warnings printed so far (tests assert misuse was reported). */
PERCPUREF_API unsigned long percpuref_warning_count(void);

#endif
