//! The golden table: for every rule one accepted and one rejected request, with the exact body.

use super::super::{inspect, Aliases, Endpoint};
use super::{invalid, parse_error};
use sonic_rs::JsonValueTrait;

const CHAT: Endpoint = Endpoint::ChatCompletions;
const COMP: Endpoint = Endpoint::Completions;

/// A chat body for `model` with one user message plus `extra` top-level members.
fn chat_for(model: &str, extra: &str) -> String {
    format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]{extra}}}"#)
}

fn c(extra: &str) -> String {
    chat_for("m", extra)
}

/// A chat body for `model` with the given messages array.
fn msgs(model: &str, messages: &str, extra: &str) -> String {
    format!(r#"{{"model":"{model}","messages":{messages}{extra}}}"#)
}

fn p(extra: &str) -> String {
    format!(r#"{{"model":"m","prompt":"hi"{extra}}}"#)
}

const TOOLS: &str = r#","tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}]"#;

/// (name, endpoint, body, expected error body or None when accepted)
fn cases() -> Vec<(&'static str, Endpoint, String, Option<String>)> {
    let ok = |name, ep, body: String| (name, ep, body, None);
    let bad = |name, ep, body: String, expected: String| (name, ep, body, Some(expected));
    let sys_tools = |model: &str, content: &str, tools: &str, extra: &str| {
        msgs(
            model,
            &format!(r#"[{{"role":"system","content":{content},"tools":{tools}}},{{"role":"user","content":"hi"}}]"#),
            extra,
        )
    };
    let history = |model: &str, calls: &str, answers: &str| {
        msgs(
            model,
            &format!(
                r#"[{{"role":"user","content":"q"}},{{"role":"assistant","content":null,"tool_calls":{calls}}}{answers}]"#
            ),
            "",
        )
    };
    let call = |id: &str, args: &str| {
        format!(r#"{{"id":"{id}","type":"function","function":{{"name":"f","arguments":{args}}}}}"#)
    };
    let answer = |id: &str| format!(r#",{{"role":"tool","tool_call_id":"{id}","content":"ok"}}"#);
    let root = r#"[{"role":"user","content":"hi"},{"role":"root","content":"be brief"}]"#;
    let top_p_msg = invalid("top_p must be in (0, 1] - greater than 0.0 and at most 1.0");
    let one_constraint =
        invalid("__all__: only one structured output constraint (regex, ebnf, or json_schema) can be active at a time");
    let stream_opts = invalid("__all__: The 'stream_options' parameter is only allowed when 'stream' is enabled");
    let needs_tools =
        invalid("__all__: Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.");
    let k3_pinned =
        |f: &str, allowed: &str| invalid(&format!("__all__: invalid {f}: only {allowed} is allowed for this model"));
    let zai_efforts = "none, minimal, low, medium, high, xhigh or max";
    let ds_v4 = invalid("__all__: DeepSeek V4 reasoning effort must be none, low, high or max (minimal, medium and xhigh aliases are accepted)");
    let ds_v41 = invalid("__all__: DeepSeek V4.1 reasoning effort must be none, low, high, xhigh, max or an integer budget from 1 to 100 (minimal and medium aliases are accepted)");
    let ds = "deepseek-ai/DeepSeek-V4-Pro";
    let ds41 = "deepseek-ai/deepseek-v4.1-flash";
    vec![
        // --- envelope-level failures
        bad("syntax", CHAT, "{".into(), parse_error("JSON syntax error: Failed to parse the request body as JSON: EOF while parsing an object at line 1 column 1")),
        bad("syntax trailing", CHAT, format!("{} x", c("")), parse_error("JSON syntax error: Failed to parse the request body as JSON: trailing characters at line 1 column 59")),
        bad("not an object", CHAT, "[1]".into(), parse_error("Invalid JSON data: request: invalid type: sequence, expected struct ChatCompletionRequest")),
        bad("missing model", CHAT, r#"{"messages":[{"role":"user","content":"hi"}]}"#.into(), parse_error("Invalid JSON data: missing field `model`")),
        bad("missing messages", CHAT, r#"{"model":"m"}"#.into(), parse_error("Invalid JSON data: missing field `messages`")),
        bad("model type", CHAT, r#"{"model":5,"messages":[]}"#.into(), parse_error("Invalid JSON data: model: invalid type: integer `5`, expected a string")),
        bad("messages type", CHAT, r#"{"model":"m","messages":"hi"}"#.into(), parse_error("Invalid JSON data: messages: invalid type: string, expected a sequence")),
        bad("temperature type", CHAT, c(r#","temperature":"hot""#), parse_error("Invalid JSON data: temperature: invalid type: string, expected a number")),
        ok("plain", CHAT, c("")),
        // --- messages
        bad("messages empty", CHAT, msgs("m", "[]", ""), invalid("messages cannot be empty")),
        bad("user content empty", CHAT, msgs("m", r#"[{"role":"user","content":""}]"#, ""), invalid("message content cannot be empty")),
        bad("user parts empty", CHAT, msgs("m", r#"[{"role":"user","content":[]}]"#, ""), invalid("message content parts cannot be empty")),
        ok("user parts", CHAT, msgs("m", r#"[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"hologram","x":1}]}]"#, "")),
        bad("user content missing", CHAT, msgs("m", r#"[{"role":"user"}]"#, ""), parse_error("Invalid JSON data: messages[0]: missing field `content`")),
        bad("part not object", CHAT, msgs("m", r#"[{"role":"user","content":["hi"]}]"#, ""), parse_error("Invalid JSON data: messages[0].content[0]: invalid type: string, expected a content part object")),
        bad("unknown role", CHAT, msgs("m", r#"[{"role":"wizard","content":"hi"}]"#, ""), parse_error("Invalid JSON data: messages[0]: unknown variant `wizard`, expected one of `system`, `developer`, `user`, `assistant`, `tool`, `function`, `root`")),
        bad("missing role", CHAT, msgs("m", r#"[{"content":"hi"}]"#, ""), parse_error("Invalid JSON data: messages[0]: missing field `role`")),
        ok("system without content", CHAT, msgs("m", r#"[{"role":"system"},{"role":"user","content":"hi"}]"#, "")),
        ok("assistant null content", CHAT, msgs("m", r#"[{"role":"user","content":"hi"},{"role":"assistant","content":null}]"#, "")),
        ok("tool with id", CHAT, msgs("m", r#"[{"role":"user","content":"hi"},{"role":"tool","tool_call_id":"c1","content":"ok"}]"#, "")),
        bad("tool without id", CHAT, msgs("m", r#"[{"role":"user","content":"hi"},{"role":"tool","content":"ok"}]"#, ""), parse_error("Invalid JSON data: messages[1]: missing field `tool_call_id`")),
        bad("root on baseline", CHAT, msgs("m", root, ""), invalid("__all__: invalid role: root")),
        ok("root on minimax", CHAT, msgs("MiniMax-M3", root, "")),
        // --- temperature, top_p, n, penalties
        ok("temperature 0", CHAT, c(r#","temperature":0"#)),
        ok("temperature 2", CHAT, c(r#","temperature":2.0"#)),
        bad("temperature 2.5", CHAT, c(r#","temperature":2.5"#), invalid("temperature must be between 0 and 2")),
        bad("temperature -0.1", CHAT, c(r#","temperature":-0.1"#), invalid("temperature must be between 0 and 2")),
        ok("top_p 1", CHAT, c(r#","top_p":1"#)),
        bad("top_p 0", CHAT, c(r#","top_p":0"#), top_p_msg.clone()),
        bad("top_p 1.01", CHAT, c(r#","top_p":1.01"#), top_p_msg.clone()),
        ok("n 10", CHAT, c(r#","n":10"#)),
        bad("n 0", CHAT, c(r#","n":0"#), invalid("n must be between 1 and 10")),
        bad("n 11", CHAT, c(r#","n":11"#), invalid("n must be between 1 and 10")),
        bad("n -1", CHAT, c(r#","n":-1"#), parse_error("Invalid JSON data: n: invalid value: integer `-1`, expected u32")),
        bad("n 1.5", CHAT, c(r#","n":1.5"#), parse_error("Invalid JSON data: n: invalid type: floating point `1.5`, expected u32")),
        ok("presence -2", CHAT, c(r#","presence_penalty":-2"#)),
        bad("presence 2.5", CHAT, c(r#","presence_penalty":2.5"#), invalid("presence_penalty must be between -2 and 2")),
        ok("frequency 2", CHAT, c(r#","frequency_penalty":2"#)),
        bad("frequency -2.1", CHAT, c(r#","frequency_penalty":-2.1"#), invalid("frequency_penalty must be between -2 and 2")),
        ok("repetition 2", CHAT, c(r#","repetition_penalty":2"#)),
        bad("repetition 2.1", CHAT, c(r#","repetition_penalty":2.1"#), invalid("repetition_penalty must be between 0 and 2")),
        bad("repetition -0.5", CHAT, c(r#","repetition_penalty":-0.5"#), invalid("repetition_penalty must be between 0 and 2")),
        ok("min_p 1", CHAT, c(r#","min_p":1"#)),
        bad("min_p 1.5", CHAT, c(r#","min_p":1.5"#), invalid("min_p must be between 0 and 1")),
        ok("top_k -1", CHAT, c(r#","top_k":-1"#)),
        ok("top_k 40", CHAT, c(r#","top_k":40"#)),
        bad("top_k 0", CHAT, c(r#","top_k":0"#), invalid("top_k must be -1 (disabled) or at least 1")),
        bad("top_k -2", CHAT, c(r#","top_k":-2"#), invalid("top_k must be -1 (disabled) or at least 1")),
        // --- logprobs
        ok("top_logprobs 20", CHAT, c(r#","logprobs":true,"top_logprobs":20"#)),
        bad("top_logprobs 21", CHAT, c(r#","logprobs":true,"top_logprobs":21"#), invalid("top_logprobs must be between 0 and 20")),
        bad("top_logprobs no logprobs", CHAT, c(r#","top_logprobs":5"#), invalid("__all__: top_logprobs is only allowed when logprobs is enabled")),
        bad("top_logprobs logprobs false", CHAT, c(r#","logprobs":false,"top_logprobs":5"#), invalid("__all__: top_logprobs is only allowed when logprobs is enabled")),
        // --- token limits
        ok("min <= max_completion", CHAT, c(r#","min_tokens":5,"max_completion_tokens":10"#)),
        bad("min > max_completion", CHAT, c(r#","min_tokens":20,"max_completion_tokens":10"#), invalid("__all__: min_tokens cannot exceed max_tokens/max_completion_tokens")),
        bad("min > migrated max_tokens", CHAT, c(r#","min_tokens":20,"max_tokens":10"#), invalid("__all__: min_tokens cannot exceed max_tokens/max_completion_tokens")),
        ok("max_completion wins over max_tokens", CHAT, c(r#","min_tokens":20,"max_tokens":10,"max_completion_tokens":30"#)),
        ok("min_tokens 0", CHAT, c(r#","min_tokens":0"#)),
        ok("max_tokens 1", CHAT, c(r#","max_tokens":1"#)),
        bad("max_tokens 0", CHAT, c(r#","max_tokens":0"#), invalid("max_tokens must be at least 1")),
        bad("max_completion_tokens 0", CHAT, c(r#","max_completion_tokens":0"#), invalid("max_completion_tokens must be at least 1")),
        // --- stop
        ok("stop string", CHAT, c(r#","stop":"x""#)),
        ok("stop 4", CHAT, c(r#","stop":["a","b","c","d"]"#)),
        bad("stop 5", CHAT, c(r#","stop":["a","b","c","d","e"]"#), invalid("maximum 4 stop sequences allowed")),
        bad("stop empty string", CHAT, c(r#","stop":"""#), invalid("stop sequences cannot be empty")),
        bad("stop empty item", CHAT, c(r#","stop":["a",""]"#), invalid("stop sequences cannot be empty")),
        bad("stop number", CHAT, c(r#","stop":[1]"#), parse_error("Invalid JSON data: stop: invalid type: integer `1`, expected a string")),
        // --- stream_options
        ok("stream_options with stream", CHAT, c(r#","stream":true,"stream_options":{"include_usage":true,"step_usage_chunks":4}"#)),
        bad("stream_options without stream", CHAT, c(r#","stream_options":{"include_usage":true}"#), stream_opts.clone()),
        bad("stream_options stream false", CHAT, c(r#","stream":false,"stream_options":{}"#), stream_opts.clone()),
        bad("include_usage type", CHAT, c(r#","stream":true,"stream_options":{"include_usage":"yes"}"#), parse_error("Invalid JSON data: stream_options.include_usage: invalid type: string, expected a boolean")),
        // --- tool_choice
        ok("tool_choice none without tools", CHAT, c(r#","tool_choice":"none""#)),
        ok("tool_choice auto without tools", CHAT, c(r#","tool_choice":"auto""#)),
        bad("tool_choice required without tools", CHAT, c(r#","tool_choice":"required""#), needs_tools.clone()),
        bad("tool_choice required empty tools", CHAT, c(r#","tools":[],"tool_choice":"required""#), needs_tools.clone()),
        ok("tool_choice required with tools", CHAT, c(&format!(r#"{TOOLS},"tool_choice":"required""#))),
        ok("tool_choice named", CHAT, c(&format!(r#"{TOOLS},"tool_choice":{{"type":"function","function":{{"name":"get_weather"}}}}"#))),
        bad("tool_choice named missing", CHAT, c(&format!(r#"{TOOLS},"tool_choice":{{"type":"function","function":{{"name":"nope"}}}}"#)), invalid("__all__: Invalid value for 'tool_choice': function 'nope' not found in 'tools'.")),
        bad("tool_choice named without tools", CHAT, c(r#","tool_choice":{"type":"function","function":{"name":"nope"}}"#), needs_tools.clone()),
        ok("allowed_tools auto", CHAT, c(&format!(r#"{TOOLS},"tool_choice":{{"type":"allowed_tools","mode":"auto","tools":[{{"type":"function","function":{{"name":"get_weather"}}}}]}}"#))),
        ok("allowed_tools required flat", CHAT, c(&format!(r#"{TOOLS},"tool_choice":{{"type":"allowed_tools","mode":"required","tools":[{{"type":"function","name":"get_weather"}}]}}"#))),
        bad("allowed_tools mode", CHAT, c(&format!(r#"{TOOLS},"tool_choice":{{"type":"allowed_tools","mode":"sometimes","tools":[]}}"#)), invalid("__all__: Invalid value for 'tool_choice.mode': must be 'auto' or 'required', got 'sometimes'.")),
        bad("allowed_tools missing tool", CHAT, c(&format!(r#"{TOOLS},"tool_choice":{{"type":"allowed_tools","mode":"auto","tools":[{{"type":"function","name":"nope"}}]}}"#)), invalid("__all__: Invalid value for 'tool_choice.tools': tool 'nope' not found in 'tools'.")),
        bad("allowed_tools non-function", CHAT, c(&format!(r#"{TOOLS},"tool_choice":{{"type":"allowed_tools","mode":"auto","tools":[{{"type":"mcp","name":"x"}}]}}"#)), invalid("__all__: Invalid value for 'tool_choice.tools': Chat Completion API only supports function tools, got 'mcp'.")),
        bad("tool_choice unknown", CHAT, c(&format!(r#"{TOOLS},"tool_choice":"maybe""#)), parse_error("Invalid JSON data: tool_choice: unknown variant `maybe`, expected one of `none`, `auto`, `required`")),
        bad("tool without function", CHAT, c(r#","tools":[{"type":"function"}]"#), parse_error("Invalid JSON data: tools[0]: missing field `function`")),
        // --- response_format and constraints
        ok("json_object", CHAT, c(r#","response_format":{"type":"json_object"}"#)),
        ok("json_schema", CHAT, c(r#","response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"},"strict":true}}"#)),
        ok("json_schema empty schema", CHAT, c(r#","response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}}"#)),
        bad("json_schema empty name", CHAT, c(r#","response_format":{"type":"json_schema","json_schema":{"name":"","schema":{}}}"#), invalid("__all__: JSON schema name cannot be empty")),
        bad("json_schema string schema", CHAT, c(r#","response_format":{"type":"json_schema","json_schema":{"name":"x","schema":"{}"}}"#), invalid("__all__: response_format.json_schema.schema must be a JSON object")),
        bad("json_schema array schema", CHAT, c(r#","response_format":{"type":"json_schema","json_schema":{"name":"x","schema":[]}}"#), invalid("__all__: response_format.json_schema.schema must be a JSON object")),
        bad("json_schema null schema", CHAT, c(r#","response_format":{"type":"json_schema","json_schema":{"name":"x","schema":null}}"#), invalid("__all__: response_format.json_schema.schema must be a JSON object")),
        bad("json_schema missing name", CHAT, c(r#","response_format":{"type":"json_schema","json_schema":{"schema":{}}}"#), parse_error("Invalid JSON data: missing field `response_format.json_schema.name`")),
        bad("response_format unknown", CHAT, c(r#","response_format":{"type":"yaml"}"#), parse_error("Invalid JSON data: response_format.type: unknown variant `yaml`, expected one of `text`, `json_object`, `json_schema`")),
        ok("regex alone", CHAT, c(r#","regex":"a+""#)),
        ok("ebnf alone", CHAT, c(r#","ebnf":"root ::= x""#)),
        ok("regex with text format", CHAT, c(r#","regex":"a+","response_format":{"type":"text"}"#)),
        bad("regex + ebnf", CHAT, c(r#","regex":"a+","ebnf":"root ::= x""#), one_constraint.clone()),
        bad("regex + json_object", CHAT, c(r#","regex":"a+","response_format":{"type":"json_object"}"#), invalid("__all__: cannot use regex constraint with JSON response format")),
        bad("ebnf + json_schema", CHAT, c(r#","ebnf":"x","response_format":{"type":"json_schema","json_schema":{"name":"x"}}"#), invalid("__all__: cannot use EBNF constraint with JSON response format")),
        // --- thinking and reasoning_effort (baseline)
        ok("thinking adaptive baseline", CHAT, c(r#","thinking":{"type":"adaptive","effort":"high","keep":"all"}"#)),
        bad("thinking type unknown", CHAT, c(r#","thinking":{"type":"sometimes"}"#), parse_error("Invalid JSON data: thinking.type: unknown variant `sometimes`, expected one of `enabled`, `disabled`, `adaptive`")),
        ok("reasoning_effort number", CHAT, c(r#","reasoning_effort":5"#)),
        bad("reasoning_effort array", CHAT, c(r#","reasoning_effort":[]"#), parse_error("Invalid JSON data: reasoning_effort: invalid type: sequence, expected a string or a number")),
        // --- completions
        ok("completion plain", COMP, p("")),
        ok("completion prompt array", COMP, p(r#","prompt2":1"#).replace(r#""prompt":"hi""#, r#""prompt":["a","b"]"#)),
        bad("completion prompt empty", COMP, r#"{"model":"m","prompt":[]}"#.into(), invalid("prompt array cannot be empty")),
        bad("completion prompt missing", COMP, r#"{"model":"m"}"#.into(), parse_error("Invalid JSON data: missing field `prompt`")),
        bad("completion prompt type", COMP, r#"{"model":"m","prompt":{}}"#.into(), parse_error("Invalid JSON data: prompt: invalid type: map, expected a string or an array of prompts")),
        ok("completion n 128", COMP, p(r#","n":128"#)),
        bad("completion n 129", COMP, p(r#","n":129"#), invalid("n must be between 1 and 128")),
        ok("completion best_of > n", COMP, p(r#","best_of":3,"n":2"#)),
        bad("completion best_of <= n", COMP, p(r#","best_of":2,"n":2"#), invalid("__all__: best_of must be greater than n")),
        bad("completion best_of 21", COMP, p(r#","best_of":21"#), invalid("best_of must be between 0 and 20")),
        bad("completion best_of stream", COMP, p(r#","best_of":3,"stream":true"#), invalid("__all__: best_of is not supported when stream is enabled")),
        ok("completion logprobs 5", COMP, p(r#","logprobs":5"#)),
        bad("completion logprobs 6", COMP, p(r#","logprobs":6"#), invalid("logprobs must be between 0 and 5")),
        ok("completion min <= max", COMP, p(r#","min_tokens":5,"max_tokens":5"#)),
        bad("completion min > max", COMP, p(r#","min_tokens":6,"max_tokens":5"#), invalid("__all__: min_tokens cannot exceed max_tokens")),
        bad("completion regex + json_schema", COMP, p(r#","regex":"a","json_schema":"{}""#), one_constraint.clone()),
        ok("completion json_schema alone", COMP, p(r#","json_schema":"{}""#)),
        bad("completion stream_options", COMP, p(r#","stream_options":{"include_usage":true}"#), stream_opts.clone()),
        ok("completion stream_options", COMP, p(r#","stream":true,"stream_options":{"include_usage":true}"#)),
        bad("completion temperature", COMP, p(r#","temperature":3"#), invalid("temperature must be between 0 and 2")),
        bad("completion top_p", COMP, p(r#","top_p":0"#), top_p_msg.clone()),
        bad("completion stop", COMP, p(r#","stop":["a","b","c","d","e"]"#), invalid("maximum 4 stop sequences allowed")),
        bad("completion top_k", COMP, p(r#","top_k":0"#), invalid("top_k must be -1 (disabled) or at least 1")),
        // --- Kimi
        bad("kimi root", CHAT, msgs("moonshotai/Kimi-K2-Instruct", root, ""), invalid("__all__: invalid role: root")),
        bad("kimi tools on user", CHAT, msgs("kimi-k2", r#"[{"role":"user","content":"hi","tools":[]}]"#, ""), invalid("__all__: 'tools' on a message with role 'user' is not allowed")),
        bad("kimi tools on assistant", CHAT, msgs("kimi-k2", r#"[{"role":"user","content":"hi"},{"role":"assistant","content":"x","tools":"x"}]"#, ""), invalid("__all__: 'tools' on a message with role 'assistant' is not allowed")),
        ok("kimi null tools on user", CHAT, msgs("kimi-k2", r#"[{"role":"user","content":"hi","tools":null}]"#, "")),
        ok("kimi system tools", CHAT, sys_tools("kimi-k2", r#""""#, r#"[{"type":"function","function":{"name":"get_time"}}]"#, "")),
        ok("kimi developer tools without content", CHAT, msgs("kimi-k2", r#"[{"role":"developer","tools":[{"type":"function","function":{"name":"t"}}]},{"role":"user","content":"hi"}]"#, "")),
        bad("kimi tools malformed", CHAT, sys_tools("kimi-k2", r#""""#, r#""x""#, ""), invalid("__all__: 'tools' on a message with role 'system' must be a list of tool declarations")),
        bad("kimi tools malformed item", CHAT, sys_tools("kimi-k2", r#""""#, "[{}]", ""), invalid("__all__: 'tools' on a message with role 'system' must be a list of tool declarations")),
        bad("kimi tools with content", CHAT, sys_tools("kimi-k2", r#""be brief""#, r#"[{"type":"function","function":{"name":"t"}}]"#, ""), invalid("__all__: 'tools' on a message with role 'system' requires empty content")),
        ok("kimi empty tools with content", CHAT, sys_tools("kimi-k2", r#""be brief""#, "[]", "")),
        bad("kimi tool type", CHAT, sys_tools("kimi-k2", r#""""#, r#"[{"type":"retrieval","function":{"name":"t"}}]"#, ""), invalid("__all__: messages[0].tools[0]: tool type must be 'function'")),
        bad("kimi tool name", CHAT, sys_tools("kimi-k2", r#""""#, r#"[{"type":"function","function":{"name":"1bad"}}]"#, ""), invalid("__all__: messages[0].tools[0]: tool name must match [A-Za-z_][A-Za-z0-9_]* and be at most 256 characters")),
        bad("kimi tool name long", CHAT, sys_tools("kimi-k2", r#""""#, &format!(r#"[{{"type":"function","function":{{"name":"{}"}}}}]"#, "a".repeat(257)), ""), invalid("__all__: messages[0].tools[0]: tool name must match [A-Za-z_][A-Za-z0-9_]* and be at most 256 characters")),
        bad("kimi tool name duplicate", CHAT, sys_tools("kimi-k2", r#""""#, r#"[{"type":"function","function":{"name":"get_weather"}}]"#, TOOLS), invalid("__all__: messages[0].tools[0]: duplicate tool name 'get_weather'")),
        ok("kimi declared tools satisfy tool_choice", CHAT, sys_tools("kimi-k2", r#""""#, r#"[{"type":"function","function":{"name":"t"}}]"#, r#","tool_choice":{"type":"function","function":{"name":"t"}}"#)),
        bad("baseline declared tools do not count", CHAT, sys_tools("gpt-4o", r#""""#, r#"[{"type":"function","function":{"name":"t"}}]"#, r#","tool_choice":"required""#), needs_tools.clone()),
        // --- Kimi K3
        ok("k3 temperature 0.6", CHAT, chat_for("kimi-k3", r#","temperature":0.6"#)),
        bad("k3 temperature 0.7", CHAT, chat_for("kimi-k3", r#","temperature":0.7"#), k3_pinned("temperature", "0, 0.6 or 1")),
        ok("k3 top_p 0.95", CHAT, chat_for("/models/Kimi-K3", r#","top_p":0.95"#)),
        bad("k3 top_p 0.9", CHAT, chat_for("kimi_k3", r#","top_p":0.9"#), k3_pinned("top_p", "0.95")),
        ok("k3 presence 0", CHAT, chat_for("kimi-k3", r#","presence_penalty":0"#)),
        bad("k3 presence 0.5", CHAT, chat_for("kimi-k3", r#","presence_penalty":0.5"#), k3_pinned("presence_penalty", "0")),
        bad("k3 frequency 0.1", CHAT, chat_for("kimi-k3", r#","frequency_penalty":0.1"#), k3_pinned("frequency_penalty", "0")),
        ok("k3 n 1", CHAT, chat_for("kimi-k3", r#","n":1"#)),
        bad("k3 n 2", CHAT, chat_for("kimi-k3", r#","n":2"#), k3_pinned("n", "1")),
        bad("k3 adaptive", CHAT, chat_for("kimi-k3", r#","thinking":{"type":"adaptive"}"#), k3_pinned("thinking.type", "enabled or disabled")),
        ok("k3 effort max", CHAT, chat_for("kimi-k3", r#","thinking":{"type":"enabled","effort":"max"}"#)),
        bad("k3 effort medium", CHAT, chat_for("kimi-k3", r#","thinking":{"effort":"medium"}"#), k3_pinned("thinking.effort", "low, high or max")),
        ok("k2 keeps openai ranges", CHAT, chat_for("kimi-k2", r#","temperature":0.7,"n":3,"thinking":{"type":"adaptive"}"#)),
        // --- MiniMax
        ok("minimax history", CHAT, history("MiniMax-M3", &format!("[{},{}]", call("c1", r#""{\"a\":1}""#), call("c2", r#""""#)), &(answer("c1") + &answer("c2")))),
        bad("minimax duplicate id", CHAT, history("MiniMax-M3", &format!("[{},{}]", call("c1", r#""{}""#), call("c1", r#""{}""#)), &answer("c1")), invalid("__all__: duplicate tool_call id 'c1'")),
        bad("minimax unknown id", CHAT, history("minimax/MiniMax-M2", &format!("[{}]", call("c1", r#""{}""#)), &answer("c9")), invalid("__all__: tool message references unknown tool_call id 'c9'")),
        bad("minimax args not json", CHAT, history("MiniMax-M3", &format!("[{}]", call("c1", r#""{bad""#)), &answer("c1")), invalid("__all__: tool_call 'c1' arguments must be empty or a JSON object")),
        bad("minimax args not object", CHAT, history("abab6.5s-chat", &format!("[{}]", call("c1", r#""42""#)), &answer("c1")), invalid("__all__: tool_call 'c1' arguments must be empty or a JSON object")),
        bad("minimax unanswered", CHAT, history("MiniMax-M3", &format!("[{},{}]", call("c1", r#""{}""#), call("c2", r#""{}""#)), &answer("c1")), invalid("__all__: tool_call 'c2' has no matching tool message")),
        ok("baseline ignores history", CHAT, history("gpt-4o", &format!("[{},{}]", call("c1", r#""{bad""#), call("c1", r#""{}""#)), "")),
        // --- z.ai
        ok("zai disabled", CHAT, chat_for("zai-org/GLM-4.5", r#","thinking":{"type":"disabled"},"reasoning_effort":"none""#)),
        bad("zai adaptive", CHAT, chat_for("zai-org/GLM-4.5", r#","thinking":{"type":"adaptive"}"#), k3_pinned("thinking.type", "enabled or disabled")),
        bad("zai reasoning_effort", CHAT, chat_for("glm-4.5", r#","reasoning_effort":"turbo""#), k3_pinned("reasoning_effort", zai_efforts)),
        bad("zai shadowed effort", CHAT, chat_for("z-ai/glm-4.5", r#","thinking":{"effort":"turbo"},"reasoning_effort":"low""#), k3_pinned("thinking.effort", zai_efforts)),
        bad("zai numeric effort", CHAT, chat_for("glm-4.5", r#","reasoning_effort":5"#), k3_pinned("reasoning_effort", zai_efforts)),
        bad("zai tool type", CHAT, chat_for("glm-4.5", r#","tools":[{"type":"retrieval","function":{"name":"x"}}]"#), invalid("__all__: invalid tools[].type 'retrieval': only 'function' is supported")),
        ok("zai function tool", CHAT, chat_for("glm-4.5", TOOLS)),
        bad("zai file_url", CHAT, msgs("glm-4.5", r#"[{"role":"user","content":[{"type":"file_url","file_url":{"url":"https://a/f.txt"}}]}]"#, ""), invalid("__all__: file_url content blocks are not supported")),
        ok("zai image part", CHAT, msgs("glm-4.5", r#"[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://a/1.png"}}]}]"#, "")),
        bad("glm53 disabled", CHAT, chat_for("GLM-5.3-Flash", r#","thinking":{"type":"disabled"}"#), invalid("__all__: thinking cannot be disabled for this model")),
        bad("glm53 adaptive", CHAT, chat_for("zai-org/glm5.3", r#","thinking":{"type":"adaptive"}"#), k3_pinned("thinking.type", "enabled")),
        ok("glm53 high", CHAT, chat_for("glm-5.3", r#","reasoning_effort":"high""#)),
        bad("glm53 medium", CHAT, chat_for("glm-5-3-air", r#","reasoning_effort":"medium""#), k3_pinned("reasoning_effort", "low, high or max")),
        ok("glm-5.30 is not glm53", CHAT, chat_for("glm-5.30", r#","thinking":{"type":"disabled"}"#)),
        // --- DeepSeek V4
        bad("deepseek override type", CHAT, chat_for(ds, r#","chat_template_kwargs":{"thinking":"yes"}"#), invalid("__all__: DeepSeek thinking template overrides must be booleans or null")),
        bad("deepseek override conflict", CHAT, chat_for(ds, r#","chat_template_kwargs":{"thinking":true,"enable_thinking":false}"#), invalid("__all__: DeepSeek thinking and enable_thinking template overrides must agree")),
        ok("deepseek override agree", CHAT, chat_for(ds, r#","chat_template_kwargs":{"thinking":true,"enable_thinking":true}"#)),
        bad("deepseek adaptive", CHAT, chat_for(ds, r#","thinking":{"type":"adaptive"}"#), invalid("__all__: thinking.type must be enabled or disabled for DeepSeek V4")),
        bad("deepseek effort", CHAT, chat_for(ds, r#","reasoning_effort":"turbo""#), ds_v4.clone()),
        bad("deepseek shadowed effort", CHAT, chat_for("deepseek-flash", r#","thinking":{"effort":"low"},"reasoning_effort":"50""#), ds_v4.clone()),
        ok("deepseek v4.1 budget", CHAT, chat_for(ds41, r#","reasoning_effort":"50""#)),
        ok("deepseek v4.1 numeric budget", CHAT, chat_for(ds41, r#","reasoning_effort":50"#)),
        bad("deepseek v4.1 budget 101", CHAT, chat_for(ds41, r#","reasoning_effort":"101""#), ds_v41.clone()),
        bad("deepseek forced tool choice", CHAT, chat_for(ds, &format!(r#"{TOOLS},"tool_choice":"required""#)), invalid("__all__: DeepSeek V4 requires thinking to be disabled for forced tool choice")),
        ok("deepseek forced, thinking off", CHAT, chat_for(ds, &format!(r#"{TOOLS},"tool_choice":"required","thinking":{{"type":"disabled"}}"#))),
        ok("deepseek forced, effort none", CHAT, chat_for(ds, &format!(r#"{TOOLS},"tool_choice":"required","reasoning_effort":"none""#))),
        ok("deepseek auto tool choice", CHAT, chat_for(ds, &format!(r#"{TOOLS},"tool_choice":"auto""#))),
        // --- selection
        bad("selection segment", CHAT, msgs("openrouter/moonshotai/kimi-k2", r#"[{"role":"user","content":"hi","tools":[]}]"#, ""), invalid("__all__: 'tools' on a message with role 'user' is not allowed")),
        bad("selection alias is baseline", CHAT, msgs("my-minimax-alias", root, ""), invalid("__all__: invalid role: root")),
        ok("chatglm is baseline", CHAT, chat_for("THUDM/chatglm3-6b", r#","thinking":{"type":"adaptive"},"reasoning_effort":"turbo""#)),
        ok("deepseek v3 is baseline", CHAT, chat_for("deepseek-ai/DeepSeek-V3", r#","thinking":{"type":"adaptive"}"#)),
    ]
}

#[test]
fn golden_table() {
    let aliases = Aliases::default();
    let cases = cases();
    assert!(cases.len() > 150, "{} cases", cases.len());
    let mut failures = Vec::new();
    for (name, ep, body, expected) in &cases {
        let got = inspect(*ep, body.as_bytes(), true, &aliases);
        let got = got.map_err(|e| String::from_utf8(e.body()).unwrap_or_default());
        match (expected, &got) {
            (None, Ok(_)) => {}
            (Some(want), Err(have)) if want == have => {}
            _ => failures.push(format!("{name}: body {body}\n  want {expected:?}\n  got  {got:?}")),
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn missing_content_type() {
    let err = inspect(CHAT, c("").as_bytes(), false, &Aliases::default()).unwrap_err();
    assert_eq!(String::from_utf8(err.body()).unwrap(), parse_error("Missing Content-Type: application/json header"));
    assert_eq!(err.status(), 400);
}

#[test]
fn every_golden_error_body_is_json_with_the_right_code_type() {
    for (name, ep, body, expected) in cases() {
        let Some(expected) = expected else { continue };
        let v: sonic_rs::Value = sonic_rs::from_str(&expected).expect(name);
        let code = &v["error"]["code"];
        let got = inspect(ep, body.as_bytes(), true, &Aliases::default()).unwrap_err();
        match got {
            super::super::ContractError::JsonParse(_) => assert_eq!(code.as_str(), Some("json_parse_error"), "{name}"),
            super::super::ContractError::Invalid(_) => assert_eq!(code.as_u64(), Some(400), "{name}"),
        }
    }
}
