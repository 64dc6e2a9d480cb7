//! The Embed call of an `--is-embedding` worker: a unit vector of --embedding-dim floats,
//! reproducible from the input ids (so a gateway test can tell inputs apart and check their
//! order), counted as a served inference request with its prompt tokens. Other workers answer
//! what SGLang's servicer answers a generation model.

use smg_proto::scheduler::{EmbedRequest, EmbedResponse};

use crate::sim::grpc::wire::{Code, Status};
use crate::sim::tokenizer::CONTEXT_LENGTH;
use crate::sim::worker::{bump, Worker};

pub fn embed(w: &Worker, req: EmbedRequest) -> Result<EmbedResponse, Status> {
    if !w.grpc.as_ref().is_some_and(|g| g.embedding) {
        return Err(Status::new(Code::INVALID_ARGUMENT, "This model does not support embeddings"));
    }
    let ids = req.tokenized.as_ref().map(|t| t.input_ids.as_slice()).unwrap_or(&[]);
    if ids.is_empty() {
        return Err(Status::new(Code::INVALID_ARGUMENT, "the request has no input_ids"));
    }
    if ids.len() >= CONTEXT_LENGTH as usize {
        let msg =
            format!("the input ({} tokens) is longer than the model's context length ({CONTEXT_LENGTH})", ids.len());
        return Err(Status::new(Code::INVALID_ARGUMENT, msg));
    }
    bump(&w.stats.inference, 1);
    bump(&w.stats.prompt_tokens, ids.len() as u64);
    bump(&w.stats.completed, 1);
    let embedding = vector(ids, w.embedding_dim);
    Ok(EmbedResponse { embedding_dim: embedding.len() as u32, embedding, prompt_tokens: ids.len() as u32 })
}

/// The simulated model's embedding of `ids`: `dim` values from a hash of the ids, scaled to
/// unit length.
pub fn vector(ids: &[u32], dim: usize) -> Vec<f32> {
    let seed = ids.iter().fold(0xCBF2_9CE4_8422_2325u64, |h, &i| (h ^ u64::from(i)).wrapping_mul(0x0100_0000_01B3));
    let raw: Vec<f64> = (0..dim as u64)
        .map(|k| {
            let mut x = seed ^ (k + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            x = (x ^ (x >> 31)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x ^= x >> 29;
            (x % 2001) as f64 / 1000.0 - 1.0
        })
        .collect();
    let norm = raw.iter().map(|v| v * v).sum::<f64>().sqrt().max(f64::MIN_POSITIVE);
    raw.iter().map(|v| (v / norm) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_are_unit_length_reproducible_and_differ_by_input() {
        let a = vector(&[1, 2, 3], 16);
        assert_eq!(a.len(), 16);
        let norm: f32 = a.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        assert_eq!(a, vector(&[1, 2, 3], 16));
        assert_ne!(a, vector(&[1, 2, 4], 16));
    }
}
