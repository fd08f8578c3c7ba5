//! The console's view of what a turn changed (issue 34 §4) in a real headless Chromium against a
//! real daemon with the scripted agent (`write:`, `rm:`, `mv:` change the conversation's folder):
//! in a git repository and in a plain folder, the reply gets its changed-files summary live (from
//! the `files_changed` event) and after a reload (from the message); the list shows each file's
//! marker, path and counts; a file opens the diff viewer (diff2html): highlighted lines, the
//! unified / side-by-side toggle remembered, side by side falling back to unified at phone width,
//! the unchanged lines between hunks labelled, a long diff folded behind "Show the remaining N
//! lines", a deleted file and a rename without changes said plainly, a hostile file name and
//! content shown as text, all by keyboard. Screenshots (1280×800 and 390×844, light and dark) go
//! to `target/ui-screenshots/diffview-*.png`.
use std::path::Path;

use anyhow::{Context, ensure};
use coffer_tests::browser::{Browser, keys};
use coffer_tests::{Api, SendExt, TestHome, chat};
use serde_json::{Value, json};

use crate::chat_changes::{git, project};

/// A hostile file name: a folder `<svg` and a file whose name would run script if it were HTML.
const HOSTILE: &str = "<svg/onload=window.__pwned=1>.md";

/// A scripted conversation in folder `cwd`, created over REST; its id.
async fn create(api: &Api, title: &str, cwd: &Path) -> anyhow::Result<String> {
    let r = api
        .post_json(
            "/v1/conversations",
            &json!({"agent_key": chat::SCRIPTED, "title": title, "agent_config": {"cwd": cwd}}),
        )
        .reply()
        .await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    Ok(r.json()?["id"].as_str().context("id")?.to_owned())
}

async fn send(api: &Api, id: &str, text: &str) -> anyhow::Result<()> {
    let r = api.post_json(&format!("/v1/conversations/{id}/messages"), &json!({"text": text})).reply().await?;
    ensure!(r.status == 202, "send: {} {}", r.status, r.text);
    Ok(())
}

/// Opens conversation `id` and waits for its thread.
async fn open(b: &Browser, id: &str) -> anyhow::Result<()> {
    b.open_conversation(id).await
}

/// `src/long.rs`: 60 numbered functions, one a line.
fn long_rs(changed: &[usize]) -> String {
    (1..=60)
        .map(|i| {
            if changed.contains(&i) {
                format!("fn f{i}() -> u32 {{ {} }}\n", i * 100)
            } else {
                format!("fn f{i}() -> u32 {{ {i} }}\n")
            }
        })
        .collect()
}

/// `text` as the scripted agent's `write:` argument (`\n` for each newline).
fn escaped(text: &str) -> String {
    text.replace('\n', "\\n")
}

/// The texts of the elements matching `css` in the page.
async fn texts(b: &Browser, css: &str) -> anyhow::Result<Vec<String>> {
    let v = b
        .eval("return [...document.querySelectorAll(arguments[0])].map(e => e.textContent);", vec![json!(css)])
        .await?;
    Ok(v.as_array().context("an array")?.iter().map(|s| s.as_str().unwrap_or_default().to_owned()).collect())
}

/// Scrolls the thread so that the reply's changed files are in view (for a screenshot).
async fn scroll_to_changes(b: &Browser) -> anyhow::Result<()> {
    b.eval(
        "document.querySelector('article.msg.assistant .changes').scrollIntoView({block: 'center'}); return true;",
        vec![],
    )
    .await?;
    Ok(())
}

