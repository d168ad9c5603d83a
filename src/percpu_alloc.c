/* SPDX-License-Identifier: MIT */
/*
 * percpu_alloc.c - the per-CPU counter allocator.
 *
 * Layout (the kernel's percpu allocator in miniature): memory comes in
 * chunks; a chunk holds one unit per possible CPU, each unit
 * 1 << PERCPUREF_UNIT_SHIFT bytes, units back to back.  A counter is a slot
 * at the same offset in every unit, named by the address of its CPU 0 copy:
 * CPU n's copy is (n << PERCPUREF_UNIT_SHIFT) bytes further.  So a counter
 * costs 8 bytes per CPU, counters of one CPU are packed together (the only
 * writer of a unit's lines is that CPU), and no two CPUs' copies ever share a
 * cache line.  The fast path needs no table lookup: a shift and an add.
 *
 * Chunks are anonymous mappings reserved whole and populated by the kernel as
 * slots are first touched; slots are handed out from a free list first, then
 * from the unused tail of the newest chunk.  A free slot links to the next
 * free slot through its CPU 0 copy, so the free list costs no memory.
 * Chunks are never unmapped: a freed slot is reused by the next allocation,
 * which keeps memory flat under churn (memory is limitation 1 of the managed
 * refcount proposal; docs/percpu_ref.md).
 *
 * Concurrency: one mutex (alloc_lock) guards the chunk table, the
 * free list and the tail.  Counters are zeroed under it before the address is
 * returned; the caller publishes the address with its own ordering.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "internal.h"

#define SLOTS_PER_CHUNK ((1UL << PERCPUREF_UNIT_SHIFT) / sizeof(unsigned long))

static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t *chunks;		/* base of each chunk (CPU 0's unit) */
static size_t nr_chunks, chunks_capacity;
static uintptr_t free_head;		/* a free slot's CPU 0 address, or 0 */
static size_t tail_used = SLOTS_PER_CHUNK; /* slots handed out of the newest chunk */
static size_t slots_in_use, slots_on_free_list;

static size_t chunk_bytes(void)
{
	return (size_t)percpuref_nr_units() << PERCPUREF_UNIT_SHIFT;
}

/* Maps a new chunk and makes it the tail.  Lock held.  0 or -ENOMEM. */
static int add_chunk(void)
{
	void *base;

	if (nr_chunks == chunks_capacity) {
		size_t capacity = chunks_capacity ? 2 * chunks_capacity : 8;
		uintptr_t *grown = percpuref_fault_should_fail()
					   ? NULL
					   : realloc(chunks, capacity * sizeof(*chunks));

		if (!grown)
			return -ENOMEM;
		chunks = grown;
		chunks_capacity = capacity;
	}
	if (percpuref_fault_should_fail())
		return -ENOMEM;
	base = mmap(NULL, chunk_bytes(), PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (base == MAP_FAILED)
		return -ENOMEM;
	chunks[nr_chunks++] = (uintptr_t)base;
	tail_used = 0;
	return 0;
}

uintptr_t percpuref_counter_alloc(void)
{
	unsigned int cpu, nr_units = percpuref_nr_units();
	uintptr_t cpu0;

	pthread_mutex_lock(&alloc_lock);
	if (free_head) {
		cpu0 = free_head;
		free_head = *(uintptr_t *)cpu0;
		slots_on_free_list--;
	} else if (tail_used < SLOTS_PER_CHUNK || add_chunk() == 0) {
		cpu0 = chunks[nr_chunks - 1] + tail_used++ * sizeof(unsigned long);
	} else {
		pthread_mutex_unlock(&alloc_lock);
		return 0;
	}
	for (cpu = 0; cpu < nr_units; cpu++)
		*percpuref_counter_on(cpu0, cpu) = 0;
	slots_in_use++;
	pthread_mutex_unlock(&alloc_lock);
	return cpu0;
}

void percpuref_counter_free(uintptr_t cpu0)
{
	pthread_mutex_lock(&alloc_lock);
	*(uintptr_t *)cpu0 = free_head;
	free_head = cpu0;
	slots_on_free_list++;
	slots_in_use--;
	pthread_mutex_unlock(&alloc_lock);
}

PERCPUREF_API void percpuref_get_counter_stats(struct percpuref_counter_stats *stats)
{
	pthread_mutex_lock(&alloc_lock);
	stats->chunks = nr_chunks;
	stats->in_use = slots_in_use;
	stats->free = slots_on_free_list + (SLOTS_PER_CHUNK - tail_used);
	stats->bytes_mapped = nr_chunks * chunk_bytes();
	pthread_mutex_unlock(&alloc_lock);
}

static void alloc_fork_lock(void)
{
	pthread_mutex_lock(&alloc_lock);
}

static void alloc_fork_unlock(void)
{
	pthread_mutex_unlock(&alloc_lock);
}

static const struct percpuref_fork_hooks alloc_hooks = {
	.rank = PERCPUREF_RANK_ALLOC,
	.prepare = alloc_fork_lock,
	.parent = alloc_fork_unlock,
	.child = alloc_fork_unlock,
};

static __attribute__((constructor)) void alloc_register(void)
{
	percpuref_register_fork_hooks(&alloc_hooks);
}
