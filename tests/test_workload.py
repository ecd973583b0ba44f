"""Workload specs: validation messages, derived ready times, scaling, JSON round-trip."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.errors import SpecError
from commsched.workload import SCHEMA_VERSION, Layer, Provenance, Tensor, Workload


def valid_spec() -> dict[str, Any]:
    """Three layers in forward order; the middle one has no parameters."""
    return {
        "model": "tiny",
        "batch_size": 32,
        "device": "V100",
        "layers": [
            {
                "name": "conv",
                "tensors": [
                    {"name": "conv.weight", "numel": 6, "shape": [2, 3]},
                    {"name": "conv.bias", "numel": 2},
                ],
                "forward_ms": 1.0,
                "backward_ms": 2.0,
            },
            {"name": "relu", "forward_ms": 0.5, "backward_ms": 0.5},
            {
                "name": "fc",
                "tensors": [{"name": "fc.weight", "numel": 10, "dtype": "fp16"}],
                "forward_ms": 3.0,
                "backward_ms": 4.0,
            },
        ],
        "provenance": {"kind": "measured", "source": "V100 CUDA events"},
    }


def problems(data: object) -> list[str]:
    with pytest.raises(SpecError) as info:
        Workload.from_dict(data)
    return info.value.problems


def with_value(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    data = valid_spec()
    target: Any = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


def without(path: tuple[Any, ...]) -> dict[str, Any]:
    data = valid_spec()
    target: Any = data
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return data


# ---- validation: every field, bad values, exact messages ----

BAD_VALUES = [
    # Workload
    (("schema_version",), 2, "schema_version: unsupported schema version 2 (this commsched reads 1)"),
    (("schema_version",), "one", "schema_version: must be an integer, got 'one'"),
    (("model",), "", "model: must not be empty, got ''"),
    (("model",), 7, "model: must be a string, got 7"),
    (("batch_size",), 0, "batch_size: must be > 0, got 0"),
    (("batch_size",), -32, "batch_size: must be > 0, got -32"),
    (("batch_size",), 2.5, "batch_size: must be a whole number, got 2.5"),
    (("batch_size",), "big", "batch_size: must be an integer, got 'big'"),
    (("device",), "", "device: must not be empty, got ''"),
    (("dtype",), "int8", "dtype: must be one of 'fp32', 'fp16', 'bf16', 'fp64' or 'int64', got 'int8'"),
    (("layers",), "conv", "layers: must be a list, got 'conv'"),
    (("layers",), [], "<root>: the workload has no parameter tensors"),
    (("extra",), [1], "extra: must be a mapping, got [1]"),
    (("extra",), {"lr": math.nan}, "extra: extra['lr'] must be a finite number, got nan"),
    (("extra",), {"lr": math.inf}, "extra: extra['lr'] must be a finite number, got inf"),
    (("bogus",), 1, "bogus: is not a known field, got 1"),
    # Layer
    (("layers", 0, "name"), "", "layers[0].name: must not be empty, got ''"),
    (("layers", 0, "tensors"), "w", "layers[0].tensors: must be a list, got 'w'"),
    (("layers", 0, "forward_ms"), -1, "layers[0].forward_ms: must be >= 0, got -1"),
    (("layers", 0, "forward_ms"), math.nan, "layers[0].forward_ms: must be a finite number, got nan"),
    (("layers", 0, "forward_ms"), math.inf, "layers[0].forward_ms: must be a finite number, got inf"),
    (("layers", 0, "forward_ms"), "fast", "layers[0].forward_ms: must be a number, got 'fast'"),
    (("layers", 2, "backward_ms"), -0.5, "layers[2].backward_ms: must be >= 0, got -0.5"),
    (("layers", 2, "backward_ms"), None, "layers[2].backward_ms: must be a number, got None"),
    (
        ("layers", 0, "grad_ready_ms"),
        [1.0],
        "layers[0]: grad_ready_ms has 1 entries but the layer has 2 tensors",
    ),
    (
        ("layers", 0, "grad_ready_ms"),
        [1.0, 2.0, 3.0],
        "layers[0]: grad_ready_ms has 3 entries but the layer has 2 tensors",
    ),
    (
        ("layers", 0, "grad_ready_ms"),
        [1.0, -2.0],
        "layers[0].grad_ready_ms: grad_ready_ms[1] must be a finite number >= 0, got -2.0",
    ),
    (
        ("layers", 0, "grad_ready_ms"),
        [math.nan, 1.0],
        "layers[0].grad_ready_ms: grad_ready_ms[0] must be a finite number >= 0, got nan",
    ),
    (("layers", 0, "grad_ready_ms"), 3.0, "layers[0].grad_ready_ms: must be a list, got 3.0"),
    (("layers", 1, "flops"), 10, "layers[1].flops: is not a known field, got 10"),
    # Tensor
    (("layers", 0, "tensors", 1, "name"), "", "layers[0].tensors[1].name: must not be empty, got ''"),
    (("layers", 0, "tensors", 1, "numel"), -5, "layers[0].tensors[1].numel: must be > 0, got -5"),
    (("layers", 0, "tensors", 1, "numel"), 0, "layers[0].tensors[1].numel: must be > 0, got 0"),
    (("layers", 0, "tensors", 1, "numel"), 2.5, "layers[0].tensors[1].numel: must be a whole number, got 2.5"),
    (("layers", 0, "tensors", 1, "numel"), "two", "layers[0].tensors[1].numel: must be an integer, got 'two'"),
    (("layers", 0, "tensors", 1, "numel"), None, "layers[0].tensors[1].numel: must be an integer, got None"),
    (
        ("layers", 2, "tensors", 0, "dtype"),
        "fp8",
        "layers[2].tensors[0].dtype: must be one of 'fp32', 'fp16', 'bf16', 'fp64' or 'int64', got 'fp8'",
    ),
    (("layers", 0, "tensors", 0, "numel"), 5, "layers[0].tensors[0]: shape [2, 3] has 6 elements but numel is 5"),
    (
        ("layers", 0, "tensors", 0, "shape"),
        [6, 0],
        "layers[0].tensors[0]: shape must have positive dimensions, got [6, 0]",
    ),
    (
        ("layers", 0, "tensors", 0, "shape"),
        [-2, -3],
        "layers[0].tensors[0]: shape must have positive dimensions, got [-2, -3]",
    ),
    (("layers", 0, "tensors", 0, "shape"), "2x3", "layers[0].tensors[0].shape: must be a list, got '2x3'"),
    (("layers", 0, "tensors", 0, "grad"), 1, "layers[0].tensors[0].grad: is not a known field, got 1"),
    # Provenance
    (("provenance",), "measured", "provenance: must be a mapping, got 'measured'"),
    (
        ("provenance", "kind"),
        "guessed",
        "provenance.kind: must be one of 'measured' or 'estimated', got 'guessed'",
    ),
    (("provenance", "source"), "", "provenance.source: must not be empty, got ''"),
    (("provenance", "notes"), 3, "provenance.notes: must be a string, got 3"),
    (("provenance", "gpu"), "V100", "provenance.gpu: is not a known field, got 'V100'"),
]


@pytest.mark.parametrize(("path", "value", "expected"), BAD_VALUES, ids=[e for _, _, e in BAD_VALUES])
def test_bad_field_value_is_reported_with_path_and_value(path: tuple[Any, ...], value: Any, expected: str) -> None:
    assert problems(with_value(path, value)) == [expected]


MISSING = [
    (("model",), "model: is required"),
    (("batch_size",), "batch_size: is required"),
    (("device",), "device: is required"),
    (("layers",), "layers: is required"),
    (("provenance",), "provenance: is required"),
    (("layers", 0, "name"), "layers[0].name: is required"),
    (("layers", 0, "forward_ms"), "layers[0].forward_ms: is required"),
    (("layers", 0, "backward_ms"), "layers[0].backward_ms: is required"),
    (("layers", 0, "tensors", 0, "name"), "layers[0].tensors[0].name: is required"),
    (("layers", 0, "tensors", 0, "numel"), "layers[0].tensors[0].numel: is required"),
    (("provenance", "kind"), "provenance.kind: is required"),
    (("provenance", "source"), "provenance.source: is required"),
]


@pytest.mark.parametrize(("path", "expected"), MISSING, ids=[e for _, e in MISSING])
def test_missing_field_is_reported(path: tuple[Any, ...], expected: str) -> None:
    assert problems(without(path)) == [expected]


def test_duplicate_tensor_names_are_rejected_across_layers() -> None:
    data = with_value(("layers", 2, "tensors", 0, "name"), "conv.bias")
    assert problems(data) == ["<root>: layers[2].tensors[0].name 'conv.bias' appears twice"]


def test_duplicate_layer_names_name_both_layers() -> None:
    data = with_value(("layers", 2, "name"), "conv")
    assert problems(data) == ["layers: name 'conv' is used by layers[0] and layers[2]"]


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("batch_size",), "16", "batch_size: must be an integer, got '16'"),
        (("batch_size",), 16.0, "batch_size: must be an integer, got 16.0"),
        (("batch_size",), True, "batch_size: must be an integer, got True"),
        (("layers", 0, "forward_ms"), "1.5", "layers[0].forward_ms: must be a number, got '1.5'"),
        (("layers", 0, "tensors", 0, "numel"), "6", "layers[0].tensors[0].numel: must be an integer, got '6'"),
        (("layers", 0, "tensors", 0, "shape"), ["2", 3], "layers[0].tensors[0].shape[0]: must be an integer, got '2'"),
    ],
)
def test_a_string_or_bool_where_a_number_belongs_is_refused_not_converted(
    path: tuple[Any, ...], value: Any, expected: str
) -> None:
    assert problems(with_value(path, value)) == [expected]


def test_whole_floats_for_float_fields_and_lists_for_tuples_still_load() -> None:
    data = with_value(("layers", 0, "forward_ms"), 1)
    workload = Workload.from_dict(data)
    assert workload.layers[0].forward_ms == 1.0 and workload.layers[0].tensors[0].shape == (2, 3)


def test_workload_without_parameters_is_rejected() -> None:
    data = valid_spec()
    data["layers"] = [data["layers"][1]]
    assert problems(data) == ["<root>: the workload has no parameter tensors"]


def test_every_problem_is_reported_at_once() -> None:
    data = with_value(("batch_size",), 0)
    data["layers"][0]["tensors"][1]["numel"] = -5
    data["layers"][2]["forward_ms"] = -1
    assert problems(data) == [
        "batch_size: must be > 0, got 0",
        "layers[0].tensors[1].numel: must be > 0, got -5",
        "layers[2].forward_ms: must be >= 0, got -1",
    ]


def test_non_mapping_document_is_rejected() -> None:
    (line,) = problems([1, 2])
    assert line.startswith("<root>: ")


def test_spec_error_message_names_the_source() -> None:
    with pytest.raises(SpecError, match=r"^invalid resnet.json:\n  batch_size: must be > 0, got 0$"):
        Workload.from_dict(with_value(("batch_size",), 0), source="resnet.json")


def test_current_schema_version_is_accepted_and_written() -> None:
    workload = Workload.from_dict(with_value(("schema_version",), SCHEMA_VERSION))
    assert json.loads(workload.to_json())["schema_version"] == SCHEMA_VERSION


# ---- derived quantities ----


def test_tensors_are_listed_in_forward_order_with_their_layer() -> None:
    workload = Workload.from_dict(valid_spec())
    assert [t.name for t in workload.tensors] == ["conv.weight", "conv.bias", "fc.weight"]
    assert workload.tensor_layer == (0, 0, 2)


def test_sizes_and_compute_totals() -> None:
    workload = Workload.from_dict(valid_spec())
    assert workload.num_params == 18
    assert workload.total_bytes == 6 * 4 + 2 * 4 + 10 * 2
    assert workload.layers[0].numel == 8 and workload.layers[0].bytes == 32
    assert workload.forward_ms == 4.5
    assert workload.backward_ms == 6.5


def test_derived_grad_ready_is_the_reverse_cumulative_backward_time() -> None:
    # backward runs fc (4 ms), relu (0.5 ms), conv (2 ms): fc ends at 4, conv at 6.5
    workload = Workload.from_dict(valid_spec())
    assert workload.grad_ready_ms == (6.5, 6.5, 4.0)


def test_measured_grad_ready_overrides_the_derived_one_for_its_layer() -> None:
    workload = Workload.from_dict(with_value(("layers", 0, "grad_ready_ms"), [5.0, 4.75]))
    assert workload.grad_ready_ms == (5.0, 4.75, 4.0)


def test_scaled_divides_every_compute_time_by_the_factor() -> None:
    workload = Workload.from_dict(with_value(("layers", 0, "grad_ready_ms"), [5.0, 4.0]))
    fast = workload.scaled(2.0, device="A100")
    assert fast.device == "A100"
    assert fast.forward_ms == workload.forward_ms / 2
    assert fast.backward_ms == workload.backward_ms / 2
    assert fast.grad_ready_ms == (2.5, 2.0, 2.0)
    assert fast.tensors == workload.tensors
    assert workload.scaled(0.5).device == "V100"
    assert workload.scaled(0.5).backward_ms == 13.0


def test_scaled_does_not_reuse_cached_ready_times() -> None:
    workload = Workload.from_dict(valid_spec())
    assert workload.grad_ready_ms == (6.5, 6.5, 4.0)  # computes and caches
    assert workload.scaled(2.0).grad_ready_ms == (3.25, 3.25, 2.0)


@pytest.mark.parametrize("factor", [0.0, -1.0, math.nan, math.inf])
def test_scaled_rejects_a_non_positive_or_non_finite_factor(factor: float) -> None:
    workload = Workload.from_dict(valid_spec())
    with pytest.raises(SpecError) as info:
        workload.scaled(factor)
    assert info.value.problems == [f"compute_factor: must be > 0, got {factor!r}"]


def test_models_are_frozen() -> None:
    workload = Workload.from_dict(valid_spec())
    with pytest.raises(ValueError, match="frozen"):
        workload.batch_size = 64  # type: ignore[misc]


# ---- JSON ----


def test_invalid_json_text_is_a_spec_error() -> None:
    with pytest.raises(SpecError) as info:
        Workload.from_json('{"model": "tiny",', source="tiny.json")
    assert info.value.source == "tiny.json"
    (line,) = info.value.problems
    assert line.startswith("<root>: not valid JSON (")
    assert "line 1" in line


def test_missing_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"<file>: cannot read \(No such file or directory\)"):
        Workload.load(tmp_path / "absent.json")


def test_save_then_load_gives_the_same_workload(tmp_path: Path) -> None:
    workload = Workload.from_dict(valid_spec())
    workload.save(tmp_path / "w.json")
    assert Workload.load(tmp_path / "w.json") == workload


def test_to_json_leaves_out_unset_optional_fields() -> None:
    data = json.loads(Workload.from_dict(valid_spec()).to_json())
    assert "shape" not in data["layers"][0]["tensors"][1]
    assert "grad_ready_ms" not in data["layers"][0]
    assert "torch_version" not in data["provenance"]


def _finite(low: float, high: float) -> st.SearchStrategy[float]:
    return st.floats(min_value=low, max_value=high, allow_nan=False, allow_infinity=False)


texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=10)
dtypes = st.sampled_from(["fp32", "fp16", "bf16", "fp64", "int64"])


@st.composite
def tensors(draw: st.DrawFn, name: str) -> Tensor:
    shape = draw(st.none() | st.lists(st.integers(1, 64), min_size=1, max_size=3).map(tuple))
    numel = math.prod(shape) if shape is not None else draw(st.integers(1, 10**9))
    return Tensor(name=name, numel=numel, dtype=draw(dtypes), shape=shape)


@st.composite
def layers(draw: st.DrawFn, index: int) -> Layer:
    count = draw(st.integers(0, 3))
    layer_tensors = tuple(draw(tensors(f"layer{index}.p{j}")) for j in range(count))
    ready = draw(st.none() | st.lists(_finite(0, 1e4), min_size=count, max_size=count).map(tuple))
    return Layer(
        name=f"{draw(texts)}#{index}",  # layer names are unique in a workload
        tensors=layer_tensors,
        forward_ms=draw(_finite(0, 1e4)),
        backward_ms=draw(_finite(0, 1e4)),
        grad_ready_ms=ready,
    )


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    count = draw(st.integers(1, 6))
    all_layers = [draw(layers(i)) for i in range(count)]
    if not any(layer.tensors for layer in all_layers):
        all_layers.append(Layer(name="head", tensors=(Tensor(name="head.w", numel=3),), forward_ms=1, backward_ms=1))
    provenance = Provenance(
        kind=draw(st.sampled_from(["measured", "estimated"])),
        source=draw(texts),
        method=draw(st.text(max_size=10)),
        torch_version=draw(st.none() | texts),
        notes=draw(st.text(max_size=10)),
    )
    extra = draw(st.dictionaries(texts, st.integers(-(10**6), 10**6) | _finite(-1e9, 1e9) | texts, max_size=3))
    return Workload(
        model=draw(texts),
        batch_size=draw(st.integers(1, 4096)),
        device=draw(texts),
        dtype=draw(dtypes),
        layers=tuple(all_layers),
        provenance=provenance,
        extra=extra,
    )


@settings(max_examples=30, deadline=None)
@given(workloads())
def test_random_valid_workloads_round_trip_through_json_unchanged(workload: Workload) -> None:
    again = Workload.from_json(workload.to_json())
    assert again == workload
    assert again.grad_ready_ms == workload.grad_ready_ms
    assert {k: type(v) for k, v in again.extra.items()} == {k: type(v) for k, v in workload.extra.items()}
