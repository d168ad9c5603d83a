/* SPDX-License-Identifier: MIT */
/*
 * fallback.c - the fast path of a process without rseq: each thread owns a
 * per-CPU unit and adds to it inside a read-side section; the reader fence
 * is a grace period with an asymmetric barrier (liburcu's memb flavour).
 *
 * Why not just sched_getcpu() and an atomic add.  Without rseq nothing stops
 * a thread from migrating between choosing a CPU's counter and adding to it,
 * so two threads may add to one counter at once.  Instead each thread claims
 * a unit of its own on its first call (the one of the CPU it runs on, if
 * free; such a process has two units per possible CPU, so a thread pool
 * twice the size of the machine still fits) and only it writes there, with one
 * non-atomic add that its signal handlers cannot split (fallback.h).  A
 * thread that finds every unit taken, or calls after its exit hook ran, uses
 * the ref's atomic count, which is exact in every mode: the total is
 * count + the per-CPU sum, the fold moves (sum - bias) in one add, and the
 * bias keeps a per-CPU-mode count far from zero.  Units go back at thread
 * exit (thread_exit.c) and, in a fork child, all but the forking thread's.
 * The rseq path is never used in the same process (the choice is
 * process-wide), so no rseq add can race with a unit's owner.
 *
 * Threads whose exit hook never runs.  A thread whose first call comes from
 * a key destructor in glibc's last round registers a hook nobody runs
 * (thread_exit.c).  So nothing a fence reads lives in a thread's TLS: each
 * unit has a record on the heap, with the section counter of the thread
 * that owns it (TLS holds only its address), and an owner mark the owner
 * holds for as long as it owns the unit.  When the mark reads orphaned,
 * the fence or a registration takes the unit back (before this, a fence
 * read the dead thread's TLS, and crashed if its stack was unmapped).  The
 * dead owner's adds stay in the counters, where they belong.  A section
 * ends before its get or put returns, and a thread exits from none, short
 * of a signal handler that interrupted one: its pthread_exit() runs the
 * exit hook, which closes the section, but a raw exit leaves the section
 * open for ever, so a fence reads the mark on every round of its wait for
 * a reader, not only before it (up to 0.4.29 it waited for ever).  Where
 * marks never read orphaned (qemu-user, outside glibc, ThreadSanitizer)
 * such a thread's unit stays taken, and later threads may find the units
 * gone and count without one (a ref's shared unit-less word,
 * percpu_ref.c): slower, never wrong; a section left open there by a raw
 * exit holds every fence that finds readers, the one waiting and every
 * later one.  This is liburcu-bp's registry arena, which keeps its readers
 * off the TLS for the same reason, with the kernel rather than
 * pthread_kill(tid, 0) telling whether the owner lives.
 *
 * The section.  Enter stores the grace-period counter into the thread's
 * ctr (nesting bits 1), a compiler barrier, then the mode word is loaded;
 * exit is a release store of ctr - 1.  The fence, after the switcher stored
 * the new mode word:
 *   1. advances percpuref_readers_gp (release store);
 *   2. membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED): a full barrier on every
 *      thread of the process that is running, and every thread that is not
 *      has passed one in the scheduler.  So for each reader either its ctr
 *      store precedes that barrier, and step 3 sees it, or its mode-word load
 *      follows it and sees the new word (the store-buffer pattern, with one
 *      side's fence supplied by the kernel);
 *   3. waits for every reader whose ctr has nesting bits and an older count;
 *      one with the new count loaded it with acquire after step 1, so it
 *      saw the new word.  The acquire load of ctr pairs with the exit's
 *      release store, so every add of a waited-for section is visible.
 * Counting the periods, rather than waiting for ctr to read zero, means a
 * thread that enters sections back to back cannot starve the fence.
 * Where membarrier is unavailable or refused at set-up (kernel < 4.14,
 * seccomp), readers store ctr again with a sequentially consistent
 * exchange and the fence skips step 2: the same store-buffer argument in
 * C11's single total order of the sequentially consistent accesses (the
 * ctr exchange and loads, the mode-word exchange and load); correct, one
 * locked instruction dearer per call.
 *
 * The flip.  A membarrier refused after it was registered (a seccomp
 * filter installed later) switches readers to that mode: the fence sets
 * percpuref_readers_fence_needed (seq_cst), then runs on every CPU in
 * turn (runtime.c, the migration fence), as the rseq fence does.  A
 * reader reads the flag after its ctr store (fallback.h).  One that read
 * it unset did so before the fencing thread reached its CPU, and the
 * context switch there (or the one that took the reader off that CPU
 * first) drained the store: this fence and every later one see the ctr.
 * One that reads it set exchanges.  The reader once read the flag
 * before the store: a reader preempted between the two by the migration
 * itself made a plain store after it, which a later fence, issuing no
 * barrier, could miss while the section's mode-word load passed it in
 * the store buffer (tests/model/flip.pml, Model R, keeps that order as a
 * mutant).  Where moving between CPUs is refused too, the sections in
 * flight get runtime.c's 10 ms instead.
 *
 * Registration and the fence serialise on readers_lock: a thread that
 * registers after a fence took the lock sees the new mode word (the lock
 * orders the switcher's store before it), one that registered before is in
 * the unit table the fence walks.  The fence holds the lock while it
 * waits; readers never take it inside a section, so nothing it waits for
 * waits for it.  Fork hooks hold the lock across fork() (rank READERS,
 * internal.h) and give the child only the forking thread's unit.  A fork
 * from a handler inside a section of its thread takes no library lock at
 * all (runtime.c, fork_prepare()): every fence in flight waits for that
 * section, holding this lock.  A registration holds the lock with the
 * asynchronous signals blocked, so no handler's fork waits for it on the
 * thread that holds it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fallback.h"

__thread struct percpuref_reader percpuref_reader_self __attribute__((tls_model("initial-exec")));
unsigned long percpuref_readers_gp = 1;
bool percpuref_readers_fence_needed;

static pthread_mutex_t readers_lock = PTHREAD_MUTEX_INITIALIZER;

/* A unit's record.  Its owner writes ctr on every call: a line of its own. */
struct unit_record {
	unsigned long ctr;		/* the owner's section counter (fallback.h) */
	/* Held by the owner while it owns the unit; readers_lock. */
	struct percpuref_owner_mark owner __attribute__((aligned(PERCPUREF_CACHELINE)));
	/*
	 * Some thread owns the unit.  readers_lock.  A relaxed atomic all the
	 * same: ThreadSanitizer stops seeing a thread's locks once it has
	 * called pthread_exit(), and the exit hook writes here after that.
	 */
	bool owned;
};

