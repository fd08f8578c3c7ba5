//! The multiplexed chat event stream and idempotent sends over HTTP, on a real daemon with the
//! scripted agent (issue 35 §2): `GET /v1/events` carries the list and several conversations on
//! one connection, each frame tagged with its subscription; subscriptions are added and removed
//! on the open stream (`POST /v1/events/{stream}`, its opener only); a reopened stream resumes
//! each conversation after its own last `seq`, losing and repeating nothing; the daemon counts
//! the streams open. `POST …/messages` with an `Idempotency-Key` queues a message once however
//! often it is sent, also twice at the same moment; a key reused for another text and a
//! malformed key are refused naming the header.
use std::collections::VecDeque;
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::{Api, SendExt, TestHome, chat};
use serde_json::{Value, json};

const FRAME_TIMEOUT: Duration = Duration::from_secs(20);

async fn create(api: &Api, title: &str) -> anyhow::Result<String> {
    let r = api.post_json("/v1/conversations", &json!({"agent_key": chat::SCRIPTED, "title": title})).reply().await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    Ok(r.json()?["id"].as_str().context("id")?.to_owned())
}

async fn send(api: &Api, id: &str, text: &str) -> anyhow::Result<Value> {
    let r = api.post_json(&format!("/v1/conversations/{id}/messages"), &json!({"text": text})).reply().await?;
    ensure!(r.status == 202, "send: {} {}", r.status, r.text);
    r.json()
}

/// An open multiplexed stream, read frame by frame: `(event, data)`.
struct Mux {
    resp: reqwest::Response,
    parser: coffer_types::sse::SseParser,
    ready: VecDeque<(String, Value)>,
}

impl Mux {
    async fn open(api: &Api, query: &str) -> anyhow::Result<(Self, Value)> {
        let resp = api.get(&format!("/v1/events?{query}")).send().await?;
        ensure!(resp.status() == 200, "events: {}", resp.status());
        let mut m = Self { resp, parser: coffer_types::sse::SseParser::new(), ready: VecDeque::new() };
        let (event, hello) = m.next().await?.context("no hello")?;
        ensure!(event == "hello", "the first frame is hello, not {event}");
        Ok((m, hello))
    }

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
                self.ready.push_back((e.event.clone(), serde_json::from_slice(&e.data)?));
            }
        }
    }

    /// Frames until one satisfies `done`; all of them, in order.
    async fn until(&mut self, what: &str, done: impl Fn(&str, &Value) -> bool) -> anyhow::Result<Vec<(String, Value)>> {
        let mut seen = Vec::new();
        loop {
            let (event, data) = self.next().await?.with_context(|| format!("the stream ended before {what}"))?;
            let stop = done(&event, &data);
            seen.push((event, data));
            if stop {
                return Ok(seen);
            }
        }
    }
}

fn turn_done_of(sub: &'static str) -> impl Fn(&str, &Value) -> bool {
    move |e, d| e == "turn_done" && d["sub"] == sub
}

