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
