//! The OpenAI answer to a gRPC engine's messages, assembled without I/O: messages go in
//! (`on_message`), SSE events or the whole JSON body come out (`pending`, `finish`), and the
//! caller (src/serve/grpc.rs) only reads calls, writes bytes and sends Abort RPCs.
//!
//! Per choice: incremental detokenization, stop strings on the decoded text, log-probabilities
//! of the tokens whose text was released, then the choice's `OutputParser`, the one place
//! where released text becomes the answer's fields. Per response: `n` and a completions batch
//! (choice `p * n + index`), echo and suffix, finish reasons, and usage in the OpenAI or
//! DeepSeek stream format.
//!
//! Nothing is allocated per token: a message's text, the decoder's scratch, the parsed
//! output, the logprobs JSON and the event buffer are reused for the whole response.

use smg_proto::scheduler::generate_complete::MatchedStop;
use smg_proto::scheduler::{generate_response, GenerateResponse, OutputLogProbs};

use super::harmony::ReasoningCount;
use super::logprobs::{self, Entry, Offset};
use super::native::{self, Finish, Matched, Sample};
use super::output::OutputParser;
use super::reply::{self, CallOut, Choice, ChunkUsage, Delta, Meta, Usage};
use super::request::{Kind, Prepared};
use super::stop::StopMatcher;
use super::wire::{Code, Status};
use crate::tokenizer::{IncrementalDecoder, Tokenizer};

#[cfg(test)]
mod tests;

/// What a choice's output turns into: `content`, `reasoning_content` and tool calls.
pub(crate) use smg_parsers::Parsed;

/// What the caller does after a message.
#[derive(Debug)]
pub(crate) enum Step {
    /// Read the next message of this engine request.
    Next,
    /// Every sample of this engine request finished before the engine said so (a stop string
    /// the gateway found): abort it and read no more of it.
    Abort,
    /// The engine finished a sample with an error: the response fails (`fail`).
    Failed(Status),
}

/// Every choice finished: what is left to send.
#[derive(Debug)]
pub(crate) enum Answer {
    /// A stream: the trailing events (usage chunk, `[DONE]`) are `pending`.
    Events,
    /// The whole JSON body.
    Body(Vec<u8>),
}

// === impl ChoiceState ===

/// One choice's progress.
struct ChoiceState<'a> {
    decoder: IncrementalDecoder<'a>,
    stop: StopMatcher<'a>,
    parser: Box<dyn OutputParser + 'a>,
    /// The whole text (a response that is not streamed).
    text: String,
    /// The whole reasoning (not streamed), or a stream's reasoning held until it ends
    /// (`stream_reasoning: false`).
    reasoning_text: String,
    /// The calls (not streamed).
    calls: Vec<CallOut>,
    /// Calls given out so far.
    n_calls: usize,
    finish: Option<String>,
    completion: u64,
    reasoning: u64,
    /// Speculative decoding's counts, from GenerateComplete.
    drafted: u64,
    accepted: u64,
    /// Its first chunk was written (chat's role chunk, completions' echo).
    begun: bool,
    /// The engine sent this sample's GenerateComplete.
    engine_done: bool,
    /// Log-probabilities of tokens whose text has not been sent yet.
    lp: Vec<Entry>,
    lp_offset: Offset,
    /// `/generate`: the sample's output ids (all of them; a stream's latest message's), and
    /// the stop the engine matched.
    ids: Vec<u32>,
    matched: Option<MatchedStop>,
    /// A Harmony model's chat: its reasoning tokens, counted here (the engine does not count
    /// them; `reasoning` keeps the engine's figure).
    harmony: Option<ReasoningCount<'a>>,
}

