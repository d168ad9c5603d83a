/* SPDX-License-Identifier: MIT */
/*
 * managed.c - the reclaimer: the background thread that owns the initial
 * reference of every managed percpu_ref and releases the refs nobody else
 * holds, as the "Managed Percpu Refcount" proposal describes it; plus the
 * RCU-deferred releases of percpu_rcuref, which run on the same thread.
 *
 * The list.  Managed refs sit on a push-only lockless stack (list_head).
 * Any thread pushes (percpu_ref_switch_to_managed, reinit of a managed ref)
 * with a CAS on the head of its CPU's stage (managed_cpus: a stack of the
 * same kind a CPU, where the CPU is known; else on list_head itself); at
 * the start of each pass the scanner takes every stage whole with an
 * exchange, and links each below the list's last node when its walk gets
 * there.  Up to 0.4.15 every push CASed list_head, a word every CPU wrote
 * (docs/managed.md, "Stages").  Besides the pushes, only the scanner
 * writes the head: it (1) pushes a marker node at the start of each pass
 * and (2) pops that marker at the end of the pass if it is still on top.  Every
 * node below a marker is older than the marker and is owned by the
 * reclaimer: it alone reads and writes those nodes' next pointers, so the
 * walk and unlinking use plain pointers.  A pusher reads only the head and
 * writes only its new node.  Push-only means no ABA: a push CAS that
 * succeeds links the new node to whatever node is on top at that moment.
 * (liburcu's cds_lfs_push is this same CAS loop, but its atomics are inline
 * assembly that ThreadSanitizer cannot see, and we need no general pop; so
 * the few lines are ours and the ordering is checked by TSAN.)  One pop
 * there is, since 0.4.17, and it keeps the argument: a ref unmanaged or
 * exited while its node is still the top of the stage it was pushed on
 * takes the node back with one CAS of that stage from the node to the
 * node below it at its push (percpuref_managed_unstage()), under the
 * ref's switch lock, which every push of that node also holds; a node a
 * pass took never returns to a stage while that lock is held, so a node
 * read on top has been there since its push, the same node below it
 * (tests/model/stage.pml, with the mutant that drops the lock in
 * between).  A managed-poll cycle of switch-storm then leaves the
 * reclaimer nothing: its node, and the impl's free, stay on the cycling
 * thread (docs/managed.md, "Taken back").
 *
 * Ordering.  A push's compare-and-swap on its stage or list_head releases
 * the node, its next pointer and the ref's data written before it
 * (percpuref_managed_push()); the scanner acquires a stage's nodes with
 * the exchange that takes the stage (take_stages()), the head's with the
 * compare-and-swap that pushes its marker (scan_once()), and walks them
 * with plain pointers from there.  No push is lost on an idle thread: the
 * thread swaps kick_needed to true and re-reads the head and every stage,
 * a pusher CASes and then reads kick_needed, all sequentially consistent,
 * so one of them sees the other, a Dekker pair (percpuref_managed_kick()).
 * As the thread stops it exchanges the flag too, and its stopper fences
 * before the drain's looks (stop_thread()).
 *
 * A pass.  Take the stages, push a marker, then walk from it down to the
 * bottom, where each stage taken is linked in turn, until none is left.
 * Nodes pushed during the pass sit in the stages or above the marker and
 * wait for the next pass.
 * Markers of earlier passes met on the way are unlinked and freed; nodes of
 * refs no longer managed are unlinked; nodes of refs exited while listed are
 * unlinked and freed, without the ref's switch lock (their exit's mark:
 * percpuref_managed_node_exited()).  Every other ref is checked (percpu_ref.c):
 * switch to atomic mode, reader fence, fold the per-CPU counts, then drop the
 * manager's reference if and only if it is the last one, in one CAS; if it
 * was, the node is unlinked and @release is called (without any lock, after
 * the whole chunk is done); if not, the ref goes back to per-CPU mode.  A scan
 * checks at most max_per_scan refs and the next scan resumes where it
 * stopped (cursor: the last node kept, which stays linked because only the
 * walk unlinks, and never its own position).  scan_lock makes one thread
 * the scanner: the reclaimer thread, or shutdown once that thread is gone.
 * It is a batch lock (internal.h): held for a whole scan, the @release
 * calls of its released refs included, and for a whole RCU batch (grace
 * period and releases), and fork takes it, so a fork never cuts a check,
 * a release phase or an RCU batch in half (test_hardening.c, findings 3
 * and 4: the
 * child lost those refs and its flush and barrier hung).
 *
 * Strategies.  FAITHFUL checks one ref per fence, exactly as the proposal
 * (its synchronous switch per ref); BATCHED starts the switch of every ref
 * of the scan, each under its own switch lock, fences once, then finishes
 * them all; FILTERED first reads each ref twice and starts the switch only
 * of those that look idle (percpu_ref.c).  The walk's next pointers below
 * the marker are the scanner's own (scan_lock), not the refs'.  The batch needs no array: after the first
 * half, the refs being checked are exactly the nodes that follow the cursor
 * (everything else between them was unlinked), so the second half walks
 * the same nodes again.
 *
 * Threads and locks (the order is internal.h's): scan_lock, then one ref's
 * switch lock at a time, then managed_lock (innermost: nothing else is taken under
 * it).  Callbacks (@release, RCU-deferred releases) run on the reclaimer
 * thread (or shutdown's) as the scanner (scan_running) but with no lock
 * held, scan_lock released around each (percpuref_batch_pause()), so they
 * may call any non-blocking API, free their object, and create, reinit or
 * exit managed refs, and a fork does not wait for them (one that waited
 * for a lock the forking thread held deadlocked both).  What the scan or
 * RCU batch has left meanwhile is in scan_released and rcu_rest, where a
 * fork child finds it and runs it (managed_fork_child()); the @release in
 * progress is the parent's thread's only.  A flush, barrier or shutdown
 * from such a callback would wait for itself: refused with -EDEADLK / a
 * warning.  The thread starts on first use, sleeps while the list is
 * empty, is stopped by percpuref_shutdown() (also an exit hook, so process
 * exit joins it) and starts again on demand.  After fork the child starts
 * its own reclaimer if the parent had one, so managed refs keep being
 * released in the child.
 *
 * At process exit the thread that runs it takes the scanner's role for a
 * percpu_rcuref that reaches zero there, when nobody holds it
 * (percpuref_run_after_rcu_here()): a grace period and the @release on
 * that thread, so that they run before the older static objects are
 * destroyed; what those @releases let go of waits on a list (here_head,
 * guarded by the role) and runs in the next round, after the @release
 * returned (a chain of them would otherwise deepen the stack a link
 * each), where a fork child of another thread finds it too.
 *
 * Giving way.  When the next scan is due the moment one ends (interval 0,
 * or scans longer than the interval) and no flush waits for a pass, the
 * thread calls sched_yield() before scanning again, holding no lock: where
 * another thread wants this CPU, that thread usually runs first; on an idle
 * CPU the call returns at once.  Scanning back to back at the process's
 * priority took a fair share of the CPUs the refs' users filled (at two
 * threads on two CPUs the hot ref kept 75-76% of its throughput).
 * Unlike a lower priority for the whole thread (PERCPUREF_RECLAIMER_NICE),
 * it gives way while it holds nothing: a fork or a mode change never waits
 * behind a yield, and a flush called meanwhile waits for that one yield at
 * most.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "managed.h"
#include "percpuref/managed.h"


/* Scans and RCU batches; its lock, scan.lock, is "scan_lock" in comments. */
static struct percpuref_batch scan = PERCPUREF_BATCH_INIT(PERCPUREF_RANK_SCAN);
static pthread_mutex_t managed_lock = PTHREAD_MUTEX_INITIALIZER;

/* Top of the managed list; see above for who writes it. */
static struct percpuref_mnode *list_head;

/*
 * Scanner state (scan_lock): a scan or an RCU batch owns it (scan's
 * runner role), even paused in a @release, which it runs with scan_lock
 * released (percpuref_batch_pause()).
 */
/* Refs a scan released whose @release has not run yet, and an RCU batch's
 * items not started: where a fork child finds them (the runner's stack
 * is not in the child). */
