"""What check-drafter knows of each MTP family: where the checkpoint keeps an MTP layer's tensors, how the layer
wires them (the norms, the concatenation order, the projection, the head) and, per engine, which module of the
live draft model computes each stage.

A stage pointer is ``(path, side)``: ``path`` is ``layer.<attr>`` inside the MTP layer that runs (``layer`` alone:
the layer itself) or ``pred.<attr>`` inside the layers' holder (Qwen3-Next keeps its norms and ``fc`` there);
``side`` is ``in`` or ``out``. Written from each architecture's definition (vLLM's ``*_mtp.py`` and the
checkpoints' tensor names), not imported from vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# the stages an MTP draft step runs, in order (compare.py names the first that differs)
STAGES = ("token input", "embedding", "enorm", "hidden input", "hnorm", "concat", "proj", "block input", "block",
          "final norm", "head input", "head")


@dataclass(frozen=True)
class Family:
    name: str
    architectures: tuple[str, ...]
    layer_prefix: str  # checkpoint prefix of MTP layer j: {j}, or {n_j} = num_hidden_layers + j
    names: dict[str, str]  # checkpoint tensors: "enorm", "hnorm", "proj", "final_norm", "head" ({layer}: prefix)
    order: str = "eh"  # the projection's input: embedding half first ("eh") or hidden half first ("he")
    norm: str = "rms"  # "rms": x * w; "gemma": x * (1 + w)
    mask_pos0: bool = True  # the embedding is zeroed at position 0 (vLLM's MiMo, DeepSeek and GLM layers)
    head_norms: bool = True  # compute_logits applies the final norm (DeepSeek style) or takes its output (MiMo)
    block: str | None = None  # an independent decoder layer in reference/ ("qwen2", "glm-dense"), or None
    target_hidden: str = "post"  # what the target hands step 0: its hidden after ("post") or before its final norm
    # what a step may hand the next: the layer's residual sum ("pre") and/or its final norm's output ("post")
    next_hidden: tuple[str, ...] = ("pre",)
    modules: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)  # engine -> stage -> pointer
    eps: str = "rms_norm_eps"  # the config key of the norms' epsilon (MiMo-V2: layernorm_epsilon)

    def tensor(self, key: str, cfg: dict, j: int) -> str:
        """Checkpoint tensor ``key`` of MTP layer j. Templates may name {layer} (the prefix), {j}, {n_j} and, where
        one MTP step is several sublayers (Nemotron-H's mtp_hybrid_override_pattern), {first} / {end}: the
        step's first and last sublayer."""
        steps = len(cfg.get("mtp_hybrid_override_pattern") or cfg.get("mtp_layers_block_type") or "x")
        at = {"j": j, "n_j": cfg.get("num_hidden_layers", 0) + j, "first": j * steps, "end": (j + 1) * steps - 1}
        return self.names.get(key, _SHARED_NAMES.get(key, "")).format(layer=self.layer_prefix.format(**at), **at)


# the target's tensors the reference reads where a family names no others: the token embedding, its final norm
_SHARED_NAMES = {"embed": "model.embed_tokens.weight", "target_norm": "model.norm.weight"}


_DEEPSEEK_VLLM = {"enorm": ("layer.enorm", ""), "hnorm": ("layer.hnorm", ""), "proj": ("layer.eh_proj", ""),
                  "block": ("layer.mtp_block", ""), "final_norm": ("layer.shared_head.norm", "")}
# a pointer's side "" = the module's own input and output; "in" / "out" = only that side of it
# DeepSeek-V3's MTP modules share the main model's output head (the paper's "shared output head"; real checkpoints
# store a copy of lm_head under shared_head.head, and vLLM's proposer uses the target's lm_head): the reference
# reads lm_head, and a checkpoint whose copy differs is named in the summary
_DEEPSEEK_NAMES = {"enorm": "{layer}enorm.weight", "hnorm": "{layer}hnorm.weight", "proj": "{layer}eh_proj.weight",
                   "final_norm": "{layer}shared_head.norm.weight", "head": "lm_head.weight",
                   "head_copy": "{layer}shared_head.head.weight"}
_MIMO_NAMES = {"enorm": "{layer}token_layernorm.weight", "hnorm": "{layer}hidden_layernorm.weight",
               "proj": "{layer}input_proj.weight", "final_norm": "{layer}final_layernorm.weight",
               "head": "lm_head.weight"}
_MIMO_VLLM = {"enorm": ("layer.token_layernorm", ""), "hnorm": ("layer.hidden_layernorm", ""),
              "proj": ("layer.input_proj", ""), "block": ("layer.mtp_block", ""),
              "final_norm": ("layer.final_layernorm", "")}
# the native engine's MTPLayer has no block module: the block runs from input_layernorm's input to the layer's
# residual sum (final_layernorm's input in MiMo style, the layer's output in DeepSeek style)
_NATIVE = {"enorm": ("layer.token_layernorm", ""), "hnorm": ("layer.hidden_layernorm", ""),
           "proj": ("layer.input_proj", ""), "block": ("layer.input_layernorm", "in"),
           "final_norm": ("layer.final_layernorm", "")}

FAMILIES = {
    "mimo": Family("mimo", ("MiMoForCausalLM",), "model.mtp_layers.{j}.", _MIMO_NAMES, order="he",
                   head_norms=False, block="qwen2", target_hidden="pre", next_hidden=("post",),
                   modules={"vllm": _MIMO_VLLM, "native": {**_NATIVE, "block_out": ("layer.final_layernorm", "in")}}),
    "deepseek": Family("deepseek", ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "Glm4MoeForCausalLM",
                                    "Glm4MoeLiteForCausalLM", "PanguUltraMoEForCausalLM"), "model.layers.{n_j}.",
                       _DEEPSEEK_NAMES,
                       block="glm-dense", next_hidden=("pre", "post"),  # vLLM's DeepSeek layer hands on its
                       # normed output (reused layer 0 sees what the target hands it), GLM's its residual sum
                       modules={"vllm": _DEEPSEEK_VLLM, "native": {**_NATIVE, "block_out": ("layer", "out")}}),
    "qwen3-next": Family("qwen3-next", ("Qwen3NextForCausalLM",), "mtp.layers.{j}.",
                         {"enorm": "mtp.pre_fc_norm_embedding.weight", "hnorm": "mtp.pre_fc_norm_hidden.weight",
                          "proj": "mtp.fc.weight", "final_norm": "mtp.norm.weight", "head": "lm_head.weight"},
                         norm="gemma", mask_pos0=False, head_norms=False, next_hidden=("post",),
                         modules={"vllm": {"enorm": ("pred.pre_fc_norm_embedding", ""),
                                           "hnorm": ("pred.pre_fc_norm_hidden", ""), "proj": ("pred.fc", ""),
                                           "block": ("layer", ""), "final_norm": ("pred.norm", "")}}),
}

