"""Generate the built-in model zoo: ``src/commsched/zoo/data/*.json`` and ``tests/data/zoo_reference.json``.

The reference implementations (torchvision, timm, transformers) are needed
only here, never by commsched at run time. Run this in a throwaway virtual
environment, from the repository root::

    python -m venv /tmp/zoovenv
    /tmp/zoovenv/bin/pip install torch==2.14.1 torchvision==0.29.1 timm transformers pydantic
    PYTHONPATH=src /tmp/zoovenv/bin/python scripts/make_zoo.py

``--only MODEL ...`` regenerates some models and keeps the rest (a port
defined in this file, such as ``inception_bn``, needs only torch).

Nothing is downloaded: every model is built from its constructor or config
with random weights.

What is recorded, per model:

* **Layers**: the modules that own trainable parameters directly
  (``named_parameters(recurse=False)``), in forward execution order, found by
  one forward pass in train mode (so auxiliary heads such as inception_v3's
  ``AuxLogits`` run) with a forward pre-hook on each; a module called twice
  counts at its first call. A layer's tensors are its direct parameters in
  ``named_parameters`` order, named as in ``model.named_parameters()``. A tied
  parameter appears once, in the first layer that uses it; a later layer whose
  parameters are all tied (GPT-2's ``lm_head``, BERT's ``cls.predictions.decoder``)
  is kept with no tensors so that its compute time stays in the profile.
  A module with parameters that the forward never calls but whose enclosing
  module uses them (``torch.nn.MultiheadAttention``'s ``out_proj``) joins the
  nearest called ancestor's layer; others would be appended at the end with
  a note (none of the shipped models has one).
* **Forward FLOPs per layer**: ``torch.utils.flop_counter.FlopCounterMode`` on
  the meta device at the profile's batch size. Each counted operator is charged
  to the layer whose pre-hook fired last, so an operator of a parameter-free
  module (ReLU, pooling, the attention matmuls / SDPA) is charged to the
  nearest layer before it, whose gradient cannot be final before that
  operator's backward has run; operators before the first layer go to the
  first layer. Nothing is counted twice: the per-layer sum equals the counter's
  global total (asserted).
* **Activation memory per sample** (``extra["activation_bytes_per_sample"]``,
  what the planner's memory model needs): the bytes autograd saves for
  backward in one forward, at two batch sizes on CPU
  (:func:`activation_bytes_per_sample`).
* **Times** (estimated, no GPU involved)::

      forward_ms  = fwd_flops     / (PEAK * efficiency) * 1e3 + LAUNCH_FLOOR_MS
      backward_ms = 2 * fwd_flops / (PEAK * efficiency) * 1e3 + LAUNCH_FLOOR_MS

  with PEAK = 15.7e12 FLOP/s (V100 fp32) and one efficiency for all models,
  solved so that resnet50 at batch 64 takes ANCHOR_MS = 64 / 367 s forward
  plus backward (NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5, 367 img/s
  FP32 training on one V100 16GB; NVIDIA measured it at batch 112 per GPU, and
  the same throughput is assumed at batch 64).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from commsched.workload import Layer, Provenance, Tensor, Workload

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = REPO / "src" / "commsched" / "zoo" / "data"
REFERENCE_PATH = REPO / "tests" / "data" / "zoo_reference.json"

DEVICE = "V100"
PEAK_FLOPS = 15.7e12  # V100 (SXM2) fp32 peak, FLOP/s
LAUNCH_FLOOR_MS = 0.010  # added to every layer's forward and backward
ANCHOR_MODEL = "resnet50"
ANCHOR_BATCH = 64
ANCHOR_IMG_PER_S = 367.0
ANCHOR_MS = ANCHOR_BATCH / ANCHOR_IMG_PER_S * 1e3
ANCHOR_SOURCE = (
    "NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "
    "'Training performance: NVIDIA DGX-1 16GB (8x V100 16GB)', 1 GPU, FP32: 367 img/s "
    "(measured at that repo's DGX1V FP32 batch of 112 per GPU, configs.yml; assumed unchanged at batch 64)"
)
COMMAND = "PYTHONPATH=src python scripts/make_zoo.py"

# Small inputs for the CPU pass that checks the forward order on real tensors.
CHECK_BATCH = 2
CHECK_SEQ_LEN = 16


@dataclass(frozen=True)
class ModelSpec:
    name: str
    package: str
    constructor: str
    build: Callable[[], nn.Module]
    batch_size: int
    image_size: int | None = None  # vision models: square input side
    seq_len: int | None = None  # language models: tokens per sample
    vocab_size: int = 0


def _torchvision(fn: str, **kwargs: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision

        model: nn.Module = getattr(torchvision.models, fn)(weights=None, **kwargs)
        return model

    return build


def _timm(fn: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm

        model: nn.Module = timm.create_model(fn, pretrained=False)
        return model

    return build


# Inception-BN (Ioffe and Szegedy 2015) as MXNet ships it, the model Prophet's experiments name
# ("inception-bn"): apache/mxnet example/image-classification/symbols/inception-bn.py, get_symbol() for
# 224x224 inputs. No package provides it for PyTorch, so it is ported here layer for layer: every
# ConvFactory is a convolution with bias, a BatchNorm (fix_gamma=False: gamma is trained) and a ReLU;
# pooling as in the symbol (MXNet's default "valid" rounding, i.e. floor, as PyTorch's default).
INCEPTION_BN_SOURCE = "apache/mxnet example/image-classification/symbols/inception-bn.py (get_symbol, 224x224)"


class _ConvFactory(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, pad: int = 0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride, pad, bias=True)
        self.bn = nn.BatchNorm2d(c_out, eps=1e-10 + 1e-5, momentum=0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class _InceptionA(nn.Module):
    def __init__(self, c_in: int, n1: int, n3r: int, n3: int, nd3r: int, nd3: int, pool: str, proj: int) -> None:
        super().__init__()
        self.c1x1 = _ConvFactory(c_in, n1, 1)
        self.c3x3_reduce = _ConvFactory(c_in, n3r, 1)
        self.c3x3 = _ConvFactory(n3r, n3, 3, pad=1)
        self.double_3x3_reduce = _ConvFactory(c_in, nd3r, 1)
        self.double_3x3_0 = _ConvFactory(nd3r, nd3, 3, pad=1)
        self.double_3x3_1 = _ConvFactory(nd3, nd3, 3, pad=1)
        self.pool: nn.Module = nn.AvgPool2d(3, 1, 1, count_include_pad=True) if pool == "avg" else nn.MaxPool2d(3, 1, 1)
        self.proj = _ConvFactory(c_in, proj, 1)
        self.out_channels = n1 + n3 + nd3 + proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.c1x1(x)
        b = self.c3x3(self.c3x3_reduce(x))
        c = self.double_3x3_1(self.double_3x3_0(self.double_3x3_reduce(x)))
        d = self.proj(self.pool(x))
        return torch.cat([a, b, c, d], 1)


class _InceptionB(nn.Module):
    def __init__(self, c_in: int, n3r: int, n3: int, nd3r: int, nd3: int) -> None:
        super().__init__()
        self.c3x3_reduce = _ConvFactory(c_in, n3r, 1)
        self.c3x3 = _ConvFactory(n3r, n3, 3, stride=2, pad=1)
        self.double_3x3_reduce = _ConvFactory(c_in, nd3r, 1)
        self.double_3x3_0 = _ConvFactory(nd3r, nd3, 3, pad=1)
        self.double_3x3_1 = _ConvFactory(nd3, nd3, 3, stride=2, pad=1)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.out_channels = n3 + nd3 + c_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.c3x3(self.c3x3_reduce(x))
        c = self.double_3x3_1(self.double_3x3_0(self.double_3x3_reduce(x)))
        return torch.cat([b, c, self.pool(x)], 1)


class InceptionBN(nn.Module):
    """MXNet's Inception-BN symbol for 224x224 inputs (INCEPTION_BN_SOURCE), module names after its layers."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv_1 = _ConvFactory(3, 64, 7, stride=2, pad=3)
        self.conv_2_red = _ConvFactory(64, 64, 1)
        self.conv_2 = _ConvFactory(64, 192, 3, pad=1)
        a_blocks = {  # InceptionFactoryA(num_1x1, num_3x3red, num_3x3, num_d3x3red, num_d3x3, pool, proj)
            "in3a": (64, 64, 64, 64, 96, "avg", 32),
            "in3b": (64, 64, 96, 64, 96, "avg", 64),
            "in4a": (224, 64, 96, 96, 128, "avg", 128),
            "in4b": (192, 96, 128, 96, 128, "avg", 128),
            "in4c": (160, 128, 160, 128, 160, "avg", 128),
            "in4d": (96, 128, 192, 160, 192, "avg", 128),
            "in5a": (352, 192, 320, 160, 224, "avg", 128),
            "in5b": (352, 192, 320, 192, 224, "max", 128),
        }
        b_blocks = {"in3c": (128, 160, 64, 96), "in4e": (128, 192, 192, 256)}  # (num_3x3red, num_3x3, ...)
        self.blocks = ["in3a", "in3b", "in3c", "in4a", "in4b", "in4c", "in4d", "in4e", "in5a", "in5b"]
        c = 192
        for name in self.blocks:
            block: _InceptionA | _InceptionB
            if name in a_blocks:
                n1, n3r, n3, nd3r, nd3, pool, proj = a_blocks[name]
                block = _InceptionA(c, int(n1), int(n3r), int(n3), int(nd3r), int(nd3), str(pool), int(proj))
            else:
                block = _InceptionB(c, *b_blocks[name])
            self.add_module(name, block)
            c = block.out_channels
        self.fc1 = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(self.conv_1(x), 3, 2)
        x = nn.functional.max_pool2d(self.conv_2(self.conv_2_red(x)), 3, 2)
        for name in self.blocks:
            x = getattr(self, name)(x)
        x = nn.functional.avg_pool2d(x, 7, 1)
        return self.fc1(torch.flatten(x, 1))


