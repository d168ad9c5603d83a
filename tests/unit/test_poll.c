/* SPDX-License-Identifier: MIT */
/*
 * Polling threads (percpu_ref_poll_register()): a registered thread's kills
 * are finished by its own percpu_ref_poll() calls, not by the callback
 * thread, and nothing it queued is ever stranded:
 *  - the calls' error codes (not registered, twice, a bad flag, inside a
 *    callback, on a library thread), and registering again and again;
 *  - a kill waits on the killer's queue, and its @release and confirm run
 *    on the killer, in a poll (a waiting one, or plain ones that start
 *    their own fence once one is due);
 *  - a @release run by a poll may kill another ref: waiting polls finish
 *    it; it may not poll, unregister or call a barrier (-EDEADLK); a
 *    confirm may not poll (-EDEADLK), run at once or by a poll;
 *  - threads that share fences: `while (percpu_ref_poll(WAIT) > 0);`
 *    finishes each thread's kills, no barrier involved;
 *  - what a thread queued is finished by the callback thread when the
 *    thread unregisters, exits (a registration from a key destructor
 *    after the exit hook ran included), or sits blocked while another thread calls
 *    percpu_ref_barrier(), and when a call waits for one of its switches
 *    (switch_to_percpu right after an asynchronous switch_to_atomic, ours
 *    or another thread's): that switch only, not the rest of the queue;
 *  - PERCPUREF_POLL_INTERVAL_US paces plain polls' fences;
 *  - a barrier waits for what another thread's poll has taken and not
 *    finished;
 *  - fork: the child finishes what another polling thread had queued, and
 *    what a poll, paused in a @release waiting for a lock the forking
 *    thread holds, had not started; the forking thread keeps its own queue.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "child.h"
#include "internal.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

#define DEADLINE_S 60

static int releases;		/* atomic */
static pthread_t released_on;	/* the last @release's thread */
static int nested_ret = 1, reregister_ret = 1, unregister_ret = 1, barrier_ret = 1;
static struct percpu_ref nested_victim;

static void count_release(struct percpu_ref *ref)
{
	(void)ref;
	released_on = pthread_self();
	__atomic_fetch_add(&releases, 1, __ATOMIC_SEQ_CST);
}

static int nr_released(void)
{
	return __atomic_load_n(&releases, __ATOMIC_SEQ_CST);
}

/* Waits up to 10 s for @n releases in all. */
static bool released_within(int n)
{
	uint64_t until = now_ns() + UINT64_C(10000000000);

	while (nr_released() < n && now_ns() < until)
		usleep(1000);
	return nr_released() >= n;
}

static void test_errors(void)
{
	int i, ret = 0;

	is(percpu_ref_poll(0), -EPERM, "poll before registering: -EPERM");
	is(percpu_ref_poll_unregister(), -EPERM, "unregister before registering: -EPERM");
	is(percpu_ref_poll_register(), 0, "register");
	is(percpu_ref_poll_register(), -EALREADY, "register twice: -EALREADY");
	is(percpu_ref_poll(2), -EINVAL, "an unknown flag: -EINVAL");
	is(percpu_ref_poll(0), 0, "nothing queued: 0");
	is(percpu_ref_poll_unregister(), 0, "unregister");
	/* A thread-exit hook each time would overflow the thread's table. */
	for (i = 0; i < 20 && !ret; i++)
		ret = percpu_ref_poll_register() ?: percpu_ref_poll_unregister();
	is(ret, 0, "register and unregister 20 times");
	/* The poller an unregistration gave up is the next registration's:
	 * no allocation (with none reused, each took a new one). */
	percpuref_fault_fail_nth_alloc(-1);
	ret = percpu_ref_poll_register();
	percpuref_fault_fail_nth_alloc(0);
	is(ret, 0, "register with no memory: the poller given up is reused");
	if (!ret)
		percpu_ref_poll_unregister();
}

static int confirmed;
static pthread_t confirmed_on;

static void note_confirm(struct percpu_ref *ref)
{
	(void)ref;
	confirmed_on = pthread_self();
	__atomic_store_n(&confirmed, 1, __ATOMIC_SEQ_CST);
}

