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
pub const DEFAULT_DUMP_ATTACHMENT_MAX_BYTES: u64 = 4 << 20;
/// The most domains `[mail] domains` may expand to.
pub const MAX_DOMAINS: usize = 1000;
/// The most `max_data_bytes` may be: a dump travels in one gRPC message.
pub const MAX_DATA_BYTES_LIMIT: u64 = 256 << 20;

/// The checked `[mail]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailDef {
    pub command: String,
    /// The default account's domain; the first of `domains`.
    pub domain: String,
    /// Every domain served (lower case, each once).
    pub domains: Vec<String>,
    pub account: String,
    /// 0: a free loopback port at every start.
    pub imap_port: u16,
    pub smtp_port: u16,
    pub dir: PathBuf,
    pub ready_timeout: Duration,
    pub op_timeout: Duration,
    pub max_message_bytes: u64,
    pub max_data_bytes: u64,
    pub dump_attachment_max_bytes: u64,
}

impl MailDef {
    /// Whether `domain` is one the service serves (any case).
    pub fn serves(&self, domain: &str) -> bool {
        self.domains.iter().any(|d| d.eq_ignore_ascii_case(domain))
    }
}

fn dns_label_ok(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 63
        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !l.starts_with('-')
        && !l.ends_with('-')
}

fn domain_ok(d: &str) -> bool {
    d.len() <= 253 && d.contains('.') && d.split('.').all(dns_label_ok)
}

/// `domain` first, then each name of `names` (a name may hold one range
/// `{A..B}` of numbers), lower case, each once, at most [`MAX_DOMAINS`].
fn expand_domains(domain: &str, names: &[String]) -> Result<Vec<String>, FieldError> {
    let bad = |n: &str| field("domains", EntryError::BadMailName(n.to_owned()));
    let mut out = vec![domain.to_owned()];
    for name in names {
        let name = name.to_ascii_lowercase();
        let expanded = match name.split_once('{') {
            None => vec![name.clone()],
            Some((head, rest)) => {
                let (range, tail) = rest.split_once('}').ok_or_else(|| bad(&name))?;
                let (a, b) = range.split_once("..").ok_or_else(|| bad(&name))?;
                let (a, b) = match (a.parse::<usize>(), b.parse::<usize>()) {
                    (Ok(a), Ok(b)) if a <= b && b - a < MAX_DOMAINS => (a, b),
                    _ => return Err(bad(&name)),
                };
                (a..=b).map(|i| format!("{head}{i}{tail}")).collect()
            }
        };
        for d in expanded {
            if !domain_ok(&d) {
                return Err(bad(&d));
            }
            if !out.contains(&d) {
                out.push(d);
            }
        }
        if out.len() > MAX_DOMAINS {
            return Err(field(
                "domains",
                EntryError::OutOfRange(format!("at most {MAX_DOMAINS} domains")),
            ));
        }
    }
    Ok(out)
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
    if !domain_ok(&domain) {
        return Err(field("domain", EntryError::BadMailName(domain)));
    }
    let domains = expand_domains(&domain, m.domains.as_deref().unwrap_or_default())?;
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
    let dump_attachment_max_bytes = m
        .dump_attachment_max_bytes
        .unwrap_or(DEFAULT_DUMP_ATTACHMENT_MAX_BYTES);
    Ok(MailDef {
        command,
        domain,
        domains,
        dump_attachment_max_bytes,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn domains_expand_ranges_once_each_after_the_default() {
        let d = expand_domains("mcp.com", &names(&["MCP.com", "mcp{1..3}.com", "mcp2.com"]))
            .expect("domains");
        assert_eq!(d, ["mcp.com", "mcp1.com", "mcp2.com", "mcp3.com"]);
        let d = expand_domains("mcp.com", &names(&["mcp{1..110}.com"])).expect("domains");
        assert_eq!((d.len(), d[110].as_str()), (111, "mcp110.com"));
    }

    #[test]
    fn bad_domains_are_refused() {
        for bad in [
            "mcp{3..1}.com",
            "mcp{1..x}.com",
            "mcp{1..2.com",
            "-x.com",
            "nodot",
        ] {
            let e = expand_domains("mcp.com", &names(&[bad])).expect_err(bad);
            assert_eq!(e.field, "domains", "{bad}");
        }
        let e = expand_domains("mcp.com", &names(&["a{1..999}.com", "b{1..9}.com"]))
            .expect_err("too many");
        assert!(e.to_string().contains("at most 1000"), "{e}");
    }
}
