//! What a launch leaves when its launcher is killed or told to stop, and how long a group that
//! cannot form may wait. The processes involved are this test binary started again
//! (`--ignored --exact NAME`): a launcher of two sleeping ranks, and a rank that tries to form a
//! ring whose other ranks never come.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mlx_trellis::distributed::launcher as tp;
use mlx_trellis::distributed::{env, CollectiveBackend, Group, MLX_TRELLIS_SETUP_TIMEOUT};

/// Where the sleeping ranks write their process ids.
const PIDS: &str = "LIFECYCLE_TEST_PIDS";

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn this_test(name: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--ignored", "--exact", name, "--nocapture", "--test-threads", "1"]);
    c
}

/// Whether process `pid` still runs (a zombie does not).
fn runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')))
}

/// Waits until `done()` or `limit` passes; whether it became true.
fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    done()
}

/// The output of `child` once it ends, killing it if it runs past `limit`.
fn finish(mut child: Child, limit: Duration) -> (Output, bool) {
    let ended = wait_until(limit, || child.try_wait().unwrap().is_some());
    if !ended {
        let _ = child.kill();
    }
    (child.wait_with_output().unwrap(), ended)
}

/// The launch directories of process `pid`.
fn launch_dirs(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("mlx-trellis-tp-{pid}-");
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

/// A launcher of two sleeping ranks, its directory and the ranks' process ids once both run.
fn start_launcher(pids: &Path) -> (Child, Vec<u32>) {
    let _ = std::fs::remove_dir_all(pids);
    std::fs::create_dir_all(pids).unwrap();
    let launcher = this_test("launcher_of_sleepers")
        .env(PIDS, pids)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let read = || -> Vec<u32> {
        (0..2)
            .filter_map(|r| std::fs::read_to_string(pids.join(format!("rank{r}"))).ok()?.trim().parse().ok())
            .collect()
    };
    assert!(wait_until(Duration::from_secs(60), || read().len() == 2), "the ranks did not start");
    (launcher, read())
}

#[test]
fn ranks_die_with_a_killed_launcher_and_the_next_launch_removes_its_folder() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let pids = std::env::temp_dir().join(format!("mlx-trellis-lifecycle-kill-{}", std::process::id()));
    let (mut launcher, ranks) = start_launcher(&pids);
    let launcher_pid = launcher.id();
    assert_eq!(launch_dirs(launcher_pid).len(), 1);
    launcher.kill().unwrap(); // SIGKILL: nothing of the launcher runs
    launcher.wait().unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || ranks.iter().all(|&p| !runs(p))),
        "ranks {ranks:?} outlived their launcher"
    );
    // Its folder stays until a later launch (or anyone) sweeps folders of dead launchers.
    assert_eq!(launch_dirs(launcher_pid).len(), 1);
    assert!(tp::remove_stale_dirs("mlx-trellis-tp") >= 1);
    assert!(launch_dirs(launcher_pid).is_empty());
    std::fs::remove_dir_all(&pids).unwrap();
}

#[test]
fn a_terminated_launcher_stops_its_ranks_and_removes_its_folder() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let pids = std::env::temp_dir().join(format!("mlx-trellis-lifecycle-term-{}", std::process::id()));
    let (launcher, ranks) = start_launcher(&pids);
    let launcher_pid = launcher.id();
    let sent = Command::new("kill").args(["-TERM", &launcher_pid.to_string()]).status().unwrap();
    assert!(sent.success());
    let (out, ended) = finish(launcher, Duration::from_secs(10));
    assert!(ended, "the launcher did not end on SIGTERM");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("the launcher received SIGTERM"), "{stderr}");
    assert!(ranks.iter().all(|&p| !runs(p)), "ranks {ranks:?} outlived their launcher");
    assert!(launch_dirs(launcher_pid).is_empty(), "the launch's folder was left behind");
    std::fs::remove_dir_all(&pids).unwrap();
}

/// A launcher of two ranks that sleep (each writes its process id first). Started by the tests.
#[test]
#[ignore = "started by the lifecycle tests (a launcher that waits on sleeping ranks)"]
fn launcher_of_sleepers() {
    let pids = std::env::var(PIDS).unwrap();
    let launch = tp::Launch::new(2, CollectiveBackend::Ring, Duration::from_secs(120));
    let report = tp::run(&launch, &|_| {
        let mut c = this_test("sleeping_rank");
        c.env(PIDS, &pids);
        c
    });
    eprintln!("{:#}", report.and_then(|r| r.check()).unwrap_err());
    std::process::exit(3);
}

/// A rank that writes its process id and sleeps. Started by `launcher_of_sleepers`.
#[test]
#[ignore = "started by the lifecycle tests' launcher (a rank that sleeps)"]
fn sleeping_rank() {
    let rank = std::env::var(env::MLX_RANK).unwrap();
    let pids = PathBuf::from(std::env::var(PIDS).unwrap());
    std::fs::write(pids.join(format!("rank{rank}")), std::process::id().to_string()).unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

/// Tries to form a ring from the environment. Started by the set-up tests.
#[test]
#[ignore = "started by the set-up tests (a rank whose group never forms)"]
fn ring_rank() {
    let group = Group::init(CollectiveBackend::Ring, true);
    eprintln!("init returned: {group:?}");
}

/// A hostfile of `n` free loopback ports; returns its path and the addresses.
fn hostfile(dir: &Path, n: usize) -> (PathBuf, Vec<String>) {
    let addresses: Vec<String> = tp::free_ports(n).unwrap().iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let list: Vec<Vec<&String>> = addresses.iter().map(|a| vec![a]).collect();
    let path = dir.join(format!("hostfile-{n}.json"));
    std::fs::write(&path, serde_json::to_string(&list).unwrap()).unwrap();
    (path, addresses)
}

fn ring_rank_process(rank: usize, hostfile: &Path) -> Child {
    this_test("ring_rank")
        .env(env::MLX_RANK, rank.to_string())
        .env(env::MLX_HOSTFILE, hostfile)
        .env(MLX_TRELLIS_SETUP_TIMEOUT, "3")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_group_that_cannot_form_ends_in_time_naming_what_it_waited_for() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = std::env::temp_dir().join(format!("mlx-trellis-lifecycle-setup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Three ranks in the hostfile, two started.
    let (three, addresses) = hostfile(&dir, 3);
    let started: Vec<Child> = (0..2).map(|r| ring_rank_process(r, &three)).collect();
    for (r, child) in started.into_iter().enumerate() {
        let (out, ended) = finish(child, Duration::from_secs(40));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(ended, "rank {r} of a ring missing a rank still waits: {stderr}");
        assert_eq!(out.status.code(), Some(2), "rank {r}: {stderr}");
        assert!(
            stderr.contains(&format!("rank {r} of 3 (ring")) && stderr.contains(&addresses[r]),
            "rank {r}: {stderr}"
        );
    }
    // Two processes that both claim rank 0.
    let (two, addresses) = hostfile(&dir, 2);
    let both: Vec<Child> = (0..2).map(|_| ring_rank_process(0, &two)).collect();
    for child in both {
        let (out, ended) = finish(child, Duration::from_secs(40));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(ended, "a rank 0 of a ring with two rank 0s still waits: {stderr}");
        assert_ne!(out.status.code(), Some(0), "{stderr}");
        assert!(stderr.contains("rank 0 of 2 (ring") && stderr.contains(&addresses[0]), "{stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
