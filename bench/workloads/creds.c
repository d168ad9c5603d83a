/* SPDX-License-Identifier: MIT */
/*
 * creds.c - overlayfs permission checks under the mounter's credential
 * (docs/design.md, the overlayfs case): every check wraps itself in override_creds() and
 * revert_creds() on one credential shared by the whole superblock.
 *
 * The model.  One struct cred, the mounter's, hangs off the superblock
 * (ovl_fs->creator_cred) and every thread checks its own inodes with it.
 * One counted operation, a "check", is ovl_permission() on one inode:
 *
 *   override  take the mounter's cred (or borrow it) and make it the
 *             thread's current cred (current->cred, private to the thread);
 *   check     generic_permission() on the inode, reading the current cred:
 *             fsuid against the owner, fsgid against the group, the mode
 *             bits for the requested access, and cap_effective when the
 *             mode bits refuse (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH);
 *   revert    restore the thread's own cred and drop what override took.
 *
 * The read-mostly fields follow the kernel's struct cred: after an 8-byte
 * usage count come uid, gid, suid, sgid, euid, egid, fsuid, fsgid (fsuid at
 * byte 32 of the first line), securebits and the capability sets
 * (cap_effective at byte 64, the next line).  Variants differ only in the
 * usage count:
 *
 *   shared-line  atomic usage in the cache line the check reads (fsuid,
 *                fsgid): every check writes the line every other thread
 *                reads, so the count's contention also stalls the reads
 *                (the bug, found with perf c2c).
 *   padded       the same atomic, alone on its own 128-byte block (two
 *                lines: the adjacent-line prefetcher pairs them): removes
 *                the false sharing only; the count's own line still moves
 *                between CPUs on every check.
 *   percpu       usage is a percpu_ref in per-CPU mode: get and put add to
 *                this CPU's counter; the ref's own fields next to the ids
 *                are only read.
 *   borrow       no count: the cred is read under a liburcu-bp read-side
 *                section and never written (Linux 6.14, where
 *                override_creds() takes no reference; the superblock holds
 *                the cred for the mount's lifetime).  The usage field is
 *                still there, in the kernel's place, untouched.
 *   fast-perm    the report's first mitigation (OVL_FASTPERM): once an
 *                inode passed the check under the mounter's cred, a flag
 *                on the inode says so and later checks of it skip the
 *                override and the check altogether; inodes the mounter may
 *                not access still take shared-line's path every time.  The
 *                report warns that this may weaken the check (a later
 *                change of the inode's mode or owner goes unseen), and so
 *                does this model: the flag is never cleared.
 *   local-copy   the report's second mitigation: each check copies the
 *                mounter's cred into a local on the stack and overrides
 *                with the copy, so the shared cred is only read (usage
 *                untouched) at the price of copying it.
 *
 * Invariants, checked after the run (failures exit through bench_die, which
 * the smoke test relies on):
 *   - the usage count is back to its start value: 1, the superblock's
 *     reference (for percpu: dropping that reference releases the ref,
 *     exactly once);
 *   - every thread is back on its own cred, and its count of allowed
 *     checks is what its inode table allows under the mounter's ids
 *     (each batch checks the whole table once), so a check that read a
 *     wrong or torn cred would show.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/*
 * borrow's read-side section: liburcu's inline one (_LGPL_SOURCE, about
 * 2 ns) rather than its exported functions (about 10 ns: two calls, each
 * with a __tls_get_addr, since liburcu-bp is a shared library), as the
 * kernel's rcu_read_lock() is nearly free.  The ASan+UBSan build takes the
 * exported functions: the inline reader reaches liburcu's registry through
 * a pointer UBSan finds misaligned (as src/refcount_baselines.c notes).
 */
#ifndef __SANITIZE_ADDRESS__
#define _LGPL_SOURCE
#endif
#include <urcu/urcu-bp.h>

#include <percpuref/percpu_ref.h>

#include "bench.h"

enum creds_kind {
	CREDS_SHARED_LINE,
	CREDS_PADDED,
	CREDS_PERCPU,
	CREDS_BORROW,
	CREDS_FAST_PERM,
	CREDS_LOCAL_COPY,
};

#define CAP_DAC_OVERRIDE 1
#define CAP_DAC_READ_SEARCH 2

#define MAY_EXEC 1
#define MAY_WRITE 2
#define MAY_READ 4

