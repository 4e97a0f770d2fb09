"""MkDocs hooks for the API site (mkdocs.yml).

* The README (the home page) and the CHANGELOG live at the repository's root, outside ``docs/``: they are
  added as generated pages, with the README's ``docs/...`` links made relative to ``docs/``.
* A link from any page to a file of the repository outside ``docs/`` (``src/``, ``tests/``, ``examples/``,
  ...) has no page on the site: it becomes the path in code type, so that what it names stays readable and
  ``--strict`` keeps failing on links that are really broken.
* ``reference/index.md``'s marker ``<!-- public-names -->`` becomes the table of every name in
  ``ngvi.__all__``, each linked to its entry (an unresolved link fails the strict build).
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[1]
_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")


def on_files(files: Files, config: Any) -> Files:
    readme = (REPO / "README.md").read_text()
    readme = re.sub(r"\]\(docs/", "](", readme)
    files.append(File.generated(config, "index.md", content=readme))
    files.append(File.generated(config, "CHANGELOG.md", content=(REPO / "CHANGELOG.md").read_text()))
    return files


def _outside_docs(page_path: str, target: str) -> str | None:
    """The repository path a relative link points to when that is outside docs/, else None."""
    if re.match(r"^[a-z]+:", target) or target.startswith(("#", "/")):
        return None
    path = target.split("#", 1)[0]
    if not path:
        return None
    if page_path in ("index.md", "CHANGELOG.md"):  # generated from the repository's root
        repo_path = posixpath.normpath(path)
        in_docs = (REPO / "docs" / repo_path).exists() or repo_path == "CHANGELOG.md"  # a page, generated
        return None if in_docs else repo_path
    repo_path = posixpath.normpath(posixpath.join("docs", posixpath.dirname(page_path), path))
    return None if repo_path.startswith("docs/") else repo_path


def _public_names_table() -> str:
    import griffe  # read statically, as mkdocstrings does: building the site imports neither ngvi nor torch

    ngvi = griffe.load("ngvi", search_paths=[str(REPO / "src")], resolve_aliases=True, resolve_external=False)
    # (no extension: the table shows each name's first paragraph, with roles rewritten below)
    rows = ["| name | what it is |", "|---|---|"]
    for name in ngvi.exports or []:
        obj = ngvi[name]
        target = obj.final_target if obj.is_alias else obj
        summary = target.docstring.value.strip().split("\n\n")[0] if target.docstring else ""
        summary = " ".join(summary.split()).replace("|", "\\|")
        summary = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", summary)
        rows.append(f"| [`ngvi.{name}`][{target.path}] | {summary} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    src = page.file.src_uri

    def relink(match: re.Match) -> str:
        outside = _outside_docs(src, match.group(2))
        return match.group(0) if outside is None else f"{match.group(1)} (`{outside}`)"

    markdown = _LINK.sub(relink, markdown)
    if "<!-- public-names -->" in markdown:
        markdown = markdown.replace("<!-- public-names -->", _public_names_table())
    return markdown
