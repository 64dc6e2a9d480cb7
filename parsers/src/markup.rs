//! The other direction: a reasoning block or a tool call written in a family's markup, as the
//! family's model writes it. The simulator (smg-sim) answers with it so gateway tests and
//! users' sweeps drive parser traffic, and the benches and tests feed it to the parsers.

/// `reasoning` in the think block of reasoning family `name`, then `answer`. None for a
/// family this module cannot write.
pub fn reasoning(name: &str, reasoning: &str, answer: &str) -> Option<String> {
    let (open, close) = crate::reasoning::markers(name)?;
    Some(format!("{open}{reasoning}{close}\n\n{answer}"))
}

/// One call of `function` with `args` (name, JSON value as text) in tool family `name`'s
/// markup; `index`: the call's position in the answer (Kimi K2 writes it). None for a family
/// this module cannot write.
pub fn call(name: &str, function: &str, args: &[(&str, &str)], index: usize) -> Option<String> {
    let object = || {
        let members: Vec<String> = args.iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
        format!("{{{}}}", members.join(", "))
    };
    // Markup whose values are bare text: a JSON string's contents unquoted, anything else as
    // written.
    let bare = |v: &str| -> String {
        match sonic_rs::from_str::<String>(v) {
            Ok(s) if v.trim_start().starts_with('"') => s,
            _ => v.to_string(),
        }
    };
    Some(match name {
        "qwen" => format!("<tool_call>\n{{\"name\": \"{function}\", \"arguments\": {}}}\n</tool_call>", object()),
        "qwen_coder" => {
            let params: String =
                args.iter().map(|(k, v)| format!("<parameter={k}>\n{}\n</parameter>\n", bare(v))).collect();
            format!("<tool_call>\n<function={function}>\n{params}</function>\n</tool_call>")
        }
        "deepseek" => format!(
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{function}\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            object()
        ),
        "deepseek31" => format!(
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{function}<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            object()
        ),
        "kimik2" => format!(
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.{function}:{index}<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
            object()
        ),
        "glm45_moe" => {
            let params: String =
                args.iter().map(|(k, v)| format!("<arg_key>{k}</arg_key>\n<arg_value>{}</arg_value>\n", bare(v))).collect();
            format!("<tool_call>{function}\n{params}</tool_call>")
        }
        "minimax_m2" => {
            let params: String = args
                .iter()
                .map(|(k, v)| format!("<parameter name=\"{k}\">{}</parameter>\n", bare(v)))
                .collect();
            format!("<minimax:tool_call>\n<invoke name=\"{function}\">\n{params}</invoke>\n</minimax:tool_call>")
        }
        "step3" => {
            let params: String = args
                .iter()
                .map(|(k, v)| format!("<steptml:parameter name=\"{k}\">{}</steptml:parameter>", bare(v)))
                .collect();
            format!(
                "<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"{function}\">{params}</steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>"
            )
        }
        "mistral" => format!("[TOOL_CALLS] [{{\"name\": \"{function}\", \"arguments\": {}}}]", object()),
        "llama" => format!("<|python_tag|>{{\"name\": \"{function}\", \"parameters\": {}}}", object()),
        "json" => format!("[{{\"name\": \"{function}\", \"parameters\": {}}}]", object()),
        "pythonic" => {
            // JSON literals as Python's.
            let py = |v: &str| match v {
                "true" => "True".to_string(),
                "false" => "False".to_string(),
                "null" => "None".to_string(),
                v => v.to_string(),
            };
            let params: Vec<String> = args.iter().map(|(k, v)| format!("{k}={}", py(v))).collect();
            format!("[{function}({})]", params.join(", "))
        }
        _ => return None,
    })
}

/// Whether a family's calls stand alone: its model writes no text around them (the parser
/// reads the whole answer as the call list).
pub fn stands_alone(name: &str) -> bool {
    matches!(name, "llama" | "json" | "pythonic")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::every_cut;
    use crate::{Call, Tool, Tools};

    fn tools() -> Tools {
        Tools::new(vec![Tool { name: "get_weather".into(), params: vec![("city".into(), "string".into())] }])
    }

    #[test]
    fn every_family_reads_back_what_is_written_in_its_markup() {
        let args: &[(&str, &str)] = &[("city", "\"東京 \\\"x\\\" 😀\"")];
        for &name in crate::tools::NAMES {
            let call = super::call(name, "get_weather", args, 0).unwrap();
            let text = if stands_alone(name) { call } else { format!("Sure.{call}") };
            let got = every_cut(|| crate::tools::by_name(name, tools()).unwrap(), &text);
            assert_eq!(got.calls.len(), 1, "{name}: {text:?} gave {got:?}");
            let Call { name: f, arguments } = &got.calls[0];
            assert_eq!(f, "get_weather", "{name}");
            let v: sonic_rs::Value = sonic_rs::from_str(arguments).unwrap();
            use sonic_rs::JsonValueTrait;
            assert_eq!(v["city"].as_str(), Some("東京 \"x\" 😀"), "{name}: {arguments}");
            let before = if stands_alone(name) { "" } else { "Sure." };
            assert_eq!(got.content, before, "{name}");
        }
        for &name in crate::reasoning::NAMES {
            let Some(text) = reasoning(name, "hmm 思考", "Yes.") else {
                assert_eq!(name, "passthrough");
                continue;
            };
            let got = every_cut(|| crate::reasoning::by_name(name, false).unwrap(), &text);
            assert_eq!((got.reasoning.as_str(), got.content.as_str()), ("hmm 思考", "\n\nYes."), "{name}");
        }
    }
}
