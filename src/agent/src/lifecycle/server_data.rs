//! Per-server data (Klavis `POST/GET /local-sandbox/{server}/{id}/
//! initialize|dump`): only servers with `mail = true` have data here, kept
//! by the sandbox's mail service. Both run under the operation lock, so a
//! Release waits for them and never empties a mailbox mid-load.

use super::{LcError, Lifecycle};
use crate::mail::Load;

impl Lifecycle {
    /// Loads `what` into the data of leased server `server`.
    pub async fn load_server_data(&self, server: &str, what: Load<'_>) -> Result<String, LcError> {
        let _op = self.op.lock().await;
        let mail = self.data_of(server)?;
        Ok(mail.load(what).await?)
    }

    /// The data of leased server `server`, as JSON.
    pub async fn dump_server_data(&self, server: &str) -> Result<Vec<u8>, LcError> {
        let _op = self.op.lock().await;
        let mail = self.data_of(server)?;
        Ok(mail.dump().await?)
    }

    fn data_of(&self, server: &str) -> Result<std::sync::Arc<crate::mail::Mail>, LcError> {
        let def = self
            .manifest
            .get(server)
            .ok_or_else(|| super::acquire::unknown_servers(&self.manifest, vec![server.into()]))?;
        let (Some(mail), true) = (&self.mail, def.mail) else {
            return Err(LcError::NoServerData {
                server: server.into(),
                outside: !def.requires.is_empty(),
            });
        };
        let cur = self.current();
        let lease = cur
            .as_ref()
            .map(|c| c.lease.servers.clone())
            .unwrap_or_default();
        if !lease.iter().any(|n| n == server) || cur.as_ref().is_some_and(|c| c.mail.is_none()) {
            return Err(LcError::NotInLease {
                server: server.into(),
                lease,
            });
        }
        Ok(mail.clone())
    }
}
