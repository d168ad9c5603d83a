// SPDX-License-Identifier: MIT
//! A shared pointer whose reference count is per-CPU.
//!
//! [`std::sync::Arc`] counts with one atomic integer: every clone and every
//! drop, from every thread, writes the same cache line, so a hot `Arc`
//! shared by many threads stops scaling (the kernel's `kref` problem).
//! [`PcArc`] counts with percpuref's `percpu_ref`: a clone or a drop adds
//! to *this CPU's* counter, one non-atomic instruction in a restartable
//! sequence, and no shared line is written.  The price: the total cannot
//! be seen while the count is per-CPU, so something must decide when the
//! value may go.  Two ways, both here:
//!
//! * **An owner** ([`Owner`]): the value has one owner who holds the
//!   initial reference and drops it with [`Owner::kill`] (or by dropping
//!   the owner).  The count then switches to one atomic counter and the
//!   value is dropped when the last [`PcArc`] goes.  Use it for objects
//!   with a clear end of life: a connection, a request, a loaded module.
//! * **Managed** ([`PcArc::new_managed`]): nobody owns the value.  The
//!   library's reclaimer thread holds a reference of its own, checks up to
//!   100 managed values every 5 s (the C library's defaults, set by
//!   `PERCPUREF_SCAN_MAX` and `PERCPUREF_SCAN_INTERVAL_MS`), and drops a
//!   value once its reference is the only one left.  Use it for cache
//!   entries, labels, anything shared with no natural owner, made at a
//!   rate the reclaimer keeps up with: at the defaults it drops at most 20
//!   values a second, and values made faster than that accumulate
//!   ([`flush_managed`] drops every one that is unreferenced when it is
//!   called).
//!
//! ```
//! use percpuref::{Owner, PcArc};
//!
//! let owner = Owner::new(String::from("config v1")).unwrap();
//! let handle: PcArc<String> = owner.share();      // per-CPU get
//! let worker = std::thread::spawn(move || {
//!     let copy = handle.clone();                  // per-CPU get
//!     copy.len()                                  // dropped: per-CPU put
//! });
//! owner.kill();                                   // the value goes with the last PcArc
//! assert_eq!(worker.join().unwrap(), 9);
//! ```
//!
//! Where the value is dropped: on the thread whose drop of a [`PcArc`]
//! releases the last reference, on the thread that calls [`Owner::kill`]
//! (or drops the [`Owner`]) when no `PcArc` is left, on one of the
//! library's threads (the callback thread finishing a kill, the reclaimer
//! for managed values), or in the polls of the thread that killed the
//! owner while holding a [`PollRegistration`], or on a thread that waits
//! in [`wait_for_releases`] or [`flush_managed`] when the library's
//! threads cannot start.  Never in a fork child for a value made before
//! the fork: the C library finishes the parent's queued kills there, and
//! a child of `std::process::Command` would run the parent's `Drop`s on
//! its copies between its fork and its exec; the child leaks them (the
//! parent drops the originals if it lives to: a process that forks and
//! exits, as a daemon's double fork or pre-forked workers do, leaves its
//! values to children that never drop them, file descriptors they own
//! included, where an `Arc`'s would be dropped there).  Hence
//! `T: Send + Sync + 'static` everywhere, and a `Drop` must not take a lock
//! that the thread dropping the owner or a `PcArc` may hold.
//!
//! What a value's `Drop` must not do: panic (a panic cannot unwind into
//! the C library that runs the release: the process aborts), or wait for
//! [`wait_for_releases`] or [`flush_managed`] (they wait for the library's
//! threads, which may be the one running it).  Values that hold
//! `PcArc`s to each other in a cycle are never dropped, as `Arc`s.
//!
//! At exit (`main` returned, or `std::process::exit`): values whose last
//! reference went before the exit are dropped first, on the library's
//! threads, as if [`wait_for_releases`] and [`flush_managed`] were called
//! (a managed value whose `PcArc`s are all gone, an owner's value killed
//! with no `PcArc` left), and called again while they drop anything, no
//! new round starting after a second: the values those `Drop`s release go
//! too (a chain of managed values, each holding the next's only `PcArc`,
//! at least one link a round; up to 0.3.19 four rounds, so four links);
//! the exit waits for their `Drop`s.  A `Drop` that makes and drops a
//! managed value each time, or a thread that keeps doing so, makes the
//! rounds last that second and the one in flight then (a pass over every
//! managed value), and what is left then is leaked.  A value
//! released after that (by a thread still running, or by the C library's
//! own exit destructor) is leaked, not dropped, as Rust leaves values alive
//! at exit.  That destructor runs on the exiting thread after its
//! thread-locals are gone and with whatever locks it holds: dropping
//! values there aborted on `std::thread::current()`.  Where the library's
//! threads cannot start (a sandbox that refuses new threads, a full `pids`
//! cgroup), what they would drop at exit would be dropped on that same
//! thread: it is leaked too (up to 0.3.1 the process aborted there).
//! Call [`wait_for_releases`] and [`flush_managed`] before the exit to
//! have those values dropped on a thread whose thread-locals are alive.
//! So a `Drop` must not need a lock that the thread calling `exit`
//! holds: the exit waits for it (`Arc` drops nothing at exit; here
//! `let _g = M.lock(); std::process::exit(1)` hangs if a released value's
//! `Drop` takes `M`).  The exit also drops the whole backlog of managed
//! values whose `PcArc`s are gone: a program that makes them faster than
//! the reclaimer releases them (at most `max_per_scan` every `interval_ms`)
//! has a backlog that grows without bound, and an exit that takes as long.
//!
//! Like `Arc`, which aborts when its count would pass `isize::MAX`, the
//! process aborts before 2^29 `PcArc`s are alive at once (all values
//! together; each thread reserves room for 1024 ahead of its clones, so
//! with many threads a little earlier): the C count keeps 31 bits of its
//! per-CPU net count,
//! and without the check, 2^31 - 1 clones passed to `mem::forget` (safe
//! code, 3 s on one thread) wrapped it to zero and dropped the value under
//! a live `PcArc`.  The check costs a thread-local add per clone and drop
//! (about 0.5 ns per clone+drop pair on the 2-vCPU test machine).
//!
//! The C library needs no thread registration, so any Rust thread may use
//! these types; see `docs/percpu_ref.md` and `docs/managed.md` in the
//! repository for the underlying contract.
use std::fmt;
use std::io::Write;
use std::marker::PhantomData;
use std::ops::Deref;
use std::panic::{self, AssertUnwindSafe};
use std::ptr::{self, NonNull};

use percpuref_sys as sys;

/// An error from the C library: a negative errno value, made positive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Error(i32);

impl Error {
    /// The errno value (`ENOMEM`, `EINVAL`, ...).
    pub fn errno(self) -> i32 {
        self.0
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "percpuref: {}", std::io::Error::from_raw_os_error(self.0))
    }
}

impl std::error::Error for Error {}

fn check(ret: i32) -> Result<(), Error> {
    if ret < 0 {
        Err(Error(-ret))
    } else {
        Ok(())
    }
}

