//! Files attached to a user message (issue 34 §6): checked, named safely, saved in the
//! conversation's working directory, and told to the agent.
//!
//! - **Limits.** At most `chat.attachment_max_files` files of at most
//!   `chat.attachment_max_bytes` bytes each, and [`MAX_TOTAL_BYTES`] in all whatever the
//!   settings; an empty file is refused. A refusal names the file, the limit and the setting.
//! - **Types.** A file whose bytes are a PNG, JPEG, GIF or WebP image is that image (the bytes
//!   win over what the sender declared, and a missing extension is added); a file declared
//!   `image/*` whose bytes are none of these is refused ([`IMAGE_TYPES`]). Any other file is a
//!   document with the declared type (or one guessed from its extension, else
//!   `application/octet-stream`).
//! - **Names** ([`sanitize`]): the last component of whatever path the sender gave, without
//!   control characters (NUL included), leading dots or spaces, Windows-reserved characters, at
//!   most [`MAX_NAME_BYTES`] bytes with the extension kept; nothing left gives `file`. Two files
//!   of one message with the same name get `-2`, `-3`… before the extension.
//! - **Where.** `<cwd>/.coffer/attachments/<message id>/<name>` ([`DIR`]): a message's files are
//!   written before its turn is stored (a refusal or a failed store write removes them), created
//!   new (never overwriting), in a folder that must resolve inside `cwd` (a symlink planted in
//!   the working directory cannot redirect the write). The folder is the record the turn reads
//!   back ([`list`]): a queued message's files reach the agent when its turn starts, after a
//!   restart too.
//! - **The agent** gets its message text followed by one `Attached: <path> (<type>, <size>)`
//!   line per file ([`agent_text`]; paths relative to its working directory) and, where its CLI
//!   takes images, the images as content ([`crate::adapter::Attachment`]).
//! - **Reading back** ([`read`], `GetAttachment`: the console shows a message's images after a
//!   reload): only a plain file name that [`sanitize`] leaves as it is, in the message's folder,
//!   opened without following a symlink as its last component, a regular file whose real path
//!   is inside `<real cwd>/.coffer/attachments/<message id>/` (a symlinked folder or file
//!   pointing elsewhere is not found), at most [`MAX_TOTAL_BYTES`].
use std::io::Write as _;
use std::path::{Path, PathBuf};

use coffer_proto::chat as c;
use coffer_proto::store as st;

use crate::adapter::Attachment;
use crate::error::{Error, Result};

/// Where a message's files go, relative to the conversation's working directory.
pub const DIR: &str = ".coffer/attachments";
/// Most bytes of one message's attachments together, whatever the settings say.
pub const MAX_TOTAL_BYTES: u64 = 40 << 20;
/// Longest saved file name, bytes.
pub const MAX_NAME_BYTES: usize = 120;
/// The image types an attachment may be (what the agents' model APIs take as image content).
pub const IMAGE_TYPES: &[&str] = &["image/png", "image/jpeg", "image/gif", "image/webp"];

/// The limits in force (`chat.attachment_max_bytes`, `chat.attachment_max_files`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest file, bytes.
    pub max_bytes: u64,
    /// Most files per message.
    pub max_files: usize,
}

impl Default for Limits {
    fn default() -> Self {
        use coffer_types::settings as s;
        Self {
            max_bytes: s::CHAT_ATTACHMENT_MAX_BYTES.default,
            max_files: s::CHAT_ATTACHMENT_MAX_FILES.default as usize,
        }
    }
}

/// A checked file, not saved yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The sanitised, unique (within the message) name.
    pub name: String,
    pub mime: String,
    pub data: Vec<u8>,
}

/// A size for people: `512 bytes`, `12.3 KB`, `4.0 MB` (1 KB = 1024 bytes).
pub fn human(bytes: u64) -> String {
    match bytes {
        b if b < 1024 => format!("{b} bytes"),
        b if b < 1 << 20 => format!("{:.1} KB", b as f64 / 1024.0),
        b => format!("{:.1} MB", b as f64 / (1 << 20) as f64),
    }
}

/// The image type the bytes are (by their magic numbers), if one of [`IMAGE_TYPES`].
pub fn sniff_image(data: &[u8]) -> Option<&'static str> {
    if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if data.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else if data.starts_with(b"GIF87a") || data.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if data.len() >= 12 && &data[..4] == b"RIFF" && &data[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// The usual extension of an image type.
fn image_extension(mime: &str) -> &'static str {
    match mime {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        _ => "webp",
    }
}

