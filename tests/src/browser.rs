//! A real headless Chromium for the web console's tests, driven over WebDriver (plain HTTP to a
//! `chromedriver` on loopback, see [`webdriver`] for why not `fantoccini`), with the checks
//! every browser test ends on: no console error or warning, no request to another origin.
//!
//! ```no_run
//! # async fn t() -> anyhow::Result<()> {
//! use coffer_tests::TestHome;
//! use coffer_tests::browser::Browser;
//! let home = TestHome::new()?;
//! let api = home.start_daemon().await?;
//! let b = Browser::start().await?;                      // chromedriver + Chromium, 1280×800
//! b.login(api.base_url(), api.token(), "chat").await?;  // one-time code → cookie → /ui/chat
//! b.wait_for_text("h1", "Chat").await?.click().await?;
//! b.set_viewport(360, 740).await?;                      // a phone
//! b.screenshot("chat-360").await?;                      // target/ui-screenshots/chat-360.png
//! b.assert_clean().await;                               // every test ends here
//! # Ok(()) }                                            // Drop: chromedriver's group killed
//! ```
//!
//! - The browser is Debian's `chromium` with `chromium-driver` (`/usr/bin/chromium`,
//!   `/usr/bin/chromedriver`; `COFFER_TEST_CHROMIUM` / `COFFER_TEST_CHROMEDRIVER` override the
//!   paths). It runs headless with `--no-sandbox` (tests run as root) and with background
//!   networking, component updates, sync and QUIC off, in a fresh temporary profile.
//! - `chromedriver` runs in a process group of its own; dropping the [`Browser`] kills that
//!   group and every process still using the profile directory (Chromium's helpers), so a
//!   failing test leaves nothing behind. [`Browser::close`] ends the session politely first.
//! - Console messages come from chromedriver's log endpoint (`POST /session/{id}/se/log`,
//!   type `browser`), requests from its performance log (`Network.requestWillBeSent`); both
//!   are drained into the harness on every check, so nothing is lost between checks.
//! - Emulation (viewport, `prefers-color-scheme`) goes through chromedriver's CDP passthrough
//!   (`POST /session/{id}/goog/cdp/execute`) and is re-applied to every tab the harness opens.
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use base64::Engine as _;
use nix::sys::signal::Signal;
use reqwest::{Method, Url};
use serde_json::{Value, json};

use crate::{ports, procs, wait};

pub mod webdriver;

pub use webdriver::keys;
use webdriver::{ELEMENT_KEY, Session, element_id};

/// Where the browser is, unless `COFFER_TEST_CHROMIUM` says otherwise.
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// Where its WebDriver is, unless `COFFER_TEST_CHROMEDRIVER` says otherwise.
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The desktop viewport every browser starts with (CSS px).
pub const DESKTOP: (u32, u32) = (1280, 800);
/// A phone's viewport (CSS px).
pub const PHONE: (u32, u32) = (360, 740);
/// How long `wait_*` waits by default (the machine may be loaded; a wait ends as soon as its
/// condition holds).
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long chromedriver may take to answer `/status` and Chromium to open a session.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The flags Chromium runs with (plus `--user-data-dir`): headless, no sandbox (root), and
/// nothing that reaches the network on its own.
const CHROMIUM_FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--mute-audio",
    "--password-store=basic",
];

/// One message of the browser console (chromedriver's `browser` log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleEntry {
    /// `SEVERE`, `WARNING`, `INFO`, `DEBUG`.
    pub level: String,
    /// `console-api`, `network`, `javascript`, `security`, …
    pub source: String,
    pub message: String,
}

impl std::fmt::Display for ConsoleEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{} {}] {}", self.level, self.source, self.message)
    }
}

/// What the harness has drained from chromedriver's logs so far.
#[derive(Default)]
struct Logs {
    console: Vec<ConsoleEntry>,
    /// Every URL a page asked for (`Network.requestWillBeSent`), in order.
    requests: Vec<String>,
    /// Substrings that mark an expected console message (see [`Browser::allow_console`]).
    allowed: Vec<String>,
    /// Other origins a test visits on purpose (see [`Browser::allow_origin`]).
    allowed_origins: Vec<String>,
}

/// Emulation the harness re-applies to each tab it opens.
#[derive(Clone, Copy)]
struct Emulation {
    viewport: (u32, u32),
    dark: Option<bool>,
}

