//! Another uid tries to fill the disk through the daemon's logs (issue 32 part 4): 2,000
//! unauthenticated requests with 60 KB paths. Paths are clipped in log lines and refusals are
//! rate-limited, so the logs folder grows by less than 1 MB, and the daemon keeps answering.
use coffer_tests::TestHome;
use coffer_tests::attack::owner_is_served;

const SCRIPT: &str = r#"
import socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
path = "/v1/" + "x" * (60 * 1024)
codes = {}
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n" % (path, port)).encode())
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    code = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "none"
    codes[code] = codes.get(code, 0) + 1
print(" ".join("%s=%d" % kv for kv in sorted(codes.items())), flush=True)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_uid_cannot_fill_the_disk_with_logs() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let logs = home.logs_dir();
    let before = crate::limits::settled_size(&logs).await?;
    // The attacker runs as another uid, which the spawn helper does not offer.
    #[allow(clippy::disallowed_methods)]
    let mut cmd = std::process::Command::new("python3");
    cmd.args(["-c", SCRIPT, &api.port().to_string(), "2000"]);
    coffer_tests::hostile::as_other_user(&mut cmd);
    let out = tokio::time::timeout(std::time::Duration::from_secs(300), tokio::process::Command::from(cmd).output())
        .await??;
    let codes = String::from_utf8_lossy(&out.stdout);
    assert_eq!(codes.trim(), "401=2000", "{codes} {}", String::from_utf8_lossy(&out.stderr));
    owner_is_served(&api, Some(&home.root().join("gateway.sock"))).await?;
    let grown = crate::limits::settled_size(&logs).await?.saturating_sub(before);
    eprintln!("logs grew by {grown} bytes for 2,000 requests from another uid");
    assert!(grown < 1024 * 1024, "the logs grew by {grown} bytes");
    Ok(())
}
