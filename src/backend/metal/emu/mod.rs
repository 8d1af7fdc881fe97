//! The MSL emulator: Kestrel's `.metal` sources, compiled for the CPU with clang++ against a small
//! shim (`msl/emu/metal_stdlib`) and run as a grid of threadgroups whose threads are fibers on the
//! calling OS thread. Used by `--backend msl-emu` and by tests that check MSL kernels against the
//! CPU reference without a Mac. It checks kernel logic and synchronisation structure; it cannot
//! stand in for Apple's compiler, the real memory model, occupancy or speed (see msl/README.md).

mod compile;
pub mod prepass;

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr, CString};
use std::path::Path;

use crate::error::{Error, Result};

pub use compile::compiler;

/// A set of `.metal` files to compile as one translation unit.
#[derive(Default, Clone, Copy)]
pub struct EmuBuild<'a> {
    /// (file name for `#line` and diagnostics, MSL text), concatenated in order.
    pub files: &'a [(&'a str, &'a str)],
    /// `-D` macros (name, value).
    pub defines: &'a [(&'a str, &'a str)],
    /// The C++ compiler to use instead of [`compiler()`]'s choice (tests; no environment races).
    pub cxx: Option<&'a Path>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Schedule {
    /// Round-robin over the runnable threads at every scheduling point: deterministic.
    #[default]
    Fifo,
    /// A seeded random runnable thread at every scheduling point (barriers, simd ops, atomics,
    /// fences): explores interleavings, and replays exactly for a given seed.
    Random,
}

#[derive(Debug, Clone, Default)]
pub struct DispatchOptions {
    pub schedule: Schedule,
    pub seed: u64,
    /// Each threadgroup sees a private copy of every bound buffer; only device-scope release
    /// fences publish its writes and acquire fences refresh its view (atomics go to the shared
    /// copy), so a missing fence fails deterministically.
    pub incoherent: bool,
    /// At most this many threadgroups run at once; later ones start as earlier ones finish. A
    /// grid barrier over a larger grid is reported (livelock) instead of hanging.
    pub max_resident_groups: Option<u32>,
}

/// A `[[buffer(index)]]` binding. The bytes must be 16-byte aligned (see [`AlignedBytes`]).
pub struct Binding<'a> {
    pub index: u32,
    pub bytes: &'a mut [u8],
}

#[repr(C)]
struct KernelEntry {
    name: *const c_char,
    run: Option<extern "C" fn()>,
    file: *const c_char,
    line: u32,
}

#[repr(C)]
struct DispatchDesc {
    kernel: extern "C" fn(),
    kernel_name: *const c_char,
    groups: [u32; 3],
    threads: [u32; 3],
    n_buffers: u32,
    buffer_index: *const u32,
    buffer_ptr: *const *mut u8,
    buffer_len: *const usize,
    n_tg: u32,
    tg_index: *const u32,
    tg_len: *const usize,
    random: c_int,
    seed: u64,
    incoherent: c_int,
    max_resident: u32,
    livelock_polls: u64,
}

type DispatchFn = unsafe extern "C" fn(*const DispatchDesc, *mut c_char, usize) -> c_int;

struct Kernel {
    run: extern "C" fn(),
    file: String,
    line: u32,
}

/// A compiled and loaded set of `.metal` files.
pub struct EmuLibrary {
    kernels: HashMap<String, Kernel>,
    dispatch_fn: DispatchFn,
    // Keeps the code above mapped; dropped last.
    _lib: libloading::Library,
}

// The library's code keeps no global mutable state (only thread-locals), so one loaded library can
// serve dispatches from several threads at once.
unsafe impl Send for EmuLibrary {}
unsafe impl Sync for EmuLibrary {}

/// Polls without any atomic write changing memory before a dispatch is declared livelocked
/// (about a second of spinning).
const LIVELOCK_POLLS: u64 = 2_000_000;

impl EmuLibrary {
    pub fn build(b: &EmuBuild) -> Result<EmuLibrary> {
        let cxx = match b.cxx {
            Some(p) => {
                if !p.is_file() {
                    return Err(Error::Invalid(format!(
                        "--backend msl-emu compiles the Metal kernels for the CPU with clang++, which was not found: install clang (Debian/Ubuntu: apt install clang) or set KESTREL_MSL_CXX ({} does not exist)",
                        p.display()
                    )));
                }
                p.to_path_buf()
            }
            None => compiler()?,
        };
        let pre = prepass::prepass(b.files);
        let what: Vec<&str> = b.files.iter().map(|f| f.0).collect();
        let path = compile::build_library(&cxx, &pre.text, b.defines, &what.join(" + "))?;
        // SAFETY: the library is one this module just built from the embedded runtime; loading it
        // runs no initialisers beyond the C++ runtime's own.
        let lib = unsafe { libloading::Library::new(&path) }
            .map_err(|e| Error::Invalid(format!("MSL emulator: loading {}: {e}", path.display())))?;
        let dispatch_fn: DispatchFn = unsafe {
            *lib.get::<DispatchFn>(b"msl_emu_dispatch\0")
                .map_err(|e| Error::Invalid(format!("MSL emulator: {}: {e}", path.display())))?
        };
        let table: *const KernelEntry = unsafe {
            *lib.get::<*const KernelEntry>(b"msl_emu_kernel_table\0")
                .map_err(|e| Error::Invalid(format!("MSL emulator: {}: {e}", path.display())))?
        };
        let mut kernels = HashMap::new();
        // SAFETY: the table is a static array terminated by a null name (emitted by the pre-pass).
        unsafe {
            let mut p = table;
            while !(*p).name.is_null() {
                let e = &*p;
                let name = CStr::from_ptr(e.name).to_string_lossy().into_owned();
                let file = CStr::from_ptr(e.file).to_string_lossy().into_owned();
                if let Some(run) = e.run {
                    kernels.insert(name, Kernel { run, file, line: e.line });
                }
                p = p.add(1);
            }
        }
        Ok(EmuLibrary { kernels, dispatch_fn, _lib: lib })
    }

