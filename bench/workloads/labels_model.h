/* SPDX-License-Identifier: MIT */
/*
 * labels_model.h - a model of AppArmor's label refcounting, for the labels
 * workload (labels.c).  Not library API: everything here is the benchmark's.
 *
 * The objects, after security/apparmor/{label,policy,domain}.c:
 *
 *   namespace   a policy namespace: a lock, its label set, its unconfined
 *               label and its profiles.
 *   lineage     everything of a label that survives replacement: its name,
 *               its components (the profiles it stacks), its place in the
 *               label set, and the proxy, a pointer to its newest version.
 *               A profile is a lineage of one component (itself).
 *   label       one version of a lineage: a refcount, a stale flag, a
 *               secid, and one compiled permission table per component.
 *   rules       a compiled permission table (a DFA over path bytes) with the
 *               policy version it was compiled from.
 *   label set   per namespace, a binary search tree of lineages keyed by
 *               their components; RCU lookups, inserts under the namespace
 *               lock.  A lineage's newest label hangs off its tree node (the
 *               proxy pointer), so the set always resolves to fresh labels.
 *
 * Replacement (labels_replace_profile(), the loader's aa_replace_profiles)
 * compiles new rules for a profile, makes a new label for it and for every
 * stack that contains it, publishes each through its proxy, marks each old
 * label stale, records the version as completed, and drops the policy's
 * reference on the old labels.  A stale label resolves to its newest
 * replacement through the proxy, as AppArmor's aa_get_newest_label() does;
 * tasks that find their credential's label stale move to the newest one.
 *
 * Ownership: the policy (the lineage) holds one reference on its newest
 * label; each task's credential holds one on its label.  When the last
 * reference goes the count's release calls labels_label_release(), which
 * poisons the label's secid and hands the label to the reaper thread; the
 * reaper frees it after a liburcu-bp grace period, because RCU readers
 * (proxy and label-set lookups) may still be looking at it.  A count that
 * defers its own release past a grace period (percpu_rcuref) calls
 * labels_label_unpublish() at zero and labels_label_free() after it.
 *
 * Memory ordering (loader -> hot path), all release/acquire pairs:
 *   1. the new label is initialised, then published through the proxy with
 *      a release store; readers load the proxy with acquire
 *      (rcu_assign_pointer / rcu_dereference);
 *   2. the old label's stale flag is set with a release RMW after step 1;
 *      a reader that sees it stale (acquire) then loads the proxy and finds
 *      the new label or a newer one;
 *   3. the profile's completed version is stored with release after step 2;
 *      a reader that loads it (acquire) before resolving its label therefore
 *      sees the stale flag, and resolves to rules at least that new.  That
 *      is the security property the workload checks on every decision.
 */
#ifndef PERCPUREF_BENCH_LABELS_MODEL_H
#define PERCPUREF_BENCH_LABELS_MODEL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <percpuref/kref.h>
#include <percpuref/percpu_rcuref.h>
#include <percpuref/percpu_ref.h>
#include <percpuref/rcuref.h>

#define LABELS_STACK_MAX 2	/* components of a label: a profile, or a stack of two */
#define LABELS_STALE 1u		/* label flag: replaced; resolve through the proxy */
/* A released label's secid: a reader that sees it read a dead label. */
#define LABELS_SECID_POISON 0xdeadbeefu

/* Permission bits, as AppArmor's AA_MAY_*. */
enum {
	LABELS_MAY_WRITE = 2,
	LABELS_MAY_READ = 4,
	LABELS_MAY_APPEND = 8,
};

/* A compiled permission table: a DFA over path bytes, immutable once built. */
struct labels_rules {
	uint64_t version;	/* policy version it was compiled from */
	unsigned int nclasses;	/* byte equivalence classes */
	unsigned int nstates;	/* state 0 rejects, state 1 starts */
	const uint8_t *ec;	/* [256]: byte -> class */
	const uint16_t *next;	/* [state * nclasses + class] */
	const uint32_t *accept;	/* [state]: LABELS_MAY_* granted */
	/* Labels using it: changed by the loader and the reaper (atomic). */
	unsigned int users;
};

