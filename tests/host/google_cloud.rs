//! google_cloud's per-server data through sandbox-host: GoogleCloudData
//! loaded into the project of the lease's service-account key and dumped
//! back by the server's data tool (packaging/launchers/google-cloud-data)
//! over the BigQuery, Cloud Storage, Cloud Logging and Compute Engine REST
//! APIs. Google Cloud cannot be reached from here, so a test double of the
//! calls used, and of the key's token endpoint, stands in for it
//! (tests/clients/gcp_standin.py, through GOOGLE_CLOUD_ENDPOINT).

use serde_json::Value;

use super::standin::StandIn;
use crate::common::host::{Host, KEY_A, acquire, http, release};

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

fn key_file(dir: &std::path::Path) -> String {
    let key = std::process::Command::new("openssl")
        .args(["genrsa", "2048"])
        .output()
        .expect("openssl genrsa");
    assert!(key.status.success());
    let path = dir.join("service-account.json");
    std::fs::write(
        &path,
        serde_json::json!({
            "type": "service_account",
            "project_id": "sandbox-test",
            "private_key_id": "1",
            "private_key": String::from_utf8_lossy(&key.stdout),
            "client_email": "data@sandbox-test.iam.gserviceaccount.com",
            "client_id": "1",
            "token_uri": "https://oauth2.googleapis.com/token",
        })
        .to_string(),
    )
    .expect("key file");
    path.display().to_string()
}

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
    let key = key_file(dir.path());
    let host = Host::start_env(
        dir.path(),
        &[],
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
