//! `coffer mcp search` and `coffer mcp install`: finding servers in the MCP Registry and
//! installing one (`/v1/mcp/registry/…`; the daemon reads the registry, checks what it says and
//! registers the server, so the console's dialog does exactly what this does).
use std::collections::BTreeMap;
use std::io::IsTerminal as _;

use clap::Args;
use coffer_api::Page;
use coffer_api::registry::{InstallOption, RegistryInput, RegistryInstall, RegistryInstalled, RegistryServer};
use secrecy::ExposeSecret;

use crate::api::path_segment;
use crate::commands::listed::Listed;
use crate::context::Ctx;
use crate::error::CliError;
use crate::output;

pub const SEARCH_EXAMPLES: &str = "\
Examples:
  coffer mcp search weather
  coffer mcp search github --json

Reads the MCP Registry named by the gateway.mcp_registry_url setting (empty: the official one,
https://registry.modelcontextprotocol.io). Each line says whether this machine can run the server
(npx, uvx or docker on the PATH, or a hosted remote) and what `coffer mcp install` would pick.";

pub const INSTALL_EXAMPLES: &str = "\
Examples:
  coffer mcp install io.github.example/weather-mcp
  coffer mcp install io.github.example/weather-mcp --as weather --input CITY=Oslo
  WEATHER_API_KEY=... coffer mcp install io.github.example/weather-mcp --env-from-env
  coffer mcp install io.github.example/weather-mcp --option remote:0

Picks the first package this machine can run (npm through npx, PyPI through uvx, OCI through
docker or podman), else the first remote; --option chooses another (`coffer mcp search` lists
them). Required inputs come from --input, --env-from-env, or are asked for on a terminal (secrets
without echo). Secret inputs go straight into the credential store as <server>.<input>; the
registry keeps only a reference. A remote that needs a sign-in says so: run `coffer mcp auth NAME`.";

#[derive(Debug, Args)]
pub struct SearchArgs {
    /// Part of the server's registry name (e.g. `weather`, `io.github.user`).
    pub query: String,
    /// At most this many results (1-100).
    #[arg(long, default_value_t = 30)]
    pub limit: u32,
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// The server's registry name (`io.github.user/weather`), as `coffer mcp search` shows it.
    pub name: String,
    /// Register it under this Coffer name [default: from its registry name].
    #[arg(long = "as", value_name = "NAME")]
    pub server: Option<String>,
    /// A version of it [default: the latest].
    #[arg(long = "server-version", value_name = "VERSION")]
    pub server_version: Option<String>,
    /// Which package or remote to install (`package:0`, `remote:1`, …).
    #[arg(long, value_name = "ID")]
    pub option: Option<String>,
    /// A value for one of its inputs (repeatable).
    #[arg(short, long = "input", value_name = "NAME=VALUE", value_parser = parse_input)]
    pub inputs: Vec<(String, String)>,
    /// Take inputs not given with --input from environment variables of the same name.
    #[arg(long)]
    pub env_from_env: bool,
    /// Register it disabled.
    #[arg(long)]
    pub disabled: bool,
    /// Return at once instead of waiting (up to 60 s) for its first list of tools.
    #[arg(long)]
    pub no_wait: bool,
    /// When the installed remote answers that it needs an OAuth sign-in, start it at once (as
    /// `coffer mcp auth NAME` does) instead of asking on a terminal.
    #[arg(long, conflicts_with_all = ["no_auth", "no_wait", "disabled"])]
    pub auth: bool,
    /// Never offer the sign-in: only say which command starts it.
    #[arg(long)]
    pub no_auth: bool,
}

fn parse_input(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not NAME=VALUE")),
    }
}

/// `coffer mcp search QUERY`.
///
/// # Errors
/// The daemon's (the registry unreachable or malformed: exit 1), exit 5 without a daemon.
pub async fn search(ctx: &Ctx, a: SearchArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let path = format!("/v1/mcp/registry/servers?search={}&limit={}", path_segment(&a.query), a.limit);
    let resp = api.get_raw(&path).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let page: Page<RegistryServer> = resp.parse()?;
    if page.items.is_empty() {
        return output::println(&format!("No server in the registry matches {:?}", a.query));
    }
    output::print(&render_search(&page.items))
}

