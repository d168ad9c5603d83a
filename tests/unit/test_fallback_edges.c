/* SPDX-License-Identifier: MIT */
/*
 * test_fallback_edges.c - per-thread state of the fast paths at the edges
 * of a thread's life and of signal handling, each case in a child with a
 * deadline (a hang or a crash fails the case, never the run):
 *  - a thread whose first call comes from a pthread key destructor in the
 *    last round glibc runs (PTHREAD_DESTRUCTOR_ITERATIONS), so that its exit
 *    hook never runs, its stack unmapped after the join: a later fence must
 *    not read the dead thread's TLS, the fallback unit must come back (the
 *    kernel's robust-futex notice of the thread's death, where it gives
 *    one), and a thread started on the same stack first must count
 *    exactly;
 *  - a signal handler whose put releases a ref, whose release runs a
 *    synchronous switch of another ref (both allowed: docs/percpu_ref.md,
 *    "Signal handlers", "What a callback may call"), while the interrupted
 *    code is inside a get or put: the switch must not wait for ever;
 *  - such a switch's fence while the interrupted code is locking a robust
 *    mutex (its own, process-shared): the fence must leave the thread's
 *    robust-futex list alone, or a process killed right after loses the
 *    kernel's notice of that mutex's owner death;
 *  - a handler that interrupted a get or put forks while another thread
 *    fences back to back: that fence waits for the interrupted section,
 *    which cannot end before the handler returns, so the fork must not
 *    wait for it (the readers' lock it holds, the sync-switch lock it
 *    read-holds).  Up to 0.3.15 the fork waited, and both hung.
 *  - a fork that waits for a synchronous switch in flight goes before
 *    switches that start meanwhile (writers first): a handler holds its
 *    section open, so the switch's fence waits, and the fork with it; a
 *    second switch started then must wait for the fork, asleep, not
 *    begin (nor spin: a thread that never sleeps fails too).  A
 *    stream of switches otherwise delays a fork as long as it lasts: with
 *    three threads switching back to back, a fork took 174-357 ms on
 *    average and up to 1.2 s, against 2-4 ms (2-vCPU guest).  Up to 0.4.3
 *    glibc's writer-first rwlock kind gave this, which musl lacks.
 *  - a fence covers only what was stamped before it started (its ticket
 *    is taken first): a stamp taken while a switch's fence waits for a
 *    held section is not covered when that fence ends, and is by the next.
 *  - a unit's owner dies inside a section (its handler leaves by a raw
 *    exit: no exit hook runs) while a fence waits for it: the fence must
 *    end, and the unit come back.  Up to 0.4.29 it waited for ever.
 *  - a handler inside a section puts the last reference of a ref, whose
 *    @release waits for the section to end, and waits while another
 *    thread reinits the ref, takes a reference and kills it; the handler's
 *    second put takes it to zero again.  Each zero has a release of its
 *    own: two, once each.  Up to 0.4.0 the second deferral linked the ref
 *    to itself, and the release ran for ever.  Again with the second zero
 *    on the other thread: by a put of its own, whose release runs at once,
 *    there; and by its own handler inside its own section, deferred and
 *    counted on the first thread's list, which runs both (up to 0.4.0 the
 *    two threads' lists were spliced).  Every deferred release runs on the
 *    thread that deferred the first.
 *  - as the last, but the other thread exits the ref while its release
 *    waits: the release never runs on an exited ref (its object may be
 *    gone), and the library frees what it kept of it once.  Up to 0.4.0
 *    the section's end read the freed ref.  Again with the ref reinited
 *    and put under management before the exit, so that the reclaimer and
 *    the handler's thread both hold it: freed once, by the last of them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "percpuref/managed.h"
#include "internal.h"
#include "fallback.h"
#include "child.h"
#include "fencer.h"
#include "ref_mode.h"
#include "signaller.h"
#include "tap.h"
#include "thread_names.h"

static struct percpu_ref ref;

static void pairs(struct percpu_ref *r, int n)
{
	for (int i = 0; i < n; i++) {
		percpu_ref_get(r);
		percpu_ref_put(r);
	}
}

/* Last key-destructor round. */
static pthread_key_t late_key;
static int late_rounds;

static void late_destructor(void *arg)
{
	(void)arg;
	/* Re-armed until the last round glibc runs, as allocators' caches
	 * do to outlive the other destructors. */
	if (++late_rounds < PTHREAD_DESTRUCTOR_ITERATIONS) {
		pthread_setspecific(late_key, &late_key);
		return;
	}
	pairs(&ref, 10);	/* the thread's first call */
}

static void *arm_late(void *arg)
{
	(void)arg;
	pthread_setspecific(late_key, &late_key);
	return NULL;
}

/* Whether the kernel walks this thread's robust-futex list at its exit
 * (not under qemu-user, which refuses the list). */
static bool robust_list_walked(void)
{
	size_t len;
	void *head;

	return syscall(SYS_get_robust_list, 0, &head, &len) == 0;
}

static bool successor_owned_unit;