/// Live [`PcArc`]s, counted so that no safe program can overflow the C
/// count.  While a count is per-CPU, the library keeps only the low 31 bits
/// of its per-CPU net count (the high bits of each per-CPU word tell the
/// reclaimer the ref is in use), so fewer than 2^30 references may be taken
/// on the per-CPU words of one ref in one per-CPU period (2^31 up to C
/// 0.3.16).  C callers take that as a documented limit; in Rust,
/// `mem::forget` of a clone is safe, and before this limit 2^32 - 1
/// forgotten clones (6 s on one thread) wrapped the 0.3 count to zero: the
/// value was dropped under a live `PcArc` (2^31 - 1 would now).  `Arc` aborts past
/// `isize::MAX` for the same reason.
///
/// Each thread reserves room for `CHECK_EVERY` handles in a process-wide
/// count before it makes them, and gives room back once `2 * CHECK_EVERY`
/// is unused (and all of it at its exit); a reservation that takes the
/// count to `LIMIT` aborts the process.  So the count is never below the
/// live handles, whatever the number of threads: up to 0.3.1 each thread
/// counted what it had made and handed that in afterwards, and a million
/// threads, each with fewer than `CHECK_EVERY` clones not handed in,
/// could have passed 2^30 live handles unseen.  One ref's per-CPU net
/// count is at most the number of live handles (each per-CPU get made
/// one; a put of a handle made in an earlier period only lowers it) while
/// every get and put of its handles lands on the per-CPU words (a thread
/// with no unit on the fallback path, or a call after the thread's exit
/// hook, counts on one more word of the ref's since C 0.4.2; up to 0.4.1
/// it used the atomic count, which let the per-CPU share drift from the
/// live handles, and 2^30 such crossings leaked the value:
/// `docs/percpu_ref.md`, "Counts"; the handles make no call of more than
/// one).  So the live handles stay under `LIMIT`, 2^29; a program with
/// fewer than 2^29 - 2^11 x threads live handles never aborts.  Cost: a
/// thread-local add and compare per clone or drop; the shared word is
/// written once per `CHECK_EVERY` at most.
mod live {
    use std::cell::Cell;
    use std::io::Write;
    use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

    #[cfg(not(test))]
    pub(crate) const LIMIT: i64 = 1 << 29;
    #[cfg(not(test))]
    pub(crate) const CHECK_EVERY: i64 = 1 << 10;
    // Small in the unit tests, so that reaching the limit takes no time,
    // and 64 threads' reservations reach it.
    #[cfg(test)]
    pub(crate) const LIMIT: i64 = 1 << 16;
    #[cfg(test)]
    pub(crate) const CHECK_EVERY: i64 = 1 << 10;

    /// The room the threads have reserved: never below the live handles.
    static RESERVED: AtomicI64 = AtomicI64::new(0);

    /// This thread's reserved room not taken by its handles (handles it
    /// dropped, whoever made them, give theirs back here).
    struct Unused(Cell<i64>);

    impl Drop for Unused {
        fn drop(&mut self) {
            reserve(-self.0.get());
        }
    }

    thread_local! {
        static UNUSED: Unused = const { Unused(Cell::new(0)) };
    }

    /// Relaxed: a count, ordered with nothing; the abort needs no more.
    #[cold]
    #[inline(never)]
    fn reserve(delta: i64) {
        let reserved = RESERVED.fetch_add(delta, Relaxed) + delta;

        if delta > 0 && reserved >= LIMIT {
            // Not eprintln!, which panics when stderr fails: a caught panic
            // would skip the abort and let the count go on to wrap.
            let _ = writeln!(
                std::io::stderr(),
                "percpuref: {} live PcArc handles, past the limit of {} (the per-CPU count \
                 is 31 bits wide: leaked clones?); aborting",
                reserved, LIMIT
            );
            std::process::abort();
        }
    }

    /// A `PcArc` was made, before it is returned: room for it is reserved
    /// (the get, just made, is one of at most one per thread not yet
    /// covered, far inside the margin from 2^29 to 2^30).
    #[inline]
    pub(crate) fn made() {
        let counted = UNUSED.try_with(|unused| {
            if unused.0.get() == 0 {
                reserve(CHECK_EVERY);
                unused.0.set(CHECK_EVERY);
            }
            unused.0.set(unused.0.get() - 1);
        });
        // The thread-local is gone (a thread-local destructor ran late).
        if counted.is_err() {
            reserve(1);
        }
    }

    /// A `PcArc` was dropped.
    #[inline]
    pub(crate) fn dropped() {
        let counted = UNUSED.try_with(|unused| {
            let room = unused.0.get() + 1;

            if room < 2 * CHECK_EVERY {
                unused.0.set(room);
            } else {
                unused.0.set(room - CHECK_EVERY);
                reserve(-CHECK_EVERY);
            }
        });
        if counted.is_err() {
            reserve(-1);
        }
    }
}

/// Whether the process is exiting: set by an `atexit` handler that the
/// first allocation registers, once it has dropped what was released
/// before the exit.  `exit` runs the handlers in the reverse
/// order of their registration.  The C library's exit handler (its
/// shutdown, which runs what is left on the exiting thread, whose
/// thread-locals may be gone) is registered when the library is set up,
/// and again run by its exit destructor, which glibc runs from a handler
/// registered before `main`: this one is registered after both, once the
/// library is set up, so it runs first and the flag is set before the
/// library releases anything on the exiting thread.
mod exiting {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Once;
    use std::time::{Duration, Instant};

    static EXITING: AtomicBool = AtomicBool::new(false);
    /// The thread running the handler (0: none has run).
    static EXITING_THREAD: AtomicUsize = AtomicUsize::new(0);
    /// Whether the handler's rounds run: only then does release() count
    /// its drops in `DROPPED` (one shared line written by every release
    /// otherwise), and the rounds go on while that count moves.
    static ROUNDS: AtomicBool = AtomicBool::new(false);
    static DROPPED: AtomicUsize = AtomicUsize::new(0);
    /// How long the rounds may go on: a `Drop` that makes and drops a
    /// managed value, or a thread that keeps doing so, gives every round
    /// something to drop, and each round is a pass over every managed
    /// value (the C library's shutdown, which stops once a thread not its
    /// own queues work, cannot tell ours apart from the program's).
    const ROUNDS_BUDGET: Duration = Duration::from_secs(1);
    static REGISTER: Once = Once::new();

    extern "C" {
        fn atexit(handler: extern "C" fn()) -> i32;
        // pthread_t: an unsigned long (glibc) or a pointer (musl).
        fn pthread_self() -> usize;
    }

