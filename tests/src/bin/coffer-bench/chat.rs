//! The chat benchmark (`coffer-bench --only chat`): issue 15's performance floors, on a real
//! daemon whose chat service is `coffer-test-chat` (`coffer-test-daemon scripted-chat`, the
//! shipped engine with the test-only `scripted` agent, so no agent CLI is measured), through
//! the edge's real HTTP, every process from the release build next to this binary.
//!
//! - **Fan-out**: a scripted turn of [`FANOUT_DELTAS`] `stamped:` deltas (each carrying the
//!   wall-clock µs at which the adapter handed it to the engine, `coffer_tests::chat`); every
//!   subscriber notes when each one arrives; latency = arrival − stamp (one machine, one clock).
//!   [`SUBSCRIBERS`] SSE subscribers on `GET /v1/conversations/{id}/events`, against one
//!   subscriber on the chat service's gRPC `Subscribe` (what the edge relays), and one SSE
//!   subscriber alone; deltas paced one per [`PACE_MS`] ms (far faster than a model), one per
//!   [`MODEL_PACE_MS`] ms (a fast model's token rate), and as one burst (queueing, not latency).
//!   The rows are measured in [`ROUNDS`] interleaved rounds. CPU time and time runnable but
//!   waiting for a CPU, per delta, of `coffer-chat`, `coffer-gateway` and this client, from
//!   `/proc/<pid>/task/*/schedstat`.
//! - **POST → `turn_started`**: from sending `POST …/messages` to the `turn_started` event on an
//!   SSE stream already open, [`TURNS`] tiny turns (`say:ok`, each awaited to `turn_done`),
//!   against gRPC `SendMessage` → `turn_started` on gRPC `Subscribe`, interleaved.
//! - **The agent CLIs' own start-up** (reported apart): Claude Code and Codex from
//!   `tests/peers/` on the fake model APIs, driven through their providers as the engine drives
//!   them: from `start_turn` (right after `turn_started`) to the first text delta, for a fresh
//!   conversation and for its second turn on the process kept from the first. Skipped, saying
//!   so, when the peers are not installed.
//! - **Memory**: `VmRSS` / `VmHWM` of `coffer-chat` (pid from `GET /v1/status`) on a fresh
//!   daemon after [`IDLE_CONVERSATIONS`] conversations each got one finished turn through REST,
//!   against the same process before the first one.
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use coffer_chat::adapter::{AgentConfig, AgentEnv, AgentEvent, AgentProvider, TurnInput};
use coffer_proto::chat::event::Kind;
use coffer_tests::anthropic::FakeAnthropic;
use coffer_tests::bench::metrics::quantile;
use coffer_tests::chat::{self, stamp_of, unix_micros};
use coffer_tests::openai::FakeOpenAi;
use coffer_tests::{Api, TestHome};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{pass, schedstat};

/// SSE subscribers in the fan-out measurement (the number).
const SUBSCRIBERS: usize = 10;
/// Deltas per measured fan-out turn.
const FANOUT_DELTAS: usize = 2000;
/// Milliseconds between two deltas of a fast paced turn (`slow:`): far faster than any model.
const PACE_MS: u64 = 1;
/// A model-like pace (100 deltas/s, a fast model's token rate) and that turn's deltas.
const MODEL_PACE_MS: u64 = 10;
const MODEL_PACE_DELTAS: usize = 500;
/// Interleaved rounds of each fan-out path and of the two POST → `turn_started` paths.
const ROUNDS: usize = 2;
/// Measured turns of each POST → `turn_started` path (after [`WARM_TURNS`] unmeasured ones).
const TURNS: usize = 200;
const WARM_TURNS: usize = 20;
/// Conversations of the memory measurement, and how many are created at once.
const IDLE_CONVERSATIONS: usize = 1000;
const CREATORS: usize = 8;
/// Fresh-then-kept runs of each real agent CLI (the median is reported).
const CLI_RUNS: usize = 3;
/// How long one event may take to arrive before a measurement gives up.
const EVENT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a real CLI's turn on a fake model may take on a loaded machine.
const CLI_TURN_TIMEOUT: Duration = Duration::from_secs(120);
/// The floors.
const FANOUT_P99_FLOOR_MS: f64 = 5.0;
const TURN_STARTED_FLOOR_MS: f64 = 20.0;
const MEMORY_FLOOR_BYTES: u64 = 50_000_000;

