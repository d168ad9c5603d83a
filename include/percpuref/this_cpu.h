/* SPDX-License-Identifier: MIT */
/*
 * this_cpu.h - add to the current CPU's copy of a per-CPU counter, without a
 * locked instruction, from userspace.
 *
 * A per-CPU counter is addressed by the address of CPU 0's copy; CPU n's copy
 * lies n * PERCPUREF_UNIT_STRIDE bytes further (src/percpu_alloc.c lays
 * chunks out as one unit per possible CPU, the kernel's percpu layout).
 *
 * The fast path is a restartable sequence (rseq): read the CPU number the
 * kernel keeps in this thread's rseq area, read the counter's mode word, and
 * commit with one non-atomic add.  The kernel restarts the sequence from the
 * top if the thread is preempted, migrated or signalled before the commit, so
 * the add lands on the CPU the thread was running on and no other thread of
 * that CPU interleaves with it.  A mode switch that sets a flag bit in the mode
 * word and then calls membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ) aborts
 * every sequence still in flight, so once membarrier returns no add that read
 * the old mode can commit (see percpuref_fence_readers()).
 *
 * Whose rseq area.  glibc >= 2.35 registers one per thread at
 * __rseq_offset from the thread pointer; where the C library registered none
 * (older glibc, musl, GLIBC_TUNABLES=glibc.pthread.rseq=0) the library
 * registers its own, an initial-exec TLS variable, lazily on each thread's
 * first call (src/rseq_register.c).  Either way the area lies at the same
 * offset from every thread's thread pointer, published in
 * percpuref_rseq_offset.  The ABI (struct rseq, the abort signature) is
 * carried here, so no <sys/rseq.h> is needed to build.
 *
 * Architectures: x86-64 always; aarch64 only when built with
 * PERCPUREF_ARM64_RSEQ (cmake -DPERCPUREF_ARM64_RSEQ=ON), until the sequence
 * has run on a real arm64 kernel (docs/percpu_ref.md).  Elsewhere, and where
 * no area is registered, percpuref_this_cpu_add() returns
 * PERCPUREF_THIS_CPU_NO_RSEQ and the caller takes its out-of-line fallback
 * (src/fallback.c).
 */
#ifndef PERCPUREF_THIS_CPU_H
#define PERCPUREF_THIS_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <percpuref/compiler.h>

#if defined(__linux__) && defined(__x86_64__)
#define PERCPUREF_HAVE_RSEQ 1
/* ud1 0x53053053(%rip),%edi before each abort handler; glibc's value too. */
#define PERCPUREF_RSEQ_SIG 0x53053053U
#elif defined(__linux__) && defined(__aarch64__) && defined(PERCPUREF_ARM64_RSEQ) && \
	!defined(__AARCH64EB__)
#define PERCPUREF_HAVE_RSEQ 1
/* brk #0x45e0 before each abort handler: the kernel's and glibc's value. */
#define PERCPUREF_RSEQ_SIG 0xd428bc00U
#else
#define PERCPUREF_HAVE_RSEQ 0
#endif

/*
 * The sequence's descriptor (struct rseq_cs: version 0, flags 0, start, post
 * commit offset, abort), as local label 3 in section __rseq_cs; the
 * sequence itself defines 1 (start), 2 (after the commit) and 4 (abort).
 */
#define PERCPUREF_RSEQ_CS_DESCRIPTOR		\
	".pushsection __rseq_cs, \"aw\"\n\t"	\
	".balign 32\n\t"			\
	"3:\n\t"				\
	".long 0x0, 0x0\n\t"			\
	".quad 1f, (2f - 1f), 4f\n\t"		\
	".popsection\n\t"

/* Per-CPU units hold 64 KiB of counters: 8192 eight-byte ones a chunk. */
#define PERCPUREF_UNIT_SHIFT 16
/*
 * Units lie 64 KiB apart, unless a build spaces them further by
 * PERCPUREF_UNIT_COLOUR bytes (a multiple of 64 below 64 KiB), to measure
 * what a slot's copies cost where they share cache sets: 64 KiB apart,
 * they all fall in one set of a cache indexed by the low 12 address bits
 * (docs/lent-16core.md, "A fourth session"), and an init's zeroing or a
 * fold of a slot fills it.  With -DPERCPUREF_UNIT_COLOUR=64 CPU n's copy
 * lies n * (64 KiB + 64) bytes on, and the x86-64 sequence multiplies
 * where it shifted.  A program must be built with the library's value,
 * spelt the same (CMake's targets and the .pc file pass it as a decimal):
 * the variables the sequences read carry it in their names
 * (percpuref_this_cpu_params_c64), so a program built with another value,
 * or none, fails to link (tests/compile/check_unit_colour.sh).
 */
