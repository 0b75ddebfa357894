"""Which notebook teaches each function of :mod:`transformer_lab.core`.

The student writes every core function in the notebook listed first for it; a notebook listed
after the first extends it (``linear_forward`` takes one sequence in 00 and any leading axes in
03). ``make student`` names the first in the stub it leaves in the handout; ``make grade`` grades
a notebook with the student's own version of the functions that list it, and the instructor's
version of every other core function. ``tests/test_handout.py`` checks that this table and the
solution markers in ``core/`` agree.
"""

from __future__ import annotations

#: core module (under transformer_lab.core) -> function -> the notebooks, "NN_topic §section"
TAUGHT_IN: dict[str, dict[str, tuple[str, ...]]] = {
    "layers": {
        "linear_forward": ("00_gradients §6", "03_minibatching §3"),
        "linear_backward": ("00_gradients §6", "03_minibatching §3"),
        "relu_forward": ("00_gradients §4",),
        "relu_backward": ("00_gradients §4",),
        "softmax_forward": ("01_attention §3", "02_masking §4"),
        "softmax_backward": ("05_attention_backward §1",),
        "log_softmax_forward": ("06_layers_backward §2",),
        "log_softmax_backward": ("06_layers_backward §2",),
        "cross_entropy_forward": ("06_layers_backward §2",),
        "cross_entropy_backward": ("06_layers_backward §2",),
        "layer_norm_forward": ("06_layers_backward §1",),
        "layer_norm_backward": ("06_layers_backward §1",),
        "embedding_forward": ("06_layers_backward §3",),
        "embedding_backward": ("06_layers_backward §3",),
        "gelu_forward": ("07_blocks §1",),
        "gelu_backward": ("07_blocks §1",),
        "activation_forward": ("07_blocks §1",),
        "activation_backward": ("07_blocks §1",),
        "dropout_forward": ("07_blocks §4",),
        "dropout_backward": ("07_blocks §4",),
        "init_uniform": ("07_blocks §5",),
        "init_xavier": ("07_blocks §5",),
        "tied_output_forward": ("08_transformer §4",),
        "tied_output_backward": ("08_transformer §4",),
        "positional_encoding": ("08_transformer §1",),
    },
    "attention": {
        "causal_mask": ("02_masking §1",),
        "padding_mask": ("02_masking §5",),
        "merge_masks": ("04_multihead_attention §5",),
        "attention_forward": ("01_attention §6", "02_masking §2", "03_minibatching §4"),
        "attention_backward": ("05_attention_backward §5",),
    },
    "multihead": {
        "split_heads": ("04_multihead_attention §2",),
        "merge_heads": ("04_multihead_attention §2",),
        "multi_head_attention_forward": ("04_multihead_attention §4",),
        "self_attention_forward": ("04_multihead_attention §6", "13_gpt §3", "14_decoding §3"),
        "multi_head_attention_backward": ("05_attention_backward §6",),
        "self_attention_backward": ("05_attention_backward §7", "13_gpt §3"),
    },
    "blocks": {
        "feed_forward_forward": ("07_blocks §2",),
        "feed_forward_backward": ("07_blocks §2",),
        "residual_forward": ("07_blocks §3", "13_gpt §3"),
        "residual_backward": ("07_blocks §3", "13_gpt §3"),
        "encoder_layer_forward": ("07_blocks §6",),
        "encoder_layer_backward": ("07_blocks §6",),
        "decoder_layer_forward": ("07_blocks §7",),
        "decoder_layer_backward": ("07_blocks §7",),
        "encoder_forward": ("08_transformer §2",),
        "encoder_backward": ("08_transformer §2",),
        "decoder_forward": ("08_transformer §2",),
        "decoder_backward": ("08_transformer §2",),
    },
    "model": {
        "embed_forward": ("08_transformer §1",),
        "embed_backward": ("08_transformer §1",),
        "transformer_encode": ("08_transformer §3",),
        "transformer_decode": ("08_transformer §3",),
        "transformer_forward": ("08_transformer §3",),
        "transformer_backward": ("09_verification §1",),
        "transformer_loss": ("09_verification §2",),
    },
    "optim": {
        "sgd_step": ("10_training §4",),
        "adam_step": ("10_training §4",),
        "global_norm": ("10_training §4",),
        "clip_grad_norm": ("10_training §4",),
    },
    "training": {
        "train_step": ("10_training §6",),
    },
    "bpe": {
        "bytes_to_unicode": ("11_tokenization §2",),
        "pretokenize": ("11_tokenization §3",),
        "word_counts": ("11_tokenization §3",),
        "pair_counts": ("11_tokenization §4",),
        "merge_pair": ("11_tokenization §4",),
        "train_bpe": ("11_tokenization §5",),
        "token_bytes": ("11_tokenization §6",),
        "encode_word": ("11_tokenization §6",),
        "bpe_encode": ("11_tokenization §6",),
        "bpe_decode": ("11_tokenization §7",),
    },
    "translation": {
        "label_smoothed_loss_forward": ("12_translation §4",),
        "label_smoothed_loss_backward": ("12_translation §4",),
        "length_penalty": ("12_translation §6",),
        "beam_step": ("12_translation §6",),
        "beam_search": ("12_translation §7",),
        "memory_keys_values": ("12_translation §8",),
        "cached_self_attention_step": ("12_translation §8",),
        "decoder_layer_step": ("12_translation §8",),
        "transformer_decode_step": ("12_translation §8",),
    },
    "next_token": {
        "next_token_loss_forward": ("13_gpt §2",),
        "next_token_loss_backward": ("13_gpt §2",),
    },
    "rope": {
        "rope_tables": ("14_decoding §3",),
        "rope_forward": ("14_decoding §3",),
        "rope_backward": ("14_decoding §3",),
    },
    "modern": {
        "rms_norm_forward": ("14_decoding §3",),
        "rms_norm_backward": ("14_decoding §3",),
        "silu_forward": ("14_decoding §3",),
        "silu_backward": ("14_decoding §3",),
        "swiglu_forward": ("14_decoding §3",),
        "swiglu_backward": ("14_decoding §3",),
    },
    "gqa": {
        "causal_self_attention_forward": ("13_gpt §3", "14_decoding §3"),
        "causal_self_attention_backward": ("13_gpt §3", "14_decoding §3"),
        "repeat_kv_forward": ("14_decoding §3",),
        "repeat_kv_backward": ("14_decoding §3",),
    },
    "gpt": {
        "norm_forward": ("13_gpt §3", "14_decoding §3"),
        "norm_backward": ("13_gpt §3", "14_decoding §3"),
        "mlp_forward": ("13_gpt §3", "14_decoding §3"),
        "mlp_backward": ("13_gpt §3", "14_decoding §3"),
        "gpt_block_forward": ("13_gpt §3",),
        "gpt_block_backward": ("13_gpt §3",),
        "gpt_forward": ("13_gpt §3",),
        "gpt_backward": ("13_gpt §3",),
        "gpt_loss": ("13_gpt §3",),
    },
    "sampling": {
        "top_k_filter": ("14_decoding §1",),
        "top_p_filter": ("14_decoding §1",),
        "sample_next": ("14_decoding §1",),
    },
    "decoding": {
        "kv_cache_append": ("14_decoding §2",),
        "causal_self_attention_step": ("14_decoding §2", "14_decoding §3"),
        "gpt_block_step": ("14_decoding §2",),
        "gpt_step": ("14_decoding §2",),
    },
    "flash": {
        "online_softmax_update": ("15_long_context §2",),
        "flash_attention_forward": ("15_long_context §3",),
        "flash_attention_backward_tile": ("15_long_context §4",),
        "flash_attention_backward": ("15_long_context §4",),
        "flash_self_attention_forward": ("15_long_context §6",),
        "flash_self_attention_backward": ("15_long_context §6",),
    },
}

