/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of <percpuref/percpuref.hpp>: ref_ptr counts exactly (copy =
 * get, move = no traffic, destruction = put), owner kills once (and
 * survives being moved out of the object it replaces), an
 * rcu_refcounted object is unpublished at zero (a private unpublish()
 * too) and freed after, a managed
 * object is freed by the reclaimer only once no ref_ptr is left, and
 * ref_traits serves a C struct, and an object not made by make_* is
 * refused with warnings, not a crash, and a poll_registration finishes
 * its thread's kills in its polls and hands the rest over when it goes.
 * Exact counts are read from the atomic count once a kill has switched
 * the ref to atomic mode.
 */
#include <pthread.h>

#include <cerrno>
#include <chrono>
#include <memory>
#include <new>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <percpuref/managed.h>
#include <percpuref/percpuref.hpp>

#include "tap.h"

using percpuref::ref_ptr;

static int destroyed;

struct conn : percpuref::refcounted<conn> {
	explicit conn(int id_) : id(id_) {}
	~conn() { destroyed++; }
	int id;
};

/* References held, once the ref is atomic (after a kill's switch). */
template <class T> static long atomic_count(T &obj)
{
	return (long)__atomic_load_n(&percpuref::ref_traits<T>::counter(obj)->data->count,
				     __ATOMIC_RELAXED);
}

static void test_owner_and_ref_ptr()
{
	destroyed = 0;
	auto own = percpuref::make_owner<conn>(7);
	ok(own && own->id == 7, "make_owner constructs T with its arguments");

	ref_ptr<conn> a = own.share();
	ref_ptr<conn> b = a;			/* get */
	ref_ptr<conn> c = std::move(b);		/* no count traffic */
	ok(!b && c == a, "move leaves the source empty");
	ok(!(c != a) && c != b, "!= is the negation of ==");
	conn *raw = own.get();
	own.kill();
	ok(!own, "kill empties the owner");
	percpu_ref_barrier();
	is(atomic_count(*raw), 2, "after the kill: a and c hold the only references");
	ok(!ref_ptr<conn>::try_acquire_live(raw), "try_acquire_live fails once the kill is confirmed");

	ref_ptr<conn> d;
	d = c;					/* get */
	is(atomic_count(*raw), 3, "copy assignment takes a reference");
	conn *held = d.release();
	is(atomic_count(*raw), 3, "release() gives the reference up without a put");
	ref_ptr<conn> e = ref_ptr<conn>::adopt(held);
	is(atomic_count(*raw), 3, "adopt() takes it over without a get");
	e.reset();
	c = nullptr;
	is(atomic_count(*raw), 1, "reset and assigning nullptr put");
	is(destroyed, 0, "alive while a ref_ptr is left");
	a.reset();
	is(destroyed, 1, "the last put deletes the object, once");
}

static void test_owner_destructor_kills()
{
	destroyed = 0;
	{
		auto own = percpuref::make_owner<conn>(1);
		auto moved = std::move(own);
		ok(!own && moved, "an owner moves");
	}
	percpu_ref_barrier();
	is(destroyed, 1, "an owner going out of scope kills: the object is freed");
}

/* A singly linked list of owned links: head = std::move(head->next). */
struct list_link : percpuref::refcounted<list_link> {
	~list_link() { destroyed++; }
	percpuref::owner<list_link> next;
};

static void test_owner_move_from_inside()
{
	destroyed = 0;
	auto head = percpuref::make_owner<list_link>();
	head->next = percpuref::make_owner<list_link>();
	list_link *second = head->next.get();

	/* Atomic: the kill of the first list_link frees it at once, inside the
	 * assignment, together with the owner moved from. */
	percpu_ref_switch_to_atomic_sync(head->percpuref_counter());
	head = std::move(head->next);
	is(destroyed, 1, "moving an owner out of the object it replaces frees that object");
	ok(head.get() == second, "and leaves the moved owner's object in place");
	auto &same = head;	/* a self-move, past -Wself-move */
	head = std::move(same);
	ok(head.get() == second, "a self-move keeps the object");
	head.kill();
	percpu_ref_barrier();
	is(destroyed, 2, "both links freed, once each");
}

static bool unpublish_saw_zero;
static int unpublished;

