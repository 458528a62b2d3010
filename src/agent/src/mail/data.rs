//! Loading and dumping the mailboxes in Klavis's `PosteEmailData` shape
//! (`{"users": {ADDRESS: {"emails": [...]}}}`) with the launcher's `load`
//! and `dump` (a [`DataTool`]) over IMAP: flags, folders and dates go
//! through Dovecot, so a dump shows what the loaded data and the tools
//! made of the mailboxes.

use super::{Mail, MailError};
use crate::server_data::{DataTool, Load};
use crate::supervisor::job::RunAs;

impl Mail {
    fn tool(&self) -> DataTool {
        DataTool {
            sup: self.sup.clone(),
            command: self.def.command.clone(),
            base_args: vec!["--dir".into(), self.def.dir.display().to_string()],
            env: super::base_env(),
            parent: self.def.dir.clone(),
            // It reads the lease's account in the service's own files.
            run_as: RunAs::Agent,
            timeout: self.def.op_timeout,
            max_bytes: self.def.max_data_bytes,
            // The lease's own mailboxes, emptied at Release.
            ledger: None,
        }
    }

    /// Loads mailboxes; returns the launcher's summary (`{"users": N,
    /// "emails": M}`). Bad data changes nothing (INVALID_ARGUMENT).
    pub async fn load(&self, what: Load<'_>) -> Result<String, MailError> {
        self.alive().await?;
        Ok(self.tool().load(what).await?)
    }

    /// Dumps every mailbox that holds mail, as PosteEmailData JSON.
    pub async fn dump(&self) -> Result<Vec<u8>, MailError> {
        self.alive().await?;
        Ok(self.tool().dump().await?)
    }
}
