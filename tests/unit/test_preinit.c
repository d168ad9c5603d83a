/* SPDX-License-Identifier: MIT */
/*
 * test_preinit.c - the per-CPU add called before anything set the library
 * up (this program's first library call): it must take the slow-path exit
 * and write nothing.  Before the x86-64 sequence tested for "no unit" ahead
 * of its rseq_cs store, the zero params word sent that store to %fs:8,
 * glibc's DTV pointer, and the process died at exit in realloc().
 *
 * percpu_ref's own calls skip that test (percpuref_this_cpu_add_after_setup):
 * they rely on every mode word the library writes being written after the
 * runtime was set up, a refused percpu_ref_init() included.  A child whose
 * first library call is such a refused init checks that (and that a child
 * forked before set-up still sizes the fallback readers' units).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "percpuref/percpu_ref.h"
#include "percpuref/this_cpu.h"
#include "tap.h"

#if defined(__x86_64__)
#define IS_X86_64 1
#else
#define IS_X86_64 0
#endif

static __thread int dynamic_tls = 7;	/* touched after the call */

static void no_release(struct percpu_ref *ref)
{
	(void)ref;
}

/*
 * In a child whose first library call this is: 0 when a refused init left
 * its mode word only once the runtime was set up, so that the one call a
 * refused ref allows (tryget_live: false, the word says DEAD) runs the
 * sequence without the pre-set-up test and leaves the TCB alone.
 */
static int refused_init_sets_up(void)
{
	unsigned char before[64], after[64];
	struct percpu_ref ref;

	/* The params word and the TCB head are the x86-64 sequence's. */
	if (IS_X86_64 && percpuref_this_cpu_params != 0)
		return 1;
	if (percpu_ref_init(&ref, no_release, 1u << 30) != -EINVAL)
		return 2;
	if (IS_X86_64 && percpuref_this_cpu_params == 0)
		return 3;
	memcpy(before, __builtin_thread_pointer(), sizeof(before));
	if (percpu_ref_tryget_live(&ref))
		return 4;
	memcpy(after, __builtin_thread_pointer(), sizeof(after));
	/* x86-64's TCB head (tcb, dtv, self); aarch64 keeps TLS above the
	 * thread pointer, where the slow path registers a fallback reader. */
	if (IS_X86_64 && memcmp(before, after, sizeof(before)))
		return 5;
	/* A fallback reader (PERCPUREF_NO_RSEQ=1) forked before set-up still
	 * gets a unit of its own once set up (it once took the atomic count:
	 * the fork had sized the units for 0 CPUs). */
	if (percpu_ref_init(&ref, no_release, 0))
		return 6;
	percpu_ref_get(&ref);
	percpu_ref_put(&ref);
	if (!strcmp(percpuref_fast_path(), "fallback") && percpuref_readers_registered() == 0)
		return 7;
	percpu_ref_exit(&ref);
	return 0;
}

/*
 * In a child whose first library call this is: a get on a ref that was
 * never initialised, in zeroed memory.  The sequence took mode word 0 for
 * per-CPU mode, wrote rseq_cs through the zero params word, and the slow
 * path then loaded through the null data pointer; it now stops with a
 * message.  Returns only if it did not stop.
 */
static void zeroed_ref_get(void)
{
	struct percpu_ref ref;

	memset(&ref, 0, sizeof(ref));
	percpu_ref_get(&ref);
}

/*
 * The same with the mode word of an exited ref (what the C++ bases leave
 * in an object not made by make_owner / make_managed): the sequence wrote
 * rseq_cs just the same, and the slow path took the ref for an exited one
 * and went on with the thread's TLS damaged.  Returns only if it did not
 * stop.
 */
static void unwritten_dead_ref_get(void)
{
	struct percpu_ref ref = { __PERCPU_REF_ATOMIC_DEAD, NULL };

	percpu_ref_get(&ref);
}

