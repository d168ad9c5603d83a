/* SPDX-License-Identifier: MIT */
/*
 * signal1_model.c - the limits of signal1's models (signal1_model.h) at
 * their boundary.  signal1 itself never reaches a limit (each worker holds
 * at most one unit and setup leaves room for all), so a model that ignored
 * its limits, or refused below them, would pass every run of it: this test
 * fills each model to the limit from one container, one thread, and checks
 * that the next charge is refused at the container and at the root, that
 * a refusal changes no count, that one unit given back makes room again,
 * that override_rlimit skips the parents' max (and, in the kernel model,
 * the task's rlimit too), and that the tree comes back clean (the kernel
 * model's ucounts references included).  The root's max is where each
 * model keeps it: the kernel checks a level against the max its child
 * namespace recorded, the report's and the percpu counter's models against
 * the level's own, so the test gives the other max room to spare, and a
 * model that read the wrong one would let the root pass its max.
 */
#include <stdbool.h>

#include "../../tests/tap.h"
#include "signal1_model.h"

/* The task's rlimit; phase two gives the root a max of LIMIT + 2. */
#define LIMIT 5L
#define ROOM 100L	/* a max far away */
#define NCPUS 2U

enum model { KERNEL, REPORT, PCPU };
static const char *const model_name[] = { "kernel", "report", "percpu-counter" };

static bool charge(enum model m, struct sig1_tree *t, struct sig1_level *c)
{
	switch (m) {
	case KERNEL:
		return sig1_kernel_charge(t, c, LIMIT);
	case REPORT:
		return sig1_report_charge(t, c, LIMIT);
	case PCPU:
		return sig1_pcpu_charge(t, c, 0, LIMIT);
	}
	return false;
}

static bool uncharge(enum model m, struct sig1_tree *t, struct sig1_level *c)
{
	switch (m) {
	case KERNEL:
		return sig1_kernel_uncharge(c, NULL);
	case REPORT:
		sig1_report_uncharge(c);
		return true;
	case PCPU:
		sig1_pcpu_uncharge(t, c, 0);
		return true;
	}
	return false;
}

/* Units charged at @l and not cached below it: what its max counts. */
static long used(enum model m, const struct sig1_tree *t, const struct sig1_level *l)
{
	long n = sig1_pcpu_sum(t, l);

	if (m == REPORT && !l->parent)
		for (unsigned int i = 0; i < t->ncontainers; i++)
			n -= t->containers[i]->cache;
	return n;
}

static void boundary(enum model m)
{
	const char *name = model_name[m];
	/* Phase one: the levels' max far away, the task's rlimit the bound. */
	struct sig1_tree *t = sig1_tree_create(2, ROOM, NCPUS);
	struct sig1_level *c0 = t->containers[0], *c1 = t->containers[1];
	int taken = 0;

	for (long i = 0; i < LIMIT; i++)
		taken += charge(m, t, c0);
	is(taken, LIMIT, "%s: %ld charges up to the task's rlimit taken", name, LIMIT);
	if (m == KERNEL) {
		is(c0->refs, 2, "%s: the container's ucounts referenced once", name);
		is(t->root->refs, 2, "%s: the root's ucounts referenced once", name);
	}
	ok(!charge(m, t, c0), "%s: a charge past the task's rlimit refused", name);
	is(used(m, t, c0), LIMIT, "%s: the refusal left the container's count", name);
	is(used(m, t, t->root), LIMIT, "%s: and the root's", name);

	/* Phase two: room for two more at the root, from the other container;
	 * in the kernel the containers' namespaces hold the root's max. */
	if (m == KERNEL)
		c0->max = c1->max = LIMIT + 2;
	else
		t->root->max = LIMIT + 2;
	ok(charge(m, t, c1) && charge(m, t, c1), "%s: two charges up to the root's max taken",
	   name);
	ok(!charge(m, t, c1), "%s: a charge past the root's max refused", name);
	is(used(m, t, c1), 2, "%s: the refusal left the container's count", name);
	is(used(m, t, t->root), LIMIT + 2, "%s: and the root's", name);
	ok(uncharge(m, t, c0), "%s: one unit given back at the first container", name);
	ok(charge(m, t, c1), "%s: then a charge at the other taken", name);
	ok(!charge(m, t, c1), "%s: and the next refused again", name);
	t->override_rlimit = true;
	ok(charge(m, t, c1), "%s: override_rlimit: the root's max not checked", name);
	is(used(m, t, t->root), LIMIT + 3, "%s: the root one past its max", name);
	/* The first container holds LIMIT - 1: one more is at its rlimit. */
	ok(charge(m, t, c0), "%s: override_rlimit: a charge up to the task's rlimit", name);
	if (m == KERNEL)
		ok(charge(m, t, c0), "%s: override_rlimit: the task's rlimit not checked", name);
	else
		ok(!charge(m, t, c0), "%s: override_rlimit: the task's rlimit still checked", name);
	t->override_rlimit = false;

	for (int i = 0; i < 4; i++)
		ok(uncharge(m, t, c1), "%s: the second container's unit %d back", name, i + 1);
	for (long i = 1; i < LIMIT + (m == KERNEL ? 2 : 1); i++)
		ok(uncharge(m, t, c0), "%s: a first container's unit back", name);
	is(used(m, t, t->root), 0, "%s: nothing charged at the root", name);
	if (m == KERNEL) {
		is(c0->refs, 1, "%s: the container's reference put", name);
		is(t->root->refs, 1, "%s: the root's reference put", name);
		ok(!sig1_kernel_uncharge(c0, NULL), "%s: an uncharge below zero reported", name);
		__atomic_add_fetch(&c0->count, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&t->root->count, 1, __ATOMIC_RELAXED);
	}
	ok(sig1_tree_destroy(t), "%s: the tree comes back clean", name);
}

/* A unit left charged: destroy says so (and still frees everything). */
static void leftover(enum model m)
{
	struct sig1_tree *t = sig1_tree_create(1, LIMIT, NCPUS);

	ok(charge(m, t, t->containers[0]), "%s: one unit charged", model_name[m]);
	ok(!sig1_tree_destroy(t), "%s: destroy finds the unit left", model_name[m]);
}

int main(void)
{
	for (enum model m = KERNEL; m <= PCPU; m++) {
		boundary(m);
		leftover(m);
	}
	return done_testing();
}