/// A chromedriver process in its own process group: killed (the whole group) on drop.
struct Driver {
    child: Child,
    log: PathBuf,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The group id is the leader's pid (`process_group(0)`).
        let pgid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, Signal::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A headless Chromium with one WebDriver session. See the module docs.
pub struct Browser {
    session: Session,
    http: reqwest::Client,
    logs: Mutex<Logs>,
    emulation: Mutex<Emulation>,
    /// `http://127.0.0.1:<port>` of the daemon under test, once known.
    origin: Mutex<Option<String>>,
    profile: PathBuf,
    // Dropped in this order: chromedriver's group killed, then Chromium's leftovers, then the
    // profile directory removed.
    driver: Option<Driver>,
    temp: Option<tempfile::TempDir>,
}

impl Drop for Browser {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(d) = &self.driver
        {
            let log = std::fs::read_to_string(&d.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            eprintln!("--- chromedriver log (last lines) ---");
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
        drop(self.driver.take());
        let profile = self.profile.to_string_lossy().into_owned();
        let leftovers = || {
            procs::with_env("COFFER_TEST_BROWSER_PROFILE", &profile)
                .into_iter()
                .chain(chromium_processes(&profile))
                .collect::<Vec<_>>()
        };
        for p in leftovers() {
            procs::signal(p.pid, Signal::SIGKILL);
        }
        wait::wait_until_blocking(Duration::from_secs(5), || leftovers().is_empty());
        drop(self.temp.take());
    }
}

/// Live processes whose command line names the profile directory `profile`.
fn chromium_processes(profile: &str) -> Vec<procs::ProcInfo> {
    let needle = format!("--user-data-dir={profile}");
    let Ok(rd) = std::fs::read_dir("/proc") else { return Vec::new() };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(procs::proc_info)
        .filter(|p| p.cmdline.iter().any(|a| a == &needle))
        .collect()
}

fn executable(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from)
}

/// How long a page helper ([`Browser::click_text`], [`Browser::fill`]) waits for its element.
pub const STEP: Duration = Duration::from_secs(20);

/// True for WebDriver's `stale element reference`: the page re-rendered the element between
/// finding and using it (a list that reloads); the step is retried on a fresh one.
fn stale(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<webdriver::WebDriverError>().and_then(webdriver::WebDriverError::code)
            == Some("stale element reference")
    })
}

