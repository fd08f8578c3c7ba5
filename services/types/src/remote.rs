//! Reaching the web console from other devices (opt-in): the values of the settings
//! `ui.allowed_hosts` (extra origins the edge answers for `/ui` and the API the console uses)
//! and `ui.bind` (an address beyond loopback the edge also listens on), parsed once here for the
//! edge, the CLI (`coffer ui --host`, `coffer doctor`) and the settings check.
//!
//! An allowed host is an **origin** as a browser writes it: `https://box.tail1234.ts.net`,
//! `http://100.101.102.103:8443`, `http://localhost:9000` (scheme, host, optional port; no
//! path, query, fragment or user). The scheme says how the browser reaches it (a proxy that
//! terminates TLS in front of the edge for `https`), so the edge can check `Origin` exactly and
//! mark the session cookie `Secure` without trusting a header a client could send.
use std::net::{IpAddr, SocketAddr};

/// Most entries in `ui.allowed_hosts`.
pub const MAX_ALLOWED_HOSTS: usize = 16;

/// One entry of `ui.allowed_hosts`: an origin the console may be opened at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedOrigin {
    /// `true` for `https://` (the browser reaches it over TLS, ended by a proxy in front).
    pub https: bool,
    /// The host, lowercase, ASCII (an IDN in its `xn--` form), an IPv6 address in brackets.
    pub host: String,
    /// The port the browser connects to (the scheme's default when none was written).
    pub port: u16,
}

impl AllowedOrigin {
    /// The origin as a browser serializes it in `Origin` (the default port left out):
    /// `https://box.tail1234.ts.net`, `http://box:8443`.
    pub fn origin(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        if self.port == self.default_port() {
            format!("{scheme}://{}", self.host)
        } else {
            format!("{scheme}://{}:{}", self.host, self.port)
        }
    }

    fn default_port(&self) -> u16 {
        if self.https { 443 } else { 80 }
    }

    /// True when a request's `Host` value (`box.ts.net`, `box.ts.net:443`, `BOX.ts.net`) names
    /// this origin's host and port: an absent port is the scheme's default. Exact otherwise (no
    /// suffix or wildcard match, no trailing dot).
    pub fn matches_host(&self, host_header: &str) -> bool {
        let (name, port) = split_host_port(host_header);
        let port = match port {
            None => Some(self.default_port()),
            Some(p) => p.parse::<u16>().ok(),
        };
        port == Some(self.port) && name.eq_ignore_ascii_case(&self.host)
    }

    /// True when `origin` (an `Origin` header value) is exactly this origin (ASCII case
    /// ignored; `:443` on https and `:80` on http accepted as the default port).
    pub fn matches_origin(&self, origin: &str) -> bool {
        let Some((scheme, rest)) = origin.split_once("://") else { return false };
        let https = match scheme.to_ascii_lowercase().as_str() {
            "https" => true,
            "http" => false,
            _ => return false,
        };
        https == self.https && !rest.contains('/') && self.matches_host(rest)
    }

    /// True when the host is `localhost` or a loopback address (`127.0.0.0/8`, `[::1]`): such
    /// an entry is reached on the browser's own machine (through a tunnel, `ssh -L 9000:…`).
    pub fn is_loopback_name(&self) -> bool {
        self.host == "localhost"
            || self
                .host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }
}

/// `host[:port]` → (`host`, `port`), an IPv6 literal kept in its brackets; a bare IPv6 address
/// (no brackets) is all host.
fn split_host_port(s: &str) -> (&str, Option<&str>) {
    match s.rsplit_once(':') {
        Some((n, _)) if !n.ends_with(']') && n.contains(':') => (s, None),
        Some((n, p)) => (n, Some(p)),
        None => (s, None),
    }
}

/// Parses `ui.allowed_hosts`: origins separated by commas and/or whitespace; empty is none.
///
/// # Errors
/// A message naming the first entry that is not an `http://` or `https://` origin with a host
/// (a path, query, fragment, user or wildcard is refused), or more than [`MAX_ALLOWED_HOSTS`].
pub fn parse_allowed_hosts(value: &str) -> Result<Vec<AllowedOrigin>, String> {
    let mut out: Vec<AllowedOrigin> = Vec::new();
    for entry in value.split(|c: char| c == ',' || c.is_whitespace()).filter(|e| !e.is_empty()) {
        let o = parse_origin(entry)?;
        if !out.contains(&o) {
            out.push(o);
        }
    }
    if out.len() > MAX_ALLOWED_HOSTS {
        return Err(format!("at most {MAX_ALLOWED_HOSTS} hosts; got {}", out.len()));
    }
    Ok(out)
}

/// One origin of `ui.allowed_hosts` (see [`parse_allowed_hosts`]).
fn parse_origin(entry: &str) -> Result<AllowedOrigin, String> {
    let shown: String = entry.chars().take(64).collect();
    let bad = |why: &str| format!("{shown:?} {why}; write an origin such as https://box.tail1234.ts.net");
    if entry.contains('*') {
        return Err(bad("has a wildcard: name each host"));
    }
    let Some((scheme, _)) = entry.split_once("://") else { return Err(bad("has no http:// or https://")) };
    let u = url::Url::parse(entry).map_err(|e| bad(&format!("is not a URL ({e})")))?;
    let https = match u.scheme() {
        "https" => true,
        "http" => false,
        _ => return Err(bad(&format!("has scheme {scheme:?}, not http or https"))),
    };
    if !u.username().is_empty() || u.password().is_some() {
        return Err(bad("has a user name or password"));
    }
    if u.path() != "/" || u.query().is_some() || u.fragment().is_some() {
        return Err(bad("has a path, query or fragment"));
    }
    let host = match u.host() {
        Some(url::Host::Domain(d)) if !d.is_empty() && !d.ends_with('.') => d.to_ascii_lowercase(),
        Some(url::Host::Ipv4(a)) => a.to_string(),
        Some(url::Host::Ipv6(a)) => format!("[{a}]"),
        _ => return Err(bad("has no usable host name")),
    };
    let port = u.port_or_known_default().ok_or_else(|| bad("has no port"))?;
    Ok(AllowedOrigin { https, host, port })
}

