//! One kernel, one dispatch, outside any model: the GPU half of the per-kernel differential tests
//! (`tests/kernels.rs`, after llama.cpp's test-backend-ops) and the place per-kernel benchmarks
//! will launch a single dispatch.
//!
//! The harness knows nothing about what a kernel computes. The caller supplies what
//! `Builder::record` (mod.rs) would bind: the storage buffers in binding order (see the kernel's
//! WGSL header and [`Kernel::bindings`]), the params struct as bytes (the `*Params` mirrors in
//! [`super::kernels`], e.g. `bytemuck::bytes_of(&MatmulParams { .. })`), the [`Step`] uniform and
//! the workgroup grid (the same formula the real program uses). Every storage buffer is uploaded
//! fresh, the kernel runs once in its own compute pass, and every storage buffer is read back, so
//! a test can check both the outputs and that nothing else was written.

use wgpu::util::DeviceExt;

use super::context::Gpu;
use super::kernels::{Bind, Kernel, Pipelines, Step};
use crate::error::{Error, Result};

/// A device plus the pipeline cache, for launching single kernels.
pub struct KernelHarness {
    gpu: Gpu,
    pipelines: Pipelines,
}

impl KernelHarness {
    /// Opens the default adapter (as [`Gpu::new`], no binding cap). Fails with the "no GPU
    /// adapter found" error where there is none.
    pub fn new() -> Result<Self> {
        Ok(Self::with_gpu(Gpu::new(None)?))
    }

    /// A harness on a device the caller already opened.
    pub fn with_gpu(gpu: Gpu) -> Self {
        KernelHarness { gpu, pipelines: Pipelines::default() }
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Number of storage bindings `kernel` takes (the `buffers` [`run`](Self::run) expects).
    pub fn storage_bindings(kernel: Kernel) -> usize {
        kernel.bindings().iter().filter(|b| **b != Bind::Uniform).count()
    }

    /// Runs `kernel` once: `buffers` are the storage bindings in binding order (their initial
    /// contents; lengths are padded to a multiple of 4 on the GPU), `params` the kernel's params
    /// struct bytes, `step` the Step uniform, `grid` the workgroup counts (a zero count dispatches
    /// nothing, as in the real program). Returns the final contents of every storage buffer, in
    /// the same order and with the same lengths as `buffers`. Validation errors (wrong binding
    /// count or size, a grid over the device limit) come back as `Error::Gpu` naming the kernel.
    pub fn run(&mut self, kernel: Kernel, buffers: &[Vec<u8>], params: &[u8], step: Step, grid: (u32, u32, u32)) -> Result<Vec<Vec<u8>>> {
        let label = kernel.label();
        let want = Self::storage_bindings(kernel);
        if buffers.len() != want {
            return Err(Error::Invalid(format!("{label} takes {want} storage buffers, got {}", buffers.len())));
        }
        let (pipeline, layout) = self.pipelines.get(&self.gpu.device, kernel)?.clone();
        let gpu = &self.gpu;
        let dev = &gpu.device;

        let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
        let storage: Vec<wgpu::Buffer> =
            buffers.iter().enumerate().map(|(i, b)| gpu.upload(&format!("{label} binding {i}"), b)).collect();
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
        let params_buf = uniform("params", params);
        let step_buf = uniform("step", bytemuck::bytes_of(&step));

        let mut storage_iter = storage.iter();
        let mut uniforms = [&params_buf, &step_buf].into_iter();
        let entries: Vec<wgpu::BindGroupEntry> = kernel
            .bindings()
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let buf = match b {
                    Bind::Uniform => uniforms.next(),
                    Bind::Read | Bind::ReadWrite => storage_iter.next(),
                };
                wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource: buf.expect("bindings() lists storage first, then params and step").as_entire_binding(),
                }
            })
            .collect();
        let bind_group = dev.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(&label), layout: &layout, entries: &entries });

        let staging: Vec<wgpu::Buffer> =
            storage.iter().enumerate().map(|(i, b)| gpu.staging(&format!("{label} readback {i}"), b.size())).collect();
        let mut enc = dev.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(&label) });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(&label), timestamp_writes: None });
            if grid.0 > 0 && grid.1 > 0 && grid.2 > 0 {
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &bind_group, &[]);
                pass.dispatch_workgroups(grid.0, grid.1, grid.2);
            }
        }
        for (src, dst) in storage.iter().zip(&staging) {
            enc.copy_buffer_to_buffer(src, 0, dst, 0, Some(src.size()));
        }
        gpu.queue.submit([enc.finish()]);
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("{label} with grid {grid:?}: {e}")));
        }

        let mut out = Vec::with_capacity(buffers.len());
        for (b, s) in buffers.iter().zip(&staging) {
            let mut v = Vec::new();
            gpu.read(s, s.size(), &mut v)?;
            v.truncate(b.len());
            out.push(v);
        }
        Ok(out)
    }
}