static struct percpuref_mnode *scan_released;
/* The one whose @release is in progress; in a fork child, one whose
 * @release the fork cut, to finish without it. */
static struct percpuref_mnode *scan_releasing, *scan_cut;
static struct percpuref_deferred *rcu_rest;
static struct percpuref_mnode *cursor;		/* NULL: no pass open */
static struct percpuref_mnode *pass_marker;	/* the open pass's marker */
static unsigned long pass_walked;		/* nodes the open pass met */
/* The last pass to open got no memory: its refusal was warned already. */
static bool marker_refused;

/* Everything below: managed_lock. */
static pthread_once_t config_once = PTHREAD_ONCE_INIT;
/* On CLOCK_MONOTONIC once the thread is first started (init_conds()). */
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;	/* the thread */
static pthread_cond_t progress = PTHREAD_COND_INITIALIZER; /* flush waiters */
static struct percpu_ref_managed_config config = {
	.interval_ms = PERCPU_REF_MANAGED_INTERVAL_MS,
	.max_per_scan = PERCPU_REF_MANAGED_MAX_PER_SCAN,
	.strategy = PERCPU_REF_SCAN_FILTERED,
};
static struct percpu_ref_managed_stats stats;
static bool pass_open;
/*
 * True while a push must wake the thread: it is not running, or sleeps
 * with no scan due (the list was empty).  Written under managed_lock,
 * read by pushers without it: the Dekker pair in percpuref_managed_kick().
 */
static bool kick_needed = true;
static struct percpuref_thread thread;
static uint64_t passes_started, passes_done, flush_target;
/* The pass an early ask needs done (percpuref_managed_exited()). */
static uint64_t early_target;
/* Passes that could not open for want of memory: a flush fails, -ENOMEM. */
static uint64_t passes_refused;
static uint64_t next_scan_ns;
static struct percpuref_deferred *rcu_head, **rcu_tail = &rcu_head;
/* Under managed_lock; both also read without it (percpuref_rcu_pace()). */
static unsigned long rcu_queued, rcu_done;
/* percpu_rcuref_kill() paces on it (deferred.c, "Backlog"). */
static struct percpuref_backlog rcu_backlog =
	PERCPUREF_BACKLOG_INIT(&managed_lock, &progress, &rcu_queued, &rcu_done, &thread);
/* PERCPUREF_MANAGED_WARN_S, in ns; 0: off.  Set once by config_init_once(). */
static uint64_t held_warn_ns;
/* PERCPUREF_RECLAIMER_NICE: the thread's nice value.  Set once, likewise. */
static unsigned long reclaimer_nice;

/*
 * Exited refs wait for a pass (percpuref_managed_exited()): exits that left
 * their node to the reclaimer since the open pass began, as their threads
 * counted them in, and whether one of them asked for an early pass (both
 * atomic, reset when a pass opens; the ask also when no thread is left to
 * serve it, so that a later exit asks again and starts one); the nodes
 * the last complete pass met (atomic, written by the scanner).
 */
static unsigned long exited_since_pass, last_pass_walked;
static bool early_pass_asked;
/* At least this many exited nodes, and half the list, ask for a pass. */
#define EARLY_PASS_MIN_EXITED 4096
/*
 * What the list's users write on their own CPU (managed_cpus: a line for
 * each possible CPU, managed_nr of them, indexed by the CPU the caller
 * runs on): a stage of the list, where a push puts its node and which a
 * pass that opens takes (take_stages()), and the exits counted there,
 * added to exited_since_pass EXITS_COUNTED_TOGETHER at a time.  Allocated
 * with the configuration (config_init_once()), which every push reads
 * first, so before any exit leaves a listed node: an exit allocates
 * nothing (one in a signal handler that interrupted malloc() would wait
 * for ever).  No array (no memory for it), or a CPU not known: a push goes
 * on list_head, an exit's count straight to the word.
 */
#define EXITS_COUNTED_TOGETHER 64
struct managed_cpu {
	/* Pushed on this CPU since a pass last took them: a stack as the
	 * list is, written by pushers (CAS), emptied by the scanner
	 * (exchange), and its top taken back by that node's ref
	 * (percpuref_managed_unstage(): CAS). */
	struct percpuref_mnode *staged;
	/* Scanner's: the stage the open pass took and has not yet linked
	 * below the list's last node (attach_taken()). */
	struct percpuref_mnode *taken;
	unsigned long exits;	/* atomic: exits counted here, ever */
} __attribute__((aligned(64)));
static struct managed_cpu *managed_cpus;
/* Its length: set before the array's address is published. */
static unsigned int managed_nr;
/* Scanner's: stages the open pass took and has not linked yet, and the
 * CPU to look at first for the next of them. */
static unsigned int taken_left, taken_next_cpu;

/*
 * TSAN cannot see a liburcu grace period.  Every percpu_rcuref read-side
 * unlock releases on this address, and the reclaimer acquires it after each
 * grace period: a reader that unlocked before the grace period ended
 * happens-before the deferred releases (percpu_rcuref.c).
 */
char percpuref_rcu_tsan_sync;

static void init_conds(void)
{
	percpuref_cond_init(&wake);
	percpuref_cond_init(&progress);
}

/* Before the thread first starts, so before anything waits on them:
 * every wait on wake and progress is the thread's, or follows an
 * ensure_thread() that found it running.  Not in a constructor: a program
 * linked with the static library runs its own constructors first, and a
 * managed ref used there left the thread asleep on wake, which the
 * constructor then reset (test_early_constructor). */
static pthread_once_t conds_once = PTHREAD_ONCE_INIT;

static void managed_cpus_alloc(void)
{
	unsigned int nr = percpuref_nr_cpus();
	size_t size = (size_t)nr * sizeof(struct managed_cpu);
	void *cpus;

	if (!nr)
		return;
	/* Under the tests' fault injection too (test_managed_unstaged). */
	if (percpuref_fault_should_fail() ||
	    posix_memalign(&cpus, sizeof(struct managed_cpu), size)) {
		percpuref_warn("percpuref_managed", "no memory for the managed list's per-CPU "
			       "stages (%zu bytes): every push goes on its one head", size);
		return;
	}
	memset(cpus, 0, size);
	managed_nr = nr;
	/* Release: the zeroed array and its length before its address (read
	 * with acquire). */
	__atomic_store_n(&managed_cpus, cpus, __ATOMIC_RELEASE);
}

/* The caller's CPU, an index into managed_cpus, or @nr when not known:
 * from the thread's rseq area where it has one registered (-1 reads as
 * past every unit), else sched_getcpu() (a system call where the C
 * library has no vDSO or rseq area to read it from). */
static unsigned int this_cpu_index(unsigned int nr)
{
	struct percpuref_rseq_area *rseq = percpuref_this_rseq_area();
	unsigned int cpu = nr;

	/* Relaxed: the kernel writes it on this thread's behalf; only a
	 * choice of stage or count word, any of which is right, and stale
	 * as soon as read if the thread moves. */
	if (rseq)
		cpu = __atomic_load_n(&rseq->cpu_id, __ATOMIC_RELAXED);
	if (cpu >= nr)
		cpu = (unsigned int)sched_getcpu();
	return cpu < nr ? cpu : nr;
}

static void config_init_once(void)
{
	const char *strategy = percpuref_getenv("PERCPUREF_SCAN_STRATEGY");
	const char *who = "percpuref_managed";
	unsigned long held_warn_s = 0;

	managed_cpus_alloc();

	percpuref_env_ulong(who, "PERCPUREF_SCAN_INTERVAL_MS", PERCPU_REF_MANAGED_INTERVAL_MAX_MS,
			    &config.interval_ms);
	percpuref_env_ulong(who, "PERCPUREF_SCAN_MAX", ULONG_MAX, &config.max_per_scan);
	/* Bounded so that the seconds in nanoseconds never wrap. */
	if (percpuref_env_ulong(who, "PERCPUREF_MANAGED_WARN_S", UINT64_MAX / 1000000000u,
				&held_warn_s))
		held_warn_ns = (uint64_t)held_warn_s * 1000000000u;
	percpuref_env_ulong(who, "PERCPUREF_RECLAIMER_NICE", 19, &reclaimer_nice);
	if (strategy && !strcmp(strategy, "faithful"))
		config.strategy = PERCPU_REF_SCAN_FAITHFUL;
	else if (strategy && !strcmp(strategy, "batched"))
		config.strategy = PERCPU_REF_SCAN_BATCHED;
	else if (strategy && !strcmp(strategy, "filtered"))
		config.strategy = PERCPU_REF_SCAN_FILTERED;
	else if (strategy && *strategy)
		percpuref_warn("percpuref_managed", "PERCPUREF_SCAN_STRATEGY=\"%s\" is neither "
			       "faithful, batched nor filtered; ignored", strategy);
}

