//! CUDA kernel text handed to MLX as `#include` lines of files, not as text.
//!
//! MLX's CUDA back-end copies a custom kernel's whole source into a new string at every
//! application and hashes all of it at every evaluation (its module cache key), so every KB of
//! text cost host time on every call (docs/cuda-down.md, "Registration and launch", has the
//! measurements). NVRTC reads `#include "/absolute/path"` from the file system,
//! and an include line may stand anywhere, the kernel body included, so a kernel's header and
//! body are written once to content-addressed files and MLX gets one line for each. The
//! compiled kernel is the same (the preprocessor hands NVRTC the same tokens), and compile errors
//! name the lines of the text as written.
//!
//! The files live in `MLX_TRELLIS_CUDA_SOURCE_DIR`, or by default in a folder of the user's own
//! under the temporary directory, which must be owned by the user and writable by no one else
//! (the files become kernel code). Where no file can be written, or with
//! `MLX_TRELLIS_INLINE_CUDA_SOURCE=1`, MLX gets the (compacted) text itself, as before.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use super::compact::compact_cuda_source;

/// The environment variable naming the folder of the files (created if missing).
const DIR_VAR: &str = "MLX_TRELLIS_CUDA_SOURCE_DIR";
/// The environment variable that, set to `1`, hands MLX the text itself.
const INLINE_VAR: &str = "MLX_TRELLIS_INLINE_CUDA_SOURCE";

/// Text shorter than this goes inline: its include line would save nothing worth a file.
const MIN_FILE_BYTES: usize = 256;

/// What MLX gets for `header`, the text before a kernel: an `#include` line of a file holding
/// exactly it, or, where no such file can be written, the compacted text itself.
pub(crate) fn mlx_header(header: &str) -> String {
    mlx_text(header, &[])
}

/// What MLX gets for `body`, a kernel body taking `inputs`: as [`mlx_header`], and an include line
/// names the shape arguments the body reads. MLX passes an input's `_shape`, `_strides` and
/// `_ndim` only to a body whose text contains them, and it searches the text it gets.
pub(crate) fn mlx_body(body: &str, inputs: &[String]) -> String {
    let read: Vec<String> = inputs
        .iter()
        .flat_map(|name| ["_shape", "_strides", "_ndim"].map(|suffix| format!("{name}{suffix}")))
        .filter(|argument| body.contains(argument.as_str()))
        .collect();
    mlx_text(body, &read)
}

fn mlx_text(text: &str, arguments_read: &[String]) -> String {
    if text.len() >= MIN_FILE_BYTES {
        if let Some(mut line) = source_dir().and_then(|dir| include_line(dir, text)) {
            if !arguments_read.is_empty() {
                line.push_str(&format!("// reads {}\n", arguments_read.join(" ")));
            }
            return line;
        }
    }
    compact_cuda_source(text)
}

/// The folder of the files, checked once per process; `None`: text goes inline.
fn source_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        if std::env::var_os(INLINE_VAR).is_some_and(|v| v == "1") {
            return None;
        }
        let dir = match std::env::var_os(DIR_VAR) {
            // NVRTC resolves a relative include against its own search paths, not ours.
            Some(d) if !d.is_empty() => std::path::absolute(d).ok()?,
            _ => std::env::temp_dir().join(format!("mlx-trellis-{}-cuda", user_id()?)),
        };
        private_dir(&dir).then_some(dir)
    })
    .as_deref()
}

/// `#include "<dir>/<sha-256 of text>.cuh"` after writing the file if it is missing; `None` where
/// the path cannot stand in an include line or the file cannot be written.
fn include_line(dir: &Path, text: &str) -> Option<String> {
    let digest = Sha256::digest(text.as_bytes());
    let name: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    let path = dir.join(format!("{name}.cuh"));
    let spelled = path.to_str().filter(|p| p.starts_with('/') && !p.contains(['"', '\\', '\n', '\r']))?;
    if fs::read(&path).ok().as_deref() != Some(text.as_bytes()) {
        write_atomically(dir, &path, text).ok()?;
    }
    // The line ends the text before it and starts its own (MLX puts it after a header or a
    // signature line and before more text).
    Some(format!("\n#include \"{spelled}\"\n"))
}

