/* SPDX-License-Identifier: MIT */
/*
 * anatomy.c - where the time of a per-CPU get+put goes: the x86-64 rseq
 * sequence built up one instruction group at a time, from the unprotected
 * per-CPU add (a lower bound, not a counter) to the library's sequence before
 * and after the change that made it cheaper.
 *
 *   percpuref-anatomy [--pairs N (1..1000000000)] [--rounds R (1..100)]
 *
 * Each variant runs N get+put pairs on one real percpu_ref counter (its
 * mode word, its per-CPU units), pinned to the first usable CPU; the time is
 * the thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so a preemption by another
 * job on a shared machine does not count; the best of R interleaved rounds
 * is printed, with each variant's loads and stores per pair.  Every variant
 * that has a restartable sequence has a real descriptor and restarts on
 * abort, as the library's does; the partial ones (no rseq_cs store) are not
 * exact and exist only to be timed.  Teardown checks that the counter went
 * back to one reference, so a sequence that lost or doubled an add fails the
 * run.  x86-64 only: elsewhere it says so and exits 0.
 *
 * The findings (docs/percpu_ref.md): on the AMD guest the pair is bound by
 * memory operations, not by instructions (the old sequence made six loads
 * and two stores per add; the unprotected add makes two loads and one
 * store); on a 16-core Intel Xeon by the form of the add's address, which
 * the two unprotected rows compare (docs/lent-16core.md); on a 2-vCPU
 * Intel Xeon (Emerald Rapids) guest by whether the add's delta is an
 * immediate, which the last library rows compare (percpu_ref.h,
 * PERCPU_REF_NET_BITS).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <percpuref/percpu_ref.h>

#if defined(__x86_64__)

static struct percpu_ref ref;
static long pairs = 20000000;

static bool released;

static void release(struct percpu_ref *r)
{
	(void)r;
	released = true;
}

static double thread_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/*
 * One add of @delta through @body, restarted on abort; a flagged or
 * out-of-range exit is a failure (the counter is per-CPU and the CPU has a
 * unit).  The operands every body may use: the params word, the old
 * variables, the mode word, the delta, and the unit step's (CPU n's copy
 * is n units on: PERCPUREF_X86_64_UNIT_OFFSET, this_cpu.h).
 */
#define ADD(body, delta_value)						\
	do {								\
		__label__ restart;					\
restart:								\
		__asm__ __volatile__ goto(body				\
			:						\
			: [params] "m"(percpuref_this_cpu_params),	\
			  [off] "m"(percpuref_rseq_offset),		\
			  [units] "m"(percpuref_nr_cpu_units),		\
			  [word] "m"(ref.percpu_count_ptr),		\
			  [delta] "er"((unsigned long)(delta_value)),	\
			  [shift] "i"(PERCPUREF_UNIT_SHIFT),		\
			  [stride] "i"(PERCPUREF_UNIT_STRIDE)		\
			: "memory", "cc", "rax", "rcx", "rdx"		\
			: restart, failed);				\
	} while (0)

#define PAIRS(body)							\
	for (long i = 0; i < pairs; i++) {				\
		ADD(body, 1);						\
		ADD(body, PERCPU_REF_PUT_DELTA);			\
	}								\
	return;								\
failed:									\
	fprintf(stderr, "anatomy: the sequence left the per-CPU path\n"); \
	exit(1)

/*
 * Unprotected: cpu_id from the thread's area, add; area and base in
 * registers.  @add adds its operand to the counter of the CPU whose offset
 * is in %rax: through one register (the lower bound), or addressed (base,
 * index) as every sequence up to 0.3.5 was, a form that alone costs
 * several times the pair on some cores.
 */
#define ONE_REGISTER(delta) "addq %[cpu0], %%rax\n\taddq " delta ", (%%rax)\n\t"
#define INDEXED(delta) "addq " delta ", (%[cpu0], %%rax)\n\t"
#define UNPROTECTED(name, add)						\
static void name(void)							\
{									\
	const volatile struct percpuref_rseq_area *rs = percpuref_this_rseq_area(); \
	uintptr_t cpu0 = ref.percpu_count_ptr;				\
									\
	for (long i = 0; i < pairs; i++) {				\
		__asm__ __volatile__("movl %c[cpu_id](%[rs]), %%eax\n\t" \
				     PERCPUREF_X86_64_UNIT_OFFSET add("$1")	\
				     "movl %c[cpu_id](%[rs]), %%eax\n\t" \
				     PERCPUREF_X86_64_UNIT_OFFSET add("%[put]") \
				     :					\
				     : [rs] "r"(rs), [cpu0] "r"(cpu0),	\
				       [put] "er"(PERCPU_REF_PUT_DELTA),	\
				       [cpu_id] "i"(offsetof(struct percpuref_rseq_area, cpu_id)), \
				       [shift] "i"(PERCPUREF_UNIT_SHIFT),	\
				       [stride] "i"(PERCPUREF_UNIT_STRIDE)	\
				     : "memory", "cc", "rax");		\
	}								\
}
UNPROTECTED(unprotected, ONE_REGISTER)
UNPROTECTED(unprotected_indexed, INDEXED)

