"""The reference gateway as an independent client of `smg-sim --grpc`: SMG 1.13
(`smg launch --worker-urls grpc://...`) must take the simulator for an SGLang scheduler and
serve chat completions through it, streaming and not, which shows the simulator speaks the
real protocol (the one tests/e2e/test_proto_contract.py pins down).

Two set-ups: the gateway reads the tokenizer from GetModelInfo.tokenizer_path (a local
directory the simulator wrote; simulator on io_uring), or, with a path it cannot read,
downloads it with GetTokenizer (simulator on epoll).

Needs SMG_SIM_BIN (else smg-sim is built with cargo) and the reference gateway: SMG_REFERENCE
(a command, e.g. /path/to/venv/bin/smg), else `python -m smg` of this interpreter
(`pip install smg==1.13.0`). Everything listens on 127.0.0.1 on ports picked here; every wait
is for a readiness signal, bounded.
"""

import json
import os
import pathlib
import shlex
import socket
import subprocess
import sys
import time
import urllib.request

import openai
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
MODEL = "sim-grpc-model"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sim_binary():
    if os.environ.get("SMG_SIM_BIN"):
        return os.environ["SMG_SIM_BIN"]
    subprocess.run(["cargo", "build", "-q", "-p", "smg-loadtest", "--bin", "smg-sim"], cwd=REPO, check=True,
                   timeout=1800)
    meta = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=REPO, check=True,
                          capture_output=True, timeout=120).stdout
    return str(pathlib.Path(json.loads(meta)["target_directory"]) / "debug" / "smg-sim")


def reference_command():
    if os.environ.get("SMG_REFERENCE"):
        return shlex.split(os.environ["SMG_REFERENCE"])
    return [sys.executable, "-m", "smg"]


