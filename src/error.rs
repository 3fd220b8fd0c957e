//! [`Error`]: every failure the library reports, as an enum a model runner can match on.
//!
//! Failures MLX reports keep MLX's message ([`Error::Mlx`]); calls this crate refuses before
//! reaching MLX are [`Error::InvalidArgument`]; a geometry, layout, dtype or row count that the
//! chosen kernels do not serve is [`Error::Unserved`], so a caller can fall back to another path;
//! files are [`Error::Io`] and [`Error::Artifact`], naming the file and, where known, the tensor or
//! key. [`Error::Context`] adds what was being done; [`Error::root`] and [`Error::kind`] see
//! through it. `Error` implements [`std::error::Error`], so `anyhow` users keep `?` and context.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of failure an [`Error`] is at its root (see [`Error::kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`Error::Mlx`].
    Mlx,
    /// [`Error::InvalidArgument`].
    InvalidArgument,
    /// [`Error::Unserved`].
    Unserved,
    /// [`Error::Io`].
    Io,
    /// [`Error::Artifact`].
    Artifact,
    /// [`Error::Launch`].
    Launch,
}

/// A failure reported by MLX or caught by this crate's own checks.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// MLX (through mlx-c) reported the failure; the message is MLX's.
    Mlx {
        /// MLX's message.
        message: String,
    },
    /// A call this crate refused before reaching MLX: a wrong length, dtype, shape or value.
    InvalidArgument {
        /// What was wrong.
        message: String,
    },
    /// A geometry, layout, dtype or row count that the requested kernels do not serve. Nothing
    /// ran; another path (for example [`ForwardPath::Generic`](crate::trellis::ForwardPath)) can.
    Unserved {
        /// What is not served, and by which kernels.
        message: String,
    },
    /// Reading or writing a file failed.
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: Arc<std::io::Error>,
    },
    /// A model artifact (config, index or safetensors file) is malformed or lacks something.
    Artifact {
        /// The file.
        file: PathBuf,
        /// The tensor or key concerned, where there is one.
        key: Option<String>,
        /// What is wrong with it.
        message: String,
    },
    /// A local tensor-parallel launch ([`launcher`](crate::distributed::launcher)) failed: a
    /// rank failed or was stopped, the launch passed its time limit, or its processes could not
    /// be watched.
    Launch {
        /// What happened, with the failed rank's last words where there is one.
        message: String,
    },
    /// `source`, which happened while doing `context`.
    Context {
        /// What was being done.
        context: String,
        /// The failure.
        source: Box<Error>,
    },
}

impl Error {
    /// An [`Error::InvalidArgument`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidArgument { message: message.into() }
    }

    /// An [`Error::Unserved`].
    pub fn unserved(message: impl Into<String>) -> Self {
        Error::Unserved { message: message.into() }
    }

    /// An [`Error::Artifact`] about `file` (and `key`, if any).
    pub fn artifact(file: impl AsRef<Path>, key: Option<&str>, message: impl Into<String>) -> Self {
        Error::Artifact { file: file.as_ref().to_path_buf(), key: key.map(str::to_string), message: message.into() }
    }

    /// An [`Error::Io`] about `path`.
    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        Error::Io { path: path.as_ref().to_path_buf(), source: Arc::new(source) }
    }

    pub(crate) fn mlx(message: impl Into<String>) -> Self {
        Error::Mlx { message: message.into() }
    }

    pub(crate) fn launch(message: impl Into<String>) -> Self {
        Error::Launch { message: message.into() }
    }

    /// This error with `context` (what was being done) around it.
    pub fn context(self, context: impl fmt::Display) -> Self {
        Error::Context { context: context.to_string(), source: Box::new(self) }
    }

    /// The error under every [`Error::Context`].
    pub fn root(&self) -> &Error {
        let mut e = self;
        while let Error::Context { source, .. } = e {
            e = source;
        }
        e
    }

    /// The kind of [`Error::root`].
    pub fn kind(&self) -> ErrorKind {
        match self.root() {
            Error::Mlx { .. } => ErrorKind::Mlx,
            Error::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            Error::Unserved { .. } => ErrorKind::Unserved,
            Error::Io { .. } => ErrorKind::Io,
            Error::Artifact { .. } => ErrorKind::Artifact,
            Error::Launch { .. } => ErrorKind::Launch,
            Error::Context { .. } => unreachable!("root() sees through every context"),
        }
    }

    /// The root's own message, without contexts (MLX's text for [`Error::Mlx`]).
    pub fn message(&self) -> String {
        match self.root() {
            Error::Mlx { message }
            | Error::InvalidArgument { message }
            | Error::Unserved { message }
            | Error::Launch { message } => message.clone(),
            Error::Artifact { message, .. } => message.clone(),
            Error::Io { source, .. } => source.to_string(),
            Error::Context { .. } => unreachable!("root() sees through every context"),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Mlx { message } => write!(f, "MLX: {message}"),
            Error::InvalidArgument { message } | Error::Unserved { message } | Error::Launch { message } => {
                f.write_str(message)
            }
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Artifact { file, key: Some(key), message } => write!(f, "{}: {key:?}: {message}", file.display()),
            Error::Artifact { file, key: None, message } => write!(f, "{}: {message}", file.display()),
            Error::Context { context, source } => write!(f, "{context}: {source}"),
        }
    }
}