/* + the mode word loaded per add (the base of the counter). */
#define MODE_WORD							\
	"movq %[word], %%rcx\n\t" PERCPUREF_X86_64_UNIT_OFFSET		\
	"addq %[delta], (%%rcx, %%rax)\n\t"
static void with_mode_word(void)
{
	PAIRS("movq %[off], %%rdx\n\tadd %%fs:0, %%rdx\n\tmovl 4(%%rdx), %%eax\n\t" MODE_WORD);
}

/* + the tests the old sequence made: offset not zero, no mode flag. */
#define OLD_TESTS_BODY							\
	"movq %[off], %%rdx\n\ttestq %%rdx, %%rdx\n\tje %l[failed]\n\t"	\
	"add %%fs:0, %%rdx\n\tmovl 4(%%rdx), %%eax\n\t"			\
	"movq %[word], %%rcx\n\ttestq $3, %%rcx\n\tjnz %l[failed]\n\t"	\
	PERCPUREF_X86_64_UNIT_OFFSET "addq %[delta], (%%rcx, %%rax)\n\t"
static void with_tests(void)
{
	PAIRS(OLD_TESTS_BODY);
}

/* + the bound check against percpuref_nr_cpu_units, a load. */
#define OLD_BOUND_BODY							\
	"movq %[off], %%rdx\n\ttestq %%rdx, %%rdx\n\tje %l[failed]\n\t"	\
	"add %%fs:0, %%rdx\n\tmovl 4(%%rdx), %%eax\n\t"			\
	"cmpl %[units], %%eax\n\tjae %l[failed]\n\t"			\
	"movq %[word], %%rcx\n\ttestq $3, %%rcx\n\tjnz %l[failed]\n\t"	\
	PERCPUREF_X86_64_UNIT_OFFSET "addq %[delta], (%%rcx, %%rax)\n\t"
static void with_bound(void)
{
	PAIRS(OLD_BOUND_BODY);
}

/* + the rseq_cs store: the sequence as it was (exact). */
#define OLD_BODY							\
	PERCPUREF_RSEQ_CS_DESCRIPTOR					\
	"movq %[off], %%rdx\n\ttestq %%rdx, %%rdx\n\tje %l[failed]\n\t"	\
	"add %%fs:0, %%rdx\n\t"						\
	"leaq 3b(%%rip), %%rax\n\tmovq %%rax, 8(%%rdx)\n\t"		\
	"1:\n\t"							\
	"movl 4(%%rdx), %%eax\n\tcmpl %[units], %%eax\n\tjae %l[failed]\n\t" \
	"movq %[word], %%rcx\n\ttestq $3, %%rcx\n\tjnz %l[failed]\n\t"	\
	PERCPUREF_X86_64_UNIT_OFFSET "addq %[delta], (%%rcx, %%rax)\n\t"		\
	PERCPUREF_X86_64_RSEQ_COMMIT_AND_ABORT
static void old_sequence(void)
{
	PAIRS(OLD_BODY);
}

/* The old sequence with the area addressed %fs-relative (no tp load). */
#define FS_BODY								\
	PERCPUREF_RSEQ_CS_DESCRIPTOR					\
	"movq %[off], %%rdx\n\ttestq %%rdx, %%rdx\n\tje %l[failed]\n\t"	\
	"leaq 3b(%%rip), %%rax\n\tmovq %%rax, %%fs:8(%%rdx)\n\t"	\
	"1:\n\t"							\
	"movl %%fs:4(%%rdx), %%eax\n\tcmpl %[units], %%eax\n\tjae %l[failed]\n\t" \
	"movq %[word], %%rcx\n\ttestq $3, %%rcx\n\tjnz %l[failed]\n\t"	\
	PERCPUREF_X86_64_UNIT_OFFSET "addq %[delta], (%%rcx, %%rax)\n\t"		\
	PERCPUREF_X86_64_RSEQ_COMMIT_AND_ABORT
static void fs_relative(void)
{
	PAIRS(FS_BODY);
}

