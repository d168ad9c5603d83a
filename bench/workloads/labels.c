/* SPDX-License-Identifier: MIT */
/*
 * labels.c - the AppArmor label case (docs/design.md): nginx workers whose
 * every request takes and drops a reference on one shared label, with each
 * refcount strategy behind the same request loop, optional policy churn,
 * and a check of the security property.
 *
 * A request, as an nginx worker's:
 *   1. if the task's credential points at a stale label, move it to the
 *      newest one (begin_current_label_crit_section() does this);
 *   2. secid: get the current label, read its secid, put
 *      (apparmor_current_getsecid_subj);
 *   3. file open: get the label, walk its compiled permission table for the
 *      request's path, put (apparmor_file_open);
 *   4. private work: --work rounds of a xorshift over a private 4 KiB
 *      buffer, standing for everything else nginx does for a request.
 * The op of the table is one request.
 *
 * Variants (one column each).  All but "off" run the same request loop,
 * instantiated per variant with a constant ops table (labels_refops), so
 * the count's calls are inlined and nothing else differs:
 *   off             no label work at all (apparmor=off);
 *   kref            aa_get_newest_label(): kref_get/kref_put on every
 *                   access (apparmor=on, the seed's baseline);
 *   condref         no reference unless the label is stale (upstream's
 *                   file_open fix, __begin_current_label_crit_section());
 *   rcuref          rcuref_get/rcuref_put (Linux 6.4 rcuref_t);
 *   percpu-managed  a percpu_ref handed to the library's reclaimer when the
 *                   label goes live (the seed's fix): get/put are per-CPU,
 *                   and a label is released by the reclaimer once stale
 *                   and unreferenced;
 *   percpu-rcuref   the same with a percpu_rcuref, whose release the
 *                   library defers past an RCU grace period (the
 *                   proposal's RCU variant);
 *   secid-fix       no reference for the secid lookup, kref for file open
 *                   (the report's third column, upstream 2516fde1fa00);
 *   percpu-atomic   a percpu_ref kept in atomic mode (the series' first
 *                   step: one locked add, as kref);
 *   percpu-rcuref-unmanaged  a per-CPU percpu_rcuref whose owner, the
 *                   policy, kills it when it replaces the label;
 *   hazptr          a hazard pointer around each access to the fresh
 *                   label (the report's future work).
 * The workers run under the root namespace's unconfined label, as the
 * report's nginx did; --profile nginx runs them confined instead (a DFA
 * walk per file open, and a label the churn loader replaces).
 * Stale labels resolve to the newest one under RCU with tryget in every
 * variant (aa_get_label_rcu()).
 *
 * Why condref is safe: a fresh label is pinned by the reference the task's
 * credential holds, and only the task itself replaces its credential
 * (step 1, between requests), so the label cannot be released while the
 * task checks against it; a stale label is not looked at beyond its proxy,
 * and the newest label is pinned by a reference taken for the check.  This
 * is upstream's argument for the current task's label (the credential is
 * the task's own, so nobody else can drop its reference), and for a file's
 * f_cred (the open file pins its cred, the cred pins the label).
 *
 * Churn (--churn R): a loader thread replaces R profiles per second, every
 * other one the workers' own profile ("nginx"), the rest round-robin
 * through every namespace's profiles.  Each measurement then reports, as
 * metrics (the harness's second table, and the JSON): replacements per
 * second, labels alive and stale labels outstanding (peak and at the end),
 * resident memory and per-CPU counters in use (peak), and release latency
 * (stale -> freed).
 *
 * Checks (the run fails, exit 1, if one breaks):
 *   - security: before each file-open decision the worker loads, with
 *     acquire, the rules version of the last completed replacement of each
 *     component profile; the rules the decision then uses must be at least
 *     that new (labels_model.h, steps 1-3, give the ordering);
 *   - no released label read: a label's secid is poisoned when its last
 *     reference goes; a worker that reads the poison used a dead label
 *     (and ASan, in the smoke test, catches any read of a freed one);
 *   - decisions: each path's verdict must match the profile's intent;
 *   - leaks: every label and table is freed at the end of a measurement.
 */
#define _GNU_SOURCE
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <urcu/urcu-bp.h>

#include <percpuref/managed.h>
#include <percpuref/percpu_rcuref.h>

#include "bench.h"
#include "labels_model.h"

/* Options. */
static long opt_work = 400;
static double opt_churn;
static long opt_namespaces = 2;
static long opt_profiles = 8;
static long opt_stacks = 4;
static long opt_scan_ms = 100;
static const char *opt_profile = "unconfined";
static bool opt_unconfined;	/* opt_profile is "unconfined": set by validate() */

#define LABELS_NPATHS 8
#define LABELS_BUF_WORDS 512

/* The paths requests open, in turn: nginx's document root and config. */
static const char *const labels_paths[LABELS_NPATHS] = {
	"/var/www/html/index.html",
	"/var/www/html/static/css/site.css",
	"/usr/share/nginx/html/50x.html",
	"/etc/nginx/mime.types",
	"/var/www/html/images/logo.png",
	"/etc/shadow",
	"/var/www/html/api/v1/items.json",
	"/etc/ssl/private/server.key",
};
/* What the nginx profile must answer to a read of each path. */
static const bool labels_nginx_reads[LABELS_NPATHS] = { 1, 1, 1, 1, 1, 0, 1, 0 };
static const bool labels_unconfined_reads[LABELS_NPATHS] = { 1, 1, 1, 1, 1, 1, 1, 1 };

