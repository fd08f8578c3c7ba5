//! Tests of the callback listener over real HTTP on loopback: the router with a recording
//! queue, the signature, the configuration, and the forwarder's retries.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::*;

const SECRET: &str = "sign-me-0123456789";

struct Served {
    url: String,
    rx: mpsc::Receiver<Accepted>,
    http: reqwest::Client,
}

async fn serve(hosts: &str) -> Served {
    serve_under(hosts, LIMITS).await
}

/// [`serve`] under `limits` instead of [`LIMITS`].
async fn serve_under(hosts: &str, limits: coffer_runtime::limits::Limits) -> Served {
    let config = Config::from_lookup(|k| match k {
        "COFFER_CALLBACK_SECRETS" => Some(format!(r#"{{"team":"{SECRET}","other":"x-secret"}}"#)),
        "COFFER_CALLBACK_HOSTS" => Some(hosts.to_owned()),
        _ => None,
    })
    .unwrap();
    let (tx, rx) = mpsc::channel(4);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = router(AppState::new(&config, tx));
    // Dropped with the test's runtime: the token only has to outlive the test.
    let shutdown = tokio_util::sync::CancellationToken::new();
    tokio::spawn(serve_public_under(listener, app, shutdown, limits));
    // A fresh connection per request, as a webhook sender makes them (after a 413 the server
    // closes the connection it did not read to the end).
    coffer_runtime::tls::ensure_provider();
    let http = reqwest::Client::builder().no_proxy().pool_max_idle_per_host(0).build().unwrap();
    Served { url, rx, http }
}

fn event(event_type: &str, event: serde_json::Value) -> Vec<u8> {
    event_at(event_type, event, now_s())
}

fn now_s() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

fn event_at(event_type: &str, event: serde_json::Value, timestamp: i64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "event_id": "ev-1", "event_type": event_type, "timestamp": timestamp, "app_id": "app", "event": event,
    }))
    .unwrap()
}

/// A signed event older (or later) than [`MAX_EVENT_AGE`] is refused and not forwarded; one
/// inside the bound goes through.
#[tokio::test]
async fn events_outside_the_age_bound_are_refused() {
    let mut s = serve("").await;
    let bound = MAX_EVENT_AGE.as_secs() as i64;
    for ts in [now_s() - bound - 60, now_s() + bound + 60, 1_700_000_000] {
        let body = event_at("message_from_bot_subscriber", serde_json::json!({}), ts);
        let (status, reply) = s.post("/seatalk/team", body.clone(), sign(&body)).await;
        assert_eq!(status, 400, "{ts}: {reply}");
        assert!(reply.to_string().contains("timestamp"), "{reply}");
    }
    s.nothing_forwarded();
    let body = event_at("message_from_bot_subscriber", serde_json::json!({}), now_s() - bound + 60);
    assert_eq!(s.post("/seatalk/team", body.clone(), sign(&body)).await.0, 200, "inside the bound");
    let got = s.rx.recv().await.unwrap();
    assert_eq!(&got.body[..], &body[..]);
}

