"""The Responses and Conversations APIs the gateway serves on gRPC workers, through the
official `openai` SDK (tests/responses.rs checks the wire details; this is the SDK's view):
create, retrieve, delete, streaming, input items, chaining, and conversations with their items.

Needs SMG_BIN and SMG_SIM_BIN (else built with cargo). 127.0.0.1 only, ports picked here,
every wait bounded and on a readiness signal.
"""

import openai
import pytest

from test_grpc_gateway import grpc_stack
from test_grpc_sim_reference import MODEL


@pytest.fixture(scope="module", params=["io_uring", "epoll"])
def stack(request, tmp_path_factory):
    yield from grpc_stack(request.param, tmp_path_factory, sim_args=["--output-tokens", "8"])


@pytest.fixture()
def client(stack):
    return openai.OpenAI(base_url=f"{stack['gw']}/v1", api_key="not-needed", max_retries=0, timeout=60)


def test_create_retrieve_chain_and_delete(client):
    r = client.responses.create(model=MODEL, input="Tell me a story.", instructions="Be brief.",
                                max_output_tokens=5, temperature=0.5)
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text and r.usage.output_tokens == 5
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    items = client.responses.input_items.list(r.id)
    assert [i.type for i in items.data] == ["message"] and items.data[0].content[0].text == "Tell me a story."
    nxt = client.responses.create(model=MODEL, input="And then?", previous_response_id=r.id)
    assert nxt.previous_response_id == r.id and nxt.status == "completed"
    assert nxt.usage.input_tokens > r.usage.input_tokens
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="x", previous_response_id=r.id)
    assert e.value.body["code"] == "previous_response_not_found"


def test_streaming_through_the_sdk(client):
    kinds, deltas, final = [], [], None
    with client.responses.stream(model=MODEL, input="Stream it.") as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "".join(deltas) == final.output_text and final.status == "completed"
    assert client.responses.retrieve(final.id).output_text == final.output_text
    # create(stream=True) gives the raw events, numbered from 0.
    seqs = [e.sequence_number for e in client.responses.create(model=MODEL, input="Again.", stream=True)]
    assert seqs == list(range(len(seqs)))


def test_conversations_and_their_items(client):
    conv = client.conversations.create(metadata={"topic": "demo"},
                                       items=[{"type": "message", "role": "user", "content": "Hello"}])
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "demo"}
    assert client.conversations.retrieve(conv.id).id == conv.id
    upd = client.conversations.update(conv.id, metadata={"topic": "changed", "k": "v"})
    assert upd.metadata == {"topic": "changed", "k": "v"}
    added = client.conversations.items.create(conv.id, items=[
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi!"}]}])
    assert len(added.data) == 1
    r = client.responses.create(model=MODEL, input="What did I say?", conversation=conv.id)
    assert r.status == "completed"
    listed = client.conversations.items.list(conv.id, order="asc")
    assert [i.type for i in listed.data] == ["message"] * 4
    assert listed.data[0].content[0].text == "Hello"
    one = client.conversations.items.retrieve(listed.data[1].id, conversation_id=conv.id)
    assert one.id == listed.data[1].id
    client.conversations.items.delete(listed.data[1].id, conversation_id=conv.id)
    assert len(client.conversations.items.list(conv.id).data) == 3
    deleted = client.conversations.delete(conv.id)
    assert deleted.deleted and deleted.id == conv.id
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conv.id)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="x", conversation="invalid-id")
    assert e.value.body["code"] == "invalid_conversation_id"


AGENT = "Qwen/Qwen3-8B"


@pytest.fixture(scope="module", params=["io_uring", "epoll"])
def agent_stack(request, tmp_path_factory):
    """The simulated model as an agent: it calls get_weather, then answers with the output."""
    yield from grpc_stack(request.param, tmp_path_factory, model=AGENT,
                          sim_args=["--tool-call-markup", "qwen", "--output-tokens", "8"])


@pytest.fixture(scope="module")
def mcp_url():
    """tests/e2e/mcp_server.py, stopped after the module."""
    import pathlib
    import subprocess
    import sys
    script = pathlib.Path(__file__).with_name("mcp_server.py")
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening "), line
        yield f"http://127.0.0.1:{line.split()[1]}/mcp"
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_an_mcp_tool_loop_through_the_sdk(agent_stack, mcp_url):
    client = openai.OpenAI(base_url=f"{agent_stack['gw']}/v1", api_key="not-needed", max_retries=0, timeout=60)
    tools = [{"type": "mcp", "server_label": "wx", "server_url": mcp_url, "require_approval": "never",
              "authorization": "secret-token"}]
    r = client.responses.create(model=AGENT, input="Weather?", tools=tools)
    assert [o.type for o in r.output] == ["mcp_list_tools", "message", "mcp_call", "message"]
    listing, call = r.output[0], r.output[2]
    assert [t.name for t in listing.tools] == ["get_weather", "add", "broken"]
    assert call.name == "get_weather" and call.output.startswith("It is 21 C and sunny in")
    assert call.output in r.output_text
    kinds = []
    with client.responses.stream(model=AGENT, input="Weather?", tools=tools) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_response()
    assert [k for k in kinds if "mcp" in k] == [
        "response.mcp_list_tools.in_progress", "response.mcp_list_tools.completed",
        "response.mcp_call.in_progress", "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done", "response.mcp_call.completed"]
    assert [o.type for o in final.output] == ["mcp_list_tools", "message", "mcp_call", "message"]
    # A follow-up chains off the MCP turn.
    nxt = client.responses.create(model=AGENT, input="And tomorrow?", previous_response_id=final.id, tools=tools)
    assert nxt.status == "completed"
