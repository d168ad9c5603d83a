// SPDX-License-Identifier: MIT
//! At exit, where the library's threads cannot start (a sandbox that
//! refuses new threads, a full `pids` cgroup): values released only at the
//! exit are left alive, where up to 0.3.1 the C library's barrier dropped
//! them on the exiting thread, whose thread-locals `exit` had destroyed,
//! and a `Drop` calling `std::thread::current()` panicked and aborted the
//! process.  Values the program had the barrier and the flush release
//! before the exit are dropped, on its thread.
//!
//! A test binary of its own: it replaces `pthread_create` for the whole
//! process, refusing (EAGAIN) the threads the library starts, which it
//! creates with every asynchronous signal blocked (the C library's
//! src/runtime.c, "Signal masks"); Rust's threads and libtest's are made.
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use percpuref::{flush_managed, wait_for_releases, Owner, PcArc};

/// Set by the child only: this binary's other runs create threads freely.
static REFUSE: AtomicBool = AtomicBool::new(false);
static REFUSED: AtomicUsize = AtomicUsize::new(0);

/// glibc's and musl's sigset_t on Linux: 1024 bits.
type SigSet = [u64; 16];
type CreateFn = unsafe extern "C" fn(*mut usize, *const c_void, *mut c_void, *mut c_void) -> c_int;

extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn pthread_sigmask(how: c_int, set: *const SigSet, old: *mut SigSet) -> c_int;
}

const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;
const SIG_BLOCK: c_int = 0;
const EAGAIN: c_int = 11;
/// SIGHUP, SIGINT, SIGUSR1, SIGUSR2, SIGALRM, SIGTERM (x86-64, aarch64).
const ASYNC_SIGNALS: [usize; 6] = [1, 2, 10, 12, 14, 15];

/// # Safety
/// pthread_create()'s contract.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut usize,
    attr: *const c_void,
    start: *mut c_void,
    arg: *mut c_void,
) -> c_int {
    // Relaxed: set before the child's first value, on the same thread.
    if REFUSE.load(Ordering::Relaxed) {
        let mut mask: SigSet = [0; 16];
        if pthread_sigmask(SIG_BLOCK, std::ptr::null(), &mut mask) == 0
            && ASYNC_SIGNALS.iter().all(|&sig| mask[(sig - 1) / 64] & (1 << ((sig - 1) % 64)) != 0)
        {
            REFUSED.fetch_add(1, Ordering::Relaxed);
            return EAGAIN;
        }
    }
    let real = dlsym(RTLD_NEXT, b"pthread_create\0".as_ptr() as *const c_char);
    if real.is_null() {
        return EAGAIN;
    }
    let real: CreateFn = std::mem::transmute(real);
    real(thread, attr, start, arg)
}

struct NeedsThread(&'static str);

impl Drop for NeedsThread {
    fn drop(&mut self) {
        let _ = std::thread::current();
        eprintln!("dropped {}", self.0);
    }
}

#[test]
fn exit_leaves_alive_what_no_library_thread_could_drop() {
    const CHILD: &str = "PERCPUREF_TEST_EXIT_NO_THREADS_CHILD";

    if std::env::var_os(CHILD).is_some() {
        REFUSE.store(true, Ordering::Relaxed);
        // Released before the exit, by the barrier and the flush, which
        // run the library's work on this thread while no thread starts.
        drop(PcArc::new_managed(NeedsThread("managed, flushed")).unwrap());
        Owner::new(NeedsThread("owned, waited for")).unwrap().kill();
        wait_for_releases().unwrap();
        flush_managed().unwrap();
        // Released only at the exit.
        drop(PcArc::new_managed(NeedsThread("managed, at exit")).unwrap());
        let owner = Owner::new(NeedsThread("owned, at exit")).unwrap();
        let handle = owner.share();
        owner.kill();
        drop(handle);
        eprintln!("library threads refused: {}", REFUSED.load(Ordering::Relaxed));
        std::process::exit(0);
    }
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "exit_leaves_alive_what_no_library_thread_could_drop"])
        .args(["--test-threads=1", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(child.status.success(), "child: {:?}\n{}", child.status, stderr);
    assert!(!stderr.contains("library threads refused: 0"), "nothing refused:\n{}", stderr);
    assert!(
        stderr.contains("dropped managed, flushed") && stderr.contains("dropped owned, waited for"),
        "the values released before the exit were not dropped:\n{}",
        stderr
    );
    assert!(
        !stderr.contains("at exit"),
        "a value released at the exit was dropped on the exiting thread:\n{}",
        stderr
    );
}
