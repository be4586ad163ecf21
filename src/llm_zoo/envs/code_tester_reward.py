"""The unit tester's reward in Code-v0 (:mod:`llm_zoo.envs.code`, Rewards): which of its tests
are valid, which of them the statement already shows, the known-wrong mutants of the reference
(:mod:`llm_zoo.envs.code_mutants`) and how many of them the valid tests catch, and from these the
tester's score ``S``.

It is apart from the env module because it is the env's one sizeable piece of reward logic, with
its own limits (the mutants' count and time limits). :class:`TesterReward` is a mixin of
:class:`~llm_zoo.envs.code.CodeEnv` rather than a set of functions: it reads the episode's state
and runs programs through the env's per-episode cache of runs, as the env's own methods do.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from llm_zoo.checkers.call_harness import literal
from llm_zoo.data.code import CodeProblem, TestCase
from llm_zoo.envs.code_impossible import IMPOSSIBLE_SPLIT
from llm_zoo.envs.code_judge import MAX_TIMEOUTS, CallJudge, StdioJudge
from llm_zoo.envs.code_mutants import known_wrong_mutants
from llm_zoo.sandbox import RunResult

__all__ = [
    "INVALID_TEST_SCORE",
    "MAX_MUTANTS",
    "MIN_MUTANT_TIMEOUT_S",
    "MUTANT_TIMEOUT_S",
    "MUTANT_TIME_FACTOR",
    "TesterReward",
    "statement_examples",
]

INVALID_TEST_SCORE = -0.5
#: Most known-wrong mutants kept per problem (the ``mutants`` argument).
MAX_MUTANTS = 16
#: Most seconds a mutant's run may take (at most the env's ``timeout``; per problem
#: :data:`MUTANT_TIME_FACTOR` times the reference's slowest hidden-test run, at least
#: :data:`MIN_MUTANT_TIMEOUT_S`): one that times out on a hidden test is not kept, one that times
#: out on a tester's test is caught by it.
MUTANT_TIMEOUT_S = 1.0
MIN_MUTANT_TIMEOUT_S = 0.2
MUTANT_TIME_FACTOR = 4.0


def statement_examples(problem: Any, judge: Any) -> frozenset[str]:
    """The judge's input keys of the hidden tests that the statement shows as examples: a stdin
    whose whitespace-separated tokens appear, in order and together, in the statement's; a call
    whose every argument appears, written as Python or JSON without spaces, in the statement
    without spaces. A unit tester's copy of one is valid but tells the coder nothing new."""
    text = " ".join(problem.statement.split())
    packed = "".join(problem.statement.split())
    examples = set()
    for test in problem.tests:
        if problem.call is None:
            shown = " ".join(test.input.split())
            if shown and f" {shown} " in f" {text} ":
                examples.add(judge.input_key(test.input))
            continue
        try:
            args = literal(test.input)
        except ValueError:
            continue
        if isinstance(args, list) and args and all(_written_in(arg, packed) for arg in args):
            examples.add(judge.input_key(test.input))
    return frozenset(examples)


def _written_in(value: Any, packed: str) -> bool:
    forms = ["".join(repr(value).split())]
    with contextlib.suppress(TypeError, ValueError):  # not JSON: its repr alone
        forms.append("".join(json.dumps(value).split()))
    return any(form in packed for form in forms)


