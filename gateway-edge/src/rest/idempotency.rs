//! `Idempotency-Key` on `POST /v1/conversations/{id}/messages` (IETF draft
//! `draft-ietf-httpapi-idempotency-key-header`): a client names each message it sends; a send
//! retried with the same key within [`WINDOW`] — after a timeout, a dropped connection, or a
//! page reload that found the message unconfirmed — is answered with the first send's answer
//! (`Idempotent-Replayed: true`) instead of queueing the text twice. A retry that arrives while
//! the first is still being handled waits for it. A first send that failed leaves no trace (the
//! retry does the work). The same key with a different body is 409 `CONFLICT`.
//!
//! This is the one piece of chat state the edge keeps, and deliberately so: it is about HTTP
//! requests (a header, their bodies, their answers), held in memory for minutes, and every REST
//! client gets it. An edge restart forgets it (a retry across one could queue twice; the
//! console's own retries span seconds).
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use coffer_api::chat::SendMessageReply;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::error::{ApiError, Code};

/// The request header.
pub const HEADER: &str = "idempotency-key";
/// The answer's header on a replayed answer.
pub const REPLAYED: &str = "idempotent-replayed";
/// How long a key is remembered after its send was answered.
pub const WINDOW: Duration = Duration::from_secs(15 * 60);
/// Most keys remembered (the oldest answered ones go first).
pub const MAX_KEYS: usize = 4096;

/// What became of a key's first send.
enum Slot {
    /// Being handled; the sender publishes the answer (or `None`: it failed).
    InFlight {
        fingerprint: [u8; 32],
        done: watch::Receiver<Option<Option<SendMessageReply>>>,
    },
    Done {
        fingerprint: [u8; 32],
        reply: Box<SendMessageReply>,
        at: Instant,
    },
}

/// Recent keys, by (conversation id, key).
#[derive(Default)]
pub struct Recent {
    slots: Mutex<HashMap<(String, String), Slot>>,
}

/// What to do with a keyed send.
pub enum Begin<'a> {
    /// The first: send it, then [`First::finish`].
    First(First<'a>),
    /// Answered before: this answer again.
    Replay(Box<SendMessageReply>),
}

/// The first send of a key; dropping it unfinished forgets the key (a retry sends again).
pub struct First<'a> {
    recent: &'a Recent,
    slot: (String, String),
    fingerprint: [u8; 32],
    tx: Option<watch::Sender<Option<Option<SendMessageReply>>>>,
}

impl First<'_> {
    /// Records the answer: later sends with the key get it.
    pub fn finish(mut self, reply: &SendMessageReply) {
        let mut slots = self.recent.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.insert(
            self.slot.clone(),
            Slot::Done { fingerprint: self.fingerprint, reply: Box::new(reply.clone()), at: Instant::now() },
        );
        drop(slots);
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Some(Some(reply.clone())));
        }
    }
}

impl Drop for First<'_> {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            self.recent.slots.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.slot);
            let _ = tx.send(Some(None));
        }
    }
}

/// The key of a request's headers: `None` without one.
///
/// # Errors
/// 400 naming the header when it is not 1–128 visible ASCII characters, or when it is given
/// more than once (which key names the message would be a guess: the draft allows one).
pub fn key_of(h: &axum::http::HeaderMap) -> Result<Option<String>, ApiError> {
    let mut all = h.get_all(HEADER).iter();
    let Some(v) = all.next() else { return Ok(None) };
    if all.next().is_some() {
        return Err(ApiError::invalid(
            "Idempotency-Key is given more than once: send one key per request (a random id per message)",
        )
        .with_details(serde_json::json!({"header": "Idempotency-Key"})));
    }
    let bad = || {
        ApiError::invalid("Idempotency-Key must be 1-128 visible ASCII characters (a random id per message)")
            .with_details(serde_json::json!({"header": "Idempotency-Key"}))
    };
    let s = v.to_str().map_err(|_| bad())?.trim();
    // A structured-field string ("…", as the draft writes it) or a bare token: both are taken.
    let s = s.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(s);
    if s.is_empty() || s.len() > 128 || !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad());
    }
    Ok(Some(s.to_owned()))
}

/// The SHA-256 of a request body's bytes (as parsed: its JSON re-serialised).
pub fn fingerprint(body: &impl serde::Serialize) -> [u8; 32] {
    Sha256::digest(serde_json::to_vec(body).unwrap_or_default()).into()
}