/// Writes `text` to `path` through a temporary file in `dir` renamed over it, so a reader (another
/// process compiling the same kernel) never sees part of it.
fn write_atomically(dir: &Path, path: &Path, text: &str) -> std::io::Result<()> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(
        ".{}.{}.{nanos}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("f"),
        std::process::id()
    ));
    let written = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_data()));
    let renamed = written.and_then(|()| fs::rename(&tmp, path));
    if renamed.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    renamed
}

/// Creates `dir` if missing and tells whether it is a folder owned by this user that no one else
/// may write to.
#[cfg(unix)]
fn private_dir(dir: &Path) -> bool {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let _ = fs::DirBuilder::new().recursive(true).mode(0o700).create(dir);
    let Ok(meta) = fs::symlink_metadata(dir) else { return false };
    meta.is_dir() && Some(meta.uid()) == user_id() && meta.permissions().mode() & 0o022 == 0
}

#[cfg(not(unix))]
fn private_dir(_dir: &Path) -> bool {
    false
}

#[cfg(unix)]
fn user_id() -> Option<u32> {
    // SAFETY: getuid has no preconditions and cannot fail.
    Some(unsafe { libc::getuid() })
}

#[cfg(not(unix))]
fn user_id() -> Option<u32> {
    None
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mlx-trellis-include-test-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn text_becomes_one_include_line_of_a_file_holding_exactly_it() {
        let dir = scratch("line");
        assert!(private_dir(&dir));
        let text = "// a kernel body\nint a = 1;\n".repeat(20);
        let line = include_line(&dir, &text).expect("a private folder takes files");
        let path = line.trim().strip_prefix("#include \"").and_then(|l| l.strip_suffix('"')).expect(&line);
        assert_eq!(line.matches('\n').count(), 2, "{line:?}");
        assert_eq!(fs::read_to_string(path).unwrap(), text);
        // Content-addressed: the same text, the same file; other text, another file.
        assert_eq!(include_line(&dir, &text).unwrap(), line);
        assert_ne!(include_line(&dir, &format!("{text} ")).unwrap(), line);
        // A file changed behind our back is written again before it is named.
        fs::write(path, "tampered").unwrap();
        assert_eq!(include_line(&dir, &text).unwrap(), line);
        assert_eq!(fs::read_to_string(path).unwrap(), text);
        // No temporary files are left.
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 2);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn folders_others_may_write_to_are_refused() {
        let dir = scratch("open");
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!private_dir(&dir));
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        assert!(private_dir(&dir));
        // A file is not a folder.
        let file = dir.join("file");
        fs::write(&file, "x").unwrap();
        assert!(!private_dir(&file));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn paths_that_cannot_stand_in_an_include_line_are_refused() {
        let dir = scratch("quote\"d");
        assert!(private_dir(&dir));
        assert_eq!(include_line(&dir, &"x".repeat(300)), None);
        assert_eq!(include_line(Path::new("relative"), &"x".repeat(300)), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn short_text_goes_inline_compacted() {
        assert_eq!(mlx_header("int a; // why\n"), "int a;\n");
    }

    #[test]
    fn a_body_names_the_shape_arguments_it_reads() {
        let body = format!("int n = x_shape[0] + w_ndim;\n{}", "int a;\n".repeat(64));
        let inputs = ["x", "w", "v"].map(String::from);
        let text = mlx_body(&body, &inputs);
        // Only where the folder takes files (the default one is private to this user).
        if text.contains("#include") {
            for (argument, read) in [("x_shape", true), ("w_ndim", true), ("x_strides", false), ("v_shape", false)] {
                assert_eq!(text.contains(argument), read, "{argument}: {text:?}");
            }
        } else {
            assert_eq!(text, compact_cuda_source(&body));
        }
    }
}
