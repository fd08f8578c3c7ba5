//! How channels fail and say why, end to end: a real daemon
//! (`coffer-test-daemon scripted-chat`: the real store, gateway and chat service with the
//! test-only `scripted` agent), channels written through REST and the CLI as a person would,
//! and the adapters talking to the fake Telegram Bot API and the fake SeaTalk Open Platform over
//! loopback HTTP. Covers: a bot token shared by two channels (refused at add/edit, and Telegram's
//! 409 for a second poller reported as a failure naming the cause); a SeaTalk app secret the
//! platform refuses (a `failed` adapter with the cause in `coffer channel list`, `status` and
//! `doctor`, not a `running` one losing every reply); the missing credential a `failed` status
//! names and `USED BY` in `coffer credentials list`; blank secrets and a `--cwd` that is no
//! folder refused at add/edit; non-text Telegram messages answered once; `status --json` with
//! the channels; `audit --action channel.*`.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_chat::channels::seatalk::{Client, SeatalkReplier};
use coffer_chat::channels::{ChannelError, Replier, StatusCell};
use coffer_tests::chat;
use coffer_tests::fake_seatalk::FakeSeatalk;
use coffer_tests::fake_telegram::FakeTelegram;
use coffer_tests::{Api, Reply, SendExt, TestHome, ports, wait_for};
use reqwest::Method;
use secrecy::SecretString;
use serde_json::{Value, json};

const TOKEN: &str = "4242:shared-token-AAAA1111";
const OTHER_TOKEN: &str = "4242:other-token-BBBB2222";
const APP_ID: &str = "fake-app-id";
const APP_SECRET: &str = "fake-app-secret-7f3a";
const WRONG_SECRET: &str = "wrong-app-secret-0c1d";
const SIGNING: &str = "signing-secret-e2e-44aa";
const OWNER: i64 = 1001;
const STRANGER: i64 = 2002;
const WAIT: Duration = Duration::from_secs(30);

async fn create(api: &Api, body: &Value) -> anyhow::Result<Reply> {
    api.post_json("/v1/channels", body).header("X-Coffer-Actor", "cli").reply().await
}

async fn patch(api: &Api, name: &str, body: &Value) -> anyhow::Result<Reply> {
    api.request(Method::PATCH, &format!("/v1/channels/{name}")).header("X-Coffer-Actor", "cli").json(body).reply().await
}

async fn put_credential(api: &Api, name: &str, value: &str) -> anyhow::Result<()> {
    let r = api
        .request(Method::PUT, &format!("/v1/credentials/{name}"))
        .header("X-Coffer-Actor", "cli")
        .json(&json!({ "value": value }))
        .reply()
        .await?;
    ensure!(r.status.is_success(), "PUT credential: {} {}", r.status, r.text);
    Ok(())
}

async fn channel(api: &Api, name: &str) -> anyhow::Result<Value> {
    api.get(&format!("/v1/channels/{name}")).reply().await?.ok_json()
}

