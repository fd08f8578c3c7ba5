//! Credential values for an upstream start, behind one seam: the gateway core asks a
//! [`CredentialResolver`] for the values of the credentials a server references, right before
//! it starts that server's upstream. In the daemon that is the store ([`StoreResolver`], which
//! decrypts them); tests give fixed values ([`FixedCredentials`]).
use std::collections::HashMap;

use coffer_proto::store::credentials_client::CredentialsClient;
use coffer_proto::store::{DeleteCredentialRequest, ResolveCredentialsRequest, SetCredentialRequest};
use coffer_runtime::grpc::AuthChannel;
use futures_util::future::BoxFuture;
use secrecy::{ExposeSecret, SecretString};

/// Where credential values come from.
pub trait CredentialResolver: Send + Sync {
    /// The values of credentials `names`, by name. A name the result lacks is reported by the
    /// caller as not found.
    ///
    /// # Errors
    /// A message naming the credential that cannot be read, or why none can (never a value).
    fn resolve(&self, names: Vec<String>) -> BoxFuture<'_, Result<HashMap<String, SecretString>, String>>;

    /// Stores `value` under credential `name` (the gateway's own credentials: an upstream's
    /// OAuth grant, see `upstream::http::oauth`).
    ///
    /// # Errors
    /// Why it could not be stored (never the value).
    fn store(&self, name: String, value: SecretString) -> BoxFuture<'_, Result<(), String>>;

    /// Deletes credential `name`; deleting one that does not exist succeeds.
    ///
    /// # Errors
    /// Why it could not be deleted.
    fn remove(&self, name: String) -> BoxFuture<'_, Result<(), String>>;
}

/// The actor the gateway's own credential writes are audited as.
pub const GATEWAY_ACTOR: &str = "gateway:oauth";

/// Credentials from the store (`ResolveCredentials`, decrypted there; only the gateway may ask).
pub struct StoreResolver(CredentialsClient<AuthChannel>);

impl StoreResolver {
    /// A resolver that asks the store through `store`.
    pub fn new(store: CredentialsClient<AuthChannel>) -> Self {
        Self(store)
    }
}

impl CredentialResolver for StoreResolver {
    fn resolve(&self, names: Vec<String>) -> BoxFuture<'_, Result<HashMap<String, SecretString>, String>> {
        Box::pin(async move {
            let reply = self.0.clone().resolve_credentials(ResolveCredentialsRequest { names }).await.map_err(|s| {
                match s.code() {
                    tonic::Code::NotFound | tonic::Code::FailedPrecondition | tonic::Code::InvalidArgument => {
                        s.message().to_owned()
                    }
                    _ => format!("cannot resolve its credentials: the store is unavailable ({})", s.code()),
                }
            })?;
            Ok(reply.into_inner().values.into_iter().map(|(k, v)| (k, SecretString::from(v))).collect())
        })
    }

    fn store(&self, name: String, value: SecretString) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let req = SetCredentialRequest {
                name,
                value: value.expose_secret().to_owned(),
                actor: GATEWAY_ACTOR.into(),
                create_only: false,
            };
            self.0.clone().set_credential(req).await.map(|_| ()).map_err(|s| store_error(&s))
        })
    }

    fn remove(&self, name: String) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let req = DeleteCredentialRequest { name, actor: GATEWAY_ACTOR.into() };
            match self.0.clone().delete_credential(req).await {
                Ok(_) => Ok(()),
                Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
                Err(s) => Err(store_error(&s)),
            }
        })
    }
}

/// A store refusal as a message (its own words for what the caller can act on).
fn store_error(s: &tonic::Status) -> String {
    match s.code() {
        tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => s.message().to_owned(),
        code => format!("the store is unavailable ({code})"),
    }
}

/// Fixed credential values held in memory (tests; a credential it lacks is not found). What is
/// stored through it is kept in memory too.
#[derive(Default)]
pub struct FixedCredentials(pub HashMap<String, SecretString>, pub std::sync::Mutex<HashMap<String, SecretString>>);

impl FixedCredentials {
    /// Fixed `values`, nothing stored yet.
    pub fn new(values: HashMap<String, SecretString>) -> Self {
        Self(values, std::sync::Mutex::default())
    }
}

impl CredentialResolver for FixedCredentials {
    fn resolve(&self, names: Vec<String>) -> BoxFuture<'_, Result<HashMap<String, SecretString>, String>> {
        let stored = self.1.lock().expect("stored");
        let found = names
            .into_iter()
            .filter_map(|n| Some((n.clone(), stored.get(&n).or_else(|| self.0.get(&n))?.clone())))
            .collect();
        Box::pin(async move { Ok(found) })
    }

    fn store(&self, name: String, value: SecretString) -> BoxFuture<'_, Result<(), String>> {
        self.1.lock().expect("stored").insert(name, value);
        Box::pin(async { Ok(()) })
    }

    fn remove(&self, name: String) -> BoxFuture<'_, Result<(), String>> {
        self.1.lock().expect("stored").remove(&name);
        Box::pin(async { Ok(()) })
    }
}