#ifndef PERCPUREF_UNIT_COLOUR
#define PERCPUREF_UNIT_COLOUR 0
#endif
#if PERCPUREF_UNIT_COLOUR < 0 || PERCPUREF_UNIT_COLOUR % 64 || PERCPUREF_UNIT_COLOUR >= 65536
#error "PERCPUREF_UNIT_COLOUR: a multiple of 64, 0 to 65472"
#endif
#define PERCPUREF_UNIT_STRIDE ((1UL << PERCPUREF_UNIT_SHIFT) + PERCPUREF_UNIT_COLOUR)
/* (64) would pass the test above and break the names' pasting below with
 * a message about tokens: the classic probe, 1 for a parenthesised value,
 * and then no pasting. */
#define PERCPUREF_SECOND_(first, second, ...) second
#define PERCPUREF_SECOND(...) PERCPUREF_SECOND_(__VA_ARGS__)
#define PERCPUREF_PAREN_PROBE(...) ~, 1,
#define PERCPUREF_PARENTHESISED(x) PERCPUREF_SECOND(PERCPUREF_PAREN_PROBE x, 0, ~)
#if PERCPUREF_PARENTHESISED(PERCPUREF_UNIT_COLOUR)
#error "PERCPUREF_UNIT_COLOUR: spell it as a plain decimal, as the library was built (64, not (64))"
#endif
#if PERCPUREF_UNIT_COLOUR && !PERCPUREF_PARENTHESISED(PERCPUREF_UNIT_COLOUR)
#define PERCPUREF_COLOURED_(name, colour) name##_c##colour
#define PERCPUREF_COLOURED(name, colour) PERCPUREF_COLOURED_(name, colour)
#define percpuref_this_cpu_params \
	PERCPUREF_COLOURED(percpuref_this_cpu_params, PERCPUREF_UNIT_COLOUR)
#define percpuref_nr_cpu_units PERCPUREF_COLOURED(percpuref_nr_cpu_units, PERCPUREF_UNIT_COLOUR)
#define PERCPUREF_X86_64_UNIT_OFFSET "imulq %[stride], %%rax, %%rax\n\t"
#define PERCPUREF_ARM64_UNIT_OFFSET "madd x16, x17, %[stride], x16\n\t"
#define PERCPUREF_ARM64_STRIDE_OPERAND , [stride] "r"(PERCPUREF_UNIT_STRIDE)
#else
#define PERCPUREF_X86_64_UNIT_OFFSET "shlq %[shift], %%rax\n\t"
#define PERCPUREF_ARM64_UNIT_OFFSET "add x16, x16, x17, lsl %[shift]\n\t"
#define PERCPUREF_ARM64_STRIDE_OPERAND
#endif
#undef PERCPUREF_PARENTHESISED
#undef PERCPUREF_PAREN_PROBE
#undef PERCPUREF_SECOND
#undef PERCPUREF_SECOND_
/* Low bits of a mode word that send callers off the per-CPU path. */
#define PERCPUREF_MODE_FLAGS 3UL

PERCPUREF_BEGIN_DECLS

/*
 * The kernel's struct rseq, version 0 (include/uapi/linux/rseq.h): 32 bytes,
 * 32-byte aligned.  cpu_id is the CPU the thread runs on while registered,
 * or negative (-1 not registered, -2 registration failed).  rseq_cs points to
 * the descriptor of the sequence in progress; the kernel clears it.
 */
struct percpuref_rseq_area {
	uint32_t cpu_id_start;
	uint32_t cpu_id;
	uint64_t rseq_cs;
	uint32_t flags;
	uint32_t reserved[3];
} __attribute__((aligned(32)));

enum percpuref_this_cpu_result {
	PERCPUREF_THIS_CPU_DONE,	/* added to this CPU's counter */
	PERCPUREF_THIS_CPU_FLAGGED,	/* mode word has flags: nothing added */
	PERCPUREF_THIS_CPU_NO_RSEQ,	/* no usable rseq: nothing added */
};

