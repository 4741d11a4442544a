"""Where a module of a possibly device-mapped model computes (accelerate's `hf_device_map`), and moving a hook's
tensors there. Used by the intervention layer so that every hook works on its own module's device."""
from __future__ import annotations

import torch


def module_device(module: torch.nn.Module) -> torch.device | None:
    """Where `module` computes: accelerate's execution device when a hook of a device map (`hf_device_map`) is on it,
    else the device of its first weight or buffer; None for a module that holds neither (its input decides)."""
    hook = getattr(module, "_hf_hook", None)
    chain = getattr(hook, "hooks", None) or [hook]  # accelerate's SequentialHook holds several
    dev = next((d for h in chain if (d := getattr(h, "execution_device", None)) is not None), None)
    if isinstance(dev, dict):  # a hook of several modules: its entry for the module's own weights
        dev = next(iter(dev.values()), None)
    if dev is not None:
        return torch.device(f"cuda:{dev}" if isinstance(dev, int) else dev)
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return None


def on_device(x: torch.Tensor, device: torch.device | None) -> torch.Tensor:
    """`x` on `device` (no copy when it is there already, or when the module holds no tensor: None)."""
    return x if device is None or x.device == device else x.to(device)
