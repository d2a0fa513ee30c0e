"""The planner's own model: a ``[model]`` table that describes a model instead of naming one.

A scenario's ``[model]`` names a shipped model (``name = "nemotron-h-8b"``), or describes
one with the keys of :data:`DESCRIPTION_KEYS` (the :class:`~reference.sizes.ModelSizes`
fields, spelled as Hugging Face ``config.json`` files spell them), or points at a model
file (``file = "my-model.toml"``: a TOML file with the same ``[model]`` table, which
``hyckpt sizes --model-file`` also reads). ``base = "<preset>"`` starts a description from
a shipped model, so that ``base = "nemotron-h-8b"`` and ``ssm_state_dtype = "float32"``
describe that model with a float32 state.

Layers are given one of three ways: counts by kind (``mamba2_layers = 24`` ...), a
Nemotron-H ``hybrid_override_pattern`` (``M`` Mamba2, ``*`` attention, ``-`` MLP, ``E``
MoE), or ``layer_types`` (one name per layer, as Qwen3-Next, Granite and gpt-oss configs
list them). Parameters are given (``total_params``, ``active_params``) or counted from the
MLP / MoE widths (:func:`reference.param_count.estimate_params`). ``docs/SIZES.md``
("Your own model") reproduces a shipped model from its config fields.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reference.errors import InvalidConfigError
from reference.param_count import estimate_params
from reference.sizes import DTYPES, MODELS, ModelSizes
from sim.scenarios.schema import (
    MISSING,
    Check,
    ScenarioError,
    any_text,
    boolean,
    choice,
    integer,
    suggestion,
)

#: Largest width, head count or layer count a description takes.
MAX_DIMENSION = 2**24
#: Largest parameter count (a quadrillion) or weight size in bytes.
MAX_PARAMS = 10**15

_DIM = integer(0, MAX_DIMENSION)
_PARAMS = integer(0, MAX_PARAMS)
_DTYPE = choice(list(DTYPES))

#: Layer kinds of ``layer_types`` and the count each adds to.
LAYER_TYPES: dict[str, str] = {
    "mamba1": "mamba1_layers",
    "mamba2": "mamba2_layers",
    "gdn": "gdn_layers",
    "linear_attention": "gdn_layers",
    "attention": "full_attention_layers",
    "full_attention": "full_attention_layers",
    "sliding_attention": "sliding_window_layers",
    "mlp": "mlp_only_layers",
}

#: ``hybrid_override_pattern`` characters (Nemotron-H) and the counts each adds to.
PATTERN_CHARACTERS: dict[str, tuple[str, ...]] = {
    "M": ("mamba2_layers",),
    "*": ("full_attention_layers",),
    "-": ("mlp_only_layers", "ffn_layers"),
    "E": ("mlp_only_layers", "ffn_layers", "moe_layers"),
}

_COUNT_KEYS = (
    "mamba1_layers",
    "mamba2_layers",
    "gdn_layers",
    "full_attention_layers",
    "sliding_window_layers",
    "mlp_only_layers",
)


def _layer_types(value: object) -> str | None:
    expected = f"a non-empty list of layer kinds among {', '.join(LAYER_TYPES)}"
    if not isinstance(value, list) or not value or len(value) > MAX_DIMENSION:
        return expected
    for item in value:
        if item == "mamba":
            return f"{expected} ('mamba' is Mamba1 in Jamba, Mamba2 in Granite: say which)"
        if not isinstance(item, str) or item not in LAYER_TYPES:
            hint = suggestion(item, list(LAYER_TYPES)) if isinstance(item, str) else ""
            return f"{expected}{hint}"
    return None


_PATTERN = re.compile(r"[M*\-E]+")


def _pattern(value: object) -> str | None:
    ok = isinstance(value, str) and len(value) <= MAX_DIMENSION and _PATTERN.fullmatch(value)
    return None if ok else "a string of M (Mamba2), * (attention), - (MLP) and E (MoE)"


#: Keys that describe a model, with their checks and one line each (docs/SCENARIOS.md).
DESCRIPTION_KEYS: dict[str, tuple[Check, str]] = {
    "hf_id": (any_text, "the Hugging Face repository the values describe"),
    "source": (any_text, "where the values were read"),
    "notes": (any_text, "anything a reader of the numbers should know"),
    "hidden_size": (_DIM, "model width d_model (elements)"),
    "vocab_size": (_DIM, "vocabulary size (tokens)"),
    "num_hidden_layers": (_DIM, "decoder layers (default: the sum of the layer kinds)"),
    "hybrid_override_pattern": (_pattern, "Nemotron-H layer pattern (M, *, -, E)"),
    "layer_types": (_layer_types, "one layer kind per layer"),
    **{key: (_DIM, f"layers of that kind ({key.removesuffix('_layers')})") for key in _COUNT_KEYS},
    "parallel_hybrid": (boolean, "attention and Mamba2 side by side in each layer (Falcon-H1)"),
    "sliding_window": (_DIM, "window W of the sliding-window layers (tokens)"),
    "mamba_d_inner": (_DIM, "Mamba inner width (default: heads x head_dim, or expand x d)"),
    "mamba_expand": (_DIM, "Mamba expand factor: d_inner = expand x hidden_size"),
    "mamba_num_heads": (_DIM, "Mamba2 heads H"),
    "mamba_head_dim": (_DIM, "Mamba2 head dimension P"),
    "mamba_d_state": (_DIM, "SSM state size N"),
    "mamba_n_groups": (_DIM, "Mamba2 B/C groups G"),
    "mamba_d_conv": (_DIM, "causal conv kernel width"),
    "linear_num_key_heads": (_DIM, "gated DeltaNet key heads"),
    "linear_num_value_heads": (_DIM, "gated DeltaNet value heads"),
    "linear_key_head_dim": (_DIM, "gated DeltaNet key head dimension"),
    "linear_value_head_dim": (_DIM, "gated DeltaNet value head dimension"),
    "linear_conv_kernel_dim": (_DIM, "gated DeltaNet conv kernel width"),
    "num_attention_heads": (_DIM, "attention query heads"),
    "num_key_value_heads": (_DIM, "attention KV heads"),
    "head_dim": (_DIM, "attention head dimension"),
    "mtp_layers": (_DIM, "multi-token-prediction (draft head) layers"),
    "dtype": (_DTYPE, "activation / KV / conv-window dtype"),
    "ssm_state_dtype": (_DTYPE, "recurrent state dtype"),
    "total_params": (_PARAMS, "total parameters (default: counted from the widths)"),
    "active_params": (_PARAMS, "parameters per token (default: total, or counted)"),
    "weight_bytes": (_PARAMS, "resident weight bytes (default: total_params x dtype)"),
    "num_experts": (_DIM, "routed experts per MoE layer E"),
    "experts_per_token": (_DIM, "routed experts per token k"),
    "ffn_layers": (_DIM, "layers with an MLP or MoE (default: all, or the MLP-only ones)"),
    "moe_layers": (_DIM, "of those, MoE layers (default: all of them in a MoE model)"),
    "intermediate_size": (_DIM, "dense MLP width"),
    "moe_intermediate_size": (_DIM, "width of one routed expert"),
    "shared_expert_intermediate_size": (_DIM, "total width of a MoE layer's shared experts"),
    "mlp_gated": (boolean, "gated MLPs (SwiGLU: 3 matrices); false: 2 (squared ReLU)"),
    "tie_word_embeddings": (boolean, "the output head shares the embedding"),
    "max_position_embeddings": (_DIM, "context length, tokens (engines' max_model_len)"),
}

#: Hugging Face spellings accepted for a description key (the same value, other families).
ALIASES: dict[str, str] = {
    "attention_head_dim": "head_dim",
    "ssm_state_size": "mamba_d_state",
    "n_groups": "mamba_n_groups",
    "conv_kernel": "mamba_d_conv",
    "expand": "mamba_expand",
    "mamba_n_heads": "mamba_num_heads",
    "mamba_d_head": "mamba_head_dim",
    "mamba_d_ssm": "mamba_d_inner",
    "num_local_experts": "num_experts",
    "num_experts_per_tok": "experts_per_token",
}

#: Keys of ``[model]`` besides the description.
TABLE_KEYS = ("name", "gpu", "base", "file")

_HOW = "layer counts by kind, hybrid_override_pattern or layer_types"


def describes(table: Mapping[str, Any]) -> bool:
    """Whether a ``[model]`` table describes a model (rather than naming a preset)."""
    return any(key not in TABLE_KEYS for key in table) or "base" in table or "file" in table


def check_key(where: str, key: str, value: object, prefix: str = "model") -> str:
    """Check one description key; return its canonical name.

    Raises:
        ScenarioError: an unknown key (with a did-you-mean) or a value of the wrong type.
    """
    canonical = ALIASES.get(key, key)
    spec = DESCRIPTION_KEYS.get(canonical)
    if spec is None:
        known = [*TABLE_KEYS, *DESCRIPTION_KEYS]
        raise ScenarioError(
            where,
            f"{prefix}.{key}",
            value,
            f"a key of [model] (name, gpu, base, file, or a model description key: "
            f"docs/SCENARIOS.md){suggestion(key, [*known, *ALIASES])}",
        )
    problem = spec[0](value)
    if problem is not None:
        raise ScenarioError(where, f"{prefix}.{key}", value, problem)
    return canonical


def _layer_counts(given: dict[str, Any], spelled: dict[str, str], where: str) -> dict[str, int]:
    """Layer counts from exactly one of the three ways of giving them."""
    ways = [way for way in ("hybrid_override_pattern", "layer_types") if way in given]
    counted = [key for key in _COUNT_KEYS if key in given]
    if len(ways) + bool(counted) > 1:
        second = ways[1] if len(ways) > 1 else (counted[0] if ways else ways[0])
        raise ScenarioError(
            where,
            f"model.{spelled[second]}",
            given[second],
            f"unset: the layers are given once, by one of {_HOW}",
        )
    counts = {key: 0 for key in (*_COUNT_KEYS, "ffn_layers", "moe_layers")}
    if "hybrid_override_pattern" in given:
        for character in given.pop("hybrid_override_pattern"):
            for key in PATTERN_CHARACTERS[character]:
                counts[key] += 1
        return counts
    if "layer_types" in given:
        for kind in given.pop("layer_types"):
            counts[LAYER_TYPES[kind]] += 1
        return {k: v for k, v in counts.items() if k not in ("ffn_layers", "moe_layers")}
    if not counted:
        raise ScenarioError(where, "model", MISSING, f"the model's layers: {_HOW}")
    return {key: given.pop(key, 0) for key in _COUNT_KEYS}


def _derived(values: dict[str, Any], given: set[str], spelled: dict[str, str], where: str) -> None:
    """Fill in what the description leaves to be derived (layers, d_inner, FFN, params)."""
    recurrent = values["mamba1_layers"] + values["mamba2_layers"] + values["gdn_layers"]
    attention = values["full_attention_layers"] + values["sliding_window_layers"]
    if values.get("num_hidden_layers") is None:
        values["num_hidden_layers"] = (
            recurrent if values.get("parallel_hybrid") else recurrent + attention
        ) + values["mlp_only_layers"]
    expand = values.pop("mamba_expand", None)
    if not values.get("mamba_d_inner"):
        if values.get("mamba_num_heads") and values.get("mamba_head_dim"):
            values["mamba_d_inner"] = values["mamba_num_heads"] * values["mamba_head_dim"]
        elif expand:
            values["mamba_d_inner"] = expand * values["hidden_size"]
    if values.get("mamba2_layers") and not values.get("mamba_num_heads"):
        head = values.get("mamba_head_dim") or 0
        if head and values.get("mamba_d_inner"):
            values["mamba_num_heads"] = values["mamba_d_inner"] // head
    if "ffn_layers" not in given and not values.get("ffn_layers"):
        values["ffn_layers"] = values["mlp_only_layers"] or values["num_hidden_layers"]
    if "moe_layers" not in given and not values.get("moe_layers") and values.get("num_experts"):
        values["moe_layers"] = values["ffn_layers"]
    has_total, has_active = "total_params" in given, "active_params" in given
    if has_total and not has_active and not values.get("num_experts"):
        values["active_params"], has_active = values["total_params"], True  # dense
    if has_total != has_active:
        present, other = (
            ("total_params", "active_params") if has_total else ("active_params", "total_params")
        )
        raise ScenarioError(
            where,
            f"model.{other}",
            MISSING,
            f"a value beside model.{spelled[present]} (a MoE model's active parameters "
            "differ from its total), or neither, to count both from the widths",
        )
    if not has_total:
        sized = _sizes(values, where, spelled, counting=True)
        try:
            counted = estimate_params(sized)
        except InvalidConfigError as error:
            missing = re.findall(r"\b(\w+_size)\b", str(error).rsplit(", or ", 1)[-1])
            raise ScenarioError(
                where,
                f"model.{missing[0]}" if missing else "model.total_params",
                MISSING,
                "a value to count the parameters from the widths, or total_params and "
                f"active_params ({str(error).split(': ', 1)[-1]})",
            ) from None
        values["total_params"], values["active_params"] = counted.total, counted.active


def _sizes(
    values: Mapping[str, Any], where: str, spelled: Mapping[str, str], *, counting: bool = False
) -> ModelSizes:
    """``ModelSizes(**values)``; its consistency errors become a ScenarioError naming the
    first key the message names."""
    fields = {f.name for f in dataclasses.fields(ModelSizes)}
    kwargs = {key: value for key, value in values.items() if key in fields}
    if counting:  # parameters are not known yet; 0 passes the checks that compare them
        kwargs.update(total_params=0, active_params=0)
    try:
        return ModelSizes(**kwargs)
    except InvalidConfigError as error:
        message = str(error).split(": ", 1)[-1]
        found = {key: re.search(rf"\b{key}\b", message) for key in fields}
        named = sorted((m.start(), key) for key, m in found.items() if m is not None)
        first = named[0][1] if named else None  # the first field the message names
        shown = f"model.{spelled.get(first, first)}" if first else "model"
        raise ScenarioError(
            where, shown, kwargs.get(first, MISSING) if first else MISSING, message
        ) from None


def build_model(table: Mapping[str, Any], where: str, base_dir: Path | None = None) -> ModelSizes:
    """The model a ``[model]`` table names or describes (see the module docstring).

    ``table`` holds the keys as written (``name``, ``gpu``, ``base``, ``file`` and
    description keys); ``where`` names the file in errors; ``base_dir`` resolves ``file``.

    Raises:
        ScenarioError: naming ``model.<key>``, the value found and what was expected.
    """
    name = table.get("name", MISSING)
    if "file" in table:
        return _from_file(table, where, base_dir)
    if not describes(table):
        if name is MISSING:
            name = "nemotron-h-8b"
        problem = choice(list(MODELS))(name)
        if problem is not None:
            raise ScenarioError(
                where,
                "model.name",
                name,
                f"{problem} (or describe your own model: docs/SCENARIOS.md, [model])",
            )
        return MODELS[name]
    if not isinstance(name, str) or not name or name is MISSING:
        raise ScenarioError(where, "model.name", name, "a name for the model described")
    base = table.get("base")
    if base is not None:
        problem = choice(list(MODELS))(base)
        if problem is not None:
            raise ScenarioError(where, "model.base", base, problem)
    elif name in MODELS:
        raise ScenarioError(
            where,
            "model.name",
            name,
            f"a name of its own: {name!r} is a shipped model; to change it, set "
            f"model.base = {name!r} and give the result another name",
        )
    given: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in table.items():
        if key in TABLE_KEYS:
            continue
        canonical = check_key(where, key, value)
        if canonical in given:
            raise ScenarioError(
                where,
                f"model.{key}",
                value,
                f"unset: model.{spelled[canonical]} already gives {canonical}",
            )
        given[canonical], spelled[canonical] = value, key
    for key in DESCRIPTION_KEYS:
        spelled.setdefault(key, key)
    values: dict[str, Any]
    # A pattern says which layers have an FFN (only - and E); counts and layer_types do not.
    ffn_given = {"ffn_layers", "moe_layers"} if "hybrid_override_pattern" in given else set()
    if base is not None:
        values = _preset_values(MODELS[base])
        if any(k in given for k in (*_COUNT_KEYS, "hybrid_override_pattern", "layer_types")):
            for key in (*_COUNT_KEYS, "ffn_layers", "moe_layers", "num_hidden_layers"):
                values.pop(key, None)
            values.update(_layer_counts(given, spelled, where))
        for key in ("total_params", "active_params"):
            if key not in given and _changes_params(given):
                values.pop(key, None)
        values.update(given)
        given_keys = set(given) | ffn_given
        given_keys |= {k for k in ("total_params", "active_params") if k in values}
        given_keys |= {k for k in ("ffn_layers", "moe_layers") if k in values}
    else:
        if "hidden_size" not in given:
            raise ScenarioError(where, "model.hidden_size", MISSING, "the model width d_model")
        values = dict(_layer_counts(given, spelled, where))
        values.update(given)
        given_keys = set(given) | ffn_given
    values["name"] = name
    values.setdefault("vocab_size", 0)  # informational, unless the parameters are counted
    values.setdefault("hf_id", "")
    values.setdefault("source", f"described in {where}")
    _derived(values, given_keys, spelled, where)
    return _sizes(values, where, spelled)


_PARAM_SHAPING = {
    "hidden_size",
    "vocab_size",
    "intermediate_size",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "num_experts",
    "experts_per_token",
    "ffn_layers",
    "moe_layers",
    "mlp_gated",
    "tie_word_embeddings",
    *_COUNT_KEYS,
}


def _changes_params(given: Mapping[str, Any]) -> bool:
    """Whether a change to a preset changes its parameter count (then it is recounted)."""
    return bool(_PARAM_SHAPING & set(given))


def _preset_values(m: ModelSizes) -> dict[str, Any]:
    values = dataclasses.asdict(m)
    for key in ("params_source", "unconfirmed", "notes", "hf_id", "source"):
        values.pop(key)
    values["source"] = f"{m.name} ({m.hf_id}) with changes"
    values["params_source"] = m.params_source
    return values


def _from_file(table: Mapping[str, Any], where: str, base_dir: Path | None) -> ModelSizes:
    others = [key for key in table if key not in ("file", "gpu")]
    if others:
        raise ScenarioError(
            where,
            f"model.{others[0]}",
            table[others[0]],
            "unset beside model.file (the model file describes the model)",
        )
    file = table["file"]
    if not isinstance(file, str) or not file:
        raise ScenarioError(where, "model.file", file, "a path to a model file (TOML)")
    path = Path(file)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return load_model_file(path)


def load_model_file(path: str | Path) -> ModelSizes:
    """The model a model file describes: a TOML file with one ``[model]`` table.

    Raises:
        ScenarioError: naming the file, the key and what was expected (a missing file, bad
            TOML, other tables, or any error :func:`build_model` finds).
    """
    where = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as error:
        raise ScenarioError(
            where, "(file)", MISSING, f"a readable model file ({error.strerror})"
        ) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ScenarioError(where, "(file)", MISSING, f"valid UTF-8 TOML ({error})") from None
    extra = [key for key in data if key != "model"]
    if extra or not isinstance(data.get("model"), dict):
        key = extra[0] if extra else "model"
        raise ScenarioError(where, key, data.get(key, MISSING), "one [model] table, nothing else")
    model = data["model"]
    for key in ("gpu", "file"):
        if key in model:
            raise ScenarioError(
                where,
                f"model.{key}",
                model[key],
                "unset in a model file (the GPU and deployment belong to the scenario)"
                if key == "gpu"
                else "unset in a model file (it is the model file)",
            )
    if not describes(model):
        raise ScenarioError(where, "model", model, "a model description (docs/SCENARIOS.md)")
    return build_model(model, where)