static void test_own_thread_finishes(void)
{
	struct percpu_ref ref;
	int ret;

	releases = 0;
	is(percpu_ref_poll_register(), 0, "own: register");
	ok(!percpu_ref_init(&ref, count_release, 0), "own: init");
	percpu_ref_kill_and_confirm(&ref, note_confirm);
	usleep(50000);
	ok(nr_released() == 0 && !__atomic_load_n(&confirmed, __ATOMIC_SEQ_CST),
	   "a kill waits on its thread's queue (the callback thread leaves it)");
	ret = percpu_ref_poll(PERCPU_REF_POLL_WAIT);
	is(ret, 1, "a waiting poll finishes it");
	ok(nr_released() == 1 && pthread_equal(released_on, pthread_self()),
	   "its @release ran on the killing thread");
	ok(confirmed && pthread_equal(confirmed_on, pthread_self()), "and its confirm too");
	percpu_ref_exit(&ref);

	/* Plain polls: each starts a fence once none started for 300 µs. */
	ok(!percpu_ref_init(&ref, count_release, 0), "plain: init");
	percpu_ref_kill(&ref);
	{
		uint64_t until = now_ns() + UINT64_C(10000000000);

		while (nr_released() < 2 && now_ns() < until)
			if (percpu_ref_poll(0) < 0)
				break;
	}
	ok(nr_released() == 2 && pthread_equal(released_on, pthread_self()),
	   "plain polls finish a kill on its thread");
	percpu_ref_exit(&ref);
	is(percpu_ref_poll_unregister(), 0, "own: unregister");
}

/* Waiting polls until none is left: how many they finished. */
static int poll_all(void)
{
	int n, all = 0;

	while ((n = percpu_ref_poll(PERCPU_REF_POLL_WAIT)) > 0)
		all += n;
	return n < 0 ? n : all;
}

/* A @release a poll runs: calls back in, and kills another ref. */
static void release_calls_back(struct percpu_ref *ref)
{
	nested_ret = percpu_ref_poll(0);
	reregister_ret = percpu_ref_poll_register();
	unregister_ret = percpu_ref_poll_unregister();
	barrier_ret = percpu_ref_barrier();
	percpu_ref_kill(&nested_victim);
	count_release(ref);
}

static void test_callback_calls_back(void)
{
	struct percpu_ref ref;

	releases = 0;
	is(percpu_ref_poll_register(), 0, "nested: register");
	ok(!percpu_ref_init(&ref, release_calls_back, 0) &&
	   !percpu_ref_init(&nested_victim, count_release, 0), "nested: init");
	percpu_ref_kill(&ref);
	is(poll_all(), 2, "waiting polls finish the kill its own @release made");
	is(nested_ret, -EDEADLK, "poll from a @release it runs: -EDEADLK");
	is(reregister_ret, -EALREADY, "register from it: -EALREADY");
	is(unregister_ret, -EDEADLK, "unregister from it: -EDEADLK");
	is(barrier_ret, -EDEADLK, "barrier from it: -EDEADLK (it would wait for its own poll)");
	is(nr_released(), 2, "both released");
	percpu_ref_exit(&ref);
	percpu_ref_exit(&nested_victim);
	is(percpu_ref_poll_unregister(), 0, "nested: unregister");
}

/* A confirm that polls: refused, whether it runs at once (the ref was
 * atomic: a @release the poll ran could not let its batch lock go; a
 * switch_to_atomic's too, as documented for any confirm) or in our own
 * poll. */
static int confirm_poll_ret = 1;

static void confirm_polls(struct percpu_ref *ref)
{
	(void)ref;
	confirm_poll_ret = percpu_ref_poll(PERCPU_REF_POLL_WAIT);
}

static void test_confirm_polls(void)
{
	struct percpu_ref at_once, queued;

	releases = 0;
	is(percpu_ref_poll_register(), 0, "confirm: register");
	ok(!percpu_ref_init(&at_once, count_release, PERCPU_REF_INIT_ATOMIC) &&
	   !percpu_ref_init(&queued, count_release, 0), "confirm: init");
	percpu_ref_kill(&queued);	/* what a poll would run */
	percpu_ref_kill_and_confirm(&at_once, confirm_polls);
	is(confirm_poll_ret, -EDEADLK, "poll from a confirm run at once: -EDEADLK");
	confirm_poll_ret = 1;
	percpu_ref_exit(&at_once);
	ok(!percpu_ref_init(&at_once, count_release, PERCPU_REF_INIT_ATOMIC), "confirm: init atomic");
	percpu_ref_switch_to_atomic(&at_once, confirm_polls);
	is(confirm_poll_ret, -EDEADLK,
	   "poll from switch_to_atomic's confirm run at once: -EDEADLK");
	confirm_poll_ret = 1;
	percpu_ref_kill(&at_once);	/* released at once: atomic, nobody holds it */
	percpu_ref_exit(&at_once);
	ok(!percpu_ref_init(&at_once, count_release, 0), "confirm: init again");
	percpu_ref_kill_and_confirm(&at_once, confirm_polls);
	is(poll_all(), 2, "the queued kills finish");
	is(confirm_poll_ret, -EDEADLK, "poll from a confirm its own poll runs: -EDEADLK");
	is(nr_released(), 4, "confirm: all released");
	percpu_ref_exit(&at_once);
	percpu_ref_exit(&queued);
	is(percpu_ref_poll_unregister(), 0, "confirm: unregister");
}

