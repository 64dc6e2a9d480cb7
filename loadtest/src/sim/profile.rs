//! Engine presets (`--profile`): timing and capacity of a real engine on a real GPU, so a sweep
//! against simulated workers is a first-order answer to "how many GPUs does this traffic need".
//!
//! Each number says where it comes from. Published figures are used where they exist; the rest
//! are derived from the hardware's data sheet with the arithmetic shown, and say so.

use clap::ValueEnum;

/// A named preset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Profile {
    /// Llama-3.1-8B-Instruct, BF16, one H100 SXM 80 GB (SGLang or vLLM, TP 1).
    #[value(name = "llama3.1-8b-h100")]
    Llama31_8bH100,
    /// Llama-3.1-70B-Instruct, BF16, four H100 SXM 80 GB (TP 4).
    #[value(name = "llama3.1-70b-h100x4")]
    Llama31_70bH100x4,
}

/// What a profile sets. Flags given on the command line win over these.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Preset {
    pub ttft_ms: f64,
    pub itl_ms: f64,
    pub prefill_us_per_token: f64,
    pub itl_batch_factor: f64,
    pub prefill_batch_factor: f64,
    pub max_running: usize,
    pub kv_cache_tokens: u64,
}

// === impl Profile ===

impl Profile {
    pub fn name(self) -> &'static str {
        match self {
            Profile::Llama31_8bH100 => "llama3.1-8b-h100",
            Profile::Llama31_70bH100x4 => "llama3.1-70b-h100x4",
        }
    }

    pub fn preset(self) -> Preset {
        match self {
            // Decode at batch 1 is bound by reading the weights once per step: 16.06 GB of BF16
            // weights at H100 SXM's 3.35 TB/s HBM3 is 4.8 ms; with kernel and scheduling overhead
            // ~6 ms (derived).
            // Decode at a full batch: 5,333 output tok/s at saturation for Llama-3.1-8B-Instruct
            // BF16 on one H100 80 GB (vLLM 0.23; SGLang within a few percent), published at
            // https://runinfra.ai/news/vllm-vs-sglang-vs-tensorrt-llm-benchmark. 256 running
            // streams sharing 5,333 tok/s is 48 ms per token: 8× batch 1, so factor 7 (ITL at
            // batch 64 is then 16.4 ms).
            // Prefill is compute-bound: 2 × 8.03 G FLOP per token at 50% of the H100's 989 dense
            // BF16 TFLOP/s is 32 µs per token, ~31k tokens/s (derived).
            // KV capacity: 128 KiB per token (32 layers × 8 KV heads × 128 dims × K and V × 2 B;
            // Hugging Face's Llama 3.1 post lists 0.125 GB per 1k tokens for 8B,
            // https://huggingface.co/blog/llama31#inference-memory-requirements). 80 GB × 0.9
            // memory fraction − 16 GB weights − ~4 GB activations and CUDA graphs ≈ 52 GB ≈ 400k
            // tokens (derived; engines print it at start: SGLang `max_total_num_tokens`, vLLM
            // "GPU KV cache size").
            Profile::Llama31_8bH100 => Preset {
                ttft_ms: 8.0,
                itl_ms: 6.0,
                prefill_us_per_token: 32.0,
                itl_batch_factor: 7.0,
                // At a full batch, chunked prefill shares every step with decoding: half speed (assumption).
                prefill_batch_factor: 1.0,
                // vLLM's max_num_seqs and SGLang's default CUDA-graph batch on an 80 GB card.
                max_running: 256,
                kv_cache_tokens: 400_000,
            },
            // TP 4 spreads 141 GB of weights over 13.4 TB/s: 10.5 ms a step, ~14 ms with all-reduce
            // overhead (derived). Prefill: 2 × 70.6 G FLOP per token at 45% of 4 × 989 TFLOP/s is
            // 79 µs per token (derived). KV: 320 KiB per token (80 layers × 8 KV heads × 128 × 2 ×
            // 2 B; 0.313 GB per 1k tokens in the Hugging Face post above); 4 × 80 GB × 0.9 − 141 GB
            // − 16 GB activations ≈ 131 GB ≈ 400k tokens (derived). The batch factor keeps the 8B
            // profile's shape (assumption).
            Profile::Llama31_70bH100x4 => Preset {
                ttft_ms: 16.0,
                itl_ms: 14.0,
                prefill_us_per_token: 79.0,
                itl_batch_factor: 4.0,
                prefill_batch_factor: 1.0,
                max_running: 256,
                kv_cache_tokens: 400_000,
            },
        }
    }
}

/// The built-in defaults when neither a flag nor a profile sets a knob.
pub const DEFAULTS: Preset = Preset {
    ttft_ms: 0.0,
    itl_ms: 0.0,
    prefill_us_per_token: 0.0,
    itl_batch_factor: 0.0,
    prefill_batch_factor: 0.0,
    max_running: 256,
    kv_cache_tokens: 0,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_self_consistent() {
        let p = Profile::Llama31_8bH100.preset();
        // Full batch: max_running streams over ITL × (1 + factor) ≈ the published 5,333 tok/s.
        let full_itl_s = p.itl_ms * (1.0 + p.itl_batch_factor) / 1000.0;
        let tok_s = p.max_running as f64 / full_itl_s;
        assert!((5_000.0..5_700.0).contains(&tok_s), "{tok_s}");
        // Prefill around 31k tokens/s.
        assert!((1e6 / p.prefill_us_per_token - 31_250.0).abs() < 100.0);
        assert_eq!(Profile::Llama31_70bH100x4.name(), "llama3.1-70b-h100x4");
    }
}