    /// Drops what was released before the exit, on the library's threads
    /// (their thread-locals are alive), then marks the exit.  Each call
    /// may be refused (EDEADLK: `exit` called from a value's `Drop` on a
    /// library thread, or inside a read-side section), which leaves those
    /// values to the flag.  A `Drop` run here may release more values (a
    /// managed value holding the only `PcArc` of the next releases at
    /// least one link a round): rounds go on while one drops anything, none
    /// starting after `ROUNDS_BUDGET`, and what is left then is leaked.
    /// Where the library's threads cannot start (a sandbox, a full `pids`
    /// cgroup), the C library runs that work on this thread instead, whose
    /// thread-locals the C library's `exit` destroyed before the handlers:
    /// what would be dropped here is leaked (see `on_exiting_thread()`).
    extern "C" fn drop_released_then_mark() {
        // SAFETY: no precondition.  Relaxed: only this thread compares
        // its own id with it (release() on another thread sees 0 or an id
        // not its own).
        EXITING_THREAD.store(unsafe { pthread_self() }, Ordering::Relaxed);
        // Relaxed: the releases the rounds wait for read it after the
        // barrier's and the flush's locks, taken after this store (the C
        // library's happens-before).  One already running may miss it and
        // not count its drop; what that drop released it released before
        // reading the flag, so before the round's flush, which drops it and
        // counts that.
        ROUNDS.store(true, Ordering::Relaxed);
        let started = Instant::now();
        loop {
            // Relaxed: release() counts a drop before its callback
            // returns, which the barrier and the flush wait for (as
            // above); a drop on a thread they do not wait for only adds a
            // round.
            let dropped_before = DROPPED.load(Ordering::Relaxed);
            let killed = super::wait_for_releases();
            let flushed = super::flush_managed();
            if killed.is_err()
                || flushed.is_err()
                || DROPPED.load(Ordering::Relaxed) == dropped_before
                || started.elapsed() > ROUNDS_BUDGET
            {
                break;
            }
        }
        ROUNDS.store(false, Ordering::Relaxed);
        // Relaxed: the C exit destructor runs later on this thread; a
        // library thread that misses it drops a value it released (the
        // process is still whole until that destructor has waited for it).
        EXITING.store(true, Ordering::Relaxed);
    }

    /// Registers the handler, once per process, after the library's own
    /// (see above).
    pub(crate) fn register() {
        REGISTER.call_once(|| {
            // SAFETY: sets the library up, nothing else; the handler calls
            // the library and stores a flag, and may run at any time.  If
            // the registration fails (no memory), the C exit handlers drop
            // values, as before.
            unsafe {
                super::sys::percpuref_fast_path();
                atexit(drop_released_then_mark)
            };
        });
    }

    /// Counts a value dropped while the rounds run (see `ROUNDS`).
    pub(crate) fn count_drop() {
        // Relaxed: see drop_released_then_mark().
        if ROUNDS.load(Ordering::Relaxed) {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn now() -> bool {
        // Relaxed: see drop_released_then_mark().
        EXITING.load(Ordering::Relaxed)
    }

    /// Whether the caller is the exiting thread, in the handler above:
    /// there a `Drop` that touches a thread-local with a destructor
    /// (`std::thread::current()`, a logger's) panicked and aborted the
    /// process.
    pub(crate) fn on_exiting_thread() -> bool {
        // Relaxed: see drop_released_then_mark().
        let exiting = EXITING_THREAD.load(Ordering::Relaxed);
        // SAFETY: no precondition.
        exiting != 0 && exiting == unsafe { pthread_self() }
    }
}

/// The allocation: the counter first, so the release callback gets from the
/// `percpu_ref` it is called with back to the whole (`repr(C)`).
#[repr(C)]
struct Inner<T> {
    counter: sys::percpu_ref,
    /// The process that made it: its fork generation and its ID (see
    /// `made_here()`): a child's copy is never dropped (see release()).
    generation: u64,
    pid: u32,
    value: T,
}

/// This process's fork generation (`percpuref_fork_generation()`,
/// counted by the C library in each child of a `fork()` that runs the
/// atfork handlers, before the child's library threads start).
fn fork_generation() -> u64 {
    // SAFETY: no precondition.
    u64::from(unsafe { sys::percpuref_fork_generation() })
}

/// Whether a value made with @generation and @pid was made in this
/// process.  The C library finishes, in a fork child, the kills still
/// queued at the fork and checks the managed refs the child inherited: a
/// child of `std::process::Command`, between its fork and its exec, would
/// run the `Drop` of the parent's values on its copies (a flush, a file
/// removed, a message sent twice).  Values made elsewhere are the
/// parent's: the child leaks its copies.  Both tests: the generation
/// tells a child whose ID equals its parent's (both PID 1 of their PID
/// namespaces; an ID reused), the ID one made without the atfork handlers
/// (`_Fork()`, `clone()`, a fork before the library's constructor).
fn made_here(generation: u64, pid: u32) -> bool {
    generation == fork_generation() && pid == std::process::id()
}

/// Called by the C library exactly once, when the count reaches zero: on
/// the last putter's thread or one of the library's threads.
unsafe extern "C" fn release<T>(counter: *mut sys::percpu_ref) {
    let inner = counter as *mut Inner<T>;

    // SAFETY: the count reached zero: nothing uses the counter again.
    sys::percpu_ref_exit(counter);
    if exiting::now() || exiting::on_exiting_thread() {
        return; // leaked: the process is exiting (see the crate's docs)
    }
    if !made_here((*inner).generation, (*inner).pid) {
        return; // leaked: the parent's value, in a fork child
    }
    // A panic must not unwind into C, nor may dropping its payload (which
    // can panic again): the payload is leaked, the process aborted.
    // SAFETY: the box allocate() made, released once (the C contract).
    if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(inner)))) {
        std::mem::forget(payload);
        std::process::abort();
    }
    exiting::count_drop();
}

/// Boxes @value with an initialised counter holding one reference.
fn allocate<T>(value: T, flags: u32) -> Result<NonNull<Inner<T>>, Error> {
    exiting::register();
    let inner = Box::into_raw(Box::new(Inner {
        counter: sys::percpu_ref { percpu_count_ptr: 0, data: ptr::null_mut() },
        generation: fork_generation(),
        pid: std::process::id(),
        value,
    }));
    // SAFETY: inner is a fresh, unique allocation that never moves again.
    // Taken from the raw box pointer, not through a reference to the
    // field, the pointer keeps the whole box's provenance: release::<T>
    // frees the box through it (as counter_of() does).
    let ret = unsafe {
        sys::percpu_ref_init(ptr::addr_of_mut!((*inner).counter), Some(release::<T>), flags)
    };
    if let Err(e) = check(ret) {
        // SAFETY: init failed and allocated nothing; we still own the box.
        drop(unsafe { Box::from_raw(inner) });
        return Err(e);
    }
    // SAFETY: Box::into_raw never returns null.
    Ok(unsafe { NonNull::new_unchecked(inner) })
}

/// One counted reference to a shared `T`: the per-CPU `Arc`.
///
/// `clone` takes a reference and `drop` drops it, each one add on this
/// CPU's counter while the count is per-CPU.  The value lives while any
/// `PcArc` (or the [`Owner`], or for a managed value, the manager) holds a
/// reference.
///
/// ```
/// use percpuref::PcArc;
///
/// let cache_entry = PcArc::new_managed(vec![1, 2, 3]).unwrap();
/// let again = cache_entry.clone();
/// assert!(PcArc::ptr_eq(&cache_entry, &again));
/// assert_eq!(again.iter().sum::<i32>(), 6);
/// drop(cache_entry);
/// drop(again);
/// percpuref::flush_managed().unwrap(); // the reclaimer drops the vector now
/// ```
///
/// The value must be shareable across threads, as for `Arc`:
///
/// ```compile_fail
/// let not_sync = percpuref::PcArc::new_managed(std::rc::Rc::new(1));
/// ```
pub struct PcArc<T: Send + Sync + 'static> {
    inner: NonNull<Inner<T>>,
    _owns: PhantomData<Inner<T>>,
}

