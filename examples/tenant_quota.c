/* SPDX-License-Identifier: MIT */
/*
 * tenant_quota.c - per-tenant quotas under a global limit: hcount.
 *
 * A service admits at most 100 concurrent sessions in total and at most 40
 * per tenant.  Each tenant is a namespace under the root; a session is one
 * unit charged at its tenant, which charges every level up to the root, so
 * both limits hold at once.  Each namespace keeps a small cache of units
 * already charged to its ancestors: a steady stream of open/close on one
 * tenant touches only that tenant's cache line, and the limits stay exact
 * (a charge that meets a full level drains the caches and retries before
 * it refuses).
 *
 * The steps:
 *   setup:   hcount_tree_create(&tree, 1, HCOUNT_BATCH_DEFAULT, (long[]){100})
 *            hcount_ns_create(&tenant, hcount_tree_root(tree), (long[]){40})
 *   open:    err = hcount_charge(tenant, SESSIONS, 1): 0 admitted, -EDQUOT
 *            refused (a limit is reached), anything else a bug (-EINVAL)
 *   close:   hcount_uncharge(tenant, SESSIONS, 1)
 *   limits:  hcount_ns_set_limit(tenant, SESSIONS, 50) at any time
 *   end:     hcount_ns_destroy(tenant) (no units left), hcount_tree_destroy(tree)
 */
/* pthread_barrier_t, which -std=c11 alone hides. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>

#include <percpuref/hcount.h>

#include "check.h"

enum { SESSIONS, NR_TYPES };	/* resource types of the tree */

#define GLOBAL_LIMIT 100
#define TENANT_LIMIT 40
#define TENANTS 3
#define ROUNDS 20000

static struct hcount_ns *tenants[TENANTS];
/* Sessions open in all tenants: atomic, raised after a charge is granted
 * and lowered before its uncharge, so never above what hcount counts. */
static long sessions_open;
static long refused_by_global;	/* refusals below the tenant's limit */
static pthread_barrier_t servers_met;

/* Opens sessions of one tenant until a limit refuses; returns how many. */
static long open_all(struct hcount_ns *tenant)
{
	long n = 0;
	int err;

	while ((err = hcount_charge(tenant, SESSIONS, 1)) == 0)
		n++;
	CHECK(err == -EDQUOT);
	return n;
}

/* Closes every session of one tenant (an uncharge of 0 is -EINVAL). */
static void close_all(struct hcount_ns *tenant)
{
	long own = hcount_ns_own(tenant, SESSIONS);

	CHECK(own >= 0);
	if (own > 0)
		CHECK(hcount_uncharge(tenant, SESSIONS, own) == 0);
}

/* One session more for a server; false when a limit refused it. */
static bool server_open(struct hcount_ns *tenant, long *open)
{
	int err = hcount_charge(tenant, SESSIONS, 1);

	CHECK(err == 0 || err == -EDQUOT);
	if (err) {
		if (*open < TENANT_LIMIT)
			__atomic_fetch_add(&refused_by_global, 1, __ATOMIC_RELAXED);
		return false;
	}
	/* Both limits hold under concurrency too: this thread is its
	 * tenant's only one, and every thread counts its sessions in
	 * sessions_open. */
	CHECK(++*open <= TENANT_LIMIT);
	CHECK(__atomic_add_fetch(&sessions_open, 1, __ATOMIC_RELAXED) <= GLOBAL_LIMIT);
	return true;
}

/*
 * Sessions opening and closing on one tenant, as a server thread would:
 * first as many as the limits let it open, all servers together (3 x 40
 * do not fit in 100: the global limit refuses some), then open and close.
 */
