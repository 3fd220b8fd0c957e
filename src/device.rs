//! Devices, streams, and which GPU back-end (if any) this MLX build has.
//!
//! MLX (0.32) keeps default streams **per thread**: operations built on one thread are queued on
//! that thread's stream, and a lazy array can only be evaluated on the thread that built it.
//! [`Stream`] is therefore neither `Send` nor `Sync`. Every operation in this crate runs on the
//! thread's *current* stream: the innermost [`StreamScope`] if one is active, else the thread's
//! default stream of MLX's default device.

use std::cell::RefCell;
use std::ffi::CStr;
use std::fmt;
use std::marker::PhantomData;

use mlx_sys as sys;

use crate::error::Result;
use crate::ffi::{call, call_value};

/// A kind of device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// The CPU.
    Cpu,
    /// The GPU (Metal on macOS, CUDA on Linux builds with CUDA).
    Gpu,
}

/// The GPU back-end compiled into the loaded `libmlx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Apple GPUs through Metal: [`MetalKernel`](crate::MetalKernel) runs.
    Metal,
    /// NVIDIA GPUs through CUDA: [`CudaKernel`](crate::CudaKernel) runs.
    Cuda,
    /// No GPU back-end: custom kernels do not exist; only MLX's own operations run.
    Cpu,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Metal => "metal",
            Backend::Cuda => "cuda",
            Backend::Cpu => "cpu",
        })
    }
}

/// The GPU back-end of the loaded MLX library. The same binary reports [`Backend::Cuda`] when it
/// runs against MLX's CUDA build (for example through `LD_LIBRARY_PATH`) and [`Backend::Cpu`]
/// against the CPU build.
pub fn backend() -> Backend {
    let mut metal = false;
    // SAFETY: `metal` is a valid out-pointer for the duration of the call.
    let metal_ok = call(|| unsafe { sys::mlx_metal_is_available(&mut metal) }).is_ok();
    if metal_ok && metal {
        return Backend::Metal;
    }
    let mut cuda = false;
    // SAFETY: `cuda` is a valid out-pointer for the duration of the call.
    let cuda_ok = call(|| unsafe { sys::mlx_cuda_is_available(&mut cuda) }).is_ok();
    if cuda_ok && cuda {
        Backend::Cuda
    } else {
        Backend::Cpu
    }
}

/// An MLX device (owns one `mlx_device` handle).
pub struct Device {
    raw: sys::mlx_device,
}

impl Device {
    /// The CPU.
    pub fn cpu() -> Device {
        // SAFETY: creating a device handle has no preconditions; it is freed in `Drop`.
        let raw = unsafe { sys::mlx_device_new_type(sys::MLX_CPU, 0) };
        Device { raw }
    }

    /// The first GPU. It exists as a value on every build; operations on it fail on a build
    /// without a GPU back-end.
    pub fn gpu() -> Device {
        // SAFETY: creating a device handle has no preconditions; it is freed in `Drop`.
        let raw = unsafe { sys::mlx_device_new_type(sys::MLX_GPU, 0) };
        Device { raw }
    }

    /// MLX's default device (the GPU when the build has one, else the CPU).
    pub fn default_device() -> Result<Device> {
        let mut dev = Device::cpu();
        // SAFETY: `dev.raw` is a valid handle to overwrite; MLX reference-counts the result.
        call(|| unsafe { sys::mlx_get_default_device(&mut dev.raw) })?;
        Ok(dev)
    }

    /// Makes this device MLX's default for new operations and drops this thread's cached
    /// current stream so that it follows.
    pub fn set_default(&self) -> Result<()> {
        // SAFETY: `self.raw` is a live device handle.
        call(|| unsafe { sys::mlx_set_default_device(self.raw) })?;
        CURRENT.with(|c| c.borrow_mut().default = None);
        Ok(())
    }

    /// CPU or GPU.
    pub fn device_type(&self) -> DeviceType {
        let mut ty = sys::MLX_CPU;
        // SAFETY: `ty` is a valid out-pointer and `self.raw` a live handle.
        let ok = call(|| unsafe { sys::mlx_device_get_type(&mut ty, self.raw) }).is_ok();
        if ok && ty == sys::MLX_GPU {
            DeviceType::Gpu
        } else {
            DeviceType::Cpu
        }
    }

