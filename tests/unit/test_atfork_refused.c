/* SPDX-License-Identifier: MIT */
/*
 * test_atfork_refused.c - pthread_atfork() refused (ENOMEM, its only
 * error) when the library registers its fork handlers at load.  Up to
 * 0.4.30 nothing looked at its answer: the process went on without the
 * handlers, silently, and a fork child whose parent had started the
 * library's callback thread found it "running", queued its kill's switch
 * for it and waited in percpu_ref_barrier() for ever (a review's probe).
 * Now no ref and no library thread can be made until the handlers are
 * registered: each percpu_ref_init() tries again, and while refused
 * returns -ENOMEM (the refusal warned once); each thread start tries
 * again too, and while refused fails as a refused pthread_create() does,
 * its work done by whoever waits for it (a flush with no ref made started
 * the reclaimer, whose fork child's flush then waited for it for ever: a
 * review's probe).  A child forked while its parent's thread held the
 * registration's claim takes the claim over (another review's probe: it
 * read "being registered by another thread" for ever).
 *
 * Linked with --wrap=pthread_atfork (tests/CMakeLists.txt): the library's
 * registration comes here, and the first three are refused (the load's,
 * the flush's thread start's and the first init's).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "child.h"
#include "internal.h"
#include "percpuref/managed.h"
#include "percpuref/percpu_ref.h"
#include "tap.h"

/* Only the library calls it in this program; the load's call comes before
 * any constructor could set a counter, so the counts start here. */
static int refusals_left = 3;
static int registrations_tried;
/* Set: the next registration forks first, its child inheriting the claim
 * of a thread it does not have; the child's exit status. */
static bool fork_amid_registration;
static int amid_registration_status = -1;

static int child_of_registration(void);

int __real_pthread_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void));
int __wrap_pthread_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void))
{
	registrations_tried++;
	if (fork_amid_registration) {
		pid_t pid;

		fork_amid_registration = false;
		pid = fork();
		if (pid == 0)
			_exit(child_of_registration());
		amid_registration_status = wait_child(pid);
	}
	if (refusals_left > 0) {
		refusals_left--;
		return ENOMEM;
	}
	return __real_pthread_atfork(prepare, parent, child);
}

static int releases;

static void count_release(struct percpu_ref *r)
{
	(void)r;
	__atomic_fetch_add(&releases, 1, __ATOMIC_RELAXED);
}

/* Kill @ref and wait for its release: through the callback thread. */
static bool released_after_kill(struct percpu_ref *ref)
{
	int before = __atomic_load_n(&releases, __ATOMIC_RELAXED);

	percpu_ref_kill(ref);
	return percpu_ref_barrier() == 0 &&
	       __atomic_load_n(&releases, __ATOMIC_RELAXED) == before + 1;
}

/* A child forked while its parent's thread held the registration's
 * claim: nobody here will finish it, so the child's own init must take it
 * over (it read "another thread registers" for ever before), register
 * (accepted: refusals are the parent's), and work, forks included. */
static int child_of_registration(void)
{
	struct percpu_ref ref;
	sigset_t none;
	pid_t pid;

	/* A registration from a thread start runs with every signal blocked
	 * (percpuref_start_thread()): the deadline's must get through. */
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	child_deadline(20);
	refusals_left = 0;
	if (percpu_ref_init(&ref, count_release, 0))
		return 20;
	if (!released_after_kill(&ref))
		return 21;
	percpu_ref_exit(&ref);
	pid = fork();
	if (pid == 0)
		_exit(percpuref_fork_generation() == 1 ? 0 : 22);
	return wait_child(pid) ? 23 : 0;
}

/* The child: the parent's callback thread is gone, and the fork handlers
 * must have told the library so. */
static int fork_child(void)
{
	struct percpu_ref ref;

	child_deadline(20);
	if (percpuref_fork_generation() != 1)
		return 10;
	if (percpu_ref_managed_flush())
		return 13;
	if (percpu_ref_init(&ref, count_release, 0))
		return 11;
	if (!released_after_kill(&ref))
		return 12;
	percpu_ref_exit(&ref);
	return 0;
}

int main(void)
{
	struct percpu_ref ref;
	unsigned long warned;
	const char *untestable;
	pid_t pid;

	is(registrations_tried, 1, "load: the fork handlers' registration was tried once");
	is(percpuref_warning_count(), 1UL, "and its refusal warned");

	/* The runtime's set-up first: what it may warn of (a refused
	 * membarrier under qemu-user) is not this test's. */
	(void)percpuref_fast_path();
	warned = percpuref_warning_count();
	is(percpu_ref_managed_flush(), 0, "a flush while the registration is refused: 0");
	ok(registrations_tried == 2 && percpuref_warning_count() > warned,
	   "its reclaimer's start tried again, refused (warned), and it scanned itself");

	untestable = fork_children_untestable();
	fork_amid_registration = !untestable;
	warned = percpuref_warning_count();
	is(percpu_ref_init(&ref, count_release, 0), -ENOMEM,
	   "init while the registration is refused: -ENOMEM");
	ok(percpuref_warning_count() == warned && registrations_tried == 3,
	   "tried again, not warned again (once a process)");
	if (untestable)
		skip("a child forked amid the registration: %s", untestable);
	else
		is(amid_registration_status, 0, "a child forked amid that registration takes "
		   "its claim over, registers and works (before: refused for ever)");
	ok(percpu_ref_is_dying(&ref) && !percpu_ref_tryget(&ref),
	   "and left the ref as a refused init does");

	is(percpu_ref_init(&ref, count_release, 0), 0, "init once it is accepted: 0");
	ok(released_after_kill(&ref), "the ref works (its kill released it)");
	percpu_ref_exit(&ref);
	is(percpu_ref_init(&ref, count_release, 0), 0, "a later init: 0");
	is(registrations_tried, 4, "and registered nothing again");

	untestable = fork_children_untestable();
	if (untestable) {
		skip("the fork child: %s", untestable);
	} else {
		pid = fork();
		if (pid == 0)
			_exit(fork_child());
		is(wait_child(pid), 0, "a fork child's flush returns and its ref is released by "
		   "its kill (generation 1; before, its barrier or flush waited for ever)");
	}
	ok(released_after_kill(&ref), "and the parent's too");
	percpu_ref_exit(&ref);
	return done_testing();
}
