"""Test only: a wiring fault planted in vLLM's MiMo MTP layer, in the engine processes of one test (put on their
PYTHONPATH; tests/test_drafter_vllm.py).

The slip of calling each input norm on the other's input (``token_layernorm(previous_hidden_states)``,
``hidden_layernorm(inputs_embeds)``), the halves then concatenated as the code has them: during each call of
``MiMoMultiTokenPredictorLayer.forward`` the layer's two norm modules sit at each other's attribute, so the code's
``self.token_layernorm(inputs_embeds)`` runs the hidden norm on the embedding and the other way round. It runs
without an error and drafts plausible tokens; check-drafter must say the two norms were given each other's inputs,
not that the projection's halves are in the other order.
"""

from vllm.model_executor.models import mimo_mtp

_forward = mimo_mtp.MiMoMultiTokenPredictorLayer.forward


def _exchange(layer) -> None:
    tok, hid = layer._modules["token_layernorm"], layer._modules["hidden_layernorm"]
    layer._modules["token_layernorm"], layer._modules["hidden_layernorm"] = hid, tok


def forward(self, *args, **kwargs):
    _exchange(self)
    try:
        return _forward(self, *args, **kwargs)
    finally:
        _exchange(self)


mimo_mtp.MiMoMultiTokenPredictorLayer.forward = forward