/* The fields a permission check reads, in the kernel's order. */
struct cred_ids {
	unsigned int uid, gid, suid, sgid, euid, egid, fsuid, fsgid;
	unsigned int securebits;
	uint64_t cap_inheritable, cap_permitted, cap_effective, cap_bset, cap_ambient;
};

/* shared-line and borrow: the kernel's layout, usage first. */
struct cred {
	long usage;
	struct cred_ids ids;
};

/* padded: usage alone on a 128-byte block, the ids on the next. */
struct cred_padded {
	long usage __attribute__((aligned(128)));
	struct cred_ids ids __attribute__((aligned(128)));
};

/* percpu: the ref's fields are read-only while it is per-CPU. */
struct cred_percpu {
	struct percpu_ref usage;
	struct cred_ids ids;
	bool released;			/* set by the release, at teardown */
};

/* bench_zalloc() gives 128-byte alignment: line offsets are these. */
_Static_assert(offsetof(struct cred, ids.fsuid) + sizeof(unsigned int) <= 64 &&
	       offsetof(struct cred, ids.fsgid) + sizeof(unsigned int) <= 64,
	       "shared-line: usage, fsuid and fsgid must share the first line");
_Static_assert(offsetof(struct cred_padded, ids) >= 128,
	       "padded: the ids must not share usage's 128-byte block");

/* The superblock: read-only during the run; one member per variant. */
struct creds_sb {
	struct cred *cred;		/* shared-line, borrow (RCU-published) */
	struct cred_padded *padded;
	struct cred_percpu *percpu;
	uint64_t allowed_per_batch;	/* checks one batch allows */
};

struct inode {
	unsigned int i_uid, i_gid;
	unsigned int i_mode;
	int mask;			/* the access this check asks for */
	bool fastperm;			/* fast-perm: passed under the mounter's cred */
};

/* A thread: its current cred, its own cred and the inodes it checks. */
struct task {
	const struct cred_ids *cred;	/* current->cred */
	struct cred_ids own;		/* the task's credential */
	uint64_t allowed;
	struct inode inodes[BENCH_BATCH];
};

/* The mounter: an unprivileged user allowed to read anything. */
static const struct cred_ids mounter_ids = {
	.uid = 1000, .gid = 1000, .suid = 1000, .sgid = 1000,
	.euid = 1000, .egid = 1000, .fsuid = 1000, .fsgid = 1000,
	.cap_permitted = 1ULL << CAP_DAC_READ_SEARCH,
	.cap_effective = 1ULL << CAP_DAC_READ_SEARCH,
	.cap_bset = ~0ULL,
};

/* The task itself: another user with no capability. */
static const struct cred_ids task_ids = {
	.uid = 1001, .gid = 1001, .suid = 1001, .sgid = 1001,
	.euid = 1001, .egid = 1001, .fsuid = 1001, .fsgid = 1001,
	.cap_bset = ~0ULL,
};

/* Inode i of every thread's table: a fixed mix of owners, modes, accesses. */
static struct inode inode_make(unsigned int i)
{
	static const unsigned int uids[] = { 1000, 0, 1001 };
	static const unsigned int gids[] = { 1000, 100, 0, 1001, 1000 };
	static const unsigned int modes[] = { 0644, 0600, 0640, 0755, 0700, 0400, 0660 };
	static const int masks[] = { MAY_READ, MAY_WRITE, MAY_READ, MAY_EXEC };

	return (struct inode){
		.i_uid = uids[i % 3],
		.i_gid = gids[i % 5],
		.i_mode = modes[i % 7],
		.mask = masks[i % 4],
	};
}

/* generic_permission(): the owner, group or other bits, then capabilities. */
static inline bool inode_permission(const struct cred_ids *cred, const struct inode *inode)
{
	unsigned int mode = inode->i_mode;

	if (cred->fsuid == inode->i_uid)
		mode >>= 6;
	else if (cred->fsgid == inode->i_gid)
		mode >>= 3;
	if (!(inode->mask & ~mode & 7))
		return true;
	if (cred->cap_effective & (1ULL << CAP_DAC_OVERRIDE))
		return true;
	return inode->mask == MAY_READ && (cred->cap_effective & (1ULL << CAP_DAC_READ_SEARCH));
}

static void percpu_release(struct percpu_ref *ref)
{
	struct cred_percpu *c =
		(struct cred_percpu *)((char *)ref - offsetof(struct cred_percpu, usage));

	c->released = true;
}

