/* SPDX-License-Identifier: MIT */
/*
 * Model-checked random stress: N threads (2-4) run random *legal* sequences
 * of operations on a small pool of refs (plain, ALLOW_REINIT, INIT_ATOMIC,
 * INIT_DEAD, managed by REL_MANAGED or by switch_to_managed), with a shadow
 * model of what each thread legally holds; threads fork at random points.
 *
 * Model (per slot, control state under the slot's mutex):
 *   held[t][s]   references thread t holds (written by t only);
 *   init_held    the ownerless "initial" reference (invariant: an unmanaged,
 *                not killed, live ref has it; a kill or the creator's put of
 *                a managed ref drops it);
 *   life         bumped before each reinit / resurrect-at-zero; releases
 *                counts the @release calls of the present life.
 * Checked:
 *   - @release runs once per life, and only when no thread and no initial
 *     reference holds the ref (held[][] and init_held read in @release);
 *   - a tryget/tryget_live that succeeds on a ref whose @release had
 *     returned (same life before and after) is an error; likewise a
 *     tryget_live after the kill's confirm_kill ran (same epoch);
 *   - a thread holding a reference never sees percpu_ref_is_zero();
 *   - every confirm callback runs once (never more than asked; after a
 *     percpu_ref_barrier() all that were asked before it have run);
 *   - percpu_ref_barrier() and percpu_ref_managed_flush() return 0;
 *   - at the end of each phase (all threads drop everything, thread 0 kills
 *     or puts each initial reference, barrier, flush) every live ref was
 *     released exactly once, trygets fail, is_zero holds; then each slot is
 *     reinitialised, resurrected at zero, or exited and made anew;
 *   - fork() from a random thread at a random point: the child (deadline
 *     CHILD_DEADLINE_S, alarm) takes over every reference of every slot no
 *     other thread was operating on at the fork, drops them, barrier, flush:
 *     each such life is released exactly once there (but at most one
 *     @release per library thread that the fork cut: docs/managed.md,
 *     "Threads, shutdown, fork"), then runs a second life on each (reinit or
 *     exit + init), switches, drops, barrier, flush, checks again, then
 *     percpuref_shutdown() and exit()/_exit().
 * Under ThreadSanitizer no fork (no threads in a threaded process's child:
 * tests/child.h).  Under ASan the fork gate (fork_gate.h) keeps forks out of
 * the workers' library calls other than get/put/tryget; under qemu-user,
 * out of their percpuref_shutdown() calls (a fork while a thread exits
 * leaves the emulator's child stuck: fork_gate.h).
 *
 * Usage: stress_model [SEED [SECONDS [THREADS]]]; STRESS_SEED and
 * STRESS_SECONDS too.  Any percpuref warning on stderr is a failure as well
 * (every operation is legal): run it with stderr captured.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <percpuref/managed.h>
#include <percpuref/percpu_ref.h>

#include "child.h"
#include "fork_gate.h"
#include "rnd.h"
#include "tap.h"

#define container_of(p, type, member) ((type *)((char *)(p)-offsetof(type, member)))

#define MAX_THREADS 4
#define NR_SLOTS 8
#define OPS_PER_PHASE 400
#define CHILD_DEADLINE_S 20
/* A fork may cut the @release a library thread runs (one each: the callback
 * thread's for kills, the reclaimer's for managed refs), and one of each
 * kind per thread inside percpuref_shutdown() (cur_slot -2), which runs
 * both on its caller.  Checked per kind in the child. */
#define GLOBAL_CALL (-2)

enum kind { K_PLAIN, K_PLAIN_RI, K_ATOMIC, K_DEAD, K_DEAD_MANAGED, K_REL_MANAGED, K_SW_MANAGED,
	    K_NR };
static const char *const kind_name[K_NR] = { "plain", "plain_ri", "init_atomic", "init_dead",
					     "dead_managed", "rel_managed", "sw_managed" };

struct slot {
	struct percpu_ref ref;
	pthread_mutex_t mu;
	pthread_rwlock_t tg;	/* non-holders' trygets (read) vs switch_to_managed (write) */
	int idx;
	enum kind kind;
	bool allow_reinit;
	/* under mu */
	bool live;		/* a life started (not INIT_DEAD before its reinit) */
	bool managed;		/* written under mu with __atomic stores */
	bool killed, sticky;
	/* atomics */
	int init_held;
	unsigned long life;
	unsigned long epoch;	/* seqcount: odd while a reinit/resurrect runs */
	unsigned long kill_epoch; /* under mu: the epoch of the latest kill_and_confirm */
	int releases;		/* of the present life */
	int released_done;	/* @release of the present life returned */
	int in_release;
	unsigned long kill_confirmed; /* atomic: epoch whose confirm_kill ran */
	long confirm_req, confirm_done;
	long confirm_issued;	/* atomic: asked by calls that returned */
	long total_releases;
	/* history of control ops, under mu (for failure reports) */
	const char *hist[16];
	int hist_thr[16];
	unsigned int hist_n;
};

