//! Fetching a model once from a hub in Hugging Face's file layout: each file at
//! `<hub>/<repo>/resolve/<revision>/<path>` (the hub may answer with a redirect to where the
//! bytes are; large files carry their SHA-256 in `X-Linked-Etag` and their size in
//! `X-Linked-Size` on that first answer, as the Hugging Face Hub does for LFS files).
//!
//! Each file goes to `<dest>/<path>.part`, then is checked (its size; its SHA-256 against the
//! catalogue's pin, else the hub's `X-Linked-Etag` when that is a SHA-256) and renamed into
//! place, so a folder never holds a half-written model file under its real name. An interrupted
//! download resumes where the `.part` stops (`Range: bytes=N-`, RFC 9110 §14); a server that
//! ignores the range answers 200 and the file starts over. Progress is reported per chunk read.
//!
//! Redirects are followed by hand (at most [`MAX_REDIRECTS`], `http(s)` only) so the first
//! answer's checksum headers are seen; no credential is ever sent.
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::header::{CONTENT_RANGE, LOCATION, RANGE};
use reqwest::{StatusCode, Url};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::catalogue::CatalogueModel;

/// Redirects followed for one file.
pub const MAX_REDIRECTS: usize = 5;
/// Longest wait for a connection, and for the next bytes of an answer.
const STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a model could not be fetched. Messages name the model, the hub and the file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HubError {
    /// No connection (offline, DNS, refused, TLS) or the connection broke.
    #[error(
        "cannot download {model} from {hub}: {problem}. Connect this machine, or put the model's files ({files}) in a folder and set retrieval.embeddings.model_dir to it"
    )]
    Unreachable { model: String, hub: String, problem: String, files: String },
    /// The hub answered an error status for a file.
    #[error("cannot download {model}: {file} answered HTTP {status} from {hub}")]
    Status { model: String, hub: String, file: String, status: u16 },
    /// A file's bytes do not match its checksum or announced size (the partial file is removed).
    #[error("cannot download {model}: {file} {problem}")]
    Corrupt { model: String, file: String, problem: String },
    /// The destination folder cannot be written.
    #[error("cannot write the model folder {dir}: {problem}")]
    Io { dir: String, problem: String },
    /// The hub URL is not usable.
    #[error("the model hub URL {0} is not an http:// or https:// URL")]
    BadHub(String),
}

/// Where a download stands: `done` of `total` bytes (total 0 = unknown) of `file`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// The file being fetched.
    pub file: String,
    /// Bytes on disk so far, of this file.
    pub done: u64,
    /// Its size, when announced.
    pub total: u64,
    /// Bytes of the whole model on disk so far (the files done plus this one's `done`).
    pub model_done: u64,
}

fn shown(u: &Url) -> String {
    let mut s = format!("{}://{}", u.scheme(), u.host_str().unwrap_or(""));
    if let Some(p) = u.port() {
        s.push_str(&format!(":{p}"));
    }
    s
}

/// The model folder: every file of `model` in `dest`, fetched from `hub` for those missing.
/// Files already there are kept as they are (a pinned checksum is checked once, here).
///
/// # Errors
/// [`HubError`]; the files already complete stay, a partial file stays as `.part` for a
/// resume unless its bytes proved wrong.
pub async fn ensure_model(
    model: &CatalogueModel,
    hub: &str,
    dest: &Path,
    mut progress: impl FnMut(&Progress),
) -> Result<PathBuf, HubError> {
    let base = Url::parse(hub.trim().trim_end_matches('/'))
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some_and(|h| !h.is_empty()))
        .ok_or_else(|| HubError::BadHub(hub.to_owned()))?;
    let io = |e: std::io::Error| HubError::Io { dir: dest.display().to_string(), problem: e.to_string() };
    tokio::fs::create_dir_all(dest).await.map_err(io)?;
    coffer_runtime::tls::ensure_provider();
    let client = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(STALL_TIMEOUT)
        .read_timeout(STALL_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| HubError::BadHub(format!("{} ({})", shown(&base), e.without_url())))?;
    let mut model_done = 0u64;
    for file in model.files {
        let target = dest.join(file.path);
        if let Ok(meta) = tokio::fs::metadata(&target).await
            && meta.is_file()
        {
            model_done += meta.len();
            continue;
        }
        let url = base
            .join(&format!(
                "{}/{}/resolve/{}/{}",
                base.path().trim_end_matches('/'),
                model.repo,
                model.revision,
                file.path
            ))
            .map_err(|_| HubError::BadHub(shown(&base)))?;
        let fetched = fetch_file(&client, model, file, url, &target, model_done, &mut progress).await;
        match fetched {
            Ok(len) => model_done += len,
            Err(FileError::Missing) if !file.required => {}
            Err(FileError::Missing) => {
                return Err(HubError::Status {
                    model: model.name.into(),
                    hub: shown(&base),
                    file: file.path.into(),
                    status: 404,
                });
            }
            Err(FileError::Hub(e)) => return Err(e),
        }
    }
    Ok(dest.to_owned())
}

enum FileError {
    Missing,
    Hub(HubError),
}

impl From<HubError> for FileError {
    fn from(e: HubError) -> Self {
        FileError::Hub(e)
    }
}

