// Code in running text, headings and the page's contents (right sidebar): let a long name,
// `flash_self_attention_backward` or `transformer_lab.attention`, break after an underscore or
// a dot between two letters or digits rather than at any letter (`.venv/bin/python` keeps its
// leading dot).
document.addEventListener("DOMContentLoaded", () => {
  const names = "article.bd-article code.literal span.pre, " +
                ".bd-sidebar-secondary nav.page-toc code span.pre";
  for (const pre of document.querySelectorAll(names)) {
    const parts = pre.textContent.split(/(?<=\w[_.])(?=\w)/);
    if (parts.length < 2) continue;
    pre.textContent = "";
    parts.forEach((part, k) => {
      pre.append(part);
      if (k < parts.length - 1) pre.append(document.createElement("wbr"));
    });
  }
});
