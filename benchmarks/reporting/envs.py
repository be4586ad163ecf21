"""RESULTS.md sections of the environment benchmarks: env steps, env servers (speed, load and
faults) and the code sandbox."""

from __future__ import annotations

from typing import Any

from reporting.format import fmt, load_averages, markdown_table


def env_speed(result: dict[str, Any]) -> str:
    rows = []
    for env_id, entry in result.get("envs", {}).items():
        for kind in ("random", "oracle"):
            if kind in entry:
                row = entry[kind]
                rows.append([env_id, kind, row["steps_per_s"], row["episodes"], row["success_rate"]])
    text = markdown_table(["env", "actions", "env steps/s", "episodes", "success rate"], rows)
    sandbox = result.get("sandbox", {})
    if "runs_per_s" in sandbox:
        text += f"\n\nSandbox, trivial program: {sandbox['runs_per_s']} runs/s one at a time"
        if "runs_per_s" in sandbox.get("batch", {}):
            text += f", {sandbox['batch']['runs_per_s']} runs/s through `run_many`"
        text += "."
    return text


def env_server_speed(result: dict[str, Any]) -> str:
    inside = result["in_process"]
    rows = [["in-process, one episode at a time", inside["steps"], fmt(inside["seconds"]),
             fmt(inside["steps_per_s"]), "1x"]]  # fmt: skip
    for count, entry in result["servers"].items():
        clients = int(count) * result["clients_per_server"]
        rows.append([f"{count} `llm-zoo serve` process(es), {clients} episodes at a time", entry["steps"],
                     fmt(entry["seconds"]), fmt(entry["steps_per_s"]), f"{entry['ratio_to_in_process']:.2f}x"])  # fmt: skip
    text = markdown_table(
        ["Code-v0 (oracle answers, sandboxed tests)", "live steps", "seconds", "steps/s", "ratio"], rows
    )
    protocol = result["protocol"]
    text += (
        f"\n\nProtocol overhead (trivial env, {result.get('overhead_steps', '?')} sequential steps, one server):"
        f" {protocol['served_ms_per_step']:.3f} ms per step served against {protocol['in_process_ms_per_step']:.3f}"
        f" ms in-process, {protocol['overhead_ms_per_step']:.3f} ms per step for the round trip."
    )
    loads = load_averages(result)
    if loads:
        text += (
            f" Load average (1, 5, 15 min) {loads[0]} at the start and {loads[1]} at the end, on"
            f" {result.get('machine', {}).get('usable_cpus', '?')} usable cores: the"
            " servers compete with each other and with the client for them, so the ratios say what this"
            " machine allows, not what separate CPU machines would give."
        )
    return text


def env_server_load(result: dict[str, Any]) -> str:
    def latency_cells(entry: dict[str, Any]) -> list[Any]:
        return [entry.get("steps", 0), entry.get("p50_ms"), entry.get("p99_ms"), entry.get("max_ms"),
                entry.get("over_2_s")]  # fmt: skip

    many, mix, kill = result["many_clients"], result["slow_mix"], result["server_killed"]
    rows = [
        [f"{many['clients']} clients stepping PlanPath-v0 for {many['seconds']} s", *latency_cells(many["latency"]),
         many["errors"]],
        [f"{mix['cheap_clients']} cheap clients beside {mix['slow_sessions']} spinning Code-v0 steps of another client",
         *latency_cells(mix["cheap"]), mix["cheap_errors"]],
    ]  # fmt: skip
    text = markdown_table(["phase", "steps", "p50 ms", "p99 ms", "max ms", "over 2 s", "errors"], rows)
    text += (
        f"\n\nMany clients: {many['steps_per_s']} steps/s in all; the server's resident memory "
        f"{many['server_mib_before']} MiB before, {many['server_mib_after']} MiB after; "
        f"{many['sessions_left']} sessions left once the clients closed. Slow-env mix: "
        + (
            f"{mix['slow_steps_done']} slow steps finished in the window (mean {mix['slow_step_mean_s']} s), "
            if mix["slow_steps_done"]
            else "no slow step finished in the window (each runs a spinning program per test to its timeout), "
        )
        + f"{mix['slow_errors']} errors; the steps still running were abandoned by their client. "
        f"Server killed: {kill['clients_that_got_an_error']} of the {kill['clients_on_the_killed_server']} clients "
        f"on the killed server got a `RemoteEnvError` (at most {kill['seconds_to_error_max']} s after the kill), "
        f"made their env again on the other server and played {kill['steps_after_kill_on_the_other_server']} "
        f"steps there; {kill['unexpected_errors']} unexpected errors, {kill['clients_hung']} clients hung."
    )
    loads = load_averages(result)
    if loads:
        text += f" Load average {loads[0]} at the start, {loads[1]} at the end."
    return text


def sandbox_speed(result: dict[str, Any]) -> str:
    cores = result.get("cores")  # absent from runs before it was recorded

    def per_core(row: dict[str, Any]) -> Any:
        return row.get("sandbox_tests_per_s_per_core", "-")

    rows = [
        [
            r["category"],
            r["tests"],
            r["plain_tests_per_s"],
            r["sandbox_tests_per_s"],
            per_core(r),
            f"{r['ratio']}x",
        ]
        for r in result["categories"]
    ]
    summary = result["summary"]
    rows.append(["all", summary["tests"], summary["plain_tests_per_s"], summary["sandbox_tests_per_s"],
                 per_core(summary), f"{summary['ratio']}x"])  # fmt: skip
    text = markdown_table(
        ["programs", "tests", "plain tests/s", "sandbox tests/s", "sandbox tests/s per core", "ratio"], rows
    )
    quote = ""
    if cores:
        load = result.get("load_average", {})
        quote = (
            f" **Tests per second per core: {summary['sandbox_tests_per_s_per_core_without_timeouts']} without the"
            f" never-finishing programs, {summary['sandbox_tests_per_s_per_core']} with them** ({cores} cores,"
            f" {result['machine']['cpu']}, load"
            f" {load.get('start')} at the start and {load.get('end')} at the end), every test under the layer's full"
            " isolation."
        )
    return text + (
        f"\n\nLayer {result['layer']}, {result['workers']} workers, timeout {result['timeout_s']} s per test on both"
        f" sides; verdicts differing between the sides: {summary['verdict_mismatches']}. Without the slow"
        f" (never-finishing) programs: {summary['ratio_without_timeouts']}x.{quote} A program that never finishes"
        " costs its whole CPU-time limit on both sides, so that category can gain only the parallelism of the"
        " machine's cores (2x on 2 cores)."
    )
