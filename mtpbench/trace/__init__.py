"""The layer tracer behind ``mtpbench trace-layers``: which MTP layer serves each draft step, and is that right?

The tracer wraps, on the live draft model, the ``forward`` of the wrapper (e.g. vLLM's ``MiMoMTP``), of
the inner predictor and of every MTP layer, plus the target model's ``forward``. Instance ``forward`` is
wrapped rather than hooked because classes under vLLM's ``@support_torch_compile`` replace ``__call__``.
Arguments are bound to each forward's signature, so a positional ``spec_step_idx`` is read too; one that
was never passed is recorded as ``absent``. The draft step s of a call is its order among the draft calls
since the last target forward. The MTP layers are found by structure (the first ModuleList/ModuleDict of
same-class blocks under the draft model), not by class name.

Output: ``trace.csv`` (one row per draft-model forward), ``trace.json`` (summary, verdict, evidence) and
``layers.png`` (draft step x MTP layer execution counts).

Where things live:
- ``records.py``: ``CallRecord`` (one draft-model forward) and ``ABSENT``; plain data, no torch.
- ``hooks.py``: the forward wrapping on live modules (``discover``, ``LayerTracer``, ``force_spec_step_idx``).
- ``verdict.py``: ``judge`` and the other pure functions on records; imports no torch.
- ``report.py``: the per-step table, ``trace.csv`` and the ``layers.png`` heatmap.
- ``run.py``: ``run_trace``, the orchestration (one traced generation on a backend, the files written).
"""