/// One block per server: name, version, description, and what `install` would pick.
pub fn render_search(items: &[RegistryServer]) -> String {
    let mut out = String::new();
    for s in items {
        let status = match s.status.as_deref() {
            Some(st) if st != "active" => format!(" [{st}]"),
            _ => String::new(),
        };
        out.push_str(&format!("{} {}{status}\n", s.name, s.version));
        if !s.description.is_empty() {
            out.push_str(&format!("  {}\n", s.description));
        }
        let pick = match s.chosen.as_deref().and_then(|id| s.options.iter().find(|o| o.id == id)) {
            Some(o) => format!("installs as {} from {}", s.suggested_name, option_text(o)),
            None => {
                let why: Vec<String> =
                    s.options.iter().filter_map(|o| o.reason.as_ref().map(|r| format!("{}: {r}", o.id))).collect();
                if why.is_empty() {
                    "nothing to install (no package, no remote)".into()
                } else {
                    format!("cannot run here ({})", why.join("; "))
                }
            }
        };
        out.push_str(&format!("  {pick}\n"));
    }
    out
}

/// `npm @x/y@1.2.3 via npx` or `remote http https://…`.
fn option_text(o: &InstallOption) -> String {
    if o.kind == "remote" {
        return format!("{} (remote, {})", o.url.as_deref().unwrap_or("-"), o.transport);
    }
    let version = o.version.as_deref().map(|v| format!("@{v}")).unwrap_or_default();
    format!(
        "{} {}{version} via {} ({})",
        o.registry_type.as_deref().unwrap_or("?"),
        o.identifier.as_deref().unwrap_or("?"),
        o.runtime.as_deref().unwrap_or("?"),
        o.id
    )
}

/// `coffer mcp install NAME`.
///
/// # Errors
/// A required input without a value off a terminal (exit 2), the daemon's errors (a hostile
/// entry, nothing runnable, a bad input: exit 2; the registry unreachable or malformed: exit 1;
/// a duplicate name: exit 4), exit 5 without a daemon.
pub async fn install(ctx: &Ctx, a: InstallArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let mut path = format!("/v1/mcp/registry/servers/{}", path_segment(&a.name));
    if let Some(v) = &a.server_version {
        path.push_str(&format!("?version={}", path_segment(v)));
    }
    let entry: RegistryServer = api.get_as(&path).await?;
    let id = a.option.clone().or(entry.chosen.clone());
    let option = id.as_deref().and_then(|id| entry.options.iter().find(|o| o.id == id));
    let server = a.server.clone().unwrap_or_else(|| entry.suggested_name.clone());
    let mut inputs: BTreeMap<String, String> = a.inputs.iter().cloned().collect();
    if let Some(option) = option {
        if !ctx.json {
            crate::eprintln_printable!(
                "Installing {} {} as {server} from {}",
                entry.name,
                entry.version,
                option_text(option)
            );
        }
        collect_inputs(&option.inputs, &mut inputs, a.env_from_env, |k| std::env::var(k).ok())?;
    }
    let body = RegistryInstall {
        name: entry.name.clone(),
        version: a.server_version.clone(),
        server: Some(server.clone()),
        option: id,
        inputs,
        enabled: a.disabled.then_some(false),
    };
    let resp = api.send(api.request(reqwest::Method::POST, "/v1/mcp/registry/install").json(&body)).await?;
    let installed: RegistryInstalled = resp.parse()?;
    let name = installed.server.name.clone();
    let listed = if installed.server.enabled && !a.no_wait {
        crate::commands::listed::wait(&api, std::slice::from_ref(&name), crate::commands::listed::WAIT).await.pop()
    } else {
        None
    };
    let needs_sign_in = listed.as_ref().is_some_and(needs_sign_in);
    if ctx.json {
        let mut body = resp.json()?;
        if let Some(l) = listed {
            body["catalog"] = l.state;
        }
        return output::print_json(&body);
    }
    let mut out = format!("Installed MCP server {name} ({} {})\n", installed.registry_name, installed.registry_version);
    for c in &installed.credentials_created {
        out.push_str(&format!("Stored credential {c}\n"));
    }
    if needs_sign_in {
        out.push_str(&format!("It needs sign-in: run `coffer mcp auth {name}`\n"));
    } else if let Some(l) = &listed {
        crate::commands::listed::report(&mut out, l);
        if !l.failed() {
            out.push_str(&format!("See its tools: coffer tools list --server {name}\n"));
        }
    }
    output::print(&out)?;
    if needs_sign_in && crate::commands::mcp_auth::offer_sign_in(&name, a.auth, a.no_auth)? {
        return crate::commands::mcp_auth::run(ctx, crate::commands::mcp_auth::AuthArgs::new(name)).await;
    }
    Ok(())
}

