//! `[mail]`: the checked settings of the sandbox's mail service, with
//! their defaults and bounds. The service itself is [`crate::mail`].

use std::path::PathBuf;
use std::time::Duration;

use super::check::{EntryError, FieldError, abs_path, expand, field};
use super::schema::{MailFile, ManifestFile};

/// Toolathlon's mail domain and ports (its Poste.io server's).
pub const DEFAULT_DOMAIN: &str = "mcp.com";
pub const DEFAULT_IMAP_PORT: u16 = 1143;
pub const DEFAULT_SMTP_PORT: u16 = 1587;
pub const DEFAULT_ACCOUNT: &str = "sandbox";
pub const DEFAULT_READY_TIMEOUT_MS: u64 = 20_000;
pub const DEFAULT_OP_TIMEOUT_MS: u64 = 120_000;
pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 25 << 20;
pub const DEFAULT_MAX_DATA_BYTES: u64 = 16 << 20;
/// The most `max_data_bytes` may be: a dump travels in one gRPC message.
pub const MAX_DATA_BYTES_LIMIT: u64 = 256 << 20;

/// The checked `[mail]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailDef {
    pub command: String,
    pub domain: String,
    pub account: String,
    /// 0: a free loopback port at every start.
    pub imap_port: u16,
    pub smtp_port: u16,
    pub dir: PathBuf,
    pub ready_timeout: Duration,
    pub op_timeout: Duration,
    pub max_message_bytes: u64,
    pub max_data_bytes: u64,
}

fn dns_label_ok(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 63
        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !l.starts_with('-')
        && !l.ends_with('-')
}

/// A local part we can hand out and Dovecot accepts as a user name.
pub fn local_part_ok(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 64
        && l.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+'))
        && !l.starts_with('.')
        && !l.ends_with('.')
}

pub(super) fn check_mail(
    m: &MailFile,
    file: &ManifestFile,
    vars: &[(&str, &str)],
) -> Result<MailDef, FieldError> {
    if file.install_dir.is_none() && m.command.contains("${install_dir}") {
        return Err(field("command", EntryError::NoInstallDir));
    }
    let command = expand(&m.command, vars, "command")?;
    if command.trim().is_empty() {
        return Err(field("command", EntryError::Empty));
    }
    let domain = m
        .domain
        .clone()
        .unwrap_or_else(|| DEFAULT_DOMAIN.to_owned())
        .to_ascii_lowercase();
    if domain.len() > 253 || !domain.contains('.') || !domain.split('.').all(dns_label_ok) {
        return Err(field("domain", EntryError::BadMailName(domain)));
    }
    let account = m.account.clone().unwrap_or_else(|| DEFAULT_ACCOUNT.into());
    if !local_part_ok(&account) {
        return Err(field("account", EntryError::BadMailName(account)));
    }
    let dir = match &m.dir {
        Some(d) => abs_path(&expand(d, vars, "dir")?, "dir")?,
        None => {
            let state_root = vars
                .iter()
                .find(|(k, _)| *k == "state_root")
                .map_or("", |(_, v)| *v);
            PathBuf::from(state_root).join("mail")
        }
    };
    let ms = |v: Option<u64>, d: u64, f: &str| match v.unwrap_or(d) {
        0 => Err(field(f, EntryError::Zero)),
        n => Ok(Duration::from_millis(n)),
    };
    let max_data_bytes = m.max_data_bytes.unwrap_or(DEFAULT_MAX_DATA_BYTES);
    if max_data_bytes == 0 || max_data_bytes > MAX_DATA_BYTES_LIMIT {
        return Err(field(
            "max_data_bytes",
            EntryError::OutOfRange(format!("1..={MAX_DATA_BYTES_LIMIT}")),
        ));
    }
    let max_message_bytes = m.max_message_bytes.unwrap_or(DEFAULT_MAX_MESSAGE_BYTES);
    if max_message_bytes == 0 {
        return Err(field("max_message_bytes", EntryError::Zero));
    }
    let imap_port = m.imap_port.unwrap_or(DEFAULT_IMAP_PORT);
    let smtp_port = m.smtp_port.unwrap_or(DEFAULT_SMTP_PORT);
    if imap_port != 0 && imap_port == smtp_port {
        return Err(field(
            "smtp_port",
            EntryError::OutOfRange("a port other than imap_port".into()),
        ));
    }
    Ok(MailDef {
        command,
        domain,
        account,
        imap_port,
        smtp_port,
        dir,
        ready_timeout: ms(
            m.ready_timeout_ms,
            DEFAULT_READY_TIMEOUT_MS,
            "ready_timeout_ms",
        )?,
        op_timeout: ms(m.op_timeout_ms, DEFAULT_OP_TIMEOUT_MS, "op_timeout_ms")?,
        max_message_bytes,
        max_data_bytes,
    })
}