// SAFETY: a PcArc sent to another thread gives that thread `&T` (needs
// `T: Sync`) and may be the last reference, dropping `T` there (needs
// `T: Send`); the bounds on the type demand both.  The count itself is
// thread-safe: percpu_ref get/put may be called from any thread without
// registration (per-CPU adds are restartable sequences, atomic mode uses
// atomic RMWs).
unsafe impl<T: Send + Sync + 'static> Send for PcArc<T> {}
// SAFETY: `&PcArc` allows `clone` (a get from any thread: see above) and
// `&T`, which `T: Sync` covers; a clone can then move and drop `T` as
// above (`T: Send`).
unsafe impl<T: Send + Sync + 'static> Sync for PcArc<T> {}

impl<T: Send + Sync + 'static> PcArc<T> {
    /// A managed value: nobody owns it; the library's reclaimer holds a
    /// reference of its own and drops the value, on its own thread, once
    /// no `PcArc` is left: at the scan that reaches it (a scan every 5 s
    /// checks up to 100 values by default, so with N managed values one
    /// may wait up to N / 100 scans), or at [`flush_managed`].  The
    /// returned `PcArc` is the creator's reference.  Fails as
    /// [`Owner::new`] does.
    pub fn new_managed(value: T) -> Result<PcArc<T>, Error> {
        // Atomic until managed: the failure path below is an exact put.
        let inner = allocate(value, sys::PERCPU_REF_INIT_ATOMIC)?;
        let counter = counter_of(inner);
        // SAFETY: a live ref holding our initial reference.
        if let Err(e) = check(unsafe { sys::percpu_ref_switch_to_managed(counter) }) {
            // SAFETY: not managed, so ours is the only reference, the
            // initial one: the kill drops it and the release frees `inner`,
            // which nothing uses afterwards.
            unsafe { sys::percpuref_sys_kill(counter) };
            return Err(e);
        }
        live::made();
        Ok(PcArc { inner, _owns: PhantomData })
    }

    /// True when both point to the same value.
    pub fn ptr_eq(a: &PcArc<T>, b: &PcArc<T>) -> bool {
        a.inner == b.inner
    }

    /// True once the owner killed the value (it goes with the last
    /// `PcArc`).  Never true for a managed value still referenced.
    pub fn is_dying(this: &PcArc<T>) -> bool {
        // SAFETY: we hold a reference, so the counter is initialised.
        unsafe { sys::percpuref_sys_is_dying(counter_of(this.inner)) }
    }
}

fn counter_of<T>(inner: NonNull<Inner<T>>) -> *mut sys::percpu_ref {
    // SAFETY: only the address of the field is taken.
    unsafe { ptr::addr_of_mut!((*inner.as_ptr()).counter) }
}

impl<T: Send + Sync + 'static> Clone for PcArc<T> {
    fn clone(&self) -> Self {
        // SAFETY: we hold a reference, so the value is alive: a get is allowed.
        unsafe { sys::percpuref_sys_get(counter_of(self.inner)) };
        live::made();
        PcArc { inner: self.inner, _owns: PhantomData }
    }
}

impl<T: Send + Sync + 'static> Drop for PcArc<T> {
    fn drop(&mut self) {
        live::dropped();
        // SAFETY: drops the reference this PcArc holds; `self.inner` is not
        // used afterwards.  A put releases (C: acquire-release), so every
        // access made through this PcArc happens before the value's drop.
        unsafe { sys::percpuref_sys_put(counter_of(self.inner)) };
    }
}

impl<T: Send + Sync + 'static> Deref for PcArc<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the reference we hold keeps the value alive.
        unsafe { &(*self.inner.as_ptr()).value }
    }
}

impl<T: Send + Sync + fmt::Debug + 'static> fmt::Debug for PcArc<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// The owner of a shared value: holds the initial reference.
///
/// [`Owner::share`] hands out [`PcArc`]s; [`Owner::kill`] (or dropping the
/// owner) drops the initial reference, and the value is dropped when the
/// last `PcArc` goes.  One owner per value, so it is not `Clone`.
///
/// ```
/// use percpuref::Owner;
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::sync::Arc;
///
/// struct Connection { closed: Arc<AtomicBool> }
/// impl Drop for Connection {
///     fn drop(&mut self) { self.closed.store(true, Ordering::SeqCst); }
/// }
///
/// let closed = Arc::new(AtomicBool::new(false));
/// let owner = Owner::new(Connection { closed: closed.clone() }).unwrap();
/// let request = owner.share();
/// owner.kill();
/// assert!(!closed.load(Ordering::SeqCst));  // a request still holds it
/// drop(request);
/// percpuref::wait_for_releases().unwrap();
/// assert!(closed.load(Ordering::SeqCst));
/// ```
pub struct Owner<T: Send + Sync + 'static> {
    inner: NonNull<Inner<T>>,
    _owns: PhantomData<Inner<T>>,
}

// SAFETY: as for PcArc: the owner gives `&T` and `share()` (needs
// `T: Sync`); its kill may drop `T` on another thread (needs `T: Send`).
unsafe impl<T: Send + Sync + 'static> Send for Owner<T> {}
// SAFETY: `&Owner` allows `share()` (a get) and `&T`; see PcArc.
unsafe impl<T: Send + Sync + 'static> Sync for Owner<T> {}

impl<T: Send + Sync + 'static> Owner<T> {
    /// Allocates the value with a per-CPU count holding the owner's
    /// initial reference.  Fails (ENOMEM) when the per-CPU counter or the
    /// C library's data for it cannot be allocated, or when
    /// `pthread_atfork()` refused the C library's fork handlers, warned on
    /// stderr (the value is then dropped); the `Box` holding the value
    /// aborts on allocation failure, as everywhere in std.
    pub fn new(value: T) -> Result<Owner<T>, Error> {
        Ok(Owner { inner: allocate(value, 0)?, _owns: PhantomData })
    }

    /// A new counted reference.
    pub fn share(&self) -> PcArc<T> {
        // SAFETY: the owner's reference keeps the value alive.
        unsafe { sys::percpuref_sys_get(counter_of(self.inner)) };
        live::made();
        PcArc { inner: self.inner, _owns: PhantomData }
    }

    /// Drops the initial reference: the count switches to atomic mode
    /// (after a grace period, on the library's callback thread, or in this
    /// thread's polls while it holds a [`PollRegistration`]) and the
    /// value is dropped when the last `PcArc` goes: on the thread of that
    /// drop, on the callback thread, or on this one, in this call, when no
    /// `PcArc` is left (which of the last two depends on timing).  The same
    /// as dropping the owner.  When the callback thread is more than
    /// `PERCPUREF_CALLBACK_BACKLOG` kills behind (65536 by default), the
    /// call waits for it to catch up by half first (`man percpu_ref`).
    pub fn kill(self) {
        drop(self);
    }
}

