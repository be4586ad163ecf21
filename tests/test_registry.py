import subprocess
import sys
import textwrap

import pytest

import llm_zoo
from llm_zoo.envs import BUILTIN_ENVS
from llm_zoo.registry import EnvRegistry, EnvSpec, PluginLoadWarning, UnknownEnvError
from llm_zoo.testing import check_env
from toy_envs import KeywordEnv


def test_builtin_ids_are_registered():
    for env_id in ("PlanPath-v0", "Sokoban-v0", "Code-v0", "Math-v0"):
        assert env_id in llm_zoo.registry
        assert llm_zoo.spec(env_id).description


def test_register_and_make_with_kwargs_override():
    llm_zoo.register("test/Keyword-v0", KeywordEnv, description="toy", max_turns=2, override=True)
    env = llm_zoo.make("test/Keyword-v0")
    assert env.max_turns == 2
    assert llm_zoo.make("test/Keyword-v0", max_turns=5).max_turns == 5
    env_spec = llm_zoo.spec("test/Keyword-v0")
    assert (env_spec.namespace, env_spec.name, env_spec.version) == ("test", "Keyword", 0)


def test_unknown_id_lists_close_matches():
    with pytest.raises(UnknownEnvError, match=r"'PlanPath-v0'") as err:
        llm_zoo.make("PlanPth-v0")
    assert "Registered ids" in str(err.value)
    with pytest.raises(UnknownEnvError, match=r"Did you mean.*'PlanPath-v0'"):
        llm_zoo.make("PlanPath-v7")


def test_malformed_id_is_a_clear_error():
    with pytest.raises(ValueError, match="malformed environment id"):
        llm_zoo.make("plan path")


def test_unknown_constructor_argument_names_the_valid_ones():
    llm_zoo.register("test/Keyword-v1", KeywordEnv, override=True)
    with pytest.raises(
        TypeError, match=r"unknown argument\(s\) 'max_turn'.*valid arguments: max_turns, alpha"
    ):
        llm_zoo.make("test/Keyword-v1", max_turn=3)


def test_conflicting_registration_is_refused():
    llm_zoo.register("test/Keyword-v2", KeywordEnv, override=True)
    with pytest.raises(ValueError, match="already registered"):
        llm_zoo.register("test/Keyword-v2", "somewhere.else:Env")


def test_broken_plugin_warns_and_leaves_the_rest_usable(monkeypatch):
    class BrokenEntryPoint:
        name, value = "broken", "does_not_exist.module:register"

        def load(self):
            raise ImportError("No module named 'does_not_exist'")

    class GoodEntryPoint:
        name, value = "good", "inline"

        def load(self):
            return lambda: fresh.add(EnvSpec("good/Keyword-v0", KeywordEnv))

    fresh = EnvRegistry()
    # `llm_zoo.registry` is the registry object; the module is only reachable through sys.modules.
    registry_module = sys.modules["llm_zoo.registry"]
    monkeypatch.setattr(registry_module, "entry_points", lambda group: [BrokenEntryPoint(), GoodEntryPoint()])
    with pytest.warns(PluginLoadWarning, match=r"plugin 'broken' .* No module named"):
        ids = list(fresh)
    assert ids == ["good/Keyword-v0"]
    assert "broken" in fresh.plugin_errors


PLUGIN_MODULE = '''
from llm_zoo.core import Outcome, TextAECEnv


class CoinEnv(TextAECEnv):
    """Two players each call heads or tails."""

    metadata = {"render_modes": ["ansi"], "name": "coin_v0", "is_parallelizable": True}
    roles = ("caller", "checker")

    def _new_episode(self, rng, options):
        self.coin = "heads" if rng.integers(2) else "tails"

    def _prompt(self, agent):
        return f"{agent}: answer heads or tails"

    def _act(self, agent, action):
        ok = action.strip().lower() in ("heads", "tails")
        right = action.strip().lower() == self.coin
        return Outcome(float(right), float(right), format_ok=ok, terminated=right, success=right)

    def _render_state(self):
        return self.coin


def register_envs():
    from llm_zoo import register

    register("coins/Coin-v0", "throwaway_plugin:CoinEnv", description="call the coin")
'''


def _build_and_install(tmp_path, name, module_source, entry_point):
    source = tmp_path / f"src_{name}"
    source.mkdir()
    (source / f"{name}.py").write_text(module_source)
    (source / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["setuptools"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "{name.replace("_", "-")}"
            version = "0.0.1"

            [tool.setuptools]
            py-modules = ["{name}"]

            [project.entry-points."llm_zoo.envs"]
            {name} = "{entry_point}"
            """
        )
    )
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(source)],
        check=True,
    )  # fmt: skip
    return target


def test_installed_plugin_distribution_is_discovered(tmp_path):
    pytest.importorskip("setuptools")
    site = _build_and_install(tmp_path, "throwaway_plugin", PLUGIN_MODULE, "throwaway_plugin:register_envs")
    _build_and_install(tmp_path, "broken_plugin", "raise RuntimeError('plugin exploded')\n", "broken_plugin")
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    probe = (
        "import llm_zoo, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "env = llm_zoo.make('coins/Coin-v0'); env.reset(seed=1)\n"
        "print('found', llm_zoo.spec('coins/Coin-v0').plugin, type(env).__name__)\n"
    )
    found = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert "found throwaway_plugin CoinEnv" in found.stdout
    listing = subprocess.run(
        [sys.executable, "-m", "llm_zoo.cli", "list"], env=env, capture_output=True, text=True, check=True
    )
    assert "coins/Coin-v0" in listing.stdout and "[plugin: throwaway_plugin]" in listing.stdout
    assert "PlanPath-v0" in listing.stdout
    assert "plugin 'broken_plugin' failed to load: RuntimeError: plugin exploded" in listing.stdout


@pytest.mark.parametrize("env_id", sorted(BUILTIN_ENVS))
def test_every_builtin_env_passes_check_env(env_id):
    # Each env's own tests run check_env with valid answers too; this guards that no registered
    # env is left out.
    check_env(env_id, num_cycles=20, fuzz_count=100)
