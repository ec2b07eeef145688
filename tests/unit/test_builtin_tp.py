"""``builtin-glm-tp``: builtin-glm with one zero attention head appended to every attention block, so that its 4
heads divide by a tensor-parallel size of 2 or 4. Its tensors against builtin-glm's (the rule written out again
here, not taken from builtin_tp), its config and provenance, the cache, the native loader dropping the padding
(and refusing padding that is not zero, naming the tensor), the padding rules' refusals, and the model name
where the CLI takes names. No engine runs here (the engines: tests/test_sharded_model.py)."""

import json
import shutil

import pytest

from mtpbench.builtin_tp import PAD_KEY
from mtpbench.errors import MtpBenchError

H, N, M, HD = 192, 6, 3, 64  # hidden, target layers, MTP layers, head size
ATTN = [f"self_attn.{c}_proj.{w}" for c in "qkv" for w in ("weight", "bias")]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """(builtin-glm, builtin-glm-tp, the cache), both resolved by name in a fresh cache."""
    from mtpbench.builtin import resolve_model_dir

    xdg = tmp_path_factory.mktemp("xdg")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(xdg))
        tp = resolve_model_dir("builtin-glm-tp")
        glm = resolve_model_dir("builtin-glm")
    return glm, tp, xdg / "mtpbench"


@pytest.fixture(scope="module")
def tensors(dirs):
    from safetensors.torch import load_file

    glm, tp, _ = dirs
    return load_file(str(glm / "model.safetensors")), load_file(str(tp / "model.safetensors"))


def test_builtin_glm_tp_is_builtin_glm_plus_a_zero_head_in_every_block(tensors):
    """Every attention block (6 target, 3 MTP): q/k/v rows 0..191 and o_proj columns 0..191 are builtin-glm's,
    rows (columns) 192..255 exactly zero; every other tensor builtin-glm's, bit for bit."""
    import torch

    glm, tp = tensors
    assert tp.keys() == glm.keys()
    padded = set()
    for i in range(N + M):
        p = f"model.layers.{i}."
        for part in ATTN:
            a, b = glm[p + part], tp[p + part]
            assert a.shape[0] == H and b.shape == (H + HD, *a.shape[1:]) and b.dtype == a.dtype, (p + part, b.shape)
            assert torch.equal(b[:H], a) and not b[H:].any() and b[H:].abs().sum() == 0
            padded.add(p + part)
        a, b = glm[p + "self_attn.o_proj.weight"], tp[p + "self_attn.o_proj.weight"]
        assert a.shape == (H, H) and b.shape == (H, H + HD) and b.dtype == a.dtype
        assert torch.equal(b[:, :H], a) and not b[:, H:].any()
        padded.add(p + "self_attn.o_proj.weight")
    assert len(padded) == (N + M) * 7
    assert all(torch.equal(tp[n], glm[n]) and tp[n].dtype == glm[n].dtype for n in glm if n not in padded)


