//! The `${…}` references MCP clients expand in their config files when they start a server,
//! and which of them name an environment variable: Claude Code's `.mcp.json` writes `${VAR}`
//! and `${VAR:-default}`, VS Code's `mcp.json` writes `${env:VAR}` (and `${input:id}`,
//! `${workspaceFolder}`, … which are not environment variables).
//!
//! `coffer mcp import` finds them here twice: the CLI, to read the variables `--from-env` asks
//! for from its own environment, and the daemon, to expand them with the values it was sent.

/// One `${…}` in a string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference<'a> {
    /// The reference as written, `${…}` included (to the end of the string when unclosed).
    pub text: &'a str,
    /// Its byte range in the string.
    pub start: usize,
    pub end: usize,
    /// The environment variable it names (`VAR` of `${VAR}`, `${env:VAR}`, `${VAR:-x}`), if it
    /// names one.
    pub variable: Option<&'a str>,
    /// The default of `${VAR:-default}`.
    pub default: Option<&'a str>,
}

/// Every `${…}` in `value`, in order.
pub fn references(value: &str) -> Vec<Reference<'_>> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = value[from..].find("${") {
        let start = from + i;
        let end = value[start..].find('}').map_or(value.len(), |e| start + e + 1);
        let text = &value[start..end];
        let (variable, default) = match text.strip_prefix("${").and_then(|t| t.strip_suffix('}')) {
            Some(inner) => {
                let inner = inner.strip_prefix("env:").unwrap_or(inner);
                let (name, default) = match inner.split_once(":-") {
                    Some((n, d)) => (n, Some(d)),
                    None => (inner, None),
                };
                if is_variable_name(name) { (Some(name), default) } else { (None, None) }
            }
            None => (None, None),
        };
        out.push(Reference { text, start, end, variable, default });
        from = end;
    }
    out
}

/// `[A-Za-z_][A-Za-z0-9_]*`, as POSIX shells name environment variables.
pub fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `value` with each reference to an environment variable replaced by `lookup(name)` (or its
/// default when `lookup` has none). Returns the new text and whether anything was replaced, or
/// the references that could not be (an unset variable without a default, or a reference that
/// names no environment variable), as written.
///
/// # Errors
/// The references left, in order.
pub fn expand(value: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<(String, bool), Vec<&str>> {
    let refs = references(value);
    if refs.is_empty() {
        return Ok((value.to_owned(), false));
    }
    let mut out = String::with_capacity(value.len());
    let mut left = Vec::new();
    let mut at = 0;
    for r in &refs {
        out.push_str(&value[at..r.start]);
        match r.variable.and_then(|v| lookup(v).or_else(|| r.default.map(str::to_owned))) {
            Some(v) => out.push_str(&v),
            None => left.push(r.text),
        }
        at = r.end;
    }
    out.push_str(&value[at..]);
    if left.is_empty() { Ok((out, true)) } else { Err(left) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_name_their_variables() {
        let r = references("Bearer ${TOKEN} ${env:HOME}/x ${workspaceFolder} ${A:-1} ${input:k} ${open");
        let vars: Vec<_> = r.iter().map(|r| (r.text, r.variable, r.default)).collect();
        assert_eq!(
            vars,
            [
                ("${TOKEN}", Some("TOKEN"), None),
                ("${env:HOME}", Some("HOME"), None),
                ("${workspaceFolder}", Some("workspaceFolder"), None),
                ("${A:-1}", Some("A"), Some("1")),
                ("${input:k}", None, None),
                ("${open", None, None),
            ]
        );
        assert!(references("no refs, $HOME is not one").is_empty());
    }

    #[test]
    fn expansion_uses_the_lookup_then_the_default() {
        let env = |n: &str| (n == "TOKEN").then(|| "t0k".to_owned());
        assert_eq!(expand("Bearer ${TOKEN}!", env), Ok(("Bearer t0k!".into(), true)));
        assert_eq!(expand("${UNSET:-dflt}/${env:TOKEN}", env), Ok(("dflt/t0k".into(), true)));
        assert_eq!(expand("plain", env), Ok(("plain".into(), false)));
        assert_eq!(expand("${A} ${TOKEN} ${input:x}", env), Err(vec!["${A}", "${input:x}"]));
    }
}