def _inception_bn() -> nn.Module:
    return InceptionBN()


# The Transformer of "Attention Is All You Need" (Vaswani et al. 2017), base size (table 3: N=6, d_model=512,
# d_ff=2048, h=8, dropout 0.1; "65 x 10^6" parameters), on its WMT 2014 English-German setting: one shared
# source-target vocabulary of about 37000 BPE tokens (section 5.1), the embedding shared by both inputs and the
# output projection (section 3.4). The layers are torch.nn.Transformer's (post-norm, as in the paper, with the
# final LayerNorm of the encoder and of the decoder that torch adds); positions are the paper's sinusoids (no
# parameters). HeteroG's artifact does not say which Transformer configuration it trained (research/heterog.md).
TRANSFORMER_BASE = {"d_model": 512, "nhead": 8, "num_encoder_layers": 6, "num_decoder_layers": 6,
                    "dim_feedforward": 2048, "dropout": 0.1}  # fmt: skip
TRANSFORMER_VOCAB = 37000
TRANSFORMER_SOURCE = "Vaswani et al. 2017, base model (table 3), shared 37000-token vocabulary (sections 3.4, 5.1)"


class TransformerBase(nn.Module):
    """Encoder-decoder Transformer base; one token tensor is the source and the (causally masked) target."""

    def __init__(self) -> None:
        super().__init__()
        d_model = TRANSFORMER_BASE["d_model"]
        self.embed = nn.Embedding(TRANSFORMER_VOCAB, d_model)
        self.transformer = nn.Transformer(**TRANSFORMER_BASE, batch_first=True)
        self.out = nn.Linear(d_model, TRANSFORMER_VOCAB, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq, d_model = input_ids.shape[1], self.embed.embedding_dim
        pos = torch.arange(seq, device=input_ids.device, dtype=torch.float32)[:, None]
        rate = torch.exp(torch.arange(0, d_model, 2, device=input_ids.device) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(seq, d_model, device=input_ids.device)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * rate), torch.cos(pos * rate)
        x = self.embed(input_ids) * math.sqrt(d_model) + pe
        mask = nn.Transformer.generate_square_subsequent_mask(seq, device=input_ids.device)
        return self.out(self.transformer(x, x, tgt_mask=mask, tgt_is_causal=True))


def _transformer_base() -> nn.Module:
    return TransformerBase()


BERT_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
BERT_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}
BERT_COMMON = {"vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2}
GPT2_SMALL = {"n_embd": 768, "n_layer": 12, "n_head": 12}
GPT2_MEDIUM = {"n_embd": 1024, "n_layer": 24, "n_head": 16}
GPT2_COMMON = {"vocab_size": 50257, "n_positions": 1024}


def _bert(values: dict[str, int]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from transformers import BertConfig, BertForPreTraining

        return BertForPreTraining(BertConfig(**BERT_COMMON, **values))

    return build


def _gpt2(values: dict[str, int]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from transformers import GPT2Config, GPT2LMHeadModel

        return GPT2LMHeadModel(GPT2Config(**GPT2_COMMON, **values))

    return build


def _kwargs(values: dict[str, int] | dict[str, int | float]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


SPECS: tuple[ModelSpec, ...] = (
    ModelSpec(
        "resnet18", "torchvision", "torchvision.models.resnet18(weights=None)", _torchvision("resnet18"), 64, 224
    ),
    ModelSpec(
        "resnet50", "torchvision", "torchvision.models.resnet50(weights=None)", _torchvision("resnet50"), 64, 224
    ),
    ModelSpec(
        "resnet152", "torchvision", "torchvision.models.resnet152(weights=None)", _torchvision("resnet152"), 32, 224
    ),
    ModelSpec("vgg16", "torchvision", "torchvision.models.vgg16(weights=None)", _torchvision("vgg16"), 64, 224),
    ModelSpec("vgg19", "torchvision", "torchvision.models.vgg19(weights=None)", _torchvision("vgg19"), 64, 224),
    ModelSpec(
        "densenet201",
        "torchvision",
        "torchvision.models.densenet201(weights=None)",
        _torchvision("densenet201"),
        32,
        224,
    ),
    ModelSpec(
        "inception_v3",
        "torchvision",
        "torchvision.models.inception_v3(weights=None, aux_logits=True, init_weights=True)",
        _torchvision("inception_v3", aux_logits=True, init_weights=True),
        64,
        299,
    ),
    ModelSpec(
        "inception_v4", "timm", "timm.create_model('inception_v4', pretrained=False)", _timm("inception_v4"), 64, 299
    ),
    ModelSpec(
        "inception_bn",
        "mxnet-symbol",
        f"scripts/make_zoo.py InceptionBN(), a port of {INCEPTION_BN_SOURCE}",
        _inception_bn,
        64,
        224,
    ),
    ModelSpec("resnet200", "timm", "timm.create_model('resnet200', pretrained=False)", _timm("resnet200"), 32, 224),
    ModelSpec(
        "mobilenet_v2",
        "torchvision",
        "torchvision.models.mobilenet_v2(weights=None)",
        _torchvision("mobilenet_v2"),
        64,
        224,
    ),
    ModelSpec(
        "transformer",
        "paper-port",
        f"scripts/make_zoo.py TransformerBase(): torch.nn.Transformer({_kwargs(TRANSFORMER_BASE)}) with a "
        f"shared {TRANSFORMER_VOCAB}-token embedding and tied output ({TRANSFORMER_SOURCE})",
        _transformer_base,
        32,
        seq_len=128,
        vocab_size=TRANSFORMER_VOCAB,
    ),
    ModelSpec(
        "bert_base",
        "transformers",
        f"transformers.BertForPreTraining(BertConfig({_kwargs(BERT_COMMON)}, {_kwargs(BERT_BASE)}))",
        _bert(BERT_BASE),
        64,
        seq_len=64,
        vocab_size=30522,
    ),
    ModelSpec(
        "bert_large",
        "transformers",
        f"transformers.BertForPreTraining(BertConfig({_kwargs(BERT_COMMON)}, {_kwargs(BERT_LARGE)}))",
        _bert(BERT_LARGE),
        32,
        seq_len=64,
        vocab_size=30522,
    ),
    ModelSpec(
        "gpt2",
        "transformers",
        f"transformers.GPT2LMHeadModel(GPT2Config({_kwargs(GPT2_COMMON)}, {_kwargs(GPT2_SMALL)}))",
        _gpt2(GPT2_SMALL),
        8,
        seq_len=1024,
        vocab_size=50257,
    ),
    ModelSpec(
        "gpt2_medium",
        "transformers",
        f"transformers.GPT2LMHeadModel(GPT2Config({_kwargs(GPT2_COMMON)}, {_kwargs(GPT2_MEDIUM)}))",
        _gpt2(GPT2_MEDIUM),
        8,
        seq_len=1024,
        vocab_size=50257,
    ),
)


def example_inputs(spec: ModelSpec, batch_size: int, seq_len: int | None, device: str) -> dict[str, torch.Tensor]:
    """Keyword arguments for one forward pass of ``spec``'s model."""
    if spec.image_size is not None:
        return {"x": torch.randn(batch_size, 3, spec.image_size, spec.image_size, device=device)}
    assert seq_len is not None
    ids = torch.randint(0, spec.vocab_size, (batch_size, seq_len), device=device)
    if spec.package == "transformers" and spec.name.startswith("bert"):
        return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids)}
    return {"input_ids": ids}


def run_forward(model: nn.Module, spec: ModelSpec, inputs: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        if spec.image_size is not None:
            model(inputs["x"])
        else:
            model(**inputs)


@dataclass
class LayerTrace:
    name: str
    tensors: list[tuple[str, tuple[int, ...]]]
    fwd_flops: int = 0


@dataclass
class ModelTrace:
    layers: list[LayerTrace]
    uncalled: list[str] = field(default_factory=list)
    total_flops: int = 0


def param_owners(model: nn.Module) -> dict[str, nn.Module]:
    """Modules that own at least one trainable parameter directly, by qualified name."""
    return {
        name: module
        for name, module in model.named_modules()
        if any(p.requires_grad for _, p in module.named_parameters(recurse=False))
    }


class _LayerFlopCounter(FlopCounterMode):
    """FlopCounterMode that also charges every counted operator to the current layer."""

    def __init__(self) -> None:
        super().__init__(display=False)
        self.current: str | None = None
        self.per_layer: defaultdict[str | None, int] = defaultdict(int)

    def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
        before = self.flop_counts["Global"][func_packet]
        result = super()._count_flops(func_packet, out, args, kwargs)
        self.per_layer[self.current] += self.flop_counts["Global"][func_packet] - before
        return result


def _called_ancestor(name: str, called: list[str]) -> str | None:
    """The nearest enclosing module of ``name`` that the forward called (None: none did)."""
    parts = name.split(".")
    for k in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:k]) in called:
            return ".".join(parts[:k])
    return None


def trace(model: nn.Module, spec: ModelSpec, inputs: dict[str, torch.Tensor]) -> ModelTrace:
    """Layers in forward order with their tensors and forward FLOPs (one forward pass)."""
    owners = param_owners(model)
    counter = _LayerFlopCounter()
    order: list[str] = []

    def make_hook(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            if name not in order:
                order.append(name)
            counter.current = name

        return hook

    handles = [module.register_forward_pre_hook(make_hook(name)) for name, module in owners.items()]
    model.train()  # auxiliary heads (inception_v3 AuxLogits) run only in training
    try:
        with counter:
            run_forward(model, spec, inputs)
    finally:
        for handle in handles:
            handle.remove()

    uncalled = [name for name in owners if name not in order]
    # A module whose parent uses its parameters without calling it (torch.nn.MultiheadAttention's out_proj on
    # the fused path) belongs to that parent's layer: its gradients are ready when the parent's backward ends.
    adopted = {name: parent for name in uncalled if (parent := _called_ancestor(name, order)) is not None}
    uncalled = [name for name in uncalled if name not in adopted]
    global_name = {id(p): n for n, p in model.named_parameters()}
    seen: set[int] = set()
    layers: list[LayerTrace] = []
    for name in order + uncalled:
        tensors = []
        members = [name, *(child for child, parent in adopted.items() if parent == name)]
        for _, p in (item for member in members for item in owners[member].named_parameters(recurse=False)):
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                tensors.append((global_name[id(p)], tuple(p.shape)))
        layers.append(LayerTrace(name, tensors, counter.per_layer.get(name, 0)))
    if layers:
        layers[0].fwd_flops += counter.per_layer.get(None, 0)  # operators before the first layer
    total = counter.get_total_flops()
    assert sum(layer.fwd_flops for layer in layers) == total, "per-layer FLOPs do not add up to the total"
    return ModelTrace(layers, uncalled, total)


def reference_tensors(model: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad]


def trace_model(spec: ModelSpec) -> tuple[ModelTrace, list[tuple[str, tuple[int, ...]]]]:
    """Trace on the meta device at full size; check the layer order on CPU with real tensors."""
    torch.manual_seed(0)
    cpu_model = spec.build()
    check = trace(cpu_model, spec, example_inputs(spec, CHECK_BATCH, CHECK_SEQ_LEN if spec.seq_len else None, "cpu"))
    ref = reference_tensors(cpu_model)
    del cpu_model

    with torch.device("meta"):
        meta_model = spec.build()
    full = trace(meta_model, spec, example_inputs(spec, spec.batch_size, spec.seq_len, "meta"))

    assert [(lt.name, lt.tensors) for lt in full.layers] == [(lt.name, lt.tensors) for lt in check.layers], (
        f"{spec.name}: the meta-device forward order differs from the CPU one"
    )
    assert reference_tensors(meta_model) == ref, f"{spec.name}: meta model parameters differ from the CPU model"
    traced = [t for lt in full.layers for t in lt.tensors]
    assert sorted(traced) == sorted(ref), f"{spec.name}: traced tensors differ from named_parameters()"
    num_params = sum(math.prod(s) for _, s in traced)
    expected = sum(p.numel() for p in meta_model.parameters())
    assert num_params == expected, f"{spec.name}: traced {num_params} parameters, model has {expected}"
    return full, ref


#: Batches at which the saved tensors are measured (BatchNorm in training needs two samples per channel).
ACTIVATION_BATCHES = (2, 4)


def activation_bytes_per_sample(spec: ModelSpec) -> int:
    """Bytes autograd keeps for backward per sample (fp32): what each sample of a batch adds to device memory.

    One forward in train mode on CPU with real tensors at each of :data:`ACTIVATION_BATCHES`, under
    ``torch.autograd.graph.saved_tensors_hooks``: every saved tensor's storage counted once, parameters left
    out; the per-sample value is the difference between the two batches over their difference, so what does
    not grow with the batch cancels. Not counted: the loss's own saved tensors, temporaries freed during the
    forward, the allocator's caching and fragmentation, framework workspaces.
    """
    torch.manual_seed(0)
    model = spec.build()
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def saved_bytes(batch: int) -> int:
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in params:
                storages[storage.data_ptr()] = storage.nbytes()
            return t

        inputs = example_inputs(spec, batch, spec.seq_len, "cpu")
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(inputs["x"]) if spec.image_size is not None else model(**inputs)
        return sum(storages.values())

    small, large = ACTIVATION_BATCHES
    return round((saved_bytes(large) - saved_bytes(small)) / (large - small))


def efficiency_from_anchor(anchor: ModelTrace) -> float:
    """Solve ANCHOR_MS = 3 * F / (PEAK * eff) * 1e3 + 2 * L * LAUNCH_FLOOR_MS for eff."""
    compute_ms = ANCHOR_MS - 2 * len(anchor.layers) * LAUNCH_FLOOR_MS
    return 3 * anchor.total_flops / (PEAK_FLOPS * compute_ms / 1e3)


def layer_ms(flops: int, efficiency: float) -> float:
    return round(flops / (PEAK_FLOPS * efficiency) * 1e3 + LAUNCH_FLOOR_MS, 6)


def build_workload(
    spec: ModelSpec,
    model_trace: ModelTrace,
    efficiency: float,
    versions: dict[str, str],
    date: str,
    activation_bytes: int | None = None,
) -> Workload:
    layers = tuple(
        Layer(
            name=lt.name,
            tensors=tuple(Tensor(name=n, numel=math.prod(s), shape=s) for n, s in lt.tensors),
            forward_ms=layer_ms(lt.fwd_flops, efficiency),
            backward_ms=layer_ms(2 * lt.fwd_flops, efficiency),
        )
        for lt in model_trace.layers
    )
    inputs = f"{spec.image_size}x{spec.image_size} images" if spec.image_size is not None else f"{spec.seq_len} tokens"
    method = (
        f"forward FLOPs per layer from torch.utils.flop_counter.FlopCounterMode (meta device, batch {spec.batch_size}, "
        f"{inputs} per sample, train mode); backward FLOPs = 2 x forward; "
        f"time_ms = flops / ({PEAK_FLOPS / 1e12:g} TFLOP/s x efficiency {efficiency:.4f}) x 1e3 "
        f"+ {LAUNCH_FLOOR_MS} ms per layer and pass"
    )
    notes = [
        f"Estimate, not a measurement. Efficiency {efficiency:.4f} is solved once so that {ANCHOR_MODEL} at batch "
        f"{ANCHOR_BATCH} takes {ANCHOR_MS:.1f} ms forward+backward ({ANCHOR_SOURCE}) and used for every model.",
        f"Reference: {spec.constructor} ({spec.package} {versions[spec.package]}), random weights.",
        "Layers: modules owning parameters directly, in forward order (pre-hooks, one forward pass in train mode). "
        "Operators of parameter-free modules are charged to the nearest layer before them.",
    ]
    tied = [lt.name for lt in model_trace.layers if not lt.tensors]
    if tied:
        notes.append(f"Layers whose parameters are tied to an earlier layer (kept with no tensors): {', '.join(tied)}.")
    if model_trace.uncalled:
        notes.append(f"Never called in the forward, appended at the end: {', '.join(model_trace.uncalled)}.")
    extra: dict[str, float | int | str] = {
        "fwd_gflops": round(model_trace.total_flops / 1e9, 3),
        "efficiency": round(efficiency, 6),
        "peak_tflops": PEAK_FLOPS / 1e12,
        "launch_floor_ms": LAUNCH_FLOOR_MS,
        "reference": spec.constructor,
    }
    if activation_bytes is not None:
        extra["activation_bytes_per_sample"] = activation_bytes
        notes.append(
            "activation_bytes_per_sample: bytes autograd saves for backward per sample in one train-mode forward on "
            f"CPU (batches {ACTIVATION_BATCHES[0]} and {ACTIVATION_BATCHES[1]}, parameters and the loss left out); "
            "see scripts/make_zoo.py activation_bytes_per_sample."
        )
    if spec.seq_len is not None:
        extra["seq_len"] = spec.seq_len
    if spec.image_size is not None:
        extra["image_size"] = spec.image_size
    return Workload(
        model=spec.name,
        batch_size=spec.batch_size,
        device=DEVICE,
        dtype="fp32",
        layers=layers,
        provenance=Provenance(
            kind="estimated",
            source=f"{DEVICE} (FLOP-based estimate)",
            method=method,
            torch_version=torch.__version__,
            date=date,
            command=COMMAND,
            notes=" ".join(notes),
        ),
        extra=extra,
    )


def _json_entry(key: str, value: Any) -> str:
    if isinstance(value, list):
        items = ",\n".join(f"    {json.dumps(item)}" for item in value)
        return f"   {json.dumps(key)}: [\n{items}\n   ]"
    return f"   {json.dumps(key)}: {json.dumps(value)}"


def reference_json(torch_version: str, references: dict[str, dict[str, Any]]) -> str:
    """The reference file, one tensor per line so that a diff shows which tensor changed."""
    models = ",\n".join(
        f"  {json.dumps(name)}: {{\n" + ",\n".join(_json_entry(k, v) for k, v in ref.items()) + "\n  }"
        for name, ref in references.items()
    )
    return f'{{\n "torch": {json.dumps(torch_version)},\n "models": {{\n{models}\n }}\n}}\n'


def check_flops_against_torchvision(spec: ModelSpec, model_trace: ModelTrace) -> None:
    """Forward FLOPs per sample must be twice the GMACs torchvision publishes in its weights metadata."""
    if spec.package != "torchvision":
        return
    from torchvision.models import get_model_weights

    published_gflops = 2 * next(iter(get_model_weights(spec.name))).meta["_ops"]
    counted = model_trace.total_flops / spec.batch_size / 1e9
    assert abs(counted / published_gflops - 1) < 0.02, f"{spec.name}: {counted:.3f} GFLOP vs {published_gflops:.3f}"


#: Models ported in this file: their "package" is the source they were ported from, at this version.
PORT_VERSIONS = {"mxnet-symbol": "apache/mxnet@59b402c", "paper-port": "arXiv:1706.03762v7"}


def package_version(package: str) -> str:
    return PORT_VERSIONS.get(package) or importlib.metadata.version(package)


def shipped_efficiency() -> float:
    """The efficiency the shipped profiles use (read from the anchor's profile when it is not re-traced)."""
    anchor = Workload.load(DATA_DIR / f"{ANCHOR_MODEL}.{DEVICE}.json")
    return float(anchor.extra["efficiency"])


def merge_references(torch_version: str, references: dict[str, Any], replace_all: bool) -> str:
    """The reference file with ``references`` written in; other models kept as recorded, in SPECS order."""
    if replace_all or not REFERENCE_PATH.exists():
        return reference_json(torch_version, references)
    recorded = json.loads(REFERENCE_PATH.read_text())
    models = {**recorded["models"], **references}
    order = [spec.name for spec in SPECS if spec.name in models] + [m for m in models if m not in SPEC_NAMES]
    return reference_json(recorded["torch"], {name: models[name] for name in order})


SPEC_NAMES = tuple(spec.name for spec in SPECS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--date", default=datetime.date.today().isoformat(), help="date written into provenance")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=SPEC_NAMES,
        metavar="MODEL",
        help="regenerate only these models; the others' files are kept, and unless the anchor "
        f"({ANCHOR_MODEL}) is among them the shipped efficiency is reused",
    )
    args = parser.parse_args(argv)

    specs = [spec for spec in SPECS if args.only is None or spec.name in args.only]
    versions = {pkg: package_version(pkg) for pkg in {"torch", *(spec.package for spec in specs)}}
    traces: dict[str, ModelTrace] = {}
    references: dict[str, Any] = {}
    for spec in specs:
        model_trace, ref = trace_model(spec)
        check_flops_against_torchvision(spec, model_trace)
        traces[spec.name] = model_trace
        forward_order = [n for lt in model_trace.layers for n, _ in lt.tensors]
        references[spec.name] = {
            "reference": f"{spec.package} {versions[spec.package]}: {spec.constructor}",
            "package": spec.package,
            "version": versions[spec.package],
            "constructor": spec.constructor,
            "num_params": sum(math.prod(s) for _, s in ref),
            "num_tensors": len(ref),
            "tensors": [[n, list(s)] for n, s in ref],
        }
        if args.only is not None:
            references[spec.name]["torch"] = versions["torch"]
        if forward_order != [n for n, _ in ref]:
            references[spec.name]["forward_order"] = forward_order
        print(f"traced {spec.name}: {len(model_trace.layers)} layers, {model_trace.total_flops / 1e9:.1f} GFLOP fwd")

    if ANCHOR_MODEL in traces:
        efficiency = efficiency_from_anchor(traces[ANCHOR_MODEL])
        print(f"efficiency = {efficiency:.4f} ({ANCHOR_MODEL} bs{ANCHOR_BATCH} anchored at {ANCHOR_MS:.2f} ms)")
    else:
        efficiency = shipped_efficiency()
        print(f"efficiency = {efficiency:.6f} (read from the shipped {ANCHOR_MODEL} profile)")

    DATA_DIR.mkdir(parents=True, exist_ok=True)
    REFERENCE_PATH.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in specs:
        activations = activation_bytes_per_sample(spec)
        workload = build_workload(spec, traces[spec.name], efficiency, versions, args.date, activations)
        workload.save(DATA_DIR / f"{spec.name}.{DEVICE}.json")
        rows.append(
            f"{spec.name:<12} {spec.batch_size:>5} {workload.num_params:>12,} {len(workload.tensors):>7} "
            f"{len(workload.layers):>6} {workload.forward_ms:>9.1f} {workload.backward_ms:>9.1f}"
        )
    REFERENCE_PATH.write_text(merge_references(versions["torch"], references, args.only is None))
    print(f"{'model':<12} {'batch':>5} {'params':>12} {'tensors':>7} {'layers':>6} {'fwd_ms':>9} {'bwd_ms':>9}")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
