//! Provider profiles: vendor contracts selected from the model id as sent (before aliasing).
//!
//! Each profile adds validation rules and rewrites on top of the OpenAI baseline for
//! `/v1/chat/completions` only. Rewrites are byte splices (see [`super::span`]).

mod compare;
mod deepseek;
mod kimi;
mod minimax;
mod zai;

use super::chat::Chat;
use super::error::ContractError;
use super::fields::Result;
use super::messages::Role;
use super::span::{apply, Edits};
use super::tools::Tool;

use compare::starts_with_ci;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Profile {
    /// OpenAI baseline: no rules beyond the core ones, and no `root` role.
    OpenAi,
    /// Kimi / Moonshot; `k3` adds the pinned sampling and thinking contract.
    Kimi { k3: bool },
    /// MiniMax: `root` messages and strict tool-call history.
    Minimax,
    /// z.ai GLM; `glm53` cannot disable thinking, `sampling_defaults` names the models with
    /// vendor temperature / top_p defaults.
    Zai { glm53: bool, sampling_defaults: bool },
    /// DeepSeek V4 / V4.1 (`v41`).
    DeepSeek { v41: bool },
}

// === impl Profile ===

impl Profile {
    /// The first `/`-separated segment that starts with a marker (ignoring case) decides.
    pub fn select(model: &str) -> Profile {
        for segment in model.split('/') {
            if deepseek::matches_segment(segment) {
                return Profile::DeepSeek { v41: deepseek::is_v41(model) };
            }
            if starts_with_ci(segment, "kimi") || starts_with_ci(segment, "moonshot") {
                return Profile::Kimi { k3: kimi::is_k3(model) };
            }
            if starts_with_ci(segment, "minimax") || starts_with_ci(segment, "abab") {
                return Profile::Minimax;
            }
            if starts_with_ci(segment, "glm") || starts_with_ci(segment, "zai") || starts_with_ci(segment, "z-ai") {
                return Profile::Zai {
                    glm53: zai::is_glm53(model),
                    sampling_defaults: zai::has_sampling_defaults(model),
                };
            }
        }
        Profile::OpenAi
    }

    pub fn name(self) -> &'static str {
        match self {
            Profile::OpenAi => "openai",
            Profile::Kimi { .. } => "kimi",
            Profile::Minimax => "minimax",
            Profile::Zai { .. } => "zai",
            Profile::DeepSeek { .. } => "deepseek",
        }
    }

    pub fn is_kimi(self) -> bool {
        matches!(self, Profile::Kimi { .. })
    }

    /// Tools messages may declare on top of `tools` (Kimi's system/developer tools).
    pub fn declared_tools<'a>(self, chat: &Chat<'a>) -> Vec<Tool<'a>> {
        match self {
            Profile::Kimi { .. } => kimi::declared_tools(chat),
            _ => Vec::new(),
        }
    }

    /// The profile's validation rules, run after the core rules.
    pub fn validate(self, chat: &Chat<'_>) -> Result<()> {
        if self != Profile::Minimax && chat.messages.iter().any(|m| m.role == Role::Root) {
            return Err(ContractError::rule("invalid role: root"));
        }
        match self {
            Profile::OpenAi => Ok(()),
            Profile::Kimi { k3 } => kimi::validate(chat, k3),
            Profile::Minimax => minimax::validate(chat),
            Profile::Zai { glm53, .. } => zai::validate(chat, glm53),
            Profile::DeepSeek { v41 } => deepseek::validate(chat, v41),
        }
    }

    /// The profile's defaults and rewrites, plus dropping other profiles' message fields.
    pub fn rewrite(self, chat: &Chat<'_>, edits: &mut Edits, warnings: &mut Vec<String>) {
        rewrite_messages(self, chat, edits, warnings);
        match self {
            Profile::OpenAi | Profile::Minimax => {}
            Profile::Kimi { k3 } => kimi::rewrite(chat, k3, edits),
            Profile::Zai { sampling_defaults, .. } => zai::rewrite(chat, sampling_defaults, edits),
            Profile::DeepSeek { v41 } => deepseek::rewrite(chat, v41, edits),
        }
    }
}

/// Message-level rewrites: another profile's message `tools` are dropped (one warning per
/// request), and MiniMax's `root` messages move, in order, to the front as `system`.
fn rewrite_messages(profile: Profile, chat: &Chat<'_>, edits: &mut Edits, warnings: &mut Vec<String>) {
    let doc = &chat.doc;
    let mut inner = Edits::default();
    if !profile.is_kimi() {
        let mut roles: Vec<&'static str> = Vec::new();
        let mut dropped = 0;
        for m in &chat.messages {
            let Some(key) = m.tools_key else { continue };
            if !matches!(m.role, Role::System | Role::User | Role::Assistant | Role::Developer) {
                continue;
            }
            inner.remove_member(doc, m.obj, key);
            if !doc.is_null(key + 1) {
                dropped += 1;
                roles.push(m.role.name());
            }
        }
        if dropped > 0 {
            roles.sort_unstable();
            roles.dedup();
            // Bounded: counts and distinct role names only, never client text beyond the model id.
            let model: String = chat.model_name.chars().take(256).collect();
            warnings.push(format!(
                "dropped message extensions that belong to another provider's profile: model={model} profile={} dropped={dropped} roles={}",
                profile.name(),
                roles.join(",")
            ));
        }
    }
    let roots: Vec<usize> = (0..chat.messages.len()).filter(|&i| chat.messages[i].role == Role::Root).collect();
    if profile == Profile::Minimax {
        for &i in &roots {
            inner.replace(doc, chat.messages[i].role_value, b"\"system\"");
        }
    }
    let inner = inner.finish();
    let already_first = roots.iter().enumerate().all(|(pos, &i)| pos == i);
    if profile != Profile::Minimax || already_first {
        edits.extend(inner);
        return;
    }
    // Reorder: one splice over the elements, each rebuilt from its own bytes and inner edits.
    let order = roots.iter().copied().chain((0..chat.messages.len()).filter(|i| !roots.contains(i)));
    let span = |i: usize| {
        let n = doc.node(chat.messages[i].obj);
        (n.start as usize, n.end as usize)
    };
    let mut text = Vec::new();
    for (pos, i) in order.enumerate() {
        if pos > 0 {
            text.push(b',');
        }
        let (start, end) = span(i);
        let local: Vec<_> = inner
            .iter()
            .filter(|s| s.start >= start && s.end <= end)
            .map(|s| super::span::Splice { start: s.start - start, end: s.end - start, text: s.text.clone() })
            .collect();
        text.extend_from_slice(&apply(&doc.src[start..end], &local));
    }
    let (first, _) = span(0);
    let (_, last) = span(chat.messages.len() - 1);
    edits.push(first, last, text);
}