static struct slot slots[NR_SLOTS];
static int held[MAX_THREADS][NR_SLOTS];		/* atomic, written by the owner */
static int cur_slot[MAX_THREADS];		/* atomic: -1, or the slot operated on */
static int nthreads;
static int failures;				/* atomic */
static int in_child;
static int child_me = -1;
static unsigned long forks, child_cuts;		/* parent side counters */
static pthread_barrier_t phase_bar;
static int stop_flag;
static uint64_t end_ns;
static unsigned int base_seed;
static unsigned long phases, total_ops;
static int fork_enabled = 1;
static int slow_release;		/* STRESS_SLOW_RELEASE */
static int break_model;			/* STRESS_BREAK: self-test of the checks */
static int started;				/* atomic: workers past start-up */

#define FAIL(...)                                                                    \
	do {                                                                         \
		__atomic_fetch_add(&failures, 1, __ATOMIC_SEQ_CST);                  \
		fprintf(stderr, "MODEL FAILURE%s (%s:%d): ", in_child ? " [child]" : "", \
			__FILE__, __LINE__);                                         \
		fprintf(stderr, __VA_ARGS__);                                        \
		fprintf(stderr, "\n");                                               \
	} while (0)

static int ld(int *p)
{
	return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}
static void st(int *p, int v)
{
	__atomic_store_n(p, v, __ATOMIC_SEQ_CST);
}
static unsigned long ldl(unsigned long *p)
{
	return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}

static int held_sum(int s)
{
	int t, n = 0;

	for (t = 0; t < MAX_THREADS; t++)
		n += ld(&held[t][s]);
	return n;
}

static void hist(struct slot *sl, int me, const char *what)
{
	unsigned int i = sl->hist_n++ % 16;

	sl->hist[i] = what;
	sl->hist_thr[i] = me;
}

static void hist_print(struct slot *sl)
{
	unsigned int i = sl->hist_n > 16 ? sl->hist_n - 16 : 0;

	fprintf(stderr, "  slot %d history (oldest first):", sl->idx);
	for (; i < sl->hist_n; i++)
		fprintf(stderr, " %d:%s", sl->hist_thr[i % 16], sl->hist[i % 16]);
	fprintf(stderr, "\n");
}

#if defined(__SANITIZE_ADDRESS__)
/* A child that leaves by exit() (to run the library's exit hook) leaks by
 * design what its vanished threads held (their refs, their thread-exit
 * records): LeakSanitizer's hook, consulted at exit, says not to check it. */
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void)
{
	return in_child;
}
#endif

/* ---- callbacks ---- */

static void on_release(struct percpu_ref *ref)
{
	struct slot *sl = container_of(ref, struct slot, ref);
	int h, ih;

	st(&sl->in_release, 1);
	if (slow_release)
		usleep(300);	/* STRESS_SLOW_RELEASE: forks land inside @release */
	h = held_sum(sl->idx);
	ih = ld(&sl->init_held);
	if (h || ih)
		FAIL("slot %d (%s) released while held: %d thread refs, init_held %d, life %lu",
		     sl->idx, kind_name[sl->kind], h, ih, ldl(&sl->life));
	if (__atomic_fetch_add(&sl->releases, 1, __ATOMIC_SEQ_CST) != 0)
		FAIL("slot %d (%s) released twice in life %lu", sl->idx, kind_name[sl->kind],
		     ldl(&sl->life));
	__atomic_fetch_add(&sl->total_releases, 1, __ATOMIC_SEQ_CST);
	st(&sl->released_done, 1);
	st(&sl->in_release, 0);
}

static void on_confirm(struct percpu_ref *ref)
{
	struct slot *sl = container_of(ref, struct slot, ref);
	long d = __atomic_add_fetch(&sl->confirm_done, 1, __ATOMIC_SEQ_CST);

	if (d > __atomic_load_n(&sl->confirm_req, __ATOMIC_SEQ_CST))
		FAIL("slot %d: confirm ran %ld times, %ld asked", sl->idx, d,
		     __atomic_load_n(&sl->confirm_req, __ATOMIC_SEQ_CST));
}

static void on_confirm_kill(struct percpu_ref *ref)
{
	struct slot *sl = container_of(ref, struct slot, ref);

	__atomic_store_n(&sl->kill_confirmed, __atomic_load_n(&sl->kill_epoch, __ATOMIC_SEQ_CST),
			 __ATOMIC_SEQ_CST);
	on_confirm(ref);
}

/* ---- slot set-up ---- */

/* Opens the seqcount window in which readers ignore what they see. */
static void epoch_begin(struct slot *sl)
{
	__atomic_add_fetch(&sl->epoch, 1, __ATOMIC_SEQ_CST);
}

static void epoch_end(struct slot *sl)
{
	__atomic_add_fetch(&sl->epoch, 1, __ATOMIC_SEQ_CST);
}

/* Before a reinit / resurrect at zero; epoch_end() after the call. */
static void new_life(struct slot *sl)
{
	epoch_begin(sl);
	__atomic_add_fetch(&sl->life, 1, __ATOMIC_SEQ_CST);
	st(&sl->releases, 0);
	st(&sl->released_done, 0);
	st(&sl->init_held, 1);
	sl->live = true;
	sl->killed = false;
}

