//! The Telegram progress messages still open, kept on disk so that a crash cannot leave them
//! on "…": `COFFER_HOME/chat/channels/<channel>.progress.json`, rewritten (through a temporary
//! file and a rename) whenever a progress message opens, is edited or is finished — at most
//! about once a second per chat, as the edits themselves. A `coffer-chat` killed mid-turn
//! leaves the file behind; the channel's next adapter takes it at start and finishes each
//! message with the text it showed and a one-line reason (the turn's stored failure: the
//! restart marks a turn cut by a crash `failed`). The file holds chat and message ids and the
//! text shown in the chat (the owner's own conversation, as the store holds it too); never a
//! token.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One open progress message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenProgress {
    /// The Telegram message id.
    pub message_id: i64,
    /// The plain text it shows (the turn's text so far, then " …").
    pub shown: String,
    /// The conversation whose turn it shows.
    pub conversation_id: String,
}

/// Open progress messages by chat id.
pub type Open = BTreeMap<String, OpenProgress>;

/// The reason a progress message gets when its turn's failure cannot be read.
pub const CRASHED_NOTE: &str = "⚠ Coffer's chat service stopped during this turn; it did not finish. The whole conversation is in Coffer's web console.";

/// The journal file of one channel.
#[derive(Debug, Clone)]
pub struct Journal {
    path: PathBuf,
}

impl Journal {
    /// The journal of channel `channel` under `home` (`COFFER_HOME`). Channel names are the
    /// store's (a-z, 0-9, `-`), safe as a file name.
    pub fn new(home: &Path, channel: &str) -> Self {
        Self { path: home.join("chat").join("channels").join(format!("{channel}.progress.json")) }
    }

    /// Writes `open` (an empty map removes the file). A failure is logged: the messages then
    /// may stay on "…" after a crash, as before this journal.
    pub fn save(&self, open: &Open) {
        let result = if open.is_empty() {
            match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        } else {
            self.write(open)
        };
        if let Err(e) = result {
            tracing::warn!(path = %self.path.display(), error = %e, "Cannot keep the open progress messages on disk.");
        }
    }

    fn write(&self, open: &Open) -> std::io::Result<()> {
        let dir = self.path.parent().unwrap_or_else(|| Path::new("."));
        std::fs::create_dir_all(dir)?;
        let tmp = self.path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(open).map_err(std::io::Error::other)?)?;
        std::fs::rename(&tmp, &self.path)
    }

    /// The messages a previous run left open, and the file removed; empty when there is none
    /// or it does not parse (then logged).
    pub fn take(&self) -> Open {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Open::new(),
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "Cannot read the open progress messages.");
                return Open::new();
            }
        };
        let _ = std::fs::remove_file(&self.path);
        serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::warn!(path = %self.path.display(), error = %e, "The open progress messages do not parse; skipped.");
            Open::new()
        })
    }
}

/// The text that finishes a progress message left open: what it showed (without the trailing
/// "…") and `reason` on a line of its own.
pub fn finished_text(shown: &str, reason: &str) -> String {
    let kept = shown.trim_end().trim_end_matches('…').trim_end();
    if kept.is_empty() { reason.to_owned() } else { format!("{kept}\n\n{reason}") }
}

/// The one-line reason for a turn's stored answer: `⚠ The turn failed: <error>` for a failed
/// one (its error on one line, at most 300 characters), else [`CRASHED_NOTE`].
pub fn reason(failed_error: Option<&str>) -> String {
    match failed_error.map(str::trim).filter(|e| !e.is_empty()) {
        Some(e) => {
            let line = e.replace(['\n', '\r'], " ");
            let cut: String = line.chars().take(300).collect();
            format!("⚠ The turn failed: {cut}")
        }
        None => CRASHED_NOTE.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_round_trips_and_is_taken_once() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::new(dir.path(), "tg");
        assert!(j.take().is_empty(), "none yet");
        let mut open = Open::new();
        open.insert(
            "1001".into(),
            OpenProgress { message_id: 7, shown: "Hello w …".into(), conversation_id: "C".into() },
        );
        j.save(&open);
        assert!(dir.path().join("chat/channels/tg.progress.json").is_file());
        assert_eq!(j.take(), open);
        assert!(j.take().is_empty(), "taken: the file is gone");
        j.save(&open);
        j.save(&Open::new());
        assert!(j.take().is_empty(), "an empty map removes it");
        std::fs::write(dir.path().join("chat/channels/tg.progress.json"), "not json").unwrap();
        assert!(j.take().is_empty(), "garbage is skipped");
    }

    #[test]
    fn a_left_message_keeps_its_text_and_says_why_on_one_line() {
        assert_eq!(finished_text("w0 w1 w2 …", "⚠ why"), "w0 w1 w2\n\n⚠ why");
        assert_eq!(finished_text("…", "⚠ why"), "⚠ why");
        assert_eq!(
            reason(Some("The chat service stopped.\nReally")),
            "⚠ The turn failed: The chat service stopped. Really"
        );
        assert_eq!(reason(Some("  ")), CRASHED_NOTE);
        assert_eq!(reason(None), CRASHED_NOTE);
    }
}