def get_json(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def post_json(url, body, timeout=5):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def poll(what, check, timeout):
    """Re-checks `check` (a readiness probe) until it returns a truthy value or `timeout` passes."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            got = check()
            if got:
                return got
        except Exception as e:  # noqa: BLE001 - any failure means "not yet"
            last = e
        time.sleep(0.05)
    raise TimeoutError(f"{what} not within {timeout}s (last error: {last})")


def start_sim(extra, legacy, model=MODEL):
    env = dict(os.environ)
    env.pop("MONOIO_FORCE_LEGACY_DRIVER", None)
    if legacy:
        env["MONOIO_FORCE_LEGACY_DRIVER"] = "1"
    p = subprocess.Popen([sim_binary(), "--grpc", "--host", "127.0.0.1", "--ports", "0", "--model", model,
                          "--itl-ms", "2", *extra], stdout=subprocess.PIPE, text=True, env=env)
    port = None
    deadline = time.monotonic() + 30
    for line in p.stdout:  # the simulator prints `listening ...` per port, then `ready`
        if line.startswith("listening "):
            port = int(line.split()[1].rsplit(":", 1)[1])
        if line.startswith("ready") or time.monotonic() > deadline:
            break
    assert port, "smg-sim did not report its port"
    return p, port


def stop(*procs):
    for p in procs:
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="module", params=["tokenizer_path", "get_tokenizer"])
def stack(request, tmp_path_factory):
    bundle = request.param == "get_tokenizer"
    extra = ["--advertise-tokenizer-path", "/nonexistent/smg-sim-tokenizer"] if bundle else []
    sim, sim_port = start_sim(extra, legacy=bundle)
    gw = None
    log = tmp_path_factory.mktemp("smg") / "smg.log"
    try:
        gw_port, metrics_port = free_port(), free_port()
        with open(log, "w") as out:
            gw = subprocess.Popen(
                [*reference_command(), "launch", "--host", "127.0.0.1", "--port", str(gw_port),
                 "--worker-urls", f"grpc://127.0.0.1:{sim_port}",
                 "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)],
                stdout=out, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{gw_port}"

        def model_served():
            assert gw.poll() is None, f"smg exited: {log.read_text()[-3000:]}"
            with urllib.request.urlopen(f"{base}/readiness", timeout=2) as r:
                if r.status != 200:
                    return False
            return [m["id"] for m in get_json(f"{base}/v1/models")["data"]] == [MODEL]

        poll("smg 1.13 ready with the simulated worker", model_served, timeout=60)
        yield {"gw": base, "sim": f"http://127.0.0.1:{sim_port}", "bundle": bundle, "log": log}
    finally:
        stop(gw, sim)


@pytest.fixture()
def client(stack):
    return openai.OpenAI(base_url=f"{stack['gw']}/v1", api_key="not-needed", max_retries=0, timeout=60)


def sim_grpc_stats(stack):
    return get_json(f"{stack['sim']}/sim/stats")["grpc"]


def test_gateway_start_up_calls(stack):
    rpcs = sim_grpc_stats(stack)["rpcs"]
    for method in ("HealthCheck", "GetModelInfo", "GetServerInfo"):
        assert rpcs.get(method, 0) >= 1, rpcs
    # The tokenizer came from the directory, or else from the GetTokenizer archive.
    assert (rpcs.get("GetTokenizer", 0) >= 1) == stack["bundle"], rpcs


def test_chat_non_streaming(client, stack):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say something."}])
    c = r.choices[0]
    words = c.message.content.split()
    # Default length (--output-tokens 16): 15 words, then the model's stop token.
    assert len(words) == 15 and all(w.isalpha() for w in words), c.message.content
    assert c.finish_reason == "stop"
    assert r.usage.completion_tokens == 16
    last = sim_grpc_stats(stack)["last_generate"]
    assert last["stream"] is False and last["input_tokens"] == r.usage.prompt_tokens
    # The model's advertised defaults (GetModelInfo.default_sampling_params_json) were applied.
    assert (last["temperature"], last["top_k"]) == (pytest.approx(0.7), 20)

    r = client.chat.completions.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
    assert r.choices[0].finish_reason == "length"
    assert len(r.choices[0].message.content.split()) == 5
    assert r.usage.completion_tokens == 5


def test_chat_streaming(client, stack):
    stream = client.chat.completions.create(model=MODEL, max_tokens=7, stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "Stream please."}])
    deltas, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.content:
                deltas.append(ch.delta.content)
            finish = ch.finish_reason or finish
    assert len(deltas) == 7, deltas
    assert len("".join(deltas).split()) == 7
    assert finish == "length"
    assert usage.completion_tokens == 7
    assert sim_grpc_stats(stack)["last_generate"]["stream"] is True


def test_n_samples_by_index(client):
    r = client.chat.completions.create(model=MODEL, n=3, max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) == 3


def test_n_samples_streaming(client):
    stream = client.chat.completions.create(model=MODEL, n=2, max_tokens=3, stream=True,
                                            messages=[{"role": "user", "content": "Hi"}])
    text = {0: "", 1: ""}
    finish = {}
    for chunk in stream:
        for ch in chunk.choices:
            text[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    assert [len(t.split()) for t in text.values()] == [3, 3], text
    assert finish == {0: "length", 1: "length"}


def test_client_abort_reaches_the_simulator(stack):
    """The reference sends Abort when its client goes away mid-stream; the simulator records it."""
    post_json(f"{stack['sim']}/sim/control", {"itl_ms": 50})
    try:
        before = sim_grpc_stats(stack)["aborts"]
        body = json.dumps({"model": MODEL, "stream": True, "max_tokens": 500,
                           "messages": [{"role": "user", "content": "long answer"}]}).encode()
        req = urllib.request.Request(f"{stack['gw']}/v1/chat/completions", data=body,
                                     headers={"content-type": "application/json"})
        resp = urllib.request.urlopen(req, timeout=10)
        assert resp.readline().startswith(b"data:")
        resp.close()
        gone_ms = time.time() * 1000
        stats = poll("Abort RPC at the simulator", lambda: (s := sim_grpc_stats(stack))["aborts"] > before and s,
                     timeout=10)
        assert stats["aborts_hit"] >= 1 and stats["in_flight"] == 0
        # The simulator stamps each Abort's arrival (same host clock).
        latency = stats["abort_unix_ms"][-1] - gone_ms
        print(f"smg 1.13 sent Abort {latency:.0f} ms after its client left")
        assert latency < 5000
    finally:
        post_json(f"{stack['sim']}/sim/control", {"itl_ms": 2})


@pytest.mark.parametrize("fail_status,http_status", [(400, 400), (429, 429), (503, 503)])
def test_engine_errors_map_to_http_statuses(client, stack, fail_status, http_status):
    post_json(f"{stack['sim']}/sim/control", {"fail_rate": 1, "fail_status": fail_status})
    try:
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
        assert e.value.status_code == http_status
    finally:
        post_json(f"{stack['sim']}/sim/control", {"fail_rate": 0})
