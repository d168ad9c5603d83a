/* SPDX-License-Identifier: MIT */
/*
 * transfer.c - what moving one cache line between the first two CPUs
 * costs, measured before every point: the probe that tells whether the
 * machine under the run stayed the same machine.
 *
 * On a virtual machine the host decides where the guest's CPUs run, and
 * moves them.  The 2-vCPU development guest (AMD EPYC, KVM) switches,
 * minutes apart, between a placement where a line written on one vCPU is
 * read on the other in about 50 ns and one where it takes about 230 ns
 * (another core complex, or socket, of the host).  Workloads whose cycle
 * moves lines between CPUs follow it: switch-storm's managed-poll at two
 * threads took 290-330 ns a cycle in the first and 600-850 in the second,
 * its one-thread row unchanged, so a two-thread efficiency of 67% read
 * 31% in the other.  Two builds compared in runs that straddle a switch
 * compare the host's placements instead.  So the harness measures the
 * transfer before each point and reports the range: a point whose probe
 * differs from the others' is from another machine.
 *
 * The probe: two threads pinned to the first two CPUs of the placement
 * order (where threads 0 and 1 of every point run) pass a counter back and
 * forth in one line, TRANSFER_BATCHES batches of TRANSFER_BATCH_ROUND_TRIPS
 * round trips; each pass is one line transfer (the writer's store, then
 * the reader's load miss), and the figure is the fastest batch's time a
 * transfer.  The fastest, because a batch that either thread spent partly
 * descheduled (other work on its CPU, an interrupt) reads slower by the
 * stall, and a single timing of the whole exchange read 51 against 158 ns
 * with a busy loop beside it on one CPU (a review); the host's placement
 * changes every batch alike.  About 2 to 10 ms a point on an idle
 * machine.  Relaxed atomics: each thread waits for the value its partner
 * stored, which is all the protocol needs; the time is read by one thread
 * between its waits.  A partner that gets no CPU (a host that takes it
 * away for long) would leave the other spinning: a thread whose wait
 * spins 4,096 times looks at the clock, and gives up once the probe has
 * run TRANSFER_LIMIT_NS, thread starts included; the figure is then not
 * measured.  (A probe whose every wait is slow but shorter than that may
 * run longer and still report.  A thread that never gets its CPU at all
 * holds the join for as long: no watchdog covers the probe, while the
 * point's own thread on that CPU would fail its start at --hang-limit.)
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define TRANSFER_BATCHES 16u
#define TRANSFER_BATCH_ROUND_TRIPS 1000u
#define TRANSFER_ROUND_TRIPS (TRANSFER_BATCHES * TRANSFER_BATCH_ROUND_TRIPS)
#define TRANSFER_LIMIT_NS 500000000ull

struct transfer_probe {
	/* The line passed back and forth: side 1 stores the odd values,
	 * side 0 the even ones, each after reading its partner's last. */
	unsigned long turn __attribute__((aligned(64)));
	/* Set by a thread that gave up: its partner stops too. */
	bool gave_up __attribute__((aligned(64)));
	uint64_t start_ns;
	uint64_t fastest_batch_ns;	/* side 0's, read after the join */
};

struct transfer_side {
	struct transfer_probe *probe;
	unsigned int side;	/* 0: starts and times, 1: answers */
};

/* Waits until the line reads @value; false once the probe gave up. */
static bool transfer_wait(struct transfer_probe *p, unsigned long value)
{
	unsigned int spins = 0;

	while (__atomic_load_n(&p->turn, __ATOMIC_RELAXED) != value) {
		if (++spins % 4096)
			continue;
		if (__atomic_load_n(&p->gave_up, __ATOMIC_RELAXED) ||
		    bench_clock_ns(CLOCK_MONOTONIC) - p->start_ns > TRANSFER_LIMIT_NS) {
			__atomic_store_n(&p->gave_up, true, __ATOMIC_RELAXED);
			return false;
		}
	}
	return true;
}

/*
 * Round trip k (0 .. TRANSFER_ROUND_TRIPS - 1): side 0 stores 2k + 2, side 1
 * answers 2k + 3.  Side 0 reads the clock when it has seen 2k + 1 for every
 * k that starts a batch, and once after the last: a batch is the time
 * between two such reads.
 */
static void *transfer_main(void *arg)
{
	struct transfer_side *s = arg;
	struct transfer_probe *p = s->probe;
	uint64_t batch_start = 0, now;
	unsigned long k;

	/* Both sides start when side 1 has stored 1 (it runs, pinned). */
	if (s->side == 1) {
		__atomic_store_n(&p->turn, 1, __ATOMIC_RELAXED);
		for (k = 0; k < TRANSFER_ROUND_TRIPS; k++) {
			if (!transfer_wait(p, 2 * k + 2))
				return NULL;
			__atomic_store_n(&p->turn, 2 * k + 3, __ATOMIC_RELAXED);
		}
		return NULL;
	}
	for (k = 0; k <= TRANSFER_ROUND_TRIPS; k++) {
		if (!transfer_wait(p, 2 * k + 1))
			return NULL;
		if (k % TRANSFER_BATCH_ROUND_TRIPS == 0) {
			now = bench_clock_ns(CLOCK_MONOTONIC);
			if (k && (!p->fastest_batch_ns || now - batch_start < p->fastest_batch_ns))
				p->fastest_batch_ns = now - batch_start;
			batch_start = now;
		}
		if (k < TRANSFER_ROUND_TRIPS)
			__atomic_store_n(&p->turn, 2 * k + 2, __ATOMIC_RELAXED);
	}
	return NULL;
}

double measure_line_transfer(const struct topology *topo)
{
	struct transfer_probe *p;
	struct transfer_side sides[2];
	pthread_t tids[2];
	unsigned int started = 0;
	double ns = NAN;

	if (topo->ncpus < 2 || posix_memalign((void **)&p, 64, sizeof(*p)))
		return NAN;
	memset(p, 0, sizeof(*p));
	p->start_ns = bench_clock_ns(CLOCK_MONOTONIC);
	for (; started < 2; started++) {
		pthread_attr_t attr;
		cpu_set_t set;
		int err;

		sides[started] = (struct transfer_side){ p, started };
		CPU_ZERO(&set);
		CPU_SET(topo->order[started], &set);
		pthread_attr_init(&attr);
		err = pthread_attr_setaffinity_np(&attr, sizeof(set), &set);
		if (!err)
			err = pthread_create(&tids[started], &attr, transfer_main, &sides[started]);
		pthread_attr_destroy(&attr);
		if (err)
			break;
	}
	/* One thread alone: its partner never answers; it gives up. */
	if (started < 2)
		__atomic_store_n(&p->gave_up, true, __ATOMIC_RELAXED);
	while (started)
		pthread_join(tids[--started], NULL);
	if (!p->gave_up && p->fastest_batch_ns)
		ns = (double)p->fastest_batch_ns / (2.0 * TRANSFER_BATCH_ROUND_TRIPS);
	free(p);
	return ns;
}
