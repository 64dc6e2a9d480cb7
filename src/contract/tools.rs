//! `tools`, `tool_choice` and `response_format`: shapes and the cross-field rules between them.

use std::borrow::Cow;

use super::error::ContractError;
use super::fields::{self, Result};
use super::json::{Doc, Kind};

/// A declared tool: its `type` and, for function tools, `function.name`.
pub struct Tool<'a> {
    pub kind: Cow<'a, str>,
    pub name: Cow<'a, str>,
}

/// Why a tool declaration does not have the `{type, function: {name}}` shape.
pub fn tool_shape<'a>(doc: &Doc<'a>, t: usize) -> std::result::Result<Tool<'a>, &'static str> {
    if doc.kind(t) != Kind::Object {
        return Err("expected a tool object");
    }
    let kind = match doc.get(t, "type") {
        Some(k) if doc.kind(k) == Kind::String => doc.str(k),
        Some(_) => return Err("invalid type for `type`, expected a string"),
        None => return Err("missing field `type`"),
    };
    let name = match doc.get(t, "function") {
        Some(f) if doc.kind(f) == Kind::Object => match doc.get(f, "name") {
            Some(n) if doc.kind(n) == Kind::String => doc.str(n),
            Some(_) => return Err("invalid type for `function.name`, expected a string"),
            None => return Err("missing field `name`"),
        },
        Some(_) => return Err("invalid type for `function`, expected a map"),
        None => return Err("missing field `function`"),
    };
    Ok(Tool { kind, name })
}

/// The request-level `tools` array, shape-checked.
pub fn scan_tools<'a>(doc: &Doc<'a>, v: usize) -> Result<Vec<Tool<'a>>> {
    let Some(arr) = fields::array(doc, v, "tools")? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (i, t) in doc.elements(arr).enumerate() {
        out.push(tool_shape(doc, t).map_err(|why| ContractError::data(format!("tools[{i}]: {why}")))?);
    }
    Ok(out)
}

/// A parsed `tool_choice`.
pub enum ToolChoice<'a> {
    None,
    Auto,
    Required,
    Function(Cow<'a, str>),
    AllowedTools { mode: Cow<'a, str>, refs: Vec<ToolRef<'a>> },
}

/// An `allowed_tools` entry: `{"type":"function","name":…}` or `{"type":"function","function":{"name":…}}`.
pub struct ToolRef<'a> {
    pub kind: Cow<'a, str>,
    pub name: Option<Cow<'a, str>>,
}

impl ToolChoice<'_> {
    /// `required`, a named function, or `allowed_tools` in `required` mode.
    pub fn is_forced(&self) -> bool {
        match self {
            ToolChoice::Required | ToolChoice::Function(_) => true,
            ToolChoice::AllowedTools { mode, .. } => mode == "required",
            ToolChoice::None | ToolChoice::Auto => false,
        }
    }
}

pub fn parse_tool_choice<'a>(doc: &Doc<'a>, v: usize) -> Result<Option<ToolChoice<'a>>> {
    let variant = |s: &str| {
        ContractError::data(format!(
            "tool_choice: unknown variant `{}`, expected one of `none`, `auto`, `required`",
            s.chars().take(64).collect::<String>()
        ))
    };
    match doc.kind(v) {
        Kind::Null => Ok(None),
        Kind::String => Ok(Some(match &*doc.str(v) {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => return Err(variant(other)),
        })),
        Kind::Object => {
            let kind = match doc.get(v, "type") {
                Some(t) => {
                    fields::string(doc, t, "tool_choice.type")?.ok_or_else(|| fields::missing("tool_choice.type"))?
                }
                None => return Err(fields::missing("tool_choice.type")),
            };
            match &*kind {
                "function" => {
                    let f = doc.get(v, "function").ok_or_else(|| fields::missing("tool_choice.function"))?;
                    let f = fields::object(doc, f, "tool_choice.function")?
                        .ok_or_else(|| fields::missing("tool_choice.function"))?;
                    let name = doc.get(f, "name").ok_or_else(|| fields::missing("tool_choice.function.name"))?;
                    let name = fields::string(doc, name, "tool_choice.function.name")?
                        .ok_or_else(|| fields::missing("tool_choice.function.name"))?;
                    Ok(Some(ToolChoice::Function(name)))
                }
                "allowed_tools" => {
                    let mode = doc.get(v, "mode").ok_or_else(|| fields::missing("tool_choice.mode"))?;
                    let mode = fields::string(doc, mode, "tool_choice.mode")?
                        .ok_or_else(|| fields::missing("tool_choice.mode"))?;
                    let tools = doc.get(v, "tools").ok_or_else(|| fields::missing("tool_choice.tools"))?;
                    let tools = fields::array(doc, tools, "tool_choice.tools")?
                        .ok_or_else(|| fields::missing("tool_choice.tools"))?;
                    let mut refs = Vec::new();
                    for r in doc.elements(tools) {
                        if doc.kind(r) != Kind::Object {
                            return Err(fields::invalid_type(doc, r, "tool_choice.tools", "a tool reference"));
                        }
                        let kind = match doc.get(r, "type") {
                            Some(t) => fields::string(doc, t, "tool_choice.tools.type")?
                                .ok_or_else(|| fields::missing("tool_choice.tools.type"))?,
                            None => return Err(fields::missing("tool_choice.tools.type")),
                        };
                        let direct = doc.get_some(r, "name");
                        let nested = doc.get_some(r, "function").and_then(|f| doc.get_some(f, "name"));
                        let name = match direct.or(nested) {
                            Some(n) => fields::string(doc, n, "tool_choice.tools.name")?,
                            None => None,
                        };
                        refs.push(ToolRef { kind, name });
                    }
                    Ok(Some(ToolChoice::AllowedTools { mode, refs }))
                }
                other => Err(ContractError::data(format!(
                    "tool_choice.type: unknown variant `{}`, expected `function` or `allowed_tools`",
                    other.chars().take(64).collect::<String>()
                ))),
            }
        }
        _ => Err(fields::invalid_type(doc, v, "tool_choice", "a string or an object")),
    }
}

