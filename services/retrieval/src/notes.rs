//! Notes as a person keeps them: `ReadNote` (one note's text by line range, bounded, with its
//! title, tags, resolved `[[wikilinks]]` and backlinks) and `WriteNote` (create, replace or
//! append one note in a writable KB, atomically, then indexed at once).
//!
//! Every path is checked before the disk is touched ([`check_note_path`]: relative,
//! `/`-separated, no `..`, no empty or NUL segment) and again after resolving symlinks: a path
//! whose file or parent folder leads out of the KB's root is refused, so neither a read nor a
//! write ever reaches outside the folder. Writes go only into KBs under
//! `COFFER_HOME/knowledge/<name>` or ones the user marked writable (`coffer kb set KB --writable
//! true`); the user's other folders stay read-only. A write is refused when its content looks
//! like it holds a secret (the kind named, never the value: [`crate::memory::secret_in`]), is
//! over [`MAX_NOTE_BYTES`], or its path is not a visible `.md` file. Writes to one KB are
//! serialized (an append reads what the last write left), and each lands whole (temp file,
//! fsync, rename: [`crate::memory::write_atomic`]).
use std::path::{Path, PathBuf};
use std::sync::Arc;

use coffer_proto::retrieval::{Note, NoteBacklink, NoteLinkInfo, WriteNoteReply};
use coffer_proto::store::{KnowledgeBase, KnowledgeBaseKind, NoteLinksRequest};

use crate::error::{Error, Result, shown, shown_at};
use crate::indexer::{self, Indexer, Outcome};
use crate::sources::{MEMORY, Sources};
use crate::{markdown, memory};

/// Most lines one `ReadNote` returns.
pub const MAX_READ_LINES: u32 = 2000;
/// Most bytes of text one `ReadNote` returns (cut at a line boundary).
pub const MAX_READ_BYTES: usize = 64 * 1024;
/// Largest file `ReadNote` reads (bytes).
pub const MAX_READ_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// Largest note `WriteNote` leaves (bytes, after an append too).
pub const MAX_NOTE_BYTES: usize = 1024 * 1024;
/// Longest note path (bytes).
pub const MAX_PATH_BYTES: usize = 1024;
/// Backlinks listed in a `ReadNote` answer.
pub const MAX_BACKLINKS: u32 = 200;

/// How `WriteNote` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A new note; an existing one is refused.
    Create,
    /// An existing note's whole content.
    Replace,
    /// Added at the end of the note (created when missing), on a line of its own.
    Append,
}

impl Mode {
    /// `create` (also the empty default), `replace` or `append`.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the accepted modes.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "" | "create" => Ok(Self::Create),
            "replace" => Ok(Self::Replace),
            "append" => Ok(Self::Append),
            other => Err(Error::Invalid(format!("mode {} is not one of create, replace, append", shown_at(other, 40)))),
        }
    }
}

/// Longest file or folder name in a note's path (bytes): 255 (Linux) less the atomic write's
/// temporary-name overhead, rounded down.
const MAX_NAME_BYTES: usize = 200;

/// Checks a note path as given (relative to the KB root, `/`-separated) and returns its
/// segments.
///
/// # Errors
/// [`Error::Invalid`] naming the problem: empty, longer than [`MAX_PATH_BYTES`], absolute, a
/// `..` or `.` or empty segment, a backslash or NUL.
pub fn check_note_path(path: &str) -> Result<Vec<&str>> {
    let why = if path.is_empty() {
        "is empty"
    } else if path.len() > MAX_PATH_BYTES {
        "is longer than 1024 bytes"
    } else if path.starts_with('/') || Path::new(path).is_absolute() {
        "is absolute; give it relative to the knowledge base root"
    } else if path.contains('\0') {
        "contains a NUL byte"
    } else if path.contains('\\') {
        "contains a backslash; separate folders with '/'"
    } else if path.split('/').any(|s| s == "..") {
        "has a '..' segment: paths stay inside the knowledge base"
    } else if path.split('/').any(|s| s.is_empty() || s == ".") {
        "has an empty or '.' segment"
    } else if path.split('/').any(|s| s.len() > MAX_NAME_BYTES) {
        // Linux file names hold 255 bytes; the atomic write's temporary name adds 22.
        "has a file or folder name longer than 200 bytes"
    } else {
        return Ok(path.split('/').collect());
    };
    Err(Error::Invalid(format!("path {} {why}", shown(path))))
}