impl<T: Send + Sync + 'static> Drop for Owner<T> {
    fn drop(&mut self) {
        // SAFETY: the owner holds the initial reference and kills once.
        unsafe { sys::percpuref_sys_kill(counter_of(self.inner)) };
    }
}

impl<T: Send + Sync + 'static> Deref for Owner<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the owner's reference keeps the value alive.
        unsafe { &(*self.inner.as_ptr()).value }
    }
}

/// Waits until every kill started before the call has switched and every
/// value those kills released has been dropped.  For tests and shutdown;
/// not from a value's `Drop`: on a library thread it would wait for
/// itself, and returns `Err(EDEADLK)` (with a warning on stderr).
pub fn wait_for_releases() -> Result<(), Error> {
    // SAFETY: no precondition beyond the call site, which the C checks.
    check(unsafe { sys::percpu_ref_barrier() })
}

/// Makes the reclaimer drop, now, every managed value no `PcArc` holds
/// when it is called; returns once they are dropped.  Values their
/// `Drop`s release may wait for the next flush or scan: a chain of managed
/// values, each holding the only `PcArc` of the next, loses at least one
/// link a flush (the exit goes on until none is left, no new round after
/// a second; see the crate's docs).  Not from a value's `Drop` (as
/// [`wait_for_releases`]).  Needs no thread: while none can start (thread
/// creation refused) it scans on the calling thread and drops the values
/// there, as [`wait_for_releases`] runs the kills' switches and drops.
/// `Err(ENOMEM)` when a pass cannot start for want of memory.
pub fn flush_managed() -> Result<(), Error> {
    // SAFETY: as above.
    check(unsafe { sys::percpu_ref_managed_flush() })
}

/// Chooses the CPUs the C library's threads (its callback thread, which
/// drops killed values, and the reclaimer) may run on: `Some` list of CPUs
/// and ranges, comma-separated (`"3"`, `"0-3,8"`, as `taskset -c` takes
/// them; no blanks; a range may end in the kernel's `:USED/GROUP` or
/// taskset's `:STRIDE`, `"0-7:2"`), or `None` for the default, where each
/// runs where the thread whose call started it could (a pinned thread's
/// first kill pins the callback thread beside it; one library thread
/// started by the other starts where that one did), running ones going
/// back where they started.  Running threads change at once, all or none;
/// later ones as they start.  `Err(EINVAL)` for a list that is not one (a
/// NUL byte in it included) or CPUs a running library thread may not use
/// at all, the kernel's error otherwise (the C library's
/// `percpuref_set_library_cpus()`; docs/percpu_ref.md).  `PERCPUREF_LIBRARY_CPUS` in the environment
/// makes the same choice at start-up.
pub fn set_library_cpus(cpus: Option<&str>) -> Result<(), Error> {
    let list = match cpus {
        Some(text) => Some(std::ffi::CString::new(text).map_err(|_| Error(sys::EINVAL))?),
        None => None,
    };
    let text = list.as_ref().map_or(ptr::null(), |c| c.as_ptr());
    // SAFETY: `text` is NULL or a NUL-terminated string that outlives the call.
    check(unsafe { sys::percpuref_set_library_cpus(text) })
}

/// The per-CPU fast path this process uses (the C library's
/// `percpuref_fast_path()`): `"rseq-glibc"`, `"rseq-own"` or `"fallback"`,
/// chosen once, at the first ref or at this call.
///
/// ```
/// assert!(["rseq-glibc", "rseq-own", "fallback"].contains(&percpuref::fast_path()));
/// ```
pub fn fast_path() -> &'static str {
    // SAFETY: sets the library up; returns a static NUL-terminated string.
    static_word(unsafe { sys::percpuref_fast_path() })
}

/// How a switch's fences reach that fast path (the C library's
/// `percpuref_fence_method()`, C 0.4.26): `"membarrier"`, `"migration"`
/// (membarrier refused on an rseq path), `"reader-fences"` (refused on the
/// fallback: every clone and drop fences its own section, about 2.5 times
/// the cost) or `"none"` (no per-CPU section left).  A sandbox that refuses
/// membarrier changes it without changing [`fast_path`]'s word.
///
/// ```
/// let fences = percpuref::fence_method();
/// assert!(["membarrier", "migration", "reader-fences", "none"].contains(&fences));
/// ```
pub fn fence_method() -> &'static str {
    // SAFETY: sets the library up; returns a static NUL-terminated string.
    static_word(unsafe { sys::percpuref_fence_method() })
}

/// One of the C library's static ASCII words as a `&'static str`.
fn static_word(word: *const std::os::raw::c_char) -> &'static str {
    // SAFETY: the C library returns string literals, valid for ever.
    unsafe { std::ffi::CStr::from_ptr(word) }.to_str().unwrap_or("?")
}

/// Lets code that used this crate be unloaded: a `cdylib` that uses it
/// carries the C library, fast paths included, and each call (a clone or
/// drop of a `PcArc`, `Owner::new`, `share`, `kill`) leaves the calling
/// thread's rseq area pointing into it until the kernel next preempts the
/// thread; if the library was `dlclose`d first, the thread dies by
/// SIGSEGV.  Call it on every thread that used the library, after its last
/// use and before the unload (the C library's `percpuref_prepare_unload()`;
/// docs/percpu_ref.md).  Note that `dlclose` does not unmap such a `cdylib`
/// while a thread that cloned or dropped a `PcArc` lives: the live-handle
/// count's thread-local has a destructor, for which glibc keeps the
/// library loaded.
pub fn prepare_unload() {
    // SAFETY: one store to the calling thread's own rseq area.
    unsafe { sys::percpuref_prepare_unload() }
}

/// Makes the calling thread finish its own kills for as long as the
/// registration lives (the C library's `percpu_ref_poll_register()`): an
/// [`Owner`] this thread kills or drops is switched, and its value dropped
/// if no `PcArc` is left, inside this thread's [`poll`](Self::poll) calls
/// rather than on the library's callback thread.  Threads that end many
/// values' lives then share no callback thread, and the reader fences
/// their polls start are paced and shared by all.  Poll regularly (between
/// requests, say); [`drain`](Self::drain) finishes every kill made so far.
/// Dropping the registration hands whatever is still queued to the
/// callback thread, and so do the thread's exit and [`wait_for_releases`]
/// on any thread (a kill handed over so is finished there, and `drain`
/// does not wait for it).  The registration belongs to its thread, so it
/// is neither `Send` nor `Sync`.  One that is never dropped (passed to
/// `mem::forget`), or dropped inside a `Drop` that a poll runs (or a wait
/// that runs the queue itself, where no callback thread could start; it
/// warns: `EDEADLK`), leaves the thread registered with nothing to poll:
/// its later kills wait for its exit or the next [`wait_for_releases`],
/// and `PollRegistration::new()` fails with `EALREADY` on it.  The token
/// stands for the thread's registration in the C library, whichever made
/// it: if this one was ended there (a C `percpu_ref_poll_unregister()`,
/// the thread's exit hook) and the thread registered again through the C
/// API or the C++ header, dropping the token ends that registration, whose
/// polls then fail with `EPERM`.  Register a thread through one API only.
///
/// ```
/// use percpuref::{Owner, PollRegistration};
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::sync::Arc;
///
/// struct Connection(Arc<AtomicBool>);
/// impl Drop for Connection {
///     fn drop(&mut self) { self.0.store(true, Ordering::SeqCst); }
/// }
///
/// let polling = PollRegistration::new().unwrap();
/// let closed = Arc::new(AtomicBool::new(false));
/// Owner::new(Connection(closed.clone())).unwrap().kill();
/// polling.drain().unwrap();           // dropped here, on this thread
/// assert!(closed.load(Ordering::SeqCst));
/// ```
///
/// Another thread cannot poll for this one:
///
/// ```compile_fail
/// let polling = percpuref::PollRegistration::new().unwrap();
/// std::thread::spawn(move || polling.poll()).join().unwrap();
/// ```
#[must_use = "dropping the registration unregisters the thread at once"]
pub struct PollRegistration {
    _thread_bound: PhantomData<*const ()>,
}

