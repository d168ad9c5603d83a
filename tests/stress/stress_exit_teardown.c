/* SPDX-License-Identifier: MIT */
/*
 * stress_exit_teardown.c - randomized teardown at process exit (review
 * 182's harness, adopted in 0.4.33).  Each run is a child process (a seed,
 * run_mode("--seed=N")) that builds a random forest of objects, each
 * embedding a percpu_ref or a percpu_rcuref (managed, reinitable, atomic at
 * init, with an extra reference or not), and tears the roots down from an
 * atexit() handler registered before the library's first use, so run
 * after the library's exit handler on the exiting thread.  Each object is
 * let go of by its owner's @release (a kill; a kill with a confirm that
 * lets go of other objects; a kill then a put; a managed ref's put; an
 * unmanage then a kill), and its @release lets go of its children, exits
 * its ref and frees it.  Meanwhile 0-2 readers look the percpu_rcuref
 * objects up under the read lock and tryget and put them, and another
 * thread may fork (not where fork children are untestable: TSan,
 * valgrind), its child calling a barrier.
 *
 * Checked (docs/percpu_ref.md, "At process exit"): every object no reader
 * held is released exactly once, on the exiting thread, before the call
 * on its root returns, its confirm run once; every object, readers' ones
 * included, exactly once after barriers; @unpublish before @release; the
 * fork child ends well; no library warning (ctest fails the test on any
 * "percpuref: " line).  The driver runs seeds for STRESS_SECONDS (default
 * 2); a failing seed is printed, and runs alone with --seed=N.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "child.h"
#include "fork_gate.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_rcuref.h"
#include "percpuref/percpu_ref.h"
#include "rnd.h"
#include "tap.h"

#define MAXN 400
#define MAXC 8

enum { K_REF, K_RCU };
enum { LG_KILL, LG_KILL_CONFIRM, LG_PUT_MANAGED, LG_UNMANAGE_KILL, LG_KILL_THEN_PUT };

struct obj {
	union {
		struct percpu_ref ref;
		struct percpu_rcuref rc;
	};
	int id;
};

struct rec {
	int kind, managed, reinit, atomic, extra, how;
	int parent, via_confirm; /* parent's confirm lets go of it */
	int nchild, child[MAXC];
	int nconf, conf[MAXC];
	struct obj *o;
	int released, unpublished, confirmed; /* atomic */
	int rel_on_exit_thread, rel_in_call;
	int touched; /* a reader held it during teardown */
};

static int N;
static struct rec R[MAXN];
static struct obj *pub[MAXN];	/* atomic */
static int roots[MAXN], nroots;
static pthread_t exit_thread;
/* The harness's flags and counts: sequentially consistent throughout (the
 * checks compare what different threads wrote; nothing is timed by them). */
static int in_call, teardown_started, stop; /* atomic */
static int reader_released;	/* atomic: a reader's put may have released */
static int readers_putting;	/* atomic: readers inside such a put */
static unsigned int rng;	/* the seed's sequence (rnd.h) */
static int nreaders, do_fork;
static unsigned long long seed0;
static pthread_t readers[2], forker;
static int ack[3];
static int fork_status = -1;
static const char *where = "";

/* One of 0 .. @n - 1 from the seed's sequence. */
static unsigned pick(unsigned n)
{
	return rnd(&rng) % n;
}

static void dump_chain(int id)
{
	for (int p = id; p >= 0; p = R[p].parent) {
		struct rec *r = &R[p];
		printf("  obj %d kind=%s managed=%d reinit=%d atomic=%d extra=%d how=%d via_confirm=%d nchild=%d nconf=%d released=%d unpub=%d conf=%d onexit=%d incall=%d touched=%d\n",
		       p, r->kind == K_REF ? "ref" : "rcu", r->managed, r->reinit, r->atomic, r->extra, r->how,
		       r->via_confirm, r->nchild, r->nconf, r->released, r->unpublished, r->confirmed,
		       r->rel_on_exit_thread, r->rel_in_call, r->touched);
	}
}

