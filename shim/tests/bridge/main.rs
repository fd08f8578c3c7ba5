//! Drives the shim library over in-memory stdio against a fake `/mcp` server on real loopback
//! HTTP ([`fake_mcp`]), bypassing detect-or-spawn with a test connector.
mod fake_mcp;
mod fake_stream;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_shim::{BoxError, Config, Connector, Endpoint, Memory, ShimError};
use fake_mcp::{FakeMcp, PROTOCOL};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(10);

/// A connector the test points at whichever fake "daemon" is current.
#[derive(Clone)]
struct TestConnector {
    endpoint: Arc<Mutex<Option<Endpoint>>>,
    calls: Arc<AtomicUsize>,
}

impl TestConnector {
    fn new(endpoint: Option<Endpoint>) -> Self {
        Self { endpoint: Arc::new(Mutex::new(endpoint)), calls: Arc::new(AtomicUsize::new(0)) }
    }
    fn point_at(&self, endpoint: Endpoint) {
        *self.endpoint.lock().unwrap() = Some(endpoint);
    }
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Connector for TestConnector {
    async fn connect(&self) -> Result<Endpoint, BoxError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.endpoint.lock().unwrap().clone().ok_or_else(|| "no daemon in this test".into())
    }
}

/// The shim running on in-memory stdin/stdout.
struct Shim {
    stdin: Option<DuplexStream>,
    stdout: Lines<BufReader<DuplexStream>>,
    task: JoinHandle<Result<(), ShimError>>,
    shutdown: CancellationToken,
}

impl Shim {
    fn start(connector: TestConnector) -> Self {
        Self::start_with(connector, Config::default())
    }

    fn start_with<C: Connector>(connector: C, config: Config) -> Self {
        let (stdin, shim_in) = tokio::io::duplex(64 * 1024);
        let (shim_out, stdout) = tokio::io::duplex(1024 * 1024);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(coffer_shim::run(shim_in, shim_out, connector, config, shutdown.clone()));
        Self { stdin: Some(stdin), stdout: BufReader::new(stdout).lines(), task, shutdown }
    }

    async fn send(&mut self, message: Value) {
        self.send_raw(format!("{message}\n").as_bytes()).await;
    }

    async fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).await.expect("write stdin");
        stdin.flush().await.expect("flush stdin");
    }

    /// The next stdout line, which must be one JSON value.
    async fn recv(&mut self) -> Value {
        let line = tokio::time::timeout(WAIT, self.stdout.next_line())
            .await
            .expect("timed out waiting for a stdout line")
            .expect("read stdout")
            .expect("stdout ended early");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"))
    }

    /// The next `n` lines, keyed by their `id` (or `method` for notifications).
    async fn recv_n(&mut self, n: usize) -> Vec<Value> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(self.recv().await);
        }
        out
    }

    /// Closes stdin, asserts nothing more is written to stdout, and that `run` returns Ok.
    async fn finish(mut self) {
        drop(self.stdin.take());
        let rest = tokio::time::timeout(WAIT, self.stdout.next_line()).await.expect("stdout closes").expect("read");
        assert_eq!(rest, None, "unexpected stdout line after EOF");
        let result = tokio::time::timeout(WAIT, self.task).await.expect("shim stops").expect("shim task");
        result.expect("run returns Ok");
    }
}

fn initialize_request(id: Value) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "initialize",
        "params": {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "test-client", "version": "1.0"}},
    })
}

/// Runs the initialize handshake and returns the session id the fake assigned.
async fn handshake(shim: &mut Shim, fake: &FakeMcp) -> String {
    shim.send(initialize_request(json!(0))).await;
    let reply = shim.recv().await;
    assert_eq!(reply["id"], json!(0));
    assert_eq!(reply["result"]["protocolVersion"], json!(PROTOCOL));
    shim.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    fake.wait_until("notifications/initialized", |s| !s.posts_of("notifications/initialized").is_empty()).await;
    let sid = fake.with(|s| s.posts_of("notifications/initialized").last().unwrap().session.clone());
    let sid = sid.expect("initialized carries the session id");
    // Then the shim opens the server stream (unless the fake refuses it with 405).
    fake.wait_until("GET /mcp", |s| s.listening(&sid) || !s.get_allowed).await;
    sid
}

fn echo(id: i64, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "echo", "params": params})
}

#[tokio::test]
async fn passes_requests_and_responses_through() {
    let fake = FakeMcp::start();
    let connector = TestConnector::new(Some(fake.endpoint()));
    let mut shim = Shim::start(connector.clone());
    let sid = handshake(&mut shim, &fake).await;

    shim.send(echo(1, json!({"text": "a\nb", "n": 1}))).await;
    // The fake pretty-prints this body over several lines; stdout gets it as one line.
    assert_eq!(shim.recv().await, json!({"jsonrpc": "2.0", "id": 1, "result": {"echo": {"text": "a\nb", "n": 1}}}));

    fake.with(|s| {
        let init = &s.posts_of("initialize")[0];
        assert_eq!(init.session, None, "initialize is sent without a session id");
        assert_eq!(init.protocol_version, None);
        assert_eq!(init.id, Some(json!(0)), "the client's own initialize goes through unchanged");
        let call = &s.posts_of("echo")[0];
        assert_eq!(call.session.as_deref(), Some(sid.as_str()));
        assert_eq!(call.protocol_version.as_deref(), Some(PROTOCOL));
        assert_eq!(call.content_type.as_deref(), Some("application/json"));
        let accept = call.accept.as_deref().unwrap_or_default();
        assert!(accept.contains("application/json") && accept.contains("text/event-stream"), "{accept}");
    });
    assert_eq!(connector.calls(), 1, "detect-or-spawn once");
    shim.finish().await;
}

