//! `coffer ui`: signs a browser in to the web console without pasting a token. Starts the daemon
//! if needed, mints a one-time login link (`POST /v1/ui/login-codes`), prints it to the terminal
//! and opens a browser when one is available (`$BROWSER`, else `xdg-open` with a display;
//! watches it for at most 1.5 s for an early failure, and a failure is a hint, not an error).
//! `--logout-all` signs every browser out instead (`DELETE /v1/ui/sessions`).
//!
//! For another device (a phone on the tailnet): `--host NAME` mints the link at that origin of
//! the setting `ui.allowed_hosts` (its host name or whole origin), and `--qr` also prints it as
//! a QR code of Unicode half blocks to scan ([`qr_text`]; `--qr` alone takes the first entry of
//! `ui.allowed_hosts`). Neither opens a local browser: the link is for the other device, and it
//! works once. `docs/REMOTE.md` has the setup.
//!
//! The browser is never given the link itself: a command line is readable by every local user
//! (`/proc/PID/cmdline`), and whoever redeems a link first is signed in. Like Jupyter's
//! `jpserver-*-open.html`, it gets `file://` of a 0600 page in the 0700 `COFFER_HOME`
//! ([`coffer_runtime::home::CofferHome::login_redirect`]) that redirects to the link (a `meta` refresh: a `file://`
//! page may navigate to `http://127.0.0.1`). The edge removes that page when it redeems the
//! code, and sweeps any left over once their links have expired; this command removes it at
//! once when no browser could be started.
use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;
use coffer_api::console::{LoginCode, LoginCodeRequest, Revoked};
use coffer_api::settings::SettingsValues;
use coffer_types::settings::UI_ALLOWED_HOSTS;
use serde_json::json;

use crate::context::Ctx;
use crate::error::CliError;
use crate::output;

pub const EXAMPLES: &str = "\
Examples:
  coffer ui                      # print the link and open it in the browser
  coffer ui --page servers       # land on the servers page
  coffer ui --no-open --json     # {\"url\": …, \"expires_in_s\": 60}
  coffer ui --logout-all         # sign every browser out
  coffer ui --qr                 # a QR code of the link at the first of ui.allowed_hosts, for a phone
  coffer ui --host box.tail1234.ts.net --json   # the link at that allowed host

For a phone or another machine, first name the host: `coffer settings set ui.allowed_hosts
https://box.tail1234.ts.net` (docs/REMOTE.md: Tailscale, SSH tunnels, reverse proxies).

The link works once and expires after `ui.login_code_ttl_s` seconds (60 by default).
The browser comes from $BROWSER, else xdg-open when DISPLAY or WAYLAND_DISPLAY is set.";

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct UiArgs {
    /// Print the link only; do not open a browser.
    #[arg(long)]
    pub no_open: bool,
    /// The page to land on.
    #[arg(long, value_name = "PAGE", value_parser = clap::builder::PossibleValuesParser::new(coffer_types::ui::PAGES))]
    pub page: Option<String>,
    /// Sign every browser out (ends every web session) instead; prints how many ended.
    #[arg(long, conflicts_with_all = ["no_open", "page", "host", "qr"])]
    pub logout_all: bool,
    /// Make the link for this host of the setting `ui.allowed_hosts` (its name or origin), for
    /// another device; no local browser is opened.
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
    /// Also print the link as a QR code to scan with a phone (the host: `--host`, else the first
    /// of `ui.allowed_hosts`); no local browser is opened.
    #[arg(long)]
    pub qr: bool,
}

