//! Chat through the edge of a real daemon (`coffer-test-daemon scripted-chat`: the chat service
//! with the test-only `scripted` agent, `coffer_tests::chat`): the REST shapes and their
//! hostile input (unknown agent or conversation, bad `cwd`, empty and over-long text, a stale
//! `If-Match`, archived conversations), the SSE framing of `…/events` (`id:` = `seq`, `event:` =
//! `kind`, resumption with `Last-Event-ID` mid-turn without loss or duplicate, `reset` on
//! delete ends the stream, a client that goes away stops nothing), and `coffer chat` with
//! `--json` and its exit codes.
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use coffer_tests::chat::{rest_create as create, rest_send as send};
use coffer_tests::{Api, SendExt, TestHome, chat};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

const UNKNOWN: &str = "01JDQ8ZKXW5T3M2N4P6R7S8T9V";
/// How long a test waits for one SSE frame.
const FRAME_TIMEOUT: Duration = Duration::from_secs(20);

async fn daemon() -> anyhow::Result<(TestHome, Api)> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    Ok((home, api))
}

/// One SSE frame as the edge wrote it: its `id:`, `event:` and parsed `data:`.
#[derive(Debug, Clone, PartialEq)]
struct Frame {
    id: u64,
    event: String,
    data: Value,
}

/// An open `…/events` response, read frame by frame.
struct Sse {
    resp: reqwest::Response,
    parser: coffer_types::sse::SseParser,
    ready: std::collections::VecDeque<Frame>,
}

impl Sse {
    async fn open(api: &Api, id: &str, last_event_id: Option<u64>) -> anyhow::Result<Self> {
        let mut req = api.get(&format!("/v1/conversations/{id}/events"));
        if let Some(n) = last_event_id {
            req = req.header("Last-Event-ID", n.to_string());
        }
        let resp = req.send().await?;
        ensure!(resp.status() == 200, "events: {}", resp.status());
        let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        ensure!(ct.starts_with("text/event-stream"), "content type {ct}");
        ensure!(resp.headers().contains_key("x-coffer-trace"), "no trace id on the stream");
        Ok(Self { resp, parser: coffer_types::sse::SseParser::new(), ready: Default::default() })
    }

    /// The next frame; `None` when the stream ended.
    async fn next(&mut self) -> anyhow::Result<Option<Frame>> {
        loop {
            if let Some(f) = self.ready.pop_front() {
                return Ok(Some(f));
            }
            let chunk = tokio::time::timeout(FRAME_TIMEOUT, self.resp.chunk()).await.context("no frame in time")??;
            let Some(bytes) = chunk else { return Ok(None) };
            let mut out = Vec::new();
            self.parser.push(&bytes, &mut out);
            for e in out {
                let id = self.parser.last_event_id().context("a frame without id")?.parse::<u64>()?;
                let data: Value = serde_json::from_slice(&e.data)?;
                self.ready.push_back(Frame { id, event: e.event.clone(), data });
            }
        }
    }

    /// Frames up to and including the first `turn_done` or `turn_error`.
    async fn turn(&mut self) -> anyhow::Result<Vec<Frame>> {
        let mut out = Vec::new();
        loop {
            let f = self.next().await?.context("the stream ended before the turn did")?;
            let end = matches!(f.event.as_str(), "turn_done" | "turn_error");
            out.push(f);
            if end {
                return Ok(out);
            }
        }
    }
}

