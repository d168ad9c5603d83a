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
 * free links wrote, read backed: the check can see a backed page.  0.4.10
 * zeroed every unit's copy at the allocation, 0.4.11 at the fold and the
 * exit, backing the pages of possible CPUs the machine may not even have
 * (4,096 refs shown sixteen possible CPUs: 576 kB resident, against 36 kB
 * now).  Transparent huge pages are off for this process
 * (PR_SET_THP_DISABLE, before the first chunk): set to "always", they may
 * back a huge page of units at a write (chunks merge into one mapping).
 *
 * Skipped where it cannot tell: one unit; CPU 0 not allowed; the fallback
 * path (its units are threads, not CPUs); no pagemap.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
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

static int by_address(const void *a, const void *b)
{
	uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;

	return (x > y) - (x < y);
}

/* The pages of units @from to @to - 1 that hold a recorded counter's copy
 * and are backed, each page once; *@unreadable counts those pagemap did
 * not answer for (a failure, not a pass). */
static unsigned long backed_pages(unsigned int from, unsigned int to, unsigned long *unreadable)
{
	static uintptr_t pages[NR_REFS];
	uintptr_t page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
	unsigned long backed = 0;
	unsigned int unit;
	int i, state;

	*unreadable = 0;
	for (unit = from; unit < to; unit++) {
		for (i = 0; i < NR_REFS; i++)
			pages[i] = (uintptr_t)percpuref_counter_on(counters[i], unit) / page_size;
		qsort(pages, NR_REFS, sizeof(pages[0]), by_address);
		for (i = 0; i < NR_REFS; i++) {
			if (i && pages[i] == pages[i - 1])
				continue;
			state = page_backed(pages[i] * page_size);
			if (state < 0)
				(*unreadable)++;
			else
				backed += (unsigned long)state;
		}
	}
	return backed;
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

	unsigned long unreadable;

	/* Before the first chunk is mapped: none of ours gets huge pages. */
	(void)prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0);
	CPU_ZERO(&cpu0);
	CPU_SET(0, &cpu0);
	if (units < 2)
		cannot = "one unit: no other unit to leave unbacked";
	else if (!strcmp(percpuref_fast_path(), "fallback"))
		cannot = "fallback path: its units are threads";
	else if (sched_setaffinity(0, sizeof(cpu0), &cpu0))
		cannot = "CPU 0 is not allowed";
	else if ((pagemap = open("/proc/self/pagemap", O_RDONLY)) < 0 ||
		 page_backed((uintptr_t)&pagemap) < 0)
		cannot = "/proc/self/pagemap cannot be read";
	if (cannot) {
		skip("%s", cannot);
		return done_testing();
	}

	live(false);
	ok(backed_pages(0, 1, &unreadable) > 0 && !unreadable,
	   "unit 0's pages are backed: counts and free links (%lu pages)",
	   backed_pages(0, 1, &unreadable));
	is(backed_pages(1, units, &unreadable), 0,
	   "exits of per-CPU refs on CPU 0 back no page of units 1 to %u", units - 1);
	is(unreadable, 0, "pagemap answered for every page");
	live(true);
	is(releases, (unsigned long)NR_REFS, "every killed ref released");
	is(backed_pages(1, units, &unreadable), 0, "nor do their kills' folds");
	is(unreadable, 0, "pagemap answered for every page");
	close(pagemap);
	return done_testing();
}
