//! The `Changes` service: the change stream (`changes`). [`crate::db::Db::write`] inserts the
//! rows a write job pushes and broadcasts them after the commit; this module reads the backlog
//! and serves `Head` and `WatchChanges`.
use std::pin::Pin;

use coffer_proto::store::changes_server::Changes;
use coffer_proto::store::*;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::db::{ChangeRec, Db, StoreError};

/// Change rows with `seq > from`, oldest first, at most `limit`.
///
/// # Errors
/// [`StoreError::Sql`] when the read fails.
pub async fn since(db: &Db, from: u64, limit: u32) -> Result<Vec<ChangeRec>, StoreError> {
    db.read(move |c| {
        let mut st =
            c.prepare_cached("SELECT seq, entity, key, op FROM changes WHERE seq > ?1 ORDER BY seq LIMIT ?2")?;
        let rows = st.query_map((from as i64, limit), |r| {
            Ok(ChangeRec {
                seq: r.get::<_, i64>(0)? as u64,
                // Rows are written from the enums, so every word parses.
                entity: ChangeEntity::parse(&r.get::<_, String>(1)?).unwrap_or_default(),
                key: r.get(2)?,
                op: ChangeOp::parse(&r.get::<_, String>(3)?).unwrap_or_default(),
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    })
    .await
}

fn to_proto(c: ChangeRec) -> Change {
    Change { seq: c.seq, entity: c.entity.into(), key: c.key, op: c.op.into() }
}

type ChangeStream = Pin<Box<dyn Stream<Item = Result<Change, Status>> + Send>>;

/// The `Changes` gRPC service.
pub struct ChangesService {
    db: Db,
}

impl ChangesService {
    /// The service over `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }
}

#[tonic::async_trait]
impl Changes for ChangesService {
    async fn head(&self, _: Request<HeadRequest>) -> Result<Response<HeadReply>, Status> {
        Ok(Response::new(HeadReply { seq: self.db.head() }))
    }

    type WatchChangesStream = ChangeStream;

    async fn watch_changes(&self, req: Request<WatchChangesRequest>) -> Result<Response<ChangeStream>, Status> {
        let mut last = req.into_inner().from_seq;
        // Subscribe before reading the backlog so nothing falls between the two.
        let mut live = self.db.subscribe();
        let db = self.db.clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Change, Status>>(256);
        tokio::spawn(async move {
            loop {
                match since(&db, last, 1000).await {
                    Ok(batch) if batch.is_empty() => break,
                    Ok(batch) => {
                        for c in batch {
                            last = c.seq;
                            if tx.send(Ok(to_proto(c))).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e.into())).await;
                        return;
                    }
                }
            }
            loop {
                match live.recv().await {
                    Ok(c) if c.seq <= last => {}
                    Ok(c) => {
                        last = c.seq;
                        if tx.send(Ok(to_proto(c))).await.is_err() {
                            return;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        let _ = tx
                            .send(Err(Status::data_loss(format!(
                                "watcher lagged by {n} changes; reload and watch again"
                            ))))
                            .await;
                        return;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }
}
