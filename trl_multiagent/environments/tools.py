"""Tools for agents, as TRL's ``GRPOTrainer(tools=...)`` takes them: the one tool-calling layer of every sampler.

An agent's :class:`~trl_multiagent.team.pool.AgentSpec` names its tools (``tools=[fn, "path/file.py:function"]``):
plain functions with type hints and a Google-style docstring, exactly what TRL's ``tools=`` takes (transformers turns
them into JSON schemas for the chat template). Then, for every response of that agent, wherever it is sampled
(:meth:`AgentPool.generate_many <trl_multiagent.team.pool.AgentPool.generate_many>`, the one generation entry point of
the samplers and the evaluators, calls :func:`run_tool_calls`):

1. the prompt is rendered with ``tokenizer.apply_chat_template(messages, tools=[...])`` (the tools' schemas in the
   prompt, as TRL renders them);
2. the completion is parsed for tool calls: with TRL's ``parse_response`` where the tokenizer has a response template
   (TRL's ``add_response_schema`` sets one for the chat templates TRL knows: Qwen, Llama 3, ...), otherwise with the
   ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` format (Hermes / Qwen: what TRL parses for Qwen);
3. every call is run and its result appended as a ``{"role": "tool", "name": ..., "content": ...}`` message, rendered
   by the chat template after the completion's own tokens (the tokens between the assistant's end of turn and the
   next assistant header, as TRL computes them), and the agent continues from there, until a completion makes no
   call, the budget ``max_tool_calls_per_turn`` would be exceeded (the calls of that completion are then not run and
   the response ends there), or the response reaches ``max_new_tokens``;
4. the :class:`~trl_multiagent.generation.requests.Generation` holds every token after the prompt (the agent's and
   the tools') with ``tool_mask``: 1 for the agent's own tokens, 0 for the tools' (TRL's ``tool_mask``); the loss
   and the token counts use ``completion_mask * tool_mask``, so a tool result's tokens get no gradient. ``text`` is
   the last assistant message's content (what the environment receives as the agent's action) and ``messages`` the
   whole exchange (assistant, tool, ..., assistant).

A bad call never crashes a rollout: an unknown tool, arguments that do not fit the function (missing, unexpected or
of the wrong JSON type), a call that does not parse, or a tool that raises each become the tool message
``{"error": "..."}`` (TRL's form) and the agent continues.

Tools that run model-written code must not run it in the training process: the tool calls the sandbox itself, e.g.::

    from trl_multiagent.sandbox import SandboxConfig, run_python

    def python(code: str) -> str:
        \"\"\"Run a Python program and return what it printed.

        Args:
            code: the program.
        \"\"\"
        result = run_python(code, SandboxConfig(timeout_s=5))
        return result.stdout if result.status == "passed" else f"{result.status}: {result.stderr[-500:]}"

(docs/guides/tools.md shows the whole setup.)
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trl_multiagent.generation.requests import Generation, GenerationRequest
from trl_multiagent.runtime.user_code import import_object

logger = logging.getLogger(__name__)

#: The tool-call format parsed when the tokenizer has no response template (Hermes / Qwen 2.5 / Qwen 3).
TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
               "object": (dict,), "null": (type(None),)}


# ------------------------------------------------------------------------------------------------------ tools
def resolve_tools(tools: Sequence[Callable | str] | None, owner: str = "agent") -> list[Callable]:
    """The functions ``tools`` name (callables pass through; ``"module:function"`` or ``"path/file.py:function"``
    are imported), each checked for what the chat template needs: a name and a JSON schema from its type hints and
    docstring (``transformers.utils.get_json_schema``, as ``apply_chat_template(tools=...)`` builds it)."""
    from transformers.utils import get_json_schema

    functions = []
    for spec in tools or ():
        fn = import_object(spec, "tool")
        if not callable(fn):
            raise ValueError(f"{owner}: tool {spec!r} is not callable")
        try:
            get_json_schema(fn)
        except Exception as exc:  # noqa: BLE001 - transformers raises several kinds for a function it cannot describe
            raise ValueError(f"{owner}: tool {getattr(fn, '__name__', spec)!r} has no JSON schema: {exc} (a tool "
                             "needs type hints on every argument and a Google-style docstring with an Args: section, "
                             "as TRL's tools=)") from exc
        functions.append(fn)
    names = [tool_name(fn) for fn in functions]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"{owner}: tool names must be unique; repeated: {dupes}")
    return functions


def tool_name(fn: Callable) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def tool_schema(fn: Callable) -> dict:
    from transformers.utils import get_json_schema

    return get_json_schema(fn)


def tool_spec_string(spec: Callable | str) -> str:
    """A tool as a string for ``team.json``: the spec it was named by, or ``module:qualname`` of a callable."""
    if isinstance(spec, str):
        return spec
    return f"{getattr(spec, '__module__', '?')}:{getattr(spec, '__qualname__', tool_name(spec))}"


def _check_arguments(fn: Callable, schema: dict, arguments: Any) -> str | None:
    """Why ``arguments`` do not fit ``fn`` (``None`` when they do)."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    try:
        inspect.signature(fn).bind(**arguments)
    except TypeError as exc:
        return str(exc)
    properties = schema.get("function", schema).get("parameters", {}).get("properties", {})
    for name, value in arguments.items():
        kind = properties.get(name, {}).get("type")
        kinds = kind if isinstance(kind, list) else [kind] if kind else []
        allowed = tuple(t for k in kinds for t in _JSON_TYPES.get(k, (object,)))
        if allowed and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)):
            return f"argument {name!r} must be {' or '.join(kinds)}, got {type(value).__name__} {value!r}"
    return None