impl ChoiceState<'_> {
    /// Its reasoning tokens: the gateway's count on a Harmony model, else the engine's.
    fn reasoning_tokens(&self) -> u64 {
        self.harmony.as_ref().map_or(self.reasoning, |h| h.count)
    }

    /// Decodes `ids` and appends to `emit` the text that is certain (a possible stop string's
    /// start is held back; nothing after a stop string comes out). `piece` is scratch.
    /// Returns how many of `ids` were taken (the rest follow a stop string).
    fn feed(&mut self, ids: &[u32], emit: &mut String, piece: &mut String) -> usize {
        for (i, &t) in ids.iter().enumerate() {
            if let Some(h) = &mut self.harmony {
                h.step(t);
            }
            piece.clear();
            self.decoder.step(t, piece);
            if self.stop.push(piece, emit) {
                return i + 1;
            }
        }
        ids.len()
    }

    /// Keeps the log-probabilities of the first `taken` tokens of a message.
    fn keep_logprobs(&mut self, lp: Option<&OutputLogProbs>, taken: usize) {
        if let Some(lp) = lp {
            logprobs::take(lp, taken, &mut self.lp);
        }
    }

    /// The pending log-probabilities as JSON into `out` (cleared first); false when none
    /// were asked for.
    fn render_logprobs(&mut self, prep: &Prepared, kind: Kind, tok: &Tokenizer, out: &mut Vec<u8>) -> bool {
        let Some(top) = prep.logprobs else { return false };
        out.clear();
        logprobs::put(out, kind, tok, &self.lp, top, &mut self.lp_offset);
        self.lp.clear();
        true
    }

    /// The sample ended: what the decoder and the stop matcher still hold.
    fn end(&mut self, emit: &mut String, piece: &mut String) {
        if self.stop.stopped() {
            return;
        }
        piece.clear();
        self.decoder.finish(piece);
        self.stop.push(piece, emit);
        self.stop.finish(emit);
    }
}

/// Per engine request: the prompt's counters (shared by its samples).
#[derive(Default, Clone, Copy)]
struct PromptCounts {
    prompt: u64,
    cached: u64,
}

fn usage_of(choices: &[ChoiceState<'_>], counts: &[PromptCounts]) -> Usage {
    Usage {
        prompt: counts.iter().map(|c| c.prompt).sum(),
        cached: counts.iter().map(|c| c.cached).sum(),
        completion: choices.iter().map(|c| c.completion).sum(),
        reasoning: choices.iter().map(ChoiceState::reasoning_tokens).sum(),
        drafted: choices.iter().map(|c| c.drafted).sum(),
        accepted: choices.iter().map(|c| c.accepted).sum(),
    }
}

/// `/generate`'s view of a sample: its text, ids, counts and (once it ended) finish reason.
fn native_sample<'s>(
    st: &'s ChoiceState<'_>,
    id: &'s str,
    counts: PromptCounts,
    logprobs: Option<u32>,
    index: Option<u32>,
) -> Sample<'s> {
    let finish = st.finish.as_deref().map(|f| match f {
        "stop" => Finish::Stop(match st.stop.matched() {
            Some(s) => Some(Matched::Text(s)),
            None => st.matched.as_ref().map(Matched::of),
        }),
        "length" => Finish::Length(st.completion),
        _ => Finish::Abort,
    });
    Sample {
        id,
        text: &st.text,
        output_ids: &st.ids,
        finish,
        prompt_tokens: counts.prompt,
        completion_tokens: st.completion,
        cached_tokens: counts.cached,
        logprobs: logprobs.map(|top| (st.lp.as_slice(), top)),
        input_logprobs: None,
        index,
    }
}

// === impl Assembler ===

