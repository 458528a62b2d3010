//! The tool surfaces the shipped servers advertise, checked wherever a
//! test lists them (the agent's `tool_schemas`, the host's catalog
//! comparisons, which list every catalogued server live): every tool's
//! `inputSchema` is an object schema with its properties, each server has
//! the tool a benchmark calls, and a benchmark's pinned servers list the
//! tools packaging/pins.toml says (names, properties, required ones).
//!
//! packaging/pins.toml, per benchmark, is what the benchmark's own
//! environment runs behind each Klavis name (package, exact version,
//! command, the file that says so) and what this project serves under its
//! profile (checked against the manifest by the agent's `pins` tests).

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde_json::Value;

use super::{ci, skipped};

/// Servers whose launch carries a lease's secret: the host never
/// catalogues them, so the host's catalog comparisons do not list them;
/// the agent's `tool_schemas` does (with credentials of the right form),
/// with the servers ALL leaves out.
pub const UNCATALOGUED: [&str; 3] = ["poste_email_toolathlon", "canvas", "google_cloud"];

const PINS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/pins.toml");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bench {
    /// The repository and commit read.
    pub source: String,
    pub servers: BTreeMap<String, Pin>,
}

/// How what is served relates to the benchmark's pin.
#[derive(Debug, Deserialize, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "lowercase")]
pub enum Match {
    /// The benchmark's package at its exact version.
    Exact,
    /// The benchmark names no version (it runs the registry's latest):
    /// the default install serves.
    Unpinned,
    /// The pinned version (or fork) is not in the registries: the nearest
    /// published one, or the fork's base (`note` says what remains).
    Nearest,
    /// The package is published nowhere: a server of this project's own.
    Own,
    /// Neither the pin nor a stand-in of the same surface is served: the
    /// default implementation runs (`note` says why).
    Unavailable,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pin {
    pub package: String,
    /// The benchmark's exact version ("" when it pins none).
    pub version: String,
    /// The benchmark's command and arguments, shortened.
    pub run: String,
    /// The file of `source` that says so.
    pub file: String,
    #[serde(rename = "match")]
    pub matches: Match,
    /// The package installed under this profile ("" for our own).
    #[serde(default)]
    pub serves_package: String,
    /// The version this project serves under the profile (its metadata).
    pub serves: String,
    #[serde(default)]
    pub note: String,
    /// The benchmark's version's tools, `name(prop*, prop)` (`*` = required).
    #[serde(default)]
    pub tools: Vec<String>,
    /// Where what is served lists other tools, those (the note says why).
    pub served_tools: Option<Vec<String>>,
}

pub fn load() -> BTreeMap<String, Bench> {
    let text = std::fs::read_to_string(PINS).expect("packaging/pins.toml");
    toml::from_str(&text).unwrap_or_else(|e| panic!("packaging/pins.toml: {e}"))
}

/// `name(a*, b)`: a tool's properties, sorted, required ones starred.
pub fn render(name: &str, schema: &Value) -> String {
    let required: BTreeSet<&str> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let props: Vec<String> = schema["properties"]
        .as_object()
        .map(|p| p.keys().cloned().collect::<BTreeSet<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            if required.contains(p.as_str()) {
                format!("{p}*")
            } else {
                p
            }
        })
        .collect();
    format!("{name}({})", props.join(", "))
}

/// The table's form of a tool line, sorted the same way.
fn normal(line: &str) -> String {
    let (name, rest) = line.split_once('(').unwrap_or((line, ")"));
    let mut props: Vec<&str> = rest
        .trim_end_matches(')')
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    props.sort_by_key(|p| p.trim_end_matches('*'));
    format!("{}({})", name.trim(), props.join(", "))
}

/// The servers pinned for `profile` (none for "default").
pub fn pinned(pins: &BTreeMap<String, Bench>, profile: &str) -> Vec<String> {
    pins.get(profile)
        .map(|b| b.servers.keys().cloned().collect())
        .unwrap_or_default()
}