fn texts(frames: &[Frame]) -> String {
    frames.iter().filter(|f| f.event == "text_delta").filter_map(|f| f.data["text_delta"]["text"].as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_over_rest_with_their_hostile_input() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    let agents = api.get("/v1/agents").reply().await?.ok_json()?;
    let items = agents["items"].as_array().context("items")?;
    let find = |k: &str| items.iter().find(|a| a["agent_key"] == k).cloned().unwrap_or(Value::Null);
    assert_eq!((&find("scripted")["available"], &find("scripted")["reason"]), (&json!(true), &Value::Null));
    let missing = find("scripted_missing");
    assert_eq!(missing["available"], false);
    assert!(missing["reason"].as_str().unwrap_or("").contains("never available"), "{missing}");

    // Creation: an unknown agent, an unavailable one, a cwd that does not exist or is a file.
    let post = |body: Value| api.post_json("/v1/conversations", &body).reply();
    post(json!({"agent_key": "nope"})).await?.expect_envelope(404, "NOT_FOUND")?;
    post(json!({"agent_key": "scripted_missing"})).await?.expect_envelope(409, "CONFLICT")?;
    let file = home.temp().join("a-file");
    std::fs::write(&file, "x")?;
    for cwd in [home.temp().join("absent"), file] {
        let e = post(json!({"agent_key": "scripted", "agent_config": {"cwd": cwd}}))
            .await?
            .expect_envelope(400, "INVALID_ARGUMENT")?;
        assert!(e["message"].as_str().unwrap_or("").contains("cwd"), "{e}");
    }
    let none = api.get("/v1/conversations?archived=all").reply().await?.ok_json()?;
    assert_eq!(none, json!({"items": [], "next_cursor": null}), "a refused create stores nothing");

    let r = api.post_json("/v1/conversations", &json!({"agent_key": "scripted", "title": "First"})).reply().await?;
    assert_eq!((r.status.as_u16(), r.headers.get("etag").and_then(|v| v.to_str().ok())), (201, Some("\"1\"")));
    let c = r.json()?;
    let id = c["id"].as_str().context("id")?.to_owned();
    let cwd = std::path::PathBuf::from(c["agent_config"]["cwd"].as_str().context("cwd")?);
    assert_eq!(cwd.canonicalize()?, home.root().join("workspace").canonicalize()?, "{c}");
    assert!(home.root().join("workspace").is_dir());
    assert_eq!((&c["title"], &c["archived"], &c["turn_running"]), (&json!("First"), &json!(false), &json!(false)));

    // Unknown and malformed conversation ids.
    for m in [Method::GET, Method::DELETE] {
        api.request(m, &format!("/v1/conversations/{UNKNOWN}")).reply().await?.expect_envelope(404, "NOT_FOUND")?;
    }
    api.post_json(&format!("/v1/conversations/{UNKNOWN}/messages"), &json!({"text": "hi"}))
        .reply()
        .await?
        .expect_envelope(404, "NOT_FOUND")?;
    api.get(&format!("/v1/conversations/{UNKNOWN}/events")).reply().await?.expect_envelope(404, "NOT_FOUND")?;
    api.get("/v1/conversations/not-an-id").reply().await?.expect_envelope(400, "INVALID_ARGUMENT")?;

    // Text: empty and 1 MiB + 1 are refused naming the limit; exactly 1 MiB is accepted.
    let msgs = format!("/v1/conversations/{id}/messages");
    for text in [String::new(), "x".repeat(1024 * 1024 + 1)] {
        let e = api.post_json(&msgs, &json!({"text": text})).reply().await?.expect_envelope(400, "INVALID_ARGUMENT")?;
        assert!(e["message"].as_str().unwrap_or("").contains("1 MiB"), "{e}");
    }
    let mut sse = Sse::open(&api, &id, None).await?;
    let reply = send(&api, &id, &"x".repeat(1024 * 1024)).await?;
    assert_eq!(reply["message"]["role"], "user", "{}", reply.to_string().chars().take(300).collect::<String>());
    assert_eq!(reply["message"]["source"], "api");
    let turn = sse.turn().await?;
    assert_eq!(texts(&turn).len(), 1024 * 1024, "the whole text came back through the stream");

    // Versions: a stale If-Match is 409 and changes nothing; the right one bumps the ETag.
    let view = api.get(&format!("/v1/conversations/{id}")).reply().await?;
    let etag = view.headers.get("etag").and_then(|v| v.to_str().ok()).context("etag")?.to_owned();
    let conv = format!("/v1/conversations/{id}");
    let stale = api.request(Method::PATCH, &conv).header("If-Match", "\"999\"").json(&json!({"title": "No"}));
    stale.reply().await?.expect_envelope(409, "CONFLICT")?;
    let r = api
        .request(Method::PATCH, &conv)
        .header("If-Match", &etag)
        .json(&json!({"title": "Renamed", "model": "m2"}))
        .reply()
        .await?;
    let c = r.ok_json()?;
    assert_eq!((&c["title"], &c["agent_config"]["model"]), (&json!("Renamed"), &json!("m2")));
    assert_ne!(r.headers.get("etag").and_then(|v| v.to_str().ok()), Some(etag.as_str()));
    assert!(
        !c["agent_config"]["session_id"].as_str().unwrap_or("").is_empty(),
        "the model change keeps the session: {c}"
    );

    // Archive: out of the default list, refuses messages (409), restore brings it back.
    api.request(Method::PATCH, &conv).json(&json!({"archived": true})).reply().await?.ok_json()?;
    let active = api.get("/v1/conversations").reply().await?.ok_json()?;
    assert_eq!(active["items"].as_array().map(Vec::len), Some(0), "{active}");
    let archived = api.get("/v1/conversations?archived=archived&q=renam").reply().await?.ok_json()?;
    assert_eq!(archived["items"][0]["id"], id.as_str(), "{archived}");
    api.post_json(&msgs, &json!({"text": "hi"})).reply().await?.expect_envelope(409, "CONFLICT")?;
    api.request(Method::PATCH, &conv).json(&json!({"archived": false})).reply().await?.ok_json()?;

    // Messages page oldest first, with the tool call's input as an object.
    send(&api, &id, "tool:Read {\"path\": \"a.md\"}").await?;
    sse.turn().await?;
    let page = api.get(&format!("{msgs}?limit=2")).reply().await?.ok_json()?;
    assert_eq!(page["items"].as_array().map(Vec::len), Some(2), "{page}");
    let rest = api
        .get(&format!("{msgs}?after={}", page["next_cursor"].as_str().context("cursor")?))
        .reply()
        .await?
        .ok_json()?;
    let last = rest["items"].as_array().and_then(|a| a.last()).context("messages")?.clone();
    let tool =
        last["blocks"].as_array().and_then(|b| b.iter().find(|b| b["type"] == "tool_use")).context("tool_use")?;
    assert_eq!(tool["tool_use"]["input"], json!({"path": "a.md"}), "{last}");

    // Delete: every subscriber gets reset(deleted) and its stream ends; a second delete is 404.
    let r = api.request(Method::DELETE, &conv).reply().await?.ok_json()?;
    assert_eq!(r, json!({"deleted": true, "turn_cancelled": false}));
    let f = sse.next().await?.context("reset")?;
    assert_eq!((f.event.as_str(), &f.data["reset"]["reason"]), ("reset", &json!("deleted")));
    assert!(sse.next().await?.is_none(), "the stream ends after reset(deleted)");
    api.request(Method::DELETE, &conv).reply().await?.expect_envelope(404, "NOT_FOUND")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_frames_resume_mid_turn_without_loss_or_duplicate() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    let id = create(&api).await?["id"].as_str().context("id")?.to_owned();
    // A reference watcher that stays for the whole turn, and one that leaves and comes back.
    let mut reference = Sse::open(&api, &id, None).await?;
    let mut first = Sse::open(&api, &id, None).await?;
    let reply = send(&api, &id, "slow:20\ndeltas:40").await?;
    let user_id = reply["message"]["id"].as_str().context("message id")?.to_owned();

    let mut seen = Vec::new();
    while seen.iter().filter(|f: &&Frame| f.event == "text_delta").count() < 10 {
        seen.push(first.next().await?.context("frame")?);
    }
    // The client goes away mid-turn: the turn goes on.
    drop(first);
    let last = seen.last().context("frames")?.id;
    let mut again = Sse::open(&api, &id, Some(last)).await?;
    seen.extend(again.turn().await?);
    let whole = reference.turn().await?;

    assert_eq!(seen, whole, "resumed frames are exactly the reference's");
    for f in &whole {
        assert_eq!(f.data["seq"], f.id, "id: is the seq: {f:?}");
        assert_eq!(f.data["kind"], f.event.as_str(), "event: is the kind: {f:?}");
        assert_eq!(f.data["conversation_id"], id.as_str());
        assert!(f.data[&f.event].is_object(), "{f:?}");
    }
    assert!(whole.windows(2).all(|w| w[0].id < w[1].id), "ids strictly increase");
    let kinds: Vec<&str> = whole.iter().map(|f| f.event.as_str()).collect();
    assert_eq!(&kinds[..2], &["message_created", "turn_started"], "{kinds:?}");
    assert_eq!(whole[0].data["message_created"]["message"]["id"], user_id.as_str());
    assert_eq!(kinds.last(), Some(&"turn_done"));
    assert_eq!(texts(&whole), (0..40).map(|i| format!("w{i} ")).collect::<String>());

    // `?after=` resumes like Last-Event-ID; the turn is over, so what is retained after the
    // cut replays and the stream stays open for the next turn.
    let cut = whole[5].id;
    let mut late = api.get(&format!("/v1/conversations/{id}/events?after={cut}")).send().await?;
    ensure!(late.status() == 200, "{}", late.status());
    let mut parser = coffer_types::sse::SseParser::new();
    let mut ids = Vec::new();
    while ids.last() != Some(&whole.last().context("last")?.id) {
        let chunk = tokio::time::timeout(FRAME_TIMEOUT, late.chunk()).await??.context("ended early")?;
        let mut out = Vec::new();
        parser.push(&chunk, &mut out);
        for e in out {
            let data: Value = serde_json::from_slice(&e.data)?;
            ids.push(data["seq"].as_u64().context("seq")?);
        }
    }
    let want: Vec<u64> = whole.iter().map(|f| f.id).filter(|s| *s > cut).collect();
    assert_eq!(ids, want);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chat_cli_prints_bodies_unchanged_and_exits_by_the_outcome() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    let cli = |args: &'static [&'static str]| home.cli(args);

    // --json prints the REST bodies.
    let out = cli(&["chat", "agents", "--json"]).await?.ok()?;
    assert_eq!(out.json()?, api.get("/v1/agents").reply().await?.ok_json()?);
    let human = cli(&["chat", "agents"]).await?.ok()?;
    assert!(human.stdout.contains("scripted_missing") && human.stdout.contains("never available"), "{human}");

    // Exit codes: unknown agent 3, unavailable 4, bad cwd 2, unknown conversation 3.
    assert_eq!(cli(&["chat", "new", "--agent", "nope"]).await?.code, Some(3));
    assert_eq!(cli(&["chat", "new", "--agent", "scripted_missing", "--json"]).await?.code, Some(4));
    let bad = home.cli(&["chat", "new", "--agent", "scripted", "--cwd", "/nonexistent/x"]).await?;
    assert_eq!(bad.code, Some(2), "{bad}");
    for args in [
        &["chat", "show", UNKNOWN][..],
        &["chat", "send", UNKNOWN, "hi"],
        &["chat", "rm", UNKNOWN],
        &["chat", "watch", UNKNOWN],
    ] {
        let out = home.cli(args).await?;
        assert_eq!(out.code, Some(3), "{out}");
    }

    // new with a first message and --watch follows the turn to its end.
    let out = cli(&["chat", "new", "--agent", "scripted", "--watch", "say:hello from the cli"]).await?.ok()?;
    assert!(out.stdout.contains("hello from the cli") && out.stdout.contains("✓ done · end_turn"), "{out}");
    let list = cli(&["chat", "list", "--json"]).await?.ok()?.json()?;
    let id = list["items"][0]["id"].as_str().context("id")?.to_owned();
    assert_eq!(list["items"][0]["title"], "say:hello from the cli");
    let shown = home.cli(&["chat", "show", &id, "--json", "--messages", "5"]).await?.ok()?.json()?;
    assert_eq!(shown, api.get(&format!("/v1/conversations/{id}?messages=5")).reply().await?.ok_json()?);
    assert_eq!(shown["messages"][0]["source"], "cli", "the CLI's messages say so: {shown}");

    // send --watch: tool summaries, results, a failed turn exits 1 naming its cause.
    let out = home.cli(&["chat", "send", &id, "tool:Read {\"path\": \"notes.md\"}", "--watch"]).await?.ok()?;
    assert!(out.stdout.contains("⚙ Read({\"path\":\"notes.md\"})") && out.stdout.contains("↳ result of Read"), "{out}");
    let out = home.cli(&["chat", "send", &id, "fail:provider the model API answered 500", "--watch"]).await?;
    assert_eq!(out.code, Some(1), "{out}");
    assert!(out.stderr.contains("the turn failed (provider)") && out.stderr.contains("500"), "{out}");

    // A failed turn paused the (empty) queue, yet the next message runs at once (stop, then
    // redirect); stop when idle is a no-op.
    let now = api.get(&format!("/v1/conversations/{id}?messages=1")).reply().await?.ok_json()?;
    assert_eq!(now["pending"]["paused"], true, "a failed turn pauses: {now}");
    let mut watcher = Sse::open(&api, &id, now["last_seq"].as_u64()).await?;
    let out = home.cli(&["chat", "send", &id, "say:redirected"]).await?.ok()?;
    assert!(out.stdout.starts_with("Sent; the turn started"), "{out}");
    assert_eq!(texts(&watcher.turn().await?).trim(), "redirected");
    let q = home.cli(&["chat", "pending", &id, "--json"]).await?.ok()?.json()?;
    assert_eq!(q, json!({"items": [], "paused": false}), "nothing was waiting: no pause is left");
    let idle = home.cli(&["chat", "stop", &id, "--json"]).await?.ok()?.json()?;
    assert_eq!(idle, json!({"interrupted": false}));
    // stop mid-turn: the partial text is kept as `interrupted`, and the queue pauses with what
    // waited; a message sent then runs at once, the waiting one after a resume.
    send(&api, &id, "say:partial answer\nhang").await?;
    loop {
        let f = watcher.next().await?.context("stream ended")?;
        if f.event == "text_delta" && f.data["text_delta"]["text"] == "answer" {
            break;
        }
    }
    let out = home.cli(&["chat", "send", &id, "say:queued"]).await?.ok()?;
    assert_eq!(out.stdout, "Queued as #1 (a turn is running)\n", "{out}");
    let out = home.cli(&["chat", "stop", &id]).await?.ok()?;
    assert!(out.stdout.contains("Stopped the turn") && out.stdout.contains("runs at once"), "{out}");
    let end = watcher.turn().await?;
    let done = end.last().context("turn end")?;
    assert_eq!(done.data["turn_done"]["stop_reason"], "interrupted", "{done:?}");
    assert_eq!(done.data["turn_done"]["message"]["status"], "interrupted", "{done:?}");
    let shown = home.cli(&["chat", "show", &id]).await?.ok()?;
    assert!(shown.stdout.contains("interrupted") && shown.stdout.contains("partial answer"), "{shown}");
    let q = home.cli(&["chat", "pending", &id, "--json"]).await?.ok()?.json()?;
    assert_eq!(q["paused"], true, "an interrupt pauses the queue: {q}");
    let out = home.cli(&["chat", "send", &id, "say:instead", "--watch"]).await?.ok()?;
    assert!(out.stdout.contains("instead") && out.stdout.contains("✓ done"), "{out}");
    let q = home.cli(&["chat", "pending", &id, "--json"]).await?.ok()?.json()?;
    assert_eq!((q["items"][0]["text"].as_str(), &q["paused"]), (Some("say:queued"), &json!(true)), "{q}");
    let q = home.cli(&["chat", "pending", &id, "--resume", "--json"]).await?.ok()?.json()?;
    assert_eq!(q["paused"], false, "{q}");
    loop {
        let turn = watcher.turn().await?;
        if texts(&turn).trim() == "queued" {
            break;
        }
    }

    // watch --json prints each event's data line; Ctrl-C stops watching only (exit 0).
    let mut child = home
        .cli_command(&["chat", "watch", &id, "--json"])?
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().context("stdout")?).lines();
    let mut errs = tokio::io::BufReader::new(child.stderr.take().context("stderr")?).lines();
    // It says so on stderr once its stream is open.
    let said = tokio::time::timeout(FRAME_TIMEOUT, errs.next_line()).await??.context("watch said nothing")?;
    assert!(said.starts_with("Watching conversation"), "{said}");
    send(&api, &id, "slow:50\ndeltas:4").await?;
    let got = tokio::time::timeout(FRAME_TIMEOUT, async {
        loop {
            let line = lines.next_line().await?.context("watch ended")?;
            let v: Value = serde_json::from_str(&line).with_context(|| format!("not JSON: {line}"))?;
            if v["kind"] == "turn_done" {
                return anyhow::Ok(v);
            }
        }
    })
    .await??;
    assert_eq!(got["turn_done"]["stop_reason"], "end_turn", "{got}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id().context("pid")? as i32),
        nix::sys::signal::Signal::SIGINT,
    )?;
    let status = tokio::time::timeout(FRAME_TIMEOUT, child.wait()).await??;
    assert_eq!(status.code(), Some(0), "Ctrl-C ends watch cleanly");

    // rename, archive (send refused: 4), restore, rm (then 3).
    home.cli(&["chat", "rename", &id, "A", "new", "title"]).await?.ok()?;
    home.cli(&["chat", "archive", &id]).await?.ok()?;
    assert_eq!(home.cli(&["chat", "send", &id, "hi"]).await?.code, Some(4));
    let c = home.cli(&["chat", "restore", &id, "--json"]).await?.ok()?.json()?;
    assert_eq!((&c["title"], &c["archived"]), (&json!("A new title"), &json!(false)));
    let gone = home.cli(&["chat", "rm", &id, "--json"]).await?.ok()?.json()?;
    assert_eq!(gone["deleted"], true);
    let again = home.cli(&["chat", "rm", &id, "--json"]).await?;
    assert_eq!(again.code, Some(3), "{again}");
    match again.json()?["error"]["code"].as_str() {
        Some("NOT_FOUND") => Ok(()),
        other => bail!("expected a NOT_FOUND envelope, got {other:?}: {again}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_survives_a_chat_service_restart_and_resumes_its_stream() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    let id = create(&api).await?["id"].as_str().context("id")?.to_owned();
    let mut child = home
        .cli_command(&["chat", "watch", &id, "--json"])?
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().context("stdout")?).lines();
    let mut errs = tokio::io::BufReader::new(child.stderr.take().context("stderr")?).lines();
    let said = tokio::time::timeout(FRAME_TIMEOUT, errs.next_line()).await??.context("watch said nothing")?;
    assert!(said.starts_with("Watching conversation"), "{said}");
    send(&api, &id, "say:before").await?;
    let (_, first) = tokio::time::timeout(FRAME_TIMEOUT, until_turn_done(&mut lines)).await??;

    // The chat service dies: the edge ends the stream, the CLI reopens it once the supervisor
    // has restarted the service, from the last event it printed.
    let old = api.service("chat").await?["pid"].as_i64().context("pid")? as i32;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(old), nix::sys::signal::Signal::SIGKILL)?;
    coffer_tests::wait_for("chat to be restarted", Duration::from_secs(20), || async {
        let s = api.service("chat").await?;
        Ok((s["state"] == "healthy" && s["pid"] != old).then_some(()))
    })
    .await?;
    send(&api, &id, "say:after the restart").await?;
    let (done, second) = tokio::time::timeout(Duration::from_secs(40), until_turn_done(&mut lines)).await??;
    assert_eq!(done["turn_done"]["stop_reason"], "end_turn");
    let all: Vec<u64> = first.iter().chain(&second).copied().collect();
    assert!(all.windows(2).all(|w| w[0] < w[1]), "no event twice, none out of order across the restart: {all:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id().context("pid")? as i32),
        nix::sys::signal::Signal::SIGINT,
    )?;
    let status = tokio::time::timeout(FRAME_TIMEOUT, child.wait()).await??;
    assert_eq!(status.code(), Some(0));
    Ok(())
}

/// JSON lines of `coffer chat watch --json` up to a `turn_done`: that event and every seq read.
async fn until_turn_done(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) -> anyhow::Result<(Value, Vec<u64>)> {
    let mut seqs = Vec::new();
    loop {
        let line = lines.next_line().await?.context("watch ended")?;
        let v: Value = serde_json::from_str(&line).with_context(|| format!("not JSON: {line}"))?;
        seqs.push(v["seq"].as_u64().context("seq")?);
        if v["kind"] == "turn_done" {
            return Ok((v, seqs));
        }
    }
}