/// Runs `coffer ui`.
///
/// # Errors
/// API errors; exit 5 when the daemon cannot be reached or started.
pub async fn run(ctx: &Ctx, args: UiArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    if args.logout_all {
        let resp = api.send(api.request(reqwest::Method::DELETE, "/v1/ui/sessions")).await?;
        if ctx.json {
            return output::print_body(&resp.body);
        }
        let n = resp.parse::<Revoked>()?.revoked;
        return output::println(&format!(
            "Signed out {n} web session{}; run `coffer ui` to sign in again.",
            if n == 1 { "" } else { "s" }
        ));
    }
    let mut host = args.host.clone();
    if args.qr && host.is_none() {
        // `--qr` alone: the first allowed host (a phone cannot open 127.0.0.1).
        let SettingsValues { values } = api.get_as("/v1/settings").await?;
        let configured = values.get(UI_ALLOWED_HOSTS.key).map(String::as_str).unwrap_or("");
        host = coffer_types::remote::parse_allowed_hosts(configured)
            .unwrap_or_default()
            .first()
            .map(coffer_types::remote::AllowedOrigin::origin);
        if host.is_none() {
            crate::eprintln_printable!(
                "hint: the setting ui.allowed_hosts is empty, so this link names 127.0.0.1, which only this machine \
                 can open. For a phone: coffer settings set ui.allowed_hosts https://NAME (see docs/REMOTE.md)"
            );
        }
    }
    let body = LoginCodeRequest { page: args.page.clone(), host: host.clone() };
    let minted: LoginCode =
        api.send(api.request(reqwest::Method::POST, "/v1/ui/login-codes").json(&body)).await?.parse()?;
    let LoginCode { code, url, expires_in_s: ttl } = minted;
    if ctx.json {
        let mut v = json!({"url": url, "expires_in_s": ttl});
        if args.qr {
            v["qr"] = json!(qr_text(&url));
        }
        output::print_json(&v)?;
    } else {
        if args.qr {
            output::print(&qr_text(&url))?;
        }
        output::println(&format!("Open {url} (valid {ttl} s, once)"))?;
    }
    if !args.no_open && host.is_none() && !args.qr {
        let page = ctx.home.login_redirect(&code);
        if let Err(e) = write_redirect_page(&page, &url) {
            crate::eprintln_printable!("hint: could not write {} ({e}); open the link above yourself", page.display());
            return Ok(());
        }
        let target = format!("file://{}", page.display());
        let opened = open_in_browser(&target, |k| std::env::var_os(k)).await;
        if !matches!(opened, Opened::Started(_)) {
            let _ = std::fs::remove_file(&page);
        }
        match opened {
            Opened::Started(how) => crate::eprintln_printable!("Opening it with {how}…"),
            Opened::NoBrowser => {
                crate::eprintln_printable!(
                    "hint: no browser to open it with (set $BROWSER, or open the link yourself)"
                );
            }
            Opened::Failed(why) => {
                crate::eprintln_printable!(
                    "hint: could not open the browser ({why}); the link above is still valid: open it yourself"
                );
            }
        }
    }
    Ok(())
}

/// `url` as a QR code for a terminal: Unicode half blocks (`▀`, `▄`, `█`, space; two module
/// rows per line), drawn for the usual dark-background terminal (light modules are the
/// terminal's light foreground blocks, dark modules the background), with the standard
/// four-module quiet zone, each line ending in a newline. Error correction level M; a login link
/// of about 110 characters is a version-7 code (45 modules: 53 columns, 27 lines). On a
/// light-background terminal it shows inverted, which most phone cameras also read.
pub fn qr_text(url: &str) -> String {
    use qrcode::render::unicode::Dense1x2;
    let code = qrcode::QrCode::with_error_correction_level(url.as_bytes(), qrcode::EcLevel::M)
        .expect("a login link fits a QR code");
    let mut text =
        code.render::<Dense1x2>().dark_color(Dense1x2::Light).light_color(Dense1x2::Dark).quiet_zone(true).build();
    text.push('\n');
    text
}

/// Writes the login redirect page at `path` (created new, mode 0600; an existing file there is
/// replaced only after it is removed, so a planted link cannot redirect the write): an HTML
/// page whose `meta` refresh (and a link, for a browser that ignores it) goes to `url`.
///
/// # Errors
/// When the file cannot be created or written.
pub fn write_redirect_page(path: &std::path::Path, url: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let _ = std::fs::remove_file(path);
    let href = html_attr(url);
    let body = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"referrer\" content=\"no-referrer\">\
<meta http-equiv=\"refresh\" content=\"0;url={href}\">\
<title>Coffer — signing in</title></head>\
<body><p>Signing in to Coffer… <a href=\"{href}\">Continue</a></p></body></html>\n"
    );
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    f.write_all(body.as_bytes())?;
    f.sync_all()
}

/// `s` escaped for a double-quoted HTML attribute.
fn html_attr(s: &str) -> String {
    s.replace('&', "&amp;").replace('"', "&quot;").replace('<', "&lt;").replace('>', "&gt;")
}

/// What [`open_in_browser`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// A browser (named) was started; nobody waits for it.
    Started(String),
    /// None is configured or available.
    NoBrowser,
    /// One is configured but could not be started.
    Failed(String),
}

/// How to open `url`: the program and its arguments. `$BROWSER` (a `:`-separated list; the first
/// entry that resolves wins; `%s` in it is the URL, else the URL is appended), else `xdg-open`
/// when `DISPLAY` or `WAYLAND_DISPLAY` is set (`open` on macOS). `None`: nothing to open with.
pub fn browser_command(url: &str, var: impl Fn(&str) -> Option<OsString>) -> Option<(PathBuf, Vec<String>)> {
    let resolve = |program: &str| -> Option<PathBuf> {
        let p = PathBuf::from(program);
        if p.is_absolute() { p.is_file().then_some(p) } else { coffer_runtime::connect::which_on_path(program) }
    };
    if let Some(list) = var("BROWSER").map(|v| v.to_string_lossy().into_owned()) {
        for entry in list.split(':').map(str::trim).filter(|e| !e.is_empty()) {
            let mut words = entry.split_whitespace();
            let Some(program) = words.next().and_then(resolve) else { continue };
            let mut args: Vec<String> = words.map(|w| w.replace("%s", url)).collect();
            if !entry.contains("%s") {
                args.push(url.to_owned());
            }
            return Some((program, args));
        }
    }
    if cfg!(target_os = "macos") {
        return resolve("open").map(|p| (p, vec![url.to_owned()]));
    }
    let display = ["DISPLAY", "WAYLAND_DISPLAY"].iter().any(|k| var(k).is_some_and(|v| !v.is_empty()));
    if display {
        return resolve("xdg-open").map(|p| (p, vec![url.to_owned()]));
    }
    None
}

