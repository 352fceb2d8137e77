// Markdown for replies: everything is HTML-escaped FIRST, then a few tags of our own are added
// (code blocks, inline code, bold, lists, paragraphs); no attribute ever comes from the text.

function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

function inlineMarkdown(escaped) {
  return escaped.replace(/`([^`]+)`/g, "<code>$1</code>").replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>");
}

function blockMarkdown(text) {
  let html = "";
  let list = null;
  for (const line of escapeHtml(text).split("\n")) {
    const item = line.match(/^\s*([-*]|\d+\.)\s+(.*)$/);
    if (item) {
      const type = /\d/.test(item[1]) ? "ol" : "ul";
      if (list !== type) { if (list) html += `</${list}>`; html += `<${type}>`; list = type; }
      html += `<li>${inlineMarkdown(item[2])}</li>`;
      continue;
    }
    if (list) { html += `</${list}>`; list = null; }
    if (line.trim()) html += `<p>${inlineMarkdown(line)}</p>`;
  }
  return list ? html + `</${list}>` : html;
}

export function renderMarkdown(text) {
  // Split on ``` fences: odd pieces are code (an unclosed fence while streaming is code too).
  return text.split("```").map((piece, i) => (i % 2
    ? `<pre><code>${escapeHtml(piece.replace(/^[^\n]*\n/, ""))}</code></pre>`
    : blockMarkdown(piece))).join("");
}