enum labels_mode {
	LABELS_OFF,	/* no label work */
	LABELS_REF,	/* a reference around every access */
	LABELS_CONDREF,	/* a reference only for a stale label */
	LABELS_SECID_FIX,	/* condref for the secid lookup, a reference for file open */
	LABELS_HAZARD,	/* a hazard pointer for a fresh label, a reference for a stale one */
};

/* What labels_begin() took, for labels_end() to drop. */
enum labels_hold {
	LABELS_HOLD_NONE,
	LABELS_HOLD_REF,
	LABELS_HOLD_HAZARD,
};

/* How a variant counts: its ops and, for the model's teardown, a drain. */
struct labels_kind {
	const struct labels_refops *ops;
	void (*drain)(struct labels_model *m);
	bool managed;	/* percpu-managed: configure the reclaimer */
};

struct labels_state {
	struct labels_model *model;
	const struct labels_kind *kind;
	struct labels_lineage *task_lineage;	/* what the workers run under */

	/* The loader: stopped through loader_lock/loader_cond. */
	pthread_t loader;
	pthread_mutex_t loader_lock;
	pthread_cond_t loader_cond;
	bool loader_stop;
	uint64_t loader_start_ns;
	long rss_peak_kb;	/* loader samples; read after the join */
	size_t pcpu_peak;

	/* Failed checks: atomics, added to on the (never taken) error paths. */
	uint64_t violations;
	uint64_t poisoned_reads;
	uint64_t wrong_decisions;
	uint64_t refreshes;	/* credentials moved to a newer label */
};

/* One worker: the task.  Allocated per thread, never shared. */
struct labels_task {
	struct labels_state *s;
	struct labels_label *cred;	/* the credential's label: one reference */
	const bool *expect;		/* expected verdict per path */
	unsigned int path;		/* next path, 0 .. LABELS_NPATHS - 1 */
	uint64_t secids;		/* sum of secids read (keeps the read) */
	uint64_t mismatches;		/* verdicts that differed from expect */
	uint64_t refreshes;
	uint64_t rng;
	uint64_t buf[LABELS_BUF_WORDS];	/* the private work's memory */
};

#define labels_of(ptr, member) \
	((struct labels_label *)((char *)(ptr) - offsetof(struct labels_label, member)))

/* kref: the atomic count (condref counts with it too). */
static void labels_kref_release(struct kref *kref)
{
	labels_label_release(labels_of(kref, count.kref));
}

static void labels_kref_init(struct labels_label *l)
{
	kref_init(&l->count.kref);
}

static void labels_nop(struct labels_label *l)
{
}

static void labels_kref_get(struct labels_label *l)
{
	kref_get(&l->count.kref);
}

static bool labels_kref_tryget(struct labels_label *l)
{
	return kref_get_unless_zero(&l->count.kref);
}

static void labels_kref_put(struct labels_label *l)
{
	kref_put(&l->count.kref, labels_kref_release);
}

static const struct labels_refops labels_kref_ops = {
	.init = labels_kref_init,
	.live = labels_nop,
	.get = labels_kref_get,
	.tryget = labels_kref_tryget,
	.put = labels_kref_put,
	.read_lock = urcu_bp_read_lock,
	.read_unlock = labels_rcu_read_unlock,
};

/* rcuref: the count dies once; labels are freed after a grace period anyway. */
static void labels_rcuref_init(struct labels_label *l)
{
	rcuref_init(&l->count.rcuref, 1);
}

static bool labels_rcuref_tryget(struct labels_label *l)
{
	return rcuref_get(&l->count.rcuref);
}

static void labels_rcuref_get(struct labels_label *l)
{
	/* The caller's reference keeps the count alive: cannot fail. */
	if (percpuref_unlikely(!rcuref_get(&l->count.rcuref)))
		bench_die("labels rcuref: get on a dead count (label %p)", (void *)l);
}

static void labels_rcuref_put(struct labels_label *l)
{
	if (rcuref_put(&l->count.rcuref))
		labels_label_release(l);
}

static const struct labels_refops labels_rcuref_ops = {
	.init = labels_rcuref_init,
	.live = labels_nop,
	.get = labels_rcuref_get,
	.tryget = labels_rcuref_tryget,
	.put = labels_rcuref_put,
	.read_lock = urcu_bp_read_lock,
	.read_unlock = labels_rcu_read_unlock,
};

/*
 * percpu-managed: the seed's patch.  The ref starts atomic (sticky, so an
 * error before the label goes live is a plain atomic count) with the
 * initial reference, which is the policy's; when the label goes live (the
 * model's equivalent of __label_insert(): published through its proxy)
 * percpu_ref_switch_to_managed() gives the manager a reference of its own
 * and switches the ref to per-CPU mode.  Every reference is dropped with a
 * put, the policy's too when the label is replaced; nobody kills it.  The
 * reclaimer releases the label once the manager's is the last reference:
 * after the label went stale, the policy dropped its reference and every
 * task moved on.
 */
static void labels_pcpu_release(struct percpu_ref *ref)
{
	labels_label_release(labels_of(ref, count.pcpu));
}

static void labels_pcpu_init(struct labels_label *l)
{
	if (percpu_ref_init(&l->count.pcpu, labels_pcpu_release, PERCPU_REF_INIT_ATOMIC))
		bench_die("labels: percpu_ref_init failed");
}