static void fail(int k, const char *fmt, int a, int b)
{
	printf("FAIL check %d (%s): ", k, where);
	printf(fmt, a, b);
	printf("\n");
	if (k != 1 && a >= 0 && a < N)
		dump_chain(a);
	fflush(stdout);
	_exit(10 + k);
}

static void let_go(int id);

static void note_release(int id)
{
	struct rec *r = &R[id];
	int n = __atomic_add_fetch(&r->released, 1, __ATOMIC_SEQ_CST);
	if (n != 1)
		fail(1, "obj %d released %d times", id, n);
	r->rel_on_exit_thread = pthread_equal(pthread_self(), exit_thread);
	r->rel_in_call = __atomic_load_n(&in_call, __ATOMIC_SEQ_CST);
}

static void release_children(int id)
{
	struct rec *r = &R[id];
	for (int i = 0; i < r->nchild; i++)
		let_go(r->child[i]);
	if (r->kind == K_RCU)	/* no confirm: overflow children go here */
		for (int i = 0; i < r->nconf; i++)
			let_go(r->conf[i]);
}

static void ref_release(struct percpu_ref *ref)
{
	struct obj *o = (struct obj *)ref;
	int id = o->id;
	note_release(id);
	release_children(id);
	percpu_ref_exit(&o->ref);
	memset(o, 0xa5, sizeof(*o));
	free(o);
}

static void ref_confirm(struct percpu_ref *ref)
{
	struct obj *o = (struct obj *)ref;
	int id = o->id;
	struct rec *r = &R[id];
	__atomic_add_fetch(&r->confirmed, 1, __ATOMIC_SEQ_CST);
	for (int i = 0; i < r->nconf; i++)
		let_go(r->conf[i]);
}

static void rcu_unpublish(struct percpu_rcuref *rc)
{
	struct obj *o = (struct obj *)rc;
	__atomic_store_n(&pub[o->id], NULL, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&R[o->id].unpublished, 1, __ATOMIC_SEQ_CST);
}

static void rcu_release(struct percpu_rcuref *rc)
{
	struct obj *o = (struct obj *)rc;
	int id = o->id;
	if (!R[id].unpublished)
		fail(2, "obj %d released before unpublish %d", id, 0);
	note_release(id);
	release_children(id);
	percpu_rcuref_exit(&o->rc);
	memset(o, 0xa5, sizeof(*o));
	free(o);
}

static void let_go(int id)
{
	struct rec *r = &R[id];
	struct obj *o = r->o;
	if (r->kind == K_REF) {
		switch (r->how) {
		case LG_KILL: percpu_ref_kill(&o->ref); break;
		case LG_KILL_CONFIRM: percpu_ref_kill_and_confirm(&o->ref, ref_confirm); break;
		case LG_PUT_MANAGED: percpu_ref_put(&o->ref); break;
		case LG_UNMANAGE_KILL: {
			int e = percpu_ref_switch_to_unmanaged(&o->ref);
			if (e)
				fail(3, "obj %d switch_to_unmanaged %d", id, e);
			if (r->nconf)
				percpu_ref_kill_and_confirm(&o->ref, ref_confirm);
			else
				percpu_ref_kill(&o->ref);
			break;
		}
		case LG_KILL_THEN_PUT:
			if (r->nconf)
				percpu_ref_kill_and_confirm(&o->ref, ref_confirm);
			else
				percpu_ref_kill(&o->ref);
			percpu_ref_put(&o->ref);
			break;
		}
	} else {
		switch (r->how) {
		case LG_KILL: percpu_rcuref_kill(&o->rc); break;
		case LG_PUT_MANAGED: percpu_rcuref_put(&o->rc); break;
		case LG_UNMANAGE_KILL: {
			int e = percpu_rcuref_switch_to_unmanaged(&o->rc);
			if (e)
				fail(3, "obj %d rcu switch_to_unmanaged %d", id, e);
			percpu_rcuref_kill(&o->rc);
			break;
		}
		case LG_KILL_THEN_PUT:
			percpu_rcuref_kill(&o->rc);
			percpu_rcuref_put(&o->rc);
			break;
		}
	}
}