/// A type from a file name's extension (the common ones), else `application/octet-stream`.
pub fn mime_from_name(name: &str) -> &'static str {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "json" => "application/json",
        "html" | "htm" => "text/html",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "tar" => "application/x-tar",
        _ => "application/octet-stream",
    }
}

/// A safe file name from what a sender gave (see the module docs): never empty, no path
/// separator, no control character, not starting with a dot, at most [`MAX_NAME_BYTES`] bytes.
pub fn sanitize(given: &str) -> String {
    let last = given.rsplit(['/', '\\']).next().unwrap_or_default();
    let cleaned: String = last
        .chars()
        .filter(|c| !c.is_control())
        .map(|c| if matches!(c, ':' | '*' | '?' | '"' | '<' | '>' | '|') { '_' } else { c })
        .collect();
    let trimmed = cleaned.trim_start_matches(['.', ' ']).trim_end_matches(['.', ' ']);
    let name = if trimmed.is_empty() { "file".to_owned() } else { trimmed.to_owned() };
    if name.len() <= MAX_NAME_BYTES {
        return name;
    }
    // Keep a short extension; cut the stem at a character boundary.
    let (stem, ext) = match name.rsplit_once('.') {
        Some((s, e)) if !s.is_empty() && e.len() <= 16 => (s, format!(".{e}")),
        _ => (name.as_str(), String::new()),
    };
    let mut cut = MAX_NAME_BYTES - ext.len();
    while !stem.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{ext}", &stem[..cut])
}

/// `name` with `-n` before its extension.
fn numbered(name: &str, n: usize) -> String {
    match name.rsplit_once('.') {
        Some((s, e)) if !s.is_empty() => format!("{s}-{n}.{e}"),
        _ => format!("{name}-{n}"),
    }
}

/// Checks a message's files against `limits` and names them (module docs).
///
/// # Errors
/// [`Error::Invalid`] naming the file (`attachments[i]`), what is wrong and the limit (with its
/// setting).
pub fn check(uploads: Vec<c::AttachmentUpload>, limits: Limits) -> Result<Vec<Checked>> {
    if uploads.len() > limits.max_files {
        return Err(Error::Invalid(format!(
            "attachments: {} files is over the limit of {} per message (chat.attachment_max_files)",
            uploads.len(),
            limits.max_files
        )));
    }
    let mut total = 0u64;
    let mut out: Vec<Checked> = Vec::with_capacity(uploads.len());
    for (i, u) in uploads.into_iter().enumerate() {
        let size = u.data.len() as u64;
        let mut name = sanitize(&u.name);
        let field = format!("attachments[{i}] ({name})");
        if size == 0 {
            return Err(Error::Invalid(format!("{field}: the file is empty")));
        }
        if size > limits.max_bytes {
            return Err(Error::Invalid(format!(
                "{field}: {} is over the limit of {} per file (chat.attachment_max_bytes)",
                human(size),
                human(limits.max_bytes)
            )));
        }
        total += size;
        if total > MAX_TOTAL_BYTES {
            return Err(Error::Invalid(format!(
                "attachments: more than {} in all is over the limit of one message",
                human(MAX_TOTAL_BYTES)
            )));
        }
        let declared = u.mime.trim().to_ascii_lowercase();
        if declared.len() > 255 || declared.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(Error::Invalid(format!("{field}: the type {declared:?} is not a media type")));
        }
        let mime = match sniff_image(&u.data) {
            Some(image) => {
                if mime_from_name(&name) != image {
                    // A wrong image extension is replaced; another name gets one added.
                    let stem = match name.rsplit_once('.') {
                        Some((s, _)) if !s.is_empty() && mime_from_name(&name).starts_with("image/") => s.to_owned(),
                        _ => name.clone(),
                    };
                    name = sanitize(&format!("{stem}.{}", image_extension(image)));
                }
                image.to_owned()
            }
            None if declared.starts_with("image/") || mime_from_name(&name).starts_with("image/") => {
                return Err(Error::Invalid(format!(
                    "{field}: not a PNG, JPEG, GIF or WebP image; images of these types only (or send it as a file \
                     with another name)"
                )));
            }
            None if declared.is_empty() || declared == "application/octet-stream" => mime_from_name(&name).to_owned(),
            None => declared,
        };
        let base = name.clone();
        let mut n = 1;
        while out.iter().any(|o| o.name == name) {
            n += 1;
            name = numbered(&base, n);
        }
        out.push(Checked { name, mime, data: u.data });
    }
    Ok(out)
}