fn ms(us: f64) -> String {
    format!("{:.2} ms", us / 1e3)
}

/// `VmRSS` and `VmHWM` of `pid`, KiB.
fn rss_hwm_kib(pid: i32) -> (u64, u64) {
    (super::status_kib(pid, "VmRSS:"), super::status_kib(pid, "VmHWM:"))
}

/// The daemon behind `api`: REST calls with the token, failing on anything but 2xx.
struct Rest<'a> {
    api: &'a Api,
}

impl Rest<'_> {
    async fn send(&self, req: reqwest::RequestBuilder, what: &str) -> Result<Value> {
        let r = req.send().await.with_context(|| what.to_owned())?;
        let status = r.status();
        let text = r.text().await?;
        if !status.is_success() {
            bail!("{what} answered {status}: {text}");
        }
        serde_json::from_str(&text).with_context(|| format!("{what}: not JSON: {text}"))
    }

    async fn get(&self, path: &str) -> Result<Value> {
        self.send(self.api.get(path), &format!("GET {path}")).await
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value> {
        self.send(self.api.post_json(path, body), &format!("POST {path}")).await
    }

    /// A new `scripted` conversation's id.
    async fn create(&self) -> Result<String> {
        let c = self.post("/v1/conversations", &json!({"agent_key": chat::SCRIPTED})).await?;
        Ok(c["id"].as_str().with_context(|| format!("no conversation id in {c}"))?.to_owned())
    }

    /// The conversation's `last_seq` (subscribe after it to see exactly what comes next).
    async fn last_seq(&self, id: &str) -> Result<u64> {
        let v = self.get(&format!("/v1/conversations/{id}?messages=1")).await?;
        v["last_seq"].as_u64().with_context(|| format!("no last_seq in {v}"))
    }

    /// Pid of the service `name` from `GET /v1/status`.
    async fn service_pid(&self, name: &str) -> Result<i32> {
        let s = self.get("/v1/status").await?;
        let pid = s["services"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["name"] == name))
            .and_then(|e| e["pid"].as_i64())
            .with_context(|| format!("no pid for service {name} in /v1/status"))?;
        Ok(pid as i32)
    }
}

/// One SSE frame as a subscriber saw it.
struct Frame {
    event: String,
    data: Value,
    /// Unix µs at which the bytes holding it were read.
    arrived_us: u64,
}

/// A client of `GET /v1/conversations/{id}/events`, reading frames by hand (`id:`, `event:`,
/// `data:`, comment lines skipped).
struct Sse {
    resp: reqwest::Response,
    buf: Vec<u8>,
    ready: std::collections::VecDeque<Frame>,
}

impl Sse {
    /// Subscribes after `after`; on return the service holds the subscription (the edge answers
    /// once `Subscribe` did).
    async fn open(api: &Api, id: &str, after: u64) -> Result<Self> {
        let path = format!("/v1/conversations/{id}/events?after={after}");
        let resp = api.get(&path).header("Accept", "text/event-stream").send().await?;
        ensure!(resp.status().is_success(), "GET {path} answered {}", resp.status());
        Ok(Self { resp, buf: Vec::new(), ready: Default::default() })
    }

    async fn next(&mut self) -> Result<Frame> {
        loop {
            if let Some(f) = self.ready.pop_front() {
                return Ok(f);
            }
            let chunk = tokio::time::timeout(EVENT_TIMEOUT, self.resp.chunk())
                .await
                .with_context(|| format!("no SSE event within {EVENT_TIMEOUT:?}"))??
                .context("the SSE stream ended")?;
            let arrived_us = unix_micros();
            self.buf.extend_from_slice(&chunk);
            while let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let raw: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = String::from_utf8_lossy(&raw);
                let (mut event, mut data) = (String::new(), String::new());
                for line in text.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if event.is_empty() {
                    continue; // a keep-alive comment
                }
                let data = serde_json::from_str(&data).with_context(|| format!("SSE data is not JSON: {data}"))?;
                self.ready.push_back(Frame { event, data, arrived_us });
            }
        }
    }

    /// Frames until (and including) the first of kind `kind`.
    async fn until(&mut self, kind: &str) -> Result<Frame> {
        loop {
            let f = self.next().await?;
            if f.event == kind {
                return Ok(f);
            }
            if f.event == "turn_error" || f.event == "reset" {
                bail!("waiting for {kind}, got {}: {}", f.event, f.data);
            }
        }
    }
}

