//! Keeping every file an artifact reads inside its model directory: a shard index entry or a
//! symbolic link must not make the loader read `../elsewhere` or `/etc/...`.

use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};

/// Checks a file name from the shard index before it is ever joined to a path: relative, and
/// made of plain names only (no `..`, `.`, root or drive prefix).
pub(super) fn check_shard_name(index: &Path, tensor: &str, name: &str) -> Result<()> {
    let refuse = |why: &str| Err(Error::artifact(index, Some(tensor), format!("shard file {name:?} {why}")));
    if name.is_empty() {
        return refuse("is empty");
    }
    if name.contains('\0') {
        return refuse("contains a NUL byte");
    }
    let path = Path::new(name);
    if path.is_absolute() || path.has_root() {
        return refuse("is an absolute path; shards must lie in the model directory");
    }
    if !path.components().all(|c| matches!(c, Component::Normal(_))) {
        return refuse("is not a plain relative path (no \"..\" or \".\"); shards must lie in the model directory");
    }
    Ok(())
}

/// The model directory resolved once (symbolic links followed), the prefix every file read must
/// keep.
#[derive(Debug, Clone)]
pub(super) struct ModelRoot {
    /// The directory as given (for messages and joins).
    pub(super) dir: PathBuf,
    /// Its canonical form.
    canonical: PathBuf,
}

impl ModelRoot {
    /// Resolves `dir`, which must be a directory.
    pub(super) fn new(dir: &Path) -> Result<ModelRoot> {
        if dir.as_os_str().is_empty() {
            return Err(Error::invalid("empty path: name the model directory"));
        }
        let canonical = std::fs::canonicalize(dir).map_err(|e| Error::io(dir, e))?;
        if !canonical.is_dir() {
            return Err(Error::artifact(dir, None, "is not a directory (a model directory holds config.json)"));
        }
        Ok(ModelRoot { dir: dir.to_path_buf(), canonical })
    }

    /// `dir/name`, checked to resolve (through any symbolic link) to a file inside the model
    /// directory. `referrer` and `key` say where the name came from, for the error.
    pub(super) fn file(&self, name: &str, referrer: &Path, key: Option<&str>) -> Result<PathBuf> {
        let path = self.dir.join(name);
        let resolved = std::fs::canonicalize(&path).map_err(|e| Error::io(&path, e))?;
        if !resolved.starts_with(&self.canonical) {
            let message = format!(
                "{name:?} resolves to {}, outside the model directory {}",
                resolved.display(),
                self.canonical.display()
            );
            return Err(Error::artifact(referrer, key, message));
        }
        if !resolved.is_file() {
            return Err(Error::artifact(referrer, key, format!("{name:?} is not a regular file")));
        }
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_must_be_plain_relative_paths() {
        let index = Path::new("/m/model.safetensors.index.json");
        for ok in ["model-00001-of-00002.safetensors", "sub/model.safetensors"] {
            check_shard_name(index, "w", ok).unwrap();
        }
        for (bad, why) in [
            ("../outside/model.safetensors", "not a plain relative path"),
            ("a/../../b", "not a plain relative path"),
            ("./model.safetensors", "not a plain relative path"),
            ("/etc/passwd", "absolute path"),
            ("", "is empty"),
            ("a\0b", "NUL"),
        ] {
            let e = check_shard_name(index, "w", bad).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Artifact);
            assert!(e.to_string().contains(why), "{bad:?}: {e}");
            assert!(e.to_string().starts_with("/m/model.safetensors.index.json: \"w\": shard file"), "{e}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn symbolic_links_out_of_the_directory_are_refused() {
        let base = std::env::temp_dir().join(format!("mlx-trellis-paths-{}", std::process::id()));
        let (model, outside) = (base.join("model"), base.join("outside"));
        std::fs::create_dir_all(&model).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret.safetensors"), b"x").unwrap();
        std::fs::write(model.join("inside.safetensors"), b"x").unwrap();
        std::os::unix::fs::symlink(outside.join("secret.safetensors"), model.join("link.safetensors")).unwrap();
        std::os::unix::fs::symlink("inside.safetensors", model.join("ok-link.safetensors")).unwrap();
        let root = ModelRoot::new(&model).unwrap();
        let index = model.join("model.safetensors.index.json");
        assert_eq!(root.file("inside.safetensors", &index, None).unwrap(), model.join("inside.safetensors"));
        root.file("ok-link.safetensors", &index, None).unwrap();
        let e = root.file("link.safetensors", &index, Some("w")).unwrap_err();
        assert!(e.to_string().contains("outside the model directory"), "{e}");
        assert_eq!(root.file("missing.safetensors", &index, None).unwrap_err().kind(), crate::ErrorKind::Io);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
