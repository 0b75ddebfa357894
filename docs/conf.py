# Sphinx configuration of the course site, built offline from the executed notebooks:
#   python -m transformer_lab.course.site      (part of `make`)
# The notebooks are rendered as executed by `make`; Sphinx never runs them itself.

project = "Transformers from Scratch"
author = "The Transformers from Scratch maintainers"
copyright = "2026, " + author

extensions = [
    "myst_nb",
    "sphinx-mathjax-offline",  # ships MathJax in _static: math renders without a network
    "transformer_lab.course.sphinx_attachments",  # figures stored in the notebooks
]
nb_execution_mode = "off"
myst_enable_extensions = ["dollarmath", "amsmath"]
# \text{valid\_lens}: MathJax reads \_ inside \text only with its textmacros package (shipped)
mathjax3_config = {"loader": {"load": ["[tex]/textmacros"]},
                   "tex": {"packages": {"[+]": ["textmacros"]}}}
myst_heading_anchors = 3
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
suppress_warnings = ["mystnb.unknown_mime_type"]

html_theme = "sphinx_book_theme"
html_title = project
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": True,
    "navbar_persistent": [],  # the search field once, in the sidebar, not also across the top
}
html_last_updated_fmt = None
# Long code lines and outputs scroll sideways in their cell, with a shadow at the edge that has
# more; the page's contents wrap long names in code (_static/course.css).
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_js_files = ["course.js"]  # names in code in the page's contents break after an underscore