/*
 * Offset of every thread's rseq area from its thread pointer, or 0 when this
 * process does not use the rseq fast path.  Set by the library before the
 * first per-CPU counter exists, so a thread that can reach a counter reads
 * the final value; relaxed.  Cleared in a fork child that cannot use it,
 * and where a fence can neither call membarrier nor move between CPUs
 * (runtime.c: the fast path is switched off).
 */
extern PERCPUREF_API ptrdiff_t percpuref_rseq_offset;
/*
 * Per-CPU units allocated per counter, set before percpuref_rseq_offset.
 * The rseq sequence commits only for cpu_id below it, so a CPU count that
 * was wrong (sysfs hidden) can never send an add past the allocation.
 */
extern PERCPUREF_API unsigned int percpuref_nr_cpu_units;

/*
 * What the x86-64 sequence needs from the two variables above, in one word,
 * so that it costs one load: the low 32 bits are the signed offset from the
 * thread pointer of an rseq area every thread may write (percpuref_rseq_offset,
 * or the library's own area, registered or not, when the process does not
 * use rseq), the high 32 bits the number of units the sequence may commit
 * to (percpuref_nr_cpu_units, or 0 while the rseq fast path is off, which
 * sends every call to the slow path having written at most the rseq_cs
 * field of that own area).  0 until the runtime is set up, and never again
 * after: percpuref_this_cpu_add() tests for it before writing anything,
 * percpuref_this_cpu_add_after_setup() relies on its caller's mode word
 * having been written after set-up.  On the AMD guest the pair is bound by
 * loads, not by instructions (docs/percpu_ref.md, "Where the time goes"):
 * this word saved two of the six loads of each get and put (since 0.4.30
 * its units are read again inside the critical section: the sequence
 * below).  Written with the two variables (runtime.c): relaxed before the
 * first counter exists, seq_cst when a running process turns the fast path
 * off.
 */
extern PERCPUREF_API uint64_t percpuref_this_cpu_params;

#if PERCPUREF_HAVE_RSEQ
/*
 * percpuref_thread_pointer - this thread's thread pointer, from which every
 * thread's rseq area lies at the same offset.  On x86-64 the word at %fs:0,
 * which the x86-64 TLS ABI makes point to itself (it is what gcc emits for
 * __builtin_thread_pointer()): clang up to 13 accepts that builtin there and
 * then stops in its back end ("Cannot select: intrinsic
 * %llvm.thread.pointer"; LLVM issue 85157), so the header and the library
 * could not be built by it.  Not volatile: within a thread the value never
 * changes, and the compiler may keep it.
 */
static inline void *percpuref_thread_pointer(void)
{
#if defined(__x86_64__)
	void *self;

	__asm__("movq %%fs:0, %0" : "=r"(self));
	return self;
#else
	return __builtin_thread_pointer();
#endif
}
#endif

/*
 * percpuref_this_rseq_area - this thread's rseq area (glibc's or the
 * library's own; registered or not yet: see cpu_id), or NULL when the
 * process does not use the rseq fast path (always, where this header
 * compiles none: the thread pointer is not read there).
 */
static inline struct percpuref_rseq_area *percpuref_this_rseq_area(void)
{
#if PERCPUREF_HAVE_RSEQ
	/* Relaxed: set before the first counter exists, which whoever handed
	 * this thread a counter ordered first; cleared in a fork child with
	 * one thread, or at a switch-off, which gives the sections that
	 * missed it time to end, not an order (runtime.c,
	 * switch_fast_path_off()). */
	ptrdiff_t offset = __atomic_load_n(&percpuref_rseq_offset, __ATOMIC_RELAXED);

	if (percpuref_unlikely(offset == 0))
		return NULL;
	/* Through void *: the offset is the area's, which is aligned (a cast
	 * from char * trips -Wcast-align in users' builds). */
	return (struct percpuref_rseq_area *)(void *)((char *)percpuref_thread_pointer() + offset);
#else
	return NULL;
#endif
}

#if PERCPUREF_HAVE_RSEQ && defined(__x86_64__)
/*
 * The end of an x86-64 sequence: label 2 after the commit, then the abort
 * handler (label 4) in its own section, preceded by the signature (ud1
 * 0x53053053(%rip),%edi), leaving through the C label "restart".
 */
#define PERCPUREF_X86_64_RSEQ_COMMIT_AND_ABORT				\
	"2:\n\t"							\
	".pushsection __rseq_failure, \"ax\"\n\t"			\
	".byte 0x0f, 0xb9, 0x3d\n\t"					\
	".long 0x53053053\n\t"						\
	"4:\n\t"							\
	"jmp %l[restart]\n\t"						\
	".popsection\n\t"