/*
 * Threads that share fences: each kills a batch, then waits with
 * `while (percpu_ref_poll(PERCPU_REF_POLL_WAIT) > 0);` and wants every
 * kill released, no barrier or hand-over involved.  (A waiting poll that
 * returned 0 while another thread's fence covering it was still running
 * left kills queued: rounds failed in 4 of 5 runs.)
 */
#define SHARERS 4
#define SHARER_ROUNDS 1000
#define SHARER_BATCH 8
static int rounds_unreleased;	/* atomic */

struct sharer_slot {
	struct percpu_ref ref;
	int released;		/* its thread's own polls write it */
};

static void sharer_release(struct percpu_ref *ref)
{
	((struct sharer_slot *)ref)->released++;	/* ref is the first member */
}

static void *sharer(void *arg)
{
	struct sharer_slot slot[SHARER_BATCH];
	int r, i, missing;

	(void)arg;
	if (percpu_ref_poll_register())
		return NULL;
	for (r = 0; r < SHARER_ROUNDS; r++) {
		for (i = 0; i < SHARER_BATCH; i++) {
			slot[i].released = 0;
			if (percpu_ref_init(&slot[i].ref, sharer_release, 0))
				abort();
			percpu_ref_kill(&slot[i].ref);
		}
		sched_yield();
		(void)poll_all();
		for (i = missing = 0; i < SHARER_BATCH; i++)
			missing += slot[i].released != 1;
		if (missing) {	/* the callback thread finishes them */
			__atomic_fetch_add(&rounds_unreleased, 1, __ATOMIC_RELAXED);
			(void)percpu_ref_barrier();
		}
		for (i = 0; i < SHARER_BATCH; i++)
			percpu_ref_exit(&slot[i].ref);
	}
	percpu_ref_poll_unregister();
	return NULL;
}

static void test_threads_share_fences(void)
{
	pthread_t t[SHARERS];
	int i, started = 0;

	for (i = 0; i < SHARERS; i++)
		started += !pthread_create(&t[i], NULL, sharer, NULL);
	for (i = 0; i < started; i++)
		pthread_join(t[i], NULL);
	is(started, SHARERS, "sharing: threads");
	is(__atomic_load_n(&rounds_unreleased, __ATOMIC_RELAXED), 0,
	   "threads sharing fences: each round's kills all released by its waiting polls");
}

/* A thread that registers, kills @ref, then does @how. */
enum leave { LEAVE_EXIT, LEAVE_UNREGISTER, LEAVE_BLOCK };
static sem_t killed, go_on;
static enum leave leave_how;

static void *killer(void *arg)
{
	struct percpu_ref *ref = arg;

	if (percpu_ref_poll_register())
		return NULL;
	percpu_ref_kill(ref);
	if (leave_how == LEAVE_UNREGISTER)
		percpu_ref_poll_unregister();
	sem_post(&killed);
	if (leave_how != LEAVE_EXIT)
		sem_wait(&go_on);
	if (leave_how == LEAVE_BLOCK)
		is(percpu_ref_poll(PERCPU_REF_POLL_WAIT), 0,
		   "block: the barrier had taken the thread's kill over");
	return NULL;
}

