//! Opening the files a user names (safetensors files, configs, shard indexes, ring hostfiles):
//! regular files only. A FIFO, a device, a socket or a directory is refused before anything is
//! read from it. The open itself does not block: it asks for non-blocking mode, which keeps a
//! FIFO without a writer from hanging the caller and changes nothing for a regular file.

use std::fs::{File, OpenOptions};
use std::path::Path;

use crate::error::{Error, Result};

/// Opens `path` for reading, refusing an empty path and anything but a regular file (symbolic
/// links are followed). The refusal is an [`Error::Artifact`] naming the file and what it is.
pub fn open_regular_file(path: impl AsRef<Path>) -> Result<File> {
    let path = path.as_ref();
    if path.as_os_str().is_empty() {
        return Err(Error::invalid("empty path: name a file"));
    }
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(|e| Error::io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::artifact(path, None, format!("is not a regular file ({})", file_kind(&meta))));
    }
    Ok(file)
}

/// What kind of file `meta` describes, for messages.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO or pipe";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "not a plain file"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_open() {
        let dir = std::env::temp_dir().join(format!("mlx-trellis-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("f");
        std::fs::write(&file, b"x").unwrap();
        open_regular_file(&file).unwrap();
        let e = open_regular_file(&dir).unwrap_err().to_string();
        assert!(e.contains("is not a regular file (a directory)"), "{e}");
        assert!(open_regular_file("").unwrap_err().to_string().contains("empty path"));
        #[cfg(unix)]
        {
            let e = open_regular_file("/dev/null").unwrap_err().to_string();
            assert!(e.contains("/dev/null: is not a regular file (a device)"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
