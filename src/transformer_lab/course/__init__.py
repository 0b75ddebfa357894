"""Course tooling for maintainers and instructors: executing notebooks, building the site.

Not needed by students' code; the notebooks never import it.
"""
