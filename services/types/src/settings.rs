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
}

impl Type {
    /// The name shown in docs and errors.
    pub const fn name(self) -> &'static str {
        match self {
            Type::Integer => "integer",
        }
    }
}

/// One setting Coffer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The key (`gateway.call_timeout_ms`).
    pub key: &'static str,
    /// The type of its value.
    pub ty: Type,
    /// The value that applies while the key is not set.
    pub default: u64,
    /// The smallest accepted value (inclusive).
    pub min: u64,
    /// The largest accepted value (inclusive).
    pub max: u64,
    /// The unit, and what `0` means where it is accepted (`days, 0 = keep all`).
    pub unit: &'static str,
    /// What it governs, one line (the docs' "what" column).
    pub description: &'static str,
}

/// Deadline for one upstream's part of a `tools/list` or `prompts/list` fan-out.
pub const LIST_TIMEOUT_MS: Setting = Setting {
    key: "gateway.list_timeout_ms",
    ty: Type::Integer,
    default: 10_000,
    min: 1,
    max: DAY_MS,
    unit: "milliseconds",
    description: "how long one upstream may take to list its tools or prompts",
};
/// Deadline for an upstream's start and `initialize`.
pub const START_TIMEOUT_MS: Setting = Setting {
    key: "gateway.start_timeout_ms",
    ty: Type::Integer,
    default: 30_000,
    min: 1,
    max: DAY_MS,
    unit: "milliseconds",
    description: "how long an upstream may take to start and initialize",
};
/// Per-call timeout of servers without their own.
pub const CALL_TIMEOUT_MS: Setting = Setting {
    key: "gateway.call_timeout_ms",
    ty: Type::Integer,
    default: 60_000,
    min: 1,
    max: DAY_MS,
    unit: "milliseconds",
    description: "per-call timeout of servers without their own `--timeout`",
};
/// How long an MCP session may stay idle before it ends.
pub const SESSION_IDLE_TIMEOUT_S: Setting = Setting {
    key: "gateway.session_idle_timeout_s",
    ty: Type::Integer,
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
    ty: Type::Integer,
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
    ty: Type::Integer,
    default: 600,
    min: 1,
    max: 30 * 86_400,
    unit: "seconds",
    description: "end a tool-broker session (chat, REST tool calls) idle this long",
};
/// Longest exposed tool name.
pub const MAX_TOOL_NAME_LEN: Setting = Setting {
    key: "gateway.max_tool_name_len",
    ty: Type::Integer,
    default: 51,
    min: 40,
    max: 64,
    unit: "characters",
    description: "longest exposed tool name (`<server>__<tool>`, shortened deterministically)",
};
/// Age limit of invocation rows.
pub const RETENTION_INVOCATIONS_DAYS: Setting = Setting {
    key: "retention.invocations_days",
    ty: Type::Integer,
    default: 30,
    min: 0,
    max: 36_500,
    unit: "days, 0 = keep all",
    description: "delete invocation rows older than this (0: keep)",
};
/// Count limit of invocation rows.
pub const RETENTION_INVOCATIONS_MAX_ROWS: Setting = Setting {
    key: "retention.invocations_max_rows",
    ty: Type::Integer,
    default: 100_000,
    min: 0,
    max: 1_000_000_000,
    unit: "rows, 0 = no limit",
    description: "keep at most this many invocation rows (0: no limit)",
};
/// Age limit of audit rows.
pub const RETENTION_AUDIT_DAYS: Setting = Setting {
    key: "retention.audit_days",
    ty: Type::Integer,
    default: 365,
    min: 0,
    max: 36_500,
    unit: "days, 0 = keep all",
    description: "delete audit rows older than this (0: keep)",
};
/// Count limit of audit rows.
pub const RETENTION_AUDIT_MAX_ROWS: Setting = Setting {
    key: "retention.audit_max_rows",
    ty: Type::Integer,
    default: 100_000,
    min: 0,
    max: 1_000_000_000,
    unit: "rows, 0 = no limit",
    description: "keep at most this many audit rows (0: no limit)",
};

