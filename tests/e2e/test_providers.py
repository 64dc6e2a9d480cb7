"""Cloud providers through the official SDKs: this gateway with `--backend openai`, a gateway
key (`--api-key`, which must never reach a provider) and an Anthropic worker registered beside it, both played by one smg-sim over TLS (its CA trusted
through SSL_CERT_FILE) and reached only through its CONNECT proxy (HTTPS_PROXY). The openai
SDK chats whole and streamed, and keeps Responses turns the gateway stores; the anthropic SDK
sends Messages whole and streamed.
tests/providers.rs checks every key rule; this is the SDKs' view.

Needs SMG_BIN and SMG_SIM_BIN (else both are built with cargo). 127.0.0.1 only, ports picked
here, every wait bounded and on a readiness signal.
"""

import json
import os
import subprocess
import time
import urllib.request

import anthropic
import openai
import pytest

from test_grpc_gateway import gateway_binary
from test_grpc_sim_reference import free_port, get_json, poll, sim_binary, stop

KEYS = {
    "sk-o-stored": {"provider": "openai", "models": ["gpt-4o"]},
    "sk-a-stored": {"provider": "anthropic", "models": ["claude-x"]},
    "sk-a-callers": {"provider": "anthropic", "models": ["claude-x"]},
}


GATEWAY_KEY = "gw-key-3c1e"


def start_cloud(tmp):
    """smg-sim as the providers' stand-in: TLS, the keys above, a CONNECT proxy."""
    (tmp / "keys.json").write_text(json.dumps(KEYS))
    proxy = free_port()
    p = subprocess.Popen([sim_binary(), "--host", "127.0.0.1", "--ports", "0", "--model", "cloud-sim",
                          "--itl-ms", "2", "--tls-dir", str(tmp), "--provider-keys", str(tmp / "keys.json"),
                          "--connect-proxy-port", str(proxy)], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    for line in p.stdout:  # `listening ...` per port, `proxy ...`, then `ready`
        if line.startswith("ready") or time.monotonic() > deadline:
            break
    assert p.poll() is None, "smg-sim exited"
    return p, proxy


@pytest.fixture(scope="module", params=["io_uring", "epoll"])
def stack(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cloud")
    sim, proxy = start_cloud(tmp)
    log = tmp / "gateway.log"
    env = dict(os.environ)
    env.pop("MONOIO_FORCE_LEGACY_DRIVER", None)
    if request.param == "epoll":
        env["MONOIO_FORCE_LEGACY_DRIVER"] = "1"
    env.update({"HTTPS_PROXY": f"http://127.0.0.1:{proxy}", "SSL_CERT_FILE": str(tmp / "ca.pem"),
                "OPENAI_API_KEY": "sk-o-stored"})
    gw = None
    try:
        port = free_port()
        with open(log, "w") as out:
            gw = subprocess.Popen([gateway_binary(), "launch", "--host", "127.0.0.1", "--port", str(port),
                                   "--backend", "openai", "--worker-urls", "https://api.openai.com", "--cores", "2",
                                   "--api-key", GATEWAY_KEY],
                                  stdout=out, stderr=subprocess.STDOUT, env=env)
        base = f"http://127.0.0.1:{port}"
        spec = {"url": "https://api.anthropic.com", "api_key": "sk-a-stored", "runtime_type": "external"}
        auth = {"authorization": f"Bearer {GATEWAY_KEY}"}
        req = urllib.request.Request(f"{base}/workers", data=json.dumps(spec).encode(),
                                     headers={"content-type": "application/json", **auth})
        poll("gateway up", lambda: gw.poll() is None and urllib.request.urlopen(req, timeout=5).status == 202,
             timeout=60)

        def served(model):
            assert gw.poll() is None, f"gateway exited: {log.read_text()[-3000:]}"
            listing = urllib.request.Request(f"{base}/workers", headers=auth)
            with urllib.request.urlopen(listing, timeout=5) as r:
                workers = json.loads(r.read())["workers"]
            return any(model in (w.get("model_id"),) for w in workers)

        poll("both providers' models known", lambda: served("gpt-4o") and served("claude-x"), timeout=60)
        yield {"gw": base, "sim": sim}
    finally:
        stop(gw, sim)


def test_openai_sdk_chats_with_the_openai_provider(stack):
    # The SDK's key is the gateway's: the provider is sent the stored key (OPENAI_API_KEY).
    client = openai.OpenAI(base_url=f"{stack['gw']}/v1", api_key=GATEWAY_KEY, max_retries=0, timeout=60)
    r = client.chat.completions.create(model="gpt-4o", max_tokens=5,
                                       messages=[{"role": "user", "content": "Say hi."}])
    assert r.choices[0].message.content and r.usage.completion_tokens > 0
    stream = client.chat.completions.create(model="gpt-4o", max_tokens=6, stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "Stream please."}])
    deltas, usage = [], None
    for chunk in stream:
        usage = chunk.usage or usage
        deltas += [c.delta.content for c in chunk.choices if c.delta.content]
    assert deltas and usage is not None and usage.completion_tokens == len(deltas)


