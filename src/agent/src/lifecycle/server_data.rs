//! Per-server data (Klavis `POST/GET /local-sandbox/{server}/{id}/
//! initialize|dump`) of a leased server: the sandbox's mail service for a
//! server with `mail = true`, else the server's `data_command`, run with
//! the lease's environment for it (its credentials). Both run under the
//! operation lock, so a Release waits for them.

use std::sync::Arc;
use std::time::Duration;

use super::{LcError, Lifecycle};
use crate::mail::Mail;
use crate::server_data::{DataTool, Load};

enum Provider {
    Mail(Arc<Mail>),
    Tool(DataTool),
}

impl Lifecycle {
    /// Loads `what` into the data of leased server `server`.
    pub async fn load_server_data(&self, server: &str, what: Load<'_>) -> Result<String, LcError> {
        let _op = self.op.lock().await;
        match self.data_of(server)? {
            Provider::Mail(m) => Ok(m.load(what).await?),
            Provider::Tool(t) => t.load(what).await.map_err(|source| LcError::Data {
                server: server.into(),
                source,
            }),
        }
    }

    /// The data of leased server `server`, as JSON.
    pub async fn dump_server_data(&self, server: &str) -> Result<Vec<u8>, LcError> {
        let _op = self.op.lock().await;
        match self.data_of(server)? {
            Provider::Mail(m) => Ok(m.dump().await?),
            Provider::Tool(t) => t.dump().await.map_err(|source| LcError::Data {
                server: server.into(),
                source,
            }),
        }
    }

    fn data_of(&self, server: &str) -> Result<Provider, LcError> {
        let def = self
            .manifest
            .get(server)
            .ok_or_else(|| super::acquire::unknown_servers(&self.manifest, vec![server.into()]))?;
        if !def.mail && def.data_command.is_none() {
            return Err(LcError::NoServerData {
                server: server.into(),
            });
        }
        let cur = self.current();
        let lease = cur
            .as_ref()
            .map(|c| c.lease.servers.clone())
            .unwrap_or_default();
        let spec = cur
            .as_ref()
            .filter(|_| lease.iter().any(|n| n == server))
            .and_then(|c| c.specs.iter().find(|s| s.name == server));
        let not_in_lease = || LcError::NotInLease {
            server: server.into(),
            lease: lease.clone(),
        };
        let Some(spec) = spec else {
            return Err(not_in_lease());
        };
        if def.mail {
            // A server with its own mail account (auth_data) has no data here.
            return match (&self.mail, cur.as_ref().is_some_and(|c| c.mail.is_some())) {
                (Some(m), true) => Ok(Provider::Mail(m.clone())),
                _ => Err(not_in_lease()),
            };
        }
        let command = def.data_command.clone().unwrap_or_default();
        Ok(Provider::Tool(DataTool {
            sup: self.sup.clone(),
            command,
            base_args: Vec::new(),
            env: spec.env.clone(),
            parent: std::env::temp_dir(),
            owner: None,
            timeout: Duration::from_millis(self.cfg.server_data_timeout_ms),
            max_bytes: self.cfg.server_data_max_bytes,
        }))
    }
}
