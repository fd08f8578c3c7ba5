//! The settings table: every setting Coffer itself reads, with its type, default, bounds and
//! meaning, in one place. The gateway validates `PATCH /v1/settings` against it, the gateway and
//! the store's retention worker take their defaults from it, the CLI checks and shows it, and the
//! docs (`docs/CLI.md`, `docs/REST.md`) are checked against it.
//!
//! Settings are stored as strings (the store's `settings` table is a flat string map); a value
//! is valid when [`Setting::parse`] accepts it. Keys that are not in the table are not Coffer's:
//! the daemon stores one only when asked explicitly (`"force": true`, `coffer settings set
//! --force`), and nothing reads it.

/// Longest setting key, in bytes (the store enforces it too).
pub const MAX_KEY_BYTES: usize = 128;

const DAY_MS: u64 = 86_400_000;

/// The type of a setting's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    /// A non-negative decimal integer, digits only (no sign, no spaces), within the setting's
    /// bounds.
    Integer,
    /// Text of at most `max` bytes (`min` is the least), without control characters; leading
    /// and trailing whitespace is ignored by readers. The default is [`Setting::default_text`].
    Text,
}

impl Type {
    /// The name shown in docs and errors.
    pub const fn name(self) -> &'static str {
        match self {
            Type::Integer => "integer",
            Type::Text => "text",
        }
    }
}

/// The shape a text setting's value must have, checked by [`Setting::parse_text`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextFormat {
    /// Any text within the bounds.
    Any,
    /// Empty (off), or an absolute `http://` or `https://` URL with a host (WHATWG URL
    /// parsing, as the readers' HTTP client does it).
    HttpUrlOrEmpty,
    /// Empty (the default) or one of [`PERMISSION_MODES`] (a unit variant: the words live in the
    /// constant, so a setting stays small).
    PermissionMode,
    /// One of [`FUSION_METHODS`] (empty: the default).
    FusionMethod,
    /// Origins the console may also be opened at, separated by commas or spaces (see
    /// [`crate::remote::parse_allowed_hosts`]); empty: loopback only.
    AllowedHosts,
    /// Empty (loopback only) or `IP:PORT` (see [`crate::remote::parse_bind`]).
    BindAddress,
}

impl TextFormat {
    /// The words a setting of this format may hold (besides empty), when it is one of a list.
    pub fn words(self) -> Option<&'static [&'static str]> {
        match self {
            TextFormat::PermissionMode => Some(PERMISSION_MODES),
            TextFormat::FusionMethod => Some(FUSION_METHODS),
            _ => None,
        }
    }
}

/// What a person wants to do with a setting: the sections of the console's Settings page, of
/// `coffer settings get` and of docs/CLI.md's settings table, in [`Group::ALL`]'s order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Group {
    /// How the coding agents run and what happens to conversations.
    Chat,
    /// How the gateway starts, lists and calls the MCP servers' tools.
    Gateway,
    /// Knowledge bases, search, embeddings and the ask tool.
    Knowledge,
    /// Telegram and SeaTalk chats.
    Channels,
    /// Sync across machines.
    Sync,
    /// Logs kept, LLM request limits, reaching the console from other devices.
    Advanced,
}

impl Group {
    /// Every group, in display order.
    pub const ALL: [Group; 6] =
        [Group::Chat, Group::Gateway, Group::Knowledge, Group::Channels, Group::Sync, Group::Advanced];

    /// Its word on the wire (`chat`, `gateway`, `knowledge`, `channels`, `sync`, `advanced`).
    pub const fn word(self) -> &'static str {
        match self {
            Group::Chat => "chat",
            Group::Gateway => "gateway",
            Group::Knowledge => "knowledge",
            Group::Channels => "channels",
            Group::Sync => "sync",
            Group::Advanced => "advanced",
        }
    }

    /// Its heading, for people.
    pub const fn title(self) -> &'static str {
        match self {
            Group::Chat => "Chat and agents",
            Group::Gateway => "MCP gateway",
            Group::Knowledge => "Knowledge",
            Group::Channels => "Channels",
            Group::Sync => "Sync",
            Group::Advanced => "Advanced",
        }
    }

    /// One plain sentence under the heading (no markup).
    pub const fn help(self) -> &'static str {
        match self {
            Group::Chat => {
                "How Claude Code and Codex run: which program, which LLM connection, what they may do without asking, and how long conversations are kept."
            }
            Group::Gateway => "How the gateway starts your MCP servers, lists their tools and waits for their calls.",
            Group::Knowledge => {
                "How your knowledge bases are indexed and searched, the embeddings endpoint, and the ask tool that answers from your notes."
            }
            Group::Channels => {
                "Telegram and SeaTalk chats that drive conversations; the bots themselves are set up in the Channels tab."
            }
            Group::Sync => "Keeping this machine in step with your other machines through a git remote you own.",
            Group::Advanced => {
                "How long logs are kept, limits of requests to LLM connections, and reaching the console from your other devices."
            }
        }
    }
}

/// One setting Coffer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The key (`gateway.call_timeout_ms`).
    pub key: &'static str,
    /// The section it is shown in.
    pub group: Group,
    /// A short name for people (`Tool call time limit`): no key, no markup.
    pub label: &'static str,
    /// The type of its value.
    pub ty: Type,
    /// What a text value must look like beyond its length ([`TextFormat::Any`] for integers).
    pub format: TextFormat,
    /// The value that applies while the key is not set ([`Type::Integer`]; `0` for text).
    pub default: u64,
    /// The value that applies while the key is not set ([`Type::Text`]; `""` for integers).
    pub default_text: &'static str,
    /// The smallest accepted value (inclusive); for text, the fewest bytes.
    pub min: u64,
    /// The largest accepted value (inclusive); for text, the most bytes.
    pub max: u64,
    /// The unit, and what `0` means where it is accepted (`days, 0 = keep all`).
    pub unit: &'static str,
    /// What it governs, one line (the docs' "what" column).
    pub description: &'static str,
}