/// One response's assembly, from the first engine message to the last event or body.
pub(crate) struct Assembler<'a> {
    prep: &'a Prepared,
    tok: &'a Tokenizer,
    meta: Meta<'a>,
    /// DeepSeek's stream format: the whole request's usage on the last finish chunk (asked for
    /// or not), `usage: null` before it when asked for, no usage-only chunk.
    deepseek: bool,
    n: usize,
    choices: Vec<ChoiceState<'a>>,
    counts: Vec<PromptCounts>,
    /// SSE events not yet written.
    events: Vec<u8>,
    /// A message's released text, and the decoder's scratch.
    text: String,
    piece: String,
    parsed: Parsed,
    /// A release's calls, with their ids.
    calls: Vec<CallOut>,
    /// A chunk's `logprobs` JSON.
    lp_json: Vec<u8>,
    /// `/generate`: each sample's `meta_info.id`, and each prompt's log-probabilities as its
    /// engine request's first message with them said.
    sample_ids: Vec<String>,
    input_lp: Vec<Option<Vec<native::InputEntry>>>,
}

impl<'a> Assembler<'a> {
    /// `deepseek`: the request's profile is DeepSeek's (its usage format applies to streams).
    /// `parser` makes choice `i`'s output parser.
    pub(crate) fn new(
        prep: &'a Prepared,
        tok: &'a Tokenizer,
        meta: Meta<'a>,
        deepseek: bool,
        mut parser: impl FnMut(usize) -> Box<dyn OutputParser + 'a>,
    ) -> Self {
        let n = prep.n.max(1) as usize;
        let kind = meta.kind;
        let choices = (0..n * prep.prompts.len())
            .map(|i| ChoiceState {
                // A completion continues its prompt; a chat reply starts a message.
                decoder: match kind {
                    Kind::Completions | Kind::Generate => tok.decoder(prep.skip_special).continuing(),
                    Kind::Chat => tok.decoder(prep.skip_special),
                },
                stop: StopMatcher::new(&prep.stop, prep.no_stop_trim),
                parser: parser(i),
                text: String::new(),
                reasoning_text: String::new(),
                calls: Vec::new(),
                n_calls: 0,
                finish: None,
                completion: 0,
                reasoning: 0,
                drafted: 0,
                accepted: 0,
                begun: false,
                engine_done: false,
                lp: Vec::new(),
                // Completions' echo: the prompt's text starts each of its choices' offsets.
                lp_offset: Offset(prep.echo.get(i / n).map_or(0, |e| e.chars().count() as u64)),
                ids: Vec::new(),
                matched: None,
                harmony: prep.harmony.map(|h| ReasoningCount::new(h, tok)),
            })
            .collect();
        // `/generate`: a lone sample is named by the response id, each of several by its index.
        let sample_ids = match kind {
            Kind::Generate if n * prep.prompts.len() > 1 => {
                (0..n * prep.prompts.len()).map(|i| format!("{}-{i}", meta.id)).collect()
            }
            Kind::Generate => vec![meta.id.to_owned()],
            _ => Vec::new(),
        };
        Assembler {
            prep,
            tok,
            meta,
            deepseek: deepseek && prep.stream,
            n,
            choices,
            counts: vec![PromptCounts::default(); prep.prompts.len()],
            events: Vec::new(),
            text: String::new(),
            piece: String::new(),
            parsed: Parsed::default(),
            calls: Vec::new(),
            lp_json: Vec::new(),
            sample_ids,
            input_lp: vec![None; prep.prompts.len()],
        }
    }

    /// SSE events to write (empty when the response is not streamed).
    pub(crate) fn pending(&self) -> &[u8] {
        &self.events
    }

    /// The pending events were written.
    pub(crate) fn sent(&mut self) {
        self.events.clear();
    }

    /// Token counts so far (the whole request's once every choice finished).
    pub(crate) fn usage(&self) -> Usage {
        usage_of(&self.choices, &self.counts)
    }

