//! Issue 32 part 2: another uid watching every command line (`/proc/*/cmdline`, readable by
//! all) while the owner runs `coffer ui` finds no login code: the browser opener is given a
//! `file://` page in `COFFER_HOME`, and that page (0600, in a 0700 folder) is unreadable to it.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::hostile::sh_as_other_user;
use coffer_tests::{TestHome, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_uid_finds_no_login_code_on_any_command_line_nor_in_the_page() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let _api = home.start_daemon().await?;
    // COFFER_HOME's parent stands for a world-readable home folder.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(home.temp(), std::fs::Permissions::from_mode(0o755))?;

    // The opener records its command line, then stays running (as a browser does) until the
    // hostile scan is done: the scan sees it alive.
    let seen = home.temp().join("opener-argv.txt");
    let go = home.temp().join("opener-go");
    let opener = home.temp().join("opener.sh");
    std::fs::write(
        &opener,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$@\" > {s}.tmp && mv {s}.tmp {s}\n\
             while [ ! -e {g} ]; do sleep 0.05; done\n",
            s = seen.display(),
            g = go.display()
        ),
    )?;
    std::fs::set_permissions(&opener, std::fs::Permissions::from_mode(0o755))?;
    let mut cmd = home.cli_command(&["ui"])?;
    cmd.env("BROWSER", &opener).env_remove("DISPLAY").env_remove("WAYLAND_DISPLAY");
    let ui = cmd.spawn().context("starting coffer ui")?;
    let argv =
        wait_for("the opener to start", Duration::from_secs(30), || async { Ok(std::fs::read_to_string(&seen).ok()) })
            .await?;
    let page = argv.trim().strip_prefix("file://").with_context(|| format!("not a file URL: {argv}"))?.to_owned();

    // The hostile user reads every command line there is, and tries the page.
    let (_, cmdlines, _) =
        sh_as_other_user("for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < \"$f\" 2>/dev/null; echo; done")?;
    let (code, stolen, err) = sh_as_other_user(&format!("cat -- '{page}'"))?;
    std::fs::write(&go, "")?;
    let out = tokio::time::timeout(Duration::from_secs(60), ui.wait_with_output()).await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success(), "{stdout} {}", String::from_utf8_lossy(&out.stderr));

    // The scan did see the opener (the attack works as intended)…
    ensure!(cmdlines.contains(&format!("file://{page}")), "the scan missed the opener: {cmdlines}");
    // …but no code: the link is only in the owner's terminal.
    let link = stdout.split_whitespace().find(|w| w.starts_with("http://")).context("no link printed")?;
    let login_code = link.split_once("code=").context("code")?.1.split('&').next().context("code")?;
    ensure!(login_code.len() == 64, "{link}");
    ensure!(!cmdlines.contains(login_code), "a command line holds the login code");
    ensure!(!cmdlines.contains("/ui/login"), "a command line holds a login link");
    // The page is the owner's alone.
    ensure!(code != 0 && stolen.is_empty(), "another uid read the redirect page: {stolen}");
    ensure!(err.contains("Permission denied"), "refused for another reason: {err}");
    ensure!(std::fs::metadata(&page)?.permissions().mode() & 0o777 == 0o600);
    Ok(())
}