/// Deadline for one upstream's part of a `tools/list` or `prompts/list` fan-out.
pub const LIST_TIMEOUT_MS: Setting = Setting {
    key: "gateway.list_timeout_ms",
    group: Group::Gateway,
    label: "Tool list time limit",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 10_000,
    min: 1,
    max: DAY_MS,
    unit: "milliseconds",
    description: "how long one upstream may take to list its tools or prompts",
};
/// Deadline for an upstream's start and `initialize`.
pub const START_TIMEOUT_MS: Setting = Setting {
    key: "gateway.start_timeout_ms",
    group: Group::Gateway,
    label: "Server start time limit",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 30_000,
    min: 1,
    max: DAY_MS,
    unit: "milliseconds",
    description: "how long an upstream may take to start and initialize",
};
/// Per-call timeout of servers without their own.
pub const CALL_TIMEOUT_MS: Setting = Setting {
    key: "gateway.call_timeout_ms",
    group: Group::Gateway,
    label: "Tool call time limit",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 60_000,
    min: 1,
    max: DAY_MS,
    unit: "milliseconds",
    description: "per-call timeout of servers without their own `--timeout`",
};
/// How long an MCP session may stay idle before it ends.
pub const SESSION_IDLE_TIMEOUT_S: Setting = Setting {
    key: "gateway.session_idle_timeout_s",
    group: Group::Gateway,
    label: "Idle client session ends after",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 1800,
    min: 1,
    max: 30 * 86_400,
    unit: "seconds",
    description: "end an MCP session idle this long",
};
/// How long a client's first list waits for servers the gateway's capability catalog does not
/// know yet before it answers with what is ready (the rest follow as `list_changed`).
pub const FIRST_LIST_TIMEOUT_MS: Setting = Setting {
    key: "gateway.first_list_timeout_ms",
    group: Group::Gateway,
    label: "First tool list waits",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 1_000,
    min: 1,
    max: 86_400_000,
    unit: "milliseconds",
    description: "how long an MCP client's list waits for servers not listed yet before it answers with what is ready (REST and the CLI wait up to `gateway.list_timeout_ms`)",
};
/// How long a tool-broker session (an in-house caller's, e.g. one per conversation) may stay
/// idle before it ends and its upstream children stop.
pub const BROKER_IDLE_TIMEOUT_S: Setting = Setting {
    key: "gateway.broker_idle_timeout_s",
    group: Group::Gateway,
    label: "Idle agent session ends after",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 600,
    min: 1,
    max: 30 * 86_400,
    unit: "seconds",
    description: "end a tool-broker session (chat, REST tool calls) idle this long",
};
/// Longest exposed tool name.
pub const MAX_TOOL_NAME_LEN: Setting = Setting {
    key: "gateway.max_tool_name_len",
    group: Group::Gateway,
    label: "Longest tool name",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 51,
    min: 40,
    max: 64,
    unit: "characters",
    description: "longest exposed tool name (`<server>__<tool>`, shortened deterministically)",
};
/// The MCP Registry `coffer mcp search` and `coffer mcp install` read (its `/v0.1/servers`
/// API); the official one, [`OFFICIAL_MCP_REGISTRY`], by default (and when set empty).
pub const MCP_REGISTRY_URL: Setting = Setting {
    key: "gateway.mcp_registry_url",
    group: Group::Gateway,
    label: "MCP Registry",
    ty: Type::Text,
    format: TextFormat::HttpUrlOrEmpty,
    default: 0,
    default_text: OFFICIAL_MCP_REGISTRY,
    min: 0,
    max: 2048,
    unit: "URL, empty = the official registry",
    description: "base URL of the MCP Registry that `coffer mcp search` and `coffer mcp install` read (its `/v0.1/servers` API); empty: https://registry.modelcontextprotocol.io",
};
/// The official MCP Registry's base URL.
pub const OFFICIAL_MCP_REGISTRY: &str = "https://registry.modelcontextprotocol.io";
/// Age limit of invocation rows.
pub const RETENTION_INVOCATIONS_DAYS: Setting = Setting {
    key: "retention.invocations_days",
    group: Group::Advanced,
    label: "Keep the tool-call log for",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 30,
    min: 0,
    max: 36_500,
    unit: "days, 0 = keep all",
    description: "delete invocation rows older than this (0: keep)",
};
/// Count limit of invocation rows.
pub const RETENTION_INVOCATIONS_MAX_ROWS: Setting = Setting {
    key: "retention.invocations_max_rows",
    group: Group::Advanced,
    label: "Most tool-call log rows",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 100_000,
    min: 0,
    max: 1_000_000_000,
    unit: "rows, 0 = no limit",
    description: "keep at most this many invocation rows (0: no limit)",
};
/// Age limit of audit rows.
pub const RETENTION_AUDIT_DAYS: Setting = Setting {
    key: "retention.audit_days",
    group: Group::Advanced,
    label: "Keep the audit log for",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 365,
    min: 0,
    max: 36_500,
    unit: "days, 0 = keep all",
    description: "delete audit rows older than this (0: keep)",
};
/// Count limit of audit rows.
pub const RETENTION_AUDIT_MAX_ROWS: Setting = Setting {
    key: "retention.audit_max_rows",
    group: Group::Advanced,
    label: "Most audit log rows",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 100_000,
    min: 0,
    max: 1_000_000_000,
    unit: "rows, 0 = no limit",
    description: "keep at most this many audit rows (0: no limit)",
};

/// Base URL of the OpenAI-compatible embeddings endpoint; empty turns the vector engine off.
pub const EMBEDDINGS_URL: Setting = Setting {
    key: "retrieval.embeddings.url",
    group: Group::Knowledge,
    label: "Embeddings endpoint",
    ty: Type::Text,
    format: TextFormat::HttpUrlOrEmpty,
    default: 0,
    default_text: "",
    min: 0,
    max: 2048,
    unit: "URL, empty = vector engine off",
    description: "OpenAI-compatible embeddings base URL (requests go to `<url>/embeddings`, e.g. `http://127.0.0.1:9000/v1`); empty turns the vector engine off",
};
/// Embedding model name sent with each request.
pub const EMBEDDINGS_MODEL: Setting = Setting {
    key: "retrieval.embeddings.model",
    group: Group::Knowledge,
    label: "Embeddings model",
    ty: Type::Text,
    format: TextFormat::Any,
    default: 0,
    default_text: "",
    min: 0,
    max: 256,
    unit: "model name",
    description: "embedding model sent to the endpoint; changing it re-embeds every chunk",
};
/// Name of the credential whose value is the endpoint's bearer token.
pub const EMBEDDINGS_CREDENTIAL: Setting = Setting {
    key: "retrieval.embeddings.credential",
    group: Group::Knowledge,
    label: "Embeddings key",
    ty: Type::Text,
    format: TextFormat::Any,
    default: 0,
    default_text: "",
    min: 0,
    max: 128,
    unit: "credential name, empty = none",
    description: "credential (in the credential store) sent as `Authorization: Bearer` to the embeddings endpoint",
};
/// Vector dimension asked of the endpoint.
pub const EMBEDDINGS_DIMENSIONS: Setting = Setting {
    key: "retrieval.embeddings.dimensions",
    group: Group::Knowledge,
    label: "Embedding size",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 0,
    min: 0,
    max: 8192,
    unit: "dimensions, 0 = from the first answer",
    description: "embedding dimension asked of the endpoint (0: whatever it answers); changing it re-embeds every chunk",
};
/// Chunks per embeddings request.
pub const EMBEDDINGS_BATCH_SIZE: Setting = Setting {
    key: "retrieval.embeddings.batch_size",
    group: Group::Knowledge,
    label: "Chunks per embeddings request",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 32,
    min: 1,
    max: 2048,
    unit: "chunks",
    description: "chunks sent in one embeddings request",
};
/// Embeddings requests in flight at once.
pub const EMBEDDINGS_CONCURRENCY: Setting = Setting {
    key: "retrieval.embeddings.concurrency",
    group: Group::Knowledge,
    label: "Embeddings requests at once",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 2,
    min: 1,
    max: 16,
    unit: "requests",
    description: "embeddings requests in flight at once",
};
/// Deadline of one embeddings request.
pub const EMBEDDINGS_TIMEOUT_MS: Setting = Setting {
    key: "retrieval.embeddings.timeout_ms",
    group: Group::Knowledge,
    label: "Embeddings request time limit",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 10_000,
    min: 1,
    max: 600_000,
    unit: "milliseconds",
    description: "how long one embeddings request may take",
};
/// The built-in embedding engine's model (used while `retrieval.embeddings.url` is empty).
pub const EMBEDDINGS_BUILTIN_MODEL: Setting = Setting {
    key: "retrieval.embeddings.builtin_model",
    group: Group::Knowledge,
    label: "Built-in embedding model",
    ty: Type::Text,
    format: TextFormat::Any,
    default: 0,
    default_text: "all-MiniLM-L6-v2",
    min: 0,
    max: 256,
    unit: "model name, empty = built-in engine off",
    description: "model of the built-in embedding engine, used while the embeddings endpoint is empty: `all-MiniLM-L6-v2` (English) or `paraphrase-multilingual-MiniLM-L12-v2` (50+ languages); changing it re-embeds every chunk",
};
/// Where the built-in engine's model files are.
pub const EMBEDDINGS_MODEL_DIR: Setting = Setting {
    key: "retrieval.embeddings.model_dir",
    group: Group::Knowledge,
    label: "Built-in model folder",
    ty: Type::Text,
    format: TextFormat::Any,
    default: 0,
    default_text: "",
    min: 0,
    max: 4096,
    unit: "absolute path, empty = COFFER_HOME/models/<model>",
    description: "folder holding the built-in model's config.json, tokenizer.json and model.safetensors (for offline machines); empty: COFFER_HOME/models/<model>, downloaded on first use",
};
/// The files the built-in embedding engine reads from a model folder
/// ([`EMBEDDINGS_MODEL_DIR`]); the same as `coffer_embed::engine::REQUIRED_FILES`.
pub const EMBEDDINGS_MODEL_FILES: [&str; 3] = ["config.json", "tokenizer.json", "model.safetensors"];

