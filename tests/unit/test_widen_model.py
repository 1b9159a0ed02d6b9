"""models/widen.py: a widened Llama has the source's logits, the parameter count of its config, zero new
residual dims, and new weights that learn; targets that cannot keep the function are refused."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from rljob_runtime.models.smollm2 import smollm2_dir
from rljob_runtime.models.widen import llama_param_count, main, widen_checkpoint, widen_state_dict

SOURCE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96)
TARGET = dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=4, intermediate_size=160)
HEAD_DIM = 16


def _tiny(*, tied: bool = True, bias: bool = False, seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=128,
        num_hidden_layers=2,
        tie_word_embeddings=tied,
        attention_bias=bias,
        mlp_bias=bias,
        rms_norm_eps=1e-5,
        pad_token_id=0,
        **SOURCE,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # larger than the default init: logits that differ clearly between tokens
        for param in model.parameters():
            param.normal_(0.0, 0.3)
    return model.eval()


def _widen(model: LlamaForCausalLM, **overrides: Any) -> LlamaForCausalLM:
    config, state = widen_state_dict(model.config.to_dict(), model.state_dict(), **{**TARGET, **overrides})
    wide = LlamaForCausalLM(LlamaConfig(**config))
    wide.load_state_dict(state, strict=not model.config.tie_word_embeddings)  # tied: no lm_head.weight
    return wide.eval()


def _batch() -> dict[str, torch.Tensor]:
    """Two rows, the second left-padded by three tokens."""
    input_ids = torch.randint(1, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :3] = 0
    input_ids[1, :3] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def _max_diff(a: LlamaForCausalLM, b: LlamaForCausalLM) -> float:
    batch = _batch()
    with torch.no_grad():
        diff = (a(**batch).logits - b(**batch).logits).abs()
    return diff[batch["attention_mask"].bool()].max().item()


@pytest.mark.parametrize(("tied", "bias"), [(True, False), (False, True)], ids=["tied", "untied-biases"])
def test_the_widened_model_has_the_same_logits(tied: bool, bias: bool) -> None:
    model = _tiny(tied=tied, bias=bias)
    wide = _widen(model)
    assert _max_diff(model, wide) < 1e-5
    assert wide.config.rms_norm_eps == pytest.approx(1e-5 * 64 / 128)
    assert wide.config.head_dim == HEAD_DIM
    if tied:
        assert wide.lm_head.weight.data_ptr() == wide.model.embed_tokens.weight.data_ptr()


def test_the_parameter_count_is_the_formulas() -> None:
    for tied in (True, False):
        wide = _widen(_tiny(tied=tied))
        vocab, d, q, kv, inter = 128, 128, 8 * HEAD_DIM, 4 * HEAD_DIM, 160
        per_layer = d * q + 2 * d * kv + q * d + 3 * d * inter + 2 * d
        expected = vocab * d * (1 if tied else 2) + 2 * per_layer + d
        assert sum(p.numel() for p in wide.parameters()) == expected
        assert llama_param_count(wide.config.to_dict()) == expected
    # The SmolLM2 target of the command line's defaults.
    smollm2 = dict(
        model_type="llama", vocab_size=49152, num_hidden_layers=30, tie_word_embeddings=True, head_dim=64
    )
    assert llama_param_count({**smollm2, **dict(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536)}) == 134_515_008  # fmt: skip
    assert llama_param_count({**smollm2, **dict(hidden_size=2304, num_attention_heads=36, num_key_value_heads=12, intermediate_size=6912)}) == 1_971_332_352  # fmt: skip


def test_the_new_residual_dims_stay_exactly_zero() -> None:
    wide = _widen(_tiny())
    seen: list[str] = []

    def check(name: str):
        def hook(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            hidden = output[0] if isinstance(output, tuple) else output
            assert torch.count_nonzero(hidden[..., 64:]) == 0, name
            assert torch.count_nonzero(hidden[..., :64]) > 0, name
            seen.append(name)

        return hook

    writers = ("embed_tokens", "o_proj", "down_proj", "norm")
    for name, module in wide.named_modules():
        if name.endswith(writers) or re.fullmatch(r"model\.layers\.\d+", name):
            module.register_forward_hook(check(name))
    with torch.no_grad():
        wide(**_batch())
    assert len(seen) == 1 + 2 * 5 + 1  # embedding; 2 norms, o_proj, down_proj, output per layer; final norm


def test_new_weights_learn() -> None:
    """Behind a zero matrix (o_proj's new columns, down_proj's new columns) the new heads and neurons
    get gradients from the second step on, as with any zero-initialised branch; the zero matrices and
    the residual's new rows learn from the first."""
    wide = _widen(_tiny()).train()
    start = {name: p.detach().clone() for name, p in wide.named_parameters()}
    optimizer = torch.optim.SGD(wide.parameters(), lr=0.5)
    batch = _batch()
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    q_old, inter_old = 4 * HEAD_DIM, 96
    for step in (1, 2):
        optimizer.zero_grad()
        wide(**batch, labels=labels).loss.backward()
        if step == 1:
            attn, mlp = wide.model.layers[0].self_attn, wide.model.layers[0].mlp
            assert attn.o_proj.weight.grad[:, q_old:].abs().sum() > 0  # new heads' output columns
            assert attn.o_proj.weight.grad[64:, :].abs().sum() > 0  # new residual rows
            assert mlp.down_proj.weight.grad[:, inter_old:].abs().sum() > 0
            assert attn.q_proj.weight.grad[q_old:].abs().sum() == 0  # behind o_proj's zero columns
        optimizer.step()
    now = dict(wide.named_parameters())
    for layer in range(2):
        prefix = f"model.layers.{layer}."
        new_slices = {
            "self_attn.q_proj.weight": (slice(q_old, None),),
            "self_attn.k_proj.weight": (slice(2 * HEAD_DIM, None),),
            "self_attn.v_proj.weight": (slice(2 * HEAD_DIM, None),),
            "self_attn.o_proj.weight": (slice(None), slice(q_old, None)),
            "mlp.gate_proj.weight": (slice(inter_old, None),),
            "mlp.up_proj.weight": (slice(inter_old, None),),
            "mlp.down_proj.weight": (slice(None), slice(inter_old, None)),
        }
        for name, where in new_slices.items():
            moved = (now[prefix + name][where] - start[prefix + name][where]).abs()
            assert moved.max() > 0, prefix + name


