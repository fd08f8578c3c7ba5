//! Files attached to chat messages (issue 34 §6) end to end: a real daemon
//! (`coffer-test-daemon scripted-chat`, or the shipped chat service with the real Claude Code on
//! the fake Anthropic API), the Telegram channel polling the fake Bot API
//! (`coffer_tests::fake_telegram`: `getFile` and the file download), and REST
//! `POST /v1/conversations/{id}/messages` with base64 attachments. Covers: a photo with a
//! caption (the largest size within the limit) reaching the agent as a file in its working
//! directory with the right bytes and named in its message; a document; a file past the limit
//! refused in the chat with nothing saved and nothing sent; hostile names (`../../x`,
//! `.bashrc`, NUL, 300 characters); malformed REST bodies (bad base64, unknown field, too many
//! files, a fake image) answered 400 naming the problem; a body above the other routes' 2 MiB
//! accepted on this route; and the real Claude Code passing the photo to the model as an image
//! content block.
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};
use base64::Engine as _;
use coffer_tests::fake_telegram::FakeTelegram;
use coffer_tests::{Api, SendExt, TestHome, chat, images, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

const TOKEN: &str = "4242:fake-token-AAAA";
const OWNER: i64 = 1001;
const STRANGER: i64 = 2002;
const WAIT: Duration = Duration::from_secs(30);

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The conversation `id` as REST shows it.
async fn view(api: &Api, id: &str) -> anyhow::Result<Value> {
    api.get(&format!("/v1/conversations/{id}")).reply().await?.ok_json()
}

/// Waits until conversation `id` has no turn running and `n` messages; the view.
async fn settled(api: &Api, id: &str, n: usize) -> anyhow::Result<Value> {
    wait_for(&format!("conversation {id} with {n} messages and no turn"), WAIT, || async {
        let v = view(api, id).await?;
        let done = v["conversation"]["turn_running"] == false && v["messages"].as_array().map_or(0, Vec::len) >= n;
        Ok(done.then_some(v))
    })
    .await
}

/// The attachment blocks of the user messages of a view, in order.
fn attachments(v: &Value) -> Vec<Value> {
    v["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .flat_map(|m| m["blocks"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "attachment")
        .map(|b| b["attachment"].clone())
        .collect()
}

/// The assistant's texts of a view, joined.
fn answers(v: &Value) -> String {
    let msgs = v["messages"].as_array().into_iter().flatten().filter(|m| m["role"] == "assistant");
    msgs.flat_map(|m| m["blocks"].as_array().cloned().unwrap_or_default())
        .filter_map(|b| b["text"].as_str().map(str::to_owned))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The conversation's working directory.
fn cwd(v: &Value) -> anyhow::Result<PathBuf> {
    Ok(PathBuf::from(v["conversation"]["agent_config"]["cwd"].as_str().context("cwd")?))
}

/// A daemon with a paired Telegram channel `tg` on the fake whose default agent is `agent`.
struct Rig {
    home: TestHome,
    api: Api,
    fake: FakeTelegram,
}

async fn telegram_rig(home: TestHome, api: Api, agent: &str, work: &Path) -> anyhow::Result<Rig> {
    let fake = FakeTelegram::start(TOKEN, "coffer_bot").await?;
    let body = json!({
        "name": "tg", "kind": "telegram", "bot_token": TOKEN, "api_base_url": fake.url,
        "default_agent": agent, "agent_config": {"cwd": work.display().to_string()},
    });
    let r = api.post_json("/v1/channels", &body).header("X-Coffer-Actor", "cli").reply().await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    let code = api.post("/v1/channels/tg/pair").reply().await?.ok_json()?["code"].as_str().context("code")?.to_owned();
    fake.wait("the adapter's first long poll", WAIT, |f| !f.calls_of("getUpdates").is_empty()).await?;
    fake.push_text(OWNER, &format!("/pair {code}"));
    fake.wait("the pairing answer", WAIT, |f| f.bot_messages(OWNER).iter().any(|m| m.visible().contains("Paired")))
        .await?;
    Ok(Rig { home, api, fake })
}

impl Rig {
    async fn said(&self, chat_id: i64, needle: &str, timeout: Duration) -> anyhow::Result<()> {
        self.fake
            .wait(&format!("{needle:?} in chat {chat_id}"), timeout, |f| {
                f.bot_messages(chat_id).iter().any(|m| m.visible().contains(needle))
            })
            .await
    }

    /// The conversation bound to the owner's chat.
    async fn conversation(&self) -> anyhow::Result<String> {
        let list = self.api.get("/v1/conversations").reply().await?.ok_json()?;
        let conv = list["items"].as_array().and_then(|a| a.iter().find(|c| c["channel_name"] == "tg"));
        Ok(conv.with_context(|| format!("a conversation bound to tg: {list}"))?["id"]
            .as_str()
            .context("id")?
            .to_owned())
    }
}

/// Done-when "a photo sent from Telegram reaches the agent" (scripted agent): the largest size
/// within the limit is fetched (getFile + download), saved in the conversation's working
/// directory with its bytes, shown on the user message, named to the agent under the caption;
/// a document the same; a file past the limit is refused in the chat, nothing fetched, saved or
/// sent; a stranger's photo is never fetched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_photo_and_a_document_from_telegram_reach_the_agent_and_too_big_is_refused() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let work = home.temp().join("work");
    std::fs::create_dir_all(&work)?;
    let rig = telegram_rig(home, api, chat::SCRIPTED, &work).await?;

    // Three sizes: small, medium, and one over the default 10 MiB limit.
    let small = images::png(40, 30, [200, 40, 40], [40, 40, 200]);
    let medium = images::png(320, 240, [200, 40, 40], [40, 40, 200]);
    let huge = images::png(2000, 1800, [0, 0, 0], [255, 255, 255]);
    ensure!(huge.len() > 10 << 20, "the large size must be over the limit: {}", huge.len());
    rig.fake.push_photo(
        OWNER,
        &[(40, 30, &small), (320, 240, &medium), (2000, 1800, &huge)],
        Some("say:got the photo"),
    );
    rig.said(OWNER, "got the photo", WAIT).await?;
    rig.said(OWNER, "Attached: .coffer/attachments/", WAIT).await?;
    let id = rig.conversation().await?;
    let v = settled(&rig.api, &id, 2).await?;
    let files = attachments(&v);
    ensure!(files.len() == 1, "one attachment: {files:?}");
    let a = &files[0];
    ensure!(a["name"] == "photo.png" && a["mime"] == "image/png" && a["size"] == medium.len(), "{a}");
    let path = a["path"].as_str().context("path")?;
    ensure!(path.starts_with(".coffer/attachments/") && path.ends_with("/photo.png"), "{path}");
    ensure!(cwd(&v)? == work, "the channel's working directory: {v}");
    ensure!(std::fs::read(work.join(path))? == medium, "the saved photo is the medium size, byte for byte");
    ensure!(answers(&v).contains(&format!("Attached: {path} (image/png")), "the agent was told: {}", answers(&v));
    ensure!(rig.fake.downloads(None) == 1, "only the chosen size was downloaded");

    // A document with a hostile name and no caption.
    rig.fake.push_document(OWNER, "../../notes.txt", "text/plain", b"hello notes", None, None);
    rig.said(OWNER, "notes.txt (text/plain, 11 bytes)", WAIT).await?;
    let v = settled(&rig.api, &id, 4).await?;
    let files = attachments(&v);
    let doc = files.last().context("the document")?;
    ensure!(doc["name"] == "notes.txt", "{doc}");
    ensure!(std::fs::read(work.join(doc["path"].as_str().context("path")?))? == b"hello notes");
    ensure!(!work.parent().context("parent")?.join("notes.txt").exists(), "nothing escaped the folder");

    // Past the limit: refused in the chat naming it; nothing fetched, saved or sent.
    let before = std::fs::read_dir(work.join(".coffer/attachments"))?.count();
    rig.fake.push_document(OWNER, "big.bin", "application/octet-stream", &huge, Some("say:never"), None);
    rig.said(OWNER, "over the limit of 10.0 MB per file (chat.attachment_max_bytes)", WAIT).await?;
    ensure!(std::fs::read_dir(work.join(".coffer/attachments"))?.count() == before, "nothing saved");
    ensure!(rig.fake.downloads(None) == 2, "the big file was never downloaded");
    let v = view(&rig.api, &id).await?;
    ensure!(v["messages"].as_array().map_or(0, Vec::len) == 4, "nothing sent to the agent: {v}");

    // A stranger's photo is refused as a stranger's text, never fetched.
    let calls = rig.fake.calls_of("getFile").len();
    rig.fake.push_photo(STRANGER, &[(40, 30, &small)], Some("say:hi"));
    rig.said(STRANGER, "only answers its owner", WAIT).await?;
    ensure!(rig.fake.calls_of("getFile").len() == calls, "no getFile for a stranger");
    Ok(())
}

/// REST: base64 attachments with hostile names are saved under safe names in the working
/// directory; malformed bodies are 400 naming the problem, nothing saved; a body over the other
/// routes' 2 MiB limit is accepted on this route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_attachments_are_named_safely_and_malformed_bodies_name_the_problem() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let conv = chat::rest_create(&api).await?;
    let id = conv["id"].as_str().context("id")?.to_owned();
    let work = PathBuf::from(conv["agent_config"]["cwd"].as_str().context("cwd")?);
    let url = format!("/v1/conversations/{id}/messages");
    let long = format!("{}.txt", "n".repeat(300));
    let body = json!({"text": "say:files in", "attachments": [
        {"name": "../../x", "data_base64": b64(b"x")},
        {"name": ".bashrc", "data_base64": b64(b"rc")},
        {"name": "a\u{0}b.txt", "mime": "text/plain", "data_base64": b64(b"nul")},
        {"name": long, "data_base64": b64(b"long")},
    ]});
    let r = api.post_json(&url, &body).reply().await?;
    ensure!(r.status == 202, "{} {}", r.status, r.text);
    let v = settled(&api, &id, 2).await?;
    let names: Vec<String> =
        attachments(&v).iter().map(|a| a["name"].as_str().unwrap_or_default().to_owned()).collect();
    ensure!(names[..3] == ["x", "bashrc", "ab.txt"], "{names:?}");
    ensure!(names[3].len() <= 120 && names[3].ends_with(".txt") && names[3].starts_with("nnn"), "{names:?}");
    for a in attachments(&v) {
        let p = a["path"].as_str().context("path")?;
        ensure!(!p.contains("..") && p.starts_with(".coffer/attachments/"), "{p}");
        ensure!(work.join(p).is_file(), "{p} saved");
    }
    ensure!(!work.parent().context("parent")?.join("x").exists() && !work.join(".bashrc").exists());

    let refused = |body: Value, needle: &'static str, code: &'static str| {
        let (api, url) = (&api, &url);
        async move {
            let r = api.post_json(url, &body).reply().await?;
            ensure!(r.status == 400, "{needle}: {} {}", r.status, r.text);
            let e: Value = serde_json::from_str(&r.text)?;
            ensure!(e["error"]["code"] == code, "{needle}: {e}");
            ensure!(r.text.contains(needle), "{needle} not in {}", r.text);
            anyhow::Ok(())
        }
    };
    refused(
        json!({"text": "x", "attachments": [{"name": "a", "data_base64": "%%%"}]}),
        "attachments[0].data_base64",
        "INVALID_ARGUMENT",
    )
    .await?;
    refused(json!({"text": "x", "attachments": [{"name": "a", "data": "eA=="}]}), "data", "UNKNOWN_FIELD").await?;
    refused(json!({"text": "x", "attachments": [{"name": "a"}]}), "data_base64", "INVALID_ARGUMENT").await?;
    let five: Vec<Value> = (0..5).map(|i| json!({"name": format!("f{i}"), "data_base64": b64(b"x")})).collect();
    refused(json!({"text": "x", "attachments": five}), "chat.attachment_max_files", "INVALID_ARGUMENT").await?;
    refused(
        json!({"text": "x", "attachments": [{"name": "p.png", "data_base64": b64(b"not a png")}]}),
        "not a PNG, JPEG, GIF or WebP",
        "INVALID_ARGUMENT",
    )
    .await?;
    refused(
        json!({"text": "x", "attachments": [{"name": "e", "data_base64": ""}]}),
        "the file is empty",
        "INVALID_ARGUMENT",
    )
    .await?;
    refused(json!({"text": ""}), "text: empty", "INVALID_ARGUMENT").await?;
    let folders = std::fs::read_dir(work.join(".coffer/attachments"))?.count();
    ensure!(folders == 1, "refused messages left nothing behind: {folders} folders");

    // An image alone (no text), 3 MiB of body: over the 2 MiB of other routes, fine here.
    let big = images::png(1100, 700, [0, 0, 0], [255, 128, 0]);
    ensure!(b64(&big).len() > 2 << 20, "{}", big.len());
    let body =
        json!({"text": "", "attachments": [{"name": "shot.png", "mime": "image/png", "data_base64": b64(&big)}]});
    let r = api.request(Method::POST, &url).json(&body).reply().await?;
    ensure!(r.status == 202, "{} {}", r.status, r.text.chars().take(300).collect::<String>());
    let v = settled(&api, &id, 4).await?;
    let last = attachments(&v).pop().context("the image")?;
    ensure!(last["name"] == "shot.png" && last["size"] == big.len(), "{last}");
    ensure!(std::fs::read(work.join(last["path"].as_str().context("path")?))? == big);
    // Other routes keep 2 MiB.
    let r = api
        .request(Method::PATCH, &format!("/v1/conversations/{id}"))
        .json(&json!({"title": "t".repeat(3 << 20)}))
        .reply()
        .await?;
    ensure!(r.status == 413, "{}", r.status);

    // The CLI sends files too.
    let file = home.temp().join("report.pdf");
    std::fs::write(&file, b"%PDF-1.4 tiny")?;
    home.cli(&["chat", "send", &id, "--attach", &file.display().to_string(), "say:cli file"]).await?.ok()?;
    let v = settled(&api, &id, 6).await?;
    let last = attachments(&v).pop().context("the pdf")?;
    ensure!(last["name"] == "report.pdf" && last["mime"] == "application/pdf", "{last}");
    let shown = home.cli(&["chat", "show", &id]).await?.ok()?;
    ensure!(shown.stdout.contains("report.pdf (application/pdf, 13 bytes)"), "{}", shown.stdout);
    Ok(())
}

/// `GET …/messages/{message_id}/attachments/{name}`: the saved bytes with their sniffed type,
/// images inline, other files as a download with a safe name, `nosniff` and a sandbox CSP; a
/// name that is a path, `..`, a planted symlink, another conversation's message or an unknown
/// id never reaches a file; Host, Origin and the token are checked as on every chat route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saved_attachments_are_served_back_and_nothing_else_is() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let conv = chat::rest_create(&api).await?;
    let id = conv["id"].as_str().context("id")?.to_owned();
    let work = PathBuf::from(conv["agent_config"]["cwd"].as_str().context("cwd")?);
    let png = images::png(40, 30, [10, 200, 90], [200, 10, 90]);
    let body = json!({"text": "say:files", "attachments": [
        {"name": "shot.png", "data_base64": b64(&png)},
        {"name": "notes.txt", "data_base64": b64(b"hello notes")},
        {"name": "page.html", "mime": "text/html", "data_base64": b64(b"<script>alert(1)</script>")},
        {"name": "r\u{e9}sum\u{e9} \"final\".pdf", "data_base64": b64(b"%PDF-1.4")},
    ]});
    let r = api.post_json(&format!("/v1/conversations/{id}/messages"), &body).reply().await?;
    ensure!(r.status == 202, "{} {}", r.status, r.text);
    let v = settled(&api, &id, 2).await?;
    let mid = v["messages"][0]["id"].as_str().context("the user message")?.to_owned();
    let names: Vec<String> =
        attachments(&v).iter().map(|a| a["name"].as_str().unwrap_or_default().to_owned()).collect();
    let url = |name: &str| {
        let enc: String = name
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() || b == b'.' { (b as char).to_string() } else { format!("%{b:02X}") })
            .collect();
        format!("/v1/conversations/{id}/messages/{mid}/attachments/{enc}")
    };
    let fetch = |name: String| {
        let (api, path) = (&api, url(&name));
        async move {
            let r = api.get(&path).send().await?;
            let status = r.status().as_u16();
            let headers = r.headers().clone();
            let bytes = r.bytes().await?.to_vec();
            let h = move |k: &str| headers.get(k).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
            anyhow::Ok((
                status,
                bytes,
                h("content-type"),
                h("content-disposition"),
                h("x-content-type-options"),
                h("content-security-policy"),
            ))
        }
    };
    let (status, bytes, ty, disp, nosniff, csp) = fetch("shot.png".into()).await?;
    ensure!(status == 200 && bytes == png && ty == "image/png", "{status} {ty}");
    ensure!(
        disp.starts_with("inline;") && nosniff == "nosniff" && csp.starts_with("sandbox"),
        "{disp} {nosniff} {csp}"
    );
    let (status, bytes, ty, disp, ..) = fetch("notes.txt".into()).await?;
    ensure!(status == 200 && bytes == b"hello notes" && ty == "text/plain", "{status} {ty}");
    ensure!(disp.starts_with("attachment; filename=\"notes.txt\""), "{disp}");
    let (status, _, ty, disp, nosniff, csp) = fetch("page.html".into()).await?;
    ensure!(
        status == 200 && ty == "text/html" && disp.starts_with("attachment;"),
        "an HTML file is a download: {ty} {disp}"
    );
    ensure!(nosniff == "nosniff" && csp == "sandbox; default-src 'none'", "{csp}");
    let pdf = names.iter().find(|n| n.ends_with(".pdf")).context("the pdf")?.clone();
    let (status, _, ty, disp, ..) = fetch(pdf.clone()).await?;
    ensure!(status == 200 && ty == "application/pdf", "{pdf}: {status} {ty}");
    ensure!(
        disp == "attachment; filename=\"r_sum_ _final_.pdf\"; filename*=UTF-8''r%C3%A9sum%C3%A9%20_final_.pdf",
        "saved without its quotes; non-ASCII only in filename*: {disp}"
    );

    // Hostile names (a bare `..` segment is resolved away by any URL parser before it is sent;
    // the unit tests cover it): a path, dots only, a hidden name, NUL, a backslash path → 400 naming `name`.
    for bad in ["..%2F..%2Fsecret.txt", "...", "%2Fetc%2Fpasswd", ".bashrc", "a%00b.txt", "..%5C..%5Cx"] {
        let r = api.get(&format!("/v1/conversations/{id}/messages/{mid}/attachments/{bad}")).reply().await?;
        let e = r.expect_envelope(400, "INVALID_ARGUMENT").with_context(|| bad.to_owned())?;
        ensure!(e["message"].as_str().unwrap_or_default().contains("name"), "{bad}: {e}");
        ensure!(e["details"] == json!({"parameter": "name"}), "the details name the parameter: {bad}: {e}");
    }
    // A file planted in the message's folder (by the agent, say) is not one of its recorded
    // attachments: not served, and the 404 names it.
    let folder = work.join(".coffer/attachments").join(&mid);
    std::fs::write(folder.join("planted.txt"), b"planted")?;
    let e = api.get(&url("planted.txt")).reply().await?.expect_envelope(404, "NOT_FOUND")?;
    ensure!(e["message"].as_str().unwrap_or_default().contains("no attachment named \"planted.txt\""), "{e}");
    // A symlink planted in the folder, pointing out of it: not served, whether its name is
    // unrecorded or a recorded attachment's replaced by the link.
    std::fs::write(home.temp().join("secret.txt"), b"secret")?;
    std::os::unix::fs::symlink(home.temp().join("secret.txt"), folder.join("link.txt"))?;
    api.get(&url("link.txt")).reply().await?.expect_envelope(404, "NOT_FOUND")?;
    std::fs::remove_file(folder.join("notes.txt"))?;
    std::os::unix::fs::symlink(home.temp().join("secret.txt"), folder.join("notes.txt"))?;
    api.get(&url("notes.txt")).reply().await?.expect_envelope(404, "NOT_FOUND")?;
    api.get(&url("gone.png")).reply().await?.expect_envelope(404, "NOT_FOUND")?;
    // Unknown ids, a bad id, another conversation's message.
    let unknown = "01JDQ8ZKXW5T3M2N4P6R7S8T9V";
    for path in [
        format!("/v1/conversations/{id}/messages/{unknown}/attachments/shot.png"),
        format!("/v1/conversations/{unknown}/messages/{mid}/attachments/shot.png"),
    ] {
        api.get(&path).reply().await?.expect_envelope(404, "NOT_FOUND").with_context(|| path.clone())?;
    }
    // A bad message id is named as a message id.
    let e = api
        .get(&format!("/v1/conversations/{id}/messages/nope/attachments/shot.png"))
        .reply()
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    let msg = e["message"].as_str().unwrap_or_default();
    ensure!(msg.starts_with("message_id: \"nope\" is not a message id"), "{e}");
    ensure!(e["details"] == json!({"parameter": "message_id"}), "{e}");
    let other = chat::rest_create(&api).await?;
    let other = other["id"].as_str().context("id")?;
    api.get(&format!("/v1/conversations/{other}/messages/{mid}/attachments/shot.png"))
        .reply()
        .await?
        .expect_envelope(404, "NOT_FOUND")?;
    // The edge's checks, as on every chat route.
    let path = url("shot.png");
    api.get(&path).header("Host", "evil.com").reply().await?.expect_envelope(403, "FORBIDDEN")?;
    api.get(&path).header("Origin", "http://evil.com").reply().await?.expect_envelope(403, "FORBIDDEN")?;
    api.anon(Method::GET, &path).reply().await?.expect_envelope(401, "UNAUTHORIZED")?;
    Ok(())
}

