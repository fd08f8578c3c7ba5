//! The daemon's start-up contract: `daemon.json`, stale and corrupt files, the single-daemon
//! lock, port selection, unusable homes, and the orphan sweep.
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::{SendExt, TestHome, ports, procs, service_in};
use secrecy::ExposeSecret;

const SERVICES: [&str; 4] = ["store", "retrieval", "chat", "gateway"];

/// Asserts that every supervised service is listed healthy with a live pid.
fn assert_all_healthy(status: &serde_json::Value) -> anyhow::Result<()> {
    for name in SERVICES {
        let s = service_in(status, name)?;
        ensure!(s["state"] == "healthy", "{name} is not healthy: {status}");
        let pid = s["pid"].as_i64().context("pid")? as i32;
        ensure!(procs::alive(pid), "{name} pid {pid} is not alive");
    }
    Ok(())
}

#[tokio::test]
async fn starts_and_writes_daemon_json() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;

    let json = home.daemon_json()?;
    let obj = json.as_object().context("daemon.json is an object")?;
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["pid", "port", "socket", "started_at", "token", "version"], "{json}");
    assert_eq!(json["socket"], home.root().join("gateway.sock").display().to_string(), "the edge's socket");
    let token = json["token"].as_str().context("token")?;
    assert_eq!(token.len(), 64, "token length");
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "token is hex: {token}");
    assert_eq!(json["version"], coffer_runtime::VERSION);
    assert!(json["started_at"].as_str().is_some_and(|s| s.ends_with('Z') && s.len() == 24), "{json}");
    let port = json["port"].as_u64().context("port")? as u16;
    assert!((home.port()..home.port() + 5).contains(&port), "port {port} is in the home's range");
    let mode = std::fs::metadata(home.daemon_json_path())?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "daemon.json mode {mode:o}");

    let daemons = home.daemon_processes();
    assert_eq!(daemons.len(), 1, "one daemon: {daemons:?}");
    assert_eq!(json["pid"], daemons[0].pid);

    let health = api.health().await?;
    assert_eq!(health["pid"], json["pid"]);
    assert_eq!(health["status"], "ok");
    assert_eq!(health["started_at"], json["started_at"]);

    let status = api.status().await?;
    assert_eq!(status["daemon"]["pid"], json["pid"]);
    assert_eq!(status["daemon"]["port"], port);
    assert_all_healthy(&status)?;
    for name in SERVICES {
        assert_eq!(service_in(&status, name)?["restarts"], 0, "{name}");
    }
    Ok(())
}

#[tokio::test]
async fn replaces_corrupt_or_truncated_daemon_json() -> anyhow::Result<()> {
    let bodies: [&[u8]; 4] = [
        b"",
        b"{\"pid\": 12",
        b"\x00\xff garbage \x01",
        br#"{"pid":1,"port":8000,"token":"short","started_at":"","version":"0.0.0"}"#,
    ];
    for body in bodies {
        let home = TestHome::new()?;
        std::fs::create_dir_all(home.root())?;
        std::fs::write(home.daemon_json_path(), body)?;
        let api = home.start_daemon().await.with_context(|| format!("start over daemon.json {body:?}"))?;
        let info = home.daemon_info()?;
        assert_eq!(home.daemon_processes().iter().map(|p| p.pid as u32).collect::<Vec<_>>(), [info.pid]);
        assert_all_healthy(&api.status().await?)?;
    }
    Ok(())
}

#[tokio::test]
async fn replaces_daemon_json_naming_a_live_foreign_pid() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    std::fs::create_dir_all(home.root())?;
    // A well-formed daemon.json whose pid is alive (this test process) but which no daemon
    // backs: daemon.lock is not held, so it is stale.
    let me = std::process::id();
    let stale = serde_json::json!({
        "pid": me, "port": home.port(), "token": "ab".repeat(32),
        "started_at": "2020-01-01T00:00:00.000Z", "version": coffer_runtime::VERSION,
    });
    std::fs::write(home.daemon_json_path(), serde_json::to_vec(&stale)?)?;
    let api = home.start_daemon().await?;
    let info = home.daemon_info()?;
    assert_ne!(info.pid, me);
    assert_eq!(home.daemon_processes()[0].pid as u32, info.pid);
    assert_all_healthy(&api.status().await?)?;
    Ok(())
}

#[tokio::test]
async fn second_daemon_refuses_while_first_runs() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let before = std::fs::read(home.daemon_json_path())?;
    let first = home.daemon_processes();

    let second = home.run_daemon_to_exit(Duration::from_secs(30)).await?;
    assert_ne!(second.code(), Some(0), "second daemon must fail: {second:?}");
    assert!(second.code().is_some(), "second daemon exits rather than crashes: {second:?}");
    assert!(
        second.stderr.contains("another coffer-daemon is already running"),
        "stderr names the running daemon: {:?}",
        second.stderr
    );

    assert_eq!(std::fs::read(home.daemon_json_path())?, before, "daemon.json unchanged");
    assert_eq!(home.daemon_processes(), first, "the first daemon alone keeps running");
    assert_all_healthy(&api.status().await?)?;
    Ok(())
}

#[tokio::test]
async fn preferred_port_taken_uses_next_free_port() -> anyhow::Result<()> {
    let p = ports::free_port_block(6);
    let _squatter = std::net::TcpListener::bind(("127.0.0.1", p))?;
    let home = TestHome::builder().port_range(p, p + 5).build()?;
    let api = home.start_daemon().await?;
    let port = home.daemon_info()?.port;
    assert!(port > p && port <= p + 5, "daemon took {port}, expected in {}-{}", p + 1, p + 5);
    assert_eq!(api.port(), port);
    assert_all_healthy(&api.status().await?)?;
    Ok(())
}

