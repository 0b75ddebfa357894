"""What a failing check cell says (issue 21): the culprit named first, the student's own line,
where two arrays that print alike differ, and hints that name the right cause.

Each test applies a mistake -- a mutant of the catalogue (``tests/mutants.py``) where there is
one -- to the solution and runs the check as the notebook's check cell does
(``framework.check``), so the message asserted is the one a student reads.
"""

from __future__ import annotations

import warnings

import pytest
from mutants import CATALOGUE, Mutant
from mutation_tools import (
    core_from,
    exercise_cells,
    exercise_namespace,
    fresh_core,
    mutated_core_source,
)

from transformer_lab import syllabus
from transformer_lab.checks import framework as F

CULPRIT = "fix it, then run this check again"


def _mutant(where: str, models: str) -> Mutant:
    found = [m for m in CATALOGUE if m.where == where and models in m.models]
    assert len(found) == 1, (where, models, found)
    return found[0]


def message(check_id: str, where: str, old: str, new: str,
            exercise: tuple[str, str, str] | None = None) -> str:
    """The check cell's message for the solution with ``old`` -> ``new`` in ``where`` (a core
    function, or "NN_topic/exercise-cell"); for a core edit, ``exercise`` (cell id, old, new)
    edits the notebook's exercise as well (a right variant that calls the core function)."""
    chk = F.get_check(check_id)
    if "/" in where:
        notebook, cell = where.split("/")
        namespace = exercise_namespace(notebook, cell, old, new)
        core, given = None, [namespace[name] for name in chk.arguments]
    else:
        module, source = mutated_core_source(where, old, new)
        core, given = fresh_core({module: source}), []
        if chk.arguments:  # the notebook's function, calling the mutated core
            cell, *edit = exercise or (exercise_cells(chk.notebook)[0], None, None)
            namespace = exercise_namespace(chk.notebook, cell, *edit)
            namespace.update({name: getattr(core[module], name)
                              for name in syllabus.TAUGHT_IN[module] if name in namespace})
            given = [namespace[name] for name in chk.arguments]
    with core_from(core), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(F.CheckFailed) as failed:
            F.check(check_id, *given)
    return str(failed.value)


def mutant_message(check_id: str, where: str, models: str) -> str:
    m = _mutant(where, models)
    return message(check_id, m.where, m.old, m.new)


# --------------------------------------------------------------------------------------------
# The dependency table


def test_a_check_depends_on_the_checks_of_what_it_calls_only():
    names = {c.id for c in F.dependency_checks(F.get_check("check-mha-backward"))}
    assert {"check-merge-heads", "check-split-heads", "check-softmax-forward",
            "check-attention-batched", "check-linear-backward"} <= names
    # its own functions' checks and later notebooks' checks are not among them
    assert not names & {"check-mha-forward", "check-mha-backward", "check-flash-forward"}
    assert not F.dependency_checks(F.get_check("check-softmax-forward"))


# --------------------------------------------------------------------------------------------
# 1. The culprit named


def test_a_wrong_merge_heads_is_named_by_the_multi_head_backward_check():
    msg = mutant_message("check-mha-backward", "merge_heads", "without swapping back")
    first = msg.split("\n")[1]
    assert first.startswith("`merge_heads` (notebook 04 §2) fails `check-merge-heads`; " + CULPRIT)
    assert "dquery" in msg  # the original failure follows


def test_a_wrong_softmax_is_named_by_the_cosine_attention_exercise():
    """The exercise calls the package's softmax_forward (a right way to write it), whose
    maximum is the whole array's: the check names softmax_forward, read from the exercise's
    code."""
    m = _mutant("softmax_forward", "the maximum of the whole array")
    msg = message("check-cosine-attention", m.where, m.old, m.new,
                  exercise=("exercise-cosine-attention", "weights = softmax(scores, axis=-1)",
                            "weights, _ = softmax_forward(scores)"))
    assert "`softmax_forward` (notebook 01 §3) fails `check-softmax-forward`; " + CULPRIT in msg


def test_the_scale_bug_of_03_is_named_by_the_multi_head_checks():
    for check_id in ("check-mha-forward", "check-self-attention-forward"):
        msg = mutant_message(check_id, "attention_forward", "q.shape[1]")
        assert ("`attention_forward` (notebook 03 §4) fails `check-attention-batched`; "
                + CULPRIT) in msg, msg


def test_an_unguarded_softmax_is_named_by_the_attention_empty_rows_check():
    msg = mutant_message("check-attention-empty-rows", "softmax_forward",
                         "no guard for a row of -inf")
    assert "`softmax_forward` (notebook 02 §4) fails `check-softmax-empty-rows`" in msg
    assert "a softmax of its own" not in msg


