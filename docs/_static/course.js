// The page's contents (right sidebar): let a long name in code, `flash_self_attention_backward`,
// break after an underscore rather than at any letter (course.css lets it break anywhere).
document.addEventListener("DOMContentLoaded", () => {
  for (const pre of document.querySelectorAll(".bd-sidebar-secondary nav.page-toc code span.pre")) {
    const parts = pre.textContent.split("_");
    if (parts.length < 2) continue;
    pre.textContent = "";
    parts.forEach((part, k) => {
      pre.append(k < parts.length - 1 ? part + "_" : part);
      if (k < parts.length - 1) pre.append(document.createElement("wbr"));
    });
  }
});
