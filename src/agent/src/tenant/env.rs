//! The sandbox's own environment: the fixed base every server, execution
//! step, mail service and tenant process starts from, before its
//! profile's, its lease's and the tenant's own variables (its home, XDG
//! directories and TMPDIR: [`super::Tenant::env`]).
//!
//! Nothing of the agent's own environment is in it: the agent's is the
//! host's (its PATH with the operator's pyenv and cargo directories, its
//! user, its locale), which says how the host is laid out and would make a
//! task run differently depending on whose shell started the host. What a
//! sandbox process takes from the agent's environment is only what the
//! operator lists: a server's `pass_env`, `exec.pass_env`.

use std::collections::BTreeMap;

/// The sandbox's PATH: its system's own directories, as in the Debian
/// images the benchmarks' servers run in.
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The base, every variable fixed: `PATH`, `LANG` (`C.UTF-8`),
/// `USER`/`LOGNAME` (`sandbox`) and `HOME` (`/`, replaced by the tenant's
/// home wherever a tenant runs).
pub fn base() -> BTreeMap<String, String> {
    [
        ("PATH", PATH),
        ("LANG", "C.UTF-8"),
        ("USER", "sandbox"),
        ("LOGNAME", "sandbox"),
        ("HOME", "/"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_base_is_fixed_whatever_the_agents_environment() {
        let base = super::base();
        assert_eq!(base["PATH"], super::PATH);
        assert_eq!(base["USER"], "sandbox");
        let names: Vec<&str> = base.keys().map(String::as_str).collect();
        assert_eq!(names, ["HOME", "LANG", "LOGNAME", "PATH", "USER"]);
    }
}
