"""Final answers in model text: the one ``\\boxed{...}`` parser, shared by the math and debate environments (reading
an agent's answer) and MAPoRL's App. G penalties (is there a box; what follows it)."""

from __future__ import annotations

import re

_BOX = re.compile(r"\\(?:boxed|fbox)\s*")
_BARE_TOKEN = re.compile(r"[^\s$]+")


def last_boxed_span(text: str) -> tuple[str, int] | None:
    """``(content, end)`` of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``) of ``text``: its content with
    balanced braces (stripped; may be empty) and the index just past its closing brace. ``\\boxed 5`` (no braces)
    counts too, its content being the next token. An unclosed box is skipped for an earlier one; ``None`` if none."""
    for match in reversed(list(_BOX.finditer(text))):
        i = match.end()
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1:j].strip(), j + 1
            continue  # unbalanced: try an earlier one
        token = _BARE_TOKEN.match(text, i)
        if token and match.group(0) != match.group(0).rstrip():  # "\boxed 5", not "\boxedfoo"
            return token.group(0).rstrip(".,"), token.end()
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` of ``text``; ``None`` when there is none or it is empty."""
    span = last_boxed_span(text)
    return span[0] or None if span else None


def text_after_boxed(text: str) -> str | None:
    """What follows the last complete ``\\boxed{...}``; ``None`` if there is none."""
    span = last_boxed_span(text)
    return None if span is None else text[span[1]:]


_LAST_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?")


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (``12``, ``-3``, ``1,250``, ``2.5``, ``3/4``; thousands separators
    dropped, a trailing sentence period not part of it); ``None`` when the text has no digit."""
    matches = _LAST_NUMBER.findall(text)
    if not matches:
        return None
    return re.sub(r"\s+", "", matches[-1]).replace(",", "")


def final_answer(text: str, accept_last_number: bool = False) -> str | None:
    """An answer's final value: the content of its last ``\\boxed{...}``; without a box, the last number of the text
    when ``accept_last_number`` (issue 18's extraction for small models that rarely box), else ``None``."""
    boxed = last_boxed(text)
    if boxed is not None or not accept_last_number:
        return boxed
    return last_number(text)