    /// A message of engine request `p` (the `p`-th prompt).
    pub(crate) fn on_message(&mut self, p: usize, msg: GenerateResponse) -> Step {
        let (n, prep) = (self.n, self.prep);
        self.text.clear();
        if self.meta.kind == Kind::Generate && prep.logprobs.is_some() && self.input_lp[p].is_none() {
            let input = match &msg.response {
                Some(generate_response::Response::Chunk(c)) => c.input_logprobs.as_ref(),
                Some(generate_response::Response::Complete(c)) => c.input_logprobs.as_ref(),
                None => None,
            };
            if let Some(lp) = input {
                let values = lp.token_logprobs.iter().map(|v| v.value);
                self.input_lp[p] = Some(values.zip(lp.token_ids.iter().copied()).collect());
            }
        }
        let i = match msg.response {
            Some(generate_response::Response::Chunk(c)) => {
                self.counts[p] = PromptCounts { prompt: c.prompt_tokens as u64, cached: c.cached_tokens as u64 };
                let i = p * n + c.index as usize;
                let Some(st) = self.choices.get_mut(i).filter(|st| st.finish.is_none()) else { return Step::Next };
                st.completion = c.completion_tokens as u64;
                st.reasoning = c.reasoning_tokens as u64;
                if self.meta.kind == Kind::Generate {
                    st.ids.clear();
                    st.ids.extend_from_slice(&c.token_ids);
                }
                let taken = st.feed(&c.token_ids, &mut self.text, &mut self.piece);
                if prep.logprobs.is_some() {
                    st.keep_logprobs(c.output_logprobs.as_ref(), taken);
                }
                if st.stop.stopped() {
                    st.finish = Some("stop".into());
                }
                i
            }
            Some(generate_response::Response::Complete(c)) => {
                self.counts[p] = PromptCounts { prompt: c.prompt_tokens as u64, cached: c.cached_tokens as u64 };
                // Streaming: the sample its index names. Otherwise arrival order, as SMG reads
                // them: SGLang's non-streaming Completes all carry index 0.
                let i = if prep.stream {
                    p * n + c.index as usize
                } else {
                    p * n + self.choices[p * n..(p + 1) * n].iter().filter(|s| s.engine_done).count()
                };
                let Some(st) = self.choices.get_mut(i) else { return Step::Next };
                st.completion = c.completion_tokens as u64;
                st.reasoning = c.reasoning_tokens as u64;
                st.drafted = c.spec_draft_tokens as u64;
                st.accepted = c.spec_accepted_tokens as u64;
                st.engine_done = true;
                if st.finish.is_some() {
                    return Step::Next;
                }
                if self.meta.kind == Kind::Generate {
                    // Streaming: the chunks brought every id already.
                    st.ids.clear();
                    if !prep.stream {
                        st.ids.extend_from_slice(&c.output_ids);
                    }
                    st.matched = c.matched_stop.clone();
                }
                // Streaming: the tokens came in chunks; the whole output otherwise.
                if !prep.stream {
                    let taken = st.feed(&c.output_ids, &mut self.text, &mut self.piece);
                    if prep.logprobs.is_some() {
                        st.keep_logprobs(c.output_logprobs.as_ref(), taken);
                    }
                }
                st.end(&mut self.text, &mut self.piece);
                if st.stop.stopped() {
                    st.finish = Some("stop".into());
                } else {
                    match reply::finish_reason(&c.finish_reason) {
                        Some(f) => st.finish = Some(f.to_string()),
                        None => return Step::Failed(Status::new(Code::INTERNAL, "the engine finished with an error")),
                    }
                }
                i
            }
            None => return Step::Next,
        };
        self.release(i);
        // Every sample of this engine request is done (stop strings found by the gateway
        // before the engine's own end): the engine need not go on.
        let samples = &self.choices[p * n..(p + 1) * n];
        if samples.iter().all(|s| s.finish.is_some()) && !samples.iter().all(|s| s.engine_done) {
            return Step::Abort;
        }
        Step::Next
    }