/// One subscriber's view of a stamped turn.
#[derive(Default)]
struct Seen {
    /// Latency of each delta, µs.
    lat_us: Vec<f64>,
    /// `reset` received (the subscriber fell behind: `lagged`).
    reset: Option<String>,
}

/// Reads a stamped turn from an SSE subscriber until its end.
async fn read_sse(mut sse: Sse) -> Result<Seen> {
    let mut seen = Seen::default();
    loop {
        let f = sse.next().await?;
        match f.event.as_str() {
            "text_delta" => {
                if let Some(stamp) = f.data["text_delta"]["text"].as_str().and_then(stamp_of) {
                    seen.lat_us.push(f.arrived_us.saturating_sub(stamp) as f64);
                }
            }
            "turn_done" => return Ok(seen),
            "turn_error" => bail!("the stamped turn failed: {}", f.data),
            "reset" => {
                seen.reset = Some(f.data["reset"]["reason"].as_str().unwrap_or("?").to_owned());
                return Ok(seen);
            }
            _ => {}
        }
    }
}

/// Reads a stamped turn from a gRPC subscriber until its end.
async fn read_grpc(mut w: chat::Watch) -> Result<Seen> {
    let mut seen = Seen::default();
    loop {
        let e = w.next_within(EVENT_TIMEOUT).await?.context("the gRPC event stream ended")?;
        let arrived_us = unix_micros();
        match &e.kind {
            Some(Kind::TextDelta(d)) => {
                if let Some(stamp) = stamp_of(&d.text) {
                    seen.lat_us.push(arrived_us.saturating_sub(stamp) as f64);
                }
            }
            Some(Kind::TurnDone(_)) => return Ok(seen),
            Some(Kind::TurnError(t)) => bail!("the stamped turn failed: {} {}", t.code, t.message),
            Some(Kind::Reset(r)) => {
                seen.reset = Some(r.reason.clone());
                return Ok(seen);
            }
            _ => {}
        }
    }
}

/// One row of the fan-out table: a kind of turn and who watches it.
struct Row {
    /// The pacing, printed on the first row of its group (empty on the others).
    label: String,
    pace: &'static str,
    subscribers: &'static str,
    who: Watchers,
    script: String,
    deltas: usize,
    /// The row whose latencies this one is compared with.
    base: Option<usize>,
}

impl Row {
    fn new(
        label: String,
        subscribers: &'static str,
        who: Watchers,
        script: &(String, usize),
        base: Option<usize>,
    ) -> Self {
        let pace = if script.0.starts_with("slow:") { "paced" } else { "burst" };
        Self { label, pace, subscribers, who, script: script.0.clone(), deltas: script.1, base }
    }
}

/// Who watches a fan-out turn.
#[derive(Clone, Copy)]
enum Watchers {
    Grpc,
    Sse(usize),
}

/// What the subscribers of some stamped turns saw, and the services' CPU per delta.
#[derive(Default)]
struct Fanout {
    lat_us: Vec<f64>,
    /// The `reset` reasons of subscribers dropped before the turn's end.
    resets: Vec<String>,
    deltas: usize,
    /// Scheduler counters summed over the turns (ns on a CPU, ns runnable but waiting for
    /// one): `coffer-chat`, `coffer-gateway`, this process.
    cpu_ns: [u64; 3],
    wait_ns: [u64; 3],
}

impl Fanout {
    fn p(&self, q: f64) -> f64 {
        quantile(&self.lat_us, q)
    }
}

/// Pids for the scheduler counters: `coffer-chat`, `coffer-gateway`, `self` (this process).
struct Pids([String; 3]);

impl Pids {
    fn sched(&self) -> [[u64; 3]; 3] {
        [schedstat(&self.0[0]), schedstat(&self.0[1]), schedstat(&self.0[2])]
    }
}

