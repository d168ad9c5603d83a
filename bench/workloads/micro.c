/* SPDX-License-Identifier: MIT */
/*
 * micro.c - the micro benchmark: get+put pairs on ONE shared reference,
 * from N threads pinned one per CPU, for every kind of count we have.
 *
 * This is the fast path with nothing around it, so it shows the two costs
 * the design is about: the instructions of one get+put (the one-thread
 * row) and what contention on one cache line adds to them (the rows after).
 *
 * Variants (one shared object per measurement, allocated on its own
 * 128-byte block so nothing else sits on the hot line):
 *   private        a plain per-thread counter, incremented and decremented
 *                  through memory: what a get+put costs when nothing is
 *                  shared and nothing is atomic.  Not always the floor: on
 *                  some cores its stack slot's chain of adds runs slower
 *                  than unprotected's adds through a register (an Intel
 *                  Xeon guest: 1.35 ns against 0.70, docs/bench.md).  An empty
 *                  asm with a "+m" operand after each step makes the
 *                  compiler keep the value in memory and forbids it to fold
 *                  the pair away, without adding any instruction.
 *   kref           kref_get + kref_put: two locked RMWs on one shared line.
 *   rcuref         rcuref_get + rcuref_put (the full put, with its
 *                  liburcu-bp read-side section, out of line).
 *   percpu         percpu_ref in per-CPU mode: two rseq non-atomic adds on
 *                  this CPU's counter.
 *   percpu-atomic  the same ref after percpu_ref_switch_to_atomic_sync():
 *                  the flagged path, an atomic on the shared count.
 *   shared_ptr     copy and destroy a std::shared_ptr<long> (two locked
 *                  RMWs on the control block; micro_shared_ptr.cpp).
 *   ref_ptr        copy and destroy a percpuref::ref_ptr (percpuref.hpp):
 *                  the percpu variant through the C++ RAII handle
 *                  (micro_cxx.cpp).
 *
 * Each measurement starts from one reference (the owner's) and every pair
 * returns it, so teardown checks that the count is exactly one again and
 * that nothing was released: a broken count fails the run (bench_die),
 * which is what the smoke test relies on.
 */
#include <stddef.h>
#include <stdlib.h>

#include <percpuref/kref.h>
#include <percpuref/percpu_ref.h>
#include <percpuref/rcuref.h>

#include "bench.h"
#include "micro_cxx.h"
#include "micro_shared_ptr.h"

enum micro_kind {
	MICRO_PRIVATE,
	MICRO_KREF,
	MICRO_RCUREF,
	MICRO_PERCPU,
	MICRO_PERCPU_ATOMIC,
	MICRO_SHARED_PTR,
	MICRO_REF_PTR,
	MICRO_UNPROTECTED,
};

/* Only the member of the running variant is used. */
struct micro_state {
	struct kref kref;
	rcuref_t rcuref;
	struct percpu_ref percpu;
	void *shared_ptr;
	void *ref_ptr;
	bool percpu_released;
};

static void kref_must_not_release(struct kref *kref)
{
	bench_die("micro: kref %p released during the run", (void *)kref);
}

static void percpu_release(struct percpu_ref *ref)
{
	struct micro_state *s =
		(struct micro_state *)((char *)ref - offsetof(struct micro_state, percpu));

	s->percpu_released = true;
}

static void micro_setup(struct bench_run *run)
{
	struct micro_state *s = bench_zalloc(sizeof(*s));

	run->state = s;
	switch (run->variant->arg) {
	case MICRO_KREF:
		kref_init(&s->kref);
		break;
	case MICRO_RCUREF:
		rcuref_init(&s->rcuref, 1);
		break;
	case MICRO_PERCPU:
	case MICRO_PERCPU_ATOMIC:
	case MICRO_UNPROTECTED:
		if (percpu_ref_init(&s->percpu, percpu_release, 0))
			bench_die("micro: percpu_ref_init failed");
		if (run->variant->arg == MICRO_PERCPU_ATOMIC)
			percpu_ref_switch_to_atomic_sync(&s->percpu);
		break;
	case MICRO_SHARED_PTR:
		s->shared_ptr = micro_shared_ptr_new();
		break;
	case MICRO_REF_PTR:
		s->ref_ptr = micro_ref_ptr_new();
		break;
	}
}

