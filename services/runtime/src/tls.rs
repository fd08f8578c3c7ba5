//! TLS for outgoing HTTPS (remote Streamable HTTP upstreams): rustls with the `ring` crypto
//! provider, installed once per process. Every `reqwest::Client` in Coffer is built after
//! [`ensure_provider`] (reqwest builds its rustls configuration at client construction and
//! panics without a provider).
use std::sync::Once;

static INSTALL: Once = Once::new();

/// Installs the `ring` provider as the process default, once. Safe to call from anywhere, any
/// number of times.
pub fn ensure_provider() {
    INSTALL.call_once(|| {
        // Err means another provider was installed first, which is just as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
