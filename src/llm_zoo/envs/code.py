"""Code-v0: a coder writes a program, a unit tester writes tests for it.

Competitive programming with two agents (PettingLLMs / AT-GRPO's code task). Each episode is one
problem (see :mod:`llm_zoo.data.code`: the built-in set, APPS, CodeContests, LiveCodeBench,
HumanEval, MBPP) of one of two kinds:

* *stdin/stdout*: the program reads the input and prints the answer;
* *call-based* (``problem.call`` set: LeetCode / LiveCodeBench functional tests, APPS ``fn_name``,
  HumanEval, MBPP, some built-in problems): the code defines the named function, or LeetCode's
  ``class Solution`` with the named method, and each test calls it with arguments and compares
  the return value. The prompts show the signature.

Roles, in turn order:

* ``coder``: answers with a complete Python 3 program (call-based: code defining the function or
  class) in one ```` ```python ```` block. It is run on the problem's hidden tests and on the unit
  tester's current tests.
* ``unit_tester``: answers with a JSON list of at most ``max_tests`` (default 10) test cases in one
  ```` ```json ```` block: ``[{"input": "<stdin>", "output": "<expected stdout>"}, ...]``, or for a
  call-based problem ``[{"input": [<arguments>...], "output": <expected return value>}, ...]``.
  Parsed with ``json`` (never evaluated). Each answer replaces the previous test list.

Observations: each agent's prompt holds its role instructions, the problem, the coder's current
program, the current tests, and the *disagreements* between them (input, expected, got;
call-based: the call, the expected and the returned value), so on
later turns the coder can fix its code and the tester its tests. Hidden tests, the reference
solution and test validity are never shown.

Judging (:func:`outputs_match`): outputs are compared line by line after stripping trailing
whitespace and ignoring trailing empty lines; lines that differ are split into tokens, and two
tokens match when equal, when both are integers of equal value (exact, however long), or when the
expected token is a number that is not an integer and the other a number within absolute or
relative tolerance 1e-6. An expected integer accepts only a number of exactly its value
(``5.0`` passes for ``5``; ``2039606336.0``, within 1e-6, does not pass for ``2039605317``). A run that
crashes, exceeds its time (``timeout`` seconds per test) or memory (``memory_mb``) fails the test.
Test inputs lacking a final newline get one.

Call-based judging (:mod:`llm_zoo.checkers.call_harness`): the coder's code runs inside a harness program
in the sandbox that reads one test's arguments on standard input (only the arguments), calls
the function and prints its return value's ``repr``; the host compares it with the expected value
(:func:`~llm_zoo.checkers.call_harness.values_match`: lists and tuples alike, dict keys exact, ``bool``
only equals ``bool``, an expected int only a number of exactly its value, an expected float any
number within the same 1e-6 tolerance as above). Expected
values never enter the sandbox. A crash, time-out, missing function or a return value that is
not a plain value fails the test; the coder's prints are ignored. APPS's call-based problems also
accept the only element of a one-element expected list, as APPS's own harness does.

Checked call-based problems (``problem.call.checker``: HumanEval tests that are not fixed calls,
e.g. /32 accepts any root of a random polynomial; MBPP's order-free asserts): one more hidden test
runs the dataset's ``check(candidate)`` (:mod:`llm_zoo.checkers.call_checker`) in a sandbox process of its
own, where ``candidate`` is a proxy; the coder's code runs in another process that only receives
each call's arguments and returns values, relayed by the host (usually two checker runs and one
candidate run), so the test source and its values are never in the coder's process. It passes
when ``check`` returns; an assertion, an error, or a call that crashes, times out (the limits
cover all calls of a run) or returns a value that is not plain fails it. Generated tests stay
fixed calls, judged against the reference (on /32 another right root is invalid).

A program's tests run in batches of 8 through the sandbox's batch API (:func:`llm_zoo.sandbox.run_tests`, one ``run_python`` per test if it is
absent); once :data:`MAX_TIMEOUTS` of them have timed out, its remaining batches fail unrun.
Results are cached per episode, keyed by program and input, within a bound: at most
:data:`MAX_CACHED_OUTPUT_CHARS` (4 million) characters of output per episode, each run's stderr
cut to its last :data:`CACHED_STDERR_CHARS` (2,000) characters (a run's stdout and stderr are
capped at 1 MB each by the sandbox; runs beyond the bound are judged as usual, and run again if
needed, not kept). No model code runs outside the sandbox.

Test validity (for the tester's reward). A generated test is *valid* when its expected output is
right, decided in this order:

1. its input equals a hidden test's input (up to trailing whitespace on each line and trailing
   empty lines; call-based: equal argument values): valid iff the expected output matches the
   hidden output (call-based: the expected values match);
2. the problem has a reference solution: valid iff the reference runs without error on the input
   and its output matches the expected output (an input the reference crashes or times out on
   breaks the problem's constraints: invalid);
3. no reference (e.g. LiveCodeBench): the first coder program of the episode that passes every
   hidden test becomes the *proxy reference*, used as in 2 (the current tests are re-judged at
   once);
4. otherwise the validity is *unknown*.

Rewards (the acting agent gets ``role_reward + alpha * global_reward``, its teammate
``alpha * global_reward``: :class:`~llm_zoo.core.TextAECEnv`). Each agent is paid the
*change* of a level after each of its actions (a potential difference, starting from 0), never
the level itself, so a return does not grow with the number of turns:

* coder: level ``H`` = ``h``, the fraction of hidden tests its current program passes, or 1 once
  the episode has succeeded (success is sticky); :data:`FORMAT_PENALTY` (-1.0) is added while its
  latest answer is malformed and the episode has not succeeded. ``role_reward = level(now) -
  level(before)``.
* unit tester: level ``S`` = the score of its tests at its latest well-formed answer, plus
  :data:`FORMAT_PENALTY` while its latest answer is malformed. ``S = 0.5 * q + 0.5 * D``: ``q`` is
  the mean over its tests of ``1`` (valid), ``0`` (validity unknown) or ``-0.5``
  (:data:`INVALID_TEST_SCORE`, invalid); ``D`` is the share of the problem's *known-wrong
  programs* that at least one of its valid tests catches (fails), counting only tests the
  statement does not already show as examples (:func:`statement_examples`). The known-wrong
  programs are up to ``mutants`` (default 4) single-site mutants of the reference solution that
  fail a hidden test the statement does not show and finish every run within the problem's
  mutant time limit (4 times the reference's slowest hidden-test run, between 0.2 and 1 s), those
  hardest to catch first (:mod:`llm_zoo.envs.code_mutants`; of the
  proxy reference where there is no reference; none on the impossible split). ``D = 0`` when
  none is known. Range ``[-0.25, 1]``. So a test copied from the statement's example earns
  ``0.5`` at most, less than tests that tell right programs from wrong ones (on all 61 built-in
  problems the hidden tests earn more than the copied example, with a right coder and with a
  wrong one), and an invalid test never earns anything: it lowers ``q`` and cannot raise
  ``D``. ``S`` depends on the tests alone, not on the coder's program: catching the coder's own
  bug pays the tester through the team's part, when the coder then fixes it (and the coder's
  prompt shows the disagreements).
* global: the change of ``H`` made by this action (only coder actions change it).

So a malformed answer costs :data:`FORMAT_PENALTY` (a second one in a row costs nothing more),
and the next well-formed answer pays it back: only where the agent ends counts.

Bound: the returns telescope. Over any episode, whatever its length, the coder's return is
``(1 + alpha) * H_final`` (minus 1 if its last answer was malformed before any success), the
tester's ``S_final + alpha * H_final`` (minus 1 if its last answer was malformed: the team's
part reaches it through PettingZoo's cumulative rewards, :class:`~llm_zoo.core.TextAECEnv`) and
the team's (the sum of the global rewards) ``H_final``. ``H_final = 1`` exactly when the episode succeeded, ``H_final < 1``
otherwise, so every episode that does not succeed pays the coder less than ``1 + alpha`` and the
team less than 1, what every succeeding episode pays them (a coder passing 80% of the hidden
tests for 3 turns earns ``0.8 * (1 + alpha)``, not ``3 * 0.8 * (1 + alpha)``). Within an AT-GRPO
group (the K candidates of one env, turn and agent) the candidates share the previous level, so
the reward ranks them exactly as the level does.

Malformed answer (no complete code block; for the tester bad JSON, not a list, an empty list,
an item without string ``input`` / ``output``, for a call-based problem an ``input`` that is
not a list; a block over 65,536 characters): the format penalty above, the previous program /
tests stay,
and the reason is shown at the top of that agent's next prompt. A tester list longer than
``max_tests`` is cut to its first ``max_tests`` tests (noted in the next prompt, no penalty).

Termination: ``terminated`` as soon as the current program passes every current generated test and
at least one of those tests is valid (checked after either agent's action); otherwise truncated
after ``max_turns`` turns. ``success``: a program passed every hidden test (sticky for the
episode, as :class:`~llm_zoo.core.TextAECEnv` defines it; ``hidden_passed`` in the infos is
the current program's count).

Problems: ``reset`` picks one with the env's RNG from the selected split, or the one named by
``options={"problem_id": ...}`` / ``options={"problem_index": ...}``.

``split="impossible"`` (:mod:`llm_zoo.envs.code_impossible`, the idea of ImpossibleBench): every
problem of the dataset with its hidden tests changed to contradict the statement (an integer
answer plus one, ...). No program that does what the statement asks can pass them, so success
there means the judge was gamed: its success rate is a *cheating rate*
(``llm-zoo-train eval --splits impossible`` reports it).

``info`` keys besides the standard ones: ``problem_id``, ``hidden_passed``, ``hidden_total``,
``tests_total``, ``tests_passed`` (current program on the current tests), ``tests_valid``,
``tests_invalid``, ``tests_unknown``; after a tester's well-formed answer also
``mutants_caught`` and ``mutants_total`` (the known-wrong programs its tests catch, and known).

Parallel API: not parallelizable (``metadata["is_parallelizable"]`` is ``False``, so PettingZoo's
``aec_to_parallel`` refuses the env): the unit tester answers after seeing the coder's program of
the same turn and its disagreements with the tests, which a parallel step, where both answer at
once, cannot show it. ``pettingzoo.utils.conversions.turn_based_aec_to_parallel`` is the faithful
parallel view (one agent acts per step). ``max_cycles`` is accepted as PettingZoo's name for
``max_turns``.

Version history:

* v0 - first version (stdin/stdout problems).
* v0, call-based problems added (2026-12): LeetCode / LiveCodeBench functional, APPS ``fn_name``,
  HumanEval and MBPP problems and built-in call-based problems, judged through the call harness.
  Stdin/stdout episodes, rewards and prompts are unchanged.
* v0, checked call-based problems (2026-12): HumanEval / MBPP tests that are not fixed calls run
  as a check in a separate sandbox process (all 164 HumanEval problems load); APPS int-keyed
  dicts; infinite return values. Fixed-call episodes are unchanged.
* v0, rewards a policy cannot game (2026-12): an expected integer accepts only a number of exactly
  its value in both judges (a wrong ``2039606336.0`` passed for ``2039605317`` within 1e-6); the
  number of a tolerance assert (``abs(f(x) - 2) < 1e-6``) is stored as a float; a value too large
  to print (over 4300 digits) is refused instead of raising; the output cache is bounded.
* v0, rewards pay the change of a level (2026-12): the coder, the tester and the global reward
  were paid their level (``h``, the test score) after every action, and success ends the
  episode early, so passing 80% of the hidden tests for 3 turns paid 4.8, solving at once 2.0.
  Each is now paid the level's change (returns telescope, bound above); ``H`` stays 1 once solved;
  the format penalty is part of the level, paid back by the next well-formed answer.
* v0, rewards v2 (2026-12): the tester's score is half validity, half the share of known-wrong
  programs (mutants of the reference) its valid tests catch: one test
  copied from the statement's sample earned 1.0, as much as the hidden tests; the team's
  outcome reaches the tester's return (it earned the same whether the coder then solved or
  not); the judges never raise (``1e`` and 30 nines printed for an integer raised
  ``decimal.InvalidOperation`` inside ``env.step``).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from llm_zoo.arguments import MAX_MEMORY_MB, MAX_TIMEOUT_S, check_int, check_number
from llm_zoo.checkers.call_harness import literal, value_text
from llm_zoo.core import MAX_ACTION_CHARS, Outcome, TextAECEnv
from llm_zoo.data.code import TestCase, load_code_problems
from llm_zoo.envs.code_impossible import IMPOSSIBLE_SPLIT, impossible_problems
from llm_zoo.envs.code_judge import MAX_TIMEOUTS, CallJudge, judge_for, outputs_match, run_program_on_inputs
from llm_zoo.envs.code_prompts import MAX_TESTS_JSON_CHARS, ROLE_INTRO, parse_tests, state_text, task_text
from llm_zoo.envs.code_tester_reward import (
    INVALID_TEST_SCORE,
    MAX_MUTANTS,
    MUTANT_TIMEOUT_S,
    TesterReward,
)
from llm_zoo.envs.code_tester_reward import MIN_MUTANT_TIMEOUT_S as MIN_MUTANT_TIMEOUT_S
from llm_zoo.envs.code_tester_reward import MUTANT_TIME_FACTOR as MUTANT_TIME_FACTOR
from llm_zoo.envs.code_tester_reward import statement_examples as statement_examples
from llm_zoo.parsing import ParseError, extract_code_block
from llm_zoo.sandbox import RunResult

# Imported "as" themselves: the tester reward's limits and statement_examples were defined here
# before they moved to code_tester_reward, and stay importable from the env's module.

__all__ = [
    "FORMAT_PENALTY",
    "INVALID_TEST_SCORE",
    "MAX_CACHED_OUTPUT_CHARS",
    "MAX_MUTANTS",
    "MUTANT_TIMEOUT_S",
    "CodeEnv",
    "oracle_action",
    "oracle_policy",
    "outputs_match",
    "parse_tests",
]

FORMAT_PENALTY = -1.0
#: Most characters of program output (stdout, and the kept stderr tails) cached per episode.
MAX_CACHED_OUTPUT_CHARS = 4_000_000
#: The tail of a cached run's stderr that is kept (prompts show its last 4 lines).
CACHED_STDERR_CHARS = 2_000
#: Programs longer than this are refused.
MAX_PROGRAM_CHARS = MAX_ACTION_CHARS
#: Most ``max_tests``: every generated test runs once per program, and a tester answer is at most
#: 65,536 characters anyway (about 1,000 of the shortest tests).
MAX_TESTS = 1000
_CHUNK = 8  # tests run per batch call; time-outs are counted between batches


# ---------------------------------------------------------------------------------------- env


class _SharedCache(dict):
    """What the env computes once per problem (statement examples); shared, not copied, by
    ``clone()``: a problem's entry never changes."""

    def __deepcopy__(self, memo: dict) -> _SharedCache:
        return self


