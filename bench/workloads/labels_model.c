/* SPDX-License-Identifier: MIT */
/*
 * labels_model.c - the label model behind the labels workload: namespaces,
 * profiles and stacks, the label set, rule compilation, replacement, and
 * the reaper that frees released labels (see labels_model.h for the objects
 * and the memory-ordering argument).
 *
 * Invariants, checked where it is cheap:
 *   - a lineage's proxy always points at a label that is not stale and on
 *     which the policy holds a reference, so a reader that resolves a stale
 *     label and fails its tryget (the newest was just replaced and released)
 *     finds a newer one on the next load;
 *   - a label is freed only after its last reference was dropped and a
 *     liburcu-bp grace period has passed, so RCU readers never touch freed
 *     memory; its secid is poisoned at release, so a reader holding a
 *     "reference" on a released label sees the poison (labels.c checks);
 *   - when the model is destroyed every label and every table has been
 *     freed: a leak fails the run.
 *
 * The label set is a binary search tree ordered by a hash of the components'
 * ids, so inserts in id order still give a tree of logarithmic expected
 * depth.  Nodes are lineages and are never removed (replacement swaps the
 * proxy pointer that hangs off the node), so an insert only links a fully
 * built leaf with a release store: readers walk it under RCU without locks,
 * and writers serialise on the namespace lock, as AppArmor's labelset does
 * with its rwlock.
 *
 * Why our own reaper and not call_rcu: liburcu hands callbacks over through
 * queues ThreadSanitizer cannot see, so the sanitizer would report every
 * free as a race with the release.  The reaper takes released labels under
 * a mutex (a visible edge), waits urcu_bp_synchronize_rcu(), and frees; the
 * readers' edge to that free is annotated (labels_rcu_read_unlock()).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <urcu/urcu-bp.h>

#include "bench.h"
#include "labels_model.h"

/* One rule of a profile's source: an exact path, or a glob ending in slash, star, star. */
struct labels_rule {
	char pattern[96];
	uint32_t perms;
};
#define LABELS_RULES_MAX 8

static const char *const labels_profile_names[] = {
	"nginx", "php-fpm", "sshd", "cron", "postgres", "redis", "dhclient", "cupsd",
	"named", "ntpd", "snmpd", "avahi-daemon", "rsyslogd", "dovecot", "postfix", "squid",
};
#define LABELS_NAMES (sizeof(labels_profile_names) / sizeof(labels_profile_names[0]))

/* The policy lets go of @l: its owner's kill, or a put (labels_refops.drop). */
static void labels_drop_policy_ref(struct labels_model *m, struct labels_label *l)
{
	if (m->ops->drop)
		m->ops->drop(l);
	else
		m->ops->put(l);
}

/* The source of @profile's rules: nginx's own, or a daemon's usual set. */
static unsigned int labels_profile_source(const struct labels_lineage *profile,
					  struct labels_rule *rules)
{
	static const struct labels_rule nginx[] = {
		{ "/etc/nginx/**", LABELS_MAY_READ },
		{ "/var/www/html/**", LABELS_MAY_READ },
		{ "/usr/share/nginx/**", LABELS_MAY_READ },
		{ "/etc/ssl/certs/**", LABELS_MAY_READ },
		{ "/usr/lib/**", LABELS_MAY_READ },
		{ "/var/log/nginx/**", LABELS_MAY_WRITE | LABELS_MAY_APPEND },
		{ "/run/nginx.pid", LABELS_MAY_READ | LABELS_MAY_WRITE },
	};
	const char *name = profile->name;
	unsigned int n = 0;

