/* SPDX-License-Identifier: MIT */
/*
 * thread_exit.c - run a function when the calling thread exits, before its
 * TLS can go: how the library gives back a thread's rseq area, fallback
 * unit and cached per-CPU counters, and hands a polling thread's queue to
 * the callback thread (rseq_register.c, fallback.c, percpu_alloc.c,
 * deferred.c).
 *
 * glibc's __cxa_thread_atexit_impl, the hook of C++ thread_local
 * destructors, runs on return from the thread function, pthread_exit and
 * cancellation alike, before the pthread key destructors, and so before a
 * sanitizer runtime tears down its view of the thread (ThreadSanitizer
 * does that from a key destructor, after which it no longer sees the
 * thread's locks).  It is looked up weakly.  The hooks live in a
 * per-thread table, run by one __cxa_thread_atexit_impl registration per
 * thread and by one pthread key's destructor, whichever comes first (the
 * other finds the table empty).  The key is the backstop: glibc runs the
 * TLS destructors once, before the key destructors, so a thread whose
 * first registration came from a key destructor (its first library call
 * made there) registered on a list nobody runs again: its fallback unit
 * was never given back, and the fence later read its freed TLS.  A key
 * set from a key destructor has its own destructor run in the next round
 * (PTHREAD_DESTRUCTOR_ITERATIONS); glibc leaks the 32-byte node of the
 * late registration (tests/valgrind.supp, tests/lsan.supp).  glibc 2.36
 * and later end the process when that registration cannot allocate its
 * record (as for any C++ thread_local destructor; docs/percpu_ref.md, "Out
 * of memory").  Where the C library lacks the function (musl) the key
 * alone runs them.  The handle is this library's __dso_handle, which
 * keeps a dlopen()ed library mapped until every thread that registered
 * here has run its hooks.  A fork
 * child's thread keeps its hooks with the rest of its TLS.
 *
 * The key does not outlive the library: it is deleted when the library is
 * unloaded (or the process exits), and glibc then calls no destructor of
 * it.  glibc calls key destructors after the TLS destructors, when nothing
 * holds the library mapped any more: one of the application's, on a lower
 * key, that unloaded a plugin carrying its own copy of the library let
 * this key's run in unmapped memory; and each load of such a plugin took
 * a key for good (1024 in all).  tests/unit/test_unload.c, own-copy.
 *
 * A key set from a key destructor in glibc's last round (the
 * PTHREAD_DESTRUCTOR_ITERATIONS-th) has no next round: such a thread's
 * hooks never run, and nothing can tell it that it registered too late.
 * So what a hook gives back lives on the heap, and its owner holds an
 * owner mark, a robust mutex: glibc registers a robust-futex list for
 * every thread, and at the thread's exit the kernel marks each mutex
 * still on it: FUTEX_OWNER_DIED in its word, which
 * percpuref_owner_mark_orphaned() reads (a trylock, which would return
 * EOWNERDEAD, writes the caller's robust-list state: below).
 * That is the only news of a thread's end that needs nothing of it and
 * reads nothing of its memory (pthread_kill(tid, 0) reads the thread's
 * descriptor, gone with its stack, and a tid is reused).  Ordering: the
 * owner's writes precede its exit, the kernel's atomic update of the
 * futex word follows them, and the load that sees it is an acquire.
 * In a fork child glibc empties the thread's robust list before the
 * child handlers run (ownership is not inherited), so the marks are
 * initialised again there.  Where the kernel keeps no list (qemu-user
 * refuses set_robust_list; glibc then makes no robust mutex either, or one
 * nobody marks) a mark never reads orphaned: what it guards stays taken,
 * as it did before marks existed.
 *
 * Robust marks on glibc only.  Elsewhere a mark is a flag that never reads
 * orphaned: musl's fork child keeps the forking thread's robust list, and
 * a mark initialised again there while on it corrupted it.  Under
 * ThreadSanitizer too: TSan ends its view of a thread in a key destructor,
 * so it misses the unlock of a hook that runs after that, and took the
 * next owner's trylock for a double lock.
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>

#include "internal.h"

#define MAX_HOOKS 4

extern int __cxa_thread_atexit_impl(void (*fn)(void *), void *arg, void *dso)
	__attribute__((weak));
extern void *__dso_handle;

struct exit_hook {
	void (*fn)(void *);
	void *arg;
};

static __thread struct exit_hook hooks[MAX_HOOKS];
static __thread unsigned int nr_hooks;
static __thread bool cxa_registered;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t key;
static bool key_ok;	/* atomic: cleared at unload, before the delete */

static void run_hooks(void *unused)
{
	(void)unused;
	while (nr_hooks > 0) {
		nr_hooks--;
		hooks[nr_hooks].fn(hooks[nr_hooks].arg);
	}
}

static void make_key(void)
{
	/* Relaxed: under key_once, whose pthread_once() orders it (and the
	 * key) before percpuref_at_thread_exit() reads it. */
	__atomic_store_n(&key_ok, pthread_key_create(&key, run_hooks) == 0, __ATOMIC_RELAXED);
}

