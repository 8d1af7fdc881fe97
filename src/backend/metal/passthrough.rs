//! The Metal kernels on an Apple GPU: the MSL source handed to Metal's compiler through wgpu's
//! `PASSTHROUGH_SHADERS` (wgpu 30: `create_shader_module_passthrough` with an entry-point list),
//! eight storage buffers in one bind group (wgpu-hal numbers MSL buffers in bind-group order, so
//! binding i is `[[buffer(i)]]`; it appends a sizes buffer the kernels ignore).
//!
//! Compiled everywhere, it runs only where wgpu finds a Metal adapter. Elsewhere `open` fails
//! with one line naming the alternatives. A kernel Metal's compiler rejects surfaces as the
//! kernel's name plus wgpu's message (creation runs inside validation and internal error
//! scopes), never a panic. This path has not run on a Mac yet; `tests/metal.rs` checks the
//! refusal on other machines and the emulator checks the kernels' logic.

use std::borrow::Cow;

use crate::error::{Error, Result};

use super::device::{Buf, Launch, MslDevice, MslProgram, BUFFERS};

/// A Metal adapter and device.
pub struct MetalGpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
}

impl MetalGpu {
    /// Opens the Metal adapter, or explains why there is none.
    pub fn open() -> Result<Self> {
        let refuse = |why: String| {
            Error::Gpu(format!(
                "--backend metal needs an Apple GPU under macOS ({why}): use --backend wgpu (the WGSL kernels on Vulkan, Metal or DX12) or --backend msl-emu (these Metal kernels on the CPU, slow)"
            ))
        };
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        desc.backends = wgpu::Backends::METAL;
        let instance = wgpu::Instance::new(desc);
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        }))
        .map_err(|_| refuse("no Metal adapter on this machine".into()))?;
        let info = adapter.get_info();
        if !adapter.features().contains(wgpu::Features::PASSTHROUGH_SHADERS) {
            return Err(refuse(format!("{} does not offer MSL passthrough", info.name)));
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("kestrel metal"),
            required_features: wgpu::Features::PASSTHROUGH_SHADERS,
            required_limits: adapter.limits(),
            ..Default::default()
        }))
        .map_err(|e| Error::Gpu(format!("could not open the Metal device {}: {e}", info.name)))?;
        Ok(MetalGpu { device, queue, info })
    }

    /// One threadgroup of 256 threads per GPU core would be the shape to measure; Metal reports
    /// no core count, so until a Mac measures it the default is 8 × 256 (co-resident on every
    /// Apple GPU: the smallest has 7–8 cores, each keeping ≥ 384 threads resident).
    pub fn default_launch(&self) -> Launch {
        Launch { groups: 8, threads: 256 }
    }
}

/// Buffers and the decode pipeline on a Metal device.
pub struct PassthroughDevice {
    gpu: MetalGpu,
    bufs: Vec<wgpu::Buffer>,
    bind: wgpu::BindGroup,
    /// One pipeline per kernel of the program (`super::KERNELS`).
    pipelines: Vec<(&'static str, wgpu::ComputePipeline)>,
}

impl PassthroughDevice {
    pub fn new(gpu: MetalGpu, program: &MslProgram, sizes: [usize; BUFFERS], launch: Launch) -> Result<Self> {
        let d = &gpu.device;
        let bufs: Vec<wgpu::Buffer> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                d.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(["table", "arena A", "arena B", "act", "kv", "sync", "step", "out"][i]),
                    size: (n.max(16) as u64).next_multiple_of(4),
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                })
            })
            .collect();
        let entries: Vec<wgpu::BindGroupLayoutEntry> = (0..BUFFERS as u32)
            .map(|b| wgpu::BindGroupLayoutEntry {
                binding: b,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only: false },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let bgl =
            d.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some("msl"), entries: &entries });
        let layout = d.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("msl"),
            bind_group_layouts: &[Some(&bgl)],
            immediate_size: 0,
        });
        let bind = d.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("msl"),
            layout: &bgl,
            entries: &bufs
                .iter()
                .enumerate()
                .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
                .collect::<Vec<_>>(),
        });
        let scope_v = d.push_error_scope(wgpu::ErrorFilter::Validation);
        let scope_i = d.push_error_scope(wgpu::ErrorFilter::Internal);
        let entry_points: Vec<wgpu::PassthroughShaderEntryPoint> = super::KERNELS
            .iter()
            .map(|k| wgpu::PassthroughShaderEntryPoint {
                name: Cow::Borrowed(k),
                workgroup_size: (launch.threads, 1, 1),
            })
            .collect();
        // SAFETY: wgpu does not validate passthrough source; the MSL is this crate's own
        // `msl/` files, whose buffers and bounds the emulator checks (tests/msl_emu.rs).
        let module = unsafe {
            d.create_shader_module_passthrough(wgpu::ShaderModuleDescriptorPassthrough {
                label: Some("decode.metal"),
                entry_points: Cow::Borrowed(&entry_points),
                msl: Some(Cow::Owned(program.source())),
                ..Default::default()
            })
        };
        let pipelines: Vec<(&'static str, wgpu::ComputePipeline)> = super::KERNELS
            .iter()
            .map(|&k| {
                let p = d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(k),
                    layout: Some(&layout),
                    module: &module,
                    entry_point: Some(k),
                    compilation_options: Default::default(),
                    cache: None,
                });
                (k, p)
            })
            .collect();
        for scope in [scope_i, scope_v] {
            if let Some(e) = pollster::block_on(scope.pop()) {
                return Err(Error::Gpu(format!(
                    "Metal rejected the kernels {} (msl/): {e}",
                    super::KERNELS.join(", ")
                )));
            }
        }
        Ok(PassthroughDevice { gpu, bufs, bind, pipelines })
    }
}

impl MslDevice for PassthroughDevice {
    fn name(&self) -> &str {
        "metal"
    }
    fn info(&self) -> String {
        format!("{} (Metal, {})", self.gpu.info.name, self.gpu.info.driver)
    }
    fn write(&mut self, buf: Buf, offset: usize, data: &[u8]) -> Result<()> {
        self.gpu.queue.write_buffer(&self.bufs[buf as usize], offset as u64, data);
        Ok(())
    }
    fn read(&self, buf: Buf, offset: usize, out: &mut [u8]) -> Result<()> {
        let len = (out.len() as u64).next_multiple_of(4);
        let staging = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: len,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&self.bufs[buf as usize], offset as u64, &staging, 0, Some(len));
        self.gpu.queue.submit([enc.finish()]);
        let slice = staging.slice(..);
        slice.map_async(wgpu::MapMode::Read, |_| {});
        self.gpu
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu(format!("Metal device poll failed: {e}")))?;
        let view = slice.get_mapped_range().map_err(|e| Error::Gpu(format!("Metal readback view: {e}")))?;
        out.copy_from_slice(&view[..out.len()]);
        Ok(())
    }
    fn launch(&mut self, kernel: &str, launch: Launch) -> Result<()> {
        let pipeline = match self.pipelines.iter().find(|(k, _)| *k == kernel) {
            Some((_, p)) => p,
            None => return Err(Error::Invalid(format!("kernel `{kernel}` is not in the Metal program"))),
        };
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass =
                enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(kernel), timestamp_writes: None });
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &self.bind, &[]);
            pass.dispatch_workgroups(launch.groups, 1, 1);
        }
        self.gpu.queue.submit([enc.finish()]);
        Ok(())
    }
}
