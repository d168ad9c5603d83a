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
mod common;

use std::os::raw::c_int;

use common::{_exit, drops, fork, wait, Counted};
use percpuref::{wait_for_releases, Owner};

#[test]
fn fork_child_leaks_the_parents_values() {
    let owner = Owner::new(Counted).unwrap();
    let handle = owner.share();
    owner.kill();
    wait_for_releases().unwrap(); // switched: the last put releases it
    assert_eq!(drops(), 0);

    // SAFETY: the child runs only this thread's code and exits with
    // _exit(); nothing it calls needs another thread of the parent.
    let pid = unsafe { fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        drop(handle); // the last reference, in the child: leaked
        let inherited = drops();
        let own = Owner::new(Counted).unwrap();
        own.kill(); // no PcArc: released, here or on the callback thread
        let waited = wait_for_releases().is_ok();
        let after = drops();
        let ok = waited && inherited == 0 && after == 1;
        // SAFETY: ends the child without running the parent's handlers.
        unsafe { _exit(if ok { 0 } else { 1 + inherited as c_int }) };
    }
    assert_eq!(wait(pid), 0, "the child dropped the parent's value, or not its own");
    drop(handle); // the parent's: dropped
    assert_eq!(drops(), 1);
}
