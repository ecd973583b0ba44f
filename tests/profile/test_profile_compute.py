"""``commsched.profile.profile_model`` on small CPU models: structure, ordering, timing invariants.

Timing assertions compare ratios with wide bounds: the machine may be shared,
so no test depends on how fast anything runs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from commsched.cluster import load_cluster
from commsched.errors import SpecError
from commsched.profile import iteration_check, measured_cluster, profile_model, zoo_filename
from commsched.sim import simulate
from commsched.workload import Workload


class Block(nn.Module):
    """torchvision's BasicBlock: in-place ReLU right after BatchNorm, in-place residual add."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout)) if cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.down is None else self.down(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class InPlaceNet(nn.Module):
    """A ResNet in miniature plus a DenseNet-style concatenation feeding an in-place ReLU.

    Every parameter is used once and no layer runs inside another, so the
    autograd engine finalises the gradients of later layers before any of an
    earlier one (see test_ready_order_is_reverse_forward_order_layer_by_layer).
    """

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(8)
        self.block1 = Block(8, 8)
        self.block2 = Block(8, 16)
        self.dense_bn = nn.BatchNorm2d(24)
        self.fc = nn.Linear(24, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.stem_bn(self.stem(x)), inplace=True)
        a = self.block1(h)
        b = self.block2(a)
        h = F.relu_(self.dense_bn(torch.cat([a, b], dim=1)))
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


class TrickyNet(nn.Module):
    """Registration order unlike forward order, a tied weight, attention, a frozen and an unused parameter."""

    def __init__(self, vocab: int = 50, dim: int = 16) -> None:
        super().__init__()
        self.head = nn.Linear(dim, vocab, bias=False)  # registered first, runs last, tied to embed
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)  # out_proj: used, never called
        self.embed = nn.Embedding(vocab, dim)
        self.head.weight = self.embed.weight
        self.frozen = nn.Linear(dim, dim)
        self.frozen.weight.requires_grad_(False)
        self.unused = nn.Linear(dim, dim)  # never runs: joins the root layer, gets no gradient
        self.scale = nn.Parameter(torch.ones(dim))  # owned by the root itself

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) * self.scale
        h = h + self.attn(h, h, h, need_weights=False)[0]
        return self.head(self.frozen(h))


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: on a shared, oversubscribed machine OpenMP barriers make 2-thread timings erratic."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _image_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)


def _profile(model: nn.Module, **kwargs: object) -> Workload:
    options: dict[str, object] = {"batch_size": 4, "model_name": "inplacenet", "warmup": 1, "repeats": 5}
    options.update(kwargs)
    return profile_model(model, _image_batch, F.cross_entropy, **options)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def inplace_profile() -> tuple[nn.Module, Workload]:
    torch.manual_seed(0)
    model = InPlaceNet()
    return model, _profile(model)


def test_every_trainable_tensor_appears_once_with_its_named_parameters_name_and_shape(
    inplace_profile: tuple[nn.Module, Workload],
) -> None:
    model, w = inplace_profile
    expected = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    found = [(t.name, t.shape) for t in w.tensors]
    assert sorted(found) == sorted(expected)
    assert len({name for name, _ in found}) == len(found)
    assert w.num_params == sum(p.numel() for p in model.parameters())


def test_layers_follow_forward_order_not_registration_order(inplace_profile: tuple[nn.Module, Workload]) -> None:
    _, w = inplace_profile
    names = [layer.name for layer in w.layers]
    # block2's shortcut (`down`) runs first in its block although registered last
    assert names.index("block2.down.0") < names.index("block2.conv1") < names.index("block2.conv2")
    assert names[0] == "stem" and names[-1] == "fc"
    assert names.index("block2.bn2") < names.index("dense_bn")


def test_ready_order_is_reverse_forward_order_layer_by_layer(inplace_profile: tuple[nn.Module, Workload]) -> None:
    """Exact, not within noise: every gradient of a later layer is final before any of an earlier layer.

    Guaranteed here because the autograd engine runs ready nodes in decreasing
    creation order and accumulates a gradient as soon as it is computed, every
    parameter is used once, and no layer runs inside another. Per-tensor medians
    keep the order: if a_i <= b_i in every repeat, median(a) <= median(b).
    """
    _, w = inplace_profile
    for earlier, later in itertools.combinations(w.layers, 2):
        assert earlier.grad_ready_ms is not None and later.grad_ready_ms is not None
        assert max(later.grad_ready_ms) <= min(earlier.grad_ready_ms), (earlier.name, later.name)


def test_times_are_positive_and_ready_times_lie_within_backward(inplace_profile: tuple[nn.Module, Workload]) -> None:
    _, w = inplace_profile
    for layer in w.layers:
        assert layer.forward_ms > 0 and layer.backward_ms > 0, layer.name
    assert max(w.grad_ready_ms) <= w.backward_ms + 1e-9
    assert min(w.grad_ready_ms) > 0
    assert w.provenance.kind == "measured" and w.provenance.torch_version == torch.__version__


