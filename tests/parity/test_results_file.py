"""bench/results_file.py: a benchmark's one result file round-trips (the json block read back
equals what was written, the markdown body is kept as written), bad files fail with the
file's name, and every file committed in bench/results/ follows the rule (one .md per
benchmark whose json block parses; no separate .json)."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "bench"))
import results_file  # noqa: E402

BODY = """# A benchmark: hearth vs a peer

Machine: a test, 2 cores.

| model | hearth tok/s | peer tok/s | ratio |
|---|---:|---:|---:|
| tiny | 123.4 | 100.0 | 1.23 |

## Second table

a line with ```json inside it, and a line below that is only a fence:

```
not json { ]
```
"""

DATA = {"rows": [{"model": "tiny", "hearth": 123.4, "peer": 100.0, "ratio": 1.234}],
        "tiny_float": 1e-300, "big": 2 ** 62, "third": 1 / 3, "text": "naïve — \"quoted\"\nnew line ```",
        "nested": {"empty": [], "none": None, "flag": True}, "inf": float("inf")}


def test_write_read_round_trip(tmp_path):
    path = results_file.write(str(tmp_path / "bench.md"), BODY, DATA, command="bench/x/run.py --quick",
                              machine_line="Test CPU, 2 logical CPUs", load="1.5", date="2026-12-05 12:00 UTC")
    assert path == str(tmp_path / "bench.md")
    got = results_file.read(path)
    assert got == DATA and math.isinf(got["inf"])
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    assert lines[0] == "# A benchmark: hearth vs a peer"
    assert lines[2] == ("Made by `bench/x/run.py --quick` on Test CPU, 2 logical CPUs; load average 1.5; "
                        "2026-12-05 12:00 UTC.")
    assert results_file.body_of(path) == BODY
    assert not (tmp_path / "bench.md.tmp").exists()


def test_header_measured_when_not_given(tmp_path):
    path = results_file.write(str(tmp_path / "b.md"), "no title, one line", {"x": 1})
    first = Path(path).read_text().split("\n")[0]
    assert first.startswith("Made by `") and "logical CPUs; load average " in first and " UTC." in first
    assert results_file.read(path) == {"x": 1}
    assert results_file.body_of(path) == "no title, one line\n"


def test_rewrite_replaces_the_json(tmp_path):
    p = str(tmp_path / "r.md")
    results_file.write(p, BODY, {"run": 1})
    results_file.write(p, BODY, {"run": 2})
    assert results_file.read(p) == {"run": 2}
    assert Path(p).read_text().count(results_file.JSON_HEADING) == 1


def test_rewrite_keeps_the_header(tmp_path):
    """A script that re-renders a stored result or adds a section keeps the line naming the run."""
    p = str(tmp_path / "k.md")
    results_file.write(p, BODY, {"run": 1}, command="bench/x/run.py", machine_line="M", load="2.0", date="D")
    head = Path(p).read_text().split("\n")[2]
    results_file.rewrite(p, BODY + "\n## Added section\n\nrow\n", {"run": 1, "added": True})
    text = Path(p).read_text()
    assert text.split("\n")[2] == head and text.count("Made by `") == 1
    assert results_file.read(p) == {"run": 1, "added": True}
    assert results_file.body_of(p).endswith("## Added section\n\nrow\n")


def test_write_section_keeps_the_other_sections(tmp_path):
    """Two benchmarks sharing one file: each replaces its own "## " section and json key,
    the other's (and hand-written sections) stay; a new file gets the title."""
    out = tmp_path / "shared.md"
    results_file.write_section(str(out), "# Shared", "## A", "## A\n\nfirst a\n", "a", {"x": 1})
    results_file.write_section(str(out), "# Shared", "## B", "## B\n\nfirst b\n", "b", {"y": 2})
    text = out.read_text()
    out.write_text(text.replace("\n## Machine", "\n## Notes\n\nby hand\n\n## Machine"))
    results_file.write_section(str(out), "# Shared", "## A", "## A\n\nsecond a\n", "a", {"x": 3})
    text = out.read_text()
    assert text.startswith("# Shared\n")
    assert "second a" in text and "first a" not in text and "first b" in text and "by hand" in text
    assert text.index("## A") < text.index("## B") < text.index("## Notes")
    assert results_file.read(str(out)) == {"a": {"x": 3}, "b": {"y": 2}}


