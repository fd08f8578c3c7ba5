//! Credential values for an upstream start, behind one seam: the gateway core asks a
//! [`CredentialResolver`] for the values of the credentials a server references, right before
//! it starts that server's upstream. In the daemon that is the store ([`StoreResolver`], which
//! decrypts them); tests give fixed values ([`FixedCredentials`]).
use std::collections::HashMap;

use coffer_proto::store::ResolveCredentialsRequest;
use coffer_proto::store::credentials_client::CredentialsClient;
use coffer_runtime::grpc::AuthChannel;
use futures_util::future::BoxFuture;
use secrecy::SecretString;

/// Where credential values come from.
pub trait CredentialResolver: Send + Sync {
    /// The values of credentials `names`, by name. A name the result lacks is reported by the
    /// caller as not found.
    ///
    /// # Errors
    /// A message naming the credential that cannot be read, or why none can (never a value).
    fn resolve(&self, names: Vec<String>) -> BoxFuture<'_, Result<HashMap<String, SecretString>, String>>;
}

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
}

/// Fixed credential values held in memory (tests; a credential it lacks is not found).
#[derive(Default)]
pub struct FixedCredentials(pub HashMap<String, SecretString>);

impl CredentialResolver for FixedCredentials {
    fn resolve(&self, names: Vec<String>) -> BoxFuture<'_, Result<HashMap<String, SecretString>, String>> {
        let found = names.into_iter().filter_map(|n| Some((n.clone(), self.0.get(&n)?.clone()))).collect();
        Box::pin(async move { Ok(found) })
    }
}
