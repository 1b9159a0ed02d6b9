import torch

from rljob_runtime.sync.checksum import checksums, tensor_checksum


def test_equal_tensors_have_equal_checksums_across_dtypes() -> None:
    named = {
        "a": torch.randn(5, 7, dtype=torch.bfloat16),
        "b": torch.randn(3, dtype=torch.float32),
        "c": torch.arange(4, dtype=torch.int64),
        "d": torch.tensor([True, False]),
    }
    copy = {k: v.clone() for k, v in named.items()}
    assert checksums(named.items()) == checksums(copy.items())


def test_one_flipped_bit_or_a_swap_changes_the_checksum() -> None:
    t = torch.randn(64, dtype=torch.bfloat16)
    flipped = t.clone()
    flipped.view(torch.int16)[10] ^= 1
    swapped = t.clone()
    swapped[[3, 4]] = t[[4, 3]]
    assert t[3] != t[4]
    base = tensor_checksum(t)
    assert tensor_checksum(flipped) != base
    plain, weighted = tensor_checksum(swapped)
    assert plain == base[0] and weighted != base[1]  # order matters, not only the multiset


def test_a_strided_view_is_summed_as_its_values() -> None:
    t = torch.randn(4, 6)
    assert tensor_checksum(t.t()) == tensor_checksum(t.t().contiguous())