def test_layer_times_partition_each_profiled_iteration_exactly() -> None:
    """Forward and backward are cut into per-layer segments, so one iteration's layer times sum to it."""
    torch.manual_seed(0)
    w = _profile(InPlaceNet(), warmup=0, repeats=1)
    check = iteration_check(w)
    assert math.isclose(check.layer_sum_ms, check.profiled_iteration_ms, rel_tol=1e-9)


def test_layer_sum_is_close_to_a_whole_iteration_without_hooks(inplace_profile: tuple[nn.Module, Workload]) -> None:
    """Generous on purpose: the two differ by the hooks' cost (a few µs per layer and tensor) and by noise.

    On a shared machine a time slice lost to another process is several ms,
    the size of this model's whole iteration, so only a factor 3 either way is
    safe; it still catches a lost or doubled forward or backward (the
    partition test above is the exact one).
    """
    _, w = inplace_profile
    check = iteration_check(w)
    assert 1 / 3 <= check.ratio <= 3, check


def test_in_place_model_trains_the_same_and_is_left_as_it_was() -> None:
    torch.manual_seed(0)
    model = InPlaceNet()
    x, y = _image_batch()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    F.cross_entropy(model(x), y).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.load_state_dict(before)
    _profile(model)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed by profiling"
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.equal(p.grad, grads[n]), f"{n}.grad changed by profiling"


def test_tied_attention_frozen_and_unused_parameters() -> None:
    torch.manual_seed(0)
    model = TrickyNet()

    def batch() -> tuple[torch.Tensor, None]:
        return torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0)), None

    w = profile_model(model, batch, batch_size=2, model_name="tricky", warmup=0, repeats=2)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert sorted(t.name for t in w.tensors) == sorted(trainable)
    assert "frozen.weight" not in {t.name for t in w.tensors}
    layers = {layer.name: layer for layer in w.layers}
    # root first (its forward runs first), holding its own parameter and the never-called module's
    assert w.layers[0].name == "TrickyNet"
    assert {t.name for t in w.layers[0].tensors} == {"scale", "unused.weight", "unused.bias"}
    # out_proj is used by the attention's forward without being called: it goes with the attention
    assert {t.name for t in layers["attn"].tensors} == {
        "attn.in_proj_weight",
        "attn.in_proj_bias",
        "attn.out_proj.weight",
        "attn.out_proj.bias",
    }
    # the tied weight belongs to the embedding, which runs first, under its named_parameters() name
    # (head registered it first); the head stays a layer without tensors, for its compute time
    assert [t.name for t in layers["embed"].tensors] == ["head.weight"]
    assert layers["head"].tensors == () and layers["head"].forward_ms > 0
    assert [layer.name for layer in w.layers].index("embed") < [layer.name for layer in w.layers].index("head")
    # parameters that got no gradient are ready when backward ends
    assert "2 parameter tensor(s) got no gradient" in w.provenance.notes
    root = w.layers[0]
    assert root.grad_ready_ms is not None
    unused = [r for t, r in zip(root.tensors, root.grad_ready_ms, strict=True) if t.name.startswith("unused")]
    assert all(math.isclose(r, max(w.grad_ready_ms)) for r in unused)


def test_bf16_autocast_profile_records_bf16_compute_and_fp32_gradients() -> None:
    torch.manual_seed(0)
    w = _profile(InPlaceNet(), dtype="bf16", repeats=2)
    assert w.dtype == "bf16"
    assert {t.dtype for t in w.tensors} == {"fp32"}
    assert "autocast(bf16)" in w.provenance.method
    assert zoo_filename(w) == "inplacenet.cpu.bf16.json"


def test_profile_round_trips_through_json_and_drives_the_simulator(inplace_profile: tuple[nn.Module, Workload]) -> None:
    _, w = inplace_profile
    assert Workload.from_json(w.to_json()) == w
    assert zoo_filename(w) == "inplacenet.cpu.json"
    cluster = measured_cluster(50e-6, 1e-9, 4)
    for policy in ("ddp", "dear"):
        result = simulate(w, cluster, policy, iterations=3, warmup=1)
        assert result.iteration_ms >= w.forward_ms + w.backward_ms - 1e-6
    assert simulate(w, load_cluster("8xV100-10GbE"), "wfbp", iterations=2, warmup=0).iteration_ms > 0


def test_bad_arguments_raise_spec_errors() -> None:
    model = InPlaceNet()
    with pytest.raises(SpecError, match="dtype"):
        _profile(model, dtype="fp8")
    with pytest.raises(SpecError, match="repeats"):
        _profile(model, repeats=0)
    with pytest.raises(SpecError, match="no trainable parameters"):
        _profile(nn.Sequential(nn.ReLU()))
