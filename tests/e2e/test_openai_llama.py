"""Real client, real engine: the official `openai` SDK through smg in front of llama.cpp.

Needs SMG_BIN (the gateway binary), LLAMA_SERVER and LLAMA_MODEL (from
.ci/llama-worker.sh). Everything runs on 127.0.0.1 with ports picked here, and every
process is stopped at the end.
"""

import os
import socket
import subprocess
import time
import urllib.request

import openai
import pytest

MODEL = "SmolLM2-135M-Instruct"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, timeout=120):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except Exception as e:  # noqa: BLE001 - any failure means "not yet"
            last = e
        time.sleep(0.2)
    raise TimeoutError(f"{url} never answered 200: {last}")


@pytest.fixture(scope="module", params=["io_uring", "epoll"])
def gateway(request):
    llama_port, gw_port = free_port(), free_port()
    llama = subprocess.Popen(
        [os.environ["LLAMA_SERVER"], "-m", os.environ["LLAMA_MODEL"], "-t", "1", "-c", "2048", "-np", "2",
         "--host", "127.0.0.1", "--port", str(llama_port), "--alias", MODEL],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    gw = None
    try:
        wait_http(f"http://127.0.0.1:{llama_port}/health")
        env = dict(os.environ)
        env.pop("MONOIO_FORCE_LEGACY_DRIVER", None)
        if request.param == "epoll":
            env["MONOIO_FORCE_LEGACY_DRIVER"] = "1"
        gw = subprocess.Popen(
            [os.environ["SMG_BIN"], "launch", "--host", "127.0.0.1", "--port", str(gw_port),
             "--worker-urls", f"http://127.0.0.1:{llama_port}", "--cores", "2"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        wait_http(f"http://127.0.0.1:{gw_port}/readiness", timeout=30)
        yield gw_port, llama_port
    finally:
        for p in (gw, llama):
            if p is not None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()


@pytest.fixture()
def client(gateway):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{gateway[0]}/v1", api_key="not-needed", max_retries=0, timeout=120)


def test_models_list_shows_the_worker_model(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL]
    m = client.models.list().data[0]
    assert m.owned_by == "self_hosted" and m.created == 0


def test_chat_completion(client, gateway):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0)
    assert raw.headers["x-smg-routed-worker-id"] == f"http://127.0.0.1:{gateway[1]}"
    assert raw.headers["x-request-id"]
    resp = raw.parse()
    assert resp.object == "chat.completion"
    assert resp.choices[0].message.role == "assistant"
    assert isinstance(resp.choices[0].message.content, str) and resp.choices[0].message.content
    assert resp.usage.completion_tokens > 0 and resp.usage.prompt_tokens > 0


def test_streaming_chat_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to five."}], max_tokens=12, temperature=0,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens > 0
    assert chunks[-1].choices == []


def test_completions(client):
    resp = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0)
    assert resp.object == "text_completion"
    assert isinstance(resp.choices[0].text, str) and resp.choices[0].text
    assert resp.usage.completion_tokens > 0


def test_unknown_model_is_a_404_envelope(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert e.value.response.headers["x-smg-error-code"] == "model_not_found"
    assert e.value.body["code"] == "model_not_found"


def test_concurrent_streams_all_succeed(client):
    """llama.cpp closes its connection after each streamed response although it announced
    keep-alive; such sockets must never be pooled, or the next request takes a dead one."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i):
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Say {i}."}], max_tokens=3, temperature=0,
            stream=True)
        chunks = list(stream)
        assert any(c.choices and c.choices[0].finish_reason for c in chunks), f"stream {i} did not finish"
        return True

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, range(200)))
    assert results == [True] * 200