impl Recent {
    /// Claims `key` of conversation `id` for a send whose body has `fingerprint`; waits while
    /// an earlier send with the key is being handled.
    ///
    /// # Errors
    /// 409 `CONFLICT` when the key was used for a different body.
    pub async fn begin(&self, id: &str, key: &str, fingerprint: [u8; 32]) -> Result<Begin<'_>, ApiError> {
        let slot = (id.to_owned(), key.to_owned());
        loop {
            let mut wait = {
                let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
                prune(&mut slots);
                match slots.get(&slot) {
                    None => {
                        let (tx, rx) = watch::channel(None);
                        slots.insert(slot.clone(), Slot::InFlight { fingerprint, done: rx });
                        return Ok(Begin::First(First { recent: self, slot, fingerprint, tx: Some(tx) }));
                    }
                    Some(Slot::Done { fingerprint: f, .. } | Slot::InFlight { fingerprint: f, .. })
                        if *f != fingerprint =>
                    {
                        return Err(ApiError::new(
                            Code::Conflict,
                            "this Idempotency-Key was used for a different message: use a new key per message",
                        )
                        .with_details(serde_json::json!({"header": "Idempotency-Key", "reason": "different_body"})));
                    }
                    Some(Slot::Done { reply, .. }) => return Ok(Begin::Replay(reply.clone())),
                    Some(Slot::InFlight { done, .. }) => done.clone(),
                }
            };
            // The first send ends either way (answered or failed and forgotten): look again.
            let _ = wait.wait_for(Option::is_some).await;
        }
    }
}

/// Drops answered keys past [`WINDOW`], then the oldest answered ones past [`MAX_KEYS`].
fn prune(slots: &mut HashMap<(String, String), Slot>) {
    slots.retain(|_, s| !matches!(s, Slot::Done { at, .. } if at.elapsed() > WINDOW));
    if slots.len() < MAX_KEYS {
        return;
    }
    let mut done: Vec<((String, String), Instant)> = slots
        .iter()
        .filter_map(|(k, s)| match s {
            Slot::Done { at, .. } => Some((k.clone(), *at)),
            Slot::InFlight { .. } => None,
        })
        .collect();
    done.sort_by_key(|(_, at)| *at);
    for (k, _) in done.into_iter().take(slots.len() + 1 - MAX_KEYS) {
        slots.remove(&k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(text: &str) -> SendMessageReply {
        SendMessageReply {
            pending: Some(coffer_api::chat::PendingItem { id: text.into(), text: text.into(), ..Default::default() }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_key_is_answered_once_a_retry_waits_and_a_failure_is_forgotten() {
        let r = Recent::default();
        let fp = fingerprint(&"hello");
        let Begin::First(first) = r.begin("c", "k1", fp).await.unwrap() else { panic!("first") };
        // A retry while the first is in flight waits for its answer.
        let retry = async { r.begin("c", "k1", fp).await };
        let finish = async {
            tokio::task::yield_now().await;
            first.finish(&reply("a"));
        };
        let (got, ()) = tokio::join!(retry, finish);
        assert!(matches!(got, Ok(Begin::Replay(x)) if *x == reply("a")));
        // Another conversation, another key: their own.
        assert!(matches!(r.begin("c2", "k1", fp).await, Ok(Begin::First(_))));
        // A different body under the same key is refused, naming the header.
        let Err(e) = r.begin("c", "k1", fingerprint(&"other")).await else { panic!("conflict") };
        assert_eq!(e.details["header"], "Idempotency-Key");
        // A first send that failed leaves nothing behind.
        let Begin::First(f) = r.begin("c", "k2", fp).await.unwrap() else { panic!() };
        drop(f);
        assert!(matches!(r.begin("c", "k2", fp).await, Ok(Begin::First(_))));
    }

    #[test]
    fn keys_are_checked() {
        let h = |v: &str| {
            let mut m = axum::http::HeaderMap::new();
            m.insert(HEADER, v.parse().unwrap());
            key_of(&m)
        };
        assert_eq!(h("abc-123").unwrap().as_deref(), Some("abc-123"));
        assert_eq!(h("\"abc\"").unwrap().as_deref(), Some("abc"));
        assert!(h("").is_err());
        assert!(h("a b").is_err());
        assert!(h(&"x".repeat(129)).is_err());
        assert_eq!(key_of(&axum::http::HeaderMap::new()).unwrap(), None);
        // Two keys (the same or not): refused, naming the header.
        for second in ["k2", "k1"] {
            let mut m = axum::http::HeaderMap::new();
            m.append(HEADER, "k1".parse().unwrap());
            m.append(HEADER, second.parse().unwrap());
            let e = key_of(&m).unwrap_err();
            assert!(e.message.contains("more than once"), "{}", e.message);
            assert_eq!(e.details["header"], "Idempotency-Key");
        }
    }
}