/* get_cred(): relaxed, as atomic_long_inc(); a reference orders nothing. */
static inline void get_usage(long *usage)
{
	__atomic_fetch_add(usage, 1, __ATOMIC_RELAXED);
}

/*
 * put_cred(): acquire-release, as atomic_long_dec_and_test(), so that the
 * reads under the reference happen before a final put's free.  The
 * superblock's reference keeps the count above zero.
 */
static inline void put_usage(long *usage)
{
	if (percpuref_unlikely(__atomic_sub_fetch(usage, 1, __ATOMIC_ACQ_REL) == 0))
		bench_die("creds: usage count reached zero during the run");
}

/*
 * ovl_permission() on one inode: override, check, revert.  Always inlined
 * into each variant's loop with a constant @kind, so each loop holds only
 * its own variant's code.
 */
static inline __attribute__((always_inline)) bool
ovl_permission(const struct creds_sb *sb, struct task *task, struct inode *inode,
	       enum creds_kind kind)
{
	const struct cred_ids *old = task->cred;
	bool allowed;

	struct cred local;

	/* Once passed, never checked again: the report's OVL_FASTPERM. */
	if (kind == CREDS_FAST_PERM && inode->fastperm)
		return true;
	switch (kind) {
	case CREDS_SHARED_LINE:
	case CREDS_FAST_PERM:
		get_usage(&sb->cred->usage);
		task->cred = &sb->cred->ids;
		break;
	case CREDS_LOCAL_COPY:
		/* Plain reads: nobody writes the shared cred during the run. */
		local = *sb->cred;
		local.usage = 1;
		task->cred = &local.ids;
		break;
	case CREDS_PADDED:
		get_usage(&sb->padded->usage);
		task->cred = &sb->padded->ids;
		break;
	case CREDS_PERCPU:
		percpu_ref_get(&sb->percpu->usage);
		task->cred = &sb->percpu->ids;
		break;
	case CREDS_BORROW:
		urcu_bp_read_lock();
		/* Pairs with the rcu_assign_pointer() in creds_setup(). */
		task->cred = &rcu_dereference(sb->cred)->ids;
		break;
	}
	allowed = inode_permission(task->cred, inode);
	task->cred = old;
	switch (kind) {
	case CREDS_SHARED_LINE:
		put_usage(&sb->cred->usage);
		break;
	case CREDS_FAST_PERM:
		put_usage(&sb->cred->usage);
		inode->fastperm = allowed;
		break;
	case CREDS_LOCAL_COPY:
		break;
	case CREDS_PADDED:
		put_usage(&sb->padded->usage);
		break;
	case CREDS_PERCPU:
		percpu_ref_put(&sb->percpu->usage);
		break;
	case CREDS_BORROW:
		urcu_bp_read_unlock();
		break;
	}
	return allowed;
}

static inline __attribute__((always_inline)) void creds_loop(struct bench_thread *t,
							     enum creds_kind kind)
{
	const struct creds_sb *sb = t->run->state;
	struct task *task = t->local;
	uint64_t allowed = 0;

	while (bench_running(t)) {
		for (int i = 0; i < BENCH_BATCH; i++)
			allowed += ovl_permission(sb, task, &task->inodes[i], kind);
		bench_count(t, BENCH_BATCH);
	}
	task->allowed = allowed;
}

static void shared_line_loop(struct bench_thread *t)
{
	creds_loop(t, CREDS_SHARED_LINE);
}

static void padded_loop(struct bench_thread *t)
{
	creds_loop(t, CREDS_PADDED);
}

static void percpu_loop(struct bench_thread *t)
{
	creds_loop(t, CREDS_PERCPU);
}

static void borrow_loop(struct bench_thread *t)
{
	creds_loop(t, CREDS_BORROW);
}

static void fast_perm_loop(struct bench_thread *t)
{
	creds_loop(t, CREDS_FAST_PERM);
}

static void local_copy_loop(struct bench_thread *t)
{
	creds_loop(t, CREDS_LOCAL_COPY);
}