    /// Choice `i` released `self.text` (and may have finished): through its parser, then into
    /// an SSE chunk or its whole text.
    fn release(&mut self, i: usize) {
        if self.meta.kind == Kind::Generate {
            return self.release_native(i);
        }
        let prep = self.prep;
        self.parsed.clear();
        self.calls.clear();
        {
            let st = &mut self.choices[i];
            if !self.text.is_empty() {
                st.parser.push(&self.text, &mut self.parsed);
            }
            if st.finish.is_some() {
                st.parser.finish(&mut self.parsed);
            }
            for call in self.parsed.calls.drain(..) {
                if st.n_calls > 0 && !prep.output.parallel_calls {
                    continue;
                }
                let k = st.n_calls;
                st.n_calls += 1;
                let id = prep.output.call_id(&call, k);
                self.calls.push(CallOut { index: k as u32, id, name: call.name, arguments: call.arguments });
            }
            // A reply that called tools ends for that reason (a cut one still says `length`).
            if st.n_calls > 0 && st.finish.as_deref() == Some("stop") {
                st.finish = Some("tool_calls".into());
            }
        }
        let content = &mut self.parsed.content;
        if !prep.stream {
            let st = &mut self.choices[i];
            st.text.push_str(content);
            st.reasoning_text.push_str(&self.parsed.reasoning);
            st.calls.append(&mut self.calls);
            return;
        }
        let last_finish = self.deepseek && self.choices.iter().all(|c| c.finish.is_some());
        let total =
            ((prep.continuous_usage && !self.deepseek) || last_finish).then(|| usage_of(&self.choices, &self.counts));
        // Every chunk but DeepSeek's last finish chunk: the running usage (continuous stats),
        // or DeepSeek's null when usage was asked for.
        let before = match (&total, self.deepseek) {
            (_, true) if prep.include_usage => ChunkUsage::Null,
            (Some(u), false) => ChunkUsage::Of(u),
            _ => ChunkUsage::Absent,
        };
        let st = &mut self.choices[i];
        let first = !st.begun;
        st.begun = true;
        if first && self.meta.kind == Kind::Chat {
            let d = Delta { role: true, ..Delta::default() };
            reply::chunk(&mut self.events, &self.meta, i as u32, &d, before);
        }
        // Completions: a choice's first chunk leads with its echoed prompt, and its finish
        // chunk ends with the suffix.
        if first {
            if let Some(e) = prep.echo.get(i / self.n) {
                content.insert_str(0, e);
            }
        }
        if let (Some(s), Some(_)) = (&prep.suffix, &st.finish) {
            content.push_str(s);
        }
        // Reasoning as it comes, or (stream_reasoning: false) held until something else comes
        // or the choice ends, then sent in one piece.
        if !prep.output.stream_reasoning {
            st.reasoning_text.push_str(&self.parsed.reasoning);
            self.parsed.reasoning.clear();
            if !content.is_empty() || !self.calls.is_empty() || st.finish.is_some() {
                std::mem::swap(&mut self.parsed.reasoning, &mut st.reasoning_text);
            }
        }
        let reasoning = &self.parsed.reasoning;
        if !content.is_empty() || !reasoning.is_empty() || !self.calls.is_empty() || st.finish.is_some() {
            let lp = st.render_logprobs(prep, self.meta.kind, self.tok, &mut self.lp_json);
            let d = Delta {
                role: false,
                text: (!content.is_empty()).then_some(content.as_str()),
                reasoning: (!reasoning.is_empty()).then_some(reasoning.as_str()),
                calls: &self.calls,
                finish: st.finish.as_deref(),
                logprobs: lp.then_some(self.lp_json.as_slice()),
            };
            let usage = match &total {
                Some(u) if last_finish => ChunkUsage::Of(u),
                _ => before,
            };
            reply::chunk(&mut self.events, &self.meta, i as u32, &d, usage);
        }
    }

    /// `/generate`'s release: the text joins the sample's whole text; streamed, an event with
    /// that text, the message's ids and (at the end) the finish reason.
    fn release_native(&mut self, i: usize) {
        let prep = self.prep;
        let st = &mut self.choices[i];
        st.text.push_str(&self.text);
        if !prep.stream {
            return;
        }
        let counts = self.counts[i / self.n];
        let first = !self.choices[i].begun;
        self.choices[i].begun = true;
        let st = &self.choices[i];
        let mut sample = native_sample(st, &self.sample_ids[i], counts, prep.logprobs, Some(i as u32));
        sample.input_logprobs = self.input_lp[i / self.n].as_deref().filter(|_| first);
        native::event(&mut self.events, &sample);
        self.choices[i].lp.clear();
    }

