//! Unit tests of the capability catalog: profiles, backoff, the cache file, waiting for a list.
use super::cache::{MAX_CACHE_BYTES, write_cache};
use super::*;

fn generation(version: i64) -> Generation {
    Generation { version, credentials: 0 }
}

fn p() -> Profile {
    Profile::default()
}

#[test]
fn the_era_is_remembered_per_generation() {
    let c = GatewayCatalog::default();
    assert_eq!(c.era("a", generation(1)), None);
    c.learn_era("a", generation(1), Era::Modern);
    assert_eq!(c.era("a", generation(1)), Some(Era::Modern));
    assert_eq!(c.era("b", generation(1)), None, "per server");
    // A new registry version or credential epoch may run another program: probe again.
    assert_eq!(c.era("a", generation(2)), None);
    c.store("a", generation(2), &p(), ListKind::Tools, Arc::new(vec![]));
    assert_eq!(c.era("a", generation(2)), None);
    c.learn_era("a", generation(2), Era::Legacy);
    assert_eq!(c.era("a", generation(2)), Some(Era::Legacy));
    // A late start of the old generation does not overwrite what the new one learnt.
    c.learn_era("a", generation(1), Era::Modern);
    assert_eq!(c.era("a", generation(2)), Some(Era::Legacy));
}

#[test]
fn lists_are_known_per_generation_and_kept_as_stale_after_a_change() {
    let c = GatewayCatalog::default();
    let mut changes = c.subscribe();
    assert!(matches!(
        c.lookup("a", generation(1), &p(), ListKind::Tools),
        Known::Pending { warming: None, stale: None }
    ));
    let items = Arc::new(vec![json!({"name": "echo"})]);
    c.store("a", generation(1), &p(), ListKind::Tools, items.clone());
    assert!(matches!(c.lookup("a", generation(1), &p(), ListKind::Tools), Known::Ready(i) if i == items));
    assert!(matches!(c.lookup("a", generation(1), &p(), ListKind::Prompts), Known::Pending { .. }));
    assert_eq!(changes.try_recv().unwrap(), ("a".to_owned(), ListKind::Tools));
    c.store("a", generation(1), &p(), ListKind::Tools, items.clone());
    assert!(changes.try_recv().is_err(), "the same list again is no change");
    // A new registry version: what was known is only a fallback.
    let Known::Pending { stale: Some(stale), .. } = c.lookup("a", generation(2), &p(), ListKind::Tools) else {
        panic!("pending with the old list")
    };
    assert_eq!(stale, items);
    c.invalidate(Some("a"));
    assert!(matches!(c.lookup("a", generation(1), &p(), ListKind::Tools), Known::Pending { stale: Some(_), .. }));
    c.retain(&HashMap::new());
    assert!(matches!(c.lookup("a", generation(1), &p(), ListKind::Tools), Known::Pending { stale: None, .. }));
}

#[test]
fn a_failure_is_remembered_for_its_backoff_and_cleared_by_a_list() {
    let c = GatewayCatalog::default();
    c.failed("h", generation(1), "no initialize answer within 30000 ms");
    let Known::Failed { error, retry_due, .. } = c.lookup("h", generation(1), &p(), ListKind::Tools) else {
        panic!("failed")
    };
    assert!(!retry_due && error.contains("initialize"));
    assert_eq!(c.status("h", generation(1)).state, CatalogPhase::Failed);
    assert!(matches!(c.lookup("h", generation(2), &p(), ListKind::Tools), Known::Pending { .. }), "a change retries");
    c.failed("h", generation(1), "again");
    let attempts = c.servers.lock().unwrap()["h"].failure.as_ref().unwrap().attempts;
    assert_eq!(attempts, 2, "failures in a row lengthen the backoff");
    c.failed("h", generation(2), "after a change");
    let attempts = c.servers.lock().unwrap()["h"].failure.as_ref().unwrap().attempts;
    assert_eq!(attempts, 1, "a new generation starts over");
    c.failed("h", generation(1), "back");
    assert!(c.begin_warm("h", generation(1), &p()));
    assert!(!c.begin_warm("h", generation(1), &p()), "one background start at a time");
    assert!(
        matches!(c.lookup("h", generation(1), &p(), ListKind::Tools), Known::Failed { retry_due: false, .. }),
        "a background retry is not waited on"
    );
    assert_eq!(c.status("h", generation(1)).retrying, Some(true));
    c.store("h", generation(1), &p(), ListKind::Tools, Arc::new(Vec::new()));
    c.end_warm("h", generation(1), &p());
    assert_eq!(c.status("h", generation(1)).state, CatalogPhase::Ready);
    assert!(!c.needs_warm("h", generation(1), &p()) && c.needs_warm("h", generation(3), &p()));
}