static void *successor(void *arg)
{
	(void)arg;
	pairs(&ref, 1000);
	successor_owned_unit = percpuref_reader_self.state == PERCPUREF_READER_UNIT;
	return NULL;
}

static int case_last_round(void)
{
	size_t size = 1 << 20;
	unsigned int before;
	pthread_attr_t attr;
	pthread_t t;
	void *stack;

	child_deadline(20);
	/* On the fallback path two units: this thread's and the late
	 * thread's, so that the successor has one only if the dead thread's
	 * comes back. */
	if (getenv("PERCPUREF_NO_RSEQ"))
		percpuref_fault_cpu_units(1);
	percpu_ref_init(&ref, NULL, 0);
	pairs(&ref, 10);	/* this thread registers: the library's key first */
	before = percpuref_readers_registered();
	pthread_key_create(&late_key, late_destructor);
	stack = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (stack == MAP_FAILED)
		return 10;
	pthread_attr_init(&attr);
	pthread_attr_setstack(&attr, stack, size);
	if (pthread_create(&t, &attr, arm_late, NULL))
		return 11;
	pthread_join(t, NULL);
	if (late_rounds != PTHREAD_DESTRUCTOR_ITERATIONS)
		return 12;
	/* The next thread on that stack has its TLS where the dead one's was:
	 * a registration left there must not be taken for its own. */
	if (pthread_create(&t, &attr, successor, NULL))
		return 13;
	pthread_join(t, NULL);
	munmap(stack, size);	/* their TLS goes with it */
	/* A fence: read the dead thread's TLS before the fix (SIGSEGV). */
	percpu_ref_switch_to_atomic_sync(&ref);
	/* Atomic now: the count is exact, the initial reference alone. */
	if (__atomic_load_n(&ref.data->count, __ATOMIC_RELAXED) != 1) {
		fprintf(stderr, "# count %lu, want 1\n",
			__atomic_load_n(&ref.data->count, __ATOMIC_RELAXED));
		return 14;
	}
	/* Marks tell a dead owner only on glibc, with a robust-futex list. */
	if (!PERCPUREF_ROBUST_MARKS || !robust_list_walked() ||
	    strcmp(percpuref_fast_path(), "fallback"))
		return 0;
	if (!successor_owned_unit) {
		fprintf(stderr, "# the successor found no unit: the dead thread's kept\n");
		return 15;
	}
	if (percpuref_readers_registered() != before) {
		fprintf(stderr, "# fallback unit not given back (%u registered, was %u)\n",
			percpuref_readers_registered(), before);
		return 16;
	}
	return 0;
}

/* Signal handler's release running a synchronous switch. */
#define NR_RELEASES 200
static struct percpu_ref victims[NR_RELEASES];
static struct percpu_ref other;
static volatile sig_atomic_t handled;

static void release_switches(struct percpu_ref *r)
{
	(void)r;
	percpu_ref_switch_to_atomic_sync(&other);
	percpu_ref_switch_to_percpu(&other);
}

static void on_signal(int sig)
{
	(void)sig;
	if (handled < NR_RELEASES) {
		percpu_ref_put(&victims[handled]);	/* the last reference */
		handled++;
	}
}

static int case_handler_sync_switch(void)
{
	struct signaller signaller;
	struct sigaction sa;
	int i;

	child_deadline(30);
	percpu_ref_init(&ref, NULL, 0);
	percpu_ref_init(&other, NULL, PERCPU_REF_ALLOW_REINIT);
	for (i = 0; i < NR_RELEASES; i++)
		percpu_ref_init(&victims[i], release_switches, PERCPU_REF_INIT_ATOMIC);
	pairs(&ref, 10);	/* registered before any handler runs */
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGUSR1, &sa, NULL);
	signaller_start(&signaller, 50000);
	while (handled < NR_RELEASES) {
		pairs(&ref, 1000);
#ifdef __SANITIZE_THREAD__
		/* ThreadSanitizer delivers a signal only at a blocking call it
		 * intercepts (so never inside a get or put), and the pairs make
		 * none on rseq.  Elsewhere a sleep would take most signals,
		 * and the case would seldom interrupt a get or put. */
		nanosleep(&(struct timespec){ 0, 0 }, NULL);
#endif
	}
	signaller_stop(&signaller);
	return 0;
}

/*
 * Robust-futex state across a fence run by a signal handler.  glibc locks a
 * robust mutex in three steps: list_op_pending = the mutex, the lock word's
 * compare-and-swap, then the mutex onto the thread's list (and pending back
 * to NULL).  If the thread dies between the swap and the enqueue, the kernel
 * finds the mutex through list_op_pending and marks it FUTEX_OWNER_DIED.  A
 * handler that runs in between and calls pthread_mutex_trylock() on a robust
 * mutex (the fence's owner marks, fallback.c) sets and clears that same
 * pending slot: a process killed before the enqueue then leaves the mutex
 * locked for ever by a thread that no longer exists.  The grandchild below
 * stands in the middle of such a lock (the steps made by hand), a helper
 * thread owning a fallback unit, and dies right after the handler.
 */
