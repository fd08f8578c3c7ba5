//! The registry client against a fake registry on loopback (axum) serving documented
//! `server.json` entries and hostile answers; planning installs from them.
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path as AxPath, Query, State};
use axum::http::StatusCode as AxStatus;
use axum::response::{IntoResponse, Response as AxResponse};
use secrecy::ExposeSecret;
use serde_json::{Value, json};

use super::*;

/// An entry in the shape of the registry's `with-package.json`/`with-remote.json` examples.
fn entry() -> Value {
    json!({
        "server": {
            "$schema": "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json",
            "name": "io.github.example/weather-mcp",
            "title": "Weather",
            "description": "Forecasts",
            "version": "1.2.3",
            "repository": {"url": "https://github.com/example/weather", "source": "github"},
            "packages": [
                {
                    "registryType": "pypi", "identifier": "weather-mcp", "version": "1.2.3",
                    "runtimeHint": "uvx", "transport": {"type": "stdio"}
                },
                {
                    "registryType": "npm", "identifier": "@example/weather-mcp", "version": "1.2.3",
                    "runtimeHint": "npx", "transport": {"type": "stdio"},
                    "packageArguments": [
                        {"type": "named", "name": "--units", "default": "metric", "choices": ["metric", "imperial"]},
                        {"type": "positional", "valueHint": "city", "isRequired": true}
                    ],
                    "environmentVariables": [
                        {"name": "WEATHER_API_KEY", "isRequired": true, "isSecret": true, "description": "API key"},
                        {"name": "LOG_LEVEL", "value": "info"}
                    ]
                },
                {
                    "registryType": "oci", "identifier": "docker.io/example/weather", "version": "1.2.3",
                    "transport": {"type": "stdio"},
                    "environmentVariables": [{"name": "WEATHER_API_KEY", "isRequired": true, "isSecret": true}]
                }
            ],
            "remotes": [
                {
                    "type": "streamable-http", "url": "https://{region}.weather.example/mcp",
                    "variables": {"region": {"default": "eu", "choices": ["eu", "us"]}},
                    "headers": [{
                        "name": "Authorization", "value": "Bearer {token}", "isSecret": true,
                        "variables": {"token": {"isRequired": true, "isSecret": true}}
                    }]
                },
                {"type": "sse", "url": "https://weather.example/sse"}
            ]
        },
        "_meta": {"io.modelcontextprotocol.registry/official": {"status": "active", "isLatest": true}}
    })
}

#[derive(Default)]
struct Fake {
    /// What `/v0.1/servers` answers (status, body).
    list: Mutex<Option<(u16, String)>>,
    /// Queries seen.
    queries: Mutex<Vec<String>>,
}

async fn list(State(f): State<Arc<Fake>>, uri: axum::http::Uri) -> AxResponse {
    f.queries.lock().unwrap().push(uri.query().unwrap_or_default().to_owned());
    let (status, body) =
        f.list.lock().unwrap().clone().unwrap_or((
            200,
            json!({"servers": [entry()], "metadata": {"count": 1, "nextCursor": "next-1"}}).to_string(),
        ));
    (AxStatus::from_u16(status).unwrap(), [("content-type", "application/json")], body).into_response()
}

async fn version(AxPath((name, version)): AxPath<(String, String)>, _q: Query<Vec<(String, String)>>) -> AxResponse {
    if name == "io.github.example/weather-mcp" && version == "latest" {
        return ([("content-type", "application/json")], entry().to_string()).into_response();
    }
    (AxStatus::NOT_FOUND, json!({"error": "Server not found"}).to_string()).into_response()
}

