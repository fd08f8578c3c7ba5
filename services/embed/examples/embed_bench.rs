//! Throughput of the built-in engine on Cranfield's 1,400 abstracts (one input each, as Coffer
//! embeds a short note: title, then text): model load time, chunks per second at a few
//! forward-pass sizes, peak RSS (`VmHWM`). The numbers in docs/BENCHMARKS.md came from
//!
//! ```text
//! bash bench/setup.sh
//! cargo run -p coffer-embed --example embed_bench -- ../shared/data/cranfield/cran.all.1400
//! ```
#![allow(clippy::print_stdout)]
use std::time::Instant;

fn hwm_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// The `.T` title and `.W` text of each record of a Cranfield `cran.all.1400` file.
fn cranfield(path: &str) -> Vec<String> {
    let raw = std::fs::read_to_string(path).expect("the Cranfield file");
    let mut out = Vec::new();
    for record in raw.split(".I ").skip(1) {
        let field = |tag: &str| -> String {
            record
                .split_once(&format!("\n{tag}\n"))
                .map(|(_, rest)| {
                    rest.split("\n.").next().unwrap_or("").split_whitespace().collect::<Vec<_>>().join(" ")
                })
                .unwrap_or_default()
        };
        out.push(format!("{}\n{}", field(".T"), field(".W")));
    }
    out
}

fn main() {
    let path = std::env::args().nth(1).unwrap_or_else(|| "../shared/data/cranfield/cran.all.1400".into());
    let docs = cranfield(&path);
    let dir = coffer_embed::testing::minilm_dir().unwrap_or_else(|e| panic!("{e}"));
    let t = Instant::now();
    let engine = coffer_embed::Engine::load(&dir).expect("the model");
    println!("model load: {:.2} s, RSS peak {:.0} MiB", t.elapsed().as_secs_f64(), hwm_mib());
    println!(
        "inputs: {} Cranfield abstracts; threads: {}",
        docs.len(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for pass in [1, 16, 64] {
        let n = if pass == 1 { 200 } else { docs.len() };
        let t = Instant::now();
        let v = engine.embed(&docs[..n], pass).expect("embed");
        let s = t.elapsed().as_secs_f64();
        assert_eq!(v.len(), n);
        println!("forward pass of {pass:>2}: {n} inputs in {s:.1} s = {:.1} chunks/s", n as f64 / s);
    }
    println!("RSS peak: {:.0} MiB", hwm_mib());
}