/* The library's sequence in 0.3.5: as now, the commit indexed. */
#define INDEXED_BODY							\
	PERCPUREF_RSEQ_CS_DESCRIPTOR					\
	"movq %[params], %%rdx\n\tmovslq %%edx, %%rcx\n\tshrq $32, %%rdx\n\t" \
	"leaq 3b(%%rip), %%rax\n\tmovq %%rax, %%fs:8(%%rcx)\n\t"	\
	"1:\n\t"							\
	"movl %%fs:4(%%rcx), %%eax\n\tcmpl %%edx, %%eax\n\tjae %l[failed]\n\t" \
	"movq %[word], %%rcx\n\ttestq $3, %%rcx\n\tjnz %l[failed]\n\t"	\
	PERCPUREF_X86_64_UNIT_OFFSET "addq %[delta], (%%rcx, %%rax)\n\t"		\
	PERCPUREF_X86_64_RSEQ_COMMIT_AND_ABORT
static void indexed_commit(void)
{
	PAIRS(INDEXED_BODY);
}

/* The library's sequence now (this_cpu.h), through the API. */
static void library(void)
{
	for (long i = 0; i < pairs; i++) {
		percpu_ref_get(&ref);
		percpu_ref_put(&ref);
	}
}

/* The library's sequence with the put's delta in a register, as it was
 * up to 0.3.16 (2^32 - 1 fits no immediate): put_many of a count the
 * compiler cannot know, which also compares it with the slice limit (an
 * upper bound of what the register costs). */
static void library_put_in_register(void)
{
	static volatile unsigned long one = 1;

	for (long i = 0; i < pairs; i++) {
		percpu_ref_get(&ref);
		percpu_ref_put_many(&ref, one);
	}
}

/* The new sequence without the bound check: NOT exact on a machine that
 * reports fewer CPUs than it has; shows what the check costs. */
#define NO_BOUND_BODY							\
	PERCPUREF_RSEQ_CS_DESCRIPTOR					\
	"movq %[params], %%rdx\n\tmovslq %%edx, %%rdx\n\t"		\
	"leaq 3b(%%rip), %%rax\n\tmovq %%rax, %%fs:8(%%rdx)\n\t"	\
	"1:\n\t"							\
	"movl %%fs:4(%%rdx), %%eax\n\t"					\
	"movq %[word], %%rcx\n\ttestq $3, %%rcx\n\tjnz %l[failed]\n\t"	\
	PERCPUREF_X86_64_UNIT_OFFSET "addq %%rcx, %%rax\n\taddq %[delta], (%%rax)\n\t" \
	PERCPUREF_X86_64_RSEQ_COMMIT_AND_ABORT
static void no_bound(void)
{
	PAIRS(NO_BOUND_BODY);
}

static const struct variant {
	const char *name;
	void (*run)(void);
	int loads, stores;	/* per pair */
} variants[] = {
	{ "unprotected: cpu_id, add (lower bound)", unprotected, 4, 2 },
	{ "unprotected, add indexed (base, cpu)", unprotected_indexed, 4, 2 },
	{ "+ offset, thread pointer, mode word", with_mode_word, 10, 2 },
	{ "+ offset and mode-flag tests", with_tests, 10, 2 },
	{ "+ bound check (a load)", with_bound, 12, 2 },
	{ "+ rseq_cs store = the old sequence", old_sequence, 12, 4 },
	{ "old, area %fs-relative", fs_relative, 10, 4 },
	{ "0.3.5: params word, %fs-relative", indexed_commit, 8, 4 },
	{ "library now: add through one register", library, 8, 4 },
	{ "library now, put delta in a register", library_put_in_register, 9, 4 },
	{ "library now without the bound (inexact)", no_bound, 8, 4 },
};
#define NR_VARIANTS (sizeof(variants) / sizeof(variants[0]))

/* The row of @run in variants[] (the gap is computed from three rows). */
static size_t row_of(void (*run)(void))
{
	for (size_t v = 0; v < NR_VARIANTS; v++)
		if (variants[v].run == run)
			return v;
	abort();	/* a row the gap needs was removed from variants[] */
}

/* @s, all of it, as a decimal number in 1..@max. */
static long parse_positive(const char *flag, const char *s, long max)
{
	char *end = (char *)s;
	long v = 0;

	errno = 0;
	if (isdigit((unsigned char)*s))
		v = strtol(s, &end, 10);
	if (end == s || *end != '\0' || errno || v < 1 || v > max) {
		fprintf(stderr, "percpuref-anatomy: %s: want a number in 1..%ld, got '%s'\n",
			flag, max, s);
		exit(2);
	}
	return v;
}

