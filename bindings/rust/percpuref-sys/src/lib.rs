// SPDX-License-Identifier: MIT
//! Raw declarations of the percpuref C library (`include/percpuref/`),
//! built from its sources by this crate's build script.  Everything here
//! is `unsafe` and follows the C contract (docs/percpu_ref.md,
//! docs/managed.md); the `percpuref` crate is the safe layer.
//!
//! The header-only fast paths (`percpu_ref_get`, `_put`, `_tryget`, ...)
//! are `static inline` in C; they are reached through `percpuref_sys_*`
//! wrappers compiled from `src/shim.c`.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_uint, c_ulong, c_void};

/// `struct percpu_ref`: the per-CPU counter pointer (with the mode flags in
/// its low bits) and the shared data.  Must not move once initialised.
#[repr(C)]
pub struct percpu_ref {
    pub percpu_count_ptr: usize,
    pub data: *mut c_void,
}

/// `percpu_ref_func_t *`: release and confirm callbacks.
pub type percpu_ref_func_t = unsafe extern "C" fn(*mut percpu_ref);

/// Start (and stay) atomic; also allows a later switch to managed mode.
pub const PERCPU_REF_INIT_ATOMIC: c_uint = 1 << 0;
/// Start dead, count 0.
pub const PERCPU_REF_INIT_DEAD: c_uint = 1 << 1;
/// May switch back to per-CPU mode after a kill.
pub const PERCPU_REF_ALLOW_REINIT: c_uint = 1 << 2;
/// `percpu_ref_poll()`: wait for the oldest switch when none can be finished.
pub const PERCPU_REF_POLL_WAIT: c_uint = 1;
// Errno values that the safe layer and its tests tell apart, as Linux's
// <errno.h> numbers them on x86 and Arm (some architectures number them
// otherwise: build.rs compares every constant here with the C headers'
// and <errno.h>'s, and a build for such an architecture fails there).
/// `percpu_ref_poll_unregister()`: the thread is not registered.
pub const EPERM: c_int = 1;
/// `percpu_ref_poll_register()`: the thread is registered already.
pub const EALREADY: c_int = 114;
/// Refused inside a callback the library runs (a wait, a poll).
pub const EDEADLK: c_int = 35;
/// `percpuref_set_library_cpus()`: not a list of CPUs, or none usable.
pub const EINVAL: c_int = 22;

extern "C" {
    pub fn percpu_ref_init(r: *mut percpu_ref, release: Option<percpu_ref_func_t>, flags: c_uint) -> c_int;
    pub fn percpu_ref_exit(r: *mut percpu_ref);
    pub fn percpu_ref_kill_and_confirm(r: *mut percpu_ref, confirm: Option<percpu_ref_func_t>);
    pub fn percpu_ref_switch_to_managed(r: *mut percpu_ref) -> c_int;
    pub fn percpu_ref_switch_to_unmanaged(r: *mut percpu_ref) -> c_int;
    pub fn percpu_ref_is_zero(r: *mut percpu_ref) -> bool;
    pub fn percpu_ref_barrier() -> c_int;
    pub fn percpu_ref_managed_flush() -> c_int;
    pub fn percpu_ref_poll_register() -> c_int;
    pub fn percpu_ref_poll(flags: c_uint) -> c_int;
    pub fn percpu_ref_poll_unregister() -> c_int;
    pub fn percpuref_shutdown();
    pub fn percpuref_set_library_cpus(cpus: *const c_char) -> c_int;
    pub fn percpuref_prepare_unload();
    /// Also sets the library up (and so registers its exit handler).
    pub fn percpuref_fast_path() -> *const c_char;
    /// How a switch's fences reach the fast path (C 0.4.26).
    pub fn percpuref_fence_method() -> *const c_char;
    /// Forks since the library was loaded, counted in each child before
    /// its library threads start.
    pub fn percpuref_fork_generation() -> c_ulong;

    pub fn percpuref_sys_get(r: *mut percpu_ref);
    pub fn percpuref_sys_tryget(r: *mut percpu_ref) -> bool;
    pub fn percpuref_sys_tryget_live(r: *mut percpu_ref) -> bool;
    pub fn percpuref_sys_put(r: *mut percpu_ref);
    pub fn percpuref_sys_kill(r: *mut percpu_ref);
    pub fn percpuref_sys_is_dying(r: *mut percpu_ref) -> bool;
    /// The C layout of `percpu_ref`, the init flags, the poll flag and the
    /// errno values above (for the test below).
    pub fn percpuref_sys_abi(out: *mut usize);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static RELEASED: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn release(_: *mut percpu_ref) {
        RELEASED.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn layout_flags_and_errno_match_the_headers() {
        let mut c = [0usize; 12];
        let r = std::mem::MaybeUninit::<percpu_ref>::uninit();
        let base = r.as_ptr() as usize;
        // SAFETY: only field addresses are taken; nothing is read.
        let (count_ptr, data) = unsafe {
            (
                std::ptr::addr_of!((*r.as_ptr()).percpu_count_ptr) as usize - base,
                std::ptr::addr_of!((*r.as_ptr()).data) as usize - base,
            )
        };
        unsafe { percpuref_sys_abi(c.as_mut_ptr()) };
        let rust = [
            std::mem::size_of::<percpu_ref>(),
            std::mem::align_of::<percpu_ref>(),
            count_ptr,
            data,
            PERCPU_REF_INIT_ATOMIC as usize,
            PERCPU_REF_INIT_DEAD as usize,
            PERCPU_REF_ALLOW_REINIT as usize,
            PERCPU_REF_POLL_WAIT as usize,
            EPERM as usize,
            EALREADY as usize,
            EDEADLK as usize,
            EINVAL as usize,
        ];
        assert_eq!(c, rust, "C (size, align, offsets, flags, errno values) against this crate");
    }

    #[test]
    fn init_get_put_kill_release() {
        let mut r = percpu_ref { percpu_count_ptr: 0, data: std::ptr::null_mut() };
        unsafe {
            assert_eq!(percpu_ref_init(&mut r, Some(release), 0), 0);
            percpuref_sys_get(&mut r);
            percpuref_sys_put(&mut r);
            assert!(!percpuref_sys_is_dying(&mut r));
            percpuref_sys_kill(&mut r);
            assert!(percpuref_sys_is_dying(&mut r));
            assert_eq!(percpu_ref_barrier(), 0);
            assert_eq!(RELEASED.load(Ordering::SeqCst), 1);
            assert!(percpu_ref_is_zero(&mut r));
            percpu_ref_exit(&mut r);
        }
    }
}