    /// The engine's calls all ended. Err: some choice never finished (the engine ended a call
    /// early); the caller then fails the response.
    pub(crate) fn finish(&mut self) -> Result<Answer, Status> {
        if self.choices.iter().any(|c| c.finish.is_none()) {
            return Err(Status::new(Code::INTERNAL, "the engine ended the stream before every choice finished"));
        }
        let (prep, kind, n) = (self.prep, self.meta.kind, self.n);
        let usage = self.usage();
        if kind == Kind::Generate {
            if prep.stream {
                self.events.extend_from_slice(reply::DONE);
                return Ok(Answer::Events);
            }
            let samples: Vec<Sample<'_>> = (0..self.choices.len())
                .map(|i| {
                    let mut s =
                        native_sample(&self.choices[i], &self.sample_ids[i], self.counts[i / n], prep.logprobs, None);
                    s.input_logprobs = self.input_lp[i / n].as_deref();
                    s
                })
                .collect();
            return Ok(Answer::Body(native::full(&samples)));
        }
        if prep.stream {
            if prep.include_usage && !self.deepseek {
                reply::usage_chunk(&mut self.events, &self.meta, &usage);
            }
            self.events.extend_from_slice(reply::DONE);
            return Ok(Answer::Events);
        }
        if !prep.echo.is_empty() || prep.suffix.is_some() {
            for (i, c) in self.choices.iter_mut().enumerate() {
                if let Some(e) = prep.echo.get(i / n) {
                    c.text.insert_str(0, e);
                }
                if let Some(s) = &prep.suffix {
                    c.text.push_str(s);
                }
            }
        }
        let tok = self.tok;
        let lps: Vec<Option<Vec<u8>>> = self
            .choices
            .iter_mut()
            .map(|c| {
                let mut out = Vec::new();
                c.render_logprobs(prep, kind, tok, &mut out).then_some(out)
            })
            .collect();
        let list: Vec<Choice<'_>> = self
            .choices
            .iter()
            .zip(&lps)
            .enumerate()
            .map(|(i, (c, lp))| Choice {
                index: i as u32,
                text: &c.text,
                reasoning: (!c.reasoning_text.is_empty()).then_some(c.reasoning_text.as_str()),
                calls: &c.calls,
                finish_reason: c.finish.as_deref().unwrap_or("stop"),
                logprobs: lp.as_deref(),
            })
            .collect();
        Ok(Answer::Body(reply::full(&self.meta, &list, &usage)))
    }

    /// A Responses turn's answer, not streamed: the first choice's text, reasoning, calls and
    /// finish reason, taken as they are (no chat JSON made to be read back). Err: some choice
    /// never finished, as for [`Assembler::finish`].
    pub(crate) fn take_first(&mut self) -> Result<(String, String, Vec<CallOut>, String), Status> {
        if self.choices.iter().any(|c| c.finish.is_none()) {
            return Err(Status::new(Code::INTERNAL, "the engine ended the stream before every choice finished"));
        }
        let c = self.choices.first_mut().ok_or_else(|| Status::new(Code::INTERNAL, "no choice"))?;
        let finish = c.finish.take().unwrap_or_default();
        Ok((std::mem::take(&mut c.text), std::mem::take(&mut c.reasoning_text), std::mem::take(&mut c.calls), finish))
    }

    /// The response fails after its stream started: the contract's error event, then `[DONE]`,
    /// become `pending`.
    pub(crate) fn fail(&mut self, s: &Status) {
        reply::error_event(&mut self.events, &format!("Stream error: {s}"));
        self.events.extend_from_slice(reply::DONE);
    }
}
