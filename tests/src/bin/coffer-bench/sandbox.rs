//! The vault sandbox benchmark (`coffer-bench --only sandbox`): what confining a child with
//! Landlock adds to a spawn, measured in this process through the one spawn helper
//! (`coffer_runtime::spawn`), sandboxed and not, interleaved in the same run.
//!
//! The tree is the default layout, `COFFER_HOME` = `HOME/.coffer`, in a temporary `HOME` with
//! [`HOME_ENTRIES`] entries next to the vault (a lived-in home), so the walk over the ancestors
//! `/`, `/tmp`, the temp dir and `HOME` grants that many siblings and more.
//!
//! - **prepare**: `Sandbox::prepare` alone (walk the ancestors, open a path descriptor per rule,
//!   build the ruleset) — the parent's share;
//! - **spawn → exit**: `spawn` + `wait` of `/bin/true` (the whole fork/exec/exit, the restriction
//!   in the child included) and of `node -e 0` (an npm server's interpreter starting up, reading
//!   its own files through the ruleset).
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use coffer_runtime::sandbox::Sandbox;
use coffer_runtime::spawn::{SpawnSpec, spawn};

/// Entries in the temporary `HOME` next to `.coffer`.
const HOME_ENTRIES: usize = 60;
/// Interleaved rounds (each: one sandboxed and one plain spawn).
const ROUNDS: usize = 40;

fn q(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

async fn run_once(program: &Path, args: &[&str], sandbox: Option<Sandbox>, cwd: &Path) -> Result<Duration> {
    let mut spec = SpawnSpec::new(program, "upstream", "bench");
    spec.args = args.iter().map(Into::into).collect();
    spec.cwd = Some(cwd.to_path_buf());
    spec.sandbox = sandbox;
    let t = Instant::now();
    let mut child = spawn(spec)?;
    let status = child.wait().await?;
    let took = t.elapsed();
    anyhow::ensure!(status.success(), "{} {args:?} failed: {status}", program.display());
    Ok(took)
}

/// Prints the section.
///
/// # Errors
/// When the temporary tree cannot be made or a child fails.
pub async fn run() -> Result<()> {
    let abi = coffer_runtime::sandbox::kernel_abi();
    println!("## Vault sandbox (issue 32 part 5)\n");
    println!(
        "Landlock ABI of this kernel: {}. `COFFER_HOME` = `HOME/.coffer`, {HOME_ENTRIES} other entries in `HOME`; \
         {ROUNDS} interleaved rounds, sandboxed vs plain.\n",
        abi.map_or_else(|| "none (nothing is confined: ratios are ~1 by construction)".into(), |v| v.to_string())
    );
    let temp = tempfile::Builder::new().prefix("coffer-bench-sandbox-").tempdir()?;
    let home = temp.path().join("home");
    let vault = home.join(".coffer");
    std::fs::create_dir_all(vault.join("workspace"))?;
    std::fs::write(vault.join("secret.key"), "k")?;
    for i in 0..HOME_ENTRIES {
        if i % 2 == 0 {
            std::fs::create_dir_all(home.join(format!(".dir{i}")))?;
        } else {
            std::fs::write(home.join(format!("file{i}")), "x")?;
        }
    }
    let workspace = vault.join("workspace");
    let sandbox = || Sandbox::hiding(&vault).allow(&workspace);
    let rules = sandbox().prepare()?.rules();

    let mut prepare = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let p = sandbox().prepare()?;
        prepare.push(t.elapsed());
        drop(p);
    }
    let node = coffer_runtime::connect::which_on_path("node").context("node on PATH")?;
    println!("Rules per spawn: {rules}.\n");
    println!("| what | plain p50 | plain p95 | sandboxed p50 | sandboxed p95 | ratio p50 |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| `Sandbox::prepare` (parent) | – | – | {} | {} | – |",
        ms(q(&mut prepare, 0.5)),
        ms(q(&mut prepare, 0.95))
    );
    for (label, program, args) in [
        ("spawn → exit `/bin/true`", Path::new("/bin/true"), &[][..]),
        ("spawn → exit `node -e 0`", node.as_path(), &["-e", "0"][..]),
    ] {
        let (mut plain, mut boxed) = (Vec::new(), Vec::new());
        // One warm-up each (page cache, node's first start).
        run_once(program, args, None, &workspace).await?;
        run_once(program, args, Some(sandbox()), &workspace).await?;
        for _ in 0..ROUNDS {
            plain.push(run_once(program, args, None, &workspace).await?);
            boxed.push(run_once(program, args, Some(sandbox()), &workspace).await?);
        }
        let (p50, s50) = (q(&mut plain, 0.5), q(&mut boxed, 0.5));
        println!(
            "| {label} | {} | {} | {} | {} | {:.2} |",
            ms(p50),
            ms(q(&mut plain, 0.95)),
            ms(s50),
            ms(q(&mut boxed, 0.95)),
            s50.as_secs_f64() / p50.as_secs_f64()
        );
    }
    println!();
    Ok(())
}
