"""tests/golden_compare.py on a real report (the h200/decode fixture's report.json and report.md): float noise and
rounding-boundary flips pass; a moved number, a changed string, count, key or list length fails, and the failure
names the path with both values."""
import copy
import math
import re

import pytest

from golden_compare import compare_json, compare_markdown, decimals, numbers_close
from test_report_golden import ROOT, normalised


@pytest.fixture(scope="module")
def real():
    return normalised(ROOT / "fixtures" / "h200" / "decode")


@pytest.fixture
def report(real):
    return copy.deepcopy(real["report.json"])


def _get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def _set(tree, path, value):
    _get(tree, path[:-1])[path[-1]] = value


def _floats(tree, path=()):
    """(path, value) of every float in the tree."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _floats(value, path + (key,))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from _floats(value, path + (i,))
    elif isinstance(tree, float):
        yield path, tree


PIECE = ("timeline", "devices", "0", "idle_us", 10, 1)  # the end of an idle piece, µs on the trace clock (5e12)
UTILIZATION = ("summary", "gpu_utilization")  # round(x, 4)
BUSY = ("summary", "gpu_busy_us")  # round(x, 3)
IMPACT = ("findings", 0, "impact_us")


def test_the_same_report_matches(real, report):
    assert compare_json(real["report.json"], report) == []
    assert compare_markdown(real["report.md"], real["report.md"]) == []
    assert len(report["timeline"]["devices"]["0"]["idle_us"]) > 100 and report["findings"]


def test_float_noise_passes(real, report):
    """Every computed quantity moved by 1e-12 relative, as another CPU's summation order moves a sum."""
    moved = 0
    for path, value in _floats(report):
        if value and abs(value) < 1e9:  # durations, shares, sums; timestamps are below
            _set(report, path, value * (1 + 1e-12))
            moved += 1
    assert moved > 100
    assert compare_json(real["report.json"], report) == []


def test_a_moved_timestamp_fails(real, report):
    """A timestamp on the trace clock is ~5e12 µs: 1e-12 relative moves it by 5 µs, a real change."""
    value = _get(report, PIECE)
    assert value > 1e12
    _set(report, PIECE, round(value * (1 + 1e-12), 3))
    (diff,) = compare_json(real["report.json"], report)
    assert diff.startswith("timeline.devices.0.idle_us[10][1]: ")


@pytest.mark.parametrize("path", [UTILIZATION, BUSY, IMPACT, PIECE, ("summary", "idle_partition", "findings_us")])
def test_one_percent_fails_and_names_the_path(real, report, path):
    before = _get(report, path)
    assert isinstance(before, float) and before
    _set(report, path, before * 1.01)
    assert compare_json(real["report.json"], report) == [f"{_path_text(path)}: {before!r} != {before * 1.01!r}"]


def _path_text(path) -> str:
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
    return out


@pytest.mark.parametrize("path, unit", [(UTILIZATION, 1e-4), (BUSY, 1e-3), (IMPACT, 1e-3), (PIECE, 1e-3)])
def test_a_rounding_boundary_flip_passes_two_units_fail(real, report, path, unit):
    value = _get(report, path)
    places = round(-math.log10(unit))
    for sign in (1, -1):
        flipped = copy.deepcopy(report)
        _set(flipped, path, round(value + sign * unit, places))
        assert compare_json(real["report.json"], flipped) == []
        twice = copy.deepcopy(report)
        _set(twice, path, round(value + sign * 2 * unit, places))
        assert len(compare_json(real["report.json"], twice)) == 1


def test_the_place_sets_the_unit_not_the_value(real, report):
    """A value that reads 1234.5 among siblings with three decimals was rounded to three: it may move by 0.001, not
    by 0.1 (its own decimals alone would allow that)."""
    golden = copy.deepcopy(real["report.json"])
    value = round(_get(golden, PIECE), 1)
    _set(golden, PIECE, value)
    assert decimals(value) <= 1
    _set(report, PIECE, round(value + 0.001, 3))
    assert compare_json(golden, report) == []
    _set(report, PIECE, round(value - 0.1, 3))
    assert compare_json(golden, report) == [f"timeline.devices.0.idle_us[10][1]: {value!r} != {value - 0.1!r}"]
    assert numbers_close(1234.5, 1234.4) and not numbers_close(1234.5, 1234.4, 3)


def test_numbers_close_rules():
    assert numbers_close(0.5571, 0.5572) and not numbers_close(0.5571, 0.5573)  # rounded to 4: one unit
    assert numbers_close(12.0, 12.001, 3) and not numbers_close(12.0, 12.002, 3)
    assert numbers_close(0.1 + 0.2, 0.3)  # unrounded noise
    assert numbers_close(1 / 3, 1 / 3 * (1 + 1e-12)) and not numbers_close(1 / 3, 1 / 3 * (1 + 1e-6))
    assert numbers_close(float("nan"), float("nan")) and not numbers_close(float("nan"), 0.0)
    assert numbers_close(float("inf"), float("inf")) and not numbers_close(float("inf"), 1e308)
    assert numbers_close(-0.0, 0.0)
    assert decimals(12.35) == 2 and decimals(100.0) == 0 and decimals(1e-05) == 5 and decimals(5e15) == 0