#define USAGE                                                                              \
	"usage: percpuref-anatomy [--pairs N (1..1000000000, default 20000000)] "           \
	"[--rounds R (1..100, default 7)]\n"

/* 0 once standard output took the results, else 1 (a full disk, a
 * closed pipe), saying so. */
static int results_written(void)
{
	if (!fflush(stdout) && !ferror(stdout))
		return 0;
	fprintf(stderr, "anatomy: standard output: cannot write the results\n");
	return 1;
}

int main(int argc, char **argv)
{
	double best[NR_VARIANTS];
	long rounds = 7;
	cpu_set_t cpus, one;
	int cpu;

	bool pairs_given = false, rounds_given = false;

	signal(SIGPIPE, SIG_IGN);	/* a closed pipe: exit 1, said */
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("%s", USAGE);
			return results_written();
		} else if (!strcmp(argv[i], "--pairs") && i + 1 < argc && !pairs_given) {
			pairs = parse_positive("--pairs", argv[++i], 1000000000L);
			pairs_given = true;
		} else if (!strcmp(argv[i], "--rounds") && i + 1 < argc && !rounds_given) {
			rounds = parse_positive("--rounds", argv[++i], 100);
			rounds_given = true;
		} else {
			/* Unknown, or a flag of ours given twice, or else missing
			 * its value (the only other way here). */
			bool pairs_flag = !strcmp(argv[i], "--pairs");
			bool ours = pairs_flag || !strcmp(argv[i], "--rounds");
			bool twice = pairs_flag ? pairs_given : rounds_given;

			fprintf(stderr, "percpuref-anatomy: bad argument '%s'%s\n%s", argv[i],
				!ours ? "" : twice ? " (given twice)" : " (no value)", USAGE);
			return 2;
		}
	}
	if (sched_getaffinity(0, sizeof(cpus), &cpus))
		return perror("sched_getaffinity"), 1;
	for (cpu = 0; cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &cpus); cpu++)
		;
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	if (sched_setaffinity(0, sizeof(one), &one))
		return perror("sched_setaffinity"), 1;
	if (percpu_ref_init(&ref, release, 0))
		return fprintf(stderr, "anatomy: percpu_ref_init failed\n"), 1;
	/* The first get registers the thread's area if the library owns it. */
	percpu_ref_get(&ref);
	percpu_ref_put(&ref);
	if (strncmp(percpuref_fast_path(), "rseq", 4) || !percpuref_this_rseq_area()) {
		printf("fast path %s: no rseq sequence to take apart\n", percpuref_fast_path());
		percpu_ref_exit(&ref);
		return results_written();
	}
	for (size_t v = 0; v < NR_VARIANTS; v++)
		best[v] = 1e300;
	for (long r = 0; r < rounds; r++) {
		for (size_t v = 0; v < NR_VARIANTS; v++) {
			double t0 = thread_cpu_ns();

			variants[v].run();
			t0 = (thread_cpu_ns() - t0) / (double)pairs;
			if (t0 < best[v])
				best[v] = t0;
		}
	}
	printf("fast path %s, CPU %d; best of %ld rounds of %ld pairs, thread CPU time\n",
	       percpuref_fast_path(), cpu, rounds, pairs);
	printf("%-42s %8s %6s %7s\n", "variant", "ns/pair", "loads", "stores");
	for (size_t v = 0; v < NR_VARIANTS; v++)
		printf("%-42s %8.2f %6d %7d\n", variants[v].name, best[v], variants[v].loads,
		       variants[v].stores);
	/* Too few pairs to time (--pairs 1): the old sequence measured no
	 * slower than the lower bound, and the ratio would be noise or 0/0. */
	size_t lower = row_of(unprotected), old = row_of(old_sequence), now = row_of(library);

	if (best[old] > best[lower])
		printf("gap closed: %.0f%% of (old - unprotected)\n",
		       100.0 * (best[old] - best[now]) / (best[old] - best[lower]));
	else
		printf("gap closed: not measured (old %.2f <= unprotected %.2f ns: more "
		       "--pairs)\n", best[old], best[lower]);
	/* Every variant returned what it took: the owner's reference is the
	 * only one left, so the kill must release now. */
	if (released)
		return fprintf(stderr, "anatomy: released during the runs\n"), 1;
	percpu_ref_kill(&ref);
	percpu_ref_barrier();
	if (!released)
		return fprintf(stderr, "anatomy: a variant lost or doubled an add\n"), 1;
	percpu_ref_exit(&ref);
	return results_written();
}

#else

int main(void)
{
	printf("percpuref-anatomy: x86-64 only\n");
	return 0;
}

#endif