    /// The CUDA compute capability (major, minor) of this device, as MLX's CUDA back-end reports
    /// it; `None` on other back-ends, for the CPU, or where MLX does not report it.
    pub fn cuda_compute_capability(&self) -> Option<(usize, usize)> {
        if backend() != Backend::Cuda || self.device_type() != DeviceType::Gpu {
            return None;
        }
        let info = DeviceInfo::of(self)?;
        Some((info.size(c"compute_capability_major")?, info.size(c"compute_capability_minor")?))
    }

    /// Whether MLX can run operations on this device in this build.
    pub fn is_available(&self) -> bool {
        let mut avail = false;
        // SAFETY: `avail` is a valid out-pointer and `self.raw` a live handle.
        call(|| unsafe { sys::mlx_device_is_available(&mut avail, self.raw) }).is_ok() && avail
    }
}

/// MLX's key-value description of a device (owns one `mlx_device_info` handle).
struct DeviceInfo {
    raw: sys::mlx_device_info,
}

impl DeviceInfo {
    /// `device`'s description; `None` where MLX cannot give one.
    fn of(device: &Device) -> Option<DeviceInfo> {
        // SAFETY: creating an empty info object has no preconditions; it is freed in `Drop`.
        let mut info = DeviceInfo { raw: unsafe { sys::mlx_device_info_new() } };
        // SAFETY: `info.raw` is a valid handle to fill and `device.raw` a live device handle.
        call(|| unsafe { sys::mlx_device_info_get(&mut info.raw, device.raw) }).ok()?;
        Some(info)
    }

    /// The size value under `key`; `None` where there is none or it is a string.
    fn size(&self, key: &CStr) -> Option<usize> {
        let mut value = 0usize;
        // SAFETY: `value` is a valid out-pointer, `self.raw` a live handle and `key` a
        // NUL-terminated string; a missing key or a string value is a non-zero return.
        call(|| unsafe { sys::mlx_device_info_get_size(&mut value, self.raw, key.as_ptr()) }).ok()?;
        Some(value)
    }
}

impl Drop for DeviceInfo {
    fn drop(&mut self) {
        // SAFETY: `self.raw` is owned by this value and freed exactly once.
        unsafe { sys::mlx_device_info_free(self.raw) };
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: `self.raw` is owned by this value and freed exactly once.
        unsafe { sys::mlx_device_free(self.raw) };
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({:?})", self.device_type())
    }
}

/// An MLX stream (owns one `mlx_stream` handle). Tied to the thread that made it.
pub struct Stream {
    raw: sys::mlx_stream,
    _not_send: PhantomData<*const ()>,
}

impl Stream {
    /// This thread's default stream on `device`.
    pub fn default_for(device: &Device) -> Result<Stream> {
        // SAFETY: creating an empty stream handle has no preconditions; freed in `Drop`.
        let mut stream = Stream { raw: unsafe { sys::mlx_stream_new() }, _not_send: PhantomData };
        // SAFETY: `stream.raw` is a valid handle to overwrite and `device.raw` a live device.
        call(|| unsafe { sys::mlx_get_default_stream(&mut stream.raw, device.raw) })?;
        Ok(stream)
    }

    /// This thread's default CPU stream.
    pub fn cpu() -> Result<Stream> {
        Stream::default_for(&Device::cpu())
    }

    /// This thread's default GPU stream (an error on a build without a GPU back-end).
    pub fn gpu() -> Result<Stream> {
        Stream::default_for(&Device::gpu())
    }

    /// The stream the next operation on this thread runs on.
    pub fn current() -> Result<Stream> {
        with_current(|s| Ok(s.clone_handle()))
    }

    /// Runs operations of this thread on this stream until the returned guard is dropped.
    pub fn enter(&self) -> StreamScope {
        let handle = self.clone_handle();
        CURRENT.with(|c| c.borrow_mut().scopes.push(handle));
        StreamScope { _not_send: PhantomData }
    }

    /// The device this stream runs on.
    pub fn device_type(&self) -> DeviceType {
        let mut dev = Device::cpu();
        // SAFETY: `dev.raw` is a valid handle to overwrite and `self.raw` a live stream.
        match call(|| unsafe { sys::mlx_stream_get_device(&mut dev.raw, self.raw) }) {
            Ok(()) => dev.device_type(),
            Err(_) => DeviceType::Cpu,
        }
    }

    /// Whether the next operation on this thread runs on the GPU (custom kernels run only there).
    pub(crate) fn current_is_gpu() -> bool {
        Stream::current().is_ok_and(|s| s.device_type() == DeviceType::Gpu)
    }