/// The fan-out measurement's daemon, clients and conversation.
struct FanoutBench<'a> {
    api: &'a Api,
    grpc: chat::Client,
    pids: Pids,
    id: String,
}

impl FanoutBench<'_> {
    /// One stamped turn (`script`, `deltas` deltas) watched by `who`; adds what they saw to
    /// `into`.
    async fn turn(&mut self, who: Watchers, script: &str, deltas: usize, into: &mut Fanout) -> Result<()> {
        let (api, id) = (self.api, self.id.as_str());
        let after = Rest { api }.last_seq(id).await?;
        let mut tasks = Vec::new();
        match who {
            Watchers::Grpc => {
                let w = chat::watch(&mut self.grpc, id, after).await?;
                tasks.push(tokio::spawn(read_grpc(w)));
            }
            Watchers::Sse(n) => {
                for _ in 0..n {
                    let sse = Sse::open(api, id, after).await?;
                    tasks.push(tokio::spawn(read_sse(sse)));
                }
            }
        }
        let before = self.pids.sched();
        Rest { api }.post(&format!("/v1/conversations/{id}/messages"), &json!({"text": script})).await?;
        for t in tasks {
            let seen = t.await??;
            match seen.reset {
                Some(r) => into.resets.push(r),
                None => {
                    ensure!(seen.lat_us.len() == deltas, "a subscriber saw {} of {deltas} deltas", seen.lat_us.len())
                }
            }
            into.lat_us.extend(seen.lat_us);
        }
        for (k, (now, then)) in self.pids.sched().iter().zip(before).enumerate() {
            into.cpu_ns[k] += now[0].saturating_sub(then[0]);
            into.wait_ns[k] += now[1].saturating_sub(then[1]);
        }
        into.deltas += deltas;
        Ok(())
    }
}

/// One tiny turn through REST: `(POST → turn_started, POST → its 202)`, µs; waits for the turn
/// to end on `sse`.
async fn rest_turn(api: &Api, sse: &mut Sse, id: &str) -> Result<(f64, f64)> {
    let path = format!("/v1/conversations/{id}/messages");
    let t = Instant::now();
    let post = async {
        let r = Rest { api }.post(&path, &json!({"text": "say:ok"})).await;
        (r, t.elapsed())
    };
    let started = async {
        let r = sse.until("turn_started").await;
        (r, t.elapsed())
    };
    let ((reply, answered), (frame, started)) = tokio::join!(post, started);
    reply?;
    frame?;
    sse.until("turn_done").await?;
    Ok((started.as_secs_f64() * 1e6, answered.as_secs_f64() * 1e6))
}

/// One tiny turn through gRPC: `SendMessage` → `turn_started` on `w`, µs.
async fn grpc_turn(grpc: &mut chat::Client, w: &mut chat::Watch, id: &str) -> Result<f64> {
    let mut sender = grpc.clone();
    let t = Instant::now();
    let send = async move { chat::send(&mut sender, id, "say:ok").await };
    let started = async {
        let r = w.until(EVENT_TIMEOUT, |e| matches!(e.kind, Some(Kind::TurnStarted(_)))).await;
        (r, t.elapsed())
    };
    let (reply, (events, took)) = tokio::join!(send, started);
    reply?;
    events?;
    let end = w.turn().await?;
    ensure!(matches!(end.last().and_then(|e| e.kind.as_ref()), Some(Kind::TurnDone(_))), "{:?}", chat::kinds(&end));
    Ok(took.as_secs_f64() * 1e6)
}

/// Creates a conversation and gives it one finished `say:ok` turn (REST, SSE).
async fn one_finished(api: &Api) -> Result<()> {
    let rest = Rest { api };
    let id = rest.create().await?;
    let mut sse = Sse::open(api, &id, rest.last_seq(&id).await?).await?;
    rest.post(&format!("/v1/conversations/{id}/messages"), &json!({"text": "say:ok"})).await?;
    let end = sse.until("turn_done").await?;
    ensure!(end.data["turn_done"]["stop_reason"] == "end_turn", "{}", end.data);
    Ok(())
}