/// Checks a [`EMBEDDINGS_MODEL_DIR`] value against this machine's files: empty (the default
/// folder), or an absolute path to a folder holding every one of [`EMBEDDINGS_MODEL_FILES`].
///
/// # Errors
/// Why not: a relative path, no such folder, or the first model file missing from it (named).
pub fn check_model_dir(value: &str) -> Result<(), String> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(());
    }
    let dir = std::path::Path::new(value);
    if !dir.is_absolute() {
        return Err(format!("{value} is not an absolute path"));
    }
    if !dir.is_dir() {
        return Err(format!("{value} is not a folder on this machine"));
    }
    match EMBEDDINGS_MODEL_FILES.iter().find(|f| !dir.join(f).is_file()) {
        Some(f) => {
            Err(format!("{value} has no {f}: the folder must hold the model's {}", EMBEDDINGS_MODEL_FILES.join(", ")))
        }
        None => Ok(()),
    }
}

/// Where the built-in engine downloads a missing model from.
pub const EMBEDDINGS_HUB_URL: Setting = Setting {
    key: "retrieval.embeddings.hub_url",
    group: Group::Knowledge,
    label: "Model hub",
    ty: Type::Text,
    format: TextFormat::HttpUrlOrEmpty,
    default: 0,
    default_text: "https://huggingface.co",
    min: 0,
    max: 2048,
    unit: "URL, empty = never download",
    description: "hub in Hugging Face's file layout the built-in model is downloaded from on first use (with progress, checksum and resume); empty: never download",
};
/// Per-engine deadline of a search.
pub const ENGINE_TIMEOUT_MS: Setting = Setting {
    key: "retrieval.engine_timeout_ms",
    group: Group::Knowledge,
    label: "Search engine time limit",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 2_000,
    min: 1,
    max: 60_000,
    unit: "milliseconds",
    description: "how long each search engine (grep, keyword, vector) may take before the search answers without it",
};
/// How often an idle knowledge base is rescanned.
pub const RESCAN_INTERVAL_S: Setting = Setting {
    key: "retrieval.rescan_interval_s",
    group: Group::Knowledge,
    label: "Rescan knowledge bases every",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 300,
    min: 0,
    max: 86_400,
    unit: "seconds, 0 = never",
    description: "how often each knowledge base folder is compared with its index besides the folder watcher (a safety net for folders it cannot watch and changes it misses); unchanged files cost a stat each",
};
/// How the search engines' lists are fused.
pub const FUSION_METHOD: Setting = Setting {
    key: "retrieval.fusion.method",
    group: Group::Knowledge,
    label: "Fusion method",
    ty: Type::Text,
    format: TextFormat::FusionMethod,
    default: 0,
    default_text: "scores",
    min: 0,
    max: 16,
    unit: "scores or rrf",
    description: "how a search merges its engines' results: scores (each document's weighted sum of the keyword score divided by the search's best keyword score, the vector cosine similarity and the grep score divided by its best) or rrf (weighted reciprocal rank fusion with retrieval.fusion.k)",
};
/// The words of [`FUSION_METHOD`].
pub const FUSION_METHODS: &[&str] = &["scores", "rrf"];
/// The reciprocal rank fusion constant k.
pub const FUSION_K: Setting = Setting {
    key: "retrieval.fusion.k",
    group: Group::Knowledge,
    label: "Fusion's rank constant k",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 60,
    min: 1,
    max: 1000,
    unit: "ranks",
    description: "reciprocal rank fusion's k (method rrf): a document ranked r by an engine scores weight / (k + r); a smaller k lets one engine's first results count for more against documents every engine ranks lower (60 is plain RRF)",
};
/// The keyword engine's weight in fusion.
pub const FUSION_KEYWORD_WEIGHT: Setting = Setting {
    key: "retrieval.fusion.keyword_weight",
    group: Group::Knowledge,
    label: "Keyword engine's weight in fusion",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 3,
    min: 1,
    max: 100,
    unit: "relative weight (only the ratio between engines matters)",
    description: "the keyword engine's share of a result's fused score (either fusion method)",
};
/// The vector engine's weight in fusion.
pub const FUSION_VECTOR_WEIGHT: Setting = Setting {
    key: "retrieval.fusion.vector_weight",
    group: Group::Knowledge,
    label: "Vector engine's weight in fusion",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 2,
    min: 1,
    max: 100,
    unit: "relative weight (only the ratio between engines matters)",
    description: "the vector engine's share of a result's fused score (either fusion method)",
};
/// The grep engine's weight in fusion.
pub const FUSION_GREP_WEIGHT: Setting = Setting {
    key: "retrieval.fusion.grep_weight",
    group: Group::Knowledge,
    label: "Grep engine's weight in fusion",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 1,
    min: 1,
    max: 100,
    unit: "relative weight (only the ratio between engines matters)",
    description: "the grep engine's share of a result's fused score (either fusion method)",
};
/// Largest file a knowledge base indexes.
pub const MAX_FILE_BYTES: Setting = Setting {
    key: "retrieval.max_file_bytes",
    group: Group::Knowledge,
    label: "Largest file indexed",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 16 * 1024 * 1024,
    min: 1024,
    max: 1024 * 1024 * 1024,
    unit: "bytes",
    description: "larger files in a knowledge base are skipped and reported",
};

