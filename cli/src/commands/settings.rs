//! `coffer settings get|set|unset`: the daemon's flat map of string settings (`/v1/settings`).
//!
//! [`KNOWN`] (the settings table, `coffer_types::settings`) are the settings Coffer itself
//! reads, with their defaults and the values they accept. `get` shows those defaults for keys
//! that are not set; `set` checks a known key's value here, before the daemon is asked or
//! started (the daemon checks it again), and refuses an unknown key (a typo, most likely) unless
//! `--force`, which it passes on (the daemon refuses unknown keys too without it).
use std::collections::BTreeMap;

use clap::{Args, Subcommand};
use coffer_api::settings::{SettingsPatch, SettingsValues};
use coffer_types::settings::SettingError;
use serde_json::json;

use crate::context::Ctx;
use crate::error::CliError;
use crate::output::{self, render_table};

/// Every setting Coffer reads (the gateway's timeouts and name length, the store's retention),
/// in display order.
pub use coffer_types::settings::SETTINGS as KNOWN;
/// A setting Coffer reads: its key, default and accepted range (the settings table of
/// `coffer_types::settings`, which the daemon validates against too).
pub use coffer_types::settings::Setting as Known;

/// The known setting `key`, if it is one.
pub fn known(key: &str) -> Option<&'static Known> {
    coffer_types::settings::find(key)
}

const GET_EXAMPLES: &str = "\
Examples:
  coffer settings get
  coffer settings get gateway.call_timeout_ms   # prints the value alone, for scripts
  coffer settings get --json