def test_builtin_glm_tp_config_names_the_padding_and_its_source(dirs):
    import hashlib

    glm, tp, _ = dirs
    a, b = (json.loads((d / "config.json").read_text()) for d in (glm, tp))
    assert a["num_attention_heads"] == a["num_key_value_heads"] == 3 and a["head_dim"] == HD
    assert b == {**a, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": HD, PAD_KEY: 1}
    prov = json.loads((tp / "derived_from.json").read_text())
    assert prov["padded_heads"] == 1 and prov["config_key"] == PAD_KEY and prov["tp_format_version"] == 1
    digest = hashlib.sha256((glm / "model.safetensors").read_bytes()).hexdigest()
    assert prov["source_model_safetensors_sha256"] == digest
    assert prov["source_derived_from"] == json.loads((glm / "derived_from.json").read_text())
    for name in ("tokenizer.json", "prompts.jsonl"):
        assert (tp / name).read_bytes() == (glm / name).read_bytes()


def test_builtin_glm_tp_is_cached_once(dirs, monkeypatch):
    from mtpbench.builtin import BUILTIN_MODELS, resolve_model_dir
    from mtpbench.paths import BUILTIN_MODEL_DIR

    glm, tp, cache = dirs
    assert tp.parent == glm.parent == cache and tp.name.startswith("builtin-glm-tp-")
    # the two directories and nothing else (no partial one left)
    assert sorted(p.name.rsplit("-", 1)[0] for p in cache.iterdir()) == ["builtin-glm", "builtin-glm-tp"]
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache.parent))
    mtime = (tp / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_dir("builtin-glm-tp") == tp and (tp / "model.safetensors").stat().st_mtime_ns == mtime
    assert [resolve_model_dir(n) for n in BUILTIN_MODELS] == [BUILTIN_MODEL_DIR, glm, tp]


def test_native_loader_drops_the_padding_to_builtin_glms_tensors(dirs):
    """load_model on builtin-glm-tp: builtin-glm's model (3 heads), every parameter equal, bit for bit."""
    import torch

    from mtpbench.model import load_model

    glm, tp, _ = dirs
    a, b = load_model(glm), load_model(tp)
    assert b.args == a.args and b.args.num_attention_heads == 3 and b.args.head_dim == HD
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[n], sb[n]) for n in sa)


@pytest.mark.parametrize("name, index", [(f"model.layers.{N + 1}.self_attn.q_proj.bias", (-1,)),
                                         ("model.layers.0.self_attn.o_proj.weight", (5, H)),
                                         (f"model.layers.{N - 1}.self_attn.v_proj.weight", (H + HD - 1, 0))])
