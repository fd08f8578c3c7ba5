//! The conversation list, live, over HTTP (`GET /v1/conversations/events` on a real daemon with
//! the scripted agent): a frame for every create, rename, archive, restore, turn start and end,
//! queued message and delete, each conversation exactly as `GET /v1/conversations` lists it;
//! several watchers see the same; bad parameters and a missing token are refused; the stream
//! ends when the gateway goes away (the client reconnects and reloads).
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::{Api, SendExt, TestHome, chat};
use reqwest::Method;
use serde_json::{Value, json};

/// How long a test waits for one frame.
const FRAME_TIMEOUT: Duration = Duration::from_secs(20);

/// An open list stream, read frame by frame: `(event, data)`.
struct ListStream {
    resp: reqwest::Response,
    parser: coffer_types::sse::SseParser,
    ready: std::collections::VecDeque<(String, Value)>,
}

impl ListStream {
    async fn open(api: &Api) -> anyhow::Result<Self> {
        let resp = api.get("/v1/conversations/events").send().await?;
        ensure!(resp.status() == 200, "events: {}", resp.status());
        let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        ensure!(ct.starts_with("text/event-stream"), "content type {ct}");
        Ok(Self { resp, parser: coffer_types::sse::SseParser::new(), ready: Default::default() })
    }

    /// The next frame; `None` when the stream ended.
    async fn next(&mut self) -> anyhow::Result<Option<(String, Value)>> {
        loop {
            if let Some(f) = self.ready.pop_front() {
                return Ok(Some(f));
            }
            let chunk = tokio::time::timeout(FRAME_TIMEOUT, self.resp.chunk()).await.context("no frame in time")??;
            let Some(bytes) = chunk else { return Ok(None) };
            let mut out = Vec::new();
            self.parser.push(&bytes, &mut out);
            for e in out {
                ensure!(self.parser.last_event_id().is_none(), "list frames carry no id");
                self.ready.push_back((e.event.clone(), serde_json::from_slice(&e.data)?));
            }
        }
    }

    /// Frames until one satisfies `done` (which is returned).
    async fn until(&mut self, what: &str, done: impl Fn(&str, &Value) -> bool) -> anyhow::Result<Value> {
        loop {
            let (event, data) = self.next().await?.with_context(|| format!("the stream ended before {what}"))?;
            if done(&event, &data) {
                return Ok(data);
            }
        }
    }
}

fn is_conv(event: &str, data: &Value, id: &str) -> bool {
    event == "conversation" && data["id"] == id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_list_events_follow_every_change_as_the_list_shows_it() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let mut a = ListStream::open(&api).await?;
    let mut b = ListStream::open(&api).await?;

    let r = api.post_json("/v1/conversations", &json!({"agent_key": chat::SCRIPTED, "title": "First"})).reply().await?;
    ensure!(r.status == 201, "create: {}", r.text);
    let id = r.json()?["id"].as_str().context("id")?.to_owned();
    let created = a.until("the create", |e, d| is_conv(e, d, &id)).await?;
    assert_eq!(created["title"], "First");
    b.until("the create (second watcher)", |e, d| is_conv(e, d, &id)).await?;

    // A turn: running, then done with both messages counted.
    let r =
        api.post_json(&format!("/v1/conversations/{id}/messages"), &json!({"text": "say:hi there"})).reply().await?;
    ensure!(r.status == 202, "send: {}", r.text);
    a.until("the turn to start", |e, d| is_conv(e, d, &id) && d["turn_running"] == true).await?;
    let done = a
        .until("the turn to end", |e, d| is_conv(e, d, &id) && d["turn_running"] == false && d["message_count"] == 2)
        .await?;
    // Exactly an item of the list (nothing changed since).
    let list = api.get("/v1/conversations").reply().await?.json()?;
    let item = list["items"].as_array().context("items")?.iter().find(|c| c["id"] == id).context("listed")?.clone();
    assert_eq!(done, item, "a frame is the conversation as the list shows it");

    // A message queued behind a running turn shows in pending_count.
    api.post_json(&format!("/v1/conversations/{id}/messages"), &json!({"text": "hang"})).reply().await?;
    api.post_json(&format!("/v1/conversations/{id}/messages"), &json!({"text": "say:later"})).reply().await?;
    a.until("the queued message", |e, d| is_conv(e, d, &id) && d["pending_count"] == 1).await?;
    api.post(&format!("/v1/conversations/{id}/interrupt")).reply().await?;
    a.until("the stop (queue paused)", |e, d| {
        is_conv(e, d, &id) && d["turn_running"] == false && d["pending_paused"] == true
    })
    .await?;

    // Rename, archive, restore.
    let r = api
        .request(Method::PATCH, &format!("/v1/conversations/{id}"))
        .json(&json!({"title": "Renamed"}))
        .reply()
        .await?;
    ensure!(r.status == 200, "rename: {}", r.text);
    a.until("the rename", |e, d| is_conv(e, d, &id) && d["title"] == "Renamed").await?;
    api.request(Method::PATCH, &format!("/v1/conversations/{id}")).json(&json!({"archived": true})).reply().await?;
    a.until("the archive", |e, d| is_conv(e, d, &id) && d["archived"] == true).await?;
    api.request(Method::PATCH, &format!("/v1/conversations/{id}")).json(&json!({"archived": false})).reply().await?;
    a.until("the restore", |e, d| is_conv(e, d, &id) && d["archived"] == false).await?;

    // Delete.
    let r = api.request(Method::DELETE, &format!("/v1/conversations/{id}")).reply().await?;
    ensure!(r.status == 200, "delete: {}", r.text);
    let gone = a.until("the delete", |e, d| e == "deleted" && d["id"] == id).await?;
    assert_eq!(gone, json!({"id": id}));
    b.until("the delete (second watcher)", |e, d| e == "deleted" && d["id"] == id).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_list_events_refuse_bad_requests_and_end_when_the_gateway_goes() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    api.get("/v1/conversations/events?after=3").reply().await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    let r = api.anon(Method::GET, "/v1/conversations/events").reply().await?;
    assert_eq!(r.status, 401, "{}", r.text);

    let mut s = ListStream::open(&api).await?;
    // The gateway restarts (the chat service goes on): the stream ends, a new one works.
    let r = api.post("/v1/daemon/services/gateway/restart").reply().await?;
    ensure!(r.status == 200 || r.status == 202, "restart: {} {}", r.status, r.text);
    let ended = tokio::time::timeout(FRAME_TIMEOUT, async {
        loop {
            match s.next().await {
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream ends when the gateway goes away");
    let mut again = coffer_tests::wait_for("the list stream to reopen", Duration::from_secs(20), || async {
        Ok(ListStream::open(&api).await.ok())
    })
    .await?;
    let r = api.post_json("/v1/conversations", &json!({"agent_key": chat::SCRIPTED})).reply().await?;
    let id = r.json()?["id"].as_str().context("id")?.to_owned();
    again.until("the create after the restart", |e, d| is_conv(e, d, &id)).await?;
    Ok(())
}
