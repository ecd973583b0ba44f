"""The built-in model zoo: shipped workloads match their reference implementations."""

from __future__ import annotations

import json
import math
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from commsched import zoo
from commsched.cli.zoo import command as zoo_command
from commsched.errors import SpecError
from commsched.workload import Workload

REFERENCE_PATH = Path(__file__).parent / "data" / "zoo_reference.json"

MODELS = (
    "resnet18",
    "resnet50",
    "resnet152",
    "resnet200",
    "vgg16",
    "vgg19",
    "densenet201",
    "inception_v3",
    "inception_v4",
    "inception_bn",
    "mobilenet_v2",
    "transformer",
    "bert_base",
    "bert_large",
    "gpt2",
    "gpt2_medium",
)

# Total trainable parameters, tied weights counted once. Sources:
# - torchvision models: the ``num_params`` that torchvision publishes in each model's weights metadata
#   (e.g. ``ResNet50_Weights.IMAGENET1K_V1.meta["num_params"]``, listed on the model pages of
#   https://pytorch.org/vision/stable/models.html); inception_v3's count includes the AuxLogits head.
# - the rest: the reference run recorded in tests/data/zoo_reference.json (scripts/make_zoo.py, torch 2.14.1):
#   inception_v4 with timm 1.0.31 ``timm.create_model("inception_v4")`` (timm's tables round it to 42.7M);
#   BertForPreTraining with transformers 5.23.0 and the BERT paper's base / large sizes (Devlin et al. 2019,
#   section 3: L=12, H=768, A=12, "110M" / L=24, H=1024, A=16, "340M"), decoder tied to the word embeddings;
#   inception_bn: scripts/make_zoo.py's port of MXNet's Inception-BN symbol (apache/mxnet
#   example/image-classification/symbols/inception-bn.py, 224x224), recorded with torch 2.13.0; 69 conv+BN+ReLU
#   units (conv with bias, BN gamma and beta trained) and fc1, so 69 x 4 + 2 = 278 tensors;
#   resnet200: timm 1.0.31 ``timm.create_model("resnet200")`` (He et al. 2016's 200-layer bottleneck ResNet,
#   blocks 3, 24, 36, 3); mobilenet_v2: torchvision publishes 3,504,872 (MobileNet_V2_Weights.IMAGENET1K_V1);
#   transformer: scripts/make_zoo.py's TransformerBase (torch.nn.Transformer at the base sizes of Vaswani et al.
#   2017, table 3, with a shared 37000-token embedding tied to the output): 6 x 3,152,384 encoder and
#   6 x 4,204,032 decoder parameters, two final LayerNorms (2 x 1,024) and 37000 x 512 embedding = 63,084,544
#   (the paper's table rounds its base model to 65 x 10^6);
#   GPT2LMHeadModel with transformers 5.23.0 and GPT-2's small / medium sizes (Radford et al. 2019, table 2:
#   12 x 768 / 24 x 1024), lm_head tied to wte; OpenAI's released checkpoints are named 124M and 355M.
PUBLISHED_NUM_PARAMS = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "resnet152": 60_192_808,
    "resnet200": 64_673_832,
    "vgg16": 138_357_544,
    "vgg19": 143_667_240,
    "densenet201": 20_013_928,
    "inception_v3": 27_161_264,
    "inception_v4": 42_679_816,
    "inception_bn": 11_295_240,
    "mobilenet_v2": 3_504_872,
    "transformer": 63_084_544,
    "bert_base": 110_106_428,
    "bert_large": 336_226_108,
    "gpt2": 124_439_808,
    "gpt2_medium": 354_823_168,
}

# The anchor of the V100 estimates: resnet50 at batch 64 trains at NVIDIA's published 367 img/s
# (DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, 1x V100 16GB, FP32).
ANCHOR_MS = 64 / 367 * 1e3


@cache
def _reference() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(REFERENCE_PATH.read_text())["models"]
    return data


def test_zoo_lists_exactly_the_recorded_models() -> None:
    assert sorted(zoo.list_models()) == sorted(MODELS)
    assert sorted(_reference()) == sorted(MODELS)
    assert zoo.list_models().index("resnet18") < zoo.list_models().index("resnet152")


@pytest.mark.parametrize("name", MODELS)
def test_tensors_match_the_reference_names_shapes_and_order(name: str) -> None:
    ref = _reference()[name]
    workload = zoo.load(name)
    shipped = [(t.name, list(t.shape or ())) for t in workload.tensors]
    recorded = [(n, shape) for n, shape in ref["tensors"]]
    # The workload lists tensors in forward order. Where that differs from the order of
    # named_parameters() (BERT: BertEmbeddings.forward adds the token-type embedding before the
    # position embedding), the reference records the forward order beside it.
    order = ref.get("forward_order", [n for n, _ in recorded])
    assert sorted(order) == sorted(n for n, _ in recorded)
    shapes = dict(recorded)
    assert shipped == [(n, shapes[n]) for n in order]
    assert len(workload.tensors) == ref["num_tensors"] == len(recorded)
    assert workload.num_params == ref["num_params"] == sum(math.prod(s) for _, s in recorded)
    assert all(t.numel == math.prod(t.shape or ()) and t.dtype == "fp32" for t in workload.tensors)