static void managed_init(void)
{
	percpuref_runtime_init();
	pthread_once(&config_once, config_init_once);
}

void percpuref_managed_push(struct percpuref_mnode *node)
{
	struct percpuref_mnode **head = &list_head, *top;
	struct managed_cpu *cpus;
	unsigned int nr, cpu;

	/* Only the held warning reads the time (a clock read was a tenth
	 * of a managed-poll cycle of switch-storm); its setting is read
	 * before the first push. */
	managed_init();
	node->listed_ns = held_warn_ns ? percpuref_monotonic_ns() : 0;
	node->held_warned = false;
	percpuref_note_work();
	/* Acquire: pairs with managed_cpus_alloc()'s release. */
	cpus = __atomic_load_n(&managed_cpus, __ATOMIC_ACQUIRE);
	nr = managed_nr;
	node->stage_cpu = PERCPUREF_MNODE_UNSTAGED;
	if (cpus && (cpu = this_cpu_index(nr)) < nr) {
		head = &cpus[cpu].staged;
		node->stage_cpu = cpu;
	}
	top = __atomic_load_n(head, __ATOMIC_RELAXED);
	do
		node->next = top;
	/* Release: the node's next and everything written before the push
	 * (the ref's data) are visible to the reclaimer, whose exchange of
	 * the stage or marker push on the list acquires the word (a later
	 * push continues the release sequence).  Seq_cst: the Dekker pair
	 * of the thread's going idle (kick), whose re-read covers every
	 * stage (nothing_listed()). */
	while (!__atomic_compare_exchange_n(head, &top, node, true, __ATOMIC_SEQ_CST,
					    __ATOMIC_RELAXED));
	node->below = top;	/* the switch lock keeps unstage out till now */
}

/*
 * A pop, but only by the node's owner and only of its own node, under the
 * ref's switch lock: no other thread pops that node, and it is not pushed
 * again while it is listed (list_node() pushes only a node in MNODE_OFF,
 * which only this lock's holder sets).  So a node read on top of its stage
 * has been there since its push without a break: once a pass's exchange
 * takes it, it never comes back to a stage while this lock is held; and
 * while it sits on the stage nobody writes its next pointer (pushers write
 * their own node's, the scanner only nodes it took), which is still the
 * @below its push recorded.  The compare-and-swap then replaces it with
 * the node below it exactly when it is still on top: the ABA that a
 * general pop must rule out with tags or hazard pointers cannot happen.
 * A push on top of it, or a pass that took it, makes the swap fail: the
 * node stays for the reclaimer, as before 0.4.17.
 */