static void *server(void *arg)
{
	struct hcount_ns *tenant = arg;
	long open = 0;

	while (server_open(tenant, &open))
		;
	pthread_barrier_wait(&servers_met);
	/* Every server stopped at a refusal, and none closed: all 100 open. */
	CHECK(__atomic_load_n(&sessions_open, __ATOMIC_RELAXED) == GLOBAL_LIMIT);
	pthread_barrier_wait(&servers_met);
	for (int i = 0; i < ROUNDS; i++) {
		bool opened = server_open(tenant, &open);

		if (open > 0 && (i % 3 == 0 || !opened)) {
			__atomic_fetch_sub(&sessions_open, 1, __ATOMIC_RELAXED);
			CHECK(hcount_uncharge(tenant, SESSIONS, 1) == 0);
			open--;
		}
	}
	__atomic_fetch_sub(&sessions_open, open, __ATOMIC_RELAXED);
	while (open-- > 0)
		CHECK(hcount_uncharge(tenant, SESSIONS, 1) == 0);
	return NULL;
}

int main(void)
{
	const long root_limits[NR_TYPES] = { GLOBAL_LIMIT };
	const long tenant_limits[NR_TYPES] = { TENANT_LIMIT };
	struct hcount_tree *tree;
	pthread_t threads[TENANTS];

	CHECK(hcount_tree_create(&tree, NR_TYPES, HCOUNT_BATCH_DEFAULT, root_limits) == 0);
	for (int t = 0; t < TENANTS; t++)
		CHECK(hcount_ns_create(&tenants[t], hcount_tree_root(tree), tenant_limits) == 0);

	/* The tenant limit: tenants 0 and 1 get 40 sessions each, not 41. */
	CHECK(open_all(tenants[0]) == TENANT_LIMIT);
	CHECK(open_all(tenants[1]) == TENANT_LIMIT);
	CHECK(hcount_charge(tenants[0], SESSIONS, 1) == -EDQUOT);
	/* The global limit: tenant 2 gets only what is left of 100. */
	CHECK(open_all(tenants[2]) == GLOBAL_LIMIT - 2 * TENANT_LIMIT);
	CHECK(hcount_tree_check(tree) == 0);

	/* Closing sessions of one tenant makes room for another. */
	CHECK(hcount_uncharge(tenants[0], SESSIONS, 10) == 0);
	CHECK(open_all(tenants[2]) == 10);
	for (int t = 0; t < TENANTS; t++)
		close_all(tenants[t]);

	/* Limits change at any time: tenant 0 may now hold 50. */
	CHECK(hcount_ns_set_limit(tenants[0], SESSIONS, 50) == 0);
	CHECK(open_all(tenants[0]) == 50);
	CHECK(hcount_uncharge(tenants[0], SESSIONS, 50) == 0);
	CHECK(hcount_ns_set_limit(tenants[0], SESSIONS, TENANT_LIMIT) == 0);

	/* Concurrent servers, 3 x 40 sessions wanted under 100: every charge
	 * is granted within both limits or refused, and nothing is lost (the
	 * tree checks out, every count is back to 0). */
	CHECK(pthread_barrier_init(&servers_met, NULL, TENANTS) == 0);
	for (int t = 0; t < TENANTS; t++)
		CHECK(pthread_create(&threads[t], NULL, server, tenants[t]) == 0);
	for (int t = 0; t < TENANTS; t++)
		CHECK(pthread_join(threads[t], NULL) == 0);
	CHECK(pthread_barrier_destroy(&servers_met) == 0);
	CHECK(refused_by_global > 0);
	CHECK(hcount_tree_check(tree) == 0);
	for (int t = 0; t < TENANTS; t++) {
		CHECK(hcount_ns_own(tenants[t], SESSIONS) == 0);
		CHECK(hcount_ns_destroy(tenants[t]) == 0);
	}
	CHECK(hcount_ns_count(hcount_tree_root(tree), SESSIONS) == 0);
	CHECK(hcount_tree_destroy(tree) == 0);
	printf("tenant_quota: per-tenant and global limits held (%ld concurrent charges "
	       "refused by the global limit)\n", refused_by_global);
	return 0;
}