@pytest.mark.parametrize("name", MODELS)
def test_total_parameters_equal_the_published_count(name: str) -> None:
    assert zoo.load(name).num_params == PUBLISHED_NUM_PARAMS[name]


def test_only_bert_and_the_transformer_differ_from_registration_order() -> None:
    differ = sorted(m for m, ref in _reference().items() if "forward_order" in ref)
    assert differ == ["bert_base", "bert_large", "transformer"]
    # torch.nn.TransformerEncoderLayer registers linear1, linear2 before norm1, and runs norm1 first (post-norm);
    # the attention's out_proj is used by its MultiheadAttention without being called: it joins that layer
    layer0 = [n for n in _reference()["transformer"]["forward_order"] if ".encoder.layers.0." in n]
    assert [n.split("layers.0.")[1] for n in layer0][2:7] == [
        "self_attn.out_proj.weight", "self_attn.out_proj.bias", "norm1.weight", "norm1.bias", "linear1.weight",
    ]  # fmt: skip
    attention = next(layer for layer in zoo.load("transformer").layers if layer.name.endswith("layers.0.self_attn"))
    assert [t.name.rsplit(".", 2)[-2] for t in attention.tensors] == ["self_attn", "self_attn", "out_proj", "out_proj"]
    order = _reference()["bert_base"]["forward_order"]
    assert order[:3] == [
        "bert.embeddings.word_embeddings.weight",
        "bert.embeddings.token_type_embeddings.weight",
        "bert.embeddings.position_embeddings.weight",
    ]


@pytest.mark.parametrize(
    ("name", "owner", "tied_layer", "vocab"),
    [
        ("gpt2", "transformer.wte", "lm_head", 50257),
        ("gpt2_medium", "transformer.wte", "lm_head", 50257),
        ("bert_base", "bert.embeddings.word_embeddings", "cls.predictions.decoder", 30522),
        ("bert_large", "bert.embeddings.word_embeddings", "cls.predictions.decoder", 30522),
        ("transformer", "embed", "out", 37000),
    ],
)
def test_tied_weights_are_counted_once(name: str, owner: str, tied_layer: str, vocab: int) -> None:
    workload = zoo.load(name)
    layers = {layer.name: layer for layer in workload.layers}
    names = [t.name for t in workload.tensors]
    assert f"{owner}.weight" in names
    assert not any(n.startswith(f"{tied_layer}.") for n in names)
    # the tied layer stays in the profile for its compute (a vocab-sized matmul), with no tensors of its own
    tied = layers[tied_layer]
    assert tied.tensors == ()
    assert tied.forward_ms > max(layer.forward_ms for layer in workload.layers if layer.name != tied_layer) / 10
    embedding = layers[owner].tensors[0]
    assert embedding.shape is not None and embedding.shape[0] == vocab
    if name.startswith("bert"):
        # the decoder's bias is cls.predictions.bias, owned by its parent head
        assert [t.name for t in layers["cls.predictions"].tensors] == ["cls.predictions.bias"]


def test_inception_v3_includes_the_aux_head_where_it_runs() -> None:
    names = [layer.name for layer in zoo.load("inception_v3").layers]
    aux = [i for i, n in enumerate(names) if n.startswith("AuxLogits.")]
    assert aux, "AuxLogits missing"
    last_6e = max(i for i, n in enumerate(names) if n.startswith("Mixed_6e."))
    first_7a = min(i for i, n in enumerate(names) if n.startswith("Mixed_7a."))
    assert last_6e < min(aux) and max(aux) < first_7a
    assert aux == list(range(min(aux), max(aux) + 1))


@pytest.mark.parametrize("name", MODELS)
def test_times_are_positive_estimates(name: str) -> None:
    workload = zoo.load(name)
    assert workload.device == "V100"
    assert workload.provenance.kind == "estimated"
    assert workload.provenance.source == "V100 (FLOP-based estimate)"
    assert "FlopCounterMode" in workload.provenance.method
    assert "367 img/s" in workload.provenance.notes
    for layer in workload.layers:
        assert layer.forward_ms > 0 and layer.backward_ms > 0
        assert layer.grad_ready_ms is None
    # backward FLOPs are twice the forward ones, on top of the same per-layer launch floor
    floor = float(workload.extra["launch_floor_ms"])
    for layer in workload.layers:
        assert layer.backward_ms - floor == pytest.approx(2 * (layer.forward_ms - floor), rel=1e-4, abs=1e-5)


def test_all_models_use_one_efficiency() -> None:
    assert len({zoo.load(name).extra["efficiency"] for name in MODELS}) == 1


def test_resnet50_forward_plus_backward_hits_the_anchor() -> None:
    workload = zoo.load("resnet50")
    assert workload.batch_size == 64
    assert workload.forward_ms + workload.backward_ms == pytest.approx(ANCHOR_MS, rel=1e-3)