static void labels_pcpu_live(struct labels_label *l)
{
	if (percpu_ref_switch_to_managed(&l->count.pcpu))
		bench_die("labels: percpu_ref_switch_to_managed failed");
}

static void labels_pcpu_get(struct labels_label *l)
{
	percpu_ref_get(&l->count.pcpu);
}

static bool labels_pcpu_tryget(struct labels_label *l)
{
	return percpu_ref_tryget(&l->count.pcpu);
}

static void labels_pcpu_put(struct labels_label *l)
{
	percpu_ref_put(&l->count.pcpu);
}

static void labels_pcpu_exit(struct labels_label *l)
{
	percpu_ref_exit(&l->count.pcpu);
}

static const struct labels_refops labels_pcpu_managed_ops = {
	.init = labels_pcpu_init,
	.live = labels_pcpu_live,
	.get = labels_pcpu_get,
	.tryget = labels_pcpu_tryget,
	.put = labels_pcpu_put,
	.exit = labels_pcpu_exit,
	.read_lock = urcu_bp_read_lock,
	.read_unlock = labels_rcu_read_unlock,
};

/* The reclaimer holds the last reference of every dropped label: release
 * them (and, for percpu-rcuref, wait for their deferred releases). */
static void labels_pcpu_drain(struct labels_model *m)
{
	if (percpu_ref_managed_flush())
		bench_die("labels: percpu_ref_managed_flush failed");
}

/*
 * percpu-rcuref: the same managed per-CPU count, but the library defers the
 * release past an RCU grace period itself (percpu_rcuref.h): when the count
 * reaches zero it calls unpublish (the label is marked dead), and after the
 * grace period release frees it directly, on the reclaimer thread, instead
 * of going through the model's reaper.  Proxy lookups use the library's
 * read side, which is what its grace period waits for.
 */
static void labels_prcu_unpublish(struct percpu_rcuref *ref)
{
	labels_label_unpublish(labels_of(ref, count.prcu));
}

static void labels_prcu_release(struct percpu_rcuref *ref)
{
	labels_label_free(labels_of(ref, count.prcu));
}

static void labels_prcu_init(struct labels_label *l)
{
	if (percpu_rcuref_init(&l->count.prcu, labels_prcu_unpublish, labels_prcu_release,
			       PERCPU_REF_INIT_ATOMIC))
		bench_die("labels: percpu_rcuref_init failed");
}

static void labels_prcu_live(struct labels_label *l)
{
	if (percpu_rcuref_switch_to_managed(&l->count.prcu))
		bench_die("labels: percpu_rcuref_switch_to_managed failed");
}

static void labels_prcu_get(struct labels_label *l)
{
	percpu_rcuref_get(&l->count.prcu);
}

static bool labels_prcu_tryget(struct labels_label *l)
{
	return percpu_rcuref_tryget(&l->count.prcu);
}

static void labels_prcu_put(struct labels_label *l)
{
	percpu_rcuref_put(&l->count.prcu);
}

static void labels_prcu_exit(struct labels_label *l)
{
	percpu_rcuref_exit(&l->count.prcu);
}

static const struct labels_refops labels_prcu_managed_ops = {
	.init = labels_prcu_init,
	.live = labels_prcu_live,
	.get = labels_prcu_get,
	.tryget = labels_prcu_tryget,
	.put = labels_prcu_put,
	.exit = labels_prcu_exit,
	.read_lock = percpu_rcuref_read_lock,
	.read_unlock = percpu_rcuref_read_unlock,
};

/*
 * percpu-atomic: the series' first step, labels on a percpu_ref that stays
 * in atomic mode.  Nothing is per-CPU and nothing is managed: get and put
 * are one locked add on the ref's shared count, as kref's, and the
 * policy's put of a replaced label releases it at zero, as kref does.
 */
static void labels_pcpu_atomic_init(struct labels_label *l)
{
	if (percpu_ref_init(&l->count.pcpu, labels_pcpu_release, PERCPU_REF_INIT_ATOMIC))
		bench_die("labels: percpu_ref_init failed");
}

static const struct labels_refops labels_pcpu_atomic_ops = {
	.init = labels_pcpu_atomic_init,
	.live = labels_nop,
	.get = labels_pcpu_get,
	.tryget = labels_pcpu_tryget,
	.put = labels_pcpu_put,
	.exit = labels_pcpu_exit,
	.read_lock = urcu_bp_read_lock,
	.read_unlock = labels_rcu_read_unlock,
};

/*
 * percpu-rcuref-unmanaged: the series' step before management, labels on
 * a percpu_rcuref in per-CPU mode whose owner kills it.  The policy's
 * reference is the initial one, so dropping it when the label is replaced
 * (or the model is destroyed) is percpu_rcuref_kill(): the ref switches to
 * atomic mode and is released once the tasks' references are gone.  The
 * cost the managed variants avoid is that someone must know when a label
 * dies; here the policy does, which is true of replaced profile labels but
 * not of every label the kernel creates (hence the manager).
 */
static void labels_prcu_unmanaged_init(struct labels_label *l)
{
	if (percpu_rcuref_init(&l->count.prcu, labels_prcu_unpublish, labels_prcu_release, 0))
		bench_die("labels: percpu_rcuref_init failed");
}

static void labels_prcu_kill(struct labels_label *l)
{
	percpu_rcuref_kill(&l->count.prcu);
}