#[test]
fn lists_are_known_per_client_profile_whatever_the_key_order() {
    let c = GatewayCatalog::default();
    let sampling = Profile::of(&json!({"capabilities": {"sampling": {}, "roots": {"listChanged": true}}}));
    let same = Profile::of(&json!({"capabilities": {"roots": {"listChanged": true}, "sampling": {}}}));
    assert_eq!(sampling, same);
    assert_ne!(sampling, Profile::of(&json!({"capabilities": {}})));
    c.store("e", generation(1), &sampling, ListKind::Tools, Arc::new(vec![json!({"name": "trigger-sampling"})]));
    assert!(matches!(c.lookup("e", generation(1), &same, ListKind::Tools), Known::Ready(_)));
    let plain = Profile::of(&json!({}));
    // Another profile's list is answered (borrowed) while the plain one's own is not known.
    assert!(matches!(c.lookup("e", generation(1), &plain, ListKind::Tools), Known::Shared { warming: false, .. }));
    assert!(c.needs_warm("e", generation(1), &plain) && !c.needs_warm("e", generation(1), &sampling));
    assert_eq!(c.clients().len(), 1, "a client without capabilities when none connected");
    for i in 0..6 {
        c.remember_client(&json!({"capabilities": {"experimental": {"n": i}}}));
    }
    c.remember_client(&json!({"capabilities": {"experimental": {"n": 5}}}));
    assert_eq!(c.clients().len(), MAX_PROFILES);
}

#[test]
fn backoff_doubles_up_to_its_bound() {
    let f = |attempts| Failure { at: Instant::now(), attempts, error: String::new() }.backoff();
    assert_eq!((f(1), f(2), f(3)), (FIRST_BACKOFF, FIRST_BACKOFF * 2, FIRST_BACKOFF * 4));
    assert_eq!(f(40), MAX_BACKOFF);
}

fn registered(name: &str, version: i64, created_at: &str) -> McpServer {
    McpServer { name: name.into(), version, created_at: created_at.into(), enabled: true, ..Default::default() }
}

fn snapshot_of(servers: &[McpServer]) -> crate::snapshot::Snapshot {
    crate::snapshot::Snapshot {
        servers: servers.iter().map(|s| (s.name.clone(), s.clone())).collect(),
        loaded: true,
        ..Default::default()
    }
}

#[test]
fn the_cache_file_round_trips_and_serves_only_the_registration_it_was_made_for() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CACHE_FILE);
    let (a, b) = (registered("a", 3, "2026-12-01T00:00:00Z"), registered("b", 1, "2026-12-01T00:00:00Z"));
    let snap = snapshot_of(&[a.clone(), b.clone()]);
    let c = GatewayCatalog::default();
    let client = json!({"protocolVersion": "2025-11-25", "capabilities": {"sampling": {}}, "clientInfo": {"name": "x", "version": "1"}});
    c.remember_client(&client);
    let sampling = Profile::of(&client);
    let tools = Arc::new(vec![json!({"name": "echo"})]);
    // Lists of a credential epoch other than 0 are saved too: after a restart the epoch
    // starts again at 0 with the same credential values.
    c.store("a", Generation { version: 3, credentials: 9 }, &sampling, ListKind::Tools, tools.clone());
    c.learn_era("a", Generation { version: 3, credentials: 9 }, Era::Modern);
    c.store("b", generation(1), &sampling, ListKind::Tools, tools.clone());
    c.invalidate(Some("b"));
    let mut epochs = snapshot_of(&[a.clone(), b.clone()]);
    epochs.credential_epochs.insert("a".into(), 9);
    write_cache(&path, &c.cache_body(&epochs)).unwrap();

    let restored = GatewayCatalog::load(&path);
    assert_eq!(restored.clients(), vec![client.clone()], "the client profiles come back");
    assert!(matches!(restored.lookup("a", generation(3), &sampling, ListKind::Tools), Known::Ready(i) if i == tools));
    assert_eq!(restored.era("a", generation(3)), Some(Era::Modern));
    assert!(
        matches!(restored.lookup("b", generation(1), &sampling, ListKind::Tools), Known::Pending { stale: None, .. }),
        "a stale list is not saved"
    );
    assert!(restored.needs_warm("a", generation(3), &sampling), "restored lists are refreshed once");
    assert_eq!(restored.status("a", generation(3)).state, CatalogPhase::Ready);
    restored.validate_restored(&snap);
    assert!(matches!(restored.lookup("a", generation(3), &sampling, ListKind::Tools), Known::Ready(_)));

    // The same name registered again (another creation time) at the same version: not its lists.
    let again = GatewayCatalog::load(&path);
    again.validate_restored(&snapshot_of(&[registered("a", 3, "2026-12-05T00:00:00Z")]));
    assert!(matches!(again.lookup("a", generation(3), &sampling, ListKind::Tools), Known::Pending { stale: None, .. }));
    // A newer registry version: the restored list is only a fallback.
    let newer = GatewayCatalog::load(&path);
    newer.validate_restored(&snap);
    assert!(matches!(
        newer.lookup("a", generation(4), &sampling, ListKind::Tools),
        Known::Pending { stale: Some(_), .. }
    ));
}