/// Done-when with the real agent: a photo sent from Telegram reaches the REAL Claude Code (on
/// the fake Anthropic API) as a base64 `image` content block in the model request, next to its
/// caption and the `Attached:` line naming the saved file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_claude_code_gets_a_telegram_photo_as_an_image_block() -> anyhow::Result<()> {
    const REAL: Duration = Duration::from_secs(90);
    let anthropic = coffer_tests::anthropic::FakeAnthropic::scripted().await?;
    let mut home = TestHome::new()?;
    chat::offline_claude_code(&mut home, &anthropic.url);
    home.cli(&["status"]).await?.ok()?;
    let api = home.api()?;
    let claude = coffer_tests::peers::claude_code()?.display().to_string();
    api.request(Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"chat.claude_code_path": claude}}))
        .reply()
        .await?
        .ok_json()?;
    let work = home.temp().join("work");
    std::fs::create_dir_all(&work)?;
    let rig = telegram_rig(home, api, "claude_code", &work).await?;
    let photo = images::png(96, 64, [250, 80, 30], [30, 80, 250]);
    rig.fake.push_photo(OWNER, &[(96, 64, &photo)], Some("SAY[I can see the photo]"));
    rig.said(OWNER, "I can see the photo", REAL).await?;
    let turns = anthropic.turns();
    let carried = turns.iter().any(|t| {
        t.body["messages"].as_array().into_iter().flatten().filter(|m| m["role"] == "user").any(|m| {
            m["content"].as_array().into_iter().flatten().any(|b| {
                b["type"] == "image"
                    && b["source"]["type"] == "base64"
                    && b["source"]["media_type"] == "image/png"
                    && b["source"]["data"] == b64(&photo)
            })
        })
    });
    ensure!(
        carried,
        "no model request carried the photo as an image block: {:?}",
        turns.last().map(|t| &t.body["messages"])
    );
    let told = turns.iter().any(|t| t.body["messages"].to_string().contains("Attached: .coffer/attachments/"));
    ensure!(told, "the model was not told the saved path");
    let id = rig.conversation().await?;
    let v = view(&rig.api, &id).await?;
    let a = attachments(&v).pop().context("the photo on the user message")?;
    ensure!(std::fs::read(work.join(a["path"].as_str().context("path")?))? == photo);
    rig.home.cli(&["daemon", "stop"]).await?.ok()?;
    rig.home.wait_no_processes(WAIT).await?;
    Ok(())
}

