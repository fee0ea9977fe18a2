"""The tinker SDK's binary wire format, both ways: a ``forward_backward`` body (protobuf,
optionally zstd) into the contract's ``DatumIn`` list, and a ``ForwardResult`` or
``SampleResult`` into the protobuf bytes the SDK decodes (it accepts those two results only as
protobuf). Also ``tinker://`` paths, parsed strictly: a path is only ever an id and a name,
never a file to open.

The message classes are the SDK's own generated module (``tinker.proto.tinker_public_pb2``),
imported when first needed: the SDK ships in the same ``[serve]`` extra as the server.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import torch

from omnigym.serve.contract import DatumIn, ForwardResult, RequestError, SampleResult

NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MODEL_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}:train:[0-9]{1,9}")
SEGMENTS = (("weights", "state"), ("sampler_weights", "sampler"))
"""(path segment, the contract's checkpoint kind)"""

_FLOAT, _INT64, _INT32 = 1, 2, 3  # the proto's DType values this server reads


def _numpy_dtype(code: int):
    return {_FLOAT: np.float32, _INT64: np.int64, _INT32: np.int32}.get(code)


def pb():
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2


def check_name(name: str, what: str = "checkpoint name") -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or ".." in name or name in (".",):
        raise RequestError(f"bad {what} {str(name)[:80]!r}: use 1-64 characters from A-Z a-z 0-9 _ . - "
                           "(no '..')")
    return name


def check_model_id(model_id: str) -> str:
    if not isinstance(model_id, str) or not MODEL_ID_RE.fullmatch(model_id):
        raise RequestError(f"unknown model id {str(model_id)[:80]!r}", status=404)
    return model_id


def hub_id(model_id: str) -> str:
    """The run's name on the hub's side of the contract: the SDK's id (``SESSION:train:N``, which
    the SDK derives itself, so the wire keeps it) with ``.`` for ``:``, so the hub can use it as
    a file name; one to one, as a session id has no ``.``."""
    return model_id.replace(":", ".")


@dataclass(frozen=True)
class TinkerPath:
    model_id: str
    kind: str
    """the contract's kind: "state" (``/weights/``) or "sampler" (``/sampler_weights/``)"""
    name: str

    def __str__(self) -> str:
        segment = next(seg for seg, kind in SEGMENTS if kind == self.kind)
        return f"tinker://{self.model_id}/{segment}/{self.name}"


def parse_path(path: str) -> TinkerPath:
    """``tinker://MODEL_ID/weights/NAME`` or ``.../sampler_weights/NAME``, nothing else."""
    if not isinstance(path, str) or not path.startswith("tinker://") or len(path) > 200:
        raise RequestError(f"bad path {str(path)[:80]!r}: expected tinker://MODEL_ID/weights/NAME "
                           "or tinker://MODEL_ID/sampler_weights/NAME")
    parts = path[len("tinker://"):].split("/")
    kinds = dict(SEGMENTS)
    if len(parts) != 3 or parts[1] not in kinds:
        raise RequestError(f"bad path {path[:80]!r}: expected tinker://MODEL_ID/weights/NAME "
                           "or tinker://MODEL_ID/sampler_weights/NAME")
    return TinkerPath(check_model_id(parts[0]), kinds[parts[1]], check_name(parts[2]))


def _tensor(msg, name: str, max_elements: int) -> torch.Tensor:
    dtype = _numpy_dtype(msg.dtype)
    if dtype is None:
        raise RequestError(f"loss_fn_inputs[{name!r}]: unsupported dtype {msg.dtype}")
    shape = [int(s) for s in msg.shape]
    if any(s < 0 for s in shape) or math.prod(shape) > max_elements:
        # a sparse tensor is made dense here: its shape, not its bytes, says what that costs
        raise RequestError(f"loss_fn_inputs[{name!r}]: shape {shape[:4]} is negative or over "
                           f"{max_elements} elements", status=413)
    try:
        if msg.HasField("sparse_csr"):
            # CSR with implicit zeros (the SDK sparsifies 2-D target_tokens and weights)
            if len(shape) != 2:
                raise ValueError("a sparse tensor needs a 2-D shape")
            values = np.frombuffer(msg.sparse_csr.values, dtype=dtype)
            crow = np.frombuffer(msg.sparse_csr.crow_indices, dtype=np.int64)
            col = np.frombuffer(msg.sparse_csr.col_indices, dtype=np.int64)
            if len(crow) != shape[0] + 1 or len(col) != len(values) or (len(col) and (col.min() < 0 or col.max() >= shape[1])) \
                    or (len(crow) and (crow[0] != 0 or crow[-1] != len(values) or np.any(np.diff(crow) < 0))):
                raise ValueError("inconsistent CSR indices")
            dense = np.zeros(shape, dtype=dtype)
            rows = np.repeat(np.arange(shape[0]), np.diff(crow))
            dense[rows, col] = values
            array = dense
        else:
            array = np.frombuffer(msg.dense, dtype=dtype)
            array = array.reshape(shape) if shape else array
    except ValueError as exc:
        raise RequestError(f"loss_fn_inputs[{name!r}]: {exc}") from None
    array = array.astype(np.int64) if dtype in (np.int32, np.int64) else array.astype(np.float32)
    return torch.from_numpy(array.copy())


def decode_forward_backward(body: bytes, zstd_encoded: bool, max_bytes: int):
    """The SDK's protobuf body -> (model_id, seq_id, loss_fn, loss_fn_config, data, forward_only)."""
    if zstd_encoded:
        import zstandard

        try:
            # read at most one byte past the limit: a small body that expands into a huge one
            # stops there (the one-shot decompress trusts the size the frame claims)
            with zstandard.ZstdDecompressor().stream_reader(body) as reader:
                body = reader.read(max_bytes + 1)
        except zstandard.ZstdError as exc:
            raise RequestError(f"forward_backward body: bad zstd data ({exc})") from None
        if len(body) > max_bytes:
            raise RequestError(f"forward_backward body: over {max_bytes} bytes once decompressed", status=413)
    msg = pb().ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:  # protobuf's DecodeError: a body that is not the SDK's message
        raise RequestError(f"forward_backward body is not a tinker ForwardBackwardRequest ({exc})") from None
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():  # v2 wins: it carries strings too
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data = []
    for i, datum in enumerate(msg.data):
        tokens: list[int] = []
        for chunk in datum.model_input:
            if chunk.WhichOneof("chunk") != "encoded_text":
                raise RequestError(f"datum {i}: only text chunks are supported (got {chunk.WhichOneof('chunk')})")
            raw = chunk.encoded_text.tokens
            if len(raw) % 4:
                raise RequestError(f"datum {i}: text chunk of {len(raw)} bytes is not int32 tokens")
            tokens.extend(np.frombuffer(raw, dtype=np.int32).tolist())
        inputs = {name: _tensor(t, name, max(1, max_bytes // 4)) for name, t in datum.loss_fn_inputs.items()}
        data.append(DatumIn(tokens=tokens, inputs=inputs))
    return msg.model_id, int(msg.seq_id), msg.loss_fn, config or None, data, bool(msg.forward_only)


def _batched(arrays: list[np.ndarray], dtype_code: int, np_dtype) -> object:
    bt = pb().BatchedTensor()
    bt.dtype = dtype_code
    flat = [np.ascontiguousarray(a, dtype=np_dtype).reshape(-1) for a in arrays]
    offsets = np.cumsum([0] + [a.nbytes for a in flat]).astype(np.int64)
    bt.data = b"".join(a.tobytes() for a in flat)
    bt.offsets = offsets.tobytes()
    trailing = list(arrays[0].shape[1:]) if arrays and arrays[0].ndim > 1 else []
    bt.trailing_shape.extend(trailing)
    return bt


def encode_forward_result(result: ForwardResult) -> bytes:
    msg = pb().ForwardBackwardOutput()
    msg.loss_fn_output_type = "ArrayRecord"
    for key, value in result.metrics.items():
        msg.metrics[key] = float(value)
    if result.outputs:
        record = msg.loss_fn_outputs.add()
        record.num_datums = len(result.outputs)
        for name in result.outputs[0]:
            arrays = [out[name].detach().cpu().float().numpy() for out in result.outputs]
            record.fields[name].CopyFrom(_batched(arrays, _FLOAT, np.float32))
    return msg.SerializeToString()


def encode_sample_result(result: SampleResult) -> bytes:
    msg = pb().SampleResponse()
    for seq in result.sequences:
        out = msg.sequences.add()
        out.stop_reason = 1 if seq.stop_reason == "length" else 0
        out.tokens = np.asarray(seq.tokens, dtype=np.int32).tobytes()
        out.logprobs = np.asarray(seq.logprobs, dtype=np.float32).tobytes()
    if result.prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray([np.nan if v is None else v for v in result.prompt_logprobs],
                                         dtype=np.float32).tobytes()
    return msg.SerializeToString()