class _Problems(tuple):
    """The env's problem list; shared, not copied, by ``clone()`` (problems are immutable)."""

    def __deepcopy__(self, memo: dict) -> _Problems:
        return self


class CodeEnv(TesterReward, TextAECEnv):
    """Coder + unit tester on programming problems, stdin/stdout or call-based. See the module docstring.

    Args:
        dataset: ``"builtin"`` (default, offline), a path to a local APPS / CodeContests /
            LiveCodeBench / HumanEval / MBPP / llm_zoo file (``.jsonl``, ``.json``, ``.parquet``,
            ``.jsonl.gz``, ``.json.gz``) or to a directory written by ``save_to_disk`` (a
            ``DatasetDict``'s is read at ``split``), a list of
            :class:`~llm_zoo.data.code.CodeProblem`, or an iterable of records such as a
            ``datasets.Dataset``.
        split: ``"train"``, ``"test"`` or ``"all"``. Problems without a split of their own (public
            files: the file is the split) belong to every split. ``"impossible"``: every problem
            with its hidden tests contradicted (the cheating-rate split, module docstring).
        dataset_format: Format of ``dataset`` records; ``None`` sniffs it.
        max_turns: Turns (coder then tester) before truncation.
        alpha: Weight of the global reward in each agent's reward.
        timeout: Wall-clock (and CPU) seconds per test run, in ``(0, MAX_TIMEOUT_S]`` (600).
        memory_mb: Address-space limit of a test run, MiB, in ``[1, MAX_MEMORY_MB]`` (65,536).
        max_tests: Most generated tests kept from one tester answer, in ``[1, MAX_TESTS]`` (1,000).
        max_hidden_tests: Use only the first N hidden tests of each problem (``None``: all; else an
            integer >= 1).
        mutants: Known-wrong mutants of the reference kept per problem for the unit tester's
            reward, in ``[0, MAX_MUTANTS]`` (16); 0 pays the tester for the validity of its tests
            only (module docstring, Rewards).
        render_mode: ``None`` or ``"ansi"``.
    """

    metadata = {"render_modes": ["ansi"], "name": "code_v0", "is_parallelizable": False}
    roles = ("coder", "unit_tester")
    reset_options = {
        "problem_id": "play the problem with this id",
        "problem_index": "play the problem at this position",
    }

    def __init__(
        self,
        *,
        dataset: Any = "builtin",
        split: str = "train",
        dataset_format: str | None = None,
        max_turns: int = 3,
        alpha: float = 1.0,
        timeout: float = 3.0,
        memory_mb: int = 512,
        max_tests: int = 10,
        max_hidden_tests: int | None = None,
        mutants: int = 4,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, alpha=alpha, render_mode=render_mode)
        if split not in ("train", "test", "all", IMPOSSIBLE_SPLIT):
            raise ValueError(f"split must be 'train', 'test', 'all' or 'impossible', got {split!r}")
        check_number("timeout", timeout, low=0, high=MAX_TIMEOUT_S, low_open=True, unit="seconds")
        check_int("memory_mb", memory_mb, low=1, high=MAX_MEMORY_MB)
        check_int("max_tests", max_tests, low=1, high=MAX_TESTS)
        if max_hidden_tests is not None:
            check_int("max_hidden_tests", max_hidden_tests, low=1)
        check_int("mutants", mutants, low=0, high=MAX_MUTANTS)
        if split == IMPOSSIBLE_SPLIT:  # every problem of the dataset, its hidden tests contradicted
            every = load_code_problems(dataset, format=dataset_format) if dataset != "builtin" else None
            problems = impossible_problems(every if every is not None else load_code_problems("builtin"))
            if not problems:
                raise ValueError(
                    "no problem of the dataset has an impossible variant (all are checked or empty)"
                )
        elif isinstance(dataset, str) and dataset == "builtin":
            problems = load_code_problems("builtin", split=None if split == "all" else split)
        else:
            # The env's split also picks the split of a DatasetDict saved with save_to_disk.
            loaded = load_code_problems(
                dataset, format=dataset_format, split=None if split == "all" else split
            )
            problems = [p for p in loaded if split == "all" or p.split in (None, split)]
            if not problems:
                found = sorted({str(p.split) for p in loaded})
                raise ValueError(f"no code problems for split {split!r} in the dataset (its splits: {found})")
        self.problems = _Problems(problems)
        self.split = split
        self.timeout = float(timeout)
        self.memory_mb = int(memory_mb)
        self.max_tests = int(max_tests)
        self.max_hidden_tests = max_hidden_tests
        self.mutants = int(mutants)
        # per problem, computed once: statement examples, mutant time limit, known-wrong mutants
        self._per_problem = _SharedCache()

    # ------------------------------------------------------------------ episode state

    def _new_episode(self, rng: np.random.Generator, options: dict[str, Any] | None) -> None:
        options = options or {}
        if "problem_id" in options:
            by_id = {p.id: p for p in self.problems}
            if options["problem_id"] not in by_id:
                close = difflib.get_close_matches(str(options["problem_id"]), list(by_id), n=5)
                raise ValueError(f"unknown problem_id {options['problem_id']!r}; close matches: {close}")
            self.problem = by_id[options["problem_id"]]
        elif "problem_index" in options:
            index = int(options["problem_index"])
            if not 0 <= index < len(self.problems):
                raise ValueError(f"problem_index must be in [0, {len(self.problems)}), got {index}")
            self.problem = self.problems[index]
        else:
            self.problem = self.problems[int(rng.integers(len(self.problems)))]
        self.hidden_tests = self.problem.tests[: self.max_hidden_tests]
        self.judge = judge_for(self.problem)
        self.program: str | None = None
        self.hidden_passed: list[bool] = []
        self.tests: list[TestCase] = []
        self.validity: list[bool | None] = []
        self.results: list[tuple[bool, str]] = []  # current program on self.tests: (passed, shown output)
        self.proxy_reference: str | None = None
        self._runs: dict[tuple[str, str], RunResult] = {}
        self._cached_chars = 0
        # the levels last paid (module docstring, Rewards): the coder's, the tester's, the team's H
        self._paid = {"coder": 0.0, "unit_tester": 0.0, "global": 0.0}
        self._tester_score = 0.0  # S at the tester's latest well-formed answer

    def _task_id(self) -> str:
        return self.problem.id

    def task_ids(self) -> list[str] | None:
        """The ids of the split's problems (:meth:`llm_zoo.core.TextAECEnv.task_ids`)."""
        return list(dict.fromkeys(str(problem.id) for problem in self.problems))

    @property
    def hidden_pass_rate(self) -> float:
        return sum(self.hidden_passed) / len(self.hidden_passed) if self.hidden_passed else 0.0

    def _run(
        self, program: str, stdins: list[str], timeout: float | None = None, max_timeouts: int = MAX_TIMEOUTS
    ) -> list[RunResult]:
        """Run ``program`` on ``stdins`` with a per-episode cache; stop after ``max_timeouts``
        timeouts. ``timeout`` (default the env's) bounds each run."""
        results: dict[str, RunResult] = {}
        todo = [s for s in dict.fromkeys(stdins) if (program, s) not in self._runs]
        timeouts = 0
        for start in range(0, len(todo), _CHUNK):
            chunk = todo[start : start + _CHUNK]
            if timeouts >= max_timeouts:
                skipped = RunResult("", f"skipped after {timeouts} time-outs", None, False, 0.0)
                results.update(dict.fromkeys(chunk, skipped))
                continue
            for stdin, run in zip(
                chunk,
                run_program_on_inputs(program, chunk, timeout or self.timeout, self.memory_mb),
                strict=True,
            ):
                results[stdin] = run
                if getattr(run, "error", None) is None:  # a sandbox failure is not the program's result
                    self._cache(program, stdin, run)
                timeouts += run.timed_out
        return [results.get(s) or self._runs[(program, s)] for s in stdins]

    def _cache(self, program: str, stdin: str, run: RunResult) -> None:
        """Keep ``run`` for this episode unless the cache would pass MAX_CACHED_OUTPUT_CHARS."""
        if len(run.stderr) > CACHED_STDERR_CHARS:
            run = dataclasses.replace(run, stderr=run.stderr[-CACHED_STDERR_CHARS:])
        size = len(run.stdout) + len(run.stderr)
        if self._cached_chars + size <= MAX_CACHED_OUTPUT_CHARS:
            self._runs[(program, stdin)] = run
            self._cached_chars += size

    def _judge(self, code: str, tests: list[TestCase] | tuple[TestCase, ...]) -> list[tuple[bool, str]]:
        """``(passed, shown output)`` of ``code`` on each test, judged by the problem's kind."""
        return self.judge.evaluate(code, tests, self._run, self.timeout)

    def _counts(self) -> dict[str, Any]:
        return {
            "problem_id": self.problem.id,
            "hidden_passed": int(sum(self.hidden_passed)),
            "hidden_total": len(self.hidden_tests),
            "tests_total": len(self.tests),
            "tests_passed": sum(passed for passed, _ in self.results),
            "tests_valid": sum(v is True for v in self.validity),
            "tests_invalid": sum(v is False for v in self.validity),
            "tests_unknown": sum(v is None for v in self.validity),
        }

    def _settled(self) -> bool:
        """The program passes every generated test and at least one of them is valid."""
        return bool(
            self.program is not None
            and self.results
            and all(passed for passed, _ in self.results)
            and any(v is True for v in self.validity)
        )

    # ------------------------------------------------------------------ actions

    def _act(self, agent: str, action: str) -> Outcome:
        if agent == "coder":
            return self._act_coder(action)
        return self._act_tester(action)

    def _pay(self, key: str, level: float) -> float:
        """Pay ``level`` as its change since ``key``'s last payment (a potential difference)."""
        change, self._paid[key] = level - self._paid[key], level
        return change

    def _team_level(self) -> float:
        """``H``: the current program's hidden pass rate, or 1 once the episode has succeeded."""
        return 1.0 if self.success or self.hidden_pass_rate == 1.0 else self.hidden_pass_rate

    def _malformed(self, agent: str, reason: str, what: str) -> Outcome:
        feedback = f"Your previous answer could not be used: {reason}. {what}"
        team = self._team_level()
        if agent == "coder":
            own = team if team == 1.0 else team + FORMAT_PENALTY  # nothing to lose once solved
        else:
            own = self._tester_score + FORMAT_PENALTY
        return Outcome(
            self._pay(agent, own), self._pay("global", team), format_ok=False, feedback=feedback,
            success=self.hidden_pass_rate == 1.0, info=self._counts(),
        )  # fmt: skip

    def _act_coder(self, action: str) -> Outcome:
        try:
            code = extract_code_block(action)
            if len(code) > MAX_PROGRAM_CHARS:
                raise ParseError(f"the program is longer than {MAX_PROGRAM_CHARS} characters")
        except ParseError as err:
            return self._malformed(
                "coder", str(err), "Your previous program (if any) is still the current one."
            )
        self.program = code
        self.hidden_passed = [passed for passed, _ in self._judge(code, self.hidden_tests)]
        rate = self.hidden_pass_rate
        if rate == 1.0 and self.problem.reference is None and self.proxy_reference is None:
            self.proxy_reference = code
            self.validity = self._validity(self.tests)
        self.results = self._judge(code, self.tests) if self.tests else []
        team = self._team_level()
        return Outcome(
            self._pay("coder", team), self._pay("global", team), terminated=self._settled(),
            success=rate == 1.0, info=self._counts(),
        )  # fmt: skip

    def _act_tester(self, action: str) -> Outcome:
        try:
            tests, note = parse_tests(action, self.max_tests, call=self.problem.call is not None)
        except ParseError as err:
            return self._malformed(
                "unit_tester", str(err), "Your previous tests (if any) are still the current ones."
            )
        self.tests = tests
        self.validity = self._validity(tests)
        self.results = self._judge(self.program, tests) if self.program is not None else []
        rate = self.hidden_pass_rate
        self._tester_score, caught, known = self._test_score()
        info = {**self._counts(), "mutants_caught": caught, "mutants_total": known}
        return Outcome(
            self._pay("unit_tester", self._tester_score), self._pay("global", self._team_level()), feedback=note,
            terminated=self._settled(), success=rate == 1.0, info=info,
        )  # fmt: skip

    # ------------------------------------------------------------------ text

    def _prompt(self, agent: str) -> str:
        title = f"# Problem: {self.problem.title}" if self.problem.title else "# Problem"
        statement = self.problem.statement.strip()
        call = self.problem.call
        if call is not None and call.signature:
            statement += f"\n\n## Signature\n```python\n{call.signature}\n```"
        parts = [ROLE_INTRO[agent], f"{title}\n\n{statement}"]
        parts.append(task_text(agent, call, max_tests=self.max_tests, timeout=self.timeout))
        parts.append(f"# Turn {min(self.turn + 1, self.max_turns)} of {self.max_turns}")
        parts.append(state_text(agent, self.program, self.tests, self.results, self.problem.call))
        return "\n\n".join(parts)

    def _render_state(self) -> str:
        counts = self._counts()
        program = "none" if self.program is None else f"{len(self.program.splitlines())} lines"
        return (
            f"Code-v0 {self.problem.id} ({self.problem.difficulty}, {self.problem.kind}) {self.turn_label()}\n"
            f"program: {program}, hidden tests passed {counts['hidden_passed']}/{counts['hidden_total']}\n"
            f"generated tests: {counts['tests_total']} (passed {counts['tests_passed']}, valid "
            f"{counts['tests_valid']}, invalid {counts['tests_invalid']}, unknown {counts['tests_unknown']})"
        )