Without KEY, lists every setting that is set and every setting Coffer reads, with its default
when it is not set (SOURCE `default`); --json prints the REST body (`values`: only what is set)
plus `settings`: every row as {key, value, source: set|default, default}. With KEY,
prints its value, or the default of a known setting that is not set (noted on stderr); --json
then prints {\"values\":{KEY: value}}, with \"default\": true for a default. An unknown KEY
that is not set exits 3.";

const SET_EXAMPLES: &str = "\
Examples:
  coffer settings set gateway.call_timeout_ms 120000
  coffer settings set retention.invocations_days 7
  coffer settings set my.own.key 'some value' --force

Values of the settings Coffer reads are checked here: integers in their range (timeouts at least
1, gateway.max_tool_name_len 40-64, retention 0 or more). Any other key is refused, unless --force
(it is then stored as given; Coffer ignores it).";

#[derive(Debug, Subcommand)]
pub enum SettingsCommand {
    /// Show every setting (defaults included), or one setting's value.
    #[command(after_help = GET_EXAMPLES)]
    Get(GetArgs),
    /// Set a setting; known settings' values are checked, unknown keys need --force.
    #[command(after_help = SET_EXAMPLES)]
    Set(SetArgs),
    /// Remove a setting, so its default applies (not an error when it is not set).
    #[command(after_help = "Example:\n  coffer settings unset gateway.call_timeout_ms")]
    Unset(KeyArg),
}

#[derive(Debug, Args)]
pub struct GetArgs {
    /// One setting; every setting when omitted.
    pub key: Option<String>,
}

#[derive(Debug, Args)]
pub struct SetArgs {
    /// The setting's key (1-128 bytes).
    pub key: String,
    /// Its value, stored as a string.
    #[arg(allow_negative_numbers = true)]
    pub value: String,
    /// Store a key that is not one of the settings Coffer reads.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct KeyArg {
    /// The setting's key.
    pub key: String,
}

/// Runs one `coffer settings …` command.
///
/// # Errors
/// Exit 2 for a bad value of a known setting or an unknown key without `--force`; exit 3 when
/// `get KEY` names no setting; API errors; exit 5 when the daemon cannot be reached.
pub async fn run(ctx: &Ctx, cmd: SettingsCommand) -> Result<(), CliError> {
    // Checked before the daemon is asked (or started).
    if let SettingsCommand::Set(a) = &cmd {
        check_set(&a.key, &a.value, a.force)?;
    }
    let api = ctx.connect().await?;
    match cmd {
        SettingsCommand::Get(GetArgs { key: None }) => {
            let resp = api.get_raw("/v1/settings").await?;
            let SettingsValues { values } = resp.parse()?;
            if ctx.json {
                // The REST body (`values`: what is set), plus every setting as the table shows it.
                let mut body: serde_json::Value =
                    serde_json::from_str(&resp.body).map_err(|e| CliError::Failed(e.to_string()))?;
                body["settings"] = settings_json(&values);
                return output::print_json(&body);
            }
            let mut out = String::new();
            if values.is_empty() {
                out.push_str("No settings are set; Coffer uses these defaults:\n");
            }
            out.push_str(&render_settings(&values));
            output::print(&out)
        }
        SettingsCommand::Get(GetArgs { key: Some(key) }) => {
            let SettingsValues { values } = api.get_as("/v1/settings").await?;
            if let Some(value) = values.get(&key) {
                if ctx.json {
                    return output::print_json(&json!({"values": {key: value}}));
                }
                return output::println(value);
            }
            let Some(k) = known(&key) else {
                return Err(CliError::NotFound(format!("no setting {key:?}; `coffer settings get` lists them")));
            };
            let default = k.default_value();
            if ctx.json {
                return output::print_json(&json!({"values": {key: default}, "default": true}));
            }
            crate::eprintln_printable!("note: {key} is not set; this is its default");
            output::println(&default)
        }
        SettingsCommand::Set(SetArgs { key, value, force }) => {
            // `force` lets the daemon store a key it does not read; it still checks known ones.
            let set = BTreeMap::from([(key.clone(), value.clone())]);
            let resp = patch(&api, &SettingsPatch { set, force, ..SettingsPatch::default() }).await?;
            if ctx.json {
                return output::print_body(&resp.body);
            }
            output::println(&format!("Set {key} = {value}"))
        }
        SettingsCommand::Unset(KeyArg { key }) => {
            let before: SettingsValues = api.get_as("/v1/settings").await?;
            if known(&key).is_none() && !before.values.contains_key(&key) {
                // Not a setting Coffer reads, and not stored: a typo, most likely.
                let unknown = SettingError::UnknownKey { key: key.clone() };
                return Err(CliError::NotFound(format!("{unknown}; and it is not set, so there is nothing to unset")));
            }
            let resp = patch(&api, &SettingsPatch { remove: vec![key.clone()], ..SettingsPatch::default() }).await?;
            if ctx.json {
                return output::print_body(&resp.body);
            }
            let existed = before.values.contains_key(&key);
            let default = known(&key).map(default_note).unwrap_or_default();
            output::println(&if existed {
                format!("Removed setting {key}{default}")
            } else {
                format!("Setting {key} was not set{default}")
            })
        }
    }
}

/// What `settings unset` adds about a known key's default: ` (default 60000 applies)`, or for
/// an empty default what empty means, from its unit (` (the default applies: empty = `claude`
/// on PATH)`), else ` (the default applies: empty)`.
fn default_note(k: &Known) -> String {
    let d = k.default_value();
    if !d.is_empty() {
        return format!(" (default {d} applies)");
    }
    match k.unit.split([',', ';']).map(str::trim).find(|p| p.starts_with("empty")) {
        Some(meaning) => format!(" (the default applies: {meaning})"),
        None => " (the default applies: empty)".to_owned(),
    }
}

/// Checks `settings set KEY VALUE`: a known key's value must be an integer (digits only) in its
/// range; an unknown key needs `force`.
///
/// # Errors
/// [`CliError::Usage`] (exit 2) saying what is accepted (the known keys for an unknown one).
pub fn check_set(key: &str, value: &str, force: bool) -> Result<(), CliError> {
    match coffer_types::settings::check(key, value) {
        Ok(_) => Ok(()),
        Err(SettingError::UnknownKey { .. }) if force => Ok(()),
        Err(e @ SettingError::UnknownKey { .. }) => {
            Err(CliError::Usage(format!("{e}; pass --force to store it anyway")))
        }
        Err(e) => Err(CliError::Usage(e.to_string())),
    }
}

async fn patch(api: &crate::api::ApiClient, body: &SettingsPatch) -> Result<crate::api::ApiResponse, CliError> {
    api.send(api.request(reqwest::Method::PATCH, "/v1/settings").json(body)).await
}

/// `settings get --json`'s `settings`: every row of [`render_settings`]' table in its order,
/// `{"key", "value", "source": "set"|"default", "default": <the default>|null}` (`default` is
/// null for a key Coffer does not read), so a script sees the value in effect and whether it is
/// the default.
pub fn settings_json(values: &BTreeMap<String, String>) -> serde_json::Value {
    use coffer_types::settings::Group;
    let mut rows = Vec::new();
    for g in Group::ALL {
        for k in KNOWN.iter().filter(|k| k.group == g) {
            let default = k.default_value();
            rows.push(match values.get(k.key) {
                Some(v) => json!({"key": k.key, "value": v, "source": "set", "default": default}),
                None => json!({"key": k.key, "value": default, "source": "default", "default": default}),
            });
        }
    }
    for (k, v) in values.iter().filter(|(k, _)| known(k).is_none()) {
        rows.push(json!({"key": k, "value": v, "source": "set", "default": null}));
    }
    serde_json::Value::Array(rows)
}

/// The settings table: KEY VALUE SOURCE, every known key (its value, `set`, or its default,
/// `default`) under its section's title (`Chat and agents`, …, as the console and docs/CLI.md
/// name them) in display order, then any other key that is set (`Other keys`, sorted); values
/// on one line. One table, so the columns line up across the sections.
pub fn render_settings(values: &BTreeMap<String, String>) -> String {
    use coffer_types::settings::Group;
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut titles: Vec<(usize, &str)> = Vec::new();
    let row = |k: &str, v: &str, source: &str| vec![k.to_owned(), v.replace('\n', "\\n"), source.to_owned()];
    for g in Group::ALL {
        titles.push((rows.len(), g.title()));
        for k in KNOWN.iter().filter(|k| k.group == g) {
            rows.push(match values.get(k.key) {
                Some(v) => row(k.key, v, "set"),
                None => row(k.key, &k.default_value(), "default"),
            });
        }
    }
    let others: Vec<(&String, &String)> = values.iter().filter(|(k, _)| known(k).is_none()).collect();
    if !others.is_empty() {
        titles.push((rows.len(), "Other keys"));
        rows.extend(others.into_iter().map(|(k, v)| row(k, v, "set")));
    }
    let table = render_table(&["KEY", "VALUE", "SOURCE"], &rows);
    let mut out = String::new();
    for (i, line) in table.lines().enumerate() {
        // Line 0 is the header; row n is line n + 1.
        if let Some((_, title)) = titles.iter().find(|(at, _)| i > 0 && *at == i - 1) {
            out.push_str(&format!("\n{title}\n"));
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::exit;

    #[test]
    fn settings_table_shows_defaults_of_unset_keys() {
        let v: BTreeMap<String, String> =
            serde_json::from_value(json!({"a.b": "1", "long.key": "two\nlines", "gateway.call_timeout_ms": "120000"}))
                .unwrap();
        let t = render_settings(&v);
        // Every row split into its columns (values here hold no run of two spaces).
        let titles: Vec<&str> =
            coffer_types::settings::Group::ALL.iter().map(|g| g.title()).chain(["Other keys"]).collect();
        let shown: Vec<&str> = t.lines().filter(|l| titles.contains(l)).collect();
        assert_eq!(shown, titles, "every section, in order: {t}");
        let rows: Vec<Vec<&str>> = t
            .lines()
            .filter(|l| !l.is_empty() && !titles.contains(l))
            .map(|l| l.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect())
            .collect();
        assert_eq!(rows[0], ["KEY", "VALUE", "SOURCE"], "{t}");
        let keys: Vec<&str> = rows[1..].iter().map(|r| r[0]).collect();
        let display: Vec<&str> = KNOWN.iter().map(|k| k.key).chain(["a.b", "long.key"]).collect();
        assert_eq!(keys, display, "in display order, then the other keys sorted: {t}");
        assert!(rows.contains(&vec!["a.b", "1", "set"]), "{t}");
        assert!(rows.contains(&vec!["long.key", "two\\nlines", "set"]), "values on one line: {t}");
        assert!(rows.contains(&vec!["gateway.call_timeout_ms", "120000", "set"]), "{t}");
        // Every known key that is not set shows its default, once (an empty default leaves the
        // value column empty).
        for k in KNOWN.iter().filter(|k| k.key != "gateway.call_timeout_ms") {
            let row: Vec<&Vec<&str>> = rows.iter().filter(|r| r[0] == k.key).collect();
            let want = k.default_value();
            let expect: Vec<&str> =
                if want.is_empty() { vec![k.key, "default"] } else { vec![k.key, &want, "default"] };
            assert_eq!(row, [&expect], "{}: {t}", k.key);
        }
        assert_eq!(rows.len(), 1 + KNOWN.len() + 2, "{t}");
    }

    #[test]
    fn unset_names_the_default_that_applies_even_an_empty_one() {
        let k = |key: &str| default_note(known(key).unwrap());
        assert_eq!(k("gateway.call_timeout_ms"), " (default 60000 applies)");
        assert_eq!(k("chat.claude_code_path"), " (the default applies: empty = `claude` on PATH)");
        assert_eq!(k("ui.allowed_hosts"), " (the default applies: empty = loopback only)");
        for key in KNOWN {
            let note = default_note(key);
            assert!(!note.contains("  ") && !note.contains("default  "), "{}: {note:?}", key.key);
        }
    }

    #[test]
    fn no_settings_lists_every_default() {
        let t = render_settings(&BTreeMap::new());
        for (key, default) in [
            ("gateway.list_timeout_ms", "10000"),
            ("gateway.start_timeout_ms", "30000"),
            ("gateway.call_timeout_ms", "60000"),
            ("gateway.session_idle_timeout_s", "1800"),
            ("gateway.broker_idle_timeout_s", "600"),
            ("gateway.max_tool_name_len", "51"),
            ("retention.invocations_days", "30"),
            ("retention.invocations_max_rows", "100000"),
            ("retention.audit_days", "365"),
            ("retention.audit_max_rows", "100000"),
            ("retrieval.engine_timeout_ms", "2000"),
            ("retrieval.max_file_bytes", "16777216"),
            ("retrieval.embeddings.batch_size", "32"),
        ] {
            let line = t.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("{key} missing:\n{t}"));
            let cells: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(cells, [key, default, "default"], "{line}");
        }
        assert_eq!(t.lines().count(), KNOWN.len() + 1 + 2 * coffer_types::settings::Group::ALL.len(), "{t}");
    }

    #[test]
    fn known_values_are_checked() {
        for (k, v) in [
            ("gateway.call_timeout_ms", "1"),
            ("gateway.call_timeout_ms", "86400000"),
            ("gateway.session_idle_timeout_s", "3600"),
            ("gateway.max_tool_name_len", "40"),
            ("gateway.max_tool_name_len", "64"),
            ("retention.audit_days", "0"),
            ("retention.invocations_max_rows", "0"),
        ] {
            check_set(k, v, false).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
        }
        for (k, v) in [
            ("gateway.call_timeout_ms", "0"),
            ("gateway.call_timeout_ms", "abc"),
            ("gateway.call_timeout_ms", "-5"),
            ("gateway.call_timeout_ms", "+5"),
            ("gateway.call_timeout_ms", " 5"),
            ("gateway.call_timeout_ms", "1.5"),
            ("gateway.call_timeout_ms", ""),
            ("gateway.call_timeout_ms", "99999999999999999999999"),
            ("gateway.list_timeout_ms", "0"),
            ("gateway.start_timeout_ms", "0"),
            ("gateway.session_idle_timeout_s", "0"),
            ("gateway.max_tool_name_len", "39"),
            ("gateway.max_tool_name_len", "65"),
            ("retention.audit_days", "-1"),
            ("retention.audit_max_rows", "lots"),
        ] {
            let e = check_set(k, v, false).unwrap_err();
            assert_eq!(e.exit_code(), exit::USAGE, "{k}={v}");
            assert!(e.to_string().contains(k), "{e}");
            // --force is for unknown keys only.
            assert!(check_set(k, v, true).is_err(), "{k}={v} with --force");
        }
        let e = check_set("gateway.max_tool_name_len", "100", false).unwrap_err().to_string();
        assert!(e.contains("from 40 to 64"), "{e}");
    }

    #[test]
    fn unknown_keys_need_force() {
        let e = check_set("gateway.call_timeout", "5", false).unwrap_err();
        assert_eq!(e.exit_code(), exit::USAGE);
        let msg = e.to_string();
        assert!(msg.contains("--force"), "{msg}");
        for k in KNOWN {
            assert!(msg.contains(k.key), "{msg}");
        }
        check_set("my.own.key", "anything at all", true).unwrap();
    }

    #[test]
    fn set_needs_key_and_value() {
        use clap::Parser;
        assert_eq!(crate::Cli::try_parse_from(["coffer", "settings", "set", "k"]).unwrap_err().exit_code(), 2);
        assert!(crate::Cli::try_parse_from(["coffer", "settings", "set", "k", ""]).is_ok());
        assert!(crate::Cli::try_parse_from(["coffer", "settings", "set", "k", "v", "--force"]).is_ok());
        // A negative number is a value (refused by the check, naming the key), not a flag.
        let c = crate::Cli::try_parse_from(["coffer", "settings", "set", "retention.audit_days", "-1"]).unwrap();
        let crate::commands::Command::Settings(SettingsCommand::Set(a)) = c.command else { panic!() };
        assert_eq!(a.value, "-1");
    }
}
