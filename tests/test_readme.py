"""The README stays true: its test command is what CI runs, and its schema table is the code's schema."""
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
    assert describe_schema() in (REPO / "README.md").read_text()
