//! Exposed capability names: `<server>__<name>`, rewritten so the strictest popular clients
//! accept them (`^[A-Za-z0-9_-]{1,64}$`, and by default at most 51 characters so that Claude
//! Code's own `mcp__coffer__` prefix still fits in 64).
//!
//! Rules, all deterministic: characters outside `[A-Za-z0-9_-]` become `_`; a name longer than
//! the limit keeps its `<server>__` prefix, is cut, and gets `_` + 6 hex characters of the
//! SHA-256 of the original `<server>__<name>`; names that still collide are resolved so that
//! a name that needed no rewriting always keeps it (`dotted_tool_name` is `s__dotted_tool_name`
//! even when `dotted.tool.name` is listed too), then in sorted order of (server, original
//! name): the first keeps the plain name, each later one gets a hash suffix. The result never
//! depends on the order an upstream lists its items, and `<server>__<original>` names exactly
//! that capability whenever the server has it, which lets policy refuse a disabled one before
//! any list ([`crate::mcp::policy`]). Calls resolve through the session's reverse map, never by
//! guessing. An upstream that lists a name twice has only the first offered
//! ([`drop_repeats`]).
use std::collections::{HashMap, HashSet};

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Default longest exposed name (characters): the settings table's default.
pub const DEFAULT_MAX_LEN: usize = coffer_types::settings::MAX_TOOL_NAME_LEN.default as usize;
/// Hard limit from the strictest clients: the settings table's bound.
pub const ABSOLUTE_MAX_LEN: usize = coffer_types::settings::MAX_TOOL_NAME_LEN.max as usize;
/// Separator between the server and the original name.
pub const SEP: &str = "__";

fn sanitize(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect()
}

fn hash6(input: &str, salt: u32) -> String {
    let mut h = Sha256::new();
    h.update(input.as_bytes());
    if salt > 0 {
        h.update(salt.to_le_bytes());
    }
    hex::encode(&h.finalize()[..3])
}

/// `base` cut to fit `max_len` with `_<hash>` appended (the hash is of `full` and `salt`).
fn with_suffix(base: &str, full: &str, max_len: usize, salt: u32) -> String {
    let suffix = format!("_{}", hash6(full, salt));
    let keep = max_len.saturating_sub(suffix.len());
    let mut cut: String = base.chars().take(keep).collect();
    cut.push_str(&suffix);
    cut
}

/// The exposed name of one capability, ignoring collisions.
pub fn expose_one(server: &str, original: &str, max_len: usize) -> String {
    let max_len = max_len.clamp(SEP.len() + 26 + 8, ABSOLUTE_MAX_LEN);
    let full = format!("{server}{SEP}{original}");
    let base = sanitize(&full);
    if base.chars().count() <= max_len && !original.is_empty() { base } else { with_suffix(&base, &full, max_len, 0) }
}

/// Assigns exposed names to `(server, original)` pairs. Returns the names in input order; the
/// result is the same for the same set of pairs whatever their order.
pub fn assign(entries: &[(String, String)], max_len: usize) -> Vec<String> {
    let max_len = max_len.clamp(SEP.len() + 26 + 8, ABSOLUTE_MAX_LEN);
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| entries[a].cmp(&entries[b]));
    let mut taken: HashSet<String> = HashSet::with_capacity(entries.len());
    let mut out = vec![String::new(); entries.len()];
    let plain: Vec<String> = entries.iter().map(|(s, o)| expose_one(s, o, max_len)).collect();
    // Names that needed no rewriting are exactly `<server>__<original>`: they go first, so a
    // rewritten name never takes one from the capability it names. Then every other name whose
    // plain form is free keeps it, in sorted order.
    let unchanged = |i: usize| {
        let (s, o) = &entries[i];
        plain[i].strip_prefix(s.as_str()).and_then(|r| r.strip_prefix(SEP)) == Some(o.as_str())
    };
    let (first, rest): (Vec<usize>, Vec<usize>) = order.iter().partition(|&&i| unchanged(i));
    let mut pending = Vec::new();
    for i in first.into_iter().chain(rest) {
        if taken.insert(plain[i].clone()) {
            out[i] = plain[i].clone();
        } else {
            pending.push(i);
        }
    }
    // Collisions in sorted order too, whichever pass they came from.
    pending.sort_by(|&a, &b| entries[a].cmp(&entries[b]));
    // Second pass: collisions get a hash suffix (salted again on the rare second collision).
    for i in pending {
        let (s, o) = &entries[i];
        let full = format!("{s}{SEP}{o}");
        let mut salt = 1;
        loop {
            let candidate = with_suffix(&plain[i], &full, max_len, salt);
            if taken.insert(candidate.clone()) {
                out[i] = candidate;
                break;
            }
            salt += 1;
        }
    }
    out
}

/// Drops every item of one upstream's list whose identifying field `ident` (`name`, `uri`)
/// repeats an earlier item's: the first is the one offered (and its schema the one clients
/// see). Returns the repeated names, once each, in list order.
pub fn drop_repeats(items: &mut Vec<Value>, ident: &str) -> Vec<String> {
    let mut seen: HashSet<String> = HashSet::with_capacity(items.len());
    let mut repeated: Vec<String> = Vec::new();
    items.retain(|item| {
        let name = item.get(ident).and_then(Value::as_str).unwrap_or_default();
        if seen.contains(name) {
            if !repeated.iter().any(|r| r == name) {
                repeated.push(name.to_owned());
            }
            false
        } else {
            seen.insert(name.to_owned());
            true
        }
    });
    repeated
}

