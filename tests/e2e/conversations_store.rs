//! The store's `Conversations` service through the real `coffer-store` of a running daemon, as
//! `coffer-chat` calls it (with chat's own internal token): a conversation with a 1 MiB message,
//! a pending queue and reserved event numbers survive a daemon restart; hostile input gets an
//! INVALID_ARGUMENT naming the field and changes nothing; a `StartTurn` repeated after a SIGKILL
//! of the store finds the turn it committed and writes nothing twice; the gateway and retrieval
//! are refused every method.
use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_proto::store::conversations_client::ConversationsClient;
use coffer_proto::store::*;
use coffer_runtime::grpc::AuthChannel;
use coffer_tests::{Api, TestHome, procs};
use secrecy::SecretString;

/// The largest reply the chat service must accept from the store (one message may be 8 MiB).
const MAX_REPLY: usize = 16 * 1024 * 1024;

/// The environment the supervisor gave service `name` (read from `/proc`).
async fn service_env(api: &Api, name: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let pid = api.service(name).await?["pid"].as_i64().context("pid")? as i32;
    let env = procs::environ(pid);
    ensure!(!env.is_empty(), "cannot read the environment of {name} (pid {pid})");
    Ok(env)
}

/// A Conversations client to the daemon's store as service `name`.
async fn client(api: &Api, name: &str) -> anyhow::Result<ConversationsClient<AuthChannel>> {
    let env = service_env(api, name).await?;
    let token = SecretString::from(env.get("COFFER_INTERNAL_TOKEN").context("COFFER_INTERNAL_TOKEN")?.clone());
    let addr = env.get("COFFER_STORE_ADDR").context("COFFER_STORE_ADDR")?;
    Ok(ConversationsClient::new(coffer_runtime::grpc::channel(addr, &token)?).max_decoding_message_size(MAX_REPLY))
}

fn id(n: u128) -> String {
    ulid::Ulid((1_764_000_000_000u128 << 80) | n).to_string()
}

fn text(t: &str) -> ContentBlockRecord {
    ContentBlockRecord { block: Some(content_block_record::Block::Text(t.into())) }
}