static void test_handed_over(enum leave how, const char *what)
{
	struct percpu_ref ref;
	pthread_t t;

	releases = 0;
	leave_how = how;
	ok(!percpu_ref_init(&ref, count_release, 0), "%s: init", what);
	ok(!pthread_create(&t, NULL, killer, &ref), "%s: thread", what);
	sem_wait(&killed);
	if (how == LEAVE_EXIT)
		pthread_join(t, NULL);
	if (how == LEAVE_BLOCK)
		is(percpu_ref_barrier(), 0, "%s: barrier", what);
	ok(released_within(1) && !pthread_equal(released_on, t) &&
	   !pthread_equal(released_on, pthread_self()),
	   "%s: the callback thread finishes the kill", what);
	if (how != LEAVE_EXIT) {
		sem_post(&go_on);
		pthread_join(t, NULL);
	}
	percpu_ref_exit(&ref);
}

#ifndef __SANITIZE_THREAD__	/* TSan ends its view of a thread from a key destructor */
/*
 * A thread registered and left, so the library's exit hook ran at its exit;
 * then one of its key destructors registers again and kills.  The hook had
 * to be armed again: the kill waited on a queue nobody would poll until a
 * barrier.
 */
static pthread_key_t late_key;
static int late_register_ret = 1;

static void late_register_and_kill(void *ref)
{
	late_register_ret = percpu_ref_poll_register();
	percpu_ref_kill(ref);
}

static void *register_leave_and_arm(void *ref)
{
	percpu_ref_poll_register();
	percpu_ref_poll_unregister();
	pthread_setspecific(late_key, ref);
	return NULL;
}

static void test_register_in_key_destructor(void)
{
	struct percpu_ref ref;
	pthread_t t;

	releases = 0;
	pthread_key_create(&late_key, late_register_and_kill);
	ok(!percpu_ref_init(&ref, count_release, 0), "late: init");
	pthread_create(&t, NULL, register_leave_and_arm, &ref);
	pthread_join(t, NULL);
	is(late_register_ret, 0, "late: registered from a key destructor after the exit hook ran");
	ok(released_within(1) && !pthread_equal(released_on, t),
	   "late: its kill is handed to the callback thread, no barrier needed");
	percpu_ref_barrier();
	percpu_ref_exit(&ref);
	pthread_key_delete(late_key);
}
#endif

/* switch_to_percpu waits for the asynchronous switch queued on our own
 * thread: it hands that switch over instead of waiting for ever. */
static void test_wait_for_own_switch(void)
{
	struct percpu_ref ref;

	confirmed = 0;
	is(percpu_ref_poll_register(), 0, "own switch: register");
	ok(!percpu_ref_init(&ref, NULL, PERCPU_REF_ALLOW_REINIT), "own switch: init");
	percpu_ref_switch_to_atomic(&ref, note_confirm);
	percpu_ref_switch_to_percpu(&ref);
	ok(__atomic_load_n(&confirmed, __ATOMIC_SEQ_CST),
	   "switch_to_percpu after an asynchronous switch on a polling thread returns, confirmed");
	is(percpu_ref_poll(PERCPU_REF_POLL_WAIT), 0, "nothing left to poll");
	percpu_ref_exit(&ref);
	is(percpu_ref_poll_unregister(), 0, "own switch: unregister");
}

/*
 * A wait for one switch in flight hands over that switch only: a polling
 * thread switches @x (asynchronously) and kills @y, then blocks; our
 * switch_to_percpu(x) returns, and y stays on that thread's queue, for
 * its own poll.  (Handing over every queue finished y on the callback
 * thread.)
 */
static sem_t targeted_queued, targeted_go;
static struct percpu_ref targeted_x, targeted_y;

static void *switch_and_kill(void *arg)
{
	(void)arg;
	if (percpu_ref_poll_register())
		return NULL;
	percpu_ref_switch_to_atomic(&targeted_x, note_confirm);
	percpu_ref_kill(&targeted_y);
	sem_post(&targeted_queued);
	sem_wait(&targeted_go);
	(void)poll_all();
	percpu_ref_poll_unregister();
	return NULL;
}

static void test_wait_hands_over_one(void)
{
	pthread_t t;

	releases = 0;
	confirmed = 0;
	sem_init(&targeted_queued, 0, 0);
	sem_init(&targeted_go, 0, 0);
	ok(!percpu_ref_init(&targeted_x, NULL, PERCPU_REF_ALLOW_REINIT) &&
	   !percpu_ref_init(&targeted_y, count_release, 0), "one: init");
	ok(!pthread_create(&t, NULL, switch_and_kill, NULL), "one: thread");
	sem_wait(&targeted_queued);
	percpu_ref_switch_to_percpu(&targeted_x);
	ok(__atomic_load_n(&confirmed, __ATOMIC_SEQ_CST),
	   "switch_to_percpu waits for the other thread's queued switch, handed over");
	usleep(50000);
	is(nr_released(), 0, "the other kill stays on that thread's queue");
	sem_post(&targeted_go);
	pthread_join(t, NULL);
	ok(nr_released() == 1 && pthread_equal(released_on, t),
	   "and that thread's own poll finishes it");
	percpu_ref_exit(&targeted_x);
	percpu_ref_exit(&targeted_y);
}