/* Exited or fresh slot: init with a random kind.  Nobody else touches it. */
static int slot_create(struct slot *sl, unsigned int *seed)
{
	static const unsigned int flags[K_NR] = {
		0, PERCPU_REF_ALLOW_REINIT, PERCPU_REF_INIT_ATOMIC, PERCPU_REF_INIT_DEAD,
		PERCPU_REF_INIT_DEAD | PERCPU_REF_REL_MANAGED, PERCPU_REF_REL_MANAGED,
		PERCPU_REF_INIT_ATOMIC
	};
	enum kind k = (enum kind)(rnd(seed) % K_NR);
	int err;

	sl->kind = k;
	sl->allow_reinit = k != K_PLAIN;
	sl->managed = k == K_REL_MANAGED || k == K_DEAD_MANAGED;
	sl->sticky = k == K_ATOMIC || k == K_SW_MANAGED;
	sl->live = false;
	sl->killed = false;
	st(&sl->init_held, 0);
	if (k == K_DEAD || k == K_DEAD_MANAGED) {
		/* No life yet: dead, count 0; treated as "released". */
		__atomic_add_fetch(&sl->life, 1, __ATOMIC_SEQ_CST);
		st(&sl->releases, 1);
		st(&sl->released_done, 1);
		sl->killed = true;
	} else {
		new_life(sl);
		epoch_end(sl);
	}
	allocating_begin();
	err = percpu_ref_init(&sl->ref, on_release, flags[k]);
	if (!err && k == K_SW_MANAGED) {
		err = percpu_ref_switch_to_managed(&sl->ref);
		sl->managed = true;
		sl->sticky = false;
	}
	allocating_end();
	if (err)
		FAIL("slot %d: init (%s) failed: %d", sl->idx, kind_name[k], err);
	return err;
}

/* ---- the per-thread op machinery ---- */

struct th {
	int me;
	unsigned int seed;
	pthread_t tid;
};

static void busy(int me, int s)
{
	st(&cur_slot[me], s);
}

static void hold_add(int me, int s, int n)
{
	__atomic_add_fetch(&held[me][s], n, __ATOMIC_SEQ_CST);
}

/* Drops all of @me's references on slot @s. */
static void drop_all(int me, int s)
{
	int n = ld(&held[me][s]);

	if (!n)
		return;
	busy(me, s);
	st(&held[me][s], 0);
	percpu_ref_put_many(&slots[s].ref, (unsigned long)n);
	busy(me, -1);
}

static void check_not_zero_held(int me, struct slot *sl)
{
	if (ld(&held[me][sl->idx]) && percpu_ref_is_zero(&sl->ref))
		FAIL("slot %d: is_zero while thread %d holds %d", sl->idx, me,
		     ld(&held[me][sl->idx]));
}

/* tryget on a slot (lock-free).  Legal: unmanaged at any time (the memory
 * is static, exits happen only between phases); managed only while we hold
 * one already (no lookup may race a managed percpu_ref's release:
 * README, "Which one do I need?"). */
static void op_tryget(int me, struct slot *sl, unsigned int *seed, bool live)
{
	unsigned long l1, l2, e1, e2, kc;
	int rd, ok;
	unsigned long nr = rnd(seed) % 4 == 0 ? 1 + rnd(seed) % 3 : 1;

	bool locked = !ld(&held[me][sl->idx]);

	/* A non-holder may look a ref up only while it is not managed: the
	 * read lock keeps a switch_to_managed out until the tryget is counted. */
	if (locked) {
		if (in_child)
			return;	/* a vanished thread may hold the lock */
		pthread_rwlock_rdlock(&sl->tg);
		if (__atomic_load_n(&sl->managed, __ATOMIC_SEQ_CST)) {
			pthread_rwlock_unlock(&sl->tg);
			return;
		}
	}
	e1 = ldl(&sl->epoch);
	l1 = ldl(&sl->life);
	rd = ld(&sl->released_done);
	kc = ldl(&sl->kill_confirmed);
	if (e1 & 1)
		goto out;
	if (live) {
		nr = 1;
		ok = percpu_ref_tryget_live(&sl->ref);
	} else {
		ok = percpu_ref_tryget_many(&sl->ref, nr);
	}
	if (!ok)
		goto out;
	hold_add(me, sl->idx, (int)nr);
	l2 = ldl(&sl->life);
	e2 = ldl(&sl->epoch);
	if (e2 != e1)
		goto out;	/* revived meanwhile: nothing to say */
	if (rd && l2 == l1)
		FAIL("slot %d (%s): %s succeeded after release (life %lu)", sl->idx,
		     kind_name[sl->kind], live ? "tryget_live" : "tryget", l1);
	if (live && kc == e1)
		FAIL("slot %d (%s): tryget_live succeeded after confirm_kill (epoch %lu)", sl->idx,
		     kind_name[sl->kind], e1);
out:
	if (locked)
		pthread_rwlock_unlock(&sl->tg);
}

static void do_fork(int me, unsigned int *seed);

