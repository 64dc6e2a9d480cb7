"""An agent's tool loop through the official `openai` SDK, against this gateway in front of
`smg-sim --grpc` answering in Qwen3's markup (a think block, then a `<tool_call>`): the call
comes back as `tool_calls` with the reasoning apart, the tool's result goes back, and the
final answer is text. Streamed too, read the way SDK users accumulate tool-call deltas.

Needs SMG_BIN and SMG_SIM_BIN (else both are built with cargo). 127.0.0.1 only, ports picked
here, every wait bounded and on a readiness signal.
"""

import json

import openai
import pytest

from test_grpc_gateway import grpc_stack
from test_grpc_sim_reference import MODEL, get_json

CITIES = {"Paris", "東京", "São Paulo", "Zürich", "New York"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module", params=["io_uring", "epoll"])
def stack(request, tmp_path_factory):
    yield from grpc_stack(request.param, tmp_path_factory,
                          sim_args=["--reasoning-markup", "qwen3", "--tool-call-markup", "qwen"],
                          gateway_args=["--reasoning-parser", "qwen3", "--tool-call-parser", "qwen"])


@pytest.fixture()
def client(stack):
    return openai.OpenAI(base_url=f"{stack['gw']}/v1", api_key="not-needed", max_retries=0, timeout=60)


def accumulate(stream):
    """A streamed answer read the way SDK users accumulate it: the calls by index (id, name,
    arguments joined), the content, the reasoning, and the finish reasons."""
    calls, content, reasoning, finishes = {}, "", "", []
    for chunk in stream:
        for ch in chunk.choices:
            d = ch.delta
            content += d.content or ""
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            for tc in d.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                slot["id"] = tc.id or slot["id"]
                if tc.function:
                    slot["name"] = tc.function.name or slot["name"]
                    slot["arguments"] += tc.function.arguments or ""
            if ch.finish_reason:
                finishes.append(ch.finish_reason)
    return calls, content, reasoning, finishes


def finish_the_loop(client, stack, messages, call_id, city):
    """Sends the tool's result back; the (simulated) model answers in text."""
    messages = messages + [{"role": "tool", "tool_call_id": call_id, "content": f"Sunny in {city}."}]
    final = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],
                                           extra_body={"custom_params": {"sim_output": f"It is sunny in {city}."}})
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == f"It is sunny in {city}."
    assert not final.choices[0].message.tool_calls
    return get_json(f"{stack['sim']}/sim/stats")["grpc"]["last_generate"]["input_tokens"]


def test_a_tool_call_its_result_and_the_final_answer(client, stack):
    messages = [{"role": "user", "content": "What is the weather?"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    msg = choice.message
    assert len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert call.id.startswith("call_")
    city = json.loads(call.function.arguments)["city"]
    assert city in CITIES
    assert msg.model_extra.get("reasoning_content") == f"The user asks about {city}."
    assert msg.content == "\n\nLet me look that up."
    first_prompt = get_json(f"{stack['sim']}/sim/stats")["grpc"]["last_generate"]["input_tokens"]
    # The assistant's call goes back as the SDK builds it, then the tool's result.
    messages.append(msg.model_dump(exclude_none=True, exclude={"reasoning_content"}))
    later_prompt = finish_the_loop(client, stack, messages, call.id, city)
    assert later_prompt > first_prompt, "the call and its result were rendered into the prompt"


def test_streamed_tool_call_deltas_accumulate_to_the_call(client, stack):
    messages = [{"role": "user", "content": "What is the weather?"}]
    stream = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], stream=True)
    calls, content, reasoning, finishes = accumulate(stream)
    assert finishes == ["tool_calls"]
    assert list(calls) == [0]
    call = calls[0]
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    city = json.loads(call["arguments"])["city"]
    assert city in CITIES
    assert reasoning == f"The user asks about {city}." and "<think>" not in content + reasoning
    messages.append({"role": "assistant", "content": content,
                     "tool_calls": [{"id": call["id"], "type": "function",
                                     "function": {"name": "get_weather", "arguments": call["arguments"]}}]})
    finish_the_loop(client, stack, messages, call["id"], city)
