//! Tests of [`super`]: transcripts written by the real CLIs (fixtures, redacted: paths replaced
//! by `/home/user`, long system-prompt lines dropped) and hostile files.
use super::*;

const CLAUDE: &str = include_str!("fixtures/claude_code_2.1.332_two_turns.jsonl");
const CLAUDE_ID: &str = "35b13f57-b1e3-45f0-bb61-b95101ccfb90";
const CODEX_FIXTURE: &str = include_str!("fixtures/codex_0.171.0_one_turn.jsonl");
const CODEX_ID: &str = "01a24ca8-2281-7372-b849-5be35903fd32";

fn write(path: &Path, body: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, body).unwrap();
}

fn roots(dir: &Path) -> Roots {
    Roots { claude: Some(dir.join(".claude")), codex: Some(dir.join(".codex")) }
}

fn claude_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(".claude/projects/-home-user-proj-sub").join(format!("{id}.jsonl"))
}

fn codex_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(".codex/sessions/2026/12/06").join(format!("rollout-2026-12-06T18-40-17-{id}.jsonl"))
}

#[test]
fn real_transcripts_are_summarized_with_their_folder_and_first_prompt() {
    let dir = tempfile::tempdir().unwrap();
    write(&claude_path(dir.path(), CLAUDE_ID), CLAUDE.as_bytes());
    write(&codex_path(dir.path(), CODEX_ID), CODEX_FIXTURE.as_bytes());
    let l = list(&roots(dir.path()), None, 0);
    assert_eq!((l.skipped_files, l.skipped_lines, l.truncated), (0, 0, false), "{l:?}");
    let claude = l.sessions.iter().find(|s| s.agent_key == CLAUDE_CODE).expect("the Claude Code session");
    assert_eq!(claude.session_id, CLAUDE_ID);
    assert_eq!(claude.cwd, "/home/user/proj/sub");
    assert_eq!(claude.first_prompt, "Please refactor the parser module");
    assert_eq!(claude.message_count, 4, "two prompts, two replies: {claude:?}");
    assert!(claude.last_activity_ms > 0 && claude.size_bytes == CLAUDE.len() as u64);
    let codex = l.sessions.iter().find(|s| s.agent_key == CODEX).expect("the Codex session");
    assert_eq!(codex.session_id, CODEX_ID);
    assert_eq!(codex.cwd, "/home/user/cproj");
    assert_eq!(codex.first_prompt, "Fix the flaky test in codex land");
    assert_eq!(codex.message_count, 2, "{codex:?}");
    // One agent only.
    let only = list(&roots(dir.path()), Some(CODEX), 0);
    assert_eq!(only.sessions.iter().map(|s| s.agent_key).collect::<Vec<_>>(), [CODEX]);
}

#[test]
fn history_is_the_user_and_assistant_text_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let p = claude_path(dir.path(), CLAUDE_ID);
    write(&p, CLAUDE.as_bytes());
    let t = read(CLAUDE_CODE, &p).unwrap();
    assert_eq!((t.session_id.as_str(), t.cwd.as_str()), (CLAUDE_ID, "/home/user/proj/sub"));
    let said: Vec<(Role, &str)> = t.items.iter().map(|i| (i.role, i.text.as_str())).collect();
    assert_eq!(
        said,
        [
            (Role::User, "Please refactor the parser module"),
            (Role::Assistant, "Hello from fake claude"),
            (Role::User, "And now the second question"),
            (Role::Assistant, "Hello from fake claude"),
        ]
    );
    assert!(t.items.iter().all(|i| i.at_ms > 1_796_000_000_000), "{:?}", t.items);
    let p = codex_path(dir.path(), CODEX_ID);
    write(&p, CODEX_FIXTURE.as_bytes());
    let t = read(CODEX, &p).unwrap();
    assert_eq!(t.session_id, CODEX_ID);
    let said: Vec<(Role, &str)> = t.items.iter().map(|i| (i.role, i.text.as_str())).collect();
    assert_eq!(said, [(Role::User, "Fix the flaky test in codex land"), (Role::Assistant, "Hello from fake codex")]);
}

