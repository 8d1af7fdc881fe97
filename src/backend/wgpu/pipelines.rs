//! The pipeline cache: one compute pipeline per [`Kernel`] (compiled on first use from
//! [`kernel_source`]'s WGSL), and one bind-group layout per binding signature.

use std::collections::HashMap;

use super::context::Gpu;
use super::source::kernel_source;
use crate::error::{Error, Result};
use crate::kernels::{Bind, Kernel, Tuning};

/// Compiled pipelines, created on first use.
pub struct Pipelines {
    cache: HashMap<Kernel, (wgpu::ComputePipeline, wgpu::BindGroupLayout)>,
    /// One layout per binding signature, so one bind group serves every variant of a kernel
    /// (the decode and prefill matmuls share theirs).
    layouts: HashMap<&'static [Bind], wgpu::BindGroupLayout>,
    /// naga's runtime checks in the generated shaders (index clamps on workgroup and private
    /// arrays, a counter in every loop): [`Tuning::shader_checks`]. Storage buffer accesses keep
    /// the device's robust buffer access either way.
    checks: bool,
    /// Subgroup size the kernels' reductions rely on: the device's when it has subgroup
    /// operations and reports one fixed size (NVIDIA: 32; lavapipe: its SIMD width) and
    /// [`Tuning::subgroups`] allows them, else 0.
    subgroup: u32,
}

impl Pipelines {
    /// The subgroup size the kernels were built for (0: none; see `subgroup`).
    pub fn subgroup(&self) -> u32 {
        self.subgroup
    }

    /// An empty cache for `gpu`, compiling with the subgroups and shader checks `tuning` asks for.
    pub fn new(gpu: &Gpu, tuning: &Tuning) -> Self {
        let fixed =
            gpu.info.subgroup_min_size == gpu.info.subgroup_max_size && gpu.info.subgroup_min_size.is_power_of_two();
        let subgroup = if gpu.subgroups() && fixed && tuning.subgroups { gpu.info.subgroup_min_size } else { 0 };
        Pipelines { cache: HashMap::new(), layouts: HashMap::new(), checks: tuning.shader_checks, subgroup }
    }

    /// A hash of the WGSL `k` compiles from on this device (for [`super::WgpuBackend::program_listing`]).
    pub fn source_hash(&self, k: Kernel) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        kernel_source(k, self.subgroup).hash(&mut h);
        h.finish()
    }

    /// The pipeline of `k` and the layout its bind groups must use.
    pub fn get(&mut self, device: &wgpu::Device, k: Kernel) -> Result<&(wgpu::ComputePipeline, wgpu::BindGroupLayout)> {
        if !self.cache.contains_key(&k) {
            let label = k.label();
            let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
            let entries: Vec<wgpu::BindGroupLayoutEntry> = k
                .bindings()
                .iter()
                .enumerate()
                .map(|(i, b)| wgpu::BindGroupLayoutEntry {
                    binding: i as u32,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: match b {
                            Bind::Read => wgpu::BufferBindingType::Storage { read_only: true },
                            Bind::ReadWrite => wgpu::BufferBindingType::Storage { read_only: false },
                            Bind::Uniform => wgpu::BufferBindingType::Uniform,
                        },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                })
                .collect();
            let bgl = self
                .layouts
                .entry(k.bindings())
                .or_insert_with(|| {
                    device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                        label: Some(&label),
                        entries: &entries,
                    })
                })
                .clone();
            let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(&label),
                bind_group_layouts: &[Some(&bgl)],
                immediate_size: 0,
            });
            let desc = wgpu::ShaderModuleDescriptor {
                label: Some(&label),
                source: wgpu::ShaderSource::Wgsl(kernel_source(k, self.subgroup).into()),
            };
            let module = if self.checks {
                device.create_shader_module(desc)
            } else {
                // SAFETY: every index a kernel computes is bounded by the host-checked shapes
                // its header states (tests/kernels.rs runs every kernel against the CPU
                // reference with and without the checks); loops are bounded by uniforms.
                unsafe { device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
            };
            let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&label),
                layout: Some(&layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions {
                    // Kernels initialise what they read; skip the zero-fill prologue.
                    zero_initialize_workgroup_memory: false,
                    ..Default::default()
                },
                cache: None,
            });
            if let Some(e) = pollster::block_on(scope.pop()) {
                return Err(Error::Gpu(format!("kernel {label} failed to compile: {e}")));
            }
            self.cache.insert(k, (pipeline, bgl));
        }
        Ok(&self.cache[&k])
    }
}
