/* SPDX-License-Identifier: MIT */
/*
 * percpuref.hpp - C++17 RAII over the C API, header-only.
 *
 * What each piece owns:
 *
 *   ref_ptr<T>         one counted reference to a T that embeds a percpu_ref
 *                      or percpu_rcuref.  Copy = get (per-CPU, no shared
 *                      line), destruction = put, move = steal (no count
 *                      traffic).  Copyable, since references are: this is
 *                      the shared_ptr of the library.  ref_ptr<const T>
 *                      reads only, and converts from ref_ptr<T>.
 *   owner<T>           the initial reference of an object with an owner;
 *                      move-only, since there is one initial reference.
 *                      kill() (or destruction) drops it: the object is freed
 *                      when the last ref_ptr goes.  Made by make_owner<T>().
 *   make_managed<T>()  an object nobody owns: the manager (the library's
 *                      reclaimer) takes a reference of its own and frees the
 *                      object once nothing else references it.  Returns a
 *                      ref_ptr holding the creator's reference.
 *   rcu_read_guard     a percpu_rcuref read-side section for a scope: inside
 *                      it, ref_ptr<T>::try_acquire() may be called on an
 *                      object found in an RCU-protected structure.
 *   poll_registration  this thread finishes its own kills, in its poll()
 *                      calls, for a scope (percpu_ref_poll_register()).
 *
 * Objects: derive T from refcounted<T> (a percpu_ref; the owner kills it)
 * or rcu_refcounted<T> (a percpu_rcuref: freed after an RCU grace period,
 * so lookups may race with the release; T may define `void unpublish()
 * noexcept`, called when the count reaches zero, to remove itself from
 * where readers find it: public, or private with rcu_refcounted<T> as a
 * friend; one the base cannot reach does not compile.  The base cannot see
 * an unpublish() it cannot call in a final T, which up to 0.4.6 then stayed
 * published after its release: a final T with none says so, with a public
 * `using percpuref_no_unpublish = void;`, or does not compile).
 * Create T only with make_owner / make_managed, which allocate it with new
 * and initialise its counter.  A T built otherwise has none: the base
 * leaves the counter as an exited one, so a ref_ptr to it warns and does
 * nothing (the try_acquire calls fail), and on x86-64, if no library call
 * set the runtime up before, the first stops the process with a message.
 * T's destructor must be public and must not throw (both checked).  The
 * release callback calls percpu_ref_exit / percpu_rcuref_exit and deletes
 * it, on the thread the C API names (last put, callback thread or
 * reclaimer).  The header includes managed.h, for make_managed's flush and
 * settings.  A C struct that embeds a counter can use ref_ptr too (not
 * owner / make_*, which allocate): specialise ref_traits<T> with
 * `static percpu_ref *counter(T &)` (or percpu_rcuref *).
 *
 * Errors: init and switch failures throw std::system_error with the
 * library's errno value (std::bad_alloc for ENOMEM, which the init also
 * returns, warned, when pthread_atfork() refused the library's fork
 * handlers); built without
 * exceptions (-fno-exceptions), they abort.  Memory ordering is
 * the C API's: a put releases, the put (or reclaimer) that frees acquires.
 */
#ifndef PERCPUREF_PERCPUREF_HPP
#define PERCPUREF_PERCPUREF_HPP

#if __cplusplus < 201703L
/* Nothing else: the rest would only bury this under template errors. */
#error "percpuref.hpp needs C++17 or later (-std=c++17)"
#else

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <system_error>
#include <type_traits>
#include <utility>

#include <percpuref/managed.h>
#include <percpuref/percpu_rcuref.h>
#include <percpuref/percpu_ref.h>