/* nr_unit_records of them, never freed; NULL if the allocation failed. */
static struct unit_record *unit_records;
static unsigned int nr_unit_records;
/* Units owned, readers_lock; read without it by percpuref_readers_registered(). */
static unsigned int nr_readers;
/* Warned once: a fence skipped its own thread's interrupted section. */
static bool self_skip_warned;

static int sys_membarrier(int cmd)
{
	return (int)syscall(__NR_membarrier, cmd, 0, 0);
}

/* Relaxed: every caller holds readers_lock, which orders it (atomic only
 * for ThreadSanitizer: see owned). */
static bool unit_owned(const struct unit_record *rec)
{
	return __atomic_load_n(&rec->owned, __ATOMIC_RELAXED);
}

/* readers_lock. */
static void set_unit_owned(struct unit_record *rec, bool owned)
{
	__atomic_store_n(&rec->owned, owned, __ATOMIC_RELAXED);
	__atomic_fetch_add(&nr_readers, owned ? 1 : -1, __ATOMIC_RELAXED);
}

/* readers_lock.  True if @rec's owner exited without giving it back; then
 * the unit is free again. */
static bool owner_died(struct unit_record *rec)
{
	if (!percpuref_owner_mark_orphaned(&rec->owner))
		return false;
	set_unit_owned(rec, false);
	return true;
}

