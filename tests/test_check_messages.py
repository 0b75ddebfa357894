"""What a failing check cell says (issue 21): the culprit named first, the student's own line,
where two arrays that print alike differ, and hints that name the right cause.

Each test applies a mistake -- a mutant of the catalogue (``tests/mutants.py``) where there is
one -- to the solution and runs the check as the notebook's check cell does
(``framework.check``), so the message asserted is the one a student reads.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from handout_tools import check_as_in_handout
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
ROOT = Path(__file__).resolve().parent.parent


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


def test_a_wrong_optimiser_step_is_named_by_the_train_step_check():
    """train_step reaches adam_step through optim.Adam, which the syllabus's calls (read from
    the code of train_step) do not show: its failure named nothing (an instructor's trial)."""
    chk = F.get_check("check-train-step")
    assert {"sgd_step", "adam_step", "transformer_loss", "cross_entropy_forward"} <= \
        F.depends_on(chk)
    assert {"check-sgd-step", "check-adam-step"} <= {c.id for c in F.dependency_checks(chk)}


def test_a_failing_check_of_several_functions_is_named_as_the_check():
    """check-causal-self-attention tests four functions: one wrong one does not make each of
    them "fail" -- the check is named, with what it tests."""
    msg = mutant_message("check-gpt-block", "causal_self_attention_forward", "no causal mask")
    assert msg.split("\n")[1].startswith(
        "`check-causal-self-attention`, the check of `self_attention_forward`, "
        "`self_attention_backward`, `causal_self_attention_forward` and "
        "`causal_self_attention_backward` (notebook 13 §3), fails"), msg
    assert "fails; fix what it names, then run this check again" in msg


@pytest.mark.parametrize(("where", "models", "named", "check_ids"), [
    ("rope_forward", "the rotation by minus the angle", "`check-rope`, the check of ",
     ("check-modern-block", "check-modern-gpt", "check-gpt-tiled-attention")),
    ("repeat_kv_forward", "tiled instead of repeated", "`check-grouped-query-attention`, the ",
     ("check-modern-block", "check-gpt-tiled-attention")),  # modern-gpt's 1 kv head: no tiling
])
def test_a_check_that_also_tests_a_function_the_block_does_not_call_is_named(where, models,
                                                                             named, check_ids):
    """check-rope tests rope_tables too, which the block is given the output of; check-grouped-
    query-attention the decoding step too: neither was named, and the modern block's culprit
    was the block check (a student's trial)."""
    for check_id in check_ids:
        msg = mutant_message(check_id, where, models)
        assert msg.split("\n")[1].startswith(named), (check_id, msg)


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


def test_an_error_in_a_called_function_names_the_function_under_test_too():
    """multi_head_attention_forward projecting the keys from the query: the error comes out
    of attention_forward, a right function; the message names the call in multihead.py."""
    msg = message("check-mha-forward", "multi_head_attention_forward",
                  "k, c_k = linear_forward(key,", "k, c_k = linear_forward(query,")
    assert "in attention_forward" in msg and \
        "called from core/multihead.py, line" in msg and "in multi_head_attention_forward" in msg


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
    msg = mutant_message("check-transformer-loss", "transformer_loss", "ignore_index not passed")
    assert "ignore_index" in msg and "-100" in msg
    assert "times the expected one" not in msg


def test_a_written_in_ignore_index_is_named():
    msg = mutant_message("check-transformer-loss", "transformer_loss", "-1 written in")
    assert "writing in -1 instead of using the argument ignore_index" in msg


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
    ("check-residual", "residual_backward", "post-norm: dout given to the sublayer",
     "with dout given to the sublayer's backward"),
    ("check-residual", "residual_backward", "pre-norm: the norm's backward first",
     "with the backward passes in the forward's order"),
    ("check-adam-step", "adam_step", "AdamW's shrink of p after", "shrinking p after the update"),
    ("check-feed-forward", "feed_forward_forward", "the activation argument not passed",
     "with ReLU whatever the activation argument says"),
    ("check-gelu", "gelu_backward", "(1 - t) instead of (1 - t^2)", "tanh' = 1 - t where"),
    ("check-gelu", "gelu_backward", "the 3 of the cube's derivative", "1 + 0.044715 x^2"),
    ("check-dropout", "dropout_backward", "the mask inverted", "inverts the mask (~keep)"),
    ("check-dropout", "dropout_backward", "the mask ignored", "ignores the mask"),
    ("check-softmax-forward", "softmax_forward", "out returned without y written",
     "returning out without writing y into it"),
    ("check-decoder-step", "transformer_decode_step", "the target's embedding not scaled",
     "without the embedding's scale sqrt(E)"),
    ("check-logsumexp", "01_attention/exercise-logsumexp", "every axis of length 1 squeezed",
     "squeezing every axis of length 1 (np.squeeze(out))"),
    ("check-label-smoothed-loss", "label_smoothed_loss_forward", "padding taken to be the neg",
     "taking the padding to be the negative targets"),
    ("check-transformer-forward", "transformer_decode", "the target padding left out",
     "with the target padding left out of the decoder's self-attention mask"),
    ("check-decoder-layer", "decoder_layer_forward", "the memory mask not passed",
     "with the memory mask left out of the cross-attention"),
    ("check-decoder-layer", "decoder_layer_forward", "the target mask not passed",
     "with the target mask left out of the self-attention"),
    ("check-grouped-query-attention", "repeat_kv_backward", "the mean of the query heads'",
     "with repeat_kv_backward averaging the gradients"),
    ("check-grouped-query-attention", "causal_self_attention_forward",
     "RoPE applied to the values", "with RoPE turning the values too"),
    ("check-layer-norm-backward", "layer_norm_backward", "mean(dout * xhat) where",
     "with mean(dout * xhat) where mean(g * xhat) belongs"),
    ("check-layer-norm-forward", "layer_norm_forward", "the cached xhat scaled and shifted",
     "with the cached xhat changed in place"),
    ("check-layer-norm-forward", "layer_norm_forward", "the standard deviation cached",
     "with the standard deviation sqrt(var + eps) cached"),
    ("check-attention-backward", "attention_backward", "1 / sqrt(d_k) in place of the cached",
     "with 1 / sqrt(d_k) in dq and dk instead of the scale the forward used"),
    ("check-flash-forward", "flash_attention_forward", "the accumulator not rescaled",
     "with the output accumulator not rescaled"),
    ("check-flash-forward", "flash_attention_forward", "the diagonal tile skipped",
     "skipping the diagonal tile"),
    ("check-flash-backward", "flash_attention_backward", "dk and dv given each tile's part",
     "assigned (=) instead of added (+=)"),
    ("check-flash-backward", "flash_attention_backward", "dq given each tile's part",
     "assigned (=) instead of added (+=)"),
    ("check-flash-backward", "flash_attention_backward", "D forgotten", "without D"),
    ("check-flash-backward", "flash_attention_backward", "D as rowsum(dO)",
     "with D = rowsum(dO), the output O forgotten"),
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


# --------------------------------------------------------------------------------------------
# 4. A student's trial of notebooks 11 and 12: each mistake named by its own check


@pytest.mark.parametrize(("check_id", "where", "models", "cause"), [
    ("check-bytes-to-unicode", "bytes_to_unicode", "soft hyphen", "the soft hyphen, byte 173"),
    ("check-pretokenize", "pretokenize", r"\d for \p{N}", r"with \d for the digits"),
    ("check-pretokenize", "pretokenize", r"[^\W\d_] for \p{L}", r"with [^\W\d_] for the letters"),
    ("check-pretokenize", "pretokenize", "any case", "matching the contractions in any case"),
    ("check-pretokenize", "pretokenize", "no lookahead", r"without \s+(?!\S)"),
    ("check-merge-pair", "merge_pair", "a list returned", "returning a list"),
    ("check-merge-pair", "merge_pair", "overlapping pairs", "moving on by one id after a merge"),
    ("check-modern-gpt", "gpt_forward", "RoPE's tables not passed", "with rope=None in the blocks"),
    ("check-modern-gpt", "gpt_step", "RoPE's tables not passed", "with rope=None in the blocks"),
    ("check-encode-word", "encode_word", "the latest merge first", "the latest learned pair"),
    ("check-beam-step", "beam_step", "no length normalisation", "no length normalisation"),
    ("check-beam-step", "beam_step", "mean log-probability", "by the mean log-probability"),
    ("check-beam-step", "length_penalty", "integer division", "with // in the length penalty"),
    ("check-beam-step", "length_penalty", "exponent forgotten", "exponent alpha forgotten"),
    ("check-beam-step", "beam_step", "grows in length", "finished hypotheses growing"),
    ("check-beam-step", "beam_step", "extended after EOS", "extended by real tokens"),
    ("check-beam-step", "beam_step", "dropped from the beam", "finished hypotheses dropped"),
    ("check-beam-search", "beam_search", "b * K forgotten", "offset b * K forgotten"),
    ("check-beam-search", "beam_search", "not gathered", "prefixes not gathered by parent"),
    ("check-beam-search", "beam_search", "K copies", "K live copies of <s>"),
    ("check-beam-search", "beam_search", "never stopping early", "never stopping early"),
    ("check-decoder-step", "cached_self_attention_step", "causal_mask(t, length + t)",
     "the mask causal_mask(t, length + t)"),
    ("check-decoder-step", "cached_self_attention_step", "no causal mask",
     "without a causal mask among the new positions"),
    ("check-decoder-step", "cached_self_attention_step", "start of the cache",
     "written at the start of the cache"),
    ("check-decoder-step", "cached_self_attention_step", "new positions only",
     "attending to the new positions only"),
    ("check-decoder-step", "transformer_decode_step", "from 0 again", "positions counted from 0"),
    ("check-decoder-step", "transformer_decode_step", "final norm", "final layer norm"),
    ("check-decoder-step", "transformer_decode_step", "padding ignored", "padding not masked"),
    ("check-decoder-step", "decoder_layer_step", "memory mask", "padding not masked"),
    ("check-mha-forward", "multi_head_attention_forward", "mask not passed", "without the mask"),
    ("check-mha-forward", "multi_head_attention_forward", "output bias left out",
     "without the bias b_o"),
    ("check-mha-forward", "multi_head_attention_forward", "from the key input",
     "the values from key instead of value"),
    ("check-self-attention-forward", "self_attention_forward", "mask not passed",
     "without the mask"),
    ("check-self-attention-forward", "self_attention_forward", "packed bias ignored",
     "without the bias b_qkv"),
    ("check-self-attention-forward", "self_attention_forward", "output bias ignored",
     "without the bias b_o"),
    ("check-self-attention-forward", "self_attention_forward", "keys used as values",
     "with the keys as values"),
    ("check-masked-mean", "03_minibatching/exercise-masked-mean", "the padding averaged in",
     "the padding summed in too"),
    ("check-masked-mean", "03_minibatching/exercise-masked-mean", "the mask itself inverted",
     "the mask inverted"),
    ("check-prefix-lm", "02_masking/exercise-prefix-lm", "| instead of &", "with | where &"),
    ("check-cross-mask", "02_masking/exercise-cross-mask", "& instead of |", "with & where |"),
    ("check-cross-mask", "02_masking/exercise-cross-mask", "lengths swapped",
     "the key lengths used for the queries too"),
    ("check-gelu", "gelu_forward", "erf(x / 2)", "with erf(x / 2)"),
    ("check-gelu", "gelu_forward", "x^2 instead of x^3", "with x^2 where x^3 belongs"),
    ("check-positional-encoding", "positional_encoding", "base ignored", "base 10000 written in"),
    ("check-adam-step", "adam_step", "without the bias correction of v",
     "without the bias correction of v"),
    ("check-top-k-filter", "top_k_filter", "the k-th largest filtered out", "with > where >="),
    ("check-min-p-filter", "14_decoding/exercise-min-p-filter", "absolute threshold",
     "p_min as an absolute threshold"),
    ("check-top-k-filter", "top_k_filter", "exactly k kept", "keeping exactly k"),
    ("check-flash-self-attention", "flash_self_attention_forward", "always causal",
     "with causal=True where causal=False is given"),
    ("check-cross-entropy", "cross_entropy_forward", "the loss of the padded positions counted",
     "the padded positions' loss counted"),
    ("check-cross-entropy", "cross_entropy_backward", "the padded positions given a gradient",
     "the padded positions given a gradient"),
    ("check-cross-entropy", "cross_entropy_forward", "reduction ignored", "reduction ignored"),
    ("check-feed-forward", "feed_forward_forward", "the second bias", "without the second bias"),
    ("check-feed-forward", "feed_forward_backward", "the activation's backward skipped",
     "the activation's backward skipped"),
    ("check-dropout", "dropout_forward", "train ignored", "dropping in evaluation mode too"),
    ("check-embed", "embed_forward", "the positions forgotten", "without the positions"),
    ("check-encoder-layer", "encoder_layer_forward", "the activation not passed",
     "with ReLU whatever the activation"),
    ("check-encoder-stack", "encoder_forward", "the mask not passed",
     "the mask not passed to the layers"),
    ("check-decoder-stack", "decoder_forward", "the memory mask not passed",
     "the memory mask not passed to the layers"),
    ("check-transformer-forward", "transformer_encode", "the source padding ignored",
     "the source padding left out of the encoder"),
    ("check-transformer-forward", "transformer_encode", "always scaled",
     "scaled by sqrt(E) whatever config.scale_embeddings"),
    ("check-next-token-loss", "next_token_loss_forward", "the mean over B * T",
     "dividing by B * T"),
    ("check-next-token-loss", "next_token_loss_backward", "the gradient put at positions",
     "the gradient put at positions 1 .. T - 1"),
    ("check-sample-next", "sample_next", "temperature ignored", "ignoring the temperature"),
    ("check-sample-next", "sample_next", "top_k ignored", "ignoring top_k"),
    ("check-sample-next", "sample_next", "the filters in the other order",
     "with top-p before top-k"),
    ("check-rmsprop", "10_training/exercise-rmsprop", "lr folded into the momentum buffer",
     "with lr inside the momentum buffer"),
    ("check-label-smoothed-loss", "label_smoothed_loss_forward", "divided by every position",
     "dividing by every position"),
    ("check-beam-step", "beam_step", "the lengths not gathered", "lengths not gathered"),
    ("check-beam-step", "beam_step", "lengths before the step", "lengths before the step"),
    ("check-gpt-model", "gpt_backward", "the output projection's share",
     "the table's gradient from the lookup only"),
    ("check-gpt-dropout", "gpt_forward", "the generator not passed",
     "without dropout while training"),
    ("check-flash-forward", "flash_attention_forward", "the diagonal tile not masked",
     "with the diagonal tile not masked"),
    ("check-flash-backward", "flash_attention_backward", "the future tiles visited",
     "visiting the future tiles too"),
    ("check-swiglu", "silu_forward", "sigmoid(2x)", "with sigmoid(2a) for sigmoid(a)"),
    ("check-swiglu", "silu_backward", "x * s instead", "sigmoid(a) (1 + a sigmoid(a))"),
    ("check-swiglu", "swiglu_forward", "the gate's input multiplied", "the gate's input a"),
    ("check-swiglu", "swiglu_backward", "the up projection's path",
     "without the up projection's path"),
])
def test_the_trials_mistakes_get_their_hint(check_id, where, models, cause):
    msg = mutant_message(check_id, where, models)
    assert "Hint: this is what you get" in msg and cause in msg, msg


@pytest.mark.parametrize("m", [m for m in CATALOGUE if m.hint],
                         ids=lambda m: f"{m.where}: {m.models}")
def test_a_mutant_s_hint_is_named_by_its_first_check(m: Mutant):
    msg = message(m.checks[0], m.where, m.old, m.new)
    assert m.hint in msg, msg


def test_the_trials_misleading_hints_are_gone():
    msg = mutant_message("check-bytes-to-unicode", "bytes_to_unicode", "soft hyphen")
    assert "chr(b)" not in msg  # one entry of the 256 matched "every byte its own character"
    msg = mutant_message("check-pretokenize", "pretokenize", "no lookahead")
    assert "optional space" not in msg
    msg = mutant_message("check-encode-word", "encode_word", "the latest merge first")
    assert "or the latest learned pair first" in msg  # both mistakes give this case's answer
    for models in ("new pairs not added back", "a tie broken by the larger pair"):
        assert "times the expected one" not in mutant_message("check-train-bpe", "train_bpe",
                                                              models)


def test_tokens_of_another_kind_or_shape_are_named_by_what_came_back():
    for models, got in (("as floats", "got '(40000,), float64 numbers'"),
                        ("(B, 1) column", "got '(40000, 1), integers'")):
        msg = mutant_message("check-sample-next", "sample_next", models)
        assert "output[\"the tokens' shape (one per row) and kind\"]: expected '(40000,), " \
               "integers', " + got in msg, msg


@pytest.mark.parametrize("models", ["recounted after every merge (the right merges",
                                    "recounted inline after every merge"])
def test_a_recount_after_every_merge_is_counted(models):
    """Its merges are right: the times the given byte ids are hashed tell it, whether the
    recount calls pair_counts or counts inline."""
    msg = mutant_message("check-train-bpe", "train_bpe", models)
    assert "output['byte ids hashed (a look-up of a pair in a dict or a set hashes its two " \
           "ids)']: expected \"fewer than a recount's" in msg, msg
    assert "the work of a recount after every merge (update the counts" in msg


@pytest.mark.parametrize(("check_id", "where", "models"), [
    ("check-layer-norm-forward", "layer_norm_forward", "eps ignored"),
    ("check-encoder-layer", "encoder_layer_forward", "eps not passed to the first residual"),
    ("check-decoder-stack", "decoder_forward", "eps not passed to the final norm"),
    ("check-transformer-forward", "transformer_encode", "the config's eps not passed"),
    ("check-gpt-block", "gpt_block_forward", "config.eps not passed to the first norm"),
])
def test_an_eps_not_passed_on_is_named(check_id, where, models):
    """A case that gives eps (a keyword, or a config's) names the answer that leans towards a
    default eps -- an eps left out of every call, or of one norm's."""
    msg = mutant_message(check_id, where, models)
    assert "the case gives eps = 0.1, and your answer is off in the direction of the one with " \
           "eps = 1e-05" in msg, msg


def test_the_eps_hint_is_not_given_for_another_mistake():
    """Off by another cause (noise, the sign), the answer does not lean towards the default
    eps's. (A plain factor gets the factor's hint, which comes first.)"""
    chk = F.get_check("check-layer-norm-forward")
    case = next(c for c in F.all_cases(chk) if c.kwargs.get("eps") == 0.1)
    want = chk.expected(*case.args, **case.kwargs)["out"]
    default = chk.expected(*case.args, **{**case.kwargs, "eps": 1e-5})["out"]
    noise = np.random.default_rng(0).standard_normal(want.shape)

    def hint(got):
        return F._eps_hint(chk, case, F.Difference("output['out']", "", got, want), ["out"])
    assert "eps = 1e-05" in hint(default) and "eps = 1e-05" in hint((want + default) / 2)
    assert hint(want + 0.01 * noise) == hint(-want) == ""


def _generic(got, want) -> str:
    got, want = np.asarray(got), np.asarray(want)
    return F._generic_hint(F.Difference("output", "", got, want))


def test_a_sign_or_a_factor_is_named_for_float_outputs_only():
    assert _generic(261, 256) == "" and _generic([2, 4, 6], [1, 2, 3]) == ""  # ids, counts
    assert _generic([-1, -2], [1, 2]) == ""
    assert "2 times the expected one" in _generic([2.0, 4.0], [1.0, 2.0])
    assert "negative" in _generic([-1.0, -2.0], [1.0, 2.0])
    # one number is a factor times any other: only a plain factor is named
    assert _generic(2.8895, 2.2655) == "" and _generic(1.022 * 3.1, 3.1) == ""
    assert "0.2 times" in _generic(2.0, 10.0) and "0.5 times" in _generic(1.5, 3.0)
    mask = np.triu(np.ones((3, 3), bool), 1)
    assert "transpose" in _generic(mask.T, mask)  # a mask transposed is still named


@pytest.mark.parametrize(("check_id", "where", "models", "cause"), [
    ("check-beam-step", "beam_step", "grows in length", "finished hypotheses growing"),
    ("check-beam-search", "beam_search", "never stopping early", "never stopping early"),
    ("check-beam-step", "beam_step", "the parents' finished flags",
     "finished = (tokens == eos_id) alone"),
    ("check-train-bpe", "train_bpe", "a tie broken by the larger pair", "breaking a tie"),
    ("check-train-bpe", "train_bpe", "a tie broken by the pair counted first", "breaking a tie"),
    ("check-beam-step", "beam_step", "the lengths not gathered", "lengths not gathered by parent"),
    ("check-beam-step", "beam_step", "parent and token of a flat index swapped",
     "with K where V belongs in the flat index"),
    ("check-beam-search", "beam_step", "the first K kept", "the candidates not ranked"),
    ("check-beam-search", "length_penalty", "the exponent forgotten", "exponent alpha forgotten"),
])
def test_the_handout_names_the_mistakes_of_a_hidden_reference(check_id, where, models, cause,
                                                              tmp_path, monkeypatch):
    """The handout has neither the reference nor the mistakes: make student stores the answers
    of both for the public cases, and the hint comes from the stored ones."""
    check_as_in_handout(check_id, tmp_path, monkeypatch)
    msg = mutant_message(check_id, where, models)
    assert "Hint: this is what you get" in msg and cause in msg, msg


def test_a_list_of_another_length_says_where_it_first_differs():
    """Pieces, ids and merges of another count: the message shows the items from the first
    difference on, not only the two lengths."""
    msg = mutant_message("check-pretokenize", "pretokenize", "'re and 'd left out")
    assert "from [" in msg and "expected [\"'re\"" in msg, msg


def test_what_the_check_cannot_read_is_not_blamed_on_the_student_s_code(monkeypatch):
    """word_counts returning a list of the words, not a dict: the check's .items() fails in the
    check's own code, and the message says that what came back is of another kind than the
    docstring's."""
    from transformer_lab.checks import CheckFailed, check
    from transformer_lab.core import bpe

    right = bpe.word_counts
    monkeypatch.setattr(bpe, "word_counts", lambda text: list(right(text)))
    with pytest.raises(CheckFailed) as err:
        check("check-word-counts")
    msg = str(err.value)
    assert "could not read what your function returned" in msg and "your code raised" not in msg


@pytest.mark.parametrize("loaded", [False, True])
def test_a_core_module_that_does_not_parse_is_named_in_one_line(tmp_path, loaded):
    """An indentation slip in core/layers.py, then notebook 00's check-relu: a traceback through
    notebook 04's checks, PyTorch's interop and core/attention.py ended in the slip. Made after
    the module was loaded (``loaded``), as autoreload leaves it, the check passed the version
    from before the edit."""
    shutil.copytree(ROOT / "src" / "transformer_lab", tmp_path / "transformer_lab",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # a handout's package: its tables of the core were read from the solution when it was built
    (tmp_path / "transformer_lab" / "_built.py").write_text(
        f"CALLS = {syllabus.CALLS!r}\nTAUGHT_IN = {syllabus.TAUGHT_IN!r}\n")
    layers = tmp_path / "transformer_lab" / "core" / "layers.py"
    slip = layers.read_text().replace("def relu_forward(x):\n",
                                      "def relu_forward(x):\n  y = 1\n    z = 2\n", 1)
    first = "check('check-relu')\n" if loaded else ""
    done = subprocess.run([sys.executable, "-c", "import pathlib\n"
                           "from transformer_lab.checks import check\n"
                           f"{first}pathlib.Path({str(layers)!r}).write_text({slip!r})\n"
                           "check('check-relu')"], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=300)
    assert done.stdout.startswith("check-relu passed (") == loaded
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("transformer_lab.checks.framework.CheckFailed: check-relu did not "
                           f"run: {layers}, line ") and "does not parse (IndentationError" in last


@pytest.mark.parametrize("defaults", [F.DEFAULT_EPS, F.DEFAULT_EPS[::-1]])
def test_the_eps_hint_names_the_default_nearer_the_answer(defaults, monkeypatch):
    """rms_norm with its default 1e-5 written in: the hint names 1e-5, not LLaMA's 1e-6, in
    either order (both lean the same way; the nearer one is the one written in)."""
    monkeypatch.setattr(F, "DEFAULT_EPS", defaults)

    def rms_norm(x, gamma, eps=1e-5):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * gamma

    with pytest.raises(F.CheckFailed) as err:
        F.check("check-rms-norm", rms_norm)
    assert "off in the direction of the one with eps = 1e-05" in str(err.value)


def test_a_mask_where_none_belongs_is_shown_as_it_came_back(monkeypatch):
    """merge_masks(None, None) returning a (1, 1) mask was reported as the (B, H, T, S) array
    the check had broadcast it to."""
    from transformer_lab.core import attention

    right = attention.merge_masks
    monkeypatch.setattr(attention, "merge_masks", lambda a=None, k=None: right(a, k) if (
        a is not None or k is not None) else np.zeros((1, 1), bool))
    with pytest.raises(F.CheckFailed) as err:
        F.check("check-merge-masks")
    assert "expected None, got [[False]]" in str(err.value)


def _cells(*sources: str) -> dict:
    """The namespace of notebook cells run in turn, each source readable as IPython keeps it."""
    import linecache

    namespace: dict = {"np": np, "__name__": "__main__", "In": []}
    for k, source in enumerate(sources):
        filename = f"<cell {k}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102
        namespace["In"].append(source)
    return namespace


MASKED_MEAN = '''def masked_mean(H, lengths):
    m = (np.arange(H.shape[1]) < np.asarray(lengths)[:, None])[..., None]
    return SCALE * (H * m).sum(axis=1) / np.asarray(lengths)[:, None]
'''


OUTSIDE = {  # cells before the exercise cell, the exercise cell -> the names noted
    "another cell": (["SCALE = 1.0"], MASKED_MEAN, "`SCALE`"),
    "through a helper": (["SCALE = 1.0\ndef _scale():\n    return SCALE\n"],
                         MASKED_MEAN.replace("SCALE *", "_scale() *"), "`SCALE`"),
    "a lambda": (["SCALE = lambda: 1.0"], MASKED_MEAN.replace("SCALE *", "SCALE() *"),
                 "`SCALE`"),
    "a callable assigned": (["SCALE = np.float64"], MASKED_MEAN.replace(
        "SCALE *", "SCALE(1.0) *"), "`SCALE`"),
    "a default argument": (["SCALE = 1.0"], MASKED_MEAN.replace(
        "lengths):", "lengths, scale=SCALE):").replace("SCALE *", "scale *"), "`SCALE`"),
    "a global statement": (["SCALE = 1.0"], MASKED_MEAN.replace(
        "    m =", "    global SCALE\n    SCALE += 0\n    m ="), "`SCALE`"),
    "its own cell": ([], "SCALE = 1.0\n" + MASKED_MEAN, None),
    "another exercise cell": (["def logsumexp(x, axis=-1):\n    return x\n\n\nSCALE = 1.0"],
                              MASKED_MEAN, None),
    "a function": (["def SCALE_():\n    return 1.0\n"],
                   MASKED_MEAN.replace("SCALE *", "SCALE_() *"), None),
    "an import": (["from math import e as SCALE"], MASKED_MEAN.replace("SCALE *", "SCALE / "
                                                                        "2.718281828459045 *"),
                  None),
    "a star import": (["from math import *"], MASKED_MEAN.replace("SCALE *", "(e / e) *"), None),
}


@pytest.mark.parametrize("where", sorted(OUTSIDE))
def test_what_is_read_from_another_cell_is_noted_as_the_grader_drops_it(where, capsys):
    """A notebook function reading what an assignment bound in another cell (itself, through a
    notebook function it calls, in its def's line; data, a lambda, any value) passes in the
    notebook, but the grader runs only the functions, classes and imports of cells that define
    no exercise: the check says so, whether it passes or fails. What its own cell or another
    exercise cell binds, a def or an import, is no matter."""
    before, exercise, noted = OUTSIDE[where]
    namespace = _cells(*before, exercise)
    F.check("check-masked-mean", namespace["masked_mean"])
    out = capsys.readouterr().out
    note = (f"Note: `masked_mean` reads {noted} (itself, or a function it calls), set in "
            "another cell. The grader runs your exercise cells, but of the other cells only "
            "their functions, classes and imports (a variable or a lambda set there is left out)")
    assert (note in out) if noted else "Note:" not in out, out
    if where == "another cell":
        namespace["SCALE"] = 2.0  # now wrong as well: the note comes with the failure
        with pytest.raises(F.CheckFailed) as err:
            F.check("check-masked-mean", namespace["masked_mean"])
        assert note in str(err.value)


def test_gradients_of_biases_a_forward_made_up_are_explained(monkeypatch):
    """params.get("b_q", 0) in the forward passes its check (adding 0 changes nothing); the
    backward's check then finds gradients of biases the parameters do not hold, and says why."""
    from transformer_lab.core import multihead

    source = Path(multihead.__file__).read_text()
    for n in "qkvo":
        source = source.replace(f'params.get("b_{n}"))', f'params.get("b_{n}", 0))')
    namespace = dict(vars(multihead))
    exec(compile(source, multihead.__file__, "exec"), namespace)  # noqa: S102
    monkeypatch.setattr(multihead, "multi_head_attention_forward",
                        namespace["multi_head_attention_forward"])
    F.check("check-mha-forward")
    with pytest.raises(F.CheckFailed) as err:
        F.check("check-mha-backward")
    assert "has keys not expected ['b_k', 'b_o', 'b_q', 'b_v']" in str(err.value)
    assert "does the forward pass give a bias of 0, params.get('b_k', 0), where None belongs" \
        in str(err.value)


def test_a_name_the_grader_left_out_is_explained():
    """What the grader says when a variable of another cell is undefined there (the probe runs
    only the functions, classes and imports of the other cells): the failure names the rule.
    Not for a name undefined in a core module, where cells play no part."""
    namespace = _cells(MASKED_MEAN)  # SCALE, set in a cell the grader did not run
    with pytest.raises(F.CheckFailed) as err:
        F.check("check-masked-mean", namespace["masked_mean"])
    assert "your code raised NameError: name 'SCALE' is not defined" in str(err.value)
    assert "Hint: is `SCALE` set in a cell other than the exercise's? The grader runs your " \
        "exercise cells, but of the other cells only their functions, classes and imports" \
        in str(err.value)
    core = F.Outcome(error="NameError: name 'SCALE' is not defined",
                     where="core/layers.py, line 3, in linear_forward: return SCALE * x")
    assert "exercise" not in F._error_hint(core)


@pytest.mark.parametrize("a, b, words", [
    ((2, 3, 8), (2, 8), "one row per sequence"),  # a mean over T without keepdims
    ((2, 3, 8), (7, 8), "a row per position"),  # a positions table not sliced to T
    ((2, 3, 8), (2, 2, 8), "its queries' length"),  # a cross-attention's output of S positions
    ((2, 2, 5, 4), (2, 1, 1, 5), "queries and the keys swapped"),  # a padding mask, added
    ((2, 2, 5, 4), (2, 2, 4, 3), ""),  # weights * values where @ belongs: no hint of those
    ((2, 0, 8), (2, 3, 8), "has no entries along an axis"),  # an empty slice
])
def test_a_broadcast_error_is_explained_by_its_shapes(a, b, words):
    with pytest.raises(ValueError) as err:
        np.ones(a) + np.ones(b)
    hint = F._error_hint(F.Outcome(error=f"ValueError: {err.value}"))
    assert words in hint if words else hint == "", hint


def test_an_error_hint_names_only_what_the_check_s_notebook_has_taught():
    """Key/value heads come in notebook 15, tiles in 16: a notebook 04 student's matrix
    product or np.split is not explained by them (the notebook 04-06 trial)."""
    for make, cause in ((lambda: np.ones((2, 3, 4)) @ np.ones((2, 5, 4)), "a transpose"),
                        (lambda: np.split(np.ones((2, 3, 12)), 3), "axis=-1")):
        with pytest.raises(ValueError) as err:
            make()
        early, late = (F._error_hint(F.Outcome(error=f"ValueError: {err.value}"), notebook)
                       for notebook in (4, 16))
        assert cause in early and "tile" not in early and "Hkv" not in early, early
        assert cause in late and "Hkv" in late, late


def test_a_block_written_into_less_room_and_unwritten_memory_are_explained():
    """A last block written whole into a slice past the end (the slice is cut short), and
    np.empty's leftovers where a loop stopped a block early (subnormal numbers)."""
    room = np.zeros((5, 5))
    with pytest.raises(ValueError) as err:
        room[4:8] = np.ones((4, 5))
    assert "written into a slice (1, 5) that has less room" in F._error_hint(
        F.Outcome(error=f"ValueError: {err.value}"))
    want, got = np.ones(4), np.array([1.0, 1.0, 1.0, 9e-312])
    hint = F._generic_hint(F._difference(F.Check(), "output", got, want))
    assert "memory never written" in hint
    assert "memory never written" not in F._generic_hint(F._difference(
        F.Check(), "output", np.array([2.0, 9e-312]), np.array([1.0, 9e-312])))
