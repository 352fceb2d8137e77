"""The reply renderer (web/markdown.js: markdown-it, self-hosted) on CommonMark's own spec examples, and what it
refuses. Runs web/markdown.js under Node with the pinned markdown-it file build.py ships, and the examples from
the `commonmark-spec` npm package (a devDependency)."""
from __future__ import annotations

import json

import pytest

import build
from node_run import node_runner

# A handful of spec examples per section, by number (spec 0.31.2). Examples the page renders differently on
# purpose are not here: raw HTML (escaped as text), images (not made), link titles and a fence's info string
# (no attribute from the text but a link's href).
SPEC_EXAMPLES = {
    "List items": [253, 254, 262, 264, 278, 280],
    "Lists": [301, 304, 306, 312, 318, 319],
    "Emphasis and strong emphasis": [350, 352, 360, 378, 402, 420],
    "ATX headings": [62, 63, 64, 66, 71],
    "Setext headings": [80, 81, 83],
    "Links": [483, 484, 488, 493, 500, 503],
    "Code spans": [328, 329, 338, 341],
    "Fenced code blocks": [119, 120, 121, 126, 128],
}

RUNNER = """
import { createRequire } from "node:module";
import { renderMarkdown } from "./markdown.js";
const { tests } = createRequire(process.argv[2] + "/")("commonmark-spec");
const input = JSON.parse(process.argv[3]);
const spec = Object.fromEntries(tests.map((t) => [t.number, t]));
const tab = (s) => s.replace(/\\u2192/g, "\\t");  // the spec shows a tab as an arrow
console.log(JSON.stringify({
  spec: input.numbers.map((n) => ({ number: n, section: spec[n].section, want: tab(spec[n].html),
                                    got: renderMarkdown(tab(spec[n].markdown)) })),
  texts: input.texts.map(renderMarkdown),
}));
"""


@pytest.fixture(scope="module")
def render(tmp_path_factory):
    """render(numbers, texts) -> {"spec": [...], "texts": [html]}: web/markdown.js run under Node."""
    run = node_runner(tmp_path_factory, ["markdown.js"], RUNNER, npm_page_files=True)
    return lambda numbers, texts: run(str(build.NODE_MODULES), json.dumps({"numbers": numbers, "texts": texts}))


LINK_ATTRS = ' rel="noopener noreferrer nofollow" target="_blank"'  # ours, on every link: it opens a new tab


def test_commonmark_spec_examples_render_as_the_spec_says(render):
    numbers = [n for ns in SPEC_EXAMPLES.values() for n in ns]
    out = render(numbers, [])["spec"]
    assert {(o["number"], o["section"]) for o in out} == {(n, s) for s, ns in SPEC_EXAMPLES.items() for n in ns}
    for o in out:
        assert o["got"].replace(LINK_ATTRS, "") == o["want"], f"spec example {o['number']} ({o['section']})"


def test_a_numbered_list_with_blank_lines_is_one_list_and_headings_italics_links_tables_render(render):
    texts = ["1. one\n\n2. two\n\n3. three\n",
             "## Plan\n\n*soon* and **now**, see [docs](https://example.org/a?b=1&c=2)\n",
             "| a | b |\n|---|---|\n| 1 | 2 |\n"]
    one_list, rich, table = render([], texts)["texts"]
    assert one_list == "<ol>\n<li>\n<p>one</p>\n</li>\n<li>\n<p>two</p>\n</li>\n<li>\n<p>three</p>\n</li>\n</ol>\n"
    assert rich == (f'<h2>Plan</h2>\n<p><em>soon</em> and <strong>now</strong>, see '
                    f'<a href="https://example.org/a?b=1&amp;c=2"{LINK_ATTRS}>docs</a></p>\n')
    assert table == ("<table>\n<thead>\n<tr>\n<th>a</th>\n<th>b</th>\n</tr>\n</thead>\n<tbody>\n<tr>\n<td>1</td>\n"
                     "<td>2</td>\n</tr>\n</tbody>\n</table>\n")


def test_no_raw_html_no_image_no_script_link_and_no_attribute_but_href_reaches_the_page(render):
    texts = ['<img src=x onerror="alert(1)"><script>alert(2)</script>\n',
             "[a](javascript:alert(1)) [b](JaVaScRiPt:alert(1)) [c](<java\tscript:alert(1)>) [d](data:text/html,x) "
             '[e](vbscript:x) [f](https://ok.example "a title")\n',
             "![x](https://example.org/x.png)\n",
             "```js onclick=alert(1)\nlet a = '<b>';\n```\n",
             "<https://example.org> <javascript:alert(1)>\n"]
    html, links, image, fence, autolinks = render([], texts)["texts"]
    assert html == ("<p>&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&lt;script&gt;alert(2)&lt;/script&gt;</p>\n")
    # Refused schemes stay text; a tab inside the scheme is percent-encoded, so the browser reads a relative path.
    assert links == ("<p>[a](javascript:alert(1)) [b](JaVaScRiPt:alert(1)) "
                     f'<a href="java%09script:alert(1)"{LINK_ATTRS}>c</a> [d](data:text/html,x) [e](vbscript:x) '
                     f'<a href="https://ok.example"{LINK_ATTRS}>f</a></p>\n')
    assert image == f'<p>!<a href="https://example.org/x.png"{LINK_ATTRS}>x</a></p>\n'
    assert fence == "<pre><code>let a = '&lt;b&gt;';\n</code></pre>\n"
    assert autolinks == (f'<p><a href="https://example.org"{LINK_ATTRS}>https://example.org</a> '
                         "&lt;javascript:alert(1)&gt;</p>\n")
