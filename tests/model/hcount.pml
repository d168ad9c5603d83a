/* SPDX-License-Identifier: MIT */
/*
 * hcount.pml - Model O: hcount's cache mode refuses a charge only when the
 * usage, with the uncharges still in progress, leaves no room for it.
 *
 * src/hcount.c, cache mode.  Each namespace's slot holds count, cached and
 * own under the slot's lock; units move between a namespace and its parent
 * with both slots locked, child first.  Caches inflate the counts of the
 * levels above them, so a charge that meets a full level f retries without
 * batches, then, under the tree mutex, drains every cache strictly below
 * f up to f (post-order, marking each namespace under its lock as it
 * visits it) and retries; a refill from a marked namespace takes no
 * batch, and a give-back from one moves its whole cache up.  The claim
 * (hcount.c's top comment, docs/hcount.md "Exactness"): a refusal is
 * linearizable, i.e. at some instant of the refused call the units held
 * (charged and not yet uncharged, an uncharge counting as held until it
 * returns) plus the charge passed the limit.
 *
 * Modelled: the root R (limit LIMIT_R) with children A (limit LIMIT_A) and
 * D, and B below A (both unlimited); batch 1.  Three tenants, at D, B and
 * A (A holds own units under its child's caches), make ROUNDS_D, ROUNDS_B
 * and ROUNDS_A rounds: charge 1 or 2 units (chosen at each round) and,
 * when the charge succeeds, uncharge them.  So a charge is refused at R
 * or at A, and drains below either (the loop of charge_drain_retry()).
 * Charges take the header's fast path (the cache alone) or hcount.c's
 * slow path (chain_charge(), the retry without batches,
 * charge_drain_retry(), drain_end()); uncharges give back with
 * give_back_unlock() (the header's fast uncharge is its first test).
 *
 * Steps.  A sequence that takes locks, reads and writes only slots it
 * holds, then lets them go is one atomic step (Lipton's reduction: an
 * acquisition moves right, a release left, accesses under a lock either
 * way), interrupted only where a lock it takes is held, as the thread
 * would wait there: the whole of chain_charge(), a drain's visit of a
 * namespace, a fast charge.  A give-back is one step per level (it lets
 * the child's lock go before it takes the next parent's).  Memory is
 * sequentially consistent: every access here is under a slot lock, whose
 * acquire/release order them.  The caller's max, set_limit's drain, the
 * registry (create, destroy) and hcount_tree_check() are not modelled.
 *
 * Asserted:
 *  - linearizability, in the order that puts each charge at its commit
 *    and each uncharge at its return, or earlier (still within its call)
 *    where a commit would otherwise hold more than a limit (ghosts `held`
 *    and `pend`, committed()): every successful charge fits every limit
 *    of its path there, and a refused charge saw, at its start or at some
 *    commit during it, the units held in the subtree of some level of its
 *    path, plus its n, above that level's limit (`witness`);
 *  - no count ever passes its limit (checked at each commit, fast or slow);
 *  - the drain-and-retry loop makes at most one pass per level of the
 *    charge's path (`tries`);
 *  - at the end, quiescent: the invariant count(ns) = own(ns) + sum over
 *    children c of (count(c) + cached(c)), no cache at the root, no mark
 *    left, no unit held.
 * Never exercised here: drain_end()'s give-back moves nothing (the drained
 * level never collects more than 2 * batch), the retry loop's
 * `!drainable` arm never decides, and no charge is refused at a level
 * without children (B and D are unlimited).
 *
 * Mutants (the first four must fail on `witness`):
 *  -DMUTANT_NO_MARK: the drain marks nothing: B's tenant refills with a
 *   batch behind the drain, and D's retry is refused by that cache.
 *  -DMUTANT_GIVE_BACK_KEEPS: a give-back ignores the mark and keeps its
 *   batch below the drained level (at B, then at A: two caches that no
 *   one tenant held at once).
 *  -DMUTANT_PREORDER: the drain visits A before B, so B's cache stops at
 *   A, where D's charge cannot use it.
 *  -DMUTANT_NO_TREE_MUTEX: drains run without the tree mutex: A's drain
 *   ends and unmarks B in the middle of D's, and B refills with a batch.
 *  -DMUTANT_FAST_NO_LIMIT: the header's fast charge takes from the cache
 *   without its limit test: A's tenant passes A's limit (`limit`).
 *  -DMUTANT_RETRY_AT_DRAINED: the retry's refusal is final only above the
 *   drained level: refused again at it, the loop drains the same level
 *   for ever, holding the tree mutex (`tries`).
 *
 * Not a mutant: a refill that writes each level's count as it walks up
 * and takes the units back when a level above refuses (hcount.c's "a
 * charge never writes a level and then takes it back").  The walk holds
 * every lock from its namespace to the refusing level until it has taken
 * them back, so no other call can read them: only the lock-free read-outs
 * (hcount_ns_count()) could.
 */

