"""The one intervention layer: small objects, each with one job at one site, and one applier that installs them.

    with intervene(lm, [HeadMask(mask, fill=mean_z), Capture("layer_out"), Add("layer_in", {3: v}, at=(-1,))]):
        lm.model(...)

Sites (`adapters.Site`, resolved through the model's `ArchSpec`): "z" (the output projection's input, (b, s, H*dh)),
"layer_in" / "layer_out" (a decoder layer's input / output, (b, s, d)), "post_attn_in" (the post-attention norm's
input, Gemma 2 / 3), "attn_out" / "mlp_out" (what the attention / MLP block adds to the residual stream, after the
post-norms where the family has them, (b, s, d)) and "final_in" (the final norm's input, (b, s, d)). An intervention reads or rewrites the
activation at its site (`act(x, layer) -> new x or None`); `Skip` instead replaces decoder layers' forward.

`intervene` installs them in list order (on one module, the earlier acts first), checks their layers, and removes
every hook and restored every forward on exit, exceptions included. `prefill_only=True` lets them act on the first
forward pass in the block only (a prompt's prefill; later decoding steps run untouched). No hook edits an activation
in place or opens an inference mode of its own, so gradients flow through them (a trained vector, a soft head mask).
This is the only module that registers a hook on a model (tests/unit/test_interventions.py checks it).

Positions: batches are left-padded, so each row's last prompt token is at -1; with right padding, `last` (b,) gives
each row's index of it (`take_last`, `replace_last`, `add_at`).

Devices: a model spread over several devices (`device_map="auto"`: accelerate puts each decoder layer, the embeddings,
the final norm and the head on a device of their own and moves each block's inputs there) has no one device. Every
hook works on its module's device (`module_device`: accelerate's execution device where the module has a hook, else
its weights'): a pre-hook moves its input there first, as accelerate will, and every tensor an intervention brings
(a head mask and its fill, an added vector, a replacement, a skipped layer's output, `last`) is moved to the
activation's device when it acts, whatever device the analysis made it on. Captures stay on their module's device;
`Skip` keeps the forward a hook library installed on the layer (accelerate's) and puts it back on exit.
"""
from __future__ import annotations

import weakref

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal, Mapping, Sequence

import torch

from .adapters import OUTPUT_SITES, PER_LAYER, Site
from .loading import LoadedModel
from .placement import module_device, on_device as _on

Where = Literal["all", "last"]


