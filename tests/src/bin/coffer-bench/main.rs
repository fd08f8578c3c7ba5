//! `coffer-bench`: Coffer's benchmarks (apart from the tests). Every figure is printed beside a
//! baseline measured in the same run, with the ratio. Run with `./scripts/bench` (release
//! build); results are recorded in `docs/BENCHMARKS.md`.
//!
//! Measures: cold start (no daemon → `coffer status` answered), restart time of a killed
//! service, idle memory of all Coffer processes; `tools/call` of server-everything's `echo`
//! through shim → gateway → stdio upstream vs the same client calling the same upstream
//! directly over stdio (p50/p99 latency and calls/s with 1 and 16 in flight); gateway memory
//! with 100 sessions that each listed tools; time from no daemon to the first `tools/list`
//! answered through the shim; with 8 registered servers, time from no session to the first
//! `tools/list` through the shim, cold (nothing listed yet) and warm (the capability catalog
//! knows every server). Retrieval (`--only retrieval`, or `retrieval-quality` /
//! `retrieval-speed`): see `retrieval.rs`. Chat (`--only chat`): see `chat.rs`. The web console
//! (`--only ui`, headless Chromium): see `ui.rs`. The vault sandbox's spawn overhead (`--only
//! sandbox`, in this process, no daemon): see `sandbox.rs`.
#![allow(clippy::print_stdout)]

mod chat;
mod first_contact;
mod retrieval;
mod sandbox;
mod ui;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use coffer_tests::procs::status_kib;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::oneshot;

/// A minimal MCP client speaking newline-delimited JSON-RPC: over a child's stdio (used
/// identically for the direct baseline and for the path through the shim, so the ratio compares
/// transports, not clients), or over a `/mcp` stream without the shim.
struct StdioClient {
    _child: Option<tokio::process::Child>,
    stdin: tokio::sync::Mutex<Box<dyn tokio::io::AsyncWrite + Send + Unpin>>,
    pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>,
    next: AtomicU64,
}

impl StdioClient {
    async fn spawn(program: &Path, args: &[String], env: &[(String, String)]) -> Result<Self> {
        Self::spawn_with(program, args, env, json!({})).await
    }

    /// [`StdioClient::spawn`] declaring the client `capabilities` in its `initialize`.
    async fn spawn_with(
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        capabilities: Value,
    ) -> Result<Self> {
        // The benchmark launches its MCP client peer directly, as a client would.
        #[allow(clippy::disallowed_methods)]
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .envs(env.iter().cloned())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = cmd.spawn().with_context(|| format!("starting {}", program.display()))?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("stdout")?);
        Self::start(Some(child), Box::new(stdin), stdout, capabilities).await
    }

    /// Opens a `/mcp` stream (`Upgrade: coffer-mcp-stream`) on the daemon at `port`, through
    /// its Unix-domain `socket` when it has one (as the shim does).
    async fn stream(port: u16, token: &str, socket: Option<&Path>) -> Result<Self> {
        type Halves = (Box<dyn tokio::io::AsyncRead + Send + Unpin>, Box<dyn tokio::io::AsyncWrite + Send + Unpin>);
        let (read, mut write): Halves = match socket {
            Some(path) => {
                let (r, w) = tokio::net::UnixStream::connect(path).await?.into_split();
                (Box::new(r), Box::new(w))
            }
            None => {
                let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
                tcp.set_nodelay(true)?;
                let (r, w) = tcp.into_split();
                (Box::new(r), Box::new(w))
            }
        };
        let head = format!(
            "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: Upgrade\r\nUpgrade: coffer-mcp-stream\r\nX-Coffer-Token: {token}\r\n\r\n"
        );
        write.write_all(head.as_bytes()).await?;
        let mut read = BufReader::new(read);
        let mut status = String::new();
        read.read_line(&mut status).await?;
        if !status.starts_with("HTTP/1.1 101") {
            bail!("the /mcp stream upgrade was refused: {status}");
        }
        loop {
            let mut line = String::new();
            if read.read_line(&mut line).await? == 0 || line == "\r\n" {
                break;
            }
        }
        Self::start(None, Box::new(write), read, json!({})).await
    }

    async fn start<R>(
        child: Option<tokio::process::Child>,
        stdin: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
        stdout: BufReader<R>,
        capabilities: Value,
    ) -> Result<Self>
    where
        R: tokio::io::AsyncRead + Send + Unpin + 'static,
    {
        let pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>> = Arc::default();
        let p2 = pending.clone();
        tokio::spawn(async move {
            let mut lines = stdout.lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(v) = serde_json::from_str::<Value>(&line) else { continue };
                if v.get("method").is_some() {
                    continue;
                }
                if let Some(id) = v.get("id").and_then(Value::as_u64)
                    && let Some(tx) = p2.lock().expect("pending").remove(&id)
                {
                    let _ = tx.send(v);
                }
            }
        });
        let c = Self { _child: child, stdin: tokio::sync::Mutex::new(stdin), pending, next: AtomicU64::new(1) };
        let init = c
            .request("initialize", json!({"protocolVersion": "2025-11-25", "capabilities": capabilities, "clientInfo": {"name": "coffer-bench", "version": "1"}}))
            .await?;
        if init.get("result").is_none() {
            bail!("initialize failed: {init}");
        }
        c.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await?;
        Ok(c)
    }

    fn pid(&self) -> Option<u32> {
        self._child.as_ref()?.id()
    }

    async fn send(&self, v: Value) -> Result<()> {
        let mut s = self.stdin.lock().await;
        s.write_all(format!("{v}\n").as_bytes()).await?;
        s.flush().await?;
        Ok(())
    }

    async fn request(&self, method: &str, params: Value) -> Result<Value> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().expect("pending").insert(id, tx);
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await?;
        tokio::time::timeout(Duration::from_secs(60), rx).await.context("timeout")?.context("closed")
    }
}

