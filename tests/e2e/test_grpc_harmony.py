"""gpt-oss's tool loop through the official `openai` SDK: this gateway renders the
conversation in Harmony and reads the answer's channels, in front of `smg-sim --grpc` serving
a model named `openai/gpt-oss-20b` (which answers in Harmony, its special tokens as their own
ids: reasoning on `analysis`, then a call of `get_weather` on `commentary` when the prompt
declares it). The call comes back as `tool_calls` with the reasoning apart and no Harmony
token in any field, the tool's result goes back (rendered from `functions.get_weather` to the
assistant), and the final answer is text. Streamed too.

Needs SMG_BIN and SMG_SIM_BIN (else both are built with cargo). 127.0.0.1 only, ports picked
here, every wait bounded and on a readiness signal.
"""

import json

import openai
import pytest

from test_grpc_gateway import grpc_stack
from test_grpc_sim_reference import get_json
from test_grpc_tools import CITIES, WEATHER, accumulate

MODEL = "openai/gpt-oss-20b"


@pytest.fixture(scope="module", params=["io_uring", "epoll"])
def stack(request, tmp_path_factory):
    yield from grpc_stack(request.param, tmp_path_factory, model=MODEL)


@pytest.fixture()
def client(stack):
    return openai.OpenAI(base_url=f"{stack['gw']}/v1", api_key="not-needed", max_retries=0, timeout=60)


def the_final_answer(client, stack, messages, call_id, city):
    """Sends the tool's result back; the model (told what to say) answers on `final`."""
    messages = messages + [{"role": "tool", "tool_call_id": call_id, "content": f"Sunny in {city}."}]
    said = f"<|channel|>final<|message|>It is sunny in {city}.<|return|>"
    final = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],
                                           extra_body={"custom_params": {"sim_output": said}})
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == f"It is sunny in {city}."
    assert not final.choices[0].message.tool_calls


def test_a_harmony_call_its_result_and_the_final_answer(client, stack):
    messages = [{"role": "user", "content": "What is the weather?"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], reasoning_effort="low")
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    msg = choice.message
    assert len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    city = json.loads(call.function.arguments)["city"]
    assert city in CITIES
    assert msg.model_extra.get("reasoning_content") == f"The user asks about {city}."
    assert not msg.content
    assert r.usage.completion_tokens_details.reasoning_tokens == len(f"The user asks about {city}.".encode())
    first_prompt = get_json(f"{stack['sim']}/sim/stats")["grpc"]["last_generate"]["input_tokens"]
    messages.append(msg.model_dump(exclude_none=True))
    the_final_answer(client, stack, messages, call.id, city)
    later_prompt = get_json(f"{stack['sim']}/sim/stats")["grpc"]["last_generate"]["input_tokens"]
    assert later_prompt > first_prompt, "the call and its result were rendered into the prompt"


def test_streamed_harmony_deltas(client, stack):
    messages = [{"role": "user", "content": "What is the weather?"}]
    stream = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], stream=True)
    calls, content, reasoning, finishes = accumulate(stream)
    assert finishes == ["tool_calls"]
    call = calls[0]
    city = json.loads(call["arguments"])["city"]
    assert call["name"] == "get_weather" and city in CITIES
    assert reasoning == f"The user asks about {city}." and content == ""
    assert "<|" not in reasoning + content + call["arguments"]
    messages.append({"role": "assistant", "content": None, "reasoning_content": reasoning,
                     "tool_calls": [{"id": call["id"], "type": "function",
                                     "function": {"name": "get_weather", "arguments": call["arguments"]}}]})
    the_final_answer(client, stack, messages, call["id"], city)


def test_what_has_no_harmony_form_is_refused(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}])
    assert e.value.code == "harmony_build_failed"