static const struct labels_refops labels_prcu_unmanaged_ops = {
	.init = labels_prcu_unmanaged_init,
	.live = labels_nop,
	.get = labels_prcu_get,
	.tryget = labels_prcu_tryget,
	.put = labels_prcu_put,
	.drop = labels_prcu_kill,
	.exit = labels_prcu_exit,
	.read_lock = percpu_rcuref_read_lock,
	.read_unlock = percpu_rcuref_read_unlock,
};

/* The kills' switches and the deferred releases they queue: wait for all. */
static void labels_prcu_unmanaged_drain(struct labels_model *m)
{
	if (percpu_rcuref_barrier())
		bench_die("labels: percpu_rcuref_barrier failed");
}

/*
 * hazptr: hazard pointers, the report's future work.  Long-lived
 * references (the policy's, each credential's, and the tryget that follows
 * a stale label to its newest) stay kref counts; an access to the fresh
 * label (secid, file open) takes no reference but publishes the label in
 * the thread's own hazard slot instead: a store to a line no other thread
 * writes, then a full fence.  A label whose count reaches zero is not
 * handed to the reaper while any slot still holds it.
 *
 * Ordering: the reader's store to its slot and its fence, against the
 * releaser's fence and scan (labels_hazard_release()): with both fences
 * seq_cst, either the scan sees the slot, or the reader's check after its
 * fence sees the label gone.  That check is the credential's reference
 * here: the label a task checks against is pinned by the task's own
 * credential (condref's argument), so it cannot fail and costs nothing; the
 * store and the fence are what a hazard-pointer access costs.
 *
 * ThreadSanitizer does not model fences (gcc warns, -Wtsan).  Under it the
 * protect is one seq_cst exchange, a full barrier as well, and the release
 * has no fence: the check the fences order is the credential's reference,
 * which TSan sees, and the scan's acquire loads pair with the clears.
 */
struct labels_hazard_slot {
	struct labels_label *label;	/* written by its thread only */
} __attribute__((aligned(128)));

static struct labels_hazard_slot *labels_hazard_slots;	/* one per thread, setup() */
static unsigned int labels_hazard_nslots;
static __thread struct labels_hazard_slot *labels_hazard_mine;