# the DeepSeek block's relatives, written from their vLLM layers: the residual sum goes to a final norm and the
# head; an entry says where they differ (a shared head or the layer's own, the norm inside the layer or at the
# logits call, the embedding masked at position 0 or not)
_FINAL_NAMES = {"enorm": "{layer}enorm.weight", "hnorm": "{layer}hnorm.weight", "proj": "{layer}eh_proj.weight",
                "final_norm": "{layer}final_layernorm.weight", "head": "lm_head.weight"}
# layers that run their decoder block inline (no block module): it runs from input_layernorm's input to the input
# of the final norm the layer applies before handing its output on
_INLINE_VLLM = {"enorm": ("layer.enorm", ""), "hnorm": ("layer.hnorm", ""), "proj": ("layer.eh_proj", ""),
                "block": ("layer.input_layernorm", "in"), "block_out": ("layer.final_layernorm", "in"),
                "final_norm": ("layer.final_layernorm", "")}
# Qwen3-Next's relatives: norms and fc in the predictor, the final norm there too (its input is the block's output
# plus residual, where the layer returns them apart)
_FC_NAMES = {"enorm": "mtp.pre_fc_norm_embedding.weight", "hnorm": "mtp.pre_fc_norm_hidden.weight",
             "proj": "mtp.fc.weight", "final_norm": "mtp.norm.weight", "head": "lm_head.weight"}
_FC_VLLM = {"enorm": ("pred.pre_fc_norm_embedding", ""), "hnorm": ("pred.pre_fc_norm_hidden", ""),
            "proj": ("pred.fc", ""), "block": ("layer", "in"), "block_out": ("pred.norm", "in"),
            "final_norm": ("pred.norm", "")}
_VL_TEXT = {"embed": "model.language_model.embed_tokens.weight", "target_norm": "model.language_model.norm.weight"}