async fn fetch_file(
    client: &reqwest::Client,
    model: &CatalogueModel,
    file: &crate::catalogue::ModelFile,
    url: Url,
    target: &Path,
    model_done: u64,
    progress: &mut impl FnMut(&Progress),
) -> Result<u64, FileError> {
    let hub = shown(&url);
    let part = target.with_file_name(format!("{}.part", file.path));
    let dir = target.parent().unwrap_or(Path::new(".")).display().to_string();
    let io = |e: std::io::Error| HubError::Io { dir: dir.clone(), problem: e.to_string() };
    let unreachable = |e: &reqwest::Error| {
        let mut problem = e.without_url_ref();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            problem.push_str(": ");
            problem.push_str(&s.to_string());
            source = s.source();
        }
        HubError::Unreachable {
            model: model.name.into(),
            hub: hub.clone(),
            problem,
            files: crate::engine::REQUIRED_FILES.join(", "),
        }
    };
    let corrupt = |problem: String| HubError::Corrupt { model: model.name.into(), file: file.path.into(), problem };

    // What is already on disk, hashed so the checksum covers the whole file after a resume.
    let mut have = match tokio::fs::read(&part).await {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io(e).into()),
    };
    let mut hasher = Sha256::new();
    hasher.update(&have);
    let mut done = have.len() as u64;
    have.clear();

    let mut linked_sha: Option<String> = None;
    let mut linked_size: Option<u64> = None;
    let mut url = url;
    let mut redirects = 0;
    let mut resp = loop {
        let mut req = client.get(url.clone());
        if done > 0 {
            req = req.header(RANGE, format!("bytes={done}-"));
        }
        let resp = req.send().await.map_err(|e| unreachable(&e))?;
        let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        if linked_sha.is_none() {
            linked_sha = header("x-linked-etag")
                .map(|v| v.trim().trim_start_matches("W/").trim_matches('"').to_ascii_lowercase())
                .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()));
        }
        if linked_size.is_none() {
            linked_size = header("x-linked-size").and_then(|v| v.trim().parse().ok());
        }
        if resp.status().is_redirection() {
            redirects += 1;
            let next = header(LOCATION.as_str()).and_then(|l| url.join(&l).ok());
            match next {
                Some(n) if redirects <= MAX_REDIRECTS && matches!(n.scheme(), "http" | "https") => {
                    url = n;
                    continue;
                }
                _ => {
                    return Err(corrupt(format!(
                        "was redirected more than {MAX_REDIRECTS} times or to a non-HTTP URL"
                    ))
                    .into());
                }
            }
        }
        break resp;
    };
    let status = resp.status();
    if status == StatusCode::NOT_FOUND {
        return Err(FileError::Missing);
    }
    if status == StatusCode::RANGE_NOT_SATISFIABLE && done > 0 {
        // The part may already be whole; the checks below decide.
    } else if status == StatusCode::OK && done > 0 {
        // The range was ignored: start over.
        hasher = Sha256::new();
        done = 0;
        tokio::fs::write(&part, b"").await.map_err(io)?;
    } else if status == StatusCode::PARTIAL_CONTENT {
        let start = resp
            .headers()
            .get(CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("bytes "))
            .and_then(|v| v.split('-').next())
            .and_then(|v| v.parse::<u64>().ok());
        if start != Some(done) {
            let _ = tokio::fs::remove_file(&part).await;
            return Err(corrupt(format!("answered a range that does not start at byte {done}")).into());
        }
    } else if !status.is_success() {
        return Err(HubError::Status {
            model: model.name.into(),
            hub,
            file: file.path.into(),
            status: status.as_u16(),
        }
        .into());
    }
    let total = match status {
        StatusCode::PARTIAL_CONTENT => resp.content_length().map(|l| l + done),
        StatusCode::RANGE_NOT_SATISFIABLE => None,
        _ => resp.content_length(),
    }
    .or(linked_size)
    .or(file.size)
    .unwrap_or(0);
    if file.size.is_some_and(|s| total > 0 && total != s) {
        return Err(
            corrupt(format!("is announced as {total} bytes; the catalogue says {}", file.size.unwrap_or(0))).into()
        );
    }
    if status.is_success() {
        let mut out = tokio::fs::OpenOptions::new().create(true).append(true).open(&part).await.map_err(io)?;
        progress(&Progress { file: file.path.into(), done, total, model_done: model_done + done });
        loop {
            let chunk = match resp.chunk().await {
                Ok(Some(c)) => c,
                Ok(None) => break,
                Err(e) => {
                    out.flush().await.map_err(io)?;
                    return Err(unreachable(&e).into());
                }
            };
            if total > 0 && done + chunk.len() as u64 > total {
                drop(out);
                let _ = tokio::fs::remove_file(&part).await;
                return Err(corrupt(format!("is longer than the {total} bytes announced")).into());
            }
            hasher.update(&chunk);
            out.write_all(&chunk).await.map_err(io)?;
            done += chunk.len() as u64;
            progress(&Progress { file: file.path.into(), done, total, model_done: model_done + done });
        }
        out.sync_all().await.map_err(io)?;
    }
    if total > 0 && done != total {
        return Err(HubError::Unreachable {
            model: model.name.into(),
            hub,
            problem: format!("{} stopped at {done} of {total} bytes (it resumes on the next try)", file.path),
            files: crate::engine::REQUIRED_FILES.join(", "),
        }
        .into());
    }
    let got = hex::encode(hasher.finalize());
    let want = file.sha256.map(str::to_owned).or(linked_sha);
    if let Some(want) = want
        && got != want
    {
        let _ = tokio::fs::remove_file(&part).await;
        return Err(corrupt(format!(
            "has SHA-256 {got}, expected {want} (removed; it is fetched again on the next try)"
        ))
        .into());
    }
    tokio::fs::rename(&part, target).await.map_err(io)?;
    Ok(done)
}

trait WithoutUrl {
    fn without_url_ref(&self) -> String;
}

impl WithoutUrl for reqwest::Error {
    /// The message without the URL (it is shown separately, without user info or query).
    fn without_url_ref(&self) -> String {
        let mut msg = self.to_string();
        if let Some(u) = self.url() {
            msg = msg.replace(&format!(" ({})", u.as_str()), "").replace(u.as_str(), &shown(u));
        }
        msg
    }
}
