"""The Python API (backend/analysis/api/) is the registry's: one typed function per kind, built from its entry at
import, with the params model's parameters (names, types, defaults) and the result model as its return annotation;
`backend.<name>` is that function, and old names (the registry's aliases) still answer."""
from __future__ import annotations

import inspect
import subprocess
import sys
import types
import typing
from os import PathLike
from pathlib import Path

import pytest

import backend
from backend.analysis import api
from backend.analysis.kinds import Kind, builtin, register, unregister
from backend.analysis.params import Params
from backend.analysis.results import Result

ROOT = Path(__file__).resolve().parents[2]
BUILTIN = builtin()


def canonical(tp: typing.Any) -> typing.Any:
    """A type without its validation metadata, unions as sets: `Optional[Annotated[int, Strict()]]` == `int | None`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return canonical(args[0])
    if origin in (typing.Union, types.UnionType):
        return ("union", frozenset(canonical(a) for a in args))
    if origin is typing.Literal:
        return ("literal", args)
    if origin is not None:
        return (origin, tuple(canonical(a) for a in args))
    return type(None) if tp is None else tp


@pytest.mark.parametrize("kind", BUILTIN, ids=lambda k: k.name)
def test_each_function_is_its_kind(kind: Kind):
    fn = getattr(api, kind.api)
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    assert hints.pop("return") is kind.result
    positional = [n for n, p in sig.parameters.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == [n for n, used in (("lm", kind.uses_model), ("task", kind.uses_task)) if used]
    keywords = {n: p for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY}
    fields = kind.params.model_fields
    assert list(keywords) == [*fields, "cache", "progress"]
    for name, f in fields.items():
        p = keywords[name]
        if f.is_required():
            assert p.default is p.empty, name
        else:
            want = f.get_default(call_default_factory=True)
            assert p.default == want and type(p.default) is type(want), name
        expected = canonical(f.annotation)
        if name in getattr(kind.params, "tensor_fields", ()):  # the Python API also takes a local file
            expected = canonical(f.annotation | PathLike[str])
        assert canonical(hints[name]) == expected, name
        assert f"        {name}" in fn.__doc__, name
    assert keywords["cache"].default is True and keywords["progress"].default is None
    assert " ".join(fn.__doc__.split()).startswith(kind.description[0].upper() + kind.description[1:])
    assert fn.__name__ == kind.api and fn.__module__ == "backend.analysis.api"
    assert all(len(line) <= 120 for line in fn.__doc__.splitlines())


def test_the_functions_are_the_registry_and_backend_serves_them():
    assert sorted(n for n in api.__all__ if n not in ("call", "kind_function")) == sorted(k.api for k in BUILTIN)
    for k in BUILTIN:
        assert getattr(backend, k.api) is getattr(api, k.api), k.api
    sig = inspect.signature(backend.head_scores)
    assert list(sig.parameters)[:2] == ["lm", "task"] and {"shots", "prompts", "seed", "top_k"} <= set(sig.parameters)
    assert sig.parameters["shots"].default == 8 and sig.parameters["top_k"].default is None
    assert str(sig.parameters["top_k"]) == "top_k: int | None = None"  # help() shows the plain type, no metadata


@pytest.mark.parametrize("kind", BUILTIN, ids=lambda k: k.name)
def test_every_default_passed_keeps_the_cache_key(kind: Kind):
    """A function passes every parameter, defaults included: the key is that of the request naming only what it
    sets (so results cached before, through `analyze` or the service, are hits)."""
    from backend.analysis.kernel import cache_key, validate_params

    given = {f: v for f, v in {"heads": [[0, 1]], "head": [0, 1]}.items() if f in kind.params.model_fields}
    explicit = {n: p.default for n, p in inspect.signature(getattr(api, kind.api)).parameters.items()
                if p.kind is p.KEYWORD_ONLY and n not in ("cache", "progress")} | given
    assert cache_key(kind, None, None, validate_params(kind, explicit)) == \
        cache_key(kind, None, None, validate_params(kind, given))


def test_a_field_without_a_description_reads_the_one_of_its_name_and_type():
    """IclCurveParams.prompts declares none: it reads PromptParams'; ablate's `positions` (all / last) never reads LTV's
    `positions` (a list of offsets), a field of the same name and another type."""
    assert "        prompts: held-out queries (prompts) scored" in backend.icl_curve.__doc__
    positions = next(line for line in backend.ablate.__doc__.splitlines() if line.strip().startswith("positions"))
    assert "offsets" not in positions and "offsets" in backend.ltv_layers.__doc__


def test_a_typo_or_a_bad_value_is_refused_before_any_model_is_touched():
    with pytest.raises(TypeError, match="shotz"):
        backend.head_scores(None, None, shotz=2)
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="shots"):
        backend.head_scores(None, None, shots=-1, cache=False)


def test_a_kind_registered_at_run_time_answers_by_its_name_and_aliases_with_a_real_signature():
    class EchoParams(Params):
        n: int = 1
        """how many"""

    class EchoResult(Result):
        n: int

    kind = Kind("echo_api", EchoParams, EchoResult, "tests.unit.test_api:echo", "echo n", uses_task=False,
                uses_model=False, cached=False, aliases=("echo_old",))
    register(kind)
    try:
        r = backend.echo_api(n=3)
        assert isinstance(r, EchoResult) and r.n == 3
        assert backend.echo_old is backend.echo_api  # the alias is the same function
        sig = inspect.signature(backend.echo_api)
        assert list(sig.parameters) == ["n", "cache", "progress"] and sig.parameters["n"].default == 1
        assert sig.return_annotation is EchoResult and "Echo n (kind `echo_api`)" in backend.echo_api.__doc__
        with pytest.raises(TypeError, match="takes no task"):
            backend.echo_api("a task")
        with pytest.raises(TypeError, match="nn"):
            backend.echo_api(nn=2)
    finally:
        unregister("echo_api")
        vars(backend).pop("echo_api", None)
        vars(backend).pop("echo_old", None)


def test_old_names_answer_as_their_kinds_function():
    """Every alias of the registry is `backend.<alias>`: the same function as the kind's name."""
    for k in BUILTIN:
        for alias in k.aliases:
            assert getattr(backend, alias) is getattr(api, k.name), alias
    assert backend.train_ltv is backend.ltv_layers and backend.build_vectors is backend.task_vectors
    assert backend.train_site is backend.site_alphas and backend.scores is backend.head_scores


def echo(ctx, p) -> dict:
    return {"n": p.n}


def test_import_backend_stays_torch_free():
    code = "import sys, backend; backend.load_task; assert 'torch' not in sys.modules, 'torch'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