/// Every difference between what `listed` (one SDK's listing under
/// `profile`: server → tool → inputSchema) shows and the table, for the
/// pinned servers that `lists` says this listing must hold.
pub fn tool_problems(
    pins: &BTreeMap<String, Bench>,
    profile: &str,
    listed: &Value,
    lists: impl Fn(&str) -> bool,
    out: &mut Vec<String>,
) {
    let Some(bench) = pins.get(profile) else {
        return;
    };
    for (server, pin) in bench.servers.iter().filter(|(s, _)| lists(s)) {
        let expected: BTreeSet<String> = pin
            .served_tools
            .as_ref()
            .unwrap_or(&pin.tools)
            .iter()
            .map(|l| normal(l))
            .collect();
        if expected.is_empty() {
            // Unavailable and unpinned: no surface to hold it to.
            continue;
        }
        let Some(tools) = listed.get(server).and_then(Value::as_object) else {
            // Not listed: not installed (CI=true installs every one).
            if ci() {
                out.push(format!("{profile} {server}: pinned, not listed"));
            } else {
                skipped(&format!("{profile} {server}: pinned, not installed"));
            }
            continue;
        };
        let got: BTreeSet<String> = tools.iter().map(|(n, s)| render(n, s)).collect();
        for missing in expected.difference(&got) {
            out.push(format!(
                "{profile} {server}: the table's {missing} is not listed"
            ));
        }
        for extra in got.difference(&expected) {
            out.push(format!(
                "{profile} {server}: lists {extra}, not in the table"
            ));
        }
    }
}

/// One argument each server's tool takes, by the tool's and argument's
/// names across the pinned versions (server, tools, arguments).
const KNOWN: &[(&str, &[&str], &[&str])] = &[
    ("filesystem", &["read_text_file", "read_file"], &["path"]),
    ("git", &["git_status"], &["repo_path"]),
    ("terminal", &["run_command"], &["command"]),
    ("desktop-commander", &["list_directory"], &["path"]),
    ("arxiv", &["search_papers"], &["query"]),
    ("excel", &["create_workbook"], &["path", "filepath"]),
    ("word", &["create_document"], &["filename"]),
    ("powerpoint", &["create_presentation"], &["id"]),
    (
        "code-executor",
        &["run_python_code", "execute_code"],
        &["code"],
    ),
    ("code-runner", &["run-code"], &["code"]),
    ("pdf-tools", &["read_pdf_pages"], &["pdf_file_path"]),
    ("localmemory", &["create_entities"], &["entities"]),
    ("playwright", &["browser_navigate"], &["url"]),
    ("google_cloud", &["bigquery_run_query"], &["query"]),
    ("canvas", &["get_course_details"], &["course_identifier"]),
    ("poste_email_toolathlon", &["get_emails"], &["page"]),
    ("calculator", &["calculate"], &["expression"]),
    ("context7", &["resolve-library-id"], &["libraryName"]),
    ("open_library", &["get_book_by_title"], &["title"]),
    ("osm", &["geocode_address"], &["address"]),
    ("wikipedia", &["search_wikipedia"], &["query"]),
];

/// Every tool schema problem of one SDK's listing (`sdk` names it).
pub fn schema_problems(sdk: &str, profile: &str, listed: &Value, out: &mut Vec<String>) {
    let Some(servers) = listed.as_object() else {
        out.push(format!("{sdk} {profile}: not a listing: {listed}"));
        return;
    };
    for (server, tools) in servers {
        let at = format!("{sdk} {profile} {server}");
        if let Some(e) = tools.get("error") {
            out.push(format!("{at}: listing failed: {e}"));
            continue;
        }
        let tools = tools.as_object().cloned().unwrap_or_default();
        if tools.is_empty() {
            out.push(format!("{at}: no tools"));
        }
        for (tool, schema) in &tools {
            let props = schema.get("properties").and_then(Value::as_object);
            if schema.get("type") != Some(&Value::from("object")) || props.is_none() {
                out.push(format!(
                    "{at} {tool}: not an object schema with properties: {schema}"
                ));
                continue;
            }
            let props = props.cloned().unwrap_or_default();
            for r in schema["required"].as_array().into_iter().flatten() {
                if !r.as_str().is_some_and(|r| props.contains_key(r)) {
                    out.push(format!("{at} {tool}: requires {r}, not in its properties"));
                }
            }
        }
        if let Some((_, names, args)) = KNOWN.iter().find(|k| k.0 == server) {
            let tool = names.iter().find_map(|n| tools.get(*n));
            let has = tool.is_some_and(|t| args.iter().any(|a| t["properties"].get(*a).is_some()));
            if !has {
                out.push(format!("{at}: no {names:?} taking {args:?}"));
            }
        }
    }
}

/// Every problem of one SDK's listing under `profile` (server → tool →
/// inputSchema): its schemas, then the pins table's tools for the pinned
/// servers that `lists` says it holds.
pub fn surface_problems(
    sdk: &str,
    pins: &BTreeMap<String, Bench>,
    profile: &str,
    listed: &Value,
    lists: impl Fn(&str) -> bool,
    out: &mut Vec<String>,
) {
    schema_problems(sdk, profile, listed, out);
    tool_problems(pins, profile, listed, lists, out);
}