def call_tool(tools: Mapping[str, Callable], call: Mapping[str, Any]) -> tuple[str, str, bool]:
    """Run one parsed tool call; ``(name, content of the tool message, failed)``. Nothing raises: an unparsable call,
    an unknown tool, arguments that do not fit, or an exception inside the tool become ``{"error": ...}``."""
    function = call.get("function", call)
    name = function.get("name") if isinstance(function, Mapping) else None
    if "error" in call:
        return str(name or "unknown"), str({"error": call["error"]}), True
    if not isinstance(name, str) or name not in tools:
        known = ", ".join(sorted(tools)) or "none"
        return str(name or "unknown"), str({"error": f"Tool {name!r} not found (tools: {known})."}), True
    arguments = function.get("arguments", {})
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):  # some templates keep the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return name, str({"error": f"Arguments of {name} are not valid JSON: {exc}"}), True
    fn = tools[name]
    problem = _check_arguments(fn, tool_schema(fn), arguments)
    if problem is not None:
        return name, str({"error": f"Bad arguments for {name}: {problem}"}), True
    try:
        result = fn(**arguments)
    except Exception as exc:  # noqa: BLE001 - a failing tool is the model's feedback, never a crash
        return name, str({"error": f"{type(exc).__name__}: {exc}"}), True
    return name, str(result), False


# ------------------------------------------------------------------------------------------------------ parsing
def parse_completion(tokenizer, ids: Sequence[int], prefix: Sequence[int] | None = None,
                     tools: Sequence[Callable] | None = None) -> dict:
    """One completion as an assistant message ``{"role": "assistant", "content": ..., "tool_calls": [...]}``
    (``tool_calls`` only when it makes calls). With a response template on the tokenizer this is TRL's
    ``parse_response`` (its fallback to plain text included); otherwise the ``<tool_call>`` JSON format, where a
    block that does not parse becomes a call carrying an ``error`` (answered with an error message)."""
    if getattr(tokenizer, "response_template", None) is not None or \
            getattr(tokenizer, "response_schema", None) is not None:
        from trl.chat_template_utils import parse_response

        return parse_response(tokenizer, list(ids), prefix=list(prefix) if prefix is not None else None,
                              tools=list(tools) if tools else None)
    return parse_text(tokenizer.decode(list(ids), skip_special_tokens=True))


def parse_text(text: str) -> dict:
    """A response's text as an assistant message, its ``<tool_call>`` JSON blocks as ``tool_calls`` (a block that
    does not parse becomes a call carrying an ``error``)."""
    calls = []
    for block in TOOL_CALL_RE.findall(text):
        try:
            data = json.loads(block)
        except json.JSONDecodeError as exc:
            calls.append({"type": "function", "function": {"name": "unknown", "arguments": {}},
                          "error": f"Tool call is not valid JSON: {exc}"})
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            calls.append({"type": "function", "function": {"name": "unknown", "arguments": {}},
                          "error": 'A tool call must be {"name": ..., "arguments": {...}}'})
            continue
        calls.append({"type": "function", "function": {"name": data["name"],
                                                       "arguments": data.get("arguments") or {}}})
    message: dict[str, Any] = {"role": "assistant", "content": TOOL_CALL_RE.sub("", text).strip()}
    if calls:
        message["tool_calls"] = calls
    return message


