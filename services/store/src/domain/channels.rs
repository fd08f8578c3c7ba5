//! The `Channels` service (`proto/store_channels.proto`): the IM chats the owner drives
//! conversations from (`channels`, `channel_events`, migration 0008) — configuration (kind,
//! enabled flag, credential references, API base, default agent and its config), the owner after
//! pairing, the pending pairing code (its SHA-256 only), Telegram's update cursor and the SeaTalk
//! events already seen.
//!
//! Configuration, owner and pairing writes are audited (actor from the request; claims as
//! [`CLAIM_ACTOR`], never with the code) and produce change rows (entity `channel`, key = the
//! name); the cursor and recorded events write neither. Pairing codes are 8 characters of
//! Crockford base-32 from the operating system's CSPRNG (`getrandom`, as the vault's nonces),
//! compared with the stored digest in constant time (`subtle`), single use. Wrong tries are
//! counted per sender (`channel_pairing_tries`, migration 0010): after
//! [`rules::PAIRING_MAX_WRONG_TRIES`] wrong tries a sender is refused for the rest of that code,
//! while the code stays good for everyone else — a stranger who found the bot cannot burn the
//! owner's code. Guessing stays hopeless: 40 bits, a few tries per chat, minutes to live.
//!
//! Who does what ([`crate::authz`]): the gateway configures channels and issues pairing codes
//! (lifetime 60–3600 s, default 600); coffer-chat alone claims codes, moves cursors and records
//! events. `channel_events` keeps the newest 10,000 SeaTalk event ids per channel. The field rules
//! live once in `coffer_types::channels`.
use coffer_proto::store::channels_server::Channels;
use coffer_proto::store::*;
use coffer_types::channels as rules;
use rusqlite::{Connection, OptionalExtension, Row, params};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::{Request, Response, Status};

use super::{audit, required, trace, truncate};
use crate::db::{Db, StoreError};

/// The audit actor of `ClaimPairing` (a chat on a channel, through coffer-chat's adapter).
pub const CLAIM_ACTOR: &str = "channel";

/// Validates a channel name (`coffer_types::channels::check_name`: `^[a-z0-9][a-z0-9-]{0,31}$`).
///
/// # Errors
/// [`StoreError::Invalid`] naming the field and the rule.
pub fn validate_name(name: &str) -> Result<(), StoreError> {
    rules::check_name(name).map_err(StoreError::Invalid)
}

/// Validates a record's configuration (the fields a caller sets; owner, pairing, cursor,
/// version and the times are the store's) and returns its `agent_config_json` in canonical
/// form (compact JSON; empty stays empty).
///
/// # Errors
/// [`StoreError::Invalid`] naming the first field that breaks its rule.
pub fn validate(c: &ChannelRecord) -> Result<String, StoreError> {
    validate_name(&c.name)?;
    let kind = required::<ChannelKind>(c.kind, "kind")?;
    let needed = rules::required_refs(kind.as_str()).unwrap_or_default();
    let refs = [
        ("bot_token_ref", &c.bot_token_ref),
        ("app_id_ref", &c.app_id_ref),
        ("app_secret_ref", &c.app_secret_ref),
        ("signing_secret_ref", &c.signing_secret_ref),
    ];
    for (field, value) in refs {
        if needed.contains(&field) {
            if value.is_empty() {
                return Err(StoreError::Invalid(format!(
                    "{field} is required for a {} channel (give the secret or name an existing credential)",
                    kind.as_str()
                )));
            }
            crate::credential_crypto::validate_name(value).map_err(|_| {
                StoreError::Invalid(format!(
                    "{field} {:?} is not a valid credential name: use 1-{} characters A-Z, a-z, 0-9, '_', '.' and \
                     '-', starting with a letter or digit",
                    truncate(value, 80),
                    crate::credential_crypto::MAX_NAME_LEN
                ))
            })?;
        } else if !value.is_empty() {
            return Err(StoreError::Invalid(format!(
                "{field} is not used by a {} channel; leave it empty",
                kind.as_str()
            )));
        }
    }
    if !c.api_base_url.is_empty() {
        coffer_types::llm::check_url("api_base_url", &c.api_base_url).map_err(StoreError::Invalid)?;
    }
    rules::check_agent(&c.default_agent).map_err(StoreError::Invalid)?;
    agent_config(&c.agent_config_json)
}

/// Checks `agent_config_json` (empty, or a JSON object whose only keys are `cwd` — an absolute
/// path —, `model` and `permission_mode` — `bypass`, `ask` or `read_only`: the default mode of
/// the conversations the channel creates —, all strings) and returns it compact.
fn agent_config(json: &str) -> Result<String, StoreError> {
    const FIELD: &str = "agent_config_json";
    if json.is_empty() {
        return Ok(String::new());
    }
    if json.len() > rules::MAX_AGENT_CONFIG_LEN {
        return Err(StoreError::Invalid(format!(
            "{FIELD} is {} bytes; at most {} are allowed",
            json.len(),
            rules::MAX_AGENT_CONFIG_LEN
        )));
    }
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| StoreError::Invalid(format!("{FIELD} is not valid JSON ({e})")))?;
    let serde_json::Value::Object(map) = value else {
        return Err(StoreError::Invalid(format!("{FIELD} must be a JSON object {{\"cwd\": …, \"model\": …}}")));
    };
    for (key, value) in &map {
        let Some(text) = value.as_str() else {
            if key == "cwd" || key == "model" || key == "permission_mode" {
                return Err(StoreError::Invalid(format!("{FIELD}.{key} must be a string")));
            }
            return Err(unknown_key(key));
        };
        match key.as_str() {
            "cwd" => {
                if text.len() > rules::MAX_CWD_LEN {
                    return Err(StoreError::Invalid(format!(
                        "{FIELD}.cwd is {} bytes; at most {} are allowed",
                        text.len(),
                        rules::MAX_CWD_LEN
                    )));
                }
                if text.chars().any(char::is_control) {
                    return Err(StoreError::Invalid(format!("{FIELD}.cwd must not contain control characters")));
                }
                if !text.is_empty() && !text.starts_with('/') {
                    return Err(StoreError::Invalid(format!(
                        "{FIELD}.cwd {:?} must be an absolute path",
                        truncate(text, 80)
                    )));
                }
            }
            "model" => {
                if !text.is_empty() {
                    coffer_types::llm::check_model(&format!("{FIELD}.model"), text).map_err(StoreError::Invalid)?;
                }
            }
            "permission_mode" => {
                if !["bypass", "ask", "read_only"].contains(&text) {
                    return Err(StoreError::Invalid(format!(
                        "{FIELD}.permission_mode {:?} is not a mode: use bypass, ask or read_only",
                        truncate(text, 40)
                    )));
                }
            }
            _ => return Err(unknown_key(key)),
        }
    }
    Ok(serde_json::Value::Object(map).to_string())
}

fn unknown_key(key: &str) -> StoreError {
    StoreError::Invalid(format!(
        "agent_config_json.{} is not allowed: a channel's agent config has only cwd, model and permission_mode",
        truncate(key, 40)
    ))
}

