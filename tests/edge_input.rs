//! Bad input of a second kind: files left from another model, output paths, special files and
//! messages that must name the real cause. One test per class; each fails without its fix.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use mlx_trellis::trellis::encoder::{encode_linear, EncoderConfig};
use mlx_trellis::trellis::{check_artifact_dir, synthetic_layer, write_artifact, Artifact, CodeLayout, TrellisLinear};
use mlx_trellis::{load_safetensors, save_safetensors, ErrorKind, MlxArray};

mod common;

const DOWN: &str = "model.layers.0.mlp.down_proj";

fn temp_dir(tag: &str) -> std::path::PathBuf {
    common::mlp_artifact::temp_dir(&format!("edge-{tag}"))
}

fn layer(seed: u64) -> TrellisLinear {
    let host = synthetic_layer(16, 512, 3, 12, 0, CodeLayout::RowMajor, 0.02, seed).unwrap();
    TrellisLinear::from_host(DOWN, &host).unwrap()
}

fn codes_of(l: &TrellisLinear) -> Vec<u32> {
    l.to_host().unwrap().codes
}

/// Runs `f` on another thread and gives its result, or `None` when it has not returned within
/// `limit` (it then stays blocked; the test fails on the `None`).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

#[test]
fn files_left_from_another_model_never_win() {
    let dir = temp_dir("stale");
    let old = layer(1);
    write_artifact(&dir, &[(DOWN, &old)], &[]).unwrap();
    // An older sharded model's index (and its shard) in the same directory.
    std::fs::copy(dir.join("model.safetensors"), dir.join("old-00001-of-00001.safetensors")).unwrap();
    let index = serde_json::json!({ "weight_map": {
        format!("{DOWN}.weight"): "old-00001-of-00001.safetensors",
        format!("{DOWN}.scales"): "old-00001-of-00001.safetensors",
    }});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    // Writing a new artifact there is refused, naming the index, before anything is written.
    let new = layer(2);
    let e = write_artifact(&dir, &[(DOWN, &new)], &[]).unwrap_err().to_string();
    assert!(e.contains("model.safetensors.index.json") && e.contains("left from another model"), "{e}");
    assert_eq!(codes_of(&Artifact::open(&dir).unwrap().module(DOWN).unwrap()), codes_of(&old));
    // Once the index is gone, the new artifact is what loads.
    std::fs::remove_file(dir.join("model.safetensors.index.json")).unwrap();
    write_artifact(&dir, &[(DOWN, &new)], &[]).unwrap();
    assert_eq!(codes_of(&Artifact::open(&dir).unwrap().module(DOWN).unwrap()), codes_of(&new));
    let leftovers: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");

    // An index with an empty weight_map does not fall back to model.safetensors.
    std::fs::write(dir.join("model.safetensors.index.json"), r#"{"weight_map": {}}"#).unwrap();
    let e = Artifact::open(&dir).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Artifact);
    assert!(e.to_string().contains("weight_map") && e.to_string().contains("is empty"), "{e}");
    // An index naming a file that is not there is refused when the artifact is opened.
    let index = serde_json::json!({ "weight_map": { format!("{DOWN}.weight"): "gone.safetensors" } });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let e = Artifact::open(&dir).unwrap_err().to_string();
    assert!(e.contains("\"gone.safetensors\" cannot be read"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn safetensors_go_to_the_path_given() {
    let dir = temp_dir("out-path");
    let y = MlxArray::from_slice(&[1f32, 2.0, 3.0], &[3]).unwrap();
    let path = dir.join("y.st");
    std::fs::write(&path, b"stale").unwrap();
    save_safetensors(&path, [("y", &y)], &Default::default()).unwrap();
    assert!(!dir.join("y.st.safetensors").exists(), "MLX's extension was appended");
    let back = load_safetensors(&path).unwrap();
    assert_eq!(back.tensors["y"].to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0]);
    let names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["y.st"]);
    // A failed write leaves the old file and no temporary one.
    let e = save_safetensors(&dir, [("y", &y)], &Default::default()).unwrap_err().to_string();
    assert!(e.contains("is a directory"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Makes a FIFO at `path` with the system's `mkfifo`.
fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("mkfifo runs");
    assert!(status.success(), "mkfifo {}", path.display());
}

#[cfg(unix)]
#[test]
fn special_files_are_refused_without_blocking() {
    let dir = temp_dir("fifo");
    let fifo = dir.join("x.safetensors");
    mkfifo(&fifo);
    for path in [fifo.clone(), "/dev/zero".into(), "/dev/null".into()] {
        let shown = path.display().to_string();
        let e = within(Duration::from_secs(10), move || load_safetensors(&path).map(|_| ()))
            .unwrap_or_else(|| panic!("loading {shown} blocked"))
            .unwrap_err();
        assert!(e.to_string().contains("is not a regular file"), "{shown}: {e}");
    }
    // A pipe, as the shell's `<(cat f)` gives one.
    let mut cat =
        Command::new("sh").args(["-c", "sleep 30 | cat"]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let pipe = format!("/proc/self/fd/{}", cat.stdout.as_ref().unwrap().as_raw_fd());
        let e = within(Duration::from_secs(10), move || load_safetensors(&pipe).map(|_| ()))
            .expect("loading a pipe blocked")
            .unwrap_err();
        assert!(e.to_string().contains("is not a regular file (a FIFO or pipe)"), "{e}");
    }
    let _ = cat.kill();
    let _ = cat.wait();
    // A model directory whose config or index is a FIFO.
    let model = dir.join("model");
    write_artifact(&model, &[(DOWN, &layer(1))], &[]).unwrap();
    mkfifo(&model.join("model.safetensors.index.json"));
    let m = model.clone();
    let e = within(Duration::from_secs(10), move || Artifact::open(&m).map(|_| ())).expect("open blocked").unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn messages_name_the_real_cause() {
    let e = Artifact::open("").unwrap_err().to_string();
    assert!(e.contains("empty path"), "{e}");
    let e = load_safetensors("").unwrap_err().to_string();
    assert!(e.contains("empty path"), "{e}");
    // A config.json that cannot be looked at is not called missing.
    let dir = temp_dir("messages");
    write_artifact(&dir, &[(DOWN, &layer(1))], &[]).unwrap();
    std::fs::remove_file(dir.join("config.json")).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink("config.json", dir.join("config.json")).unwrap();
    let e = Artifact::open(&dir).unwrap_err().to_string();
    assert!(!e.contains("has no config.json") && e.contains("config.json"), "{e}");
    // An unreadable model directory (only where permissions bind: not for root).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let locked = temp_dir("locked");
        write_artifact(&locked, &[(DOWN, &layer(1))], &[]).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
        if std::fs::read_dir(&locked).is_err() {
            let e = Artifact::open(&locked).unwrap_err().to_string();
            assert!(e.contains("cannot be read") && e.contains("ermission denied"), "{e}");
        } else {
            eprintln!("permissions do not bind for this user: the unreadable-directory case is not exercised");
        }
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::remove_dir_all(&locked).unwrap();
    }
    // A linear weight whose coded axis is too short names that axis in the layer's terms.
    let cfg = EncoderConfig::new(3, 12);
    let e = encode_linear(&vec![0.5f32; 4 * 512], 4, 512, &cfg).unwrap_err().to_string();
    assert!(e.contains("out_features = 4") && e.contains("output features"), "{e}");
    let e = cfg.check_linear(512, 4).map(|()| "accepted".to_string()).unwrap_or_else(|e| e.to_string());
    assert_eq!(e, "accepted", "axis 0 codes along the output features; 4 input features are fine");
    let axis1 = EncoderConfig { axis: 1, ..cfg };
    let e = axis1.check_linear(512, 4).unwrap_err().to_string();
    assert!(e.contains("in_features = 4") && e.contains("input features"), "{e}");
    // An output "directory" that is a file is refused before any work.
    let file = dir.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    for e in [
        check_artifact_dir(&file).unwrap_err().to_string(),
        write_artifact(&file, &[(DOWN, &layer(1))], &[]).unwrap_err().to_string(),
    ] {
        assert!(e.contains("is not a directory"), "{e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