/* One control op under the slot's mutex. */
static void op_control(int me, struct slot *sl, unsigned int *seed)
{
	int s = sl->idx, mine = ld(&held[me][s]);
	unsigned int r = rnd(seed) % 16;
	int err;

	pthread_mutex_lock(&sl->mu);
	allocating_begin();
	if (!sl->live || ld(&sl->released_done)) {
		/* Released (or never live): nobody can hold it. */
		if (ld(&sl->released_done)) {
			if (percpu_ref_tryget(&sl->ref))
				FAIL("slot %d (%s): tryget after release succeeded", s,
				     kind_name[sl->kind]);
			if (percpu_ref_tryget_live(&sl->ref))
				FAIL("slot %d (%s): tryget_live after release succeeded", s,
				     kind_name[sl->kind]);
			if (!percpu_ref_is_zero(&sl->ref))
				FAIL("slot %d (%s): released but not zero", s, kind_name[sl->kind]);
		}
		if (sl->allow_reinit && ld(&sl->released_done) && r < 10) {
			new_life(sl);
			hist(sl, me, r & 1 ? "reinit" : "resurrect0");
			if (r & 1)
				percpu_ref_reinit(&sl->ref);
			else
				percpu_ref_resurrect(&sl->ref);
			epoch_end(sl);
			/* a managed ref goes back under management, count 2 */
		}
		goto out;
	}
	if (sl->managed) {
		if (r < 5 && ld(&sl->init_held)) {
			/* the creator's put of its initial reference */
			st(&sl->init_held, 0);
			hist(sl, me, "mput_init");
			percpu_ref_put(&sl->ref);
		} else if (r < 8 && (ld(&sl->init_held) || mine)) {
			if (!ld(&sl->init_held)) {
				/* our reference becomes the owner's initial one */
				__atomic_sub_fetch(&held[me][s], 1, __ATOMIC_SEQ_CST);
				st(&sl->init_held, 1);
			}
			hist(sl, me, "unmanage");
			err = percpu_ref_switch_to_unmanaged(&sl->ref);
			if (err)
				FAIL("slot %d: switch_to_unmanaged: %d", s, err);
			__atomic_store_n(&sl->managed, false, __ATOMIC_SEQ_CST);
			sl->sticky = false;
		} else if (r < 11 && ld(&sl->init_held)) {
			if (!percpu_ref_tryget(&sl->ref) || !percpu_ref_tryget_live(&sl->ref))
				FAIL("slot %d: tryget on a held managed ref failed", s);
			else
				hold_add(me, s, 2);
		}
		goto out;
	}
	if (sl->killed) {
		/* dying, not released yet: only a holder may resurrect (count > 0) */
		if (mine && r < 4 && sl->allow_reinit) {
			epoch_begin(sl);
			st(&sl->init_held, 1);
			sl->killed = false;
			hist(sl, me, "resurrect");
			percpu_ref_resurrect(&sl->ref);
			epoch_end(sl);
		} else if (ldl(&sl->kill_confirmed) == ldl(&sl->epoch) &&
			   percpu_ref_tryget_live(&sl->ref)) {
			hold_add(me, s, 1);
			FAIL("slot %d: tryget_live after confirm_kill (locked)", s);
		}
		goto out;
	}
	/* unmanaged, live, not killed: init_held */
	if (!ld(&sl->init_held))
		FAIL("slot %d: model: unmanaged live ref without initial reference", s);
	if (percpu_ref_is_dying(&sl->ref)) {
		FAIL("slot %d (%s): model says live and not killed, library says dying (life %lu)",
		     s, kind_name[sl->kind], ldl(&sl->life));
		hist_print(sl);
	}
	switch (r) {
	case 0:
	case 1:
		st(&sl->init_held, 0);
		sl->killed = true;
		hist(sl, me, "kill");
		percpu_ref_kill(&sl->ref);
		break;
	case 2:
	case 3:
		st(&sl->init_held, 0);
		sl->killed = true;
		__atomic_add_fetch(&sl->confirm_req, 1, __ATOMIC_SEQ_CST);
		__atomic_store_n(&sl->kill_epoch, ldl(&sl->epoch), __ATOMIC_SEQ_CST);
		hist(sl, me, "kill_confirm");
		percpu_ref_kill_and_confirm(&sl->ref, on_confirm_kill);
		__atomic_add_fetch(&sl->confirm_issued, 1, __ATOMIC_SEQ_CST);
		break;
	case 4:
	case 5:
		if (r == 5)
			__atomic_add_fetch(&sl->confirm_req, 1, __ATOMIC_SEQ_CST);
		hist(sl, me, r == 5 ? "atomic_confirm" : "atomic");
		percpu_ref_switch_to_atomic(&sl->ref, r == 5 ? on_confirm : NULL);
		if (r == 5)
			__atomic_add_fetch(&sl->confirm_issued, 1, __ATOMIC_SEQ_CST);
		sl->sticky = true;
		break;
	case 6:
		hist(sl, me, "atomic_sync");
		percpu_ref_switch_to_atomic_sync(&sl->ref);
		sl->sticky = true;
		break;
	case 7:
	case 8:
		/* without ALLOW_REINIT it stays atomic, warned (docs/percpu_ref.md,
		 * "Misuse"; the kernel frees its counters) */
		if (sl->allow_reinit) {
			hist(sl, me, "percpu");
			percpu_ref_switch_to_percpu(&sl->ref);
			sl->sticky = false;
		}
		break;
	case 9:
	case 10:
		if (sl->allow_reinit && (!in_child || !pthread_rwlock_trywrlock(&sl->tg))) {
			if (!in_child)
				pthread_rwlock_wrlock(&sl->tg);
			hist(sl, me, "manage");
			err = percpu_ref_switch_to_managed(&sl->ref);
			if (err)
				FAIL("slot %d: switch_to_managed: %d", s, err);
			__atomic_store_n(&sl->managed, true, __ATOMIC_SEQ_CST);
			sl->sticky = false;
			pthread_rwlock_unlock(&sl->tg);
		}
		break;
	default:
		if (percpu_ref_is_zero(&sl->ref))
			FAIL("slot %d: is_zero with the initial reference held", s);
		if (percpu_ref_tryget_live(&sl->ref))
			hold_add(me, s, 1);
		else
			FAIL("slot %d: tryget_live on a live, unkilled ref failed", s);
		break;
	}
out:
	allocating_end();
	pthread_mutex_unlock(&sl->mu);
}