struct node : percpuref::rcu_refcounted<node> {
	~node() { destroyed++; }
	void unpublish() noexcept
	{
		unpublished++;
		/* The count is zero now: a reader's tryget must fail. */
		unpublish_saw_zero = !ref_ptr<node>::try_acquire(this);
	}
};

static void test_rcu_refcounted()
{
	destroyed = unpublished = 0;
	auto own = percpuref::make_owner<node>();
	node *published = own.get();
	{
		percpuref::rcu_read_guard guard;
		ref_ptr<node> r = ref_ptr<node>::try_acquire(published);
		ok(r.get() == published, "try_acquire under the read guard takes a reference");
	}
	own.kill();
	percpu_rcuref_barrier();
	is(unpublished, 1, "unpublish() runs once, at zero");
	ok(unpublish_saw_zero, "try_acquire fails from zero on");
	is(destroyed, 1, "released after the grace period");
}

/* unpublish() kept private, with the base as a friend. */
class private_node : public percpuref::rcu_refcounted<private_node> {
	friend class percpuref::rcu_refcounted<private_node>;
	void unpublish() noexcept { unpublished++; }
};

/* unpublish() inherited from a mixin, beside the counted base. */
struct unpublishes {
	void unpublish() noexcept { unpublished++; }
};
struct mixin_node : percpuref::rcu_refcounted<mixin_node>, unpublishes {
};

static void test_private_unpublish()
{
	unpublished = 0;
	auto own = percpuref::make_owner<private_node>();
	own.kill();
	percpu_rcuref_barrier();
	is(unpublished, 1, "a private unpublish() the base is a friend of runs");
	unpublished = 0;
	auto mixed = percpuref::make_owner<mixin_node>();
	mixed.kill();
	percpu_rcuref_barrier();
	is(unpublished, 1, "an unpublish() inherited from another base runs");
}

static void test_managed()
{
	destroyed = unpublished = 0;
	ref_ptr<node> first = percpuref::make_managed<node>();
	ref_ptr<node> second = first;
	first.reset();
	percpu_ref_managed_flush();
	is(destroyed, 0, "a managed object a ref_ptr holds survives a flush");
	second.reset();
	percpu_ref_managed_flush();
	is(unpublished, 1, "the reclaimer unpublishes it once nobody holds it");
	is(destroyed, 1, "and frees it");

	ref_ptr<conn> plain = percpuref::make_managed<conn>(3);
	ok(plain->id == 3, "make_managed works for a percpu_ref object too");
	plain.reset();
	percpu_ref_managed_flush();
	is(destroyed, 2, "freed by the reclaimer");
}

/* A C struct that embeds a counter, reached through ref_traits. */
struct c_object {
	int payload;
	struct percpu_ref ref;
};

namespace percpuref {
template <> struct ref_traits<c_object> {
	static percpu_ref *counter(c_object &o) noexcept { return &o.ref; }
};
} /* namespace percpuref */

static int c_released;

static void c_release(struct percpu_ref *)
{
	c_released++;
}

static void test_traits()
{
	c_object obj{ 5, {} };

	ok(percpu_ref_init(&obj.ref, c_release, 0) == 0, "C struct initialised");
	{
		ref_ptr<c_object> r = ref_ptr<c_object>::acquire(&obj);
		ref_ptr<c_object> s = r;
		percpu_ref_kill(&obj.ref);
		percpu_ref_barrier();
		is(atomic_count(obj), 2, "ref_ptr counts a C struct through ref_traits");
	}
	is(c_released, 1, "the last ref_ptr releases it");
	percpu_ref_exit(&obj.ref);
}

/* From the library (src/internal.h, not a public header). */
extern "C" unsigned long percpuref_warning_count(void);

/*
 * An object not made by make_owner / make_managed has no counter: the
 * bases leave it in the state of an exited ref, so a ref_ptr to it warns
 * and does nothing instead of adding through a null pointer (it crashed).
 */