def test_write_keeping_puts_other_runs_sections_back(tmp_path):
    """A file's main benchmark rewrites it whole (write) and keeps the sections and json keys
    another run wrote into it (write_section): the GPU section of a CPU benchmark's file."""
    out = tmp_path / "main.md"
    results_file.write(str(out), "# Main\n\nfirst cpu\n", {"streams": 8}, command="x", machine_line="m", load="0")
    results_file.write_section(str(out), "", "## GPU", "## GPU\n\ngpu rows\n", "cuda", {"streams": 32})
    results_file.write_keeping(str(out), "# Main\n\nsecond cpu\n", {"streams": 4}, [("## GPU", "cuda"), ("## Gone", "g")])
    text = out.read_text()
    assert "second cpu" in text and "first cpu" not in text and "gpu rows" in text and "## Gone" not in text
    assert results_file.read(str(out)) == {"streams": 4, "cuda": {"streams": 32}}
    fresh = tmp_path / "fresh.md"  # no earlier file: a plain write
    results_file.write_keeping(str(fresh), "# F\n\nrows\n", {"a": 1}, [("## GPU", "cuda")])
    assert results_file.read(str(fresh)) == {"a": 1}


@pytest.mark.parametrize("text,why", [
    ("# t\n\nno json here\n", "no '## Machine-readable result' section"),
    ("# t\n\n## Machine-readable result\n\n```json\n{\"a\": 1}\n", "no closed ```json block"),
    ("# t\n\n## Machine-readable result\n\n```json\n{\"a\": \n```\n", "does not parse"),
])
def test_bad_files_name_the_file_and_the_problem(tmp_path, text, why):
    p = tmp_path / "bad.md"
    p.write_text(text)
    with pytest.raises(ValueError) as e:
        results_file.read(str(p))
    assert str(p) in str(e.value) and why in str(e.value)
    assert results_file.read_if_exists(str(tmp_path / "absent.md"), {"first": "run"}) == {"first": "run"}


def test_command_line_tool(tmp_path):
    body, data = tmp_path / "body.md", tmp_path / "data.json"
    body.write_text(BODY)
    data.write_text(json.dumps({"a": [1, 2.5]}))
    out = tmp_path / "cli.md"
    tool = [sys.executable, str(REPO / "bench" / "results_file.py")]
    subprocess.run(tool + ["write", str(out), "--body", str(body), "--json", str(data), "--command", "tools/x"],
                   check=True, capture_output=True)
    p = subprocess.run(tool + ["json", str(out)], check=True, capture_output=True, text=True)
    assert json.loads(p.stdout) == {"a": [1, 2.5]}
    bad = subprocess.run(tool + ["json", str(body)], capture_output=True, text=True)
    assert bad.returncode != 0 and str(body) in bad.stderr


def test_committed_results_follow_the_rule():
    results = REPO / "bench" / "results"
    assert not sorted(results.glob("*.json")), "bench/results keeps one .md per benchmark (json inside it)"
    with_json = [p for p in sorted(results.glob("*.md")) if results_file.JSON_HEADING in p.read_text()]
    assert len(with_json) >= 21
    for p in with_json:
        assert isinstance(results_file.read(str(p)), (dict, list)), p
    index = (results / "README.md").read_text()
    for p in sorted(results.iterdir()):
        if p.name != "README.md":
            assert f"`{p.name}`" in index, f"{p.name} is not in bench/results/README.md's index"