#ifndef LIMIT_R
#define LIMIT_R	3
#endif
#ifndef LIMIT_A
#define LIMIT_A	2
#endif
#ifndef ROUNDS_D
#define ROUNDS_D	1
#endif
#ifndef ROUNDS_B
#define ROUNDS_B	2
#endif
#ifndef ROUNDS_A
#define ROUNDS_A	1
#endif
#define BATCH	1
#define INF	100	/* HCOUNT_UNLIMITED, for these sums */
#define NONE	9	/* no level: the charge fitted */
#define R	0
#define A	1
#define B	2
#define D	3
#define NS	4

byte parent[NS];	/* parent[R] unused */
byte level[NS];		/* depth in the tree */
byte nr_children[NS];
byte limit[NS];
byte count[NS];
byte cached[NS];
byte own[NS];
bit draining[NS];
bit lk[NS];		/* slot locks */
bit tree_mutex;
/* The namespaces strictly below R, and below A, in the drain's order
 * (post-order, as hcount.c's walk makes it with A created before D). */
byte below_r[3];
byte below_a[1];

/* Ghosts: units held in each subtree, from their charge's commit until
 * their uncharge takes effect (pend: the units of a tenant's uncharge in
 * progress that still count, until it returns or a commit needs them
 * gone); per tenant, its namespace, the charge in progress, and whether
 * some instant of it had no room at some level of its path. */
byte held[NS];
byte pend[3];
byte home[3];
byte need[3];
bit in_call[3];
bit witness[3];
byte finished;

inline lock(y)
{
	atomic { !lk[y] -> lk[y] = 1 }
}

inline unlock(y)
{
	lk[y] = 0
}

/* A tenant's units held change by delta (within a d_step): each level of
 * its path. */
inline held_add(ns, delta)
{
	g = ns;
	do
	:: held[g] = held[g] + delta;
	   if
	   :: g == R -> break
	   :: else -> g = parent[g]
	   fi
	od
}

/* After held grew: the instant is a witness for every charge in progress
 * that it leaves no room for at some level of that charge's path. */
inline held_grew()
{
	for (t : 0 .. 2) {
		if
		:: in_call[t] ->
			g = home[t];
			do
			:: held[g] + need[t] > limit[g] -> witness[t] = 1; break
			:: else ->
				if
				:: g == R -> break
				:: else -> g = parent[g]
				fi
			od
		:: else
		fi
	}
}

/*
 * A charge at ns committed (held grew by its n): where a level z of its
 * path now holds more than its limit, every uncharge in progress below z
 * takes effect now, before the commit (a point within its call, as
 * linearizability allows; later, a refusal cannot count those units
 * again).  Then no level holds more than its limit: the order that puts
 * each charge at its commit and each uncharge at its return, or earlier
 * where a commit needs it, is one in which every success fits, and the
 * refusals are checked against the same held.
 */
inline committed(ns)
{
	z = ns;
	do
	:: true ->
		if
		:: held[z] > limit[z] ->
			for (u : 0 .. 2) {
				v = home[u];
				do
				:: v == z || v == R -> break
				:: else -> v = parent[v]
				od;
				if
				:: pend[u] > 0 && v == z -> held_add(home[u], -pend[u]); pend[u] = 0
				:: else
				fi
			}
		:: else
		fi;
		assert(held[z] <= limit[z]);
		if
		:: z == R -> break
		:: else -> z = parent[z]
		fi
	od
}

inline unlock_chain(from, to)
{
	w = from;
	do
	:: w == to -> unlock(w); break
	:: else -> unlock(w); w = parent[w]
	od
}

/*
 * chain_charge(): sets f (NONE on success) and drainable.  One atomic
 * sequence: it takes locks upwards, reads and writes only slots it holds,
 * then releases them (lock acquisitions move right, releases left, the
 * accesses between either way: Lipton's reduction), and where a lock is
 * taken the sequence stops until it is free, as the thread would.
 */
