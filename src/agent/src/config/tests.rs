//! Unit tests of the configuration checks.
use super::*;

#[test]
fn defaults_listen_on_vsock() {
    let s = Config::default()
        .validate(None, false)
        .expect("defaults are valid");
    assert_eq!(
        s.listen,
        vec!["vsock://any:1024".parse::<Endpoint>().expect("uri")]
    );
    assert_eq!(s.workspace, PathBuf::from("/workspace"));
}

#[test]
fn unknown_keys_are_named() {
    let e = Config::parse("listen = []\n[limits]\nmax_conections = 3\n", "a.toml")
        .expect_err("typo must fail")
        .to_string();
    assert!(e.contains("a.toml") && e.contains("max_conections"), "{e}");
}

#[test]
fn tcp_rules() {
    let tcp = |uri: &str, remote: bool, token: Option<&str>| {
        let mut c = Config::default();
        c.apply(&Overrides {
            listen: vec![uri.into()],
            allow_remote_tcp: remote,
            ..Default::default()
        });
        c.validate(token, false)
    };
    assert!(matches!(
        tcp("tcp://127.0.0.1:1", false, None),
        Err(ConfigError::TcpNeedsToken(_))
    ));
    let tok = Some("0123456789abcdef0123");
    assert!(tcp("tcp://127.0.0.1:1", false, tok).is_ok());
    assert!(matches!(
        tcp("tcp://0.0.0.0:1", false, tok),
        Err(ConfigError::RemoteTcp(_))
    ));
    assert!(tcp("tcp://0.0.0.0:1", true, tok).is_ok());
}

#[test]
fn zero_limits_are_rejected() {
    let c = Config::parse("[limits]\nmax_concurrent_streams = 0\n", "x").expect("parses");
    assert!(matches!(
        c.validate(None, false),
        Err(ConfigError::ZeroLimit("max_concurrent_streams"))
    ));
}
