/* SPDX-License-Identifier: MIT */
/*
 * fencer.h - a thread that switches its own ref to atomic mode and back,
 * back to back, until stopped: reader fences in flight on another thread
 * (test_combo.c, test_fallback_edges.c), each holding the locks a fence
 * holds while it waits for every read-side section.
 */
#ifndef PERCPUREF_TESTS_FENCER_H
#define PERCPUREF_TESTS_FENCER_H

#include <pthread.h>

#include "percpuref/percpu_ref.h"

struct fencer {
	struct percpu_ref ref;
	pthread_t thread;
	int stop;
};

static inline void *fencer_main(void *arg)
{
	struct fencer *f = (struct fencer *)arg;

	/* Relaxed: a flag alone; the join orders the rest. */
	while (!__atomic_load_n(&f->stop, __ATOMIC_RELAXED)) {
		percpu_ref_switch_to_atomic_sync(&f->ref);
		percpu_ref_switch_to_percpu(&f->ref);
	}
	return NULL;
}

/* Fences from now on; 0, or the error of percpu_ref_init() or of
 * pthread_create() (the ref exited again). */
static inline int fencer_start(struct fencer *f)
{
	int err = percpu_ref_init(&f->ref, NULL, PERCPU_REF_ALLOW_REINIT);

	if (err)
		return err;
	f->stop = 0;
	err = pthread_create(&f->thread, NULL, fencer_main, f);
	if (err)
		percpu_ref_exit(&f->ref);
	return err;
}

/* No fence is started after it returns. */
static inline void fencer_stop(struct fencer *f)
{
	__atomic_store_n(&f->stop, 1, __ATOMIC_RELAXED);
	pthread_join(f->thread, NULL);
	percpu_ref_exit(&f->ref);
}

#endif