def prepare_tokenizer(tokenizer) -> None:
    """Give ``tokenizer`` TRL's response template for its chat template when TRL knows it (``add_response_schema``),
    so that tool calls are parsed as TRL parses them; other templates keep the ``<tool_call>`` parser."""
    if getattr(tokenizer, "response_template", None) is not None or \
            getattr(tokenizer, "response_schema", None) is not None:
        return
    from trl.chat_template_utils import add_response_schema

    try:
        add_response_schema(tokenizer)
    except (ValueError, ImportError):
        pass


def renders_tool_calls(tokenizer, chat_template: str | None = None) -> bool:
    """Whether the chat template renders a whole tool exchange (user, assistant with a tool call, tool): the call's
    name, its argument and the tool's answer all appear in the text (TRL's ``supports_tool_calling`` check, with the
    agent's own template where it has one)."""
    name, key, value, content = "tool_name_q1", "tool_key_q2", "tool_value_q3", "tool_content_q4"
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"type": "function", "function": {"name": name, "arguments": {key: value}}}]},
                {"role": "tool", "name": name, "content": content}]
    kwargs = {"chat_template": chat_template} if chat_template else {}
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    except Exception:  # noqa: BLE001 - a template that rejects the exchange does not support tools
        return False
    return all(part in text for part in (name, key, value, content))


def tool_suffix_ids(tokenizer, tool_messages: Sequence[Mapping[str, Any]], chat_template: str | None = None
                    ) -> list[int]:
    """The tokens the chat template puts after an assistant turn's end for ``tool_messages``, up to and including
    the next assistant header: the difference of two renderings of a small conversation, with and without the tool
    messages (the prefix cut after its last EOS, so that a template's newline after the end of turn is part of the
    suffix), as TRL builds them."""
    call = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": call}]
    kwargs = {"chat_template": chat_template} if chat_template else {}
    prefix = _render_ids(tokenizer, dummy, add_generation_prompt=False, **kwargs)
    full = _render_ids(tokenizer, dummy + list(tool_messages), add_generation_prompt=True, **kwargs)
    eos = [i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id]
    if eos:
        prefix = prefix[:eos[-1] + 1]
    if full[:len(prefix)] != prefix:
        raise ValueError("The chat template renders earlier messages differently once tool messages follow (it is not "
                         "prefix-preserving); tool results cannot be appended to a completion's tokens")
    return full[len(prefix):]


def _render_ids(tokenizer, messages, add_generation_prompt: bool, **kwargs) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False,
                                         **kwargs)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------------------------------ the team's templates
def _training_template(agent: str, tokenizer) -> str | None:
    """``None`` when the tokenizer's chat template keeps earlier messages as they are once tool messages follow (tool
    results are appended to a completion's tokens); otherwise TRL's training version of it, as TRL's trainer takes
    for tools (``get_training_chat_template``)."""
    from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving

    if is_chat_template_prefix_preserving(tokenizer):
        return None
    try:
        return get_training_chat_template(tokenizer)
    except ValueError as exc:
        raise ValueError(f"Agent {agent!r} has tools, but its tokenizer's chat template renders earlier messages "
                         "differently once more follow, and TRL has no training version of it; give the agent a "
                         "chat_template that keeps them (docs/guides/tools.md)") from exc


def prepare_tool_agents(specs, tokenizer_of: Callable) -> tuple[dict[str, list[Callable]], dict[str, str | None]]:
    """Every agent's tool functions and the chat template its prompts are rendered with (``None``: the tokenizer's).

    An agent with tools needs a template that renders a tool exchange (an assistant's tool call, the tool's answer);
    when its own tokenizer's template rewrites earlier messages once more follow, TRL's training version of it is
    taken (``_training_template``), so that tool results can be appended to a completion's tokens.
    """
    tools = {spec.name: spec.tool_functions() for spec in specs}
    templates = {spec.name: spec.chat_template_text() for spec in specs}
    for name, fns in tools.items():
        if not fns:
            continue
        tok = tokenizer_of(name)
        if templates[name] is None and not getattr(tok, "chat_template", None) or \
                not renders_tool_calls(tok, templates[name]):
            raise ValueError(f"Agent {name!r} has tools but its chat template cannot render a tool exchange "
                             "(an assistant's tool call and the tool's answer); give the agent a chat_template "
                             "that does (docs/guides/tools.md)")
        if templates[name] is None:
            prepare_tokenizer(tok)
            templates[name] = _training_template(name, tok)
    return tools, templates


# ------------------------------------------------------------------------------------------------------ the loop
@dataclasses.dataclass
class _Row:
    request: int
    sample: int
    agent: str
    tools: dict[str, Callable]
    prompt_ids: list[int]
    gen: Generation
    completion: list[int]
    mask: list[int]
    messages: list[dict]
    message: dict  # the last assistant message
    calls: int = 0
    failures: int = 0
    truncated: bool = False


