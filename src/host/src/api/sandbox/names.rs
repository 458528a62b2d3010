//! The server names of Klavis's MCP Sandbox API (`/sandbox/{server}`):
//! `local_dev`, the names its integrations send for servers of ours, and
//! the names this host cannot serve, each refused with why.

use serde_json::Value;

use crate::api::validation::verr;
use crate::error::{HostError, HostResult};

/// What `local_dev` holds: the local servers Klavis's integrations expect
/// in it (MCP_Atlas's list, and Toolathlon's `pdf-tools`).
pub const LOCAL_DEV: &[&str] = &[
    "filesystem",
    "git",
    "terminal",
    "desktop-commander",
    "arxiv",
    "excel",
    "word",
    "powerpoint",
    "code-executor",
    "code-runner",
    "pdf-tools",
];

/// Names the integrations send that mean a server of ours under another
/// name: (as sent, ours). Toolathlon sends its task's own names (`memory`,
/// `google-cloud`, `playwright_with_chunk`) and keys the answer's
/// `server_urls` by the name it sent, so answers carry the name as sent.
const ALIASES: &[(&str, &str)] = &[
    ("memory", "localmemory"),
    ("google-cloud", "google_cloud"),
    ("emails", "poste_email_toolathlon"),
    ("playwright_with_chunk", "playwright"),
];

/// Klavis's names for servers backed by its own pre-made SaaS test
/// accounts, which a self-hosted sandbox cannot have.
const SAAS: &[&str] = &[
    "jira",
    "github",
    "salesforce",
    "hubspot",
    "notion",
    "airtable",
    "linear",
    "asana",
    "google_sheets",
    "google_drive",
    "google_docs",
    "gmail",
    "google_calendar",
    "google_forms",
    "clickup",
    "close",
    "monday",
    "motion",
    "onedrive",
    "microsoft_teams",
    "outlook_mail",
    "cal.com",
    "quickbooks",
    "moneybird",
    "dropbox",
    "shopify",
    "woocommerce",
    "outlook_calendar",
    "resend",
    "wordpress",
    "mem0",
    "supabase",
    "slack",
    "confluence",
    "discord",
    "snowflake",
    "postgres",
    "mongodb",
    "e2b",
    "weights_and_biases",
];

/// Klavis's names of servers that call public web APIs (no account).
pub const PUBLIC_DATA: &[&str] = &[
    "calculator",
    "clinicaltrialsgov",
    "us_weather",
    "context7",
    "met_museum",
    "open_library",
    "pubmed",
    "wikipedia",
    "osm",
    "whois",
    "arxiv_latex",
    "weather",
    "national_parks",
    "twelvedata",
    "lara_translate",
    "alchemy",
];

/// A `/sandbox/{server}` name, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// The servers its sandbox holds (ours).
    pub servers: Vec<String>,
    /// The name answers carry: the one the client sent (its
    /// `server_name`, and its `server_urls` key of a one-server sandbox).
    pub answer_name: String,
    /// `local_dev`: the local servers together.
    pub local_dev: bool,
}

/// Resolves a path's server name against what this host's sandboxes
/// carry (`known`): `local_dev`, a server of ours (under its name or an
/// integration's), else a clear error: 400 for names Klavis serves from
/// outside accounts or public-data servers this host does not carry, 422
/// (FastAPI's shape) for names nobody knows.
pub fn resolve(name: &str, known: &[String]) -> HostResult<Named> {
    let carries = |s: &str| known.iter().any(|k| k == s);
    if name == "local_dev" {
        let servers: Vec<String> = LOCAL_DEV
            .iter()
            .filter(|s| carries(s))
            .map(|s| (*s).to_owned())
            .collect();
        return Ok(Named {
            servers,
            answer_name: name.into(),
            local_dev: true,
        });
    }
    let ours = self::ours(name);
    if carries(ours) {
        return Ok(Named {
            servers: vec![ours.to_owned()],
            answer_name: name.to_owned(),
            local_dev: false,
        });
    }
    if SAAS.contains(&name) {
        return Err(HostError::BadRequest(format!(
            "{name} is served by Klavis from its own test accounts of an outside service; this \
             self-hosted sandbox has none: use Klavis's API for it, or a local server"
        )));
    }
    if PUBLIC_DATA.contains(&name) || crate::api::SERVER_NAMES.contains(&ours) {
        return Err(HostError::BadRequest(format!(
            "this host's sandboxes do not carry {name}; they carry: local_dev, {}",
            known.join(", ")
        )));
    }
    Err(HostError::Validation(vec![verr(
        &["path".into(), "server_name".into()],
        format!(
            "Input should be local_dev, one of this host's servers ({}) or a name of Klavis's \
             SandboxMcpServer",
            known.join(", ")
        ),
        "enum",
        &Value::from(name),
    )]))
}

/// Our name for a server the integrations may name otherwise (`memory`,
/// `google-cloud`): for the per-server data routes.
pub fn ours(name: &str) -> &str {
    ALIASES
        .iter()
        .find(|(sent, _)| *sent == name)
        .map_or(name, |(_, ours)| ours)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> Vec<String> {
        ["filesystem", "git", "terminal", "localmemory", "playwright"]
            .map(String::from)
            .to_vec()
    }

    #[test]
    fn names_resolve_as_the_integrations_send_them() {
        let r = resolve("local_dev", &known()).expect("local_dev");
        assert_eq!(r.servers, ["filesystem", "git", "terminal"]);
        for (sent, ours) in [
            ("memory", "localmemory"),
            ("localmemory", "localmemory"),
            ("google-cloud", "google_cloud"),
            ("emails", "poste_email_toolathlon"),
        ] {
            let mut known = known();
            known.extend(["google_cloud", "poste_email_toolathlon"].map(String::from));
            let r = resolve(sent, &known).expect(sent);
            assert_eq!(
                (r.servers[0].as_str(), r.answer_name.as_str()),
                (ours, sent)
            );
        }
        let r = resolve("playwright_with_chunk", &known()).expect("alias");
        assert_eq!(
            (r.servers[0].as_str(), r.answer_name.as_str()),
            ("playwright", "playwright_with_chunk")
        );
        assert_eq!(resolve("git", &known()).expect("git").servers, ["git"]);
    }

    #[test]
    fn names_this_host_cannot_serve_are_refused_clearly() {
        match resolve("jira", &known()) {
            Err(HostError::BadRequest(m)) => assert!(m.contains("test accounts"), "{m}"),
            other => panic!("{other:?}"),
        }
        match resolve("wikipedia", &known()) {
            Err(HostError::BadRequest(m)) => assert!(m.contains("do not carry wikipedia"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            resolve("nope", &known()),
            Err(HostError::Validation(_))
        ));
    }
}