/// Reverse map from exposed name to `(server, original name)`.
#[derive(Debug, Default, Clone)]
pub struct NameMap {
    map: HashMap<String, (String, String)>,
}

impl NameMap {
    pub fn insert(&mut self, exposed: String, server: String, original: String) {
        self.map.insert(exposed, (server, original));
    }
    pub fn get(&self, exposed: &str) -> Option<&(String, String)> {
        self.map.get(exposed)
    }
    pub fn len(&self) -> usize {
        self.map.len()
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// Splits an exposed name at the first `__` into `(server, rest)`.
pub fn split(exposed: &str) -> Option<(&str, &str)> {
    exposed.split_once(SEP).filter(|(s, r)| !s.is_empty() && !r.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(n: &str, max: usize) -> bool {
        !n.is_empty() && n.len() <= max && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    }

    #[test]
    fn plain_names_pass_through() {
        assert_eq!(expose_one("everything", "echo", 51), "everything__echo");
        assert_eq!(expose_one("git", "git_status", 51), "git__git_status");
    }

    #[test]
    fn odd_characters_and_length_are_rewritten() {
        let n = expose_one("fs", "read file.v2/ü", 51);
        assert_eq!(n, "fs__read_file_v2__");
        let long = "x".repeat(100);
        let n = expose_one("server", &long, 51);
        assert!(valid(&n, 51), "{n}");
        assert!(n.starts_with("server__"));
        assert_eq!(n, expose_one("server", &long, 51), "deterministic");
    }

    #[test]
    fn collisions_resolved_in_sorted_order_independent_of_input_order() {
        let a = vec![
            ("s".to_string(), "a.b".to_string()),
            ("s".to_string(), "a_b".to_string()),
            ("s".to_string(), "a b".to_string()),
        ];
        let mut b = a.clone();
        b.reverse();
        let na = assign(&a, 51);
        let nb = assign(&b, 51);
        let ma: HashMap<_, _> = a.iter().zip(&na).collect();
        let mb: HashMap<_, _> = b.iter().zip(&nb).collect();
        assert_eq!(ma, mb);
        let set: HashSet<_> = na.iter().collect();
        assert_eq!(set.len(), 3, "{na:?}");
        // "a_b" needed no rewriting, so it keeps its name, although "a b" sorts first.
        assert_eq!(ma[&("s".to_string(), "a_b".to_string())], "s__a_b");
        // The rewritten ones get suffixes, whatever the order they were listed in.
        assert!(na.iter().filter(|n| n.starts_with("s__a_b_")).count() == 2, "{na:?}");
        for n in &na {
            assert!(valid(n, 51), "{n}");
        }
    }

    #[test]
    fn a_name_that_needs_no_rewriting_keeps_it_in_any_order() {
        let pairs = |names: &[&str]| names.iter().map(|n| ("names".to_string(), n.to_string())).collect::<Vec<_>>();
        for order in [["dotted.tool.name", "dotted_tool_name"], ["dotted_tool_name", "dotted.tool.name"]] {
            let entries = pairs(&order);
            let names = assign(&entries, 51);
            let clean = entries.iter().position(|(_, o)| o == "dotted_tool_name").unwrap();
            assert_eq!(names[clean], "names__dotted_tool_name", "{order:?}: {names:?}");
            assert!(names[1 - clean].starts_with("names__dotted_tool_name_"), "{names:?}");
        }
        // A rewritten long name whose suffixed form equals a real tool's name yields to it.
        let long = "x".repeat(80);
        let taken = expose_one("s", &long, 51);
        let original = taken.strip_prefix("s__").unwrap().to_owned();
        let entries = vec![("s".to_string(), long), ("s".to_string(), original)];
        let names = assign(&entries, 51);
        assert_eq!(names[1], taken);
        assert_ne!(names[0], taken);
    }

    #[test]
    fn repeated_names_keep_only_the_first() {
        let mut items = vec![
            serde_json::json!({"name": "same", "inputSchema": {"first": true}}),
            serde_json::json!({"name": "other"}),
            serde_json::json!({"name": "same", "inputSchema": {"first": false}}),
            serde_json::json!({"name": "same"}),
        ];
        assert_eq!(drop_repeats(&mut items, "name"), ["same"]);
        assert_eq!(items.len(), 2);
        assert_eq!(items[0]["inputSchema"]["first"], true);
        assert!(drop_repeats(&mut items, "name").is_empty());
    }

    #[test]
    fn many_long_names_stay_unique_and_valid() {
        let entries: Vec<_> =
            (0..500).map(|i| ("srv".to_string(), format!("{}{i}", "very_long_tool_name_".repeat(4)))).collect();
        let names = assign(&entries, 51);
        let set: HashSet<_> = names.iter().collect();
        assert_eq!(set.len(), 500);
        assert!(names.iter().all(|n| valid(n, 51) && n.starts_with("srv__")));
    }

    #[test]
    fn split_at_first_separator() {
        assert_eq!(split("a__b__c"), Some(("a", "b__c")));
        assert_eq!(split("nosep"), None);
        assert_eq!(split("__x"), None);
    }
}
