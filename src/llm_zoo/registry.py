"""Environment ids, registration, ``make``, and discovery of plugin environments.

Ids have the form ``[namespace/]Name-vN``. The built-in environments register themselves when
:mod:`llm_zoo` is imported. Other installed distributions add environments through the
entry-point group ``llm_zoo.envs``::

    # the plugin's pyproject.toml
    [project.entry-points."llm_zoo.envs"]
    my_games = "my_games.registration:register_envs"

The entry point names either a function, which is called with no arguments and calls
:func:`register`, or a module, whose import calls :func:`register`. Plugins are loaded lazily, the
first time the registry is read, without anyone importing them by hand. A plugin that fails to load
produces a warning naming it and its error; the other environments stay usable.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

__all__ = [
    "ENTRY_POINT_GROUP",
    "EnvRegistry",
    "EnvSpec",
    "PluginLoadWarning",
    "UnknownEnvError",
    "make",
    "register",
    "registry",
    "spec",
]

ENTRY_POINT_GROUP = "llm_zoo.envs"
_ID_PATTERN = re.compile(
    r"^(?:(?P<namespace>[A-Za-z0-9_.\-]+)/)?(?P<name>[A-Za-z0-9_.\-]+?)-v(?P<version>\d+)$"
)


class UnknownEnvError(LookupError):
    """Raised by :func:`make` and :func:`spec` for an id that is not registered."""

    def __str__(self) -> str:  # LookupError would repr() the message
        return str(self.args[0]) if self.args else ""


class PluginLoadWarning(UserWarning):
    """An ``llm_zoo.envs`` entry point could not be loaded; its environments are unavailable."""


@dataclass(frozen=True)
class EnvSpec:
    """How to build one registered environment.

    Attributes:
        id: ``[namespace/]Name-vN``.
        entry_point: ``"package.module:ClassName"`` or a callable returning the env.
        kwargs: Default constructor arguments; ``make(id, **kw)`` overrides them.
        description: One line for ``llm-zoo list``.
        plugin: Name of the entry point that registered it (``None`` for built-ins).
    """

    id: str
    entry_point: str | Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    plugin: str | None = None

    @property
    def namespace(self) -> str | None:
        return _parse_id(self.id)[0]

    @property
    def name(self) -> str:
        return _parse_id(self.id)[1]

    @property
    def version(self) -> int:
        return _parse_id(self.id)[2]

    def load(self) -> Callable[..., Any]:
        """Import and return the env class (or factory) without building an env."""
        if callable(self.entry_point):
            return self.entry_point
        module_name, _, attr = self.entry_point.partition(":")
        if not attr:
            raise ValueError(
                f"entry point of {self.id!r} must look like 'module:Class', got {self.entry_point!r}"
            )
        return getattr(importlib.import_module(module_name), attr)

    def make(self, **kwargs: Any) -> Any:
        """Build the env with ``self.kwargs`` updated by ``kwargs``."""
        factory = self.load()
        merged = {**self.kwargs, **kwargs}
        _check_kwargs(self.id, factory, merged)
        return factory(**merged)


def _parse_id(env_id: str) -> tuple[str | None, str, int]:
    match = _ID_PATTERN.match(env_id)
    if match is None:
        raise ValueError(
            f"malformed environment id {env_id!r}: expected '[namespace/]Name-vN', e.g. 'PlanPath-v0'"
        )
    return match["namespace"], match["name"], int(match["version"])


def _check_kwargs(env_id: str, factory: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # builtins without a signature: let the call decide
        return
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    if takes_any:
        return
    valid = [
        name
        for name, p in signature.parameters.items()
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise TypeError(
            f"{env_id}: unknown argument(s) {', '.join(map(repr, unknown))}; "
            f"valid arguments: {', '.join(valid) or '(none)'}"
        )


class EnvRegistry(Mapping[str, EnvSpec]):
    """Id -> :class:`EnvSpec`. Reading it loads the ``llm_zoo.envs`` plugins once, lazily."""

    def __init__(self) -> None:
        self._specs: dict[str, EnvSpec] = {}
        self._plugins_loaded = False
        self._loading_plugin: str | None = None
        #: Plugin entry-point name -> error message, for plugins that failed to load.
        self.plugin_errors: dict[str, str] = {}

    # Mapping interface: every read goes through _ensure_plugins.
    def __getitem__(self, env_id: str) -> EnvSpec:
        self._ensure_plugins()
        return self._specs[env_id]

    def __iter__(self) -> Iterator[str]:
        self._ensure_plugins()
        return iter(sorted(self._specs))

    def __len__(self) -> int:
        self._ensure_plugins()
        return len(self._specs)

    def __contains__(self, env_id: object) -> bool:
        self._ensure_plugins()
        return env_id in self._specs

    def add(self, env_spec: EnvSpec, *, override: bool = False) -> None:
        _parse_id(env_spec.id)
        if env_spec.id in self._specs and not override:
            existing = self._specs[env_spec.id]
            if existing.entry_point == env_spec.entry_point and existing.kwargs == env_spec.kwargs:
                return  # re-registering the same thing (a module imported twice) is harmless
            raise ValueError(
                f"environment id {env_spec.id!r} is already registered "
                f"(by {existing.plugin or 'llm_zoo'}); pass override=True to replace it"
            )
        self._specs[env_spec.id] = env_spec

    def load_plugins(self, *, force: bool = False) -> None:
        """Load every ``llm_zoo.envs`` entry point (again, if ``force``)."""
        if self._plugins_loaded and not force:
            return
        self._plugins_loaded = True
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            self._loading_plugin = ep.name
            try:
                loaded = ep.load()
                if callable(loaded):
                    loaded()
            except Exception as err:  # a broken plugin must not break the others
                message = f"{type(err).__name__}: {err}"
                self.plugin_errors[ep.name] = message
                warnings.warn(
                    f"llm_zoo: plugin {ep.name!r} ({ep.value}) failed to load and its "
                    f"environments are unavailable: {message}",
                    PluginLoadWarning,
                    stacklevel=3,
                )
            finally:
                self._loading_plugin = None

    def _ensure_plugins(self) -> None:
        if not self._plugins_loaded:
            self.load_plugins()

    def unknown_id_error(self, env_id: str) -> UnknownEnvError:
        ids = list(self)
        close = difflib.get_close_matches(env_id, ids, n=3, cutoff=0.5)
        try:
            namespace, name, _ = _parse_id(env_id)
            prefix = f"{namespace}/{name}-v" if namespace else f"{name}-v"
            close += [i for i in ids if i.startswith(prefix) and i not in close]
        except ValueError:
            pass
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        return UnknownEnvError(
            f"no environment registered with id {env_id!r}.{hint} "
            f"Registered ids: {', '.join(ids) or '(none)'}"
        )


registry = EnvRegistry()


def register(
    id: str,
    entry_point: str | Callable[..., Any],
    *,
    description: str = "",
    override: bool = False,
    **kwargs: Any,
) -> None:
    """Register an environment under ``id`` (``[namespace/]Name-vN``).

    Args:
        id: The id users pass to :func:`make`.
        entry_point: ``"module:Class"`` (imported only when the env is made) or a callable.
        description: One line shown by ``llm-zoo list``.
        override: Replace an existing registration instead of raising.
        **kwargs: Default constructor arguments.
    """
    registry.add(
        EnvSpec(
            id=id,
            entry_point=entry_point,
            kwargs=dict(kwargs),
            description=description,
            plugin=registry._loading_plugin,
        ),
        override=override,
    )


def spec(env_id: str) -> EnvSpec:
    """The :class:`EnvSpec` registered under ``env_id``; :class:`UnknownEnvError` if none."""
    _parse_id(env_id)
    if env_id not in registry:
        raise registry.unknown_id_error(env_id)
    return registry[env_id]


def make(env_id: str, **kwargs: Any) -> Any:
    """Build the environment registered under ``env_id``.

    ``kwargs`` override the registered defaults; an argument the env does not take is a
    ``TypeError`` naming the valid ones. An unregistered id raises :class:`UnknownEnvError`
    listing close matches.
    """
    return spec(env_id).make(**kwargs)