def test_no_culprit_when_the_functions_called_are_right():
    m = next(m for m in CATALOGUE if m.where == "multi_head_attention_backward")
    msg = message("check-mha-backward", m.where, m.old, m.new)
    assert CULPRIT not in msg


# --------------------------------------------------------------------------------------------
# 2. Messages that point at the student


def test_an_error_inside_numpy_shows_the_students_line_too():
    msg = message("check-merge-heads", "merge_heads",
                  "return x.transpose(0, 2, 1, 3).reshape(B, T, H * Dh)",
                  "return np.concatenate(np.split(x, H, axis=4), axis=-1)")
    assert "(at core/multihead.py, line" in msg and ", in merge_heads: " in msg
    assert "; raised in " in msg and "in split" in msg


def test_outputs_that_print_alike_show_the_largest_difference():
    msg = mutant_message("check-rms-norm", "03_minibatching/exercise-rms-norm",
                         "eps added outside")
    assert "largest difference" in msg and "at [" in msg


def test_attention_indexes_carry_the_docstrings_axis_names():
    msg = mutant_message("check-merge-masks", "merge_masks", "padded queries blocked")
    assert "[b=1, h=0, t=2, s=0]" in msg
    msg = mutant_message("check-mha-backward", "merge_heads", "without swapping back")
    assert "[b=" in msg and ", t=" in msg and ", e=" in msg


def test_indexes_beyond_attention_carry_axis_names_too():
    msg = mutant_message("check-find-the-bug", "09_verification/exercise-find-the-bug",
                         "mask over the queries")
    assert "[b=0, t=" in msg and ", e=0]" in msg, msg
    named = {cid for cid, cls in F.REGISTRY.items() if cls.axes}
    assert {"check-encoder-layer", "check-gpt-block", "check-flash-backward",
            "check-cross-entropy", "check-rope"} <= named


# --------------------------------------------------------------------------------------------
# 3. Hints that name the right cause


def test_a_missing_zero_sum_guard_is_not_blamed_on_the_maximum_alone():
    msg = mutant_message("check-softmax-empty-rows", "softmax_forward", "zero row sum")
    assert "0 / 0 is NaN" in msg and "divide by 1 where the sum is 0" in msg


def test_a_float32_gradient_promoted_by_a_bool_mask_times_a_float():
    msg = message("check-cross-entropy", "cross_entropy_backward",
                  "return log_softmax_backward(dlogp, c_logp)",
                  "return log_softmax_backward(dlogp, c_logp) * (keep * 1.0)[..., None]")
    assert "expected a float32 array, got float64" in msg
    assert "a bool or integer array times a Python float" in msg


def test_the_ignore_index_default_is_named_in_the_loss():
    msg = mutant_message("check-transformer-loss", "transformer_loss", "ignore_index")
    assert "ignore_index" in msg and "-100" in msg
    assert "times the expected one" not in msg


@pytest.mark.parametrize(("check_id", "where", "models", "cause"), [
    ("check-merge-masks", "merge_masks", "padded queries blocked", "padded queries"),
    ("check-find-the-bug", "09_verification/exercise-find-the-bug", "without the transpose",
     "merged by a reshape alone"),
    ("check-find-the-bug", "09_verification/exercise-find-the-bug", "mask over the queries",
     "padding mask on the query axis"),
    ("check-merge-heads", "merge_heads", "without swapping back", "without first swapping"),
    ("check-sliding-window", "02_masking/exercise-sliding-window", "window + 1",
     "seeing window + 1 positions"),
    ("check-adam-step", "adam_step", "not updated in place", "rebinding m instead of updating"),
    ("check-rmsprop", "10_training/exercise-rmsprop", "eps inside", "eps inside the square root"),
    ("check-gpt-rms-norm", "rms_norm_forward", "eps added outside",
     "eps added outside the square root"),
])
def test_the_notebooks_demonstrated_mistakes_get_their_hint(check_id, where, models, cause):
    msg = mutant_message(check_id, where, models)
    assert "Hint: this is what you get" in msg and cause in msg, msg


def test_a_culprit_is_never_a_check_the_student_has_not_reached():
    """check-gpt-block (13 §3) depends on self_attention_forward, which check-grouped-query-
    attention (15 §4) tests extended: a failure in 13 must not send the student to 15."""
    F.load_checks()
    block = [c.id for c in F.dependency_checks(F.get_check("check-gpt-block"))]
    assert "check-grouped-query-attention" not in block
    assert "check-causal-self-attention" in block and "check-self-attention-forward" in block
    assert F._place("self_attention_forward", "13_gpt") == "notebook 13 §3"
    assert F._place("self_attention_forward", "14_decoding") == "notebook 13 §3"
    assert F._place("self_attention_forward", "15_modern_block") == "notebook 15 §4"
    assert F._place("merge_heads", "13_gpt") == "notebook 04 §2"