static void op_barrier(int me, unsigned int *seed)
{
	long want[NR_SLOTS];
	unsigned int choice;
	int s, err;

	busy(me, GLOBAL_CALL);
	for (s = 0; s < NR_SLOTS; s++)
		want[s] = __atomic_load_n(&slots[s].confirm_issued, __ATOMIC_SEQ_CST);
	choice = rnd(seed) % 8;
	if (choice == 0) {
		/* It ends the library's threads: under qemu-user, never
		 * while another thread forks (fork_gate.h). */
		thread_ending_begin();
		percpuref_shutdown();
		thread_ending_end();
		busy(me, -1);
		return;
	}
	allocating_begin();
	switch (choice) {
	case 1:
	case 2:
	case 3:
		if ((err = percpu_ref_managed_flush()))
			FAIL("percpu_ref_managed_flush: %d", err);
		break;
	default:
		if ((err = percpu_ref_barrier()))
			FAIL("percpu_ref_barrier: %d", err);
		for (s = 0; s < NR_SLOTS; s++)
			if (__atomic_load_n(&slots[s].confirm_done, __ATOMIC_SEQ_CST) < want[s])
				FAIL("slot %d: after barrier %ld confirms of %ld asked before it",
				     s, __atomic_load_n(&slots[s].confirm_done, __ATOMIC_SEQ_CST),
				     want[s]);
	}
	allocating_end();
	busy(me, -1);
}

static void one_op(int me, unsigned int *seed)
{
	int s = (int)(rnd(seed) % NR_SLOTS);
	struct slot *sl = &slots[s];
	unsigned int r = rnd(seed) % 100;
	int mine = ld(&held[me][s]);
	unsigned long nr;

	if (r < 2) {
		op_barrier(me, seed);
		return;
	}
	if (r < 3) {
		if (fork_enabled)
			do_fork(me, seed);
		return;
	}
	busy(me, s);
	if (r < 25) {
		if (mine) {
			nr = rnd(seed) % 4 == 0 ? 1 + rnd(seed) % 3 : 1;
			if (nr == 1)
				percpu_ref_get(&sl->ref);
			else
				percpu_ref_get_many(&sl->ref, nr);
			hold_add(me, s, (int)nr);
		}
	} else if (r < 45) {
		if (mine) {
			nr = 1 + rnd(seed) % (unsigned int)mine;
			__atomic_sub_fetch(&held[me][s], (int)nr, __ATOMIC_SEQ_CST);
			if (break_model && rnd(seed) % 500 == 0)
				hold_add(me, s, 1);	/* self-test: a put the model misses */
			if (nr == 1)
				percpu_ref_put(&sl->ref);
			else
				percpu_ref_put_many(&sl->ref, nr);
		}
	} else if (r < 60) {
		op_tryget(me, sl, seed, false);
	} else if (r < 70) {
		op_tryget(me, sl, seed, true);
	} else if (r < 75) {
		check_not_zero_held(me, sl);
	} else {
		op_control(me, sl, seed);
	}
	busy(me, -1);
	if (rnd(seed) % 64 == 0)
		sched_yield();
}

/* ---- end of phase: everything dropped, every life ended and checked ---- */

/* Whether slot @s still has its initial reference to drop. */
static bool initial_held(const bool *skip, int s)
{
	struct slot *sl = &slots[s];

	return !(skip && skip[s]) && sl->live && !ld(&sl->released_done) && ld(&sl->init_held);
}

/* Drops slot @s's initial reference: a managed ref's put, else a kill,
 * with a confirm callback unless @plain (@where names the caller). */
