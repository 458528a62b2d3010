//! google_cloud's per-server data through sandbox-host: GoogleCloudData
//! loaded into the project of the lease's service-account key and dumped
//! back by the server's data tool (packaging/launchers/google-cloud-data)
//! over the BigQuery, Cloud Storage, Cloud Logging and Compute Engine REST
//! APIs. Google Cloud cannot be reached from here, so a test double of the
//! calls used, and of the key's token endpoint, stands in for it
//! (tests/clients/gcp_standin.py, through GOOGLE_CLOUD_ENDPOINT).

use std::time::Duration;

use serde_json::Value;

use crate::common::host::{Host, KEY_A, KEY_B, acquire, http, release};
use crate::common::standin::{GCP_ACCESS, StandIn, gcp_key_file};
use crate::common::{eventually, when};

const DATA: &str = r#"{
  "datasets": [{"id": "hr", "description": "People data", "location": "EU"}],
  "tables": [{"dataset_id": "hr", "id": "staff", "fields": [
      {"name": "id", "type": "INTEGER", "mode": "REQUIRED"},
      {"name": "address", "type": "RECORD", "fields": [{"name": "city", "type": "STRING"}]}]}],
  "buckets": [{"name": "hr-exports", "location": "EU", "versioning_enabled": true,
               "lifecycle_rules": [{"action": "Delete", "age_days": 30}]}],
  "objects": [{"bucket": "hr-exports", "name": "2025/roster.csv", "content_type": "text/csv",
               "content": "id,city\n1,Lyon\n"}],
  "log_entries": [{"log_name": "payroll", "message": "run finished", "severity": "notice"},
                  {"log_name": "payroll", "json_data": {"employees": 3}, "severity": "INFO"}],
  "log_sinks": [{"name": "payroll-errors", "filter": "severity>=ERROR"}],
  "log_buckets": [{"name": "audit", "retention_days": 90}],
  "instances": [{"name": "batch-1", "zone": "europe-west1-b", "machine_type": "e2-small",
                 "labels": {"team": "hr"}}]
}"#;

fn named<'a>(d: &'a Value, kind: &str, name: &str) -> &'a Value {
    d["data"][kind]
        .as_array()
        .and_then(|v| v.iter().find(|x| x["name"] == name || x["id"] == name))
        .unwrap_or_else(|| panic!("{kind} {name} in {d}"))
}