/// The chat sections. `bins` must be the directory of this executable (the harness starts the
/// binaries next to it).
pub async fn run(bins: &Path) -> Result<()> {
    let here = coffer_tests::bins::bin_dir()?.canonicalize()?;
    if here != bins.canonicalize()? {
        bail!(
            "the chat benchmark runs the binaries next to coffer-bench ({}), not {}: unset COFFER_BENCH_BINS",
            here.display(),
            bins.display()
        );
    }
    for b in ["coffer-test-daemon", "coffer-test-chat"] {
        if !bins.join(b).exists() {
            bail!("{} missing: run ./scripts/bench (it builds the release binaries first)", bins.join(b).display());
        }
    }
    println!("## Chat (issue 15)\n");
    println!(
        "Scripted agent (`coffer-test-daemon scripted-chat`): no agent CLI in the first two tables. Latencies from the adapter handing an event over (its stamp) to the subscriber reading it, one clock.\n"
    );
    fanout_and_turns().await?;
    cli_start_up().await?;
    memory().await?;
    Ok(())
}

/// Fan-out and POST → `turn_started` on one scripted-chat daemon.
async fn fanout_and_turns() -> Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let rest = Rest { api: &api };
    let mut bench = FanoutBench {
        api: &api,
        grpc: chat::client(&api).await?,
        pids: Pids([
            rest.service_pid("chat").await?.to_string(),
            rest.service_pid("gateway").await?.to_string(),
            "self".to_owned(),
        ]),
        id: rest.create().await?,
    };
    // Warm-up: connections open, code paths and allocator warm.
    let mut scratch = Fanout::default();
    for who in [Watchers::Grpc, Watchers::Sse(SUBSCRIBERS)] {
        bench.turn(who, &format!("slow:{PACE_MS}\nstamped:200"), 200, &mut scratch).await?;
    }
    let paced = |ms: u64, n: usize| (format!("slow:{ms}\nstamped:{n}"), n);
    let fast = paced(PACE_MS, FANOUT_DELTAS);
    let model = paced(MODEL_PACE_MS, MODEL_PACE_DELTAS);
    let burst = (format!("stamped:{FANOUT_DELTAS}"), FANOUT_DELTAS);
    let rows: Vec<Row> = vec![
        Row::new(
            format!("1 ms apart ({FANOUT_DELTAS} deltas)"),
            "1 on gRPC `Subscribe` (baseline: no edge)",
            Watchers::Grpc,
            &fast,
            None,
        ),
        Row::new(String::new(), "1 SSE through the edge", Watchers::Sse(1), &fast, Some(0)),
        Row::new(String::new(), "**10 SSE through the edge**", Watchers::Sse(SUBSCRIBERS), &fast, Some(0)),
        Row::new(
            format!("{MODEL_PACE_MS} ms apart ({MODEL_PACE_DELTAS} deltas)"),
            "1 on gRPC `Subscribe` (baseline)",
            Watchers::Grpc,
            &model,
            None,
        ),
        Row::new(String::new(), "**10 SSE through the edge**", Watchers::Sse(SUBSCRIBERS), &model, Some(3)),
        Row::new(
            format!("one burst ({FANOUT_DELTAS} deltas)"),
            "1 on gRPC `Subscribe` (baseline)",
            Watchers::Grpc,
            &burst,
            None,
        ),
        Row::new(String::new(), "10 SSE through the edge", Watchers::Sse(SUBSCRIBERS), &burst, Some(5)),
    ];
    let mut runs: Vec<Fanout> = rows.iter().map(|_| Fanout::default()).collect();
    for _ in 0..ROUNDS {
        for (k, row) in rows.iter().enumerate() {
            bench.turn(row.who, &row.script, row.deltas, &mut runs[k]).await?;
        }
    }
    println!("### Event fan-out: adapter → subscribers, {ROUNDS} interleaved rounds per row\n");
    println!(
        "| deltas sent | subscribers | p50 | p99 | max | ratio p50 / p99 to the baseline | CPU per delta: chat / gateway / bench client | waiting for a CPU, per delta: chat / gateway / client | floor |\n|---|---|---|---|---|---|---|---|---|"
    );
    let per = |ns: [u64; 3], n: usize| {
        let v: Vec<String> = ns.iter().map(|x| format!("{:.0}", *x as f64 / n.max(1) as f64 / 1e3)).collect();
        format!("{} µs", v.join(" / "))
    };
    for (k, row) in rows.iter().enumerate() {
        let r = &runs[k];
        let subs = match row.who {
            Watchers::Grpc => 1,
            Watchers::Sse(n) => n,
        };
        let dropped = if r.resets.is_empty() {
            String::new()
        } else {
            format!(" ({} of {} subscriber-turns dropped with `reset` {:?})", r.resets.len(), subs * ROUNDS, r.resets)
        };
        let floor = if subs == SUBSCRIBERS && row.pace != "burst" {
            format!(
                "p99 < {FANOUT_P99_FLOOR_MS} ms: {}",
                pass(r.p(0.99) < FANOUT_P99_FLOOR_MS * 1e3 && r.resets.is_empty())
            )
        } else {
            "—".to_owned()
        };
        let ratio = match row.base {
            None => "—".to_owned(),
            Some(b) => format!("{:.1}× / {:.1}×", r.p(0.5) / runs[b].p(0.5), r.p(0.99) / runs[b].p(0.99)),
        };
        println!(
            "| {} | {}{dropped} | {} | {} | {} | {ratio} | {} | {} | {floor} |",
            row.label,
            row.subscribers,
            ms(r.p(0.5)),
            ms(r.p(0.99)),
            ms(r.p(1.0)),
            per(r.cpu_ns, r.deltas),
            per(r.wait_ns, r.deltas),
        );
    }

    // POST → turn_started, REST and gRPC interleaved.
    let mut grpc = bench.grpc;
    // A conversation per path: a subscriber sees every turn of its conversation.
    let (id, grpc_id) = (rest.create().await?, rest.create().await?);
    let mut sse = Sse::open(&api, &id, rest.last_seq(&id).await?).await?;
    let mut w = chat::watch(&mut grpc, &grpc_id, rest.last_seq(&grpc_id).await?).await?;
    for _ in 0..WARM_TURNS {
        rest_turn(&api, &mut sse, &id).await?;
        grpc_turn(&mut grpc, &mut w, &grpc_id).await?;
    }
    let (mut rest_started, mut rest_answered, mut grpc_started) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        for _ in 0..TURNS / ROUNDS {
            let (s, a) = rest_turn(&api, &mut sse, &id).await?;
            rest_started.push(s);
            rest_answered.push(a);
        }
        for _ in 0..TURNS / ROUNDS {
            grpc_started.push(grpc_turn(&mut grpc, &mut w, &grpc_id).await?);
        }
    }
    println!("\n### POST → `turn_started`: {TURNS} tiny turns (`say:ok`) per row, {ROUNDS} interleaved rounds\n");
    println!("| path | p50 | p99 | ratio p50 / p99 to the baseline | floor |\n|---|---|---|---|---|");
    let (g50, g99) = (quantile(&grpc_started, 0.5), quantile(&grpc_started, 0.99));
    println!(
        "| gRPC `SendMessage` → `turn_started` on gRPC `Subscribe` (baseline: no edge) | {} | {} | — | — |",
        ms(g50),
        ms(g99)
    );
    let (r50, r99) = (quantile(&rest_started, 0.5), quantile(&rest_started, 0.99));
    println!(
        "| `POST …/messages` → `turn_started` on an open SSE stream | {} | {} | {:.2}× / {:.2}× | p99 < {TURN_STARTED_FLOOR_MS} ms: {} |",
        ms(r50),
        ms(r99),
        r50 / g50,
        r99 / g99,
        pass(r99 < TURN_STARTED_FLOOR_MS * 1e3)
    );
    println!(
        "| `POST …/messages` → its `202` answered | {} | {} | — | — |\n",
        ms(quantile(&rest_answered, 0.5)),
        ms(quantile(&rest_answered, 0.99))
    );
    drop(sse);
    drop(w);
    Ok(())
}

