/* SPDX-License-Identifier: MIT */
/*
 * signal1_model.c - slow paths of signal1's kernel, report and
 * percpu-counter models (signal1_model.h has the model and its ordering argument):
 * creating and checking the tree, the report's refill and drain, and the
 * exact sum of a percpu counter.
 */
#include <stdlib.h>

#include "bench.h"
#include "signal1_model.h"

static struct sig1_level *sig1_level_create(struct sig1_level *parent, long max,
					    unsigned int ncpus)
{
	struct sig1_level *l = bench_zalloc(sizeof(*l));

	l->max = max;
	l->parent = parent;
	l->refs = 1;	/* the namespace's own */
	l->deltas = bench_zalloc(ncpus * SIG1_DELTA_STRIDE * sizeof(long));
	return l;
}

struct sig1_tree *sig1_tree_create(unsigned int ncontainers, long max, unsigned int ncpus)
{
	struct sig1_tree *t = bench_zalloc(sizeof(*t));

	t->ncpus = ncpus;
	/* The kernel's percpu_counter_batch: max(32, 2 x CPUs). */
	t->pcpu_batch = 2L * ncpus > 32 ? 2L * ncpus : 32;
	t->root = sig1_level_create(NULL, max, ncpus);
	t->ncontainers = ncontainers;
	t->containers = bench_zalloc(ncontainers * sizeof(*t->containers));
	for (unsigned int i = 0; i < ncontainers; i++)
		t->containers[i] = sig1_level_create(t->root, max, ncpus);
	return t;
}

long sig1_pcpu_sum(const struct sig1_tree *t, const struct sig1_level *l)
{
	long sum = __atomic_load_n(&l->count, __ATOMIC_RELAXED);

	for (unsigned int cpu = 0; cpu < t->ncpus; cpu++)
		sum += __atomic_load_n(&l->deltas[cpu * SIG1_DELTA_STRIDE], __ATOMIC_RELAXED);
	return sum;
}

void sig1_report_drain(struct sig1_tree *t)
{
	__atomic_add_fetch(&t->drains, 1, __ATOMIC_RELAXED);
	for (unsigned int i = 0; i < t->ncontainers; i++) {
		struct sig1_level *c = t->containers[i];
		long n = __atomic_exchange_n(&c->cache, 0, __ATOMIC_RELAXED);

		if (n)
			sig1_chain_add(c->parent, -n, true);
	}
}

/*
 * The cache was empty: charge a batch up the chain and take a unit of it
 * (retried once: another worker of the container may take the batch
 * first).  A refused batch drains every cache and charges the one unit
 * up the chain directly, which only real usage can refuse.
 */
bool sig1_report_refill_slow(struct sig1_tree *t, struct sig1_level *c)
{
	for (int tries = 0; tries < 2; tries++) {
		if (!sig1_chain_add(c->parent, SIG1_REPORT_BATCH, t->override_rlimit))
			break;
		__atomic_add_fetch(&c->cache, SIG1_REPORT_BATCH, __ATOMIC_RELAXED);
		if (sig1_cache_take(c))
			return true;
	}
	sig1_report_drain(t);
	if (!sig1_chain_add(c->parent, 1, t->override_rlimit))
		return false;
	return true;
}

bool sig1_tree_destroy(struct sig1_tree *t)
{
	bool clean = true;

	sig1_report_drain(t);
	for (unsigned int i = 0; i < t->ncontainers; i++) {
		clean &= sig1_pcpu_sum(t, t->containers[i]) == 0 && t->containers[i]->refs == 1;
		free(t->containers[i]->deltas);
		free(t->containers[i]);
	}
	clean &= sig1_pcpu_sum(t, t->root) == 0 && t->root->refs == 1;
	free(t->root->deltas);
	free(t->root);
	free(t->containers);
	free(t);
	return clean;
}
