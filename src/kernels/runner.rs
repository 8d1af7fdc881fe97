//! One kernel, one dispatch, on any backend: what the per-kernel tests (`tests/kernels.rs`,
//! after llama.cpp's test-backend-ops) run their case table through.
//!
//! A case of that table (`tests/kernel_cases/`) is backend-neutral: the storage buffers' initial
//! bytes in binding order, the params struct as bytes, the [`Step`] uniform and the workgroup
//! grid, all as this module's contracts define them ([`Kernel::bindings`], [`super::params`],
//! [`super::shape`]), and the CPU reference's expected outputs. A backend joins the tests by
//! implementing [`KernelRunner`] and adding one line to `runners()` in `tests/kernels.rs`: every
//! case then runs on it too and prints its own repro line, `… seed=123456 [metal]: y NMSE
//! 1.2e-14 <= 1e-9 OK`, and the tests that compare two forms of a kernel bitwise compare them on
//! it.
//!
//! What [`KernelRunner::run`] must do, as the backend's program records the kernel:
//! - compile `kernel` (a [`Kernel`] names its form and compile-time tile) with the tuning the
//!   runner was opened with (subgroups, runtime checks: `KESTREL_TUNING` in the tests);
//! - bind `buffers` to the kernel's storage bindings in order (the non-uniform entries of
//!   [`Kernel::bindings`]), each a fresh device buffer holding those bytes (a length that is no
//!   multiple of 4 padded on the device); a wrong count is the error [`check_buffers`] returns;
//! - bind `params` as the params uniform and `step` as the Step uniform, each zero-padded to a
//!   multiple of 16 bytes; a kernel with a second params block (a third uniform in its bindings:
//!   the fused-norm mat-vecs' `NormPro`, the q-norm attention's `QNormParams`) takes both in
//!   `params`, the first padded to [`PARAMS2_AT`] bytes, then the second;
//! - dispatch `grid` workgroups once (a zero count dispatches nothing, as in the real program);
//! - return every storage buffer's contents after the dispatch, in order, each as long as given.
//!
//! Invalid work (a grid over the device's limits, a buffer over its binding size) comes back as
//! an error naming the kernel, not a panic. The outputs are then checked by the tests, not here:
//! each starts poisoned (a NaN pattern) and is followed by a guard region, so a backend that
//! reads or writes out of bounds, or leaves an output unwritten, fails its cases.

use super::{Bind, DeviceLimits, Kernel, Step};
use crate::error::{Error, Result};

/// Where a kernel's second params block starts in [`KernelRunner::run`]'s `params`.
pub const PARAMS2_AT: usize = 256;

/// A backend that runs one kernel alone on given buffers (see the module doc for the contract).
pub trait KernelRunner {
    /// The backend's name in repro lines: `wgpu`, `metal`.
    fn backend(&self) -> &str;

    /// The device in words (printed before the cases).
    fn describe(&self) -> String;

    /// What the shape rules need to know of the device ([`super::shape`]): the tests pick
    /// forms with it as the backend's program does.
    fn limits(&self) -> DeviceLimits;

    /// Whether the tensor-core kernels (f16 cooperative matrices: `QmmCoop`, `QmmCoopMoe`,
    /// `QmmCoopGlu`, `AttentionCoop`) can run here; their tests fail where they cannot.
    fn coop_f16(&self) -> bool;

    /// Whether this backend has `kernel` at all. A backend may join the tests before it has
    /// every kernel: the cases of the others print as skipped and are counted apart, never as
    /// passed. The wgpu backend has them all.
    fn supports(&self, _kernel: Kernel) -> bool {
        true
    }

    /// Runs `kernel` once on `buffers` (the storage bindings' initial contents, in binding
    /// order) with `params`, `step` and `grid`; returns every storage buffer's final contents.
    fn run(
        &mut self,
        kernel: Kernel,
        buffers: &[Vec<u8>],
        params: &[u8],
        step: Step,
        grid: (u32, u32, u32),
    ) -> Result<Vec<Vec<u8>>>;

    /// [`run`](Self::run) with `reps` dispatches in a row, each finding what the one before
    /// left (for kernels that carry state across dispatches, such as the last-workgroup probe's
    /// generation). The default runs them one at a time; a backend may record them in one pass.
    fn run_n(
        &mut self,
        kernel: Kernel,
        buffers: &[Vec<u8>],
        params: &[u8],
        step: Step,
        grid: (u32, u32, u32),
        reps: u32,
    ) -> Result<Vec<Vec<u8>>> {
        let mut out = buffers.to_vec();
        for _ in 0..reps {
            out = self.run(kernel, &out, params, step, grid)?;
        }
        Ok(out)
    }
}

/// Number of storage bindings `kernel` takes: the `buffers` [`KernelRunner::run`] expects.
pub fn storage_bindings(kernel: Kernel) -> usize {
    kernel.bindings().iter().filter(|b| **b != Bind::Uniform).count()
}

/// The error every runner returns unless `buffers` has one entry per storage binding of
/// `kernel`: "gelu_mul takes 2 storage buffers, got 1".
pub fn check_buffers(kernel: Kernel, buffers: &[Vec<u8>]) -> Result<()> {
    let want = storage_bindings(kernel);
    if buffers.len() != want {
        return Err(Error::Invalid(format!("{} takes {want} storage buffers, got {}", kernel.label(), buffers.len())));
    }
    Ok(())
}
