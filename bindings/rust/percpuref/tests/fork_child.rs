// SPDX-License-Identifier: MIT
//! A fork child does not drop the parent's values: the C library finishes
//! the kills still queued at a fork in the child too, and a child of
//! `std::process::Command` (which forks where it cannot spawn) ran the
//! `Drop` of the parent's values between its fork and its exec: a side
//! effect done twice.  Here the child drops the last `PcArc` of a killed
//! owner's value made before the fork: its copy is leaked, while the
//! parent's is dropped; a value the child makes itself is dropped there.
//!
//! A test binary of its own, one test: the child runs Rust code after the
//! fork, which is sound only where the forking thread is the only one that
//! matters (libtest's main thread only waits).
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU32, Ordering};

use percpuref::{wait_for_releases, Owner};

/// Drops counted in this process.
static DROPS: AtomicU32 = AtomicU32::new(0);

struct Counted;

impl Drop for Counted {
    fn drop(&mut self) {
        DROPS.fetch_add(1, Ordering::Relaxed);
    }
}

extern "C" {
    fn fork() -> c_int;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    fn _exit(status: c_int) -> !;
}

#[test]
fn fork_child_leaks_the_parents_values() {
    let owner = Owner::new(Counted).unwrap();
    let handle = owner.share();
    owner.kill();
    wait_for_releases().unwrap(); // switched: the last put releases it
    assert_eq!(DROPS.load(Ordering::Relaxed), 0);

    // SAFETY: the child runs only this thread's code and exits with
    // _exit(); nothing it calls needs another thread of the parent.
    let pid = unsafe { fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        drop(handle); // the last reference, in the child: leaked
        let inherited = DROPS.load(Ordering::Relaxed);
        let own = Owner::new(Counted).unwrap();
        own.kill(); // no PcArc: released, here or on the callback thread
        let waited = wait_for_releases().is_ok();
        let after = DROPS.load(Ordering::Relaxed);
        let ok = waited && inherited == 0 && after == 1;
        // SAFETY: ends the child without running the parent's handlers.
        unsafe { _exit(if ok { 0 } else { 1 + inherited as c_int }) };
    }
    let mut status: c_int = 0;
    // SAFETY: pid is our child; status is a valid out-pointer.
    assert_eq!(unsafe { waitpid(pid, &mut status, 0) }, pid);
    assert_eq!(status, 0, "the child dropped the parent's value, or not its own");
    drop(handle); // the parent's: dropped
    assert_eq!(DROPS.load(Ordering::Relaxed), 1);
}
