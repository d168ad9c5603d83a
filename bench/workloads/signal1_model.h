/* SPDX-License-Identifier: MIT */
/*
 * signal1_model.h - three models of the ucounts RLIMIT_SIGPENDING charge
 * that are not hcount, for the signal1 workload (signal1.c).  Not library
 * API: the benchmark's own, after the kernel code and the patches they
 * stand for.
 *
 * The tree is the report's: init_ucounts at the root and every container's
 * user namespace directly under it.  Each level has its count and its max;
 * the task charges at its container's level against its own rlimit
 * (tlimit), and the levels above against their max unless override_rlimit
 * (the signal is one the kernel queues past the rlimit).  --limit gives
 * every level the same max, so which level's max checks which count (the
 * kernel checks a parent's count against the max its child namespace
 * recorded) makes no difference here.
 *
 * kernel (sig1_kernel_charge/_uncharge): Linux 6.12's
 * inc_rlimit_get_ucounts() and dec_rlimit_put_ucounts(), the report's
 * "before".  A charge adds one at every level up to the root with an
 * atomic add, checks the new count after the add (the task's own level
 * against nothing, each level above against the max of the one below, none
 * with override_rlimit) and unwinds the levels it added to when one is
 * over; the caller then checks the task's own level against its rlimit.  A
 * level whose count goes from 0 to 1 takes a reference on its ucounts
 * (get_ucounts(): an atomic add), and one whose count goes back to 0 puts
 * it (put_ucounts(): atomic_dec_and_lock()'s compare-and-swap, which never
 * takes the count to zero while the namespace holds its own reference, as
 * here).  The reference count is on another line of struct ucounts than
 * the rlimit counts (offset 28 against 144 on x86-64), and so it is here.
 *
 * report (sig1_report_charge/_uncharge): the ucounts report's cache, as
 * its patch does it.  Each container keeps an atomic cache of units already
 * charged to every level above it.  A charge takes one unit from the cache
 * (a decrement that never goes below zero) and adds one to the container's
 * own count only; an empty cache is refilled by charging a batch of
 * SIG1_REPORT_BATCH (16) up the chain, each level checked and the levels
 * below unwound when one refuses, and the charge retried once.  An
 * uncharge takes one from the container's count and gives the unit back to
 * the cache; a cache that then holds more than the batch returns a batch up
 * the chain.  A charge that a level refuses drains every container's cache
 * back up the chain (exchange to zero, so each unit goes back once) and
 * charges the unit up the chain directly.  That makes a refusal exact when
 * nothing runs beside it, but not under concurrency, which the patch does
 * not address: another refill's batch sits on a level for a moment before
 * it is taken back, and a drain does not stop a refill from filling a
 * cache behind it, so a charge may be refused with room left.  signal1
 * retries such a charge (at most SIG1_REPORT_RETRIES times in a row) and
 * counts the refusals.
 *
 * percpu-counter (sig1_pcpu_charge/_uncharge): the next revision of that
 * series, a percpu_counter per level.  A charge adds one to this CPU's
 * delta at every level; a delta whose magnitude reaches the batch is folded
 * into the level's shared count.  The limit check reads the shared count
 * (approximate: off by at most batch x CPUs) and only when that is within
 * the slack of the max sums every CPU's delta (the kernel's
 * percpu_counter_sum(): exact when no add runs beside it).  Threads that
 * share a CPU (the oversubscribed rows) share its delta, so the add is an
 * atomic read-modify-write on a line no other CPU writes: the kernel's
 * this_cpu add with preemption off, in userspace.  Unlike the kernel, a
 * thread can be preempted between its add and its fold, so a CPU's delta
 * can pass the batch by one for each thread of that CPU preempted there:
 * the bound above holds only while none is.  signal1 never comes near a
 * limit with those rows (each worker holds at most one unit and the limit
 * leaves room for all), so it does not matter there.
 *
 * Ordering: counts only.  Every access is a relaxed atomic; a charge orders
 * nothing for the caller, as hcount's does not (the kernel's value-returning
 * atomics are fully ordered, but on x86 a relaxed read-modify-write is the
 * same locked instruction, so the kernel model costs what the kernel does).  Exactness of the limits
 * in "report" needs no ordering either: a drain and a refill both move
 * units with atomic read-modify-writes, so no unit is counted twice.
 */
#ifndef PERCPUREF_BENCH_SIGNAL1_MODEL_H
#define PERCPUREF_BENCH_SIGNAL1_MODEL_H