/// Auto-archive age of conversations.
pub const RETENTION_CONVERSATIONS_ARCHIVE_DAYS: Setting = Setting {
    key: "retention.conversations_archive_days",
    group: Group::Chat,
    label: "Archive idle conversations after",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 7,
    min: 0,
    max: 36_500,
    unit: "days, 0 = keep forever",
    description: "archive a conversation with no message for this many days (0: never)",
};
/// Deletion age of archived conversations.
pub const RETENTION_CONVERSATIONS_DELETE_DAYS: Setting = Setting {
    key: "retention.conversations_delete_days",
    group: Group::Chat,
    label: "Delete archived conversations after",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 30,
    min: 0,
    max: 36_500,
    unit: "days, 0 = keep forever",
    description: "delete an archived conversation this many days after it was archived (0: never)",
};
/// Claude Code's CLI, when it is not `claude` on the daemon's PATH.
pub const CHAT_CLAUDE_CODE_PATH: Setting = Setting {
    key: "chat.claude_code_path",
    group: Group::Chat,
    label: "Claude Code program",
    ty: Type::Text,
    format: TextFormat::Any,
    default: 0,
    default_text: "",
    min: 0,
    max: 4096,
    unit: "absolute path, empty = `claude` on PATH",
    description: "the Claude Code CLI the chat service runs",
};
/// Whether Claude Code runs in the vault sandbox (Landlock: it cannot read `COFFER_HOME` beyond
/// its working directory and the files Coffer's MCP config needs).
pub const CHAT_CLAUDE_CODE_SANDBOX: Setting = Setting {
    key: "chat.claude_code_sandbox",
    group: Group::Chat,
    label: "Run Claude Code in the sandbox",
    ty: Type::Integer,
    format: TextFormat::Any,
    default: 1,
    default_text: "",
    min: 0,
    max: 1,
    unit: "1 = sandboxed, 0 = off",
    description: "whether Claude Code runs in the vault sandbox",
};
/// Whether each chat turn records what it changed in the conversation's folder (the
/// `files_changed` event, the message's changed files and their diffs).
pub const CHAT_FILES_CHANGED: Setting = Setting {
    key: "chat.files_changed",
    group: Group::Chat,
    label: "Record the files each turn changed",
    ty: Type::Integer,
    format: TextFormat::Any,
    default: 1,
    default_text: "",
    min: 0,
    max: 1,
    unit: "1 = on, 0 = off",
    description: "whether each chat turn records the files it changed (and their diffs)",
};
/// Whether Codex runs in the vault sandbox (as [`CHAT_CLAUDE_CODE_SANDBOX`]).
pub const CHAT_CODEX_SANDBOX: Setting = Setting {
    key: "chat.codex_sandbox",
    group: Group::Chat,
    label: "Run Codex in the sandbox",
    ty: Type::Integer,
    format: TextFormat::Any,
    default: 1,
    default_text: "",
    min: 0,
    max: 1,
    unit: "1 = sandboxed, 0 = off",
    description: "whether Codex runs in the vault sandbox",
};
/// Codex's CLI, when it is not `codex` on the daemon's PATH.
pub const CHAT_CODEX_PATH: Setting = Setting {
    key: "chat.codex_path",
    group: Group::Chat,
    label: "Codex program",
    ty: Type::Text,
    format: TextFormat::Any,
    default: 0,
    default_text: "",
    min: 0,
    max: 4096,
    unit: "absolute path, empty = `codex` on PATH",
    description: "the Codex CLI the chat service runs",
};
/// Where the project picker looks for git repositories (issue 34 §5): the console's
/// new-conversation dialog and a channel's `/projects` offer the repositories found up to four
/// levels below it, besides recently used folders.
pub const CHAT_PROJECTS_ROOT: Setting = Setting {
    key: "chat.projects_root",
    group: Group::Chat,
    label: "Projects folder",
    ty: Type::Text,
    format: TextFormat::Any,
    default: 0,
    default_text: "",
    min: 0,
    max: 4096,
    unit: "absolute path, empty = the user's home",
    description: "the folder the project picker searches for git repositories (4 levels deep)",
};
/// How long a turn may go without output.
pub const CHAT_TURN_TIMEOUT_S: Setting = Setting {
    key: "chat.turn_timeout_s",
    group: Group::Chat,
    label: "Silent turn ends after",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 600,
    min: 1,
    max: 86_400,
    unit: "seconds",
    description: "a turn with no output from the agent for this long ends with a timeout error",
};

/// How long an agent's approval request waits for the owner.
pub const CHAT_APPROVAL_TIMEOUT_S: Setting = Setting {
    key: "chat.approval_timeout_s",
    group: Group::Chat,
    label: "Unanswered approval is denied after",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 600,
    min: 1,
    max: 86_400,
    unit: "seconds",
    description: "an approval request (permission mode ask) not answered for this long is denied, and the agent told so",
};
/// The permission mode of new Claude Code conversations.
pub const CHAT_CLAUDE_CODE_PERMISSION_MODE: Setting = Setting {
    key: "chat.claude_code_permission_mode",
    group: Group::Chat,
    label: "Claude Code's default permission mode",
    ty: Type::Text,
    format: TextFormat::PermissionMode,
    default: 0,
    default_text: "bypass",
    min: 0,
    max: 16,
    unit: "bypass, ask or read_only",
    description: "the permission mode a new Claude Code conversation gets when it names none",
};
/// The permission mode of new Codex conversations.
pub const CHAT_CODEX_PERMISSION_MODE: Setting = Setting {
    key: "chat.codex_permission_mode",
    group: Group::Chat,
    label: "Codex's default permission mode",
    ty: Type::Text,
    format: TextFormat::PermissionMode,
    default: 0,
    default_text: "bypass",
    min: 0,
    max: 16,
    unit: "bypass, ask or read_only",
    description: "the permission mode a new Codex conversation gets when it names none",
};
/// The words of a permission mode setting.
pub const PERMISSION_MODES: &[&str] = &["bypass", "ask", "read_only"];
/// How long a turn must have run for the channel driving its conversation to send a new "Done
/// in …" message when it ends (Telegram does not notify edits); 0: after every turn.
pub const CHAT_NOTIFY_AFTER_S: Setting = Setting {
    key: "chat.notify_after_s",
    group: Group::Channels,
    label: "Announce turns that ran longer than",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 30,
    min: 0,
    max: 86_400,
    unit: "seconds",
    description: "a turn that ran at least this long is announced in its IM channel with a new message when it ends (0: every turn)",
};

