"""Tools for agents (trl_multiagent/environments/tools.py): TRL-style tool functions in the prompt, tool calls parsed, run and
answered between generations, the budget, error messages for bad calls, and a loss that never trains on tool results.

Generations are scripted (``generate_team`` replaced by a function of the decoded prompt) on a real tiny pool, so
that every tool call is deterministic while the chat template, the tokens and the masks are the real ones."""

from __future__ import annotations

import string
from types import SimpleNamespace

import pytest
import torch
from transformers import GenerationConfig

import trl_multiagent.team.pool as agents_module
from tests.tiny import save_tiny
from trl_multiagent.credit.losses import response_policy_loss
from trl_multiagent.environments.base import FunctionEnvironment
from trl_multiagent.environments.tools import call_tool, parse_completion, resolve_tools
from trl_multiagent.generation.logprobs import completion_logps
from trl_multiagent.generation.requests import Generation, GenerationRequest
from trl_multiagent.rollout import JointTreeSampler, Sample
from trl_multiagent.team.pool import AgentPool, AgentSpec
from trl_multiagent.trainers.base import MultiAgentTrainer, loss_mask

#: A minimal tool-capable chat template (tools listed in a system turn, Hermes-style <tool_call> blocks, tool turns).
TEMPLATE = (
    "{%- if tools %}<|system|>tools:{% for t in tools %} {{ t.function.name }}{% endfor %}<eos>{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}<|assistant|>{{ m.content }}"
    "{%- for c in (m.tool_calls or []) %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments}"
    " | tojson }}</tool_call>{% endfor %}<eos>"
    "{%- elif m.role == 'tool' %}<|tool|>{{ m.content }}<eos>"
    "{%- else %}<|{{ m.role }}|>{{ m.content }}<eos>{% endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer.
        b: the second integer.
    """
    return a + b


def explode(x: str) -> str:
    """A tool that always fails.

    Args:
        x: anything.
    """
    raise RuntimeError("the tool broke")


def call(name, **arguments) -> str:
    import json

    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.fixture(scope="module")
def printable_model(tmp_path_factory) -> str:
    chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
    return save_tiny(tmp_path_factory.mktemp("tiny_printable"), chars=chars, max_positions=1024)


def scripted(monkeypatch, script):
    """Replace the pool's decoding with ``script(agent, prompt_text) -> reply`` (the reply gets an EOS; replies are
    cut at ``max_new_tokens`` like real ones). Returns the list of calls (one list of prompt texts per call)."""
    calls = []

    def generate_team(pool, requests, config, max_batch_sequences=None, progress=None):
        calls.append([])
        out = []
        for r in requests:
            tok = pool.tokenizer_of(r.agent)
            ids = list(r.prompt_ids) if r.prompt_ids is not None else pool.encode_prompt(r.agent, r.prompt)
            prompt_text = tok.decode(ids)
            calls[-1].append(prompt_text)
            group = []
            for _ in range(r.num_samples):
                comp = tok(script(r.agent, prompt_text), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                comp = comp[:config.max_new_tokens]
                group.append(Generation(ids, comp, tok.decode(comp, skip_special_tokens=True),
                                        comp[-1] != tok.eos_token_id))
            out.append(group)
        return out

    monkeypatch.setattr(agents_module, "generate_team", generate_team)
    return calls


def make_pool(model, tools=(add, explode), **kw):
    return AgentPool([AgentSpec("solver", model=model, lora_r=4, tools=list(tools), chat_template=TEMPLATE, **kw)])


CONFIG = GenerationConfig(max_new_tokens=400, do_sample=False)


# ------------------------------------------------------------------------------------------------ pieces
def test_tools_are_checked_like_trl_tools():
    assert [f.__name__ for f in resolve_tools([add, "tests/test_tools.py:explode"])] == ["add", "explode"]

    def no_doc(a: int) -> int:
        return a

    with pytest.raises(ValueError, match="no JSON schema"):
        AgentSpec("solver", tools=[no_doc])
    with pytest.raises(ValueError, match="unique"):
        resolve_tools([add, add])
    with pytest.raises(ValueError, match="max_tool_calls_per_turn"):
        AgentSpec("solver", max_tool_calls_per_turn=-1)


def test_an_agent_with_tools_needs_a_template_that_renders_them(printable_model):
    with pytest.raises(ValueError, match="cannot render a tool exchange"):
        AgentPool([AgentSpec("solver", model=printable_model, lora_r=4, tools=[add],
                             chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")])


def test_bad_calls_become_error_messages():
    tools = {"add": add, "explode": explode}
    assert call_tool(tools, {"function": {"name": "add", "arguments": {"a": 2, "b": 3}}}) == ("add", "5", False)
    for bad, expected in [({"function": {"name": "mul", "arguments": {}}}, "not found"),
                          ({"function": {"name": "add", "arguments": {"a": 2}}}, "missing a required argument"),
                          ({"function": {"name": "add", "arguments": {"a": 2, "b": 3, "c": 4}}}, "unexpected"),
                          ({"function": {"name": "add", "arguments": {"a": "two", "b": 3}}}, "must be integer"),
                          ({"function": {"name": "add", "arguments": '{"a": 2'}}, "not valid JSON"),
                          ({"function": {"name": "explode", "arguments": {"x": "y"}}}, "RuntimeError: the tool broke")]:
        name, content, failed = call_tool(tools, bad)
        assert failed and content.startswith("{'error'") and expected in content, (bad, content)


def test_completions_parse_in_the_tool_call_format(printable_model):
    pool = make_pool(printable_model)
    tok = pool.tokenizer_of("solver")
    ids = tok("let me add" + call("add", a=1, b=2) + "<eos>", add_special_tokens=False)["input_ids"]
    message = parse_completion(tok, ids)
    assert message["content"] == "let me add"
    assert message["tool_calls"] == [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]
    broken = parse_completion(tok, tok("<tool_call>{oops</tool_call>", add_special_tokens=False)["input_ids"])
    assert "not valid JSON" in broken["tool_calls"][0]["error"]
    assert "tool_calls" not in parse_completion(tok, tok("42", add_special_tokens=False)["input_ids"])


def test_the_prompt_carries_the_tools_through_the_chat_template(printable_model):
    pool = make_pool(printable_model)
    text = pool.tokenizer_of("solver").decode(pool.encode_prompt("solver", "what is 2+3?"))
    assert text == "<|system|>tools: add explode<eos><|user|>what is 2+3?<eos><|assistant|>"


# ------------------------------------------------------------------------------------------------ the loop
def test_a_tool_call_is_answered_and_the_agent_continues(printable_model, monkeypatch):
    def script(agent, prompt):
        return "the sum is 5" if "<|tool|>5<eos>" in prompt else call("add", a=2, b=3)

    calls = scripted(monkeypatch, script)
    pool = make_pool(printable_model)
    [[gen]] = pool.generate_many([GenerationRequest("solver", "what is 2+3?")], CONFIG)
    tok = pool.tokenizer_of("solver")
    assert len(calls) == 2  # the first completion, then one continuation after the tool result
    assert gen.text == "the sum is 5" and gen.tool_calls == 1 and gen.tool_failures == 0
    assert [m["role"] for m in gen.messages] == ["assistant", "tool", "assistant"]
    assert gen.messages[1] == {"role": "tool", "name": "add", "content": "5"}
    # the completion is the agent's call, the template's tool turn, the agent's answer; the mask marks the tool turn
    assert tok.decode(gen.completion_ids) == (call("add", a=2, b=3) + "<eos><|tool|>5<eos><|assistant|>"
                                              + "the sum is 5<eos>")
    tool_part = [t for t, m in zip(gen.completion_ids, gen.tool_mask) if m == 0]
    own_part = [t for t, m in zip(gen.completion_ids, gen.tool_mask) if m == 1]
    assert tok.decode(tool_part) == "<|tool|>5<eos><|assistant|>"
    assert tok.decode(own_part) == call("add", a=2, b=3) + "<eos>the sum is 5<eos>"
    assert gen.own_token_count == len(own_part) and pool.generation_stats["tokens"] == len(own_part)
    # the continuation's prompt is the prompt, the completion and the tool turn, token for token
    assert calls[1][0] == tok.decode(gen.prompt_ids) + tok.decode(gen.completion_ids[:len(gen.completion_ids)
                                                                                      - len(tok("the sum is 5")
                                                                                            ["input_ids"]) - 1])


def test_the_budget_stops_a_loop(printable_model, monkeypatch):
    calls = scripted(monkeypatch, lambda agent, prompt: "again" + call("add", a=1, b=1))
    pool = make_pool(printable_model, max_tool_calls_per_turn=2)
    [[gen]] = pool.generate_many([GenerationRequest("solver", "loop")], CONFIG)
    assert len(calls) == 3 and gen.tool_calls == 2
    assert [m["role"] for m in gen.messages] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert gen.messages[-1]["tool_calls"] and gen.text == "again"  # the third call is left unanswered


def test_the_length_limit_stops_a_loop(printable_model, monkeypatch):
    scripted(monkeypatch, lambda agent, prompt: call("add", a=1, b=1))
    pool = make_pool(printable_model, max_tool_calls_per_turn=100)
    config = GenerationConfig(max_new_tokens=120, do_sample=False)
    [[gen]] = pool.generate_many([GenerationRequest("solver", "loop")], config)
    assert len(gen.completion_ids) <= 120 and len(gen.tool_mask) == len(gen.completion_ids)


def test_bad_calls_are_answered_with_errors_and_the_agent_goes_on(printable_model, monkeypatch):
    replies = iter([call("mul", a=1, b=2) + call("add", a=1) + call("explode", x="y") + "<tool_call>{no</tool_call>",
                    "sorry"])
    scripted(monkeypatch, lambda agent, prompt: next(replies))
    pool = make_pool(printable_model)
    [[gen]] = pool.generate_many([GenerationRequest("solver", "go")], GenerationConfig(max_new_tokens=900))
    tools = [m for m in gen.messages if m["role"] == "tool"]
    assert len(tools) == 4 and gen.tool_calls == 4 and gen.tool_failures == 4
    assert all(m["content"].startswith("{'error'") for m in tools)
    assert "not found" in tools[0]["content"] and "missing a required argument" in tools[1]["content"]
    assert "the tool broke" in tools[2]["content"] and "not valid JSON" in tools[3]["content"]
    assert gen.text == "sorry"


def test_agents_without_tools_and_completions_without_calls_are_unchanged(printable_model, monkeypatch):
    calls = scripted(monkeypatch, lambda agent, prompt: "plain")
    pool = AgentPool([AgentSpec("solver", model=printable_model, lora_r=4, tools=[add], chat_template=TEMPLATE),
                      AgentSpec("other", model=printable_model, lora_r=4, chat_template=TEMPLATE)])
    [[a], [b]] = pool.generate_many([GenerationRequest("solver", "x"), GenerationRequest("other", "x")], CONFIG)
    assert len(calls) == 1 and a.text == b.text == "plain"
    assert a.tool_mask == [1] * len(a.completion_ids) and b.tool_mask is None and a.tool_calls == 0


def test_samplers_get_tools_through_the_pool(printable_model, monkeypatch):
    scripted(monkeypatch, lambda agent, prompt: "5" if "<|tool|>5" in prompt else call("add", a=2, b=3))
    pool = make_pool(printable_model)
    env = lambda: FunctionEnvironment(["solver"], {"solver": lambda task: task["q"]},  # noqa: E731
                                      lambda completions: float(completions["solver"] == "5"))
    exp = JointTreeSampler(num_samples=2, num_turns=1).rollout(pool, env, [{"q": "2+3?"}], CONFIG)
    assert [j.reward for j in exp.joint_actions] == [1.0, 1.0]
    assert all(s.generation.tool_calls == 1 for s in exp.samples)


# ------------------------------------------------------------------------------------------------ the loss
def test_tool_result_tokens_get_no_gradient(printable_model, monkeypatch):
    scripted(monkeypatch, lambda agent, prompt: "ok" if "<|tool|>" in prompt else call("add", a=2, b=3))
    pool = make_pool(printable_model)
    gens = pool.generate_many([GenerationRequest("solver", "2+3?"), GenerationRequest("solver", "again?")], CONFIG)
    samples = [Sample(agent="solver", policy="solver", episode=i, turn=0, node=i, generation=g[0], joint_ids=[],
                      advantage=1.0 - 2 * i) for i, g in enumerate(gens)]
    trainer = SimpleNamespace(pool=pool, use_vllm=False, values_dtype=torch.float32,
                              accelerator=SimpleNamespace(device=torch.device("cpu")))
    batch = MultiAgentTrainer.collate(trainer, "solver", samples)
    assert "tool_mask" in batch
    base = pool.activate("solver")
    logps, _ = completion_logps(base, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"],
                                batch["completion_mask"], temperature=1.0)
    logps.retain_grad()
    loss, _ = response_policy_loss(logps, logps.detach(), loss_mask(batch), batch["advantages"], 0.2, 0.2)
    loss.backward()
    tool = (batch["tool_mask"] == 0) & (batch["completion_mask"] == 1)
    own = (batch["tool_mask"] == 1) & (batch["completion_mask"] == 1)
    assert tool.sum() > 0 and own.sum() > 0
    assert torch.all(logps.grad[tool] == 0) and torch.all(logps.grad[own] != 0)
    # the tool tokens are still read: the answer's log-probs depend on what the tool returned
    assert batch["completion_mask"][tool].eq(1).all()


def test_a_saved_team_names_its_tools_and_reloads_them(printable_model, tmp_path):
    import json

    pool = AgentPool([AgentSpec("solver", model=printable_model, lora_r=4, tools=[add, "tests/test_tools.py:explode"],
                                chat_template=TEMPLATE)])
    pool.save_adapters(tmp_path)
    record = json.loads((tmp_path / "adapters" / "team.json").read_text())["agents"][0]
    assert record["tools"] == ["tests.test_tools:add", "tests/test_tools.py:explode"]
    again = AgentPool.from_pretrained(tmp_path)
    assert [f.__name__ for f in again.tools_of("solver")] == ["add", "explode"]


def test_a_trainer_step_with_tool_calls_trains_on_the_agents_tokens_only(printable_model, tmp_path, monkeypatch):
    """A MAGRPO step on a recipe whose agents have tools: the rollout's samples carry tool masks, and the update
    runs with them (the loss reads completion_mask * tool_mask)."""
    import json as _json

    from trl_multiagent.command.cli import parse_recipe
    from trl_multiagent.command.runner import Run

    def script(agent, prompt):
        return "5" if "<|tool|>" in prompt else call("add", a=2, b=3)

    scripted(monkeypatch, script)
    agents = [{"name": n, "chat_template": TEMPLATE, "tools": ["tests/test_tools.py:add"]}
              for n in ("adder", "subtractor")]
    recipe, config, given = parse_recipe([
        "--config", "recipes/configs/trl_counter_team.yaml", "--model", printable_model, "--agents",
        _json.dumps(agents), "--output_dir", str(tmp_path / "out"), "--max_steps", "1", "--max_completion_length",
        "200", "--num_generations", "2", "--num_turns", "1", "--report_to", "none", "--disable_tqdm", "true",
        "--eval_num_problems", "2"])
    run = Run(recipe, config, given)
    run.prepare()
    trainer = run.build_trainer()
    seen = []
    original = trainer.collate

    def collate(policy, samples):
        batch = original(policy, samples)
        seen.append(batch)
        return batch

    monkeypatch.setattr(trainer, "collate", collate)
    output = trainer.train()
    assert output.global_step == 1 and seen
    assert all("tool_mask" in b and (b["tool_mask"] == 0).any() for b in seen)
    assert torch.isfinite(torch.tensor(output.training_loss))


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory) -> str:
    """A tiny model whose tokenizer carries TRL's copy of Qwen3's chat template (with <|im_start|> / <|im_end|> as
    special tokens, <|im_end|> the EOS): TRL knows it, so tool calls go through TRL's own parser."""
    from trl.chat_template_utils import qwen3_chat_template

    from tests.tiny import build_model, build_tokenizer

    directory = tmp_path_factory.mktemp("tiny_qwen3")
    tok = build_tokenizer([c for c in string.printable if c not in "\r\x0b\x0c"])
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = qwen3_chat_template
    model = build_model(len(tok), max_positions=2048)
    model.config.eos_token_id = model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return str(directory)


def test_a_template_trl_knows_is_parsed_by_trl_and_trained_with_trls_training_template(qwen3_model, monkeypatch):
    from trl.chat_template_utils import qwen3_training_chat_template

    def script(agent, prompt):
        if "<tool_response>\n5\n</tool_response>" in prompt:
            return "It is 5."
        return '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'

    calls = scripted(monkeypatch, script)
    pool = AgentPool([AgentSpec("solver", model=qwen3_model, lora_r=4, tools=[add])])
    tok = pool.tokenizer_of("solver")
    assert tok.response_template is not None  # TRL's add_response_schema recognised the template
    assert pool.chat_template_of("solver") == qwen3_training_chat_template  # Qwen3's is not prefix-preserving
    [[gen]] = pool.generate_many([GenerationRequest("solver", "2+3?")], CONFIG)
    assert len(calls) == 2 and gen.text == "It is 5." and gen.tool_calls == 1 and gen.tool_failures == 0
    assert gen.messages[0]["tool_calls"] == [{"type": "function",
                                              "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]
    tool_part = tok.decode([t for t, m in zip(gen.completion_ids, gen.tool_mask) if m == 0])
    assert tool_part == "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
