"""The problems of the math environments: generated arithmetic word problems (two levels, disjoint train / test
splits) and the mappings of GSM8K and Polaris rows to the environments' columns.

Used by :class:`~trl_multiagent.environments.math_tool.MathToolEnv` (AT-GRPO's reasoner / tool team) and
:class:`~trl_multiagent.environments.debate.MathDebateEnv` (MAPoRL's debate), whose ``make_dataset`` call
:func:`word_problems`; the NLI debate's generator borrows :data:`NAMES`.

* :func:`word_problems` generates problems with exact integer or fraction answers. Level ``"standard"``: shopping
  totals, work rates, speeds, ages, ratio sharing, successive spending, a multi-step orchard problem
  (:data:`TEMPLATES`); level ``"easy"``: one addition, subtraction or small product on numbers up to 10
  (:data:`EASY_TEMPLATES`, issue 18). Train and test problems come from separate seed streams, and a problem's split
  is also fixed by a hash of its text (:func:`question_split`), so the two splits can never share a problem whatever
  the seeds. The same seed, split and level always give the same problems.
* :func:`gsm8k_to_task` and :func:`polaris_to_task` map rows of GSM8K (``openai/gsm8k``, config ``main``) and of
  Polaris-Dataset-53K to the columns ``question``, ``answer``; recipes name them in ``dataset_transform``
  (``trl_multiagent.environments.math_problems:gsm8k_to_task``).
"""

from __future__ import annotations

import hashlib
import json
import operator
import random
from collections.abc import Callable, Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Any

# --------------------------------------------------------------------------------------------------- word problems
NAMES = ("Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Isla", "Jamal", "Keiko", "Liam", "Maya",
         "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sam", "Tariq")
ITEMS = ("notebooks", "pens", "mugs", "candles", "scarves", "puzzles", "plants", "sketchbooks", "lamps", "kites")
WORKERS = (("Pipe A", "pipe B", "fill the tank"), ("Ana", "her brother", "paint the fence"),
           ("The old printer", "the new printer", "print the batch of flyers"),
           ("One pump", "a second pump", "empty the pond"), ("Tom", "his sister", "rake the garden"))
THINGS = ("marbles", "stickers", "cards", "coins", "stamps", "shells", "beads")
SPENDING = (("books", "lunch"), ("a jacket", "a movie ticket"), ("groceries", "bus fares"), ("a gift", "snacks"))
FRUITS = ("apple", "pear", "peach", "plum", "orange")


