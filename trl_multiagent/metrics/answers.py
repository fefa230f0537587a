"""Answers in model text and program output: the one answer parser of the library.

* **Reading an answer** (:func:`final_answer`): the content of the last ``\\boxed{...}`` of a reply, optionally the
  last number of a reply without a box (issue 18's rule for small models), or a program's last printed line (the
  math tool agent). Used by the math environments (:mod:`~trl_multiagent.environments.math_tool`, the math debates
  of :mod:`~trl_multiagent.environments.debate`); the box primitives (:func:`last_boxed`, :func:`text_after_boxed`)
  also serve the NLI debate (:func:`parse_nli_label`) and MAPoRL's App. G penalties (is there a box; what follows
  it).
* **Comparing answers** (:func:`answers_match`): mathematical equality with the ``math-verify`` package (AT-GRPO
  B.1: Math-Verify parses and normalises, then a numeric comparison with tolerance; ``verify``'s default rounds
  floats to 6 digits), so ``0.5`` equals ``\\frac{1}{2}`` and ``1,000`` equals ``1000``; :func:`parse_answer` is its
  parsing step. The checker stays bounded in time outside the main thread (see :func:`answers_match`).
"""

from __future__ import annotations

import logging
import re
import threading
from decimal import Decimal, InvalidOperation

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------- reading
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


def final_answer(text: str, accept_last_number: bool = False, printed: bool = False) -> str | None:
    """The final answer of a reply or of a program's output, by the rule of its source.

    * A model's reply (``printed=False``): the content of its last ``\\boxed{...}`` (:func:`last_boxed`); without a
      box, the last number of the text (:func:`last_number`) when ``accept_last_number`` (issue 18's extraction for
      small models that rarely box), else ``None``.
    * A program's printed output (``printed=True``, the math tool agent's answer): its last non-empty line,
      stripped; ``None`` when it printed nothing. A program has no box to prefer, so ``accept_last_number`` must stay
      false.
    """
    if printed:
        if accept_last_number:
            raise ValueError("accept_last_number applies to a reply's text, not to a program's output (printed=True)")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[-1] if lines else None
    boxed = last_boxed(text)
    if boxed is not None or not accept_last_number:
        return boxed
    return last_number(text)


#: The labels of natural language inference (the NLI debate's answers).
NLI_LABELS = ("entailment", "neutral", "contradiction")


def parse_nli_label(text: str | None) -> str | None:
    """An NLI label from a boxed answer: ``entail*`` -> entailment, ``neutral`` -> neutral, ``contradict*`` ->
    contradiction (case and surrounding ``\\text{}`` ignored); anything else -> ``None``."""
    if text is None:
        return None
    word = text.strip().lower()
    for wrapper in ("\\text{", "\\textbf{", "\\mathrm{"):
        if word.startswith(wrapper) and word.endswith("}"):
            word = word[len(wrapper):-1].strip()
    word = word.strip(" .")
    if word.startswith("entail"):
        return "entailment"
    if word.startswith("neutral"):
        return "neutral"
    if word.startswith("contradict"):
        return "contradiction"
    return None


# --------------------------------------------------------------------------------------------------- comparing
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_WITH_UNIT = re.compile(r"((?:\\?\$)?\s*[-+]?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?)\s+[A-Za-z]{2,}[A-Za-z .]*")
_EXPONENT = re.compile(r"(?:\^|\*\*)\s*[{(]?\s*(\d+)")
_TOWER = re.compile(r"(?:\^|\*\*)\s*[{(]?[^+\-=,;]*?(?:\^|\*\*)")


def _costly(text: str, max_chars: int) -> bool:
    """Inputs that could keep sympy busy for a long time (used where no timeout can interrupt it)."""
    if len(text) > max_chars or _TOWER.search(text) or re.search(r"\d{3,}\s*!|factorial", text):
        return True
    return any(len(m.group(1)) > 4 for m in _EXPONENT.finditer(text))


