//! SGLang's System One API (`POST /v1/systemone`, SGLang 0.5.21's request and reply
//! shapes) on a simulated SGLang worker, and `/v1/decisions` on a simulated vLLM worker.
//!
//! Answers are deterministic so tests can check a gateway's mapping exactly: a `noul`
//! question gets 0.25; a question with n options gives option j the probability
//! (j+1)/(n(n+1)/2), so the last option is the most probable, and a `confidence` of 0.5.
//! `usage.input_tokens` is the state's length in bytes. A state containing `sim:bad-reply`
//! gets a 200 whose answers do not fit the questions; `sim:error` gets a 400 OpenAI error.
//! The vLLM route answers 200 with the request body byte for byte.

use sonic_rs::{JsonContainerTrait, JsonValueTrait};

use crate::sim::render::put_error_body;

/// (status, JSON body) for a System One request.
pub fn systemone(body: &[u8]) -> (u16, Vec<u8>) {
    let mut err = Vec::new();
    let Ok(v) = sonic_rs::from_slice::<sonic_rs::Value>(body) else {
        put_error_body(&mut err, 400, "invalid JSON");
        return (400, err);
    };
    let state = v["state"].as_str().unwrap_or("");
    if state.contains("sim:error") {
        put_error_body(&mut err, 400, "simulated System One refusal");
        return (400, err);
    }
    let Some(questions) = v["questions"].as_object() else {
        put_error_body(&mut err, 400, "questions must be an object");
        return (400, err);
    };
    let model = v["model"].as_str().unwrap_or("");
    let mut out = String::from("{\"model\":");
    out.push_str(&sonic_rs::to_string(model).unwrap_or_default());
    out.push_str(",\"answers\":{");
    for (i, (id, q)) in questions.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&sonic_rs::to_string(id).unwrap_or_default());
        out.push(':');
        let kind = q["type"].as_str().unwrap_or("");
        if state.contains("sim:bad-reply") {
            out.push_str("{\"type\":\"noul\",\"noul\":7}");
            continue;
        }
        let names: Vec<String> = match (kind, q["criteria"].as_object(), q["criteria"].as_array()) {
            ("choice", Some(c), _) => c.iter().map(|(k, _)| k.to_string()).collect(),
            ("score", _, Some(levels)) => (0..levels.len()).map(|j| j.to_string()).collect(),
            _ => Vec::new(),
        };
        if kind == "noul" || names.is_empty() {
            out.push_str("{\"type\":\"noul\",\"noul\":0.25,\"x_label_mass\":0.9}");
            continue;
        }
        let n = names.len() as f64;
        let total = n * (n + 1.0) / 2.0;
        let probs: Vec<f64> = (0..names.len()).map(|j| (j as f64 + 1.0) / total).collect();
        let mut p = String::from("{");
        for (j, name) in names.iter().enumerate() {
            if j > 0 {
                p.push(',');
            }
            p.push_str(&format!("{}:{}", sonic_rs::to_string(name).unwrap_or_default(), probs[j]));
        }
        p.push('}');
        let last = sonic_rs::to_string(&names[names.len() - 1]).unwrap_or_default();
        if kind == "choice" {
            out.push_str(&format!(
                "{{\"type\":\"choice\",\"choice\":{last},\"confidence\":0.5,\"probabilities\":{p},\"x_label_mass\":0.9}}"
            ));
        } else {
            let score: f64 = probs.iter().enumerate().map(|(j, p)| j as f64 * p).sum();
            let legend = sonic_rs::to_string(&q["criteria"]).unwrap_or_default();
            out.push_str(&format!(
                "{{\"type\":\"score\",\"score\":{score},\"confidence\":0.5,\"legend\":{legend},\"probabilities\":{p},\"x_label_mass\":0.9}}"
            ));
        }
    }
    out.push_str(&format!("}},\"usage\":{{\"input_tokens\":{},\"output_tokens\":0}}}}", state.len()));
    (200, out.into_bytes())
}