impl PollRegistration {
    /// Registers the calling thread.  `Err(EALREADY)` when it is
    /// registered already (inside a `Drop` its own poll runs, too),
    /// `Err(EPERM)` on one of the library's threads, `Err(EDEADLK)` inside
    /// a `Drop` run by a wait that runs the library's queue itself (no
    /// callback thread could start), `Err(ENOMEM)`, or `Err(EAGAIN)` when
    /// no hook at the thread's exit could be set.
    pub fn new() -> Result<PollRegistration, Error> {
        // SAFETY: no precondition; the C checks the calling thread.
        check(unsafe { sys::percpu_ref_poll_register() })?;
        Ok(PollRegistration { _thread_bound: PhantomData })
    }

    /// Finishes this thread's kills whose reader fence has ended, dropping
    /// the values they release, and starts that fence if none started in
    /// the process within the pacing interval (300 µs, or
    /// `PERCPUREF_POLL_INTERVAL_US` read at the first registration);
    /// returns how many it finished.  `Err(EDEADLK)` inside a value's
    /// `Drop` that a poll runs.
    pub fn poll(&self) -> Result<usize, Error> {
        Self::polled(0)
    }

    /// As [`poll`](Self::poll), but when none can be finished yet it first
    /// waits for the oldest: `Ok(0)` once none is queued.
    pub fn poll_wait(&self) -> Result<usize, Error> {
        Self::polled(sys::PERCPU_REF_POLL_WAIT)
    }

    /// Finishes every kill this thread has made, and those that the
    /// dropped values' `Drop`s make, but those handed to the callback
    /// thread meanwhile (above).
    pub fn drain(&self) -> Result<(), Error> {
        while self.poll_wait()? > 0 {}
        Ok(())
    }

    fn polled(flags: std::os::raw::c_uint) -> Result<usize, Error> {
        // SAFETY: as for new(); a release it runs drops a value as the
        // callback thread would.
        let ret = unsafe { sys::percpu_ref_poll(flags) };
        check(ret)?;
        Ok(ret as usize)
    }
}

