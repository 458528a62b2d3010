//! Klavis's `CanvasData`: courses with their assignments, quizzes and enrollments.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::{LaxBool, LaxFloat, LaxInt};

fn yes() -> LaxBool {
    LaxBool(true)
}

/// `canvas`: courses with their assignments, quizzes and enrollments.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CanvasData {
    #[serde(default)]
    pub courses: Vec<CanvasCourse>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CanvasCourse {
    pub name: String,
    pub course_code: String,
    #[serde(default = "yes")]
    #[schema(value_type = bool, default = true)]
    pub published: LaxBool,
    #[serde(default)]
    pub assignments: Vec<CanvasAssignment>,
    #[serde(default)]
    pub quizzes: Vec<CanvasQuiz>,
    #[serde(default)]
    pub enrollments: Vec<CanvasEnrollment>,
    #[schema(schema_with = crate::api::model::objects_or_null)]
    pub announcements: Option<Vec<serde_json::Map<String, Value>>>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CanvasAssignment {
    pub name: String,
    pub description: Option<String>,
    #[schema(value_type = Option<f64>)]
    pub points_possible: Option<LaxFloat>,
    pub due_at: Option<String>,
    #[serde(default)]
    pub submission_types: Vec<String>,
    #[serde(default = "yes")]
    #[schema(value_type = bool, default = true)]
    pub published: LaxBool,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CanvasEnrollment {
    pub user_email: String,
    #[serde(default = "student")]
    #[schema(default = "StudentEnrollment")]
    pub role: String,
}

fn student() -> String {
    "StudentEnrollment".into()
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CanvasQuiz {
    pub title: String,
    pub description: Option<String>,
    #[serde(default = "assignment")]
    #[schema(default = "assignment")]
    pub quiz_type: String,
    #[schema(value_type = Option<i64>)]
    pub time_limit: Option<LaxInt>,
    #[serde(default = "yes")]
    #[schema(value_type = bool, default = true)]
    pub published: LaxBool,
    pub due_at: Option<String>,
    #[serde(default)]
    pub questions: Vec<CanvasQuizQuestion>,
}

fn assignment() -> String {
    "assignment".into()
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CanvasQuizQuestion {
    pub question_name: Option<String>,
    pub question_text: String,
    #[serde(default = "multiple_choice")]
    #[schema(default = "multiple_choice_question")]
    pub question_type: String,
    #[serde(default = "one")]
    #[schema(value_type = f64, default = 1.0)]
    pub points_possible: LaxFloat,
    #[schema(schema_with = crate::api::model::objects_or_null)]
    pub answers: Option<Vec<serde_json::Map<String, Value>>>,
}

fn multiple_choice() -> String {
    "multiple_choice_question".into()
}

fn one() -> LaxFloat {
    LaxFloat(1.0)
}