/// Waits until the diff viewer shows file `path` drawn (or said in a sentence).
async fn showing(b: &Browser, path: &str) -> anyhow::Result<()> {
    b.wait_until(&format!(
        "document.querySelector('dialog.diffview .diff-path')?.textContent.endsWith({}) && !!document.querySelector('dialog.diffview .diff-body :is(.d2h-wrapper, .diff-sentence)')",
        json!(path)
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_changed_files_and_their_diffs_under_the_reply() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let root = home.temp().join("project");
    project(&root)?;
    std::fs::write(root.join("src/long.rs"), long_rs(&[]))?;
    std::fs::write(root.join("logo.bin"), [0x89, b'P', b'N', b'G', 0, 0, 0, 13, 0xff])?;
    git(&root, &["add", "src/long.rs", "logo.bin"])?;
    git(&root, &["commit", "-qm", "long"])?;
    let id = create(&api, "Changes", &root).await?;

    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "chat").await?;
    open(&b, &id).await?;

    // One turn: modify, add, delete (a text and a binary file), rename, two edits far apart, a
    // 500-line file, a hostile name.
    let big: String = (1..=500).map(|i| format!("line {i} of a long new file\n")).collect();
    let script = [
        "write:src/a.rs fn a() {}\\nfn b() -> u32 { 42 }\\n".to_owned(),
        "write:src/new.rs pub fn new() {}\\n".to_owned(),
        "rm:gone.txt".to_owned(),
        "rm:logo.bin".to_owned(),
        "mv:old.txt renamed.txt".to_owned(),
        format!("write:src/long.rs {}", escaped(&long_rs(&[5, 50]))),
        format!("write:big.txt {}", escaped(&big)),
        format!("write:{HOSTILE} # <script>window.__pwned=2</script>\\n<img src=x onerror=window.__pwned=3>\\n"),
        "say:done".to_owned(),
    ]
    .join("\n");
    send(&api, &id, &script).await?;

    // Live: the summary appears under the reply when the event arrives.
    let summary = b.wait_for("article.msg.assistant .changes > summary").await?;
    let text = summary.text().await?;
    ensure!(text.contains("8 files changed") && text.contains("+506") && text.contains("\u{2212}3"), "{text}");
    ensure!(b.count("article.msg.assistant .changes[open]").await? == 0, "the list starts folded");

    // By keyboard: the summary opens the list, a file opens the viewer.
    b.eval("document.querySelector('article.msg.assistant .changes > summary').focus(); return true;", vec![]).await?;
    b.press(keys::ENTER).await?;
    b.wait_for("article.msg.assistant .changes[open] .change-file").await?;
    let paths = texts(&b, ".changes .change-file .change-path").await?;
    assert_eq!(
        paths,
        [HOSTILE, "big.txt", "gone.txt", "logo.bin", "old.txt → renamed.txt", "src/a.rs", "src/long.rs", "src/new.rs"],
        "the list, sorted by path, the name as text"
    );
    let marks = texts(&b, ".changes .change-file .change-mark").await?;
    assert_eq!(marks, ["A", "A", "D", "D", "R", "M", "M", "A"]);
    let row_counts = texts(&b, ".changes .change-file .change-counts").await?;
    assert_eq!(row_counts[1], "+500\u{2212}0");
    assert_eq!(row_counts[3], "binary");
    assert_eq!(row_counts[6], "+2\u{2212}2");
    scroll_to_changes(&b).await?;
    b.screenshot("diffview-list-1280").await?;

    b.press(keys::TAB).await?;
    let focused = b.eval("return document.activeElement.dataset.path || '';", vec![]).await?;
    assert_eq!(focused, json!(HOSTILE), "Tab goes from the summary to the first file");
    b.press(keys::ENTER).await?;
    b.wait_for("dialog.diffview[open]").await?;
    showing(&b, HOSTILE).await?;

    // The hostile name and content are text: no element made from them, nothing ran.
    let title = b.find("dialog.diffview .diff-path").await?.text().await?;
    assert_eq!(title, HOSTILE);
    let body = b.find("dialog.diffview .diff-body").await?.text().await?;
    ensure!(body.contains("<script>window.__pwned=2</script>") && body.contains("<img src=x onerror"), "{body}");
    let injected = b
        .eval(
            "return [document.querySelectorAll('dialog.diffview script, dialog.diffview img, dialog.diffview [onload], dialog.diffview [onerror], .changes svg, .changes img').length, window.__pwned ?? null];",
            vec![],
        )
        .await?;
    assert_eq!(injected, json!([0, null]), "nothing from the file became markup");

    // `]` walks to the next file: the 500-line one is folded after its first 400 diff lines.
    b.press("]").await?;
    showing(&b, "big.txt").await?;
    let more = b.find("dialog.diffview .diff-show-rest").await?.text().await?;
    assert_eq!(more, "Show the remaining 103 lines");
    let shown = b.count("dialog.diffview tr:has(td.d2h-ins:not(.d2h-code-linenumber))").await?;
    ensure!(shown < 400, "folded: {shown} lines drawn");
    b.find("dialog.diffview .diff-show-rest").await?.click().await?;
    b.wait_gone("dialog.diffview .diff-show-rest").await?;
    assert_eq!(b.count("dialog.diffview tr:has(td.d2h-ins:not(.d2h-code-linenumber))").await?, 500);

    // A deleted file says so; a binary file and a rename without changes are a sentence.
    b.press("]").await?;
    showing(&b, "gone.txt").await?;
    b.wait_for_text("dialog.diffview .diff-note", "This file was deleted").await?;
    ensure!(b.count("dialog.diffview td.d2h-del:not(.d2h-code-linenumber)").await? == 1, "its one line, removed");
    b.press("]").await?;
    showing(&b, "logo.bin").await?;
    b.wait_for_text("dialog.diffview .diff-sentence", "Binary file changed").await?;
    b.press("]").await?;
    showing(&b, "renamed.txt").await?;
    b.wait_for_text("dialog.diffview .diff-sentence", "Renamed from old.txt to renamed.txt (content unchanged)")
        .await?;

    // Rust, highlighted: the added line carries highlight.js's classes.
    b.press("]").await?;
    showing(&b, "src/a.rs").await?;
    b.wait_for("dialog.diffview td.d2h-ins .d2h-code-line-ctn.hljs .hljs-keyword").await?;
    let added = texts(&b, "dialog.diffview td.d2h-ins:not(.d2h-code-linenumber) .d2h-code-line-ctn").await?;
    assert_eq!(added, ["fn b() -> u32 { 42 }"]);

    // Side by side: chosen, drawn in two columns, remembered.
    ensure!(b.find(".seg-btn[data-layout=unified]").await?.attr("aria-pressed").await?.as_deref() == Some("true"));
    b.find(".seg-btn[data-layout=split]").await?.click().await?;
    b.wait_for("dialog.diffview .d2h-files-diff .d2h-file-side-diff").await?;
    assert_eq!(b.eval("return localStorage.getItem('coffer.diff.layout');", vec![]).await?, json!("split"));

    // Two edits 45 lines apart: two hunks, the lines between them one folded row.
    b.press("]").await?;
    showing(&b, "src/long.rs").await?;
    b.wait_for("dialog.diffview .d2h-files-diff").await?;
    let gaps = texts(&b, "dialog.diffview .d2h-file-side-diff:first-child tr.diff-gap .d2h-code-side-line").await?;
    assert_eq!(gaps, ["\u{22ef} 1 unchanged line", "\u{22ef} 38 unchanged lines"]);
    b.screenshot("diffview-split-1280").await?;
    b.set_dark(true).await?;
    b.screenshot("diffview-split-1280-dark").await?;

    // At phone width side by side is not offered: unified, the choice kept for later.
    b.set_viewport(390, 844).await?;
    b.wait_until("!document.querySelector('dialog.diffview .d2h-files-diff') && !!document.querySelector('dialog.diffview .d2h-file-diff')").await?;
    ensure!(b.find(".seg-btn[data-layout=split]").await?.prop("disabled").await? == json!(true));
    ensure!(b.horizontal_overflow().await? <= 0, "no sideways scrolling of the page at 390 px");
    b.screenshot("diffview-390-dark").await?;
    b.set_dark(false).await?;
    b.screenshot("diffview-390").await?;

    // Escape closes; focus goes back to the file it was opened from.
    b.press(keys::ESCAPE).await?;
    b.wait_gone("dialog.diffview").await?;
    let back = b.eval("return document.activeElement.dataset.path || '';", vec![]).await?;
    assert_eq!(back, json!(HOSTILE));
    scroll_to_changes(&b).await?;
    b.screenshot("diffview-list-390").await?;
    b.set_dark(true).await?;
    b.screenshot("diffview-list-390-dark").await?;
    b.set_dark(false).await?;
    b.set_viewport(1280, 800).await?;

    // After a reload the reply still has its files (from the stored message); side by side stays.
    b.refresh().await?;
    open(&b, &id).await?;
    let text = b.wait_for("article.msg.assistant .changes > summary").await?.text().await?;
    ensure!(text.contains("8 files changed"), "{text}");
    b.find("article.msg.assistant .changes > summary").await?.click().await?;
    b.find(".changes .change-file[data-path=\"src/long.rs\"]").await?.click().await?;
    showing(&b, "src/long.rs").await?;
    b.wait_for("dialog.diffview .d2h-files-diff").await?;
    b.find(".seg-btn[data-layout=unified]").await?.click().await?;
    b.wait_for("dialog.diffview .d2h-file-diff tr.diff-gap").await?;
    b.screenshot("diffview-unified-1280").await?;
    b.set_dark(true).await?;
    b.screenshot("diffview-unified-1280-dark").await?;
    b.set_dark(false).await?;
    b.press(keys::ESCAPE).await?;
    b.wait_gone("dialog.diffview").await?;

    // A plain folder (no git): compared by listing; a Python file highlighted.
    let plain = home.temp().join("plain");
    std::fs::create_dir_all(&plain)?;
    std::fs::write(plain.join("notes.txt"), "first\n")?;
    let id2 = create(&api, "Plain folder", &plain).await?;
    open(&b, &id2).await?;
    send(
        &api,
        &id2,
        "write:notes.txt first\\nsecond\\n\nwrite:tools/run.py def run():\\n    return print('hi')\\n\nsay:ok",
    )
    .await?;
    let text = b.wait_for("article.msg.assistant .changes > summary").await?.text().await?;
    ensure!(text.contains("2 files changed") && text.contains("+3"), "{text}");
    b.find("article.msg.assistant .changes > summary").await?.click().await?;
    b.screenshot("diffview-plain-folder-1280").await?;
    b.set_dark(true).await?;
    b.screenshot("diffview-plain-folder-1280-dark").await?;
    b.set_dark(false).await?;
    b.find(".changes .change-file[data-path=\"tools/run.py\"]").await?.click().await?;
    showing(&b, "tools/run.py").await?;
    b.wait_for("dialog.diffview td.d2h-ins .d2h-code-line-ctn.hljs .hljs-keyword").await?;
    b.find("dialog.diffview .diff-close").await?.click().await?;
    b.wait_gone("dialog.diffview").await?;

    // The stored message carries what the page showed.
    let msgs: Value = api.get(&format!("/v1/conversations/{id2}/messages")).reply().await?.ok_json()?;
    let files = msgs["items"][1]["files_changed"]["files"].as_array().context("files")?.len();
    assert_eq!(files, 2);
    b.assert_clean().await;
    Ok(())
}
