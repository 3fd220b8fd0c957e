//! The one registry of kernel objects. Every kernel family registers its kernels here: a kernel
//! is built once per [`KernelKey`] (its family, the variant of its source and the launch
//! parameters MLX fixes at registration), kept for the life of the process, and returned to
//! every later call without building any text. Launches look kernels up under a shared read
//! lock; the first caller of a key builds it under the write lock, and callers racing it wait and
//! get the same kernel.
//!
//! [`LaunchCache`] is the bounded twin for values derived per call shape (a CUDA launch checked
//! and converted for MLX once).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, LazyLock, Mutex, OnceLock, PoisonError, RwLock};

use crate::error::Result;

use super::cuda::{CudaKernel, LaunchBounds};
use super::metal::MetalKernel;
use super::source::{fnv1a, KernelSource};

/// What identifies one registered kernel. The caller guarantees that the same key always
/// describes the same text: the family names a kernel file (or section), the variant the source
/// variant cut from it, `shared_memory` the dynamic shared memory a CUDA kernel is registered
/// with (MLX takes it at registration; 0 for Metal kernels), and `launch_bounds` the bounds a
/// CUDA kernel is compiled with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct KernelKey {
    /// The kernel family (its file or section), e.g. `"down_factored_row"`.
    pub family: &'static str,
    /// The source variant, e.g. `"fragment"`; `""` where a family has one.
    pub variant: &'static str,
    /// Dynamic shared memory in bytes (CUDA); 0 for Metal.
    pub shared_memory: usize,
    /// CUDA's `__launch_bounds__` of the kernel; `None` leaves ptxas its own register count.
    pub launch_bounds: Option<LaunchBounds>,
}

impl KernelKey {
    /// A key of a family with one source variant, no dynamic shared memory and no launch bounds.
    pub const fn of(family: &'static str) -> KernelKey {
        KernelKey { family, variant: "", shared_memory: 0, launch_bounds: None }
    }

    /// The MLX kernel name of `text` under this key: MLX caches compiled kernels by name (plus
    /// the template arguments), never by text, so the name carries a hash of the text.
    fn name(&self, parts: &[&str]) -> String {
        let variant = if self.variant.is_empty() { String::new() } else { format!("_{}", self.variant) };
        format!("mlx_trellis_{}{variant}_{:016x}", self.family, fnv1a(parts))
    }
}

/// The text of a kernel to register: argument names, body and header (built only on a miss).
pub(crate) struct KernelText {
    /// Input names, in `apply` order.
    pub inputs: &'static [&'static str],
    /// Output names, in `apply` order.
    pub outputs: &'static [&'static str],
    /// The kernel body.
    pub body: String,
    /// Text before the kernel.
    pub header: String,
}

impl KernelText {
    fn source(&self, key: &KernelKey) -> KernelSource {
        KernelSource::new(&key.name(&[&self.body, &self.header]), self.inputs, self.outputs, &self.body)
            .with_header(&self.header)
    }
}

/// The kernels of one back-end by key: read-locked at every launch, write-locked only to register.
type Kernels<K> = RwLock<HashMap<KernelKey, &'static K>>;

static METAL: LazyLock<Kernels<MetalKernel>> = LazyLock::new(Default::default);
static CUDA: LazyLock<Kernels<CudaKernel>> = LazyLock::new(Default::default);

/// The kernel registered under `key` in `kernels`, built by `build` under the write lock on first
/// use (kernel objects are descriptions: building one copies strings, compiles nothing).
fn get_or_build<K: Sync>(
    kernels: &'static Kernels<K>,
    key: KernelKey,
    build: impl FnOnce() -> Result<K>,
) -> Result<&'static K> {
    if let Some(&k) = kernels.read().unwrap_or_else(PoisonError::into_inner).get(&key) {
        return Ok(k);
    }
    let mut map = kernels.write().unwrap_or_else(PoisonError::into_inner);
    // Another caller may have registered it between the two locks.
    if let Some(&k) = map.get(&key) {
        return Ok(k);
    }
    // Leaked on purpose: a registered kernel lives as long as the process, like MLX's own cache
    // of the compiled kernel it names.
    let k: &'static K = Box::leak(Box::new(build()?));
    map.insert(key, k);
    Ok(k)
}

