//! The profile this shim's client uses (issue 36 §1): `--profile NAME` (or `--profile=NAME`)
//! on the command line, else `COFFER_PROFILE` in the environment, else none (the daemon's
//! `default`). The shim sends it as the `Coffer-Profile` header on the connection it opens to
//! `/mcp` (the stream's upgrade request, or each Streamable HTTP request); the daemon checks
//! it and refuses an unknown or malformed one at `initialize` with a JSON-RPC error naming
//! the profile and `coffer profile list`, which the client shows.
use std::sync::OnceLock;

use reqwest::header::HeaderValue;

static PROFILE: OnceLock<Option<HeaderValue>> = OnceLock::new();

/// The profile named by the shim's arguments (its command line after the program name).
///
/// # Errors
/// A message for `--profile` without a name, or an argument the shim does not take (it
/// takes only `--profile`).
pub fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Option<String>, String> {
    let mut args = args.into_iter();
    let mut profile = None;
    while let Some(a) = args.next() {
        let name = if a == "--profile" {
            args.next().ok_or("--profile needs a profile name (see `coffer profile list`)")?
        } else if let Some(n) = a.strip_prefix("--profile=") {
            n.to_owned()
        } else {
            return Err(format!(
                "coffer-mcp-shim takes only --profile NAME, not {:?}",
                a.chars().take(60).collect::<String>()
            ));
        };
        if name.is_empty() {
            return Err("--profile needs a profile name (see `coffer profile list`)".into());
        }
        profile = Some(name);
    }
    Ok(profile)
}

/// Fixes the shim's profile for the process: `from_args` when given, else `COFFER_PROFILE`
/// (empty: none). A later call changes nothing.
///
/// # Errors
/// When the name cannot be sent in a header (control characters); any other malformed name
/// is the daemon's to refuse, where the client sees it.
pub fn init(from_args: Option<String>) -> Result<(), String> {
    let name = from_args.or_else(|| std::env::var(coffer_runtime::env::PROFILE).ok().filter(|v| !v.is_empty()));
    let value = match name {
        None => None,
        Some(n) => Some(HeaderValue::from_str(&n).map_err(|_| {
            format!("the profile name {:?} cannot be sent (control characters)", n.chars().take(40).collect::<String>())
        })?),
    };
    let _ = PROFILE.set(value);
    Ok(())
}

/// The `Coffer-Profile` value the shim sends; `None` when it names no profile. Without
/// [`init`] (the library used on its own) it is read from `COFFER_PROFILE` once.
pub fn header() -> Option<HeaderValue> {
    PROFILE
        .get_or_init(|| {
            let v = std::env::var(coffer_runtime::env::PROFILE).ok().filter(|v| !v.is_empty())?;
            HeaderValue::from_str(&v).ok()
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Option<String>, String> {
        parse_args(list.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn the_profile_comes_from_its_argument() {
        assert_eq!(args(&[]), Ok(None));
        assert_eq!(args(&["--profile", "work"]), Ok(Some("work".into())));
        assert_eq!(args(&["--profile=work"]), Ok(Some("work".into())));
        assert!(args(&["--profile"]).unwrap_err().contains("needs a profile name"));
        assert!(args(&["--profile="]).unwrap_err().contains("needs a profile name"));
        assert!(args(&["--verbose"]).unwrap_err().contains("only --profile"));
    }
}