async fn fake() -> (Arc<Fake>, RegistryClient) {
    let f = Arc::new(Fake::default());
    let app = Router::new()
        .route("/v0.1/servers", axum::routing::get(list))
        .route("/v0.1/servers/{name}/versions/{version}", axum::routing::get(version))
        .with_state(f.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (f, RegistryClient::new(&base).unwrap())
}

fn npx_only(p: &str) -> Option<PathBuf> {
    (p == "npx").then(|| PathBuf::from("/usr/bin/npx"))
}

fn everything(p: &str) -> Option<PathBuf> {
    Some(PathBuf::from(format!("/usr/bin/{p}")))
}

fn parse(v: Value) -> ServerResponse {
    serde_json::from_value(v).unwrap()
}

fn values(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn invalid(r: Result<Planned, RegistryError>) -> String {
    match r {
        Err(RegistryError::Invalid(m)) => m,
        Err(e) => panic!("expected Invalid, got {e:?}"),
        Ok(p) => panic!("expected an error, got a plan for {:?}", p.server),
    }
}

#[tokio::test]
async fn search_and_fetch_a_documented_entry() {
    let (f, client) = fake().await;
    let page = client.search("weather", 10, None).await.unwrap();
    assert_eq!(page.next_cursor.as_deref(), Some("next-1"));
    assert_eq!(f.queries.lock().unwrap()[0], "search=weather&version=latest&limit=10");
    let view = describe_entry(&page.items[0], &npx_only);
    assert_eq!(view.name, "io.github.example/weather-mcp");
    assert_eq!(view.suggested_name, "weather");
    assert_eq!(view.status.as_deref(), Some("active"));
    assert_eq!(view.repository_url.as_deref(), Some("https://github.com/example/weather"));
    let ids: Vec<(&str, bool)> = view.options.iter().map(|o| (o.id.as_str(), o.runnable)).collect();
    assert_eq!(
        ids,
        [("package:0", false), ("package:1", true), ("package:2", false), ("remote:0", true), ("remote:1", true)]
    );
    assert_eq!(view.options[0].reason.as_deref(), Some("uvx is not on the PATH"));
    assert_eq!(view.options[2].reason.as_deref(), Some("docker or podman is not on the PATH"));
    assert_eq!(view.chosen.as_deref(), Some("package:1"));
    let inputs: Vec<(&str, &str, bool, bool)> =
        view.options[1].inputs.iter().map(|i| (i.name.as_str(), i.kind.as_str(), i.required, i.secret)).collect();
    assert_eq!(
        inputs,
        [
            ("WEATHER_API_KEY", "env", true, true),
            ("units", "argument", false, false),
            ("city", "argument", true, false)
        ]
    );
    let remote: Vec<(&str, &str, bool)> =
        view.options[3].inputs.iter().map(|i| (i.name.as_str(), i.kind.as_str(), i.secret)).collect();
    assert_eq!(remote, [("region", "url_variable", false), ("token", "header", true)]);

    let one = client.server("io.github.example/weather-mcp", None).await.unwrap();
    assert_eq!(one.server.version, "1.2.3");
    match client.server("io.github.example/nothing", None).await {
        Err(RegistryError::NotFound(m)) => assert!(m.ends_with("has no server \"io.github.example/nothing\""), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn malformed_oversized_and_failing_answers_are_named() {
    let (f, client) = fake().await;
    let mut bad = entry();
    bad["server"]["packages"][1]["identifier"] = json!(5);
    *f.list.lock().unwrap() = Some((200, json!({"servers": [bad]}).to_string()));
    match client.search("x", 5, None).await {
        Err(RegistryError::Malformed(m)) => {
            assert!(m.contains("did not answer a server list: servers[0].server.packages[1].identifier: invalid type: integer `5`, expected a string"), "{m}")
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    // A web page where the list should be: no registry there.
    *f.list.lock().unwrap() = Some((200, "<html>nope</html>".into()));
    match client.search("x", 5, None).await {
        Err(RegistryError::Unavailable(m)) => assert!(
            m.ends_with(
                "is not an MCP registry: its server list (GET /v0.1/servers) answered something that is not JSON; \
                 check the setting gateway.mcp_registry_url"
            ),
            "{m}"
        ),
        other => panic!("{:?}", other.map(|_| ())),
    }
    *f.list.lock().unwrap() = Some((200, format!("{{\"servers\": [], \"pad\": \"{}\"}}", "x".repeat(MAX_ANSWER))));
    match client.search("x", 5, None).await {
        Err(RegistryError::Malformed(m)) => assert!(m.ends_with("sent an answer larger than 4 MiB"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    *f.list.lock().unwrap() = Some((503, "down".into()));
    match client.search("x", 5, None).await {
        Err(RegistryError::Unavailable(m)) => assert!(m.ends_with("answered HTTP 503 Service Unavailable"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let mut many = entry();
    many["server"]["remotes"] = Value::Array(vec![json!({"type": "sse", "url": "http://a/sse"}); MAX_ITEMS + 1]);
    *f.list.lock().unwrap() = Some((200, json!({"servers": [many]}).to_string()));
    assert!(matches!(client.search("x", 5, None).await, Err(RegistryError::Malformed(_))));

    // Nothing listens here.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let gone = RegistryClient::new(&format!("http://user:pw@127.0.0.1:{port}/?k=secret")).unwrap();
    match gone.search("x", 5, None).await {
        Err(RegistryError::Unavailable(m)) => {
            assert!(m.starts_with(&format!("the registry at http://127.0.0.1:{port} could not be reached")), "{m}");
            assert!(!m.contains("pw") && !m.contains("secret"), "{m}");
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert!(matches!(RegistryClient::new("ftp://x"), Err(RegistryError::Invalid(_))));
}

#[tokio::test]
async fn a_url_that_is_no_registry_is_named_so_and_a_missing_server_only_by_a_registry() {
    // A registry: a server it lacks is "no server".
    let (_f, client) = fake().await;
    match client.server("io.github.example/nothing", None).await {
        Err(RegistryError::NotFound(m)) => assert!(m.ends_with("has no server \"io.github.example/nothing\""), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    // A web server that answers 404 to everything (a URL that is not a registry).
    let app = Router::new().fallback(|| async { (AxStatus::NOT_FOUND, "Not Found") });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let web = RegistryClient::new(&base).unwrap();
    for r in [web.search("x", 5, None).await.map(|_| ()), web.server("foo", None).await.map(|_| ())] {
        match r {
            Err(RegistryError::Unavailable(m)) => assert_eq!(
                m,
                format!(
                    "{base} is not an MCP registry: its server list (GET /v0.1/servers) answered 404; check the setting gateway.mcp_registry_url"
                )
            ),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn an_npm_package_becomes_a_stdio_registration_with_its_secret_a_credential() {
    let e = parse(entry());
    let missing = invalid(plan(&e, "weather", None, &values(&[]), &npx_only));
    assert_eq!(missing, "io.github.example/weather-mcp needs a value for WEATHER_API_KEY, city");
    let p = plan(&e, "weather", None, &values(&[("WEATHER_API_KEY", "sk-weather-1"), ("city", "Oslo")]), &npx_only)
        .unwrap();
    assert_eq!(p.option.id, "package:1");
    assert_eq!(p.server.transport(), Transport::Stdio);
    assert_eq!(p.server.command, "npx");
    assert_eq!(p.server.args, ["-y", "@example/weather-mcp@1.2.3", "--units", "metric", "Oslo"]);
    assert_eq!(p.server.env["WEATHER_API_KEY"], "coffer-credential-ref:weather.WEATHER_API_KEY");
    assert_eq!(p.server.env["LOG_LEVEL"], "info");
    assert_eq!(p.credentials.len(), 1);
    assert_eq!(p.credentials[0].0, "weather.WEATHER_API_KEY");
    assert_eq!(p.credentials[0].1.expose_secret(), "sk-weather-1");
    assert!(!format!("{:?}", p.server).contains("sk-weather-1"));

    let bad_choice = invalid(plan(
        &e,
        "weather",
        None,
        &values(&[("WEATHER_API_KEY", "k"), ("city", "Oslo"), ("units", "kelvin")]),
        &npx_only,
    ));
    assert_eq!(bad_choice, "input units must be one of: metric, imperial");
    let unknown = invalid(plan(&e, "weather", None, &values(&[("NOPE", "1")]), &npx_only));
    assert!(
        unknown.starts_with("package:1 takes no input \"NOPE\" (it takes: WEATHER_API_KEY, units, city)"),
        "{unknown}"
    );
    let not_here = invalid(plan(&e, "weather", Some("package:0"), &values(&[]), &npx_only));
    assert_eq!(not_here, "package:0 of io.github.example/weather-mcp cannot be installed: uvx is not on the PATH");
}

#[test]
fn pypi_oci_and_remotes_plan_as_documented() {
    let e = parse(entry());
    let p = plan(&e, "w", Some("package:0"), &values(&[]), &everything).unwrap();
    assert_eq!((p.server.command.as_str(), p.server.args.clone()), ("uvx", vec!["weather-mcp==1.2.3".to_owned()]));
    let p = plan(&e, "w", Some("package:2"), &values(&[("WEATHER_API_KEY", "k")]), &everything).unwrap();
    assert_eq!(p.server.command, "docker");
    assert_eq!(p.server.args, ["run", "-i", "--rm", "-e", "WEATHER_API_KEY", "docker.io/example/weather:1.2.3"]);

    let missing = invalid(plan(&e, "w", Some("remote:0"), &values(&[]), &everything));
    assert_eq!(missing, "io.github.example/weather-mcp needs a value for token");
    let p = plan(&e, "w", Some("remote:0"), &values(&[("token", "tok-1"), ("region", "us")]), &everything).unwrap();
    assert_eq!(p.server.transport(), Transport::Http);
    assert_eq!(p.server.url, "https://us.weather.example/mcp");
    assert_eq!(p.server.headers["Authorization"], "coffer-credential-ref:w.Authorization");
    assert_eq!(p.credentials[0].1.expose_secret(), "Bearer tok-1");
    let p = plan(&e, "w", Some("remote:1"), &values(&[]), &everything).unwrap();
    assert_eq!((p.server.transport(), p.server.url.as_str()), (Transport::Sse, "https://weather.example/sse"));
    assert_eq!(
        invalid(plan(&e, "w", Some("remote:9"), &values(&[]), &everything)),
        "io.github.example/weather-mcp has no option \"remote:9\""
    );
}

#[test]
fn hostile_package_names_versions_and_variables_are_refused_clearly() {
    for (field, value, why) in [
        ("identifier", "weather; rm -rf ~", "package name \"weather; rm -rf ~\" is not a valid npm name"),
        ("identifier", "--registry=http://evil", "package name \"--registry=http://evil\" is not a valid npm name"),
        ("identifier", "$(curl evil)", "is not a valid npm name"),
        ("version", "1.0 && curl evil", "package version \"1.0 && curl evil\" is not a version"),
        ("version", "-1", "is not a version"),
    ] {
        let mut v = entry();
        v["server"]["packages"][1][field] = json!(value);
        let e = parse(v);
        let view = describe_entry(&e, &npx_only);
        assert!(!view.options[1].runnable, "{value}");
        let m = invalid(plan(&e, "w", Some("package:1"), &values(&[]), &npx_only));
        assert!(m.contains(why), "{value}: {m}");
    }
    let mut v = entry();
    v["server"]["packages"][1]["environmentVariables"][0]["name"] = json!("PATH=/evil;x");
    let m = invalid(plan(&parse(v), "w", Some("package:1"), &values(&[]), &npx_only));
    assert!(m.contains("environment variable name \"PATH=/evil;x\" is not valid"), "{m}");
    let mut v = entry();
    v["server"]["packages"][1]["packageArguments"][0]["isSecret"] = json!(true);
    let m = invalid(plan(
        &parse(v),
        "w",
        Some("package:1"),
        &values(&[("WEATHER_API_KEY", "k"), ("city", "x")]),
        &npx_only,
    ));
    assert!(m.starts_with("argument units is a secret"), "{m}");
    let m = invalid(plan(&parse(entry()), "w", Some("remote:0"), &values(&[("token", "a\r\nX-Evil: 1")]), &everything));
    assert_eq!(m, "the value of input token has a control character");
}

#[test]
fn suggested_names_fit_coffer() {
    for (name, want) in [
        ("io.github.example/weather-mcp", "weather"),
        ("io.modelcontextprotocol/server-everything", "everything"),
        ("com.example/mcp-server-GitHub_Tools", "github-tools"),
        ("a/coffer", "server"),
        ("a/---", "server"),
        ("x/a-very-long-name-that-goes-on-and-on", "a-very-long-name-that-go"),
    ] {
        assert_eq!(suggested_name(name), want, "{name}");
    }
    assert_eq!(credential_name("w", "Authorization"), "w.Authorization");
    assert_eq!(credential_name("w", "x y/z"), "w.x-y-z");
}