/// The LLM connection Claude Code turns run on.
pub const CHAT_CLAUDE_CODE_CONNECTION: Setting = Setting {
    key: "chat.claude_code_connection",
    group: Group::Chat,
    label: "Claude Code runs on",
    ty: Type::Text,
    format: TextFormat::Any,
    default: 0,
    default_text: "",
    min: 0,
    max: 32,
    unit: "an LLM connection's name, empty = Claude Code's own login",
    description: "the LLM connection Claude Code turns use (its base URL, key, model and fast model)",
};
/// The LLM connection Codex turns run on.
pub const CHAT_CODEX_CONNECTION: Setting = Setting {
    key: "chat.codex_connection",
    group: Group::Chat,
    label: "Codex runs on",
    ty: Type::Text,
    format: TextFormat::Any,
    default: 0,
    default_text: "",
    min: 0,
    max: 32,
    unit: "an LLM connection's name, empty = Codex's own login",
    description: "the LLM connection Codex turns use (a Coffer-written model provider)",
};
/// Largest file attached to a chat message (a Telegram photo or document, the console's pasted
/// image, `coffer chat send --attach`); a larger one is refused naming this limit. Whatever the
/// setting, a message's attachments hold at most 40 MiB in all.
pub const CHAT_ATTACHMENT_MAX_BYTES: Setting = Setting {
    key: "chat.attachment_max_bytes",
    group: Group::Chat,
    label: "Largest attachment",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 10 * 1024 * 1024,
    min: 1024,
    max: 20 * 1024 * 1024,
    unit: "bytes",
    description: "the largest file one chat message may attach (photos, documents, pasted images)",
};
/// Most files attached to one chat message.
pub const CHAT_ATTACHMENT_MAX_FILES: Setting = Setting {
    key: "chat.attachment_max_files",
    group: Group::Chat,
    label: "Attachments per message",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 4,
    min: 1,
    max: 10,
    unit: "files",
    description: "the most files one chat message may attach",
};
/// How long a model request may take to answer.
pub const LLM_REQUEST_TIMEOUT_S: Setting = Setting {
    key: "llm.request_timeout_s",
    group: Group::Advanced,
    label: "LLM request time limit",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 60,
    min: 1,
    max: 3_600,
    unit: "seconds",
    description: "a request to an LLM connection with no response for this long fails with a timeout",
};
/// How long a model's stream may stay silent.
pub const LLM_STALL_TIMEOUT_S: Setting = Setting {
    key: "llm.stall_timeout_s",
    group: Group::Advanced,
    label: "Stalled LLM answer fails after",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 30,
    min: 1,
    max: 3_600,
    unit: "seconds",
    description: "a streamed answer with no event for this long counts as stalled and fails",
};
/// The internal agent's model requests per run.
pub const LLM_ASK_MAX_ITERATIONS: Setting = Setting {
    key: "llm.ask_max_iterations",
    group: Group::Knowledge,
    label: "Ask: most model requests per question",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 8,
    min: 1,
    max: 100,
    unit: "model requests",
    description: "a `coffer__ask` run ends cleanly (stop reason `max_iterations`) after this many model requests",
};
/// The internal agent's context budget.
pub const LLM_ASK_CONTEXT_TOKENS: Setting = Setting {
    key: "llm.ask_context_tokens",
    group: Group::Knowledge,
    label: "Ask: most context sent to the model",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 32_000,
    min: 2_000,
    max: 2_000_000,
    unit: "tokens (about 4 characters each)",
    description: "what a `coffer__ask` run sends the model at most: older turns are dropped and big tool results cut, with a marker",
};

/// How long a one-time login link printed by `coffer ui` stays valid.
pub const UI_LOGIN_CODE_TTL_S: Setting = Setting {
    key: "ui.login_code_ttl_s",
    group: Group::Advanced,
    label: "Login link stays valid for",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 60,
    min: 5,
    max: 600,
    unit: "seconds",
    description: "how long a one-time login link from `coffer ui` stays valid (it works once)",
};

/// Extra origins the console may be opened at (opt-in; empty: loopback only).
pub const UI_ALLOWED_HOSTS: Setting = Setting {
    key: "ui.allowed_hosts",
    group: Group::Advanced,
    label: "Other addresses of the console",
    ty: Type::Text,
    format: TextFormat::AllowedHosts,
    default: 0,
    default_text: "",
    min: 0,
    max: 1024,
    unit: "origins such as https://box.tail1234.ts.net, comma-separated; empty = loopback only",
    description: "extra origins the edge answers at for `/ui` and the API the console uses (a tailnet name behind `tailscale serve`, a reverse proxy, a tunnel); `Host` and `Origin` must match one exactly; see docs/REMOTE.md",
};
/// An address beyond loopback the edge also listens on (opt-in; empty: loopback only).
pub const UI_BIND: Setting = Setting {
    key: "ui.bind",
    group: Group::Advanced,
    label: "Extra listening address",
    ty: Type::Text,
    format: TextFormat::BindAddress,
    default: 0,
    default_text: "",
    min: 0,
    max: 64,
    unit: "ADDRESS:PORT, such as 100.101.102.103:8443; empty = loopback only",
    description: "a second listener for the console beyond loopback (a tailnet or VPN address); only hosts of `ui.allowed_hosts` are answered there; read when the daemon starts (`coffer daemon restart`)",
};
/// Whether `/mcp` and the owner's token also work for requests that came from beyond loopback.
pub const UI_REMOTE_API: Setting = Setting {
    key: "ui.remote_api",
    group: Group::Advanced,
    label: "API and MCP beyond this machine",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 0,
    min: 0,
    max: 1,
    unit: "0 = loopback only, 1 = also remote",
    description: "`/mcp` and the token-authenticated REST API also answer requests for the hosts of `ui.allowed_hosts`, on `ui.bind` and through a proxy (`Forwarded`/`X-Forwarded-*`); off, only the console's session works there",
};

/// Whether the sync worker runs (opt-in): push after local changes, pull on an interval.
pub const SYNC_AUTO: Setting = Setting {
    key: "sync.auto",
    group: Group::Sync,
    label: "Sync automatically",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 0,
    min: 0,
    max: 1,
    unit: "0 = off (sync only by hand), 1 = on",
    description: "the sync worker: after a local change it waits `sync.debounce_s` then syncs, and pulls every `sync.pull_interval_s` (needs `coffer sync init`)",
};
/// How long the sync worker waits after a local change before it syncs.
pub const SYNC_DEBOUNCE_S: Setting = Setting {
    key: "sync.debounce_s",
    group: Group::Sync,
    label: "Wait after a change",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 30,
    min: 1,
    max: 86_400,
    unit: "seconds",
    description: "the sync worker syncs this long after the last local change (a burst of edits is one sync)",
};
/// How often the sync worker pulls.
pub const SYNC_PULL_INTERVAL_S: Setting = Setting {
    key: "sync.pull_interval_s",
    group: Group::Sync,
    label: "Pull other machines' changes every",
    ty: Type::Integer,
    format: TextFormat::Any,
    default_text: "",
    default: 300,
    min: 5,
    max: 604_800,
    unit: "seconds",
    description: "the sync worker syncs at least this often to pull other machines' changes (backs off while the remote is unreachable)",
};
/// This machine's name in sync commits and conflict files.
pub const SYNC_MACHINE_NAME: Setting = Setting {
    key: "sync.machine_name",
    group: Group::Sync,
    label: "This machine's name",
    ty: Type::Text,
    format: TextFormat::Any,
    default: 0,
    default_text: "",
    min: 0,
    max: 32,
    unit: "a name, empty = the host name",
    description: "names this machine in sync commits and in the sibling file a conflict keeps (`note.conflict-<machine>-<date>.md`)",
};