static void test_not_made()
{
	destroyed = unpublished = 0;
	conn stack_conn(4);
	unsigned long warned = percpuref_warning_count();
	{
		ref_ptr<conn> r = ref_ptr<conn>::acquire(&stack_conn);	/* get */
		ok(!r, "acquire of an object make_owner never saw is empty");
	}							/* no put */
	is((long)(percpuref_warning_count() - warned), 1, "its get is warned");
	ok(!ref_ptr<conn>::try_acquire_live(&stack_conn), "try_acquire_live fails on it");

	node stack_node;
	{
		percpuref::rcu_read_guard guard;
		ok(!ref_ptr<node>::try_acquire(&stack_node), "try_acquire fails on an rcu_refcounted one");
	}
	/* tryget_live fails on a dead ref, exited or not, unwarned. */
	is((long)(percpuref_warning_count() - warned), 2, "and try_acquire is warned");
	{
		ref_ptr<node> r = ref_ptr<node>::acquire(&stack_node);	/* get */
		ok(!r, "acquire of an rcu_refcounted one is empty too");
	}							/* no put */
	is((long)(percpuref_warning_count() - warned), 3, "its get is warned, once");
	is(destroyed + unpublished, 0, "and nothing is released or unpublished");
}

/*
 * A ref_ptr taken in T's constructor, before make_owner initialises the
 * counter: empty.  It was not, and its put, once the counter counted,
 * dropped a reference it never got: the kill freed the object while the
 * registry still held it, and clearing the registry read freed memory.
 */
struct self_registering;
static std::vector<ref_ptr<self_registering>> registry;

struct self_registering : percpuref::refcounted<self_registering> {
	self_registering() { registry.push_back(ref_ptr<self_registering>::acquire(this)); }
	~self_registering() { destroyed++; }
};

static void test_acquire_in_constructor()
{
	destroyed = 0;
	{
		auto own = percpuref::make_owner<self_registering>();
		ok(registry.size() == 1 && !registry[0],
		   "acquire in T's constructor: an empty ref_ptr");
		auto user = own.share();
		ok(user, "after make_owner, acquire counts");
	}
	percpu_ref_barrier();
	is(destroyed, 1, "the object is freed once, at its last real put");
	registry.clear();
	is(destroyed, 1, "clearing the registry puts nothing");
}

/*
 * Killed while a user holds it: try_acquire() (the count is above zero)
 * still succeeds, try_acquire_live() (killed) fails, for an rcu_refcounted
 * T as for a refcounted one.
 */
static void test_rcu_killed_held()
{
	destroyed = unpublished = 0;
	auto own = percpuref::make_owner<node>();
	node *raw = own.get();
	ref_ptr<node> user = own.share();
	own.kill();
	percpu_ref_barrier();
	ok(!ref_ptr<node>::try_acquire_live(raw), "try_acquire_live fails on a killed rcu_refcounted T");
	{
		percpuref::rcu_read_guard guard;
		ok(ref_ptr<node>::try_acquire(raw).get() == raw,
		   "try_acquire succeeds on it while a reference is left");
	}
	is(unpublished, 0, "not unpublished while held");
	user.reset();
	percpu_rcuref_barrier();
	ok(unpublished == 1 && destroyed == 1, "the last put unpublishes and frees it");
}

/* Null in, empty out: no counter is reached through a null T*. */
static void test_null()
{
	percpuref::owner<conn> empty;
	ok(!empty.share(), "share() of an empty owner is empty");
	ok(!ref_ptr<conn>::acquire(nullptr) && !ref_ptr<conn>::try_acquire_live(nullptr),
	   "acquire and try_acquire_live of nullptr are empty");
	percpuref::rcu_read_guard guard;
	ok(!ref_ptr<node>::try_acquire(nullptr), "and try_acquire of nullptr");
}

/* src/internal.h: the allocation after this many more fails; and the
 * spare impls freed, this thread's among them (test_hpp_mixed_eh). */
extern "C" void percpuref_fault_fail_nth_alloc(long nth);
extern "C" void percpuref_test_spares_drop(void);

/* True if @make, run with the library's next allocation refused, throws
 * bad_alloc. */
template <typename Make> static bool throws_bad_alloc(Make make)
{
	bool threw = false;

	percpuref_test_spares_drop();
	percpuref_fault_fail_nth_alloc(1);
	try {
		make();
	} catch (const std::bad_alloc &) {
		threw = true;
	}
	percpuref_fault_fail_nth_alloc(0);
	return threw;
}

