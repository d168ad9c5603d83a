/* SPDX-License-Identifier: MIT */
/*
 * connection.c - a per-connection object with an owner that kills it:
 * percpu_ref, kill_and_confirm, tryget_live.
 *
 * The connection belongs to the server (its owner), which holds the
 * initial reference.  Request handlers on other threads take their own
 * reference for each request, per CPU and without touching a shared line.
 * When the connection closes the owner kills the ref: from the confirm
 * callback on, new requests are refused (tryget_live fails), requests in
 * flight finish, and the last put calls @release, which frees it.
 *
 * The steps:
 *   open:     percpu_ref_init(&c->ref, conn_release, 0)    count 1 (the owner's)
 *   request:  if (percpu_ref_tryget_live(&c->ref)) { serve; percpu_ref_put(&c->ref); }
 *   close:    percpu_ref_kill_and_confirm(&c->ref, conn_confirm_kill)
 *             (or percpu_ref_kill(): the same without a callback)
 *   release:  on the thread of the last put (the callback thread when the
 *             kill's switch held the last reference); percpu_ref_exit()
 *             and free.
 * The object must stay reachable for as long as handlers may tryget it:
 * here the server keeps a second reference until its handlers are gone,
 * and tryget_live, not the memory, is what tells them it closed.  When a lookup
 * may race with the release, use percpu_rcuref (see config_snapshot.c).
 */
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <percpuref/percpu_ref.h>

#include "check.h"

#define HANDLERS 2

struct connection {
	struct percpu_ref ref;
	long in_flight;		/* requests being served (checked at release) */
	long served;
	bool closed;		/* set by the confirm callback */
};

static long releases;
static long served_total;

static void conn_release(struct percpu_ref *ref)
{
	struct connection *c = (struct connection *)((char *)ref - offsetof(struct connection, ref));

	/* Every request took a reference, so none can be in flight. */
	CHECK(__atomic_load_n(&c->in_flight, __ATOMIC_RELAXED) == 0);
	CHECK(__atomic_load_n(&c->closed, __ATOMIC_RELAXED));
	__atomic_store_n(&served_total, __atomic_load_n(&c->served, __ATOMIC_RELAXED),
			 __ATOMIC_RELAXED);
	percpu_ref_exit(&c->ref);
	free(c);
	__atomic_fetch_add(&releases, 1, __ATOMIC_RELAXED);
}

/* Callback thread: the kill is visible to every tryget_live from now on. */
static void conn_confirm_kill(struct percpu_ref *ref)
{
	struct connection *c = (struct connection *)((char *)ref - offsetof(struct connection, ref));

	/* Release pairs with the handlers' acquire load of closed. */
	__atomic_store_n(&c->closed, true, __ATOMIC_RELEASE);
}

struct handler {
	pthread_t thread;
	struct connection *conn;
};

static void *handler(void *arg)
{
	struct handler *h = arg;
	struct connection *c = h->conn;

	for (;;) {
		/* Read before the tryget: if closed was already set, the
		 * confirm ran, and tryget_live must fail. */
		bool closed = __atomic_load_n(&c->closed, __ATOMIC_ACQUIRE);

		if (!percpu_ref_tryget_live(&c->ref))
			return NULL;	/* the connection closed */
		CHECK(!closed);
		__atomic_fetch_add(&c->in_flight, 1, __ATOMIC_RELAXED);
		__atomic_fetch_add(&c->served, 1, __ATOMIC_RELAXED);	/* serve */
		__atomic_fetch_sub(&c->in_flight, 1, __ATOMIC_RELAXED);
		percpu_ref_put(&c->ref);
	}
}

int main(void)
{
	struct handler handlers[HANDLERS];
	struct connection *c = calloc(1, sizeof(*c));

	CHECK(c != NULL);
	CHECK(percpu_ref_init(&c->ref, conn_release, 0) == 0);

	/*
	 * tryget_live needs valid memory: between requests the handlers hold
	 * no reference, so the server keeps one of its own (the "connection
	 * table's") until they are gone.  Without it, the last request's put
	 * after the kill could free c under a handler's next tryget_live.
	 */
	percpu_ref_get(&c->ref);
	for (int i = 0; i < HANDLERS; i++) {
		handlers[i] = (struct handler){ .conn = c };
		CHECK(pthread_create(&handlers[i].thread, NULL, handler, &handlers[i]) == 0);
	}
	while (__atomic_load_n(&c->served, __ATOMIC_RELAXED) < 1000)
		sched_yield();

	/* Close: drop the owner's initial reference. */
	percpu_ref_kill_and_confirm(&c->ref, conn_confirm_kill);
	for (int i = 0; i < HANDLERS; i++)
		CHECK(pthread_join(handlers[i].thread, NULL) == 0);
	CHECK(__atomic_load_n(&releases, __ATOMIC_RELAXED) == 0);	/* we still hold one */

	/* The last reference, unless the kill's switch still holds its own
	 * (the handlers can stop before it finishes): release runs here or
	 * on the callback thread, and the barrier waits for it. */
	percpu_ref_put(&c->ref);
	CHECK(percpu_ref_barrier() == 0);
	CHECK(__atomic_load_n(&releases, __ATOMIC_RELAXED) == 1);
	printf("connection: %ld requests served, released once after close\n", served_total);
	return 0;
}
