//! Where the Metal kernels run: an Apple GPU through wgpu's MSL passthrough
//! ([`super::passthrough`]), or the CPU through the MSL emulator ([`EmuDevice`]). The backend
//! sees only this trait: eight buffers by role, written and read by byte ranges, and launches.

use crate::error::{Error, Result};

use super::emu::{AlignedBytes, Binding, DispatchOptions, EmuBuild, EmuLibrary};

/// The kernels' buffers, in binding order (`[[buffer(i)]]` = the discriminant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buf {
    Table = 0,
    ArenaA = 1,
    ArenaB = 2,
    Act = 3,
    Kv = 4,
    Sync = 5,
    Step = 6,
    Out = 7,
}

pub const BUFFERS: usize = 8;

/// A grid of `groups` threadgroups of `threads` threads (one dimension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub groups: u32,
    pub threads: u32,
}

impl Launch {
    /// SIMD-groups (of 32 threads) in the grid.
    pub fn warps(&self) -> u32 {
        self.groups * (self.threads / 32)
    }
}

/// The MSL translation unit: the `.metal` files in order.
pub struct MslProgram {
    pub files: Vec<(&'static str, &'static str)>,
}

impl MslProgram {
    /// One source string, as Metal's `newLibraryWithSource` takes it.
    pub fn source(&self) -> String {
        let mut s = String::new();
        for (name, text) in &self.files {
            s.push_str(&format!("#line 1 \"{name}\"\n"));
            s.push_str(text);
            s.push('\n');
        }
        s
    }
}

/// A device that holds the eight buffers and runs kernels over them.
pub trait MslDevice {
    /// Backend name for stats and errors (`metal`, `msl-emu`).
    fn name(&self) -> &str;
    fn info(&self) -> String;
    /// Copies `data` into `buf` at byte `offset`.
    fn write(&mut self, buf: Buf, offset: usize, data: &[u8]) -> Result<()>;
    /// Copies `out.len()` bytes of `buf` from byte `offset` (after every launch so far).
    fn read(&self, buf: Buf, offset: usize, out: &mut [u8]) -> Result<()>;
    /// Runs `kernel` over all eight buffers.
    fn launch(&mut self, kernel: &str, launch: Launch) -> Result<()>;
}

/// The MSL emulator: the kernels compiled for the CPU, buffers in host memory.
pub struct EmuDevice {
    lib: EmuLibrary,
    bufs: Vec<AlignedBytes>,
    opts: DispatchOptions,
}

impl EmuDevice {
    /// Compiles `program` and allocates buffers of `sizes` bytes (zeroed).
    pub fn new(program: &MslProgram, sizes: [usize; BUFFERS], opts: DispatchOptions) -> Result<Self> {
        let lib = EmuLibrary::build(&EmuBuild { files: &program.files, ..EmuBuild::default() })?;
        // Metal buffers are never empty; nor are these (a zero-length slice has no address).
        let bufs = sizes.iter().map(|&n| AlignedBytes::new(n.max(16))).collect();
        Ok(EmuDevice { lib, bufs, opts })
    }
}

fn range_check(buf: Buf, offset: usize, len: usize, size: usize) -> Result<()> {
    if offset + len > size {
        return Err(Error::Invalid(format!("{buf:?} buffer access {offset}+{len} past its {size} bytes")));
    }
    Ok(())
}

impl MslDevice for EmuDevice {
    fn name(&self) -> &str {
        "msl-emu"
    }
    fn info(&self) -> String {
        "MSL emulator (the Metal kernels compiled for this CPU)".into()
    }
    fn write(&mut self, buf: Buf, offset: usize, data: &[u8]) -> Result<()> {
        let b = &mut self.bufs[buf as usize];
        range_check(buf, offset, data.len(), b.len())?;
        b[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn read(&self, buf: Buf, offset: usize, out: &mut [u8]) -> Result<()> {
        let b = &self.bufs[buf as usize];
        range_check(buf, offset, out.len(), b.len())?;
        out.copy_from_slice(&b[offset..offset + out.len()]);
        Ok(())
    }
    fn launch(&mut self, kernel: &str, launch: Launch) -> Result<()> {
        let mut bindings: Vec<Binding> =
            self.bufs.iter_mut().enumerate().map(|(i, b)| Binding { index: i as u32, bytes: &mut b[..] }).collect();
        self.lib.dispatch(kernel, [launch.groups, 1, 1], [launch.threads, 1, 1], &mut bindings, &[], &self.opts)
    }
}
