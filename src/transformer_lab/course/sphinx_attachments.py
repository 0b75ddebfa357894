"""Sphinx extension of the course site: show the figures notebooks carry as cell attachments.

myst-nb renders ``![alt](attachment:NAME)`` as an image whose file ``attachment:NAME`` does not
exist. Before Sphinx collects a page's images, this extension writes each such attachment of
the page's notebook into ``_attachments/<page>/NAME`` under the site's source folder and points
the image there. The notebook itself is left as it is, so the copy the site offers for
download still carries its figures. Enabled in ``docs/conf.py``.
"""

from __future__ import annotations

from pathlib import Path

PREFIX = "attachment:"


def notebook_attachments(path: Path) -> dict[str, bytes]:
    """Name -> bytes of every image attachment of the notebook at ``path`` (the first cell's,
    where two cells attach the same name)."""
    import nbformat

    from transformer_lab.course.standalone import _decoded

    found: dict[str, bytes] = {}
    for cell in nbformat.read(path, as_version=4).cells:
        for name, bundle in cell.get("attachments", {}).items():
            data = _decoded(bundle)
            if data is not None:
                found.setdefault(name, data)
    return found


def resolve_attachments(app, doctree) -> None:
    """``doctree-read`` handler: images pointing at ``attachment:NAME`` -> files."""
    from docutils import nodes

    images = [n for n in doctree.findall(nodes.image) if n["uri"].startswith(PREFIX)]
    source = Path(app.env.doc2path(app.env.docname))
    if not images or source.suffix != ".ipynb":
        return
    data = notebook_attachments(source)
    folder = Path(app.srcdir) / "_attachments" / app.env.docname
    for node in images:
        name = node["uri"][len(PREFIX):]
        if name in data:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data[name])
            node["uri"] = f"/_attachments/{app.env.docname}/{name}"  # "/": from the source root


def setup(app):
    # Before Sphinx's own image collector (priority 500), which would report the file missing.
    app.connect("doctree-read", resolve_attachments, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