#[tokio::test]
async fn exact_port_taken_is_a_clear_error() -> anyhow::Result<()> {
    let p = ports::free_port();
    let _squatter = std::net::TcpListener::bind(("127.0.0.1", p))?;
    let home = TestHome::builder().port(p).build()?;
    let out = home.run_daemon_to_exit(Duration::from_secs(30)).await?;
    assert_eq!(out.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains(&p.to_string()), "stderr names port {p}: {:?}", out.stderr);
    assert!(out.stderr.contains("COFFER_PORT"), "stderr names COFFER_PORT: {:?}", out.stderr);
    assert!(!home.daemon_json_path().exists(), "no daemon.json");
    home.wait_no_processes(Duration::from_secs(5)).await?;
    Ok(())
}

/// Homes that cannot be created even by root (tests run as root, so permission bits are no
/// obstacle): a path below a regular file, and a regular file in place of the directory.
#[tokio::test]
async fn unusable_home_is_a_clear_error() -> anyhow::Result<()> {
    for (rel, file) in [("blocker/home", "blocker"), ("home-is-a-file", "home-is-a-file")] {
        let home = TestHome::builder().home_at(rel).build()?;
        std::fs::write(home.temp().join(file), b"not a directory")?;
        let out = home.run_daemon_to_exit(Duration::from_secs(30)).await?;
        assert_eq!(out.code(), Some(1), "{rel}: {out:?}");
        let root = home.root().display().to_string();
        assert!(out.stderr.contains(&root), "{rel}: stderr names {root}: {:?}", out.stderr);
        home.wait_no_processes(Duration::from_secs(5)).await?;
        assert!(home.temp().join(file).is_file(), "{rel}: the blocking file is untouched");
    }
    Ok(())
}

#[tokio::test]
async fn killed_supervisor_leaves_nothing_for_the_next_run() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    home.start_daemon().await?;
    let first_run = home.processes();
    let first_info = home.daemon_info()?;
    assert_eq!(first_run.len(), 5, "daemon and four services: {first_run:?}");
    let daemon = home.daemon_processes().pop().context("daemon")?;
    procs::signal(daemon.pid, nix::sys::signal::Signal::SIGKILL);

    // The next start may race the dying services (they die through their death signal); it
    // must cope either way.
    let api = home.start_daemon().await?;
    let info = home.daemon_info()?;
    assert_ne!(info.pid, first_info.pid, "daemon.json is the new run's");
    assert_ne!(info.token.expose_secret(), first_info.token.expose_secret(), "new token");
    let survivors: Vec<_> = first_run.iter().filter(|p| procs::still_alive(p)).collect();
    assert!(survivors.is_empty(), "processes of the first run still alive: {survivors:?}");
    assert_eq!(home.processes().len(), 5, "only the new run: {:?}", home.processes());
    assert_all_healthy(&api.status().await?)?;
    Ok(())
}

/// A child recorded in `upstream-pids/` that outlived its daemon (e.g. an upstream that ignored
/// its death signal) is killed by the next daemon's sweep; a record whose pid now belongs to
/// another process (start time differs) is left alone.
#[tokio::test]
async fn start_sweeps_recorded_orphans_but_not_recycled_pids() -> anyhow::Result<()> {
    use coffer_runtime::spawn::{PidRecord, process_start_time};
    use std::os::unix::process::CommandExt;

    let home = TestHome::new()?;
    std::fs::create_dir_all(home.pids_dir())?;
    // Plain processes on purpose: an orphan and a bystander for the sweep to tell apart.
    #[allow(clippy::disallowed_methods)]
    let mut orphan = std::process::Command::new("sleep").arg("300").process_group(0).spawn()?;
    // See above.
    #[allow(clippy::disallowed_methods)]
    let mut bystander = std::process::Command::new("sleep").arg("300").process_group(0).spawn()?;
    let write = |pid: u32, start_time: Option<u64>| -> anyhow::Result<()> {
        let rec = PidRecord { pid: pid as i32, start_time, kind: "upstream".into(), name: "orphan".into(), parent: 1 };
        std::fs::write(home.pids_dir().join(format!("{pid}.json")), serde_json::to_vec(&rec)?)?;
        Ok(())
    };
    write(orphan.id(), process_start_time(orphan.id() as i32))?;
    // The bystander's record carries a different start time: a recycled pid.
    write(bystander.id(), process_start_time(bystander.id() as i32).map(|t| t + 1))?;

    home.start_daemon().await?;
    let status = coffer_tests::wait_for("the orphan to be killed", Duration::from_secs(5), || {
        let exited = orphan.try_wait();
        async move { Ok(exited?) }
    })
    .await?;
    assert!(status.code().is_none(), "killed by a signal: {status:?}");
    assert!(bystander.try_wait()?.is_none(), "a process whose start time does not match is not killed");
    let records: Vec<i32> = home.pid_records().iter().map(|r| r.pid).collect();
    assert!(
        !records.contains(&(orphan.id() as i32)) && !records.contains(&(bystander.id() as i32)),
        "old records removed: {records:?}"
    );
    bystander.kill()?;
    bystander.wait()?;
    Ok(())
}

#[tokio::test]
async fn sigterm_stops_everything_and_removes_daemon_json() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    home.terminate_daemon(Duration::from_secs(15)).await?;
    assert!(!home.daemon_json_path().exists(), "daemon.json removed on stop");
    assert!(api.anon(reqwest::Method::GET, "/v1/health").reply().await.is_err(), "public port closed");
    assert!(home.pid_records().is_empty(), "pid records removed: {:?}", home.pid_records());
    Ok(())
}
