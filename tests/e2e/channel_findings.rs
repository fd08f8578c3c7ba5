//! The channel findings of session 11's newcomer, end to end: a real daemon
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