impl Drop for PollRegistration {
    fn drop(&mut self) {
        // SAFETY: as for new().
        let ret = unsafe { sys::percpu_ref_poll_unregister() };
        // EPERM: unregistered already.  A registration kept in a
        // thread_local is dropped after the C library's exit hook, which
        // registered after the thread_local's destructor and so runs
        // first, unregistered the thread.  Anything else (EDEADLK: dropped
        // inside a callback the library runs) leaves the thread registered;
        // its queue goes to the callback thread at its exit or the next
        // wait_for_releases.  Not eprintln!, which panics, and so aborts,
        // in a thread-local destructor when stderr is closed.
        if ret < 0 && -ret != sys::EPERM {
            let _ = writeln!(
                std::io::stderr(),
                "percpuref: PollRegistration dropped, thread still registered: {}",
                std::io::Error::from_raw_os_error(-ret)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// The two words are the C library's, each from its own call: an rseq
    /// path starts with membarrier registered (no refusal has happened in
    /// a test process), and the fallback fences with membarrier or with
    /// its readers' own barriers.
    #[test]
    fn fence_method_goes_with_fast_path() {
        let (path, fences) = (fast_path(), fence_method());
        assert!(["rseq-glibc", "rseq-own", "fallback"].contains(&path), "{}", path);
        if path == "fallback" {
            assert!(["membarrier", "reader-fences", "none"].contains(&fences), "{}", fences);
        } else {
            assert_eq!(fences, "membarrier");
        }
    }

    /// At exit, values whose last reference went before it are dropped
    /// before the exit goes on: on the library's threads, or on the killing
    /// thread when its put was the last, never by the C library's exit
    /// destructor, which released them on the exiting thread after its
    /// thread-locals were gone (a `Drop` that asked for
    /// `std::thread::current()` there panicked, which aborted the process).
    /// The test runs itself again as a child that makes a managed value and
    /// an owned one of that kind, drops the last `PcArc` of one and kills
    /// the other, drops a chain of managed values (each the only holder of
    /// the next), and exits; the child must exit with status 0 having
    /// dropped both values and every link.
    #[test]
    fn exit_drops_on_library_threads() {
        const CHILD: &str = "PERCPUREF_TEST_EXIT_CHILD";
        const LINKS: usize = 64;

        if std::env::var_os(CHILD).is_some() {
            struct NeedsThread(&'static str);
            impl Drop for NeedsThread {
                fn drop(&mut self) {
                    let _ = std::thread::current();
                    eprintln!("dropped {}", self.0);
                }
            }
            drop(PcArc::new_managed(NeedsThread("managed")).unwrap());
            Owner::new(NeedsThread("owned")).unwrap().kill();
            // A chain: each link's Drop releases the next one's only
            // PcArc, which the next flush finds (one link a flush).
            struct Link(Option<PcArc<Link>>, usize);
            impl Drop for Link {
                fn drop(&mut self) {
                    eprintln!("dropped link {}", self.1);
                }
            }
            let links: usize = std::env::var(CHILD).unwrap().parse().unwrap();
            let mut chain = PcArc::new_managed(Link(None, 0)).unwrap();
            for i in 1..links {
                chain = PcArc::new_managed(Link(Some(chain), i)).unwrap();
            }
            drop(chain);
            std::process::exit(0);
        }
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            // --nocapture: a value dropped on this test's thread prints
            // into libtest's capture, which exit() discards.  The owner's
            // is, when the callback thread finishes the kill's switch
            // before the kill's own put, which is then the last.
            .args(["--exact", "tests::exit_drops_on_library_threads", "--test-threads=1"])
            .arg("--nocapture")
            .env(CHILD, LINKS.to_string())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&child.stderr);
        assert!(child.status.success(), "child: {:?}\n{}", child.status, stderr);
        assert!(
            stderr.contains("dropped managed") && stderr.contains("dropped owned"),
            "child's stderr: {}",
            stderr
        );
        // Up to 0.3.19, four rounds of barrier and flush: four links.
        let links = stderr.lines().filter(|l| l.starts_with("dropped link ")).count();
        assert!(links == LINKS, "{} of the chain's {} links dropped:\n{}", links, LINKS, stderr);
    }

    /// At exit, a value whose `Drop` makes and drops another managed one
    /// (for ever) keeps every round of the exit's drops busy, each round a
    /// pass over 60,000 live managed values: no round starts after the
    /// first second, and the exit ends (status 0, within 60 s) with the
    /// last value leaked.  With no limit it never ends.
    #[test]
    fn exit_ends_when_each_drop_makes_another() {
        const CHILD: &str = "PERCPUREF_TEST_EXIT_REGROW_CHILD";

        if std::env::var_os(CHILD).is_some() {
            struct Regrows;
            impl Drop for Regrows {
                fn drop(&mut self) {
                    drop(PcArc::new_managed(Regrows).unwrap());
                }
            }
            let live: Vec<PcArc<u64>> =
                (0..60_000).map(|i| PcArc::new_managed(i).unwrap()).collect();
            std::mem::forget(live);
            drop(PcArc::new_managed(Regrows).unwrap());
            std::process::exit(0);
        }
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "tests::exit_ends_when_each_drop_makes_another"])
            .env(CHILD, "1")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                child.wait().unwrap();
                panic!("the child's exit did not end in 60 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert!(status.success(), "child: {:?}", status);
    }

    /// Runs the test @name alone in a child process of this binary, with
    /// @env set (the test's cue to do the work), and checks that the child
    /// ran it and it passed; returns the child's stderr.
    fn rerun_alone(name: &str, env: &str) -> String {
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture"])
            .env(env, "1")
            .output()
            .unwrap();
        let (stdout, stderr) =
            (String::from_utf8_lossy(&child.stdout), String::from_utf8_lossy(&child.stderr));
        assert!(
            child.status.success() && stdout.contains("1 passed"),
            "child: {:?}\n{}{}",
            child.status,
            stdout,
            stderr
        );
        stderr.into_owned()
    }

    /// A polling thread finishes its own kills: not before its poll, in
    /// it (the value dropped on this thread), and what is left when the
    /// registration goes is handed to the callback thread.  In a child
    /// process of its own: another test's `wait_for_releases` would take
    /// this thread's queue over.
    #[test]
    fn poll_registration_finishes_own_kills() {
        const CHILD: &str = "PERCPUREF_TEST_POLL_CHILD";

        if std::env::var_os(CHILD).is_none() {
            rerun_alone("tests::poll_registration_finishes_own_kills", CHILD);
            return;
        }

        static DROPPED_ON: std::sync::Mutex<Option<std::thread::ThreadId>> =
            std::sync::Mutex::new(None);
        static POLL_IN_DROP: std::sync::Mutex<Option<Result<usize, Error>>> =
            std::sync::Mutex::new(None);
        thread_local! {
            static REGISTRATION: std::cell::RefCell<Option<PollRegistration>> =
                std::cell::RefCell::new(None);
        }
        struct Polled {
            polls_in_drop: bool,
        }
        impl Drop for Polled {
            fn drop(&mut self) {
                *DROPPED_ON.lock().unwrap() = Some(std::thread::current().id());
                if self.polls_in_drop {
                    let ret = REGISTRATION.with(|r| r.borrow().as_ref().unwrap().poll());
                    *POLL_IN_DROP.lock().unwrap() = Some(ret);
                }
            }
        }
        let here = std::thread::current().id();

        REGISTRATION.with(|r| *r.borrow_mut() = Some(PollRegistration::new().unwrap()));
        assert_eq!(PollRegistration::new().err().map(Error::errno), Some(sys::EALREADY));
        Owner::new(Polled { polls_in_drop: false }).unwrap().kill();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(*DROPPED_ON.lock().unwrap(), None, "dropped before this thread polled");
        REGISTRATION.with(|r| r.borrow().as_ref().unwrap().drain()).unwrap();
        assert_eq!(*DROPPED_ON.lock().unwrap(), Some(here), "drain dropped it here");
        assert_eq!(REGISTRATION.with(|r| r.borrow().as_ref().unwrap().poll()), Ok(0));

        Owner::new(Polled { polls_in_drop: true }).unwrap().kill();
        REGISTRATION.with(|r| r.borrow().as_ref().unwrap().drain()).unwrap();
        assert_eq!(
            POLL_IN_DROP.lock().unwrap().take().map(|r| r.map_err(Error::errno)),
            Some(Err(sys::EDEADLK)),
            "a poll inside a Drop that a poll runs"
        );

        // drain() loops: a Drop that a poll runs kills another owner.
        static CHAIN_DROPS: AtomicUsize = AtomicUsize::new(0);
        // Held only to be dropped with the link (newer rustc warned that
        // a tuple field was never read).
        struct Link {
            _next: Option<Owner<Link>>,
        }
        impl Drop for Link {
            fn drop(&mut self) {
                CHAIN_DROPS.fetch_add(1, Ordering::SeqCst);
            }
        }
        let tail = Owner::new(Link { _next: None }).unwrap();
        Owner::new(Link { _next: Some(tail) }).unwrap().kill();
        REGISTRATION.with(|r| r.borrow().as_ref().unwrap().drain()).unwrap();
        assert_eq!(CHAIN_DROPS.load(Ordering::SeqCst), 2, "drain finishes the kills Drops make");

        *DROPPED_ON.lock().unwrap() = None;
        Owner::new(Polled { polls_in_drop: false }).unwrap().kill();
        REGISTRATION.with(|r| *r.borrow_mut() = None);
        wait_for_releases().unwrap();
        let on = DROPPED_ON.lock().unwrap().expect("the handed-over kill was not finished");
        assert_ne!(on, here, "dropping the registration hands its kills to the callback thread");
        // Unregistered: a new registration works.
        drop(PollRegistration::new().unwrap());
    }

    /// A registration kept in a thread_local is dropped after the C
    /// library's exit hook unregistered the thread: silently (it printed a
    /// false error at every such thread's exit), and the thread's kill is
    /// still handed over.
    #[test]
    fn thread_local_registration_at_thread_exit() {
        const CHILD: &str = "PERCPUREF_TEST_TLS_POLL_CHILD";

        if std::env::var_os(CHILD).is_none() {
            let stderr = rerun_alone("tests::thread_local_registration_at_thread_exit", CHILD);
            assert!(!stderr.contains("PollRegistration"), "child's stderr: {}", stderr);
            return;
        }
        thread_local! {
            static KEPT: std::cell::RefCell<Option<PollRegistration>> =
                std::cell::RefCell::new(None);
        }
        let (value, drops) = tracked();
        let owner = Owner::new(value).unwrap();
        std::thread::spawn(move || {
            KEPT.with(|k| *k.borrow_mut() = Some(PollRegistration::new().unwrap()));
            owner.kill();
        })
        .join()
        .unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while drops.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(drops.load(Ordering::SeqCst), 1, "the exited thread's kill was handed over");
    }

    /// Counts its drops.
    struct Tracked(Arc<AtomicUsize>);

    impl Drop for Tracked {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn tracked() -> (Tracked, Arc<AtomicUsize>) {
        let drops = Arc::new(AtomicUsize::new(0));
        (Tracked(drops.clone()), drops)
    }

    fn assert_send_sync<X: Send + Sync>() {}

    #[test]
    fn handles_are_send_and_sync() {
        assert_send_sync::<PcArc<Vec<u8>>>();
        assert_send_sync::<Owner<String>>();
    }

    #[test]
    fn owner_value_outlives_the_kill_until_the_last_pcarc() {
        let (value, drops) = tracked();
        let owner = Owner::new(value).unwrap();
        let a = owner.share();
        let b = a.clone();
        owner.kill();
        wait_for_releases().unwrap();
        assert!(PcArc::is_dying(&a));
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        drop(a);
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        drop(b);
        wait_for_releases().unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn threads_share_and_drop_exactly_once() {
        let (value, drops) = tracked();
        let owner = Owner::new(value).unwrap();
        let shared = owner.share();
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..100_000 {
                        let copy = shared.clone();
                        assert_eq!(copy.0.load(Ordering::SeqCst), 0);
                    }
                });
            }
        });
        owner.kill();
        drop(shared);
        wait_for_releases().unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn managed_value_goes_once_no_pcarc_is_left() {
        let (value, drops) = tracked();
        let first = PcArc::new_managed(value).unwrap();
        let second = first.clone();
        drop(first);
        flush_managed().unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), 0, "a PcArc still holds it");
        drop(second);
        flush_managed().unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    /// Set in the child process only: `--include-ignored` runs the leak
    /// in the test process itself otherwise, and it aborts.
    const LEAK_CHILD: &str = "PERCPUREF_RUST_LEAK_CHILD";

    /// Run by `leaked_clones_abort_before_the_count_wraps` in a child
    /// process: two threads forget clones; the guard must abort before
    /// twice the limit (the child exits 0 if it does not).  With
    /// `LEAK_CHILD=catch` each clone runs inside `catch_unwind`, and the
    /// parent points stderr at /dev/full: a guard that panics while it
    /// warns would be caught and never abort.
    #[test]
    #[ignore]
    fn leak_clones_past_the_limit() {
        let catch = match std::env::var(LEAK_CHILD) {
            Ok(mode) => mode == "catch",
            Err(_) => return,
        };
        let owner = Owner::new(0u64).unwrap();
        let shared = owner.share();
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..live::LIMIT {
                        if catch {
                            let _ = panic::catch_unwind(|| std::mem::forget(shared.clone()));
                        } else {
                            std::mem::forget(shared.clone());
                        }
                    }
                });
            }
        });
    }

    /// Runs the ignored test @name in a child process with `LEAK_CHILD`
    /// set to @mode, stderr captured or, with @stderr_full, /dev/full.
    fn run_child(name: &str, mode: &str, stderr_full: bool) -> std::process::Output {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child.args(["--ignored", "--exact", "--nocapture", name]).env(LEAK_CHILD, mode);
        if stderr_full {
            child.stderr(std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap());
        }
        child.output().unwrap()
    }

    fn aborted(status: std::process::ExitStatus) -> bool {
        use std::os::unix::process::ExitStatusExt;
        status.signal() == Some(6)
    }

    #[test]
    fn leaked_clones_abort_before_the_count_wraps() {
        let out = run_child("tests::leak_clones_past_the_limit", "1", false);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(aborted(out.status), "the leak was not aborted: {:?}", out.status);
        assert!(
            stderr.contains("past the limit") && stderr.contains("aborting"),
            "stderr: {}",
            stderr
        );
        let out = run_child("tests::leak_clones_past_the_limit", "catch", true);
        assert!(aborted(out.status), "stderr full, panics caught: {:?}", out.status);
    }

    /// A panic whose payload panics again when dropped.
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("the payload's drop panics too");
        }
    }
    struct Detonates;
    impl Drop for Detonates {
        fn drop(&mut self) {
            std::panic::panic_any(Bomb);
        }
    }

    /// Run by `a_panicking_drop_aborts` in a child process: the value's
    /// drop, run by the release callback under the C put, panics with a
    /// payload whose own drop panics.  Nothing may unwind into C: the
    /// child must abort (it exits 0 if the panic reached this frame).
    #[test]
    #[ignore]
    fn drop_panics_in_release() {
        if std::env::var_os(LEAK_CHILD).is_none() {
            return;
        }
        let owner = Owner::new(Detonates).unwrap();
        let last = owner.share();
        owner.kill();
        wait_for_releases().unwrap();
        let _ = panic::catch_unwind(AssertUnwindSafe(|| drop(last)));
    }

    #[test]
    fn a_panicking_drop_aborts() {
        let out = run_child("tests::drop_panics_in_release", "1", false);
        assert!(aborted(out.status), "the panic unwound: {:?}", out.status);
    }

    /// Run by `clones_on_many_threads_are_counted` in a child process:
    /// 80 threads each forget `CHECK_EVERY - 1` clones and wait, all
    /// alive, for the others, and then the child exits 0; the clones
    /// pass `LIMIT` (2^16 in the unit tests).  Up to 0.3.1 each thread
    /// handed its count in only at `CHECK_EVERY` or at its exit, so none
    /// was seen while they lived; 2^20 threads could so have wrapped a
    /// real count.
    #[test]
    #[ignore]
    fn forget_a_few_clones_on_many_threads() {
        if std::env::var_os(LEAK_CHILD).is_none() {
            return;
        }
        const THREADS: usize = 80;
        assert!(THREADS as i64 * (live::CHECK_EVERY - 1) > live::LIMIT);
        let owner = Owner::new(0u64).unwrap();
        let shared = owner.share();
        let all_made = std::sync::Barrier::new(THREADS);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    for _ in 0..live::CHECK_EVERY - 1 {
                        std::mem::forget(shared.clone());
                    }
                    // All alive: none has handed anything in at its exit.
                    if all_made.wait().is_leader() {
                        std::process::exit(0);
                    }
                    loop {
                        std::thread::park();
                    }
                });
            }
        });
    }

    #[test]
    fn clones_on_many_threads_are_counted() {
        let out = run_child("tests::forget_a_few_clones_on_many_threads", "1", false);
        assert!(aborted(out.status), "not aborted: {:?}", out.status);
        assert!(String::from_utf8_lossy(&out.stderr).contains("past the limit"));
    }

    #[test]
    fn live_handles_are_counted_across_threads() {
        // Made on one thread, dropped on another: what each hands in
        // balances, so many more than the limit may come and go (a bounded
        // channel: at most 1024 live at once).
        let owner = Owner::new(0u64).unwrap();
        let (tx, rx) = std::sync::mpsc::sync_channel(1024);
        let maker = owner.share();
        std::thread::scope(|s| {
            s.spawn(move || {
                for _ in 0..2 * live::LIMIT {
                    tx.send(maker.clone()).unwrap();
                }
            });
            s.spawn(move || rx.iter().for_each(drop));
        });
    }

    #[test]
    fn library_cpus_refuses_what_is_no_list() {
        for bad in ["", "x", "1-0", "0,", "8192", "0\u{0}1"] {
            assert_eq!(set_library_cpus(Some(bad)), Err(Error(sys::EINVAL)), "{:?}", bad);
        }
        assert_eq!(set_library_cpus(None), Ok(()));
    }

    #[test]
    fn error_reports_errno() {
        let e = Error(sys::EDEADLK);
        assert_eq!(e.errno(), sys::EDEADLK);
        assert!(e.to_string().starts_with("percpuref: "));
    }
}