def test_the_new_weights_follow_the_seed() -> None:
    model = _tiny()
    config = model.config.to_dict()
    first = widen_state_dict(config, model.state_dict(), **TARGET, seed=3)[1]
    again = widen_state_dict(config, model.state_dict(), **TARGET, seed=3)[1]
    other = widen_state_dict(config, model.state_dict(), **TARGET, seed=4)[1]
    name = "model.layers.1.self_attn.q_proj.weight"
    assert torch.equal(first[name], again[name])
    assert not torch.equal(first[name], other[name])
    assert torch.equal(first[name][:64, :64], other[name][:64, :64])  # the source's block
    assert first[name][64:].std().item() == pytest.approx(0.02, rel=0.1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(hidden_size=48, num_attention_heads=3), "hidden_size 48 is smaller than the source's 64"),
        (dict(intermediate_size=95), "intermediate_size 95 is smaller than the source's 96"),
        (dict(hidden_size=136), "hidden_size 136 is not a multiple of head_dim 16"),
        (
            dict(num_attention_heads=6, num_key_value_heads=3),
            "num_attention_heads 6 × head_dim 16 = 96 != hidden_size 128",
        ),
        (dict(num_key_value_heads=8), "changes the GQA group from the source's 2 to 1"),
        (dict(num_key_value_heads=3), "num_attention_heads 8 is not a multiple of num_key_value_heads 3"),
        (dict(num_key_value_heads=1), "num_key_value_heads 1 is smaller than the source's 2"),
        (dict(hidden_size=128.0), "hidden_size 128.0 is not an integer"),
    ],
)
def test_a_target_that_cannot_keep_the_function_is_refused(change: dict[str, Any], message: str) -> None:
    model = _tiny()
    with pytest.raises(ValueError, match=re.escape(message)):
        widen_state_dict(model.config.to_dict(), model.state_dict(), **{**TARGET, **change})