def test_a_padded_head_that_is_not_zero_is_refused_naming_its_tensor(dirs, tensors, tmp_path, name, index):
    """One entry of a padded head, the last row of an MTP layer's q bias, the first padded o_proj column of
    the first target layer, the last padded v row: the native loader refuses the checkpoint in one line naming
    the tensor (dropping that head would change the model), both from the tensors and from the directory."""
    from safetensors.torch import save_file

    from mtpbench.builtin import mimo_from_glm
    from mtpbench.model import load_model

    _, tp, _ = dirs
    bad = {n: t.clone() for n, t in tensors[1].items()}
    bad[name][index] = 1e-30  # the smallest nonzero still counts
    cfg = json.loads((tp / "config.json").read_text())
    with pytest.raises(MtpBenchError, match=f"{name}'s padded head is not zero"):
        mimo_from_glm(bad, cfg)
    d = tmp_path / "bad"
    shutil.copytree(tp, d)
    save_file(bad, str(d / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(MtpBenchError, match=f"{d}: {name}'s padded head is not zero"):
        load_model(d)
    # an unpadded row may be anything: only the padding is checked
    ok = dict(tensors[1])
    ok[name] = ok[name].clone()
    ok[name][(0,) * len(index)] += 1
    assert mimo_from_glm(ok, cfg)


def tiny_cfg(**kw):
    return {"num_hidden_layers": 1, "num_nextn_predict_layers": 1, "hidden_size": 4, "num_attention_heads": 2,
            "num_key_value_heads": 2, **kw}


def tiny_state(cfg):
    import torch

    g = torch.Generator().manual_seed(0)
    out = {"model.embed_tokens.weight": torch.randn(5, 4, generator=g)}
    for i in range(2):
        p = f"model.layers.{i}.self_attn."
        for c in "qkv":
            out[f"{p}{c}_proj.weight"] = torch.randn(4, 4, generator=g)
            out[f"{p}{c}_proj.bias"] = torch.randn(4, generator=g)
        out[p + "o_proj.weight"] = torch.randn(4, 4, generator=g)
    return out


def test_pad_heads_round_trip_on_a_hand_made_state():
    """Two heads of 2 padded by 3: 6 zero rows / columns in both blocks (target and MTP), the config's head
    count 5 and its head size written out; unpad_heads gives back the very tensors and config."""
    import torch

    from mtpbench.builtin_tp import pad_heads, padded_config, unpad_heads, unpadded_config

    cfg, state = tiny_cfg(), tiny_state(tiny_cfg())
    big_cfg = padded_config(cfg, 3)
    assert big_cfg == {**cfg, "num_attention_heads": 5, "num_key_value_heads": 5, "head_dim": 2, PAD_KEY: 3}
    big = pad_heads(state, cfg, 3)
    assert big["model.layers.1.self_attn.k_proj.weight"].shape == (10, 4)
    assert big["model.layers.0.self_attn.v_proj.bias"].shape == (10,)
    assert big["model.layers.1.self_attn.o_proj.weight"].shape == (4, 10)
    assert not big["model.layers.1.self_attn.q_proj.weight"][4:].any()
    assert not big["model.layers.0.self_attn.o_proj.weight"][:, 4:].any()
    assert big["model.embed_tokens.weight"] is state["model.embed_tokens.weight"]
    back, back_cfg = unpad_heads(big, big_cfg)
    assert back_cfg == {**cfg, "head_dim": 2} == unpadded_config(big_cfg)
    assert back.keys() == state.keys() and all(torch.equal(back[n], state[n]) for n in state)
    assert unpad_heads(state, cfg) == (state, cfg)  # nothing named: as it is


@pytest.mark.parametrize("cfg, message", [
    (tiny_cfg(num_key_value_heads=1), "only multi-head attention"),
    (tiny_cfg(**{PAD_KEY: 1}), "padded heads already"),
])
def test_padded_config_refuses(cfg, message):
    from mtpbench.builtin_tp import padded_config

    with pytest.raises(MtpBenchError, match=message):
        padded_config(cfg, 1)


def test_padded_config_refuses_no_padding():
    from mtpbench.builtin_tp import padded_config

    with pytest.raises(MtpBenchError, match="padded heads must be >= 1, got 0"):
        padded_config(tiny_cfg(), 0)


@pytest.mark.parametrize("pad, heads, kv", [(2, 2, 2), (True, 2, 2), ("1", 2, 2), (-1, 2, 2), (1, 2, 1), (1.0, 2, 2)])
def test_a_padding_key_that_cannot_be_is_refused(pad, heads, kv):
    """PAD_KEY must count fewer heads than the config has, in multi-head attention: else one line naming it."""
    from mtpbench.builtin_tp import unpad_heads

    cfg = tiny_cfg(num_attention_heads=heads, num_key_value_heads=kv, head_dim=2, **{PAD_KEY: pad})
    with pytest.raises(MtpBenchError, match=f"here/config.json: {PAD_KEY} is {pad!r}"):
        unpad_heads({}, cfg, "here")


def test_a_padded_checkpoint_of_the_wrong_shape_or_lacking_a_tensor_is_refused():
    from mtpbench.builtin_tp import unpad_heads

    cfg = tiny_cfg(num_attention_heads=3, num_key_value_heads=3, head_dim=2, **{PAD_KEY: 1})
    with pytest.raises(MtpBenchError, match="model.layers.0.self_attn.q_proj.weight has 4 rows, the padded "
                                            "config's heads make 6"):
        unpad_heads(tiny_state(tiny_cfg()), cfg, "here")
    with pytest.raises(MtpBenchError, match="here: checkpoint lacks model.layers.0.self_attn.q_proj.weight"):
        unpad_heads({}, cfg, "here")


def test_the_cli_takes_every_builtin_name():
    """A positional model and check-lossless's early refusal both know builtin-glm-tp by name."""
    from mtpbench.builtin import BUILTIN_MODELS
    from mtpbench.cli.common import model_or_profile
    from mtpbench.cli.lossless import refuse

    assert "builtin-glm-tp" in BUILTIN_MODELS
    for name in BUILTIN_MODELS:
        assert model_or_profile(name, None) == (name, None)
        assert refuse(name, None, (), None, None, None, False, False) == ()
