//! Issue 31's floors (`coffer-bench --only catalog`, after the first-list table): a client's
//! first contact right after `coffer daemon restart`. With N registered servers (8 and 20 of
//! server-everything, Node, stdio) whose lists the capability catalog has learned, the daemon
//! is restarted with the real CLI and, as soon as the CLI returns, a new client spawns
//! `coffer-mcp-shim` and sends `initialize` and `tools/list`; measured from the spawn to the
//! list's answer. Floors: the list is complete (every registered server's tools) and takes
//! < 100 ms.
//!
//! Two clients: one without capabilities (the set the catalog learned them for) and one
//! declaring roots, sampling and elicitation — a set the catalog has never seen (each run adds
//! an `experimental` key of its own, so every run's set is new even though the catalog keeps
//! the sets it saw). Median of [`RUNS`] restarts each. Baselines in the same run: the same
//! session's second `tools/list` (the session's own cache), and the behaviour before the
//! catalog was kept across restarts: the same stop and start with the catalog's cache file
//! (`COFFER_HOME/cache/catalog.json`) deleted while the daemon was down. Between two runs the
//! benchmark waits until the restarted gateway has listed every server afresh
//! (`GET /v1/mcp/servers/{name}/catalog?wait_ms`), so each restart starts from a settled catalog.
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::{Env, StdioClient, median, pass};

/// Restarts per measurement (the median is reported).
const RUNS: usize = 5;
/// Registered servers per table row.
const SIZES: [usize; 2] = [8, 20];
/// The floor for the first list (complete, and this fast).
const FLOOR: Duration = Duration::from_millis(100);
/// How long the catalog may take to list one server afresh after a restart.
const RELIST_TIMEOUT_MS: u64 = 120_000;

/// A duration in ms with one decimal.
fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// One client's first contact: from spawning the shim to the first `tools/list` answered.
struct Contact {
    whole: Duration,
    /// The `tools/list` alone (after `initialize` was answered).
    list: Duration,
    /// The same session's second `tools/list`.
    second: Duration,
    tools: usize,
    /// Registered servers with at least one tool in the list.
    servers: usize,
}

/// The client capabilities of run `run`: none, or roots, sampling and elicitation plus an
/// `experimental` key unique to the run (a set the catalog has never seen).
fn capabilities(new_set: bool, run: usize) -> Value {
    if new_set {
        json!({"roots": {"listChanged": true}, "sampling": {}, "elicitation": {},
            "experimental": {format!("coffer-bench-run-{run}"): {}}})
    } else {
        json!({})
    }
}

async fn contact(shim: &Path, env: &Env, capabilities: Value) -> Result<Contact> {
    let t = Instant::now();
    let c = StdioClient::spawn_with(shim, &[], &env.vars(), capabilities).await?;
    let init = t.elapsed();
    let l = c.request("tools/list", json!({})).await?;
    let whole = t.elapsed();
    let names: Vec<&str> = l["result"]["tools"]
        .as_array()
        .context("tools/list failed")?
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    let servers: BTreeSet<&str> =
        names.iter().filter_map(|n| n.split_once("__").map(|(s, _)| s)).filter(|s| *s != "coffer").collect();
    let t2 = Instant::now();
    c.request("tools/list", json!({})).await?;
    Ok(Contact { whole, list: whole - init, second: t2.elapsed(), tools: names.len(), servers: servers.len() })
}

/// Waits until the catalog has listed each of `n` servers afresh (not only restored from its
/// cache file) at the daemon now running.
async fn relisted(http: &reqwest::Client, env: &Env, n: usize) -> Result<()> {
    for i in 0..n {
        let url = env.url(&format!("/v1/mcp/servers/everything{i}/catalog?wait_ms={RELIST_TIMEOUT_MS}"));
        let s: Value = http.get(url).header("X-Coffer-Token", env.token()?).send().await?.json().await?;
        if s["state"] != "ready" || s.get("restored").is_some() {
            bail!("the catalog did not list everything{i} afresh: {s}");
        }
    }
    Ok(())
}