#ifdef __GLIBC__	/* glibc's robust mutex layout and lock steps */
static volatile int helper_go_on;

static void *registered_helper(void *arg)
{
	pairs(&ref, 10);	/* owns a unit: its mark is held while it lives */
	__atomic_store_n((int *)arg, 1, __ATOMIC_RELEASE);
	while (!helper_go_on)
		percpuref_sleep_us(1000);
	return NULL;
}

static void on_signal_once(int sig)
{
	(void)sig;
	percpu_ref_put(&victims[0]);	/* the release switches @other, fences */
	handled++;
}

static int grandchild_mid_lock(pthread_mutex_t *m)
{
	struct robust_list_head *head;
	struct sigaction sa;
	pthread_t helper;
	int ready = 0;
	size_t len;
	int zero = 0;

	percpu_ref_init(&ref, NULL, 0);
	percpu_ref_init(&other, NULL, PERCPU_REF_ALLOW_REINIT);
	percpu_ref_init(&victims[0], release_switches, PERCPU_REF_INIT_ATOMIC);
	pairs(&ref, 10);	/* registered before any handler runs */
	if (pthread_create(&helper, NULL, registered_helper, &ready))
		return 1;
	while (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE))
		percpuref_sleep_us(1000);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal_once;
	sigaction(SIGUSR1, &sa, NULL);
	if (syscall(SYS_get_robust_list, 0, &head, &len))
		return 2;
	/* Steps 1 and 2 of glibc's lock (pthread_mutex_lock.c, robust). */
	__atomic_store_n(&head->list_op_pending,
			 (struct robust_list *)&m->__data.__list.__next, __ATOMIC_RELAXED);
	if (!__atomic_compare_exchange_n(&m->__data.__lock, &zero, (int)gettid(), false,
					 __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
		return 3;
	raise(SIGUSR1);
	if (!handled)
		return 4;
	/* Killed here, before step 3. */
	raise(SIGKILL);
	return 5;
}

static int case_handler_robust_pending(void)
{
	pthread_mutexattr_t attr;
	pthread_mutex_t *m;
	pid_t pid;
	int rc;

	child_deadline(30);
	if (!robust_list_walked())
		return 0;	/* qemu-user: no robust list, nothing to lose */
	m = mmap(NULL, sizeof(*m), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return 10;
	pthread_mutexattr_init(&attr);
	pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(m, &attr);
	pid = fork();
	if (pid == 0)
		_exit(grandchild_mid_lock(m));
	rc = wait_child(pid);
	if (rc != 128 + SIGKILL) {
		fprintf(stderr, "# grandchild: %d\n", rc);
		return 11;
	}
	rc = pthread_mutex_trylock(m);
	if (rc != EOWNERDEAD) {
		fprintf(stderr, "# the killed process's mutex: trylock %d (%s), want "
			"EOWNERDEAD: its owner death went unnoticed\n", rc, strerror(rc));
		return 12;
	}
	return 0;
}
#endif

/*
 * Signals this thread every 50 us from *@signaller, @handler running,
 * while it gets and puts @ref, until @done() or for 10 s: a hang, before a
 * fix, shows as the case's deadline.  Stopped here, unless a handler ends
 * the thread first (then by whoever saw it end).
 */
static void pairs_signalled_by(struct signaller *signaller, void (*handler)(int),
			       bool (*done)(void))
{
	struct timespec start, now;
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = handler;
	sigaction(SIGUSR1, &sa, NULL);
	if (signaller_start(signaller, 50000))
		abort();
	clock_gettime(CLOCK_MONOTONIC, &start);
	do {
		pairs(&ref, 1000);
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while (!done() && now.tv_sec - start.tv_sec < 10);
	signaller_stop(signaller);
}

static void pairs_under_signals(void (*handler)(int), bool (*done)(void))
{
	struct signaller signaller;

	pairs_signalled_by(&signaller, handler, done);
}

/* Forks from a handler that interrupted a section of its thread. */
#define NR_HANDLER_FORKS 10
static volatile sig_atomic_t nr_forks, fork_failed;
static pid_t forked[NR_HANDLER_FORKS];

static bool forks_done(void)
{
	return nr_forks >= NR_HANDLER_FORKS || fork_failed;
}

static void on_signal_fork(int sig)
{
	int saved_errno = errno;
	pid_t pid;

	(void)sig;
	/* Only inside a section: the forks this case is about. */
	if (nr_forks >= NR_HANDLER_FORKS || !percpuref_reader_interrupted())
		return;
	pid = fork();
	if (pid == 0)
		_exit(0);	/* a child forked here may only exec or _exit */
	if (pid < 0)
		fork_failed = 1;
	else
		forked[nr_forks++] = pid;
	errno = saved_errno;
}

/* Exit status 2: init failed; 3: no thread; 4: a fork failed; 5: a child
 * did not exit with 0; 6: no signal landed in a section. */
static int case_handler_fork(void)
{
	struct fencer fencer;
	int i;

	child_deadline(30);
	if (percpu_ref_init(&ref, NULL, 0))
		return 2;
	pairs(&ref, 10);	/* registered before any handler runs */
	if (fencer_start(&fencer))
		return 3;
	pairs_under_signals(on_signal_fork, forks_done);
	fencer_stop(&fencer);
	for (i = 0; i < nr_forks; i++)
		if (wait_child(forked[i]) != 0)
			return 5;
	fprintf(stderr, "# %d forks from a handler inside a section\n", (int)nr_forks);
	return fork_failed ? 4 : !nr_forks ? 6 : 0;
}

/*
 * Writers first: a handler of the holder thread keeps its section open
 * until released, so that a synchronous switch's fence waits, and a fork
 * waits for that switch.
 */
static struct percpu_ref first_switched, second_switched;
static int hold_caught, hold_released;	/* atomic */
static struct signaller hold_signaller;	/* the holder's */
/* Atomic: the released handler ends its thread by a raw exit, section open. */
static int hold_exits;
static int fork_calling, fork_done;	/* atomic */
static pid_t forker_tid;	/* set before fork_calling */

/* A synchronous switch of @ref on a thread of its own, which says when it
 * calls (its thread id set first) and when the switch returned. */
struct watched_switch {
	struct percpu_ref *ref;
	pid_t tid;
	int calling, done;	/* atomic */
};

static void *watched_switcher(void *arg)
{
	struct watched_switch *w = arg;

	w->tid = (pid_t)syscall(SYS_gettid);
	__atomic_store_n(&w->calling, 1, __ATOMIC_SEQ_CST);
	percpu_ref_switch_to_atomic_sync(w->ref);
	__atomic_store_n(&w->done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

static struct watched_switch second_switch = { .ref = &second_switched };
static pid_t waiting_fork_child;

static void on_signal_hold(int sig)
{
	(void)sig;
	if (__atomic_load_n(&hold_caught, __ATOMIC_SEQ_CST) || !percpuref_reader_interrupted())
		return;
	__atomic_store_n(&hold_caught, 1, __ATOMIC_SEQ_CST);
	while (!__atomic_load_n(&hold_released, __ATOMIC_SEQ_CST))
		sched_yield();
	/* No exit hook, no unwinding: only the kernel sees the thread go. */
	if (__atomic_load_n(&hold_exits, __ATOMIC_SEQ_CST))
		syscall(SYS_exit, 0);
}

static bool hold_done(void)
{
	return __atomic_load_n(&hold_caught, __ATOMIC_SEQ_CST);
}

/* Pairs under signals until its handler holds a section open (and is
 * released). */
static void *section_holder(void *arg)
{
	(void)arg;
	pairs_signalled_by(&hold_signaller, on_signal_hold, hold_done);
	return NULL;
}

static void *first_switcher(void *arg)
{
	(void)arg;
	percpu_ref_switch_to_atomic_sync(&first_switched);
	return NULL;
}

static void *waiting_forker(void *arg)
{
	(void)arg;
	forker_tid = (pid_t)syscall(SYS_gettid);
	__atomic_store_n(&fork_calling, 1, __ATOMIC_SEQ_CST);
	waiting_fork_child = fork();
	if (waiting_fork_child == 0)
		_exit(0);
	__atomic_store_n(&fork_done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

/* Until @flag reads true, for at most 10 s: true if it did. */
static bool wait_flag(int *flag)
{
	return POLL_UNTIL(__atomic_load_n(flag, __ATOMIC_SEQ_CST));
}

/*
 * The refs of the two cases below initialised, and @holder started and
 * holding a section open in its handler: -1; else the case's exit status:
 * 2 init failed, 3 no thread, 6 no signal landed in a section.
 */
static int start_holding_a_section(pthread_t *holder)
{
	if (percpu_ref_init(&ref, NULL, 0) || percpu_ref_init(&first_switched, NULL, 0) ||
	    percpu_ref_init(&second_switched, NULL, 0))
		return 2;
	pairs(&ref, 10);	/* registered before any handler runs */
	if (pthread_create(holder, NULL, section_holder, NULL))
		return 3;
	if (!wait_flag(&hold_caught)) {
		pthread_join(*holder, NULL);
		return 6;
	}
	return -1;
}

/* Exit status 2: init failed; 3: no thread; 4: the fork failed or its child
 * did not exit with 0; 6: no signal landed in a section; 7: the first
 * switch never began, the fork never waited or ended while it was held;
 * 12: the second switch began while the fork waited; 13: it never ended;
 * 14: it never slept (a switch that spins while the fork waits). */
static int case_fork_waits_first(void)
{
	pthread_t holder, first, forker, second;
	bool fork_asleep, fork_ended, second_asleep, second_began;
	int status, ret;

	child_deadline(30);
	ret = start_holding_a_section(&holder);
	if (ret >= 0)
		return ret;
	/* Its fence waits for the holder's section, with the read lock held. */
	if (pthread_create(&first, NULL, first_switcher, NULL))
		return 3;
	if (!POLL_UNTIL(is_atomic(&first_switched)))
		return 7;
	if (pthread_create(&forker, NULL, waiting_forker, NULL))
		return 3;
	/* Asleep in the fork: in its wait for the first switch (nothing
	 * else blocks it; a fork that went by would show in fork_done). */
	fork_asleep = wait_flag(&fork_calling) && wait_until_sleeping(forker_tid);
	if (pthread_create(&second, NULL, watched_switcher, &second_switch))
		return 3;
	/* Asleep in its switch: waiting for the fork, or, begun, for the
	 * holder's section in its fence.  The verdicts wait for the joins. */
	second_asleep = wait_flag(&second_switch.calling) && wait_until_sleeping(second_switch.tid);
	second_began = is_atomic(&second_switched);
	fork_ended = __atomic_load_n(&fork_done, __ATOMIC_SEQ_CST);
	__atomic_store_n(&hold_released, 1, __ATOMIC_SEQ_CST);
	pthread_join(holder, NULL);
	pthread_join(first, NULL);
	pthread_join(forker, NULL);
	pthread_join(second, NULL);
	if (!fork_asleep || fork_ended)
		return 7;
	if (waiting_fork_child < 0 || waitpid(waiting_fork_child, &status, 0) != waiting_fork_child ||
	    !WIFEXITED(status) || WEXITSTATUS(status))
		return 4;
	if (second_began)
		return 12;
	if (!second_asleep)
		return 14;
	if (!__atomic_load_n(&second_switch.done, __ATOMIC_SEQ_CST) || !is_atomic(&second_switched))
		return 13;
	percpu_ref_exit(&first_switched);
	percpu_ref_exit(&second_switched);
	percpu_ref_exit(&ref);
	return 0;
}

/*
 * A fence covers only what was stamped before it started: its ticket is
 * taken first.  While a switch's fence waits for the holder's section, a
 * stamp taken then is not covered when that fence ends (a ticket taken at
 * its end, after the stamp, covered it: a poll would then have run a
 * release whose counts that fence never waited for), and is covered by
 * the next fence.  Exit status 2: init failed; 3: no thread; 6: no signal
 * landed in a section; 7: the switch's fence never started; 8: the
 * stamp covered by the fence already running; 9: not covered by the next.
 */
static int case_fence_ticket(void)
{
	pthread_t holder, first;
	unsigned long before, stamp;
	bool started;
	int ret;

	child_deadline(30);
	ret = start_holding_a_section(&holder);
	if (ret >= 0)
		return ret;
	before = percpuref_fence_stamp();
	if (pthread_create(&first, NULL, first_switcher, NULL))
		return 3;
	/* Its fence has its ticket and waits for the holder's section. */
	started = POLL_UNTIL(percpuref_fence_started_after(before));
	stamp = percpuref_fence_stamp();
	__atomic_store_n(&hold_released, 1, __ATOMIC_SEQ_CST);
	pthread_join(holder, NULL);
	pthread_join(first, NULL);
	if (!started)
		return 7;
	if (percpuref_fence_covers(stamp))
		return 8;
	percpu_ref_switch_to_atomic_sync(&second_switched);
	if (!percpuref_fence_covers(stamp))
		return 9;
	percpu_ref_exit(&first_switched);
	percpu_ref_exit(&second_switched);
	percpu_ref_exit(&ref);
	return 0;
}

/*
 * The owner of a unit dies inside a section while a fence waits for it:
 * its handler leaves by a raw exit, so no exit hook closes the section or
 * gives the unit back, and only the kernel's notice of the owner's death
 * (the robust mark) tells the fence the section will never end.  Up to
 * 0.4.29 the fence read the mark once, before its wait, and then waited
 * for ever.  Exit status 2: init failed; 3: no thread; 6: no signal landed
 * in a section; 7: the switch never began waiting, or ended while the
 * section was open; 8: it never ended; 9: the unit was not given back.
 */
static struct watched_switch dying_switch = { .ref = &first_switched };

static int case_owner_dies_in_section(void)
{
	unsigned int registered;
	pthread_t holder, switcher;
	bool waited, ended;
	int ret;

	child_deadline(30);
	__atomic_store_n(&hold_exits, 1, __ATOMIC_SEQ_CST);
	ret = start_holding_a_section(&holder);
	if (ret >= 0)
		return ret;
	registered = percpuref_readers_registered();
	if (pthread_create(&switcher, NULL, watched_switcher, &dying_switch))
		return 3;
	/* Asleep in the fence's wait for the holder's section (the switch
	 * is under way once the mode word reads atomic). */
	waited = wait_flag(&dying_switch.calling) && POLL_UNTIL(is_atomic(&first_switched)) &&
		 wait_until_sleeping(dying_switch.tid);
	ended = __atomic_load_n(&dying_switch.done, __ATOMIC_SEQ_CST);
	/* The holder's signaller, which its raw exit leaves running: its
	 * pthread_kill() of a joined thread would be undefined. */
	signaller_stop(&hold_signaller);
	__atomic_store_n(&hold_released, 1, __ATOMIC_SEQ_CST);
	pthread_join(holder, NULL);	/* the kernel clears its thread id */
	if (!waited || ended)
		return 7;
	if (!wait_flag(&dying_switch.done))
		return 8;
	pthread_join(switcher, NULL);
	if (percpuref_readers_registered() != registered - 1) {
		fprintf(stderr, "# %u readers registered, want %u\n",
			percpuref_readers_registered(), registered - 1);
		return 9;
	}
	percpu_ref_exit(&first_switched);
	percpu_ref_exit(&second_switched);
	return 0;
}

/*
 * A handler inside a section puts the last reference of a victim and
 * waits, still inside, while the helper thread acts on the victim; with
 * PENDING_REZERO the handler puts again after the helper's reinit, get and
 * kill; with the other PENDING_REZERO_* the helper reinits, gets, kills and
 * puts itself.
 */
#define NR_PENDING_TRIALS 20
static struct percpu_ref pending_victims[NR_PENDING_TRIALS];
/* Atomic, each: a trial's releases, those not run on pending_thread, and
 * whether the first of them was one of those. */
static int pending_released[NR_PENDING_TRIALS], pending_released_elsewhere[NR_PENDING_TRIALS];
static int pending_first_elsewhere[NR_PENDING_TRIALS];
/* A PENDING_REZERO_HANDLER trial whose helper put outside its handler. */
static bool pending_put_outside[NR_PENDING_TRIALS];
static int pending_trial, pending_stage, pending_stop;	/* atomic */
static pthread_t pending_thread;	/* the first handler's */
/* What the helper does while a handler's release waits. */
enum pending_action {
	PENDING_REZERO,		/* reinit, get, kill: the handler puts */
	PENDING_REZERO_OUTSIDE,	/* reinit, get, kill, put */
	PENDING_REZERO_HANDLER,	/* the same, put by its own handler in a section */
	PENDING_EXIT,
	PENDING_MANAGE_EXIT,
};
static enum pending_action pending_action;
static __thread bool is_pending_helper;
static int helper_put_owed;	/* atomic: its handler has yet to put */

static void count_pending_release(struct percpu_ref *r)
{
	int trial = (int)(r - pending_victims);
	int before = __atomic_fetch_add(&pending_released[trial], 1, __ATOMIC_SEQ_CST);

	if (!pthread_equal(pthread_self(), pending_thread)) {
		__atomic_fetch_add(&pending_released_elsewhere[trial], 1, __ATOMIC_SEQ_CST);
		if (!before)
			__atomic_store_n(&pending_first_elsewhere[trial], 1, __ATOMIC_SEQ_CST);
	}
}

/* The helper's handler (PENDING_REZERO_HANDLER): the victim's last put,
 * inside a section, while the first handler still waits in its own. */
static void on_helper_signal(void)
{
	int trial = __atomic_load_n(&pending_trial, __ATOMIC_SEQ_CST);

	if (!__atomic_load_n(&helper_put_owed, __ATOMIC_SEQ_CST) ||
	    !percpuref_reader_interrupted())
		return;
	percpu_ref_put(&pending_victims[trial]);
	__atomic_store_n(&helper_put_owed, 0, __ATOMIC_SEQ_CST);
}

/* Stage 1: the handler put its reference; 2: the helper acted on it. */
static void on_signal_pending(int sig)
{
	int trial = __atomic_load_n(&pending_trial, __ATOMIC_SEQ_CST);
	struct percpu_ref *victim = &pending_victims[trial];

	(void)sig;
	if (is_pending_helper) {
		on_helper_signal();
		return;
	}
	if (trial >= NR_PENDING_TRIALS || __atomic_load_n(&pending_stage, __ATOMIC_SEQ_CST) ||
	    !percpuref_reader_interrupted())
		return;
	percpu_ref_put(victim);		/* the last: its release waits */
	__atomic_store_n(&pending_stage, 1, __ATOMIC_SEQ_CST);
	while (__atomic_load_n(&pending_stage, __ATOMIC_SEQ_CST) != 2)
		sched_yield();
	if (pending_action == PENDING_REZERO)
		percpu_ref_put(victim);	/* the last again */
	__atomic_store_n(&pending_stage, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&pending_trial, trial + 1, __ATOMIC_SEQ_CST);
}

/*
 * Puts the victim's last reference from this thread's handler, inside a
 * section of its own; true if it did.  When no signal lands in a section
 * within pairs_under_signals()'s window, the helper puts outside its
 * handler, as PENDING_REZERO_OUTSIDE does (and says so).
 */
static bool helper_put_done(void)
{
	return !__atomic_load_n(&helper_put_owed, __ATOMIC_SEQ_CST);
}

static bool put_from_helper_handler(struct percpu_ref *victim)
{
	bool put;

	__atomic_store_n(&helper_put_owed, 1, __ATOMIC_SEQ_CST);
	/* The process's handler is on_signal_pending already. */
	pairs_under_signals(on_signal_pending, helper_put_done);
	put = helper_put_done();
	if (!put) {
		__atomic_store_n(&helper_put_owed, 0, __ATOMIC_SEQ_CST);
		percpu_ref_put(victim);
	}
	return put;
}

static void *pending_helper(void *arg)
{
	(void)arg;
	is_pending_helper = true;
	while (!__atomic_load_n(&pending_stop, __ATOMIC_SEQ_CST)) {
		struct percpu_ref *victim;

		if (__atomic_load_n(&pending_stage, __ATOMIC_SEQ_CST) != 1) {
			sched_yield();
			continue;
		}
		victim = &pending_victims[__atomic_load_n(&pending_trial, __ATOMIC_SEQ_CST)];
		/* None of these waits for a fence, which would wait for
		 * the handler's section: the victim is atomic, and a switch
		 * to per-CPU mode needs none. */
		switch (pending_action) {
		case PENDING_REZERO:
			percpu_ref_reinit(victim);
			percpu_ref_get(victim);
			percpu_ref_kill(victim);
			break;
		case PENDING_REZERO_OUTSIDE:
			percpu_ref_reinit(victim);
			percpu_ref_get(victim);
			percpu_ref_kill(victim);
			percpu_ref_put(victim);	/* released here, at once */
			break;
		case PENDING_REZERO_HANDLER:
			percpu_ref_reinit(victim);
			percpu_ref_get(victim);
			percpu_ref_kill(victim);
			pending_put_outside[victim - pending_victims] =
				!put_from_helper_handler(victim);
			break;
		case PENDING_MANAGE_EXIT:
			percpu_ref_reinit(victim);
			if (percpu_ref_switch_to_managed(victim))
				abort();
			percpu_ref_exit(victim);
			/* Every other trial, a pass frees the reclaimer's
			 * hold first (the exited node alone needs no fence),
			 * and the handler's thread lets go last. */
			if (__atomic_load_n(&pending_trial, __ATOMIC_SEQ_CST) % 2 &&
			    percpu_ref_managed_flush())
				abort();
			break;
		case PENDING_EXIT:
			percpu_ref_exit(victim);
			break;
		}
		__atomic_store_n(&pending_stage, 2, __ATOMIC_SEQ_CST);
	}
	return NULL;
}

static bool pending_done(void)
{
	return __atomic_load_n(&pending_trial, __ATOMIC_SEQ_CST) >= NR_PENDING_TRIALS;
}

/* Exit status 2: init failed; 3: no thread; 6: no signal landed in a
 * section; 10: a trial's releases ran a wrong number of times; 11: on a
 * wrong thread, or in a wrong order. */
static int case_handler_release_pending(enum pending_action action)
{
	bool rezero = action != PENDING_EXIT && action != PENDING_MANAGE_EXIT;
	pthread_t helper;
	int i, trials, handler_puts = 0;

	child_deadline(30);
	pending_action = action;
	for (i = 0; i < NR_PENDING_TRIALS; i++) {
		if (percpu_ref_init(&pending_victims[i], count_pending_release,
				    PERCPU_REF_INIT_ATOMIC | PERCPU_REF_ALLOW_REINIT))
			return 2;
		/* Dead, one reference left: the handler's. */
		percpu_ref_get(&pending_victims[i]);
		percpu_ref_kill(&pending_victims[i]);
	}
	if (percpu_ref_init(&ref, NULL, 0))
		return 2;
	pairs(&ref, 10);	/* registered before any handler runs */
	pending_thread = pthread_self();
	if (pthread_create(&helper, NULL, pending_helper, NULL))
		return 3;
	pairs_under_signals(on_signal_pending, pending_done);
	__atomic_store_n(&pending_stop, 1, __ATOMIC_SEQ_CST);
	pthread_join(helper, NULL);
	pairs(&ref, 1);	/* a trial's handler that returned since: its section ends */
	trials = __atomic_load_n(&pending_trial, __ATOMIC_SEQ_CST);
	for (i = 0; i < trials; i++) {
		int released = __atomic_load_n(&pending_released[i], __ATOMIC_SEQ_CST);
		int elsewhere = __atomic_load_n(&pending_released_elsewhere[i], __ATOMIC_SEQ_CST);
		/* Only a put outside every handler releases where it is. */
		bool put_outside = action == PENDING_REZERO_OUTSIDE || pending_put_outside[i];

		if (released != (rezero ? 2 : 0)) {
			fprintf(stderr, "# trial %d: %d releases\n", i, released);
			return 10;
		}
		/* and at once, before the first zero's release */
		if (elsewhere != put_outside ||
		    __atomic_load_n(&pending_first_elsewhere[i], __ATOMIC_SEQ_CST) != put_outside) {
			fprintf(stderr, "# trial %d: %d releases off the first handler's thread\n",
				i, elsewhere);
			return 11;
		}
		handler_puts += !put_outside;
		if (rezero)
			percpu_ref_exit(&pending_victims[i]);
	}
	for (; i < NR_PENDING_TRIALS; i++)
		percpu_ref_exit(&pending_victims[i]);
	percpu_ref_exit(&ref);
	fprintf(stderr, "# %d trials\n", trials);
	if (action == PENDING_REZERO_HANDLER) {
		fprintf(stderr, "# %d with the second zero's put in the helper's handler\n",
			handler_puts);
		trials = handler_puts;
	}
	return !trials ? 6 : 0;
}

/* The case @mode, whose handler interrupts a section: there are sections
 * only on the fallback path, and a handler runs in one never under
 * ThreadSanitizer (it runs handlers at blocking calls).  @what: its
 * verdict. */
static void in_a_section_case(const char *mode, const char *what)
{
	if (UNDER_TSAN)
		skip("%s: ThreadSanitizer runs no handler in a section", what);
	else if (UNDER_VALGRIND)
		/* The parent is on the fallback path (valgrind has no rseq);
		 * the child would run natively, where glibc's rseq gives it
		 * no sections, and test nothing (review 161). */
		skip("%s: its child runs outside valgrind, on another fast path", what);
	else if (strcmp(percpuref_fast_path(), "fallback"))
		skip("%s: no sections on %s", what, percpuref_fast_path());
	else
		is(run_mode(mode), 0, "%s", what);
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "last-round"))
		return case_last_round();
	if (argc > 1 && !strcmp(argv[1], "handler-sync-switch"))
		return case_handler_sync_switch();
#ifdef __GLIBC__
	if (argc > 1 && !strcmp(argv[1], "handler-robust-pending"))
		return case_handler_robust_pending();
#endif
	if (argc > 1 && !strcmp(argv[1], "handler-fork"))
		return case_handler_fork();
	if (argc > 1 && !strcmp(argv[1], "fork-waits-first"))
		return case_fork_waits_first();
	if (argc > 1 && !strcmp(argv[1], "fence-ticket"))
		return case_fence_ticket();
	if (argc > 1 && !strcmp(argv[1], "owner-dies-in-section"))
		return case_owner_dies_in_section();
	if (argc > 1 && !strcmp(argv[1], "handler-release-rezero"))
		return case_handler_release_pending(PENDING_REZERO);
	if (argc > 1 && !strcmp(argv[1], "handler-release-rezero-outside"))
		return case_handler_release_pending(PENDING_REZERO_OUTSIDE);
	if (argc > 1 && !strcmp(argv[1], "handler-release-rezero-handler"))
		return case_handler_release_pending(PENDING_REZERO_HANDLER);
	if (argc > 1 && !strcmp(argv[1], "handler-release-exited"))
		return case_handler_release_pending(PENDING_EXIT);
	if (argc > 1 && !strcmp(argv[1], "handler-release-managed-exited"))
		return case_handler_release_pending(PENDING_MANAGE_EXIT);
	/* ThreadSanitizer destroys its state of a thread in the last round
	 * too, before a later key's destructor: any call it intercepts there
	 * (malloc, a mutex) crashes it, whatever this library does. */
	if (UNDER_TSAN)
		skip("last key-destructor round: ThreadSanitizer crashes in it");
	else
		is(run_mode("last-round"), 0,
		   "first call in the last key-destructor round: no stale TLS read, unit back");
	is(run_mode("handler-sync-switch"), 0,
	   "release run by a handler's put switches another ref synchronously");
#ifdef __GLIBC__
	/* Its fork's prepare handlers hold more locks than ThreadSanitizer's
	 * deadlock detector counts (a CHECK fails in it). */
	if (UNDER_TSAN)
		skip("robust lock under a handler's fence: fork under ThreadSanitizer");
	else
		is(run_mode("handler-robust-pending"), 0,
		   "a handler's fence leaves the interrupted robust mutex lock alone");
#else
	skip("robust lock under a handler's fence: not glibc");
#endif
	in_a_section_case("handler-fork",
			  "a handler inside a section forks while another thread fences");
	in_a_section_case("fork-waits-first",
			  "a fork waiting for a sync switch goes before switches started meanwhile");
	in_a_section_case("fence-ticket", "a fence covers only what was stamped before it "
					  "started, the next one the rest");
	/* Marks tell a dead owner only on glibc, with a robust-futex list. */
	if (!PERCPUREF_ROBUST_MARKS || !robust_list_walked())
		skip("a unit's owner dies in a section a fence waits for: no robust marks here");
	else
		in_a_section_case("owner-dies-in-section",
				  "a unit's owner dies in a section a fence waits for: the fence "
				  "ends, the unit comes back");
	in_a_section_case("handler-release-rezero",
			  "a ref zeroed again while its handler's release waits: two releases");
	in_a_section_case("handler-release-rezero-outside",
			  "zeroed again by another thread's put: released there at once, then "
			  "here");
	in_a_section_case("handler-release-rezero-handler",
			  "zeroed again by another thread's handler in its section: both released "
			  "here");
	in_a_section_case("handler-release-exited",
			  "a ref exited while its handler's release waits: no release, no stale "
			  "read");
	in_a_section_case("handler-release-managed-exited",
			  "a ref managed and exited while its handler's release waits: freed once");
	return done_testing();
}