/// Every setting Coffer reads, in display order.
pub const SETTINGS: &[Setting] = &[
    LIST_TIMEOUT_MS,
    FIRST_LIST_TIMEOUT_MS,
    START_TIMEOUT_MS,
    CALL_TIMEOUT_MS,
    SESSION_IDLE_TIMEOUT_S,
    BROKER_IDLE_TIMEOUT_S,
    MAX_TOOL_NAME_LEN,
    RETENTION_INVOCATIONS_DAYS,
    RETENTION_INVOCATIONS_MAX_ROWS,
    RETENTION_AUDIT_DAYS,
    RETENTION_AUDIT_MAX_ROWS,
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
pub fn check(key: &str, value: &str) -> Result<u64, SettingError> {
    find(key).ok_or_else(|| SettingError::UnknownKey { key: key.to_owned() })?.parse(value)
}

impl Setting {
    /// Parses a value as it would be stored: digits only, within `min..=max`.
    ///
    /// # Errors
    /// [`SettingError::NotAnInteger`] (empty, a sign, spaces, a fraction, too many digits for
    /// `u64`), [`SettingError::OutOfRange`].
    pub fn parse(&self, value: &str) -> Result<u64, SettingError> {
        let n = (!value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()))
            .then(|| value.parse::<u64>().ok())
            .flatten()
            .ok_or_else(|| SettingError::NotAnInteger { setting: *self, value: value.to_owned() })?;
        if !(self.min..=self.max).contains(&n) {
            return Err(SettingError::OutOfRange { setting: *self, value: n });
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

    /// The accepted range as the docs show it (`1-86400000`).
    pub fn bounds(&self) -> String {
        format!("{}-{}", self.min, self.max)
    }
}

/// Why a setting's key or value was refused.
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
        setting: Setting,
        /// The value as given.
        value: String,
    },
    /// The value is an integer outside the setting's bounds.
    OutOfRange {
        /// The setting.
        setting: Setting,
        /// The value.
        value: u64,
    },
}

impl SettingError {
    /// The key the error is about.
    pub fn key(&self) -> &str {
        match self {
            SettingError::UnknownKey { key } => key,
            SettingError::NotAnInteger { setting, .. } | SettingError::OutOfRange { setting, .. } => setting.key,
        }
    }

    /// A stable name of the problem, for structured errors: `unknown_key`, `not_an_integer`,
    /// `out_of_range`.
    pub fn problem(&self) -> &'static str {
        match self {
            SettingError::UnknownKey { .. } => "unknown_key",
            SettingError::NotAnInteger { .. } => "not_an_integer",
            SettingError::OutOfRange { .. } => "out_of_range",
        }
    }

    /// The setting, for a value error.
    pub fn setting(&self) -> Option<&Setting> {
        match self {
            SettingError::UnknownKey { .. } => None,
            SettingError::NotAnInteger { setting, .. } | SettingError::OutOfRange { setting, .. } => Some(setting),
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
        }
    }
}

impl std::error::Error for SettingError {}

/// The settings as a Markdown table (`| key | default | accepted | what |`), one row per
/// setting in display order, ending with a newline: what `docs/CLI.md` shows.
pub fn markdown_table() -> String {
    let mut out = String::from("| key | default | accepted | what |\n|---|---|---|---|\n");
    for s in SETTINGS {
        out.push_str(&format!("| `{}` | {} | {} | {} |\n", s.key, s.default, s.bounds(), s.description));
    }
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
            assert!(s.min <= s.default && s.default <= s.max, "{}: default out of its bounds", s.key);
            assert_eq!(s.parse(&s.default.to_string()), Ok(s.default), "{}", s.key);
            assert_eq!(find(s.key), Some(s));
        }
        assert_eq!(find("gateway.call_timeout"), None);
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
    fn markdown_has_a_row_per_setting() {
        let t = markdown_table();
        assert_eq!(t.lines().count(), SETTINGS.len() + 2);
        assert!(t.contains("| `gateway.max_tool_name_len` | 51 | 40-64 | longest exposed tool name"), "{t}");
    }
}
