//! Klavis's `PosteEmailData`: each user's mailbox, by address.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{LaxBool, LaxInt};

/// `poste_email_toolathlon`: each user's mailbox, by address.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PosteEmailData {
    #[serde(default)]
    pub users: BTreeMap<String, PosteEmailUserData>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PosteEmailUserData {
    pub emails: Option<Vec<PosteEmail>>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PosteEmail {
    pub email_id: Option<String>,
    pub subject: String,
    pub from_addr: String,
    pub to_addr: String,
    pub cc_addr: Option<String>,
    pub bcc_addr: Option<String>,
    pub date: Option<String>,
    pub message_id: Option<String>,
    pub body_text: Option<String>,
    pub body_html: Option<String>,
    #[schema(value_type = Option<bool>, default = false)]
    pub is_read: Option<LaxBool>,
    #[schema(value_type = Option<bool>, default = false)]
    pub is_important: Option<LaxBool>,
    #[schema(default = "INBOX")]
    pub folder: Option<String>,
    pub attachments: Option<Vec<PosteEmailAttachment>>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PosteEmailAttachment {
    pub filename: String,
    pub content_type: Option<String>,
    #[schema(value_type = Option<i64>)]
    pub size: Option<LaxInt>,
}