def test_changed_string_count_key_length_and_type_fail(real, report):
    golden = real["report.json"]
    title = report["findings"][0]["title"]

    changed = copy.deepcopy(report)
    changed["findings"][0]["title"] = title.replace("GPU", "GPU!", 1)
    (diff,) = compare_json(golden, changed)
    assert diff.startswith("findings[0].title: ") and "GPU!" in diff

    fewer = copy.deepcopy(report)
    fewer["findings"].pop()
    assert compare_json(golden, fewer) == [f"findings: {len(golden['findings'])} items != {len(fewer['findings'])}"]

    pieces = copy.deepcopy(report)
    pieces["timeline"]["devices"]["0"]["idle_us"].pop(3)
    diffs = compare_json(golden, pieces)
    assert diffs[0].startswith("timeline.devices.0.idle_us: ") and "items" in diffs[0]

    count = copy.deepcopy(report)
    count["timeline"]["devices"]["0"]["idle_total"] += 1
    n = golden["timeline"]["devices"]["0"]["idle_total"]
    assert compare_json(golden, count) == [f"timeline.devices.0.idle_total: {n} != {n + 1}"]

    cause = copy.deepcopy(report)
    cause["timeline"]["devices"]["0"]["idle_us"][5][2] = "sync"
    assert compare_json(golden, cause)[0].startswith("timeline.devices.0.idle_us[5][2]: ")

    keys = copy.deepcopy(report)
    del keys["summary"]["gpu_utilization"]
    keys["summary"]["extra"] = 1
    assert compare_json(golden, keys) == ["summary: keys missing ['gpu_utilization']", "summary: keys added ['extra']"]

    kinds = copy.deepcopy(report)
    kinds["summary"]["gpu_utilization"] = None
    kinds["trace"]["has_python_stacks"] = int(golden["trace"]["has_python_stacks"])
    diffs = compare_json(golden, kinds)
    assert [d.split(":")[0] for d in diffs] == ["summary.gpu_utilization", "trace.has_python_stacks"]


def test_many_differences_are_counted_not_listed(real, report):
    for piece in report["timeline"]["devices"]["0"]["idle_us"][:50]:
        piece[0] += 1.0
    diffs = compare_json(real["report.json"], report, limit=5)
    assert len(diffs) == 6 and diffs[-1] == "... and 45 more"
    assert diffs[0].startswith("timeline.devices.0.idle_us[0][0]: ")


def _line(markdown: str, pattern: str) -> int:
    return next(i for i, line in enumerate(markdown.splitlines()) if re.search(pattern, line))


def _edit(markdown: str, index: int, old: str, new: str) -> str:
    lines = markdown.splitlines(keepends=True)
    assert old in lines[index]
    lines[index] = lines[index].replace(old, new, 1)
    return "".join(lines)


def test_markdown_numbers_may_flip_their_last_digit(real):
    md = real["report.md"]
    i = _line(md, r"GPU utilization \d+\.\d%")
    line = md.splitlines()[i]
    util = re.search(r"GPU utilization (\d+\.\d)%", line).group(1)
    one, two = f"{float(util) + 0.1:.1f}", f"{float(util) + 0.2:.1f}"
    assert compare_markdown(md, _edit(md, i, f"{util}%", f"{one}%")) == []
    (diff,) = compare_markdown(md, _edit(md, i, f"{util}%", f"{two}%"))
    assert diff.startswith(f"report.md line {i + 1}: ") and f"{two}%" in diff

    ms = re.search(r"busy (\d+\.\d\d) ms", line).group(1)
    assert compare_markdown(md, _edit(md, i, f"busy {ms} ms", f"busy {float(ms) - 0.01:.2f} ms")) == []
    assert compare_markdown(md, _edit(md, i, f"busy {ms} ms", f"busy {float(ms) - 0.02:.2f} ms"))
    assert compare_markdown(md, _edit(md, i, f"busy {ms} ms", f"busy {ms} µs"))  # the unit is text

    factor = re.search(r"dilation (\d+\.\d\d)x", line).group(1)
    assert compare_markdown(md, _edit(md, i, f"{factor}x", f"{float(factor) + 0.01:.2f}x")) == []
    assert compare_markdown(md, _edit(md, i, f"{factor}x", f"{float(factor) + 0.05:.2f}x"))


def test_markdown_text_names_and_lines_are_exact(real):
    md = real["report.md"]
    i = _line(md, r"model\.py:\d+")
    number = re.search(r"model\.py:(\d+)", md.splitlines()[i]).group(1)
    assert compare_markdown(md, _edit(md, i, f"model.py:{number}", f"model.py:{int(number) + 1}"))  # a name
    assert compare_markdown(md, _edit(md, i, "|", "| ")) != []
    j = _line(md, r"\((\d+) gaps")
    gaps = re.search(r"\((\d+) gaps", md.splitlines()[j]).group(1)
    assert compare_markdown(md, _edit(md, j, f"({gaps} gaps", f"({int(gaps) + 2} gaps"))
    lines = md.splitlines(keepends=True)
    shorter = "".join(lines[:j] + lines[j + 1:])
    diffs = compare_markdown(md, shorter)
    assert diffs[0] == f"report.md: {len(lines)} lines != {len(lines) - 1}" and diffs[1].startswith(
        f"report.md line {j + 1}: ")
