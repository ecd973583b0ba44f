"""The models ``commsched profile --model`` builds: those of :mod:`commsched.models` and, with torchvision, zoo CNNs."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from commsched.errors import SpecError

#: Zoo models that torchvision builds (``weights=None``), with their input side.
TORCHVISION_MODELS = {
    "resnet18": 224,
    "resnet50": 224,
    "resnet152": 224,
    "vgg16": 224,
    "vgg19": 224,
    "densenet201": 224,
    "inception_v3": 299,
}


def _small_models() -> Any:
    try:
        return importlib.import_module("commsched.models")
    except ImportError:
        return None


def model_names() -> list[str]:
    """Models ``commsched profile --model`` can build here."""
    models = _small_models()
    names = list(models.MODELS) if models is not None else []
    if importlib.util.find_spec("torchvision") is not None:
        names += list(TORCHVISION_MODELS)
    return names


def build(name: str, batch_size: int, seed: int) -> tuple[Any, Callable[[], Any], Callable[[Any, Any], Any]]:
    """``(model, make_batch, loss_fn)`` for a model of ``commsched.models`` or, with torchvision, a zoo CNN."""
    import torch
    import torch.nn.functional as F

    models = _small_models()
    if models is not None and name in models.MODELS:
        model = models.build_model(name, seed=seed)
        return model, lambda: models.synthetic_batch(name, batch_size, seed, 0, 0), models.model_loss
    if name in TORCHVISION_MODELS:
        try:
            tv = importlib.import_module("torchvision.models")
        except ImportError:
            raise SpecError("model", [f"{name!r} needs torchvision, which is not installed"]) from None
        side = TORCHVISION_MODELS[name]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            extra = {"aux_logits": True, "init_weights": False} if name == "inception_v3" else {}
            model = tv.get_model(name, weights=None, **extra)
        g = torch.Generator().manual_seed(seed)

        def make_batch() -> tuple[Any, Any]:
            images = torch.randn(batch_size, 3, side, side, generator=g)
            return images, torch.randint(0, 1000, (batch_size,), generator=g)

        def loss_fn(output: Any, target: Any) -> Any:
            if hasattr(output, "aux_logits") and output.aux_logits is not None:  # inception_v3 in train mode
                return F.cross_entropy(output.logits, target) + 0.4 * F.cross_entropy(output.aux_logits, target)
            return F.cross_entropy(output, target)

        return model, make_batch, loss_fn
    known = ", ".join(model_names()) or "none"
    hint = "" if "resnet50" in known else " (zoo CNNs need torchvision)"
    raise SpecError("model", [f"no model {name!r} to build; known: {known}{hint}"])