impl Browser {
    /// Starts chromedriver on a free loopback port, waits for its `/status` to say ready, and
    /// opens a session: Chromium headless at [`DESKTOP`] size, a fresh profile, console and
    /// performance logging on.
    ///
    /// # Panics
    /// When Chromium or chromedriver is not installed (the message says to install `chromium
    /// chromium-driver`).
    ///
    /// # Errors
    /// When chromedriver does not become ready or the session cannot be opened within
    /// 60 s (the chromedriver log is printed if the test then panics).
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with_args(&[]).await
    }

    /// [`Browser::start`] with `extra` Chromium flags after the harness's own, e.g.
    /// `--host-resolver-rules=MAP phone.test 127.0.0.1` to open the console by another host
    /// name that resolves to loopback.
    ///
    /// # Errors
    /// As [`Browser::start`].
    pub async fn start_with_args(extra: &[&str]) -> anyhow::Result<Self> {
        let chromium = executable("COFFER_TEST_CHROMIUM", CHROMIUM);
        let chromedriver = executable("COFFER_TEST_CHROMEDRIVER", CHROMEDRIVER);
        for p in [&chromium, &chromedriver] {
            assert!(
                p.exists(),
                "{} is missing: install chromium chromium-driver (apt-get install -y chromium chromium-driver)",
                p.display()
            );
        }
        let temp = tempfile::Builder::new().prefix("coffer-browser-").tempdir().context("browser temp dir")?;
        let profile = temp.path().join("profile");
        std::fs::create_dir(&profile)?;
        let log = temp.path().join("chromedriver.log");
        let port = ports::free_port();

        // Tests launch the browser's driver directly; it is not a Coffer process.
        #[allow(clippy::disallowed_methods)]
        let mut cmd = std::process::Command::new(&chromedriver);
        cmd.arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .arg("--allowed-ips=127.0.0.1")
            // Marks chromedriver and everything it starts, so drop finds them all.
            .env("COFFER_TEST_BROWSER_PROFILE", profile.as_os_str())
            // Chromium's crash handler and caches write under HOME: keep them in the temp dir.
            .env("HOME", temp.path())
            .env("XDG_CONFIG_HOME", temp.path().join("config"))
            .env("XDG_CACHE_HOME", temp.path().join("cache"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(temp.path().join("chromedriver.stderr"))?);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        crate::die_with_test_thread(&mut cmd);
        let child = cmd.spawn().with_context(|| format!("starting {}", chromedriver.display()))?;
        let driver = Driver { child, log };

        let http = crate::http::http_client();
        let base = format!("http://127.0.0.1:{port}");
        wait::wait_for("chromedriver /status to report ready", START_TIMEOUT, || {
            let http = http.clone();
            let url = format!("{base}/status");
            async move {
                let v: Value = http.get(url).send().await?.json().await?;
                Ok(v["value"]["ready"].as_bool().unwrap_or(false).then_some(()))
            }
        })
        .await?;

        let mut args: Vec<String> = CHROMIUM_FLAGS.iter().chain(extra).map(|s| (*s).to_owned()).collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        args.push(format!("--window-size={},{}", DESKTOP.0, DESKTOP.1));
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.display().to_string(),
                "args": args,
                // Network events only: page and tracing events would flood the log.
                "perfLoggingPrefs": {"enableNetwork": true, "enablePage": false},
            },
            "goog:loggingPrefs": {"browser": "ALL", "performance": "ALL"},
            "timeouts": {"script": 30_000, "pageLoad": 30_000, "implicit": 0},
        });
        let session = tokio::time::timeout(START_TIMEOUT, Session::create(http.clone(), &base, caps))
            .await
            .context("opening a WebDriver session timed out")?
            .context("opening a WebDriver session (did Chromium start?)")?;

        let b = Self {
            session,
            http,
            logs: Mutex::default(),
            emulation: Mutex::new(Emulation { viewport: DESKTOP, dark: None }),
            origin: Mutex::new(None),
            profile,
            driver: Some(driver),
            temp: Some(temp),
        };
        b.apply_emulation().await?;
        Ok(b)
    }

    /// The WebDriver session, for any command the harness has no helper for.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The daemon origin requests are checked against (`http://127.0.0.1:<port>`).
    pub fn origin(&self) -> Option<String> {
        self.origin.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sets the daemon origin (done by [`Browser::login`]; needed before [`Browser::goto`] when a
    /// test opens the console without logging in). `base_url` may carry a path.
    ///
    /// # Errors
    /// When `base_url` is not an absolute http URL.
    pub fn set_origin(&self, base_url: &str) -> anyhow::Result<()> {
        let u = Url::parse(base_url).with_context(|| format!("bad base URL {base_url:?}"))?;
        *self.origin.lock().unwrap_or_else(|e| e.into_inner()) = Some(u.origin().ascii_serialization());
        Ok(())
    }

    /// Runs the Chrome DevTools Protocol command `cmd` with `params` on the current tab
    /// (chromedriver's passthrough); its result.
    ///
    /// # Errors
    /// When chromedriver or Chromium refuses the command.
    pub async fn cdp(&self, cmd: &str, params: Value) -> anyhow::Result<Value> {
        self.session
            .post("goog/cdp/execute", json!({"cmd": cmd, "params": params}))
            .await
            .with_context(|| format!("CDP {cmd}"))
    }

    async fn apply_emulation(&self) -> anyhow::Result<()> {
        let e = *self.emulation.lock().unwrap_or_else(|e| e.into_inner());
        let (w, h) = e.viewport;
        self.cdp(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": w, "height": h, "deviceScaleFactor": 1, "mobile": false}),
        )
        .await?;
        if let Some(dark) = e.dark {
            let value = if dark { "dark" } else { "light" };
            self.cdp(
                "Emulation.setEmulatedMedia",
                json!({"features": [{"name": "prefers-color-scheme", "value": value}]}),
            )
            .await?;
        }
        Ok(())
    }

    /// Sets the viewport to `width`×`height` CSS px (device scale 1) on this tab and on every
    /// tab opened later; the page re-lays out at once (media queries included).
    ///
    /// # Errors
    /// When the emulation command fails.
    pub async fn set_viewport(&self, width: u32, height: u32) -> anyhow::Result<()> {
        self.emulation.lock().unwrap_or_else(|e| e.into_inner()).viewport = (width, height);
        self.apply_emulation().await?;
        self.wait_until(&format!("window.innerWidth === {width} && window.innerHeight === {height}")).await
    }

    /// Emulates `prefers-color-scheme: dark` (`true`) or `light` (`false`) on this tab and on
    /// every tab opened later.
    ///
    /// # Errors
    /// When the emulation command fails.
    pub async fn set_dark(&self, dark: bool) -> anyhow::Result<()> {
        self.emulation.lock().unwrap_or_else(|e| e.into_inner()).dark = Some(dark);
        self.apply_emulation().await?;
        let q = if dark { "dark" } else { "light" };
        self.wait_until(&format!("matchMedia('(prefers-color-scheme: {q})').matches")).await
    }

    /// Opens the console's conversation `id` (`/ui/chat?c=ID`) and waits until its row is the
    /// current one and its thread has a title.
    ///
    /// # Errors
    /// A page that never shows it (the wait's deadline), or a WebDriver failure.
    pub async fn open_conversation(&self, id: &str) -> anyhow::Result<()> {
        self.goto(&format!("/ui/chat?c={id}")).await?;
        self.wait_for(&format!(".conv-item[aria-current=\"true\"][data-id=\"{id}\"]")).await?;
        self.wait_until(
            "document.querySelector('.thread-title') && document.querySelector('.thread-title').textContent !== '…'",
        )
        .await
    }

    /// Shortens the open chat page's own backoffs through its modules, so a test sees the page
    /// give up without waiting it out: `stream` is the event stream's first and longest
    /// reconnection wait (ms, `js/chat/events.js` `setRetryBackoffMs`; by default 250 ms
    /// doubling to 4 s, about 28 s for its ten reconnections), `send` the wait before a send's
    /// second try (ms, `js/chat/outbox.js` `setBackoffMs`; by default 500 ms, 7.5 s for its
    /// five tries). `None` leaves that one as it is; the numbers of tries stay the page's.
    ///
    /// # Errors
    /// When a module cannot be imported or WebDriver fails.
    pub async fn shorten_chat_backoffs(&self, stream: Option<(u64, u64)>, send: Option<u64>) -> anyhow::Result<()> {
        let (first, longest) = stream.unzip();
        let set = self
            .eval_async(
                "const [first, longest, send, done] = arguments;\
                 Promise.all([import('/ui/assets/js/chat/events.js'), import('/ui/assets/js/chat/outbox.js')]).then(([e, o]) => {\
                   if (first !== null) e.setRetryBackoffMs(first, longest);\
                   if (send !== null) o.setBackoffMs(send);\
                   done(true);\
                 }, err => done('ERR ' + err.message));",
                vec![json!(first), json!(longest), json!(send)],
            )
            .await?;
        ensure!(set == json!(true), "setting the chat page's backoffs: {set}");
        Ok(())
    }

    /// Signs this browser in: mints a one-time code with `POST /v1/ui/login-codes` (with
    /// `token`), opens its URL (which sets the session cookie and lands on `/ui/chat`), then
    /// goes to `/ui/<page>` and waits until the router has mounted that page
    /// (`#page[data-page=<page>]`). Also records `base_url`'s origin for
    /// [`Browser::foreign_requests`].
    ///
    /// # Errors
    /// When the code cannot be minted, the login is refused, or the page does not mount in
    /// time.
    pub async fn login(&self, base_url: &str, token: &str, page: &str) -> anyhow::Result<()> {
        let url = self.mint_login_url(base_url, token).await?;
        self.goto(&url).await.context("opening the login link")?;
        let at = self.current_url().await?;
        ensure!(at.path() == "/ui/chat", "the login link landed on {at}, not /ui/chat");
        if page != "chat" {
            self.goto(&format!("/ui/{page}")).await?;
        }
        self.wait_for_page(page).await
    }

    /// A fresh one-time login URL from `POST /v1/ui/login-codes` (the `url` of the answer).
    /// Also records `base_url`'s origin.
    ///
    /// # Errors
    /// When the daemon does not answer 200 with a `url`.
    pub async fn mint_login_url(&self, base_url: &str, token: &str) -> anyhow::Result<String> {
        self.set_origin(base_url)?;
        let base = base_url.trim_end_matches('/');
        let r = self
            .http
            .post(format!("{base}/v1/ui/login-codes"))
            .header("X-Coffer-Token", token)
            .send()
            .await
            .context("POST /v1/ui/login-codes")?;
        let status = r.status();
        let body: Value = r.json().await.context("login-codes answer is not JSON")?;
        ensure!(status.is_success(), "POST /v1/ui/login-codes answered {status}: {body}");
        Ok(body["url"].as_str().with_context(|| format!("no url in {body}"))?.to_owned())
    }

    /// Opens `path_or_url`: a path (`/ui/servers`) is taken relative to the daemon origin.
    ///
    /// # Errors
    /// When a path is given before the origin is known, or navigation fails.
    pub async fn goto(&self, path_or_url: &str) -> anyhow::Result<()> {
        let url = if path_or_url.starts_with('/') {
            let o = self.origin().context("goto a path before the daemon origin is known (login or set_origin)")?;
            format!("{o}{path_or_url}")
        } else {
            path_or_url.to_owned()
        };
        self.session.post("url", json!({"url": url})).await.with_context(|| format!("opening {url}"))?;
        Ok(())
    }

    /// The current tab's URL.
    ///
    /// # Errors
    /// When the session is gone.
    pub async fn current_url(&self) -> anyhow::Result<Url> {
        let v = self.session.get("url").await?;
        let s = v.as_str().with_context(|| format!("URL is not a string: {v}"))?;
        Ok(Url::parse(s)?)
    }

    /// Reloads the current tab.
    ///
    /// # Errors
    /// When the session is gone.
    pub async fn refresh(&self) -> anyhow::Result<()> {
        self.session.post("refresh", json!({})).await?;
        Ok(())
    }

    /// The browser's cookies for the current page, as WebDriver lists them (`name`, `value`,
    /// `httpOnly`, `sameSite`, …; HttpOnly ones included).
    ///
    /// # Errors
    /// When the session is gone.
    pub async fn cookies(&self) -> anyhow::Result<Vec<Value>> {
        Ok(self.session.get("cookie").await?.as_array().cloned().unwrap_or_default())
    }

    /// Deletes every cookie of the current page's origin (signs this browser out locally).
    ///
    /// # Errors
    /// When the session is gone.
    pub async fn delete_cookies(&self) -> anyhow::Result<()> {
        self.session.cmd(Method::DELETE, "cookie", None).await?;
        Ok(())
    }

    /// Waits until the router has mounted `page` (`#page[data-page="<page>"]`).
    ///
    /// # Errors
    /// When it does not happen within [`WAIT_TIMEOUT`].
    pub async fn wait_for_page(&self, page: &str) -> anyhow::Result<()> {
        self.wait_for(&format!("#page[data-page=\"{page}\"]")).await.map(drop)
    }

    /// Waits until the mounted page shows no visible "Loading…" placeholder (`#page .loading`,
    /// the console's convention for content still on its way): its first data has arrived.
    ///
    /// # Errors
    /// When one is still visible after [`WAIT_TIMEOUT`].
    pub async fn wait_settled(&self) -> anyhow::Result<()> {
        self.wait_until(
            "document.querySelector('#page[data-page]') !== null && \
             ![...document.querySelectorAll('#page .loading')].some(e => e.getClientRects().length > 0)",
        )
        .await
    }

    /// Opens a new tab (same profile, so same cookies), switches to it, applies the current
    /// emulation, and returns its handle. The previous tab's handle is
    /// [`Browser::current_tab`] before the call.
    ///
    /// # Errors
    /// When the tab cannot be opened.
    pub async fn new_tab(&self) -> anyhow::Result<String> {
        let r = self.session.post("window/new", json!({"type": "tab"})).await.context("opening a tab")?;
        let handle = r["handle"].as_str().with_context(|| format!("no handle in {r}"))?.to_owned();
        self.switch_to(&handle).await?;
        self.apply_emulation().await?;
        Ok(handle)
    }

    /// The current tab's handle.
    ///
    /// # Errors
    /// When the session is gone.
    pub async fn current_tab(&self) -> anyhow::Result<String> {
        let v = self.session.get("window").await?;
        Ok(v.as_str().with_context(|| format!("window handle is not a string: {v}"))?.to_owned())
    }

    /// Makes `tab` the tab later commands act on.
    ///
    /// # Errors
    /// When the tab is gone.
    pub async fn switch_to(&self, tab: &str) -> anyhow::Result<()> {
        self.session.post("window", json!({"handle": tab})).await?;
        Ok(())
    }

    /// Closes the current tab; later commands need a [`Browser::switch_to`] first.
    ///
    /// # Errors
    /// When the session is gone.
    pub async fn close_tab(&self) -> anyhow::Result<()> {
        self.session.cmd(Method::DELETE, "window", None).await?;
        Ok(())
    }

    /// Runs `body` (a function body: `return …`) in the page with `args` (`arguments[i]`; an
    /// [`Element`] is passed as [`Element::arg`]); its result as JSON (an element comes back
    /// as a reference: [`Browser::element`]).
    ///
    /// # Errors
    /// When the script throws (the message is Chromium's).
    pub async fn eval(&self, body: &str, args: Vec<Value>) -> anyhow::Result<Value> {
        let r = self.session.post("execute/sync", json!({"script": body, "args": args})).await;
        r.with_context(|| format!("script failed: {body}"))
    }

    /// Like [`Browser::eval`] for a script that calls `arguments[arguments.length - 1](result)`
    /// when done (WebDriver's async script; its timeout is 30 s).
    ///
    /// # Errors
    /// When the script throws or times out.
    pub async fn eval_async(&self, body: &str, args: Vec<Value>) -> anyhow::Result<Value> {
        let r = self.session.post("execute/async", json!({"script": body, "args": args})).await;
        r.with_context(|| format!("async script failed: {body}"))
    }

    /// Waits until an element matches `css`; returns the first one.
    ///
    /// # Errors
    /// When none appears within [`WAIT_TIMEOUT`] (the message names the selector).
    pub async fn wait_for(&self, css: &str) -> anyhow::Result<Element<'_>> {
        wait::wait_for(&format!("an element matching {css:?}"), WAIT_TIMEOUT, || async {
            match self.find(css).await {
                Ok(e) => Ok(Some(e)),
                Err(e) if e.downcast_ref::<webdriver::WebDriverError>().is_some_and(|e| e.is_no_such_element()) => {
                    Ok(None)
                }
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// The first element matching `css` now (no waiting).
    ///
    /// # Errors
    /// A [`webdriver::WebDriverError`] `no such element` when there is none.
    pub async fn find(&self, css: &str) -> anyhow::Result<Element<'_>> {
        let v = self.session.post("element", json!({"using": "css selector", "value": css})).await?;
        self.element(&v)
    }

    /// Every element matching `css` now, in document order.
    ///
    /// # Errors
    /// When the session is gone or `css` is not a valid selector.
    pub async fn find_all(&self, css: &str) -> anyhow::Result<Vec<Element<'_>>> {
        let v = self.session.post("elements", json!({"using": "css selector", "value": css})).await?;
        v.as_array().into_iter().flatten().map(|e| self.element(e)).collect()
    }

    /// The [`Element`] a script or command returned as a web element reference.
    ///
    /// # Errors
    /// When `v` is not one.
    pub fn element(&self, v: &Value) -> anyhow::Result<Element<'_>> {
        let id = element_id(v).with_context(|| format!("not an element reference: {v}"))?;
        Ok(Element { browser: self, id })
    }

    /// Waits until an element matching `css` has `text` in its text content; returns it.
    ///
    /// # Errors
    /// When none does within [`WAIT_TIMEOUT`] (the message names both).
    pub async fn wait_for_text(&self, css: &str, text: &str) -> anyhow::Result<Element<'_>> {
        const FIND: &str = "return [...document.querySelectorAll(arguments[0])]\
            .find(e => e.textContent.includes(arguments[1])) || null;";
        wait::wait_for(&format!("an element matching {css:?} with text {text:?}"), WAIT_TIMEOUT, || async {
            let v = self.eval(FIND, vec![json!(css), json!(text)]).await?;
            if v.is_null() {
                return Ok(None);
            }
            self.element(&v).map(Some)
        })
        .await
    }

    /// Waits until no element matches `css` (a dialog closed, a spinner gone).
    ///
    /// # Errors
    /// When one still does after [`WAIT_TIMEOUT`].
    pub async fn wait_gone(&self, css: &str) -> anyhow::Result<()> {
        let quoted = serde_json::to_string(css)?;
        self.wait_until(&format!("document.querySelector({quoted}) === null")).await
    }

    /// How many elements match `css` now.
    ///
    /// # Errors
    /// When the session is gone or `css` is not a valid selector.
    pub async fn count(&self, css: &str) -> anyhow::Result<usize> {
        Ok(self.find_all(css).await?.len())
    }

    /// Waits until the JavaScript expression `predicate` is truthy in the page.
    ///
    /// # Errors
    /// When it is not within [`WAIT_TIMEOUT`] (the message quotes it, and the last script
    /// error if it threw).
    pub async fn wait_until(&self, predicate: &str) -> anyhow::Result<()> {
        self.wait_until_within(predicate, WAIT_TIMEOUT).await
    }

    /// [`Browser::wait_until`] with its own deadline.
    ///
    /// # Errors
    /// As [`Browser::wait_until`].
    pub async fn wait_until_within(&self, predicate: &str, timeout: Duration) -> anyhow::Result<()> {
        let body = format!("return !!({predicate});");
        wait::wait_for(&format!("`{predicate}` to hold in the page"), timeout, || async {
            Ok(self.eval(&body, vec![]).await?.as_bool().unwrap_or(false).then_some(()))
        })
        .await
    }

    /// Presses and releases `key` (a real key event, as a user would: [`keys::TAB`],
    /// [`keys::ENTER`], or a character such as `"a"`) on whatever has the focus.
    ///
    /// # Errors
    /// When WebDriver refuses the action.
    pub async fn press(&self, key: &str) -> anyhow::Result<()> {
        self.chord(&[key]).await
    }

    /// Presses `keys` in order and releases them in reverse (a chord such as
    /// `[keys::SHIFT, keys::TAB]` or `[keys::CONTROL, keys::ENTER]`).
    ///
    /// # Errors
    /// When WebDriver refuses the action.
    pub async fn chord(&self, keys: &[&str]) -> anyhow::Result<()> {
        let downs = keys.iter().map(|k| json!({"type": "keyDown", "value": k}));
        let ups = keys.iter().rev().map(|k| json!({"type": "keyUp", "value": k}));
        let actions =
            json!({"actions": [{"type": "key", "id": "keyboard", "actions": downs.chain(ups).collect::<Vec<_>>()}]});
        self.session.post("actions", actions).await.context("pressing keys")?;
        Ok(())
    }

    /// The element that has the focus (`document.activeElement`).
    ///
    /// # Errors
    /// When the session is gone.
    pub async fn active_element(&self) -> anyhow::Result<Element<'_>> {
        let v = self.session.get("element/active").await?;
        self.element(&v)
    }

    /// Clicks (a real click) the first element matching `css` whose trimmed text is `text` (any
    /// text when empty), waiting up to [`STEP`] for it; an element the page re-rendered between
    /// finding and clicking (`stale element reference`) is found again.
    ///
    /// # Errors
    /// When no such element appears in time, or the click fails otherwise.
    pub async fn click_text(&self, css: &str, text: &str) -> anyhow::Result<()> {
        const FIND: &str = "return [...document.querySelectorAll(arguments[0])]
            .find(e => !arguments[1] || e.textContent.trim() === arguments[1]) || null;";
        wait::wait_for(&format!("{css:?} with text {text:?} to click"), STEP, || async {
            let v = self.eval(FIND, vec![json!(css), json!(text)]).await?;
            if v.is_null() {
                return Ok(None);
            }
            match self.element(&v)?.click().await {
                Ok(()) => Ok(Some(())),
                Err(e) if stale(&e) => Ok(None),
                Err(e) => Err(e.context(format!("clicking {css:?} {text:?}"))),
            }
        })
        .await
    }

    /// Types `value` into the first input or textarea matching `css` (emptied first), key by key
    /// as a user would; a re-rendered element is found again.
    ///
    /// # Errors
    /// When no such element appears within [`STEP`], or typing fails otherwise.
    pub async fn fill(&self, css: &str, value: &str) -> anyhow::Result<()> {
        wait::wait_for(&format!("{css:?} to type into"), STEP, || async {
            let el = self.wait_for(css).await?;
            match async {
                el.clear().await?;
                el.send_keys(value).await
            }
            .await
            {
                Ok(()) => Ok(Some(())),
                Err(e) if stale(&e) => Ok(None),
                Err(e) => Err(e.context(format!("typing into {css:?}"))),
            }
        })
        .await
    }

    /// Chooses `value` in the `<select>` matching `css` and fires `change`.
    ///
    /// # Errors
    /// When there is no such select or it has no such option.
    pub async fn choose(&self, css: &str, value: &str) -> anyhow::Result<()> {
        let ok = self
            .eval(
                "const s = document.querySelector(arguments[0]); if (!s) return false; s.value = arguments[1];
                 s.dispatchEvent(new Event('change', {bubbles: true})); return s.value === arguments[1];",
                vec![json!(css), json!(value)],
            )
            .await?;
        ensure!(ok == json!(true), "no {css:?} with an option {value:?}");
        Ok(())
    }

    /// Screenshots of the current page from its top, without toasts, at 1280 and 360 px wide
    /// (`<name>-1280`, `<name>-360`), and a check that nothing overflows sideways at 360 px.
    ///
    /// # Errors
    /// When a screenshot fails or the page is wider than the 360 px viewport.
    pub async fn shots(&self, name: &str) -> anyhow::Result<()> {
        self.eval(
            "document.getElementById('toasts')?.replaceChildren(); const p = document.getElementById('page'); if (p) p.scrollTop = 0; window.scrollTo(0, 0); return true;",
            vec![],
        )
        .await?;
        self.set_viewport(1280, 800).await?;
        self.screenshot(&format!("{name}-1280")).await?;
        self.set_viewport(360, 740).await?;
        let w = self.eval("return [document.documentElement.scrollWidth, window.innerWidth];", vec![]).await?;
        ensure!(w[0].as_u64() <= w[1].as_u64(), "{name} overflows sideways at 360 px: {w}");
        self.screenshot(&format!("{name}-360")).await?;
        self.set_viewport(1280, 800).await?;
        Ok(())
    }

    /// Saves a PNG of the current viewport as `target/ui-screenshots/<name>.png` (the folder
    /// is created); its path.
    ///
    /// # Errors
    /// When the screenshot cannot be taken or written.
    pub async fn screenshot(&self, name: &str) -> anyhow::Result<PathBuf> {
        ensure!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_".contains(c)),
            "screenshot name {name:?}: use letters, digits, '-' and '_'"
        );
        let b64 = self.session.get("screenshot").await.context("taking a screenshot")?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().context("screenshot is not a string")?)
            .context("screenshot is not base64")?;
        let dir = screenshot_dir()?;
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// Moves what chromedriver has logged since the last call into the harness.
    async fn drain_logs(&self) -> anyhow::Result<()> {
        let console = self.session.post("se/log", json!({"type": "browser"})).await?;
        let perf = self.session.post("se/log", json!({"type": "performance"})).await?;
        let mut logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        for e in console.as_array().into_iter().flatten() {
            logs.console.push(ConsoleEntry {
                level: e["level"].as_str().unwrap_or_default().to_owned(),
                source: e["source"].as_str().unwrap_or_default().to_owned(),
                message: e["message"].as_str().unwrap_or_default().to_owned(),
            });
        }
        for e in perf.as_array().into_iter().flatten() {
            let Some(m) = e["message"].as_str().and_then(|m| serde_json::from_str::<Value>(m).ok()) else { continue };
            if m["message"]["method"] == "Network.requestWillBeSent"
                && let Some(url) = m["message"]["params"]["request"]["url"].as_str()
            {
                logs.requests.push(url.to_owned());
            }
        }
        Ok(())
    }

    /// Every console message so far (all levels).
    ///
    /// # Errors
    /// When chromedriver's log endpoint fails.
    pub async fn console(&self) -> anyhow::Result<Vec<ConsoleEntry>> {
        self.drain_logs().await?;
        Ok(self.logs.lock().unwrap_or_else(|e| e.into_inner()).console.clone())
    }

    /// Console errors and warnings so far (`SEVERE` and `WARNING`), minus those marked
    /// expected with [`Browser::allow_console`].
    ///
    /// # Errors
    /// When chromedriver's log endpoint fails.
    pub async fn console_errors(&self) -> anyhow::Result<Vec<ConsoleEntry>> {
        self.drain_logs().await?;
        let logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        Ok(logs
            .console
            .iter()
            .filter(|e| matches!(e.level.as_str(), "SEVERE" | "WARNING"))
            .filter(|e| !logs.allowed.iter().any(|a| e.message.contains(a.as_str())))
            .cloned()
            .collect())
    }

    /// Marks console errors or warnings containing `substring` as expected for the rest of
    /// this browser's life (a test that provokes one on purpose, e.g. a CSP violation).
    pub fn allow_console(&self, substring: &str) {
        self.logs.lock().unwrap_or_else(|e| e.into_inner()).allowed.push(substring.to_owned());
    }

    /// Marks requests to `origin` (`http://127.0.0.1:<port>`) as expected for the rest of this
    /// browser's life (a test that serves a page of its own, e.g. a forged cross-origin form).
    ///
    /// # Errors
    /// When `origin` is not a URL.
    pub fn allow_origin(&self, origin: &str) -> anyhow::Result<()> {
        let o = Url::parse(origin).with_context(|| format!("bad origin {origin:?}"))?.origin().ascii_serialization();
        self.logs.lock().unwrap_or_else(|e| e.into_inner()).allowed_origins.push(o);
        Ok(())
    }

    /// Every URL requested so far (`Network.requestWillBeSent`).
    ///
    /// # Errors
    /// When chromedriver's log endpoint fails.
    pub async fn requests(&self) -> anyhow::Result<Vec<String>> {
        self.drain_logs().await?;
        Ok(self.logs.lock().unwrap_or_else(|e| e.into_inner()).requests.clone())
    }

    /// Requests so far to anything but the daemon's origin (`data:` URLs and the browser's own
    /// `about:`/`chrome:` pages allowed, and origins marked with [`Browser::allow_origin`]).
    /// Before the origin is known every other request counts.
    ///
    /// # Errors
    /// When chromedriver's log endpoint fails.
    pub async fn foreign_requests(&self) -> anyhow::Result<Vec<String>> {
        let origin = self.origin();
        let requests = self.requests().await?;
        let allowed = self.logs.lock().unwrap_or_else(|e| e.into_inner()).allowed_origins.clone();
        Ok(requests
            .into_iter()
            .filter(|u| is_foreign(u, origin.as_deref()))
            .filter(|u| Url::parse(u).map_or(true, |u| !allowed.contains(&u.origin().ascii_serialization())))
            .collect())
    }

    /// Fails the test on any console error or warning (except those allowed) and on any request
    /// to another origin, listing them all. Every browser test ends with this.
    ///
    /// # Panics
    /// On any of the above, or when the logs cannot be read.
    pub async fn assert_clean(&self) {
        let errors = self.console_errors().await.expect("reading the browser console");
        let foreign = self.foreign_requests().await.expect("reading the browser's requests");
        let list = |v: Vec<String>| v.into_iter().map(|s| format!("\n  {s}")).collect::<String>();
        assert!(
            errors.is_empty() && foreign.is_empty(),
            "the browser was not clean:\nconsole errors/warnings:{}\nrequests to other origins (daemon {:?}):{}",
            list(errors.iter().map(ToString::to_string).collect()),
            self.origin(),
            list(foreign),
        );
    }

    /// `document.documentElement.scrollWidth - window.innerWidth` in CSS px: above 0 means the
    /// page scrolls sideways.
    ///
    /// # Errors
    /// When the script fails.
    pub async fn horizontal_overflow(&self) -> anyhow::Result<i64> {
        let v = self.eval("return document.documentElement.scrollWidth - window.innerWidth;", vec![]).await?;
        v.as_i64().with_context(|| format!("overflow is not a number: {v}"))
    }

    /// Ends the WebDriver session (Chromium quits), then stops chromedriver.
    ///
    /// # Errors
    /// When the session cannot be closed (the processes are killed anyway).
    pub async fn close(self) -> anyhow::Result<()> {
        self.session.delete().await.context("closing the WebDriver session")
    }
}