/// The Metal kernel of `key`, registered from `text()` on first use.
pub(crate) fn metal(key: KernelKey, text: impl FnOnce() -> Result<KernelText>) -> Result<&'static MetalKernel> {
    get_or_build(&METAL, key, || MetalKernel::new(text()?.source(&key), false))
}

/// The CUDA kernel of `key` (with `key.shared_memory` bytes of dynamic shared memory),
/// registered from `text()` on first use. Fails on an MLX build without CUDA.
pub(crate) fn cuda(key: KernelKey, text: impl FnOnce() -> Result<KernelText>) -> Result<&'static CudaKernel> {
    get_or_build(&CUDA, key, || {
        let mut text = text()?;
        if let Some(bounds) = key.launch_bounds {
            text.header.push_str(&bounds.header());
        }
        CudaKernel::new(text.source(&key), key.shared_memory)
    })
}

/// A bounded cache of values built once per key (for example a launch configuration converted for
/// MLX once per geometry, plan, row count and dtype). A runner that calls with very many keys
/// rebuilds from scratch now and then instead of growing without bound.
pub(crate) struct LaunchCache<K, V> {
    map: OnceLock<Mutex<HashMap<K, Arc<V>>>>,
    capacity: usize,
}

impl<K: Eq + Hash, V> LaunchCache<K, V> {
    /// An empty cache of at most `capacity` entries.
    pub const fn new(capacity: usize) -> Self {
        LaunchCache { map: OnceLock::new(), capacity }
    }

    /// The value of `key`, built by `build` on a miss. `build` runs outside the lock (two threads
    /// may build the same value; one of them is kept).
    pub fn get_or_build(&self, key: K, build: impl FnOnce() -> Result<V>) -> Result<Arc<V>> {
        let map = self.map.get_or_init(Default::default);
        if let Some(v) = map.lock().unwrap_or_else(PoisonError::into_inner).get(&key) {
            return Ok(Arc::clone(v));
        }
        let value = Arc::new(build()?);
        let mut map = map.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= self.capacity {
            map.clear();
        }
        Ok(Arc::clone(map.entry(key).or_insert(value)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    use super::*;

    fn text() -> KernelText {
        KernelText { inputs: &["x"], outputs: &["y"], body: "y[0] = x[0];".into(), header: String::new() }
    }

    /// Eight threads ask for the same kernel at once: one builds it, all get the same object.
    #[test]
    fn concurrent_first_use_builds_one_kernel() {
        const KEY: KernelKey = KernelKey::of("registry_test_concurrent");
        let builds = AtomicUsize::new(0);
        let barrier = Barrier::new(8);
        let kernels: Vec<usize> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        let k = metal(KEY, || {
                            builds.fetch_add(1, Ordering::SeqCst);
                            Ok(text())
                        })
                        .unwrap();
                        k as *const MetalKernel as usize
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        assert!(kernels.iter().all(|&k| k == kernels[0]));
    }

    #[test]
    fn keys_that_differ_get_their_own_kernels_and_names() {
        let a = metal(KernelKey { variant: "a", ..KernelKey::of("registry_test_keys") }, || Ok(text())).unwrap();
        let b = metal(KernelKey { variant: "b", ..KernelKey::of("registry_test_keys") }, || Ok(text())).unwrap();
        assert!(!std::ptr::eq(a, b));
        assert!(a.source().name.starts_with("mlx_trellis_registry_test_keys_a_"), "{}", a.source().name);
        // A failed build registers nothing, and the next call may build.
        let key = KernelKey::of("registry_test_failure");
        assert!(metal(key, || Err(crate::Error::invalid("no text"))).is_err());
        assert!(metal(key, || Ok(text())).is_ok());
    }

    #[test]
    fn the_launch_cache_is_bounded_and_shares_values() {
        let cache: LaunchCache<u32, u32> = LaunchCache::new(2);
        let a = cache.get_or_build(1, || Ok(10)).unwrap();
        let again = cache.get_or_build(1, || panic!("built twice")).unwrap();
        assert!(Arc::ptr_eq(&a, &again));
        cache.get_or_build(2, || Ok(20)).unwrap();
        cache.get_or_build(3, || Ok(30)).unwrap(); // over capacity: starts afresh
        assert_eq!(*cache.get_or_build(1, || Ok(11)).unwrap(), 11);
    }
}
