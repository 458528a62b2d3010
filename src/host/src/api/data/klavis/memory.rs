//! Klavis's `LocalMemoryData`: the memory server's knowledge graph.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `localmemory`: the memory server's knowledge graph.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LocalMemoryData {
    pub entities: Option<Vec<MemoryEntity>>,
    pub relations: Option<Vec<MemoryRelation>>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MemoryEntity {
    pub name: String,
    #[serde(rename = "entityType")]
    pub entity_type: String,
    pub observations: Option<Vec<String>>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MemoryRelation {
    pub from: String,
    pub to: String,
    #[serde(rename = "relationType")]
    pub relation_type: String,
}