	if (!strcmp(name, "nginx")) {
		memcpy(rules, nginx, sizeof(nginx));
		return sizeof(nginx) / sizeof(nginx[0]);
	}
	snprintf(rules[n].pattern, sizeof(rules[n].pattern), "/etc/%s/**", name);
	rules[n++].perms = LABELS_MAY_READ;
	snprintf(rules[n].pattern, sizeof(rules[n].pattern), "/var/lib/%s/**", name);
	rules[n++].perms = LABELS_MAY_READ | LABELS_MAY_WRITE;
	snprintf(rules[n].pattern, sizeof(rules[n].pattern), "/var/log/%s.log", name);
	rules[n++].perms = LABELS_MAY_APPEND;
	snprintf(rules[n].pattern, sizeof(rules[n].pattern), "/run/%s.pid", name);
	rules[n++].perms = LABELS_MAY_READ | LABELS_MAY_WRITE;
	snprintf(rules[n].pattern, sizeof(rules[n].pattern), "/usr/lib/**");
	rules[n++].perms = LABELS_MAY_READ;
	return n;
}

/*
 * Compiles @rules into a DFA: a trie of the patterns in which the node that
 * ends a glob's prefix loops to itself on every byte.  Globs may not nest
 * (no rule below a glob's prefix), which keeps the trie a correct DFA
 * without a subset construction.  Every byte used by a pattern gets its own
 * class, all other bytes share class 0, as AppArmor's equivalence classes.
 */
static struct labels_rules *labels_rules_compile(const struct labels_rule *rules,
						 unsigned int n, uint64_t version)
{
	unsigned int cap = 2, nstates = 2, nclasses = 1;
	uint8_t ec[256] = { 0 };
	struct labels_rules *r;
	uint32_t *accept;
	uint16_t *next;
	bool *glob;
	int (*child)[256];

	for (unsigned int i = 0; i < n; i++)
		cap += strlen(rules[i].pattern);
	child = calloc(cap, sizeof(*child));
	glob = calloc(cap, sizeof(*glob));
	accept = calloc(cap, sizeof(*accept));
	if (!child || !glob || !accept)
		bench_die("labels: out of memory");
	for (unsigned int i = 0; i < n; i++) {
		const char *p = rules[i].pattern;
		size_t len = strlen(p);
		bool is_glob = len >= 3 && !strcmp(p + len - 3, "/**");
		unsigned int state = 1;

		for (size_t k = 0; k < len - (is_glob ? 2 : 0); k++) {
			unsigned char c = p[k];

			if (glob[state])
				bench_die("labels: rule %s lies under a glob", p);
			if (!ec[c])
				ec[c] = nclasses++;
			if (!child[state][c])
				child[state][c] = nstates++;
			state = child[state][c];
		}
		glob[state] |= is_glob;
		accept[state] |= rules[i].perms;
	}

	/* One block, widest members first: accept, next, ec. */
	r = calloc(1, sizeof(*r) + nstates * sizeof(*accept) +
			      nstates * nclasses * sizeof(*next) + 256);
	if (!r)
		bench_die("labels: out of memory");
	r->version = version;
	r->nclasses = nclasses;
	r->nstates = nstates;
	r->accept = memcpy(r + 1, accept, nstates * sizeof(*accept));
	next = (uint16_t *)(r->accept + nstates);
	r->next = next;
	r->ec = memcpy(next + nstates * nclasses, ec, 256);
	for (unsigned int s = 1; s < nstates; s++)
		for (unsigned int c = 0; c < 256; c++)
			next[s * nclasses + ec[c]] = glob[s] ? s : (unsigned int)child[s][c];
	free(child);
	free(glob);
	free(accept);
	return r;
}

static void labels_rules_put(const struct labels_rules *r)
{
	struct labels_rules *w = (struct labels_rules *)r;

	/* Acq_rel: the last user frees what every other user read. */
	if (r && __atomic_sub_fetch(&w->users, 1, __ATOMIC_ACQ_REL) == 0)
		free(w);
}

static int labels_lineage_cmp(const struct labels_lineage *a, const struct labels_lineage *b)
{
	if (a->key != b->key)
		return a->key < b->key ? -1 : 1;
	if (a->size != b->size)
		return a->size < b->size ? -1 : 1;
	for (unsigned int i = 0; i < a->size; i++)
		if (a->vec[i]->id != b->vec[i]->id)
			return a->vec[i]->id < b->vec[i]->id ? -1 : 1;
	return 0;
}