#[tokio::test]
async fn concurrent_requests_answer_out_of_order() {
    let fake = FakeMcp::start();
    let mut shim = Shim::start(TestConnector::new(Some(fake.endpoint())));
    handshake(&mut shim, &fake).await;

    shim.send(json!({"jsonrpc": "2.0", "id": 1, "method": "wait", "params": {"gate": "a"}})).await;
    shim.send(json!({"jsonrpc": "2.0", "id": 2, "method": "wait", "params": {"gate": "b"}})).await;
    // Both are at the server at once: the shim does not serialize POSTs.
    fake.wait_until("both waits in flight", |s| s.posts_of("wait").len() == 2).await;
    fake.release("b");
    assert_eq!(shim.recv().await, json!({"jsonrpc": "2.0", "id": 2, "result": {"gate": "b"}}));
    fake.release("a");
    assert_eq!(shim.recv().await, json!({"jsonrpc": "2.0", "id": 1, "result": {"gate": "a"}}));
    shim.finish().await;
}

#[tokio::test]
async fn sse_response_writes_server_messages_before_the_response() {
    let fake = FakeMcp::start();
    let mut shim = Shim::start(TestConnector::new(Some(fake.endpoint())));
    handshake(&mut shim, &fake).await;

    shim.send(json!({"jsonrpc": "2.0", "id": 5, "method": "stream"})).await;
    let lines = shim.recv_n(3).await;
    assert_eq!(lines[0]["method"], json!("notifications/message"));
    assert_eq!(lines[1], json!({"jsonrpc": "2.0", "id": "srv-1", "method": "roots/list"}));
    assert_eq!(
        lines[2],
        json!({"jsonrpc": "2.0", "id": 5, "result": {"content": [{"type": "text", "text": "done\nline 2"}]}})
    );
    // The client answers the server's request: forwarded, accepted with 202, nothing on stdout.
    shim.send(json!({"jsonrpc": "2.0", "id": "srv-1", "result": {"roots": []}})).await;
    fake.wait_until("the client's response", |s| s.posts().any(|p| p.id == Some(json!("srv-1")))).await;
    shim.finish().await;
}

#[tokio::test]
async fn broken_response_stream_resumes_with_last_event_id() {
    let fake = FakeMcp::start();
    let mut shim = Shim::start(TestConnector::new(Some(fake.endpoint())));
    let sid = handshake(&mut shim, &fake).await;

    shim.send(json!({"jsonrpc": "2.0", "id": 8, "method": "drop"})).await;
    assert_eq!(shim.recv().await, json!({"jsonrpc": "2.0", "id": 8, "result": {"resumed": true}}));
    let expected = format!("{sid}-d-0");
    fake.with(|s| assert!(s.gets().iter().any(|g| g.last_event_id.as_deref() == Some(expected.as_str()))));
    shim.finish().await;
}

/// Asserts a -32001 answer for `id`; `lost` tells which: the connection was lost while the
/// daemon may have had the request, or the daemon could not be reached at all.
fn assert_unavailable(e: &Value, id: i64, lost: bool) {
    assert_eq!(e["id"], json!(id), "{e}");
    assert_eq!(e["error"]["code"], json!(-32001), "{e}");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(message.contains("Coffer daemon") && message.contains("retried"), "{message}");
    let expected = if lost { "was lost" } else { "cannot be reached" };
    assert!(message.contains(expected), "{id}: expected {expected:?}, got {message}");
}

/// Asserts that `fake` got a replay of the client's `initialize` (same params, a fresh id, no
/// session) and `notifications/initialized`, once; returns the new session id.
fn assert_replayed(fake: &FakeMcp, original: &Value) -> String {
    fake.with(|s| {
        let inits: Vec<_> = s.posts_of("initialize").into_iter().filter(|p| p.body["id"] != original["id"]).collect();
        assert_eq!(inits.len(), 1, "one replayed initialize: {:#?}", s.posts_of("initialize"));
        assert_eq!(inits[0].body["params"], original["params"], "the client's initialize is replayed");
        assert_eq!(inits[0].session, None);
        let initialized = s.posts_of("notifications/initialized");
        initialized.last().expect("notifications/initialized replayed").session.clone().unwrap()
    })
}

#[tokio::test]
async fn session_404_resends_the_new_request_and_fails_those_in_flight() {
    let fake = FakeMcp::start();
    let connector = TestConnector::new(Some(fake.endpoint()));
    let mut shim = Shim::start(connector.clone());
    let first = handshake(&mut shim, &fake).await;

    // In flight when the session is lost: one streaming its answer, one the daemon is working on.
    shim.send(json!({"jsonrpc": "2.0", "id": 10, "method": "hang"})).await;
    shim.send(json!({"jsonrpc": "2.0", "id": 13, "method": "wait", "params": {"gate": "never"}})).await;
    fake.wait_until("hang and wait taken on", |s| s.accepted("hang") == 1 && s.accepted("wait") == 1).await;
    fake.kill_session(&first);
    shim.send(echo(11, json!({"n": 11}))).await;

    // The request that met the 404 was not processed: it goes through on a new session. The
    // ones in flight may have taken effect: -32001, never resent.
    let mut lines = shim.recv_n(3).await;
    lines.sort_by_key(|e| e["id"].as_i64());
    assert_unavailable(&lines[0], 10, true);
    assert_eq!(lines[1], json!({"jsonrpc": "2.0", "id": 11, "result": {"echo": {"n": 11}}}));
    assert_unavailable(&lines[2], 13, true);

    // And the session goes on.
    shim.send(echo(12, json!({"again": true}))).await;
    assert_eq!(shim.recv().await, json!({"jsonrpc": "2.0", "id": 12, "result": {"echo": {"again": true}}}));
    fake.with(|s| {
        let inits = s.posts_of("initialize");
        assert_eq!(inits.len(), 2);
        let (original, replay) = (&inits[0].body, &inits[1].body);
        assert_eq!(replay["params"], original["params"], "the client's initialize is replayed");
        assert_ne!(replay["id"], original["id"], "with a fresh id");
        assert_eq!(inits[1].session, None);
        let initialized = s.posts_of("notifications/initialized");
        assert_eq!(initialized.len(), 2);
        let second = initialized[1].session.clone().unwrap();
        assert_ne!(second, first);
        let echoes = s.posts_of("echo");
        let sessions: Vec<_> = echoes.iter().map(|p| (p.id.clone().unwrap(), p.session.clone().unwrap())).collect();
        assert_eq!(
            sessions,
            [(json!(11), first.clone()), (json!(11), second.clone()), (json!(12), second.clone())],
            "11 met the 404 and was sent again on the new session"
        );
        assert_eq!(s.posts_of("hang").len(), 1, "in-flight requests are never resent");
        assert_eq!(s.posts_of("wait").len(), 1, "in-flight requests are never resent");
    });
    assert_eq!(connector.calls(), 2, "detect-or-spawn again after the loss");
    // The replayed initialize's answer was swallowed: nothing else is on stdout.
    shim.finish().await;
}