/// Every setting Coffer reads, in display order.
pub const SETTINGS: &[Setting] = &[
    CHAT_CLAUDE_CODE_CONNECTION,
    CHAT_CODEX_CONNECTION,
    CHAT_CLAUDE_CODE_PERMISSION_MODE,
    CHAT_CODEX_PERMISSION_MODE,
    CHAT_CLAUDE_CODE_PATH,
    CHAT_CODEX_PATH,
    CHAT_CLAUDE_CODE_SANDBOX,
    CHAT_CODEX_SANDBOX,
    CHAT_PROJECTS_ROOT,
    CHAT_FILES_CHANGED,
    CHAT_TURN_TIMEOUT_S,
    CHAT_APPROVAL_TIMEOUT_S,
    CHAT_ATTACHMENT_MAX_BYTES,
    CHAT_ATTACHMENT_MAX_FILES,
    RETENTION_CONVERSATIONS_ARCHIVE_DAYS,
    RETENTION_CONVERSATIONS_DELETE_DAYS,
    LIST_TIMEOUT_MS,
    FIRST_LIST_TIMEOUT_MS,
    START_TIMEOUT_MS,
    CALL_TIMEOUT_MS,
    SESSION_IDLE_TIMEOUT_S,
    BROKER_IDLE_TIMEOUT_S,
    MAX_TOOL_NAME_LEN,
    MCP_REGISTRY_URL,
    EMBEDDINGS_URL,
    EMBEDDINGS_MODEL,
    EMBEDDINGS_CREDENTIAL,
    EMBEDDINGS_DIMENSIONS,
    EMBEDDINGS_BATCH_SIZE,
    EMBEDDINGS_CONCURRENCY,
    EMBEDDINGS_TIMEOUT_MS,
    EMBEDDINGS_BUILTIN_MODEL,
    EMBEDDINGS_MODEL_DIR,
    EMBEDDINGS_HUB_URL,
    ENGINE_TIMEOUT_MS,
    RESCAN_INTERVAL_S,
    FUSION_METHOD,
    FUSION_K,
    FUSION_KEYWORD_WEIGHT,
    FUSION_VECTOR_WEIGHT,
    FUSION_GREP_WEIGHT,
    MAX_FILE_BYTES,
    LLM_ASK_MAX_ITERATIONS,
    LLM_ASK_CONTEXT_TOKENS,
    CHAT_NOTIFY_AFTER_S,
    SYNC_AUTO,
    SYNC_DEBOUNCE_S,
    SYNC_PULL_INTERVAL_S,
    SYNC_MACHINE_NAME,
    RETENTION_INVOCATIONS_DAYS,
    RETENTION_INVOCATIONS_MAX_ROWS,
    RETENTION_AUDIT_DAYS,
    RETENTION_AUDIT_MAX_ROWS,
    LLM_REQUEST_TIMEOUT_S,
    LLM_STALL_TIMEOUT_S,
    UI_LOGIN_CODE_TTL_S,
    UI_ALLOWED_HOSTS,
    UI_BIND,
    UI_REMOTE_API,
];

/// The setting `key`, if Coffer reads it.
pub fn find(key: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.key == key)
}

/// Every key of [`SETTINGS`], in display order.
pub fn keys() -> impl Iterator<Item = &'static str> {
    SETTINGS.iter().map(|s| s.key)
}

/// Checks that `value` is valid for the setting `key`.
///
/// # Errors
/// [`SettingError::UnknownKey`] when Coffer reads no such key; otherwise what
/// [`Setting::parse`] returns.
pub fn check(key: &str, value: &str) -> Result<(), SettingError> {
    find(key).ok_or_else(|| SettingError::UnknownKey { key: key.to_owned() })?.validate(value)
}

impl Setting {
    /// Checks a value as it would be stored, by type: [`Setting::parse`] for an integer,
    /// [`Setting::parse_text`] for text.
    ///
    /// # Errors
    /// What those return.
    pub fn validate(&self, value: &str) -> Result<(), SettingError> {
        match self.ty {
            Type::Integer => self.parse(value).map(drop),
            Type::Text => self.parse_text(value).map(drop),
        }
    }

    /// Checks a text value: `min..=max` bytes, no control characters (tab excepted), and the
    /// setting's [`TextFormat`].
    ///
    /// # Errors
    /// [`SettingError::BadText`] for a value too short, too long or with control characters;
    /// [`SettingError::BadUrl`] for a URL setting whose value is not an `http(s)://` URL;
    /// [`SettingError::NotText`] for an integer setting (check those with [`Setting::parse`]).
    pub fn parse_text<'v>(&self, value: &'v str) -> Result<&'v str, SettingError> {
        if self.ty != Type::Text {
            return Err(SettingError::NotText { setting: Box::new(*self) });
        }
        let len = value.len() as u64;
        if len < self.min || len > self.max || value.chars().any(|c| c.is_control() && c != '\t') {
            return Err(SettingError::BadText { setting: Box::new(*self), value: value.chars().take(64).collect() });
        }
        if self.format == TextFormat::HttpUrlOrEmpty && !is_http_url_or_empty(value) {
            return Err(SettingError::BadUrl { setting: Box::new(*self), value: value.chars().take(64).collect() });
        }
        let why = match self.format {
            TextFormat::AllowedHosts => crate::remote::parse_allowed_hosts(value).err(),
            TextFormat::BindAddress => crate::remote::parse_bind(value).err(),
            _ => None,
        };
        if let Some(why) = why {
            return Err(SettingError::BadValue { setting: Box::new(*self), why });
        }
        if let Some(words) = self.format.words()
            && !value.trim().is_empty()
            && !words.contains(&value.trim())
        {
            return Err(SettingError::NotOneOf { setting: Box::new(*self), value: value.chars().take(64).collect() });
        }
        Ok(value)
    }

    /// The text in force for a stored value (`None`: not set): trimmed, or
    /// [`Setting::default_text`] when absent or unusable.
    pub fn text_or_default(&self, stored: Option<&str>) -> String {
        match stored.map(str::trim) {
            Some(v) if self.parse_text(v).is_ok() => v.to_owned(),
            _ => self.default_text.to_owned(),
        }
    }

    /// The default as it is stored and shown: the integer's digits, or the text.
    pub fn default_value(&self) -> String {
        match self.ty {
            Type::Integer => self.default.to_string(),
            Type::Text => self.default_text.to_owned(),
        }
    }

    /// Parses a value as it would be stored: digits only, within `min..=max`.
    ///
    /// # Errors
    /// [`SettingError::NotAnInteger`] (empty, a sign, spaces, a fraction, too many digits for
    /// `u64`), [`SettingError::OutOfRange`].
    pub fn parse(&self, value: &str) -> Result<u64, SettingError> {
        let n = (!value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()))
            .then(|| value.parse::<u64>().ok())
            .flatten()
            .ok_or_else(|| SettingError::NotAnInteger { setting: Box::new(*self), value: value.to_owned() })?;
        if !(self.min..=self.max).contains(&n) {
            return Err(SettingError::OutOfRange { setting: Box::new(*self), value: n });
        }
        Ok(n)
    }

    /// The value in force for a stored value (`None`: not set), as the settings' readers take
    /// it: surrounding whitespace is ignored (a hand-edited value), then [`Setting::parse`]
    /// decides.
    ///
    /// # Errors
    /// What [`Setting::parse`] returns; the caller applies [`Setting::default`] then (and says
    /// so where it can).
    pub fn read(&self, stored: Option<&str>) -> Result<u64, SettingError> {
        match stored {
            None => Ok(self.default),
            Some(v) => self.parse(v.trim()),
        }
    }

    /// [`Setting::read`], falling back to [`Setting::default`] for an unusable value.
    pub fn value_or_default(&self, stored: Option<&str>) -> u64 {
        self.read(stored).unwrap_or(self.default)
    }

    /// The accepted range as the docs show it (`1-86400000`; text: `text, 0-2048 bytes`).
    pub fn bounds(&self) -> String {
        match self.ty {
            Type::Integer => format!("{}-{}", self.min, self.max),
            Type::Text => format!("text, {}-{} bytes", self.min, self.max),
        }
    }
}