/*
 * The switch handed over is the last of our own queue, then one in its
 * middle: what we queue next still goes on the queue and is finished by
 * our polls.  (With the queue's tail left on the item handed over, the
 * next kill was linked behind it and lost.)
 */
static void test_hand_over_last_and_middle(void)
{
	struct percpu_ref x, y[4];
	int i;

	releases = 0;
	is(percpu_ref_poll_register(), 0, "tail: register");
	ok(!percpu_ref_init(&x, NULL, PERCPU_REF_ALLOW_REINIT), "tail: init");
	for (i = 0; i < 4; i++)
		ok(!percpu_ref_init(&y[i], count_release, 0), "tail: init %d", i);
	percpu_ref_kill(&y[0]);
	percpu_ref_switch_to_atomic(&x, NULL);		/* last on the queue */
	percpu_ref_switch_to_percpu(&x);
	percpu_ref_kill(&y[1]);
	percpu_ref_switch_to_atomic(&x, NULL);
	percpu_ref_kill(&y[2]);				/* x in the middle */
	percpu_ref_switch_to_percpu(&x);
	percpu_ref_kill(&y[3]);
	is(poll_all(), 4, "the kills queued around two hand-overs are all finished here");
	is(nr_released(), 4, "tail: all released");
	percpu_ref_exit(&x);
	for (i = 0; i < 4; i++)
		percpu_ref_exit(&y[i]);
	is(percpu_ref_poll_unregister(), 0, "tail: unregister");
}

/*
 * Within interval_case(): a waiting poll that finished one returns,
 * fencing only if one is due; it waits only when none can be finished.
 * c's kill is covered by the fence of a sync switch, d's is not, and no
 * fence is due for 1 s: a poll that returns within it and finished d too
 * waited for d.  One that took longer (a stall) proves nothing; tried
 * again, 5 times at most.  Exit status: 7 it waited for d too.
 */
static int wait_after_one_case(void)
{
	struct percpu_ref c, d, other;
	int attempt;

	for (attempt = 0; attempt < 5; attempt++) {
		int released = nr_released(), polled, ret = 0;
		uint64_t start;
		bool judged;

		if (percpu_ref_init(&c, count_release, 0) ||
		    percpu_ref_init(&d, count_release, 0) || percpu_ref_init(&other, NULL, 0))
			return 2;
		percpu_ref_kill(&c);
		start = now_ns();
		percpu_ref_switch_to_atomic_sync(&other);
		percpu_ref_kill(&d);
		polled = percpu_ref_poll(PERCPU_REF_POLL_WAIT);
		judged = now_ns() - start < 900000000u;
		if (judged && polled != 1)
			ret = 7;
		if (poll_all() < 0 || nr_released() != released + 2)
			ret = ret ? ret : 6;
		percpu_ref_exit(&c);
		percpu_ref_exit(&d);
		percpu_ref_exit(&other);
		if (ret || judged)
			return ret;
	}
	printf("# a waiting poll after one: 5 polls slower than 0.9 s, not judged\n");
	return 0;
}

/*
 * PERCPUREF_POLL_INTERVAL_US (in a child run with it set to 1 s): a
 * waiting poll fences at once, but plain polls start no fence for 500 ms
 * after it (at the default 300 µs they finished the next kill at once;
 * once, under two test runs at once on two CPUs, not within 200 ms).  Half
 * the interval: a stall of up to 500 ms, before the loop or in it, fails
 * neither run.
 * Exit status: 2 set-up, 3 the waiting poll, 4 a plain poll finished
 * one, 5 the count, 6 the last waiting poll (7: wait_after_one_case()).
 */
