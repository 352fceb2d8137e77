// Markdown for replies: CommonMark (with GitHub's tables and strikethrough) by markdown-it, self-hosted from
// npm (build.py pins its file). No raw HTML reaches the page (html: false escapes it as text) and no image is
// made; the one attribute taken from the text is a link's href, and only an http(s), mailto or relative one.
// A fence's info string gives no class. A reply is rendered whole on every token while it streams: an
// unclosed fence is code to the end, as CommonMark reads it.
import markdownit from "./vendor/markdown-it.mjs";

const md = markdownit({ html: false, linkify: false, typographer: false });
md.disable("image");  // ![alt](url) stays "!" before a link: no request leaves the page for a reply's image

// A scheme is read as the browser reads it: with ASCII whitespace and controls removed ("java\tscript:").
const SCHEME = /^([a-z][a-z0-9+.-]*):/i;
md.validateLink = (url) => {
  const scheme = SCHEME.exec(url.replace(/[\u0000-\u0020]/g, ""))?.[1]?.toLowerCase();
  return scheme === undefined || scheme === "http" || scheme === "https" || scheme === "mailto";
};

md.renderer.rules.fence = (tokens, idx) => `<pre><code>${md.utils.escapeHtml(tokens[idx].content)}</code></pre>\n`;

// A link's title is text from the reply: dropped, so href is the only attribute from the text.
const openLink = md.renderer.rules.link_open ?? ((tokens, idx, options, env, self) => self.renderToken(tokens, idx, options));
md.renderer.rules.link_open = (tokens, idx, options, env, self) => {
  tokens[idx].attrs = tokens[idx].attrs.filter(([name]) => name === "href");
  tokens[idx].attrPush(["rel", "noopener noreferrer nofollow"]);
  tokens[idx].attrPush(["target", "_blank"]);  // a reply's link never navigates the chat away
  return openLink(tokens, idx, options, env, self);
};

export function renderMarkdown(text) {
  return md.render(text);
}