static inline __attribute__((always_inline)) void labels_hazard_protect(struct labels_label *l)
{
#ifdef __SANITIZE_THREAD__
	/* Seq_cst: the fence below, in a form TSan models (see above). */
	(void)__atomic_exchange_n(&labels_hazard_mine->label, l, __ATOMIC_SEQ_CST);
#else
	__atomic_store_n(&labels_hazard_mine->label, l, __ATOMIC_RELAXED);
	/* Pairs with the fence in labels_hazard_release(). */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

static inline __attribute__((always_inline)) void labels_hazard_clear(void)
{
	/* Release: the accesses under the hazard happen before a scan sees it clear. */
	__atomic_store_n(&labels_hazard_mine->label, NULL, __ATOMIC_RELEASE);
}

/* The count reached zero: wait until no hazard slot holds the label. */
static void labels_hazard_release(struct kref *kref)
{
	struct labels_label *l = labels_of(kref, count.kref);

#ifndef __SANITIZE_THREAD__
	/* Pairs with the fence in labels_hazard_protect(). */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
	for (unsigned int i = 0; i < labels_hazard_nslots; i++)
		/* Acquire: pairs with labels_hazard_clear(). */
		while (__atomic_load_n(&labels_hazard_slots[i].label, __ATOMIC_ACQUIRE) == l)
			sched_yield();
	labels_label_release(l);
}

static void labels_hazard_kref_put(struct labels_label *l)
{
	kref_put(&l->count.kref, labels_hazard_release);
}

static const struct labels_refops labels_hazard_ops = {
	.init = labels_kref_init,
	.live = labels_nop,
	.get = labels_kref_get,
	.tryget = labels_kref_tryget,
	.put = labels_hazard_kref_put,
	.read_lock = urcu_bp_read_lock,
	.read_unlock = labels_rcu_read_unlock,
};

enum labels_kind_id {
	LABELS_KIND_KREF,
	LABELS_KIND_RCUREF,
	LABELS_KIND_PCPU_MANAGED,
	LABELS_KIND_PRCU_MANAGED,
	LABELS_KIND_PCPU_ATOMIC,
	LABELS_KIND_PRCU_UNMANAGED,
	LABELS_KIND_HAZARD,
};

static const struct labels_kind labels_kinds[] = {
	[LABELS_KIND_KREF] = { &labels_kref_ops, NULL, false },
	[LABELS_KIND_RCUREF] = { &labels_rcuref_ops, NULL, false },
	[LABELS_KIND_PCPU_MANAGED] = { &labels_pcpu_managed_ops, labels_pcpu_drain, true },
	[LABELS_KIND_PRCU_MANAGED] = { &labels_prcu_managed_ops, labels_pcpu_drain, true },
	[LABELS_KIND_PCPU_ATOMIC] = { &labels_pcpu_atomic_ops, NULL, false },
	[LABELS_KIND_PRCU_UNMANAGED] = { &labels_prcu_unmanaged_ops,
					 labels_prcu_unmanaged_drain, false },
	[LABELS_KIND_HAZARD] = { &labels_hazard_ops, NULL, false },
};

/*
 * The newest label of @l's lineage, with a reference (aa_get_label_rcu()):
 * the proxy is read under RCU, and a tryget that fails (the newest was
 * replaced and released meanwhile) reads the proxy again.
 */
static inline __attribute__((always_inline)) struct labels_label *
labels_get_newest(struct labels_label *l, const struct labels_refops *ops)
{
	struct labels_label *newest;

	ops->read_lock();
	do {
		/* rcu_dereference: pairs with labels_publish()'s release. */
		newest = __atomic_load_n(&l->proxy->label, __ATOMIC_ACQUIRE);
	} while (!ops->tryget(newest));
	ops->read_unlock();
	return newest;
}

/*
 * The label to check against, and what the check holds on it that
 * labels_end() must drop.  kref and the others: a reference on every
 * access.  condref: none unless the credential's label is stale (@mode is
 * LABELS_CONDREF for the accesses that take none: both under condref, the
 * secid lookup under secid-fix).  hazptr: a hazard pointer unless stale.
 */
static inline __attribute__((always_inline)) struct labels_label *
labels_begin(struct labels_label *cred, const struct labels_refops *ops, enum labels_mode mode,
	     enum labels_hold *hold)
{
	*hold = LABELS_HOLD_REF;
	if (percpuref_unlikely(labels_label_is_stale(cred)))
		return labels_get_newest(cred, ops);
	if (mode == LABELS_CONDREF) {
		*hold = LABELS_HOLD_NONE;
		return cred;
	}
	if (mode == LABELS_HAZARD) {
		*hold = LABELS_HOLD_HAZARD;
		labels_hazard_protect(cred);
		return cred;
	}
	ops->get(cred);
	return cred;
}

static inline __attribute__((always_inline)) void
labels_end(struct labels_label *l, const struct labels_refops *ops, enum labels_hold hold)
{
	if (hold == LABELS_HOLD_REF)
		ops->put(l);
	else if (hold == LABELS_HOLD_HAZARD)
		labels_hazard_clear();
}

static void __attribute__((noinline, cold))
labels_report_violation(struct labels_task *task, const struct labels_label *l, unsigned int i,
			uint64_t need)
{
	if (!__atomic_fetch_add(&task->s->violations, 1, __ATOMIC_RELAXED))
		fprintf(stderr, "labels: decision with rules version %llu of %s after "
			"replacement %llu completed\n",
			(unsigned long long)l->rules[i]->version, l->proxy->vec[i]->name,
			(unsigned long long)need);
}

static void __attribute__((noinline, cold))
labels_report_poison(struct labels_task *task, const struct labels_label *l)
{
	if (!__atomic_fetch_add(&task->s->poisoned_reads, 1, __ATOMIC_RELAXED))
		fprintf(stderr, "labels: read the secid of released label %p\n", (const void *)l);
}

/* Step 4: the request's own work, on memory nobody else touches. */
static inline __attribute__((always_inline)) void labels_private_work(struct labels_task *task)
{
	uint64_t x = task->rng;

	for (long i = 0; i < opt_work; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		task->buf[x & (LABELS_BUF_WORDS - 1)] += x;
	}
	task->rng = x;
}

/* One request (see the top of the file); @ops and @mode are constants. */
static inline __attribute__((always_inline)) void
labels_request(struct labels_task *task, const struct labels_refops *ops, enum labels_mode mode)
{
	struct labels_label *cred = task->cred, *l;
	uint64_t need[LABELS_STACK_MAX];
	enum labels_hold hold;
	bool allowed;
	uint32_t secid;

	if (mode != LABELS_OFF) {
		/* 1: only this task writes its credential. */
		if (percpuref_unlikely(labels_label_is_stale(cred))) {
			task->cred = labels_get_newest(cred, ops);
			ops->put(cred);
			cred = task->cred;
			task->refreshes++;
		}

		/* 2: secid; the secid fix takes no reference here. */
		l = labels_begin(cred, ops, mode == LABELS_SECID_FIX ? LABELS_CONDREF : mode, &hold);
		secid = __atomic_load_n(&l->secid, __ATOMIC_RELAXED);
		if (percpuref_unlikely(secid == LABELS_SECID_POISON))
			labels_report_poison(task, l);
		task->secids += secid;
		labels_end(l, ops, hold);

		/*
		 * 3: file open.  Acquire: pairs with the loader's release of
		 * completed, after which it can only resolve to newer rules.
		 * The components do not change across versions.
		 */
		for (unsigned int i = 0; i < cred->size; i++)
			need[i] = __atomic_load_n(&cred->proxy->vec[i]->completed, __ATOMIC_ACQUIRE);
		l = labels_begin(cred, ops, mode == LABELS_SECID_FIX ? LABELS_REF : mode, &hold);
		allowed = labels_label_allows(l, labels_paths[task->path], LABELS_MAY_READ);
		for (unsigned int i = 0; i < l->size; i++)
			if (percpuref_unlikely(l->rules[i] && l->rules[i]->version < need[i]))
				labels_report_violation(task, l, i, need[i]);
		labels_end(l, ops, hold);
		task->mismatches += allowed != task->expect[task->path];
		task->path = (task->path + 1) % LABELS_NPATHS;
	}
	labels_private_work(task);
}

static inline __attribute__((always_inline)) void
labels_loop(struct bench_thread *t, const struct labels_refops *ops, enum labels_mode mode)
{
	struct labels_task *task = t->local;

	while (bench_running(t)) {
		for (int i = 0; i < BENCH_BATCH; i++)
			labels_request(task, ops, mode);
		bench_count(t, BENCH_BATCH);
	}
}

static void labels_off_loop(struct bench_thread *t)
{
	labels_loop(t, &labels_kref_ops, LABELS_OFF);
}

static void labels_kref_loop(struct bench_thread *t)
{
	labels_loop(t, &labels_kref_ops, LABELS_REF);
}

static void labels_condref_loop(struct bench_thread *t)
{
	labels_loop(t, &labels_kref_ops, LABELS_CONDREF);
}

static void labels_rcuref_loop(struct bench_thread *t)
{
	labels_loop(t, &labels_rcuref_ops, LABELS_REF);
}

static void labels_pcpu_managed_loop(struct bench_thread *t)
{
	labels_loop(t, &labels_pcpu_managed_ops, LABELS_REF);
}

static void labels_prcu_managed_loop(struct bench_thread *t)
{
	labels_loop(t, &labels_prcu_managed_ops, LABELS_REF);
}

static void labels_secid_fix_loop(struct bench_thread *t)
{
	labels_loop(t, &labels_kref_ops, LABELS_SECID_FIX);
}

static void labels_pcpu_atomic_loop(struct bench_thread *t)
{
	labels_loop(t, &labels_pcpu_atomic_ops, LABELS_REF);
}

static void labels_prcu_unmanaged_loop(struct bench_thread *t)
{
	labels_loop(t, &labels_prcu_unmanaged_ops, LABELS_REF);
}

static void labels_hazard_loop(struct bench_thread *t)
{
	labels_loop(t, &labels_hazard_ops, LABELS_HAZARD);
}

/* Resident set size in KiB. */
static long labels_rss_kb(void)
{
	FILE *f = fopen("/proc/self/statm", "r");
	long size = 0, resident = 0;

	if (!f)
		return 0;
	if (fscanf(f, "%ld %ld", &size, &resident) != 2)
		resident = 0;
	fclose(f);
	return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* The high-water mark of the resident set (VmHWM) in KiB. */
static long labels_hwm_kb(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kb = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmHWM: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

static void labels_sample_memory(struct labels_state *s)
{
	struct percpuref_counter_stats pcpu;
	long rss = labels_rss_kb();

	percpuref_get_counter_stats(&pcpu);
	/* Only the loader (and the main thread after joining it) writes these. */
	if (rss > s->rss_peak_kb)
		s->rss_peak_kb = rss;
	if (pcpu.in_use > s->pcpu_peak)
		s->pcpu_peak = pcpu.in_use;
}

/*
 * The loader: a replacement every 1/--churn seconds on an absolute
 * schedule (it catches up when a replacement took longer than a period),
 * and a memory sample every 10 ms.
 */
static void *labels_loader(void *arg)
{
	struct labels_state *s = arg;
	struct labels_model *m = s->model;
	struct labels_lineage *hot = s->task_lineage->vec[0];
	uint64_t period = (uint64_t)(1e9 / opt_churn), next = bench_clock_ns(CLOCK_MONOTONIC), sampled = 0;
	unsigned int k = 0, turn = 0, round = 0;

	pthread_mutex_lock(&s->loader_lock);
	while (!s->loader_stop) {
		struct labels_lineage *p;
		uint64_t now = bench_clock_ns(CLOCK_MONOTONIC);

		if (now < next) {
			struct timespec ts = { .tv_sec = next / 1000000000u,
					       .tv_nsec = next % 1000000000u };

			pthread_cond_timedwait(&s->loader_cond, &s->loader_lock, &ts);
			continue;
		}
		pthread_mutex_unlock(&s->loader_lock);
		next += period;
		/* Every other replacement hits the workers' profile. */
		if (turn++ % 2 == 0 && !hot->unconfined) {
			p = hot;
		} else {
			struct labels_ns *ns = &m->ns[k % m->nns];

			p = ns->profiles[round % ns->nprofiles];
			if (++k % m->nns == 0)
				round++;
		}
		labels_replace_profile(m, p);
		if (now - sampled >= 10000000u) {
			labels_sample_memory(s);
			sampled = now;
		}
		pthread_mutex_lock(&s->loader_lock);
	}
	pthread_mutex_unlock(&s->loader_lock);
	return NULL;
}

/* The process's VmHWM, once at exit: a figure of the process, not of a run. */
static void labels_print_hwm(void)
{
	fflush(stdout);
	fprintf(stderr, "labels: process peak resident (VmHWM): %ld KiB\n", labels_hwm_kb());
}

/* What the options cannot be: a usage error before anything runs. */
static const char *labels_validate(void)
{
	static char why[64];

	/*
	 * The loops check the stop flag once per BENCH_BATCH requests: at a
	 * million rounds (2500 times the default; 1.6 ms a request on the
	 * test machine) a measurement still stops within about 0.1 s.
	 */
	if (opt_work < 0 || opt_work > 1000000)
		return "--work: want 0..1000000";
	/*
	 * The loader's period, 1e9 / R ns, must fit its uint64_t.  Past the
	 * rate it can reach (some 40000 a second on the test machine) it
	 * runs back to back, so a million is a bound, not a limit in use.
	 */
	if (opt_churn != 0 && !(opt_churn >= 0.001 && opt_churn <= 1000000))
		return "--churn: want 0 (none) or 0.001..1000000";
	/* What percpu_ref_managed_set_config() takes, checked before any point runs. */
	if (opt_scan_ms < 0 || opt_scan_ms > (long)PERCPU_REF_MANAGED_INTERVAL_MAX_MS) {
		snprintf(why, sizeof(why), "--scan-ms: want 0..%lu",
			 PERCPU_REF_MANAGED_INTERVAL_MAX_MS);
		return why;
	}
	if (opt_namespaces < 1 || opt_namespaces > 64)
		return "--namespaces: want 1..64";
	if (opt_profiles < 2 || opt_profiles > 1024)
		return "--profiles: want 2..1024";
	if (opt_stacks < 0 || opt_stacks >= opt_profiles)
		return "--stacks: want 0 .. profiles - 1";
	if (strcmp(opt_profile, "unconfined") && strcmp(opt_profile, "nginx"))
		return "--profile: want unconfined or nginx";
	opt_unconfined = !strcmp(opt_profile, "unconfined");
	return NULL;
}

static void labels_setup(struct bench_run *run)
{
	struct labels_state *s = bench_zalloc(sizeof(*s));
	struct labels_config cfg = {
		.namespaces = opt_namespaces,
		.profiles = opt_profiles,
		.stacks = opt_stacks,
	};
	pthread_condattr_t attr;

	s->kind = &labels_kinds[run->variant->arg];
	if (s->kind->managed) {
		struct percpu_ref_managed_config mc;

		/* Every field: get_config() carried PERCPUREF_SCAN_STRATEGY and
		 * PERCPUREF_SCAN_MAX from the environment into the run, which
		 * neither the table nor the JSON names (managed.c's configure()). */
		mc = (struct percpu_ref_managed_config){
			.interval_ms = (unsigned long)opt_scan_ms,
			.max_per_scan = PERCPU_REF_MANAGED_MAX_PER_SCAN,
			.strategy = PERCPU_REF_SCAN_FILTERED,
		};
		if (percpu_ref_managed_set_config(&mc))
			bench_die("labels: percpu_ref_managed_set_config failed");
	}
	if (s->kind == &labels_kinds[LABELS_KIND_HAZARD]) {
		labels_hazard_nslots = run->nthreads;
		labels_hazard_slots = bench_zalloc(run->nthreads * sizeof(*labels_hazard_slots));
	}
	s->model = labels_model_create(&cfg, s->kind->ops);
	s->task_lineage = labels_lineage_find(&s->model->ns[0], opt_profile);
	if (!s->task_lineage)
		bench_die("labels: no %s profile in the root namespace", opt_profile);
	pthread_mutex_init(&s->loader_lock, NULL);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&s->loader_cond, &attr);
	pthread_condattr_destroy(&attr);
	run->state = s;
	if (opt_churn > 0) {
		static bool hwm_registered;

		if (!hwm_registered && !atexit(labels_print_hwm))
			hwm_registered = true;
		labels_sample_memory(s);
		s->loader_start_ns = bench_clock_ns(CLOCK_MONOTONIC);
		if (pthread_create(&s->loader, NULL, labels_loader, s))
			bench_die("labels: cannot start the loader thread");
	}
}

/* The task execs into its label: an RCU lookup in the label set, then tryget. */
static void labels_thread_init(struct bench_thread *t)
{
	struct labels_state *s = t->run->state;
	struct labels_task *task = bench_zalloc(sizeof(*task));

	task->s = s;
	if (labels_hazard_slots)
		labels_hazard_mine = &labels_hazard_slots[t->index];
	task->rng = 0x9e3779b97f4a7c15ull * (t->index + 1);
	task->expect = opt_unconfined ? labels_unconfined_reads : labels_nginx_reads;
	if (t->run->variant->loop != labels_off_loop) {
		const struct labels_refops *ops = s->kind->ops;
		struct labels_label *l;

		ops->read_lock();
		do {
			/* rcu_dereference: pairs with labels_publish()'s release. */
			l = __atomic_load_n(&s->task_lineage->label, __ATOMIC_ACQUIRE);
		} while (!ops->tryget(l));
		ops->read_unlock();
		task->cred = l;
	}
	t->local = task;
}

static void labels_thread_fini(struct bench_thread *t)
{
	struct labels_state *s = t->run->state;
	struct labels_task *task = t->local;

	if (task->cred)
		s->kind->ops->put(task->cred);
	__atomic_add_fetch(&s->wrong_decisions, task->mismatches, __ATOMIC_RELAXED);
	__atomic_add_fetch(&s->refreshes, task->refreshes, __ATOMIC_RELAXED);
	free(task);
}

/*
 * The churn figures, as metrics of the measurement (the harness's second
 * table and the JSON): what the loader achieved, how many labels were
 * alive and stale, the memory they held, and how long a stale label took
 * to be freed.
 */
static void labels_report_churn(struct bench_run *run, const struct labels_state *s,
				double seconds, const struct labels_stats *during,
				const struct labels_stats *final)
{
	bench_report_metric(run, "repl_rate", during->replacements / seconds, "/s");
	bench_report_metric(run, "moved", s->refreshes, NULL);
	bench_report_metric(run, "alive_peak", during->alive_peak, NULL);
	bench_report_metric(run, "alive_end", during->alive, NULL);
	bench_report_metric(run, "stale_peak", during->stale_peak, NULL);
	bench_report_metric(run, "stale_end", during->stale, NULL);
	bench_report_metric(run, "rss_peak", s->rss_peak_kb, "KiB");
	bench_report_metric(run, "pcpu_peak", s->pcpu_peak, NULL);
	/* Fresh labels freed by the teardown are not stale: not counted. */
	bench_report_metric(run, "released", final->reaped_stale, NULL);
	bench_report_metric(run, "release_mean",
			    final->reaped_stale ? final->reap_ns_sum / 1e6 / final->reaped_stale
						: NAN, "ms");
	bench_report_metric(run, "release_max", final->reaped_stale ? final->reap_ns_max / 1e6
								    : NAN, "ms");
}

static void labels_teardown(struct bench_run *run)
{
	struct labels_state *s = run->state;
	struct labels_model *m = s->model;
	const char *name = run->variant->name;
	struct labels_stats during = { 0 }, final;
	double seconds = 0;

	if (opt_churn > 0) {
		pthread_mutex_lock(&s->loader_lock);
		s->loader_stop = true;
		pthread_cond_signal(&s->loader_cond);
		pthread_mutex_unlock(&s->loader_lock);
		pthread_join(s->loader, NULL);
		labels_sample_memory(s);
		seconds = (bench_clock_ns(CLOCK_MONOTONIC) - s->loader_start_ns) / 1e9;
		during = (struct labels_stats){
			.replacements = m->stats.replacements,
			.alive_peak = m->stats.alive_peak,
			.alive = __atomic_load_n(&m->stats.alive, __ATOMIC_RELAXED),
			.stale_peak = m->stats.stale_peak,
			.stale = __atomic_load_n(&m->stats.stale, __ATOMIC_RELAXED),
		};
	}
	labels_model_destroy(m, s->kind->drain, &final);
	/* Every label is freed: no release scans the slots any more. */
	free(labels_hazard_slots);
	labels_hazard_slots = NULL;
	labels_hazard_nslots = 0;
	if (opt_churn > 0)
		labels_report_churn(run, s, seconds, &during, &final);
	if (s->violations || s->poisoned_reads || s->wrong_decisions)
		bench_die("labels %s, %u threads: %llu decisions on superseded rules, "
			  "%llu reads of released labels, %llu wrong verdicts", name, run->nthreads,
			  (unsigned long long)s->violations, (unsigned long long)s->poisoned_reads,
			  (unsigned long long)s->wrong_decisions);
	pthread_cond_destroy(&s->loader_cond);
	pthread_mutex_destroy(&s->loader_lock);
	free(s);
}

static const struct bench_variant labels_variants[] = {
	{ "off", "no label work (apparmor=off)", labels_off_loop, LABELS_KIND_KREF },
	{ "kref", "kref get/put on every access (apparmor=on)", labels_kref_loop,
	  LABELS_KIND_KREF },
	{ "secid-fix", "no reference for the secid lookup, kref for file open (2516fde1fa00)",
	  labels_secid_fix_loop, LABELS_KIND_KREF },
	{ "condref", "a reference only for a stale label (upstream file_open fix)",
	  labels_condref_loop, LABELS_KIND_KREF },
	{ "percpu-managed", "percpu_ref released by the reclaimer (the seed's fix)",
	  labels_pcpu_managed_loop, LABELS_KIND_PCPU_MANAGED },
	{ "percpu-rcuref", "managed percpu_rcuref: release deferred past a grace period",
	  labels_prcu_managed_loop, LABELS_KIND_PRCU_MANAGED },
	{ "rcuref", "rcuref_get/rcuref_put (Linux 6.4 rcuref_t)", labels_rcuref_loop,
	  LABELS_KIND_RCUREF },
	{ "percpu-atomic", "percpu_ref kept in atomic mode (the series' first step)",
	  labels_pcpu_atomic_loop, LABELS_KIND_PCPU_ATOMIC },
	{ "percpu-rcuref-unmanaged", "per-CPU percpu_rcuref the policy kills on replacement",
	  labels_prcu_unmanaged_loop, LABELS_KIND_PRCU_UNMANAGED },
	{ "hazptr", "a hazard pointer per access instead of a reference (future work)",
	  labels_hazard_loop, LABELS_KIND_HAZARD },
	{ 0 },
};

static const struct bench_option labels_options[] = {
	{ .name = "work", .type = BENCH_OPT_LONG, .value = &opt_work,
	  .help = "private work per request, in xorshift rounds" },
	{ .name = "churn", .type = BENCH_OPT_DOUBLE, .value = &opt_churn,
	  .help = "profile replacements per second by a loader thread (0: none)" },
	{ .name = "namespaces", .type = BENCH_OPT_LONG, .value = &opt_namespaces,
	  .help = "policy namespaces" },
	{ .name = "profiles", .type = BENCH_OPT_LONG, .value = &opt_profiles,
	  .help = "profiles per namespace" },
	{ .name = "stacks", .type = BENCH_OPT_LONG, .value = &opt_stacks,
	  .help = "stacked labels per namespace (fewer than profiles)" },
	{ .name = "scan-ms", .type = BENCH_OPT_LONG, .value = &opt_scan_ms,
	  .help = "percpu-managed, percpu-rcuref: reclaimer scan interval in ms (0: back to back)" },
	{ .name = "profile", .type = BENCH_OPT_STRING, .value = &opt_profile,
	  .help = "the workers' label: unconfined (the report's nginx; no table walk) or nginx" },
	{ 0 },
};

static const struct bench_workload labels = {
	.name = "labels",
	.help = "AppArmor labels: nginx requests (secid + file open) on one shared label",
	.op = "req",
	.variants = labels_variants,
	.options = labels_options,
	.setup = labels_setup,
	.thread_init = labels_thread_init,
	.thread_fini = labels_thread_fini,
	.teardown = labels_teardown,
	.validate = labels_validate,
};
PERCPUREF_BENCH_WORKLOAD(labels);