#[tokio::test]
async fn daemon_death_fails_in_flight_requests_at_once_then_respawns() {
    let mut fake = FakeMcp::start();
    let connector = TestConnector::new(Some(fake.endpoint()));
    let mut shim = Shim::start(connector.clone());
    handshake(&mut shim, &fake).await;

    // One streaming its answer, one the daemon is still working on (no answer yet).
    shim.send(json!({"jsonrpc": "2.0", "id": 20, "method": "hang"})).await;
    shim.send(json!({"jsonrpc": "2.0", "id": 22, "method": "wait", "params": {"gate": "never"}})).await;
    fake.wait_until("hang and wait taken on", |s| s.accepted("hang") == 1 && s.accepted("wait") == 1).await;
    let killed = std::time::Instant::now();
    fake.kill();
    let mut errors = shim.recv_n(2).await;
    let took = killed.elapsed();
    errors.sort_by_key(|e| e["id"].as_i64());
    assert_unavailable(&errors[0], 20, true);
    assert_unavailable(&errors[1], 22, true);
    assert!(took < Duration::from_millis(800), "in-flight requests fail at once, not after a grace: {took:?}");

    // "Re-spawn": detect-or-spawn now finds a new daemon.
    let second = FakeMcp::start();
    connector.point_at(second.endpoint());
    shim.send(echo(21, json!({"after": "restart"}))).await;
    assert_eq!(shim.recv().await, json!({"jsonrpc": "2.0", "id": 21, "result": {"echo": {"after": "restart"}}}));
    second.with(|s| {
        assert_eq!(s.posts_of("initialize").len(), 1, "initialize replayed on the new daemon");
        assert_eq!(s.posts_of("notifications/initialized").len(), 1);
        assert!(s.posts_of("hang").is_empty() && s.posts_of("wait").is_empty(), "in-flight requests are not resent");
    });
    shim.finish().await;
}

#[tokio::test]
async fn daemon_restart_between_two_requests_is_transparent() {
    let mut fake = FakeMcp::start();
    // No `GET` stream: only the request itself can find the daemon gone.
    fake.refuse_get();
    let connector = TestConnector::new(Some(fake.endpoint()));
    let mut shim = Shim::start(connector.clone());
    handshake(&mut shim, &fake).await;
    shim.send(echo(1, json!("before"))).await;
    assert_eq!(shim.recv().await["result"], json!({"echo": "before"}));

    fake.kill();
    let second = FakeMcp::start();
    connector.point_at(second.endpoint());
    shim.send(echo(2, json!("after"))).await;
    assert_eq!(shim.recv().await, json!({"jsonrpc": "2.0", "id": 2, "result": {"echo": "after"}}));

    let session = assert_replayed(&second, &initialize_request(json!(0)));
    second.with(|s| {
        let echoes = s.posts_of("echo");
        assert_eq!(echoes.len(), 1);
        assert_eq!(echoes[0].session.as_deref(), Some(session.as_str()));
    });
    assert_eq!(connector.calls(), 2, "detect-or-spawn again");
    shim.finish().await;
}

#[tokio::test]
async fn daemon_restart_on_the_same_port_with_a_new_token_is_transparent() {
    let mut fake = FakeMcp::start();
    fake.refuse_get();
    let connector = TestConnector::new(Some(fake.endpoint()));
    let mut shim = Shim::start(connector.clone());
    handshake(&mut shim, &fake).await;

    let addr = fake.addr;
    fake.kill();
    let second = FakeMcp::start_at(addr, "the-next-run");
    connector.point_at(second.endpoint());
    shim.send(echo(3, json!("same port"))).await;
    assert_eq!(shim.recv().await, json!({"jsonrpc": "2.0", "id": 3, "result": {"echo": "same port"}}));

    let session = assert_replayed(&second, &initialize_request(json!(0)));
    second.with(|s| {
        let echoes: Vec<_> = s.posts_of("echo").into_iter().map(|p| (p.authorized, p.session.clone())).collect();
        assert_eq!(echoes.len(), 2, "{echoes:?}");
        assert!(!echoes[0].0, "first with the old token: 401");
        assert_eq!(echoes[1], (true, Some(session.clone())), "then again on the new session");
    });
    shim.finish().await;
}

