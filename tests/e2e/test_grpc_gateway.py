"""This gateway in front of `smg-sim --grpc`, through the official `openai` SDK: the gateway
renders the chat template, tokenizes, sends token ids over gRPC and turns the token stream
back into OpenAI responses (tests/grpc_workers.rs checks the details; this is the SDK's view).

Needs SMG_BIN (else the gateway is built with cargo) and SMG_SIM_BIN (else built likewise).
127.0.0.1 only, ports picked here, every wait bounded and on a readiness signal.
"""

import json
import os
import pathlib
import subprocess
import urllib.request

import openai
import pytest

from test_grpc_sim_reference import MODEL, REPO, free_port, get_json, poll, start_sim, stop


def gateway_binary():
    if os.environ.get("SMG_BIN"):
        return os.environ["SMG_BIN"]
    subprocess.run(["cargo", "build", "-q", "--bin", "smg"], cwd=REPO, check=True, timeout=1800)
    meta = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=REPO, check=True,
                          capture_output=True, timeout=120).stdout
    return str(pathlib.Path(json.loads(meta)["target_directory"]) / "debug" / "smg")


def grpc_stack(driver, tmp_path_factory, sim_args=(), gateway_args=(), model=MODEL):
    """This gateway (on `driver`) in front of one `smg-sim --grpc` serving `model` with
    `sim_args`; yields their base URLs once the gateway lists the model, and stops both after."""
    legacy = driver == "epoll"
    sim, sim_port = start_sim(list(sim_args), legacy=False, model=model)
    log = tmp_path_factory.mktemp("smg") / "gateway.log"
    env = dict(os.environ)
    env.pop("MONOIO_FORCE_LEGACY_DRIVER", None)
    if legacy:
        env["MONOIO_FORCE_LEGACY_DRIVER"] = "1"
    gw = None
    try:
        port = free_port()
        with open(log, "w") as out:
            gw = subprocess.Popen([gateway_binary(), "launch", "--host", "127.0.0.1", "--port", str(port),
                                   "--worker-urls", f"grpc://127.0.0.1:{sim_port}", "--cores", "2",
                                   *gateway_args],
                                  stdout=out, stderr=subprocess.STDOUT, env=env)
        base = f"http://127.0.0.1:{port}"

        def ready():
            assert gw.poll() is None, f"gateway exited: {log.read_text()[-3000:]}"
            return [m["id"] for m in get_json(f"{base}/v1/models")["data"]] == [model]

        poll("gateway ready with the gRPC worker", ready, timeout=60)
        yield {"gw": base, "sim": f"http://127.0.0.1:{sim_port}"}
    finally:
        stop(gw, sim)


@pytest.fixture(scope="module", params=["io_uring", "epoll"])
def stack(request, tmp_path_factory):
    yield from grpc_stack(request.param, tmp_path_factory)


@pytest.fixture()
def client(stack):
    return openai.OpenAI(base_url=f"{stack['gw']}/v1", api_key="not-needed", max_retries=0, timeout=60)


def test_streaming_chat_through_the_sdk(client, stack):
    stream = client.chat.completions.create(model=MODEL, max_tokens=7, stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "Stream please."}])
    deltas, finish, usage, ids = [], None, None, set()
    for chunk in stream:
        ids.add(chunk.id)
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.content:
                deltas.append(ch.delta.content)
            finish = ch.finish_reason or finish
    assert len(ids) == 1 and next(iter(ids)).startswith("chatcmpl-")
    words = "".join(deltas).split()
    assert len(words) == 7 and all(w.isalpha() for w in words), deltas
    assert finish == "length"
    assert usage.completion_tokens == 7 and usage.prompt_tokens > 0
    last = get_json(f"{stack['sim']}/sim/stats")["grpc"]["last_generate"]
    assert last["stream"] is True and last["max_new_tokens"] == 7


def test_non_streaming_chat_and_completion(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say something."}])
    assert r.choices[0].finish_reason == "stop"
    assert len(r.choices[0].message.content.split()) == 15
    assert r.usage.completion_tokens == 16
    c = client.completions.create(model=MODEL, prompt=["one", "two"], max_tokens=3)
    assert sorted(ch.index for ch in c.choices) == [0, 1]
    assert all(len(ch.text.split()) == 3 for ch in c.choices)


def test_engine_error_is_the_documented_code(client):
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       extra_body={"custom_params": {"sim_error": "RESOURCE_EXHAUSTED"}})
    assert e.value.body["code"] == "start_generation_failed"


def test_logprobs_parse_in_the_sdk(client):
    r = client.chat.completions.create(model=MODEL, max_tokens=4, logprobs=True, top_logprobs=3,
                                       messages=[{"role": "user", "content": "Say something."}])
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content
    assert len(content) == 4
    for t in content:
        assert t.logprob <= 0 and bytes(t.bytes).decode() == t.token
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
    stream = client.chat.completions.create(model=MODEL, max_tokens=4, logprobs=True, stream=True,
                                            messages=[{"role": "user", "content": "Say something."}])
    tokens, text = [], ""
    for chunk in stream:
        for ch in chunk.choices:
            text += ch.delta.content or ""
            if ch.logprobs and ch.logprobs.content:
                tokens += [t.token for t in ch.logprobs.content]
    assert "".join(tokens) == text and len(tokens) == 4
    c = client.completions.create(model=MODEL, prompt="Once", max_tokens=3, logprobs=2)
    lp = c.choices[0].logprobs
    assert "".join(lp.tokens) == c.choices[0].text and len(lp.token_logprobs) == 3
    assert all(len(d) == 2 for d in lp.top_logprobs) and lp.text_offset[0] == 0


@pytest.fixture(scope="module", params=["io_uring", "epoll"])
def embedding_stack(request, tmp_path_factory):
    yield from grpc_stack(request.param, tmp_path_factory, sim_args=["--is-embedding", "--embedding-dim", "8"])


def test_embeddings_through_the_sdk(embedding_stack):
    """An embedding model's gRPC worker through the openai SDK, which asks for base64 by
    default and decodes it: one unit vector per input, in input order."""
    client = openai.OpenAI(base_url=f"{embedding_stack['gw']}/v1", api_key="not-needed", max_retries=0, timeout=60)
    got = client.embeddings.create(model=MODEL, input=["hello", "the world", "hello"])
    assert [d.index for d in got.data] == [0, 1, 2]
    vectors = [d.embedding for d in got.data]
    assert all(len(v) == 8 for v in vectors)
    assert all(abs(sum(x * x for x in v) - 1.0) < 1e-4 for v in vectors), vectors
    assert vectors[0] == vectors[2] and vectors[0] != vectors[1], "the same input, the same vector"
    assert got.usage.prompt_tokens == got.usage.total_tokens > 0
    floats = client.embeddings.create(model=MODEL, input="hello", encoding_format="float", dimensions=4)
    assert len(floats.data[0].embedding) == 4
