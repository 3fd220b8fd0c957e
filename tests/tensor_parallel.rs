//! Tensor parallelism across processes on the CPU: MLX's ring back-end over loopback TCP, the
//! ranks being this test binary started again (`--ignored --exact rank`) by the library's launcher
//! (`mlx_trellis::distributed::launcher`) under its watchdog.
//!
//! - 2 and 3 processes give the one-process MLP's output (f32 within the reassociation gate,
//!   bf16 within one bf16 rounding per rank and addition) for the 3-bit interleaved and the 2-bit
//!   row-major down layouts, every rank holds the same sum, all_gather, all_max and all_min give
//!   the ranks' values, and the ring refuses to split;
//! - a rank whose shard is malformed or missing fails with an error that names it, and the
//!   launcher stops the other ranks at once (they would otherwise wait for it forever), well
//!   inside the launch's time limit;
//! - forming a group without the environment is an error that names the variables.
//!
//! The launches run one at a time (they share two CPU cores and pick loopback ports).

mod common;

use std::process::Command;
use std::rc::Rc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::mlp_artifact::{mlp_case, poison_scale, temp_dir, write_mlps, F32_REASSOCIATION};
use common::to_f64;
use mlx_trellis::distributed::launcher as tp;
use mlx_trellis::distributed::{bf16_tp_gate, env, CollectiveBackend, Group, ShardedMlp};
use mlx_trellis::trellis::reference::rel_err;
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::{Artifact, CodeLayout, ForwardPath};
use mlx_trellis::{load_safetensors, save_safetensors, Dtype, MlxArray};

const PREFIX: &str = "model.layers.0.mlp";
const HIDDEN: usize = 512;
const INTER: usize = 768;
const ROWS: usize = 3;
/// The most one launch may take; a healthy one takes about a second.
const LAUNCH_LIMIT: Duration = Duration::from_secs(90);
/// The model directory a rank loads (the launch's tests may give one rank another).
const MODEL: &str = "TP_TEST_MODEL";
/// Which case a `group_child` process checks.
const GROUP_CASE: &str = "TP_TEST_GROUP_CASE";

static ONE_LAUNCH_AT_A_TIME: Mutex<()> = Mutex::new(());

fn x(dtype: Dtype) -> MlxArray {
    MlxArray::from_slice(&gaussian(ROWS * HIDDEN, 1234).unwrap(), &[ROWS, HIDDEN]).unwrap().astype(dtype).unwrap()
}

/// This test binary as rank `r` of a launch, loading the model in `models[r]`.
fn rank_command(models: Vec<String>) -> impl Fn(usize) -> Command {
    move |r| {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args(["--ignored", "--exact", "rank", "--nocapture", "--test-threads", "1"]).env(MODEL, &models[r]);
        c
    }
}

/// A launch of one rank per entry of `models` (rank `r` loads `models[r]`) under the launcher's
/// watchdog, itself watched: the test fails rather than hangs if the launcher does not return
/// within its limit and a margin.
fn launch(models: Vec<String>) -> tp::Report {
    let _one = ONE_LAUNCH_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let n = models.len();
    let mut l = tp::Launch::new(n, CollectiveBackend::Ring, LAUNCH_LIMIT);
    l.echo = false;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(tp::run(&l, &rank_command(models)).map_err(|e| format!("{e:#}"))));
    match rx.recv_timeout(LAUNCH_LIMIT + Duration::from_secs(30)) {
        Ok(report) => report.unwrap(),
        Err(_) => panic!("the launcher of {n} ranks did not return within its limit"),
    }
}

/// A rank: forms the group from the launcher's environment, loads its shard of the MLP (only
/// its rows), runs it on the tests' activations and writes `y` (f32 and bf16) to the launch's
/// directory.
#[test]
#[ignore = "a rank of the tensor-parallel tests' launches, which start it (it does nothing alone)"]
fn rank() {
    let Some(joined) = tp::rank_group() else {
        eprintln!("not started by the launcher: nothing to do");
        return;
    };
    let run = || -> anyhow::Result<()> {
        let (group, out) = joined?;
        let group = Rc::new(group);
        let art = Artifact::open(std::env::var(MODEL)?)?;
        let mlp = ShardedMlp::from_artifact(&art, PREFIX, group.clone())?;
        let y32 = mlp.forward(&x(Dtype::Float32), ForwardPath::Generic)?;
        let y16 = mlp.forward(&x(Dtype::Bfloat16), ForwardPath::Generic)?;
        // The other collectives on small arrays: [r, -r] from rank r.
        let r = group.rank() as f32;
        let mine = MlxArray::from_slice(&[r, -r], &[1, 2])?;
        let (gathered, max, min) = (mine.all_gather(&group)?, mine.all_max(&group)?, mine.all_min(&group)?);
        // MLX 0.32's ring cannot split a group.
        let split = group.split(0, None).map(|_| ()).unwrap_err();
        anyhow::ensure!(split.kind() == mlx_trellis::ErrorKind::Mlx, "split: {split}");
        let path = out.join(format!("rank{}.safetensors", group.rank()));
        let tensors = [("y32", &y32), ("y16", &y16), ("gathered", &gathered), ("max", &max), ("min", &min)];
        save_safetensors(path, tensors, &Default::default())?;
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("rank failed: {e:#}");
        std::process::exit(1);
    }
}

