"""A reference interpreter of cuDNN frontend graph descriptions, in plain torch ops.

``interpret(graph, tensors)`` runs a validated ``cudnn.pygraph`` description (the one a
builder fills; shape inference has run, no build) on the tensors given for its inputs,
on whatever device they are, and returns every non-virtual output, by uid, as a new
tensor with the dims, strides and dtype the description declares.
``interpret_ordered`` does the same in the op's order of inputs and outputs. Importing
this package registers nothing.

Semantics, and the choices made where cuDNN leaves room:

* Values are computed in ``compute_dtype`` (float32, or float64 for a verify mode); a
  node whose compute type is an integer type computes exactly: a pointwise node whose
  mode is exact on integers (add, mul, max, relu, a comparison, ...) in int64, any other
  node (an int8 convolution's INT32) in float64, exact below 2**53. Integer inputs are
  held as int64, so their values reach such a node unrounded. A node's floating compute
  type narrower than float32 is not emulated: the reference computes at least in float32.
* A non-virtual tensor holds its declared dtype: the value is rounded to it when stored,
  and a node that reads it (a tensor can be an output and another node's input) reads
  the rounded value, as it would read it from memory.
* A virtual tensor is not rounded to its (intermediate) data type: cuDNN's fused
  kernels keep intermediates in registers at compute precision, and the frontend's
  description says nothing to the contrary. ``round_virtual=True`` rounds them too (a
  bound on what a kernel that does round them could give).
* Conversions to a declared dtype: floats round to nearest even (fp16 overflows to inf),
  fp8 saturates to its largest finite value, integers round to nearest even and saturate
  (NaN -> 0), BOOLEAN is ``!= 0``; booleans are 0/1 inside.
* Broadcasting is cuDNN's: a dim of size 1 broadcasts (torch's rule).
* Inputs are read as cuDNN reads a buffer: from the tensor's address with the declared
  strides (so a natural operand's view is honoured); ragged tensors through their
  offsets (values.py).

Supported node types: POINTWISE (every mode of the pygraph), MATMUL, REDUCTION,
GENSTATS, CONV_FPROP / CONV_DGRAD / CONV_WGRAD, LAYERNORM, RMSNORM, INSTANCENORM,
BATCHNORM, BATCHNORM_INFERENCE and their backwards, ROPE / ROPE_BWD, SDPA / SDPA_BWD,
TRANSPOSE, SLICE, CONCATENATE, RESHAPE. Anything else, and any mode or attribute a
handler does not know, raises ``NotImplementedError`` (``Refused``) naming the node, its
type and the attribute, never a wrong value.

Modules: run.py (the walk), description.py (reading a description), values.py (tensors
in and out), and one module per node family.
"""

from .description import Refused
from .run import interpret, interpret_ordered

__all__ = ["interpret", "interpret_ordered", "Refused"]