class TesterReward:
    """The unit tester's reward, mixed into :class:`~llm_zoo.envs.code.CodeEnv`.

    The annotations below name what it reads of the env; the env sets them (its constructor and
    ``_new_episode``) and runs programs (``_run``, cached per episode; ``_judge``).
    """

    problem: CodeProblem
    judge: StdioJudge | CallJudge
    hidden_tests: tuple[TestCase, ...]
    proxy_reference: str | None
    tests: list[TestCase]
    validity: list[bool | None]
    split: str
    timeout: float
    memory_mb: int
    mutants: int
    _per_problem: dict[Any, Any]
    _run: Callable[..., list[RunResult]]
    _judge: Callable[[str, list[TestCase] | tuple[TestCase, ...]], list[tuple[bool, str]]]

    def _validity(self, tests: list[TestCase]) -> list[bool | None]:
        hidden = {self.judge.input_key(t.input): t.output for t in self.hidden_tests}
        judge_code = self.problem.reference or self.proxy_reference
        verdicts: list[bool | None] = [None] * len(tests)
        to_run = []
        for index, test in enumerate(tests):
            known = hidden.get(self.judge.input_key(test.input))
            if known is not None:
                verdicts[index] = self.judge.expected_agrees(known, test.output)
            elif judge_code is not None:
                to_run.append(index)
        if judge_code is not None and to_run:
            judged = self._judge(judge_code, [tests[i] for i in to_run])
            for index, (passed, _) in zip(to_run, judged, strict=True):
                verdicts[index] = passed
        return verdicts

    def _statement_examples(self) -> frozenset[str]:
        """:func:`statement_examples` of the current problem, computed once per problem."""
        key = ("examples", self.problem.id)
        if key not in self._per_problem:
            self._per_problem[key] = statement_examples(self.problem, self.judge)
        return self._per_problem[key]

    def _known_wrong(self) -> tuple[str, ...]:
        """The problem's known-wrong mutants (:mod:`llm_zoo.envs.code_mutants`): of the reference,
        else of the proxy reference; none on the impossible split (its reference is wrong)."""
        reference = self.problem.reference or self.proxy_reference
        if reference is None or self.mutants == 0 or self.split == IMPOSSIBLE_SPLIT:
            return ()
        key = ("mutants", self.problem.id, reference)  # asked at every tester answer: selected once
        if key not in self._per_problem:
            self._per_problem[key] = self._select_mutants(reference)
        return self._per_problem[key]

    def _select_mutants(self, reference: str) -> tuple[str, ...]:
        """:meth:`_known_wrong`'s selection, run once per problem and reference."""
        # known-wrong: caught by a hidden test the statement does not show (a bug its examples
        # already reveal is no test's merit)
        unseen = [
            t for t in self.hidden_tests if self.judge.input_key(t.input) not in self._statement_examples()
        ]
        if not unseen:
            return ()
        # a mutant may take a few times the reference's slowest run: one that loops forever costs
        # that, not the env's timeout
        _, _, slowest = self._timed_verdicts(reference, unseen, self.timeout, MAX_TIMEOUTS)
        limit = min(self.timeout, MUTANT_TIMEOUT_S, max(MIN_MUTANT_TIMEOUT_S, MUTANT_TIME_FACTOR * slowest))
        self._per_problem[("mutant_timeout", self.problem.id)] = limit
        key = repr(
            (self.judge.kind, self.problem.call, [(t.input, t.output) for t in unseen], limit, self.memory_mb)
        )
        return known_wrong_mutants(
            reference, lambda source: self._mutant_verdicts(source, unseen), self.mutants, key=key
        )

    def _mutant_verdicts(self, mutant: str, tests: list[TestCase]) -> list[bool] | None:
        """Whether ``mutant`` passes each test, each run bounded by the problem's mutant time limit;
        ``None`` if a run timed out (such a mutant is not kept: it would cost its time limit on
        every tester answer)."""
        timeout = self._per_problem.get(
            ("mutant_timeout", self.problem.id), min(self.timeout, MUTANT_TIMEOUT_S)
        )
        verdicts, timed_out, _ = self._timed_verdicts(mutant, tests, timeout, 1)
        return None if timed_out else verdicts

    def _timed_verdicts(
        self, code: str, tests: list[TestCase], timeout: float, max_timeouts: int
    ) -> tuple[list[bool], bool, float]:
        """``code``'s verdict on each test with each run bounded by ``timeout`` (the runs stop after
        ``max_timeouts`` time-outs), whether a run timed out, and the slowest run's seconds."""
        timed_out, slowest = False, 0.0

        def run(program: str, stdins: list[str]) -> list[RunResult]:
            nonlocal timed_out, slowest
            results = self._run(program, stdins, timeout, max_timeouts)
            timed_out = timed_out or any(r.timed_out for r in results)
            slowest = max([slowest, *(r.duration_s for r in results)])
            return results

        verdicts = [passed for passed, _ in self.judge.evaluate(code, tests, run, timeout)]
        return verdicts, timed_out, slowest

    def _test_score(self) -> tuple[float, int, int]:
        """``S`` of the current tests (module docstring, Rewards): half their validity, half the
        share of the known-wrong mutants their valid tests catch; and the mutants caught, known."""
        validity = [1.0 if v else 0.0 if v is None else INVALID_TEST_SCORE for v in self.validity]
        examples = self._statement_examples()
        # valid tests that the statement does not already show: only they count as catching
        counted = [
            v is True and self.judge.input_key(test.input) not in examples
            for test, v in zip(self.tests, self.validity, strict=True)
        ]
        valid = [test for test, keep in zip(self.tests, counted, strict=True) if keep]
        mutants = self._known_wrong()
        # a mutant that times out on a test (verdicts None) is caught by it
        caught = sum(bool(valid) and not all(self._mutant_verdicts(m, valid) or [False]) for m in mutants)
        share = caught / len(mutants) if mutants else 0.0
        return 0.5 * float(np.mean(validity)) + 0.5 * share, caught, len(mutants)
