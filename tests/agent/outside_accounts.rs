//! Per-server data of an outside service (canvas, google_cloud) through
//! the agent's gRPC API. With credentials the lease brings itself
//! (`auth_data`), the account is its own: a dump shows it whole, Reset and
//! Release leave it as it is. On the operator's account (the agent's
//! environment), what the host cannot show: a lease's env that claims an
//! account of its own changes nothing, and a cleanup that fails at Release
//! is named and does not keep the lease. (sandbox-host's Acquire carries no
//! auth_data: tests/host/canvas.rs and google_cloud.rs play two tenants on
//! the operator's account.)

use serde_json::Value;

use crate::common::host::http;
use crate::common::mcp::{agent_with, agent_with_env};
use crate::common::servers;
use crate::common::standin::{GCP_ACCESS, StandIn, gcp_key_file};
use sandbox_client::proto;

fn strings(pairs: &[(&str, &str)]) -> prost_types::Struct {
    prost_types::Struct {
        fields: pairs
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    prost_types::Value {
                        kind: Some(prost_types::value::Kind::StringValue(v.to_string())),
                    },
                )
            })
            .collect(),
    }
}

/// An agent whose state root (where ledgers go) is `state`.
fn agent(state: &std::path::Path) -> crate::common::Agent {
    agent_with("", &config(state))
}

fn config(state: &std::path::Path) -> String {
    format!("state_root = \"{}\"\n", state.display())
}

/// Acquires `server` as lease `id` with the lease's own `auth` and `env`.
async fn acquire(
    c: &sandbox_client::Client,
    id: &str,
    server: &str,
    auth: &[(&str, &str)],
    env: &[(&str, &str)],
) {
    let mut req = proto::AcquireRequest {
        lease_id: id.into(),
        server_names: vec![server.into()],
        ttl_seconds: Some(0),
        ..Default::default()
    };
    if !auth.is_empty() {
        req.auth_data.insert(server.into(), strings(auth));
    }
    req.env.insert(
        server.into(),
        proto::EnvVars {
            vars: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        },
    );
    c.agent().acquire(req).await.expect("Acquire");
}

async fn load(c: &sandbox_client::Client, server: &str, json: &str) {
    c.servers()
        .load_data(proto::LoadDataRequest {
            server_name: server.into(),
            json: json.into(),
            ..Default::default()
        })
        .await
        .expect("LoadData");
}

/// The names of the dump's `kind`, sorted.
async fn dumped(c: &sandbox_client::Client, server: &str, kind: &str) -> Vec<String> {
    let r = c
        .servers()
        .dump_data(proto::DumpDataRequest {
            server_name: server.into(),
        })
        .await
        .expect("DumpData")
        .into_inner();
    let d: Value = serde_json::from_str(&r.json).expect("JSON");
    names(&d[kind], "/name")
}

fn names(list: &Value, at: &str) -> Vec<String> {
    let mut n: Vec<String> = list
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.pointer(at).and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    n.sort();
    n
}

async fn reset_and_release(c: &sandbox_client::Client, id: &str) {
    servers::reset(c, id).await;
    servers::release(c, id).await;
}

