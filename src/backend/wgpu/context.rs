//! The wgpu device and the few helpers every part of the backend uses: buffer creation (every
//! buffer labelled with what it holds) and blocking readback.

use wgpu::util::DeviceExt;

use crate::error::{Error, Result};

/// Instance → adapter → device/queue, created once and shared by everything in the backend.
#[derive(Clone)]
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    /// Largest storage binding the adapter allows (128 MiB on lavapipe, 2 GiB on Vulkan).
    pub adapter_max_binding: u64,
    /// Largest part a weight matrix is split into: the adapter's limit, or less when a test
    /// forces splitting.
    pub max_binding: u64,
}

/// Keeps Mesa's device-select Vulkan layer from probing the window system when adapters are
/// enumerated. The layer (an implicit layer Mesa installs beside lavapipe and its GPU drivers)
/// orders devices by the display a program draws to; it connects to Wayland because wgpu enables
/// the Wayland surface extension wherever it exists, and without a session (`XDG_RUNTIME_DIR`
/// unset: a container, an ssh shell) libwayland prints "error: XDG_RUNTIME_DIR is invalid or not
/// set in the environment." once per enumeration. Kestrel draws nothing and picks its adapter by
/// power preference, so the layer has nothing to decide: `NODEVICE_SELECT=1` (the variable its
/// manifest names to disable it) is set for this process, once, before the first Vulkan call,
/// unless the user set it. The Vulkan loader reads it when the first instance is created.
fn without_display_probe() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("NODEVICE_SELECT").is_none() {
            // Before any instance exists, so no Vulkan code reads the environment meanwhile.
            std::env::set_var("NODEVICE_SELECT", "1");
        }
    });
}