/*
 * At unload or exit, after the library's other destructors (a lower
 * priority runs later; runtime.c's stops the library's threads, whose
 * hooks run by their TLS destructors).  Relaxed: a thread still calling
 * in while the library is unloaded is the caller's error anyway.
 */
static __attribute__((destructor(101))) void delete_key(void)
{
	if (__atomic_exchange_n(&key_ok, false, __ATOMIC_RELAXED))
		pthread_key_delete(key);
}

bool percpuref_at_thread_exit(void (*fn)(void *), void *arg)
{
	bool armed;

	pthread_once(&key_once, make_key);
	if (nr_hooks == MAX_HOOKS)
		return false;
	/* Any non-NULL value arms the destructor.  Relaxed: see delete_key(). */
	armed = __atomic_load_n(&key_ok, __ATOMIC_RELAXED) &&
		pthread_setspecific(key, hooks) == 0;
	if (__cxa_thread_atexit_impl && !cxa_registered)
		cxa_registered = __cxa_thread_atexit_impl(run_hooks, NULL, &__dso_handle) == 0;
	if (!armed && !cxa_registered)
		return false;
	hooks[nr_hooks].fn = fn;
	hooks[nr_hooks].arg = arg;
	nr_hooks++;
	return true;
}

#if !PERCPUREF_ROBUST_MARKS
void percpuref_owner_mark_init(struct percpuref_owner_mark *mark)
{
	/* Relaxed: no other thread sees the mark yet (a new object, units
	 * at set-up, or a fork child's one thread); the lock or once that
	 * hands it on orders the store, as in the take. */
	__atomic_store_n(&mark->held, false, __ATOMIC_RELAXED);
}

bool percpuref_owner_mark_take(struct percpuref_owner_mark *mark)
{
	bool unowned = false;

	/* Relaxed: the callers' locks order what the mark guards. */
	return __atomic_compare_exchange_n(&mark->held, &unowned, true, false,
					   __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

void percpuref_owner_mark_give_back(struct percpuref_owner_mark *mark)
{
	/* Relaxed: as in the take. */
	__atomic_store_n(&mark->held, false, __ATOMIC_RELAXED);
}

bool percpuref_owner_mark_orphaned(struct percpuref_owner_mark *mark)
{
	(void)mark;
	return false;
}
#else
static pthread_once_t mark_attr_once = PTHREAD_ONCE_INIT;
static pthread_mutexattr_t mark_attr;

static void make_mark_attr(void)
{
	/* Not robust if glibc refuses: then no mark reads orphaned. */
	pthread_mutexattr_init(&mark_attr);
	pthread_mutexattr_setrobust(&mark_attr, PTHREAD_MUTEX_ROBUST);
}

void percpuref_owner_mark_init(struct percpuref_owner_mark *mark)
{
	pthread_once(&mark_attr_once, make_mark_attr);
	if (pthread_mutex_init(&mark->held, &mark_attr) != 0)
		pthread_mutex_init(&mark->held, NULL);	/* never reads orphaned */
}

/*
 * No signal handler between the lock and its enqueue on this thread's
 * robust list: one that forked there left the child thread a mark on its
 * list that it could not unlock (the word holds the parent's thread id),
 * which the owner then freed under the list (a counters cache).  Two
 * system calls, once per thread and object.
 */
bool percpuref_owner_mark_take(struct percpuref_owner_mark *mark)
{
	sigset_t all, old;
	bool taken;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	taken = pthread_mutex_trylock(&mark->held) == 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return taken;
}

void percpuref_owner_mark_give_back(struct percpuref_owner_mark *mark)
{
	pthread_mutex_unlock(&mark->held);
}

/*
 * Read, not locked: a robust trylock, even one that fails, writes the
 * calling thread's robust-futex state (list_op_pending, and the list
 * itself on EOWNERDEAD), and the fence that asks runs in signal handlers
 * too (docs/percpu_ref.md, "Signal handlers"), over code that may be
 * locking a robust mutex of its own: the pending slot cleared under it, a
 * process killed before that lock's enqueue left its (process-shared)
 * mutex locked for ever (tests/unit/test_fallback_edges.c,
 * handler-robust-pending).  The kernel sets FUTEX_OWNER_DIED in a word
 * only once the owner is dead, after the walk of that owner's list has
 * left the entry: the mark is on no thread's list, and initialising it
 * again makes it unowned.  __data.__lock is the futex word on every glibc
 * port.  Acquire: pairs with the kernel's atomic update, after the owner's
 * last writes.
 */
bool percpuref_owner_mark_orphaned(struct percpuref_owner_mark *mark)
{
	if (!(__atomic_load_n(&mark->held.__data.__lock, __ATOMIC_ACQUIRE) & FUTEX_OWNER_DIED))
		return false;
	percpuref_owner_mark_init(mark);
	return true;
}
#endif
