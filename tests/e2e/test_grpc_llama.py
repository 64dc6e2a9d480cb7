"""A real model on the gRPC path: the official `openai` SDK -> this gateway (chat template,
tokenizer and detokenizer from the model's GGUF) -> gRPC -> `smg-sim --grpc --llama-url`
(the scheduler protocol served by llama.cpp with token-id prompts) -> llama-server. A greedy
request's text through that path equals llama-server's own answer to the same chat, streamed
and not.

Needs SMG_BIN, SMG_SIM_BIN (else built with cargo), LLAMA_SERVER and LLAMA_MODEL (from
.ci/llama-worker.sh). 127.0.0.1 only, ports picked here, every wait bounded and on a signal.
"""

import os
import subprocess

import openai
import pytest

from test_grpc_gateway import gateway_binary
from test_grpc_sim_reference import free_port, get_json, poll, sim_binary, stop

MODEL = "SmolLM2-135M-Instruct"
CHATS = [
    [{"role": "user", "content": "Name three colours."}],
    [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": "What is the capital of France? Café, naïve, 東京."}],
]


def driver_env(legacy):
    env = dict(os.environ)
    env.pop("MONOIO_FORCE_LEGACY_DRIVER", None)
    if legacy:
        env["MONOIO_FORCE_LEGACY_DRIVER"] = "1"
    return env


@pytest.fixture(scope="module", params=["io_uring", "epoll"])
def stack(request, tmp_path_factory):
    legacy = request.param == "epoll"
    llama_port, gw_port = free_port(), free_port()
    procs = []
    log = tmp_path_factory.mktemp("smg") / "gateway.log"
    try:
        llama = subprocess.Popen(
            [os.environ["LLAMA_SERVER"], "-m", os.environ["LLAMA_MODEL"], "-t", "1", "-c", "2048", "-np", "2",
             "--host", "127.0.0.1", "--port", str(llama_port), "--alias", MODEL],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(llama)
        poll("llama-server healthy", lambda: get_json(f"http://127.0.0.1:{llama_port}/health")["status"] == "ok",
             timeout=120)
        sim = subprocess.Popen(
            [sim_binary(), "--grpc", "--host", "127.0.0.1", "--ports", "0", "--model", MODEL,
             "--llama-url", f"http://127.0.0.1:{llama_port}", "--advertise-tokenizer-path", os.environ["LLAMA_MODEL"]],
            stdout=subprocess.PIPE, text=True, env=driver_env(legacy))
        procs.append(sim)
        sim_port = None
        for line in sim.stdout:  # `listening 127.0.0.1:PORT ...` per port, then `ready`
            if line.startswith("listening "):
                sim_port = int(line.split()[1].rsplit(":", 1)[1])
            if line.startswith("ready"):
                break
        assert sim_port, "smg-sim never listened"
        with open(log, "w") as out:
            gw = subprocess.Popen(
                [gateway_binary(), "launch", "--host", "127.0.0.1", "--port", str(gw_port),
                 "--worker-urls", f"grpc://127.0.0.1:{sim_port}", "--cores", "2",
                 "--tokenizer-path", os.environ["LLAMA_MODEL"]],
                stdout=out, stderr=subprocess.STDOUT, env=driver_env(legacy))
        procs.append(gw)

        def ready():
            assert gw.poll() is None, f"gateway exited: {log.read_text()[-3000:]}"
            return [m["id"] for m in get_json(f"http://127.0.0.1:{gw_port}/v1/models")["data"]] == [MODEL]

        poll("gateway ready with the gRPC worker", ready, timeout=60)
        yield {"gw": f"http://127.0.0.1:{gw_port}/v1", "llama": f"http://127.0.0.1:{llama_port}/v1"}
    finally:
        stop(*reversed(procs))


def sdk(base):
    return openai.OpenAI(base_url=base, api_key="not-needed", max_retries=0, timeout=120)


def ask(base, messages, stream):
    args = dict(model=MODEL, messages=messages, max_tokens=24, temperature=0)
    if stream:
        chunks = list(sdk(base).chat.completions.create(stream=True, **args))
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return sdk(base).chat.completions.create(**args).choices[0].message.content


@pytest.mark.parametrize("chat", range(len(CHATS)))
def test_streamed_text_equals_llama_servers_own(stack, chat):
    ours = ask(stack["gw"], CHATS[chat], stream=True)
    theirs = ask(stack["llama"], CHATS[chat], stream=True)
    assert ours, "no text through the gRPC path"
    assert ours == theirs, f"ours {ours!r} theirs {theirs!r}"


def test_non_streamed_text_and_usage(stack):
    resp = sdk(stack["gw"]).chat.completions.create(model=MODEL, messages=CHATS[0], max_tokens=24, temperature=0)
    theirs = sdk(stack["llama"]).chat.completions.create(model=MODEL, messages=CHATS[0], max_tokens=24,
                                                         temperature=0)
    assert resp.choices[0].message.content == theirs.choices[0].message.content
    assert resp.usage.prompt_tokens == theirs.usage.prompt_tokens
    assert resp.usage.completion_tokens == theirs.usage.completion_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_are_the_models_own(stack, stream):
    """The gateway's logprobs (engine OutputLogProbs -> OpenAI shape) against llama-server's own
    OpenAI logprobs for the same greedy chat, with characters split across tokens: every entry
    llama-server reports is in the gateway's answer, in order, with the same log-probability
    (to float tolerance), and where it is a whole token the same token, bytes and top
    alternatives. llama.cpp reports no probability for a token that ends inside a UTF-8
    character (it folds it into the entry of the token that completes the character), so the
    bridge has none to send for it; the gateway shows each token it gets with its own bytes,
    as SMG and OpenAI do."""
    def logprobs(base):
        args = dict(model=MODEL, messages=CHATS[1], max_tokens=16, temperature=0, logprobs=True, top_logprobs=2)
        if not stream:
            r = sdk(base).chat.completions.create(**args)
            return r.choices[0].logprobs.content
        out = []
        for c in sdk(base).chat.completions.create(stream=True, **args):
            if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content:
                out += c.choices[0].logprobs.content
        return out

    ours, theirs = logprobs(stack["gw"]), logprobs(stack["llama"])
    assert len(ours) >= len(theirs) > 5, ([t.token for t in ours], [t.token for t in theirs])
    i, whole = 0, 0
    for b in theirs:
        while i < len(ours) and not (abs(ours[i].logprob - b.logprob) < 1e-3
                                     and bytes(b.bytes).endswith(bytes(ours[i].bytes))):
            i += 1
        assert i < len(ours), f"{b} not in {[(t.token, t.logprob) for t in ours]}"
        a = ours[i]
        if a.bytes == b.bytes:
            assert a.token == b.token, (a, b)
            assert [t.bytes for t in a.top_logprobs] == [t.bytes for t in b.top_logprobs], (a, b)
            whole += 1
        i += 1
    assert whole >= len(theirs) - 2, whole