static int interval_case(void)
{
	struct percpu_ref a, b;
	uint64_t until;
	int ret = 0;

	releases = 0;
	if (percpu_ref_poll_register() || percpu_ref_init(&a, count_release, 0))
		return 2;
	if (percpu_ref_init(&b, count_release, 0)) {
		percpu_ref_exit(&a);
		return 2;
	}
	percpu_ref_kill(&a);
	if (poll_all() != 1)
		ret = 3;
	percpu_ref_kill(&b);
	for (until = now_ns() + UINT64_C(500000000); !ret && now_ns() < until; usleep(1000))
		if (percpu_ref_poll(0) != 0)
			ret = 4;
	if (!ret && nr_released() != 1)
		ret = 5;
	/* Both finished either way, so that nothing leaks. */
	if (poll_all() < 0 || nr_released() != 2)
		ret = ret ? ret : 6;
	percpu_ref_exit(&a);
	percpu_ref_exit(&b);
	if (!ret)
		ret = wait_after_one_case();
	return ret;
}

static void test_interval_setting(void)
{
	int ret;

	setenv("PERCPUREF_POLL_INTERVAL_US", "1000000", 1);
	ret = run_mode("interval");
	unsetenv("PERCPUREF_POLL_INTERVAL_US");
	is(ret, 0, "PERCPUREF_POLL_INTERVAL_US=1000000: plain polls wait for the interval");
	is(run_mode("interval"), 4, "and without it they fence every 300 µs");
}

/* A confirm callback on the callback thread (a library thread) may not
 * register.  (A @release might run on the killer instead: its put may come
 * after the switch finished.) */
static int library_register_ret = 1;

static void confirm_registers(struct percpu_ref *ref)
{
	(void)ref;
	library_register_ret = percpu_ref_poll_register();
}

static void test_library_thread_refused(void)
{
	struct percpu_ref ref;

	ok(!percpu_ref_init(&ref, NULL, PERCPU_REF_ALLOW_REINIT), "library: init");
	percpu_ref_switch_to_atomic(&ref, confirm_registers);
	is(percpu_ref_barrier(), 0, "library: barrier");
	is(library_register_ret, -EPERM, "register on the callback thread: -EPERM");
	percpu_ref_exit(&ref);
}

/*
 * A barrier waits for what another polling thread's poll has taken: its
 * first kill's @release waits on a semaphore, its second is taken, not
 * started.  (A barrier that only took the queues over returned at once.)
 */
static sem_t in_first_release, first_release_go;
static struct percpu_ref taken_first, taken_second;
static struct percpu_ref *taken[] = { &taken_first, &taken_second };
static int barrier_done;

static void first_release_waits(struct percpu_ref *ref)
{
	sem_post(&in_first_release);
	sem_wait(&first_release_go);
	count_release(ref);
}

/* A polling thread: kills the two refs at @arg and finishes them; the
 * first's @release runs with the second taken by the same poll. */
static void *kill_two_and_poll(void *arg)
{
	struct percpu_ref **refs = arg;

	if (percpu_ref_poll_register())
		return NULL;
	percpu_ref_kill(refs[0]);
	percpu_ref_kill(refs[1]);
	(void)poll_all();
	percpu_ref_poll_unregister();
	return NULL;
}