/// Milliseconds since the Unix epoch, now.
fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis() as i64
}

/// The stored pairing code's state (of `channels.pairing_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CodeState {
    /// No code was issued since creation or the last unpairing.
    None,
    /// Waiting for its claim.
    Pending,
    Used,
    Expired,
}

/// The pairing columns of one row.
#[derive(Debug, Clone)]
struct Pairing {
    digest: Option<Vec<u8>>,
    expires_ms: i64,
    /// Wrong tries of all senders (for the record; a sender's own count is what refuses it).
    wrong_tries: u32,
    used: bool,
}

impl Pairing {
    fn state(&self, now_ms: i64) -> CodeState {
        match self.digest {
            None => CodeState::None,
            Some(_) if self.used => CodeState::Used,
            Some(_) if self.expires_ms <= now_ms => CodeState::Expired,
            Some(_) => CodeState::Pending,
        }
    }
}

/// A row: the record as the RPCs return it, and its pairing columns.
struct Stored {
    record: ChannelRecord,
    pairing: Pairing,
}

const COLS: &str = "name, kind, enabled, bot_token_ref, app_id_ref, app_secret_ref, signing_secret_ref, api_base_url, \
                    default_agent, agent_config_json, owner_id, owner_display, paired_at, cursor, version, created_at, \
                    updated_at, pairing_sha256, pairing_expires_ms, pairing_wrong_tries, pairing_used";

fn from_row(r: &Row<'_>, now_ms: i64) -> rusqlite::Result<Stored> {
    // The column's CHECK admits only the words `ChannelKind::parse` knows.
    let kind = ChannelKind::parse(&r.get::<_, String>(1)?).unwrap_or_default();
    let pairing = Pairing {
        digest: r.get(17)?,
        expires_ms: r.get(18)?,
        wrong_tries: r.get::<_, i64>(19)?.clamp(0, u32::MAX as i64) as u32,
        used: r.get::<_, i64>(20)? != 0,
    };
    let pending = pairing.state(now_ms) == CodeState::Pending;
    let record = ChannelRecord {
        name: r.get(0)?,
        kind: kind.into(),
        enabled: r.get::<_, i64>(2)? != 0,
        bot_token_ref: r.get(3)?,
        app_id_ref: r.get(4)?,
        app_secret_ref: r.get(5)?,
        signing_secret_ref: r.get(6)?,
        api_base_url: r.get(7)?,
        default_agent: r.get(8)?,
        agent_config_json: r.get(9)?,
        owner_id: r.get(10)?,
        owner_display: r.get(11)?,
        paired_at: r.get(12)?,
        pairing_pending: pending,
        pairing_expires_at: if pending {
            coffer_runtime::rfc3339_from_unix_ms(pairing.expires_ms)
        } else {
            String::new()
        },
        cursor: r.get(13)?,
        version: r.get(14)?,
        created_at: r.get(15)?,
        updated_at: r.get(16)?,
    };
    Ok(Stored { record, pairing })
}

fn get_tx(c: &Connection, name: &str) -> Result<Option<Stored>, StoreError> {
    let now = now_ms();
    Ok(c.query_row(&format!("SELECT {COLS} FROM channels WHERE name = ?1"), [name], |r| from_row(r, now)).optional()?)
}

/// The row named `name`, or [`StoreError::NotFound`].
fn existing(c: &Connection, name: &str) -> Result<Stored, StoreError> {
    get_tx(c, name)?.ok_or_else(|| not_found(name))
}

/// [`StoreError::Conflict`] unless `expected` is unset or `current`.
fn check_version(name: &str, expected: Option<i64>, current: i64) -> Result<(), StoreError> {
    match expected {
        Some(expected) if expected != current => {
            Err(StoreError::Conflict { what: format!("channel {name:?}"), expected, current })
        }
        _ => Ok(()),
    }
}

fn not_found(name: &str) -> StoreError {
    StoreError::NotFound(format!("channel {:?}", truncate(name, 40)))
}

/// A fresh pairing code: [`rules::PAIRING_CODE_LEN`] characters of Crockford base-32 (5 bits
/// each) from 5 bytes of the operating system's CSPRNG.
fn new_code() -> Result<String, Status> {
    let mut bytes = [0u8; 5];
    getrandom::fill(&mut bytes).map_err(|e| {
        tracing::error!(error = %e, "No randomness for a pairing code.");
        Status::internal("no randomness from the operating system; see logs/store.log")
    })?;
    let bits = bytes.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
    Ok((0..rules::PAIRING_CODE_LEN)
        .rev()
        .map(|i| rules::PAIRING_ALPHABET[((bits >> (5 * i)) & 31) as usize] as char)
        .collect())
}

/// SHA-256 of a code in canonical form ([`rules::normalize_code`]).
fn digest(code: &str) -> [u8; 32] {
    Sha256::digest(rules::normalize_code(code).as_bytes()).into()
}

/// Checks a claim's `owner_id` (1-128 bytes, no control characters) and returns the display
/// name with control characters dropped and cut to [`rules::MAX_OWNER_DISPLAY_CHARS`].
fn claimant(owner_id: &str, display: &str) -> Result<String, StoreError> {
    if owner_id.is_empty() || owner_id.len() > rules::MAX_OWNER_ID_LEN {
        return Err(StoreError::Invalid(format!(
            "owner_id must be 1-{} bytes (the chat that sent the code), not {}",
            rules::MAX_OWNER_ID_LEN,
            owner_id.len()
        )));
    }
    if owner_id.chars().any(char::is_control) {
        return Err(StoreError::Invalid("owner_id must not contain control characters".into()));
    }
    Ok(display.chars().filter(|c| !c.is_control()).take(rules::MAX_OWNER_DISPLAY_CHARS).collect())
}

/// What a claim came to, inside its transaction (a refusal is audited too, so it commits).
enum Claim {
    Paired(ChannelRecord),
    Wrong(ChannelRecord, u32),
    Refused(String),
}

/// The `Channels` gRPC service.
pub struct ChannelsService {
    db: Db,
}

impl ChannelsService {
    /// The service over `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }
}

