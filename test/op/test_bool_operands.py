"""torch.bool operands as cuDNN takes them (Note [Bit-packed booleans] in
torch_cudnn_handle/op/bool_operands.py): the packing's bit order and placement, on CPU
tensors (the same torch ops run on the GPU)."""

import pytest
import torch

from torch_cudnn_handle.op import bool_operands


def layouts():
    mask = torch.Generator().manual_seed(3)
    base = torch.rand(4, 16, 5, 7, generator=mask) > 0.5
    return {
        "contiguous": base,
        "channels_last": base.to(memory_format=torch.channels_last),
        "strided_view": base[:, ::2],
        "transposed": base.transpose(1, 3),
        "odd_count": base[:1, :1, :1, :3].contiguous(),
    }


def bits_at_offsets(view: torch.Tensor, extent: int):
    """The bits a packed view's buffer holds, one per element offset, LSB first (read back by hand)."""
    raw = torch.as_strided(view.view(torch.uint8), (-(-extent // 8),), (1,)).tolist()
    return [(raw[i // 8] >> (i % 8)) & 1 for i in range(extent)]


@pytest.mark.parametrize("name", list(layouts()))
def test_an_input_is_packed_one_bit_per_element_at_its_memory_offset(name):
    tensor = layouts()[name]
    (packed,), _ = bool_operands.pack_call([tensor], [])
    assert (packed.shape, packed.stride()) == (tensor.shape, tensor.stride())  # only the pointer reaches cuDNN
    extent = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()))
    expected = torch.zeros(extent, dtype=torch.uint8)
    expected.as_strided(tensor.shape, tensor.stride()).copy_(tensor)
    assert bits_at_offsets(packed, extent) == expected.tolist()


@pytest.mark.parametrize("name", list(layouts()))
def test_an_output_is_unpacked_from_the_bits_written(name):
    tensor = layouts()[name]
    output = torch.empty_strided(tensor.shape, tensor.stride(), dtype=torch.bool)
    _, (scratch,) = bool_operands.pack_call([], [output])
    assert scratch is not output
    # What cuDNN would write: the bits of `tensor` (packed as an input is).
    (written,), _ = bool_operands.pack_call([tensor], [])
    torch.as_strided(scratch.view(torch.uint8), (written.numel(),), (1,)).copy_(
        torch.as_strided(written.view(torch.uint8), (written.numel(),), (1,))
    )
    bool_operands.unpack_outputs([output], [scratch])
    assert torch.equal(output, tensor)


def test_other_operands_pass_as_they_are():
    x, host = torch.randn(2, 3, 4), torch.tensor(True)
    out = torch.empty(2, 3, 4)
    inputs, outputs = bool_operands.pack_call([x, host], [out])
    assert inputs[0] is x and inputs[1] is host and outputs[0] is out
