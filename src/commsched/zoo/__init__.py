"""Built-in model zoo: per-layer workloads of well-known models, shipped as package data.

>>> from commsched import zoo
>>> zoo.load("resnet50").num_params
25557032

Each model has one or more *profiles*, one JSON file each in ``zoo/data``
named ``MODEL.PROFILE.json``. A profile is a device name (``V100``), with a
``.DTYPE`` suffix when it is not fp32 (``H100.bf16``). ``load(name)`` returns
the default profile (``V100``); ``load(name, "H100.bf16")`` picks another.

Layers, tensor names, shapes and order come from the reference
implementations (torchvision 0.29.1, timm 1.0.31, transformers 5.23.0, on
torch 2.14.1): the modules that own parameters directly, in forward execution
order, recorded by one forward pass in train mode (so inception_v3's
``AuxLogits`` is included, between ``Mixed_6e`` and ``Mixed_7a``). Tied
weights are counted once: BERT's ``cls.predictions.decoder`` and GPT-2's
``lm_head`` are layers with no tensors of their own (their weight is the word
embedding), kept for their compute time. ``tests/data/zoo_reference.json``
records every reference's ``named_parameters()``. ``inception_bn`` has no
PyTorch package: it is ``scripts/make_zoo.py``'s layer-for-layer port of
MXNet's Inception-BN symbol (``example/image-classification/symbols/inception-bn.py``,
224x224), the model Prophet's experiments name; ``transformer`` is the
Transformer base of Vaswani et al. (2017), built from ``torch.nn.Transformer``
with the paper's sizes and a shared 37000-token vocabulary (``scripts/make_zoo.py``).
The HeteroG models (vgg19, resnet200, inception_v3, mobilenet_v2,
transformer, bert_large) also record ``extra["activation_bytes_per_sample"]``,
the bytes autograd keeps for backward per sample, which the planner's memory
model reads.

The shipped V100 profiles are **estimates**, not measurements (provenance
``kind="estimated"``)::

    forward_ms  = F     / (15.7e12 FLOP/s * eff) * 1e3 + 0.01 ms
    backward_ms = 2 * F / (15.7e12 FLOP/s * eff) * 1e3 + 0.01 ms

where ``F`` is the layer's forward FLOPs at the model's batch size, counted
by ``torch.utils.flop_counter.FlopCounterMode`` (matmuls, convolutions and
attention; each operator of a parameter-free module such as ReLU, pooling or
the attention matmuls is charged to the nearest layer before it), 15.7 TFLOP/s
is the V100's fp32 peak and ``eff = 0.5807`` is the same for every model. It is
solved so that resnet50 at batch 64 takes 64 / 367 s = 174.4 ms forward plus
backward, NVIDIA's published fp32 training throughput on one V100 16GB
(DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5: 367 img/s,
measured at batch 112 per GPU and assumed unchanged at batch 64).
Gradient-ready times are left to be derived (a layer's gradients are ready
when its backward ends). ``scripts/make_zoo.py`` regenerates everything.

========================  =====  ===========  =======  ======  ======  =======
model                     batch  params       tensors  layers  fwd ms  bwd ms
========================  =====  ===========  =======  ======  ======  =======
resnet18                     64   11,689,512       62      41    25.9     51.4
resnet50                     64   25,557,032      161     107    58.5    115.9
resnet152                    32   60,192,808      467     311    83.9    164.8
resnet200 (timm)             32   64,673,832      611     407   109.4    214.8
vgg16                        64  138,357,544       32      16   217.4    434.6
vgg19                        64  143,667,240       38      19   275.8    551.5
densenet201                  32   20,013,928      604     402    34.1     64.3
inception_v3 (with aux)      64   27,161,264      292     194    82.2    162.5
inception_v4 (timm)          64   42,679,816      449     299   175.0    347.1
inception_bn (MXNet)         64   11,295,240      278     139    29.3     57.2
mobilenet_v2                 64    3,504,872      158     105     5.3      9.5
transformer (seq 128)        32   63,084,544      185      76    59.5    118.2
bert_base (seq 64)           64  110,106,428      206     106   100.0    199.0
bert_large (seq 64)          32  336,226,108      398     202   153.6    305.3
gpt2 (seq 1024)               8  124,439,808      148      76   256.7    512.6
gpt2_medium (seq 1024)        8  354,823,168      292     148   727.2   1452.9
========================  =====  ===========  =======  ======  ======  =======

Every model has the one profile ``V100`` (fp32, estimated).
"""