static void drop_initial(int s, bool plain, const char *where)
{
	struct slot *sl = &slots[s];

	st(&sl->init_held, 0);
	hist(sl, -1, where);
	if (!sl->managed && percpu_ref_is_dying(&sl->ref)) {
		FAIL("slot %d (%s): %s: model says live and not killed, library says dying "
		     "(life %lu)", s, kind_name[sl->kind], where, ldl(&sl->life));
		hist_print(sl);
	}
	if (sl->managed) {
		percpu_ref_put(&sl->ref);
		return;
	}
	sl->killed = true;
	if (plain) {
		percpu_ref_kill(&sl->ref);
		return;
	}
	__atomic_add_fetch(&sl->confirm_req, 1, __ATOMIC_SEQ_CST);
	__atomic_store_n(&sl->kill_epoch, ldl(&sl->epoch), __ATOMIC_SEQ_CST);
	percpu_ref_kill_and_confirm(&sl->ref, on_confirm_kill);
	__atomic_add_fetch(&sl->confirm_issued, 1, __ATOMIC_SEQ_CST);
}

/* Drops the initial reference of every live slot. */
static void drop_initials(const bool *skip, unsigned int *seed)
{
	int s;

	for (s = 0; s < NR_SLOTS; s++) {
		if (!initial_held(skip, s))
			continue;
		allocating_begin();
		drop_initial(s, rnd(seed) % 2, "phase drop");
		allocating_end();
	}
}

static void wait_all_released(void)
{
	int err;

	allocating_begin();
	if ((err = percpu_ref_barrier()))
		FAIL("barrier: %d", err);
	if ((err = percpu_ref_managed_flush()))
		FAIL("flush: %d", err);
	allocating_end();
}

/* Checks that every live slot (@skip[s] false) was released exactly once;
 * @cut[s]: may have been cut by a fork (then unreleased, at zero). */
static bool running_at_fork[NR_SLOTS];
static unsigned long kind_cuts[2];	/* the child's cut @release calls: unmanaged, managed */
static unsigned long unstarted_cuts;

static void check_released(const bool *skip, const bool *cut, unsigned long *cuts)
{

	int s;

	for (s = 0; s < NR_SLOTS; s++) {
		struct slot *sl = &slots[s];
		int rel = ld(&sl->releases);

		if (skip && skip[s])
			continue;
		if (ld(&sl->in_release) && !(cut && cut[s]))
			FAIL("slot %d: @release still running after barrier and flush", s);
		if (rel == 0 && cut && cut[s] && percpu_ref_is_zero(&sl->ref)) {
			(*cuts)++;
			kind_cuts[sl->managed]++;
			if (!running_at_fork[s]) {
				unstarted_cuts++;
				fprintf(stderr, "# child: slot %d (%s, %s) unreleased, its @release not "
					"started at the fork\n", s, kind_name[sl->kind],
					sl->managed ? "managed" : "unmanaged");
			}
			/* the doc's "stays dead at zero": treat as released */
			st(&sl->releases, 1);
			st(&sl->released_done, 1);
			st(&sl->in_release, 0);
			continue;
		}
		if (rel != 1)
			FAIL("slot %d (%s, %s%s): %d releases in life %lu, want 1 (total %ld)", s,
			     kind_name[sl->kind], sl->managed ? "managed" : "unmanaged",
			     sl->killed ? ", killed" : "", rel, ldl(&sl->life),
			     __atomic_load_n(&sl->total_releases, __ATOMIC_SEQ_CST));
		if (__atomic_load_n(&sl->confirm_done, __ATOMIC_SEQ_CST) !=
		    __atomic_load_n(&sl->confirm_req, __ATOMIC_SEQ_CST))
			FAIL("slot %d: %ld confirms run, %ld asked", s,
			     __atomic_load_n(&sl->confirm_done, __ATOMIC_SEQ_CST),
			     __atomic_load_n(&sl->confirm_req, __ATOMIC_SEQ_CST));
		if (percpu_ref_tryget(&sl->ref))
			FAIL("slot %d: tryget succeeded on a released ref", s);
		if (percpu_ref_tryget_live(&sl->ref))
			FAIL("slot %d: tryget_live succeeded on a released ref", s);
		if (!percpu_ref_is_zero(&sl->ref))
			FAIL("slot %d: released ref not zero", s);
	}
}

/* Every slot: reinit / resurrect at zero / exit + new init. */
static void renew_slots(const bool *skip, unsigned int *seed)
{
	int s;

	for (s = 0; s < NR_SLOTS; s++) {
		struct slot *sl = &slots[s];
		unsigned int r = rnd(seed) % 3;

		if (skip && skip[s])
			continue;
		if (sl->allow_reinit && r < 2) {
			new_life(sl);
			hist(sl, -1, r ? "renew_reinit" : "renew_resurrect");
			allocating_begin();
			if (r)
				percpu_ref_reinit(&sl->ref);
			else
				percpu_ref_resurrect(&sl->ref);
			allocating_end();
			epoch_end(sl);
			/* a managed ref's reinit puts it back under management */
		} else {
			allocating_begin();
			percpu_ref_exit(&sl->ref);
			allocating_end();
			slot_create(sl, seed);
			hist(sl, -1, kind_name[sl->kind]);
		}
	}
}