#[test]
fn claude_tool_calls_are_kept_briefly_and_tool_results_and_meta_lines_are_not_prompts() {
    let lines = [
        r#"{"type":"user","message":{"role":"user","content":"list the files"},"cwd":"/w","sessionId":"s1","timestamp":"2026-01-02T03:04:05.678Z"}"#,
        r#"{"type":"assistant","message":{"id":"m1","role":"assistant","content":[{"type":"thinking","thinking":"hmm"}]}}"#,
        r#"{"type":"assistant","message":{"id":"m1","role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"ls"}}]}}"#,
        r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"a b"}]}}"#,
        r#"{"type":"user","isMeta":true,"message":{"role":"user","content":"<local-command-caveat>x"}}"#,
        r#"{"type":"assistant","message":{"id":"m2","role":"assistant","content":[{"type":"text","text":"Two files."}]}}"#,
    ];
    let dir = tempfile::tempdir().unwrap();
    let p = claude_path(dir.path(), "s1");
    write(&p, lines.join("\n").as_bytes());
    let t = read(CLAUDE_CODE, &p).unwrap();
    assert_eq!(t.items.len(), 3, "{:?}", t.items);
    assert_eq!(t.items[0].at_ms, 1_767_323_045_678);
    assert_eq!(t.items[1].tools, [("Bash".to_owned(), r#"{"command":"ls"}"#.to_owned())]);
    assert_eq!(t.items[2].text, "Two files.");
}

#[test]
fn hostile_files_are_skipped_and_counted_never_failing_the_listing() {
    let dir = tempfile::tempdir().unwrap();
    let projects = dir.path().join(".claude/projects");
    write(&claude_path(dir.path(), CLAUDE_ID), CLAUDE.as_bytes());
    // Garbage, a 50 MB line followed by a good one, a partial last line.
    write(&projects.join("g/garbage.jsonl"), b"\x00\xff not json at all\n{{{{\n");
    let mut huge = b"{\"type\":\"user\",\"cwd\":\"/big\",\"message\":{\"content\":\"before\"}}\n".to_vec();
    huge.extend_from_slice(b"{\"type\":\"user\",\"message\":{\"content\":\"");
    huge.resize(50 << 20, b'a');
    huge.extend_from_slice(
        b"\"}}\n{\"type\":\"user\",\"cwd\":\"/big\",\"message\":{\"content\":\"after the big line\"}}\n",
    );
    write(&projects.join("b/big-one.jsonl"), &huge);
    write(
        &projects.join("p/partial.jsonl"),
        b"{\"type\":\"user\",\"cwd\":\"/p\",\"message\":{\"content\":\"whole\"}}\n{\"type\":\"user\",\"mess",
    );
    // A symlink loop, a symlink to a file outside, an unreadable file, a directory named .jsonl.
    std::os::unix::fs::symlink(&projects, projects.join("loop")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", projects.join("g/passwd.jsonl")).unwrap();
    write(&projects.join("u/unreadable.jsonl"), b"{}");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(projects.join("u/unreadable.jsonl"), std::fs::Permissions::from_mode(0o000)).unwrap();
    std::fs::create_dir_all(projects.join("d/dir.jsonl")).unwrap();
    // Codex: a sessions tree with junk.
    write(&dir.path().join(".codex/sessions/2026/12/06/rollout-x-bad id.jsonl"), b"nope\n");
    write(&dir.path().join(".codex/sessions/2026/12/06/notes.txt"), b"ignored");

    let started = std::time::Instant::now();
    let l = list(&roots(dir.path()), None, 0);
    let ids: Vec<&str> = l.sessions.iter().map(|s| s.session_id.as_str()).collect();
    assert!(ids.contains(&CLAUDE_ID), "{l:?}");
    let big = l.sessions.iter().find(|s| s.session_id == "big-one").expect("the big file's session");
    assert!(big.partial && big.message_count == 1, "read only the first 8 MiB: {big:?}");
    let partial = l.sessions.iter().find(|s| s.session_id == "partial").expect("the partial file");
    assert_eq!((partial.cwd.as_str(), partial.message_count), ("/p", 1));
    assert!(!ids.contains(&"passwd"), "a symlinked file is not followed: {ids:?}");
    assert!(l.skipped_files >= 2, "garbage and the codex junk at least: {l:?}");
    assert_eq!(l.skipped_lines, 2, "the cut big line and the partial last line: {l:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
    // Importing reads further: the line after the 50 MB one.
    let t = read(CLAUDE_CODE, &projects.join("b/big-one.jsonl")).unwrap();
    assert_eq!(t.items.iter().map(|i| i.text.as_str()).collect::<Vec<_>>(), ["before", "after the big line"]);
    assert_eq!(t.skipped_lines, 1);
}

#[test]
fn session_ids_never_name_a_path_and_unknown_ones_are_not_found() {
    let dir = tempfile::tempdir().unwrap();
    write(&claude_path(dir.path(), CLAUDE_ID), CLAUDE.as_bytes());
    write(&codex_path(dir.path(), CODEX_ID), CODEX_FIXTURE.as_bytes());
    let r = roots(dir.path());
    for bad in ["../../etc/passwd", "a/b", "", "..", "x y", &"a".repeat(129), "id\0"] {
        assert!(matches!(find(&r, CLAUDE_CODE, bad), Err(Error::Invalid(_))), "{bad:?}");
        assert!(matches!(find(&r, CODEX, bad), Err(Error::Invalid(_))), "{bad:?}");
    }
    assert!(matches!(find(&r, "other", CLAUDE_ID), Err(Error::Invalid(_))));
    assert!(matches!(find(&r, CLAUDE_CODE, "no-such-session"), Err(Error::NotFound(_))));
    assert!(matches!(find(&r, CODEX, CLAUDE_ID), Err(Error::NotFound(_))));
    assert_eq!(find(&r, CLAUDE_CODE, CLAUDE_ID).unwrap(), claude_path(dir.path(), CLAUDE_ID));
    assert_eq!(find(&r, CODEX, CODEX_ID).unwrap(), codex_path(dir.path(), CODEX_ID));
}

#[test]
fn the_newest_files_are_listed_first_and_the_limit_holds() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..5 {
        let p = claude_path(dir.path(), &format!("s{i}"));
        write(
            &p,
            format!("{{\"type\":\"user\",\"cwd\":\"/w\",\"message\":{{\"content\":\"prompt {i}\"}}}}\n").as_bytes(),
        );
        let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000 + i * 60);
        File::options().write(true).open(&p).unwrap().set_modified(t).unwrap();
    }
    let l = list(&roots(dir.path()), Some(CLAUDE_CODE), 3);
    assert_eq!(l.sessions.iter().map(|s| s.session_id.as_str()).collect::<Vec<_>>(), ["s4", "s3", "s2"]);
    assert!(l.truncated);
}

#[test]
fn timestamps_parse_and_garbage_is_zero() {
    assert_eq!(parse_utc("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(parse_utc("2026-11-30T09:31:36.123Z"), Some(1_796_031_096_123));
    assert_eq!(parse_utc("2000-02-29T00:00:00.5Z"), Some(951_782_400_500));
    for bad in ["", "2026-13-01T00:00:00Z", "yesterday", "2026-11-30 09:31:36Z", "2026-11-30T09:31:36.Z"] {
        assert_eq!(parse_utc(bad), None, "{bad}");
    }
    assert_eq!(one_line("  a\n\n b  ", 10), "a b");
    assert_eq!(one_line("abcdefghijk", 5), "abcd…");
}