/// Whether `m` is an accepted SeaTalk message to `to` containing `needle`.
fn seatalk_says(m: &coffer_tests::fake_seatalk::Sent, to: &str, needle: &str) -> bool {
    m.accepted && m.to == to && m.content.contains(needle)
}

/// A daemon with the SeaTalk channel `team` (default agent `agent`, working directory `work`)
/// behind the real coffer-callback and the fake Open Platform, paired to employee `E1`.
struct StRig {
    home: TestHome,
    api: Api,
    fake: coffer_tests::fake_seatalk::FakeSeatalk,
    cb: coffer_tests::fake_seatalk::Callback,
    signing: String,
    events: std::sync::atomic::AtomicU32,
}

async fn seatalk_rig(home: TestHome, api: Api, agent: &str, work: &Path, port: u16) -> anyhow::Result<StRig> {
    use coffer_tests::fake_seatalk::{Callback, FakeSeatalk};
    let fake = FakeSeatalk::start("app-id", "app-secret").await?;
    let signing = format!("signing-{:016x}", fastrand::u64(..));
    let body = json!({ "name": "team", "kind": "seatalk", "enabled": true, "app_id": "app-id",
        "app_secret": "app-secret", "signing_secret": signing, "api_base_url": fake.url,
        "default_agent": agent, "agent_config": {"cwd": work.display().to_string()} });
    let r = api.post_json("/v1/channels", &body).header("X-Coffer-Actor", "cli").reply().await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    wait_for("coffer-callback to run for the channel", WAIT, || async {
        Ok((api.service("callback").await?["state"] == "healthy").then_some(()))
    })
    .await?;
    let rig = StRig { home, api, fake, cb: Callback::new(port), signing, events: Default::default() };
    let code =
        rig.api.post("/v1/channels/team/pair").reply().await?.ok_json()?["code"].as_str().context("code")?.to_owned();
    rig.text("E1", &format!("/pair {code}")).await?;
    rig.said("E1", "Paired", WAIT).await?;
    Ok(rig)
}

