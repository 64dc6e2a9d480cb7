"""The Realtime API with the official `websockets` client: smg in front of smg-sim's realtime
worker (an echo server that opens each session with `session.created`), under io_uring and
epoll.

Needs SMG_BIN and SMG_SIM_BIN (the gateway and simulator binaries). Everything runs on
127.0.0.1 with ports picked here; waits are on signals (the simulator's `ready` line, the
gateway's readiness counting both workers), never fixed sleeps.
"""

import asyncio
import json
import os
import socket
import subprocess
import time
import urllib.request

import pytest
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

RT = "org/realtime-asr"
PLAIN = "org/plain"
MAX_PAYLOAD = 2 * 1024 * 1024
AUTH = {"Authorization": "Bearer e2e"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sim(model):
    port = free_port()
    p = subprocess.Popen([os.environ["SMG_SIM_BIN"], "--ports", str(port), "--model", model, "--threads", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if line.startswith("ready"):
            return p, port
    raise RuntimeError(f"smg-sim for {model} exited before ready")


def wait_ready(port, workers, timeout=30):
    """Polls readiness until `workers` are routable (the gateway's own signal)."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readiness", timeout=2) as r:
                last = r.read().decode()
                if f'"healthy_workers":{workers}' in last:
                    return
        except Exception as e:  # noqa: BLE001 - not up yet
            last = e
        time.sleep(0.05)
    raise TimeoutError(f"gateway never had {workers} workers: {last}")


@pytest.fixture(scope="module", params=["io_uring", "epoll"])
def gateway(request):
    procs = []
    try:
        plain, plain_port = start_sim(PLAIN)
        procs.append(plain)
        rt, rt_port = start_sim(RT)
        procs.append(rt)
        env = dict(os.environ)
        env.pop("MONOIO_FORCE_LEGACY_DRIVER", None)
        if request.param == "epoll":
            env["MONOIO_FORCE_LEGACY_DRIVER"] = "1"
        port = free_port()
        gw = subprocess.Popen(
            [os.environ["SMG_BIN"], "launch", "--host", "127.0.0.1", "--port", str(port),
             "--worker-urls", f"http://127.0.0.1:{plain_port}", "--cores", "2",
             "--max-payload-size", str(MAX_PAYLOAD)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        procs.append(gw)
        wait_ready(port, 1)
        body = json.dumps({"url": f"http://127.0.0.1:{rt_port}", "labels": {"realtime": "true"}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/workers", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 202
        wait_ready(port, 2)
        yield port
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def url(port, model=RT):
    return f"ws://127.0.0.1:{port}/v1/realtime?model={model}"


async def opened(ws):
    """The worker's first event; returns the session id."""
    event = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert event["type"] == "session.created"
    return event["session"]["id"]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_text_and_binary_messages_echo(gateway):
    async def go():
        async with websockets.connect(url(gateway), additional_headers=AUTH) as ws:
            await opened(ws)
            await ws.send(json.dumps({"type": "session.update", "model": RT}))
            assert json.loads(await ws.recv()) == {"type": "session.update", "model": RT}
            await ws.send(bytes(range(256)) * 4)
            got = await ws.recv()
            assert isinstance(got, bytes) and got == bytes(range(256)) * 4
    run(go())


def test_a_1mb_message(gateway):
    async def go():
        payload = os.urandom(1024 * 1024)
        async with websockets.connect(url(gateway), additional_headers=AUTH, max_size=None) as ws:
            await opened(ws)
            await ws.send(payload)
            assert await ws.recv() == payload
    run(go())


def test_ping_is_answered(gateway):
    async def go():
        async with websockets.connect(url(gateway), additional_headers=AUTH) as ws:
            await opened(ws)
            pong = await ws.ping(b"are you there")
            latency = await asyncio.wait_for(pong, 10)
            assert latency >= 0
    run(go())


@pytest.mark.parametrize("code", [1000, 4001])
def test_close_codes_pass_through(gateway, code):
    async def go():
        ws = await websockets.connect(url(gateway), additional_headers=AUTH)
        await opened(ws)
        await ws.close(code=code, reason="done")
        # The worker echoed our close: the code and reason came back through the gateway.
        assert ws.close_code == code
        assert ws.close_reason == "done"
    run(go())


def test_two_sessions_are_kept_apart(gateway):
    async def session(tag):
        async with websockets.connect(url(gateway), additional_headers=AUTH) as ws:
            sid = await opened(ws)
            for i in range(50):
                await ws.send(f"{tag}-{i}")
                assert await ws.recv() == f"{tag}-{i}"
            return sid
    async def go():
        a, b = await asyncio.gather(session("a"), session("b"))
        assert a != b
    run(go())


def test_a_model_only_unlabeled_workers_serve_is_refused(gateway):
    async def go():
        with pytest.raises(InvalidStatus) as e:
            await websockets.connect(url(gateway, PLAIN), additional_headers=AUTH)
        assert e.value.response.status_code == 404
        assert e.value.response.headers.get("x-smg-error-code") == "model_not_found"
    run(go())


def test_no_model_is_a_400(gateway):
    async def go():
        with pytest.raises(InvalidStatus) as e:
            await websockets.connect(f"ws://127.0.0.1:{gateway}/v1/realtime", additional_headers=AUTH)
        assert e.value.response.status_code == 400
        assert b"model" in e.value.response.body
    run(go())


def test_an_oversize_message_closes_with_1009(gateway):
    async def go():
        async with websockets.connect(url(gateway), additional_headers=AUTH, max_size=None) as ws:
            await opened(ws)
            await ws.send(b"x" * (MAX_PAYLOAD + 1))
            with pytest.raises(ConnectionClosed) as e:
                await ws.recv()
            assert e.value.rcvd is not None and e.value.rcvd.code == 1009
    run(go())