/*
 * Whether id's release may have gone to the library's threads: a reader
 * held it or an owner above it (their last put may be a reader's), or a
 * reader's put may have released some object, whose release the reclaimer
 * then runs: while it does, the exiting thread's percpu_rcuref releases
 * are queued too, as docs/percpu_ref.md says.  Those are checked after
 * the barriers only.
 */
static int excused(int id)
{
	if (__atomic_load_n(&reader_released, __ATOMIC_SEQ_CST) ||
	    __atomic_load_n(&readers_putting, __ATOMIC_SEQ_CST))
		return 1;
	for (int p = id; p >= 0; p = R[p].parent)
		if (__atomic_load_n(&R[p].touched, __ATOMIC_SEQ_CST))
			return 1;
	return 0;
}

static void check_subtree(int id, int root)
{
	struct rec *r = &R[id];
	if (!excused(id)) {
		if (__atomic_load_n(&r->released, __ATOMIC_SEQ_CST) != 1)
			fail(4, "obj %d (root %d) not released when teardown returned", id, root);
		if (!r->rel_on_exit_thread)
			fail(5, "obj %d (root %d) released off the exiting thread", id, root);
		if (!r->rel_in_call)
			fail(6, "obj %d (root %d) released outside handler call", id, root);
		if (r->how == LG_KILL_CONFIRM || (r->nconf && r->kind == K_REF))
			if (__atomic_load_n(&r->confirmed, __ATOMIC_SEQ_CST) != 1)
				fail(7, "obj %d confirmed %d", id, r->confirmed);
	}
	for (int i = 0; i < r->nchild; i++)
		check_subtree(r->child[i], root);
	for (int i = 0; i < r->nconf; i++)
		check_subtree(r->conf[i], root);
}

static void *reader(void *arg)
{
	unsigned int s = (unsigned int)((uintptr_t)arg * 7919 + 1);
	int me = (int)((uintptr_t)arg % 3);
	while (!__atomic_load_n(&stop, __ATOMIC_SEQ_CST)) {
		/* ack: no hold of an earlier iteration is still in flight */
		int ts = __atomic_load_n(&teardown_started, __ATOMIC_SEQ_CST);
		__atomic_store_n(&ack[me], ts, __ATOMIC_SEQ_CST);
		int i = (int)(rnd(&s) % (unsigned)N);
		if (R[i].kind != K_RCU)
			continue;
		percpu_rcuref_read_lock();
		struct obj *o = __atomic_load_n(&pub[i], __ATOMIC_SEQ_CST);
		if (ts && o)	/* mark before the tryget: checks see it */
			__atomic_store_n(&R[i].touched, 1, __ATOMIC_SEQ_CST);
		if (o && percpu_rcuref_tryget(&o->rc)) {
			percpu_rcuref_read_unlock();
			if (rnd(&s) & 1)
				sched_yield();
			/* Counted while it may release and not yet say so. */
			__atomic_add_fetch(&readers_putting, 1, __ATOMIC_SEQ_CST);
			percpu_rcuref_put(&o->rc);
			/* Zero reached by now, if by this put (@unpublish runs
			 * before the put that reaches zero returns). */
			if (__atomic_load_n(&R[i].unpublished, __ATOMIC_SEQ_CST))
				__atomic_store_n(&reader_released, 1, __ATOMIC_SEQ_CST);
			__atomic_sub_fetch(&readers_putting, 1, __ATOMIC_SEQ_CST);
		} else {
			percpu_rcuref_read_unlock();
		}
	}
	return NULL;
}

static void *fork_thread(void *arg)
{
	(void)arg;
	while (!__atomic_load_n(&teardown_started, __ATOMIC_SEQ_CST) &&
	       !__atomic_load_n(&stop, __ATOMIC_SEQ_CST))
		sched_yield();
	usleep(pick(200));
	/* Under qemu-user: after the library's exit handler's joins let
	 * go of the emulator's lock (tests/fork_gate.h). */
	if (UNDER_EMULATOR)
		fork_gate_settle();
	/* This process's own deadline after the child's, so that it is
	 * here to kill a child its alarm did not end. */
	child_deadline_rearm(25);
	pid_t pid = fork();
	if (pid == 0) {
		alarm(10);
		int e = percpu_rcuref_barrier();
		(void)e;
		_exit(0);
	}
	if (pid < 0)
		return NULL;
	/* A child its alarm did not end is killed 2 s after it. */
	int status;
	bool overdue;

	if (waitpid_within(pid, &status, 12, &overdue) != pid)
		fork_status = -1;
	else if (overdue)
		fork_status = -2;
	else
		fork_status = child_exit_code(status);
	return NULL;
}