/// The conversation id of CLI run `n` (a ULID shape the providers accept).
fn cli_conversation(n: usize) -> String {
    format!("01JBENCHC0NVERSAT10N{n:03}")
}

/// Time from `start_turn` to the first text delta, and the turn's session id; the turn is
/// followed to its end, which must be `Done`.
async fn cli_turn(provider: &dyn AgentProvider, env: &AgentEnv, input: TurnInput) -> Result<(Duration, String)> {
    let (tx, mut rx) = mpsc::channel(1024);
    let t = Instant::now();
    let running = provider.start_turn(env, input, tx).map_err(|e| anyhow::anyhow!("start_turn: {e:?}"))?;
    let (mut first, mut session) = (None, String::new());
    let deadline = Instant::now() + CLI_TURN_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = tokio::time::timeout(left, rx.recv())
            .await
            .with_context(|| format!("no terminal event within {CLI_TURN_TIMEOUT:?}"))?
            .context("the adapter ended without a terminal event")?;
        match ev {
            AgentEvent::TextDelta(_) if first.is_none() => first = Some(t.elapsed()),
            AgentEvent::Session { session_id, .. } => session = session_id,
            AgentEvent::Done { .. } => break,
            AgentEvent::Failed { kind, message } => bail!("the turn failed ({kind:?}): {message}"),
            _ => {}
        }
    }
    tokio::time::timeout(Duration::from_secs(10), running.task).await??;
    Ok((first.context("the turn streamed no text")?, session))
}