async fn names(api: &Api) -> anyhow::Result<Vec<String>> {
    let list = api.get("/v1/channels").reply().await?.ok_json()?;
    Ok(list["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect())
}

/// Waits until channel `name`'s adapter satisfies `pred`; the channel.
async fn wait_adapter(api: &Api, name: &str, what: &str, pred: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
    wait_for(what, WAIT, || async {
        let v = channel(api, name).await?;
        Ok(pred(&v["adapter"]).then_some(v))
    })
    .await
}

/// Every log file of `home`, concatenated.
fn all_logs(home: &TestHome) -> String {
    let mut out = String::new();
    for e in std::fs::read_dir(home.logs_dir()).into_iter().flatten().flatten() {
        out.push_str(&String::from_utf8_lossy(&std::fs::read(e.path()).unwrap_or_default()));
    }
    out
}

fn telegram(fake: &FakeTelegram, name: &str, extra: Value) -> Value {
    let mut b = json!({"name": name, "kind": "telegram", "api_base_url": fake.url, "default_agent": chat::SCRIPTED});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        b[k] = v;
    }
    b
}

/// A refusal's envelope, checked: `status`, and a message naming channel `a` without the token.
fn refused_for_a(r: &Reply) -> anyhow::Result<()> {
    ensure!(r.status == 409, "expected 409: {} {}", r.status, r.text);
    let v = r.json()?;
    assert_eq!(v["error"]["details"]["channel"], "a", "{v}");
    assert_eq!(v["error"]["details"]["field"], "bot_token", "{v}");
    let m = v["error"]["message"].as_str().unwrap_or_default();
    ensure!(m.contains("channel \"a\"") && m.contains("409"), "{m}");
    ensure!(!r.text.contains(TOKEN), "the token is in the answer: {}", r.text);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_token_two_channels_share_is_refused_and_a_second_poller_is_a_failure_naming_the_cause()
-> anyhow::Result<()> {
    let home = TestHome::new()?;
    let fake = FakeTelegram::start(TOKEN, "coffer_bot").await?;
    let api = chat::start_daemon(&home).await?;
    let r = create(&api, &telegram(&fake, "a", json!({"bot_token": TOKEN}))).await?;
    ensure!(r.status == 201, "create a: {} {}", r.status, r.text);
    wait_adapter(&api, "a", "a polling", |a| a["state"] == "running" && a["bot_username"] == "coffer_bot").await?;

    // The same token given again, the same credential named, another credential holding the
    // same value: each refused naming channel "a", nothing written.
    put_credential(&api, "copy-of-a", TOKEN).await?;
    for extra in [
        json!({"bot_token": TOKEN}),
        json!({"bot_token_ref": "channel-a-bot-token"}),
        json!({"bot_token_ref": "copy-of-a"}),
    ] {
        refused_for_a(&create(&api, &telegram(&fake, "b", extra.clone())).await?)
            .with_context(|| format!("{extra}"))?;
    }
    assert_eq!(names(&api).await?, ["a"]);
    let creds = api.get("/v1/credentials").reply().await?.ok_json()?.to_string();
    ensure!(!creds.contains("channel-b-bot-token"), "no credential kept for the refused channel: {creds}");

    // Another bot's token is fine; editing it to a's token is refused the same way, through
    // REST and through the CLI.
    let r = create(&api, &telegram(&fake, "b", json!({"bot_token": OTHER_TOKEN}))).await?;
    ensure!(r.status == 201, "create b: {} {}", r.status, r.text);
    refused_for_a(&patch(&api, "b", &json!({"bot_token": TOKEN})).await?)?;
    refused_for_a(&patch(&api, "b", &json!({"bot_token_ref": "copy-of-a"})).await?)?;
    let out = home.cli_command(&["channel", "edit", "b", "--bot-token-env", "T"])?.env("T", TOKEN).output().await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success() && stderr.contains("channel \"a\""), "coffer channel edit: {stderr}");
    ensure!(!stderr.contains(TOKEN) && !String::from_utf8_lossy(&out.stdout).contains(TOKEN));
    assert_eq!(channel(&api, "b").await?["version"], 1, "b unchanged");

    // The one path add/edit do not see — the credential's value set directly — gives two
    // pollers of one bot: Telegram's 409 is a failure naming the cause (with its retry), not a
    // quiet backoff.
    put_credential(&api, "channel-b-bot-token", TOKEN).await?;
    let failed = wait_for("a channel failed on Telegram's 409", WAIT, || async {
        for n in ["a", "b"] {
            let v = channel(&api, n).await?;
            let e = v["adapter"]["last_error"].as_str().unwrap_or_default();
            if v["adapter"]["state"] == "failed" && e.contains("409 Conflict") && e.contains("same bot token") {
                return Ok(Some(v));
            }
        }
        Ok(None)
    })
    .await?;
    ensure!(failed["adapter"]["retry_at_ms"].as_i64() > Some(0), "a retry time: {failed}");
    ensure!(fake.calls_of("getUpdates").iter().any(|c| c.status == 409), "the fake answered 409");
    let name = failed["name"].as_str().context("name")?;
    let list = home.cli(&["channel", "list"]).await?.ok()?;
    ensure!(list.stdout.contains("409 Conflict") || list.stdout.contains("failed"), "{list}");
    let doctor = home.cli(&["doctor"]).await?;
    let line = doctor.stdout.lines().find(|l| l.contains(&format!("channel {name}"))).context("doctor line")?;
    ensure!(line.starts_with("fail") && line.contains("adapter failed: Telegram refused"), "{doctor}");
    ensure!(!doctor.stdout.contains("failed: failed"), "{doctor}");

    // The audit log's channel actions can be asked for.
    let audit = home.cli(&["audit", "--action", "channel.create", "--json"]).await?.ok()?.json()?;
    let targets: Vec<&str> =
        audit["items"].as_array().context("items")?.iter().filter_map(|e| e["target"].as_str()).collect();
    assert_eq!(targets, ["b", "a"], "{audit}");
    let leaked = all_logs(&home);
    ensure!(!leaked.contains(TOKEN), "the token is in a log");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seatalk_app_secret_the_platform_refuses_is_a_failed_adapter_in_list_status_and_doctor() -> anyhow::Result<()>
{
    let home = TestHome::builder().env("COFFER_CALLBACK_PORT", ports::free_port().to_string()).build()?;
    let fake = FakeSeatalk::start(APP_ID, APP_SECRET).await?;
    let api = chat::start_daemon(&home).await?;
    let body = json!({"name": "st", "kind": "seatalk", "app_id": APP_ID, "app_secret": WRONG_SECRET,
        "signing_secret": SIGNING, "api_base_url": fake.url, "default_agent": chat::SCRIPTED});
    let r = create(&api, &body).await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    let v = wait_adapter(&api, "st", "the adapter failed", |a| a["state"] == "failed").await?;
    let e = v["adapter"]["last_error"].as_str().unwrap_or_default();
    ensure!(e.contains("SeaTalk refused the credential") && e.contains("app id and secret"), "{v}");
    ensure!(fake.token_requests() >= 1, "the secret was tried at start");

    let list = home.cli(&["channel", "list"]).await?.ok()?;
    ensure!(list.stdout.contains("failed: SeaTalk refused"), "{list}");
    let status = home.cli(&["status"]).await?.ok()?;
    ensure!(status.stdout.contains("adapter failed: SeaTalk refused the credential"), "{status}");
    let json = home.cli(&["status", "--json"]).await?.ok()?.json()?;
    let chans = json["channels"].as_array().context("status --json has channels")?;
    assert_eq!((chans.len(), &chans[0]["name"], &chans[0]["adapter"]["state"]), (1, &json!("st"), &json!("failed")));
    ensure!(json["services"].is_array(), "the REST body is still there: {json}");
    let doctor = home.cli(&["doctor"]).await?;
    let line = doctor.stdout.lines().find(|l| l.contains("channel st")).context("doctor line")?;
    ensure!(line.starts_with("fail") && line.contains("adapter failed: SeaTalk refused the credential"), "{doctor}");
    ensure!(!doctor.stdout.contains("failed: failed"), "{doctor}");
    for out in [&list.stdout, &status.stdout, &doctor.stdout] {
        ensure!(!out.contains(WRONG_SECRET) && !out.contains(APP_SECRET), "a secret in {out}");
    }

    // The right secret: the adapter restarts and runs.
    let r = patch(&api, "st", &json!({"app_secret": APP_SECRET})).await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    wait_adapter(&api, "st", "the adapter running", |a| a["state"] == "running" && a["last_error"].is_null()).await?;
    ensure!(!all_logs(&home).contains(WRONG_SECRET), "the secret is in a log");
    Ok(())
}

#[tokio::test]
async fn a_seatalk_reply_the_platform_refuses_turns_the_adapter_failed_until_a_send_succeeds() -> anyhow::Result<()> {
    let fake = FakeSeatalk::start(APP_ID, APP_SECRET).await?;
    let status = StatusCell::new("team", "seatalk");
    status.update(|s| s.state = "running".into());
    let client = Client::new(&fake.url, SecretString::from(APP_ID), SecretString::from(APP_SECRET));
    let replier = SeatalkReplier::new(client, status.clone());
    replier.notice("E1", "one").await?;
    assert_eq!(status.get().state, "running");
    // The app secret is rotated on the platform: the token is refused, and so is a new one.
    fake.set_app_secret("rotated-secret");
    fake.revoke_tokens();
    let e = replier.notice("E1", "two").await.unwrap_err();
    assert!(matches!(e, ChannelError::Auth { .. }), "{e:?}");
    let s = status.get();
    assert_eq!(s.state, "failed");
    ensure!(s.last_error.starts_with("a reply could not be sent: SeaTalk refused the credential"), "{s:?}");
    ensure!(!s.last_error.contains(APP_SECRET), "{s:?}");
    // Sends work again: running, the cause cleared.
    fake.set_app_secret(APP_SECRET);
    replier.notice("E1", "three").await?;
    let s = status.get();
    assert_eq!((s.state.as_str(), s.last_error.as_str()), ("running", ""));
    let sent: Vec<String> = fake.messages().iter().filter(|m| m.accepted).map(|m| m.content.clone()).collect();
    assert_eq!(sent, ["one", "three"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_status_names_the_missing_credential_and_credentials_list_says_who_uses_each() -> anyhow::Result<()> {
    let home = TestHome::builder().env("COFFER_CALLBACK_PORT", ports::free_port().to_string()).build()?;
    let fake = FakeSeatalk::start(APP_ID, APP_SECRET).await?;
    let api = chat::start_daemon(&home).await?;
    // App id and secret stored; the signing secret names a credential that does not exist.
    let body = json!({"name": "st", "kind": "seatalk", "app_id": APP_ID, "app_secret": APP_SECRET,
        "signing_secret_ref": "not-there", "api_base_url": fake.url, "default_agent": chat::SCRIPTED});
    let r = create(&api, &body).await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    let v = wait_adapter(&api, "st", "the adapter failed", |a| a["state"] == "failed").await?;
    let e = v["adapter"]["last_error"].as_str().unwrap_or_default();
    assert_eq!(e, "the credential \"not-there\" (signing_secret_ref) is missing", "{v}");
    let doctor = home.cli(&["doctor"]).await?;
    let line = doctor.stdout.lines().find(|l| l.contains("channel st")).context("doctor line")?;
    ensure!(line.starts_with("fail") && line.contains("signing_secret credential has no value"), "{doctor}");

    // USED BY names the channel for the credentials it keeps and the ones it names.
    put_credential(&api, "not-there", SIGNING).await?;
    let list = home.cli(&["credentials", "list"]).await?.ok()?;
    for cred in ["channel-st-app-id", "channel-st-app-secret", "not-there"] {
        let line = list.stdout.lines().find(|l| l.starts_with(cred)).with_context(|| format!("{cred}: {list}"))?;
        ensure!(line.trim_end().ends_with("channel st"), "{line}");
    }
    wait_adapter(&api, "st", "the adapter running once the credential exists", |a| a["state"] == "running").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blank_secrets_and_a_cwd_that_is_no_folder_are_refused_at_add_and_edit() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let fake = FakeTelegram::start(TOKEN, "coffer_bot").await?;
    let api = chat::start_daemon(&home).await?;
    let field = |r: &Reply| r.json().map(|v| v["error"]["details"]["field"].clone()).unwrap_or_default();
    for blank in ["   ", " 4242:padded", "4242:padded "] {
        let r = create(&api, &telegram(&fake, "x", json!({"bot_token": blank}))).await?;
        ensure!(r.status == 400 && field(&r) == "bot_token", "{blank:?}: {} {}", r.status, r.text);
        ensure!(r.text.contains("whitespace"), "{}", r.text);
    }
    let file = home.root().join("a-file");
    std::fs::write(&file, "x")?;
    for (cwd, why) in [("/no/such/folder-e2e", "does not exist"), (file.to_str().context("utf-8")?, "is not a folder")]
    {
        let r = create(&api, &telegram(&fake, "x", json!({"bot_token": TOKEN, "agent_config": {"cwd": cwd}}))).await?;
        ensure!(r.status == 400 && field(&r) == "agent_config.cwd", "{cwd}: {} {}", r.status, r.text);
        ensure!(r.text.contains(why) && r.text.contains("--cwd"), "{}", r.text);
    }
    assert_eq!(names(&api).await?, Vec::<String>::new(), "nothing written");

    // The README's example with a mistyped folder, through the CLI.
    let out = home
        .cli_command(&[
            "channel",
            "add",
            "home",
            "--kind",
            "telegram",
            "--bot-token-env",
            "T",
            "--cwd",
            "/no/such/src",
        ])?
        .env("T", TOKEN)
        .output()
        .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && stderr.contains("agent_config.cwd") && stderr.contains("does not exist"),
        "{stderr}"
    );
    let out = home
        .cli_command(&["channel", "add", "home", "--kind", "telegram", "--bot-token-env", "T"])?
        .env("T", "  ")
        .output()
        .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success() && stderr.contains("bot token is only whitespace"), "{stderr}");

    // Edit: a missing folder refused, an existing one taken.
    let r = create(&api, &telegram(&fake, "x", json!({"bot_token": TOKEN}))).await?;
    ensure!(r.status == 201, "{} {}", r.status, r.text);
    let r = patch(&api, "x", &json!({"agent_config": {"cwd": "/no/such/folder-e2e"}})).await?;
    ensure!(r.status == 400 && field(&r) == "agent_config.cwd", "{} {}", r.status, r.text);
    let r = patch(&api, "x", &json!({"bot_token": " "})).await?;
    ensure!(r.status == 400 && field(&r) == "bot_token", "{} {}", r.status, r.text);
    let dir = home.root().display().to_string();
    let r = patch(&api, "x", &json!({"agent_config": {"cwd": dir}})).await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voice_stickers_and_edits_are_answered_once_and_a_strangers_photo_is_never_fetched() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let fake = FakeTelegram::start(TOKEN, "coffer_bot").await?;
    let api = chat::start_daemon(&home).await?;
    let r = create(&api, &telegram(&fake, "tg", json!({"bot_token": TOKEN}))).await?;
    ensure!(r.status == 201, "{} {}", r.status, r.text);
    let pair = api.post_json("/v1/channels/tg/pair", &json!({})).reply().await?.ok_json()?;
    let code = pair["code"].as_str().context("code")?;
    fake.push_text(OWNER, &format!("/pair {code}"));
    let said = |chat_id: i64, needle: &'static str| {
        let fake = &fake;
        async move {
            fake.wait(&format!("{needle:?} in chat {chat_id}"), WAIT, |f| {
                f.bot_messages(chat_id).iter().any(|m| m.visible().contains(needle))
            })
            .await
        }
    };
    said(OWNER, "Paired").await?;
    let from = |id: i64| json!({"id": id, "is_bot": false, "first_name": "P"});
    let chat = |id: i64| json!({"id": id, "type": "private"});
    fake.push_raw(json!({"message": {"message_id": 50, "from": from(OWNER), "chat": chat(OWNER), "date": 0,
        "voice": {"file_id": "v1", "file_unique_id": "u1", "duration": 3}}}));
    said(OWNER, "Only text messages, photos and files are read").await?;
    // A sticker and an edit: not answered again; a text after them runs as usual.
    fake.push_raw(json!({"message": {"message_id": 51, "from": from(OWNER), "chat": chat(OWNER), "date": 0,
        "sticker": {"file_id": "s1", "file_unique_id": "u2", "width": 512, "height": 512, "is_animated": false}}}));
    fake.push_raw(json!({"edited_message": {"message_id": 52, "from": from(OWNER), "chat": chat(OWNER), "date": 0,
        "edit_date": 1, "text": "say:edited"}}));
    fake.push_text(OWNER, "say:after");
    said(OWNER, "after").await?;
    let notes = fake.bot_messages(OWNER).iter().filter(|m| m.visible().contains("Only text messages, photos")).count();
    assert_eq!(notes, 1, "{:?}", fake.bot_messages(OWNER));
    ensure!(!fake.bot_messages(OWNER).iter().any(|m| m.visible().trim() == "edited"), "the edit did not run");
    // A stranger's photo is refused as a stranger's text is.
    fake.push_raw(json!({"message": {"message_id": 60, "from": from(STRANGER), "chat": chat(STRANGER), "date": 0,
        "photo": [{"file_id": "p2", "file_unique_id": "u3", "width": 90, "height": 90}]}}));
    said(STRANGER, "only answers its owner").await?;
    ensure!(!fake.bot_messages(STRANGER).iter().any(|m| m.visible().contains("Only text")), "no more to strangers");
    ensure!(fake.calls_of("getFile").is_empty(), "a stranger's photo is never fetched");
    let polls = fake.calls_of("getUpdates");
    let asked = &polls.last().context("a poll")?.params["allowed_updates"];
    assert_eq!(asked, &json!(["message", "edited_message", "callback_query"]), "approval buttons are presses");
    Ok(())
}
