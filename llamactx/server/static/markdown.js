// llamactx's chat page: a small Markdown renderer for the model's answers. It builds DOM nodes and writes every
// piece of the model's text with text nodes (createTextNode / textContent), never with innerHTML, so whatever the
// model writes (<script>, <img onerror=...>) is shown as text. A link's address is kept only when it is http(s),
// mailto or relative. What it renders: ATX headings, paragraphs (a newline is a line break), fenced code blocks
// with their language (an unclosed fence, as while an answer streams, runs to the end), bullet and numbered lists
// (nested by indentation), block quotes, tables (GitHub's pipe tables), thematic breaks, and inline code, bold,
// italic, strikethrough and links. Anything else is text.
"use strict";

(() => {
  const FENCE = /^ {0,3}(`{3,}|~{3,})[ \t]*([^`\s]*)[^`]*$/;
  const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
  const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
  const QUOTE = /^ {0,3}>[ ]?/;
  const LIST = /^([ \t]*)([-*+]|\d{1,9}[.)])[ \t]+(.*)$/;
  const TABLE_RULE = /^[ \t]*\|?[ \t]*:?-+:?[ \t]*(\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/;
  const SAFE_URL = /^(https?:\/\/|mailto:|\/|#|\.\.?\/)/i;
  const INLINE = new RegExp([
    "(`+)([^`]|[^`][\\s\\S]*?[^`])\\1(?!`)", // 1, 2: a code span
    "\\*\\*(?=\\S)([\\s\\S]*?\\S)\\*\\*", // 3: bold
    "(?<![\\w_])__(?=\\S)([\\s\\S]*?\\S)__(?![\\w_])", // 4: bold
    "~~(?=\\S)([\\s\\S]*?\\S)~~", // 5: strikethrough
    "\\*(?=[^\\s*])([\\s\\S]*?[^\\s*])\\*", // 6: italic
    "(?<![\\w_])_(?=[^\\s_])([\\s\\S]*?[^\\s_])_(?![\\w_])", // 7: italic
    "\\[([^\\]\\n]+)\\]\\(\\s*<?([^)\\s>]+)>?(?:\\s+\"[^\"]*\")?\\s*\\)", // 8, 9: a link
    "<(https?:\\/\\/[^>\\s]+)>", // 10: an autolink
  ].join("|"), "g");

  const el = (tag, ...children) => {
    const node = document.createElement(tag);
    node.append(...children);
    return node;
  };

  /** `text`'s inline Markdown appended to `parent` (newlines as <br>). */
  function inline(text, parent) {
    let at = 0;
    for (const m of text.matchAll(INLINE)) {
      lines(text.slice(at, m.index), parent);
      at = m.index + m[0].length;
      if (m[2] !== undefined) {
        parent.append(el("code", m[2].length > 2 && /^ .* $/.test(m[2]) ? m[2].slice(1, -1) : m[2]));
      } else if (m[3] !== undefined || m[4] !== undefined) {
        parent.append(nested("strong", m[3] ?? m[4]));
      } else if (m[5] !== undefined) {
        parent.append(nested("del", m[5]));
      } else if (m[6] !== undefined || m[7] !== undefined) {
        parent.append(nested("em", m[6] ?? m[7]));
      } else if (m[8] !== undefined) {
        parent.append(SAFE_URL.test(m[9]) ? link(m[9], nested("span", m[8]).childNodes) : document.createTextNode(m[0]));
      } else {
        parent.append(link(m[10], [document.createTextNode(m[10])]));
      }
    }
    lines(text.slice(at), parent);
    return parent;
  }

  function nested(tag, text) {
    return inline(text, document.createElement(tag));
  }

  function link(href, children) {
    const a = el("a", ...Array.from(children));
    a.href = href;
    a.target = "_blank";
    a.rel = "noopener noreferrer";
    return a;
  }

  function lines(text, parent) {
    text.split("\n").forEach((line, i) => {
      if (i > 0) parent.append(el("br"));
      if (line) parent.append(document.createTextNode(line));
    });
  }

  // -- blocks ---------------------------------------------------------------------------------------------------

  const indentOf = (line) => line.match(/^[ \t]*/)[0].replace(/\t/g, "    ").length;

  function startsBlock(line) {
    return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || LIST.test(line);
  }

  /** The blocks of `src` (an array of lines) from line `i` on, appended to `parent`. */
  function blocks(src, parent) {
    let i = 0;
    while (i < src.length) {
      const line = src[i];
      let m;
      if (!line.trim()) {
        i++;
      } else if ((m = FENCE.exec(line))) {
        i = fence(src, i, m, parent);
      } else if ((m = HEADING.exec(line))) {
        parent.append(inline(m[2] || "", document.createElement(`h${m[1].length}`)));
        i++;
      } else if (RULE.test(line)) {
        parent.append(el("hr"));
        i++;
      } else if (QUOTE.test(line)) {
        const body = [];
        while (i < src.length && src[i].trim() && (QUOTE.test(src[i]) || !startsBlock(src[i]))) {
          body.push(src[i++].replace(QUOTE, ""));
        }
        parent.append(blocks(body, document.createElement("blockquote")));
      } else if (LIST.test(line)) {
        i = list(src, i, parent);
      } else if (line.includes("|") && i + 1 < src.length && TABLE_RULE.test(src[i + 1]) && src[i + 1].includes("-")) {
        i = table(src, i, parent);
      } else {
        const body = [];
        while (i < src.length && src[i].trim() && (body.length === 0 || !startsBlock(src[i]))) {
          body.push(src[i++].trim());
        }
        parent.append(inline(body.join("\n"), document.createElement("p")));
      }
    }
    return parent;
  }

  function fence(src, i, m, parent) {
    const [marker, lang] = [m[1], m[2]];
    const close = new RegExp(`^ {0,3}${marker[0] === "`" ? "`" : "~"}{${marker.length},}[ \\t]*$`);
    const body = [];
    for (i++; i < src.length && !close.test(src[i]); i++) body.push(src[i]);
    const code = el("code", body.join("\n"));
    if (lang) {
      code.className = `language-${lang.replace(/[^\w+#.-]/g, "")}`;
      code.dataset.language = lang;
    }
    const pre = el("pre", code);
    if (lang) pre.dataset.language = lang;
    parent.append(pre);
    return i + 1;
  }

  function list(src, i, parent) {
    const first = LIST.exec(src[i]);
    const indent = indentOf(src[i]);
    const ordered = /\d/.test(first[2]);
    const node = document.createElement(ordered ? "ol" : "ul");
    if (ordered && parseInt(first[2], 10) !== 1) node.start = parseInt(first[2], 10);
    while (i < src.length) {
      const m = LIST.exec(src[i]);
      if (!m || indentOf(src[i]) !== indent || /\d/.test(m[2]) !== ordered) break;
      const offset = indent + m[2].length + 1;
      const body = [m[3]];
      for (i++; i < src.length; i++) {
        const line = src[i];
        if (!line.trim()) {
          const next = src.slice(i + 1).find((l) => l.trim());
          if (next === undefined || indentOf(next) <= indent) break;
          body.push("");
        } else if (indentOf(line) > indent) {
          body.push(line.replace(new RegExp(`^[ \\t]{0,${offset}}`), ""));
        } else if (!startsBlock(line) && body[body.length - 1] !== "") {
          body.push(line.trim()); // a lazy continuation of the item's paragraph
        } else {
          break;
        }
      }
      const item = blocks(body, document.createElement("li"));
      if (item.childElementCount === 1 && item.firstElementChild.tagName === "P") {
        item.replaceChildren(...item.firstElementChild.childNodes); // a tight item: its text without a <p>
      }
      node.append(item);
      while (i < src.length && !src[i].trim()) i++;
    }
    parent.append(node);
    return i;
  }

  function cells(line) {
    let row = line.trim();
    if (row.startsWith("|")) row = row.slice(1);
    if (row.endsWith("|") && !row.endsWith("\\|")) row = row.slice(0, -1);
    return row.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, "|"));
  }

  function table(src, i, parent) {
    const head = cells(src[i]);
    const align = cells(src[i + 1]).map((c) => (c.endsWith(":") ? (c.startsWith(":") ? "center" : "right") : ""));
    const row = (values, tag) => el("tr", ...head.map((_, k) => {
      const cell = inline(values[k] || "", document.createElement(tag));
      if (align[k]) cell.style.textAlign = align[k];
      return cell;
    }));
    const body = el("tbody");
    for (i += 2; i < src.length && src[i].trim() && src[i].includes("|"); i++) body.append(row(cells(src[i]), "td"));
    parent.append(el("table", el("thead", row(head, "th")), body));
    return i;
  }

  /** A DocumentFragment of `text` rendered as Markdown. */
  function render(text) {
    return blocks(String(text).replace(/\r\n?/g, "\n").split("\n"), document.createDocumentFragment());
  }

  window.llamactxMarkdown = { render };
})();