/// The real CLIs' own start-up, or a line saying why it is skipped.
async fn cli_start_up() -> Result<()> {
    println!("### Agent CLIs' own start-up (real CLIs on the fake model APIs; reported apart from the floors)\n");
    println!(
        "From the provider's `start_turn` (the engine calls it right after publishing `turn_started`) to the first `text_delta`; median of {CLI_RUNS} conversations (min–max).\n"
    );
    println!(
        "| agent | fresh conversation (CLI starts) | second turn on the kept process | ratio |\n|---|---|---|---|"
    );
    let (claude, codex) = (coffer_tests::peers::claude_code(), coffer_tests::peers::codex());
    if let (Err(e), _) | (_, Err(e)) = (&claude, &codex) {
        println!("| Claude Code, Codex | SKIPPED: {e} | — | — |\n");
        return Ok(());
    }
    let home = TestHome::new()?;
    // The agents' attached shim finds this daemon (as in the chat service, where one runs).
    home.start_daemon().await?;
    let cwd = home.temp().join("workspace");
    std::fs::create_dir_all(&cwd)?;
    let user_home = PathBuf::from(&home.env()["HOME"]);
    let anthropic = FakeAnthropic::scripted().await?;
    let openai = FakeOpenAi::start().await?;
    coffer_tests::write_file(&user_home.join(".codex/config.toml"), openai.codex_config("fake-model"))?;
    let claude_env: Vec<(OsString, OsString)> = vec![
        ("HOME".into(), user_home.clone().into()),
        ("CLAUDE_CONFIG_DIR".into(), user_home.join(".claude").into()),
        // The home's private TMPDIR: /tmp is an ancestor of this COFFER_HOME (vault sandbox).
        ("TMPDIR".into(), home.env()["TMPDIR"].clone().into()),
        ("ANTHROPIC_BASE_URL".into(), anthropic.url.clone().into()),
        ("ANTHROPIC_API_KEY".into(), "sk-ant-bench-not-a-real-key".into()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(), "1".into()),
        ("DISABLE_TELEMETRY".into(), "1".into()),
        ("DISABLE_AUTOUPDATER".into(), "1".into()),
        ("DISABLE_ERROR_REPORTING".into(), "1".into()),
        ("CLAUDE_CODE_MAX_RETRIES".into(), "0".into()),
    ];
    let codex_env: Vec<(OsString, OsString)> =
        vec![("HOME".into(), user_home.into()), ("OPENAI_API_KEY".into(), "sk-bench-not-a-real-key".into())];
    let agents: [(&str, Box<dyn AgentProvider>, PathBuf); 2] = [
        ("Claude Code", Box::new(coffer_chat::claude_code::ClaudeCode::with_env(claude_env)), claude?),
        ("Codex", Box::new(coffer_chat::codex::Codex::with_env(codex_env)), codex?),
    ];
    for (name, provider, program) in agents {
        let env = AgentEnv {
            coffer_home: home.root().to_path_buf(),
            agents_dir: home.root().join("agents"),
            shim: coffer_tests::bin("coffer-mcp-shim")?,
            command_override: Some(program),
            binding: None,
            sandbox: true,
        };
        let (mut fresh, mut kept) = (Vec::new(), Vec::new());
        for n in 0..CLI_RUNS {
            let conversation_id = cli_conversation(n);
            let input = |session: &str, turn: usize, text: &str| TurnInput {
                conversation_id: conversation_id.clone(),
                turn_id: format!("01JBENCHTVRN{n:03}{turn}"),
                text: text.into(),
                config: AgentConfig {
                    cwd: cwd.display().to_string(),
                    model: String::new(),
                    session_id: session.into(),
                    ..Default::default()
                },
                attachments: Vec::new(),
            };
            let (first, session) = cli_turn(provider.as_ref(), &env, input("", 1, "SAY[one two three]")).await?;
            ensure!(!session.is_empty(), "{name}: no session id from the first turn");
            let (second, _) = cli_turn(provider.as_ref(), &env, input(&session, 2, "SAY[four five six]")).await?;
            fresh.push(first);
            kept.push(second);
            provider.forget(&env, &conversation_id);
        }
        let show = |mut v: Vec<Duration>| {
            v.sort();
            let m = |d: Duration| d.as_secs_f64() * 1e3;
            (m(v[v.len() / 2]), format!("{:.0} ms ({:.0}–{:.0})", m(v[v.len() / 2]), m(v[0]), m(v[v.len() - 1])))
        };
        let ((f, fs), (k, ks)) = (show(fresh), show(kept));
        println!("| {name} | {fs} | {ks} | {:.0}× faster kept |", f / k);
    }
    println!();
    Ok(())
}