#: core function -> the core functions its solution calls (or passes on as an argument), in
#: teaching order; derived from ``core/*.py`` by ``ast`` (``tests/test_check_messages.py`` checks
#: that it still matches). A failing check names a wrong function among these (the culprit), so
#: that the student fixes the function that is wrong rather than the one that calls it.
CALLS: dict[str, tuple[str, ...]] = {
    "cross_entropy_forward": ("log_softmax_forward",),
    "cross_entropy_backward": ("log_softmax_backward",),
    "tied_output_forward": ("linear_forward",),
    "tied_output_backward": ("linear_backward",),
    "attention_forward": ("softmax_forward",),
    "attention_backward": ("softmax_backward",),
    "multi_head_attention_forward": ("linear_forward", "attention_forward", "split_heads",
                                     "merge_heads"),
    "multi_head_attention_backward": ("linear_backward", "attention_backward", "split_heads",
                                      "merge_heads"),
    "self_attention_forward": ("linear_forward", "attention_forward", "split_heads", "merge_heads"),
    "self_attention_backward": ("linear_backward", "attention_backward", "split_heads",
                                "merge_heads"),
    "feed_forward_forward": ("linear_forward", "activation_forward"),
    "feed_forward_backward": ("linear_backward", "activation_backward"),
    "residual_forward": ("layer_norm_forward",),
    "residual_backward": ("layer_norm_backward",),
    "encoder_layer_forward": ("self_attention_forward", "feed_forward_forward", "residual_forward"),
    "encoder_layer_backward": ("self_attention_backward", "feed_forward_backward",
                               "residual_backward"),
    "decoder_layer_forward": ("multi_head_attention_forward", "self_attention_forward",
                              "feed_forward_forward", "residual_forward"),
    "decoder_layer_backward": ("multi_head_attention_backward", "self_attention_backward",
                               "feed_forward_backward", "residual_backward"),
    "encoder_forward": ("layer_norm_forward", "encoder_layer_forward"),
    "encoder_backward": ("layer_norm_backward", "encoder_layer_backward"),
    "decoder_forward": ("layer_norm_forward", "decoder_layer_forward"),
    "decoder_backward": ("layer_norm_backward", "decoder_layer_backward"),
    "embed_forward": ("embedding_forward",),
    "embed_backward": ("embedding_backward",),
    "transformer_encode": ("merge_masks", "encoder_forward", "embed_forward"),
    "transformer_decode": ("linear_forward", "causal_mask", "merge_masks", "decoder_forward",
                           "embed_forward"),
    "transformer_forward": ("transformer_encode", "transformer_decode"),
    "transformer_backward": ("linear_backward", "encoder_backward", "decoder_backward",
                             "embed_backward"),
    "transformer_loss": ("cross_entropy_forward", "cross_entropy_backward", "transformer_forward",
                         "transformer_backward"),
    "clip_grad_norm": ("global_norm",),
    "train_step": ("global_norm", "clip_grad_norm"),
    "word_counts": ("pretokenize",),
    "train_bpe": ("pair_counts", "merge_pair"),
    "encode_word": ("merge_pair",),
    "bpe_encode": ("pretokenize", "encode_word"),
    "label_smoothed_loss_forward": ("log_softmax_forward",),
    "label_smoothed_loss_backward": ("log_softmax_backward",),
    "beam_step": ("length_penalty",),
    "beam_search": ("length_penalty", "beam_step"),
    "memory_keys_values": ("linear_forward", "split_heads"),
    "cached_self_attention_step": ("linear_forward", "causal_mask", "attention_forward",
                                   "split_heads", "merge_heads"),
    "decoder_layer_step": ("linear_forward", "attention_forward", "split_heads", "merge_heads",
                           "feed_forward_forward", "residual_forward",
                           "cached_self_attention_step"),
    "transformer_decode_step": ("linear_forward", "layer_norm_forward", "merge_masks",
                                "embed_forward", "decoder_layer_step"),
    "next_token_loss_forward": ("cross_entropy_forward",),
    "next_token_loss_backward": ("cross_entropy_backward",),
    "swiglu_forward": ("linear_forward", "silu_forward"),
    "swiglu_backward": ("linear_backward", "silu_backward"),
    "causal_self_attention_forward": ("causal_mask", "attention_forward", "self_attention_forward",
                                      "rope_forward", "repeat_kv_forward",
                                      "flash_attention_forward"),
    "causal_self_attention_backward": ("attention_backward", "self_attention_backward",
                                       "rope_backward", "repeat_kv_backward",
                                       "flash_attention_backward"),
    "norm_forward": ("layer_norm_forward", "rms_norm_forward"),
    "norm_backward": ("layer_norm_backward", "rms_norm_backward"),
    "mlp_forward": ("feed_forward_forward", "swiglu_forward"),
    "mlp_backward": ("feed_forward_backward", "swiglu_backward"),
    "gpt_block_forward": ("dropout_forward", "residual_forward", "causal_self_attention_forward",
                          "norm_forward", "mlp_forward"),
    "gpt_block_backward": ("dropout_backward", "residual_backward",
                           "causal_self_attention_backward", "norm_backward", "mlp_backward"),
    "gpt_forward": ("tied_output_forward", "embed_forward", "norm_forward", "gpt_block_forward"),
    "gpt_backward": ("tied_output_backward", "embed_backward", "norm_backward",
                     "gpt_block_backward"),
    "gpt_loss": ("next_token_loss_forward", "next_token_loss_backward", "gpt_forward",
                 "gpt_backward"),
    "top_p_filter": ("softmax_forward",),
    "sample_next": ("softmax_forward", "top_k_filter", "top_p_filter"),
    "causal_self_attention_step": ("causal_mask", "attention_forward", "self_attention_forward",
                                   "rope_forward", "repeat_kv_forward", "kv_cache_append"),
    "gpt_block_step": ("residual_forward", "norm_forward", "mlp_forward",
                       "causal_self_attention_step"),
    "gpt_step": ("tied_output_forward", "embed_forward", "norm_forward", "gpt_block_step"),
    "flash_attention_forward": ("causal_mask", "online_softmax_update"),
    "flash_attention_backward": ("causal_mask", "flash_attention_backward_tile"),
    "flash_self_attention_forward": ("self_attention_forward", "flash_attention_forward"),
    "flash_self_attention_backward": ("self_attention_backward", "flash_attention_backward"),
}


