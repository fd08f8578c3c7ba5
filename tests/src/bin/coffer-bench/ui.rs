//! The web console benchmark (`coffer-bench --only ui`): issue 16's performance floors, measured
//! in a real headless Chromium (`coffer_tests::browser`) on a scripted-chat daemon
//! (`coffer-test-daemon scripted-chat`: the shipped chat engine with the test-only `scripted`
//! agent), every process from the build next to this binary.
//!
//! - **Transfer size** of the chat page with all its assets: the document and every `/ui/`
//!   file the browser fetched on the first visit (cold cache, right after the login redirect),
//!   summed from resource timing's `decodedBodySize` (uncompressed) once the page is drawn.
//!   API calls (`/v1/…`) are not assets and are left out.
//! - **Navigation → conversation list drawn**: `performance.mark('coffer:conversations-drawn')`
//!   (the chat page sets it once, after the list first renders; its `startTime` is ms since
//!   navigation start), with [`LIST_CONVERSATIONS`] conversations in the list; the first visit
//!   and [`LOADS`] loads after it (cache revalidated, `304`). A page that does not set the mark
//!   is measured to `DOMContentLoaded` instead, and the table says so.
//! - **`text_delta` emitted → text painted**: a `stamped:<n>` turn (each delta carries the
//!   wall-clock µs at which the adapter handed it over, `coffer_tests::chat`); in the page a
//!   `MutationObserver` notices each stamp as it enters the DOM and the next
//!   `requestAnimationFrame` records `performance.timeOrigin + performance.now()` for it (the
//!   frame that paints it; one machine, one clock). Two renderers: a baseline (a bare
//!   `EventSource` appending each delta's text to a `<div>`, injected by the benchmark: the floor
//!   of what any page can do) and the chat page itself with the conversation open. Deltas at a
//!   fast model's pace ([`MODEL_PACE_MS`] ms) and far faster ([`FAST_PACE_MS`] ms).
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use coffer_tests::bench::metrics::quantile;
use coffer_tests::browser::Browser;
use coffer_tests::chat::{self, unix_micros};
use coffer_tests::{Api, TestHome, wait_for};
use serde_json::{Value, json};

use super::pass;

/// Conversations in the list while the load is measured.
const LIST_CONVERSATIONS: usize = 20;
/// Measured loads of the chat page after the first visit.
const LOADS: usize = 20;
/// Deltas per measured paint turn, and their paces (ms between two deltas).
const PAINT_DELTAS: usize = 300;
const MODEL_PACE_MS: u64 = 10;
const FAST_PACE_MS: u64 = 1;
/// Deltas of the unmeasured turn that shows the renderer is live (1 ms apart: every turn is
/// paced, so no two stamps share a microsecond and each is counted once).
const WARM_DELTAS: usize = 20;
/// How long a turn's deltas may take to be painted beyond the turn's own length.
const PAINT_GRACE: Duration = Duration::from_secs(30);
/// The issue's floors.
const TRANSFER_FLOOR_BYTES: u64 = 300_000;
const PAINT_P95_FLOOR_MS: f64 = 50.0;
/// The mark the chat page sets once its conversation list is drawn.
const DRAWN_MARK: &str = "coffer:conversations-drawn";

/// Runs the three measurements and prints their tables.
///
/// # Errors
/// When the daemon or the browser cannot start, or a measurement cannot complete.
pub async fn run(bins: &Path) -> Result<()> {
    let here = coffer_tests::bins::bin_dir()?.canonicalize()?;
    if here != bins.canonicalize()? {
        bail!(
            "the web console benchmark runs the binaries next to coffer-bench ({}), not {}: set COFFER_BENCH_BINS to that folder or unset it",
            here.display(),
            bins.display()
        );
    }
    for b in ["coffer-test-daemon", "coffer-test-chat"] {
        if !bins.join(b).exists() {
            bail!("{} missing: build the workspace's binaries first", bins.join(b).display());
        }
    }
    println!("## Web console (issue 16)\n");
    println!(
        "Headless Chromium (`coffer_tests::browser`) on a scripted-chat daemon (`coffer-test-daemon scripted-chat`), binaries in {}.\n",
        bins.display()
    );
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    for i in 0..LIST_CONVERSATIONS {
        create(&api, &format!("Benchmark conversation {i}")).await?;
    }
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "chat").await?;
    let marked = page_sets_mark(&b, &api).await?;
    let first = drawn(&b, marked).await?;
    transfer(&b).await?;
    load_times(&b, marked, first).await?;
    paint(&b, &api).await?;
    let errors = b.console_errors().await?;
    if !errors.is_empty() {
        println!("Console errors or warnings during the run (the figures above may not mean much):\n");
        for e in errors {
            println!("- {e}");
        }
        println!();
    }
    Ok(())
}