class _TimeoutNotice(logging.Filter):
    """Math-Verify warns at every call made outside the main thread that its timeout is off (its timeouts use
    ``signal.alarm``); this library bounds that work otherwise (:func:`answers_match`) and says so once instead."""

    said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith("Timeout is disabled"):
            return True
        if not _TimeoutNotice.said:
            _TimeoutNotice.said = True
            logger.info("Math-Verify compares answers without its timeouts outside the main thread; inputs that could "
                        "be slow there (longer than max_answer_chars, towers of powers, long exponents, large "
                        "factorials) count as unequal instead")
        return False


def _math_verify():
    """The ``math_verify`` module, imported on first use (it pulls in sympy; most users of this module never compare);
    its per-call timeout notices replaced by one line of ours (:class:`_TimeoutNotice`)."""
    import math_verify

    for name in ("math_verify.parser", "math_verify.grader"):
        mv_logger = logging.getLogger(name)
        if not any(isinstance(f, _TimeoutNotice) for f in mv_logger.filters):
            mv_logger.addFilter(_TimeoutNotice())
    return math_verify


def parse_answer(text: str, printed: bool = False, max_chars: int = 200) -> list:
    """Parse an answer with Math-Verify; ``[]`` when nothing parses (or the input is too costly to parse).

    ``printed``: the text is a program's printed line (read as a plain expression first, LaTeX second); otherwise
    it is a boxed or gold answer (LaTeX first). Plain words after a number (units: ``12.50 dollars``) are dropped,
    and a float literal with an exponent (``1e+300``) is expanded first (an exponent beyond :mod:`decimal`'s range
    is left as written).
    """
    mv = _math_verify()
    text = text.strip()
    with_unit = _WITH_UNIT.fullmatch(text)
    if with_unit:  # "12.50 dollars", "11 years old": LaTeX would read the words as a product of symbols
        text = with_unit.group(1)
    if _NUMBER.fullmatch(text) and "e" in text.lower():
        try:
            text = format(Decimal(text), "f")
        except InvalidOperation:
            pass
    in_main = threading.current_thread() is threading.main_thread()
    if not in_main and _costly(text, max_chars):
        return []
    timeout = 5 if in_main else None  # math-verify's timeout uses signal.alarm: main thread only
    latex = [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()]
    expr = [mv.ExprExtractionConfig(), mv.LatexExtractionConfig()]
    attempts = [(text, expr), (f"${text}$", latex)] if printed else [(f"${text}$", latex), (text, expr)]
    for candidate, config in attempts:
        try:
            parsed = mv.parse(candidate, extraction_config=config, parsing_timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - math-verify raises many kinds on odd input
            logger.debug("math-verify could not parse %r: %s", candidate, exc)
            parsed = []
        if parsed:
            return parsed
    return []


def answers_match(a: str | None, b: str | None, printed: tuple[bool, bool] = (False, False),
                  max_chars: int = 200) -> bool:
    """Whether two answers are mathematically equal (Math-Verify, either direction).

    ``printed``: whether ``a`` and ``b`` are a program's printed lines (see :func:`parse_answer`).

    In the main thread Math-Verify's own timeouts bound the work. Elsewhere (environments stepped from a thread
    pool) they cannot run, so inputs that could be slow to evaluate (longer than ``max_chars``, towers of powers,
    exponents of five or more digits, large factorials) count as unequal instead. Answers longer than
    ``max_chars`` never match.
    """
    if a is None or b is None or len(a) > max_chars or len(b) > max_chars:
        return False
    if a.strip() == b.strip():
        return True
    pa, pb = parse_answer(a, printed[0], max_chars), parse_answer(b, printed[1], max_chars)
    if not pa or not pb:
        return False
    mv = _math_verify()
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    for gold, pred in ((pa, pb), (pb, pa)):
        try:
            if mv.verify(gold, pred, timeout_seconds=timeout):
                return True
        except Exception as exc:  # noqa: BLE001
            logger.debug("math-verify could not compare %r and %r: %s", a, b, exc)
    return False