#[test]
fn google_cloud_data_round_trips_through_its_service() {
    let gcp = StandIn::start("gcp_standin.py", &[]);
    let dir = tempfile::tempdir().expect("tempdir");
    let key = gcp_key_file(dir.path());
    let extra = sandbox_args(&gcp.base, &key);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let host = Host::start_env(
        dir.path(),
        &extra,
        &[
            ("GOOGLE_CLOUD_PROJECT", "sandbox-test"),
            ("GOOGLE_APPLICATION_CREDENTIALS", &key),
            ("GOOGLE_CLOUD_ENDPOINT", &gcp.base),
        ],
    );
    let a = acquire(&host, KEY_A, r#"{"server_names": ["google_cloud"]}"#);
    let id = a["local_sandbox_id"].as_str().expect("id");
    let base = format!("{}/local-sandbox/google_cloud/{id}", host.base);

    // Refused data creates nothing.
    let (code, v) = http(
        "POST",
        &format!("{base}/initialize"),
        Some(KEY_A),
        Some(r#"{"tables": [{"dataset_id": "nope", "id": "t"}]}"#),
    );
    assert_eq!(code, 400, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .is_some_and(|d| d.contains("tables[0].dataset_id")),
        "{v}"
    );

    let (code, v) = http(
        "POST",
        &format!("{base}/initialize"),
        Some(KEY_A),
        Some(DATA),
    );
    assert_eq!(code, 200, "{v}");
    let (code, d) = http("GET", &format!("{base}/dump"), Some(KEY_A), None);
    assert_eq!(code, 200, "{d}");
    assert_eq!(named(&d, "datasets", "hr")["location"], "EU", "{d}");
    let staff = named(&d, "tables", "staff");
    assert_eq!(staff["fields"][1]["fields"][0]["name"], "city", "{staff}");
    let bucket = named(&d, "buckets", "hr-exports");
    assert_eq!(bucket["versioning_enabled"], true, "{bucket}");
    assert_eq!(bucket["lifecycle_rules"][0]["age_days"], 30, "{bucket}");
    assert_eq!(
        named(&d, "objects", "2025/roster.csv")["content"],
        "id,city\n1,Lyon\n",
        "{d}"
    );
    let logs = d["data"]["log_entries"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        logs.iter()
            .any(|e| e["message"] == "run finished" && e["severity"] == "NOTICE"),
        "{d}"
    );
    assert!(logs.iter().any(|e| e["json_data"]["employees"] == 3), "{d}");
    assert_eq!(
        named(&d, "log_sinks", "payroll-errors")["filter"],
        "severity>=ERROR",
        "{d}"
    );
    assert_eq!(
        named(&d, "log_buckets", "audit")["retention_days"],
        90,
        "{d}"
    );
    let vm = named(&d, "instances", "batch-1");
    assert_eq!(vm["zone"], "europe-west1-b", "{vm}");
    assert_eq!(vm["machine_type"], "e2-small", "{vm}");

    // A service failure midway: a 503, and what that load created is gone.
    let (code, v) = http(
        "POST",
        &format!("{base}/initialize"),
        Some(KEY_A),
        Some(
            r#"{"buckets": [{"name": "half-done"}], "instances": [{"name": "fail-me", "zone": "europe-west1-b"}]}"#,
        ),
    );
    assert_eq!(code, 503, "{v}");
    let (_, after) = http("GET", &format!("{base}/dump"), Some(KEY_A), None);
    let buckets: Vec<&Value> = after["data"]["buckets"]
        .as_array()
        .map(|v| v.iter().map(|b| &b["name"]).collect())
        .unwrap_or_default();
    assert_eq!(buckets, ["hr-exports"], "{after}");
    release(&host, KEY_A, id);
}

/// The names `path` of the stand-in lists under `key` (read with its
/// token, outside any sandbox), sorted.
fn listed(gcp: &StandIn, path: &str, key: &str, name: &str) -> Vec<String> {
    let (code, v) = http(
        "GET",
        &format!("{}{path}", gcp.base),
        Some(GCP_ACCESS),
        None,
    );
    assert_eq!(code, 200, "{path}: {v}");
    let mut out: Vec<String> = v[key]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.pointer(name).and_then(Value::as_str))
                .map(|n| n.rsplit('/').next().unwrap_or(n).to_owned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// What the stand-in's project holds, by kind, by name.
fn in_project(gcp: &StandIn) -> Value {
    let p = "/bigquery/v2/projects/sandbox-test";
    let (code, agg) = http(
        "GET",
        &format!(
            "{}/compute/v1/projects/sandbox-test/aggregated/instances",
            gcp.base
        ),
        Some(GCP_ACCESS),
        None,
    );
    assert_eq!(code, 200, "{agg}");
    let instances: Vec<&Value> = agg["items"]
        .as_object()
        .map(|z| {
            z.values()
                .flat_map(|s| s["instances"].as_array().into_iter().flatten())
                .map(|v| &v["name"])
                .collect()
        })
        .unwrap_or_default();
    serde_json::json!({
        "datasets": listed(gcp, &format!("{p}/datasets"), "datasets", "/datasetReference/datasetId"),
        "tables of hr": listed(gcp, &format!("{p}/datasets/hr/tables"), "tables", "/tableReference/tableId"),
        "buckets": listed(gcp, "/storage/v1/b?project=sandbox-test", "items", "/name"),
        "objects of hr-exports": listed(gcp, "/storage/v1/b/hr-exports/o", "items", "/name"),
        "sinks": listed(gcp, "/v2/projects/sandbox-test/sinks", "sinks", "/name"),
        "log buckets": listed(gcp, "/v2/projects/sandbox-test/locations/-/buckets", "buckets", "/name"),
        "instances": instances,
    })
}

/// Two tenants on the operator's project (the host's environment, shared
/// by every sandbox): B's fresh sandbox dumps none of A's datasets,
/// buckets, log entries, sinks or instances, nor the project's own; A's
/// Release deletes from the project what A loaded (its bucket emptied
/// first, with what A's tools added), and nothing else.
#[test]
fn tenants_of_the_operators_project_see_and_delete_only_their_own() {
    let gcp = StandIn::start("gcp_standin.py", &[]);
    // A bucket the project had before any sandbox.
    let (code, v) = http(
        "POST",
        &format!("{}/storage/v1/b?project=sandbox-test", gcp.base),
        Some(GCP_ACCESS),
        Some(r#"{"name": "ops-archive"}"#),
    );
    assert_eq!(code, 200, "{v}");
    let dir = tempfile::tempdir().expect("tempdir");
    let key = gcp_key_file(dir.path());
    let extra = sandbox_args(&gcp.base, &key);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let host = Host::start_env(
        dir.path(),
        &extra,
        &[
            ("GOOGLE_CLOUD_PROJECT", "sandbox-test"),
            ("GOOGLE_APPLICATION_CREDENTIALS", &key),
            ("GOOGLE_CLOUD_ENDPOINT", &gcp.base),
        ],
    );
    let body = r#"{"server_names": ["google_cloud"]}"#;
    let url = |id: &str, op: &str| format!("{}/local-sandbox/google_cloud/{id}/{op}", host.base);
    let a = acquire(&host, KEY_A, body);
    let a = a["local_sandbox_id"].as_str().expect("id");
    let (code, v) = http("POST", &url(a, "initialize"), Some(KEY_A), Some(DATA));
    assert_eq!(code, 200, "{v}");
    let (code, d) = http("GET", &url(a, "dump"), Some(KEY_A), None);
    assert_eq!(code, 200, "{d}");
    let buckets: Vec<&Value> = d["data"]["buckets"]
        .as_array()
        .map(|v| v.iter().map(|b| &b["name"]).collect())
        .unwrap_or_default();
    assert_eq!(buckets, ["hr-exports"], "only what A loaded: {d}");
    assert_eq!(
        d["data"]["log_entries"].as_array().map(Vec::len),
        Some(2),
        "{d}"
    );

    let b = acquire(&host, KEY_B, body);
    let b = b["local_sandbox_id"].as_str().expect("id");
    let (code, d) = http("GET", &url(b, "dump"), Some(KEY_B), None);
    assert_eq!(code, 200, "{d}");
    for kind in [
        "datasets",
        "tables",
        "buckets",
        "objects",
        "log_entries",
        "log_sinks",
        "log_buckets",
        "instances",
    ] {
        assert_eq!(
            d["data"][kind],
            serde_json::json!([]),
            "B's fresh sandbox shows {kind} of another tenant or of the project: {d}"
        );
    }

    // A's tools add an object to A's bucket (here straight through the
    // API): it goes with the bucket.
    let (code, v) = http(
        "POST",
        &format!(
            "{}/upload/storage/v1/b/hr-exports/o?uploadType=media&name=notes.txt",
            gcp.base
        ),
        Some(GCP_ACCESS),
        Some("by A's tools"),
    );
    assert_eq!(code, 200, "{v}");
    release(&host, KEY_A, a);
    let want = serde_json::json!({
        "datasets": [], "tables of hr": [], "buckets": ["ops-archive"],
        "objects of hr-exports": [], "sinks": [], "log buckets": ["_Default", "_Required"],
        "instances": [],
    });
    eventually(
        Duration::from_secs(60),
        "what A loaded deleted from the project at A's Release",
        || {
            let now = in_project(&gcp);
            when(now == want, || now.to_string())
        },
    );
    release(&host, KEY_B, b);
}

/// What an isolated sandbox needs to use the stand-in: its port, and the
/// operator's key file (shown read-only: the servers use that account).
fn sandbox_args(url: &str, key: &str) -> Vec<String> {
    let mut v = crate::common::standin::reach(url);
    v.extend(["--sandbox-ro".to_owned(), key.to_owned()]);
    v
}