/// A new `scripted` conversation titled `title`; its id.
async fn create(api: &Api, title: &str) -> Result<String> {
    let r = api.post_json("/v1/conversations", &json!({"agent_key": chat::SCRIPTED, "title": title})).send().await?;
    let status = r.status();
    let v: Value = r.json().await?;
    ensure!(status.is_success(), "POST /v1/conversations answered {status}: {v}");
    Ok(v["id"].as_str().with_context(|| format!("no id in {v}"))?.to_owned())
}

/// Whether a script the chat page loaded sets [`DRAWN_MARK`] (each read again from the edge).
async fn page_sets_mark(b: &Browser, api: &Api) -> Result<bool> {
    const SCRIPTS: &str = "return performance.getEntriesByType('resource') \
        .map(r => new URL(r.name).pathname).filter(p => p.startsWith('/ui/') && p.endsWith('.js'));";
    let scripts = b.eval(SCRIPTS, vec![]).await?;
    for path in scripts.as_array().into_iter().flatten().filter_map(Value::as_str) {
        let js = api.get(path).send().await?.text().await?;
        if js.contains(DRAWN_MARK) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Waits for the current load of the chat page to draw its list (or, without the mark, for
/// `DOMContentLoaded`); ms from navigation start.
async fn drawn(b: &Browser, marked: bool) -> Result<f64> {
    let probe = if marked {
        format!("performance.getEntriesByName('{DRAWN_MARK}').length > 0")
    } else {
        "performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd > 0".to_owned()
    };
    b.wait_until(&probe).await?;
    b.wait_for_page("chat").await?;
    let read = if marked {
        format!("return performance.getEntriesByName('{DRAWN_MARK}')[0].startTime;")
    } else {
        "return performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd;".to_owned()
    };
    b.eval(&read, vec![]).await?.as_f64().context("the timing is not a number")
}

/// (a) The chat page's document and `/ui/` assets of the first visit.
async fn transfer(b: &Browser) -> Result<()> {
    const SIZES: &str = "const nav = performance.getEntriesByType('navigation')[0]; \
        const files = performance.getEntriesByType('resource') \
          .filter(r => new URL(r.name).pathname.startsWith('/ui/')) \
          .map(r => ({path: new URL(r.name).pathname, decoded: r.decodedBodySize, wire: r.transferSize})); \
        files.unshift({path: new URL(nav.name).pathname, decoded: nav.decodedBodySize, wire: nav.transferSize}); \
        return files;";
    let files = b.eval(SIZES, vec![]).await?;
    let files = files.as_array().context("resource list")?;
    let decoded: u64 = files.iter().filter_map(|f| f["decoded"].as_u64()).sum();
    let wire: u64 = files.iter().filter_map(|f| f["wire"].as_u64()).sum();
    let mut biggest: Vec<(&str, u64)> =
        files.iter().map(|f| (f["path"].as_str().unwrap_or("?"), f["decoded"].as_u64().unwrap_or(0))).collect();
    biggest.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    let top: Vec<String> = biggest.iter().take(4).map(|(p, n)| format!("`{p}` {:.1} KB", *n as f64 / 1e3)).collect();
    println!("### Chat page: transfer size, first visit (cold cache)\n");
    println!("| measure | value | floor |\n|---|---|---|");
    println!(
        "| document + {} `/ui/` files, uncompressed (`decodedBodySize`) | **{:.1} KB** | < {} KB {} |",
        files.len() - 1,
        decoded as f64 / 1e3,
        TRANSFER_FLOOR_BYTES / 1000,
        pass(decoded < TRANSFER_FLOOR_BYTES)
    );
    println!(
        "| the same on the wire (`transferSize`, headers included, no compression) | {:.1} KB | — |",
        wire as f64 / 1e3
    );
    println!("| largest files | {} | — |\n", top.join(", "));
    Ok(())
}

/// (b) Navigation → list drawn: the first visit, then [`LOADS`] loads.
async fn load_times(b: &Browser, marked: bool, first: f64) -> Result<()> {
    let mut ms = Vec::with_capacity(LOADS);
    for _ in 0..LOADS {
        b.goto("/ui/chat").await?;
        ms.push(drawn(b, marked).await?);
    }
    let to = if marked {
        format!("the conversation list drawn (`{DRAWN_MARK}`)")
    } else {
        "`DOMContentLoaded` (the chat page does not set `coffer:conversations-drawn` yet: this is not the list)"
            .to_owned()
    };
    println!("### Chat page: navigation → {to}, {LIST_CONVERSATIONS} conversations\n");
    println!("| load | p50 | p95 | max |\n|---|---|---|---|");
    println!("| first visit (cold cache, after the login redirect) | {first:.1} ms | — | — |");
    println!(
        "| {LOADS} loads after it (assets revalidated) | {:.1} ms | {:.1} ms | {:.1} ms |\n",
        quantile(&ms, 0.5),
        quantile(&ms, 0.95),
        quantile(&ms, 1.0)
    );
    Ok(())
}

/// The observer installed in the page: every `t<µs>` stamp entering `root`'s subtree gets the
/// wall-clock time (ms) of the next animation frame. `window.__paints` holds `[stamp, ms]`.
const OBSERVER: &str = r"
const root = arguments[0] ? document.querySelector(arguments[0]) : document.getElementById('page');
if (window.__observer) window.__observer.disconnect();
const seen = new Set();
let pending = [];
window.__paints = [];
const re = /\bt(\d{15,17})\b/g;
const scan = (text) => {
  if (!text) return;
  for (const m of text.matchAll(re)) {
    if (!seen.has(m[1])) { seen.add(m[1]); pending.push(m[1]); }
  }
};
window.__observer = new MutationObserver((records) => {
  const before = pending.length;
  for (const r of records) {
    if (r.type === 'characterData') scan(r.target.data);
    else for (const n of r.addedNodes) scan(n.textContent);
  }
  if (before === 0 && pending.length > 0) {
    requestAnimationFrame(() => {
      const t = performance.timeOrigin + performance.now();
      for (const s of pending) window.__paints.push([s, t]);
      pending = [];
    });
  }
});
window.__observer.observe(root, { childList: true, subtree: true, characterData: true });
return !!root;";

/// The baseline renderer: a bare `EventSource` on the conversation's events, each delta's text
/// appended to `#bench-thread`.
const BASELINE: &str = r"
const [id, after] = arguments;
if (window.__benchES) window.__benchES.close();
const box = document.createElement('div');
box.id = 'bench-thread';
document.getElementById('page').append(box);
const es = new EventSource(`/v1/conversations/${id}/events?after=${after}`);
es.addEventListener('text_delta', (e) => { box.append(document.createTextNode(JSON.parse(e.data).text_delta.text)); });
window.__benchES = es;
return true;";

/// One renderer's latencies (ms) for one turn, or why there are none.
type Latencies = Result<Vec<f64>, String>;

/// (c) `text_delta` emitted → painted, for the baseline and for the chat page.
async fn paint(b: &Browser, api: &Api) -> Result<()> {
    let paces = [MODEL_PACE_MS, FAST_PACE_MS];
    // Baseline: its own conversation, streamed by the injected renderer on the chat page.
    let id = create(api, "Benchmark paint baseline").await?;
    b.goto("/ui/chat").await?;
    b.wait_for_page("chat").await?;
    let after = last_seq(api, &id).await?;
    b.eval(BASELINE, vec![json!(id), json!(after)]).await?;
    ensure!(b.eval(OBSERVER, vec![json!("#bench-thread")]).await? == true, "no #bench-thread");
    let mut baseline = Vec::new();
    turn(b, api, &id, FAST_PACE_MS, WARM_DELTAS).await.map_err(anyhow::Error::msg).context("baseline warm-up")?;
    for pace in paces {
        baseline.push(turn(b, api, &id, pace, PAINT_DELTAS).await);
    }
    b.eval("window.__benchES.close(); document.getElementById('bench-thread').remove(); return null;", vec![]).await?;

    // The chat page with its conversation open (clicked in the list).
    let title = "Benchmark paint page";
    let id = create(api, title).await?;
    b.goto("/ui/chat").await?;
    b.wait_for_page("chat").await?;
    let page: Vec<Latencies> = match open_in_page(b, &id, title).await {
        Ok(()) => {
            ensure!(b.eval(OBSERVER, vec![Value::Null]).await? == true, "no #page");
            match turn(b, api, &id, FAST_PACE_MS, WARM_DELTAS).await {
                Ok(_) => {
                    let mut v = Vec::new();
                    for pace in paces {
                        v.push(turn(b, api, &id, pace, PAINT_DELTAS).await);
                    }
                    v
                }
                Err(e) => vec![Err(format!("the page did not paint the warm-up turn: {e}")); paces.len()],
            }
        }
        Err(e) => vec![Err(format!("{e:#}")); paces.len()],
    };

    println!("### `text_delta` emitted → painted: {PAINT_DELTAS} `stamped:` deltas per row\n");
    println!(
        "Emit = the adapter's stamp (Unix µs); painted = the first animation frame after the stamp entered the DOM (`performance.timeOrigin + performance.now()`).\n"
    );
    println!("| renderer | pace | p50 | p95 | max | floor (p95) |\n|---|---|---|---|---|---|");
    for (name, rows) in [("baseline: bare `EventSource` → text node", &baseline), ("**the chat page**", &page)] {
        for (pace, r) in paces.iter().zip(rows) {
            match r {
                Ok(ms) => {
                    let p95 = quantile(ms, 0.95);
                    println!(
                        "| {name} | {pace} ms apart | {:.1} ms | {p95:.1} ms | {:.1} ms | < {PAINT_P95_FLOOR_MS} ms {} |",
                        quantile(ms, 0.5),
                        quantile(ms, 1.0),
                        pass(p95 < PAINT_P95_FLOOR_MS)
                    );
                }
                Err(e) => println!("| {name} | {pace} ms apart | SKIPPED: {e} | — | — | — |"),
            }
        }
    }
    println!();
    Ok(())
}

/// The conversation's `last_seq`.
async fn last_seq(api: &Api, id: &str) -> Result<u64> {
    let v: Value = api.get(&format!("/v1/conversations/{id}?messages=1")).send().await?.json().await?;
    v["last_seq"].as_u64().with_context(|| format!("no last_seq in {v}"))
}

/// Opens conversation `id` in the chat page by clicking its `title` in the list, and waits
/// until the page has asked for its event stream.
async fn open_in_page(b: &Browser, id: &str, title: &str) -> Result<()> {
    const FIND: &str = "const t = arguments[0]; \
        const hits = [...document.querySelectorAll('#page a, #page button, #page [role=button], #page li')] \
          .filter(e => e.textContent.includes(t)); \
        return hits.length ? hits[hits.length - 1] : null;";
    b.wait_for_text("#page", title).await.context("the chat page does not list the conversation")?;
    let el = b.eval(FIND, vec![json!(title)]).await?;
    ensure!(!el.is_null(), "no clickable element in the list holds {title:?}");
    b.element(&el)?.click().await?;
    let stream = format!("/v1/conversations/{id}/events");
    wait_for("the chat page to open the conversation's event stream", Duration::from_secs(10), || async {
        Ok(b.requests().await?.iter().any(|u| u.contains(&stream)).then_some(()))
    })
    .await
    .context("the chat page did not open the conversation")
}

/// Runs one `slow:<pace>` + `stamped:<n>` turn on `id` and waits until the observer has seen
/// all `n` stamps painted; the latencies in ms. `pace` must be at least 1 ms: the observer
/// counts distinct stamps (a page may render a text again), and a burst can stamp two deltas
/// in the same microsecond.
async fn turn(b: &Browser, api: &Api, id: &str, pace: u64, n: usize) -> Latencies {
    let run = async {
        wait_idle(api, id).await?;
        b.eval("window.__paints = []; return null;", vec![]).await?;
        ensure!(pace >= 1, "an unpaced turn can stamp two deltas alike");
        let script = format!("slow:{pace}\nstamped:{n}");
        let sent = unix_micros();
        let r = api.post_json(&format!("/v1/conversations/{id}/messages"), &json!({"text": script})).send().await?;
        ensure!(r.status().is_success(), "sending the turn: {}", r.status());
        let deadline = Duration::from_millis(pace * n as u64) + PAINT_GRACE;
        let got = wait_for(&format!("{n} stamps painted"), deadline, || async {
            let paints = b.eval("return window.__paints;", vec![]).await?;
            let paints = paints.as_array().cloned().unwrap_or_default();
            Ok((paints.len() >= n).then_some(paints))
        })
        .await;
        let paints = match got {
            Ok(p) => p,
            Err(e) => {
                let seen = b.eval("return window.__paints.length;", vec![]).await.unwrap_or(Value::Null);
                bail!("{seen} of {n} stamps painted: {e:#}");
            }
        };
        let mut ms = Vec::with_capacity(n);
        for p in paints {
            let stamp: f64 = p[0].as_str().and_then(|s| s.parse().ok()).context("stamp")?;
            let at_ms = p[1].as_f64().context("paint time")?;
            ensure!(stamp >= sent as f64, "a stamp from before the turn was sent: {stamp} < {sent}");
            ms.push(at_ms - stamp / 1e3);
        }
        Ok(ms)
    };
    run.await.map_err(|e: anyhow::Error| format!("{e:#}"))
}

/// Waits until conversation `id` has no turn running (so the next message starts one).
async fn wait_idle(api: &Api, id: &str) -> Result<()> {
    wait_for("the previous turn to end", Duration::from_secs(60), || async {
        let v: Value = api.get(&format!("/v1/conversations/{id}?messages=1")).send().await?.json().await?;
        Ok((v["conversation"]["turn_running"] == false).then_some(()))
    })
    .await
}