def test_paper_batch_sizes() -> None:
    expected = {
        "resnet18": 64,
        "resnet50": 64,
        "resnet152": 32,
        "resnet200": 32,
        "vgg16": 64,
        "vgg19": 64,
        "densenet201": 32,
        "inception_v3": 64,
        "inception_v4": 64,
        "inception_bn": 64,
        "mobilenet_v2": 64,
        "transformer": 32,
        "bert_base": 64,
        "bert_large": 32,
        "gpt2": 8,
        "gpt2_medium": 8,
    }
    assert {name: zoo.load(name).batch_size for name in MODELS} == expected


def test_bigger_models_take_longer() -> None:
    def iteration_ms(name: str) -> float:
        w = zoo.load(name)
        return (w.forward_ms + w.backward_ms) / w.batch_size

    assert iteration_ms("resnet18") < iteration_ms("resnet50") < iteration_ms("resnet152")
    assert iteration_ms("vgg16") < iteration_ms("vgg19")
    assert iteration_ms("bert_base") < iteration_ms("bert_large")
    assert iteration_ms("gpt2") < iteration_ms("gpt2_medium")


def test_unknown_model_error_names_it_and_lists_the_known_ones() -> None:
    with pytest.raises(SpecError) as info:
        zoo.load("resnet51")
    message = str(info.value)
    assert "'resnet51'" in message
    for name in MODELS:
        assert name in message


def test_unknown_device_error_lists_the_available_profiles() -> None:
    with pytest.raises(SpecError, match=r"'H100'.*available: V100"):
        zoo.load("resnet50", device="H100")


def test_names_are_case_insensitive_and_accept_dashes() -> None:
    assert zoo.load("GPT2-Medium") is zoo.load("gpt2_medium")
    assert zoo.available_devices("ResNet50") == ["V100"]
    assert zoo.load("resnet50", device="V100").device == "V100"


def test_shipped_files_round_trip() -> None:
    workload = zoo.load("vgg16")
    assert Workload.from_json(workload.to_json()) == workload


def test_module_docstring_table_matches_the_shipped_data() -> None:
    doc = zoo.__doc__ or ""
    rows = re.findall(r"^(\w+)[^\n]*?\s+(\d+)\s+([\d,]+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)$", doc, re.MULTILINE)
    assert sorted(r[0] for r in rows) == sorted(MODELS)
    for name, batch, params, tensors, layers, fwd, bwd in rows:
        w = zoo.load(name)
        assert (int(batch), int(params.replace(",", "")), int(tensors), int(layers)) == (
            w.batch_size,
            w.num_params,
            len(w.tensors),
            len(w.layers),
        )
        assert (float(fwd), float(bwd)) == (round(w.forward_ms, 1), round(w.backward_ms, 1))


def test_cli_show_json_parses_with_integer_num_params() -> None:
    result = CliRunner().invoke(zoo_command, ["show", "resnet50", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert isinstance(data["num_params"], int) and data["num_params"] == 25_557_032
    data.pop("num_params")
    assert Workload.from_dict(data) == zoo.load("resnet50")


def test_cli_show_summary_and_list() -> None:
    runner = CliRunner()
    shown = runner.invoke(zoo_command, ["show", "gpt2", "--device", "V100"])
    assert shown.exit_code == 0, shown.output
    assert "124,439,808" in shown.output and "estimated" in shown.output
    listed = runner.invoke(zoo_command, ["list"])
    assert listed.exit_code == 0, listed.output
    for name in MODELS:
        assert name in listed.output


def test_cli_unknown_model_fails_with_the_known_names() -> None:
    result = CliRunner().invoke(zoo_command, ["show", "resnet51"])
    assert result.exit_code == 1
    assert "'resnet51'" in result.output and "resnet152" in result.output


@pytest.mark.parametrize("args", [["--help"], ["list", "--help"], ["show", "--help"]])
def test_cli_help(args: list[str]) -> None:
    result = CliRunner().invoke(zoo_command, args)
    assert result.exit_code == 0
    assert "Usage:" in result.output


def test_inception_bn_follows_the_mxnet_symbol() -> None:
    # 3 stem units, 8 InceptionFactoryA blocks of 7 units, 2 InceptionFactoryB blocks of 5 units: 69 units of
    # conv (weight, bias) + BatchNorm (gamma, beta), then fc1; the first Inception block gives 64+64+96+32 = 256
    # channels and the last 352+320+224+128 = 1024, fc1's input.
    workload = zoo.load("inception_bn")
    names = [t.name for t in workload.tensors]
    assert len(names) == 69 * 4 + 2
    assert names[:4] == ["conv_1.conv.weight", "conv_1.conv.bias", "conv_1.bn.weight", "conv_1.bn.bias"]
    shapes = {t.name: t.shape for t in workload.tensors}
    assert shapes["in3b.c1x1.conv.weight"] == (64, 256, 1, 1)
    assert shapes["fc1.weight"] == (1000, 1024)
    assert [layer.name for layer in workload.layers][-1] == "fc1"