impl Gpu {
    /// Opens the highest-performance adapter (`WGPU_BACKEND` and `WGPU_ADAPTER_NAME` are honoured)
    /// and a device with the adapter's own limits (the defaults cap bindings at 128 MiB and
    /// allow only 8 storage buffers per stage).
    pub fn new(max_binding_override: Option<u64>) -> Result<Self> {
        without_display_probe();
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        }))
        .map_err(|e| {
            Error::Gpu(format!(
                "no GPU adapter found ({e}): install a Vulkan driver (on Debian: apt-get install mesa-vulkan-drivers for the software one), or use --backend cpu"
            ))
        })?;
        let info = adapter.get_info();
        let limits = adapter.limits();
        // Timestamps inside passes let `kestrel bench` time each kernel; optional everywhere.
        let profiling = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        // Subgroup operations shorten the kernels' reductions (they fall back to trees).
        let mut features = adapter.features() & (profiling | wgpu::Features::SUBGROUP);
        // Tensor cores for the prefill mat-mat (qmm_coop.wgsl): f16 × f16 → f32 16×16×16
        // cooperative matrices in subgroups of exactly 32 (the kernel's fragment layout).
        let coop =
            wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP;
        let coop_f16 = adapter.features().contains(coop)
            && (info.subgroup_min_size, info.subgroup_max_size) == (32, 32)
            && adapter.cooperative_matrix_properties().iter().any(|c| {
                (c.m_size, c.n_size, c.k_size) == (16, 16, 16)
                    && c.ab_type == wgpu::CooperativeScalarType::F16
                    && c.cr_type == wgpu::CooperativeScalarType::F32
            });
        if coop_f16 {
            features |= coop;
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("kestrel"),
            required_features: features,
            required_limits: limits.clone(),
            // SAFETY: wgpu's experimental features may have bugs that reach undefined behaviour;
            // the one requested (cooperative matrices, only where the adapter lists the f16 → f32
            // configuration qmm_coop uses) is used by one kernel, checked against the CPU
            // reference by tests/kernels.rs on such a device.
            experimental_features: if coop_f16 {
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            ..Default::default()
        }))
        .map_err(|e| Error::Gpu(format!("could not open device on {}: {e}", info.name)))?;
        let adapter_max = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        let max_binding = max_binding_override.map_or(adapter_max, |m| m.min(adapter_max));
        Ok(Gpu { device, queue, info, limits, adapter_max_binding: adapter_max, max_binding })
    }

    /// The limits the kernels' shape rules read ([`crate::kernels::shape`]).
    pub fn device_limits(&self) -> crate::kernels::DeviceLimits {
        crate::kernels::DeviceLimits {
            max_threads: self.limits.max_compute_invocations_per_workgroup,
            max_workgroup_x: self.limits.max_compute_workgroup_size_x,
            max_workgroup_bytes: self.limits.max_compute_workgroup_storage_size,
        }
    }

    /// True when kernels can be timed with timestamps inside a compute pass.
    pub fn can_profile(&self) -> bool {
        self.device.features().contains(wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES)
    }

    /// Device-to-device copy bandwidth in GB/s (bytes read + bytes written per second), the
    /// roofline `kestrel bench` compares against: `iters` copies of a `bytes`-sized buffer,
    /// after one warm-up copy, timed on the host around submit-and-wait.
    pub fn copy_bandwidth(&self, bytes: u64, iters: u32) -> Result<f64> {
        let bytes = bytes.min(self.limits.max_buffer_size).next_multiple_of(4);
        let a = self.storage("bandwidth src", bytes);
        let b = self.storage("bandwidth dst", bytes);
        let run = |n: u32| -> Result<std::time::Duration> {
            let t0 = std::time::Instant::now();
            let mut enc =
                self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("bandwidth") });
            for _ in 0..n {
                enc.copy_buffer_to_buffer(&a, 0, &b, 0, Some(bytes));
            }
            self.queue.submit([enc.finish()]);
            self.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Gpu(format!("device poll failed: {e}")))?;
            Ok(t0.elapsed())
        };
        run(1)?;
        let t = run(iters)?;
        Ok(2.0 * bytes as f64 * iters as f64 / t.as_secs_f64() / 1e9)
    }

    pub fn describe(&self) -> String {
        let sg =
            if self.subgroups() { format!(", subgroups of {}", self.info.subgroup_min_size) } else { String::new() };
        format!("{} ({:?}, {}{sg})", self.info.name, self.info.backend, self.info.driver)
    }

    /// True when kernels may use subgroup operations.
    pub fn subgroups(&self) -> bool {
        self.device.features().contains(wgpu::Features::SUBGROUP)
    }

    /// True when the prefill mat-mat may run on tensor cores (`qmm_coop`): the device was opened
    /// with f16 cooperative matrices (16×16×16, f32 accumulation) and subgroups of 32.
    pub fn coop_f16(&self) -> bool {
        self.device.features().contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16)
    }

    /// A storage buffer of `size` bytes (rounded up to 4), zero-initialised by wgpu.
    pub fn storage(&self, label: &str, size: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: size.max(4).next_multiple_of(4),
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    }

    /// A storage buffer holding `bytes` (padded to 4 bytes): weights, uploaded once.
    pub fn upload(&self, label: &str, bytes: &[u8]) -> wgpu::Buffer {
        let padded;
        let contents = if bytes.len().is_multiple_of(4) && !bytes.is_empty() {
            bytes
        } else {
            let mut v = bytes.to_vec();
            v.resize(bytes.len().max(4).next_multiple_of(4), 0);
            padded = v;
            &padded
        };
        self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
        })
    }

    /// A storage buffer holding `pieces` one after another (padded to 4 bytes): a stacked
    /// weight matrix, written straight from the mapped files without a joined host copy.
    pub fn upload_concat(&self, label: &str, pieces: &[&[u8]]) -> Result<wgpu::Buffer> {
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: len.max(4).next_multiple_of(4) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        });
        {
            let mut view = buf
                .slice(..)
                .get_mapped_range_mut()
                .map_err(|e| Error::Gpu(format!("{label}: mapping for upload: {e}")))?;
            let mut off = 0;
            for p in pieces {
                view.slice(off..off + p.len()).copy_from_slice(p);
                off += p.len();
            }
        }
        buf.unmap();
        Ok(buf)
    }

    /// A host-readable staging buffer for readback.
    pub fn staging(&self, label: &str, size: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: size.max(4).next_multiple_of(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Maps `buf` (already filled by a submitted copy), waits, and copies `len` bytes out.
    pub fn read(&self, buf: &wgpu::Buffer, len: u64, out: &mut Vec<u8>) -> Result<()> {
        self.read_after(buf, len, None, out)
    }

    /// Like [`read`](Self::read), waiting only for submission `after` (work submitted later
    /// keeps running while the caller uses the bytes).
    pub fn read_after(
        &self,
        buf: &wgpu::Buffer,
        len: u64,
        after: Option<wgpu::SubmissionIndex>,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        out.clear();
        if len == 0 {
            return Ok(());
        }
        let slice = buf.slice(..len);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::Wait { submission_index: after, timeout: None })
            .map_err(|e| Error::Gpu(format!("device poll failed: {e}")))?;
        rx.recv()
            .map_err(|_| Error::Gpu("readback callback never ran".into()))?
            .map_err(|e| Error::Gpu(format!("readback map failed: {e}")))?;
        {
            let view = slice.get_mapped_range().map_err(|e| Error::Gpu(format!("readback view: {e}")))?;
            out.extend_from_slice(&view);
        }
        buf.unmap();
        Ok(())
    }
}
