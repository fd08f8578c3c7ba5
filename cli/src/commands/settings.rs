//! `coffer settings get|set|unset`: the daemon's flat map of string settings (`/v1/settings`).
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use crate::context::Ctx;
use crate::error::CliError;
use crate::output::{self, render_table};

const GET_EXAMPLES: &str = "\
Examples:
  coffer settings get
  coffer settings get some.key          # prints the value alone, for scripts
  coffer settings get --json

With KEY, --json prints {\"values\":{KEY: value}}: the REST body cut to that key.";

#[derive(Debug, Subcommand)]
pub enum SettingsCommand {
    /// Show every setting, or one setting's value.
    #[command(after_help = GET_EXAMPLES)]
    Get(GetArgs),
    /// Set a setting to a (string) value.
    #[command(after_help = "Example:\n  coffer settings set some.key 'some value'")]
    Set(SetArgs),
    /// Remove a setting (not an error when it is not set).
    #[command(after_help = "Example:\n  coffer settings unset some.key")]
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
    pub value: String,
}

#[derive(Debug, Args)]
pub struct KeyArg {
    /// The setting's key.
    pub key: String,
}

/// Runs one `coffer settings …` command.
///
/// # Errors
/// Exit 3 when `get KEY` names no setting; API errors; exit 5 when the daemon cannot be reached.
pub async fn run(ctx: &Ctx, cmd: SettingsCommand) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    match cmd {
        SettingsCommand::Get(GetArgs { key: None }) => {
            let resp = api.get_raw("/v1/settings").await?;
            if ctx.json {
                return output::print_body(&resp.body);
            }
            let body = resp.json()?;
            match body["values"].as_object().filter(|m| !m.is_empty()) {
                Some(values) => output::print(&render_settings(values)),
                None => output::println("No settings"),
            }
        }
        SettingsCommand::Get(GetArgs { key: Some(key) }) => {
            let body = api.get("/v1/settings").await?;
            let Some(value) = body["values"].get(&key) else {
                return Err(CliError::NotFound(format!("no setting {key:?}; `coffer settings get` lists them")));
            };
            if ctx.json {
                return output::print_json(&json!({"values": {key: value}}));
            }
            output::println(value.as_str().unwrap_or_default())
        }
        SettingsCommand::Set(SetArgs { key, value }) => {
            let resp = patch(&api, &json!({"set": {&key: &value}})).await?;
            if ctx.json {
                return output::print_body(&resp.body);
            }
            output::println(&format!("Set {key} = {value}"))
        }
        SettingsCommand::Unset(KeyArg { key }) => {
            let before = api.get("/v1/settings").await?;
            let resp = patch(&api, &json!({"remove": [&key]})).await?;
            if ctx.json {
                return output::print_body(&resp.body);
            }
            let existed = before["values"].get(&key).is_some();
            output::println(&if existed {
                format!("Removed setting {key}")
            } else {
                format!("Setting {key} was not set")
            })
        }
    }
}

async fn patch(api: &crate::api::ApiClient, body: &Value) -> Result<crate::api::ApiResponse, CliError> {
    api.send(api.request(reqwest::Method::PATCH, "/v1/settings").json(body)).await
}

/// The settings table: KEY VALUE (values on one line).
pub fn render_settings(values: &serde_json::Map<String, Value>) -> String {
    let rows: Vec<Vec<String>> = values
        .iter()
        .map(|(k, v)| vec![k.clone(), v.as_str().map_or_else(|| v.to_string(), |s| s.replace('\n', "\\n"))])
        .collect();
    render_table(&["KEY", "VALUE"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_table() {
        let v = json!({"a.b": "1", "long.key": "two\nlines"});
        assert_eq!(render_settings(v.as_object().unwrap()), "KEY       VALUE\na.b       1\nlong.key  two\\nlines\n");
    }

    #[test]
    fn set_needs_key_and_value() {
        use clap::Parser;
        assert_eq!(crate::Cli::try_parse_from(["coffer", "settings", "set", "k"]).unwrap_err().exit_code(), 2);
        assert!(crate::Cli::try_parse_from(["coffer", "settings", "set", "k", ""]).is_ok());
    }
}
