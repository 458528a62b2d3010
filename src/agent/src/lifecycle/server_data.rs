//! Per-server data (Klavis `POST/GET /local-sandbox/{server}/{id}/
//! initialize|dump`) of a leased server: the sandbox's mail service for a
//! server with `mail = true`, else the server's `data_command`, run with
//! the lease's environment for it (its credentials). Both run under the
//! operation lock, so a Release waits for them.
//!
//! Through the operator's outside account, which every lease shares, the
//! data tool records what a load creates in the lease's ledger
//! (`<ledgers>/<server>.json`, written by the tool, atomically), a dump
//! shows only that, and Release and Reset have the tool delete it before
//! the ledger goes. Through the lease's own account (its auth_data), the
//! whole account is the lease's: nothing is recorded or deleted.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::{LcError, Lifecycle, Outside};
use crate::mail::Mail;
use crate::server_data::{DataError, DataTool, Load};
use crate::supervisor::job::RunAs;
use crate::supervisor::manifest::DataUser;

enum Provider {
    Mail(Arc<Mail>),
    Tool(DataTool),
}

impl Lifecycle {
    /// Loads `what` into the data of leased server `server`, for a request
    /// admitted under `lease` (`""`: the current one).
    pub async fn load_server_data(
        &self,
        lease: &str,
        server: &str,
        what: Load<'_>,
    ) -> Result<String, LcError> {
        let _op = self.op.lock().await;
        self.check_lease(lease)?;
        match self.data_of(server)? {
            Provider::Mail(m) => Ok(m.load(what).await?),
            Provider::Tool(t) => {
                let r = async {
                    if t.ledger.is_some() {
                        self.ledger_dir().await?;
                    }
                    t.load(what).await
                };
                r.await.map_err(|source| LcError::Data {
                    server: server.into(),
                    source,
                })
            }
        }
    }

    /// The data of leased server `server`, as JSON, for a request admitted
    /// under `lease` (`""`: the current one).
    pub async fn dump_server_data(&self, lease: &str, server: &str) -> Result<Vec<u8>, LcError> {
        let _op = self.op.lock().await;
        self.check_lease(lease)?;
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
        // Unknown is shared: only a lease that brought its credentials
        // sees a whole account.
        let own = cur
            .as_ref()
            .and_then(|c| c.outside.get(server))
            .is_some_and(|o| o.own);
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
        let mut tool = self.tool(command, spec.env.clone(), server, own);
        if def.data_user == DataUser::Tenant {
            tool.run_as = RunAs::Tenant;
        }
        Ok(Provider::Tool(tool))
    }

    fn tool(
        &self,
        command: String,
        env: BTreeMap<String, String>,
        server: &str,
        own: bool,
    ) -> DataTool {
        DataTool {
            sup: self.sup.clone(),
            command,
            base_args: Vec::new(),
            env,
            parent: std::env::temp_dir(),
            run_as: RunAs::Service,
            timeout: Duration::from_millis(self.cfg.server_data_timeout_ms),
            max_bytes: self.cfg.server_data_max_bytes,
            ledger: (!own).then(|| self.ledger(server)),
        }
    }

    /// The lease's ledger of what `server`'s tool created through the
    /// shared account.
    fn ledger(&self, server: &str) -> PathBuf {
        self.ledgers.join(format!("{server}.json"))
    }

    /// Makes the ledgers' directory, private to the agent.
    async fn ledger_dir(&self) -> Result<(), DataError> {
        use std::os::unix::fs::PermissionsExt;
        let dir = &self.ledgers;
        let what = || format!("making {}", dir.display());
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(crate::server_data::io(what()))?;
        tokio::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .await
            .map_err(crate::server_data::io(what()))?;
        // The data tools (the service user) write it; the tenant cannot.
        match self.sup.tenant().service() {
            Some((u, g)) => std::os::unix::fs::chown(dir, Some(u), Some(g))
                .map_err(crate::server_data::io(what())),
            None => Ok(()),
        }
    }

    /// Has each data tool delete, in the outside service, what the lease
    /// created there through the shared account, then drops the ledgers.
    /// Never fails: what could not be deleted is logged with the tool's
    /// message (which names it) and returned, one line per server.
    pub(super) async fn clean_outside(&self, outside: &BTreeMap<String, Outside>) -> Vec<String> {
        let mut failed = Vec::new();
        for (server, o) in outside.iter().filter(|(_, o)| !o.own) {
            let ledger = self.ledger(server);
            if !tokio::fs::try_exists(&ledger).await.unwrap_or(true) {
                continue; // nothing was loaded
            }
            let Some(command) = self
                .manifest
                .get(server)
                .and_then(|d| d.data_command.clone())
            else {
                continue;
            };
            let tool = self.tool(command, o.env.clone(), server, false);
            match tool.cleanup().await {
                Ok(summary) => {
                    info!(server, %summary, "deleted what the lease created in its outside service")
                }
                Err(e) => {
                    let left = tokio::fs::read_to_string(&ledger).await.unwrap_or_default();
                    warn!(server, error = %e, ledger = %left.trim(), "could not delete what the lease created in its outside service; it stays there");
                    failed.push(format!("{server}: {e}"));
                }
            }
        }
        self.drop_ledgers().await;
        failed
    }

    /// Ledgers no lease owns (an agent that stopped before its Release):
    /// logged with what they hold, which stays in the outside service, and
    /// dropped, so that no new lease sees it.
    pub(super) async fn forget_ledgers(&self) {
        let Ok(mut dir) = tokio::fs::read_dir(&self.ledgers).await else {
            return;
        };
        while let Ok(Some(e)) = dir.next_entry().await {
            let left = tokio::fs::read_to_string(e.path())
                .await
                .unwrap_or_default();
            warn!(ledger = %e.path().display(), created = %left.trim(), "a ledger no lease released: what it records stays in the outside service");
        }
        self.drop_ledgers().await;
    }

    async fn drop_ledgers(&self) {
        let dir = self.ledgers.clone();
        match tokio::task::spawn_blocking(move || sandbox_tree::remove_path(&dir)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "could not remove the ledgers"),
            Err(e) => warn!(error = %e, "the task removing the ledgers failed"),
        }
    }
}