impl Served {
    async fn post(&self, path: &str, body: Vec<u8>, sig: Option<String>) -> (u16, serde_json::Value) {
        let mut req = self.http.post(format!("{}{path}", self.url)).body(body);
        if let Some(s) = sig {
            req = req.header("Signature", s);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    fn nothing_forwarded(&mut self) {
        assert!(self.rx.try_recv().is_err(), "nothing is forwarded");
    }
}

fn sign(body: &[u8]) -> Option<String> {
    Some(signature(body, SECRET.as_bytes()))
}

#[test]
fn the_signature_is_lowercase_hex_sha256_of_the_body_then_the_secret() {
    // sha256("abc" ‖ "def") = sha256("abcdef").
    assert_eq!(signature(b"abc", b"def"), "bef57ec7f53a6d40beb640a780a639c83bc29ac8a9816f1fc6c5c6dcd93c4721");
    assert!(signature_matches(b"abc", b"def", b"bef57ec7f53a6d40beb640a780a639c83bc29ac8a9816f1fc6c5c6dcd93c4721"));
    assert!(!signature_matches(b"abc", b"def", b"BEF57EC7F53A6D40BEB640A780A639C83BC29AC8A9816F1FC6C5C6DCD93C4721"));
    assert!(!signature_matches(b"abc", b"deg", b"bef57ec7f53a6d40beb640a780a639c83bc29ac8a9816f1fc6c5c6dcd93c4721"));
    assert!(!signature_matches(b"abc", b"def", b"bef57ec7"));
    assert!(!signature_matches(b"abc", b"def", b""));
}

#[tokio::test]
async fn verification_echoes_the_challenge_only_when_signed() {
    let mut s = serve("").await;
    let body = event("event_verification", serde_json::json!({ "seatalk_challenge": "chal-42" }));
    assert_eq!(
        s.post("/seatalk/team", body.clone(), sign(&body)).await,
        (200, serde_json::json!({"seatalk_challenge": "chal-42"}))
    );
    let (status, reply) = s.post("/seatalk/team", body.clone(), Some(signature(&body, b"wrong"))).await;
    assert_eq!((status, reply["error"].as_str()), (401, Some("missing or wrong Signature")));
    assert_eq!(s.post("/seatalk/team", body, None).await.0, 401);
    s.nothing_forwarded();
}

#[tokio::test]
async fn a_signed_event_is_accepted_and_queued_and_a_bad_one_is_not() {
    let mut s = serve("").await;
    let body = event("message_from_bot_subscriber", serde_json::json!({ "employee_code": "e1" }));
    assert_eq!(s.post("/seatalk/team", body.clone(), sign(&body)).await, (200, serde_json::json!({})));
    let got = s.rx.try_recv().expect("forwarded");
    assert_eq!((got.channel.as_str(), &got.body[..]), ("team", &body[..]));
    assert!(got.received_ms > 0);
    // The other channel's secret does not sign for this one, and no signature at all.
    assert_eq!(s.post("/seatalk/other", body.clone(), sign(&body)).await.0, 401);
    assert_eq!(s.post("/seatalk/team", body.clone(), None).await.0, 401);
    let mut tampered = body.clone();
    tampered[5] ^= 1;
    assert_eq!(s.post("/seatalk/team", tampered, sign(&body)).await.0, 401);
    s.nothing_forwarded();
}

/// An unknown (or disabled: not in the secrets) channel is answered as a wrong signature, body
/// and all, so the answers do not tell which channel names exist.
#[tokio::test]
async fn an_unknown_channel_is_answered_as_a_bad_signature() {
    let mut s = serve("").await;
    let body = event("message_from_bot_subscriber", serde_json::json!({}));
    let unknown = s.post("/seatalk/nope", body.clone(), sign(&body)).await;
    let unsigned = s.post("/seatalk/nope", body.clone(), None).await;
    let bad = s.post("/seatalk/team", body.clone(), Some("0".repeat(64))).await;
    assert_eq!(unknown.0, 401);
    assert_eq!((&unknown, &unsigned), (&bad, &bad), "same status and body");
    let big = vec![b'{'; 5 * 1024 * 1024];
    assert_eq!(s.post("/seatalk/nope", big.clone(), sign(&big)).await.0, 413, "as for a known channel");
    s.nothing_forwarded();
}

#[tokio::test]
async fn other_paths_and_methods_are_404() {
    let mut s = serve("").await;
    let body = event("message_from_bot_subscriber", serde_json::json!({}));
    assert_eq!(s.post("/seatalk", body.clone(), sign(&body)).await.0, 404);
    assert_eq!(s.post("/", body.clone(), sign(&body)).await.0, 404);
    assert_eq!(s.post("/seatalk/team/x", body.clone(), sign(&body)).await.0, 404);
    let r = s.http.get(format!("{}/seatalk/team", s.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    s.nothing_forwarded();
}

#[tokio::test]
async fn a_5_mb_body_is_413_and_malformed_json_is_400() {
    let mut s = serve("").await;
    let big = vec![b'{'; 5 * 1024 * 1024];
    assert_eq!(s.post("/seatalk/team", big.clone(), sign(&big)).await.0, 413);
    let bad = b"{\"event_type\": ".to_vec();
    let (status, reply) = s.post("/seatalk/team", bad.clone(), sign(&bad)).await;
    assert_eq!((status, reply["error"].as_str()), (400, Some("the body is not JSON")));
    let no_type = b"{\"event\": {}}".to_vec();
    assert_eq!(s.post("/seatalk/team", no_type.clone(), sign(&no_type)).await.0, 400);
    let no_challenge = event("event_verification", serde_json::json!({}));
    assert_eq!(s.post("/seatalk/team", no_challenge.clone(), sign(&no_challenge)).await.0, 400);
    // Exactly at the limit is read (and then refused for its shape, not its size).
    let edge = vec![b' '; BODY_LIMIT];
    assert_eq!(s.post("/seatalk/team", edge.clone(), sign(&edge)).await.0, 400);
    s.nothing_forwarded();
}

#[tokio::test]
async fn a_foreign_host_is_refused_and_a_listed_tunnel_host_accepted() {
    let mut s = serve("bot.example.com").await;
    let body = event("event_verification", serde_json::json!({ "seatalk_challenge": "c" }));
    let post = |host: &'static str| {
        s.http
            .post(format!("{}/seatalk/team", s.url))
            .header("Host", host)
            .header("Signature", sign(&body).unwrap())
            .body(body.clone())
            .send()
    };
    for host in ["evil.example.com", "bot.example.com.evil", "127.0.0.2"] {
        assert_eq!(post(host).await.unwrap().status().as_u16(), 421, "{host}");
    }
    for host in ["bot.example.com", "BOT.example.com:443", "localhost:8787", "[::1]:8787", "127.0.0.1"] {
        assert_eq!(post(host).await.unwrap().status().as_u16(), 200, "{host}");
    }
    s.nothing_forwarded();
    assert!(host_accepted("anything.test", &[], true));
    assert!(!host_accepted("", &[], false));
}

#[test]
fn the_configuration_names_the_variable_and_never_a_secret() {
    let cfg = |secrets: Option<&str>, port: Option<&str>| {
        Config::from_lookup(|k| match k {
            "COFFER_CALLBACK_SECRETS" => secrets.map(str::to_owned),
            "COFFER_CALLBACK_PORT" => port.map(str::to_owned),
            _ => None,
        })
    };
    let ok = cfg(Some(r#"{"a":"s3cret"}"#), None).unwrap();
    assert_eq!((ok.port, ok.secrets.len()), (DEFAULT_PORT, 1));
    assert!(!format!("{ok:?}").contains("s3cret"));
    assert_eq!(cfg(Some(r#"{"a":"s3cret"}"#), Some("9999")).unwrap().port, 9999);
    assert_eq!(cfg(None, None).unwrap_err(), ConfigError::NoSecrets { var: "COFFER_CALLBACK_SECRETS" });
    assert_eq!(cfg(Some("{}"), None).unwrap_err(), ConfigError::NoSecrets { var: "COFFER_CALLBACK_SECRETS" });
    for bad in [r#"{"a": 5}"#, r#"["s3cret"]"#, r#"{"a":"s3cret""#] {
        let e = cfg(Some(bad), None).unwrap_err().to_string();
        assert!(e.starts_with("COFFER_CALLBACK_SECRETS is not a JSON object"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
    }
    assert_eq!(
        cfg(Some(r#"{"a":""}"#), None).unwrap_err(),
        ConfigError::EmptySecret { var: "COFFER_CALLBACK_SECRETS", channel: "a".into() }
    );
    for p in ["0", "70000", "http"] {
        assert!(matches!(cfg(Some(r#"{"a":"s"}"#), Some(p)), Err(ConfigError::BadPort { .. })), "{p}");
    }
}

/// A chat that answers from a script and records what it was given.
struct Scripted {
    answers: VecDeque<Result<bool, tonic::Status>>,
    got: Arc<Mutex<Vec<SeatalkEvent>>>,
}

impl Deliver for Scripted {
    async fn deliver(&mut self, event: SeatalkEvent) -> Result<bool, tonic::Status> {
        self.got.lock().unwrap().push(event);
        self.answers.pop_front().unwrap_or(Ok(false))
    }
}

#[tokio::test]
async fn the_forwarder_retries_an_unavailable_chat_and_drops_a_refused_event() {
    let got = Arc::new(Mutex::new(Vec::new()));
    let answers = VecDeque::from([
        Err(tonic::Status::unavailable("starting")),
        Err(tonic::Status::unavailable("starting")),
        Ok(false),
        Err(tonic::Status::not_found("no such channel")),
        Err(tonic::Status::failed_precondition("channel \"c\" is stopped")),
        Ok(true),
    ]);
    let (tx, rx) = mpsc::channel(8);
    for (i, ch) in ["a", "b", "c"].into_iter().enumerate() {
        tx.send(Accepted { channel: ch.into(), body: Bytes::from(vec![b'0' + i as u8]), received_ms: 7 })
            .await
            .unwrap();
    }
    drop(tx);
    let task = tokio::spawn(forward(rx, Scripted { answers, got: got.clone() }, Default::default()));
    tokio::time::timeout(Duration::from_secs(10), task).await.expect("the forwarder ends with its queue").unwrap();
    let got = got.lock().unwrap();
    let seen: Vec<_> = got.iter().map(|e| e.channel.as_str()).collect();
    // a: twice unavailable, then delivered; b: refused once, not retried; c: its adapter is
    // restarting once, then delivered (duplicate).
    assert_eq!(seen, ["a", "a", "a", "b", "c", "c"]);
    assert_eq!((got[0].body.as_slice(), got[0].received_ms), (&b"0"[..], 7));
}

/// A client that sends half a request line and nothing more (slowloris) is disconnected once
/// the head timeout ([`HEADER_READ_TIMEOUT`], here shortened) passes, and the listener keeps
/// serving others meanwhile.
#[tokio::test]
async fn a_stalled_request_head_is_disconnected_and_others_are_served() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // The callback's limits with a head timeout of 300 ms instead of 10 s: the same reaper (it
    // sweeps once a second), closing the stalled connection after 1-2 s instead of 10-11 s.
    let timeout = Duration::from_millis(300);
    let s = serve_under("", coffer_runtime::limits::Limits { header_read_timeout: timeout, ..LIMITS }).await;
    let addr = s.url.trim_start_matches("http://").to_owned();
    let mut stalled = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stalled.write_all(b"POST /seatalk/team HTTP/1.1\r\n").await.unwrap();
    let started = std::time::Instant::now();
    // Served meanwhile.
    let (status, _) = s.post("/nope", b"{}".to_vec(), None).await;
    assert_eq!(status, 404);
    let mut buf = Vec::new();
    let read = tokio::time::timeout(HEADER_READ_TIMEOUT, stalled.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the stalled connection is still open after {:?}", started.elapsed());
    assert!(started.elapsed() >= timeout, "closed only for the timeout, after {:?}", started.elapsed());
}

/// The replay window needs a time: a signed event whose `timestamp` is missing, a string, a
/// fraction or null is refused with 400 naming the timestamp, and not forwarded.
#[tokio::test]
async fn events_without_an_integer_timestamp_are_refused() {
    let mut s = serve("").await;
    let now = now_s();
    let envelopes = [
        serde_json::json!({"event_id": "ev-1", "event_type": "message_from_bot_subscriber", "app_id": "app", "event": {}}),
        serde_json::json!({"event_id": "ev-2", "event_type": "message_from_bot_subscriber", "timestamp": now.to_string(), "event": {}}),
        serde_json::json!({"event_id": "ev-3", "event_type": "message_from_bot_subscriber", "timestamp": "soon", "event": {}}),
        serde_json::json!({"event_id": "ev-4", "event_type": "message_from_bot_subscriber", "timestamp": now as f64 + 0.5, "event": {}}),
        serde_json::json!({"event_id": "ev-5", "event_type": "message_from_bot_subscriber", "timestamp": null, "event": {}}),
    ];
    for envelope in envelopes {
        let body = serde_json::to_vec(&envelope).unwrap();
        let (status, reply) = s.post("/seatalk/team", body.clone(), sign(&body)).await;
        assert_eq!(status, 400, "{envelope}: {reply}");
        assert!(reply["error"].as_str().is_some_and(|e| e.contains("timestamp")), "{reply}");
    }
    s.nothing_forwarded();
}

/// More idle connections than [`MAX_CONNECTIONS`] (a flood from anyone who can reach the port)
/// do not lock others out: at the cap the oldest unsigned connection makes room.
#[tokio::test]
async fn a_flood_of_idle_connections_does_not_lock_others_out() {
    let s = serve("").await;
    let addr = s.url.trim_start_matches("http://").to_owned();
    let mut flood = Vec::new();
    for _ in 0..MAX_CONNECTIONS + 64 {
        flood.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    let (status, _) = s.post("/nope", b"{}".to_vec(), None).await;
    assert_eq!(status, 404);
}

/// A request head larger than the limit is answered 431 and its connection closed, not
/// buffered.
#[tokio::test]
async fn an_oversized_request_head_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = serve("").await;
    let addr = s.url.trim_start_matches("http://").to_owned();
    let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let big = "a".repeat(LIMITS.max_header_bytes * 2);
    let req = format!("POST /seatalk/team HTTP/1.1\r\nHost: localhost\r\nX-Big: {big}\r\n\r\n");
    // The server may close before everything is written.
    let _ = c.write_all(req.as_bytes()).await;
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut buf)).await.unwrap();
    let head = String::from_utf8_lossy(&buf);
    assert!(head.starts_with("HTTP/1.1 431"), "{head}");
}