def test_other_models_and_unknown_weights_are_refused() -> None:
    model = _tiny()
    config, state = model.config.to_dict(), model.state_dict()
    with pytest.raises(ValueError, match=re.escape("model_type 'qwen2': only 'llama'")):
        widen_state_dict({**config, "model_type": "qwen2"}, state, **TARGET)
    with pytest.raises(
        ValueError, match=re.escape("model.layers.0.self_attn.q_norm.weight: not a LlamaForCausalLM weight")
    ):
        widen_state_dict(
            config, {**state, "model.layers.0.self_attn.q_norm.weight": torch.ones(16)}, **TARGET
        )
    without_head = {name: t for name, t in state.items() if name != "lm_head.weight"}
    with pytest.raises(ValueError, match=re.escape("the state dict lacks ['lm_head.weight']")):  # untied
        widen_state_dict({**config, "tie_word_embeddings": False}, without_head, **TARGET)
    with pytest.raises(
        ValueError, match=re.escape("lm_head.weight has shape (128, 64), the config says (128, 32)")
    ):
        widen_state_dict({**config, "hidden_size": 32, "head_dim": 16, "num_attention_heads": 2, "num_key_value_heads": 1}, state, **TARGET)  # fmt: skip


def test_the_checkpoint_is_written_in_shards_with_the_tokenizer_files(tmp_path: Path, capsys) -> None:
    model = _tiny(tied=False)
    src = tmp_path / "src"
    model.save_pretrained(src, safe_serialization=True)
    (src / "tokenizer.json").write_text("{}")
    (src / "chat_template.jinja").write_text("{{ messages }}")
    done = widen_checkpoint(src, tmp_path / "wide", **TARGET, max_shard_bytes=100_000)
    files = sorted(p.name for p in done.path.iterdir())
    assert "chat_template.jinja" in files and "tokenizer.json" in files and "generation_config.json" in files
    index = json.loads((done.path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards == [name for name in files if name.endswith(".safetensors")]
    assert done.source_params == sum(p.numel() for p in model.parameters())
    assert done.target_params == llama_param_count(json.loads((done.path / "config.json").read_text()))
    wide = AutoModelForCausalLM.from_pretrained(done.path, dtype=torch.float32).eval()
    assert _max_diff(model, wide) < 1e-5

    with pytest.raises(FileExistsError, match=re.escape(str(done.path))):
        widen_checkpoint(src, done.path, **TARGET)
    assert main([str(src), str(tmp_path / "bad"), "--hidden", "96"]) == 2  # 6 heads by default: refused
    assert "num_attention_heads 36 × head_dim 16" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["src", "wide"]


def test_smollm2_widened_keeps_its_logits(tmp_path: Path) -> None:
    """The packaged SmolLM2-135M (built once into the model cache) widened to a moderate size."""
    src = smollm2_dir()
    done = widen_checkpoint(
        src,
        tmp_path / "wide",
        hidden_size=768,
        num_attention_heads=12,
        num_key_value_heads=4,
        intermediate_size=2048,
    )
    tokenizer = AutoTokenizer.from_pretrained(done.path)  # copied with its chat template
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        small = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()(**ids).logits
        wide_model = AutoModelForCausalLM.from_pretrained(done.path, dtype=torch.float32).eval()
        wide = wide_model(**ids).logits
    assert wide_model.config.hidden_size == 768 and done.target_params > done.source_params
    assert (small - wide).abs().max().item() < 1e-4