/// The folder of message `message_id`'s files under `cwd`.
pub fn folder(cwd: &Path, message_id: &str) -> PathBuf {
    cwd.join(DIR).join(message_id)
}

/// The path the agent and the owner see: relative to the working directory.
fn relative(message_id: &str, name: &str) -> String {
    format!("{DIR}/{message_id}/{name}")
}

/// Saves `files` as message `message_id`'s attachments under `cwd`; their content blocks, in
/// order. Nothing is left behind on error.
///
/// # Errors
/// [`Error::Invalid`] when the folder would resolve outside `cwd`; [`Error::Internal`] when it
/// cannot be written (the message names the folder).
pub fn save(cwd: &Path, message_id: &str, files: Vec<Checked>) -> Result<Vec<st::ContentBlockRecord>> {
    let dir = folder(cwd, message_id);
    let io = |e: std::io::Error| Error::Internal(format!("cannot save the attachments in {}: {e}", dir.display()));
    std::fs::create_dir_all(&dir).map_err(io)?;
    let inside = match (dir.canonicalize(), cwd.canonicalize()) {
        (Ok(d), Ok(c)) => d.starts_with(c),
        _ => false,
    };
    if !inside {
        let _ = std::fs::remove_dir_all(&dir);
        return Err(Error::Invalid(format!(
            "attachments: {} resolves outside the working directory (a symlink?); not written",
            dir.display()
        )));
    }
    let mut blocks = Vec::with_capacity(files.len());
    for f in files {
        let path = dir.join(&f.name);
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .and_then(|mut file| file.write_all(&f.data));
        if let Err(e) = written {
            remove(cwd, message_id);
            return Err(io(e));
        }
        blocks.push(st::ContentBlockRecord {
            block: Some(st::content_block_record::Block::Attachment(st::AttachmentRecord {
                path: relative(message_id, &f.name),
                size: f.data.len() as u64,
                name: f.name,
                mime: f.mime,
            })),
        });
    }
    Ok(blocks)
}

/// Removes message `message_id`'s attachments (a refused or unstored message).
pub fn remove(cwd: &Path, message_id: &str) {
    let _ = std::fs::remove_dir_all(folder(cwd, message_id));
}