/// Why a setting's key or value was refused (the setting boxed: it is a large record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingError {
    /// Coffer reads no setting of that key.
    UnknownKey {
        /// The key as given.
        key: String,
    },
    /// The value is not a non-negative decimal integer.
    NotAnInteger {
        /// The setting.
        setting: Box<Setting>,
        /// The value as given.
        value: String,
    },
    /// The value is an integer outside the setting's bounds.
    OutOfRange {
        /// The setting.
        setting: Box<Setting>,
        /// The value.
        value: u64,
    },
    /// A text setting's value is too short, too long or holds control characters.
    BadText {
        /// The setting.
        setting: Box<Setting>,
        /// The value as given (at most its first 64 characters).
        value: String,
    },
    /// A URL setting's value is neither empty nor an `http://` or `https://` URL with a host.
    BadUrl {
        /// The setting.
        setting: Box<Setting>,
        /// The value as given (at most its first 64 characters).
        value: String,
    },
    /// A word setting's value is none of its words.
    NotOneOf {
        /// The setting.
        setting: Box<Setting>,
        /// The value as given (at most its first 64 characters).
        value: String,
    },
    /// A structured text setting's value (hosts, an address) does not parse.
    BadValue {
        /// The setting.
        setting: Box<Setting>,
        /// What is wrong with the value, quoting the offending part (at most 64 characters).
        why: String,
    },
    /// Text was asked of a setting that is an integer.
    NotText {
        /// The setting.
        setting: Box<Setting>,
    },
}

impl SettingError {
    /// The key the error is about.
    pub fn key(&self) -> &str {
        match self {
            SettingError::UnknownKey { key } => key,
            SettingError::NotAnInteger { setting, .. }
            | SettingError::OutOfRange { setting, .. }
            | SettingError::BadText { setting, .. }
            | SettingError::BadUrl { setting, .. }
            | SettingError::NotOneOf { setting, .. }
            | SettingError::BadValue { setting, .. }
            | SettingError::NotText { setting } => setting.key,
        }
    }

    /// A stable name of the problem, for structured errors: `unknown_key`, `not_an_integer`,
    /// `out_of_range`, `bad_text`, `bad_url`, `not_one_of`, `bad_value`, `not_text`.
    pub fn problem(&self) -> &'static str {
        match self {
            SettingError::UnknownKey { .. } => "unknown_key",
            SettingError::NotAnInteger { .. } => "not_an_integer",
            SettingError::OutOfRange { .. } => "out_of_range",
            SettingError::BadText { .. } => "bad_text",
            SettingError::BadUrl { .. } => "bad_url",
            SettingError::NotOneOf { .. } => "not_one_of",
            SettingError::BadValue { .. } => "bad_value",
            SettingError::NotText { .. } => "not_text",
        }
    }

    /// The setting, for a value error.
    pub fn setting(&self) -> Option<&Setting> {
        match self {
            SettingError::UnknownKey { .. } => None,
            SettingError::NotAnInteger { setting, .. }
            | SettingError::OutOfRange { setting, .. }
            | SettingError::BadText { setting, .. }
            | SettingError::BadUrl { setting, .. }
            | SettingError::NotOneOf { setting, .. }
            | SettingError::BadValue { setting, .. }
            | SettingError::NotText { setting } => Some(setting.as_ref()),
        }
    }
}

impl std::fmt::Display for SettingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let range = |f: &mut std::fmt::Formatter<'_>, s: &Setting, got: &dyn std::fmt::Debug| {
            write!(f, "{} must be an {} from {} to {} ({}); got {got:?}", s.key, s.ty.name(), s.min, s.max, s.unit)
        };
        match self {
            SettingError::UnknownKey { key } => {
                write!(f, "{key:?} is not a setting Coffer reads (known: {})", keys().collect::<Vec<_>>().join(", "))
            }
            SettingError::NotAnInteger { setting, value } => range(f, setting, value),
            SettingError::OutOfRange { setting, value } => range(f, setting, &value.to_string()),
            SettingError::BadText { setting: s, value } => write!(
                f,
                "{} must be text of {} to {} bytes without control characters ({}); got {value:?}",
                s.key, s.min, s.max, s.unit
            ),
            SettingError::BadUrl { setting: s, value } => write!(
                f,
                "{} must be an http:// or https:// URL with a host, such as http://127.0.0.1:9000/v1, or empty ({}); got {value:?}",
                s.key, s.unit
            ),
            SettingError::NotOneOf { setting: s, value } => {
                write!(f, "{} must be one of {}; got {value:?}", s.key, s.format.words().unwrap_or_default().join(", "))
            }
            SettingError::BadValue { setting: s, why } => write!(f, "{}: {why} ({})", s.key, s.unit),
            SettingError::NotText { setting } => write!(f, "{} is an integer setting, not text", setting.key),
        }
    }
}

impl std::error::Error for SettingError {}

/// True for `""` and for an absolute `http://` or `https://` URL with a host; surrounding
/// whitespace is ignored, as readers ignore it.
fn is_http_url_or_empty(value: &str) -> bool {
    let v = value.trim();
    v.is_empty()
        || url::Url::parse(v)
            .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some_and(|h| !h.is_empty()))
}

