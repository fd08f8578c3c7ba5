//! Throughput of the built-in engine on Cranfield's abstracts (the first 400; one input each, as
//! Coffer embeds a short note: title, then text): model load time, chunks per second and CPU
//! seconds per chunk for a few ways of calling it (pass size; inputs in file order or sorted by
//! length), peak RSS (`VmHWM`). The numbers in docs/BENCHMARKS.md came from
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

/// CPU time of this process so far (user + system, every thread), seconds: on a machine shared
/// with other work, CPU seconds per chunk compare runs where wall time does not.
fn cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // After the command's closing parenthesis come fields 3 (state) onwards: utime is field 14
    // and stime field 15 (proc(5)), in clock ticks of 1/100 s (USER_HZ).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(14 - 3) + tick(15 - 3)) / 100.0
}

/// Embeds `docs` in calls of `call` inputs each (each call sorts its own inputs by length and
/// runs passes of `pass`), as the daemon's worker calls the engine; prints chunks/s and CPU
/// seconds per chunk.
fn run(engine: &coffer_embed::Engine, label: &str, docs: &[String], call: usize, pass: usize) {
    let (t, c) = (Instant::now(), cpu_s());
    for group in docs.chunks(call) {
        let v = engine.embed(group, pass).expect("embed");
        assert_eq!(v.len(), group.len());
    }
    let (s, cpu) = (t.elapsed().as_secs_f64(), cpu_s() - c);
    let n = docs.len() as f64;
    println!("{label}: {} inputs in {s:.1} s = {:.1} chunks/s, {:.3} CPU s per chunk", docs.len(), n / s, cpu / n);
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
    let some = &docs[..docs.len().min(400)];
    run(&engine, "passes of  1, in file order                      ", &some[..some.len().min(100)], 1, 1);
    run(&engine, "passes of 16, in file order (calls of 16)        ", some, 16, 16);
    run(&engine, "passes of 16, sorted in calls of 128 (the worker)", some, 128, 16);
    run(&engine, "passes of 16, all inputs sorted in one call      ", some, some.len(), 16);
    run(&engine, "passes of 64, all inputs sorted in one call      ", some, some.len(), 64);
    println!("RSS peak: {:.0} MiB", hwm_mib());
}
