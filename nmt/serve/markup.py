"""HTML for LibreTranslate's ``format=html``: the markup is kept as it came, the text nodes are
translated. Read with the standard library's lenient :class:`html.parser.HTMLParser`; the text
of ``<script>`` and ``<style>``, comments, declarations and attribute values are kept as they
are."""

from __future__ import annotations

import html
from html.parser import HTMLParser

KEEP_CONTENT = ("script", "style")  # elements whose text is not prose


class MarkupError(ValueError):
    pass


class _Splitter(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[tuple[bool, str]] = []  # (a text node to translate?, its text)
        self.keeping: str | None = None  # inside <script> or <style>

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.parts.append((False, self.get_starttag_text() or f"<{tag}>"))
        if tag in KEEP_CONTENT:
            self.keeping = tag

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        self.parts.append((False, self.get_starttag_text() or f"<{tag}/>"))

    def handle_endtag(self, tag: str) -> None:
        self.parts.append((False, f"</{tag}>"))
        if tag == self.keeping:
            self.keeping = None

    def handle_data(self, data: str) -> None:
        if self.keeping is not None:
            self.parts.append((False, data))
        else:
            self.parts.append((True, data))

    def handle_comment(self, data: str) -> None:
        self.parts.append((False, f"<!--{data}-->"))

    def handle_decl(self, decl: str) -> None:
        self.parts.append((False, f"<!{decl}>"))

    def handle_pi(self, data: str) -> None:
        self.parts.append((False, f"<?{data}>"))

    def unknown_decl(self, data: str) -> None:
        self.parts.append((False, f"<![{data}]>"))


def split_html(markup: str) -> list[tuple[bool, str]]:
    """The document as (is a text node, text) parts; text nodes with their character
    references resolved, the rest as written. Adjacent text is merged into one node."""
    splitter = _Splitter()
    try:
        splitter.feed(markup)
        splitter.close()
    except (AssertionError, ValueError, IndexError) as e:  # the parser's own complaints
        raise MarkupError(f"the HTML could not be read: {e}") from None
    parts: list[tuple[bool, str]] = []
    for is_text, text in splitter.parts:
        if is_text and parts and parts[-1][0]:
            parts[-1] = (True, parts[-1][1] + text)
        else:
            parts.append((is_text, text))
    return parts


def text_nodes(parts: list[tuple[bool, str]]) -> list[str]:
    """The text nodes to translate: those with words, without their outer whitespace."""
    return [text.strip() for is_text, text in parts if is_text and text.strip()]


def join_html(parts: list[tuple[bool, str]], translations: list[str]) -> str:
    """The document again, each text node with words replaced by its translation (escaped,
    its outer whitespace kept), in the order of :func:`text_nodes`."""
    out, given = [], iter(translations)
    for is_text, text in parts:
        if not is_text:
            out.append(text)
        elif not text.strip():
            out.append(html.escape(text, quote=False))
        else:
            core = text.strip()
            lead, trail = text[: text.index(core)], text[text.index(core) + len(core) :]
            out.append(lead + html.escape(next(given), quote=False) + trail)
    return "".join(out)
