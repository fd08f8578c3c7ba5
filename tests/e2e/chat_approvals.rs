//! Approvals (issue 34 §1) end to end: permission modes and approval requests through the edge of
//! a real daemon. The scripted agent (`coffer-test-daemon scripted-chat`, its `APPROVE[Tool: text]`
//! line) covers the REST contract and its faults fast: the request as an event and in the view,
//! answers over REST (first wins, 409 `ALREADY_DECIDED` naming the first, 404, 400 naming the
//! field), the list's `approvals_waiting`, the timeout, an interrupt, `read_only`, a kill -9 of
//! coffer-chat with a request open. The real Claude Code (pinned, and 2.1.197) and the real Codex
//! against the fake model APIs prove the agents' own wire: a denied Bash command does not run and
//! the model is told, an allowed one runs, `allow_always` stops asking, `read_only` refuses.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::chat::{self, rest_send as send};
use coffer_tests::{Api, SendExt, TestHome};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// Sets `chat.approval_timeout_s` and restarts the chat service (it reads settings before it
/// serves).
async fn approval_timeout(api: &Api, seconds: u32) -> anyhow::Result<()> {
    api.request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"chat.approval_timeout_s": seconds.to_string()}}))
        .reply()
        .await?
        .ok_json()?;
    let r = api.post("/v1/daemon/services/chat/restart").reply().await?;
    ensure!(r.status.is_success(), "restart chat: {} {}", r.status, r.text);
    coffer_tests::wait_for("chat healthy again", WAIT, || async {
        Ok((api.service("chat").await?["state"] == "healthy").then_some(()))
    })
    .await
}

/// A scripted conversation in `mode` (through REST).
async fn scripted(api: &Api, mode: &str) -> anyhow::Result<String> {
    let body = json!({"agent_key": chat::SCRIPTED, "agent_config": {"permission_mode": mode}});
    let r = api.post_json("/v1/conversations", &body).reply().await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    let c = r.json()?;
    ensure!(c["agent_config"]["permission_mode"] == mode.replace('-', "_"), "{c}");
    Ok(c["id"].as_str().context("id")?.to_owned())
}

/// The conversation's view.
async fn view(api: &Api, id: &str) -> anyhow::Result<Value> {
    api.get(&format!("/v1/conversations/{id}")).reply().await?.ok_json()
}

/// Waits until the conversation has `n` open approval requests; their objects.
pub async fn open_approvals(api: &Api, id: &str, n: usize) -> anyhow::Result<Vec<Value>> {
    coffer_tests::wait_for(&format!("{n} open approval request(s)"), WAIT, || async {
        let v = view(api, id).await?;
        let open = v["approvals"].as_array().cloned().unwrap_or_default();
        Ok((open.len() == n).then_some(open))
    })
    .await
}

/// Waits until no turn runs; the view.
pub async fn idle(api: &Api, id: &str) -> anyhow::Result<Value> {
    coffer_tests::wait_for("the turn to end", WAIT, || async {
        let v = view(api, id).await?;
        // Nothing running and nothing waiting: a message just sent may still be queued (the
        // engine takes it a moment later), and its turn has not started yet.
        let c = &v["conversation"];
        Ok((c["turn_running"] == false && c["pending_count"] == 0).then_some(v))
    })
    .await
}

/// `POST …/approvals/{number}` with `body`: the reply.
pub async fn answer(api: &Api, id: &str, number: &Value, body: Value) -> anyhow::Result<coffer_tests::Reply> {
    api.post_json(&format!("/v1/conversations/{id}/approvals/{number}"), &body).reply().await
}