/// `coffer daemon restart`, or with `drop_cache` a stop, the cache file deleted, and a start.
async fn restart(env: &Env, drop_cache: bool) -> Result<()> {
    let steps: &[&[&str]] =
        if drop_cache { &[&["daemon", "stop"], &["daemon", "start"]] } else { &[&["daemon", "restart"]] };
    for (i, args) in steps.iter().enumerate() {
        if drop_cache && i == 1 {
            env.drop_catalog_cache()?;
        }
        let out = env.coffer(args).await?;
        if !out.status.success() {
            bail!("coffer {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        }
    }
    Ok(())
}

/// [`RUNS`] first contacts, each right after a restart (see [`restart`]).
async fn runs(
    http: &reqwest::Client,
    env: &Env,
    shim: &Path,
    n: usize,
    new_set: bool,
    drop_cache: bool,
) -> Result<Vec<Contact>> {
    let mut out = Vec::new();
    for run in 0..RUNS {
        relisted(http, env, n).await?;
        restart(env, drop_cache).await?;
        out.push(contact(shim, env, capabilities(new_set, run + if drop_cache { RUNS } else { 0 })).await?);
    }
    Ok(out)
}

/// The issue-31 table: see the module's documentation.
pub async fn run(bins: &Path, node: &Path, everything: &Path, http: &reqwest::Client) -> Result<()> {
    let shim = bins.join("coffer-mcp-shim");
    println!("## Gateway: first contact right after `coffer daemon restart` (issue 31)\n");
    println!(
        "| servers | client | first `tools/list` through the shim, median of {RUNS} (the list itself) | servers present per run | tools per run | baseline: the same session's second list | baseline: cache file deleted (before the fix), servers present per run | ratio to that | floor: complete and < {} ms |\n|---|---|---|---|---|---|---|---|---|",
        FLOOR.as_millis()
    );
    for n in SIZES {
        let env = Env::new(bins)?;
        env.coffer(&["daemon", "start"]).await?;
        for i in 0..n {
            let reg = json!({"name": format!("everything{i}"), "command": node, "args": [everything, "stdio"]});
            let r =
                http.post(env.url("/v1/mcp/servers")).header("X-Coffer-Token", env.token()?).json(&reg).send().await?;
            if !r.status().is_success() {
                bail!("register failed: {}", r.text().await?);
            }
        }
        // What the catalog learns: the lists of a client without capabilities, complete.
        relisted(http, &env, n).await?;
        let learned = contact(&shim, &env, json!({})).await?;
        if learned.servers != n {
            bail!("before any restart a list holds {} of {n} servers", learned.servers);
        }
        for (client, new_set) in
            [("no capabilities (the set learned)", false), ("roots + sampling + elicitation, never seen", true)]
        {
            let fixed = runs(http, &env, &shim, n, new_set, false).await?;
            let before = runs(http, &env, &shim, n, new_set, true).await?;
            let whole = median(fixed.iter().map(|c| c.whole).collect());
            let list = median(fixed.iter().map(|c| c.list).collect());
            let second = median(fixed.iter().map(|c| c.second).collect());
            let before_whole = median(before.iter().map(|c| c.whole).collect());
            let complete = fixed.iter().all(|c| c.servers == n && c.tools >= learned.tools);
            println!(
                "| {n} | {client} | {} ({}) | {:?} | {:?} | {} | {} ({:?}) | {:.2}× | {} |",
                ms(whole),
                ms(list),
                fixed.iter().map(|c| c.servers).collect::<Vec<_>>(),
                fixed.iter().map(|c| c.tools).collect::<Vec<_>>(),
                ms(second),
                ms(before_whole),
                before.iter().map(|c| c.servers).collect::<Vec<_>>(),
                whole.as_secs_f64() / before_whole.as_secs_f64(),
                pass(complete && whole < FLOOR),
            );
        }
        env.stop().await;
    }
    println!();
    Ok(())
}