static void micro_teardown(struct bench_run *run)
{
	struct micro_state *s = run->state;
	const char *name = run->variant->name;

	switch (run->variant->arg) {
	case MICRO_KREF:
		if (kref_read(&s->kref) != 1)
			bench_die("micro %s: count %u after the run, want 1", name,
				  kref_read(&s->kref));
		break;
	case MICRO_RCUREF:
		if (rcuref_read(&s->rcuref) != 1)
			bench_die("micro %s: count %u after the run, want 1", name,
				  rcuref_read(&s->rcuref));
		break;
	case MICRO_PERCPU:
	case MICRO_PERCPU_ATOMIC:
		/*
		 * Dropping the owner's reference must release: the pairs
		 * left the count at exactly one.  The barrier waits for the
		 * kill's switch and the release it triggers.
		 */
		if (s->percpu_released)
			bench_die("micro %s: released during the run", name);
		percpu_ref_kill(&s->percpu);
		percpu_ref_barrier();
		if (!s->percpu_released)
			bench_die("micro %s: not released after the kill", name);
		percpu_ref_exit(&s->percpu);
		break;
	case MICRO_SHARED_PTR:
		if (micro_shared_ptr_use_count(s->shared_ptr) != 1)
			bench_die("micro %s: use_count %ld after the run, want 1", name,
				  micro_shared_ptr_use_count(s->shared_ptr));
		micro_shared_ptr_delete(s->shared_ptr);
		break;
	case MICRO_REF_PTR:
		if (micro_ref_ptr_delete(s->ref_ptr))
			bench_die("micro %s: not released exactly when the last ref_ptr went", name);
		break;
	case MICRO_UNPROTECTED:
		/* Its adds may have been lost or torn: no count to check. */
		percpu_ref_exit(&s->percpu);
		break;
	}
	free(s);
}

static void private_loop(struct bench_thread *t)
{
	unsigned long count = 0;

	while (bench_running(t)) {
		for (int i = 0; i < BENCH_BATCH; i++) {
			count++;
			__asm__ __volatile__("" : "+m"(count));
			count--;
			__asm__ __volatile__("" : "+m"(count));
		}
		bench_count(t, BENCH_BATCH);
	}
	if (count != 0)
		bench_die("micro private: count %lu, want 0", count);
}

static void kref_loop(struct bench_thread *t)
{
	struct micro_state *s = t->run->state;

	while (bench_running(t)) {
		for (int i = 0; i < BENCH_BATCH; i++) {
			kref_get(&s->kref);
			kref_put(&s->kref, kref_must_not_release);
		}
		bench_count(t, BENCH_BATCH);
	}
}

static void rcuref_loop(struct bench_thread *t)
{
	struct micro_state *s = t->run->state;

	while (bench_running(t)) {
		for (int i = 0; i < BENCH_BATCH; i++) {
			if (percpuref_unlikely(!rcuref_get(&s->rcuref) || rcuref_put(&s->rcuref)))
				bench_die("micro rcuref: the count died during the run");
		}
		bench_count(t, BENCH_BATCH);
	}
}

/* Both percpu variants: the mode decides which path get and put take. */
static void percpu_loop(struct bench_thread *t)
{
	struct micro_state *s = t->run->state;

	while (bench_running(t)) {
		for (int i = 0; i < BENCH_BATCH; i++) {
			percpu_ref_get(&s->percpu);
			percpu_ref_put(&s->percpu);
		}
		bench_count(t, BENCH_BATCH);
	}
}

/*
 * The lower bound of a per-CPU pair, NOT a usable counter: load cpu_id from
 * the rseq area and add to that CPU's word with one plain addq, get and put,
 * with no restartable sequence around it: no rseq_cs store, no mode word, no
 * bound check.  A preemption between the load and the add lands the add on
 * another CPU's word, racing its owner.  Without rseq every add goes to CPU
 * 0's word.
 */
