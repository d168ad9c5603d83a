// SPDX-License-Identifier: MIT
//! A fork child in a PID namespace of its own does not drop its parent's
//! values either, even where both see the same process ID: a process that
//! is PID 1 of its namespace (as in a container) forks a child into a new
//! namespace, where it is PID 1 too.  The bindings tell the child by the C
//! library's fork generation, where getpid() is equal (and equal again
//! after PID reuse); they compare the ID too, which tells the children of
//! forks that run no atfork handler.
//!
//! Needs unshare(CLONE_NEWPID), that is root or CAP_SYS_ADMIN: without it
//! the test says so and passes.  A binary of its own, one test.
mod common;

use std::os::raw::c_int;

use common::{_exit, drops, fork, wait, Counted};
use percpuref::{wait_for_releases, Owner};

const CLONE_NEWPID: c_int = 0x2000_0000;

extern "C" {
    fn getpid() -> c_int;
    fn unshare(flags: c_int) -> c_int;
}

/// Forks a child into a new PID namespace; None if the namespace is
/// refused (a fork that fails is a test failure).
fn fork_into_new_pid_namespace() -> Option<c_int> {
    // SAFETY: no memory is involved; the child runs only this thread.
    unsafe {
        if unshare(CLONE_NEWPID) != 0 {
            return None;
        }
        let pid = fork();
        assert!(pid >= 0, "fork failed");
        Some(pid)
    }
}

/// PID 1 of a namespace: makes a value, forks a child that is PID 1 of
/// the next namespace and drops the last reference there, then drops its
/// own.  Exit status 0 when only its own drop ran (6: the second
/// namespace refused where the first was not).
fn first_namespace() -> c_int {
    let owner = Owner::new(Counted).unwrap();
    let handle = owner.share();
    owner.kill();
    if wait_for_releases().is_err() {
        return 2;
    }
    // SAFETY: no precondition.
    let me = unsafe { getpid() };
    let child = match fork_into_new_pid_namespace() {
        Some(pid) => pid,
        None => return 6,
    };
    if child == 0 {
        // SAFETY: no precondition.
        let same_pid = unsafe { getpid() } == me;
        drop(handle); // the parent's value: leaked here
        let ok = same_pid && drops() == 0;
        // SAFETY: ends the child without running the parent's handlers.
        unsafe { _exit(if ok { 0 } else { 3 }) };
    }
    if wait(child) != 0 {
        return 4;
    }
    drop(handle);
    if drops() == 1 {
        0
    } else {
        5
    }
}

#[test]
fn pid_namespace_child_leaks_the_parents_values() {
    let first = match fork_into_new_pid_namespace() {
        Some(pid) => pid,
        None => {
            eprintln!("skipped: unshare(CLONE_NEWPID) refused (not root)");
            return;
        }
    };
    if first == 0 {
        let status = first_namespace();
        // SAFETY: ends the child without running the parent's handlers.
        unsafe { _exit(status) };
    }
    let status = wait(first);
    assert_eq!(status, 0, "raw wait status {status:#x}: 0x300 the grandchild dropped the value");
}
