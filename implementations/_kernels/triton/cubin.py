"""What a compiled kernel's cubin holds, read with the tools Triton's NVIDIA backend bundles:
its registers and stack (``cuobjdump -res-usage``) and its SASS (``nvdisasm``).

The SASS of many cubins comes from one ``nvdisasm`` call per target (:func:`sass_of_many`):
each cubin's code section (ELF ``.text.<kernel>``) is cut out and the sections of one target
are disassembled together as a raw instruction binary (``nvdisasm -b SM90a``). An
``nvdisasm`` start costs ~0.35 CPU-s whatever the kernel's size (its instruction tables), the
disassembly itself ~0.04 s a kernel: the AOT check's 117 kernels took 50-60 CPU-s one call
each, 5 s batched. The listing is the one the cubin's own disassembly gives (checked on all
117: every instruction and address equal), branch targets made the kernel's own addresses.

Used by :mod:`.aot_check`; needs no GPU and no CUDA driver.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import triton

RAW_ARCH = {90: "SM90a", 80: "SM80"}  # nvdisasm -b: SM90a decodes sm_90 and sm_90a cubins
_ALIGN = 128  # a code section's alignment in a cubin; each kernel starts on one in the batch
# instructions whose last operand is a code address (nvdisasm labels them in a cubin, prints
# the address in a raw binary: from the batch's start, made the kernel's own below)
_TARGET = re.compile(r"^((?:@!?U?P[T0-9]+\s+)?(?:BRA|BSSY|CALL|RET|JMP|BREAK)\b.*?)0x([0-9a-f]+)$")


def tool(name: str) -> str:
    """The path of ``name`` (Triton's bundled copy, else one on PATH)."""
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    found = str(bundled) if bundled.exists() else shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found (Triton's NVIDIA backend bundles it)")
    return found


def resources(cubin: bytes) -> tuple[int, int]:
    """(registers, stack bytes: registers spilled to local memory) of a one-kernel cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        res = subprocess.run([tool("cuobjdump"), "-res-usage", fh.name], capture_output=True,
                             text=True, check=True).stdout
    usage = re.search(r"REG:(\d+) STACK:(\d+)", res)
    if usage is None:
        raise ValueError(f"no resource usage in cuobjdump's output: {res[:200]}")
    return int(usage.group(1)), int(usage.group(2))


def code_section(cubin: bytes) -> bytes:
    """The instructions of a one-kernel cubin: its ``.text.<kernel>`` section (ELF64)."""
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    entsize, count, names = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * entsize) for i in range(count)]
    strings = headers[names][4]  # sh_offset of the section names
    code = []
    for name, _, _, _, offset, size, *_ in headers:
        start = strings + name
        if cubin[start:cubin.index(b"\0", start)].startswith(b".text."):
            code.append(cubin[offset:offset + size])
    if len(code) != 1:
        raise ValueError(f"a cubin of {len(code)} code sections (one kernel expected)")
    return code[0]


def sass_of_many(codes: list[bytes], capability: int) -> list[list[tuple[int, str]]]:
    """Each code section's SASS as (address, instruction), one ``nvdisasm`` for them all
    (``capability``: 90 or 80, the target they were compiled for)."""
    blob, starts = bytearray(), []
    for code in codes:
        starts.append(len(blob))
        blob += code + bytes(-len(code) % _ALIGN)
    with tempfile.NamedTemporaryFile(suffix=".bin") as fh:
        fh.write(blob)
        fh.flush()
        text = subprocess.run([tool("nvdisasm"), "-ndf", "-novliw", "-b", RAW_ARCH[capability],
                               fh.name], capture_output=True, text=True, check=True).stdout
    rows = sass_of(text)
    out: list[list[tuple[int, str]]] = [[] for _ in codes]
    which = 0
    for address, instruction in rows:
        while which + 1 < len(starts) and address >= starts[which + 1]:
            which += 1
        start = starts[which]
        if address >= start + len(codes[which]):
            continue  # the zeros that align the next kernel
        target = _TARGET.match(instruction)
        if target:
            instruction = target.group(1) + hex(int(target.group(2), 16) - start)
        out[which].append((address - start, instruction))
    return out


def sass_of(text: str) -> list[tuple[int, str]]:
    """nvdisasm's listing as (address, instruction), each branch or call target (a label:
    `` `(.L_x_3) ``) written as its address (``0x7e0``), as ``cuobjdump -sass`` writes it."""
    labels, pending, rows = {}, [], []
    for line in text.splitlines():
        label = re.match(r"\s*([^\s/`]\S*):\s*$", line)
        if label:
            pending.append(label.group(1))
            continue
        found = re.search(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?);", line)
        if found:
            address = int(found.group(1), 16)
            labels.update(dict.fromkeys(pending, address))
            pending = []
            rows.append((address, found.group(2).strip()))

    def address_of(name: re.Match) -> str:
        if name.group(1) not in labels:
            raise ValueError(f"nvdisasm names a target it does not place: {name.group(1)}")
        return hex(labels[name.group(1)])

    return [(a, re.sub(r"`\(([^)]+)\)", address_of, t)) for a, t in rows]
