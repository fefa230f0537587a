"""What a team asks generation for and what it gets back: the :data:`Prompt` type, :class:`GenerationRequest` (one
prompt of one agent) and :class:`Generation` (one sampled response).

The bottom of the library: this module imports nothing of it, so that environments, samplers, evaluators and
trainers can name these types without importing anything above them.
"""

from __future__ import annotations

from dataclasses import dataclass

#: A prompt: a string (wrapped as one user message when the agent's tokenizer has a chat template) or a list of chat
#: messages ``[{"role": ..., "content": ...}, ...]``.
Prompt = str | list[dict[str, str]]


class ToolPrompt(list):
    """Chat messages with the tools the chat template shows for them (``tools``: JSON schemas or functions), for an
    environment whose tools belong to its own state (:class:`~trl_multiagent.environments.trl_env.TRLEnvironmentTeam`):
    the pool renders them with ``apply_chat_template(messages, tools=...)`` beside the agent's own tools; the
    environment runs the calls itself, in ``step``."""

    def __init__(self, messages=(), tools=()):
        super().__init__(messages)
        self.tools = list(tools)


@dataclass
class Generation:
    """One sampled response: token ids of the prompt and the completion, and the decoded completion text.

    An agent with tools (:mod:`trl_multiagent.environments.tools`) gets more: ``completion_ids`` are every token after the prompt,
    its own and the tool results', ``tool_mask`` marks its own (1) and the tools' (0) as TRL's ``tool_mask`` does (the
    loss covers only the 1s), ``text`` is its last assistant message's content, ``messages`` the whole exchange
    (assistant, tool, ..., assistant), ``tool_calls`` / ``tool_failures`` count the calls run and those answered with
    an error."""

    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    truncated: bool = False
    tool_mask: list[int] | None = None
    messages: list[dict] | None = None
    tool_calls: int = 0
    tool_failures: int = 0

    @property
    def own_token_count(self) -> int:
        """The tokens the agent generated itself (the completion less any tool result)."""
        return len(self.completion_ids) if self.tool_mask is None else sum(self.tool_mask)


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt of one agent to sample ``num_samples`` responses for, in a team-level :meth:`AgentPool.generate_many`
    call. ``use_adapter=False`` samples from the agent's base model with its adapter switched off (the untrained
    model: the inference-time baselines). ``prompt_ids``, when given, are the prompt's tokens as they are (no chat
    template is applied): the tool layer continues a completion after tool results this way."""

    agent: str
    prompt: Prompt
    num_samples: int = 1
    use_adapter: bool = True
    prompt_ids: tuple[int, ...] | None = None