static void late_handler(void)
{
	exit_thread = pthread_self();
	where = "teardown";
	__atomic_store_n(&teardown_started, 1, __ATOMIC_SEQ_CST);
	for (int i = 0; i < nreaders; i++)
		while (!__atomic_load_n(&ack[(int)((seed0 * 3 + i) % 3)], __ATOMIC_SEQ_CST))
			sched_yield();
	for (int k = 0; k < nroots; k++) {
		int id = roots[k];
		__atomic_store_n(&in_call, 1, __ATOMIC_SEQ_CST);
		let_go(id);
		__atomic_store_n(&in_call, 0, __ATOMIC_SEQ_CST);
		check_subtree(id, id);
	}
	where = "after join";
	/* Under qemu-user (and ASan) the fork comes before any reader
	 * ends: a fork while a thread exits leaves the emulator's child
	 * stuck, and ASan's on an allocator lock (fork_gate.h).  Natively
	 * the readers' ends race it. */
	if (do_fork && fork_gate_thread_ends())
		pthread_join(forker, NULL);
	__atomic_store_n(&stop, 1, __ATOMIC_SEQ_CST);
	for (int i = 0; i < nreaders; i++)
		pthread_join(readers[i], NULL);
	if (do_fork) {
		if (!fork_gate_thread_ends())
			pthread_join(forker, NULL);
		if (fork_status != 0)
			fail(8, fork_status == -2 ? "fork child still running 2 s after its alarm: "
						    "killed (%d %d)"
						  : "fork child status %d %d",
			     fork_status, 0);
	}
	/* Excused ones may have gone to the library threads: wait for them. */
	/* chains alternate between the two queues: one round per level */
	for (int round = 0; round < N + 1; round++) {
		int e1 = percpu_rcuref_barrier();
		int e2 = percpu_ref_barrier();
		if (e1 || e2)
			fail(9, "barriers %d %d", e1, e2);
	}
	for (int i = 0; i < N; i++)
		if (__atomic_load_n(&R[i].released, __ATOMIC_SEQ_CST) != 1)
			fail(10, "obj %d released %d after barriers", i, R[i].released);
	int nt = 0;
	for (int i = 0; i < N; i++)
		nt += R[i].touched;
	printf("OK N=%d roots=%d touched=%d readers=%d fork=%d\n", N, nroots, nt, nreaders, do_fork);
	fflush(stdout);
}

