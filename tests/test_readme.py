"""The README stays true and stays a front door: its test command is what CI runs, every document it links exists,
and the workload schema table in docs/workloads.md is the code's schema."""
import re

from analyzer.capture.config import describe_schema
from conftest import REPO


def commands():
    text = (REPO / "README.md").read_text()
    return re.findall(r"^    (\S.*)$", text.split("---", 1)[0], flags=re.M)


def test_first_lines_give_two_commands_and_ci_runs_the_second():
    main_job, tests = commands()
    assert "capture workloads/decode.yaml" in main_job and "analyze" in main_job
    assert tests in (REPO / ".ci" / "run").read_text()


def test_schema_table_matches_code():
    assert describe_schema() in (REPO / "docs" / "workloads.md").read_text()


def test_readme_is_a_front_door_whose_links_all_resolve():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) < 150
    for doc in ("README.md", *(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")),
                "CONTRIBUTING.md", "ARCHITECTURE.md"):
        for target in re.findall(r"\]\(([^)#:]+)\)", (REPO / doc).read_text()):
            assert ((REPO / doc).parent / target).exists(), (doc, target)
    for doc in ("docs/cli.md", "docs/fleet.md", "docs/workloads.md", "docs/performance.md", "docs/validation.md",
                "CONTRIBUTING.md"):
        assert f"]({doc})" in text