/// Every variant's text carries what is under it (a context its source's, an I/O error the
/// operating system's), so `source()` is `None` throughout: `anyhow`'s `{:#}` prints each part
/// once. The operating system's error stays reachable through [`Error::Io`]'s field.
impl std::error::Error for Error {}

/// Context for the library's own results (`anyhow::Context`'s twin, inside the crate).
pub(crate) trait ErrorContext<T> {
    /// Wraps an error in [`Error::Context`].
    fn context(self, context: impl fmt::Display) -> Result<T>;
    /// Wraps an error in [`Error::Context`], built only on failure.
    fn with_context<C: fmt::Display>(self, context: impl FnOnce() -> C) -> Result<T>;
}

impl<T> ErrorContext<T> for Result<T> {
    fn context(self, context: impl fmt::Display) -> Result<T> {
        self.map_err(|e| e.context(context))
    }

    fn with_context<C: fmt::Display>(self, context: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|e| e.context(context()))
    }
}

/// Returns early with an [`Error::InvalidArgument`] built from a format string.
macro_rules! invalid {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::invalid(format!($($arg)*)))
    };
}
pub(crate) use invalid;

/// Returns early with an [`Error::Unserved`] built from a format string.
macro_rules! unserved {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::unserved(format!($($arg)*)))
    };
}
pub(crate) use unserved;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_source_and_kind_sees_through_context() {
        assert_eq!(Error::mlx("boom").to_string(), "MLX: boom");
        assert_eq!(Error::invalid("bad shape").to_string(), "bad shape");
        let e = Error::unserved("no kernel for k = 9").context("layer down_proj").context("the MLP");
        assert_eq!(e.to_string(), "the MLP: layer down_proj: no kernel for k = 9");
        assert_eq!(e.kind(), ErrorKind::Unserved);
        assert_eq!(e.message(), "no kernel for k = 9");
        assert!(matches!(e.root(), Error::Unserved { .. }));
        let a = Error::artifact("/m/config.json", Some("quantization"), "not an object");
        assert_eq!(a.to_string(), "/m/config.json: \"quantization\": not an object");
        assert_eq!(a.kind(), ErrorKind::Artifact);
    }

    #[test]
    fn io_errors_print_the_os_error_once_in_anyhow() {
        let os = std::io::Error::from(std::io::ErrorKind::NotFound).to_string();
        let e = Error::io("/nope", std::io::Error::from(std::io::ErrorKind::NotFound));
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound));
        let bare = format!("{:#}", anyhow::Error::new(e.clone()));
        assert_eq!(bare, format!("/nope: {os}"));
        let any = anyhow::Error::new(e.context("opening the model"));
        let text = format!("{any:#}");
        assert!(text.starts_with("opening the model: /nope: "), "{text}");
        assert_eq!(text.matches(os.as_str()).count(), 1, "{text}");
    }
}