struct labels_label;
struct labels_ns;

struct labels_lineage {
	/*
	 * The proxy: the newest label, which the policy holds a reference
	 * on.  Written by the loader under the namespace lock with release;
	 * read under RCU with acquire (rcu_assign_pointer/rcu_dereference).
	 */
	struct labels_label *label;
	/*
	 * Profiles only: the rules version of the last replacement that
	 * completed.  Release store by the loader after the old labels were
	 * marked stale; acquire load before every permission decision.
	 */
	uint64_t completed;
	/* Label-set tree links: written once (release) under the lock. */
	struct labels_lineage *left, *right;
	uint64_t key;		/* tree order: a hash of the components' ids */
	struct labels_ns *ns;
	unsigned int size;
	struct labels_lineage *vec[LABELS_STACK_MAX];	/* components; a profile: itself */
	uint32_t id;
	bool unconfined;	/* the namespace's unconfined profile: no rules */
	char name[64];
};

struct labels_label {
	/*
	 * The hot line, laid out as struct aa_label: the count shares its
	 * cache line with what every check reads (flags, secid, the rules),
	 * so a written count also costs its readers a miss.  Only the member
	 * of the running variant is used.
	 */
	union {
		struct kref kref;
		rcuref_t rcuref;
		struct percpu_ref pcpu;
		struct percpu_rcuref prcu;
	} count;
	/* LABELS_STALE: set once by the loader (release), read with acquire. */
	unsigned int flags;
	/* Written at creation and poisoned at release: relaxed atomics. */
	uint32_t secid;
	struct labels_lineage *proxy;
	unsigned int size;
	const struct labels_rules *rules[LABELS_STACK_MAX];	/* NULL: unconfined */
	/* Cold: the loader and the reaper. */
	uint64_t stale_ns;	/* CLOCK_MONOTONIC when marked stale */
	struct labels_label *next_dead;	/* reaper list, under its lock */
};

/*
 * How a variant counts references on labels.  Calls on a label the caller
 * holds a reference to, except tryget, which is for a label found under an
 * RCU read-side section.
 */
struct labels_refops {
	/* One reference (the policy's), before the label is published. */
	void (*init)(struct labels_label *l);
	/* The label is about to be published (percpu-managed: manage it). */
	void (*live)(struct labels_label *l);
	void (*get)(struct labels_label *l);
	bool (*tryget)(struct labels_label *l);
	/* The put that drops the last reference calls labels_label_release(). */
	void (*put)(struct labels_label *l);
	/*
	 * Drops the policy's reference on a label it replaced, or at
	 * destroy; NULL: put.  A count whose initial reference belongs to
	 * an owner that kills it (percpu-rcuref-unmanaged) kills here.
	 */
	void (*drop)(struct labels_label *l);
	/* After the grace period, before the memory is freed; may be NULL. */
	void (*exit)(struct labels_label *l);
	/* The RCU read side that the count's deferred release waits for. */
	void (*read_lock)(void);
	void (*read_unlock)(void);
};

struct labels_ns {
	pthread_mutex_t lock;		/* replacements and tree inserts */
	struct labels_lineage *root;	/* label set: RCU-published tree */
	struct labels_lineage *unconfined;
	struct labels_lineage **profiles;	/* profiles[0] is "nginx" in the root ns */
	unsigned int nprofiles;
	struct labels_lineage **stacks;
	unsigned int nstacks;
	struct labels_model *model;
	char name[32];
};

/* Counters over the model's life; "now" values are atomics. */
struct labels_stats {
	long alive;		/* labels allocated, not yet freed */
	long stale;		/* stale labels not yet freed: "outstanding" */
	long alive_peak;	/* maxima: updated by the loader thread */
	long stale_peak;
	uint64_t replacements;	/* profile replacements completed */
	uint64_t reaped_stale;	/* stale labels freed ... */
	uint64_t reap_ns_sum;	/* ... and the time from stale to freed */
	uint64_t reap_ns_max;
};