from __future__ import annotations

import re
from functools import cache, lru_cache
from importlib import resources
from importlib.resources.abc import Traversable

from commsched.errors import SpecError
from commsched.workload import Workload

__all__ = ["DEFAULT_DEVICE", "available_devices", "list_models", "load"]

DEFAULT_DEVICE = "V100"
"""The profile ``load`` returns when no device is given (if the model has it)."""


def _data_dir() -> Traversable:
    return resources.files("commsched.zoo").joinpath("data")


@lru_cache(maxsize=1)
def _profiles() -> dict[str, tuple[str, ...]]:
    """Model name -> its profile names, both sorted."""
    found: dict[str, list[str]] = {}
    for entry in _data_dir().iterdir():
        stem, dot, suffix = entry.name.rpartition(".")
        if suffix != "json" or not dot:
            continue
        model, _, profile = stem.partition(".")
        if profile:
            found.setdefault(model, []).append(profile)
    return {model: tuple(sorted(found[model])) for model in sorted(found, key=_natural_key)}


def _natural_key(name: str) -> list[str | int]:
    """Sort key that puts resnet18 before resnet152."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def list_models() -> list[str]:
    """Names of the models in the zoo, sorted (numbers by value: resnet18 before resnet152)."""
    return list(_profiles())


def _canonical(name: str) -> str:
    """``"GPT2-Medium"`` -> ``"gpt2_medium"``; raises SpecError listing the known models."""
    key = name.strip().lower().replace("-", "_")
    if key not in _profiles():
        raise SpecError("zoo model", [f"name: no model {name!r} in the zoo; known models: {', '.join(list_models())}"])
    return key


def available_devices(name: str) -> list[str]:
    """The profiles shipped for model ``name`` (``["V100"]``, later e.g. ``"H100"``, ``"H100.bf16"``)."""
    return list(_profiles()[_canonical(name)])


def load(name: str, device: str | None = None) -> Workload:
    """The workload of zoo model ``name`` on profile ``device`` (default: ``DEFAULT_DEVICE``).

    Model names are case-insensitive and ``-`` may stand for ``_``. With no
    device, ``DEFAULT_DEVICE`` is used if the model has it, else its first
    profile. Raises SpecError naming the unknown model or device and listing
    the known ones.
    """
    model = _canonical(name)
    profiles = _profiles()[model]
    if device is None:
        device = DEFAULT_DEVICE if DEFAULT_DEVICE in profiles else profiles[0]
    if device not in profiles:
        raise SpecError(
            f"zoo profile of {model}",
            [f"device: no profile {device!r} for {model}; available: {', '.join(profiles)}"],
        )
    return _load_file(model, device)


@cache
def _load_file(model: str, profile: str) -> Workload:
    filename = f"{model}.{profile}.json"
    text = _data_dir().joinpath(filename).read_text()
    workload = Workload.from_json(text, source=f"zoo/data/{filename}")
    device, _, dtype = profile.partition(".")
    found = (workload.model, workload.device, workload.dtype)
    if found != (model, device, dtype or "fp32"):
        raise SpecError(
            f"zoo/data/{filename}",
            [
                f"<root>: expected model {model!r}, device {device!r}, dtype {dtype or 'fp32'!r} from the file name, "
                f"got {found}"
            ],
        )
    return workload