def dependencies(functions) -> list[str]:
    """The core functions that ``functions`` call, directly or through each other (themselves
    left out), in teaching order."""
    order = [name for module in TAUGHT_IN.values() for name in module]
    found: set[str] = set()
    todo = list(functions)
    while todo:
        for callee in CALLS.get(todo.pop(), ()):
            if callee not in found:
                found.add(callee)
                todo.append(callee)
    return sorted(found - set(functions), key=order.index)


def where_taught(function: str) -> tuple[str, str]:
    """(core module, first "NN_topic §section") of a core function, or a KeyError."""
    for module, functions in TAUGHT_IN.items():
        if function in functions:
            return module, functions[function][0]
    raise KeyError(f"{function!r} is not a function of transformer_lab.core")


def notebook_functions(notebook: str) -> dict[str, list[str]]:
    """core module -> the functions that ``notebook`` ("06_layers_backward") teaches or extends."""
    found: dict[str, list[str]] = {}
    for module, functions in TAUGHT_IN.items():
        for name, places in functions.items():
            if any(place.split(" §")[0] == notebook for place in places):
                found.setdefault(module, []).append(name)
    return found


def stub_message(function: str) -> str:
    """What the handout's stub of a core function says when it is called."""
    module, place = where_taught(function)
    notebook, _, section = place.partition(" §")
    return (f"{function}() in transformer_lab/core/{module}.py is yours to write: notebook "
            f"{notebook}, section {section}, shows how")