/* An init that fails deletes the T that make_* constructed, then throws. */
static void test_init_failure()
{
	destroyed = 0;
	ok(throws_bad_alloc([] { auto own = percpuref::make_owner<conn>(1); }) && destroyed == 1,
	   "make_owner: a failed init throws bad_alloc and deletes T");
	ok(throws_bad_alloc([] { auto obj = percpuref::make_managed<conn>(2); }) && destroyed == 2,
	   "make_managed: the same");
}

/*
 * An object that holds the last reference to itself, the cycle broken by
 * reset(): the ref_ptr is empty before its put runs ~T, which destroys the
 * ref_ptr again (as shared_ptr::reset()); a second put there hit the
 * exited counter.
 */
struct self_held : percpuref::refcounted<self_held> {
	~self_held() { destroyed++; }
	ref_ptr<self_held> self;
};

static void test_reset_self_held()
{
	destroyed = 0;
	auto own = percpuref::make_owner<self_held>();
	self_held *raw = own.get();
	raw->self = own.share();
	own.kill();
	percpu_ref_barrier();
	unsigned long warned = percpuref_warning_count();
	raw->self.reset();
	is(destroyed, 1, "reset() of a reference the object holds to itself frees it");
	is((long)(percpuref_warning_count() - warned), 0, "with one put: its destructor puts nothing");
}

/*
 * What the types promise at compile time: no implicit conversion to bool
 * (an int from a ref_ptr); moves that cannot throw (a vector's growth
 * moves them, not a get and a put per element); and no ref_ptr to a
 * counted base from a derived type's (the release deletes the base).
 */
struct derived_conn : conn {
	using conn::conn;
};
static_assert(!std::is_convertible_v<ref_ptr<conn>, bool> &&
		      !std::is_convertible_v<percpuref::owner<conn>, bool>,
	      "operator bool is explicit");
static_assert(std::is_nothrow_move_constructible_v<ref_ptr<conn>> &&
		      std::is_nothrow_move_assignable_v<ref_ptr<conn>> &&
		      std::is_nothrow_move_constructible_v<percpuref::owner<conn>> &&
		      std::is_nothrow_move_assignable_v<percpuref::owner<conn>>,
	      "moves are noexcept");
static_assert(!std::is_constructible_v<ref_ptr<conn>, ref_ptr<derived_conn>> &&
		      !std::is_constructible_v<ref_ptr<conn>, const ref_ptr<derived_conn> &> &&
		      !std::is_constructible_v<ref_ptr<const conn>, ref_ptr<derived_conn>>,
	      "no ref_ptr to a counted base from a derived type's");

/*
 * ref_ptr<const T>: a reference through which the object is read only,
 * counted like any other (the count is not part of the object's value, as
 * shared_ptr<const T>'s is not).  From a ref_ptr<T>: a copy gets, a move
 * steals; never the other way.  It did not compile: ref_traits<const T>
 * called the non-const percpuref_counter().
 */
static_assert(std::is_convertible_v<ref_ptr<conn>, ref_ptr<const conn>>,
	      "ref_ptr<T> converts to ref_ptr<const T>");
static_assert(!std::is_convertible_v<ref_ptr<const conn>, ref_ptr<conn>>,
	      "but not back: that would drop the const");

static void test_const()
{
	destroyed = 0;
	auto own = percpuref::make_owner<conn>(9);
	conn *raw = own.get();
	ref_ptr<conn> mut = own.share();
	ref_ptr<const conn> ro = mut;			/* get */
	ref_ptr<const conn> taken = std::move(mut);	/* steals */
	ok(!mut && ro == taken && ro->id == 9, "ref_ptr<const T> from a copy and a move");
	const conn *cp = raw;
	ref_ptr<const conn> more = ref_ptr<const conn>::acquire(cp);
	ref_ptr<const conn> again = ref_ptr<const conn>::try_acquire_live(cp);
	ok(more && again, "acquire and try_acquire_live on a const T*");
	own.kill();
	percpu_ref_barrier();
	is(atomic_count(*raw), 4, "four references, each counted once");
	ro.reset();
	more.reset();
	again.reset();
	is(destroyed, 0, "alive while one is left");
	taken.reset();
	is(destroyed, 1, "the last const reference frees it");
}

static pthread_t polled_destroyed_on;
static int poll_in_destructor_err;

