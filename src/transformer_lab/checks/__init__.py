"""Exercise checks: one line in a notebook's check cell, the same verdict in the grader.

    from transformer_lab.checks import check
    check("check-softmax-forward")          # your core function(s) in transformer_lab/core
    check("check-logsumexp", logsumexp)     # a function you wrote in the notebook

Each check lives in ``nbNN_topic.py`` beside this file (see :mod:`.framework` for how a check
is written). A failure names the case, shows what was expected against what came back and,
where it recognises one, the mistake behind it.
"""

from transformer_lab.checks.framework import (
    REGISTRY,
    Case,
    Check,
    CheckFailed,
    check,
    get_check,
    load_checks,
    register,
)

__all__ = ["REGISTRY", "Case", "Check", "CheckFailed", "check", "get_check", "load_checks",
           "register"]