bool percpuref_managed_unstage(struct percpuref_mnode *node)
{
	/* Acquire: pairs with managed_cpus_alloc()'s release (the push that
	 * set stage_cpu read the same array). */
	struct managed_cpu *cpus = __atomic_load_n(&managed_cpus, __ATOMIC_ACQUIRE);
	struct percpuref_mnode *top = node;

	if (node->stage_cpu == PERCPUREF_MNODE_UNSTAGED)
		return false;
	/* Relaxed: @below is this ref's own (above), and the node below,
	 * published by its push's release compare-and-swap, stays published
	 * to the pass that takes the stage: this read-modify-write continues
	 * that push's release sequence.  No Dekker pair either: a node taken
	 * off makes no work the reclaimer could miss. */
	return __atomic_compare_exchange_n(&cpus[node->stage_cpu].staged, &top, node->below, false,
					   __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

/*
 * The list and every stage empty?  @order: relaxed for a look, seq_cst for
 * the thread's re-read after it set kick_needed (the Dekker pair of a
 * push: the push's seq_cst CAS on whichever word, then its seq_cst read of
 * kick_needed).  Under managed_lock, as take_stages() is: no node moves
 * from a word not yet read to one already read meanwhile.
 */
static bool nothing_listed(int order)
{
	/* Acquire: pairs with managed_cpus_alloc()'s release. */
	struct managed_cpu *cpus = __atomic_load_n(&managed_cpus, __ATOMIC_ACQUIRE);
	unsigned int cpu;

	for (cpu = 0; cpus && cpu < managed_nr; cpu++)
		if (__atomic_load_n(&cpus[cpu].staged, order))
			return false;
	return !__atomic_load_n(&list_head, order);
}

/*
 * Scanner, managed_lock held, as a pass opens: every stage's nodes become
 * the open pass's (taken), to be linked below the list's last node as the
 * walk reaches it (attach_taken()): no walk to a chain's end here, under
 * managed_lock, and none twice a pass.  In the lock section that counts
 * the pass and pushes its marker: a flush that pushed before it took its
 * target there finds its node in this pass or names a later one (see
 * scan_once()).  A stage read non-empty may be empty at its exchange: its
 * one node taken back by its ref's owner meanwhile
 * (percpuref_managed_unstage()); only what the exchange returns counts.
 */
static void take_stages(void)
{
	/* Acquire: pairs with managed_cpus_alloc()'s release. */
	struct managed_cpu *cpus = __atomic_load_n(&managed_cpus, __ATOMIC_ACQUIRE);
	unsigned int cpu;

	/* Zero already: the last pass ended with every stage linked. */
	taken_left = taken_next_cpu = 0;
	for (cpu = 0; cpus && cpu < managed_nr; cpu++) {
		/* Relaxed: a look; a push that happened before the pass
		 * (a flush's) is seen by coherence. */
		if (!__atomic_load_n(&cpus[cpu].staged, __ATOMIC_RELAXED))
			continue;
		/* Acquire: pairs with the pushes' release CAS (the nodes'
		 * next pointers and the refs' data). */
		cpus[cpu].taken = __atomic_exchange_n(&cpus[cpu].staged, NULL, __ATOMIC_ACQUIRE);
		taken_left += cpus[cpu].taken != NULL;
	}
}

/*
 * Scanner: @last is the list's last node (below the open pass's marker, or
 * the marker): link the next stage the pass took below it, and return its
 * first node; NULL when none is left.  Nodes below the marker are the
 * scanner's, so a plain store.
 */
static struct percpuref_mnode *attach_taken(struct percpuref_mnode *last)
{
	/* Plain: read only while taken_left counts stages, which this
	 * thread's take_stages() found through its acquire load. */
	struct managed_cpu *cpus = managed_cpus;

	for (; taken_left && taken_next_cpu < managed_nr; taken_next_cpu++)
		if (cpus[taken_next_cpu].taken) {
			last->next = cpus[taken_next_cpu].taken;
			cpus[taken_next_cpu].taken = NULL;
			taken_left--;
			return last->next;
		}
	taken_left = 0;	/* none left to find: the pass may end */
	return NULL;
}

static void *reclaimer_main(void *arg);

/* managed_lock held.  False (warned) if the thread cannot start. */
static bool ensure_thread(void)
{
	if (thread.running)
		return true;
	pthread_once(&conds_once, init_conds);
	thread.stopping = false;
	if (!percpuref_start_thread(&thread, reclaimer_main, "percpuref-recl"))
		return false;
	thread.running = true;
	/* Relaxed: pushers that read it skip the lock; the list is scanned
	 * by a thread that exists, one interval from now. */
	__atomic_store_n(&kick_needed, false, __ATOMIC_RELAXED);
	/* The first scan one interval from now, as every later one. */
	next_scan_ns = percpuref_monotonic_ns() + config.interval_ms * UINT64_C(1000000);
	return true;
}

/*
 * After a push.  A running thread scans the list one interval after its
 * last scan whatever happens, so only a thread that is not running, or
 * sleeps because the list was empty, needs the lock and a signal: with a
 * lock and a wake-up per push, every switch_to_managed in the process
 * took managed_lock and woke the thread from its timed sleep.  No push
 * is left unseen: the thread sets kick_needed and then re-reads the list
 * head and every stage (nothing_listed()), a pusher CASes the head or its
 * CPU's stage and then reads kick_needed, all sequentially consistent
 * (the thread's side an exchange: see deferred.c on qemu-user), so one of
 * them sees the other.  The thread holds
 * managed_lock from setting it until cond_wait releases the lock, so a
 * pusher that saw it signals a thread that is waiting.
 */
void percpuref_managed_kick(void)
{
	managed_init();
	if (!__atomic_load_n(&kick_needed, __ATOMIC_SEQ_CST))
		return;
	pthread_mutex_lock(&managed_lock);
	if (ensure_thread())
		pthread_cond_signal(&wake);
	pthread_mutex_unlock(&managed_lock);
}

/* How many exits this one makes to count in: 1, EXITS_COUNTED_TOGETHER
 * (the 64th on its CPU) or 0 (counted on the CPU, not yet in). */
static unsigned long exits_to_count(void)
{
	/* Acquire: pairs with managed_cpus_alloc()'s release. */
	struct managed_cpu *cpus = __atomic_load_n(&managed_cpus, __ATOMIC_ACQUIRE);
	unsigned int nr = managed_nr, cpu;

	if (!cpus || (cpu = this_cpu_index(nr)) >= nr)
		return 1;
	/* Relaxed: a count; the word's own RMWs keep it exact. */
	if (__atomic_add_fetch(&cpus[cpu].exits, 1, __ATOMIC_RELAXED) % EXITS_COUNTED_TOGETHER)
		return 0;
	return EXITS_COUNTED_TOGETHER;
}

/*
 * managed_lock.  An early pass asked for with no thread to serve it (one
 * that could not start for the exit that asked, or a shutdown whose drain
 * gave up) is withdrawn: the ask kept later exits from asking, so the
 * next counted exit asks again, and starts one.  Relaxed, as the exchange
 * in percpuref_managed_exited(): a flag that orders nothing.
 */
static void withdraw_unserved_early_pass_ask(void)
{
	if (!thread.running)
		__atomic_store_n(&early_pass_asked, false, __ATOMIC_RELAXED);
}

/*
 * After an exit that left its listed node to the reclaimer.  Such nodes are
 * freed by the next pass only, so a program that makes and exits managed
 * refs fast held rate x interval of them (switch-storm's managed variant:
 * 222 MB in 5 s at the default interval, docs/managed.md).  Once they are
 * at least EARLY_PASS_MIN_EXITED and half the nodes the last pass met, the
 * first exit to see it asks for the next pass to open and end now: the
 * thread scans back to back (giving way between scans) until it has, as
 * for a flush but with no one waiting.  The next pass, not the open one:
 * nodes exited during a pass may sit above its marker.  Memory stays
 * within about half the list, and the walk costs a bounded number of nodes
 * per exit.  Relaxed: a count (its exact value at the threshold does not
 * matter) and a flag that only keeps later exits off the lock until the
 * next pass opens; an exit that read the count before that pass reset it
 * asks once more, for the pass after, which frees what this one left.
 *
 * Each CPU counts its exits in EXITS_COUNTED_TOGETHER at a time: one add
 * to the process-wide word for every 64 exits, where every managed cycle
 * of switch-storm's managed-poll had moved that word's line between the
 * threads' CPUs (docs/managed.md, "An exited ref's node costs its CPU no
 * line").  The CPU's word is written by the threads that run there (an
 * atomic add: a thread may be moved between reading its CPU and the add,
 * and the word's line then moves once).  Per CPU, not per thread: a
 * thread's uncounted exits would be lost when it ends, and threads that
 * each exit fewer than 64 listed refs never asked for a pass (a review,
 * 0.4.16's first build: 3,000 threads of 63 exits, no pass in a 60 s
 * interval, 28 MB held; test_exits_of_short_threads).  So up to 63 exits
 * a CPU are not counted yet (the memory bound above grows by 63 nodes a
 * CPU), and an exit counted in after a pass opened may be one that pass
 * frees (a count ahead of the nodes by as much, which asks for a pass
 * that much sooner).
 */
void percpuref_managed_exited(void)
{
	unsigned long exited, counted = exits_to_count();

	if (!counted)
		return;
	exited = __atomic_add_fetch(&exited_since_pass, counted, __ATOMIC_RELAXED);
	if (exited < EARLY_PASS_MIN_EXITED ||
	    exited < __atomic_load_n(&last_pass_walked, __ATOMIC_RELAXED) / 2 ||
	    __atomic_exchange_n(&early_pass_asked, true, __ATOMIC_RELAXED))
		return;
	managed_init();
	pthread_mutex_lock(&managed_lock);
	early_target = passes_started + 1;
	if (ensure_thread())
		pthread_cond_signal(&wake);
	else
		withdraw_unserved_early_pass_ask();
	pthread_mutex_unlock(&managed_lock);
}

void percpuref_call_after_rcu(struct percpuref_deferred *d, percpuref_deferred_fn fn)
{
	managed_init();
	percpuref_note_work();
	pthread_mutex_lock(&managed_lock);
	d->fn = fn;
	d->next = NULL;
	*rcu_tail = d;
	rcu_tail = &d->next;
	/* Relaxed: read without the lock by percpuref_rcu_pace(). */
	__atomic_store_n(&rcu_queued, rcu_queued + 1, __ATOMIC_RELAXED);
	/* A failure to start leaves the item queued for the next kick. */
	if (ensure_thread())
		pthread_cond_signal(&wake);
	pthread_mutex_unlock(&managed_lock);
}

/* The exiting thread's percpuref_run_after_rcu_here(), holding the scan
 * role (which guards them): the items its round has yet to run
 * (here_rest), and those the @releases it runs let go of, for its next
 * round (here_head).  Not on its stack: a fork by another thread while a
 * @release is paused finds them (managed_fork_child(); review 179). */
static struct percpuref_deferred *here_head, **here_tail = &here_head, *here_rest;

bool percpuref_run_after_rcu_here(struct percpuref_deferred *d, percpuref_deferred_fn fn)
{
	unsigned int pins;

	d->fn = fn;
	d->next = NULL;
	/*
	 * Nested: a @release that the loop below runs, with the role held
	 * (paused around it), let go of another percpu_rcuref.  Its turn
	 * comes when that @release has returned, not on its stack: a chain
	 * of objects, each @release letting go of the next, recursed a link
	 * deeper each, and overflowed the stack (review 178: 50,000 links,
	 * the main thread's 8 MiB).
	 */
	if (percpuref_exit_rcu_role) {
		/* Release: the scan lock is not held here (paused), so
		 * another thread's fork may copy the list meanwhile, and its
		 * child must find @d whole once linked (review 181). */
		__atomic_store_n(here_tail, d, __ATOMIC_RELEASE);
		here_tail = &d->next;
		return true;
	}
	if (!percpuref_batch_try_begin(&scan))
		return false;
	/* Called inside a confirm (pinned, no batch held: a kill's confirm
	 * that let go of a percpu_rcuref): the pins guard no batch lock of
	 * ours, and would keep the scan lock held through each @release
	 * (percpuref_batch_pause()), so that a fork waited for it, and a
	 * @release waiting for that fork hung the exit (review 180). */
	pins = percpuref_batch_pins_take();
	percpuref_exit_rcu_role = true;
	here_head = d;
	here_tail = &d->next;
	/* One grace period for the items queued by the round before. */
	while ((here_rest = here_head)) {
		here_head = NULL;
		here_tail = &here_head;
		percpuref_synchronize_rcu();
		/* For TSAN: pairs with the release in
		 * percpu_rcuref_read_unlock(), as in run_rcu_batch(). */
		percpuref_tsan_acquire(&percpuref_rcu_tsan_sync);
		/* Off here_rest before it runs: a fork child finds the rest. */
		percpuref_deferred_run(&here_rest, NULL);
	}
	percpuref_exit_rcu_role = false;
	percpuref_batch_pins_restore(pins);
	percpuref_batch_end(&scan);
	return true;
}

void percpuref_rcu_pace(void)
{
	/* Relaxed: a hint, compared with the items run. */
	unsigned long queued = __atomic_load_n(&rcu_queued, __ATOMIC_RELAXED);

	if (percpuref_backlog_over(&rcu_backlog, queued))
		percpuref_backlog_wait(&rcu_backlog, queued);
}

PERCPUREF_API unsigned long percpuref_rcu_stalls(void)
{
	return percpuref_backlog_stalls(&rcu_backlog);
}

int percpuref_managed_may_wait(const char *fn)
{
	if (percpuref_on_library_thread() || percpuref_holds_batch_lock()) {
		percpuref_warn(fn, "called from a callback; would wait for itself");
		return -EDEADLK;
	}
	/* The reclaimer's grace periods would wait for the caller's section. */
	if (percpuref_rcu_read_ongoing()) {
		percpuref_warn(fn, "called inside an RCU read-side section; would wait for "
			       "itself");
		return -EDEADLK;
	}
	return 0;
}

/* The scanner's.  Runs the @release of every ref in scan_released, taking
 * each off first; returns how many. */
static unsigned long run_scan_releases(void)
{
	struct percpuref_mnode *node;
	unsigned long n = 0;

	if (scan_cut) {
		percpuref_managed_release_done(scan_cut);
		scan_cut = NULL;
	}
	for (; (node = scan_released); n++) {
		scan_released = node->next;
		scan_releasing = node;
		percpuref_managed_release(node);
		scan_releasing = NULL;
	}
	return n;
}

/* managed_lock held on entry and on return, dropped meanwhile.  One grace
 * period for the whole queue, then the items in order, as the scanner (the
 * lock taken first: rank order), so that a fork finds the items not
 * started in rcu_rest. */
static void run_rcu_batch(void)
{
	uint64_t n;

	pthread_mutex_unlock(&managed_lock);
	percpuref_batch_begin(&scan);
	pthread_mutex_lock(&managed_lock);
	rcu_rest = rcu_head;
	rcu_head = NULL;
	rcu_tail = &rcu_head;
	pthread_mutex_unlock(&managed_lock);

	percpuref_synchronize_rcu();
	/* For TSAN: pairs with the release in percpu_rcuref_read_unlock(). */
	percpuref_tsan_acquire(&percpuref_rcu_tsan_sync);
	n = percpuref_deferred_run(&rcu_rest, &rcu_backlog);

	pthread_mutex_lock(&managed_lock);
	stats.rcu_grace_periods++;
	/* Relaxed: read without the lock by percpuref_backlog_over(). */
	__atomic_store_n(&rcu_done, rcu_done + n, __ATOMIC_RELAXED);
	pthread_cond_broadcast(&progress);
	percpuref_batch_end(&scan);
}

void percpuref_wait_rcu(void)
{
	uint64_t target;
	int cancel;

	cancel = percpuref_cancel_disable();
	pthread_mutex_lock(&managed_lock);
	target = rcu_queued;
	while (rcu_done < target) {
		/* No thread can start: run the queue here (the callers may
		 * wait for a grace period), as for the callback thread's. */
		if (!ensure_thread()) {
			run_rcu_batch();
			continue;
		}
		pthread_cond_wait(&progress, &managed_lock);
	}
	pthread_mutex_unlock(&managed_lock);
	percpuref_cancel_restore(cancel);
}

/* The held warning below is due for @node; the ref's switch lock held. */
static bool held_warning_due(const struct percpuref_mnode *node, uint64_t now)
{
	return held_warn_ns && !node->held_warned && now - node->listed_ns > held_warn_ns;
}

/*
 * PERCPUREF_MANAGED_WARN_S: a managed ref still held long after it went
 * under management is most often one whose creator never dropped its own
 * reference (the contract before the manager took a reference of its own).
 * Once per ref and listing; the ref's switch lock held.  @others: the references
 * seen besides the manager's; a pinned count (misuse, warned already) or
 * an unknown number (ULONG_MAX) is no number of holders.
 */
static void warn_held(struct percpuref_mnode *node, unsigned long others, uint64_t now)
{
	if (!held_warning_due(node, now) || others >= PERCPU_REF_UNDERFLOW_ZONE)
		return;
	node->held_warned = true;
	percpuref_warn("percpuref_reclaimer", "ref %p managed for %lu s, still held by %lu "
		       "reference(s) besides the manager's; did its creator drop its own "
		       "with percpu_ref_put()?", (void *)percpuref_managed_ref(node),
		       (unsigned long)((now - node->listed_ns) / 1000000000u), others);
}

/*
 * One chunk of a scan: look at up to @limit refs below the cursor; switch
 * those that need the exact check (all of them, or with @filter those that
 * look idle) and finish them after one fence.  scan_lock held.  Released
 * nodes are chained on *@released (through their next pointers: they are
 * off the list).  Returns the refs looked at; *@switched and *@skipped
 * split them; *@end is set when the walk reached the bottom of the list.
 * @at_exit: percpuref_managed_finish()'s.
 */
static unsigned long check_chunk(unsigned long limit, bool filter, bool at_exit,
				 struct percpuref_mnode **released, unsigned long *switched,
				 unsigned long *skipped, bool *end)
{
	struct percpuref_mnode *prev = cursor, *node;
	unsigned long k = 0, i, others;
	uint64_t now = held_warn_ns ? percpuref_monotonic_ns() : 0;
	struct percpuref_switch_stripe *stripe;
	bool exited;
	/* Impls of exited refs freed here: given as spares, a chain at a
	 * time, with no stripe held (percpu_alloc.c, "Spares"). */
	struct percpuref_spares spares = { NULL, 0 };

	*switched = *skipped = 0;
	while (k < limit && ((node = prev->next) || (node = attach_taken(prev)))) {
		if (node->marker) {	/* an earlier pass's */
			prev->next = node->next;
			free(node);
			continue;
		}
		pass_walked++;
		/* Most nodes a pass meets are of exited refs: no stripe for
		 * them, whose line the ref's next user (a new ref at the same
		 * address) would take back from this CPU.  One exited after
		 * the look is found under the stripe (MANAGED_FREE too). */
		exited = percpuref_managed_node_exited(node);
		stripe = exited ? NULL : percpuref_managed_lock_node(node);
		/* A ref whose warning is due gets the exact check, which
		 * counts its holders: one the filter finds in use at every
		 * scan was never warned about. */
		switch (exited ? MANAGED_FREE
			       : percpuref_managed_begin(node, filter && !held_warning_due(node, now),
							 &others)) {
		case MANAGED_CHECK:
			node->checking = true;
			++*switched;
			k++;
			prev = node;
			break;
		case MANAGED_SKIP:
			warn_held(node, others, now);
			node->checking = false;
			++*skipped;
			k++;
			prev = node;
			break;
		case MANAGED_UNLINK:
			prev->next = node->next;
			break;
		case MANAGED_FREE:
			prev->next = node->next;
			percpuref_managed_free(node, &spares);
			break;
		}
		if (stripe)
			percpuref_managed_unlock_node(stripe);	/* valid after the free */
		if (spares.n == PERCPUREF_SPARE_CHAIN)
			percpuref_spares_give(&spares);
	}
	percpuref_spares_give(&spares);
	*end = !prev->next && !taken_left;
	if (!*switched) {
		cursor = prev;
		return k;
	}

	percpuref_fence_readers();

	/* The k nodes looked at follow the cursor, contiguous: nothing else
	 * unlinks below the marker, and nothing is linked there but a stage
	 * taken, by the first half, below the last node (attach_taken()). */
	prev = cursor;
	for (i = 0; i < k; i++) {
		node = prev->next;
		if (!node->checking) {
			prev = node;
			continue;
		}
		stripe = percpuref_managed_lock_node(node);
		if (percpuref_managed_finish(node, &others, at_exit)) {
			prev->next = node->next;
			node->next = *released;
			*released = node;
		} else {
			warn_held(node, others, now);
			prev = node;
		}
		percpuref_managed_unlock_node(stripe);
	}
	*end = !prev->next && !taken_left;
	cursor = prev;
	return k;
}

/*
 * One scan: up to max_per_scan refs (all with @unlimited), resuming the
 * open pass or opening one.  Called by the one scanner, no lock held.
 * False (warned) if no pass could be opened for want of memory.
 */
static bool scan_once(bool unlimited)
{
	struct percpuref_mnode *released = NULL;
	unsigned long checked = 0, fences = 0, nreleased = 0, limit, max;
	unsigned long switched, skipped, nswitched = 0, nskipped = 0;
	enum percpu_ref_scan_strategy strategy;
	/* A pass after exit began (the exit's own, from its exit handler,
	 * or a later one) checks every ref exactly, one fence for all: a
	 * held ref leaves management there (percpuref_managed_finish()). */
	bool at_exit = percpuref_exit_began();
	bool end = false;
	uint64_t start, elapsed;

	pthread_mutex_lock(&managed_lock);
	max = unlimited ? 0 : config.max_per_scan;
	strategy = at_exit ? PERCPU_REF_SCAN_BATCHED : config.strategy;
	pthread_mutex_unlock(&managed_lock);

	percpuref_batch_begin(&scan);
	/* Releases a fork child found pending (in the parent, none). */
	(void)run_scan_releases();
	start = percpuref_monotonic_ns();
	if (!cursor) {
		/*
		 * A pass starts, or is refused, in one managed_lock section
		 * with its count: a flush (which takes its target under that
		 * lock) then either sees the pass counted, or started after
		 * it took the stages and its marker went on top of every ref
		 * pushed before it.  The
		 * marker was pushed before the count: a flush in between
		 * named this pass as one starting after it, and the ref it
		 * had just pushed, above the marker, stayed unreleased.
		 */
		pthread_mutex_lock(&managed_lock);
		if (nothing_listed(__ATOMIC_RELAXED)) {
			/* An empty pass: nothing to check, a flush is satisfied. */
			passes_started++;
			passes_done++;
			pthread_cond_broadcast(&progress);
			pthread_mutex_unlock(&managed_lock);
			percpuref_batch_end(&scan);
			return true;
		}
		pass_marker = percpuref_zalloc(sizeof(*pass_marker));
		if (!pass_marker) {
			/* The flushes waiting fail rather than wait for memory,
			 * and the thread goes back to its interval: with a flush
			 * target left, it retried back to back, warning each
			 * time, and the flush hung while memory was short.
			 * One warning while memory stays short, not one per
			 * try (the thread retried every interval: 0 ms is
			 * allowed, and it flooded stderr). */
			bool warn = !marker_refused;

			marker_refused = true;
			passes_refused++;
			flush_target = passes_done;
			pthread_cond_broadcast(&progress);
			pthread_mutex_unlock(&managed_lock);
			percpuref_batch_end(&scan);
			if (warn)
				percpuref_warn("percpuref_reclaimer", "no memory for a marker; scans "
					       "skipped until memory returns");
			return false;
		}
		marker_refused = false;
		take_stages();
		pass_marker->marker = true;
		pass_marker->next = __atomic_load_n(&list_head, __ATOMIC_RELAXED);
		/* Acquire: pairs with the release CAS of the pushes on the
		 * head below the marker, whose nodes the walk reads (the
		 * stages' nodes: take_stages()'s exchange).  Release: a push
		 * that reads the marker as top links to an initialised node. */
		while (!__atomic_compare_exchange_n(&list_head, &pass_marker->next, pass_marker,
						    true, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			;
		cursor = pass_marker;
		passes_started++;
		pass_open = true;
		pass_walked = 0;
		/* Exits from here on are the next pass's to count: the nodes
		 * exited before are below the marker, and this pass frees them.
		 * Relaxed, both: hints that percpuref_managed_exited() reads
		 * without the lock; an exit counted on the wrong side of the
		 * reset only moves the next ask (see there). */
		__atomic_store_n(&exited_since_pass, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&early_pass_asked, false, __ATOMIC_RELAXED);
		pthread_mutex_unlock(&managed_lock);
	}
	while (!end && (!max || checked < max)) {
		limit = strategy == PERCPU_REF_SCAN_FAITHFUL ? 1 : max ? max - checked : ULONG_MAX;
		checked += check_chunk(limit, strategy == PERCPU_REF_SCAN_FILTERED, at_exit,
				       &released, &switched, &skipped, &end);
		nswitched += switched;
		nskipped += skipped;
		fences += switched != 0;
	}
	if (end) {
		/* Pop our marker if nothing was pushed above it (relaxed:
		 * pushers never read the node the head names, and the next
		 * scanner reads it after scan_lock, as every node below a
		 * marker); otherwise the next pass frees it. */
		struct percpuref_mnode *top = pass_marker;

		if (__atomic_compare_exchange_n(&list_head, &top, pass_marker->next, false,
						__ATOMIC_RELAXED, __ATOMIC_RELAXED))
			free(pass_marker);
		cursor = pass_marker = NULL;
	}
	elapsed = percpuref_monotonic_ns() - start;

	/* Where a fork child finds the ones not run yet: each @release runs
	 * with scan_lock released, so a fork may come in between. */
	scan_released = released;
	nreleased = run_scan_releases();

	pthread_mutex_lock(&managed_lock);
	if (checked) {
		stats.scans++;
		stats.refs_scanned += checked;
		stats.refs_switched += nswitched;
		stats.refs_skipped += nskipped;
		stats.released += nreleased;
		stats.fences += fences;
		stats.scan_ns_total += elapsed;
		stats.scan_ns_last = elapsed;
		if (elapsed > stats.scan_ns_max)
			stats.scan_ns_max = elapsed;
	}
	if (end) {
		/* Relaxed: a threshold percpuref_managed_exited() reads
		 * without the lock; stale, it moves an early ask a little. */
		__atomic_store_n(&last_pass_walked, pass_walked, __ATOMIC_RELAXED);
		passes_done++;
		stats.passes++;
		pass_open = false;
		pthread_cond_broadcast(&progress);
	}
	pthread_mutex_unlock(&managed_lock);
	percpuref_batch_end(&scan);
	return true;
}

/*
 * PERCPUREF_RECLAIMER_NICE=N (1..19) runs the reclaimer at nice N: a
 * reclaimer scanning back to back then takes the CPU time nobody else wants
 * (about 1.5% of a CPU at 19 when every CPU is busy) instead of a fair share
 * of the CPUs the users of the refs fill.  Not the default, because it
 * inverts priorities: the reclaimer holds scan_lock for a whole scan, and a
 * fork (which takes it), a flush or a shutdown then waits for a thread that
 * gets CPU time only when nobody else wants it (stress_fork, at nice 19 on a
 * busy machine: 2 forks in 3 s instead of 11 to 47).  Refused (a sandbox):
 * warned, and it runs at the process's priority.  It only ever lowers the
 * priority: a thread created at nice 19 stays there when asked for 7.
 * Created at its creator's nice value (Linux's is per thread): the thread
 * whose call started it, usually the process's.
 */
static void reclaimer_lower_priority(void)
{
	id_t tid;
	int now;

	if (!reclaimer_nice)
		return;
	/* On Linux a thread id names one thread, not the process. */
	tid = (id_t)syscall(SYS_gettid);
	/* Lower only: in a process that runs at a nicer value already (nice
	 * 19, asked for 7), a privileged one raised the reclaimer above
	 * every thread of its own. */
	errno = 0;
	now = getpriority(PRIO_PROCESS, tid);
	if (!errno && now >= (int)reclaimer_nice)
		return;
	if (setpriority(PRIO_PROCESS, tid, (int)reclaimer_nice))
		percpuref_warn("percpuref_managed", "cannot set the reclaimer's nice value to %lu "
			       "(%s); it competes with the process's threads for CPU",
			       reclaimer_nice, strerror(errno));
}

/*
 * The reclaimer's wait after a pass that got no memory, doubling from 1 ms
 * while memory stays short, at least the interval: at interval 0 it
 * retried back to back, a core busy failing to allocate.  An early pass
 * that exits asked for stays asked for, and is tried again after the
 * same wait, not the interval's: dropped, no exit could ask again until a
 * pass opened, and exited refs piled up for a whole interval after memory
 * came back.
 */
#define REFUSED_BACKOFF_MAX_MS 1024

static void *reclaimer_main(void *arg)
{
	struct timespec until;
	bool just_scanned = false;	/* no sleep since the last scan */
	uint64_t refused_backoff_ms = 0;
	/* An early pass is not tried again before this (a refusal's wait). */
	uint64_t early_retry_ns = 0;
	uint64_t now, wake_ns;

	(void)arg;
	reclaimer_lower_priority();
	pthread_mutex_lock(&managed_lock);
	for (;;) {
		/* Before the RCU queue: while another thread kept queueing
		 * releases it was never empty, and a stop (shutdown, exit())
		 * waited for ever.  The stopper runs what is queued (drain()). */
		if (thread.stopping)
			break;
		if (rcu_head) {
			run_rcu_batch();
			continue;
		}
		now = percpuref_monotonic_ns();
		if (passes_done >= flush_target) {
			if (!pass_open && nothing_listed(__ATOMIC_RELAXED)) {
				/* Idle: a push or a flush kicks us.  The
				 * Dekker pair of a push (kick). */
				(void)__atomic_exchange_n(&kick_needed, true, __ATOMIC_SEQ_CST);
				if (nothing_listed(__ATOMIC_SEQ_CST))
					pthread_cond_wait(&wake, &managed_lock);
				/* Relaxed: awake, we scan within an interval,
				 * and swap it back (above) before we sleep
				 * idle: a pusher that reads this false read it
				 * before that seq_cst exchange, so the re-read
				 * after it sees the push. */
				__atomic_store_n(&kick_needed, false, __ATOMIC_RELAXED);
				just_scanned = false;
				continue;
			}
			/* Not yet due, and no exits asked for a pass (or their
			 * ask waits out a refusal). */
			if (now < next_scan_ns &&
			    (passes_done >= early_target || now < early_retry_ns)) {
				wake_ns = passes_done < early_target ? early_retry_ns
								     : next_scan_ns;
				if (wake_ns > next_scan_ns)
					wake_ns = next_scan_ns;
				until.tv_sec = (time_t)(wake_ns / 1000000000u);
				until.tv_nsec = (long)(wake_ns % 1000000000u);
				pthread_cond_timedwait(&wake, &managed_lock, &until);
				just_scanned = false;
				continue;
			}
			if (just_scanned) {
				/* Back to back, nobody waiting: give way (above). */
				just_scanned = false;
				pthread_mutex_unlock(&managed_lock);
				sched_yield();
				pthread_mutex_lock(&managed_lock);
				continue;
			}
		}
		next_scan_ns = now + config.interval_ms * UINT64_C(1000000);
		pthread_mutex_unlock(&managed_lock);
		if (scan_once(false))
			refused_backoff_ms = 0;
		else if (refused_backoff_ms < REFUSED_BACKOFF_MAX_MS)
			refused_backoff_ms = refused_backoff_ms ? 2 * refused_backoff_ms : 1;
		pthread_mutex_lock(&managed_lock);
		early_retry_ns = 0;
		if (refused_backoff_ms) {
			uint64_t retry_ns = percpuref_monotonic_ns() + refused_backoff_ms * UINT64_C(1000000);

			if (next_scan_ns < retry_ns)
				next_scan_ns = retry_ns;
			early_retry_ns = retry_ns;
		}
		just_scanned = true;
	}
	thread.running = false;
	/* Stopping: the Dekker pair of a push, so that a later push kicks,
	 * which starts a new thread once thread.running is false, and an
	 * earlier one is seen by the stopper's drain (stop_thread()).  A
	 * relaxed store here, with the drain's relaxed looks at the stages,
	 * left such a push for the next kick, push or flush under C11 (a
	 * store-buffering shape, which x86 forbids). */
	(void)__atomic_exchange_n(&kick_needed, true, __ATOMIC_SEQ_CST);
	pthread_cond_broadcast(&progress);
	pthread_mutex_unlock(&managed_lock);
	return NULL;
}

PERCPUREF_API void percpu_ref_managed_get_config(struct percpu_ref_managed_config *out)
{
	managed_init();
	pthread_mutex_lock(&managed_lock);
	*out = config;
	pthread_mutex_unlock(&managed_lock);
}

PERCPUREF_API int percpu_ref_managed_set_config(const struct percpu_ref_managed_config *in)
{
	if (!in) {
		percpuref_warn(__func__, "NULL config; ignored");
		return -EINVAL;
	}
	/* Bounded so that interval * 10^6 ns never wraps (test_hardening.c,
	 * finding 12). */
	if (in->interval_ms > PERCPU_REF_MANAGED_INTERVAL_MAX_MS) {
		percpuref_warn(__func__, "interval %lu ms is above %lu; ignored", in->interval_ms,
			       PERCPU_REF_MANAGED_INTERVAL_MAX_MS);
		return -EINVAL;
	}
	if (in->strategy != PERCPU_REF_SCAN_FAITHFUL && in->strategy != PERCPU_REF_SCAN_BATCHED &&
	    in->strategy != PERCPU_REF_SCAN_FILTERED) {
		percpuref_warn(__func__, "unknown strategy %d; ignored", (int)in->strategy);
		return -EINVAL;
	}
	managed_init();
	pthread_mutex_lock(&managed_lock);
	/*
	 * The interval runs from scan start to scan start: the next scan is
	 * due one new interval after the last one started (at once if that
	 * has passed).  One new interval from now let a caller that set the
	 * config more often than the interval keep the reclaimer from ever
	 * scanning.  next_scan_ns is at least the old interval (a start plus
	 * it, or later); a thread not running sets it when it starts.
	 */
	if (thread.running)
		next_scan_ns = next_scan_ns - config.interval_ms * UINT64_C(1000000) +
			       in->interval_ms * UINT64_C(1000000);
	config = *in;
	pthread_cond_signal(&wake);
	pthread_mutex_unlock(&managed_lock);
	return 0;
}

PERCPUREF_API void percpu_ref_managed_get_stats(struct percpu_ref_managed_stats *out)
{
	pthread_mutex_lock(&managed_lock);
	*out = stats;
	pthread_mutex_unlock(&managed_lock);
}

PERCPUREF_API int percpu_ref_managed_flush(void)
{
	uint64_t target, refused;
	int ret = percpuref_managed_may_wait(__func__), cancel;

	if (ret)
		return ret;
	managed_init();
	cancel = percpuref_cancel_disable();
	pthread_mutex_lock(&managed_lock);
	/* A pass that starts after now: the open one (if any) may have
	 * walked past refs pushed before the call. */
	target = passes_started + 1;
	if (flush_target < target)
		flush_target = target;
	refused = passes_refused;
	while (passes_done < target) {
		if (passes_refused != refused) {
			ret = -ENOMEM;
			break;
		}
		if (ensure_thread()) {
			pthread_cond_signal(&wake);
			pthread_cond_wait(&progress, &managed_lock);
			continue;
		}
		/* No thread can start: be the scanner, as shutdown is (scan_lock
		 * makes one scanner, should a thread start meanwhile). */
		pthread_mutex_unlock(&managed_lock);
		scan_once(true);
		pthread_mutex_lock(&managed_lock);
	}
	pthread_mutex_unlock(&managed_lock);
	percpuref_cancel_restore(cancel);
	/* The releases those passes deferred past a grace period. */
	if (!ret)
		percpuref_wait_rcu();
	return ret;
}

/*
 * Stops the thread and waits for it (percpuref_stop_thread()).  Then a
 * seq_cst fence, before the drain's looks at the list and the stages: a
 * pusher that read kick_needed false made its seq_cst CAS before that
 * read, and the read came before the thread's exchange at its stop in the
 * single total order (it read the older value); the exchange happens
 * before this fence (through the join, or managed_lock where another
 * stopper joined), so the CAS precedes the fence in that order too, and
 * every look sequenced after the fence sees the push (C11 7.17.3p9).  A
 * re-read by the thread would not do: nothing_listed() stops at the first
 * word it finds set, leaving the others' looks unordered with their
 * pushes (review 150, 151).
 */
static void stop_thread(void)
{
	pthread_mutex_lock(&managed_lock);
	percpuref_stop_thread(&thread, &managed_lock, &wake, &progress);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
}

#define DRAIN_REFUSED_MAX_MS 100

/*
 * With the thread stopped, be the scanner: finish the open pass and run a
 * whole new one, then the RCU-deferred releases queued until then (one
 * batch takes them all: other threads may keep queueing).  True if any
 * work was done (which may have queued more: callbacks can kill refs or
 * make new ones).
 */
static bool drain(void)
{
	uint64_t target, rcu_target, done_before;
	/* A pass refused for want of memory is tried again after 1, 10 and
	 * 100 ms: at exit no later scan comes, and the refs' @release would
	 * never run (it gave up at the first refusal).  Then it gives up:
	 * the refs wait for a later scan, if any. */
	unsigned int refused_ms = 1;
	bool worked;

	pthread_mutex_lock(&managed_lock);
	target = passes_started + 1;
	done_before = stats.released + rcu_done;
	while (passes_done < target) {
		pthread_mutex_unlock(&managed_lock);
		if (!scan_once(true)) {
			if (refused_ms > DRAIN_REFUSED_MAX_MS) {
				pthread_mutex_lock(&managed_lock);
				break;
			}
			percpuref_sleep_us(refused_ms * 1000UL);
			refused_ms *= 10;
		}
		pthread_mutex_lock(&managed_lock);
	}
	rcu_target = rcu_queued;
	while (rcu_done < rcu_target)
		run_rcu_batch();
	worked = stats.released + rcu_done != done_before;
	pthread_mutex_unlock(&managed_lock);
	return worked;
}

PERCPUREF_API void percpuref_shutdown(void)
{
	unsigned long outside;
	bool worked;
	int cancel;

	if (percpuref_managed_may_wait(__func__))
		return;
	/* A round in pipeline order: the reclaimer stopped (its last
	 * releases may kill refs), pending kills and switches (whose releases
	 * may drop managed refs or queue RCU releases), a pass (whose releases
	 * may queue RCU releases), the RCU releases; so the first round
	 * finishes everything pending at the call.  Then until quiet: a
	 * release may kill or drop other refs.  But not while other threads
	 * queue work: they may never stop, and each round would find more
	 * (exit() hung so); what they queue is left to the threads, which
	 * start again for it.  The grace periods, joins and callbacks on this
	 * thread: see percpuref_cancel_disable(). */
	cancel = percpuref_cancel_disable();
	outside = percpuref_shutdown_begin();
	do {
		stop_thread();
		worked = percpuref_deferred_stop();
		worked |= drain();
		pthread_mutex_lock(&managed_lock);
		worked |= thread.running || rcu_head;
		pthread_mutex_unlock(&managed_lock);
	} while (worked && !percpuref_outside_work_since(outside));
	/* An early pass asked for that drain() gave up on (memory refused). */
	pthread_mutex_lock(&managed_lock);
	withdraw_unserved_early_pass_ask();
	pthread_mutex_unlock(&managed_lock);
	percpuref_shutdown_end();
	percpuref_cancel_restore(cancel);
}

static void scan_fork_prepare(void)
{
	percpuref_batch_fork_prepare(&scan);
}

static void scan_fork_parent(void)
{
	percpuref_batch_fork_parent(&scan);
}

/* What a scanner paused in a @release had left is requeued
 * (managed_fork_child()). */
static void scan_fork_child(void)
{
	percpuref_batch_fork_child(&scan);
}

static void managed_fork_prepare(void)
{
	pthread_mutex_lock(&managed_lock);
	percpuref_wait_thread_started(&thread);
}

static void managed_fork_parent(void)
{
	pthread_mutex_unlock(&managed_lock);
}

static void managed_fork_child(void)
{
	/* The parent's thread does not exist here, nor flush waiters. */
	bool restart = thread.running;

	/* A condition variable the parent's threads waited on keeps their
	 * phantom waiters in the child: a signal could go to one of them. */
	init_conds();
	thread.running = false;
	kick_needed = true;
	thread.stopping = false;
	/* An ask the parent made is the parent's: the child's exits ask
	 * again (the flag would keep them off until a pass opened). */
	early_pass_asked = false;
	/* What a scanner paused in a @release at the fork had left (scan_lock
	 * is ours too): the RCU items not started go before the queued ones,
	 * and count as queued again; released refs whose @release has not
	 * run, for the child's next scan (asked for here).  The @release in
	 * progress was the parent's thread's, and goes on there only; the
	 * child's next scan finishes its node without it (reinitialised
	 * here, the ref never went back on the list).  Unless this thread is
	 * the one running it (a callback that forked): it goes on here too. */
	if (scan_releasing && percpuref_batch_fork_took(&scan)) {
		scan_cut = scan_releasing;
		scan_releasing = NULL;
	}
	/* Likewise what an exiting thread's percpuref_run_after_rcu_here()
	 * had left, when another thread forked (that thread is not here):
	 * before the RCU items not started, its own having come first.  The
	 * exiting thread's own fork (from a @release) keeps them, and its
	 * loop goes on here. */
	if (percpuref_batch_fork_took(&scan) && (here_rest || here_head)) {
		struct percpuref_deferred **tail = &here_rest;

		while (*tail)
			tail = &(*tail)->next;
		*tail = here_head;
		/* Walked, not here_tail: a @release may have been appending. */
		while (*tail)
			tail = &(*tail)->next;
		*tail = rcu_rest;
		rcu_rest = here_rest;
		here_rest = here_head = NULL;
		here_tail = &here_head;
	}
	if (rcu_rest) {
		struct percpuref_deferred *last = rcu_rest;

		while (last->next)
			last = last->next;
		last->next = rcu_head;
		if (!rcu_head)
			rcu_tail = &last->next;
		rcu_head = rcu_rest;
		rcu_rest = NULL;
	}
	/* Counted again from what is queued: a batch cut short here was
	 * never counted done, its interrupted item included. */
	rcu_queued = rcu_done;
	for (struct percpuref_deferred *d = rcu_head; d; d = d->next)
		rcu_queued++;
	/* Paced callers compare queue positions with it (internal.h). */
	rcu_backlog.ran = rcu_done;
	rcu_backlog.waiting = 0;	/* threads the child lacks */
	/* With no pass open, every pass started is done: a scan cut short
	 * after its pass ended never counted it, and its pass_open would
	 * keep an idle reclaimer scanning. */
	if (!cursor) {
		passes_done = passes_started;
		pass_open = false;
	}
	flush_target = passes_done + (scan_released || scan_cut);
	early_target = passes_done;	/* asked for by the parent's exits */
	/* It blocks on scan_lock until the fork hooks release it. */
	if (restart || rcu_head || scan_released || scan_cut)
		ensure_thread();
	pthread_mutex_unlock(&managed_lock);
}

static const struct percpuref_fork_hooks scan_hooks = {
	.rank = PERCPUREF_RANK_SCAN,
	.prepare = scan_fork_prepare,
	.parent = scan_fork_parent,
	.child = scan_fork_child,
};

static const struct percpuref_fork_hooks managed_hooks = {
	.rank = PERCPUREF_RANK_MANAGED,
	.prepare = managed_fork_prepare,
	.parent = managed_fork_parent,
	.child = managed_fork_child,
};

/* Process exit joins the threads and releases what is releasable. */
static __attribute__((constructor)) void managed_register(void)
{
	percpuref_register_fork_hooks(&scan_hooks);
	percpuref_register_fork_hooks(&managed_hooks);
	percpuref_register_exit_hook(PERCPUREF_RANK_SCAN, percpuref_shutdown);
}