#[test]
fn two_and_three_processes_give_the_one_process_output() {
    let (mut worst, mut worst16): (f64, f64) = (0.0, 0.0);
    for (k, layout) in [(3, CodeLayout::K3Interleaved), (2, CodeLayout::RowMajor)] {
        let c = mlp_case(PREFIX, HIDDEN, INTER, k, layout, 70 + k as u64);
        let dir = temp_dir(&format!("tp-k{k}"));
        write_mlps(&dir, &[(PREFIX, &c.mlp)]);
        let want32 = to_f64(&c.mlp.forward_with(&x(Dtype::Float32), ForwardPath::Generic).unwrap());
        let want16 = to_f64(&c.mlp.forward_with(&x(Dtype::Bfloat16), ForwardPath::Generic).unwrap());
        for n in [2, 3] {
            let t = Instant::now();
            let report = launch(vec![dir.display().to_string(); n]);
            report.check().unwrap_or_else(|e| panic!("k {k}, {n} ranks: {e:#}"));
            let ys: Vec<_> = (0..n)
                .map(|r| load_safetensors(report.out.join(format!("rank{r}.safetensors"))).unwrap().tensors)
                .collect();
            for (r, y) in ys.iter().enumerate() {
                let err32 = rel_err(&to_f64(&y["y32"]), &want32).unwrap();
                let err16 = rel_err(&to_f64(&y["y16"]), &want16).unwrap();
                worst = worst.max(err32);
                worst16 = worst16.max(err16);
                assert!(err32 < F32_REASSOCIATION, "k {k} rank {r} of {n}: f32 relErr {err32:.2e}");
                assert!(err16 < bf16_tp_gate(n), "k {k} rank {r} of {n}: bf16 relErr {err16:.2e}");
                // The all-reduce leaves the same sum on every rank.
                assert_eq!(to_f64(&y["y32"]), to_f64(&ys[0]["y32"]), "k {k} rank {r} of {n}");
                // all_gather stacks the ranks' [r, -r] in rank order; all_max and all_min.
                let gathered: Vec<f64> = (0..n).flat_map(|q| [q as f64, -(q as f64)]).collect();
                assert_eq!((y["gathered"].shape(), to_f64(&y["gathered"])), (vec![n, 2], gathered));
                let last = (n - 1) as f64;
                assert_eq!((to_f64(&y["max"]), to_f64(&y["min"])), (vec![last, 0.0], vec![0.0, -last]));
            }
            println!("k {k}, {n} ranks: launch {:.2} s", t.elapsed().as_secs_f64());
            let _ = std::fs::remove_dir_all(&report.out);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
    println!("ranks against one process (generic path): worst relErr f32 {worst:.2e}, bf16 {worst16:.2e}");
}

/// Asserts that rank `bad` failed by itself with an error containing every one of `want`, and
/// that the launcher stopped the other ranks soon after, inside the time limit.
fn assert_named_failure(report: &tp::Report, bad: usize, want: &[&str]) {
    let text = format!("{report:#?}");
    assert!(report.failures.contains(&bad), "rank {bad} did not fail by itself: {text}");
    let stderr = &report.ranks[bad].stderr;
    for w in want {
        assert!(stderr.contains(w), "rank {bad}'s error lacks {w:?}: {stderr}");
    }
    assert!(!report.timed_out && report.elapsed < LAUNCH_LIMIT / 3, "{text}");
    let err = format!("{:#}", report.check().unwrap_err());
    assert!(err.contains("the launcher stopped the rest"), "{err}");
    for r in &report.ranks {
        assert!(!r.succeeded(), "rank {} finished without rank {bad}: {text}", r.rank);
        // Nobody outlived the failure by more than the watchdog's reaction.
        let after = r.elapsed.saturating_sub(report.ranks[bad].elapsed);
        assert!(after < Duration::from_secs(5), "rank {} ended {after:?} after rank {bad}", r.rank);
    }
}

#[test]
fn a_rank_whose_shard_is_broken_fails_naming_it_and_the_others_are_stopped() {
    let c = mlp_case(PREFIX, HIDDEN, INTER, 3, CodeLayout::K3Interleaved, 91);
    let dir = temp_dir("tp-broken");
    write_mlps(&dir, &[(PREFIX, &c.mlp)]);
    // Malformed: a NaN scale among rank 1's rows of down (rows 256..512 of 768 for 3 ranks).
    // Ranks 0 and 2 never read it.
    let scales = format!("{PREFIX}.down_proj.scales");
    poison_scale(&dir, &scales, 300);
    let file = dir.join("model.safetensors").display().to_string();
    let report = launch(vec![dir.display().to_string(); 3]);
    assert_named_failure(&report, 1, &[&file, &scales, "stored row 300 is NaN", "rank 1 of 3"]);
    let _ = std::fs::remove_dir_all(&report.out);
    // Missing: rank 2 is given a model directory whose safetensors file is absent (the others a
    // sound one).
    write_mlps(&dir, &[(PREFIX, &c.mlp)]);
    let empty = temp_dir("tp-missing");
    std::fs::copy(dir.join("config.json"), empty.join("config.json")).unwrap();
    let empty_dir = empty.display().to_string();
    let sound = dir.display().to_string();
    let report = launch(vec![sound.clone(), sound, empty_dir.clone()]);
    assert_named_failure(&report, 2, &[&empty_dir, "neither model.safetensors nor"]);
    let _ = std::fs::remove_dir_all(&report.out);
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&empty).unwrap();
}

/// A process that forms groups with the environment its parent gave it and checks the errors.
#[test]
#[ignore = "started by `forming_a_group_without_its_environment_names_the_variables` with a cleared environment"]
fn group_child() {
    let Ok(case) = std::env::var(GROUP_CASE) else {
        eprintln!("not started by the group test: nothing to do");
        return;
    };
    let err = |b: CollectiveBackend| Group::init(b, true).unwrap_err();
    match case.as_str() {
        "none" => {
            let e = err(CollectiveBackend::Ring);
            assert_eq!(e.kind(), mlx_trellis::ErrorKind::InvalidArgument);
            assert!(e.to_string().contains("missing: MLX_RANK, MLX_HOSTFILE"), "{e}");
            assert!(err(CollectiveBackend::Any).to_string().contains("ring: MLX_RANK, MLX_HOSTFILE"));
            if mlx_trellis::backend() != mlx_trellis::Backend::Cuda {
                assert!(err(CollectiveBackend::Nccl).to_string().contains("has no nccl back-end"));
            }
            // Not strict: this process alone.
            let g = Group::init(CollectiveBackend::Ring, false).unwrap();
            assert_eq!((g.rank(), g.size(), g.backend()), (0, 1, None));
            let y = MlxArray::from_slice(&[2.0f32], &[1]).unwrap().all_sum(&g).unwrap();
            assert_eq!(y.to_vec::<f32>().unwrap(), [2.0]);
        }
        "partial" => {
            let e = Group::init(CollectiveBackend::Ring, false).unwrap_err().to_string();
            assert!(e.contains("missing: MLX_HOSTFILE") && e.contains("MLX_RANK = \"1\""), "{e}");
        }
        "one" => {
            let e = err(CollectiveBackend::Ring).to_string();
            assert!(e.contains("needs at least two"), "{e}");
        }
        other => panic!("unknown case {other}"),
    }
    println!("group case {case}: checked");
}

#[test]
fn forming_a_group_without_its_environment_names_the_variables() {
    let dir = temp_dir("tp-group");
    let one = dir.join("one.json");
    std::fs::write(&one, r#"[["127.0.0.1:29999"]]"#).unwrap();
    for (case, vars) in [
        ("none", vec![]),
        ("partial", vec![(env::MLX_RANK, "1".to_string())]),
        ("one", vec![(env::MLX_RANK, "0".to_string()), (env::MLX_HOSTFILE, one.display().to_string())]),
    ] {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args(["--ignored", "--exact", "group_child", "--nocapture"]).env(GROUP_CASE, case);
        for v in [CollectiveBackend::Ring, CollectiveBackend::Nccl, CollectiveBackend::Mpi]
            .iter()
            .flat_map(|&b| env::variables(b))
        {
            c.env_remove(v);
        }
        c.envs(vars);
        let out = c.output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.contains(&format!("group case {case}: checked")), "{case}: {text}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