/// Scheduler counters of a set of processes between [`CpuMeter::start`] and
/// [`CpuMeter::per_call`]: CPU time, time runnable but waiting for a CPU, and times scheduled
/// onto a CPU (`/proc/<pid>/task/*/schedstat`, its three fields).
struct CpuMeter<'a> {
    start: Vec<(&'a str, String, [u64; 3])>,
}

/// Per call, for one label: µs on a CPU, µs waiting for one, times put on one.
#[derive(Clone, Copy, Default)]
struct SchedPerCall {
    cpu_us: f64,
    wait_us: f64,
    runs: f64,
}

impl<'a> CpuMeter<'a> {
    fn start(procs: &[(&'a str, &str)]) -> Self {
        Self { start: procs.iter().map(|(label, pid)| (*label, (*pid).to_owned(), schedstat(pid))).collect() }
    }

    /// Counters per call for each label over `calls` calls (processes sharing a label summed).
    fn per_call(self, calls: usize) -> Vec<(&'a str, SchedPerCall)> {
        let mut out: Vec<(&'a str, SchedPerCall)> = Vec::new();
        for (label, pid, before) in self.start {
            let now = schedstat(&pid);
            let d = |i: usize| now[i].saturating_sub(before[i]) as f64 / calls as f64;
            let i = out.iter().position(|(l, _)| *l == label).unwrap_or_else(|| {
                out.push((label, SchedPerCall::default()));
                out.len() - 1
            });
            let v = &mut out[i].1;
            v.cpu_us += d(0) / 1e3;
            v.wait_us += d(1) / 1e3;
            v.runs += d(2);
        }
        out
    }
}

/// Latencies and wall time of one or more measured runs of a path.
#[derive(Default)]
struct Stats {
    lat: Vec<Duration>,
    wall: Duration,
}

impl Stats {
    /// Adds another run of the same path (rounds interleaved with the other paths).
    fn merge(&mut self, other: Stats) {
        self.lat.extend(other.lat);
        self.wall += other.wall;
    }

    fn pick_us(&self, q: f64) -> f64 {
        let mut lat = self.lat.clone();
        lat.sort();
        lat[((lat.len() as f64 - 1.0) * q).round() as usize].as_secs_f64() * 1e6
    }

    fn p50_us(&self) -> f64 {
        self.pick_us(0.50)
    }

    fn p99_us(&self) -> f64 {
        self.pick_us(0.99)
    }

    /// Calls per second over all runs.
    fn per_s(&self) -> f64 {
        self.lat.len() as f64 / self.wall.as_secs_f64()
    }
}

/// `total` calls made by `inflight` concurrent callers, each waiting for its answer before its
/// next call; `call(worker, i)` makes one call and returns its answer, which must be a result.
/// Calls each echo path makes before it is measured (at 16 in flight, after 300 at 1).
const WARM_UP_CALLS: usize = 20_000;

async fn load<F, Fut>(total: usize, inflight: usize, call: F) -> Result<Stats>
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Value>> + Send,
{
    let per = total / inflight;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..inflight {
        let call = call.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per);
            for i in 0..per {
                let t = Instant::now();
                let r = call(w, i).await?;
                if r.get("result").is_none() {
                    bail!("call failed: {r}");
                }
                lat.push(t.elapsed());
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(Stats { lat: all, wall: start.elapsed() })
}

/// `total` echo calls through a stdio client with `inflight` concurrent callers.
async fn echo_load(c: &Arc<StdioClient>, name: &str, total: usize, inflight: usize) -> Result<Stats> {
    let (c, name) = (c.clone(), Arc::<str>::from(name));
    load(total, inflight, move |w, i| {
        let (c, name) = (c.clone(), name.clone());
        async move { c.request("tools/call", json!({"name": &*name, "arguments": {"message": format!("m{w}-{i}")}})).await }
    })
    .await
}

/// `total` echo calls straight to `/mcp` over HTTP (no shim), `inflight` concurrent callers.
async fn http_echo_load(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    sid: &str,
    total: usize,
    inflight: usize,
) -> Result<Stats> {
    let (http, url, token, sid): (_, Arc<str>, Arc<str>, Arc<str>) =
        (http.clone(), url.into(), token.into(), sid.into());
    load(total, inflight, move |w, i| {
        let (http, url, token, sid) = (http.clone(), url.clone(), token.clone(), sid.clone());
        async move {
            let body = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "everything__echo", "arguments": {"message": format!("h{w}-{i}")}}});
            Ok(http
                .post(&*url)
                .header("X-Coffer-Token", &*token)
                .header("Mcp-Session-Id", &*sid)
                .header("Accept", "application/json, text/event-stream")
                .json(&body)
                .send()
                .await?
                .json()
                .await?)
        }
    })
    .await
}

/// Scheduler counters so far, summed over every thread of `pid` ("self" for this process):
/// ns on a CPU, ns runnable but waiting, times run (`/proc/<pid>/task/*/schedstat`).
fn schedstat(pid: &str) -> [u64; 3] {
    let mut sum = [0u64; 3];
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return sum };
    for s in tasks.flatten().filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok()) {
        for (acc, f) in sum.iter_mut().zip(s.split_whitespace()) {
            *acc += f.parse::<u64>().unwrap_or(0);
        }
    }
    sum
}