/// Whether the server's first list failed for want of a sign-in (HTTP 401 or an OAuth
/// challenge from a remote).
fn needs_sign_in(l: &Listed) -> bool {
    let text = l.state.to_string().to_ascii_lowercase();
    l.failed() && (text.contains("401") || text.contains("sign-in") || text.contains("www-authenticate"))
}

/// Fills `inputs` for `wanted`: given ones stay; then (with `from_env`) environment variables of
/// the same name; then required ones are asked for on a terminal (secrets without echo).
///
/// # Errors
/// [`CliError::Usage`] naming every required input still without a value when stdin is not a
/// terminal, or a value that is not one of its choices.
pub fn collect_inputs(
    wanted: &[RegistryInput],
    inputs: &mut BTreeMap<String, String>,
    from_env: bool,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(), CliError> {
    if from_env {
        for i in wanted {
            if !inputs.contains_key(&i.name)
                && let Some(v) = env(&i.name).filter(|v| !v.is_empty())
            {
                inputs.insert(i.name.clone(), v);
            }
        }
    }
    let missing: Vec<&RegistryInput> =
        wanted.iter().filter(|i| i.required && i.default.is_none() && !inputs.contains_key(&i.name)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        let names: Vec<&str> = missing.iter().map(|i| i.name.as_str()).collect();
        return Err(CliError::Usage(format!(
            "the server needs a value for {}: pass --input NAME=VALUE (or --env-from-env with them in the environment)",
            names.join(", ")
        )));
    }
    for i in missing {
        let about = i.description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
        let choices = if i.choices.is_empty() { String::new() } else { format!(" [{}]", i.choices.join("/")) };
        let prompt = format!("{}{about}{choices}: ", i.name);
        let value = if i.secret {
            crate::commands::credentials::prompt_hidden(&prompt)?
                .expose_secret()
                .trim_end_matches(['\r', '\n'])
                .to_owned()
        } else {
            crate::output::prompt_line(&prompt)?
        };
        if value.is_empty() {
            return Err(CliError::Usage(format!("{} needs a value", i.name)));
        }
        inputs.insert(i.name.clone(), value);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(name: &str, required: bool, secret: bool) -> RegistryInput {
        RegistryInput {
            name: name.into(),
            kind: "env".into(),
            description: None,
            required,
            secret,
            default: None,
            choices: vec![],
        }
    }

    #[test]
    fn inputs_come_from_flags_then_the_environment() {
        let wanted = [input("API_KEY", true, true), input("REGION", false, false)];
        let mut given = BTreeMap::from([("REGION".to_owned(), "eu".to_owned())]);
        collect_inputs(&wanted, &mut given, true, |k| (k == "API_KEY").then(|| "from-env".to_owned())).unwrap();
        assert_eq!(given["API_KEY"], "from-env");
        assert_eq!(given["REGION"], "eu");
        // Without --env-from-env and off a terminal (tests have no tty on stdin), a usage error
        // naming the input.
        let mut none = BTreeMap::new();
        if !std::io::stdin().is_terminal() {
            let e = collect_inputs(&wanted, &mut none, false, |_| None).unwrap_err();
            assert!(e.to_string().contains("needs a value for API_KEY"), "{e}");
        }
    }

    #[test]
    fn search_lines_say_what_install_picks() {
        let s = RegistryServer {
            name: "io.github.x/weather".into(),
            title: None,
            description: "Forecasts".into(),
            version: "1.0.0".into(),
            website_url: None,
            repository_url: None,
            status: Some("deprecated".into()),
            suggested_name: "weather".into(),
            options: vec![InstallOption {
                id: "package:0".into(),
                kind: "package".into(),
                registry_type: Some("npm".into()),
                identifier: Some("@x/weather".into()),
                version: Some("1.0.0".into()),
                runtime: Some("npx".into()),
                transport: "stdio".into(),
                url: None,
                runnable: true,
                reason: None,
                inputs: vec![],
            }],
            chosen: Some("package:0".into()),
        };
        assert_eq!(
            render_search(std::slice::from_ref(&s)),
            "io.github.x/weather 1.0.0 [deprecated]\n  Forecasts\n  installs as weather from npm @x/weather@1.0.0 via npx (package:0)\n"
        );
        let mut none = s.clone();
        none.chosen = None;
        none.options[0].runnable = false;
        none.options[0].reason = Some("npx is not on the PATH".into());
        assert!(render_search(&[none]).ends_with("  cannot run here (package:0: npx is not on the PATH)\n"));
    }
}