def run_tool_calls(pool, requests: Sequence[GenerationRequest], generations: list[list[Generation]],
                   generation_config, generate: Callable[[list[GenerationRequest], Any], list[list[Generation]]]
                   ) -> list[list[Generation]]:
    """Answer the tool calls of ``generations`` (the first samples of ``requests``) and let their agents continue.

    ``pool`` gives each agent's tools (``pool.tools_of``), tokenizer and chat template; ``generate(requests,
    config)`` samples continuations (requests with ``prompt_ids``: the prompt, the completion so far and the tool
    results). Returns the generations with every agent that has tools answered (others unchanged)."""
    max_new = getattr(generation_config, "max_new_tokens", None)
    rows: list[_Row] = []
    out = [list(group) for group in generations]
    for i, req in enumerate(requests):
        fns = pool.tools_of(req.agent)
        if not fns:
            continue
        tok = pool.tokenizer_of(req.agent)
        tools = {tool_name(fn): fn for fn in fns}
        for k, gen in enumerate(out[i]):
            message = parse_completion(tok, gen.completion_ids, gen.prompt_ids, fns)
            rows.append(_Row(i, k, req.agent, tools, list(gen.prompt_ids), gen, list(gen.completion_ids),
                             [1] * len(gen.completion_ids), [message], message, truncated=gen.truncated))
    pending = [r for r in rows if r.message.get("tool_calls") and not r.truncated]
    while pending:
        continuing: list[tuple[_Row, list[int], int]] = []
        for row in pending:
            calls = row.message["tool_calls"]
            budget = pool.specs[row.agent].max_tool_calls_per_turn
            if row.calls + len(calls) > budget:
                continue  # the budget stops the loop: this completion's calls stay unanswered
            tool_messages = []
            for call in calls:
                name, content, failed = call_tool(row.tools, call)
                tool_messages.append({"role": "tool", "name": name, "content": content})
                row.failures += failed
            row.calls += len(calls)
            suffix = tool_suffix_ids(pool.tokenizer_of(row.agent), tool_messages, pool.chat_template_of(row.agent))
            left = None if max_new is None else max_new - len(row.completion) - len(suffix)
            if left is not None and left <= 0:
                continue  # no room for the results and an answer (TRL drops such results too)
            row.messages.extend(tool_messages)
            row.completion += suffix
            row.mask += [0] * len(suffix)
            continuing.append((row, suffix, left))
        if not continuing:
            break
        config = generation_config
        if max_new is not None:
            config = copy.deepcopy(generation_config)
            config.max_new_tokens = max(left for _, _, left in continuing)
        new = generate([GenerationRequest(row.agent, row.messages, 1, requests[row.request].use_adapter,
                                          prompt_ids=tuple(row.prompt_ids + row.completion))
                        for row, _, _ in continuing], config)
        pending = []
        for (row, _, left), group in zip(continuing, new):
            cont = group[0]
            ids = list(cont.completion_ids)
            truncated = cont.truncated
            if left is not None and len(ids) > left:
                ids, truncated = ids[:left], True
            before = len(row.completion)
            row.completion += ids
            row.mask += [1] * len(ids)
            row.truncated = truncated
            logps = getattr(cont, "sampling_logps", None)
            if logps is not None and getattr(row.gen, "sampling_logps", None) is not None:
                row.gen.sampling_logps = list(row.gen.sampling_logps) + [0.0] * (before - len(row.gen.sampling_logps)) \
                    + list(logps[:len(ids)])
            tok = pool.tokenizer_of(row.agent)
            row.message = parse_completion(tok, ids, row.prompt_ids + row.completion[:before],
                                           list(row.tools.values()))
            row.messages.append(row.message)
            if row.message.get("tool_calls") and not truncated:
                pending.append(row)
    for row in rows:
        changes = {"tool_mask": row.mask, "messages": row.messages, "tool_calls": row.calls,
                   "tool_failures": row.failures}
        if row.calls:
            changes.update(completion_ids=row.completion, truncated=row.truncated, text=row.message.get("content", ""))
        out[row.request][row.sample] = dataclasses.replace(row.gen, **changes)
    return out


__all__ = ["TOOL_CALL_RE", "call_tool", "parse_completion", "parse_text", "prepare_tokenizer", "renders_tool_calls", "resolve_tools",
           "run_tool_calls",
           "tool_name", "tool_schema", "tool_spec_string", "tool_suffix_ids"]