inline chain_charge(ns, n, surplus)
{
	atomic {
		lock(ns);
		s = surplus && !draining[ns];
		y = ns;
		amt = n;
		lim = limit[ns];
		do
		:: amt > lim - count[y] ->
			drainable = nr_children[y] != 0 && n <= lim - own[y];
			f = y;
			unlock_chain(ns, y);
			break
		:: else ->
			if
			:: y == R || cached[y] >= amt ->
				top = y;
				/* Commit: every slot from ns to top is locked. */
				amt = n;
				y = ns;
				do
				:: true ->
					count[y] = count[y] + amt;
					assert(count[y] <= limit[y]);
					if
					:: y == top ->
						if
						:: y != R -> cached[y] = cached[y] - amt
						:: else
						fi;
						break
					:: else ->
						r = amt - cached[y] + (s -> BATCH : 0);
						cached[y] = cached[y] + r - amt;
						amt = r;
						y = parent[y]
					fi
				od;
				own[ns] = own[ns] + n;
				held_add(ns, n);
				committed(ns);
				held_grew();
				f = NONE;
				unlock_chain(ns, top);
				break
			:: else ->
				amt = amt - cached[y] + (s -> BATCH : 0);
				y = parent[y];
				lock(y);
				lim = limit[y]
			fi
		od
	}
}

/*
 * give_back_unlock(): y's slot locked on entry, none on exit.  Each step
 * takes the parent's lock and lets the child's go: one atomic sequence
 * each (a release cannot be moved past the next level's acquisition).
 */
inline give_back_unlock(start)
{
	y = start;
	do
	:: true ->
		atomic {
#ifdef MUTANT_GIVE_BACK_KEEPS
			hiwat = 2 * BATCH;
			keep = BATCH;
#else
			hiwat = (draining[y] -> 0 : 2 * BATCH);
			keep = (draining[y] -> 0 : BATCH);
#endif
			if
			:: y == R || cached[y] <= hiwat -> unlock(y); break
			:: else ->
				w = parent[y];
				lock(w);
				count[w] = count[w] - (cached[y] - keep);
				if
				:: w != R -> cached[w] = cached[w] + (cached[y] - keep)
				:: else
				fi;
				cached[y] = keep;
				unlock(y);
				y = w
			fi
		}
	od
}

/* drain_one(x, mark = true): both locks, in one atomic sequence. */
inline drain_one(x)
{
	atomic {
		lock(x);
#ifndef MUTANT_NO_MARK
		draining[x] = 1;
#endif
		w = parent[x];
		lock(w);
		count[w] = count[w] - cached[x];
		if
		:: w != R -> cached[w] = cached[w] + cached[x]
		:: else
		fi;
		cached[x] = 0;
		unlock(w);
		unlock(x)
	}
}

/* drain_below(at) and unmark_below(at): the two levels with children. */
inline drain_below(at)
{
	if
	:: at == R -> for (i : 0 .. 2) { drain_one(below_r[i]) }
	:: else -> drain_one(below_a[0])
	fi
}

inline unmark_below(at)
{
	if
	:: at == R -> for (i : 0 .. 2) { atomic { x = below_r[i]; lock(x); draining[x] = 0; unlock(x) } }
	:: else -> atomic { x = below_a[0]; lock(x); draining[x] = 0; unlock(x) }
	fi
}

/* charge_drain_retry(), from f with children. */
inline charge_drain_retry(ns, n)
{
#ifndef MUTANT_NO_TREE_MUTEX
	atomic { !tree_mutex -> tree_mutex = 1 };
#else
	skip;
#endif
	do
	:: true ->
		drain_below(f);
		drained = f;
		chain_charge(ns, n, 0);
		/* At most one pass per level of ns's path. */
		tries++;
		assert(tries <= level[ns] + 1);
		if
		:: f == NONE -> ok = 1; break
#ifdef MUTANT_RETRY_AT_DRAINED
		:: f != NONE && (level[f] > level[drained] || !drainable) -> ok = 0; break
#else
		:: f != NONE && (level[f] >= level[drained] || !drainable) -> ok = 0; break
#endif
		:: else
		fi
	od;
	/* drain_end() */
	unmark_below(drained);
	lock(drained);
	give_back_unlock(drained);
#ifndef MUTANT_NO_TREE_MUTEX
	tree_mutex = 0
#else
	skip
#endif
}

