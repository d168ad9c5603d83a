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
 *   open:    if (hcount_charge(tenant, SESSIONS, 1) == -EDQUOT) refuse;
 *   close:   hcount_uncharge(tenant, SESSIONS, 1)
 *   limits:  hcount_ns_set_limit(tenant, SESSIONS, 50) at any time
 *   end:     hcount_ns_destroy(tenant) (no units left), hcount_tree_destroy(tree)
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>

#include <percpuref/hcount.h>

#include "check.h"

enum { SESSIONS, NR_TYPES };	/* resource types of the tree */

#define GLOBAL_LIMIT 100
#define TENANT_LIMIT 40
#define TENANTS 3
#define ROUNDS 20000

static struct hcount_ns *tenants[TENANTS];

/* Opens up to TENANT_LIMIT sessions of one tenant, returns how many. */
static long open_all(struct hcount_ns *tenant)
{
	long n = 0;

	while (hcount_charge(tenant, SESSIONS, 1) == 0)
		n++;
	return n;
}

/* Sessions opening and closing on one tenant, as a server thread would. */
static void *server(void *arg)
{
	struct hcount_ns *tenant = arg;
	long open = 0;

	for (int i = 0; i < ROUNDS; i++) {
		int err = hcount_charge(tenant, SESSIONS, 1);

		CHECK(err == 0 || err == -EDQUOT);
		if (err == 0)
			open++;
		if (open > 0 && (i % 3 == 0 || err)) {
			CHECK(hcount_uncharge(tenant, SESSIONS, 1) == 0);
			open--;
		}
	}
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
		CHECK(hcount_uncharge(tenants[t], SESSIONS, hcount_ns_own(tenants[t], SESSIONS)) == 0);

	/* Limits change at any time: tenant 0 may now hold 50. */
	CHECK(hcount_ns_set_limit(tenants[0], SESSIONS, 50) == 0);
	CHECK(open_all(tenants[0]) == 50);
	CHECK(hcount_uncharge(tenants[0], SESSIONS, 50) == 0);

	/* Concurrent servers: every charge is granted or refused, and nothing
	 * is lost (the tree checks out, every count is back to 0). */
	for (int t = 0; t < TENANTS; t++)
		CHECK(pthread_create(&threads[t], NULL, server, tenants[t]) == 0);
	for (int t = 0; t < TENANTS; t++)
		CHECK(pthread_join(threads[t], NULL) == 0);
	CHECK(hcount_tree_check(tree) == 0);
	for (int t = 0; t < TENANTS; t++) {
		CHECK(hcount_ns_own(tenants[t], SESSIONS) == 0);
		CHECK(hcount_ns_destroy(tenants[t]) == 0);
	}
	CHECK(hcount_ns_count(hcount_tree_root(tree), SESSIONS) == 0);
	CHECK(hcount_tree_destroy(tree) == 0);
	printf("tenant_quota: per-tenant and global limits held\n");
	return 0;
}