static int seed_main(unsigned long long seed)
{
	child_deadline(20);
	seed0 = seed;
	rng = (unsigned int)(seed * 2654435761ULL + 12345);
	atexit(late_handler); /* before the library's first use */
	setvbuf(stdout, NULL, _IOLBF, 0);

	N = 1 + pick(seed & 1 ? 40 : 200);
	nroots = 0;
	for (int i = 0; i < N; i++) {
		struct rec *r = &R[i];
		r->kind = pick(2) ? K_RCU : K_REF;
		r->managed = pick(3) == 0;
		r->reinit = pick(3) == 0;
		r->atomic = !r->managed && pick(6) == 0;
		r->parent = -1;
		/* choose owner */
		if (i == 0 || pick(5) == 0) {
			roots[nroots++] = i;
		} else {
			int p = pick(i);
			/* attach as confirm-child when p is a killed percpu_ref with room */
			int tries = 0;
			while ((R[p].nchild >= MAXC && R[p].nconf >= MAXC) && tries++ < 10)
				p = pick(i);
			if (R[p].nchild >= MAXC && R[p].nconf >= MAXC) {
				roots[nroots++] = i;
			} else {
				r->parent = p;
				if (R[p].kind == K_REF && !R[p].managed && R[p].nconf < MAXC && pick(2))
					R[p].conf[R[p].nconf++] = i, r->via_confirm = 1;
				else if (R[p].nchild < MAXC)
					R[p].child[R[p].nchild++] = i;
				else
					R[p].conf[R[p].nconf++] = i, r->via_confirm = 1;
			}
		}
	}
	/* Decide how each is let go; managed ones with confirm-children unmanage+kill. */
	for (int i = 0; i < N; i++) {
		struct rec *r = &R[i];
		if (r->managed) {
			if (r->nconf || pick(3) == 0)
				r->how = LG_UNMANAGE_KILL;
			else
				r->how = LG_PUT_MANAGED;
		} else if (r->kind == K_REF) {
			if (r->nconf)
				r->how = pick(3) ? LG_KILL_CONFIRM : LG_KILL_THEN_PUT;
			else
				r->how = pick(3) ? LG_KILL : LG_KILL_THEN_PUT;
		} else {
			r->how = pick(3) ? LG_KILL : LG_KILL_THEN_PUT;
		}
		if (r->how == LG_KILL_THEN_PUT)
			r->extra = 1;
	}
	/* Shuffle child orders. */
	for (int i = 0; i < nroots; i++) {
		int j = i + pick(nroots - i), t = roots[i];
		roots[i] = roots[j], roots[j] = t;
	}
	for (int i = 0; i < N; i++) {
		struct rec *r = &R[i];
		unsigned fl = (r->reinit ? PERCPU_REF_ALLOW_REINIT : 0) |
			      (r->atomic ? PERCPU_REF_INIT_ATOMIC : 0) |
			      (r->managed ? PERCPU_REF_REL_MANAGED : 0);
		struct obj *o = calloc(1, sizeof(*o));

		if (!o)
			_exit(2);
		o->id = i;
		r->o = o;
		int e;
		if (r->kind == K_REF)
			e = percpu_ref_init(&o->ref, ref_release, fl);
		else
			e = percpu_rcuref_init(&o->rc, rcu_unpublish, rcu_release, fl);
		if (e) {
			printf("init %d failed %d\n", i, e);
			_exit(2);
		}
		if (r->extra) {
			if (r->kind == K_REF)
				percpu_ref_get(&o->ref);
			else
				percpu_rcuref_get(&o->rc);
		}
		if (r->kind == K_RCU)
			__atomic_store_n(&pub[i], o, __ATOMIC_SEQ_CST);
	}
	nreaders = pick(3);
	do_fork = pick(3) == 0 && !fork_children_untestable();
	for (int i = 0; i < nreaders; i++)
		if (pthread_create(&readers[i], NULL, reader, (void *)(uintptr_t)(seed * 3 + i)))
			_exit(2);
	if (do_fork && pthread_create(&forker, NULL, fork_thread, NULL))
		_exit(2);
	if (pick(2))
		percpu_ref_managed_flush();
	usleep(pick(3000));
	return 0;
}

int main(int argc, char **argv)
{
	const char *env = getenv("STRESS_SEED");
	unsigned long long seed = env && *env ? strtoull(env, NULL, 0) : now_ns() % 1000000007;
	double seconds = stress_seconds(2);
	double end = now_seconds() + seconds;
	int runs = 0, failed = 0;
	char mode[64];

	if (argc > 1 && !strncmp(argv[1], "--seed=", 7))
		return seed_main(strtoull(argv[1] + 7, NULL, 0));
	/* The driver makes no library call: each seed's process is fresh. */
	printf("# seeds from %llu, %.1f s\n", seed, seconds);
	do {
		int status;

		snprintf(mode, sizeof(mode), "--seed=%llu", seed + runs);
		status = run_mode(mode);
		if (status) {
			printf("# seed %llu: exit status %d\n", seed + runs, status);
			failed++;
		}
		runs++;
	} while (now_seconds() < end && failed < 3);
	printf("# %d runs\n", runs);
	ok(failed == 0, "every seed's teardown at exit checked out (%d runs)", runs);
	return done_testing();
}