/// The note paths and bounds of one KB's notes.
pub struct Notes {
    sources: Arc<Sources>,
    indexer: Arc<Indexer>,
    /// Held by every write: one writer at a time, so an append never loses another's text.
    write: tokio::sync::Mutex<()>,
}

/// `abs` resolved (symlinks followed) if it stays inside `root` (canonical).
///
/// # Errors
/// [`Error::NotFound`] when it does not exist; [`Error::Invalid`] when it leads out of the KB.
fn inside(root: &Path, abs: &Path, given: &str) -> Result<PathBuf> {
    let real = abs.canonicalize().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound(format!("no note {shown_q}", shown_q = shown(given))),
        _ => Error::io(format!("resolving {shown_q}", shown_q = shown(given)), e),
    })?;
    if !real.starts_with(root) {
        return Err(Error::Invalid(format!(
            "path {shown_q} leads outside the knowledge base (a symbolic link to {}); only files inside it are notes",
            real.display(),
            shown_q = shown(given)
        )));
    }
    Ok(real)
}

impl Notes {
    /// Notes over `sources`' KBs, indexed through `indexer`.
    pub fn new(sources: Arc<Sources>, indexer: Arc<Indexer>) -> Self {
        Self { sources, indexer, write: tokio::sync::Mutex::new(()) }
    }

    /// Whether `WriteNote` may write into `def`.
    pub fn writable(&self, def: &KnowledgeBase) -> bool {
        def.kind != KnowledgeBaseKind::Memory as i32 && (def.writable || self.sources.coffer_owned(def))
    }

    /// Whether `path` names a note KB `def` indexes, the only files the note tools read or write:
    /// a safe relative path ([`check_note_path`]) with no hidden segment, a markdown name
    /// (`.md` or `.markdown`), that the KB's include/exclude globs and `.gitignore` take.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the path and which rule it breaks.
    fn check_indexable(&self, def: &KnowledgeBase, path: &str) -> Result<()> {
        let segments = check_note_path(path)?;
        if let Some(s) = segments.iter().find(|s| s.starts_with('.')) {
            return Err(Error::Invalid(format!(
                "path {} has a hidden segment {}; notes are visible files",
                shown(path),
                shown_at(s, 40)
            )));
        }
        let name = segments.last().copied().unwrap_or_default();
        let markdown = [".md", ".markdown"].iter().any(|ext| name.len() > ext.len() && name.ends_with(ext));
        if !markdown {
            return Err(Error::Invalid(format!(
                "path {} must name a markdown file (ending in .md or .markdown)",
                shown(path)
            )));
        }
        let spec = self.sources.walk_spec(def);
        let filter =
            crate::walk::matcher(&spec).map_err(|e| Error::Invalid(format!("the knowledge base's globs: {e}")))?;
        if !filter.accepts(path) {
            return Err(Error::Invalid(format!(
                "path {} is left out by knowledge base {} (its include/exclude globs or .gitignore), so it is \
                 not one of its notes",
                shown(path),
                shown(&def.name)
            )));
        }
        Ok(())
    }