/*
 * The same with tryget_live, the one call a refused ref allows, and what
 * ref_ptr<T>::try_acquire_live() makes of a T not made by make_owner /
 * make_managed: its slow path returned false on the DEAD word before it
 * looked at the set-up, and the program went on with the DTV pointer
 * overwritten, to die at exit in realloc() ("invalid pointer").  Returns
 * only if it did not stop.
 */
static void unwritten_dead_ref_tryget_live(void)
{
	struct percpu_ref ref = { __PERCPU_REF_ATOMIC_DEAD, NULL };

	if (percpu_ref_tryget_live(&ref))
		_exit(2);
}

/* The child's stderr contains @needle, and it died of @sig. */
static bool child_stopped_saying(void (*fn)(void), int sig, const char *needle)
{
	char out[512] = "";
	int fds[2], status = -1;
	ssize_t n, len = 0;
	pid_t child;

	if (pipe(fds))
		return false;
	child = fork();
	if (child == 0) {
		dup2(fds[1], STDERR_FILENO);
		fn();
		_exit(0);
	}
	close(fds[1]);
	while (len < (ssize_t)sizeof(out) - 1 &&
	       (n = read(fds[0], out + len, sizeof(out) - 1 - len)) > 0)
		len += n;
	close(fds[0]);
	if (child < 0 || waitpid(child, &status, 0) != child)
		return false;
	for (char *nl = out; (nl = strchr(nl, '\n'));)
		*nl = ' ';	/* one TAP comment line */
	printf("# child status %#x, stderr: %s\n", status, out);
	return WIFSIGNALED(status) && WTERMSIG(status) == sig && strstr(out, needle);
}

int main(void)
{
	uintptr_t flagged = 1;	/* a mode word with a flag: never commits */
	unsigned char before[64], after[64];
	struct percpu_ref ref;
	enum percpuref_this_cpu_result r;
	int status = -1;
	pid_t child;

	/* Nothing of the library set up yet (only its fork handlers are
	 * registered, by constructors, and they take its idle locks). */
	child = fork();
	if (child == 0)
		_exit(refused_init_sets_up());
	if (child > 0 && waitpid(child, &status, 0) != child)
		status = -1;
	ok(child > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	   "a child forked before set-up: a refused percpu_ref_init() sets the runtime up "
	   "before it writes the mode word, and fallback readers get units (child status %#x)",
	   status);
	ok(child_stopped_saying(zeroed_ref_get, SIGABRT, "was never initialised"),
	   "a child whose first call is a get on a zeroed ref stops with a message");
#if PERCPUREF_HAVE_RSEQ && defined(__x86_64__)
	ok(child_stopped_saying(unwritten_dead_ref_get, SIGABRT, "was never initialised"),
	   "a child whose first call is a get on a dead ref the library never wrote stops "
	   "with a message");
	ok(child_stopped_saying(unwritten_dead_ref_tryget_live, SIGABRT, "was never initialised"),
	   "a child whose first call is a tryget_live on a dead ref the library never wrote "
	   "stops with a message");
#else
	/* No sequence wrote anything: an exited ref's warning, no stop. */
	printf("# the dead-ref children are x86-64's (its rseq sequence runs before set-up)\n");
#endif

	/* The thread's TCB head, where glibc keeps tcb, dtv, self. */
	memcpy(before, __builtin_thread_pointer(), sizeof(before));
	r = percpuref_this_cpu_add(&flagged, 1);
	memcpy(after, __builtin_thread_pointer(), sizeof(after));
	ok(r != PERCPUREF_THIS_CPU_DONE, "before set-up: nothing added (result %d)", (int)r);
	ok(!memcmp(before, after, sizeof(before)), "before set-up: the TCB head is untouched");
	ok(dynamic_tls == 7, "TLS still reads");

	is(percpu_ref_init(&ref, no_release, 0), 0, "then a ref works");
	percpu_ref_get(&ref);
	percpu_ref_put(&ref);
	ok(!percpu_ref_is_zero(&ref), "its count is exact");
	percpu_ref_exit(&ref);
	return done_testing();
}