static inline void unprotected_add(uintptr_t cpu0, uint32_t cpu, unsigned long delta)
{
	unsigned long *word = (unsigned long *)(cpu0 + ((uintptr_t)cpu * PERCPUREF_UNIT_STRIDE));

#if defined(__x86_64__)
	/* One addq to memory through one register, as the rseq commit is
	 * (an indexed address costs more on some cores: this_cpu.h), of an
	 * immediate where the delta is a constant, as the commit's is
	 * (percpu_ref.h, PERCPU_REF_NET_BITS). */
	__asm__ __volatile__("addq %[delta], (%[word])"
			     : "+m"(*word)
			     : [word] "r"(word), [delta] "er"(delta));
#else
	/* Relaxed: plain load, add, store, as the aarch64 commit is. */
	__atomic_store_n(word, __atomic_load_n(word, __ATOMIC_RELAXED) + delta, __ATOMIC_RELAXED);
#endif
}

static void unprotected_loop(struct bench_thread *t)
{
	struct micro_state *s = t->run->state;
	uintptr_t cpu0 = s->percpu.percpu_count_ptr & ~(uintptr_t)PERCPUREF_MODE_FLAGS;
	struct percpuref_rseq_area *rs;
	static const uint32_t no_cpu;
	const volatile uint32_t *cpu_id = &no_cpu;

	/* A pair first: under the library's own rseq registration a thread
	 * is registered at its first per-CPU add, and before that its
	 * cpu_id is negative (-1 unregistered, -2 refused), an add far
	 * outside the counter.  Still no CPU number after it (refused): CPU
	 * 0's word, as without rseq. */
	percpu_ref_get(&s->percpu);
	percpu_ref_put(&s->percpu);
	rs = percpuref_this_rseq_area();
	if (rs && rs->cpu_id < percpuref_nr_cpu_units)
		cpu_id = &rs->cpu_id;

	while (bench_running(t)) {
		for (int i = 0; i < BENCH_BATCH; i++) {
			unprotected_add(cpu0, *cpu_id, 1);
			unprotected_add(cpu0, *cpu_id, PERCPU_REF_PUT_DELTA);
		}
		bench_count(t, BENCH_BATCH);
	}
}

static void shared_ptr_loop(struct bench_thread *t)
{
	struct micro_state *s = t->run->state;

	while (bench_running(t)) {
		micro_shared_ptr_pairs(s->shared_ptr, BENCH_BATCH);
		bench_count(t, BENCH_BATCH);
	}
}

static void ref_ptr_loop(struct bench_thread *t)
{
	struct micro_state *s = t->run->state;

	while (bench_running(t)) {
		micro_ref_ptr_pairs(s->ref_ptr, BENCH_BATCH);
		bench_count(t, BENCH_BATCH);
	}
}

static const struct bench_variant micro_variants[] = {
	{ "private", "per-thread non-atomic counter, nothing shared", private_loop, MICRO_PRIVATE },
	{ "kref", "kref_get/kref_put: saturating atomic count", kref_loop, MICRO_KREF },
	{ "rcuref", "rcuref_get/rcuref_put (Linux 6.4 rcuref_t)", rcuref_loop, MICRO_RCUREF },
	{ "percpu", "percpu_ref_get/put in per-CPU mode", percpu_loop, MICRO_PERCPU },
	{ "percpu-atomic", "percpu_ref_get/put after switch_to_atomic_sync", percpu_loop,
	  MICRO_PERCPU_ATOMIC },
	{ "shared_ptr", "std::shared_ptr copy/destroy", shared_ptr_loop, MICRO_SHARED_PTR },
	{ "ref_ptr", "percpuref::ref_ptr copy/destroy (C++)", ref_ptr_loop, MICRO_REF_PTR },
	{ "unprotected", "LOWER BOUND, not a counter: load cpu_id, plain add; no rseq section",
	  unprotected_loop, MICRO_UNPROTECTED },
	{ 0 },
};

static const struct bench_workload micro = {
	.name = "micro",
	.help = "get+put pairs on one shared reference, one thread per CPU",
	.op = "pair",
	.variants = micro_variants,
	.setup = micro_setup,
	.teardown = micro_teardown,
};
PERCPUREF_BENCH_WORKLOAD(micro);