impl StRig {
    fn id(&self) -> String {
        format!("ev-{}", self.events.fetch_add(1, std::sync::atomic::Ordering::SeqCst))
    }

    /// Posts `body`, signed as SeaTalk signs, to coffer-callback: answered 200.
    async fn post(&self, body: Vec<u8>) -> anyhow::Result<()> {
        let a = self.cb.signed("team", body, &self.signing).await?;
        ensure!(a.status == 200, "callback: {a:?}");
        Ok(())
    }

    async fn text(&self, from: &str, text: &str) -> anyhow::Result<()> {
        self.post(coffer_tests::fake_seatalk::single_message(&self.id(), from, text)).await
    }

    async fn said(&self, to: &str, needle: &str, timeout: Duration) -> anyhow::Result<()> {
        let what = format!("{needle:?} to {to}");
        self.fake.wait_messages(&what, timeout, |m| m.iter().any(|s| seatalk_says(s, to, needle))).await.map(|_| ())
    }

    /// The conversation bound to the channel.
    async fn conversation(&self) -> anyhow::Result<String> {
        let list = self.api.get("/v1/conversations").reply().await?.ok_json()?;
        let conv = list["items"].as_array().and_then(|a| a.iter().find(|c| c["channel_name"] == "team"));
        Ok(conv.with_context(|| format!("a conversation bound to team: {list}"))?["id"]
            .as_str()
            .context("id")?
            .to_owned())
    }
}

