//! One kernel, one dispatch, outside any model: the wgpu backend's [`KernelRunner`], which the
//! per-kernel differential tests (`tests/kernels.rs`, after llama.cpp's test-backend-ops) run
//! their case table through, and the timer of the single-kernel benchmarks (`benches/kernels.rs`).
//!
//! The harness knows nothing about what a kernel computes. The caller supplies what
//! `Builder::record` (mod.rs) would bind: the storage buffers in binding order (see the kernel's
//! WGSL header and [`Kernel::bindings`]), the params struct as bytes (the `*Params` mirrors in
//! [`crate::kernels::params`], e.g. `bytemuck::bytes_of(&MatmulParams { .. })`), the [`Step`]
//! uniform and the workgroup grid (the same formula the real program uses). Every storage buffer
//! is uploaded fresh, the kernel runs once in its own compute pass, and every storage buffer is
//! read back, so a test can check both the outputs and that nothing else was written.
//!
//! Running is the backend-neutral [`KernelRunner`] contract; timing ([`KernelHarness::time`] and
//! its cold, packed and chain forms) stays here, wgpu's own: it rests on timestamps inside a
//! compute pass, the L2 and the SM clock of the device under it, and no other backend can time a
//! kernel yet (the planned Metal backend is to be tested on the CPU through an MSL emulator,
//! where a time means nothing). The benches build their rows from the same case table and time
//! them here.

use wgpu::util::DeviceExt;

use super::context::Gpu;
use super::pipelines::Pipelines;
use crate::error::{Error, Result};
use crate::kernels::runner::{check_buffers, storage_bindings};
use crate::kernels::{Bind, CopyParams, DeviceLimits, Kernel, KernelRunner, Step, Tuning};

pub use crate::kernels::runner::PARAMS2_AT;

/// Untimed work before each timed kernel (see `KernelHarness::time`).
const WARM_UP: std::time::Duration = std::time::Duration::from_millis(100);

/// Untimed copies before the roofline is timed: long enough for the H200's clock to reach its
/// boost from rest (it took two kbench processes' worth of work, a few seconds: ledger:
/// 2026-11-30 clock-ramp).
const CLOCK_RAMP: std::time::Duration = std::time::Duration::from_secs(4);

/// A saturating copy before each timed pass: long enough to lift the SM clock to its boost. The
/// H200's governor drops the clock within ≈ 0.5 s of light load (the host uploading a kernel's
/// buffers) and raises it again only slowly under a chain of small dispatches, which read a
/// third to half lower at 600–1300 MHz than at 1980 (nvidia-smi every 50 ms beside kbench,
/// ledger: 2026-12-02 kbench-clock-burst); under a saturating load it reaches 1980 within 0.1 s.
const CLOCK_BURST: std::time::Duration = std::time::Duration::from_millis(40);

/// Bytes each buffer of the clock burst's copy holds.
const CLOCK_BURST_BYTES: u64 = 64 << 20;

/// A device plus the pipeline cache, for launching single kernels.
pub struct KernelHarness {
    gpu: Gpu,
    pipelines: Pipelines,
    /// The copy that keeps the clock up before a timed pass (made on first use).
    burst: Option<Bound>,
}

impl KernelHarness {
    /// Opens the default adapter (as [`Gpu::new`], no binding cap); kernels compile as `tuning`
    /// asks (subgroups, shader checks). Fails with the "no GPU adapter found" error where there
    /// is none.
    pub fn new(tuning: &Tuning) -> Result<Self> {
        Ok(Self::with_gpu(Gpu::new(None)?, tuning))
    }