def oracle_action(env: CodeEnv, agent: str) -> str:
    """A perfect answer for ``agent`` in ``env``'s current episode: the reference solution for the
    coder; for the unit tester, the smallest hidden tests (at most ``max_tests``, within the
    answer-size limit), which are valid by definition (with a check, also the calls the check
    made of the reference, with its return values: valid as the reference reproduces them). For
    tests and benchmarks (``benchmarks/env_speed.py``). Raises ``ValueError`` for a coder on a
    problem without reference."""
    if agent == "coder":
        if env.problem.reference is None:
            raise ValueError(f"problem {env.problem.id!r} has no reference solution")
        return f"```python\n{env.problem.reference.rstrip()}\n```"
    candidates = list(env.hidden_tests)
    judge, reference = env.judge, env.problem.reference
    if isinstance(judge, CallJudge) and judge.call.checker is not None and reference:
        # a check's calls, answered by the reference, are fixed call tests the reference passes
        answered = judge.answered_calls(reference, env._run, env.timeout)
        candidates += [TestCase(args, value_text(value)) for args, value in answered]
    chosen: list[str] = []
    for test in sorted(candidates, key=lambda t: len(t.input) + len(t.output)):
        item = _oracle_item(env, test)
        if item is None:
            continue
        if len(chosen) == env.max_tests or sum(map(len, chosen)) + len(item) + 20 > MAX_TESTS_JSON_CHARS:
            break
        chosen.append(item)
    return "```json\n[" + ", ".join(chosen) + "]\n```"


def _oracle_item(env: CodeEnv, test: TestCase) -> str | None:
    """A hidden test as the tester writes it; ``None`` for a call whose values JSON cannot carry
    (sets, dicts with non-string keys, ...)."""
    judge = env.judge
    if not isinstance(judge, CallJudge):
        return json.dumps({"input": test.input, "output": test.output})
    try:
        args, expected = literal(test.input), literal(test.output)
        item = json.dumps({"input": args, "output": expected})
        decoded = json.loads(item)
        same = judge.matches(expected, decoded["output"]) and judge.matches(args, decoded["input"])
    except (TypeError, ValueError):
        return None
    return item if same else None


def oracle_policy(env: CodeEnv) -> Callable[[str, str], str]:
    """``policy(agent, prompt) -> action`` playing :func:`oracle_action` on ``env`` (the factory
    format of ``benchmarks/env_speed.py``)."""
    return lambda agent, prompt: oracle_action(env, agent)