#[tonic::async_trait]
impl Channels for ChannelsService {
    async fn list_channels(&self, _: Request<ListChannelsRequest>) -> Result<Response<ListChannelsReply>, Status> {
        let head = self.db.head();
        let channels = self
            .db
            .read(|c| {
                let now = now_ms();
                let mut st = c.prepare_cached(&format!("SELECT {COLS} FROM channels ORDER BY name"))?;
                let rows = st.query_map([], |r| from_row(r, now).map(|s| s.record))?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await?;
        Ok(Response::new(ListChannelsReply { channels, seq: head }))
    }

    async fn get_channel(&self, req: Request<GetChannelRequest>) -> Result<Response<ChannelRecord>, Status> {
        let name = req.into_inner().name;
        let s = self.db.read(move |c| existing(c, &name)).await?;
        Ok(Response::new(s.record))
    }

    async fn create_channel(&self, req: Request<CreateChannelRequest>) -> Result<Response<WriteChannelReply>, Status> {
        let trace = trace();
        let r = req.into_inner();
        let c = r.channel.ok_or_else(|| Status::invalid_argument("channel is required"))?;
        let config = validate(&c)?;
        let (channel, seq) = self
            .db
            .write(move |t, ch| {
                if get_tx(t, &c.name)?.is_some() {
                    return Err(StoreError::Exists(format!("channel {:?}", c.name)));
                }
                let now = coffer_runtime::now_rfc3339();
                t.execute(
                    "INSERT INTO channels (name, kind, enabled, bot_token_ref, app_id_ref, app_secret_ref,
                       signing_secret_ref, api_base_url, default_agent, agent_config_json, version, created_at,
                       updated_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 1, ?11, ?11)",
                    params![
                        c.name,
                        c.kind().as_str(),
                        c.enabled as i64,
                        c.bot_token_ref,
                        c.app_id_ref,
                        c.app_secret_ref,
                        c.signing_secret_ref,
                        c.api_base_url,
                        c.default_agent,
                        config,
                        now
                    ],
                )?;
                audit::record(t, &trace, &r.actor, "channel.create", &c.name)?;
                ch.push(ChangeEntity::Channel, c.name.clone(), ChangeOp::Create);
                Ok(existing(t, &c.name)?.record)
            })
            .await?;
        Ok(Response::new(WriteChannelReply { channel: Some(channel), seq }))
    }

    async fn update_channel(&self, req: Request<UpdateChannelRequest>) -> Result<Response<WriteChannelReply>, Status> {
        let trace = trace();
        let r = req.into_inner();
        let c = r.channel.ok_or_else(|| Status::invalid_argument("channel is required"))?;
        let config = validate(&c)?;
        let (channel, seq) = self
            .db
            .write(move |t, ch| {
                let cur = existing(t, &c.name)?.record;
                check_version(&c.name, r.expected_version, cur.version)?;
                if cur.kind != c.kind {
                    return Err(StoreError::Invalid(format!(
                        "kind cannot change: channel {:?} is a {} channel (remove it and add a new one)",
                        c.name,
                        cur.kind().as_str()
                    )));
                }
                t.execute(
                    "UPDATE channels SET enabled = ?2, bot_token_ref = ?3, app_id_ref = ?4, app_secret_ref = ?5,
                       signing_secret_ref = ?6, api_base_url = ?7, default_agent = ?8, agent_config_json = ?9,
                       version = version + 1, updated_at = ?10
                     WHERE name = ?1",
                    params![
                        c.name,
                        c.enabled as i64,
                        c.bot_token_ref,
                        c.app_id_ref,
                        c.app_secret_ref,
                        c.signing_secret_ref,
                        c.api_base_url,
                        c.default_agent,
                        config,
                        coffer_runtime::now_rfc3339()
                    ],
                )?;
                let detail = serde_json::json!({ "enabled": c.enabled }).to_string();
                audit::record_with(t, &trace, &r.actor, "channel.update", &c.name, &detail)?;
                ch.push(ChangeEntity::Channel, c.name.clone(), ChangeOp::Update);
                Ok(existing(t, &c.name)?.record)
            })
            .await?;
        Ok(Response::new(WriteChannelReply { channel: Some(channel), seq }))
    }

    async fn delete_channel(&self, req: Request<DeleteChannelRequest>) -> Result<Response<WriteReply>, Status> {
        let trace = trace();
        let r = req.into_inner();
        let ((), seq) = self
            .db
            .write(move |t, ch| {
                let cur = existing(t, &r.name)?.record;
                check_version(&r.name, r.expected_version, cur.version)?;
                // The foreign key cascades too; said here so the intent does not rest on a pragma.
                t.execute("DELETE FROM channel_events WHERE channel = ?1", [&r.name])?;
                t.execute("DELETE FROM channel_pairing_tries WHERE channel = ?1", [&r.name])?;
                t.execute("DELETE FROM channels WHERE name = ?1", [&r.name])?;
                audit::record(t, &trace, &r.actor, "channel.remove", &r.name)?;
                ch.push(ChangeEntity::Channel, r.name.clone(), ChangeOp::Delete);
                Ok(())
            })
            .await?;
        Ok(Response::new(WriteReply { seq }))
    }

    async fn start_pairing(&self, req: Request<StartPairingRequest>) -> Result<Response<StartPairingReply>, Status> {
        let trace = trace();
        let r = req.into_inner();
        validate_name(&r.name)?;
        let ttl_s = if r.ttl_s == 0 { rules::PAIRING_TTL_DEFAULT_S } else { r.ttl_s };
        if !(rules::PAIRING_TTL_MIN_S..=rules::PAIRING_TTL_MAX_S).contains(&ttl_s) {
            return Err(Status::invalid_argument(format!(
                "ttl_s must be {}-{} seconds, not {ttl_s}",
                rules::PAIRING_TTL_MIN_S,
                rules::PAIRING_TTL_MAX_S
            )));
        }
        let code = new_code()?;
        let sha = digest(&code).to_vec();
        let (expires_ms, seq) = self
            .db
            .write(move |t, ch| {
                existing(t, &r.name)?;
                let expires_ms = now_ms() + i64::from(ttl_s) * 1000;
                t.execute(
                    "UPDATE channels SET pairing_sha256 = ?2, pairing_expires_ms = ?3, pairing_wrong_tries = 0,
                       pairing_used = 0
                     WHERE name = ?1",
                    params![r.name, sha, expires_ms],
                )?;
                t.execute("DELETE FROM channel_pairing_tries WHERE channel = ?1", [&r.name])?;
                let detail = serde_json::json!({ "ttl_s": ttl_s }).to_string();
                audit::record_with(t, &trace, &r.actor, "channel.pair.start", &r.name, &detail)?;
                ch.push(ChangeEntity::Channel, r.name.clone(), ChangeOp::Update);
                Ok(expires_ms)
            })
            .await?;
        Ok(Response::new(StartPairingReply { code, expires_at: coffer_runtime::rfc3339_from_unix_ms(expires_ms), seq }))
    }

    async fn claim_pairing(&self, req: Request<ClaimPairingRequest>) -> Result<Response<ClaimPairingReply>, Status> {
        let trace = trace();
        let r = req.into_inner();
        validate_name(&r.name)?;
        let display = claimant(&r.owner_id, &r.owner_display)?;
        let given = digest(&r.code);
        let (claim, seq) = self
            .db
            .write(move |t, ch| {
                let cur = existing(t, &r.name)?;
                let refuse = |why: &str, reason: &str| -> Result<Claim, StoreError> {
                    let detail = serde_json::json!({ "reason": reason }).to_string();
                    audit::record_outcome(
                        t,
                        &trace,
                        CLAIM_ACTOR,
                        "channel.pair",
                        &r.name,
                        AuditOutcome::Error,
                        &detail,
                    )?;
                    Ok(Claim::Refused(why.to_owned()))
                };
                let name = &r.name;
                let stored = match cur.pairing.state(now_ms()) {
                    CodeState::None => {
                        return refuse(
                            &format!("no pairing code is pending for channel {name:?}: start one with `coffer channel pair {name}`"),
                            "none",
                        );
                    }
                    CodeState::Used => {
                        return refuse(
                            &format!("the pairing code of channel {name:?} was already used: start a new one"),
                            "used",
                        );
                    }
                    CodeState::Expired => {
                        return refuse(
                            &format!("the pairing code of channel {name:?} expired: start a new one"),
                            "expired",
                        );
                    }
                    CodeState::Pending => cur.pairing.digest.clone().unwrap_or_default(),
                };
                let sender_tries: u32 = t
                    .query_row(
                        "SELECT wrong_tries FROM channel_pairing_tries WHERE channel = ?1 AND sender = ?2",
                        params![r.name, r.owner_id],
                        |row| row.get::<_, i64>(0),
                    )
                    .optional()?
                    .unwrap_or(0)
                    .clamp(0, i64::from(u32::MAX)) as u32;
                if sender_tries >= rules::PAIRING_MAX_WRONG_TRIES {
                    return refuse(
                        &format!(
                            "this chat sent {} wrong codes for channel {name:?}: it may not try this code again (the owner can start a new one)",
                            rules::PAIRING_MAX_WRONG_TRIES
                        ),
                        "sender voided",
                    );
                }
                ch.push(ChangeEntity::Channel, r.name.clone(), ChangeOp::Update);
                if bool::from(given.as_slice().ct_eq(stored.as_slice())) {
                    t.execute(
                        "UPDATE channels SET owner_id = ?2, owner_display = ?3, paired_at = ?4, pairing_used = 1
                         WHERE name = ?1",
                        params![r.name, r.owner_id, display, coffer_runtime::now_rfc3339()],
                    )?;
                    t.execute("DELETE FROM channel_pairing_tries WHERE channel = ?1", [&r.name])?;
                    let detail = serde_json::json!({ "owner_id": r.owner_id, "previous_owner_id": cur.record.owner_id })
                        .to_string();
                    audit::record_with(t, &trace, CLAIM_ACTOR, "channel.pair", &r.name, &detail)?;
                    Ok(Claim::Paired(existing(t, &r.name)?.record))
                } else {
                    let total = cur.pairing.wrong_tries.saturating_add(1);
                    t.execute("UPDATE channels SET pairing_wrong_tries = ?2 WHERE name = ?1", params![r.name, total])?;
                    let wrong = sender_tries + 1;
                    t.execute(
                        "INSERT INTO channel_pairing_tries (channel, sender, wrong_tries) VALUES (?1, ?2, ?3)
                         ON CONFLICT (channel, sender) DO UPDATE SET wrong_tries = excluded.wrong_tries",
                        params![r.name, r.owner_id, wrong],
                    )?;
                    let left = rules::PAIRING_MAX_WRONG_TRIES.saturating_sub(wrong);
                    let detail = serde_json::json!({ "reason": "wrong code", "tries_left": left }).to_string();
                    audit::record_outcome(
                        t,
                        &trace,
                        CLAIM_ACTOR,
                        "channel.pair",
                        &r.name,
                        AuditOutcome::Error,
                        &detail,
                    )?;
                    Ok(Claim::Wrong(existing(t, &r.name)?.record, left))
                }
            })
            .await?;
        match claim {
            Claim::Paired(channel) => {
                Ok(Response::new(ClaimPairingReply { paired: true, tries_left: 0, channel: Some(channel), seq }))
            }
            Claim::Wrong(channel, tries_left) => {
                Ok(Response::new(ClaimPairingReply { paired: false, tries_left, channel: Some(channel), seq }))
            }
            Claim::Refused(why) => Err(StoreError::Precondition(why).into()),
        }
    }

    async fn unpair(&self, req: Request<UnpairRequest>) -> Result<Response<WriteChannelReply>, Status> {
        let trace = trace();
        let r = req.into_inner();
        validate_name(&r.name)?;
        let (channel, seq) = self
            .db
            .write(move |t, ch| {
                let cur = existing(t, &r.name)?.record;
                t.execute(
                    "UPDATE channels SET owner_id = '', owner_display = '', paired_at = '', pairing_sha256 = NULL,
                       pairing_expires_ms = 0, pairing_wrong_tries = 0, pairing_used = 0
                     WHERE name = ?1",
                    [&r.name],
                )?;
                t.execute("DELETE FROM channel_pairing_tries WHERE channel = ?1", [&r.name])?;
                let detail = serde_json::json!({ "previous_owner_id": cur.owner_id }).to_string();
                audit::record_with(t, &trace, &r.actor, "channel.unpair", &r.name, &detail)?;
                ch.push(ChangeEntity::Channel, r.name.clone(), ChangeOp::Update);
                Ok(existing(t, &r.name)?.record)
            })
            .await?;
        Ok(Response::new(WriteChannelReply { channel: Some(channel), seq }))
    }

    async fn set_cursor(&self, req: Request<SetCursorRequest>) -> Result<Response<SetCursorReply>, Status> {
        let r = req.into_inner();
        validate_name(&r.name)?;
        if r.cursor < 0 {
            return Err(Status::invalid_argument(format!("cursor must be 0 or more, not {}", r.cursor)));
        }
        let (cursor, _) = self
            .db
            .write(move |t, _| {
                t.query_row(
                    "UPDATE channels SET cursor = MAX(cursor, ?2) WHERE name = ?1 RETURNING cursor",
                    params![r.name, r.cursor],
                    |row| row.get::<_, i64>(0),
                )
                .optional()?
                .ok_or_else(|| not_found(&r.name))
            })
            .await?;
        Ok(Response::new(SetCursorReply { cursor }))
    }

    async fn record_event(&self, req: Request<RecordEventRequest>) -> Result<Response<RecordEventReply>, Status> {
        let r = req.into_inner();
        validate_name(&r.name)?;
        if r.event_id.is_empty() || r.event_id.len() > rules::MAX_EVENT_ID_LEN {
            return Err(Status::invalid_argument(format!(
                "event_id must be 1-{} bytes, not {}",
                rules::MAX_EVENT_ID_LEN,
                r.event_id.len()
            )));
        }
        if r.event_id.chars().any(char::is_control) {
            return Err(Status::invalid_argument("event_id must not contain control characters"));
        }
        let (first, _) = self
            .db
            .write(move |t, _| {
                existing(t, &r.name)?;
                let n = t.execute(
                    "INSERT INTO channel_events (channel, event_id, at) VALUES (?1, ?2, ?3)
                     ON CONFLICT (channel, event_id) DO NOTHING",
                    params![r.name, r.event_id, coffer_runtime::now_rfc3339()],
                )?;
                if n == 1 {
                    // Keep the newest MAX_EVENTS_KEPT: drop what is older than the last of them.
                    t.execute(
                        "DELETE FROM channel_events WHERE channel = ?1 AND rowid < (
                           SELECT rowid FROM channel_events WHERE channel = ?1 ORDER BY rowid DESC LIMIT 1 OFFSET ?2)",
                        params![r.name, rules::MAX_EVENTS_KEPT as i64 - 1],
                    )?;
                }
                Ok(n == 1)
            })
            .await?;
        Ok(Response::new(RecordEventReply { first }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn service() -> (tempfile::TempDir, Arc<ChannelsService>) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("coffer.db")).unwrap();
        (dir, Arc::new(ChannelsService::new(db)))
    }

    fn telegram(name: &str) -> ChannelRecord {
        ChannelRecord {
            name: name.into(),
            kind: ChannelKind::Telegram.into(),
            enabled: true,
            bot_token_ref: format!("channel-{name}-bot-token"),
            ..Default::default()
        }
    }

    fn seatalk(name: &str) -> ChannelRecord {
        ChannelRecord {
            name: name.into(),
            kind: ChannelKind::Seatalk.into(),
            enabled: true,
            app_id_ref: format!("channel-{name}-app-id"),
            app_secret_ref: format!("channel-{name}-app-secret"),
            signing_secret_ref: format!("channel-{name}-signing-secret"),
            ..Default::default()
        }
    }

    fn create(c: ChannelRecord) -> Request<CreateChannelRequest> {
        Request::new(CreateChannelRequest { channel: Some(c), actor: "cli".into() })
    }

    async fn get(svc: &ChannelsService, name: &str) -> ChannelRecord {
        svc.get_channel(Request::new(GetChannelRequest { name: name.into() })).await.unwrap().into_inner()
    }

    async fn start(svc: &ChannelsService, name: &str) -> StartPairingReply {
        let req = StartPairingRequest { name: name.into(), ttl_s: 0, actor: "cli".into() };
        svc.start_pairing(Request::new(req)).await.unwrap().into_inner()
    }

    async fn claim(svc: &ChannelsService, name: &str, code: &str, owner: &str) -> Result<ClaimPairingReply, Status> {
        let req = ClaimPairingRequest {
            name: name.into(),
            code: code.into(),
            owner_id: owner.into(),
            owner_display: format!("@{owner}"),
        };
        svc.claim_pairing(Request::new(req)).await.map(Response::into_inner)
    }

    /// A code of the right shape that is not `code`.
    fn other_code(code: &str) -> String {
        let first = if code.starts_with('A') { 'B' } else { 'A' };
        format!("{first}{}", &code[1..])
    }

    async fn audit_rows(svc: &ChannelsService) -> Vec<(String, String, String, String)> {
        svc.db
            .read(|c| {
                let mut st = c.prepare("SELECT actor, action, outcome, detail FROM audit_log ORDER BY id")?;
                let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await
            .unwrap()
    }

    async fn count(svc: &ChannelsService, sql: &'static str) -> i64 {
        svc.db.read(move |c| Ok(c.query_row(sql, [], |r| r.get(0))?)).await.unwrap()
    }

    fn message(r: Result<String, StoreError>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn kind_words_match_the_rules() {
        let proto: Vec<&str> = ChannelKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(proto, rules::KINDS);
    }

    #[test]
    fn every_validation_error_names_its_field() {
        validate(&telegram("home")).unwrap();
        validate(&seatalk("work")).unwrap();
        let good = ChannelRecord {
            api_base_url: "http://127.0.0.1:8081".into(),
            default_agent: "codex".into(),
            agent_config_json: r#"{ "cwd": "/tmp", "model": "gpt-5" }"#.into(),
            ..telegram("home")
        };
        assert_eq!(validate(&good).unwrap(), r#"{"cwd":"/tmp","model":"gpt-5"}"#, "stored compact");
        let t = || telegram("home");
        let s = || seatalk("work");
        let cases: Vec<(ChannelRecord, &str)> = vec![
            (ChannelRecord { name: "../x".into(), ..t() }, "name \"../x\" is invalid"),
            (ChannelRecord { name: String::new(), ..t() }, "name \"\" is invalid"),
            (ChannelRecord { name: "x".repeat(33), ..t() }, "is invalid: use 1-32 characters"),
            (ChannelRecord { name: "Home".into(), ..t() }, "name \"Home\" is invalid"),
            (ChannelRecord { kind: 0, ..t() }, "kind is required"),
            (ChannelRecord { kind: 9, ..t() }, "kind is required"),
            (ChannelRecord { bot_token_ref: String::new(), ..t() }, "bot_token_ref is required for a telegram"),
            (ChannelRecord { bot_token_ref: "bad name".into(), ..t() }, "bot_token_ref \"bad name\" is not a valid"),
            (ChannelRecord { bot_token_ref: "x".repeat(65), ..t() }, "bot_token_ref"),
            (ChannelRecord { app_id_ref: "a".into(), ..t() }, "app_id_ref is not used by a telegram channel"),
            (ChannelRecord { app_id_ref: String::new(), ..s() }, "app_id_ref is required for a seatalk"),
            (ChannelRecord { app_secret_ref: String::new(), ..s() }, "app_secret_ref is required for a seatalk"),
            (ChannelRecord { signing_secret_ref: String::new(), ..s() }, "signing_secret_ref is required"),
            (ChannelRecord { signing_secret_ref: "../k".into(), ..s() }, "signing_secret_ref \"../k\" is not"),
            (ChannelRecord { bot_token_ref: "t".into(), ..s() }, "bot_token_ref is not used by a seatalk channel"),
            (ChannelRecord { api_base_url: "nope".into(), ..t() }, "api_base_url \"nope\" is not an absolute URL"),
            (ChannelRecord { api_base_url: "ftp://h/".into(), ..t() }, "api_base_url \"ftp://h/\" must start with"),
            (ChannelRecord { api_base_url: "http://h/?q=1".into(), ..t() }, "api_base_url \"http://h/?q=1\" must not"),
            (ChannelRecord { api_base_url: "http://u:p@h/".into(), ..t() }, "api_base_url must not carry a user"),
            (ChannelRecord { api_base_url: format!("http://h/{}", "a".repeat(2048)), ..t() }, "api_base_url is 2057"),
            (ChannelRecord { default_agent: "Claude Code".into(), ..t() }, "default_agent \"Claude Code\" is invalid"),
            (ChannelRecord { agent_config_json: "{".into(), ..t() }, "agent_config_json is not valid JSON"),
            (ChannelRecord { agent_config_json: "[1]".into(), ..t() }, "agent_config_json must be a JSON object"),
            (ChannelRecord { agent_config_json: r#"{"cwd":1}"#.into(), ..t() }, "agent_config_json.cwd must be a str"),
            (
                ChannelRecord { agent_config_json: r#"{"cwd":"rel"}"#.into(), ..t() },
                "agent_config_json.cwd \"rel\" must",
            ),
            (
                ChannelRecord { agent_config_json: r#"{"cwd":"/a\u0007"}"#.into(), ..t() },
                "agent_config_json.cwd must not contain control",
            ),
            (
                ChannelRecord { agent_config_json: format!(r#"{{"model":"{}"}}"#, "m".repeat(300)), ..t() },
                "agent_config_json.model must be 1-256 bytes",
            ),
            (
                ChannelRecord { agent_config_json: r#"{"session_id":"s"}"#.into(), ..t() },
                "agent_config_json.session_id is not allowed",
            ),
            (
                ChannelRecord { agent_config_json: r#"{"env":{"A":"b"}}"#.into(), ..t() },
                "agent_config_json.env is not allowed",
            ),
            (
                ChannelRecord { agent_config_json: format!(r#"{{"cwd":"/{}"}}"#, "a".repeat(9000)), ..t() },
                "agent_config_json is 9011 bytes; at most 8192",
            ),
        ];
        for (c, want) in cases {
            let m = message(validate(&c));
            assert!(m.contains(want), "want {want:?}, got {m:?}");
        }
    }

    #[tokio::test]
    async fn bad_records_write_nothing() {
        let (_dir, svc) = service();
        let e = svc.create_channel(create(ChannelRecord { kind: 0, ..telegram("a") })).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (tonic::Code::InvalidArgument, "kind is required"));
        let e = svc
            .create_channel(Request::new(CreateChannelRequest { channel: None, actor: String::new() }))
            .await
            .unwrap_err();
        assert_eq!((e.code(), e.message()), (tonic::Code::InvalidArgument, "channel is required"));
        assert_eq!(count(&svc, "SELECT COUNT(*) FROM channels").await, 0);
        assert_eq!(svc.db.head(), 0, "no change row for a refused write");
        let e = svc.get_channel(Request::new(GetChannelRequest { name: "a".into() })).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (tonic::Code::NotFound, "channel \"a\" not found"));
    }

    #[tokio::test]
    async fn round_trip_versions_changes_and_audit() {
        let (_dir, svc) = service();
        let mut changes = svc.db.subscribe();
        // Owner, cursor and pairing fields of a new record are ignored: a new channel is unpaired.
        let given = ChannelRecord {
            owner_id: "42".into(),
            cursor: 77,
            pairing_pending: true,
            version: 9,
            agent_config_json: r#"{"model": "m"}"#.into(),
            ..telegram("home")
        };
        let w = svc.create_channel(create(given)).await.unwrap().into_inner();
        let c = w.channel.unwrap();
        assert_eq!((c.version, c.kind(), c.owner_id.as_str(), c.cursor), (1, ChannelKind::Telegram, "", 0));
        assert!(!c.pairing_pending && c.pairing_expires_at.is_empty());
        assert_eq!(c.agent_config_json, r#"{"model":"m"}"#);
        assert!(!c.created_at.is_empty() && c.created_at == c.updated_at);
        assert_eq!(get(&svc, "home").await, c);
        let rec = changes.recv().await.unwrap();
        assert_eq!(
            (rec.entity, rec.key.as_str(), rec.op, rec.seq),
            (ChangeEntity::Channel, "home", ChangeOp::Create, w.seq)
        );

        let e = svc.create_channel(create(telegram("home"))).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (tonic::Code::AlreadyExists, "channel \"home\" already exists"));

        let update = |expected_version, enabled| {
            Request::new(UpdateChannelRequest {
                channel: Some(ChannelRecord { enabled, owner_id: "ignored".into(), ..telegram("home") }),
                expected_version,
                actor: "ui".into(),
            })
        };
        let e = svc.update_channel(update(Some(7), false)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Aborted);
        assert!(e.message().contains("expected 7, current 1"), "{}", e.message());
        let c2 = svc.update_channel(update(Some(1), false)).await.unwrap().into_inner().channel.unwrap();
        assert_eq!((c2.version, c2.enabled, c2.owner_id.as_str()), (2, false, ""));
        assert_eq!(c2.created_at, c.created_at);
        assert_eq!(c2.agent_config_json, "", "update replaces the configuration");
        let c3 = svc.update_channel(update(None, true)).await.unwrap().into_inner().channel.unwrap();
        assert_eq!(c3.version, 3);
        // Kind is immutable.
        let e = svc
            .update_channel(Request::new(UpdateChannelRequest {
                channel: Some(seatalk("home")),
                expected_version: None,
                actor: String::new(),
            }))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().starts_with("kind cannot change"), "{}", e.message());
        let e = svc
            .update_channel(Request::new(UpdateChannelRequest {
                channel: Some(telegram("ghost")),
                expected_version: None,
                actor: String::new(),
            }))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound);
        assert_eq!(get(&svc, "home").await.version, 3, "refused updates change nothing");

        let delete = |expected_version| {
            Request::new(DeleteChannelRequest { name: "home".into(), expected_version, actor: "cli".into() })
        };
        assert_eq!(svc.delete_channel(delete(Some(2))).await.unwrap_err().code(), tonic::Code::Aborted);
        svc.delete_channel(delete(Some(3))).await.unwrap();
        assert_eq!(svc.delete_channel(delete(None)).await.unwrap_err().code(), tonic::Code::NotFound);

        let audit = audit_rows(&svc).await;
        let got: Vec<(&str, &str)> = audit.iter().map(|(a, b, _, _)| (a.as_str(), b.as_str())).collect();
        assert_eq!(
            got,
            [("cli", "channel.create"), ("ui", "channel.update"), ("ui", "channel.update"), ("cli", "channel.remove")]
        );
        let mut ops = Vec::new();
        while let Ok(c) = changes.try_recv() {
            ops.push(c.op);
        }
        assert_eq!(ops, [ChangeOp::Update, ChangeOp::Update, ChangeOp::Delete]);
    }

    #[tokio::test]
    async fn concurrent_creates_of_one_name_one_wins() {
        let (_dir, svc) = service();
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let svc = svc.clone();
                tokio::spawn(async move {
                    let c = ChannelRecord { default_agent: format!("a{i}"), ..telegram("same") };
                    svc.create_channel(create(c)).await.map(|r| r.into_inner().channel.unwrap().default_agent)
                })
            })
            .collect();
        let mut won = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(agent) => won.push(agent),
                Err(e) => assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}"),
            }
        }
        assert_eq!(won.len(), 1);
        assert_eq!(get(&svc, "same").await.default_agent, won[0]);
    }

    #[test]
    fn codes_are_crockford_and_vary() {
        let codes: std::collections::BTreeSet<String> = (0..200).map(|_| new_code().unwrap()).collect();
        assert!(codes.len() > 195, "random codes collide rarely: {}", codes.len());
        for c in &codes {
            assert_eq!(c.len(), 8);
            assert!(c.bytes().all(|b| rules::PAIRING_ALPHABET.contains(&b)), "{c}");
        }
    }

    #[tokio::test]
    async fn pairing_right_code_pairs_once_and_is_audited_without_the_code() {
        let (_dir, svc) = service();
        svc.create_channel(create(telegram("home"))).await.unwrap();
        let mut changes = svc.db.subscribe();
        let s = start(&svc, "home").await;
        assert_eq!(s.code.len(), 8);
        let c = get(&svc, "home").await;
        assert!(c.pairing_pending);
        assert_eq!(c.pairing_expires_at, s.expires_at);
        assert_eq!(c.version, 1, "pairing is not a configuration write");
        // Only the digest is stored.
        let stored: Vec<u8> =
            svc.db.read(|c| Ok(c.query_row("SELECT pairing_sha256 FROM channels", [], |r| r.get(0))?)).await.unwrap();
        assert_eq!(stored, Sha256::digest(s.code.as_bytes()).to_vec());
        // The chat may type it lower-case, with a dash and spaces.
        let typed = format!("  {}-{} ", s.code[..4].to_lowercase(), &s.code[4..]);
        let r = claim(&svc, "home", &typed, "1001").await.unwrap();
        assert!(r.paired);
        let c = r.channel.unwrap();
        assert_eq!((c.owner_id.as_str(), c.owner_display.as_str()), ("1001", "@1001"));
        assert!(!c.paired_at.is_empty() && !c.pairing_pending && c.pairing_expires_at.is_empty());
        // Reused: refused, the owner stays.
        let e = claim(&svc, "home", &s.code, "666").await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.message().contains("already used"), "{}", e.message());
        assert!(!e.message().contains(&s.code));
        assert_eq!(get(&svc, "home").await.owner_id, "1001");

        let audit = audit_rows(&svc).await;
        for row in &audit {
            let text = format!("{row:?}");
            assert!(!text.contains(&s.code), "the code is never audited: {text}");
        }
        let pairs: Vec<(&str, &str, &str)> =
            audit.iter().map(|(a, b, o, _)| (a.as_str(), b.as_str(), o.as_str())).collect();
        assert_eq!(
            pairs,
            [
                ("cli", "channel.create", "ok"),
                ("cli", "channel.pair.start", "ok"),
                ("channel", "channel.pair", "ok"),
                ("channel", "channel.pair", "error"),
            ]
        );
        assert!(audit[3].3.contains("\"used\""), "{}", audit[3].3);
        // Start and the successful claim are on the change stream; the refusal is not.
        let mut n = 0;
        while let Ok(rec) = changes.try_recv() {
            assert_eq!((rec.entity, rec.key.as_str()), (ChangeEntity::Channel, "home"));
            n += 1;
        }
        assert_eq!(n, 2);
    }

    #[tokio::test]
    async fn wrong_tries_count_per_sender_and_a_strangers_never_void_the_owners_code() {
        let (_dir, svc) = service();
        svc.create_channel(create(telegram("home"))).await.unwrap();
        let s = start(&svc, "home").await;
        let wrong = other_code(&s.code);
        for left in (1..5).rev() {
            let r = claim(&svc, "home", &wrong, "666").await.unwrap();
            assert!(!r.paired);
            assert_eq!(r.tries_left, left);
            assert!(r.channel.unwrap().pairing_pending);
        }
        // Garbage of any shape is a wrong try too; the stranger is done, the code is not.
        let r = claim(&svc, "home", &"Z".repeat(5000), "666").await.unwrap();
        assert_eq!((r.paired, r.tries_left), (false, 0));
        assert!(r.channel.unwrap().pairing_pending, "still pending for everyone else");
        // The stranger may not try again, even with the right code.
        let e = claim(&svc, "home", &s.code, "666").await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.message().contains("this chat sent 5 wrong codes"), "{}", e.message());
        // Another stranger has tries of its own; the owner, after a typo, still pairs.
        assert_eq!(claim(&svc, "home", &wrong, "777").await.unwrap().tries_left, 4);
        assert_eq!(claim(&svc, "home", &wrong, "1001").await.unwrap().tries_left, 4);
        let r = claim(&svc, "home", &s.code, "1001").await.unwrap();
        assert!(r.paired);
        assert_eq!(get(&svc, "home").await.owner_id, "1001");
        let errors = audit_rows(&svc).await.into_iter().filter(|r| r.2 == "error").count();
        assert_eq!(errors, 8, "each wrong try and the refusal are audited as errors");
        // Once used, the code is gone for everyone.
        let e = claim(&svc, "home", &s.code, "777").await.unwrap_err();
        assert!(e.message().contains("already used"), "{}", e.message());
        // A new code starts afresh.
        let s2 = start(&svc, "home").await;
        assert!(claim(&svc, "home", &s2.code, "1001").await.unwrap().paired);
    }

    #[tokio::test]
    async fn expired_absent_and_unknown() {
        let (_dir, svc) = service();
        svc.create_channel(create(telegram("home"))).await.unwrap();
        let e = claim(&svc, "home", "7KQ2M9XD", "1").await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.message().starts_with("no pairing code is pending for channel \"home\""), "{}", e.message());
        let e = claim(&svc, "ghost", "7KQ2M9XD", "1").await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound);
        let e = claim(&svc, "../x", "7KQ2M9XD", "1").await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let e = claim(&svc, "home", "7KQ2M9XD", "").await.unwrap_err();
        assert!(e.message().starts_with("owner_id must be 1-128 bytes"), "{}", e.message());
        let e = claim(&svc, "home", "7KQ2M9XD", "a\nb").await.unwrap_err();
        assert!(e.message().starts_with("owner_id must not contain control"), "{}", e.message());

        let s = start(&svc, "home").await;
        // Time passes: move the expiry into the past.
        svc.db
            .write(|t, _| Ok(t.execute("UPDATE channels SET pairing_expires_ms = pairing_expires_ms - 601000", [])?))
            .await
            .unwrap();
        assert!(!get(&svc, "home").await.pairing_pending);
        let e = claim(&svc, "home", &s.code, "1001").await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.message().contains("expired"), "{}", e.message());
        assert_eq!(get(&svc, "home").await.owner_id, "");

        for (ttl_s, ok) in [(59, false), (60, true), (3600, true), (3601, false)] {
            let req = StartPairingRequest { name: "home".into(), ttl_s, actor: String::new() };
            let r = svc.start_pairing(Request::new(req)).await;
            match r {
                Ok(_) => assert!(ok, "{ttl_s}"),
                Err(e) => {
                    assert!(!ok, "{ttl_s}");
                    assert_eq!(e.message(), format!("ttl_s must be 60-3600 seconds, not {ttl_s}"));
                }
            }
        }
        let req = StartPairingRequest { name: "ghost".into(), ttl_s: 0, actor: String::new() };
        assert_eq!(svc.start_pairing(Request::new(req)).await.unwrap_err().code(), tonic::Code::NotFound);
    }

    #[tokio::test]
    async fn a_new_code_replaces_the_pending_one_and_re_pairing_replaces_the_owner() {
        let (_dir, svc) = service();
        svc.create_channel(create(telegram("home"))).await.unwrap();
        let s1 = start(&svc, "home").await;
        assert!(claim(&svc, "home", &s1.code, "1001").await.unwrap().paired);
        let s2 = start(&svc, "home").await;
        let s3 = start(&svc, "home").await;
        assert_eq!(get(&svc, "home").await.owner_id, "1001", "a pending code leaves the owner");
        if s2.code != s3.code {
            let r = claim(&svc, "home", &s2.code, "2002").await.unwrap();
            assert!(!r.paired, "the replaced code is a wrong one");
        }
        let r = claim(&svc, "home", &s3.code, "2002").await.unwrap();
        assert!(r.paired);
        assert_eq!(r.channel.unwrap().owner_id, "2002");
        let last = audit_rows(&svc).await.pop().unwrap();
        assert!(last.3.contains("\"previous_owner_id\":\"1001\""), "{}", last.3);

        let u = svc.unpair(Request::new(UnpairRequest { name: "home".into(), actor: "cli".into() })).await.unwrap();
        let c = u.into_inner().channel.unwrap();
        assert_eq!((c.owner_id.as_str(), c.paired_at.as_str(), c.pairing_pending), ("", "", false));
        let s4 = start(&svc, "home").await;
        svc.unpair(Request::new(UnpairRequest { name: "home".into(), actor: "cli".into() })).await.unwrap();
        let e = claim(&svc, "home", &s4.code, "3003").await.unwrap_err();
        assert!(e.message().starts_with("no pairing code is pending"), "unpair drops the pending code: {e:?}");
    }

    #[tokio::test]
    async fn concurrent_claims_of_one_code_exactly_one_wins() {
        let (_dir, svc) = service();
        svc.create_channel(create(telegram("home"))).await.unwrap();
        let s = start(&svc, "home").await;
        let tasks: Vec<_> = (0..12)
            .map(|i| {
                let svc = svc.clone();
                let code = s.code.clone();
                tokio::spawn(async move { claim(&svc, "home", &code, &format!("chat-{i}")).await })
            })
            .collect();
        let mut winners = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(r) => {
                    assert!(r.paired);
                    winners.push(r.channel.unwrap().owner_id);
                }
                Err(e) => {
                    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
                    assert!(e.message().contains("already used"), "{}", e.message());
                }
            }
        }
        assert_eq!(winners.len(), 1);
        assert_eq!(get(&svc, "home").await.owner_id, winners[0]);
    }

    #[tokio::test]
    async fn the_cursor_never_moves_back_and_writes_no_change_row() {
        let (_dir, svc) = service();
        svc.create_channel(create(telegram("home"))).await.unwrap();
        let head = svc.db.head();
        let set = |cursor| Request::new(SetCursorRequest { name: "home".into(), cursor });
        assert_eq!(svc.set_cursor(set(10)).await.unwrap().into_inner().cursor, 10);
        assert_eq!(svc.set_cursor(set(5)).await.unwrap().into_inner().cursor, 10, "lower is ignored");
        assert_eq!(svc.set_cursor(set(10)).await.unwrap().into_inner().cursor, 10);
        assert_eq!(svc.set_cursor(set(11)).await.unwrap().into_inner().cursor, 11);
        let e = svc.set_cursor(set(-1)).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (tonic::Code::InvalidArgument, "cursor must be 0 or more, not -1"));
        let e = svc.set_cursor(Request::new(SetCursorRequest { name: "ghost".into(), cursor: 1 })).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound);
        let c = get(&svc, "home").await;
        assert_eq!((c.cursor, c.version), (11, 1));
        assert_eq!(svc.db.head(), head, "no change row");
        // A configuration update keeps the cursor.
        let up = UpdateChannelRequest { channel: Some(telegram("home")), expected_version: None, actor: String::new() };
        assert_eq!(svc.update_channel(Request::new(up)).await.unwrap().into_inner().channel.unwrap().cursor, 11);
        assert_eq!(audit_rows(&svc).await.len(), 2, "create and update only");
    }

    #[tokio::test]
    async fn record_event_first_duplicate_and_bounds() {
        let (_dir, svc) = service();
        svc.create_channel(create(seatalk("work"))).await.unwrap();
        svc.create_channel(create(seatalk("other"))).await.unwrap();
        let head = svc.db.head();
        let rec = |name: &str, id: &str| {
            let svc = svc.clone();
            let req = RecordEventRequest { name: name.into(), event_id: id.into() };
            async move { svc.record_event(Request::new(req)).await.map(|r| r.into_inner().first) }
        };
        assert!(rec("work", "e1").await.unwrap());
        assert!(!rec("work", "e1").await.unwrap(), "a redelivery");
        assert!(rec("other", "e1").await.unwrap(), "per channel");
        assert_eq!(svc.db.head(), head, "no change row");
        for (id, want) in [(String::new(), "event_id must be 1-256 bytes, not 0"), ("e".repeat(257), "not 257")] {
            let e = rec("work", &id).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().contains(want), "{}", e.message());
        }
        assert!(rec("work", "a\u{0}b").await.unwrap_err().message().contains("control"));
        assert_eq!(rec("ghost", "e1").await.unwrap_err().code(), tonic::Code::NotFound);

        // Fill "work" to the bound in one transaction (e1 is its oldest), then record more.
        svc.db
            .write(|t, _| {
                let mut st =
                    t.prepare("INSERT INTO channel_events (channel, event_id, at) VALUES ('work', ?1, 'x')")?;
                for i in 2..=rules::MAX_EVENTS_KEPT {
                    st.execute([format!("e{i}")])?;
                }
                Ok(())
            })
            .await
            .unwrap();
        let work = "SELECT COUNT(*) FROM channel_events WHERE channel = 'work'";
        assert_eq!(count(&svc, work).await, 10_000);
        assert!(rec("work", "new-1").await.unwrap());
        assert_eq!(count(&svc, work).await, 10_000, "the oldest made room");
        assert!(rec("work", "e1").await.unwrap(), "e1 was the oldest and is forgotten");
        assert!(!rec("work", "e3").await.unwrap(), "e3 is still among the newest");
        assert!(!rec("work", "new-1").await.unwrap());
        assert_eq!(count(&svc, work).await, 10_000);
        assert!(rec("work", "e2").await.unwrap(), "e2 went when e1 came back");
        assert_eq!(count(&svc, "SELECT COUNT(*) FROM channel_events WHERE channel = 'other'").await, 1);
    }

    #[tokio::test]
    async fn delete_removes_events_and_the_pending_code() {
        let (_dir, svc) = service();
        svc.create_channel(create(seatalk("work"))).await.unwrap();
        let s = start(&svc, "work").await;
        let req = RecordEventRequest { name: "work".into(), event_id: "e1".into() };
        assert!(svc.record_event(Request::new(req.clone())).await.unwrap().into_inner().first);
        svc.set_cursor(Request::new(SetCursorRequest { name: "work".into(), cursor: 9 })).await.unwrap();
        let del = DeleteChannelRequest { name: "work".into(), expected_version: None, actor: String::new() };
        svc.delete_channel(Request::new(del)).await.unwrap();
        assert_eq!(count(&svc, "SELECT COUNT(*) FROM channel_events").await, 0);
        assert_eq!(count(&svc, "SELECT COUNT(*) FROM channels").await, 0);
        // A new channel of that name starts clean.
        svc.create_channel(create(seatalk("work"))).await.unwrap();
        let c = get(&svc, "work").await;
        assert_eq!((c.pairing_pending, c.cursor, c.version), (false, 0, 1));
        let e = claim(&svc, "work", &s.code, "E1").await.unwrap_err();
        assert!(e.message().starts_with("no pairing code is pending"), "{}", e.message());
        assert!(svc.record_event(Request::new(req)).await.unwrap().into_inner().first);
    }
}
