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

    def tensor(self, key: str, cfg: dict, j: int) -> str:
        prefix = self.layer_prefix.format(j=j, n_j=cfg.get("num_hidden_layers", 0) + j)
        return self.names[key].format(layer=prefix)


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
                                    "Glm4MoeLiteForCausalLM"), "model.layers.{n_j}.", _DEEPSEEK_NAMES,
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


def family_for(cfg: dict) -> Family | None:
    """The family of a checkpoint's config.json (by its architectures), or None: no reference yet."""
    archs = set(cfg.get("architectures") or [])
    return next((f for f in FAMILIES.values() if archs & set(f.architectures)), None)
