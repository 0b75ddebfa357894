"""Course tooling for maintainers and instructors: executing the notebooks (``execute``,
``standalone``), the site (``site``), the handout and the learner's workspace (``student``,
``assignment``, ``package``, ``learn``), grading (``grade`` orchestrates, ``reports`` writes,
``probe_driver``/``probe_runner``, ``sandbox``, ``kernel_run``, ``flags``, ``submissions``,
``gradescope``), and the maintainers' ``bench``, ``gpu_check`` (the core on a GPU, measured)
and ``figures``.

Not needed by students' code: the notebooks never import it and the handout leaves it out.
"""
