//! The "it finished" notice of a long turn (issue 34 §2): Telegram does not notify message
//! edits, and a turn's answer lands in the progress message it edits, so a ten-minute task
//! would finish silently. When a turn that ran at least `chat.notify_after_s` ends, the bridge's
//! renderer sends one new short message to the chat, after the turn's own output:
//! `Done in 4m12s`, `Failed after 1m3s: <reason>`, `Interrupted after 20s`.
//!
//! [`finished_line`] builds the line from the turn's final [`TurnView`]; what else a turn's end
//! can say cheaply (files changed, …) is appended there, as `: <part>` pieces, so the line
//! stays one line.
use std::time::Duration;

use super::{TurnState, TurnView};

/// Longest failure reason quoted in the line, characters.
const MAX_REASON_CHARS: usize = 200;

/// Whether the final view `view` gets a notice: its end was seen (it has an elapsed time) and
/// the turn ran at least `after` (`chat.notify_after_s`; zero: every turn).
pub fn due(view: &TurnView, after: Duration) -> bool {
    view.state.is_final() && view.elapsed_ms.is_some_and(|ms| Duration::from_millis(ms) >= after)
}

/// The one-line notice of a turn's final view: `Done in 4m12s` (` (max_tokens)` when it stopped
/// for another reason than the end of its turn), `Interrupted after 1m3s`, `Failed after 1m3s:
/// <the engine's reason, first line, at most 200 characters>`.
pub fn finished_line(view: &TurnView) -> String {
    let took = took(Duration::from_millis(view.elapsed_ms.unwrap_or_default()));
    match &view.state {
        TurnState::Done { stop_reason } if stop_reason.is_empty() || stop_reason == "end_turn" => {
            format!("Done in {took}")
        }
        TurnState::Done { stop_reason } => format!("Done in {took} ({})", one_line(stop_reason, 40)),
        TurnState::Interrupted => format!("Interrupted after {took}"),
        TurnState::Failed { message } if message.trim().is_empty() => format!("Failed after {took}"),
        TurnState::Failed { message } => format!("Failed after {took}: {}", one_line(message, MAX_REASON_CHARS)),
        TurnState::Running => format!("Still running after {took}"),
    }
}

/// A duration as people read it: `42s`, `4m12s`, `1h5m` (seconds dropped past an hour).
pub fn took(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        _ => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}

/// The first non-blank line of `s`, cut to `max` characters (with `…`).
fn one_line(s: &str, max: usize) -> String {
    let line = s.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default();
    if line.chars().count() <= max {
        return line.to_owned();
    }
    format!("{}…", line.chars().take(max).collect::<String>())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(state: TurnState, ms: Option<u64>) -> TurnView {
        TurnView { state, elapsed_ms: ms, ..Default::default() }
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(took(Duration::from_millis(999)), "0s");
        assert_eq!(took(Duration::from_secs(42)), "42s");
        assert_eq!(took(Duration::from_secs(252)), "4m12s");
        assert_eq!(took(Duration::from_secs(3600 + 5 * 60 + 9)), "1h5m");
    }

    #[test]
    fn the_line_says_how_the_turn_ended_in_one_line() {
        let done = |r: &str| TurnState::Done { stop_reason: r.into() };
        assert_eq!(finished_line(&view(done("end_turn"), Some(252_000))), "Done in 4m12s");
        assert_eq!(finished_line(&view(done("max_tokens"), Some(31_000))), "Done in 31s (max_tokens)");
        assert_eq!(finished_line(&view(TurnState::Interrupted, Some(63_000))), "Interrupted after 1m3s");
        let failed = TurnState::Failed { message: "\nthe model API answered 500\nmore detail".into() };
        assert_eq!(finished_line(&view(failed, Some(63_000))), "Failed after 1m3s: the model API answered 500");
        let long = TurnState::Failed { message: "x".repeat(500) };
        let line = finished_line(&view(long, Some(1000)));
        assert!(line.ends_with('…') && line.chars().count() < 240 && !line.contains('\n'), "{line}");
    }

    #[test]
    fn only_ends_seen_on_the_bus_and_long_enough_are_due() {
        let done = TurnState::Done { stop_reason: "end_turn".into() };
        let after = Duration::from_secs(30);
        assert!(due(&view(done.clone(), Some(30_000)), after));
        assert!(!due(&view(done.clone(), Some(29_999)), after), "a short turn");
        assert!(!due(&view(done.clone(), None), after), "an end the bridge made up");
        assert!(!due(&view(TurnState::Running, Some(60_000)), after), "still running");
        assert!(due(&view(done, Some(0)), Duration::ZERO), "0: every turn");
    }
}