    /// Kernel names, sorted.
    pub fn kernels(&self) -> Vec<String> {
        let mut v: Vec<String> = self.kernels.keys().cloned().collect();
        v.sort();
        v
    }

    /// Runs `kernel` over `groups` threadgroups of `threads` threads and returns when every
    /// thread has finished, or with an error naming the kernel and the `.metal` line of a fault.
    pub fn dispatch(
        &self,
        kernel: &str,
        groups: [u32; 3],
        threads: [u32; 3],
        buffers: &mut [Binding],
        threadgroup_mem: &[(u32, usize)],
        opts: &DispatchOptions,
    ) -> Result<()> {
        let Some(k) = self.kernels.get(kernel) else {
            return Err(Error::Invalid(format!(
                "MSL emulator: no kernel `{kernel}` in the library (it has: {})",
                self.kernels().join(", ")
            )));
        };
        let bad =
            |m: String| Err(Error::Invalid(format!("MSL emulator: kernel `{kernel}` ({}:{}): {m}", k.file, k.line)));
        if groups.contains(&0) || threads.contains(&0) {
            return bad(format!("empty grid: groups {groups:?}, threads {threads:?}"));
        }
        let per_group = threads.iter().map(|&t| t as u64).product::<u64>();
        if per_group > 1024 {
            return bad(format!("{per_group} threads per threadgroup: Metal allows at most 1024"));
        }
        for (i, b) in buffers.iter().enumerate() {
            if !b.bytes.is_empty() && !(b.bytes.as_ptr() as usize).is_multiple_of(16) {
                return bad(format!("buffer {} is not 16-byte aligned (use AlignedBytes)", b.index));
            }
            if buffers[..i].iter().any(|o| o.index == b.index) {
                return bad(format!("buffer index {} bound twice", b.index));
            }
        }
        let idx: Vec<u32> = buffers.iter().map(|b| b.index).collect();
        let ptrs: Vec<*mut u8> = buffers.iter_mut().map(|b| b.bytes.as_mut_ptr()).collect();
        let lens: Vec<usize> = buffers.iter().map(|b| b.bytes.len()).collect();
        let tg_idx: Vec<u32> = threadgroup_mem.iter().map(|t| t.0).collect();
        let tg_len: Vec<usize> = threadgroup_mem.iter().map(|t| t.1).collect();
        let cname = CString::new(kernel).unwrap_or_default();
        let desc = DispatchDesc {
            kernel: k.run,
            kernel_name: cname.as_ptr(),
            groups,
            threads,
            n_buffers: idx.len() as u32,
            buffer_index: idx.as_ptr(),
            buffer_ptr: ptrs.as_ptr(),
            buffer_len: lens.as_ptr(),
            n_tg: tg_idx.len() as u32,
            tg_index: tg_idx.as_ptr(),
            tg_len: tg_len.as_ptr(),
            random: (opts.schedule == Schedule::Random) as c_int,
            seed: opts.seed,
            incoherent: opts.incoherent as c_int,
            max_resident: opts.max_resident_groups.unwrap_or(0),
            livelock_polls: LIVELOCK_POLLS,
        };
        let mut err = vec![0u8; 4096];
        // SAFETY: every pointer in `desc` outlives the call; the buffers are exclusively borrowed.
        let rc = unsafe { (self.dispatch_fn)(&desc, err.as_mut_ptr() as *mut c_char, err.len()) };
        if rc != 0 {
            let msg = CStr::from_bytes_until_nul(&err).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
            return bad(msg);
        }
        Ok(())
    }
}

/// A zeroed, 64-byte-aligned byte buffer: MSL kernels load vectors from bound buffers, which
/// needs the alignment a GPU allocation has.
pub struct AlignedBytes {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

unsafe impl Send for AlignedBytes {}
unsafe impl Sync for AlignedBytes {}

impl AlignedBytes {
    const ALIGN: usize = 64;

    pub fn new(len: usize) -> AlignedBytes {
        let layout = std::alloc::Layout::from_size_align(len.max(1), Self::ALIGN).expect("buffer size overflows");
        // SAFETY: the layout has a nonzero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBytes { ptr, len }
    }

    pub fn from_slice(bytes: &[u8]) -> AlignedBytes {
        let mut a = AlignedBytes::new(bytes.len());
        a.copy_from_slice(bytes);
        a
    }
}

impl Drop for AlignedBytes {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len.max(1), Self::ALIGN).unwrap();
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::ops::Deref for AlignedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` initialised (zeroed) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for AlignedBytes {
    fn clone(&self) -> Self {
        AlignedBytes::from_slice(self)
    }
}