    /// A harness on a device the caller already opened.
    pub fn with_gpu(gpu: Gpu, tuning: &Tuning) -> Self {
        let pipelines = Pipelines::new(&gpu, tuning);
        KernelHarness { gpu, pipelines, burst: None }
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Number of storage bindings `kernel` takes (the `buffers` [`run`](Self::run) expects).
    pub fn storage_bindings(kernel: Kernel) -> usize {
        storage_bindings(kernel)
    }

    /// Runs `kernel` once: `buffers` are the storage bindings in binding order (their initial
    /// contents; lengths are padded to a multiple of 4 on the GPU), `params` the kernel's params
    /// struct bytes, `step` the Step uniform, `grid` the workgroup counts (a zero count dispatches
    /// nothing, as in the real program). Returns the final contents of every storage buffer, in
    /// the same order and with the same lengths as `buffers`. Validation errors (wrong binding
    /// count or size, a grid over the device limit) come back as `Error::Gpu` naming the kernel.
    /// `params` of a kernel with two params blocks: the first padded to [`PARAMS2_AT`] bytes,
    /// then the second.
    pub fn run(
        &mut self,
        kernel: Kernel,
        buffers: &[Vec<u8>],
        params: &[u8],
        step: Step,
        grid: (u32, u32, u32),
    ) -> Result<Vec<Vec<u8>>> {
        self.run_n(kernel, buffers, params, step, grid, 1)
    }

    /// [`run`](Self::run) with `reps` dispatches back to back in one pass before the readback:
    /// each finds what the previous one left (for kernels that carry state across dispatches,
    /// such as the last-workgroup probe's generation).
    pub fn run_n(
        &mut self,
        kernel: Kernel,
        buffers: &[Vec<u8>],
        params: &[u8],
        step: Step,
        grid: (u32, u32, u32),
        reps: u32,
    ) -> Result<Vec<Vec<u8>>> {
        let label = kernel.label();
        let scope = self.gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let bound = self.bind(kernel, buffers, params, step)?;
        let lens: Vec<usize> = buffers.iter().map(Vec::len).collect();
        let record = |pass: &mut wgpu::ComputePass| {
            if grid.0 > 0 && grid.1 > 0 && grid.2 > 0 {
                pass.set_pipeline(&bound.pipeline);
                pass.set_bind_group(0, &bound.group, &[]);
                for _ in 0..reps {
                    pass.dispatch_workgroups(grid.0, grid.1, grid.2);
                }
            }
        };
        let submitted = || match pollster::block_on(scope.pop()) {
            Some(e) => Err(Error::Gpu(format!("{label} with grid {grid:?}: {e}"))),
            None => Ok(()),
        };
        let out = self.record_and_read(&label, &bound.storage, &lens, &vec![true; lens.len()], record, submitted)?;
        Ok(out.into_iter().map(|v| v.unwrap_or_default()).collect())
    }

    /// Records one compute pass with `record`, then copies out the storage buffers marked in
    /// `readback` and submits; `submitted` then says whether the work was valid (an error
    /// returns before any readback), and the marked buffers' contents come back cut to `lens`
    /// (`None` for the others).
    fn record_and_read(
        &self,
        label: &str,
        storage: &[wgpu::Buffer],
        lens: &[usize],
        readback: &[bool],
        record: impl FnOnce(&mut wgpu::ComputePass),
        submitted: impl FnOnce() -> Result<()>,
    ) -> Result<Vec<Option<Vec<u8>>>> {
        let gpu = &self.gpu;
        let staging: Vec<Option<wgpu::Buffer>> = storage
            .iter()
            .zip(readback)
            .enumerate()
            .map(|(i, (b, &r))| r.then(|| gpu.staging(&format!("{label} readback {i}"), b.size())))
            .collect();
        let mut enc = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) });
        {
            let mut pass =
                enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(label), timestamp_writes: None });
            record(&mut pass);
        }
        for (src, dst) in storage.iter().zip(&staging) {
            if let Some(dst) = dst {
                enc.copy_buffer_to_buffer(src, 0, dst, 0, Some(src.size()));
            }
        }
        gpu.queue.submit([enc.finish()]);
        submitted()?;
        let mut out = Vec::with_capacity(lens.len());
        for (&len, s) in lens.iter().zip(&staging) {
            out.push(match s {
                Some(s) => {
                    let mut v = Vec::new();
                    gpu.read(s, s.size(), &mut v)?;
                    v.truncate(len);
                    Some(v)
                }
                None => None,
            });
        }
        Ok(out)
    }

    /// GPU time of one dispatch of `kernel`, in µs: `reps` identical dispatches back to back in
    /// one compute pass (each waits for the previous one's writes, as in a decode step), timed
    /// by timestamps at the pass's ends, after `reps` untimed ones (caches as in a steady
    /// state); the best of three such passes, each right after a clock burst (`CLOCK_BURST`). Arguments as for [`run`](Self::run);
    /// nothing is read back.
    pub fn time(
        &mut self,
        kernel: Kernel,
        buffers: &[Vec<u8>],
        params: &[u8],
        step: Step,
        grid: (u32, u32, u32),
        reps: u32,
    ) -> Result<f64> {
        self.time_after(kernel, buffers, params, step, grid, reps, WARM_UP, 1)
    }

    /// [`time`](Self::time) with the buffers read from memory instead of the GPU's L2 cache, as a
    /// decode step reads each weight matrix once: the buffers are uploaded `copies` times and
    /// consecutive dispatches cycle through the copies (`copies` · the buffers' bytes should
    /// exceed the L2: 50 MB on the H200). [`time`](Self::time) re-reads one copy, which stays in
    /// L2 when it fits: on matrices of a few MB that understated a decode step's mat-vec times
    /// and misled the mat-vec shape rule's first fit (ledger: 2026-11-30 qmv-shape-rule,
    /// refitted in ledger: 2026-11-30 qmv-stage-x).
    #[allow(clippy::too_many_arguments)]
    pub fn time_cold(
        &mut self,
        kernel: Kernel,
        buffers: &[Vec<u8>],
        params: &[u8],
        step: Step,
        grid: (u32, u32, u32),
        reps: u32,
        copies: usize,
    ) -> Result<f64> {
        self.time_after(kernel, buffers, params, step, grid, reps, WARM_UP, copies)
    }

    /// [`time_cold`](Self::time_cold) with the copies laid out as a model's weights could be:
    /// every copy's read-only buffers back to back in one arena buffer (each range aligned to the
    /// device's storage offset alignment), bound as ranges of it, and the read-write buffers
    /// uploaded once and shared by every copy (so each dispatch waits for the one before, as in a
    /// decode step). Against `time_cold`, whose copies are separate buffers placed by wgpu's
    /// allocator, it says whether where the bytes live changes what one dispatch can read.
    /// `copies` is cut to what fits one buffer of the device's limit.
    #[allow(clippy::too_many_arguments)]
    pub fn time_packed(
        &mut self,
        kernel: Kernel,
        buffers: &[Vec<u8>],
        params: &[u8],
        step: Step,
        grid: (u32, u32, u32),
        reps: u32,
        copies: usize,
    ) -> Result<f64> {
        let label = kernel.label();
        self.timeable()?;
        check_buffers(kernel, buffers)?;
        let writable: Vec<bool> =
            kernel.bindings().iter().filter(|b| **b != Bind::Uniform).map(|b| *b == Bind::ReadWrite).collect();
        let align = u64::from(self.gpu.limits.min_storage_buffer_offset_alignment).max(4);
        let padded = |b: &Vec<u8>| (b.len().max(4) as u64).next_multiple_of(align);
        let per_copy: u64 = buffers.iter().zip(&writable).filter(|(_, w)| !**w).map(|(b, _)| padded(b)).sum();
        let limit = self.gpu.limits.max_buffer_size;
        let copies = (copies.max(1) as u64).min(limit / per_copy.max(1)).max(1) as usize;
        if per_copy * copies as u64 > limit {
            return Err(Error::Invalid(format!(
                "{label}: one copy of its read-only buffers ({per_copy} bytes) exceeds the buffer limit"
            )));
        }
        let dev = &self.gpu.device;
        let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
        let arena = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some(&format!("{label} packed copies")),
            size: per_copy * copies as u64,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: true,
        });
        // (offset, size) of each read-only binding of each copy. An early return drops `scope`,
        // which pops it (wgpu's ErrorScopeGuard).
        let mut ranges: Vec<Vec<(u64, u64)>> = Vec::with_capacity(copies);
        {
            let mut view = arena
                .slice(..)
                .get_mapped_range_mut()
                .map_err(|e| Error::Gpu(format!("{label}: mapping the arena: {e}")))?;
            let mut off = 0u64;
            for _ in 0..copies {
                let mut r = Vec::new();
                for (b, _) in buffers.iter().zip(&writable).filter(|(_, w)| !**w) {
                    view.slice(off as usize..off as usize + b.len()).copy_from_slice(b);
                    r.push((off, (b.len().max(4) as u64).next_multiple_of(4)));
                    off += padded(b);
                }
                ranges.push(r);
            }
        }
        arena.unmap();
        let shared: Vec<Option<wgpu::Buffer>> = buffers
            .iter()
            .zip(&writable)
            .enumerate()
            .map(|(i, (b, w))| w.then(|| self.gpu.upload(&format!("{label} binding {i}"), b)))
            .collect();
        let groups: Vec<(wgpu::ComputePipeline, wgpu::BindGroup)> = ranges
            .iter()
            .map(|r| {
                let mut ro = r.iter();
                let bindings: Vec<wgpu::BufferBinding> = shared
                    .iter()
                    .map(|s| match s {
                        Some(buf) => buf.as_entire_buffer_binding(),
                        None => {
                            let &(offset, size) = ro.next().expect("one range per read-only binding");
                            wgpu::BufferBinding { buffer: &arena, offset, size: std::num::NonZeroU64::new(size) }
                        }
                    })
                    .collect();
                self.group(kernel, &bindings, params, step)
            })
            .collect::<Result<_>>()?;
        let best = self.time_passes(&label, reps.max(1), WARM_UP, |pass, i| {
            let (pipeline, group) = &groups[i % groups.len()];
            if i == 0 {
                pass.set_pipeline(pipeline);
            }
            pass.set_bind_group(0, group, &[]);
            pass.dispatch_workgroups(grid.0, grid.1, grid.2);
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("{label} with grid {grid:?}, packed: {e}")));
        }
        best
    }

    /// An error unless this adapter can time kernels (timestamps inside a compute pass).
    fn timeable(&self) -> Result<()> {
        if self.gpu.can_profile() {
            Ok(())
        } else {
            Err(Error::Gpu("this adapter has no timestamp queries inside passes: kernels cannot be timed".into()))
        }
    }

    /// `time` after `warm` of untimed passes, cycling through `copies` uploads of the buffers.
    #[allow(clippy::too_many_arguments)]
    fn time_after(
        &mut self,
        kernel: Kernel,
        buffers: &[Vec<u8>],
        params: &[u8],
        step: Step,
        grid: (u32, u32, u32),
        reps: u32,
        warm: std::time::Duration,
        copies: usize,
    ) -> Result<f64> {
        let label = kernel.label();
        self.timeable()?;
        let reps = reps.max(1);
        let scope = self.gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let bound: Vec<Bound> =
            (0..copies.max(1)).map(|_| self.bind(kernel, buffers, params, step)).collect::<Result<_>>()?;
        let best = self.time_passes(&label, reps, warm, |pass, i| {
            if i == 0 {
                pass.set_pipeline(&bound[0].pipeline);
            }
            pass.set_bind_group(0, &bound[i % bound.len()].group, &[]);
            pass.dispatch_workgroups(grid.0, grid.1, grid.2);
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("{label} with grid {grid:?}: {e}")));
        }
        best
    }

    /// GPU time of what `record` records, in µs per repetition: each pass records `reps`
    /// untimed repetitions (`record(pass, i)` the i-th), then, when timed, `reps` more between
    /// two timestamps (the untimed ones fill the GPU first). Untimed passes for `warm` first,
    /// then the best of three timed ones.
    fn time_passes(
        &mut self,
        label: &str,
        reps: u32,
        warm: std::time::Duration,
        record: impl Fn(&mut wgpu::ComputePass, usize),
    ) -> Result<f64> {
        // A handle of its own (the device is shared): the passes below borrow it while
        // clock_up borrows the harness.
        let gpu = &self.gpu.clone();
        let dev = &gpu.device;
        let queries = dev.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("kernel timing"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        });
        let resolve = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kernel timing resolve"),
            size: 16,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let read = gpu.staging("kernel timing readback", 16);
        let pass = |timed: bool| -> Result<f64> {
            let mut enc = dev.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) });
            {
                let mut pass =
                    enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(label), timestamp_writes: None });
                for i in 0..reps as usize {
                    record(&mut pass, i);
                }
                if timed {
                    pass.write_timestamp(&queries, 0);
                    for i in 0..reps as usize {
                        record(&mut pass, i);
                    }
                    pass.write_timestamp(&queries, 1);
                }
            }
            if !timed {
                gpu.queue.submit([enc.finish()]);
                dev.poll(wgpu::PollType::wait_indefinitely())
                    .map_err(|e| Error::Gpu(format!("device poll failed: {e}")))?;
                return Ok(0.0);
            }
            enc.resolve_query_set(&queries, 0..2, &resolve, 0);
            enc.copy_buffer_to_buffer(&resolve, 0, &read, 0, Some(16));
            gpu.queue.submit([enc.finish()]);
            let mut bytes = Vec::new();
            gpu.read(&read, 16, &mut bytes)?;
            let t: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes);
            let ns = t[1].saturating_sub(t[0]) as f64 * gpu.queue.get_timestamp_period() as f64;
            Ok(ns / 1e3 / reps as f64)
        };
        // Warm-up: at rest the GPU runs at a low clock and ramps up over seconds of work (the
        // H200's SM clock read 345 MHz before a kbench process; three consecutive processes
        // measured the copy at 1.8, 2.6 and 4.0 TB/s as it rose, ledger: 2026-11-30 clock-ramp):
        // untimed passes for `warm` first.
        let t0 = std::time::Instant::now();
        pass(false)?;
        while t0.elapsed() < warm {
            pass(false)?;
        }
        // The best of three timed runs, each right after a clock burst: the minimum is what the
        // work can do at the clock a busy GPU runs at.
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            self.clock_up()?;
            best = best.min(pass(true)?);
        }
        Ok(best)
    }

    /// Copies for [`CLOCK_BURST`], each submitted and waited for: the SM clock at its boost for
    /// the timed pass that follows (see CLOCK_BURST).
    fn clock_up(&mut self) -> Result<()> {
        if self.burst.is_none() {
            let bytes = CLOCK_BURST_BYTES.min(self.gpu.max_binding) / 16 * 16;
            let p = CopyParams { n: (bytes / 16) as u32, _pad: [0; 3] };
            let buf = vec![0u8; bytes as usize];
            self.burst = Some(self.bind(Kernel::Copy, &[buf.clone(), buf], bytemuck::bytes_of(&p), Step::default())?);
        }
        let b = self.burst.as_ref().expect("made above");
        let t0 = std::time::Instant::now();
        while t0.elapsed() < CLOCK_BURST {
            let mut enc =
                self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("clock burst") });
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("clock burst"),
                    timestamp_writes: None,
                });
                pass.set_pipeline(&b.pipeline);
                pass.set_bind_group(0, &b.group, &[]);
                for _ in 0..4 {
                    pass.dispatch_workgroups(2048, 1, 1);
                }
            }
            self.gpu.queue.submit([enc.finish()]);
            self.gpu
                .device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Gpu(format!("device poll failed: {e}")))?;
        }
        Ok(())
    }

    /// Copy bandwidth of this device in GB/s (bytes read + bytes written per second) through
    /// the `copy` kernel on two 1 GiB buffers (or the largest binding), 20 copies per timed pass:
    /// the roofline benchmarks compare with. A slow device (software Vulkan, ~1 GB/s) keeps a
    /// one-copy figure instead of spending a minute on it.
    /// The first measurement of a process also brings the GPU to its working clock: the copy
    /// runs for `CLOCK_RAMP` (4 s) before it is timed (later kernels keep it there).
    pub fn copy_roofline(&mut self) -> Result<f64> {
        let quick = self.copy_bandwidth_kernel(1 << 30, 1, WARM_UP)?;
        if quick > 100.0 {
            self.copy_bandwidth_kernel(1 << 30, 20, CLOCK_RAMP)
        } else {
            Ok(quick)
        }
    }

    /// The `copy` kernel's bandwidth on `bytes`-sized buffers, `reps` copies per timed pass,
    /// after `warm` of untimed copies.
    fn copy_bandwidth_kernel(&mut self, bytes: u64, reps: u32, warm: std::time::Duration) -> Result<f64> {
        let bytes =
            bytes.min(self.gpu.limits.max_storage_buffer_binding_size.min(self.gpu.limits.max_buffer_size)) / 16 * 16;
        let buf = vec![0u8; bytes as usize];
        let p = CopyParams { n: (bytes / 16) as u32, _pad: [0; 3] };
        let us = self.time_after(
            Kernel::Copy,
            &[buf.clone(), buf],
            bytemuck::bytes_of(&p),
            Step::default(),
            (8192, 1, 1),
            reps,
            warm,
            1,
        )?;
        Ok(2.0 * bytes as f64 / us / 1e3)
    }

    /// Uploads `buffers` and the two uniforms, and binds them for `kernel`.
    fn bind(&mut self, kernel: Kernel, buffers: &[Vec<u8>], params: &[u8], step: Step) -> Result<Bound> {
        let storage = self.upload(kernel, buffers)?;
        let (pipeline, group) = self.group(kernel, &whole(&storage), params, step)?;
        Ok(Bound { pipeline, group, storage })
    }

    /// `buffers` uploaded as `kernel`'s storage bindings (their number checked).
    fn upload(&self, kernel: Kernel, buffers: &[Vec<u8>]) -> Result<Vec<wgpu::Buffer>> {
        check_buffers(kernel, buffers)?;
        let label = kernel.label();
        Ok(buffers.iter().enumerate().map(|(i, b)| self.gpu.upload(&format!("{label} binding {i}"), b)).collect())
    }

    /// `kernel`'s pipeline and a bind group of `storage` (whole buffers or ranges of one) with
    /// fresh uniforms of `params` and `step`.
    fn group(
        &mut self,
        kernel: Kernel,
        storage: &[wgpu::BufferBinding],
        params: &[u8],
        step: Step,
    ) -> Result<(wgpu::ComputePipeline, wgpu::BindGroup)> {
        let label = kernel.label();
        let (pipeline, layout) = self.pipelines.get(&self.gpu.device, kernel)?.clone();
        let dev = &self.gpu.device;
        let uniform = |what: &str, bytes: &[u8]| {
            // Uniform bindings are sized in 16-byte units; the WGSL structs already are.
            let mut v = bytes.to_vec();
            v.resize(bytes.len().max(16).next_multiple_of(16), 0);
            dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(&format!("{label} {what}")),
                contents: &v,
                usage: wgpu::BufferUsages::UNIFORM,
            })
        };
        // A kernel with a second params block (the fused-norm qmv's NormPro, bound last) takes
        // both in `params`: the first padded to PARAMS2_AT bytes, then the second.
        let second = kernel.bindings().iter().filter(|b| **b == Bind::Uniform).count() == 3;
        let (first, rest) = if second { params.split_at(PARAMS2_AT.min(params.len())) } else { (params, &[][..]) };
        let params_buf = uniform("params", first);
        let step_buf = uniform("step", bytemuck::bytes_of(&step));
        let params2_buf = uniform("params 2", rest);
        let mut storage_iter = storage.iter();
        let mut uniforms = [&params_buf, &step_buf, &params2_buf].into_iter();
        let entries: Vec<wgpu::BindGroupEntry> = kernel
            .bindings()
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let buf = match b {
                    Bind::Uniform => uniforms.next().map(|u| u.as_entire_buffer_binding()),
                    Bind::Read | Bind::ReadWrite => storage_iter.next().cloned(),
                };
                wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource: wgpu::BindingResource::Buffer(
                        buf.expect("bindings() lists storage first, then params and step"),
                    ),
                }
            })
            .collect();
        let group = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&label),
            layout: &layout,
            entries: &entries,
        });
        Ok((pipeline, group))
    }

    /// `buffers` uploaded once as `kernel`'s storage bindings, for [`run_chain`](Self::run_chain)
    /// and [`time_chain`](Self::time_chain) to run several chains over (a probe's weights can
    /// be gigabytes).
    pub fn upload_chain(&self, kernel: Kernel, buffers: &[Vec<u8>]) -> Result<Uploaded> {
        Ok(Uploaded { kernel, storage: self.upload(kernel, buffers)?, lens: buffers.iter().map(Vec::len).collect() })
    }

    /// Overwrites storage binding `binding` of `up` from its start with `bytes` (ordered before
    /// the next chain run over it).
    pub fn rewrite(&self, up: &Uploaded, binding: usize, bytes: &[u8]) {
        self.gpu.queue.write_buffer(&up.storage[binding], 0, bytes);
    }

    /// A chain of dispatches of one kernel over `up`'s storage buffers, each dispatch with its
    /// own params and grid (`links`), in one pass and in order (wgpu's barriers between them,
    /// as between a decode step's dependent dispatches). Returns the read-write bindings'
    /// contents after the chain, in binding order, with an empty vector for each read-only one
    /// (the kernel cannot write those). The buffers keep what the chain left.
    pub fn run_chain(&mut self, up: &Uploaded, links: &[Link], step: Step) -> Result<Vec<Vec<u8>>> {
        let kernel = up.kernel;
        let label = kernel.label();
        let scope = self.gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let groups: Vec<_> =
            links.iter().map(|(p, _)| self.group(kernel, &whole(&up.storage), p, step)).collect::<Result<_>>()?;
        let writable: Vec<bool> =
            kernel.bindings().iter().filter(|b| **b != Bind::Uniform).map(|b| *b == Bind::ReadWrite).collect();
        let submitted = || match pollster::block_on(scope.pop()) {
            Some(e) => Err(Error::Gpu(format!("{label} chain of {} dispatches: {e}", links.len()))),
            None => Ok(()),
        };
        let out = self.record_and_read(
            &label,
            &up.storage,
            &up.lens,
            &writable,
            |pass| record_chain(pass, &groups, links),
            submitted,
        )?;
        Ok(out.into_iter().map(|v| v.unwrap_or_default()).collect())
    }

    /// GPU time of [`run_chain`](Self::run_chain)'s chain, in µs for the whole chain: `reps`
    /// chains between two timestamps after `reps` untimed ones in the same pass, after untimed
    /// passes for `WARM_UP` (100 ms); the best of three (as [`time`](Self::time)). Nothing is read back.
    pub fn time_chain(&mut self, up: &Uploaded, links: &[Link], step: Step, reps: u32) -> Result<f64> {
        let kernel = up.kernel;
        let label = kernel.label();
        self.timeable()?;
        let reps = reps.max(1);
        let scope = self.gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let groups: Vec<_> =
            links.iter().map(|(p, _)| self.group(kernel, &whole(&up.storage), p, step)).collect::<Result<_>>()?;
        let best = self.time_passes(&label, reps, WARM_UP, |pass, _| record_chain(pass, &groups, links));
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("{label} chain of {} dispatches: {e}", links.len())));
        }
        best
    }
}

