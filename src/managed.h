/* SPDX-License-Identifier: MIT */
/*
 * managed.h - what percpu_ref.c (the per-ref steps of a check), managed.c
 * (the list, the scans and the reclaimer thread) and percpu_rcuref.c share
 * about managed refs.  Internal: not installed.
 */
#ifndef PERCPUREF_MANAGED_INTERNAL_H
#define PERCPUREF_MANAGED_INTERNAL_H

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "internal.h"
#include "percpuref/percpu_ref.h"

/*
 * A node of the managed list: embedded in every ref's private data, or a
 * marker of its own.  @next is written by a pusher before the node is
 * published and afterwards only by the reclaimer (managed.c).
 */
struct percpuref_mnode {
	struct percpuref_mnode *next;
	/* Reclaimer's, for PERCPUREF_MANAGED_WARN_S: when the node was last
	 * pushed, and whether the "still held" warning was given. */
	uint64_t listed_ns;
	bool held_warned;
	bool marker;
	bool checking;		/* scanner's: begin answered MANAGED_CHECK */
	/* The CPU whose stage the node was last pushed on, or
	 * PERCPUREF_MNODE_UNSTAGED (pushed on the list's head), and the node
	 * below it then: written by the push, read by
	 * percpuref_managed_unstage(), both under the ref's switch lock.
	 * @next equals @below while the node is on its stage, but once a
	 * pass took it the scanner writes @next, which a failing unstage
	 * would then read without any order against it. */
	unsigned int stage_cpu;
	struct percpuref_mnode *below;
};
#define PERCPUREF_MNODE_UNSTAGED UINT_MAX

/* percpu_ref.c: lock the switch lock (rank SWITCH) of the ref @node
 * belongs to, for the per-ref steps below; returns it, for
 * percpuref_managed_unlock_node().  The lock is a stripe, valid after the
 * node is freed. */
struct percpuref_switch_stripe;
struct percpuref_switch_stripe *percpuref_managed_lock_node(struct percpuref_mnode *node);
void percpuref_managed_unlock_node(struct percpuref_switch_stripe *stripe);

/* percpu_ref.c: the ref of the listed @node was exited: the scanner may
 * unlink and free the node (percpuref_managed_free()) without its switch
 * lock, as the exit reads nothing of the impl after its mark. */
bool percpuref_managed_node_exited(struct percpuref_mnode *node);

/* managed.c: put @node on the list; any thread, any lock held. */
void percpuref_managed_push(struct percpuref_mnode *node);
/*
 * managed.c: takes the listed @node back off the stage it was pushed on,
 * if it is still that stage's top (no pass has taken it, no push went on
 * top of it since); the ref's switch lock held.  True: the node is off the
 * list and the ref's own again (the caller sets mstate MNODE_OFF); false:
 * it stays for the reclaimer.
 */
bool percpuref_managed_unstage(struct percpuref_mnode *node);
/* managed.c: start the reclaimer if needed and wake it; no lock held. */
void percpuref_managed_kick(void);
/* managed.c: an exit left its listed node to the reclaimer (it frees such
 * nodes in its next pass, which this may make due now); no lock held. */
void percpuref_managed_exited(void);

/*
 * @fn(@d) runs on the reclaimer thread after a liburcu-bp grace period that
 * started after this call (percpu_rcuref's deferred release).
 */
void percpuref_call_after_rcu(struct percpuref_deferred *d, percpuref_deferred_fn fn);
/*
 * @fn(@d) after a grace period, on the calling thread, as an RCU batch of
 * the reclaimer's runs it: with the scan lock's role, so that no other
 * callback of the reclaimer's runs meanwhile (percpu_rcuref.h lets those
 * exit a ref between its zero and its @release).  Only when no scan or RCU
 * batch has the role now: false, nothing done, otherwise (waiting for it
 * could wait for a callback that waits for a lock the caller holds).  The
 * caller is in no read-side section and holds no batch, unless this role,
 * taken by such a call whose @release it runs (percpuref_exit_rcu_role):
 * then @fn(@d) runs after that @release returns, before that call does.
 */
bool percpuref_run_after_rcu_here(struct percpuref_deferred *d, percpuref_deferred_fn fn);
/* percpu_rcuref_kill()'s, as it returns: waits while more than the
 * callback backlog's limit of such items wait for the reclaimer, as a kill
 * waits for the callback thread (deferred.c, "Backlog"). */
void percpuref_rcu_pace(void);
/* 0 if the caller may wait for the reclaimer; -EDEADLK, warned as @fn,
 * from a callback or inside an RCU read-side section (it would wait for
 * itself). */