#[tokio::test]
async fn a_lease_with_its_own_canvas_account_sees_and_keeps_all_of_it() {
    const TOKEN: &str = "tenant-canvas-token";
    let canvas = StandIn::start("canvas_standin.py", &[TOKEN]);
    let url = format!("{}/api/v1", canvas.base);
    let in_canvas = || {
        let (code, v) = http(
            "GET",
            &format!("{url}/accounts/1/courses"),
            Some(TOKEN),
            None,
        );
        assert_eq!(code, 200, "{v}");
        names(&v, "/name")
    };
    let (code, v) = http(
        "POST",
        &format!("{url}/accounts/1/courses"),
        Some(TOKEN),
        Some(r#"{"course": {"name": "Their course", "course_code": "T1"}}"#),
    );
    assert_eq!(code, 200, "{v}");
    let state = tempfile::tempdir().expect("tempdir");
    let agent = agent(state.path());
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    acquire(
        &c,
        "own-canvas",
        "canvas",
        &[("api_url", &url), ("api_token", TOKEN)],
        &[("CANVAS_ALLOW_INSECURE_HTTP", "true")],
    )
    .await;
    load(
        &c,
        "canvas",
        r#"{"courses": [{"name": "Loaded course", "course_code": "L1"}]}"#,
    )
    .await;
    assert_eq!(
        dumped(&c, "canvas", "courses").await,
        ["Loaded course", "Their course"]
    );
    assert!(
        !state.path().join("server-data").exists(),
        "a ledger for the lease's own account"
    );
    reset_and_release(&c, "own-canvas").await;
    assert_eq!(in_canvas(), ["Loaded course", "Their course"]);
}

#[tokio::test]
async fn a_lease_with_its_own_google_cloud_project_sees_and_keeps_all_of_it() {
    let gcp = StandIn::start("gcp_standin.py", &[]);
    let in_project = || {
        let (code, v) = http(
            "GET",
            &format!("{}/storage/v1/b?project=sandbox-test", gcp.base),
            Some(GCP_ACCESS),
            None,
        );
        assert_eq!(code, 200, "{v}");
        names(&v["items"], "/name")
    };
    let (code, v) = http(
        "POST",
        &format!("{}/storage/v1/b?project=sandbox-test", gcp.base),
        Some(GCP_ACCESS),
        Some(r#"{"name": "their-bucket"}"#),
    );
    assert_eq!(code, 200, "{v}");
    let state = tempfile::tempdir().expect("tempdir");
    let key = gcp_key_file(state.path());
    let agent = agent(state.path());
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    acquire(
        &c,
        "own-gcp",
        "google_cloud",
        &[("project_id", "sandbox-test"), ("credentials_file", &key)],
        &[("GOOGLE_CLOUD_ENDPOINT", &gcp.base)],
    )
    .await;
    load(
        &c,
        "google_cloud",
        r#"{"buckets": [{"name": "loaded-bucket"}]}"#,
    )
    .await;
    assert_eq!(
        dumped(&c, "google_cloud", "buckets").await,
        ["loaded-bucket", "their-bucket"]
    );
    reset_and_release(&c, "own-gcp").await;
    assert_eq!(in_project(), ["loaded-bucket", "their-bucket"]);
}

/// The operator's Canvas account, from the agent's environment: the lease's
/// env cannot make it pass for the lease's own (its dump still shows only
/// what it loaded), and with Canvas gone at Release the course that stays
/// is named in the answer and the log, and the sandbox is released anyway.
#[tokio::test]
async fn on_the_operators_canvas_account_a_lease_cannot_claim_it_and_a_failed_cleanup_is_named() {
    const TOKEN: &str = "operator-canvas-token";
    let canvas = StandIn::start("canvas_standin.py", &[TOKEN]);
    let url = format!("{}/api/v1", canvas.base);
    let (code, v) = http(
        "POST",
        &format!("{url}/accounts/1/courses"),
        Some(TOKEN),
        Some(r#"{"course": {"name": "Operator course", "course_code": "OPS"}}"#),
    );
    assert_eq!(code, 200, "{v}");
    let state = tempfile::tempdir().expect("tempdir");
    let agent = agent_with_env(
        "",
        &config(state.path()),
        &[
            ("CANVAS_API_URL", &url),
            ("CANVAS_API_TOKEN", TOKEN),
            ("CANVAS_ALLOW_INSECURE_HTTP", "true"),
        ],
    );
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    let elsewhere = state.path().join("elsewhere.json");
    acquire(
        &c,
        "claims-own",
        "canvas",
        &[],
        &[
            ("SANDBOX_DATA_ACCOUNT", "own"),
            ("SANDBOX_DATA_LEDGER", &elsewhere.display().to_string()),
        ],
    )
    .await;
    load(
        &c,
        "canvas",
        r#"{"courses": [{"name": "Loaded course", "course_code": "L1"}]}"#,
    )
    .await;
    assert_eq!(dumped(&c, "canvas", "courses").await, ["Loaded course"]);
    let ledger = state.path().join("server-data/canvas.json");
    let recorded = std::fs::read_to_string(&ledger).expect("the lease's ledger");
    assert!(recorded.contains("Loaded course"), "{recorded}");
    assert!(!elsewhere.exists());

    drop(canvas);
    let r = c
        .agent()
        .release(proto::ReleaseRequest {
            lease_id: "claims-own".into(),
            is_ttl: false,
            ..Default::default()
        })
        .await
        .expect("Release")
        .into_inner();
    assert!(
        r.message.contains("could not delete") && r.message.contains("Loaded course"),
        "{}",
        r.message
    );
    assert!(
        agent
            .stderr
            .all()
            .lines()
            .any(|l| l.contains("could not delete") && l.contains("Loaded course")),
        "{}",
        agent.stderr.all()
    );
    assert!(!ledger.exists(), "the ledger outlives its lease");
    // Released: the sandbox takes the next lease.
    c.agent()
        .acquire(proto::AcquireRequest {
            lease_id: "next".into(),
            no_servers: true,
            ..Default::default()
        })
        .await
        .expect("the next Acquire");
}
