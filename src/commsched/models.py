"""Small real models for benchmarks, examples and profiling, each with a synthetic batch.

Four models, all deterministic given a seed (weights and data):

``resnet5m``
    The anchor of the emulated-network measurements: a ResNet for 32×32
    inputs with ResNet-18's widths (64, 128, 256, 512), one basic block per
    stage except two in the first, and a 512-512-10 head: 5,239,882 fp32
    parameters (20.0 MiB of gradients), ~0.32 GMAC per image forward.
``cnn``
    The small CNN of ``examples/train.py`` (0.67 M parameters).
``transformer``
    The small GPT-style language model of ``examples/train.py`` (vocabulary
    2000, width 128, two layers, sequence 64, output tied to the embedding).
``gpt5m``
    The transformer-shaped counterpart of ``resnet5m`` for the emulated-network
    measurements: vocabulary 8192, width 256, four layers of four heads,
    sequence 64, output tied to the embedding: 5,273,088 parameters (20.1 MiB
    of gradients), about resnet5m's compute per sample at batch 8. Its largest
    tensor, the tied embedding (2.1 M), gets its gradient last: at the very end
    of backward, where a CNN's first layers are small.

Example::

    model = build_model("resnet5m", seed=0)
    x, y = synthetic_batch("resnet5m", batch_size=8, seed=0, rank=1, step=3)
    loss = model_loss(model(x), y)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MODELS", "ModelInfo", "build_model", "model_loss", "parameter_count", "synthetic_batch"]


class BasicBlock(nn.Module):
    """ResNet's two 3×3 convolutions with a (projected when the shape changes) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet5M(nn.Module):
    """ResNet-18 widths for 32×32 inputs, blocks (2, 1, 1, 1), a 512-512-classes head: 5.24 M parameters."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        self.layer1 = nn.Sequential(BasicBlock(64, 64), BasicBlock(64, 64))
        self.layer2 = BasicBlock(64, 128, stride=2)
        self.layer3 = BasicBlock(128, 256, stride=2)
        self.layer4 = BasicBlock(256, 512, stride=2)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layer4(self.layer3(self.layer2(self.layer1(self.stem(x)))))
        return self.head(F.adaptive_avg_pool2d(h, 1))


def small_cnn(num_classes: int = 10) -> nn.Module:
    """The small CNN of ``examples/train.py``."""

    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    return nn.Sequential(
        block(3, 32), block(32, 64), nn.MaxPool2d(2), block(64, 128), block(128, 128), nn.MaxPool2d(2),
        block(128, 256), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, num_classes),
    )  # fmt: skip


class SmallTransformer(nn.Module):
    """A GPT-style language model; the output projection is tied to the embedding."""

    def __init__(self, vocab: int = 2000, dim: int = 128, layers: int = 2, seq: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        layer = nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        return self.out(self.norm(self.blocks(h)))


Batch = tuple[torch.Tensor, torch.Tensor]


def _image_batch(batch_size: int, g: torch.Generator) -> Batch:
    return torch.randn(batch_size, 3, 32, 32, generator=g), torch.randint(0, 10, (batch_size,), generator=g)


def _token_batch(vocab: int) -> Callable[[int, torch.Generator], Batch]:
    def batch(batch_size: int, g: torch.Generator) -> Batch:
        tokens = torch.randint(0, vocab, (batch_size, 64), generator=g)
        return tokens, torch.roll(tokens, -1, dims=1)

    return batch


def gpt5m() -> nn.Module:
    return SmallTransformer(vocab=8192, dim=256, layers=4)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    description: str
    build: Callable[[], nn.Module]
    batch: Callable[[int, torch.Generator], Batch]


MODELS: dict[str, ModelInfo] = {
    info.name: info
    for info in (
        ModelInfo("resnet5m", "ResNet-18 widths, 32×32 inputs, 5.24 M parameters", ResNet5M, _image_batch),
        ModelInfo("cnn", "small CNN of examples/train.py, 32×32 inputs, 0.67 M parameters", small_cnn, _image_batch),
        ModelInfo(
            "transformer", "2-layer GPT-style LM, sequence 64, 0.66 M parameters", SmallTransformer, _token_batch(2000)
        ),
        ModelInfo(
            "gpt5m", "4-layer GPT-style LM, width 256, sequence 64, 5.27 M parameters", gpt5m, _token_batch(8192)
        ),
    )
}


def _info(name: str) -> ModelInfo:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"model: unknown model {name!r}; known: {', '.join(MODELS)}") from None


def build_model(name: str, seed: int = 0) -> nn.Module:
    """A freshly initialised model; the same ``seed`` gives the same weights in any process.

    The global RNG state is left as it was.
    """
    info = _info(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return info.build()


def synthetic_batch(name: str, batch_size: int, seed: int, rank: int, step: int) -> Batch:
    """Inputs and targets for ``rank`` at ``step``: a pure function of its arguments."""
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size!r}")
    g = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 4099 + rank) % 2**63)
    return _info(name).batch(batch_size, g)


def model_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for classifiers (``[B, C]``) and language models (``[B, T, V]``) alike."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def parameter_count(model: nn.Module) -> int:
    """Trainable parameters, each shared tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