int percpuref_managed_may_wait(const char *fn);
/* Wait for every item queued before the call, running the queue on the
 * calling thread while no thread can start.  The caller checked
 * percpuref_managed_may_wait(). */
void percpuref_wait_rcu(void);
/* Paced waits that found the reclaimer's RCU queue stalled (tests). */
PERCPUREF_API unsigned long percpuref_rcu_stalls(void);
/* TSAN only: read-side unlocks release here, grace periods acquire. */
extern char percpuref_rcu_tsan_sync;

/*
 * Per-ref steps of a check (percpu_ref.c), each called by the scanner with
 * the ref's switch lock held (percpuref_managed_lock_node()), but
 * percpuref_managed_free() of a node percpuref_managed_node_exited() found
 * marked, which needs none.
 *
 * percpuref_managed_begin() looks at a listed node: MANAGED_CHECK means it
 * started a switch to atomic mode (the node stays linked, marked in flight
 * until percpuref_managed_finish()); with @filter it first reads the ref's
 * per-CPU words twice and answers MANAGED_SKIP, switching nothing, when
 * they changed in between or say that someone besides the manager holds a
 * reference (the node stays linked; *@others is the number of references
 * besides the manager's, or ULONG_MAX when the ref changed between the
 * reads); the other verdicts ask the caller to
 * unlink the node, and for MANAGED_FREE then to percpuref_managed_free() it.
 */
enum percpuref_managed_verdict {
	MANAGED_CHECK,		/* switch started: fence, then finish */
	MANAGED_SKIP,		/* in use: stays per-CPU, nothing to finish */
	MANAGED_UNLINK,		/* no longer managed: unlink, keep */
	MANAGED_FREE,		/* exited while listed: unlink, free */
};
enum percpuref_managed_verdict percpuref_managed_begin(struct percpuref_mnode *node, bool filter,
						      unsigned long *others);
/* After the fence: true when the manager's was the last reference (the
 * node must be unlinked, then percpuref_managed_release() called without
 * the lock); false when the ref went back to per-CPU mode, with
 * *@others = the references held besides the manager's at the check, or
 * when it was pinned (a put too many, warned), with *@others = ULONG_MAX.
 * With @at_exit (a pass after exit began) a ref held besides the manager
 * is no longer managed: killed, the manager's reference its initial one,
 * so its last holder's put releases it (*@others = ULONG_MAX), or true
 * when the holders let go meanwhile. */
bool percpuref_managed_finish(struct percpuref_mnode *node, unsigned long *others, bool at_exit);
/* Lets go of the node's impl; the last holder of an exited ref puts it on
 * @spares (no lock taken: the caller gives them, percpuref_spares_give()). */
void percpuref_managed_free(struct percpuref_mnode *node, struct percpuref_spares *spares);
/* The ref a (non-marker) node belongs to, for messages. */
struct percpu_ref *percpuref_managed_ref(struct percpuref_mnode *node);
/* Calls @release of a node that percpuref_managed_finish() released and
 * that is unlinked; takes the switch lock itself afterwards. */
void percpuref_managed_release(struct percpuref_mnode *node);
/* Its second half, without @release: the node is the ref's again (off
 * the list, or back on it if reinitialised meanwhile), or freed if the ref
 * was exited.  Alone in a fork child, for the @release the fork cut: that
 * call was the parent's thread's. */
void percpuref_managed_release_done(struct percpuref_mnode *node);

/* percpu_ref.c: percpu_ref_exit(); false when it refused the exit (warned:
 * the ref's own confirm, or its switch in flight), the ref left whole.
 * With @readers_hold, for a ref that RCU readers may still tryget (an
 * RCU-released ref exited between its zero and its @release): the ref's
 * trygets fail quietly from now on, and its data is not freed but stored
 * in *@readers_hold, held until percpuref_ref_exit_readers_gone() once
 * those readers' sections have ended (which takes NULL: no hold). */
bool percpuref_ref_exit(struct percpu_ref *ref, struct percpu_ref_data **readers_hold);
/* Waits, as percpuref_ref_exit() does, for a switch in flight on @ref (not
 * where the exit would refuse); true while the release that a switch's
 * put started (on the thread that finished it, which may be another) has
 * not begun, as the release says with percpuref_ref_release_begins(). */
bool percpuref_ref_wait_switch(struct percpu_ref *ref);
void percpuref_ref_release_begins(struct percpu_ref *ref);
void percpuref_ref_exit_readers_gone(struct percpu_ref_data *data);

#endif