struct polled : percpuref::refcounted<polled> {
	explicit polled(percpuref::poll_registration *reg_ = nullptr) : reg(reg_) {}
	~polled()
	{
		polled_destroyed_on = pthread_self();
		destroyed++;
		if (reg) {
			try {
				reg->poll();
			} catch (const std::system_error &e) {
				poll_in_destructor_err = e.code().value();
			}
		}
	}
	percpuref::poll_registration *reg;
};

/* Its destructor kills another owned object. */
struct chained : percpuref::refcounted<chained> {
	chained() : next(percpuref::make_owner<polled>()) {}
	~chained() { destroyed++; }
	percpuref::owner<polled> next;
};

template <class F> static int system_error_of(F &&f)
{
	try {
		f();
	} catch (const std::system_error &e) {
		return e.code().value();
	}
	return 0;
}

static void test_poll_registration()
{
	destroyed = 0;
	{
		percpuref::poll_registration reg;

		is(system_error_of([] { percpuref::poll_registration again; }), EALREADY,
		   "a second registration on the thread throws EALREADY");
		auto own = percpuref::make_owner<polled>();
		own.kill();
		std::this_thread::sleep_for(std::chrono::milliseconds(20));
		is(destroyed, 0, "a polling thread's kill waits for its poll");
		reg.drain();
		ok(destroyed == 1 && pthread_equal(polled_destroyed_on, pthread_self()),
		   "drain() finished the kill: ~T ran on this thread");
		is(reg.poll(), 0u, "nothing left to poll");
		int err = 0;
		std::thread([&] { err = system_error_of([&] { reg.poll(); }); }).join();
		is(err, EPERM, "a poll from another thread throws EPERM");
		err = 0;
		std::thread([&] {
			percpuref::poll_registration theirs;

			err = system_error_of([&] { reg.poll(); });
		}).join();
		is(err, EPERM, "so does one from a thread registered itself: it polls for nobody");

		/* A registration destroyed on another thread leaves both alone. */
		std::unique_ptr<percpuref::poll_registration> elsewhere;
		std::thread([&] { elsewhere = std::make_unique<percpuref::poll_registration>(); })
			.join();
		elsewhere.reset();
		is(percpu_ref_poll(0), 0, "destroyed on another thread: this thread stays registered");

		/* The same from a thread started after the registering one
		 * ended, which glibc gives that one's pthread_t again: its poll
		 * polled this thread's queue and its destruction unregistered
		 * this thread, both silently. */
		std::thread([&] { elsewhere = std::make_unique<percpuref::poll_registration>(); })
			.join();
		int after = 0;
		err = 0;
		std::thread([&] {
			percpuref::poll_registration theirs;

			err = system_error_of([&] { elsewhere->poll(); });
			elsewhere.reset();
			after = percpu_ref_poll(0);
		}).join();
		is(err, EPERM, "a poll from a later thread throws EPERM");
		is(after, 0, "destroyed on a later thread: that thread stays registered");

		/* drain() loops: ~T of what it releases kills another owner. */
		destroyed = 0;
		auto chain = percpuref::make_owner<chained>();
		chain.kill();
		reg.drain();
		is(destroyed, 2, "drain() finishes the kills that the ~T it runs make");

		poll_in_destructor_err = 0;
		auto inner = percpuref::make_owner<polled>(&reg);
		inner.kill();
		reg.drain();
		is(poll_in_destructor_err, EDEADLK, "a poll inside ~T of an object a poll releases "
		   "throws EDEADLK");
	}
	destroyed = 0;
	{
		percpuref::poll_registration reg;
		auto own = percpuref::make_owner<polled>();
		own.kill();
	}
	percpu_ref_barrier();
	ok(destroyed == 1 && !pthread_equal(polled_destroyed_on, pthread_self()),
	   "the destructor handed the unpolled kill to the callback thread");
	is(percpu_ref_poll(0), -EPERM, "and unregistered the thread");
}

int main()
{
	test_owner_and_ref_ptr();
	test_owner_destructor_kills();
	test_owner_move_from_inside();
	test_rcu_refcounted();
	test_private_unpublish();
	test_managed();
	test_traits();
	test_not_made();
	test_acquire_in_constructor();
	test_rcu_killed_held();
	test_null();
	test_init_failure();
	test_reset_self_held();
	test_const();
	test_poll_registration();
	return done_testing();
}