/* Inserts @lin in its namespace's label set; namespace lock held. */
static void labels_set_insert(struct labels_ns *ns, struct labels_lineage *lin)
{
	struct labels_lineage **slot = &ns->root;

	while (*slot)
		slot = labels_lineage_cmp(lin, *slot) < 0 ? &(*slot)->left : &(*slot)->right;
	/* rcu_assign_pointer: the node is complete before readers can reach it. */
	__atomic_store_n(slot, lin, __ATOMIC_RELEASE);
}

/* The lineage with @key's components in @ns's set; RCU read side held. */
static struct labels_lineage *labels_set_find(struct labels_ns *ns,
					      const struct labels_lineage *key)
{
	/* rcu_dereference: pairs with the release store of the insert. */
	struct labels_lineage *n = __atomic_load_n(&ns->root, __ATOMIC_ACQUIRE);

	while (n) {
		int c = labels_lineage_cmp(key, n);

		if (!c)
			return n;
		n = __atomic_load_n(c < 0 ? &n->left : &n->right, __ATOMIC_ACQUIRE);
	}
	return NULL;
}

static void labels_peak(long *peak, long now)
{
	/* Only the loader (or setup, before it starts) updates the peaks. */
	if (now > __atomic_load_n(peak, __ATOMIC_RELAXED))
		__atomic_store_n(peak, now, __ATOMIC_RELAXED);
}

/*
 * A new version of @lin with @rules for a profile, or its components'
 * newest rules for a stack; holds the policy's reference.  Namespace lock
 * held (or setup).
 */
static struct labels_label *labels_label_new(struct labels_model *m, struct labels_lineage *lin,
					     const struct labels_rules *rules)
{
	struct labels_label *l = bench_zalloc(sizeof(*l));

	l->proxy = lin;
	l->size = lin->size;
	__atomic_store_n(&l->secid, ++m->next_id, __ATOMIC_RELAXED);
	for (unsigned int i = 0; i < lin->size; i++) {
		/* The components' newest labels are held by the policy. */
		const struct labels_rules *r = lin->size == 1 ? rules : lin->vec[i]->label->rules[0];

		if (r)
			__atomic_add_fetch(&((struct labels_rules *)r)->users, 1, __ATOMIC_RELAXED);
		l->rules[i] = r;
	}
	m->ops->init(l);
	labels_peak(&m->stats.alive_peak,
		    __atomic_add_fetch(&m->stats.alive, 1, __ATOMIC_RELAXED));
	return l;
}

/* Tree order: splitmix64 over the components' ids, so creation order does
 * not shape the tree. */
static uint64_t labels_key(unsigned int size, struct labels_lineage *const *vec)
{
	uint64_t key = 0;

	for (unsigned int i = 0; i < size; i++) {
		key += vec[i]->id * 0x9e3779b97f4a7c15ull;
		key = (key ^ (key >> 30)) * 0xbf58476d1ce4e5b9ull;
		key = (key ^ (key >> 27)) * 0x94d049bb133111ebull;
		key ^= key >> 31;
	}
	return key;
}

/* A lineage of @vec, or a profile (@size 1, @vec NULL: its own component). */
static struct labels_lineage *labels_lineage_new(struct labels_ns *ns, unsigned int size,
						 struct labels_lineage *const *vec)
{
	struct labels_lineage *lin = bench_zalloc(sizeof(*lin));

	lin->ns = ns;
	lin->size = size;
	lin->id = ++ns->model->next_id;
	for (unsigned int i = 0; i < size; i++)
		lin->vec[i] = vec ? vec[i] : lin;
	lin->key = labels_key(size, lin->vec);
	return lin;
}

