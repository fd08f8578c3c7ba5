//! Skills: `COFFER_HOME/skills/<name>/SKILL.md`, each with YAML front matter holding `name` and
//! `description` (the format Claude Code and Codex skills use). Scanned on every call (a skill
//! is a few files; nothing is cached or indexed). A skill whose front matter is malformed is
//! left out and reported by its folder name; it never breaks the listing. Two folders whose
//! front matter gives the same `name`: the folder of that name wins (else the first by path),
//! the other is reported as invalid ("duplicate skill name").
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use coffer_proto::retrieval::{InvalidSkill, ListSkillsReply, Skill, SkillSummary};
use yaml_rust2::{Yaml, YamlLoader};

use crate::error::{Error, Result};

/// Largest SKILL.md read, bytes.
pub const MAX_SKILL_BYTES: u64 = 1024 * 1024;
/// Largest front matter block parsed, bytes (bounds the YAML parser's work).
pub const MAX_FRONT_MATTER_BYTES: usize = 64 * 1024;
/// Most files listed for one skill.
pub const MAX_FILES: usize = 1000;

/// Checks a skill name: `^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$` and no `..`.
///
/// # Errors
/// [`Error::Invalid`] naming the rule.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        && !name.contains("..");
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "skill name {} must be 1-64 characters of A-Z, a-z, 0-9, _, . and -, starting with a letter or digit, without \"..\"",
            crate::error::shown_at(name, 70)
        )))
    }
}

/// A markdown text split at its front matter: `---` on the first line, YAML, then `---` (or
/// `...`) on a line of its own. Returns the YAML and the body after the closing line; `None`
/// when the text has no front matter.
pub fn split_front_matter(text: &str) -> Option<(&str, &str)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let rest = text.strip_prefix("---\n").or_else(|| text.strip_prefix("---\r\n"))?;
    let mut at = 0;
    for line in rest.split_inclusive('\n') {
        let trimmed = line.trim_end_matches(['\n', '\r']);
        if trimmed == "---" || trimmed == "..." {
            return Some((&rest[..at], &rest[at + line.len()..]));
        }
        at += line.len();
    }
    None
}

/// Parses a front matter block into its top-level keys, in order.
///
/// # Errors
/// A message saying why (too large, invalid YAML, not a mapping).
pub fn parse_yaml_map(yaml: &str) -> std::result::Result<Vec<(String, Yaml)>, String> {
    if yaml.len() > MAX_FRONT_MATTER_BYTES {
        return Err(format!("front matter is larger than {MAX_FRONT_MATTER_BYTES} bytes"));
    }
    let docs = YamlLoader::load_from_str(yaml).map_err(|e| format!("invalid YAML front matter: {e}"))?;
    match docs.into_iter().next() {
        Some(Yaml::Hash(h)) => Ok(h
            .into_iter()
            .filter_map(|(k, v)| match k {
                Yaml::String(k) => Some((k, v)),
                _ => None,
            })
            .collect()),
        None | Some(Yaml::Null) => Ok(Vec::new()),
        Some(_) => Err("front matter is not a mapping of keys to values".into()),
    }
}

/// A YAML value as one line of text (scalars as written; lists and maps as JSON-ish text).
pub fn yaml_text(v: &Yaml) -> String {
    match v {
        Yaml::String(s) | Yaml::Real(s) => s.clone(),
        Yaml::Integer(i) => i.to_string(),
        Yaml::Boolean(b) => b.to_string(),
        Yaml::Null | Yaml::BadValue => String::new(),
        Yaml::Array(a) => format!("[{}]", a.iter().map(yaml_text).collect::<Vec<_>>().join(", ")),
        Yaml::Hash(h) => format!(
            "{{{}}}",
            h.iter().map(|(k, v)| format!("{}: {}", yaml_text(k), yaml_text(v))).collect::<Vec<_>>().join(", ")
        ),
        Yaml::Alias(_) => String::new(),
    }
}

/// One SKILL.md parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// `name` from the front matter.
    pub name: String,
    /// `description`.
    pub description: String,
    /// The text after the front matter.
    pub body: String,
    /// Other front matter keys, as text.
    pub metadata: BTreeMap<String, String>,
}