/// How long `coffer ui` watches the opener for an early failure before it assumes success.
pub const OPENER_WAIT: std::time::Duration = std::time::Duration::from_millis(1500);

/// Starts a browser on `url` (detached: it outlives this command, gets no death signal, and its
/// output goes nowhere) and watches it for at most [`OPENER_WAIT`]: an opener that has exited
/// non-zero by then (`BROWSER=/bin/false`, an `xdg-open` with nothing to open with) is
/// [`Opened::Failed`]; one still running, or done with success, is [`Opened::Started`].
pub async fn open_in_browser(url: &str, var: impl Fn(&str) -> Option<OsString>) -> Opened {
    let Some((program, args)) = browser_command(url, var) else { return Opened::NoBrowser };
    let name = program.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut spec = coffer_runtime::spawn::SpawnSpec::new(&program, "browser", &name);
    spec.args = args.into_iter().map(Into::into).collect();
    spec.detached = true;
    let mut child = match coffer_runtime::spawn::spawn(spec) {
        Ok(child) => child,
        Err(e) => return Opened::Failed(e.to_string()),
    };
    match tokio::time::timeout(OPENER_WAIT, child.inner().wait()).await {
        Ok(Ok(status)) if !status.success() => Opened::Failed(format!("{name} {status}")),
        // Done with success, or still running: dropping a detached child leaves it running.
        _ => Opened::Started(name),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn a_login_links_qr_code_is_a_square_of_half_blocks() {
        let url = format!("https://box.tail1234.ts.net/ui/login?code={}", "ab12".repeat(16));
        let text = qr_text(&url);
        let lines: Vec<&str> = text.lines().collect();
        // Square: N modules and a 4-module quiet zone each side are N+8 columns and (N+8)/2
        // lines, rounded up; a login link is version 7 (45 modules): 53 columns, fitting an
        // 80-column terminal.
        let width = lines[0].chars().count();
        assert_eq!(width, 53, "{text}");
        assert!(lines.iter().all(|l| l.chars().count() == width), "{text}");
        assert_eq!(lines.len(), width.div_ceil(2), "{text}");
        assert!(text.chars().all(|c| matches!(c, '█' | '▀' | '▄' | ' ' | '\n')), "{text}");
        // The quiet zone is light: full blocks on a dark terminal.
        assert!(lines[0].chars().all(|c| c == '█'), "{}", lines[0]);
        assert!(text.ends_with('\n'));
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.into())
    }

    #[test]
    fn the_redirect_page_is_0600_and_goes_to_the_link() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ui-login-0123456789abcdef.html");
        std::fs::write(&path, "planted").unwrap();
        let url = "http://127.0.0.1:8000/ui/login?code=ab&next=/ui/servers";
        write_redirect_page(&path, url).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        let escaped = "http://127.0.0.1:8000/ui/login?code=ab&amp;next=/ui/servers";
        assert!(text.contains(&format!("content=\"0;url={escaped}\"")), "{text}");
        assert!(text.contains(&format!("href=\"{escaped}\"")), "{text}");
        assert!(!text.contains("planted"));
        assert_eq!(html_attr("a\"<b>&"), "a&quot;&lt;b&gt;&amp;");
    }

    #[test]
    fn the_browser_comes_from_browser_then_a_display() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("mybrowser");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let exe_s = exe.to_string_lossy().into_owned();
        let url = "http://127.0.0.1:8000/ui/login?code=ab";

        let (p, args) = browser_command(url, env(&[("BROWSER", &exe_s)])).unwrap();
        assert_eq!((p, args), (exe.clone(), vec![url.to_owned()]));
        // `%s` places the URL; extra words are arguments; a missing first entry is skipped.
        let list = format!("/nonexistent/browser:{exe_s} --new-window %s");
        let (p, args) = browser_command(url, env(&[("BROWSER", &list)])).unwrap();
        assert_eq!((p, args), (exe.clone(), vec!["--new-window".to_owned(), url.to_owned()]));
        // Nothing usable and no display: nothing to open with.
        assert_eq!(browser_command(url, env(&[("BROWSER", "/nonexistent/browser")])), None);
        if !cfg!(target_os = "macos") {
            assert_eq!(browser_command(url, env(&[])), None);
            assert_eq!(browser_command(url, env(&[("DISPLAY", "")])), None);
        }
    }
}
