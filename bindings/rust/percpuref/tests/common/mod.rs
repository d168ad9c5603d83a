// SPDX-License-Identifier: MIT
//! What the fork tests share (tests/fork_child.rs, tests/fork_pid_namespace.rs):
//! a value that counts its drops in this process, and the libc calls.
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU32, Ordering};

/// Drops counted in this process (a fork child starts with its parent's).
pub static DROPS: AtomicU32 = AtomicU32::new(0);

pub fn drops() -> u32 {
    DROPS.load(Ordering::Relaxed)
}

pub struct Counted;

impl Drop for Counted {
    fn drop(&mut self) {
        DROPS.fetch_add(1, Ordering::Relaxed);
    }
}

extern "C" {
    pub fn fork() -> c_int;
    pub fn _exit(status: c_int) -> !;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
}

/// Waits for the child @pid: its raw wait status, -1 if it is not ours.
pub fn wait(pid: c_int) -> c_int {
    let mut status: c_int = 0;
    // SAFETY: status is a valid out-pointer.
    if unsafe { waitpid(pid, &mut status, 0) } != pid {
        return -1;
    }
    status
}
