/* SPDX-License-Identifier: MIT */
/*
 * test_unbacked_units.c - a unit of a CPU that no ref's user ran on costs
 * no memory.  The allocator maps chunks without their pages, and nothing
 * writes a zero over a zero (the fold, an exit's clear: internal.h), so
 * after refs lived only on CPU 0 (init, gets and puts, then an exit while
 * per-CPU, or a kill and its fold on the callback thread), no page of any
 * other unit that holds one of their copies is backed: /proc/self/pagemap
 * shows each such page absent, or present but not exclusively mapped (the
 * shared zero page a read maps).  Unit 0's pages, which the counts and the
 * free links wrote, read backed: the check can see a backed page.  Up to
 * 0.4.11 every fold and exit stored a zero in every unit, backing the
 * pages of possible CPUs the machine may not even have (4,096 refs shown
 * sixteen possible CPUs: 576 kB resident, against 36 kB now).
 *
 * Skipped where it cannot tell: one unit; CPU 0 not allowed; the fallback
 * path (its units are threads, not CPUs); no pagemap; a chunk that
 * transparent huge pages may back whole (2 MiB or more with the setting
 * "always").
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

#define NR_REFS 4096
#define PAGEMAP_PRESENT (UINT64_C(1) << 63)
#define PAGEMAP_EXCLUSIVE (UINT64_C(1) << 56)

static struct percpu_ref refs[NR_REFS];
static uintptr_t counters[NR_REFS];
static unsigned long releases;
static int pagemap = -1;

static void count_release(struct percpu_ref *ref)
{
	(void)ref;
	releases++;
}

/* The counter's CPU 0 address: the mode word without its flags. */
static uintptr_t counter_of_ref(struct percpu_ref *ref)
{
	return ref->percpu_count_ptr & ~(uintptr_t)__PERCPU_REF_ATOMIC_DEAD;
}

/* Is the page at @addr backed by memory of its own?  -1: unreadable. */
static int page_backed(uintptr_t addr)
{
	long page = sysconf(_SC_PAGESIZE);
	uint64_t entry;

	if (pread(pagemap, &entry, sizeof(entry), (off_t)(addr / (uintptr_t)page) * 8) !=
	    (ssize_t)sizeof(entry))
		return -1;
	return (entry & PAGEMAP_PRESENT) && (entry & PAGEMAP_EXCLUSIVE);
}

/* The recorded counters' copies on units @from to @to - 1 whose pages
 * are backed. */
static unsigned long copies_on_backed_pages(unsigned int from, unsigned int to)
{
	unsigned long backed = 0;
	unsigned int unit;
	int i;

	for (unit = from; unit < to; unit++)
		for (i = 0; i < NR_REFS; i++)
			if (page_backed((uintptr_t)percpuref_counter_on(counters[i], unit)) == 1)
				backed++;
	return backed;
}

/* Huge pages may back a chunk whole: "always" and a chunk of 2 MiB. */
static bool huge_pages_may_back_chunks(void)
{
	char setting[128] = "";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");

	if (f) {
		if (!fgets(setting, sizeof(setting), f))
			setting[0] = '\0';
		fclose(f);
	}
	return strstr(setting, "[always]") &&
	       (size_t)percpuref_nr_units() * PERCPUREF_UNIT_STRIDE >= (size_t)2 << 20;
}

/* NR_REFS lives on this CPU: init, gets and puts, then a kill (its fold
 * on the callback thread, then the exit of an atomic ref) or an exit while
 * per-CPU.  Each counter recorded. */
static void live(bool kill)
{
	int i, j;

	for (i = 0; i < NR_REFS; i++) {
		if (percpu_ref_init(&refs[i], count_release, 0)) {
			ok(0, "percpu_ref_init of ref %d", i);
			exit(done_testing());
		}
		counters[i] = counter_of_ref(&refs[i]);
		for (j = 0; j < 4; j++) {
			percpu_ref_get(&refs[i]);
			percpu_ref_put(&refs[i]);
		}
		if (kill)
			percpu_ref_kill(&refs[i]);
	}
	if (kill)
		percpu_ref_barrier();
	for (i = 0; i < NR_REFS; i++)
		percpu_ref_exit(&refs[i]);
}

int main(void)
{
	unsigned int units = percpuref_nr_units();
	cpu_set_t cpu0;

	const char *cannot = NULL;

	CPU_ZERO(&cpu0);
	CPU_SET(0, &cpu0);
	if (units < 2)
		cannot = "one unit: no other unit to leave unbacked";
	else if (!strcmp(percpuref_fast_path(), "fallback"))
		cannot = "fallback path: its units are threads";
	else if (sched_setaffinity(0, sizeof(cpu0), &cpu0))
		cannot = "CPU 0 is not allowed";
	else if (huge_pages_may_back_chunks())
		cannot = "transparent huge pages may back a chunk whole";
	else if ((pagemap = open("/proc/self/pagemap", O_RDONLY)) < 0 ||
		 page_backed((uintptr_t)&pagemap) < 0)
		cannot = "/proc/self/pagemap cannot be read";
	if (cannot) {
		skip("%s", cannot);
		return done_testing();
	}

	live(false);
	ok(copies_on_backed_pages(0, 1) > 0, "unit 0's pages are backed: counts and free links (%lu copies)",
	   copies_on_backed_pages(0, 1));
	is(copies_on_backed_pages(1, units), 0,
	   "exits of per-CPU refs on CPU 0 back no page of units 1 to %u", units - 1);
	live(true);
	is(releases, (unsigned long)NR_REFS, "every killed ref released");
	is(copies_on_backed_pages(1, units), 0, "nor do their kills' folds");
	close(pagemap);
	return done_testing();
}