static void *barrier_caller(void *arg)
{
	(void)arg;
	if (!percpu_ref_barrier())
		__atomic_store_n(&barrier_done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

static void test_barrier_waits_for_taken(void)
{
	pthread_t poller, caller;
	int early;

	releases = 0;
	sem_init(&in_first_release, 0, 0);
	sem_init(&first_release_go, 0, 0);
	ok(!percpu_ref_init(&taken_first, first_release_waits, 0) &&
	   !percpu_ref_init(&taken_second, count_release, 0), "taken: init");
	ok(!pthread_create(&poller, NULL, kill_two_and_poll, taken), "taken: poller");
	sem_wait(&in_first_release);
	ok(!pthread_create(&caller, NULL, barrier_caller, NULL), "taken: barrier thread");
	usleep(100000);
	early = __atomic_load_n(&barrier_done, __ATOMIC_SEQ_CST);
	sem_post(&first_release_go);
	pthread_join(caller, NULL);
	pthread_join(poller, NULL);
	ok(!early && barrier_done, "the barrier returned only after the poll finished what it took");
	is(nr_released(), 2, "taken: both released");
	percpu_ref_exit(&taken_first);
	percpu_ref_exit(&taken_second);
}

/*
 * Fork.  A polling thread, paused in a @release that waits for user_lock
 * (which the forking thread holds), has another kill left in its poll; the
 * forking thread has one of its own queued.  The child must finish both,
 * and not the paused one (the parent's thread's).
 */
static pthread_mutex_t user_lock = PTHREAD_MUTEX_INITIALIZER;
static int in_release;
static struct percpu_ref paused_ref, rest_ref, forker_ref, idle_ref;
static struct percpu_ref *paused_then_rest[] = { &paused_ref, &rest_ref };
static sem_t idle_killed, idle_go;

static void release_waits(struct percpu_ref *ref)
{
	__atomic_store_n(&in_release, 1, __ATOMIC_SEQ_CST);
	pthread_mutex_lock(&user_lock);
	pthread_mutex_unlock(&user_lock);
	count_release(ref);
}


/* Another polling thread, with a kill queued and not polled at the fork. */
static void *idle_poller(void *arg)
{
	(void)arg;
	if (percpu_ref_poll_register())
		return NULL;
	percpu_ref_kill(&idle_ref);
	sem_post(&idle_killed);
	sem_wait(&idle_go);
	(void)poll_all();
	percpu_ref_poll_unregister();
	return NULL;
}

static int fork_case(void)
{
	pthread_t t, idle;
	pid_t pid;
	int status;

	releases = 0;
	if (percpu_ref_init(&paused_ref, release_waits, 0) ||
	    percpu_ref_init(&rest_ref, count_release, 0) ||
	    percpu_ref_init(&forker_ref, count_release, 0) ||
	    percpu_ref_init(&idle_ref, count_release, 0) || percpu_ref_poll_register())
		return 2;
	sem_init(&idle_killed, 0, 0);
	sem_init(&idle_go, 0, 0);
	if (pthread_create(&idle, NULL, idle_poller, NULL))
		return 2;
	sem_wait(&idle_killed);
	percpu_ref_kill(&forker_ref);
	pthread_mutex_lock(&user_lock);
	if (pthread_create(&t, NULL, kill_two_and_poll, paused_then_rest))
		return 2;
	while (!__atomic_load_n(&in_release, __ATOMIC_SEQ_CST))
		usleep(1000);
	usleep(20000);
	pid = fork();
	if (pid == 0) {
		child_deadline(DEADLINE_S / 2);
		/* Ours: still on our queue.  The paused poll's rest and the
		 * idle thread's queue went to the callback thread, which may
		 * finish them first. */
		if (percpu_ref_poll(PERCPU_REF_POLL_WAIT) != 1)
			_exit(4);
		if (percpu_ref_barrier() || nr_released() != 3)
			_exit(5);
		_exit(0);
	}
	pthread_mutex_unlock(&user_lock);
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return 3;
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
	pthread_join(t, NULL);
	sem_post(&idle_go);
	pthread_join(idle, NULL);
	if (percpu_ref_poll(PERCPU_REF_POLL_WAIT) != 1 || nr_released() != 4)
		return 6;
	return 0;
}

static void test_fork(void)
{
	pid_t pid;

	if (UNDER_TSAN || UNDER_VALGRIND) {
		ok(1, "fork: skipped under ThreadSanitizer and valgrind");
		return;
	}
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		child_deadline(DEADLINE_S);
		_exit(fork_case());
	}
	/* 2: set-up; 3: fork; 4: the child's own kill; 5: the other
	 * threads' rest and queue; 6: the parent after; 128 + n: signal n
	 * (14: hang). */
	is(wait_child(pid), 0, "fork: the child finishes its own queue, the paused poll's rest and "
	   "another polling thread's queue");
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "interval")) {
		child_deadline(DEADLINE_S);
		return interval_case();
	}
	child_deadline(DEADLINE_S);
	sem_init(&killed, 0, 0);
	sem_init(&go_on, 0, 0);
	test_errors();
	test_own_thread_finishes();
	test_callback_calls_back();
	test_confirm_polls();
	test_threads_share_fences();
	test_handed_over(LEAVE_EXIT, "exit");
	test_handed_over(LEAVE_UNREGISTER, "unregister");
	test_handed_over(LEAVE_BLOCK, "block");
#ifndef __SANITIZE_THREAD__
	test_register_in_key_destructor();
#endif
	test_wait_for_own_switch();
	test_wait_hands_over_one();
	test_hand_over_last_and_middle();
	test_interval_setting();
	test_barrier_waits_for_taken();
	test_library_thread_refused();
	test_fork();
	return done_testing();
}