/*
 * The x86-64 sequence: five loads (the area's offset from the params word,
 * cpu_id, the params word's units, the mode word, the counter) and two
 * stores (rseq_cs, the counter).  The area is addressed %fs-relative, so
 * the thread pointer is not loaded; a delta known at compile time is an
 * immediate (a put's too: percpu_ref.h, PERCPU_REF_NET_BITS).  The units
 * are read again inside the critical section, after label 1: a thread
 * stopped between the first read and label 1 (a preemption or a signal
 * there aborts nothing) comes back with the old word, and a switch-off of
 * the fast path (runtime.c), which gives the sections in flight 10 ms,
 * covers only sections that a stop restarts (up to 0.4.29 the units were
 * the first read's, and such a thread committed whenever it ran again:
 * review 162, tests/model/switchoff.pml).  The commit addresses the
 * counter through one register: addressed (base, index) it made a get+put
 * cost 4.9-5.4 ns on a 16-core Intel Xeon, 2.9 ns through one register,
 * and the same either way on AMD (docs/lent-16core.md).  @load_offset:
 * the area's offset into %rcx.  After set-up the word's low half alone
 * (never 0, runtime.c); before, the whole word, leaving for no_unit when
 * it allows no unit (shrq sets ZF), before the rseq_cs store: until the
 * runtime is set up the word is 0, and %fs:8 is then glibc's DTV pointer
 * (one load of the word: halves read apart could pair an offset of 0 with
 * a unit count published meanwhile).  Used inside
 * __percpuref_this_cpu_add() only.
 */
#define PERCPUREF_X86_64_THIS_CPU_ADD(load_offset)			\
		__asm__ __volatile__ goto(				\
			PERCPUREF_RSEQ_CS_DESCRIPTOR			\
			load_offset					\
			"leaq 3b(%%rip), %%rax\n\t"			\
			"movq %%rax, %%fs:%c[rseq_cs](%%rcx)\n\t"	\
			"1:\n\t"					\
			"movl %%fs:%c[cpu_id](%%rcx), %%eax\n\t"	\
			"cmpl %[units], %%eax\n\t"			\
			"jae %l[no_unit]\n\t"				\
			"movq %[word], %%rcx\n\t"			\
			"testq %[flags], %%rcx\n\t"			\
			"jnz %l[flagged]\n\t"				\
			PERCPUREF_X86_64_UNIT_OFFSET			\
			"addq %%rcx, %%rax\n\t"			\
			"addq %[delta], (%%rax)\n\t"			\
			PERCPUREF_X86_64_RSEQ_COMMIT_AND_ABORT		\
			:						\
			: [params] "m"(percpuref_this_cpu_params),	\
			  [units] "m"(((const uint32_t *)&percpuref_this_cpu_params)[1]), \
			  [rseq_cs] "i"(offsetof(struct percpuref_rseq_area, rseq_cs)), \
			  [cpu_id] "i"(offsetof(struct percpuref_rseq_area, cpu_id)), \
			  [word] "m"(*mode_word), [delta] "er"(delta),	\
			  [flags] "i"(PERCPUREF_MODE_FLAGS),		\
			  [shift] "i"(PERCPUREF_UNIT_SHIFT),		\
			  [stride] "i"(PERCPUREF_UNIT_STRIDE)		\
			: "memory", "cc", "rax", "rcx", "rdx"		\
			: flagged, restart, no_unit)
#endif

/*
 * percpuref_this_cpu_add - add @delta to this CPU's copy of the counter whose
 * mode word is *@mode_word, unless the word has PERCPUREF_MODE_FLAGS bits set.
 * The word is read inside the restartable sequence, so a concurrent switch
 * fenced by percpuref_fence_readers() either sees this add or makes this call
 * re-read the word.  Any thread, any context that may run user code; may be
 * the process's first call into the library.
 *
 * percpuref_this_cpu_add_after_setup - the same, for a mode word that the
 * library wrote (percpu_ref_init() and every later change): the runtime was
 * set up before it was written, and whoever hands the object to this thread
 * orders that before this call.  On x86-64 it skips the test of the params
 * word for 0 ("not set up yet"), a test and branch that cost about 0.1 ns
 * of a 1.43 ns get+put (docs/percpu_ref.md, "Where the time goes").
 */