#[tokio::test]
async fn concurrent_requests_meeting_the_dead_daemon_share_one_reinitialize() {
    const N: i64 = 8;
    let mut fake = FakeMcp::start();
    fake.refuse_get();
    let connector = TestConnector::new(Some(fake.endpoint()));
    let mut shim = Shim::start(connector.clone());
    handshake(&mut shim, &fake).await;

    fake.kill();
    let second = FakeMcp::start();
    connector.point_at(second.endpoint());
    let lines: String = (100..100 + N).map(|id| format!("{}\n", echo(id, json!(id)))).collect();
    shim.send_raw(lines.as_bytes()).await;
    let mut replies = shim.recv_n(N as usize).await;
    replies.sort_by_key(|r| r["id"].as_i64());
    for (r, id) in replies.iter().zip(100..) {
        assert_eq!(r, &json!({"jsonrpc": "2.0", "id": id, "result": {"echo": id}}));
    }
    let session = assert_replayed(&second, &initialize_request(json!(0)));
    second.with(|s| {
        assert_eq!(s.posts_of("initialize").len(), 1, "one re-initialize for all of them");
        let echoes = s.posts_of("echo");
        assert_eq!(echoes.len(), N as usize);
        assert!(echoes.iter().all(|p| p.session.as_deref() == Some(session.as_str())));
    });
    assert_eq!(connector.calls(), 2, "one detect-or-spawn for all of them");
    shim.finish().await;
}

#[tokio::test]
async fn loss_seen_first_by_the_get_stream_still_respawns_on_the_next_request() {
    let mut fake = FakeMcp::start();
    let connector = TestConnector::new(Some(fake.endpoint()));
    let mut shim = Shim::start(connector.clone());
    handshake(&mut shim, &fake).await;

    let addr = fake.addr;
    fake.kill();
    // The dead daemon's port now resets every connection. Wait (with a deadline) until the GET
    // stream's reconnect has hit it: the shim has then seen the loss before the client sends
    // anything.
    let dead = tokio::net::TcpListener::bind(addr).await.expect("rebind the dead daemon's port");
    let (hit_tx, mut hit_rx) = tokio::sync::mpsc::unbounded_channel();
    let resetter = tokio::spawn(async move {
        while let Ok((sock, _)) = dead.accept().await {
            drop(sock);
            let _ = hit_tx.send(());
        }
    });
    tokio::time::timeout(Duration::from_secs(10), hit_rx.recv())
        .await
        .expect("the GET stream tried to reconnect to the dead daemon");
    resetter.abort();
    assert_eq!(connector.calls(), 1, "a loss seen by the GET stream alone starts no daemon");
    let second = FakeMcp::start();
    connector.point_at(second.endpoint());
    shim.send(echo(4, json!("next"))).await;
    assert_eq!(shim.recv().await, json!({"jsonrpc": "2.0", "id": 4, "result": {"echo": "next"}}));
    assert_replayed(&second, &initialize_request(json!(0)));
    assert_eq!(connector.calls(), 2);
    shim.finish().await;
}

#[tokio::test]
async fn refused_connection_with_no_daemon_to_find_fails_after_one_attempt() {
    let mut fake = FakeMcp::start();
    let connector = TestConnector::new(Some(fake.endpoint()));
    let mut shim = Shim::start(connector.clone());
    handshake(&mut shim, &fake).await;
    fake.kill();

    // Detect-or-spawn runs again for the request but finds only the dead daemon: one -32001.
    shim.send(echo(30, json!({}))).await;
    assert_unavailable(&shim.recv().await, 30, false);
    assert_eq!(connector.calls(), 2, "the failed request re-ran detect-or-spawn");

    let second = FakeMcp::start();
    connector.point_at(second.endpoint());
    shim.send(echo(31, json!({}))).await;
    assert_eq!(shim.recv().await["result"], json!({"echo": {}}));
    shim.finish().await;
}

#[tokio::test]
async fn unreachable_daemon_is_a_json_rpc_error() {
    let mut shim = Shim::start(TestConnector::new(None));
    shim.send(initialize_request(json!("init"))).await;
    let error = shim.recv().await;
    assert_eq!(error["id"], json!("init"));
    assert_eq!(error["error"]["code"], json!(-32001));
    assert!(error["error"]["data"]["reason"].as_str().unwrap().contains("no daemon"));
    shim.finish().await;
}

#[tokio::test]
async fn oversized_lines_are_rejected_and_the_shim_continues() {
    let fake = FakeMcp::start();
    let config = Config { max_frame_bytes: 1024, ..Config::default() };
    let mut shim = Shim::start_with(TestConnector::new(Some(fake.endpoint())), config);
    handshake(&mut shim, &fake).await;

    let big = echo(40, json!({"pad": "x".repeat(4096)}));
    shim.send(big).await;
    let error = shim.recv().await;
    assert_eq!(error["id"], json!(40));
    assert_eq!(error["error"]["code"], json!(-32600));

    shim.send_raw(format!("[{}]\n", "1,".repeat(2000)).as_bytes()).await;
    let error = shim.recv().await;
    assert_eq!(error["id"], Value::Null);
    assert_eq!(error["error"]["code"], json!(-32600));

    shim.send(echo(41, json!({"small": true}))).await;
    assert_eq!(shim.recv().await["id"], json!(41));
    fake.with(|s| assert!(s.posts().all(|p| p.id != Some(json!(40))), "the oversized line never reached the daemon"));
    shim.finish().await;
}

#[tokio::test]
async fn default_frame_limit_accepts_large_messages() {
    let fake = FakeMcp::start();
    let mut shim = Shim::start(TestConnector::new(Some(fake.endpoint())));
    handshake(&mut shim, &fake).await;
    let pad = "y".repeat(4 * 1024 * 1024);
    shim.send(echo(42, json!({"pad": pad}))).await;
    let reply = shim.recv().await;
    assert_eq!(reply["result"]["echo"]["pad"].as_str().map(str::len), Some(pad.len()), "{:.300}", reply.to_string());
    shim.finish().await;
}