/* hcount_charge(): sets ok. */
inline charge(ns, n)
{
	/* The header's fast path: the cache alone (never at the root). */
	atomic {
		lock(ns);
		if
#ifdef MUTANT_FAST_NO_LIMIT
		:: ns != R && cached[ns] >= n ->
#else
		:: ns != R && cached[ns] >= n && n <= limit[ns] - count[ns] ->
#endif
			count[ns] = count[ns] + n;
			assert(count[ns] <= limit[ns]);
			cached[ns] = cached[ns] - n;
			own[ns] = own[ns] + n;
			held_add(ns, n);
			committed(ns);
			held_grew();
			ok = 1
		:: else ->
			ok = 0
		fi;
		unlock(ns)
	};
	if
	:: !ok ->
		chain_charge(ns, n, 1);
		if
		:: f != NONE && f != ns -> chain_charge(ns, n, 0)
		:: else
		fi;
		if
		:: f == NONE -> ok = 1
		:: f != NONE && !drainable -> ok = 0
		:: f != NONE && drainable -> charge_drain_retry(ns, n)
		fi
	:: else
	fi
}

/* hcount_uncharge() of units charged here. */
inline uncharge(ns, n)
{
	atomic {
		lock(ns);
		own[ns] = own[ns] - n;
		count[ns] = count[ns] - n;
		cached[ns] = cached[ns] + n;
		pend[me] = n
	};
	/* The fast path's test, then give_back_unlock()'s, are one: the
	 * cache up to the high-water mark, and no mark. */
	give_back_unlock(ns);
	/* The uncharge returns: it takes effect, unless a commit made it. */
	atomic {
		if
		:: pend[me] > 0 -> held_add(ns, -pend[me]); pend[me] = 0
		:: else
		fi
	}
}

/* The calls' locals, dead between calls: zeroed so that states differing
 * only in them are one. */
inline scratch_reset()
{
	y = 0; w = 0; x = 0; g = 0; t = 0; u = 0; v = 0; z = 0; top = 0; r = 0; f = 0;
	drained = 0; i = 0; tries = 0; amt = 0; lim = 0; hiwat = 0; keep = 0; s = 0;
	drainable = 0
}

proctype tenant(byte me; byte ns; byte rounds)
{
	byte y, w, x, g, t, u, v, z, top, r, f, drained, i, tries, n, round;
	byte amt, lim, hiwat, keep;
	bit s, drainable, ok;

	for (round : 1 .. rounds) {
		if
		:: n = 1
		:: n = 2
		fi;
		d_step {
			need[me] = n;
			in_call[me] = 1;
			witness[me] = 0;
			/* held_grew(), for this charge alone */
			g = ns;
			do
			:: held[g] + n > limit[g] -> witness[me] = 1; break
			:: else ->
				if
				:: g == R -> break
				:: else -> g = parent[g]
				fi
			od
		};
		charge(ns, n);
		d_step {
			in_call[me] = 0;
			assert(ok || witness[me]);
			scratch_reset()
		};
		if
		:: ok -> uncharge(ns, n); d_step { scratch_reset() }
		:: else
		fi
	};
	finished++
}

init
{
	byte y;
	short below;

	atomic {
		parent[A] = R; parent[B] = A; parent[D] = R;
		level[A] = 1; level[B] = 2; level[D] = 1;
		nr_children[R] = 2; nr_children[A] = 1;
		limit[R] = LIMIT_R; limit[A] = LIMIT_A; limit[B] = INF; limit[D] = INF;
#ifdef MUTANT_PREORDER
		below_r[0] = D; below_r[1] = A; below_r[2] = B;
#else
		below_r[0] = D; below_r[1] = B; below_r[2] = A;
#endif
		below_a[0] = B;
		home[0] = D; home[1] = B; home[2] = A;
		if
		:: ROUNDS_D > 0 -> run tenant(0, D, ROUNDS_D)
		:: else -> finished++
		fi;
		if
		:: ROUNDS_B > 0 -> run tenant(1, B, ROUNDS_B)
		:: else -> finished++
		fi;
		if
		:: ROUNDS_A > 0 -> run tenant(2, A, ROUNDS_A)
		:: else -> finished++
		fi
	};
	finished == 3;
	/* Quiescent: the invariant, exact. */
	for (y : R .. D) {
		below = 0;
		if
		:: y == R -> below = count[A] + cached[A] + count[D] + cached[D]
		:: y == A -> below = count[B] + cached[B]
		:: else
		fi;
		assert(count[y] == own[y] + below && own[y] == 0 && held[y] == 0 &&
		       !draining[y] && cached[y] >= 0 && count[y] <= limit[y])
	};
	assert(cached[R] == 0)
}