/* A short single-threaded life on each slot (the child's second round). */
static void exercise_single(const bool *skip, unsigned int *seed, int me)
{
	int s, i;

	for (i = 0; i < 200; i++) {
		s = (int)(rnd(seed) % NR_SLOTS);
		if (skip[s])
			continue;
		unsigned int r = rnd(seed) % 100;

		if (r < 30 && ld(&held[me][s])) {
			percpu_ref_get(&slots[s].ref);
			hold_add(me, s, 1);
		} else if (r < 50 && ld(&held[me][s])) {
			__atomic_sub_fetch(&held[me][s], 1, __ATOMIC_SEQ_CST);
			percpu_ref_put(&slots[s].ref);
		} else if (r < 65) {
			op_tryget(me, &slots[s], seed, r & 1);
		} else {
			op_control(me, &slots[s], seed);
		}
	}
	for (s = 0; s < NR_SLOTS; s++)
		if (!skip[s])
			drop_all(me, s);
}

/* ---- fork ---- */

static int child_main(int me, unsigned int seed)
{
	bool skip[NR_SLOTS], cut[NR_SLOTS];
	unsigned long cuts = 0;
	int s, t, ncut = 0, in_global = 0;

	in_child = 1;
	child_me = me;
	st(&failures, 0);	/* the parent's are the parent's */
	for (t = 0; t < nthreads; t++)
		if (t != me && ld(&cur_slot[t]) == GLOBAL_CALL)
			in_global++;
	child_deadline(CHILD_DEADLINE_S);
	for (s = 0; s < NR_SLOTS; s++) {
		struct slot *sl = &slots[s];

		skip[s] = false;
		running_at_fork[s] = ld(&sl->in_release);
		for (t = 0; t < nthreads; t++)
			if (t != me && ld(&cur_slot[t]) == s)
				skip[s] = true;
		/* a control op holds mu with cur_slot set: covered above */
		cut[s] = !skip[s] && sl->live && !ld(&sl->released_done) &&
			 !ld(&sl->init_held) && held_sum(s) == 0;
	}
	/* Take over every reference of the slots nobody was in. */
	for (s = 0; s < NR_SLOTS; s++) {
		if (skip[s])
			continue;
		for (t = 0; t < nthreads; t++) {
			int n = ld(&held[t][s]);

			if (n) {
				st(&held[t][s], 0);
				percpu_ref_put_many(&slots[s].ref, (unsigned long)n);
			}
		}
	}
	/* drop_initials(), without the fork gate: a child never forks
	 * while it runs, and inherits the gate as the fork left it. */
	for (s = 0; s < NR_SLOTS; s++)
		if (initial_held(skip, s))
			drop_initial(s, false, "child drop");
	wait_all_released();
	check_released(skip, cut, &cuts);
	for (t = 0; t < 2; t++)
		if (kind_cuts[t] > 1 + (unsigned long)in_global)
			FAIL("%lu %s @release calls missing after the fork; at most %d may be cut "
			     "(one library thread, %d threads in a shutdown/flush/barrier)",
			     kind_cuts[t], t ? "managed" : "unmanaged", 1 + in_global, in_global);
	ncut = (int)cuts;
	/* Second life, in the child. */
	renew_slots(skip, &seed);
	exercise_single(skip, &seed, me);
	drop_initials(skip, &seed);
	wait_all_released();
	check_released(skip, NULL, NULL);
	if (rnd(&seed) % 2)
		percpuref_shutdown();
	if (ld(&failures))
		return 1;
	return ncut ? 100 + ncut : 0;
}

static void do_fork(int me, unsigned int *seed)
{
	unsigned int child_seed = rnd(seed);
	bool overdue;
	int status;
	pid_t pid;

	/* ASan's start-up of a thread allocates: fork once all are past it. */
	if (ld(&started) < nthreads)
		return;
	fork_begin();
	pid = fork();
	if (pid == 0) {
		int rc;

		fork_end_child();
		rc = child_main(me, child_seed);
		if (getenv("STRESS_DEBUG"))
			fprintf(stderr, "child %d: rc %d failures %d\n", getpid(), rc, ld(&failures));
		if (rc == 1 || rnd(&child_seed) % 2)
			_exit(rc);
		exit(rc);	/* the library's exit hook (a shutdown) must end too */
	}
	fork_end();
	if (pid < 0) {
		FAIL("fork: %s", strerror(errno));
		return;
	}
	__atomic_add_fetch(&forks, 1, __ATOMIC_SEQ_CST);
	if (waitpid_within(pid, &status, CHILD_DEADLINE_S + CHILD_GRACE_S, &overdue) != pid) {
		FAIL("waitpid: %s", strerror(errno));
		return;
	}
	if (overdue) {
		FAIL("child of thread %d (seed %u) still running %d s after its deadline: killed",
		     me, child_seed, CHILD_GRACE_S);
		return;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) >= 100) {
		__atomic_add_fetch(&child_cuts, (unsigned long)WEXITSTATUS(status) - 100,
				   __ATOMIC_SEQ_CST);
	} else if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		FAIL("child of thread %d (seed %u) %s %d", me, child_seed,
		     WIFEXITED(status) ? "exited" : "killed by signal",
		     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
	}
}

/* ---- threads ---- */