#[tokio::test]
async fn malformed_lines_get_errors_and_the_shim_continues() {
    let fake = FakeMcp::start();
    let mut shim = Shim::start(TestConnector::new(Some(fake.endpoint())));
    handshake(&mut shim, &fake).await;

    shim.send_raw(b"{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \n").await;
    let error = shim.recv().await;
    assert_eq!(
        error,
        json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": error["error"]["message"]}})
    );

    shim.send_raw(b"42\n\n   \n").await;
    let error = shim.recv().await;
    assert_eq!((error["id"].clone(), error["error"]["code"].clone()), (Value::Null, json!(-32600)));

    shim.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":3}\r\n").await;
    let error = shim.recv().await;
    assert_eq!((error["id"].clone(), error["error"]["code"].clone()), (json!(3), json!(-32600)));

    shim.send(echo(2, json!("still here"))).await;
    assert_eq!(shim.recv().await["result"], json!({"echo": "still here"}));
    shim.finish().await;
}

#[tokio::test]
async fn http_error_bodies_pass_through_with_the_request_id() {
    let fake = FakeMcp::start();
    let mut shim = Shim::start(TestConnector::new(Some(fake.endpoint())));
    handshake(&mut shim, &fake).await;
    shim.send(json!({"jsonrpc": "2.0", "id": 50, "method": "error"})).await;
    assert_eq!(
        shim.recv().await,
        json!({"jsonrpc": "2.0", "id": 50, "error": {"code": -32602, "message": "bad params"}})
    );
    shim.send(json!({"jsonrpc": "2.0", "id": 51, "method": "stream_error"})).await;
    let lines = shim.recv_n(2).await;
    assert_eq!(lines[0]["method"], json!("notifications/message"));
    assert_eq!(lines[1], json!({"jsonrpc": "2.0", "id": 51, "error": {"code": -32603, "message": "internal error"}}));
    shim.finish().await;
}