/// SMG's tool_choice rules against the declared tools (request `tools`, plus Kimi's
/// message-declared tools).
pub fn check_tool_choice(choice: &ToolChoice<'_>, tools: &[Tool<'_>]) -> Result<()> {
    if !matches!(choice, ToolChoice::None | ToolChoice::Auto) && tools.is_empty() {
        return Err(ContractError::rule(
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
        ));
    }
    let exists = |name: &str| tools.iter().any(|t| t.kind == "function" && t.name == name);
    match choice {
        ToolChoice::Function(name) if !exists(name) => Err(ContractError::rule(format!(
            "Invalid value for 'tool_choice': function '{name}' not found in 'tools'."
        ))),
        ToolChoice::AllowedTools { mode, refs } => {
            if mode != "auto" && mode != "required" {
                return Err(ContractError::rule(format!(
                    "Invalid value for 'tool_choice.mode': must be 'auto' or 'required', got '{mode}'."
                )));
            }
            for r in refs {
                if r.kind != "function" {
                    return Err(ContractError::rule(format!(
                        "Invalid value for 'tool_choice.tools': Chat Completion API only supports function tools, got '{}'.",
                        r.kind
                    )));
                }
                let name = r.name.as_deref().unwrap_or("");
                if !exists(name) {
                    return Err(ContractError::rule(format!(
                        "Invalid value for 'tool_choice.tools': tool '{name}' not found in 'tools'."
                    )));
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// A parsed `response_format`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    /// `json_schema` value index.
    JsonSchema(usize),
}

pub fn parse_response_format(doc: &Doc<'_>, v: usize) -> Result<Option<ResponseFormat>> {
    let Some(obj) = fields::object(doc, v, "response_format")? else {
        return Ok(None);
    };
    let kind = match doc.get(obj, "type") {
        Some(t) => {
            fields::string(doc, t, "response_format.type")?.ok_or_else(|| fields::missing("response_format.type"))?
        }
        None => return Err(fields::missing("response_format.type")),
    };
    Ok(Some(match &*kind {
        "text" => ResponseFormat::Text,
        "json_object" => ResponseFormat::JsonObject,
        "json_schema" => {
            let js = doc.get(obj, "json_schema").ok_or_else(|| fields::missing("response_format.json_schema"))?;
            let js = fields::object(doc, js, "response_format.json_schema")?
                .ok_or_else(|| fields::missing("response_format.json_schema"))?;
            match doc.get(js, "name") {
                Some(n) => {
                    fields::string_idx(doc, n, "response_format.json_schema.name")?
                        .ok_or_else(|| fields::missing("response_format.json_schema.name"))?;
                }
                None => return Err(fields::missing("response_format.json_schema.name")),
            }
            if let Some(s) = doc.get(js, "strict") {
                fields::boolean(doc, s, "response_format.json_schema.strict")?;
            }
            ResponseFormat::JsonSchema(js)
        }
        other => {
            return Err(ContractError::data(format!(
                "response_format.type: unknown variant `{}`, expected one of `text`, `json_object`, `json_schema`",
                other.chars().take(64).collect::<String>()
            )))
        }
    }))
}

/// `json_schema.name` non-empty; `json_schema.schema`, when present, a JSON object.
pub fn check_json_schema(doc: &Doc<'_>, js: usize) -> Result<()> {
    if doc.get(js, "name").is_some_and(|n| doc.node(n).end - doc.node(n).start == 2) {
        return Err(ContractError::rule("JSON schema name cannot be empty"));
    }
    if let Some(schema) = doc.get(js, "schema") {
        if doc.kind(schema) != Kind::Object {
            return Err(ContractError::rule("response_format.json_schema.schema must be a JSON object"));
        }
    }
    Ok(())
}
