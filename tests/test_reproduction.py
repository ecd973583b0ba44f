"""docs/reproduction.md's tables are what scripts/reproduce.py gives today.

The full tables take about 20 s; this recomputes one model of each section
(its rows, tuned knobs included) with the document's settings and checks the
lines are in the document, so a change of a policy, the simulator or a zoo
profile cannot leave the published comparison behind.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENT = (ROOT / "docs" / "reproduction.md").read_text()


@pytest.fixture(scope="module")
def reproduce(script_loader: Callable[[str], ModuleType]) -> ModuleType:
    return script_loader("scripts/reproduce.py")


def test_the_dear_rows_of_resnet50_are_in_the_document(reproduce: ModuleType) -> None:
    rows = reproduce.dear_rows(["resnet50"], reproduce.DEAR_CLUSTERS, reproduce.Settings())
    tables = reproduce.dear_tables(rows)
    assert reproduce.DEAR_HEADER in DOCUMENT
    for line in tables.splitlines():
        if line.startswith("| resnet50 (64) |") or line.startswith("| 64xV100-"):
            assert line in DOCUMENT, line


def test_the_prophet_row_of_inception_bn_is_in_the_document(reproduce: ModuleType) -> None:
    rows = reproduce.prophet_rows(["inception_bn"], reproduce.Settings())
    assert reproduce.PROPHET_HEADER in DOCUMENT
    for line in reproduce.prophet_tables(rows).splitlines():
        if line.startswith("| inception_bn"):
            assert line in DOCUMENT, line


def test_the_script_prints_a_section_for_a_few_iterations(
    reproduce: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert reproduce.main(["--section", "prophet", "--models", "resnet50", "--iterations", "3", "--trials", "2"]) == 0
    out = capsys.readouterr().out
    assert "| resnet50 (64) |" in out and "inception_bn" not in out


def test_the_document_keeps_its_generated_sections_and_published_figures(reproduce: ModuleType) -> None:
    for name in ("dear", "prophet"):
        assert f"<!-- BEGIN reproduce.py {name} -->" in DOCUMENT and f"<!-- END reproduce.py {name} -->" in DOCUMENT
    assert "up to 83 %" in DOCUMENT and "up to 15 %" in DOCUMENT and "up to 40 %" in DOCUMENT
    with pytest.raises(SystemExit):
        reproduce.main(["--write-doc", "--models", "resnet50"])


def test_the_heterog_row_of_vgg19_is_in_the_document_beside_the_published_headline(
    reproduce: ModuleType,
) -> None:
    heterog = reproduce.heterog
    row = heterog.heterog_row("vgg19")
    assert heterog.MAIN_HEADER in DOCUMENT
    assert heterog.main_line(row) in DOCUMENT, heterog.main_line(row)
    assert "<!-- BEGIN reproduce.py heterog -->" in DOCUMENT and "<!-- END reproduce.py heterog -->" in DOCUMENT
    assert f"**{heterog.HEADLINE}**" in DOCUMENT
    # the plan never loses to the baselines that fit, and the bound caps what any schedule of its split could do
    assert row.plan.iteration_ms <= min(b.iteration_ms for b in row.plan.baselines if b.fits) * (1 + 1e-9)
    assert row.bound_ms <= row.plan.iteration_ms * (1 + 1e-9)


def test_the_larger_batch_is_where_even_dp_stops_fitting(reproduce: ModuleType) -> None:
    heterog = reproduce.heterog
    for model in heterog.LARGE_BATCH_MODELS:
        batch = heterog.large_batch(model)
        assert batch % 8 == 0 and f"| {model} ({batch}) |" in DOCUMENT
        assert f"| {model} ({batch - 8}) |" not in DOCUMENT
    assert heterog.LARGE_HEADER in DOCUMENT and "OOM: rank 2 (GTX-1080Ti)" in DOCUMENT