#[tokio::test]
async fn batches_are_split_and_answered_as_one_array() {
    let fake = FakeMcp::start();
    let mut shim = Shim::start(TestConnector::new(Some(fake.endpoint())));
    handshake(&mut shim, &fake).await;
    let batch = json!([
        echo(60, json!("a")),
        {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"},
        echo(61, json!("b")),
    ]);
    shim.send(batch).await;
    let reply = shim.recv().await;
    let mut ids: Vec<i64> =
        reply.as_array().expect("a batch answer").iter().map(|r| r["id"].as_i64().unwrap()).collect();
    ids.sort_unstable();
    assert_eq!(ids, [60, 61]);
    fake.with(|s| assert_eq!(s.posts_of("notifications/roots/list_changed").len(), 1));

    shim.send_raw(b"[]\n").await;
    assert_eq!(shim.recv().await["error"]["code"], json!(-32600));
    shim.finish().await;
}

#[tokio::test]
async fn server_stream_is_copied_and_resumed() {
    let fake = FakeMcp::start();
    let mut shim = Shim::start(TestConnector::new(Some(fake.endpoint())));
    let sid = handshake(&mut shim, &fake).await;

    fake.wait_until("GET stream connected", |s| s.listening(&sid)).await;
    let note = json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"});
    let event = fake.push(&sid, &note);
    assert_eq!(shim.recv().await, note);

    // The server ends the stream; the shim reconnects (after the server's `retry: 10`) with
    // the last event id, and the new stream works.
    fake.end_get_stream(&sid);
    fake.wait_until("GET reconnected", |s| s.gets().len() >= 2 && s.listening(&sid)).await;
    fake.with(|s| {
        let gets = s.gets();
        assert_eq!(gets[0].last_event_id, None);
        assert_eq!(gets[1].last_event_id.as_deref(), Some(event.as_str()));
        assert_eq!(gets[1].session.as_deref(), Some(sid.as_str()));
        assert_eq!(gets[1].accept.as_deref(), Some("text/event-stream"));
    });
    let ask = json!({"jsonrpc": "2.0", "id": "srv-9", "method": "sampling/createMessage", "params": {}});
    fake.push(&sid, &ask);
    assert_eq!(shim.recv().await, ask);
    shim.finish().await;
}

#[tokio::test]
async fn get_405_means_no_server_stream() {
    let fake = FakeMcp::start();
    fake.refuse_get();
    let mut shim = Shim::start(TestConnector::new(Some(fake.endpoint())));
    handshake(&mut shim, &fake).await;
    fake.wait_until("GET tried", |s| !s.gets().is_empty()).await;
    shim.send(echo(70, json!(1))).await;
    assert_eq!(shim.recv().await["id"], json!(70));
    fake.with(|s| assert_eq!(s.gets().len(), 1));
    shim.finish().await;
    fake.with(|s| assert_eq!(s.gets().len(), 1, "405 is not retried"));
}

#[tokio::test]
async fn eof_ends_the_session_with_delete() {
    let fake = FakeMcp::start();
    let mut shim = Shim::start(TestConnector::new(Some(fake.endpoint())));
    let sid = handshake(&mut shim, &fake).await;
    shim.finish().await;
    fake.with(|s| {
        let deletes = s.deletes();
        assert_eq!(deletes.len(), 1);
        assert_eq!(deletes[0].session.as_deref(), Some(sid.as_str()));
    });
}

#[tokio::test]
async fn eof_lets_in_flight_requests_finish() {
    let fake = FakeMcp::start();
    let mut shim = Shim::start(TestConnector::new(Some(fake.endpoint())));
    handshake(&mut shim, &fake).await;
    shim.send(json!({"jsonrpc": "2.0", "id": 80, "method": "wait", "params": {"gate": "late"}})).await;
    fake.wait_until("wait in flight", |s| !s.posts_of("wait").is_empty()).await;
    drop(shim.stdin.take());
    fake.release("late");
    assert_eq!(shim.recv().await["id"], json!(80));
    shim.finish().await;
    fake.with(|s| assert_eq!(s.deletes().len(), 1));
}

#[tokio::test]
async fn shutdown_signal_stops_at_once_and_deletes_the_session() {
    let fake = FakeMcp::start();
    let mut shim = Shim::start(TestConnector::new(Some(fake.endpoint())));
    let sid = handshake(&mut shim, &fake).await;
    shim.send(json!({"jsonrpc": "2.0", "id": 90, "method": "hang"})).await;
    fake.wait_until("hang in flight", |s| !s.posts_of("hang").is_empty()).await;
    shim.shutdown.cancel();
    let result = tokio::time::timeout(WAIT, &mut shim.task).await.expect("stops").expect("task");
    result.expect("run returns Ok");
    fake.with(|s| assert_eq!(s.deletes()[0].session.as_deref(), Some(sid.as_str())));
}

// ---- The `/mcp` stream (`Upgrade: coffer-mcp-stream`) -----------------------------------------

/// `initialize` + `notifications/initialized` on a stream fake; returns once the fake has both.
async fn stream_handshake(shim: &mut Shim, fake: &fake_stream::FakeStream) {
    shim.send(initialize_request(json!(0))).await;
    let reply = shim.recv().await;
    assert_eq!((&reply["id"], &reply["result"]["serverInfo"]["name"]), (&json!(0), &json!("fake-stream")));
    shim.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    fake.wait_until("notifications/initialized", |s| {
        s.lines.iter().any(|(_, m)| m["method"] == "notifications/initialized")
    })
    .await;
}

#[tokio::test]
async fn stream_carries_the_session_in_order_and_answers_out_of_order() {
    let fake = fake_stream::FakeStream::start().await;
    let connector = TestConnector::new(Some(fake.endpoint()));
    let mut shim = Shim::start(connector.clone());
    stream_handshake(&mut shim, &fake).await;

    shim.send(json!({"jsonrpc": "2.0", "id": 1, "method": "later", "params": {"ms": 300}})).await;
    shim.send(echo(2, json!({"text": "b"}))).await;
    shim.send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9}})).await;
    assert_eq!(shim.recv().await, json!({"jsonrpc": "2.0", "id": 2, "result": {"echo": {"text": "b"}}}));
    assert_eq!(shim.recv().await, json!({"jsonrpc": "2.0", "id": 1, "result": {"later": 300}}));

    fake.with(|s| {
        assert_eq!(s.heads.len(), 1, "one connection for the whole session");
        let head = s.heads[0].to_ascii_lowercase();
        assert!(head.starts_with("get /mcp http/1.1"), "{head}");
        assert!(head.contains("upgrade: coffer-mcp-stream") && head.contains("connection: upgrade"), "{head}");
        let methods: Vec<&str> = s.lines.iter().map(|(_, m)| m["method"].as_str().unwrap_or("")).collect();
        // The client's order on stdin is the order on the stream, notifications included.
        assert_eq!(methods, ["initialize", "notifications/initialized", "later", "echo", "notifications/cancelled"]);
        assert_eq!(s.lines[0].1, initialize_request(json!(0)), "the client's initialize goes through unchanged");
    });
    assert_eq!(connector.calls(), 1);
    shim.finish().await;
    fake.wait_until("the shim to close its stream", |s| s.closed_by_client == 1).await;
}

#[tokio::test]
async fn stream_loss_fails_in_flight_requests_at_once_and_the_next_request_reinitializes() {
    let fake = fake_stream::FakeStream::start().await;
    let connector = TestConnector::new(Some(fake.endpoint()));
    let mut shim = Shim::start(connector.clone());
    stream_handshake(&mut shim, &fake).await;
    shim.send(json!({"jsonrpc": "2.0", "id": "held-1", "method": "hold"})).await;
    shim.send(json!({"jsonrpc": "2.0", "id": "held-2", "method": "hold"})).await;
    fake.wait_until("both held requests", |s| s.on(0).iter().filter(|m| m["method"] == "hold").count() == 2).await;

    fake.drop_connections();
    let mut failed: Vec<Value> = shim.recv_n(2).await;
    failed.sort_by_key(|m| m["id"].as_str().unwrap_or_default().to_owned());
    for (m, id) in failed.iter().zip(["held-1", "held-2"]) {
        assert_eq!(m["id"], json!(id), "{m}");
        assert_eq!(m["error"]["code"], json!(-32001), "{m}");
        assert!(m["error"]["message"].as_str().unwrap().contains("may be retried"), "{m}");
        assert!(m["error"]["data"]["reason"].as_str().unwrap().contains("closed the MCP stream"), "{m}");
    }

    // The next request opens a new stream, replays the client's initialize and initialized
    // notification there (their answers stay with the shim), then goes through.
    shim.send(echo(3, json!("after"))).await;
    assert_eq!(shim.recv().await, json!({"jsonrpc": "2.0", "id": 3, "result": {"echo": "after"}}));
    fake.with(|s| {
        assert_eq!(s.heads.len(), 2, "a second connection");
        let second = s.on(1);
        let methods: Vec<&str> = second.iter().map(|m| m["method"].as_str().unwrap_or("")).collect();
        assert_eq!(methods, ["initialize", "notifications/initialized", "echo"]);
        assert_eq!(second[0]["id"], json!("coffer-shim-reinit-1"));
        assert_eq!(second[0]["params"], initialize_request(json!(0))["params"], "the client's own initialize params");
    });
    assert_eq!(connector.calls(), 2, "detect-or-spawn again after the loss");
    shim.finish().await;
}