/// The backend-neutral face of [`KernelHarness::run`] and [`KernelHarness::run_n`] (one pass of
/// `reps` dispatches), which the kernel tests run every case through.
impl KernelRunner for KernelHarness {
    fn backend(&self) -> &str {
        "wgpu"
    }

    fn describe(&self) -> String {
        self.gpu.describe()
    }

    fn limits(&self) -> DeviceLimits {
        self.gpu.device_limits()
    }

    fn coop_f16(&self) -> bool {
        self.gpu.coop_f16()
    }

    fn run(
        &mut self,
        kernel: Kernel,
        buffers: &[Vec<u8>],
        params: &[u8],
        step: Step,
        grid: (u32, u32, u32),
    ) -> Result<Vec<Vec<u8>>> {
        KernelHarness::run(self, kernel, buffers, params, step, grid)
    }

    fn run_n(
        &mut self,
        kernel: Kernel,
        buffers: &[Vec<u8>],
        params: &[u8],
        step: Step,
        grid: (u32, u32, u32),
        reps: u32,
    ) -> Result<Vec<Vec<u8>>> {
        KernelHarness::run_n(self, kernel, buffers, params, step, grid, reps)
    }
}

/// One dispatch of a chain ([`KernelHarness::run_chain`]): its params bytes and its grid.
pub type Link = (Vec<u8>, (u32, u32, u32));

/// Storage buffers uploaded for one kernel, run over by [`KernelHarness::run_chain`] and
/// [`KernelHarness::time_chain`].
pub struct Uploaded {
    kernel: Kernel,
    storage: Vec<wgpu::Buffer>,
    lens: Vec<usize>,
}

/// Each buffer bound whole.
fn whole(storage: &[wgpu::Buffer]) -> Vec<wgpu::BufferBinding<'_>> {
    storage.iter().map(wgpu::Buffer::as_entire_buffer_binding).collect()
}

/// Records `groups` (pipeline and bind group of each link) as dispatches of `links`' grids.
fn record_chain(pass: &mut wgpu::ComputePass, groups: &[(wgpu::ComputePipeline, wgpu::BindGroup)], links: &[Link]) {
    for ((pipeline, group), (_, grid)) in groups.iter().zip(links) {
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, group, &[]);
        pass.dispatch_workgroups(grid.0, grid.1, grid.2);
    }
}

/// A kernel ready to dispatch: its pipeline, bind group and storage buffers (in binding order).
struct Bound {
    pipeline: wgpu::ComputePipeline,
    group: wgpu::BindGroup,
    storage: Vec<wgpu::Buffer>,
}