/* Makes @l the newest label of its lineage; namespace lock held (or setup). */
static void labels_publish(struct labels_model *m, struct labels_label *l)
{
	m->ops->live(l);
	/* rcu_assign_pointer: pairs with the acquire of every proxy reader. */
	__atomic_store_n(&l->proxy->label, l, __ATOMIC_RELEASE);
}

static void *labels_reaper(void *arg);

static struct labels_lineage *labels_profile_new(struct labels_ns *ns, const char *name,
						 bool unconfined)
{
	struct labels_model *m = ns->model;
	struct labels_lineage *lin = labels_lineage_new(ns, 1, NULL);
	struct labels_rule rules[LABELS_RULES_MAX];
	const struct labels_rules *r = NULL;

	snprintf(lin->name, sizeof(lin->name), "%s", name);
	lin->unconfined = unconfined;
	if (!unconfined)
		r = labels_rules_compile(rules, labels_profile_source(lin, rules), ++m->version);
	labels_publish(m, labels_label_new(m, lin, r));
	__atomic_store_n(&lin->completed, m->version, __ATOMIC_RELAXED);
	labels_set_insert(ns, lin);
	return lin;
}

struct labels_model *labels_model_create(const struct labels_config *cfg,
					 const struct labels_refops *ops)
{
	struct labels_model *m = bench_zalloc(sizeof(*m));
	pthread_condattr_t attr;

	m->ops = ops;
	m->nns = cfg->namespaces;
	m->ns = bench_zalloc(m->nns * sizeof(*m->ns));
	pthread_mutex_init(&m->dead_lock, NULL);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&m->dead_cond, &attr);
	pthread_condattr_destroy(&attr);
	if (pthread_create(&m->reaper, NULL, labels_reaper, m))
		bench_die("labels: cannot start the reaper thread");

	for (unsigned int k = 0; k < m->nns; k++) {
		struct labels_ns *ns = &m->ns[k];

		ns->model = m;
		pthread_mutex_init(&ns->lock, NULL);
		if (k == 0)
			snprintf(ns->name, sizeof(ns->name), "root");
		else
			snprintf(ns->name, sizeof(ns->name), "container%u", k);
		ns->unconfined = labels_profile_new(ns, "unconfined", true);
		ns->nprofiles = cfg->profiles;
		ns->profiles = calloc(ns->nprofiles, sizeof(*ns->profiles));
		ns->nstacks = cfg->stacks;
		ns->stacks = calloc(ns->nstacks ? ns->nstacks : 1, sizeof(*ns->stacks));
		if (!ns->profiles || !ns->stacks)
			bench_die("labels: out of memory");
		for (unsigned int i = 0; i < ns->nprofiles; i++) {
			char name[48];

			if (i < LABELS_NAMES)
				snprintf(name, sizeof(name), "%s", labels_profile_names[i]);
			else
				snprintf(name, sizeof(name), "%s-%u",
					 labels_profile_names[i % LABELS_NAMES], i / (unsigned)LABELS_NAMES);
			ns->profiles[i] = labels_profile_new(ns, name, false);
		}
		/* Stack i: profile i stacked with profile i + 1 ("nginx//&php-fpm"). */
		for (unsigned int i = 0; i < ns->nstacks; i++) {
			struct labels_lineage *vec[2] = { ns->profiles[i], ns->profiles[i + 1] };
			struct labels_lineage *lin = labels_lineage_new(ns, 2, vec);

			snprintf(lin->name, sizeof(lin->name), "%.30s//&%.30s", vec[0]->name,
				 vec[1]->name);
			labels_publish(m, labels_label_new(m, lin, NULL));
			labels_set_insert(ns, lin);
			ns->stacks[i] = lin;
		}
	}
	return m;
}

struct labels_lineage *labels_lineage_find(struct labels_ns *ns, const char *name)
{
	struct labels_lineage key = { .size = 0 }, *found;
	char copy[sizeof(key.name)], *save = NULL;