/// Memory of `coffer-chat` with [`IDLE_CONVERSATIONS`] idle conversations.
async fn memory() -> Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let rest = Rest { api: &api };
    let pid = rest.service_pid("chat").await?;
    let (rss0, hwm0) = rss_hwm_kib(pid);
    let t = Instant::now();
    let mut workers = Vec::new();
    for w in 0..CREATORS {
        let api = api.clone();
        workers.push(tokio::spawn(async move {
            for _ in (w..IDLE_CONVERSATIONS).step_by(CREATORS) {
                one_finished(&api).await?;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for w in workers {
        w.await??;
    }
    let took = t.elapsed();
    ensure!(rest.service_pid("chat").await? == pid, "coffer-chat restarted during the memory measurement");
    let listed = rest.get("/v1/conversations?limit=1").await?;
    ensure!(listed["items"].as_array().is_some_and(|a| a.len() == 1), "{listed}");
    let (rss, hwm) = rss_hwm_kib(pid);
    let mib = |k: u64| k as f64 / 1024.0;
    println!(
        "### Memory of `coffer-chat` with {IDLE_CONVERSATIONS} idle conversations (each with one finished turn, created through REST, {CREATORS} at a time in {:.1} s)\n",
        took.as_secs_f64()
    );
    println!("| measure | value | baseline (same process, no conversation) | ratio | floor |\n|---|---|---|---|---|");
    println!(
        "| `VmRSS` | {:.1} MiB ({:.1} MB) | {:.1} MiB | {:.2}× (+{:.1} KiB per conversation) | < 50 MB: {} |",
        mib(rss),
        rss as f64 * 1024.0 / 1e6,
        mib(rss0),
        rss as f64 / rss0.max(1) as f64,
        rss.saturating_sub(rss0) as f64 / IDLE_CONVERSATIONS as f64,
        pass(rss * 1024 < MEMORY_FLOOR_BYTES)
    );
    println!(
        "| `VmHWM` (peak) | {:.1} MiB ({:.1} MB) | {:.1} MiB | {:.2}× | < 50 MB: {} |\n",
        mib(hwm),
        hwm as f64 * 1024.0 / 1e6,
        mib(hwm0),
        hwm as f64 / hwm0.max(1) as f64,
        pass(hwm * 1024 < MEMORY_FLOOR_BYTES)
    );
    Ok(())
}
