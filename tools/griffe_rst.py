"""A griffe extension for the API site (mkdocs.yml): ngvi's docstrings are written with a few
reStructuredText constructs, which this turns into what mkdocstrings' Markdown renders.

* ``.. math::`` blocks and ``:math:`...``` roles become MathML (latex2mathml, at build time: the pages need no
  script and no network to show the maths); a block with ``&`` or ``\\\\`` is set as ``align*``.
* ``:class:`~a.b.C```, ``:func:``, ``:mod:``, ``:meth:``, ``:attr:``, ``:data:`` become inline code (the
  last component for a ``~`` target, as Sphinx shows it).
* Sphinx's ``#:`` comments above a module or class attribute become its docstring (griffe reads only a
  string below an attribute).
* A paragraph ending in ``::`` (a literal block follows) ends in ``:``, and ``\\ `` escapes are dropped.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe
from latex2mathml.converter import convert

_ROLE = re.compile(r":(?:py:)?(?:class|func|mod|meth|attr|data|exc|obj):`(~?)([^`]+)`")
_MATH_ROLE = re.compile(r":math:`([^`]+)`")
_MATH_BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)\.\. math::[ \t]*\n(?P<body>(?:(?P=indent)[ \t]+\S.*\n?|[ \t]*\n)+)", re.M
)
# latex2mathml writes \sim as an identifier "~"; the relation sign is what the docstrings mean
_LATEX_FIXES = {r"\sim": r"\mathrel{∼}", r"\big[": "[", r"\big]": "]", r"\textstyle": "", r"\tfrac": r"\frac"}


def _mathml(latex: str, display: bool) -> str:
    latex = latex.strip()
    for old, new in _LATEX_FIXES.items():
        latex = latex.replace(old, new)
    if display and ("&" in latex or r"\\" in latex):
        latex = r"\begin{align*}" + latex + r"\end{align*}"
    try:
        return convert(latex, display="block" if display else "inline")
    except Exception:  # a formula latex2mathml cannot parse is shown as its source, never dropped
        return f"<code>{html.escape(latex)}</code>"


def _block(match: re.Match) -> str:
    body = "\n".join(line.strip() for line in match.group("body").splitlines())
    # the rendered block sits in the docstring's Markdown as one raw-HTML paragraph
    return f'\n<div class="ngvi-math">{_mathml(body, display=True)}</div>\n\n'


def rst_to_markdown(text: str) -> str:
    """The docstring ``text`` with the constructs above rewritten."""
    text = _MATH_BLOCK.sub(_block, text)
    text = _MATH_ROLE.sub(lambda m: _mathml(m.group(1), display=False), text)
    text = _ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text)
    text = re.sub(r"(\S)::[ \t]*\n", r"\1:\n", text)
    return text.replace("\\ ", "")


def _comment_docstring(attr: griffe.Attribute) -> str | None:
    """The ``#:`` comment lines right above ``attr``'s assignment, joined, or None."""
    if attr.lineno is None or attr.filepath is None or isinstance(attr.filepath, list):
        return None
    collection = attr.lines_collection  # a LinesCollection: a mapping without .get
    if attr.filepath not in collection:
        return None
    lines = collection[attr.filepath]
    found: list[str] = []
    i = attr.lineno - 2  # the line above the assignment (lineno counts from 1)
    while i >= 0 and lines[i].strip().startswith("#:"):
        found.insert(0, lines[i].strip()[2:].strip())
        i -= 1
    return " ".join(found) or None


class RstToMarkdown(griffe.Extension):
    """Rewrites every docstring as it is loaded (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None and isinstance(obj, griffe.Attribute):
            comment = _comment_docstring(obj)
            if comment:
                obj.docstring = griffe.Docstring(comment, parent=obj)
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
