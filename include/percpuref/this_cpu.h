/*
 * this_cpu.h - add to the current CPU's copy of a per-CPU counter, without a
 * locked instruction, from userspace.
 *
 * A per-CPU counter is addressed by the address of CPU 0's copy; CPU n's copy
 * lies (n << PERCPUREF_UNIT_SHIFT) bytes further (src/percpu_alloc.c lays
 * chunks out as one unit per possible CPU, the kernel's percpu layout).
 *
 * The fast path is an x86-64 restartable sequence (rseq): read the CPU number
 * glibc's rseq area holds for this thread, read the counter's mode word, and
 * commit with one non-atomic add.  The kernel restarts the sequence from the
 * top if the thread is preempted, migrated or signalled before the commit, so
 * the add lands on the CPU the thread was running on and no other thread of
 * that CPU interleaves with it.  A mode switch that sets a flag bit in the mode
 * word and then calls membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ) aborts
 * every sequence still in flight, so once membarrier returns no add that read
 * the old mode can commit (see percpuref_fence_readers()).
 *
 * Where rseq is missing (no glibc registration, valgrind, other
 * architectures) percpuref_this_cpu_add() returns PERCPUREF_THIS_CPU_NO_RSEQ
 * and the caller takes its out-of-line fallback, which uses sched_getcpu(), an
 * atomic add and an RCU read-side section instead.
 */
#ifndef PERCPUREF_THIS_CPU_H
#define PERCPUREF_THIS_CPU_H

#include <stdbool.h>
#include <stdint.h>

#include <percpuref/compiler.h>

#if defined(__x86_64__) && defined(__GLIBC__) && \
	(__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
#include <sys/rseq.h>
#define PERCPUREF_HAVE_RSEQ 1
#else
#define PERCPUREF_HAVE_RSEQ 0
#endif

/* Per-CPU units are 64 KiB apart: 8192 eight-byte counters per chunk. */
#define PERCPUREF_UNIT_SHIFT 16
/* Low bits of a mode word that send callers off the per-CPU path. */
#define PERCPUREF_MODE_FLAGS 3UL

PERCPUREF_BEGIN_DECLS

enum percpuref_this_cpu_result {
	PERCPUREF_THIS_CPU_DONE,	/* added to this CPU's counter */
	PERCPUREF_THIS_CPU_FLAGGED,	/* mode word has flags: nothing added */
	PERCPUREF_THIS_CPU_NO_RSEQ,	/* no usable rseq: nothing added */
};

/*
 * Set once by the library before the first per-CPU counter exists: true when
 * glibc registered rseq and membarrier(..._RSEQ) is registered for this
 * process.  Read without ordering: any counter a thread can reach was
 * published after it was set.
 */
extern PERCPUREF_API bool percpuref_rseq_usable;
/*
 * Per-CPU units allocated per counter, set before percpuref_rseq_usable.
 * The rseq sequence commits only for cpu_id below it, so a CPU count that
 * was wrong (sysfs hidden) can never send an add past the allocation.
 */
extern PERCPUREF_API unsigned int percpuref_nr_cpu_units;

/*
 * percpuref_this_cpu_add - add @delta to this CPU's copy of the counter whose
 * mode word is *@mode_word, unless the word has PERCPUREF_MODE_FLAGS bits set.
 * The word is read inside the restartable sequence, so a concurrent switch
 * fenced by percpuref_fence_readers() either sees this add or makes this call
 * re-read the word.  Any thread, any context that may run user code.
 */
static inline enum percpuref_this_cpu_result
percpuref_this_cpu_add(const uintptr_t *mode_word, unsigned long delta)
{
#if PERCPUREF_HAVE_RSEQ
	struct rseq *rs;

	if (percpuref_unlikely(!percpuref_rseq_usable))
		return PERCPUREF_THIS_CPU_NO_RSEQ;
	rs = (struct rseq *)((char *)__builtin_thread_pointer() + __rseq_offset);
	/* cpu_id is negative for a thread whose registration failed. */
	if (percpuref_unlikely((int32_t)rs->cpu_id < 0))
		return PERCPUREF_THIS_CPU_NO_RSEQ;
	for (;;) {
		/*
		 * Descriptor 3: {version, flags, start 1, length 2-1, abort 4}.
		 * The abort handler is preceded by the signature glibc
		 * registered (RSEQ_SIG, 0x53053053 on x86) and leaves the
		 * sequence through the C label "restart", which re-arms it.
		 */
		__asm__ __volatile__ goto(
			".pushsection __rseq_cs, \"aw\"\n\t"
			".balign 32\n\t"
			"3:\n\t"
			".long 0x0, 0x0\n\t"
			".quad 1f, (2f - 1f), 4f\n\t"
			".popsection\n\t"
			"leaq 3b(%%rip), %%rax\n\t"
			"movq %%rax, %[rseq_cs]\n\t"
			"1:\n\t"
			"movl %[cpu_id], %%eax\n\t"
			"cmpl %[units], %%eax\n\t"
			"jae %l[no_unit]\n\t"
			"movq %[word], %%rcx\n\t"
			"testq %[flags], %%rcx\n\t"
			"jnz %l[flagged]\n\t"
			"shlq %[shift], %%rax\n\t"
			"addq %[delta], (%%rcx, %%rax)\n\t"
			"2:\n\t"
			".pushsection __rseq_failure, \"ax\"\n\t"
			".byte 0x0f, 0xb9, 0x3d\n\t"
			".long 0x53053053\n\t"
			"4:\n\t"
			"jmp %l[restart]\n\t"
			".popsection\n\t"
			:
			: [rseq_cs] "m"(rs->rseq_cs), [cpu_id] "m"(rs->cpu_id),
			  [word] "m"(*mode_word), [delta] "r"(delta),
			  [units] "m"(percpuref_nr_cpu_units),
			  [flags] "i"(PERCPUREF_MODE_FLAGS),
			  [shift] "i"(PERCPUREF_UNIT_SHIFT)
			: "memory", "cc", "rax", "rcx"
			: flagged, restart, no_unit);
		return PERCPUREF_THIS_CPU_DONE;
restart:
		continue;
flagged:
		return PERCPUREF_THIS_CPU_FLAGGED;
no_unit:
		return PERCPUREF_THIS_CPU_NO_RSEQ;
	}
#else
	(void)mode_word;
	(void)delta;
	return PERCPUREF_THIS_CPU_NO_RSEQ;
#endif
}

PERCPUREF_END_DECLS

#endif