def test_anthropic_sdk_sends_messages_to_the_anthropic_provider(stack):
    # The gateway key as a bearer token (auth_token): the stored key goes.
    stored = anthropic.Anthropic(base_url=stack["gw"], auth_token=GATEWAY_KEY, max_retries=0, timeout=60)
    m = stored.messages.create(model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "Say hi."}])
    assert m.type == "message" and m.content[0].text
    # The caller's own x-api-key beside it (the SDK sends one credential header: the other is
    # a default header): that key goes.
    def own(key):
        return anthropic.Anthropic(base_url=stack["gw"], auth_token=GATEWAY_KEY, default_headers={"x-api-key": key},
                                   max_retries=0, timeout=60)

    client = own("sk-a-callers")
    m = client.messages.create(model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "Say hi."}])
    assert m.type == "message" and m.content[0].text and m.usage.output_tokens > 0
    with client.messages.stream(model="claude-x", max_tokens=6,
                                messages=[{"role": "user", "content": "Stream please."}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text and final.content[0].text == text and final.stop_reason in ("end_turn", "max_tokens")
    with pytest.raises(anthropic.AuthenticationError):
        own("nobodys-key").messages.create(model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "hi"}])


def test_openai_sdk_responses_kept_by_the_gateway(stack):
    # The provider keeps nothing (smg-sim refuses previous_response_id and conversation, and
    # answers with every input item it was sent): the gateway stores each turn and sends the
    # history whole.
    client = openai.OpenAI(base_url=f"{stack['gw']}/v1", api_key=GATEWAY_KEY, max_retries=0, timeout=60)
    r = client.responses.create(model="gpt-4o", input="hi")
    assert r.output_text == "heard user:hi" and r.store
    assert client.responses.retrieve(r.id).output_text == r.output_text
    assert [i.type for i in client.responses.input_items.list(r.id).data] == ["message"]
    nxt = client.responses.create(model="gpt-4o", input="again", previous_response_id=r.id)
    assert nxt.previous_response_id == r.id
    assert nxt.output_text == "heard user:hi | assistant:heard user:hi | user:again"
    with client.responses.stream(model="gpt-4o", input="more", previous_response_id=nxt.id) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == final.output_text and final.output_text.endswith("| user:again | user:more")
    assert final.previous_response_id == nxt.id and final.store
    assert client.responses.retrieve(final.id).output_text == final.output_text
    conv = client.conversations.create()
    client.responses.create(model="gpt-4o", input="one", conversation=conv.id)
    two = client.responses.create(model="gpt-4o", input="two", conversation=conv.id)
    assert two.output_text == "heard user:one | assistant:heard user:one | user:two"
    assert len(client.conversations.items.list(conv.id).data) == 4
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
