//! Internal identities on the real daemon: every service has its own per-run token (in its
//! environment only), a wrong or missing token is refused, a known service calling a method it
//! may not gets a refusal naming it, and on-demand services start and stop through the control
//! RPC (on `coffer-test-daemon`, where `retrieval` is marked on demand).
use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_proto::control::control_client::ControlClient;
use coffer_proto::control::{StartServiceRequest, StatusRequest, StopServiceRequest};
use coffer_proto::store::credentials_client::CredentialsClient;
use coffer_proto::store::{DeleteCredentialRequest, ResolveCredentialsRequest};
use coffer_tests::{Api, TestHome, procs, wait_for};
use secrecy::SecretString;

/// The environment the supervisor gave service `name` (read from `/proc`).
async fn service_env(api: &Api, name: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let pid = api.service(name).await?["pid"].as_i64().context("pid")? as i32;
    let env = procs::environ(pid);
    ensure!(!env.is_empty(), "cannot read the environment of {name} (pid {pid})");
    Ok(env)
}

fn token(env: &BTreeMap<String, String>) -> anyhow::Result<SecretString> {
    Ok(SecretString::from(env.get("COFFER_INTERNAL_TOKEN").context("COFFER_INTERNAL_TOKEN")?.clone()))
}

fn channel(addr: &str, token: &SecretString) -> anyhow::Result<coffer_runtime::grpc::AuthChannel> {
    Ok(coffer_runtime::grpc::channel(addr, token)?)
}

