"""Wiring faults planted in a live native ``Generation`` (check-drafter's tests and docs/check-drafter.md; never
used by a check): each runs without an error, drafts plausible tokens and shows only as lower acceptance, like
the faults users report. ``plant(name, generation)`` returns a function that undoes it (the model's modules are
shared by every generation of a backend)."""

from __future__ import annotations

import functools

import torch

from mtpbench.errors import MtpBenchError


def _swapped_norms(g):
    layers = list(g.drafter.model.mtp_layers)
    for layer in layers:
        layer.token_layernorm, layer.hidden_layernorm = layer.hidden_layernorm, layer.token_layernorm

    def undo():
        for layer in layers:
            layer.token_layernorm, layer.hidden_layernorm = layer.hidden_layernorm, layer.token_layernorm
    return undo


def _exchanged_inputs(g):
    """Each MTP layer's two norms called on each other's input, the halves concatenated as the code had them
    (``cat([hidden's, embedding's])``): token_layernorm norms the previous hidden state, hidden_layernorm the
    token embedding. The code slip of writing ``token_layernorm(previous_hidden_states)`` and
    ``hidden_layernorm(inputs_embeds)``."""
    return _wrap_norms(g, lambda layer, x, h: (layer.hidden_layernorm(x), layer.token_layernorm(h)))


def _scaled_embedding(g):
    """The token embedding multiplied by 1.5 before the layer's norm sees it: a change that matches no known
    alternative (no exchange, no other layer's weights), so check-drafter names no cause."""
    return _wrap_norms(g, lambda layer, x, h: (layer.token_layernorm(1.5 * x), layer.hidden_layernorm(h)))


def _wrap_norms(g, norms):
    """Replace each drafter MTP layer's two input norms by ``norms(layer, embedding, hidden)`` -> (the embedding's
    normed half, the hidden's), through the layer's own ``normed_inputs``."""
    layers = list(g.drafter.model.mtp_layers)
    for layer in layers:
        layer.normed_inputs = functools.partial(norms, layer)
    return lambda: [layer.__dict__.pop("normed_inputs", None) for layer in layers]


def _shifted_inputs(g, which: int):
    """The draft step at position t reads the token (``which`` 0) or the target's hidden state (1) of position
    t - 1 where t + 1 and t are defined: the engine's buffers handed over one position late."""
    orig = g._draft_inputs

    def draft_inputs(X, Ht, *rest):
        if which == 0:
            X = torch.roll(X, 1, dims=1)
        else:
            Ht = torch.roll(Ht, 1, dims=1)
        return orig(X, Ht, *rest)
    g._draft_inputs = draft_inputs
    return lambda: g.__dict__.pop("_draft_inputs", None)


def _wrong_layer(g):
    body_layers = g.model.model.mtp_layers
    if len(body_layers) < 2:
        raise MtpBenchError("the wrong-layer fault needs a checkpoint with two MTP layers")
    g.drafter.model.mtp_layers[0] = body_layers[1]  # the drafter's own list: the model keeps its order
    return lambda: None


def _no_final_norm(g):
    norms = [layer.final_layernorm for layer in g.drafter.model.mtp_layers]
    for n in norms:
        n.forward = lambda x: x
    return lambda: [n.__dict__.pop("forward", None) for n in norms]


FAULTS = {
    "swapped-norms": (_swapped_norms, "enorm", "each MTP layer norms the token embedding with hnorm and the "
                      "hidden state with enorm"),
    "stale-hidden": (lambda g: _shifted_inputs(g, 1), "hidden input", "the draft step at position t is handed the "
                     "hidden state of position t - 1"),
    "stale-token": (lambda g: _shifted_inputs(g, 0), "token input", "the draft step at position t is handed the "
                    "token at t instead of t + 1"),
    "wrong-layer": (_wrong_layer, "enorm", "MTP layer 0 runs with layer 1's weights"),
    "exchanged-inputs": (_exchanged_inputs, "embedding", "each MTP layer's token_layernorm norms the previous "
                         "hidden state and its hidden_layernorm the token embedding (the call sites exchanged)"),
    "scaled-embedding": (_scaled_embedding, "embedding", "the token embedding is scaled by 1.5 before its norm (no "
                         "known alternative: no cause named)"),
    "no-final-norm": (_no_final_norm, "final norm", "the MTP layer's final norm (MiMo's final_layernorm, "
                      "GLM's shared_head.norm) returns its input"),
}


def plant(name: str, g) -> callable:
    if name not in FAULTS:
        raise MtpBenchError(f"unknown fault {name!r} (one of {', '.join(FAULTS)})")
    return FAULTS[name][0](g)