async fn counts(api: &Api) -> anyhow::Result<Value> {
    api.get("/v1/events/streams").reply().await?.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stream_carries_the_list_and_conversations_tagged_and_resumes_each_after_its_seq() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let c1 = create(&api, "first").await?;
    let c2 = create(&api, "second").await?;

    // Bad subscriptions are refused before any stream starts, naming what is wrong.
    for (q, what) in [
        ("after=3", "after"),
        ("conversation=k", "conversation"),
        ("conversation=k:c:x", "conversation"),
        ("conversation=k:BAD", "conversation"),
    ] {
        let r = api.get(&format!("/v1/events?{q}")).reply().await?;
        ensure!(r.status == 400, "{q}: {} {}", r.status, r.text);
        ensure!(r.json()?["error"]["details"]["parameter"] == what, "{q}: {}", r.text);
    }
    let r = api.get("/v1/events?conversation=k:BAD").reply().await?;
    ensure!(r.text.contains("\\\"BAD\\\" is not a conversation id"), "the id is named: {}", r.text);
    ensure!(r.json()?["error"]["details"] == json!({"parameter": "conversation", "sub": "k"}), "{}", r.text);
    // Past the limit of subscriptions on one stream: a 400 naming the limit (not a 429: the
    // same request can never succeed).
    let many: Vec<String> = (0..=64).map(|i| format!("list=s{i}")).collect();
    let r = api.get(&format!("/v1/events?{}", many.join("&"))).reply().await?;
    ensure!(r.status == 400 && r.text.contains("at most 64 subscriptions"), "{} {}", r.status, r.text);
    ensure!(r.json()?["error"]["details"] == json!({"limit": 64, "asked": 65, "open": 0}), "{}", r.text);
    let r = api.get("/v1/events?list=a%20b").reply().await?;
    ensure!(r.status == 400 && r.text.contains("subscription key"), "{} {}", r.status, r.text);
    ensure!(r.json()?["error"]["details"] == json!({"parameter": "list", "sub": "a b"}), "{}", r.text);
    // A key given twice is refused (not collapsed), naming the key and the parameter.
    let r = api.get(&format!("/v1/events?list=K&conversation=K:{c1}")).reply().await?;
    ensure!(r.status == 400 && r.text.contains("\\\"K\\\" is given twice"), "{} {}", r.status, r.text);
    ensure!(r.json()?["error"]["details"] == json!({"parameter": "conversation", "sub": "K"}), "{}", r.text);

    let (mut mux, hello) = Mux::open(&api, &format!("list=L&conversation=A:{c1}")).await?;
    let stream = hello["stream"].as_str().context("stream id")?.to_owned();
    ensure!(stream.len() == 64, "{hello}");
    ensure!(hello["subscriptions"] == json!(["A", "L"]), "{hello}");
    ensure!(counts(&api).await? == json!({"multiplexed": 1, "subscriptions": 2, "conversation": 0, "list": 0}));

    // A turn of c1: its events tagged A, the list's change tagged L, on the one connection.
    send(&api, &c1, "say:alpha").await?;
    let frames = mux.until("c1's turn_done", turn_done_of("A")).await?;
    ensure!(frames.iter().any(|(e, d)| e == "text_delta" && d["sub"] == "A" && d["conversation_id"] == c1.as_str()));
    ensure!(frames.iter().any(|(e, d)| e == "conversation" && d["sub"] == "L" && d["id"] == c1.as_str()));
    let seqs: Vec<u64> =
        frames.iter().filter(|(_, d)| d["sub"] == "A").filter_map(|(_, d)| d["seq"].as_u64()).collect();
    ensure!(seqs.windows(2).all(|w| w[0] < w[1]), "seqs increase: {seqs:?}");

    // Subscriptions change on the open stream: B (c2) comes, A goes.
    let r = api
        .post_json(
            &format!("/v1/events/{stream}"),
            &json!({"add": [{"sub": "B", "conversation": c2}], "remove": ["A"]}),
        )
        .reply()
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    ensure!(r.json()? == json!({"subscriptions": ["B", "L"], "refused": []}), "{}", r.text);
    send(&api, &c1, "say:not followed").await?;
    send(&api, &c2, "say:beta").await?;
    let frames = mux.until("c2's turn_done", turn_done_of("B")).await?;
    ensure!(!frames.iter().any(|(_, d)| d["sub"] == "A"), "A was removed: {frames:?}");
    let last_b = frames.iter().filter(|(_, d)| d["sub"] == "B").filter_map(|(_, d)| d["seq"].as_u64()).max();
    let last_b = last_b.context("B's seq")?;

    // An unknown conversation is refused alone; an unknown stream, or a body that is not one,
    // is refused whole.
    let r = api
        .post_json(
            &format!("/v1/events/{stream}"),
            &json!({"add": [{"sub": "X", "conversation": "01HZZZZZZZZZZZZZZZZZZZZZZZ"}]}),
        )
        .reply()
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    ensure!(r.json()?["refused"][0]["code"] == "NOT_FOUND", "{}", r.text);
    let r = api.post_json(&format!("/v1/events/{}", "0".repeat(64)), &json!({"add": []})).reply().await?;
    ensure!(r.status == 404, "{} {}", r.status, r.text);
    let r = api
        .post_json(&format!("/v1/events/{stream}"), &json!({"add": [{"sub": "Y", "list": true, "after": 3}]}))
        .reply()
        .await?;
    ensure!(r.status == 400, "{} {}", r.status, r.text);
    ensure!(r.json()?["error"]["details"] == json!({"field": "add", "index": 0, "sub": "Y"}), "{}", r.text);
    // A key twice in one `add` is refused whole, and the removal with it is not applied.
    let twice = json!({"add": [{"sub": "Z", "list": true}, {"sub": "Z", "conversation": c2}], "remove": ["B"]});
    let r = api.post_json(&format!("/v1/events/{stream}"), &twice).reply().await?;
    ensure!(r.status == 400 && r.text.contains("\\\"Z\\\" is given twice"), "{} {}", r.status, r.text);
    ensure!(r.json()?["error"]["details"] == json!({"field": "add", "index": 1, "sub": "Z"}), "{}", r.text);
    let r = api.post_json(&format!("/v1/events/{stream}"), &json!({})).reply().await?;
    ensure!(r.json()?["subscriptions"] == json!(["B", "L"]), "nothing changed: {}", r.text);
    let r = api.post_json(&format!("/v1/events/{stream}"), &json!({"subscribe": []})).reply().await?;
    ensure!(r.status == 400 && r.json()?["error"]["code"] == "UNKNOWN_FIELD", "{}", r.text);

    // The connection goes; what happens meanwhile is delivered on the next one, after each
    // subscription's own last seq: nothing lost, nothing twice.
    drop(mux);
    send(&api, &c2, "say:while away").await?;
    // The edge notices a client gone at its next write (an event, or the keep-alive).
    coffer_tests::wait_for("the stream to be gone", Duration::from_secs(40), || async {
        Ok((counts(&api).await?["multiplexed"] == 0).then_some(()))
    })
    .await?;
    let (mut mux, hello) = Mux::open(&api, &format!("conversation=B:{c2}:{last_b}")).await?;
    ensure!(hello["subscriptions"] == json!(["B"]), "{hello}");
    let frames = mux
        .until("the turn sent while away", |e, d| e == "turn_done" && d["turn_done"].to_string().contains("while away"))
        .await?;
    let seqs: Vec<u64> = frames.iter().filter_map(|(_, d)| d["seq"].as_u64()).collect();
    ensure!(seqs.first().is_some_and(|s| *s > last_b), "resumed after {last_b}: {seqs:?}");
    ensure!(seqs.windows(2).all(|w| w[0] < w[1]), "no repeat: {seqs:?}");
    ensure!(
        frames
            .iter()
            .any(|(e, d)| e == "message_created" && d["message_created"].to_string().contains("say:while away")),
        "the message sent while away is delivered: {frames:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_queues_a_message_once() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let id = create(&api, "keys").await?;
    let path = format!("/v1/conversations/{id}/messages");
    let keyed = |key: &str, text: &str| api.post_json(&path, &json!({"text": text})).header("Idempotency-Key", key);

    let first = keyed("k-1", "hang").reply().await?;
    ensure!(
        first.status == 202 && first.headers.get("idempotent-replayed").is_none(),
        "{} {}",
        first.status,
        first.text
    );
    let again = keyed("k-1", "hang").reply().await?;
    ensure!(again.status == 202, "{} {}", again.status, again.text);
    ensure!(again.headers.get("idempotent-replayed").and_then(|v| v.to_str().ok()) == Some("true"));
    ensure!(again.json()?["message"]["id"] == first.json()?["message"]["id"], "the first answer again");

    // While the turn hangs a send is queued: twice at the same moment, queued once.
    let (a, b) = tokio::join!(keyed("k-2", "say:queued").reply(), keyed("k-2", "say:queued").reply());
    let (a, b) = (a?, b?);
    ensure!(a.status == 202 && b.status == 202, "{} {} / {} {}", a.status, a.text, b.status, b.text);
    ensure!(a.json()?["pending"]["id"] == b.json()?["pending"]["id"], "one pending item: {} / {}", a.text, b.text);
    let view = api.get(&format!("/v1/conversations/{id}")).reply().await?.json()?;
    let items = view["pending"]["items"].as_array().context("items")?;
    ensure!(items.len() == 1, "queued once: {items:?}");

    // The same key for another text is refused; so is a key that is not one.
    let r = keyed("k-2", "say:something else").reply().await?;
    ensure!(r.status == 409, "{} {}", r.status, r.text);
    ensure!(
        r.json()?["error"]["details"] == json!({"header": "Idempotency-Key", "reason": "different_body"}),
        "{}",
        r.text
    );
    for bad in ["a b", &"k".repeat(129)] {
        let r = keyed(bad, "say:x").reply().await?;
        ensure!(r.status == 400, "{bad:?}: {} {}", r.status, r.text);
        ensure!(r.json()?["error"]["details"]["header"] == "Idempotency-Key", "{}", r.text);
    }
    // Two keys on one request: refused (not "the first wins"), and nothing is queued.
    let r = keyed("k-3", "say:two keys").header("Idempotency-Key", "k-4").reply().await?;
    ensure!(r.status == 400 && r.text.contains("more than once"), "{} {}", r.status, r.text);
    ensure!(r.json()?["error"]["details"] == json!({"header": "Idempotency-Key"}), "{}", r.text);
    let view = api.get(&format!("/v1/conversations/{id}")).reply().await?.json()?;
    ensure!(!view["pending"].to_string().contains("two keys"), "not queued: {view}");
    // Without a key nothing changes: the same text twice is two messages.
    send(&api, &id, "say:twice").await?;
    send(&api, &id, "say:twice").await?;
    let view = api.get(&format!("/v1/conversations/{id}")).reply().await?.json()?;
    let twice =
        view["pending"]["items"].as_array().context("items")?.iter().filter(|i| i["text"] == "say:twice").count();
    ensure!(twice == 2, "two without a key: {view}");
    api.post(&format!("/v1/conversations/{id}/interrupt")).reply().await?;
    Ok(())
}