/// The last assistant message's text.
fn last_text(v: &Value) -> String {
    let msgs = v["messages"].as_array().cloned().unwrap_or_default();
    let Some(m) = msgs.iter().rev().find(|m| m["role"] == "assistant") else { return String::new() };
    m["blocks"].as_array().into_iter().flatten().filter_map(|b| b["text"].as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_over_rest_with_the_scripted_agent() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let id = scripted(&api, "ask").await?;
    let mut c = chat::client(&api).await?;
    let mut w = chat::watch(&mut c, &id, 0).await?;

    send(&api, &id, "APPROVE[Bash: rm -rf build]\nAPPROVE[Write: /tmp/x]").await?;
    let asked = w.until_kind("approval_requested").await?;
    let event = asked.last().context("event")?;
    let open = open_approvals(&api, &id, 1).await?;
    let a = &open[0];
    assert_eq!(
        (a["number"].as_u64(), &a["tool"], &a["summary"]),
        (Some(event.seq), &json!("Bash"), &json!("Bash: rm -rf build"))
    );
    assert_eq!(a["input"], json!({"command": "rm -rf build"}));
    assert!(a["expires_ms"].as_i64() > a["requested_ms"].as_i64(), "{a}");
    let list = api.get("/v1/conversations").reply().await?.ok_json()?;
    assert_eq!(list["items"][0]["approvals_waiting"], 1, "{list}");

    // Malformed answers name the field; an unknown number is 404.
    let n = &a["number"];
    let e = answer(&api, &id, n, json!({"decision": "yes"})).await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    assert!(e["message"].as_str().unwrap_or("").contains("allow, allow_always, deny"), "{e}");
    answer(&api, &id, n, json!({})).await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    answer(&api, &id, n, json!({"decision": "deny", "why": 1})).await?.expect_envelope(400, "UNKNOWN_FIELD")?;
    answer(&api, &id, n, json!({"decision": 5})).await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    let e = answer(&api, &id, &json!("abc"), json!({"decision": "deny"}))
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    assert!(e["message"].as_str().unwrap_or("").contains("number"), "{e}");
    answer(&api, &id, &json!(999_999), json!({"decision": "deny"})).await?.expect_envelope(404, "NOT_FOUND")?;

    // The first answer wins; the second is 409 naming the first.
    let r = answer(&api, &id, n, json!({"decision": "deny", "message": "not on this box"})).await?.ok_json()?;
    assert_eq!(
        r,
        json!({"number": n, "decision": "deny", "message": "not on this box", "decided_by": "api", "actor": "daemon token"})
    );
    let e = answer(&api, &id, n, json!({"decision": "allow"})).await?.expect_envelope(409, "ALREADY_DECIDED")?;
    assert_eq!((&e["details"]["decision"], &e["details"]["decided_by"]), (&json!("deny"), &json!("api")), "{e}");
    let resolved = w.until_kind("approval_resolved").await?;
    assert_eq!(resolved.last().map(chat::kind), Some("approval_resolved"));

    let second = open_approvals(&api, &id, 1).await?;
    assert_eq!(second[0]["tool"], "Write");
    let n2 = second[0]["number"].clone();
    let r = api
        .post_json(&format!("/v1/conversations/{id}/approvals/{n2}"), &json!({"decision": "allow"}))
        .header("x-coffer-actor", "cli")
        .reply()
        .await?
        .ok_json()?;
    assert_eq!(r["decided_by"], "cli");
    let v = idle(&api, &id).await?;
    assert_eq!(last_text(&v), "denied: not on this box\napproved\n");
    assert_eq!(v["conversation"]["approvals_waiting"], 0);
    // After the turn: decided, still 409.
    answer(&api, &id, &n2, json!({"decision": "deny"})).await?.expect_envelope(409, "ALREADY_DECIDED")?;

    // The audit log holds every decision with its surface.
    let audit = api.get("/v1/audit?action=chat.approval").reply().await?.ok_json()?;
    let items = audit["items"].as_array().context("audit items")?;
    assert_eq!(items.len(), 2, "{audit}");
    assert!(items.iter().any(|i| i["actor"] == "cli") && items.iter().any(|i| i["actor"] == "api"), "{audit}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_interrupt_read_only_and_mode_changes() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    approval_timeout(&api, 2).await?;
    let id = scripted(&api, "ask").await?;

    // Unanswered: denied by itself, decided_by timeout.
    send(&api, &id, "APPROVE[Bash: touch a]").await?;
    let open = open_approvals(&api, &id, 1).await?;
    let v = idle(&api, &id).await?;
    assert!(last_text(&v).starts_with("denied: No answer within 2 s"), "{}", last_text(&v));
    let e = answer(&api, &id, &open[0]["number"], json!({"decision": "allow"}))
        .await?
        .expect_envelope(409, "ALREADY_DECIDED")?;
    assert_eq!(e["details"]["decided_by"], "timeout");

    // An interrupt denies what is open.
    approval_timeout(&api, 600).await?;
    send(&api, &id, "APPROVE[Bash: touch b]").await?;
    let open = open_approvals(&api, &id, 1).await?;
    let r = api.post_json(&format!("/v1/conversations/{id}/interrupt"), &json!({})).reply().await?.ok_json()?;
    assert_eq!(r["interrupted"], true);
    let e = answer(&api, &id, &open[0]["number"], json!({"decision": "allow"}))
        .await?
        .expect_envelope(409, "ALREADY_DECIDED")?;
    assert_eq!(e["details"]["decided_by"], "interrupt");
    idle(&api, &id).await?;

    // read_only (set by PATCH, from the next turn): refused without asking.
    let patch =
        |body: Value| api.request(reqwest::Method::PATCH, &format!("/v1/conversations/{id}")).json(&body).reply();
    let r = patch(json!({"permission_mode": "read-only"})).await?;
    assert_eq!(r.ok_json()?["agent_config"]["permission_mode"], "read_only");
    let e = patch(json!({"permission_mode": "sometimes"})).await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    assert!(e["message"].as_str().unwrap_or("").contains("permission_mode"), "{e}");
    // The queue paused after the interrupt: resume it with the next message.
    api.request(reqwest::Method::PUT, &format!("/v1/conversations/{id}/pending"))
        .json(&json!({"items": []}))
        .reply()
        .await?
        .ok_json()?;
    send(&api, &id, "APPROVE[Bash: rm -rf /]").await?;
    let v = idle(&api, &id).await?;
    assert!(
        last_text(&v).starts_with("denied: This conversation is read-only"),
        "{}",
        serde_json::to_string_pretty(&v).unwrap()
    );
    assert_eq!(v["approvals"], json!([]));
    let e = api
        .post_json(
            "/v1/conversations",
            &json!({"agent_key": chat::SCRIPTED, "agent_config": {"permission_mode": "never"}}),
        )
        .reply()
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    assert!(e["message"].as_str().unwrap_or("").contains("agent_config.permission_mode"), "{e}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_service_killed_with_a_request_open_fails_the_turn() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let id = scripted(&api, "ask").await?;
    send(&api, &id, "APPROVE[Bash: rm -rf build]").await?;
    let open = open_approvals(&api, &id, 1).await?;
    let before = api.service("chat").await?["pid"].as_i64().context("chat pid")? as i32;
    let p = coffer_tests::procs::proc_info(before).context("the chat service's process")?;
    ensure!(p.name == "coffer-test-chat", "pid {before} is {}", p.name);
    coffer_tests::procs::signal(before, nix::sys::signal::Signal::SIGKILL);
    coffer_tests::wait_for("coffer-chat to be restarted", WAIT, || async {
        let s = api.service("chat").await?;
        Ok((s["pid"].as_i64().is_some_and(|p| p as i32 != before) && s["state"] == "healthy").then_some(()))
    })
    .await?;
    let v = coffer_tests::wait_for("the conversation to answer again", WAIT, || async {
        let r = api.get(&format!("/v1/conversations/{id}")).reply().await?;
        (r.status == 200).then(|| r.json()).transpose()
    })
    .await?;
    let msgs = v["messages"].as_array().context("messages")?;
    assert_eq!(msgs.last().context("a message")?["status"], "failed", "{v}");
    assert_eq!((&v["approvals"], &v["conversation"]["approvals_waiting"]), (&json!([]), &json!(0)));
    let e =
        answer(&api, &id, &open[0]["number"], json!({"decision": "allow"})).await?.expect_envelope(404, "NOT_FOUND")?;
    assert!(e["message"].as_str().unwrap_or("").contains("restarted"), "{e}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_allowed_always_survives_a_kill_of_the_chat_service_until_forgotten() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let id = scripted(&api, "ask").await?;
    send(&api, &id, "APPROVE[Bash: ls]").await?;
    let open = open_approvals(&api, &id, 1).await?;
    answer(&api, &id, &open[0]["number"], json!({"decision": "allow_always"})).await?.ok_json()?;
    let v = idle(&api, &id).await?;
    ensure!(last_text(&v).contains("approved"), "{v}");
    let tools = &v["allowed_tools"];
    ensure!(tools.as_array().map(Vec::len) == Some(1) && tools[0]["tool"] == "Bash", "{v}");
    ensure!(tools[0]["allowed_ms"].as_i64().is_some_and(|t| t > 0), "{v}");

    // kill -9 between the two requests for the same tool: the store kept it.
    let before = api.service("chat").await?["pid"].as_i64().context("chat pid")? as i32;
    ensure!(coffer_tests::procs::proc_info(before).context("the chat service")?.name == "coffer-test-chat");
    coffer_tests::procs::signal(before, nix::sys::signal::Signal::SIGKILL);
    coffer_tests::wait_for("coffer-chat to be restarted", WAIT, || async {
        let s = api.service("chat").await?;
        Ok((s["pid"].as_i64().is_some_and(|p| p as i32 != before) && s["state"] == "healthy").then_some(()))
    })
    .await?;
    let v = view(&api, &id).await?;
    ensure!(v["allowed_tools"][0]["tool"] == "Bash", "listed after the restart: {v}");
    send(&api, &id, "APPROVE[Bash: ls again]").await?;
    let v = idle(&api, &id).await?;
    ensure!(last_text(&v).contains("approved"), "allowed without asking after the restart: {v}");
    ensure!(v["approvals"] == json!([]), "{v}");

    // `chat show` lists it; `chat forget-tools` forgets it: the next request asks again.
    let shown = home.cli(&["chat", "show", &id]).await?.ok()?.stdout;
    ensure!(shown.lines().any(|l| l.starts_with("allowed") && l.contains("Bash (")), "{shown}");
    let forgot = home.cli(&["chat", "forget-tools", &id]).await?.ok()?.stdout;
    ensure!(forgot.contains("Forgot 1 tool"), "{forgot}");
    let again = api.request(reqwest::Method::DELETE, &format!("/v1/conversations/{id}/allowed-tools")).reply().await?;
    ensure!(again.ok_json()?["forgotten"] == 0);
    send(&api, &id, "APPROVE[Bash: ls once more]").await?;
    let open = open_approvals(&api, &id, 1).await?;
    answer(&api, &id, &open[0]["number"], json!({"decision": "allow_always"})).await?.ok_json()?;
    idle(&api, &id).await?;

    // A change of the permission mode forgets them too; the same mode again does not.
    let patch = |mode: &str| {
        api.request(reqwest::Method::PATCH, &format!("/v1/conversations/{id}")).json(&json!({"permission_mode": mode}))
    };
    patch("ask").reply().await?.ok_json()?;
    ensure!(view(&api, &id).await?["allowed_tools"].as_array().map(Vec::len) == Some(1));
    patch("bypass").reply().await?.ok_json()?;
    ensure!(view(&api, &id).await?["allowed_tools"] == json!([]), "a new mode forgets them");
    let unknown = "01JDQ8ZKXW5T3M2N4P6R7S8T9V";
    api.request(reqwest::Method::DELETE, &format!("/v1/conversations/{unknown}/allowed-tools"))
        .reply()
        .await?
        .expect_envelope(404, "NOT_FOUND")?;
    Ok(())
}

// ------------------------------------------------------------------- the real Claude Code

/// A daemon whose chat service runs the Claude Code CLI `claude` offline against `fake`.
async fn claude_daemon(
    claude: &std::path::Path,
    fake: &coffer_tests::anthropic::FakeAnthropic,
) -> anyhow::Result<(TestHome, Api)> {
    let mut home = TestHome::new()?;
    chat::offline_claude_code(&mut home, &fake.url);
    let api = home.start_daemon().await?;
    let set = json!({"set": {"chat.claude_code_path": claude.display().to_string()}});
    api.request(reqwest::Method::PATCH, "/v1/settings").json(&set).reply().await?.ok_json()?;
    Ok((home, api))
}

/// Whether the model was told `text` in a tool result of a request after the first.
fn told(fake: &coffer_tests::anthropic::FakeAnthropic, text: &str) -> bool {
    fake.requests().iter().any(|r| {
        r.body["messages"].as_array().into_iter().flatten().any(|m| {
            m["content"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|b| b["type"] == "tool_result" && b.to_string().contains(text))
        })
    })
}

/// `ask` with a real Claude Code: a Bash command waits; denied, it does not run and the model is
/// told why; allowed, it runs; `allow_always` stops the asking for Bash; `read_only` refuses
/// without asking.
async fn claude_code_asks(claude: std::path::PathBuf) -> anyhow::Result<()> {
    let fake = coffer_tests::anthropic::FakeAnthropic::scripted().await?;
    let (home, api) = claude_daemon(&claude, &fake).await?;
    let cwd = home.temp().join("ws");
    std::fs::create_dir_all(&cwd)?;
    let body = json!({"agent_key": "claude_code", "agent_config": {"cwd": cwd, "permission_mode": "ask"}});
    let c = api.post_json("/v1/conversations", &body).reply().await?.json()?;
    let id = c["id"].as_str().context("id")?.to_owned();
    let touch = |name: &str| {
        let input = json!({"command": format!("touch {}", cwd.join(name).display())});
        format!("TOOL[Bash {input}]")
    };

    // Denied: the file is not made and the model hears the message.
    send(&api, &id, &touch("denied.txt")).await?;
    let open = open_approvals(&api, &id, 1).await?;
    assert_eq!(open[0]["tool"], "Bash");
    assert!(open[0]["summary"].as_str().unwrap_or("").starts_with("Bash: touch "), "{}", open[0]);
    answer(&api, &id, &open[0]["number"], json!({"decision": "deny", "message": "no files today"})).await?.ok_json()?;
    let v = idle(&api, &id).await?;
    assert!(!cwd.join("denied.txt").exists(), "a denied command ran");
    assert!(told(&fake, "no files today"), "the model was not told: {v}");
    assert_eq!(
        v["messages"].as_array().and_then(|m| m.last()).map(|m| m["status"].clone()),
        Some(json!("complete")),
        "{v}"
    );

    // Allowed: it runs. Always: the next Bash does not ask.
    send(&api, &id, &touch("allowed.txt")).await?;
    let open = open_approvals(&api, &id, 1).await?;
    answer(&api, &id, &open[0]["number"], json!({"decision": "allow_always"})).await?.ok_json()?;
    idle(&api, &id).await?;
    assert!(cwd.join("allowed.txt").exists(), "an allowed command did not run");
    send(&api, &id, &touch("again.txt")).await?;
    let v = idle(&api, &id).await?;
    assert!(cwd.join("again.txt").exists(), "allow_always did not allow the next Bash: {v}");

    // read_only: refused without asking (a new conversation: the fake's tool call ids repeat,
    // and a resumed session's history would hold the same id twice).
    let body = json!({"agent_key": "claude_code", "agent_config": {"cwd": cwd, "permission_mode": "read_only"}});
    let c = api.post_json("/v1/conversations", &body).reply().await?.json()?;
    let id = c["id"].as_str().context("id")?.to_owned();
    send(&api, &id, &touch("readonly.txt")).await?;
    let v = idle(&api, &id).await?;
    assert!(!cwd.join("readonly.txt").exists(), "read_only ran a command");
    assert!(told(&fake, "read-only"), "the model was not told the conversation is read-only: {v}");
    let audit = api.get("/v1/audit?action=chat.approval").reply().await?.ok_json()?;
    let by: Vec<String> = audit["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| i["detail"]["decided_by"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(by, ["read_only", "remembered", "api", "api"], "newest first: {audit}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_pinned_asks_before_bash() -> anyhow::Result<()> {
    claude_code_asks(coffer_tests::peers::claude_code()?).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_2_1_197_asks_before_bash() -> anyhow::Result<()> {
    claude_code_asks(coffer_tests::peers::claude_code_2_1_197()?).await
}

/// A turn of the real Claude Code interrupted while its request waits: denied `interrupt`, the
/// turn ends interrupted, no agent process is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_interrupted_while_asking() -> anyhow::Result<()> {
    let fake = coffer_tests::anthropic::FakeAnthropic::scripted().await?;
    let (home, api) = claude_daemon(&coffer_tests::peers::claude_code()?, &fake).await?;
    let body = json!({"agent_key": "claude_code", "agent_config": {"permission_mode": "ask"}});
    let c = api.post_json("/v1/conversations", &body).reply().await?.json()?;
    let id = c["id"].as_str().context("id")?.to_owned();
    send(&api, &id, r#"TOOL[Bash {"command": "touch never.txt"}]"#).await?;
    let open = open_approvals(&api, &id, 1).await?;
    let r = api.post_json(&format!("/v1/conversations/{id}/interrupt"), &json!({})).reply().await?.ok_json()?;
    assert_eq!(r["interrupted"], true);
    let e = answer(&api, &id, &open[0]["number"], json!({"decision": "allow"}))
        .await?
        .expect_envelope(409, "ALREADY_DECIDED")?;
    assert_eq!(e["details"]["decided_by"], "interrupt");
    idle(&api, &id).await?;
    coffer_tests::wait_for("no agent process left", WAIT, || async {
        Ok(home.pid_records().iter().all(|r| r.kind != "agent" || !coffer_tests::procs::alive(r.pid)).then_some(()))
    })
    .await?;
    Ok(())
}

/// `coffer chat new --mode`, `show`, `approve`, `deny`, `mode`, and `watch` on a pipe printing
/// the request with the commands that answer it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_answers_approvals_and_sets_the_mode() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let c = home.cli(&["chat", "new", "--agent", "scripted", "--mode", "ask", "--json"]).await?.ok()?.json()?;
    assert_eq!(c["agent_config"]["permission_mode"], "ask", "{c}");
    let id = c["id"].as_str().context("id")?.to_owned();
    let mut watch = home.cli_command(&["chat", "watch", &id])?.spawn()?;
    send(&api, &id, "APPROVE[Bash: rm -rf build]\nAPPROVE[Bash: ls]").await?;
    let open = open_approvals(&api, &id, 1).await?;
    let n = open[0]["number"].to_string();

    let shown = home.cli(&["chat", "show", &id]).await?.ok()?;
    assert!(shown.stdout.contains(&format!("? approval #{n}: Bash: rm -rf build")), "{}", shown.stdout);
    assert!(shown.stdout.contains(&format!("coffer chat deny {id} {n}")), "{}", shown.stdout);
    let denied = home.cli(&["chat", "deny", &id, &n, "--message", "not today"]).await?.ok()?;
    assert!(
        denied.stdout.contains(&format!("✗ approval #{n} denied by cli (daemon token): not today")),
        "{}",
        denied.stdout
    );
    let again = home.cli(&["chat", "approve", &id, &n]).await?;
    assert!(!again.success() && again.stderr.contains("already decided"), "{again:?}");
    let open = open_approvals(&api, &id, 1).await?;
    let n2 = open[0]["number"].to_string();
    let r = home.cli(&["chat", "approve", &id, &n2, "--always", "--json"]).await?.ok()?.json()?;
    assert_eq!((&r["decision"], &r["decided_by"]), (&json!("allow_always"), &json!("cli")));
    idle(&api, &id).await?;
    let m = home.cli(&["chat", "mode", &id, "read-only", "--json"]).await?.ok()?.json()?;
    assert_eq!(m["agent_config"]["permission_mode"], "read_only");
    let bad = home.cli(&["chat", "mode", &id, "sometimes"]).await?;
    assert!(!bad.success() && bad.stderr.contains("bypass"), "{bad:?}");

    // The watcher on a pipe printed the request and how to answer it.
    let _ = watch.start_kill();
    let out = watch.wait_with_output().await?;
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.contains(&format!("? approval #{n}: Bash: rm -rf build")), "{printed}");
    assert!(printed.contains(&format!("allow: coffer chat approve {id} {n}")), "{printed}");
    assert!(printed.contains(&format!("✗ approval #{n} denied by cli")), "{printed}");
    assert!(!printed.contains("[a]llow"), "no prompt on a pipe: {printed}");
    Ok(())
}
