/* SPDX-License-Identifier: MIT */
/*
 * managed.h - control and statistics of the reclaimer, the background
 * thread that holds a reference of its own on every managed percpu_ref
 * (percpu_ref_switch_to_managed(), percpu_ref.h) and releases the ones
 * nobody else references (docs/managed.md).
 *
 * The reclaimer starts on first use, scans every @interval_ms at most
 * @max_per_scan refs, and checks each with one of three strategies:
 *  - FAITHFUL, as the kernel proposal: per ref, switch to atomic mode, wait
 *    for one reader fence, check, switch back: one fence per ref;
 *  - BATCHED: switch the scan's refs to atomic mode together, one fence,
 *    check them all, switch the survivors back: one fence per scan;
 *  - FILTERED (the default): first read each ref's per-CPU counters twice
 *    without switching it; a ref that changed in between, or that someone
 *    besides the manager holds, is in use and stays per-CPU (no atomic
 *    window for it); only the others go through BATCHED's exact check.
 * A ref that is switched stays in atomic mode for about one fence.
 *
 * Environment (read once, at the first use of managed mode; a value that is
 * not a number or out of range is warned and ignored, an empty one is as if
 * unset):
 * PERCPUREF_SCAN_INTERVAL_MS (at most PERCPU_REF_MANAGED_INTERVAL_MAX_MS),
 * PERCPUREF_SCAN_MAX (0: no limit),
 * PERCPUREF_SCAN_STRATEGY=faithful|batched|filtered,
 * PERCPUREF_RECLAIMER_NICE (0..19: the reclaimer thread's nice value),
 * PERCPUREF_MANAGED_WARN_S (warn once for each managed ref still held N
 * seconds after it was first listed; 0, the default: no warning;
 * docs/managed.md).  Where the reclaimer may run: percpu_ref.h,
 * percpuref_set_library_cpus() (PERCPUREF_LIBRARY_CPUS).
 */
#ifndef PERCPUREF_MANAGED_H
#define PERCPUREF_MANAGED_H

#include <stdint.h>

#include <percpuref/compiler.h>

PERCPUREF_BEGIN_DECLS

enum percpu_ref_scan_strategy {
	PERCPU_REF_SCAN_FAITHFUL,	/* one fence per ref (the proposal) */
	PERCPU_REF_SCAN_BATCHED,	/* one fence per scan */
	PERCPU_REF_SCAN_FILTERED,	/* check before switch, then batched */
};

struct percpu_ref_managed_config {
	unsigned long interval_ms;	/* scan start to scan start; 0: back to back */
	unsigned long max_per_scan;	/* refs checked per scan; 0: no limit */
	enum percpu_ref_scan_strategy strategy;
};

/* Defaults: the proposal's 5 s and 100 refs; filtered (no atomic window
 * for refs in use, one fence per scan for the others).  Exits of many
 * listed refs (4096, and half the list) bring a pass forward, scanned back
 * to back, so that their memory comes back (docs/managed.md). */
#define PERCPU_REF_MANAGED_INTERVAL_MS 5000UL
#define PERCPU_REF_MANAGED_MAX_PER_SCAN 100UL
/* Longest interval accepted (one day); a longer one is -EINVAL. */
#define PERCPU_REF_MANAGED_INTERVAL_MAX_MS 86400000UL

PERCPUREF_API void percpu_ref_managed_get_config(struct percpu_ref_managed_config *config);
/* Takes effect at once (a sleeping reclaimer wakes up).  0, or -EINVAL
 * (warned, nothing changed) for NULL, an unknown strategy or an interval
 * above PERCPU_REF_MANAGED_INTERVAL_MAX_MS. */
PERCPUREF_API int percpu_ref_managed_set_config(const struct percpu_ref_managed_config *config);

/*
 * percpu_ref_managed_flush - return once every managed ref whose only
 * reference was the manager's when the call started has been released (its
 * @release has returned; for a percpu_rcuref, its RCU-deferred release).
 * Scans back to back, ignoring the interval, until a whole pass over the
 * list that started after the call has finished.  0; -EDEADLK (warned) from
 * a callback run by a library thread, by percpuref_shutdown(), by a poll
 * (percpu_ref_poll()) or by a call running queued work itself (no thread
 * can start), or inside an RCU
 * read-side section (it would wait for itself); -ENOMEM if a pass cannot
 * start for want of memory (warned the first time, and again after one
 * could start) (the refs wait for the reclaimer's next
 * interval, or the next flush).  Needs no thread: while the reclaimer
 * cannot start, the caller scans, and the releases run on it.
 */
PERCPUREF_API int percpu_ref_managed_flush(void);

/* Cumulative since the process started (a forked child inherits them). */
struct percpu_ref_managed_stats {
	uint64_t scans;		/* scans that checked at least one node */
	uint64_t passes;	/* complete walks over the list */
	uint64_t refs_scanned;	/* refs checked (filtered or switched) */
	uint64_t refs_switched;	/* switched to atomic for the exact check */
	uint64_t refs_skipped;	/* left per-CPU by the filter: in use */
	uint64_t released;	/* refs released by the reclaimer */
	uint64_t fences;	/* reader fences ("grace periods") waited */
	uint64_t rcu_grace_periods; /* liburcu grace periods (percpu_rcuref) */
	uint64_t scan_ns_total;	/* time spent in scans */
	uint64_t scan_ns_max;	/* longest scan */
	uint64_t scan_ns_last;	/* latest scan */
};

PERCPUREF_API void percpu_ref_managed_get_stats(struct percpu_ref_managed_stats *stats);

PERCPUREF_END_DECLS

#endif