/// An element of the current page (a WebDriver element reference). Stale once the page
/// replaces it: find it again.
#[derive(Clone)]
pub struct Element<'a> {
    browser: &'a Browser,
    id: String,
}

impl std::fmt::Debug for Element<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Element({})", self.id)
    }
}

impl Element<'_> {
    /// This element as a script argument (`arguments[i]` in [`Browser::eval`]).
    pub fn arg(&self) -> Value {
        json!({ ELEMENT_KEY: self.id })
    }

    async fn get(&self, what: &str) -> anyhow::Result<Value> {
        Ok(self.browser.session.get(&format!("element/{}/{what}", self.id)).await?)
    }

    async fn post(&self, what: &str, body: Value) -> anyhow::Result<Value> {
        Ok(self.browser.session.post(&format!("element/{}/{what}", self.id), body).await?)
    }

    /// Clicks it as a user would (scrolled into view; fails when something covers it).
    ///
    /// # Errors
    /// `element not interactable`, `element click intercepted`, `stale element reference`.
    pub async fn click(&self) -> anyhow::Result<()> {
        self.post("click", json!({})).await.map(drop)
    }

    /// Focuses it and types `text` (characters, or [`keys`] for special keys).
    ///
    /// # Errors
    /// As [`Element::click`].
    pub async fn send_keys(&self, text: &str) -> anyhow::Result<()> {
        self.post("value", json!({"text": text})).await.map(drop)
    }

    /// Empties an input or textarea.
    ///
    /// # Errors
    /// As [`Element::click`].
    pub async fn clear(&self) -> anyhow::Result<()> {
        self.post("clear", json!({})).await.map(drop)
    }

    /// Its rendered text (`innerText`: visible text only).
    ///
    /// # Errors
    /// When it is stale.
    pub async fn text(&self) -> anyhow::Result<String> {
        Ok(self.get("text").await?.as_str().unwrap_or_default().to_owned())
    }

    /// The attribute `name` (`None` when absent).
    ///
    /// # Errors
    /// When it is stale.
    pub async fn attr(&self, name: &str) -> anyhow::Result<Option<String>> {
        Ok(self.get(&format!("attribute/{name}")).await?.as_str().map(str::to_owned))
    }

    /// The DOM property `name` (e.g. `value`, `checked`) as JSON.
    ///
    /// # Errors
    /// When it is stale.
    pub async fn prop(&self, name: &str) -> anyhow::Result<Value> {
        self.get(&format!("property/{name}")).await
    }

    /// Whether it is displayed (WebDriver's visibility check).
    ///
    /// # Errors
    /// When it is stale.
    pub async fn is_displayed(&self) -> anyhow::Result<bool> {
        Ok(self.get("displayed").await?.as_bool().unwrap_or(false))
    }
}