    /// `ReadNote`: lines `start..=end` of note `path` in KB `kb` (bounded by
    /// [`MAX_READ_LINES`] and [`MAX_READ_BYTES`]; `truncated` and `next` say how to read on),
    /// with its title, tags, links and backlinks.
    ///
    /// # Errors
    /// [`Error::NotFound`] (KB, note), [`Error::Invalid`] (path, range, not UTF-8, too large),
    /// I/O and store errors.
    pub async fn read(&self, kb: &str, path: &str, start: u32, end: u32, start_byte: u32) -> Result<Note> {
        let def = self.sources.require(kb)?;
        // Only what the KB indexes is a note: not its hidden files (`.env`, `.git/config`), not
        // other kinds of file, not what its globs or `.gitignore` leave out.
        self.check_indexable(&def, path)?;
        if end != 0 && end < start {
            return Err(Error::Invalid(format!("end_line {end} is before start_line {start}")));
        }
        let root = PathBuf::from(&def.root);
        let real = inside(&root, &root.join(path), path)?;
        let meta =
            std::fs::metadata(&real).map_err(|e| Error::io(format!("reading {path_q}", path_q = shown(path)), e))?;
        if !meta.is_file() {
            return Err(Error::Invalid(format!("path {path_q} is a folder, not a note", path_q = shown(path))));
        }
        if meta.len() > MAX_READ_FILE_BYTES {
            return Err(Error::Invalid(format!(
                "note {path_q} is {} bytes, over the {} MiB a read takes",
                meta.len(),
                MAX_READ_FILE_BYTES >> 20,
                path_q = shown(path)
            )));
        }
        let bytes = tokio::fs::read(&real)
            .await
            .map_err(|e| Error::io(format!("reading {path_q}", path_q = shown(path)), e))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            Error::Invalid(format!(
                "note {path_q} is not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to(),
                path_q = shown(path)
            ))
        })?;
        let modified_ms = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as i64);
        let (title, tags, parsed_links) = {
            let text = text.clone();
            let fallback = Path::new(path).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            tokio::task::spawn_blocking(move || -> Result<_> {
                let (doc, _) = markdown::parse_lenient(&text, &fallback, &markdown::ChunkOptions::default())
                    .map_err(|e| Error::Internal(e.to_string()))?;
                let mut tags = doc.front_matter.as_ref().map(|f| f.tags.clone()).unwrap_or_default();
                for t in doc.inline_tags {
                    if !tags.iter().any(|f| f.to_lowercase() == t.to_lowercase()) {
                        tags.push(t);
                    }
                }
                Ok((doc.title, tags, doc.links))
            })
            .await
            .map_err(|e| Error::Internal(format!("parsing panicked: {e}")))??
        };
        let mut note = Note {
            kb: def.name.clone(),
            path: path.to_owned(),
            absolute_path: real.display().to_string(),
            title,
            tags,
            modified_ms,
            size: meta.len(),
            ..Note::default()
        };
        slice_lines(&text, start, end, start_byte, &mut note)?;
        let req = NoteLinksRequest { kb: def.name.clone(), path: path.to_owned(), backlinks_limit: MAX_BACKLINKS };
        match self.sources.index().note_links(req).await {
            Ok(r) => {
                let r = r.into_inner();
                note.indexed = true;
                note.links = r
                    .links
                    .into_iter()
                    .filter_map(|l| {
                        let link = l.link?;
                        Some(NoteLinkInfo {
                            target: link.target,
                            fragment: link.fragment,
                            alias: link.alias,
                            embed: link.embed,
                            line: link.line,
                            resolved_path: l.resolved_path,
                        })
                    })
                    .collect();
                note.backlinks = r
                    .backlinks
                    .into_iter()
                    .map(|b| NoteBacklink {
                        path: b.path,
                        title: b.title,
                        line: b.line,
                        alias: b.alias,
                        fragment: b.fragment,
                        embed: b.embed,
                    })
                    .collect();
                note.backlinks_truncated = r.backlinks_truncated;
            }
            // Not indexed (yet, or excluded by the KB's globs): its links as written.
            Err(s) if s.code() == tonic::Code::NotFound => {
                note.links = parsed_links
                    .into_iter()
                    .map(|l| NoteLinkInfo {
                        target: l.target,
                        fragment: l.fragment,
                        alias: l.alias,
                        embed: l.embed,
                        line: l.line,
                        resolved_path: String::new(),
                    })
                    .collect();
            }
            Err(s) => return Err(s.into()),
        }
        Ok(note)
    }

    /// `WriteNote`: `content` into note `path` of KB `kb` by `mode`, atomically, then indexed.
    ///
    /// # Errors
    /// [`Error::NotFound`] (KB; the note for `replace`), [`Error::Precondition`] (a read-only
    /// KB, memory), [`Error::Invalid`] (path, size, secret, mode), [`Error::AlreadyExists`]
    /// (`create` over a note), I/O errors.
    pub async fn write(&self, kb: &str, path: &str, content: &str, mode: &str) -> Result<WriteNoteReply> {
        let mode = Mode::parse(mode)?;
        let def = self.sources.require(kb)?;
        if def.name == MEMORY {
            return Err(Error::Precondition(
                "the memory knowledge base takes facts through coffer__remember, not notes".into(),
            ));
        }
        if !self.writable(&def) {
            return Err(Error::Precondition(format!(
                "knowledge base {:?} is your folder {} and read-only for notes; to let tools write into it, mark it \
                 writable: `coffer kb set {} --writable true`",
                def.name, def.root, def.name
            )));
        }
        self.check_indexable(&def, path)?;
        let segments = check_note_path(path)?;
        let name = segments.last().copied().unwrap_or_default();
        if content.len() > MAX_NOTE_BYTES {
            return Err(Error::Invalid(format!(
                "content is {} bytes, over the {} KiB a note may hold",
                content.len(),
                MAX_NOTE_BYTES / 1024
            )));
        }
        if content.contains('\0') {
            return Err(Error::Invalid("content contains a NUL byte; notes are text".into()));
        }
        if let Some(why) = memory::secret_in(content) {
            return Err(Error::Invalid(format!(
                "content looks like it holds a secret ({why}); notes are plain markdown that models read and sync \
                 copies: keep secrets in the credential store (`coffer credentials set NAME`) and write only where they are"
            )));
        }

        let _one = self.write.lock().await;
        let root = PathBuf::from(&def.root);
        // Parent folders: created one by one, each checked to be a real folder inside the KB.
        let mut dir = root.clone();
        for seg in &segments[..segments.len() - 1] {
            dir.push(seg);
            match std::fs::symlink_metadata(&dir) {
                Ok(m) if m.is_dir() => {}
                Ok(m) if m.file_type().is_symlink() => {
                    inside(&root, &dir, path)?;
                }
                Ok(_) => {
                    return Err(Error::Invalid(format!(
                        "path {}: {seg_q} is a file, not a folder",
                        shown(path),
                        seg_q = shown(seg)
                    )));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    std::fs::create_dir(&dir)
                        .map_err(|e| Error::io(format!("creating the folder of {path_q}", path_q = shown(path)), e))?;
                }
                Err(e) => return Err(Error::io(format!("checking the folder of {path_q}", path_q = shown(path)), e)),
            }
        }
        let dir = inside(&root, &dir, path)?;
        let target = dir.join(name);
        let existing = match std::fs::symlink_metadata(&target) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(Error::Invalid(format!(
                    "path {} is a symbolic link; write_note writes only plain files",
                    shown(path)
                )));
            }
            Ok(m) if !m.is_file() => return Err(Error::Invalid(format!("path {} is not a file", shown(path)))),
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(Error::io(format!("checking {path_q}", path_q = shown(path)), e)),
        };
        let bytes: Vec<u8> = match (mode, existing) {
            (Mode::Create, true) => {
                return Err(Error::AlreadyExists(format!(
                    "note {} exists; use mode \"replace\" to overwrite it or \"append\" to add to it",
                    shown(path)
                )));
            }
            (Mode::Replace, false) => {
                return Err(Error::NotFound(format!("no note {} to replace; use mode \"create\"", shown(path))));
            }
            (Mode::Create | Mode::Replace, _) => content.as_bytes().to_vec(),
            (Mode::Append, false) => content.as_bytes().to_vec(),
            (Mode::Append, true) => {
                let mut old = std::fs::read(&target)
                    .map_err(|e| Error::io(format!("reading {path_q}", path_q = shown(path)), e))?;
                if std::str::from_utf8(&old).is_err() {
                    return Err(Error::Invalid(format!("note {} is not UTF-8 text; not appending to it", shown(path))));
                }
                if !old.is_empty() && !old.ends_with(b"\n") {
                    old.push(b'\n');
                }
                old.extend_from_slice(content.as_bytes());
                if old.len() > MAX_NOTE_BYTES {
                    return Err(Error::Invalid(format!(
                        "the note would be {} bytes after the append, over the {} KiB a note may hold",
                        old.len(),
                        MAX_NOTE_BYTES / 1024
                    )));
                }
                old
            }
        };
        let (dir2, name2, data) = (dir.clone(), name.to_owned(), bytes);
        let size = data.len() as u64;
        let lines = count_lines(&data);
        // In the user's own folder a note keeps the mode it had (a new one is 0644, like a file
        // an editor makes); the replacement is a new file (atomic rename), so a hard link to the
        // old one keeps the old text. Coffer's own KBs keep the daemon's private default.
        let mode = if self.sources.coffer_owned(&def) {
            None
        } else {
            use std::os::unix::fs::PermissionsExt as _;
            Some(std::fs::metadata(dir.join(name)).map_or(0o644, |m| m.permissions().mode()))
        };
        let written = tokio::task::spawn_blocking(move || memory::write_atomic_with_mode(&dir2, &name2, &data, mode))
            .await
            .map_err(|e| Error::Internal(format!("writing panicked: {e}")))??;
        // Indexed now, not when the watcher gets to it: the next search finds it.
        let rel = indexer::relative(&root, &written).unwrap_or_else(|| path.to_owned());
        let indexed = matches!(self.indexer.index_path(&def, &rel).await?, Outcome::Indexed { .. });
        Ok(WriteNoteReply {
            kb: def.name.clone(),
            path: rel,
            absolute_path: written.display().to_string(),
            created: !existing,
            size,
            lines,
            indexed,
        })
    }
}