static void creds_setup(struct bench_run *run)
{
	struct creds_sb *sb = bench_zalloc(sizeof(*sb));
	struct cred *cred;

	for (unsigned int i = 0; i < BENCH_BATCH; i++) {
		struct inode inode = inode_make(i);

		sb->allowed_per_batch += inode_permission(&mounter_ids, &inode);
	}
	switch (run->variant->arg) {
	case CREDS_SHARED_LINE:
	case CREDS_BORROW:
	case CREDS_FAST_PERM:
	case CREDS_LOCAL_COPY:
		cred = bench_zalloc(sizeof(*cred));
		cred->usage = 1;
		cred->ids = mounter_ids;
		/*
		 * Publishes the initialised cred to the borrowers'
		 * rcu_dereference() (the threads start after this anyway).
		 */
		rcu_assign_pointer(sb->cred, cred);
		break;
	case CREDS_PADDED:
		sb->padded = bench_zalloc(sizeof(*sb->padded));
		sb->padded->usage = 1;
		sb->padded->ids = mounter_ids;
		break;
	case CREDS_PERCPU:
		sb->percpu = bench_zalloc(sizeof(*sb->percpu));
		sb->percpu->ids = mounter_ids;
		if (percpu_ref_init(&sb->percpu->usage, percpu_release, 0))
			bench_die("creds percpu: percpu_ref_init failed");
		break;
	}
	run->state = sb;
}

static void creds_thread_init(struct bench_thread *t)
{
	struct task *task = bench_zalloc(sizeof(*task));

	task->own = task_ids;
	task->cred = &task->own;
	for (unsigned int i = 0; i < BENCH_BATCH; i++)
		task->inodes[i] = inode_make(i);
	t->local = task;
}

static void creds_thread_fini(struct bench_thread *t)
{
	const struct creds_sb *sb = t->run->state;
	struct task *task = t->local;
	uint64_t want = t->ops / BENCH_BATCH * sb->allowed_per_batch;

	if (task->cred != &task->own)
		bench_die("creds %s: thread %u not back on its own cred", t->run->variant->name,
			  t->index);
	if (task->allowed != want)
		bench_die("creds %s: thread %u allowed %llu of %llu checks, want %llu",
			  t->run->variant->name, t->index, (unsigned long long)task->allowed,
			  (unsigned long long)t->ops, (unsigned long long)want);
	free(task);
}

static void check_usage(const struct bench_run *run, const long *usage)
{
	long v = __atomic_load_n(usage, __ATOMIC_RELAXED);

	if (v != 1)
		bench_die("creds %s: usage %ld after the run, want 1", run->variant->name, v);
}

static void creds_teardown(struct bench_run *run)
{
	struct creds_sb *sb = run->state;

	switch (run->variant->arg) {
	case CREDS_SHARED_LINE:
	case CREDS_BORROW:
	case CREDS_FAST_PERM:
	case CREDS_LOCAL_COPY:
		/* The threads are joined: no reader is left to wait for. */
		check_usage(run, &sb->cred->usage);
		free(sb->cred);
		break;
	case CREDS_PADDED:
		check_usage(run, &sb->padded->usage);
		free(sb->padded);
		break;
	case CREDS_PERCPU:
		/*
		 * Dropping the superblock's reference must release: the
		 * checks' gets and puts cancelled out.  The barrier waits for
		 * the kill's switch to atomic and the release it triggers.
		 */
		if (sb->percpu->released)
			bench_die("creds percpu: released during the run");
		percpu_ref_kill(&sb->percpu->usage);
		percpu_ref_barrier();
		if (!sb->percpu->released)
			bench_die("creds percpu: not released after the superblock's put");
		percpu_ref_exit(&sb->percpu->usage);
		free(sb->percpu);
		break;
	}
	free(sb);
}

static const struct bench_variant creds_variants[] = {
	{ "shared-line", "atomic usage on the line the check reads (the bug)", shared_line_loop,
	  CREDS_SHARED_LINE },
	{ "padded", "atomic usage on its own 128-byte block", padded_loop, CREDS_PADDED },
	{ "percpu", "usage is a percpu_ref in per-CPU mode", percpu_loop, CREDS_PERCPU },
	{ "borrow", "no count: the cred read under RCU (Linux 6.14)", borrow_loop,
	  CREDS_BORROW },
	{ "fast-perm", "an inode that passed once skips override and check (report)",
	  fast_perm_loop, CREDS_FAST_PERM },
	{ "local-copy", "override with a stack copy of the cred: usage untouched (report)",
	  local_copy_loop, CREDS_LOCAL_COPY },
	{ 0 },
};

static const struct bench_workload creds = {
	.name = "creds",
	.help = "overlayfs permission checks under one shared mounter credential",
	.op = "check",
	.variants = creds_variants,
	.setup = creds_setup,
	.thread_init = creds_thread_init,
	.thread_fini = creds_thread_fini,
	.teardown = creds_teardown,
};
PERCPUREF_BENCH_WORKLOAD(creds);