/* readers_lock.  By its owner: the unit is free again. */
static void give_back_unit(struct unit_record *rec)
{
	set_unit_owned(rec, false);
	percpuref_owner_mark_give_back(&rec->owner);
}

/* percpuref_readers_set_exit_work(): NULL until a handler left work. */
static void (*exit_work)(void);

void percpuref_readers_set_exit_work(void (*fn)(void))
{
	/* Relaxed: the thread that reads it for its exit work set it itself
	 * (a handler of that thread, before the exit); any other thread finds
	 * NULL or the same function, which finds it has nothing to run. */
	__atomic_store_n(&exit_work, fn, __ATOMIC_RELAXED);
}

static void reader_exit(void *unused)
{
	struct percpuref_reader *self = &percpuref_reader_self;
	void (*work)(void);
	sigset_t async, old;

	(void)unused;
	/* No handler of ours may run from here on: one that fenced would wait
	 * for readers_lock, held below by this very thread. */
	percpuref_sigfill_async(&async);
	pthread_sigmask(SIG_SETMASK, &async, &old);
	/* A handler that left by pthread_exit() left its section open, and
	 * the section never resumes: closed here, before the lock, which a
	 * fence waiting for this section holds.  Release: the adds the section
	 * made are visible to a fence that sees it closed. */
	if (__atomic_load_n(self->ctr, __ATOMIC_RELAXED) & PERCPUREF_READER_NEST_MASK)
		__atomic_store_n(self->ctr, 0, __ATOMIC_RELEASE);
	pthread_mutex_lock(&readers_lock);
	give_back_unit(&unit_records[self->unit]);
	self->state = PERCPUREF_READER_ATOMIC;
	pthread_mutex_unlock(&readers_lock);
	/* The releases its handlers left to that section, with the
	 * synchronous signals open, whatever mask the abandoned handler had.
	 * Relaxed: see percpuref_readers_set_exit_work(). */
	work = __atomic_load_n(&exit_work, __ATOMIC_RELAXED);
	if (work)
		work();
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* A fresh record set: every unit free. */
static void init_unit_records(void)
{
	unsigned int i;

	for (i = 0; i < nr_unit_records; i++) {
		unit_records[i].ctr = 0;
		unit_records[i].owned = false;
		percpuref_owner_mark_init(&unit_records[i].owner);
	}
}

void percpuref_readers_setup(unsigned int nr_units)
{
	const char *refuse = percpuref_getenv("PERCPUREF_NO_MEMBARRIER");
	int cmds = sys_membarrier(MEMBARRIER_CMD_QUERY);
	/* PERCPUREF_NO_MEMBARRIER=1: act as if refused (tests). */
	bool ok = !(refuse && *refuse && strcmp(refuse, "0")) && cmds >= 0 &&
		  (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
		  sys_membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;

	/* Relaxed: set before any counter exists (or in a fork child with one
	 * thread); a reader that sees it late has no fence to pair with. */
	__atomic_store_n(&percpuref_readers_fence_needed, !ok, __ATOMIC_RELAXED);
	if (unit_records)
		return;		/* a fork child: readers_fork_child() */
	/* Not percpuref_zalloc(): tests' injected failures aim elsewhere.
	 * Without it no thread has a unit. */
	unit_records = aligned_alloc(PERCPUREF_CACHELINE, nr_units * sizeof(*unit_records));
	if (!unit_records)
		return;
	nr_unit_records = nr_units;
	init_unit_records();
}

bool percpuref_readers_have_units(void)
{
	/* Plain: written at set-up, under the runtime's pthread_once (or in
	 * a fork child, alone), before any caller could be here. */
	return unit_records != NULL;
}

/* readers_lock.  Takes @unit for this thread if nobody owns it (any more). */
static bool claim(unsigned int unit)
{
	struct unit_record *rec = &unit_records[unit];

	if (unit_owned(rec) && !owner_died(rec))
		return false;
	if (!percpuref_owner_mark_take(&rec->owner))
		return false;
	/* Relaxed: no fence reads it before the registration's unlock. */
	__atomic_store_n(&rec->ctr, 0, __ATOMIC_RELAXED);
	set_unit_owned(rec, true);
	return true;
}

/* Claims a unit, the current CPU's if it is free; -1 if none.  readers_lock. */
static int claim_unit(void)
{
	unsigned int n = nr_unit_records, i;
	int cpu = sched_getcpu();

	if (cpu >= 0 && (unsigned int)cpu < n && claim((unsigned int)cpu))
		return cpu;
	for (i = 0; i < n; i++)
		if (claim(i))
			return (int)i;
	return -1;
}

bool percpuref_reader_register(void)
{
	struct percpuref_reader *self = &percpuref_reader_self;
	sigset_t async, old;
	int unit;

	/* A signal handler that interrupts this sees REGISTERING: atomic.
	 * Only a synchronous signal's can: the others wait until the
	 * registration is done, so that a handler that forks does not wait
	 * for readers_lock, or for the allocator's lock that the exit hook's
	 * first calloc() holds, on this very thread (both hung: a get or put
	 * that a forking handler interrupts is allowed).  Two system calls,
	 * once per thread: the state is read again once they are blocked, a
	 * handler having perhaps registered the thread just before (it then
	 * took a second unit, and gave only one back). */
	if (self->state != PERCPUREF_READER_NEW)
		return false;
	percpuref_sigfill_async(&async);
	pthread_sigmask(SIG_BLOCK, &async, &old);
	if (self->state != PERCPUREF_READER_NEW) {
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		return self->state == PERCPUREF_READER_UNIT;
	}
	self->state = PERCPUREF_READER_REGISTERING;
	pthread_mutex_lock(&readers_lock);
	unit = claim_unit();
	if (unit >= 0 && !percpuref_at_thread_exit(reader_exit, NULL)) {
		give_back_unit(&unit_records[unit]);
		unit = -1;
	}
	if (unit < 0) {
		self->state = PERCPUREF_READER_ATOMIC;
	} else {
		self->unit = (unsigned int)unit;
		self->ctr = &unit_records[unit].ctr;
		self->state = PERCPUREF_READER_UNIT;
	}
	pthread_mutex_unlock(&readers_lock);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return unit >= 0;
}

/* True while @rec's owner is in a section that began before the period @gp. */
static bool reader_blocks(struct unit_record *rec, unsigned long gp)
{
	/* Acquire: pairs with the exit's release store.  Sequentially
	 * consistent for the fence without membarrier (fallback.h). */
	unsigned long ctr = __atomic_load_n(&rec->ctr, __ATOMIC_SEQ_CST);

	return (ctr & PERCPUREF_READER_NEST_MASK) &&
	       ((ctr ^ gp) & ~PERCPUREF_READER_NEST_MASK);
}

/*
 * readers_lock.  Sections last a few instructions; a reader we wait for
 * was preempted, or died in the section (a handler that interrupted it
 * ended the thread by a raw exit, which runs no exit hook): then the
 * section never ends, and the mark, read again on every round, tells it
 * (its acquire load makes the dead owner's adds visible) and gives the
 * unit back.
 */
static void wait_for_reader(struct unit_record *rec, unsigned long gp)
{
	unsigned int tries = 0;

	/* Cancellation is off: percpuref_fence_readers(). */
	while (!owner_died(rec) && reader_blocks(rec, gp)) {
		if (++tries < 100)
			sched_yield();
		else
			percpuref_sleep_us(20);
	}
}

void percpuref_readers_fence(void)
{
	struct percpuref_reader *self = &percpuref_reader_self;
	struct unit_record *rec;
	unsigned long gp;
	unsigned int i;

	pthread_mutex_lock(&readers_lock);
	/* Relaxed: written under readers_lock, which we hold.  None: a
	 * thread registering later takes the lock after us and sees the
	 * caller's mode word. */
	if (__atomic_load_n(&nr_readers, __ATOMIC_RELAXED) == 0) {
		pthread_mutex_unlock(&readers_lock);
		return;
	}
	gp = percpuref_readers_gp + PERCPUREF_READER_GP_STEP;
	/* Release: orders the caller's mode-word store before it. */
	__atomic_store_n(&percpuref_readers_gp, gp, __ATOMIC_RELEASE);
	/* Without membarrier the sequentially consistent ctr loads below do
	 * (fallback.h). */
	if (!__atomic_load_n(&percpuref_readers_fence_needed, __ATOMIC_RELAXED) &&
	    sys_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0) {
		/* Refused after set-up (a seccomp filter installed later):
		 * readers fence themselves from now on, and the migration
		 * fence orders those that read the old setting, as the
		 * membarrier would have. */
		int err = errno;

		__atomic_store_n(&percpuref_readers_fence_needed, true, __ATOMIC_SEQ_CST);
		percpuref_fence_without_membarrier(err);
	}
	for (i = 0; i < nr_unit_records; i++) {
		rec = &unit_records[i];
		if (!unit_owned(rec))
			continue;
		if (self->state == PERCPUREF_READER_UNIT && self->unit == i) {
			if (!reader_blocks(rec, gp))
				continue;
			/* Our own section, interrupted by the signal handler we
			 * run in: it cannot end before we return, and waiting
			 * hung for ever.  A release a handler's put reaches waits
			 * for the section to end (percpu_ref.c, "Releases in
			 * signal handlers"), so only a handler that switches a
			 * ref itself, which the documentation does not allow,
			 * gets here.  Its add lands after, unfenced: exact
			 * unless it adds to the very ref being switched (rseq
			 * restarts it), and kept on that ref (internal.h,
			 * percpuref_note_unfenced_adds()). */
			/* Relaxed: a warn-once flag; the exchange alone makes
			 * one warning, and nothing is read through it. */
			if (!__atomic_exchange_n(&self_skip_warned, true, __ATOMIC_RELAXED))
				percpuref_warn("percpuref_fence_readers", "called from a signal "
					       "handler that interrupted a get or put; that call "
					       "is not fenced");
			percpuref_note_unfenced_adds();
			continue;
		}
		wait_for_reader(rec, gp);
	}
	pthread_mutex_unlock(&readers_lock);
}

PERCPUREF_API unsigned int percpuref_readers_registered(void)
{
	/* Relaxed: a count for the tests, written under readers_lock;
	 * nothing is read on the strength of it. */
	return __atomic_load_n(&nr_readers, __ATOMIC_RELAXED);
}

static void readers_fork_prepare(void)
{
	pthread_mutex_lock(&readers_lock);
}

static void readers_fork_parent(void)
{
	pthread_mutex_unlock(&readers_lock);
}

static void readers_fork_child(void)
{
	struct percpuref_reader *self = &percpuref_reader_self;
	struct unit_record *mine = self->state == PERCPUREF_READER_UNIT ?
					   &unit_records[self->unit] : NULL;

	/* The parent's owners are not here, and the marks they held are no
	 * child thread's: all fresh, then this thread takes its unit back.
	 * Its section counter starts closed too, as it was: a fork from a
	 * handler inside a section skips these hooks (runtime.c). */
	init_unit_records();
	/* Relaxed: the child has one thread, and readers_lock is held. */
	__atomic_store_n(&nr_readers, 0, __ATOMIC_RELAXED);
	if (mine) {
		percpuref_owner_mark_take(&mine->owner);
		set_unit_owned(mine, true);
	}
	pthread_mutex_unlock(&readers_lock);
}

static const struct percpuref_fork_hooks readers_fork_hooks = {
	.rank = PERCPUREF_RANK_READERS,
	.prepare = readers_fork_prepare,
	.parent = readers_fork_parent,
	.child = readers_fork_child,
};

static __attribute__((constructor)) void readers_register(void)
{
	percpuref_register_fork_hooks(&readers_fork_hooks);
}
