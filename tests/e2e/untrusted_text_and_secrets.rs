//! Untrusted text and secrets, end to end on real daemons through the real CLI: an upstream's
//! terminal escapes are shown and not obeyed, the audit log records how a request was
//! authenticated whatever `X-Coffer-Actor` says, secret-looking upstream arguments are refused
//! unless allowed, and a fact that gives a password is refused unless allowed.
use anyhow::{Context, ensure};
use coffer_tests::mcp::register_stdio;
use coffer_tests::{SendExt, TestHome};
use reqwest::Method;
use serde_json::{Value, json};

/// An OSC 52 clipboard write, a window title, a screen clear, an 8-bit CSI, a right-to-left
/// override and an isolate: what a hostile upstream or title would send a terminal.
const HOSTILE: &str = "clip\u{1b}]52;c;cm0gLXJmIH4=\u{7} title\u{1b}]0;pwned\u{7} clear\u{1b}[2J csi\u{9b}31m rlo\u{202e}txt.exe iso\u{2066}x\u{2069}";

/// True when `s` holds nothing that drives a terminal or reorders text (line breaks and tabs
/// aside).
fn inert(s: &str) -> bool {
    !s.chars().any(|c| {
        (c.is_control() && c != '\n' && c != '\t')
            || matches!(c, '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    })
}

/// The escaped form the CLI shows for [`HOSTILE`]'s first sequences.
const SHOWN: &[&str] = &["\\u001b]52;c;cm0gLXJmIH4=\\u0007", "\\u001b]0;pwned\\u0007", "\\u009b31m", "\\u202etxt.exe"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstreams_terminal_escapes_are_shown_not_obeyed() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?;
    register_stdio(&api, "evil", &tiny, &[], json!({"TINY_ECHO_ENV": HOSTILE, "TINY_SERVER_NAME": HOSTILE})).await?;
    let args = json!({"message": HOSTILE}).to_string();

    // tools call: the text result, and --json (valid JSON, the same text, no raw escapes).
    let out = home.cli(&["tools", "call", "evil__echo", "--args", &args]).await?.ok()?;
    ensure!(inert(&out.stdout) && inert(&out.stderr), "raw escapes printed: {out:?}");
    for s in SHOWN {
        ensure!(out.stdout.contains(s), "{s} not shown: {}", out.stdout);
    }
    let out = home.cli(&["tools", "call", "evil__echo", "--json", "--args", &args]).await?.ok()?;
    ensure!(inert(&out.stdout), "raw escapes in --json: {:?}", out.stdout);
    ensure!(out.json()?["content"][0]["text"] == HOSTILE, "--json keeps the value: {}", out.stdout);

    // mcp test: the upstream's serverInfo name.
    let out = home.cli(&["mcp", "test", "evil"]).await?.ok()?;
    ensure!(inert(&out.stdout) && out.stdout.contains("\\u001b]0;pwned\\u0007"), "{out}");

    // mcp logs: what the upstream wrote on stderr.
    home.cli(&["tools", "call", "evil__stderr_env"]).await?.ok()?;
    let wanted = |o: &coffer_tests::CliOutput| o.stdout.contains("TINY_ECHO_ENV=");
    let out =
        coffer_tests::wait_for("the upstream's stderr in its log", std::time::Duration::from_secs(20), || async {
            let o = home.cli(&["mcp", "logs", "evil"]).await?.ok()?;
            Ok(wanted(&o).then_some(o))
        })
        .await?;
    ensure!(inert(&out.stdout), "raw escapes from the log: {:?}", out.stdout);
    ensure!(out.stdout.contains("\\u001b]52;c;cm0gLXJmIH4=\\u0007"), "{}", out.stdout);
    let out = home.cli(&["mcp", "logs", "evil", "--json"]).await?.ok()?;
    ensure!(inert(&out.stdout), "raw escapes in --json logs: {:?}", out.stdout);
    for line in out.stdout.lines() {
        serde_json::from_str::<Value>(line).with_context(|| format!("not JSON: {line:?}"))?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_titles_right_to_left_override_is_shown_not_obeyed() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = coffer_tests::chat::start_daemon(&home).await?;
    let title = "invoice\u{202e}fdp.exe\u{1b}]0;t\u{7}";
    let r = api.post_json("/v1/conversations", &json!({"agent_key": "scripted", "title": title})).reply().await?;
    ensure!(r.status.is_success(), "{} {}", r.status, r.text);
    let out = home.cli(&["chat", "list"]).await?.ok()?;
    ensure!(inert(&out.stdout) && out.stdout.contains("invoice\\u202efdp.exe\\u001b]0;t\\u0007"), "{out}");
    let out = home.cli(&["chat", "list", "--json"]).await?.ok()?;
    ensure!(inert(&out.stdout), "{:?}", out.stdout);
    ensure!(out.json()?["items"][0]["title"] == title, "{}", out.stdout);
    Ok(())
}

/// A forged `X-Coffer-Actor` is only a label: the audit entry records how the request was
/// authenticated (the token, or the web session by a hash of its id), and `coffer audit` shows
/// both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_records_how_a_request_was_authenticated_not_who_it_claims_to_be() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let r = api
        .request(Method::PUT, "/v1/credentials/forged")
        .header("X-Coffer-Actor", "channel")
        .json(&json!({"value": "v-1234567890"}))
        .reply()
        .await?;
    ensure!(r.status.is_success(), "{} {}", r.status, r.text);
    let audit = api.get("/v1/audit?action=credential.set").reply().await?.ok_json()?;
    let e = &audit["items"][0];
    ensure!(e["target"] == "forged" && e["actor"] == "channel" && e["auth"] == "token", "{e}");

    // A web session: its hash, never the id.
    let web = coffer_tests::console::login(&api).await?;
    let session = web.cookie.strip_prefix("coffer_session=").context("a session cookie")?.to_owned();
    let r = web
        .request(&api, Method::PUT, "/v1/credentials/via-session")
        .header("X-Coffer-Actor", "cli")
        .json(&json!({"value": "v-0987654321"}))
        .reply()
        .await?;
    ensure!(r.status.is_success(), "{} {}", r.status, r.text);
    let audit = api.get("/v1/audit?action=credential.set").reply().await?.ok_json()?;
    let e = &audit["items"][0];
    let auth = e["auth"].as_str().unwrap_or_default();
    ensure!(e["target"] == "via-session" && e["actor"] == "cli", "{e}");
    ensure!(auth.starts_with("session:") && auth.len() == "session:".len() + 12, "{e}");
    ensure!(!audit.to_string().contains(&session), "never the session id");

    // The CLI shows the column, and --json carries it.
    let out = home.cli(&["audit", "--action", "credential.set"]).await?.ok()?;
    ensure!(out.stdout.lines().next().is_some_and(|h| h.contains("AUTH")), "{out}");
    ensure!(out.stdout.contains(auth) && out.stdout.contains("token"), "{out}");
    let out = home.cli(&["audit", "--action", "credential.set", "--json"]).await?.ok()?;
    ensure!(out.json()?["items"][1]["auth"] == "token", "{}", out.stdout);
    Ok(())
}

/// Secret-looking upstream arguments are refused over REST and by `coffer mcp add`, naming the
/// argument and never its value; `allow_secret_args` / `--allow-secret-args` keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_looking_upstream_arguments_are_refused_unless_allowed() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?.display().to_string();
    let token = "ghp_16C7e42F292c6912E7710c838347Ae178B4a";
    for args in [json!(["--api-key", token]), json!(["--token=hunter2-Xy9!kQ"]), json!(["postgres://app:pw-123@db/x"])]
    {
        let body = json!({"name": "leaky", "command": tiny, "args": args});
        let r = api.post_json("/v1/mcp/servers", &body).reply().await?;
        ensure!(r.status == 400, "{args}: {} {}", r.status, r.text);
        let e: Value = serde_json::from_str(&r.text)?;
        ensure!(
            e["error"]["code"] == "INVALID_ARGUMENT"
                && e["error"]["details"]["field"] == "args"
                && e["error"]["details"]["reason"] == "secret_in_args",
            "{e}"
        );
        ensure!(!r.text.contains(token) && !r.text.contains("hunter2") && !r.text.contains("pw-123"), "{}", r.text);
    }
    let r = api.get("/v1/mcp/servers/leaky").reply().await?;
    ensure!(r.status == 404, "nothing registered: {}", r.status);

    // PATCH too; with the flag the argument is kept.
    let ok = json!({"name": "leaky", "command": tiny, "args": ["--verbose"]});
    ensure!(api.post_json("/v1/mcp/servers", &ok).reply().await?.status == 201);
    let r = api
        .request(Method::PATCH, "/v1/mcp/servers/leaky")
        .json(&json!({"args": ["--api-key", token]}))
        .reply()
        .await?;
    ensure!(r.status == 400 && r.text.contains("args[1] (the value of --api-key)"), "{} {}", r.status, r.text);
    let r = api
        .request(Method::PATCH, "/v1/mcp/servers/leaky")
        .json(&json!({"args": ["--api-key", token], "allow_secret_args": true}))
        .reply()
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);

    // The CLI: refused with the message, exit 2; kept with --allow-secret-args.
    let out = home.cli(&["mcp", "add", "cli-leaky", "--no-wait", "--", &tiny, "--api-key", token]).await?;
    ensure!(out.code == Some(2), "{out}");
    ensure!(out.stderr.contains("looks like a secret") && out.stderr.contains("--allow-secret-args"), "{out}");
    ensure!(!out.stderr.contains(token), "{out}");
    let out = home
        .cli(&["mcp", "add", "cli-leaky", "--no-wait", "--allow-secret-args", "--", &tiny, "--api-key", token])
        .await?;
    ensure!(out.success(), "{out}");
    Ok(())
}

/// A fact that gives a password in prose is refused over REST and by the CLI (naming the
/// pattern, never the value); ordinary sentences about passwords are remembered; the explicit
/// override stores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fact_that_gives_a_password_is_refused_unless_allowed() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let secret = "The staging DB password is hunter2-Xy9!kQ";
    let out = home.cli(&["memory", "remember", secret]).await?;
    ensure!(out.code == Some(2), "{out}");
    ensure!(out.stderr.contains("password") && out.stderr.contains("--allow-secret"), "{out}");
    ensure!(!out.stderr.contains("hunter2"), "never the value: {out}");
    let r = api.post_json("/v1/memory", &json!({"text": "the wifi PIN is 4821"})).reply().await?;
    ensure!(r.status == 400 && !r.text.contains("4821"), "{} {}", r.status, r.text);

    let out = home.cli(&["memory", "remember", "The password policy is strict: twelve characters minimum"]).await?;
    ensure!(out.success(), "ordinary prose is remembered: {out}");

    let out = home.cli(&["memory", "remember", "--allow-secret", "--json", secret]).await?.ok()?;
    ensure!(out.json()?["fact"]["text"] == secret, "{}", out.stdout);
    Ok(())
}