/// True when `url` is neither on `origin` nor a `data:` URL nor the browser's own
/// (`about:blank` of a new tab, `chrome://` pages): a request that leaves for somewhere else.
fn is_foreign(url: &str, origin: Option<&str>) -> bool {
    if ["data:", "about:", "chrome:", "chrome-untrusted:"].iter().any(|s| url.starts_with(s)) {
        return false;
    }
    let Ok(u) = Url::parse(url) else { return true };
    origin.is_none_or(|o| u.origin().ascii_serialization() != o)
}

/// `target/ui-screenshots/` of the build the tests run from.
///
/// # Errors
/// When the target directory cannot be found.
pub fn screenshot_dir() -> anyhow::Result<PathBuf> {
    let bins = crate::bins::bin_dir()?;
    let target = bins.parent().unwrap_or(Path::new("."));
    Ok(target.join("ui-screenshots"))
}

/// Fails unless `entries` holds exactly one message containing `substring` (for a test that
/// provokes one console message on purpose).
///
/// # Errors
/// Listing what was there instead.
pub fn expect_one(entries: &[ConsoleEntry], substring: &str) -> anyhow::Result<()> {
    let n = entries.iter().filter(|e| e.message.contains(substring)).count();
    if n != 1 {
        bail!("expected one console message with {substring:?}, found {n}: {entries:#?}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_means_another_origin() {
        let o = Some("http://127.0.0.1:8000");
        assert!(!is_foreign("http://127.0.0.1:8000/ui/assets/app.css", o));
        assert!(!is_foreign("data:image/svg+xml;base64,AAAA", o));
        assert!(is_foreign("http://127.0.0.1:8001/", o), "another port is another origin");
        assert!(is_foreign("http://localhost:8000/", o), "another host name is another origin");
        assert!(is_foreign("https://127.0.0.1:8000/", o), "another scheme is another origin");
        assert!(is_foreign("https://cdn.example.com/x.js", o));
        assert!(is_foreign("http://127.0.0.1:8000/", None), "no origin known: everything counts");
        assert!(!is_foreign("about:blank", o));
        assert!(!is_foreign("blob:http://127.0.0.1:8000/5b1c", o), "a blob of ours is ours");
        assert!(is_foreign("blob:http://127.0.0.1:9/5b1c", o));
        assert!(is_foreign("ws://127.0.0.1:9/", o));
        assert!(is_foreign("not a url", o));
    }
}