struct labels_config {
	unsigned int namespaces;
	unsigned int profiles;	/* per namespace */
	unsigned int stacks;	/* compound labels per namespace, < profiles */
};

struct labels_model {
	const struct labels_refops *ops;
	struct labels_ns *ns;
	unsigned int nns;
	uint64_t version;	/* last rules version compiled (loader) */
	uint32_t next_id;	/* lineage ids and secids (loader) */
	struct labels_stats stats;

	/* The reaper: frees released labels after a grace period. */
	pthread_mutex_t dead_lock;
	pthread_cond_t dead_cond;	/* a label was released, or stop */
	struct labels_label *dead;	/* released, waiting for a grace period */
	long dead_pending;		/* released, not yet freed (dead_lock) */
	bool reaper_stop;
	pthread_t reaper;
};

struct labels_model *labels_model_create(const struct labels_config *cfg,
					 const struct labels_refops *ops);
/*
 * Drops the policy's references, waits until every label was freed, and
 * frees the model; dies when a label or a table leaked.  The caller's
 * references must be gone, and nobody may use the model meanwhile.
 * @drain, if not NULL, is called after the policy's puts: it must get every
 * label whose last reference is gone released (percpu-managed: the
 * reclaimer's references).  The final statistics are copied to @final.
 */
void labels_model_destroy(struct labels_model *m, void (*drain)(struct labels_model *m),
			  struct labels_stats *final);

/* The lineage named @name ("nginx", "nginx//&php-fpm", "unconfined") in @ns. */
struct labels_lineage *labels_lineage_find(struct labels_ns *ns, const char *name);
/* Replaces @profile's rules: new labels for it and its stacks (loader). */
void labels_replace_profile(struct labels_model *m, struct labels_lineage *profile);
/*
 * Called by a count's release: the label's last reference is gone.  Marks
 * it dead (labels_label_unpublish()) and has the reaper free it after a
 * grace period.
 */
void labels_label_release(struct labels_label *l);
/*
 * For a count that defers its own release past a grace period
 * (percpu_rcuref): unpublish when the last reference goes (the secid is
 * poisoned: a holder that reads it used a dead label), then free once the
 * grace period has passed.
 */
void labels_label_unpublish(struct labels_label *l);
void labels_label_free(struct labels_label *l);
/*
 * The end of a liburcu-bp read-side section.  ThreadSanitizer cannot see
 * the grace period (liburcu is not instrumented), so it took the reaper's
 * free of a label that a reader had just read (a failed get on a count
 * gone to zero) for a race: a release here, an acquire after the grace
 * period give it the edge, as the library does for percpu_rcuref.
 */
void labels_rcu_read_unlock(void);
/* Waits until every label released so far has been freed. */
void labels_reap_wait(struct labels_model *m);

/* labels_label_is_stale - acquire: pairs with the loader's stale marking. */
static inline bool labels_label_is_stale(const struct labels_label *l)
{
	return __atomic_load_n(&l->flags, __ATOMIC_ACQUIRE) & LABELS_STALE;
}

/* labels_rules_match - the permissions @r grants @path: one DFA walk. */
static inline uint32_t labels_rules_match(const struct labels_rules *r, const char *path)
{
	unsigned int state = 1;

	for (const unsigned char *p = (const unsigned char *)path; *p; p++)
		state = r->next[state * r->nclasses + r->ec[*p]];
	return r->accept[state];
}

/*
 * labels_label_allows - whether every component of @l grants @request on
 * @path (a stack allows only what all its profiles allow).  An unconfined
 * component has no rules and allows everything, without a walk.
 */
static inline bool labels_label_allows(const struct labels_label *l, const char *path,
				       uint32_t request)
{
	for (unsigned int i = 0; i < l->size; i++)
		if (l->rules[i] && (labels_rules_match(l->rules[i], path) & request) != request)
			return false;
	return true;
}

#endif