#[tokio::test]
async fn stream_eof_lets_in_flight_requests_finish_then_closes_the_stream() {
    let fake = fake_stream::FakeStream::start().await;
    let mut shim = Shim::start(TestConnector::new(Some(fake.endpoint())));
    stream_handshake(&mut shim, &fake).await;
    shim.send(json!({"jsonrpc": "2.0", "id": 7, "method": "later", "params": {"ms": 200}})).await;
    fake.wait_until("the request", |s| s.on(0).iter().any(|m| m["method"] == "later")).await;
    drop(shim.stdin.take());
    assert_eq!(shim.recv().await, json!({"jsonrpc": "2.0", "id": 7, "result": {"later": 200}}));
    shim.finish().await;
    fake.wait_until("the shim to close its stream", |s| s.closed_by_client == 1).await;
}

/// A request the client cancels no longer waits for an answer the daemon will not send (MCP:
/// no response to a cancelled request): at stdin EOF nothing is left to drain, so the shim
/// ends at once instead of after the drain timeout, and nothing is written for it.
#[tokio::test]
async fn a_cancelled_request_is_not_waited_for() {
    let fake = fake_stream::FakeStream::start().await;
    let config = Config { drain_timeout: Duration::from_secs(60), ..Config::default() };
    let mut shim = Shim::start_with(TestConnector::new(Some(fake.endpoint())), config);
    stream_handshake(&mut shim, &fake).await;
    shim.send(json!({"jsonrpc": "2.0", "id": "never", "method": "hold"})).await;
    shim.send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "never"}})).await;
    fake.wait_until("the cancel", |s| s.on(0).iter().any(|m| m["method"] == "notifications/cancelled")).await;
    // Finishes within WAIT (10 s), far below the 60 s drain timeout, and writes nothing more.
    shim.finish().await;
}

/// Pings after 100 ms of silence, gives up 200 ms later.
fn quick_liveness() -> Config {
    Config {
        liveness_interval: Duration::from_millis(100),
        liveness_timeout: Duration::from_millis(200),
        ..Config::default()
    }
}

/// A daemon that stops answering (stopped, wedged) while a request waits: the shim pings it,
/// gets nothing back, and gives the stream up, so the request gets -32001 instead of hanging;
/// the next request goes through on a new connection.
#[tokio::test]
async fn a_silent_daemon_fails_waiting_requests_instead_of_hanging_them() {
    let fake = fake_stream::FakeStream::start().await;
    let mut shim = Shim::start_with(TestConnector::new(Some(fake.endpoint())), quick_liveness());
    stream_handshake(&mut shim, &fake).await;
    shim.send(json!({"jsonrpc": "2.0", "id": "f", "method": "freeze"})).await;
    let failed = shim.recv().await;
    assert_eq!((&failed["id"], &failed["error"]["code"]), (&json!("f"), &json!(-32001)), "{failed}");
    let reason = failed["error"]["data"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("not even an answer to a ping"), "{reason}");
    fake.with(|s| assert!(s.on(0).iter().any(|m| m["method"] == "ping"), "the shim pinged the silent daemon"));

    shim.send(echo(2, json!("again"))).await;
    assert_eq!(shim.recv().await, json!({"jsonrpc": "2.0", "id": 2, "result": {"echo": "again"}}));
    fake.with(|s| assert_eq!(s.heads.len(), 2, "a new connection"));
    shim.finish().await;
}

/// A daemon that answers its pings keeps the stream, however long a request takes.
#[tokio::test]
async fn a_slow_request_on_a_live_daemon_is_not_given_up() {
    let fake = fake_stream::FakeStream::start().await;
    let mut shim = Shim::start_with(TestConnector::new(Some(fake.endpoint())), quick_liveness());
    stream_handshake(&mut shim, &fake).await;
    shim.send(json!({"jsonrpc": "2.0", "id": 1, "method": "later", "params": {"ms": 1500}})).await;
    assert_eq!(shim.recv().await, json!({"jsonrpc": "2.0", "id": 1, "result": {"later": 1500}}));
    fake.with(|s| {
        assert!(s.on(0).iter().filter(|m| m["method"] == "ping").count() >= 2, "pinged while it waited");
        assert_eq!(s.heads.len(), 1, "the same connection throughout");
    });
    shim.finish().await;
}

#[tokio::test]
async fn a_server_without_the_stream_is_spoken_to_with_streamable_http() {
    let fake = FakeMcp::start();
    let connector = TestConnector::new(Some(fake.endpoint().with_stream(true)));
    let mut shim = Shim::start(connector.clone());
    let sid = handshake(&mut shim, &fake).await;
    shim.send(echo(1, json!("over http"))).await;
    assert_eq!(shim.recv().await, json!({"jsonrpc": "2.0", "id": 1, "result": {"echo": "over http"}}));
    fake.with(|s| {
        assert_eq!(s.posts_of("echo")[0].session.as_deref(), Some(sid.as_str()), "the echo went as a POST");
        assert!(
            s.requests.iter().any(|r| r.http == axum::http::Method::GET && r.session.is_none()),
            "the shim asked for the stream first"
        );
    });
    shim.finish().await;
}

