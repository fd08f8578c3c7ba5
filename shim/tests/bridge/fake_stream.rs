//! A stand-in for the daemon's `/mcp` stream (`Upgrade: coffer-mcp-stream`, newline-delimited
//! JSON-RPC after `101`) on real loopback TCP, recording every connection and line.
//!
//! Methods it answers on a stream: `initialize` (a session per connection), `echo` (result echoes
//! `params`), `later` (answered after `params.ms` milliseconds), `hold` (never answered),
//! `freeze` (never answered, and from then on that connection answers nothing, like a stopped
//! daemon); other requests (`ping` among them) get an empty result. [`FakeStream::drop_connections`] closes every open connection the
//! way a dying daemon's sockets close.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_shim::Endpoint;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::fake_mcp::{PROTOCOL, TOKEN};

/// What the fake has seen.
#[derive(Default)]
pub struct StreamState {
    /// The head of each upgrade request, one per connection, in order.
    pub heads: Vec<String>,
    /// Every line received: (connection number from 0, message).
    pub lines: Vec<(usize, Value)>,
    /// Connections the client closed.
    pub closed_by_client: usize,
    live: Vec<CancellationToken>,
}

impl StreamState {
    /// The messages of connection `conn`.
    pub fn on(&self, conn: usize) -> Vec<Value> {
        self.lines.iter().filter(|(c, _)| *c == conn).map(|(_, v)| v.clone()).collect()
    }
}

pub struct FakeStream {
    base_url: String,
    state: Arc<Mutex<StreamState>>,
    /// Bumped after every change of `state`.
    changed: watch::Sender<u64>,
    stop: CancellationToken,
}

impl FakeStream {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base_url = format!("http://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(Mutex::new(StreamState::default()));
        let changed = watch::Sender::new(0);
        let stop = CancellationToken::new();
        let (st, stop2) = (Shared { state: state.clone(), changed: changed.clone() }, stop.clone());
        tokio::spawn(async move {
            loop {
                let tcp = tokio::select! {
                    () = stop2.cancelled() => return,
                    accepted = listener.accept() => accepted.expect("accept").0,
                };
                let conn_stop = stop2.child_token();
                let conn = st.update(|s| {
                    s.live.push(conn_stop.clone());
                    s.heads.len()
                });
                tokio::spawn(serve(tcp, conn, st.clone(), conn_stop));
            }
        });
        Self { base_url, state, changed, stop }
    }

    /// An endpoint that asks for the stream.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint::new(self.base_url.clone(), TOKEN.to_owned().into()).with_stream(true)
    }

    pub fn with<T>(&self, f: impl FnOnce(&StreamState) -> T) -> T {
        f(&self.state.lock().unwrap())
    }

    /// Closes every open connection at once.
    pub fn drop_connections(&self) {
        for c in self.state.lock().unwrap().live.drain(..) {
            c.cancel();
        }
    }

    /// Waits (at most [`crate::WAIT`]) until `cond` holds, woken by every change.
    pub async fn wait_until(&self, what: &str, mut cond: impl FnMut(&StreamState) -> bool) {
        let mut rx = self.changed.subscribe();
        let wait = async {
            while !cond(&self.state.lock().unwrap()) {
                if rx.changed().await.is_err() {
                    return;
                }
            }
        };
        assert!(tokio::time::timeout(crate::WAIT, wait).await.is_ok(), "timed out waiting for {what}");
    }
}

impl Drop for FakeStream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The state and its change signal, for the connection tasks.
#[derive(Clone)]
struct Shared {
    state: Arc<Mutex<StreamState>>,
    changed: watch::Sender<u64>,
}

impl Shared {
    fn update<T>(&self, f: impl FnOnce(&mut StreamState) -> T) -> T {
        let out = f(&mut self.state.lock().unwrap());
        self.changed.send_modify(|n| *n += 1);
        out
    }
}

async fn serve(tcp: TcpStream, conn: usize, state: Shared, stop: CancellationToken) {
    let (read, mut write) = tcp.into_split();
    let mut read = BufReader::new(read);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if read.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let lower = head.to_ascii_lowercase();
    state.update(|s| s.heads.push(head));
    if !lower.contains("upgrade: coffer-mcp-stream") || !lower.contains(&format!("x-coffer-token: {TOKEN}")) {
        let _ = write.write_all(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n").await;
        return;
    }
    write
        .write_all(b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: coffer-mcp-stream\r\n\r\n")
        .await
        .expect("write 101");
    let (out, mut queue) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        while let Some(line) = queue.recv().await {
            if write.write_all(format!("{line}\n").as_bytes()).await.is_err() {
                return;
            }
        }
    });
    let mut lines = read.lines();
    let mut frozen = false;
    loop {
        let line = tokio::select! {
            () = stop.cancelled() => break,
            line = lines.next_line() => line,
        };
        let Ok(Some(line)) = line else {
            state.update(|s| s.closed_by_client += 1);
            break;
        };
        let msg: Value = serde_json::from_str(&line).expect("the shim writes JSON lines");
        state.update(|s| s.lines.push((conn, msg.clone())));
        if frozen {
            continue;
        }
        let Some(id) = msg.get("id").cloned() else { continue };
        let reply = |result: Value| json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
        match msg["method"].as_str() {
            Some("initialize") => {
                let _ = out.send(reply(json!({"protocolVersion": PROTOCOL, "capabilities": {}, "serverInfo": {"name": "fake-stream", "version": "0"}})));
            }
            Some("echo") => {
                let _ = out.send(reply(json!({"echo": msg["params"]})));
            }
            Some("later") => {
                let (out, ms) = (out.clone(), msg["params"]["ms"].as_u64().unwrap_or(0));
                let line = reply(json!({"later": ms}));
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    let _ = out.send(line);
                });
            }
            Some("hold") => {}
            Some("freeze") => frozen = true,
            _ => {
                let _ = out.send(reply(json!({})));
            }
        }
    }
    drop(out);
    writer.abort();
}