fn message(n: u128, role: MessageRole, status: MessageStatus, blocks: Vec<ContentBlockRecord>) -> MessageRecord {
    MessageRecord {
        id: id(n),
        conversation_id: id(1),
        role: role.into(),
        status: status.into(),
        blocks,
        source: "cli".into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_keeps_conversations_in_the_store_across_a_restart_and_the_gateway_is_refused() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let mut chat = client(&api, "chat").await?;

    let created = chat
        .create_conversation(CreateConversationRequest {
            conversation: Some(ConversationRecord {
                id: id(1),
                agent_key: "claude_code".into(),
                title: "Tidy the notes folder".into(),
                agent_config_json: r#"{"cwd":"/tmp","model":"","session_id":""}"#.into(),
                ..Default::default()
            }),
        })
        .await?
        .into_inner();
    assert_eq!((created.version, created.message_count), (1, 0));
    let big = "é".repeat(512 * 1024);
    chat.append_message(message(2, MessageRole::User, MessageStatus::Complete, vec![text(&big)])).await?;
    chat.append_message(message(3, MessageRole::Assistant, MessageStatus::Streaming, vec![text("Half")])).await?;
    let queue = SetPendingRequest {
        conversation_id: id(1),
        items: vec![
            PendingItemRecord { id: id(10), text: "next".into(), source: "web".into(), ..Default::default() },
            PendingItemRecord { id: id(11), text: "after that".into(), source: "cli".into(), ..Default::default() },
        ],
        paused: false,
    };
    chat.set_pending(queue).await?;
    let first = chat.reserve_event_seq(ReserveEventSeqRequest { conversation_id: id(1), count: 100 }).await?;
    assert_eq!(first.into_inner().first, 1);

    // Hostile input over the wire: refused naming the field, nothing written.
    let e =
        chat.get_conversation(ConversationRef { id: "../../coffer.db".into() }).await.expect_err("a path is not an id");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().starts_with("id \"../../coffer.db\" is not a ULID"), "{}", e.message());
    let over = "x".repeat(9 * 1024 * 1024);
    let e = chat
        .append_message(message(4, MessageRole::User, MessageStatus::Complete, vec![text(&over)]))
        .await
        .expect_err("9 MiB is over the limit");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("more than 8388608 bytes"), "{}", e.message());
    let huge = "x".repeat(17 * 1024 * 1024);
    let e = chat
        .append_message(message(5, MessageRole::User, MessageStatus::Complete, vec![text(&huge)]))
        .await
        .expect_err("17 MiB is over the store's decoding limit");
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{e:?}");
    assert!(e.message().contains("the limit is: 16777216 bytes"), "{}", e.message());
    let e = chat
        .update_conversation(UpdateConversationRequest {
            id: id(1),
            expected_version: Some(7),
            title: Some("lost".into()),
            ..Default::default()
        })
        .await
        .expect_err("stale version");
    assert_eq!(e.code(), tonic::Code::Aborted, "{e:?}");
    let c = chat.get_conversation(ConversationRef { id: id(1) }).await?.into_inner();
    assert_eq!((c.title.as_str(), c.version, c.message_count), ("Tidy the notes folder", 1, 2));

    // Nobody but chat: not the gateway (it goes through coffer-chat), not retrieval.
    for caller in ["gateway", "retrieval"] {
        let mut other = client(&api, caller).await?;
        let e = other.list_conversations(ListConversationsRequest::default()).await.expect_err("refused");
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert_eq!(e.message(), format!("{caller} may not call /coffer.store.v1.Conversations/ListConversations"));
        let e = other.delete_conversation(ConversationRef { id: id(1) }).await.expect_err("refused");
        assert_eq!(e.message(), format!("{caller} may not call /coffer.store.v1.Conversations/DeleteConversation"));
    }

    // A daemon restart: every service gets new tokens; the conversation is all there.
    home.terminate_daemon(Duration::from_secs(30)).await?;
    let api = home.start_daemon().await?;
    let mut chat = client(&api, "chat").await?;
    let c = chat.get_conversation(ConversationRef { id: id(1) }).await?.into_inner();
    assert_eq!((c.title.as_str(), c.message_count, c.agent_key.as_str()), ("Tidy the notes folder", 2, "claude_code"));
    let found = chat
        .list_conversations(ListConversationsRequest { title_contains: "NOTES".into(), ..Default::default() })
        .await?
        .into_inner();
    assert_eq!(found.conversations.iter().map(|c| c.id.clone()).collect::<Vec<_>>(), [id(1)]);
    // The turn that was streaming when the daemon stopped is failed once chat calls this at
    // start (coffer-chat may already have).
    chat.fail_streaming_messages(FailStreamingMessagesRequest {}).await?;
    let page = chat.list_messages(ListMessagesRequest { conversation_id: id(1), ..Default::default() }).await?;
    let messages = page.into_inner().messages;
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0].blocks, vec![text(&big)], "the 1 MiB message is whole");
    assert_eq!((messages[1].status(), messages[1].blocks.clone()), (MessageStatus::Failed, vec![text("Half")]));
    let pending = chat.get_pending(ConversationRef { id: id(1) }).await?.into_inner();
    assert_eq!(pending.items.iter().map(|i| i.text.as_str()).collect::<Vec<_>>(), ["next", "after that"]);
    let next = chat.reserve_event_seq(ReserveEventSeqRequest { conversation_id: id(1), count: 10 }).await?;
    assert_eq!(next.into_inner().first, 101, "event numbers never go backwards");

    // A queued item starts its turn in one transaction; the store is killed right after it
    // committed (the reply could have been lost): the same request again changes nothing.
    let start = StartTurnRequest {
        user: Some(MessageRecord {
            id: id(10),
            ..message(0, MessageRole::User, MessageStatus::Complete, vec![text("next")])
        }),
        assistant: Some(message(12, MessageRole::Assistant, MessageStatus::Streaming, vec![])),
        pending_item_id: id(10),
    };
    let first = chat.start_turn(start.clone()).await?.into_inner();
    assert!(!first.already);
    let store = api.service("store").await?["pid"].as_i64().context("pid")? as i32;
    procs::signal(store, nix::sys::signal::Signal::SIGKILL);
    let again = coffer_tests::wait_for("StartTurn again after the store restarted", Duration::from_secs(20), || {
        let (mut chat, start) = (chat.clone(), start.clone());
        async move { Ok(Some(chat.start_turn(start).await?.into_inner())) }
    })
    .await?;
    assert!(again.already, "the retry found the committed turn");
    assert_eq!((again.user, again.assistant), (first.user, first.assistant));
    let messages = chat.list_messages(ListMessagesRequest { conversation_id: id(1), ..Default::default() }).await?;
    assert_eq!(messages.into_inner().messages.len(), 4, "two messages each, once");
    let pending = chat.get_pending(ConversationRef { id: id(1) }).await?.into_inner();
    assert_eq!(pending.items.iter().map(|i| i.text.as_str()).collect::<Vec<_>>(), ["after that"]);
    let e = chat
        .set_pending(SetPendingRequest {
            conversation_id: id(1),
            items: vec![PendingItemRecord { id: id(10), text: "next".into(), ..Default::default() }],
            paused: true,
        })
        .await
        .expect_err("an item that started is not queued again");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");

    let removed = chat.delete_conversation(ConversationRef { id: id(1) }).await?.into_inner().removed;
    assert_eq!(removed, 1);
    let e = chat.get_pending(ConversationRef { id: id(1) }).await.expect_err("gone");
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let queues = chat.list_pending_queues(ListPendingQueuesRequest {}).await?.into_inner().queues;
    assert!(queues.is_empty(), "{queues:?}");
    home.terminate_daemon(Duration::from_secs(30)).await?;
    Ok(())
}