#[tokio::test]
async fn a_wrong_or_missing_internal_token_is_refused() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let mut envs = BTreeMap::new();
    for name in ["store", "retrieval", "chat", "gateway"] {
        envs.insert(name, service_env(&api, name).await?);
    }
    // One token per service, each only in its own environment (the others hold digests).
    let tokens: BTreeMap<_, _> = envs.iter().map(|(n, e)| (*n, e["COFFER_INTERNAL_TOKEN"].clone())).collect();
    for (name, t) in &tokens {
        ensure!(t.len() == 64, "{name}'s token is 64 hex characters");
        for (other, env) in &envs {
            if other != name {
                ensure!(env.values().all(|v| !v.contains(t.as_str())), "{other}'s environment holds {name}'s token");
            }
        }
    }
    let gateway = &envs["gateway"];
    let store_addr = gateway.get("COFFER_STORE_ADDR").context("COFFER_STORE_ADDR")?;
    let control_addr = gateway.get("COFFER_CONTROL_ADDR").context("COFFER_CONTROL_ADDR")?;

    // Missing and wrong tokens, on the store and on the supervisor's control RPC.
    let bare = tonic::transport::Endpoint::from_shared(format!("http://{store_addr}"))?.connect_lazy();
    let e = CredentialsClient::new(bare).resolve_credentials(ResolveCredentialsRequest::default()).await.unwrap_err();
    assert_eq!((e.code(), e.message()), (tonic::Code::Unauthenticated, "missing or wrong internal token"));
    let stranger = coffer_runtime::token::random_token();
    let e = CredentialsClient::new(channel(store_addr, &stranger)?)
        .resolve_credentials(ResolveCredentialsRequest::default())
        .await
        .unwrap_err();
    assert_eq!((e.code(), e.message()), (tonic::Code::Unauthenticated, "missing or wrong internal token"));
    let e = ControlClient::new(channel(control_addr, &stranger)?).status(StatusRequest {}).await.unwrap_err();
    assert_eq!((e.code(), e.message()), (tonic::Code::Unauthenticated, "missing or wrong internal token"));
    assert!(!coffer_runtime::grpc::check_health(store_addr, &stranger).await, "not even health");

    // Retrieval's own token is valid: it may resolve credential values (the embeddings
    // endpoint's key), but not write credentials. Chat resolves them too (LLM connections' keys)
    // and reads LLM connections, but may not write them; retrieval may not read them.
    let retrieval = token(&envs["retrieval"])?;
    CredentialsClient::new(channel(store_addr, &retrieval)?)
        .resolve_credentials(ResolveCredentialsRequest::default())
        .await?;
    let e = CredentialsClient::new(channel(store_addr, &retrieval)?)
        .delete_credential(DeleteCredentialRequest { name: "x".into(), actor: String::new() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert_eq!(e.message(), "retrieval may not call /coffer.store.v1.Credentials/DeleteCredential");
    let chat = token(&envs["chat"])?;
    CredentialsClient::new(channel(store_addr, &chat)?)
        .resolve_credentials(ResolveCredentialsRequest::default())
        .await?;
    {
        use coffer_proto::store::llm_connections_client::LlmConnectionsClient;
        use coffer_proto::store::{CreateConnectionRequest, ListConnectionsRequest};
        LlmConnectionsClient::new(channel(store_addr, &chat)?).list_connections(ListConnectionsRequest {}).await?;
        let e = LlmConnectionsClient::new(channel(store_addr, &chat)?)
            .create_connection(CreateConnectionRequest::default())
            .await
            .unwrap_err();
        assert_eq!(e.message(), "chat may not call /coffer.store.v1.LlmConnections/CreateConnection");
        let e = LlmConnectionsClient::new(channel(store_addr, &retrieval)?)
            .list_connections(ListConnectionsRequest {})
            .await
            .unwrap_err();
        assert_eq!(e.message(), "retrieval may not call /coffer.store.v1.LlmConnections/ListConnections");
    }
    assert!(coffer_runtime::grpc::check_health(store_addr, &retrieval).await, "health is for every service");
    // The gateway's is allowed; the daemon is untouched by all of the above.
    CredentialsClient::new(channel(store_addr, &token(gateway)?)?)
        .resolve_credentials(ResolveCredentialsRequest::default())
        .await?;
    assert_eq!(api.service("store").await?["state"], "healthy");
    Ok(())
}

#[tokio::test]
async fn an_on_demand_service_starts_and_stops_through_the_control_rpc() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon_binary("coffer-test-daemon").await?;
    let s = api.service("retrieval").await?;
    assert_eq!((s["state"].as_str(), s["pid"].as_i64()), (Some("stopped"), Some(0)), "{s}");
    ensure!(!home.processes().iter().any(|p| p.name == "coffer-retrieval"), "no retrieval process yet");

    let gateway = service_env(&api, "gateway").await?;
    let control_addr = gateway.get("COFFER_CONTROL_ADDR").context("COFFER_CONTROL_ADDR")?;
    let mut control = ControlClient::new(channel(control_addr, &token(&gateway)?)?);
    let e = ControlClient::new(channel(control_addr, &token(&service_env(&api, "chat").await?)?)?)
        .status(StatusRequest {})
        .await
        .map(|_| ());
    assert!(e.is_ok(), "chat may read status: {e:?}");
    let e = ControlClient::new(channel(control_addr, &coffer_runtime::token::random_token())?)
        .start_service(StartServiceRequest { name: "retrieval".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!((e.code(), e.message()), (tonic::Code::Unauthenticated, "missing or wrong internal token"));
    let e = control.stop_service(StopServiceRequest { name: "store".into() }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");

    let started = control
        .start_service(StartServiceRequest { name: "retrieval".into(), ..Default::default() })
        .await?
        .into_inner();
    let started = started.service.context("service")?;
    assert_eq!((started.state.as_str(), started.on_demand), ("healthy", true), "{started:?}");
    let pid = started.pid as i32;
    let proc = procs::proc_info(pid).context("the started retrieval process")?;
    assert_eq!(proc.name, "coffer-retrieval");
    assert_eq!(api.service("retrieval").await?["state"], "healthy", "REST status shows it");
    // Once running, it has an identity like any service: its token works on the store.
    let store_addr = gateway.get("COFFER_STORE_ADDR").context("COFFER_STORE_ADDR")?;
    assert!(coffer_runtime::grpc::check_health(store_addr, &token(&procs::environ(pid))?).await);

    let stopped = control.stop_service(StopServiceRequest { name: "retrieval".into() }).await?.into_inner();
    assert_eq!(stopped.service.context("service")?.state, "stopped");
    wait_for("the stopped retrieval to exit", Duration::from_secs(10), || async {
        Ok((!procs::still_alive(&proc)).then_some(()))
    })
    .await?;
    let s = api.service("retrieval").await?;
    assert_eq!((s["state"].as_str(), s["pid"].as_i64()), (Some("stopped"), Some(0)), "{s}");

    // Started again, then the daemon's shutdown stops it with everything else.
    control.start_service(StartServiceRequest { name: "retrieval".into(), ..Default::default() }).await?;
    let daemon = home.daemon_processes().first().cloned().context("the test daemon")?;
    procs::signal(daemon.pid, nix::sys::signal::Signal::SIGTERM);
    wait_for("every process of the home to exit", Duration::from_secs(20), || async {
        Ok(home.processes().is_empty().then_some(()))
    })
    .await?;
    ensure!(!home.daemon_json_path().exists(), "daemon.json removed at shutdown");
    Ok(())
}