fn rss_kib(pid: i32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// Pids of processes whose environment has `COFFER_HOME=<home>` (the daemon and its services)
/// and of their descendants.
fn coffer_pids(home: &Path) -> Vec<(i32, String)> {
    let needle = format!("COFFER_HOME={}", home.display());
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        if env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_owned();
            out.push((pid, comm));
        }
    }
    out
}

fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else { continue };
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else { continue };
        if rest.split_whitespace().nth(1).and_then(|pp| pp.parse::<i32>().ok()) == Some(pid) {
            out.push(p);
        }
    }
    out
}

/// Children of `pid` that run Node (server-everything upstreams).
fn node_children(pid: i32) -> Vec<i32> {
    children_of(pid)
        .into_iter()
        .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "node"))
        .collect()
}

/// The gateway service's pid, from `GET /v1/status`.
async fn gateway_pid(http: &reqwest::Client, env: &Env, token: &str) -> Result<i32> {
    let s: Value = http.get(env.url("/v1/status")).header("X-Coffer-Token", token).send().await?.json().await?;
    Ok(s["services"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["name"] == "gateway"))
        .and_then(|e| e["pid"].as_i64())
        .context("gateway pid")? as i32)
}

struct Env {
    bins: PathBuf,
    home: tempfile::TempDir,
    port: u16,
}

impl Env {
    fn new(bins: &Path) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        Ok(Self { bins: bins.to_path_buf(), home: tempfile::tempdir()?, port })
    }
    fn vars(&self) -> Vec<(String, String)> {
        vec![
            ("COFFER_HOME".into(), self.home.path().display().to_string()),
            ("COFFER_PORT".into(), self.port.to_string()),
        ]
    }
    async fn coffer(&self, args: &[&str]) -> Result<std::process::Output> {
        // The benchmark runs the CLI under test.
        #[allow(clippy::disallowed_methods)]
        Ok(tokio::process::Command::new(self.bins.join("coffer")).args(args).envs(self.vars()).output().await?)
    }
    fn token(&self) -> Result<String> {
        let v: Value = serde_json::from_slice(&std::fs::read(self.home.path().join("daemon.json"))?)?;
        Ok(v["token"].as_str().context("token")?.to_owned())
    }
    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
    async fn stop(&self) {
        let _ = self.coffer(&["daemon", "stop"]).await;
    }
    /// Deletes the gateway's capability catalog cache file (`COFFER_HOME/cache/catalog.json`),
    /// if any: the next daemon starts with an empty catalog. Call it while no daemon runs.
    fn drop_catalog_cache(&self) -> Result<()> {
        match std::fs::remove_file(self.home.path().join("cache/catalog.json")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }
}

/// Servers registered for the first-list measurement: eight of server-everything (Node).
const FIRST_LIST_SERVERS: usize = 8;
/// Runs of each first-list measurement (the median is reported).
const FIRST_LIST_RUNS: usize = 5;

/// One client's first `tools/list` through the shim: `(from spawn to initialize answered, the
/// list itself, the whole, tools listed)`.
async fn first_list(shim: &Path, env: &Env) -> Result<(Duration, Duration, Duration, usize)> {
    let t = Instant::now();
    let c = StdioClient::spawn(shim, &[], &env.vars()).await?;
    let init = t.elapsed();
    let l = c.request("tools/list", json!({})).await?;
    let whole = t.elapsed();
    let tools = l["result"]["tools"].as_array().map_or(0, Vec::len);
    Ok((init, whole - init, whole, tools))
}

/// A floor's verdict, in bold.
fn pass(ok: bool) -> &'static str {
    if ok { "**PASS**" } else { "**FAIL**" }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