static void *worker(void *arg)
{
	struct th *th = arg;
	int me = th->me, i, s;
	uint64_t t0;

	/* First get/put of the thread (registration) inside the gate; main()
	 * took the reference held[me][0] for us. */
	allocating_begin();
	percpu_ref_get(&slots[0].ref);
	percpu_ref_put(&slots[0].ref);
	allocating_end();
	__atomic_add_fetch(&started, 1, __ATOMIC_SEQ_CST);
	for (;;) {
		for (i = 0; i < OPS_PER_PHASE; i++)
			one_op(me, &th->seed);
		__atomic_add_fetch(&total_ops, OPS_PER_PHASE, __ATOMIC_RELAXED);
		for (s = 0; s < NR_SLOTS; s++)
			drop_all(me, s);
		pthread_barrier_wait(&phase_bar);
		if (me == 0) {
			t0 = now_ns();
			drop_initials(NULL, &th->seed);
			wait_all_released();
			check_released(NULL, NULL, NULL);
			renew_slots(NULL, &th->seed);
			phases++;
			if (t0 >= end_ns || ld(&failures))
				st(&stop_flag, 1);
		}
		pthread_barrier_wait(&phase_bar);
		if (ld(&stop_flag))
			break;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	struct percpu_ref_managed_config cfg;
	struct th th[MAX_THREADS];
	const char *env_seed = getenv("STRESS_SEED"), *no_fork_why;
	unsigned int seed;
	double seconds;
	int s, t;

	seed = argc > 1 ? (unsigned int)strtoul(argv[1], NULL, 0)
	       : env_seed ? (unsigned int)strtoul(env_seed, NULL, 0)
			  : (unsigned int)now_ns();
	seconds = argc > 2 ? atof(argv[2]) : stress_seconds(3);
	base_seed = seed;
	nthreads = argc > 3 ? atoi(argv[3]) : 2 + (int)(seed % 3);
	if (nthreads < 2 || nthreads > MAX_THREADS)
		nthreads = 2;
	/* ThreadSanitizer: no threads in a fork child; valgrind: the children
	 * leak by design (tests/child.h). */
	no_fork_why = fork_children_untestable();
	if (no_fork_why)
		fork_enabled = 0;
	break_model = getenv("STRESS_BREAK") != NULL;
	slow_release = getenv("STRESS_SLOW_RELEASE") != NULL;
	if (getenv("STRESS_NO_FORK") && !no_fork_why) {
		no_fork_why = "STRESS_NO_FORK";
		fork_enabled = 0;
	}
	percpu_ref_managed_get_config(&cfg);
	cfg.interval_ms = 1 + seed % 3;
	cfg.max_per_scan = (seed / 3) % 2 ? 0 : 3;
	cfg.strategy = (enum percpu_ref_scan_strategy)((seed / 6) % 3);
	printf("# seed %u, %.1f s, %d threads, forks %s%s%s, scan %lu ms max %lu strategy %d, "
	       "fast path %s\n",
	       seed, seconds, nthreads, fork_enabled ? "on" : "off (", no_fork_why ? no_fork_why : "",
	       fork_enabled ? "" : ")",
	       cfg.interval_ms, cfg.max_per_scan, (int)cfg.strategy, percpuref_fast_path());
	fflush(stdout);
	fflush(stderr);
	if (percpu_ref_managed_set_config(&cfg))
		return 1;
	end_ns = now_ns() + (uint64_t)(seconds * 1e9);
	for (s = 0; s < NR_SLOTS; s++) {
		unsigned int ss = seed * 31u + (unsigned int)s;

		slots[s].idx = s;
		slots[s].kill_confirmed = ~0UL;
		pthread_mutex_init(&slots[s].mu, NULL);
		pthread_rwlock_init(&slots[s].tg, NULL);
		if (slot_create(&slots[s], &ss))
			return 1;
	}
	/* slot 0 is taken by every worker at its start: make it live plain */
	if (!slots[0].live || slots[0].managed) {
		percpu_ref_exit(&slots[0].ref);
		slots[0].kind = K_PLAIN_RI;
		slots[0].allow_reinit = true;
		slots[0].managed = slots[0].sticky = false;
		new_life(&slots[0]);
		epoch_end(&slots[0]);
		if (percpu_ref_init(&slots[0].ref, on_release, PERCPU_REF_ALLOW_REINIT))
			return 1;
	}
	for (t = 0; t < MAX_THREADS; t++)
		st(&cur_slot[t], -1);
	for (t = 0; t < nthreads; t++) {
		percpu_ref_get(&slots[0].ref);
		st(&held[t][0], 1);
	}
	pthread_barrier_init(&phase_bar, NULL, (unsigned int)nthreads);
	for (t = 0; t < nthreads; t++) {
		th[t].me = t;
		th[t].seed = seed * 7919u + (unsigned int)t * 104729u + 1;
		pthread_create(&th[t].tid, NULL, worker, &th[t]);
	}
	for (t = 0; t < nthreads; t++)
		pthread_join(th[t].tid, NULL);
	printf("# %lu phases, %lu ops, %lu forks, %lu @release cut by forks\n", phases,
	       total_ops, forks, child_cuts);
	ok(ld(&failures) == 0, "seed %u: model checks (%d failures)", seed, ld(&failures));
	for (s = 0; s < NR_SLOTS; s++)
		percpu_ref_exit(&slots[s].ref);
	return done_testing();
}
