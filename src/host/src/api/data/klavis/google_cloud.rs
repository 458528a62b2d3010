//! Klavis's `GoogleCloudData`: BigQuery, Cloud Storage, Logging and Compute.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::{LaxBool, LaxInt};

fn us() -> String {
    "US".into()
}

/// `google_cloud`: BigQuery, Cloud Storage, Logging and Compute state.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct GoogleCloudData {
    pub datasets: Option<Vec<BigQueryDataset>>,
    pub tables: Option<Vec<BigQueryTable>>,
    pub buckets: Option<Vec<StorageBucket>>,
    pub objects: Option<Vec<StorageObject>>,
    pub log_entries: Option<Vec<LogEntry>>,
    pub log_sinks: Option<Vec<LogSink>>,
    pub log_buckets: Option<Vec<LogBucket>>,
    pub instances: Option<Vec<ComputeInstance>>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BigQueryDataset {
    pub id: String,
    pub description: Option<String>,
    #[serde(default = "us")]
    #[schema(default = "US")]
    pub location: String,
    pub created_at: Option<String>,
    pub updated_at: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BigQueryTable {
    pub dataset_id: String,
    pub id: String,
    pub description: Option<String>,
    pub fields: Option<Vec<BigQueryField>>,
    pub row_count: Option<String>,
    pub created_at: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BigQueryField {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[schema(default = "NULLABLE")]
    pub mode: Option<String>,
    pub description: Option<String>,
    #[schema(no_recursion)]
    pub fields: Option<Vec<BigQueryField>>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StorageBucket {
    pub name: String,
    #[serde(default = "us")]
    #[schema(default = "US")]
    pub location: String,
    #[serde(default = "standard")]
    #[schema(default = "STANDARD")]
    pub storage_class: String,
    #[serde(default)]
    #[schema(value_type = bool, default = false)]
    pub versioning_enabled: LaxBool,
    pub lifecycle_rules: Option<Vec<LifecycleRule>>,
    pub created_at: Option<String>,
    pub updated_at: Option<String>,
}

fn standard() -> String {
    "STANDARD".into()
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LifecycleRule {
    pub action: String,
    pub action_storage_class: Option<String>,
    #[schema(value_type = Option<i64>)]
    pub age_days: Option<LaxInt>,
    pub created_before: Option<String>,
    #[schema(value_type = Option<bool>)]
    pub is_live: Option<LaxBool>,
    #[schema(value_type = Option<i64>)]
    pub num_newer_versions: Option<LaxInt>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StorageObject {
    pub bucket: String,
    pub name: String,
    pub content_type: Option<String>,
    pub size: Option<String>,
    pub content: Option<String>,
    pub md5_hash: Option<String>,
    pub created_at: Option<String>,
    pub updated_at: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ComputeInstance {
    pub name: String,
    pub zone: String,
    #[serde(default = "e2_micro")]
    #[schema(default = "e2-micro")]
    pub machine_type: String,
    #[serde(default = "running")]
    #[schema(default = "RUNNING")]
    pub status: String,
    pub description: Option<String>,
    pub labels: Option<BTreeMap<String, String>>,
    pub created_at: Option<String>,
}

fn e2_micro() -> String {
    "e2-micro".into()
}

fn running() -> String {
    "RUNNING".into()
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LogBucket {
    pub name: String,
    #[serde(default = "global")]
    #[schema(default = "global")]
    pub location: String,
    #[serde(default = "thirty")]
    #[schema(value_type = i64, default = 30)]
    pub retention_days: LaxInt,
    pub description: Option<String>,
    pub created_at: Option<String>,
    pub updated_at: Option<String>,
}

fn global() -> String {
    "global".into()
}

fn thirty() -> LaxInt {
    LaxInt(30)
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LogEntry {
    pub log_name: String,
    pub message: Option<String>,
    #[schema(schema_with = crate::api::model::any_object_or_null)]
    pub json_data: Option<serde_json::Map<String, Value>>,
    #[serde(default = "info")]
    #[schema(default = "INFO")]
    pub severity: String,
    pub timestamp: Option<String>,
    pub resource_type: Option<String>,
    pub resource_labels: Option<BTreeMap<String, String>>,
}

fn info() -> String {
    "INFO".into()
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LogSink {
    pub name: String,
    pub filter: Option<String>,
    pub description: Option<String>,
    pub created_at: Option<String>,
    pub updated_at: Option<String>,
}
