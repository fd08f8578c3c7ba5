//! The web console's wire vocabulary, shared by the edge (which serves `/ui`) and the CLI
//! (`coffer ui --page`).

/// The console's pages, in navigation order: `/ui/<page>` serves the console at that page, and
/// only `/ui/<page>` for one of these is accepted as the login's `next=` (no open redirect).
pub const PAGES: &[&str] = &["chat", "servers", "tools", "activity", "knowledge", "settings"];

/// The page a login lands on when it names none.
pub const DEFAULT_PAGE: &str = "chat";

/// `/ui/<page>` when `path` is exactly that for a known page (the only accepted `next=`).
pub fn page_of_path(path: &str) -> Option<&'static str> {
    let name = path.strip_prefix("/ui/")?;
    PAGES.iter().copied().find(|p| *p == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_known_page_path_is_a_page() {
        assert_eq!(page_of_path("/ui/servers"), Some("servers"));
        assert_eq!(page_of_path("/ui/chat"), Some("chat"));
        for bad in [
            "",
            "/ui",
            "/ui/",
            "/ui/nope",
            "//evil.com",
            "https://evil.com/ui/chat",
            "/ui/chat/",
            "/ui/chat?x=1",
            "/ui//chat",
            "/UI/chat",
            "/ui/Chat",
            "/ui/chat#x",
            "\\ui\\chat",
            "/ui/../v1/status",
        ] {
            assert_eq!(page_of_path(bad), None, "{bad:?}");
        }
    }
}
