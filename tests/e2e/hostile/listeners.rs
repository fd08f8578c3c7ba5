//! Another uid tries to exhaust the daemon's listeners (issue 32 part 3): thousands of idle
//! connections, a slowloris and oversized request heads on the edge's TCP port and on an
//! internal gRPC port. The owner, holding the token, is answered throughout over TCP and the
//! Unix socket (which another uid cannot even open), and the gateway's memory stays bounded.
use coffer_tests::TestHome;
use coffer_tests::attack::{Attack, Mode, Target, gateway_pid, internal_port, owner_is_served, rss_kib};

/// 4,000 idle connections to the edge and 1,000 to the store's gRPC port, from another uid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_from_another_uid_does_not_lock_out_the_owner() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let socket = home.root().join("gateway.sock");
    let gw = gateway_pid(&home)?;
    let store = internal_port(&home, "STORE")?;
    let before = rss_kib(gw);
    // Both floods at once.
    let (edge_port, store_port) = (Target::Tcp(api.port()), Target::Tcp(store));
    let (edge, grpc) = tokio::try_join!(
        Attack::start(Mode::Flood, &edge_port, 4_000, 15, true),
        Attack::start(Mode::Flood, &store_port, 1_000, 15, true)
    )?;
    // Well beyond the cap of 1,024 even on a loaded machine (the attacker stops opening at its
    // deadline).
    assert!(edge.ready().opened >= 2_000, "the flood opened {:?}", edge.ready());
    for _ in 0..5 {
        // `/v1/status` reaches the store over gRPC: its listener serves its own callers too.
        owner_is_served(&api, Some(&socket)).await?;
    }
    let during = rss_kib(gw);
    // Held while the owner was served; the closes the caps made are all counted by now.
    let (edge, grpc) = (edge.stop().await?, grpc.stop().await?);
    eprintln!("flood: edge {edge:?}, grpc {grpc:?}; gateway RSS {before} -> {during} KiB");
    // All but the cap's worth were closed to make room (plus the owner's own connections).
    assert!(edge.closed + 1_100 >= edge.opened, "the edge's cap closed the oldest idle connections: {edge:?}");
    assert!(
        grpc.closed + 300 >= grpc.opened,
        "the store's cap closed the oldest unauthenticated connections: {grpc:?}"
    );
    assert!(during.saturating_sub(before) < 64 * 1024, "gateway RSS {before} -> {during} KiB");
    owner_is_served(&api, Some(&socket)).await?;
    Ok(())
}

/// A slowloris from another uid (heads trickled a line a second; the HTTP/2 preface a byte a
/// second on gRPC) is disconnected after the head timeout, and the owner is served. The timeout
/// is `limits::HEAD_TIMEOUT_MS` here (10 s by default), on the edge and on gRPC alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_from_another_uid_is_disconnected() -> anyhow::Result<()> {
    let home = TestHome::builder().env("COFFER_HEAD_TIMEOUT_MS", crate::limits::HEAD_TIMEOUT_MS.to_string()).build()?;
    let api = home.start_daemon().await?;
    let socket = home.root().join("gateway.sock");
    let store = internal_port(&home, "STORE")?;
    let (edge_port, store_port) = (Target::Tcp(api.port()), Target::Tcp(store));
    let (edge, grpc) = tokio::try_join!(
        Attack::start(Mode::Slowloris, &edge_port, 800, 16, true),
        Attack::start(Mode::SlowlorisH2, &store_port, 200, 16, true)
    )?;
    for _ in 0..5 {
        owner_is_served(&api, Some(&socket)).await?;
    }
    let (edge, grpc) = (edge.finish().await?, grpc.finish().await?);
    assert!(edge.closed >= edge.opened * 9 / 10, "slow heads on the edge were closed: {edge:?}");
    assert!(grpc.closed >= grpc.opened * 9 / 10, "slow prefaces on gRPC were closed: {grpc:?}");
    owner_is_served(&api, Some(&socket)).await?;
    Ok(())
}

/// 500 connections from another uid each sending a 300 KB request head (once: +260 MB, never
/// given back) are answered 431 at 64 KiB; the gateway grows little and gives it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_from_another_uid_keep_memory_bounded() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let gw = gateway_pid(&home)?;
    owner_is_served(&api, None).await?;
    let before = rss_kib(gw);
    let big = Attack::start(Mode::BigHead { kib: 300 }, &Target::Tcp(api.port()), 500, 10, true).await?;
    owner_is_served(&api, None).await?;
    let during = rss_kib(gw);
    let report = big.finish().await?;
    let after = rss_kib(gw);
    eprintln!("oversized heads: {report:?}; gateway RSS {before} / {during} / {after} KiB");
    assert!(report.closed >= 450, "{report:?}");
    assert!(during.saturating_sub(before) < 64 * 1024, "gateway RSS {before} -> {during} KiB");
    assert!(after.saturating_sub(before) < 48 * 1024, "gateway RSS {before} -> {after} KiB after the attack");
    owner_is_served(&api, None).await?;
    Ok(())
}

/// Another uid cannot even connect to the edge's socket (0600 in the 0700 home).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_uid_cannot_open_the_socket() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let _api = home.start_daemon().await?;
    let socket = home.root().join("gateway.sock");
    let err = Attack::start(Mode::Flood, &Target::Unix(socket), 10, 1, true).await?.finish().await?;
    assert_eq!(err.opened, 0, "{err:?}");
    assert_eq!(err.failed, 10, "{err:?}");
    Ok(())
}