#[tokio::test]
async fn a_second_initialize_closes_the_first_stream_and_its_session() {
    let fake = fake_stream::FakeStream::start().await;
    let mut shim = Shim::start(TestConnector::new(Some(fake.endpoint())));
    stream_handshake(&mut shim, &fake).await;
    shim.send(initialize_request(json!("again"))).await;
    let reply = shim.recv().await;
    assert_eq!(reply["id"], json!("again"), "{reply}");
    fake.wait_until("the first stream closed by the shim", |s| s.closed_by_client == 1).await;
    fake.with(|s| {
        assert_eq!(s.heads.len(), 2, "a new connection for the new session");
        assert_eq!(s.on(1)[0]["id"], json!("again"), "the new initialize went on the new stream");
    });
    shim.finish().await;
}

#[tokio::test]
async fn a_duplicate_id_in_flight_is_refused_and_the_first_request_still_gets_its_answer() {
    let fake = fake_stream::FakeStream::start().await;
    let mut shim = Shim::start(TestConnector::new(Some(fake.endpoint())));
    stream_handshake(&mut shim, &fake).await;
    shim.send(json!({"jsonrpc": "2.0", "id": 7, "method": "hold"})).await;
    shim.send(json!({"jsonrpc": "2.0", "id": 7, "method": "echo", "params": "second"})).await;
    let refused = shim.recv().await;
    assert_eq!((&refused["id"], &refused["error"]["code"]), (&json!(7), &json!(-32600)), "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("already used"), "{refused}");
    fake.wait_until("the first request", |s| s.on(0).iter().any(|m| m["method"] == "hold")).await;
    fake.with(|s| assert_eq!(s.on(0).iter().filter(|m| m["id"] == json!(7)).count(), 1, "only the first was sent"));
    // The first is still tracked: a loss answers it.
    fake.drop_connections();
    let lost = shim.recv().await;
    assert_eq!((&lost["id"], &lost["error"]["code"]), (&json!(7), &json!(-32001)), "{lost}");
    shim.finish().await;
}

/// A connector whose "daemon" keeps answers in `memory` and is ready only once `ready` says so:
/// until then `connect` waits, as detect-or-spawn waits for a daemon it started.
#[derive(Clone)]
struct ColdConnector {
    inner: TestConnector,
    memory: Memory,
    ready: tokio::sync::watch::Receiver<bool>,
}

impl Connector for ColdConnector {
    async fn connect(&self) -> Result<Endpoint, BoxError> {
        self.ready.clone().wait_for(|ready| *ready).await.map_err(|e| BoxError::from(e.to_string()))?;
        self.inner.connect().await
    }
    fn memory(&self) -> Option<Memory> {
        Some(self.memory.clone())
    }
    fn daemon_ready(&self) -> bool {
        *self.ready.borrow()
    }
}

/// A cold start (no daemon ready yet) is answered from the answers kept from an earlier session
/// at once: `initialize` and `tools/list` reach the client before the daemon is up. Once it is,
/// the shim initializes it, sends it the client's `notifications/initialized`, asks it the list
/// again, and — since a tool was added meanwhile — tells the client `tools/list_changed`.
#[tokio::test]
async fn a_cold_start_is_answered_from_memory_and_checked_with_the_daemon() {
    let fake = FakeMcp::start();
    fake.set_tools(json!([{"name": "a", "inputSchema": {"type": "object"}}]));
    let dir = std::env::temp_dir().join(format!("coffer-shim-cold-{}", std::process::id()));
    let memory = Memory::new(dir.clone(), "test".into());
    let list = |id: i64| json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"});

    // Yesterday's session, with the daemon up: its answers are kept.
    let (_up, ready) = tokio::sync::watch::channel(true);
    let warm = ColdConnector { inner: TestConnector::new(Some(fake.endpoint())), memory: memory.clone(), ready };
    let mut shim = Shim::start_with(warm, Config::default());
    shim.send(initialize_request(json!(0))).await;
    let live_init = shim.recv().await;
    shim.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    shim.send(list(1)).await;
    assert_eq!(shim.recv().await["result"]["tools"][0]["name"], "a");
    shim.finish().await;

    // Today: no daemon is ready; a tool was added to it meanwhile.
    fake.set_tools(
        json!([{"name": "a", "inputSchema": {"type": "object"}}, {"name": "b", "inputSchema": {"type": "object"}}]),
    );
    let seen_before = fake.with(|s| s.requests.len());
    let posts_before = fake.with(|s| s.posts().count());
    let (up, ready) = tokio::sync::watch::channel(false);
    let cold = ColdConnector { inner: TestConnector::new(Some(fake.endpoint())), memory, ready };
    let mut shim = Shim::start_with(cold, Config::default());
    shim.send(initialize_request(json!("init"))).await;
    let init = shim.recv().await;
    assert_eq!(init["id"], "init");
    assert_eq!(init["result"], live_init["result"], "the daemon's answer of yesterday");
    shim.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    shim.send(list(1)).await;
    let listed = shim.recv().await;
    assert_eq!((listed["id"].clone(), listed["result"]["tools"].as_array().map(Vec::len)), (json!(1), Some(1)));
    assert_eq!(fake.with(|s| s.requests.len()), seen_before, "nothing reached the daemon yet");

    // The daemon comes up.
    up.send(true).unwrap();
    let note = shim.recv().await;
    assert_eq!(note, json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}));
    shim.send(list(2)).await;
    let listed = shim.recv().await;
    assert_eq!(listed["result"]["tools"].as_array().map(Vec::len), Some(2), "{listed}");
    assert_eq!(
        fake.with(|s| s.posts().skip(posts_before).filter_map(|p| p.method.clone()).take(2).collect::<Vec<_>>()),
        ["initialize", "notifications/initialized"],
        "the session is established before anything else reaches it"
    );
    shim.finish().await;
    let _ = std::fs::remove_dir_all(&dir);
}