/// Message `message_id`'s saved files, by name; none when it has no folder.
pub fn list(cwd: &Path, message_id: &str) -> Vec<Attachment> {
    let dir = folder(cwd, message_id);
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut out: Vec<Attachment> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            let meta = e.metadata().ok()?;
            if !meta.is_file() {
                return None;
            }
            let name = e.file_name().into_string().ok()?;
            let head = std::fs::File::open(e.path())
                .and_then(|mut f| {
                    let mut buf = [0u8; 16];
                    let n = std::io::Read::read(&mut f, &mut buf)?;
                    Ok(buf[..n].to_vec())
                })
                .unwrap_or_default();
            let mime = sniff_image(&head).unwrap_or_else(|| mime_from_name(&name)).to_owned();
            Some(Attachment { rel_path: relative(message_id, &name), path: e.path(), size: meta.len(), name, mime })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Why an attachment cannot be read back ([`read`]).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReadError {
    /// The name is not one this module would have saved (a path, `..`, control characters).
    #[error("name: {0:?} is not a plain file name")]
    BadName(String),
    /// No such file in the message's folder, or it resolves outside it, or is not a file.
    #[error("no attachment {0:?} in this message")]
    NotFound(String),
}

/// Checks that `name` is one this module could have saved: not empty, left as it is by
/// [`sanitize`] (no path, no `..`, no control characters), not too long.
///
/// # Errors
/// [`ReadError::BadName`] naming the first 80 characters.
pub fn check_name(name: &str) -> std::result::Result<(), ReadError> {
    if name.is_empty() || sanitize(name) != name || name.len() > MAX_NAME_BYTES + 8 {
        return Err(ReadError::BadName(name.chars().take(80).collect()));
    }
    Ok(())
}

/// The bytes and type of message `message_id`'s saved file `name` under `cwd` (module docs:
/// "Reading back"). `message_id` must be checked by the caller (a ULID: no path characters).
///
/// # Errors
/// [`ReadError::BadName`] for a name [`sanitize`] would change; [`ReadError::NotFound`] for a
/// missing file, a symlink, anything that is not a regular file inside the folder, or a file
/// over [`MAX_TOTAL_BYTES`].
pub fn read(cwd: &Path, message_id: &str, name: &str) -> std::result::Result<(String, Vec<u8>), ReadError> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    check_name(name)?;
    let missing = || ReadError::NotFound(name.to_owned());
    let real_cwd = cwd.canonicalize().map_err(|_| missing())?;
    let expected = real_cwd.join(DIR).join(message_id);
    let path = folder(cwd, message_id).join(name);
    // O_NOFOLLOW: the file itself may not be a symlink; the real path check covers the folders.
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .map_err(|_| missing())?;
    let real = path.canonicalize().map_err(|_| missing())?;
    if real.parent() != Some(expected.as_path()) {
        return Err(missing());
    }
    let meta = file.metadata().map_err(|_| missing())?;
    if !meta.is_file() || meta.len() > MAX_TOTAL_BYTES {
        return Err(missing());
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    (&mut file).take(MAX_TOTAL_BYTES).read_to_end(&mut data).map_err(|_| missing())?;
    let mime = sniff_image(&data).unwrap_or_else(|| mime_from_name(name)).to_owned();
    Ok((mime, data))
}

/// What the agent is told: `text`, then one `Attached: <path> (<type>, <size>)` line per file.
pub fn agent_text(text: &str, files: &[Attachment]) -> String {
    if files.is_empty() {
        return text.to_owned();
    }
    let lines: Vec<String> =
        files.iter().map(|f| format!("Attached: {} ({}, {})", f.rel_path, f.mime, human(f.size))).collect();
    if text.trim().is_empty() { lines.join("\n") } else { format!("{text}\n\n{}", lines.join("\n")) }
}

/// The pending-queue text of a message sent with files and no text (a queue item needs one).
pub fn placeholder(files: &[Checked]) -> String {
    let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
    format!("(attached: {})", names.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

    fn up(name: &str, mime: &str, data: &[u8]) -> c::AttachmentUpload {
        c::AttachmentUpload { name: name.into(), mime: mime.into(), data: data.to_vec() }
    }

    #[test]
    fn hostile_names_become_safe_ones() {
        assert_eq!(sanitize("../../x"), "x");
        assert_eq!(sanitize("..\\..\\win.ini"), "win.ini");
        assert_eq!(sanitize(".bashrc"), "bashrc");
        assert_eq!(sanitize("..."), "file");
        assert_eq!(sanitize(""), "file");
        assert_eq!(sanitize("a\0b\nc.txt"), "abc.txt");
        assert_eq!(sanitize("/etc/"), "file");
        assert_eq!(sanitize("what?<>.txt"), "what___.txt");
        let long = format!("{}.jpeg", "é".repeat(150));
        let s = sanitize(&long);
        assert!(s.len() <= MAX_NAME_BYTES && s.ends_with(".jpeg"), "{s}");
        for s in [sanitize("../../x"), sanitize(".."), sanitize(&"a/".repeat(300))] {
            assert!(!s.contains('/') && !s.starts_with('.') && !s.is_empty(), "{s}");
        }
    }

    #[test]
    fn limits_types_and_collisions() {
        let lim = Limits { max_bytes: 100, max_files: 3 };
        let ok =
            check(vec![up("a.png", "", PNG), up("a.png", "image/png", PNG), up("notes", "text/plain", b"hi")], lim)
                .unwrap();
        assert_eq!(ok.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["a.png", "a-2.png", "notes"]);
        assert_eq!(ok[0].mime, "image/png");
        assert_eq!(ok[2].mime, "text/plain");
        let named = check(vec![up("photo", "", PNG), up("photo.jpg", "image/jpeg", PNG)], lim).unwrap();
        assert_eq!(named[0].name, "photo.png", "an image gets its extension");
        assert_eq!(named[1].name, "photo-2.png", "a wrong image extension is replaced");
        let e = check(vec![up("a", "", b"x"); 4], lim).unwrap_err().to_string();
        assert!(e.contains("4 files") && e.contains("chat.attachment_max_files"), "{e}");
        let e = check(vec![up("big.bin", "", &[1u8; 101])], lim).unwrap_err().to_string();
        assert!(e.contains("big.bin") && e.contains("100 bytes") && e.contains("chat.attachment_max_bytes"), "{e}");
        let e = check(vec![up("e", "", b"")], lim).unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
        let e = check(vec![up("x.bmp", "image/bmp", b"BM....")], lim).unwrap_err().to_string();
        assert!(e.contains("PNG, JPEG, GIF or WebP"), "{e}");
        let e = check(vec![up("fake.jpg", "", b"not a jpeg")], lim).unwrap_err().to_string();
        assert!(e.contains("not a PNG"), "{e}");
        assert_eq!(check(vec![up("r.pdf", "", b"%PDF")], lim).unwrap()[0].mime, "application/pdf");
    }

    #[test]
    fn saved_files_are_listed_and_told() {
        let dir = tempfile::tempdir().unwrap();
        let files = check(vec![up("p.png", "", PNG), up("../n.txt", "", b"hello")], Limits::default()).unwrap();
        let blocks = save(dir.path(), "01MSG", files).unwrap();
        assert_eq!(blocks.len(), 2);
        assert_eq!(std::fs::read(dir.path().join(".coffer/attachments/01MSG/n.txt")).unwrap(), b"hello");
        let listed = list(dir.path(), "01MSG");
        assert_eq!(listed.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["n.txt", "p.png"]);
        assert!(listed[1].is_image() && !listed[0].is_image());
        let t = agent_text("look", &listed);
        assert!(t.starts_with("look\n\nAttached: .coffer/attachments/01MSG/n.txt (text/plain, 5 bytes)"), "{t}");
        assert!(list(dir.path(), "01OTHER").is_empty());
        remove(dir.path(), "01MSG");
        assert!(!folder(dir.path(), "01MSG").exists());
    }

    #[test]
    fn saved_files_read_back_and_hostile_names_or_links_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), b"secret").unwrap();
        let files = check(vec![up("p.png", "", PNG), up("n.txt", "", b"hello")], Limits::default()).unwrap();
        save(dir.path(), "01MSG", files).unwrap();
        assert_eq!(read(dir.path(), "01MSG", "p.png").unwrap(), ("image/png".to_owned(), PNG.to_vec()));
        assert_eq!(read(dir.path(), "01MSG", "n.txt").unwrap().0, "text/plain");
        for bad in ["../01MSG/n.txt", "..", ".", "", "a/b", "/etc/passwd", "x\0y", ".hidden", "a\nb"] {
            let bad = bad.replace("\\0", "\0").replace("\\n", "\n");
            assert!(matches!(read(dir.path(), "01MSG", &bad), Err(ReadError::BadName(_))), "{bad:?}");
        }
        assert_eq!(read(dir.path(), "01MSG", "gone.png"), Err(ReadError::NotFound("gone.png".into())));
        assert!(matches!(read(dir.path(), "01OTHER", "p.png"), Err(ReadError::NotFound(_))));
        // A symlink planted as a file, and a folder that is a symlink, are not followed out.
        let msg = folder(dir.path(), "01MSG");
        std::os::unix::fs::symlink(outside.path().join("secret.txt"), msg.join("link.txt")).unwrap();
        assert!(matches!(read(dir.path(), "01MSG", "link.txt"), Err(ReadError::NotFound(_))));
        std::os::unix::fs::symlink(outside.path(), folder(dir.path(), "01LINK")).unwrap();
        assert!(matches!(read(dir.path(), "01LINK", "secret.txt"), Err(ReadError::NotFound(_))));
        // A folder, not a file.
        std::fs::create_dir(msg.join("sub")).unwrap();
        assert!(matches!(read(dir.path(), "01MSG", "sub"), Err(ReadError::NotFound(_))));
    }

    #[test]
    fn a_symlinked_folder_is_not_followed_out() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join(".coffer")).unwrap();
        let files = check(vec![up("n.txt", "", b"x")], Limits::default()).unwrap();
        let e = save(dir.path(), "01MSG", files).unwrap_err().to_string();
        assert!(e.contains("outside the working directory"), "{e}");
    }
}
