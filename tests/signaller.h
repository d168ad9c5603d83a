/* SPDX-License-Identifier: MIT */
/*
 * signaller.h - a thread that sends SIGUSR1 to the thread that started it,
 * every @pause_ns, until stopped: signal handlers that interrupt get and
 * put (test_fast_path.c, test_fallback_edges.c), or that fork amid a
 * wait's counting (test_give_way.c).
 */
#ifndef PERCPUREF_TESTS_SIGNALLER_H
#define PERCPUREF_TESTS_SIGNALLER_H

#include <pthread.h>
#include <signal.h>
#include <time.h>

struct signaller {
	pthread_t target, thread;
	long pause_ns;
	int stop;
};

static inline void *signaller_main(void *arg)
{
	struct signaller *s = (struct signaller *)arg;
	struct timespec pause = { 0, s->pause_ns };

	/* Relaxed: a flag alone; the join orders the rest. */
	while (!__atomic_load_n(&s->stop, __ATOMIC_RELAXED)) {
		pthread_kill(s->target, SIGUSR1);
		nanosleep(&pause, NULL);
	}
	return NULL;
}

/* Signals the calling thread from now on; 0, or pthread_create()'s error. */
static inline int signaller_start(struct signaller *s, long pause_ns)
{
	s->target = pthread_self();
	s->pause_ns = pause_ns;
	s->stop = 0;
	return pthread_create(&s->thread, NULL, signaller_main, s);
}

/* No signal is sent after it returns. */
static inline void signaller_stop(struct signaller *s)
{
	__atomic_store_n(&s->stop, 1, __ATOMIC_RELAXED);
	pthread_join(s->thread, NULL);
}

#endif
