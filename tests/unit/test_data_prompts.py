"""Prompt data: parsing errors, chat templates, length filter, seeded epochs, resume, eval sets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rljob_api.spec_workload import DataSpec
from rljob_runtime.data.prompts import DataError, PromptSource, epoch_order, load_eval_datasets, parse_prompts


class FakeTokenizer:
    """One token per whitespace-separated word; the chat template tags each message."""

    def apply_chat_template(
        self, messages: list[dict], tokenize: bool, add_generation_prompt: bool, chat_template: Any = None
    ) -> str:
        assert tokenize is False and add_generation_prompt is True
        tag = "custom" if chat_template else "default"
        body = " ".join(f"<{m['role']}> {m['content']}" for m in messages)
        return f"[{tag}] {body} <assistant>"

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [len(w) for w in text.split()]}


def _spec(**kw: Any) -> DataSpec:
    return DataSpec(path="/data/train.jsonl", **kw)


def _lines(*rows: dict) -> list[str]:
    return [json.dumps(r) for r in rows]


ROWS = [{"prompt": f"question {i}", "label": str(i)} for i in range(10)]


def test_plain_prompts_keep_labels_metadata_and_indices() -> None:
    lines = _lines({"q": "hi", "ans": "1", "meta": {"k": 1}}, {"q": "yo", "ans": "2"})
    spec = _spec(inputKey="q", labelKey="ans", metadataKey="meta", applyChatTemplate=False)
    loaded = parse_prompts(lines, spec)
    assert [(p.index, p.text, p.label, p.metadata) for p in loaded.prompts] == [
        (0, "hi", "1", {"k": 1}),
        (1, "yo", "2", {}),
    ]
    group = loaded.prompts[1].to_samples(3, first_index=10)
    assert [(s.group_index, s.index, s.label) for s in group] == [(1, 10, "2"), (1, 11, "2"), (1, 12, "2")]


def test_chat_template_string_and_messages_and_override() -> None:
    lines = _lines(
        {"prompt": "hi"}, {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
    )
    loaded = parse_prompts(lines, _spec(), tokenizer=FakeTokenizer())
    assert [p.text for p in loaded.prompts] == [
        "[default] <user> hi <assistant>",
        "[default] <system> s <user> u <assistant>",
    ]
    assert loaded.prompts[0].prompt_ids == [9, 6, 2, 11]
    override = parse_prompts(lines[:1], _spec(), tokenizer=FakeTokenizer(), chat_template="{{x}}")
    assert override.prompts[0].text.startswith("[custom]")


def test_real_tokenizer_chat_template() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "user:": 1, "hi": 2, "assistant:": 3}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}assistant:"
    loaded = parse_prompts(_lines({"prompt": "hi"}), _spec(), tokenizer=hf, chat_template=template)
    assert loaded.prompts[0].text == "user: hi assistant:"
    assert loaded.prompts[0].prompt_ids == [0, 0, 2, 0, 0]  # "user", ":", "hi", "assistant", ":"


def test_max_prompt_length_drops_and_counts() -> None:
    lines = _lines({"prompt": "a b"}, {"prompt": "a b c d"}, {"prompt": "a"})
    loaded = parse_prompts(
        lines, _spec(applyChatTemplate=False, maxPromptLength=2), tokenizer=FakeTokenizer()
    )
    assert [p.index for p in loaded.prompts] == [0, 2]  # indices stay those of the file rows
    assert loaded.dropped_too_long == 1


@pytest.mark.parametrize(
    ("lines", "kw", "match"),
    [
        ([], {}, "no prompts"),
        (["", "  "], {}, "no prompts"),
        (['{"prompt": "a"}', "{not json"], {}, "line 2: not valid JSON"),
        (['{"prompt": "a"}', "[1, 2]"], {}, "line 2: expected a JSON object"),
        (['{"text": "a"}'], {}, "line 1: input key 'prompt' missing"),
        (['{"prompt": "a"}'], {"require_label": True}, "line 1: label key 'label' missing"),
        (['{"prompt": 5}'], {}, "must be a string or a list"),
        (['{"prompt": "a b c"}'], {"spec": {"maxPromptLength": 1}}, "all 1 prompts are longer"),
    ],
)
def test_errors_name_the_problem(lines: list[str], kw: dict, match: str) -> None:
    spec = _spec(applyChatTemplate=False, **kw.pop("spec", {}))
    with pytest.raises(DataError, match=match):
        parse_prompts(lines, spec, source="train.jsonl", tokenizer=FakeTokenizer(), **kw)


def test_messages_without_chat_template_and_template_without_tokenizer() -> None:
    with pytest.raises(DataError, match="applyChatTemplate is false"):
        parse_prompts(_lines({"prompt": [{"role": "user", "content": "x"}]}), _spec(applyChatTemplate=False))
    with pytest.raises(DataError, match="no tokenizer"):
        parse_prompts(_lines({"prompt": "x"}), _spec())


def test_missing_file(tmp_path: Path) -> None:
    spec = DataSpec(path=str(tmp_path / "nope.jsonl"), applyChatTemplate=False)
    with pytest.raises(DataError, match=r"nope\.jsonl: no such file"):
        PromptSource.from_spec(spec, seed=1)


def _source(seed: int = 7, shuffle: bool = True) -> PromptSource:
    loaded = parse_prompts(_lines(*ROWS), _spec(applyChatTemplate=False))
    return PromptSource(loaded.prompts, seed=seed, shuffle=shuffle)


def _ids(batch: list) -> list[int]:
    return [p.index for p in batch]


def test_shuffle_is_seeded_per_epoch_and_cycles() -> None:
    a, b = _source(), _source()
    epoch0 = _ids(a.next_batch(10))
    assert epoch0 == _ids(b.next_batch(10)) and sorted(epoch0) == list(range(10))
    assert epoch0 != list(range(10))
    epoch1 = _ids(a.next_batch(10))
    assert sorted(epoch1) == list(range(10)) and epoch1 != epoch0 and a.epoch == 1
    assert _ids(_source(seed=8).next_batch(10)) != epoch0
    assert _ids(_source(shuffle=False).next_batch(12)) == [*range(10), 0, 1]
    assert epoch_order(5, 1, 3, True) == epoch_order(5, 1, 3, True)


def test_batch_crosses_epoch_boundary() -> None:
    src = _source()
    first = _ids(src.next_batch(7))
    crossing = _ids(src.next_batch(7))
    assert sorted(first + crossing[:3]) == list(range(10))
    assert crossing[3:] == epoch_order(10, 7, 1, True)[:4]


def test_resume_gives_the_same_next_batch() -> None:
    src = _source()
    src.next_batch(4)
    src.next_batch(9)
    state = json.loads(json.dumps(src.state_dict()))  # checkpoints are JSON
    expected = _ids(src.next_batch(6))
    resumed = _source()
    resumed.load_state_dict(state)
    assert _ids(resumed.next_batch(6)) == expected


def test_resume_refuses_other_data() -> None:
    state = _source().state_dict()
    with pytest.raises(DataError, match="seed is 7 in the checkpoint but 8 now"):
        _source(seed=8).load_state_dict(state)
    state["num_prompts"] = 11
    with pytest.raises(DataError, match="num_prompts"):
        _source().load_state_dict(state)


def test_eval_datasets(tmp_path: Path) -> None:
    (tmp_path / "aime.jsonl").write_text("\n".join(_lines(*ROWS[:2])))
    (tmp_path / "gsm.jsonl").write_text("\n".join(_lines(*ROWS[:3])))
    spec = _spec(
        applyChatTemplate=False,
        eval={
            "interval": 5,
            "nSamplesPerPrompt": 2,
            "datasets": [
                {"name": "aime", "path": str(tmp_path / "aime.jsonl"), "nSamplesPerPrompt": 4},
                {"name": "gsm", "path": str(tmp_path / "gsm.jsonl")},
            ],
        },
    )
    aime, gsm = load_eval_datasets(spec, require_label=True)
    assert (aime.name, aime.n_samples_per_prompt, len(aime.samples())) == ("aime", 4, 8)
    assert (gsm.name, gsm.n_samples_per_prompt, len(gsm.samples())) == ("gsm", 2, 6)
    assert [(s.group_index, s.index) for s in gsm.samples()[:3]] == [(0, 0), (0, 1), (1, 2)]
    (tmp_path / "gsm.jsonl").write_text('{"prompt": "x"}')
    with pytest.raises(DataError, match=r"eval dataset 'gsm'.*label key 'label' missing"):
        load_eval_datasets(spec, require_label=True)


def test_from_spec_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(_lines(*ROWS)) + "\n")
    src, loaded = PromptSource.from_spec(
        DataSpec(path=str(path), applyChatTemplate=False, shuffle=False), seed=3
    )
    assert len(src) == 10 and loaded.dropped_too_long == 0
    assert [p.label for p in src.next_batch(2)] == ["0", "1"]