FAMILIES.update({
    "glm-ocr": Family("glm-ocr", ("GlmOcrForConditionalGeneration",), "model.language_model.layers.{n_j}.",
                      {**_DEEPSEEK_NAMES, **_VL_TEXT}, modules={"vllm": _DEEPSEEK_VLLM}),
    # Step-3.5: Gemma norms, no position-0 mask, each MTP layer's own output head (vLLM's Step3p5 proposer keeps
    # it where other MTP models get the target's lm_head), and the target's hidden before its final norm (its
    # model returns it and norms in compute_logits)
    "step-3.5": Family("step-3.5", ("Step3p5ForCausalLM",), "model.layers.{n_j}.",
                       {**{k: v for k, v in _DEEPSEEK_NAMES.items() if k != "head_copy"},
                        "head": "{layer}shared_head.head.weight"}, norm="gemma", mask_pos0=False, target_hidden="pre",
                       modules={"vllm": _DEEPSEEK_VLLM}),
    "hy-v3": Family("hy-v3", ("HYV3ForCausalLM",), "model.layers.{n_j}.", _FINAL_NAMES, head_norms=False,
                    next_hidden=("post",),
                    modules={"vllm": {**_DEEPSEEK_VLLM, "final_norm": ("layer.final_layernorm", "")}}),
    "bailing-moe-v2.5": Family("bailing-moe-v2.5", ("BailingMoeV2_5ForCausalLM",), "model.layers.{n_j}.",
                               {**_FINAL_NAMES, "embed": "model.word_embeddings.weight"}, head_norms=False,
                               next_hidden=("post",), modules={"vllm": _INLINE_VLLM}),
    "bailing-moe-v3": Family("bailing-moe-v3", ("BailingMoeV3ForCausalLM",), "model.layers.{n_j}.",
                             {**_FINAL_NAMES, "embed": "model.word_embeddings.weight"}, mask_pos0=False,
                             head_norms=False, next_hidden=("post",), modules={"vllm": _INLINE_VLLM}),
    "mimo-v2": Family("mimo-v2", ("MiMoV2FlashForCausalLM", "MiMoV2OmniForCausalLM"), "model.mtp.layers.{j}.",
                      _FINAL_NAMES, mask_pos0=False, head_norms=False, next_hidden=("post",),
                      eps="layernorm_epsilon", modules={"vllm": _INLINE_VLLM}),
    # Nemotron-H: one MTP step is a run of sublayers (mtp_hybrid_override_pattern); the first holds the input
    # norms and eh_proj, the last the final norm
    "nemotron-h": Family("nemotron-h", ("NemotronHForCausalLM",), "mtp.layers.{first}.",
                         {**_FINAL_NAMES, "final_norm": "mtp.layers.{end}.final_layernorm.weight",
                          "embed": "backbone.embeddings.weight", "target_norm": "backbone.norm_f.weight"},
                         mask_pos0=False, head_norms=False, next_hidden=("post",), eps="layer_norm_epsilon",
                         modules={"vllm": {**_INLINE_VLLM, "block": ("layer.norm", "in")}}),
    "qwen3.5": Family("qwen3.5", ("Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"), "mtp.layers.{j}.", _FC_NAMES,
                      norm="gemma", mask_pos0=False, head_norms=False, next_hidden=("post",),
                      modules={"vllm": _FC_VLLM}),
    "interns2-mobius": Family("interns2-mobius", ("InternS2MobiusForConditionalGeneration",), "mtp.layers.{j}.",
                              {**_FC_NAMES, **_VL_TEXT}, norm="gemma", mask_pos0=False, head_norms=False,
                              next_hidden=("post",), modules={"vllm": _FC_VLLM}),
    "exaone-moe": Family("exaone-moe", ("ExaoneMoeForCausalLM",), "mtp.layers.{j}.", _FC_NAMES, mask_pos0=False,
                         head_norms=False, next_hidden=("post",), modules={"vllm": _FC_VLLM}),
    "exaone-4.5": Family("exaone-4.5", ("Exaone4_5_ForConditionalGeneration",), "mtp.layers.{j}.",
                         {**_FC_NAMES, **_VL_TEXT}, mask_pos0=False, head_norms=False, next_hidden=("post",),
                         modules={"vllm": _FC_VLLM}),
    # ERNIE 4.5 (PaddleFormers' Ernie4_5 MTP, the training definition): the target's hidden before its final
    # norm, and each depth's output normed by the model's shared final norm (model.norm) before lm_head
    "ernie-4.5": Family("ernie-4.5", ("Ernie4_5_MoeForCausalLM",), "model.",
                        {"enorm": "{layer}mtp_emb_norm.{j}.weight", "hnorm": "{layer}mtp_hidden_norm.{j}.weight",
                         "proj": "{layer}mtp_linear_proj.{j}.weight", "final_norm": "model.norm.weight",
                         "head": "lm_head.weight"}, target_hidden="pre",
                        modules={"vllm": {"enorm": ("layer.mtp_emb_norm", ""), "hnorm": ("layer.mtp_hidden_norm", ""),
                                          "proj": ("layer.mtp_linear_proj", ""), "block": ("layer.mtp_block", "")}}),
})


def family_for(cfg: dict) -> Family | None:
    """The family of a checkpoint's config.json (by its architectures), or None: no reference yet."""
    archs = set(cfg.get("architectures") or [])
    return next((f for f in FAMILIES.values() if archs & set(f.architectures)), None)