static inline __attribute__((always_inline)) enum percpuref_this_cpu_result
__percpuref_this_cpu_add(const uintptr_t *mode_word, unsigned long delta, bool after_setup)
{
#if PERCPUREF_HAVE_RSEQ
	/*
	 * A thread not (yet) registered reads cpu_id -1 (or -2), which the
	 * unsigned bound check in the sequence sends to no_unit like any CPU
	 * without a unit: the slow path may register it.  No separate test.
	 */
	for (;;) {
#if !defined(__x86_64__)
		/* Read again at each restart, as x86-64 reloads its params: a
		 * section aborted around a switch-off of the fast path
		 * (runtime.c) must not commit after it. */
		struct percpuref_rseq_area *rs = percpuref_this_rseq_area();

		(void)after_setup;	/* rs is tested either way */
		if (percpuref_unlikely(!rs))
			return PERCPUREF_THIS_CPU_NO_RSEQ;
#endif
		/*
		 * Descriptor 3: {version, flags, start 1, length 2-1, abort 4}.
		 * The abort handler is preceded by the registered signature and
		 * leaves the sequence through the C label "restart", which
		 * re-arms it.
		 */
#if defined(__x86_64__)
		if (after_setup)
			PERCPUREF_X86_64_THIS_CPU_ADD("movslq %[params], %%rcx\n\t");
		else
			PERCPUREF_X86_64_THIS_CPU_ADD("movq %[params], %%rdx\n\t"
						      "movslq %%edx, %%rcx\n\t"
						      "shrq $32, %%rdx\n\t"
						      "jz %l[no_unit]\n\t");
#else
		/*
		 * aarch64, after librseq's rseq-arm64.h.  The counter's address
		 * depends on the mode word just loaded, so the add cannot see
		 * counters older than the word (the release store that clears
		 * ATOMIC zeroed them first): address dependency, no barrier.
		 * The commit is the str.  The offset is read again after
		 * label 1, as x86-64 reads its units: a thread stopped before
		 * label 1 aborts nothing, and must not commit after a
		 * switch-off of the fast path that it slept through.
		 */
		__asm__ __volatile__ goto(
			PERCPUREF_RSEQ_CS_DESCRIPTOR
			"adrp x16, 3b\n\t"
			"add x16, x16, :lo12:3b\n\t"
			"str x16, [%[rs], #8]\n\t"
			"1:\n\t"
			"ldr x17, [%[offset]]\n\t"
			"cbz x17, %l[no_unit]\n\t"
			"ldr w17, [%[rs], #4]\n\t"
			"cmp w17, %w[units]\n\t"
			"b.hs %l[no_unit]\n\t"
			"ldr x16, [%[word]]\n\t"
			"tst x16, %[flags]\n\t"
			"b.ne %l[flagged]\n\t"
			PERCPUREF_ARM64_UNIT_OFFSET
			"ldr x17, [x16]\n\t"
			"add x17, x17, %[delta]\n\t"
			"str x17, [x16]\n\t"
			"2:\n\t"
			".pushsection __rseq_failure, \"ax\"\n\t"
			".inst 0xd428bc00\n\t"
			"4:\n\t"
			"b %l[restart]\n\t"
			".popsection\n\t"
			:
			: [rs] "r"(rs), [word] "r"(mode_word), [delta] "r"(delta),
			  [units] "r"(percpuref_nr_cpu_units),
			  [offset] "r"(&percpuref_rseq_offset),
			  [flags] "i"(PERCPUREF_MODE_FLAGS),
			  [shift] "i"(PERCPUREF_UNIT_SHIFT)
			  PERCPUREF_ARM64_STRIDE_OPERAND
			: "memory", "cc", "x16", "x17"
			: flagged, restart, no_unit);
#endif
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
	(void)after_setup;
	return PERCPUREF_THIS_CPU_NO_RSEQ;
#endif
}

static inline enum percpuref_this_cpu_result
percpuref_this_cpu_add(const uintptr_t *mode_word, unsigned long delta)
{
	return __percpuref_this_cpu_add(mode_word, delta, false);
}

static inline enum percpuref_this_cpu_result
percpuref_this_cpu_add_after_setup(const uintptr_t *mode_word, unsigned long delta)
{
	return __percpuref_this_cpu_add(mode_word, delta, true);
}

PERCPUREF_END_DECLS

#endif