/// Parses a SKILL.md.
///
/// # Errors
/// A message naming the problem: no front matter, invalid YAML, `name` or `description`
/// missing or not text, a `name` that breaks [`check_name`].
pub fn parse_skill(text: &str) -> std::result::Result<Parsed, String> {
    let (yaml, body) =
        split_front_matter(text).ok_or("SKILL.md has no front matter (a --- block with name and description)")?;
    let mut name = None;
    let mut description = None;
    let mut metadata = BTreeMap::new();
    for (k, v) in parse_yaml_map(yaml)? {
        match (k.as_str(), v) {
            ("name", Yaml::String(s)) => name = Some(s),
            ("name", _) => return Err("front matter `name` is not text".into()),
            ("description", Yaml::String(s)) => description = Some(s),
            ("description", _) => return Err("front matter `description` is not text".into()),
            (_, v) => {
                metadata.insert(k, yaml_text(&v));
            }
        }
    }
    let name = name.filter(|n| !n.trim().is_empty()).ok_or("front matter has no `name`")?;
    let description = description.filter(|d| !d.trim().is_empty()).ok_or("front matter has no `description`")?;
    check_name(name.trim()).map_err(|e| e.to_string())?;
    Ok(Parsed {
        name: name.trim().to_owned(),
        description: description.trim().to_owned(),
        body: body.to_owned(),
        metadata,
    })
}

/// Reads and parses `file`, a `SKILL.md` under the skills folder `dir`. Like a knowledge base's
/// notes, a skill that resolves (through a link of its folder or of the file) outside `dir` is
/// refused: a link synced or dropped into the folder must not serve any file of the machine to
/// MCP clients.
fn read_skill(dir: &Path, file: &Path) -> std::result::Result<Parsed, String> {
    let real = file.canonicalize().map_err(|e| format!("cannot read SKILL.md: {e}"))?;
    let root = dir.canonicalize().map_err(|e| format!("cannot read the skills folder: {e}"))?;
    if !real.starts_with(&root) {
        return Err(format!(
            "SKILL.md resolves to {} outside the skills folder: links out of it are not followed \
             (copy the skill in instead)",
            real.display()
        ));
    }
    let meta = std::fs::metadata(&real).map_err(|e| format!("cannot read SKILL.md: {e}"))?;
    if meta.len() > MAX_SKILL_BYTES {
        return Err(format!("SKILL.md is larger than {MAX_SKILL_BYTES} bytes"));
    }
    let bytes = std::fs::read(&real).map_err(|e| format!("cannot read SKILL.md: {e}"))?;
    let text = String::from_utf8(bytes).map_err(|_| "SKILL.md is not UTF-8".to_owned())?;
    parse_skill(&text)
}

/// The skills under `dir` (`COFFER_HOME/skills`): valid ones sorted by name, invalid ones by
/// folder name with why; one skill per `name` (see the module docs). A missing `dir` is no
/// skills.
pub fn list(dir: &Path) -> ListSkillsReply {
    let mut reply = ListSkillsReply::default();
    let mut by_name: BTreeMap<String, (String, SkillSummary)> = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return reply };
    let mut folders: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_dir()).collect();
    folders.sort();
    for folder in folders {
        let Some(folder_name) = folder.file_name().map(|n| n.to_string_lossy().into_owned()) else { continue };
        if folder_name.starts_with('.') {
            continue;
        }
        let file = folder.join("SKILL.md");
        if !file.is_file() {
            continue;
        }
        match read_skill(dir, &file) {
            Ok(p) => {
                let name = p.name.clone();
                let summary =
                    SkillSummary { name: p.name, description: p.description, path: file.display().to_string() };
                let dup = |loser: &str, winner: &str| InvalidSkill {
                    name: loser.to_owned(),
                    error: format!("duplicate skill name {name:?}: the folder {winner:?} has it too (rename one)"),
                };
                let first = by_name.get(&name).map(|(f, _)| f.clone());
                match first {
                    None => {
                        by_name.insert(name.clone(), (folder_name, summary));
                    }
                    // The folder named like the skill wins over one seen earlier by path.
                    Some(first) if folder_name == name => {
                        reply.invalid.push(dup(&first, &folder_name));
                        by_name.insert(name.clone(), (folder_name, summary));
                    }
                    Some(first) => reply.invalid.push(dup(&folder_name, &first)),
                }
            }
            Err(error) => reply.invalid.push(InvalidSkill { name: folder_name, error }),
        }
    }
    reply.skills = by_name.into_values().map(|(_, s)| s).collect();
    reply.invalid.sort_by(|a, b| a.name.cmp(&b.name));
    reply
}