#include <stdbool.h>
#include <stddef.h>

#include <percpuref/compiler.h>

#define SIG1_REPORT_BATCH 16L
/* Refusals of one charge in a row past which signal1 calls it a bug. */
#define SIG1_REPORT_RETRIES 1000000U

/* One level of the tree (a namespace's ucounts), alone on its lines. */
struct sig1_level {
	long count;		/* units charged here: atomic */
	long cache;		/* report: units charged above, not used yet */
	long max;		/* the namespace's max; the root's is its rlimit */
	struct sig1_level *parent;	/* NULL at the root */
	/* percpu-counter: this level's per-CPU deltas, 128 bytes apart. */
	long *deltas;
	/*
	 * kernel: the ucounts' reference count, atomic; 1, the namespace's
	 * own reference, while nothing is charged here.  On another line than
	 * the count, as in struct ucounts (offsets 28 and 144 there; 128
	 * bytes apart here).
	 */
	long refs __attribute__((aligned(128)));
} __attribute__((aligned(128)));

struct sig1_tree {
	struct sig1_level *root;
	struct sig1_level **containers;
	unsigned int ncontainers;
	unsigned int ncpus;	/* per-CPU deltas of each level */
	long pcpu_batch;	/* percpu-counter fold threshold */
	bool override_rlimit;
	long drains;		/* report: caches drained by a refused refill (atomic) */
};

/* The deltas are 128 bytes apart: 16 longs. */
#define SIG1_DELTA_STRIDE 16

struct sig1_tree *sig1_tree_create(unsigned int ncontainers, long max, unsigned int ncpus);
/*
 * Checks that no unit is left anywhere and that each level holds only its
 * own reference, then frees; false if not.
 */
bool sig1_tree_destroy(struct sig1_tree *t);
/* report: empty every container's cache back up the chain. */
void sig1_report_drain(struct sig1_tree *t);
/*
 * percpu-counter: @l's count, shared count + deltas (exact when no add runs
 * beside it, a sum of relaxed loads otherwise).
 */
long sig1_pcpu_sum(const struct sig1_tree *t, const struct sig1_level *l);

/* Adds @n at every level from @l up, each checked unless @nocheck; unwinds. */
static inline bool sig1_chain_add(struct sig1_level *l, long n, bool nocheck)
{
	for (struct sig1_level *i = l; i; i = i->parent) {
		long v = __atomic_add_fetch(&i->count, n, __ATOMIC_RELAXED);

		if (n > 0 && !nocheck && v > i->max) {
			for (struct sig1_level *u = l; u != i->parent; u = u->parent)
				__atomic_sub_fetch(&u->count, n, __ATOMIC_RELAXED);
			return false;
		}
	}
	return true;
}

/* get_ucounts(): one more reference on @l's ucounts. */
static inline void sig1_ucounts_get(struct sig1_level *l)
{
	/* Relaxed: a count only; on x86 the same locked add as the kernel's. */
	__atomic_add_fetch(&l->refs, 1, __ATOMIC_RELAXED);
}

/* Takes one from *@word if it is above @floor; false if it was not. */
static inline bool sig1_dec_above(long *word, long floor)
{
	long v = __atomic_load_n(word, __ATOMIC_RELAXED);

	/* Relaxed: counts only (a compare-and-swap loop, as the kernel's). */
	while (v > floor)
		if (__atomic_compare_exchange_n(word, &v, v - 1, false, __ATOMIC_RELAXED,
						__ATOMIC_RELAXED))
			return true;
	return false;
}

/*
 * put_ucounts(): one reference less, atomic_dec_and_lock()'s
 * atomic_add_unless(-1, 1); false if it was the last (a bug here).
 */
static inline bool sig1_ucounts_put(struct sig1_level *l)
{
	return sig1_dec_above(&l->refs, 1);
}

/*
 * kernel: takes one unit off every level from @c up to @last (excluded),
 * putting the reference of each that goes back to 0; false if a count went
 * below zero or a put found only the namespace's own reference (both bugs).
 */
static inline bool sig1_kernel_uncharge(struct sig1_level *c, const struct sig1_level *last)
{
	bool ok = true;

	for (struct sig1_level *i = c; i != last; i = i->parent) {
		long v = __atomic_sub_fetch(&i->count, 1, __ATOMIC_RELAXED);

		if (v < 0)
			ok = false;
		else if (v == 0)
			ok &= sig1_ucounts_put(i);
	}
	return ok;
}

