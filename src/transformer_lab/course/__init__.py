"""Course tooling for maintainers and instructors: executing the notebooks (``execute``, in
the kernels' environment of ``kernel_env``; ``standalone``; ``portability``, under every BLAS
kernel), the site (``site``, with ``sphinx_attachments``), the handout and the learner's
workspace (``student``, ``assignment``, ``package``, ``learn``; ``versions``, the course
version each records), grading (``grade`` orchestrates, ``reports`` writes,
``probe_driver``/``probe_runner``, ``sandbox``, ``kernel_run``, ``flags``, ``untrusted``,
``submissions``, ``gradescope``), and the maintainers' ``bench``, ``gpu_check`` (the core on a
GPU, measured) and ``figures``.

Not needed by students' code: the notebooks never import it and the handout leaves it out.
"""