	snprintf(copy, sizeof(copy), "%s", name);
	for (char *tok = strtok_r(copy, "/&", &save); tok; tok = strtok_r(NULL, "/&", &save)) {
		struct labels_lineage *p = !strcmp(tok, "unconfined") ? ns->unconfined : NULL;

		for (unsigned int i = 0; i < ns->nprofiles && !p; i++)
			if (!strcmp(ns->profiles[i]->name, tok))
				p = ns->profiles[i];
		if (!p || key.size == LABELS_STACK_MAX)
			return NULL;
		key.vec[key.size++] = p;
	}
	if (!key.size)
		return NULL;
	key.key = labels_key(key.size, key.vec);
	urcu_bp_read_lock();
	found = labels_set_find(ns, &key);
	labels_rcu_read_unlock();
	return found;	/* lineages live as long as the model */
}

/* Marks the previous version of @l's lineage stale after @l is published. */
static void labels_mark_stale(struct labels_model *m, struct labels_label *old)
{
	old->stale_ns = bench_clock_ns(CLOCK_MONOTONIC);
	/* Release: after the proxy store (labels_model.h, step 2). */
	__atomic_fetch_or(&old->flags, LABELS_STALE, __ATOMIC_RELEASE);
	labels_peak(&m->stats.stale_peak,
		    __atomic_add_fetch(&m->stats.stale, 1, __ATOMIC_RELAXED));
}

void labels_replace_profile(struct labels_model *m, struct labels_lineage *profile)
{
	struct labels_ns *ns = profile->ns;
	struct labels_rule rules[LABELS_RULES_MAX];
	struct labels_label *old[1 + ns->nstacks], *l;
	unsigned int nold = 0;
	uint64_t version;

	pthread_mutex_lock(&ns->lock);
	/* One loader thread: m->version and m->next_id are its own. */
	version = ++m->version;
	old[nold++] = profile->label;
	l = labels_label_new(m, profile,
			     labels_rules_compile(rules, labels_profile_source(profile, rules),
						  version));
	labels_publish(m, l);
	labels_mark_stale(m, old[0]);
	for (unsigned int i = 0; i < ns->nstacks; i++) {
		struct labels_lineage *s = ns->stacks[i];

		if (s->vec[0] != profile && s->vec[1] != profile)
			continue;
		old[nold++] = s->label;
		labels_publish(m, labels_label_new(m, s, NULL));
		labels_mark_stale(m, old[nold - 1]);
	}
	/* Release: after every stale mark (labels_model.h, step 3). */
	__atomic_store_n(&profile->completed, version, __ATOMIC_RELEASE);
	__atomic_add_fetch(&m->stats.replacements, 1, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&ns->lock);
	/* The policy's references on the replaced labels. */
	for (unsigned int i = 0; i < nold; i++)
		labels_drop_policy_ref(m, old[i]);
}

void labels_label_unpublish(struct labels_label *l)
{
	__atomic_store_n(&l->secid, LABELS_SECID_POISON, __ATOMIC_RELAXED);
}

void labels_label_release(struct labels_label *l)
{
	struct labels_model *m = l->proxy->ns->model;

	labels_label_unpublish(l);
	pthread_mutex_lock(&m->dead_lock);
	l->next_dead = m->dead;
	m->dead = l;
	m->dead_pending++;
	pthread_cond_broadcast(&m->dead_cond);
	pthread_mutex_unlock(&m->dead_lock);
}