/* kernel: one unit at container @c against @tlimit; false: refused. */
static inline bool sig1_kernel_charge(struct sig1_tree *t, struct sig1_level *c, long tlimit)
{
	long max = __LONG_MAX__;
	long own = 0;

	for (struct sig1_level *i = c; i; i = i->parent) {
		long v = __atomic_add_fetch(&i->count, 1, __ATOMIC_RELAXED);

		/* Before the check, as 6.12 does: the unwind puts it. */
		if (v == 1)
			sig1_ucounts_get(i);
		if (percpuref_unlikely(v > max)) {
			sig1_kernel_uncharge(c, i->parent);
			return false;
		}
		if (i == c)
			own = v;
		if (!t->override_rlimit)
			max = i->max;
	}
	/* __sigqueue_alloc(): the task's own count against its rlimit. */
	if (percpuref_unlikely(!t->override_rlimit && own > tlimit)) {
		sig1_kernel_uncharge(c, NULL);
		return false;
	}
	return true;
}

/* A unit from @c's cache, if it holds one. */
static inline bool sig1_cache_take(struct sig1_level *c)
{
	return sig1_dec_above(&c->cache, 0);
}

bool sig1_report_refill_slow(struct sig1_tree *t, struct sig1_level *c);

/* report: one unit at container @c against @tlimit; false: refused. */
static inline bool sig1_report_charge(struct sig1_tree *t, struct sig1_level *c, long tlimit)
{
	if (percpuref_unlikely(!sig1_cache_take(c)) && !sig1_report_refill_slow(t, c))
		return false;
	if (percpuref_unlikely(__atomic_add_fetch(&c->count, 1, __ATOMIC_RELAXED) > tlimit)) {
		__atomic_sub_fetch(&c->count, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&c->cache, 1, __ATOMIC_RELAXED);
		return false;
	}
	return true;
}

/* report: give one unit back at @c; a cache above the batch returns one. */
static inline void sig1_report_uncharge(struct sig1_level *c)
{
	long v;

	__atomic_sub_fetch(&c->count, 1, __ATOMIC_RELAXED);
	v = __atomic_add_fetch(&c->cache, 1, __ATOMIC_RELAXED);
	while (percpuref_unlikely(v > SIG1_REPORT_BATCH)) {
		if (__atomic_compare_exchange_n(&c->cache, &v, v - SIG1_REPORT_BATCH, false,
						__ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
			sig1_chain_add(c->parent, -SIG1_REPORT_BATCH, true);
			return;
		}
	}
}

/* percpu-counter: add @n to @l's delta on @cpu, folding past the batch. */
static inline void sig1_pcpu_add(const struct sig1_tree *t, struct sig1_level *l, int cpu, long n)
{
	long *delta = &l->deltas[cpu * SIG1_DELTA_STRIDE];
	long v = __atomic_add_fetch(delta, n, __ATOMIC_RELAXED);

	if (percpuref_unlikely(v >= t->pcpu_batch || v <= -t->pcpu_batch)) {
		v = __atomic_exchange_n(delta, 0, __ATOMIC_RELAXED);
		__atomic_add_fetch(&l->count, v, __ATOMIC_RELAXED);
	}
}

/* percpu-counter: whether @l's count is above @max, exactly when close. */
static inline bool sig1_pcpu_over(const struct sig1_tree *t, const struct sig1_level *l, long max)
{
	long slack = t->pcpu_batch * (long)t->ncpus;

	if (__atomic_load_n(&l->count, __ATOMIC_RELAXED) + slack <= max)
		return false;
	return sig1_pcpu_sum(t, l) > max;
}

/* percpu-counter: one unit at @c on @cpu against @tlimit; false: refused. */
static inline bool sig1_pcpu_charge(struct sig1_tree *t, struct sig1_level *c, int cpu, long tlimit)
{
	for (struct sig1_level *i = c; i; i = i->parent) {
		sig1_pcpu_add(t, i, cpu, 1);
		if (percpuref_unlikely(sig1_pcpu_over(t, i, i == c ? tlimit : i->max) &&
				       (i == c || !t->override_rlimit))) {
			for (struct sig1_level *u = c; u != i->parent; u = u->parent)
				sig1_pcpu_add(t, u, cpu, -1);
			return false;
		}
	}
	return true;
}

static inline void sig1_pcpu_uncharge(struct sig1_tree *t, struct sig1_level *c, int cpu)
{
	for (struct sig1_level *i = c; i; i = i->parent)
		sig1_pcpu_add(t, i, cpu, -1);
}

#endif
