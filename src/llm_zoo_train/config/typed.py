"""Typed configuration from YAML files and ``--section.field value`` command-line overrides.

Generic machinery over a *root* dataclass whose fields are section dataclasses (see
:mod:`llm_zoo_train.config` for the trainer's schema):

* :func:`load_dataclass` reads a YAML mapping, applies overrides (``--a.b VALUE`` or ``--a.b=VALUE``;
  the value is read as YAML; a dotted path may continue into a ``dict`` field, e.g.
  ``--env.kwargs.rows 5``) and builds the dataclasses, checking every key and value against the
  type annotations (``int``, ``float``, ``bool``, ``str``, ``None``, ``Literal``, unions, ``list``,
  ``dict``, ``Any``). An unknown key is an error naming it, suggesting close names and listing the
  valid keys; a wrong type names the key, the expected type and the value.
* :class:`Alias` gives a field another name: a top-level key such as TRL's ``report_to`` for
  ``logging.log_with`` (with a value conversion where the two differ in form), an old dotted name
  kept for compatibility (``deprecated``: a ``FutureWarning`` names the new one), or a name refused
  with an explanation (``target`` None: a same-named option that means something else). One
  source - the YAML file, or the command line - may set a field under one name only; the command
  line overrides the file whichever names each uses.
* :func:`field_docs` reads the docstring under each field (CleanRL/tyro style) from the source;
  :func:`format_fields` turns them into help text (aliases included).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import functools
import inspect
import itertools
import math
import re
import textwrap
import types
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

__all__ = [
    "SKIP",
    "Alias",
    "ConfigError",
    "config_from_dict",
    "config_to_dict",
    "field_docs",
    "format_fields",
    "load_dataclass",
    "parse_overrides",
]


class ConfigError(ValueError):
    """A configuration problem, with a message naming the key and the valid choices."""


#: Larger config files are refused before they are parsed (a 50 MB YAML takes minutes).
MAX_CONFIG_BYTES = 1 << 20


#: Returned by an :attr:`Alias.convert` function when the value sets nothing (e.g. ``bf16: false``).
SKIP: Any = object()


@dataclass(frozen=True)
class Alias:
    """Another name for one config field.

    Attributes:
        name: The other name: a top-level key (``report_to``) or a dotted path (``rollout.old_name``).
        target: The canonical dotted key it sets, e.g. ``logging.log_with``; None refuses ``name``
            with ``note`` as the error (an option that looks equivalent but is not).
        convert: Maps the alias's value to the target's value (None: the same value, checked against
            the target's type); raises :class:`ConfigError` for a bad value; returns :data:`SKIP` to
            set nothing.
        note: How the value maps (shown in help), or the refusal message.
        deprecated: An old name: accepted with a ``FutureWarning`` naming ``target``.
    """

    name: str
    target: str | None
    convert: Callable[[Any], Any] | None = None
    note: str = ""
    deprecated: bool = False


# --------------------------------------------------------------------------- field docs and types


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` (CleanRL/tyro style), by field name."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, following in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return "any"
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return " | ".join(repr(a) if not isinstance(a, str) else a for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin in (list, Sequence):
        return f"list[{_type_name(typing.get_args(annotation)[0])}]"
    if origin in (dict, Mapping):
        key, value = typing.get_args(annotation)
        return f"dict[{_type_name(key)}, {_type_name(value)}]"
    return getattr(annotation, "__name__", str(annotation))


def _check_type(value: Any, annotation: Any, key: str) -> Any:
    """Return ``value`` if it fits ``annotation`` (ints are accepted as floats), else ConfigError."""

    def fail() -> ConfigError:
        return ConfigError(
            f"{key}: expected {_type_name(annotation)}, got {value!r} ({type(value).__name__})"
        )

    origin = typing.get_origin(annotation)
    if annotation is Any:
        return value
    if annotation is type(None):
        if value is None:
            return None
        raise fail()
    if origin is Literal:
        if value in typing.get_args(annotation) and isinstance(value, str | int | float | bool | None):
            return value
        choices = [str(a) for a in typing.get_args(annotation)]
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(choices)}.{hint}")
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in typing.get_args(annotation):
            try:
                return _check_type(value, option, key)
            except ConfigError as err:
                errors.append(err)
        literal_errors = [e for e in errors if "is not one of" in str(e)]
        if len(literal_errors) == 1 and isinstance(value, str):
            raise literal_errors[0]
        raise fail()
    if origin in (list, Sequence):
        if not isinstance(value, list | tuple):
            raise fail()
        (item_type,) = typing.get_args(annotation)
        return [_check_type(item, item_type, f"{key}[{i}]") for i, item in enumerate(value)]
    if origin in (dict, Mapping):
        if not isinstance(value, dict):
            raise fail()
        key_type, value_type = typing.get_args(annotation)
        return {
            _check_type(k, key_type, f"{key} key"): _check_type(v, value_type, f"{key}.{k}")
            for k, v in value.items()
        }
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise fail()
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise fail()
    if annotation is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str) and _FLOAT_TEXT.match(value.strip()):
            number = float(value)  # PyYAML reads `1e-5` (no dot) as a string
        else:
            raise fail()
        if not math.isfinite(number):
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return number
    if annotation is str:
        if isinstance(value, str):
            return value
        raise fail()
    raise TypeError(f"{key}: unsupported annotation {annotation!r} in the config schema")


_FLOAT_TEXT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _unknown_key(key: str, name: str, valid: Sequence[str]) -> ConfigError:
    by_name = {v.rsplit(".", 1)[-1]: v for v in valid}
    close = [by_name[c] for c in difflib.get_close_matches(name, list(by_name), n=3, cutoff=0.5)]
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    error = ConfigError(f"unknown config key {key!r}.{hint} Valid keys here: {', '.join(valid)}")
    error.key = key  # type: ignore[attr-defined]  # load_dataclass names the file it came from
    return error


# --------------------------------------------------------------------------- dict <-> config


def config_from_dict(data: Mapping[str, Any] | None, cls: Any, prefix: str = "") -> Any:
    """Build the dataclass ``cls`` from nested dicts, checking every key and value type."""
    data = {} if data is None else data
    if not isinstance(data, Mapping):
        where = prefix.rstrip(".") or "the config"
        raise ConfigError(f"{where}: expected a mapping of keys, got {data!r}")
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    values: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        if name not in names:
            raise _unknown_key(key, str(name), [f"{prefix}{n}" for n in names])
        annotation = hints[name]
        if dataclasses.is_dataclass(annotation):
            values[name] = config_from_dict(value, annotation, f"{key}.")
        else:
            values[name] = _check_type(value, annotation, key)
    return cls(**values)


def config_to_dict(config: Any) -> dict[str, Any]:
    """Nested plain dicts (YAML/JSON-ready) of a config dataclass."""
    return dataclasses.asdict(config)


def _set_path(root: Any, raw: dict[str, Any], key: str, value: Any, text: str = "") -> None:
    """Set ``raw[a][b]...`` for ``key = "a.b..."``, checking the path against the schema.

    ``text`` is the value as typed; it is used instead of ``value`` when a string field would
    otherwise receive the mapping or list that YAML made of it."""
    parts = key.split(".")
    cls: Any = root
    node = raw
    for depth, part in enumerate(parts):
        here = ".".join(parts[: depth + 1])
        last = depth == len(parts) - 1
        if cls is None:  # inside a free-form dict field (e.g. env.kwargs.rows)
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    raise ConfigError(f"--{key}: {here} is not a mapping")
            continue
        names = [f.name for f in dataclasses.fields(cls)]
        if part not in names:
            prefix = ".".join(parts[:depth])
            raise _unknown_key(here, part, [f"{prefix}.{n}" if prefix else n for n in names])
        annotation = _hints(cls)[part]
        if last:
            if isinstance(value, dict | list) and _accepts_str(annotation) and not _fits(value, annotation):
                value = text  # `--model.system_prompt "Answer: yes"` means the text, not a mapping
            if dataclasses.is_dataclass(annotation) and not isinstance(value, dict):
                first = dataclasses.fields(annotation)[0].name
                raise ConfigError(f"--{key} is a section; set its fields, e.g. --{key}.{first} VALUE")
            node[part] = value
        elif dataclasses.is_dataclass(annotation):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{here}: expected a mapping of keys, got {node!r}")
            cls = annotation
        elif _allows_dict(annotation):
            current = node.get(part)
            if not isinstance(current, dict):
                current = {} if current is None or isinstance(current, str) else current
                node[part] = current
            node = current
            cls = None
        else:
            raise ConfigError(f"--{key}: {here} is a value ({_type_name(annotation)}), it has no sub-keys")


def _accepts_str(annotation: Any) -> bool:
    return annotation is str or str in typing.get_args(annotation)


def _fits(value: Any, annotation: Any) -> bool:
    try:
        _check_type(value, annotation, "")
    except ConfigError:
        return False
    return True


def _allows_dict(annotation: Any) -> bool:
    if typing.get_origin(annotation) in (dict, Mapping):
        return True
    return any(_allows_dict(a) for a in typing.get_args(annotation) if typing.get_origin(annotation))


def parse_overrides(args: Sequence[str]) -> list[tuple[str, Any, str]]:
    """``["--a.b", "1", "--c=x"]`` -> ``[("a.b", 1, "1"), ("c", "x", "x")]``: key, value read as
    YAML, and the text as typed."""
    pairs: list[tuple[str, Any, str]] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(f"expected an option like --section.field VALUE, got {arg!r}")
        name, eq, text = arg[2:].partition("=")
        if not eq:
            if index + 1 >= len(args):
                raise ConfigError(f"--{name} needs a value (e.g. --{name} VALUE or --{name}=VALUE)")
            index += 1
            text = args[index]
        try:
            value = load_yaml(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text  # not YAML: take the text as a string (the type check decides)
        pairs.append((name.replace("-", "_"), value, text))
        index += 1
    return pairs


class _ConfigYAMLLoader(yaml.SafeLoader):
    """YAML with YAML 1.2 booleans: only ``true``/``false`` are booleans.

    PyYAML follows YAML 1.1, where ``no``, ``yes``, ``on`` and ``off`` are booleans too, so
    ``mixed_precision: no`` would arrive as ``False`` and fail its own choices (no, bf16, fp16).
    """


_ConfigYAMLLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigYAMLLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def load_yaml(text: str) -> Any:
    """Parse configuration YAML (booleans are ``true``/``false`` only; ``no`` is a string)."""
    return yaml.load(text, Loader=_ConfigYAMLLoader)


# --------------------------------------------------------------------------- aliases


def _annotation_at(root: Any, key: str) -> Any:
    cls = root
    for part in key.split("."):
        cls = _hints(cls)[part]
    return cls


def _alias_value(root: Any, alias: Alias, value: Any, where: str) -> Any:
    """The target's value for ``value`` given under ``alias.name`` (SKIP: set nothing)."""
    if alias.target is None:
        raise ConfigError(f"{where}{alias.name}: {alias.note}")
    if alias.deprecated:
        warnings.warn(
            f"{where}{alias.name} is deprecated: use {alias.target} (same meaning)",
            FutureWarning,
            stacklevel=4,
        )
    if alias.convert is not None:
        return alias.convert(value)
    return _check_type(value, _annotation_at(root, alias.target), alias.name)


def _pop_path(raw: dict[str, Any], key: str) -> tuple[bool, Any]:
    *parents, last = key.split(".")
    node: Any = raw
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or last not in node:
        return False, None
    return True, node.pop(last)


def _has_path(raw: Mapping[str, Any], key: str) -> bool:
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _conflict(where: str, first: str, second: str, target: str) -> ConfigError:
    """``where``: the file (``"PATH: "``), or ``"--"`` for the command line (each name gets it)."""
    prefix, each = ("", "--") if where == "--" else (where, "")
    names = " and ".join(
        f"{each}{n} (alias of {target})" if n != target else f"{each}{n}" for n in (first, second)
    )
    return ConfigError(f"{prefix}{names} both set {target}; give it once, under one name")


def _resolve_file_aliases(root: Any, raw: dict[str, Any], aliases: Sequence[Alias], where: str) -> None:
    """Replace the alias keys of a YAML mapping by their targets (in place)."""
    set_by: dict[str, str] = {}
    for alias in aliases:
        found, value = _pop_path(raw, alias.name)
        if not found:
            continue
        value = _alias_value(root, alias, value, where)
        if value is SKIP:
            continue
        assert alias.target is not None
        if alias.target in set_by:
            raise _conflict(where, set_by[alias.target], alias.name, alias.target)
        if _has_path(raw, alias.target):
            raise _conflict(where, alias.name, alias.target, alias.target)
        set_by[alias.target] = alias.name
        _set_path(root, raw, alias.target, value)


def _resolve_override_aliases(
    root: Any, pairs: Sequence[tuple[str, Any, str]], aliases: Sequence[Alias]
) -> list[tuple[str, Any, str]]:
    """Command-line ``(key, value, text)`` pairs with alias keys replaced by their targets."""
    by_name = {alias.name: alias for alias in aliases}
    set_by: dict[str, str] = {}
    resolved = []
    for key, value, text in pairs:
        alias = by_name.get(key)
        name = key
        if alias is not None:
            value = _alias_value(root, alias, value, "--")
            if value is SKIP:
                continue
            assert alias.target is not None
            key = alias.target
            text = text if alias.convert is None else ""
        if set_by.setdefault(key, name) != name:
            raise _conflict("--", set_by[key], name, key)
        resolved.append((key, value, text))
    return resolved


def load_dataclass(
    root: Any,
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    aliases: Sequence[Alias] = (),
) -> Any:
    """Build dataclass ``root`` from the YAML file at ``path`` (None: defaults) and ``--key value``
    overrides, checking every key and type; ``aliases`` are other names of fields (see :class:`Alias`)."""
    raw: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{path}: {size / 2**20:.1f} MiB is too large for a config file (at most "
                f"{MAX_CONFIG_BYTES // 2**20} MiB): is it the right file?"
            )
        try:
            loaded = load_yaml(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise ConfigError(
                f"{path}: not a text file (byte {err.start} is not UTF-8): give a YAML config"
            ) from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from None
        if loaded is None:  # an empty or truncated file is a mistake, not a request for every default
            raise ConfigError(
                f"{path}: the file holds no settings (empty, or only comments): give the sections to set, "
                "or {} on purpose to take every default"
            )
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of sections at the top, got {loaded!r}")
        raw = loaded
        _resolve_file_aliases(root, raw, aliases, f"{path}: ")
    from_file = copy.deepcopy(raw)
    for key, value, text in _resolve_override_aliases(root, parse_overrides(overrides), aliases):
        _set_path(root, raw, key, value, text)
    try:
        return config_from_dict(raw, root)
    except ConfigError as err:
        bad_key = getattr(err, "key", None)
        if path is not None and bad_key is not None and _has_path(from_file, bad_key):
            raise ConfigError(f"{path}: {err}") from None
        raise


def format_fields(root: Any, aliases: Sequence[Alias] = ()) -> str:
    """Every field of the sections of ``root`` with its type, default, documentation and aliases."""
    other_names: dict[str, list[str]] = {}
    for alias in aliases:
        if alias.target is not None and not alias.deprecated:
            other_names.setdefault(alias.target, []).append(
                alias.name + (f": {alias.note}" if alias.note else "")
            )
    old_names = {a.target: a.name for a in aliases if a.deprecated}
    lines = []
    for section in dataclasses.fields(root):
        cls = _hints(root)[section.name]
        lines.append(f"{section.name}:  {field_docs(root).get(section.name, '')}")
        docs = field_docs(cls)
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
            shown = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
            lines.append(f"  --{section.name}.{f.name} ({_type_name(hints[f.name])}, default {shown})")
            if f.name in docs:
                lines.extend(
                    textwrap.wrap(docs[f.name], 100, initial_indent="      ", subsequent_indent="      ")
                )
            names = other_names.get(f"{section.name}.{f.name}")
            if names:
                text = ("alias: " if len(names) == 1 else "aliases: ") + "; ".join(names)
                lines.extend(textwrap.wrap(text, 100, initial_indent="      ", subsequent_indent="        "))
            if f"{section.name}.{f.name}" in old_names:
                lines.append(
                    f"      formerly {old_names[f'{section.name}.{f.name}']} (deprecated, still accepted)"
                )
        lines.append("")
    return "\n".join(lines)
