"""The README stands on its own (issue 30): a fresh clone has everything it and docs/ link to
(no link leaves the repository, every relative link resolves to a file or folder in it), and
the README's source layout names every folder of src/ (src/backend/*'s too), so a newcomer
finds each part of the code from it. The oracle is the checkout itself (os.walk, the files
the links name)."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_stay_in_the_repository_and_resolve(page):
    text = page.read_text(encoding="utf-8")
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor of this page
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if REPO.resolve() not in path.parents and path != REPO.resolve():
            bad.append(f"{target}: outside the repository")
        elif not path.exists():
            bad.append(f"{target}: no such file")
    assert not bad, bad
    # paths of the machine the docs were written on, or of the project's private workspace
    assert not re.search(r"\.\./shared/|/work/", text), "a path outside the repository"


def test_layout_names_every_source_folder():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    layout = text[text.index("## Layout"):]
    folders = [p for p in (REPO / "src").iterdir() if p.is_dir()]
    folders += [p for p in (REPO / "src" / "backend").iterdir() if p.is_dir()]
    missing = [str(p.relative_to(REPO)) for p in folders
               if p.name != "backend" and f"`{p.relative_to(REPO)}`" not in layout]
    assert not missing, f"README.md's layout leaves out {missing}"