void labels_label_free(struct labels_label *l)
{
	struct labels_model *m = l->proxy->ns->model;

	if (l->flags & LABELS_STALE) {
		uint64_t took = bench_clock_ns(CLOCK_MONOTONIC) - l->stale_ns;
		uint64_t max = __atomic_load_n(&m->stats.reap_ns_max, __ATOMIC_RELAXED);

		/* The reaper, or the library's thread for a count that defers. */
		__atomic_sub_fetch(&m->stats.stale, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&m->stats.reaped_stale, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&m->stats.reap_ns_sum, took, __ATOMIC_RELAXED);
		while (took > max && !__atomic_compare_exchange_n(&m->stats.reap_ns_max, &max, took,
								  true, __ATOMIC_RELAXED,
								  __ATOMIC_RELAXED))
			;
	}
	if (m->ops->exit)
		m->ops->exit(l);
	for (unsigned int i = 0; i < l->size; i++)
		labels_rules_put(l->rules[i]);
	__atomic_sub_fetch(&m->stats.alive, 1, __ATOMIC_RELAXED);
	free(l);
}

/* labels_rcu_read_unlock() to the reaper's grace period, for TSan only. */
static char labels_rcu_tsan_sync;

void labels_rcu_read_unlock(void)
{
	percpuref_tsan_release(&labels_rcu_tsan_sync);
	urcu_bp_read_unlock();
}

static void *labels_reaper(void *arg)
{
	struct labels_model *m = arg;

	pthread_mutex_lock(&m->dead_lock);
	for (;;) {
		struct labels_label *list;
		long n = 0;

		while (!m->dead && !m->reaper_stop)
			pthread_cond_wait(&m->dead_cond, &m->dead_lock);
		if (!m->dead)
			break;
		list = m->dead;
		m->dead = NULL;
		pthread_mutex_unlock(&m->dead_lock);
		/* Every RCU reader that could still see these labels is done. */
		urcu_bp_synchronize_rcu();
		percpuref_tsan_acquire(&labels_rcu_tsan_sync);
		while (list) {
			struct labels_label *l = list;

			list = l->next_dead;
			labels_label_free(l);
			n++;
		}
		pthread_mutex_lock(&m->dead_lock);
		m->dead_pending -= n;
		pthread_cond_broadcast(&m->dead_cond);
	}
	pthread_mutex_unlock(&m->dead_lock);
	return NULL;
}

void labels_reap_wait(struct labels_model *m)
{
	pthread_mutex_lock(&m->dead_lock);
	while (m->dead_pending)
		pthread_cond_wait(&m->dead_cond, &m->dead_lock);
	pthread_mutex_unlock(&m->dead_lock);
}

void labels_model_destroy(struct labels_model *m, void (*drain)(struct labels_model *m),
			  struct labels_stats *final)
{
	long alive;

	for (unsigned int k = 0; k < m->nns; k++) {
		struct labels_ns *ns = &m->ns[k];

		labels_drop_policy_ref(m, ns->unconfined->label);
		for (unsigned int i = 0; i < ns->nprofiles; i++)
			labels_drop_policy_ref(m, ns->profiles[i]->label);
		for (unsigned int i = 0; i < ns->nstacks; i++)
			labels_drop_policy_ref(m, ns->stacks[i]->label);
	}
	if (drain)
		drain(m);
	labels_reap_wait(m);
	pthread_mutex_lock(&m->dead_lock);
	m->reaper_stop = true;
	pthread_cond_broadcast(&m->dead_cond);
	pthread_mutex_unlock(&m->dead_lock);
	pthread_join(m->reaper, NULL);
	alive = __atomic_load_n(&m->stats.alive, __ATOMIC_RELAXED);
	if (alive)
		bench_die("labels: %ld labels still alive after every reference was dropped",
			  alive);
	*final = m->stats;

	for (unsigned int k = 0; k < m->nns; k++) {
		struct labels_ns *ns = &m->ns[k];

		for (unsigned int i = 0; i < ns->nprofiles; i++)
			free(ns->profiles[i]);
		for (unsigned int i = 0; i < ns->nstacks; i++)
			free(ns->stacks[i]);
		free(ns->unconfined);
		free(ns->profiles);
		free(ns->stacks);
		pthread_mutex_destroy(&ns->lock);
	}
	pthread_cond_destroy(&m->dead_cond);
	pthread_mutex_destroy(&m->dead_lock);
	free(m->ns);
	free(m);
}