/// Issue 34 §6 on SeaTalk (scripted agent, the real coffer-callback, the fake Open Platform over
/// loopback HTTP): an image sent to the bot in the owner's private chat is downloaded with the
/// app's access token from its documented `/messaging/v2/file/` URL, saved in the conversation's
/// working directory under a name whose extension follows its bytes, and named to the agent; a
/// file the same under its sanitised name, its `Content-Type` parameters dropped; an "image"
/// whose bytes are none is refused naming it; past `chat.attachment_max_bytes` refused naming
/// the limit, nothing saved or sent; a link outside this app's API is never fetched (the token
/// goes nowhere else); a stranger's image is refused as a stranger's text and never fetched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_and_a_file_from_seatalk_reach_the_agent_and_too_big_or_a_stranger_s_are_refused() -> anyhow::Result<()>
{
    use coffer_tests::fake_seatalk;
    let port = coffer_tests::ports::free_port();
    let home = TestHome::builder().env("COFFER_CALLBACK_PORT", port.to_string()).build()?;
    let api = chat::start_daemon(&home).await?;
    let work = home.temp().join("work");
    std::fs::create_dir_all(&work)?;
    let rig = seatalk_rig(home, api, chat::SCRIPTED, &work, port).await?;
    let (api, fake) = (&rig.api, &rig.fake);

    // An image: fetched with the token, saved, named to the agent (its extension from its bytes).
    let png = images::png(64, 48, [20, 160, 60], [200, 200, 30]);
    let url = fake.add_file(&png, "image/png");
    rig.post(fake_seatalk::single_image(&rig.id(), "E1", &url)).await?;
    rig.said("E1", "image.png (image/png", WAIT).await?;
    let conv = rig.conversation().await?;
    let v = settled(api, &conv, 2).await?;
    let files = attachments(&v);
    ensure!(files.len() == 1, "one attachment: {files:?}");
    let a = &files[0];
    ensure!(a["name"] == "image.png" && a["mime"] == "image/png" && a["size"] == png.len(), "{a}");
    let path = a["path"].as_str().context("path")?;
    ensure!(path.starts_with(".coffer/attachments/") && cwd(&v)? == work, "{path} {v}");
    ensure!(std::fs::read(work.join(path))? == png, "the saved image is the sent one, byte for byte");
    ensure!(answers(&v).contains(&format!("Attached: {path} (image/png")), "the agent was told: {}", answers(&v));
    ensure!(fake.downloads() == 1);

    // A file with a hostile name and a Content-Type with parameters.
    let url = fake.add_file(b"hello notes", "text/plain; charset=utf-8");
    rig.post(fake_seatalk::single_file(&rig.id(), "E1", &url, "../../notes.txt")).await?;
    rig.said("E1", "notes.txt (text/plain, 11 bytes)", WAIT).await?;
    let v = settled(api, &conv, 4).await?;
    let doc = attachments(&v).pop().context("the file")?;
    ensure!(doc["name"] == "notes.txt", "{doc}");
    ensure!(std::fs::read(work.join(doc["path"].as_str().context("path")?))? == b"hello notes");
    ensure!(!work.parent().context("parent")?.join("notes.txt").exists(), "nothing escaped the folder");

    // An "image" whose bytes are not one (served as image/png): refused, naming why.
    let url = fake.add_file(b"<svg onload=alert(1)>", "image/png");
    rig.post(fake_seatalk::single_image(&rig.id(), "E1", &url)).await?;
    rig.said("E1", "not a PNG, JPEG, GIF or WebP image", WAIT).await?;
    // Past the limit (10 MiB by default): refused naming it; nothing saved or sent.
    let before = std::fs::read_dir(work.join(".coffer/attachments"))?.count();
    let url = fake.add_file(&vec![7u8; (10 << 20) + 1], "application/octet-stream");
    rig.post(fake_seatalk::single_file(&rig.id(), "E1", &url, "big.bin")).await?;
    rig.said("E1", "over the limit of 10.0 MB per file (chat.attachment_max_bytes)", WAIT).await?;
    ensure!(std::fs::read_dir(work.join(".coffer/attachments"))?.count() == before, "nothing saved");
    // A link outside this app's API: never fetched, the owner told.
    let downloads = fake.downloads();
    rig.post(fake_seatalk::single_image(&rig.id(), "E1", "http://127.0.0.1:9/messaging/v2/file/elsewhere")).await?;
    rig.said("E1", "no SeaTalk download link this bot can use", WAIT).await?;
    let v = view(api, &conv).await?;
    ensure!(v["messages"].as_array().map_or(0, Vec::len) == 4, "nothing more sent to the agent: {v}");

    // A stranger's image: refused as a stranger's text, never downloaded.
    let url = fake.add_file(&png, "image/png");
    rig.post(fake_seatalk::single_image(&rig.id(), "E2", &url)).await?;
    rig.said("E2", "only answers its owner", WAIT).await?;
    ensure!(fake.downloads() == downloads, "nothing fetched for the stranger or the foreign link");
    Ok(())
}

