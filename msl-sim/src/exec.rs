//! Running a compiled kernel executable: the binary input/output files and
//! the subprocess. The file formats are described in `cpp/runtime.cpp`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::tensor::HostTensor;
use crate::{io_err, SimError};

/// A private scratch directory, removed on drop.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new() -> Result<Self, SimError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "msl-sim-run-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        Ok(ScratchDir(dir))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn encode_input(grid: [usize; 3], threadgroup: [usize; 3], inputs: &[HostTensor], outputs: &[HostTensor]) -> Vec<u8> {
    let size: usize = inputs.iter().chain(outputs).map(|t| t.data.len() + 16 * t.shape.len() + 16).sum();
    let mut f = Vec::with_capacity(64 + size);
    f.extend_from_slice(b"MSLSIMI1");
    for v in grid.iter().chain(&threadgroup) {
        f.extend_from_slice(&(*v as u64).to_le_bytes());
    }
    f.extend_from_slice(&(inputs.len() as u32).to_le_bytes());
    for t in inputs {
        f.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
        for &d in &t.shape {
            f.extend_from_slice(&(d as i32).to_le_bytes());
        }
        for s in t.strides() {
            f.extend_from_slice(&s.to_le_bytes());
        }
        f.extend_from_slice(&(t.data.len() as u64).to_le_bytes());
        f.extend_from_slice(&t.data);
    }
    f.extend_from_slice(&(outputs.len() as u32).to_le_bytes());
    for t in outputs {
        f.extend_from_slice(&(t.data.len() as u64).to_le_bytes());
        f.extend_from_slice(&t.data);
    }
    f
}

fn decode_output(bytes: &[u8], outputs: &mut [HostTensor]) -> Result<(), String> {
    let mut p = 0usize;
    let mut take = |n: usize| -> Result<&[u8], String> {
        let s = bytes.get(p..p + n).ok_or("output file is truncated")?;
        p += n;
        Ok(s)
    };
    if take(8)? != b"MSLSIMO1" {
        return Err("output file has a bad magic number".into());
    }
    let n = u32::from_le_bytes(take(4)?.try_into().unwrap()) as usize;
    if n != outputs.len() {
        return Err(format!("output file has {n} outputs, expected {}", outputs.len()));
    }
    for t in outputs.iter_mut() {
        let len = u64::from_le_bytes(take(8)?.try_into().unwrap()) as usize;
        if len != t.data.len() {
            return Err(format!("output of {len} bytes, expected {}", t.data.len()));
        }
        t.data.copy_from_slice(take(len)?);
    }
    Ok(())
}

/// Optional wall-clock limit for one kernel run, from `MSL_SIM_TIMEOUT_S`.
fn timeout() -> Option<Duration> {
    std::env::var("MSL_SIM_TIMEOUT_S")
        .ok()?
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0)
        .map(Duration::from_secs_f64)
}

/// Runs `exe` on the inputs; `outputs` carry the initial contents in and the
/// results out.
pub(crate) fn execute(
    exe: &Path,
    kernel_name: &str,
    grid: [usize; 3],
    threadgroup: [usize; 3],
    inputs: &[HostTensor],
    outputs: &mut [HostTensor],
) -> Result<(), SimError> {
    let dir = ScratchDir::new()?;
    let input_path = dir.0.join("input.bin");
    let output_path = dir.0.join("output.bin");
    let stderr_path = dir.0.join("stderr.txt");
    std::fs::write(&input_path, encode_input(grid, threadgroup, inputs, outputs))
        .map_err(io_err(format!("writing {}", input_path.display())))?;
    let stderr_file =
        std::fs::File::create(&stderr_path).map_err(io_err(format!("creating {}", stderr_path.display())))?;

    let mut child = Command::new(exe)
        .arg(&input_path)
        .arg(&output_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr_file)
        .spawn()
        .map_err(io_err(format!("starting {}", exe.display())))?;
    let status = match timeout() {
        None => child.wait().map_err(io_err("waiting for the kernel process".into()))?,
        Some(limit) => {
            let start = Instant::now();
            loop {
                if let Some(status) = child.try_wait().map_err(io_err("waiting for the kernel process".into()))? {
                    break status;
                }
                if start.elapsed() > limit {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(SimError::Runtime {
                        kernel: kernel_name.to_string(),
                        message: format!(
                            "the kernel ran longer than MSL_SIM_TIMEOUT_S ({} s) and was killed",
                            limit.as_secs_f64()
                        ),
                    });
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    };
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    if !status.success() {
        let mut message = stderr.trim().to_string();
        if message.is_empty() {
            message = format!("the kernel process failed ({status}) without a message");
        }
        return Err(SimError::Runtime { kernel: kernel_name.to_string(), message });
    }
    let bytes = std::fs::read(&output_path).map_err(io_err(format!("reading {}", output_path.display())))?;
    decode_output(&bytes, outputs).map_err(|m| SimError::Runtime { kernel: kernel_name.to_string(), message: m })
}