fn count_lines(b: &[u8]) -> u32 {
    let n = b.iter().filter(|&&c| c == b'\n').count() + usize::from(!b.is_empty() && !b.ends_with(b"\n"));
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Lines `start..=end` of `text` into `note` (`text`, `start_line`, `end_line`, `total_lines`,
/// `truncated`, `next`, `start_byte`, `cut_at_byte`), bounded by [`MAX_READ_LINES`] and
/// [`MAX_READ_BYTES`]. The first line starts `start_byte` bytes in (reading on in a line cut
/// before). A single line longer than [`MAX_READ_BYTES`] is cut at a character boundary:
/// `cut_at_byte` is where, and `next` says to read on with `start_line` and `start_byte`.
///
/// # Errors
/// [`Error::Invalid`] for a `start` past the last line, or a `start_byte` past the end of line
/// `start` or inside one of its characters.
pub fn slice_lines(text: &str, start: u32, end: u32, start_byte: u32, note: &mut Note) -> Result<()> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let total = u32::try_from(lines.len()).unwrap_or(u32::MAX);
    note.total_lines = total;
    let start = start.max(1);
    if total == 0 {
        note.start_line = 0;
        note.end_line = 0;
        return Ok(());
    }
    if start > total {
        return Err(Error::Invalid(format!("start_line {start} is past the note's last line ({total})")));
    }
    let first = lines[(start - 1) as usize];
    let skip = start_byte as usize;
    if skip > first.len() {
        return Err(Error::Invalid(format!(
            "start_byte {start_byte} is past the end of line {start} ({} bytes)",
            first.len()
        )));
    }
    if !first.is_char_boundary(skip) {
        return Err(Error::Invalid(format!(
            "start_byte {start_byte} is inside a character of line {start}; use the cut_at_byte a read gave"
        )));
    }
    let want_end = if end == 0 { total } else { end.min(total) };
    let mut out = String::new();
    let mut last = start - 1;
    let mut cut_at = 0;
    for n in start..=want_end {
        let (line, offset) = if n == start { (&first[skip..], skip) } else { (lines[(n - 1) as usize], 0) };
        if n - start >= MAX_READ_LINES || (out.len() + line.len() > MAX_READ_BYTES && n > start) {
            break;
        }
        if line.len() > MAX_READ_BYTES {
            let mut cut = MAX_READ_BYTES;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            out.push_str(&line[..cut]);
            last = n;
            cut_at = offset + cut;
            note.truncated = true;
            break;
        }
        out.push_str(line);
        last = n;
    }
    if last < want_end {
        note.truncated = true;
    }
    note.text = out;
    note.start_line = start;
    note.end_line = last;
    note.start_byte = start_byte;
    note.cut_at_byte = u32::try_from(cut_at).unwrap_or(u32::MAX);
    if note.truncated {
        note.next = if cut_at > 0 {
            format!(
                "line {last} is longer than {} KiB and was cut after byte {cut_at} of it: read on with start_line={last} start_byte={cut_at}",
                MAX_READ_BYTES / 1024
            )
        } else {
            format!(
                "cut at {} lines or {} KiB: read on with start_line={}",
                MAX_READ_LINES,
                MAX_READ_BYTES / 1024,
                last + 1
            )
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn note_paths_stay_inside_and_say_why_not() {
        assert_eq!(check_note_path("a/b.md").unwrap(), ["a", "b.md"]);
        for (bad, why) in [
            ("", "is empty"),
            ("/etc/passwd", "is absolute"),
            ("../x.md", "'..' segment"),
            ("a/../../x.md", "'..' segment"),
            ("a//b.md", "empty or '.' segment"),
            ("./a.md", "empty or '.' segment"),
            ("a\\b.md", "backslash"),
            ("a\0.md", "NUL"),
        ] {
            let e = check_note_path(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        // A path too long to show whole is shown clipped, ending in "…" so the cut shows.
        let e = check_note_path(&"a".repeat(2000)).unwrap_err().to_string();
        assert_eq!(e, format!("path \"{}…\" is longer than 1024 bytes", "a".repeat(120)));
        // A name the file system cannot hold is refused as such (a newcomer's 300-character
        // file name was an internal error).
        let long = format!("dir/{}.md", "n".repeat(300));
        let e = check_note_path(&long).unwrap_err().to_string();
        assert!(e.contains("name longer than 200 bytes") && e.contains("nnn…\""), "{e}");
        // A path that fits is shown whole, without "…".
        let e = check_note_path("a//b.md").unwrap_err().to_string();
        assert!(e.starts_with("path \"a//b.md\" ") && !e.contains('…'), "{e}");
        let fits = format!("{}/{}.md", "d".repeat(200), "n".repeat(197));
        assert_eq!(check_note_path(&fits).unwrap().len(), 2);
    }

    #[test]
    fn modes_parse_and_bad_ones_are_named() {
        assert_eq!(Mode::parse("").unwrap(), Mode::Create);
        assert_eq!(Mode::parse("append").unwrap(), Mode::Append);
        assert!(Mode::parse("delete").unwrap_err().to_string().contains("create, replace, append"));
    }

    #[test]
    fn reads_are_bounded_and_say_how_to_read_on() {
        let text: String = (1..=5000).map(|i| format!("line {i}\n")).collect();
        let mut n = Note::default();
        slice_lines(&text, 0, 0, 0, &mut n).unwrap();
        assert_eq!((n.start_line, n.end_line, n.total_lines, n.truncated), (1, MAX_READ_LINES, 5000, true));
        assert!(n.next.contains("start_line=2001"), "{}", n.next);
        assert!(n.text.starts_with("line 1\n") && n.text.ends_with("line 2000\n"));
        let mut n = Note::default();
        slice_lines(&text, 4999, 0, 0, &mut n).unwrap();
        assert_eq!(
            (n.start_line, n.end_line, n.truncated, n.text.as_str()),
            (4999, 5000, false, "line 4999\nline 5000\n")
        );
        let mut n = Note::default();
        assert!(slice_lines(&text, 5001, 0, 0, &mut n).unwrap_err().to_string().contains("past the note's last line"));
        // Bytes bound: long lines stop the range early, a single huge line is cut.
        let wide: String = (0..100).map(|_| format!("{}\n", "é".repeat(1000))).collect();
        let mut n = Note::default();
        slice_lines(&wide, 1, 0, 0, &mut n).unwrap();
        assert!(n.text.len() <= MAX_READ_BYTES && n.truncated && n.end_line < 100, "{}", n.end_line);
        let huge = "é".repeat(MAX_READ_BYTES);
        let mut n = Note::default();
        slice_lines(&huge, 1, 1, 0, &mut n).unwrap();
        assert!(n.truncated && n.text.len() <= MAX_READ_BYTES && n.next.contains("was cut"));
        // A line longer than 64 KiB, between two others: read on in it by start_byte until it
        // is whole, then on to the next line. Every part is bounded; together they are the note.
        let long = format!("before\n{}\nafter\n", "é".repeat(MAX_READ_BYTES / 2) + &"x".repeat(100));
        let mut n = Note::default();
        slice_lines(&long, 2, 0, 0, &mut n).unwrap();
        assert_eq!((n.end_line, n.cut_at_byte, n.truncated), (2, MAX_READ_BYTES as u32, true));
        assert!(n.next.ends_with(&format!("start_line=2 start_byte={MAX_READ_BYTES}")), "{}", n.next);
        let mut parts = n.text.clone();
        let mut m = Note::default();
        slice_lines(&long, 2, 0, n.cut_at_byte, &mut m).unwrap();
        assert!(m.text.len() <= MAX_READ_BYTES, "{}", m.text.len());
        assert_eq!(
            (m.start_line, m.start_byte, m.end_line, m.cut_at_byte, m.truncated),
            (2, n.cut_at_byte, 3, 0, false)
        );
        parts.push_str(&m.text);
        assert_eq!(format!("before\n{parts}"), long);
        // Offsets that are not a place in the line are refused, naming why.
        let mut m = Note::default();
        let e = slice_lines(&long, 2, 0, 1, &mut m).unwrap_err().to_string();
        assert!(e.contains("inside a character"), "{e}");
        let e = slice_lines(&long, 1, 0, 8, &mut m).unwrap_err().to_string();
        assert!(e.contains("past the end of line 1 (7 bytes)"), "{e}");
        let mut n = Note::default();
        slice_lines("", 0, 0, 0, &mut n).unwrap();
        assert_eq!((n.total_lines, n.text.as_str()), (0, ""));
    }
}
