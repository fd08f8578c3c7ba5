//! `coffer connect` on the private `$HOME` of a test home: Cursor and Claude Desktop files are
//! created or edited keeping every other key, twice is the same as once, `--remove` undoes it,
//! the first previous version is kept as `.bak`; Claude Code goes through `claude mcp add` when
//! a `claude` is on `PATH` (a recording stand-in here); Codex's TOML keeps its comments. No
//! daemon is involved.
use std::path::{Path, PathBuf};

use anyhow::{Context, ensure};
use coffer_tests::{CliOutput, TestHome};
use serde_json::{Value, json};

/// The private `$HOME` every process of `home` gets.
fn user_home(home: &TestHome) -> anyhow::Result<PathBuf> {
    home.env().get("HOME").map(PathBuf::from).context("the harness sets HOME")
}

/// Runs `coffer <args>` with extra environment.
pub(crate) async fn cli_env(home: &TestHome, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<CliOutput> {
    let mut cmd = home.cli_command(args)?;
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(coffer_tests::CLI_TIMEOUT, cmd.output()).await.context("coffer ran too long")??;
    Ok(CliOutput {
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// A stand-in `claude` that appends its arguments, one call a line, to a log: `(the folder to
/// put on PATH, the log)`.
fn fake_claude(home: &TestHome) -> anyhow::Result<(PathBuf, PathBuf)> {
    use std::os::unix::fs::PermissionsExt;
    let bin = home.temp().join("claude-bin");
    std::fs::create_dir_all(&bin)?;
    let log = home.temp().join("claude-args.log");
    let fake = bin.join("claude");
    std::fs::write(&fake, format!("#!/bin/sh\necho \"$*\" >> '{}'\n", log.display()))?;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755))?;
    Ok((bin, log))
}

fn read_json(p: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON: {text}", p.display()))
}

fn shim() -> anyhow::Result<String> {
    Ok(coffer_tests::bin("coffer-mcp-shim")?.display().to_string())
}

/// The test home's root: not the default home, so connect writes it for the shim.
fn coffer_home(home: &TestHome) -> String {
    home.root().display().to_string()
}

/// connect, connect again, remove, remove again on one client whose file is `path`.
async fn round_trip(home: &TestHome, client: &str, path: &Path, entry: &Value) -> anyhow::Result<()> {
    let before = std::fs::read(path).ok();
    let out = home.cli(&["connect", client, "--json"]).await?.ok()?;
    let j = out.json()?;
    assert_eq!((j["action"].as_str(), j["path"].as_str()), (Some("added"), path.to_str()), "{out}");
    let doc = read_json(path)?;
    assert_eq!(doc["mcpServers"]["coffer"], *entry, "{doc}");
    let after_first = std::fs::read(path)?;
    let bak = PathBuf::from(format!("{}.bak", path.display()));
    match &before {
        Some(b) => assert_eq!(&std::fs::read(&bak)?, b, "the file as it was is kept as .bak"),
        None => ensure!(!bak.exists(), "no backup of a file that did not exist"),
    }

    // Twice is once: nothing is written.
    let out = home.cli(&["connect", client]).await?.ok()?;
    ensure!(out.stdout.contains("already connected"), "{out}");
    assert_eq!(std::fs::read(path)?, after_first, "connecting again rewrote the file");

    let out = home.cli(&["connect", client, "--remove"]).await?.ok()?;
    ensure!(out.stdout.contains("Removed"), "{out}");
    let doc = read_json(path)?;
    ensure!(doc["mcpServers"].get("coffer").is_none(), "{doc}");
    let out = home.cli(&["connect", client, "--remove", "--json"]).await?.ok()?;
    assert_eq!(out.json()?["action"], "absent");
    Ok(())
}

#[tokio::test]
async fn connect_cursor_and_claude_desktop_files() -> anyhow::Result<()> {
    let mut home = TestHome::new()?;
    let user = user_home(&home)?;
    let shim = shim()?;
    let env = json!({"COFFER_HOME": coffer_home(&home)});

    // Cursor: an existing file with other servers and keys, indented with four spaces.
    let cursor = user.join(".cursor/mcp.json");
    std::fs::create_dir_all(cursor.parent().context("parent")?)?;
    let original = "{\n    \"mcpServers\": {\n        \"fs\": {\"command\": \"npx\", \"args\": [\"-y\", \"fs\"]}\n    },\n    \"theme\": \"dark\"\n}\n";
    std::fs::write(&cursor, original)?;
    round_trip(&home, "cursor", &cursor, &json!({"command": shim, "args": [], "env": env})).await?;
    let doc = read_json(&cursor)?;
    assert_eq!(doc, json!({"mcpServers": {"fs": {"command": "npx", "args": ["-y", "fs"]}}, "theme": "dark"}));
    let text = std::fs::read_to_string(&cursor)?;
    ensure!(text.starts_with("{\n    \"mcpServers\""), "the file's indentation is kept: {text}");
    assert_eq!(std::fs::read_to_string(user.join(".cursor/mcp.json.bak"))?, original, "the first .bak is kept");

    // Claude Desktop: no file yet.
    let desktop = user.join(".config/Claude/claude_desktop_config.json");
    round_trip(&home, "claude-desktop", &desktop, &json!({"command": shim, "args": [], "env": env})).await?;
    assert_eq!(read_json(&desktop)?, json!({"mcpServers": {}}));

    // --print changes nothing and prints the snippet.
    let before = std::fs::read(&cursor)?;
    let out = home.cli(&["connect", "cursor", "--print"]).await?.ok()?;
    let snippet: Value = serde_json::from_str(&out.stdout).with_context(|| out.to_string())?;
    assert_eq!(snippet, json!({"mcpServers": {"coffer": {"command": shim, "args": [], "env": env}}}));
    assert_eq!(std::fs::read(&cursor)?, before);

    // A file that does not parse is left alone.
    std::fs::write(&cursor, "{ not json")?;
    let out = home.cli(&["connect", "cursor"]).await?;
    assert_eq!(out.code, Some(1), "{out}");
    ensure!(out.stderr.contains("mcp.json") && out.stderr.contains("left as it is"), "{out}");
    assert_eq!(std::fs::read_to_string(&cursor)?, "{ not json");

    // With the default home (no COFFER_HOME, no --home) the shim finds it alone: no env.
    home.unset_env("COFFER_HOME");
    std::fs::remove_file(&cursor)?;
    home.cli(&["connect", "cursor"]).await?.ok()?;
    assert_eq!(read_json(&cursor)?["mcpServers"]["coffer"], json!({"command": shim, "args": []}));
    // --home is written as an absolute path, whatever the folder connect ran in.
    let out = home.cli(&["--home", "relative/vault", "connect", "cursor", "--json"]).await?.ok()?;
    assert_eq!(out.json()?["action"], "updated", "{out}");
    let written =
        read_json(&cursor)?["mcpServers"]["coffer"]["env"]["COFFER_HOME"].as_str().unwrap_or_default().to_owned();
    ensure!(written.starts_with('/') && written.ends_with("relative/vault"), "{written}");
    assert!(home.processes().is_empty(), "connect starts no daemon");
    Ok(())
}

#[tokio::test]
async fn connect_claude_code_and_codex() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let user = user_home(&home)?;
    let shim = shim()?;
    let system_path = std::env::var("PATH").unwrap_or_default();
    let ch = coffer_home(&home);

    // Without `claude` on PATH: ~/.claude.json is edited, keeping the rest of it.
    let no_claude = home.temp().join("no-claude-bin");
    std::fs::create_dir_all(&no_claude)?;
    let claude_json = user.join(".claude.json");
    std::fs::write(&claude_json, json!({"numStartups": 3, "projects": {"/p": {"mcpServers": {}}}}).to_string())?;
    let path_without = no_claude.display().to_string();
    let out = cli_env(&home, &["connect", "claude-code", "--json"], &[("PATH", &path_without)]).await?.ok()?;
    assert_eq!(out.json()?["via"], "file", "{out}");
    let doc = read_json(&claude_json)?;
    assert_eq!(
        doc["mcpServers"]["coffer"],
        json!({"type": "stdio", "command": shim, "args": [], "env": {"COFFER_HOME": ch}})
    );
    assert_eq!((doc["numStartups"].as_u64(), &doc["projects"]), (Some(3), &json!({"/p": {"mcpServers": {}}})));
    let out = cli_env(&home, &["connect", "claude-code", "--remove"], &[("PATH", &path_without)]).await?.ok()?;
    ensure!(out.stdout.contains("Removed"), "{out}");

    // With a `claude` on PATH, its own CLI is used (a stand-in that records its arguments).
    let (bin, log) = fake_claude(&home)?;
    let path_with = format!("{}:{system_path}", bin.display());
    let out = cli_env(&home, &["connect", "claude-code", "--json"], &[("PATH", &path_with)]).await?.ok()?;
    assert_eq!((out.json()?["via"].as_str(), out.json()?["action"].as_str()), (Some("claude"), Some("added")));
    assert_eq!(
        std::fs::read_to_string(&log)?,
        format!("mcp add --scope user coffer --env COFFER_HOME={ch} -- {shim}\n")
    );
    let out = cli_env(&home, &["connect", "claude-code", "--print"], &[("PATH", &path_with)]).await?.ok()?;
    assert_eq!(out.stdout, format!("claude mcp add --scope user coffer --env COFFER_HOME={ch} -- {shim}\n"));

    // Codex: CODEX_HOME points into the test home; comments and other tables survive.
    let codex_home = home.temp().join("codex-home");
    std::fs::create_dir_all(&codex_home)?;
    let toml = codex_home.join("config.toml");
    let original =
        "# my settings\nmodel = \"o3\"\n\n[mcp_servers.docs]\ncommand = \"npx\"\nargs = [\"-y\", \"docs\"]\n";
    std::fs::write(&toml, original)?;
    let env = [("CODEX_HOME", codex_home.to_str().context("utf-8")?)];
    let out = cli_env(&home, &["connect", "codex"], &env).await?.ok()?;
    ensure!(out.stdout.contains("Connected codex"), "{out}");
    let text = std::fs::read_to_string(&toml)?;
    ensure!(
        text.contains(&format!(
            "[mcp_servers.coffer]\ncommand = \"{shim}\"\nargs = []\nenv = {{ COFFER_HOME = \"{ch}\" }}\n"
        )),
        "{text}"
    );
    ensure!(text.starts_with("# my settings\nmodel = \"o3\"\n") && text.contains("[mcp_servers.docs]"), "{text}");
    let out = cli_env(&home, &["connect", "codex"], &env).await?.ok()?;
    ensure!(out.stdout.contains("already connected"), "{out}");
    cli_env(&home, &["connect", "codex", "--remove"], &env).await?.ok()?;
    assert_eq!(std::fs::read_to_string(&toml)?, original);
    assert!(!user.join(".codex").exists(), "$HOME/.codex untouched when CODEX_HOME is set");
    Ok(())
}

/// `coffer connect <client> --profile NAME` (issue 36 §1) writes the profile as the shim's
/// `--profile NAME` arguments for every client; again is unchanged; without `--profile` the
/// entry goes back to no arguments; a malformed name is refused before anything is written.
#[tokio::test]
async fn connect_with_a_profile_writes_it_for_every_client() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let user = user_home(&home)?;
    let shim = shim()?;
    let ch = coffer_home(&home);
    let no_claude = home.temp().join("no-claude-bin");
    std::fs::create_dir_all(&no_claude)?;
    let codex_home = home.temp().join("codex-home");
    std::fs::create_dir_all(&codex_home)?;
    let path_without = no_claude.display().to_string();
    let env = [("PATH", path_without.as_str()), ("CODEX_HOME", codex_home.to_str().context("utf-8")?)];
    let profiled = json!(["--profile", "work"]);
    for (client, file, section) in [
        ("cursor", user.join(".cursor/mcp.json"), "mcpServers"),
        ("claude-desktop", user.join(".config/Claude/claude_desktop_config.json"), "mcpServers"),
        ("vscode", user.join(".config/Code/User/mcp.json"), "servers"),
        ("claude-code", user.join(".claude.json"), "mcpServers"),
    ] {
        let out = cli_env(&home, &["connect", client, "--profile", "work", "--json"], &env).await?.ok()?;
        assert_eq!((out.json()?["action"].as_str(), out.json()?["profile"].as_str()), (Some("added"), Some("work")));
        let entry = &read_json(&file)?[section]["coffer"];
        assert_eq!((&entry["command"], &entry["args"]), (&json!(shim), &profiled), "{client}: {entry}");
        let out = cli_env(&home, &["connect", client, "--profile", "work"], &env).await?.ok()?;
        ensure!(out.stdout.contains("with the profile work") && out.stdout.contains("nothing changed"), "{out}");
        let out = cli_env(&home, &["connect", client, "--json"], &env).await?.ok()?;
        assert_eq!(out.json()?["action"], "updated", "{client}: dropping the profile changes the entry");
        assert_eq!(read_json(&file)?[section]["coffer"]["args"], json!([]), "{client}");
    }
    // Codex's TOML.
    let toml = codex_home.join("config.toml");
    cli_env(&home, &["connect", "codex", "--profile", "work"], &env).await?.ok()?;
    let text = std::fs::read_to_string(&toml)?;
    ensure!(
        text.contains(&format!(
            "[mcp_servers.coffer]\ncommand = \"{shim}\"\nargs = [\"--profile\", \"work\"]\nenv = {{ COFFER_HOME = \"{ch}\" }}\n"
        )),
        "{text}"
    );
    let out = cli_env(&home, &["connect", "codex", "--profile", "work"], &env).await?.ok()?;
    ensure!(out.stdout.contains("nothing changed"), "{out}");
    // Claude Code through its own CLI: the profile follows the shim after `--`.
    let (bin, _) = fake_claude(&home)?;
    let with = [("PATH", bin.to_str().context("utf-8")?)];
    let out = cli_env(&home, &["connect", "claude-code", "--profile", "work", "--print"], &with).await?.ok()?;
    assert_eq!(
        out.stdout,
        format!("claude mcp add --scope user coffer --env COFFER_HOME={ch} -- {shim} --profile work\n")
    );
    // A malformed name: refused, nothing written.
    let before = std::fs::read(user.join(".cursor/mcp.json"))?;
    let out = cli_env(&home, &["connect", "cursor", "--profile", "Work!"], &env).await?;
    ensure!(out.code != Some(0) && out.stderr.contains("--profile: profile name \"Work!\""), "{out}");
    assert_eq!(std::fs::read(user.join(".cursor/mcp.json"))?, before);
    // No daemon ran so far, and none was started for a check: no warning above. With one
    // running, a profile it does not have is written (it may be created later) with a warning.
    ensure!(!cli_env(&home, &["connect", "cursor", "--profile", "work"], &env).await?.ok()?.stderr.contains("warning"));
    home.start_daemon().await?;
    let out = cli_env(&home, &["connect", "cursor", "--profile", "nosuch"], &env).await?.ok()?;
    ensure!(
        out.stderr.contains("warning: Coffer has no profile nosuch (it has: default)")
            && out.stderr.contains("coffer profile create nosuch"),
        "{out}"
    );
    assert_eq!(
        read_json(&user.join(".cursor/mcp.json"))?["mcpServers"]["coffer"]["args"],
        json!(["--profile", "nosuch"])
    );
    let out = cli_env(&home, &["connect", "cursor", "--profile", "default"], &env).await?.ok()?;
    ensure!(!out.stderr.contains("warning"), "{out}");
    Ok(())
}