fn other_files(folder: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![folder.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.filter_map(|e| e.ok()) {
            let p = e.path();
            // Links are listed, never followed (a loop or a way out of the folder).
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(p);
            } else if let Some(rel) = crate::indexer::relative(folder, &p)
                && rel != "SKILL.md"
            {
                out.push(rel);
            }
            if out.len() >= MAX_FILES {
                break;
            }
        }
    }
    out.sort();
    out
}

/// Skill `name`: the folder of that name, else the skill whose front matter names it.
///
/// # Errors
/// [`Error::Invalid`] for a bad name, [`Error::NotFound`] when no valid skill has it (an
/// invalid one says why).
pub fn load(dir: &Path, name: &str) -> Result<Skill> {
    check_name(name)?;
    let direct = dir.join(name);
    let folder = if direct.join("SKILL.md").is_file() {
        direct
    } else {
        let found = list(dir).skills.into_iter().find(|s| s.name == name);
        match found {
            Some(s) => PathBuf::from(s.path).parent().map(Path::to_path_buf).unwrap_or(direct),
            None => return Err(Error::NotFound(format!("no skill {}", crate::error::shown(name)))),
        }
    };
    let file = folder.join("SKILL.md");
    let p = read_skill(dir, &file)
        .map_err(|e| Error::NotFound(format!("skill {} is not usable: {e}", crate::error::shown(name))))?;
    Ok(Skill {
        name: p.name,
        description: p.description,
        body: p.body,
        path: file.display().to_string(),
        files: other_files(&folder),
        metadata: p.metadata.into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, folder: &str, text: &str) {
        std::fs::create_dir_all(dir.join(folder)).unwrap();
        std::fs::write(dir.join(folder).join("SKILL.md"), text).unwrap();
    }

    #[test]
    fn a_valid_skill_parses_with_metadata_and_body() {
        let p = parse_skill("---\nname: pdf\ndescription: Work with PDF files.\nlicense: MIT\nallowed-tools: [Read, Bash]\n---\n# PDF\n\nSteps.\n").unwrap();
        assert_eq!((p.name.as_str(), p.description.as_str()), ("pdf", "Work with PDF files."));
        assert_eq!(p.body, "# PDF\n\nSteps.\n");
        assert_eq!(p.metadata["license"], "MIT");
        assert_eq!(p.metadata["allowed-tools"], "[Read, Bash]");
    }

    #[test]
    fn malformed_skills_say_why() {
        for (text, why) in [
            ("---\nname: x\n---\nbody", "no `description`"),
            ("---\ndescription: d\n---\nbody", "no `name`"),
            ("---\nname: [unclosed\ndescription: d\n---\n", "invalid YAML"),
            ("---\nname: x\ndescription: d\n", "no front matter"),
            ("no front matter at all", "no front matter"),
            ("---\n- a\n- b\n---\n", "not a mapping"),
            ("---\nname: ../etc\ndescription: d\n---\n", "without \"..\""),
            ("---\nname: a/b\ndescription: d\n---\n", "must be 1-64"),
            ("---\nname: 5\ndescription: d\n---\n", "`name` is not text"),
        ] {
            let e = parse_skill(text).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    /// A skill whose file or folder links out of the skills folder is reported, never read;
    /// a link that stays inside it is followed.
    #[test]
    fn links_out_of_the_skills_folder_are_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let (dir, outside) = (tmp.path().join("skills"), tmp.path().join("outside"));
        write(&outside, "secret", "---\nname: secret\ndescription: d\n---\nprivate key\n");
        write(&dir, "real", "---\nname: real\ndescription: d\n---\nbody\n");
        std::os::unix::fs::symlink(outside.join("secret"), dir.join("linked-folder")).unwrap();
        std::fs::create_dir_all(dir.join("linked-file")).unwrap();
        std::os::unix::fs::symlink(outside.join("secret/SKILL.md"), dir.join("linked-file/SKILL.md")).unwrap();
        std::os::unix::fs::symlink(dir.join("real"), dir.join("alias")).unwrap();
        let r = list(&dir);
        let names: Vec<&str> = r.skills.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["real"], "{r:?}");
        let invalid: Vec<(&str, bool)> =
            r.invalid.iter().map(|i| (i.name.as_str(), i.error.contains("outside the skills folder"))).collect();
        assert_eq!(invalid, [("alias", false), ("linked-file", true), ("linked-folder", true)], "{r:?}");
        for name in ["linked-folder", "linked-file"] {
            let e = load(&dir, name).unwrap_err().to_string();
            assert!(e.contains("outside the skills folder") && !e.contains("private key"), "{e}");
        }
        assert_eq!(load(&dir, "real").unwrap().body, "body\n");
    }

    #[test]
    fn names_are_checked() {
        for ok in ["pdf", "A.b-c_d", "x1", &"a".repeat(64)] {
            check_name(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in ["", "..", "a..b", "../x", "a/b", "a\\b", ".hidden", "-x", &"a".repeat(65), "a b"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn listing_keeps_valid_skills_and_reports_broken_ones_by_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write(dir, "pdf", "---\nname: pdf\ndescription: PDFs.\n---\nUse it.\n");
        write(dir, "broken", "---\nname: [\n---\n");
        write(dir, "nodesc", "---\nname: nodesc\n---\n");
        std::fs::create_dir_all(dir.join("empty-folder")).unwrap();
        std::fs::write(dir.join("pdf").join("helper.py"), "print()").unwrap();
        std::fs::create_dir_all(dir.join("pdf").join("ref")).unwrap();
        std::fs::write(dir.join("pdf").join("ref").join("a.md"), "x").unwrap();
        let r = list(dir);
        assert_eq!(r.skills.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["pdf"]);
        let invalid: Vec<(&str, &str)> = r.invalid.iter().map(|i| (i.name.as_str(), i.error.as_str())).collect();
        assert_eq!(invalid.len(), 2, "{invalid:?}");
        assert_eq!(invalid[0].0, "broken");
        assert!(invalid[0].1.contains("invalid YAML"), "{invalid:?}");
        assert_eq!(invalid[1].0, "nodesc");
        let s = load(dir, "pdf").unwrap();
        assert_eq!(s.body, "Use it.\n");
        assert_eq!(s.files, ["helper.py", "ref/a.md"]);
        assert!(matches!(load(dir, "nodesc"), Err(Error::NotFound(m)) if m.contains("description")));
        assert!(matches!(load(dir, "absent"), Err(Error::NotFound(_))));
        assert!(matches!(load(dir, "../pdf"), Err(Error::Invalid(_))));
        assert!(list(&dir.join("none")).skills.is_empty());
    }

    #[test]
    fn two_folders_with_one_name_list_one_skill_and_report_the_other() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        // "a-copy" sorts before "pdf", but the folder named like the skill wins.
        write(dir, "a-copy", "---\nname: pdf\ndescription: An old copy.\n---\n");
        write(dir, "pdf", "---\nname: pdf\ndescription: PDFs.\n---\n");
        // Neither folder has the name: the first by path wins.
        write(dir, "x1", "---\nname: csv\ndescription: First.\n---\n");
        write(dir, "x2", "---\nname: csv\ndescription: Second.\n---\n");
        let r = list(dir);
        let skills: Vec<(&str, &str)> = r.skills.iter().map(|s| (s.name.as_str(), s.description.as_str())).collect();
        assert_eq!(skills, [("csv", "First."), ("pdf", "PDFs.")]);
        let invalid: Vec<(&str, &str)> = r.invalid.iter().map(|i| (i.name.as_str(), i.error.as_str())).collect();
        assert_eq!(invalid.len(), 2, "{invalid:?}");
        assert_eq!(invalid[0].0, "a-copy");
        assert!(
            invalid[0].1.contains("duplicate skill name \"pdf\"") && invalid[0].1.contains("\"pdf\""),
            "{invalid:?}"
        );
        assert_eq!(invalid[1].0, "x2");
        assert!(invalid[1].1.contains("duplicate skill name \"csv\"") && invalid[1].1.contains("x1"), "{invalid:?}");
        assert_eq!(load(dir, "pdf").unwrap().description, "PDFs.");
        assert_eq!(load(dir, "csv").unwrap().description, "First.");
    }

    #[test]
    fn front_matter_splits_at_its_closing_line() {
        assert_eq!(split_front_matter("---\na: 1\n---\nbody\n---\n"), Some(("a: 1\n", "body\n---\n")));
        assert_eq!(split_front_matter("---\r\na: 1\r\n---\r\nbody"), Some(("a: 1\r\n", "body")));
        assert_eq!(split_front_matter("\u{feff}---\n---\n"), Some(("", "")));
        assert_eq!(split_front_matter("# no\n---\n"), None);
    }
}
