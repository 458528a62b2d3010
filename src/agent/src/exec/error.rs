//! Why an execution request failed, by cause; `rpc::status::exec_status`
//! is the one place these become gRPC codes.

use sandbox_client::limits::valid_execution_name;

use super::log::ReadError;
use super::{MAIN_SCRIPT, MAX_NAME_LEN};
use crate::workspace::ArchiveError;

/// Why an execution request failed. `rpc::status` maps each to a code.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("the sandbox is not leased; acquire it before running executions")]
    NotLeased,
    #[error("lease {asked} is not this sandbox's lease{}", current.as_ref().map(|c| format!(" (it holds {c})")).unwrap_or_default())]
    OtherLease {
        asked: String,
        current: Option<String>,
    },
    #[error(
        "invalid execution name {0:?}: use 1 to {MAX_NAME_LEN} characters of A-Z a-z 0-9 . _ - (not \".\" or \"..\")"
    )]
    BadName(String),
    #[error("no execution named {name:?} in this sandbox{}", if known.is_empty() { "; upload its archive first".to_owned() } else { format!(" (it has: {known})") })]
    Unknown { name: String, known: String },
    #[error(
        "this lease already holds {max} executions (exec.max_executions); re-use a name to replace one"
    )]
    TooMany { max: usize },
    #[error("the archive has no regular file {MAIN_SCRIPT} at its top level")]
    NoMain,
    #[error("execution archive: {0}")]
    Archive(ArchiveError),
    #[error(
        "execution {name:?} is {state}; cancel it or wait for it to end before starting it again"
    )]
    Active { name: String, state: &'static str },
    #[error(
        "execution {name:?}: its work directory was replaced by {what}; only a directory is exported or run"
    )]
    WorkReplaced { name: String, what: &'static str },
    #[error(transparent)]
    Log(#[from] ReadError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the lease was released or reset meanwhile, which ends its executions; upload the archive again"
    )]
    Released,
}

pub(super) fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> ExecError {
    let context = context.into();
    move |source| ExecError::Io { context, source }
}

/// Checks an execution name (it becomes a directory name).
pub fn check_name(name: &str) -> Result<(), ExecError> {
    if valid_execution_name(name) {
        Ok(())
    } else {
        Err(ExecError::BadName(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_single_safe_path_components() {
        for ok in ["init", "eval_1", "demo-run", "a.b", "X"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        let long = "a".repeat(MAX_NAME_LEN + 1);
        for bad in ["", ".", "..", "a/b", "a b", "é", long.as_str()] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
