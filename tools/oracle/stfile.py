"""Minimal safetensors reader/writer and the number formats of the DeepSeek V4 checkpoint.

Written from the safetensors format description (8-byte little-endian header length, a JSON
header {name: {dtype, shape, data_offsets}} plus optional "__metadata__", then the raw data
buffer). We write it ourselves because the F8_E8M0 dtype must round-trip byte-exactly and we
want full control of the layout.

Number formats (architecture.md §2.2):
  F8_E4M3  e4m3fn, bias 7, max 448, 0x7f/0xff NaN           -> torch.float8_e4m3fn
  F8_E8M0  unsigned exponent byte, 2^(b-127), 255 NaN        -> torch.float8_e8m0fnu
  FP4 e2m1 (stored as I8, two per byte, LOW nibble = element 2j, high nibble = element 2j+1)
"""
import json
import os
import struct

import numpy as np
import torch

# safetensors dtype name -> (torch dtype, bytes per element)
DTYPES = {
    "BF16": (torch.bfloat16, 2),
    "F16": (torch.float16, 2),
    "F32": (torch.float32, 4),
    "F64": (torch.float64, 8),
    "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1),
    "I32": (torch.int32, 4),
    "I64": (torch.int64, 8),
    "F8_E4M3": (torch.float8_e4m3fn, 1),
    "F8_E8M0": (torch.float8_e8m0fnu, 1),
}
TORCH_TO_ST = {v[0]: k for k, v in DTYPES.items()}


def tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.contiguous()
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def write_safetensors(path: str, tensors: dict, metadata: dict | None = None) -> int:
    """Writes tensors (insertion order) to `path`; returns the size of the data buffer."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    blobs = []
    off = 0
    for name, t in tensors.items():
        b = tensor_bytes(t)
        header[name] = {"dtype": TORCH_TO_ST[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)  # pad the header to a multiple of 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return off


def read_safetensors(path: str) -> dict:
    """Returns {name: torch tensor in its stored dtype}."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt, _ = DTYPES[info["dtype"]]
        a, b = info["data_offsets"]
        raw = np.frombuffer(data, dtype=np.uint8, count=b - a, offset=base + a).copy()
        out[name] = torch.from_numpy(raw).view(dt).reshape(info["shape"])
    return out


def read_checkpoint(d: str) -> dict:
    """Reads a single-file or sharded (index.json) checkpoint directory."""
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            wm = json.load(f)["weight_map"]
        out = {}
        for shard in sorted(set(wm.values())):
            out.update(read_safetensors(os.path.join(d, shard)))
        missing = set(wm) - set(out)
        assert not missing, f"index names tensors that are absent: {sorted(missing)[:5]}"
        return out
    return read_safetensors(os.path.join(d, "model.safetensors"))


# ---------------------------------------------------------------------------------------------
# Number formats
# ---------------------------------------------------------------------------------------------
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e8m0_to_f32(s: torch.Tensor) -> torch.Tensor:
    """2^(b-127); b = 0 gives 2^-127 (a float32 subnormal); b = 255 NaN."""
    return s.view(torch.float8_e8m0fnu).float()


def e4m3_to_f32(w: torch.Tensor) -> torch.Tensor:
    return w.view(torch.float8_e4m3fn).float()


def round_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even onto the e4m3fn grid; x must already be clamped to [-448, 448].
    (torch's float32 -> float8_e4m3fn cast is RNE; checked exhaustively against midpoints.)"""
    return x.to(torch.float8_e4m3fn).float()


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even onto e2m1 (values 0,.5,1,1.5,2,3,4,6; x clamped to [-6,6]);
    returns 4-bit codes (bit 3 = sign). Ties go to the even code: 0.25->0, 0.75->1, 1.25->1,
    1.75->2, 2.5->2, 3.5->4, 5->4."""
    a = x.abs()
    mag = torch.zeros_like(a, dtype=torch.int64)
    # thresholds: (value, inclusive?) - above threshold -> next code; ties resolved to even code
    mag = torch.where(a > 0.25, 1, mag)
    mag = torch.where(a >= 0.75, 2, mag)
    mag = torch.where(a > 1.25, 3, mag)
    mag = torch.where(a >= 1.75, 4, mag)
    mag = torch.where(a > 2.5, 5, mag)
    mag = torch.where(a >= 3.5, 6, mag)
    mag = torch.where(a > 5.0, 7, mag)
    sign = (x < 0).to(torch.int64) * 8
    return mag + sign


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    v = E2M1_VALUES[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -v, v)


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """x clamped to [-6, 6] -> nearest e2m1 value (RNE). -0 is returned as -0.0 (harmless)."""
    return e2m1_decode(e2m1_codes(x))


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """[out, in] codes -> I8 [out, in/2]; low nibble = element 2j, high nibble = element 2j+1."""
    c = codes.to(torch.uint8)
    packed = c[:, 0::2] | (c[:, 1::2] << 4)
    return packed.view(torch.int8)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """I8 [out, in/2] -> codes [out, in]."""
    b = packed.view(torch.uint8)
    lo = b & 0x0F
    hi = b >> 4
    return torch.stack([lo, hi], dim=-1).reshape(b.shape[0], -1)


def dequant_fp8(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """W[out,in] e4m3 * 2^(scale[out/128, in/128]-127) (architecture.md §2.3)."""
    wf = e4m3_to_f32(w)
    sf = e8m0_to_f32(s)
    sf = sf.repeat_interleave(128, 0)[: wf.shape[0]].repeat_interleave(128, 1)[:, : wf.shape[1]]
    return wf * sf


def dequant_fp4(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """I8 [out, in/2] packed e2m1 * 2^(scale[out, in/32]-127)."""
    wf = e2m1_decode(unpack_fp4(w))
    sf = e8m0_to_f32(s).repeat_interleave(32, 1)
    return wf * sf