/// Waits (polling, 60 s at most) until `/v1/status` shows every registered server's catalog
/// state `ready`.
async fn catalog_ready(http: &reqwest::Client, env: &Env) -> Result<()> {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let s: Value =
            http.get(env.url("/v1/status")).header("X-Coffer-Token", env.token()?).send().await?.json().await?;
        let ups = s["upstreams"].as_array().cloned().unwrap_or_default();
        if ups.len() == FIRST_LIST_SERVERS && ups.iter().all(|u| u["catalog"]["state"] == "ready") {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("the catalog did not learn every server: {}", Value::Array(ups));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// With [`FIRST_LIST_SERVERS`] registered: no session → first `tools/list` answered through
/// the shim, cold (no daemon: it starts with an empty catalog) and warm (the catalog knows
/// every server). Baselines in the same run: cold, a list that waits for every server
/// (`gateway.first_list_timeout_ms` = 60 s: what every first list cost before the catalog);
/// warm, the same session's second `tools/list` (its own cache).
async fn first_lists(bins: &Path, node: &Path, everything: &Path, http: &reqwest::Client) -> Result<()> {
    let env = Env::new(bins)?;
    env.coffer(&["daemon", "start"]).await?;
    for i in 0..FIRST_LIST_SERVERS {
        let reg = json!({"name": format!("everything{i}"), "command": node, "args": [everything, "stdio"]});
        let r = http.post(env.url("/v1/mcp/servers")).header("X-Coffer-Token", env.token()?).json(&reg).send().await?;
        if !r.status().is_success() {
            bail!("register failed: {}", r.text().await?);
        }
    }
    let shim = bins.join("coffer-mcp-shim");
    let set = |wait_ms: u64| {
        let body = json!({"set": {"gateway.first_list_timeout_ms": wait_ms.to_string()}});
        let (http, url, token) = (http.clone(), env.url("/v1/settings"), env.token());
        async move {
            let r = http.patch(url).header("X-Coffer-Token", token?).json(&body).send().await?;
            if !r.status().is_success() {
                bail!("setting gateway.first_list_timeout_ms failed: {}", r.text().await?);
            }
            Ok(())
        }
    };
    let mut rows = Vec::new();
    for (label, wait_ms) in [("catalog (default)", 1_000u64), ("wait for every server", 60_000)] {
        set(wait_ms).await?;
        let (mut cold, mut cold_list, mut tools) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..FIRST_LIST_RUNS {
            env.stop().await;
            // Cold means an empty catalog: the one kept across restarts is deleted (issue 31's
            // first-contact table measures starting with it).
            env.drop_catalog_cache()?;
            let (_, list, whole, n) = first_list(&shim, &env).await?;
            cold.push(whole);
            cold_list.push(list);
            tools.push(n);
        }
        rows.push((label, median(cold), median(cold_list), tools));
    }
    set(1_000).await?;
    catalog_ready(http, &env).await?;
    let (mut warm, mut warm_list, mut cached, mut warm_tools) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for _ in 0..FIRST_LIST_RUNS {
        let (_, list, whole, n) = first_list(&shim, &env).await?;
        warm.push(whole);
        warm_list.push(list);
        warm_tools = n;
        let c = StdioClient::spawn(&shim, &[], &env.vars()).await?;
        c.request("tools/list", json!({})).await?;
        let t = Instant::now();
        c.request("tools/list", json!({})).await?;
        cached.push(t.elapsed());
    }
    env.stop().await;
    println!("## Gateway: first `tools/list` with {FIRST_LIST_SERVERS} registered servers\n");
    println!("| measure | value | baseline (same run) | ratio |\n|---|---|---|---|");
    let (_, cold, cold_list, tools) = &rows[0];
    let (_, before, before_list, before_tools) = &rows[1];
    println!(
        "| cold: no daemon → first `tools/list` answered through the shim (median of {FIRST_LIST_RUNS}; tools listed per run {tools:?}) | {} (the list itself {}) | waiting for every server: {} (list {}; tools {before_tools:?}) | {:.2}× |",
        ms(*cold),
        ms(*cold_list),
        ms(*before),
        ms(*before_list),
        cold.as_secs_f64() / before.as_secs_f64()
    );
    let warm = median(warm);
    let cached = median(cached);
    println!(
        "| warm: no session → first `tools/list` answered through the shim, catalog knows all {FIRST_LIST_SERVERS} ({warm_tools} tools) | {} (the list itself {}) | the same session's second `tools/list` {:.1} ms | {:.0}× |\n",
        ms(warm),
        ms(median(warm_list)),
        cached.as_secs_f64() * 1e3,
        warm.as_secs_f64() / cached.as_secs_f64()
    );
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let bins = std::env::var_os("COFFER_BENCH_BINS").map(PathBuf::from).unwrap_or_else(|| root.join("target/release"));
    let everything = root.join("tests/peers/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let args: Vec<String> = std::env::args().skip(1).collect();
    const SECTIONS: [&str; 11] = [
        "daemon",
        "gateway",
        "sessions",
        "catalog",
        "retrieval",
        "retrieval-quality",
        "retrieval-speed",
        "retrieval-notes",
        "chat",
        "ui",
        "sandbox",
    ];
    let only = match args.as_slice() {
        [] => None,
        [flag, section] if flag == "--only" && SECTIONS.contains(&section.as_str()) => Some(section.clone()),
        _ => bail!("usage: coffer-bench [--only {}]", SECTIONS.join("|")),
    };
    if only.as_deref() == Some("sandbox") {
        // In this process, through the spawn helper: no daemon binary is needed.
        println!("# Coffer benchmarks\n");
        return sandbox::run().await;
    }
    let retrieval_only = only.as_deref().is_some_and(|o| o.starts_with("retrieval"));
    let chat_only = only.as_deref() == Some("chat");
    let ui_only = only.as_deref() == Some("ui");
    let mut needed = vec!["coffer", "coffer-daemon", "coffer-gateway", "coffer-store", "coffer-retrieval"];
    if !retrieval_only && !chat_only && !ui_only {
        needed.extend(["coffer-mcp-shim", "coffer-tiny-upstream"]);
    }
    for b in needed {
        if !bins.join(b).exists() {
            bail!("{} missing: run ./scripts/bench (it builds the release binaries first)", bins.join(b).display());
        }
    }
    coffer_runtime::tls::ensure_provider();
    let http = reqwest::Client::builder().no_proxy().build()?;
    if retrieval_only {
        println!("# Coffer benchmarks\n");
        println!("binaries: {}\n", bins.display());
        return retrieval_sections(&root, &bins, &http, only.as_deref()).await;
    }
    if chat_only {
        println!("# Coffer benchmarks\n");
        println!("binaries: {}\n", bins.display());
        return chat::run(&bins).await;
    }
    if ui_only {
        println!("# Coffer benchmarks\n");
        println!("binaries: {}\n", bins.display());
        return ui::run(&bins).await;
    }
    let node = coffer_runtime::connect::which_on_path("node").context("node on PATH")?;
    let tiny = bins.join("coffer-tiny-upstream");
    if !everything.exists() {
        bail!("server-everything missing: run tests/peers/install.sh");
    }
    let want = |section: &str| only.as_deref().is_none_or(|o| o == section);
    println!("# Coffer benchmarks\n");
    println!("binaries: {}\n", bins.display());

    if want("catalog") {
        first_lists(&bins, &node, &everything, &http).await?;
        first_contact::run(&bins, &node, &everything, &http).await?;
        if only.is_some() {
            return Ok(());
        }
    }

    // 1. Cold start, 5 runs: no daemon → `coffer status` answered. Baseline: `coffer status`
    //    against the running daemon.
    if want("daemon") {
        let mut cold = Vec::new();
        let mut warm = Vec::new();
        for _ in 0..5 {
            let env = Env::new(&bins)?;
            let t = Instant::now();
            let out = env.coffer(&["status"]).await?;
            cold.push(t.elapsed());
            if !out.status.success() {
                bail!("coffer status failed: {}", String::from_utf8_lossy(&out.stderr));
            }
            let t = Instant::now();
            env.coffer(&["status"]).await?;
            warm.push(t.elapsed());
            env.stop().await;
        }
        cold.sort();
        warm.sort();
        println!("## Daemon\n");
        println!("| measure | value | baseline (same run) | ratio |\n|---|---|---|---|");
        println!(
            "| cold start: no daemon → `coffer status` answered (median of 5) | {:.0} ms | warm `coffer status` {:.1} ms | {:.1}× |",
            cold[2].as_secs_f64() * 1e3,
            warm[2].as_secs_f64() * 1e3,
            cold[2].as_secs_f64() / warm[2].as_secs_f64()
        );
    }

    // 2. Restart time of each killed service; 3. idle memory.
    let env = Env::new(&bins)?;
    env.coffer(&["daemon", "start"]).await?;
    let token = env.token()?;
    let status = |http: reqwest::Client, url: String, token: String| async move {
        http.get(url).header("X-Coffer-Token", token).send().await?.json::<Value>().await.map_err(anyhow::Error::from)
    };
    if want("daemon") {
        let procs = coffer_pids(env.home.path());
        let idle_kib: u64 = procs.iter().map(|(p, _)| rss_kib(*p)).sum();
        let idle_detail: Vec<String> = procs.iter().map(|(p, c)| format!("{c} {} MiB", rss_kib(*p) / 1024)).collect();
        for svc in ["store", "chat", "retrieval", "gateway"] {
            let s = status(http.clone(), env.url("/v1/status"), token.clone()).await?;
            let entry = s["services"]
                .as_array()
                .and_then(|a| a.iter().find(|x| x["name"] == svc))
                .cloned()
                .context("service")?;
            let pid = entry["pid"].as_i64().context("pid")? as i32;
            let restarts = entry["restarts"].as_u64().unwrap_or(0);
            let t = Instant::now();
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)?;
            loop {
                if let Ok(s) = status(http.clone(), env.url("/v1/status"), token.clone()).await
                    && let Some(e) = s["services"].as_array().and_then(|a| a.iter().find(|x| x["name"] == svc))
                    && e["state"] == "healthy"
                    && e["restarts"].as_u64().unwrap_or(0) > restarts
                {
                    break;
                }
                if t.elapsed() > Duration::from_secs(20) {
                    bail!("{svc} did not recover");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            println!(
                "| restart of a SIGKILLed `{svc}` until healthy in status | {:.0} ms | first backoff 100 ms | — |",
                t.elapsed().as_secs_f64() * 1e3
            );
        }
        println!(
            "| idle memory, all Coffer processes (RSS) | {:.1} MiB | {} | — |\n",
            idle_kib as f64 / 1024.0,
            idle_detail.join(", ")
        );
    }

    // 4. echo through shim → gateway → stdio upstream vs direct stdio.
    let reg = json!({"name": "everything", "command": node, "args": [everything, "stdio"]});
    let r = http.post(env.url("/v1/mcp/servers")).header("X-Coffer-Token", &token).json(&reg).send().await?;
    if !r.status().is_success() {
        bail!("register failed: {}", r.text().await?);
    }
    if want("gateway") {
        let direct =
            Arc::new(StdioClient::spawn(&node, &[everything.display().to_string(), "stdio".into()], &[]).await?);
        let shim = Arc::new(StdioClient::spawn(&bins.join("coffer-mcp-shim"), &[], &env.vars()).await?);
        shim.request("tools/list", json!({})).await?;
        for (c, n) in [(&direct, "echo"), (&shim, "everything__echo")] {
            // Warm-up to a steady state: Node's JIT keeps speeding the upstream up for some
            // thousand calls, and both paths should be measured warm.
            echo_load(c, n, 300, 1).await?;
            echo_load(c, n, WARM_UP_CALLS, 16).await?;
        }
        let gw_pid = gateway_pid(&http, &env, &token).await?;
        // The shim's session is the only one so far: its upstream is the gateway's one node child.
        let shim_upstream_pid = *node_children(gw_pid).first().context("the shim session's server-everything child")?;
        // The gateway as any other MCP client reaches it: Streamable HTTP POSTs to /mcp, no shim.
        let init = http
        .post(env.url("/mcp"))
        .header("X-Coffer-Token", &token)
        .header("Accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench-http", "version": "1"}}}))
        .send()
        .await?;
        let http_sid = init.headers().get("mcp-session-id").context("session id")?.to_str()?.to_owned();
        let mcp_url = env.url("/mcp");
        http_echo_load(&http, &mcp_url, &token, &http_sid, 300, 1).await?; // warm-up (starts its upstream)
        http_echo_load(&http, &mcp_url, &token, &http_sid, WARM_UP_CALLS, 16).await?;
        // The shim's link without the shim: the bench client on a /mcp stream itself.
        let socket = coffer_runtime::daemon_file::DaemonInfo::read(&env.home.path().join("daemon.json"))?.socket;
        let stream = Arc::new(StdioClient::stream(env.port, &token, socket.as_deref()).await?);
        echo_load(&stream, "everything__echo", 300, 1).await?;
        echo_load(&stream, "everything__echo", WARM_UP_CALLS, 16).await?;
        println!("## Gateway: `tools/call` of server-everything `echo`\n");
        println!("| in flight | path | p50 | p99 | calls/s |\n|---|---|---|---|---|");
        let http_upstream_pid = node_children(gw_pid)
            .into_iter()
            .find(|p| *p != shim_upstream_pid)
            .context("the HTTP session's server-everything child")?;
        let stream_upstream_pid = node_children(gw_pid)
            .into_iter()
            .find(|p| *p != shim_upstream_pid && *p != http_upstream_pid)
            .context("the stream session's server-everything child")?
            .to_string();
        let http_upstream_pid = http_upstream_pid.to_string();
        let shim_upstream_pid = shim_upstream_pid.to_string();
        let shim_pid = shim.pid().context("shim pid")?.to_string();
        let direct_pid = direct.pid().context("direct pid")?.to_string();
        // The daemon's other processes (supervisor, store writing the invocation log, chat,
        // retrieval): their CPU is part of what a call through Coffer costs.
        let others: Vec<String> = coffer_pids(env.home.path())
            .into_iter()
            .map(|(p, _)| p.to_string())
            .filter(|p| {
                ![&gw_pid.to_string(), &shim_pid].contains(&p)
                    && node_children(gw_pid).iter().all(|n| n.to_string() != *p)
            })
            .collect();
        let gw_pid = gw_pid.to_string();
        let meter = |coffer: &[(&'static str, &str)]| {
            let mut procs = coffer.to_vec();
            procs.extend(others.iter().map(|p| ("other Coffer", p.as_str())));
            CpuMeter::start(&procs)
        };
        if let Some(secs) = std::env::var("COFFER_BENCH_SOAK_SECS").ok().and_then(|v| v.parse::<u64>().ok()) {
            // For profilers: the shim path alone at 16 in flight for a while, pids on stderr.
            eprintln!(
                "soak: client {} shim {shim_pid} gateway {gw_pid} upstream {shim_upstream_pid} other {others:?}",
                std::process::id()
            );
            let until = Instant::now() + Duration::from_secs(secs);
            while Instant::now() < until {
                echo_load(&shim, "everything__echo", 16_000, 16).await?;
            }
            env.stop().await;
            return Ok(());
        }
        // Each path is measured in ROUNDS rounds interleaved with the others (direct, shim, HTTP,
        // stream, direct, …), so a change in the machine's speed during the run (other tenants
        // of the host) falls on all paths alike instead of on whichever ran at that moment.
        // Every measured round follows as many unmeasured calls on the same path, so resuming
        // after the other paths ran (Node picks up speed again over thousands of calls) is not
        // counted against any path.
        const ROUNDS: usize = 4;
        let paths = [
            "direct stdio",
            "shim → gateway → stdio",
            "Streamable HTTP /mcp → gateway → stdio",
            "/mcp stream → gateway → stdio",
        ];
        let mut cpu_rows = Vec::new();
        let mut spreads = Vec::new();
        for inflight in [1usize, 16] {
            let per_round = if inflight == 1 { 2000 } else { 32_000 } / ROUNDS;
            let mut runs: [Stats; 4] = Default::default();
            let mut sched: [Vec<(&str, SchedPerCall)>; 4] = Default::default();
            let mut ratios = Vec::new();
            for _ in 0..ROUNDS {
                let mut round: Vec<(Stats, Vec<(&str, SchedPerCall)>)> = Vec::new();
                let mut procs = vec![("client", "self"), ("upstream", direct_pid.as_str())];
                for p in [&shim_pid, &gw_pid, &shim_upstream_pid, &http_upstream_pid, &stream_upstream_pid] {
                    procs.push(("other Coffer", p.as_str()));
                }
                procs.extend(others.iter().map(|p| ("other Coffer", p.as_str())));
                echo_load(&direct, "echo", per_round, inflight).await?;
                let cpu = CpuMeter::start(&procs);
                let d = echo_load(&direct, "echo", per_round, inflight).await?;
                round.push((d, cpu.per_call(per_round)));
                echo_load(&shim, "everything__echo", per_round, inflight).await?;
                let cpu = meter(&[
                    ("client", "self"),
                    ("shim", &shim_pid),
                    ("gateway", &gw_pid),
                    ("upstream", &shim_upstream_pid),
                ]);
                let s = echo_load(&shim, "everything__echo", per_round, inflight).await?;
                round.push((s, cpu.per_call(per_round)));
                http_echo_load(&http, &mcp_url, &token, &http_sid, per_round, inflight).await?;
                let cpu = meter(&[("client", "self"), ("gateway", &gw_pid), ("upstream", &http_upstream_pid)]);
                let h = http_echo_load(&http, &mcp_url, &token, &http_sid, per_round, inflight).await?;
                round.push((h, cpu.per_call(per_round)));
                echo_load(&stream, "everything__echo", per_round, inflight).await?;
                let cpu = meter(&[("client", "self"), ("gateway", &gw_pid), ("upstream", &stream_upstream_pid)]);
                let t = echo_load(&stream, "everything__echo", per_round, inflight).await?;
                round.push((t, cpu.per_call(per_round)));
                ratios.push(round[1].0.per_s() / round[0].0.per_s());
                for (k, (stats, per_call)) in round.into_iter().enumerate() {
                    runs[k].merge(stats);
                    for (label, v) in per_call {
                        let i = sched[k].iter().position(|(l, _)| *l == label).unwrap_or_else(|| {
                            sched[k].push((label, SchedPerCall::default()));
                            sched[k].len() - 1
                        });
                        let acc = &mut sched[k][i].1;
                        acc.cpu_us += v.cpu_us / ROUNDS as f64;
                        acc.wait_us += v.wait_us / ROUNDS as f64;
                        acc.runs += v.runs / ROUNDS as f64;
                    }
                }
            }
            for (k, per) in sched.into_iter().enumerate() {
                cpu_rows.push((inflight, paths[k], per));
            }
            for (k, r) in runs.iter().enumerate() {
                let path = match k {
                    0 => "direct stdio (baseline)".to_owned(),
                    1 => paths[1].to_owned(),
                    _ => format!("{} (no shim)", paths[k]),
                };
                println!("| {inflight} | {path} | {:.0} µs | {:.0} µs | {:.0} |", r.p50_us(), r.p99_us(), r.per_s());
            }
            let (d, s) = (&runs[0], &runs[1]);
            println!(
                "| {inflight} | **Coffer vs direct** | **+{:.0} µs** ({:.2}×) | {:.2}× | **{:.2}×** of direct |",
                s.p50_us() - d.p50_us(),
                s.p50_us() / d.p50_us(),
                s.p99_us() / d.p99_us(),
                s.per_s() / d.per_s()
            );
            ratios.sort_by(f64::total_cmp);
            spreads.push((inflight, ratios));
        }
        println!("\nThroughput ratio (shim path / direct) of each of the {ROUNDS} rounds, sorted:\n");
        println!("| in flight | per round |\n|---|---|");
        for (inflight, ratios) in spreads {
            let list: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
            println!("| {inflight} | {} |", list.join(", "));
        }
        type Pick = fn(&SchedPerCall) -> f64;
        let tables: [(&str, Pick); 3] = [
            ("CPU time per call, by process (µs)", |v| v.cpu_us),
            ("Time runnable but waiting for a CPU, per call (µs)", |v| v.wait_us),
            ("Times put on a CPU, per call", |v| v.runs),
        ];
        for (title, pick) in tables {
            println!("\n{title} (`/proc/<pid>/task/*/schedstat`, same runs):\n");
            println!(
                "| in flight | path | client | shim | gateway | upstream | other Coffer | total |\n|---|---|---|---|---|---|---|---|"
            );
            for (inflight, path, per) in &cpu_rows {
                let get = |k: &str| {
                    per.iter().find(|(l, _)| *l == k).map_or("—".to_owned(), |(_, v)| format!("{:.1}", pick(v)))
                };
                let total: f64 = per.iter().map(|(_, v)| pick(v)).sum();
                println!(
                    "| {inflight} | {path} | {} | {} | {} | {} | {} | {total:.1} |",
                    get("client"),
                    get("shim"),
                    get("gateway"),
                    get("upstream"),
                    get("other Coffer")
                );
            }
        }
        drop(shim);
        drop(stream);
        drop(direct);
    }

    if !want("sessions") {
        env.stop().await;
        return Ok(());
    }
    // 5. Gateway memory with 100 sessions that listed tools (tiny upstream), children apart.
    let reg = json!({"name": "tiny", "command": tiny});
    http.post(env.url("/v1/mcp/servers")).header("X-Coffer-Token", &token).json(&reg).send().await?;
    http.patch(env.url("/v1/mcp/servers/everything"))
        .header("X-Coffer-Token", &token)
        .json(&json!({"enabled": false}))
        .send()
        .await?;
    let gw_pid = gateway_pid(&http, &env, &token).await?;
    let before = rss_kib(gw_pid);
    let mut sessions = Vec::new();
    let t = Instant::now();
    for _ in 0..100 {
        let r = http
            .post(env.url("/mcp"))
            .header("X-Coffer-Token", &token)
            .header("Accept", "application/json, text/event-stream")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "b", "version": "1"}}}))
            .send()
            .await?;
        let sid = r.headers().get("mcp-session-id").context("session id")?.to_str()?.to_owned();
        let l: Value = http
            .post(env.url("/mcp"))
            .header("X-Coffer-Token", &token)
            .header("Mcp-Session-Id", &sid)
            .header("Accept", "application/json, text/event-stream")
            .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
            .send()
            .await?
            .json()
            .await?;
        if l["result"]["tools"].as_array().map_or(0, Vec::len) < 2 {
            bail!("tools/list through a session failed: {l}");
        }
        sessions.push(sid);
    }
    let open_s = t.elapsed();
    let after = rss_kib(gw_pid);
    let kids: u64 = children_of(gw_pid).iter().map(|p| rss_kib(*p)).sum();
    println!("\n## Gateway sessions\n");
    println!("| measure | value | baseline (same run) | ratio |\n|---|---|---|---|");
    println!(
        "| gateway RSS with 100 sessions that listed tools | {:.1} MiB | {:.1} MiB with none | {:.2}× (+{:.0} KiB/session) |",
        after as f64 / 1024.0,
        before as f64 / 1024.0,
        after as f64 / before.max(1) as f64,
        (after.saturating_sub(before)) as f64 / 100.0
    );
    println!(
        "| upstream children of those sessions (tiny upstream), RSS | {:.1} MiB total | — | — |",
        kids as f64 / 1024.0
    );
    println!(
        "| opening 100 sessions (initialize + tools/list each, sequential) | {:.0} ms | — | {:.1} ms/session |",
        open_s.as_secs_f64() * 1e3,
        open_s.as_secs_f64() * 10.0
    );
    for sid in sessions {
        let _ =
            http.delete(env.url("/mcp")).header("X-Coffer-Token", &token).header("Mcp-Session-Id", sid).send().await;
    }
    http.patch(env.url("/v1/mcp/servers/everything"))
        .header("X-Coffer-Token", &token)
        .json(&json!({"enabled": true}))
        .send()
        .await?;
    http.delete(env.url("/v1/mcp/servers/tiny")).header("X-Coffer-Token", &token).send().await?;
    env.stop().await;

    // 6. No daemon → first tools/list answered through the shim (server-everything registered).
    let t = Instant::now();
    let shim = StdioClient::spawn(&bins.join("coffer-mcp-shim"), &[], &env.vars()).await?;
    let l = shim.request("tools/list", json!({})).await?;
    let first = t.elapsed();
    if l["result"]["tools"].as_array().map_or(0, Vec::len) < 2 {
        bail!("tools/list through the shim failed: {l}");
    }
    let t = Instant::now();
    shim.request("tools/list", json!({})).await?;
    let cached = t.elapsed();
    drop(shim);
    println!(
        "| no daemon → first `tools/list` through the shim (daemon + upstream start) | {:.0} ms | cached `tools/list` {:.1} ms | {:.0}× |",
        first.as_secs_f64() * 1e3,
        cached.as_secs_f64() * 1e3,
        first.as_secs_f64() / cached.as_secs_f64()
    );
    env.stop().await;
    if only.is_none() {
        retrieval_sections(&root, &bins, &http, None).await?;
        chat::run(&bins).await?;
        ui::run(&bins).await?;
    }
    Ok(())
}

/// The retrieval sections: `only` is `retrieval-quality`, `retrieval-speed`, `retrieval-notes`
/// (the paraphrase set, run only when named), or anything else for quality and speed.
async fn retrieval_sections(root: &Path, bins: &Path, http: &reqwest::Client, only: Option<&str>) -> Result<()> {
    if only == Some("retrieval-notes") {
        return retrieval::notes(root, bins, http).await;
    }
    if only != Some("retrieval-speed") {
        retrieval::quality(root, bins, http).await?;
    }
    if only != Some("retrieval-quality") {
        retrieval::speed(bins, http).await?;
    }
    Ok(())
}