/// Done-when "a photo reaches the agent", from SeaTalk, with the real agent: an image sent to
/// the bot reaches the REAL Claude Code (on the fake Anthropic API) as a base64 `image` content
/// block in the model request, next to the `Attached:` line naming the saved file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_claude_code_gets_a_seatalk_image_as_an_image_block() -> anyhow::Result<()> {
    const REAL: Duration = Duration::from_secs(90);
    let anthropic = coffer_tests::anthropic::FakeAnthropic::scripted().await?;
    let port = coffer_tests::ports::free_port();
    let mut home = TestHome::builder().env("COFFER_CALLBACK_PORT", port.to_string()).build()?;
    chat::offline_claude_code(&mut home, &anthropic.url);
    home.cli(&["status"]).await?.ok()?;
    let api = home.api()?;
    let claude = coffer_tests::peers::claude_code()?.display().to_string();
    api.request(Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"chat.claude_code_path": claude}}))
        .reply()
        .await?
        .ok_json()?;
    let work = home.temp().join("work");
    std::fs::create_dir_all(&work)?;
    let rig = seatalk_rig(home, api, "claude_code", &work, port).await?;
    // The image first (no caption: SeaTalk images carry none), then what to say about it.
    let photo = images::png(96, 64, [250, 80, 30], [30, 80, 250]);
    let url = rig.fake.add_file(&photo, "image/png");
    rig.post(coffer_tests::fake_seatalk::single_image(&rig.id(), "E1", &url)).await?;
    let conv = wait_for("the conversation bound to team", WAIT, || async { Ok(rig.conversation().await.ok()) }).await?;
    wait_for("the turn with the image to end", REAL, || async {
        let v = view(&rig.api, &conv).await?;
        let done = v["conversation"]["turn_running"] == false && v["messages"].as_array().map_or(0, Vec::len) >= 2;
        Ok(done.then_some(()))
    })
    .await?;
    let turns = anthropic.turns();
    let carried = turns.iter().any(|t| {
        t.body["messages"].as_array().into_iter().flatten().filter(|m| m["role"] == "user").any(|m| {
            m["content"].as_array().into_iter().flatten().any(|b| {
                b["type"] == "image"
                    && b["source"]["type"] == "base64"
                    && b["source"]["media_type"] == "image/png"
                    && b["source"]["data"] == b64(&photo)
            })
        })
    });
    ensure!(
        carried,
        "no model request carried the image as an image block: {:?}",
        turns.last().map(|t| &t.body["messages"])
    );
    let told = turns.iter().any(|t| t.body["messages"].to_string().contains("Attached: .coffer/attachments/"));
    ensure!(told, "the model was not told the saved path");
    let v = view(&rig.api, &conv).await?;
    let a = attachments(&v).pop().context("the image on the user message")?;
    ensure!(std::fs::read(work.join(a["path"].as_str().context("path")?))? == photo);
    rig.home.cli(&["daemon", "stop"]).await?.ok()?;
    rig.home.wait_no_processes(WAIT).await?;
    Ok(())
}