def _money(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"


def format_answer(value: Fraction) -> str:
    """An exact answer as text: ``12``, ``12.5`` (finite decimals) or ``12/7``."""
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    d = value.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    if d == 1:
        return format(Decimal(value.numerator) / Decimal(value.denominator), "f")
    return f"{value.numerator}/{value.denominator}"


def _shopping(rng: random.Random):
    n1, n2 = rng.randint(2, 9), rng.randint(2, 6)
    p1, p2 = 25 * rng.randint(2, 60), 25 * rng.randint(2, 40)
    item1, item2 = rng.sample(ITEMS, 2)
    total = n1 * p1 + n2 * p2  # at most 9 * $15 + 6 * $10 = $195: a $200 bill always covers it
    name, bill = rng.choice(NAMES), next(b for b in (10, 20, 50, 100, 200) if 100 * b >= total)
    q = (f"{name} buys {n1} {item1} that cost {_money(p1)} each and {n2} {item2} that cost {_money(p2)} each. "
         f"{name} pays with a ${bill} bill. How much change, in dollars, does {name} get back?")
    return q, Fraction(100 * bill - total, 100), {"n1": n1, "price1_cents": p1, "n2": n2, "price2_cents": p2,
                                                   "bill": bill}


def _work_rate(rng: random.Random):
    a, b = rng.sample(range(2, 16), 2)
    first, second, job = rng.choice(WORKERS)
    q = (f"{first} can {job} in {a} hours, and {second} can {job} in {b} hours. Working together at these rates, "
         f"how many hours do they need to {job}?")
    return q, Fraction(a * b, a + b), {"a": a, "b": b}


def _speed(rng: random.Random):
    v1, v2 = rng.sample(range(6, 31), 2)
    t1, t2 = 5 * rng.randint(2, 24), 5 * rng.randint(2, 24)
    name = rng.choice(NAMES)
    q = (f"{name} cycles at {v1} km/h for {t1} minutes, then at {v2} km/h for {t2} minutes. "
         f"How many kilometres does {name} ride in total?")
    return q, Fraction(v1 * t1 + v2 * t2, 60), {"v1": v1, "t1": t1, "v2": v2, "t2": t2}


def _ages(rng: random.Random):
    while True:
        child_age, m = rng.randint(2, 15), rng.choice((2, 3))
        k = rng.randint(m + 1, m + 4)
        years = Fraction((k - m) * child_age, m - 1)
        if years.denominator == 1 and 1 <= years <= 40 and 20 <= k * child_age <= 80:
            break
    parent, child = rng.sample(NAMES, 2)
    q = (f"{parent} is {k} times as old as {child}. In {years} years, {parent} will be {m} times as old as "
         f"{child}. How old is {child} now?")
    return q, Fraction(child_age), {"k": k, "m": m, "years": int(years)}


def _ratio(rng: random.Random):
    p, q_ = rng.sample(range(1, 10), 2)
    unit = rng.randint(2, 30)
    first, second = rng.sample(NAMES, 2)
    things = rng.choice(THINGS)
    total = (p + q_) * unit
    q = f"{first} and {second} share {total} {things} in the ratio {p}:{q_}. How many {things} does {second} get?"
    return q, Fraction(q_ * unit), {"total": total, "p": p, "q": q_}


def _spending(rng: random.Random):
    d1, d2 = rng.randint(2, 6), rng.randint(2, 6)
    total = d1 * d2 * rng.randint(1, 20)
    name = rng.choice(NAMES)
    first, second = rng.choice(SPENDING)
    q = (f"{name} has ${total}. {name} spends 1/{d1} of it on {first}, then 1/{d2} of what is left on {second}. "
         f"How many dollars does {name} have left?")
    return q, Fraction(total) * (1 - Fraction(1, d1)) * (1 - Fraction(1, d2)), {"total": total, "d1": d1, "d2": d2}


def _orchard(rng: random.Random):
    while True:
        rows, per_row, per_tree = rng.randint(2, 12), rng.randint(3, 15), rng.randint(10, 60)
        bag = rng.choice((4, 5, 6, 8, 10, 12))
        if rows * per_row * per_tree % bag == 0:
            break
    price = 25 * rng.randint(4, 24)
    fruit = rng.choice(FRUITS)
    q = (f"An orchard has {rows} rows of {per_row} {fruit} trees. Each tree gives {per_tree} {fruit}s. All the "
         f"{fruit}s are packed into bags of {bag}, and each bag sells for {_money(price)}. How much money, in "
         f"dollars, do all the bags bring in?")
    return q, Fraction(rows * per_row * per_tree // bag * price, 100), {
        "rows": rows, "per_row": per_row, "per_tree": per_tree, "bag": bag, "price_cents": price}


#: The word-problem templates: name -> ``fn(rng) -> (question, exact answer, parameters)``.
TEMPLATES: dict[str, Callable[[random.Random], tuple[str, Fraction, dict]]] = {
    "shopping": _shopping, "work_rate": _work_rate, "speed": _speed, "ages": _ages, "ratio": _ratio,
    "spending": _spending, "orchard": _orchard,
}


# One-operation problems with small numbers (level "easy"): what a 135M model can sometimes solve (issue 18).
#: name -> (question, operation); the operands ``a``, ``b`` are drawn by :func:`_one_operation`.
EASY_FORMS: dict[str, tuple[str, Callable[[int, int], int]]] = {
    "gain": ("{name} has {a} {things}. {other} gives {name} {b} more. How many {things} does {name} have now?",
             operator.add),
    "loss": ("{name} has {a} {things} and gives {b} of them to {other}. How many {things} does {name} have left?",
             operator.sub),
    "together": ("{name} has {a} {things} and {other} has {b} {things}. How many {things} do they have together?",
                 operator.add),
    "groups": ("{name} has {a} bags with {b} {things} in each bag. How many {things} does {name} have in all?",
               operator.mul),
}


def _one_operation(kind: str, forms: Mapping[str, tuple[str, Callable[[int, int], int]]] | None = None
                   ) -> Callable[[random.Random], tuple[str, Fraction, dict]]:
    """The template of ``forms[kind]`` (default :data:`EASY_FORMS`): operands 2-10 (a product's first factor 2-5; a
    difference's first operand the larger of two distinct ones), so every answer is a positive integer of at most
    50."""
    question, operation = (EASY_FORMS if forms is None else forms)[kind]

    def make(rng: random.Random):
        if operation is operator.sub:
            a, b = sorted(rng.sample(range(2, 11), 2), reverse=True)
        elif operation is operator.mul:
            a, b = rng.randint(2, 5), rng.randint(2, 10)
        else:
            a, b = rng.randint(2, 10), rng.randint(2, 10)
        name, other = rng.sample(NAMES, 2) if "{other}" in question else (rng.choice(NAMES), "")
        text = question.format(name=name, other=other, a=a, b=b, things=rng.choice(THINGS))
        return text, Fraction(operation(a, b)), {"a": a, "b": b}

    return make


#: One-operation templates (level ``"easy"``): addition, subtraction and small products, operands at most 10.
EASY_TEMPLATES: dict[str, Callable[[random.Random], tuple[str, Fraction, dict]]] = {
    kind: _one_operation(kind) for kind in EASY_FORMS}

#: Problem levels of :func:`word_problems`: level -> its templates.
LEVELS = {"standard": TEMPLATES, "easy": EASY_TEMPLATES}


def question_split(question: str, test_fraction: int = 5) -> str:
    """The split a generated question belongs to: ``"test"`` for one hash bucket in ``test_fraction``."""
    bucket = int(hashlib.sha256(question.encode()).hexdigest(), 16) % test_fraction
    return "test" if bucket == 0 else "train"


def word_problems(num_tasks: int, seed: int = 0, split: str = "train", level: str = "standard") -> list[dict[str, str]]:
    """``num_tasks`` distinct generated word problems of ``split`` (``"train"`` or ``"test"``) and ``level``
    (:data:`LEVELS`: ``"standard"``, multi-step; ``"easy"``, one operation on numbers up to 10).

    Each split draws from its own seed stream (``random.Random("math-word-problems/<split>/<seed>")``, the level
    appended for ``"easy"``) and keeps only the problems whose :func:`question_split` is that split, so the splits
    are disjoint for every pair of seeds. Rows: ``task_id``, ``question``, ``answer`` (:func:`format_answer`),
    ``template``, ``params`` (JSON).
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {sorted(LEVELS)}, got {level!r}")
    rng = random.Random(f"math-word-problems/{split}/{seed}" + ("" if level == "standard" else f"/{level}"))
    prefix = "word" if level == "standard" else f"word-{level}"
    return [{"task_id": f"{prefix}/{split}/{seed}/{i}", "question": question, "answer": format_answer(answer),
             "template": template, "params": json.dumps(params)}
            for i, (template, question, answer, params) in enumerate(_distinct_problems(
                LEVELS[level], rng, num_tasks, split, 100, lambda template, question, params:
                question_split(question) == split))]


def _distinct_problems(templates, rng: random.Random, num_tasks: int, split: str, tries_per_task: int, keep,
                       weights: Mapping[str, float] | None = None):
    """``num_tasks`` distinct problems ``(template, question, answer, params)`` drawn from ``templates`` (a template
    chosen uniformly, or with ``weights[template]`` when given, then its own draw) that
    ``keep(template, question, params)`` accepts; at most ``tries_per_task * num_tasks + 1000`` draws."""
    names = sorted(templates)
    chances = None if weights is None else [weights[name] for name in names]
    rows: list[tuple] = []
    seen: set[str] = set()
    attempts = 0
    while len(rows) < num_tasks:
        attempts += 1
        if attempts > tries_per_task * num_tasks + 1000:
            raise RuntimeError(f"could only generate {len(rows)} distinct {split} problems of {num_tasks}")
        template = rng.choice(names) if chances is None else rng.choices(names, chances)[0]
        question, answer, params = templates[template](rng)
        if question in seen or not keep(template, question, params):
            continue
        seen.add(question)
        rows.append((template, question, answer, params))
    return rows


# ------------------------------------------------------------------------------- held-out arithmetic and form
#: A one-operation form that no training problem of :func:`generalisation_problems` uses: a subtraction asked as a
#: comparison (the training forms ask a difference only as "gives ... away", :data:`EASY_FORMS` ``loss``).
HELD_OUT_FORMS: dict[str, tuple[str, Callable[[int, int], int]]] = {
    "compare": ("{name} has {a} {things} and {other} has {b} {things}. How many more {things} does {name} have than "
                "{other}?", operator.sub),
}
#: The held-out sets of :func:`generalisation_problems`, reported separately (column ``held_out_set``).
HELD_OUT_SETS = ("unseen_operands", "unseen_form")
#: The splits of :func:`generalisation_problems` drawn from the training arithmetic: the training problems as the
#: forms come (``"train"``), the training problems with each operation equally often (``"train_balanced"``), and
#: problems of the training arithmetic for choosing a configuration (``"validation"``, operations balanced).
TRAINING_SPLITS = ("train", "train_balanced", "validation")
_OPERATION_NAMES = {operator.add: "add", operator.sub: "sub", operator.mul: "mul"}


def arithmetic_key(operation: Callable[[int, int], int], a: int, b: int) -> str:
    """The arithmetic of a one-operation problem, ``"add:3:5"``: the operation and its operands, in increasing
    order for the commutative ones (3 + 5 and 5 + 3 are the same arithmetic)."""
    if operation is not operator.sub:
        a, b = sorted((a, b))
    return f"{_OPERATION_NAMES[operation]}:{a}:{b}"


def arithmetic_split(key: str, test_fraction: int = 4) -> str:
    """``"test"`` for the arithmetic keys of one hash bucket in ``test_fraction``, else ``"train"``."""
    bucket = int(hashlib.sha256(f"arithmetic/{key}".encode()).hexdigest(), 16) % test_fraction
    return "test" if bucket == 0 else "train"


def operation_weights(forms: Mapping[str, tuple[str, Callable[[int, int], int]]]) -> dict[str, float]:
    """Form -> drawing weight such that every operation of ``forms`` is drawn equally often: each form gets one over
    the number of forms sharing its operation (:data:`EASY_FORMS`: gain and together 1/2 each, loss 1, groups 1,
    so addition, subtraction and multiplication each come a third of the time, where a uniform choice of form gives
    addition half)."""
    sharing = {}
    for _, operation in forms.values():
        sharing[operation] = sharing.get(operation, 0) + 1
    return {kind: 1.0 / sharing[operation] for kind, (_, operation) in forms.items()}


def generalisation_problems(num_tasks: int, seed: int = 0, split: str = "train") -> list[dict[str, str]]:
    """One-operation word problems (the ``"easy"`` level's numbers) whose held-out problems test generalisation.

    Drawn from the training arithmetic (the keys :func:`arithmetic_split` puts in ``"train"``), with the
    :data:`EASY_FORMS` (gain, loss, together, groups):

    * ``"train"``: a form chosen uniformly per problem, so addition (two forms) comes about half the time;
    * ``"train_balanced"``: each operation equally often (:func:`operation_weights`);
    * ``"validation"``: as ``"train_balanced"`` from a seed stream of its own, for choosing a configuration on the
      training arithmetic without touching a held-out problem (it shares its arithmetic with the training problems
      by design: it measures how well the training distribution is learned, per operation).

    Held out:

    * ``"unseen_operands"``: the same forms on the arithmetic of the test bucket: no problem shares its operation
      and operands with any training problem (about a quarter of the ~110 distinct arithmetic keys);
    * ``"unseen_form"``: the :data:`HELD_OUT_FORMS` (never in training), any operands;
    * ``"test"``: both held-out sets, the first ``ceil(2 * num_tasks / 3)`` rows unseen operands and the rest the
      unseen form (``num_tasks=120``: 80 and 40).

    Rows: ``task_id``, ``question``, ``answer``, ``template`` (the form), ``params`` (JSON), ``arithmetic`` (the key)
    and ``held_out_set`` (the split's name). Each split draws from its own seed stream; the same arguments always
    give the same problems.
    """
    if split == "test":
        first = -(-2 * num_tasks // 3)
        return generalisation_problems(first, seed, "unseen_operands") + \
            generalisation_problems(num_tasks - first, seed, "unseen_form")
    if split not in (*TRAINING_SPLITS, *HELD_OUT_SETS):
        raise ValueError(f"split must be one of {(*TRAINING_SPLITS, 'test', *HELD_OUT_SETS)}, got {split!r}")
    forms = HELD_OUT_FORMS if split == "unseen_form" else EASY_FORMS
    wanted = None if split == "unseen_form" else "test" if split == "unseen_operands" else "train"
    weights = operation_weights(forms) if split in ("train_balanced", "validation") else None
    rng = random.Random(f"math-word-problems/generalisation/{split}/{seed}")
    makers = {kind: _one_operation(kind, forms) for kind in sorted(forms)}

    def keep(kind, question, params) -> bool:
        return wanted is None or arithmetic_split(arithmetic_key(forms[kind][1], params["a"], params["b"])) == wanted

    return [{"task_id": f"word-generalisation/{split}/{seed}/{i}", "question": question,
             "answer": format_answer(answer), "template": kind, "params": json.dumps(params),
             "arithmetic": arithmetic_key(forms[kind][1], params["a"], params["b"]), "held_out_set": split}
            for i, (kind, question, answer, params) in enumerate(_distinct_problems(makers, rng, num_tasks, split,
                                                                                   200, keep, weights))]


# --------------------------------------------------------------------------------------------------- dataset rows
def gsm8k_to_task(row: Mapping[str, Any]) -> dict[str, str]:
    """A GSM8K row (``question``, ``answer`` = rationale + ``#### final``) -> ``question``, ``answer`` (the final
    number, thousands separators removed) and ``solution`` (the rationale)."""
    solution, sep, final = str(row["answer"]).rpartition("####")
    if not sep:
        raise ValueError(f"GSM8K answer without '####': {row['answer']!r}")
    final = final.strip().replace(",", "").lstrip("$").rstrip(".")
    return {"question": str(row["question"]).strip(), "answer": final, "solution": solution.strip()}


def polaris_to_task(row: Mapping[str, Any]) -> dict[str, str]:
    """A Polaris-Dataset-53K row (``problem``, ``answer``, ``difficulty``) -> ``question``, ``answer``."""
    return {"question": str(row["problem"]).strip(), "answer": str(row["answer"]).strip()}