/*
 * With and without exceptions the code that reports errors compiles
 * differently (throw_errno() throws, or aborts): an inline namespace per
 * mode gives it different symbols, so a program that mixes the modes (a
 * plugin built with -fno-exceptions) links both instead of keeping one
 * for all, which made a catch (std::bad_alloc &) abort, or an abort-only
 * unit throw, depending on the link order.  Only that code: throw_errno(),
 * make_owner, make_managed and poll_registration.  The types that never
 * throw (refcounted, rcu_refcounted, ref_ptr, owner, rcu_read_guard) are
 * the same in both modes, so that a T derived from refcounted<T>, or a
 * function taking a ref_ptr, is one type and one symbol across them (up to
 * 0.4.6 every type was mode's own: the plugin's and the program's
 * ref_ptr<conn> did not link).  A function of the program's own that calls
 * make_owner or make_managed and is inline in a header both modes include
 * is still one symbol: the linker keeps one mode's copy of it.
 */
#if defined(__cpp_exceptions)
#define PERCPUREF_HPP_MODE eh
#else
#define PERCPUREF_HPP_MODE noeh
#endif

namespace percpuref {

/* The C calls for each kind of counter, by overload. */
namespace detail {
inline void get(percpu_ref *r) noexcept { percpu_ref_get(r); }
inline void get(percpu_rcuref *r) noexcept { percpu_rcuref_get(r); }
inline bool tryget(percpu_ref *r) noexcept { return percpu_ref_tryget(r); }
inline bool tryget(percpu_rcuref *r) noexcept { return percpu_rcuref_tryget(r); }
inline bool tryget_live(percpu_ref *r) noexcept { return percpu_ref_tryget_live(r); }
inline bool tryget_live(percpu_rcuref *r) noexcept { return percpu_ref_tryget_live(&r->ref); }
/* Initialised and not exited: a get then counts. */
inline bool counts(const percpu_ref *r) noexcept { return r->data != nullptr; }
inline bool counts(const percpu_rcuref *r) noexcept { return r->ref.data != nullptr; }
inline void put(percpu_ref *r) noexcept { percpu_ref_put(r); }
inline void put(percpu_rcuref *r) noexcept { percpu_rcuref_put(r); }
inline void kill(percpu_ref *r) noexcept { percpu_ref_kill(r); }
inline void kill(percpu_rcuref *r) noexcept { percpu_rcuref_kill(r); }
inline void exit_counter(percpu_ref *r) noexcept { percpu_ref_exit(r); }
inline void exit_counter(percpu_rcuref *r) noexcept { percpu_rcuref_exit(r); }
inline int switch_to_managed(percpu_ref *r) noexcept { return percpu_ref_switch_to_managed(r); }
inline int switch_to_managed(percpu_rcuref *r) noexcept
{
	return percpu_rcuref_switch_to_managed(r);
}

inline namespace PERCPUREF_HPP_MODE {
[[noreturn]] inline void throw_errno(int err, const char *what)
{
#if defined(__cpp_exceptions)
	if (err == -ENOMEM)
		throw std::bad_alloc();
	throw std::system_error(-err, std::generic_category(), what);
#else
	/* Say why: a bare abort() left nothing to go on. */
	std::fprintf(stderr, "percpuref.hpp: %s: %s; aborting (built without exceptions)\n",
		     what, std::strerror(-err));
	std::abort();
#endif
}
} /* inline namespace PERCPUREF_HPP_MODE */

/* make_* and the release delete T, the release inside the C library's
 * put: T's destructor must be reachable from here, and nothing may
 * unwind from it. */
template <class T> constexpr void check_deletable() noexcept
{
	static_assert(std::is_destructible_v<T>,
		      "T's destructor must be public: make_owner, make_managed and the release "
		      "delete T");
	static_assert(!std::is_destructible_v<T> || std::is_nothrow_destructible_v<T>,
		      "T's destructor must not throw");
}

} /* namespace detail */

template <class T> class refcounted;
template <class T> class rcu_refcounted;
template <class T> class owner;

namespace detail {
/* Whether T names a member unpublish at all, whatever its access: in a
 * class deriving from T and from a base that has one, the name is
 * ambiguous exactly when T has one too (lookup precedes access checks). */
struct unpublish_probe_base { void unpublish(); };
template <class U> struct unpublish_probe : U, unpublish_probe_base {};
template <class U, class = void> struct names_unpublish : std::true_type {};
template <class U>
struct names_unpublish<U, std::void_t<decltype(&unpublish_probe<U>::unpublish)>> : std::false_type {};
/* A final T cannot be probed so: it says it has none, with a public
 * `using percpuref_no_unpublish = void;`. */
template <class U, class = void> struct says_no_unpublish : std::false_type {};
template <class U>
struct says_no_unpublish<U, std::void_t<typename U::percpuref_no_unpublish>> : std::true_type {};
} /* namespace detail */

namespace detail {
/* The base that holds T's counter, and the way into its private init(). */
template <class T>
using base_t = std::conditional_t<std::is_same_v<typename T::counter_type, percpu_ref>,
				  refcounted<T>, rcu_refcounted<T>>;
struct access {
	template <class T> static int init(T *obj, unsigned int flags) noexcept
	{
		/* Said first: the cast below failed with a message about the
		 * cast alone (review 171). */
		static_assert(std::is_base_of_v<base_t<T>, T>,
			      "T must derive from refcounted<T> or rcu_refcounted<T> itself: the "
			      "release deletes the class the base names, so a class derived "
			      "from a counted one would be freed as its base");
		return static_cast<base_t<T> *>(obj)->init(flags);
	}
	/* owner<T>'s private constructor, for make_owner: owner befriends
	 * this, not make_owner, which is in the mode's namespace, so that
	 * owner<T> names the same entities in both modes (one definition). */
	template <class T> static owner<T> adopt_owner(T *obj) noexcept { return owner<T>(obj); }
};
} /* namespace detail */

/*
 * refcounted<T> - base of a T counted by a percpu_ref.  Standard layout
 * with the counter as its only member, so the release callback gets from
 * the counter back to the base (and the base to T) without offsetof.
 */
template <class T> class refcounted {
public:
	using counter_type = percpu_ref;

	refcounted(const refcounted &) = delete;
	refcounted &operator=(const refcounted &) = delete;

	percpu_ref *percpuref_counter() noexcept { return &counter_; }

protected:
	/* Exited ref's state until make_* initialises it: see the top. */
	refcounted() noexcept : counter_{ __PERCPU_REF_ATOMIC_DEAD, nullptr } {}
	~refcounted() = default;

private:
	friend struct detail::access;

	/* Called by the C library, once, when the count reaches zero. */
	static void release(percpu_ref *counter) noexcept
	{
		static_assert(std::is_standard_layout_v<refcounted>,
			      "the counter must be reachable from the base");
		T *self = static_cast<T *>(reinterpret_cast<refcounted *>(counter));

		percpu_ref_exit(counter);
		delete self;
	}

	int init(unsigned int flags) noexcept { return percpu_ref_init(&counter_, release, flags); }

	percpu_ref counter_;
};

/*
 * rcu_refcounted<T> - base of a T counted by a percpu_rcuref: freed after
 * an RCU grace period, so readers may try_acquire() it under an
 * rcu_read_guard even while it is being released.
 */
template <class T> class rcu_refcounted {
public:
	using counter_type = percpu_rcuref;

	rcu_refcounted(const rcu_refcounted &) = delete;
	rcu_refcounted &operator=(const rcu_refcounted &) = delete;

	percpu_rcuref *percpuref_counter() noexcept { return &counter_; }

protected:
	rcu_refcounted() noexcept : counter_{ { __PERCPU_REF_ATOMIC_DEAD, nullptr }, nullptr } {}
	~rcu_refcounted() = default;

private:
	friend struct detail::access;

	static T *self(percpu_rcuref *counter) noexcept
	{
		static_assert(std::is_standard_layout_v<rcu_refcounted>,
			      "the counter must be reachable from the base");
		return static_cast<T *>(reinterpret_cast<rcu_refcounted *>(counter));
	}

	/*
	 * Whether T defines unpublish(), asked here rather than outside the
	 * class: a T that keeps it private and befriends rcu_refcounted<T>
	 * has it found (a test from outside saw an access error as "none",
	 * and the object stayed published after its release).
	 */
	template <class U>
	static constexpr auto has_unpublish(int) -> decltype(std::declval<U &>().unpublish(), true)
	{
		return true;
	}
	template <class U> static constexpr bool has_unpublish(...) { return false; }

	/* At zero, on the thread that reached it: T::unpublish().  Not
	 * named unpublish: T's lookup of that name, in a T that inherits it
	 * from another base, would be ambiguous, and read as "none". */
	static void unpublish_hook(percpu_rcuref *counter) noexcept
	{
		static_assert(noexcept(std::declval<T &>().unpublish()),
			      "T::unpublish() runs inside a C callback: declare it noexcept");
		self(counter)->unpublish();
	}

	/* After the grace period, on the reclaimer thread. */
	static void release(percpu_rcuref *counter) noexcept
	{
		T *obj = self(counter);

		percpu_rcuref_exit(counter);
		delete obj;
	}

	int init(unsigned int flags) noexcept
	{
		percpu_rcuref_func_t *hook = nullptr;

		if constexpr (std::is_final_v<T>)
			static_assert(has_unpublish<T>(0) || detail::says_no_unpublish<T>::value,
				      "a final T: rcu_refcounted<T> cannot tell a T::unpublish() it "
				      "cannot call from none; make it public or befriend "
				      "rcu_refcounted<T>, or, if T has none, declare "
				      "`using percpuref_no_unpublish = void;` in T");
		else
			static_assert(has_unpublish<T>(0) || !detail::names_unpublish<T>::value,
				      "T::unpublish() exists but rcu_refcounted<T> cannot call it: "
				      "make it public or befriend rcu_refcounted<T>");
		if constexpr (has_unpublish<T>(0))
			hook = unpublish_hook;
		return percpu_rcuref_init(&counter_, hook, release, flags);
	}

	percpu_rcuref counter_;
};

/*
 * ref_traits<T> - how ref_ptr reaches T's counter.  The default serves the
 * two bases above; specialise it for a C struct that embeds a counter.
 */
template <class T> struct ref_traits {
	static auto counter(T &obj) noexcept { return obj.percpuref_counter(); }
};

/* rcu_read_guard - percpu_rcuref_read_lock() for the guard's scope. */
class rcu_read_guard {
public:
	rcu_read_guard() noexcept { percpu_rcuref_read_lock(); }
	~rcu_read_guard() { percpu_rcuref_read_unlock(); }
	rcu_read_guard(const rcu_read_guard &) = delete;
	rcu_read_guard &operator=(const rcu_read_guard &) = delete;
};

/*
 * ref_ptr<T> - one counted reference, or empty.  The object stays alive
 * while a ref_ptr to it exists.  Any thread; a ref_ptr is no more shared
 * than a T* (copying one object from two threads is the caller's race).
 */
template <class T> class ref_ptr {
public:
	constexpr ref_ptr() noexcept = default;
	constexpr ref_ptr(std::nullptr_t) noexcept {}

	/* Takes over a reference the caller already holds (no get). */
	static ref_ptr adopt(T *obj) noexcept { return ref_ptr(obj); }

	/* A new reference; the caller holds one or knows @obj is alive.
	 * Empty (warned) when @obj's counter does not count: inside T's
	 * constructor, which runs before make_* initialises it, or after
	 * its exit.  A ref_ptr kept from there once put a reference it never
	 * got, freeing the object under the others. */
	static ref_ptr acquire(T *obj) noexcept
	{
		if (!obj)
			return ref_ptr();
		detail::get(counter(obj));	/* warns if it does not count */
		return ref_ptr(detail::counts(counter(obj)) ? obj : nullptr);
	}

	/* A new reference unless the count reached zero (empty then): for an
	 * object found under an rcu_read_guard (rcu_refcounted). */
	static ref_ptr try_acquire(T *obj) noexcept
	{
		return ref_ptr(obj && detail::tryget(counter(obj)) ? obj : nullptr);
	}

	/* A new reference unless the object was killed (empty then). */
	static ref_ptr try_acquire_live(T *obj) noexcept
	{
		return ref_ptr(obj && detail::tryget_live(counter(obj)) ? obj : nullptr);
	}

	ref_ptr(const ref_ptr &other) noexcept : obj_(other.obj_)
	{
		if (obj_)
			detail::get(counter(obj_));
	}
	ref_ptr(ref_ptr &&other) noexcept : obj_(std::exchange(other.obj_, nullptr)) {}

	/* ref_ptr<const T> from ref_ptr<T>: a copy gets, a move steals.  Not
	 * the other way, and not between other types (no counted base's
	 * ref_ptr from a derived one: the release deletes the base). */
	template <class U, class = std::enable_if_t<std::is_same_v<const U, T> &&
						      !std::is_same_v<U, T>>>
	ref_ptr(const ref_ptr<U> &other) noexcept : ref_ptr(acquire(other.get())) {}
	template <class U, class = std::enable_if_t<std::is_same_v<const U, T> &&
						      !std::is_same_v<U, T>>>
	ref_ptr(ref_ptr<U> &&other) noexcept : obj_(other.release()) {}
	ref_ptr &operator=(ref_ptr other) noexcept
	{
		swap(other);
		return *this;
	}
	~ref_ptr() { reset(); }

	/* Drops the reference (put); empty afterwards. */
	void reset() noexcept
	{
		if (T *obj = std::exchange(obj_, nullptr))
			detail::put(counter(obj));
	}
	/* Gives the reference up without a put: the caller now holds it. */
	[[nodiscard]] T *release() noexcept { return std::exchange(obj_, nullptr); }
	void swap(ref_ptr &other) noexcept { std::swap(obj_, other.obj_); }

	T *get() const noexcept { return obj_; }
	T &operator*() const noexcept { return *obj_; }
	T *operator->() const noexcept { return obj_; }
	explicit operator bool() const noexcept { return obj_ != nullptr; }
	friend bool operator==(const ref_ptr &a, const ref_ptr &b) noexcept { return a.obj_ == b.obj_; }
	friend bool operator!=(const ref_ptr &a, const ref_ptr &b) noexcept { return a.obj_ != b.obj_; }

private:
	explicit ref_ptr(T *obj) noexcept : obj_(obj) {}
	/* The count is not part of T's value: a ref_ptr<const T> counts too. */
	static auto counter(T *obj) noexcept
	{
		using object = std::remove_const_t<T>;

		return ref_traits<object>::counter(const_cast<object &>(*obj));
	}

	T *obj_ = nullptr;
};

/*
 * owner<T> - the initial reference of an owned object.  kill() drops it
 * (percpu_ref_kill / percpu_rcuref_kill): new try_acquire_live() calls
 * fail once the kill is confirmed, and the object is freed when the last
 * ref_ptr goes.  The destructor kills an owner not killed yet.  The kill is
 * asynchronous: with no ref_ptr left, ~T runs after a reader fence on the
 * library's callback thread (percpu_ref_barrier() waits for it); for an
 * rcu_refcounted T, unpublish() runs there and ~T after an RCU grace
 * period on the reclaimer thread (percpu_rcuref_barrier() waits for it,
 * percpu_ref_barrier() does not); at exit()
 * the library finishes it before the static objects built before its
 * first use are destroyed (percpuref_shutdown()).  A static owner built
 * before that use (every namespace-scope one: constant-initialised) is
 * destroyed after it: since 0.4.32 its kill then runs the release before
 * it returns, and a static ref_ptr's last put releases a managed object
 * there too (docs/percpu_ref.md, "At process exit").
 */
template <class T> class owner {
public:
	owner() noexcept = default;
	owner(owner &&other) noexcept : obj_(std::exchange(other.obj_, nullptr)) {}
	owner &operator=(owner &&other) noexcept
	{
		/* Other's object first, then the kill of ours, as unique_ptr
		 * resets: @other may live inside our object (a list's
		 * head = std::move(head->next)), which the kill may free.
		 * A self-move takes and puts back the same object. */
		T *taken = std::exchange(other.obj_, nullptr);

		if (T *old = std::exchange(obj_, taken))
			detail::kill(ref_traits<T>::counter(*old));
		return *this;
	}
	owner(const owner &) = delete;
	owner &operator=(const owner &) = delete;
	~owner() { kill(); }

	/* Drops the initial reference; the owner is empty afterwards.  May
	 * wait for the callback thread while it is more than
	 * PERCPUREF_CALLBACK_BACKLOG kills behind (percpu_ref(3)). */
	void kill() noexcept
	{
		if (T *obj = std::exchange(obj_, nullptr))
			detail::kill(ref_traits<T>::counter(*obj));
	}

	/* A counted reference for a user (empty when the owner is). */
	ref_ptr<T> share() const noexcept { return ref_ptr<T>::acquire(obj_); }

	T *get() const noexcept { return obj_; }
	T &operator*() const noexcept { return *obj_; }
	T *operator->() const noexcept { return obj_; }
	explicit operator bool() const noexcept { return obj_ != nullptr; }

private:
	friend struct detail::access;
	explicit owner(T *obj) noexcept : obj_(obj) {}

	T *obj_ = nullptr;
};

inline namespace PERCPUREF_HPP_MODE {

/*
 * make_owner<T>(args...) - new T(args...) with a per-CPU count whose
 * initial reference the returned owner holds.
 */
template <class T, class... Args> owner<T> make_owner(Args &&...args)
{
	detail::check_deletable<T>();
	T *obj = new T(std::forward<Args>(args)...);
	int err = detail::access::init(obj, 0);

	if (err) {
		delete obj;
		detail::throw_errno(err, "percpu_ref_init");
	}
	return detail::access::adopt_owner(obj);
}

/*
 * make_managed<T>(args...) - new T(args...) that nobody owns: the manager
 * takes its own reference and the reclaimer frees the object once that is
 * the only one left (docs/managed.md).  The returned ref_ptr holds the
 * creator's reference.  Never kill it: there is no owner to.
 */
template <class T, class... Args> ref_ptr<T> make_managed(Args &&...args)
{
	detail::check_deletable<T>();
	T *obj = new T(std::forward<Args>(args)...);
	/* Atomic until managed: a failure before it is an exact atomic put. */
	int err = detail::access::init(obj, PERCPU_REF_INIT_ATOMIC);

	if (err) {
		delete obj;
		detail::throw_errno(err, "percpu_ref_init");
	}
	err = detail::switch_to_managed(obj->percpuref_counter());
	if (err) {
		/*
		 * Not managed (the library refuses no fresh, atomic, counted
		 * ref today): ours is the only reference, of an object nobody
		 * has seen.  Exit and delete it here, as make_owner does; a
		 * kill would run an rcu_refcounted T's unpublish() on an
		 * object it never published.
		 */
		detail::exit_counter(obj->percpuref_counter());
		delete obj;
		detail::throw_errno(err, "percpu_ref_switch_to_managed");
	}
	return ref_ptr<T>::adopt(obj);
}

/*
 * poll_registration - makes the constructing thread a polling thread for
 * the object's life (percpu_ref_poll_register(); percpu_ref.h): the kills
 * this thread makes (an owner's kill() or destruction) are finished by its
 * own poll() calls, and ~T of the objects they release runs there, not on
 * the library's callback thread (for an rcu_refcounted T, its unpublish()
 * runs there, and ~T after a grace period on the reclaimer thread, which
 * drain() does not wait for: percpu_rcuref_barrier() does).  Call poll() regularly, between requests
 * say; drain() finishes every kill the thread made, and those that the
 * ~T it runs make, except those another thread's percpu_ref_barrier() (or
 * a wait for that one ref's switch) took over meanwhile: those finish on
 * the callback thread, and drain() does not wait for them.
 *
 * The registration is its thread's: the object is neither copyable nor
 * movable, and belongs on that thread's stack, for the scope that polls.
 * The constructor throws std::system_error with EALREADY when the thread
 * is registered already (inside a ~T its own poll runs, too), EPERM on one
 * of the library's threads, EDEADLK inside a callback run by a wait that
 * runs the library's queue itself (no callback thread could start), EAGAIN
 * when no hook at thread exit could be set, and std::bad_alloc.  poll(),
 * poll_wait() and drain() throw EPERM on another thread than the one that
 * registered (without touching that thread's registration) and EDEADLK
 * inside a callback the library runs (a ~T a poll runs, a confirm).  The
 * destructor unregisters, handing what is still queued to the callback
 * thread; destroyed on another thread, or inside a callback, it cannot,
 * says so on stderr, and the thread stays registered (its queue is handed
 * over when it exits or another thread calls percpu_ref_barrier()).
 */
class poll_registration {
public:
	poll_registration()
	{
		if (int err = percpu_ref_poll_register())
			detail::throw_errno(err, "percpu_ref_poll_register");
		*__percpu_ref_poll_owner() = this;
	}
	~poll_registration()
	{
		int err = -EPERM;

		/* On our thread, EPERM: unregistered already (by a C call). */
		if (owned()) {
			*__percpu_ref_poll_owner() = nullptr;
			if ((err = percpu_ref_poll_unregister()) == -EPERM)
				return;
		}
		if (err)
			std::fprintf(stderr, "percpuref::poll_registration: %s; the thread stays "
					     "registered\n", err == -EPERM ? "destroyed on another thread"
									 : std::strerror(-err));
	}
	poll_registration(const poll_registration &) = delete;
	poll_registration &operator=(const poll_registration &) = delete;

	/* Finishes this thread's kills whose reader fence has ended (starting
	 * one, paced, if none is recent); how many. */
	unsigned int poll() { return checked(0); }
	/* The same, but first waits for the oldest when none can be finished
	 * yet: 0 once none is queued. */
	unsigned int poll_wait() { return checked(PERCPU_REF_POLL_WAIT); }
	/* Finishes this thread's kills, but those taken over (above). */
	void drain()
	{
		while (poll_wait() > 0)
			;
	}

private:
	unsigned int checked(unsigned int flags)
	{
		int ret = owned() ? percpu_ref_poll(flags) : -EPERM;

		if (ret < 0)
			detail::throw_errno(ret, "percpu_ref_poll");
		return static_cast<unsigned int>(ret);
	}

	/* Whether this is the calling thread's registration, by a slot the
	 * library keeps per thread.  Not the registering thread's pthread_t:
	 * a thread started after that one ended often gets the same, and
	 * polled or unregistered itself through it.  Nor a thread_local of
	 * this header's: plugins loaded with RTLD_LOCAL (or built without
	 * GCC's unique symbols) each had their own, and one could not poll
	 * or destroy a registration another made on the same thread. */
	bool owned() const
	{
		return *__percpu_ref_poll_owner() == this;
	}
};

} /* inline namespace PERCPUREF_HPP_MODE */
} /* namespace percpuref */

#undef PERCPUREF_HPP_MODE

#endif /* C++17 */
#endif
