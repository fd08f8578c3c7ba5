//! Waiting for a condition with a deadline: poll a probe (health check, file, predicate) with a
//! short, growing interval. Never sleep for a fixed time to wait for readiness.
use std::future::Future;
use std::time::{Duration, Instant};

/// First poll interval; doubles up to [`POLL_MAX`].
const POLL_START: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(50);

/// An error that ends [`wait_for`] at once instead of being retried (e.g. "the daemon exited").
#[derive(Debug)]
pub struct Abort(pub String);

impl std::fmt::Display for Abort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Abort {}

/// Builds an error that makes [`wait_for`] give up immediately.
pub fn abort(msg: impl Into<String>) -> anyhow::Error {
    Abort(msg.into()).into()
}

/// Polls `probe` until it returns `Ok(Some(v))`, then returns `v`.
///
/// `Ok(None)` means "not yet"; `Err(e)` also means "not yet" (transient, e.g. connection
/// refused) and is kept for the timeout message, unless it is an [`abort`] error, which is
/// returned at once.
///
/// # Errors
/// On an [`abort`] error, or when `timeout` passes: the message names `what`, the timeout and
/// the last transient error.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut delay = POLL_START;
    let mut last: Option<anyhow::Error> = None;
    loop {
        match probe().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) if e.is::<Abort>() => return Err(e.context(format!("while waiting for {what}"))),
            Err(e) => last = Some(e),
        }
        if Instant::now() >= deadline {
            let why = last.map(|e| format!(" (last error: {e:#})")).unwrap_or_default();
            anyhow::bail!("timed out after {timeout:?} waiting for {what}{why}");
        }
        tokio::time::sleep(delay.min(deadline.saturating_duration_since(Instant::now()))).await;
        delay = (delay * 2).min(POLL_MAX);
    }
}

/// Blocking form of [`wait_for`] for a predicate, for `Drop` and other synchronous code.
/// Returns whether `pred` became true before `timeout`.
pub fn wait_until_blocking(timeout: Duration, mut pred: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    let mut delay = POLL_START;
    loop {
        if pred() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(POLL_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn polls_until_ready_retrying_errors_but_not_aborts() {
        let mut n = 0;
        let v = wait_for("n to reach 3", Duration::from_secs(5), || {
            n += 1;
            let n = n;
            async move {
                match n {
                    1 => anyhow::bail!("transient"),
                    2 => Ok(None),
                    _ => Ok(Some(n)),
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(v, 3);

        let e =
            wait_for::<(), _, _>("never", Duration::from_secs(5), || async { Err(abort("gone")) }).await.unwrap_err();
        assert!(format!("{e:#}").contains("gone"), "{e:#}");

        let e = wait_for::<(), _, _>("never", Duration::from_millis(30), || async { anyhow::bail!("still down") })
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("timed out") && e.contains("still down"), "{e}");
    }
}