    /// Waits for all work queued on this stream.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: `self.raw` is a live stream handle.
        call(|| unsafe { sys::mlx_synchronize(self.raw) })?;
        Ok(())
    }

    pub(crate) fn raw(&self) -> sys::mlx_stream {
        self.raw
    }

    fn clone_handle(&self) -> Stream {
        // SAFETY: creating an empty stream handle has no preconditions; freed in `Drop`.
        let mut copy = Stream { raw: unsafe { sys::mlx_stream_new() }, _not_send: PhantomData };
        // SAFETY: both handles are live; `mlx_stream_set` copies the stream value.
        call(|| unsafe { sys::mlx_stream_set(&mut copy.raw, self.raw) })
            .expect("mlx_stream_set copies a value and cannot fail on live handles");
        copy
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: `self.raw` is owned by this value and freed exactly once.
        unsafe { sys::mlx_stream_free(self.raw) };
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream({:?})", self.device_type())
    }
}

/// Guard returned by [`Stream::enter`]: while it lives, this thread's operations run on that
/// stream. Scopes nest; dropping restores the previous stream.
#[must_use = "the stream is current only while the guard lives"]
pub struct StreamScope {
    _not_send: PhantomData<*const ()>,
}

impl Drop for StreamScope {
    fn drop(&mut self) {
        CURRENT.with(|c| {
            c.borrow_mut().scopes.pop();
        });
    }
}

#[derive(Default)]
struct Current {
    scopes: Vec<Stream>,
    /// This thread's default stream of the default device, looked up once.
    default: Option<Stream>,
}

thread_local! {
    static CURRENT: RefCell<Current> = RefCell::new(Current::default());
}

/// Calls `f` with this thread's current stream.
pub(crate) fn with_current<T>(f: impl FnOnce(&Stream) -> Result<T>) -> Result<T> {
    let stream = CURRENT.with(|c| -> Result<Option<Stream>> {
        let mut c = c.borrow_mut();
        if let Some(top) = c.scopes.last() {
            return Ok(Some(top.clone_handle()));
        }
        if c.default.is_none() {
            c.default = Some(Stream::default_for(&Device::default_device()?)?);
        }
        Ok(None)
    })?;
    match stream {
        Some(s) => f(&s),
        None => CURRENT.with(|c| {
            let c = c.borrow();
            f(c.default.as_ref().expect("default stream was set above"))
        }),
    }
}

/// Bytes of device memory MLX holds for live arrays.
pub fn active_memory() -> Result<usize> {
    let mut bytes = 0usize;
    // SAFETY: `bytes` is a valid out-pointer.
    call(|| unsafe { sys::mlx_get_active_memory(&mut bytes) })?;
    Ok(bytes)
}

/// The most bytes of device memory MLX has held for live arrays since the process started or
/// the last [`reset_peak_memory`].
pub fn peak_memory() -> Result<usize> {
    let mut bytes = 0usize;
    // SAFETY: `bytes` is a valid out-pointer.
    call(|| unsafe { sys::mlx_get_peak_memory(&mut bytes) })?;
    Ok(bytes)
}

/// Starts [`peak_memory`] again from the memory held now.
pub fn reset_peak_memory() -> Result<()> {
    // SAFETY: no preconditions.
    call(|| unsafe { sys::mlx_reset_peak_memory() })?;
    Ok(())
}

/// Waits until everything queued on this thread's default stream has run, and then frees MLX's
/// cache of released buffers. A program that ran MLX work ends through
/// [`exit_process`](crate::exit_process), which calls this first: on MLX's CUDA back-end,
/// returning from `main` runs MLX's C++ static destructors while the CUDA driver shuts down, and
/// they abort the process.
pub fn synchronize() -> Result<()> {
    // SAFETY: no preconditions; it waits on the default stream of the calling thread.
    call(|| unsafe { sys::mlx_synchronize_default() })?;
    clear_cache()
}

/// Frees MLX's cache of released buffers.
pub fn clear_cache() -> Result<()> {
    // SAFETY: no preconditions.
    call(|| unsafe { sys::mlx_clear_cache() })?;
    Ok(())
}

/// Seeds MLX's global random generator for this thread (used by operations given no seed).
pub fn seed(seed: u64) -> Result<()> {
    // SAFETY: no preconditions.
    call_value(|| unsafe { sys::mlx_random_seed(seed) })?;
    Ok(())
}