#[test]
fn a_damaged_cache_file_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("catalog.json");
    assert!(read_cache(&path).unwrap().is_none(), "no file: nothing to restore");
    for (bytes, why) in [
        (b"{\"format\": 1, \"clients\": [], \"servers\": {\"a\": ".to_vec(), "not the expected JSON"),
        (b"\x00\xff garbage".to_vec(), "not the expected JSON"),
        (br#"{"format": 99, "clients": [], "servers": {}}"#.to_vec(), "format 99"),
        (br#"{"format": 1, "clients": [], "servers": {"a": {"version": "x"}}}"#.to_vec(), "not the expected JSON"),
    ] {
        std::fs::write(&path, &bytes).unwrap();
        let err =
            read_cache(&path).err().unwrap_or_else(|| panic!("{:?} was accepted", String::from_utf8_lossy(&bytes)));
        assert!(err.contains(why), "{err}");
        let c = GatewayCatalog::load(&path);
        assert!(c.servers.lock().unwrap().is_empty());
    }
    let big = std::fs::File::create(&path).unwrap();
    big.set_len(MAX_CACHE_BYTES + 1).unwrap();
    assert!(read_cache(&path).err().is_some_and(|e| e.contains("larger than")));
    // Unknown kinds and non-object clients in an otherwise good file are skipped.
    std::fs::write(
        &path,
        br#"{"format": 1, "clients": [7, {"capabilities": {}}], "servers": {"a": {"version": 1, "fingerprint": "f", "era": "nonsense", "lists": [{"profile": "{}", "kind": "bogus/list", "items": []}, {"profile": "{}", "kind": "tools/list", "items": [{"name": "t"}]}]}}}"#,
    )
    .unwrap();
    let c = GatewayCatalog::load(&path);
    assert_eq!(c.clients().len(), 1);
    assert!(
        matches!(c.lookup("a", generation(1), &Profile::of(&json!({})), ListKind::Tools), Known::Ready(i) if i.len() == 1)
    );
    assert_eq!(c.era("a", generation(1)), None);
}

#[test]
fn an_unseen_profile_borrows_the_most_alike_profile_s_list() {
    let c = GatewayCatalog::default();
    let of = |caps: Value| Profile::of(&json!({"capabilities": caps}));
    let plain = of(json!({}));
    let sampling = of(json!({"sampling": {}}));
    c.store("e", generation(1), &plain, ListKind::Tools, Arc::new(vec![json!({"name": "echo"})]));
    c.store(
        "e",
        generation(1),
        &sampling,
        ListKind::Tools,
        Arc::new(vec![json!({"name": "echo"}), json!({"name": "trigger-sampling"})]),
    );
    let rich = of(json!({"sampling": {}, "roots": {"listChanged": true}, "elicitation": {}}));
    let Known::Shared { items, warming: false } = c.lookup("e", generation(1), &rich, ListKind::Tools) else {
        panic!("shared")
    };
    assert_eq!(items.len(), 2, "the sampling client's list is the most alike");
    let roots = of(json!({"roots": {}}));
    let Known::Shared { items, .. } = c.lookup("e", generation(1), &roots, ListKind::Tools) else { panic!("shared") };
    assert_eq!(items.len(), 1, "a client without sampling gets the plain list");
    assert!(c.begin_warm("e", generation(1), &rich));
    assert!(matches!(c.lookup("e", generation(1), &rich, ListKind::Tools), Known::Shared { warming: true, .. }));
    assert!(
        matches!(c.lookup("e", generation(2), &rich, ListKind::Tools), Known::Pending { .. }),
        "never another generation's list"
    );
    assert!(
        matches!(c.lookup("e", generation(1), &rich, ListKind::Prompts), Known::Pending { .. }),
        "nor another kind's"
    );
}
