"""A report as a list of blocks (pure), written out twice: as Markdown and as self-contained HTML.

The report is built once, as blocks (headings, paragraphs of plain, bold and code runs, bullets, numbered findings,
preformatted text, tables, images, blank lines); each writer renders every block. The HTML is never parsed back out of
the Markdown, so text from a finding is text in both: a ``**`` or a backtick inside it stays as written.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

from hf_distprof.core.text import markdown_table

Run = tuple[str, str]
"""(style, text): style "" (plain), "b" (bold) or "code"."""


@dataclass
class Heading:
    level: int
    text: str


@dataclass
class Lines:
    """A paragraph of lines, each a list of runs, broken where they end (Markdown: two trailing spaces)."""

    lines: list[list[Run]]


@dataclass
class Bullet:
    runs: list[Run]


@dataclass
class Numbered:
    """One numbered entry (a finding): its head and its sub-items."""

    number: int
    head: list[Run]
    items: list[list[Run]] = field(default_factory=list)


@dataclass
class Pre:
    text: str


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class Image:
    name: str
    alt: str


@dataclass
class Blank:
    """A blank line: separates blocks in the Markdown; closes a list in the HTML."""


Block = Heading | Lines | Bullet | Numbered | Pre | Table | Image | Blank


def plain(text: str) -> list[Run]:
    return [("", text)]


def para(text: str) -> Lines:
    """A paragraph of one plain line."""
    return Lines([plain(text)])


def _md_runs(runs: list[Run]) -> str:
    return "".join(f"**{t}**" if s == "b" else f"`{t}`" if s == "code" else t for s, t in runs)


def to_markdown(blocks: list[Block]) -> str:
    """The blocks as Markdown, one line per line."""
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append("#" * b.level + " " + b.text)
        elif isinstance(b, Lines):
            out += [_md_runs(line) + ("  " if i < len(b.lines) - 1 else "") for i, line in enumerate(b.lines)]
        elif isinstance(b, Bullet):
            out.append("- " + _md_runs(b.runs))
        elif isinstance(b, Numbered):
            out.append(f"{b.number}. {_md_runs(b.head)}")
            out += [f"   - {_md_runs(item)}" for item in b.items]
        elif isinstance(b, Pre):
            out += ["```", b.text, "```"]
        elif isinstance(b, Table):
            out += markdown_table(b.header, b.rows)
        elif isinstance(b, Image):
            out.append(f"![{b.alt}]({b.name})")
        else:
            out.append("")
    return "\n".join(out)


def _html_runs(runs: list[Run]) -> str:
    tags = {"b": "b", "code": "code"}
    return "".join(f"<{tags[s]}>{html.escape(t)}</{tags[s]}>" if s in tags else html.escape(t) for s, t in runs)


def to_html(blocks: list[Block], images: dict[str, Path], title: str) -> str:
    """The blocks as one HTML page, every image inlined (``images``: name -> its file; an image without a file is
    left out)."""
    body: list[str] = []
    open_list = ""

    def close() -> None:
        nonlocal open_list
        if open_list:
            body.append(f"</{open_list}>")
            open_list = ""

    for b in blocks:
        want = "ul" if isinstance(b, Bullet) else "ol" if isinstance(b, Numbered) else ""
        if want != open_list:
            close()
            if want:
                body.append(f"<{want}>" if want == "ul" else f'<ol start="{b.number}">')  # type: ignore[union-attr]
                open_list = want
        if isinstance(b, Heading):
            body.append(f"<h{b.level}>{html.escape(b.text)}</h{b.level}>")
        elif isinstance(b, Lines):
            body.append("<p>" + "<br>".join(_html_runs(line) for line in b.lines) + "</p>")
        elif isinstance(b, Bullet):
            body.append(f"<li>{_html_runs(b.runs)}</li>")
        elif isinstance(b, Numbered):
            items = "".join(f"<li>{_html_runs(item)}</li>" for item in b.items)
            body.append(f"<li>{_html_runs(b.head)}" + (f"<ul>{items}</ul>" if items else "") + "</li>")
        elif isinstance(b, Pre):
            body.append(f"<pre>{html.escape(b.text)}</pre>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{html.escape(c)}</th>" for c in b.header)
            rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in b.rows)
            body.append(f"<table><tr>{head}</tr>{rows}</table>")
        elif isinstance(b, Image):
            path = images.get(b.name)
            if path is not None and path.is_file():
                data = base64.b64encode(path.read_bytes()).decode()
                body.append(f'<p><img alt="{html.escape(b.alt)}" src="data:image/png;base64,{data}"></p>')
    close()
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}pre{background:#f4f4f4;"
        "padding:1em;overflow-x:auto;font-size:12px}img{max-width:100%}table{border-collapse:collapse;"
        "font-size:13px}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}li{margin:0.3em 0}</style>"
        "</head><body>" + "\n".join(body) + "</body></html>"
    )