# -- positions ----------------------------------------------------------------------------------------------------
def take_last(x: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
    """x at each row's last prompt token: (b, s, d) -> (b, d); `last` (b,) indices, None for position -1."""
    if last is None:
        return x[:, -1]
    return x[torch.arange(x.shape[0], device=x.device), last.to(x.device)]


def add_at(x: torch.Tensor, v: torch.Tensor, offsets: Sequence[int], last: torch.Tensor | None) -> torch.Tensor:
    """x + v at each row's positions `last + 1 + o` for o in `offsets` (negative: -1 is the last prompt token),
    without editing x. x (b, s, d); v (d,) or (b, d), the same at every chosen position."""
    b, s, _ = x.shape
    lst = torch.full((b,), s - 1, device=x.device) if last is None else last.to(x.device)
    sel = torch.zeros(b, s, dtype=x.dtype, device=x.device)
    for o in offsets:
        if o >= 0:
            raise ValueError(f"positions are negative offsets from the last prompt token (-1 = last), not {o}")
        pos = lst + 1 + o
        if (pos < 0).any():
            raise ValueError(f"position offset {o} reaches before the start of a prompt")
        sel = sel + torch.nn.functional.one_hot(pos, s).to(x.dtype)
    v = v.to(device=x.device, dtype=x.dtype)
    return x + sel[..., None] * (v if v.dim() == 2 else v[None])[:, None, :]


def replace_last(x: torch.Tensor, new: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
    """x with each row's last prompt token replaced by `new`, without editing x: (b, s, d), (b, d)."""
    new = new.to(device=x.device, dtype=x.dtype)
    if last is None:
        return torch.cat([x[:, :-1], new.unsqueeze(1)], dim=1)
    sel = torch.nn.functional.one_hot(last.to(x.device), x.shape[1]).bool()[..., None]  # (b, s, 1)
    return torch.where(sel, new[:, None], x)


def mask_heads(z: torch.Tensor, m: torch.Tensor, fill: torch.Tensor | None) -> torch.Tensor:
    """The head-mask formula, z' = m z + (1 - m) fill per head (fill None: z' = m z).

    z (..., H, dh); m (..., H) broadcastable to z's leading axes (1 keeps a head, 0 ablates it); fill (H, dh)."""
    mm = m.to(device=z.device, dtype=z.dtype)[..., None]
    return mm * z if fill is None else mm * z + (1 - mm) * fill.to(device=z.device, dtype=z.dtype)


# -- the interventions ---------------------------------------------------------------------------------------------
class Intervention:
    """One job at one site. `site`; `layers(lm)`: where it acts (None for "final_in"); `act(x, layer)`: the new
    activation (a new tensor, never x edited in place) or None to leave x as it is."""

    site: Site

    def layers(self, lm: LoadedModel) -> Sequence[int | None]:
        return [None] if self.site == "final_in" else range(lm.n_layers)

    def act(self, x: torch.Tensor, layer: int | None) -> torch.Tensor | None:
        raise NotImplementedError


def _chosen(site: Site, chosen: Sequence[int] | None, lm: LoadedModel) -> Sequence[int | None]:
    if site == "final_in":
        return [None]
    return range(lm.n_layers) if chosen is None else chosen


@dataclass(eq=False)
class Record(Intervention):
    """Call `fn(layer, x)` with the activation at `site` (x as the model has it, full (b, s, ...)); changes nothing.
    `at`: the layers (None: every layer)."""

    site: Site
    fn: Callable[[int | None, torch.Tensor], None]
    at: Sequence[int] | None = None

    def layers(self, lm: LoadedModel) -> Sequence[int | None]:
        return _chosen(self.site, self.at, lm)

    def act(self, x: torch.Tensor, layer: int | None) -> None:
        self.fn(layer, x)


@dataclass(eq=False)
class Capture(Intervention):
    """Keep a copy of the activation at `site` at each row's last prompt token, (b, ...), in `got[layer]` (layer None
    for "final_in"), or into `into` (a list or dict indexed by layer) when given. `at`: the layers (None: all).
    `device`: where the copies go (None: the module's device; a model spread over devices gathers them on one)."""

    site: Site
    at: Sequence[int] | None = None
    last: torch.Tensor | None = None
    into: Any = None
    got: dict = field(default_factory=dict)
    device: torch.device | None = None

    def __post_init__(self) -> None:
        if self.into is None:
            self.into = self.got

    def layers(self, lm: LoadedModel) -> Sequence[int | None]:
        return _chosen(self.site, self.at, lm)

    def act(self, x: torch.Tensor, layer: int | None) -> None:
        self.into[layer] = _on(take_last(x, self.last).clone(), self.device)


@dataclass(eq=False)
class WriteScale(Intervention):
    """The post-attention norm (Gemma 2 / 3) linearised at the last token, into[layer] = g / rms(x) (b, d) float32,
    x the norm's input (the summed head writes plus the bias): a head's write is (z_h @ W_O[h]) * scale. Every layer
    (the family must have the norm). `device`: where the scales go (None: the module's device)."""

    into: Any
    last: torch.Tensor | None = None
    site: Site = "post_attn_in"
    device: torch.device | None = None
    norms: dict = field(default_factory=dict)  # layer -> (gain g (d,) float32, eps), read by `layers`

    def layers(self, lm: LoadedModel) -> Sequence[int | None]:
        if lm.spec.post_attn_norm is None:
            raise ValueError(f"{lm.spec.family} has no post-attention norm")
        self.norms = {l: (lm.post_attn_gain(l), lm.post_attn_eps(l)) for l in range(lm.n_layers)}
        return range(lm.n_layers)

    def act(self, x: torch.Tensor, layer: int | None) -> None:
        gain, eps = self.norms[layer]
        x = take_last(x, self.last).float()
        self.into[layer] = _on(gain.to(x.device) * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps), self.device)


@dataclass(eq=False)
class HeadMask(Intervention):
    """Mask heads at z (the output projection's input): z' = m z + (1 - m) fill (`mask_heads`).

    mask: (b, layers, heads) applied at every layer, or {layer: m} with m broadcastable to (b, s, heads) (at "all")
          or (b, heads) (at "last"), applied at those layers only.
    fill: (layers, heads, head_dim) values ablated heads take (mean ablation), None for 0.
    at:   "all" positions, or each row's "last" prompt token (`last`, None: position -1)."""

    mask: torch.Tensor | Mapping[int, torch.Tensor]
    fill: torch.Tensor | None = None
    at: Where = "all"
    last: torch.Tensor | None = None
    heads: int = 0  # H, set by `intervene`
    site: Site = "z"

    def layers(self, lm: LoadedModel) -> Sequence[int | None]:
        self.heads = lm.n_heads
        return sorted(self.mask) if isinstance(self.mask, Mapping) else range(lm.n_layers)

    def act(self, z: torch.Tensor, layer: int | None) -> torch.Tensor:
        table = isinstance(self.mask, Mapping)
        m = self.mask[layer] if table else self.mask[:, layer]  # type: ignore[index]
        fill = None if self.fill is None else self.fill[layer]
        b, s, width = z.shape
        H = self.heads
        if self.at == "last":
            zl = mask_heads(take_last(z, self.last).reshape(b, H, width // H), m, fill)
            return replace_last(z, zl.reshape(b, width), self.last)
        zz = mask_heads(z.reshape(b, s, H, width // H), m if table else m[:, None], fill)
        return zz.reshape(b, s, width)


@dataclass(eq=False)
class Add(Intervention):
    """Add vectors at `site`: vectors {layer: v}, v (d,) or broadcastable to (b, d) at "last" / offsets, to (b, s, d)
    at "all". at: "last" (each row's last prompt token, `last`), "all" positions, or negative offsets from the last
    prompt token (-1 = last; `add_at`)."""

    site: Site
    vectors: Mapping[int, torch.Tensor]
    at: Where | tuple[int, ...] = "last"
    last: torch.Tensor | None = None

    def layers(self, lm: LoadedModel) -> Sequence[int | None]:
        return sorted(self.vectors)

    def act(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        v = self.vectors[layer]
        if self.at == "last":
            return replace_last(x, take_last(x, self.last) + v.to(device=x.device, dtype=x.dtype), self.last)
        if self.at == "all":
            return x + v.to(device=x.device, dtype=x.dtype)
        return add_at(x, v, self.at, self.last)


def injection(lm: LoadedModel, vectors: dict[int, torch.Tensor], positions: Sequence[int] = (-1,),
              last: torch.Tensor | None = None) -> list[Intervention]:
    """`Add`s of {layer: v} at the input of decoder layer `layer` (0..n_layers; n_layers: the final norm's input) at
    `positions` (negative offsets from each row's last prompt token; (-1,): the last token)."""
    at: Where | tuple[int, ...] = "last" if tuple(positions) == (-1,) else tuple(positions)
    L = lm.n_layers
    bad = [l for l in vectors if not 0 <= int(l) <= L]
    if bad:
        raise ValueError(f"injection at layer {bad[0]}: a layer's input is 0..{L} ({L}: the final norm's input)")
    inner = {int(l): v for l, v in vectors.items() if int(l) < L}
    out: list[Intervention] = [Add("layer_in", inner, at=at, last=last)] if inner else []
    if L in vectors:
        out.append(Add("final_in", {None: vectors[L]}, at=at, last=last))  # type: ignore[dict-item]
    return out


@dataclass(eq=False)
class Replace(Intervention):
    """The activation at `site` of `layer` becomes `value` (the same shape, or one the model accepts there)."""

    site: Site
    layer: int
    value: torch.Tensor

    def layers(self, lm: LoadedModel) -> Sequence[int | None]:
        return [self.layer]

    def act(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        return self.value.to(x.device)


@dataclass(eq=False)
class Patch(Intervention):
    """At `site` of `layer`, x' = where(mask, source, x): the chosen positions (and, at z, heads) take `source`'s
    values, the rest stay (exact activation patching). source (b, s, width), the activation's own shape; mask (b, s)
    bool (whole positions) or (b, s, k) bool with width = k * group (k groups of width // k channels each: at z,
    k = heads)."""

    site: Site
    layer: int
    source: torch.Tensor
    mask: torch.Tensor

    def layers(self, lm: LoadedModel) -> Sequence[int | None]:
        return [self.layer]

    def act(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        if tuple(self.source.shape) != tuple(x.shape):
            raise ValueError(f"patch source of shape {tuple(self.source.shape)} at {self.site} of layer {layer}, "
                             f"where the activation is {tuple(x.shape)}")
        m = self.mask.to(x.device)
        if m.dim() == 2:
            m = m[..., None]
        elif m.shape[-1] != x.shape[-1]:
            if x.shape[-1] % m.shape[-1]:
                raise ValueError(f"a patch mask of {m.shape[-1]} groups does not divide width {x.shape[-1]}")
            m = m.repeat_interleave(x.shape[-1] // m.shape[-1], dim=-1)
        return torch.where(m, self.source.to(device=x.device, dtype=x.dtype), x)


@dataclass(eq=False)
class Tap(Intervention):
    """The activation at `site` at each row's last prompt token, with a handle on its gradient (attribution
    patching): value[layer] (b, width) a detached copy, and delta[layer] (b, width) a zero leaf that requires grad,
    added there (x' = x + delta at the last token: the forward is unchanged). After `backward()` of a scalar of the
    run, delta[layer].grad = d scalar / d x[layer] at the last token. float32 leaves. `at`: the layers (None: all)."""

    site: Site
    at: Sequence[int] | None = None
    last: torch.Tensor | None = None
    value: dict = field(default_factory=dict)
    delta: dict = field(default_factory=dict)

    def layers(self, lm: LoadedModel) -> Sequence[int | None]:
        return _chosen(self.site, self.at, lm)

    def act(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        here = take_last(x, self.last)
        self.value[layer] = here.detach().float().clone()
        d = torch.zeros(here.shape, dtype=torch.float32, device=x.device, requires_grad=True)
        self.delta[layer] = d
        return replace_last(x, here + d.to(x.dtype), self.last)


@dataclass(eq=False)
class Skip:
    """Decoder layers `at` are not computed: each returns its input, except that the last of them returns
    `output` when given (the recorded clean output of that layer). `skip_below(k, out)`: layers 0 .. k-1."""

    at: Sequence[int]
    output: torch.Tensor | None = None


def skip_below(start: int, output: torch.Tensor | None = None) -> Skip:
    """Layers < start pass their input through; layer start - 1 returns `output` when given."""
    return Skip(range(start), output)


@dataclass
class Applied:
    """What `intervene` saw: `passes`, the forward passes begun in the block (counted at decoder layer 0 when
    `prefill_only`); `odd_outputs`, the type names of decoder-layer outputs that were not plain tensors (their first
    element was read)."""

    passes: int = 0
    odd_outputs: list[str] = field(default_factory=list)


# -- the applier ---------------------------------------------------------------------------------------------------
def _input(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _with_input(args: tuple, kwargs: dict, x: torch.Tensor) -> tuple[tuple, dict]:
    if args:
        return (x,) + tuple(args[1:]), kwargs
    return args, {**kwargs, "hidden_states": x}


def _through(*args: Any, **kwargs: Any) -> Any:
    return _input(args, kwargs)


@contextmanager
def intervene(lm: LoadedModel, items: Sequence[Intervention | Skip], *, prefill_only: bool = False
              ) -> Iterator[Applied]:
    """Install `items` on `lm` in order for the forward passes inside the block; every hook is removed and every
    skipped layer restored on exit, exceptions included. A layer out of range is a ValueError before anything runs."""
    state = Applied()
    L = lm.n_layers
    sites: list[tuple[Intervention, int | None]] = []
    for it in items:
        where = it.at if isinstance(it, Skip) else it.layers(lm)
        for layer in where:
            if layer is not None and not 0 <= layer < L:
                raise ValueError(f"layer {layer} out of range: the model has layers 0..{L - 1}")
        if not isinstance(it, Skip):
            if it.site not in PER_LAYER and it.site != "final_in":
                raise ValueError(f"unknown site {it.site!r}")
            sites += [(it, layer) for layer in where]

    def count(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        state.passes += 1

    def pre(it: Intervention, layer: int | None, device: torch.device | None) -> Callable:
        act = it.act

        def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
            if prefill_only and state.passes > 1:
                return None
            x = args[0] if args else kwargs["hidden_states"]
            moved = _on(x, device)  # the previous block's device under a device map: the module's, as accelerate will
            new = act(moved, layer)
            if new is None:
                new = None if moved is x else moved
            return None if new is None else _with_input(args, kwargs, new)
        return hook

    def post(it: Intervention, layer: int | None) -> Callable:
        act = it.act

        def hook(module: torch.nn.Module, args: tuple, output: Any) -> Any:
            if prefill_only and state.passes > 1:
                return None
            if isinstance(output, torch.Tensor):
                return act(output, layer)
            state.odd_outputs.append(type(output).__name__)
            if not isinstance(output, tuple):
                return None
            new = act(output[0], layer)
            return None if new is None else (new,) + tuple(output[1:])
        return hook

    handles: list[Any] = []
    skipped: list[torch.nn.Module] = []
    try:
        if prefill_only:
            handles.append(lm.layers[0].register_forward_pre_hook(count, with_kwargs=True))
        for it, layer in sites:
            module = lm.site_module(it.site, layer)
            if it.site in OUTPUT_SITES:
                handles.append(module.register_forward_hook(post(it, layer)))
            else:
                handles.append(module.register_forward_pre_hook(pre(it, layer, module_device(module)),
                                                                with_kwargs=True))
        for it in items:
            if isinstance(it, Skip):
                at = list(it.at)
                for i in at:
                    layer_module = lm.layers[i]
                    if all(m is not layer_module for m, _ in skipped):  # its own forward: accelerate's, if any
                        skipped.append((layer_module, layer_module.__dict__.get("forward")))
                    if it.output is not None and i == at[-1]:
                        out = _on(it.output, module_device(layer_module))
                        layer_module.forward = lambda *a, _o=out, **k: _o
                    else:
                        layer_module.forward = _through
        yield state
    finally:
        for h in handles:
            h.remove()
        for module, forward in reversed(skipped):
            if forward is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = forward


_CHECKED: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


def check_before_layers(lm: LoadedModel, check: Callable[[], None]) -> None:
    """`check()` before every decoder layer of every forward pass of `lm`, for the model's life, installed once per
    model: the one hook no `intervene` block owns, because it belongs to the loaded model (a job's cooperative stop,
    `stopping.check`, which does nothing outside a job)."""
    if lm.model in _CHECKED:
        return
    for layer in lm.layers:
        layer.register_forward_pre_hook(lambda _module, _args: check())
    _CHECKED.add(lm.model)
