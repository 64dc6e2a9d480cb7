//! gRPC workers (SGLang's scheduler API): the gateway tokenizes, renders the chat template,
//! sends token ids and assembles OpenAI responses from the token stream.
//!
//! - `wire`: gRPC framing and statuses (no runtime in it);
//! - `model`: what a shard needs of a worker's model (shared through the Snapshot);
//! - `bundle`: GetTokenizer's zip archive;
//! - `conn`: a shard's multiplexed h2 connection per worker, over monoio's poll-io bridge;
//! - `decisions`: a Decisions request as one scoring call per question, and its answer;
//! - `embeddings`: an embeddings request as one Embed call per input, and the list;
//! - `refusal`: why a request cannot go to the engine (its status, code and message);
//! - `request`: an OpenAI request as GenerateRequests; `stop`: stop strings on decoded text;
//! - `harmony`: gpt-oss models' chats, rendered and read in the Harmony format;
//! - `native`: SGLang's `/generate` bodies and events;
//! - `reply`: OpenAI JSON bodies and SSE chunks from the engine's messages, with
//!   `logprobs`' token log-probabilities;
//! - `assemble`: a response's engine messages in, `reply`'s events or body out (no I/O),
//!   with a per-choice output parser;
//! - `output`: the per-choice `OutputParser` hook, and which reasoning and tool-call parsers
//!   (smg-parsers) a request's choices get.

pub(crate) mod assemble;
pub mod bundle;
pub mod conn;
pub mod decisions;
pub mod embeddings;
pub mod harmony;
pub mod logprobs;
pub mod model;
pub mod native;
pub mod output;
pub mod refusal;
pub mod reply;
pub mod request;
pub mod stop;
pub mod wire;