/// The settings as Markdown: per [`Group`] (in order) a bold heading with its help line, then a
/// table (`| setting | key | default | accepted | what |`) of its settings in display order;
/// ends with a newline. What `docs/CLI.md` shows.
pub fn markdown_table() -> String {
    let mut out = String::new();
    for g in Group::ALL {
        out.push_str(&format!("**{}**: {}\n\n", g.title(), g.help()));
        out.push_str("| setting | key | default | accepted | what |\n|---|---|---|---|---|\n");
        for s in SETTINGS.iter().filter(|s| s.group == g) {
            let default = match s.ty {
                Type::Integer => s.default.to_string(),
                Type::Text if s.default_text.is_empty() => "(empty)".to_owned(),
                Type::Text => format!("`{}`", s.default_text),
            };
            out.push_str(&format!(
                "| {} | `{}` | {} | {} | {} |\n",
                s.label,
                s.key,
                default,
                s.bounds(),
                s.description
            ));
        }
        out.push('\n');
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        let mut seen = std::collections::BTreeSet::new();
        for s in SETTINGS {
            assert!(seen.insert(s.key), "{} twice", s.key);
            assert!(!s.key.is_empty() && s.key.len() <= MAX_KEY_BYTES, "{}", s.key);
            match s.ty {
                Type::Integer => {
                    assert!(s.min <= s.default && s.default <= s.max, "{}: default out of its bounds", s.key);
                    assert_eq!(s.parse(&s.default.to_string()), Ok(s.default), "{}", s.key);
                    assert!(s.default_text.is_empty(), "{}", s.key);
                }
                Type::Text => {
                    assert_eq!(s.parse_text(s.default_text), Ok(s.default_text), "{}", s.key);
                    assert_eq!(s.default, 0, "{}", s.key);
                }
            }
            assert_eq!(check(s.key, &s.default_value()), Ok(()), "{}", s.key);
            assert_eq!(find(s.key), Some(s));
        }
        assert_eq!(find("gateway.call_timeout"), None);
    }

    #[test]
    fn every_setting_has_a_plain_label_and_the_groups_are_shown_in_order() {
        let mut labels = std::collections::BTreeSet::new();
        for s in SETTINGS {
            assert!(!s.label.is_empty() && s.label.len() <= 48, "{}: label {:?}", s.key, s.label);
            assert!(
                !s.label.contains(['`', '_', '.', '<', '*']),
                "{}: the label {:?} is markup or a key",
                s.key,
                s.label
            );
            assert!(s.label.starts_with(|c: char| c.is_uppercase()), "{}: {:?}", s.key, s.label);
            assert!(labels.insert(s.label), "{}: label {:?} twice", s.key, s.label);
        }
        // Each group's rows are together, the groups in `Group::ALL`'s order.
        let order: Vec<Group> = SETTINGS.iter().map(|s| s.group).collect();
        let mut sorted = order.clone();
        sorted.sort_by_key(|g| Group::ALL.iter().position(|x| x == g));
        assert_eq!(order, sorted);
        for g in Group::ALL {
            assert!(SETTINGS.iter().any(|s| s.group == g), "{g:?} is empty");
            assert!(!g.title().contains('`') && !g.help().contains('`'), "{g:?}");
        }
    }

    #[test]
    fn values_are_checked_strictly() {
        for (k, v) in [
            ("gateway.call_timeout_ms", "1"),
            ("gateway.call_timeout_ms", "86400000"),
            ("gateway.max_tool_name_len", "40"),
            ("gateway.max_tool_name_len", "64"),
            ("retention.audit_days", "0"),
        ] {
            check(k, v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
        }
        for (k, v, problem) in [
            ("gateway.call_timeout_ms", "0", "out_of_range"),
            ("gateway.call_timeout_ms", "86400001", "out_of_range"),
            ("gateway.max_tool_name_len", "39", "out_of_range"),
            ("gateway.call_timeout_ms", "abc", "not_an_integer"),
            ("gateway.call_timeout_ms", "-5", "not_an_integer"),
            ("gateway.call_timeout_ms", "+5", "not_an_integer"),
            ("gateway.call_timeout_ms", " 5", "not_an_integer"),
            ("gateway.call_timeout_ms", "1.5", "not_an_integer"),
            ("gateway.call_timeout_ms", "", "not_an_integer"),
            ("gateway.call_timeout_ms", "99999999999999999999999", "not_an_integer"),
            ("gateway.call_timout_ms", "5", "unknown_key"),
        ] {
            let e = check(k, v).unwrap_err();
            assert_eq!((e.problem(), e.key()), (problem, k), "{k}={v}");
            assert!(e.to_string().contains(k), "{e}");
        }
        let e = check("gateway.max_tool_name_len", "100").unwrap_err().to_string();
        assert_eq!(e, "gateway.max_tool_name_len must be an integer from 40 to 64 (characters); got \"100\"");
        let e = check("nope", "1").unwrap_err().to_string();
        assert!(e.contains("\"nope\"") && e.contains("retention.audit_max_rows"), "{e}");
    }

    #[test]
    fn readers_trim_and_fall_back() {
        let s = RETENTION_INVOCATIONS_DAYS;
        assert_eq!(s.read(None), Ok(30));
        assert_eq!(s.read(Some(" 7 ")), Ok(7));
        assert_eq!(s.read(Some("0")), Ok(0));
        assert!(s.read(Some("-1")).is_err());
        assert_eq!(s.value_or_default(Some("lots")), 30);
        assert_eq!(CALL_TIMEOUT_MS.value_or_default(Some("0")), 60_000);
    }

    #[test]
    fn text_settings_take_text_and_refuse_control_characters() {
        assert_eq!(check("retrieval.embeddings.url", "http://127.0.0.1:9000/v1"), Ok(()));
        assert_eq!(check("retrieval.embeddings.url", ""), Ok(()));
        let e = check("retrieval.embeddings.url", "http://x/\nHost: y").unwrap_err();
        assert_eq!((e.problem(), e.key()), ("bad_text", "retrieval.embeddings.url"));
        for good in ["https://api.example.com/v1", "http://localhost:8080", " http://[::1]:9000/v1 "] {
            assert_eq!(check("retrieval.embeddings.url", good), Ok(()), "{good}");
        }
        for bad in [
            "anything",
            "ftp://host/x",
            "javascript:alert(1)",
            "http://",
            "file:///etc/passwd",
            "127.0.0.1:9000/v1",
            "https://exa mple.com",
        ] {
            let e = check("retrieval.embeddings.url", bad).unwrap_err();
            assert_eq!((e.problem(), e.key()), ("bad_url", "retrieval.embeddings.url"), "{bad}");
            let m = e.to_string();
            assert!(
                m.starts_with("retrieval.embeddings.url must be an http:// or https:// URL") && m.contains("or empty"),
                "{m}"
            );
        }
        let e = check("retrieval.embeddings.model", &"m".repeat(257)).unwrap_err();
        assert_eq!(e.problem(), "bad_text");
        assert!(e.to_string().contains("0 to 256 bytes"), "{e}");
        assert_eq!(EMBEDDINGS_URL.text_or_default(Some("  http://h/v1 ")), "http://h/v1");
        assert_eq!(EMBEDDINGS_URL.text_or_default(None), "");
        assert_eq!(EMBEDDINGS_URL.text_or_default(Some("bad\u{7}")), "");
        assert_eq!(ENGINE_TIMEOUT_MS.parse_text("5").unwrap_err().problem(), "not_text");
        // An integer setting still refuses text.
        assert_eq!(check("retrieval.max_file_bytes", "big").unwrap_err().problem(), "not_an_integer");
        assert_eq!(MAX_FILE_BYTES.value_or_default(None), 16 * 1024 * 1024);
    }

    #[test]
    fn markdown_has_a_row_per_setting() {
        let t = markdown_table();
        assert_eq!(t.lines().filter(|l| l.starts_with("| ") && l.contains(" | `")).count(), SETTINGS.len(), "{t}");
        assert!(
            t.contains("| Longest tool name | `gateway.max_tool_name_len` | 51 | 40-64 | longest exposed tool name"),
            "{t}"
        );
        assert!(
            t.contains("| Embeddings endpoint | `retrieval.embeddings.url` | (empty) | text, 0-2048 bytes |"),
            "{t}"
        );
        assert!(t.starts_with("**Chat and agents**: ") && t.contains("\n\n**MCP gateway**: "), "{t}");
    }
}