/// Parses `ui.bind`: empty (loopback only, the default) or `IP:PORT` (`100.101.102.103:8443`,
/// `0.0.0.0:8443`, `[fd7a:115c::1]:8443`) with a port other than 0.
///
/// # Errors
/// A message saying what is wrong (a host name instead of an address, no port, port 0).
pub fn parse_bind(value: &str) -> Result<Option<SocketAddr>, String> {
    let v = value.trim();
    if v.is_empty() {
        return Ok(None);
    }
    let shown: String = v.chars().take(64).collect();
    let addr: SocketAddr = v.parse().map_err(|_| {
        if v.parse::<IpAddr>().is_ok() {
            format!("{shown:?} has no port: write ADDRESS:PORT, such as 100.101.102.103:8443")
        } else {
            format!("{shown:?} is not ADDRESS:PORT with an IP address, such as 100.101.102.103:8443 or 0.0.0.0:8443")
        }
    })?;
    if addr.port() == 0 {
        return Err(format!("{shown:?}: the port must not be 0"));
    }
    Ok(Some(addr))
}

/// True when `addr` listens on every interface (`0.0.0.0`, `[::]`): reachable from every
/// network the machine is on, not just a tailnet or VPN.
pub fn binds_everywhere(addr: &SocketAddr) -> bool {
    addr.ip().is_unspecified()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_parse_and_match_exactly() {
        let hosts = parse_allowed_hosts(" https://Box.Tail1234.ts.net, http://100.64.1.2:8443\nhttp://localhost:9000 ")
            .unwrap();
        assert_eq!(hosts.len(), 3);
        assert_eq!(hosts[0].origin(), "https://box.tail1234.ts.net");
        assert_eq!(hosts[1].origin(), "http://100.64.1.2:8443");
        assert!(hosts[2].is_loopback_name());
        assert!(!hosts[0].is_loopback_name() && !hosts[1].is_loopback_name());
        for lo in ["http://127.0.0.2:1", "http://[::1]:1"] {
            assert!(parse_allowed_hosts(lo).unwrap()[0].is_loopback_name(), "{lo}");
        }
        let ts = &hosts[0];
        for ok in ["box.tail1234.ts.net", "BOX.tail1234.ts.net:443"] {
            assert!(ts.matches_host(ok), "{ok}");
        }
        for bad in [
            "box.tail1234.ts.net:80",
            "box.tail1234.ts.net.",
            "evil.box.tail1234.ts.net",
            "box.tail1234.ts.net.evil.com",
            "box.tail1234.ts.net:443x",
            "",
        ] {
            assert!(!ts.matches_host(bad), "{bad}");
        }
        assert!(ts.matches_origin("https://box.tail1234.ts.net"));
        assert!(ts.matches_origin("https://box.tail1234.ts.net:443"));
        for bad in [
            "http://box.tail1234.ts.net",
            "https://box.tail1234.ts.net:8443",
            "https://box.tail1234.ts.net/",
            "https://box.tail1234.ts.net.evil.com",
            "null",
            "https://evil.com",
        ] {
            assert!(!ts.matches_origin(bad), "{bad}");
        }
        assert!(hosts[1].matches_host("100.64.1.2:8443") && !hosts[1].matches_host("100.64.1.2"));
        let v6 = parse_allowed_hosts("http://[FD7A:115C::1]:8443").unwrap();
        assert!(v6[0].matches_host("[fd7a:115c::1]:8443"), "{v6:?}");
        assert_eq!(parse_allowed_hosts("").unwrap(), vec![]);
        assert_eq!(parse_allowed_hosts("https://a.example, https://a.example").unwrap().len(), 1);
    }

    #[test]
    fn bad_origins_are_refused_with_a_reason() {
        for (bad, says) in [
            ("box.ts.net", "no http"),
            ("ftp://box.ts.net", "scheme"),
            ("https://*.ts.net", "wildcard"),
            ("https://box.ts.net/ui", "path"),
            ("https://box.ts.net?x", "query"),
            ("https://box.ts.net#x", "fragment"),
            ("https://me@box.ts.net", "user"),
            ("https://box.ts.net.", "host"),
        ] {
            let e = parse_allowed_hosts(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let many = (0..=MAX_ALLOWED_HOSTS).map(|i| format!("https://h{i}.example")).collect::<Vec<_>>().join(",");
        assert!(parse_allowed_hosts(&many).unwrap_err().contains("at most"));
    }

    #[test]
    fn bind_addresses() {
        assert_eq!(parse_bind("").unwrap(), None);
        assert_eq!(parse_bind(" 100.64.1.2:8443 ").unwrap(), Some("100.64.1.2:8443".parse().unwrap()));
        assert!(binds_everywhere(&parse_bind("0.0.0.0:8443").unwrap().unwrap()));
        assert!(!binds_everywhere(&parse_bind("[fd7a::1]:8443").unwrap().unwrap()));
        assert!(parse_bind("100.64.1.2").unwrap_err().contains("no port"));
        assert!(parse_bind("box.ts.net:8443").unwrap_err().contains("IP address"));
        assert!(parse_bind("100.64.1.2:0").unwrap_err().contains("not be 0"));
    }
}
